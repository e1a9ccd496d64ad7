//! What an interrupted run must clean up: a process-wide record of the
//! run's lab, process groups, mounts and host settings, removed on Ctrl-C and
//! at the end ([`clean_up`]).

use longhaul_lab::ops;
use std::path::PathBuf;
use std::sync::Mutex;

/// What an interrupted run must clean up.
#[derive(Default)]
pub(crate) struct Live {
    pub(crate) lab: Option<String>,
    pub(crate) groups: Vec<i32>,
    pub(crate) cc_restore: Option<String>,
    pub(crate) mount: Option<PathBuf>,
    /// The run's staged directories (see `stage`).
    pub(crate) stage: Option<PathBuf>,
    /// Host-wide buffer limits raised for a scenario: (file, old value).
    pub(crate) core_restore: Vec<(&'static str, u64)>,
}

pub(crate) static LIVE: Mutex<Live> = Mutex::new(Live {
    lab: None,
    groups: Vec::new(),
    cc_restore: None,
    mount: None,
    stage: None,
    core_restore: Vec::new(),
});

pub(crate) fn live() -> std::sync::MutexGuard<'static, Live> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes whatever a run has up (processes, lab, mount, host setting);
/// used on Ctrl-C and at the end.
pub fn clean_up() {
    let mut l = live();
    for g in l.groups.drain(..) {
        // SAFETY: signalling a process group we created.
        unsafe { libc::kill(-g, libc::SIGKILL) };
    }
    if let Some(lab) = l.lab.take() {
        ops::teardown(&lab);
    }
    if let Some(m) = l.mount.take() {
        crate::stage::unmount(&m);
    }
    if let Some(root) = l.stage.take() {
        crate::stage::unstage(&root);
    }
    if let Some(old) = l.cc_restore.take() {
        let _ = std::fs::write(ALLOWED_CC, old);
    }
    for (f, old) in l.core_restore.drain(..).rev() {
        let _ = std::fs::write(f, old.to_string());
    }
}

pub(crate) const ALLOWED_CC: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
