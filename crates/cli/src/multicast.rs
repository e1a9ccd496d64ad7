//! `longhaul multicast send / receive`: argument parsing and wiring only.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use longhaul_mcast::seal::Key;
use longhaul_mcast::store::{FileSet, FileStore};
use longhaul_mcast::udp::{self, Targets};
use longhaul_mcast::{
    Group, ReceiveReport, Receiver, ReceiverConfig, ReceiverEvent, RxState, Sender, SenderConfig,
    SenderEvent,
};
use longhaul_transfer::meta::{Policy, Wanted};
use serde_json::json;
use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct McArgs {
    #[command(subcommand)]
    pub command: McCommand,
}

#[derive(Debug, Subcommand)]
pub enum McCommand {
    /// Send files to many receivers at once: send --group ADDR:PORT --rate RATE (--receivers ID,.. | --open) PATH...
    #[command(after_help = SEND_HELP)]
    Send(SendArgs),
    /// Receive sessions into a directory, one after another, until stopped.
    #[command(after_help = RECEIVE_HELP)]
    Receive(ReceiveArgs),
}

const SEND_HELP: &str = "\
How it works:
  The sender announces the session and its manifest (paths, sizes, modes, mtimes,
  BLAKE3 of every file), waits for receivers to register, then sends every file's
  bytes once at --rate, cut into RaptorQ source blocks plus --overhead repair
  symbols. After each pass every receiver reports what it still lacks and the next
  pass sends just enough fresh repair symbols for the neediest one; each receiver
  repairs its own losses from the same symbols. Receivers complete independently;
  one that stops answering or stays incomplete after --max-passes is reported and
  given up on, never allowed to stall the rest. Small files share blocks, so a
  thousand 10 kB files cost no more feedback than one 10 MB file.

Groups:
  --receivers a,b,c   a closed group: only these names (each receiver's --id); data
                      starts as soon as all have registered, or after --announce-window
  --open              whoever registers within --announce-window (default 2 s)

Paths (like rsync): 'send ... ./products' sends products/...; './products/' sends
  the contents of products.

Keys: with --key-file (the same file on every side; make one with
  head -c 32 /dev/urandom > mcast.key) every datagram is authenticated and its
  payload encrypted (ChaCha20-Poly1305, a key per session). Without one the
  manifest's BLAKE3 hashes still protect every file's integrity.

A channel (--follow DIR) runs until stopped: each file is sent as soon as it is
  ready in DIR (closed after writing, or renamed into it, at any depth; names
  starting with a dot are skipped) under its path relative to DIR. Receivers
  join at any time and get what is written from then on; one that was away or
  restarted asks for what it missed while the sender holds it (--backlog).
  Files take turns a block each (8 at a time), --priority ones first.

Examples:
  longhaul multicast send --group 239.7.7.7:7000 --rate 400M --receivers dwd,knmi ./products
  longhaul multicast send --group 239.7.7.7:7000 --rate 350M --open --follow /spool \\
      --backlog 1h --priority '*.alert'
  longhaul multicast send --to 10.0.0.2:7000,10.0.0.3:7000 --rate 100M --open ./obs/

Exit status: 0 every receiver completed and verified (a channel: stopped by
  Ctrl-C or SIGTERM), 2 usage, 4 a receiver was given up on (or none came),
  5 local I/O (a channel: DIR could no longer be watched), 6 a receiver's files
  did not verify, 130 interrupted.";

const RECEIVE_HELP: &str = "\
Runs until stopped (Ctrl-C, SIGTERM), taking session after session; --once stops
after the first. A channel's files (send --follow) are taken too, each named as
soon as it verifies and handed to --exec CMD; where this receiver stands on the
channel is kept in --state-dir, so after a restart it asks for what it missed. Files are written to hidden part files (.NAME.lh-part) beside
their targets and take their final names only once every file of the session
matched its BLAKE3; a failed session removes its part files. Every path stays
beneath --dest. Each session's result is logged on stderr (with --json, as one
JSON line on stdout).

Example:
  longhaul multicast receive --group 239.7.7.7:7000 --dest /products --id dwd \
      --key-file /etc/longhaul/mc.key

Senders: with --key-file only sessions sealed with that key are taken. Without a
key every session is refused (logged), unless --accept-any-sender: then anyone
who can reach the group or port can write files into --dest, which is for a
trusted, closed network only.

Exit status (--once): 0 the session completed and verified, 2 usage, 3 the
  session failed (sender ended or went silent, not in a closed group), 5 local
  I/O, 6 verification failed.";

