//! What a session reports: per-file outcomes, problems with their kind (which maps
//! onto the exit status), and live progress counters for a progress bar; and
//! what a client reports of a whole transfer ([`ClientReport`]: its sessions'
//! outcomes, and the [`Outage`]s between them).

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Class of a failure, each with its own exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A source file vanished between its entry and its data (as rsync's
    /// exit 24): the least of the kinds.
    Vanished,
    /// Could not connect, trust refused, access refused, connection lost.
    Connection,
    /// The other side could not do what was asked (missing path, its I/O error).
    Remote,
    /// A file system error on this side.
    LocalIo,
    /// A file arrived but its BLAKE3 did not match.
    Verify,
}

impl Kind {
    /// The class of a failure the peer reported with `code`.
    pub fn of_peer(code: crate::proto::ErrorCode) -> Kind {
        use crate::proto::ErrorCode;
        match code {
            ErrorCode::Auth | ErrorCode::Version => Kind::Connection,
            ErrorCode::Verify => Kind::Verify,
            ErrorCode::Vanished => Kind::Vanished,
            _ => Kind::Remote,
        }
    }

    /// Exit status (documented in the README and `--help`).
    pub fn exit_code(self) -> i32 {
        match self {
            Kind::Vanished => 24,
            Kind::Connection => 3,
            Kind::Remote => 4,
            Kind::LocalIo => 5,
            Kind::Verify => 6,
        }
    }
}

/// One thing that went wrong in a session; its `kind` sets the exit status.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    /// The class of the failure.
    pub kind: Kind,
    /// The file or path it concerns, as reports name it (lossy UTF-8); None
    /// for a problem of the whole session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What went wrong, for a human.
    pub message: String,
    /// A frame that did not decode as ours was a Hello of this other
    /// protocol version (a server reading its first frame answers
    /// `Fatal { Version }`).
    #[serde(skip)]
    pub peer_version: Option<u32>,
    /// The connection was lost to the path or the server went away for a
    /// while (an idle timeout, a stateless reset, a server restarting or
    /// busy), not refused: a transfer may reconnect and resume
    /// ([`crate::ClientOpts::retry_for`]).
    #[serde(skip)]
    pub transient: bool,
}

impl Problem {
    /// A problem of no particular path.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Problem {
            kind,
            path: None,
            message: message.into(),
            peer_version: None,
            transient: false,
        }
    }

    /// A problem with `path`.
    pub fn at(kind: Kind, path: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            path: Some(path.into()),
            ..Problem::new(kind, message)
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{p}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

impl std::error::Error for Problem {}

/// How one file ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Received whole, its BLAKE3 equal to the sender's, and in place under
    /// its name (a sender reports what the receiver's `FileResult` said).
    Verified,
    /// Already at the destination (size+mtime, or the same BLAKE3).
    Skipped,
    /// Not received: [`FileReport::error`] says why.
    Failed,
    /// A dry run (`--dry-run`): it would have been sent.
    WouldSend,
    /// A shard's part of the file (`--shard`) is received, checked against
    /// the sender's slice digest and durable; the shard that completes the
    /// file names it.
    Slice,
}

/// What became of one file in a session, as one side saw it.
#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    /// The file's path (lossy UTF-8): on the receiving side where it lands
    /// beneath the destination's base directory, on the sending side where it
    /// was read beneath the source's directory.
    pub path: String,
    /// The file's size in bytes, as the sender's entry gave it.
    pub size: u64,
    /// How it ended.
    pub status: Status,
    /// Payload bytes of this file that crossed the network in this run.
    pub bytes_transferred: u64,
    /// Bytes that were already held from an interrupted run.
    pub bytes_resumed: u64,
    /// The file's BLAKE3 in hex, for a verified file; None for a skipped or
    /// failed one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
    /// Why it failed; None unless the status is `Failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One path a transfer changed at the destination (a removal, `--delete`), or
