//! `longhaul lab ...`: wiring from arguments to `longhaul-lab` (the lab) and `longhaul-bench` (suites, runs, reports), and the output.

use crate::lab_args::{LabCommand, ProbeCommand, UpArgs};
use anyhow::{Context, Result};
use longhaul_bench::results::Status;
use longhaul_bench::scenario::Suite;
use longhaul_bench::tools::Tool;
use longhaul_bench::{report, runner};
use longhaul_lab::topology::{LabConfig, LinkArgs};
use longhaul_lab::{daemon, ops, probe, topology};
use longhaul_netem::driver::ScheduleOp;
use longhaul_netem::hub::DirStats;
use std::time::Duration;

/// Runs a lab command; returns the exit status.
pub fn run(cmd: LabCommand) -> Result<i32> {
    let exe = std::env::current_exe().context("locating the longhaul executable")?;
    match cmd {
        LabCommand::Up(a) => up(a, &exe),
        LabCommand::Down(a) => {
            let r = ops::down(&a.lab.name, a.all)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else if r.stopped.is_empty() && r.stale.is_empty() {
                println!("no lab '{}' is up; nothing to remove", a.lab.name);
            } else {
                for l in &r.stopped {
                    println!("lab '{l}' stopped");
                }
                for l in &r.stale {
                    println!("stale lab '{l}' removed");
                }
                println!("{} namespaces removed", r.namespaces.len());
            }
            Ok(0)
        }
        LabCommand::Exec(a) => {
            ops::exec(&a.lab.name, &a.host, &a.command)?;
            unreachable!("exec returns only on error")
        }
        LabCommand::Stats(a) => {
            let snap = ops::stats(&a.lab.name)?;
            if a.json {
                let mut v = serde_json::to_value(&snap)?;
                v["lab"] = a.lab.name.clone().into();
                println!("{}", serde_json::to_string(&v)?);
            } else {
                print_stats(&a.lab.name, &snap);
            }
            Ok(0)
        }
        LabCommand::Schedule(a) => {
            let op = match a.action.as_str() {
                "start" => ScheduleOp::Start,
                _ => ScheduleOp::Hold,
            };
            let snap = ops::schedule(&a.lab.name, op)?;
            if a.json {
                let mut v = serde_json::to_value(&snap)?;
                v["lab"] = a.lab.name.clone().into();
                println!("{}", serde_json::to_string(&v)?);
            } else if snap.schedule.is_none() {
                println!(
                    "lab '{}': no link has a schedule (outage=, rate=RATE@START)",
                    a.lab.name
                );
            } else {
                print_schedule(&snap);
            }
            Ok(0)
        }
        LabCommand::Probe(p) => probe_cmd(p),
        LabCommand::Run(a) => {
            let mut suite = Suite::load(&a.suite).map_err(|e| crate::usage(format!("{e:#}")))?;
            if let Some(globs) = &a.scenarios {
                suite
                    .keep_scenarios(globs)
                    .map_err(|e| crate::usage(format!("--scenarios: {e:#}")))?;
            }
            let tools = a
                .tools
                .map(|ts| {
                    for t in &ts {
                        t.parse::<longhaul_bench::tools::ToolSpec>()
                            .map_err(|e| crate::usage(format!("--tools: {e}")))?;
                    }
                    Ok::<_, anyhow::Error>(ts)
                })
                .transpose()?;
            let out = a
                .out
                .unwrap_or_else(|| format!("lab-results/{}", suite.suite.name).into());
            let mut command = format!("longhaul lab run {}", a.suite);
            if a.profile != "standard" {
                command += &format!(" --profile {}", a.profile);
            }
            if let Some(s) = &a.scenarios {
                command += &format!(" --scenarios '{}'", s.join(","));
            }
            if let Some(t) = &tools {
                command += &format!(" --tools {}", t.join(","));
            }
            if let Some(n) = a.repeat {
                command += &format!(" --repeat {n}");
            }
            let opts = runner::Options {
                exe,
                out,
                profile: a.profile,
                tools,
                repeat: a.repeat,
                progress: !a.json,
                lab: a.lab,
                command,
            };
            run_suite(&suite, opts, a.json)
        }
        LabCommand::Demo(a) => {
            let suite = Suite::load("demo")?;
            if !a.no_install {
                let demo: Vec<Tool> = ["longhaul", "rsync", "ftp"]
                    .iter()
                    .map(|t| t.parse().expect("a built-in tool"))
                    .collect();
                install(&demo, false)?;
                if longhaul_bench::tools::which("ip").is_none() {
                    apt_install(&["iproute2"])?;
                }
            }
            let out = a.out.unwrap_or_else(|| "lab-results/demo".into());
            let opts = runner::Options {
                exe,
                out,
                profile: "full".into(),
                tools: None,
                repeat: None,
                progress: !a.json,
                lab: runner::DEFAULT_LAB.into(),
                command: "longhaul lab demo".into(),
            };
            run_suite(&suite, opts, a.json)
        }
        LabCommand::Report(a) => {
            let r = report::load(&a.dir)?;
            report::write_all(&a.dir, &r)?;
            print!("{}", report::table(&r));
            println!("reports: {}", a.dir.display());
            Ok(0)
        }
        LabCommand::Table(a) => {
            let choice = longhaul_bench::numbers::Choice {
                figure: a.figure,
                ours: a.ours,
                peers: a.peers,
                cpu: a.cpu,
                scenarios: a.scenarios,
            };
            let all = a
                .dirs
                .iter()
                .map(|d| report::load(d))
                .collect::<Result<Vec<_>>>()?;
            let tables: Vec<&[_]> = match a.merge {
                true => vec![&all[..]],
                false => all.chunks(1).collect(),
            };
            for (i, sources) in tables.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print!("{}", longhaul_bench::numbers::table(sources, &choice));
            }
            Ok(0)
        }
        LabCommand::Compare(a) => {
            let load = |dirs: &[std::path::PathBuf]| {
                dirs.iter()
                    .map(|d| report::load(d))
                    .collect::<Result<Vec<_>>>()
            };
            let choice = longhaul_bench::compare::Choice {
                tool: a.tool,
                scenarios: a.scenarios,
            };
            print!(
                "{}",
                longhaul_bench::compare::table(&load(&a.before)?, &load(&a.after)?, &choice)
            );
            Ok(0)
        }
        LabCommand::Deps(a) => {
            let tools = parse_tools(a.tools.as_deref())?.unwrap_or_else(Tool::all);
            install(&tools, a.dry_run)?;
            Ok(0)
        }
        LabCommand::Supervise(n) => Ok(daemon::supervise(&n.name, &exe)),
        LabCommand::Emulate(n) => Ok(daemon::emulate(&n.name)),
    }
}

