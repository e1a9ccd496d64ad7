//! The sender's protocol core: sans-IO. Input: datagrams and time; output:
//! datagrams (to the group or to one receiver), the next time it wants to be
//! called, and events. Block bytes come from a [`Source`].
//!
//! A session runs: announce (ANNOUNCE and the manifest's symbols, repeated, until
//! the closed group's receivers have all registered or the announce window ends) →
//! pass 1 (every data block's source symbols plus `overhead` repair symbols, paced
//! at the rate) → POLL → each receiver answers with what every block still lacks →
//! pass n (for each block, as many fresh repair symbols as the neediest receiver
//! asked for) → ... until every receiver completed or was given up on → END.

use crate::fec::{Encoder, MAX_ESI};
use crate::layout::{Layout, Object};
use crate::seal::Key;
use crate::wire::{self, Ack, AckKind, Announce, DataHdr, End, EndReason, Msg, Poll};
use serde::ser::{Serialize, SerializeStruct, Serializer};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Reads the data object (every file back to back).
pub trait Source {
    /// Fill all of `buf` with the data object's bytes from `offset` on. An error (a file
    /// that shrank or went away) comes back from [`Sender::poll_transmit`].
    fn read_data(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

/// Who may join a session (announced to receivers as `open`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    /// Only these receivers; the session waits (up to the announce window) for all.
    Closed(Vec<String>),
    /// Whoever registers.
    Open,
}

/// A sender's settings. The default: 100 Mbit/s, 1400-byte symbols, 1024-symbol blocks,
/// 2 % overhead, an open group, a 2 s announce window.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Sending rate in bit/s, counting `wire_overhead` per datagram; at least 8000.
    pub rate_bps: u64,
    /// Bytes per symbol: a multiple of 8 in 64..=8192 that fits a datagram with its header,
    /// DATA fields and (sealed) nonce and tag.
    pub symbol_size: u16,
    /// Source symbols of a full block (1..=8192): blocks hold `block_symbols × symbol_size`
    /// bytes (an object's last block may hold fewer).
    pub block_symbols: u16,
    /// Repair symbols sent in pass 1, as a fraction of each block's source symbols.
    pub overhead: f64,
    /// Closed (only the receivers it names) or open (whoever registers).
    pub group: Group,
    /// Open group: how long registrations are taken before data starts. Closed
    /// group: how long to wait for every named receiver before starting anyway.
    pub announce_window: Duration,
    /// Round-trip time assumed before any is measured.
    pub initial_grtt: Duration,
    /// Receivers spread their feedback over this window (default: a quarter GRTT).
    pub feedback_window: Option<Duration>,
    /// A receiver still incomplete after this many passes is given up on.
    pub max_passes: u32,
    /// A receiver that answers this many polls in a row with silence, and has not
    /// been heard from for `silent_time`, is given up on.
    pub silent_polls: u32,
    /// How long a receiver must also have been unheard from before `silent_polls` unanswered
    /// polls give it up.
    pub silent_time: Duration,
    /// Bytes below UDP a datagram costs on the wire (IPv4 + UDP headers).
    pub wire_overhead: usize,
    /// How much sending a stalled sender may make up in one burst (see pacing).
    pub catch_up: Duration,
    /// When the session was made: the sender's wall clock, µs since the Unix
    /// epoch ([`crate::wire::Announce::created_us`]).
    pub created_us: u64,
}

impl Default for SenderConfig {
    fn default() -> Self {
        SenderConfig {
            rate_bps: 100_000_000,
            symbol_size: 1400,
            block_symbols: 1024,
            overhead: 0.02,
            group: Group::Open,
            announce_window: Duration::from_secs(2),
            initial_grtt: Duration::from_millis(500),
            feedback_window: None,
            max_passes: 50,
            silent_polls: 4,
            silent_time: Duration::from_secs(5),
            wire_overhead: 28,
            catch_up: Duration::from_millis(10),
            created_us: 0,
        }
    }
}

/// Where a datagram from [`Sender::poll_transmit`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendTo {
    /// To the group: its multicast address, or every fan-out address.
    Group,
    /// To this one receiver's address only (ACKs).
    To(SocketAddr),
}

/// A sender's pacing: when the next datagram may go.
pub(crate) struct Pace {
    pub(crate) rate_bps: u64,
    pub(crate) wire_overhead: usize,
    pub(crate) catch_up: Duration,
    pub(crate) start: Instant,
}

impl Pace {
    /// When the next datagram may go, after one of `len` bytes sent at
    /// `now` that was due at `due`. A sender that fell behind (preempted, or
    /// encoding a block) catches up, but by at most `catch_up` of sending in
    /// one burst; idle spells bank nothing.
    pub(crate) fn after(&self, due: Instant, now: Instant, len: usize) -> Instant {
        let cost = (len + self.wire_overhead) as u64 * 8;
        let step = Duration::from_nanos(cost * 1_000_000_000 / self.rate_bps);
        let floor = now - self.catch_up.min(now.saturating_duration_since(self.start));
        due.max(floor) + step
    }
}

