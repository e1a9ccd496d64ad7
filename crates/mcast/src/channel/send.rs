//! A channel's sender: sans-IO. Files are offered as they become ready and
//! sent once each at the channel's rate; receivers join at any time, say what
//! they have and lack after each BEAT, and get fresh repair symbols for what
//! they lost, and for the files of a backlog they were away for.

use super::{Layout, BEAT_EVERY, MARGIN, MAX_FILE};
use crate::manifest::Item;
use crate::seal::Key;
use crate::sender::{Group, Pace, SendTo};
use crate::wire::{self, Ack, AckKind, Beat, ChunkHdr, Msg, Offer, MAX_FINISHED};
use longhaul_transfer::fec::{Encoder, MAX_ESI};
use longhaul_transfer::EntryKind;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Where a channel's files' bytes come from (the spool, or memory in tests).
pub trait ObjectSource {
    /// Fill `buf` with the bytes of file `oid` at `offset`.
    fn read(&mut self, oid: u32, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

/// Repair of a file whose first pass ended this long ago is a receiver's
/// catch-up (it was away), not a loss of the live traffic.
const CATCH_UP_AFTER: Duration = Duration::from_secs(5);

/// Catch-up takes at least this share of the rate, and otherwise only what
/// the live files leave: a receiver that comes back never stalls the others.
const CATCH_UP_SHARE: f64 = 0.05;

/// Blocks kept read (and encoded) at once.
const CACHED_BLOCKS: usize = 4;

/// Files at most under their first pass at once, taking turns a block each.
const ACTIVE: usize = 8;

/// A receiver silent this long (or twice the backlog, if longer) is forgotten.
const FORGET_RECEIVER: Duration = Duration::from_secs(24 * 3600);

/// A channel's settings; the default: 100 Mbit/s, 1400-byte symbols,
/// 1024-symbol blocks, 2 % overhead, an open group, a backlog of an hour.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// Sending rate in bit/s of IP packets (IP and UDP headers counted).
    pub rate_bps: u64,
    /// Bytes per symbol.
    pub symbol_size: u16,
    /// Source symbols per block.
    pub block_symbols: u16,
    /// Repair symbols sent with each block's first pass, as a fraction of K
    /// (at least one when above 0).
    pub overhead: f64,
    /// Who may join.
    pub group: Group,
    /// How long a file is held for receivers that lack it (away ones too).
    pub backlog: Duration,
    /// A receiver not heard from this long is away: files no longer wait
    /// for it (it asks for them when it comes back, within the backlog).
    pub away_after: Duration,
    /// At most this share of the rate goes to repair while files wait for
    /// their first pass.
    pub repair_share: f64,
    /// Bytes of headers below each UDP payload counted against the rate (IPv4 + UDP).
    pub wire_overhead: usize,
    /// A sender that fell behind makes up at most this much sending in one burst.
    pub catch_up: Duration,
}

impl Default for ChannelConfig {
    fn default() -> ChannelConfig {
        ChannelConfig {
            rate_bps: 100_000_000,
            symbol_size: 1400,
            block_symbols: 1024,
            overhead: 0.02,
            group: Group::Open,
            backlog: Duration::from_secs(3600),
            away_after: Duration::from_secs(10),
            repair_share: 0.5,
            wire_overhead: 28,
            catch_up: Duration::from_millis(10),
        }
    }
}

/// What happened on the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelEvent {
    /// A receiver joined, or came back, wanting the files from `from_oid` on.
    Joined {
        /// Its name.
        name: String,
        /// Its address.
        addr: SocketAddr,
        /// The first file it wants.
        from_oid: u32,
    },
    /// A JOIN refused: a closed group does not name it.
    Rejected {
        /// The name it asked for.
        name: String,
    },
    /// A receiver has not been heard from for `away_after`: files no longer
    /// wait for it.
    Away {
        /// Its name.
        name: String,
    },
    /// A receiver not heard from for a day (or twice the backlog, if
    /// longer) is forgotten: files no longer wait for it at all.
    Dropped {
        /// Its name.
        name: String,
    },
    /// A file's first pass is done.
    Sent {
        /// The file.
        oid: u32,
    },
    /// A file could not be read; receivers are told it is gone.
    Unreadable {
        /// The file.
        oid: u32,
        /// Why.
        error: String,
    },
    /// Every receiver has file `oid`, or its backlog expired: it is
    /// forgotten (`missing`: the receivers that lacked it).
    Forgotten {
        /// The file.
        oid: u32,
        /// Receivers that did not have it.
        missing: Vec<String>,
    },
}

