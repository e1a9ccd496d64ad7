//! A session's end does not hang on the client's close, a single datagram:
//! a raw client that finishes its role and then never closes (as if its
//! close were lost) still sees the server close the session at once, and the
//! server logs the session as done, instead of holding it (its memory, a
//! put's files) until the idle timeout.

use longhaul_quic::proto::{Frame, Op, PutSync, RootSpec};
use longhaul_testkit::raw::Raw;
use longhaul_testkit::*;
use longhaul_transfer::{Entry, EntryKind};
use std::time::{Duration, Instant};

fn dir_entry() -> Frame {
    Frame::Entry(Entry {
        id: 1,
        root: 0,
        path: vec![],
        kind: EntryKind::Dir,
        size: 0,
        mode: 0o755,
        mtime_ns: 1_600_000_000_000_000_000,
        link: vec![],
        owner: Default::default(),
        xattrs: vec![],
        allocated: 0,
    })
}

/// The server's close of `r`'s connection, and how long after `since`.
async fn closed_by_server(r: &Raw, since: Instant) -> (String, Duration) {
    let e = tokio::time::timeout(Duration::from_secs(10), r.conn.closed())
        .await
        .expect("the server did not close the session within 10 s");
    (e.to_string(), since.elapsed())
}

#[test]
fn the_server_closes_a_finished_session_itself() {
    let t = Tmp::new("close");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::create_dir_all(root.join("in")).unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let addr = format!("127.0.0.1:{}", srv.port).parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A get of an empty directory: the client says Done and stays silent.
        let mut r = Raw::connect(addr, t.join("kh")).await;
        r.hello(Op::Get {
            paths: vec![b"empty".to_vec()],
            filters: vec![],
            meta: Default::default(),
            listed: false,
        })
        .await;
        r.welcome().await;
        assert!(matches!(r.next().await, Some(Frame::Entry(_))));
        assert_eq!(r.next().await, Some(Frame::ManifestEnd));
        r.frame(&Frame::Done {
            ok: true,
            behind_ms: 0,
        })
        .await;
        let (why, after) = closed_by_server(&r, Instant::now()).await;
        assert!(why.contains("done"), "{why}");
        assert!(after < Duration::from_secs(2), "closed after {after:?}");

        // A put of an empty directory: the server's Done, then its close
        // once the client has acknowledged it, while the client stays silent.
        let mut r = Raw::connect(addr, t.join("kh")).await;
        r.hello(Op::Put {
            dest: b"in".to_vec(),
            dest_is_dir: true,
            roots: vec![RootSpec {
                name: b"d".to_vec(),
            }],
            sync: PutSync::SizeMtime,
            durable: true,
            specials: false,
            delete: false,
            filters: vec![],
            dry_run: false,
            numeric_ids: false,
            shard: None,
        })
        .await;
        r.welcome().await;
        r.frame(&dir_entry()).await;
        r.frame(&Frame::ManifestEnd).await;
        let t0 = Instant::now();
        assert_eq!(
            r.next().await,
            Some(Frame::Done {
                ok: true,
                behind_ms: 0
            })
        );
        let (why, after) = closed_by_server(&r, t0).await;
        assert!(why.contains("done"), "{why}");
        assert!(after < Duration::from_secs(2), "closed after {after:?}");
    });
    assert!(root.join("in/d").is_dir());
    let log = srv.log_text();
    assert_eq!(log.matches("0 problem(s)").count(), 2, "{log}");
}
