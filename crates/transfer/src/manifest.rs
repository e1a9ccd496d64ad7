//! What a sender announces: one [`Entry`] per file, directory, symlink,
//! FIFO, socket or device node.

use serde::{Deserialize, Serialize};

/// What an [`Entry`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// A regular file: the only kind with data (`size` bytes, sent in chunks).
    File,
    /// A directory; it carries no data of its own.
    Dir,
    /// A symbolic link, never followed; its target is in [`Entry::link`].
    Symlink,
    /// A named pipe (FIFO); no data.
    Fifo,
    /// A Unix domain socket's name; no data (a receiver makes the name, not
    /// a listening socket).
    Socket,
    /// A character device node; its device number is in [`Entry::size`].
    CharDevice,
    /// A block device node; its device number is in [`Entry::size`].
    BlockDevice,
    /// Another name of a file sent earlier in the session under the same
    /// root (a hard link): [`Entry::link`] is that entry's path, `size` its
    /// size; no data crosses, the receiver links the name to that file.
    HardLink,
}

impl EntryKind {
    /// A FIFO, socket or device node: made by a receiver only when asked
    /// (`--specials`, `--devices`), else listed as not made.
    pub fn is_special(self) -> bool {
        self.is_device() || matches!(self, EntryKind::Fifo | EntryKind::Socket)
    }

    /// A character or block device node.
    pub fn is_device(self) -> bool {
        matches!(self, EntryKind::CharDevice | EntryKind::BlockDevice)
    }

    /// The kind as reports name it: `file`, `dir`, `symlink`, `fifo`,
    /// `socket`, `char device`, `block device`.
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            EntryKind::Fifo => "fifo",
            EntryKind::Socket => "socket",
            EntryKind::CharDevice => "char device",
            EntryKind::BlockDevice => "block device",
            EntryKind::HardLink => "hard link",
        }
    }
}

/// One item of a file set. `path` is relative to the request's root (empty = the
/// requested item itself) and is validated by the receiver with `RelPath::from_wire`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Session-unique id the data records refer to.
    pub id: u64,
    /// Which requested root (index into the request's paths) this belongs to.
    pub root: u32,
    /// Path beneath the root as raw Unix bytes, `/`-separated; empty for the root.
    pub path: Vec<u8>,
    /// File, directory or symlink: says which of `size` and `link` mean anything.
    pub kind: EntryKind,
    /// Bytes for files; a device node's device number (`st_rdev`); 0
    /// otherwise.
    pub size: u64,
    /// Permission bits (the low 12 bits of st_mode).
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Target of a symlink, as raw bytes; empty otherwise.
    pub link: Vec<u8>,
    /// Its owner and group (version 11).
    pub owner: Owner,
    /// Its extended attributes, when asked (`--xattrs`, `--acls`; version
    /// 11), sorted by name.
    pub xattrs: Vec<Xattr>,
    /// Bytes a file takes on the sender's disk (`st_blocks` × 512) when
    /// that is less than its size (a sparse file), else 0 (version 11): a
    /// receiver weighs whether it fits by this, not by its size.
    pub allocated: u64,
}

/// An item's owner and group: numbers, and the names they had at the
/// sender (empty when it has none for them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// `st_uid`.
    pub uid: u32,
    /// `st_gid`.
    pub gid: u32,
    /// The user's name at the sender.
    pub user: Vec<u8>,
    /// The group's name at the sender.
    pub group: Vec<u8>,
}

/// One extended attribute: its full name (`user.x`) and value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xattr {
    /// The namespaced name, e.g. `user.origin`.
    pub name: Vec<u8>,
    /// The value, raw.
    pub value: Vec<u8>,
}

impl Entry {
    /// Is this a regular file (the only kind with data)?
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

/// The `SystemTime` of nanoseconds since the epoch (negative before 1970); the
/// inverse of [`system_time_ns`].
pub fn ns_to_system_time(ns: i64) -> std::time::SystemTime {
    use std::time::{Duration, UNIX_EPOCH};
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}