/// The channel's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Datagrams sent.
    pub datagrams: u64,
    /// Bytes sent (UDP payloads).
    pub bytes: u64,
    /// Symbols of first passes (sources and their overhead).
    pub first_symbols: u64,
    /// Repair symbols sent on request.
    pub repair_symbols: u64,
    /// OFFERs sent.
    pub offers: u64,
    /// Files offered.
    pub files: u64,
    /// Files whose first pass is done.
    pub sent_files: u64,
    /// Files forgotten.
    pub forgotten: u64,
    /// Datagrams dropped (malformed, from unknown receivers).
    pub dropped: u64,
}

/// What the channel holds and who listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelState {
    /// Files held (waiting, being sent, or held for receivers).
    pub held: usize,
    /// Files waiting for their first pass (the one under way included).
    pub queued: usize,
    /// Bytes of those files.
    pub queued_bytes: u64,
    /// Each receiver, by name.
    pub receivers: Vec<ReceiverState>,
}

/// One receiver as the sender sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiverState {
    /// Its name.
    pub name: String,
    /// Not heard from lately.
    pub away: bool,
    /// It has every file below this id.
    pub done_below: u32,
    /// How long after ready its files were reported done, since it joined.
    pub latency: Latency,
}

/// Latencies from a file ready at the sender to a receiver's STATUS saying
/// it has the file (its verification, and the way back: half a round
/// trip and up to a status interval), in a histogram of fixed size:
/// buckets 15 % wide from 10 ms to about two hours (longer ones count in
/// the last). Percentiles are a bucket's upper edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latency {
    counts: [u32; LAT_BUCKETS],
    max_ms: u64,
}

const LAT_BUCKETS: usize = 96;

impl Default for Latency {
    fn default() -> Latency {
        Latency {
            counts: [0; LAT_BUCKETS],
            max_ms: 0,
        }
    }
}

impl Latency {
    /// Upper edge of bucket `i`, seconds.
    fn edge(i: usize) -> f64 {
        0.01 * 1.15f64.powi(i as i32 + 1)
    }

    /// Counts one file's latency.
    pub fn add(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        let i = (0..LAT_BUCKETS)
            .find(|&i| s <= Self::edge(i))
            .unwrap_or(LAT_BUCKETS - 1);
        self.counts[i] = self.counts[i].saturating_add(1);
        self.max_ms = self.max_ms.max(d.as_millis() as u64);
    }

    /// Files counted.
    pub fn files(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }

    /// The latency `q` (0 to 1) of the files were within, seconds (at most
    /// 15 % over); None before the first.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let n = self.files();
        if n == 0 {
            return None;
        }
        let want = ((n as f64 * q).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= want {
                return Some(Self::edge(i).min(self.max_s()));
            }
        }
        Some(self.max_s())
    }

    /// The longest, seconds.
    pub fn max_s(&self) -> f64 {
        self.max_ms as f64 / 1e3
    }
}

struct Obj {
    item: Item,
    ready_us: u64,
    ready_at: Instant,
    layout: Layout,
    /// Next fresh repair ESI per block.
    next_esi: Vec<u32>,
    /// The last beat sent before each block's latest repair.
    repaired_at_beat: Vec<u64>,
    first_done: bool,
    /// When its first pass ended.
    first_done_at: Option<Instant>,
    /// Offered as urgent: sent before the files waiting.
    urgent: bool,
    /// Could not be read: receivers are told it is gone.
    gone: bool,
    /// The beat last sent before its latest OFFER (one re-offer per beat).
    offered_at_beat: Option<u64>,
}

impl Obj {
    /// A file offered, its first pass to come.
    fn new(cfg: &ChannelConfig, item: Item, ready_us: u64, ready_at: Instant) -> Obj {
        let layout = Layout::new(cfg.symbol_size, cfg.block_symbols, item.size);
        let blocks = layout.blocks();
        Obj {
            item,
            ready_us,
            ready_at,
            next_esi: (0..blocks).map(|b| layout.k(b) as u32).collect(),
            repaired_at_beat: vec![0; blocks as usize],
            layout,
            first_done: false,
            first_done_at: None,
            urgent: false,
            gone: false,
            offered_at_beat: None,
        }
    }
}

