//! The receiver's protocol core: sans-IO. Input: datagrams and time; output:
//! datagrams to the sender, the next time it wants to be called, events, and the
//! session's bytes through a [`Store`].
//!
//! Source symbols go to the store as they come (a block is assembled in memory
//! while it is current and written in one piece); repair symbols are kept in memory
//! until their block can be rebuilt, then the block's received sources are read
//! back, RaptorQ fills the gaps, and the whole block is written. Memory is bounded
//! by the repair symbols of unfinished blocks, not by the session's size.

use crate::fec;
use crate::json;
use crate::layout::{Layout, Object};
use crate::manifest::Manifest;
use crate::seal::Key;
use crate::wire::{self, AckKind, Announce, Complete, EndReason, Msg, Nack, Register};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Where a session's files go. Offsets are in the data object.
pub trait Store {
    /// The manifest is known: prepare (directories, part files).
    fn begin(&mut self, manifest: &Manifest) -> Result<(), String>;
    /// Write `data` at `offset` of the data object (it may span several files).
    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Read back `buf.len()` bytes written earlier at `offset`, to rebuild a block from the
    /// source symbols it holds.
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Every byte is in: verify each file's BLAKE3 and give it its final name.
    /// Called by the core, or with [`ReceiverConfig::verify_apart`] by the
    /// driver (on a thread of its own, while the core answers the sender).
    fn finish(&mut self) -> Result<(), String>;
    /// How long the last `finish` took (for reports; zero if not measured).
    fn finish_time(&self) -> Duration {
        Duration::ZERO
    }
    /// The session failed: remove what `begin` and `write` left.
    fn abort(&mut self);
    /// May the sealed session `session`, made at `created_us` (the sender's
    /// wall clock, µs since the Unix epoch), be taken? Err: why not (made
    /// too long ago, or taken before: a replay). A store that says yes
    /// remembers the session. The default takes every session.
    fn admit(&mut self, session: u64, created_us: u64) -> Result<(), String> {
        let _ = (session, created_us);
        Ok(())
    }
}

/// A receiver's settings; [`ReceiverConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// Name it registers under: 1–64 bytes of printable ASCII without spaces or commas; a
    /// closed group must list it.
    pub name: String,
    /// Key file contents; with them every datagram must be sealed.
    pub key_material: Option<Vec<u8>>,
    /// Without a key: take unsealed sessions from any sender (a trusted,
    /// closed network). Without a key and without this, every session is
    /// refused ([`ReceiverEvent::Refused`]): anyone who can reach the
    /// receiver could otherwise write files into its store.
    pub accept_unsealed: bool,
    /// A session whose sender has been silent this long is failed.
    pub idle_timeout: Duration,
    /// Extra symbols asked per block beyond K (decoding at K fails ~1 % of the time).
    pub margin: u32,
    /// The driver runs the store's `finish` (verifying every byte, which
    /// takes seconds for gigabytes) when [`Receiver::finish_due`] says,
    /// and hands its result to [`Receiver::verified`]; meanwhile the core
    /// answers the sender's polls (a receiver that fell silent would be
    /// given up on) and touches no store. False: the core calls `finish`
    /// itself, at once.
    pub verify_apart: bool,
}

impl ReceiverConfig {
    /// Defaults for a receiver called `name`: no key (and so no session
    /// taken until a key or `accept_unsealed` is set), a 30 s idle timeout,
    /// a margin of 2.
    pub fn new(name: &str) -> ReceiverConfig {
        ReceiverConfig {
            name: name.to_string(),
            key_material: None,
            accept_unsealed: false,
            idle_timeout: Duration::from_secs(30),
            margin: 2,
            verify_apart: false,
        }
    }
}

/// What became of one session. In `--json` output (the receiver's `ended`
/// event) durations are seconds and the session is 16 hex digits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReceiveReport {
    /// Session id (16 hex digits in JSON).
    #[serde(serialize_with = "json::session_hex")]
    pub session: u64,
    /// Address the session's datagrams came from.
    pub sender: SocketAddr,
    /// Every file arrived, verified and took its final name.
    pub ok: bool,
    /// Why the session failed; empty when `ok`.
    pub error: String,
    /// Files in the manifest (0 if it never arrived).
    pub files: usize,
    /// The session's data length in bytes, from its ANNOUNCE (also when the files did not
    /// arrive).
    pub bytes: u64,
    /// DATA datagrams taken (manifest and data symbols, duplicates included).
    pub packets: u64,
    /// DATA datagrams missed, from gaps in the sender's sequence numbers.
    pub lost: u64,
    /// Blocks rebuilt, manifest and data, counting those complete without decoding.
    pub decoded_blocks: u32,
    /// Decodes that failed (too few independent symbols) and waited for more.
    pub decode_failures: u32,
    /// From the session's first ANNOUNCE to the first data symbol taken; None if none was.
    #[serde(rename = "first_data_seconds", serialize_with = "json::opt_secs")]
    pub first_data: Option<Duration>,
    /// From the session's first ANNOUNCE until every data block was in (the store's
    /// verification follows); None if that never happened.
    #[serde(rename = "data_done_seconds", serialize_with = "json::opt_secs")]
    pub data_done: Option<Duration>,
    /// How long the store's `finish` took (sync, verify, rename); zero if it never ran.
    #[serde(rename = "verify_seconds", serialize_with = "json::secs")]
    pub verify_time: Duration,
    /// From the session's first ANNOUNCE to its end.
    #[serde(rename = "seconds", serialize_with = "json::secs")]
    pub elapsed: Duration,
}

