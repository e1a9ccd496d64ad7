//! Access control: a server token (file or LONGHAUL_TOKEN), and a read-only server.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::path::Path;

fn setup(label: &str) -> (Tmp, std::path::PathBuf) {
    let t = Tmp::new(label);
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("data.bin"), gen_bytes(1, 3 * MIB as usize + 5)).unwrap();
    (t, root)
}

fn get(c: &Client, srv: &Server, dest: &Path, extra: &[OsString], env_token: Option<&str>) -> Out {
    let mut args: Vec<OsString> = vec!["--fingerprint".into(), srv.fingerprint.clone().into()];
    args.extend(extra.iter().cloned());
    args.push(srv.remote("data.bin"));
    args.push(dest.into());
    let mut cmd = c.cmd("get", args);
    if let Some(tok) = env_token {
        cmd.env("LONGHAUL_TOKEN", tok);
    }
    run(cmd)
}

#[test]
fn token_is_required_and_checked() {
    let (t, root) = setup("token");
    let tok = t.join("server.token");
    std::fs::write(&tok, "s3cret-token\n").unwrap();
    let srv = ServeCfg::new(&root, &t.join("state"))
        .arg("--token-file")
        .arg(&tok)
        .start();
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();

    // No token.
    let out = get(&c, &srv, &dest, &[], None);
    out.expect_code(3);
    assert!(out.stderr.contains("access denied"), "{}", out.stderr);
    // A token file that is not there is a usage error, named.
    let missing = t.join("missing.token");
    let out = get(
        &c,
        &srv,
        &dest,
        &["--token-file".into(), missing.clone().into()],
        None,
    );
    out.expect_code(2);
    assert!(
        out.stderr
            .contains(&format!("reading the token file {}", missing.display())),
        "{}",
        out.stderr
    );
    // Logs on a pipe carry no colour codes.
    assert!(!srv.log_text().contains('\u{1b}'), "{}", srv.log_text());
    // Wrong token, by file and by environment; a prefix of the right one.
    let wrong = t.join("wrong.token");
    std::fs::write(&wrong, "s3cret-toke\n").unwrap();
    let out = get(
        &c,
        &srv,
        &dest,
        &["--token-file".into(), wrong.into()],
        None,
    );
    out.expect_code(3);
    assert!(out.stderr.contains("access denied"), "{}", out.stderr);
    let out = get(&c, &srv, &dest, &[], Some("s3cret-token-and-more"));
    out.expect_code(3);
    assert!(out.stderr.contains("access denied"), "{}", out.stderr);
    let out = get(&c, &srv, &dest, &["--json".into()], Some("nope"));
    out.expect_code(3);
    let j = out.json();
    assert_eq!(j["ok"], false);
    assert_eq!(j["problems"][0]["kind"], "connection");
    // The shape of every report, for scripts.
    assert_eq!(
        (&j["op"], &j["interrupted"]),
        (&"get".into(), &false.into())
    );
    assert_eq!(j["files"].as_array().map(Vec::len), Some(0), "{j:#}");
    assert_eq!(j["totals"]["bytes_transferred"], 0, "{j:#}");
    assert!(j["problems"][0]["message"]
        .as_str()
        .unwrap()
        .contains("access denied"));
    assert_eq!(
        std::fs::read_dir(&dest).unwrap().count(),
        0,
        "nothing written when access is denied"
    );

    // The right token from LONGHAUL_TOKEN.
    let out = get(&c, &srv, &dest, &["--quiet".into()], Some("s3cret-token"));
    out.expect_code(0);
    assert_same_tree(&root.join("data.bin"), &dest.join("data.bin"), Compare::ALL);

    // The right token from --token-file (its trailing newline ignored, as the server's).
    std::fs::remove_file(dest.join("data.bin")).unwrap();
    let good = t.join("good.token");
    std::fs::write(&good, "s3cret-token\n").unwrap();
    let out = get(
        &c,
        &srv,
        &dest,
        &["--quiet".into(), "--token-file".into(), good.clone().into()],
        None,
    );
    out.expect_code(0);
    assert_same_tree(&root.join("data.bin"), &dest.join("data.bin"), Compare::ALL);

    // put needs it as well.
    let up = t.join("up.bin");
    std::fs::write(&up, b"uploaded").unwrap();
    let out = c.run(
        "put",
        [up.clone().into(), srv.remote("up.bin")] as [OsString; 2],
    );
    out.expect_code(3);
    assert!(out.stderr.contains("access denied"), "{}", out.stderr);
    assert!(!root.join("up.bin").exists());
    let out = c.run(
        "put",
        [
            OsString::from("--token-file"),
            good.into(),
            up.clone().into(),
            srv.remote("up.bin"),
        ],
    );
    out.expect_code(0);
    assert_eq!(std::fs::read(root.join("up.bin")).unwrap(), b"uploaded");
    // The server logged the refusals and kept serving.
    assert!(
        srv.log_text().contains("access denied"),
        "{}",
        srv.log_text()
    );
}

