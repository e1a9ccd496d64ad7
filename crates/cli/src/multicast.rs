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

Examples:
  longhaul multicast send --group 239.7.7.7:7000 --rate 400M --receivers dwd,knmi ./products
  longhaul multicast send --to 10.0.0.2:7000,10.0.0.3:7000 --rate 100M --open ./obs/

Exit status: 0 every receiver completed and verified, 2 usage, 4 a receiver was
  given up on (or none came), 5 local I/O, 6 a receiver's files did not verify,
  130 interrupted.";

const RECEIVE_HELP: &str = "\
Runs until stopped (Ctrl-C, SIGTERM), taking session after session; --once stops
after the first. Files are written to hidden part files (.NAME.lh-part) beside
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
    /// Files and directories to send.
    #[arg(required = true, value_name = "PATH")]
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
    )
    .context("receiving")?;
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

/// The receiver's `ended` event: `{"event": "ended"}` and the report's fields.
fn ended_event(r: &ReceiveReport) -> serde_json::Value {
    let mut v = serde_json::to_value(r).expect("a report serialises");
    v.as_object_mut()
        .expect("a report is an object")
        .insert("event".into(), json!("ended"));
    v
}
