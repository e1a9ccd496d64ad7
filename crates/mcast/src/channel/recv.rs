//! A channel's receiver: sans-IO. It joins the first channel whose BEAT it
//! may take, receives each offered file into the store, names it as soon as
//! it verifies, and after each BEAT tells the sender what it has and lacks.

use super::{Layout, MARGIN};
use crate::seal::Key;
use crate::wire::{self, AckKind, Beat, ChunkHdr, Join, Msg, Offer, Status, MAX_STATUS};
use longhaul_transfer::fec;
use longhaul_transfer::{EntryKind, RelPath};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Where a channel's files go: each file on its own, named once it verifies.
pub trait ObjectStore {
    /// File `oid` is offered: prepare it (its directories, a part file).
    fn begin(&mut self, oid: u32, item: &crate::manifest::Item) -> Result<(), String>;
    /// Write `data` at `offset` of file `oid`.
    fn write(&mut self, oid: u32, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Every byte of file `oid` is in: verify its BLAKE3, give it its
    /// metadata and its name.
    fn finish(&mut self, oid: u32) -> Result<(), String>;
    /// File `oid` will not be completed: remove what `begin` and `write` left.
    fn abort(&mut self, oid: u32);
}

/// A channel receiver's settings.
#[derive(Debug, Clone)]
pub struct ChannelReceiverConfig {
    /// Its name (as a closed group lists it).
    pub name: String,
    /// Key file contents; with them every datagram must be sealed.
    pub key_material: Option<Vec<u8>>,
    /// Without a key: take unsealed channels (a trusted, closed network).
    pub accept_unsealed: bool,
    /// A channel silent this long is left (its unfinished files removed).
    pub idle_timeout: Duration,
    /// Where it left off on a channel, from an earlier run ([`ChannelReceiver::resume_point`]).
    pub resume: Option<Resume>,
    /// How far a BEAT's wall clock may lie from this receiver's (a replay).
    pub clock_window: Duration,
}

impl ChannelReceiverConfig {
    /// Defaults for a receiver called `name`: no key and nothing taken
    /// unsealed, 30 s idle timeout, 600 s clock window.
    pub fn new(name: &str) -> ChannelReceiverConfig {
        ChannelReceiverConfig {
            name: name.into(),
            key_material: None,
            accept_unsealed: false,
            idle_timeout: Duration::from_secs(30),
            resume: None,
            clock_window: Duration::from_secs(600),
        }
    }
}

/// Where a receiver stands on a channel: every file below `below` it has
/// (or gave up), and of those above, `done`. A restarted receiver takes it
/// up from here, as does one that left a silent channel that came back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resume {
    /// The channel id.
    pub channel: u64,
    /// Every file below this id is had or given up.
    pub below: u32,
    /// Files at or above `below` it has.
    pub done: Vec<u32>,
}

/// What happened at the receiver.
#[derive(Debug, Clone, PartialEq)]
pub enum ReceiverEvent {
    /// Joined channel `channel` from `sender`, wanting files from `from_oid` on.
    Joined {
        /// The channel id.
        channel: u64,
        /// Its sender.
        sender: SocketAddr,
        /// The first file wanted.
        from_oid: u32,
    },
    /// A channel refused: not sealed without a key, or made too far from
    /// this clock; or this receiver is not in its closed group.
    Refused {
        /// The channel id.
        channel: u64,
        /// Why.
        why: String,
    },
    /// A file arrived and verified, and has its name.
    File {
        /// Its id on the channel.
        oid: u32,
        /// Its path beneath the destination.
        path: Vec<u8>,
        /// Its size.
        size: u64,
        /// From ready at the sender to verified here (wall clocks; negative
        /// if this clock runs behind the sender's).
        latency_us: i64,
    },
    /// A file arrived but could not be placed (it did not verify, or the
    /// store failed).
    Failed {
        /// Its id.
        oid: u32,
        /// Its path.
        path: Vec<u8>,
        /// Why.
        error: String,
    },
    /// Files this receiver will not have: the sender no longer holds them
    /// (it was away longer than the backlog), or could not read them.
    Missed {
        /// The first such file.
        from: u32,
        /// How many, from `from` on.
        count: u32,
        /// Why.
        why: String,
    },
    /// The channel fell silent for `idle_timeout`: left.
    Left {
        /// The channel id.
        channel: u64,
        /// Why.
        why: String,
    },
}

