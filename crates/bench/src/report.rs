//! Reports from saved results: results.csv, summary.md, and the table a
//! terminal shows. All of them are rendered from results.json alone, so
//! `lab report DIR` re-renders a run's reports.

use crate::results::{
    axes, cell, cell_of, jain_text, kept_text, rate_text, runs_of, share_text, Results, Run,
};
use crate::scenario::{mtu_note, Metric, Suite, BUILTIN, DEFAULT_MTU};
use crate::text::{feed_cells, is_feed, latency_text, metric_text, rss_text, CPU_NOTE};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::Path;

/// Reads DIR/results.json. Results saved before their suite carried the
/// study's figures take them, and the suite's measure, from the built-in
/// suite of the same name.
pub fn load(dir: &Path) -> Result<Results> {
    let p = dir.join("results.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let mut r: Results =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
    let name = r.suite.suite.name.clone();
    if r.suite.published.is_empty() && BUILTIN.iter().any(|(n, _)| *n == name) {
        let builtin = Suite::load(&name)?;
        r.suite.published = builtin.published;
        r.suite.suite.measure = builtin.suite.measure;
    }
    Ok(r)
}

/// Writes results.csv, summary.md and report.html beside results.json.
pub fn write_all(dir: &Path, r: &Results) -> Result<()> {
    std::fs::write(dir.join("results.csv"), csv(r))?;
    std::fs::write(dir.join("summary.md"), summary(r))?;
    std::fs::write(dir.join("report.html"), crate::html::render(r))?;
    Ok(())
}

/// results.csv: a header line, then one line per run with the suite, the profile
/// and every number of [`crate::results::Run`].
pub fn csv(r: &Results) -> String {
    let mut s = String::from(
        "suite,profile,scenario,tool,rep,link,receivers,status,files,bytes,delivered_bytes,wall_s,ttfb_s,mbps,ttp,goodput,background_mbps,share,jain,background_kept,background_lost,background_dropped,to_90pct_s,steady_mbps,queue_ms,queue_max_ms,wire_bytes,wire_back_bytes,client_cpu_s,server_cpu_s,emulator_cpu_s,machine_cpu_s,limit,verified,note,data,mtu\n",
    );
    for x in &r.runs {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{:.3},{},{:.4},{:.4},{:.4},{},{},{},{},{},{},{},{},{},{},{},{},{:.2},{:.2},{:.2},{:.2},{},{},{},{},{}",
            field(&r.suite.suite.name),
            r.profile,
            field(&x.scenario),
            field(&x.tool),
            x.rep,
            field(&x.link),
            x.receivers,
            x.status,
            x.files,
            x.bytes,
            x.delivered_bytes,
            x.wall_s,
            x.ttfb_s.map_or(String::new(), |t| format!("{t:.3}")),
            x.mbps,
            x.ttp,
            x.goodput,
            x.background_mbps.map_or(String::new(), |b| format!("{b:.2}")),
            x.share().map_or(String::new(), |s| format!("{s:.4}")),
            opt(x.jain, 4, ""),
            opt(x.background_kept, 4, ""),
            opt(x.background_lost, 6, ""),
            x.background_dropped.map_or(String::new(), |d| d.to_string()),
            opt(x.to_90pct_s, 1, ""),
            opt(x.steady_mbps, 2, ""),
            opt(x.queue_ms, 1, ""),
            opt(x.queue_max_ms, 1, ""),
            x.wire_bytes,
            x.wire_back_bytes,
            x.client_cpu_s,
            x.server_cpu_s,
            x.emulator_cpu_s,
            x.machine_cpu_s,
            field(&x.limit),
            x.verified.map_or("", |v| if v { "yes" } else { "no" }),
            field(&x.note),
            field(&x.data),
            x.mtu
        );
    }
    s
}

/// An optional number with `digits` decimals, or `none`.
fn opt(v: Option<f64>, digits: usize, none: &str) -> String {
    v.map_or(none.to_string(), |v| format!("{v:.digits$}"))
}

/// A CSV field, quoted when it needs to be.
/// A markdown table's header and alignment rows: `first` and `first_align`
/// for the leading columns, then a right-aligned column per tool.
fn table_head<'a>(
    first: &str,
    first_align: &str,
    tools: impl IntoIterator<Item = &'a String>,
) -> String {
    let tools: Vec<&String> = tools.into_iter().collect();
    let mut s = format!("| {first} |");
    for t in &tools {
        let _ = write!(s, " {t} |");
    }
    s.push('\n');
    s.push_str(first_align);
    for _ in &tools {
        s.push_str("---:|");
    }
    s.push('\n');
    s
}

