//! One tool's run over a scenario's data set, in the phases it goes
//! through: lay out its directories and write its config, start the server
//! side (daemons, each awaited until ready), warm up, start the background
//! traffic, start the clients (the clock, and a scheduled link's schedule,
//! start then), watch them until they exit or the time cap, stop
//! everything, measure what the processes and the link saw, and judge the
//! run (the delivered trees verified by hash).

use super::{new_run, receiver_name, set_limit, unavailable, Options, SERVER};
use crate::dataset::{self, DataSet};
use crate::metrics::*;
use crate::proc::{
    exit_fd, forget_group, reap, spawn, stop, tail, wait_exit, wait_ready, why, Forked,
};
use crate::results::{Results, Run, Status};
use crate::scenario::{Background, Plan};
use crate::tools::{Commands, Daemon, Host, Proc, Proto, Receiver, Setup, Tool, ToolSpec};
use anyhow::{bail, Result};
use longhaul_lab::ops;
use longhaul_lab::topology::LabConfig;
use longhaul_netem::driver::ScheduleOp;
use longhaul_netem::hub::HostStats;
use longhaul_netem::Snapshot;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest a warm-up command ([`crate::tools::Adapter::warmups`]) may
/// take before it is stopped.
const WARMUP_CAP: Duration = Duration::from_secs(30);

/// Runs `spec` over `data` once (repetition `rep`) in the lab `cfg`, phase
/// by phase; a tool that cannot run here is a skipped run.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_tool(
    spec: &ToolSpec,
    rep: u32,
    plan: &Plan,
    data: &DataSet,
    opts: &Options,
    out: &Path,
    cfg: &LabConfig,
    results: &mut Results,
) -> Result<Run> {
    let mut run = new_run(spec, rep, plan, data.describe());
    run.files = data.files;
    run.bytes = data.bytes;
    if let Some(skip) = unavailable(spec.tool, &opts.exe, results) {
        run.note = skip;
        return Ok(run);
    }
    let t = Transfer::lay_out(spec, rep, plan, data, out, cfg, results.line_rate_bps)?;
    let (cmds, warmups) = t.commands(&opts.exe)?;
    let daemons = match t.start_server_side(&cmds)? {
        Ok(daemons) => daemons,
        Err(note) => return Ok(failed(run, note)),
    };
    t.warm_up(&warmups)?;
    let background = match t.start_background() {
        Ok(pids) => pids,
        Err(e) => {
            stop_all(&daemons);
            return Ok(failed(run, format!("background traffic: {e:#}")));
        }
    };
    let mut watch = t.start_clients(&cmds, &daemons)?;
    let wall = t.watch(&mut watch, &daemons, !background.is_empty());
    let ended = t.stop(watch, wall, &daemons, &background)?;
    t.measure(&mut run, &ended);
    t.judge(&mut run, ended);
    set_limit(&mut run, results);
    t.clear_destinations()?;
    Ok(run)
}

/// A process of the run: its group id and where it runs.
struct Started {
    pid: i32,
    host: Host,
    log: PathBuf,
}

/// What every phase of a run reads: the tool, the scenario, the data set,
/// the lab, and where the run's files go.
struct Transfer<'a> {
    spec: &'a ToolSpec,
    tool: Tool,
    plan: &'a Plan,
    data: &'a DataSet,
    cfg: &'a LabConfig,
    /// The run's own directory: the tool's config files, state and logs.
    dir: PathBuf,
    /// One per link of the scenario, each with an empty destination.
    receivers: Vec<Receiver>,
    /// The suite's line rate (a scenario's reference where its links are
    /// unlimited).
    line_rate_bps: u64,
}

