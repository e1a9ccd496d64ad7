//! longhaul's controller (`wan::Wan`) against a simulated bottleneck: simulated
//! time, seeded loss (random or in bursts), a FIFO queue of one BDP with tail
//! drop, ACK per packet (or on a receiver's clock), and competing TCP CUBIC
//! flows (unpaced, as a kernel without fq sends them). A `wan` sender is
//! driven as quinn drives a controller: at most `window` bytes in flight, paced at 1.25 × window /
//! the RTT the controller names (`pacing_rtt`, as longhaul's patched quinn
//! does) or the smoothed RTT, and back to back while it asks for a train (`unpaced`),
//! with the RTT of a handshake (the path's and the queue standing when it
//! joins) known before its first packet. Every sender declares a packet lost once three later ones are
//! acknowledged, or all of its flight after a timeout.

use longhaul_quic::wan::Wan;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Large simulated packets keep the event count low; controllers see bytes.
const PKT: u64 = 9000;
/// The segment a competing TCP counts its growth in.
const MSS: f64 = 1448.0;

struct Path {
    /// Bytes per datagram (every flow's).
    pkt: u64,
    /// Bytes per second, and from when (a rate change mid-run).
    rate: Vec<(Duration, f64)>,
    one_way: Duration,
    queue_bytes: f64,
    loss: Loss,
    /// The receiver acknowledges on a clock of this period (what it
    /// received since its last ACK), not each packet as it comes.
    ack_every: Option<Duration>,
}

#[derive(Clone, Copy)]
enum Loss {
    /// Each packet independently.
    Random(f64),
    /// Gilbert-Elliott: from good to bad with probability `p` per packet,
    /// back with `r`; every packet sent in the bad state is lost.
    Bursts { p: f64, r: f64 },
}

/// A competing TCP sender's window rules (RFC 8312 CUBIC, slow start as RFC 5681).
struct Tcp {
    cwnd: f64,
    ssthresh: f64,
    w_max: f64,
    w_est: f64,
    epoch: Option<Instant>,
    recovery: Option<Instant>,
}

impl Tcp {
    fn new() -> Tcp {
        Tcp {
            cwnd: 10.0 * MSS,
            ssthresh: f64::INFINITY,
            w_max: 0.0,
            w_est: 0.0,
            epoch: None,
            recovery: None,
        }
    }
    fn window(&self) -> u64 {
        (self.cwnd as u64).max(2 * PKT)
    }
    fn on_ack(&mut self, now: Instant, bytes: u64, rtt: Duration) {
        let b = bytes as f64;
        if self.cwnd < self.ssthresh {
            self.cwnd += b;
        } else {
            let epoch = *self.epoch.get_or_insert(now);
            let k = (self.w_max / MSS * 0.3 / 0.4).cbrt();
            let t = (now - epoch + rtt).as_secs_f64();
            let cubic = (0.4 * (t - k).powi(3) + self.w_max / MSS) * MSS;
            // The Reno-friendly region: 3(1-β)/(1+β) segments per round.
            self.w_est += 0.529 * MSS * b / self.cwnd;
            let goal = cubic.max(self.w_est);
            if goal > self.cwnd {
                self.cwnd += (goal - self.cwnd).min(self.cwnd / 2.0) * b / self.cwnd;
            }
        }
    }
    fn on_loss(&mut self, now: Instant, sent: Instant) {
        if self.recovery.is_some_and(|r| sent <= r) {
            return;
        }
        self.recovery = Some(now);
        let beta = 0.7;
        // Fast convergence: a flow that lost ground yields more of it.
        self.w_max = if self.cwnd < self.w_max {
            self.cwnd * (1.0 + beta) / 2.0
        } else {
            self.cwnd
        };
        self.cwnd = (self.cwnd * beta).max(2.0 * PKT as f64);
        self.ssthresh = self.cwnd;
        self.w_est = self.cwnd;
        self.epoch = None;
    }
}

enum Sender {
    Wan(Box<Wan>),
    Tcp(Tcp),
}

impl Sender {
    fn window(&self) -> u64 {
        match self {
            Sender::Wan(w) => w.window(),
            Sender::Tcp(t) => t.window(),
        }
    }
}

struct Pkt {
    seq: u64,
    sent: Instant,
    /// When its ACK arrives (or would have).
    ack_at: Instant,
    delivered: bool,
}

