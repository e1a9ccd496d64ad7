//! `longhaul multicast send / receive` end to end on loopback (unicast fan-out:
//! multicast itself is tested in the lab, where it cannot leak out of the machine).
//! Trees must arrive identical, names, modes, mtimes and links included; a wrong
//! key or a receiver outside a closed group must fail precisely and leave nothing.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn tree(base: &Path) -> PathBuf {
    let t = base.join("products");
    let files: Vec<(PathBuf, Vec<u8>)> = vec![
        (t.join("with space.txt"), b"spaces".to_vec()),
        (
            t.join("\u{fc}n\u{ef}c\u{f8}d\u{e9} \u{1f600}"),
            b"unicode".to_vec(),
        ),
        (
            t.join(std::ffi::OsStr::from_bytes(b"new\nline")),
            b"nl".to_vec(),
        ),
        (t.join("-leading-dash"), b"--help".to_vec()),
        (t.join("empty"), Vec::new()),
        (t.join("one"), b"1".to_vec()),
        (t.join("big.bin"), gen_bytes(1, 3 * MIB as usize + 12345)),
        (t.join("ro-dir/inside"), b"in a 0555 dir".to_vec()),
        (t.join("a/b/c/deep.txt"), b"deep".to_vec()),
    ];
    for (p, d) in &files {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, d).unwrap();
    }
    for i in 0..300 {
        std::fs::create_dir_all(t.join("small")).unwrap();
        std::fs::write(
            t.join(format!("small/f{i:04}")),
            gen_bytes(100 + i, 1000 + i as usize * 37),
        )
        .unwrap();
    }
    std::fs::create_dir_all(t.join("empty-dir")).unwrap();
    // Another name of big.bin, in another directory: its bytes go once.
    std::fs::hard_link(t.join("big.bin"), t.join("a/b/big-again.bin")).unwrap();
    symlink("one", t.join("link-rel")).unwrap();
    symlink("/etc/passwd", t.join("link-abs")).unwrap();
    let mut ns = 1_600_000_000_123_456_789i64;
    for p in list_tree(&t).iter().rev() {
        set_mtime_ns(p, ns);
        ns += 1_000_000_007;
    }
    set_mode(&t.join("one"), 0o600);
    set_mode(&t.join("big.bin"), 0o640);
    set_mode(&t.join("ro-dir"), 0o555);
    set_mode(&t.join("empty-dir"), 0o751);
    set_mtime_ns(&t, 1_500_000_000_987_654_321);
    t
}

fn receiver(port: u16, dest: &Path, id: &str, extra: &[&str]) -> Child {
    receiver_cmd(port, dest, id, extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("receiver")
}

fn receiver_cmd(port: u16, dest: &Path, id: &str, extra: &[&str]) -> Command {
    let mut c = longhaul();
    c.args([
        "multicast",
        "receive",
        "--once",
        "--idle-timeout",
        "5s",
        "--listen",
    ])
    .arg(format!("127.0.0.1:{port}"))
    .arg("--dest")
    .arg(dest)
    .arg("--state-dir")
    .arg(dest.with_extension("state"))
    .args(["--id", id])
    .args(extra)
    .stdin(Stdio::null());
    c
}

fn wait(c: Child) -> Out {
    let o = c.wait_with_output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        elapsed: Duration::ZERO,
    }
}

fn sender(ports: &[u16], args: &[&str], paths: &[&Path]) -> Command {
    let mut c = longhaul();
    let to: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    c.args([
        "multicast",
        "send",
        "--json",
        "--rate",
        "200M",
        "--to",
        &to.join(","),
    ])
    .args(args)
    .args(paths);
    c
}

#[test]
fn a_tree_reaches_two_receivers_identically() {
    let tmp = Tmp::new("mc-tree");
    let src = tree(tmp.path());
    let (d1, d2) = (tmp.join("d1"), tmp.join("d2"));
    let r1 = receiver(47311, &d1, "site-1", &["--accept-any-sender"]);
    let r2 = receiver(47312, &d2, "site-2", &["--accept-any-sender"]);
    std::thread::sleep(Duration::from_millis(300));
    let out = run_timeout(
        sender(&[47311, 47312], &["--receivers", "site-1,site-2"], &[&src]),
        Duration::from_secs(60),
    );
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["ok"], true);
    assert_eq!(j["receivers"].as_array().unwrap().len(), 2);
    for r in j["receivers"].as_array().unwrap() {
        assert_eq!(r["state"], "completed", "{r}");
    }
    for (r, d) in [(r1, &d1), (r2, &d2)] {
        let o = wait(r);
        o.expect_code(0);
        assert!(o.stderr.contains(": ok,"), "{}", o.stderr);
        assert_same_tree(&src, &d.join("products"), Compare::ALL);
        // The two names of big.bin are one file there too.
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        assert_eq!(
            ino(&d.join("products/big.bin")),
            ino(&d.join("products/a/b/big-again.bin"))
        );
        // Nothing but the tree: no part files left behind.
        let names: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("products")]);
    }
}

