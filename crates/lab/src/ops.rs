//! `lab up / down / exec / stats`: what the user runs. A lab is a supervisor
//! process (which owns the namespaces and tears them down when anything
//! ends) and its child, the emulator (which owns the TUN ports). Their PIDs
//! and the config live in the state directory; `down` reads them, checks via
//! /proc that they are still our processes, and stops them by PID.

use crate::signals;
use crate::sys;
use crate::topology::{netns_name, state_root, LabConfig, NS_PREFIX};
use anyhow::{anyhow, bail, Context, Result};
use longhaul_netem::driver::ScheduleOp;
use longhaul_netem::Snapshot;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Hidden `longhaul lab` subcommand that runs a lab's supervisor; it is also
/// how the supervisor is recognised in /proc and names its pid file.
pub const SUPERVISE: &str = "__supervise";
/// Hidden `longhaul lab` subcommand that runs a lab's emulator; it is also
/// how the emulator is recognised in /proc.
pub const EMULATE: &str = "__emulate";

/// The lab's config (`config.json`, written by `up`) in state directory `dir`.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}
/// The emulator's control socket (`ctl.sock`, requests `stats`, `schedule
/// start`, `schedule hold` and `stop`) in state directory `dir`.
pub fn ctl_path(dir: &Path) -> PathBuf {
    dir.join("ctl.sock")
}
fn pid_path(dir: &Path, role: &str) -> PathBuf {
    let file = if role == SUPERVISE {
        "supervisor.pid"
    } else {
        "emulator.pid"
    };
    dir.join(file)
}

/// Records `pid` in `dir`: `supervisor.pid` for [`SUPERVISE`], `emulator.pid`
/// for any other role.
pub fn write_pid(dir: &Path, role: &str, pid: u32) -> Result<()> {
    std::fs::write(pid_path(dir, role), format!("{pid}\n"))
        .with_context(|| format!("writing {}", pid_path(dir, role).display()))
}

