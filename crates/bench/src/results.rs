//! What a suite run produced (results.json): every run of every tool, with
//! a typed status, and the queries the reports share.

use crate::scenario::{Metric, Suite};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// How a run ended (in results.json: `ok`, `failed`, `timeout`,
/// `unverified`, `skipped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Every receiver got the data set and it verified.
    Ok,
    /// The tool failed (its exit status, or it did not start).
    Failed,
    /// Stopped at the time cap: its rate is that of what it moved.
    Timeout,
    /// It ended, but a receiver's tree is not the data set.
    Unverified,
    /// Not run (a program is missing: the note says how to install it).
    Skipped,
}

impl Status {
    /// Counts in the tables: it ran to the end, or to its cap.
    pub fn measured(self) -> bool {
        matches!(self, Status::Ok | Status::Timeout)
    }

    /// The status's name in results.json and the reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Timeout => "timeout",
            Status::Unverified => "unverified",
            Status::Skipped => "skipped",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tool's run over one scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// Name of the scenario it ran.
    pub scenario: String,
    /// The tool's label: its name, with its settings if any (`gridftp:p=8`).
    pub tool: String,
    /// Repetition number, from 1.
    pub rep: u32,
    /// Every receiver's link ("A | B" for two receivers).
    pub link: String,
    /// The links' MTU.
    #[serde(default = "default_mtu")]
    pub mtu: usize,
    /// The sweep the scenario belongs to, and its x on it.
    #[serde(default)]
    pub sweep: Option<String>,
    /// Its x on that sweep.
    #[serde(default)]
    pub x: Option<f64>,
    /// Competing traffic on the path during the run, if any.
    #[serde(default)]
    pub background: String,
    /// What the competing traffic was delivered meanwhile, Mbit/s.
    #[serde(default)]
    pub background_mbps: Option<f64>,
    /// Each flow of the competing traffic, Mbit/s over the run (IP bytes the
    /// emulator delivered), largest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub background_flows_mbps: Vec<f64>,
    /// Beside background TCP flows: Jain's fairness index over the tool's
    /// rate and each flow's, over the run (IP bytes the emulator delivered):
    /// 1 when all got the same, 1/(N+1) when one took everything.
    #[serde(default)]
    pub jain: Option<f64>,
    /// Beside background traffic: its rate in the tool's first 10 round
    /// trips over its rate in the span just before the tool started (10
    /// round trips, at least 1 s): 1.0 = the tool took nothing from it at
    /// first, 0.5 = it lost half. How gently a start joins a full link.
    #[serde(default)]
    pub background_kept: Option<f64>,
    /// Beside background traffic: the share of the background's packets
    /// that the path lost (its queue's drops and the link's random loss)
    /// while the tool ran.
    #[serde(default)]
    pub background_lost: Option<f64>,
    /// Beside background traffic: the background's packets the path lost
    /// while the tool ran (a count: a join's overflow is one event, which a
    /// share of a longer run would dilute).
    #[serde(default)]
    pub background_dropped: Option<u64>,
    /// On a link with a schedule: the wire packets its outages dropped while
    /// the tool ran (every host, both directions; what was offered while a
    /// link was down and what was queued when it went down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outage_dropped: Option<u64>,
    /// How many hosts received the data set.
    #[serde(default = "one")]
    pub receivers: u32,
    /// How it ended; only `ok` and `timeout` runs count in the tables.
    pub status: Status,
    /// Why it failed or was skipped (the tail of its output, or how to install it).
    pub note: String,
    /// What the data set was: `generated 3x10000: 3 files, 30000 bytes (0.0 MB)`,
    /// `tree /usr/share: 46012 files, 3905 symlinks, ...`; empty in results from
    /// before it was recorded.
    #[serde(default)]
    pub data: String,
    /// Number of regular files in the data set.
    pub files: u64,
    /// Bytes of the data set (each receiver gets all of them).
    pub bytes: u64,
    /// Bytes that reached a receiver, averaged over receivers (less than
    /// `bytes` only when the run was stopped at its time cap).
    #[serde(default)]
    pub delivered_bytes: u64,
    /// Seconds from the actors' start until the last one exited or the time cap
    /// stopped them; 0 if they never started.
    pub wall_s: f64,
    /// Delivered bytes per receiver over the wall time.
    pub mbps: f64,
    /// (payload bytes / the scenario's bottleneck rate) / wall time (seed 003):
    /// the bottleneck is the receivers' down-direction link rate (the slowest
    /// limited receiver), or the suite's `line_rate_bps` when no link has a rate.
    pub ttp: f64,
    /// Payload bytes (one copy) / bytes the server put on the wire (seed 003).
    pub goodput: f64,
    /// Bytes the server host offered to the emulator while the tool ran (IP bytes,
    /// background traffic taken out); the denominator of `goodput`.
    pub wire_bytes: u64,
    /// Bytes the receiver hosts offered to the emulator while the tool ran
    /// (requests, acknowledgements; background flows' taken out): with
    /// `wire_bytes`, everything the transfer put on the wire.
    #[serde(default)]
    pub wire_back_bytes: u64,
    /// Seconds from the start until the first byte of a file landed at a
    /// receiver's disk (longhaul writes a chunk of up to 1 MiB once all of
    /// it is in: on a slow link long after its first data).
    #[serde(default)]
    pub ttfb_s: Option<f64>,
    /// CPU seconds of everything the tool ran in the receivers.
    pub client_cpu_s: f64,
    /// CPU seconds of everything the tool ran in the server.
    pub server_cpu_s: f64,
    /// None for memory-to-memory tools.
    pub verified: Option<bool>,
    /// Mbit/s the receivers' links delivered (mean over receivers), per 100 ms.
    pub series_mbps: Vec<f64>,
    /// Beside background traffic: what its flows were delivered per 100 ms
    /// (IP bytes, Mbit/s), aligned with `series_mbps`; empty without it (or
    /// where the emulator kept no series for its flows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub background_series_mbps: Vec<f64>,
    /// With several receivers: each one's own 100 ms series, in receiver
    /// order (a slow receiver is not averaged away).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub receiver_series_mbps: Vec<Vec<f64>>,
    /// With several receivers of files: seconds from the start until each one
    /// held the whole data set (every file, every byte; looked at four times a
    /// second), None if it never did within the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub receiver_done_s: Vec<Option<f64>>,
    /// Start-up: seconds from the first data (the first 100 ms carrying 1 %
    /// of the scenario's link) to the end of the first 100 ms carrying 90 %
    /// of it; None if none did. Divided by the RTT: round trips to line rate.
    #[serde(default)]
    pub to_90pct_s: Option<f64>,
    /// Once at speed (`metrics::steady`): the mean Mbit/s the emulator delivered
    /// (IP bytes, retransmissions included) ...
    #[serde(default)]
    pub steady_mbps: Option<f64>,
    /// ... and the standing queue on the way, ms: the median and the largest
    /// of the per-second least waits.
    #[serde(default)]
    pub queue_ms: Option<f64>,
    /// The largest of those per-second least waits, ms.
    #[serde(default)]
    pub queue_max_ms: Option<f64>,
    /// CPU seconds the lab's emulator used during the run (it shares the
    /// machine's cores with the tool).
    #[serde(default)]
    pub emulator_cpu_s: f64,
    /// Core-seconds the whole machine was busy during the run (/proc/stat:
    /// the tool, the emulator, the kernel's packet work no process is
    /// charged for, and anything else running).
    #[serde(default)]
    pub machine_cpu_s: f64,
    /// What held the run back, judged from its numbers ([`limit`]); empty
    /// for a run that did not measure.
    #[serde(default)]
    pub limit: String,
    /// A dissemination scenario's run (a producer writing products for
    /// receivers that come and go): what each receiver had, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feed: Option<FeedRun>,
}