#[test]
fn contents_of_a_directory_with_a_trailing_slash_and_a_key() {
    let tmp = Tmp::new("mc-key");
    let src = tree(tmp.path());
    // A setuid file arrives without its setuid bit.
    std::fs::write(src.join("tool"), b"#!/bin/sh\n").unwrap();
    set_mode(&src.join("tool"), 0o4755);
    let key = tmp.join("k");
    std::fs::write(&key, gen_bytes(7, 32)).unwrap();
    let d = tmp.join("d");
    let k = key.to_str().unwrap();
    let r = receiver(47321, &d, "rx", &["--key-file", k]);
    std::thread::sleep(Duration::from_millis(300));
    let mut slash = src.clone().into_os_string();
    slash.push("/");
    let out = run_timeout(
        sender(
            &[47321],
            &["--open", "--announce-window", "1s", "--key-file", k],
            &[Path::new(&slash)],
        ),
        Duration::from_secs(60),
    );
    out.expect_code(0);
    wait(r).expect_code(0);
    assert_same_tree(&src, &d, Compare::CONTENT);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(d.join("tool"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755);
}

#[test]
fn a_wrong_key_or_a_stranger_gets_nothing() {
    let tmp = Tmp::new("mc-wrong");
    let src = tree(tmp.path());
    let (k1, k2) = (tmp.join("k1"), tmp.join("k2"));
    std::fs::write(&k1, gen_bytes(1, 32)).unwrap();
    std::fs::write(&k2, gen_bytes(2, 32)).unwrap();
    let (d1, d2) = (tmp.join("d1"), tmp.join("d2"));
    // Receiver 1 holds another key; receiver 2 is not in the closed group.
    let mut r1 = receiver(47331, &d1, "site-1", &["--key-file", k2.to_str().unwrap()]);
    let r2 = receiver(
        47332,
        &d2,
        "stranger",
        &["--key-file", k1.to_str().unwrap()],
    );
    std::thread::sleep(Duration::from_millis(300));
    let out = run_timeout(
        sender(
            &[47331, 47332],
            &[
                "--receivers",
                "site-1",
                "--announce-window",
                "1s",
                "--key-file",
                k1.to_str().unwrap(),
            ],
            &[&src],
        ),
        Duration::from_secs(60),
    );
    out.expect_code(4);
    let j = out.json();
    assert_eq!(j["ok"], false);
    let site1 = &j["receivers"][0];
    assert_eq!(site1["name"], "site-1");
    assert_eq!(site1["state"], "given up");
    assert_eq!(site1["reason"], "never registered");
    // Receiver 1 never opened a session (every datagram failed to authenticate):
    // it is still waiting for one.
    assert!(r1.try_wait().unwrap().is_none(), "receiver 1 exited");
    r1.kill().unwrap();
    let o1 = wait(r1);
    assert!(!o1.stderr.contains("session"), "{}", o1.stderr);
    let o2 = wait(r2);
    o2.expect_code(3);
    assert!(
        o2.stderr.contains("not in its closed group"),
        "{}",
        o2.stderr
    );
    for d in [&d1, &d2] {
        assert_eq!(
            std::fs::read_dir(d).unwrap().count(),
            0,
            "{} is not empty",
            d.display()
        );
    }
}

/// A receiver without a key takes no unsealed session unless told so: the
/// session is refused (said once, nothing written) and the receiver waits on.
#[test]
fn a_keyless_receiver_refuses_a_strangers_session() {
    let tmp = Tmp::new("mc-keyless");
    let src = tree(tmp.path());
    let d = tmp.join("d");
    let mut r = receiver(47351, &d, "site-1", &[]);
    std::thread::sleep(Duration::from_millis(300));
    let out = run_timeout(
        sender(
            &[47351],
            &["--receivers", "site-1", "--announce-window", "1s"],
            &[&src],
        ),
        Duration::from_secs(60),
    );
    out.expect_code(4);
    assert_eq!(out.json()["receivers"][0]["reason"], "never registered");
    // Still waiting for a session it may take (--once).
    assert!(r.try_wait().unwrap().is_none(), "the receiver exited");
    r.kill().unwrap();
    let o = wait(r);
    assert!(o.stderr.contains("REFUSING every sender"), "{}", o.stderr);
    assert_eq!(
        o.stderr.matches("refused: not sealed").count(),
        1,
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("--accept-any-sender"), "{}", o.stderr);
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "nothing written");
    // The flag conflicts with a key.
    let o = run(receiver_cmd(
        47352,
        &d,
        "site-1",
        &["--accept-any-sender", "--key-file", "/dev/null"],
    ));
    o.expect_code(2);
}