#[derive(Debug, Args)]
pub struct SendArgs {
    /// Multicast group and port to send to, e.g. 239.7.7.7:7000.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "to")]
    pub group: Option<SocketAddrV4>,
    /// Unicast fan-out where multicast is not available: every datagram goes to each of these receivers.
    #[arg(long, value_name = "HOST:PORT,...", value_delimiter = ',')]
    pub to: Vec<SocketAddr>,
    /// Sending rate in bit/s of IP packets, e.g. 400M, 1G.
    #[arg(long)]
    pub rate: String,
    /// A closed group: the receivers' names (their --id).
    #[arg(
        long,
        value_name = "ID,...",
        value_delimiter = ',',
        conflicts_with = "open"
    )]
    pub receivers: Vec<String>,
    /// An open group: whoever registers within the announce window.
    #[arg(long)]
    pub open: bool,
    /// Shared key file: authenticate and encrypt every datagram.
    #[arg(long, value_name = "F")]
    pub key_file: Option<PathBuf>,
    /// Repair symbols sent in the first pass, as a fraction of the data.
    #[arg(long, default_value_t = 0.02)]
    pub overhead: f64,
    /// How long to take registrations (open group) or wait for all named receivers
    /// (closed group) before data starts. Default 2s open, 10s closed.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub announce_window: Option<Duration>,
    /// Give up on a receiver still incomplete after this many passes.
    #[arg(long, default_value_t = 50)]
    pub max_passes: u32,
    /// Bytes per symbol (RaptorQ); 1400 fits a 1500-byte MTU, sealed or not.
    #[arg(long, default_value_t = 1400)]
    pub symbol_size: u16,
    /// Source symbols per block.
    #[arg(long, default_value_t = 1024)]
    pub block_symbols: u16,
    /// Local IPv4 address to send from (selects the multicast interface).
    #[arg(long, value_name = "ADDR")]
    pub interface: Option<Ipv4Addr>,
    /// Multicast TTL (router hops).
    #[arg(long, default_value_t = 8)]
    pub ttl: u32,
    /// Send extended attributes (the `user.*` namespace; as root
    /// `trusted.*` and `security.*` too, which a receiver sets only as root
    /// with --exact-modes). Owners and groups always go; a receiver keeps
    /// them with --keep-owners.
    #[arg(long, short = 'X')]
    pub xattrs: bool,
    /// Send POSIX ACLs (access and default); their entries keep their
    /// numeric ids.
    #[arg(long, short = 'A')]
    pub acls: bool,
    /// One JSON document on stdout at the end (per-receiver results, totals).
    #[arg(long)]
    pub json: bool,
    /// No progress bar, no table.
    #[arg(long)]
    pub quiet: bool,
    /// Run a channel until stopped: send each file as it becomes ready in
    /// DIR (closed after writing, or renamed into it, at any depth; names
    /// starting with a dot are skipped), as DIR's relative path. Receivers
    /// join and leave at any time.
    #[arg(long, value_name = "DIR", conflicts_with = "paths")]
    pub follow: Option<PathBuf>,
    /// With --follow: how long a file is held for receivers that lack it
    /// (one that was away asks for what it missed within this).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1h", requires = "follow")]
    pub backlog: Duration,
    /// With --follow: where the channel is kept (its id, and the files its
    /// backlog holds), so that a sender restarted on the same DIR takes it
    /// up again and a receiver that was away still gets what it missed
    /// [default: $XDG_STATE_HOME/longhaul/multicast].
    #[arg(long, value_name = "DIR", requires = "follow")]
    pub state_dir: Option<PathBuf>,
    /// With --follow: files whose path matches (rsync's patterns, as
    /// --exclude takes them) go before every file waiting. Repeatable.
    #[arg(long, value_name = "PATTERN", requires = "follow")]
    pub priority: Vec<String>,
    /// Files and directories to send.
    #[arg(required_unless_present = "follow", value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// Multicast group and port to join, e.g. 239.7.7.7:7000.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "listen")]
    pub group: Option<SocketAddrV4>,
    /// Listen on a unicast address instead (for a sender's --to fan-out).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddrV4>,
    /// Directory the sessions' files go to (created if missing).
    #[arg(long, value_name = "DIR")]
    pub dest: PathBuf,
    /// This receiver's name, as a sender's --receivers lists it (default: host name).
    #[arg(long)]
    pub id: Option<String>,
    /// Shared key file (the sender's): only sealed sessions under it are taken.
    #[arg(long, value_name = "F")]
    pub key_file: Option<PathBuf>,
    /// Without --key-file, take unsealed sessions from any sender: anyone who
    /// can reach the group or port can then write files into --dest. For a
    /// trusted, closed network only; without a key and without this, every
    /// session is refused.
    #[arg(long, conflicts_with = "key_file")]
    pub accept_any_sender: bool,
    /// Local IPv4 address of the interface to join the group on.
    #[arg(long, value_name = "ADDR")]
    pub interface: Option<Ipv4Addr>,
    /// Keep the setuid, setgid and sticky bits and write access for all of
    /// the files received, exactly as sent (by default dropped: a mode
    /// within 0775).
    #[arg(long)]
    pub exact_modes: bool,
    /// Give the files received the owner and group sent (by name, or by
    /// number with --numeric-ids), when this receiver runs as root. By
    /// default they belong to the receiver's user: a sender cannot give
    /// files to other users of this host.
    #[arg(long)]
    pub keep_owners: bool,
    /// With --keep-owners, the owner and group numbers sent, not the local
    /// ids of the names sent.
    #[arg(long, requires = "keep_owners")]
    pub numeric_ids: bool,
    /// Where the receiver keeps the sealed sessions it took in the last 10
    /// minutes, to refuse them if replayed (a file per --dest)
    /// [default: $XDG_STATE_HOME/longhaul/multicast].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Exit after the first session.
    #[arg(long)]
    pub once: bool,
    /// Fail a session whose sender has been silent this long.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub idle_timeout: Duration,
    /// Run CMD on each file a channel delivers, as it is named (as uftpd's
    /// post-receive script): `sh -c 'CMD "$1"' longhaul PATH`, with the
    /// file's full path; up to 4 at once, the rest queued. Its exit status
    /// is logged when not 0.
    #[arg(long, value_name = "CMD")]
    pub exec: Option<String>,
    /// One JSON line per session event on stdout.
    #[arg(long)]
    pub json: bool,
}

/// A duration (the grammar of [`longhaul_transfer::units`]: `500ms`, `2s`, `1m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    longhaul_transfer::units::parse_duration(s).map_err(|e| e.to_string())
}

pub fn run(cmd: McCommand) -> Result<i32> {
    // Ctrl-C / SIGTERM: stop cleanly (the sender sends END, the receiver removes
    // its part files).
    longhaul_lab::signals::block_stop()?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        if longhaul_lab::signals::wait_stop().is_some() {
            s.store(true, Ordering::Relaxed);
        }
    });
    match cmd {
        McCommand::Send(a) => send(a, &stop),
        McCommand::Receive(a) => receive(a, &stop),
    }
}

