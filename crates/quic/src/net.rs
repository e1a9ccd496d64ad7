//! Endpoints and transport parameters: UDP sockets with large buffers, flow-control
//! windows sized from the bandwidth-delay product under a memory bound, and the
//! congestion controller factory.

use crate::cc::{CcChoice, CcFactory, CcHandle};
use crate::ramp::Series;
use anyhow::{Context, Result};
use quinn::{MtuDiscoveryConfig, TransportConfig, VarInt};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The UDP port a server listens on, and a client connects to, when none is
/// given.
pub const DEFAULT_PORT: u16 = 7878;

/// Flow-control and rate settings of one side.
#[derive(Debug, Clone, Copy)]
pub struct NetOpts {
    /// Memory bound of the receive window (bytes): what a receiver lets in flight.
    pub max_window: u64,
    /// Rate to plan the first window for (bits/s): `--max-rate`, or 1 Gbit/s.
    pub rate_hint: u64,
    /// The congestion controller this side runs when it sends, unless one is
    /// asked for: a client's `ClientOpts::cc` comes first, and a server
    /// switches to what a client's `Hello.cc` names. Default `wan`.
    pub cc: CcChoice,
    /// Cap on the sending rate (bits/s), 0 = none.
    pub max_rate: u64,
}

impl Default for NetOpts {
    fn default() -> Self {
        NetOpts {
            max_window: 1 << 30,
            rate_hint: 1_000_000_000,
            cc: CcChoice::Wan(0),
            max_rate: 0,
        }
    }
}

/// Largest UDP payload longhaul sends where the path allows: a jumbo-frame
/// link's (MTU 9000 less IPv4 and UDP headers), and loopback's. A 1500-byte
/// link gets its MTU less IP and UDP headers (1472 over IPv4). A GSO batch
/// must fit one 64 KiB UDP datagram (65,507 bytes; a larger one fails with
/// EMSGSIZE, which quinn-udp drops without a word): longhaul's patched quinn
/// sizes its batches by bytes, 7 of these or 45 at a 1,500-byte MTU. Above
/// 16,383 bytes quinn's long-header length would not fit its 2-byte varint.
pub(crate) const MAX_UDP_PAYLOAD: u16 = 8972;

/// The most ack-eliciting packets a receiver may take before it sends an
/// ACK. The sender (longhaul's patched quinn) asks for one ACK per
/// sixteenth of its flight or per 2 ms of packets at the flight's rate,
/// whichever is fewer (a power of two, at least 1): below 32 packets in
/// flight or about 700 a second (slow links, seed 001's 10 Mbit/s at 300
/// ms, start-up, the tail) every other packet is acknowledged as without
/// the extension. When it runs out of data it asks for the ACK at once
/// (IMMEDIATE_ACK).
const MAX_ACK_THRESHOLD: u32 = 128;

/// Data streams a peer may have open at once. A stream of 1 MiB (the sender
/// rotates at that, but on slow links) stays open until all of it, retransmissions included, is
/// read: with loss that is two to three round trips, so 256 held a sender to
/// about 2 BDP at 1 Gbit/s and 1 s, and at 1e-2 loss it stalled for half a
/// second every few (the lab: rounds of 150-570 Mbit/s among 900s, the
/// controller's window unchanged). 1024 covers 1 GiB in flight; memory stays
/// bounded by the connection window.
pub(crate) const MAX_UNI_STREAMS: u32 = 1024;

/// Bytes of datagrams (tail repair) quinn queues to send, and holds received
/// until read.
const DATAGRAM_BUFFER: usize = 8 << 20;

/// Smallest window ever used: enough for 1 Gbit/s at 100 ms.
pub(crate) const MIN_WINDOW: u64 = 16 << 20;

/// The first send window (stream data written and not yet acknowledged),
/// whatever the rate hint: what a session holds for a peer that
/// acknowledges nothing (a client killed mid-transfer, until the idle
/// timeout). The window then follows what the path carries
/// ([`spawn_window_tuner`]): four times the congestion window, checked
/// every RTT. A first window of the hint's BDP (125 MB at 1 Gbit/s) let 64
/// vanished clients hold 2.6-3.1 GB of a server.
pub(crate) const FIRST_SEND_WINDOW: u64 = 4 << 20;

