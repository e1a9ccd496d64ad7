//! Reports from saved results: results.csv, summary.md, and the table a
//! terminal shows. All of them are rendered from results.json alone, so
//! `lab report DIR` re-renders a run's reports.

use crate::runner::{Results, Run};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::Path;

/// Reads DIR/results.json.
pub fn load(dir: &Path) -> Result<Results> {
    let p = dir.join("results.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
}

/// Writes results.csv, summary.md and report.html beside results.json.
pub fn write_all(dir: &Path, r: &Results) -> Result<()> {
    std::fs::write(dir.join("results.csv"), csv(r))?;
    std::fs::write(dir.join("summary.md"), summary(r))?;
    std::fs::write(dir.join("report.html"), crate::html::render(r))?;
    Ok(())
}

pub fn csv(r: &Results) -> String {
    let mut s = String::from(
        "suite,scenario,tool,rep,link,status,files,bytes,wall_s,mbps,ttp,goodput,wire_bytes,client_cpu_s,server_cpu_s,verified,note\n",
    );
    for x in &r.runs {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{:.3},{:.2},{:.4},{:.4},{},{:.2},{:.2},{},{}",
            field(&r.suite.suite.name),
            field(&x.scenario),
            x.tool,
            x.rep,
            field(&x.link),
            x.status,
            x.files,
            x.bytes,
            x.wall_s,
            x.mbps,
            x.ttp,
            x.goodput,
            x.wire_bytes,
            x.client_cpu_s,
            x.server_cpu_s,
            x.verified.map_or("", |v| if v { "yes" } else { "no" }),
            field(&x.note)
        );
    }
    s
}

/// A CSV field, quoted when it needs to be.
fn field(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

/// Scenarios and tools in the order they first ran.
pub(crate) fn axes(r: &Results) -> (Vec<String>, Vec<String>) {
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
pub(crate) fn runs_of<'a>(r: &'a Results, scenario: &str, tool: &str) -> Vec<&'a Run> {
    r.runs
        .iter()
        .filter(|x| x.scenario == scenario && x.tool == tool)
        .collect()
}

/// The cell of one tool in one scenario: mean Mbit/s of its good runs, or why none.
pub fn cell(runs: &[&Run]) -> (Option<f64>, String) {
    let ok: Vec<&&Run> = runs.iter().filter(|x| x.status == "ok").collect();
    if ok.is_empty() {
        let why = runs.first().map_or("-".into(), |x| x.status.clone());
        return (None, why);
    }
    let mean = ok.iter().map(|x| x.mbps).sum::<f64>() / ok.len() as f64;
    let note = if ok.len() < runs.len() {
        format!(" ({} of {} ok)", ok.len(), runs.len())
    } else {
        String::new()
    };
    (Some(mean), note)
}

pub fn summary(r: &Results) -> String {
    let info = &r.suite.suite;
    let (scenarios, tools) = axes(r);
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
    let _ = writeln!(
        s,
        "Mbit/s (payload bytes × 8 / wall time), mean of the runs that completed and verified:\n"
    );
    let _ = write!(s, "| scenario | link |");
    for t in &tools {
        let _ = write!(s, " {t} |");
    }
    let _ = write!(s, "\n|---|---|");
    for _ in &tools {
        let _ = write!(s, "---:|");
    }
    s.push('\n');
    for sc in &scenarios {
        let link = r
            .runs
            .iter()
            .find(|x| &x.scenario == sc)
            .map_or("", |x| x.link.as_str());
        let _ = write!(s, "| {sc} | `{link}` |");
        for t in &tools {
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
                    let _ = write!(s, " {m:.1}{mark}{note} |");
                }
                (None, why) => {
                    let _ = write!(s, " {why} |");
                }
            }
        }
        s.push('\n');
    }
    let _ = writeln!(s, "\n## Every run\n");
    let _ = writeln!(
        s,
        "| scenario | tool | rep | status | files | MB | s | Mbit/s | TTP | G | client CPU s | server CPU s | verified | note |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    );
    for x in &r.runs {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.1} | {:.3} | {:.3} | {:.2} | {:.2} | {} | {} |",
            x.scenario,
            x.tool,
            x.rep,
            x.status,
            x.files,
            x.bytes as f64 / 1e6,
            x.wall_s,
            x.mbps,
            x.ttp,
            x.goodput,
            x.client_cpu_s,
            x.server_cpu_s,
            x.verified.map_or("-", |v| if v { "yes" } else { "no" }),
            x.note.replace('|', "/")
        );
    }
    let _ = writeln!(s, "\nTools:\n");
    for (t, v) in &r.versions {
        let _ = writeln!(s, "- {t}: {v}");
    }
    let _ = writeln!(
        s,
        "\nTTP = (payload bytes / line rate) / wall time; G = payload bytes / bytes the server sent on the wire (both as in seed 003). CPU: user+system seconds of the client command and of the server process with its children."
    );
    s
}

