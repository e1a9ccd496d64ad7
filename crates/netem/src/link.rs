//! One direction of a link: drop-tail queue → serialiser at `rate` → loss on
//! the wire → propagation `delay ± jitter`. Sans-IO: time is a number of
//! nanoseconds the caller supplies, packets are opaque handles.
//!
//! Order of events for an offered packet:
//! 1. the queue (packets not yet fully serialised, including the one on the
//!    wire) is full → dropped by the queue;
//! 2. otherwise it waits for the serialiser, which is busy `len·8/rate` per
//!    packet (rate counts IP bytes);
//! 3. the loss model decides whether it is lost on the wire (it still used its
//!    serialisation time, as on a real path);
//! 4. it is delivered at `tx_end + delay + U(-jitter, +jitter)`, never before
//!    the packet ahead of it (a link does not reorder).

use crate::gso::Shape;
use crate::loss::{Loss, Rng};
use crate::spec::{DirSpec, QueueLimit};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// How late packets left versus their schedule, as a histogram.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Lateness {
    pub count: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
    /// Counts of lateness ≤ 10 µs, ≤ 100 µs, ≤ 1 ms, ≤ 10 ms, > 10 ms.
    pub hist: [u64; 5],
}

impl Lateness {
    pub fn record(&mut self, ns: u64) {
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
        let i = match ns {
            0..=10_000 => 0,
            10_001..=100_000 => 1,
            100_001..=1_000_000 => 2,
            1_000_001..=10_000_000 => 3,
            _ => 4,
        };
        self.hist[i] += 1;
    }

    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }
}

/// Counters of one direction.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DirCounters {
    pub offered_pkts: u64,
    pub offered_bytes: u64,
    /// Dropped by the loss model.
    pub lost_pkts: u64,
    pub lost_bytes: u64,
    /// Dropped because the queue was full.
    pub queue_drop_pkts: u64,
    pub queue_drop_bytes: u64,
    pub delivered_pkts: u64,
    pub delivered_bytes: u64,
    /// Highest queue occupancy seen.
    pub queue_hwm_pkts: u64,
    pub queue_hwm_bytes: u64,
    pub late: Lateness,
}

impl DirCounters {
    /// Packets dropped by the loss model or a full queue.
    pub(crate) fn dropped_pkts(&self) -> u64 {
        self.lost_pkts + self.queue_drop_pkts
    }
}

/// Delivered bytes per interval: bucket `first + i` (the emulator's time /
/// `interval_ms`) holds `bytes[i]`; none before the first delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// The width of a bucket, ms (100 in every series the hub keeps).
    pub interval_ms: u64,
    /// Index of `bytes[0]` (buckets before it were discarded to bound memory,
    /// or saw no delivery yet).
    pub first: u64,
    /// IP bytes delivered in each bucket from `first` on.
    pub bytes: VecDeque<u64>,
}

/// One hour of 100 ms buckets.
const SERIES_KEEP: usize = 36_000;

impl Series {
    /// An empty series of `interval_ms` buckets.
    pub fn new(interval_ms: u64) -> Self {
        Series {
            interval_ms,
            first: 0,
            bytes: VecDeque::new(),
        }
    }

    /// Counts `bytes` delivered at `at_ns` (the emulator's clock).
    pub fn add(&mut self, at_ns: u64, bytes: u64) {
        let idx = at_ns / (self.interval_ms * 1_000_000);
        if self.bytes.is_empty() {
            // Nothing before the first delivery: a flow that starts an
            // hour in holds no hour of empty buckets.
            self.first = self.first.max(idx);
        }
        if let Some(b) = bucket(&mut self.first, &mut self.bytes, idx, 0) {
            *b += bytes;
        }
    }
}

