//! A flood of QUIC opening packets, as from forged source addresses: real
//! Initials (a fresh connection ID and ClientHello each, so the server must
//! derive keys and decrypt every one), sent from sockets that never read what
//! comes back, so no handshake ever completes and no Retry is ever answered.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `n` distinct opening packets (QUIC Initials, each at least 1200 bytes)
/// for `server`.
pub fn initials(server: SocketAddr, n: usize) -> Vec<Vec<u8>> {
    let cfg = crate::raw::client_config(server, None);
    let mut ep = quinn_proto::Endpoint::new(Arc::new(Default::default()), None, false, None);
    let now = Instant::now();
    (0..n)
        .map(|_| {
            let (_, mut c) = ep
                .connect(now, cfg.clone(), server, "longhaul")
                .expect("a client connection");
            let mut buf = Vec::with_capacity(1500);
            let t = c.poll_transmit(now, 1, &mut buf).expect("an Initial");
            buf.truncate(t.size);
            buf
        })
        .collect()
}

/// A flood being sent; [`Flood::stop`] ends it.
pub struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<usize>,
}

impl Flood {
    /// Sends `packets` to `server` at about `per_second`, over and over until
    /// stopped, from 32 sockets on 127.0.0.2–33 that are never read.
    pub fn start(server: SocketAddr, packets: Vec<Vec<u8>>, per_second: u32) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let sent_so_far = Arc::new(AtomicUsize::new(0));
        let counter = sent_so_far.clone();
        let thread = std::thread::spawn(move || {
            let socks: Vec<UdpSocket> = (2..34)
                .map(|i| UdpSocket::bind(format!("127.0.0.{i}:0")).expect("a flood socket"))
                .collect();
            let t0 = Instant::now();
            let mut sent = 0usize;
            while !s.load(Ordering::Relaxed) {
                for _ in 0..100 {
                    let p = &packets[sent % packets.len()];
                    let _ = socks[sent % socks.len()].send_to(p, server);
                    sent += 1;
                }
                counter.store(sent, Ordering::Relaxed);
                let due = t0 + Duration::from_secs_f64(sent as f64 / per_second as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            sent
        });
        Flood {
            stop,
            sent: sent_so_far,
            thread,
        }
    }

    /// Waits until at least `n` packets have been sent (a loaded machine may
    /// send slower than asked); false if `limit` passed first.
    pub fn wait_for(&self, n: usize, limit: Duration) -> bool {
        let t0 = Instant::now();
        while self.sent.load(Ordering::Relaxed) < n {
            if t0.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Stops the flood; the packets sent.
    pub fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the flood thread")
    }
}