#[test]
fn usage_errors_are_precise() {
    let tmp = Tmp::new("mc-usage");
    let p = tmp.path();
    let o = run(sender(&[47341], &[], &[p]));
    o.expect_code(2);
    assert!(
        o.stderr.contains("--receivers") && o.stderr.contains("--open"),
        "{}",
        o.stderr
    );
    let mut c = longhaul();
    c.args([
        "multicast",
        "send",
        "--group",
        "10.0.0.1:7000",
        "--rate",
        "1M",
        "--open",
    ])
    .arg(p);
    let o = run(c);
    o.expect_code(2);
    assert!(o.stderr.contains("not a multicast address"), "{}", o.stderr);
    let o = run(sender(&[47341], &["--open", "--rate", "fast"], &[p]));
    o.expect_code(2);
    let short = tmp.join("short.key");
    std::fs::write(&short, b"tiny").unwrap();
    let o = run(sender(
        &[47341],
        &["--open", "--key-file", short.to_str().unwrap()],
        &[p],
    ));
    assert!(o.stderr.contains("at least 16 bytes"), "{}", o.stderr);
    assert_ne!(o.code, 0);
}

/// The rest of a tree as `rsync -aHAXS` keeps it: a sparse file crosses as
/// its data alone and arrives with its holes, and as root a receiver with
/// `--keep-owners` gives every item the owner sent, with the attributes
/// and ACLs the sender's `-X -A` carried.
#[test]
fn holes_owners_attributes_and_acls_arrive_as_rsync_sees_them() {
    let tmp = Tmp::new("mc-meta");
    let src = tmp.join("src");
    std::fs::create_dir_all(&src).unwrap();
    // 1 GiB with three extents of 6 bytes.
    let img = std::fs::File::create(src.join("disk.img")).unwrap();
    img.set_len(1 << 30).unwrap();
    for off in [0, 100 << 20, 900 << 20] {
        std::os::unix::fs::FileExt::write_all_at(&img, b"extent", off).unwrap();
    }
    drop(img);
    gen_file(&src.join("dense.bin"), 3, 200_000);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        crate::owners::tree(&src.join("owned"));
    }
    let meta = root && crate::owners::getxattr(&src.join("owned/f1"), "user.origin").is_some();
    let dest = tmp.join("dest");
    let r = receiver(
        47351,
        &dest,
        "site-1",
        &["--accept-any-sender", "--keep-owners", "--json"],
    );
    std::thread::sleep(Duration::from_millis(300));
    let out = run_timeout(
        sender(&[47351], &["--receivers", "site-1", "-X", "-A"], &[&src]),
        Duration::from_secs(60),
    );
    out.expect_code(0);
    let j = out.json();
    // Only the data crosses: the extents (a file-system block or a few
    // each) and the dense files, nothing of the holes.
    let sent = j["bytes"].as_u64().unwrap();
    let dense = 200_000 + if root { 5000 + (3 << 20) } else { 0 };
    assert!(
        sent >= dense + 3 * 6 && sent <= dense + 3 * (1 << 20),
        "{sent} bytes in the data object, {dense} of dense files"
    );
    let o = wait(r);
    o.expect_code(0);
    let ended: serde_json::Value = o
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["event"] == "ended")
        .expect("an ended event");
    assert_eq!(ended["ok"], true, "{ended}");
    assert_eq!(ended["attrs_not_kept"], 0, "{ended}");
    let got = dest.join("src");
    assert_same_tree(&src, &got, Compare::ALL);
    let blocks = |p: &Path| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap());
    assert!(
        blocks(&got.join("disk.img")) <= 2 * blocks(&src.join("disk.img")).max(8),
        "{} blocks at the receiver",
        blocks(&got.join("disk.img"))
    );
    // rsync finds nothing to change: sizes, holes, owners as root, and
    // the attributes and ACLs where the file system keeps them.
    let mut a = vec![OsString::from("-naiHS"), "--numeric-ids".into()];
    if meta {
        a.push("-AX".into());
    }
    a.extend([
        format!("{}/", src.display()).into(),
        format!("{}/", got.display()).into(),
    ]);
    let changes = rsync(a);
    assert!(changes.is_empty(), "rsync would change: {changes}");
    if root && !meta {
        eprintln!("SKIP (part): this file system keeps no extended attributes");
    }
}

