//! Wire format of the unicast protocol ([`VERSION`], docs/PROTOCOL.md). Sans-IO: encoders and
//! decoders over byte buffers, no sockets.
//!
//! Control stream (the connection's first bidirectional stream): frames of
//! `u32 big-endian length | postcard-encoded Frame`, at most [`MAX_FRAME`] bytes.
//! Data streams (unidirectional, sender to receiver): the 4-byte prelude `LHD1`,
//! then records of a 20-byte [`RecordHeader`] followed by `len` payload bytes
//! and, for a file's only chunk, its 32-byte BLAKE3 ([`RecordHeader::hash`]).
//! The streams of a transfer's last window start with `LHR1` instead, and
//! QUIC datagrams carry RaptorQ repair symbols of them ([`Repair`]).

use longhaul_transfer::sync::SyncMode;
use longhaul_transfer::{Entry, CHUNK_SIZE};
use serde::{Deserialize, Serialize};

/// 2: a record of a file's only chunk carries the file's hash (version 1
/// sent it in `FileDone` on the control stream, which queues behind the
/// manifest: a receiver could not place a small file when it was written).
/// 3: `Hello.fresh`: a get into a destination that holds none of its targets
/// asks the sender not to wait for a `Want` per file (a round trip).
/// 4: `Welcome.fresh`: a put's server grants the same when its destination
/// holds none of the put's targets (and repeats a get's `Hello.fresh`).
/// 5: `Op::Put.sync`: a put's `--sync` reaches the server, which receives
/// (version 4 had no field for it: every put sent everything), and
/// `Op::Put.fsync` its `--fsync`;
/// `Hello.streams` and `Welcome.streams`: a get's `--streams` reaches the
/// server, which sends (it used its own), and the client learns the count.
/// 6: `Op::Put.durable` replaces `fsync`: durable files are the default (a
/// file is named only once its data is synced, and the file system is synced
/// before `Done`), `--no-fsync` turns it off; and the server closes a session
/// itself once its role is over (a lost close no longer leaves it waiting
/// for the idle timeout).
/// 7: `Done.behind_ms`: the receiver's time behind reaches the sender (a
/// put's client says when the server's disk set the pace).
/// 8: `Hello.connections` and `Hello.session`, and the `Join` frame: one
/// transfer over several QUIC connections (`--connections N`), each its own
/// endpoint and socket; the extra ones join the session by its key.
/// 9: tail repair: the data streams of a transfer's last window start with
/// [`REPAIRED_PRELUDE`], and RaptorQ symbols of each ([`Repair`]) follow as
/// QUIC datagrams, from which the receiver rebuilds what the path lost
/// instead of waiting a round trip for QUIC's retransmission.
pub const VERSION: u32 = 13;
/// TLS ALPN both sides require; it names the protocol family and stays
/// `longhaul/1` across versions ([`VERSION`] is in the `Hello`).
pub const ALPN: &[u8] = b"longhaul/1";
/// Largest control frame accepted (payload bytes, after the length prefix).
pub const MAX_FRAME: usize = 1 << 20;
/// The first 4 bytes of every data stream; a receiver refuses a stream that
/// starts otherwise ([`ProtoError::BadPrelude`]).
pub const DATA_PRELUDE: &[u8; 4] = b"LHD1";
/// The first 4 bytes of a data stream protected by tail repair (version 9):
/// the same records, and [`Repair`] datagrams that name the stream.
pub const REPAIRED_PRELUDE: &[u8; 4] = b"LHR1";
/// Bytes of an encoded [`RecordHeader`] on a data stream.
pub const RECORD_HEADER_LEN: usize = 20;
/// The bit of a record's `len` field that says the file's hash follows the data.
const HASH_FLAG: u32 = 1 << 31;
/// Bit 30 of a record's `len`: [`RecordHeader::zeros`] (version 11).
const ZEROS_FLAG: u32 = 1 << 30;
/// Bit 29 of a record's `len`: [`RecordHeader::sparse`] (version 11).
const SPARSE_FLAG: u32 = 1 << 29;
/// Bytes of the hash that follows such a record.
pub const RECORD_HASH_LEN: usize = 32;

/// Why a session or a part of it failed; maps onto the client's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// Malformed request or frame.
    Protocol,
    /// Wrong or missing token.
    Auth,
    /// The server is read-only and a put was asked.
    ReadOnly,
    /// A requested path does not exist or is not allowed.
    NotFound,
    /// A path was refused (absolute, `..`, escaping link).
    BadPath,
    /// A file system error on the side that sends this.
    Io,
    /// Unsupported protocol version.
    Version,
    /// The received file's BLAKE3 did not match the sender's.
    Verify,
    /// The file vanished on the sending side between its entry and its
    /// data (version 10).
    Vanished,
}