fn read_key(path: &Option<PathBuf>) -> Result<Option<Vec<u8>>> {
    let Some(p) = path else { return Ok(None) };
    let m = std::fs::read(p).with_context(|| format!("key file {}", p.display()))?;
    Key::from_material(&m, 0).map_err(|e| anyhow::anyhow!("key file {}: {e}", p.display()))?;
    Ok(Some(m))
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    crate::usage(msg)
}

fn send(a: SendArgs, stop: &AtomicBool) -> Result<i32> {
    let rate = longhaul_quic::parse_rate(&a.rate).map_err(|e| usage(e.to_string()))?;
    let targets = match (a.group, a.to.is_empty()) {
        (Some(g), true) if g.ip().is_multicast() => Targets::Multicast(g),
        (Some(g), true) => {
            return Err(usage(format!(
                "{} is not a multicast address (224.0.0.0/4); for unicast receivers use --to",
                g.ip()
            )))
        }
        (None, false) => Targets::Fanout(a.to.clone()),
        _ => {
            return Err(usage(
                "say where to send: --group ADDR:PORT or --to HOST:PORT,...",
            ))
        }
    };
    let group = match (a.open, a.receivers.is_empty()) {
        (true, _) => Group::Open,
        (false, false) => {
            for r in &a.receivers {
                longhaul_mcast::wire::check_name(r).map_err(usage)?;
            }
            Group::Closed(a.receivers.clone())
        }
        (false, true) => {
            return Err(usage(
                "name the receivers (--receivers ID,...: a closed group) or take whoever comes (--open)",
            ))
        }
    };
    let material = read_key(&a.key_file)?;
    if let Some(dir) = a.follow.clone() {
        return follow(a, dir, targets, group, rate, material, stop);
    }
    let show = !a.quiet && !a.json && std::io::stderr().is_terminal();
    let bar = if show {
        ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(10))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {elapsed:>4} [{bar:30}] {bytes}/{total_bytes} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_message("hashing");
    let t0 = Instant::now();
    let want = Wanted {
        xattrs: a.xattrs,
        acls: a.acls,
    };
    let mut files = FileSet::build(&a.paths, want, |n| bar.set_position(n))
        .context("reading the paths to send")?;
    for s in &files.skipped {
        eprintln!("warning: skipped {s}");
    }
    let data_len = files.manifest.data_len();
    let hashing = t0.elapsed();
    let session: u64 = rand::random();
    let key = material
        .as_deref()
        .map(|m| Key::from_material(m, session))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let closed = group != Group::Open;
    let cfg = SenderConfig {
        rate_bps: rate,
        symbol_size: a.symbol_size,
        block_symbols: a.block_symbols,
        overhead: a.overhead,
        group,
        announce_window: a.announce_window.unwrap_or(Duration::from_secs(if closed {
            10
        } else {
            2
        })),
        max_passes: a.max_passes,
        created_us: longhaul_mcast::store::wall_clock_us(),
        ..SenderConfig::default()
    };
    let start = Instant::now();
    let mut core =
        Sender::new(cfg, session, key, files.manifest.encode(), data_len, start).map_err(usage)?;
    let sock = udp::sender_socket(&targets, a.interface, a.ttl).context("sender socket")?;
    if !a.quiet && !a.json {
        eprintln!(
            "longhaul multicast: session {session:016x}, {} files, {} bytes, to {}, {} bit/s",
            files.manifest.files(),
            data_len,
            match &targets {
                Targets::Multicast(g) => g.to_string(),
                Targets::Fanout(l) => format!("{} receivers (fan-out)", l.len()),
            },
            rate
        );
    }
    bar.set_length(data_len);
    bar.set_position(0);
    bar.set_message("announcing");
    let total_syms = core.total_symbols().max(1);
    let mut log = Vec::new();
    let quiet = a.quiet || a.json;
    let r = udp::run_sender(&sock, &targets, &mut core, &mut files, stop, &mut |c, e| {
        let st = c.stats();
        let sent = (st.data_packets + st.repair_packets).min(total_syms);
        bar.set_position(data_len * sent / total_syms);
        let done = c
            .report()
            .iter()
            .filter(|r| r.state == RxState::Completed)
            .count();
        bar.set_message(format!(
            "pass {} · {done}/{} receivers done",
            st.passes,
            c.report().len()
        ));
        let line = match &e {
            SenderEvent::Registered { name, addr, late } => Some(format!(
                "{name} registered from {addr}{}",
                if *late { " (late)" } else { "" }
            )),
            SenderEvent::Rejected { name, addr } => {
                Some(format!("{name} at {addr} refused: not in the group"))
            }
            SenderEvent::PassStarted {
                pass: 1,
                blocks,
                symbols,
            } => Some(format!("pass 1: {symbols} symbols of {blocks} blocks")),
            SenderEvent::PassStarted {
                pass,
                blocks,
                symbols,
            } => Some(format!(
                "pass {pass}: {symbols} repair symbols for {blocks} blocks"
            )),
            SenderEvent::Completed { name, ok: true, .. } => Some(format!("{name} completed")),
            SenderEvent::Completed { name, error, .. } => Some(format!("{name} FAILED: {error}")),
            SenderEvent::GaveUp { name, reason } => Some(format!("{name} given up: {reason}")),
            _ => None,
        };
        if let Some(l) = line {
            let l = format!("{:7.2} s  {l}", start.elapsed().as_secs_f64());
            if !quiet {
                // (A receiver's error is its own text.)
                bar.println(longhaul_transfer::shown(&l));
            }
            log.push(l);
        }
    });
    bar.finish_and_clear();
    let elapsed = start.elapsed();
    let interrupted = stop.load(Ordering::Relaxed);
    let io_error = r.err();
    let report = core.report();
    let st = core.stats().clone();
    let ok = core.all_completed() && io_error.is_none() && !interrupted;
    if a.json {
        let doc = json!({
            "ok": ok, "session": format!("{session:016x}"), "files": files.manifest.files(),
            "bytes": data_len, "rate_bps": rate, "seconds": elapsed.as_secs_f64(),
            "hash_seconds": hashing.as_secs_f64(), "passes": st.passes,
            "datagrams": st.datagrams, "wire_bytes": st.bytes, "data_packets": st.data_packets,
            "repair_packets": st.repair_packets, "manifest_packets": st.manifest_packets,
            "dropped": st.dropped, "receivers": report, "interrupted": interrupted,
            "error": io_error.as_ref().map(|e| e.to_string()), "events": log,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else if !a.quiet {
        println!(
            "{:<16} {:<12} {:>12} {:>7} {:>9} {:>8} {:>9}",
            "RECEIVER", "STATE", "BYTES", "PASSES", "LOSS", "TIME s", "Mbit/s"
        );
        for r in &report {
            let state = match &r.state {
                RxState::Expected => "absent".to_string(),
                RxState::Active => "incomplete".to_string(),
                RxState::Completed => "completed".to_string(),
                RxState::Failed(w) => format!("FAILED ({})", longhaul_transfer::shown(w)),
                RxState::GaveUp(w) => format!("given up ({w})"),
            };
            let t = r
                .time
                .map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64()));
            let mbps = r
                .time
                .filter(|_| r.state == RxState::Completed)
                .map_or("-".into(), |d| {
                    format!("{:.1}", r.bytes as f64 * 8.0 / d.as_secs_f64() / 1e6)
                });
            println!(
                "{:<16} {:<12} {:>12} {:>7} {:>8.4}% {:>8} {:>9}",
                r.name,
                state,
                r.bytes,
                r.passes,
                r.loss_ppm as f64 / 1e4,
                t,
                mbps
            );
        }
        eprintln!(
            "{} bytes in {:.2} s ({} passes, {} data + {} repair symbols, {:.3} GB on the wire)",
            data_len,
            elapsed.as_secs_f64(),
            st.passes,
            st.data_packets,
            st.repair_packets,
            st.bytes as f64 / 1e9
        );
    }
    if let Some(e) = io_error {
        eprintln!("error: {e}");
        return Ok(5);
    }
    if interrupted {
        return Ok(crate::EXIT_INTERRUPTED);
    }
    if ok {
        return Ok(0);
    }
    Ok(
        if report.iter().any(|r| matches!(r.state, RxState::Failed(_))) {
            6
        } else {
            4
        },
    )
}

/// A duration for people: "1h", "90s", "2.5s".
fn humantime_s(d: Duration) -> String {
    let s = d.as_secs_f64();
    match s {
        _ if s >= 3600.0 && s % 3600.0 == 0.0 => format!("{}h", s / 3600.0),
        _ if s >= 60.0 && s % 60.0 == 0.0 => format!("{}m", s / 60.0),
        _ => format!("{s}s"),
    }
}

/// `send --follow DIR`: a channel until stopped.
fn follow(
    a: SendArgs,
    dir: PathBuf,
    targets: Targets,
    group: Group,
    rate: u64,
    material: Option<Vec<u8>>,
    stop: &AtomicBool,
) -> Result<i32> {
    use longhaul_mcast::channel::files::{Journal, Spool, Watch};
    use longhaul_mcast::channel::{ChannelConfig, ChannelEvent, ChannelSender};
    // The channel kept for this DIR (by its canonical path): a restarted
    // sender takes it up, with its id and what its backlog holds.
    let canon = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
    let tag = blake3::hash(canon.as_os_str().as_encoded_bytes()).to_hex();
    let kept_at = a
        .state_dir
        .clone()
        .unwrap_or_else(longhaul_quic::identity::default_multicast_state_dir)
        .join(format!("channel-send-{}", &tag[..16]));
    let fresh: u64 = rand::random();
    // (Without a record the channel still runs: a restart starts anew.)
    let (mut journal, kept) = match Journal::open(&kept_at, fresh) {
        Ok((j, k)) => (Some(j), k),
        Err(e) => {
            eprintln!(
                "warning: the channel's record {}: {e}; a restart will start a new channel",
                kept_at.display()
            );
            (None, Default::default())
        }
    };
    let channel: u64 = kept.channel.unwrap_or(fresh);
    let key = material
        .as_deref()
        .map(|m| Key::from_material(m, channel))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let cfg = ChannelConfig {
        rate_bps: rate,
        symbol_size: a.symbol_size,
        block_symbols: a.block_symbols,
        overhead: a.overhead,
        group,
        backlog: a.backlog,
        ..ChannelConfig::default()
    };
    use longhaul_transfer::filter::{Action, Filter, Rule};
    let rules: Vec<Rule> = a
        .priority
        .iter()
        .map(|p| Rule {
            action: Action::Exclude,
            pattern: p.as_bytes().to_vec(),
        })
        .collect();
    let urgent = Filter::new(&rules).map_err(|e| usage(format!("--priority: {e}")))?;
    let now = Instant::now();
    let mut core = ChannelSender::new(
        cfg,
        channel,
        key,
        now,
        longhaul_mcast::store::wall_clock_us(),
    )
    .map_err(usage)?;
    let mut spool = Spool::new(&dir).with_context(|| format!("--follow {}", dir.display()))?;
    // What the channel held before a restart: held again (a file no longer
    // there as it was is gone: receivers are told so); the watch finds
    // those files ready again, and they are not offered twice.
    let mut names: std::collections::HashMap<u32, String> = Default::default();
    let mut offered_before: std::collections::HashMap<String, (u64, i64)> = Default::default();
    let restored = kept.files.len();
    let mut files: Vec<_> = kept
        .files
        .into_iter()
        .map(|(oid, path, ready_us, item)| {
            let rel = longhaul_transfer::RelPath::from_wire(path.as_bytes()).ok();
            let gone = !rel.as_ref().is_some_and(|r| spool.unchanged(r, &item));
            if let Some(rel) = rel {
                spool.add(oid, rel);
            }
            offered_before.insert(path.clone(), (item.size, item.mtime_ns));
            names.insert(oid, path);
            (oid, item, ready_us, gone)
        })
        .collect();
    // Ids reserved past the last offer on record (a power loss took the
    // last lines): gone, so that none is used twice.
    let wall = longhaul_mcast::store::wall_clock_us();
    for oid in kept.unrecorded.clone() {
        let path = format!(".longhaul-unrecorded-{oid}");
        let item = longhaul_mcast::manifest::Item {
            path: path.clone().into_bytes(),
            kind: longhaul_transfer::EntryKind::File,
            size: 0,
            mode: 0,
            mtime_ns: 0,
            link: vec![],
            hash: [0; 32],
            extents: None,
            owner: None,
            xattrs: vec![],
        };
        if let Some(Err(e)) = journal.as_mut().map(|j| j.offered(oid, &path, wall, &item)) {
            eprintln!("warning: the channel's record {}: {e}", kept_at.display());
        }
        names.insert(oid, path);
        files.push((oid, item, wall, true));
    }
    let mut reserved = kept.next_oid;
    core.restore(now, wall, kept.next_oid, files, kept.receivers);
    let mut watch = Watch::new(&dir).with_context(|| format!("--follow {}", dir.display()))?;
    let sock = udp::sender_socket(&targets, a.interface, a.ttl).context("sender socket")?;
    let want = Wanted {
        xattrs: a.xattrs,
        acls: a.acls,
    };
    // Watching and hashing on a thread of their own: a file of many MB is
    // hashed while the channel keeps its pace. Each ready file comes with
    // when it was found ready, its latency's start.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let reader = Spool::new(&dir).with_context(|| format!("--follow {}", dir.display()))?;
    let watching = Arc::new(AtomicBool::new(true));
    let w = watching.clone();
    let watcher = std::thread::spawn(move || -> std::io::Result<()> {
        while w.load(Ordering::Relaxed) {
            for path in watch.ready()? {
                let ready_us = longhaul_mcast::store::wall_clock_us();
                let item = reader.item(&path, want);
                if ready_tx.send((path, item, ready_us)).is_err() {
                    return Ok(());
                }
            }
            let mut fds = [nix::poll::PollFd::new(
                watch.fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16));
        }
        Ok(())
    });
    let json = a.json;
    let say = |line: String, j: serde_json::Value| {
        if json {
            println!("{j}");
        } else if !a.quiet {
            eprintln!("{line}");
        }
    };
    say(
        format!(
            "longhaul multicast: channel {channel:016x} following {}, to {}, {rate} bit/s, backlog {}",
            dir.display(),
            match &targets {
                Targets::Multicast(g) => g.to_string(),
                Targets::Fanout(l) => format!("{} receivers (fan-out)", l.len()),
            },
            humantime_s(a.backlog),
        ),
        json!({"event": "channel", "channel": format!("{channel:016x}"), "dir": dir.display().to_string(), "rate_bps": rate, "restored": restored}),
    );
    if restored > 0 {
        say(
            format!(
                "taken up where it stopped: {restored} file(s) held for receivers that lack them"
            ),
            json!({"event": "restored", "files": restored}),
        );
    }
    let mut journal_failed = |e: std::io::Error, j: &mut Option<Journal>| {
        eprintln!(
            "warning: the channel's record {}: {e}; a restart will start a new channel",
            kept_at.display()
        );
        *j = None;
    };
    let mut last_kept = Instant::now();
    let mut last_status = Instant::now();
    let r = udp::run_channel_sender(
        &sock,
        &targets,
        &mut core,
        &mut spool,
        stop,
        &mut |core, spool, now| {
            while let Some(e) = core.poll_event() {
                match e {
                    ChannelEvent::Joined { name, addr, from_oid } => say(
                        format!("{name} joined from {addr}, from file {from_oid}"),
                        json!({"event": "joined", "name": name, "addr": addr.to_string(), "from_oid": from_oid}),
                    ),
                    ChannelEvent::Rejected { name } => say(
                        format!("{name} refused: not in the closed group"),
                        json!({"event": "rejected", "name": name}),
                    ),
                    ChannelEvent::Away { name } => say(
                        format!("{name} is away (silent for 10 s); files wait for it within the backlog"),
                        json!({"event": "away", "name": name}),
                    ),
                    ChannelEvent::Dropped { name } => say(
                        format!("{name} forgotten (silent for a day)"),
                        json!({"event": "dropped", "name": name}),
                    ),
                    ChannelEvent::Sent { .. } => {}
                    ChannelEvent::Unreadable { oid, error } => say(
                        format!("{}: could not be read: {error}", names.get(&oid).cloned().unwrap_or_default()),
                        json!({"event": "unreadable", "oid": oid, "error": error}),
                    ),
                    ChannelEvent::Forgotten { oid, missing } => {
                        spool.forget(oid);
                        if let Some(Err(e)) = journal.as_mut().map(|j| j.forgotten(oid)) {
                            journal_failed(e, &mut journal);
                        }
                        let path = names.remove(&oid).unwrap_or_default();
                        if !missing.is_empty() {
                            say(
                                format!("{path}: backlog expired; not had by {}", missing.join(", ")),
                                json!({"event": "expired", "oid": oid, "path": path, "missing": missing}),
                            );
                        }
                    }
                }
            }
            if watcher.is_finished() {
                stop.store(true, Ordering::Relaxed);
                return;
            }
            while let Ok((path, item, ready_us)) = ready_rx.try_recv() {
                let shown = path.display();
                match item {
                    // Offered before a restart, and not changed since.
                    Ok(item)
                        if offered_before.remove(&shown) == Some((item.size, item.mtime_ns)) => {}
                    Ok(item) => {
                        let size = item.size;
                        let hot = urgent.excludes(path.as_bytes(), false);
                        let entry = journal.is_some().then(|| item.clone());
                        // Ids are reserved on disk before they are used.
                        if core.next_oid() >= reserved {
                            reserved = core.next_oid() + 64;
                            if let Some(Err(e)) = journal.as_mut().map(|j| j.reserve(reserved)) {
                                journal_failed(e, &mut journal);
                            }
                        }
                        match core.offer(now, item, ready_us, hot) {
                            Ok(oid) => {
                                if let (Some(j), Some(entry)) = (journal.as_mut(), entry) {
                                    if let Err(e) = j.offered(oid, &shown, ready_us, &entry) {
                                        journal_failed(e, &mut journal);
                                    }
                                }
                                spool.add(oid, path);
                                names.insert(oid, shown.clone());
                                if json {
                                    println!(
                                        "{}",
                                        json!({"event": "offered", "oid": oid, "path": shown, "size": size, "urgent": hot})
                                    );
                                }
                            }
                            Err(e) => eprintln!("warning: {shown}: not sent: {e}"),
                        }
                    }
                    // (Gone or unreadable: a producer's business.)
                    Err(e) => eprintln!("warning: {shown}: not sent: {e}"),
                }
            }
            if now >= last_kept + Duration::from_secs(10) {
                last_kept = now;
                keep_receivers(&mut journal, core, reserved, &names, &mut journal_failed);
            }
            if now >= last_status + Duration::from_secs(10) && (json || !a.quiet) {
                last_status = now;
                let st = core.state();
                let away = st.receivers.iter().filter(|r| r.away).count();
                let q = |r: &longhaul_mcast::channel::ReceiverState, p: f64| {
                    r.latency.quantile(p).map(|v| (v * 100.0).round() / 100.0)
                };
                if json {
                    let rx: Vec<_> = st
                        .receivers
                        .iter()
                        .map(|r| {
                            json!({"name": r.name, "away": r.away, "done_below": r.done_below,
                                   "files": r.latency.files(), "p50_s": q(r, 0.5),
                                   "p99_s": q(r, 0.99), "max_s": r.latency.max_s()})
                        })
                        .collect();
                    println!(
                        "{}",
                        json!({"event": "status", "files": core.stats().files, "held": st.held,
                               "waiting": st.queued, "waiting_bytes": st.queued_bytes, "receivers": rx})
                    );
                } else {
                    let lat: Vec<String> = st
                        .receivers
                        .iter()
                        .filter_map(|r| {
                            Some(format!("{} {:.2}/{:.2} s", r.name, q(r, 0.5)?, q(r, 0.99)?))
                        })
                        .collect();
                    eprintln!(
                        "channel {channel:016x}: {} file(s) offered, {} held, {} waiting ({} bytes); {} receiver(s), {away} away{}",
                        core.stats().files,
                        st.held,
                        st.queued,
                        st.queued_bytes,
                        st.receivers.len(),
                        if lat.is_empty() {
                            String::new()
                        } else {
                            format!("; latency p50/p99 {}", lat.join(", "))
                        }
                    );
                }
            }
        },
    );
    watching.store(false, Ordering::Relaxed);
    match watcher.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("error: --follow {}: {e}", dir.display());
            return Ok(5);
        }
        Err(_) => anyhow::bail!("the watching thread panicked"),
    }
    keep_receivers(&mut journal, &core, reserved, &names, &mut journal_failed);
    if let Some(Err(e)) = journal.as_mut().map(|j| j.stopped(core.next_oid())) {
        journal_failed(e, &mut journal);
    }
    r.context("sending")?;
    let st = core.stats();
    say(
        format!(
            "channel {channel:016x} stopped: {} file(s) offered, {} sent, {} repair symbols",
            st.files, st.sent_files, st.repair_symbols
        ),
        json!({"event": "stopped", "files": st.files, "sent": st.sent_files, "datagrams": st.datagrams, "bytes": st.bytes, "repair_symbols": st.repair_symbols}),
    );
    Ok(if stop.load(Ordering::Relaxed) { 0 } else { 3 })
}

