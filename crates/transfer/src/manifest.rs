//! What a sender announces: one [`Entry`] per file, directory or symlink.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
}

/// One item of a file set. `path` is relative to the request's root (empty = the
/// requested item itself) and is validated by the receiver with `RelPath::from_wire`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Session-unique id the data records refer to.
    pub id: u64,
    /// Which requested root (index into the request's paths) this belongs to.
    pub root: u32,
    pub path: Vec<u8>,
    pub kind: EntryKind,
    /// Bytes for files, 0 otherwise.
    pub size: u64,
    /// Permission bits (the low 12 bits of st_mode).
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Target of a symlink, as raw bytes; empty otherwise.
    pub link: Vec<u8>,
}

impl Entry {
    pub fn is_file(&self) -> bool {
        self.kind == EntryKind::File
    }
}

/// Nanoseconds since the epoch of a `SystemTime` (negative before 1970).
pub fn system_time_ns(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

pub fn ns_to_system_time(ns: i64) -> std::time::SystemTime {
    use std::time::{Duration, UNIX_EPOCH};
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}