/// A markdown table cell: a `|` would end it, a newline the row.
fn md(v: &str) -> String {
    v.replace('|', "\\|").replace('\n', " ")
}

fn field(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

/// summary.md: the suite and machine, the tool × scenario table of mean Mbit/s
/// (target marked), each dissemination scenario's receivers (what each had,
/// and how late), the sweeps' tables, every run, the tools' versions and what
/// the columns mean.
pub fn summary(r: &Results) -> String {
    let info = &r.suite.suite;
    let (all_scenarios, all_tools) = axes(r);
    // Dissemination scenarios have no throughput to compare (every tool is
    // fed at the same load): they get tables of their own.
    let (feeds, scenarios): (Vec<String>, Vec<String>) =
        all_scenarios.into_iter().partition(|sc| is_feed(r, sc));
    let tools: Vec<String> = all_tools
        .into_iter()
        .filter(|t| scenarios.iter().any(|sc| !runs_of(r, sc, t).is_empty()))
        .collect();
    let mut s = format!("# {}\n\n", info.name);
    if !info.description.is_empty() {
        let _ = writeln!(s, "{}\n", info.description);
    }
    if !info.cites.is_empty() {
        let _ = writeln!(s, "Replays: {}\n", info.cites);
    }
    let _ = writeln!(
        s,
        "Line rate {} bit/s{}{}. Machine: {} cores ({}), kernel {}; sender, receiver and emulator share them.\n",
        info.line_rate,
        info.target_mbps
            .map_or(String::new(), |t| format!("; target {t} Mbit/s (✓ met, ✗ not)")),
        info.cc
            .as_ref()
            .map_or(String::new(), |c| format!("; TCP tools use {c}")),
        r.machine.get("cores").map_or("?", |x| x),
        r.machine.get("cpu").map_or("?", |x| x),
        r.machine.get("kernel").map_or("?", |x| x),
    );
    if !r.profile_note.is_empty() {
        let _ = writeln!(s, "Scaled: {}.\n", r.profile_note);
    }
    if !scenarios.is_empty() {
        s.push_str(&throughput_table(r, &scenarios, &tools));
    }
    if info.measure == Metric::Seconds && !scenarios.is_empty() {
        let _ = writeln!(
            s,
            "\nSeconds to move the data set (the measure that separates the tools here; mean of the same runs):\n"
        );
        s.push_str(&table_head("scenario", "|---|", &tools));
        for sc in &scenarios {
            let _ = write!(s, "| {sc} |");
            for t in &tools {
                let runs = runs_of(r, sc, t);
                match cell_of(&runs, Metric::Seconds) {
                    _ if runs.is_empty() => s.push_str(" |"),
                    (Some(v), note) => {
                        let _ = write!(s, " {v:.2}{note} |");
                    }
                    (None, why) => {
                        let _ = write!(s, " {why} |");
                    }
                }
            }
            s.push('\n');
        }
    }
    for sc in &feeds {
        s.push_str(&feed_summary(r, sc));
    }
    let published: Vec<_> = r
        .suite
        .published
        .iter()
        .filter(|p| scenarios.contains(&p.scenario))
        .collect();
    if !published.is_empty() {
        let _ = writeln!(
            s,
            "\n## The study's figures beside this lab's\n\nRatio = this lab ÷ the study (mean of the measured runs; ⏱: a run stopped at its cap).\n\n| scenario | the study's series | study | source | replayed by | lab | ratio |\n|---|---|---:|---|---|---:|---:|"
        );
        for p in published {
            let lab = match &p.tool {
                None => "- | - | -".to_string(),
                Some(t) => match cell_of(&runs_of(r, &p.scenario, t), p.metric) {
                    (Some(v), note) => format!(
                        "{} | {}{} | {:.2}",
                        md(t),
                        metric_text(p.metric, v),
                        md(&note),
                        v / p.value
                    ),
                    (None, why) => format!("{} | {} | -", md(t), md(why.trim())),
                },
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {lab} |",
                p.scenario,
                md(&p.series),
                metric_text(p.metric, p.value),
                md(&p.source),
            );
        }
    }
    let data: Vec<(&String, &str)> = scenarios
        .iter()
        .chain(&feeds)
        .filter_map(|sc| {
            let x = r.runs.iter().find(|x| &x.scenario == sc)?;
            (!x.data.is_empty()).then_some((sc, x.data.as_str()))
        })
        .collect();
    if !data.is_empty() {
        let _ = writeln!(s, "\nData sets:\n");
        for (sc, d) in data {
            let _ = writeln!(s, "- {sc}: {d}");
        }
    }
    for (name, sw) in &r.suite.sweep {
        for m in &sw.metrics {
            let _ = write!(s, "{}", sweep_table(r, name, &sw.x, *m, &tools));
        }
    }
    if !scenarios.is_empty() {
        s.push_str(&every_run(r, &feeds));
    }
    let _ = writeln!(s, "\nTools:\n");
    for (t, v) in &r.versions {
        let _ = writeln!(s, "- {t}: {v}");
    }
    let _ = writeln!(
        s,
        "\nTTP = (payload bytes / the scenario's link rate, its receivers' down direction, the slowest if several; the suite's line rate only where the link sets none) / wall time; G = payload bytes delivered / bytes the server sent on the wire (both as in seed 003; with several receivers G counts one copy of the data, so multicast stays near 1 and unicast to two falls to about 0.5). First byte: seconds until a file at a receiver had its first byte on disk (longhaul writes a chunk of up to 1 MiB once all of it is in and hashed: on a slow link that comes long after its first data; its `--json` says when that came, `first_data_s`). To 90 %: seconds from the first data (the first 100 ms that carried 1 Mbit/s, or a tenth of a slower link) to the end of the first 100 ms that carried 90 % of the link (one receiver, no background traffic; divide by the RTT for round trips). At speed: the mean rate the emulator delivered to the receiver (IP bytes, retransmissions included; times G for payload) over the whole seconds from the first that delivered 90 % of the run's best second to the last that delivered half of it (start-up and tail left out). Queue: the standing queue at the bottleneck over those seconds, from the emulator: the least wait a packet met in each second, median (and largest). Share (beside background traffic): the tool's Mbit/s over the tool's and the background's together (fair beside N TCP flows: 1/(N+1)). Jain: Jain's fairness index over the tool's rate and each background TCP flow's (IP bytes the emulator delivered over the run; 1 when all got the same, 1/(N+1) when one took everything). Bg kept: the background's rate in the tool's first 10 round trips over its rate in the span before the tool started (10 round trips, at least 1 s; 1.0 = the start took nothing from a full link at first). CPU: user+system seconds of what the tool ran in the receivers (client) and in the server, children included{CPU_NOTE}"
    );
    s
}

/// summary.md's table of every run but those of the dissemination
/// scenarios `feeds` (which have tables of their own).
fn every_run(r: &Results, feeds: &[String]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n## Every run\n");
    if !feeds.is_empty() {
        let _ = writeln!(
            s,
            "Dissemination runs ({}) are in their own tables above.\n",
            feeds.join(", ")
        );
    }
    let _ = writeln!(
        s,
        "| scenario | tool | rep | status | files | MB | s | first byte s | to 90 % s | Mbit/s | TTP | G | share | Jain | bg kept | at speed, wire Mbit/s | queue ms (max) | client CPU s | server CPU s | emulator CPU s | machine CPU s | limit | verified | note |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"
    );
    for x in r.runs.iter().filter(|x| !feeds.contains(&x.scenario)) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.1} | {:.2} | {} | {} | {} | {:.3} | {:.3} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            x.scenario,
            x.tool,
            x.rep,
            x.status,
            x.files,
            x.bytes as f64 / 1e6,
            x.wall_s,
            x.ttfb_s.map_or("-".into(), |t| format!("{t:.2}")),
            x.to_90pct_s.map_or("-".into(), |t| format!("{t:.1}")),
            rate_text(x.mbps),
            x.ttp,
            x.goodput,
            share_text(x),
            jain_text(x),
            kept_text(x),
            x.steady_mbps.map_or("-".into(), rate_text),
            match (x.queue_ms, x.queue_max_ms) {
                (Some(q), Some(m)) => format!("{q:.1} ({m:.1})"),
                _ => "-".into(),
            },
            x.client_cpu_s,
            x.server_cpu_s,
            x.emulator_cpu_s,
            x.machine_cpu_s,
            if x.limit.is_empty() { "-" } else { &x.limit },
            x.verified.map_or("-", |v| if v { "yes" } else { "no" }),
            md(&x.note)
        );
    }
    s
}