impl NetOpts {
    /// First receive window: the BDP of the rate hint over a 1 s RTT (the longest
    /// path we plan for), within [MIN_WINDOW, max_window].
    pub fn initial_window(&self) -> u64 {
        let bdp = self.rate_hint / 8;
        bdp.clamp(MIN_WINDOW.min(self.max_window), self.max_window)
    }

    /// Transport parameters for a connection with `peer`; `probe_mtu`: this
    /// side sends data and probes its path's MTU (a get's client, which sends
    /// only ACKs and small control frames, does not).
    pub fn transport(
        &self,
        peer: SocketAddr,
        factory: Arc<CcFactory>,
        probe_mtu: bool,
    ) -> TransportConfig {
        let w = VarInt::from_u64(self.initial_window()).unwrap_or(VarInt::MAX);
        let bound = VarInt::from_u64(self.max_window).unwrap_or(VarInt::MAX);
        let mut t = TransportConfig::default();
        t.stream_receive_window(bound)
            .receive_window(w)
            .send_window(FIRST_SEND_WINDOW.min(self.max_window))
            .max_concurrent_uni_streams(VarInt::from_u32(MAX_UNI_STREAMS))
            .max_concurrent_bidi_streams(VarInt::from_u32(1))
            .max_idle_timeout(Some(VarInt::from_u32(15_000).into()))
            .keep_alive_interval(Some(Duration::from_secs(5)))
            // The RTT assumed until the handshake measures one; quinn's
            // first probe timeout is three times it. Where the handshake
            // takes longer (seed 001's 256 kbit/s, 250 ms path: 330 ms)
            // both sides send their first flight twice more, 4.9 kB; 200 ms
            // saved that but cost 0.3-0.55 s at 10 % loss, where those early
            // copies are the repair (docs/PERFORMANCE.md, "Tried, not
            // adopted").
            .initial_rtt(Duration::from_millis(100))
            // Data streams go in the order they were written, not round-robin
            // a packet each: the receiver reads longer runs of one stream,
            // 10-15 % less client CPU per GB on the lab's 1 Gbit/s path
            // (docs/PERFORMANCE.md, "CPU per byte"); the control stream's
            // priority still puts it first.
            .send_fairness(false)
            // Tail repair's symbols (protocol 9): a 256 MiB last window at
            // 1e-2 loss sends about 5 MiB of them, mostly ahead of its
            // queued stream data; quinn drops the oldest past these bounds.
            .datagram_send_buffer_size(DATAGRAM_BUFFER)
            .datagram_receive_buffer_size(Some(DATAGRAM_BUFFER))
            .congestion_controller_factory(factory);
        // Probe up to what the outgoing interface allows, at most MAX_UDP_PAYLOAD.
        let mtu = probe_mtu.then(|| {
            let upper = path_payload(peer)
                .unwrap_or(MAX_UDP_PAYLOAD)
                .clamp(1200, MAX_UDP_PAYLOAD);
            let mut mtu = MtuDiscoveryConfig::default();
            mtu.upper_bound(upper).minimum_change(probe_step(upper));
            mtu
        });
        t.mtu_discovery_config(mtu);
        // The side that sends data asks its peer for fewer ACKs once much
        // is in flight (longhaul's patched quinn: the threshold follows the
        // flight, [`MAX_ACK_THRESHOLD`]).
        if probe_mtu {
            let mut af = quinn::AckFrequencyConfig::default();
            af.ack_eliciting_threshold(VarInt::from_u32(MAX_ACK_THRESHOLD))
                // As without the extension: a gap is acknowledged at once.
                .reordering_threshold(VarInt::from_u32(1));
            t.ack_frequency_config(Some(af));
        }
        t
    }
}

/// The least change of datagram size worth a probe, for an upper bound of
/// `upper`: just over half the way from quinn's 1,200 bytes, so that the
/// bound is probed first and, if it is lost, one size halfway. Each probe
/// is a datagram of padding: quinn's binary search (steps of 20) sent four
/// or five of them, 4 % of what 10 x 10 kB put on a 256 kbit/s link.
fn probe_step(upper: u16) -> u16 {
    (upper.saturating_sub(1200) / 2 + 1).max(20)
}

