//! Files announced and never sent cost the receiver no more than its budget
//! of locked parts: hostile put sessions that announce 1,000 files of 2 MiB
//! (each answered with a `Want`, each part set up) and send no data leave
//! the server with a few dozen descriptors, and an honest put goes through
//! beside them. The server runs as its own process with 256 open files at
//! most, as one run by a user whose limit is low.
//!
//! What such sessions leave is bounded too: a part with no chunk in it is
//! removed when its session ends, and the parts of files left unfinished
//! are recorded, capped per client and expired.

use longhaul_quic::proto::{ErrorCode, Frame, RecordHeader, DATA_PRELUDE};
use longhaul_testkit::raw::Raw;
use longhaul_testkit::*;
use longhaul_transfer::{Entry, EntryKind};
use std::ffi::OsString;

const SESSIONS: u64 = 4;
const FILES: u64 = 250;

/// A put session into `in/x` (which holds a file, so the session is not
/// fresh and every entry is answered) that announces `FILES` files of 2 MiB
/// and sends nothing; returns once every entry has its `Want`.
async fn announce(port: u16, kh: std::path::PathBuf, session: u64) -> Raw {
    announce_files(port, kh, session, FILES, 2 << 20).await
}

/// A put session into `in/x` (not fresh: it holds a file) up to its
/// Welcome.
async fn put_into_x(port: u16, kh: std::path::PathBuf) -> Raw {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut r = Raw::connect(addr, kh).await;
    r.put_hello(b"in", b"x").await;
    assert!(!r.welcome().await, "in/x holds a file: not fresh");
    r
}

/// An entry of the root `x`.
fn entry(id: u64, path: Vec<u8>, kind: EntryKind, size: u64) -> Frame {
    Frame::Entry(Entry {
        id,
        root: 0,
        path,
        kind,
        size,
        mode: 0o644,
        mtime_ns: 1_600_000_000_000_000_000,
        link: vec![],
        owner: Default::default(),
        xattrs: vec![],
        allocated: 0,
    })
}

/// The same with `files` files of `size` bytes.
async fn announce_files(
    port: u16,
    kh: std::path::PathBuf,
    session: u64,
    files: u64,
    size: u64,
) -> Raw {
    let mut r = put_into_x(port, kh).await;
    r.frame(&entry(1, vec![], EntryKind::Dir, 0)).await;
    for i in 0..files {
        let name = format!("s{session}-f{i:03}").into_bytes();
        r.frame(&entry(2 + i, name, EntryKind::File, size)).await;
    }
    let mut wants = 0;
    while wants < files {
        match r.next().await {
            Some(Frame::Want { .. }) => wants += 1,
            Some(_) => {}
            None => panic!("session {session}: {wants} Wants, then nothing"),
        }
    }
    r
}

fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn files_announced_and_never_sent_hold_at_most_the_budget_of_descriptors() {
    let t = Tmp::new("announced");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("in/x")).unwrap();
    std::fs::write(root.join("in/x/keep"), b"here before\n").unwrap();
    let srv = ServeCfg::new(&root, &t.join("state"))
        .writable()
        .nofile(256)
        .start();
    let pid = srv.pid().expect("server pid");
    let before = descriptors(pid);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let sessions: Vec<Raw> = rt.block_on(async {
        let mut v = Vec::new();
        for s in 0..SESSIONS {
            v.push(announce(srv.port, t.join("kh"), s).await);
        }
        v
    });
    let held = descriptors(pid);
    eprintln!(
        "server descriptors: {before} idle, {held} with {} files announced and set up",
        SESSIONS * FILES
    );
    // A connection costs a few (its socket is shared: one endpoint); the
    // parts at most the budget of locked parts (256 / 16 = 16), one
    // descriptor each while no data moves.
    assert!(
        held <= before + 16 + 16,
        "{held} descriptors with {} files announced ({before} before)",
        SESSIONS * FILES
    );
    let parts = std::fs::read_dir(root.join("in/x"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".lh-part")
        })
        .count();
    assert_eq!(parts as u64, SESSIONS * FILES, "every part was set up");

    // An honest put of a file of several chunks goes through beside them.
    let src = t.join("src");
    gen_file(&src, 7, 3 << 20);
    let out = Client::new(t.join("kh-honest")).run(
        "put",
        [
            OsString::from("--accept-new"),
            "--quiet".into(),
            src.clone().into(),
            srv.remote("honest"),
        ],
    );
    out.expect_code(0);
    assert_eq!(hash_file(&root.join("honest")), hash_file(&src));

    // Gone, the sessions leave nothing: their parts held no chunk.
    rt.block_on(async {
        for r in &sessions {
            r.conn.close(0u32.into(), b"gone");
        }
    });
    drop(sessions);
    until("the empty parts removed", || {
        std::fs::read_dir(root.join("in/x")).unwrap().count() == 1
    });
    assert!(srv.alive());
}

