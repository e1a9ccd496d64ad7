//! Tail repair (protocol 9), sans-IO: what the sender protects and how much
//! repair it sends, and how a receiver rebuilds a protected stream.
//!
//! The last packets of a transfer have no later ones behind them to reveal
//! their loss: QUIC learns of it from a probe timeout or the ACKs of the
//! last flight, and the retransmission comes a round trip (or more) after
//! the last original packet. So the streams of a transfer's last window
//! (about one congestion window) are protected: each is one RaptorQ source
//! block (its bytes, prelude included, in symbols of a datagram's size),
//! and once it is finished its sender puts [`repairs_needed`] repair symbols
//! in QUIC datagrams ([`crate::proto::Repair`]). A receiver reads such a
//! stream out of order into a [`Block`]; when its holes are as many as the
//! repair symbols it holds, it rebuilds them and needs nothing more from
//! QUIC. Repair sized from the measured loss rate costs that rate (times a
//! margin) of the last window's bytes; a block with more losses than repair
//! waits for QUIC's retransmission as before.

use crate::proto::{
    Repair, MAX_PROTECTED, MAX_REPAIR_SYMBOL, MIN_REPAIR_SYMBOL, REPAIR_HEADER_LEN,
};
use bytes::Bytes;
use longhaul_transfer::fec;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A protected stream carries about this much (a sender starts a new one
/// past it; one record may take it over): a block of ~370 symbols of
/// 1,400 bytes, rebuilt in a few milliseconds.
pub(crate) const PROTECT_BYTES: u64 = 512 << 10;

/// The chance, at the measured loss rate, that a block loses more symbols
/// than its repair replaces (it then waits for QUIC's retransmission).
const MISS: f64 = 1e-3;

/// Failed rebuilds of one block before its holes are left to QUIC (with
/// `k + 2` symbols RaptorQ fails about once in a million).
const MAX_TRIES: u32 = 4;

/// The loss rate repair is sized for at most.
const MOST_LOSS: f64 = 0.3;

/// Repair symbols for a block of `k` source symbols at a packet loss rate
/// of `loss`. A packet's stream bytes are not aligned to the symbols, so a
/// lost packet leaves two symbols incomplete: `r` repair symbols replace
/// `(r - 1) / 2` lost packets with one to spare (RaptorQ rebuilds from `k`
/// symbols with a chance of about 1 %, from `k + 1` of 1e-4). The fewest `r`
/// for which more packets than that are lost (Poisson, over the block and
/// its repair) with a chance of at most [`MISS`]; none when no loss was
/// seen, or when the repair would be over a quarter of the block (at such a
/// loss rate it costs more of the link than the round trip it saves).
pub(crate) fn repairs_needed(k: u32, loss: f64) -> u32 {
    if loss.is_nan() || loss <= 0.0 || k == 0 {
        return 0;
    }
    let p = loss.min(MOST_LOSS);
    let mut r = 1u32;
    loop {
        let lambda = p * (k + r) as f64;
        // P(X <= (r - 1) / 2) for X ~ Poisson(lambda).
        let mut term = (-lambda).exp();
        let mut covered = term;
        for i in 1..=(r - 1) / 2 {
            term *= lambda / i as f64;
            covered += term;
        }
        if 1.0 - covered <= MISS {
            return r;
        }
        if r > k / 4 {
            return 0;
        }
        r += 1;
    }
}

/// Repair for a block of `k` symbols of `symbol_size` bytes on a path of
/// `rate` (bytes/s) and `rtt` at `loss`: [`repairs_needed`], but none when
/// sending it takes more than half the time it saves on average (the
/// chance that the block loses a packet, times the round trip QUIC's
/// retransmission costs). On a slow link a symbol takes longer than the
/// round trip it may save: 1,416 bytes are 44 ms at 256 kbit/s, and seed
/// 001's paths lost 5 % of their goodput to symbols that were never needed.
pub(crate) fn repairs_worth_it(
    k: u32,
    symbol_size: u16,
    loss: f64,
    rate: f64,
    rtt: Duration,
) -> u32 {
    let r = repairs_needed(k, loss);
    if r == 0 || rate <= 0.0 {
        return 0;
    }
    let cost = (r as f64 * symbol_size as f64) / rate;
    let lossy = 1.0 - (1.0 - loss.min(MOST_LOSS)).powi(k as i32);
    if cost > lossy * rtt.as_secs_f64() / 2.0 {
        return 0;
    }
    r
}

/// The loss rate of a connection's packets as tail repair sizes for it: the
/// packets QUIC declared lost over those sent at least 1.25 RTT ago (the
/// ones it has judged; counting those still in flight read a third of the
/// lab's 1e-2 in a 30 MB transfer), with a prior of one loss in a thousand
/// packets that fades as packets are judged (a short transfer's first
/// window has no verdict yet).
#[derive(Debug, Default)]
pub(crate) struct LossMeter {
    /// (when, packets sent by then), oldest first, at least [`SAMPLE`] apart.
    sent: std::collections::VecDeque<(Instant, u64)>,
}

/// How often a [`LossMeter`] notes the packets sent.
const SAMPLE: Duration = Duration::from_millis(5);
/// The samples a [`LossMeter`] keeps (10 s of them).
const SAMPLES: usize = 2000;

impl LossMeter {
    /// Whether a sample is due at `now` (the last is [`SAMPLE`] old).
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.sent.back().is_none_or(|&(t, _)| now >= t + SAMPLE)
    }

    /// The connection had sent `sent` packets at `now`.
    pub(crate) fn note(&mut self, now: Instant, sent: u64) {
        if !self.due(now) {
            return;
        }
        if self.sent.len() == SAMPLES {
            self.sent.pop_front();
        }
        self.sent.push_back((now, sent));
    }

    /// The loss rate at `now`, with `lost` packets declared lost so far and
    /// a round trip of `rtt`.
    pub(crate) fn rate(&self, now: Instant, rtt: Duration, lost: u64) -> f64 {
        let judged_by = now.checked_sub(rtt * 5 / 4);
        let judged = judged_by
            .and_then(|t| self.sent.iter().rev().find(|&&(at, _)| at <= t))
            .map_or(0, |&(_, n)| n);
        (lost + 1) as f64 / (judged + 1000) as f64
    }
}

