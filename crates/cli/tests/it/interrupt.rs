//! Ctrl-C in the middle of a get: exit 130, the partial and its journal stay, and
//! every chunk written before the signal is journaled (not only those of the last
//! periodic flush), so the rerun moves only what was missing.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::process::Stdio;
use std::time::{Duration, Instant};

const SIZE: u64 = 64 * MIB;

#[test]
fn ctrl_c_keeps_every_written_chunk_for_the_rerun() {
    let t = Tmp::new("interrupt");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("big.bin"), 11, SIZE);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let args: Vec<OsString> = vec![
        "--accept-new".into(),
        "--max-rate".into(),
        "100M".into(),
        "--streams".into(),
        "1".into(),
        "--json".into(),
        srv.remote("big.bin"),
        dest.clone().into(),
    ];
    let mut child = c
        .cmd("get", &args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // 100 Mbit/s: 12.5 MB/s, so after ~2 s some 20 chunks are written, fewer than
    // the 16-chunk periodic flush would journal with certainty.
    let part = dest.join(".big.bin.lh-part");
    let started = Instant::now();
    while !part.exists() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(2000));
    // SAFETY: sending SIGINT to our own child by its PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(130), "stderr: {err}");
    assert!(err.contains("rerun the same command to resume"), "{err}");
    assert!(std::fs::symlink_metadata(dest.join("big.bin")).is_err());
    let journal = dest.join(".big.bin.lh-journal");
    let records = (std::fs::metadata(&journal).unwrap().len() - 28) / 44;
    // Chunks that reached the part file (the rest of it is still sparse zeros).
    let src = std::fs::read(root.join("big.bin")).unwrap();
    let got = std::fs::read(&part).unwrap();
    let written = (0..(SIZE / MIB) as usize)
        .filter(|&i| {
            let r = i * MIB as usize..(i + 1) * MIB as usize;
            src[r.clone()] == got[r]
        })
        .count() as u64;
    eprintln!("{written} chunk(s) written, {records} journaled");
    assert!((8..SIZE / MIB).contains(&written), "{written}");
    // One stream: at most the chunk being recorded at the signal may be missing;
    // the periodic checkpoint alone (every 5 s) would leave many behind.
    assert!(
        records <= written && written - records <= 1,
        "{written} chunk(s) written, {records} journaled"
    );

    let out = c.run("get", &args);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(totals(&j, "bytes_resumed"), records * MIB, "{j:#}");
    assert_eq!(
        totals(&j, "bytes_resumed") + totals(&j, "bytes_transferred"),
        SIZE
    );
    assert_eq!(
        hash_file(&dest.join("big.bin")),
        hash_file(&root.join("big.bin"))
    );
    assert_eq!(list_tree(&dest), vec![dest.join("big.bin")]);
}

#[test]
fn ctrl_c_of_a_put_ends_the_servers_session_at_once() {
    // Without a close on Ctrl-C the server held the session, and the files
    // it was receiving, until its idle timeout: a rerun right away was
    // refused ("already being received").
    let t = Tmp::new("interrupt-put");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("in")).unwrap();
    let src = t.join("big.bin");
    gen_file(&src, 12, SIZE);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let args: Vec<OsString> = vec![
        "--accept-new".into(),
        "--max-rate".into(),
        "100M".into(),
        "--json".into(),
        src.clone().into(),
        srv.remote("in/"),
    ];
    let child = c
        .cmd("put", &args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let part = root.join("in/.big.bin.lh-part");
    let started = Instant::now();
    while !part.exists() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: sending SIGINT to our own child by its PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(
        (&j["ok"], &j["interrupted"]),
        (&false.into(), &true.into()),
        "{j:#}"
    );
    let rerun = Instant::now();
    let out = c.run("put", &args);
    out.expect_code(0);
    let j = out.json();
    // The sender reports what the server already held (it said 0 before).
    assert!(totals(&j, "bytes_resumed") > 0, "{j:#}");
    assert_eq!(
        totals(&j, "bytes_resumed") + totals(&j, "bytes_transferred"),
        SIZE,
        "{j:#}"
    );
    assert_eq!(hash_file(&root.join("in/big.bin")), hash_file(&src));
    // The close is one datagram: on a loaded machine it can be lost, and
    // the server then ends the session at its idle timeout; the rerun waits
    // for that and still resumes (above). When the close arrived, the
    // session ended at once and the rerun did not wait.
    let log = srv.log_text();
    if log.contains("interrupted by the user") {
        assert!(
            rerun.elapsed() < Duration::from_secs(10),
            "the rerun took {:?}; server log:\n{log}",
            rerun.elapsed()
        );
    } else {
        assert!(
            log.contains("connection lost: timed out"),
            "the first session ended neither way:\n{log}"
        );
    }
}