#[test]
fn read_only_server_refuses_put() {
    let (t, root) = setup("readonly");
    let srv = ServeCfg::new(&root, &t.join("state"))
        .arg("--read-only")
        .start();
    let c = Client::new(t.join("kh"));
    let up = t.join("up");
    std::fs::create_dir(&up).unwrap();
    std::fs::write(up.join("a.txt"), b"a").unwrap();
    let before = list_tree(&root);

    let out = c.run(
        "put",
        [
            OsString::from("--accept-new"),
            up.clone().into(),
            srv.remote("incoming/"),
        ],
    );
    out.expect_code(4);
    assert!(out.stderr.contains("read-only"), "{}", out.stderr);
    let out = c.run(
        "put",
        [OsString::from("--json"), up.clone().into(), srv.remote("")],
    );
    out.expect_code(4);
    let j = out.json();
    assert_eq!(j["ok"], false);
    assert_eq!(j["problems"][0]["kind"], "remote");
    assert!(j["problems"][0]["message"]
        .as_str()
        .unwrap()
        .contains("read-only"));
    assert_eq!(
        list_tree(&root),
        before,
        "nothing written on a read-only server"
    );

    // get still works.
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let out = c.run(
        "get",
        [
            OsString::from("--quiet"),
            srv.remote("data.bin"),
            dest.clone().into(),
        ],
    );
    out.expect_code(0);
    assert_same_tree(&root.join("data.bin"), &dest.join("data.bin"), Compare::ALL);
}

#[test]
fn wrong_tokens_slow_the_guesser_down_and_new_token_writes_a_strong_one() {
    let (t, root) = setup("guess");
    // serve --new-token: 64 hex digits, owner-only, never over a file.
    let tok = t.join("strong.token");
    let out = run({
        let mut c = longhaul();
        c.args(["serve", "--new-token"]).arg(&tok);
        c
    });
    out.expect_code(0);
    let text = std::fs::read_to_string(&tok).unwrap();
    assert_eq!(text.len(), 65, "{text:?}");
    assert!(
        text.trim_end().bytes().all(|b| b.is_ascii_hexdigit()),
        "{text:?}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&tok).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let again = run({
        let mut c = longhaul();
        c.args(["serve", "--new-token"]).arg(&tok);
        c
    });
    again.expect_code(2);
    assert!(again.stderr.contains("exists"), "{}", again.stderr);
    assert_eq!(std::fs::read_to_string(&tok).unwrap(), text, "untouched");

    // A short token draws a warning.
    let short = t.join("short.token");
    std::fs::write(&short, "pw\n").unwrap();
    let srv = ServeCfg::new(&root, &t.join("state"))
        .arg("--token-file")
        .arg(&short)
        .start();
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    // Five wrong tokens are free; the sixth earns a second of refusal, in
    // which even the right token is turned away unread.
    for i in 0..6 {
        let out = get(&c, &srv, &dest, &[], Some("guess"));
        out.expect_code(3);
        assert!(
            out.stderr.contains("wrong or missing token"),
            "try {i}: {}",
            out.stderr
        );
    }
    let out = get(&c, &srv, &dest, &["--quiet".into()], Some("pw"));
    out.expect_code(3);
    assert!(
        out.stderr.contains("too many wrong tokens"),
        "{}",
        out.stderr
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let out = get(&c, &srv, &dest, &["--quiet".into()], Some("pw"));
    out.expect_code(0);
    let log = srv.log_text();
    assert!(log.contains("the token is only 2 bytes"), "{log}");
    assert!(
        log.contains("6 wrong tokens in a row: refused for 1 s"),
        "{log}"
    );
}

