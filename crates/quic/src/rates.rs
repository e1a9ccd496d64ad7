//! Rates remembered per server: the best second of the last large transfer
//! with a server (UDP payload bits per second, `net::spawn_window_tuner`), kept
//! in a small text file, and used as `wan`'s starting hint the next time (fast
//! start without `--max-rate`). The mean rate of the data phase, remembered
//! before, sat 10-20 % below the path's rate (payload, not wire bytes, and the
//! start-up included), and `wan` started below the path's rate grows only by
//! its probes and headroom.
//!
//! Why a remembered rate is a safe start: it is what this client measured on
//! this path, not a guess; `wan` paces at it from the first round trip, and the
//! controller checks it within a few: a queue that builds (the path is slower
//! now, or shared) drains the next round, and losses that come with a queue
//! replace the estimate by what was delivered (tests/it/wan_sim.rs: a hint 2x too
//! high is corrected). Entries expire after [`MAX_AGE`].
//!
//! The file: one line per server and direction, `get:HOST:PORT BITS_PER_SECOND
//! UNIX_SECONDS` (or `put:...`); only uncapped `wan` transfers are remembered;
//! lines that do not parse are dropped when it is next written.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A remembered rate older than this is not used.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Transfers that moved less than this say little about the path's rate (they
/// end in the controller's startup) and are not remembered.
pub(crate) const MIN_BYTES: u64 = 64 << 20;
/// Nor do transfers of files smaller than this on average: they are limited
/// by creating files, not by the path (20,000 files of 10 kB on loopback left
/// 121 Mbit/s behind), and a hint below the path's rate starts `wan` cruising
/// where it can only grow by its probes: at 700 ms, 3.6 % every 8 round trips.
pub(crate) const MIN_MEAN_FILE: u64 = 4 << 20;

/// Is a complete `wan` transfer of `bytes` in `files` files a fair reading of
/// the path's rate?
pub(crate) fn worth_remembering(bytes: u64, files: u64) -> bool {
    bytes >= MIN_BYTES && bytes / files.max(1) >= MIN_MEAN_FILE
}
/// Servers the file keeps (the most recently used).
const MAX_ENTRIES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    server: String,
    bps: u64,
    when: u64,
}

fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let e = Entry {
                server: f.next()?.to_string(),
                bps: f.next()?.parse().ok()?,
                when: f.next()?.parse().ok()?,
            };
            f.next().is_none().then_some(e)
        })
        .collect()
}

fn render(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| format!("{} {} {}\n", e.server, e.bps, e.when))
        .collect()
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[derive(Debug, Clone)]
pub(crate) struct RateMemory {
    path: PathBuf,
}

impl RateMemory {
    pub(crate) fn new(path: PathBuf) -> RateMemory {
        RateMemory { path }
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The rate remembered for `server` (`get:HOST:PORT`, `put:HOST:PORT`),
    /// bits/s, if any and fresh.
    pub(crate) fn recall(&self, server: &str, now: SystemTime) -> Option<u64> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let now = unix(now);
        parse(&text)
            .into_iter()
            .rev()
            .find(|e| e.server == server)
            .filter(|e| now.saturating_sub(e.when) <= MAX_AGE.as_secs() && e.bps > 0)
            .map(|e| e.bps)
    }

    /// Remember `bps` for `server`, replacing what was there (the file is
    /// replaced whole, see `identity::write_private`).
    pub(crate) fn remember(&self, server: &str, bps: u64, now: SystemTime) -> Result<()> {
        if server.chars().any(char::is_whitespace) || server.is_empty() {
            anyhow::bail!("{server:?} cannot be a key of the rate memory");
        }
        let mut entries = std::fs::read_to_string(&self.path)
            .map(|t| parse(&t))
            .unwrap_or_default();
        entries.retain(|e| e.server != server);
        entries.push(Entry {
            server: server.to_string(),
            bps,
            when: unix(now),
        });
        let skip = entries.len().saturating_sub(MAX_ENTRIES);
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        crate::identity::write_private(&self.path, render(&entries[skip..]).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_remembered_per_server_and_forgotten_when_old() {
        let d = tempfile::tempdir().unwrap();
        let m = RateMemory::new(d.path().join("state/rates"));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(m.recall("a:7878", t0), None);
        m.remember("a:7878", 900_000_000, t0).unwrap();
        m.remember("b:7878", 50_000_000, t0).unwrap();
        m.remember("a:7878", 800_000_000, t0).unwrap();
        assert_eq!(m.recall("a:7878", t0), Some(800_000_000));
        assert_eq!(m.recall("b:7878", t0), Some(50_000_000));
        assert_eq!(m.recall("c:7878", t0), None);
        let later = t0 + MAX_AGE + Duration::from_secs(1);
        assert_eq!(m.recall("a:7878", later), None);
        let text = std::fs::read_to_string(m.path()).unwrap();
        assert_eq!(
            text,
            "b:7878 50000000 1800000000\na:7878 800000000 1800000000\n"
        );
        assert!(m.remember("a b", 1, t0).is_err());
    }

    #[test]
    fn only_large_transfers_of_large_files_are_remembered() {
        assert!(worth_remembering(2 << 30, 1));
        assert!(worth_remembering(MIN_BYTES, 16));
        assert!(!worth_remembering(MIN_BYTES - 1, 1), "too little");
        assert!(!worth_remembering(200_000_000, 20_000), "10 kB files");
        assert!(!worth_remembering(MIN_BYTES, 17), "under 4 MiB a file");
    }

    #[test]
    fn a_damaged_file_loses_only_its_bad_lines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("rates");
        std::fs::write(&p, "x:1 100 5\ngarbage\ny:1 notanumber 5\nz:1 7 5 extra\n").unwrap();
        let m = RateMemory::new(p.clone());
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        assert_eq!(m.recall("x:1", t), Some(100));
        assert_eq!(m.recall("y:1", t), None);
        m.remember("w:1", 9, t).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "x:1 100 5\nw:1 9 10\n"
        );
    }

    #[test]
    fn the_file_keeps_the_most_recent_servers() {
        let d = tempfile::tempdir().unwrap();
        let m = RateMemory::new(d.path().join("rates"));
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        for i in 0..MAX_ENTRIES + 3 {
            m.remember(&format!("h{i}:1"), 1 + i as u64, t).unwrap();
        }
        let text = std::fs::read_to_string(m.path()).unwrap();
        assert_eq!(text.lines().count(), MAX_ENTRIES);
        assert_eq!(m.recall("h0:1", t), None);
        assert_eq!(m.recall(&format!("h{}:1", MAX_ENTRIES + 2), t), Some(259));
    }
}
