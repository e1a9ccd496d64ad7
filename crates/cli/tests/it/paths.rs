//! Remote paths: missing ones are named in the error; anything that would leave the
//! served root (`..`, absolute, through a symlink) is refused, nothing is written
//! outside the destination, and the server goes on serving.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::os::unix::fs::symlink;

#[test]
fn missing_and_escaping_paths() {
    let t = Tmp::new("paths");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/ok.txt"), b"fine\n").unwrap();
    std::fs::create_dir(t.join("outside")).unwrap();
    std::fs::write(t.join("outside/secret"), b"secret\n").unwrap();
    symlink("/etc", root.join("etc-link")).unwrap();
    symlink("../outside", root.join("out-link")).unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let work = t.join("work");
    let dest = work.join("dest");
    std::fs::create_dir_all(&dest).unwrap();
    let etc_passwd = std::fs::read("/etc/passwd").unwrap();
    let get = |path: &str, json: bool| {
        let mut a: Vec<OsString> = vec!["--accept-new".into()];
        if json {
            a.push("--json".into());
        }
        a.push(srv.remote(path));
        a.push(dest.clone().into());
        c.run("get", a)
    };

    // A path that does not exist: exit 4, the message names it.
    let out = get("no/such/thing", false);
    out.expect_code(4);
    assert!(
        out.stderr
            .contains("error: at the source: no/such/thing: No such file or directory"),
        "{}",
        out.stderr
    );
    assert_eq!(
        out.stderr.matches("no/such/thing").count(),
        1,
        "{}",
        out.stderr
    );
    let out = get("no/such/thing", true);
    out.expect_code(4);
    let j = out.json();
    assert_eq!(j["ok"], false);
    assert_eq!(j["problems"][0]["kind"], "remote", "{j:#}");
    assert!(
        j["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("no/such/thing"),
        "{j:#}"
    );
    assert_eq!(totals(&j, "files"), 0);

    // Escapes by '..' and absolute paths: refused by the server, named precisely.
    for (path, says) in [
        ("../../etc/passwd", "'..' would leave the root"),
        ("sub/../../outside/secret", "'..' would leave the root"),
        ("out-link/../out-link/secret", "'..' would leave the root"),
        ("..", "'..' would leave the root"),
        ("/etc/passwd", "absolute path"),
        ("/", "absolute path"),
    ] {
        let out = get(path, false);
        out.expect_code(4);
        assert!(
            out.stderr.contains(says) && out.stderr.contains(path),
            "{path}: {}",
            out.stderr
        );
    }
    // Through symlinks that lead out of the root: refused (cap-std), not followed.
    for path in ["etc-link/passwd", "out-link/secret", "etc-link/./passwd"] {
        let out = get(path, false);
        assert_ne!(out.code, 0, "{path} must be refused: {out:?}");
        assert_eq!(out.code, 4, "{path}: {}", out.stderr);
    }
    // With a trailing slash ("the contents of") the link is not followed either;
    // the exit status is checked in `symlink_with_trailing_slash_is_a_remote_error`.
    for path in ["etc-link/", "out-link/"] {
        let out = get(path, false);
        assert_ne!(out.code, 0, "{path} must be refused: {out:?}");
    }
    assert!(srv.alive(), "the server survived:\n{}", srv.log_text());
    assert_eq!(
        list_tree(&work),
        vec![dest.clone()],
        "nothing was written, neither in DEST nor beside it"
    );
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), etc_passwd);

    // The links themselves may be fetched: as links.
    let out = get("etc-link", false);
    out.expect_code(0);
    assert_eq!(
        std::fs::read_link(dest.join("etc-link")).unwrap(),
        std::path::Path::new("/etc")
    );
    std::fs::remove_file(dest.join("etc-link")).unwrap();

    // put to an escaping destination is refused as well.
    let up = t.join("up.txt");
    std::fs::write(&up, b"up").unwrap();
    for rdest in [
        "../escaped.txt",
        "/tmp/longhaul-test-escaped.txt",
        "out-link/x.txt",
    ] {
        let out = c.run(
            "put",
            [up.clone().into(), srv.remote(rdest)] as [OsString; 2],
        );
        assert_ne!(out.code, 0, "put to {rdest}: {out:?}");
        assert_eq!(out.code, 4, "put to {rdest}: {}", out.stderr);
    }
    assert!(!t.join("escaped.txt").exists());
    assert!(!std::path::Path::new("/tmp/longhaul-test-escaped.txt").exists());
    assert!(!t.join("outside/x.txt").exists());
    assert!(!root.join("escaped.txt").exists());

    // And a normal get still works on the same server.
    let out = get("sub", true);
    out.expect_code(0);
    assert_eq!(std::fs::read(dest.join("sub/ok.txt")).unwrap(), b"fine\n");
    assert!(srv.alive());
    srv.kill();
}