fn up(a: UpArgs, exe: &std::path::Path) -> Result<i32> {
    let seed = a.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        t ^ ((std::process::id() as u64) << 32)
    });
    let mut cfg = LabConfig::new(
        &a.lab.name,
        &a.hosts,
        LinkArgs {
            default: a.link.as_deref(),
            per_host: &a.link_to,
            sites: &a.site,
        },
        seed,
        a.mtu,
    )
    .map_err(|e| crate::usage(format!("{e:#}")))?;
    if let Some(p) = &a.pcap {
        // The emulator runs elsewhere: give it an absolute path.
        let abs = std::path::absolute(p).with_context(|| format!("--pcap {}", p.display()))?;
        cfg.pcap = Some(abs);
        cfg.snaplen = a.snaplen;
    }
    cfg.offload = !a.no_offload;
    ops::up(&cfg, exe)?;
    if a.json {
        let hosts: Vec<serde_json::Value> = cfg
            .hosts
            .iter()
            .map(|h| {
                serde_json::json!({
                    "name": h.name, "addr": h.addr, "netns": cfg.netns(&h.name),
                    "link": h.link.to_string(),
                })
            })
            .collect();
        let v = serde_json::json!({"lab": cfg.name, "seed": cfg.seed, "mtu": cfg.mtu,
                "offload": cfg.offload, "hosts": hosts, "sites": cfg.sites.iter().map(|s| {
                    serde_json::json!({"name": s.name, "link": s.link.to_string(),
                        "hosts": s.ports.iter().map(|&p| &cfg.hosts[p as usize].name).collect::<Vec<_>>()})
                }).collect::<Vec<_>>()});
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    println!(
        "lab '{}' is up (seed {}, MTU {}):",
        cfg.name, cfg.seed, cfg.mtu
    );
    let w = cfg.hosts.iter().map(|h| h.name.len()).max().unwrap_or(4);
    for h in &cfg.hosts {
        println!(
            "  {:w$}  {:<11} {:<24} {}",
            h.name,
            h.addr.to_string(),
            cfg.netns(&h.name),
            h.link
        );
    }
    for site in &cfg.sites {
        let members: Vec<&str> = site
            .ports
            .iter()
            .map(|&p| cfg.hosts[p as usize].name.as_str())
            .collect();
        println!(
            "  site {} of {}: {}",
            site.name,
            members.join(", "),
            site.link
        );
    }
    let name = if cfg.name == topology::DEFAULT_LAB {
        String::new()
    } else {
        format!(" --name {}", cfg.name)
    };
    let (first, second) = (&cfg.hosts[0].name, &cfg.hosts[1].name);
    println!("run in a host:  longhaul lab exec{name} {second} -- ping -c 3 {first}");
    println!("counters:       longhaul lab stats{name}");
    println!("remove it all:  longhaul lab down{name}");
    Ok(0)
}