fn read_pid(dir: &Path, role: &str) -> Option<i32> {
    std::fs::read_to_string(pid_path(dir, role))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Lab `name`'s config from its state directory; an error when it is missing
/// (the lab is not up) or does not parse.
pub fn read_config(name: &str) -> Result<LabConfig> {
    let path = config_path(&state_root().join(name));
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("lab '{name}' is not up ({} missing)", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: corrupt", path.display()))
}

/// Whether a lab is running, left over from a crash, or absent.
#[derive(Debug)]
pub enum Status {
    /// Its supervisor and emulator are both running (pid files checked
    /// against /proc) and its config reads back; holds that config.
    Up(Box<LabConfig>),
    /// Being set up or torn down: a process of it (supervisor or emulator)
    /// runs, or its state directory is younger than [`SETUP_GRACE`]
    /// (`up` creates it just before it starts the supervisor). `up` of the
    /// same name refuses it, and another lab's `down` leaves it alone.
    Starting,
    /// Some of it is left (state directory or namespaces) but its processes are gone.
    Stale,
    /// Neither a state directory nor a namespace of this lab exists.
    Absent,
}

fn lab_namespaces(name: &str) -> Vec<String> {
    let prefix = format!("{NS_PREFIX}{name}-");
    sys::netns_list()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// How long a lab's state directory counts as being set up although no
/// process of the lab runs yet: `up` creates it, writes the config and then
/// starts the supervisor, within milliseconds.
pub const SETUP_GRACE: Duration = Duration::from_secs(10);

/// Whether lab `name` is up, being set up, stale or absent. Two runs at
/// once (`lab run` brings up a lab per scenario, and takes down what is
/// stale) used to see each other's lab as stale while its emulator was
/// still starting, and removed it.
pub fn status(name: &str) -> Status {
    let dir = state_root().join(name);
    let live =
        |role: &str| read_pid(&dir, role).is_some_and(|p| sys::is_lab_process(p, role, name));
    if live(SUPERVISE) && live(EMULATE) {
        if let Ok(cfg) = read_config(name) {
            return Status::Up(Box::new(cfg));
        }
    }
    let young = std::fs::metadata(&dir)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < SETUP_GRACE));
    if young
        || !sys::find_lab_processes(SUPERVISE, name).is_empty()
        || !sys::find_lab_processes(EMULATE, name).is_empty()
    {
        Status::Starting
    } else if dir.exists() || !lab_namespaces(name).is_empty() {
        Status::Stale
    } else {
        Status::Absent
    }
}

/// Every lab with a state directory or a namespace.
pub fn all_labs() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state_root())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    for ns in sys::netns_list() {
        if let Some(rest) = ns.strip_prefix(NS_PREFIX) {
            if let Some((lab, _)) = rest.split_once('-') {
                names.push(lab.to_string());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Fails, saying what to do, unless this process runs as root and the
/// machine has /dev/net/tun and iproute2's `ip`.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the lab creates network namespaces and TUN devices: run it as root");
    }
    if !Path::new("/dev/net/tun").exists() {
        bail!("/dev/net/tun is missing: this kernel has no TUN support (modprobe tun)");
    }
    if sys::output(&["ip", "-V"]).is_err() {
        bail!("the `ip` command (iproute2) is missing: apt-get install iproute2");
    }
    Ok(())
}

/// Brings a lab up and returns once every host can reach every other; the
/// links' schedule clock (outages, rate steps) starts then, at 0, unless
/// `cfg.schedule_held`.
pub fn up(cfg: &LabConfig, exe: &Path) -> Result<()> {
    require_root()?;
    match status(&cfg.name) {
        Status::Up(c) => bail!(
            "lab '{}' is already up (hosts {}); `longhaul lab down --name {}` removes it",
            cfg.name,
            c.hosts
                .iter()
                .map(|h| h.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            cfg.name
        ),
        Status::Stale => {
            let removed = teardown(&cfg.name);
            eprintln!(
                "note: removed what a crashed lab '{}' left behind ({} namespaces)",
                cfg.name,
                removed.len()
            );
        }
        Status::Starting => bail!(
            "lab '{}' is being set up or taken down by another process; \
             `longhaul lab down --name {}` removes it",
            cfg.name,
            cfg.name
        ),
        Status::Absent => {}
    }
    for h in &cfg.hosts {
        let ns = cfg.netns(&h.name);
        if sys::netns_exists(&ns) {
            bail!("network namespace {ns} exists and is not ours to remove");
        }
    }
    let dir = cfg.dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(config_path(&dir), serde_json::to_vec_pretty(cfg)?)?;
    let log = std::fs::File::create(dir.join("lab.log"))?;

    // Ctrl-C while we wait is delivered to the waiting thread, which then
    // stops the supervisor (it tears everything down on its way out).
    signals::block_stop()?;
    let mut cmd = Command::new(exe);
    cmd.args(["lab", SUPERVISE, "--name", &cfg.name])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setsid and sigprocmask are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the lab supervisor")?;
    let pid = child.id() as i32;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let line = line.trim();
        let _ = tx.send(if line == "ready" {
            Ok(())
        } else if let Some(e) = line.strip_prefix("error: ") {
            Err(e.to_string())
        } else {
            Err("the lab supervisor exited during setup".into())
        });
    });
    std::thread::spawn(move || {
        if let Some(sig) = signals::wait_stop() {
            if tx2.send(Err("interrupted".into())).is_err() {
                // `up` has returned: the signal is for whoever waits next
                // (e.g. a `lab run` that brings up lab after lab).
                // Process-directed, so another thread's sigwait takes it.
                // SAFETY: signalling our own process.
                unsafe { libc::kill(libc::getpid(), sig) };
            }
        }
    });
    let outcome = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| Err("setup took over 60 s".into()));
    // Reap the supervisor only if it already exited; otherwise it keeps running.
    let _ = child.try_wait();
    match outcome {
        Ok(()) => {
            // The links' schedule (held by the emulator until now) starts as
            // the lab is ready, unless the caller starts it itself.
            if cfg.has_schedule() && !cfg.schedule_held {
                if let Err(e) = schedule(&cfg.name, ScheduleOp::Start) {
                    teardown(&cfg.name);
                    return Err(e.context(format!(
                        "lab '{}': starting its links' schedule; the lab was removed",
                        cfg.name
                    )));
                }
            }
            Ok(())
        }
        Err(why) => {
            sys::signal(pid, libc::SIGTERM);
            sys::wait_gone(pid, Duration::from_secs(15));
            let _ = child.try_wait();
            teardown(&cfg.name);
            if why == "interrupted" {
                bail!("interrupted; the lab was removed");
            }
            bail!("lab '{}' did not come up: {why}", cfg.name)
        }
    }
}

