//! The datagrams of a multicast session (version 4), see docs/PROTOCOL.md.
//!
//! Every datagram starts with a 16-byte header:
//! ```text
//! 0   2  magic "LM"
//! 2   1  version (4)
//! 3   1  type
//! 4   1  flags: bit 0 = sealed (body encrypted and authenticated)
//! 5   3  zero
//! 8   8  session id (big endian)
//! ```
//! An unsealed body follows directly. A sealed datagram carries a 12-byte nonce and
//! then the body encrypted with ChaCha20-Poly1305 (16-byte tag), the header as
//! associated data. DATA bodies are fixed fields followed by the symbol; every other
//! body is a postcard-encoded struct. Decoding never trusts a length it has not
//! checked against the datagram: a malformed datagram is an error, never a panic.

use crate::seal::Key;
use serde::{Deserialize, Serialize};

/// First two bytes of every datagram; anything else is refused ([`WireError::Magic`]).
pub const MAGIC: [u8; 2] = *b"LM";
/// Protocol version, byte 2 of the header; a datagram of another version is refused
/// ([`WireError::Version`]).
pub const VERSION: u8 = 4;
/// Bytes of the header every datagram starts with; a sealed datagram's associated data.
pub const HEADER_LEN: usize = 16;
/// Fixed fields of a DATA body before the symbol: seq u64, block u32, esi u32.
pub const DATA_FIELDS: usize = 16;
/// Longest receiver name.
pub const MAX_NAME: usize = 64;
/// Largest datagram either side sends or accepts.
pub const MAX_DATAGRAM: usize = 9000;

const FLAG_SEALED: u8 = 1;

/// Datagram type, byte 3 of the header: below 16 the sender's, from 16 on a receiver's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Sender to group: the session's parameters ([`Announce`]); the only type that opens a
    /// session at a receiver.
    Announce = 1,
    /// Sender to group: one RaptorQ symbol of a manifest or data block ([`DataHdr`] and the
    /// symbol).
    Data = 2,
    /// Sender to group: after a pass, what do you still need? ([`Poll`]).
    Poll = 3,
    /// Sender to one receiver: the answer to its REGISTER or COMPLETE ([`Ack`]).
    Ack = 4,
    /// Sender to group: the session is over, finished or aborted ([`End`]).
    End = 5,
    /// Receiver to sender: join the session, sent once the manifest is decoded ([`Register`]).
    Register = 16,
    /// Receiver to sender: the answer to a POLL, the symbols its unfinished blocks need ([`Nack`]).
    Nack = 17,
    /// Receiver to sender: its result for the session ([`Complete`]).
    Complete = 18,
    /// Sender to group, on a channel: one file offered ([`Offer`]).
    Offer = 6,
    /// Sender to group, on a channel: one RaptorQ symbol of a file's block
    /// ([`ChunkHdr`] and the symbol).
    Chunk = 7,
    /// Sender to group, on a channel: its state, every 100 ms ([`Beat`]);
    /// the only type that opens a channel at a receiver.
    Beat = 8,
    /// Receiver to sender, on a channel: join it ([`Join`]).
    Join = 19,
    /// Receiver to sender, on a channel: what it has and needs ([`Status`]).
    Status = 20,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Announce,
            2 => Kind::Data,
            3 => Kind::Poll,
            4 => Kind::Ack,
            5 => Kind::End,
            16 => Kind::Register,
            17 => Kind::Nack,
            18 => Kind::Complete,
            6 => Kind::Offer,
            7 => Kind::Chunk,
            8 => Kind::Beat,
            19 => Kind::Join,
            20 => Kind::Status,
            _ => return None,
        })
    }
}

