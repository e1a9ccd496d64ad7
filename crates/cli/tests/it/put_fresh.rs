//! A put into a destination that holds none of its targets runs fresh (the
//! server says so in `Welcome.fresh`, protocol 4): the client sends each file
//! at once, without waiting for a `Want`. A destination that holds a target,
//! or an earlier run's part beside one, is not fresh: the server asks per file,
//! replaces what is there and leaves no part behind.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::time::{Duration, Instant};

/// A small tree: many small files (where the saved round trip and frames
/// matter) and one of several chunks.
fn source(t: &Tmp) -> std::path::PathBuf {
    let src = t.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..200u64 {
        let d = if i % 2 == 0 {
            src.clone()
        } else {
            src.join("sub")
        };
        gen_file(&d.join(format!("f{i:03}.bin")), i, 1000 + i * 37);
    }
    gen_file(&src.join("big.bin"), 999, 9 * MIB + 12_345);
    std::fs::write(src.join("empty"), b"").unwrap();
    src
}

/// `put SRC/ srv:in --json`, trusting the server by `trust` (flag and value).
fn put_contents(c: &Client, src: &std::path::Path, srv: &Server, trust: &[OsString]) -> Out {
    let mut local = src.as_os_str().to_owned();
    local.push("/");
    let mut args = trust.to_vec();
    args.extend([OsString::from("--json"), local, srv.remote("in")]);
    c.run("put", args)
}

/// A server on an empty root, a client, and the source tree.
struct Fixture {
    /// First, so the server stops before its directory goes.
    srv: Server,
    c: Client,
    src: std::path::PathBuf,
    root: std::path::PathBuf,
    _t: Tmp,
}

fn fixture(label: &str) -> Fixture {
    let t = Tmp::new(label);
    let src = source(&t);
    let root = t.join("served");
    std::fs::create_dir(&root).unwrap();
    Fixture {
        srv: Server::start_writable(&root, &t.join("state")),
        c: Client::new(t.join("kh")),
        src,
        root,
        _t: t,
    }
}

/// The server's log line for the session, once it has been written.
fn session_line(srv: &Server) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = srv.log_text();
        if let Some(l) = log.lines().find(|l| l.contains("file(s)")) {
            return l.to_string();
        }
        assert!(Instant::now() < deadline, "no session line in {log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_put_into_a_fresh_destination_sends_without_wants() {
    let Fixture {
        srv, c, src, root, ..
    } = &fixture("put-fresh");
    let trust = ["--fingerprint".into(), srv.fingerprint.clone().into()];
    let out = put_contents(c, src, srv, &trust);
    out.expect_code(0);
    assert_same_tree(src, &root.join("in"), Compare::ALL);
    let j = out.json();
    assert_eq!(j["totals"]["verified"], 202, "{j:#}");
    let line = session_line(srv);
    assert!(
        line.contains("fresh put: 202 file(s), 0 problem(s)"),
        "{line}"
    );
}

#[test]
fn a_put_over_an_earlier_one_is_not_fresh_and_replaces_what_is_there() {
    let Fixture {
        srv, c, src, root, ..
    } = &fixture("put-not-fresh");
    let dest = root.join("in");
    std::fs::create_dir_all(dest.join("sub")).unwrap();
    // Other contents under two of the names, and an earlier run's part (no
    // journal: nothing to resume) beside a third.
    std::fs::write(dest.join("f000.bin"), b"old contents").unwrap();
    std::fs::write(dest.join("sub/f001.bin"), b"old").unwrap();
    std::fs::write(dest.join(".big.bin.lh-part"), b"stale part").unwrap();
    let out = put_contents(c, src, srv, &["--accept-new".into()]);
    out.expect_code(0);
    // Replaced, and no part left: the trees are the same.
    assert_same_tree(src, &dest, Compare::ALL);
    let line = session_line(srv);
    assert!(
        line.contains(": put: 202 file(s), 0 problem(s)"),
        "not fresh: {line}"
    );
}

#[test]
fn a_part_beside_the_only_target_makes_a_put_ask_per_file() {
    let Fixture {
        srv, c, src, root, ..
    } = &fixture("put-part");
    let dest = root.join("in");
    std::fs::create_dir_all(&dest).unwrap();
    // Only an earlier run's part of the one target, nothing else.
    std::fs::write(dest.join(".big.bin.lh-part"), b"stale part").unwrap();
    let out = c.run(
        "put",
        [
            OsString::from("--accept-new"),
            "--json".into(),
            src.join("big.bin").into(),
            srv.remote("in/"),
        ],
    );
    out.expect_code(0);
    assert_eq!(
        hash_file(&dest.join("big.bin")),
        hash_file(&src.join("big.bin"))
    );
    let left: Vec<_> = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["big.bin"], "the part is gone");
    let line = session_line(srv);
    assert!(
        line.contains(": put: 1 file(s), 0 problem(s)"),
        "not fresh: {line}"
    );
}