fn human_bytes(b: u64) -> String {
    longhaul_transfer::units::show_size(b)
}

/// Rate over the last second of the series, bit/s.
fn recent_rate(d: &DirStats) -> f64 {
    let s = &d.series.bytes;
    let n = s.len().min(10);
    if n == 0 {
        return 0.0;
    }
    // The newest bucket is still filling: skip it.
    let full: u64 = s.iter().rev().skip(1).take(n.saturating_sub(1)).sum();
    full as f64 * 8.0 / ((n.saturating_sub(1)).max(1) as f64 * 0.1)
}

/// A rate for people: `100 Mbit/s`, `256 kbit/s`, `unlimited`.
fn show_rate(bps: Option<u64>) -> String {
    match bps {
        None => "unlimited".into(),
        Some(b) if b >= 1_000_000_000 => format!("{} Gbit/s", b as f64 / 1e9),
        Some(b) if b >= 1_000_000 => format!("{} Mbit/s", b as f64 / 1e6),
        Some(b) => format!("{} kbit/s", b as f64 / 1e3),
    }
}

/// The schedule clock, and each scheduled direction: its outages and rate
/// steps, whether it is down now, its rate, and when it next changes.
fn print_schedule(s: &longhaul_netem::Snapshot) {
    let Some(clock) = &s.schedule else { return };
    match (clock.started_ms, clock.elapsed_ms) {
        (Some(at), Some(t)) => println!(
            "schedule clock: {:.1} s (started {:.1} s after the emulator; `lab schedule start` restarts it at 0)",
            t as f64 / 1000.0,
            at as f64 / 1000.0
        ),
        _ => println!(
            "schedule clock: held, every link at its base spec (`lab schedule start` starts it)"
        ),
    }
    for h in &s.hosts {
        for (dir, d) in [("up", &h.up), ("down", &h.down)] {
            let Some(now) = &d.schedule else { continue };
            println!(
                "  {:<10} {:<4} {}: {}, {}{}",
                h.name,
                dir,
                now.schedule.tokens().join(" "),
                if now.down { "DOWN" } else { "up" },
                show_rate(now.rate_bps),
                now.next_change_ms.map_or(String::new(), |t| format!(
                    ", next change at {:.1} s",
                    t as f64 / 1000.0
                ))
            );
        }
    }
}