/// What a session does: the client's whole request, carried in its `Hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Fetch these root-relative paths from the server.
    Get {
        /// Paths beneath the server's root as the user typed them (raw bytes;
        /// one ending in `/` must be a directory); the server sends their
        /// trees, and an entry's `root` is the index of its path here.
        paths: Vec<Vec<u8>>,
        /// What the server leaves out of the trees it sends (`--exclude`,
        /// `--include`; rsync's rules, in order). Version 10.
        filters: Vec<longhaul_transfer::filter::Rule>,
        /// The extended attributes and ACLs the server sends with each
        /// entry (`--xattrs`, `--acls`). Version 11.
        meta: longhaul_transfer::meta::Wanted,
        /// A shard that holds its plan (`get --shard`): [`Frame::Only`]
        /// frames and a [`Frame::OnlyEnd`] follow the `Hello`, listing the
        /// files it wants, and the server sends the roots' own entries and
        /// those files instead of walking the trees. Version 12.
        listed: bool,
    },
    /// Send `roots` into `dest` (root-relative) on the server.
    Put {
        /// The destination beneath the server's root, as the user typed it
        /// (raw bytes; the server normalises it, `.` or empty is the root).
        dest: Vec<u8>,
        /// The client's part of whether `dest` is a directory: it was named
        /// with a trailing `/` or several roots go into it. The server adds
        /// whether it is a directory there already.
        dest_is_dir: bool,
        /// One per local path of the put, in order: an entry's `root` is the
        /// index into this list.
        roots: Vec<RootSpec>,
        /// What the server, the receiver, skips (`--sync`, `--sync --checksum`).
        sync: PutSync,
        /// The server makes each file durable before naming it and syncs
        /// its file system before its `Done` (false: `--no-fsync`).
        durable: bool,
        /// The server makes the FIFOs and sockets sent (`--specials`); it
        /// never makes device nodes. Version 10.
        specials: bool,
        /// The server removes what the destination's directories hold that
        /// the put does not send (`--delete`), except what `filters`
        /// protect, and says so in [`Frame::Changes`]. Version 11.
        delete: bool,
        /// The client's `--exclude` / `--include` rules: with `delete`, what
        /// they leave out is kept at the destination. Version 11.
        filters: Vec<longhaul_transfer::filter::Rule>,
        /// Nothing is written on the server: it works out what the put
        /// would change and says so in [`Frame::Changes`] (`--dry-run`).
        /// Version 11.
        dry_run: bool,
        /// Owners go by the numbers sent, not by name (`--numeric-ids`),
        /// where the server applies them. Version 11.
        numeric_ids: bool,
        /// One shard of a put that several clients share (`put --shard`),
        /// or its finish. Version 12.
        shard: Option<ShardReq>,
    },
}

/// A put's shard (`put --shard K/N`, `--shard finish`; version 12): the
/// server, the receiver, wants only this shard's part of the files, by the
/// plan its shards share in the destination (PROTOCOL.md §1.13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReq {
    /// The shard, from 0.
    pub index: u32,
    /// How many.
    pub count: u32,
    /// Not a shard but the finish: the put checks every file (`Checksum`)
    /// and the server removes the plan once the session has ended well.
    pub finish: bool,
}

/// What a receiver changed, or would change in a dry run, at one path
/// ([`Frame::Changes`]). Version 11.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// Where, beneath the receiver's base (raw bytes).
    pub path: Vec<u8>,
    /// What.
    pub what: What,
}

/// The kinds of [`Change`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum What {
    /// A file would be sent: `new` (nothing of it at the destination), or
    /// what differs there (size, mtime, contents under `--checksum`).
    File {
        /// Not at the destination.
        new: bool,
        /// Its size differs.
        size: bool,
        /// Its mtime differs.
        mtime: bool,
        /// Its BLAKE3 differs (`--checksum`).
        checksum: bool,
    },
    /// A directory would be created.
    Dir,
    /// A symbolic link would be made (`new`) or pointed elsewhere.
    Symlink {
        /// Not at the destination.
        new: bool,
    },
    /// A hard link would be made.
    HardLink,
    /// A FIFO, socket or device node would be made.
    Special {
        /// A device node.
        device: bool,
    },
    /// Removed (`--delete`), or would be in a dry run.
    Deleted {
        /// A directory.
        dir: bool,
    },
}

/// Which files already at the destination a receiver skips.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum PutSync {
    /// None: every file is sent (a part with a matching journal is resumed).
    #[default]
    Always,
    /// Those whose size and mtime match.
    SizeMtime,
    /// Those whose BLAKE3 matches (equal sizes only).
    Checksum,
}

impl From<SyncMode> for PutSync {
    fn from(m: SyncMode) -> PutSync {
        match m {
            SyncMode::Always => PutSync::Always,
            SyncMode::SizeMtime => PutSync::SizeMtime,
            SyncMode::Checksum => PutSync::Checksum,
        }
    }
}

impl From<PutSync> for SyncMode {
    fn from(s: PutSync) -> SyncMode {
        match s {
            PutSync::Always => SyncMode::Always,
            PutSync::SizeMtime => SyncMode::SizeMtime,
            PutSync::Checksum => SyncMode::Checksum,
        }
    }
}

/// How a requested root is named at the destination: `name` is its basename, empty
/// when its contents go straight into the destination (a trailing `/`, or `.`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootSpec {
    /// The root's basename at the destination (raw bytes); empty when its
    /// contents go straight into the destination.
    pub name: Vec<u8>,
}