/// The terminal's table: one line per tool and scenario.
pub fn table(r: &Results) -> String {
    let (scenarios, tools) = axes(r);
    let mut s = format!(
        "{:<24} {:<9} {:>9} {:>8} {:>6} {:>6} {:>8} {:>8}  {}\n",
        "SCENARIO", "TOOL", "Mbit/s", "s", "TTP", "G", "CPU cli", "CPU srv", "STATUS"
    );
    for sc in &scenarios {
        for t in &tools {
            for x in r.runs.iter().filter(|x| &x.scenario == sc && &x.tool == t) {
                let _ = writeln!(
                    s,
                    "{:<24} {:<9} {:>9.1} {:>8.2} {:>6.3} {:>6.3} {:>8.2} {:>8.2}  {}{}",
                    x.scenario,
                    x.tool,
                    x.mbps,
                    x.wall_s,
                    x.ttp,
                    x.goodput,
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
    use crate::scenario::Suite;

    fn run(sc: &str, tool: &str, status: &str, mbps: f64) -> Run {
        Run {
            scenario: sc.into(),
            tool: tool.into(),
            rep: 1,
            link: "delay=35ms".into(),
            status: status.into(),
            note: if status == "skipped" {
                "lftp not installed: apt-get install vsftpd lftp".into()
            } else {
                String::new()
            },
            files: 2,
            bytes: 1_000_000,
            wall_s: 8.0 / mbps.max(1e-9),
            mbps,
            ttp: 0.5,
            goodput: 0.97,
            wire_bytes: 1_030_000,
            client_cpu_s: 0.1,
            server_cpu_s: 0.2,
            verified: (status != "skipped").then_some(status == "ok"),
            series_mbps: if status == "skipped" {
                vec![]
            } else {
                vec![mbps / 2.0, mbps, mbps]
            },
        }
    }

    #[test]
    fn summary_marks_targets_and_says_why_a_cell_is_empty() {
        let suite = Suite::parse(crate::scenario::BUILTIN[0].1).unwrap();
        let mut suite = suite;
        suite.suite.target_mbps = Some(350.0);
        let r = Results {
            suite,
            started_unix: 0,
            machine: Default::default(),
            versions: [("rsync".to_string(), "rsync 3.2.7".to_string())].into(),
            line_rate_bps: 1_000_000_000,
            runs: vec![
                run("a", "longhaul", "ok", 900.0),
                run("a", "rsync", "ok", 14.0),
                run("a", "ftp", "skipped", 0.0),
                run("b", "longhaul", "ok", 400.0),
                run("b", "longhaul", "unverified", 500.0),
            ],
        };
        let md = summary(&r);
        assert!(
            md.contains("| a | `delay=35ms` | 900.0 ✓ | 14.0 ✗ | skipped |"),
            "{md}"
        );
        assert!(
            md.contains("| b | `delay=35ms` | 400.0 ✓ (1 of 2 ok) |"),
            "{md}"
        );
        assert!(md.contains("apt-get install vsftpd lftp"));
        let c = csv(&r);
        assert_eq!(c.lines().count(), 6);
        assert!(c.contains(",a,ftp,1,delay=35ms,skipped,"));
        let t = table(&r);
        assert!(t.lines().nth(1).unwrap().contains("longhaul"), "{t}");
        // The page: an overview, per scenario a bar chart with the target line
        // and a time series, and why a tool has no bar.
        let page = crate::html::render(&r);
        assert_eq!(page.matches("<svg").count(), page.matches("</svg>").count());
        assert_eq!(page.matches("aria-label=\"Mbit/s per tool\"").count(), 2);
        assert_eq!(
            page.matches("aria-label=\"throughput over time\"").count(),
            2
        );
        assert!(page.contains("target 350"), "no target line");
        assert!(page.contains("lftp not installed: apt-get install vsftpd lftp"));
        assert!(
            page.contains("<td class=\"ok\">900.0</td>")
                && page.contains("<td class=\"bad\">14.0</td>")
        );
    }
}