/// What a dissemination run measured ([`Run::feed`]): the producer's
/// products and, per receiver, which of them it had verified and how long
/// after each was ready at the sender.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FeedRun {
    /// Products the producer wrote.
    pub produced: u64,
    /// Their bytes.
    pub produced_bytes: u64,
    /// Seconds the producer wrote for.
    pub seconds: f64,
    /// The rate it wrote them at, Mbit/s of file bytes.
    pub load_mbps: f64,
    /// The sender's processes: CPU seconds over the run.
    pub sender_cpu_s: f64,
    /// The sender's resident memory, sampled: (seconds since the
    /// producer's start, kB), summed over its processes.
    pub sender_rss_kb: Vec<(f64, u64)>,
    /// One per receiver, in host order.
    pub receivers: Vec<FeedReceiver>,
    /// How busy the machine's cores were, every 5 s: (seconds since the
    /// producer's start, cores busy over the 5 s before; /proc/stat).
    #[serde(default)]
    pub busy_cores: Vec<(f64, f64)>,
    /// CPU seconds of the runner itself over the run: the producer (writing
    /// and hashing products) and the stations (reading and hashing what
    /// lands), which share the cores with the tools.
    #[serde(default)]
    pub runner_cpu_s: f64,
}

/// One receiver of a dissemination run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FeedReceiver {
    /// Its lab host (cli, cli2, ...).
    pub host: String,
    /// Its link.
    pub link: String,
    /// What happened to it: empty, `joined at 12 s`, `down 20-30 s`.
    pub role: String,
    /// Products it was due: every one ready once it had joined (and all of
    /// them for one that was only restarted).
    pub due: u64,
    /// Of those, how many it had verified (hash equal to the product's).
    pub had: u64,
    /// Products it had that it was not due (ready before it joined).
    pub extra: u64,
    /// Products that arrived a second time (after a first verified copy).
    pub duplicates: u64,
    /// Files under a product's name whose bytes were not the product's
    /// when the run ended (corrupt, or a tool that writes in place was
    /// mid-file).
    pub corrupt: u64,
    /// Latency from ready at the sender to verified at the receiver, of
    /// the due products it had: median, 99th percentile, largest (s).
    pub p50_s: Option<f64>,
    /// See `p50_s`.
    pub p99_s: Option<f64>,
    /// See `p50_s`.
    pub max_s: Option<f64>,
    /// Latency over time: per second of ready time (seconds since the
    /// producer's start), the median and the largest latency of the
    /// products ready in that second that it had: (t, p50, max).
    pub latency_by_second: Vec<(f64, f64, f64)>,
    /// The latency distribution: its 0th, 1st, ..., 100th percentile (s);
    /// empty when it had none.
    pub percentiles: Vec<f64>,
    /// CPU seconds of the tool's processes in this receiver (every
    /// instance, over a restart).
    pub cpu_s: f64,
    /// Its resident memory, sampled as the sender's: (s, kB).
    pub rss_kb: Vec<(f64, u64)>,
}

