//! What a session reports: per-file outcomes, problems with their kind (which maps
//! onto the exit status), and live progress counters for a progress bar.

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
