//! The system calls and commands the lab needs: iproute2 for namespaces and
//! addresses, /proc for identifying our own processes, signals by PID.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs a command to completion; the error carries the command and its stderr.
pub fn run(args: &[&str]) -> Result<()> {
    output(args).map(|_| ())
}

/// Runs a command and returns its stdout.
pub fn output(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", args[0]))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The process's command line, if it exists.
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// True if `pid` is a live process of ours running `role` for lab `lab`
/// (guards against signalling a recycled PID).
pub fn is_lab_process(pid: i32, role: &str, lab: &str) -> bool {
    let Some(args) = cmdline(pid) else {
        return false;
    };
    // A zombie has an empty cmdline; it is no longer running.
    args.iter().any(|a| a == role) && args.windows(2).any(|w| w[0] == "--name" && w[1] == lab)
}

/// Sends `sig` to `pid`, ignoring failure (no such process, not permitted).
pub fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, sig) };
}

/// Waits until `pid` is gone (or is a zombie), up to `limit`.
pub fn wait_gone(pid: i32, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        let gone = match state {
            None => true,
            // Field 3, after the ")" that ends the command name.
            Some(s) => s
                .rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
                .unwrap_or(true),
        };
        if gone {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Terminates processes: SIGTERM, then SIGKILL for those still there after `grace`.
pub fn terminate(pids: &[i32], grace: Duration) {
    let me = std::process::id() as i32;
    let pids: Vec<i32> = pids.iter().copied().filter(|&p| p != me && p > 1).collect();
    for &p in &pids {
        signal(p, libc::SIGTERM);
    }
    let end = Instant::now() + grace;
    for &p in &pids {
        let left = end.saturating_duration_since(Instant::now());
        if !wait_gone(p, left) {
            signal(p, libc::SIGKILL);
            wait_gone(p, Duration::from_secs(2));
        }
    }
}

/// Named network namespaces (those `ip netns` knows).
pub fn netns_list() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// True if named network namespace `ns` exists (`/run/netns/NS`).
pub fn netns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// PIDs of processes inside a namespace.
pub fn netns_pids(ns: &str) -> Vec<i32> {
    output(&["ip", "netns", "pids", ns])
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Runs `f` on a thread that has entered network namespace `ns`.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    use std::os::fd::AsRawFd;
    let path = Path::new("/run/netns").join(ns);
    let file = std::fs::File::open(&path).with_context(|| format!("{}", path.display()))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns affects this short-lived thread only.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                bail!("entering {ns}: {}", std::io::Error::last_os_error());
            }
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread in {ns} panicked"))?
    })
}

/// PIDs of live processes running `role` for lab `lab`, found in /proc (for
/// labs whose pid files are gone).
pub fn find_lab_processes(role: &str, lab: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| is_lab_process(pid, role, lab))
        .collect()
}