/// The symbol size for datagrams of at most `max_datagram` bytes (quinn's
/// `max_datagram_size`), or None when they are too small to be worth it.
pub(crate) fn symbol_size(max_datagram: usize) -> Option<u16> {
    let t = max_datagram
        .saturating_sub(REPAIR_HEADER_LEN)
        .min(MAX_REPAIR_SYMBOL as usize) as u16;
    let t = t - t % fec::ALIGN;
    (t >= MIN_REPAIR_SYMBOL).then_some(t)
}

/// `count` repair symbols of a protected stream's bytes (`block`, from its
/// prelude to its end).
pub(crate) fn repair_symbols(
    stream: u64,
    block: &[u8],
    symbol_size: u16,
    count: u32,
) -> Vec<Repair> {
    assert!(!block.is_empty() && block.len() <= MAX_PROTECTED as usize);
    let k = block.len().div_ceil(symbol_size as usize) as u32;
    let enc = fec::Encoder::new(block, k as u16, symbol_size);
    enc.repair(k, count)
        .into_iter()
        .enumerate()
        .map(|(i, s)| Repair {
            stream,
            len: block.len() as u32,
            symbol_size,
            esi: k + i as u32,
            symbol: Bytes::from(s),
        })
        .collect()
}

/// What a received piece costs besides its bytes (its entries in a
/// [`Block`]'s maps, its allocation), as [`Block::footprint`] counts it.
pub(crate) const PIECE_COST: u64 = 128;

/// Pieces a protected stream may hold apart: an honest one has at most one
/// per packet (about 1,300 in [`MAX_PROTECTED`] of 1,200-byte packets);
/// more ends the session.
pub(crate) const MAX_PIECES: usize = 4096;

