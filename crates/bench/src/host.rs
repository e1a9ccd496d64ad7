//! Host settings a run changes (and restores through [`crate::live`]):
//! the allowed congestion controls, buffer limits, a tmpfs for receivers;
//! and what the machine is, for results.json.

use crate::live::{live, ALLOWED_CC};
use anyhow::{Context, Result};
use longhaul_lab::topology::LabConfig;
use std::collections::BTreeMap;
use std::path::Path;

pub(crate) fn mount_tmpfs(dir: &Path, size: u64) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let size = format!("size={size}");
    crate::stage::mount(&["-t", "tmpfs", "-o", &size], Path::new("lhrun"), dir)?;
    live().mount = Some(dir.to_path_buf());
    Ok(())
}

pub(crate) const CORE_MAX: [&str; 2] =
    ["/proc/sys/net/core/rmem_max", "/proc/sys/net/core/wmem_max"];

/// Caps the hosts' TCP autotuning at `max` bytes; raises the host's
/// net.core.rmem_max/wmem_max to it if they are lower (restored at the end),
/// so programs that set their own buffer may ask for that much.
pub(crate) fn set_tcp_max(cfg: &LabConfig, max: u64) -> Result<()> {
    for f in CORE_MAX {
        let now: u64 = std::fs::read_to_string(f)?.trim().parse().unwrap_or(0);
        if now < max {
            live().core_restore.push((f, now));
            std::fs::write(f, max.to_string()).with_context(|| format!("raising {f}"))?;
        }
    }
    for h in &cfg.hosts {
        longhaul_lab::sys::in_netns(&cfg.netns(&h.name), || {
            for (f, def) in [("tcp_rmem", 131_072), ("tcp_wmem", 16_384)] {
                std::fs::write(
                    format!("/proc/sys/net/ipv4/{f}"),
                    format!("4096 {} {max}", def.min(max)),
                )
                .with_context(|| format!("setting {f} in host {}", h.name))?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Sets the kernel congestion control of every host; allows it globally
/// first if the namespaces may not choose it (restored at the end).
pub(crate) fn set_cc(cfg: &LabConfig, cc: &str) -> Result<()> {
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
        longhaul_lab::sys::in_netns(&cfg.netns(&h.name), || {
            std::fs::write("/proc/sys/net/ipv4/tcp_congestion_control", cc)
                .with_context(|| format!("setting {cc} in host {}", h.name))
        })?;
    }
    Ok(())
}

pub(crate) fn machine() -> BTreeMap<String, String> {
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
