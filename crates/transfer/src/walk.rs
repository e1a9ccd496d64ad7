//! A streaming walk of a tree inside a cap-std root. Nothing is followed: symlinks
//! are reported as links, directories are opened with O_NOFOLLOW, and cap-std keeps
//! every lookup beneath the root. Items come in pre-order (a directory before its
//! contents), names sorted bytewise, one directory listing in memory per level.
//! Only the deepest [`OPEN_LEVELS`] levels keep their directory open: a level
//! above them is opened again (from the start, through no link, and checked to
//! be the same directory) when the walk comes back to it, so however deep the
//! tree, the walk holds a few descriptors.

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
    /// File, directory, symlink, FIFO, socket or device node.
    pub kind: EntryKind,
    /// Size in bytes for a regular file, the device number of a device
    /// node, 0 otherwise.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time (of the link itself for a symlink), nanoseconds since the
    /// Unix epoch.
    pub mtime_ns: i64,
    /// A symlink's target as raw bytes; empty otherwise.
    pub link: Vec<u8>,
    /// Device and inode: the same pair under two names is one file with
    /// two hard links.
    pub dev_ino: (u64, u64),
    /// Its link count (`st_nlink`).
    pub nlink: u64,
    /// Its owner and group (`st_uid`, `st_gid`).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// Bytes it takes on disk (`st_blocks` × 512).
    pub allocated: u64,
}

/// The files of several names a walk found, by device and inode: the name
/// each was first sent under. A sender sends such a file's data under that
/// name only, and each other name as a [`EntryKind::HardLink`] to it.
#[derive(Debug, Default)]
pub struct HardLinks(std::collections::HashMap<(u64, u64), Vec<u8>>);

impl HardLinks {
    /// Make `it` a hard link to the name its file was first sent under, if
    /// one came before; else, if it has several names, remember `name` (how
    /// it is named in what is sent) as its first.
    pub fn mark(&mut self, it: &mut WalkItem, name: &[u8]) {
        if it.kind != EntryKind::File || it.nlink <= 1 {
            return;
        }
        match self.0.get(&it.dev_ino) {
            Some(first) => {
                it.kind = EntryKind::HardLink;
                it.link = first.clone();
            }
            None => {
                self.0.insert(it.dev_ino, name.to_vec());
            }
        }
    }
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

/// Levels of the walk that keep their directory open; a deeper tree opens a
/// level above them again when the walk returns to it.
pub const OPEN_LEVELS: usize = 16;

struct Level {
    /// None when closed (more than [`OPEN_LEVELS`] levels below it).
    dir: Option<Dir>,
    /// Its name in the level above (empty for the start).
    name: Vec<u8>,
    /// Its device and inode, to know it again when reopened.
    id: (u64, u64),
    prefix: RelPath,
    names: std::vec::IntoIter<Vec<u8>>,
}

/// An iterator over the items beneath a start point, pre-order with names sorted; a
/// part that cannot be read yields a [`WalkError`] and the walk goes on.
pub struct Walker {
    first: Option<Result<WalkItem, WalkError>>,
    /// The root and the start, to open closed levels again.
    root: Dir,
    start: RelPath,
    stack: Vec<Level>,
    /// Rules that leave items out, and the name the start lands under
    /// (empty: its contents land at the destination).
    filter: Option<(std::sync::Arc<crate::filter::Filter>, Vec<u8>)>,
}

/// A directory's device and inode.
fn ident(d: &Dir) -> io::Result<(u64, u64)> {
    let m = d.dir_metadata()?;
    Ok((m.dev(), m.ino()))
}

pub(crate) fn kind_of(meta: &Metadata) -> Option<EntryKind> {
    use cap_std::fs::FileTypeExt;
    let ft = meta.file_type();
    if ft.is_file() {
        Some(EntryKind::File)
    } else if ft.is_dir() {
        Some(EntryKind::Dir)
    } else if ft.is_symlink() {
        Some(EntryKind::Symlink)
    } else if ft.is_fifo() {
        Some(EntryKind::Fifo)
    } else if ft.is_socket() {
        Some(EntryKind::Socket)
    } else if ft.is_char_device() {
        Some(EntryKind::CharDevice)
    } else if ft.is_block_device() {
        Some(EntryKind::BlockDevice)
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
        return Ok(None); // (no other kind exists on Linux)
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
        size: match kind {
            EntryKind::File => meta.len(),
            k if k.is_device() => meta.rdev(),
            _ => 0,
        },
        mode: meta.mode() & 0o7777,
        mtime_ns: mtime_of(&meta),
        link,
        dev_ino: (meta.dev(), meta.ino()),
        nlink: meta.nlink(),
        uid: meta.uid(),
        gid: meta.gid(),
        allocated: meta.blocks().saturating_mul(512),
    }))
}