/// would change (`--dry-run`), as the client reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ChangeReport {
    /// The path beneath the destination's base (lossy UTF-8; a directory's
    /// ends in `/`).
    pub path: String,
    /// `send`, `mkdir`, `symlink`, `hardlink`, `special` or `delete`.
    pub action: &'static str,
    /// The change as `rsync --itemize-changes` writes it, e.g. `>f+++++++++`
    /// (a new file received), `<f.st......` (a changed one sent), `cd+++++++++`,
    /// `*deleting`.
    pub item: String,
}

impl ChangeReport {
    /// `c` as the client reports it; `received`: the client is the
    /// receiver (a get), else the sender (a put).
    pub fn of(c: &crate::proto::Change, received: bool) -> ChangeReport {
        use crate::proto::What;
        let dir = match received {
            true => '>',
            false => '<',
        };
        let mut path = String::from_utf8_lossy(&c.path).into_owned();
        let (action, item) = match c.what {
            What::File { new: true, .. } => ("send", format!("{dir}f+++++++++")),
            What::File {
                size,
                mtime,
                checksum,
                ..
            } => {
                let flag = |on: bool, ch: char| if on { ch } else { '.' };
                (
                    "send",
                    format!(
                        "{dir}f{}{}{}......",
                        flag(checksum, 'c'),
                        flag(size, 's'),
                        flag(mtime, 't')
                    ),
                )
            }
            What::Dir => {
                path.push('/');
                ("mkdir", "cd+++++++++".into())
            }
            What::Symlink { new: true } => ("symlink", "cL+++++++++".into()),
            What::Symlink { new: false } => ("symlink", "cL.c.......".into()),
            What::HardLink => ("hardlink", "hf+++++++++".into()),
            What::Special { device: true } => ("special", "cD+++++++++".into()),
            What::Special { device: false } => ("special", "cS+++++++++".into()),
            What::Deleted { dir } => {
                if dir {
                    path.push('/');
                }
                ("delete", "*deleting".into())
            }
        };
        ChangeReport { path, action, item }
    }
}

/// A FIFO, socket or device node the receiving side did not make, and why
/// (not asked with `--specials` / `--devices`, or refused there).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NotMade {
    /// Where it would have landed (lossy UTF-8).
    pub path: String,
    /// `fifo`, `socket`, `char device` or `block device`.
    pub kind: &'static str,
    /// Why not.
    pub why: String,
}

/// Outcome of one session on one side.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SessionReport {
    /// One report per file entry settled, in the order they were settled.
    pub files: Vec<FileReport>,
    /// Directory entries in the manifest (the roots included), counted as
    /// they were sent or received.
    pub dirs: u64,
    /// Symlink entries in the manifest, counted likewise.
    pub symlinks: u64,
    /// Everything that went wrong, failed files included.
    pub problems: Vec<Problem>,
    /// Seconds during which the receiving side read no data because it was
    /// behind (its disk or CPU had not yet dealt with what came): the
    /// transfer went at its pace, not the network's. The sending side has
    /// the receiver's figure from its `Done` (0 before it came).
    pub held_back_s: f64,
    /// Bytes of tail-repair symbols (QUIC datagrams) this side sent (the
    /// sender) or received (the receiver).
    pub repair_bytes: u64,
    /// Protected data streams the receiver rebuilt from repair symbols
    /// instead of waiting for QUIC's retransmission.
    pub rebuilt_streams: u64,
    /// The receiver's seconds from the last new data on a protected stream
    /// until the last of them was whole (None: no protected stream).
    pub tail_s: Option<f64>,
    /// Hard links made (a receiver) or sent (a sender): names of a file
    /// sent under another name, linked to it.
    pub hardlinks: u64,
    /// FIFOs, sockets and device nodes made (a receiver), or made by the
    /// receiver as this sender knows its rules (a put's client).
    pub specials: u64,
    /// Those not made, and why.
    pub not_made: Vec<NotMade>,
    /// What the receiver removed (`--delete`), or in a dry run what it would
    /// change: the receiver's own, or those its `Changes` frames listed (a
    /// put's client). Paths beneath the receiver's base.
    pub changes: Vec<crate::proto::Change>,
    /// Files under way when the session failed, as far as they got (status
    /// `Failed`, not counted in `files`): what a transfer that reconnects
    /// adds to the next session's account of them.
    pub unsettled: Vec<FileReport>,
    /// A shard (`--shard`): files of the manifest that other shards move.
    pub other_shards: u64,
}

