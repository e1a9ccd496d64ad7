//! Riding out a lost connection (`--retry-for`): when a transfer tries to
//! reconnect, for how long, and one report made from its sessions.
//!
//! Sans-IO: [`Backoff`] is told the time and each attempt's outcome and says
//! what to do next; [`merge`] folds the sessions' reports into one. The
//! client's driver ([`crate::client`]) runs them: a session that ends with a
//! [transient](crate::Problem::transient) problem (the idle timeout of a
//! dead path, a stateless reset, a server restarting or busy) is followed by
//! new connections until one is welcomed, and the new session resumes from
//! the journals: files placed are skipped, chunks journaled are not sent
//! again.

use crate::report::{ClientReport, FileReport, Status, Totals};
use std::collections::BTreeMap;
use std::time::Duration;

/// The default of `--retry-for`: long enough for a rain fade on a
/// satellite path or a route flap, short enough that a script learns of a
/// server that is gone for good.
pub const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(600);

/// The shortest time an attempt's handshake is given: a path of up to
/// about a second's RTT completes it with a lost Initial or two.
const MIN_ATTEMPT: Duration = Duration::from_secs(5);
/// The longest (the idle timeout's 15 s).
const MAX_ATTEMPT: Duration = Duration::from_secs(15);
/// The first pause after an attempt that failed at once (a server that
/// refused as busy or shutting down, a network error on sending).
const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause between attempts.
const MAX_PAUSE: Duration = Duration::from_secs(16);

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Connect now, giving the handshake up to this long.
    Attempt(Duration),
    /// Wait this long, then ask again.
    Wait(Duration),
    /// The outage has lasted `--retry-for`: end with the last problem.
    GiveUp,
}

/// The reconnection schedule of one outage. Times are offsets from the
/// moment the connection was found lost.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    retry_for: Duration,
    attempt: Duration,
    pause: Duration,
    /// When the next attempt may start.
    next_at: Duration,
    attempts: u32,
}

impl Backoff {
    /// An outage found at offset 0, on a path whose RTT was `rtt`: attempts
    /// may start for `retry_for`.
    pub(crate) fn new(retry_for: Duration, rtt: Duration) -> Backoff {
        Backoff {
            retry_for,
            attempt: (rtt * 6).clamp(MIN_ATTEMPT, MAX_ATTEMPT),
            pause: FIRST_PAUSE,
            next_at: Duration::ZERO,
            attempts: 0,
        }
    }

    /// Attempts started so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// What to do at offset `now`.
    pub(crate) fn next(&mut self, now: Duration) -> Next {
        if now >= self.retry_for {
            return Next::GiveUp;
        }
        if now < self.next_at {
            return Next::Wait(self.next_at - now);
        }
        self.attempts += 1;
        // (The last attempt ends with the grace period, at least a second.)
        let left = (self.retry_for - now).max(Duration::from_secs(1));
        Next::Attempt(self.attempt.min(left))
    }

    /// The attempt started at `started` failed at `now`. One that used its
    /// whole time found no path, and the next starts at once (its Initials
    /// were already spread over that time); one refused sooner waits a
    /// pause that doubles, so a busy or restarting server is not hammered.
    pub(crate) fn failed(&mut self, started: Duration, now: Duration) {
        let took = now.saturating_sub(started);
        if took + Duration::from_millis(100) >= self.attempt {
            self.next_at = now;
        } else {
            self.next_at = started + self.pause.max(took);
            self.pause = (self.pause * 2).min(MAX_PAUSE);
        }
    }
}

