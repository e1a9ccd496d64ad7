//! Runs a suite: for each scenario, a lab with the scenario's link, the data
//! set generated once, then every tool in turn — server started in `srv`,
//! client run in `cli`, timed, its CPU counted, stopped by PID, the delivered
//! tree verified by hash — and every number saved as it is measured. One
//! tool's run over a data set, phase by phase, is `transfer`'s; a
//! dissemination scenario's, `feed`'s.

use crate::dataset::{self, DataSet};
use crate::host::{machine, mount_tmpfs, set_cc, set_tcp_max};
pub use crate::live::clean_up;
use crate::live::live;
use crate::results::{Results, Run, Status};
use crate::scenario::{Data, Feed, Plan, Storage, Suite};
use crate::stage::unmount;
use crate::tools::{Tool, ToolSpec};
use anyhow::{bail, Context, Result};
use longhaul_lab::ops;
use longhaul_lab::topology::{LabConfig, LinkArgs};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod transfer;

/// How [`run_suite`] runs a suite (from `longhaul lab run`).
pub struct Options {
    /// The longhaul executable: it brings the lab up, and longhaul's adapters run it.
    pub exe: PathBuf,
    /// Output directory: results.json (rewritten after every run), the data sets
    /// (`data/`), the receivers' destinations (`work/`) and each run's files and logs
    /// (`runs/`).
    pub out: PathBuf,
    /// quick, standard or full.
    pub profile: String,
    /// Only these tools (of each scenario's list): a name takes every
    /// variant of the tool, a label (`gridftp:p=8`) just that one.
    pub tools: Option<Vec<String>>,
    /// Runs per tool, over every scenario's and the profile's `repeat`; None keeps
    /// them.
    pub repeat: Option<u32>,
    /// Print one line per run on stderr.
    pub progress: bool,
    /// The lab's name ([`DEFAULT_LAB`] unless two runs go at once).
    pub lab: String,
    /// The command line that reproduces the run (without --out, --lab and
    /// --json), kept in results.json for `lab table`; empty if unknown.
    pub command: String,
}

/// The lab a run brings up, unless told another name.
pub const DEFAULT_LAB: &str = "lhrun";
const SERVER: &str = "srv";

/// The receivers' host names: cli, cli2, cli3, ...
fn receiver_name(i: usize) -> String {
    if i == 0 {
        "cli".into()
    } else {
        format!("cli{}", i + 1)
    }
}

/// What `profile` does to `suite`, in a sentence for reports.
pub fn profile_note(suite: &Suite, profile: &str) -> Result<String> {
    let trees = suite.scenarios.iter().any(|s| s.tree.is_some());
    Ok(match suite.profile_of(profile)? {
        None => format!("profile {profile}: the suite as written"),
        Some(p) => format!(
            "profile {profile}: {:.3}× the data of each file group (fewer files of the same size; a single file made smaller{}), time caps ×{:.3}{}{}",
            p.data_scale,
            if trees {
                "; a tree scenario's directory is used as it is"
            } else {
                ""
            },
            p.time_scale,
            p.repeat.map_or(String::new(), |r| format!(", {r} repetition(s)")),
            if p.description.is_empty() {
                String::new()
            } else {
                format!(". {}", p.description)
            }
        ),
    })
}

