//! The run's processes: spawned in a host's namespace in their own process
//! group (recorded in [`crate::live`]), reaped with their CPU time, stopped
//! by group, awaited until their port is ready.

use crate::live::live;
use crate::tools::{Proc, Proto};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn spawn(ns: &str, proc: &Proc, log: &Path) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let argv = &proc.argv;
    let out = std::fs::File::create(log)?;
    let mut c = Command::new("ip");
    if let Some(d) = &proc.cwd {
        c.current_dir(d);
    }
    c.args(["netns", "exec", ns])
        .args(argv)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    // The runner blocks the stop signals for its own handling; the tools must not inherit that.
    let set = longhaul_lab::signals::stop_set();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        c.pre_exec(move || {
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

pub(crate) fn reap(pid: i32) -> Option<(i32, f64)> {
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
pub(crate) fn stop(pid: i32) -> f64 {
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

pub(crate) fn forget_group(pid: i32) {
    live().groups.retain(|&g| g != pid);
}

/// Waits until `pid`'s network namespace has the port bound (TCP: listening).
pub(crate) fn wait_ready(pid: i32, (proto, port): (Proto, u16)) -> Result<()> {
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
pub(crate) fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    line.chars().take(200).collect()
}