/// A protected stream on the receiving side: the bytes that came (in any
/// order, from QUIC or rebuilt), and the repair symbols that came for it.
/// Only what came is kept, piece by piece: a hole costs nothing (a peer
/// that sends one byte far into a stream holds one byte, not the gap).
#[derive(Debug, Default)]
pub(crate) struct Block {
    /// What came, by offset: disjoint (they may touch), exact copies.
    pieces: BTreeMap<u64, Box<[u8]>>,
    /// Where the furthest bytes that came end.
    extent: u64,
    /// The byte ranges held: start → end, disjoint and not touching.
    have: BTreeMap<u64, u64>,
    /// Bytes in them (and so in `pieces`, which hold exactly these ranges).
    held: u64,
    /// The stream's length, once its end or a repair symbol said it.
    len: Option<u64>,
    symbol_size: Option<u16>,
    repairs: BTreeMap<u32, Bytes>,
    /// Symbols at hand when a rebuild last failed (none is tried again
    /// until two more came).
    tried: usize,
    /// Bytes held when the source symbols were last counted: data is
    /// counted again only once a symbol's worth more came (a peer that
    /// trickles bytes into holes would make every byte cost a scan of the
    /// block).
    counted_at: u64,
    /// Rebuilds tried and failed (at most [`MAX_TRIES`]: a sender that
    /// feeds symbols one by one cannot keep the receiver decoding).
    failures: u32,
    rebuilt: bool,
}