/// The client's first frame: its protocol version, its token and its whole
/// request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The protocol version the client speaks ([`VERSION`]); a server answers
    /// another with `Fatal { code: Version }`.
    pub version: u32,
    /// The shared secret a server with a token requires (it compares BLAKE3
    /// digests in constant time); empty when the client has none.
    pub token: Vec<u8>,
    /// The request: a get or a put.
    pub op: Op,
    /// Ask the sending side to cap its rate (bits/s, 0 = no cap).
    pub max_rate: u64,
    /// Ask the sending side for a congestion controller (`bbr`, `cubic`, `fixed:RATE`).
    pub cc: Option<String>,
    /// A get: the client's destination holds none of the targets (nor
    /// their part files), so it wants every file whole. The server sends each
    /// file as soon as its entry is out, without waiting for a `Want`, and the
    /// client sends none. A put: the client sends its files at once, before
    /// the `Welcome` (in its first flight, 0-RTT), as in a fresh session; a
    /// server whose destination is not fresh reads none of it and waits for
    /// the client to close and connect again without it.
    pub fresh: bool,
    /// Get only: data streams the server sends on at once (`--streams`); 0
    /// leaves it to the server. A server caps it at [`MAX_STREAMS`].
    pub streams: u32,
    /// The QUIC connections the session runs over, this one included (1, or
    /// 0 from a client that does not say: one). Each of the others sends a
    /// [`Frame::Join`] with `session` as its first frame; the data streams
    /// are spread over all of them. At most [`MAX_CONNECTIONS`].
    pub connections: u32,
    /// The session's key: [`SESSION_KEY_LEN`] random bytes chosen by the
    /// client when `connections` > 1, else empty. Only the client and the
    /// server know it (it travels inside TLS).
    pub session: Vec<u8>,
}

/// Most data streams a client may ask a server to send on at once.
pub const MAX_STREAMS: u32 = 64;
/// Most QUIC connections one session may run over.
pub const MAX_CONNECTIONS: u32 = 16;
/// Bytes of a session key ([`Hello::session`]).
pub const SESSION_KEY_LEN: usize = 16;

/// What the receiver wants of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Want {
    /// Nothing: the receiver holds it already (`--sync`: size and mtime
    /// match) and settles it as skipped.
    Skip,
    /// Every chunk: the file is sent whole.
    All,
    /// Chunk ranges `[start, end)`.
    Chunks(Vec<(u64, u64)>),
    /// Everything, unless the sender's BLAKE3 equals this.
    UnlessHash([u8; 32]),
    /// No data: only the file's BLAKE3, in a `FileDone` that says
    /// `unchanged: false` (a dry run's `--checksum`). Version 11.
    HashOnly,
    /// Chunks `first..end` only (a shard's part of a file, `--shard`):
    /// the sender reads none of the others, sends the chunks of `send`
    /// (ranges within `first..end`; the receiver holds the rest), and its
    /// `FileDone` carries the slice's digest
    /// ([`longhaul_transfer::ChunkPlan::slice_digest`] over `first..end`),
    /// not the file's BLAKE3. Version 12.
    Slice {
        /// First chunk of the slice.
        first: u64,
        /// One past its last chunk.
        end: u64,
        /// What goes out of it: half-open chunk ranges.
        send: Vec<(u64, u64)>,
    },
}

/// Final word of the receiver on one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Every byte is written, its BLAKE3 equals the sender's, and the file is
    /// in place under its name.
    Verified,
    /// Not sent: the receiver already held it (`Want::Skip`, or an
    /// `UnlessHash` that matched).
    Skipped,
    /// Not received.
    Failed {
        /// `Verify` when the BLAKE3 did not match, `Io` for any other failure.
        code: ErrorCode,
        /// What went wrong, naming the file, for the sender's report.
        message: String,
    },
    /// A dry run: it would have been sent. Version 11.
    WouldSend,
}