struct Rx {
    addr: SocketAddr,
    from_oid: u32,
    done_below: u32,
    done: HashSet<u32>,
    last_heard: Instant,
    away: bool,
    latency: Latency,
}

/// The first pass under way: a file, its block, and the next symbol.
struct Cursor {
    oid: u32,
    block: u32,
    esi: u32,
}

/// A block's bytes (padded to whole symbols) and, once needed, its encoder.
struct Cached {
    oid: u32,
    block: u32,
    data: Vec<u8>,
    enc: Option<Encoder>,
}

/// The channel's sender core. Drive it with `offer`, `handle`,
/// `poll_transmit` (until None), `poll_timeout` and `poll_event`.
pub struct ChannelSender {
    cfg: ChannelConfig,
    channel: u64,
    key: Option<Key>,
    t0: Instant,
    wall_us: u64,
    objects: BTreeMap<u32, Obj>,
    next_oid: u32,
    queue: VecDeque<u32>,
    /// Files under their first pass, a block each in turn (the front's now).
    active: VecDeque<Cursor>,
    /// OFFERs to send.
    offers: VecDeque<u32>,
    /// (oid, block) → symbols asked, of files sent lately (losses of the
    /// live traffic: they go first, within `repair_share`).
    repairs: BTreeMap<(u32, u32), u32>,
    /// The same for files sent [`CATCH_UP_AFTER`] or longer ago (a receiver
    /// that was away): they take what the live files leave, and at least
    /// [`CATCH_UP_SHARE`] of the rate.
    catchup: BTreeMap<(u32, u32), u32>,
    /// The blocks read lately, the one in use first (the first passes',
    /// a live repair's and a catch-up's take turns without reading and
    /// encoding again).
    cache: VecDeque<Cached>,
    rx: HashMap<String, Rx>,
    /// Answers to JOINs: (to, kind, name).
    acks: VecDeque<(SocketAddr, AckKind, String)>,
    beat: u64,
    next_beat: Instant,
    finished: VecDeque<u32>,
    next_send: Instant,
    seq: u64,
    /// Bytes sent lately (decayed by an eighth each beat) of live repair,
    /// of first passes and of catch-up: their shares of the rate.
    repair_bytes: u64,
    first_bytes: u64,
    catchup_bytes: u64,
    events: VecDeque<ChannelEvent>,
    stats: ChannelStats,
}

impl ChannelSender {
    /// A channel with id `channel` (a random number per run), sealed with
    /// `key` if given; `wall_us` is the wall clock (µs since the Unix epoch)
    /// at `now`.
    pub fn new(
        cfg: ChannelConfig,
        channel: u64,
        key: Option<Key>,
        now: Instant,
        wall_us: u64,
    ) -> Result<ChannelSender, String> {
        Layout::check(cfg.symbol_size, cfg.block_symbols)?;
        if cfg.rate_bps == 0 {
            return Err("the rate must be above 0".into());
        }
        Ok(ChannelSender {
            cfg,
            channel,
            key,
            t0: now,
            wall_us,
            objects: BTreeMap::new(),
            next_oid: 0,
            queue: VecDeque::new(),
            active: VecDeque::new(),
            offers: VecDeque::new(),
            repairs: BTreeMap::new(),
            catchup: BTreeMap::new(),
            cache: VecDeque::new(),
            rx: HashMap::new(),
            acks: VecDeque::new(),
            beat: 0,
            next_beat: now,
            finished: VecDeque::new(),
            next_send: now,
            seq: 0,
            repair_bytes: 0,
            first_bytes: 0,
            catchup_bytes: 0,
            events: VecDeque::new(),
            stats: ChannelStats::default(),
        })
    }

