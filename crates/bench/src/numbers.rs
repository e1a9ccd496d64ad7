//! `longhaul lab table`: the short tables README's "Numbers" shows, made
//! from a run's results.json, so that no figure there is copied by hand.
//! One row per scenario: longhaul beside the best peer (named), their
//! ratio, and the command that reproduces the run above the table.

use crate::results::{axes, Results, Run, Status};
use crate::scenario::{Metric, BUILTIN};
use std::fmt::Write as _;

/// What a table shows of each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    /// One of the suite's metrics.
    Metric(Metric),
    /// CPU seconds of both ends per GB delivered (lower is better).
    CpuPerGb,
}

impl Figure {
    /// Parses `mbps`, `ttp`, `goodput`, `seconds`, `share` or `cpu`.
    pub fn parse(s: &str) -> Result<Figure, String> {
        Ok(match s {
            "mbps" => Figure::Metric(Metric::Mbps),
            "ttp" => Figure::Metric(Metric::Ttp),
            "goodput" => Figure::Metric(Metric::Goodput),
            "seconds" => Figure::Metric(Metric::Seconds),
            "share" => Figure::Metric(Metric::Share),
            "cpu" => Figure::CpuPerGb,
            _ => {
                return Err(format!(
                    "figure {s:?}: one of mbps, ttp, goodput, seconds, share, cpu"
                ))
            }
        })
    }

    fn lower_is_better(self) -> bool {
        matches!(self, Figure::CpuPerGb | Figure::Metric(Metric::Seconds))
    }

    fn of(self, x: &Run) -> Option<f64> {
        match self {
            Figure::Metric(Metric::Mbps) => Some(x.mbps),
            Figure::Metric(Metric::Ttp) => Some(x.ttp),
            Figure::Metric(Metric::Goodput) => Some(x.goodput),
            Figure::Metric(Metric::Seconds) => Some(x.wall_s),
            Figure::Metric(Metric::Share) => x.share(),
            Figure::Metric(Metric::Jain) => x.jain,
            Figure::Metric(Metric::Kept) => x.background_kept,
            Figure::CpuPerGb => {
                let gb = x.delivered_bytes as f64 * x.receivers.max(1) as f64 / 1e9;
                (gb > 0.0).then(|| (x.client_cpu_s + x.server_cpu_s) / gb)
            }
        }
    }

    fn text(self, v: f64) -> String {
        match self {
            Figure::Metric(Metric::Mbps) => crate::results::rate_text(v)
                .trim()
                .to_string()
                .replace(" kbit/s", "\u{a0}kbit/s"),
            Figure::Metric(Metric::Seconds) => format!("{v:.2}\u{a0}s"),
            Figure::CpuPerGb => format!("{v:.1}"),
            _ => crate::text::sig3(v),
        }
    }

    fn heading(self) -> &'static str {
        match self {
            Figure::Metric(Metric::Mbps) => "Mbit/s",
            Figure::Metric(Metric::Ttp) => "TTP",
            Figure::Metric(Metric::Goodput) => "G",
            Figure::Metric(Metric::Seconds) => "seconds",
            Figure::Metric(Metric::Share) => "share",
            Figure::Metric(Metric::Jain) => "Jain",
            Figure::Metric(Metric::Kept) => "bg kept",
            Figure::CpuPerGb => "CPU-s/GB",
        }
    }
}

/// What to put in a table.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    /// The figure (default: the first metric of the scenario's sweep, or Mbit/s).
    pub figure: Option<Figure>,
    /// The longhaul label to show (default: the best of the tools whose
    /// label starts with "longhaul" in each scenario, named when not plain).
    pub ours: Option<String>,
    /// The peers to compare with (default: every tool whose label does not
    /// start with "longhaul", but iperf3 in any setting, which moves no files).
    pub peers: Option<Vec<String>>,
    /// Add both sides' CPU seconds per GB.
    pub cpu: bool,
    /// Only the scenarios matching one of these globs (`*`).
    pub scenarios: Option<Vec<String>>,
}