/// A session's parameters, repeated by the sender until the session ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announce {
    /// Bytes per symbol (every DATA symbol has exactly this length).
    pub symbol_size: u16,
    /// Source symbols of a full block.
    pub block_symbols: u16,
    /// The sender's configured rate in bit/s (IP and UDP headers counted); informational,
    /// receivers do not act on it.
    pub rate_bps: u64,
    /// Length of the manifest object in bytes (its blocks come before the data object's).
    pub manifest_len: u64,
    /// BLAKE3 of the whole manifest object: a receiver checks the decoded manifest against it
    /// before using it, and drops a later ANNOUNCE of the session with another hash.
    pub manifest_hash: [u8; 32],
    /// Length of the data object: every file's bytes, back to back.
    pub data_len: u64,
    /// An open group takes whoever registers; a closed one only the names it expects.
    pub open: bool,
    /// Sender clock (µs since the sender started), echoed for round-trip times.
    pub time_us: u64,
    /// The group round-trip time the sender works with (µs).
    pub grtt_us: u32,
    /// When the sender made the session (its wall clock, µs since the Unix
    /// epoch): a receiver with a key refuses a session made long ago, or
    /// one it has taken already (a replay).
    pub created_us: u64,
}

/// "Report what you still need": sent at the end of each pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Poll {
    /// The latest data pass (1 after the first); receivers echo it in NACK.
    pub pass: u32,
    /// Polls after this pass's data: 0 for the first, one more for each repeated poll that
    /// followed no data; echoed in NACK. The sender takes needs only from answers to the
    /// current `pass` and `round`.
    pub round: u32,
    /// Sender clock (µs since the sender started) when the poll was made, echoed as `echo_us`
    /// for round-trip times.
    pub time_us: u64,
    /// Receivers spread their answers uniformly over this many µs.
    pub window_us: u32,
}

/// What an [`Ack`] tells the receiver it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AckKind {
    /// The receiver is in the session.
    Registered,
    /// The sender has the receiver's completion report; it may stop repeating it.
    Done,
    /// Refused: a closed group that does not name this receiver, a name already registered
    /// from another address, or a session already ending.
    Rejected,
}

/// The sender's answer to one receiver (sent to its address only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Registered, completion report received, or refused.
    pub kind: AckKind,
    /// Name of the receiver it answers; receivers ignore ACKs that name another.
    pub name: String,
}

/// Why the sender ended the session (receivers put it in their error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndReason {
    /// Every receiver completed or was given up on.
    Finished,
    /// The sender stopped early (interrupted, or an error).
    Aborted,
}

/// The session is over (sent to the group, repeated). A receiver still reporting its
/// completion keeps that result; any other receiver fails the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    /// Whether every receiver was done with, or the sender stopped early.
    pub reason: EndReason,
}

/// A receiver joins (repeated until acknowledged; sent once it holds the manifest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Register {
    /// The receiver's name (see [`check_name`]); the sender tracks receivers by it.
    pub name: String,
    /// `time_us` of the newest ANNOUNCE or POLL the receiver saw (sender clock, µs).
    pub echo_us: u64,
    /// µs the receiver held that `time_us` before sending this; the sender subtracts it
    /// from the round-trip sample.
    pub held_us: u32,
}

/// What a receiver still lacks after a pass: `(block, symbols)` pairs, blocks as
/// deltas from the previous entry (postcard writes them as varints).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nack {
    /// Name of the answering receiver, as registered.
    pub name: String,
    /// `pass` of the POLL this answers.
    pub pass: u32,
    /// `round` of the POLL this answers; needs in answers to an older poll are ignored.
    pub round: u32,
    /// `time_us` of the newest ANNOUNCE or POLL the receiver saw (sender clock, µs), taken
    /// when the NACK goes out.
    pub echo_us: u64,
    /// µs from that datagram's arrival to this NACK going out (its random delay included).
    pub held_us: u32,
    /// Packets lost so far, parts per million (from sequence-number gaps), capped at
    /// 500 000 (50 %).
    pub loss_ppm: u32,
    /// This datagram is `part` (from 0) of `parts` of the answer.
    pub part: u16,
    /// How many datagrams the answer is split into (at least 1; at most 120 entries each).
    pub parts: u16,
    /// `(block, symbols)` for each block the receiver cannot rebuild yet: the block as a
    /// delta (absolute in the part's first entry), and how many more symbols it asks for,
    /// scaled up for its loss. Empty: nothing needed.
    pub needs: Vec<(u32, u32)>,
}

