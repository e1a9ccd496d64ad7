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

/// A descriptor that becomes readable when our child `pid` exits (a
/// pidfd); None where the kernel has none.
pub(crate) fn exit_fd(pid: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a descriptor the call just opened, owned by no one else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits up to `timeout` for one of `fds` ([`exit_fd`]) to become
/// readable: a child has exited, and is timed by that instant, not by the
/// end of a sleep. None to wait for: returns at once.
pub(crate) fn wait_exit(fds: &[&std::os::fd::OwnedFd], timeout: Duration) {
    use std::os::fd::AsRawFd;
    if fds.is_empty() {
        return;
    }
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: poll over descriptors we hold, with their count.
    unsafe {
        libc::poll(
            polled.as_mut_ptr(),
            polled.len() as libc::nfds_t,
            timeout.as_millis().min(i32::MAX as u128) as i32,
        )
    };
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

/// Why a tool failed, from its log, in its own words where it gave any: the
/// last line that says something ("Permission denied", "No such file", an
/// error), not a protocol's closing line ("550 End."), shortened. A bare
/// FTP-family reply code is explained.
pub(crate) fn why(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    why_in(&text)
}

fn why_in(text: &str) -> String {
    const TELLING: [&str; 13] = [
        "denied",
        "permission",
        "no such",
        "not found",
        "refused",
        "error",
        "failed",
        "cannot",
        "can't",
        "timed out",
        "unreachable",
        "no space",
        "not allowed",
    ];
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // "550 End.", "550-", "226": a reply code with nothing to say.
    let bare = |l: &str| {
        let rest = l.get(3..).unwrap_or("");
        l.as_bytes()
            .get(..3)
            .is_some_and(|b| b.iter().all(u8::is_ascii_digit))
            && matches!(
                rest.trim_matches(|c: char| c == '-' || c == ' ' || c == '.')
                    .to_ascii_lowercase()
                    .as_str(),
                "" | "end"
            )
    };
    let said = |l: &&&str| {
        let low = l.to_ascii_lowercase();
        TELLING.iter().any(|w| low.contains(w))
    };
    let line = lines
        .iter()
        .rev()
        .filter(|l| !bare(l))
        .find(said)
        .or_else(|| lines.iter().rev().find(|l| !bare(l)))
        .or(lines.last())
        .copied()
        .unwrap_or("");
    let mut out: String = line.chars().take(200).collect();
    let code = |c: &str| line.starts_with(c) || line.contains(&format!(" {c} "));
    if code("550") || code("553") {
        out.push_str(" (the peer's server refused the path: no such file, or no permission)");
    } else if code("530") {
        out.push_str(" (the peer's server refused the login)");
    }
    out
}

/// Fields 3 on of /proc/PID/stat (after the command name, which may hold
/// spaces and parentheses).
pub(crate) fn stat_fields(pid: i32) -> Option<Vec<f64>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    // The state (a letter) reads as NaN; the rest are numbers.
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(f64::NAN))
            .collect(),
    )
}

/// Clock ticks per second, the unit of /proc's CPU times.
pub(crate) fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64
}

/// CPU seconds (user + system) so far of each process a daemon started
/// (the leader of process group `pgid`) but the leader: the members of its
/// group, and its descendants that left it (sshd's sessions call setsid:
/// scp's, rsync's and qcp's server side run there), and any of `known`
/// still alive. wait4 on the leader counts them only if the leader waited
/// for them, and some daemons (GridFTP's) let them be reaped without it, or
/// are stopped while a session still winds down.
pub(crate) fn daemon_processes_cpu(pgid: i32, known: &[i32]) -> Vec<(i32, f64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let hz = clock_ticks();
    // (pid, parent, group, CPU s) of every process.
    let all: Vec<(i32, i32, i32, f64)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let f = stat_fields(pid)?;
            // ppid is field 4, pgrp 5, utime 14, stime 15 (indexes 1, 2, 11, 12 here).
            Some((
                pid,
                *f.get(1)? as i32,
                *f.get(2)? as i32,
                (f.get(11)? + f.get(12)?) / hz,
            ))
        })
        .collect();
    let mut ours: std::collections::HashSet<i32> = std::collections::HashSet::from([pgid]);
    ours.extend(all.iter().filter(|p| p.2 == pgid).map(|p| p.0));
    // Descendants, to a fixed point (a parent may be listed after its child).
    loop {
        let before = ours.len();
        let children: Vec<i32> = all
            .iter()
            .filter(|p| ours.contains(&p.1))
            .map(|p| p.0)
            .collect();
        ours.extend(children);
        if ours.len() == before {
            break;
        }
    }
    all.iter()
        .filter(|p| p.0 != pgid && (ours.contains(&p.0) || known.contains(&p.0)))
        .map(|p| (p.0, p.3))
        .collect()
}