/// One report from the reports of a transfer's sessions, oldest first
/// (`seconds` is the whole run's). A file takes its status from the last
/// session that reported it (settled, or under way when the session failed), except that a file one session verified and a
/// later one skipped (it was there) stays verified; its bytes moved add up
/// over the sessions, and of its resumed bytes only those held from before
/// the run count (for a file under way when its session failed: what the
/// next one found held). The problems are the last session's (the earlier ones
/// ended with an outage, which `outages` tells).
pub(crate) fn merge(mut reports: Vec<ClientReport>, seconds: f64) -> ClientReport {
    let mut last = reports.pop().expect("at least one report");
    if reports.is_empty() {
        return last;
    }
    // Each file's account so far, and whether it was under way when its
    // session failed.
    let mut files: BTreeMap<String, (FileReport, bool)> = BTreeMap::new();
    let fold = |files: &mut BTreeMap<String, (FileReport, bool)>, f: FileReport, under_way| {
        let Some((prev, was_under_way)) = files.remove(&f.path) else {
            files.insert(f.path.clone(), (f, under_way));
            return;
        };
        let merged = if prev.status == Status::Verified && f.status == Status::Skipped {
            FileReport {
                bytes_transferred: prev.bytes_transferred + f.bytes_transferred,
                ..prev
            }
        } else if was_under_way {
            // What the next session found held, beyond what was held
            // before, landed in the one that failed: a sender's count of
            // bytes handed to its streams includes what was still queued
            // when the path died, and a receiver's what it had not yet
            // journaled.
            let landed = f.bytes_resumed.saturating_sub(prev.bytes_resumed);
            FileReport {
                bytes_transferred: f.bytes_transferred + landed,
                bytes_resumed: prev.bytes_resumed.min(f.bytes_resumed),
                ..f
            }
        } else {
            // (A file that failed whole, a mismatch say, starts again.)
            FileReport {
                bytes_transferred: prev.bytes_transferred + f.bytes_transferred,
                bytes_resumed: f.bytes_resumed.saturating_sub(prev.bytes_transferred),
                ..f
            }
        };
        files.insert(merged.path.clone(), (merged, under_way));
    };
    let first_data_s = reports.iter().find_map(|r| r.first_data_s);
    let (final_mbps, to_90pct_s) = reports
        .iter()
        .find(|r| r.first_data_s.is_some())
        .map_or((last.final_mbps, last.to_90pct_s), |r| {
            (r.final_mbps, r.to_90pct_s)
        });
    for r in &reports {
        for f in r.files.iter().cloned() {
            fold(&mut files, f, false);
        }
        for f in r.unsettled.iter().cloned() {
            fold(&mut files, f, true);
        }
        last.fingerprint = last.fingerprint.take().or(r.fingerprint.clone());
        last.data_seconds += r.data_seconds;
        last.peak_bps = last.peak_bps.max(r.peak_bps);
        last.retransmitted_bytes += r.retransmitted_bytes;
        last.udp_tx_bytes += r.udp_tx_bytes;
        last.udp_rx_bytes += r.udp_rx_bytes;
        last.receiver_behind_s += r.receiver_behind_s;
        last.repair_bytes += r.repair_bytes;
        last.rebuilt_streams += r.rebuilt_streams;
    }
    last.zero_rtt = reports[0].zero_rtt;
    last.early_files = reports[0].early_files;
    last.remembered_bps = reports[0].remembered_bps;
    last.first_data_s = first_data_s;
    last.final_mbps = final_mbps;
    last.to_90pct_s = to_90pct_s;
    for f in std::mem::take(&mut last.files) {
        fold(&mut files, f, false);
    }
    // (Files of earlier sessions the last one did not reach stay failed.)
    last.files = files.into_values().map(|(f, _)| f).collect();
    last.totals = Totals {
        dirs: last.totals.dirs,
        symlinks: last.totals.symlinks,
        specials: last.totals.specials,
        hardlinks: last.totals.hardlinks,
        other_shards: last.totals.other_shards,
        ..totals(&last.files)
    };
    last.seconds = seconds;
    last.rate_mbps = last.totals.bytes_transferred as f64 * 8.0 / 1e6 / seconds.max(1e-9);
    last
}

/// `d` as `--retry-for` takes it: `10m`, `90s`, `1h30m`.
pub(crate) fn shown(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, sec) = (s / 3600, s / 60 % 60, s % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (sec, "s")] {
        if n > 0 {
            out += &format!("{n}{unit}");
        }
    }
    match out.is_empty() {
        true => format!("{} ms", d.as_millis()),
        false => out,
    }
}