/// Runs every scenario of `suite`; results are saved in `opts.out` after each run.
pub fn run_suite(suite: &Suite, opts: &Options) -> Result<Results> {
    ops::require_root()?;
    // Before anything is staged or mounted under the lab's name.
    longhaul_lab::topology::check_lab_name(&opts.lab)?;
    if !matches!(ops::status(&opts.lab), ops::Status::Absent) {
        bail!("a lab named '{}' is up: another `lab run`? (`longhaul lab down --name {}` removes it; `lab run --lab NAME` runs beside it)", opts.lab, opts.lab);
    }
    let plans = suite.plans_for(&opts.profile)?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let out = std::fs::canonicalize(&opts.out)?;
    // A tree that is missing stops the run before its first scenario.
    for plan in &plans {
        if let Data::Tree(dir) = &plan.data {
            dataset::check_tree(dir, &out).with_context(|| format!("scenario '{}'", plan.name))?;
        }
    }
    let mut results = Results {
        suite: suite.clone(),
        profile: opts.profile.clone(),
        profile_note: profile_note(suite, &opts.profile)?,
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        machine: machine(),
        versions: BTreeMap::new(),
        line_rate_bps: suite.line_rate_bps(),
        command: opts.command.clone(),
        runs: Vec::new(),
    };
    let result = (|| -> Result<()> {
        // The tools work beneath a staged copy of --out's directories
        // (see `stage`); results go to --out itself.
        live().stage = Some(crate::stage::root_of(&opts.lab));
        let root = crate::stage::stage(&opts.lab, &out)?;
        for plan in &plans {
            run_plan(plan, opts, &root, &out, &mut results)?;
        }
        Ok(())
    })();
    clean_up();
    result?;
    Ok(results)
}

/// Runs one scenario: its data set, its lab, then every chosen tool as
/// many times as asked, each run saved in `results_dir` as it ends. The
/// tools' files are beneath `out` (the staged directories).
fn run_plan(
    plan: &Plan,
    opts: &Options,
    out: &Path,
    results_dir: &Path,
    results: &mut Results,
) -> Result<()> {
    let tools = chosen_tools(plan, opts);
    if tools.is_empty() {
        return Ok(());
    }
    if opts.progress {
        eprintln!(
            "scenario {}: link '{}'{}, {}{}",
            plan.name,
            plan.link_line(),
            plan.mtu_note(),
            plan.data.line(),
            if plan.links.len() > 1 {
                format!(", {} receivers", plan.links.len())
            } else {
                String::new()
            }
        );
    }
    let data = prepare_data(plan, opts, out)?;
    let cfg = bring_up_lab(plan, opts, out, data.as_ref())?;
    for tool in tools {
        let reps = opts.repeat.unwrap_or(plan.repeat);
        for rep in 1..=reps {
            let run = match (&data, &plan.data) {
                (Some(data), _) => {
                    transfer::run_tool(tool, rep, plan, data, opts, out, &cfg, results)?
                }
                (None, Data::Feed(f)) => run_feed(tool, rep, plan, f, opts, out, &cfg, results)?,
                (None, _) => unreachable!("a data set for every scenario but a feed"),
            };
            if opts.progress {
                eprintln!(
                    "  {:<9} {:>8.1} Mbit/s {:>7.2} s  {}{}",
                    run.tool,
                    run.mbps,
                    run.wall_s,
                    run.status,
                    if run.note.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", run.note)
                    }
                );
            }
            results.runs.push(run);
            save_json(results_dir, results)?;
        }
    }
    tear_down_lab(&opts.lab);
    Ok(())
}

/// The scenario's tools that `opts` keeps.
fn chosen_tools<'a>(plan: &'a Plan, opts: &Options) -> Vec<&'a ToolSpec> {
    plan.tools
        .iter()
        .filter(|t| {
            opts.tools
                .as_ref()
                .is_none_or(|only| only.iter().any(|o| o == t.tool.name() || *o == t.label))
        })
        .collect()
}

/// The scenario's data set: generated (once) or a tree of its own; None
/// for a feed, whose products are made as it runs.
fn prepare_data(plan: &Plan, opts: &Options, out: &Path) -> Result<Option<DataSet>> {
    Ok(match &plan.data {
        Data::Files(groups) => Some(dataset::prepare(&out.join("data"), groups)?),
        Data::Tree(dir) => {
            let data =
                dataset::existing(dir, out).with_context(|| format!("scenario '{}'", plan.name))?;
            if opts.progress {
                eprintln!("  {}", data.describe());
            }
            Some(data)
        }
        Data::Feed(_) => None,
    })
}