/// What happened in the receiver, from [`Receiver::poll_event`].
#[derive(Debug, Clone, PartialEq)]
pub enum ReceiverEvent {
    /// Registered and the store has begun: the session's data is taken from now on,
    /// `files` files of `bytes` bytes in all.
    Started {
        /// Session id.
        session: u64,
        /// The sender's address.
        sender: SocketAddr,
        /// Files in the manifest.
        files: usize,
        /// Bytes of the data object: all files together.
        bytes: u64,
    },
    /// The sender acknowledged this receiver's REGISTER.
    Registered {
        /// Session id.
        session: u64,
    },
    /// The sender refused our REGISTER: a closed group that does not name us, our name
    /// already registered from another address, or a session already ending.
    Rejected {
        /// Session id (`Ended` follows).
        session: u64,
    },
    /// A session is over, completed or not; the receiver takes the next one.
    Ended(ReceiveReport),
    /// A session was refused: unsealed while this receiver has no key and
    /// does not take unsealed sessions ([`ReceiverConfig::accept_unsealed`]),
    /// or sealed but refused by the store ([`Store::admit`]: made too long
    /// ago, or a replay). Once per session; its datagrams are dropped.
    Refused {
        /// Session id.
        session: u64,
        /// The sender's address.
        sender: SocketAddr,
        /// Why.
        why: String,
    },
    /// A datagram was dropped (counted in `stats`).
    Dropped {
        /// Where it came from.
        from: SocketAddr,
        /// Why: undecodable, another session or sender, a changed ANNOUNCE, a bad symbol, ...
        why: String,
    },
}

/// A receiver's counters over all its sessions, from [`Receiver::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Datagrams handed to [`Receiver::handle`].
    pub datagrams: u64,
    /// Datagrams refused, one per [`ReceiverEvent::Dropped`].
    pub dropped: u64,
    /// Sessions opened (by an ANNOUNCE).
    pub sessions: u64,
}

struct Partial {
    /// Source symbols held (bit per ESI).
    have: Vec<u64>,
    n_src: u32,
    repair: Vec<(u32, Vec<u8>)>,
    /// Try to decode once this many symbols are held.
    target: u32,
    /// Waiting in the session's decode queue.
    queued: bool,
    /// The block's bytes while it is being assembled in memory.
    buf: Option<Vec<u8>>,
}

