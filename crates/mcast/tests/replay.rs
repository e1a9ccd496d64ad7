//! Keyed multicast refuses replays: a session recorded off the wire and
//! sent again (after a newer one, after a receiver restart) opens nothing
//! and rolls nothing back, and one made longer ago than the replay window
//! is refused for its age.

use longhaul_mcast::seal::Key;
use longhaul_mcast::store::{wall_clock_us, FileSet, FileStore, REPLAY_WINDOW};
use longhaul_mcast::{Group, Receiver, ReceiverConfig, ReceiverEvent, Sender, SenderConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const KEY: &[u8] = b"a shared key of thirty-two bytes";

/// A receiver with the key, and its store on `dest` (the sessions it took
/// kept beside it): started afresh, as after a restart.
fn keyed_receiver(dest: &Path) -> (Receiver, FileStore) {
    let mut rc = ReceiverConfig::new("rx");
    rc.key_material = Some(KEY.to_vec());
    let store = FileStore::new(dest)
        .unwrap()
        .sessions_file(dest.with_extension("sessions"));
    (Receiver::new(rc).unwrap(), store)
}

/// What a fresh receiver on `dest` made of `wire` (datagrams from the
/// sender), and how many datagrams it sent back.
fn receive(dest: &Path, wire: &[Vec<u8>]) -> (Vec<ReceiverEvent>, usize) {
    let (mut rx, mut store) = keyed_receiver(dest);
    let from: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    let now = Instant::now();
    let mut replies = 0;
    for d in wire {
        rx.handle(now, from, &mut d.clone(), &mut store);
        while rx.poll_transmit().is_some() {
            replies += 1;
        }
    }
    let mut events = Vec::new();
    while let Some(e) = rx.poll_event() {
        events.push(e);
    }
    (events, replies)
}

/// Sends `src` (a directory) made at `created_us` to a receiver on `dest`,
/// in lock step; returns every datagram the sender sent, and whether the
/// receiver completed it.
fn session(src: &Path, dest: &Path, id: u64, created_us: u64) -> (Vec<Vec<u8>>, bool) {
    let mut files = FileSet::build(&[src.to_path_buf()], Default::default(), |_| {}).unwrap();
    let cfg = SenderConfig {
        group: Group::Closed(vec!["rx".into()]),
        announce_window: Duration::from_millis(50),
        created_us,
        ..SenderConfig::default()
    };
    let t0 = Instant::now();
    let key = Key::from_material(KEY, id).unwrap();
    let manifest = files.manifest.encode();
    let len = files.manifest.data_len();
    let mut tx = Sender::new(cfg, id, Some(key), manifest, len, t0).unwrap();
    let (mut rx, mut store) = keyed_receiver(dest);
    let (sender, me): (SocketAddr, SocketAddr) = (
        "10.0.0.1:5000".parse().unwrap(),
        "10.0.0.2:6000".parse().unwrap(),
    );
    let (mut wire, mut out, mut now, mut ok) = (Vec::new(), Vec::new(), t0, None);
    while ok.is_none() && now < t0 + Duration::from_secs(30) {
        while let Some(_to) = tx.poll_transmit(now, &mut files, &mut out).unwrap() {
            wire.push(out.clone());
            rx.handle(now, sender, &mut out.clone(), &mut store);
        }
        if rx.poll_timeout().is_some_and(|t| t <= now) {
            rx.handle_timeout(now, &mut store);
        }
        while let Some((_, mut b)) = rx.poll_transmit() {
            tx.handle(now, me, &mut b);
        }
        while let Some(e) = rx.poll_event() {
            if let ReceiverEvent::Ended(r) = e {
                ok = Some(r.ok);
            }
        }
        while tx.poll_event().is_some() {}
        now += Duration::from_millis(1);
    }
    (wire, ok == Some(true))
}

/// A temporary directory with `products/NAME` holding `data`, and an empty
/// `dest`.
fn dirs(name: &str, data: &[u8]) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (src, dest) = (t.path().join("products"), t.path().join("dest"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(src.join(name), data).unwrap();
    (t, src, dest)
}

#[test]
fn a_recorded_session_replayed_after_a_newer_one_and_a_restart_changes_nothing() {
    let (_t, src, dest) = dirs("forecast.grib", b"version 1");
    let (v1, ok) = session(&src, &dest, 0x1111, wall_clock_us());
    assert!(ok, "v1 completes");
    std::fs::write(src.join("forecast.grib"), b"version 2, newer").unwrap();
    let (_, ok) = session(&src, &dest, 0x2222, wall_clock_us());
    assert!(ok, "v2 completes");
    let target = dest.join("products/forecast.grib");
    assert_eq!(std::fs::read(&target).unwrap(), b"version 2, newer");

    // A fresh receiver (a restart) on the same destination hears v1 again.
    let (events, replies) = receive(&dest, &v1);
    assert_eq!(replies, 0, "no REGISTER for a replay");
    let refused: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            ReceiverEvent::Refused { session, why, .. } => Some((*session, why.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 1, "{events:?}");
    assert_eq!(refused[0].0, 0x1111);
    assert!(refused[0].1.contains("a replay"), "{}", refused[0].1);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ReceiverEvent::Started { .. })),
        "{events:?}"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"version 2, newer");
}

#[test]
fn a_session_made_longer_ago_than_the_window_is_refused_for_its_age() {
    let (_t, src, dest) = dirs("old.bin", b"old");
    let long_ago = wall_clock_us() - REPLAY_WINDOW.as_micros() as u64 - 5_000_000;
    let (wire, ok) = session(&src, &dest, 0x3333, long_ago);
    assert!(!ok);
    let (events, _) = receive(&dest, &wire[..1]);
    assert!(
        events.iter().any(|e| matches!(e,
            ReceiverEvent::Refused { why, .. } if why.contains("s ago, more than 600 s: a replay"))),
        "{events:?}"
    );
    assert!(!dest.join("products").exists(), "nothing written");
}