/// A receiver's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelRxStats {
    /// Datagrams taken.
    pub datagrams: u64,
    /// Symbols taken.
    pub packets: u64,
    /// Symbols missed (gaps in the sender's sequence).
    pub lost: u64,
    /// Datagrams dropped (malformed, another channel, unknown files).
    pub dropped: u64,
    /// Files received and verified.
    pub files: u64,
    /// Bytes of those files.
    pub bytes: u64,
    /// STATUS datagrams sent.
    pub statuses: u64,
}

enum BlockState {
    Partial(Partial),
    Done,
}

struct Partial {
    k: u32,
    /// The block's source symbols as they come (K × symbol_size bytes).
    buf: Vec<u8>,
    have: Vec<u64>,
    n_src: u32,
    repair: Vec<(u32, Vec<u8>)>,
    /// A decode failed with this many symbols: wait for more.
    tried_at: u32,
}

struct File {
    offer: Offer,
    layout: Layout,
    blocks: Vec<BlockState>,
    left: u32,
    /// Offered again after its first pass (asked for: catching up).
    catch_up: bool,
}

struct Chan {
    id: u64,
    sender: SocketAddr,
    key: Option<Key>,
    joined: bool,
    next_join: Instant,
    from_oid: u32,
    beat: Option<Beat>,
    /// When the newest BEAT came, for the echo's hold time.
    beat_at: Instant,
    last_heard: Instant,
    done_below: u32,
    done: BTreeSet<u32>,
    files: BTreeMap<u32, File>,
    last_status: Instant,
    seq_first: Option<u64>,
    seq_max: u64,
    /// Symbols taken and missed lately (about the last [`LOSS_WINDOW`]).
    recent_packets: u64,
    recent_lost: u64,
}

/// The channel receiver's core. Drive it with `handle`, `handle_timeout`,
/// `poll_transmit`, `poll_timeout` and `poll_event`.
pub struct ChannelReceiver {
    cfg: ChannelReceiverConfig,
    chan: Option<Chan>,
    /// Channels refused lately (said once each).
    refused: VecDeque<u64>,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<ReceiverEvent>,
    stats: ChannelRxStats,
    t0: Instant,
    wall_us: u64,
}

/// How often a receiver repeats its JOIN, and says it is there when it needs nothing.
const JOIN_EVERY: Duration = Duration::from_secs(1);
const ALIVE_EVERY: Duration = Duration::from_secs(1);
/// Files at most in progress at once (more are left to repair later).
const MAX_FILES: usize = 65_536;
/// Files asked for again at most at once (a receiver catching up, or
/// that missed OFFERs), beside the live ones in progress.
const CATCH_UP: usize = 128;
/// ... and bytes of them, at least (else two seconds of the channel).
const CATCH_UP_BYTES: u64 = 16 << 20;
/// The loss rate is taken over about this many symbols.
const LOSS_WINDOW: u64 = 4096;
/// A gap in the sender's sequence this long is an outage, not loss.
const OUTAGE_GAP: u64 = 10_000;

impl ChannelReceiver {
    /// A receiver; `wall_us` is the wall clock (µs since the Unix epoch) at `now`.
    pub fn new(
        cfg: ChannelReceiverConfig,
        now: Instant,
        wall_us: u64,
    ) -> Result<ChannelReceiver, String> {
        wire::check_name(&cfg.name)?;
        if let Some(m) = &cfg.key_material {
            Key::from_material(m, 0)?;
        }
        Ok(ChannelReceiver {
            cfg,
            chan: None,
            refused: VecDeque::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: ChannelRxStats::default(),
            t0: now,
            wall_us,
        })
    }

    fn wall(&self, now: Instant) -> u64 {
        self.wall_us + now.saturating_duration_since(self.t0).as_micros() as u64
    }

    /// The channel taken, if any.
    pub fn channel(&self) -> Option<u64> {
        self.chan.as_ref().map(|c| c.id)
    }

    /// Counters so far.
    pub fn stats(&self) -> &ChannelRxStats {
        &self.stats
    }