/// The item at `start/path` beneath `root`, found as a walk from `start`
/// would find it (through no link: each directory on the way is opened
/// without following one), with `path` as its path; `None` when it is
/// not there. What a sender that was given a listing reads instead of
/// walking (a shard's, [`crate::shard`]).
pub fn item_at(root: &Dir, start: &RelPath, path: &RelPath) -> io::Result<Option<WalkItem>> {
    let full = start.join(path).map_err(io::Error::other)?;
    let Some(parent) = full.parent() else {
        return Ok(None);
    };
    let mut dir = root.try_clone()?;
    for c in parent.as_path().components() {
        dir = match dir.open_dir_nofollow(c) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
    }
    let name = std::path::Path::new(std::ffi::OsStr::from_bytes(full.file_name()));
    match item(&dir, name, path.clone()) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        r => r,
    }
}

/// Where the open file `file` of `size` bytes holds data, as SEEK_DATA and
/// SEEK_HOLE find it: (offset, length) of each extent, in order; the rest
/// is holes. None when its file system cannot say (it has data everywhere
/// then), or when it has more than `max` extents. It moves the file's
/// offset.
pub fn data_extents(
    file: &std::fs::File,
    size: u64,
    max: usize,
) -> io::Result<Option<Vec<(u64, u64)>>> {
    use std::os::fd::AsRawFd;
    let seek = |off: u64, whence: libc::c_int| {
        // SAFETY: lseek on a descriptor the caller holds.
        let r = unsafe { libc::lseek(file.as_raw_fd(), off as libc::off_t, whence) };
        match r < 0 {
            true => Err(io::Error::last_os_error()),
            false => Ok(r as u64),
        }
    };
    let mut out = Vec::new();
    let mut off = 0;
    while off < size {
        let data = match seek(off, libc::SEEK_DATA) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break, // holes to the end
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
            Err(e) => return Err(e),
        };
        if data >= size {
            break;
        }
        let hole = seek(data, libc::SEEK_HOLE)?.min(size);
        if hole <= data {
            return Ok(None); // (it changed meanwhile: sent whole)
        }
        out.push((data, hole - data));
        if out.len() > max {
            return Ok(None);
        }
        off = hole;
    }
    Ok(Some(out))
}

/// Bytes of directory entries read per `getdents64`: a directory of 20,000
/// names on tmpfs took 37 calls of at most 24 kB through cap-std's reader
/// and 4-8 ms before a server's first data could go; with 128 kB, 5 calls and
/// about half the time (the kernel's cost per call, not per name, halves).
const LIST_BUF: usize = 128 << 10;

/// The names in `dir`, sorted, without longhaul's own part, journal and link
/// files ([`crate::sibling::is_reserved_name`]): a tree that holds an
/// interrupted transfer sends what it holds, not the pieces.
fn list(dir: &Dir) -> io::Result<Vec<Vec<u8>>> {
    use rustix::fs::{Mode, OFlags};
    // The directory itself opened for reading (`dir` may be an O_PATH
    // handle), from its first entry.
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut buf = Vec::with_capacity(LIST_BUF);
    let mut entries = rustix::fs::RawDir::new(&fd, buf.spare_capacity_mut());
    let mut names = Vec::new();
    while let Some(e) = entries.next() {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name != b"." && name != b".." && !crate::sibling::is_reserved_name(name) {
            names.push(name.to_vec());
        }
    }
    // (Names in a directory are unique: no order among equals to keep.)
    names.sort_unstable();
    Ok(names)
}

