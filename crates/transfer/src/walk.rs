//! A streaming walk of a tree inside a cap-std root. Nothing is followed: symlinks
//! are reported as links, directories are opened with O_NOFOLLOW, and cap-std keeps
//! every lookup beneath the root. Items come in pre-order (a directory before its
//! contents), names sorted bytewise, one directory listing in memory per level.

use crate::manifest::EntryKind;
use crate::path::RelPath;
use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, Metadata, MetadataExt};
use std::io;
use std::os::unix::ffi::OsStrExt;

/// One item found by the walk; `path` is relative to where the walk started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkItem {
    /// Path relative to where the walk started (the root for the start itself).
    pub path: RelPath,
    /// File, directory or symlink; other file types are left out of the walk.
    pub kind: EntryKind,
    /// Size in bytes for a regular file, 0 otherwise.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time (of the link itself for a symlink), nanoseconds since the
    /// Unix epoch.
    pub mtime_ns: i64,
    /// A symlink's target as raw bytes; empty otherwise.
    pub link: Vec<u8>,
}

/// A failure to read part of the tree; the walk goes on with the rest.
#[derive(Debug)]
pub struct WalkError {
    /// The item that could not be read, or the directory holding an entry whose path
    /// could not be formed (too long, say).
    pub path: RelPath,
    /// The underlying error (`InvalidData` when the path could not be formed).
    pub error: io::Error,
}

impl std::fmt::Display for WalkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.error)
    }
}

struct Level {
    dir: Dir,
    prefix: RelPath,
    names: std::vec::IntoIter<Vec<u8>>,
}

/// An iterator over the items beneath a start point, pre-order with names sorted; a
/// part that cannot be read yields a [`WalkError`] and the walk goes on.
pub struct Walker {
    first: Option<Result<WalkItem, WalkError>>,
    stack: Vec<Level>,
}

fn kind_of(meta: &Metadata) -> Option<EntryKind> {
    let ft = meta.file_type();
    if ft.is_file() {
        Some(EntryKind::File)
    } else if ft.is_dir() {
        Some(EntryKind::Dir)
    } else if ft.is_symlink() {
        Some(EntryKind::Symlink)
    } else {
        None
    }
}

/// A file's mtime, nanoseconds since the Unix epoch.
pub(crate) fn mtime_of(meta: &Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

fn item(dir: &Dir, name: &std::path::Path, path: RelPath) -> io::Result<Option<WalkItem>> {
    let meta = dir.symlink_metadata(name)?;
    let Some(kind) = kind_of(&meta) else {
        return Ok(None); // sockets, fifos, devices are not transferred
    };
    let link = if kind == EntryKind::Symlink {
        dir.read_link_contents(name)?
            .as_os_str()
            .as_bytes()
            .to_vec()
    } else {
        Vec::new()
    };
    Ok(Some(WalkItem {
        path,
        kind,
        size: if kind == EntryKind::File {
            meta.len()
        } else {
            0
        },
        mode: meta.mode() & 0o7777,
        mtime_ns: mtime_of(&meta),
        link,
    }))
}

/// The names in `dir`, sorted, without longhaul's own part, journal and link
/// files ([`crate::place::is_reserved_name`]): a tree that holds an
/// interrupted transfer sends what it holds, not the pieces.
fn list(dir: &Dir) -> io::Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    for e in dir.entries()? {
        let name = e?.file_name().as_bytes().to_vec();
        if !crate::place::is_reserved_name(&name) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

impl Walker {
    /// Start at `start` (relative to `root`; the root itself when empty). Fails if
    /// `start` does not exist or is not reachable inside the root.
    pub fn new(root: &Dir, start: &RelPath) -> io::Result<Walker> {
        let first = match item(root, start.as_path(), RelPath::root())? {
            Some(it) => it,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "not a regular file, directory or symlink",
                ))
            }
        };
        let mut stack = Vec::new();
        if first.kind == EntryKind::Dir {
            let dir = if start.is_root() {
                root.try_clone()?
            } else {
                root.open_dir_nofollow(start.as_path())?
            };
            let names = list(&dir)?;
            stack.push(Level {
                dir,
                prefix: RelPath::root(),
                names: names.into_iter(),
            });
        }
        Ok(Walker {
            first: Some(Ok(first)),
            stack,
        })
    }
}

impl Iterator for Walker {
    type Item = Result<WalkItem, WalkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(f) = self.first.take() {
            return Some(f);
        }
        loop {
            let level = self.stack.last_mut()?;
            let Some(name) = level.names.next() else {
                self.stack.pop();
                continue;
            };
            let path = match level.prefix.join_name(&name) {
                Ok(p) => p,
                Err(e) => {
                    return Some(Err(WalkError {
                        path: level.prefix.clone(),
                        error: io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
                    }))
                }
            };
            let os = std::ffi::OsStr::from_bytes(&name);
            let it = match item(&level.dir, os.as_ref(), path.clone()) {
                Ok(Some(it)) => it,
                Ok(None) => continue,
                Err(error) => return Some(Err(WalkError { path, error })),
            };
            if it.kind == EntryKind::Dir {
                let opened = level
                    .dir
                    .open_dir_nofollow(os)
                    .and_then(|d| list(&d).map(|n| (d, n)));
                match opened {
                    Ok((dir, names)) => self.stack.push(Level {
                        dir,
                        prefix: path,
                        names: names.into_iter(),
                    }),
                    Err(error) => return Some(Err(WalkError { path, error })),
                }
            }
            return Some(Ok(it));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cap_std::ambient_authority;

    #[test]
    fn walks_preorder_without_following_links() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        std::fs::create_dir_all(p.join("root/b/c")).unwrap();
        std::fs::write(p.join("root/a"), b"hello").unwrap();
        std::fs::write(p.join("root/b/c/d"), b"").unwrap();
        // An interrupted transfer's pieces are not walked.
        std::fs::write(p.join("root/b/.d.lh-part"), b"half").unwrap();
        std::fs::write(p.join("root/b/.d.lh-journal"), b"j").unwrap();
        std::fs::write(p.join("outside"), b"secret").unwrap();
        std::os::unix::fs::symlink("../outside", p.join("root/b/esc")).unwrap();
        std::os::unix::fs::symlink("/", p.join("root/b/slash")).unwrap();
        let root = Dir::open_ambient_dir(p.join("root"), ambient_authority()).unwrap();
        let items: Vec<_> = Walker::new(&root, &RelPath::root())
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let got: Vec<_> = items
            .iter()
            .map(|i| (i.path.display(), i.kind, i.size))
            .collect();
        assert_eq!(
            got,
            vec![
                (".".into(), EntryKind::Dir, 0),
                ("a".into(), EntryKind::File, 5),
                ("b".into(), EntryKind::Dir, 0),
                ("b/c".into(), EntryKind::Dir, 0),
                ("b/c/d".into(), EntryKind::File, 0),
                ("b/esc".into(), EntryKind::Symlink, 0),
                ("b/slash".into(), EntryKind::Symlink, 0),
            ]
        );
        assert_eq!(items[5].link, b"../outside");
        // Starting through an escaping link is refused by cap-std.
        assert!(Walker::new(&root, &RelPath::from_wire(b"b/esc/x").unwrap()).is_err());
        assert!(Walker::new(&root, &RelPath::from_wire(b"b/slash/etc").unwrap()).is_err());
        assert!(Walker::new(&root, &RelPath::from_wire(b"nope").unwrap()).is_err());
    }
}
