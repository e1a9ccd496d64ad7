//! longhaul's controller (`wan::Wan`) against a simulated bottleneck: simulated
//! time, seeded random loss, a FIFO queue of one BDP with tail drop, ACK per
//! packet. The sender is driven as quinn drives a controller: at most `window`
//! bytes in flight, paced at 1.25 × window / smoothed RTT, a packet declared lost
//! once three later ones are acknowledged.

use longhaul_quic::wan::Wan;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Large simulated packets keep the event count low; the controller sees bytes.
const PKT: u64 = 9000;

struct Path {
    /// Bytes per second, and from when (a rate change mid-run).
    rate: Vec<(Duration, f64)>,
    one_way: Duration,
    queue_bytes: f64,
    loss: f64,
}

struct Outcome {
    /// Bytes acknowledged per 100 ms bin.
    bins: Vec<u64>,
    /// The smallest queueing delay (ms) a packet met at the bottleneck, per
    /// 100 ms bin.
    queue_ms: Vec<f64>,
    rtt: Duration,
    dropped_by_queue: u64,
}

impl Outcome {
    /// Mean delivery rate in bit/s from `a` to `b` seconds.
    fn rate(&self, a: f64, b: f64) -> f64 {
        let (i, j) = ((a * 10.0) as usize, (b * 10.0) as usize);
        let bytes: u64 = self.bins[i..j.min(self.bins.len())].iter().sum();
        bytes as f64 * 8.0 / (b - a)
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

fn run(path: &Path, hint: u64, secs: f64, seed: u64) -> Outcome {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let mut cc = Wan::new(PKT as u16, hint);
    let rate_at = |t: Instant| {
        let d = t - t0;
        path.rate
            .iter()
            .rev()
            .find(|(from, _)| d >= *from)
            .map_or(path.rate[0].1, |r| r.1)
    };
    // In flight: (seq, sent, ack arrives at, delivered?)
    let mut flight: VecDeque<(u64, Instant, Instant, bool)> = VecDeque::new();
    let mut inflight = 0u64;
    let mut seq = 0u64;
    let mut link_free = t0;
    let mut pacer = t0;
    let mut srtt: Option<Duration> = None;
    let nbins = (secs * 10.0) as usize + 1;
    let mut out = Outcome {
        bins: vec![0; nbins],
        queue_ms: vec![f64::INFINITY; nbins],
        rtt: path.one_way * 2,
        dropped_by_queue: 0,
    };
    let mut now = t0;
    let mut last_acked_seq: Option<u64> = None;
    while now < end {
        // Send while the window and the pacer allow.
        while inflight + PKT <= cc.window() && pacer <= now {
            let rate = rate_at(now);
            // Bottleneck: the queue ahead of this packet, in bytes.
            let backlog = link_free.saturating_duration_since(now).as_secs_f64() * rate;
            let bin = ((now - t0).as_secs_f64() * 10.0) as usize;
            if backlog + PKT as f64 > path.queue_bytes {
                out.dropped_by_queue += 1;
                flight.push_back((seq, now, now + path.one_way * 2, false));
            } else {
                let depart = link_free.max(now) + Duration::from_secs_f64(PKT as f64 / rate);
                out.queue_ms[bin] = out.queue_ms[bin].min(backlog / rate * 1e3);
                link_free = depart;
                let delivered = rng.gen::<f64>() >= path.loss;
                flight.push_back((seq, now, depart + path.one_way * 2, delivered));
            }
            seq += 1;
            inflight += PKT;
            let rtt = srtt.unwrap_or(Duration::from_millis(100));
            let pace = cc.window() as f64 * 1.25 / rtt.as_secs_f64();
            pacer = pacer.max(now - Duration::from_millis(2))
                + Duration::from_secs_f64(PKT as f64 / pace.max(1.0));
        }
        // Next: the next ACK (or loss discovery), or the pacer.
        let next_ack = flight.iter().find(|f| f.3).map(|f| f.2);
        let next = match next_ack {
            Some(a) if inflight + PKT > cc.window() => a,
            Some(a) => a.min(pacer.max(now)),
            None if inflight + PKT > cc.window() => {
                // Everything in flight is lost: a timeout declares it.
                let f = flight.front().expect("in flight");
                let t = f.2.max(now);
                for f in flight.drain(..) {
                    let _ = f;
                    cc.on_loss(t, PKT);
                }
                inflight = 0;
                t
            }
            None => pacer.max(now),
        };
        now = next.max(now);
        // ACKs that have arrived, and the losses they reveal (3 later packets).
        while let Some(i) = flight.iter().position(|f| f.3 && f.2 <= now) {
            let (s, sent, at, _) = flight.remove(i).expect("present");
            inflight -= PKT;
            let sample = at - sent;
            srtt = Some(srtt.map_or(sample, |r| (r * 7 + sample) / 8));
            cc.on_ack(at, PKT, sample);
            let bin = ((at - t0).as_secs_f64() * 10.0) as usize;
            if bin < out.bins.len() {
                out.bins[bin] += PKT;
            }
            last_acked_seq = Some(last_acked_seq.map_or(s, |l: u64| l.max(s)));
            while flight
                .front()
                .is_some_and(|f| !f.3 && f.0 + 3 <= last_acked_seq.unwrap_or(0))
            {
                flight.pop_front();
                inflight -= PKT;
                cc.on_loss(now, PKT);
            }
        }
    }
    out
}

fn gbit(rtt_ms: u64, loss: f64) -> Path {
    let rate = 125e6;
    Path {
        rate: vec![(Duration::ZERO, rate)],
        one_way: Duration::from_millis(rtt_ms / 2),
        queue_bytes: rate * rtt_ms as f64 / 1e3,
        loss,
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
fn a_hint_reaches_line_rate_within_three_round_trips() {
    let o = run(&gbit(700, 1e-3), 1_000_000_000, 6.0, 3);
    // First ACKs after one RTT; line rate by the third.
    let r = o.rate(2.1, 2.8);
    assert!(r >= 900e6, "third round trip: {:.0} Mbit/s", r / 1e6);
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