enum BlockState {
    Done,
    Partial(Box<Partial>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the manifest.
    Manifest,
    /// Manifest in, registering / receiving.
    Receiving,
    /// Every byte in; the store verifies and places the files (the sender's
    /// polls are answered with no needs).
    Verifying,
    /// Reporting completion until acknowledged.
    Reporting { next: Instant, tries: u32 },
}

struct Session {
    id: u64,
    sender: SocketAddr,
    ann: Announce,
    layout: Layout,
    key: Option<Key>,
    start: Instant,
    last_heard: Instant,
    /// Newest sender time seen and when (for RTT echoes).
    echo: (u64, Instant),
    manifest_buf: Vec<u8>,
    manifest: Option<Manifest>,
    blocks: Vec<BlockState>,
    /// Blocks assembled in memory (the current ones), oldest first.
    open: VecDeque<u32>,
    /// Blocks with enough symbols to decode, waiting for `handle_timeout`: decoding
    /// is the receiver's heavy work, and the network (polls above all) goes first.
    ready: VecDeque<u32>,
    undone: u32,
    decoded: u32,
    phase: Phase,
    registered: bool,
    /// The store has begun (after registration: a receiver the group refuses
    /// writes nothing).
    begun: bool,
    next_register: Instant,
    /// NACK datagrams waiting for their random send time.
    nacks: Vec<(Instant, Nack)>,
    complete: Option<Complete>,
    packets: u64,
    seq_first: Option<u64>,
    seq_max: u64,
    /// Bytes of repair symbols held.
    held: usize,
    decode_failures: u32,
    first_data: Option<Instant>,
    data_done: Option<Instant>,
    verify_time: Duration,
}

const MAX_OPEN: usize = 4;
/// Entries per NACK datagram: at most 10 bytes each, well inside 1472 bytes.
const NACK_ENTRIES: usize = 120;
const COMPLETE_TRIES: u32 = 8;
/// Remember this many finished sessions, to ignore their stragglers.
const FINISHED_MEMORY: usize = 64;

/// The receiver's sans-IO core, one session at a time: datagrams go in through
/// [`Receiver::handle`] and time through [`Receiver::handle_timeout`]; datagrams to the
/// sender and events come out of [`Receiver::poll_transmit`] and
/// [`Receiver::poll_event`]; the files go through a [`Store`].
pub struct Receiver {
    cfg: ReceiverConfig,
    sess: Option<Session>,
    finished: VecDeque<u64>,
    /// Unsealed sessions refused lately (at most [`FINISHED_MEMORY`]).
    refused: VecDeque<u64>,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<ReceiverEvent>,
    stats: ReceiverStats,
    rng: rand::rngs::StdRng,
    /// The store's `finish` is due ([`Receiver::finish_due`]).
    finish_due: bool,
}

impl Receiver {
    /// A receiver; fails on an invalid name or a key file shorter than 16 bytes.
    pub fn new(cfg: ReceiverConfig) -> Result<Receiver, String> {
        wire::check_name(&cfg.name)?;
        if let Some(m) = &cfg.key_material {
            Key::from_material(m, 0)?;
        }
        Ok(Receiver {
            cfg,
            sess: None,
            finished: VecDeque::new(),
            refused: VecDeque::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: ReceiverStats::default(),
            rng: rand::rngs::StdRng::from_entropy(),
            finish_due: false,
        })
    }

    /// With [`ReceiverConfig::verify_apart`]: every byte of the session is
    /// in, and the store's `finish` is to run now (true once). Until its
    /// result comes to [`Receiver::verified`] the core calls no store
    /// method, so the driver may lend the store to another thread and pass
    /// any store to `handle` and `handle_timeout` meanwhile.
    pub fn finish_due(&mut self) -> bool {
        std::mem::take(&mut self.finish_due)
    }

    /// The store's `finish` returned `result`: report the session's
    /// completion to the sender (the files are placed), or its failure (the
    /// store's parts are removed).
    pub fn verified(&mut self, now: Instant, result: Result<(), String>, store: &mut dyn Store) {
        let (ok, error) = match result {
            Ok(()) => (true, String::new()),
            Err(e) => (false, e),
        };
        if !ok {
            store.abort();
        }
        let Some(s) = self.sess.as_mut().filter(|s| s.phase == Phase::Verifying) else {
            return;
        };
        s.verify_time = store.finish_time();
        let lost = s.lost();
        s.complete = Some(Complete {
            name: self.cfg.name.clone(),
            ok,
            bytes: s.layout.data_len,
            packets: s.packets,
            lost,
            elapsed_ms: now.saturating_duration_since(s.start).as_millis() as u64,
            error,
        });
        s.nacks.clear();
        self.send_complete(now, 0);
    }

    /// Seed the feedback jitter (deterministic tests).
    pub fn seed(&mut self, seed: u64) {
        self.rng = rand::rngs::StdRng::seed_from_u64(seed);
    }

    /// Counters so far.
    pub fn stats(&self) -> &ReceiverStats {
        &self.stats
    }

    /// The next event, oldest first; None when none is waiting.
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        self.events.pop_front()
    }

