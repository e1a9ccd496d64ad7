//! `get --ssh` and `put --ssh` through a real sshd on loopback (key-only, a
//! temporary configuration): an awkward tree both ways, relative and
//! absolute paths, no known-hosts file written, no server left running, a
//! resume after the client is killed; and UDP that does not get through,
//! said within seconds.

use crate::tree::{assert_secret_not_copied, tricky_tree};
use longhaul_testkit::*;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One test at a time: each checks that no `serve --once` is left.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// sshd on 127.0.0.1, stopped on drop.
struct Sshd {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Sshd {
    /// None (skip) where sshd cannot run: not root, or not installed.
    fn start(dir: &Path) -> Option<Sshd> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let sshd = Path::new("/usr/sbin/sshd");
        let keygen_ok = Command::new("ssh-keygen").arg("-?").output().is_ok();
        if !(root && sshd.exists() && keygen_ok) {
            if std::env::var_os("LONGHAUL_REQUIRE_LAB").is_some() {
                panic!("the ssh tests need root and openssh-server (.ci/run installs it)");
            }
            eprintln!("SKIP: the ssh tests need root and openssh-server");
            return None;
        }
        ssh::keys(dir);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = ssh::config(
            dir,
            &format!(
                "Port {port}\nListenAddress 127.0.0.1\nPidFile {}/sshd.pid\n",
                dir.display()
            ),
        );
        let child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("sshd.log")).unwrap())
            .spawn()
            .unwrap();
        let s = Sshd {
            child,
            dir: dir.to_path_buf(),
            port,
        };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "sshd did not listen: {}",
                std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(s)
    }

    /// The `--ssh-command` that logs in with the test's key.
    fn command(&self) -> String {
        format!("ssh -p {} {}", self.port, ssh::options(&self.dir))
    }

    /// The remote home (where relative paths start).
    fn home(&self) -> PathBuf {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("{} 127.0.0.1 pwd", self.command()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `target` relative to `from` (both absolute), with `..`.
fn relative(from: &Path, target: &Path) -> PathBuf {
    let mut p = PathBuf::new();
    for _ in from.components().skip(1) {
        p.push("..");
    }
    p.join(target.strip_prefix("/").unwrap())
}

/// `longhaul get|put --ssh-command ... --longhaul-path BIN ARGS`, with a
/// config and state home of its own (to see that nothing is written there).
fn over_ssh(sshd: &Sshd, home: &Path, op: &str, args: &[OsString]) -> Command {
    let mut c = longhaul();
    c.env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_STATE_HOME", home.join("state"))
        .arg(op)
        .arg("--ssh-command")
        .arg(sshd.command())
        .arg("--longhaul-path")
        .arg(bin())
        .args(args);
    c
}

/// Waits (up to 60 s) until `part` holds some data, then a moment more.
fn wait_for_part(part: &Path) {
    let t0 = Instant::now();
    while std::fs::metadata(part).map_or(0, |m| m.len()) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no {}",
            part.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
}

/// Waits (up to 10 s) until no `serve --once` runs.
fn assert_no_server_left() {
    let t0 = Instant::now();
    loop {
        let left = ssh::once_servers();
        if left.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "longhaul serve --once still running: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// This test's turn, its directory and an sshd (None: skip).
fn setup(tag: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Tmp, Sshd)> {
    let turn = turn();
    let t = Tmp::new(tag);
    let sshd = Sshd::start(&t.join("sshd"))?;
    Some((turn, t, sshd))
}

#[test]
fn get_and_put_over_ssh_copy_an_awkward_tree_and_leave_nothing_behind() {
    let Some((_turn, t, sshd)) = setup("ssh-tree") else {
        return;
    };
    let b = tricky_tree(t.path());
    let home = t.join("home");
    // A path relative to the remote home, through `..`: scp's rules.
    let rel = relative(&sshd.home(), &b.tree);
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let mut remote = OsString::from("127.0.0.1:");
    remote.push(&rel);
    let out = run_timeout(
        over_ssh(
            &sshd,
            &home,
            "get",
            &["--json".into(), remote, dest.clone().into()],
        ),
        Duration::from_secs(120),
    );
    out.expect_code(0);
    assert_same_tree(&b.tree, &dest.join("tree"), Compare::ALL);
    assert_secret_not_copied(&dest, &b.secret);
    assert_eq!(out.json()["ok"], true);
    assert_no_server_left();

    // A directory on the way that is an absolute link (~/data -> /scratch
    // as people have it): followed, as scp would. Over two connections (the
    // far side is asked for a worker each).
    let via = t.join("via-link");
    std::os::unix::fs::symlink(b.tree.parent().unwrap(), &via).unwrap();
    let dest3 = t.join("dest3");
    std::fs::create_dir(&dest3).unwrap();
    let mut remote = OsString::from("127.0.0.1:");
    remote.push(via.join("tree"));
    let two = ["--connections".into(), "2".into(), "--json".into()];
    let args: Vec<OsString> = two
        .into_iter()
        .chain([remote, dest3.clone().into()])
        .collect();
    let out = run_timeout(
        over_ssh(&sshd, &home, "get", &args),
        Duration::from_secs(120),
    );
    out.expect_code(0);
    assert_eq!(out.json()["connections"], 2);
    assert_same_tree(&b.tree, &dest3.join("tree"), Compare::ALL);
    assert_no_server_left();

    // put, to an absolute path, into a directory (trailing slash).
    let into = t.join("put-into");
    std::fs::create_dir(&into).unwrap();
    let mut remote = OsString::from("127.0.0.1:");
    remote.push(&into);
    remote.push("/");
    let out = run_timeout(
        over_ssh(&sshd, &home, "put", &[b.tree.clone().into(), remote]),
        Duration::from_secs(120),
    );
    out.expect_code(0);
    assert_same_tree(&b.tree, &into.join("tree"), Compare::ALL);
    assert_no_server_left();

    // Nothing to trust by hand and nothing remembered: no known-hosts file.
    assert!(
        !home.join("config/longhaul/known_hosts").exists(),
        "--ssh wrote a known-hosts file"
    );

    // The remote side's errors come back: a path that is not there.
    let out = run_timeout(
        over_ssh(
            &sshd,
            &home,
            "get",
            &["127.0.0.1:/no/such/path".into(), dest.clone().into()],
        ),
        Duration::from_secs(60),
    );
    out.expect_code(4);
    assert!(out.stderr.contains("No such file"), "{}", out.stderr);
    assert_no_server_left();

    // A remote longhaul that is not there: said, with the way out.
    let mut c = longhaul();
    c.args(["get", "--ssh-command", &sshd.command()])
        .arg("--longhaul-path")
        .arg("/no/such/longhaul")
        .arg("127.0.0.1:x")
        .arg(&dest);
    let out = run_timeout(c, Duration::from_secs(60));
    out.expect_code(3);
    assert!(out.stderr.contains("--longhaul-path"), "{}", out.stderr);
}

#[test]
fn a_get_over_ssh_killed_midway_resumes_and_its_server_exits() {
    let Some((_turn, t, sshd)) = setup("ssh-resume") else {
        return;
    };
    let src = t.join("src");
    std::fs::create_dir(&src).unwrap();
    gen_file(&src.join("big.bin"), 7, 64 * MIB);
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let home = t.join("home");
    let mut remote = OsString::from("127.0.0.1:");
    remote.push(&src);
    remote.push("/");
    // 100 Mbit/s: 5 s for the file; killed once its part file holds data
    // (the ssh login and the handshake before it may take a while here).
    let args: Vec<OsString> = vec![
        "--json".into(),
        "--max-rate".into(),
        "100M".into(),
        remote,
        dest.clone().into(),
    ];
    let mut c = over_ssh(&sshd, &home, "get", &args);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    wait_for_part(&dest.join(".big.bin.lh-part"));
    child.kill().unwrap();
    child.wait().unwrap();
    // ssh's end closed with the client: the remote server ends too.
    assert_no_server_left();
    assert!(
        !dest.join("big.bin").exists(),
        "the kill came before the end"
    );

    let out = run_timeout(
        over_ssh(&sshd, &home, "get", &args),
        Duration::from_secs(120),
    );
    out.expect_code(0);
    let j = out.json();
    assert!(totals(&j, "bytes_resumed") > 0, "nothing resumed: {j:#}");
    assert_eq!(
        hash_file(&dest.join("big.bin")),
        hash_file(&src.join("big.bin"))
    );
    assert_no_server_left();
}

#[test]
fn udp_that_does_not_get_through_is_said_within_seconds() {
    // An "ssh" that runs the remote command here but reports a port no one
    // listens on: as if a firewall dropped the UDP.
    let _turn = turn();
    let t = Tmp::new("ssh-noudp");
    let fake = t.join("fake-ssh");
    std::fs::write(
        &fake,
        "#!/bin/sh\nshift\nsh -c \"$1\" | sed -u 's/\"port\":[0-9]*/\"port\":9/'\n",
    )
    .unwrap();
    set_mode(&fake, 0o755);
    let src = t.join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let mut c = longhaul();
    c.args(["get", "--ssh-command"])
        .arg(&fake)
        .arg("--longhaul-path")
        .arg(bin())
        .arg(format!("127.0.0.1:{}", src.display()))
        .arg(t.join("dest"));
    let out = run_timeout(c, Duration::from_secs(60));
    out.expect_code(3);
    assert!(out.stderr.contains("no answer over UDP"), "{}", out.stderr);
    assert!(
        out.elapsed < Duration::from_secs(20),
        "took {:?}",
        out.elapsed
    );
    assert_no_server_left();
}

/// A one-shot server stopped with SIGTERM (or SIGHUP) closes and removes
/// its temporary key, as it does when its session or its ssh login ends.
#[test]
fn a_one_shot_server_stopped_by_a_signal_leaves_no_key_behind() {
    use std::io::BufRead;
    let t = Tmp::new("once-term");
    let tmp = t.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        let mut c = longhaul();
        c.args(["serve", "--once", "--listen", "127.0.0.1:0", "--root"])
            .arg(t.path())
            .env("TMPDIR", &tmp)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut hello = String::new();
        out.read_line(&mut hello).unwrap();
        assert!(hello.contains("\"fingerprint\""), "{hello}");
        assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 1, "its key");
        // SAFETY: a signal to our own child, by its PID.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait().unwrap();
        assert!(status.code().is_some(), "exited, not killed: {status:?}");
        assert_eq!(
            std::fs::read_dir(&tmp).unwrap().count(),
            0,
            "the temporary key is gone after signal {sig}"
        );
    }
}

#[test]
fn a_whole_tree_holds_as_rsync_sees_it_over_ssh_and_served_and_a_dry_run_writes_nothing() {
    let Some((_turn, t, sshd)) = setup("ssh-semantics") else {
        return;
    };
    let home = t.join("home");
    let src = t.join("src");
    // Special files, a hard link across directories, an excluded file,
    // owners, attributes and ACLs, and a sparse file.
    crate::specials::tree(&src);
    std::fs::create_dir_all(src.join("other")).unwrap();
    std::fs::hard_link(src.join("f.bin"), src.join("other/f-link")).unwrap();
    gen_file(&src.join("scratch.tmp"), 7, 100);
    crate::owners::tree(&src.join("owned"));
    // 4 GiB with three extents.
    let img = std::fs::File::create(src.join("disk.img")).unwrap();
    img.set_len(4 << 30).unwrap();
    for off in [0, 100 << 20, 3 << 30] {
        std::os::unix::fs::FileExt::write_all_at(&img, b"extent", off).unwrap();
    }
    drop(img);
    let meta_kept = crate::owners::getxattr(&src.join("owned/f1"), "user.origin").is_some();
    // The same over a served tree (a server that keeps owners, as root).
    let srv = ServeCfg::new(t.path(), &t.join("state"))
        .writable()
        .arg("--keep-owners")
        .start();
    let c = Client::new(t.join("known_hosts"));
    for (op, ssh) in [("get", true), ("put", true), ("get", false), ("put", false)] {
        let into = t.join(format!("into-{op}-{}", if ssh { "ssh" } else { "served" }));
        let dest = into.join("src");
        std::fs::create_dir_all(dest.join("sub")).unwrap();
        gen_file(&dest.join("stale"), 8, 10);
        gen_file(&dest.join("sub/keep.tmp"), 9, 10);
        let mut remote = match ssh {
            true => OsString::from("127.0.0.1:"),
            false => OsString::from(format!("127.0.0.1:{}:", srv.port)),
        };
        let mut args: Vec<OsString> = [
            "--json",
            "--specials",
            "--delete",
            "--exclude",
            "*.tmp",
            "--xattrs",
            "--acls",
        ]
        .map(OsString::from)
        .to_vec();
        if !ssh {
            args.push("--accept-new".into());
        }
        // (A put's server never makes device nodes.)
        let rsync_flags = match op {
            "get" => {
                args.push("--devices".into());
                match ssh {
                    true => remote.push(&src),
                    false => remote.push("src"),
                }
                vec!["-naiHDS"]
            }
            _ => {
                match ssh {
                    true => remote.push(&into),
                    false => remote.push(into.file_name().unwrap()),
                }
                remote.push("/");
                vec!["-naiHS", "--specials", "--no-devices"]
            }
        };
        let (from, to) = match op {
            "get" => (remote, into.clone().into()),
            _ => (src.clone().into(), remote),
        };
        let run = |dry: bool| {
            let mut a = args.clone();
            if dry {
                a.push("--dry-run".into());
            }
            a.extend([from.clone(), to.clone()]);
            let cmd = match ssh {
                true => over_ssh(&sshd, &home, op, &a),
                false => c.cmd(op, a),
            };
            let out = run_timeout(cmd, Duration::from_secs(120));
            out.expect_code(0);
            assert_no_server_left();
            out.json()
        };
        // A dry run: listed, nothing written.
        let j = run(true);
        let items: Vec<String> = j["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                format!(
                    "{} {}",
                    c["item"].as_str().unwrap(),
                    c["path"].as_str().unwrap()
                )
            })
            .collect();
        assert!(
            items
                .iter()
                .any(|i| i.ends_with("src/stale") && i.starts_with("*deleting")),
            "{op} {ssh}: {items:?}"
        );
        assert!(
            items
                .iter()
                .any(|i| i.ends_with("src/other/f-link") && i.starts_with("hf")),
            "{op}: {items:?}"
        );
        assert!(dest.join("stale").exists() && !dest.join("f.bin").exists());
        // The real run: rsync finds nothing to change, the excluded file
        // stayed, the stale one went.
        let j = run(false);
        assert_eq!(j["totals"]["deleted"], 1, "{j:#}");
        let mut a: Vec<OsString> = rsync_flags.iter().map(OsString::from).collect();
        // (As root, owners are kept both ways: over ssh, and by a server
        // with --keep-owners.)
        if meta_kept {
            a.push("-AX".into());
        }
        a.extend([
            "--numeric-ids".into(),
            "--delete".into(),
            "--exclude=*.tmp".into(),
            format!("{}/", src.display()).into(),
            format!("{}/", dest.display()).into(),
        ]);
        // (rsync says which device nodes it leaves out too.)
        let changes: Vec<String> = rsync(a)
            .lines()
            .filter(|l| !l.starts_with("skipping non-regular file"))
            .map(String::from)
            .collect();
        assert!(changes.is_empty(), "{op} {ssh}: {changes:?}");
        assert!(dest.join("sub/keep.tmp").exists() && !dest.join("stale").exists());
        let blocks =
            |p: &Path| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap());
        assert!(blocks(&dest.join("disk.img")) <= 2 * blocks(&src.join("disk.img")).max(8));
    }
}