/// Where one receiver stands, as the sender sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum RxState {
    /// Named by a closed group, not (yet) heard from.
    Expected,
    /// Registered and not complete: it is served and polled, and its RTT counts towards the
    /// GRTT.
    Active,
    /// Reported completion with every file verified.
    Completed,
    /// Reported completion, but its files did not verify.
    Failed(String),
    /// Given up on (never registered, silent, or still incomplete after `max_passes`), with
    /// the reason.
    GaveUp(String),
}

/// One receiver as the sender sees it.
#[derive(Debug, Clone)]
pub struct RxReport {
    /// Name it registered under, or that the closed group expects.
    pub name: String,
    /// Address it registered from; None if it never did.
    pub addr: Option<SocketAddr>,
    /// Where it stands now.
    pub state: RxState,
    /// Round-trip time from its echoes, smoothed (¾ old, ¼ new) over its NACKs; None
    /// before any sample.
    pub rtt: Option<Duration>,
    /// The session's data length in bytes, as the receiver reported it on completion (0
    /// before).
    pub bytes: u64,
    /// DATA datagrams it reported taking (0 before its completion report).
    pub packets: u64,
    /// DATA datagrams it reported missing (0 before its completion report).
    pub lost: u64,
    /// Loss it reported last (parts per million).
    pub loss_ppm: u32,
    /// Passes it took to complete: 1 if pass 1 sufficed, else one more than the
    /// last pass after which it asked for repair (or the pass it was given up in).
    pub passes: u32,
    /// From the session's start to its completion report reaching the sender.
    pub time: Option<Duration>,
    /// It registered after pass 1 had started.
    pub late: bool,
}

impl RxState {
    /// The state's name in reports (`--json`): `never registered`,
    /// `incomplete`, `completed`, `failed` or `given up`.
    pub fn name(&self) -> &'static str {
        match self {
            RxState::Expected => "never registered",
            RxState::Active => "incomplete",
            RxState::Completed => "completed",
            RxState::Failed(_) => "failed",
            RxState::GaveUp(_) => "given up",
        }
    }

    /// Why it failed or was given up; empty otherwise.
    pub fn reason(&self) -> &str {
        match self {
            RxState::Failed(w) | RxState::GaveUp(w) => w,
            _ => "",
        }
    }
}

/// In `--json` output: `state` by name with its `reason`, `loss` as a
/// fraction, `rtt_ms`, `seconds`, and `mbps` (completed receivers only).
impl Serialize for RxReport {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("RxReport", 13)?;
        m.serialize_field("name", &self.name)?;
        m.serialize_field("addr", &self.addr)?;
        m.serialize_field("state", self.state.name())?;
        m.serialize_field("reason", self.state.reason())?;
        m.serialize_field("bytes", &self.bytes)?;
        m.serialize_field("packets", &self.packets)?;
        m.serialize_field("lost", &self.lost)?;
        m.serialize_field("loss", &(self.loss_ppm as f64 / 1e6))?;
        m.serialize_field("passes", &self.passes)?;
        m.serialize_field("late", &self.late)?;
        m.serialize_field("rtt_ms", &self.rtt.map(|d| d.as_secs_f64() * 1e3))?;
        m.serialize_field("seconds", &self.time.map(|d| d.as_secs_f64()))?;
        let mbps = self
            .time
            .filter(|_| self.state == RxState::Completed)
            .map(|d| self.bytes as f64 * 8.0 / d.as_secs_f64() / 1e6);
        m.serialize_field("mbps", &mbps)?;
        m.end()
    }
}

/// What happened in the sender, from [`Sender::poll_event`].
#[derive(Debug, Clone, PartialEq)]
pub enum SenderEvent {
    /// A receiver joined: its first REGISTER, or a NACK standing in for a lost one.
    Registered {
        /// Name it registered under.
        name: String,
        /// Address it registered from; its later datagrams count only from there.
        addr: SocketAddr,
        /// It came after pass 1 had started.
        late: bool,
    },
    /// A REGISTER refused: a closed group does not name it, or the session is ending. (A
    /// name already registered from another address is refused too, reported as `Dropped`.)
    Rejected {
        /// Name it asked to register under.
        name: String,
        /// Address the REGISTER came from (the ACK Rejected goes there).
        addr: SocketAddr,
    },
    /// A pass begins.
    PassStarted {
        /// Pass number, from 1.
        pass: u32,
        /// Blocks the pass sends symbols of.
        blocks: u32,
        /// Symbols planned: sources plus `overhead` repair in pass 1, fresh repair only later.
        symbols: u64,
    },
    /// A receiver's first completion report arrived.
    Completed {
        /// The reporting receiver.
        name: String,
        /// Its files all arrived and verified.
        ok: bool,
        /// Its error when not `ok`; empty otherwise.
        error: String,
    },
    /// A receiver was given up on (it is reported, and no longer waited for).
    GaveUp {
        /// The receiver given up on.
        name: String,
        /// Why: never registered, no answer to n polls, or still incomplete after n passes.
        reason: String,
    },
    /// Dropped datagrams, with why (counted; also in `stats`).
    Dropped {
        /// Where the datagram came from.
        from: SocketAddr,
        /// Why it was dropped (undecodable, another session, an unregistered name or address, ...).
        why: String,
    },
    /// The session is over and its END datagrams are out; [`Sender::is_done`] now holds.
    Finished,
}