/// summary.md's main table: a row per scenario (its link), a column per
/// tool, mean Mbit/s (target marked) or why there is none.
fn throughput_table(r: &Results, scenarios: &[String], tools: &[String]) -> String {
    let info = &r.suite.suite;
    let mut s = String::from(
        "Mbit/s per receiver (payload bytes × 8 / wall time; below 1 Mbit/s in kbit/s), mean of the runs that completed and verified; ⏱ = stopped at the time cap, the rate of what it had delivered by then:\n\n",
    );
    s.push_str(&table_head("scenario | link", "|---|---|", tools));
    for sc in scenarios {
        let (link, mtu) = r
            .runs
            .iter()
            .find(|x| &x.scenario == sc)
            .map_or(("", DEFAULT_MTU), |x| (x.link.as_str(), x.mtu));
        let _ = write!(s, "| {sc} | `{}`{} |", md(link), mtu_note(mtu));
        for t in tools {
            let runs = runs_of(r, sc, t);
            if runs.is_empty() {
                let _ = write!(s, " |");
                continue;
            }
            match cell(&runs) {
                (Some(m), note) => {
                    let mark = info
                        .target_mbps
                        .map_or("", |tg| if m >= tg { " ✓" } else { " ✗" });
                    let _ = write!(s, " {}{mark}{note} |", rate_text(m));
                }
                (None, why) => {
                    let _ = write!(s, " {why} |");
                }
            }
        }
        s.push('\n');
    }
    s
}

