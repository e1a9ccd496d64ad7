//! A hostile client speaking raw QUIC to an in-process server: malformed control
//! frames, oversize length prefixes, manifest entries that try to leave the root,
//! broken data streams. Each must end its session with a precise reason, write
//! nothing outside the root, and leave the server serving normal clients. The
//! same raw client also checks what the handshake carries (no session
//! tickets).

use longhaul_quic::proto::{
    encode, ErrorCode, Frame, Hello, Op, Outcome, PutSync, RecordHeader, Repair, RootSpec, Want,
    DATA_PRELUDE, MAX_CONNECTIONS, REPAIRED_PRELUDE, SESSION_KEY_LEN, VERSION,
};
use longhaul_quic::Progress;
use longhaul_testkit::raw::Raw;
use longhaul_transfer::{Entry, EntryKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const DATA: &[u8] = b"the one file of the served root\n";

struct Srv {
    /// First, so the server stops before its directory goes.
    srv: crate::common::Served,
    t: tempfile::TempDir,
    root: PathBuf,
}

fn start() -> Srv {
    let t = tempfile::Builder::new()
        .prefix("longhaul-hostile-")
        .tempdir()
        .unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("data.bin"), DATA).unwrap();
    std::fs::create_dir(t.path().join("outside")).unwrap();
    let srv = crate::common::serve(&root, &t.path().join("state"), false);
    Srv { srv, t, root }
}

async fn connect(s: &Srv) -> Raw {
    Raw::connect(s.srv.addr, s.t.path().join("known_hosts")).await
}

/// A get of the served file, up to the Welcome.
async fn get_session(s: &Srv) -> Raw {
    let mut r = connect(s).await;
    r.hello(Op::Get {
        paths: vec![b"data.bin".to_vec()],
        filters: vec![],
        meta: Default::default(),
        listed: false,
    })
    .await;
    r.welcome().await;
    r
}

/// A put of one root named `root` into the directory `dest`, up to its Hello.
async fn put_to(s: &Srv, dest: &[u8], root: &[u8]) -> Raw {
    let mut r = connect(s).await;
    r.hello(Op::Put {
        dest: dest.to_vec(),
        dest_is_dir: true,
        roots: vec![RootSpec {
            name: root.to_vec(),
        }],
        sync: PutSync::Always,
        durable: false,
        specials: false,
        delete: false,
        filters: vec![],
        dry_run: false,
        numeric_ids: false,
        shard: None,
    })
    .await;
    r
}

/// A put of one directory root `x` into `in/`, up to its Hello.
async fn put_hello(s: &Srv) -> Raw {
    put_to(s, b"in", b"x").await
}

/// The same up to the Welcome (fresh unless `in/x` holds something).
async fn put_session(s: &Srv) -> Raw {
    let mut r = put_hello(s).await;
    r.welcome().await;
    r
}

fn entry(id: u64, path: &[u8], kind: EntryKind, size: u64, link: &[u8]) -> Frame {
    Frame::Entry(Entry {
        id,
        root: 0,
        path: path.to_vec(),
        kind,
        size,
        mode: if kind == EntryKind::Dir { 0o755 } else { 0o644 },
        mtime_ns: 1_600_000_000_000_000_000,
        link: link.to_vec(),
        owner: Default::default(),
        xattrs: vec![],
        allocated: 0,
    })
}

/// Every path under `p`.
fn tree(p: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            out.push(e.path());
            if e.file_type().unwrap().is_dir() {
                out.extend(tree(&e.path()));
            }
        }
    }
    out.sort();
    out
}

/// Nothing was written outside the root, and inside it at most directories under `in/`.
/// One data stream carrying `bytes`, finished.
async fn data(r: &Raw, bytes: &[u8]) {
    let mut u = r.conn.open_uni().await.unwrap();
    u.write_all(bytes).await.unwrap();
    let _ = u.finish();
}
/// A data stream of one record; with `hash`, the record carries it
/// (protocol 2: a file's only chunk).
fn record_with(id: u64, offset: u64, len: u32, payload: &[u8], hash: Option<&[u8; 32]>) -> Vec<u8> {
    let mut v = DATA_PRELUDE.to_vec();
    let h = RecordHeader {
        id,
        offset,
        len,
        hash: hash.is_some(),
        zeros: false,
        sparse: false,
    };
    v.extend_from_slice(&h.encode());
    v.extend_from_slice(payload);
    v.extend_from_slice(hash.map_or(&[][..], |h| &h[..]));
    v
}
fn record(id: u64, offset: u64, len: u32, payload: &[u8]) -> Vec<u8> {
    record_with(id, offset, len, payload, None)
}