fn one() -> u32 {
    1
}

/// What held a run back, from its own numbers on a machine of `cores`:
/// - `link`: it moved at least 90 % of its link's rate (TTP >= 0.9);
/// - `CPU (N cores)`: the machine's cores were at least 85 % busy (the
///   tool's processes on both sides, the emulator and the kernel's packet
///   work: [`Run::machine_cpu_s`], or the processes' own sum where that is 0);
/// - `receiver CPU`, `sender CPU`, `emulator CPU`: what ran in each receiver
///   (on average), in the server, or the emulator used at least 90 % of a
///   core (a single-threaded tool's limit; a many-threaded one may be held
///   back below that and read `not CPU or link`);
/// - `not CPU or link`: none of those (the tool's windows, start-up,
///   loss recovery or round trips per file).
///
/// A label from counters, not a proof: the report says so.
pub fn limit(x: &Run, cores: usize) -> String {
    if !x.status.measured() || x.wall_s <= 0.0 {
        return String::new();
    }
    let busy = |cpu: f64| cpu / x.wall_s;
    let all = busy((x.client_cpu_s + x.server_cpu_s + x.emulator_cpu_s).max(x.machine_cpu_s));
    if x.ttp >= 0.9 {
        "link".into()
    } else if cores > 0 && all >= 0.85 * cores as f64 {
        format!("CPU ({cores} cores)")
    } else if busy(x.client_cpu_s / f64::from(x.receivers.max(1))) >= 0.9 {
        "receiver CPU".into()
    } else if busy(x.server_cpu_s) >= 0.9 {
        "sender CPU".into()
    } else if busy(x.emulator_cpu_s) >= 0.9 {
        "emulator CPU".into()
    } else {
        "not CPU or link".into()
    }
}

impl Run {
    /// The tool's part of what the bottleneck delivered, beside background
    /// traffic (a fair share beside N TCP flows is 1/(N+1)).
    pub fn share(&self) -> Option<f64> {
        let bg = self.background_mbps?;
        (self.mbps + bg > 0.0).then(|| self.mbps / (self.mbps + bg))
    }
}

