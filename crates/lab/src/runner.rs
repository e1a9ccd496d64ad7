//! Runs a suite: for each scenario, a lab with the scenario's link, the data
//! set generated once, then every tool in turn — server started in `srv`,
//! client run in `cli`, timed, its CPU counted, stopped by PID, the delivered
//! tree verified by hash — and every number saved as it is measured.

use crate::dataset::{self, DataSet};
use crate::ops;
use crate::scenario::{Plan, Suite};
use crate::tools::{Proto, Setup, Tool};
use crate::topology::{LabConfig, LinkArgs};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One tool's run over one scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    pub scenario: String,
    pub tool: String,
    pub rep: u32,
    pub link: String,
    /// ok, failed, timeout, unverified or skipped.
    pub status: String,
    /// Why it failed or was skipped (the tail of its output, or how to install it).
    pub note: String,
    pub files: u64,
    pub bytes: u64,
    pub wall_s: f64,
    pub mbps: f64,
    /// (payload bytes / line rate) / wall time (seed 003).
    pub ttp: f64,
    /// Payload bytes / bytes the server put on the wire (seed 003).
    pub goodput: f64,
    pub wire_bytes: u64,
    pub client_cpu_s: f64,
    pub server_cpu_s: f64,
    /// None for memory-to-memory tools.
    pub verified: Option<bool>,
    /// Mbit/s the client's link delivered, per 100 ms, over the run.
    pub series_mbps: Vec<f64>,
}

/// Everything a suite run produced (results.json).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub suite: Suite,
    pub started_unix: u64,
    pub machine: BTreeMap<String, String>,
    pub versions: BTreeMap<String, String>,
    pub line_rate_bps: u64,
    pub runs: Vec<Run>,
}

pub struct Options {
    pub exe: PathBuf,
    pub out: PathBuf,
    /// Only these tools (of each scenario's list).
    pub tools: Option<Vec<Tool>>,
    pub repeat: Option<u32>,
    /// Print one line per run on stderr.
    pub progress: bool,
}

/// What an interrupted run must clean up.
#[derive(Default)]
struct Live {
    lab: Option<String>,
    groups: Vec<i32>,
    cc_restore: Option<String>,
}

static LIVE: Mutex<Live> = Mutex::new(Live {
    lab: None,
    groups: Vec::new(),
    cc_restore: None,
});

fn live() -> std::sync::MutexGuard<'static, Live> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes whatever a run has up (processes, lab, host setting); used on
/// Ctrl-C and at the end.
pub fn clean_up() {
    let mut l = live();
    for g in l.groups.drain(..) {
        // SAFETY: signalling a process group we created.
        unsafe { libc::kill(-g, libc::SIGKILL) };
    }
    if let Some(lab) = l.lab.take() {
        ops::teardown(&lab);
    }
    if let Some(old) = l.cc_restore.take() {
        let _ = std::fs::write(ALLOWED_CC, old);
    }
}

const ALLOWED_CC: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
const LAB: &str = "lhrun";
const SERVER: &str = "srv";
const CLIENT: &str = "cli";

