//! How a transfer came up to speed, for `--json`: the count of bytes its
//! flow carried, sampled as the session goes ([`Series`], fed by
//! `net::spawn_window_tuner` about once a round trip), and what that says
//! once it is over ([`Series::ramp`]): the final rate, and how long after the
//! first data the rate over a window first reached 90 % of it. Sans-IO: the
//! times and counts come in, figures go out.

use std::time::{Duration, Instant};

/// Samples kept at most; past that every second one after the first
/// [`KEEP`] goes and samples are taken half as often (a day at one per 10 ms
/// would be 8.6 M).
const CAP: usize = 4096;
/// The first samples, kept as they were taken: the start-up is in them.
const KEEP: usize = 1024;

/// The start-up of a finished transfer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ramp {
    /// Bits per second over the second half of the data phase.
    pub final_bps: f64,
    /// Seconds from the first data until a window's rate first reached 90 %
    /// of `final_bps` (at the window's end).
    pub to_90_s: f64,
}

/// (time, bytes so far) samples of one flow, oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct Series {
    points: Vec<(Instant, u64)>,
    /// Keep one sample in `stride`; `skipped` counts towards the next.
    stride: usize,
    skipped: usize,
}

impl Series {
    /// Adds the count `bytes` at `t` (not earlier than the last sample).
    pub(crate) fn push(&mut self, t: Instant, bytes: u64) {
        self.stride = self.stride.max(1);
        self.skipped += 1;
        if self.skipped < self.stride {
            return;
        }
        self.skipped = 0;
        if self.points.len() >= CAP {
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i <= KEEP || i % 2 == 1
            });
            self.stride *= 2;
        }
        self.points.push((t, bytes));
    }

    /// The count at `t`, interpolated between the samples around it (the
    /// first or last sample's outside them).
    fn at(&self, t: Instant) -> u64 {
        let i = self.points.partition_point(|&(s, _)| s <= t);
        match (i.checked_sub(1).map(|j| self.points[j]), self.points.get(i)) {
            (Some((s0, b0)), Some(&(s1, b1))) => {
                let span = (s1 - s0).as_secs_f64();
                let f = if span > 0.0 {
                    (t - s0).as_secs_f64() / span
                } else {
                    1.0
                };
                b0 + (b1.saturating_sub(b0) as f64 * f) as u64
            }
            (Some((_, b)), None) => b,
            (None, Some(&(_, b))) => b,
            (None, None) => 0,
        }
    }

    /// The start-up of a transfer whose first data came at `first`, over
    /// windows of `window` (one round trip, at least 100 ms, reads a rate
    /// rather than a burst of ACKs or datagrams). The data phase ends at the
    /// first sample within 0.1 % (and a datagram) of the last count: the
    /// samples go on through what follows the data (a durable receiver's
    /// syncs, the goodbye), which would otherwise count as a slow end. None
    /// when there is too little to tell: a data phase shorter than four
    /// windows, or nothing carried in its second half.
    pub(crate) fn ramp(&self, first: Instant, window: Duration) -> Option<Ramp> {
        let window = window.max(Duration::from_millis(100));
        let &(_, last) = self.points.last()?;
        let near = last.saturating_sub((last / 1000).max(1500));
        let &(end, _) = self.points.iter().find(|&&(_, b)| b >= near)?;
        let phase = end.checked_duration_since(first)?;
        if phase < window * 4 {
            return None;
        }
        let mid = first + phase / 2;
        let final_bps =
            self.at(end).saturating_sub(self.at(mid)) as f64 * 8.0 / (end - mid).as_secs_f64();
        if final_bps <= 0.0 {
            return None;
        }
        let w = window.as_secs_f64();
        let reached = self
            .points
            .iter()
            .map(|&(t, _)| t)
            .filter(|&t| t >= first + window)
            .find(|&t| {
                self.at(t).saturating_sub(self.at(t - window)) as f64 * 8.0 / w >= 0.9 * final_bps
            })?;
        Some(Ramp {
            final_bps,
            to_90_s: (reached - first).as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flow sampled every `step` ms whose rate (bits/s) at each moment
    /// `rate` gives, from `t0`.
    fn series(t0: Instant, step: u64, until_ms: u64, rate: impl Fn(f64) -> f64) -> Series {
        let mut s = Series::default();
        let mut bytes = 0.0;
        let mut t = 0;
        while t <= until_ms {
            s.push(t0 + Duration::from_millis(t), bytes as u64);
            bytes += rate(t as f64 / 1e3) / 8.0 * step as f64 / 1e3;
            t += step;
        }
        s
    }

    /// `s` read from `first` over `window` ms: its final rate within 1 %
    /// of `final_bps` and its time to 90 % within `to_90`.
    fn reads(
        s: &Series,
        first: Instant,
        window: u64,
        final_bps: f64,
        to_90: std::ops::RangeInclusive<f64>,
    ) {
        let r = s.ramp(first, Duration::from_millis(window)).unwrap();
        assert!((r.final_bps - final_bps).abs() < final_bps / 100.0, "{r:?}");
        assert!(to_90.contains(&r.to_90_s), "{r:?}");
    }

    #[test]
    fn a_start_that_doubles_each_round_trip_reaches_90_percent_where_it_crosses() {
        // First data at 0.2 s; 100 ms round trips; 10 Mbit/s doubling each
        // round trip up to 1 Gbit/s (reached 0.664 s after the first data:
        // 10 x 2^6.64), then flat until 10 s.
        let t0 = Instant::now();
        let rate = |t: f64| {
            if t < 0.2 {
                0.0
            } else {
                (1e7 * 2f64.powf((t - 0.2) / 0.1)).min(1e9)
            }
        };
        let s = series(t0, 10, 10_000, rate);
        // A window ending at the crossing averages 0.72 of the rate there
        // (1 / (2 ln 2)); 90 % is about 45 ms later: 0.71 s.
        reads(&s, t0 + Duration::from_millis(200), 100, 1e9, 0.68..=0.78);
    }

    #[test]
    fn a_transfer_at_speed_from_its_first_window_takes_one_window() {
        let t0 = Instant::now();
        let s = series(t0, 20, 5_000, |_| 5e8);
        reads(&s, t0, 300, 5e8, 0.3..=0.32);
    }

    #[test]
    fn an_idle_end_is_not_part_of_the_data_phase() {
        // 9 s at 800 Mbit/s, then 3 s with nothing more (a durable
        // receiver's syncs, a put waiting for the server's Done).
        let t0 = Instant::now();
        let s = series(t0, 10, 12_000, |t| if t < 9.0 { 8e8 } else { 0.0 });
        reads(&s, t0, 100, 8e8, 0.1..=0.12);
    }

    #[test]
    fn too_short_or_empty_tells_nothing() {
        let t0 = Instant::now();
        assert_eq!(Series::default().ramp(t0, Duration::from_millis(100)), None);
        let s = series(t0, 10, 350, |_| 1e9);
        assert_eq!(s.ramp(t0, Duration::from_millis(100)), None);
        let s = series(t0, 10, 5_000, |_| 0.0);
        assert_eq!(s.ramp(t0, Duration::from_millis(100)), None);
    }

    #[test]
    fn a_long_transfer_keeps_a_bounded_series_that_still_reads_right() {
        // 10 ms samples for 200 s: 20,000 of them, thinned to CAP.
        let t0 = Instant::now();
        let s = series(t0, 10, 200_000, |t| if t < 2.0 { 1e8 } else { 8e8 });
        assert!(s.points.len() <= CAP, "{}", s.points.len());
        // The first samples stay 10 ms apart: the start-up keeps its detail.
        assert_eq!(
            s.points[KEEP - 1].0 - s.points[KEEP - 2].0,
            Duration::from_millis(10)
        );
        reads(&s, t0, 100, 8e8, 2.09..=2.11);
    }
}
