//! The HTML report as a browser draws it: reports of every built-in suite
//! (synthetic runs over each suite's quick-profile scenarios, with failures,
//! time caps, several receivers and a tool name far longer than any real one)
//! and of recorded lab runs (docs/results, which README's tables read) are opened in headless Chromium
//! at a desktop and a phone width; a script measures the laid-out page
//! (layout-check.js) and the test asserts that no text of any chart leaves
//! its chart or overlaps another, that every tool with a time series is in
//! that chart's legend and every tool with runs has a bar, and that each time
//! axis ends within 20 % of the longest run it draws.
//!
//! Needs Debian's `chromium` (or LONGHAUL_CHROMIUM=PATH); without it the test
//! says so and passes, unless LONGHAUL_REQUIRE_BROWSER=1 (CI sets it).
//! LONGHAUL_REPORT_DIR=DIR keeps the rendered pages there.

use longhaul_bench::report;
use longhaul_bench::results::{Results, Run, Status};
use longhaul_bench::scenario::{Data, Suite, BUILTIN};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const CHECK: &str = include_str!("layout-check.js");
const LONG_TOOL: &str =
    "a-peer-tool-with-an-unusually-long-name:parallel=16,window=8MiB,verify=yes";

/// A small deterministic generator (xorshift), so that every run of the
/// test draws the same pages.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A 100 ms series of a transfer at `mbps` that ramps up over `ramp_s` and
/// lasts `secs`.
fn series(rng: &mut Rng, mbps: f64, ramp_s: f64, secs: f64) -> Vec<f64> {
    let n = (secs / 0.1).ceil().max(1.0) as usize;
    (0..n)
        .map(|k| {
            let t = k as f64 * 0.1;
            let ramp = (t / ramp_s.max(0.1)).min(1.0);
            mbps * ramp * (0.7 + 0.6 * rng.next())
        })
        .collect()
}