/// Lines of JSON events on `out` whose "event" is `kind`.
fn events(out: &str, kind: &str) -> Vec<serde_json::Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == kind)
        .collect()
}

/// A channel receiver (no --once: it runs until stopped).
fn channel_receiver(port: u16, dest: &Path, id: &str, extra: &[&str]) -> Child {
    longhaul()
        .args(["multicast", "receive", "--json", "--accept-any-sender"])
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--dest")
        .arg(dest)
        .arg("--state-dir")
        .arg(dest.with_extension("state"))
        .args(["--id", id])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("receiver")
}

/// Stop a process as Ctrl-C would, and take what it printed.
fn interrupt(c: Child) -> Out {
    // SAFETY: a signal to a child this test started.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    wait(c)
}

/// `send --follow`: a channel. Files written into the spool (closed after
/// writing, renamed in, in a directory made later) reach the receivers as
/// they are written, each named as soon as it verifies and handed to
/// `--exec`; a receiver that joins late gets what is written from then on,
/// and one that was stopped and started again gets what it missed from the
/// backlog, and nothing twice.
#[test]
fn a_channel_sends_files_as_they_are_written_to_receivers_that_come_and_go() {
    let tmp = Tmp::new("mc-channel");
    let spool = tmp.join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let (d1, d2) = (tmp.join("d1"), tmp.join("d2"));
    let hooks = tmp.join("hooks.log");
    let exec = format!("echo >> {}", hooks.display());
    let r1 = channel_receiver(47361, &d1, "site-1", &["--exec", &exec]);
    std::thread::sleep(Duration::from_millis(300));
    let s = longhaul()
        .args(["multicast", "send", "--json", "--rate", "200M", "--open"])
        .args(["--to", "127.0.0.1:47361,127.0.0.1:47362", "--state-dir"])
        .arg(tmp.join("send-state"))
        .arg("--follow")
        .arg(&spool)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let write = |name: &str, seed: u64, len: usize| {
        let p = spool.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        // Written under a dot name and renamed in, as spools do; or in place.
        if seed.is_multiple_of(2) {
            let tmp = p.with_file_name(format!(".{}", p.file_name().unwrap().to_string_lossy()));
            std::fs::write(&tmp, gen_bytes(seed, len)).unwrap();
            std::fs::rename(&tmp, &p).unwrap();
        } else {
            std::fs::write(&p, gen_bytes(seed, len)).unwrap();
        }
    };
    write("a.dat", 1, 300_000);
    write("b.dat", 2, 10_000);
    write("later/c.dat", 3, 2_000_000);
    std::thread::sleep(Duration::from_secs(2));
    // site-2 joins now: it gets what is written from here on.
    let r2 = channel_receiver(47362, &d2, "site-2", &[]);
    std::thread::sleep(Duration::from_secs(2));
    write("d.dat", 4, 50_000);
    std::thread::sleep(Duration::from_secs(2));
    // site-1 stops; files are written while it is away; it comes back.
    let o1 = interrupt(r1);
    write("e.dat", 5, 70_000);
    write("later/f.dat", 6, 1_000);
    std::thread::sleep(Duration::from_secs(1));
    let r1 = channel_receiver(47361, &d1, "site-1", &["--exec", &exec]);
    std::thread::sleep(Duration::from_secs(4));
    let o1b = interrupt(r1);
    let o2 = interrupt(r2);
    let so = interrupt(s);
    assert_eq!(so.code, 0, "{}", so.stderr);
    let all = [
        "a.dat",
        "b.dat",
        "later/c.dat",
        "d.dat",
        "e.dat",
        "later/f.dat",
    ];
    let hash = |p: &Path| std::fs::read(p).ok().map(|b| blake3::hash(&b));
    for (seed, name) in all.iter().enumerate() {
        let want = hash(&spool.join(name));
        assert!(
            hash(&d1.join(name)) == want,
            "site-1 {name}: {}\n{}\n{}",
            o1.stdout,
            o1b.stdout,
            o1b.stderr
        );
        // site-2 joined after the first three.
        let got2 = hash(&d2.join(name));
        match seed < 3 {
            true => assert!(got2.is_none() || got2 == want, "site-2 {name}"),
            false => assert!(got2 == want, "site-2 {name}: {}", o2.stdout),
        }
    }
    // Each file reported once, with its latency, and handed to --exec once.
    let files1: Vec<_> = events(&o1.stdout, "file")
        .into_iter()
        .chain(events(&o1b.stdout, "file"))
        .collect();
    let mut names: Vec<&str> = files1.iter().map(|f| f["path"].as_str().unwrap()).collect();
    names.sort();
    let mut want = all.to_vec();
    want.sort();
    assert_eq!(names, want, "{files1:?}");
    for f in &files1 {
        let l = f["latency_s"].as_f64().unwrap();
        assert!((0.0..30.0).contains(&l), "{f}");
    }
    assert_eq!(
        std::fs::read_to_string(&hooks).unwrap().lines().count(),
        all.len()
    );
    // Nothing but the files: no part files left.
    for d in [&d1, &d2] {
        for p in list_tree(d) {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            assert!(!n.contains("lh-part"), "{}", p.display());
        }
    }
    let offered = events(&so.stdout, "offered");
    assert_eq!(offered.len(), all.len(), "{}", so.stdout);
}