/// One control-stream message. The order of the variants is their number on
/// the wire (docs/PROTOCOL.md §1.3), so reordering them is a wire change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// client → server, first frame.
    Hello(Hello),
    /// server → client, the answer to a good Hello. `fresh`: the session
    /// runs without `Want`s (a get whose Hello said so; a put whose
    /// destination on the server holds none of its targets). `streams`: on
    /// a get, the data streams the server sends on; 0 on a put.
    Welcome {
        /// The server's [`VERSION`] (always the client's: another version
        /// was answered with `Fatal`).
        version: u32,
        /// The server software and its version (`longhaul X.Y.Z`), for the
        /// client's report.
        server: String,
        /// The session runs without `Want`s (see above).
        fresh: bool,
        /// The data streams the server sends on (a get); 0 on a put.
        streams: u32,
    },
    /// Either way: the session is over.
    Fatal {
        /// Why, as a class; the client maps it onto its exit status.
        code: ErrorCode,
        /// Why, for a human.
        message: String,
    },
    /// sender → receiver: a requested root could not be served.
    RootError {
        /// Index of the root in the request (`Op::Get.paths`,
        /// `Op::Put.roots`).
        root: u32,
        /// `NotFound` (absent, or not a directory though named with `/`),
        /// `BadPath` (refused path) or `Io`.
        code: ErrorCode,
        /// What went wrong, naming the sender's path.
        message: String,
    },
    /// sender → receiver: one item of the manifest.
    Entry(Entry),
    /// sender → receiver: part of a tree could not be read.
    EntryError {
        /// Index of the root in the request (receivers do not use it).
        root: u32,
        /// The item that could not be read, relative to that root (raw
        /// bytes; empty: the root itself).
        path: Vec<u8>,
        /// The error reading it.
        message: String,
    },
    /// sender → receiver: no more entries.
    ManifestEnd,
    /// receiver → sender.
    Want {
        /// The file's entry id.
        id: u64,
        /// What of it to send.
        want: Want,
    },
    /// sender → receiver: every wanted chunk of `id` is sent; its BLAKE3 is `hash`.
    /// `unchanged`: the receiver's `UnlessHash` matched, nothing was sent.
    FileDone {
        /// The file's entry id.
        id: u64,
        /// BLAKE3 of the whole file as the sender read it; the receiver
        /// places the file only if the bytes it wrote hash the same.
        hash: [u8; 32],
        /// The receiver's `UnlessHash` equalled `hash`: no data follows and
        /// the receiver keeps its file (settled as skipped).
        unchanged: bool,
    },
    /// sender → receiver: the file could not be read.
    FileFailed {
        /// The file's entry id.
        id: u64,
        /// Why, naming the sender's path (a read error, or the file changed
        /// while it was sent).
        message: String,
        /// The file was gone when the sender came to read it: the receiver
        /// keeps nothing of it (version 10).
        vanished: bool,
        /// The file changed while it was sent and is sent once more, under
        /// the entry that follows (a new id): the receiver drops what it
        /// holds of this one and reports nothing for it (version 11).
        again: bool,
    },
    /// receiver → sender.
    FileResult {
        /// The file's entry id.
        id: u64,
        /// How the file ended at the receiver.
        outcome: Outcome,
    },
    /// receiver → sender: every entry is settled.
    Done {
        /// Nothing failed on the receiver, in the files or outside them (a
        /// directory's mode or mtime, the final sync).
        ok: bool,
        /// Milliseconds during which the receiver read no data because it
        /// was behind (its disk or CPU): the sender's report says so too
        /// (since version 7).
        behind_ms: u64,
    },
    /// client → server, the first frame on an extra connection of a session
    /// that runs over several (since version 8): the connection joins the
    /// session whose `Hello.session` is `session`. The server answers
    /// nothing; it refuses with `Fatal` (then closes) a wrong version or
    /// token, an unknown session, or one that has all its connections.
    Join {
        /// The client's [`VERSION`].
        version: u32,
        /// The server's token, as in the `Hello`.
        token: Vec<u8>,
        /// The session's key ([`Hello::session`]).
        session: Vec<u8>,
        /// Which of the session's connections this is: 1 to
        /// `Hello.connections` − 1 (the `Hello`'s is 0).
        index: u32,
    },
    /// receiver → sender, before `Done` (since version 11): what the
    /// receiver removed (`--delete`), or in a dry run what it would change,
    /// in batches of at most [`CHANGES_PER_FRAME`].
    Changes(Vec<Change>),
    /// client → server after a listed get's `Hello` (since version 12):
    /// files the shard wants, each its root (index into `Op::Get.paths`)
    /// and its path beneath it; at most [`ONLY_PER_FRAME`] a frame.
    Only(Vec<(u32, Vec<u8>)>),
    /// client → server: the end of a listed get's `Only` frames (since
    /// version 12).
    OnlyEnd,
}

/// Most items in one [`Frame::Only`] (paths of up to 4 KiB keep a frame
/// within [`MAX_FRAME`]).
pub const ONLY_PER_FRAME: usize = 200;

/// Most [`Change`]s in one [`Frame::Changes`] (paths of up to 4 KiB keep a
/// frame under [`MAX_FRAME`]).
pub const CHANGES_PER_FRAME: usize = 64;

/// Why bytes from the peer are not a valid control frame or data record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A control frame's length prefix (the byte count it claims) is over
    /// [`MAX_FRAME`]; refused before any of it is buffered.
    #[error("control frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    FrameTooLarge(u64),
    /// A frame body that is not exactly one postcard `Frame` (the decoder's
    /// error, or trailing bytes).
    #[error("malformed control frame: {0}")]
    Malformed(String),
    /// A data stream whose first 4 bytes are not [`DATA_PRELUDE`].
    #[error("data stream does not start with the LHD1 or LHR1 prelude")]
    BadPrelude,
    /// A datagram that is not a well-formed [`Repair`].
    #[error("malformed repair datagram: {0}")]
    BadRepair(&'static str),
    /// A record whose `len` (bytes) is over the chunk size.
    #[error("data record of {0} bytes exceeds the chunk size")]
    RecordTooLarge(u32),
    /// A record whose byte offset is not a multiple of the chunk size.
    #[error("data record at offset {0} is not on a chunk boundary")]
    Unaligned(u64),
    /// A stream ended in the middle of a frame, a record header or its data.
    #[error("stream ended inside a frame")]
    Truncated,
    /// A Hello of another version, whose fields this side cannot decode.
    #[error("protocol version {0} {OTHER_VERSION} {VERSION})")]
    Version(u32),
}

/// What the error of a Hello of another version says.
const OTHER_VERSION: &str = "is not supported (this side speaks";

