//! A receiver slower than the network (every write delayed: a test-only
//! hook of debug builds) slows the transfer down; it never fails it, and
//! the summary and `--json` say that the destination set the pace.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

/// `dir/tree`: 12 files of 1.5 MiB and 200 of 10 kB.
fn make_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("tree/sub")).unwrap();
    for i in 0..12u64 {
        gen_file(&dir.join(format!("tree/sub/f{i}")), i, 3 * MIB / 2);
    }
    for i in 0..200u64 {
        gen_file(&dir.join(format!("tree/s{i}")), 100 + i, 10_000);
    }
}

/// A `--json` report says the destination was behind for a real part of the run.
fn assert_behind(j: &serde_json::Value) {
    let behind = j["receiver_behind_s"].as_f64().expect("receiver_behind_s");
    let secs = j["seconds"].as_f64().unwrap();
    assert!(
        behind > 0.2 && behind <= secs,
        "behind {behind} of {secs} s: {j:#}"
    );
}

#[test]
fn a_slow_destination_sets_the_pace_and_says_so() {
    let t = Tmp::new("slow-receiver");
    let root = t.join("root");
    make_tree(&root);
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    let mut cmd = c.cmd(
        "get",
        [
            OsString::from("--accept-new"),
            "--json".into(),
            srv.remote("tree"),
            dest.clone().into(),
        ],
    );
    cmd.env("LONGHAUL_TEST_WRITE_DELAY_MS", "40");
    let out = run_timeout(cmd, Duration::from_secs(120));
    out.expect_code(0);
    assert_behind(&out.json());
    let d = diff_trees(&root.join("tree"), &dest.join("tree"), Compare::ALL);
    assert!(d.is_empty(), "{d:?}");
    // The human summary says it too.
    std::fs::remove_dir_all(&dest).unwrap();
    let mut cmd = c.cmd("get", [srv.remote("tree"), dest.clone().into()]);
    cmd.env("LONGHAUL_TEST_WRITE_DELAY_MS", "40");
    let out = run_timeout(cmd, Duration::from_secs(120));
    out.expect_code(0);
    assert!(
        out.stderr.contains("the destination was behind")
            || out.stdout.contains("the destination was behind"),
        "{}{}",
        out.stdout,
        out.stderr
    );
}

#[test]
fn a_put_client_says_when_the_servers_disk_set_the_pace() {
    let t = Tmp::new("slow-server");
    let src = t.join("src");
    make_tree(&src);
    let root = t.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let state = t.join("state");
    let srv = ServeCfg::new(&root, &state)
        .writable()
        .env("LONGHAUL_TEST_WRITE_DELAY_MS", "40")
        .start();
    let c = Client::new(t.join("kh"));
    let out = c.run(
        "put",
        [
            OsString::from("--accept-new"),
            "--json".into(),
            src.join("tree").into(),
            srv.remote(""),
        ],
    );
    out.expect_code(0);
    assert_behind(&out.json());
    let d = diff_trees(&src.join("tree"), &root.join("tree"), Compare::ALL);
    assert!(d.is_empty(), "{d:?}");
    assert!(srv.log_text().contains("behind for"), "{}", srv.log_text());
}
