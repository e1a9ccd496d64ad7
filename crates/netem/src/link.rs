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
//!
//! A schedule (see [`crate::spec`]) adds, on a clock the hub starts and holds:
//! a packet offered while the link is down is dropped before the queue, and
//! one whose serialisation would not end before an outage begins is dropped
//! with the queue (the serialiser is dead from the outage's start on); both
//! count as outage drops. The serialiser runs at the rate in force when a
//! packet's serialisation begins. Everything is decided when a packet is
//! offered, so a schedule needs no timers.

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
    /// Dropped by a scheduled outage: offered while the link was down, or
    /// not fully serialised when it went down.
    #[serde(default)]
    pub outage_drop_pkts: u64,
    #[serde(default)]
    pub outage_drop_bytes: u64,
    pub delivered_pkts: u64,
    pub delivered_bytes: u64,
    /// Highest queue occupancy seen.
    pub queue_hwm_pkts: u64,
    pub queue_hwm_bytes: u64,
    pub late: Lateness,
}

impl DirCounters {
    /// Packets dropped by the loss model, a full queue or an outage.
    pub(crate) fn dropped_pkts(&self) -> u64 {
        self.lost_pkts + self.queue_drop_pkts + self.outage_drop_pkts
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
    /// When the schedule clock started (ns on the caller's clock); None:
    /// held, the link is its base spec.
    epoch: Option<u64>,
    pub counters: DirCounters,
    pub series: Series,
    /// Rate-limited links only.
    pub queue_series: QueueSeries,
}

impl<T: Clone> DirLink<T> {
    pub(crate) fn new(spec: DirSpec, seed: u64) -> Self {
        DirLink {
            loss: Loss::new(spec.loss),
            spec,
            rng: Rng::new(seed),
            queue: VecDeque::with_capacity(1024),
            queue_bytes: 0,
            busy_until: 0,
            last_arrival: 0,
            last_due: 0,
            train_ns: TRAIN_NS,
            in_flight: VecDeque::with_capacity(1024),
            epoch: Some(0),
            counters: DirCounters::default(),
            series: Series::new(100),
            queue_series: QueueSeries::new(100),
        }
    }

    /// Starts the schedule clock at `epoch` (ns on the caller's clock), or
    /// holds it (None). Packets already accepted are not touched.
    pub(crate) fn set_epoch(&mut self, epoch: Option<u64>) {
        self.epoch = epoch;
    }

    /// The schedule clock at `now` (ns since it started), if it runs, has
    /// started by `now`, and there is a schedule.
    fn clock(&self, now: u64) -> Option<u64> {
        if self.spec.schedule.is_empty() {
            return None;
        }
        now.checked_sub(self.epoch?)
    }

    /// Whether the link is down at `now`, and the rate in force (None:
    /// unlimited); for snapshots.
    pub(crate) fn state_at(&self, now: u64) -> (bool, Option<u64>) {
        match self.clock(now) {
            Some(t) => (
                self.spec.schedule.outage_at(t).is_some(),
                self.spec.schedule.rate_at(t, self.spec.rate_bps),
            ),
            None => (false, self.spec.rate_bps),
        }
    }

    /// The next change of the schedule after `now`, ms on the schedule clock.
    pub(crate) fn next_change_ms(&self, now: u64) -> Option<u64> {
        let t = self.clock(now)?;
        self.spec.schedule.next_change(t).map(|x| x / 1_000_000)
    }