/// CPU seconds of the children `pid` has waited for (cutime + cstime).
pub(crate) fn waited_children_cpu(pid: i32) -> f64 {
    stat_fields(pid)
        .and_then(|f| Some((f.get(13)? + f.get(14)?) / clock_ticks()))
        .unwrap_or(0.0)
}

/// The CPU of a daemon's forked children, watched while it runs: what
/// each process it started (see [`daemon_processes_cpu`]) other than the
/// leader was last seen to have used.
#[derive(Default)]
pub(crate) struct Forked(std::collections::HashMap<i32, f64>);

impl Forked {
    /// Looks at the group's members now.
    pub(crate) fn look(&mut self, pgid: i32) {
        let known: Vec<i32> = self.0.keys().copied().collect();
        for (pid, cpu) in daemon_processes_cpu(pgid, &known) {
            self.0.insert(pid, cpu);
        }
    }

    /// What the children used beyond what the leader, having waited for
    /// them, already counts (`waited`).
    pub(crate) fn beyond(&self, waited: f64) -> f64 {
        (self.0.values().sum::<f64>() - waited).max(0.0)
    }

    /// Stops the group `pgid` leads ([`stop`]) after a last look: the
    /// leader's CPU seconds and what its children used beyond them.
    pub(crate) fn stop(&mut self, pgid: i32) -> f64 {
        self.look(pgid);
        let waited = waited_children_cpu(pgid);
        stop(pgid) + self.beyond(waited)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_childs_exit_ends_the_wait_at_once_and_it_can_be_reaped() {
        let child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let fd = super::exit_fd(pid).expect("pidfd_open");
        let t0 = std::time::Instant::now();
        // Still running: the wait ends with its timeout, nothing to reap.
        super::wait_exit(&[&fd], std::time::Duration::from_millis(20));
        assert_eq!(super::reap(pid), None);
        // Then it ends long before the 30 s asked for, at the exit.
        super::wait_exit(&[&fd], std::time::Duration::from_secs(30));
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
        let (status, _) = super::reap(pid).expect("exited");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        std::mem::forget(child);
    }

    /// Runs `script` as a group leader whose children burn CPU, watches it
    /// as the runner watches a daemon until they have used 0.05 s, then
    /// kills all of them: what was seen, the leader's pid, and the group
    /// each process seen was in while alive.
    fn watch(script: &str) -> (super::Forked, i32, Vec<(i32, i32)>) {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        let mut f = super::Forked::default();
        let t0 = std::time::Instant::now();
        while f.0.values().sum::<f64>() < 0.05 && t0.elapsed().as_secs() < 4 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            f.look(pgid);
        }
        let groups: Vec<(i32, i32)> =
            f.0.keys()
                .filter_map(|&p| Some((p, *super::stat_fields(p)?.get(2)? as i32)))
                .collect();
        // SAFETY: signalling the processes this test started.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
            for (p, _) in &groups {
                libc::kill(*p, libc::SIGKILL);
            }
        }
        let _ = child.wait();
        (f, pgid, groups)
    }

    const BUSY: &str = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 5";

    #[test]
    fn a_forked_child_is_seen_in_its_group() {
        // A group leader that forks a busy child and does not wait for it.
        let (f, _, _) = watch(&format!("({BUSY}) & sleep 5"));
        assert!(f.0.len() >= 2, "the subshell and its sleep: {:?}", f.0);
        assert!(f.beyond(0.0) >= 0.05, "{:?}", f.0);
        assert!(f.beyond(1e9) == 0.0);
        assert_eq!(super::waited_children_cpu(i32::MAX), 0.0);
    }

    /// sshd's sessions leave the daemon's group (setsid): scp's, rsync's
    /// and qcp's server side run there, and count as the daemon's.
    #[test]
    fn a_child_in_a_session_of_its_own_is_still_the_daemons() {
        let (f, pgid, groups) = watch(&format!("setsid sh -c '{BUSY}' & sleep 5"));
        assert!(f.beyond(0.0) >= 0.05, "{:?}", f.0);
        assert!(groups.iter().any(|&(_, g)| g != pgid), "{groups:?}");
    }
}
