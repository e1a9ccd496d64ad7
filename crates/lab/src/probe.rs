//! Small UDP probes for checking a lab's path: an echo server and RTT prober,
//! a paced sender and a counting sink. Each datagram carries a sequence number
//! and a send time, so the sink sees every loss and burst (a link never
//! reorders) and the prober every round trip.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

/// IPv4 + UDP header bytes, added to payload sizes to give IP bytes.
pub const IP_UDP_HEADER: usize = 28;
const HEADER: usize = 16;

fn resolve(to: &str) -> Result<SocketAddr> {
    to.to_socket_addrs()
        .with_context(|| format!("resolving {to}"))?
        .find(|a| a.is_ipv4())
        .with_context(|| format!("{to} has no IPv4 address"))
}

fn stamp(buf: &mut [u8], seq: u64, t0: Instant) {
    buf[..8].copy_from_slice(&seq.to_be_bytes());
    buf[8..16].copy_from_slice(&(t0.elapsed().as_nanos() as u64).to_be_bytes());
}

fn seq_of(buf: &[u8]) -> u64 {
    u64::from_be_bytes(buf[..8].try_into().expect("8 bytes"))
}

/// Echoes every datagram back to its sender, forever.
pub fn echo(port: u16) -> Result<()> {
    let sock = UdpSocket::bind(("0.0.0.0", port)).with_context(|| format!("bind udp/{port}"))?;
    let mut buf = vec![0u8; 65536];
    loop {
        let (n, from) = sock.recv_from(&mut buf)?;
        let _ = sock.send_to(&buf[..n], from);
    }
}

/// What [`rtt`] measured.
#[derive(Debug, Serialize)]
pub struct RttReport {
    /// Probes sent.
    pub sent: u64,
    /// Echoes received before the prober gave up.
    pub received: u64,
    /// Round trip of each echoed probe, in sequence order, ms.
    pub rtt_ms: Vec<f64>,
    /// Mean round trip, ms (0 when nothing came back).
    pub mean_ms: f64,
    /// Shortest round trip, ms (infinite, `null` in JSON, when nothing came
    /// back).
    pub min_ms: f64,
    /// Longest round trip, ms (0 when nothing came back).
    pub max_ms: f64,
}

/// Sends `count` probes `interval` apart to an echo server and measures each round trip.
pub fn rtt(to: &str, count: u64, interval: Duration, size: usize) -> Result<RttReport> {
    let addr = resolve(to)?;
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(addr)?;
    let rx = sock.try_clone()?;
    let t0 = Instant::now();
    let size = size.max(HEADER);
    let collector = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut samples: Vec<(u64, f64)> = Vec::new();
        rx.set_read_timeout(Some(Duration::from_millis(200))).ok();
        let mut idle_since = None;
        loop {
            match rx.recv(&mut buf) {
                Ok(n) if n >= HEADER => {
                    let now = t0.elapsed().as_nanos() as u64;
                    let sent = u64::from_be_bytes(buf[8..16].try_into().unwrap());
                    samples.push((seq_of(&buf), (now - sent) as f64 / 1e6));
                    idle_since = None;
                    if samples.len() as u64 == count {
                        break;
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    // Give up 5 s (or 3 round trips) after the last probe went out.
                    let done_sending = t0.elapsed() > interval * count as u32;
                    if done_sending {
                        let since = *idle_since.get_or_insert_with(Instant::now);
                        let worst = samples.iter().map(|s| s.1).fold(0.0, f64::max);
                        let wait = Duration::from_secs_f64((worst * 3.0 / 1e3).max(5.0));
                        if since.elapsed() > wait {
                            break;
                        }
                    }
                }
            }
        }
        samples
    });
    let mut buf = vec![0u8; size];
    for seq in 0..count {
        let due = interval * seq as u32;
        if let Some(wait) = due.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
        stamp(&mut buf, seq, t0);
        sock.send(&buf)?;
    }
    let mut samples = collector.join().expect("collector");
    samples.sort_by_key(|s| s.0);
    let rtt_ms: Vec<f64> = samples.iter().map(|s| s.1).collect();
    let n = rtt_ms.len().max(1) as f64;
    Ok(RttReport {
        sent: count,
        received: rtt_ms.len() as u64,
        mean_ms: rtt_ms.iter().sum::<f64>() / n,
        min_ms: rtt_ms.iter().copied().fold(f64::INFINITY, f64::min),
        max_ms: rtt_ms.iter().copied().fold(0.0, f64::max),
        rtt_ms,
    })
}

/// What [`send`] sent.
#[derive(Debug, Serialize)]
pub struct SendReport {
    /// Datagrams sent (a send refused with ECONNREFUSED counts too).
    pub sent_pkts: u64,
    /// IP bytes (payload + 28).
    pub sent_bytes: u64,
    /// Seconds from the start to the end of sending.
    pub secs: f64,
    /// Average sending rate of IP bytes, bit/s (`sent_bytes × 8 / secs`).
    pub rate_bps: f64,
}

