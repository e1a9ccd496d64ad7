//! Handshakes that never finish must not lock honest clients out: a flood
//! of opening packets from addresses that never answer (as forged ones
//! would), and connections that finish their handshake and never say
//! Hello, while a client with the token gets its file.

use longhaul_quic::Progress;
use longhaul_testkit::flood::{initials, Flood};
use longhaul_testkit::raw::Raw;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: &[u8] = b"the-token-of-the-honest-client-0123";

fn setup(t: &Path, max_sessions: usize) -> (crate::common::Served, Vec<u8>) {
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("f.bin"), &data).unwrap();
    let mut o = crate::common::opts(&root, &t.join("state"), true);
    o.token = Some(TOKEN.to_vec());
    o.max_sessions = max_sessions;
    (crate::common::serve_with(o), data)
}

/// An honest get of `f.bin` with the token; how long it took.
async fn honest_get(srv: &crate::common::Served, t: &Path, dest: &str) -> Duration {
    let dest = t.join(dest);
    std::fs::create_dir(&dest).unwrap();
    let mut opts = srv.client(t.join("known_hosts"));
    opts.token = TOKEN.to_vec();
    let t0 = Instant::now();
    let r = longhaul_quic::get(
        "127.0.0.1",
        srv.addr.port(),
        &["f.bin"],
        &dest,
        &opts,
        Arc::new(Progress::default()),
    )
    .await;
    let took = t0.elapsed();
    let r = r.expect("the honest get succeeds");
    assert!(r.ok, "{r:?}");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_get_succeeds_within_2_s_during_a_flood_of_10000_opening_packets() {
    let t = tempfile::tempdir().unwrap();
    let (srv, data) = setup(t.path(), longhaul_quic::DEFAULT_MAX_SESSIONS);
    let addr = srv.addr;
    let packets = tokio::task::spawn_blocking(move || initials(addr, 10_000))
        .await
        .unwrap();
    // 10,000 before the honest client starts, and more while it runs.
    let flood = Flood::start(srv.addr, packets, 20_000);
    let flood = tokio::task::spawn_blocking(move || {
        assert!(
            flood.wait_for(10_000, Duration::from_secs(30)),
            "the flood did not send 10,000 packets in 30 s"
        );
        flood
    })
    .await
    .unwrap();
    let took = honest_get(&srv, t.path(), "d1").await;
    let sent = flood.stop();
    eprintln!("an honest get of 1 MB took {took:?} during a flood of {sent} opening packets");
    assert!(sent >= 10_000, "the flood sent only {sent} packets");
    assert!(
        took < Duration::from_secs(2),
        "the get took {took:?} during a flood of {sent} opening packets"
    );
    assert_eq!(std::fs::read(t.path().join("d1/f.bin")).unwrap(), data);
    assert!(srv.is_running());
    // And once the flood is over, at once.
    let took = honest_get(&srv, t.path(), "d2").await;
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// Connections that finished their handshake and never send a Hello are
/// not sessions: at --max-sessions 1, twenty of them leave the one session
/// to an honest client (they used to take 16 × max-sessions slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_a_hello_do_not_count_as_sessions() {
    let t = tempfile::tempdir().unwrap();
    let (srv, data) = setup(t.path(), 1);
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(Raw::connect(srv.addr, t.path().join("kh-silent")).await);
    }
    let took = honest_get(&srv, t.path(), "d").await;
    assert_eq!(std::fs::read(t.path().join("d/f.bin")).unwrap(), data);
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The silent ones are closed once their time for a Hello is up (they
    // opened no control stream the server could see).
    let closed = tokio::time::timeout(Duration::from_secs(15), silent[0].conn.closed())
        .await
        .expect("the server closes a connection without a Hello");
    assert!(
        matches!(closed, quinn::ConnectionError::ApplicationClosed(ref a) if &a.reason[..] == b"no control stream"),
        "{closed:?}"
    );
}