/// A run as its clients run, and what watching them has seen so far.
struct Watch {
    /// The clients' start.
    t0: Instant,
    /// The link's counters at `t0`.
    before: Snapshot,
    /// The machine's busy core-seconds at `t0`.
    busy0: Option<f64>,
    actors: Vec<Started>,
    /// The clients (indices in `actors`) still running.
    pending: Vec<usize>,
    cpu: CpuSplit,
    /// The first client that exited badly: how, and its log's tail.
    failure: Option<String>,
    /// When each receiver held its first byte (s from `t0`).
    first_byte: Vec<Option<f64>>,
    /// Several receivers of files: when each held the whole set.
    done: Vec<Option<f64>>,
    /// When a receiver's own client exited (pull tools run one per receiver).
    actor_exit: Vec<Option<f64>>,
    /// The CPU of what the daemons fork (sessions), looked at 4 times a second.
    forked: Vec<Forked>,
    /// With background traffic: what it had been delivered, once a second,
    /// so that the tool's own series can be told from the link's.
    bg_marks: Vec<(u64, u64)>,
}

/// A run whose processes are all stopped.
struct Ended {
    watch: Watch,
    /// The link's counters when the run ended.
    after: Snapshot,
    /// Seconds from the clients' start to the end of the watch.
    wall: f64,
    /// A client was still running at the time cap.
    timed_out: bool,
    /// Background traffic ran beside the tool.
    background: bool,
    /// Core-seconds the whole machine was busy, where /proc/stat told.
    machine_cpu_s: Option<f64>,
}

impl Ended {
    /// The index of the link's first 100 ms bucket of the run.
    fn from(&self) -> u64 {
        self.watch.before.uptime_ms / 100
    }
}

/// `run`, failed before it measured, and why.
fn failed(run: Run, note: String) -> Run {
    Run {
        status: Status::Failed,
        note,
        ..run
    }
}

fn stop_all(procs: &[Started]) {
    for s in procs {
        stop(s.pid);
    }
}

/// Host `name` in a snapshot of the lab.
fn host<'s>(s: &'s Snapshot, name: &str) -> &'s HostStats {
    s.hosts.iter().find(|x| x.name == name).expect("lab host")
}

/// IP bytes the background's data flows had been delivered.
fn background_delivered(s: &Snapshot) -> u64 {
    background_total(s, |c| c.delivered_bytes)
}

/// Bytes delivered in a 100 ms bucket, as Mbit/s.
fn bucket_mbps(bytes: f64) -> f64 {
    bytes * 8.0 / 0.1 / 1e6
}