impl SessionReport {
    /// The most severe problem kind, if any.
    pub fn worst(&self) -> Option<Kind> {
        self.problems.iter().map(|p| p.kind).max()
    }
}

/// Live counters, updated by the session and read by a progress bar.
#[derive(Debug, Default)]
pub struct Progress {
    /// File entries of the manifest so far; grows while the manifest streams.
    pub files_total: AtomicU64,
    /// Files settled so far: verified, skipped or failed.
    pub files_done: AtomicU64,
    /// Sum of the sizes of the files in `files_total`, in bytes.
    pub bytes_total: AtomicU64,
    /// File bytes handed to the data streams (sender) or written (receiver)
    /// so far, plus those that need no sending: chunks held from an
    /// interrupted run and skipped files.
    pub bytes_done: AtomicU64,
    /// When file data first went out (sender: its first record handed to a
    /// stream) or came in (receiver: the first data stream). Unset until
    /// then; set once, so a `Progress` serves one session.
    pub first_data: std::sync::OnceLock<std::time::Instant>,
    /// The connection was lost at this instant and the transfer is trying
    /// to reconnect (`--retry-for`), with this many attempts so far; None
    /// while a session is up.
    pub retrying: std::sync::Mutex<Option<(std::time::Instant, u32)>>,
}