/// A channel sender stopped and started again on the same spool takes up
/// the same channel from its record in --state-dir: a receiver that was
/// away meanwhile still gets what it missed from the backlog, one that
/// stayed gets nothing twice, and the files offered before are not offered
/// again.
#[test]
fn a_restarted_channel_sender_keeps_its_channel_and_its_backlog() {
    let tmp = Tmp::new("mc-channel-restart");
    let spool = tmp.join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let state = tmp.join("send-state");
    let (d1, d2) = (tmp.join("d1"), tmp.join("d2"));
    let r1 = channel_receiver(47371, &d1, "site-1", &[]);
    let r2 = channel_receiver(47372, &d2, "site-2", &[]);
    std::thread::sleep(Duration::from_millis(300));
    let send = || {
        longhaul()
            .args(["multicast", "send", "--json", "--rate", "200M", "--open"])
            .args(["--to", "127.0.0.1:47371,127.0.0.1:47372", "--state-dir"])
            .arg(&state)
            .arg("--follow")
            .arg(&spool)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let write = |name: &str, seed: u64, len: usize| {
        let tmp = spool.join(format!(".{name}"));
        std::fs::write(&tmp, gen_bytes(seed, len)).unwrap();
        std::fs::rename(&tmp, spool.join(name)).unwrap();
    };
    let s = send();
    std::thread::sleep(Duration::from_millis(1500));
    write("a.dat", 1, 200_000);
    write("b.dat", 2, 10_000);
    std::thread::sleep(Duration::from_secs(2));
    // site-1 goes away; two files are written; then the sender stops too.
    let o1 = interrupt(r1);
    write("c.dat", 3, 300_000);
    write("d.dat", 4, 20_000);
    std::thread::sleep(Duration::from_secs(2));
    let so = interrupt(s);
    assert_eq!(so.code, 0, "{}", so.stderr);
    // The sender comes back, then site-1; one more file.
    let s = send();
    std::thread::sleep(Duration::from_millis(1500));
    let r1 = channel_receiver(47371, &d1, "site-1", &[]);
    std::thread::sleep(Duration::from_secs(3));
    write("e.dat", 5, 50_000);
    std::thread::sleep(Duration::from_secs(3));
    let o1b = interrupt(r1);
    let o2 = interrupt(r2);
    let so2 = interrupt(s);
    assert_eq!(so2.code, 0, "{}", so2.stderr);
    let id = |out: &Out| events(&out.stdout, "channel")[0]["channel"].clone();
    assert_eq!(id(&so), id(&so2), "the same channel");
    let restored = events(&so2.stdout, "restored");
    assert!(
        restored
            .first()
            .is_some_and(|r| r["files"].as_u64() >= Some(2)),
        "c.dat and d.dat were held for site-1: {}",
        so2.stdout
    );
    let names = ["a.dat", "b.dat", "c.dat", "d.dat", "e.dat"];
    for (seed, name) in names.iter().enumerate() {
        let want = blake3::hash(&gen_bytes(
            seed as u64 + 1,
            std::fs::metadata(spool.join(name)).unwrap().len() as usize,
        ));
        for (d, who) in [(&d1, "site-1"), (&d2, "site-2")] {
            let got = std::fs::read(d.join(name)).ok().map(|b| blake3::hash(&b));
            assert_eq!(
                got,
                Some(want),
                "{who} {name}:\n{}\n{}\n{}",
                o1.stdout,
                o1b.stdout,
                o2.stdout
            );
        }
    }
    // Nothing twice at site-2, which stayed; nothing offered twice.
    let mut got2: Vec<String> = events(&o2.stdout, "file")
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    got2.sort();
    assert_eq!(got2, names, "{}", o2.stdout);
    let offered: Vec<String> = events(&so2.stdout, "offered")
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(offered, ["e.dat"], "{}", so2.stdout);
}
