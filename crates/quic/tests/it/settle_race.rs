//! Every file a get receives must be in its report, and placed under its final name,
//! before the get returns. Many concurrent gets of one small file against an
//! in-process server on an oversubscribed runtime, to shake out ordering races
//! between the control stream (FileDone, ManifestEnd) and the data streams.

use longhaul_quic::Progress;
use std::sync::Arc;

const ROUNDS: usize = 40;
const PARALLEL: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_received_file_is_reported_and_placed_before_get_returns() {
    let t = tempfile::Builder::new()
        .prefix("longhaul-settle-race-")
        .tempdir()
        .unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("one.txt"), b"one small file\n").unwrap();
    for i in 0..20 {
        std::fs::create_dir_all(root.join("set")).unwrap();
        std::fs::write(root.join(format!("set/f{i:02}")), vec![i as u8; 1000 + i]).unwrap();
    }
    let srv = crate::common::serve(&root, &t.path().join("state"), true);
    let (addr, opts) = (srv.addr, srv.client(t.path().join("known_hosts")));
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let mut gets = Vec::new();
        for k in 0..PARALLEL {
            let dest = t.path().join(format!("d{round}-{k}"));
            std::fs::create_dir(&dest).unwrap();
            let opts = opts.clone();
            let (what, n) = if k % 2 == 0 {
                ("one.txt", 1)
            } else {
                ("set", 20)
            };
            gets.push(tokio::spawn(async move {
                let r = longhaul_quic::get(
                    "127.0.0.1",
                    addr.port(),
                    &[what.to_string()],
                    &dest,
                    &opts,
                    Arc::new(Progress::default()),
                )
                .await;
                // Look at the destination the moment get returns.
                let mut present = 0;
                let mut partial = 0;
                let dir = if n == 1 {
                    dest.clone()
                } else {
                    dest.join("set")
                };
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    if e.file_name().to_string_lossy().contains(".lh-") {
                        partial += 1;
                    } else {
                        present += 1;
                    }
                }
                (what, n, r, present, partial)
            }));
        }
        for g in gets {
            let (what, n, r, present, partial) = g.await.unwrap();
            match r {
                Ok(r) if r.ok && r.totals.verified == n && present == n && partial == 0 => {}
                Ok(r) => failures.push(format!(
                    "round {round} get {what}: ok={} reported {} of {n} verified, {present} placed, {partial} partial(s) left",
                    r.ok, r.totals.verified
                )),
                Err(p) => failures.push(format!("round {round} get {what}: {p}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} gets returned before all their files were settled:\n{}",
        failures.len(),
        ROUNDS * PARALLEL,
        failures.join("\n")
    );
}
