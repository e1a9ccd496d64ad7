//! Ctrl-C in the middle of a get: exit 130, the partial and its journal stay, and
//! every chunk written before the signal is journaled (not only those of the last
//! periodic flush), so the rerun moves only what was missing. A SIGKILL loses at
//! most the chunks in flight.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::process::Stdio;
use std::time::{Duration, Instant};

const SIZE: u64 = 64 * MIB;

/// A get of big.bin (`SIZE` bytes, seeded `seed`) at 100 Mbit/s (12.5 MB/s)
/// with `extra` options, running for about 2 s of data: some 20-25 chunks
/// written.
struct Cut {
    child: std::process::Child,
    c: Client,
    srv: Server,
    args: Vec<OsString>,
    root: std::path::PathBuf,
    dest: std::path::PathBuf,
    _t: Tmp,
}

fn get_two_seconds_in(tag: &str, seed: u64, extra: &[&str]) -> Cut {
    let t = Tmp::new(tag);
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("big.bin"), seed, SIZE);
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let mut args: Vec<OsString> = vec!["--accept-new".into(), "--max-rate".into(), "100M".into()];
    args.extend(extra.iter().map(OsString::from));
    args.extend(["--json".into(), srv.remote("big.bin"), dest.clone().into()]);
    let child = c
        .cmd("get", &args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let part = dest.join(".big.bin.lh-part");
    let started = Instant::now();
    while !part.exists() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(2000));
    Cut {
        child,
        c,
        srv,
        args,
        root,
        dest,
        _t: t,
    }
}

#[test]
fn ctrl_c_keeps_every_written_chunk_for_the_rerun() {
    // One stream: chunks are written in order. After 2 s some 20 are
    // written, fewer than the 16-chunk checkpoint journals with certainty.
    // Bound in this order, dropped in reverse: the child, the server, the files.
    let Cut {
        _t,
        srv: _srv,
        c,
        args,
        root,
        dest,
        child,
    } = get_two_seconds_in("interrupt", 11, &["--streams", "1"]);
    // SAFETY: sending SIGINT to our own child by its PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "stderr: {err}");
    assert!(err.contains("rerun the same command to resume"), "{err}");
    assert!(std::fs::symlink_metadata(dest.join("big.bin")).is_err());
    let (written, journal) = chunks_written_and_journaled(&root, &dest);
    // Ctrl-C syncs and journals everything as synced.
    assert_eq!(journal.written, vec![], "all synced at the exit");
    let records = journal.synced.len() as u64;
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

/// Chunks of big.bin that reached the part file in `dest` (the rest of it is
/// still sparse zeros), and its journal.
fn chunks_written_and_journaled(
    root: &std::path::Path,
    dest: &std::path::Path,
) -> (u64, longhaul_transfer::journal::Parsed) {
    let src = std::fs::read(root.join("big.bin")).unwrap();
    let got = std::fs::read(dest.join(".big.bin.lh-part")).unwrap();
    let written = (0..(SIZE / MIB) as usize)
        .filter(|&i| {
            let r = i * MIB as usize..(i + 1) * MIB as usize;
            src[r.clone()] == got[r]
        })
        .count() as u64;
    let j = std::fs::File::open(dest.join(".big.bin.lh-journal")).unwrap();
    let journal = longhaul_transfer::journal::read(j, SIZE / MIB)
        .unwrap()
        .expect("a journal");
    (written, journal)
}

#[test]
fn a_killed_get_has_journaled_all_but_the_chunks_in_flight_for_the_rerun() {
    // SIGKILL: no exit handler runs. What was written more than about a
    // moment before is in the journal, as written records; the
    // rerun reads those chunks back and fetches only the rest.
    // 12.5 MB/s: some 25 chunks in 2 s; the periodic sync (5 s) has not come.
    // Bound in this order, dropped in reverse: the child, the server, the files.
    let Cut {
        _t,
        srv: _srv,
        c,
        args,
        root,
        dest,
        mut child,
    } = get_two_seconds_in("sigkill", 13, &[]);
    child.kill().unwrap();
    child.wait().unwrap();
    let (written, journal) = chunks_written_and_journaled(&root, &dest);
    let journaled = (journal.synced.len() + journal.written.len()) as u64;
    eprintln!(
        "{written} chunk(s) written, {journaled} journaled ({} synced)",
        journal.synced.len()
    );
    assert!(written < SIZE / MIB, "the kill came before the end");
    assert!(journaled >= 1, "nothing journaled 2 s into the file");
    assert!(journaled <= written);
    // Four streams: a chunk each in flight, and one checkpoint out per file.
    assert!(
        written - journaled <= 8,
        "{written} written, {journaled} journaled: more than the chunks in flight lost"
    );

    let out = c.run("get", &args);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(totals(&j, "bytes_resumed"), journaled * MIB, "{j:#}");
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
    let srv = Server::start_writable(&root, &t.join("state"));
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
    // session ended at once and the rerun did not wait. (Without the close
    // the first session may still be waiting for its idle timeout, 15 s,
    // when the rerun is done: wait for its line.)
    let waited = Instant::now();
    let ended = |l: &str| l.contains("interrupted by the user") || l.contains("timed out");
    while !ended(&srv.log_text()) && waited.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
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
