//! Names and messages from the far side are shown escaped (`\#ooo`, as
//! rsync does) on the terminal and in the server's log, and kept exact in
//! `--json`: a name cannot retitle or clear the user's terminal, nor forge
//! a line in a log.

use longhaul_testkit::*;
use std::ffi::OsString;

const FORGED: &str = "evil\n2026-01-01T00:00:00Z  INFO FORGED line";
const TERMINAL: &str = "\x1b]0;pwned\x07\x1b[2J";

#[test]
fn a_far_sides_controls_are_escaped_on_the_terminal_and_in_the_log() {
    let t = Tmp::new("names");
    let root = t.join("root");
    // The server holds, where the put's file would land, a directory of
    // the same name, which it cannot replace: the put fails on that name.
    std::fs::create_dir_all(root.join("dst").join(FORGED).join("keep")).unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let src = t.join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join(FORGED), b"x").unwrap();
    let out = c.run(
        "put",
        [
            OsString::from("--accept-new"),
            src.join(FORGED).into(),
            srv.remote("dst/"),
        ],
    );
    assert_ne!(out.code, 0, "{}", out.stderr);
    let log = srv.log_text();
    assert!(log.contains("evil\\#0122026-01-01"), "{log}");
    assert!(
        !log.lines().any(|l| l.starts_with("2026-01-01T00:00:00Z")),
        "a forged line in the log:\n{log}"
    );
    assert!(out.stderr.contains("evil\\#0122026"), "{}", out.stderr);

    // A get of a name that is a terminal's escape sequence: the server's
    // answer names it, the client shows it escaped...
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let out = c.run("get", [srv.remote(TERMINAL), dest.clone().into()]);
    out.expect_code(4);
    assert!(!out.stderr.contains('\x1b'), "{:?}", out.stderr);
    assert!(!out.stderr.contains('\x07'), "{:?}", out.stderr);
    assert!(
        out.stderr.contains("\\#033]0;pwned\\#007\\#033[2J"),
        "{}",
        out.stderr
    );
    // ...and exact in --json.
    let out = c.run(
        "get",
        [OsString::from("--json"), srv.remote(TERMINAL), dest.into()],
    );
    out.expect_code(4);
    let j = out.json();
    let m = j["problems"][0].to_string();
    assert!(m.contains("\\u001b]0;pwned\\u0007\\u001b[2J"), "{m}");
    let log = srv.log_text();
    assert!(!log.contains('\x07'), "{log:?}");
}