/// The slot for bucket `idx` of a series that starts at bucket `first`,
/// appending `empty` slots up to it (and dropping the oldest beyond
/// [`SERIES_KEEP`]); None for a bucket already dropped.
fn bucket<'a, T: Copy>(
    first: &mut u64,
    v: &'a mut VecDeque<T>,
    idx: u64,
    empty: T,
) -> Option<&'a mut T> {
    if idx < *first {
        return None;
    }
    while *first + (v.len() as u64) <= idx {
        if v.len() == SERIES_KEEP {
            v.pop_front();
            *first += 1;
        }
        v.push_back(empty);
    }
    v.get_mut((idx - *first) as usize)
}

/// The least time an arriving packet waited in the queue before its
/// serialisation began, per interval, in microseconds ([`QueueSeries::NONE`]:
/// nothing arrived). A queue that does not empty within an interval is a
/// standing queue, not a burst: a burst's first packet finds it short.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueSeries {
    pub interval_ms: u64,
    /// Index of `min_wait_us[0]`.
    pub first: u64,
    pub min_wait_us: VecDeque<u32>,
}

impl Default for QueueSeries {
    fn default() -> Self {
        QueueSeries::new(100)
    }
}

impl QueueSeries {
    pub const NONE: u32 = u32::MAX;

    pub fn new(interval_ms: u64) -> Self {
        QueueSeries {
            interval_ms,
            first: 0,
            min_wait_us: VecDeque::new(),
        }
    }

    pub fn record(&mut self, at_ns: u64, wait_ns: u64) {
        let idx = at_ns / (self.interval_ms * 1_000_000);
        let us = (wait_ns / 1000).min(Self::NONE as u64 - 1) as u32;
        if let Some(m) = bucket(&mut self.first, &mut self.min_wait_us, idx, Self::NONE) {
            *m = (*m).min(us);
        }
    }

    /// The least wait in bucket `idx`, if anything arrived in it.
    pub fn get(&self, idx: u64) -> Option<u32> {
        idx.checked_sub(self.first)
            .and_then(|i| self.min_wait_us.get(i as usize))
            .copied()
            .filter(|&w| w != Self::NONE)
    }
}

/// Surviving segments of an offered train, handed back by `pop_due`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Train<T> {
    /// When its last segment arrives (ns).
    pub due: u64,
    /// Its segments: `first..first + count` of the offered packet's shape.
    pub first: u32,
    pub count: u32,
    /// Wire bytes.
    pub bytes: u64,
    pub item: T,
}

/// Segments of one aggregate that arrive within this span (ns) of the first
/// are handed back together, as one train; a longer aggregate (a slow link)
/// is cut into several.
pub(crate) const TRAIN_NS: u64 = 1_000_000;

/// One direction of a link.
pub(crate) struct DirLink<T> {
    spec: DirSpec,
    loss: Loss,
    rng: Rng,
    /// (tx_end, len) of segments not fully serialised at the last offer.
    queue: VecDeque<(u64, u32)>,
    queue_bytes: u64,
    busy_until: u64,
    last_arrival: u64,
    last_due: u64,
    train_ns: u64,
    in_flight: VecDeque<Train<T>>,
    pub counters: DirCounters,
    pub series: Series,
    /// Rate-limited links only.
    pub queue_series: QueueSeries,
}

impl<T: Clone> DirLink<T> {
    pub(crate) fn new(spec: DirSpec, seed: u64) -> Self {
        DirLink {
            spec,
            loss: Loss::new(spec.loss),
            rng: Rng::new(seed),
            queue: VecDeque::with_capacity(1024),
            queue_bytes: 0,
            busy_until: 0,
            last_arrival: 0,
            last_due: 0,
            train_ns: TRAIN_NS,
            in_flight: VecDeque::with_capacity(1024),
            counters: DirCounters::default(),
            series: Series::new(100),
            queue_series: QueueSeries::new(100),
        }
    }

