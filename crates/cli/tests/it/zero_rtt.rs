//! A known server takes a client's request from its first flight (QUIC
//! 0-RTT, with the ticket and the address-validation token the client kept
//! from an earlier run), a restarted server refuses the ticket and the
//! transfer still completes, and a first flight alone (what an attacker
//! can record and replay) makes no put happen.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::time::Duration;

/// `get|put ARGS --json` through `c`: the exit code 0 and the report.
fn json(c: &Client, sub: &str, args: &[OsString]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json".into());
    let out = c.run(sub, a);
    out.expect_code(0);
    out.json()
}

#[test]
fn a_known_server_takes_the_request_from_the_first_flight_and_a_restarted_one_refuses_it() {
    let t = Tmp::new("zero-rtt");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("a.bin"), 1, 3 * MIB + 17);
    let state = t.join("state");
    let srv = ServeCfg::new(&root, &state)
        .writable()
        .env("LONGHAUL_LOG", "info,longhaul_quic=debug")
        .start();
    let port = srv.port;
    const WAITS: &str = "the first frame came before the handshake ended: it waits";
    let kh = t.join("config/known_hosts");
    let c = Client::new(&kh);
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let get = |extra: &[&str]| {
        let _ = std::fs::remove_file(dest.join("a.bin"));
        let mut a: Vec<OsString> = extra.iter().map(OsString::from).collect();
        a.extend([remote(port, "a.bin"), dest.clone().into()]);
        let j = json(&c, "get", &a);
        assert_eq!(
            hash_file(&dest.join("a.bin")),
            hash_file(&root.join("a.bin"))
        );
        j
    };

    // First contact: no ticket, the request after the handshake.
    let j = get(&["--accept-new"]);
    assert_eq!(j["zero_rtt"], "none", "{j:#}");
    // It left a ticket and a token beside the known-hosts file, private.
    let kept = t.join("config/known_hosts.resume");
    let text = std::fs::read_to_string(&kept).unwrap();
    assert!(
        text.contains(" ticket ") && text.contains(" token "),
        "{text}"
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&kept).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    // (First contact may read its Hello a moment before the handshake's end
    // is seen: it may wait that moment.)
    let waits = || srv.log_text().matches(WAITS).count();
    let before = waits();
    // Known: the request rides in the first flight, again and again, and
    // its token lets the server serve it at once.
    for _ in 0..3 {
        let j = get(&[]);
        assert_eq!(j["zero_rtt"], "accepted", "{j:#}");
    }
    // Without a token (the address not validated) the server reads the
    // early Hello only once the handshake has completed (on loopback that
    // is at once): still served.
    let text = std::fs::read_to_string(&kept).unwrap();
    let tickets: String = text
        .lines()
        .filter(|l| !l.contains(" token "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&kept, tickets).unwrap();
    assert_eq!(waits(), before, "{}", srv.log_text());
    let j = get(&[]);
    assert_eq!(j["zero_rtt"], "accepted", "{j:#}");
    // A put's Hello rides early too; the server answers it at once and
    // takes its data once the handshake has ended.
    let src = t.join("up.bin");
    gen_file(&src, 2, 2 * MIB + 3);
    let j = json(&c, "put", &[src.clone().into(), remote(port, "up.bin")]);
    assert_eq!(j["zero_rtt"], "accepted", "{j:#}");
    assert_eq!(hash_file(&root.join("up.bin")), hash_file(&src));

    // A restarted server (same key) holds no tickets: refused, and the
    // request goes again after the handshake.
    srv.kill();
    let srv2 = ServeCfg::new(&root, &state).writable().port(port).start();
    assert_eq!(srv2.fingerprint, srv.fingerprint);
    let j = get(&[]);
    assert_eq!(j["zero_rtt"], "refused", "{j:#}");
    assert_eq!(j["files"][0]["status"], "verified");
    // ... and the new server's ticket serves the next run.
    let j = get(&[]);
    assert_eq!(j["zero_rtt"], "accepted", "{j:#}");
}

/// Nothing a put makes: no file by `name` and no part file anywhere.
fn nothing_put(root: &std::path::Path, name: &str) {
    assert!(!root.join(name).exists(), "{name} was put");
    for e in std::fs::read_dir(root).unwrap() {
        let n = e.unwrap().file_name();
        assert!(
            !n.to_string_lossy().contains(".lh-part"),
            "a part file was made: {n:?}"
        );
    }
}

/// A writable server whose log says what it does with early frames, in a
/// fresh temporary directory (its root `root`, its state `state`).
fn debug_server(name: &str) -> (Tmp, std::path::PathBuf, Server) {
    let t = Tmp::new(name);
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = ServeCfg::new(&root, &t.join("state"))
        .writable()
        .env("LONGHAUL_LOG", "info,longhaul_quic=debug")
        .start();
    (t, root, srv)
}