impl Choice {
    /// Whether tool label `t` is shown as longhaul.
    fn is_ours(&self, t: &str) -> bool {
        match &self.ours {
            Some(o) => t == o,
            None => t.starts_with("longhaul"),
        }
    }

    /// Whether tool label `t` is a peer to compare with.
    fn is_peer(&self, t: &str) -> bool {
        match &self.peers {
            Some(p) => p.iter().any(|x| x == t),
            None => !t.starts_with("longhaul") && t.split(':').next() != Some("iperf3"),
        }
    }
}

/// One tool's figure in one scenario: the median over its measured runs,
/// whether any was stopped at the time cap, and how many there were.
struct Cell {
    value: f64,
    capped: bool,
    /// Runs measured, of runs made.
    runs: (usize, usize),
}

fn cell(r: &Results, scenario: &str, tool: &str, figure: Figure) -> Option<Cell> {
    let made: Vec<&Run> = r
        .runs
        .iter()
        .filter(|x| x.scenario == scenario && x.tool == tool)
        .collect();
    let runs: Vec<&&Run> = made.iter().filter(|x| x.status.measured()).collect();
    let vs: Vec<f64> = runs.iter().filter_map(|x| figure.of(x)).collect();
    (!vs.is_empty()).then(|| Cell {
        value: crate::compare::median(&vs),
        capped: runs.iter().any(|x| x.status == Status::Timeout),
        runs: (runs.len(), made.len()),
    })
}

/// The best of `tools` in `scenario` by `figure`.
fn best<'a>(
    r: &Results,
    scenario: &str,
    tools: impl Iterator<Item = &'a String>,
    figure: Figure,
) -> Option<(&'a String, Cell)> {
    tools
        .filter_map(|t| cell(r, scenario, t, figure).map(|c| (t, c)))
        .reduce(|a, b| {
            let b_better = if figure.lower_is_better() {
                b.1.value < a.1.value
            } else {
                b.1.value > a.1.value
            };
            if b_better {
                b
            } else {
                a
            }
        })
}

/// The command that reruns what `r` holds: the one recorded with it, or
/// for results from before commands were kept, one made from the suite and
/// the runs (its `--scenarios` cannot be known there).
pub fn command(r: &Results) -> String {
    if !r.command.is_empty() {
        return r.command.clone();
    }
    let name = &r.suite.suite.name;
    let mut c = if BUILTIN.iter().any(|(n, _)| n == name) {
        format!("longhaul lab run {name}")
    } else {
        format!("longhaul lab run docs/lab/{name}.toml")
    };
    if !r.profile.is_empty() && r.profile != "standard" {
        let _ = write!(c, " --profile {}", r.profile);
    }
    let (scenarios, tools) = axes(r);
    let profile = r.suite.profile_of(&r.profile).ok().flatten();
    // The scenarios the profile runs (its `only`, or all of them).
    let planned = match profile.map(|p| &p.only) {
        Some(only) if !only.is_empty() => only.len(),
        _ => r.suite.scenarios.len(),
    };
    if scenarios.len() < planned {
        let _ = write!(c, " --scenarios {}", scenarios.join(","));
    }
    let suite_tools = &r.suite.suite.tools;
    if !suite_tools.is_empty() && tools.len() < suite_tools.len() {
        let _ = write!(c, " --tools {}", tools.join(","));
    }
    let reps = r.runs.iter().map(|x| x.rep).max().unwrap_or(1);
    let asked = profile
        .and_then(|p| p.repeat)
        .unwrap_or(r.suite.suite.repeat)
        .max(1);
    if reps != asked {
        let _ = write!(c, " --repeat {reps}");
    }
    c
}