/// A receiver's result for the session (repeated until acknowledged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Complete {
    /// Name of the reporting receiver, as registered.
    pub name: String,
    /// Every file arrived and matched its BLAKE3.
    pub ok: bool,
    /// The session's data length in bytes, from the ANNOUNCE (not a count of bytes received).
    pub bytes: u64,
    /// DATA datagrams the receiver took in the session (manifest and data symbols, duplicates
    /// included).
    pub packets: u64,
    /// DATA datagrams it missed, from gaps in `seq` between the lowest and highest seen.
    pub lost: u64,
    /// Milliseconds from the receiver's first ANNOUNCE of the session to this report
    /// (informational; the sender does not read it).
    pub elapsed_ms: u64,
    /// Why the session failed at the receiver; empty when `ok`.
    pub error: String,
}

/// One file of a channel, offered before its data (and again on request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    /// The file's id on the channel: 0, 1, 2 ... in the order offered.
    pub oid: u32,
    /// When the file was ready at the sender (its wall clock, µs since the
    /// Unix epoch): a receiver's latency is counted from here.
    pub ready_us: u64,
    /// The sender could not read it: it is not sent (a receiver counts it missed).
    pub gone: bool,
    /// Path, size, mode, mtime, owner, attributes and BLAKE3 of the file
    /// (its directories are made as needed).
    pub item: crate::manifest::Item,
}

/// A channel's state, every 100 ms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    /// Counts the beats from 1; a receiver echoes the newest it saw in
    /// STATUS, so the sender knows which of its repairs that status saw.
    pub beat: u64,
    /// Sender clock (µs since the sender started), echoed for round-trip times.
    pub time_us: u64,
    /// The sender's wall clock now (µs since the Unix epoch): a receiver
    /// with a key refuses a channel whose beats were made long ago.
    pub created_us: u64,
    /// Bytes per symbol (every CHUNK symbol has exactly this length).
    pub symbol_size: u16,
    /// Source symbols of a full block.
    pub block_symbols: u16,
    /// The channel's rate in bit/s (informational).
    pub rate_bps: u64,
    /// An open group takes whoever joins; a closed one only the names it expects.
    pub open: bool,
    /// Files offered so far: ids below this exist.
    pub next_oid: u32,
    /// Every file below this id has had its first pass.
    pub sent_through: u32,
    /// Files below this id are no longer held: a receiver that lacks one
    /// has missed it.
    pub oldest: u32,
    /// Files at or above `sent_through` whose first pass is done (the most
    /// recent, at most [`MAX_FINISHED`]).
    pub finished: Vec<u32>,
}

/// Most ids in a BEAT's `finished`.
pub const MAX_FINISHED: usize = 64;

/// A receiver joins a channel (repeated until acknowledged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Join {
    /// The receiver's name (see [`check_name`]).
    pub name: String,
    /// The first file it wants: where it left off on this channel, or the
    /// `sent_through` of the first BEAT it saw.
    pub from_oid: u32,
    /// `time_us` of the newest BEAT it saw (sender clock, µs).
    pub echo_us: u64,
    /// µs it held that `time_us` before sending this.
    pub held_us: u32,
}

/// What a receiver has and needs, after a BEAT (and every second).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The receiver's name, as joined.
    pub name: String,
    /// The newest BEAT it saw.
    pub beat: u64,
    /// `time_us` of that BEAT.
    pub echo_us: u64,
    /// µs it held that `time_us` before sending this.
    pub held_us: u32,
    /// Packets lost so far, parts per million (capped at 500 000).
    pub loss_ppm: u32,
    /// It has (or has given up) every file below this id.
    pub done_below: u32,
    /// Files at or above `done_below` it has (at most [`MAX_STATUS`]).
    pub done: Vec<u32>,
    /// Files whose OFFER it lacks (at most [`MAX_STATUS`]).
    pub offers: Vec<u32>,
    /// `(file, block, symbols)` it needs (at most [`MAX_STATUS`]).
    pub needs: Vec<(u32, u32, u32)>,
}

