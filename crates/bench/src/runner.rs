//! Runs a suite: for each scenario, a lab with the scenario's link, the data
//! set generated once, then every tool in turn — server started in `srv`,
//! client run in `cli`, timed, its CPU counted, stopped by PID, the delivered
//! tree verified by hash — and every number saved as it is measured.

use crate::dataset::{self, DataSet};
use crate::host::{machine, mount_tmpfs, set_cc, set_tcp_max};
pub use crate::live::clean_up;
use crate::live::{live, unmount};
use crate::metrics::*;
use crate::proc::{forget_group, reap, spawn, stop, tail, wait_ready, Forked};
use crate::results::{Results, Run, Status};
use crate::scenario::{Background, Data, Plan, Storage, Suite};
use crate::tools::{Host, Proc, Proto, Receiver, Setup, Tool, ToolSpec};
use anyhow::{bail, Context, Result};
use longhaul_lab::ops;
use longhaul_lab::topology::{LabConfig, LinkArgs};
use longhaul_netem::driver::ScheduleOp;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

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
}

/// The lab a run brings up, unless told another name.
pub const DEFAULT_LAB: &str = "lhrun";
const SERVER: &str = "srv";

/// The receivers' host names: cli, cli2, cli3, ...
/// The longest a warm-up command ([`crate::tools::Adapter::warmups`]) may
/// take before it is stopped.
const WARMUP_CAP: Duration = Duration::from_secs(30);

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
        runs: Vec::new(),
    };
    let result = (|| -> Result<()> {
        for plan in &plans {
            run_plan(plan, opts, &out, &mut results)?;
        }
        Ok(())
    })();
    clean_up();
    result?;
    Ok(results)
}