/// A sender's counters for its session, from [`Sender::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Datagrams handed out by `poll_transmit`, of every type.
    pub datagrams: u64,
    /// Their bytes: UDP payloads, IP and UDP headers not counted.
    pub bytes: u64,
    /// Source symbols of data blocks sent.
    pub data_packets: u64,
    /// Repair symbols of data blocks sent.
    pub repair_packets: u64,
    /// Symbols of manifest blocks sent (sources and repair).
    pub manifest_packets: u64,
    /// Datagrams refused, one per [`SenderEvent::Dropped`].
    pub dropped: u64,
    /// Passes started so far.
    pub passes: u32,
}

struct Rx {
    addr: Option<SocketAddr>,
    state: RxState,
    rtt: Option<Duration>,
    /// Answer parts received for the current poll.
    parts_seen: Vec<bool>,
    answered: bool,
    silent: u32,
    last_heard: Option<Instant>,
    bytes: u64,
    packets: u64,
    lost: u64,
    loss_ppm: u32,
    passes: u32,
    /// The last pass after which it asked for symbols.
    asked: u32,
    time: Option<Duration>,
    late: bool,
}

impl Rx {
    fn new(addr: Option<SocketAddr>, state: RxState) -> Rx {
        Rx {
            addr,
            state,
            rtt: None,
            parts_seen: Vec::new(),
            answered: false,
            silent: 0,
            last_heard: None,
            bytes: 0,
            packets: 0,
            lost: 0,
            loss_ppm: 0,
            passes: 0,
            asked: 0,
            time: None,
            late: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Announce,
    Sending,
    Feedback { deadline: Instant },
    Ending { left: u32, next: Instant },
    Done,
}

/// The block being sent.
struct Cur {
    block: u32,
    k: u16,
    data: Vec<u8>,
    enc: Option<Encoder>,
    /// Next source ESI to send (== k when sources are done or not in this pass).
    src_next: u32,
    repair_left: u32,
    repair: VecDeque<(u32, Vec<u8>)>,
}

const REPAIR_BATCH: u32 = 64;
const ENDS: u32 = 3;

/// The sender's sans-IO core for one session: datagrams from receivers go in through
/// [`Sender::handle`]; datagrams out, deadlines and events come from
/// [`Sender::poll_transmit`], [`Sender::poll_timeout`] and [`Sender::poll_event`].
pub struct Sender {
    cfg: SenderConfig,
    session: u64,
    key: Option<Key>,
    layout: Layout,
    manifest: Vec<u8>,
    manifest_hash: [u8; 32],
    manifest_enc: Vec<Option<Encoder>>,
    /// Next fresh ESI of each block (source ESIs first, then repair).
    next_esi: Vec<u32>,
    start: Instant,
    phase: Phase,
    rx: BTreeMap<String, Rx>,
    seq: u64,
    next_send: Instant,
    control: VecDeque<(SendTo, Vec<u8>)>,
    cur: Option<Cur>,
    plan: VecDeque<(u32, u32)>,
    /// Per block, the most symbols any receiver asked for in this poll.
    needs: BTreeMap<u32, u32>,
    mqueue: VecDeque<(u32, u32)>,
    next_announce: Instant,
    pass: u32,
    round: u32,
    poll_time_us: u64,
    events: VecDeque<SenderEvent>,
    stats: SenderStats,
    started_data: bool,
}

impl Sender {
    /// A session for `manifest` (encoded) over a data object of `data_len` bytes.
    pub fn new(
        cfg: SenderConfig,
        session: u64,
        key: Option<Key>,
        manifest: Vec<u8>,
        data_len: u64,
        now: Instant,
    ) -> Result<Sender, String> {
        if cfg.rate_bps < 8_000 {
            return Err("rate must be at least 8 kbit/s".into());
        }
        if !(0.0..=10.0).contains(&cfg.overhead) {
            return Err("overhead must be a fraction in 0..=10".into());
        }
        let layout = Layout::new(
            cfg.symbol_size,
            cfg.block_symbols,
            manifest.len() as u64,
            data_len,
        )?;
        let max = wire::MAX_DATAGRAM
            - wire::HEADER_LEN
            - wire::DATA_FIELDS
            - if key.is_some() {
                wire::SEAL_OVERHEAD
            } else {
                0
            };
        if cfg.symbol_size as usize > max {
            return Err(format!("symbol size {} exceeds {max}", cfg.symbol_size));
        }
        let mut rx = BTreeMap::new();
        if let Group::Closed(names) = &cfg.group {
            if names.is_empty() {
                return Err("a closed group needs at least one receiver".into());
            }
            for n in names {
                wire::check_name(n)?;
                rx.insert(n.clone(), Rx::new(None, RxState::Expected));
            }
        }
        let blocks = layout.blocks() as usize;
        let next_esi = (0..layout.blocks()).map(|_| 0).collect();
        let manifest_hash = *blake3::hash(&manifest).as_bytes();
        let mut s = Sender {
            manifest_enc: (0..layout.manifest_blocks()).map(|_| None).collect(),
            cfg,
            session,
            key,
            layout,
            manifest,
            manifest_hash,
            next_esi,
            start: now,
            phase: Phase::Announce,
            rx,
            seq: 0,
            next_send: now,
            control: VecDeque::new(),
            cur: None,
            plan: VecDeque::with_capacity(blocks),
            needs: BTreeMap::new(),
            mqueue: VecDeque::new(),
            next_announce: now,
            pass: 0,
            round: 0,
            poll_time_us: 0,
            events: VecDeque::new(),
            stats: SenderStats::default(),
            started_data: false,
        };
        s.schedule_manifest();
        Ok(s)
    }

    /// The session id every datagram carries.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// Source symbols in the whole session (manifest and data): what one
    /// pass sends before any repair.
    pub fn total_symbols(&self) -> u64 {
        self.layout.total_symbols()
    }

    /// Counters so far.
    pub fn stats(&self) -> &SenderStats {
        &self.stats
    }

    /// The session is over and its END datagrams went out: stop driving the core.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The next event, oldest first; None when none is waiting.
    pub fn poll_event(&mut self) -> Option<SenderEvent> {
        self.events.pop_front()
    }

    /// The group round-trip time: the largest measured among live receivers.
    pub fn grtt(&self) -> Duration {
        self.rx
            .values()
            .filter(|r| r.state == RxState::Active)
            .filter_map(|r| r.rtt)
            .max()
            .unwrap_or(self.cfg.initial_grtt)
    }

    fn window(&self) -> Duration {
        self.cfg.feedback_window.unwrap_or_else(|| {
            (self.grtt() / 4).clamp(Duration::from_millis(10), Duration::from_millis(500))
        })
    }

    fn now_us(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.start).as_micros() as u64
    }

    /// Every receiver named by the group or registered, by name, and where it stands.
    pub fn report(&self) -> Vec<RxReport> {
        self.rx
            .iter()
            .map(|(n, r)| RxReport {
                name: n.clone(),
                addr: r.addr,
                state: r.state.clone(),
                rtt: r.rtt,
                bytes: r.bytes,
                packets: r.packets,
                lost: r.lost,
                loss_ppm: r.loss_ppm,
                passes: r.passes,
                time: r.time,
                late: r.late,
            })
            .collect()
    }

    /// Every expected receiver completed and verified.
    pub fn all_completed(&self) -> bool {
        !self.rx.is_empty() && self.rx.values().all(|r| r.state == RxState::Completed)
    }

    fn announce(&self, now: Instant) -> Msg<'static> {
        Msg::Announce(Announce {
            symbol_size: self.cfg.symbol_size,
            block_symbols: self.cfg.block_symbols,
            rate_bps: self.cfg.rate_bps,
            manifest_len: self.layout.manifest_len,
            manifest_hash: self.manifest_hash,
            data_len: self.layout.data_len,
            open: self.cfg.group == Group::Open,
            time_us: self.now_us(now),
            grtt_us: self.grtt().as_micros().min(u32::MAX as u128) as u32,
            created_us: self.cfg.created_us,
        })
    }