fn print_stats(name: &str, s: &longhaul_netem::Snapshot) {
    println!(
        "lab '{name}': up {:.1} s, seed {}, {} buffers in use ({} allocated)",
        s.uptime_ms as f64 / 1000.0,
        s.seed,
        s.buffered_packets,
        human_bytes(s.buffer_bytes)
    );
    println!(
        "{:<10} {:<4} {:>10} {:>11} {:>8} {:>8} {:>8} {:>10} {:>11} {:>6} {:>9} {:>9} {:>10}",
        "HOST",
        "DIR",
        "OFFERED",
        "BYTES",
        "LOST",
        "QDROP",
        "DOWNDROP",
        "DELIVERED",
        "BYTES",
        "QHWM",
        "LATE avg",
        "LATE max",
        "RATE 1s"
    );
    let row = |name: &str, dir: &str, d: &DirStats| {
        let c = &d.counters;
        println!(
            "{:<10} {:<4} {:>10} {:>11} {:>8} {:>8} {:>8} {:>10} {:>11} {:>6} {:>7}us {:>7}us {:>6.1} Mb/s",
            name,
            dir,
            c.offered_pkts,
            human_bytes(c.offered_bytes),
            c.lost_pkts,
            c.queue_drop_pkts,
            c.outage_drop_pkts,
            c.delivered_pkts,
            human_bytes(c.delivered_bytes),
            c.queue_hwm_pkts,
            c.late.mean_ns() / 1000,
            c.late.max_ns / 1000,
            recent_rate(d) / 1e6
        );
    };
    for h in &s.hosts {
        row(&h.name, "up", &h.up);
        row(&h.name, "down", &h.down);
    }
    for site in &s.sites {
        let name = format!("[{}]", site.name);
        row(&name, "up", &site.up);
        row(&name, "down", &site.down);
    }
    for h in &s.hosts {
        println!("{:<10} {} link: {}", h.name, h.addr, h.link);
    }
    for site in &s.sites {
        println!(
            "[{}] site of {}: link {}",
            site.name,
            site.hosts.join(", "),
            site.link
        );
    }
    print_schedule(s);
    let hub = &s.hub;
    if hub.not_ipv4 + hub.malformed + hub.unroutable + hub.pool_exhausted > 0 {
        println!(
            "hub drops: {} not IPv4, {} malformed, {} unroutable, {} for want of buffers",
            hub.not_ipv4, hub.malformed, hub.unroutable, hub.pool_exhausted
        );
    }
    println!(
        "packets are counted on the wire; {} TSO/USO aggregates came in, {} trains were cut from them",
        hub.aggregates_in, hub.trains_cut
    );
    println!(
        "{} flows (per-flow bytes and the 100 ms series: --json)",
        s.flows.len()
    );
}

fn parse_tools(names: Option<&[String]>) -> Result<Option<Vec<Tool>>> {
    names
        .map(|ns| {
            ns.iter()
                .map(|n| {
                    n.parse::<Tool>()
                        .map_err(|e| crate::usage(format!("--tools: {e}")))
                })
                .collect::<Result<Vec<_>>>()
        })
        .transpose()
}

/// Installs the Debian packages of `tools` that provide a missing program.
fn install(tools: &[Tool], dry_run: bool) -> Result<()> {
    let mut pkgs: Vec<&str> = Vec::new();
    for t in tools {
        if !t.missing().is_empty() {
            for p in t.packages() {
                if !pkgs.contains(p) {
                    pkgs.push(p);
                }
            }
        }
    }
    if dry_run {
        if !pkgs.is_empty() {
            println!("apt-get install -y {}", pkgs.join(" "));
        }
        for t in tools.iter().filter(|t| !t.missing().is_empty()) {
            if let Some(cmd) = t.cargo_command() {
                println!("{cmd}");
            }
            for s in t.sources() {
                println!(
                    "g++ {} {}/{} -o {}/{} {}",
                    s.flags.join(" "),
                    s.dir,
                    s.file,
                    longhaul_bench::tools::BUILT,
                    s.program,
                    s.libs.join(" ")
                );
            }
        }
        return Ok(());
    }
    if pkgs.is_empty() {
        eprintln!("peer tools: all installed");
    } else {
        apt_install(&pkgs)?;
    }
    for t in tools {
        for p in t.build_missing()? {
            eprintln!("built {p} into {}", longhaul_bench::tools::BUILT);
        }
    }
    Ok(())
}

/// apt-get install, updating the package lists first if that fails. The
/// packages' own services (uftpd, the GridFTP and FTP servers) must not
/// start on the host: the lab starts them in its hosts, and only while a
/// tool runs. Without a policy-rc.d of the machine's, one that forbids
/// starting services is in place while apt-get runs.
fn apt_install(pkgs: &[&str]) -> Result<()> {
    const POLICY: &str = "/usr/sbin/policy-rc.d";
    let ours = !std::path::Path::new(POLICY).exists();
    if ours {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(
            POLICY,
            "#!/bin/sh\n# longhaul lab deps: no services during install\nexit 101\n",
        )?;
        std::fs::set_permissions(POLICY, std::fs::Permissions::from_mode(0o755))?;
    }
    let r = apt_install_inner(pkgs);
    if ours {
        let _ = std::fs::remove_file(POLICY);
    }
    r
}