/// Where the channel's receivers stand, into its record (which is
/// rewritten compact now and then, with the files held).
fn keep_receivers(
    journal: &mut Option<longhaul_mcast::channel::files::Journal>,
    core: &longhaul_mcast::channel::ChannelSender,
    reserved: u32,
    names: &std::collections::HashMap<u32, String>,
    failed: &mut dyn FnMut(std::io::Error, &mut Option<longhaul_mcast::channel::files::Journal>),
) {
    let rx: Vec<(String, u32)> = core
        .state()
        .receivers
        .iter()
        .map(|r| (r.name.clone(), r.done_below))
        .collect();
    let held = || {
        core.held()
            .filter_map(|(oid, item, ready)| {
                Some((oid, names.get(&oid)?.clone(), ready, item.clone()))
            })
            .collect()
    };
    let r = journal
        .as_mut()
        .map(|j| j.receivers(core.channel(), (core.next_oid(), reserved), &rx, held));
    if let Some(Err(e)) = r {
        failed(e, journal);
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "receiver".into())
}

fn receive(a: ReceiveArgs, stop: &AtomicBool) -> Result<i32> {
    let addr = match (a.group, a.listen) {
        (Some(g), None) if g.ip().is_multicast() => g,
        (Some(g), None) => {
            return Err(usage(format!(
                "{} is not a multicast address (224.0.0.0/4); for unicast use --listen",
                g.ip()
            )))
        }
        (None, Some(l)) => l,
        _ => {
            return Err(usage(
                "say where to listen: --group ADDR:PORT or --listen ADDR:PORT",
            ))
        }
    };
    let name = a.id.clone().unwrap_or_else(hostname);
    longhaul_mcast::wire::check_name(&name).map_err(|e| usage(format!("--id: {e}")))?;
    let mut cfg = ReceiverConfig::new(&name);
    cfg.key_material = read_key(&a.key_file)?;
    cfg.accept_unsealed = a.accept_any_sender;
    cfg.idle_timeout = a.idle_timeout;
    cfg.verify_apart = true;
    let mut core = Receiver::new(cfg).map_err(usage)?;
    let state = a
        .state_dir
        .clone()
        .unwrap_or_else(longhaul_quic::identity::default_multicast_state_dir);
    // One record per destination (by its canonical path).
    let canon = std::fs::canonicalize(&a.dest).unwrap_or_else(|_| a.dest.clone());
    let tag = blake3::hash(canon.as_os_str().as_encoded_bytes()).to_hex();
    let root = nix::unistd::geteuid().is_root();
    if a.keep_owners && !root {
        eprintln!(
            "longhaul multicast receive: --keep-owners takes effect as root only; \
             the files received will belong to this user"
        );
    }
    let mut store = FileStore::new(&a.dest)
        .context("destination")?
        .exact_modes(a.exact_modes)
        .meta(Policy {
            owners: a.keep_owners && root,
            numeric_ids: a.numeric_ids,
            privileged: a.exact_modes && root,
        })
        .sessions_file(state.join(format!("sessions-{}", &tag[..16])));
    let sock =
        udp::receiver_socket(addr, a.interface).with_context(|| format!("listening on {addr}"))?;
    let trust = match (&a.key_file, a.accept_any_sender) {
        (Some(_), _) => "taking only what is sealed with --key-file".to_string(),
        (None, true) => format!(
            "WARNING: --accept-any-sender: any sender that reaches {addr} can write into {}",
            a.dest.display()
        ),
        (None, false) => "REFUSING every sender: no --key-file (give the sender's; \
             --accept-any-sender takes unsealed sessions on a closed network)"
            .to_string(),
    };
    if !a.json {
        eprintln!(
            "longhaul multicast receive: {} on {addr}, writing to {}; {trust}",
            name,
            a.dest.display()
        );
    }
    let mut last: Option<ReceiveReport> = None;
    let mut not_held = longhaul_transfer::meta::not_held();
    let json = a.json;
    let has_key = a.key_file.is_some();
    // A channel's files, beside sessions (docs/PROTOCOL.md §3.5).
    let resume_file = state.join(format!("channel-{}", &tag[..16]));
    let mut chan_cfg = longhaul_mcast::channel::ChannelReceiverConfig::new(&name);
    chan_cfg.key_material = read_key(&a.key_file)?;
    chan_cfg.accept_unsealed = a.accept_any_sender;
    chan_cfg.idle_timeout = a.idle_timeout;
    chan_cfg.resume = longhaul_mcast::channel::files::read_resume(&resume_file);
    let mut chan = longhaul_mcast::channel::ChannelReceiver::new(
        chan_cfg,
        Instant::now(),
        longhaul_mcast::store::wall_clock_us(),
    )
    .map_err(usage)?;
    let mut chan_store = longhaul_mcast::channel::files::ChannelStore::new(
        &a.dest,
        a.exact_modes,
        Policy {
            owners: a.keep_owners && root,
            numeric_ids: a.numeric_ids,
            privileged: a.exact_modes && root,
        },
    )
    .context("destination")?;
    let mut hooks = Hooks::new(a.exec.clone());
    let mut saved = Instant::now();
    let dest = a.dest.clone();
    let mut on_chan = |c: &longhaul_mcast::channel::ChannelReceiver,
                       e: longhaul_mcast::channel::ChannelRxEvent| {
        use longhaul_mcast::channel::ChannelRxEvent as E;
        let shown = |p: &[u8]| longhaul_transfer::shown(&String::from_utf8_lossy(p)).into_owned();
        match e {
            E::Joined {
                channel,
                sender,
                from_oid,
            } => chan_say(
                json,
                format!("channel {channel:016x} from {sender}: joining, from file {from_oid}"),
                json!({"event": "channel", "channel": format!("{channel:016x}"), "sender": sender.to_string(), "from_oid": from_oid}),
            ),
            E::Refused { channel, why } => chan_say(
                json,
                format!("channel {channel:016x}: refused: {why}"),
                json!({"event": "refused", "channel": format!("{channel:016x}"), "why": why}),
            ),
            E::File {
                oid,
                path,
                size,
                latency_us,
            } => {
                let latency = latency_us as f64 / 1e6;
                chan_say(
                    json,
                    format!(
                        "{}: {size} bytes, {latency:.3} s after it was ready",
                        shown(&path)
                    ),
                    json!({"event": "file", "oid": oid, "path": String::from_utf8_lossy(&path), "size": size, "latency_s": latency}),
                );
                hooks.run(
                    dest.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&path)),
                );
            }
            E::Failed { oid, path, error } => chan_say(
                json,
                format!("{}: FAILED: {error}", shown(&path)),
                json!({"event": "failed", "oid": oid, "path": String::from_utf8_lossy(&path), "error": error}),
            ),
            E::Missed { from, count, why } => chan_say(
                json,
                format!("missed {count} file(s) from id {from}: {why}"),
                json!({"event": "missed", "from": from, "count": count, "why": why}),
            ),
            E::Left { channel, why } => chan_say(
                json,
                format!("channel {channel:016x}: left: {why}"),
                json!({"event": "left", "channel": format!("{channel:016x}"), "why": why}),
            ),
        }
        // Where it stands, kept (at most once a second) for a restart.
        if saved.elapsed() >= Duration::from_secs(1) {
            if let Some(r) = c.resume_point() {
                if let Err(e) = longhaul_mcast::channel::files::write_resume(&resume_file, &r) {
                    tracing::warn!("{}: {e}", resume_file.display());
                }
            }
            saved = Instant::now();
        }
        hooks.reap();
    };
    let part = udp::ChannelPart {
        core: &mut chan,
        store: &mut chan_store,
        on_event: &mut on_chan,
    };
    udp::run_receiver(
        &sock,
        &mut core,
        &mut store,
        stop,
        a.once,
        &mut |_, e| match e {
            ReceiverEvent::Started {
                session,
                sender,
                files,
                bytes,
            } => {
                if json {
                    println!(
                        "{}",
                        json!({"event": "started", "session": format!("{session:016x}"),
                    "sender": sender.to_string(), "files": files, "bytes": bytes})
                    );
                } else {
                    eprintln!("session {session:016x} from {sender}: {files} files, {bytes} bytes");
                }
            }
            ReceiverEvent::Refused {
                session,
                sender,
                why,
            } => {
                if json {
                    println!(
                        "{}",
                        json!({"event": "refused", "session": format!("{session:016x}"),
                    "sender": sender.to_string(), "why": why})
                    );
                } else if has_key {
                    eprintln!("session {session:016x} from {sender}: refused: {why}");
                } else {
                    eprintln!(
                        "session {session:016x} from {sender}: refused: {why} (--key-file F, \
                         the sender's; or --accept-any-sender on a closed network)"
                    );
                }
            }
            ReceiverEvent::Rejected { session } if !json => {
                eprintln!("session {session:016x}: this receiver is not in its closed group");
            }
            ReceiverEvent::Ended(r) => {
                // Items of this session placed without their attributes.
                let held = longhaul_transfer::meta::not_held();
                let bare = held - std::mem::replace(&mut not_held, held);
                if json {
                    let mut j = ended_event(&r);
                    j["attrs_not_kept"] = json!(bare);
                    println!("{j}");
                } else if r.ok {
                    let attrs = match bare {
                        0 => String::new(),
                        n => format!(
                            "; {n} item(s) without their extended attributes or ACLs \
                             (the destination's file system keeps none)"
                        ),
                    };
                    eprintln!(
                        "session {:016x}: ok, {} files, {} bytes in {:.2} s, lost {} of {} packets{attrs}",
                        r.session,
                        r.files,
                        r.bytes,
                        r.elapsed.as_secs_f64(),
                        r.lost,
                        r.packets + r.lost
                    );
                } else {
                    eprintln!(
                        "session {:016x}: FAILED: {}",
                        r.session,
                        longhaul_transfer::shown(&r.error)
                    );
                }
                last = Some(r);
            }
            ReceiverEvent::Dropped { from, why } => {
                tracing::debug!("dropped a datagram from {from}: {why}");
            }
            _ => {}
        },
        Some(part),
    )
    .context("receiving")?;
    if let Some(r) = chan.resume_point() {
        let _ = longhaul_mcast::channel::files::write_resume(&resume_file, &r);
    }
    hooks.wait();
    if stop.load(Ordering::Relaxed) {
        return Ok(if a.once { crate::EXIT_INTERRUPTED } else { 0 });
    }
    Ok(match last {
        Some(r) if r.ok => 0,
        Some(r) if r.error.contains("verify") => 6,
        Some(r) if r.error.starts_with("write") || r.error.starts_with("read") => 5,
        _ => 3,
    })
}

