//! What a receiver asks for, given what it already has.

use crate::chunk::Digest;
use crate::manifest::Entry;

/// How files already present at the destination are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// Always transfer (`--overwrite`; a partial with a matching journal is
    /// still resumed).
    Always,
    /// Skip files whose size and mtime match (rsync's quick check): the default.
    #[default]
    SizeMtime,
    /// Skip files whose BLAKE3 matches.
    Checksum,
}

/// What the destination holds under the target name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    /// Size in bytes of the file at the destination.
    pub size: u64,
    /// Its modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
}

/// Mtimes are compared at one-second precision when either side lacks sub-second
/// times (some filesystems and tools truncate), exactly otherwise.
pub fn same_mtime(a: i64, b: i64) -> bool {
    if a == b {
        return true;
    }
    let whole = |t: i64| t.rem_euclid(1_000_000_000) == 0;
    (whole(a) || whole(b)) && a.div_euclid(1_000_000_000) == b.div_euclid(1_000_000_000)
}

/// The receiver's wish for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Already there: nothing to send.
    Skip,
    /// Send every chunk.
    All,
    /// Send these chunk ranges `[start, end)`; the rest is in the journal.
    Chunks(Vec<(u64, u64)>),
    /// Send everything unless the sender's hash equals this one.
    UnlessHash(Digest),
}

/// Decide from the sync mode and the target's metadata. `Checksum` needs the local
/// hash, which the caller computes only when sizes match (`needs_local_hash`).
pub fn decide(
    mode: SyncMode,
    entry: &Entry,
    existing: Option<&Existing>,
    local_hash: Option<Digest>,
) -> Decision {
    match (mode, existing) {
        (SyncMode::SizeMtime, Some(e))
            if e.size == entry.size && same_mtime(e.mtime_ns, entry.mtime_ns) =>
        {
            Decision::Skip
        }
        (SyncMode::Checksum, Some(e)) if e.size == entry.size => match local_hash {
            Some(h) => Decision::UnlessHash(h),
            None => Decision::All,
        },
        _ => Decision::All,
    }
}

/// Does [`decide`] want the destination file's BLAKE3 for `entry`? Only in
/// `Checksum` mode, when a regular file of the same size is there.
pub fn needs_local_hash(mode: SyncMode, entry: &Entry, existing: Option<&Existing>) -> bool {
    mode == SyncMode::Checksum && existing.is_some_and(|e| e.size == entry.size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::EntryKind;

    fn file(size: u64, mtime_ns: i64) -> Entry {
        Entry {
            id: 1,
            root: 0,
            path: b"f".to_vec(),
            kind: EntryKind::File,
            size,
            mode: 0o644,
            mtime_ns,
            link: vec![],
            owner: Default::default(),
            xattrs: vec![],
            allocated: 0,
        }
    }

    #[test]
    fn decisions() {
        let e = file(10, 5_000_000_123);
        let same = Existing {
            size: 10,
            mtime_ns: 5_000_000_123,
            mode: 0o644,
        };
        let truncated = Existing {
            size: 10,
            mtime_ns: 5_000_000_000,
            mode: 0o644,
        };
        let newer = Existing {
            size: 10,
            mtime_ns: 6_000_000_000,
            mode: 0o644,
        };
        let bigger = Existing {
            size: 11,
            mtime_ns: 5_000_000_123,
            mode: 0o644,
        };
        assert_eq!(
            decide(SyncMode::SizeMtime, &e, Some(&same), None),
            Decision::Skip
        );
        assert_eq!(
            decide(SyncMode::SizeMtime, &e, Some(&truncated), None),
            Decision::Skip
        );
        assert_eq!(
            decide(SyncMode::SizeMtime, &e, Some(&newer), None),
            Decision::All
        );
        assert_eq!(
            decide(SyncMode::SizeMtime, &e, Some(&bigger), None),
            Decision::All
        );
        assert_eq!(
            decide(SyncMode::Always, &e, Some(&same), None),
            Decision::All
        );
        assert!(needs_local_hash(SyncMode::Checksum, &e, Some(&newer)));
        assert!(!needs_local_hash(SyncMode::Checksum, &e, Some(&bigger)));
        assert_eq!(
            decide(SyncMode::Checksum, &e, Some(&newer), Some([9; 32])),
            Decision::UnlessHash([9; 32])
        );
        assert_eq!(decide(SyncMode::Checksum, &e, None, None), Decision::All);
    }
}
