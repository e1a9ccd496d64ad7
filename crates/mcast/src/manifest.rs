//! The session's manifest (object 0): every entry with its metadata and, for
//! files, the BLAKE3 the receiver checks before a file takes its final name.
//! Files' bytes follow in the data object in manifest order.

use longhaul_transfer::meta::{Owner, Xattr};
use longhaul_transfer::{EntryKind, RelPath};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// At most this many data extents in one sparse file (a file with more is
/// sent whole; a manifest with more is refused).
pub const MAX_EXTENTS: usize = 4096;

/// At most this many bytes of extended attributes (names and values) on one
/// entry, as Linux allows on most file systems.
pub const MAX_XATTR_BYTES: usize = 64 * 1024;

/// One manifest entry: a file, a directory, a symbolic link, or another
/// name of a file listed before it (`HardLink`, `link` that file's path;
/// version 3). Version 4 adds a sparse file's data extents, the owner and
/// the extended attributes.
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
    /// A sparse file's data: (offset, length) of each extent, in order and
    /// apart; the rest of the file is holes, which the data object does not
    /// carry and the receiver leaves as holes. None: all of the file.
    pub extents: Option<Vec<(u64, u64)>>,
    /// The owner and group at the sender (None: not sent).
    pub owner: Option<Owner>,
    /// Extended attributes (`--xattrs`, `--acls`), sorted by name.
    pub xattrs: Vec<Xattr>,
}

impl Item {
    /// The bytes of this entry in the data object: a file's data extents
    /// (all of it when not sparse); 0 for the other kinds.
    pub fn stored(&self) -> u64 {
        match (&self.extents, self.kind) {
            (_, k) if k != EntryKind::File => 0,
            (Some(x), _) => x.iter().map(|&(_, n)| n).sum(),
            (None, _) => self.size,
        }
    }

    /// Where this file's bytes lie in the file: (offset, length) of each
    /// piece the data object carries, in order.
    pub fn pieces(&self) -> Vec<(u64, u64)> {
        match &self.extents {
            Some(x) => x.clone(),
            None if self.size > 0 => vec![(0, self.size)],
            None => Vec::new(),
        }
    }

    /// Extents in order, apart, not empty and within the file; attributes
    /// within [`MAX_XATTR_BYTES`].
    fn check_shape(&self) -> Result<(), String> {
        if let Some(x) = &self.extents {
            if self.kind != EntryKind::File {
                return Err("only files have extents".into());
            }
            if x.len() > MAX_EXTENTS {
                return Err(format!("{} extents, more than {MAX_EXTENTS}", x.len()));
            }
            let mut end = 0u64;
            for (i, &(at, n)) in x.iter().enumerate() {
                let last = at.checked_add(n).ok_or("an extent past the file's end")?;
                if n == 0 || (i > 0 && at <= end) || last > self.size {
                    return Err("extents out of order, empty or past the file's end".into());
                }
                end = last;
            }
        }
        let bytes: usize = self
            .xattrs
            .iter()
            .map(|x| x.name.len() + x.value.len())
            .sum();
        if bytes > MAX_XATTR_BYTES {
            return Err(format!(
                "{bytes} bytes of extended attributes, more than {MAX_XATTR_BYTES}"
            ));
        }
        if self
            .xattrs
            .iter()
            .any(|x| x.name.is_empty() || x.name.contains(&0))
        {
            return Err("an extended attribute without a name".into());
        }
        Ok(())
    }
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
    /// The file's bytes in the data object (its data extents, when sparse).
    pub len: u64,
}

/// A piece of a file in the data object ([`Manifest::segments`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Index into `Manifest::items`.
    pub item: usize,
    /// Where its first byte lies in the data object.
    pub obj: u64,
    /// Where it lies in the file.
    pub at: u64,
    /// Its length in bytes.
    pub len: u64,
}