struct Flow {
    cc: Sender,
    start: Duration,
    stop: Option<Duration>,
    flight: VecDeque<Pkt>,
    inflight: u64,
    seq: u64,
    pacer: Instant,
    srtt: Option<Duration>,
    last_acked: Option<u64>,
    /// Bytes acknowledged per 100 ms.
    bins: Vec<u64>,
    /// The path's datagram size.
    pkt: u64,
    /// Datagrams sent, and of them dropped by a full queue.
    sent: u64,
    dropped: u64,
    /// Datagrams dropped by a full queue, per 100 ms.
    drop_bins: Vec<u64>,
}

impl Flow {
    fn new(cc: Sender, start: f64) -> Flow {
        Flow {
            cc,
            start: Duration::from_secs_f64(start),
            stop: None,
            flight: VecDeque::new(),
            inflight: 0,
            seq: 0,
            pacer: Instant::now(),
            srtt: None,
            last_acked: None,
            bins: Vec::new(),
            pkt: PKT,
            sent: 0,
            dropped: 0,
            drop_bins: Vec::new(),
        }
    }
    fn wan(w: Wan, start: f64) -> Flow {
        Flow::new(Sender::Wan(Box::new(w)), start)
    }
    fn cubic(start: f64) -> Flow {
        Flow::new(Sender::Tcp(Tcp::new()), start)
    }
    fn until(mut self, stop: f64) -> Flow {
        self.stop = Some(Duration::from_secs_f64(stop));
        self
    }
    fn window_full(&self) -> bool {
        !self.unpaced() && self.inflight + self.pkt > self.cc.window()
    }
    /// A `wan` train going out: back to back, whatever the window and pacer.
    fn unpaced(&self) -> bool {
        matches!(&self.cc, Sender::Wan(w) if w.unpaced())
    }
    /// The first packet still expected to be acknowledged: ACKs of delivered
    /// packets arrive in the order they were sent (one FIFO bottleneck).
    fn next_ack(&self) -> Option<Instant> {
        self.flight.iter().find(|p| p.delivered).map(|p| p.ack_at)
    }
    fn on_loss(&mut self, now: Instant, sent: Instant) {
        match &mut self.cc {
            Sender::Wan(w) => w.on_loss(now, sent, self.pkt),
            Sender::Tcp(t) => t.on_loss(now, sent),
        }
    }
}

struct Outcome {
    flows: Vec<Flow>,
    /// The smallest queueing delay (ms) a packet met at the bottleneck, per
    /// 100 ms bin.
    queue_ms: Vec<f64>,
    rtt: Duration,
}