/// Sends `size`-byte datagrams at `rate_bps` of IP bytes (0 = as fast as
/// possible) for `count` packets or `duration`, whichever ends first.
pub fn send(
    to: &str,
    rate_bps: u64,
    size: usize,
    count: u64,
    duration: Duration,
) -> Result<SendReport> {
    if !(HEADER..=65_000).contains(&size) {
        bail!("--size must be {HEADER} to 65000 bytes");
    }
    let addr = resolve(to)?;
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(addr)?;
    let ip_bytes = (size + IP_UDP_HEADER) as u64;
    let gap_ns = (ip_bytes * 8 * 1_000_000_000)
        .checked_div(rate_bps)
        .unwrap_or(0);
    let mut buf = vec![0u8; size];
    let t0 = Instant::now();
    let mut seq = 0u64;
    while seq < count {
        let now = t0.elapsed();
        if now >= duration {
            break;
        }
        let due = Duration::from_nanos(seq * gap_ns);
        if due > now {
            let wait = due - now;
            if wait > Duration::from_micros(100) {
                std::thread::sleep(wait);
            } else {
                std::thread::yield_now();
            }
            continue;
        }
        stamp(&mut buf, seq, t0);
        match sock.send(&buf) {
            Ok(_) => seq += 1,
            // A full socket buffer: the kernel drops nothing, we just try again.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => std::thread::yield_now(),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => seq += 1,
            Err(e) => return Err(e).context("send"),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(SendReport {
        sent_pkts: seq,
        sent_bytes: seq * ip_bytes,
        secs,
        rate_bps: (seq * ip_bytes * 8) as f64 / secs,
    })
}

/// What [`sink`] received.
#[derive(Debug, Serialize)]
pub struct SinkReport {
    /// Datagrams received (those of at least the 16-byte probe header).
    pub received_pkts: u64,
    /// IP bytes (payload + 28).
    pub received_bytes: u64,
    /// Highest sequence number seen + 1.
    pub highest_seq: u64,
    /// Sequence numbers below `highest_seq` never seen.
    pub missing: u64,
    /// Runs of consecutive missing sequence numbers.
    pub bursts: u64,
    /// Mean length of those runs (`missing / bursts`; 0 when nothing is
    /// missing).
    pub mean_burst: f64,
    /// Seconds from the first to the last datagram.
    pub secs: f64,
    /// Delivered rate over the middle 60% of the run (IP bytes), bit/s.
    pub steady_rate_bps: f64,
    /// IP bytes received per 100 ms since the first datagram.
    pub series_100ms: Vec<u64>,
}

/// Counts datagrams on `port` until `idle` passes without one (after the
/// first) or `max` passes in all.
/// With `group`, joins that multicast group first.
pub fn sink(
    port: u16,
    group: Option<Ipv4Addr>,
    idle: Duration,
    max: Duration,
) -> Result<SinkReport> {
    let sock = UdpSocket::bind(("0.0.0.0", port)).with_context(|| format!("bind udp/{port}"))?;
    if let Some(g) = group {
        sock.join_multicast_v4(&g, &Ipv4Addr::UNSPECIFIED)
            .with_context(|| format!("joining {g}"))?;
    }
    set_rcvbuf(&sock, 32 << 20);
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    let start = Instant::now();
    let mut buf = vec![0u8; 65536];
    let (mut pkts, mut bytes, mut next, mut missing, mut bursts) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut series: Vec<u64> = Vec::new();
    loop {
        match sock.recv(&mut buf) {
            Ok(n) if n >= HEADER => {
                let now = Instant::now();
                let f = *first.get_or_insert(now);
                last = now;
                pkts += 1;
                let ip = (n + IP_UDP_HEADER) as u64;
                bytes += ip;
                let b = (now - f).as_millis() as usize / 100;
                if series.len() <= b {
                    series.resize(b + 1, 0);
                }
                series[b] += ip;
                let seq = seq_of(&buf);
                if seq > next {
                    missing += seq - next;
                    bursts += 1;
                }
                next = next.max(seq + 1);
            }
            Ok(_) => {}
            Err(_) => {}
        }
        let now = Instant::now();
        if now - start > max || (first.is_some() && now - last > idle) {
            break;
        }
    }
    let secs = first.map(|f| (last - f).as_secs_f64()).unwrap_or(0.0);
    let steady = {
        let n = series.len();
        let (a, b) = (n / 5, n * 4 / 5);
        if b > a {
            series[a..b].iter().sum::<u64>() as f64 * 8.0 / ((b - a) as f64 * 0.1)
        } else {
            0.0
        }
    };
    Ok(SinkReport {
        received_pkts: pkts,
        received_bytes: bytes,
        highest_seq: next,
        missing,
        bursts,
        mean_burst: if bursts > 0 {
            missing as f64 / bursts as f64
        } else {
            0.0
        },
        secs,
        steady_rate_bps: steady,
        series_100ms: series,
    })
}

fn set_rcvbuf(sock: &UdpSocket, bytes: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt with a valid int option; failure only leaves the default.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}