/// Brings the scenario's lab up (the server and a host per receiver link),
/// with the receivers' tmpfs and the scenario's host settings.
fn bring_up_lab(
    plan: &Plan,
    opts: &Options,
    out: &Path,
    data: Option<&DataSet>,
) -> Result<LabConfig> {
    let mut hosts = vec![SERVER.to_string()];
    let per_host: Vec<String> = plan
        .links
        .iter()
        .enumerate()
        .map(|(i, l)| {
            hosts.push(receiver_name(i));
            format!("{}={l}", receiver_name(i))
        })
        .collect();
    let lab = opts.lab.as_str();
    let mut cfg = LabConfig::new(
        lab,
        &hosts,
        LinkArgs {
            default: None,
            per_host: &per_host,
            sites: &[],
        },
        0x6c68,
        plan.mtu,
    )?;
    // Outages and rate steps are timed from each tool's start (see
    // `transfer::run_tool`), not from the lab's: held until then, and in
    // between.
    cfg.schedule_held = true;
    if !matches!(ops::status(lab), ops::Status::Absent) {
        bail!("a lab named '{lab}' is up: another `lab run`? (`longhaul lab down --name {lab}` removes it; `lab run --lab NAME` runs beside it)");
    }
    let work = out.join("work");
    match (data, &plan.data) {
        // The spool and the products in flight.
        (_, Data::Feed(f)) => mount_tmpfs(&work, crate::feed::tmpfs_bytes(f, plan.links.len()))?,
        (Some(data), _) if plan.dest == Storage::Tmpfs => {
            // Room for every receiver's copy, and some.
            let size = data.bytes * plan.links.len() as u64 + data.bytes / 10 + (64 << 20);
            mount_tmpfs(&work, size)?;
        }
        _ => {}
    }
    live().lab = Some(lab.into());
    ops::up(&cfg, &opts.exe)?;
    if let Some(cc) = &plan.cc {
        set_cc(&cfg, cc)?;
    }
    if let Some(max) = plan.tcp_max {
        set_tcp_max(&cfg, max)?;
    }
    Ok(cfg)
}

/// Runs `spec` once in a dissemination scenario (see [`crate::feed`]).
#[allow(clippy::too_many_arguments)]
fn run_feed(
    spec: &ToolSpec,
    rep: u32,
    plan: &Plan,
    feed: &Feed,
    opts: &Options,
    out: &Path,
    cfg: &LabConfig,
    results: &mut Results,
) -> Result<Run> {
    let run = new_run(spec, rep, plan, plan.data.line());
    if let Some(skip) = unavailable(spec.tool, &opts.exe, results) {
        return Ok(Run { note: skip, ..run });
    }
    let mut run = crate::feed::run_tool(
        spec,
        rep,
        plan,
        feed,
        &opts.exe,
        out,
        cfg,
        run,
        results.line_rate_bps,
        &receiver_name,
    )?;
    set_limit(&mut run, results);
    Ok(run)
}

/// Labels what limited `run` (see [`crate::results::limit`]).
fn set_limit(run: &mut Run, results: &Results) {
    let cores = results.machine.get("cores").and_then(|c| c.parse().ok());
    run.limit = crate::results::limit(run, cores.unwrap_or(0));
}

/// Removes the scenario's lab, the receivers' tmpfs and the host settings
/// it raised.
fn tear_down_lab(lab: &str) {
    ops::teardown(lab);
    live().lab = None;
    let mut l = live();
    if let Some(m) = l.mount.take() {
        unmount(&m);
    }
    for (f, old) in l.core_restore.drain(..).rev() {
        let _ = std::fs::write(f, old.to_string());
    }
}

