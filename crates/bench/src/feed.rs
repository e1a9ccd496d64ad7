//! Dissemination runs (a scenario's `feed`): a producer writes products
//! into the server's spool at a steady rate, as a weather service's
//! production chain does; each tool sends them to receivers that may join
//! late or restart; a station beside every receiver takes each product as
//! it lands (checks its bytes against the product's hash, notes when, and
//! removes it, as a station's processing would). Measured per receiver:
//! which products it had of those it was due, duplicates, corrupt copies,
//! and the latency from ready at the sender to verified at the receiver.

use crate::metrics::{machine_busy_s, up_bytes, CpuSplit};
use crate::proc::{reap, spawn, stat_fields, tail, wait_ready, Forked};
use crate::results::{FeedReceiver, FeedRun, Run, Status};
use crate::scenario::{Feed, Plan};
use crate::tools::{FeedCommands, FeedSetup, Host, Receiver, ToolSpec};
use anyhow::{Context, Result};
use longhaul_lab::ops;
use longhaul_lab::topology::LabConfig;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A product the producer wrote.
#[derive(Debug, Clone)]
struct Product {
    size: u64,
    hash: blake3::Hash,
    /// Seconds from the producer's start to its rename into the spool.
    ready: f64,
}

/// What the producer wrote so far, by name.
type Products = Arc<Mutex<BTreeMap<String, Product>>>;

/// Seed 000's mix: most products of 10-500 kB, one in 25 of 5-50 MB
/// (whole kB and MB, uniform within each).
fn product_size(rng: &mut u64) -> u64 {
    if next(rng).is_multiple_of(25) {
        (5 + next(rng) % 46) * 1_000_000
    } else {
        (10 + next(rng) % 491) * 1000
    }
}