/// The version a Hello body names, if it is a Hello of another version
/// (whose other fields need not decode): variant 0, then the version as a
/// LEB128 varint.
fn other_hello_version(body: &[u8]) -> Option<u32> {
    let (&variant, rest) = body.split_first()?;
    if variant != 0 {
        return None;
    }
    let mut v: u64 = 0;
    for (i, &b) in rest.iter().take(5).enumerate() {
        v |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return u32::try_from(v).ok().filter(|&v| v != VERSION);
        }
    }
    None
}

/// A frame as it goes on the control stream: its body's length (u32 big
/// endian), then the postcard body.
pub fn encode(frame: &Frame) -> Vec<u8> {
    let body = postcard::to_stdvec(frame).expect("frames always serialize");
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Incremental control-frame decoder: push bytes as they arrive, pop frames.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    pos: usize,
}

impl FrameDecoder {
    /// A decoder with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append bytes as they were read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet consumed.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtoError> {
        let avail = &self.buf[self.pos..];
        if avail.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes(avail[..4].try_into().unwrap()) as usize;
        if len > MAX_FRAME {
            return Err(ProtoError::FrameTooLarge(len as u64));
        }
        if avail.len() < 4 + len {
            return Ok(None);
        }
        let body = &avail[4..4 + len];
        let frame = match postcard::take_from_bytes::<Frame>(body) {
            Ok((f, [])) => f,
            bad => {
                return Err(match (other_hello_version(body), bad) {
                    (Some(v), _) => ProtoError::Version(v),
                    (None, Ok(_)) => ProtoError::Malformed("trailing bytes after frame".into()),
                    (None, Err(e)) => ProtoError::Malformed(e.to_string()),
                })
            }
        };
        self.pos += 4 + len;
        if self.pos > 1 << 16 && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        Ok(Some(frame))
    }

    /// At end of stream: an error if a partial frame is left.
    pub fn finish(&self) -> Result<(), ProtoError> {
        if self.buffered() == 0 {
            Ok(())
        } else {
            Err(ProtoError::Truncated)
        }
    }
}

/// Header of one data record: chunk `offset / CHUNK_SIZE` of file `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Entry id of the file the chunk belongs to.
    pub id: u64,
    /// Byte offset of the chunk in the file, a multiple of `CHUNK_SIZE`.
    pub offset: u64,
    /// Bytes of file data that follow the header (at most `CHUNK_SIZE`),
    /// without the hash flag.
    pub len: u32,
    /// The record is the file's only chunk and its data is followed by the
    /// file's BLAKE3 ([`RECORD_HASH_LEN`] bytes); the sender sends no
    /// `FileDone` for it. On the wire: bit 31 of `len`.
    pub hash: bool,
    /// The chunk is `len` zero bytes, a hole at the sender: no data
    /// follows, but the chunk's digest does ([`RECORD_HASH_LEN`] bytes: its
    /// BLAKE3 chaining value, or the file's BLAKE3 for a file's only chunk,
    /// which then has `hash` too). The receiver leaves it a hole and takes
    /// the digest as the chunk's. On the wire: bit 30 of `len` (version 11).
    pub zeros: bool,
    /// The chunk is of a sparse file: the receiver leaves each 4 KiB
    /// block of it that is all zeros a hole instead of writing it. On the
    /// wire: bit 29 of `len` (version 11).
    pub sparse: bool,
}

impl RecordHeader {
    /// The header's wire bytes: `id`, `offset` and `len` little endian,
    /// `hash` as bit 31 of `len`.
    pub fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut b = [0u8; RECORD_HEADER_LEN];
        b[..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        let flag = |on: bool, f: u32| if on { f } else { 0 };
        let len = self.len
            | flag(self.hash, HASH_FLAG)
            | flag(self.zeros, ZEROS_FLAG)
            | flag(self.sparse, SPARSE_FLAG);
        b[16..].copy_from_slice(&len.to_le_bytes());
        b
    }

    /// Reads a header off the wire; refuses a `len` over `CHUNK_SIZE`
    /// ([`ProtoError::RecordTooLarge`]) and an offset off a chunk boundary
    /// ([`ProtoError::Unaligned`]).
    pub fn decode(b: &[u8; RECORD_HEADER_LEN]) -> Result<Self, ProtoError> {
        let len = u32::from_le_bytes(b[16..].try_into().unwrap());
        let h = RecordHeader {
            id: u64::from_le_bytes(b[..8].try_into().unwrap()),
            offset: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            len: len & !(HASH_FLAG | ZEROS_FLAG | SPARSE_FLAG),
            hash: len & HASH_FLAG != 0,
            zeros: len & ZEROS_FLAG != 0,
            sparse: len & SPARSE_FLAG != 0,
        };
        if h.len as u64 > CHUNK_SIZE {
            return Err(ProtoError::RecordTooLarge(h.len));
        }
        if !h.offset.is_multiple_of(CHUNK_SIZE) {
            return Err(ProtoError::Unaligned(h.offset));
        }
        Ok(h)
    }

    /// Index of the record's chunk in its file (`offset / CHUNK_SIZE`).
    pub fn chunk(&self) -> u64 {
        self.offset / CHUNK_SIZE
    }