/// The sums over `files` (directories and symlinks left at 0).
pub(crate) fn totals(files: &[FileReport]) -> Totals {
    let mut t = Totals::default();
    for f in files {
        t.files += 1;
        t.bytes += f.size;
        t.bytes_transferred += f.bytes_transferred;
        t.bytes_resumed += f.bytes_resumed;
        match f.status {
            Status::Verified => t.verified += 1,
            Status::Skipped => {
                t.skipped += 1;
                t.bytes_skipped += f.size;
            }
            Status::Failed => t.failed += 1,
            Status::WouldSend => {
                t.would_send += 1;
                t.bytes_would_send += f.size;
            }
            Status::Slice => t.slices += 1,
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    /// Runs an outage of `down` seconds through the schedule: every
    /// attempt that starts before the path is back fails after its whole
    /// timeout (its Initials find no path); the first one that starts after
    /// succeeds. Returns when the transfer was back (None: it gave up) and
    /// the attempts made.
    fn ride(retry_for: f64, rtt: f64, down: f64) -> (Option<f64>, u32) {
        let mut b = Backoff::new(s(retry_for), s(rtt));
        let mut now = Duration::ZERO;
        loop {
            match b.next(now) {
                Next::GiveUp => return (None, b.attempts()),
                Next::Wait(w) => now += w,
                Next::Attempt(_) if now.as_secs_f64() >= down => {
                    return (Some(now.as_secs_f64()), b.attempts());
                }
                Next::Attempt(t) => {
                    let started = now;
                    now += t;
                    b.failed(started, now);
                }
            }
        }
    }

    #[test]
    fn a_dead_path_is_tried_back_to_back_and_found_within_one_attempt_of_its_return() {
        // 70 ms RTT: 5 s attempts, no pause between them.
        let (back, attempts) = ride(600.0, 0.07, 45.0);
        assert_eq!(back, Some(45.0));
        assert_eq!(attempts, 10);
        let (back, _) = ride(600.0, 0.07, 46.0);
        assert_eq!(back, Some(50.0));
        // 700 ms RTT: 4.2 s would be too short for a handshake with a
        // loss or two: 5 s still; a 3 s RTT gets the idle timeout's 15 s.
        assert_eq!(
            Backoff::new(s(600.0), s(0.7)).next(s(0.0)),
            Next::Attempt(s(5.0))
        );
        assert_eq!(
            Backoff::new(s(600.0), s(3.0)).next(s(0.0)),
            Next::Attempt(s(15.0))
        );
    }

    #[test]
    fn the_outage_ends_the_transfer_after_retry_for_and_the_last_attempt_fits_in_it() {
        let (back, attempts) = ride(20.0, 0.07, 1e9);
        assert_eq!(back, None);
        assert_eq!(attempts, 4);
        let mut b = Backoff::new(s(12.0), s(0.07));
        assert_eq!(b.next(s(0.0)), Next::Attempt(s(5.0)));
        b.failed(s(0.0), s(5.0));
        assert_eq!(b.next(s(5.0)), Next::Attempt(s(5.0)));
        b.failed(s(5.0), s(10.0));
        assert_eq!(b.next(s(10.0)), Next::Attempt(s(2.0)));
        b.failed(s(10.0), s(12.0));
        assert_eq!(b.next(s(12.0)), Next::GiveUp);
        // --retry-for 0: the first loss is the end.
        assert_eq!(
            Backoff::new(Duration::ZERO, s(0.07)).next(s(0.0)),
            Next::GiveUp
        );
    }

    #[test]
    fn durations_are_shown_as_they_are_written() {
        assert_eq!(shown(s(600.0)), "10m");
        assert_eq!(shown(s(90.0)), "1m30s");
        assert_eq!(shown(s(5400.0)), "1h30m");
        assert_eq!(shown(s(0.25)), "250 ms");
    }

    #[test]
    fn a_server_that_refuses_at_once_is_asked_again_after_pauses_that_double_up_to_16_s() {
        let mut b = Backoff::new(s(600.0), s(0.07));
        let mut now = Duration::ZERO;
        let mut starts = Vec::new();
        for _ in 0..8 {
            loop {
                match b.next(now) {
                    Next::Wait(w) => now += w,
                    Next::Attempt(_) => break,
                    Next::GiveUp => unreachable!(),
                }
            }
            starts.push(now.as_secs_f64());
            let started = now;
            now += s(0.2); // refused (busy) after a round trip or two
            b.failed(started, now);
        }
        assert_eq!(starts, [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 47.0, 63.0]);
    }

    fn file(path: &str, status: Status, moved: u64, resumed: u64) -> FileReport {
        FileReport {
            path: path.into(),
            size: 300,
            status,
            bytes_transferred: moved,
            bytes_resumed: resumed,
            blake3: (status == Status::Verified).then(|| "ab".into()),
            error: (status == Status::Failed).then(|| "connection lost".into()),
        }
    }

    fn report(files: Vec<FileReport>, problems: Vec<crate::Problem>) -> ClientReport {
        let t = totals(&files);
        ClientReport {
            op: "get",
            ok: problems.is_empty(),
            server: "longhaul test".into(),
            fingerprint: None,
            files,
            problems,
            totals: t,
            seconds: 1.0,
            rate_mbps: 0.0,
            data_seconds: 1.0,
            remembered_bps: 0,
            peak_bps: 5,
            rtt_ms: 70.0,
            retransmitted_bytes: 10,
            udp_tx_bytes: 100,
            udp_rx_bytes: 1000,
            connections: 1,
            per_connection: vec![],
            mtu: 1452,
            cc: "wan".into(),
            streams: 4,
            receiver_behind_s: 0.0,
            first_data_s: None,
            zero_rtt: crate::ZeroRtt::None,
            early_files: false,
            final_mbps: None,
            to_90pct_s: None,
            repair_bytes: 0,
            rebuilt_streams: 0,
            tail_s: None,
            reconnects: 0,
            outages: vec![],
            unsettled: vec![],
            not_made: vec![],
            dry_run: false,
            attrs_not_kept: 0,
            changes: vec![],
        }
    }

    #[test]
    fn merged_sessions_count_each_file_once_and_each_byte_moved_once() {
        let lost = crate::Problem {
            transient: true,
            ..crate::Problem::new(crate::Kind::Connection, "timed out")
        };
        // First session: a verified, b under way (100 of it held from an
        // earlier run; 80 handed to its streams, of which 50 landed), c not
        // started.
        let mut first = report(vec![file("a", Status::Verified, 300, 0)], vec![lost]);
        first.unsettled = vec![file("b", Status::Failed, 80, 100)];
        first.first_data_s = Some(0.5);
        first.final_mbps = Some(9.0);
        first.fingerprint = Some("SHA256:x".into());
        // Second: a is there (skipped), b resumes 150 and moves 150, c moves.
        let second = report(
            vec![
                file("a", Status::Skipped, 0, 0),
                file("b", Status::Verified, 150, 150),
                file("c", Status::Verified, 300, 0),
            ],
            vec![],
        );
        let m = merge(vec![first, second], 10.0);
        assert!(m.ok && m.problems.is_empty());
        let got: Vec<_> = m
            .files
            .iter()
            .map(|f| {
                (
                    f.path.as_str(),
                    f.status,
                    f.bytes_transferred,
                    f.bytes_resumed,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", Status::Verified, 300, 0),
                ("b", Status::Verified, 200, 100),
                ("c", Status::Verified, 300, 0),
            ]
        );
        assert_eq!(m.totals.verified, 3);
        assert_eq!(m.totals.skipped, 0);
        assert_eq!(m.totals.bytes_transferred, 800);
        assert_eq!(m.totals.bytes_resumed, 100);
        assert_eq!(m.udp_rx_bytes, 2000);
        assert_eq!(m.retransmitted_bytes, 20);
        assert_eq!(m.seconds, 10.0);
        assert!((m.rate_mbps - 800.0 * 8.0 / 1e6 / 10.0).abs() < 1e-12);
        assert_eq!(m.first_data_s, Some(0.5));
        assert_eq!(m.final_mbps, Some(9.0));
        assert_eq!(m.fingerprint.as_deref(), Some("SHA256:x"));
    }

    #[test]
    fn a_merged_report_keeps_the_last_sessions_problems_and_failures() {
        let first = report(vec![file("a", Status::Failed, 10, 0)], vec![]);
        let p = crate::Problem::new(crate::Kind::Verify, "a: BLAKE3 differs");
        let second = report(vec![file("a", Status::Failed, 290, 10)], vec![p.clone()]);
        let m = merge(vec![first, second], 3.0);
        assert!(!m.ok);
        assert_eq!(m.problems, [p]);
        assert_eq!(m.totals.failed, 1);
        assert_eq!(m.files[0].bytes_transferred, 300);
        assert_eq!(m.files[0].bytes_resumed, 0);
    }
}
