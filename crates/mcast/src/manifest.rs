//! The session's manifest (object 0): every entry with its metadata and, for
//! files, the BLAKE3 the receiver checks before a file takes its final name.
//! Files' bytes follow in the data object in manifest order.

use longhaul_transfer::{EntryKind, RelPath};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// One manifest entry: a file, a directory, a symbolic link, or another
/// name of a file listed before it (`HardLink`, `link` that file's path;
/// version 3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// Relative to the receiver's destination; never empty, validated on receipt.
    pub path: Vec<u8>,
    /// File, directory or symbolic link; only files have bytes in the data object.
    pub kind: EntryKind,
    /// A file's length in bytes; 0 for the other kinds (checked on receipt).
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`), given to files and directories when placed.
    pub mode: u32,
    /// Modification time in nanoseconds since the Unix epoch, given to each placed entry.
    pub mtime_ns: i64,
    /// A symbolic link's target bytes (empty for the other kinds).
    pub link: Vec<u8>,
    /// BLAKE3 of a file's bytes (zero for other kinds).
    pub hash: [u8; 32],
}

/// The manifest object: every entry of the session, in order (postcard-encoded).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Manifest {
    /// The entries; files' bytes follow one another in the data object in this order.
    pub items: Vec<Item>,
}

/// A file's place in the data object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpan {
    /// Index into `Manifest::items`.
    pub item: usize,
    /// Where the file's first byte lies in the data object.
    pub offset: u64,
    /// The file's length in bytes.
    pub len: u64,
}

impl Manifest {
    /// The manifest object's bytes (postcard), as sent and as [`Manifest::decode`] reads them.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("postcard encode")
    }

    /// Decode and validate a received manifest against the announced data length:
    /// every path is a valid relative path, unique, and beneath no file or link;
    /// file sizes add up to `data_len`.
    pub fn decode(bytes: &[u8], data_len: u64) -> Result<Manifest, String> {
        let m: Manifest = match postcard::take_from_bytes(bytes) {
            Ok((m, [])) => m,
            _ => return Err("malformed manifest".into()),
        };
        let mut seen = HashSet::new();
        let mut leaves = HashSet::new();
        let mut files = HashSet::new();
        let mut total: u64 = 0;
        for it in &m.items {
            let p = RelPath::from_wire(&it.path).map_err(|e| {
                format!("manifest path {:?}: {e}", String::from_utf8_lossy(&it.path))
            })?;
            if p.is_root() {
                return Err("manifest entry with an empty path".into());
            }
            if !seen.insert(it.path.clone()) {
                return Err(format!("manifest names {} twice", p.display()));
            }
            if it.kind != EntryKind::Dir {
                leaves.insert(it.path.clone());
            }
            if it.kind == EntryKind::HardLink && !files.contains(&it.link) {
                return Err(format!(
                    "{}: a hard link to a name that is not a file listed before it",
                    p.display()
                ));
            }
            if it.kind.is_special() {
                return Err(format!(
                    "{}: a {} is not sent by multicast",
                    p.display(),
                    it.kind.name()
                ));
            }
            if it.kind == EntryKind::File {
                files.insert(it.path.clone());
                total = total
                    .checked_add(it.size)
                    .ok_or("manifest file sizes overflow")?;
            } else if it.size != 0 {
                return Err(format!("{}: only files have a size", p.display()));
            }
        }
        if total != data_len {
            return Err(format!(
                "manifest files hold {total} bytes, the session announced {data_len}"
            ));
        }
        // Nothing may sit beneath a file or a symlink.
        for it in &m.items {
            let mut p = RelPath::from_wire(&it.path).expect("checked");
            while let Some(parent) = p.parent() {
                if parent.is_root() {
                    break;
                }
                if leaves.contains(parent.as_bytes()) {
                    return Err(format!(
                        "{} lies beneath a file or link",
                        RelPath::from_wire(&it.path).expect("checked").display()
                    ));
                }
                p = parent;
            }
        }
        Ok(m)
    }

    /// Files in data-object order with their offsets.
    pub fn spans(&self) -> Vec<FileSpan> {
        let mut off = 0;
        let mut v = Vec::new();
        for (i, it) in self.items.iter().enumerate() {
            if it.kind == EntryKind::File {
                v.push(FileSpan {
                    item: i,
                    offset: off,
                    len: it.size,
                });
                off += it.size;
            }
        }
        v
    }

    /// Bytes of the data object: every file's size added up.
    pub fn data_len(&self) -> u64 {
        self.items
            .iter()
            .filter(|i| i.kind == EntryKind::File)
            .map(|i| i.size)
            .sum()
    }

    /// Number of files (directories and links not counted).
    pub fn files(&self) -> usize {
        self.items
            .iter()
            .filter(|i| i.kind == EntryKind::File)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(p: &str, size: u64) -> Item {
        Item {
            path: p.as_bytes().to_vec(),
            kind: EntryKind::File,
            size,
            mode: 0o644,
            mtime_ns: 1,
            link: vec![],
            hash: [0; 32],
        }
    }

    #[test]
    fn spans_follow_manifest_order() {
        let mut dir = file("d", 0);
        dir.kind = EntryKind::Dir;
        let m = Manifest {
            items: vec![dir, file("d/a", 5), file("d/b", 0), file("c", 7)],
        };
        let b = m.encode();
        let back = Manifest::decode(&b, 12).unwrap();
        assert_eq!(back, m);
        let s = back.spans();
        assert_eq!(
            s.iter()
                .map(|s| (s.item, s.offset, s.len))
                .collect::<Vec<_>>(),
            vec![(1, 0, 5), (2, 5, 0), (3, 5, 7)]
        );
    }

    #[test]
    fn hostile_manifests_are_refused() {
        let check =
            |items: Vec<Item>, len: u64| Manifest::decode(&Manifest { items }.encode(), len);
        assert!(check(vec![file("../etc/passwd", 1)], 1).is_err());
        assert!(check(vec![file("/etc/passwd", 1)], 1).is_err());
        assert!(check(vec![file("", 1)], 1).is_err());
        assert!(check(vec![file("a", 1), file("a", 1)], 2)
            .unwrap_err()
            .contains("twice"));
        assert!(check(vec![file("a", 1), file("a/b", 1)], 2)
            .unwrap_err()
            .contains("beneath"));
        // A hard link names a file listed before it, nothing else.
        let hard = |to: &str| Item {
            kind: EntryKind::HardLink,
            link: to.as_bytes().to_vec(),
            ..file("h", 0)
        };
        assert!(check(vec![file("a", 1), hard("a")], 1).is_ok());
        for (items, len) in [
            (vec![hard("a"), file("a", 1)], 1),
            (vec![file("a", 1), hard("b")], 1),
            (vec![file("a", 1), hard("../x")], 1),
        ] {
            assert!(check(items, len).unwrap_err().contains("hard link"));
        }
        let mut l = file("l", 0);
        l.kind = EntryKind::Symlink;
        l.link = b"/etc".to_vec();
        assert!(check(vec![l, file("l/passwd", 1)], 1)
            .unwrap_err()
            .contains("beneath"));
        assert!(check(vec![file("a", 5)], 6)
            .unwrap_err()
            .contains("announced 6"));
        assert!(check(vec![file("a", u64::MAX), file("b", 2)], 1).is_err());
        assert_eq!(
            Manifest::decode(b"\xff\xff", 0),
            Err("malformed manifest".into())
        );
    }
}