    /// One round of the manifest's symbols: sources first, fresh repair after.
    fn schedule_manifest(&mut self) {
        for b in 0..self.layout.manifest_blocks() {
            let k = self.layout.block(b).expect("block").k as u32;
            let first = self.next_esi[b as usize];
            // A little more than K per round: any K + 2 of all rounds decode.
            let n = if first == 0 { k } else { k + 2 };
            for i in 0..n {
                self.mqueue.push_back((b, first + i));
            }
            self.next_esi[b as usize] = first + n;
        }
    }

    /// Abort the session: END (aborted) goes out, then nothing.
    pub fn abort(&mut self, now: Instant) {
        if !matches!(self.phase, Phase::Ending { .. } | Phase::Done) {
            let mut out = Vec::new();
            let end = Msg::End(End {
                reason: EndReason::Aborted,
            });
            wire::encode(self.session, &end, self.key.as_ref(), &mut out);
            self.control.push_back((SendTo::Group, out.clone()));
            self.control.push_back((SendTo::Group, out));
            self.phase = Phase::Ending { left: 0, next: now };
        }
    }

    // ---- input ----

    /// A datagram from a receiver.
    pub fn handle(&mut self, now: Instant, from: SocketAddr, datagram: &mut [u8]) {
        let (h, msg) = match wire::decode(datagram, self.key.as_ref()) {
            Ok(x) => x,
            Err(e) => return self.drop(from, e.to_string()),
        };
        if h.session != self.session {
            return self.drop(from, format!("session {:016x} is not ours", h.session));
        }
        let name = match &msg {
            Msg::Register(r) => Some(r.name.clone()),
            Msg::Nack(n) => Some(n.name.clone()),
            Msg::Complete(c) => Some(c.name.clone()),
            _ => None,
        };
        match msg {
            Msg::Register(r) => self.on_register(now, from, r),
            Msg::Nack(n) => self.on_nack(now, from, n),
            Msg::Complete(c) => self.on_complete(now, from, c),
            m => self.drop(from, format!("{:?} from a receiver", m.kind())),
        }
        if let Some(r) = name.and_then(|n| self.rx.get_mut(&n)) {
            if r.addr == Some(from) {
                r.last_heard = Some(now);
            }
        }
    }