/// splitmix64: a reproducible mix without a generator crate.
fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The bytes products are cut from (64 MiB, pseudo-random: nothing in
/// them compresses or repeats within a product).
fn block() -> Vec<u8> {
    let mut s = 0x6c68_7072_6f64_u64;
    let mut b = Vec::with_capacity(64 << 20);
    while b.len() < 64 << 20 {
        b.extend_from_slice(&next(&mut s).to_le_bytes());
    }
    b
}

/// The producer: writes products at `load_bps` until `until`, each under
/// a dot name in the spool, hard-linked into the outboxes whose receiver
/// has joined, then renamed in; removes spool entries older than `keep`.
#[allow(clippy::too_many_arguments)]
fn produce(
    spool: &Path,
    outboxes: &[(Option<usize>, PathBuf)],
    joined: &[AtomicBool],
    load_bps: u64,
    t0: Instant,
    until: Duration,
    keep: Duration,
    products: &Products,
) -> Result<()> {
    let data = block();
    let mut rng = 7u64;
    let mut sent = 0u64;
    let mut written: std::collections::VecDeque<(Instant, Vec<PathBuf>)> = Default::default();
    for n in 0u64.. {
        let due = t0 + Duration::from_secs_f64(sent as f64 * 8.0 / load_bps as f64);
        if due >= t0 + until {
            break;
        }
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let size = product_size(&mut rng);
        let off = (next(&mut rng) % (data.len() as u64 - size)) as usize;
        let bytes = &data[off..off + size as usize];
        let name = format!("p{n:06}.dat");
        let tmp = spool.join(format!(".{name}"));
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        let mut paths = Vec::new();
        for (who, dir) in outboxes {
            if who.is_none_or(|i| joined[i].load(Ordering::Relaxed)) {
                let link = dir.join(&name);
                std::fs::hard_link(&tmp, &link)?;
                paths.push(link);
            }
        }
        let path = spool.join(&name);
        std::fs::rename(&tmp, &path)?;
        paths.push(path);
        let ready = t0.elapsed().as_secs_f64();
        let hash = blake3::hash(bytes);
        products
            .lock()
            .expect("products")
            .insert(name, Product { size, hash, ready });
        written.push_back((Instant::now(), paths));
        // The spool's cleaner: a product older than the backlog goes, from
        // the spool and from an outbox whose loop has not taken it yet (a
        // tool that falls that far behind does not get it).
        while written.front().is_some_and(|(t, _)| t.elapsed() > keep) {
            let (_, old) = written.pop_front().expect("front");
            for p in old {
                let _ = std::fs::remove_file(p);
            }
        }
        sent += size;
    }
    Ok(())
}

/// What a station saw of its receiver's products.
#[derive(Debug, Default)]
struct Seen {
    /// Name → seconds from the producer's start to verified here.
    had: HashMap<String, f64>,
    duplicates: u64,
    /// Names whose file had other bytes when last looked at (a tool that
    /// writes in place may be mid-file: looked at again).
    mismatched: HashMap<String, u32>,
}

/// A station beside receiver `dst`: takes every product that lands there
/// (renamed in, or closed after writing), checks its hash, notes the time
/// and removes it; looks over the directory once a second as well (a tool
/// that writes in place, an event queue that overflowed). Runs until
/// `stop` is set.
fn station(dst: &Path, t0: Instant, products: &Products, seen: &Mutex<Seen>, stop: &AtomicBool) {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok();
    if let Some(i) = &ino {
        let _ = i.add_watch(
            dst,
            AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CLOSE_WRITE,
        );
    }
    let mut next_scan = Instant::now();
    let mut buf = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let mut names: Vec<String> = Vec::new();
        if let Some(i) = &ino {
            while let Ok(events) = i.read_events() {
                names.extend(
                    events
                        .into_iter()
                        .filter_map(|e| e.name.and_then(|n| n.into_string().ok())),
                );
            }
        }
        if Instant::now() >= next_scan {
            next_scan = Instant::now() + Duration::from_secs(1);
            if let Ok(rd) = std::fs::read_dir(dst) {
                names.extend(
                    rd.flatten()
                        .filter_map(|e| e.file_name().into_string().ok()),
                );
            }
        }
        for name in names {
            let Some(want) = products.lock().expect("products").get(&name).cloned() else {
                continue;
            };
            let path = dst.join(&name);
            buf.clear();
            let Ok(mut f) = std::fs::File::open(&path) else {
                continue;
            };
            if f.metadata().map(|m| m.len()).ok() != Some(want.size)
                || f.read_to_end(&mut buf).is_err()
            {
                continue;
            }
            let right = blake3::hash(&buf) == want.hash;
            let mut guard = seen.lock().expect("seen");
            let s = &mut *guard;
            if !right {
                *s.mismatched.entry(name).or_default() += 1;
                continue;
            }
            let now = t0.elapsed().as_secs_f64();
            s.mismatched.remove(&name);
            match s.had.entry(name) {
                std::collections::hash_map::Entry::Occupied(_) => s.duplicates += 1,
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(now);
                }
            }
            drop(guard);
            let _ = std::fs::remove_file(&path);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CPU seconds of this process (every thread; not its children).
fn self_cpu_s() -> f64 {
    // SAFETY: rusage is plain data, filled by the call.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Resident memory of every process in group `pgid`, kB.
fn group_rss_kb(pgid: i32) -> u64 {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        // (pgrp: field 5, index 2 after the name.)
        .filter(|&pid| stat_fields(pid).and_then(|f| f.get(2).copied()) == Some(f64::from(pgid)))
        .filter_map(|pid| {
            let st = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            st.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The nearest-rank percentile `q` (0 to 1) of sorted `v`.
fn pct(v: &[f64], q: f64) -> f64 {
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

/// Whether a receiver is due `p`: every product, or for one that joined
/// late (`joined`: seconds from the producer's start) those ready a second
/// after it joined.
fn due(p: &Product, joined: Option<f64>) -> bool {
    joined.is_none_or(|j| p.ready >= j + 1.0)
}

/// What a receiver had of what it was due, and when (`joined`: when a
/// late one joined).
fn receiver_result(
    products: &BTreeMap<String, Product>,
    seen: &Seen,
    joined: Option<f64>,
) -> FeedReceiver {
    let due = |p: &Product| due(p, joined);
    let mut r = FeedReceiver {
        due: products.values().filter(|p| due(p)).count() as u64,
        duplicates: seen.duplicates,
        corrupt: seen.mismatched.len() as u64,
        ..FeedReceiver::default()
    };
    let mut lat: Vec<(f64, f64)> = Vec::new();
    for (name, at) in &seen.had {
        let Some(p) = products.get(name) else {
            continue;
        };
        if due(p) {
            r.had += 1;
            lat.push((p.ready, (at - p.ready).max(0.0)));
        } else {
            r.extra += 1;
        }
    }
    lat.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut all: Vec<f64> = lat.iter().map(|x| x.1).collect();
    all.sort_by(f64::total_cmp);
    if !all.is_empty() {
        r.p50_s = Some(pct(&all, 0.5));
        r.p99_s = Some(pct(&all, 0.99));
        r.max_s = all.last().copied();
        r.percentiles = (0..=100).map(|k| pct(&all, f64::from(k) / 100.0)).collect();
    }
    for second in lat.chunk_by(|a, b| a.0.floor() == b.0.floor()) {
        let mut one: Vec<f64> = second.iter().map(|x| x.1).collect();
        one.sort_by(f64::total_cmp);
        r.latency_by_second.push((
            second[0].0.floor(),
            pct(&one, 0.5),
            *one.last().expect("a chunk is not empty"),
        ));
    }
    r
}

/// A process the run started: its group, its host, its log, and the CPU
/// of what it forked.
struct Running {
    pid: i32,
    log: PathBuf,
    forked: Forked,
}

impl Running {
    fn start(ns: &str, proc: &crate::tools::Proc, log: PathBuf) -> Result<Running> {
        Ok(Running {
            pid: spawn(ns, proc, &log)?,
            log,
            forked: Forked::default(),
        })
    }

    /// Stops it; its CPU seconds and its children's.
    fn stop(mut self) -> f64 {
        self.forked.stop(self.pid)
    }
}

/// Room the run's tmpfs needs: the spool holds what the backlog keeps (and
/// a loop's batch, taken from its outbox, as much again at most), the
/// destinations what is in flight. Only what is used takes memory.
pub(crate) fn tmpfs_bytes(f: &Feed, receivers: usize) -> u64 {
    let bytes = |d: Duration| (f.load_bps as f64 / 8.0 * d.as_secs_f64() * 1.1) as u64;
    let kept = (f.seconds + f.drain).min(f.backlog + Duration::from_secs(30));
    let spool = (2 * bytes(kept)).min(bytes(f.seconds));
    spool + (256 << 20) * receivers as u64 + (256 << 20)
}

/// Runs one tool over a dissemination scenario.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_tool(
    spec: &ToolSpec,
    rep: u32,
    plan: &Plan,
    feed: &Feed,
    exe: &Path,
    out: &Path,
    cfg: &LabConfig,
    mut run: Run,
    line_rate_bps: u64,
    receiver_name: &dyn Fn(usize) -> String,
) -> Result<Run> {
    let tool = spec.tool;
    let n = plan.links.len();
    let dir = out.join("runs").join(&plan.name).join(format!(
        "{}-{rep}",
        spec.label.replace([':', ',', '='], "_")
    ));
    let work = out.join("work");
    let spool = work.join("spool");
    let feed_dir = work.join("feed");
    let receivers: Vec<Receiver> = (0..n)
        .map(|i| Receiver {
            addr: cfg.host(&receiver_name(i)).expect("receiver host").addr,
            dst: work.join(format!("dst-{i}")),
        })
        .collect();
    for d in [&dir, &spool, &feed_dir]
        .into_iter()
        .chain(receivers.iter().map(|r| &r.dst))
    {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
        std::fs::create_dir_all(d)?;
    }
    let rate_bps = match (feed.rate_bps, spec.settings.get("rate")) {
        (Some(r), _) => r,
        (None, Some(r)) => longhaul_netem::spec::parse_rate(r).map_err(|e| anyhow::anyhow!(e))?,
        (None, None) => line_rate_bps / 10 * 9,
    };
    let setup = FeedSetup {
        exe,
        run: &dir,
        spool: &spool,
        feed_dir: &feed_dir,
        server: cfg.host("srv").expect("server host").addr,
        receivers: &receivers,
        rate_bps,
        backlog: feed.backlog,
        rtt: plan.max_rtt(),
        settings: &spec.settings,
    };
    let Some(FeedCommands {
        receivers: rx_cmds,
        senders,
        outboxes,
    }) = tool.feed(&setup)?
    else {
        run.note = format!("{} does not run a dissemination", tool.name());
        return Ok(run);
    };
    for (_, d) in &outboxes {
        std::fs::create_dir_all(d)?;
    }
    let ns = |h: Host| match h {
        Host::Server => cfg.netns("srv"),
        Host::Receiver(i) => cfg.netns(&receiver_name(i)),
    };
    let late = feed.late.map(|(i, _)| i);
    let joined: Arc<Vec<AtomicBool>> =
        Arc::new((0..n).map(|i| AtomicBool::new(late != Some(i))).collect());
    let products: Products = Arc::default();
    let seen: Vec<Arc<Mutex<Seen>>> = (0..n).map(|_| Arc::default()).collect();
    let stop_stations = Arc::new(AtomicBool::new(false));
    let mut cpu = CpuSplit::default();
    let mut rx_cpu = vec![0.0; n];
    let mut starts = vec![0u32; n];
    let start_rx = |i: usize, starts: &mut Vec<u32>| -> Result<Running> {
        starts[i] += 1;
        let d = &rx_cmds[i];
        let r = Running::start(
            &ns(d.proc.host),
            &d.proc,
            dir.join(format!("rx{i}-{}.log", starts[i])),
        )?;
        wait_ready(r.pid, d.ready)
            .with_context(|| format!("{}: {}", receiver_name(i), tail(&r.log)))?;
        Ok(r)
    };
    // What runs in the server: the sender, or receiver `who`'s loop.
    let start_tx = |who: Option<usize>, tx: &mut Vec<Running>| -> Result<()> {
        for (k, (_, p)) in senders.iter().enumerate().filter(|(_, s)| s.0 == who) {
            tx.push(Running::start(
                &ns(p.host),
                p,
                dir.join(format!("sender-{k}.log")),
            )?);
        }
        Ok(())
    };
    let mut rx: Vec<Option<Running>> = (0..n).map(|_| None).collect();
    let mut tx: Vec<Running> = Vec::new();
    let result = (|| -> Result<()> {
        for i in (0..n).filter(|&i| late != Some(i)) {
            rx[i] = Some(start_rx(i, &mut starts)?);
        }
        start_tx(None, &mut tx)?;
        for i in (0..n).filter(|&i| late != Some(i)) {
            start_tx(Some(i), &mut tx)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        for r in rx.into_iter().flatten().chain(tx) {
            r.stop();
        }
        run.status = Status::Failed;
        run.note = format!("{e:#}");
        return Ok(run);
    }
    // The sender finds its spool, the loops their boxes.
    std::thread::sleep(Duration::from_secs(2));
    let before = ops::stats(&cfg.name)?;
    let busy0 = machine_busy_s();
    let t0 = Instant::now();
    let stations: Vec<_> = receivers
        .iter()
        .zip(&seen)
        .map(|(r, s)| {
            let (dst, products, s, stop) = (
                r.dst.clone(),
                products.clone(),
                s.clone(),
                stop_stations.clone(),
            );
            std::thread::spawn(move || station(&dst, t0, &products, &s, &stop))
        })
        .collect();
    let producer = {
        let (spool, outboxes, joined, products) = (
            spool.clone(),
            outboxes.clone(),
            joined.clone(),
            products.clone(),
        );
        let (load, until, keep) = (
            feed.load_bps,
            feed.seconds,
            feed.backlog + Duration::from_secs(30),
        );
        std::thread::spawn(move || {
            produce(&spool, &outboxes, &joined, load, t0, until, keep, &products)
        })
    };
    // The schedule: (when, what) on the producer's clock.
    #[derive(Clone, Copy, Debug)]
    enum Ev {
        Join(usize),
        Stop(usize),
        Start(usize),
    }
    let mut events: Vec<(Duration, Ev)> = Vec::new();
    if let Some((i, at)) = feed.late {
        events.push((at, Ev::Join(i)));
    }
    if let Some((i, at, down)) = feed.restart {
        events.push((at, Ev::Stop(i)));
        events.push((at + down, Ev::Start(i)));
    }
    events.sort_by_key(|e| e.0);
    let mut joined_at: Vec<Option<f64>> = vec![None; n];
    let mut roles = vec![String::new(); n];
    if let Some((i, at)) = feed.late {
        roles[i] = format!("joined at {:.0} s", at.as_secs_f64());
    }
    if let Some((i, at, down)) = feed.restart {
        roles[i] = format!(
            "down {:.0}-{:.0} s",
            at.as_secs_f64(),
            (at + down).as_secs_f64()
        );
    }
    let mut busy_cores = Vec::new();
    let mut last_busy = (0.0, busy0);
    let runner0 = self_cpu_s();
    let mut sender_rss = Vec::new();
    let mut rx_rss: Vec<Vec<(f64, u64)>> = vec![Vec::new(); n];
    let mut next_sample = t0;
    let mut next_look = t0;
    let mut failure: Option<String> = None;
    let drain_end = t0 + feed.seconds + feed.drain;
    let all_had = |joined_at: &[Option<f64>]| {
        let ps = products.lock().expect("products");
        seen.iter().enumerate().all(|(i, s)| {
            let s = s.lock().expect("seen");
            ps.iter()
                .all(|(name, p)| !due(p, joined_at[i]) || s.had.contains_key(name))
        })
    };
    loop {
        let now = Instant::now();
        while events.first().is_some_and(|e| now >= t0 + e.0) {
            let (_, ev) = events.remove(0);
            let step = (|| -> Result<()> {
                match ev {
                    Ev::Join(i) => {
                        joined[i].store(true, Ordering::Relaxed);
                        joined_at[i] = Some(t0.elapsed().as_secs_f64());
                        rx[i] = Some(start_rx(i, &mut starts)?);
                        start_tx(Some(i), &mut tx)?;
                    }
                    Ev::Stop(i) => {
                        if let Some(r) = rx[i].take() {
                            rx_cpu[i] += r.stop();
                        }
                    }
                    Ev::Start(i) => rx[i] = Some(start_rx(i, &mut starts)?),
                }
                Ok(())
            })();
            if let Err(e) = step {
                failure.get_or_insert(format!("{ev:?}: {e:#}"));
            }
        }
        if now >= next_sample {
            next_sample += Duration::from_secs(5);
            let t = t0.elapsed().as_secs_f64();
            let busy = machine_busy_s();
            if let (Some(a), Some(b)) = (last_busy.1, busy) {
                if t > last_busy.0 {
                    busy_cores.push((t, (b - a).max(0.0) / (t - last_busy.0)));
                }
            }
            last_busy = (t, busy);
            sender_rss.push((t, tx.iter().map(|r| group_rss_kb(r.pid)).sum()));
            for (i, r) in rx.iter().enumerate() {
                if let Some(r) = r {
                    rx_rss[i].push((t, group_rss_kb(r.pid)));
                }
            }
        }
        if now >= next_look {
            next_look = now + Duration::from_millis(250);
            for r in rx.iter_mut().flatten().chain(tx.iter_mut()) {
                r.forked.look(r.pid);
            }
            // A sender (or a loop) that exits has failed: the run goes on
            // to see what the rest did.
            tx.retain(|r| match reap(r.pid) {
                Some((status, c)) => {
                    crate::proc::forget_group(r.pid);
                    cpu.add(Host::Server, c);
                    failure.get_or_insert(format!("a sender exited ({status}): {}", tail(&r.log)));
                    false
                }
                None => true,
            });
        }
        if producer.is_finished() && events.is_empty() && (now >= drain_end || all_had(&joined_at))
        {
            break;
        }
        if !producer.is_finished() && now >= drain_end + Duration::from_secs(60) {
            failure.get_or_insert("the producer did not finish".into());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let wall = t0.elapsed().as_secs_f64();
    let runner_cpu_s = self_cpu_s() - runner0;
    let after = ops::stats(&cfg.name)?;
    if let (Some(a), Some(b)) = (busy0, machine_busy_s()) {
        run.machine_cpu_s = (b - a).max(0.0);
    }
    for r in tx {
        cpu.add(Host::Server, r.stop());
    }
    for (i, r) in rx.into_iter().enumerate() {
        if let Some(r) = r {
            rx_cpu[i] += r.stop();
        }
    }
    // A last look for what landed as the tools stopped.
    std::thread::sleep(Duration::from_millis(300));
    stop_stations.store(true, Ordering::Relaxed);
    for s in stations {
        let _ = s.join();
    }
    if producer.is_finished() {
        if let Ok(Err(e)) = producer.join() {
            failure.get_or_insert(format!("the producer: {e:#}"));
        }
    }
    let products = products.lock().expect("products").clone();
    let mut fr = FeedRun {
        produced: products.len() as u64,
        produced_bytes: products.values().map(|p| p.size).sum(),
        seconds: feed.seconds.as_secs_f64(),
        sender_cpu_s: cpu.server,
        sender_rss_kb: sender_rss,
        busy_cores,
        runner_cpu_s,
        ..FeedRun::default()
    };
    fr.load_mbps = fr.produced_bytes as f64 * 8.0 / fr.seconds / 1e6;
    let mut lines = String::from("name\tsize\tready_s\n");
    for (name, p) in &products {
        lines.push_str(&format!("{name}\t{}\t{:.3}\n", p.size, p.ready));
    }
    std::fs::write(dir.join("products.tsv"), lines)?;
    for i in 0..n {
        let s = seen[i].lock().expect("seen");
        let mut r = receiver_result(&products, &s, joined_at[i]);
        r.host = receiver_name(i);
        r.link = plan.links[i].clone();
        r.role = roles[i].clone();
        r.cpu_s = rx_cpu[i];
        r.rss_kb = std::mem::take(&mut rx_rss[i]);
        let mut had: Vec<(&String, &f64)> = s.had.iter().collect();
        had.sort_by(|a, b| a.0.cmp(b.0));
        let text: String = had
            .iter()
            .map(|(name, at)| {
                let ready = products.get(*name).map_or(f64::NAN, |p| p.ready);
                format!("{name}\t{ready:.3}\t{at:.3}\t{:.3}\n", *at - ready)
            })
            .collect();
        std::fs::write(
            dir.join(format!("rx{i}.tsv")),
            format!("name\tready_s\tverified_s\tlatency_s\n{text}"),
        )?;
        fr.receivers.push(r);
    }
    run.delivered_bytes = fr.produced_bytes;
    run.client_cpu_s = rx_cpu.iter().sum();
    run.server_cpu_s = cpu.server;
    run.emulator_cpu_s = (after.cpu_s - before.cpu_s).max(0.0);
    run.wire_bytes = up_bytes(&before, &after, "srv");
    run.wire_back_bytes = (0..n)
        .map(|i| up_bytes(&before, &after, &receiver_name(i)))
        .sum();
    run.goodput = run.delivered_bytes as f64 / run.wire_bytes.max(1) as f64;
    run.wall_s = wall;
    run.files = fr.produced;
    run.bytes = fr.produced_bytes;
    run.mbps = fr.load_mbps;
    let short: Vec<String> = fr
        .receivers
        .iter()
        .filter(|r| r.had < r.due || r.corrupt > 0 || r.duplicates > 0)
        .map(|r| {
            let mut s = format!("{} had {} of {}", r.host, r.had, r.due);
            if r.duplicates > 0 {
                s += &format!(", {} twice", r.duplicates);
            }
            if r.corrupt > 0 {
                s += &format!(", {} corrupt", r.corrupt);
            }
            s
        })
        .collect();

    run.verified = Some(short.is_empty());
    (run.status, run.note) = match failure {
        Some(f) => (Status::Failed, f),
        None if short.is_empty() => (Status::Ok, String::new()),
        None => (Status::Timeout, short.join("; ")),
    };
    run.feed = Some(fr);
    for r in &receivers {
        let _ = std::fs::remove_dir_all(&r.dst);
    }
    let _ = std::fs::remove_dir_all(&spool);
    let _ = std::fs::remove_dir_all(&feed_dir);
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn product(ready: f64) -> Product {
        Product {
            size: 1,
            hash: blake3::hash(b"x"),
            ready,
        }
    }

    #[test]
    fn a_late_receiver_is_due_what_was_ready_a_second_after_it_joined() {
        let products: BTreeMap<String, Product> = (0..10)
            .map(|k| (format!("p{k}"), product(f64::from(k))))
            .collect();
        let mut seen = Seen::default();
        // Joined at 3 s: due p4..p9 (ready at 4 s or later); it had p2
        // (extra), p5 after 0.5 s, p9 after 2 s; p4, p6-p8 missing.
        seen.had.insert("p2".into(), 2.1);
        seen.had.insert("p5".into(), 5.5);
        seen.had.insert("p9".into(), 11.0);
        seen.duplicates = 1;
        let r = receiver_result(&products, &seen, Some(3.0));
        assert_eq!((r.due, r.had, r.extra, r.duplicates), (6, 2, 1, 1));
        assert_eq!(r.p50_s, Some(0.5));
        assert_eq!(r.max_s, Some(2.0));
        assert_eq!(r.latency_by_second, vec![(5.0, 0.5, 0.5), (9.0, 2.0, 2.0)]);
        assert_eq!(r.percentiles.len(), 101);
        assert_eq!((r.percentiles[0], r.percentiles[100]), (0.5, 2.0));
        // Not late: all ten due.
        assert_eq!(receiver_result(&products, &seen, None).due, 10);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&v, 0.5), 50.0);
        assert_eq!(pct(&v, 0.99), 99.0);
        assert_eq!(pct(&v, 1.0), 100.0);
        assert_eq!(pct(&v, 0.0), 1.0);
    }

    #[test]
    fn the_mix_is_seed_000s() {
        let mut rng = 7;
        let sizes: Vec<u64> = (0..10_000).map(|_| product_size(&mut rng)).collect();
        let big = sizes.iter().filter(|&&s| s >= 5_000_000).count();
        assert!((300..=500).contains(&big), "{big} of 10000 large");
        assert!(sizes
            .iter()
            .all(|&s| (10_000..=500_000).contains(&s) || (5_000_000..=50_000_000).contains(&s)));
    }

    #[test]
    fn a_station_takes_a_product_once_its_bytes_are_right() {
        let dir = tempfile::tempdir().unwrap();
        let products: Products = Arc::default();
        products.lock().unwrap().insert(
            "p1".into(),
            Product {
                size: 5,
                hash: blake3::hash(b"hello"),
                ready: 0.0,
            },
        );
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let h = {
            let (d, p, s, st) = (
                dir.path().to_path_buf(),
                products.clone(),
                seen.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || station(&d, t0, &p, &s, &st))
        };
        // Wrong bytes of the right size: not taken, left in place.
        std::fs::write(dir.path().join("p1"), b"jello").unwrap();
        std::fs::write(dir.path().join("other"), b"hello").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(dir.path().join("p1").exists());
        assert!(seen.lock().unwrap().had.is_empty());
        std::fs::write(dir.path().join(".p1"), b"hello").unwrap();
        std::fs::rename(dir.path().join(".p1"), dir.path().join("p1")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().had.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
        let s = seen.lock().unwrap();
        assert!(s.had.contains_key("p1"));
        assert!(s.mismatched.is_empty());
        assert!(!dir.path().join("p1").exists(), "taken away");
        assert!(dir.path().join("other").exists(), "not a product");
    }
}