/// A dissemination scenario in summary.md: per run, the producer, the
/// sender and the machine; per run and receiver, which products it had and
/// how late.
fn feed_summary(r: &Results, sc: &str) -> String {
    let runs: Vec<&Run> = r.runs.iter().filter(|x| x.scenario == sc).collect();
    let link = runs.first().map_or("", |x| x.link.as_str());
    let mut s = format!(
        "\n## Dissemination: {sc}\n\nLinks `{}`. A producer wrote products into the sender's spool; each receiver was due every product ready once it had joined. Latency: seconds from ready at the sender to verified (by hash) at the receiver, of the due products it had. RSS: resident memory of the tool's processes, MB.\n\n",
        md(link)
    );
    s.push_str("| tool | rep | status | products | MB | producer s | load Mbit/s | s | sender CPU s | sender RSS MB first→max→last | receivers' CPU s | emulator CPU s | runner CPU s | machine CPU s | busiest 5 s, cores | note |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for x in &runs {
        let _ = write!(s, "| {} | {} | {} |", md(&x.tool), x.rep, x.status);
        for cell in feed_cells(x) {
            let _ = write!(s, " {cell} |");
        }
        let _ = writeln!(s, " {} |", md(&x.note));
    }
    s.push_str("\n| tool | rep | receiver | link | role | had/due | extra | duplicates | corrupt | latency p50 s | p99 s | max s | CPU s | RSS MB first→last |\n|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for x in &runs {
        for v in x.feed.iter().flat_map(|f| &f.receivers) {
            let _ =
                writeln!(
                s,
                "| {} | {} | {} | `{}` | {} | {}/{} | {} | {} | {} | {} | {} | {} | {:.2} | {} |",
                md(&x.tool),
                x.rep,
                md(&v.host),
                md(&v.link),
                if v.role.is_empty() { "-".into() } else { md(&v.role) },
                v.had,
                v.due,
                v.extra,
                v.duplicates,
                v.corrupt,
                latency_text(v.p50_s),
                latency_text(v.p99_s),
                latency_text(v.max_s),
                v.cpu_s,
                rss_text(&v.rss_kb, false),
            );
        }
    }
    s
}

/// A sweep as a table: a row per x, a column per tool.
fn sweep_table(r: &Results, name: &str, x_label: &str, metric: Metric, tools: &[String]) -> String {
    let mut xs: Vec<(f64, String)> = Vec::new();
    for x in r.runs.iter().filter(|x| x.sweep.as_deref() == Some(name)) {
        if let Some(v) = x.x {
            if !xs.iter().any(|(_, sc)| *sc == x.scenario) {
                xs.push((v, x.scenario.clone()));
            }
        }
    }
    if xs.is_empty() {
        return String::new();
    }
    xs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let cols: Vec<&String> = tools
        .iter()
        .filter(|t| xs.iter().any(|(_, sc)| !runs_of(r, sc, t).is_empty()))
        .collect();
    let mut s = format!(
        "\n## Sweep {name}: {} against {x_label}\n\n{}",
        metric.label(),
        table_head(x_label, "|---:|", cols.iter().copied())
    );
    for (v, sc) in &xs {
        let _ = write!(s, "| {v} |");
        for t in &cols {
            match cell_of(&runs_of(r, sc, t), metric) {
                (Some(m), note) if metric == Metric::Mbps => {
                    let _ = write!(s, " {}{note} |", rate_text(m));
                }
                (Some(m), note) if metric == Metric::Seconds => {
                    let _ = write!(s, " {m:.1}{note} |");
                }
                (Some(m), note) => {
                    let _ = write!(s, " {m:.4}{note} |");
                }
                (None, why) => {
                    let _ = write!(s, " {why} |");
                }
            }
        }
        s.push('\n');
    }
    s
}

