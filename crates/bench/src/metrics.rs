//! What a run measured, made into numbers: CPU split by side, bytes at
//! the receivers, background traffic, the steady rate and queue, goodput.

use crate::tools::Host;
use std::path::Path;

/// The port background iperf3 traffic uses (its flows are counted apart).
pub(crate) const BACKGROUND_PORT: u16 = 5301;

/// Bytes the background's data flows (to its port; not their ACKs) have
/// moved, by one of their counters.
pub(crate) fn background_total(
    s: &longhaul_netem::Snapshot,
    f: fn(&longhaul_netem::hub::FlowCounters) -> u64,
) -> u64 {
    s.flows
        .iter()
        .filter(|x| x.flow.dport == BACKGROUND_PORT)
        .map(|x| f(&x.counters))
        .sum()
}

/// How much one counter of the background's data flows (bytes or packets)
/// grew between two snapshots.
pub(crate) fn background_delta(
    before: &longhaul_netem::Snapshot,
    after: &longhaul_netem::Snapshot,
    f: fn(&longhaul_netem::hub::FlowCounters) -> u64,
) -> u64 {
    background_total(after, f).saturating_sub(background_total(before, f))
}

/// Bytes lab host `host` offered to the emulator between two snapshots
/// (IP bytes of its uplink).
pub(crate) fn up_bytes(
    before: &longhaul_netem::Snapshot,
    after: &longhaul_netem::Snapshot,
    host: &str,
) -> u64 {
    let at = |s: &longhaul_netem::Snapshot| {
        s.hosts
            .iter()
            .find(|x| x.name == host)
            .map_or(0, |x| x.up.counters.offered_bytes)
    };
    at(after).saturating_sub(at(before))
}

/// Bytes the background's flows sent back (their ACKs, from its port)
/// between two snapshots.
pub(crate) fn background_back_bytes(
    before: &longhaul_netem::Snapshot,
    after: &longhaul_netem::Snapshot,
) -> u64 {
    let total = |s: &longhaul_netem::Snapshot| -> u64 {
        s.flows
            .iter()
            .filter(|x| x.flow.sport == BACKGROUND_PORT)
            .map(|x| x.counters.offered_bytes)
            .sum()
    };
    total(after).saturating_sub(total(before))
}

/// The background's data flows' own series (100 ms buckets of IP bytes
/// delivered) at `after`, or None when one of them delivered between
/// `before` and `after` without one (the emulator lets go of a quiet flow's
/// series and keeps none past its flow table): then only its counters are
/// known. Flows that were let go of while quiet delivered nothing meanwhile
/// and are left out.
pub(crate) fn background_series<'a>(
    before: &longhaul_netem::Snapshot,
    after: &'a longhaul_netem::Snapshot,
) -> Option<Vec<&'a longhaul_netem::Series>> {
    let mut out = Vec::new();
    for x in after
        .flows
        .iter()
        .filter(|x| x.flow.dport == BACKGROUND_PORT)
    {
        match &x.series {
            Some(s) => out.push(s),
            None => {
                let was = before
                    .flows
                    .iter()
                    .find(|y| y.flow == x.flow)
                    .map_or(0, |y| y.counters.delivered_bytes);
                if x.counters.delivered_bytes != was {
                    return None;
                }
            }
        }
    }
    Some(out)
}

/// Bytes a 100 ms series holds between `from_ms` and `to_ms` of the
/// emulator's clock, the buckets at either end counted in proportion.
pub(crate) fn window_bytes(s: &longhaul_netem::Series, from_ms: f64, to_ms: f64) -> f64 {
    let width = s.interval_ms.max(1) as f64;
    let (a, b) = (from_ms.max(0.0) / width, to_ms.max(0.0) / width);
    if b <= a {
        return 0.0;
    }
    let mut sum = 0.0;
    for k in a.floor() as u64..b.ceil() as u64 {
        let Some(v) = k.checked_sub(s.first).and_then(|i| s.bytes.get(i as usize)) else {
            continue;
        };
        let overlap = (b.min((k + 1) as f64) - a.max(k as f64)).max(0.0);
        sum += *v as f64 * overlap;
    }
    sum
}

/// Jain's fairness index of the rates (Jain, Chiu and Hawe 1984):
/// (Σx)² / (n · Σx²); 1 when all are equal, 1/n when one has everything.
/// None for fewer than two rates or none above zero.
pub(crate) fn jain(rates: &[f64]) -> Option<f64> {
    let sum: f64 = rates.iter().sum();
    let squares: f64 = rates.iter().map(|x| x * x).sum();
    (rates.len() >= 2 && squares > 0.0).then(|| sum * sum / (rates.len() as f64 * squares))
}

/// What the background traffic kept of its rate when the tool joined: its
/// bytes per ms over `join` (from, to: ms of the emulator's clock; the
/// tool's first round trips) over its bytes per ms over `before` (a span
/// before the tool started). 1.0: the tool took nothing from it at first;
/// 0.5: it lost half. None for an empty span or nothing delivered before.
pub(crate) fn kept(
    flows: &[&longhaul_netem::Series],
    before: (f64, f64),
    join: (f64, f64),
) -> Option<f64> {
    let rate = |(from, to): (f64, f64)| -> Option<f64> {
        (to > from)
            .then(|| flows.iter().map(|s| window_bytes(s, from, to)).sum::<f64>() / (to - from))
    };
    let (b, j) = (rate(before)?, rate(join)?);
    (b > 0.0).then(|| j / b)
}

