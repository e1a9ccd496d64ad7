//! Server identity pinning, ssh style: unknown, accept-new, remembered, changed,
//! wrong --fingerprint.

use longhaul_testkit::*;
use std::ffi::OsString;

fn get_args(srv: &Server, dest: &std::path::Path, extra: &[&str]) -> Vec<OsString> {
    let mut v: Vec<OsString> = extra.iter().map(OsString::from).collect();
    v.push(srv.remote("hello.txt"));
    v.push(dest.into());
    v
}

#[test]
fn unknown_accept_new_remembered_then_changed_key_refused() {
    let t = Tmp::new("trust");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("hello.txt"), b"hello\n").unwrap();
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let srv = Server::start_writable(&root, &t.join("state1"));
    let port = srv.port;
    let kh = t.join("config/known_hosts");
    let c = Client::new(&kh);

    // --print-fingerprint agrees with what serve printed.
    let mut pf = longhaul();
    pf.args(["serve", "--print-fingerprint", "--state-dir"])
        .arg(t.join("state1"));
    let out = run(pf);
    out.expect_code(0);
    assert_eq!(out.stdout, format!("{}\n", srv.fingerprint));

    // Unknown server, no flag: refused, told the fingerprint and how to pin it.
    let out = c.run("get", get_args(&srv, &dest, &[]));
    out.expect_code(3);
    assert!(
        out.stderr.contains(&srv.fingerprint),
        "stderr names the server's fingerprint:\n{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains(&format!("--fingerprint {}", srv.fingerprint)),
        "stderr shows the --fingerprint option to use:\n{}",
        out.stderr
    );
    assert!(out.stderr.contains("--accept-new"), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("127.0.0.1:{port}")),
        "{}",
        out.stderr
    );
    assert!(!kh.exists(), "a refusal writes no known_hosts");
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0);

    // The same failure as JSON: one document, ok false, a connection problem.
    let out = c.run("get", get_args(&srv, &dest, &["--json"]));
    out.expect_code(3);
    let j = out.json();
    assert_eq!(j["ok"], false);
    assert_eq!(j["problems"][0]["kind"], "connection", "{j:#}");
    assert!(j["problems"][0]["message"]
        .as_str()
        .unwrap()
        .contains(&srv.fingerprint));

    // --accept-new: trusted, remembered, and the file arrives.
    let out = c.run("get", get_args(&srv, &dest, &["--accept-new", "--quiet"]));
    out.expect_code(0);
    assert_eq!(std::fs::read(dest.join("hello.txt")).unwrap(), b"hello\n");
    let text = std::fs::read_to_string(&kh).unwrap();
    assert_eq!(
        text,
        format!("127.0.0.1:{port} {}\n", srv.fingerprint),
        "known_hosts holds exactly the new host"
    );

    // Next run without any flag works (and does not add a second line).
    std::fs::remove_file(dest.join("hello.txt")).unwrap();
    let out = c.run("get", get_args(&srv, &dest, &["--quiet"]));
    out.expect_code(0);
    assert_eq!(std::fs::read(dest.join("hello.txt")).unwrap(), b"hello\n");
    // A matching --fingerprint is fine too.
    let fp = srv.fingerprint.clone();
    let out = c.run(
        "get",
        get_args(&srv, &dest, &["--quiet", "--fingerprint", &fp]),
    );
    out.expect_code(0);
    assert_eq!(std::fs::read_to_string(&kh).unwrap(), text);

    // Same address, new key: refused loudly, even with --accept-new or a matching pin.
    srv.kill();
    let srv2 = ServeCfg::new(&root, &t.join("state2")).port(port).start();
    assert_ne!(srv2.fingerprint, fp, "a new state dir is a new key");
    let before = std::fs::read_dir(&dest).unwrap().count();
    let fp2 = srv2.fingerprint.clone();
    for extra in [
        vec![],
        vec!["--accept-new"],
        vec!["--fingerprint", fp2.as_str()],
    ] {
        let out = c.run("get", get_args(&srv2, &dest, &extra));
        out.expect_code(3);
        assert!(
            out.stderr.contains("HAS CHANGED"),
            "with {extra:?}:\n{}",
            out.stderr
        );
        assert!(
            out.stderr.contains(&fp),
            "names the known key: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(&fp2),
            "names the new key: {}",
            out.stderr
        );
    }
    assert_eq!(
        std::fs::read_to_string(&kh).unwrap(),
        text,
        "known_hosts untouched"
    );
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), before);
}

#[test]
fn wrong_fingerprint_is_refused() {
    let t = Tmp::new("trust-pin");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("hello.txt"), b"hello\n").unwrap();
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));

    // Well-formed but another key's fingerprint (of another state dir).
    let mut pf = longhaul();
    pf.args(["serve", "--print-fingerprint", "--state-dir"])
        .arg(t.join("other-state"));
    let other = run(pf);
    other.expect_code(0);
    let other = other.stdout.trim().to_string();
    assert_ne!(other, srv.fingerprint);
    for extra in [vec![], vec!["--accept-new"]] {
        let mut args = vec!["--fingerprint", other.as_str()];
        args.extend(extra);
        let out = c.run("get", get_args(&srv, &dest, &args));
        out.expect_code(3);
        assert!(
            out.stderr.contains(&other) && out.stderr.contains(&srv.fingerprint),
            "names both the pin and what was presented:\n{}",
            out.stderr
        );
        assert!(out.stderr.contains("refusing"), "{}", out.stderr);
    }
    assert!(!t.join("kh").exists());
    assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0);

    // A malformed fingerprint is a usage error (2), found before connecting.
    let out = c.run(
        "get",
        get_args(&srv, &dest, &["--fingerprint", "MD5:00:11:22"]),
    );
    out.expect_code(2);
    assert!(out.stderr.contains("SHA256:"), "{}", out.stderr);

    // And put is pinned the same way.
    let local = t.join("up.txt");
    std::fs::write(&local, b"up").unwrap();
    let out = c.run(
        "put",
        [
            OsString::from("--fingerprint"),
            other.clone().into(),
            local.into(),
            srv.remote("up.txt"),
        ],
    );
    out.expect_code(3);
    assert!(!root.join("up.txt").exists());
}