#[test]
fn a_server_at_its_max_sessions_refuses_more_with_a_clear_error() {
    let (t, root) = setup("busy");
    let srv = ServeCfg::new(&root, &t.join("state"))
        .arg("--max-sessions")
        .arg("1")
        .start();
    let c = Client::new(t.join("kh"));
    let (d1, d2) = (t.join("d1"), t.join("d2"));
    std::fs::create_dir(&d1).unwrap();
    std::fs::create_dir(&d2).unwrap();
    // 3 MiB at 8 Mbit/s: the first get runs for about 3 s.
    let slow: [OsString; 2] = ["--max-rate".into(), "8M".into()];
    let first = {
        let mut cmd = c.cmd(
            "get",
            [
                OsString::from("--fingerprint"),
                srv.fingerprint.clone().into(),
                slow[0].clone(),
                slow[1].clone(),
                srv.remote("data.bin"),
                d1.clone().into(),
            ],
        );
        cmd.stdout(std::process::Stdio::null());
        cmd.stderr(std::process::Stdio::null());
        cmd.spawn().unwrap()
    };
    std::thread::sleep(std::time::Duration::from_millis(800));
    let out = get(&c, &srv, &d2, &[], None);
    out.expect_code(3);
    assert!(out.stderr.contains("the server is busy"), "{}", out.stderr);
    assert!(out.stderr.contains("--max-sessions"), "{}", out.stderr);
    let mut first = first;
    assert_eq!(
        first.wait().unwrap().code(),
        Some(0),
        "the first get completes"
    );
    let out = get(&c, &srv, &d2, &["--quiet".into()], None);
    out.expect_code(0);
    assert_same_tree(&root.join("data.bin"), &d2.join("data.bin"), Compare::ALL);
    let log = srv.log_text();
    assert!(
        log.contains("refused: already serving 1 session(s)"),
        "{log}"
    );
}

#[test]
fn serve_refuses_zero_streams_as_a_usage_error() {
    let t = Tmp::new("serve-streams");
    let mut cmd = longhaul();
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--streams",
        "0",
        "--root",
    ])
    .arg(t.path())
    .arg("--state-dir")
    .arg(t.join("state"));
    let out = run_timeout(cmd, std::time::Duration::from_secs(10));
    out.expect_code(2);
    assert!(
        out.stderr.contains("--streams must be at least 1"),
        "{}",
        out.stderr
    );
}

/// `put` of `up.bin` (content `body`) to `srv:name` with `extra`; the outcome.
fn put(c: &Client, srv: &Server, src: &Path, name: &str, extra: &[&str]) -> Out {
    let mut args: Vec<OsString> = vec!["--fingerprint".into(), srv.fingerprint.clone().into()];
    args.extend(extra.iter().map(OsString::from));
    args.push(src.into());
    args.push(srv.remote(name));
    run(c.cmd("put", args))
}

/// Without a token a server is read-only: a stranger's put is refused with
/// exit 3 and says what to do; `--allow-anonymous-put` lets it land.
#[test]
fn a_server_without_a_token_is_read_only_unless_told_otherwise() {
    let (t, root) = setup("anon");
    let up = t.join("up.bin");
    std::fs::write(&up, b"from a stranger").unwrap();
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let before = list_tree(&root);
    let out = put(&c, &srv, &up, "evil.bin", &[]);
    out.expect_code(3);
    assert!(
        out.stderr.contains(
            "the server is read-only for clients without a token (start it with --token-file"
        ),
        "{}",
        out.stderr
    );
    let out = put(&c, &srv, &up, "evil.bin", &["--json"]);
    out.expect_code(3);
    assert_eq!(out.json()["problems"][0]["kind"], "connection");
    assert_eq!(list_tree(&root), before, "nothing written");
    assert!(srv.log_text().contains("put refused"), "{}", srv.log_text());
    // Reading is open to all.
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    get(&c, &srv, &dest, &["--quiet".into()], None).expect_code(0);
    assert_same_tree(&root.join("data.bin"), &dest.join("data.bin"), Compare::ALL);
    srv.kill();

    let srv = Server::start_writable(&root, &t.join("state"));
    let out = put(&c, &srv, &up, "ok.bin", &["--quiet"]);
    out.expect_code(0);
    assert_eq!(
        std::fs::read(root.join("ok.bin")).unwrap(),
        b"from a stranger"
    );
    let log = srv.log_text();
    assert!(log.contains("--allow-anonymous-put: anyone"), "{log}");
    assert!(log.contains("put without a token"), "{log}");
}