/// `get srv:LINK/ DEST` asks for the contents of LINK (likewise `srv:FILE/`). The server rightly does not
/// follow the link, but the client then fails with exit 5 (local I/O) and
/// ".: the destination itself is not a file name": the refusal should be a remote
/// error (exit 4) that names the requested path, as for any other unusable path.
#[test]
fn symlink_with_trailing_slash_is_a_remote_error() {
    let t = Tmp::new("paths-slash");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("dir")).unwrap();
    std::fs::write(root.join("dir/f"), b"f").unwrap();
    symlink("dir", root.join("dir-link")).unwrap();
    symlink("/etc", root.join("etc-link")).unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir_all(&dest).unwrap();
    let mut wrong = Vec::new();
    for path in ["dir-link/", "etc-link/", "dir/f/"] {
        let out = c.run(
            "get",
            [
                OsString::from("--accept-new"),
                srv.remote(path),
                dest.clone().into(),
            ],
        );
        assert_ne!(out.code, 0, "{path}: {out:?}");
        assert_eq!(list_tree(&dest), Vec::<std::path::PathBuf>::new());
        if out.code != 4 || !out.stderr.contains(path.trim_end_matches('/')) {
            wrong.push(format!("{path}: exit {}, {}", out.code, out.stderr.trim()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_put_sends_what_it_can_when_one_local_path_is_missing() {
    // As a get does with a missing remote path: the rest still goes.
    let t = Tmp::new("put-missing");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("in")).unwrap();
    let h1 = t.join("h1");
    std::fs::write(&h1, b"here").unwrap();
    let nosuch = t.join("nosuch");
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let out = c.run(
        "put",
        [
            OsString::from("--accept-new"),
            "--json".into(),
            nosuch.clone().into(),
            h1.clone().into(),
            srv.remote("in/"),
        ],
    );
    out.expect_code(5);
    let j = out.json();
    assert_eq!(j["problems"][0]["kind"], "local_io", "{j:#}");
    assert_eq!(
        j["problems"][0]["path"],
        nosuch.display().to_string(),
        "{j:#}"
    );
    assert_eq!(totals(&j, "verified"), 1, "{j:#}");
    assert_eq!(std::fs::read(root.join("in/h1")).unwrap(), b"here");
    // Nothing to send at all: refused before connecting, the path named.
    let out = c.run("put", [OsString::from(nosuch.clone()), srv.remote("in/")]);
    out.expect_code(5);
    assert!(
        out.stderr.contains(&nosuch.display().to_string()),
        "{}",
        out.stderr
    );
}

#[test]
fn a_put_of_dir_dot_sends_the_contents_and_a_file_dot_is_refused() {
    // One rule for local paths (transfer::landing::local_root_name): `obs`
    // lands as obs, `obs/` and `obs/.` put its contents in.
    let t = Tmp::new("put-dot");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("in")).unwrap();
    let obs = t.join("obs");
    std::fs::create_dir_all(obs.join("sub")).unwrap();
    std::fs::write(obs.join("a.txt"), b"a").unwrap();
    std::fs::write(obs.join("sub/b.txt"), b"b").unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dot = OsString::from(format!("{}/.", obs.display()));
    let out = c.run(
        "put",
        [OsString::from("--accept-new"), dot, srv.remote("in/")],
    );
    out.expect_code(0);
    assert_eq!(std::fs::read(root.join("in/a.txt")).unwrap(), b"a");
    assert_eq!(std::fs::read(root.join("in/sub/b.txt")).unwrap(), b"b");
    assert!(!root.join("in/obs").exists(), "contents, not the directory");

    let out = c.run("put", [obs.clone().into_os_string(), srv.remote("in/")]);
    out.expect_code(0);
    assert_eq!(std::fs::read(root.join("in/obs/sub/b.txt")).unwrap(), b"b");

    // A file named as if it were a directory's contents.
    let file_dot = OsString::from(format!("{}/a.txt/.", obs.display()));
    let out = c.run("put", [file_dot, srv.remote("in/")]);
    out.expect_code(5);
    assert!(out.stderr.contains("a.txt"), "{}", out.stderr);
}

#[test]
fn names_that_are_not_utf8_can_be_given_on_the_command_line() {
    use std::os::unix::ffi::OsStrExt;
    let t = Tmp::new("non-utf8");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("in")).unwrap();
    let name = std::ffi::OsStr::from_bytes(b"bad\xffname");
    std::fs::write(root.join(name), b"latin-1 or worse").unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let out = c.run(
        "get",
        [
            OsString::from("--accept-new"),
            srv.remote(name),
            dest.clone().into(),
        ],
    );
    out.expect_code(0);
    assert_eq!(std::fs::read(dest.join(name)).unwrap(), b"latin-1 or worse");
    // And back, into a directory whose name is not UTF-8 either.
    let sub = std::ffi::OsStr::from_bytes(b"in/\xfe");
    std::fs::create_dir(root.join(sub)).unwrap();
    let mut remote = srv.remote(sub);
    remote.push("/");
    let out = c.run("put", [OsString::from(dest.join(name)), remote]);
    out.expect_code(0);
    assert_eq!(
        std::fs::read(root.join(sub).join(name)).unwrap(),
        b"latin-1 or worse"
    );
}