/// A run not yet run: skipped until it measures.
fn new_run(spec: &ToolSpec, rep: u32, plan: &Plan, data: String) -> Run {
    let n = plan.links.len();
    Run {
        scenario: plan.name.clone(),
        tool: spec.label.clone(),
        rep,
        link: plan.link_line(),
        mtu: plan.mtu,
        sweep: plan.sweep.as_ref().map(|s| s.0.clone()),
        x: plan.sweep.as_ref().map(|s| s.1),
        background: plan
            .background
            .as_ref()
            .map_or(String::new(), |b| b.describe()),
        background_mbps: None,
        background_flows_mbps: Vec::new(),
        jain: None,
        background_kept: None,
        background_lost: None,
        background_dropped: None,
        outage_dropped: None,
        receivers: n as u32,
        status: Status::Skipped,
        note: String::new(),
        data,
        files: 0,
        bytes: 0,
        delivered_bytes: 0,
        wall_s: 0.0,
        mbps: 0.0,
        ttp: 0.0,
        goodput: 0.0,
        wire_bytes: 0,
        wire_back_bytes: 0,
        ttfb_s: None,
        client_cpu_s: 0.0,
        server_cpu_s: 0.0,
        verified: None,
        series_mbps: Vec::new(),
        background_series_mbps: Vec::new(),
        receiver_series_mbps: Vec::new(),
        receiver_done_s: Vec::new(),
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

/// Why `tool` cannot run here (a program missing, or a build of one that
/// failed), or None; notes its version the first time.
fn unavailable(tool: Tool, exe: &Path, results: &mut Results) -> Option<String> {
    // Programs Debian ships as source are built on first use.
    if let Err(e) = tool.build_missing() {
        return Some(format!("{e:#}"));
    }
    let missing = tool.missing();
    if !missing.is_empty() {
        return Some(format!(
            "{} not installed: {}",
            missing.join(", "),
            tool.install_hint()
        ));
    }
    results
        .versions
        .entry(tool.name().into())
        .or_insert_with(|| version(tool, exe));
    None
}

fn version(tool: Tool, exe: &Path) -> String {
    let argv = tool.version_command();
    let out = if argv.is_empty() {
        Command::new(exe).arg("--version").output()
    } else {
        // Programs the lab built are found where `which` looks.
        let prog = crate::tools::which(argv[0]).unwrap_or_else(|| argv[0].into());
        Command::new(prog).args(&argv[1..]).output()
    };
    out.ok()
        .map(|o| {
            let s = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&s)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// Writes results.json (through a temporary file, so it is never half written).
pub fn save_json(out: &Path, results: &Results) -> Result<()> {
    let tmp = out.join(".results.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(results)?)?;
    std::fs::rename(&tmp, out.join("results.json"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{goodput, interpolate, steady, to_90pct, ttp};
    #[test]
    fn steady_leaves_out_the_start_and_the_tail_and_reads_the_least_wait_of_each_second() {
        // 1 s at 100, 3 s at 900 (a dip to 850), 1 s at 950, then 1 s at 100
        // and 0.5 s of nothing: steady is seconds 1-4.
        let mut series = vec![100.0; 10];
        series.extend([900.0; 10]);
        series.extend([850.0; 10]);
        series.extend([900.0; 10]);
        series.extend([950.0; 10]);
        series.extend([100.0; 10]);
        series.extend([0.0; 5]);
        // Waits: 50 ms standing in second 0 (startup, left out); in second 1 a
        // 30 ms standing queue with one 100 ms bucket that read 60; 2 ms in
        // seconds 2 and 3; second 4 saw no arrivals at the bottleneck.
        let mut waits = vec![Some(50_000); 10];
        waits.extend([Some(30_000); 10]);
        waits[15] = Some(60_000);
        waits.extend([Some(2_000); 20]);
        waits.extend([None; 10]);
        waits.extend([Some(0); 15]);
        let st = steady(&series, &waits).unwrap();
        assert_eq!(st.mbps, (900.0 + 850.0 + 900.0 + 950.0) / 4.0);
        assert_eq!(st.queue_ms, Some(2.0));
        assert_eq!(st.queue_max_ms, Some(30.0));
        assert_eq!(steady(&[0.0; 30], &[None; 30]), None);
        assert_eq!(steady(&[500.0; 9], &[None; 9]), None, "no whole second");
    }

    #[test]
    fn start_up_is_timed_from_the_first_data_to_90_percent_of_the_link() {
        // A handshake (0.4 Mbit/s in its 100 ms), a first flight (1.5), then
        // data doubling each 100 ms, then the link: 90 % is reached at the
        // end of the sixth 100 ms of data.
        let series = [0.4, 1.5, 3.0, 20.0, 150.0, 420.0, 930.0, 990.0, 400.0];
        assert_eq!(to_90pct(&series, 1000.0), Some(0.6));
        assert_eq!(to_90pct(&series, 2000.0), None, "never at 90 % of 2 Gbit/s");
        assert_eq!(to_90pct(&[0.0; 5], 1000.0), None);
        assert_eq!(to_90pct(&series, 0.0), None);
        // A 256 kbit/s link: any 100 ms with a tenth of it starts the count.
        assert_eq!(to_90pct(&[0.01, 0.05, 0.25, 0.25], 0.256), Some(0.2));
    }

    #[test]
    fn goodput_is_what_was_delivered_over_what_was_sent() {
        // A run stopped at its cap after delivering 30 MB of 80 for 33 MB on
        // the wire: G is 0.91, not 80 / 33.
        let g = goodput(30_000_000, 33_000_000);
        assert!((g - 0.909).abs() < 0.001, "{g}");
        assert_eq!(goodput(0, 0), 0.0);
        assert_eq!(goodput(5, 10), 0.5);
    }

    #[test]
    fn ttp_is_taken_against_each_scenarios_own_link() {
        // A suite of a 256 kbit/s and a 10 Mbit/s path whose line rate
        // is 256k read TTP 34.8 on the fast one. Each is now against its own
        // link: the receivers' down rate, or the suite's line rate when unlimited.
        let mut text =
            "[suite]\nname = \"mixed\"\nline_rate = \"256k\"\ntools = [\"rsync\"]\n".to_string();
        for (name, links) in [
            ("slow", r#"link = "rate=256k delay=300ms""#),
            ("fast", r#"link = "rate=10M delay=20ms""#),
            (
                "asymmetric",
                r#"links = ["up:rate=10M down:rate=2M", "down:rate=1M"]"#,
            ),
            ("unlimited", r#"link = "delay=5ms""#),
        ] {
            text += &format!(
                "[[scenario]]\nname = \"{name}\"\n{links}\nfiles = [{{ size = \"1MB\", count = 1 }}]\n"
            );
        }
        let suite = Suite::parse(&text).unwrap();
        let line = suite.line_rate_bps();
        let rates: Vec<u64> = suite
            .plans()
            .unwrap()
            .iter()
            .map(|p| p.ttp_rate_bps(line))
            .collect();
        assert_eq!(rates, [256_000, 10_000_000, 1_000_000, 256_000]);
        // 100 kB in 4 s at 256 kbit/s (200 kbit/s); 10 MB in 8.989 s at
        // 10 Mbit/s (8.9 Mbit/s, 34.8 against 256k before).
        let slow = ttp(100_000, 4.0, rates[0]);
        let fast = ttp(10_000_000, 8.989, rates[1]);
        assert!((slow - 0.78125).abs() < 1e-9, "{slow}");
        assert!((fast - 0.890).abs() < 1e-3, "{fast}");
        assert!(ttp(10_000_000, 8.989, line) > 34.7, "the old reference");
        // The slowest receiver bounds the run: 1 MB in 8 s is 1.0 of 1 Mbit/s.
        assert_eq!(ttp(1_000_000, 8.0, rates[2]), 1.0);
    }

    #[test]
    fn background_counters_are_read_linearly_between_marks() {
        let marks = [(1000, 0), (2000, 1_000_000), (3000, 1_000_000)];
        assert_eq!(interpolate(&marks, 500), 0.0);
        assert_eq!(interpolate(&marks, 1500), 500_000.0);
        assert_eq!(interpolate(&marks, 2000), 1_000_000.0);
        assert_eq!(interpolate(&marks, 2500), 1_000_000.0);
        assert_eq!(interpolate(&marks, 9000), 1_000_000.0);
        assert_eq!(interpolate(&[], 9000), 0.0);
    }
}