/// A read token may get and not put; the read-and-write token may do both;
/// no token, or a wrong one, neither; wrong ones are throttled as ever.
#[test]
fn a_read_token_reads_and_a_write_token_writes() {
    let (t, root) = setup("roles");
    let (rw, ro) = (t.join("rw.token"), t.join("ro.token"));
    std::fs::write(&rw, "read-and-write-token-0123456789\n").unwrap();
    std::fs::write(&ro, "read-only-token-0123456789abcdef\n").unwrap();
    let srv = ServeCfg::new(&root, &t.join("state"))
        .arg("--token-file")
        .arg(&rw)
        .arg("--read-token-file")
        .arg(&ro)
        .start();
    let c = Client::new(t.join("kh"));
    let up = t.join("up.bin");
    std::fs::write(&up, b"uploaded").unwrap();
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let tf = |f: &Path| vec!["--token-file".to_string(), f.to_str().unwrap().to_string()];
    let ro_args = tf(&ro);
    let ro_args: Vec<&str> = ro_args.iter().map(String::as_str).collect();
    let rw_args = tf(&rw);
    let rw_args: Vec<&str> = rw_args.iter().map(String::as_str).collect();

    // No token: neither.
    get(&c, &srv, &dest, &[], None).expect_code(3);
    put(&c, &srv, &up, "x.bin", &[]).expect_code(3);
    // The read token: get, not put (over several connections too).
    let ro_os: Vec<OsString> = ro_args.iter().map(OsString::from).collect();
    get(&c, &srv, &dest, &ro_os, None).expect_code(0);
    assert_same_tree(&root.join("data.bin"), &dest.join("data.bin"), Compare::ALL);
    for more in [&[][..], &["--connections", "2"][..]] {
        let args: Vec<&str> = ro_args.iter().chain(more).copied().collect();
        let out = put(&c, &srv, &up, "x.bin", &args);
        out.expect_code(3);
        assert!(
            out.stderr.contains("this token may only read"),
            "{}",
            out.stderr
        );
    }
    assert!(!root.join("x.bin").exists());
    // The read-and-write token: both.
    std::fs::remove_file(dest.join("data.bin")).unwrap();
    let rw_os: Vec<OsString> = rw_args.iter().map(OsString::from).collect();
    get(&c, &srv, &dest, &rw_os, None).expect_code(0);
    let args: Vec<&str> = rw_args
        .iter()
        .copied()
        .chain(["--connections", "2"])
        .collect();
    put(&c, &srv, &up, "x.bin", &args).expect_code(0);
    assert_eq!(std::fs::read(root.join("x.bin")).unwrap(), b"uploaded");
    // Wrong tokens are still counted and refused.
    for _ in 0..6 {
        get(&c, &srv, &dest, &[], Some("guess")).expect_code(3);
    }
    let out = get(&c, &srv, &dest, &ro_os, None);
    out.expect_code(3);
    assert!(
        out.stderr.contains("too many wrong tokens"),
        "{}",
        out.stderr
    );

    // The same token for both roles, or anonymous puts beside a token, is a
    // usage error.
    for extra in [
        vec!["--token-file", rw_args[1], "--read-token-file", rw_args[1]],
        vec!["--token-file", rw_args[1], "--allow-anonymous-put"],
        vec!["--read-token-file", ro_args[1], "--allow-anonymous-put"],
        vec!["--read-only", "--allow-anonymous-put"],
    ] {
        let mut cmd = longhaul();
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--root"])
            .arg(&root)
            .arg("--state-dir")
            .arg(t.join("state"))
            .args(&extra);
        run_timeout(cmd, std::time::Duration::from_secs(10)).expect_code(2);
    }
}

/// The banner says who may read and write, and every address the server
/// is reachable at.
#[test]
fn the_banner_says_who_may_read_and_write_and_where() {
    use std::io::BufRead;
    let (t, root) = setup("banner");
    let tok = t.join("t");
    std::fs::write(&tok, "a-token-long-enough-to-be-fine\n").unwrap();
    let cases: [(&[&str], &str, &[&str]); 4] = [
        (
            &[],
            "0.0.0.0:0",
            &[
                "read-only: no token",
                "anyone who can reach UDP",
                "nobody can write",
            ],
        ),
        (
            &["--allow-anonymous-put"],
            "127.0.0.1:0",
            &["WARNING", "--allow-anonymous-put", "can write into"],
        ),
        (
            &["--token-file", tok.to_str().unwrap()],
            "127.0.0.1:0",
            &[
                "token required",
                "holders of the --token-file token",
                "write too",
            ],
        ),
        (
            &["--read-token-file", tok.to_str().unwrap()],
            "127.0.0.1:0",
            &["read-only, token required", "nobody can write"],
        ),
    ];
    for (extra, listen, words) in cases {
        let mut cmd = longhaul();
        cmd.args(["serve", "--listen", listen, "--root"])
            .arg(&root)
            .arg("--state-dir")
            .arg(t.join("state"))
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let lines: Vec<String> = (0..4)
            .map(|_| {
                let mut l = String::new();
                out.read_line(&mut l).unwrap();
                l
            })
            .collect();
        child.kill().unwrap();
        child.wait().unwrap();
        let text = lines.concat();
        assert!(lines[1].starts_with("fingerprint SHA256:"), "{text}");
        for w in words {
            assert!(text.contains(w), "{extra:?}: no {w:?} in\n{text}");
        }
        let port = lines[0]
            .split("listening on ")
            .nth(1)
            .and_then(|a| a.split(',').next())
            .and_then(|a| a.rsplit(':').next())
            .unwrap()
            .to_string();
        assert!(
            lines[3].starts_with("reachable at ")
                && lines[3].contains(&format!("127.0.0.1:{port}")),
            "{text}"
        );
        if listen.starts_with("0.0.0.0") {
            assert!(lines[0].contains(&format!("0.0.0.0:{port}")), "{text}");
        }
    }
}
