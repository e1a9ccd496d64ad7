//! Source files deleted during a transfer: each is reported as vanished
//! (exit 24, as rsync's), the rest arrive, and nothing of the vanished
//! ones is left at the destination (no part file, no journal).

use longhaul_testkit::*;
use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

const BIG: u64 = 32 * MIB;

/// Waits (up to 30 s) until `dir` holds a part file.
fn part_in(dir: &Path) {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        let found = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().contains(".lh-part"))
            })
            .unwrap_or(false);
        if found {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no part file in {} after 30 s", dir.display());
}

/// The run's report says `z1.bin` and `z2.bin` vanished and `big.bin`
/// arrived; `dest` holds nothing of longhaul's own.
fn check(out: &Out, dest: &Path) {
    out.expect_code(24);
    let j = out.json();
    let files = files_by_path(&j);
    assert_eq!(files["big.bin"]["status"], "verified", "{j:#}");
    for z in ["z1.bin", "z2.bin"] {
        assert_eq!(files[z]["status"], "failed", "{j:#}");
        assert!(!dest.join(z).exists());
    }
    let kinds: Vec<&str> = j["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["vanished", "vanished"], "{j:#}");
    let own: Vec<String> = std::fs::read_dir(dest)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".lh-"))
        .collect();
    assert!(own.is_empty(), "left behind: {own:?}");
}

#[test]
fn files_deleted_during_a_get_or_a_put_are_reported_vanished_and_leave_nothing() {
    let t = Tmp::new("vanished");
    let root = t.join("root");
    let src = root.join("src");
    let fill = |dir: &Path| {
        std::fs::create_dir_all(dir).unwrap();
        gen_file(&dir.join("big.bin"), 1, BIG);
        gen_file(&dir.join("z1.bin"), 2, 3 * MIB);
        gen_file(&dir.join("z2.bin"), 3, 3 * MIB);
    };
    fill(&src);
    let srv = ServeCfg::new(&root, &t.join("state")).writable().start();
    let c = Client::new(t.join("known_hosts"));
    // 32 Mbit/s: 8 s for big.bin, which goes first; z1 and z2 are read
    // after it, and deleted a moment in.
    let slow = ["--accept-new", "--max-rate", "32M", "--json"].map(OsString::from);

    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let mut a = slow.to_vec();
    a.extend([remote(srv.port, "src/"), dest.clone().into()]);
    let cmd = c.cmd("get", a);
    let run = std::thread::spawn(move || run_timeout(cmd, Duration::from_secs(60)));
    part_in(&dest);
    std::fs::remove_file(src.join("z1.bin")).unwrap();
    std::fs::remove_file(src.join("z2.bin")).unwrap();
    check(&run.join().unwrap(), &dest);
    assert_eq!(
        hash_file(&dest.join("big.bin")),
        hash_file(&src.join("big.bin"))
    );

    // A put: the same, the server keeping nothing of them.
    let local = t.join("local");
    fill(&local);
    let up = root.join("up");
    std::fs::create_dir(&up).unwrap();
    let mut a = slow.to_vec();
    a.extend([
        OsString::from(format!("{}/", local.display())),
        remote(srv.port, "up/"),
    ]);
    let cmd = c.cmd("put", a);
    let run = std::thread::spawn(move || run_timeout(cmd, Duration::from_secs(60)));
    part_in(&up);
    std::fs::remove_file(local.join("z1.bin")).unwrap();
    std::fs::remove_file(local.join("z2.bin")).unwrap();
    let out = run.join().unwrap();
    // (The put's report names its source files; the server's directory is
    // checked for what it kept.)
    check(&out, &up);
}

#[test]
fn a_file_that_changes_while_it_is_sent_is_sent_once_more_and_arrives_as_it_is_now() {
    let t = Tmp::new("changing");
    let root = t.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let f = root.join("log.bin");
    gen_file(&f, 1, 8 * MIB);
    let srv = ServeCfg::new(&root, &t.join("state")).start();
    let c = Client::new(t.join("known_hosts"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    // 16 Mbit/s: 4 s for the file; it grows a moment in, once.
    let a = [
        OsString::from("--accept-new"),
        "--max-rate".into(),
        "16M".into(),
        "--json".into(),
        remote(srv.port, "log.bin"),
        dest.clone().into(),
    ];
    let cmd = c.cmd("get", a);
    let run = std::thread::spawn(move || run_timeout(cmd, Duration::from_secs(60)));
    part_in(&dest);
    {
        use std::io::Write;
        let mut w = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
        w.write_all(b"one more line\n").unwrap();
    }
    let out = run.join().unwrap();
    out.expect_code(0);
    let j = out.json();
    let files = files_by_path(&j);
    assert_eq!(files["log.bin"]["status"], "verified", "{j:#}");
    assert_eq!(j["totals"]["files"], 1, "{j:#}");
    assert_eq!(hash_file(&dest.join("log.bin")), hash_file(&f));
    assert_eq!(
        std::fs::metadata(dest.join("log.bin")).unwrap().len(),
        8 * MIB + 14
    );
}