    /// The next datagram for the network and where it goes (the session's sender); None
    /// when none is waiting.
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.out.pop_front()
    }

    /// Is a session under way (its first ANNOUNCE taken, not yet over)?
    pub fn busy(&self) -> bool {
        self.sess.is_some()
    }

    /// Fraction of the current session's blocks rebuilt, and its data length.
    pub fn progress(&self) -> Option<(u32, u32, u64)> {
        self.sess
            .as_ref()
            .filter(|s| s.manifest.is_some())
            .map(|s| {
                let data = s.layout.data_range().len() as u32;
                let done = data.saturating_sub(s.undone);
                (done, data, s.layout.data_len)
            })
    }

    /// Refuses a session: said once (the first of at most
    /// [`FINISHED_MEMORY`] remembered), its datagrams dropped.
    fn refuse(&mut self, from: SocketAddr, session: u64, why: String) {
        self.stats.dropped += 1;
        if self.refused.contains(&session) {
            return;
        }
        self.refused.push_back(session);
        if self.refused.len() > FINISHED_MEMORY {
            self.refused.pop_front();
        }
        self.events.push_back(ReceiverEvent::Refused {
            session,
            sender: from,
            why,
        });
    }

    fn drop(&mut self, from: SocketAddr, why: String) {
        self.stats.dropped += 1;
        self.events.push_back(ReceiverEvent::Dropped { from, why });
    }

    /// When [`Receiver::handle_timeout`] should run next (a time in the past: at once, a
    /// block waits to be decoded); None without a session.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let s = self.sess.as_ref()?;
        if !s.ready.is_empty() {
            return Some(s.start); // in the past: a block to decode
        }
        let mut t = s.last_heard + self.cfg.idle_timeout;
        if s.phase == Phase::Receiving && !s.registered {
            t = t.min(s.next_register);
        }
        if let Phase::Reporting { next, .. } = s.phase {
            t = t.min(next);
        }
        if let Some(n) = s.nacks.iter().map(|n| n.0).min() {
            t = t.min(n);
        }
        Some(t)
    }

    /// Time-driven work: registrations, delayed feedback, repeated reports,
    /// timeouts, and one waiting block decoded (call again while `poll_timeout`
    /// says so, reading the network in between).
    pub fn handle_timeout(&mut self, now: Instant, store: &mut dyn Store) {
        let Some(s) = self.sess.as_mut() else { return };
        if let Some(b) = s.ready.pop_front() {
            if let BlockState::Partial(p) = &mut s.blocks[b as usize] {
                p.queued = false;
            }
            self.try_block(now, b, store);
        }
        let Some(s) = self.sess.as_mut() else { return };
        // (Verifying, the store's result decides: the core touches no store.)
        if now >= s.last_heard + self.cfg.idle_timeout && s.phase != Phase::Verifying {
            let why = format!(
                "the sender was silent for {} s",
                self.cfg.idle_timeout.as_secs_f64()
            );
            return self.end(now, store, false, why);
        }
        if s.phase == Phase::Receiving && !s.registered && now >= s.next_register {
            self.send_register(now);
        }
        let s = self.sess.as_mut().expect("session");
        let mut due = Vec::new();
        s.nacks.retain(|(t, n)| {
            if *t <= now {
                due.push(n.clone());
                false
            } else {
                true
            }
        });
        for mut n in due {
            n.held_us = now.saturating_duration_since(s.echo.1).as_micros() as u32;
            n.echo_us = s.echo.0;
            let mut b = Vec::new();
            wire::encode(s.id, &Msg::Nack(n), s.key.as_ref(), &mut b);
            self.out.push_back((s.sender, b));
        }
        if let Phase::Reporting { next, tries } = s.phase {
            if now >= next {
                if tries >= COMPLETE_TRIES {
                    // Never acknowledged: the report is ours anyway.
                    let ok = s.complete.as_ref().is_some_and(|c| c.ok);
                    let err = s
                        .complete
                        .as_ref()
                        .map(|c| c.error.clone())
                        .unwrap_or_default();
                    return self.conclude(now, ok, err);
                }
                self.send_complete(now, tries + 1);
            }
        }
    }

    fn send_register(&mut self, now: Instant) {
        let s = self.sess.as_mut().expect("session");
        let m = Msg::Register(Register {
            name: self.cfg.name.clone(),
            echo_us: s.echo.0,
            held_us: now.saturating_duration_since(s.echo.1).as_micros() as u32,
        });
        let mut b = Vec::new();
        wire::encode(s.id, &m, s.key.as_ref(), &mut b);
        self.out.push_back((s.sender, b));
        // Again after about a round trip if no ACK came.
        let grtt = Duration::from_micros(s.ann.grtt_us as u64).max(Duration::from_millis(50));
        s.next_register = now + grtt + grtt / 2;
    }

    fn send_complete(&mut self, now: Instant, tries: u32) {
        let s = self.sess.as_mut().expect("session");
        let c = s.complete.clone().expect("complete");
        let mut b = Vec::new();
        wire::encode(s.id, &Msg::Complete(c), s.key.as_ref(), &mut b);
        self.out.push_back((s.sender, b));
        let grtt = Duration::from_micros(s.ann.grtt_us as u64).max(Duration::from_millis(50));
        // Back off: 1.5, 3, 6 ... round trips (capped at 8 s).
        let wait = (grtt + grtt / 2) * (1u32 << tries.min(6));
        s.phase = Phase::Reporting {
            next: now + wait.min(Duration::from_secs(8)),
            tries,
        };
    }

    /// A datagram from the network.
    pub fn handle(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &mut [u8],
        store: &mut dyn Store,
    ) {
        self.stats.datagrams += 1;
        let h = match wire::header(datagram) {
            Ok(h) => h,
            Err(e) => return self.drop(from, e.to_string()),
        };
        if self.finished.contains(&h.session) {
            return; // a finished session's stragglers
        }
        let current = self.sess.as_ref().map(|s| (s.id, s.sender));
        if let Some((id, sender)) = current {
            if id != h.session {
                return self.drop(
                    from,
                    format!("session {:016x} while {id:016x} runs", h.session),
                );
            }
            if sender != from {
                return self.drop(
                    from,
                    format!("session {id:016x} from {from}, not its sender {sender}"),
                );
            }
        }
        if let (Some(m), None) = (&self.cfg.key_material, &self.sess) {
            // Only an ANNOUNCE may open a session; its key derives from the session id.
            if h.kind != wire::Kind::Announce {
                return self.drop(from, format!("{:?} before any ANNOUNCE", h.kind));
            }
            if self.refused.contains(&h.session) {
                self.stats.dropped += 1;
                return;
            }
            let k = match Key::from_material(m, h.session) {
                Ok(k) => k,
                Err(e) => return self.drop(from, e),
            };
            match wire::decode(datagram, Some(&k)) {
                Ok((_, Msg::Announce(a))) => match store.admit(h.session, a.created_us) {
                    Ok(()) => self.open_session(now, from, h.session, a, Some(k)),
                    Err(why) => self.refuse(from, h.session, why),
                },
                Ok(_) => unreachable!("kind checked"),
                Err(e) => self.drop(from, e.to_string()),
            }
            return;
        }
        let decoded = {
            let key = self.sess.as_ref().and_then(|s| s.key.as_ref());
            wire::decode(datagram, key)
        };
        let msg = match decoded {
            Ok((_, m)) => m,
            Err(e) => return self.drop(from, e.to_string()),
        };
        if !msg.from_sender() {
            return self.drop(from, format!("{:?} from another receiver", msg.kind()));
        }
        if self.sess.is_none() {
            match msg {
                Msg::Announce(_) if !self.cfg.accept_unsealed => {
                    let why = "not sealed, and this receiver has no key".to_string();
                    self.refuse(from, h.session, why);
                }
                Msg::Announce(a) => self.open_session(now, from, h.session, a, None),
                m => self.drop(from, format!("{:?} before any ANNOUNCE", m.kind())),
            }
            return;
        }
        let s = self.sess.as_mut().expect("session");
        s.last_heard = now;
        match msg {
            Msg::Announce(a) => {
                if a.manifest_hash != s.ann.manifest_hash
                    || a.data_len != s.ann.data_len
                    || a.symbol_size != s.ann.symbol_size
                    || a.block_symbols != s.ann.block_symbols
                {
                    return self.drop(from, "ANNOUNCE changed the session's parameters".into());
                }
                s.echo = (a.time_us, now);
                s.ann.grtt_us = a.grtt_us;
            }
            Msg::Data(h, sym) => self.on_data(now, h, sym, store),
            Msg::Poll(p) => self.on_poll(now, p),
            Msg::Ack(a) => {
                if a.name != self.cfg.name {
                    return;
                }
                match a.kind {
                    AckKind::Registered => {
                        if !s.registered {
                            s.registered = true;
                            self.events
                                .push_back(ReceiverEvent::Registered { session: s.id });
                            self.begin(now, store);
                        }
                    }
                    AckKind::Done => {
                        if let Phase::Reporting { .. } = s.phase {
                            let c = s.complete.clone().expect("complete");
                            self.conclude(now, c.ok, c.error);
                        }
                    }
                    AckKind::Rejected => {
                        let id = s.id;
                        self.events
                            .push_back(ReceiverEvent::Rejected { session: id });
                        self.end(
                            now,
                            store,
                            false,
                            "not a member of this closed group".into(),
                        );
                    }
                }
            }
            Msg::End(e) => {
                let s = self.sess.as_ref().expect("session");
                if s.phase == Phase::Verifying {
                    // Every byte is in: the files are placed if they verify,
                    // and that is reported then (to no one, if it is gone).
                    return;
                }
                if let Phase::Reporting { .. } = s.phase {
                    let c = s.complete.clone().expect("complete");
                    return self.conclude(now, c.ok, c.error);
                }
                let why = match e.reason {
                    EndReason::Finished => {
                        "the sender ended the session before this receiver completed"
                    }
                    EndReason::Aborted => "the sender aborted the session",
                };
                self.end(now, store, false, why.into());
            }
            _ => unreachable!("receiver messages filtered above"),
        }
    }

    fn open_session(
        &mut self,
        now: Instant,
        from: SocketAddr,
        id: u64,
        a: Announce,
        key: Option<Key>,
    ) {
        let layout = match Layout::new(a.symbol_size, a.block_symbols, a.manifest_len, a.data_len) {
            Ok(l) => l,
            Err(e) => return self.drop(from, format!("ANNOUNCE: {e}")),
        };
        let blocks = (0..layout.blocks())
            .map(|b| {
                BlockState::Partial(Box::new(Partial::new(
                    layout.block(b).expect("block").k as u32,
                )))
            })
            .collect();
        let undone = layout.data_range().len() as u32;
        self.stats.sessions += 1;
        self.sess = Some(Session {
            id,
            sender: from,
            echo: (a.time_us, now),
            manifest_buf: vec![0; layout.manifest_len as usize],
            layout,
            ann: a,
            key,
            start: now,
            last_heard: now,
            manifest: None,
            blocks,
            open: VecDeque::new(),
            ready: VecDeque::new(),
            undone,
            decoded: 0,
            phase: Phase::Manifest,
            registered: false,
            begun: false,
            next_register: now,
            nacks: Vec::new(),
            complete: None,
            packets: 0,
            seq_first: None,
            seq_max: 0,
            held: 0,
            decode_failures: 0,
            first_data: None,
            data_done: None,
            verify_time: Duration::ZERO,
        });
    }

    fn on_data(&mut self, now: Instant, h: wire::DataHdr, sym: &[u8], store: &mut dyn Store) {
        let s = self.sess.as_mut().expect("session");
        let from = s.sender;
        let t = s.layout.symbol_size as usize;
        let Some(blk) = s.layout.block(h.block) else {
            return self.drop(from, format!("block {} beyond the session", h.block));
        };
        if sym.len() != t || h.esi > fec::MAX_ESI {
            return self.drop(
                from,
                format!("symbol of {} bytes, ESI {}", sym.len(), h.esi),
            );
        }
        s.packets += 1;
        s.seq_first = Some(s.seq_first.map_or(h.seq, |f| f.min(h.seq)));
        s.seq_max = s.seq_max.max(h.seq);
        if blk.object == Object::Data {
            if !s.begun {
                return; // cannot place data yet; a later pass brings it again
            }
            s.first_data.get_or_insert(now);
        }
        let b = h.block as usize;
        let k = blk.k as u32;
        let BlockState::Partial(p) = &mut s.blocks[b] else {
            return; // already rebuilt
        };
        if h.esi < k {
            let (w, bit) = ((h.esi / 64) as usize, 1u64 << (h.esi % 64));
            if p.have[w] & bit != 0 {
                return;
            }
            p.have[w] |= bit;
            p.n_src += 1;
            let at = h.esi as usize * t;
            match blk.object {
                Object::Manifest => {
                    let end = (at + t).min(blk.len as usize);
                    let o = blk.offset as usize;
                    s.manifest_buf[o + at..o + end].copy_from_slice(&sym[..end - at]);
                }
                Object::Data => {
                    if p.buf.is_none() && p.n_src == 1 && p.repair.is_empty() {
                        // First sight of this block: assemble it in memory.
                        p.buf = Some(vec![0; k as usize * t]);
                        s.open.push_back(h.block);
                    }
                    if let Some(buf) = p.buf.as_mut() {
                        buf[at..at + t].copy_from_slice(sym);
                    } else {
                        let end = (at + t).min(blk.len as usize);
                        if let Err(e) = store.write(blk.offset + at as u64, &sym[..end - at]) {
                            return self.end(now, store, false, format!("write: {e}"));
                        }
                    }
                }
            }
        } else {
            if p.repair.iter().any(|(e, _)| *e == h.esi) {
                return;
            }
            p.repair.push((h.esi, sym.to_vec()));
            s.held += t;
        }
        let held = p.n_src + p.repair.len() as u32;
        if p.n_src == k {
            // Nothing to decode: done at once.
            self.try_block(now, h.block, store);
        } else if held >= p.target && !p.queued {
            p.queued = true;
            s.ready.push_back(h.block);
        }
        self.evict(now, store);
    }

    /// Write out the oldest in-memory blocks beyond the bound.
    fn evict(&mut self, now: Instant, store: &mut dyn Store) {
        let s = self.sess.as_mut().expect("session");
        while s.open.len() > MAX_OPEN {
            let b = s.open.pop_front().expect("open block");
            let blk = s.layout.block(b).expect("block");
            let t = s.layout.symbol_size as usize;
            if let BlockState::Partial(p) = &mut s.blocks[b as usize] {
                let Some(buf) = p.buf.take() else { continue };
                // Runs of held source symbols, one write each.
                let mut i = 0;
                while i < blk.k as u32 {
                    if !p.has(i) {
                        i += 1;
                        continue;
                    }
                    let j = (i..blk.k as u32)
                        .find(|&j| !p.has(j))
                        .unwrap_or(blk.k as u32);
                    let (a, z) = (i as usize * t, (j as usize * t).min(blk.len as usize));
                    if let Err(e) = store.write(blk.offset + a as u64, &buf[a..z]) {
                        return self.end(now, store, false, format!("write: {e}"));
                    }
                    i = j;
                }
            }
        }
    }

    /// Enough symbols for block `b`: rebuild it (or note the rare failure).
    fn try_block(&mut self, now: Instant, b: u32, store: &mut dyn Store) {
        let s = self.sess.as_mut().expect("session");
        let blk = s.layout.block(b).expect("block");
        let t = s.layout.symbol_size as usize;
        let k = blk.k as u32;
        let BlockState::Partial(p) = &mut s.blocks[b as usize] else {
            return;
        };
        let whole: Option<Vec<u8>> = if p.n_src == k {
            // Every source symbol: nothing to decode.
            match blk.object {
                Object::Manifest => Some(Vec::new()),
                Object::Data => p.buf.take().or(Some(Vec::new())),
            }
        } else {
            // Gather the sources held, then decode.
            let in_memory = p.buf.is_some();
            let mut src = match (blk.object, p.buf.take()) {
                (Object::Manifest, _) => {
                    let o = blk.offset as usize;
                    let mut v = s.manifest_buf[o..o + blk.len as usize].to_vec();
                    v.resize(k as usize * t, 0);
                    v
                }
                (Object::Data, Some(buf)) => buf,
                (Object::Data, None) => {
                    let mut v = vec![0u8; k as usize * t];
                    let mut i = 0;
                    while i < k {
                        if !p.has(i) {
                            i += 1;
                            continue;
                        }
                        let j = (i..k).find(|&j| !p.has(j)).unwrap_or(k);
                        let (a, z) = (i as usize * t, (j as usize * t).min(blk.len as usize));
                        if let Err(e) = store.read(blk.offset + a as u64, &mut v[a..z]) {
                            return self.end(now, store, false, format!("read: {e}"));
                        }
                        i = j;
                    }
                    v
                }
            };
            let syms = (0..k)
                .filter(|&i| p.has(i))
                .map(|i| (i, src[i as usize * t..(i as usize + 1) * t].to_vec()))
                .chain(p.repair.iter().cloned())
                .collect::<Vec<_>>();
            match fec::decode(blk.k, t as u16, syms) {
                Some(d) => {
                    src = d;
                    Some(src)
                }
                None => {
                    s.decode_failures += 1;
                    // Unlucky: wait for one more symbol than now.
                    p.target = p.n_src + p.repair.len() as u32 + 1;
                    if in_memory {
                        p.buf = Some(src);
                    }
                    None
                }
            }
        };
        let Some(data) = whole else { return };
        s.held -= p.repair.len() * t;
        s.blocks[b as usize] = BlockState::Done;
        s.open.retain(|&x| x != b);
        s.decoded += 1;
        match blk.object {
            Object::Manifest => {
                if !data.is_empty() {
                    let o = blk.offset as usize;
                    s.manifest_buf[o..o + blk.len as usize]
                        .copy_from_slice(&data[..blk.len as usize]);
                }
                self.manifest_block_done(now, store);
            }
            Object::Data => {
                if !data.is_empty() {
                    if let Err(e) = store.write(blk.offset, &data[..blk.len as usize]) {
                        return self.end(now, store, false, format!("write: {e}"));
                    }
                }
                s.undone -= 1;
                self.maybe_complete(now, store);
            }
        }
    }

    fn manifest_block_done(&mut self, now: Instant, store: &mut dyn Store) {
        let s = self.sess.as_mut().expect("session");
        let m = s.layout.manifest_blocks() as usize;
        if !s.blocks[..m].iter().all(|b| matches!(b, BlockState::Done)) {
            return;
        }
        let from = s.sender;
        if *blake3::hash(&s.manifest_buf).as_bytes() != s.ann.manifest_hash {
            let why = "manifest does not match the announced BLAKE3".to_string();
            self.drop(from, why.clone());
            return self.end(now, store, false, why);
        }
        let man = match Manifest::decode(&s.manifest_buf, s.ann.data_len) {
            Ok(m) => m,
            Err(e) => {
                self.drop(from, e.clone());
                return self.end(now, store, false, e);
            }
        };
        s.manifest = Some(man);
        s.manifest_buf = Vec::new();
        s.phase = Phase::Receiving;
        self.send_register(now);
    }

    /// Registered: open the store and take data from now on.
    fn begin(&mut self, now: Instant, store: &mut dyn Store) {
        let s = self.sess.as_mut().expect("session");
        let Some(man) = s.manifest.as_ref() else {
            return;
        };
        if let Err(e) = store.begin(man) {
            return self.end(now, store, false, e);
        }
        s.begun = true;
        self.events.push_back(ReceiverEvent::Started {
            session: s.id,
            sender: s.sender,
            files: man.files(),
            bytes: s.ann.data_len,
        });
        self.maybe_complete(now, store);
    }

    fn maybe_complete(&mut self, now: Instant, store: &mut dyn Store) {
        let s = self.sess.as_mut().expect("session");
        if s.undone > 0 || s.phase != Phase::Receiving || !s.begun {
            return;
        }
        s.data_done = Some(now);
        s.phase = Phase::Verifying;
        match self.cfg.verify_apart {
            true => self.finish_due = true,
            false => {
                let r = store.finish();
                self.verified(now, r, store);
            }
        }
    }

    fn on_poll(&mut self, now: Instant, p: wire::Poll) {
        let margin = self.cfg.margin;
        let name = self.cfg.name.clone();
        let s = self.sess.as_mut().expect("session");
        s.echo = (p.time_us, now);
        match s.phase {
            Phase::Reporting { tries, .. } => {
                // The sender still polls: it may have missed our report.
                return self.send_complete(now, tries);
            }
            // Answer even before our registration is acknowledged: the
            // answer registers us if the REGISTER was lost; while verifying
            // (needing nothing), that we are alive.
            Phase::Receiving | Phase::Verifying => {}
            _ => return,
        }
        // Ask for enough that, after losing our share of them, K + margin arrive.
        let loss = (s.lost() as f64 / (s.packets + s.lost()).max(1) as f64).min(0.5);
        let mut needs: Vec<(u32, u32)> = Vec::new();
        for (b, st) in s.blocks.iter().enumerate() {
            if let BlockState::Partial(p) = st {
                if p.queued {
                    continue; // about to be decoded
                }
                let held = p.n_src + p.repair.len() as u32;
                let need = (p.target + margin).saturating_sub(held);
                if need > 0 {
                    needs.push((b as u32, (need as f64 / (1.0 - loss)).ceil() as u32));
                }
            }
        }
        let parts: Vec<&[(u32, u32)]> = if needs.is_empty() {
            vec![&[]]
        } else {
            needs.chunks(NACK_ENTRIES).collect()
        };
        let n = parts.len().min(u16::MAX as usize) as u16;
        let loss_ppm = (loss * 1e6) as u32;
        let window = Duration::from_micros(p.window_us as u64);
        for (i, part) in parts.into_iter().take(n as usize).enumerate() {
            // Blocks as deltas; each part's first entry is absolute.
            let mut prev = None;
            let entries = part
                .iter()
                .map(|&(b, need)| {
                    let d = prev.map_or(b, |p| b - p);
                    prev = Some(b);
                    (d, need)
                })
                .collect();
            let delay = window.mul_f64(self.rng.gen::<f64>());
            s.nacks.push((
                now + delay,
                Nack {
                    name: name.clone(),
                    pass: p.pass,
                    round: p.round,
                    echo_us: 0,
                    held_us: 0,
                    loss_ppm,
                    part: i as u16,
                    parts: n,
                    needs: entries,
                },
            ));
        }
    }

    /// End the current session as failed (or, from `conclude`, as reported).
    fn end(&mut self, now: Instant, store: &mut dyn Store, ok: bool, error: String) {
        if !ok {
            store.abort();
        }
        self.conclude(now, ok, error);
    }

    fn conclude(&mut self, now: Instant, ok: bool, error: String) {
        let Some(s) = self.sess.take() else { return };
        self.finished.push_back(s.id);
        if self.finished.len() > FINISHED_MEMORY {
            self.finished.pop_front();
        }
        self.events.push_back(ReceiverEvent::Ended(ReceiveReport {
            session: s.id,
            sender: s.sender,
            ok,
            error,
            files: s.manifest.as_ref().map_or(0, |m| m.files()),
            bytes: s.layout.data_len,
            packets: s.packets,
            lost: s.lost(),
            decoded_blocks: s.decoded,
            decode_failures: s.decode_failures,
            first_data: s.first_data.map(|t| t.saturating_duration_since(s.start)),
            data_done: s.data_done.map(|t| t.saturating_duration_since(s.start)),
            verify_time: s.verify_time,
            elapsed: now.saturating_duration_since(s.start),
        }));
    }
}

impl Session {
    fn lost(&self) -> u64 {
        match self.seq_first {
            Some(f) => (self.seq_max - f + 1).saturating_sub(self.packets),
            None => 0,
        }
    }
}

impl Partial {
    fn new(k: u32) -> Partial {
        Partial {
            have: vec![0; (k as usize).div_ceil(64)],
            n_src: 0,
            repair: Vec::new(),
            target: k,
            queued: false,
            buf: None,
        }
    }

    fn has(&self, i: u32) -> bool {
        self.have[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
}
