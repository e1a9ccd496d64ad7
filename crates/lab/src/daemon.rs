//! The two background processes of a lab.
//!
//! The supervisor creates the namespaces, starts the emulator, configures the
//! hosts' addresses once the emulator's TUN ports exist, reports `ready` to
//! `lab up`, and then waits. Whatever ends the lab — `lab down` (SIGTERM to
//! the supervisor), a crash or kill of the emulator — the supervisor removes
//! every namespace and file on its way out. If the supervisor itself is killed,
//! the emulator is told by the kernel (parent-death signal) and tears down the
//! lab itself.

use crate::ops::{self, ctl_path, read_config, write_pid, EMULATE, SUPERVISE};
use crate::signals;
use crate::sys;
use crate::topology::{LabConfig, PORT_NAME};
use anyhow::{bail, Context, Result};
use longhaul_netem::driver::{Driver, Handle, Options, ScheduleOp};
use longhaul_netem::tun::{Offload, Tun};
use longhaul_netem::Hub;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Points stdout at stderr (the lab log) once `lab up` has its answer, so
/// later output cannot hit a closed pipe.
fn stdout_to_log() {
    let _ = std::io::stdout().flush();
    // SAFETY: dup2 of valid descriptors.
    unsafe { libc::dup2(2, 1) };
}

/// Entry point of `longhaul lab __supervise --name NAME`.
pub fn supervise(name: &str, exe: &Path) -> i32 {
    let _ = signals::block_stop();
    let cfg = match read_config(name) {
        Ok(c) => c,
        Err(e) => {
            println!("error: {e:#}");
            return 1;
        }
    };
    let _ = write_pid(&cfg.dir(), SUPERVISE, std::process::id());
    let mut child = match build(&cfg, exe) {
        Ok(c) => c,
        Err(e) => {
            println!("error: {e:#}");
            stdout_to_log();
            eprintln!("setup failed: {e:#}");
            ops::teardown(name);
            return 1;
        }
    };
    println!("ready");
    stdout_to_log();
    eprintln!("lab '{name}' up: emulator pid {}", child.id());
    let emu = child.id() as i32;
    std::thread::spawn(move || {
        if signals::wait_stop().is_some() {
            eprintln!("stopping: signal received");
            sys::signal(emu, libc::SIGTERM);
        }
    });
    match child.wait() {
        Ok(s) if s.success() => eprintln!("emulator exited"),
        Ok(s) => eprintln!("emulator ended abnormally ({s}); removing the lab"),
        Err(e) => eprintln!("waiting for the emulator: {e}"),
    }
    let removed = ops::teardown(name);
    eprintln!("removed {} namespaces", removed.len());
    0
}

/// Timer batching of the emulator: under load packets leave in groups at most
/// this late (sparse packets, like RTT probes, leave on time).
pub const BATCH_NS: u64 = 50_000;

/// Per-namespace TCP buffer limits (min, default, max).
pub const TCP_BUFFERS: [(&str, &str); 2] = [
    ("tcp_rmem", "4096 131072 134217728"),
    ("tcp_wmem", "4096 16384 134217728"),
];

fn build(cfg: &LabConfig, exe: &Path) -> Result<Child> {
    let machine = sys::hostname();
    for h in &cfg.hosts {
        let ns = cfg.netns(&h.name);
        sys::run(&["ip", "netns", "add", &ns])?;
        sys::run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        sys::in_netns(&ns, || {
            // TCP buffers that can fill a long fat path (1 Gbit/s × 700 ms is
            // 87.5 MB): autotuning may grow to 128 MiB, as on a tuned WAN host.
            for (f, v) in TCP_BUFFERS {
                std::fs::write(format!("/proc/sys/net/ipv4/{f}"), v)
                    .with_context(|| format!("setting {f}"))?;
            }
            // No IPv6 chatter (router solicitations, MLD) through the emulator;
            // a kernel without IPv6 has nothing to disable.
            for f in ["all", "default"] {
                let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{f}/disable_ipv6"), "1");
            }
            Ok(())
        })?;
        let etc = Path::new("/etc/netns").join(&ns);
        std::fs::create_dir_all(&etc)?;
        std::fs::write(etc.join("hosts"), cfg.hosts_file(&h.name, &machine))?;
        // No name lookup leaves the lab.
        std::fs::write(etc.join("resolv.conf"), "nameserver 127.0.0.1\n")?;
    }
    let mut cmd = Command::new(exe);
    cmd.args(["lab", EMULATE, "--name", &cfg.name])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl and getppid are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // The supervisor may already be gone; then stop at once.
            if libc::getppid() != parent {
                libc::raise(libc::SIGTERM);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the emulator")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    if line.trim() != "tuns" {
        let _ = child.kill();
        let _ = child.wait();
        match line.trim().strip_prefix("error: ") {
            Some(e) => bail!("emulator: {e}"),
            None => bail!(
                "the emulator exited during setup (see {})",
                cfg.dir().join("lab.log").display()
            ),
        }
    }
    let mtu = cfg.mtu.to_string();
    for h in &cfg.hosts {
        let ns = cfg.netns(&h.name);
        let addr = format!("{}/24", h.addr);
        let steps: [&[&str]; 3] = [
            &["ip", "-n", &ns, "addr", "add", &addr, "dev", PORT_NAME],
            &[
                "ip",
                "-n",
                &ns,
                "link",
                "set",
                PORT_NAME,
                "mtu",
                &mtu,
                // A NIC-like transmit queue: a briefly busy emulator drops nothing.
                "txqueuelen",
                "10000",
                "multicast",
                "on",
                "up",
            ],
            &[
                "ip",
                "-n",
                &ns,
                "route",
                "add",
                "224.0.0.0/4",
                "dev",
                PORT_NAME,
            ],
        ];
        for step in steps {
            if let Err(e) = sys::run(step) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        }
    }
    Ok(child)
}