impl Outcome {
    /// Flow `f`'s mean delivery rate in bit/s from `a` to `b` seconds.
    fn rate_of(&self, f: usize, a: f64, b: f64) -> f64 {
        let bins = &self.flows[f].bins;
        let (i, j) = ((a * 10.0) as usize, (b * 10.0) as usize);
        let bytes: u64 = bins[i.min(bins.len())..j.min(bins.len())].iter().sum();
        bytes as f64 * 8.0 / (b - a)
    }
    fn rate(&self, a: f64, b: f64) -> f64 {
        self.rate_of(0, a, b)
    }
    /// Datagrams of flow `f` a full queue dropped from `a` to `b` seconds.
    fn drops_of(&self, f: usize, a: f64, b: f64) -> u64 {
        let bins = &self.flows[f].drop_bins;
        let (i, j) = ((a * 10.0) as usize, (b * 10.0) as usize);
        bins[i.min(bins.len())..j.min(bins.len())].iter().sum()
    }
    /// Flow 0's share of everything delivered from `a` to `b` seconds.
    fn share(&self, a: f64, b: f64) -> f64 {
        let all: f64 = (0..self.flows.len()).map(|f| self.rate_of(f, a, b)).sum();
        self.rate(a, b) / all
    }
    /// The standing queue (ms) from `a` to `b` seconds: for each 100 ms, the
    /// least queueing delay any packet met in the round trip that follows (the
    /// queue that never drains, not a probe's passing one), averaged.
    fn standing_queue(&self, a: f64, b: f64) -> f64 {
        let k = ((self.rtt.as_secs_f64() * 10.0).ceil() as usize).max(1);
        let (i, j) = ((a * 10.0) as usize, (b * 10.0) as usize);
        let floors: Vec<f64> = (i..j)
            .map(|x| {
                self.queue_ms[x..(x + k).min(self.queue_ms.len())]
                    .iter()
                    .copied()
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        floors.iter().sum::<f64>() / floors.len() as f64
    }
}

/// Runs `flows` (flow 0 is the one under test) over `path` for `secs`.
fn simulate(path: &Path, mut flows: Vec<Flow>, secs: f64, seed: u64) -> Outcome {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let nbins = (secs * 10.0) as usize + 1;
    for f in &mut flows {
        f.pacer = t0 + f.start;
        f.bins = vec![0; nbins];
        f.drop_bins = vec![0; nbins];
        f.pkt = path.pkt;
    }
    let rate_at = |t: Instant| {
        let d = t - t0;
        path.rate
            .iter()
            .rev()
            .find(|(from, _)| d >= *from)
            .map_or(path.rate[0].1, |r| r.1)
    };
    // When the receiver acknowledges a packet that reached it at `t`.
    let acked = |t: Instant| match path.ack_every {
        Some(every) => {
            let n = ((t - t0).as_nanos()).div_ceil(every.as_nanos());
            t0 + Duration::from_nanos((n * every.as_nanos()) as u64)
        }
        None => t,
    };
    let mut queue_ms = vec![f64::INFINITY; nbins];
    let mut link_free = t0;
    let mut bad = false;
    let mut now = t0;
    while now < end {
        // Every flow sends what its window and pacer allow.
        for f in flows.iter_mut() {
            let active = now >= t0 + f.start && f.stop.is_none_or(|s| now < t0 + s);
            // A connection's handshake measured the RTT before its first
            // data (with whatever queue stood then).
            if let Sender::Wan(w) = &mut f.cc {
                if active && f.seq == 0 {
                    let queued = link_free.saturating_duration_since(now);
                    w.seed_rtt(path.one_way * 2 + queued);
                }
            }
            while active && !f.window_full() && (f.pacer <= now || f.unpaced()) {
                let rate = rate_at(now);
                let backlog = link_free.saturating_duration_since(now).as_secs_f64() * rate;
                let bin = ((now - t0).as_secs_f64() * 10.0) as usize;
                f.sent += 1;
                let pkt = if backlog + path.pkt as f64 > path.queue_bytes {
                    f.dropped += 1;
                    f.drop_bins[bin.min(nbins - 1)] += 1;
                    Pkt {
                        seq: f.seq,
                        sent: now,
                        ack_at: now + path.one_way * 2,
                        delivered: false,
                    }
                } else {
                    let depart =
                        link_free.max(now) + Duration::from_secs_f64(path.pkt as f64 / rate);
                    queue_ms[bin] = queue_ms[bin].min(backlog / rate * 1e3);
                    link_free = depart;
                    let lost = match path.loss {
                        Loss::Random(p) => rng.gen::<f64>() < p,
                        Loss::Bursts { p, r } => {
                            bad = if bad {
                                rng.gen::<f64>() >= r
                            } else {
                                rng.gen::<f64>() < p
                            };
                            bad
                        }
                    };
                    Pkt {
                        seq: f.seq,
                        sent: now,
                        ack_at: acked(depart + path.one_way) + path.one_way,
                        delivered: !lost,
                    }
                };
                f.flight.push_back(pkt);
                f.seq += 1;
                f.inflight += path.pkt;
                if let Sender::Wan(w) = &mut f.cc {
                    w.on_sent(now, path.pkt);
                }
                f.pacer = match &f.cc {
                    Sender::Wan(w) if w.unpaced() => now,
                    Sender::Wan(w) => {
                        let srtt = f.srtt.unwrap_or(Duration::from_millis(100));
                        let rtt = w.pacing_rtt().unwrap_or(srtt);
                        let pace = w.window() as f64 * 1.25 / rtt.as_secs_f64();
                        f.pacer.max(now - Duration::from_millis(2))
                            + Duration::from_secs_f64(path.pkt as f64 / pace.max(1.0))
                    }
                    // Unpaced: the window alone clocks it.
                    Sender::Tcp(_) => now,
                };
            }
        }
        // The next event of any flow: an ACK, its pacer, or its start.
        let mut next = end;
        for f in flows.iter_mut() {
            let start = t0 + f.start;
            if now < start {
                next = next.min(start);
                continue;
            }
            let active = f.stop.is_none_or(|s| now < t0 + s);
            // After the send loop, an active flow with room waits for its pacer.
            let send = (active && !f.window_full()).then_some(f.pacer.max(now));
            let t = match (f.next_ack(), send) {
                (Some(a), Some(p)) => a.min(p),
                (Some(a), None) => a,
                (None, Some(p)) => p,
                (None, None) if f.flight.is_empty() => end,
                (None, None) => {
                    // Everything in flight is lost: a timeout declares it.
                    let t = f.flight.front().expect("in flight").ack_at.max(now);
                    while let Some(p) = f.flight.pop_front() {
                        f.on_loss(t, p.sent);
                    }
                    f.inflight = 0;
                    t
                }
            };
            next = next.min(t);
        }
        now = next.max(now);
        // ACKs that have arrived, and the losses they reveal.
        for f in flows.iter_mut() {
            while let Some(i) = f.flight.iter().position(|p| p.delivered) {
                if f.flight[i].ack_at > now {
                    break;
                }
                let p = f.flight.remove(i).expect("present");
                f.inflight -= path.pkt;
                let sample = p.ack_at - p.sent;
                f.srtt = Some(f.srtt.map_or(sample, |r| (r * 7 + sample) / 8));
                let inflight = f.inflight;
                match &mut f.cc {
                    Sender::Wan(w) => {
                        w.on_ack(p.ack_at, path.pkt, sample);
                        w.on_end_acks(p.ack_at);
                        w.on_flight(inflight);
                    }
                    Sender::Tcp(t) => t.on_ack(p.ack_at, path.pkt, sample),
                }
                let bin = ((p.ack_at - t0).as_secs_f64() * 10.0) as usize;
                if bin < f.bins.len() {
                    f.bins[bin] += path.pkt;
                }
                let last = f.last_acked.map_or(p.seq, |l| l.max(p.seq));
                f.last_acked = Some(last);
                while f
                    .flight
                    .front()
                    .is_some_and(|q| !q.delivered && q.seq + 3 <= last)
                {
                    let q = f.flight.pop_front().expect("present");
                    f.inflight -= path.pkt;
                    f.on_loss(now, q.sent);
                }
            }
        }
    }
    Outcome {
        flows,
        queue_ms,
        rtt: path.one_way * 2,
    }
}

/// One `wan` flow alone on `path`.
fn run(path: &Path, hint: u64, secs: f64, seed: u64) -> Outcome {
    simulate(
        path,
        vec![Flow::wan(Wan::new(path.pkt as u16, hint), 0.0)],
        secs,
        seed,
    )
}

fn gbit(rtt_ms: u64, loss: f64) -> Path {
    let rate = 125e6;
    Path {
        pkt: PKT,
        rate: vec![(Duration::ZERO, rate)],
        one_way: Duration::from_millis(rtt_ms / 2),
        queue_bytes: rate * rtt_ms as f64 / 1e3,
        loss: Loss::Random(loss),
        ack_every: None,
    }
}

#[test]
fn random_loss_is_not_congestion_at_70_and_700_ms() {
    for (rtt, start) in [(70u64, 3.0), (700, 12.0)] {
        let o = run(&gbit(rtt, 1e-3), 0, start + 20.0, 1);
        let r = o.rate(start, start + 20.0);
        assert!(
            r >= 900e6,
            "{rtt} ms, 1e-3: {:.0} Mbit/s once started",
            r / 1e6
        );
    }
}

#[test]
fn one_second_and_one_percent_loss() {
    let o = run(&gbit(1000, 1e-2), 0, 40.0, 2);
    let r = o.rate(15.0, 40.0);
    assert!(r >= 800e6, "1 s, 1e-2: {:.0} Mbit/s once started", r / 1e6);
}

#[test]
fn losses_in_bursts_are_not_congestion_either() {
    // 1e-3 of packets lost, in bursts of 8 on average, at 700 ms.
    let mut p = gbit(700, 0.0);
    p.loss = Loss::Bursts {
        p: 1.25e-4,
        r: 0.125,
    };
    let o = run(&p, 1_000_000_000, 30.0, 6);
    let r = o.rate(5.0, 30.0);
    assert!(r >= 900e6, "700 ms, bursts: {:.0} Mbit/s", r / 1e6);
}

#[test]
fn a_hint_reaches_line_rate_within_three_round_trips() {
    let o = run(&gbit(700, 1e-3), 1_000_000_000, 6.0, 3);
    // First ACKs after one RTT; line rate by the third.
    let r = o.rate(2.1, 2.8);
    assert!(r >= 900e6, "third round trip: {:.0} Mbit/s", r / 1e6);
}

/// Seconds from the start until flow 0 first delivers `bps` averaged over one
/// round trip.
fn time_to(o: &Outcome, bps: f64) -> Option<f64> {
    let rtt = o.rtt.as_secs_f64();
    (0..o.flows[0].bins.len())
        .map(|i| i as f64 / 10.0)
        .find(|&t| o.rate(t, t + rtt) >= bps)
}

#[test]
fn a_cold_start_at_700_ms_reaches_line_rate_in_four_round_trips() {
    // No hint. Per-round rate samples lag a round behind the window, so
    // the rate grew 1.7x a round: 9.3 s here, 15 round trips in the lab
    // with 1452-byte datagrams. Per-ACK samples: 5.2 s; a startup at 2
    // near the bottleneck 6.1 s. The first flight's train reads the
    // bottleneck and startup jumps to pace at it: 1.5 s (first ACKs at
    // 0.7 s).
    for seed in [7, 8] {
        let o = run(&gbit(700, 1e-3), 0, 20.0, seed);
        let t = time_to(&o, 900e6).expect("never at line rate");
        assert!(
            t <= 2.8,
            "seed {seed}: 900 Mbit/s after {t:.1} s ({:.1} round trips)",
            t / 0.7
        );
        let r = o.rate(t, 20.0);
        assert!(r >= 900e6, "seed {seed}: then {:.0} Mbit/s", r / 1e6);
    }
}

#[test]
fn the_standing_queue_stays_under_ten_ms() {
    for (rtt, hint) in [(70u64, 0u64), (700, 0), (700, 1_000_000_000)] {
        let o = run(&gbit(rtt, 0.0), hint, 30.0, 4);
        let q = o.standing_queue(15.0, 28.0);
        assert!(q <= 10.0, "{rtt} ms, hint {hint}: standing queue {q:.1} ms");
    }
}

#[test]
fn a_hint_too_high_is_corrected_and_a_rate_that_halves_is_followed() {
    // Told 2 Gbit/s on a 1 Gbit/s path; at 15 s the path falls to 500 Mbit/s.
    let mut p = gbit(70, 1e-4);
    p.rate.push((Duration::from_secs(15), 62.5e6));
    let o = run(&p, 2_000_000_000, 30.0, 5);
    let before = o.rate(5.0, 15.0);
    let after = o.rate(20.0, 30.0);
    assert!(
        before >= 850e6,
        "before the drop: {:.0} Mbit/s",
        before / 1e6
    );
    assert!(after >= 420e6, "after: {:.0} Mbit/s", after / 1e6);
    let q = o.standing_queue(20.0, 29.0);
    assert!(q <= 10.0, "after the drop: standing queue {q:.1} ms");
}

/// `wan` (built by `make`) beside `n` CUBIC flows at 75 ms RTT, as in seed
/// 004: the TCP flows start first and `wan` joins at 2 s, as in the lab. A
/// loss rate of 1e-6 makes the seed matter. Returns its share of what was
/// delivered from 20 to `secs` seconds, as a multiple of a fair share.
fn share_beside(make: fn() -> Wan, n: usize, secs: f64, seed: u64) -> f64 {
    let mut flows = vec![Flow::wan(make(), 2.0)];
    flows.extend((0..n).map(|i| Flow::cubic(i as f64 * 0.01)));
    let o = simulate(&gbit(75, 1e-6), flows, secs, seed);
    o.share(20.0, secs) * (n + 1) as f64
}

#[test]
fn fair_takes_its_share_beside_one_to_six_cubic_flows() {
    // CUBIC flows are not fair to each other over a minute at this BDP (their
    // epochs last about 20 s; two of three identical flows can differ by 2x),
    // so the bound is on the mean of four seeds, and each run's is looser:
    // over 36 seeds beside 1-4 flows single runs read 0.42-1.31 of a share,
    // means 0.91-0.99 (rounds that end with their ACK, 2026-11-27; before
    // that change 0.59-1.39, means 0.95-1.08: which run is low moves with
    // any change to startup's timing).
    for n in 1..=6 {
        let runs: Vec<f64> = (0..4)
            .map(|seed| share_beside(|| Wan::fair(PKT as u16), n, 120.0, seed))
            .collect();
        let mean = runs.iter().sum::<f64>() / runs.len() as f64;
        assert!(
            (0.7..=1.3).contains(&mean) && runs.iter().all(|s| (0.4..=1.5).contains(s)),
            "beside {n} CUBIC flows: shares {runs:.2?} of a fair one"
        );
    }
}

#[test]
fn default_beside_cubic_takes_at_most_twice_its_share_and_is_not_starved() {
    for n in 1..=6 {
        for seed in 0..2 {
            let s = share_beside(|| Wan::new(PKT as u16, 0), n, 60.0, seed);
            assert!(
                (0.5..=2.0).contains(&s),
                "beside {n} CUBIC flows (seed {seed}): {s:.2} of a fair share"
            );
        }
    }
}

#[test]
fn when_the_competition_leaves_the_default_takes_the_link_back_and_drains_the_queue() {
    let flows = vec![
        Flow::wan(Wan::new(PKT as u16, 0), 2.0),
        Flow::cubic(0.0).until(20.0),
        Flow::cubic(0.0).until(20.0),
    ];
    let o = simulate(&gbit(75, 1e-4), flows, 60.0, 30);
    let r = o.rate(40.0, 60.0);
    assert!(r >= 900e6, "alone again: {:.0} Mbit/s", r / 1e6);
    let q = o.standing_queue(40.0, 59.0);
    assert!(q <= 10.0, "alone again: standing queue {q:.1} ms");
}

#[test]
fn fair_alone_on_a_lossy_path_ignores_losses_without_a_queue() {
    // Kernel CUBIC gets 14 and 3 Mbit/s here (issue 6). `fair` cuts only for
    // losses with a queue, so it fills the path at 70 ms; at 700 ms a CUBIC
    // epoch (back to the window of the last cut) lasts about 40 s, and each
    // cut at a full queue costs most of one.
    // One seeded run is one draw of a chaotic process (at 70 ms, seeds 0-7
    // gave 624-835 Mbit/s): the median of five is what is asserted.
    for (rtt, floor) in [(70u64, 700e6), (700, 300e6)] {
        let mut rates: Vec<f64> = (0..5)
            .map(|seed| {
                let flows = vec![Flow::wan(Wan::fair(PKT as u16), 0.0)];
                simulate(&gbit(rtt, 1e-3), flows, 60.0, seed).rate(20.0, 60.0)
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        let r = rates[2];
        assert!(
            r >= floor,
            "fair alone, {rtt} ms, 1e-3: median {:.0} Mbit/s of {:.0?}",
            r / 1e6,
            rates.iter().map(|r| r / 1e6).collect::<Vec<_>>()
        );
    }
}

#[test]
fn on_short_paths_the_headroom_does_not_ratchet_the_queue() {
    // 5 ms of window headroom is most of a short path's BDP; the queue it
    // keeps must not pass for the path (the path-RTT filter forgets a
    // minimum after 10-20 s).
    // A deep buffer (50 ms), or the queue could not stand above one BDP.
    for rtt in [2u64, 6, 20] {
        let mut p = gbit(rtt, 0.0);
        p.queue_bytes = 125e6 * 0.05;
        let o = run(&p, 0, 60.0, 8);
        let r = o.rate(10.0, 60.0);
        let q = o.standing_queue(40.0, 59.0);
        assert!(r >= 900e6, "{rtt} ms: {:.0} Mbit/s", r / 1e6);
        assert!(q <= 10.0, "{rtt} ms: standing queue {q:.1} ms");
    }
}

#[test]
fn a_rate_that_falls_to_a_fifth_is_followed() {
    // 1 Gbit/s, then 200 Mbit/s from 10 s: every round overflows until the
    // estimate comes down; one cut per overflow must not hold it up.
    let mut p = gbit(70, 1e-4);
    p.rate.push((Duration::from_secs(10), 25e6));
    let o = run(&p, 0, 30.0, 9);
    let after = o.rate(15.0, 30.0);
    assert!(after >= 170e6, "after: {:.0} Mbit/s", after / 1e6);
    // (The standing queue after the fall is 46.7 ms here, before the one
    // cut per overflow as after it: the repeated overflows make `wan`
    // compete as CUBIC does, whose queue that is. Not yet bounded.)
}

/// Seed 001's slow paths: `bps` bit/s, `rtt_ms`, a 50-packet queue of
/// 1500-byte datagrams (the study's dummynet), random loss.
fn slow(bps: f64, rtt_ms: u64, loss: f64) -> Path {
    Path {
        pkt: 1452,
        rate: vec![(Duration::ZERO, bps / 8.0)],
        one_way: Duration::from_millis(rtt_ms / 2),
        queue_bytes: 50.0 * 1500.0,
        loss: Loss::Random(loss),
        ack_every: None,
    }
}

#[test]
fn slow_links_are_filled_without_overflowing_their_queue() {
    // Path A (1 Mbit/s, 70 ms) and path B (256 kbit/s, 250 ms) of seed 001.
    // A first flight above the queue, a startup that fills 600 ms of queue
    // before it sees a loss, or random losses read as congestion on a path
    // this slow cost the TCP tools' lead (issue 27).
    for (bps, rtt) in [(1e6, 70u64), (256e3, 250)] {
        // (the least share of the link delivered in the first 10 s and after)
        for (loss, first, least) in [(0.0, 0.9, 0.93), (0.1, 0.75, 0.8)] {
            for seed in 0..3 {
                let o = run(&slow(bps, rtt, loss), 0, 60.0, seed);
                let f = &o.flows[0];
                let r0 = o.rate(0.0, 10.0) / bps;
                let r = o.rate(10.0, 60.0) / bps;
                let dropped = f.dropped as f64 / f.sent as f64;
                assert!(
                    r0 >= first,
                    "{bps} bit/s, {rtt} ms, loss {loss} (seed {seed}): {r0:.3} of the link in 10 s"
                );
                assert!(
                    r >= least,
                    "{bps} bit/s, {rtt} ms, loss {loss} (seed {seed}): {r:.3} of the link"
                );
                assert!(
                    dropped <= 0.01,
                    "{bps} bit/s, {rtt} ms, loss {loss} (seed {seed}): {:.1} % dropped by the queue",
                    dropped * 100.0
                );
            }
        }
    }
}

#[test]
fn heavy_random_loss_is_made_up_for_in_the_window() {
    // 10 Mbit/s at 300 ms with a one-BDP queue (250 datagrams): lost packets
    // hold their place in the window until declared lost, so a window of
    // the delivered rate's BDP sent (1 - loss) of it; at 10 % every probe
    // cycle delivered less than the last, down to 0.46 of the link.
    for (loss, least) in [(0.03, 0.93), (0.1, 0.85)] {
        for seed in 0..3 {
            let mut p = slow(10e6, 300, loss);
            p.queue_bytes = 250.0 * 1500.0;
            let o = run(&p, 0, 60.0, seed);
            let f = &o.flows[0];
            let r = o.rate(10.0, 60.0) / 10e6;
            let dropped = f.dropped as f64 / f.sent as f64;
            assert!(r >= least, "loss {loss} (seed {seed}): {r:.3} of the link");
            // (the cold start's overshoot into a one-BDP queue included)
            assert!(
                dropped <= 0.02,
                "loss {loss} (seed {seed}): {:.1} % dropped by the queue",
                dropped * 100.0
            );
        }
    }
}

#[test]
fn a_cold_start_does_not_overflow_a_one_bdp_queue() {
    // Startup grows the window 2.89x a round; when the bottleneck is hit
    // it had already sent 2.89 BDP, and a one-BDP queue dropped most of a
    // BDP (2.7 % of a 20 s run here at 700 ms; 67 MB of 500 MB in the lab).
    // Once a round's rate grows less than twice, it grows at 2 at most.
    // A train's jump is followed by growth at 1.5, whose window of 1.5 BDP
    // fits the path and the queue: 0.024-0.033 % dropped at 2, none at 1.5.
    for rtt in [70u64, 700] {
        let o = run(&gbit(rtt, 0.0), 0, 20.0, 7);
        let f = &o.flows[0];
        let dropped = f.dropped as f64 / f.sent as f64;
        assert!(
            dropped <= 0.0001,
            "{rtt} ms: {:.2} % of the packets dropped by the queue",
            dropped * 100.0
        );
        let r = o.rate(10.0, 20.0);
        assert!(r >= 950e6, "{rtt} ms: then {:.0} Mbit/s", r / 1e6);
    }
}

#[test]
fn the_probe_cycle_leaves_the_link_busy() {
    // Probe a quarter up, then back to the BDP: the probe's queue drains
    // while the link stays busy. A drain round a quarter under the BDP left
    // the link idle a quarter of a round in every cycle: 967 Mbit/s at 70
    // ms, 981 at 200 ms. With a receiver that acknowledges on a 4 ms clock
    // the flight a link needs is the BDP and half that clock: the drain
    // round ends once the flight is down to the BDP (held there for the
    // whole round it left the link short: 992.7-993.6 Mbit/s at 70 ms).
    let clock = Some(Duration::from_millis(4));
    for (rtt, loss, ack_every, least) in [
        (70u64, 0.0, None, 990e6),
        (70, 1e-3, None, 990e6),
        (200, 1e-3, None, 990e6),
        (70, 0.0, clock, 996e6),
        (70, 1e-3, clock, 996e6),
    ] {
        let mut p = gbit(rtt, loss);
        p.ack_every = ack_every;
        let o = run(&p, 0, 30.0, 1);
        let r = o.rate(10.0, 30.0);
        assert!(
            r >= least,
            "{rtt} ms, {loss}, ACKs every {ack_every:?}: {:.1} Mbit/s in cruise",
            r / 1e6
        );
        let q = o.standing_queue(10.0, 28.0);
        assert!(
            q <= 10.0,
            "{rtt} ms, {loss}, ACKs every {ack_every:?}: standing queue {q:.1} ms"
        );
    }
}

#[test]
fn joining_a_full_link_overflows_it_once_by_at_most_a_bdp() {
    // One CUBIC flow fills 1 Gbit/s at 70 ms with a one-BDP queue; `wan`
    // joins it cold at six points of its sawtooth (a standing queue of 28-70
    // ms). Its train reads the link's capacity, not what is left of it, so
    // its jump (paced at the capacity, a window of one BDP) overflows the
    // queue once: the flow there loses at most about a BDP of packets in the
    // joiner's first 10 round trips (a jump paced at 1.5 times the capacity
    // lost it 1.3-1.6 BDP) and keeps at least half its rate; the overflow
    // ends startup and does not come back at that scale. (In the lab the flow
    // lost 2.6-3.3 % of its packets over a 3 s get and kept 0.74-0.77 of its
    // rate: docs/PERFORMANCE.md, "Joining a full link".)
    let path = gbit(70, 1e-6);
    let bdp = path.queue_bytes / PKT as f64;
    for (seed, at) in [
        (0u64, 5.0f64),
        (1, 6.3),
        (2, 7.7),
        (3, 9.1),
        (4, 10.4),
        (5, 11.9),
    ] {
        let o = simulate(
            &path,
            vec![Flow::wan(Wan::new(PKT as u16, 0), at), Flow::cubic(0.0)],
            at + 8.0,
            seed,
        );
        let kept = o.rate_of(1, at, at + 0.7) / o.rate_of(1, at - 1.0, at);
        let (join, after) = (
            o.drops_of(1, at, at + 0.7),
            o.drops_of(1, at + 0.7, at + 8.0),
        );
        assert!(
            kept >= 0.5 && join as f64 <= 1.05 * bdp && after <= join / 2,
            "joining at {at} s: the flow there kept {kept:.2} of its rate in the first 10 \
             round trips and lost {join} packets then, {after} in the 7 s after (a BDP: {bdp:.0})"
        );
        let joiner = o.rate(at + 1.0, at + 8.0);
        assert!(
            joiner >= 100e6,
            "joining at {at} s: {:.0} Mbit/s",
            joiner / 1e6
        );
    }
}

#[test]
fn a_slow_links_standing_queue_does_not_creep_over_ten_minutes() {
    // The window keeps a few datagrams beyond the BDP (five on a slow link)
    // and the path RTT is the least RTT of the last 10-20 s: if that
    // filter took the queue the window keeps for the path, the BDP grew
    // with it and the queue with the BDP. Before the filter held the path
    // against the queue its own window keeps: 580 ms of standing queue
    // after 300 s at 1 Mbit/s / 70 ms and 7.9 % of the datagrams dropped by
    // the 50-packet queue; 2.3 s at 256 kbit/s.
    for (bps, rtt) in [(1e6, 70u64), (256e3, 250)] {
        // (One of the simulator's 1452-byte datagrams, in ms.)
        let packet_ms = 1452.0 * 8.0 / bps * 1e3;
        for loss in [0.0, 0.01] {
            let o = run(&slow(bps, rtt, loss), 0, 600.0, 3);
            let f = &o.flows[0];
            let r = o.rate(300.0, 600.0) / bps;
            let q = o.standing_queue(300.0, 590.0);
            let early = o.standing_queue(30.0, 90.0);
            assert!(
                r >= 0.99 * (1.0 - loss),
                "{bps} bit/s, loss {loss}: {r:.4} of the link after 300 s"
            );
            assert!(
                q <= 6.0 * packet_ms && q <= early + packet_ms,
                "{bps} bit/s, loss {loss}: {q:.0} ms of standing queue after 300 s, \
                 {early:.0} ms at 30-90 s"
            );
            // (Startup included: its first window and ramp fit the queue.)
            assert_eq!(
                f.dropped, 0,
                "{bps} bit/s, loss {loss}: dropped by the queue"
            );
        }
    }
}

#[test]
fn a_cold_start_on_a_short_path_is_not_held_at_the_floor() {
    // On a short path the queue the headroom keeps is emptied now and then
    // (a window of four datagrams until it is surely gone, 20 ms or more);
    // the first time 5 s into cruise, not as startup ends, where it held
    // a LAN get of 2,000 files of 10 kB (0.2 s) for a tenth of its time.
    for us in [200u64, 1_000] {
        // 1 Gbit/s with 10 ms of queue.
        let mut p = gbit(0, 0.0);
        p.one_way = Duration::from_micros(us / 2);
        p.queue_bytes = 125e6 * 0.01;
        let o = run(&p, 0, 7.0, 3);
        let early = o.rate(0.0, 0.1);
        // (973 and 966 Mbit/s; with the floor at once 914 and 816.)
        assert!(
            early >= 940e6,
            "{us} us: {:.0} Mbit/s in the first 100 ms",
            early / 1e6
        );
        // The queue is still emptied later: some packet met none.
        let least = o.queue_ms[40..70]
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        assert!(
            least < 0.1,
            "{us} us: the queue never emptied ({least:.2} ms)"
        );
    }
}