    fn drop(&mut self, from: SocketAddr, why: String) {
        self.stats.dropped += 1;
        self.events.push_back(SenderEvent::Dropped { from, why });
    }

    fn ack(&mut self, to: SocketAddr, kind: AckKind, name: &str) {
        let mut out = Vec::new();
        let m = Msg::Ack(Ack {
            kind,
            name: name.to_string(),
        });
        wire::encode(self.session, &m, self.key.as_ref(), &mut out);
        self.control.push_back((SendTo::To(to), out));
    }

    fn rtt_sample(&self, now: Instant, echo_us: u64, held_us: u32) -> Option<Duration> {
        let now_us = self.now_us(now);
        let sent = echo_us.checked_add(held_us as u64)?;
        if sent > now_us {
            return None; // an echo from the future: ignore
        }
        Some(Duration::from_micros(now_us - sent))
    }

    /// Is `from` the address this receiver registered with? (Names are not
    /// secrets: without a key, this keeps one receiver from speaking for another.)
    fn known(&mut self, name: &str, from: SocketAddr) -> bool {
        match self.rx.get(name) {
            Some(r) if r.addr == Some(from) => true,
            _ => {
                self.drop(from, format!("{name} is not registered from {from}"));
                false
            }
        }
    }

    fn on_register(&mut self, now: Instant, from: SocketAddr, r: wire::Register) {
        let sample = self.rtt_sample(now, r.echo_us, r.held_us);
        let data = self.started_data;
        let open = self.cfg.group == Group::Open;
        let ended = matches!(self.phase, Phase::Ending { .. } | Phase::Done);
        let entry = match self.rx.get_mut(&r.name) {
            Some(e) => e,
            None if open && !ended => self
                .rx
                .entry(r.name.clone())
                .or_insert_with(|| Rx::new(None, RxState::Expected)),
            None => {
                self.ack(from, AckKind::Rejected, &r.name);
                self.events.push_back(SenderEvent::Rejected {
                    name: r.name,
                    addr: from,
                });
                return;
            }
        };
        match (&entry.state, entry.addr) {
            (RxState::Expected, _) => {
                entry.state = RxState::Active;
                entry.addr = Some(from);
                entry.rtt = sample;
                entry.late = data;
                self.events.push_back(SenderEvent::Registered {
                    name: r.name.clone(),
                    addr: from,
                    late: data,
                });
            }
            (_, Some(a)) if a != from => {
                // The name is taken from another address.
                self.ack(from, AckKind::Rejected, &r.name);
                self.drop(from, format!("{} is registered from {a}", r.name));
                return;
            }
            _ => {
                if let Some(s) = sample {
                    entry.rtt = Some(s);
                }
            }
        }
        self.ack(from, AckKind::Registered, &r.name);
        self.maybe_start(now);
    }

    fn on_nack(&mut self, now: Instant, from: SocketAddr, n: wire::Nack) {
        // An answer from a receiver whose REGISTER was lost registers it.
        if self
            .rx
            .get(&n.name)
            .is_none_or(|r| r.state == RxState::Expected)
        {
            let reg = wire::Register {
                name: n.name.clone(),
                echo_us: n.echo_us,
                held_us: n.held_us,
            };
            self.on_register(now, from, reg);
        }
        if !self.known(&n.name, from) {
            return;
        }
        let sample = self.rtt_sample(now, n.echo_us, n.held_us);
        let blocks = self.layout.blocks();
        let current = n.pass == self.pass && n.round == self.round;
        let r = self.rx.get_mut(&n.name).expect("known");
        if r.state != RxState::Active {
            return;
        }
        if let Some(s) = sample {
            r.rtt = Some(match r.rtt {
                Some(old) => (old * 3 + s) / 4,
                None => s,
            });
        }
        r.loss_ppm = n.loss_ppm;
        if !current || n.parts == 0 || n.part >= n.parts {
            return;
        }
        if r.parts_seen.len() != n.parts as usize {
            r.parts_seen = vec![false; n.parts as usize];
        }
        if std::mem::replace(&mut r.parts_seen[n.part as usize], true) {
            return; // a duplicate part
        }
        if !n.needs.is_empty() {
            r.asked = r.asked.max(n.pass);
        }
        let mut b: u64 = 0;
        for (i, &(delta, need)) in n.needs.iter().enumerate() {
            b = if i == 0 {
                delta as u64
            } else {
                b + delta as u64
            };
            if b >= blocks as u64 {
                break;
            }
            let need = need.min(MAX_ESI);
            let e = self.needs.entry(b as u32).or_insert(0);
            *e = (*e).max(need);
        }
        if r.parts_seen.iter().all(|&p| p) {
            r.answered = true;
            r.silent = 0;
        }
        self.maybe_end_feedback(now);
    }