/// Runs every scenario of `suite`; results are saved in `opts.out` after each run.
pub fn run_suite(suite: &Suite, opts: &Options) -> Result<Results> {
    ops::require_root()?;
    let plans = suite.plans()?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let out = std::fs::canonicalize(&opts.out)?;
    let mut results = Results {
        suite: suite.clone(),
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
    let tools: Vec<Tool> = plan
        .tools
        .iter()
        .copied()
        .filter(|t| opts.tools.as_ref().is_none_or(|only| only.contains(t)))
        .collect();
    if tools.is_empty() {
        return Ok(());
    }
    if opts.progress {
        eprintln!(
            "scenario {}: link '{}', {} files, {:.1} MB",
            plan.name,
            plan.link,
            plan.file_count(),
            plan.bytes() as f64 / 1e6
        );
    }
    let data = dataset::prepare(&out.join("data"), &plan.files)?;
    let cfg = LabConfig::new(
        LAB,
        &[SERVER.into(), CLIENT.into()],
        LinkArgs {
            default: Some(&plan.link),
            per_host: &[],
        },
        0x6c68,
        1500,
    )?;
    if !matches!(ops::status(LAB), ops::Status::Absent) {
        bail!("a lab named '{LAB}' is up: another `lab run`? (`longhaul lab down --name {LAB}` removes it)");
    }
    live().lab = Some(LAB.into());
    ops::up(&cfg, &opts.exe)?;
    if let Some(cc) = &plan.cc {
        set_cc(&cfg, cc)?;
    }
    let server = cfg.host(SERVER).expect("server host").addr;
    for tool in tools {
        let reps = opts.repeat.unwrap_or(plan.repeat);
        for rep in 1..=reps {
            let run = run_tool(tool, rep, plan, &data, opts, out, &cfg, server, results)?;
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
    ops::teardown(LAB);
    live().lab = None;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_tool(
    tool: Tool,
    rep: u32,
    plan: &Plan,
    data: &DataSet,
    opts: &Options,
    out: &Path,
    cfg: &LabConfig,
    server: std::net::Ipv4Addr,
    results: &mut Results,
) -> Result<Run> {
    let mut run = Run {
        scenario: plan.name.clone(),
        tool: tool.name().into(),
        rep,
        link: plan.link.clone(),
        status: "skipped".into(),
        note: String::new(),
        files: data.files,
        bytes: data.bytes,
        wall_s: 0.0,
        mbps: 0.0,
        ttp: 0.0,
        goodput: 0.0,
        wire_bytes: 0,
        client_cpu_s: 0.0,
        server_cpu_s: 0.0,
        verified: None,
        series_mbps: Vec::new(),
    };
    let missing = tool.missing();
    if !missing.is_empty() {
        run.note = format!(
            "{} not installed: {}",
            missing.join(", "),
            tool.install_hint()
        );
        return Ok(run);
    }
    results
        .versions
        .entry(tool.name().into())
        .or_insert_with(|| version(tool, &opts.exe));
    let dir = out
        .join("runs")
        .join(&plan.name)
        .join(format!("{}-{rep}", tool.name()));
    let dst = out.join("work").join("dst");
    for d in [&dir, &dst] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
        std::fs::create_dir_all(d)?;
    }
    let cmds = tool.commands(&Setup {
        exe: &opts.exe,
        src: &data.dir,
        dst: &dst,
        run: &dir,
        server,
        bytes: data.bytes,
    })?;
    let srv_ns = cfg.netns(SERVER);
    let cli_ns = cfg.netns(CLIENT);
    let srv = spawn(&srv_ns, &cmds.server, &dir.join("server.log"))?;
    if let Err(e) = wait_ready(srv, cmds.ready) {
        run.status = "failed".into();
        run.note = format!("{e:#}; {}", tail(&dir.join("server.log")));
        stop(srv);
        return Ok(run);
    }
    let before = ops::stats(LAB)?;
    let t0 = Instant::now();
    let cli = spawn(&cli_ns, &cmds.client, &dir.join("client.log"))?;
    let outcome = wait_for(cli, plan.time_cap);
    let wall = t0.elapsed().as_secs_f64();
    let after = ops::stats(LAB)?;
    let srv_usage = stop(srv);
    let (code, cli_cpu) = match outcome {
        Some(x) => x,
        None => {
            let u = stop(cli);
            run.status = "timeout".into();
            run.note = format!("stopped after {:.0} s", plan.time_cap.as_secs_f64());
            (None, u)
        }
    };
    run.wall_s = wall;
    run.client_cpu_s = cli_cpu;
    run.server_cpu_s = srv_usage;
    run.mbps = data.bytes as f64 * 8.0 / wall / 1e6;
    run.ttp = (data.bytes as f64 * 8.0 / results.line_rate_bps as f64) / wall;
    let host = |s: &longhaul_netem::Snapshot, h: &str| {
        s.hosts
            .iter()
            .find(|x| x.name == h)
            .cloned()
            .expect("lab host")
    };
    let (s0, s1) = (host(&before, SERVER), host(&after, SERVER));
    run.wire_bytes = s1.up.counters.offered_bytes - s0.up.counters.offered_bytes;
    run.goodput = data.bytes as f64 / run.wire_bytes.max(1) as f64;
    let series = &host(&after, CLIENT).down.series;
    let (from, to) = (before.uptime_ms / 100, after.uptime_ms / 100);
    run.series_mbps = (from..=to)
        .map(|i| {
            i.checked_sub(series.first)
                .and_then(|k| series.bytes.get(k as usize))
                .map_or(0.0, |b| *b as f64 * 8.0 / 0.1 / 1e6)
        })
        .collect();
    if run.status == "timeout" {
        return Ok(run);
    }
    if code != Some(0) {
        run.status = "failed".into();
        run.note = format!(
            "exit {}: {}",
            code.map_or("by signal".into(), |c| c.to_string()),
            tail(&dir.join("client.log"))
        );
        return Ok(run);
    }
    if tool.moves_files() {
        let (_, _, hash) = dataset::tree_hash(&dst)?;
        let ok = hash == data.hash;
        run.verified = Some(ok);
        run.status = if ok { "ok" } else { "unverified" }.into();
        if !ok {
            run.note = "the delivered tree differs from the data set".into();
        }
    } else {
        run.status = "ok".into();
    }
    std::fs::remove_dir_all(&dst)?;
    Ok(run)
}

/// Sets the kernel congestion control of every host; allows it globally
/// first if the namespaces may not choose it (restored at the end).
fn set_cc(cfg: &LabConfig, cc: &str) -> Result<()> {
    let allowed = std::fs::read_to_string(ALLOWED_CC).unwrap_or_default();
    if !allowed.split_whitespace().any(|a| a == cc) {
        let mut l = live();
        if l.cc_restore.is_none() {
            l.cc_restore = Some(allowed.trim().to_string());
        }
        std::fs::write(ALLOWED_CC, format!("{} {cc}", allowed.trim()))
            .with_context(|| format!("allowing {cc} in {ALLOWED_CC}"))?;
    }
    for h in &cfg.hosts {
        crate::sys::in_netns(&cfg.netns(&h.name), || {
            std::fs::write("/proc/sys/net/ipv4/tcp_congestion_control", cc)
                .with_context(|| format!("setting {cc} in host {}", h.name))
        })?;
    }
    Ok(())
}

fn spawn(ns: &str, argv: &[String], log: &Path) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(log)?;
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns])
        .args(argv)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        c.pre_exec(|| {
            // The runner blocks the stop signals for its own handling; the tools must not inherit that.
            let set = longhaul_netem::driver::stop_signal_set();
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = c
        .spawn()
        .with_context(|| format!("starting {}", argv.join(" ")))?;
    let pid = child.id() as i32;
    live().groups.push(pid);
    // Reaped by wait4 in `wait_for`/`stop`, not by Child.
    std::mem::forget(child);
    Ok(pid)
}

/// Waits for `pid` to exit, up to `cap`: (exit code, CPU seconds of it and
/// its children), or None on timeout.
fn wait_for(pid: i32, cap: Duration) -> Option<(Option<i32>, f64)> {
    let deadline = Instant::now() + cap;
    loop {
        if let Some((status, cpu)) = reap(pid) {
            forget_group(pid);
            let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
            return Some((code, cpu));
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn reap(pid: i32) -> Option<(i32, f64)> {
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 on our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
    if r != pid {
        return None;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    Some((status, t(ru.ru_utime) + t(ru.ru_stime)))
}

/// Stops a process group (SIGTERM, then SIGKILL after 3 s); CPU seconds of its leader.
fn stop(pid: i32) -> f64 {
    // SAFETY: signalling the process group we created.
    unsafe { libc::kill(-pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(3);
    let cpu = loop {
        if let Some((_, cpu)) = reap(pid) {
            break cpu;
        }
        if Instant::now() >= deadline {
            // SAFETY: as above.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            std::thread::sleep(Duration::from_millis(50));
            break reap(pid).map_or(0.0, |r| r.1);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Whatever else is left of the group.
    // SAFETY: as above.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    forget_group(pid);
    cpu
}

fn forget_group(pid: i32) {
    live().groups.retain(|&g| g != pid);
}

/// Waits until `pid`'s network namespace has the port bound (TCP: listening).
fn wait_ready(pid: i32, (proto, port): (Proto, u16)) -> Result<()> {
    let file = match proto {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/{file}")).unwrap_or_default();
        let bound = table.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            local_port == Some(port) && (proto == Proto::Udp || f.get(3) == Some(&"0A"))
        });
        if bound {
            return Ok(());
        }
        if let Some((status, _)) = reap(pid) {
            forget_group(pid);
            bail!("the server exited (status {status}) before it listened");
        }
        if Instant::now() >= deadline {
            bail!("the server did not listen on {file} port {port} within 15 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last non-empty line of a log, shortened.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    line.chars().take(200).collect()
}

fn version(tool: Tool, exe: &Path) -> String {
    let argv = tool.version_command();
    let out = if argv.is_empty() {
        Command::new(exe).arg("--version").output()
    } else {
        Command::new(argv[0]).args(&argv[1..]).output()
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

fn machine() -> BTreeMap<String, String> {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("")
        .trim()
        .to_string();
    let mut m = BTreeMap::new();
    m.insert("kernel".into(), read("/proc/sys/kernel/osrelease"));
    m.insert(
        "cores".into(),
        std::thread::available_parallelism()
            .map_or(0, |n| n.get())
            .to_string(),
    );
    m.insert("cpu".into(), cpu);
    m.insert(
        "memory".into(),
        read("/proc/meminfo")
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
    );
    m
}

/// Writes results.json (through a temporary file, so it is never half written).
pub fn save_json(out: &Path, results: &Results) -> Result<()> {
    let tmp = out.join(".results.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(results)?)?;
    std::fs::rename(&tmp, out.join("results.json"))?;
    Ok(())
}