    /// Offer a file; its bytes come from the source under the id returned.
    /// `urgent` ones go before every file still waiting. `ready_us`: when
    /// it was ready (wall clock, µs since the Unix epoch). Err: a file whose
    /// OFFER would not fit a datagram (too many attributes) or too large.
    pub fn offer(
        &mut self,
        now: Instant,
        item: Item,
        ready_us: u64,
        urgent: bool,
    ) -> Result<u32, String> {
        if item.kind != EntryKind::File || item.extents.is_some() {
            return Err("a channel carries whole files".into());
        }
        if item.size > MAX_FILE {
            return Err(format!("{} bytes: larger than {MAX_FILE}", item.size));
        }
        let oid = self.next_oid;
        let offer = Msg::Offer(Offer {
            oid,
            ready_us,
            gone: false,
            item,
        });
        let mut probe = Vec::new();
        wire::encode(self.channel, &offer, self.key.as_ref(), &mut probe);
        if probe.len() > wire::MAX_DATAGRAM {
            return Err(format!(
                "its OFFER takes {} bytes, more than a datagram's {}: too many attributes",
                probe.len(),
                wire::MAX_DATAGRAM
            ));
        }
        let Msg::Offer(Offer { item, .. }) = offer else {
            unreachable!()
        };
        self.next_oid += 1;
        let mut o = Obj::new(&self.cfg, item, ready_us, now);
        o.urgent = urgent;
        self.objects.insert(oid, o);
        match urgent {
            true => self.queue.push_front(oid),
            false => self.queue.push_back(oid),
        }
        self.stats.files += 1;
        Ok(oid)
    }

    /// Takes up a channel kept on disk after a restart (its id given to
    /// [`ChannelSender::new`]): the files it held, as (id, entry, ready
    /// (µs since the epoch), gone), each counted as sent (a receiver that
    /// lacks one asks for it; one whose bytes are no longer there is
    /// `gone`: receivers are told so); the receivers it knew, as (name,
    /// the id below which it had every file), away until they come back;
    /// new files from `next_oid` on. Call before anything else.
    pub fn restore(
        &mut self,
        now: Instant,
        wall_us: u64,
        next_oid: u32,
        files: Vec<(u32, Item, u64, bool)>,
        receivers: Vec<(String, u32)>,
    ) {
        let long_ago = now.checked_sub(CATCH_UP_AFTER).unwrap_or(now);
        for (oid, item, ready_us, gone) in files {
            let age = Duration::from_micros(wall_us.saturating_sub(ready_us));
            let mut o = Obj::new(
                &self.cfg,
                item,
                ready_us,
                now.checked_sub(age).unwrap_or(now),
            );
            o.first_done = true;
            o.first_done_at = Some(long_ago);
            o.gone = gone;
            self.objects.insert(oid, o);
            self.stats.files += 1;
            self.stats.sent_files += 1;
        }
        self.next_oid = self.next_oid.max(next_oid);
        for (name, done_below) in receivers {
            self.rx.insert(
                name,
                Rx {
                    addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                    from_oid: done_below,
                    done_below,
                    done: HashSet::new(),
                    last_heard: now,
                    away: true,
                    latency: Latency::default(),
                },
            );
        }
    }

    /// The channel id.
    pub fn channel(&self) -> u64 {
        self.channel
    }

    /// The id the next file offered gets.
    pub fn next_oid(&self) -> u32 {
        self.next_oid
    }