/// A counter's value at `t_ms`, read linearly between (time, value) marks
/// (flat before the first and after the last).
pub(crate) fn interpolate(marks: &[(u64, u64)], t_ms: u64) -> f64 {
    let i = marks.partition_point(|m| m.0 <= t_ms);
    match (i.checked_sub(1).map(|j| marks[j]), marks.get(i)) {
        (Some((t0, v0)), Some(&(t1, v1))) if t1 > t0 => {
            v0 as f64 + (v1 as f64 - v0 as f64) * (t_ms - t0) as f64 / (t1 - t0) as f64
        }
        (Some((_, v0)), _) => v0 as f64,
        (None, Some(&(_, v1))) => v1 as f64,
        (None, None) => 0.0,
    }
}

#[derive(Default)]
pub(crate) struct CpuSplit {
    pub(crate) server: f64,
    pub(crate) receivers: f64,
}

impl CpuSplit {
    pub(crate) fn add(&mut self, h: Host, s: f64) {
        match h {
            Host::Server => self.server += s,
            Host::Receiver(_) => self.receivers += s,
        }
    }
}

/// Whether any file under `dir` has a byte yet (stops at the first).
pub(crate) fn has_a_byte(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| match e.file_type() {
        Ok(t) if t.is_dir() => has_a_byte(&e.path()),
        Ok(t) if t.is_file() => e.metadata().is_ok_and(|m| m.len() > 0),
        _ => false,
    })
}

/// Bytes present in the files under `dir`: a file's length, or less when
/// blocks are missing (tools that write at offsets, like longhaul and UFTP,
/// make files of full length that fill in as data arrives).
pub(crate) fn tree_bytes(dir: &Path) -> u64 {
    files_under(dir, false).1
}

/// The regular files under `dir` that are not hidden (longhaul's part files
/// are `.NAME.lh-part`), and the bytes present in them (as [`tree_bytes`]):
/// a receiver holds the whole data set once both reach the set's.
pub(crate) fn visible_files(dir: &Path) -> (u64, u64) {
    files_under(dir, true)
}

/// The regular files under `dir` and the bytes present in them, leaving out
/// hidden names (and what is below them) if `skip_hidden`.
fn files_under(dir: &Path, skip_hidden: bool) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    rd.flatten()
        .filter(|e| !(skip_hidden && e.file_name().as_encoded_bytes().starts_with(b".")))
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => files_under(&e.path(), skip_hidden),
            Ok(t) if t.is_file() => (1, e.metadata().map_or(0, |m| m.len().min(m.blocks() * 512))),
            _ => (0, 0),
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// A run once at speed: its mean rate, and the standing queue it kept.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Steady {
    pub mbps: f64,
    pub queue_ms: Option<f64>,
    pub queue_max_ms: Option<f64>,
}

/// What a run did once at speed, from its 100 ms series and the least queue
/// wait (us) a packet met in each 100 ms: the whole seconds from the first
/// that delivered 90 % of the best second to the last that delivered half of
/// it (the start-up before, the tail after, are left out). The standing queue
/// of a second is the least wait in it (a queue that did not empty within a
/// second, as CoDel reads a standing queue); reported are the median and the
/// largest of those. None without a second of data.
pub(crate) fn steady(series_mbps: &[f64], waits_us: &[Option<u32>]) -> Option<Steady> {
    let secs: Vec<f64> = series_mbps
        .chunks_exact(10)
        .map(|c| c.iter().sum::<f64>() / 10.0)
        .collect();
    let best = secs.iter().copied().fold(0.0, f64::max);
    if best <= 0.0 {
        return None;
    }
    let start = secs.iter().position(|&r| r >= 0.9 * best)?;
    let end = secs.iter().rposition(|&r| r >= 0.5 * best)?.max(start);
    let span = &secs[start..=end];
    let mbps = span.iter().sum::<f64>() / span.len() as f64;
    let mut least: Vec<u32> = (start..=end)
        .filter_map(|k| {
            waits_us
                .get(k * 10..(k * 10 + 10).min(waits_us.len()))?
                .iter()
                .flatten()
                .min()
                .copied()
        })
        .collect();
    least.sort_unstable();
    let ms = |us: u32| us as f64 / 1000.0;
    Some(Steady {
        mbps,
        queue_ms: least.get(least.len() / 2).map(|&w| ms(w)),
        queue_max_ms: least.last().map(|&w| ms(w)),
    })
}

/// The first 100 ms of a run's series that carried data: 1 Mbit/s (about
/// eight full-size packets), or a tenth of a slower link; more than a
/// handshake, as little as a first flight. None if none did.
pub(crate) fn first_data(series_mbps: &[f64], link_mbps: f64) -> Option<usize> {
    let floor = (0.1 * link_mbps).min(1.0);
    series_mbps.iter().position(|&r| r >= floor)
}