/// The terminal's table: one line per tool and scenario.
pub fn table(r: &Results) -> String {
    let (scenarios, tools) = axes(r);
    let mut s = format!(
        "{:<24} {:<9} {:>11} {:>8} {:>7} {:>6} {:>6} {:>6} {:>8} {:>8}  {}\n",
        "SCENARIO",
        "TOOL",
        "Mbit/s",
        "s",
        "1st B s",
        "TTP",
        "G",
        "share",
        "CPU cli",
        "CPU srv",
        "STATUS"
    );
    for sc in &scenarios {
        for t in &tools {
            for x in r.runs.iter().filter(|x| &x.scenario == sc && &x.tool == t) {
                if let Some(f) = &x.feed {
                    // A dissemination run: its load, and what the receivers had.
                    let (had, due) = f
                        .receivers
                        .iter()
                        .fold((0, 0), |(h, d), v| (h + v.had, d + v.due));
                    let worst = f
                        .receivers
                        .iter()
                        .filter_map(|v| v.p99_s)
                        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
                    let _ = writeln!(
                        s,
                        "{:<24} {:<9} {:>11} {:>8.2} {:>7} {:>6} {:>6} {:>6} {:>8.2} {:>8.2}  {}: load, {} products; receivers had {had}/{due}, worst p99 {} s{}",
                        x.scenario,
                        x.tool,
                        rate_text(f.load_mbps),
                        x.wall_s,
                        "-",
                        "-",
                        "-",
                        "-",
                        x.client_cpu_s,
                        x.server_cpu_s,
                        x.status,
                        f.produced,
                        latency_text(worst),
                        if x.note.is_empty() {
                            String::new()
                        } else {
                            format!("; {}", x.note)
                        }
                    );
                    continue;
                }
                let _ = writeln!(
                    s,
                    "{:<24} {:<9} {:>11} {:>8.2} {:>7} {:>6.3} {:>6.3} {:>6} {:>8.2} {:>8.2}  {}{}",
                    x.scenario,
                    x.tool,
                    rate_text(x.mbps),
                    x.wall_s,
                    x.ttfb_s.map_or("-".into(), |t| format!("{t:.2}")),
                    x.ttp,
                    x.goodput,
                    share_text(x),
                    x.client_cpu_s,
                    x.server_cpu_s,
                    x.status,
                    if x.note.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", x.note)
                    }
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Run;
    use crate::scenario::Suite;

    fn run(sc: &str, tool: &str, status: &str, mbps: f64) -> Run {
        Run {
            scenario: sc.into(),
            tool: tool.into(),
            rep: 1,
            link: "delay=35ms".into(),
            mtu: DEFAULT_MTU,
            sweep: None,
            x: None,
            background: String::new(),
            background_mbps: None,
            background_flows_mbps: Vec::new(),
            jain: None,
            background_kept: None,
            background_lost: None,
            background_dropped: None,
            outage_dropped: None,
            receivers: 1,
            status: serde_json::from_value(serde_json::Value::from(status)).unwrap(),
            note: if status == "skipped" {
                "lftp not installed: apt-get install vsftpd lftp".into()
            } else {
                String::new()
            },
            data: format!("tree /srv/{sc}: 2 files, 1 symlinks, 1000000 bytes (1.0 MB)"),
            files: 2,
            bytes: 1_000_000,
            delivered_bytes: if status == "timeout" {
                500_000
            } else {
                1_000_000
            },
            wall_s: 8.0 / mbps.max(1e-9),
            mbps,
            ttp: 0.5,
            goodput: 0.97,
            wire_bytes: 1_030_000,
            wire_back_bytes: 31_000,
            ttfb_s: (status != "skipped").then_some(0.07),
            client_cpu_s: 0.1,
            server_cpu_s: 0.2,
            verified: (status != "skipped").then_some(status == "ok"),
            series_mbps: if status == "skipped" {
                vec![]
            } else {
                vec![mbps / 2.0, mbps, mbps]
            },
            background_series_mbps: vec![],
            receiver_series_mbps: vec![],
            receiver_done_s: vec![],
            to_90pct_s: None,
            steady_mbps: None,
            queue_ms: None,
            queue_max_ms: None,
            emulator_cpu_s: 0.0,
            machine_cpu_s: 0.0,
            limit: String::new(),
            feed: None,
        }
    }

    #[test]
    fn summary_marks_targets_and_says_why_a_cell_is_empty() {
        let suite = Suite::load("demo").unwrap();
        let mut suite = suite;
        suite.suite.target_mbps = Some(350.0);
        let r = Results {
            suite,
            profile: "quick".into(),
            profile_note: "profile quick: the suite as written".into(),
            started_unix: 0,
            machine: Default::default(),
            versions: [("rsync".to_string(), "rsync 3.2.7".to_string())].into(),
            line_rate_bps: 1_000_000_000,
            command: String::new(),
            runs: vec![
                run("a", "longhaul", "ok", 900.0),
                run("a", "rsync", "ok", 14.0),
                run("a", "ftp", "skipped", 0.0),
                run("b", "longhaul", "ok", 400.0),
                run("b", "longhaul", "unverified", 500.0),
                run("b", "rsync", "timeout", 3.0),
                run("b", "rsync", "timeout", 5.0),
            ],
        };
        let md = summary(&r);
        assert!(
            md.contains("| a | `delay=35ms` | 900.0 ✓ | 14.0 ✗ | skipped |"),
            "{md}"
        );
        assert!(
            md.contains("| b | `delay=35ms` | 400.0 ✓ (1 of 2 measured) | 4.0 ✗ ⏱ |"),
            "{md}"
        );
        assert!(md.contains("apt-get install vsftpd lftp"));
        assert!(md.contains("Scaled: profile quick"));
        assert!(
            md.contains("Data sets:\n\n- a: tree /srv/a: 2 files, 1 symlinks,"),
            "{md}"
        );
        let c = csv(&r);
        assert_eq!(c.lines().count(), 8);
        assert!(
            c.contains(",quick,a,ftp,1,delay=35ms,1,skipped,2,1000000,1000000,"),
            "{c}"
        );
        assert!(c.contains(",timeout,2,1000000,500000,"), "{c}");
        assert!(
            c.lines()
                .nth(1)
                .unwrap()
                .ends_with(",\"tree /srv/a: 2 files, 1 symlinks, 1000000 bytes (1.0 MB)\",1500"),
            "{c}"
        );
        let t = table(&r);
        assert!(t.lines().nth(1).unwrap().contains("longhaul"), "{t}");
        // The page: an overview, per scenario a bar chart with the target line
        // and a time series, and why a tool has no bar.
        let page = crate::html::render(&r);
        assert_eq!(page.matches("<svg").count(), page.matches("</svg>").count());
        assert_eq!(page.matches("<figure class=\"chart bars\"").count(), 2);
        assert_eq!(page.matches("<figure class=\"chart series\"").count(), 2);
        assert!(page.contains("dashed: the target, 350 Mbit/s"), "no target");
        assert_eq!(
            page.matches("<span class=\"target\"").count(),
            3 + 2,
            "a mark per row"
        );
        // 900 and 14 Mbit/s side by side: a log axis from 10 to 1000.
        let a = page.split("data-scenario=\"a\"").nth(1).unwrap();
        assert!(a.contains("(log scale)"), "no log axis");
        assert!(
            a.contains(">10</span>") && a.contains(">1000</span>"),
            "{a}"
        );
        assert!(a.contains("<span class=\"val\">900.0 Mbit/s</span>"), "{a}");
        assert!(page.contains("lftp not installed: apt-get install vsftpd lftp"));
        assert!(
            page.contains("<code>delay=35ms</code>; tree /srv/b: 2 files"),
            "{page}"
        );
        assert!(
            page.contains("<td class=\"ok\">900.0</td>")
                && page.contains("<td class=\"bad\">14.0</td>")
        );
        // The time axis ends at the longest run drawn: rsync's 0.57 s.
        let series = page.split("<figure class=\"chart series\"").nth(1).unwrap();
        assert!(series.contains(">0.5</text>"), "{series}");
        assert!(!series.contains(">0.6</text>"), "{series}");
    }

    #[test]
    fn a_dissemination_scenario_lists_each_receivers_products_and_latency() {
        let r = crate::html::tests::feed_results();
        let md = summary(&r);
        // Its own section: the sender's numbers per run ...
        let feed = md
            .split("\n## Dissemination: feed\n")
            .nth(1)
            .expect("a section");
        assert!(
            feed.contains("Links `rate=20M delay=30ms \\| rate=20M delay=30ms loss=1e-2`."),
            "{feed}"
        );
        assert!(
            feed.contains("| longhaul-mc | 1 | ok | 9253 | 925.3 | 60 | 123.4 | 65.00 | 3.20 | 10.2→51.2→41.0 | 3.00 | 0.70 | 1.50 | 9.00 | 1.25 |  |\n"),
            "{feed}"
        );
        assert!(
            feed.contains("| uftp | 1 | timeout | 9253 | 925.3 | 60 | 123.4 | 65.00 | 3.20 | 10.2→51.2→41.0 | 4.50 | 0.70 | 1.50 | 9.00 | 1.25 | cli2 had 7398 of 7400 due products |\n"),
            "{feed}"
        );
        assert!(
            feed.contains("| longhaul | 1 | skipped | - | - | - | - | - | - | - | - | - | - | - | - | not installed |\n"),
            "{feed}"
        );
        // ... and a row per tool and receiver: had/due, extra, duplicates,
        // corrupt, p50/p99/max, CPU, RSS.
        let rows: Vec<&str> = feed.lines().filter(|l| l.contains("| `rate=20M")).collect();
        assert_eq!(
            rows,
            [
                "| longhaul-mc | 1 | cli | `rate=20M delay=30ms` | - | 9253/9253 | 0 | 0 | 0 | 0.12 | 0.45 | 0.80 | 1.50 | 20.5→30.7 |",
                "| longhaul-mc | 1 | cli2 | `rate=20M delay=30ms loss=1e-2` | joined at 12 s & restarted | 7400/7400 | 3 | 3 | 0 | 0.20 | 0.90 | 1.40 | 1.50 | 20.5→30.7 |",
                "| uftp | 1 | cli | `rate=20M delay=30ms` | - | 9253/9253 | 0 | 0 | 0 | 0.50 | 0.95 | 1.00 | 2.00 | 20.5→30.7 |",
                "| uftp | 1 | cli2 | `rate=20M delay=30ms loss=1e-2` | joined at 12 s & restarted | 7398/7400 | 3 | 5 | 0 | 0.60 | 12.50 | 20.00 | 2.50 | 20.5→30.7 |",
            ]
        );
        // No latency: "-".
        let mut r2 = r.clone();
        let v = &mut r2.runs[1].feed.as_mut().unwrap().receivers[0];
        (v.had, v.p50_s, v.p99_s, v.max_s) = (0, None, None, None);
        v.rss_kb.clear();
        assert!(summary(&r2).contains("| longhaul-mc | 1 | cli | `rate=20M delay=30ms` | - | 0/9253 | 0 | 0 | 0 | - | - | - | 1.50 | - |"));
        // The throughput table and every run's table leave it out.
        assert!(
            md.contains(
                "| scenario | link | rsync |\n|---|---|---:|\n| a | `delay=35ms` | 14.0 ✗ |\n\n"
            ),
            "{md}"
        );
        assert!(!md.contains("| feed |"), "{md}");
        assert!(
            md.contains("| a | rsync | 1 | ok | 2 | 1.0 | 10.00 |"),
            "{md}"
        );
        assert!(md.contains("Dissemination runs (feed) are in their own tables above."));
        // The terminal's table: the load and what the receivers had.
        let t = table(&r);
        let line = |tool: &str| {
            t.lines()
                .find(|l| l.starts_with(&format!("{:<24} {tool} ", "feed")))
                .unwrap_or_else(|| panic!("{tool}: {t}"))
                .to_string()
        };
        assert!(
            line("longhaul-mc")
                .ends_with("ok: load, 9253 products; receivers had 16653/16653, worst p99 0.90 s"),
            "{t}"
        );
        assert!(line("uftp").contains("  123.4 "), "{t}");
        assert!(
            line("uftp").ends_with("timeout: load, 9253 products; receivers had 16651/16653, worst p99 12.50 s; cli2 had 7398 of 7400 due products"),
            "{t}"
        );
        assert!(line("longhaul").ends_with("skipped: not installed"), "{t}");
        // The CSV keeps its columns, a line per run.
        let c = csv(&r);
        assert_eq!(c.lines().count(), 5);
        assert!(c.contains(",quick,feed,uftp,1,rate=20M delay=30ms | rate=20M delay=30ms loss=1e-2,2,timeout,9253,925300000,"), "{c}");
    }

    #[test]
    fn the_studys_figures_stand_beside_the_measured_ones_with_their_ratio() {
        // seed 001 prints 2210 s for FTP over TCP, 100 x 1 MB at 3 % on path
        // A; a lab run stopped at a 300 s cap is at least 300 s.
        let suite = Suite::load("sctp-multifile").unwrap();
        let mut capped = run("A-100x1MB-loss03", "ftp", "timeout", 8.0 / 300.0);
        capped.wall_s = 300.0;
        let mut lh = run("A-100x1MB-loss03", "longhaul", "ok", 8.0 / 240.0);
        lh.wall_s = 240.0;
        let r = Results {
            suite,
            profile: "standard".into(),
            profile_note: String::new(),
            started_unix: 0,
            machine: Default::default(),
            versions: Default::default(),
            line_rate_bps: 1_000_000,
            command: String::new(),
            runs: vec![capped, lh],
        };
        let md = summary(&r);
        assert!(
            md.contains("| A-100x1MB-loss03 | FTP over TCP (New-Reno) | 2210 s | Fig. 6(e)"),
            "{md}"
        );
        assert!(md.contains("| ftp | 300 s ⏱ | 0.14 |"), "{md}");
        assert!(
            md.contains("| A-100x1MB-loss03 | 300.00 ⏱ | 240.00 |"),
            "{md}"
        );
        let page = crate::html::render(&r);
        let study = page.split("id=\"study\"").nth(1).unwrap();
        assert!(
            study.contains("<td>≥ 300 s †</td><td>≥ 0.14</td>"),
            "{study}"
        );
        // longhaul beside each of the three figures: 240 / 948 s.
        assert!(study.contains("<td>240 s</td><td>0.25</td>"), "{study}");
        // The bars are in seconds and carry the study's three figures.
        let bars = page.split("<figure class=\"chart bars\"").nth(1).unwrap();
        assert!(bars.starts_with(" data-scenario=\"A-100x1MB-loss03\"><figcaption>Seconds"));
        assert_eq!(
            bars.matches("<span class=\"name study\">study: ").count(),
            3
        );
    }

    #[test]
    fn a_sweep_is_a_table_and_a_line_per_tool() {
        let mut suite = Suite::load("demo").unwrap();
        suite.sweep.insert(
            "lat".into(),
            crate::scenario::Sweep {
                x: "one-way latency (ms)".into(),
                title: String::new(),
                log_x: false,
                metrics: vec![Metric::Mbps, Metric::Goodput],
            },
        );
        let at = |sc: &str, x: f64, tool: &str, mbps: f64| {
            let mut r = run(sc, tool, "ok", mbps);
            r.sweep = Some("lat".into());
            r.x = Some(x);
            r
        };
        let r = Results {
            suite,
            profile: "full".into(),
            profile_note: String::new(),
            started_unix: 0,
            machine: Default::default(),
            versions: Default::default(),
            line_rate_bps: 1_000_000_000,
            command: String::new(),
            runs: vec![
                // Run order is not x order.
                at("l50", 50.0, "gridftp:p=1", 60.0),
                at("l50", 50.0, "gridftp:p=8", 370.0),
                at("l1", 1.0, "gridftp:p=1", 915.0),
                at("l1", 1.0, "gridftp:p=8", 916.0),
                at("l10", 10.0, "gridftp:p=1", 286.0),
            ],
        };
        let md = summary(&r);
        assert!(md.contains("## Sweep lat: goodput G against one-way latency (ms)"));
        assert!(md.contains("| 1 | 0.9700 | 0.9700 |"), "{md}");
        let table = md
            .split("## Sweep lat: Mbit/s")
            .nth(1)
            .expect("a sweep table");
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(
            rows[0],
            "| one-way latency (ms) | gridftp:p=1 | gridftp:p=8 |"
        );
        assert_eq!(rows[1], "| 1 | 915.0 | 916.0 |");
        assert_eq!(rows[2], "| 10 | 286.0 | - |");
        assert_eq!(rows[3], "| 50 | 60.0 | 370.0 |");
        assert!(
            rows.len() < 8 || !rows[4].starts_with("| 1 "),
            "the Mbit/s table ends"
        );
        let page = crate::html::render(&r);
        let charts: Vec<&str> = page
            .split("<figure class=\"chart sweep\" data-scenario=\"lat\">")
            .skip(1)
            .map(|c| c.split("</figure>").next().unwrap())
            .collect();
        assert_eq!(charts.len(), 2, "a chart per metric");
        let chart = charts[0];
        assert_eq!(chart.matches("<polyline").count(), 2, "a line per tool");
        assert_eq!(
            chart.matches("<circle").count(),
            5,
            "a point per measured cell"
        );
        assert!(chart.contains("<span class=\"name\">gridftp:p=8</span>"));
        assert!(chart.contains("one-way latency (ms)"));
    }
}