    /// The direction's spec.
    pub(crate) fn spec(&self) -> &DirSpec {
        &self.spec
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
        let clock = self.clock(now);
        let epoch = self.epoch.unwrap_or(0);
        let c = &mut self.counters;
        c.offered_pkts += 1;
        c.offered_bytes += len as u64;
        if clock.is_some_and(|t| self.spec.schedule.outage_at(t).is_some()) {
            c.outage_drop_pkts += 1;
            c.outage_drop_bytes += len as u64;
            return None;
        }

        let tx_end = if !self.spec.is_rate_limited() {
            now
        } else {
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
            let start = self.busy_until.max(now);
            let rate = match start.checked_sub(epoch) {
                Some(t) if self.epoch.is_some() => {
                    self.spec.schedule.rate_at(t, self.spec.rate_bps)
                }
                _ => self.spec.rate_bps,
            };
            // Unlimited (outside a step of a link without a base rate):
            // no time on the wire, but after what is queued.
            let tx_ns = rate.map_or(0, |r| {
                (len as u128 * 8_000_000_000).div_ceil(r as u128) as u64
            });
            let end = start + tx_ns;
            if self.epoch.is_some() && !self.spec.schedule.outages.is_empty() {
                let from = now.saturating_sub(epoch);
                if let Some(cut) = end
                    .checked_sub(epoch)
                    .and_then(|to| self.spec.schedule.outage_within(from, to))
                {
                    // Cut before it was on its way: lost with the queue,
                    // and nothing more is serialised before the cut.
                    self.busy_until = self.busy_until.max(epoch + cut);
                    c.outage_drop_pkts += 1;
                    c.outage_drop_bytes += len as u64;
                    return None;
                }
            }
            self.queue_series.record(now, start - now);
            self.busy_until = end;
            self.queue.push_back((end, len));
            self.queue_bytes += len as u64;
            c.queue_hwm_pkts = c.queue_hwm_pkts.max(self.queue.len() as u64);
            c.queue_hwm_bytes = c.queue_hwm_bytes.max(self.queue_bytes);
            end
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

    /// Offers a `len`-byte packet every `gap` ns over `[from, to)` and
    /// delivers as it goes; returns (offered at, due) of every packet delivered.
    fn stream(l: &mut DirLink<u64>, from: u64, to: u64, gap: u64, len: u32) -> Vec<(u64, u64)> {
        let mut got = Vec::new();
        let mut now = from;
        while now < to {
            while let Some((due, _, at)) = pop(l, now) {
                got.push((at, due));
            }
            l.offer_packet(now, len, now);
            now += gap;
        }
        while let Some((due, _, at)) = pop(l, u64::MAX) {
            got.push((at, due));
        }
        got
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn an_outage_drops_exactly_what_is_offered_in_its_window() {
        // Unlimited rate: a packet every ms for 5 s, the link down 2-3 s.
        let mut l = DirLink::new(dir("delay=10ms outage=1s@2s"), 1);
        let got = stream(&mut l, 0, 5 * S, MS, 100);
        let offered: Vec<u64> = (0..5000).map(|i| i * MS).collect();
        let want: Vec<u64> = offered
            .iter()
            .copied()
            .filter(|&t| !(2 * S..3 * S).contains(&t))
            .collect();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), want);
        assert!(got.iter().all(|&(at, due)| due == at + 10 * MS));
        let c = &l.counters;
        assert_eq!((c.outage_drop_pkts, c.outage_drop_bytes), (1000, 100_000));
        assert_eq!((c.lost_pkts, c.queue_drop_pkts), (0, 0));
        assert_eq!(c.delivered_pkts, 4000);
    }

    #[test]
    fn a_repeating_outage_drops_each_window_and_nothing_between() {
        let mut l = DirLink::new(dir("outage=100ms@1s/1s"), 1);
        let got: Vec<u64> = stream(&mut l, 0, 5 * S, MS, 100)
            .iter()
            .map(|g| g.0)
            .collect();
        let down = |t: u64| t >= S && t % S < 100 * MS;
        let want: Vec<u64> = (0..5000).map(|i| i * MS).filter(|&t| !down(t)).collect();
        assert_eq!(got, want);
        assert_eq!(l.counters.outage_drop_pkts, 4 * 100);
    }

    #[test]
    fn a_cut_link_loses_its_queue_and_resumes_empty() {
        // 10 Mbit/s: 1500 B take 1.2 ms. Offered at twice that (every 0.6
        // ms) for 2 s, so the queue stands full; down 1 s to 1.5 s.
        let tx = 1_200_000;
        let mut l = DirLink::new(dir("rate=10M delay=5ms queue=50pkts outage=500ms@1s"), 1);
        let got = stream(&mut l, 0, 2 * S, 600_000, 1500);
        let ends: Vec<u64> = got.iter().map(|&(_, due)| due - 5 * MS).collect();
        // Nothing finished its serialisation in the outage, nor at its start.
        assert!(
            ends.iter().all(|&e| !(S..=S + 500 * MS).contains(&e)),
            "{ends:?}"
        );
        // The serialiser was busy up to the cut...
        let last_before = *ends.iter().filter(|&&e| e < S).max().unwrap();
        assert!(last_before > S - tx, "{last_before}");
        // ...and what was queued then went with the link: the first packet
        // after the outage found an empty queue.
        let (at, due) = *got.iter().find(|g| g.0 >= S + 500 * MS).unwrap();
        assert_eq!(at, S + 500 * MS);
        assert_eq!(due, at + tx + 5 * MS);
        let c = &l.counters;
        let in_window = (500 * MS).div_ceil(600_000);
        assert!(
            c.outage_drop_pkts > in_window + 40,
            "the queue's ~50 and the window's {in_window}: {c:?}"
        );
        assert_eq!(
            c.offered_pkts,
            c.delivered_pkts + c.queue_drop_pkts + c.outage_drop_pkts
        );
        // Before and after, the link carried its rate.
        let rate = |from: u64, to: u64| {
            let n = ends.iter().filter(|&&e| e >= from && e < to).count() as f64;
            n * 1500.0 * 8.0 / ((to - from) as f64 / 1e9)
        };
        for r in [rate(100 * MS, 900 * MS), rate(1600 * MS, 1900 * MS)] {
            assert!((r - 10e6).abs() / 10e6 < 0.01, "{r}");
        }
    }

    /// Bit/s of the due times in `[from, to)` of 1000-byte packets.
    fn rate_in(got: &[(u64, u64)], from: u64, to: u64) -> f64 {
        let n = got.iter().filter(|g| g.1 >= from && g.1 < to).count() as f64;
        n * 8000.0 / ((to - from) as f64 / 1e9)
    }

    #[test]
    fn a_rate_step_holds_its_rate_for_its_window_then_the_base_rate() {
        // Offered at 200 Mbit/s (1000 B every 40 us) for 3 s; 100 Mbit/s but
        // 10 Mbit/s from 1 s for 1 s.
        let mut l = DirLink::new(dir("rate=100M rate=10M@1s+1s queue=100pkts"), 1);
        let got = stream(&mut l, 0, 3 * S, 40_000, 1000);
        // Leave out the 100 ms after each change (a queue of 100 packets at
        // 10 Mbit/s drains in 80 ms).
        let (before, during, after) = (
            rate_in(&got, 100 * MS, S),
            rate_in(&got, 1100 * MS, 2 * S),
            rate_in(&got, 2100 * MS, 3 * S),
        );
        for (r, want) in [(before, 100e6), (during, 10e6), (after, 100e6)] {
            assert!((r - want).abs() / want < 0.01, "{r} vs {want}");
        }
        // The queue kept its limit throughout.
        assert_eq!(l.counters.queue_hwm_pkts, 100);
        assert_eq!(l.counters.outage_drop_pkts, 0);
    }

    #[test]
    fn an_open_ended_step_on_an_unlimited_link_limits_it_from_its_start() {
        let mut l = DirLink::new(dir("rate=10M@1s delay=1ms"), 1);
        let got = stream(&mut l, 0, 3 * S, 40_000, 1000);
        // Unlimited before: each packet due 1 ms after it was offered.
        assert!(got
            .iter()
            .filter(|g| g.0 < S)
            .all(|&(at, due)| due == at + MS));
        assert_eq!(got.iter().filter(|g| g.0 < S).count(), 25_000);
        let r = rate_in(&got, 1100 * MS, 3 * S);
        assert!((r - 10e6).abs() / 10e6 < 0.01, "{r}");
    }

    #[test]
    fn the_schedule_runs_from_its_epoch_and_not_while_held() {
        let mut l = DirLink::new(dir("outage=1s@1s"), 1);
        l.set_epoch(Some(10 * S));
        // Before the epoch and in the first second of the clock: up.
        assert!(l.offer_packet(S + 500 * MS, 100, 0));
        assert!(l.offer_packet(10 * S + 500 * MS, 100, 1));
        assert!(!l.offer_packet(11 * S + 500 * MS, 100, 2));
        assert_eq!(l.state_at(11 * S + 500 * MS), (true, None));
        assert_eq!(l.next_change_ms(11 * S + 500 * MS), Some(2000));
        l.set_epoch(None);
        assert!(l.offer_packet(11 * S + 600 * MS, 100, 3));
        assert_eq!(l.state_at(11 * S + 600 * MS), (false, None));
        assert_eq!(l.next_change_ms(11 * S + 600 * MS), None);
        assert!(l.offer_packet(12 * S + 500 * MS, 100, 4));
        assert_eq!(l.counters.outage_drop_pkts, 1);
    }

    #[test]
    fn an_outage_splits_an_aggregate_at_the_cut() {
        // 1 Gbit/s: the 45 segments of a TSO aggregate take 12 us each; the
        // link goes down 100 us after the aggregate arrives.
        let s = tso();
        let mut l = DirLink::new(dir("rate=1G outage=1ms@100us"), 1);
        assert_eq!(l.offer(0, &s, 0, 45, 0), 1);
        let t = l.pop_due(u64::MAX).unwrap();
        // Those fully out by 100 us pass: 8 segments of 11.9 us.
        assert_eq!((t.first, t.count), (0, 8));
        assert_eq!(l.counters.outage_drop_pkts, 37);
        assert_eq!(l.busy_until, 100_000);
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