    /// Whether [`RECORD_HASH_LEN`] bytes follow the data: the file's hash
    /// (`hash`) or a chunk of zeros' digest (`zeros`), one trailer for both.
    pub fn has_trailer(&self) -> bool {
        self.hash || self.zeros
    }

    /// Bytes of data that follow the header: `len`, or none for a chunk
    /// of zeros.
    pub fn data_len(&self) -> u32 {
        if self.zeros {
            0
        } else {
            self.len
        }
    }
}

/// Bytes of a [`Repair`] datagram before its symbol.
pub const REPAIR_HEADER_LEN: usize = 20;
/// The tag byte a [`Repair`] datagram starts with.
const REPAIR_TAG: u8 = b'R';
/// Largest protected stream (bytes from its prelude to its end): a sender
/// starts a new one after 512 KiB (PROTOCOL.md §1.11), and one record (a
/// chunk of 1 MiB, its header and hash) may take it past that.
pub const MAX_PROTECTED: u32 = (3 << 19) + 4096;
/// Smallest symbol a [`Repair`] may carry (a datagram on a 1,200-byte
/// path carries 1,144): with [`MAX_PROTECTED`] a block has at most 1,540
/// symbols.
pub const MIN_REPAIR_SYMBOL: u16 = 1024;
/// Largest symbol a [`Repair`] may carry: a sender on a path with larger
/// datagrams (jumbo frames, loopback) sends symbols of this size.
pub const MAX_REPAIR_SYMBOL: u16 = 8192;

/// One RaptorQ repair symbol of a protected data stream (version 9), sent
/// as a QUIC datagram on the stream's connection. The stream's bytes, from
/// its prelude to its end (`len`), are one source block of `ceil(len /
/// symbol_size)` symbols, the last padded with zeros; `esi` counts from
/// there (RFC 6330's encoding symbol id).
///
/// Wire: `'R'`, a zero byte, `symbol_size` (u16), `stream` (the QUIC stream
/// id, u64), `len` (u32), `esi` (u32), all little endian, then the symbol's
/// `symbol_size` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// The protected stream's QUIC stream id.
    pub stream: u64,
    /// The stream's bytes, prelude included.
    pub len: u32,
    /// Bytes of each symbol (the datagram's, less this header).
    pub symbol_size: u16,
    /// RaptorQ's encoding symbol id, at least [`Repair::source_symbols`].
    pub esi: u32,
    /// The symbol.
    pub symbol: bytes::Bytes,
}

impl Repair {
    /// Source symbols of the block (`K`).
    pub fn source_symbols(&self) -> u32 {
        self.len.div_ceil(self.symbol_size as u32)
    }

    /// The largest `esi` a block of this size gets: a sender sends at most
    /// `K / 4 + 1` repair symbols of one.
    pub fn most_esi(&self) -> u32 {
        let k = self.source_symbols();
        k + k / 4
    }