    /// Where this receiver stands, to take up from after a restart (keep
    /// it on disk as files arrive).
    pub fn resume_point(&self) -> Option<Resume> {
        match &self.chan {
            Some(c) => Some(Resume {
                channel: c.id,
                below: c.done_below,
                done: c.done.iter().copied().collect(),
            }),
            None => self.cfg.resume.clone(),
        }
    }

    /// Files in progress (memory held: their unfinished blocks).
    pub fn in_progress(&self) -> usize {
        self.chan.as_ref().map_or(0, |c| c.files.len())
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        self.events.pop_front()
    }

    /// The next datagram to send, and where.
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.out.pop_front()
    }

    /// When `handle_timeout` is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let c = self.chan.as_ref()?;
        let mut t = c.last_heard + self.cfg.idle_timeout;
        if !c.joined {
            t = t.min(c.next_join);
        } else {
            t = t.min(c.last_status + ALIVE_EVERY);
        }
        Some(t)
    }

    /// Time-driven work: JOINs repeated, a STATUS every second, leaving a
    /// silent channel.
    pub fn handle_timeout(&mut self, now: Instant, store: &mut dyn ObjectStore) {
        let Some(c) = self.chan.as_mut() else { return };
        if now >= c.last_heard + self.cfg.idle_timeout {
            let why = format!(
                "the sender was silent for {} s",
                self.cfg.idle_timeout.as_secs_f64()
            );
            return self.leave(store, why);
        }
        if !c.joined && now >= c.next_join {
            self.send_join(now);
        } else if c.joined && now >= c.last_status + ALIVE_EVERY {
            self.send_status(now);
        }
    }

    fn drop_one(&mut self) {
        self.stats.dropped += 1;
    }

    /// A datagram from the network.
    pub fn handle(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &mut [u8],
        store: &mut dyn ObjectStore,
    ) {
        self.stats.datagrams += 1;
        let Ok(h) = wire::header(datagram) else {
            return self.drop_one();
        };
        if self.refused.contains(&h.session) {
            return self.drop_one();
        }
        match &self.chan {
            Some(c) if c.id != h.session => return self.drop_one(),
            Some(c) if c.sender != from => return self.moved(now, from, datagram, store),
            Some(_) => {}
            None => {
                // Only a BEAT opens a channel; its key derives from the channel id.
                if h.kind != wire::Kind::Beat {
                    return self.drop_one();
                }
                return self.open(now, from, h.session, datagram, store);
            }
        }
        let c = self.chan.as_mut().expect("channel");
        let msg = match wire::decode(datagram, c.key.as_ref()) {
            Ok((_, m)) if m.from_sender() => m,
            _ => return self.drop_one(),
        };
        c.last_heard = now;
        match msg {
            Msg::Beat(b) => self.on_beat(now, b, store),
            Msg::Ack(a) if a.name == self.cfg.name => match a.kind {
                AckKind::Registered => c.joined = true,
                AckKind::Rejected => {
                    let id = c.id;
                    self.events.push_back(ReceiverEvent::Refused {
                        channel: id,
                        why: "this receiver is not in the channel's closed group".into(),
                    });
                    self.leave(store, "not in the channel's closed group".into());
                    self.remember_refused(id);
                }
                AckKind::Done => {}
            },
            Msg::Offer(o) if c.joined => self.on_offer(now, o, store),
            Msg::Chunk(h, sym) if c.joined => self.on_chunk(now, h, sym, store),
            _ => self.drop_one(),
        }
    }

    /// A datagram of this channel from another address: its sender was
    /// restarted (from the channel's record, on a new port). A BEAT that
    /// decodes under the channel's key, is newer than the last one and
    /// keeps its layout moves the channel there, and the receiver joins
    /// again; anything else is dropped.
    fn moved(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &mut [u8],
        store: &mut dyn ObjectStore,
    ) {
        let c = self.chan.as_mut().expect("channel");
        let Ok((_, Msg::Beat(b))) = wire::decode(datagram, c.key.as_ref()) else {
            return self.drop_one();
        };
        let newer = c.beat.as_ref().is_none_or(|old| {
            b.created_us > old.created_us
                && b.symbol_size == old.symbol_size
                && b.block_symbols == old.block_symbols
        });
        if !newer {
            return self.drop_one();
        }
        c.sender = from;
        c.beat = None;
        c.joined = false;
        c.last_heard = now;
        c.seq_first = None;
        c.seq_max = 0;
        let (id, from_oid) = (c.id, c.from_oid);
        self.events.push_back(ReceiverEvent::Joined {
            channel: id,
            sender: from,
            from_oid,
        });
        self.on_beat(now, b, store);
        self.send_join(now);
    }

    /// The first BEAT of a channel: take it if it may be taken, and join.
    fn open(
        &mut self,
        now: Instant,
        from: SocketAddr,
        id: u64,
        datagram: &mut [u8],
        store: &mut dyn ObjectStore,
    ) {
        let key = match &self.cfg.key_material {
            Some(m) => match Key::from_material(m, id) {
                Ok(k) => Some(k),
                Err(_) => return self.drop_one(),
            },
            None => None,
        };
        let beat = match wire::decode(datagram, key.as_ref()) {
            Ok((_, Msg::Beat(b))) => b,
            Ok(_) => return self.drop_one(),
            Err(wire::WireError::Unsealed) | Err(wire::WireError::Sealed) | Err(_)
                if key.is_some() =>
            {
                return self.drop_one()
            }
            Err(_) => return self.drop_one(),
        };
        let refuse = |why: String| ReceiverEvent::Refused { channel: id, why };
        if key.is_none() && !self.cfg.accept_unsealed {
            self.events
                .push_back(refuse("not sealed, and this receiver has no key".into()));
            self.remember_refused(id);
            return;
        }
        let here = self.wall(now);
        let window = self.cfg.clock_window.as_micros() as u64;
        if key.is_some() && beat.created_us.abs_diff(here) > window {
            self.events.push_back(refuse(format!(
                "its clock is {} s from this receiver's, more than {} s: a replay, or a clock far off",
                beat.created_us.abs_diff(here) / 1_000_000,
                self.cfg.clock_window.as_secs()
            )));
            self.remember_refused(id);
            return;
        }
        if Layout::check(beat.symbol_size, beat.block_symbols).is_err() {
            return self.drop_one();
        }
        let (from_oid, done) = match &self.cfg.resume {
            Some(r) if r.channel == id => (r.below, r.done.iter().copied().collect()),
            _ => (beat.sent_through, BTreeSet::new()),
        };
        self.chan = Some(Chan {
            id,
            sender: from,
            key,
            joined: false,
            next_join: now,
            from_oid,
            beat: None,
            beat_at: now,
            last_heard: now,
            done_below: from_oid,
            done,
            files: BTreeMap::new(),
            last_status: now,
            seq_first: None,
            seq_max: 0,
            recent_packets: 0,
            recent_lost: 0,
        });
        self.events.push_back(ReceiverEvent::Joined {
            channel: id,
            sender: from,
            from_oid,
        });
        self.on_beat(now, beat, store);
        self.send_join(now);
    }

    fn remember_refused(&mut self, id: u64) {
        self.refused.push_back(id);
        while self.refused.len() > 64 {
            self.refused.pop_front();
        }
    }

    /// Leave the channel: its unfinished files removed, where this receiver
    /// stood kept (taken up if the channel comes back).
    fn leave(&mut self, store: &mut dyn ObjectStore, why: String) {
        let Some(c) = self.chan.take() else { return };
        for &oid in c.files.keys() {
            store.abort(oid);
        }
        self.cfg.resume = Some(Resume {
            channel: c.id,
            below: c.done_below,
            done: c.done.into_iter().collect(),
        });
        self.events
            .push_back(ReceiverEvent::Left { channel: c.id, why });
    }

    fn echo(c: &Chan, now: Instant) -> (u64, u32) {
        let echo = c.beat.as_ref().map_or(0, |b| b.time_us);
        let held = now
            .saturating_duration_since(c.beat_at)
            .as_micros()
            .min(u32::MAX as u128);
        (echo, held as u32)
    }

    fn send_join(&mut self, now: Instant) {
        let c = self.chan.as_mut().expect("channel");
        let (echo_us, held_us) = Self::echo(c, now);
        let j = Join {
            name: self.cfg.name.clone(),
            from_oid: c.from_oid,
            echo_us,
            held_us,
        };
        let mut out = Vec::new();
        wire::encode(c.id, &Msg::Join(j), c.key.as_ref(), &mut out);
        c.next_join = now + JOIN_EVERY;
        self.out.push_back((c.sender, out));
    }

    fn on_beat(&mut self, now: Instant, b: Beat, store: &mut dyn ObjectStore) {
        let c = self.chan.as_mut().expect("channel");
        if c.beat.as_ref().is_some_and(|old| old.beat >= b.beat) {
            return; // late or repeated
        }
        if b.symbol_size != c.beat.as_ref().map_or(b.symbol_size, |o| o.symbol_size)
            || b.block_symbols != c.beat.as_ref().map_or(b.block_symbols, |o| o.block_symbols)
        {
            return self.drop_one();
        }
        let oldest = b.oldest;
        self.on_beat_info(now, b);
        // Files the sender no longer holds are missed.
        let c = self.chan.as_mut().expect("channel");
        if oldest > c.done_below {
            let mut missed = 0;
            let from = c.done_below;
            for oid in from..oldest {
                if !c.done.contains(&oid) {
                    missed += 1;
                    if c.files.remove(&oid).is_some() {
                        store.abort(oid);
                    }
                }
            }
            c.done_below = oldest;
            c.done.retain(|&o| o >= oldest);
            if missed > 0 {
                self.events.push_back(ReceiverEvent::Missed {
                    from,
                    count: oldest - from,
                    why: "the sender no longer holds them (away longer than its backlog)".into(),
                });
            }
        }
        if self.chan.as_ref().expect("channel").joined {
            self.send_status_if_needed(now);
        }
    }

    fn on_beat_info(&mut self, now: Instant, b: Beat) {
        let c = self.chan.as_mut().expect("channel");
        c.beat = Some(b);
        c.beat_at = now;
    }

    fn first_pass_over(b: &Beat, oid: u32) -> bool {
        oid < b.sent_through || b.finished.contains(&oid)
    }

    /// After a BEAT: a STATUS if anything is lacking.
    fn send_status_if_needed(&mut self, now: Instant) {
        let (needs, offers) = self.lacking();
        if !needs.is_empty() || !offers.is_empty() {
            self.status_with(now, needs, offers);
        }
    }

    fn send_status(&mut self, now: Instant) {
        let (needs, offers) = self.lacking();
        self.status_with(now, needs, offers);
    }

    /// What this receiver lacks of files whose first pass is over: symbols
    /// of unfinished blocks, and OFFERs never received.
    #[allow(clippy::type_complexity)]
    fn lacking(&self) -> (Vec<(u32, u32, u32)>, Vec<u32>) {
        let c = self.chan.as_ref().expect("channel");
        let Some(b) = &c.beat else {
            return (Vec::new(), Vec::new());
        };
        let loss = self.loss();
        let mut needs = Vec::new();
        'files: for (&oid, f) in &c.files {
            if !Self::first_pass_over(b, oid) {
                continue;
            }
            for (i, blk) in f.blocks.iter().enumerate() {
                if let BlockState::Partial(p) = blk {
                    let held = p.n_src + p.repair.len() as u32;
                    let target = p.k.max(p.tried_at + 1) + MARGIN;
                    let need = target.saturating_sub(held);
                    if need > 0 {
                        needs.push((oid, i as u32, (need as f64 / (1.0 - loss)).ceil() as u32));
                        if needs.len() == MAX_STATUS {
                            break 'files;
                        }
                    }
                }
            }
        }
        let mut offers = Vec::new();
        let lo = c.done_below.max(c.from_oid);
        let later = b
            .finished
            .iter()
            .copied()
            .filter(|&f| f >= b.sent_through.max(lo));
        // Catching up, a window of files at a time (each holds state until
        // done), enough to keep the sender busy: up to CATCH_UP files and
        // about two seconds of the channel's rate (at least CATCH_UP_BYTES).
        let (n, bytes) = c
            .files
            .values()
            .filter(|f| f.catch_up)
            .fold((0, 0u64), |(n, b), f| (n + 1, b + f.offer.item.size));
        let budget = (b.rate_bps / 4).max(CATCH_UP_BYTES);
        let room = if bytes >= budget {
            0
        } else {
            CATCH_UP.saturating_sub(n).min(MAX_STATUS)
        };
        for oid in (lo..b.sent_through).chain(later) {
            if offers.len() >= room {
                break;
            }
            if !c.done.contains(&oid) && !c.files.contains_key(&oid) {
                offers.push(oid);
            }
        }
        (needs, offers)
    }

    /// The loss rate lately, at most a half.
    fn loss(&self) -> f64 {
        let Some(c) = &self.chan else { return 0.0 };
        (c.recent_lost as f64 / (c.recent_packets + c.recent_lost).max(1) as f64).min(0.5)
    }

    fn status_with(&mut self, now: Instant, needs: Vec<(u32, u32, u32)>, offers: Vec<u32>) {
        let loss_ppm = (self.loss() * 1e6) as u32;
        let c = self.chan.as_mut().expect("channel");
        let (echo_us, held_us) = Self::echo(c, now);
        let st = Status {
            name: self.cfg.name.clone(),
            beat: c.beat.as_ref().map_or(0, |b| b.beat),
            echo_us,
            held_us,
            loss_ppm,
            done_below: c.done_below,
            done: c.done.iter().copied().take(MAX_STATUS).collect(),
            offers,
            needs,
        };
        let mut out = Vec::new();
        wire::encode(c.id, &Msg::Status(st), c.key.as_ref(), &mut out);
        c.last_status = now;
        self.out.push_back((c.sender, out));
        self.stats.statuses += 1;
    }

    fn wanted(c: &Chan, oid: u32) -> bool {
        oid >= c.from_oid && oid >= c.done_below && !c.done.contains(&oid)
    }

    fn on_offer(&mut self, now: Instant, o: Offer, store: &mut dyn ObjectStore) {
        let c = self.chan.as_mut().expect("channel");
        let oid = o.oid;
        if !Self::wanted(c, oid) || c.files.contains_key(&oid) {
            return;
        }
        if o.gone {
            self.events.push_back(ReceiverEvent::Missed {
                from: oid,
                count: 1,
                why: "the sender could not read it".into(),
            });
            return self.mark_done(oid);
        }
        let it = &o.item;
        let valid = it.kind == EntryKind::File
            && it.extents.is_none()
            && it.size <= super::MAX_FILE
            && RelPath::from_wire(&it.path).is_ok_and(|p| !p.is_root());
        if !valid || c.files.len() >= MAX_FILES {
            return self.drop_one();
        }
        if let Err(e) = store.begin(oid, it) {
            self.events.push_back(ReceiverEvent::Failed {
                oid,
                path: it.path.clone(),
                error: e,
            });
            return self.mark_done(oid);
        }
        let b = c.beat.as_ref().expect("a beat opened the channel");
        let layout = Layout::new(b.symbol_size, b.block_symbols, it.size);
        let blocks: Vec<BlockState> = (0..layout.blocks())
            .map(|i| {
                let k = layout.k(i) as u32;
                BlockState::Partial(Partial {
                    k,
                    buf: Vec::new(),
                    have: vec![0; (k as usize).div_ceil(64)],
                    n_src: 0,
                    repair: Vec::new(),
                    tried_at: 0,
                })
            })
            .collect();
        let left = blocks.len() as u32;
        let catch_up = Self::first_pass_over(b, oid);
        c.files.insert(
            oid,
            File {
                offer: o,
                layout,
                blocks,
                left,
                catch_up,
            },
        );
        if left == 0 {
            self.complete(now, oid, store);
        }
    }

    fn on_chunk(&mut self, now: Instant, h: ChunkHdr, sym: &[u8], store: &mut dyn ObjectStore) {
        let c = self.chan.as_mut().expect("channel");
        let t = c.beat.as_ref().expect("beat").symbol_size as usize;
        if sym.len() != t {
            return self.drop_one();
        }
        // Losses, from the sender's sequence.
        match c.seq_first {
            None => {
                c.seq_first = Some(h.seq);
                c.seq_max = h.seq;
            }
            Some(_) if h.seq > c.seq_max => {
                let gap = h.seq - c.seq_max - 1;
                self.stats.lost += gap;
                // (An outage or an absence is not the path's loss rate.)
                if gap < OUTAGE_GAP {
                    c.recent_lost += gap;
                }
                c.seq_max = h.seq;
            }
            Some(_) => {
                self.stats.lost = self.stats.lost.saturating_sub(1);
                c.recent_lost = c.recent_lost.saturating_sub(1);
            }
        }
        self.stats.packets += 1;
        c.recent_packets += 1;
        if c.recent_packets >= 2 * LOSS_WINDOW {
            c.recent_packets /= 2;
            c.recent_lost /= 2;
        }
        let Some(f) = c.files.get_mut(&h.oid) else {
            return; // an OFFER not (yet) received: asked for after the next BEAT
        };
        let Some(BlockState::Partial(p)) = f.blocks.get_mut(h.block as usize) else {
            return;
        };
        if h.esi < p.k {
            let bit = 1u64 << (h.esi % 64);
            let w = &mut p.have[(h.esi / 64) as usize];
            if *w & bit != 0 {
                return;
            }
            *w |= bit;
            if p.buf.is_empty() {
                p.buf = vec![0; p.k as usize * t];
            }
            let at = h.esi as usize * t;
            p.buf[at..at + t].copy_from_slice(sym);
            p.n_src += 1;
        } else if p.repair.iter().any(|(e, _)| *e == h.esi) || h.esi > fec::MAX_ESI {
            return;
        } else {
            p.repair.push((h.esi, sym.to_vec()));
        }
        let held = p.n_src + p.repair.len() as u32;
        if held < p.k || held <= p.tried_at {
            return;
        }
        // Enough to rebuild the block (or all of its sources are in).
        let data = if p.n_src == p.k {
            Some(std::mem::take(&mut p.buf))
        } else {
            let mut syms: Vec<(u32, Vec<u8>)> = Vec::with_capacity(held as usize);
            for i in 0..p.k {
                if p.have[(i / 64) as usize] & (1 << (i % 64)) != 0 {
                    let at = i as usize * t;
                    syms.push((i, p.buf[at..at + t].to_vec()));
                }
            }
            syms.extend(p.repair.iter().cloned());
            fec::decode(p.k as u16, t as u16, syms)
        };
        let Some(data) = data else {
            p.tried_at = held;
            return;
        };
        let len = f.layout.block_len(h.block);
        let off = f.layout.offset(h.block);
        f.blocks[h.block as usize] = BlockState::Done;
        f.left -= 1;
        let done = f.left == 0;
        if let Err(e) = store.write(h.oid, off, &data[..len]) {
            let path = f.offer.item.path.clone();
            c.files.remove(&h.oid);
            store.abort(h.oid);
            self.events.push_back(ReceiverEvent::Failed {
                oid: h.oid,
                path,
                error: format!("write: {e}"),
            });
            return self.mark_done(h.oid);
        }
        if done {
            self.complete(now, h.oid, store);
        }
    }

    /// Every block of `oid` is written: verify and name it.
    fn complete(&mut self, now: Instant, oid: u32, store: &mut dyn ObjectStore) {
        let c = self.chan.as_mut().expect("channel");
        let f = c.files.remove(&oid).expect("in progress");
        let item = f.offer.item;
        match store.finish(oid) {
            Ok(()) => {
                self.stats.files += 1;
                self.stats.bytes += item.size;
                let latency_us = self.wall(now) as i64 - f.offer.ready_us as i64;
                self.events.push_back(ReceiverEvent::File {
                    oid,
                    path: item.path,
                    size: item.size,
                    latency_us,
                });
            }
            Err(error) => {
                store.abort(oid);
                self.events.push_back(ReceiverEvent::Failed {
                    oid,
                    path: item.path,
                    error,
                });
            }
        }
        self.mark_done(oid);
    }

    fn mark_done(&mut self, oid: u32) {
        let c = self.chan.as_mut().expect("channel");
        c.done.insert(oid);
        while c.done.remove(&c.done_below) {
            c.done_below += 1;
        }
    }
}