/// Most entries in each list of a STATUS.
pub const MAX_STATUS: usize = 100;

/// The fixed fields of a CHUNK datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHdr {
    /// Sender's packet counter: gaps tell a receiver how much it lost.
    pub seq: u64,
    /// The file.
    pub oid: u32,
    /// Block of the file.
    pub block: u32,
    /// RaptorQ encoding symbol id: below the block's K a source symbol, else repair.
    pub esi: u32,
}

/// Fixed fields of a CHUNK body before the symbol: seq u64, oid u32, block u32, esi u32.
pub const CHUNK_FIELDS: usize = 20;

/// The fixed fields of a DATA datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHdr {
    /// Sender's packet counter: gaps tell a receiver how much it lost.
    pub seq: u64,
    /// Block number, global across the session: the manifest's blocks first, then the data's.
    pub block: u32,
    /// RaptorQ encoding symbol id: below the block's K a source symbol, else repair.
    pub esi: u32,
}

/// A datagram's decoded body, one variant per [`Kind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg<'a> {
    /// ANNOUNCE: the session's parameters.
    Announce(Announce),
    /// DATA: the fixed fields and the symbol, borrowed from the datagram (its length is not
    /// checked here: the receiver drops symbols that are not `symbol_size` bytes).
    Data(DataHdr, &'a [u8]),
    /// POLL: the sender asks for needs.
    Poll(Poll),
    /// ACK: the sender answers one receiver.
    Ack(Ack),
    /// END: the session is over.
    End(End),
    /// REGISTER: a receiver joins.
    Register(Register),
    /// NACK: a receiver's needs after a pass.
    Nack(Nack),
    /// COMPLETE: a receiver's result.
    Complete(Complete),
    /// OFFER: a channel's file.
    Offer(Offer),
    /// CHUNK: the fixed fields and the symbol, borrowed from the datagram.
    Chunk(ChunkHdr, &'a [u8]),
    /// BEAT: a channel's state.
    Beat(Beat),
    /// JOIN: a receiver joins a channel.
    Join(Join),
    /// STATUS: a channel receiver's state.
    Status(Status),
}

impl Msg<'_> {
    /// The type byte this body is sent under.
    pub fn kind(&self) -> Kind {
        match self {
            Msg::Announce(_) => Kind::Announce,
            Msg::Data(..) => Kind::Data,
            Msg::Poll(_) => Kind::Poll,
            Msg::Ack(_) => Kind::Ack,
            Msg::End(_) => Kind::End,
            Msg::Register(_) => Kind::Register,
            Msg::Nack(_) => Kind::Nack,
            Msg::Complete(_) => Kind::Complete,
            Msg::Offer(_) => Kind::Offer,
            Msg::Chunk(..) => Kind::Chunk,
            Msg::Beat(_) => Kind::Beat,
            Msg::Join(_) => Kind::Join,
            Msg::Status(_) => Kind::Status,
        }
    }

    /// Sent by the sender (else by a receiver).
    pub fn from_sender(&self) -> bool {
        (self.kind() as u8) < 16
    }
}

/// Why [`header`] or [`decode`] refused a datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than [`HEADER_LEN`] (its length in bytes).
    #[error("datagram of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    /// Does not start with [`MAGIC`] (the two bytes found).
    #[error("not a longhaul multicast datagram (magic {0:02x?})")]
    Magic([u8; 2]),
    /// Another protocol version than [`VERSION`] (the version byte found).
    #[error("protocol version {0}, this build speaks {VERSION}")]
    Version(u8),
    /// A type byte that is no [`Kind`].
    #[error("unknown datagram type {0}")]
    Type(u8),
    /// A flag bit other than `sealed`, or one of the three zero bytes, is set.
    #[error("reserved header bits set")]
    Reserved,
    /// Sealed, but this side has no key.
    #[error("sealed datagram, but no key is configured")]
    Sealed,
    /// Not sealed, but this side has a key (then every datagram must be sealed).
    #[error("unsealed datagram, but the session requires a key")]
    Unsealed,
    /// Did not authenticate under the key (wrong key, forged or damaged), or too short to
    /// hold nonce and tag.
    #[error("authentication failed (wrong key or forged datagram)")]
    Auth,
    /// The body does not parse as its type: truncated, bytes left over, or DATA without a
    /// symbol.
    #[error("malformed {0:?} body")]
    Body(Kind),
    /// A receiver name that is empty or longer than [`MAX_NAME`] (its length in bytes).
    #[error("name of {0} bytes exceeds {MAX_NAME}")]
    Name(usize),
    /// Longer than [`MAX_DATAGRAM`] (its length in bytes).
    #[error("datagram of {0} bytes exceeds {MAX_DATAGRAM}")]
    Long(usize),
}

