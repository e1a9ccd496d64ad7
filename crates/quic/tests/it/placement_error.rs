//! A file that cannot take its final name fails the get, whichever task
//! places it: the control loop (its hash came last) or a data-stream reader
//! (its hash came first, as the control stream's priority makes likely). The
//! reader's error once reached the control loop after the "all settled" wake,
//! and the get reported success with the file missing.

use longhaul_quic::Progress;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_that_cannot_be_placed_fails_the_get() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    // Three chunks: placed by a rename once every chunk and the hash are in.
    let bytes: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("big.bin"), &bytes).unwrap();
    let srv = crate::common::serve(&root, &t.path().join("state"), true);
    let (addr, opts) = (srv.addr, srv.client(t.path().join("known_hosts")));
    for round in 0..8 {
        let dest = t.path().join(format!("d{round}"));
        // A non-empty directory stands where the file must go.
        std::fs::create_dir_all(dest.join("big.bin/inside")).unwrap();
        let r = longhaul_quic::get(
            "127.0.0.1",
            addr.port(),
            &["big.bin".to_string()],
            &dest,
            &opts,
            Arc::new(Progress::default()),
        )
        .await;
        match r {
            Err(p) => assert!(p.to_string().contains("big.bin"), "round {round}: {p}"),
            Ok(r) => assert!(
                !r.ok && r.totals.verified == 0,
                "round {round}: the get reported ok={} with {} verified, the file unplaced",
                r.ok,
                r.totals.verified
            ),
        }
        assert!(dest.join("big.bin/inside").is_dir(), "round {round}");
    }
}
