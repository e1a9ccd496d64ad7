//! By default (size + mtime, rsync's quick check) and with --checksum (BLAKE3) a
//! rerun skips what is already there; --overwrite sends everything again.

use longhaul_testkit::*;
use std::collections::BTreeMap;
use std::ffi::OsString;

fn statuses(j: &serde_json::Value) -> BTreeMap<String, (String, u64)> {
    files_by_path(j)
        .into_iter()
        .map(|(p, f)| {
            (
                p,
                (
                    f["status"].as_str().unwrap().to_string(),
                    f["bytes_transferred"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

#[test]
fn sync_skips_unchanged_and_fetches_changed() {
    let t = Tmp::new("sync");
    let root = t.join("root");
    let set = root.join("set");
    std::fs::create_dir_all(set.join("sub")).unwrap();
    gen_file(&set.join("big.bin"), 1, 5 * MIB + 3);
    gen_file(&set.join("medium.bin"), 2, MIB);
    std::fs::write(set.join("small.txt"), b"small\n").unwrap();
    std::fs::write(set.join("sub/empty"), b"").unwrap();
    gen_file(&set.join("sub/other.bin"), 3, 70_000);
    for (i, p) in list_tree(&set).iter().enumerate() {
        set_mtime_ns(p, 1_650_000_000_000_000_001 + i as i64 * 1_000_000_123);
    }
    let nfiles = 5u64;
    let total: u64 = 5 * MIB + 3 + MIB + 6 + 70_000;
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let get = |extra: &[&str]| {
        let mut a: Vec<OsString> = vec!["--json".into()];
        a.extend(extra.iter().map(OsString::from));
        a.push(srv.remote("set"));
        a.push(dest.clone().into());
        c.run("get", a)
    };

    // First, a full copy.
    let out = get(&["--accept-new"]);
    out.expect_code(0);
    assert_eq!(totals(&out.json(), "bytes_transferred"), total);
    assert_same_tree(&set, &dest.join("set"), Compare::ALL);

    // Again (with --sync, the old name of the default): everything skipped,
    // nothing moved, exit 0.
    let out = get(&["--sync"]);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["ok"], true);
    assert_eq!(totals(&j, "files"), nfiles);
    assert_eq!(totals(&j, "skipped"), nfiles, "{j:#}");
    assert_eq!(totals(&j, "verified"), 0);
    assert_eq!(totals(&j, "bytes_skipped"), total, "{j:#}");
    assert_eq!(totals(&j, "bytes_transferred"), 0);
    assert_eq!(totals(&j, "bytes"), total);
    assert!(statuses(&j)
        .values()
        .all(|(s, b)| s == "skipped" && *b == 0));
    assert!(
        j["udp_rx_bytes"].as_u64().unwrap() < 64 * 1024,
        "only control traffic: {}",
        j["udp_rx_bytes"]
    );
    assert_same_tree(&set, &dest.join("set"), Compare::ALL);

    // Change one file's content (same size, new mtime): only that one is fetched.
    gen_file(&set.join("medium.bin"), 99, MIB);
    set_mtime_ns(&set.join("medium.bin"), 1_700_000_000_555_555_555);
    set_mtime_ns(&set, 1_650_000_000_000_000_001); // the dir's mtime as before
    let out = get(&[]);
    out.expect_code(0);
    let j = out.json();
    let st = statuses(&j);
    for (p, (s, b)) in &st {
        if p == "set/medium.bin" {
            assert_eq!((s.as_str(), *b), ("verified", MIB), "{j:#}");
        } else {
            assert_eq!((s.as_str(), *b), ("skipped", 0), "{p}: {j:#}");
        }
    }
    assert_eq!(st.len() as u64, nfiles);
    assert_eq!(totals(&j, "bytes_transferred"), MIB);
    assert_same_tree(&set, &dest.join("set"), Compare::ALL);

    // Same content, different mtime: --checksum skips it...
    let other = set.join("sub/other.bin");
    set_mtime_ns(&other, 1_710_000_000_000_000_042);
    let before = std::fs::metadata(dest.join("set/sub/other.bin")).unwrap();
    let out = get(&["--checksum"]);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(totals(&j, "skipped"), nfiles, "{j:#}");
    assert_eq!(totals(&j, "bytes_transferred"), 0, "{j:#}");
    assert!(
        j["udp_rx_bytes"].as_u64().unwrap() < 64 * 1024,
        "no file data moved: {}",
        j["udp_rx_bytes"]
    );
    assert_eq!(
        std::fs::read(dest.join("set/sub/other.bin")).unwrap(),
        std::fs::read(&other).unwrap()
    );
    let after = std::fs::metadata(dest.join("set/sub/other.bin")).unwrap();
    assert_eq!(
        mtime_ns(&after),
        mtime_ns(&before),
        "the local file was left alone"
    );
    // ...while the default sees the new mtime and fetches it.
    let out = get(&[]);
    out.expect_code(0);
    let st = statuses(&out.json());
    assert_eq!(st["set/sub/other.bin"], ("verified".to_string(), 70_000));
    assert_eq!(totals(&out.json(), "bytes_transferred"), 70_000);
    assert_same_tree(&set, &dest.join("set"), Compare::ALL);

    // --checksum with different content of the same size fetches it.
    gen_file(&dest.join("set/big.bin"), 1234, 5 * MIB + 3);
    set_mtime_ns(
        &dest.join("set/big.bin"),
        mtime_ns(&std::fs::metadata(set.join("big.bin")).unwrap()),
    );
    // (the default is fooled by size+mtime, as documented)
    let out = get(&[]);
    out.expect_code(0);
    assert_eq!(totals(&out.json(), "bytes_transferred"), 0);
    let out = get(&["--checksum"]);
    out.expect_code(0);
    let st = statuses(&out.json());
    assert_eq!(st["set/big.bin"], ("verified".to_string(), 5 * MIB + 3));
    assert_eq!(totals(&out.json(), "bytes_transferred"), 5 * MIB + 3);
    assert_same_tree(&set, &dest.join("set"), Compare::ALL);

    // --overwrite fetches every file again.
    let out = get(&["--overwrite"]);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(totals(&j, "verified"), nfiles, "{j:#}");
    assert_eq!(totals(&j, "bytes_transferred"), total);
    assert_same_tree(&set, &dest.join("set"), Compare::ALL);

    // --checksum and --overwrite contradict each other.
    let out = get(&["--checksum", "--overwrite"]);
    out.expect_code(2);
    assert!(out.stderr.contains("--overwrite"), "{}", out.stderr);
}

#[test]
fn an_interrupted_transfer_in_the_source_is_not_sent_and_destroys_nothing() {
    // The source tree holds what an interrupted longhaul run leaves: parts
    // and a journal beside the files they belong to. Sent, each would be
    // taken for the part of its namesake at the destination.
    let t = Tmp::new("reserved");
    let root = t.join("root");
    let set = root.join("set");
    std::fs::create_dir_all(&set).unwrap();
    gen_file(&set.join("x"), 1, 3 * MIB);
    gen_file(&set.join(".x.lh-part"), 2, 100_000);
    std::fs::write(set.join(".x.lh-journal"), b"j").unwrap();
    std::fs::write(set.join("y"), b"why").unwrap();
    std::fs::write(set.join(".y.lh-part"), b"part of y").unwrap();
    let before = std::fs::read(set.join(".x.lh-part")).unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    for _ in 0..2 {
        let out = c.run(
            "get",
            [
                OsString::from("--json"),
                "--accept-new".into(),
                srv.remote("set/"),
                dest.clone().into(),
            ],
        );
        out.expect_code(0);
        let got = statuses(&out.json());
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            ["x", "y"],
            "only the files themselves are sent"
        );
        assert_eq!(
            std::fs::read(dest.join("x")).unwrap(),
            std::fs::read(set.join("x")).unwrap()
        );
        assert_eq!(std::fs::read(dest.join("y")).unwrap(), b"why");
        let left: Vec<_> = std::fs::read_dir(&dest)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left.len(),
            2,
            "no part or journal at the destination: {left:?}"
        );
    }
    assert_eq!(std::fs::read(set.join(".x.lh-part")).unwrap(), before);
    assert_eq!(std::fs::read(set.join(".y.lh-part")).unwrap(), b"part of y");
}

#[test]
fn put_sync_skips_what_the_server_has() {
    // Protocol 4 had no field for a put's sync mode: every put sent everything.
    let t = Tmp::new("putsync");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("in")).unwrap();
    let set = t.join("set");
    std::fs::create_dir_all(&set).unwrap();
    gen_file(&set.join("big.bin"), 1, 3 * MIB + 7);
    std::fs::write(set.join("small.txt"), b"small\n").unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let put = |extra: &[&str]| {
        let mut a: Vec<OsString> = vec!["--json".into(), "--accept-new".into()];
        a.extend(extra.iter().map(OsString::from));
        a.push(set.clone().into());
        a.push(srv.remote("in/"));
        c.run("put", a)
    };
    put(&[]).expect_code(0);
    assert_same_tree(&set, &root.join("in/set"), Compare::ALL);

    let out = put(&[]);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(totals(&j, "skipped"), 2, "{j:#}");
    assert_eq!(totals(&j, "bytes_transferred"), 0, "{j:#}");
    let out = put(&["--overwrite"]);
    out.expect_code(0);
    assert_eq!(totals(&out.json(), "bytes_transferred"), 3 * MIB + 7 + 6);

    // A new mtime, same bytes: the default sends it, --checksum does not.
    set_mtime_ns(&set.join("big.bin"), 1_700_000_000_123_456_789);
    let out = put(&["--checksum"]);
    out.expect_code(0);
    assert_eq!(
        totals(&out.json(), "bytes_transferred"),
        0,
        "{:#}",
        out.json()
    );
    let out = put(&[]);
    out.expect_code(0);
    let st = statuses(&out.json());
    assert_eq!(st["big.bin"], ("verified".to_string(), 3 * MIB + 7));
    assert_eq!(st["small.txt"], ("skipped".to_string(), 0));
    assert_same_tree(&set, &root.join("in/set"), Compare::ALL);
}

#[test]
fn get_streams_reaches_the_server() {
    let t = Tmp::new("streams");
    let root = t.join("root");
    std::fs::create_dir_all(&root).unwrap();
    gen_file(&root.join("f"), 5, 2 * MIB);
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    for (extra, want) in [
        (vec![], 4),
        (vec!["--streams", "7"], 7),
        (vec!["--streams", "999"], 64),
    ] {
        let mut a: Vec<OsString> = vec!["--json".into(), "--accept-new".into()];
        a.extend(extra.iter().map(OsString::from));
        a.push(srv.remote("f"));
        a.push(dest.clone().into());
        let out = c.run("get", a);
        out.expect_code(0);
        assert_eq!(out.json()["streams"], want, "{extra:?}");
    }
    assert_eq!(
        std::fs::read(dest.join("f")).unwrap(),
        std::fs::read(root.join("f")).unwrap()
    );
}

#[test]
fn sync_gives_a_skipped_file_the_sources_mode() {
    use std::os::unix::fs::PermissionsExt;
    let t = Tmp::new("syncmode");
    let root = t.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let f = root.join("f");
    std::fs::write(&f, b"same bytes").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let get = |extra: &[&str]| {
        let mut a: Vec<OsString> = vec!["--json".into(), "--accept-new".into()];
        a.extend(extra.iter().map(OsString::from));
        a.push(srv.remote("f"));
        a.push(dest.clone().into());
        c.run("get", a)
    };
    get(&[]).expect_code(0);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&dest.join("f")), 0o644);
    // chmod keeps the mtime: a rerun skips the bytes and updates the mode.
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = get(&[]);
    out.expect_code(0);
    assert_eq!(totals(&out.json(), "skipped"), 1, "{:#}", out.json());
    assert_eq!(mode(&dest.join("f")), 0o600);
}

#[test]
fn a_put_is_durable_on_the_server_unless_no_fsync_says_otherwise() {
    let t = Tmp::new("fsync");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("in")).unwrap();
    let src = t.join("f");
    gen_file(&src, 9, 3 * MIB);
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let put = |extra: &[&str], dest: &str| {
        let mut a: Vec<OsString> = vec!["--accept-new".into()];
        a.extend(extra.iter().map(OsString::from));
        a.push(src.clone().into());
        a.push(srv.remote(dest));
        c.run("put", a)
    };
    let synced = "synced the destination's file system";
    put(&["--no-fsync"], "in/a").expect_code(0);
    assert!(!srv.log_text().contains(synced), "{}", srv.log_text());
    put(&[], "in/b").expect_code(0);
    assert!(srv.log_text().contains(synced), "{}", srv.log_text());
    // The old flag still runs (durable is the default).
    put(&["--fsync"], "in/c").expect_code(0);
    for f in ["a", "b", "c"] {
        assert_eq!(hash_file(&root.join("in").join(f)), hash_file(&src));
    }
}