impl Progress {
    /// Adds `n` to `counter` (relaxed: the counters are only displayed).
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value of `counter`.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// A session of the transfer was welcomed: it counts its files and
    /// bytes afresh (after a lost connection, those placed or held
    /// included), and the transfer is no longer retrying.
    pub fn welcomed(&self) {
        *self.retrying.lock().unwrap() = None;
        for c in [
            &self.files_total,
            &self.files_done,
            &self.bytes_total,
            &self.bytes_done,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// When the connection was lost and how many attempts have been made
    /// to reconnect, while the transfer is trying to.
    pub fn retrying(&self) -> Option<(std::time::Instant, u32)> {
        *self.retrying.lock().unwrap()
    }
}

/// The document `--json` prints, and what the human summary is made from.
#[derive(Debug, Clone, Serialize)]
pub struct ClientReport {
    /// `"get"` or `"put"`.
    pub op: &'static str,
    /// No problem was reported (`problems` is empty): the exit status is 0.
    pub ok: bool,
    /// The server's `Welcome.server`: its software and version.
    pub server: String,
    /// The server's fingerprint when this run trusted it for the first time
    /// and added it to the known-hosts file (`--accept-new`, or a
    /// `--fingerprint` not yet recorded); None when the file already named it.
    pub fingerprint: Option<String>,
    /// Every file's outcome, sorted by path.
    pub files: Vec<FileReport>,
    /// Everything that went wrong, failed files included; the worst kind sets
    /// [`ClientReport::exit_code`].
    pub problems: Vec<Problem>,
    /// Sums over `files`, and the session's directories and symlinks.
    pub totals: Totals,
    /// Wall time of the whole run, in seconds: from the call (before name
    /// resolution and the handshake) until the connection was closed.
    pub seconds: f64,
    /// Payload bytes moved in this run / seconds, in Mbit/s.
    pub rate_mbps: f64,
    /// From the server's welcome until the last file was done (the data phase,
    /// without the handshake and the goodbye).
    pub data_seconds: f64,
    /// `wan`'s starting rate, bits/s, when it came from the rate memory
    /// (0: none remembered, or a hint or --max-rate given).
    pub remembered_bps: u64,
    /// The largest rate the connection carried over any second, bits/s of
    /// UDP payload (received for a get, sent and not lost for a put): what
    /// the rate memory keeps.
    pub peak_bps: u64,
    /// quinn's round-trip time estimate of the path when the session ended,
    /// in milliseconds.
    pub rtt_ms: f64,
    /// Bytes of packets QUIC declared lost and sent again (over every
    /// connection of the session).
    pub retransmitted_bytes: u64,
    /// UDP payload bytes this client sent on the session's connections,
    /// handshake, ACKs and retransmissions included.
    pub udp_tx_bytes: u64,
    /// UDP payload bytes this client received on them, likewise.
    pub udp_rx_bytes: u64,
    /// QUIC connections the session ran over (`--connections`); `rtt_ms`,
    /// `mtu`, `peak_bps` and the start-up figures are the first one's.
    pub connections: usize,
    /// Each connection's share, the first (the control stream's) first.
    pub per_connection: Vec<ConnUse>,
    /// UDP payload size this client's datagrams settled on (MTU discovery).
    /// A get's client sends only ACKs and small control frames and does not probe,
    /// so on a get it stays at quinn's 1,200; the data's size is the server's.
    pub mtu: u16,
    /// The controller named for the sending side, as
    /// [`CcChoice::name`](crate::CcChoice::name) spells it: `--cc`,
    /// `wan:RATE` from the rate memory, else this client's default. On a get
    /// without either, the server runs its own default, which may differ from
    /// the one named here.
    pub cc: String,
    /// Data streams the sender used: on a get the count in the server's
    /// `Welcome`, on a put this client's `--streams`, else
    /// [`DEFAULT_STREAMS`](crate::DEFAULT_STREAMS).
    pub streams: usize,
    /// Seconds during which the receiving side (this client on a get, the
    /// server on a put, from its `Done`) read no data because it was behind
    /// (its disk or CPU had not yet dealt with what came): the transfer went
    /// at the destination's pace, not the network's.
    pub receiver_behind_s: f64,
    /// Seconds from the call until file data first came in (get) or went
    /// out (put): the handshake and the request's round trips. None when no
    /// file data moved.
    pub first_data_s: Option<f64>,
    /// Whether the request rode in the first flight: `accepted` (a ticket
    /// from an earlier run with this server, 0-RTT), `refused` (the server
    /// refused the ticket: the request went again after the handshake) or
    /// `none` (no ticket held).
    pub zero_rtt: ZeroRtt,
    /// A put's files went in its first flight with the request, before the
    /// server's answer (a known server, targets not put there lately:
    /// docs/PROTOCOL.md, "A put's files in the first flight").
    pub early_files: bool,
    /// The rate over the second half of the data phase, Mbit/s of UDP
    /// payload received (get) or sent and not lost (put); None when the
    /// data phase was shorter than four windows (see `to_90pct_s`).
    pub final_mbps: Option<f64>,
    /// Seconds from the first data until the rate over a window (one round
    /// trip, at least 100 ms) first reached 90 % of `final_mbps`, at the
    /// window's end: the start-up. None with `final_mbps`.
    pub to_90pct_s: Option<f64>,
    /// Bytes of tail-repair symbols (RaptorQ, in QUIC datagrams) this
    /// client received (get) or sent (put): the last window's protection
    /// against a round trip for its lost packets.
    pub repair_bytes: u64,
    /// Data streams this client (get) rebuilt from repair symbols instead
    /// of waiting for QUIC to resend what was lost (0 on a put: the server
    /// rebuilds).
    pub rebuilt_streams: u64,
    /// On a get: seconds from the last new data of the transfer's last
    /// window (its protected streams) until all of it was there: what the
    /// last packets' losses cost. None on a put, or when no stream was
    /// protected.
    pub tail_s: Option<f64>,
    /// Sessions the transfer reconnected for after losing its connection
    /// (`--retry-for`); each resumed where the one before had got to.
    pub reconnects: u32,
    /// The outages it rode out, or the one it gave up on.
    pub outages: Vec<Outage>,
    /// FIFOs, sockets and device nodes not made at the destination, and
    /// why (`--specials`, `--devices`); made ones are in `totals.specials`.
    pub not_made: Vec<NotMade>,
    /// A dry run (`--dry-run`): nothing was written; `changes` is what a
    /// real run would do.
    pub dry_run: bool,
    /// On a get: items placed without their extended attributes or ACLs
    /// because the destination's file system keeps none.
    pub attrs_not_kept: u64,
    /// What the transfer removed at the destination (`--delete`), or in a
    /// dry run every change it would make, in the order made.
    pub changes: Vec<ChangeReport>,
    /// Files under way when a failed transfer ended, as far as they got
    /// (not counted in `files` or `totals`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsettled: Vec<FileReport>,
}

/// What one connection of a session carried.
#[derive(Debug, Clone, Serialize)]
pub struct ConnUse {
    /// UDP payload bytes this client sent on it.
    pub udp_tx_bytes: u64,
    /// UDP payload bytes this client received on it.
    pub udp_rx_bytes: u64,
    /// Bytes of its packets declared lost and sent again.
    pub retransmitted_bytes: u64,
    /// quinn's round-trip time estimate at the end, milliseconds.
    pub rtt_ms: f64,
    /// This client's datagram size on it (see [`ClientReport::mtu`]).
    pub mtu: u16,
}

/// Sums over a [`ClientReport`]'s files, with the session's directory and
/// symlink counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    /// Files reported, whatever their status.
    pub files: u64,
    /// Files verified and placed.
    pub verified: u64,
    /// Files skipped as already at the destination.
    pub skipped: u64,
    /// A shard's parts of files received and checked, the files named by
    /// the shard that completes them (`--shard`).
    pub slices: u64,
    /// A shard: files other shards move (`--shard`).
    pub other_shards: u64,
    /// Files that failed.
    pub failed: u64,
    /// Directory entries in the manifest, the roots included.
    pub dirs: u64,
    /// Symlink entries in the manifest.
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes made at the destination.
    pub specials: u64,
    /// Hard links: names of a file sent once and linked to it at the
    /// destination (made on a get, sent on a put).
    pub hardlinks: u64,
    /// Sum of the files' sizes in bytes, whatever their status.
    pub bytes: u64,
    /// File payload bytes that crossed the network in this run.
    pub bytes_transferred: u64,
    /// File bytes already held from an interrupted run, not sent again.
    pub bytes_resumed: u64,
    /// Bytes of the files skipped as already at the destination.
    pub bytes_skipped: u64,
    /// A dry run: files that would be sent.
    pub would_send: u64,
    /// A dry run: the bytes of those files.
    pub bytes_would_send: u64,
    /// Paths removed at the destination (`--delete`), or that would be in a
    /// dry run.
    pub deleted: u64,
}

impl ClientReport {
    /// Exit status: 0 only when everything arrived and verified.
    pub fn exit_code(&self) -> i32 {
        self.problems
            .iter()
            .map(|p| p.kind)
            .max()
            .map_or(0, Kind::exit_code)
    }
}

/// Whether a connection's request rode in its first flight (0-RTT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ZeroRtt {
    /// The request came after the handshake: no ticket from this server was
    /// held (first contact, `--ssh`, or the ones held were used or
    /// expired), or the session runs over several connections.
    #[default]
    None,
    /// The server took the request from the first flight.
    Accepted,
    /// A ticket was offered and the server refused it (it restarted, or
    /// the ticket was spent); the request was sent again after the
    /// handshake.
    Refused,
}

/// One outage a transfer rode out (or gave up on), for `--json`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Outage {
    /// Seconds from the start of the run until the connection was found
    /// lost (the path had been silent for up to the idle timeout before).
    pub lost_at_s: f64,
    /// Seconds from then until a new session was welcomed; None when the
    /// transfer gave up.
    pub down_s: Option<f64>,
    /// Connections tried meanwhile.
    pub attempts: u32,
    /// Why the connection was lost.
    pub cause: String,
}
