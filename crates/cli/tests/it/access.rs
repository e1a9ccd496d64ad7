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