/// Everything a suite run produced (results.json).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    /// The suite as it was loaded: the reports take its title, target and sweeps.
    pub suite: Suite,
    /// The profile the suite ran under, and what it scaled.
    #[serde(default)]
    pub profile: String,
    /// What the profile did to the suite, a sentence for the reports
    /// ([`crate::runner::profile_note`]).
    #[serde(default)]
    pub profile_note: String,
    /// When the suite run started, seconds since the Unix epoch.
    pub started_unix: u64,
    /// The machine it ran on: `kernel`, `cores`, `cpu` and `memory` (the first line
    /// of /proc/meminfo).
    pub machine: BTreeMap<String, String>,
    /// Each tool's version (the first line its version command printed), by tool
    /// name; recorded when the tool first runs, so a skipped tool has none.
    pub versions: BTreeMap<String, String>,
    /// The suite's line rate in bit/s, the reference of `ttp` only for scenarios
    /// whose links have no rate (the others use their links' own).
    pub line_rate_bps: u64,
    /// The command line that made the run (`longhaul lab run SUITE
    /// [--profile P] [--scenarios ...] [--tools ...] [--repeat N]`); empty
    /// in results from before it was kept.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub command: String,
    /// Every run, in the order they ran.
    pub runs: Vec<Run>,
}

/// Scenarios and tools in the order they first ran.
pub fn axes(r: &Results) -> (Vec<String>, Vec<String>) {
    let mut sc: Vec<String> = Vec::new();
    let mut tools: Vec<String> = Vec::new();
    for x in &r.runs {
        if !sc.contains(&x.scenario) {
            sc.push(x.scenario.clone());
        }
        if !tools.contains(&x.tool) {
            tools.push(x.tool.clone());
        }
    }
    (sc, tools)
}

/// The runs of one tool in one scenario.
pub fn runs_of<'a>(r: &'a Results, scenario: &str, tool: &str) -> Vec<&'a Run> {
    r.runs
        .iter()
        .filter(|x| x.scenario == scenario && x.tool == tool)
        .collect()
}

/// The cell of one tool in one scenario: mean Mbit/s of its measured runs
/// (verified, or stopped at the time cap: then the rate of what it moved,
/// marked ⏱), or why there is none.
pub fn cell(runs: &[&Run]) -> (Option<f64>, String) {
    let measured: Vec<&&Run> = runs.iter().filter(|x| x.status.measured()).collect();
    if measured.is_empty() {
        let why = runs.first().map_or("-".into(), |x| x.status.to_string());
        return (None, why);
    }
    let mean = measured.iter().map(|x| x.mbps).sum::<f64>() / measured.len() as f64;
    let capped = measured
        .iter()
        .filter(|x| x.status == Status::Timeout)
        .count();
    let mut note = String::new();
    if capped > 0 {
        note.push_str(" ⏱");
    }
    if measured.len() < runs.len() {
        let _ = write!(note, " ({} of {} measured)", measured.len(), runs.len());
    }
    (Some(mean), note)
}

/// Like `cell`, for any metric.
pub fn cell_of(runs: &[&Run], metric: Metric) -> (Option<f64>, String) {
    let (mbps, note) = cell(runs);
    let Some(_) = mbps else {
        return (None, note);
    };
    let measured: Vec<&&Run> = runs.iter().filter(|x| x.status.measured()).collect();
    let mean =
        |f: fn(&Run) -> f64| measured.iter().map(|x| f(x)).sum::<f64>() / measured.len() as f64;
    let v = match metric {
        Metric::Mbps => mbps.expect("checked"),
        Metric::Ttp => mean(|x| x.ttp),
        Metric::Goodput => mean(|x| x.goodput),
        Metric::Seconds => mean(|x| x.wall_s),
        Metric::Share | Metric::Jain | Metric::Kept => {
            let of = |x: &Run| match metric {
                Metric::Jain => x.jain,
                Metric::Kept => x.background_kept,
                _ => x.share(),
            };
            let vs: Vec<f64> = measured.iter().filter_map(|x| of(x)).collect();
            if vs.is_empty() {
                return (None, "no background".into());
            }
            vs.iter().sum::<f64>() / vs.len() as f64
        }
    };
    (Some(v), note)
}