/// A line on stderr, or with --json one JSON line on stdout.
fn chan_say(json: bool, line: String, j: serde_json::Value) {
    match json {
        true => println!("{j}"),
        false => eprintln!("{line}"),
    }
}

/// `receive --exec CMD`: run on each file a channel delivers, at most
/// [`Hooks::AT_ONCE`] at a time, the rest queued.
struct Hooks {
    cmd: Option<String>,
    running: Vec<(std::process::Child, PathBuf)>,
    queued: std::collections::VecDeque<PathBuf>,
}

impl Hooks {
    const AT_ONCE: usize = 4;

    fn new(cmd: Option<String>) -> Hooks {
        Hooks {
            cmd,
            running: Vec::new(),
            queued: Default::default(),
        }
    }

    fn run(&mut self, path: PathBuf) {
        if self.cmd.is_some() {
            self.queued.push_back(path);
            self.reap();
        }
    }

    /// Collect those that ended; start queued ones.
    fn reap(&mut self) {
        self.running.retain_mut(|(c, p)| match c.try_wait() {
            Ok(Some(st)) if !st.success() => {
                eprintln!("--exec on {}: {st}", p.display());
                false
            }
            Ok(Some(_)) => false,
            Ok(None) => true,
            Err(e) => {
                eprintln!("--exec on {}: {e}", p.display());
                false
            }
        });
        let Some(cmd) = &self.cmd else { return };
        while self.running.len() < Self::AT_ONCE {
            let Some(p) = self.queued.pop_front() else {
                break;
            };
            match std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{cmd} \"$1\""))
                .arg("longhaul")
                .arg(&p)
                .stdin(std::process::Stdio::null())
                .spawn()
            {
                Ok(c) => self.running.push((c, p)),
                Err(e) => eprintln!("--exec on {}: {e}", p.display()),
            }
        }
    }

    /// Let every hook started or queued finish.
    fn wait(&mut self) {
        while !self.running.is_empty() || !self.queued.is_empty() {
            self.reap();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The receiver's `ended` event: `{"event": "ended"}` and the report's fields.
fn ended_event(r: &ReceiveReport) -> serde_json::Value {
    let mut v = serde_json::to_value(r).expect("a report serialises");
    v.as_object_mut()
        .expect("a report is an object")
        .insert("event".into(), json!("ended"));
    v
}