    /// The files held: (id, entry, ready µs since the epoch).
    pub fn held(&self) -> impl Iterator<Item = (u32, &Item, u64)> + '_ {
        self.objects.iter().map(|(&k, o)| (k, &o.item, o.ready_us))
    }

    /// Counters so far.
    pub fn stats(&self) -> &ChannelStats {
        &self.stats
    }

    /// Files held and waiting, and the receivers.
    pub fn state(&self) -> ChannelState {
        let mut receivers: Vec<_> = self
            .rx
            .iter()
            .map(|(n, r)| ReceiverState {
                name: n.clone(),
                away: r.away,
                done_below: r.done_below,
                latency: r.latency.clone(),
            })
            .collect();
        receivers.sort_by(|a, b| a.name.cmp(&b.name));
        let waiting = self.queue.iter().chain(self.active.iter().map(|c| &c.oid));
        ChannelState {
            held: self.objects.len(),
            queued: self.queue.len() + self.active.len(),
            queued_bytes: waiting
                .filter_map(|o| self.objects.get(o))
                .map(|o| o.item.size)
                .sum(),
            receivers,
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<ChannelEvent> {
        self.events.pop_front()
    }

    fn clock_us(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.t0).as_micros() as u64
    }

    /// When the core next wants `poll_transmit` called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let busy = !self.active.is_empty()
            || !self.queue.is_empty()
            || !self.repairs.is_empty()
            || !self.catchup.is_empty()
            || !self.offers.is_empty()
            || !self.acks.is_empty();
        Some(match busy {
            true => self.next_send.min(self.next_beat),
            false => self.next_beat,
        })
    }

    /// A datagram from a receiver.
    pub fn handle(&mut self, now: Instant, from: SocketAddr, datagram: &mut [u8]) {
        let msg = match wire::header(datagram) {
            Ok(h) if h.session == self.channel => match wire::decode(datagram, self.key.as_ref()) {
                Ok((_, m)) => m,
                Err(_) => return self.stats.dropped += 1,
            },
            _ => return self.stats.dropped += 1,
        };
        match msg {
            Msg::Join(j) => self.on_join(now, from, j),
            Msg::Status(s) => self.on_status(now, from, s),
            _ => self.stats.dropped += 1,
        }
    }

    fn on_join(&mut self, now: Instant, from: SocketAddr, j: wire::Join) {
        if let Group::Closed(names) = &self.cfg.group {
            if !names.contains(&j.name) {
                self.events.push_back(ChannelEvent::Rejected {
                    name: j.name.clone(),
                });
                self.acks.push_back((from, AckKind::Rejected, j.name));
                return;
            }
        }
        if let Some(r) = self.rx.get_mut(&j.name) {
            if r.addr == from && !r.away {
                // A JOIN repeated (our ACK was lost): answer again.
                r.last_heard = now;
                self.acks.push_back((from, AckKind::Registered, j.name));
                return;
            }
            if r.addr != from && !r.away {
                self.stats.dropped += 1; // another receiver under a name taken
                return;
            }
        }
        let from_oid = j.from_oid.clamp(self.oldest(), self.next_oid);
        // Back after being away: its latencies go on.
        let latency = self
            .rx
            .remove(&j.name)
            .map(|r| r.latency)
            .unwrap_or_default();
        self.rx.insert(
            j.name.clone(),
            Rx {
                addr: from,
                from_oid,
                done_below: from_oid,
                done: HashSet::new(),
                last_heard: now,
                away: false,
                latency,
            },
        );
        self.acks
            .push_back((from, AckKind::Registered, j.name.clone()));
        self.events.push_back(ChannelEvent::Joined {
            name: j.name,
            addr: from,
            from_oid,
        });
    }

    fn on_status(&mut self, now: Instant, from: SocketAddr, s: wire::Status) {
        let Some(r) = self.rx.get_mut(&s.name).filter(|r| r.addr == from) else {
            self.stats.dropped += 1;
            return;
        };
        if r.away {
            r.away = false;
            self.events.push_back(ChannelEvent::Joined {
                name: s.name.clone(),
                addr: from,
                from_oid: s.done_below,
            });
        }
        r.last_heard = now;
        // What it has now that it did not before: its latency (only of
        // files still held; a file is held until every receiver has it).
        let new_below = r.done_below.max(s.done_below);
        let oldest = self.objects.keys().next().copied().unwrap_or(self.next_oid);
        let newly = (r.done_below.max(oldest)..new_below)
            .chain(s.done.iter().copied().filter(|&o| o >= new_below))
            .filter(|o| !r.done.contains(o));
        for oid in newly {
            if let Some(o) = self.objects.get(&oid) {
                r.latency.add(now.saturating_duration_since(o.ready_at));
            }
        }
        r.done_below = new_below;
        let below = r.done_below;
        r.done = s.done.into_iter().filter(|&o| o >= below).collect();
        for oid in s.offers {
            if let Some(o) = self.objects.get_mut(&oid) {
                if o.offered_at_beat.is_none_or(|b| b < self.beat) && !self.offers.contains(&oid) {
                    self.offers.push_back(oid);
                }
            }
        }
        for (oid, block, n) in s.needs {
            let Some(o) = self.objects.get(&oid) else {
                continue;
            };
            if block >= o.layout.blocks() || !o.first_done || o.gone {
                continue;
            }
            // Only a status that saw a beat sent after this block's latest
            // repair asks for more than that repair brought.
            if o.repaired_at_beat[block as usize] >= s.beat {
                continue;
            }
            let k = o.layout.k(block) as u32;
            let old = o
                .first_done_at
                .is_some_and(|t| now.saturating_duration_since(t) >= CATCH_UP_AFTER);
            let e = self.queue_of(old).entry((oid, block)).or_insert(0);
            *e = (*e).max(n.min(2 * k + MARGIN));
        }
    }

    /// Files below this id are no longer held.
    fn oldest(&self) -> u32 {
        self.objects.keys().next().copied().unwrap_or(self.next_oid)
    }

    /// Every file below this id has had its first pass.
    fn sent_through(&self) -> u32 {
        self.objects
            .iter()
            .find(|(_, o)| !o.first_done)
            .map_or(self.next_oid, |(&k, _)| k)
    }

    /// Once a beat: receivers gone away or dropped, files forgotten.
    fn housekeeping(&mut self, now: Instant) {
        let backlog = self.cfg.backlog;
        let mut dropped = Vec::new();
        for (n, r) in self.rx.iter_mut() {
            let quiet = now.saturating_duration_since(r.last_heard);
            if !r.away && quiet >= self.cfg.away_after {
                r.away = true;
                self.events
                    .push_back(ChannelEvent::Away { name: n.clone() });
            }
            if quiet >= (2 * backlog).max(FORGET_RECEIVER) {
                dropped.push(n.clone());
            }
        }
        for n in dropped {
            self.rx.remove(&n);
            self.events.push_back(ChannelEvent::Dropped { name: n });
        }
        let mut gone = Vec::new();
        for (&oid, o) in &self.objects {
            if !o.first_done {
                continue;
            }
            let lacking: Vec<String> = self
                .rx
                .iter()
                .filter(|(_, r)| oid >= r.from_oid && oid >= r.done_below && !r.done.contains(&oid))
                .map(|(n, _)| n.clone())
                .collect();
            if lacking.is_empty() || now.saturating_duration_since(o.ready_at) >= backlog {
                gone.push((oid, lacking));
            }
        }
        for (oid, missing) in gone {
            self.objects.remove(&oid);
            self.repairs.retain(|&(o, _), _| o != oid);
            self.catchup.retain(|&(o, _), _| o != oid);
            self.offers.retain(|&o| o != oid);
            self.cache.retain(|c| c.oid != oid);
            self.stats.forgotten += 1;
            self.events
                .push_back(ChannelEvent::Forgotten { oid, missing });
        }
    }

    /// The next datagram due into `out`, and where it goes; None when
    /// nothing is due yet (see `poll_timeout`).
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        src: &mut dyn ObjectSource,
        out: &mut Vec<u8>,
    ) -> io::Result<Option<SendTo>> {
        if now >= self.next_beat {
            self.housekeeping(now);
            self.send_beat(now, out);
            self.next_beat = (self.next_beat + BEAT_EVERY).max(now);
            return Ok(Some(self.sent(now, out.len(), SendTo::Group)));
        }
        if now < self.next_send {
            return Ok(None);
        }
        if let Some((to, kind, name)) = self.acks.pop_front() {
            wire::encode(
                self.channel,
                &Msg::Ack(Ack { kind, name }),
                self.key.as_ref(),
                out,
            );
            return Ok(Some(self.sent(now, out.len(), SendTo::To(to))));
        }
        while let Some(oid) = self.offers.pop_front() {
            let beat = self.beat;
            let Some(o) = self.objects.get_mut(&oid) else {
                continue;
            };
            o.offered_at_beat = Some(beat);
            let msg = Msg::Offer(Offer {
                oid,
                ready_us: o.ready_us,
                gone: o.gone,
                item: o.item.clone(),
            });
            wire::encode(self.channel, &msg, self.key.as_ref(), out);
            self.stats.offers += 1;
            return Ok(Some(self.sent(now, out.len(), SendTo::Group)));
        }
        // Live repair first (within its share while files wait), then a
        // receiver's catch-up within its own small share, then the files'
        // first passes; what is left goes to catch-up.
        let first = !self.active.is_empty() || !self.queue.is_empty();
        let share = self.repair_bytes as f64
            <= self.cfg.repair_share * (self.repair_bytes + self.first_bytes) as f64;
        let all = self.repair_bytes + self.first_bytes + self.catchup_bytes;
        let catch_share = self.catchup_bytes as f64 <= CATCH_UP_SHARE * all as f64;
        if !self.repairs.is_empty() && (!first || share) && self.repair_symbol(src, out, false)? {
            self.repair_bytes += out.len() as u64;
            return Ok(Some(self.sent(now, out.len(), SendTo::Group)));
        }
        if !self.catchup.is_empty()
            && (!first || catch_share)
            && self.repair_symbol(src, out, true)?
        {
            self.catchup_bytes += out.len() as u64;
            return Ok(Some(self.sent(now, out.len(), SendTo::Group)));
        }
        if self.first_symbol(now, src, out)? {
            self.first_bytes += out.len() as u64;
            return Ok(Some(self.sent(now, out.len(), SendTo::Group)));
        }
        Ok(None)
    }

    fn send_beat(&mut self, now: Instant, out: &mut Vec<u8>) {
        self.beat += 1;
        // The shares are kept over about the last second: a catch-up that
        // starts after an hour without one does not take its share of
        // the hour ahead of the live files.
        for c in [
            &mut self.repair_bytes,
            &mut self.first_bytes,
            &mut self.catchup_bytes,
        ] {
            *c -= *c / 8;
        }
        let b = Beat {
            beat: self.beat,
            time_us: self.clock_us(now),
            created_us: self.wall_us + self.clock_us(now),
            symbol_size: self.cfg.symbol_size,
            block_symbols: self.cfg.block_symbols,
            rate_bps: self.cfg.rate_bps,
            open: self.cfg.group == Group::Open,
            next_oid: self.next_oid,
            sent_through: self.sent_through(),
            oldest: self.oldest(),
            finished: self.finished.iter().copied().collect(),
        };
        wire::encode(self.channel, &Msg::Beat(b), self.key.as_ref(), out);
    }

    /// Count a datagram of `len` bytes against the rate.
    fn sent(&mut self, now: Instant, len: usize, to: SendTo) -> SendTo {
        self.stats.datagrams += 1;
        self.stats.bytes += len as u64;
        let pace = Pace {
            rate_bps: self.cfg.rate_bps,
            wire_overhead: self.cfg.wire_overhead,
            catch_up: self.cfg.catch_up,
            start: self.t0,
        };
        self.next_send = pace.after(self.next_send, now, len);
        to
    }

    /// Make sure the cache's first entry is block `block` of file `oid` (its
    /// encoder too with `enc`). Err: the file could not be read.
    fn load(
        &mut self,
        src: &mut dyn ObjectSource,
        oid: u32,
        block: u32,
        enc: bool,
    ) -> io::Result<()> {
        let o = &self.objects[&oid];
        let t = self.cfg.symbol_size as usize;
        match self
            .cache
            .iter()
            .position(|c| c.oid == oid && c.block == block)
        {
            Some(0) => {}
            Some(i) => {
                let c = self.cache.remove(i).expect("found");
                self.cache.push_front(c);
            }
            None => {
                let len = o.layout.block_len(block);
                let mut data = vec![0u8; len.div_ceil(t) * t];
                src.read(oid, o.layout.offset(block), &mut data[..len])?;
                self.cache.push_front(Cached {
                    oid,
                    block,
                    data,
                    enc: None,
                });
                self.cache.truncate(CACHED_BLOCKS);
            }
        }
        let k = o.layout.k(block);
        let c = self.cache.front_mut().expect("loaded");
        if enc && c.enc.is_none() {
            c.enc = Some(Encoder::new(&c.data, k, self.cfg.symbol_size));
        }
        Ok(())
    }

    /// A file that could not be read: its first pass ends, and receivers
    /// are told it is gone.
    fn unreadable(&mut self, oid: u32, e: io::Error) {
        if let Some(o) = self.objects.get_mut(&oid) {
            o.gone = true;
            o.first_done = true;
        }
        self.active.retain(|c| c.oid != oid);
        self.cache.retain(|c| c.oid != oid);
        self.repairs.retain(|&(o, _), _| o != oid);
        self.catchup.retain(|&(o, _), _| o != oid);
        self.offers.push_back(oid);
        self.events.push_back(ChannelEvent::Unreadable {
            oid,
            error: e.to_string(),
        });
    }

    fn chunk(&mut self, oid: u32, block: u32, esi: u32, out: &mut Vec<u8>) {
        let c = self.cache.front().expect("loaded");
        let t = self.cfg.symbol_size as usize;
        let k = c.data.len() / t;
        let repair;
        let sym: &[u8] = if (esi as usize) < k {
            &c.data[esi as usize * t..(esi as usize + 1) * t]
        } else {
            repair = c.enc.as_ref().expect("encoder").repair(esi, 1).remove(0);
            &repair
        };
        self.seq += 1;
        let h = ChunkHdr {
            seq: self.seq,
            oid,
            block,
            esi,
        };
        wire::encode(self.channel, &Msg::Chunk(h, sym), self.key.as_ref(), out);
    }

    /// Live repairs, or with `old` a receiver's catch-up.
    fn queue_of(&mut self, old: bool) -> &mut BTreeMap<(u32, u32), u32> {
        match old {
            true => &mut self.catchup,
            false => &mut self.repairs,
        }
    }

    fn repair_symbol(
        &mut self,
        src: &mut dyn ObjectSource,
        out: &mut Vec<u8>,
        old: bool,
    ) -> io::Result<bool> {
        while let Some((&(oid, block), &n)) = self.queue_of(old).iter().next() {
            let Some(o) = self.objects.get(&oid) else {
                self.queue_of(old).remove(&(oid, block));
                continue;
            };
            let esi = o.next_esi[block as usize];
            if n == 0 || esi > MAX_ESI {
                self.queue_of(old).remove(&(oid, block));
                continue;
            }
            if let Err(e) = self.load(src, oid, block, true) {
                self.unreadable(oid, e);
                continue;
            }
            let beat = self.beat;
            let o = self.objects.get_mut(&oid).expect("held");
            o.next_esi[block as usize] += 1;
            o.repaired_at_beat[block as usize] = beat;
            match n {
                1 => self.queue_of(old).remove(&(oid, block)),
                _ => self.queue_of(old).insert((oid, block), n - 1),
            };
            self.chunk(oid, block, esi, out);
            self.stats.repair_symbols += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// The next symbol of the first passes: files take turns a block each
    /// (up to [`ACTIVE`] at once), so that a small file written behind a
    /// large one is not held up by all of it.
    fn first_symbol(
        &mut self,
        now: Instant,
        src: &mut dyn ObjectSource,
        out: &mut Vec<u8>,
    ) -> io::Result<bool> {
        loop {
            if self.active.len() < ACTIVE {
                if let Some(oid) = self.queue.pop_front() {
                    if !self.objects.contains_key(&oid) {
                        continue;
                    }
                    // An urgent file goes first; its OFFER before its symbols.
                    let c = Cursor {
                        oid,
                        block: 0,
                        esi: 0,
                    };
                    match self.objects[&oid].urgent {
                        true => self.active.push_front(c),
                        false => self.active.push_back(c),
                    }
                    let beat = self.beat;
                    let o = self.objects.get_mut(&oid).expect("held");
                    o.offered_at_beat = Some(beat);
                    let msg = Msg::Offer(Offer {
                        oid,
                        ready_us: o.ready_us,
                        gone: false,
                        item: o.item.clone(),
                    });
                    wire::encode(self.channel, &msg, self.key.as_ref(), out);
                    self.stats.offers += 1;
                    return Ok(true);
                }
            }
            let Some(&Cursor { oid, block, esi }) = self.active.front() else {
                return Ok(false);
            };
            let layout = self.objects[&oid].layout;
            if block >= layout.blocks() {
                self.active.pop_front();
                self.first_done(oid, now);
                continue;
            }
            let k = layout.k(block) as u32;
            let extra = match self.cfg.overhead > 0.0 {
                true => ((self.cfg.overhead * k as f64).ceil() as u32).max(1),
                false => 0,
            };
            if let Err(e) = self.load(src, oid, block, esi >= k) {
                self.unreadable(oid, e);
                continue;
            }
            self.chunk(oid, block, esi, out);
            self.stats.first_symbols += 1;
            let c = self.active.front_mut().expect("active");
            c.esi += 1;
            if c.esi == k + extra {
                self.objects.get_mut(&oid).expect("held").next_esi[block as usize] = k + extra;
                c.block += 1;
                c.esi = 0;
                // The next file's turn (a finished one leaves at its turn).
                let c = self.active.pop_front().expect("active");
                match c.block >= layout.blocks() {
                    true => self.first_done(c.oid, now),
                    false => self.active.push_back(c),
                }
            }
            return Ok(true);
        }
    }

    fn first_done(&mut self, oid: u32, now: Instant) {
        if let Some(o) = self.objects.get_mut(&oid) {
            o.first_done = true;
            o.first_done_at = Some(now);
        }
        self.finished.push_back(oid);
        while self.finished.len() > MAX_FINISHED {
            self.finished.pop_front();
        }
        self.stats.sent_files += 1;
        self.events.push_back(ChannelEvent::Sent { oid });
    }
}