    /// The datagram's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(REPAIR_HEADER_LEN + self.symbol.len());
        b.extend_from_slice(&[REPAIR_TAG, 0]);
        b.extend_from_slice(&self.symbol_size.to_le_bytes());
        b.extend_from_slice(&self.stream.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.esi.to_le_bytes());
        b.extend_from_slice(&self.symbol);
        b
    }

    /// Reads a datagram; refuses anything but a repair symbol (at least
    /// K, at most RaptorQ's largest id) of a block this protocol can make.
    pub fn decode(d: bytes::Bytes) -> Result<Repair, ProtoError> {
        use longhaul_transfer::fec::ALIGN;
        if d.len() < REPAIR_HEADER_LEN || d[0] != REPAIR_TAG || d[1] != 0 {
            return Err(ProtoError::BadRepair("not a repair symbol"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(d[i..i + 4].try_into().unwrap());
        let r = Repair {
            symbol_size: u16::from_le_bytes([d[2], d[3]]),
            stream: u64::from_le_bytes(d[4..12].try_into().unwrap()),
            len: u32_at(12),
            esi: u32_at(16),
            symbol: d.slice(REPAIR_HEADER_LEN..),
        };
        if !(MIN_REPAIR_SYMBOL..=MAX_REPAIR_SYMBOL).contains(&r.symbol_size)
            || !r.symbol_size.is_multiple_of(ALIGN)
        {
            return Err(ProtoError::BadRepair("symbol size"));
        }
        if r.symbol.len() != r.symbol_size as usize {
            return Err(ProtoError::BadRepair("symbol length"));
        }
        if r.len < DATA_PRELUDE.len() as u32 || r.len > MAX_PROTECTED {
            return Err(ProtoError::BadRepair("block length"));
        }
        if r.esi < r.source_symbols() || r.esi > r.most_esi() {
            return Err(ProtoError::BadRepair("symbol id"));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_transfer::EntryKind;

    #[test]
    fn repair_datagram_golden_bytes_and_refusals() {
        let r = Repair {
            stream: 0x0203,
            len: 5000,
            symbol_size: 1024,
            esi: 5,
            symbol: bytes::Bytes::from(vec![0xab; 1024]),
        };
        let b = r.encode();
        assert_eq!(
            &b[..REPAIR_HEADER_LEN],
            &[b'R', 0, 0x00, 0x04, 0x03, 0x02, 0, 0, 0, 0, 0, 0, 0x88, 0x13, 0, 0, 5, 0, 0, 0]
        );
        assert_eq!(r.source_symbols(), 5);
        assert_eq!(Repair::decode(b.clone().into()).unwrap(), r);
        let bad = |f: &dyn Fn(&mut Vec<u8>), why: &'static str| {
            let mut x = b.clone();
            f(&mut x);
            assert_eq!(
                Repair::decode(x.into()),
                Err(ProtoError::BadRepair(match why {
                    "tag" => "not a repair symbol",
                    w => w,
                })),
                "{why}"
            );
        };
        bad(&|x| x[0] = b'X', "tag");
        bad(&|x| x.truncate(10), "tag");
        bad(&|x| x.truncate(REPAIR_HEADER_LEN + 1000), "symbol length");
        bad(
            &|x| x[2..4].copy_from_slice(&1001u16.to_le_bytes()),
            "symbol size",
        );
        bad(
            &|x| x[2..4].copy_from_slice(&256u16.to_le_bytes()),
            "symbol size",
        );
        bad(
            &|x| x[12..16].copy_from_slice(&(5u32 << 20).to_le_bytes()),
            "block length",
        );
        // A source symbol's id (under K = 5) is never sent as a datagram.
        bad(
            &|x| x[16..20].copy_from_slice(&4u32.to_le_bytes()),
            "symbol id",
        );
        bad(
            &|x| x[16..20].copy_from_slice(&(1u32 << 24).to_le_bytes()),
            "symbol id",
        );
    }

    fn sample() -> Vec<Frame> {
        vec![
            Frame::Hello(Hello {
                version: VERSION,
                token: b"t".to_vec(),
                op: Op::Get {
                    paths: vec![b"a/b".to_vec(), b"-x\n".to_vec()],
                    filters: vec![longhaul_transfer::filter::Rule {
                        action: longhaul_transfer::filter::Action::Exclude,
                        pattern: b"*.tmp".to_vec(),
                    }],
                    meta: Default::default(),
                    listed: false,
                },
                max_rate: 0,
                cc: Some("bbr".into()),
                fresh: true,
                streams: 7,
                connections: 3,
                session: vec![5; SESSION_KEY_LEN],
            }),
            Frame::Hello(Hello {
                version: VERSION,
                token: vec![],
                op: Op::Put {
                    dest: b"in".to_vec(),
                    dest_is_dir: true,
                    roots: vec![RootSpec {
                        name: b"x".to_vec(),
                    }],
                    sync: PutSync::Checksum,
                    durable: true,
                    specials: true,
                    delete: true,
                    filters: vec![longhaul_transfer::filter::Rule {
                        action: longhaul_transfer::filter::Action::Include,
                        pattern: b"/keep/***".to_vec(),
                    }],
                    dry_run: true,
                    numeric_ids: true,
                    shard: Some(ShardReq {
                        index: 1,
                        count: 4,
                        finish: false,
                    }),
                },
                max_rate: 5,
                cc: None,
                fresh: false,
                streams: 0,
                connections: 0,
                session: vec![],
            }),
            Frame::Welcome {
                version: VERSION,
                server: "s".into(),
                fresh: false,
                streams: 9,
            },
            Frame::Entry(Entry {
                id: 9,
                root: 1,
                path: b"x/\xffy".to_vec(),
                kind: EntryKind::File,
                size: 1 << 40,
                mode: 0o755,
                mtime_ns: -5,
                link: vec![],
                owner: longhaul_transfer::meta::Owner {
                    uid: 1000,
                    gid: 70000,
                    user: b"ana".to_vec(),
                    group: b"\xffstaff".to_vec(),
                },
                xattrs: vec![longhaul_transfer::meta::Xattr {
                    name: b"user.origin".to_vec(),
                    value: vec![0, 1, 255],
                }],
                allocated: 4096,
            }),
            Frame::Want {
                id: 9,
                want: Want::Chunks(vec![(0, 3), (7, 9)]),
            },
            Frame::FileDone {
                id: 9,
                hash: [7; 32],
                unchanged: false,
            },
            Frame::FileResult {
                id: 9,
                outcome: Outcome::Failed {
                    code: ErrorCode::Io,
                    message: "disk full".into(),
                },
            },
            Frame::ManifestEnd,
            Frame::Done {
                ok: true,
                behind_ms: 7,
            },
            Frame::Join {
                version: VERSION,
                token: b"t".to_vec(),
                session: vec![5; SESSION_KEY_LEN],
                index: 2,
            },
            Frame::Want {
                id: 10,
                want: Want::HashOnly,
            },
            Frame::FileResult {
                id: 10,
                outcome: Outcome::WouldSend,
            },
            Frame::Changes(vec![
                Change {
                    path: b"a/\xfeb".to_vec(),
                    what: What::File {
                        new: false,
                        size: true,
                        mtime: false,
                        checksum: true,
                    },
                },
                Change {
                    path: b"gone".to_vec(),
                    what: What::Deleted { dir: true },
                },
            ]),
        ]
    }

    #[test]
    fn frames_roundtrip_byte_by_byte() {
        let frames = sample();
        let wire: Vec<u8> = frames.iter().flat_map(encode).collect();
        let mut d = FrameDecoder::new();
        let mut got = Vec::new();
        for b in wire {
            d.push(&[b]);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
        }
        d.finish().unwrap();
        assert_eq!(got, frames);
    }

    #[test]
    fn golden_bytes_match_protocol_md() {
        // docs/PROTOCOL.md section 1.3: variant 7 (Want), id 5, Want variant 2
        // (Chunks), one range (1, 3), behind a 4-byte big-endian length.
        let w = encode(&Frame::Want {
            id: 5,
            want: Want::Chunks(vec![(1, 3)]),
        });
        assert_eq!(w, [0, 0, 0, 6, 7, 5, 2, 1, 1, 3]);
        let d = encode(&Frame::Done {
            ok: true,
            behind_ms: 1500,
        });
        assert_eq!(d, [0, 0, 0, 4, 11, 1, 0xdc, 0x0b]);
        // Variant 12 (Join): version 8, a 1-byte token, a 16-byte key, index 2.
        let j = encode(&Frame::Join {
            version: 8,
            token: b"t".to_vec(),
            session: vec![0xab; SESSION_KEY_LEN],
            index: 2,
        });
        let mut want = vec![0, 0, 0, 22, 12, 8, 1, b't', 16];
        want.extend([0xab; 16]);
        want.push(2);
        assert_eq!(j, want);
        let f = encode(&Frame::Fatal {
            code: ErrorCode::Verify,
            message: "x".into(),
        });
        assert_eq!(f, [0, 0, 0, 4, 2, 7, 1, b'x']);
        // Variant 4 (Entry) of kind 5 (CharDevice, version 10): its device
        // number (1, 3) = 259 in `size`, mode 0600.
        let e = encode(&Frame::Entry(Entry {
            id: 1,
            root: 0,
            path: b"n".to_vec(),
            kind: longhaul_transfer::manifest::EntryKind::CharDevice,
            size: 259,
            mode: 0o600,
            mtime_ns: 0,
            link: vec![],
            owner: longhaul_transfer::meta::Owner {
                uid: 0,
                gid: 0,
                user: b"r".to_vec(),
                group: vec![],
            },
            xattrs: vec![],
            allocated: 0,
        }));
        // Since version 11: owner (uid 0, gid 0, user "r", group ""), no
        // xattrs, `allocated` 0.
        assert_eq!(
            e,
            [
                0, 0, 0, 19, 4, 1, 0, 1, b'n', 5, 0x83, 0x02, 0x80, 0x03, 0, 0, 0, 0, 1, b'r', 0,
                0, 0
            ]
        );
        let h = RecordHeader {
            id: 1,
            offset: 1 << 20,
            len: 2,
            hash: false,
            zeros: false,
            sparse: false,
        }
        .encode();
        assert_eq!(
            h,
            [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 2, 0, 0, 0]
        );
        let h = RecordHeader {
            id: 1,
            offset: 0,
            len: 2,
            hash: true,
            zeros: false,
            sparse: false,
        }
        .encode();
        assert_eq!(
            h,
            [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0x80]
        );
    }

    #[test]
    fn hostile_frames_are_refused_precisely() {
        let mut d = FrameDecoder::new();
        // A length prefix claiming 1 TB (saturates u32) is refused before buffering.
        d.push(&u32::MAX.to_be_bytes());
        assert_eq!(
            d.next_frame(),
            Err(ProtoError::FrameTooLarge(u32::MAX as u64))
        );

        let mut d = FrameDecoder::new();
        d.push(&[0, 0, 0, 3, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next_frame(), Err(ProtoError::Malformed(_))));

        // A valid frame with junk appended inside its length.
        let mut f = encode(&Frame::ManifestEnd);
        f.push(0);
        let n = (f.len() - 4) as u32;
        f[..4].copy_from_slice(&n.to_be_bytes());
        let mut d = FrameDecoder::new();
        d.push(&f);
        assert!(matches!(d.next_frame(), Err(ProtoError::Malformed(_))));

        let mut d = FrameDecoder::new();
        d.push(&encode(&Frame::ManifestEnd)[..2]);
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.finish(), Err(ProtoError::Truncated));
    }

    #[test]
    fn record_headers() {
        let h = RecordHeader {
            id: 3,
            offset: 5 * CHUNK_SIZE,
            len: 77,
            hash: false,
            zeros: false,
            sparse: false,
        };
        assert_eq!(RecordHeader::decode(&h.encode()), Ok(h));
        assert_eq!(h.chunk(), 5);
        let h = RecordHeader { hash: true, ..h };
        assert_eq!(RecordHeader::decode(&h.encode()), Ok(h));
        let bad = RecordHeader {
            id: 3,
            offset: 5,
            len: 1,
            hash: false,
            zeros: false,
            sparse: false,
        }
        .encode();
        assert_eq!(RecordHeader::decode(&bad), Err(ProtoError::Unaligned(5)));
        let big = RecordHeader {
            id: 3,
            offset: 0,
            len: CHUNK_SIZE as u32 + 1,
            hash: true,
            zeros: false,
            sparse: false,
        }
        .encode();
        assert!(matches!(
            RecordHeader::decode(&big),
            Err(ProtoError::RecordTooLarge(_))
        ));
    }
}