/// `YYYY-MM-DD` of a Unix time (UTC).
pub fn date(unix: u64) -> String {
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = (unix / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// A dissemination run's table: a row per receiving station, each tool's
/// p99 latency from ready at the sender to verified at the station, and
/// what it had of what it was due.
fn feed_table(r: &Results, scenarios: &[String], choice: &Choice) -> String {
    let mut s = format!("{}:\n\n", source(r, "the first of"));
    let (_, tools) = axes(r);
    let ours = tools.iter().filter(|t| choice.is_ours(t));
    let peers = tools.iter().filter(|t| choice.is_peer(t));
    let shown: Vec<&String> = ours.chain(peers).collect();
    let _ = writeln!(
        s,
        "| station | path | {} |",
        shown
            .iter()
            .map(|t| format!("{t}: had / due, p99"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(s, "|---|---|{}", "---:|".repeat(shown.len()));
    for sc in scenarios {
        let feed_of = |t: &String| {
            r.runs
                .iter()
                .find(|x| &x.scenario == sc && &x.tool == t)
                .and_then(|x| x.feed.as_ref())
        };
        let Some(first) = shown.iter().find_map(|t| feed_of(t)) else {
            continue;
        };
        for (i, v) in first.receivers.iter().enumerate() {
            let role = if v.role.is_empty() {
                String::new()
            } else {
                format!(" ({})", v.role)
            };
            let cells: Vec<String> = shown
                .iter()
                .map(|t| {
                    feed_of(t)
                        .and_then(|f| f.receivers.get(i))
                        .map_or("–".into(), |w| {
                            format!(
                                "{} / {}, {}",
                                w.had,
                                w.due,
                                w.p99_s.map_or("–".into(), |p| format!("{p:.2}\u{a0}s"))
                            )
                        })
                })
                .collect();
            let _ = writeln!(
                s,
                "| {}{role} | {} | {} |",
                v.host,
                path_text(&v.link),
                cells.join(" | ")
            );
        }
    }
    let _ = writeln!(
        s,
        "\nHad / due: products verified at the station / products it was due; p99: latency from ready at the sender to verified at the station."
    );
    s
}

/// A link SPEC for people: `1G, 70 ms RTT, loss 1e-3` (the queue left
/// out; several receivers' links joined by " / "; anything else as written).
pub fn path_text(link: &str) -> String {
    link.split('|')
        .map(|one| {
            let mut parts = Vec::new();
            for kv in one.split_whitespace() {
                match kv.split_once('=') {
                    Some(("rate", v)) if !v.contains('@') => parts.insert(0, v.to_string()),
                    Some(("delay", v)) => match longhaul_transfer::units::parse_duration(v) {
                        Ok(d) => {
                            let ms = d.as_secs_f64() * 2e3;
                            parts.push(format!("{} ms RTT", crate::text::fmt_num(ms)))
                        }
                        Err(_) => parts.push(kv.to_string()),
                    },
                    Some(("loss", v)) => parts.push(format!("loss {v}")),
                    Some(("queue", _)) => {}
                    _ => parts.push(kv.to_string()),
                }
            }
            if parts.is_empty() {
                "unlimited".to_string()
            } else {
                parts.join(", ")
            }
        })
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Several runs of one suite as one (the runs of each, in order; the
/// earliest start), so a table can set tools measured apart side by side.
/// `all` must not be empty.
pub fn merge(all: Vec<Results>) -> Results {
    let mut all = all.into_iter();
    let mut first = all.next().expect("at least one run");
    for r in all {
        first.started_unix = first.started_unix.min(r.started_unix);
        first.runs.extend(r.runs);
        first.versions.extend(r.versions);
    }
    first
}

/// How `r` was made: its command, date and runs per tool, of which a
/// table shows `which` ("median of", "the first of").
fn source(r: &Results, which: &str) -> String {
    let reps = r.runs.iter().map(|x| x.rep).max().unwrap_or(1);
    format!(
        "`{}` ({}, {})",
        command(r),
        date(r.started_unix),
        if reps > 1 {
            format!("{which} {reps} runs")
        } else {
            "one run each".into()
        }
    )
}

/// The markdown table of the runs in `sources` (one run, or runs of one
/// suite made apart, set side by side): the commands and dates, then a row
/// per scenario.
pub fn table(sources: &[Results], choice: &Choice) -> String {
    let Some(first) = sources.first() else {
        return String::new();
    };
    let r = &merge(sources.to_vec());
    let (mut scenarios, tools) = axes(r);
    if let Some(globs) = &choice.scenarios {
        scenarios.retain(|sc| globs.iter().any(|g| crate::scenario::glob(g, sc)));
    }
    if scenarios.is_empty() {
        return format!("{}: no scenario to show\n", source(r, "median of"));
    }
    if scenarios.iter().all(|sc| crate::text::is_feed(r, sc)) {
        return feed_table(r, &scenarios, choice);
    }
    // The rows first: the head says what ⏱ means only if one is capped.
    let mut s = String::new();
    let figure_of = |sc: &str| {
        choice.figure.unwrap_or_else(|| {
            r.runs
                .iter()
                .find(|x| x.scenario == sc)
                .and_then(|x| x.sweep.as_ref())
                .and_then(|w| r.suite.sweep.get(w))
                .and_then(|w| w.metrics.first().copied())
                .map_or(Figure::Metric(Metric::Mbps), Figure::Metric)
        })
    };
    let one_figure = scenarios
        .iter()
        .map(|sc| figure_of(sc))
        .all(|f| f == figure_of(&scenarios[0]));
    let unit = if one_figure {
        format!(" ({})", figure_of(&scenarios[0]).heading())
    } else {
        String::new()
    };
    let our_name = choice.ours.clone().unwrap_or_else(|| "longhaul".into());
    let their_name = match choice.peers.as_deref() {
        Some([one]) => one.clone(),
        _ => "best peer".into(),
    };
    let cpu_head = if choice.cpu {
        " CPU-s/GB | peer's CPU-s/GB |"
    } else {
        ""
    };
    let _ = writeln!(
        s,
        "| scenario | path | {our_name}{unit} | {their_name}{unit} | ratio |{cpu_head}"
    );
    let _ = writeln!(
        s,
        "|---|---|---:|---:|---:|{}",
        if choice.cpu { "---:|---:|" } else { "" }
    );
    for sc in &scenarios {
        let figure = figure_of(sc);
        let ours = best(r, sc, tools.iter().filter(|t| choice.is_ours(t)), figure);
        let theirs = best(r, sc, tools.iter().filter(|t| choice.is_peer(t)), figure);
        if ours.is_none() && theirs.is_none() {
            continue;
        }
        // A column of one named tool does not name it in each cell.
        let one_peer = matches!(choice.peers.as_deref(), Some([_]));
        let shown = |x: &Option<(&String, Cell)>, ours: bool| match x {
            None => "–".to_string(),
            Some((t, c)) => {
                let mut v = figure.text(c.value);
                if !one_figure && !v.ends_with("kbit/s") {
                    let _ = write!(v, "\u{a0}{}", figure.heading());
                }
                if c.capped {
                    if figure == Figure::Metric(Metric::Seconds) {
                        // Stopped at the cap: it would have taken longer.
                        v.insert_str(0, "≥\u{a0}");
                    }
                    v.push_str("\u{a0}⏱");
                }
                if c.runs.0 < c.runs.1 {
                    let _ = write!(v, " ({} of {} runs measured)", c.runs.0, c.runs.1);
                }
                let plain = if ours {
                    choice.ours.as_deref().unwrap_or("longhaul") == t.as_str()
                } else {
                    one_peer
                };
                if plain {
                    v
                } else {
                    format!("{t} {v}")
                }
            }
        };
        let ratio = match (&ours, &theirs) {
            (Some((_, a)), Some((_, b))) if a.value > 0.0 && b.value > 0.0 => {
                let x = if figure.lower_is_better() {
                    b.value / a.value
                } else {
                    a.value / b.value
                };
                format!("{x:.2}×")
            }
            _ => "–".into(),
        };
        let link = r
            .runs
            .iter()
            .find(|x| &x.scenario == sc)
            .map_or(String::new(), |x| {
                let mtu = if x.mtu == crate::scenario::DEFAULT_MTU {
                    String::new()
                } else {
                    format!(", MTU {}", x.mtu)
                };
                path_text(&x.link) + &mtu
            });
        let _ = write!(
            s,
            "| {sc} | {link} | {} | {} | {ratio} |",
            shown(&ours, true),
            shown(&theirs, false)
        );
        if choice.cpu {
            let cpu = |x: &Option<(&String, Cell)>| {
                x.as_ref()
                    .and_then(|(t, _)| cell(r, sc, t, Figure::CpuPerGb))
                    .map_or("–".into(), |c| format!("{:.1}", c.value))
            };
            let _ = write!(s, " {} | {} |", cpu(&ours), cpu(&theirs));
        }
        s.push('\n');
    }
    let capped = if s.contains('⏱') {
        "; ⏱: stopped at the time cap (a rate is what it moved by then, a time a bound)"
    } else {
        ""
    };
    format!(
        "{}, on {}{capped}:\n\n{s}",
        sources
            .iter()
            .map(|r| source(r, "median of"))
            .collect::<Vec<_>>()
            .join(" and "),
        first
            .machine
            .get("cores")
            .map_or("this machine".into(), |c| format!("{c} cores"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_read_as_rate_rtt_and_loss() {
        assert_eq!(
            path_text("rate=1G delay=35ms loss=1e-3 queue=5833pkts"),
            "1G, 70 ms RTT, loss 1e-3"
        );
        assert_eq!(
            path_text("rate=1G | rate=1G delay=35ms loss=1e-3 queue=5833pkts"),
            "1G / 1G, 70 ms RTT, loss 1e-3"
        );
        assert_eq!(
            path_text("rate=100M delay=0.4ms loss=5% outage=20s@5s"),
            "100M, 0.8 ms RTT, loss 5%, outage=20s@5s"
        );
        assert_eq!(path_text(""), "unlimited");
    }

    /// The recorded seed 001 run (docs/results/sctp-multifile): each
    /// scenario's row holds longhaul's median and the best peer's, worked
    /// out here from the runs themselves.
    #[test]
    fn a_row_is_longhaul_beside_the_best_peer_by_median() {
        let r: Results = serde_json::from_str(include_str!(
            "../../../docs/results/sctp-multifile/results.json"
        ))
        .unwrap();
        let t = table(std::slice::from_ref(&r), &Choice::default());
        let (scenarios, tools) = axes(&r);
        assert_eq!(
            t.lines()
                .filter(|l| l.starts_with("| ") && !l.starts_with("| scenario"))
                .count(),
            scenarios.len(),
            "{t}"
        );
        assert!(
            t.starts_with("`longhaul lab run sctp-multifile --profile quick"),
            "{t}"
        );
        for sc in &scenarios {
            let figure = |tool: &str| {
                let mut v: Vec<f64> = r
                    .runs
                    .iter()
                    .filter(|x| &x.scenario == sc && x.tool == tool && x.status.measured())
                    .map(|x| x.wall_s)
                    .collect();
                v.sort_by(f64::total_cmp);
                let n = v.len();
                match n {
                    0 => None,
                    _ if n % 2 == 1 => Some(v[n / 2]),
                    _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
                }
            };
            let ours = figure("longhaul").unwrap();
            let (peer, theirs) = tools
                .iter()
                .filter(|t| *t != "longhaul")
                .filter_map(|t| figure(t).map(|v| (t, v)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap();
            let row = t
                .lines()
                .find(|l| l.starts_with(&format!("| {sc} |")))
                .unwrap();
            let want = format!(
                "| {:.2}\u{a0}s | {peer} {:.2}\u{a0}s | {:.2}× |",
                ours,
                theirs,
                theirs / ours
            );
            assert!(row.ends_with(&want), "{row}\nwant …{want}");
        }
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(951_782_400), "2000-02-29");
        assert_eq!(date(1_796_083_200), "2026-12-01");
    }
}