    fn on_complete(&mut self, now: Instant, from: SocketAddr, c: wire::Complete) {
        if !self.known(&c.name, from) {
            return;
        }
        let elapsed = now.saturating_duration_since(self.start);
        let pass = self.pass;
        let r = self.rx.get_mut(&c.name).expect("known");
        if r.state == RxState::Active {
            r.state = if c.ok {
                RxState::Completed
            } else {
                RxState::Failed(c.error.clone())
            };
            r.bytes = c.bytes;
            r.packets = c.packets;
            r.lost = c.lost;
            if c.packets + c.lost > 0 {
                r.loss_ppm = (c.lost as f64 / (c.packets + c.lost) as f64 * 1e6) as u32;
            }
            // The passes it took: one more than the last it asked repair after.
            r.passes = (r.asked + 1).min(pass.max(1));
            r.time = Some(elapsed);
            self.events.push_back(SenderEvent::Completed {
                name: c.name.clone(),
                ok: c.ok,
                error: c.error,
            });
        }
        self.ack(from, AckKind::Done, &c.name);
        self.maybe_finish(now);
        self.maybe_end_feedback(now);
    }

    fn live(&self) -> impl Iterator<Item = &Rx> {
        self.rx.values().filter(|r| r.state == RxState::Active)
    }

    fn maybe_start(&mut self, now: Instant) {
        if self.phase != Phase::Announce {
            return;
        }
        let all_in = !self.rx.is_empty() && self.rx.values().all(|r| r.state != RxState::Expected);
        let closed = self.cfg.group != Group::Open;
        let window_over = now >= self.start + self.cfg.announce_window;
        if (closed && all_in) || (window_over && self.live().next().is_some()) {
            self.start_pass(now, true);
        } else if window_over {
            // Nobody came.
            let reason = "never registered".to_string();
            for (n, r) in self.rx.iter_mut() {
                r.state = RxState::GaveUp(reason.clone());
                self.events.push_back(SenderEvent::GaveUp {
                    name: n.clone(),
                    reason: reason.clone(),
                });
            }
            self.finish(now);
        }
    }

    /// No receiver left to serve: end the session.
    fn maybe_finish(&mut self, now: Instant) {
        if matches!(
            self.phase,
            Phase::Announce | Phase::Ending { .. } | Phase::Done
        ) {
            return;
        }
        if self.live().next().is_none() {
            // Named receivers that never came are given up on once no one else is left.
            let reason = "never registered".to_string();
            for (n, r) in self.rx.iter_mut() {
                if r.state == RxState::Expected {
                    r.state = RxState::GaveUp(reason.clone());
                    self.events.push_back(SenderEvent::GaveUp {
                        name: n.clone(),
                        reason: reason.clone(),
                    });
                }
            }
            self.finish(now);
        }
    }

    fn finish(&mut self, now: Instant) {
        self.cur = None;
        self.plan.clear();
        self.phase = Phase::Ending {
            left: ENDS,
            next: now,
        };
    }

    fn maybe_end_feedback(&mut self, now: Instant) {
        if let Phase::Feedback { .. } = self.phase {
            if self.live().all(|r| r.answered) {
                self.after_feedback(now);
            }
        }
    }

    /// Feedback is in (or its time is up): the next pass, another poll, or the end.
    fn after_feedback(&mut self, now: Instant) {
        let max_silent = self.cfg.silent_polls;
        let silent_time = self.cfg.silent_time;
        let max_passes = self.cfg.max_passes;
        let pass = self.pass;
        let mut gave_up = Vec::new();
        for (n, r) in self.rx.iter_mut() {
            if r.state != RxState::Active {
                continue;
            }
            if !r.answered {
                r.silent += 1;
                let quiet = r
                    .last_heard
                    .is_none_or(|t| now.saturating_duration_since(t) >= silent_time);
                if r.silent >= max_silent && quiet {
                    gave_up.push((n.clone(), format!("no answer to {} polls", r.silent)));
                }
            } else if pass >= max_passes {
                gave_up.push((n.clone(), format!("still incomplete after {pass} passes")));
            }
        }
        for (n, reason) in gave_up {
            let r = self.rx.get_mut(&n).expect("present");
            r.state = RxState::GaveUp(reason.clone());
            r.passes = pass;
            self.events
                .push_back(SenderEvent::GaveUp { name: n, reason });
        }
        self.maybe_finish(now);
        if matches!(self.phase, Phase::Ending { .. } | Phase::Done) {
            return;
        }
        if self.needs.is_empty() {
            // Nothing asked for: poll again (for the silent, or those still verifying).
            self.send_poll(now, false);
        } else {
            self.start_pass(now, false);
        }
    }