/// Removes everything of lab `name` that exists: its processes, the processes
/// inside its namespaces, the namespaces, their /etc/netns files and the state
/// directory. Idempotent; returns the namespaces removed.
pub fn teardown(name: &str) -> Vec<String> {
    let dir = state_root().join(name);
    let me = std::process::id() as i32;
    for role in [SUPERVISE, EMULATE] {
        let mut pids = sys::find_lab_processes(role, name);
        pids.extend(read_pid(&dir, role).filter(|&p| sys::is_lab_process(p, role, name)));
        pids.retain(|&p| p != me);
        pids.sort_unstable();
        pids.dedup();
        sys::terminate(&pids, Duration::from_secs(5));
    }
    let namespaces = lab_namespaces(name);
    for ns in &namespaces {
        sys::terminate(&sys::netns_pids(ns), Duration::from_secs(2));
        if let Err(e) = sys::run(&["ip", "netns", "del", ns]) {
            eprintln!("warning: {e:#}");
        }
        let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(ns));
    }
    let _ = std::fs::remove_dir_all(&dir);
    namespaces
}

/// What `down` removed.
#[derive(Debug, Default, serde::Serialize)]
pub struct DownReport {
    /// Labs that were up and were stopped.
    pub stopped: Vec<String>,
    /// Labs left over from a crash whose remains were removed.
    pub stale: Vec<String>,
    /// Network namespaces of those labs that were found and deleted (a failed
    /// delete only prints a warning), sorted.
    pub namespaces: Vec<String>,
}

/// Stops lab `name` (all labs with `all`), and removes any stale lab.
pub fn down(name: &str, all: bool) -> Result<DownReport> {
    require_root()?;
    let mut report = DownReport::default();
    for lab in all_labs() {
        let wanted = all || lab == name;
        match status(&lab) {
            // A lab being set up is stopped the same way: its supervisor,
            // if it is running yet, removes what it made.
            Status::Up(_) | Status::Starting if wanted => {
                report.namespaces.extend(lab_namespaces(&lab));
                let dir = state_root().join(&lab);
                if let Some(pid) = read_pid(&dir, SUPERVISE) {
                    if sys::is_lab_process(pid, SUPERVISE, &lab) {
                        sys::signal(pid, libc::SIGTERM);
                        sys::wait_gone(pid, Duration::from_secs(20));
                    }
                }
                report.namespaces.extend(teardown(&lab));
                report.stopped.push(lab);
            }
            Status::Stale => {
                report.namespaces.extend(teardown(&lab));
                report.stale.push(lab);
            }
            _ => {}
        }
    }
    report.namespaces.sort();
    report.namespaces.dedup();
    Ok(report)
}

/// Replaces this process with COMMAND running inside HOST's namespace.
pub fn exec(name: &str, host: &str, command: &[String]) -> Result<std::convert::Infallible> {
    let cfg = match status(name) {
        Status::Up(c) => c,
        _ => bail!("lab '{name}' is not up (`longhaul lab up --name {name} --hosts ...`)"),
    };
    if cfg.host(host).is_none() {
        bail!(
            "lab '{name}' has no host '{host}' (hosts: {})",
            cfg.hosts
                .iter()
                .map(|h| h.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if command.is_empty() {
        bail!("nothing to run: longhaul lab exec {host} -- COMMAND [ARGS...]");
    }
    let err = Command::new("ip")
        .args(["netns", "exec", &netns_name(name, host)])
        .args(command)
        .exec();
    Err(anyhow!("running ip netns exec: {err}"))
}

/// Every counter of a running lab.
pub fn stats(name: &str) -> Result<Snapshot> {
    request(name, "stats")
}

/// Starts (at 0, also when it runs) or holds the schedule clock of lab
/// `name`'s links: their outages and rate steps are timed from the start;
/// held, every link is its base spec. Returns every counter, taken at that
/// instant (so a run's counters and its schedule start together).
pub fn schedule(name: &str, op: ScheduleOp) -> Result<Snapshot> {
    request(
        name,
        match op {
            ScheduleOp::Start => "schedule start",
            ScheduleOp::Hold => "schedule hold",
        },
    )
}

/// Sends one request line to the emulator of lab `name` and reads the
/// snapshot it answers with.
fn request(name: &str, line: &str) -> Result<Snapshot> {
    if !matches!(status(name), Status::Up(_)) {
        bail!("lab '{name}' is not up");
    }
    let path = ctl_path(&state_root().join(name));
    let mut s = UnixStream::connect(&path)
        .with_context(|| format!("connecting to the emulator at {}", path.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    serde_json::from_slice(&buf).context("the emulator's answer is not a snapshot")
}
