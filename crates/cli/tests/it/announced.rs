//! Files announced and never sent cost the receiver no more than its budget
//! of locked parts: hostile put sessions that announce 1,000 files of 2 MiB
//! (each answered with a `Want`, each part set up) and send no data leave
//! the server with a few dozen descriptors, and an honest put goes through
//! beside them. The server runs as its own process with 256 open files at
//! most, as one run by a user whose limit is low.

use longhaul_quic::proto::{Frame, Op, PutSync, RootSpec};
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
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut r = Raw::connect(addr, kh).await;
    r.hello(Op::Put {
        dest: b"in".to_vec(),
        dest_is_dir: true,
        roots: vec![RootSpec {
            name: b"x".to_vec(),
        }],
        sync: PutSync::Always,
        durable: false,
    })
    .await;
    assert!(!r.welcome().await, "in/x holds a file: not fresh");
    let entry = |id: u64, path: Vec<u8>, kind: EntryKind, size: u64| {
        Frame::Entry(Entry {
            id,
            root: 0,
            path,
            kind,
            size,
            mode: 0o644,
            mtime_ns: 1_600_000_000_000_000_000,
            link: vec![],
        })
    };
    r.frame(&entry(1, vec![], EntryKind::Dir, 0)).await;
    for i in 0..FILES {
        let name = format!("s{session}-f{i:03}").into_bytes();
        r.frame(&entry(2 + i, name, EntryKind::File, 2 << 20)).await;
    }
    let mut wants = 0;
    while wants < FILES {
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
    drop(sessions);
    assert!(srv.alive());
}