    /// Offers segments `first..first + count` of a packet shaped `shape`,
    /// arriving at `now` (ns). Each segment meets the queue, the serialiser
    /// and the loss model on its own; the survivors are kept as trains
    /// (consecutive segments due within `TRAIN_NS` of each other), each
    /// holding a clone of `item`. Returns the number of trains kept.
    pub(crate) fn offer(
        &mut self,
        now: u64,
        shape: &Shape,
        first: u32,
        count: u32,
        item: T,
    ) -> u32 {
        // Arrivals are monotonic per link even if the caller's events are not.
        let now = now.max(self.last_arrival);
        self.last_arrival = now;
        let mut kept = 0;
        // The train being built, and when its first segment arrives.
        let mut run: Option<(Train<()>, u64)> = None;
        for i in first..first + count {
            let len = shape.seg_len(i);
            let Some(due) = self.segment(now, len) else {
                if let Some((r, _)) = run.take() {
                    self.push(r, item.clone());
                    kept += 1;
                }
                continue;
            };
            match &mut run {
                Some((r, start)) if due - *start <= self.train_ns => {
                    r.count += 1;
                    r.bytes += len as u64;
                    r.due = due;
                }
                _ => {
                    if let Some((r, _)) = run.take() {
                        self.push(r, item.clone());
                        kept += 1;
                    }
                    let r = Train {
                        due,
                        first: i,
                        count: 1,
                        bytes: len as u64,
                        item: (),
                    };
                    run = Some((r, due));
                }
            }
        }
        if let Some((r, _)) = run {
            self.push(r, item);
            kept += 1;
        }
        kept
    }

    fn push(&mut self, r: Train<()>, item: T) {
        self.in_flight.push_back(Train {
            due: r.due,
            first: r.first,
            count: r.count,
            bytes: r.bytes,
            item,
        });
    }

    /// One segment of `len` bytes: its arrival time, or `None` if the queue
    /// or the loss model dropped it.
    fn segment(&mut self, now: u64, len: u32) -> Option<u64> {
        let c = &mut self.counters;
        c.offered_pkts += 1;
        c.offered_bytes += len as u64;

        let tx_end = match self.spec.rate_bps {
            None => now,
            Some(rate) => {
                while let Some(&(end, l)) = self.queue.front() {
                    if end > now {
                        break;
                    }
                    self.queue.pop_front();
                    self.queue_bytes -= l as u64;
                }
                let full = match self.spec.queue {
                    QueueLimit::Packets(n) => self.queue.len() >= n as usize,
                    QueueLimit::Bytes(b) => self.queue_bytes + len as u64 > b,
                };
                if full {
                    c.queue_drop_pkts += 1;
                    c.queue_drop_bytes += len as u64;
                    return None;
                }
                let tx_ns = (len as u128 * 8_000_000_000).div_ceil(rate as u128) as u64;
                let start = self.busy_until.max(now);
                self.queue_series.record(now, start - now);
                let end = start + tx_ns;
                self.busy_until = end;
                self.queue.push_back((end, len));
                self.queue_bytes += len as u64;
                c.queue_hwm_pkts = c.queue_hwm_pkts.max(self.queue.len() as u64);
                c.queue_hwm_bytes = c.queue_hwm_bytes.max(self.queue_bytes);
                end
            }
        };

        if self.loss.lose(&mut self.rng) {
            c.lost_pkts += 1;
            c.lost_bytes += len as u64;
            return None;
        }

        let mut due = tx_end + self.spec.delay_ns;
        if self.spec.jitter_ns > 0 {
            let j = self.spec.jitter_ns as f64;
            let offset = (self.rng.unit() * 2.0 - 1.0) * j;
            due = (due as f64 + offset).max(tx_end as f64) as u64;
        }
        let due = due.max(self.last_due);
        self.last_due = due;
        Some(due)
    }

    /// When the next train is due, if any is in flight.
    pub(crate) fn next_due(&self) -> Option<u64> {
        self.in_flight.front().map(|p| p.due)
    }