/// A rate (stored in Mbit/s) for a table cell in Mbit/s: from 1 Mbit/s up as it
/// always was ("1.5"), below it in kbit/s to three significant digits ("213
/// kbit/s"), so slow links do not read "0.2" for every tool. Zero stays "0.0".
/// The CSV and results.json keep plain Mbit/s.
pub fn rate_text(mbps: f64) -> String {
    let kbps = mbps * 1e3;
    if mbps >= 1.0 || kbps.is_nan() || kbps <= 0.0 {
        return format!("{mbps:.1}");
    }
    // Rounded to three significant digits first, so 99.96 prints "100", not
    // "100.0", and 999.6 kbit/s is 1.0 Mbit/s.
    let digits = |v: f64| (2 - v.log10().floor() as i32).max(0) as usize;
    let scale = 10f64.powi(digits(kbps) as i32);
    let k = (kbps * scale).round() / scale;
    if k >= 1e3 {
        return format!("{mbps:.1}");
    }
    format!("{k:.0$} kbit/s", digits(k))
}

/// The share column: the tool's part of the link beside background traffic.
pub fn share_text(x: &Run) -> String {
    x.share().map_or("-".into(), |s| format!("{s:.3}"))
}

/// A run's Jain's index for a table cell ("-" without background TCP flows).
pub fn jain_text(x: &Run) -> String {
    x.jain.map_or("-".into(), |j| format!("{j:.3}"))
}

/// What the background kept in the tool's first 10 round trips, for a table
/// cell ("-" without background).
pub fn kept_text(x: &Run) -> String {
    x.background_kept.map_or("-".into(), |k| format!("{k:.2}"))
}

fn default_mtu() -> usize {
    crate::scenario::DEFAULT_MTU
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_says_link_cpu_one_core_or_neither() {
        let mut x: Run = serde_json::from_value(serde_json::json!({
            "scenario": "s", "tool": "t", "rep": 0, "link": "rate=1G", "status": "ok", "note": "",
            "files": 1, "bytes": 1, "wall_s": 10.0, "mbps": 500.0, "ttp": 0.5,
            "goodput": 1.0, "wire_bytes": 1, "client_cpu_s": 2.0, "server_cpu_s": 2.0,
            "verified": true, "series_mbps": []
        }))
        .unwrap();
        assert_eq!(limit(&x, 2), "not CPU or link");
        x.ttp = 0.93;
        assert_eq!(limit(&x, 2), "link");
        x.ttp = 0.5;
        x.emulator_cpu_s = 14.0; // 18 of 20 core-seconds
        assert_eq!(limit(&x, 2), "CPU (2 cores)");
        x.emulator_cpu_s = 0.0;
        x.machine_cpu_s = 18.0; // softirqs no process is charged for
        assert_eq!(limit(&x, 2), "CPU (2 cores)");
        x.machine_cpu_s = 0.0;
        x.client_cpu_s = 9.5;
        assert_eq!(limit(&x, 4), "receiver CPU");
        x.receivers = 2; // 4.75 s of CPU each
        assert_eq!(limit(&x, 4), "not CPU or link");
        x.receivers = 1;
        x.client_cpu_s = 1.0;
        x.server_cpu_s = 9.0;
        assert_eq!(limit(&x, 4), "sender CPU");
        x.status = Status::Failed;
        assert_eq!(limit(&x, 4), "");
    }

    #[test]
    fn statuses_keep_their_names_in_results_json() {
        for (s, name) in [
            (Status::Ok, "ok"),
            (Status::Failed, "failed"),
            (Status::Timeout, "timeout"),
            (Status::Unverified, "unverified"),
            (Status::Skipped, "skipped"),
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), name);
            let back: Status = serde_json::from_value(name.into()).unwrap();
            assert_eq!(back, s);
            assert_eq!(s.to_string(), name);
            assert_eq!(s.measured(), matches!(s, Status::Ok | Status::Timeout));
        }
        assert!(serde_json::from_value::<Status>("fine".into()).is_err());
    }

    #[test]
    fn slow_rates_print_in_kbit_s_to_three_digits_and_the_rest_as_before() {
        let text = |bps: f64| rate_text(bps / 1e6);
        assert_eq!(text(213_400.0), "213 kbit/s");
        assert_eq!(text(21_340.0), "21.3 kbit/s");
        assert_eq!(text(2_134.0), "2.13 kbit/s");
        assert_eq!(text(99_960.0), "100 kbit/s");
        assert_eq!(text(999_600.0), "1.0");
        assert_eq!(text(1_000_000.0), "1.0");
        assert_eq!(text(1_500_000.0), "1.5");
        assert_eq!(text(217_600_000.0), "217.6");
        assert_eq!(text(0.0), "0.0");
    }
}