/// Header fields of a datagram, read without decrypting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Datagram type (byte 3).
    pub kind: Kind,
    /// Flag bit 0: the body is encrypted and authenticated under the session's key.
    pub sealed: bool,
    /// Session id (bytes 8..16, big endian) the sender drew at random; every datagram of the
    /// session carries it.
    pub session: u64,
}

/// Check and read a datagram's header without touching the body: length (16 to
/// [`MAX_DATAGRAM`] bytes), magic, version, type and reserved bits.
pub fn header(d: &[u8]) -> Result<Header, WireError> {
    if d.len() < HEADER_LEN {
        return Err(WireError::Short(d.len()));
    }
    if d.len() > MAX_DATAGRAM {
        return Err(WireError::Long(d.len()));
    }
    if d[0..2] != MAGIC {
        return Err(WireError::Magic([d[0], d[1]]));
    }
    if d[2] != VERSION {
        return Err(WireError::Version(d[2]));
    }
    let kind = Kind::from_u8(d[3]).ok_or(WireError::Type(d[3]))?;
    if d[4] & !FLAG_SEALED != 0 || d[5..8] != [0, 0, 0] {
        return Err(WireError::Reserved);
    }
    Ok(Header {
        kind,
        sealed: d[4] & FLAG_SEALED != 0,
        session: u64::from_be_bytes(d[8..16].try_into().unwrap()),
    })
}

/// Overhead of a sealed datagram over an unsealed one.
pub const SEAL_OVERHEAD: usize = crate::seal::NONCE_LEN + crate::seal::TAG_LEN;

/// Encode `msg` into `out` (cleared first), sealed when a key is given.
pub fn encode(session: u64, msg: &Msg<'_>, key: Option<&Key>, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(msg.kind() as u8);
    out.push(if key.is_some() { FLAG_SEALED } else { 0 });
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&session.to_be_bytes());
    let body_at = out.len();
    if key.is_some() {
        out.extend_from_slice(&[0u8; crate::seal::NONCE_LEN]);
    }
    let plain_at = out.len();
    match msg {
        Msg::Data(h, sym) => {
            out.extend_from_slice(&h.seq.to_be_bytes());
            out.extend_from_slice(&h.block.to_be_bytes());
            out.extend_from_slice(&h.esi.to_be_bytes());
            out.extend_from_slice(sym);
        }
        Msg::Announce(b) => ser(b, out),
        Msg::Poll(b) => ser(b, out),
        Msg::Ack(b) => ser(b, out),
        Msg::End(b) => ser(b, out),
        Msg::Register(b) => ser(b, out),
        Msg::Nack(b) => ser(b, out),
        Msg::Complete(b) => ser(b, out),
        Msg::Chunk(h, sym) => {
            out.extend_from_slice(&h.seq.to_be_bytes());
            out.extend_from_slice(&h.oid.to_be_bytes());
            out.extend_from_slice(&h.block.to_be_bytes());
            out.extend_from_slice(&h.esi.to_be_bytes());
            out.extend_from_slice(sym);
        }
        Msg::Offer(b) => ser(b, out),
        Msg::Beat(b) => ser(b, out),
        Msg::Join(b) => ser(b, out),
        Msg::Status(b) => ser(b, out),
    }
    if let Some(k) = key {
        let (head, rest) = out.split_at_mut(body_at);
        let (nonce, _) = rest.split_at_mut(crate::seal::NONCE_LEN);
        k.fill_nonce(nonce);
        let nonce: [u8; crate::seal::NONCE_LEN] = nonce.try_into().unwrap();
        let aad: [u8; HEADER_LEN] = head.try_into().unwrap();
        k.seal_in_place(&nonce, &aad, out, plain_at);
    }
}