impl Manifest {
    /// The manifest object's bytes (postcard), as sent and as [`Manifest::decode`] reads them.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("postcard encode")
    }

    /// Decode and validate a received manifest against the announced data length:
    /// every path is a valid relative path, unique, and beneath no file or link;
    /// extents in order and within their files; files' stored bytes add up to
    /// `data_len`.
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
            it.check_shape()
                .map_err(|e| format!("{}: {e}", p.display()))?;
            if it.kind == EntryKind::File {
                files.insert(it.path.clone());
                total = total
                    .checked_add(it.stored())
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
                let len = it.stored();
                v.push(FileSpan {
                    item: i,
                    offset: off,
                    len,
                });
                off += len;
            }
        }
        v
    }

    /// Bytes of the data object: every file's stored bytes added up.
    pub fn data_len(&self) -> u64 {
        self.items.iter().map(Item::stored).sum()
    }

    /// Every file's pieces in data-object order: (index into `items`, offset
    /// in the data object, offset in the file, length).
    pub fn segments(&self) -> Vec<Segment> {
        let mut obj = 0;
        let mut v = Vec::new();
        for (i, it) in self.items.iter().enumerate() {
            if it.kind != EntryKind::File {
                continue;
            }
            for (at, len) in it.pieces() {
                v.push(Segment {
                    item: i,
                    obj,
                    at,
                    len,
                });
                obj += len;
            }
        }
        v
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
            extents: None,
            owner: None,
            xattrs: vec![],
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
        // Extents in order, apart, within the file, of files only.
        let sparse = |x: Vec<(u64, u64)>| Item {
            extents: Some(x),
            ..file("s", 100)
        };
        for x in [
            vec![(10, 5), (12, 5)],
            vec![(10, 5), (15, 5)],
            vec![(20, 5), (10, 5)],
            vec![(10, 0)],
            vec![(90, 11)],
            vec![(u64::MAX, 2)],
        ] {
            let e = check(vec![sparse(x.clone())], x.iter().map(|e| e.1).sum()).unwrap_err();
            assert!(e.contains("extent"), "{x:?}: {e}");
        }
        let many = (0..=MAX_EXTENTS as u64).map(|i| (i * 2, 1)).collect();
        let e = check(
            vec![Item {
                size: 1 << 20,
                ..sparse(many)
            }],
            MAX_EXTENTS as u64 + 1,
        )
        .unwrap_err();
        assert!(e.contains("more than"), "{e}");
        let mut d = sparse(vec![(0, 1)]);
        d.kind = EntryKind::Dir;
        d.size = 0;
        assert!(check(vec![d], 0).unwrap_err().contains("only files"));
        // The data object holds a sparse file's extents only.
        assert!(check(vec![sparse(vec![(10, 5), (50, 7)])], 100).is_err());
        assert!(check(vec![sparse(vec![(10, 5), (50, 7)])], 12).is_ok());
        let big = Item {
            xattrs: vec![Xattr {
                name: b"user.big".to_vec(),
                value: vec![7; MAX_XATTR_BYTES],
            }],
            ..file("x", 1)
        };
        assert!(check(vec![big], 1)
            .unwrap_err()
            .contains("extended attributes"));
    }

    #[test]
    fn segments_place_a_sparse_files_extents_in_the_data_object() {
        let m = Manifest {
            items: vec![
                file("a", 3),
                Item {
                    extents: Some(vec![(4096, 10), (1 << 30, 6)]),
                    ..file("s", 2 << 30)
                },
                Item {
                    extents: Some(vec![]),
                    ..file("hole", 1 << 20)
                },
                file("b", 2),
            ],
        };
        assert_eq!(m.data_len(), 3 + 16 + 2);
        let seg = |item, obj, at, len| Segment { item, obj, at, len };
        assert_eq!(
            m.segments(),
            vec![
                seg(0, 0, 0, 3),
                seg(1, 3, 4096, 10),
                seg(1, 13, 1 << 30, 6),
                seg(3, 19, 0, 2)
            ]
        );
        let spans: Vec<_> = m.spans().iter().map(|s| (s.offset, s.len)).collect();
        assert_eq!(spans, vec![(0, 3), (3, 16), (19, 0), (19, 2)]);
        assert_eq!(Manifest::decode(&m.encode(), 21).unwrap(), m);
    }
}