    // ---- passes ----

    fn start_pass(&mut self, now: Instant, first: bool) {
        self.pass += 1;
        self.round = 0;
        self.stats.passes = self.pass;
        self.plan.clear();
        let mut symbols = 0u64;
        if first {
            self.started_data = true;
            for b in self.layout.data_range() {
                let k = self.layout.block(b).expect("block").k as u32;
                let n = k + (k as f64 * self.cfg.overhead).ceil() as u32;
                self.plan.push_back((b, n));
                symbols += n as u64;
            }
        } else {
            for (&b, &n) in &self.needs {
                if n > 0 {
                    self.plan.push_back((b, n));
                    symbols += n as u64;
                }
            }
        }
        self.needs.clear();
        self.events.push_back(SenderEvent::PassStarted {
            pass: self.pass,
            blocks: self.plan.len() as u32,
            symbols,
        });
        self.phase = Phase::Sending;
        if self.next_send < now {
            self.next_send = now;
        }
    }

    fn send_poll(&mut self, now: Instant, new_pass: bool) {
        if new_pass {
            self.round = 0;
        } else {
            self.round += 1;
        }
        for r in self.rx.values_mut() {
            r.answered = false;
            r.parts_seen.clear();
        }
        self.needs.clear();
        self.poll_time_us = self.now_us(now);
        let window = self.window();
        let m = Msg::Poll(Poll {
            pass: self.pass,
            round: self.round,
            time_us: self.poll_time_us,
            window_us: window.as_micros() as u32,
        });
        let mut out = Vec::new();
        wire::encode(self.session, &m, self.key.as_ref(), &mut out);
        self.control.push_back((SendTo::Group, out));
        let wait = self.grtt() + self.grtt() / 4 + window + Duration::from_millis(20);
        self.phase = Phase::Feedback {
            deadline: now + wait,
        };
    }

    // ---- output ----