fn apt_install_inner(pkgs: &[&str]) -> Result<()> {
    eprintln!("installing {} (apt-get) ...", pkgs.join(" "));
    let ok = |c: &mut std::process::Command| c.status().is_ok_and(|s| s.success());
    let apt = || {
        let mut c = std::process::Command::new("apt-get");
        c.env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::process::Stdio::null());
        c
    };
    if !ok(apt()
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(pkgs))
    {
        // The package lists may be stale or absent on a fresh machine.
        ok(apt().args(["update", "-q"]));
        if !ok(apt()
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(pkgs))
        {
            anyhow::bail!("apt-get install {} failed", pkgs.join(" "));
        }
    }
    Ok(())
}

fn run_suite(suite: &Suite, opts: runner::Options, json: bool) -> Result<i32> {
    // Ctrl-C (or SIGTERM/SIGHUP) removes what the run has up, then exits.
    longhaul_lab::signals::block_stop()?;
    std::thread::spawn(|| {
        if longhaul_lab::signals::wait_stop().is_some() {
            eprintln!("interrupted: removing the lab and its processes");
            runner::clean_up();
            std::process::exit(130);
        }
    });
    let results = runner::run_suite(suite, &opts)?;
    let out = opts.out;
    report::write_all(&out, &results)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print!("{}", report::table(&results));
        println!(
            "results: {}/summary.md (and results.json, results.csv)",
            out.display()
        );
    }
    // A timeout is a measurement (the bytes it moved in the time cap); a
    // failure or a tree that differs is not.
    let failed = results
        .runs
        .iter()
        .any(|r| matches!(r.status, Status::Failed | Status::Unverified));
    Ok(if failed { 1 } else { 0 })
}

fn with_port(to: &str) -> String {
    if to.contains(':') {
        to.to_string()
    } else {
        format!("{to}:7077")
    }
}

fn probe_cmd(p: ProbeCommand) -> Result<i32> {
    match p {
        ProbeCommand::Echo { port } => {
            probe::echo(port)?;
            Ok(0)
        }
        ProbeCommand::Rtt {
            to,
            count,
            interval_ms,
            size,
            json,
        } => {
            let r = probe::rtt(
                &with_port(&to),
                count,
                Duration::from_millis(interval_ms),
                size,
            )?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{}/{} replies; rtt min {:.3} / mean {:.3} / max {:.3} ms",
                    r.received, r.sent, r.min_ms, r.mean_ms, r.max_ms
                );
            }
            Ok(if r.received == 0 { 1 } else { 0 })
        }
        ProbeCommand::Send {
            to,
            rate,
            size,
            count,
            duration,
            json,
        } => {
            let bps = if rate == "0" {
                0
            } else {
                longhaul_netem::spec::parse_rate(&rate).map_err(crate::usage)?
            };
            let r = probe::send(
                &with_port(&to),
                bps,
                size,
                count,
                Duration::from_secs_f64(duration.max(0.0)),
            )?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "sent {} datagrams ({}) in {:.2} s: {:.1} Mbit/s",
                    r.sent_pkts,
                    human_bytes(r.sent_bytes),
                    r.secs,
                    r.rate_bps / 1e6
                );
            }
            Ok(0)
        }
        ProbeCommand::Sink {
            port,
            group,
            idle_ms,
            max,
            json,
        } => {
            let r = probe::sink(
                port,
                group,
                Duration::from_millis(idle_ms),
                Duration::from_secs_f64(max.max(0.0)),
            )?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "received {} datagrams ({}) in {:.2} s; {} missing in {} bursts (mean {:.2}); steady {:.1} Mbit/s",
                    r.received_pkts,
                    human_bytes(r.received_bytes),
                    r.secs,
                    r.missing,
                    r.bursts,
                    r.mean_burst,
                    r.steady_rate_bps / 1e6
                );
            }
            Ok(0)
        }
    }
}