/// Synthetic results of `suite`'s quick profile: every tool of every
/// scenario, one to two runs each, plus the long-named tool in every third
/// scenario; some runs fail, some reach the time cap.
fn synthetic(name: &str) -> Results {
    let suite = Suite::load(name).unwrap();
    let line = suite.line_rate_bps();
    let plans = suite.plans_for("quick").unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
    let mut runs = Vec::new();
    for (i, p) in plans.iter().enumerate() {
        let mut labels: Vec<String> = p.tools.iter().map(|t| t.label.clone()).collect();
        if i % 3 == 0 {
            labels.push(LONG_TOOL.into());
        }
        let (files, bytes) = match &p.data {
            Data::Files(g) => (
                g.iter().map(|x| x.1).sum::<u64>(),
                g.iter().map(|x| x.0 * x.1).sum::<u64>(),
            ),
            Data::Tree(_) => (5_000, 300_000_000),
            Data::Feed(f) => (
                10_000,
                (f.load_bps as f64 / 8.0 * f.seconds.as_secs_f64()) as u64,
            ),
        };
        let rate = p.ttp_rate_bps(line) as f64 / 1e6;
        let rtt = p.max_rtt().as_secs_f64();
        let cap = p.time_cap.as_secs_f64();
        let n = p.links.len();
        for (k, tool) in labels.iter().enumerate() {
            for rep in 1..=p.repeat.clamp(1, 2) {
                let eff = 0.02 + 0.93 * rng.next();
                let mut wall = bytes as f64 * 8.0 / (rate * 1e6 * eff) + 3.0 * rtt;
                let mut status = Status::Ok;
                if (i + k) % 11 == 5 {
                    status = Status::Failed;
                    wall = wall.min(cap) * rng.next();
                } else if wall > cap {
                    status = Status::Timeout;
                    wall = cap;
                }
                let mbps = if status == Status::Failed {
                    0.0
                } else {
                    (bytes as f64 * 8.0 / wall / 1e6).min(rate * eff)
                };
                let each: Vec<Vec<f64>> = (0..n)
                    .map(|_| series(&mut rng, rate * eff, 10.0 * rtt, wall))
                    .collect();
                let mean: Vec<f64> = (0..each[0].len())
                    .map(|j| each.iter().map(|s| s[j]).sum::<f64>() / n as f64)
                    .collect();
                runs.push(Run {
                    scenario: p.name.clone(),
                    tool: tool.clone(),
                    rep,
                    link: p.link_line(),
                    mtu: p.mtu,
                    sweep: p.sweep.as_ref().map(|s| s.0.clone()),
                    x: p.sweep.as_ref().map(|s| s.1),
                    background: String::new(),
                    background_mbps: p.background.as_ref().map(|_| rate * (1.0 - eff)),
                    background_flows_mbps: Vec::new(),
                    jain: p.background.as_ref().map(|_| 0.5 + eff / 2.0),
                    background_kept: p.background.as_ref().map(|_| eff),
                    background_lost: p.background.as_ref().map(|_| 0.01),
                    background_dropped: p.background.as_ref().map(|_| 1234),
                    outage_dropped: None,
                    receivers: n as u32,
                    status,
                    note: if status == Status::Failed {
                        "exit 1: connection reset by peer after a long and winding explanation of what went wrong".into()
                    } else {
                        String::new()
                    },
                    data: p.data.line(),
                    files,
                    bytes,
                    delivered_bytes: bytes,
                    wall_s: wall,
                    mbps,
                    ttp: eff,
                    goodput: 0.5 + 0.5 * rng.next(),
                    wire_bytes: bytes,
                    wire_back_bytes: bytes / 30,
                    ttfb_s: Some(2.0 * rtt),
                    client_cpu_s: wall * 0.3,
                    server_cpu_s: wall * 0.2,
                    verified: Some(status == Status::Ok),
                    series_mbps: mean,
                    background_series_mbps: if p.background.is_some() {
                        series(&mut rng, rate * (1.0 - eff), 0.1, wall)
                    } else {
                        vec![]
                    },
                    receiver_series_mbps: if n > 1 { each } else { vec![] },
                    receiver_done_s: if n > 1 {
                        (0..n).map(|r| (r + 1 < n).then_some(wall * (0.5 + r as f64 * 0.2))).collect()
                    } else {
                        vec![]
                    },
                    to_90pct_s: Some(10.0 * rtt + 0.1),
                    steady_mbps: None,
                    queue_ms: None,
                    queue_max_ms: None,
                    emulator_cpu_s: 0.0,
                    machine_cpu_s: 0.0,
                    limit: String::new(),
                    feed: None,
                });
            }
        }
    }
    Results {
        suite,
        profile: "quick".into(),
        profile_note: "synthetic runs for the layout test".into(),
        started_unix: 0,
        machine: BTreeMap::from([
            ("cores".into(), "2".into()),
            ("cpu".into(), "test".into()),
            ("kernel".into(), "test".into()),
        ]),
        versions: BTreeMap::new(),
        line_rate_bps: line,
        command: String::new(),
        runs,
    }
}

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LONGHAUL_CHROMIUM") {
        return Some(p.into());
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// The page as Chromium lays it out at `width` px: the check script's JSON.
fn layout(browser: &Path, html: &Path, width: u32, profile: &Path) -> serde_json::Value {
    let child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={width},900"))
        .arg("--dump-dom")
        .arg(format!("file://{}", html.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start chromium");
    // A hung browser must not hang the test suite: killed after 120 s.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .is_err()
        {
            // SAFETY: kill(2) on the PID of our own child, which has not
            // been waited for (wait_with_output is still blocked on it).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().expect("chromium's output");
    let _ = tx.send(());
    watchdog.join().unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let json = dom
        .split("<pre id=\"layout-check\">")
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .unwrap_or_else(|| {
            panic!(
                "no layout check in the page from {} (exit {:?}): {}",
                html.display(),
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&json).expect("the check's JSON")
}

/// A JSON array of strings from the check.
fn strings(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_str().expect("a string"))
        .collect()
}

/// Renders `r`, opens it at two widths and checks what was drawn; returns
/// the number of charts checked.
fn check(name: &str, r: &Results, browser: &Path, dir: &Path) -> usize {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    report::write_all(&d, r).unwrap();
    let page = std::fs::read_to_string(d.join("report.html")).unwrap();
    let page = page.replace("</body>", &format!("<script>{CHECK}</script></body>"));
    let html = d.join("checked.html");
    std::fs::write(&html, page).unwrap();
    // What the charts must show, from the results.
    let mut with_series: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut longest: BTreeMap<&str, f64> = BTreeMap::new();
    let mut with_runs: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    // Per sweep, the tools with a measured point.
    let mut in_sweep: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for x in &r.runs {
        let tools = with_runs.entry(&x.scenario).or_default();
        if !tools.contains(&x.tool.as_str()) {
            tools.push(&x.tool);
        }
        // The chart draws each tool's first run with a series, to the end
        // of the longest of them.
        let drawn = with_series.entry(&x.scenario).or_default();
        if !x.series_mbps.is_empty() && !drawn.contains(&x.tool.as_str()) {
            drawn.push(&x.tool);
            let l = longest.entry(&x.scenario).or_default();
            *l = l.max(x.wall_s);
        }
        if let (Some(sw), true) = (&x.sweep, x.status.measured()) {
            let tools = in_sweep.entry(sw).or_default();
            if !tools.contains(&x.tool.as_str()) {
                tools.push(&x.tool);
            }
        }
    }
    // A dissemination scenario: a latency chart and a distribution per
    // receiver, each with every tool that had products there.
    let mut feeds: BTreeMap<&str, (usize, Vec<&str>)> = BTreeMap::new();
    for x in &r.runs {
        if let Some(f) = &x.feed {
            let e = feeds.entry(&x.scenario).or_default();
            e.0 = e.0.max(f.receivers.len());
            if f.receivers.iter().any(|v| !v.latency_by_second.is_empty())
                && !e.1.contains(&x.tool.as_str())
            {
                e.1.push(&x.tool);
            }
        }
    }
    let measure = r.suite.suite.measure;
    let mut charts = 0;
    for width in [1280, 420] {
        let got = layout(browser, &html, width, &dir.join("chromium-profile"));
        let figures = got["figures"].as_array().expect("figures");
        assert!(!figures.is_empty(), "{name}: no chart at all");
        let mut problems = Vec::new();
        let mut series_seen = 0;
        let mut studies = 0;
        let mut feed_charts: BTreeMap<(&str, String), usize> = BTreeMap::new();
        for f in figures {
            let kind = f["kind"].as_str().unwrap();
            let sc = f["scenario"].as_str().unwrap();
            for p in f["problems"].as_array().unwrap() {
                problems.push(format!("{name} at {width} px, {kind} chart of {sc}: {p}"));
            }
            let legend = strings(&f["legend"]);
            match kind {
                "latency" | "distribution" => {
                    *feed_charts.entry((sc, kind.to_string())).or_default() += 1;
                    // (A receiver no tool delivered to has a note, not a chart.)
                    assert!(
                        feeds[sc]
                            .1
                            .iter()
                            .any(|t| legend.iter().any(|l| l.starts_with(t))),
                        "{name}: a {kind} chart of {sc} names no tool: {legend:?}"
                    );
                }
                "series" => {
                    series_seen += 1;
                    for tool in &with_series[sc] {
                        assert!(
                            legend
                                .iter()
                                .any(|l| l == tool || l.starts_with(&format!("{tool}, "))),
                            "{name}: {tool} has a series in {sc} but not in its legend {legend:?}"
                        );
                    }
                    let end = f["x_end"].as_f64().expect("a time axis");
                    let long = longest[sc];
                    assert!(
                        end >= long * 0.999 && end <= long * 1.2 + 0.01,
                        "{name}: the time axis of {sc} ends at {end:.2} s, its longest run is {long:.2} s"
                    );
                }
                "startup" => {
                    let end = f["x_end"].as_f64().expect("a time axis");
                    assert!(
                        end > 0.0 && end <= longest[sc] * 0.5 + 1e-6,
                        "{name}: the start-up chart of {sc} shows {end:.2} s of a {:.2} s run",
                        longest[sc]
                    );
                }
                "bars" => {
                    let bars = strings(&f["bars"]);
                    for tool in &with_runs[sc] {
                        assert!(
                            bars.contains(tool),
                            "{name}: {tool} ran {sc} but has no bar: {bars:?}"
                        );
                    }
                    // The study's figures in the suite's measure are drawn too.
                    for p in r
                        .suite
                        .published
                        .iter()
                        .filter(|p| p.scenario == sc && p.metric == measure)
                    {
                        let want = format!("study: {}", p.series);
                        assert!(
                            bars.contains(&want.as_str()),
                            "{name}: no bar for the study's {want} in {sc}: {bars:?}"
                        );
                    }
                    studies += bars.iter().filter(|b| b.starts_with("study: ")).count();
                }
                "sweep" => {
                    for tool in in_sweep.get(sc).into_iter().flatten() {
                        assert!(
                            legend.contains(tool),
                            "{name}: {tool} has points in sweep {sc} but is not in its legend {legend:?}"
                        );
                    }
                    assert!(
                        f["lines"].as_u64().unwrap() > 0,
                        "{name}: sweep {sc} draws nothing"
                    );
                }
                _ => {}
            }
        }
        for (sc, (n, _)) in &feeds {
            for kind in ["latency", "distribution"] {
                assert_eq!(
                    feed_charts
                        .get(&(*sc, kind.to_string()))
                        .copied()
                        .unwrap_or(0),
                    *n,
                    "{name}: {kind} charts of {sc}, one per receiver"
                );
            }
        }
        assert_eq!(
            series_seen,
            with_series.values().filter(|v| !v.is_empty()).count(),
            "{name}: a series chart per scenario with series"
        );
        assert!(
            problems.is_empty(),
            "{} layout problems, the first ones:\n{}",
            problems.len(),
            problems[..problems.len().min(12)].join("\n")
        );
        let expected_studies = r
            .suite
            .published
            .iter()
            .filter(|p| p.metric == measure && with_runs.contains_key(p.scenario.as_str()))
            .count();
        assert_eq!(studies, expected_studies, "{name}: the study's bars");
        charts += figures.len();
    }
    charts
}

#[test]
fn every_suites_report_lays_out_cleanly_in_chromium() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("LONGHAUL_REQUIRE_BROWSER").is_none(),
            "LONGHAUL_REQUIRE_BROWSER is set and chromium is not installed (apt-get install chromium)"
        );
        eprintln!("skipped: no chromium (apt-get install chromium, or set LONGHAUL_CHROMIUM)");
        return;
    };
    // LONGHAUL_REPORT_DIR=DIR keeps the pages to look at.
    let tmp = tempfile::tempdir().unwrap();
    let dir =
        std::env::var_os("LONGHAUL_REPORT_DIR").map_or(tmp.path().to_path_buf(), PathBuf::from);
    let mut checked = Vec::new();
    for (name, _) in BUILTIN {
        let r = synthetic(name);
        checked.push((name.to_string(), check(name, &r, &browser, &dir)));
    }
    // Every run README's tables are made from (docs/results).
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/results");
    for e in std::fs::read_dir(&fixtures).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && p.join("results.json").exists() {
            let r = report::load(&p).unwrap();
            let name = format!("recorded-{}", p.file_name().unwrap().to_string_lossy());
            let n = check(&name, &r, &browser, &dir);
            checked.push((name, n));
        }
    }
    eprintln!("charts checked: {checked:?}");
    assert!(
        checked.iter().any(|(n, _)| n.starts_with("recorded-")),
        "no recorded results in {}",
        fixtures.display()
    );
}