/// Start-up at a glance, from the 100 ms series and the link's rate: seconds
/// from the first data (the start of the 100 ms [`first_data`] finds) to the
/// end of the first 100 ms that carried 90 % of the link; None if no 100 ms
/// ever did (or the link has no rate).
pub(crate) fn to_90pct(series_mbps: &[f64], link_mbps: f64) -> Option<f64> {
    if link_mbps <= 0.0 {
        return None;
    }
    let first = first_data(series_mbps, link_mbps)?;
    let reach = series_mbps[first..]
        .iter()
        .position(|&r| r >= 0.9 * link_mbps)?;
    Some((reach + 1) as f64 / 10.0)
}

/// TTP (seed 003): (delivered payload bits / the path's rate) / wall time, so
/// 1.0 moved the data at the rate of the bottleneck
/// ([`crate::scenario::Plan::ttp_rate_bps`]).
pub(crate) fn ttp(delivered: u64, wall_s: f64, rate_bps: u64) -> f64 {
    (delivered as f64 * 8.0 / rate_bps as f64) / wall_s
}

/// G as seed 003 defines it: payload bytes delivered (one copy) / bytes the
/// server sent on the wire.
pub(crate) fn goodput(delivered: u64, wire: u64) -> f64 {
    delivered as f64 / wire.max(1) as f64
}

/// Core-seconds the whole machine spent busy so far (every CPU's time that
/// was neither idle nor waiting for I/O, from /proc/stat): what the tool's
/// processes, the emulator and the kernel's packet work (softirqs, which no
/// process is charged for) used together. None where /proc/stat is unreadable.
pub(crate) fn machine_busy_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    busy_from_stat(&stat)
}

fn busy_from_stat(stat: &str) -> Option<f64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq (then steal, the time the
    // hypervisor ran others, not counted; guest times are already in user
    // and nice).
    let (idle, iowait) = (*ticks.get(3)?, *ticks.get(4)?);
    let total: f64 = ticks.iter().take(7).sum();
    Some((total - idle - iowait) / crate::proc::clock_ticks())
}

#[cfg(test)]
mod flow_tests {
    use longhaul_netem::Series;

    fn series(first: u64, bytes: &[u64]) -> Series {
        Series {
            interval_ms: 100,
            first,
            bytes: bytes.iter().copied().collect(),
        }
    }

    #[test]
    fn window_bytes_counts_edge_buckets_in_proportion() {
        let s = series(2, &[100, 200, 400]);
        // Buckets 2-4 cover 200-500 ms.
        assert_eq!(super::window_bytes(&s, 0.0, 1000.0), 700.0);
        assert_eq!(super::window_bytes(&s, 250.0, 350.0), 50.0 + 100.0);
        assert_eq!(super::window_bytes(&s, 0.0, 200.0), 0.0);
        assert_eq!(super::window_bytes(&s, 450.0, 450.0), 0.0);
    }

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_has_all() {
        assert_eq!(super::jain(&[5.0, 5.0, 5.0]), Some(1.0));
        assert_eq!(super::jain(&[9.0, 0.0, 0.0]), Some(1.0 / 3.0));
        let j = super::jain(&[1.0, 3.0]).unwrap();
        assert!((j - 16.0 / 20.0).abs() < 1e-12, "{j}");
        assert_eq!(super::jain(&[4.0]), None);
        assert_eq!(super::jain(&[0.0, 0.0]), None);
    }

    #[test]
    fn kept_compares_the_join_with_the_span_before() {
        // Two flows at 1000 B per 100 ms each until 1 s, then 500 each.
        let a = series(
            0,
            &[1000; 10]
                .iter()
                .chain(&[500; 10])
                .copied()
                .collect::<Vec<_>>(),
        );
        let b = a.clone();
        let k = super::kept(&[&a, &b], (0.0, 1000.0), (1000.0, 1700.0)).unwrap();
        assert!((k - 0.5).abs() < 1e-12, "{k}");
        // From the first data at 1.3 s.
        let k = super::kept(&[&a, &b], (0.0, 1000.0), (1300.0, 2000.0)).unwrap();
        assert!((k - 0.5).abs() < 1e-12, "{k}");
        // Nothing before, or an empty span: no ratio.
        let late = series(10, &[500; 10]);
        assert_eq!(super::kept(&[&late], (0.0, 1000.0), (1000.0, 1700.0)), None);
        assert_eq!(super::kept(&[&a], (0.0, 1000.0), (1700.0, 1700.0)), None);
    }
}

#[cfg(test)]
mod busy_tests {
    #[test]
    fn busy_time_leaves_out_idle_and_io_wait() {
        let hz = crate::proc::clock_ticks();
        let s = "cpu  100 5 50 1000 20 3 7 2 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n";
        let b = super::busy_from_stat(s).unwrap();
        assert!((b - 165.0 / hz).abs() < 1e-9, "{b}");
        assert!(super::busy_from_stat("intr 1 2\n").is_none());
        assert!(super::machine_busy_s().unwrap() > 0.0);
    }
}