/// Whether `filter` (and the name the start lands under) leaves `it` out.
fn left_out(
    filter: &Option<(std::sync::Arc<crate::filter::Filter>, Vec<u8>)>,
    it: &WalkItem,
) -> bool {
    let Some((filter, name)) = filter else {
        return false;
    };
    let mut landed = name.clone();
    if !it.path.is_root() {
        if !landed.is_empty() {
            landed.push(b'/');
        }
        landed.extend_from_slice(it.path.as_bytes());
    }
    filter.excludes(&landed, it.kind == EntryKind::Dir)
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
        let is_dir = first.kind == EntryKind::Dir;
        let mut w = Walker {
            first: Some(Ok(first)),
            root: root.try_clone()?,
            start: start.clone(),
            stack: Vec::new(),
            filter: None,
        };
        if is_dir {
            let dir = w.open_start()?;
            let names = list(&dir)?;
            w.push(dir, Vec::new(), RelPath::root(), names)?;
        }
        Ok(w)
    }

    /// The start's kind, before any item is taken.
    pub fn start_kind(&self) -> Option<EntryKind> {
        match &self.first {
            Some(Ok(it)) => Some(it.kind),
            _ => None,
        }
    }

    /// Leaves out what `filter` excludes, matched against each item's path
    /// as it lands (`name`, the start's name there, then the item's path
    /// beneath the start); a directory left out is not walked.
    pub fn filtered(
        mut self,
        filter: std::sync::Arc<crate::filter::Filter>,
        name: Vec<u8>,
    ) -> Walker {
        if filter.is_empty() {
            return self;
        }
        self.filter = Some((filter, name));
        if let Some(Ok(first)) = &self.first {
            if left_out(&self.filter, first) {
                self.first = None;
                self.stack.clear();
            }
        }
        self
    }

    fn open_start(&self) -> io::Result<Dir> {
        if self.start.is_root() {
            self.root.try_clone()
        } else {
            self.root.open_dir_nofollow(self.start.as_path())
        }
    }

    /// A level entered; the one [`OPEN_LEVELS`] above it is closed.
    fn push(
        &mut self,
        dir: Dir,
        name: Vec<u8>,
        prefix: RelPath,
        names: Vec<Vec<u8>>,
    ) -> io::Result<()> {
        let id = ident(&dir)?;
        self.stack.push(Level {
            dir: Some(dir),
            name,
            id,
            prefix,
            names: names.into_iter(),
        });
        if let Some(k) = self.stack.len().checked_sub(OPEN_LEVELS + 1) {
            self.stack[k].dir = None;
        }
        Ok(())
    }

    /// Opens the top level again: from the deepest level still open (or the
    /// start), one name at a time through no link, each checked to be the
    /// directory listed; the levels more than [`OPEN_LEVELS`] above the top
    /// are closed again on the way.
    fn reopen(&mut self) -> io::Result<()> {
        let top = self.stack.len() - 1;
        let mut i = match self.stack[..top].iter().rposition(|l| l.dir.is_some()) {
            Some(i) => i,
            None => {
                let d = self.open_start()?;
                same(&d, self.stack[0].id)?;
                self.stack[0].dir = Some(d);
                0
            }
        };
        while i < top {
            let parent = self.stack[i].dir.as_ref().expect("open");
            let name = std::ffi::OsStr::from_bytes(&self.stack[i + 1].name);
            let d = parent.open_dir_nofollow(name)?;
            same(&d, self.stack[i + 1].id)?;
            self.stack[i + 1].dir = Some(d);
            i += 1;
            if let Some(k) = i.checked_sub(OPEN_LEVELS) {
                self.stack[k].dir = None;
            }
        }
        Ok(())
    }
}

/// `d` is the directory the walk listed as `id`.
fn same(d: &Dir, id: (u64, u64)) -> io::Result<()> {
    if ident(d)? != id {
        return Err(io::Error::other(
            "the directory was replaced during the walk",
        ));
    }
    Ok(())
}

impl Iterator for Walker {
    type Item = Result<WalkItem, WalkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(f) = self.first.take() {
            return Some(f);
        }
        loop {
            if self.stack.last()?.dir.is_none() {
                if let Err(error) = self.reopen() {
                    let gone = self.stack.pop().expect("a level");
                    return Some(Err(WalkError {
                        path: gone.prefix,
                        error,
                    }));
                }
            }
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
            let dir = level.dir.as_ref().expect("the top level is open");
            let it = match item(dir, os.as_ref(), path.clone()) {
                Ok(Some(it)) => it,
                Ok(None) => continue,
                Err(error) => return Some(Err(WalkError { path, error })),
            };
            if left_out(&self.filter, &it) {
                continue;
            }
            if it.kind == EntryKind::Dir {
                let opened = dir
                    .open_dir_nofollow(os)
                    .and_then(|d| list(&d).map(|n| (d, n)));
                let pushed = opened.and_then(|(d, names)| self.push(d, name, path.clone(), names));
                if let Err(error) = pushed {
                    return Some(Err(WalkError { path, error }));
                }
            }
            return Some(Ok(it));
        }
    }
}

