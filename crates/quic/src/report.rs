//! What a session reports: per-file outcomes, problems with their kind (which maps
//! onto the exit status), and live progress counters for a progress bar.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Class of a failure, each with its own exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
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
            _ => Kind::Remote,
        }
    }

    /// Exit status (documented in the README and `--help`).
    pub fn exit_code(self) -> i32 {
        match self {
            Kind::Connection => 3,
            Kind::Remote => 4,
            Kind::LocalIo => 5,
            Kind::Verify => 6,
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    pub kind: Kind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub message: String,
    /// A frame that did not decode as ours was a Hello of this other
    /// protocol version (a server reading its first frame answers
    /// `Fatal { Version }`).
    #[serde(skip)]
    pub peer_version: Option<u32>,
}

impl Problem {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Problem {
            kind,
            path: None,
            message: message.into(),
            peer_version: None,
        }
    }

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Verified,
    /// Already at the destination (size+mtime, or the same BLAKE3).
    Skipped,
    Failed,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    pub path: String,
    pub size: u64,
    pub status: Status,
    /// Payload bytes of this file that crossed the network in this run.
    pub bytes_transferred: u64,
    /// Bytes that were already held from an interrupted run.
    pub bytes_resumed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Outcome of one session on one side.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SessionReport {
    pub files: Vec<FileReport>,
    pub dirs: u64,
    pub symlinks: u64,
    pub problems: Vec<Problem>,
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
    pub files_total: AtomicU64,
    pub files_done: AtomicU64,
    pub bytes_total: AtomicU64,
    pub bytes_done: AtomicU64,
}

impl Progress {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