/// Largest UDP payload the route to `peer` allows: the outgoing interface's MTU
/// (IP_MTU on a connected socket) less IP and UDP headers.
pub(crate) fn path_payload(peer: SocketAddr) -> Option<u16> {
    use std::os::fd::AsRawFd;
    let bind: SocketAddr = if peer.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .ok()?;
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(peer).ok()?;
    let (level, opt, headers) = if peer.is_ipv6() {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU, 48)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU, 28)
    };
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt on a valid fd with a c_int buffer and its length.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            level,
            opt,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 || v <= headers {
        return None;
    }
    Some((v - headers).clamp(1200, MAX_UDP_PAYLOAD as libc::c_int) as u16)
}

/// Memory for stream data sent and not yet acknowledged, shared by a
/// server's sessions: the sum of their send windows. A session's window is
/// what it holds for a peer that vanished, until the idle timeout; without
/// a shared bound, 64 sessions whose clients were killed held 0.9-1.1 GB
/// (loopback: the controller's window reaches 12 MB, the send window four
/// times that).
///
/// A session grows its window only from what is free and up to an even
/// share of the limit among the sessions now open; what it got returns when
/// its connection is gone. Every session gets 1 MiB even when
/// nothing is free, so the bound is the limit plus that per session.
#[derive(Debug)]
pub struct SendBudget {
    limit: u64,
    /// (bytes granted, sessions)
    state: std::sync::Mutex<(u64, u64)>,
}

/// The send window a session always gets.
pub(crate) const MIN_SEND_WINDOW: u64 = 1 << 20;

impl SendBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<SendBudget> {
        Arc::new(SendBudget {
            limit,
            state: std::sync::Mutex::new((0, 0)),
        })
    }

    /// A session opens: its first window, at least [`MIN_SEND_WINDOW`].
    fn join(&self, want: u64) -> u64 {
        let mut g = self.state.lock().unwrap();
        g.1 += 1;
        let room = (self.limit / g.1).min(self.limit.saturating_sub(g.0));
        let got = want.min(room).max(MIN_SEND_WINDOW);
        g.0 += got;
        got
    }

    /// Up to `more` bytes for a session holding `held`.
    fn grow(&self, held: u64, more: u64) -> u64 {
        let mut g = self.state.lock().unwrap();
        let share = (self.limit / g.1.max(1)).saturating_sub(held);
        let got = more.min(share).min(self.limit.saturating_sub(g.0));
        g.0 += got;
        got
    }

    /// A session that held `held` is gone.
    fn leave(&self, held: u64) {
        let mut g = self.state.lock().unwrap();
        g.0 = g.0.saturating_sub(held);
        g.1 = g.1.saturating_sub(1);
    }

    /// Bytes granted now (for tests and logs).
    pub fn granted(&self) -> u64 {
        self.state.lock().unwrap().0
    }
}

/// Which bytes the peak of [`spawn_window_tuner`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Received (this side receives the files: what the path delivered).
    Rx,
    /// Sent less what was declared lost (this side sends the files).
    Tx,
}

