//! The progress line as a user sees it on a terminal: `get` runs on a
//! pseudo-terminal of 80 (and 40) columns, as in tmux, and every line it
//! draws fits that width (none wraps) and counts in SI units.

use longhaul_testkit::*;
use nix::pty::{openpty, Winsize};
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Runs `cmd` with a pseudo-terminal of `cols` columns as its stdin, stdout
/// and stderr; returns its exit code and everything it wrote there.
fn on_terminal(mut cmd: std::process::Command, cols: u16) -> (i32, String) {
    let size = Winsize {
        ws_row: 24,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(Some(&size), None).expect("openpty");
    // Not inherited by what other tests spawn meanwhile (the reads below
    // end only when every holder of the other side has closed it).
    for fd in [&pty.master, &pty.slave] {
        // SAFETY: setting a flag on a descriptor we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup"));
    cmd.stdin(slave(&pty.slave))
        .stdout(slave(&pty.slave))
        .stderr(slave(&pty.slave));
    let mut child = cmd.spawn().expect("spawn longhaul");
    // Only the child may hold the terminal's other side now (the command
    // keeps its copies until dropped): the reads below end when it exits.
    drop(cmd);
    drop(pty.slave);
    let mut master = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // Reading the master ends in EIO once the child's side is closed.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    });
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code().unwrap_or(-1);
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("longhaul on a terminal did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = reader.join().expect("reader");
    (code, String::from_utf8_lossy(&out).into_owned())
}

/// The progress drawings among what a terminal was sent: escape sequences
/// taken out, each drawing being a segment that a carriage return ends (the
/// next drawing overwrites it), where messages end in a newline.
fn drawings(raw: &str) -> Vec<String> {
    let mut text = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then one final letter.
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        text.push(c);
    }
    // (The terminal sends a newline as a return and a newline.)
    text.replace("\r\n", "\n")
        .split('\n')
        .flat_map(|line| {
            let mut parts: Vec<&str> = line.split('\r').collect();
            parts.pop(); // what follows the last return is a message
            parts.into_iter().map(str::to_string).collect::<Vec<_>>()
        })
        .filter(|l| !l.trim().is_empty())
        .collect()
}

#[test]
fn the_progress_line_fits_the_terminal_and_counts_in_si_units() {
    let t = Tmp::new("progress-line");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("src")).unwrap();
    for i in 0..3 {
        gen_file(&root.join(format!("src/f{i}.bin")), i, 12_000_000);
    }
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    for cols in [80u16, 40] {
        let dest = t.join(format!("dest-{cols}"));
        std::fs::create_dir(&dest).unwrap();
        // 36 MB at 60 Mbit/s: about 5 s, some 25 drawings.
        let cmd = c.cmd(
            "get",
            [
                "--accept-new".into(),
                "--max-rate".into(),
                "60M".into(),
                srv.remote("src/"),
                dest.clone().into_os_string(),
            ],
        );
        let (code, raw) = on_terminal(cmd, cols);
        assert_eq!(code, 0, "get on a {cols}-column terminal:\n{raw}");
        for i in 0..3 {
            let f = format!("f{i}.bin");
            assert_eq!(
                hash_file(&dest.join(&f)),
                hash_file(&root.join("src").join(&f))
            );
        }
        assert!(
            !raw.contains("MiB") && !raw.contains("GiB") && !raw.contains("KiB"),
            "binary units on the terminal: {raw:?}"
        );
        let progress = drawings(&raw);
        assert!(
            progress.len() >= 5,
            "{cols} columns: only {} progress drawings in:\n{raw:?}",
            progress.len()
        );
        for l in &progress {
            // (indicatif pads a drawing with spaces to overwrite a longer
            // one before it; what is written must end inside the last
            // column, what is shown before it.)
            assert!(
                l.chars().count() <= cols as usize && l.trim_end().chars().count() < cols as usize,
                "{cols} columns: a line of {} would wrap: {l:?}",
                l.chars().count()
            );
        }
        // What each width keeps: at 80 the rate and the file count, at 40
        // still the bytes and the rate.
        let want: &[&str] = if cols == 80 {
            &["/36.0 MB", "Mbit/s", "files "]
        } else {
            &["/36.0 MB", "Mbit/s"]
        };
        for w in want {
            assert!(
                progress.iter().any(|l| l.contains(w)),
                "{cols} columns: no drawing shows {w:?}:\n{progress:#?}"
            );
        }
    }
}

/// `longhaul get --json ... | head -c 0`: the report's reader is gone
/// before the transfer ends. The files arrive and the exit code is the
/// transfer's, without a panic (a `println!` into the closed pipe panicked,
/// exit 101, a backtrace on stderr).
#[test]
fn a_report_into_a_closed_pipe_leaves_the_transfer_its_exit_code() {
    let t = Tmp::new("closed-pipe");
    let root = t.join("root");
    std::fs::create_dir_all(&root).unwrap();
    gen_file(&root.join("f.bin"), 9, 300_000);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    for json in [true, false] {
        let dest = t.join(format!("dest-{json}"));
        std::fs::create_dir(&dest).unwrap();
        let mut args = vec!["--accept-new".into()];
        if json {
            args.push("--json".into());
        }
        args.extend([srv.remote("f.bin"), dest.clone().into_os_string()]);
        let mut cmd = c.cmd("get", args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn longhaul");
        drop(child.stdout.take()); // the reader is gone before any report
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "json {json}: {err}");
        assert!(!err.contains("panicked"), "json {json}: {err}");
        assert_eq!(
            hash_file(&dest.join("f.bin")),
            hash_file(&root.join("f.bin"))
        );
    }
}