    /// When the core next wants to run (absent input).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.control.is_empty() {
            return Some(self.start); // in the past: at once
        }
        let paced = |t: Instant| Some(t);
        match self.phase {
            Phase::Done => None,
            Phase::Ending { next, .. } => Some(next),
            Phase::Announce => {
                let end = self.start + self.cfg.announce_window;
                if self.mqueue.is_empty() {
                    Some(self.next_announce.min(end))
                } else {
                    paced(self.next_send.min(end))
                }
            }
            Phase::Sending => paced(self.next_send),
            Phase::Feedback { deadline } => Some(if self.mqueue.is_empty() {
                deadline.min(self.next_announce)
            } else {
                deadline.min(self.next_send)
            }),
        }
    }

    /// Time-driven work (deadlines), then the next datagram due at `now`, written to
    /// `out`; None when nothing is due. Call until None, then wait for
    /// `poll_timeout` or a datagram.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        src: &mut dyn Source,
        out: &mut Vec<u8>,
    ) -> io::Result<Option<SendTo>> {
        if let Some((d, b)) = self.control.pop_front() {
            *out = b;
            self.count(out.len());
            return Ok(Some(d));
        }
        match self.phase {
            Phase::Done => return Ok(None),
            Phase::Ending { left, next } => {
                if now < next {
                    return Ok(None);
                }
                if left == 0 {
                    self.phase = Phase::Done;
                    self.events.push_back(SenderEvent::Finished);
                    return Ok(None);
                }
                self.phase = Phase::Ending {
                    left: left - 1,
                    next: now + Duration::from_millis(20),
                };
                let m = Msg::End(End {
                    reason: EndReason::Finished,
                });
                wire::encode(self.session, &m, self.key.as_ref(), out);
                self.count(out.len());
                return Ok(Some(SendTo::Group));
            }
            Phase::Announce => self.maybe_start(now),
            Phase::Feedback { deadline } if now >= deadline => self.after_feedback(now),
            _ => {}
        }
        if matches!(self.phase, Phase::Ending { .. } | Phase::Done) || !self.control.is_empty() {
            return self.poll_transmit(now, src, out);
        }
        // Announce ticks: in the announce phase often; later about once a second,
        // for receivers that join late.
        if now >= self.next_announce {
            let missing = self.rx.values().any(|r| r.state == RxState::Expected);
            let tick = if self.phase == Phase::Announce || missing {
                Duration::from_millis(250).min(self.cfg.announce_window / 4)
            } else {
                self.grtt().max(Duration::from_secs(1))
            };
            self.next_announce = now + tick;
            let late_possible = self.cfg.group == Group::Open || missing;
            if self.phase == Phase::Announce || late_possible {
                if self.mqueue.is_empty() {
                    self.schedule_manifest();
                }
                let m = self.announce(now);
                wire::encode(self.session, &m, self.key.as_ref(), out);
                self.count(out.len());
                return Ok(Some(SendTo::Group));
            }
        }
        if now < self.next_send {
            return Ok(None);
        }
        // Paced datagrams: manifest symbols first, then the pass's data.
        let sent = if let Some((b, esi)) = self.mqueue.pop_front() {
            self.manifest_symbol(b, esi, out);
            self.stats.manifest_packets += 1;
            true
        } else if self.phase == Phase::Sending {
            if self.next_data_symbol(src, out)? {
                true
            } else {
                // The pass is over.
                self.send_poll(now, true);
                return self.poll_transmit(now, src, out);
            }
        } else {
            false
        };
        if !sent {
            return Ok(None);
        }
        self.count(out.len());
        let pace = Pace {
            rate_bps: self.cfg.rate_bps,
            wire_overhead: self.cfg.wire_overhead,
            catch_up: self.cfg.catch_up,
            start: self.start,
        };
        self.next_send = pace.after(self.next_send, now, out.len());
        Ok(Some(SendTo::Group))
    }

    fn count(&mut self, len: usize) {
        self.stats.datagrams += 1;
        self.stats.bytes += len as u64;
    }

    fn manifest_symbol(&mut self, b: u32, esi: u32, out: &mut Vec<u8>) {
        let blk = self.layout.block(b).expect("manifest block");
        let t = self.cfg.symbol_size as usize;
        let data = &self.manifest[blk.offset as usize..(blk.offset + blk.len) as usize];
        let sym: Vec<u8> = if esi < blk.k as u32 {
            let mut s = data[esi as usize * t..((esi as usize + 1) * t).min(data.len())].to_vec();
            s.resize(t, 0);
            s
        } else {
            let enc = self.manifest_enc[b as usize]
                .get_or_insert_with(|| Encoder::new(data, blk.k, self.cfg.symbol_size));
            enc.repair(esi, 1).pop().expect("one symbol")
        };
        self.data_datagram(b, esi, &sym, out);
    }

    fn data_datagram(&mut self, block: u32, esi: u32, sym: &[u8], out: &mut Vec<u8>) {
        let m = Msg::Data(
            DataHdr {
                seq: self.seq,
                block,
                esi,
            },
            sym,
        );
        self.seq += 1;
        wire::encode(self.session, &m, self.key.as_ref(), out);
    }

    /// The pass's next symbol; false when the pass is done.
    fn next_data_symbol(&mut self, src: &mut dyn Source, out: &mut Vec<u8>) -> io::Result<bool> {
        let t = self.cfg.symbol_size as usize;
        loop {
            if self.cur.is_none() {
                let Some((b, n)) = self.plan.pop_front() else {
                    return Ok(false);
                };
                self.cur = Some(self.open_block(b, n, src)?);
            }
            let cur = self.cur.as_mut().expect("current block");
            if cur.src_next < cur.k as u32 {
                let i = cur.src_next as usize;
                cur.src_next += 1;
                let (block, esi) = (cur.block, i as u32);
                let sym = cur.data[i * t..(i + 1) * t].to_vec();
                self.data_datagram(block, esi, &sym, out);
                self.stats.data_packets += 1;
                return Ok(true);
            }
            if cur.repair.is_empty() && cur.repair_left > 0 {
                let b = cur.block as usize;
                let first = self.next_esi[b].max(cur.k as u32);
                let n = cur.repair_left.min(REPAIR_BATCH).min(MAX_ESI + 1 - first);
                if n == 0 {
                    cur.repair_left = 0; // ESIs exhausted (2^24 symbols of one block)
                } else {
                    let enc = cur
                        .enc
                        .get_or_insert_with(|| Encoder::new(&cur.data, cur.k, t as u16));
                    for (j, s) in enc.repair(first, n).into_iter().enumerate() {
                        cur.repair.push_back((first + j as u32, s));
                    }
                    cur.repair_left -= n;
                    self.next_esi[b] = first + n;
                }
            }
            if let Some((esi, sym)) = cur.repair.pop_front() {
                let block = cur.block;
                self.data_datagram(block, esi, &sym, out);
                self.stats.repair_packets += 1;
                return Ok(true);
            }
            self.cur = None;
        }
    }

    /// Read block `b` and plan `n` symbols of it: its sources first if none were
    /// sent yet (pass 1), then fresh repair symbols.
    fn open_block(&mut self, b: u32, n: u32, src: &mut dyn Source) -> io::Result<Cur> {
        let blk = self.layout.block(b).expect("planned block");
        debug_assert_eq!(blk.object, Object::Data);
        let t = self.cfg.symbol_size as usize;
        let mut data = vec![0u8; blk.k as usize * t];
        src.read_data(blk.offset, &mut data[..blk.len as usize])?;
        let first = self.next_esi[b as usize] == 0;
        let k = blk.k as u32;
        let (src_next, repair_left) = if first {
            self.next_esi[b as usize] = k;
            (0, n.saturating_sub(k))
        } else {
            (k, n)
        };
        Ok(Cur {
            block: b,
            k: blk.k,
            data,
            enc: None,
            src_next,
            repair_left,
            repair: VecDeque::new(),
        })
    }
}