/// Every 250 ms (and every RTT, at least 10 ms apart, for the send window),
/// from the connection's counters: grow its windows when the measured BDP
/// needs it, and keep the peak rate of `flow`, which it returns.
///
/// Windows: if twice (rate x smoothed RTT) exceeds a window, it becomes four
/// times that BDP, never above the memory bound. The send window is also at
/// least four times the congestion window (a start-up grows that up to
/// 2.9 times per RTT), so it follows the controller from its small first
/// size ([`FIRST_SEND_WINDOW`]) without holding it back. The receive window follows
/// what arrives; the send window (stream data quinn keeps until it is
/// acknowledged) what leaves. Both need more than one BDP on a lossy path: a
/// stream's data is released only up to its first unacknowledged byte, and
/// read only up to its first missing one, so a loss holds a stream's data for
/// the two to three round trips its repair takes (at 1 s and 1e-2, a 256 MiB
/// send window held a cold start to 520 Mbit/s, 1 GiB gave 565 and steady
/// rounds).
///
/// Peak: the largest rate, bits/s of UDP payload, over any second of the
/// connection's life, for the rate memory: what the path carried at best, not
/// a mean that includes the start-up and the tail. A remembered mean of the
/// data phase (payload, start-up included) sat 10-20 % below the path's rate,
/// and `wan` started there grows only by its probes.
///
/// With a `budget` (a server's), the send window grows only as far as it
/// grants.
pub(crate) fn spawn_window_tuner(
    conn: quinn::Connection,
    opts: NetOpts,
    flow: Flow,
    budget: Option<Arc<SendBudget>>,
) -> Tuned {
    let peak = Arc::new(AtomicU64::new(0));
    let first = FIRST_SEND_WINDOW.min(opts.max_window);
    let window = match &budget {
        Some(b) => b.join(first),
        None => first,
    };
    let series = Arc::new(std::sync::Mutex::new(Series::default()));
    let out = Tuned {
        peak: peak.clone(),
        send_window: Arc::new(AtomicU64::new(window)),
        series: series.clone(),
    };
    let send = SendWindow {
        window: out.send_window.clone(),
        budget,
    };
    conn.set_send_window(window);
    tokio::spawn(async move {
        let mut recv_window = opts.initial_window();
        // (received, sent, sent and not lost) bytes.
        let counts = |s: &quinn::ConnectionStats| {
            let tx = s.udp_tx.bytes;
            (s.udp_rx.bytes, tx, tx.saturating_sub(s.path.lost_bytes))
        };
        // The count the peak is of.
        let of_flow = |c: (u64, u64, u64)| match flow {
            Flow::Rx => c.0,
            Flow::Tx => c.2,
        };
        let first = counts(&conn.stats());
        let mut last = first;
        // The counts of `flow` over the last second.
        let mut second = std::collections::VecDeque::from([of_flow(first)]);
        const TICK: Duration = Duration::from_millis(250);
        let mut since = std::time::Instant::now();
        let mut wait = Duration::ZERO; // (a hinted start's window at once)
        let mut blocked_seen = 0; // DATA_BLOCKED frames come by the last tick
        let mut grew_at: Option<std::time::Instant> = None; // the receive window's last growth
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = conn.closed() => return,
            }
            wait = conn.rtt().clamp(Duration::from_millis(10), TICK);
            let stats = conn.stats();
            // (Not from a window quinn does not hold the sender to: it is
            // no window, and the send window never shrinks.)
            // (Only where this side sends the files: a receiver's window has
            // a floor for its ACKs, `spawn_receive_floor`, which is no
            // claim on a server's send budget.)
            if flow == Flow::Tx && stats.path.cwnd < crate::cc::UNPACED_WINDOW {
                send.grow(&conn, (4 * stats.path.cwnd).min(opts.max_window));
            }
            tracing::trace!(
                cwnd = stats.path.cwnd,
                send_window = send.get(),
                recv_window,
                data_blocked_tx = stats.frame_tx.data_blocked,
                stream_blocked_tx = stats.frame_tx.stream_data_blocked,
                data_blocked_rx = stats.frame_rx.data_blocked,
                lost = stats.path.lost_bytes,
                "window tick"
            );
            let (t, now) = (std::time::Instant::now(), counts(&stats));
            series.lock().unwrap().push(t, of_flow(now));
            let elapsed = t.saturating_duration_since(since);
            if elapsed < TICK {
                continue;
            }
            since = t;
            let rtt = conn.rtt().as_secs_f64();
            let secs = elapsed.as_secs_f64();
            let bdp = |a: u64, b: u64| ((a - b) as f64 / secs * rtt) as u64;
            let (rx, tx) = (bdp(now.0, last.0), bdp(now.1, last.1));
            last = now;
            // (DATA_BLOCKED sent before the sender saw the last growth does
            // not count: only those that came two RTT after it.)
            let settled =
                grew_at.is_none_or(|g| t.saturating_duration_since(g).as_secs_f64() > 2.0 * rtt);
            let blocked = settled && stats.frame_rx.data_blocked > blocked_seen;
            blocked_seen = stats.frame_rx.data_blocked;
            if let Some(w) = grown_rx(recv_window, rx, blocked, opts.max_window) {
                grew_at = Some(t);
                recv_window = w;
                if let Ok(v) = VarInt::from_u64(w) {
                    conn.set_receive_window(v);
                }
            }
            if let Some(w) = grown(send.get(), tx, opts.max_window) {
                send.grow(&conn, w);
            }
            second.push_back(of_flow(now));
            if second.len() > 5 {
                second.pop_front();
                let bytes = second.back().unwrap() - second.front().unwrap();
                peak.fetch_max(bytes * 8, Ordering::Relaxed);
            }
        }
    });
    out
}