impl Block {
    /// Bytes from QUIC at `offset`.
    pub(crate) fn insert(&mut self, offset: u64, bytes: &[u8]) -> Result<(), &'static str> {
        if bytes.is_empty() {
            return Ok(());
        }
        let end = offset + bytes.len() as u64;
        if end > self.len.unwrap_or(MAX_PROTECTED as u64) {
            return Err("data past the protected stream's end");
        }
        if self.rebuilt {
            return Ok(()); // a retransmission of what was rebuilt
        }
        self.extent = self.extent.max(end);
        // Only the parts not held yet: pieces stay disjoint.
        for (s, e) in self.missing(offset, end) {
            let part = &bytes[(s - offset) as usize..(e - offset) as usize];
            self.pieces.insert(s, part.into());
            self.add_range(s, e);
        }
        if self.pieces.len() > MAX_PIECES {
            return Err("a protected stream came in more than 4,096 pieces");
        }
        Ok(())
    }

    /// The parts of `from..to` not held.
    fn missing(&self, mut from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if let Some((_, &e)) = self.have.range(..=from).next_back() {
            from = from.max(e);
        }
        if from >= to {
            return out;
        }
        for (&s, &e) in self.have.range(from..to) {
            if s > from {
                out.push((from, s));
            }
            from = from.max(e);
        }
        if from < to {
            out.push((from, to));
        }
        out
    }

    /// The held bytes `from..from + out.len()` into `out`.
    fn copy_out(&self, from: u64, out: &mut [u8]) {
        let to = from + out.len() as u64;
        let first = self
            .pieces
            .range(..=from)
            .next_back()
            .map_or(from, |(&s, _)| s);
        for (&s, p) in self.pieces.range(first..to) {
            let (a, b) = (s.max(from), (s + p.len() as u64).min(to));
            if a < b {
                out[(a - from) as usize..(b - from) as usize]
                    .copy_from_slice(&p[(a - s) as usize..(b - s) as usize]);
            }
        }
    }

    fn add_range(&mut self, mut start: u64, mut end: u64) {
        // Merge with every range that overlaps or touches [start, end).
        if let Some((&s, &e)) = self.have.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
            }
        }
        let touching: Vec<u64> = self.have.range(start..=end).map(|(&s, _)| s).collect();
        for s in touching {
            let e = self.have.remove(&s).expect("listed");
            self.held -= e - s;
            end = end.max(e);
        }
        self.have.insert(start, end);
        self.held += end - start;
    }

    /// QUIC says the stream ended and every byte of it came.
    pub(crate) fn finished(&mut self) -> Result<(), &'static str> {
        let end = self.contiguous();
        if self.have.len() > 1 || self.len.is_some_and(|l| l != end) {
            return Err("the protected stream's end disagrees with its repair symbols");
        }
        self.len = Some(end);
        Ok(())
    }

    /// A repair symbol of this stream.
    pub(crate) fn add(&mut self, r: Repair) -> Result<(), &'static str> {
        let len = r.len as u64;
        match (self.len, self.symbol_size) {
            (Some(l), _) if l != len => {
                return Err("repair symbols disagree on the stream's length")
            }
            (_, Some(t)) if t != r.symbol_size => {
                return Err("repair symbols disagree on their size")
            }
            _ => {}
        }
        if self.extent > len {
            return Err("data past the protected stream's end");
        }
        self.len = Some(len);
        self.symbol_size = Some(r.symbol_size);
        // The datagram's decoder bounds `esi` to K + K / 4: at most that
        // many symbols are held, however many a peer sends.
        if !self.rebuilt {
            self.repairs.insert(r.esi, r.symbol);
        }
        Ok(())
    }

    /// Where the bytes held from the start end.
    pub(crate) fn contiguous(&self) -> u64 {
        match self.have.first_key_value() {
            Some((0, &e)) => e,
            _ => 0,
        }
    }

    /// Bytes held from `from` (within [`Self::contiguous`]) to the end of
    /// the piece that holds it, at most `max`.
    pub(crate) fn chunk(&self, from: u64, max: usize) -> &[u8] {
        assert!(from < self.contiguous());
        let (&s, p) = self.pieces.range(..=from).next_back().expect("held");
        let i = (from - s) as usize;
        &p[i..p.len().min(i + max)]
    }

    /// Repair symbols held, and the source symbols not held (holes), for
    /// the log.
    pub(crate) fn shortfall(&self) -> (usize, usize) {
        let (Some(len), Some(t)) = (self.len, self.symbol_size) else {
            return (self.repairs.len(), 0);
        };
        let k = len.div_ceil(t as u64) as usize;
        (self.repairs.len(), k - self.whole_symbols(len, t).count())
    }

    /// The source symbols (of `t` bytes, in a stream of `len`) held whole.
    fn whole_symbols(&self, len: u64, t: u16) -> impl Iterator<Item = u32> + '_ {
        let t = t as u64;
        (0..len.div_ceil(t) as u32)
            .filter(move |&i| self.holds(i as u64 * t, ((i as u64 + 1) * t).min(len)))
    }

    /// Bytes this block holds: what came (never its holes), its symbols,
    /// and [`PIECE_COST`] for each of them.
    pub(crate) fn footprint(&self) -> u64 {
        let t = self.symbol_size.unwrap_or(0) as u64;
        // (The pieces are disjoint and hold exactly the ranges held.)
        self.held
            + PIECE_COST * self.pieces.len() as u64
            + (t + PIECE_COST) * self.repairs.len() as u64
    }

    /// Repair symbols are held.
    pub(crate) fn has_symbols(&self) -> bool {
        !self.repairs.is_empty()
    }

    /// The stream's last bytes came: what is missing now was lost (the
    /// sender sends a stream's bytes in order).
    pub(crate) fn all_sent(&self) -> bool {
        self.len.is_some_and(|l| self.extent() == l)
    }

    /// Where the furthest bytes held end.
    pub(crate) fn extent(&self) -> u64 {
        self.extent
    }

    /// The stream's length, once known.
    pub(crate) fn len(&self) -> Option<u64> {
        self.len
    }

    /// Every byte is held.
    pub(crate) fn complete(&self) -> bool {
        self.len.is_some_and(|l| self.contiguous() == l)
    }

    /// Every byte of `0..len` is held.
    #[cfg(test)]
    fn complete_prefix(&self, len: u64) -> bool {
        self.contiguous() >= len
    }

    /// The held bytes `from..to` (within [`Self::contiguous`]).
    #[cfg(test)]
    pub(crate) fn read(&self, from: u64, to: u64) -> Vec<u8> {
        assert!(to <= self.contiguous());
        let mut v = vec![0; (to - from) as usize];
        self.copy_out(from, &mut v);
        v
    }

    /// Whether the holes were filled from repair symbols.
    #[cfg(test)]
    pub(crate) fn rebuilt(&self) -> bool {
        self.rebuilt
    }

    fn holds(&self, start: u64, end: u64) -> bool {
        self.have
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= end)
    }

    /// Fill the holes from the repair symbols if there are enough of them
    /// (true when that was done now). Cheap while the bytes held and the
    /// symbols' bytes together fall short of the stream; `recount`: count
    /// the whole source symbols even when less than a symbol's worth of
    /// data came since they were last counted (a quiet spell, or a new
    /// symbol).
    pub(crate) fn try_rebuild(&mut self, recount: bool) -> bool {
        let (Some(len), Some(t)) = (self.len, self.symbol_size) else {
            return false;
        };
        if self.rebuilt || self.complete() || self.repairs.is_empty() {
            return false;
        }
        if self.failures >= MAX_TRIES {
            return false;
        }
        let t64 = t as u64;
        if self.held + self.repairs.len() as u64 * t64 < len {
            return false;
        }
        if !recount && self.held < self.counted_at + t64 {
            return false;
        }
        self.counted_at = self.held;
        let k = len.div_ceil(t64) as u32;
        let source: Vec<u32> = self.whole_symbols(len, t).collect();
        let at_hand = source.len() + self.repairs.len();
        if at_hand < k as usize || (self.failures > 0 && at_hand < self.tried + 2) {
            return false;
        }
        let symbol = |i: u32| {
            let start = i as u64 * t64;
            let end = ((i as u64 + 1) * t64).min(len);
            let mut s = vec![0; t as usize];
            self.copy_out(start, &mut s[..(end - start) as usize]);
            s
        };
        let symbols = source
            .iter()
            .map(|&i| (i, symbol(i)))
            .chain(self.repairs.iter().map(|(&esi, s)| (esi, s.to_vec())));
        match fec::decode(k as u16, t, symbols) {
            Some(mut block) => {
                block.truncate(len as usize);
                self.pieces = BTreeMap::from([(0, block.into_boxed_slice())]);
                self.extent = len;
                self.have = BTreeMap::from([(0, len)]);
                self.held = len;
                self.repairs.clear();
                self.rebuilt = true;
                true
            }
            None => {
                self.tried = at_hand;
                self.failures += 1;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn repair_grows_with_the_loss_rate_and_the_block() {
        assert_eq!(repairs_needed(375, 0.0), 0);
        assert_eq!(repairs_needed(0, 0.01), 0);
        // 1e-3 and 375 symbols: 0.38 packets lost on average; 7 repair
        // symbols replace 3 lost packets (6 symbols) with one to spare, and
        // 4 or more of the 382 are lost with a chance of 5.6e-4.
        assert_eq!(repairs_needed(375, 1e-3), 7);
        let mut last = 0;
        for p in [1e-4, 1e-3, 1e-2, 0.03] {
            let r = repairs_needed(741, p);
            assert!(r > last, "{p}: {r} after {last}");
            last = r;
        }
        // 3 % of a 1 MiB block and its repair: 25 packets lost on average,
        // 41 at most in all but 1e-3 of blocks: 83 symbols, 11 % of it.
        assert_eq!(repairs_needed(741, 0.03), 83);
        // At 10 % repair would be over a quarter of the block: none.
        assert_eq!(repairs_needed(741, 0.1), 0);
        assert_eq!(repairs_needed(741, 0.9), 0);
        // A small block at a few per cent: not worth it either.
        assert_eq!(repairs_needed(8, 0.03), 0);
        assert!(repairs_needed(80, 0.01) < repairs_needed(800, 0.01));
    }

    #[test]
    fn repair_goes_where_it_saves_more_time_than_it_takes() {
        let ms = Duration::from_millis;
        // 1 Gbit/s, 70 ms, 1e-3, a 1 MiB block: 11 symbols (0.12 ms of
        // the link) against a 52 % chance of a 70 ms round trip.
        assert_eq!(repairs_worth_it(741, 1416, 1e-3, 125e6, ms(70)), 11);
        // 256 kbit/s, 250 ms, the prior's 1e-3, 50 kB: 3 symbols take 133
        // ms against a 3.5 % chance of 250 ms.
        assert_eq!(repairs_needed(36, 1e-3), 3);
        assert_eq!(repairs_worth_it(36, 1416, 1e-3, 32e3, ms(250)), 0);
        // 10 Mbit/s, 300 ms, 3 %, 512 KiB: 51 ms of the link against a
        // round trip almost sure to be lost.
        let r = repairs_worth_it(370, 1416, 0.03, 1.25e6, ms(300));
        assert_eq!(r, repairs_needed(370, 0.03));
        assert!(r > 0);
        // No rate known: none.
        assert_eq!(repairs_worth_it(741, 1416, 1e-3, 0.0, ms(70)), 0);
    }

    #[test]
    fn the_loss_rate_counts_only_the_packets_quic_has_judged() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let rtt = Duration::from_millis(100);
        let mut m = LossMeter::default();
        // Nothing judged yet: the prior, one in a thousand.
        m.note(ms(0), 0);
        assert_eq!(m.rate(ms(10), rtt, 0), 1e-3);
        // 10,000 packets a second for a second, 1 % of those older than
        // 125 ms lost (8,750 judged at 1 s: 87 lost).
        for i in 1..=200 {
            m.note(ms(5 * i), 50 * i);
        }
        let r = m.rate(ms(1000), rtt, 87);
        assert!((r - 88.0 / 9750.0).abs() < 1e-9, "{r}");
        // Counting all 10,000 sent would read 0.88 %, the prior alone 0.1 %.
        assert!(r > 0.009);
        // Samples closer together than 5 ms are not kept.
        m.note(ms(1001), 10_001);
        assert_eq!(m.sent.back(), Some(&(ms(1000), 10_000)));
        // A lossless long transfer: the prior fades.
        let mut m = LossMeter::default();
        for i in 0..2000 {
            m.note(ms(5 * i), 1000 * i);
        }
        assert!(m.rate(ms(10_000), rtt, 0) < 1e-6);
    }

    #[test]
    fn symbol_size_fits_the_datagram() {
        assert_eq!(symbol_size(1452 - 28 - 30), Some(1368));
        assert_eq!(symbol_size(1200), Some(1176));
        assert_eq!(symbol_size(400), None);
        // A jumbo datagram (8,972 bytes) still makes symbols a receiver
        // takes: at most 8,192 bytes (PROTOCOL.md §1.11).
        assert_eq!(symbol_size(8972 - 28 - 30), Some(MAX_REPAIR_SYMBOL));
        assert_eq!(symbol_size(1 << 20), Some(MAX_REPAIR_SYMBOL));
    }

    /// Bytes at an offset, as QUIC hands them over.
    type Pieces = Vec<(u64, Vec<u8>)>;

    /// A stream of `len` random bytes cut into QUIC-like pieces, some lost
    /// (seeded), the rest in random order, and its repair symbols.
    fn lossy_stream(
        seed: u64,
        len: usize,
        t: u16,
        lost_pieces: usize,
        repair: u32,
    ) -> (Vec<u8>, Pieces, Vec<Repair>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < len {
            let n = rng.gen_range(1..=1400).min(len - at);
            pieces.push((at as u64, data[at..at + n].to_vec()));
            at += n;
        }
        for _ in 0..lost_pieces {
            let i = rng.gen_range(0..pieces.len());
            pieces.remove(i);
        }
        for i in (1..pieces.len()).rev() {
            let j = rng.gen_range(0..=i);
            pieces.swap(i, j);
        }
        let repairs = repair_symbols(7, &data, t, repair);
        (data, pieces, repairs)
    }

    #[test]
    fn a_block_with_holes_is_rebuilt_from_enough_repair_symbols() {
        for seed in 0..6 {
            let t = 1368;
            // 300 kB in up-to-1400-byte pieces, 3 of them lost: at most 9
            // symbols touched; 12 repair symbols replace them.
            let (data, pieces, repairs) = lossy_stream(seed, 300_000, t, 3, 12);
            let mut b = Block::default();
            // Two repair symbols come before any data (datagrams go
            // ahead of queued stream data).
            for r in &repairs[..2] {
                b.add(r.clone()).unwrap();
            }
            for (off, bytes) in &pieces {
                b.insert(*off, bytes).unwrap();
                assert!(!b.try_rebuild(false), "too few symbols yet");
            }
            assert!(!b.complete());
            let before = b.contiguous();
            assert!(before < data.len() as u64);
            assert_eq!(b.read(0, before), &data[..before as usize]);
            let mut done = false;
            for r in &repairs[2..] {
                b.add(r.clone()).unwrap();
                if b.try_rebuild(true) {
                    done = true;
                    break;
                }
            }
            assert!(done, "seed {seed}: not rebuilt");
            assert!(b.complete() && b.rebuilt());
            assert_eq!(b.read(0, data.len() as u64), &data[..]);
            // A late retransmission changes nothing.
            let (off, bytes) = &pieces[0];
            b.insert(*off, bytes).unwrap();
            assert_eq!(b.read(0, data.len() as u64), &data[..]);
        }
    }

    #[test]
    fn symbols_that_come_before_the_data_rebuild_it_when_it_comes() {
        let (data, pieces, repairs) = lossy_stream(21, 200_000, 1024, 2, 10);
        let mut b = Block::default();
        for r in repairs {
            b.add(r).unwrap();
            assert!(!b.try_rebuild(true));
        }
        let mut rebuilt_at = None;
        for (i, (off, bytes)) in pieces.iter().enumerate() {
            b.insert(*off, bytes).unwrap();
            if b.try_rebuild(false) {
                rebuilt_at = Some(i);
                break;
            }
        }
        let at = rebuilt_at.expect("rebuilt once enough data came");
        assert!(
            at + 10 >= pieces.len() - 20,
            "not long before the last piece: {at}"
        );
        assert_eq!(b.read(0, data.len() as u64), &data[..]);
    }

    #[test]
    fn bytes_trickled_into_holes_do_not_cost_a_scan_each() {
        let (data, pieces, repairs) = lossy_stream(31, 200_000, 1024, 0, 40);
        let mut b = Block::default();
        for r in &repairs {
            b.add(r.clone()).unwrap();
        }
        // Everything but one byte in each of the first 60 symbols.
        for (off, bytes) in &pieces {
            b.insert(*off, bytes).unwrap();
        }
        assert!(b.complete());
        let mut b = Block::default();
        for r in &repairs {
            b.add(r.clone()).unwrap();
        }
        let holes: Vec<usize> = (0..60).map(|i| i * 1024 + 7).collect();
        let mut at = 0;
        for &h in &holes {
            b.insert(at as u64, &data[at..h]).unwrap();
            at = h + 1;
        }
        b.insert(at as u64, &data[at..]).unwrap();
        // 60 symbols missing, 40 repair: no rebuild, and one count.
        assert!(!b.try_rebuild(false));
        assert_eq!(b.counted_at, b.held);
        // Filling holes one byte at a time counts again only once a
        // symbol's worth came.
        for &h in &holes[..30] {
            b.insert(h as u64, &data[h..h + 1]).unwrap();
            assert!(!b.try_rebuild(false));
        }
        assert_eq!(b.held - b.counted_at, 30, "not counted since");
        // A quiet spell counts now: 30 missing, 40 repair symbols: rebuilt.
        assert!(b.try_rebuild(true));
        assert_eq!(b.read(0, data.len() as u64), &data[..]);
    }

    #[test]
    fn too_few_repair_symbols_leave_the_holes_to_quic() {
        let (data, pieces, repairs) = lossy_stream(11, 100_000, 1024, 6, 2);
        let mut b = Block::default();
        for r in repairs {
            b.add(r).unwrap();
        }
        for (off, bytes) in &pieces {
            b.insert(*off, bytes).unwrap();
        }
        assert!(!b.try_rebuild(true));
        assert!(!b.complete());
        // The retransmissions fill the holes: complete, not rebuilt.
        let mut at = 0;
        while at < data.len() {
            let n = 1000.min(data.len() - at);
            b.insert(at as u64, &data[at..at + n]).unwrap();
            at += n;
        }
        assert!(b.complete() && !b.rebuilt());
        assert_eq!(b.read(0, data.len() as u64), &data[..]);
    }

    #[test]
    fn a_stream_that_ends_whole_needs_no_repair() {
        let (data, _, _) = lossy_stream(3, 5000, 1024, 0, 0);
        let mut b = Block::default();
        b.insert(2000, &data[2000..]).unwrap();
        b.insert(0, &data[..2000]).unwrap();
        assert_eq!(b.contiguous(), 5000);
        b.finished().unwrap();
        assert!(b.complete() && !b.rebuilt());
        assert_eq!(b.len(), Some(5000));
    }

    #[test]
    fn inconsistent_symbols_and_data_are_refused() {
        let (data, _, repairs) = lossy_stream(5, 20_000, 1024, 0, 2);
        let mut b = Block::default();
        b.add(repairs[0].clone()).unwrap();
        assert_eq!(
            b.insert(19_000, &[0; 2000]),
            Err("data past the protected stream's end")
        );
        let mut other = repairs[1].clone();
        other.len += 1;
        assert_eq!(
            b.add(other),
            Err("repair symbols disagree on the stream's length")
        );
        let mut b = Block::default();
        b.insert(0, &data[..10_000]).unwrap();
        b.insert(12_000, &data[12_000..]).unwrap();
        assert_eq!(
            b.finished(),
            Err("the protected stream's end disagrees with its repair symbols")
        );
        let mut b = Block::default();
        assert_eq!(
            b.insert(MAX_PROTECTED as u64, &[1]),
            Err("data past the protected stream's end")
        );
    }

    /// A hole costs nothing: one byte far into a stream holds one byte.
    #[test]
    fn holes_cost_only_what_came() {
        let mut b = Block::default();
        b.insert(0, b"LHR1").unwrap();
        b.insert(MAX_PROTECTED as u64 - 1, b"x").unwrap();
        assert_eq!(b.footprint(), 5 + 2 * PIECE_COST);
        assert_eq!(b.extent(), MAX_PROTECTED as u64);
        assert_eq!(b.contiguous(), 4);
        // 1,000 one-byte pieces hold 1,000 bytes and their overhead.
        let mut b = Block::default();
        for i in 0..1000u64 {
            b.insert(i * 1000 + 7, b"y").unwrap();
        }
        assert_eq!(b.footprint(), 1000 * (1 + PIECE_COST));
        // More pieces than an honest stream has end it.
        let mut b = Block::default();
        let r: Result<Vec<()>, _> = (0..MAX_PIECES as u64 + 1)
            .map(|i| b.insert(i * 2, b"z"))
            .collect();
        assert_eq!(r, Err("a protected stream came in more than 4,096 pieces"));
    }

    /// Overlapping, repeated and out-of-order pieces read back as the
    /// stream, each byte stored once.
    #[test]
    fn overlapping_pieces_read_back_as_the_stream() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let data: Vec<u8> = (0..200_000).map(|_| rng.gen()).collect();
        for _ in 0..20 {
            let mut b = Block::default();
            while !b.complete_prefix(data.len() as u64) {
                let at = rng.gen_range(0..data.len());
                let n = rng.gen_range(1..5000).min(data.len() - at);
                b.insert(at as u64, &data[at..at + n]).unwrap();
                assert!(b.footprint() < data.len() as u64 + MAX_PIECES as u64 * PIECE_COST);
            }
            assert_eq!(b.read(0, data.len() as u64), data);
            let stored: usize = b.pieces.values().map(|p| p.len()).sum();
            assert_eq!(stored, data.len(), "each byte stored once");
            let mut at = 0;
            let mut out = Vec::new();
            while at < data.len() as u64 {
                let c = b.chunk(at, 3000);
                assert!(!c.is_empty() && c.len() <= 3000);
                out.extend_from_slice(c);
                at += c.len() as u64;
            }
            assert_eq!(out, data);
        }
    }
}