#[test]
fn a_first_flight_alone_or_replayed_puts_nothing() {
    let (t, root, srv) = debug_server("zero-rtt-replay");
    let relay = Relay::start(format!("127.0.0.1:{}", srv.port).parse().unwrap());
    let port = relay.front.port();
    let c = Client::new(t.join("known_hosts"));
    let src = t.join("up.bin");
    gen_file(&src, 3, MIB + 5);
    let put = |name: &str, trust: &[&str]| {
        let mut a: Vec<OsString> = trust.iter().map(OsString::from).collect();
        a.extend([src.clone().into(), remote(port, name)]);
        a.push("--json".into());
        c.cmd("put", a)
    };

    // First contact through the relay: the client keeps a ticket and a token.
    let out = run(put("warm.bin", &["--accept-new"]));
    out.expect_code(0);
    assert_eq!(out.json()["zero_rtt"], "none");

    // A genuine put from the first flight, recorded.
    relay.set(Relay::PASS);
    let out = run(put("genuine.bin", &[]));
    out.expect_code(0);
    assert_eq!(out.json()["zero_rtt"], "accepted");
    assert_eq!(hash_file(&root.join("genuine.bin")), hash_file(&src));
    // Its first flight sent again from the same address once it is gone
    // (the server is asked to put genuine.bin again): nothing is put (the
    // ticket resumes once, the token validates once).
    std::fs::remove_file(root.join("genuine.bin")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let sent = relay.replay();
    assert!(sent >= 1);
    std::thread::sleep(Duration::from_millis(1500));
    nothing_put(&root, "genuine.bin");

    // A client cut off after its first flight (the server never sees its
    // Finished, as with a replay): the put's Hello came and was answered,
    // and the session waits for the handshake before it takes anything.
    relay.set(Relay::FIRST_FLIGHT);
    let mut cmd = put("cut.bin", &[]);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let _ = child.kill();
    let _ = child.wait();
    nothing_put(&root, "cut.bin");
    let log = srv.log_text();
    assert!(
        log.contains("a put before the handshake ended: its data waits"),
        "the early Hello reached the server:\n{log}"
    );
}

#[test]
fn a_known_put_sends_its_files_in_the_first_flight_unless_its_targets_are_there() {
    let (t, root, srv) = debug_server("zero-rtt-early-put");
    let port = srv.port;
    const EARLY: &str = "a fresh put whose files come before its answer";
    const DROPPED: &str = "dropped unread, the client sends again";
    let c = Client::new(t.join("known_hosts"));
    let tree = |name: &str, seed: u64| {
        let d = t.join("src").join(name);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        gen_file(&d.join("a.bin"), seed, 3 * MIB + 5);
        gen_file(&d.join("sub/b.bin"), seed + 1, 40_000);
        d
    };
    let put = |src: &std::path::Path, extra: &[&str]| {
        let mut a: Vec<OsString> = extra.iter().map(OsString::from).collect();
        a.extend([src.into(), remote(port, "in/")]);
        let mut cmd = c.cmd("put", a.iter().chain([&OsString::from("--json")]));
        cmd.env("LONGHAUL_LOG", "info");
        let out = run(cmd);
        out.expect_code(0);
        out
    };
    let same = |name: &str| {
        for f in ["a.bin", "sub/b.bin"] {
            let (here, there) = (
                t.join("src").join(name).join(f),
                root.join("in").join(name).join(f),
            );
            assert_eq!(hash_file(&there), hash_file(&here), "{name}/{f}");
        }
    };
    let count = |what: &str| srv.log_text().matches(what).count();

    // First contact: a ticket, a token and the path's RTT kept.
    std::fs::create_dir(root.join("in")).unwrap();
    let j = put(&tree("warm", 1), &["--accept-new"]).json();
    assert_eq!(
        (j["zero_rtt"].as_str(), j["early_files"].as_bool()),
        (Some("none"), Some(false))
    );
    let kept = std::fs::read_to_string(t.join("known_hosts.resume")).unwrap();
    assert!(kept.contains(" rtt ") && kept.contains(" put "), "{kept}");
    same("warm");

    // Known, new targets: the files go with the request, before the answer.
    let j = put(&tree("run1", 3), &[]).json();
    assert_eq!(
        (j["zero_rtt"].as_str(), j["early_files"].as_bool()),
        (Some("accepted"), Some(true)),
        "{j:#}"
    );
    assert_eq!(j["totals"]["verified"], 2, "{j:#}");
    same("run1");
    assert_eq!((count(EARLY), count(DROPPED)), (1, 0));

    // The same targets again: they are there, so it waits for the answer
    // (and its Wants skip what is there).
    let j = put(&t.join("src/run1"), &[]).json();
    assert_eq!(
        (j["zero_rtt"].as_str(), j["early_files"].as_bool()),
        (Some("accepted"), Some(false)),
        "{j:#}"
    );
    assert_eq!(j["totals"]["skipped"], 2, "{j:#}");
    assert_eq!((count(EARLY), count(DROPPED)), (1, 0));
    same("run1");

    // Targets put there by others: the early files are dropped unread, and
    // the put goes again, waiting for its Wants; the result is the same.
    std::fs::create_dir_all(root.join("in/run2/sub")).unwrap();
    std::fs::write(root.join("in/run2/sub/b.bin"), b"stale").unwrap();
    let out = put(&tree("run2", 5), &[]);
    let j = out.json();
    assert_eq!(j["early_files"], false, "{j:#}");
    assert!(out.stderr.contains("the put goes again"), "{}", out.stderr);
    assert_eq!(count(DROPPED), 1, "{}", srv.log_text());
    same("run2");

    // A restarted server refuses the ticket: the early files are lost with
    // the 0-RTT data, and the put goes again.
    srv.kill();
    let _srv = ServeCfg::new(&root, &t.join("state"))
        .writable()
        .port(port)
        .start();
    let out = put(&tree("run3", 7), &[]);
    assert!(
        out.stderr.contains("the server refused the ticket"),
        "{}",
        out.stderr
    );
    assert_eq!(out.json()["early_files"], false);
    same("run3");
}