fn ser<T: Serialize>(v: &T, out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail for these plain structs.
    let bytes = postcard::to_allocvec(v).expect("postcard encode");
    out.extend_from_slice(&bytes);
}

/// Decode a datagram. With a key, the datagram must be sealed under it and is
/// decrypted in place (hence `&mut`); without one, sealed datagrams are refused.
pub fn decode<'a>(d: &'a mut [u8], key: Option<&Key>) -> Result<(Header, Msg<'a>), WireError> {
    let h = header(d)?;
    let body: &'a [u8] = match (key, h.sealed) {
        (None, true) => return Err(WireError::Sealed),
        (Some(_), false) => return Err(WireError::Unsealed),
        (None, false) => &d[HEADER_LEN..],
        (Some(k), true) => {
            let (head, rest) = d.split_at_mut(HEADER_LEN);
            if rest.len() < SEAL_OVERHEAD {
                return Err(WireError::Auth);
            }
            let (nonce, ct) = rest.split_at_mut(crate::seal::NONCE_LEN);
            let nonce: [u8; crate::seal::NONCE_LEN] = (&*nonce).try_into().unwrap();
            let aad: [u8; HEADER_LEN] = (&*head).try_into().unwrap();
            k.open_in_place(&nonce, &aad, ct).ok_or(WireError::Auth)?
        }
    };
    let msg = match h.kind {
        Kind::Data => {
            if body.len() < DATA_FIELDS + 1 {
                return Err(WireError::Body(Kind::Data));
            }
            let hdr = DataHdr {
                seq: u64::from_be_bytes(body[0..8].try_into().unwrap()),
                block: u32::from_be_bytes(body[8..12].try_into().unwrap()),
                esi: u32::from_be_bytes(body[12..16].try_into().unwrap()),
            };
            Msg::Data(hdr, &body[DATA_FIELDS..])
        }
        Kind::Announce => Msg::Announce(de(body, h.kind)?),
        Kind::Poll => Msg::Poll(de(body, h.kind)?),
        Kind::Ack => Msg::Ack(named(de::<Ack>(body, h.kind)?, |a| &a.name)?),
        Kind::End => Msg::End(de(body, h.kind)?),
        Kind::Register => Msg::Register(named(de::<Register>(body, h.kind)?, |r| &r.name)?),
        Kind::Nack => Msg::Nack(named(de::<Nack>(body, h.kind)?, |n| &n.name)?),
        Kind::Complete => Msg::Complete(named(de::<Complete>(body, h.kind)?, |c| &c.name)?),
        Kind::Chunk => {
            if body.len() < CHUNK_FIELDS + 1 {
                return Err(WireError::Body(Kind::Chunk));
            }
            let hdr = ChunkHdr {
                seq: u64::from_be_bytes(body[0..8].try_into().unwrap()),
                oid: u32::from_be_bytes(body[8..12].try_into().unwrap()),
                block: u32::from_be_bytes(body[12..16].try_into().unwrap()),
                esi: u32::from_be_bytes(body[16..20].try_into().unwrap()),
            };
            Msg::Chunk(hdr, &body[CHUNK_FIELDS..])
        }
        Kind::Offer => Msg::Offer(de(body, h.kind)?),
        Kind::Beat => Msg::Beat(de(body, h.kind)?),
        Kind::Join => Msg::Join(named(de::<Join>(body, h.kind)?, |j| &j.name)?),
        Kind::Status => {
            let st = named(de::<Status>(body, h.kind)?, |s| &s.name)?;
            if st.done.len() > MAX_STATUS
                || st.offers.len() > MAX_STATUS
                || st.needs.len() > MAX_STATUS
            {
                return Err(WireError::Body(h.kind));
            }
            Msg::Status(st)
        }
    };
    Ok((h, msg))
}