fn assert_nothing_escaped(s: &Srv, abs: &[&Path]) {
    let outside: Vec<_> = tree(s.t.path())
        .into_iter()
        .filter(|p| !p.starts_with(&s.root) && !p.starts_with(s.t.path().join("state")))
        .filter(|p| !p.starts_with(s.t.path().join("dest")))
        .collect();
    assert_eq!(
        outside,
        vec![s.t.path().join("outside")],
        "only the untouched `outside` dir beside the root"
    );
    for p in abs {
        assert!(
            std::fs::symlink_metadata(p).is_err(),
            "{} was created",
            p.display()
        );
    }
    for p in tree(&s.root) {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let ok = p == s.root.join("data.bin") || p.starts_with(s.root.join("in"));
        assert!(ok, "unexpected {} in the root", p.display());
        if m.is_file() && p != s.root.join("data.bin") {
            panic!("a file was written: {}", p.display());
        }
    }
}

/// A normal client still gets the one file.
async fn normal_get_works(s: &Srv) {
    let dest = s.t.path().join("dest");
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::create_dir(&dest).unwrap();
    let opts = s
        .srv
        .client(s.t.path().join("state").join("client_known_hosts"));
    let r = longhaul_quic::get(
        "127.0.0.1",
        s.srv.addr.port(),
        &["data.bin".to_string()],
        &dest,
        &opts,
        Arc::new(Progress::default()),
    )
    .await
    .expect("a normal get after the hostile session");
    assert!(r.ok, "{:?}", r.problems);
    // Not `totals.verified == 1`: a get can return before its last file is in the
    // report (see settle_race.rs); that race is not what this test is about.
    assert_eq!(r.totals.failed, 0, "{r:#?}");
    assert_eq!(std::fs::read(dest.join("data.bin")).unwrap(), DATA);
    std::fs::remove_dir_all(&dest).unwrap();
    assert!(s.srv.is_running(), "the server is still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_on_the_control_stream() {
    let s = start();
    // (a) A short frame whose body is not a postcard Frame.
    let mut r = connect(&s).await;
    r.write(&[0, 0, 0, 6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
        .await;
    r.expect_fatal(ErrorCode::Protocol, &["malformed control frame"])
        .await;
    // (a') Text where a frame should be: its first bytes read as a 1.1 GB length.
    let mut r = connect(&s).await;
    r.write(b"GET / HTTP/1.1\r\nHost: longhaul\r\n\r\n").await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &["control frame of 1195725856 bytes exceeds the 1048576-byte limit"],
    )
    .await;
    // (b) A length prefix claiming u32::MAX bytes, and nothing more.
    let mut r = connect(&s).await;
    r.write(&u32::MAX.to_be_bytes()).await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &["control frame of 4294967295 bytes exceeds the 1048576-byte limit"],
    )
    .await;
    // A valid frame that is not a Hello, and a Hello of another version.
    let mut r = connect(&s).await;
    r.frame(&Frame::ManifestEnd).await;
    r.expect_fatal(ErrorCode::Protocol, &["expected Hello, got ManifestEnd"])
        .await;
    let mut r = connect(&s).await;
    r.frame(&Frame::Hello(Hello {
        version: 99,
        token: vec![],
        op: Op::Get {
            paths: vec![],
            filters: vec![],
            meta: Default::default(),
            listed: false,
        },
        max_rate: 0,
        cc: None,
        fresh: false,
        streams: 0,
        connections: 0,
        session: vec![],
    }))
    .await;
    r.expect_fatal(
        ErrorCode::Version,
        &["protocol version 99 is not supported"],
    )
    .await;
    // A version 2 client's Hello, which has no `fresh` (its last byte here):
    // it does not decode as this version's Hello, yet is answered as a version.
    let mut r = connect(&s).await;
    let mut v2 = encode(&Frame::Hello(Hello {
        version: 2,
        token: vec![],
        op: Op::Get {
            paths: vec![b"data.bin".to_vec()],
            filters: vec![],
            meta: Default::default(),
            listed: false,
        },
        max_rate: 0,
        cc: None,
        fresh: false,
        streams: 0,
        connections: 0,
        session: vec![],
    }));
    v2.pop();
    let len = (v2.len() - 4) as u32;
    v2[..4].copy_from_slice(&len.to_be_bytes());
    r.write(&v2).await;
    r.expect_fatal(
        ErrorCode::Version,
        &[&format!(
            "protocol version 2 is not supported (this side speaks {VERSION})"
        )],
    )
    .await;
    assert_nothing_escaped(&s, &[]);
    normal_get_works(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn put_manifest_entries_that_leave_the_root() {
    let s = start();
    let abs = PathBuf::from(format!("/tmp/longhaul-hostile-abs-{}", std::process::id()));

    // (c) `../escape` below a legitimate root entry.
    let mut r = put_session(&s).await;
    r.frame(&entry(1, b"", EntryKind::Dir, 0, b"")).await;
    r.frame(&entry(2, b"../escape", EntryKind::File, 5, b""))
        .await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &["path \"../escape\" refused: '..' would leave the root"],
    )
    .await;

    // (c) An absolute path.
    let mut r = put_session(&s).await;
    r.frame(&entry(1, b"", EntryKind::Dir, 0, b"")).await;
    let mut p = abs.as_os_str().as_encoded_bytes().to_vec();
    p.extend_from_slice(b"/f");
    r.frame(&entry(2, &p, EntryKind::File, 5, b"")).await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &[&format!("absolute path \"{}/f\" refused", abs.display())],
    )
    .await;

    // (c) A directory entry climbing out, and `..` hidden in the middle.
    let mut r = put_session(&s).await;
    r.frame(&entry(1, b"", EntryKind::Dir, 0, b"")).await;
    r.frame(&entry(2, b"a/../../../escape-dir", EntryKind::Dir, 0, b""))
        .await;
    r.expect_fatal(ErrorCode::Protocol, &["'..' would leave the root"])
        .await;

    // (c) A root name that is `..` (the put request itself).
    let mut r = put_to(&s, b"in", b"..").await;
    r.welcome().await;
    r.frame(&entry(1, b"", EntryKind::File, 5, b"")).await;
    r.expect_fatal(ErrorCode::Protocol, &["'..' would leave the root"])
        .await;

    // (c) A put destination outside the root.
    let r = put_to(&s, b"../escape", b"x").await;
    r.expect_fatal(
        ErrorCode::BadPath,
        &["path \"../escape\" refused: '..' would leave the root"],
    )
    .await;

    // (c) A symlink planted by the manifest, then a file through it.
    let outside = s.t.path().join("outside");
    let mut r = put_session(&s).await;
    r.frame(&entry(1, b"", EntryKind::Dir, 0, b"")).await;
    r.frame(&entry(
        2,
        b"esc",
        EntryKind::Symlink,
        0,
        outside.as_os_str().as_encoded_bytes(),
    ))
    .await;
    r.frame(&entry(3, b"esc/pwned", EntryKind::File, 5, b""))
        .await;
    r.expect_fatal_frame(ErrorCode::Io, &["the receiver failed", "in/x/esc/pwned"])
        .await;
    r.conn.close(0u32.into(), b"bye");
    assert!(
        tree(&outside).is_empty(),
        "nothing written through the link: {:?}",
        tree(&outside)
    );
    // The link itself is a link, and the only non-directory left in the root.
    let link = s.root.join("in/x/esc");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    std::fs::remove_file(&link).unwrap();

    assert_nothing_escaped(
        &s,
        &[
            &abs,
            &s.t.path().join("escape"),
            &s.t.path().join("escape-dir"),
        ],
    );
    normal_get_works(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn put_entries_through_a_link_in_the_root_or_by_a_reserved_name() {
    let s = start();
    // A link that stays inside the root, then a file through it: it would
    // land in in/ instead of in/x/ (for a get into a new destination, in
    // the destination's parent).
    let mut r = put_session(&s).await;
    r.frame(&entry(1, b"", EntryKind::Dir, 0, b"")).await;
    r.frame(&entry(2, b"up", EntryKind::Symlink, 0, b".."))
        .await;
    r.frame(&entry(3, b"up/side", EntryKind::File, 5, b""))
        .await;
    r.expect_fatal_frame(
        ErrorCode::Io,
        &[
            "the receiver failed",
            "in/x/up: is a symbolic link, and longhaul writes nothing through a link",
        ],
    )
    .await;
    r.conn.close(0u32.into(), b"bye");
    assert!(!s.root.join("in/side").exists(), "nothing beside in/x");
    std::fs::remove_file(s.root.join("in/x/up")).unwrap();

    // A file named as another file's part would be truncated, renamed or
    // removed with that file: refused.
    let mut r = put_session(&s).await;
    r.frame(&entry(1, b"", EntryKind::Dir, 0, b"")).await;
    r.frame(&entry(2, b".f.lh-part", EntryKind::File, 5, b""))
        .await;
    r.expect_fatal_frame(
        ErrorCode::Io,
        &["in/x/.f.lh-part: a name longhaul keeps for its own part, journal and link files"],
    )
    .await;
    r.conn.close(0u32.into(), b"bye");
    assert!(!s.root.join("in/x/.f.lh-part").exists());

    // An id used twice: a write in flight for the first file would count
    // for the second.
    let mut r = put_session(&s).await;
    r.frame(&entry(1, b"", EntryKind::Dir, 0, b"")).await;
    r.frame(&entry(2, b"a", EntryKind::File, 5, b"")).await;
    r.frame(&entry(2, b"b", EntryKind::File, 5, b"")).await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &["entry id 2 after 2: entry ids must rise"],
    )
    .await;
    normal_get_works(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broken_data_streams() {
    let s = start();

    // The put's destination holds a file, so the server asks per file;
    // `fresh_put_data` tries the fresh path, which sends no Want.
    std::fs::create_dir_all(s.root.join("in/x")).unwrap();
    std::fs::write(s.root.join("in/x/keep"), b"keep").unwrap();
    // A put of one 10-byte file up to the receiver's Want.
    async fn ready(s: &Srv, size: u64) -> Raw {
        let mut r = put_hello(s).await;
        assert!(!r.welcome().await, "in/x holds a file: not fresh");
        r.frame(&entry(1, b"", EntryKind::Dir, 0, b"")).await;
        r.frame(&entry(2, b"f", EntryKind::File, size, b"")).await;
        r.frame(&Frame::ManifestEnd).await;
        match r.next().await {
            Some(Frame::Want { id: 2, want }) => assert_eq!(want, Want::All),
            other => panic!("expected Want for file 2, got {other:?}"),
        }
        r
    }

    // (d) A bad prelude.
    let r = ready(&s, 10).await;
    data(&r, b"LHD2\0\0\0\0").await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &["data stream does not start with the LHD1 or LHR1 prelude"],
    )
    .await;
    // (e) Version 9: a protected stream (tail repair) whose repair symbol
    // says it ends before the data that came. The stream stays open, so the
    // receiver waits for its next record whichever comes first.
    let r = ready(&s, 200).await;
    let mut u = r.conn.open_uni().await.unwrap();
    let mut bytes = REPAIRED_PRELUDE.to_vec();
    bytes.extend_from_slice(&record(2, 0, 200, &[7; 200])[DATA_PRELUDE.len()..]);
    u.write_all(&bytes).await.unwrap();
    let repair = Repair {
        stream: u.id().into(),
        len: 100,
        symbol_size: 1024,
        esi: 1,
        symbol: vec![0; 1024].into(),
    };
    r.conn.send_datagram(repair.encode().into()).unwrap();
    r.expect_fatal(
        ErrorCode::Protocol,
        &["data past the protected stream's end"],
    )
    .await;
    drop(u);
    // (d) A record for a file id the manifest never named.
    let r = ready(&s, 10).await;
    data(&r, &record(999, 0, 10, b"0123456789")).await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &["data for unknown or settled file 999"],
    )
    .await;
    // A record longer than a chunk, one beyond the file, one of the wrong length.
    let r = ready(&s, 10).await;
    data(&r, &record(2, 0, (1 << 20) + 1, b"")).await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &["data record of 1048577 bytes exceeds the chunk size"],
    )
    .await;
    let r = ready(&s, 10).await;
    data(&r, &record(2, 5 << 20, 10, b"0123456789")).await;
    r.expect_fatal(ErrorCode::Protocol, &["chunk 5 is beyond the file"])
        .await;
    let r = ready(&s, 10).await;
    data(&r, &record(2, 0, 4, b"0123")).await;
    r.expect_fatal(ErrorCode::Protocol, &["chunk 0 has 4 bytes, expected 10"])
        .await;
    // A record cut short by the end of its stream.
    let r = ready(&s, 10).await;
    data(&r, &record(2, 0, 10, b"01234")).await;
    r.expect_fatal(ErrorCode::Protocol, &["stream ended inside a frame"])
        .await;
    // Version 2: a record may carry its file's hash, but only a file's only chunk.
    fn hashed(id: u64, len: u32, payload: &[u8], hash: &[u8; 32]) -> Vec<u8> {
        record_with(id, 0, len, payload, Some(hash))
    }
    let big = vec![7u8; 1 << 20];
    let r = ready(&s, 3 << 20).await;
    data(&r, &hashed(2, 1 << 20, &big, &[0; 32])).await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &["a hash on a record of file 2, which has 3 chunks"],
    )
    .await;
    // A hash the data does not have: the file fails verification, nothing is
    // placed, and the session goes on.
    let mut r = ready(&s, 10).await;
    data(&r, &hashed(2, 10, b"0123456789", &[0; 32])).await;
    match r.next().await {
        Some(Frame::FileResult {
            id: 2,
            outcome: Outcome::Failed { code, message },
        }) => {
            assert_eq!(code, ErrorCode::Verify);
            assert!(message.contains("BLAKE3 mismatch"), "{message}");
        }
        other => panic!("expected a failed FileResult for file 2, got {other:?}"),
    }
    assert!(std::fs::symlink_metadata(s.root.join("in/x/f")).is_err());
    // The right hash: verified and placed, with no FileDone.
    let mut r = ready(&s, 10).await;
    let good = *blake3::hash(b"0123456789").as_bytes();
    data(&r, &hashed(2, 10, b"0123456789", &good)).await;
    match r.next().await {
        Some(Frame::FileResult {
            id: 2,
            outcome: Outcome::Verified,
        }) => {}
        other => panic!("expected a verified FileResult for file 2, got {other:?}"),
    }
    assert_eq!(std::fs::read(s.root.join("in/x/f")).unwrap(), b"0123456789");
    std::fs::remove_file(s.root.join("in/x/f")).unwrap();
    // The sender gives a file up (FileFailed, on the control stream, which
    // overtakes the data) with a record of it still on its way: the record is
    // dropped, the file reported failed, and the session ends normally.
    let mut r = ready(&s, 3 << 20).await;
    r.frame(&Frame::FileFailed {
        id: 2,
        message: "changed while being sent".into(),
        vanished: false,
        again: false,
    })
    .await;
    // (The session may be over before the record is all sent: the server
    // closes a finished session, and the write then fails. Either way.)
    if let Ok(mut u) = r.conn.open_uni().await {
        let _ = u.write_all(&record(2, 0, 1 << 20, &big)).await;
    }
    match r.next().await {
        Some(Frame::FileResult {
            id: 2,
            outcome: Outcome::Failed { .. },
        }) => {}
        other => panic!("expected a failed FileResult for file 2, got {other:?}"),
    }
    match r.next().await {
        Some(Frame::Done { ok: false, .. }) => {}
        other => panic!("expected Done {{ ok: false }}, got {other:?}"),
    }

    // The receiver wrote at most a hidden part file beside in/x/f; no final
    // file (`keep` was there before).
    assert!(std::fs::symlink_metadata(s.root.join("in/x/f")).is_err());
    for p in tree(&s.root.join("in")) {
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            p.is_dir() || n.starts_with(".f.lh-") || n == "keep",
            "unexpected {}",
            p.display()
        );
        if !p.is_dir() {
            std::fs::remove_file(&p).unwrap();
        }
    }
    assert_nothing_escaped(&s, &[]);
    normal_get_works(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_session_with_hostile_wants() {
    let s = start();
    // A Want for a file the manifest never named.
    let mut r = get_session(&s).await;
    r.frame(&Frame::Want {
        id: 12345,
        want: Want::All,
    })
    .await;
    r.expect_fatal(ErrorCode::Protocol, &["Want for unknown file 12345"])
        .await;
    // Chunk ranges outside the file.
    let mut r = connect(&s).await;
    r.hello(Op::Get {
        paths: vec![b"data.bin".to_vec()],
        filters: vec![],
        meta: Default::default(),
        listed: false,
    })
    .await;
    r.welcome().await;
    let id = loop {
        match r.next().await {
            Some(Frame::Entry(e)) if e.kind == EntryKind::File => break e.id,
            Some(_) => {}
            None => panic!("no manifest"),
        }
    };
    r.frame(&Frame::Want {
        id,
        want: Want::Chunks(vec![(0, 1_000_000)]),
    })
    .await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &[&format!(
            "chunk range 0..1000000 outside file {id} of 1 chunks"
        )],
    )
    .await;
    // Get requests for paths outside the root are answered with a RootError.
    let mut r = connect(&s).await;
    r.hello(Op::Get {
        paths: vec![b"../outside".to_vec(), b"/etc/passwd".to_vec()],
        filters: vec![],
        meta: Default::default(),
        listed: false,
    })
    .await;
    r.welcome().await;
    let mut errors = Vec::new();
    loop {
        match r.next().await {
            Some(Frame::RootError {
                root,
                code,
                message,
            }) => errors.push((root, code, message)),
            Some(Frame::ManifestEnd) => break,
            other => panic!("expected RootErrors then ManifestEnd, got {other:?}"),
        }
    }
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(errors[0].1, ErrorCode::BadPath);
    assert!(
        errors[0].2.contains("'..' would leave the root"),
        "{errors:?}"
    );
    assert_eq!(errors[1].1, ErrorCode::BadPath);
    assert!(errors[1].2.contains("absolute path"), "{errors:?}");
    r.frame(&Frame::Done {
        ok: false,
        behind_ms: 0,
    })
    .await;
    let _ = r.send.finish();
    normal_get_works(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fresh_put_data() {
    let s = start();
    // A fresh put (in/x absent): no Want; a record may come before its entry.
    async fn fresh(s: &Srv) -> Raw {
        let mut r = put_hello(s).await;
        assert!(r.welcome().await, "in/x absent: fresh");
        r.frame(&entry(1, b"", EntryKind::Dir, 0, b"")).await;
        r
    }
    // The record of file 2 first, its entry 300 ms later: held, then placed.
    let body = b"early bird";
    let mut r = fresh(&s).await;
    let hash = *blake3::hash(body).as_bytes();
    data(&r, &record_with(2, 0, body.len() as u32, body, Some(&hash))).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.frame(&entry(2, b"f", EntryKind::File, body.len() as u64, b""))
        .await;
    r.frame(&Frame::ManifestEnd).await;
    let mut frames = Vec::new();
    loop {
        match r.next().await {
            Some(Frame::Done { ok, .. }) => {
                assert!(ok, "{frames:?}");
                break;
            }
            Some(f) => frames.push(f),
            None => panic!("no Done; frames: {frames:?}"),
        }
    }
    assert!(
        frames.iter().all(|f| !matches!(f, Frame::Want { .. })),
        "{frames:?}"
    );
    assert_eq!(std::fs::read(s.root.join("in/x/f")).unwrap(), body);

    // Data for a file never announced, in a new fresh destination: refused
    // once the manifest has ended (file 2, still owed, keeps the session on).
    std::fs::remove_dir_all(s.root.join("in")).unwrap();
    let mut r = fresh(&s).await;
    r.frame(&entry(2, b"f", EntryKind::File, 10, b"")).await;
    data(&r, &record(999, 0, 10, b"0123456789")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    r.frame(&Frame::ManifestEnd).await;
    r.expect_fatal(
        ErrorCode::Protocol,
        &["data for unknown or settled file 999"],
    )
    .await;

    // More data ahead of the manifest than the receiver holds (64 MiB):
    // it stops reading (flow control holds the sender) instead of failing,
    // and places everything once the entries come.
    std::fs::remove_dir_all(s.root.join("in")).unwrap();
    let mut r = fresh(&s).await;
    let files: Vec<Vec<u8>> = (0..80u8).map(|i| vec![i; 1 << 20]).collect();
    let writer = {
        let (conn, files) = (r.conn.clone(), files.clone());
        tokio::spawn(async move {
            for (i, body) in files.iter().enumerate() {
                let hash = *blake3::hash(body).as_bytes();
                let rec = record_with(2 + i as u64, 0, 1 << 20, body, Some(&hash));
                let mut u = conn.open_uni().await.unwrap();
                u.write_all(&rec).await.unwrap();
                let _ = u.finish();
            }
        })
    };
    // (Before this bound held the reading back, 64 MiB waiting ended the
    // session: "more than 67.11 MB of data waits for manifest entries".)
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..80u64 {
        let name = format!("f{i}");
        r.frame(&entry(
            2 + i,
            name.as_bytes(),
            EntryKind::File,
            1 << 20,
            b"",
        ))
        .await;
    }
    r.frame(&Frame::ManifestEnd).await;
    loop {
        match r.next().await {
            Some(Frame::Done { ok, .. }) => {
                assert!(ok);
                break;
            }
            Some(Frame::Fatal { message, .. }) => panic!("{message}"),
            Some(_) => {}
            None => panic!("no Done"),
        }
    }
    writer.await.unwrap();
    for (i, body) in files.iter().enumerate() {
        assert_eq!(
            &std::fs::read(s.root.join(format!("in/x/f{i}"))).unwrap(),
            body
        );
    }

    // A sender that never announces its data: refused when its manifest
    // ends (it had the control stream's credit for it all along).
    std::fs::remove_dir_all(s.root.join("in")).unwrap();
    let mut r = fresh(&s).await;
    let writer = {
        let conn = r.conn.clone();
        tokio::spawn(async move {
            let mib = vec![1u8; 1 << 20];
            for _ in 0..66 {
                let Ok(mut u) = conn.open_uni().await else {
                    return;
                };
                if u.write_all(&record(5, 0, 1 << 20, &mib)).await.is_err() {
                    return;
                }
                let _ = u.finish();
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    r.frame(&Frame::ManifestEnd).await;
    r.expect_fatal_frame(ErrorCode::Protocol, &["data for unknown or settled file 5"])
        .await;
    writer.abort();
    normal_get_works(&s).await;
}

/// A raw Hello of a put of `in/x` over `connections` with session key `key`.
async fn put_over(s: &Srv, connections: u32, key: &[u8]) -> Raw {
    let mut r = connect(s).await;
    r.frame(&Frame::Hello(Hello {
        version: VERSION,
        token: vec![],
        op: Op::Put {
            dest: b"in".to_vec(),
            dest_is_dir: true,
            roots: vec![RootSpec {
                name: b"x".to_vec(),
            }],
            sync: PutSync::Always,
            durable: false,
            specials: false,
            delete: false,
            filters: vec![],
            dry_run: false,
            numeric_ids: false,
            shard: None,
        },
        max_rate: 0,
        cc: None,
        fresh: false,
        streams: 0,
        connections,
        session: key.to_vec(),
    }))
    .await;
    r
}

/// A raw connection whose first frame is a `Join`.
async fn join_as(s: &Srv, version: u32, key: &[u8], index: u32) -> Raw {
    let mut r = connect(s).await;
    r.frame(&Frame::Join {
        version,
        token: vec![],
        session: key.to_vec(),
        index,
    })
    .await;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joins_to_no_session_or_past_its_connections() {
    let s = start();
    // Too many connections, or a session key of the wrong size.
    put_over(&s, MAX_CONNECTIONS + 1, &[1; SESSION_KEY_LEN])
        .await
        .expect_fatal(ErrorCode::Protocol, &["at most 16 connections, not 17"])
        .await;
    put_over(&s, 2, b"short")
        .await
        .expect_fatal(ErrorCode::Protocol, &["a session key is 16 bytes"])
        .await;
    // A Join of another version.
    join_as(&s, 99, &[2; SESSION_KEY_LEN], 1)
        .await
        .expect_fatal(
            ErrorCode::Version,
            &["protocol version 99 is not supported"],
        )
        .await;
    // A session over 2 connections: its connection 1 may join once, no
    // other index; a second session may not take its key.
    let key = [3; SESSION_KEY_LEN];
    let mut first = put_over(&s, 2, &key).await;
    assert!(first.welcome().await, "a fresh put");
    join_as(&s, VERSION, &key, 2)
        .await
        .expect_fatal(ErrorCode::Protocol, &["connection 2 cannot join"])
        .await;
    join_as(&s, VERSION, &key, 0)
        .await
        .expect_fatal(ErrorCode::Protocol, &["connection 0 cannot join"])
        .await;
    put_over(&s, 2, &key)
        .await
        .expect_fatal(
            ErrorCode::Protocol,
            &["another session has this session key"],
        )
        .await;
    let joined = join_as(&s, VERSION, &key, 1).await;
    // Once it has joined, the index is taken for the session's life; a key
    // no open session has is refused at once.
    join_as(&s, VERSION, &key, 1)
        .await
        .expect_fatal(ErrorCode::Protocol, &["connection 1 cannot join"])
        .await;
    join_as(&s, VERSION, &[4; SESSION_KEY_LEN], 1)
        .await
        .expect_fatal(ErrorCode::Protocol, &["no session to join with this key"])
        .await;
    assert!(
        joined.conn.close_reason().is_none(),
        "the joined connection is still up"
    );
    // The session's end closes the connection that joined it.
    drop(first);
    let closed = tokio::time::timeout(Duration::from_secs(20), joined.conn.closed()).await;
    assert!(
        closed.is_ok(),
        "the joined connection was closed with its session"
    );
    drop(joined);
    normal_get_works(&s).await;
}

/// The server sends two TLS session tickets per connection (a client that
/// keeps them resumes in 0-RTT; a short 0-RTT transfer ends before its own
/// come, and uses the spare next time), after the client's Finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_sends_two_session_tickets() {
    let s = start();
    let r = get_session(&s).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(r.tickets.get(), 2, "session tickets received");
    assert!(s.srv.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listed_get_with_a_bad_list_is_refused_precisely() {
    let s = start();
    let listed = || Op::Get {
        paths: vec![b"data.bin".to_vec()],
        filters: vec![],
        meta: Default::default(),
        listed: true,
    };
    let cases: Vec<(Vec<Frame>, &str)> = vec![
        (
            vec![Frame::Only(vec![(5, b"x".to_vec())])],
            "a listed path of root 5, of 1",
        ),
        (vec![Frame::Only(vec![(0, b"../x".to_vec())])], ".."),
        (
            vec![Frame::Only(vec![(0, Vec::new())])],
            "names a root itself",
        ),
        (
            vec![Frame::Want {
                id: 1,
                want: Want::All,
            }],
            "among a listed get's paths",
        ),
    ];
    for (frames, needle) in cases {
        let mut r = connect(&s).await;
        r.hello(listed()).await;
        r.welcome().await;
        for f in &frames {
            r.frame(f).await;
        }
        r.expect_fatal(ErrorCode::Protocol, &[needle]).await;
    }
    // A good list: the root's own entry and the file asked for, no walk.
    let mut r = connect(&s).await;
    r.hello(listed()).await;
    r.welcome().await;
    r.frame(&Frame::OnlyEnd).await;
    let mut entries = Vec::new();
    while let Some(f) = r.next().await {
        match f {
            Frame::Entry(e) => entries.push(e.path),
            Frame::ManifestEnd => break,
            _ => {}
        }
    }
    assert_eq!(entries, [Vec::<u8>::new()], "only the root's own entry");
}