/// How often [`spawn_receive_floor`] looks at what arrived.
const FLOOR_EVERY: Duration = Duration::from_millis(25);
/// The span its rate is measured over, in looks (100 ms).
const FLOOR_LOOKS: usize = 4;
/// How long a floor holds after the rate under it fell: a pause of the
/// sender (a full window waiting for ACKs) must not take the floor away
/// just before the next flight comes in.
const FLOOR_HOLD: Duration = Duration::from_secs(1);

/// What arrived at the receiving side of a connection lately, and the floor
/// it gives its controller ([`crate::cc::receive_floor`]): that of the rate
/// over the last [`FLOOR_LOOKS`] looks, or a higher one reached within the
/// last [`FLOOR_HOLD`] (then the current one).
#[derive(Debug)]
struct FloorFollower {
    seen: std::collections::VecDeque<(Instant, u64)>,
    held: (u64, Instant),
}

impl FloorFollower {
    fn new(now: Instant, received: u64) -> Self {
        FloorFollower {
            seen: [(now, received)].into(),
            held: (0, now),
        }
    }

    /// At `now`, `received` bytes have come in all told, over a path of
    /// `rtt`: the floor.
    fn look(&mut self, now: Instant, received: u64, rtt: Duration) -> u64 {
        self.seen.push_back((now, received));
        if self.seen.len() > FLOOR_LOOKS + 1 {
            self.seen.pop_front();
        }
        let (t0, b0) = self.seen[0];
        let secs = now.saturating_duration_since(t0).as_secs_f64();
        let rate = if secs > 0.0 {
            received.saturating_sub(b0) as f64 / secs
        } else {
            0.0
        };
        let floor = crate::cc::receive_floor(rate, rtt);
        if floor >= self.held.0 || now.saturating_duration_since(self.held.1) > FLOOR_HOLD {
            self.held = (floor, now);
        }
        self.held.0
    }
}

/// Keeps the window of the receiving side's own controller (`cc`) at least
/// [`crate::cc::receive_floor`] of what arrives, for as long as the
/// connection lives: its ACKs, and the credit and per-file results they
/// travel with, then go without waiting for the pacer (see there).
pub(crate) fn spawn_receive_floor(conn: quinn::Connection, cc: Arc<CcHandle>) {
    tokio::spawn(async move {
        let mut follower = FloorFollower::new(Instant::now(), conn.stats().udp_rx.bytes);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FLOOR_EVERY) => {}
                _ = conn.closed() => return,
            }
            let floor = follower.look(Instant::now(), conn.stats().udp_rx.bytes, conn.rtt());
            cc.set_floor(floor);
        }
    });
}

/// What [`spawn_window_tuner`] keeps up to date.
#[derive(Debug, Clone)]
pub(crate) struct Tuned {
    /// The peak rate of its flow, bits/s.
    pub peak: Arc<AtomicU64>,
    /// The connection's send window now, bytes.
    pub send_window: Arc<AtomicU64>,
    /// The count of its flow about every round trip (10-250 ms), for the
    /// report's start-up figures.
    pub series: Arc<std::sync::Mutex<Series>>,
}

/// A connection's send window, shared with the sender
/// ([`Tuned::send_window`]), and the budget it is granted from (if any), to
/// which it goes back however the tuner ends (the connection, or the
/// runtime dropping the task). Only the tuner changes it.
struct SendWindow {
    window: Arc<AtomicU64>,
    budget: Option<Arc<SendBudget>>,
}

impl SendWindow {
    fn get(&self) -> u64 {
        self.window.load(Ordering::Relaxed)
    }