/// Entry point of `longhaul lab __emulate --name NAME`.
pub fn emulate(name: &str) -> i32 {
    // Blocked before any thread exists, so only the driver's signalfd sees them.
    if let Err(e) = signals::block_stop() {
        println!("error: blocking signals: {e}");
        return 1;
    }
    let supervisor = std::os::unix::process::parent_id();
    let (driver, handle) = match prepare(name) {
        Ok(d) => d,
        Err(e) => {
            println!("error: {e:#}");
            return 1;
        }
    };
    println!("tuns");
    stdout_to_log();
    let code = match driver.run() {
        Ok(snap) => {
            let hosts: Vec<String> = snap
                .hosts
                .iter()
                .map(|h| {
                    format!(
                        "{} {}/{} pkts",
                        h.name, h.up.counters.delivered_pkts, h.down.counters.delivered_pkts
                    )
                })
                .collect();
            eprintln!(
                "emulator stopped after {} ms: {}",
                snap.uptime_ms,
                hosts.join(", ")
            );
            0
        }
        Err(e) => {
            eprintln!("emulator failed: {e}");
            1
        }
    };
    drop(handle);
    if std::os::unix::process::parent_id() != supervisor {
        eprintln!("supervisor gone: removing the lab myself");
        ops::teardown(name);
    }
    code
}

fn prepare(name: &str) -> Result<(Driver, Handle)> {
    let cfg = read_config(name)?;
    let dir = cfg.dir();
    let offload = if cfg.offload {
        Offload::Segmentation
    } else {
        Offload::None
    };
    let mut tuns = Vec::new();
    for h in &cfg.hosts {
        let ns = Path::new("/run/netns").join(cfg.netns(&h.name));
        let tun = Tun::create_in(&ns, PORT_NAME, offload);
        tuns.push(tun.with_context(|| format!("host {}", h.name))?);
    }
    let pcap = match &cfg.pcap {
        Some(p) => Some((
            std::fs::File::create(p).with_context(|| format!("--pcap {}", p.display()))?,
            cfg.snaplen,
        )),
        None => None,
    };
    let mut hub = Hub::new(&cfg.hub_config());
    // The schedule waits for the lab to be ready: `up` starts it then (or
    // `lab run` as each tool starts).
    hub.hold_schedule();
    let (driver, handle) = Driver::new(
        hub,
        tuns,
        Options {
            pcap,
            batch_ns: BATCH_NS,
            stop_signals: Some(signals::stop_set()),
        },
    )?;
    let sock = ctl_path(&dir);
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).with_context(|| format!("{}", sock.display()))?;
    let h = handle.clone();
    std::thread::spawn(move || control(listener, h));
    write_pid(&dir, EMULATE, std::process::id())?;
    Ok((driver, handle))
}

/// Serves `stats` (one JSON snapshot), `schedule start` and `schedule hold`
/// (the links' schedule clock; the snapshot taken as it changed) and `stop`
/// on the control socket.
fn control(listener: UnixListener, handle: Handle) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let mut line = String::new();
        let Ok(reader) = conn.try_clone() else {
            continue;
        };
        if BufReader::new(reader).read_line(&mut line).is_err() {
            continue;
        }
        match line.trim() {
            "stats" => {
                let Some(snap) = handle.snapshot() else {
                    return;
                };
                let _ = serde_json::to_writer(&mut conn, &snap);
            }
            "schedule start" | "schedule hold" => {
                let op = if line.trim().ends_with("start") {
                    ScheduleOp::Start
                } else {
                    ScheduleOp::Hold
                };
                let Some(snap) = handle.schedule(op) else {
                    return;
                };
                let _ = serde_json::to_writer(&mut conn, &snap);
            }
            "stop" => {
                handle.stop();
                return;
            }
            other => {
                let _ = writeln!(conn, "{{\"error\":\"unknown request '{other}'\"}}");
            }
        }
    }
}
