//! A hostile client that leaves holes in its streams: bytes far into
//! protected (tail-repair) data streams with nothing before them, which the
//! server must hold until the gap is filled. A receiver that zero-filled up
//! to the furthest byte let ~34 kB pin hundreds of MB; one that keeps the
//! pieces that came holds what came. The server runs as its own process, so
//! its resident memory is what is measured. The client leaves its holes
//! with the testkit's patched quinn (`hole-injection`: bytes that are never
//! sent and never resent).

use longhaul_quic::proto::REPAIRED_PRELUDE;
use longhaul_testkit::raw::Raw;
use longhaul_testkit::*;
use std::ffi::OsString;
use std::time::{Duration, Instant};

/// Streams, and on each the hole before the data and the data after it:
/// 64 MiB of holes, 1 MiB that comes.
const STREAMS: usize = 64;
const HOLE: usize = 1 << 20;
const DATA: usize = 16 << 10;

/// The server's resident memory, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// A put session up to its Welcome.
async fn session(port: u16, kh: std::path::PathBuf) -> Raw {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut r = Raw::connect(addr, kh).await;
    r.put_hello(b"in", b"x").await;
    r.welcome().await;
    r
}

/// `STREAMS` data streams, each with the repair prelude, then a hole of
/// `HOLE` bytes, then `DATA` bytes; returns once all of it is out.
async fn holes(r: &Raw) {
    for _ in 0..STREAMS {
        let mut s = r.conn.open_uni().await.unwrap();
        s.write_all(REPAIRED_PRELUDE).await.unwrap();
        let mut left = HOLE;
        let t0 = Instant::now();
        while left > 0 {
            match s.skip(left).unwrap() {
                0 => {
                    assert!(
                        t0.elapsed() < Duration::from_secs(10),
                        "the hole never went"
                    );
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                n => left -= n,
            }
        }
        s.write_all(&[0x5a; DATA]).await.unwrap();
    }
}

#[test]
fn holes_in_streams_cost_the_server_what_came_not_the_gaps() {
    let t = Tmp::new("holes");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = ServeCfg::new(&root, &t.join("state")).writable().start();
    let pid = srv.pid().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // The session is up (what any session costs is in the baseline).
    let r = rt.block_on(session(srv.port, t.join("kh")));
    std::thread::sleep(Duration::from_millis(300));
    let before = rss(pid);
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), holes(&r))
            .await
            .expect("the holes went out within 60 s")
    });
    // What came is in the server's hands (the data streams are read as
    // they come).
    std::thread::sleep(Duration::from_secs(1));
    let after = rss(pid);
    assert!(
        r.conn.close_reason().is_none(),
        "the session is still up, its streams held: {:?}",
        r.conn.close_reason()
    );
    let grew = after.saturating_sub(before);
    eprintln!(
        "server RSS {:.1} MB before, {:.1} MB with {} MiB of holes and {} MiB that came ({:+.1} MB)",
        before as f64 / 1e6,
        after as f64 / 1e6,
        (STREAMS * HOLE) >> 20,
        (STREAMS * DATA) >> 20,
        grew as f64 / 1e6
    );
    assert!(
        grew <= 16 << 20,
        "the server grew by {:.1} MB",
        grew as f64 / 1e6
    );
    rt.block_on(async { r.conn.close(0u32.into(), b"done") });
    drop(r);

    // And it still serves.
    let src = t.join("src");
    gen_file(&src, 3, 3 << 20);
    let out = Client::new(t.join("kh2")).run(
        "put",
        [
            OsString::from("--accept-new"),
            "--quiet".into(),
            src.clone().into(),
            srv.remote("after"),
        ],
    );
    out.expect_code(0);
    assert_eq!(hash_file(&root.join("after")), hash_file(&src));
}