    /// Grow the window towards `to`, as far as the budget grants.
    fn grow(&self, conn: &quinn::Connection, to: u64) {
        let now = self.get();
        let Some(more) = to.checked_sub(now).filter(|&m| m > 0) else {
            return;
        };
        let got = match &self.budget {
            Some(b) => b.grow(now, more),
            None => more,
        };
        if got > 0 {
            self.window.store(now + got, Ordering::Relaxed);
            conn.set_send_window(now + got);
        }
    }
}

impl Drop for SendWindow {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.leave(self.get());
        }
    }
}

/// The window after a measured `bdp`: four times it once twice it exceeds
/// `window`, never above `bound`; None when it stays.
fn grown(window: u64, bdp: u64, bound: u64) -> Option<u64> {
    (2 * bdp > window && window < bound).then(|| (4 * bdp).min(bound).max(window))
}

/// The receive window after a measured `bdp`: as [`grown`], and at least
/// twice what it was when the sender said this window held it back
/// (`blocked`: a DATA_BLOCKED came) while what arrived was a quarter of the
/// window or more per RTT. A receive window holds what is in flight and what
/// came behind a loss until its repair: at 1 Gbit/s, 700 ms and 1e-3 that
/// is 140 MB or more, over the first window of 125 MB, and a sender held
/// back by it delivers less than twice its BDP, so [`grown`] never saw the
/// need (2-5 DATA_BLOCKED per cold 200 MB get in the lab). A receiver that
/// reads slower than the path (a slow disk) holds the sender too, but then
/// what arrives is what it reads: a disk that takes a quarter window per
/// RTT gets at most eight times what it takes in flight (twice a window of
/// four), and the tuner counts only DATA_BLOCKED that came two RTT after
/// the last growth (the sender had seen it).
fn grown_rx(window: u64, bdp: u64, blocked: bool, bound: u64) -> Option<u64> {
    let measured = grown(window, bdp, bound).unwrap_or(window);
    let w = if blocked && 4 * bdp >= window {
        measured.max((2 * window).min(bound))
    } else {
        measured
    };
    (w > window).then_some(w)
}

/// A UDP socket with large kernel buffers (forced past rmem_max when root).
pub(crate) fn udp_socket(addr: SocketAddr) -> Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        let _ = s.set_only_v6(false);
    }
    const BUF: usize = 32 << 20;
    for (opt, force) in [
        (libc::SO_RCVBUF, libc::SO_RCVBUFFORCE),
        (libc::SO_SNDBUF, libc::SO_SNDBUFFORCE),
    ] {
        if !set_int(&s, force, BUF) {
            set_int(&s, opt, BUF);
        }
    }
    s.bind(&addr.into())
        .with_context(|| format!("binding UDP {addr}"))?;
    Ok(s.into())
}