impl<'a> Transfer<'a> {
    /// Makes the run's directory and the receivers' destinations, empty.
    fn lay_out(
        spec: &'a ToolSpec,
        rep: u32,
        plan: &'a Plan,
        data: &'a DataSet,
        out: &Path,
        cfg: &'a LabConfig,
        line_rate_bps: u64,
    ) -> Result<Transfer<'a>> {
        let dir = out.join("runs").join(&plan.name).join(format!(
            "{}-{rep}",
            spec.label.replace([':', ',', '='], "_")
        ));
        let receivers: Vec<Receiver> = (0..plan.links.len())
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
        Ok(Transfer {
            spec,
            tool: spec.tool,
            plan,
            data,
            cfg,
            dir,
            receivers,
            line_rate_bps,
        })
    }

    /// Has the tool write its config files in the run's directory; its
    /// command lines and warm-ups.
    fn commands(&self, exe: &Path) -> Result<(Commands, Vec<Proc>)> {
        let setup = Setup {
            exe,
            src: &self.data.dir,
            run: &self.dir,
            server: self.cfg.host(SERVER).expect("server host").addr,
            receivers: &self.receivers,
            bytes: self.data.bytes,
            line_rate_bps: self.line_rate_bps,
            rtt: self.plan.max_rtt(),
            mtu: self.plan.mtu,
            kernel_cc: self.plan.cc.as_deref(),
            settings: &self.spec.settings,
        };
        Ok((self.tool.commands(&setup)?, self.tool.warmups(&setup)))
    }

    /// Starts the daemons one by one, each awaited until it is ready; Err
    /// inside: why one was not (those started are stopped).
    fn start_server_side(&self, cmds: &Commands) -> Result<Result<Vec<Started>, String>> {
        let mut daemons: Vec<Started> = Vec::new();
        for (k, Daemon { proc, ready }) in cmds.daemons.iter().enumerate() {
            let log = self.log(proc.host, "daemon", k);
            let pid = spawn(&self.ns(proc.host), proc, &log)?;
            daemons.push(Started {
                pid,
                host: proc.host,
                log: log.clone(),
            });
            if let Err(e) = wait_ready(pid, *ready) {
                let note = format!("{e:#}; {}", why(&log));
                stop_all(&daemons);
                return Ok(Err(note));
            }
        }
        Ok(Ok(daemons))
    }

    /// Runs the tool's warm-up commands one by one, each stopped after
    /// [`WARMUP_CAP`].
    fn warm_up(&self, warmups: &[Proc]) -> Result<()> {
        for (k, w) in warmups.iter().enumerate() {
            let log = self.log(w.host, "warmup", k);
            let pid = spawn(&self.ns(w.host), w, &log)?;
            let deadline = Instant::now() + WARMUP_CAP;
            while reap(pid).is_none() {
                if Instant::now() >= deadline {
                    stop(pid);
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Starts the scenario's background traffic, if it has any: its process
    /// groups.
    fn start_background(&self) -> Result<Vec<i32>> {
        match &self.plan.background {
            Some(b) => {
                let (rx, srv) = (self.ns(Host::Receiver(0)), self.ns(Host::Server));
                start_iperf3(b, self.plan.background_lead, self.cfg, &rx, &srv, &self.dir)
            }
            None => Ok(Vec::new()),
        }
    }

    /// Starts the clock, the link's schedule if it has one, and every
    /// client: the run as it begins.
    fn start_clients(&self, cmds: &Commands, daemons: &[Started]) -> Result<Watch> {
        // A scheduled link (outages, rate steps) starts its schedule now, at the
        // tool's start, with the counters taken at that instant; it is held
        // again once the run ends, so that the next tool's setup meets the
        // base link and its run the same schedule.
        let before = if self.cfg.has_schedule() {
            ops::schedule(&self.cfg.name, ScheduleOp::Start)?
        } else {
            ops::stats(&self.cfg.name)?
        };
        let busy0 = machine_busy_s();
        let t0 = Instant::now();
        let mut actors = Vec::new();
        for (k, a) in cmds.actors.iter().enumerate() {
            let log = self.log(a.host, "client", k);
            let pid = spawn(&self.ns(a.host), a, &log)?;
            actors.push(Started {
                pid,
                host: a.host,
                log,
            });
        }
        let n = self.receivers.len();
        Ok(Watch {
            t0,
            busy0,
            pending: (0..actors.len()).collect(),
            actors,
            cpu: CpuSplit::default(),
            failure: None,
            first_byte: vec![None; n],
            done: vec![None; if self.watch_done() { n } else { 0 }],
            actor_exit: vec![None; n],
            forked: daemons.iter().map(|_| Forked::default()).collect(),
            bg_marks: vec![(before.uptime_ms, background_delivered(&before))],
            before,
        })
    }

    /// Watches the clients until every one has exited or the time cap:
    /// their exits and CPU, each receiver's first byte and when it was done,
    /// the daemons' sessions, the background's progress. Returns the
    /// seconds it took.
    fn watch(&self, w: &mut Watch, daemons: &[Started], background: bool) -> f64 {
        let deadline = w.t0 + self.plan.time_cap;
        let mut next_look = w.t0;
        let mut next_fork_look = w.t0;
        let mut next_mark = w.t0 + Duration::from_secs(1);
        // (A client is timed by its exit, not by the end of a 5 ms sleep.)
        let exits: Vec<_> = w.actors.iter().map(|a| exit_fd(a.pid)).collect();
        while !w.pending.is_empty() && Instant::now() < deadline {
            if background && Instant::now() >= next_mark {
                next_mark += Duration::from_secs(1);
                if let Ok(s) = ops::stats(&self.cfg.name) {
                    w.bg_marks.push((s.uptime_ms, background_delivered(&s)));
                }
            }
            w.reap_clients();
            if self.tool.moves_files() {
                for (i, r) in self.receivers.iter().enumerate() {
                    if w.first_byte[i].is_none() && has_a_byte(&r.dst) {
                        w.first_byte[i] = Some(w.t0.elapsed().as_secs_f64());
                    }
                }
            }
            if Instant::now() >= next_fork_look {
                for (d, f) in daemons.iter().zip(&mut w.forked) {
                    f.look(d.pid);
                }
                next_fork_look = Instant::now() + Duration::from_millis(250);
            }
            if self.watch_done() && Instant::now() >= next_look {
                self.look_for_done(w);
                next_look = Instant::now() + Duration::from_millis(250);
            }
            if w.pending.is_empty() {
                break; // (timed now, not after one more wait)
            }
            let pending: Vec<_> = w
                .pending
                .iter()
                .filter_map(|&k| exits[k].as_ref())
                .collect();
            if pending.len() == w.pending.len() {
                wait_exit(&pending, Duration::from_millis(5));
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let wall = w.t0.elapsed().as_secs_f64();
        if self.watch_done() {
            // Pull tools: a receiver is done when its own client exited with
            // everything there; the rest get a last look now.
            for i in 0..self.receivers.len() {
                if w.done[i].is_none() && self.complete(i) {
                    w.done[i] = Some(w.actor_exit[i].unwrap_or(wall));
                }
            }
        }
        wall
    }

    /// Notes the receivers that now hold the whole data set.
    fn look_for_done(&self, w: &mut Watch) {
        for i in 0..self.receivers.len() {
            // A receiver whose own client is still running is not done;
            // one whose client exited is timed by that exit (see `watch`).
            let client_left = w
                .actors
                .iter()
                .any(|a| a.host == Host::Receiver(i))
                .then_some(w.actor_exit[i]);
            if w.done[i].is_none() && client_left.is_none() && self.complete(i) {
                w.done[i] = Some(w.t0.elapsed().as_secs_f64());
            }
        }
    }

    /// Stops the clients still running (a timeout), reads the link's
    /// counters (holding its schedule again), then stops the background and
    /// the daemons.
    fn stop(
        &self,
        mut w: Watch,
        wall: f64,
        daemons: &[Started],
        background: &[i32],
    ) -> Result<Ended> {
        let timed_out = !w.pending.is_empty();
        for &k in &w.pending {
            w.cpu.add(w.actors[k].host, stop(w.actors[k].pid));
        }
        let after = if self.cfg.has_schedule() {
            ops::schedule(&self.cfg.name, ScheduleOp::Hold)?
        } else {
            ops::stats(&self.cfg.name)?
        };
        let machine_cpu_s = w.busy0.zip(machine_busy_s()).map(|(a, b)| (b - a).max(0.0));
        for &pid in background {
            stop(pid);
        }
        for (d, f) in daemons.iter().zip(&mut w.forked) {
            w.cpu.add(d.host, f.stop(d.pid));
        }
        w.bg_marks
            .push((after.uptime_ms, background_delivered(&after)));
        Ok(Ended {
            watch: w,
            after,
            wall,
            timed_out,
            background: !background.is_empty(),
            machine_cpu_s,
        })
    }

    /// Measures what the run did: its time, CPU and wire bytes, what the
    /// link delivered over time (less the background's), its start-up,
    /// steady rate and queue, and what it delivered.
    fn measure(&self, run: &mut Run, e: &Ended) {
        self.count(run, e);
        let mut series = self.series(run, e);
        if e.background {
            self.measure_background(run, e, &mut series);
        }
        self.measure_rate(run, e, &series);
        run.series_mbps = series;
        self.measure_delivered(run, e);
    }

    /// The run's time, its processes' and the emulator's CPU, its first
    /// byte, and the bytes it put on the wire each way.
    fn count(&self, run: &mut Run, e: &Ended) {
        let (w, before, after) = (&e.watch, &e.watch.before, &e.after);
        run.receiver_done_s = w.done.clone();
        if let Some(cpu) = e.machine_cpu_s {
            run.machine_cpu_s = cpu;
        }
        run.wall_s = e.wall;
        if self.cfg.has_schedule() {
            let outages = |s: &Snapshot| -> u64 {
                s.hosts
                    .iter()
                    .map(|h| h.up.counters.outage_drop_pkts + h.down.counters.outage_drop_pkts)
                    .sum()
            };
            run.outage_dropped = Some(outages(after).saturating_sub(outages(before)));
        }
        run.client_cpu_s = w.cpu.receivers;
        run.server_cpu_s = w.cpu.server;
        run.emulator_cpu_s = (after.cpu_s - before.cpu_s).max(0.0);
        run.ttfb_s = w.first_byte.iter().flatten().copied().reduce(f64::min);
        run.wire_bytes =
            up_bytes(before, after, SERVER)
                .saturating_sub(background_delta(before, after, |c| c.offered_bytes));
        run.wire_back_bytes = (0..self.receivers.len())
            .map(|i| up_bytes(before, after, &receiver_name(i)))
            .sum::<u64>()
            .saturating_sub(background_back_bytes(before, after));
    }

    /// What the link delivered to the receivers in each 100 ms of the run,
    /// Mbit/s: their mean (returned), and each one's where there are
    /// several.
    fn series(&self, run: &mut Run, e: &Ended) -> Vec<f64> {
        let n = self.receivers.len();
        let (from, to) = (e.from(), e.after.uptime_ms / 100);
        let mut series = vec![0.0; (to - from + 1) as usize];
        let mut each = Vec::new();
        for i in 0..n {
            let s = &host(&e.after, &receiver_name(i)).down.series;
            let own: Vec<f64> = (0..series.len() as u64)
                .map(|k| {
                    (from + k)
                        .checked_sub(s.first)
                        .and_then(|x| s.bytes.get(x as usize))
                        .map_or(0.0, |b| bucket_mbps(*b as f64))
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
        series
    }

    /// Takes the background traffic out of the series, and measures it:
    /// its rate and losses, its flows' shares, what it kept as the tool
    /// started.
    fn measure_background(&self, run: &mut Run, e: &Ended, series: &mut [f64]) {
        let (before, after) = (&e.watch.before, &e.after);
        // The background's flows, each with its own 100 ms series, when the
        // emulator kept them (else only its counters, read once a second).
        let flows = background_series(before, after);
        // The background goes to the first receiver: take it out of the mean.
        let n = self.receivers.len() as f64;
        for (k, slot) in series.iter_mut().enumerate() {
            let t = (e.from() + k as u64) * 100;
            let bg = match &flows {
                Some(flows) => {
                    let bg: f64 = flows
                        .iter()
                        .map(|s| window_bytes(s, t as f64, (t + 100) as f64))
                        .sum();
                    run.background_series_mbps.push(bucket_mbps(bg));
                    bg
                }
                None => interpolate(&e.watch.bg_marks, t + 100) - interpolate(&e.watch.bg_marks, t),
            };
            *slot = (*slot - bucket_mbps(bg) / n).max(0.0);
            if let Some(own) = run.receiver_series_mbps.first_mut() {
                own[k] = (own[k] - bucket_mbps(bg)).max(0.0);
            }
        }
        // Over the span its counters cover (from the snapshot before the tool
        // started to the one after it ended).
        let marks = &e.watch.bg_marks;
        let (first, last) = (marks[0], *marks.last().expect("marks"));
        let span = last.0.saturating_sub(first.0).max(1) as f64 / 1e3;
        run.background_mbps = Some(last.1.saturating_sub(first.1) as f64 * 8.0 / span / 1e6);
        // (Counted as the packets are offered: none still on their way is
        // taken for lost.)
        let offered = background_delta(before, after, |c| c.offered_pkts);
        let dropped = background_delta(before, after, |c| c.dropped_pkts);
        run.background_lost = (offered > 0).then(|| dropped as f64 / offered as f64);
        run.background_dropped = Some(dropped);
        if let (Some(flows), Some(b)) = (&flows, &self.plan.background) {
            self.background_shares(run, e, series, flows, b);
        }
    }

    /// The background's flows' rates beside the tool's (TCP: Jain's
    /// fairness of them all), and what the background kept in the tool's
    /// first round trips.
    fn background_shares(
        &self,
        run: &mut Run,
        e: &Ended,
        series: &[f64],
        flows: &[&longhaul_netem::Series],
        b: &Background,
    ) {
        let (before, after) = (&e.watch.before, &e.after);
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
            host(before, &receiver_name(0)),
            host(after, &receiver_name(0)),
        );
        let tool_bytes = (rx0.1.down.counters.delivered_bytes
            - rx0.0.down.counters.delivered_bytes)
            .saturating_sub(background_delta(before, after, |c| c.delivered_bytes));
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
        let rtt_ms = self.plan.max_rtt().as_secs_f64() * 1e3;
        let lead_ms = self.plan.background_lead.as_secs_f64() * 1e3;
        let before_ms = (10.0 * rtt_ms).max(1000.0).min(lead_ms / 2.0);
        let link = self.plan.ttp_rate_bps(self.line_rate_bps) as f64 / 1e6;
        let first = first_data(series, link).map(|k| (e.from() + k as u64) as f64 * 100.0);
        if let (Some(first), true) = (first, rtt_ms > 0.0) {
            let end = (first + 10.0 * rtt_ms).min(t1_end);
            // A run that ended within 5 round trips of its first data says
            // nothing of what a start takes.
            if end - first >= 5.0 * rtt_ms {
                run.background_kept = kept(flows, (t0_ms - before_ms, t0_ms), (first, end));
            }
        }
    }

    /// From the series: the time to 90 % of the link, the steady rate, and
    /// the queue a packet met at that rate.
    fn measure_rate(&self, run: &mut Run, e: &Ended, series: &[f64]) {
        let from = e.from();
        // The queue a packet met on its way to the first receiver: the server's
        // uplink and the receiver's downlink (whichever is the bottleneck).
        let (up, down) = (
            &host(&e.after, SERVER).up.queue,
            &host(&e.after, &receiver_name(0)).down.queue,
        );
        let waits: Vec<Option<u32>> = (0..series.len() as u64)
            .map(|k| {
                let (a, b) = (up.get(from + k), down.get(from + k));
                (a.is_some() || b.is_some()).then(|| a.unwrap_or(0) + b.unwrap_or(0))
            })
            .collect();
        // One receiver and no background: with several, the series is their
        // mean and the rate the slowest link's; background is taken out of it.
        if self.receivers.len() == 1 && !e.background {
            run.to_90pct_s = to_90pct(
                series,
                self.plan.ttp_rate_bps(self.line_rate_bps) as f64 / 1e6,
            );
        }
        if let Some(st) = steady(series, &waits) {
            run.steady_mbps = Some(st.mbps);
            run.queue_ms = st.queue_ms;
            run.queue_max_ms = st.queue_max_ms;
        }
    }

    /// What reached each receiver (on average), and the rates made of it:
    /// Mbit/s, goodput, TTP.
    fn measure_delivered(&self, run: &mut Run, e: &Ended) {
        let (before, after) = (&e.watch.before, &e.after);
        let n = self.receivers.len() as u64;
        run.delivered_bytes = if e.timed_out && self.tool.moves_files() {
            self.receivers
                .iter()
                .map(|r| tree_bytes(&r.dst))
                .sum::<u64>()
                / n
        } else if e.timed_out {
            // Memory to memory: what the emulator delivered (IP bytes, so a few
            // per cent more than payload).
            (0..self.receivers.len())
                .map(|i| {
                    let name = receiver_name(i);
                    let (a, b) = (host(before, &name), host(after, &name));
                    b.down.counters.delivered_bytes - a.down.counters.delivered_bytes
                })
                .sum::<u64>()
                .saturating_sub(background_delta(before, after, |c| c.delivered_bytes))
                / n
        } else {
            self.data.bytes
        };
        // Of what was delivered: a run stopped at its cap counts its partial bytes
        // against the wire bytes it sent, never the whole data set.
        run.goodput = goodput(run.delivered_bytes, run.wire_bytes);
        run.mbps = run.delivered_bytes as f64 * 8.0 / e.wall / 1e6;
        // Against this scenario's own bottleneck (the suite's line rate only when
        // its links are unlimited), so a suite of slow and fast paths compares.
        run.ttp = ttp(
            run.delivered_bytes,
            e.wall,
            self.plan.ttp_rate_bps(self.line_rate_bps),
        );
    }

    /// The run's status: timed out, failed (a client's exit), or done, with
    /// the delivered trees verified where the tool moves files.
    fn judge(&self, run: &mut Run, e: Ended) {
        if e.timed_out {
            run.status = Status::Timeout;
            run.note = format!(
                "stopped after {:.0} s with {:.1} of {:.1} MB delivered",
                self.plan.time_cap.as_secs_f64(),
                run.delivered_bytes as f64 / 1e6,
                self.data.bytes as f64 / 1e6
            );
        } else if let Some(f) = e.watch.failure {
            run.status = Status::Failed;
            run.note = f;
            run.mbps = 0.0;
            run.ttp = 0.0;
        } else if self.tool.moves_files() {
            self.verify(run, &e.watch.actor_exit, e.wall);
        } else {
            run.status = Status::Ok;
        }
    }

    /// Checks every receiver's tree against the data set's hash: Ok, or
    /// Unverified with the receivers whose tree differs.
    fn verify(&self, run: &mut Run, actor_exit: &[Option<f64>], wall: f64) {
        let mut bad = Vec::new();
        let mut unreadable = Vec::new();
        for (i, r) in self.receivers.iter().enumerate() {
            match dataset::tree_hash(&r.dst) {
                Ok(sum) if sum.hash == self.data.hash => {}
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
            // the look in `watch`, which skips hidden names).
            for (d, exit) in run.receiver_done_s.iter_mut().zip(actor_exit) {
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
    }

    /// Removes what the receivers were delivered.
    fn clear_destinations(&self) -> Result<()> {
        for r in &self.receivers {
            std::fs::remove_dir_all(&r.dst)?;
        }
        Ok(())
    }

    /// The network namespace of a host of the lab.
    fn ns(&self, h: Host) -> String {
        match h {
            Host::Server => self.cfg.netns(SERVER),
            Host::Receiver(i) => self.cfg.netns(&receiver_name(i)),
        }
    }

    /// The log of the `k`th process of a kind (`what`) on host `h`.
    fn log(&self, h: Host, what: &str, k: usize) -> PathBuf {
        let who = match h {
            Host::Server => "server".to_string(),
            Host::Receiver(i) => format!("rx{i}"),
        };
        self.dir.join(format!("{who}-{what}{k}.log"))
    }

    /// Whether the watch times each receiver's end: several receivers of
    /// files.
    fn watch_done(&self) -> bool {
        self.receivers.len() > 1 && self.tool.moves_files()
    }

    /// Whether receiver `i` holds the whole data set (and says so, where
    /// the tool tells).
    fn complete(&self, i: usize) -> bool {
        let (files, bytes) = visible_files(&self.receivers[i].dst);
        files >= self.data.files
            && bytes >= self.data.bytes
            && self
                .tool
                .receiver_says_done(&self.dir, i, self.data.files)
                .unwrap_or(true)
    }
}

impl Watch {
    /// Reaps the clients that have exited: their CPU, when a receiver's own
    /// client left, and the first failure.
    fn reap_clients(&mut self) {
        let t0 = self.t0;
        let Watch {
            pending,
            actors,
            cpu,
            actor_exit,
            failure,
            ..
        } = self;
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
                *failure = Some(format!(
                    "exit {}: {}",
                    code.map_or("by signal".into(), |c| c.to_string()),
                    why(&actors[k].log)
                ));
            }
            false
        });
    }
}

/// Starts background traffic from the server to the first receiver, lets
/// it run for `lead`, and returns its process groups (stopped after the tool,
/// not counted as its CPU).
fn start_iperf3(
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
