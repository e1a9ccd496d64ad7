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