fn run_plan(plan: &Plan, opts: &Options, out: &Path, results: &mut Results) -> Result<()> {
    let tools: Vec<&ToolSpec> = plan
        .tools
        .iter()
        .filter(|t| {
            opts.tools
                .as_ref()
                .is_none_or(|only| only.iter().any(|o| o == t.tool.name() || *o == t.label))
        })
        .collect();
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
    let data = match &plan.data {
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
    };
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
        },
        0x6c68,
        plan.mtu,
    )?;
    // Outages and rate steps are timed from each tool's start (see
    // `run_tool`), not from the lab's: held until then, and in between.
    cfg.schedule_held = true;
    if !matches!(ops::status(lab), ops::Status::Absent) {
        bail!("a lab named '{lab}' is up: another `lab run`? (`longhaul lab down --name {lab}` removes it; `lab run --lab NAME` runs beside it)");
    }
    let work = out.join("work");
    match (&data, &plan.data) {
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
    for tool in tools {
        let reps = opts.repeat.unwrap_or(plan.repeat);
        for rep in 1..=reps {
            let run = match (&data, &plan.data) {
                (Some(data), _) => run_tool(tool, rep, plan, data, opts, out, &cfg, results)?,
                (None, Data::Feed(f)) => {
                    let run = new_run(tool, rep, plan, plan.data.line());
                    match unavailable(tool.tool, &opts.exe, results) {
                        Some(skip) => Run { note: skip, ..run },
                        None => {
                            let mut run = crate::feed::run_tool(
                                tool,
                                rep,
                                plan,
                                f,
                                &opts.exe,
                                out,
                                &cfg,
                                run,
                                results.line_rate_bps,
                                &receiver_name,
                            )?;
                            let cores = results.machine.get("cores").and_then(|c| c.parse().ok());
                            run.limit = crate::results::limit(&run, cores.unwrap_or(0));
                            run
                        }
                    }
                }
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
            save_json(out, results)?;
        }
    }
    ops::teardown(lab);
    live().lab = None;
    let mut l = live();
    if let Some(m) = l.mount.take() {
        unmount(&m);
    }
    for (f, old) in l.core_restore.drain(..).rev() {
        let _ = std::fs::write(f, old.to_string());
    }
    Ok(())
}

/// A process of the run: its group id and where it runs.
struct Started {
    pid: i32,
    host: Host,
    log: PathBuf,
}

#[allow(clippy::too_many_arguments)]
fn run_tool(
    spec: &ToolSpec,
    rep: u32,
    plan: &Plan,
    data: &DataSet,
    opts: &Options,
    out: &Path,
    cfg: &LabConfig,
    results: &mut Results,
) -> Result<Run> {
    let tool = spec.tool;
    let n = plan.links.len();
    let mut run = new_run(spec, rep, plan, data.describe());
    run.files = data.files;
    run.bytes = data.bytes;
    if let Some(skip) = unavailable(tool, &opts.exe, results) {
        run.note = skip;
        return Ok(run);
    }
    let dir = out.join("runs").join(&plan.name).join(format!(
        "{}-{rep}",
        spec.label.replace([':', ',', '='], "_")
    ));
    let receivers: Vec<Receiver> = (0..n)
        .map(|i| Receiver {
            addr: cfg.host(&receiver_name(i)).expect("receiver host").addr,
            dst: out.join("work").join(format!("dst-{i}")),
        })
        .collect();
    for d in std::iter::once(&dir).chain(receivers.iter().map(|r| &r.dst)) {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
        std::fs::create_dir_all(d)?;
    }
    let server = cfg.host(SERVER).expect("server host").addr;
    let setup = Setup {
        exe: &opts.exe,
        src: &data.dir,
        run: &dir,
        server,
        receivers: &receivers,
        bytes: data.bytes,
        line_rate_bps: results.line_rate_bps,
        rtt: plan.max_rtt(),
        mtu: plan.mtu,
        kernel_cc: plan.cc.as_deref(),
        settings: &spec.settings,
    };
    let cmds = tool.commands(&setup)?;
    let warmups = tool.warmups(&setup);
    let ns = |h: Host| match h {
        Host::Server => cfg.netns(SERVER),
        Host::Receiver(i) => cfg.netns(&receiver_name(i)),
    };
    let log_name = |h: Host, what: &str, k: usize| {
        let who = match h {
            Host::Server => "server".to_string(),
            Host::Receiver(i) => format!("rx{i}"),
        };
        dir.join(format!("{who}-{what}{k}.log"))
    };
    let mut daemons: Vec<Started> = Vec::new();
    let mut cpu = CpuSplit::default();
    for (k, d) in cmds.daemons.iter().enumerate() {
        let log = log_name(d.proc.host, "daemon", k);
        let pid = spawn(&ns(d.proc.host), &d.proc, &log)?;
        daemons.push(Started {
            pid,
            host: d.proc.host,
            log: log.clone(),
        });
        if let Err(e) = wait_ready(pid, d.ready) {
            run.status = Status::Failed;
            run.note = format!("{e:#}; {}", tail(&log));
            for s in &daemons {
                stop(s.pid);
            }
            return Ok(run);
        }
    }
    for (k, w) in warmups.iter().enumerate() {
        let log = log_name(w.host, "warmup", k);
        let pid = spawn(&ns(w.host), w, &log)?;
        let deadline = Instant::now() + WARMUP_CAP;
        while reap(pid).is_none() {
            if Instant::now() >= deadline {
                stop(pid);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let background = match &plan.background {
        Some(b) => {
            let (rx, srv) = (ns(Host::Receiver(0)), ns(Host::Server));
            match start_background(b, plan.background_lead, cfg, &rx, &srv, &dir) {
                Ok(pids) => pids,
                Err(e) => {
                    run.status = Status::Failed;
                    run.note = format!("background traffic: {e:#}");
                    for s in &daemons {
                        stop(s.pid);
                    }
                    return Ok(run);
                }
            }
        }
        None => Vec::new(),
    };
    // A scheduled link (outages, rate steps) starts its schedule now, at the
    // tool's start, with the counters taken at that instant; it is held
    // again once the run ends, so that the next tool's setup meets the
    // base link and its run the same schedule.
    let scheduled = cfg.has_schedule();
    let before = if scheduled {
        ops::schedule(&cfg.name, ScheduleOp::Start)?
    } else {
        ops::stats(&cfg.name)?
    };
    let busy0 = machine_busy_s();
    let t0 = Instant::now();
    let mut actors = Vec::new();
    for (k, a) in cmds.actors.iter().enumerate() {
        let log = log_name(a.host, "client", k);
        let pid = spawn(&ns(a.host), a, &log)?;
        actors.push(Started {
            pid,
            host: a.host,
            log,
        });
    }
    let deadline = t0 + plan.time_cap;
    let mut pending: Vec<usize> = (0..actors.len()).collect();
    let mut failure: Option<String> = None;
    let mut first_byte: Vec<Option<f64>> = vec![None; n];
    // Several receivers of files: when each held the whole set.
    let watch_done = n > 1 && tool.moves_files();
    let mut done: Vec<Option<f64>> = vec![None; if watch_done { n } else { 0 }];
    // When a receiver's own client exited (pull tools run one per receiver).
    let mut actor_exit: Vec<Option<f64>> = vec![None; n];
    let mut next_look = t0;
    // The CPU of what the daemons fork (sessions), looked at 4 times a second.
    let mut forked: Vec<Forked> = daemons.iter().map(|_| Forked::default()).collect();
    let mut next_fork_look = t0;
    let complete = |i: usize, dst: &Path| {
        let (files, bytes) = visible_files(dst);
        files >= data.files
            && bytes >= data.bytes
            && tool.receiver_says_done(&dir, i, data.files).unwrap_or(true)
    };
    // With background traffic: what it had been delivered, once a second,
    // so that the tool's own series can be told from the link's.
    let delivered = |s: &longhaul_netem::Snapshot| background_total(s, |c| c.delivered_bytes);
    let mut bg_marks = vec![(before.uptime_ms, delivered(&before))];
    let mut next_mark = t0 + Duration::from_secs(1);
    while !pending.is_empty() && Instant::now() < deadline {
        if !background.is_empty() && Instant::now() >= next_mark {
            next_mark += Duration::from_secs(1);
            if let Ok(s) = ops::stats(&cfg.name) {
                bg_marks.push((s.uptime_ms, delivered(&s)));
            }
        }
        pending.retain(|&k| {
            let Some((status, c)) = reap(actors[k].pid) else {
                return true;
            };
            forget_group(actors[k].pid);
            cpu.add(actors[k].host, c);
            if let Host::Receiver(i) = actors[k].host {
                if let Some(t) = actor_exit.get_mut(i) {
                    *t = Some(t0.elapsed().as_secs_f64());
                }
            }
            let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
            if code != Some(0) && failure.is_none() {
                failure = Some(format!(
                    "exit {}: {}",
                    code.map_or("by signal".into(), |c| c.to_string()),
                    tail(&actors[k].log)
                ));
            }
            false
        });
        if tool.moves_files() {
            for (i, r) in receivers.iter().enumerate() {
                if first_byte[i].is_none() && has_a_byte(&r.dst) {
                    first_byte[i] = Some(t0.elapsed().as_secs_f64());
                }
            }
        }
        if Instant::now() >= next_fork_look {
            for (d, f) in daemons.iter().zip(&mut forked) {
                f.look(d.pid);
            }
            next_fork_look = Instant::now() + Duration::from_millis(250);
        }
        if watch_done && Instant::now() >= next_look {
            for (i, r) in receivers.iter().enumerate() {
                // A receiver whose own client is still running is not done;
                // one whose client exited is timed by that exit (below).
                let client_left = actors
                    .iter()
                    .any(|a| a.host == Host::Receiver(i))
                    .then_some(actor_exit[i]);
                if done[i].is_none() && client_left.is_none() && complete(i, &r.dst) {
                    done[i] = Some(t0.elapsed().as_secs_f64());
                }
            }
            next_look = Instant::now() + Duration::from_millis(250);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall = t0.elapsed().as_secs_f64();
    if watch_done {
        // Pull tools: a receiver is done when its own client exited with
        // everything there; the rest get a last look now.
        for (i, r) in receivers.iter().enumerate() {
            if done[i].is_none() && complete(i, &r.dst) {
                done[i] = Some(actor_exit[i].unwrap_or(wall));
            }
        }
    }
    run.receiver_done_s = done;
    let timed_out = !pending.is_empty();
    for &k in &pending {
        cpu.add(actors[k].host, stop(actors[k].pid));
    }
    let after = if scheduled {
        ops::schedule(&cfg.name, ScheduleOp::Hold)?
    } else {
        ops::stats(&cfg.name)?
    };
    if let (Some(a), Some(b)) = (busy0, machine_busy_s()) {
        run.machine_cpu_s = (b - a).max(0.0);
    }
    for &pid in &background {
        stop(pid);
    }
    for (d, f) in daemons.iter().zip(&mut forked) {
        cpu.add(d.host, f.stop(d.pid));
    }
    run.wall_s = wall;
    if scheduled {
        let outages = |s: &longhaul_netem::Snapshot| -> u64 {
            s.hosts
                .iter()
                .map(|h| h.up.counters.outage_drop_pkts + h.down.counters.outage_drop_pkts)
                .sum()
        };
        run.outage_dropped = Some(outages(&after).saturating_sub(outages(&before)));
    }
    run.client_cpu_s = cpu.receivers;
    run.server_cpu_s = cpu.server;
    run.emulator_cpu_s = (after.cpu_s - before.cpu_s).max(0.0);
    run.ttfb_s = first_byte.iter().flatten().copied().reduce(f64::min);
    let host = |s: &longhaul_netem::Snapshot, h: &str| {
        s.hosts
            .iter()
            .find(|x| x.name == h)
            .cloned()
            .expect("lab host")
    };
    let s1 = host(&after, SERVER);
    run.wire_bytes =
        up_bytes(&before, &after, SERVER)
            .saturating_sub(background_delta(&before, &after, |c| c.offered_bytes));
    run.wire_back_bytes = (0..n)
        .map(|i| up_bytes(&before, &after, &receiver_name(i)))
        .sum::<u64>()
        .saturating_sub(background_back_bytes(&before, &after));
    bg_marks.push((after.uptime_ms, delivered(&after)));
    let (from, to) = (before.uptime_ms / 100, after.uptime_ms / 100);
    let mut series = vec![0.0; (to - from + 1) as usize];
    let mut each = Vec::new();
    for i in 0..n {
        let s = &host(&after, &receiver_name(i)).down.series;
        let own: Vec<f64> = (0..series.len() as u64)
            .map(|k| {
                (from + k)
                    .checked_sub(s.first)
                    .and_then(|x| s.bytes.get(x as usize))
                    .map_or(0.0, |b| *b as f64 * 8.0 / 0.1 / 1e6)
            })
            .collect();
        for (slot, v) in series.iter_mut().zip(&own) {
            *slot += v / n as f64;
        }
        each.push(own);
    }
    if n > 1 {
        run.receiver_series_mbps = each;
    }
    // The background's flows, each with its own 100 ms series, when the
    // emulator kept them (else only its counters, read once a second).
    let bg_flows = (!background.is_empty())
        .then(|| background_series(&before, &after))
        .flatten();
    if !background.is_empty() {
        // The background goes to the first receiver: take it out of the mean.
        for (k, slot) in series.iter_mut().enumerate() {
            let t = (from + k as u64) * 100;
            let bg = match &bg_flows {
                Some(flows) => {
                    let bg: f64 = flows
                        .iter()
                        .map(|s| window_bytes(s, t as f64, (t + 100) as f64))
                        .sum();
                    run.background_series_mbps.push(bg * 8.0 / 0.1 / 1e6);
                    bg
                }
                None => interpolate(&bg_marks, t + 100) - interpolate(&bg_marks, t),
            };
            *slot = (*slot - bg * 8.0 / 0.1 / 1e6 / n as f64).max(0.0);
            if let Some(own) = run.receiver_series_mbps.first_mut() {
                own[k] = (own[k] - bg * 8.0 / 0.1 / 1e6).max(0.0);
            }
        }
        // Over the span its counters cover (from the snapshot before the tool
        // started to the one after it ended).
        let (first, last) = (bg_marks[0], *bg_marks.last().expect("marks"));
        let span = last.0.saturating_sub(first.0).max(1) as f64 / 1e3;
        run.background_mbps = Some(last.1.saturating_sub(first.1) as f64 * 8.0 / span / 1e6);
        // (Counted as the packets are offered: none still on their way is
        // taken for lost.)
        let offered = background_delta(&before, &after, |c| c.offered_pkts);
        let dropped = background_delta(&before, &after, |c| c.dropped_pkts);
        run.background_lost = (offered > 0).then(|| dropped as f64 / offered as f64);
        run.background_dropped = Some(dropped);
    }
    if let (Some(flows), Some(b)) = (&bg_flows, &plan.background) {
        let (t0_ms, t1_ms) = (before.uptime_ms as f64, after.uptime_ms as f64);
        // The 100 ms bucket that holds the snapshot after the run holds
        // nothing from after it: it counts whole.
        let t1_end = (after.uptime_ms / 100 + 1) as f64 * 100.0;
        let span_s = ((t1_ms - t0_ms) / 1e3).max(1e-3);
        let mbps = |bytes: f64| bytes * 8.0 / span_s / 1e6;
        // The flows that carried the background in this run: the largest
        // (earlier runs' flows and iperf3's control connection carry little).
        let mut each: Vec<f64> = flows
            .iter()
            .map(|s| mbps(window_bytes(s, t0_ms, t1_end)))
            .collect();
        each.sort_by(|a, b| b.total_cmp(a));
        each.truncate(b.flows());
        // The tool's own, like theirs: IP bytes the first receiver's link
        // delivered, less the background's.
        let rx0 = (
            host(&before, &receiver_name(0)),
            host(&after, &receiver_name(0)),
        );
        let tool_bytes = (rx0.1.down.counters.delivered_bytes
            - rx0.0.down.counters.delivered_bytes)
            .saturating_sub(background_delta(&before, &after, |c| c.delivered_bytes));
        if matches!(b, Background::Tcp { .. }) {
            let mut rates = vec![mbps(tool_bytes as f64)];
            rates.extend(&each);
            run.jain = jain(&rates);
        }
        run.background_flows_mbps = each;
        // What the background kept in the tool's first 10 round trips (of
        // the path's base RTT; from the tool's first data, as the start-up
        // time is timed), against its rate in a span before the tool
        // started: 10 round trips too, at least 1 s, at most half of the
        // lead (the background's own start takes part of it).
        let rtt_ms = plan.max_rtt().as_secs_f64() * 1e3;
        let lead_ms = plan.background_lead.as_secs_f64() * 1e3;
        let before_ms = (10.0 * rtt_ms).max(1000.0).min(lead_ms / 2.0);
        let link = plan.ttp_rate_bps(results.line_rate_bps) as f64 / 1e6;
        let first = first_data(&series, link).map(|k| (from + k as u64) as f64 * 100.0);
        if let (Some(first), true) = (first, rtt_ms > 0.0) {
            let end = (first + 10.0 * rtt_ms).min(t1_end);
            // A run that ended within 5 round trips of its first data says
            // nothing of what a start takes.
            if end - first >= 5.0 * rtt_ms {
                run.background_kept = kept(flows, (t0_ms - before_ms, t0_ms), (first, end));
            }
        }
    }
    // The queue a packet met on its way to the first receiver: the server's
    // uplink and the receiver's downlink (whichever is the bottleneck).
    let (up, down) = (&s1.up.queue, &host(&after, &receiver_name(0)).down.queue);
    let waits: Vec<Option<u32>> = (0..series.len() as u64)
        .map(|k| {
            let (a, b) = (up.get(from + k), down.get(from + k));
            (a.is_some() || b.is_some()).then(|| a.unwrap_or(0) + b.unwrap_or(0))
        })
        .collect();
    // One receiver and no background: with several, the series is their
    // mean and the rate the slowest link's; background is taken out of it.
    if n == 1 && background.is_empty() {
        run.to_90pct_s = to_90pct(
            &series,
            plan.ttp_rate_bps(results.line_rate_bps) as f64 / 1e6,
        );
    }
    if let Some(st) = steady(&series, &waits) {
        run.steady_mbps = Some(st.mbps);
        run.queue_ms = st.queue_ms;
        run.queue_max_ms = st.queue_max_ms;
    }
    run.series_mbps = series;
    run.delivered_bytes = if timed_out && tool.moves_files() {
        receivers.iter().map(|r| tree_bytes(&r.dst)).sum::<u64>() / n as u64
    } else if timed_out {
        // Memory to memory: what the emulator delivered (IP bytes, so a few
        // per cent more than payload).
        (0..n)
            .map(|i| {
                let name = receiver_name(i);
                let (a, b) = (host(&before, &name), host(&after, &name));
                b.down.counters.delivered_bytes - a.down.counters.delivered_bytes
            })
            .sum::<u64>()
            .saturating_sub(background_delta(&before, &after, |c| c.delivered_bytes))
            / n as u64
    } else {
        data.bytes
    };
    // Of what was delivered: a run stopped at its cap counts its partial bytes
    // against the wire bytes it sent, never the whole data set.
    run.goodput = goodput(run.delivered_bytes, run.wire_bytes);
    run.mbps = run.delivered_bytes as f64 * 8.0 / wall / 1e6;
    // Against this scenario's own bottleneck (the suite's line rate only when
    // its links are unlimited), so a suite of slow and fast paths compares.
    run.ttp = ttp(
        run.delivered_bytes,
        wall,
        plan.ttp_rate_bps(results.line_rate_bps),
    );
    if timed_out {
        run.status = Status::Timeout;
        run.note = format!(
            "stopped after {:.0} s with {:.1} of {:.1} MB delivered",
            plan.time_cap.as_secs_f64(),
            run.delivered_bytes as f64 / 1e6,
            data.bytes as f64 / 1e6
        );
    } else if let Some(f) = failure {
        run.status = Status::Failed;
        run.note = f;
        run.mbps = 0.0;
        run.ttp = 0.0;
    } else if tool.moves_files() {
        let mut bad = Vec::new();
        let mut unreadable = Vec::new();
        for (i, r) in receivers.iter().enumerate() {
            match dataset::tree_hash(&r.dst) {
                Ok(sum) if sum.hash == data.hash => {}
                Ok(_) => bad.push(receiver_name(i)),
                // A tool may leave what the hash refuses (a FIFO, an unreadable file).
                Err(e) => {
                    bad.push(receiver_name(i));
                    unreadable.push(format!("{e:#}"));
                }
            }
        }
        run.verified = Some(bad.is_empty());
        if bad.is_empty() {
            // Verified: every receiver was done by the end at the latest
            // (a tree with hidden files of its own is never "complete" to
            // the look above, which skips hidden names).
            for (d, exit) in run.receiver_done_s.iter_mut().zip(&actor_exit) {
                d.get_or_insert(exit.unwrap_or(wall));
            }
        }
        run.status = if bad.is_empty() {
            Status::Ok
        } else {
            Status::Unverified
        };
        if !bad.is_empty() {
            run.note = format!(
                "the tree delivered to {} differs from the data set{}",
                bad.join(", "),
                if unreadable.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", unreadable.join("; "))
                }
            );
        }
    } else {
        run.status = Status::Ok;
    }
    let cores = results.machine.get("cores").and_then(|c| c.parse().ok());
    run.limit = crate::results::limit(&run, cores.unwrap_or(0));
    for r in &receivers {
        std::fs::remove_dir_all(&r.dst)?;
    }
    Ok(run)
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

/// Starts background traffic from the server to the first receiver, lets
/// it run for `lead`, and returns its process groups (stopped after the tool,
/// not counted as its CPU).
fn start_background(
    b: &Background,
    lead: Duration,
    cfg: &LabConfig,
    rx_ns: &str,
    srv_ns: &str,
    dir: &Path,
) -> Result<Vec<i32>> {
    let rx = cfg
        .host(&receiver_name(0))
        .expect("receiver host")
        .addr
        .to_string();
    let port = BACKGROUND_PORT.to_string();
    let argv = |xs: &[&str]| Proc {
        host: Host::Server,
        argv: xs.iter().map(|x| x.to_string()).collect(),
        cwd: None,
    };
    let server = spawn(
        rx_ns,
        &argv(&["iperf3", "-s", "-B", &rx, "-p", &port]),
        &dir.join("background-server.log"),
    )?;
    let mut pids = vec![server];
    let started = (|| -> Result<()> {
        wait_ready(server, (Proto::Tcp, BACKGROUND_PORT))?;
        let mut client = vec!["iperf3", "-c", &rx, "-p", &port, "-t", "86400"];
        let (flows, rate, size);
        match b {
            Background::Tcp { flows: n, cc } => {
                flows = n.to_string();
                client.extend(["-P", &flows]);
                if let Some(cc) = cc {
                    client.extend(["-C", cc]);
                }
            }
            Background::Udp { pps, size: sz } => {
                rate = (*pps as u64 * *sz as u64 * 8).to_string();
                size = sz.to_string();
                client.extend(["-u", "-b", &rate, "-l", &size]);
            }
        }
        pids.push(spawn(
            srv_ns,
            &argv(&client),
            &dir.join("background-client.log"),
        )?);
        std::thread::sleep(lead);
        if let Some((status, _)) = reap(pids[1]) {
            forget_group(pids[1]);
            bail!(
                "iperf3 exited (status {status}): {}",
                tail(&dir.join("background-client.log"))
            );
        }
        Ok(())
    })();
    if let Err(e) = started {
        for p in pids {
            stop(p);
        }
        return Err(e);
    }
    Ok(pids)
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
        let g = super::goodput(30_000_000, 33_000_000);
        assert!((g - 0.909).abs() < 0.001, "{g}");
        assert_eq!(super::goodput(0, 0), 0.0);
        assert_eq!(super::goodput(5, 10), 0.5);
    }

    #[test]
    fn ttp_is_taken_against_each_scenarios_own_link() {
        // Issue 28: a suite of a 256 kbit/s and a 10 Mbit/s path whose line rate
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
        assert_eq!(super::interpolate(&marks, 500), 0.0);
        assert_eq!(super::interpolate(&marks, 1500), 500_000.0);
        assert_eq!(super::interpolate(&marks, 2000), 1_000_000.0);
        assert_eq!(super::interpolate(&marks, 2500), 1_000_000.0);
        assert_eq!(super::interpolate(&marks, 9000), 1_000_000.0);
        assert_eq!(super::interpolate(&[], 9000), 0.0);
    }
}