    /// Hands back the next train due at or before `now`, and counts it delivered.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<Train<T>> {
        if self.in_flight.front()?.due > now {
            return None;
        }
        let t = self.in_flight.pop_front()?;
        self.counters.delivered_pkts += t.count as u64;
        self.counters.delivered_bytes += t.bytes;
        self.series.add(t.due, t.bytes);
        Some(t)
    }

    /// Trains accepted and not yet handed back.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{LinkSpec, LossSpec};

    fn dir(spec: &str) -> DirSpec {
        spec.parse::<LinkSpec>().unwrap().up
    }

    const MS: u64 = 1_000_000;

    impl<T: Clone> DirLink<T> {
        /// A plain packet of `len` bytes (one segment); true if it is on its way.
        fn offer_packet(&mut self, now: u64, len: u32, item: T) -> bool {
            self.offer(now, &Shape::single(len), 0, 1, item) == 1
        }
    }

    /// (due, bytes, item) of the next train due by `now`.
    fn pop(l: &mut DirLink<u64>, now: u64) -> Option<(u64, u64, u64)> {
        l.pop_due(now).map(|t| (t.due, t.bytes, t.item))
    }

    #[test]
    fn delay_only_delivers_after_exactly_the_delay() {
        let mut l = DirLink::new(dir("delay=35ms"), 1);
        assert!(l.offer_packet(10, 1500, 1));
        assert!(l.offer_packet(20, 1500, 2));
        assert_eq!(l.next_due(), Some(10 + 35 * MS));
        assert_eq!(pop(&mut l, 35 * MS), None);
        assert_eq!(pop(&mut l, 35 * MS + 10), Some((35 * MS + 10, 1500, 1)));
        assert_eq!(pop(&mut l, u64::MAX), Some((35 * MS + 20, 1500, 2)));
        assert_eq!(pop(&mut l, u64::MAX), None);
    }

    #[test]
    fn rate_spaces_packets_by_their_serialisation_time() {
        // 1500 B at 1 Gbit/s = 12 µs on the wire.
        let mut l = DirLink::new(dir("rate=1G delay=1ms"), 1);
        for i in 0..10 {
            assert!(l.offer_packet(0, 1500, i));
        }
        let dues: Vec<u64> = std::iter::from_fn(|| pop(&mut l, u64::MAX).map(|p| p.0)).collect();
        let want: Vec<u64> = (1..=10).map(|i| i * 12_000 + MS).collect();
        assert_eq!(dues, want);
    }

    #[test]
    fn offered_at_twice_the_rate_delivers_the_rate_and_honours_the_queue() {
        // 100 Mbit/s, 1000-byte packets (80 µs each), offered every 40 µs for 1 s.
        let mut l = DirLink::new(dir("rate=100M queue=20pkts"), 1);
        let mut delivered_by_1s = 0u64;
        let mut dropped = 0;
        for i in 0..25_000u64 {
            let now = i * 40_000;
            while let Some((due, len, _)) = pop(&mut l, now) {
                if due <= 1_000_000_000 {
                    delivered_by_1s += len;
                }
            }
            if !l.offer_packet(now, 1000, i) {
                dropped += 1;
            }
        }
        while let Some((due, len, _)) = pop(&mut l, u64::MAX) {
            if due <= 1_000_000_000 {
                delivered_by_1s += len;
            }
        }
        let rate = delivered_by_1s * 8;
        assert!((rate as f64 - 100e6).abs() / 100e6 < 0.001, "rate {rate}");
        assert_eq!(l.counters.queue_hwm_pkts, 20);
        assert!(
            (dropped as f64 - 12_500.0).abs() < 30.0,
            "dropped {dropped}"
        );
        assert_eq!(l.counters.queue_drop_pkts, dropped);
    }

    #[test]
    fn the_queue_series_reads_a_standing_queue_not_a_burst() {
        // 100 Mbit/s, 1000-byte packets: 80 us each on the wire.
        let mut l = DirLink::new(dir("rate=100M queue=20pkts"), 1);
        // 0-100 ms: a burst of 10 every 10 ms; the queue empties in between.
        for b in 0..10u64 {
            for k in 0..10 {
                while pop(&mut l, b * 10 * MS).is_some() {}
                l.offer_packet(b * 10 * MS, 1000, k);
            }
        }
        // 100-300 ms: offered at twice the rate, so the queue stands full.
        for i in 0..5000u64 {
            let now = 100 * MS + i * 40_000;
            while pop(&mut l, now).is_some() {}
            l.offer_packet(now, 1000, i);
        }
        let q = &l.queue_series;
        assert_eq!(q.get(0), Some(0), "a burst's first packet finds no queue");
        // Full: 19 packets wait ahead of an admitted one, and part of a 20th.
        let w = q.get(2).expect("arrivals in 200-300 ms");
        assert!((1520..=1600).contains(&w), "standing wait {w} us");
        assert_eq!(q.get(3), None, "nothing arrived after 300 ms");
        // An unlimited link has no queue to read.
        let mut free = DirLink::new(dir("delay=10ms"), 1);
        free.offer_packet(0, 1000, 0);
        assert_eq!(free.queue_series.get(0), None);
    }

    #[test]
    fn byte_queue_limit() {
        let mut l = DirLink::new(dir("rate=1M queue=4500B"), 1);
        assert!(l.offer_packet(0, 1500, 0));
        assert!(l.offer_packet(0, 1500, 1));
        assert!(l.offer_packet(0, 1500, 2));
        assert!(!l.offer_packet(0, 1500, 3));
        assert_eq!(l.counters.queue_drop_pkts, 1);
        // After the first packet's 12 ms on the wire there is room again.
        assert!(l.offer_packet(12 * MS, 1500, 4));
        assert_eq!(l.counters.queue_hwm_bytes, 4500);
    }

    #[test]
    fn jitter_stays_in_bounds_and_never_reorders() {
        let mut l = DirLink::new(dir("delay=10ms jitter=2ms"), 9);
        for i in 0..10_000u64 {
            l.offer_packet(i * 100_000, 100, i);
        }
        let mut last = (0, 0);
        let mut spread = (u64::MAX, 0);
        while let Some((due, _, i)) = pop(&mut l, u64::MAX) {
            assert!(due >= last.0 && (i == 0 || i == last.1 + 1));
            let d = due - i * 100_000;
            spread = (spread.0.min(d), spread.1.max(d));
            last = (due, i);
        }
        assert!(spread.0 >= 8 * MS && spread.1 <= 12 * MS, "{spread:?}");
        assert!(
            spread.1 - spread.0 > 2 * MS,
            "jitter barely varies: {spread:?}"
        );
    }

    #[test]
    fn lost_packets_still_use_the_wire() {
        let mut spec = dir("rate=1G");
        spec.loss = LossSpec::Bernoulli {
            p: 1.0 - f64::EPSILON,
        };
        let mut l = DirLink::new(spec, 1);
        assert!(!l.offer_packet(0, 1500, 1));
        assert_eq!(l.counters.lost_pkts, 1);
        assert_eq!(l.in_flight(), 0);
        assert_eq!(l.busy_until, 12_000);
    }

    /// A 45-segment TSO aggregate: 40-byte headers, 1448-byte payloads.
    fn tso() -> Shape {
        Shape {
            hdr: 40,
            mss: 1448,
            segs: 45,
            last: 40 + 1000,
        }
    }

    #[test]
    fn an_aggregate_is_timed_segment_by_segment_and_leaves_with_its_last() {
        let s = tso();
        let mut l = DirLink::new(dir("rate=1G delay=35ms"), 1);
        assert_eq!(l.offer(0, &s, 0, 45, 7), 1);
        let t = l.pop_due(u64::MAX).unwrap();
        let bytes = s.wire_bytes(0, 45);
        assert_eq!((t.first, t.count, t.bytes), (0, 45, bytes));
        // The serialiser was busy for every byte of every segment.
        let tx: u64 = (0..45).map(|i| s.seg_len(i) as u64 * 8).sum();
        assert_eq!(l.busy_until, tx);
        assert_eq!(t.due, l.busy_until + 35 * MS);
        assert_eq!(l.counters.offered_pkts, 45);
        assert_eq!(l.counters.delivered_pkts, 45);
        assert_eq!(l.counters.delivered_bytes, bytes);
        assert_eq!(l.counters.queue_hwm_pkts, 45);
    }

    #[test]
    fn a_slow_link_cuts_an_aggregate_into_trains_of_at_most_train_ns() {
        // 1488 B at 10 Mbit/s = 1.19 ms each: every segment is its own
        // train, but the short last one (1040 B, 0.83 ms) joins the one before.
        let s = tso();
        let mut l = DirLink::new(dir("rate=10M"), 1);
        assert_eq!(l.offer(0, &s, 0, 45, 0), 44);
        // At 100 Mbit/s (119 µs each) trains hold 9 segments: 8 gaps ≤ 1 ms.
        let mut l = DirLink::new(dir("rate=100M"), 1);
        assert_eq!(l.offer(0, &s, 0, 45, 0), 5);
        let trains: Vec<Train<u64>> = std::iter::from_fn(|| l.pop_due(u64::MAX)).collect();
        let firsts: Vec<u32> = trains.iter().map(|t| t.first).collect();
        assert_eq!(firsts, [0, 9, 18, 27, 36]);
        assert_eq!(trains.iter().map(|t| t.count).sum::<u32>(), 45);
        assert_eq!(
            trains.iter().map(|t| t.bytes).sum::<u64>(),
            s.wire_bytes(0, 45)
        );
    }

    #[test]
    fn losses_and_a_full_queue_split_an_aggregate_around_the_missing_segments() {
        let s = tso();
        let mut spec = dir("rate=1G queue=40pkts");
        spec.loss = LossSpec::Bernoulli { p: 0.1 };
        let mut l = DirLink::new(spec, 3);
        let kept = l.offer(0, &s, 0, 45, 0);
        let trains: Vec<Train<u64>> = std::iter::from_fn(|| l.pop_due(u64::MAX)).collect();
        assert_eq!(trains.len() as u32, kept);
        let c = &l.counters;
        assert_eq!(c.queue_drop_pkts, 5, "segments 40..45 find the queue full");
        assert!(c.lost_pkts > 0 && kept > 1, "seed 3 loses some: {c:?}");
        let delivered: u32 = trains.iter().map(|t| t.count).sum();
        assert_eq!(delivered as u64, 45 - c.queue_drop_pkts - c.lost_pkts);
        // Trains are disjoint, ascending, and never span a missing segment.
        for w in trains.windows(2) {
            assert!(w[0].first + w[0].count < w[1].first, "{w:?}");
        }
        assert!(trains.iter().all(|t| t.first + t.count <= 40));
        let bytes: u64 = trains.iter().map(|t| s.wire_bytes(t.first, t.count)).sum();
        assert_eq!(bytes, c.delivered_bytes);
    }

    #[test]
    fn series_buckets_delivered_bytes() {
        let mut s = Series::new(100);
        s.add(50 * MS, 10);
        s.add(250 * MS, 5);
        s.add(260 * MS, 5);
        assert_eq!(s.bytes, [10, 0, 10]);
        assert_eq!(s.first, 0);
        // A series whose first delivery comes late starts there.
        let mut late = Series::new(100);
        late.add(3_600_050 * MS, 7);
        late.add(3_600_150 * MS, 1);
        assert_eq!((late.first, late.bytes.len()), (36_000, 2));
        assert_eq!(late.bytes, [7, 1]);
    }
}