fn set_int(s: &socket2::Socket, opt: libc::c_int, v: usize) -> bool {
    use std::os::fd::AsRawFd;
    let v = v as libc::c_int;
    // SAFETY: setsockopt with a valid fd, a c_int option value and its size.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

pub(crate) fn endpoint(
    socket: std::net::UdpSocket,
    server: Option<quinn::ServerConfig>,
) -> Result<quinn::Endpoint> {
    let mut cfg = quinn::EndpointConfig::default();
    // Allow payloads past 1472 bytes: loopback and jumbo-frame paths gain much.
    cfg.max_udp_payload_size(MAX_UDP_PAYLOAD)?;
    if server.is_none() {
        // A client's endpoint holds one connection (to one server): its
        // packets are told apart by address, and a connection ID of 0 bytes
        // takes 8 bytes off every packet the server sends (a get's data:
        // 0.6 % of a 256 kbit/s link's bytes, as much as its ACKs).
        cfg.cid_generator(|| Box::new(quinn_proto::RandomConnectionIdGenerator::new(0)));
    }
    quinn::Endpoint::new(cfg, server, socket, Arc::new(quinn::TokioRuntime))
        .context("creating the QUIC endpoint")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receivers_floor_follows_what_arrives_and_holds_through_a_pause() {
        let rtt = Duration::from_millis(700);
        let t0 = Instant::now();
        let mut f = FloorFollower::new(t0, 0);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Nothing yet: no floor.
        assert_eq!(f.look(at(25), 0, rtt), 0);
        // 1 Gbit/s (125 kB a millisecond) from 25 ms on: within one look
        // the floor is up (the rate over the 50 ms seen so far, half of it).
        let half = crate::cc::receive_floor(62.5e6, rtt);
        assert_eq!(f.look(at(50), 3_125_000, rtt), half);
        let mut got = 3_125_000;
        let mut floor = 0;
        for ms in (75..=500).step_by(25) {
            got += 3_125_000;
            floor = f.look(at(ms), got, rtt);
        }
        assert_eq!(floor, crate::cc::receive_floor(125e6, rtt));
        // The sender pauses (its window full): the floor holds for a second…
        for ms in (525..=1500).step_by(25) {
            assert_eq!(f.look(at(ms), got, rtt), floor, "at {ms} ms");
        }
        // …then follows the rate (nothing came: none).
        assert_eq!(f.look(at(1525), got, rtt), 0);
    }

    #[test]
    fn a_send_budget_bounds_the_sum_shares_it_and_gets_it_back() {
        const M: u64 = 1 << 20;
        let b = SendBudget::new(16 * M);
        // Alone, a session may take all of it, in steps.
        let a = b.join(4 * M);
        assert_eq!(a, 4 * M);
        assert_eq!(b.grow(a, 20 * M), 12 * M, "no more than the limit");
        let a = 16 * M;
        // A second gets the floor when nothing is free, and cannot grow.
        assert_eq!(b.join(4 * M), MIN_SEND_WINDOW);
        assert_eq!(b.grow(MIN_SEND_WINDOW, 4 * M), 0);
        assert_eq!(b.granted(), 17 * M, "the limit plus one floor");
        // The first leaves: the second, alone now, grows to the limit.
        b.leave(a);
        assert_eq!(b.granted(), M);
        assert_eq!(b.grow(M, 40 * M), 15 * M);
        // A newcomer's share is half now, but only what is free is given.
        assert_eq!(b.join(8 * M), MIN_SEND_WINDOW);
        b.leave(16 * M);
        assert_eq!(b.grow(M, 40 * M), 15 * M, "alone again: all of it");
        b.leave(16 * M);
        assert_eq!(b.granted(), 0);
        // Shares: with two sessions open, neither grows past half.
        let (x, y) = (b.join(M), b.join(M));
        assert_eq!(b.grow(x, 40 * M), 7 * M);
        assert_eq!(b.grow(y, 40 * M), 7 * M);
    }

    #[test]
    fn windows_grow_to_four_bdp_once_two_exceed_them_up_to_the_bound() {
        const M: u64 = 1 << 20;
        let bound = NetOpts::default().max_window;
        assert_eq!(bound, 1024 * M);
        // 1 Gbit/s at 70 ms: 8.75 MB, well inside the first 125 MB.
        assert_eq!(grown(125 * M, 9 * M, bound), None);
        // At 1 s (125 MB): four BDP.
        assert_eq!(grown(125 * M, 125 * M, bound), Some(500 * M));
        // Never above the bound, never below what it was.
        assert_eq!(grown(500 * M, 300 * M, bound), Some(bound));
        assert_eq!(grown(bound, 600 * M, bound), None);
        assert_eq!(grown(600 * M, 200 * M, 256 * M), None);
        // The receive window: a sender held back by it while a quarter of it
        // or more came per RTT doubles it (125 MB, 50 MB per RTT came:
        // twice 50 does not exceed 125); more if measured; a slow reader (10
        // MB per RTT) or no DATA_BLOCKED leaves it; never past the bound.
        assert_eq!(grown_rx(125 * M, 50 * M, true, bound), Some(250 * M));
        assert_eq!(grown_rx(125 * M, 50 * M, false, bound), None);
        assert_eq!(grown_rx(125 * M, 10 * M, true, bound), None);
        assert_eq!(grown_rx(125 * M, 100 * M, true, bound), Some(400 * M));
        assert_eq!(grown_rx(125 * M, 9 * M, false, bound), None);
        assert_eq!(grown_rx(800 * M, 300 * M, true, bound), Some(bound));
        assert_eq!(grown_rx(bound, 600 * M, true, bound), None);
    }
}