/// Chunk 0 (1 MiB of `fill`) of file `id`, on a data stream of its own.
async fn first_chunk(r: &Raw, id: u64, fill: u8) {
    let mut v = DATA_PRELUDE.to_vec();
    let h = RecordHeader {
        id,
        offset: 0,
        len: 1 << 20,
        hash: false,
        zeros: false,
        sparse: false,
    };
    v.extend_from_slice(&h.encode());
    v.extend_from_slice(&vec![fill; 1 << 20]);
    let mut u = r.conn.open_uni().await.unwrap();
    u.write_all(&v).await.unwrap();
    let _ = u.finish();
}

/// Waits until `f` holds (10 s at most).
fn until(what: &str, f: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(t0.elapsed().as_secs() < 10, "waited 10 s for {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn unfinished_parts_are_kept_within_their_caps_and_expire() {
    let t = Tmp::new("kept-parts");
    let root = t.join("root");
    let x = root.join("in/x");
    std::fs::create_dir_all(&x).unwrap();
    std::fs::write(x.join("keep"), b"here before\n").unwrap();
    let state = t.join("state");
    let size = (2 << 20) + 1; // three chunks
    let srv = ServeCfg::new(&root, &state)
        .writable()
        .arg("--keep-parts-per-client")
        .arg("2500KiB")
        .start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // A session announces four files, sends the first chunk of three, and
    // goes away.
    let part = |i: u64| x.join(format!(".s0-f{i:03}.lh-part"));
    let journal = |i: u64| x.join(format!(".s0-f{i:03}.lh-journal"));
    rt.block_on(async {
        let r = announce_files(srv.port, t.join("kh"), 0, 4, size).await;
        for i in 0..3 {
            first_chunk(&r, 2 + i, i as u8 + 1).await;
        }
        // Each chunk is journaled (a record past the header and the
        // receiver's owner record) before the session ends.
        until("three chunks journaled", || {
            (0..3).all(|i| std::fs::metadata(journal(i)).is_ok_and(|m| m.len() > 28 + 44))
        });
        r.conn.close(0u32.into(), b"gone");
    });
    // One record per served root, in the state directory.
    let record_of = |state: &std::path::Path| {
        std::fs::read_dir(state).ok().and_then(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.starts_with("kept-parts-") && n.ends_with(".json")
            })
        })
    };
    until("the record of kept parts", || record_of(&state).is_some());
    let record = record_of(&state).unwrap();

    // A file that cannot fit (16 TiB) is refused at once; no part is made.
    rt.block_on(async {
        let mut r = put_into_x(srv.port, t.join("kh")).await;
        r.frame(&entry(1, vec![], EntryKind::Dir, 0)).await;
        r.frame(&entry(2, b"huge".to_vec(), EntryKind::File, 16 << 40))
            .await;
        // (A file the receiver cannot open ends the session, as any
        // failure of its disk does.)
        let (code, message) = r.fatal().await.expect("a Fatal frame");
        assert_eq!(code, ErrorCode::Io);
        assert!(
            message.contains("in/x/huge: does not fit: it needs 17.59 TB"),
            "{message}"
        );
    });
    assert!(!x.join(".huge.lh-part").exists());
    // The part with nothing in it is gone; of the three with a chunk each
    // (1 MiB held each), the oldest went to keep the client within 2,500 KiB.
    let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    let paths: Vec<String> = kept
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            assert_eq!(k["client"], "127.0.0.1", "{kept:#}");
            assert_eq!(k["size"], size, "{kept:#}");
            k["path"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(paths, ["in/x/s0-f001", "in/x/s0-f002"], "{kept:#}");
    assert!(
        !part(3).exists() && !journal(3).exists(),
        "nothing kept of f003"
    );
    assert!(
        !part(0).exists() && !journal(0).exists(),
        "f000 over the cap"
    );
    for i in [1, 2] {
        assert!(part(i).is_file() && journal(i).is_file(), "f{i:03} kept");
    }
    assert!(srv
        .log_text()
        .contains("s0-f000: removed its unfinished part"));

    // A server that keeps parts for 1 s removes them when it starts.
    drop(srv);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let srv = ServeCfg::new(&root, &state)
        .writable()
        .arg("--keep-parts-for")
        .arg("1s")
        .start();
    until("the kept parts expired", || {
        !part(1).exists() && !part(2).exists()
    });
    assert!(!journal(1).exists() && !journal(2).exists());
    until("an empty record", || {
        std::fs::read(&record).is_ok_and(|b| {
            serde_json::from_slice::<Vec<serde_json::Value>>(&b).is_ok_and(|v| v.is_empty())
        })
    });
    assert_eq!(
        std::fs::read_dir(&x).unwrap().count(),
        1,
        "only what was there before"
    );
    drop(srv);
}