impl Walker {
    /// Levels whose directory is open now.
    #[cfg(test)]
    fn open_levels(&self) -> usize {
        self.stack.iter().filter(|l| l.dir.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cap_std::ambient_authority;

    #[test]
    fn an_item_at_a_path_is_what_the_walk_finds_and_no_link_leads_to_it() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        std::fs::create_dir_all(t.join("top/a/b")).unwrap();
        std::fs::write(t.join("top/a/b/f"), b"12345").unwrap();
        std::os::unix::fs::symlink("a", t.join("top/l")).unwrap();
        let root = Dir::open_ambient_dir(t, cap_std::ambient_authority()).unwrap();
        let start = RelPath::from_wire(b"top").unwrap();
        let rel = |p: &[u8]| RelPath::from_wire(p).unwrap();
        let walked: Vec<WalkItem> = Walker::new(&root, &start)
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let f = walked.iter().find(|i| i.path == rel(b"a/b/f")).unwrap();
        assert_eq!(
            item_at(&root, &start, &rel(b"a/b/f")).unwrap().as_ref(),
            Some(f)
        );
        assert_eq!(item_at(&root, &start, &rel(b"a/b/none")).unwrap(), None);
        assert_eq!(item_at(&root, &start, &rel(b"x/f")).unwrap(), None);
        // Through the link `l` -> `a`: refused, not followed.
        assert!(item_at(&root, &start, &rel(b"l/b/f")).is_err());
    }

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

    #[test]
    fn a_directory_longer_than_one_read_is_listed_whole_and_sorted_bytewise() {
        // 3,000 names of 60 bytes are about 250 kB of entries: two reads and
        // more of LIST_BUF, so the listing goes on where a read ended.
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("many");
        std::fs::create_dir(&d).unwrap();
        let mut want = Vec::new();
        for i in (0..3000u32).rev() {
            let name = format!("{:0>60}", i.wrapping_mul(2_654_435_761) % 1_000_003);
            std::fs::write(d.join(&name), b"").unwrap();
            want.push(name);
        }
        // Bytewise, not by locale or length: "Z" < "a" < "a.b" < "a0".
        for name in ["a", "Z", "a.b", "a0", "\u{e9}"] {
            std::fs::write(d.join(name), b"").unwrap();
            want.push(name.to_string());
        }
        std::fs::write(d.join(".x.lh-part"), b"half").unwrap();
        want.sort();
        want.dedup();
        let root = Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap();
        let got: Vec<String> = Walker::new(&root, &RelPath::from_wire(b"many").unwrap())
            .unwrap()
            .skip(1)
            .map(|r| String::from_utf8(r.unwrap().path.as_bytes().to_vec()).unwrap())
            .collect();
        assert_eq!(got.len(), want.len());
        assert_eq!(got, want);
    }

    #[test]
    fn a_deep_tree_is_walked_with_a_few_directories_open() {
        let t = tempfile::tempdir().unwrap();
        let depth = 200;
        let mut p = t.path().join("root");
        for i in 0..depth {
            p.push("d");
            if i % 50 == 0 {
                std::fs::create_dir_all(&p).unwrap();
                std::fs::write(p.join("f"), i.to_string()).unwrap();
            }
        }
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("leaf"), b"bottom").unwrap();
        let root = Dir::open_ambient_dir(t.path().join("root"), ambient_authority()).unwrap();
        let mut w = Walker::new(&root, &RelPath::root()).unwrap();
        let (mut most, mut dirs, mut files) = (0, 0, Vec::new());
        while let Some(it) = w.next() {
            let it = it.unwrap();
            match it.kind {
                EntryKind::Dir => dirs += 1,
                _ => files.push(it.path.display()),
            }
            most = most.max(w.open_levels());
        }
        assert_eq!(dirs, depth + 1);
        assert_eq!(files.len(), 5, "{files:?}");
        assert!(files.iter().any(|f| f.ends_with("/d/leaf")));
        // The files above the deepest levels come after the walk returned
        // to (and reopened) their directories.
        assert!(files.last().unwrap().ends_with("d/f"), "{files:?}");
        assert_eq!(most, OPEN_LEVELS, "at most {OPEN_LEVELS} levels open");
    }

    #[test]
    fn a_directory_replaced_during_the_walk_is_an_error_not_a_detour() {
        let t = tempfile::tempdir().unwrap();
        let mut p = t.path().join("root/top");
        for _ in 0..OPEN_LEVELS + 2 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(t.path().join("root/top/z"), b"z").unwrap();
        let root = Dir::open_ambient_dir(t.path().join("root"), ambient_authority()).unwrap();
        let mut w = Walker::new(&root, &RelPath::root()).unwrap();
        // Down to the bottom: `top` is closed by then.
        while w
            .next()
            .unwrap()
            .unwrap()
            .path
            .as_path()
            .components()
            .count()
            < OPEN_LEVELS + 3
        {}
        // `top` swapped for another directory of the same name.
        std::fs::rename(t.path().join("root/top"), t.path().join("moved")).unwrap();
        std::fs::create_dir(t.path().join("root/top")).unwrap();
        std::fs::write(t.path().join("root/top/z"), b"planted").unwrap();
        let rest: Vec<_> = w.collect();
        assert!(
            rest.iter().any(|r| r
                .as_ref()
                .is_err_and(|e| e.to_string().contains("replaced during the walk"))),
            "{rest:?}"
        );
        assert!(
            !rest
                .iter()
                .any(|r| r.as_ref().is_ok_and(|i| i.path.display() == "top/z")),
            "{rest:?}"
        );
    }
}
