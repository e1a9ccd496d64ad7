//! The server dies (kill -9) in the middle of a get; after a restart with the same
//! identity and port, rerunning the same command fetches only the missing chunks.
//! Takes ~25 s: the client notices the dead server by the 15 s idle timeout (which
//! its 5 s keep-alive restarts once, so ~20 s after the kill).

use longhaul_testkit::*;
use std::ffi::OsString;
use std::time::{Duration, Instant};

const SIZE: u64 = 96 * MIB;

#[test]
fn killed_server_then_rerun_resumes() {
    let t = Tmp::new("resume");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("big.bin"), 8, SIZE);
    let state = t.join("state");
    let srv = Server::start(&root, &state);
    let port = srv.port;
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    // (Without --retry-for 0 the get would ride the outage out itself:
    // outage.rs.)
    let args: Vec<OsString> = vec![
        "--accept-new".into(),
        "--retry-for".into(),
        "0".into(),
        "--max-rate".into(),
        "200M".into(),
        "--json".into(),
        srv.remote("big.bin"),
        dest.clone().into(),
    ];

    // Start the get, kill -9 the server 1.5 s into it, or as soon as a third of the
    // file is journaled if that comes first (at 200 Mbit/s both are about the same
    // moment; it keeps the test meaningful should the rate cap not hold, see
    // `rate.rs`).
    let cmd = c.cmd("get", &args);
    let started = Instant::now();
    let client = std::thread::spawn(move || run_timeout(cmd, Duration::from_secs(60)));
    let journal = dest.join(".big.bin.lh-journal");
    while started.elapsed() < Duration::from_millis(1500) {
        let n = journaled_chunks(&journal, SIZE / MIB);
        if n >= 32 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = srv.pid().unwrap();
    srv.kill();
    eprintln!("killed server pid {pid} after {:?}", started.elapsed());
    let out = client.join().unwrap();
    eprintln!(
        "interrupted get exited {} after {:?}",
        out.code, out.elapsed
    );
    out.expect_code(3);
    let j = out.json();
    assert_eq!(j["ok"], false, "{j:#}");
    assert_eq!(j["problems"][0]["kind"], "connection", "{j:#}");
    assert!(
        out.elapsed < Duration::from_secs(30),
        "the loss is noticed within the idle timeout: {:?}",
        out.elapsed
    );
    let part = dest.join(".big.bin.lh-part");
    assert!(
        part.is_file() && journal.is_file(),
        "{:?}",
        list_tree(&dest)
    );
    assert!(std::fs::symlink_metadata(dest.join("big.bin")).is_err());
    let records = journaled_chunks(&journal, SIZE / MIB);
    eprintln!("journal holds {records} chunk(s)");

    // Same identity, same port; the same command again.
    let srv = ServeCfg::new(&root, &state).port(port).start();
    let out = c.run("get", &args);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["ok"], true);
    assert_eq!(
        hash_file(&dest.join("big.bin")),
        hash_file(&root.join("big.bin"))
    );
    assert_same_tree(&root.join("big.bin"), &dest.join("big.bin"), Compare::ALL);
    assert_eq!(
        list_tree(&dest),
        vec![dest.join("big.bin")],
        "part file and journal are gone"
    );
    let resumed = totals(&j, "bytes_resumed");
    let moved = totals(&j, "bytes_transferred");
    let rx = j["udp_rx_bytes"].as_u64().unwrap();
    eprintln!(
        "rerun: resumed {resumed}, transferred {moved}, udp_rx {rx}, {:.2} s",
        j["seconds"].as_f64().unwrap()
    );
    assert!(resumed > 0, "something was resumed: {j:#}");
    assert_eq!(
        resumed,
        records * MIB,
        "exactly the journaled chunks are reused"
    );
    assert_eq!(resumed + moved, SIZE, "{j:#}");
    let f = &files_by_path(&j)["big.bin"];
    assert_eq!(f["bytes_resumed"], resumed);
    assert_eq!(f["status"], "verified");
    assert!(
        rx as f64 <= 1.10 * (SIZE - resumed) as f64,
        "rerun received {rx} UDP bytes for {} missing bytes",
        SIZE - resumed
    );
    drop(srv);
}

#[test]
fn a_cut_tree_copy_resumes_without_sending_its_complete_files_again() {
    // A get of a tree killed (SIGKILL) part way: on the rerun, the files that
    // were already in place are skipped (size and mtime match), the partial
    // large files resume, and only the rest crosses the network.
    let t = Tmp::new("tree-resume");
    let root = t.join("root");
    let tree = root.join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    for i in 0..300u64 {
        gen_file(&tree.join(format!("s{i:03}.bin")), 100 + i, 10_000);
    }
    // Named to come after the small files in the sender's sorted walk.
    for i in 0..3u64 {
        gen_file(&tree.join(format!("z{i}.bin")), 900 + i, 4 * MIB);
    }
    let total = 300 * 10_000 + 3 * 4 * MIB;
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let args: Vec<OsString> = vec![
        "--accept-new".into(),
        "--json".into(),
        srv.remote("tree"),
        dest.clone().into(),
    ];
    // 20 Mbit/s: the small files take about 1.2 s.
    let mut slow = vec![OsString::from("--max-rate"), "20M".into()];
    slow.extend(args.iter().cloned());
    let mut child = c
        .cmd("get", &slow)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Files in place under their own names (verified and renamed).
    let placed = || -> Vec<String> {
        std::fs::read_dir(dest.join("tree"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default()
    };
    let started = Instant::now();
    while placed().len() < 100 && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = placed();
    assert!(
        before.len() >= 100 && before.len() < 303,
        "{} file(s) placed when killed",
        before.len()
    );
    let held: u64 = before
        .iter()
        .map(|n| std::fs::metadata(dest.join("tree").join(n)).unwrap().len())
        .sum();

    let out = c.run("get", &args);
    out.expect_code(0);
    let j = out.json();
    assert!(
        totals(&j, "skipped") >= before.len() as u64,
        "{} placed before, skipped {}: {j:#}",
        before.len(),
        totals(&j, "skipped")
    );
    assert!(totals(&j, "bytes_skipped") >= held, "{j:#}");
    assert_eq!(
        totals(&j, "bytes_skipped") + totals(&j, "bytes_resumed") + totals(&j, "bytes_transferred"),
        total,
        "{j:#}"
    );
    assert!(totals(&j, "bytes_transferred") < total, "{j:#}");
    assert_same_tree(&tree, &dest.join("tree"), Compare::ALL);
}