fn de<'a, T: Deserialize<'a>>(body: &'a [u8], kind: Kind) -> Result<T, WireError> {
    match postcard::take_from_bytes::<T>(body) {
        Ok((v, [])) => Ok(v),
        _ => Err(WireError::Body(kind)),
    }
}

fn named<T>(v: T, name: impl Fn(&T) -> &String) -> Result<T, WireError> {
    let n = name(&v).len();
    if n == 0 || n > MAX_NAME {
        return Err(WireError::Name(n));
    }
    Ok(v)
}

/// A receiver name must be 1..=64 bytes of printable ASCII without spaces.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("a receiver name must be 1 to {MAX_NAME} bytes"));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
        return Err(format!(
            "receiver name {name:?}: use printable ASCII without spaces or commas"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(msg: Msg<'_>, key: Option<&Key>) {
        let mut out = Vec::new();
        encode(42, &msg, key, &mut out);
        let mut buf = out.clone();
        let (h, got) = decode(&mut buf, key).unwrap();
        assert_eq!(h.session, 42);
        assert_eq!(h.sealed, key.is_some());
        assert_eq!(got, msg);
    }

    fn all() -> Vec<Msg<'static>> {
        vec![
            Msg::Announce(Announce {
                symbol_size: 1400,
                block_symbols: 1024,
                rate_bps: 400_000_000,
                manifest_len: 77,
                manifest_hash: [7; 32],
                data_len: 1 << 30,
                open: false,
                time_us: 123,
                grtt_us: 700_000,
                created_us: 1_790_000_000_000_000,
            }),
            Msg::Data(
                DataHdr {
                    seq: 9,
                    block: 3,
                    esi: 1030,
                },
                b"symbol bytes",
            ),
            Msg::Poll(Poll {
                pass: 2,
                round: 1,
                time_us: 5,
                window_us: 100_000,
            }),
            Msg::Ack(Ack {
                kind: AckKind::Done,
                name: "rx1".into(),
            }),
            Msg::End(End {
                reason: EndReason::Finished,
            }),
            Msg::Register(Register {
                name: "rx1".into(),
                echo_us: 5,
                held_us: 3,
            }),
            Msg::Nack(Nack {
                name: "rx1".into(),
                pass: 1,
                round: 0,
                echo_us: 1,
                held_us: 2,
                loss_ppm: 1000,
                part: 0,
                parts: 1,
                needs: vec![(0, 3), (5, 1000)],
            }),
            Msg::Complete(Complete {
                name: "rx1".into(),
                ok: true,
                bytes: 10,
                packets: 20,
                lost: 1,
                elapsed_ms: 30,
                error: String::new(),
            }),
            Msg::Offer(Offer {
                oid: 7,
                ready_us: 1_790_000_000_000_000,
                gone: false,
                item: crate::manifest::Item {
                    path: b"eumetsat/msg/product.nc".to_vec(),
                    kind: longhaul_transfer::EntryKind::File,
                    size: 5_000_000,
                    mode: 0o644,
                    mtime_ns: 1,
                    link: vec![],
                    hash: [9; 32],
                    extents: None,
                    owner: None,
                    xattrs: vec![],
                },
            }),
            Msg::Chunk(
                ChunkHdr {
                    seq: 1 << 40,
                    oid: 7,
                    block: 2,
                    esi: 1100,
                },
                b"symbol bytes",
            ),
            Msg::Beat(Beat {
                beat: 99,
                time_us: 5,
                created_us: 1_790_000_000_000_000,
                symbol_size: 1400,
                block_symbols: 1024,
                rate_bps: 350_000_000,
                open: true,
                next_oid: 120,
                sent_through: 117,
                oldest: 3,
                finished: vec![118],
            }),
            Msg::Join(Join {
                name: "rx1".into(),
                from_oid: 117,
                echo_us: 5,
                held_us: 2,
            }),
            Msg::Status(Status {
                name: "rx1".into(),
                beat: 99,
                echo_us: 5,
                held_us: 2,
                loss_ppm: 1000,
                done_below: 100,
                done: vec![102, 105],
                offers: vec![101],
                needs: vec![(103, 0, 12), (104, 3, 1)],
            }),
        ]
    }

    #[test]
    fn every_message_roundtrips_plain_and_sealed() {
        let key = Key::from_material(b"a key file with enough bytes", 42).unwrap();
        for m in all() {
            roundtrip(m.clone(), None);
            roundtrip(m, Some(&key));
        }
    }

    #[test]
    fn malformed_datagrams_are_precise_errors() {
        let mut out = Vec::new();
        encode(1, &all()[2], None, &mut out);
        assert_eq!(
            decode(&mut out[..5].to_vec(), None),
            Err(WireError::Short(5))
        );
        let mut bad = out.clone();
        bad[0] = b'X';
        assert!(matches!(decode(&mut bad, None), Err(WireError::Magic(_))));
        let mut bad = out.clone();
        bad[2] = 9;
        assert_eq!(decode(&mut bad, None), Err(WireError::Version(9)));
        let mut bad = out.clone();
        bad[3] = 99;
        assert_eq!(decode(&mut bad, None), Err(WireError::Type(99)));
        let mut bad = out.clone();
        bad[5] = 1;
        assert_eq!(decode(&mut bad, None), Err(WireError::Reserved));
        // A truncated or padded body.
        let mut bad = out[..out.len() - 1].to_vec();
        assert_eq!(decode(&mut bad, None), Err(WireError::Body(Kind::Poll)));
        let mut bad = out.clone();
        bad.push(0);
        assert_eq!(decode(&mut bad, None), Err(WireError::Body(Kind::Poll)));
        // A DATA datagram without a symbol.
        let mut d = Vec::new();
        encode(
            1,
            &Msg::Data(
                DataHdr {
                    seq: 0,
                    block: 0,
                    esi: 0,
                },
                b"",
            ),
            None,
            &mut d,
        );
        assert_eq!(decode(&mut d, None), Err(WireError::Body(Kind::Data)));
        // An oversized name.
        let mut d = Vec::new();
        encode(
            1,
            &Msg::Register(Register {
                name: "x".repeat(65),
                echo_us: 0,
                held_us: 0,
            }),
            None,
            &mut d,
        );
        assert_eq!(decode(&mut d, None), Err(WireError::Name(65)));
        // Longer than any datagram we send.
        let mut big = out.clone();
        big.resize(MAX_DATAGRAM + 1, 0);
        assert_eq!(
            decode(&mut big, None),
            Err(WireError::Long(MAX_DATAGRAM + 1))
        );
    }

    #[test]
    fn keys_are_enforced_and_forgeries_fail() {
        let key = Key::from_material(b"a key file with enough bytes", 1).unwrap();
        let other = Key::from_material(b"another key file, also long", 1).unwrap();
        let mut plain = Vec::new();
        encode(1, &all()[0], None, &mut plain);
        assert_eq!(
            decode(&mut plain.clone(), Some(&key)),
            Err(WireError::Unsealed)
        );
        let mut sealed = Vec::new();
        encode(1, &all()[0], Some(&key), &mut sealed);
        assert_eq!(decode(&mut sealed.clone(), None), Err(WireError::Sealed));
        assert_eq!(
            decode(&mut sealed.clone(), Some(&other)),
            Err(WireError::Auth)
        );
        // Every flipped bit anywhere (header included, as associated data) fails.
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x10;
            assert!(
                decode(&mut bad, Some(&key)).is_err(),
                "bit flip at {i} passed"
            );
        }
        // The same key material for another session gives another key.
        let k2 = Key::from_material(b"a key file with enough bytes", 2).unwrap();
        assert_eq!(decode(&mut sealed.clone(), Some(&k2)), Err(WireError::Auth));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("site-7.example").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name("a,b").is_err());
        assert!(check_name(&"x".repeat(65)).is_err());
    }
}
