//! The receiver's side of the file system: crash-safe placement under a destination.
//!
//! A file is written to a hidden part file beside its target (`.NAME.lh-part`), its
//! chunks hashed as they are written; only when every chunk is there and the BLAKE3
//! root equals the sender's does it get its mode and mtime and is renamed to its
//! final name. Multi-chunk files keep a journal (`.NAME.lh-journal`) of chunks that
//! are durably written, so a rerun fetches only what is missing. Every path is
//! resolved by cap-std beneath the destination: links planted in the destination or
//! sent by a hostile peer cannot lead writes outside it.
//!
//! A file of one chunk (or none) is written to an unnamed file instead
//! ([`crate::unnamed`], where the file system has them), created with its
//! write, and linked under its final name once verified; if its hash is not
//! known yet when the write is done, it is linked under its part name and
//! renamed later, so that no descriptor waits on the sender.

use crate::chunk::{hex, ChunkPlan, Digest};
use crate::journal::{self, JournalHeader};
use crate::manifest::{ns_to_system_time, Entry, EntryKind};
use crate::partlock::{taken_over, Guard, Guarded, Locked, Seal, Writer};
use crate::path::RelPath;
use crate::sibling::LINK;
use crate::sync::Existing;
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, SystemTimeSpec};
use cap_std::fs::{Dir, MetadataExt, OpenOptions};
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

pub use crate::open::open_read;
pub use crate::sibling::{is_reserved_name, sibling_name, JOURNAL, PART};

fn os(b: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(b))
}

/// Largest file accepted from a peer (16 TiB, ext4's limit): bounds the per-chunk
/// state a manifest entry can make a receiver allocate.
pub const MAX_FILE_SIZE: u64 = 1 << 44;

fn times(ns: i64) -> SystemTimeSpec {
    SystemTimeSpec::Absolute(cap_std::time::SystemTime::from_std(ns_to_system_time(ns)))
}

/// The mode bits a receiver keeps of what the far side sends, unless told
/// to keep them all ([`received_mode`]): no setuid, setgid or sticky bit,
/// and nothing writable by all, as sftp (`& 0777`) and rsync without `-p`
/// keep a peer's modes within reason.
pub const SAFE_MODE_BITS: u32 = 0o775;

/// The mode a received file or directory takes: `mode` within
/// [`SAFE_MODE_BITS`], or all its permission bits when `exact`
/// (`--exact-modes`).
pub fn received_mode(mode: u32, exact: bool) -> u32 {
    match exact {
        true => mode & 0o7777,
        false => mode & SAFE_MODE_BITS,
    }
}

fn perms(mode: u32) -> cap_std::fs::Permissions {
    cap_std::fs::Permissions::from_std(std::fs::Permissions::from_mode(mode & 0o7777))
}

/// The destination tree of a session.
pub struct DestDir {
    base: Dir,
    cached: Option<(RelPath, Arc<Dir>)>,
    dirs: Vec<(RelPath, u32, i64, Option<Arc<crate::meta::Applied>>)>,
    /// Directories this session created: no earlier run left parts in them.
    fresh: std::collections::HashSet<RelPath>,
}

impl DestDir {
    /// A destination rooted at `base`, with nothing cached, created or deferred yet.
    pub fn new(base: Dir) -> Self {
        DestDir {
            base,
            cached: None,
            dirs: Vec::new(),
            fresh: Default::default(),
        }
    }

    /// The directory every path of this destination is resolved beneath (callers hand it
    /// to [`sync_fs`] once everything is written).
    pub fn base(&self) -> &Dir {
        &self.base
    }

    /// The directory holding `path` and `path`'s name in it, if that
    /// directory is there; reached through no link, as [`open_dirs`].
    fn lookup<'p>(&self, path: &'p RelPath) -> io::Result<Option<(Dir, &'p [u8])>> {
        let Some(parent) = path.parent() else {
            return Ok(None);
        };
        match open_dirs(&self.base, &parent, false) {
            Ok((dir, _)) => Ok(Some((dir, path.file_name()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Metadata of a regular file at `path`, if one is there (links are not
    /// followed, on the way or at the end).
    pub fn existing_file(&self, path: &RelPath) -> io::Result<Option<Existing>> {
        let Some((dir, name)) = self.lookup(path)? else {
            return Ok(None);
        };
        match dir.symlink_metadata(os(name)) {
            Ok(m) if m.is_file() => Ok(Some(Existing {
                size: m.len(),
                mtime_ns: crate::walk::mtime_of(&m),
                mode: m.mode() & 0o7777,
            })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// As [`DestDir::lookup`], for a file that must be there: a missing
    /// directory is an error.
    fn lookup_there<'p>(&self, path: &'p RelPath) -> io::Result<(Dir, &'p [u8])> {
        self.lookup(path)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "its directory is not there"))
    }

    /// Give the regular file at `path` the permission bits `mode` (a file
    /// `--sync` skipped whose mode changed at the source). No link is
    /// followed on the way.
    pub fn set_mode(&self, path: &RelPath, mode: u32) -> io::Result<()> {
        let (dir, name) = self.lookup_there(path)?;
        dir.set_permissions(os(name), perms(mode))
    }

    /// BLAKE3 of the regular file at `path` (for `--checksum`).
    pub fn hash_file(&self, path: &RelPath) -> io::Result<Digest> {
        let (dir, name) = self.lookup_there(path)?;
        let f = open_read(&dir, os(name))?;
        let mut h = blake3::Hasher::new();
        h.update_reader(f)?;
        Ok(*h.finalize().as_bytes())
    }

    /// Create a directory (and its parents). Its mode and mtime are applied by
    /// [`DestDir::finish_dirs`], after its contents are in place. The base
    /// itself (the served root, a get's existing destination) is never given
    /// the far side's mode or mtime.
    pub fn make_dir(
        &mut self,
        path: &RelPath,
        mode: u32,
        mtime_ns: i64,
        meta: crate::meta::Applied,
    ) -> io::Result<()> {
        if path.is_root() {
            return Ok(());
        }
        let (_, created) = open_dirs(&self.base, path, true)?;
        if created {
            self.fresh.insert(path.clone());
        }
        let meta = (!meta.is_empty()).then(|| Arc::new(meta));
        self.dirs.push((path.clone(), mode, mtime_ns, meta));
        Ok(())
    }

    /// A file `--sync` skipped: give it the owner and attributes sent where
    /// they differ (as rsync does for an unchanged file). No link is
    /// followed.
    pub fn fix_meta(&self, path: &RelPath, meta: &crate::meta::Applied) -> io::Result<()> {
        use std::os::fd::AsFd;
        if meta.is_empty() {
            return Ok(());
        }
        let (dir, name) = self.lookup_there(path)?;
        let f = open_read(&dir, os(name))?;
        let m = f.metadata()?;
        use std::os::unix::fs::MetadataExt as _;
        let owner = meta.owner.filter(|&o| o != (m.uid(), m.gid()));
        let todo = crate::meta::Applied {
            owner,
            xattrs: meta.xattrs.clone(),
        };
        if todo.is_empty() {
            return Ok(());
        }
        // (A chown clears setuid bits: the mode goes back after.)
        let mode = m.mode() & 0o7777;
        crate::meta::apply_fd(f.as_fd(), &todo)?;
        if owner.is_some() && mode & 0o6000 != 0 {
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        Ok(())
    }

    /// True when [`DestDir::parent_of`] needs no file-system call for `path`: its
    /// directory is the one the last call opened.
    pub fn parent_cached(&self, path: &RelPath) -> bool {
        matches!((&self.cached, path.parent()), (Some((p, _)), Some(q)) if *p == q)
    }

    /// Was `path`'s directory created by this session (so that no earlier
    /// run can have left a part file in it)?
    pub fn in_fresh_dir(&self, path: &RelPath) -> bool {
        path.parent().is_some_and(|p| self.fresh.contains(&p))
    }

    /// The directory that will hold `path`, created if needed.
    pub fn parent_of(&mut self, path: &RelPath) -> io::Result<(Arc<Dir>, Vec<u8>)> {
        self.parent(path, true)
    }

    /// The directory that holds `path`, reached through no link (created
    /// where missing with `create`), and `path`'s name in it; the last one
    /// reached is kept for the next call.
    fn parent(&mut self, path: &RelPath, create: bool) -> io::Result<(Arc<Dir>, Vec<u8>)> {
        let parent = path.parent().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the destination itself is not a file name",
            )
        })?;
        let name = path.file_name().to_vec();
        if let Some((p, d)) = &self.cached {
            if *p == parent {
                return Ok((d.clone(), name));
            }
        }
        let dir = if parent.is_root() {
            self.base.try_clone()?
        } else {
            open_dirs(&self.base, &parent, create)?.0
        };
        let dir = Arc::new(dir);
        self.cached = Some((parent, dir.clone()));
        Ok((dir, name))
    }

    /// Place a symlink (replacing a file or link already there).
    pub fn make_symlink(
        &mut self,
        path: &RelPath,
        target: &[u8],
        mtime_ns: i64,
        meta: &crate::meta::Applied,
    ) -> io::Result<()> {
        use std::os::fd::AsFd;
        let (dir, name) = self.parent_of(path)?;
        let tmp = sibling_name(&name, LINK);
        let _ = dir.remove_file(os(&tmp));
        dir.symlink_contents(os(target), os(&tmp))?;
        if let Err(e) = crate::meta::apply_owner_at(dir.as_fd(), &tmp, meta) {
            let _ = dir.remove_file(os(&tmp));
            return Err(e);
        }
        let _ = dir.set_symlink_times(os(&tmp), None, Some(times(mtime_ns)));
        dir.rename(os(&tmp), &dir, os(&name)).inspect_err(|_| {
            // (A directory of that name, say: no stray link is left.)
            let _ = dir.remove_file(os(&tmp));
        })
    }

    /// Place a FIFO, a socket's name or a device node of `kind` (`rdev`:
    /// its device number), replacing a file, link or node already there,
    /// with permission bits `mode` (not the umask's) and `mtime_ns`. A
    /// device node needs CAP_MKNOD (root).
    pub fn make_special(
        &mut self,
        path: &RelPath,
        kind: EntryKind,
        rdev: u64,
        mode: u32,
        mtime_ns: i64,
        meta: &crate::meta::Applied,
    ) -> io::Result<()> {
        use std::os::fd::{AsFd, AsRawFd};
        let format = match kind {
            EntryKind::Fifo => libc::S_IFIFO,
            EntryKind::Socket => libc::S_IFSOCK,
            EntryKind::CharDevice => libc::S_IFCHR,
            EntryKind::BlockDevice => libc::S_IFBLK,
            _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
        };
        let (dir, name) = self.parent_of(path)?;
        let tmp = sibling_name(&name, LINK);
        let _ = dir.remove_file(os(&tmp));
        let c = std::ffi::CString::new(tmp.clone()).map_err(io::Error::other)?;
        let fd = dir.as_raw_fd();
        // SAFETY: mknodat and fchmodat read a NUL-terminated name relative to
        // a directory descriptor this function holds open.
        if unsafe { libc::mknodat(fd, c.as_ptr(), format | (mode & 0o777), rdev as libc::dev_t) }
            != 0
        {
            return Err(io::Error::last_os_error());
        }
        let placed = (|| {
            // (The owner first: a chown clears setuid bits.)
            crate::meta::apply_owner_at(dir.as_fd(), &tmp, meta)?;
            // (mknod applied the umask; a FIFO is never opened here: that
            // would block until a writer came.)
            // SAFETY: as above.
            if unsafe { libc::fchmodat(fd, c.as_ptr(), (mode & 0o7777) as libc::mode_t, 0) } != 0 {
                return Err(io::Error::last_os_error());
            }
            dir.set_symlink_times(os(&tmp), None, Some(times(mtime_ns)))?;
            dir.rename(os(&tmp), &dir, os(&name))
        })();
        if placed.is_err() {
            let _ = dir.remove_file(os(&tmp));
        }
        placed
    }

    /// Make `path` another name of the file at `existing` (a hard link),
    /// replacing a file or link already there; neither is followed if it is
    /// a symbolic link.
    pub fn make_hardlink(&mut self, path: &RelPath, existing: &RelPath) -> io::Result<()> {
        let (edir, ename) = self.parent(existing, false)?;
        let (dir, name) = self.parent_of(path)?;
        // Linked already (a rerun): rename would keep both names, so the
        // temporary one would stay.
        let ident = |d: &Dir, n: &[u8]| d.symlink_metadata(os(n)).map(|m| (m.dev(), m.ino()));
        if ident(&dir, &name).ok() == Some(ident(&edir, &ename)?) {
            return Ok(());
        }
        let tmp = sibling_name(&name, LINK);
        let _ = dir.remove_file(os(&tmp));
        edir.hard_link(os(&ename), &dir, os(&tmp))?;
        dir.rename(os(&tmp), &dir, os(&name)).inspect_err(|_| {
            let _ = dir.remove_file(os(&tmp));
        })
    }

    /// What is at `path` (no link followed, on the way or at the end):
    /// None when nothing is, or a directory on the way is missing (a dry
    /// run's destination, not created).
    pub fn found(&self, path: &RelPath) -> io::Result<Option<Found>> {
        let m = if path.is_root() {
            self.base.dir_metadata()
        } else {
            let Some((dir, name)) = self.lookup(path)? else {
                return Ok(None);
            };
            match dir.symlink_metadata(os(name)) {
                Ok(m) => Ok(m),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => Err(e),
            }
        }?;
        let kind = crate::walk::kind_of(&m);
        let link = match (kind, self.lookup(path)?) {
            (Some(EntryKind::Symlink), Some((dir, name))) => dir
                .read_link_contents(os(name))?
                .as_os_str()
                .as_bytes()
                .to_vec(),
            _ => Vec::new(),
        };
        Ok(Some(Found {
            kind,
            size: m.len(),
            rdev: m.rdev(),
            mtime_ns: crate::walk::mtime_of(&m),
            link,
            ident: (m.dev(), m.ino()),
        }))
    }

    /// Remove what `dirs` (directories beneath the base) hold that `keeps`
    /// does not keep (`--delete`): called with each entry's path beneath
    /// the base and whether it is a directory (a link to one is not). A
    /// directory not kept goes with everything in it that is not kept; one
    /// that still holds something kept stays, unreported. With `dry`,
    /// nothing is removed: the list is what would be. Each path removed
    /// comes once (deepest first within a directory), with whether it is a
    /// directory and how its removal went. A directory of `dirs` that is
    /// not there (a dry run's) is passed over.
    pub fn delete_extras(
        &mut self,
        dirs: &[RelPath],
        keeps: &dyn Fn(&RelPath, bool) -> bool,
        dry: bool,
    ) -> Vec<(RelPath, bool, io::Result<()>)> {
        self.cached = None;
        let mut out = Vec::new();
        let mut dirs: Vec<&RelPath> = dirs.iter().collect();
        dirs.sort();
        dirs.dedup();
        for d in dirs {
            let dir = match open_dirs(&self.base, d, false) {
                Ok((dir, _)) => dir,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    out.push((d.clone(), true, Err(e)));
                    continue;
                }
            };
            remove_unkept(&dir, d, keeps, dry, &mut out);
        }
        out
    }

    /// Whether `a` and `b` are names of one file (neither followed if a
    /// link); false when either is missing.
    pub fn same_file(&self, a: &RelPath, b: &RelPath) -> io::Result<bool> {
        match (self.found(a)?, self.found(b)?) {
            (Some(x), Some(y)) => Ok(x.ident == y.ident),
            _ => Ok(false),
        }
    }

    /// Apply directory modes and mtimes, deepest first. Call once, at the end.
    /// Each directory is reached from the base one component at a time
    /// through no link and changed through its own handle
    /// (`.` beneath it), never by its path: a directory swapped for a link
    /// meanwhile is an error, not a chmod of what the link points at. At
    /// most a few descriptors are open, however deep the tree.
    pub fn finish_dirs(&mut self) -> io::Result<()> {
        self.cached = None;
        let mut dirs = std::mem::take(&mut self.dirs);
        // A descendant sorts after its ancestor: reversed, children first.
        dirs.sort_by(|a, b| b.0.cmp(&a.0));
        dirs.dedup_by(|a, b| a.0 == b.0);
        let mut first_err = None;
        for (p, mode, mtime, meta) in dirs {
            if let Err(e) = self.finish_dir(&p, mode, mtime, meta.as_deref()) {
                first_err.get_or_insert(io::Error::new(e.kind(), format!("{}: {e}", p.display())));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// One directory's mode and mtime, through its own handle.
    fn finish_dir(
        &mut self,
        path: &RelPath,
        mode: u32,
        mtime_ns: i64,
        meta: Option<&crate::meta::Applied>,
    ) -> io::Result<()> {
        let (dir, name) = self.parent(path, false)?;
        let name = os(&name).as_os_str();
        let own = dir
            .open_dir_nofollow(name)
            .map_err(|e| not_a_dir(&dir, name, path.as_path(), e))?;
        // The owner and attributes, then the times: the mode may take
        // away the search permission that reaching `.` needs.
        if let Some(m) = meta {
            use std::os::fd::AsFd;
            crate::meta::apply_fd(own.as_fd(), m)?;
        }
        own.set_times(".", None, Some(times(mtime_ns)))?;
        own.set_permissions(".", perms(mode))
    }
}

/// How a chunk is written ([`Incoming::write_shaped`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    /// The chunk is all zeros and comes without data: it is left a hole.
    pub zeros: bool,
    /// Of a sparse file: each [`HOLE_BLOCK`] of zeros is left a hole.
    pub sparse: bool,
}

/// The unit of a sparse file's holes at the receiver: a file system block.
pub const HOLE_BLOCK: usize = 4096;

/// Whether `b` is all zeros (64 bytes at a time, without an early exit
/// inside them: the compiler makes that a few vector instructions).
fn is_zero(b: &[u8]) -> bool {
    b.chunks(64).all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
}

/// A file whose last chunk ends at `end` in a hole is given its size.
fn grow_to(file: &File, plan: &ChunkPlan, end: u64) -> io::Result<()> {
    if end == plan.size && file.metadata()?.len() < end {
        file.set_len(end)?;
    }
    Ok(())
}

/// Make `len` bytes of `file` at `off` a hole (reading zeros), keeping its
/// size; zeros written where the file system cannot punch holes.
fn punch(file: &File, off: u64, len: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: fallocate on a descriptor this function borrows.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
            std::os::unix::fs::FileExt::write_all_at(file, &crate::chunk::zeros()[..len], off)
        }
        _ => Err(e),
    }
}

/// What the destination holds at a path ([`DestDir::found`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// None for a kind Linux does not have.
    pub kind: Option<EntryKind>,
    /// Bytes (a regular file's).
    pub size: u64,
    /// A device node's number.
    pub rdev: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// A symlink's target.
    pub link: Vec<u8>,
    /// Device and inode.
    pub ident: (u64, u64),
}

/// The entries of `dir` (at `at` beneath the base) that `keeps` does not
/// keep, removed (or with `dry` listed) into `out`; a directory with what
/// it holds, depth first. Returns whether everything in `dir` went.
fn remove_unkept(
    dir: &Dir,
    at: &RelPath,
    keeps: &dyn Fn(&RelPath, bool) -> bool,
    dry: bool,
    out: &mut Vec<(RelPath, bool, io::Result<()>)>,
) -> bool {
    let mut names: Vec<(Vec<u8>, bool)> = Vec::new();
    let listed = dir.entries().and_then(|entries| {
        for e in entries {
            let e = e?;
            let is_dir = e.file_type()?.is_dir();
            names.push((e.file_name().as_bytes().to_vec(), is_dir));
        }
        Ok(())
    });
    if let Err(e) = listed {
        out.push((at.clone(), true, Err(e)));
        return false;
    }
    names.sort();
    let mut all = true;
    for (name, is_dir) in names {
        let Ok(path) = at.join_name(&name) else {
            all = false;
            continue;
        };
        if keeps(&path, is_dir) {
            all = false;
            continue;
        }
        if !is_dir {
            let r = match dry {
                true => Ok(()),
                false => dir.remove_file(os(&name)),
            };
            all &= r.is_ok();
            out.push((path, false, r));
            continue;
        }
        let emptied = match dir.open_dir_nofollow(os(&name)) {
            Ok(sub) => remove_unkept(&sub, &path, keeps, dry, out),
            Err(e) => {
                out.push((path, true, Err(e)));
                all = false;
                continue;
            }
        };
        if !emptied {
            all = false; // (something in it is kept: so is it)
            continue;
        }
        let r = match dry {
            true => Ok(()),
            false => dir.remove_dir(os(&name)),
        };
        all &= r.is_ok();
        out.push((path, true, r));
    }
    all
}

/// The directory `path` beneath `base`, reached one component at a time
/// through no symbolic link, and with `create` created where missing; and
/// whether its last component was created. A link on the way is an error: the sender of a
/// session may send links (`Symlink`), and a later entry under one would be
/// written wherever it points. The base confines that to the base, but a
/// get's base is the destination's parent when the destination does not
/// exist yet (`get srv:proj ~/proj` with a link `proj/l` → `..` and a file
/// `proj/l/.bashrc` would write `~/.bashrc`), and a put's is the whole root.
fn open_dirs(base: &Dir, path: &RelPath, create: bool) -> io::Result<(Dir, bool)> {
    let mut dir = base.try_clone()?;
    let mut created = false;
    let mut walked = std::path::PathBuf::new();
    for c in path.as_path().components() {
        walked.push(c);
        created = false;
        let next = match dir.open_dir_nofollow(c) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                match dir.create_dir(c) {
                    Ok(()) => created = true,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
                dir.open_dir_nofollow(c)
                    .map_err(|e| not_a_dir(&dir, c.as_os_str(), &walked, e))?
            }
            Err(e) => return Err(not_a_dir(&dir, c.as_os_str(), &walked, e)),
        };
        dir = next;
    }
    Ok((dir, created))
}

/// Why `name` in `dir` (at `walked` beneath the base) could not be opened as a
/// directory: a link, something else, or `e` itself.
fn not_a_dir(dir: &Dir, name: &std::ffi::OsStr, walked: &Path, e: io::Error) -> io::Error {
    match dir.symlink_metadata(name) {
        Ok(m) if m.is_symlink() => io::Error::other(format!(
            "{}: is a symbolic link, and longhaul writes nothing through a link in the destination",
            walked.display()
        )),
        Ok(m) if !m.is_dir() => io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{}: exists and is not a directory", walked.display()),
        ),
        _ => e,
    }
}

/// Half-open ranges of `0..count` not among the sorted `held` indices.
fn gaps(held: impl Iterator<Item = u64>, count: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut next = 0;
    for i in held {
        if i > next {
            out.push((next, i));
        }
        next = i + 1;
    }
    if next < count {
        out.push((next, count));
    }
    out
}

/// Why a finished file could not take its final name.
#[derive(Debug, thiserror::Error)]
pub enum FinishError {
    /// The BLAKE3 root of what was received differs from the sender's hash; the part and
    /// journal have been removed.
    #[error("BLAKE3 mismatch: sender {expected}, received {actual}")]
    Mismatch {
        /// The sender's hash, in hex.
        expected: String,
        /// The hash of what was received, in hex.
        actual: String,
    },
    /// An I/O error while verifying or placing the file; the part and journal are kept
    /// for a rerun.
    #[error(transparent)]
    Io(#[from] io::Error),
}

type ClaimKey = (u64, u64, Vec<u8>);

/// Files of several chunks a session of this process is receiving, by
/// directory (device, inode) and name: two sessions writing one target would
/// share its part file, and each would verify only what it received, not what
/// the part then holds.
static RECEIVING: Mutex<BTreeMap<ClaimKey, Holder>> = Mutex::new(BTreeMap::new());
/// Past the process's budget of locked parts ([`crate::partlock::budget`]),
/// gives back the locks (and descriptors) of parts, down to three quarters
/// of it: first those set up and not written since, then those written
/// longest ago, skipping any being written or used now.
fn shed() {
    let budget = crate::partlock::budget();
    if crate::partlock::held() <= budget {
        return;
    }
    let guards: Vec<Arc<Guard>> = RECEIVING
        .lock()
        .unwrap()
        .values()
        .map(|h| h.guard.clone())
        .collect();
    let mut idle: Vec<(Option<std::time::Instant>, Arc<Guard>)> = guards
        .into_iter()
        .filter_map(|guard| {
            let used = guard.try_lock().filter(|g| g.releasable())?.used;
            Some((used, guard))
        })
        .collect();
    idle.sort_by_key(|(used, _)| *used);
    for (_, guard) in idle {
        if crate::partlock::held() <= budget * 3 / 4 {
            break;
        }
        if let Some(mut g) = guard.try_lock() {
            g.release();
        }
    }
}

/// Removes the part and journal that an unfinished file of several chunks
/// left for `target` beneath `base` (reached through no link), unless a
/// session of this process is receiving it or another process holds its
/// lock: the journal first, then the part, under the part's lock. Returns
/// whether a part was there and removed.
pub fn remove_unfinished(base: &Dir, target: &RelPath) -> io::Result<bool> {
    let parent = target
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match open_dirs(base, &parent, false) {
        Ok((d, _)) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let name = target.file_name();
    // No session of this process claims it meanwhile.
    let claims = RECEIVING.lock().unwrap();
    if claims.contains_key(&Claim::key(&dir, name)?) {
        return Ok(false);
    }
    if part_metadata(&dir, name).is_none() {
        return Ok(false);
    }
    let part = sibling_name(name, PART);
    let _lock = match crate::partlock::lock_part(&dir, &part) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::ResourceBusy => return Ok(false),
        Err(e) => return Err(e),
    };
    let _ = dir.remove_file(os(&sibling_name(name, JOURNAL)));
    dir.remove_file(os(&part))?;
    drop(claims);
    Ok(true)
}

/// Does a part that lacks what `file` does not hold of `size` bytes (all
/// of them unless `resumed`: a part started over is emptied first) fit in
/// the room free on its file system? `StorageFull` when it does not: a file
/// that cannot fit fails at once, not when the disk fills. Each file is
/// weighed alone (files announced together are not summed: their parts are
/// sparse until written, and a file that replaces another frees room when
/// it is placed). A file system that tells no sizes is not checked.
fn check_fits(file: &File, size: u64, resumed: bool) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Some(space) = fs_space(file)? else {
        return Ok(());
    };
    let allocated = file.metadata()?.blocks().saturating_mul(512);
    let (held, freed) = match resumed {
        true => (allocated, 0),
        false => (0, allocated),
    };
    let free = space.free.saturating_add(freed);
    let need = size.saturating_sub(held);
    if need > free {
        use crate::units::show_size;
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "does not fit: it needs {} and its file system has {} free",
                show_size(need),
                show_size(free)
            ),
        ));
    }
    Ok(())
}

/// The size of a file system and the room free on it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    /// All of it.
    pub size: u64,
    /// Free to an unprivileged user (what root keeps in reserve not counted).
    pub free: u64,
}

/// The size of the file system that holds `fd` and the room free on it;
/// `None` for a file system that tells no sizes (it reports no blocks).
pub fn fs_space(fd: &impl std::os::fd::AsRawFd) -> io::Result<Option<FsSpace>> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: fstatvfs on a descriptor the caller holds open, writing into a
    // buffer of its own type.
    if unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatvfs succeeded, so it filled the buffer.
    let st = unsafe { st.assume_init() };
    if st.f_blocks == 0 {
        return Ok(None);
    }
    #[allow(clippy::unnecessary_cast)] // the fields' widths differ by target
    let (blocks, avail, frsize) = (st.f_blocks as u64, st.f_bavail as u64, st.f_frsize as u64);
    Ok(Some(FsSpace {
        size: blocks.saturating_mul(frsize),
        free: avail.saturating_mul(frsize),
    }))
}

/// The part file an unfinished file of several chunks named `name` has in
/// `dir`, if there is one (a regular file, not followed through a link).
pub fn part_metadata(dir: &Dir, name: &[u8]) -> Option<cap_std::fs::Metadata> {
    dir.symlink_metadata(os(&sibling_name(name, PART)))
        .ok()
        .filter(|m| m.is_file())
}

/// Signalled whenever a claim is given up or marked ending.
static RELEASED: std::sync::Condvar = std::sync::Condvar::new();
/// Numbers the claims, so that a claim taken over is not given up by its
/// first holder's drop.
static NEXT_CLAIM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A holder that has recorded no chunk for this long, while another session
/// wants its file, has lost its peer (a client killed without a close leaves
/// its session up until the connection times out): the newer session takes
/// the file over, and the old one may no longer write, journal or place it.
pub const STALE_CLAIM: std::time::Duration = std::time::Duration::from_secs(3);

/// A holder whose session has heard nothing from its peer for this long (no
/// data, no control frame; a live peer's keep-alives come every 5 s, its data
/// far more often), nor recorded a chunk, is taken over sooner than
/// [`STALE_CLAIM`]: a put rerun right after its client was killed waited 3 s
/// per held file, and a rerun killed within that got nothing done.
pub const STALE_PEER: std::time::Duration = std::time::Duration::from_millis(500);

/// When a receiving session last heard from its peer: its driver calls
/// [`Heard::now`] on every piece of data or control frame that arrives; a
/// session that wants a file this one holds reads it ([`STALE_PEER`]).
#[derive(Debug, Clone, Default)]
pub struct Heard(Arc<std::sync::atomic::AtomicU64>);

/// The process's clock origin for [`Heard`] (milliseconds since it).
fn epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

impl Heard {
    /// A session that has just heard from its peer.
    pub fn new() -> Heard {
        let h = Heard::default();
        h.now();
        h
    }

    /// The peer was heard from just now.
    pub fn now(&self) {
        let ms = epoch().elapsed().as_millis() as u64;
        self.0.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long since the peer was last heard from.
    pub fn silent_for(&self) -> std::time::Duration {
        let at = self.0.load(std::sync::atomic::Ordering::Relaxed);
        let now = epoch().elapsed().as_millis() as u64;
        std::time::Duration::from_millis(now.saturating_sub(at))
    }
}

/// Who holds a claim.
struct Holder {
    /// Which claim (see [`NEXT_CLAIM`]).
    id: u64,
    /// Its session is ending ([`Incoming::ending`]): waited for, never taken over.
    ending: bool,
    /// When it last recorded a chunk (or took the claim).
    active: std::time::Instant,
    /// Its file's guard: closed when a newer session takes the file over,
    /// which then gets the part's lock if the holder has it.
    guard: Arc<Guard>,
    /// When its session last heard from its peer, if the session says.
    heard: Option<Heard>,
}

/// Why [`Incoming::open`] refused a file it had waited for: the session
/// that held it placed it meanwhile, as this one would have (same size and
/// mtime). See [`placed_meanwhile`].
#[derive(Debug)]
pub struct PlacedMeanwhile;

impl std::fmt::Display for PlacedMeanwhile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("another session placed this file while this one waited for it")
    }
}

impl std::error::Error for PlacedMeanwhile {}

/// Is `e` a [`PlacedMeanwhile`] refusal (nothing to receive: skip the file)?
pub fn placed_meanwhile(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<PlacedMeanwhile>())
}

/// Does `name` in `dir` hold a file of `entry`'s size and mtime (the quick
/// check's rule, [`crate::sync::same_mtime`])?
fn placed_as(dir: &Dir, name: &[u8], entry: &Entry) -> bool {
    dir.symlink_metadata(os(name)).is_ok_and(|m| {
        m.is_file()
            && m.len() == entry.size
            && crate::sync::same_mtime(crate::walk::mtime_of(&m), entry.mtime_ns)
    })
}

/// This process's claim on a target, given up when the file is dropped.
struct Claim {
    key: ClaimKey,
    id: u64,
}

impl Claim {
    /// The registry's key of `name` in `dir`.
    fn key(dir: &Dir, name: &[u8]) -> io::Result<ClaimKey> {
        let m = dir.dir_metadata()?;
        Ok((m.dev(), m.ino(), name.to_vec()))
    }

    /// Blocks up to `wait` while the holder's session goes on, and until it
    /// is given up once that session is ending (callers run it off the async
    /// runtime); takes the file over from a holder silent for
    /// [`STALE_CLAIM`], and with it the part's lock if the holder has it
    /// (returned). `guard` is the new holder's file's guard.
    /// A claim granted after a wait, for a file that meanwhile stands under
    /// its name with `entry`'s size and mtime (the session that held it
    /// placed it), is refused with [`PlacedMeanwhile`].
    fn take(
        dir: &Dir,
        name: &[u8],
        wait: std::time::Duration,
        guard: Arc<Guard>,
        heard: Option<Heard>,
        entry: &Entry,
    ) -> io::Result<(Claim, Option<Locked>)> {
        let key = Claim::key(dir, name)?;
        let deadline = std::time::Instant::now() + wait;
        let mut held = RECEIVING.lock().unwrap();
        let mut lock = None;
        let mut took = false;
        let mut waited = false;
        while let Some(h) = held.get(&key) {
            waited = true;
            let ending = h.ending;
            let idle = h.active.elapsed();
            let stale = match &h.heard {
                Some(p) => idle >= STALE_PEER && p.silent_for() >= STALE_PEER,
                None => idle >= STALE_CLAIM,
            };
            if !ending && stale {
                // After any checkpoint of the old holder under way; from
                // now on it neither writes, journals nor places this file.
                lock = h.guard.quiet().take_over();
                took = true;
                break;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !ending && left.is_zero() {
                return Err(io::Error::other(format!(
                    "this file is already being received (by another session, or another root of this one; waited {} s; a session whose peer vanished without closing holds it until its connection times out), and is not written twice at once",
                    wait.as_secs()
                )));
            }
            // An ending holder is not timed; a silent one may go stale:
            // check again four times a second.
            let tick = std::time::Duration::from_millis(250);
            let wait = if ending { tick } else { left.min(tick) };
            held = RELEASED.wait_timeout(held, wait).unwrap().0;
        }
        if waited && !took && placed_as(dir, name, entry) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                PlacedMeanwhile,
            ));
        }
        let id = NEXT_CLAIM.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let holder = Holder {
            id,
            ending: false,
            active: std::time::Instant::now(),
            guard,
            heard,
        };
        held.insert(key.clone(), holder);
        Ok((Claim { key, id }, lock))
    }

    /// Runs `f` on this claim's registry entry, if it is still this claim's.
    fn with_holder(&self, f: impl FnOnce(&mut Holder)) {
        if let Some(h) = RECEIVING.lock().unwrap().get_mut(&self.key) {
            if h.id == self.id {
                f(h);
            }
        }
    }

    /// The holder recorded a chunk: it is not stale.
    fn touch(&self) {
        self.with_holder(|h| h.active = std::time::Instant::now());
    }

    /// The session holding this claim is ending: a waiter waits for it
    /// without a deadline.
    fn ending(&self) {
        self.with_holder(|h| h.ending = true);
        RELEASED.notify_all();
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = RECEIVING.lock().unwrap();
        if held.get(&self.key).is_some_and(|h| h.id == self.id) {
            held.remove(&self.key);
        }
        drop(held);
        RELEASED.notify_all();
    }
}

/// A file being received.
pub struct Incoming {
    /// How the file is cut into chunks, from the size its entry announced.
    pub plan: ChunkPlan,
    /// Digests of the chunks held, by index: grows with the data actually received,
    /// never with what a manifest claims.
    digests: BTreeMap<u64, Digest>,
    missing: u64,
    /// The sender's BLAKE3 of the whole file, once announced.
    pub expected: Option<Digest>,
    /// A file of one chunk: its part, open only while its data is moving (a
    /// file of several chunks has its descriptors in `guard`).
    file: Option<Arc<File>>,
    dir: Arc<Dir>,
    name: Vec<u8>,
    journaled: bool,
    /// Chunks recorded and not yet in the journal.
    pending: Vec<(u64, Digest)>,
    /// Chunks in the journal as *written* records only (not yet synced):
    /// the next synced checkpoint journals them again, as synced.
    unsynced: Vec<(u64, Digest)>,
    /// Orders checkpoints against each other and against `finish`/`discard`;
    /// closed once the part and journal are renamed or removed (a late
    /// checkpoint then has nothing to do). A file of several chunks keeps its
    /// part's lock and descriptors here ([`crate::partlock`]).
    guard: Arc<Guard>,
    mode: u32,
    mtime_ns: i64,
    /// The owner and attributes to give it with its mode
    /// ([`Incoming::set_meta`]).
    meta: Option<Arc<crate::meta::Applied>>,
    /// A single-chunk file's part exists (see [`Incoming::file`]).
    created: bool,
    /// The part already has its final mode and mtime.
    meta_applied: bool,
    /// The part is an unnamed file ([`crate::unnamed`]), open in `file`.
    unnamed: bool,
    /// In a directory this session created: see [`Incoming::in_fresh_dir`].
    fresh: bool,
    /// Chunks claimed by a writer and not yet recorded ([`Incoming::claim`]).
    writing: std::collections::BTreeSet<u64>,
    /// Bytes already held from an earlier run.
    pub resumed_bytes: u64,
    claim: Option<Claim>,
}

/// Chunk `index` as the part file holds it, hashed (its digest, if intact).
pub(crate) fn read_back(file: &File, plan: &ChunkPlan, index: u64) -> io::Result<Digest> {
    let len = plan.len(index).unwrap_or(0) as usize;
    let buf = crate::chunk::read_at(file, len, plan.offset(index))?;
    let mut h = plan.hasher(index);
    h.update(&buf);
    Ok(h.finish())
}

/// Removes the part file an earlier run left for `name` (an error if there is
/// none), then its journal, if any.
fn remove_leftovers(dir: &Dir, name: &[u8]) -> io::Result<()> {
    dir.remove_file(os(&sibling_name(name, PART)))?;
    let _ = dir.remove_file(os(&sibling_name(name, JOURNAL)));
    Ok(())
}

/// How the writer of a single-chunk file left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Verified and under its final name.
    Placed(Digest),
    /// The data is not what the sender hashed.
    Mismatch {
        /// The sender's hash, in hex.
        expected: String,
        /// The hash of what was received, in hex.
        actual: String,
    },
    /// The sender's hash was not known yet: under its part name, for
    /// [`Incoming::finish`].
    Parked,
    /// Verified, with its mode and mtime, and not yet under its final name
    /// (a durable session): the caller makes the data durable, then
    /// [`Incoming::finish`] places it.
    Verified(Digest),
}

/// Give `file` its final owner and attributes (`meta`), mode and mtime
/// (after its last write; the owner first: a chown clears setuid bits).
/// An owner or a mode the file already has is not set again: a file this
/// process just made (an unnamed one is made with its final permission
/// bits, [`crate::unnamed::create_with`]) usually has both, and one `statx`
/// costs less than a `fchown` and a `fchmod`, each of which changes the
/// inode (a journal transaction on ext4).
pub fn apply_meta(
    file: &File,
    mode: u32,
    mtime_ns: i64,
    meta: Option<&crate::meta::Applied>,
) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mode = mode & 0o7777;
    // (Without it, both calls are made.)
    let now = file
        .metadata()
        .ok()
        .map(|m| (m.uid(), m.gid(), m.mode() & 0o7777));
    let mut mode_kept = true;
    if let Some(m) = meta {
        use std::os::fd::AsFd;
        let owner = match (m.owner, now) {
            (Some((u, g)), Some((nu, ng, _))) if (u, g) == (nu, ng) => None,
            (o, _) => o,
        };
        // A chown clears setuid bits, an ACL sets permission bits.
        mode_kept = owner.is_none() && m.xattrs.is_empty();
        if owner.is_some() || !m.xattrs.is_empty() {
            let m = crate::meta::Applied {
                owner,
                xattrs: m.xattrs.clone(),
            };
            crate::meta::apply_fd(file.as_fd(), &m)?;
        }
    }
    if !(mode_kept && now.is_some_and(|(_, _, m)| m == mode)) {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    file.set_times(std::fs::FileTimes::new().set_modified(ns_to_system_time(mtime_ns)))
}

/// Places a single-chunk file from the writer's thread ([`Incoming::placer`]).
#[derive(Clone)]
pub struct Placer {
    dir: Arc<Dir>,
    name: Vec<u8>,
    unnamed: bool,
    fresh: bool,
    expected: Option<Digest>,
    plan: ChunkPlan,
    mode: u32,
    mtime_ns: i64,
    meta: Option<Arc<crate::meta::Applied>>,
}

impl Placer {
    /// After the file's one write: give it its mode and mtime (with the
    /// descriptor the writer holds), then, with the sender's hash known
    /// (protocol 2 sends it with the data), verify and place it; without,
    /// give an unnamed file its part name, so that its descriptor can close
    /// while the hash is on its way.
    /// With `durable`, a verified file is left as it is (`Verified`): its
    /// name must wait until its data is on disk.
    pub fn settle(&self, file: &File, digest: Digest, durable: bool) -> io::Result<Settled> {
        apply_meta(file, self.mode, self.mtime_ns, self.meta.as_deref())?;
        let actual = self.plan.root(&[digest]);
        match self.expected {
            Some(e) if e == actual && durable => Ok(Settled::Verified(actual)),
            Some(e) if e == actual => {
                self.place(file)?;
                Ok(Settled::Placed(actual))
            }
            Some(e) => Ok(Settled::Mismatch {
                expected: hex(&e),
                actual: hex(&actual),
            }),
            None => {
                if self.unnamed {
                    self.park(file)?;
                }
                Ok(Settled::Parked)
            }
        }
    }

    /// Under the final name: an unnamed file is linked there (or, when the
    /// name is taken, linked as the part and renamed over it); a named part
    /// is renamed.
    fn place(&self, file: &File) -> io::Result<()> {
        if self.unnamed {
            match crate::unnamed::link(file, &*self.dir, &self.name) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self.park(file)?,
                Err(e) => return Err(e),
                Ok(()) => {
                    // A part an earlier, interrupted run left (and its journal,
                    // if the file was larger then) must not stay behind.
                    if !self.fresh {
                        let _ = remove_leftovers(&self.dir, &self.name);
                    }
                    return Ok(());
                }
            }
        }
        let part = sibling_name(&self.name, PART);
        self.dir.rename(os(&part), &self.dir, os(&self.name))
    }

    /// Link an unnamed file under the part name, replacing what an earlier run
    /// left there (and its journal, if the file was larger then).
    fn park(&self, file: &File) -> io::Result<()> {
        let part = sibling_name(&self.name, PART);
        match crate::unnamed::link(file, &*self.dir, &part) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                remove_leftovers(&self.dir, &self.name)?;
                crate::unnamed::link(file, &*self.dir, &part)
            }
            r => r,
        }
    }
}

impl Incoming {
    /// Open the part file for `entry` in `dir` under `name`. With `resume`, a part and
    /// journal left by an earlier run for the same source (size and mtime) are kept
    /// and only the missing chunk ranges are returned; otherwise all of them.
    /// A file of several chunks that another session of this process is
    /// receiving is waited for up to `claim_wait` while that session goes
    /// on (however long it takes once it is ending), then refused.
    pub fn open(
        dir: Arc<Dir>,
        name: &[u8],
        entry: &Entry,
        resume: bool,
        claim_wait: std::time::Duration,
    ) -> io::Result<(Incoming, Vec<(u64, u64)>)> {
        Incoming::open_heard(dir, name, entry, resume, claim_wait, None)
    }

    /// [`Incoming::open`] for a session that says when it last heard from
    /// its peer: a session waiting for this file takes it over once that
    /// peer has been silent for [`STALE_PEER`].
    pub fn open_heard(
        dir: Arc<Dir>,
        name: &[u8],
        entry: &Entry,
        resume: bool,
        claim_wait: std::time::Duration,
        heard: Option<Heard>,
    ) -> io::Result<(Incoming, Vec<(u64, u64)>)> {
        Incoming::open_checked(dir, name, entry, resume, claim_wait, heard, true)
    }

    /// [`Incoming::open_heard`] of a file the destination holds and that
    /// is sent only if its BLAKE3 differs (`--checksum`): not resumed, and
    /// not refused for want of room, since most such files are the same
    /// and need none (a file that differs and does not fit fails when it is
    /// written).
    pub fn open_to_compare(
        dir: Arc<Dir>,
        name: &[u8],
        entry: &Entry,
        claim_wait: std::time::Duration,
        heard: Option<Heard>,
    ) -> io::Result<(Incoming, Vec<(u64, u64)>)> {
        Incoming::open_checked(dir, name, entry, false, claim_wait, heard, false)
    }

    fn open_checked(
        dir: Arc<Dir>,
        name: &[u8],
        entry: &Entry,
        resume: bool,
        claim_wait: std::time::Duration,
        heard: Option<Heard>,
        check_room: bool,
    ) -> io::Result<(Incoming, Vec<(u64, u64)>)> {
        if entry.size > MAX_FILE_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a file of {} bytes is larger than the {MAX_FILE_SIZE} bytes longhaul accepts",
                    entry.size
                ),
            ));
        }
        let plan = ChunkPlan::new(entry.size);
        let part = sibling_name(name, PART);
        let jname = sibling_name(name, JOURNAL);
        let journaled = plan.count() > 1;
        // Before the part is truncated. A file of one chunk needs none: each
        // writer has a file of its own until it is linked or renamed whole.
        let guard = Guard::new(dir.clone(), part.clone(), jname.clone());
        let mut existed = false;
        let (claim, lock) = if journaled {
            let (claim, inherited) =
                Claim::take(&dir, name, claim_wait, guard.clone(), heard, entry)?;
            existed = dir.symlink_metadata(os(&part)).is_ok();
            let lock = match inherited {
                Some(l) => l,
                None => crate::partlock::lock_part(&dir, &part)?,
            };
            (Some(claim), Some(lock))
        } else {
            (None, None)
        };
        let header = JournalHeader {
            size: entry.size,
            mtime_ns: entry.mtime_ns,
        };
        let mut digests = BTreeMap::new();
        let mut written = Vec::new();
        let mut unsynced = Vec::new();
        let mut kept = None;
        if resume && journaled {
            if let Ok(j) = open_read(&dir, os(&jname)) {
                if let Ok(Some(parsed)) = journal::read(j, plan.count()) {
                    if parsed.header == header {
                        digests.extend(parsed.synced);
                        written = parsed.written;
                        kept = Some(parsed.valid_len);
                    }
                }
            }
        }
        // What the part still lacks must fit on its file system.
        if let Some(lock) = lock.as_ref().filter(|_| check_room) {
            // (A sparse file needs what its data takes, not its size.)
            let needs = match entry.allocated {
                0 => entry.size,
                a => a.min(entry.size),
            };
            if let Err(e) = check_fits(lock.file(), needs, kept.is_some()) {
                if !existed {
                    let _ = dir.remove_file(os(&part));
                }
                return Err(e);
            }
        }
        // The journal is emptied before the part is truncated, and made
        // durable first when it held records: a crash between the two must
        // not leave records that a resume would trust beside a zeroed part.
        if let Some(lock) = lock {
            let had_journal = kept.is_none() && dir.symlink_metadata(os(&jname)).is_ok();
            let mut jo = OpenOptions::new();
            jo.write(true).create(true).follow(FollowSymlinks::No);
            {
                // As private as the part it describes.
                use cap_std::fs::OpenOptionsExt;
                jo.mode(0o600);
            }
            if kept.is_none() {
                jo.truncate(true);
            }
            let mut j = dir.open_with(os(&jname), &jo)?.into_std();
            {
                use std::io::{Seek, Write};
                match kept {
                    // A torn record at its end (a crash while appending)
                    // goes: what is appended after it must be read.
                    Some(valid) => {
                        if j.metadata()?.len() != valid {
                            j.set_len(valid)?;
                        }
                        j.seek(io::SeekFrom::Start(valid))?;
                    }
                    None => {
                        j.write_all(&journal::encode_header(&header))?;
                        if had_journal {
                            j.sync_data()?;
                        }
                    }
                }
                let owner_at = j.stream_position()?;
                let owner = journal::encode_owner(&crate::partlock::nonce());
                j.write_all(&owner)?;
                let seal = Seal {
                    part: lock.ident()?,
                    journal: crate::partlock::ident(&j)?,
                    journal_len: owner_at + journal::RECORD_LEN,
                    owner_at,
                    owner,
                };
                // A part an earlier run gave its final mode (read-only, say)
                // before a rename that failed: writable again, as it is ours.
                let mut opts = OpenOptions::new();
                opts.read(true).write(true).follow(FollowSymlinks::No);
                let file = match dir.open_with(os(&part), &opts) {
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                        dir.set_permissions(os(&part), perms(0o600))?;
                        dir.open_with(os(&part), &opts)?
                    }
                    r => r?,
                }
                .into_std();
                if crate::partlock::ident(&file)? != seal.part {
                    return Err(io::Error::other(
                        "the part file was replaced while it was being set up",
                    ));
                }
                if kept.is_none() {
                    file.set_len(0)?;
                }
                if kept.is_some() && file.metadata()?.len() < entry.size {
                    // Chunks the journal names must be inside the part file.
                    let len = file.metadata()?.len();
                    digests.retain(|&i, _| plan.offset(i) + plan.len(i).unwrap_or(0) <= len);
                    written.retain(|&(i, _)| plan.offset(i) + plan.len(i).unwrap_or(0) <= len);
                }
                // Chunks journaled without a sync are trusted only if they read
                // back with their digest (a power cut may have lost them).
                for (i, d) in written {
                    if !digests.contains_key(&i) && read_back(&file, &plan, i)? == d {
                        digests.insert(i, d);
                        unsynced.push((i, d));
                    }
                }
                file.set_len(entry.size)?;
                drop(file);
                guard.lock().set_up(seal, lock);
            }
            shed();
        }
        let missing = plan.count() - digests.len() as u64;
        let resumed_bytes = digests.keys().filter_map(|&i| plan.len(i)).sum();
        let ranges = gaps(digests.keys().copied(), plan.count());
        Ok((
            Incoming {
                plan,
                digests,
                missing,
                expected: None,
                file: None,
                dir,
                name: name.to_vec(),
                journaled,
                pending: Vec::new(),
                unsynced,
                guard,
                mode: entry.mode,
                mtime_ns: entry.mtime_ns,
                meta: None,
                created: false,
                meta_applied: false,
                unnamed: false,
                fresh: false,
                writing: Default::default(),
                resumed_bytes,
                claim,
            },
            ranges,
        ))
    }

    /// The part to write a chunk into: a file of several chunks has its part
    /// locked again (as it was left, [`crate::partlock`]) and keeps the lock
    /// while the writer lives; past the process's budget of locked parts,
    /// those written longest ago give theirs back.
    pub fn writer(&mut self) -> io::Result<Writer> {
        if !self.journaled {
            return Ok(Writer::plain(self.file()?));
        }
        let w = Writer::locked(&self.guard)?;
        shed();
        Ok(w)
    }

    /// A file of one chunk (or none): its part, created on first use, not in
    /// [`Incoming::open`], so a small file costs one open: unnamed where the
    /// file system allows ([`crate::unnamed`]), else as a named part,
    /// replacing one an earlier run left (and its journal, if the file was
    /// larger then). (A file of several chunks has its data descriptor in
    /// its guard.)
    fn file(&mut self) -> io::Result<Arc<File>> {
        debug_assert!(
            !self.journaled,
            "a journaled part's descriptor is its guard's"
        );
        if let Some(f) = &self.file {
            return Ok(f.clone());
        }
        let part = sibling_name(&self.name, PART);
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).follow(FollowSymlinks::No);
        if !self.created {
            if let Some(f) = crate::unnamed::create_with(&*self.dir, self.mode)? {
                let f = Arc::new(f);
                self.created = true;
                self.unnamed = true;
                self.file = Some(f.clone());
                return Ok(f);
            }
        }
        let f = if self.created {
            self.dir.open_with(os(&part), &opts)?
        } else {
            use cap_std::fs::OpenOptionsExt;
            opts.mode(0o600);
            let mut new = opts.clone();
            new.create_new(true);
            let f = match self.dir.open_with(os(&part), &new) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    // An earlier run's part (perhaps already given a
                    // read-only final mode): replaced, not reopened.
                    remove_leftovers(&self.dir, &self.name)?;
                    self.dir.open_with(os(&part), &new)?
                }
                r => r?,
            };
            self.created = true;
            f
        };
        let f = Arc::new(f.into_std());
        self.file = Some(f.clone());
        Ok(f)
    }

    /// The file's guard, locked.
    fn guarded(&self) -> std::sync::MutexGuard<'_, Guarded> {
        self.guard.lock()
    }

    /// The file's directory was created by this session ([`DestDir::in_fresh_dir`]):
    /// placing an unnamed file need not look for a part an earlier run left.
    pub fn in_fresh_dir(&mut self) {
        self.fresh = true;
    }

    /// What the writer of a [`Incoming::single_chunk`] file needs to place it
    /// right after its write (with the sender's hash as known now).
    pub fn placer(&self) -> Placer {
        Placer {
            dir: self.dir.clone(),
            name: self.name.clone(),
            unnamed: self.unnamed,
            fresh: self.fresh,
            expected: self.expected,
            plan: self.plan,
            mode: self.mode,
            mtime_ns: self.mtime_ns,
            meta: self.meta.clone(),
        }
    }

    /// Give the file, when it gets its mode, this owner and these
    /// attributes too.
    pub fn set_meta(&mut self, meta: crate::meta::Applied) {
        self.meta = (!meta.is_empty()).then(|| Arc::new(meta));
    }

    /// The writer settled the file ([`Placer::settle`], which applied its
    /// mode and mtime): `Parked` leaves a named part for [`Incoming::finish`]
    /// (after [`Incoming::record`]); after `Placed` or `Mismatch` the caller
    /// drops this (a mismatch through [`Incoming::discard`]).
    pub fn settled(&mut self, how: &Settled) {
        self.meta_applied = true;
        match how {
            Settled::Parked => {
                self.unnamed = false;
                self.file = None;
            }
            Settled::Placed(_) | Settled::Mismatch { .. } => self.file = None,
            // Kept open (an unnamed file has no name to reopen it by) until
            // `finish`, or `park`.
            Settled::Verified(_) => {}
        }
    }

    /// Verify the whole file against the sender's hash and give it its mode
    /// and mtime, without placing it (a durable session's [`Incoming::finish`]
    /// waits for the data to be synced). On a mismatch the part and journal
    /// are removed.
    pub fn verify(&mut self) -> Result<Digest, FinishError> {
        let actual = self.root();
        let expected = self.expected.expect("verify needs the sender's hash");
        if actual != expected {
            self.discard();
            return Err(FinishError::Mismatch {
                expected: hex(&expected),
                actual: hex(&actual),
            });
        }
        if !self.meta_applied {
            if self.journaled {
                // Under the lock, with the part as it was left.
                let mut g = self.guarded();
                apply_meta(&*g.data()?, self.mode, self.mtime_ns, self.meta.as_deref())?;
            } else {
                let file = self.file()?;
                apply_meta(&file, self.mode, self.mtime_ns, self.meta.as_deref())?;
            }
            self.meta_applied = true;
        }
        Ok(actual)
    }

    /// Sync the part's data (fdatasync), opening it if it is closed.
    pub fn sync_data(&mut self) -> io::Result<()> {
        if self.journaled {
            let mut g = self.guarded();
            return g.data()?.sync_data();
        }
        self.file()?.sync_data()
    }

    /// Does this file hold an open descriptor (an unnamed file waiting to be
    /// placed holds one until [`Incoming::park`], a file of several chunks
    /// while its part is locked)?
    pub fn holds_descriptor(&self) -> bool {
        self.file.is_some() || (self.journaled && self.guarded().holds())
    }

    /// Give an unnamed file its part name and close it: [`Incoming::finish`]
    /// then renames the part (for a verified file that must wait, so that
    /// waiting files do not hold a descriptor each). A file of several
    /// chunks gives back its part's lock and descriptors (unless a write is
    /// in flight); they are taken again, and checked, when needed.
    pub fn park(&mut self) -> io::Result<()> {
        if self.journaled {
            let mut g = self.guarded();
            g.parked = true;
            g.release();
            return Ok(());
        }
        if self.unnamed {
            if let Some(f) = self.file.take() {
                self.placer().park(&f)?;
            }
            self.unnamed = false;
        }
        self.file = None;
        Ok(())
    }

    /// The file system (device id) the file is received on: what a syncfs
    /// must cover.
    pub fn device(&self) -> io::Result<u64> {
        use cap_std::fs::MetadataExt;
        Ok(self.dir.dir_metadata()?.dev())
    }

    /// The directory the file is received in.
    pub fn dir(&self) -> &Arc<Dir> {
        &self.dir
    }

    /// Does something stand under the file's final name?
    pub fn target_exists(&self) -> bool {
        self.dir.symlink_metadata(os(&self.name)).is_ok()
    }

    /// One chunk, all of it (never journaled): the file is whole after this
    /// chunk's write, so its writer settles it ([`Incoming::placer`]).
    pub fn single_chunk(&self) -> bool {
        self.plan.count() == 1
    }

    /// Is a record for chunk `index` of `len` bytes acceptable now?
    pub fn check_record(&self, index: u64, len: u64) -> Result<(), String> {
        match self.plan.len(index) {
            None => Err(format!(
                "chunk {index} is beyond the file ({} bytes)",
                self.plan.size
            )),
            Some(l) if l != len => Err(format!("chunk {index} has {len} bytes, expected {l}")),
            Some(_) if self.digests.contains_key(&index) || self.writing.contains(&index) => {
                Err(format!("chunk {index} sent twice"))
            }
            Some(_) => Ok(()),
        }
    }

    /// Hash chunk `index` (given as pieces), then write it at its offset:
    /// the hashing runs beside other chunks' writes, the write waits for
    /// them ([`Writer::write_all_at`]). Needs no lock of the caller's.
    pub fn write_chunk(
        file: &Writer,
        plan: &ChunkPlan,
        index: u64,
        pieces: &[impl AsRef<[u8]>],
    ) -> io::Result<Digest> {
        let mut h = plan.hasher(index);
        for p in pieces {
            h.update(p.as_ref());
        }
        let mut off = plan.offset(index);
        for p in pieces {
            let p = p.as_ref();
            file.write_all_at(p, off)?;
            off += p.len() as u64;
        }
        Ok(h.finish())
    }

    /// [`Incoming::write_chunk`] of `data`, shaped: a chunk of zeros (no
    /// `data`) becomes a hole, and with `shape.sparse` each [`HOLE_BLOCK`]
    /// of zeros in `data` does (holes are punched, so a part that held
    /// other bytes there reads zeros; where the file system cannot punch,
    /// zeros are written). The digest covers the chunk's bytes, holes and
    /// all: a chunk of zeros' is `zero_digest` when the sender gave it (a
    /// hole reads zeros by construction: hashing them again would only
    /// spend 0.17 ms a chunk), else computed. The file reaches its size
    /// even when it ends in a hole.
    pub fn write_shaped(
        file: &Writer,
        plan: &ChunkPlan,
        index: u64,
        data: &[u8],
        shape: Shape,
        zero_digest: Option<Digest>,
    ) -> io::Result<Digest> {
        if !shape.zeros && !shape.sparse {
            return Incoming::write_chunk(file, plan, index, &[data]);
        }
        let off = plan.offset(index);
        let len = plan.len(index).unwrap_or(0) as usize;
        let mut h = plan.hasher(index);
        if shape.zeros {
            punch(file, off, len)?;
            grow_to(file, plan, off + len as u64)?;
            return Ok(zero_digest.unwrap_or_else(|| plan.zero_digest(index)));
        } else {
            h.update(data);
            let mut at = 0;
            while at < data.len() {
                let zero = is_zero(&data[at..(at + HOLE_BLOCK).min(data.len())]);
                let mut end = at;
                while end < data.len()
                    && is_zero(&data[end..(end + HOLE_BLOCK).min(data.len())]) == zero
                {
                    end = (end + HOLE_BLOCK).min(data.len());
                }
                match zero {
                    true => punch(file, off + at as u64, end - at)?,
                    false => file.write_all_at(&data[at..end], off + at as u64)?,
                }
                at = end;
            }
        }
        grow_to(file, plan, off + len as u64)?;
        Ok(h.finish())
    }

    /// Note that chunk `index` is being written (after [`Incoming::check_record`]):
    /// a second record of it is refused even before the first is recorded.
    pub fn claim(&mut self, index: u64) {
        self.writing.insert(index);
    }

    /// No chunk of it is held (none written, none resumed): its part holds
    /// nothing worth keeping.
    pub fn holds_no_chunk(&self) -> bool {
        self.digests.is_empty()
    }

    /// Placed, discarded, given up or taken over: its part (if any) is no
    /// longer this file's.
    pub fn is_closed(&self) -> bool {
        self.guarded().closed
    }

    /// An error if a newer session took this file over ([`STALE_CLAIM`]):
    /// its writer must not touch the part any more.
    pub fn still_ours(&self) -> io::Result<()> {
        match self.guarded().closed {
            true => Err(taken_over()),
            false => Ok(()),
        }
    }

    /// Note that chunk `index` is written with `digest`.
    pub fn record(&mut self, index: u64, digest: Digest) {
        if let Some(c) = &self.claim {
            c.touch();
        }
        self.writing.remove(&index);
        if self.digests.insert(index, digest).is_none() {
            self.missing -= 1;
        }
        if self.journaled {
            self.pending.push((index, digest));
        } else if self.missing == 0 && !self.unnamed {
            self.file = None; // complete: no descriptor while waiting for the hash
        }
    }

    /// Take the chunks to journal, to commit with [`Checkpoint::commit`]
    /// without holding whatever guards `self`. With `sync`, every chunk not
    /// yet journaled as synced: the commit syncs the data first, so the
    /// records hold through a power cut. Without, the chunks recorded since
    /// the last checkpoint, journaled at once as *written* (they hold through
    /// the process being killed; a resume reads them back). `None` when there
    /// is nothing to journal.
    pub fn take_checkpoint(&mut self, sync: bool) -> io::Result<Option<Checkpoint>> {
        if self.pending.is_empty() && (!sync || self.unsynced.is_empty()) {
            return Ok(None);
        }
        let records = if sync {
            let mut all = std::mem::take(&mut self.unsynced);
            all.append(&mut self.pending);
            all
        } else {
            let recs = std::mem::take(&mut self.pending);
            self.unsynced.extend_from_slice(&recs);
            recs
        };
        Ok(Some(Checkpoint {
            dir: self.dir.clone(),
            journal: sibling_name(&self.name, JOURNAL),
            records,
            sync,
            guard: self.guard.clone(),
        }))
    }

    /// This file's session is ending (it journals what it holds next): a
    /// session that wants the same target waits for it to be given up
    /// however long that takes, instead of refusing it after a while.
    pub fn ending(&self) {
        if let Some(c) = &self.claim {
            c.ending();
        }
    }

    /// Make the chunks written so far durable, then journal them (both at once,
    /// on this thread).
    pub fn flush_journal(&mut self) -> io::Result<()> {
        match self.take_checkpoint(true)? {
            Some(c) => c.commit(),
            None => Ok(()),
        }
    }

    /// Are all chunks written and the sender's hash known, so that
    /// [`Incoming::finish`] can run?
    pub fn is_complete(&self) -> bool {
        self.missing == 0 && self.expected.is_some()
    }

    /// BLAKE3 of what was received (all chunks must be there).
    pub fn root(&self) -> Digest {
        assert_eq!(self.missing, 0, "root needs every chunk");
        let d: Vec<Digest> = self.digests.values().copied().collect();
        self.plan.root(&d)
    }

    /// Verify and place under the final name. On a mismatch the part and journal are
    /// removed (they hold bad data); on an I/O error they are kept for a rerun.
    pub fn finish(mut self) -> Result<Digest, FinishError> {
        let actual = self.verify()?;
        let part = sibling_name(&self.name, PART);
        let unnamed = if self.unnamed { self.file.take() } else { None };
        self.file = None;
        self.pending.clear();
        self.unsynced.clear();
        let guard = self.guard.clone();
        let mut g = guard.quiet();
        if g.closed {
            return Err(FinishError::Io(taken_over()));
        }
        if self.journaled {
            // Under the lock, as it was left. The journal goes first: once
            // the part is renamed, another receiver may make a new part
            // under that name, and would journal into this one.
            g.hold()?;
            let _ = self.dir.remove_file(os(&sibling_name(&self.name, JOURNAL)));
        }
        match unnamed {
            Some(f) => self.placer().place(&f)?,
            None => self.dir.rename(os(&part), &self.dir, os(&self.name))?,
        }
        g.close();
        Ok(actual)
    }

    /// Remove the part file and journal (bad data, or the sender's file is
    /// unchanged), if they are still this file's: not once another session
    /// took it over, nor, for a file of several chunks, when its part cannot
    /// be locked as it was left.
    pub fn discard(&mut self) {
        self.pending.clear();
        self.unsynced.clear();
        self.file = None;
        // After a checkpoint under way; any later one finds the file closed.
        let guard = self.guard.clone();
        let mut g = guard.quiet();
        if !g.closed && (!self.journaled || g.hold().is_ok()) {
            // Under the lock, the journal first (as in `finish`). A one-chunk
            // file's too: an earlier, larger version may have left one.
            let _ = self.dir.remove_file(os(&sibling_name(&self.name, JOURNAL)));
            let _ = self.dir.remove_file(os(&sibling_name(&self.name, PART)));
        }
        g.close();
    }
}

/// Is `dir` on a file system kept in memory only (tmpfs, ramfs), where
/// syncing makes nothing durable and costs a walk of its inodes?
pub fn in_memory_only(dir: &Dir) -> bool {
    use std::os::fd::AsRawFd;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs on a descriptor `dir` holds open (O_PATH allows it),
    // writing into a buffer of its own type.
    if unsafe { libc::fstatfs(dir.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: fstatfs succeeded, so it filled the buffer.
    #[allow(clippy::unnecessary_cast)] // f_type is i64 here, not everywhere
    let kind = unsafe { st.assume_init() }.f_type as i64;
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// Start writing `len` bytes at `offset` of `file` to disk without waiting
/// (sync_file_range with SYNC_FILE_RANGE_WRITE): a large file's data then
/// streams to the disk while it arrives, and the fdatasync that must come
/// before its name finds little left to write. Advice only: an error (a file
/// system that does not support it) is ignored.
pub fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: a descriptor `file` holds open; no memory is passed.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// syncfs(2) on the file system that holds `dir`. cap-std's directory
/// descriptors are `O_PATH`, which syncfs refuses (EBADF): it gets one of its
/// own, opened for reading.
pub fn sync_fs(dir: &Dir) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = open_dot(dir)?;
    // SAFETY: syncfs on a descriptor held open for the call.
    match unsafe { libc::syncfs(fd.as_raw_fd()) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Make `dir`'s entries durable (fsync of the directory: a name given by a
/// rename survives a power cut).
pub fn sync_dir(dir: &Dir) -> io::Result<()> {
    File::from(open_dot(dir)?).sync_all()
}

/// `dir` opened for reading (a `Dir`'s own descriptor is a path only,
/// which neither syncfs nor fsync takes).
fn open_dot(dir: &Dir) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: openat on a descriptor `dir` holds open, a NUL-terminated path.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned here alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A counting semaphore for blocking threads: at most `max` places taken.
pub struct Slots {
    max: usize,
    taken: Mutex<usize>,
    freed: std::sync::Condvar,
}

/// A place taken in [`Slots`], given back when dropped.
pub struct Slot<'a>(&'a Slots);

impl Slots {
    /// `max` places.
    pub const fn new(max: usize) -> Slots {
        Slots {
            max,
            taken: Mutex::new(0),
            freed: std::sync::Condvar::new(),
        }
    }

    /// A place, once one is free (blocks).
    pub fn take(&self) -> Slot<'_> {
        let mut n = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        while *n >= self.max {
            n = self.freed.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.taken.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        self.0.freed.notify_one();
    }
}

/// Chunks taken from an [`Incoming`] to be made durable and journaled.
#[must_use = "a checkpoint journals nothing until committed"]
pub struct Checkpoint {
    dir: Arc<Dir>,
    journal: Vec<u8>,
    records: Vec<(u64, Digest)>,
    /// Sync the data first and journal the records as synced.
    sync: bool,
    guard: Arc<Guard>,
}

impl Checkpoint {
    /// Append the records to the journal; for a synced checkpoint, sync the
    /// part file's data first, so that a synced record is never on disk before
    /// the chunk it names. Blocks; serialized with the file's other
    /// checkpoints, and a no-op once the file was placed or discarded.
    /// Under the part's lock, taken again (and checked) if it was given back.
    pub fn commit(self) -> io::Result<()> {
        let mut g = self.guard.lock();
        if g.closed {
            return Ok(());
        }
        let was_held = g.holds();
        if self.sync {
            g.data()?.sync_data()?;
        } else {
            g.hold()?;
        }
        let j = self
            .dir
            .open_with(
                os(&self.journal),
                OpenOptions::new().append(true).follow(FollowSymlinks::No),
            )?
            .into_std();
        let appended = journal::append(&j, &self.records, self.sync);
        match &appended {
            Ok(()) => g.appended(j.metadata()?.len()),
            // A torn append (a full disk) is cut off, so that the journal
            // still ends where this receiver's appends ended.
            Err(_) => {
                if let Some(len) = g.journal_len() {
                    if j.set_len(len).is_err() {
                        g.appended(j.metadata()?.len());
                    }
                }
            }
        }
        // A complete file waiting for its commit holds no lock.
        if g.parked && !was_held {
            g.release();
        }
        drop(g);
        shed();
        appended
    }
}

impl Drop for Incoming {
    /// However the session ends (error, Ctrl-C, a dropped future), chunks already
    /// written are synced and journaled so that a rerun does not fetch them again.
    fn drop(&mut self) {
        let _ = self.flush_journal();
        // The lock goes now (once no write is in flight), not with the last
        // checkpoint: a session that waits for this file locks the part next.
        self.guard.quiet().close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long a second claim waits in these tests (short: they wait it
    /// out to see a refusal).
    const WAIT: std::time::Duration = std::time::Duration::from_secs(1);
    use crate::manifest::EntryKind;
    use crate::CHUNK_SIZE;
    use cap_std::ambient_authority;

    fn entry(size: u64) -> Entry {
        Entry {
            id: 1,
            root: 0,
            path: b"f".to_vec(),
            kind: EntryKind::File,
            size,
            mode: 0o640,
            mtime_ns: 1_600_000_000_123_456_789,
            link: vec![],
            owner: Default::default(),
            xattrs: vec![],
            allocated: 0,
        }
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    /// Write chunk `i` of `bytes` into `inc` and record it.
    fn put_chunk(inc: &mut Incoming, bytes: &[u8], i: u64) {
        let (o, l) = (
            inc.plan.offset(i) as usize,
            inc.plan.len(i).unwrap() as usize,
        );
        let d = Incoming::write_chunk(&inc.writer().unwrap(), &inc.plan, i, &[&bytes[o..o + l]])
            .unwrap();
        inc.record(i, d);
    }

    #[test]
    fn a_kill_keeps_chunks_journaled_unsynced_if_they_read_back_intact() {
        // What a SIGKILL leaves: written records only (no sync, no flush at
        // exit). A resume reads those chunks back: intact ones are kept,
        // one whose data did not reach the part (as after a power cut) is
        // fetched again. Synced records are trusted without reading.
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 4 * CHUNK_SIZE;
        let (bytes, e) = (data(size as usize), entry(size));
        let (mut inc, ranges) = Incoming::open(dir.clone(), b"f", &e, true, WAIT).unwrap();
        assert_eq!(ranges, vec![(0, 4)]);
        put_chunk(&mut inc, &bytes, 0);
        inc.take_checkpoint(true)
            .unwrap()
            .unwrap()
            .commit()
            .unwrap();
        for i in [1u64, 2] {
            put_chunk(&mut inc, &bytes, i);
        }
        inc.take_checkpoint(false)
            .unwrap()
            .unwrap()
            .commit()
            .unwrap();
        assert!(inc.take_checkpoint(false).unwrap().is_none(), "nothing new");
        // The files as a kill leaves them, before this Incoming's drop
        // journals everything synced.
        let (part, journal) = (t.path().join(".f.lh-part"), t.path().join(".f.lh-journal"));
        let (part_then, journal_then) = (
            std::fs::read(&part).unwrap(),
            std::fs::read(&journal).unwrap(),
        );
        // The journal is as private as the part.
        use std::os::unix::fs::PermissionsExt;
        for f in [&part, &journal] {
            let mode = std::fs::metadata(f).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", f.display());
        }
        drop(inc);
        std::fs::write(&journal, &journal_then).unwrap();
        let mut torn = part_then;
        let c2 = 2 * CHUNK_SIZE as usize;
        torn[c2..c2 + 4096].fill(0);
        torn[..4096].fill(0); // chunk 0 too, but its record is synced
        std::fs::write(&part, &torn).unwrap();

        let (inc, ranges) = Incoming::open(dir.clone(), b"f", &e, true, WAIT).unwrap();
        assert_eq!(
            ranges,
            vec![(2, 4)],
            "chunks 0 (synced) and 1 (intact) kept"
        );
        assert_eq!(inc.resumed_bytes, 2 * CHUNK_SIZE);
    }

    #[test]
    fn a_file_that_cannot_fit_is_refused_before_anything_is_written() {
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let free = free_on(t.path());
        assert!(free > 4 * CHUNK_SIZE, "the test needs some room: {free}");
        let err = Incoming::open(dir.clone(), b"huge", &entry(free * 2), false, WAIT)
            .err()
            .expect("cannot fit");
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
        assert!(err.to_string().contains("does not fit"), "{err}");
        assert_eq!(listing(t.path()), Vec::<String>::new(), "no part left");
        // Each is weighed alone: two of 60 % each both start (their parts
        // are sparse until written).
        let most = free / 5 * 3;
        let a = Incoming::open(dir.clone(), b"a", &entry(most), false, WAIT).unwrap();
        let b = Incoming::open(dir.clone(), b"b", &entry(most), false, WAIT).unwrap();
        drop((a, b));
    }

    /// Bytes free to an unprivileged user on the file system of `p`.
    fn free_on(p: &Path) -> u64 {
        let dir = std::fs::File::open(p).unwrap();
        fs_space(&dir)
            .unwrap()
            .expect("a file system with sizes")
            .free
    }

    #[test]
    fn slots_let_at_most_their_number_run_at_once() {
        static SLOTS: Slots = Slots::new(3);
        let (now, most) = (
            Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        );
        let threads: Vec<_> = (0..12)
            .map(|_| {
                let (now, most) = (now.clone(), most.clone());
                std::thread::spawn(move || {
                    let _slot = SLOTS.take();
                    let n = now.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    most.fetch_max(n, std::sync::atomic::Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[test]
    fn gaps_are_the_missing_ranges() {
        assert_eq!(
            gaps([1u64, 2, 5].into_iter(), 7),
            vec![(0, 1), (3, 5), (6, 7)]
        );
        assert_eq!(gaps(std::iter::empty(), 3), vec![(0, 3)]);
        assert_eq!(gaps([0u64, 1, 2].into_iter(), 3), vec![]);
        assert_eq!(gaps(std::iter::empty(), 0), vec![]);
    }

    #[test]
    fn a_target_is_received_by_one_session_at_a_time() {
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 3 * CHUNK_SIZE + 5;
        let bytes = data(size as usize);
        let (mut a, _) = Incoming::open(dir.clone(), b"f", &entry(size), false, WAIT).unwrap();
        put_chunk(&mut a, &bytes, 0);
        // A second session's open would truncate the part under the first.
        let err = Incoming::open(dir.clone(), b"f", &entry(size), false, WAIT)
            .err()
            .expect("refused while the first holds it");
        assert!(err.to_string().contains("already being received"), "{err}");
        let part = t.path().join(".f.lh-part");
        assert_eq!(std::fs::metadata(&part).unwrap().len(), size);
        let chunk0 = &std::fs::read(&part).unwrap()[..CHUNK_SIZE as usize];
        assert_eq!(
            chunk0,
            &bytes[..CHUNK_SIZE as usize],
            "the first session's data is intact"
        );
        // Another name in the same directory is not held up.
        assert!(Incoming::open(dir.clone(), b"g", &entry(size), false, WAIT).is_ok());
        // A claim given up while a second one waits is granted to it.
        let waiter = {
            let dir = dir.clone();
            std::thread::spawn(move || Incoming::open(dir, b"f", &entry(size), true, WAIT))
        };
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!waiter.is_finished(), "the second claim waits");
        drop(a);
        let b = waiter
            .join()
            .unwrap()
            .expect("granted once the first is given up");
        // A claim whose session is ending (journaling after its peer
        // closed) is waited for past WAIT, not refused.
        let (b, _) = b;
        b.ending();
        let waiter = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                Incoming::open(dir, b"f", &entry(size), true, WAIT).map(|_| ())
            })
        };
        std::thread::sleep(WAIT + std::time::Duration::from_millis(500));
        assert!(!waiter.is_finished(), "an ending holder is waited for");
        drop(b);
        waiter
            .join()
            .unwrap()
            .expect("granted once the ending one is given up");
    }

    #[test]
    fn another_process_receiving_the_target_is_refused_by_the_part_files_lock() {
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 3 * CHUNK_SIZE + 5;
        let bytes = data(size as usize);
        // What another process holds: its part, written and locked (flock
        // locks belong to the open file, so a second open conflicts even
        // in one process).
        let part = t.path().join(".f.lh-part");
        std::fs::write(&part, &bytes).unwrap();
        let other = std::fs::File::open(&part).unwrap();
        other.lock().unwrap();
        let err = Incoming::open(dir.clone(), b"f", &entry(size), false, WAIT)
            .err()
            .expect("refused while another process holds the lock");
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
        assert!(err.to_string().contains("another process"), "{err}");
        assert_eq!(std::fs::read(&part).unwrap(), bytes, "its part untouched");
        // Our own lock keeps the other process out until the file is done.
        drop(other);
        let (mut a, _) = Incoming::open(dir.clone(), b"f", &entry(size), false, WAIT).unwrap();
        let theirs = std::fs::File::open(&part).unwrap();
        assert!(matches!(
            theirs.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        for i in 0..4 {
            put_chunk(&mut a, &bytes, i);
        }
        a.expected = Some(a.root());
        a.finish().unwrap();
        assert!(theirs.try_lock().is_ok(), "released once placed");
        assert_eq!(std::fs::read(t.path().join("f")).unwrap(), bytes);
    }

    #[test]
    fn a_part_another_process_took_while_its_lock_was_given_back_is_refused_not_mixed() {
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 3 * CHUNK_SIZE + 5;
        let (bytes, e) = (data(size as usize), entry(size));
        let journal = t.path().join(".f.lh-journal");
        let theirs = |dir: &Arc<Dir>, resume: bool| {
            // Another process: its own registry of claims, so here only the
            // part's lock and journal tell the two apart.
            Incoming::open(dir.clone(), b"f", &e, resume, WAIT).unwrap()
        };
        let forget_claim = |dir: &Arc<Dir>| {
            RECEIVING
                .lock()
                .unwrap()
                .remove(&Claim::key(dir, b"f").unwrap());
        };

        // Another process restarts the file (no resume) while ours waits
        // for data: our next write is refused, and its part is left alone.
        let (mut a, _) = Incoming::open(dir.clone(), b"f", &e, true, WAIT).unwrap();
        put_chunk(&mut a, &bytes, 0);
        a.park().unwrap();
        forget_claim(&dir);
        let (mut b, _) = theirs(&dir, false);
        // (It gives its lock back too: past its budget, say.)
        b.park().unwrap();
        let err = a.writer().err().expect("the part changed");
        assert!(err.to_string().contains("changed"), "{err}");
        // Nor can ours journal its chunk in their journal, or remove theirs.
        let err = a.flush_journal().expect_err("not journaled");
        assert!(err.to_string().contains("changed"), "{err}");
        let parsed = journal::read(std::fs::File::open(&journal).unwrap(), 4)
            .unwrap()
            .unwrap();
        assert!(parsed.synced.is_empty() && parsed.written.is_empty());
        a.discard();
        assert!(t.path().join(".f.lh-part").exists(), "theirs is kept");
        assert!(journal.exists());
        std::mem::forget(a);
        drop(b);
        forget_claim(&dir);

        // One that resumes it (appending nothing but its owner record) is
        // told apart as well.
        let (mut a, _) = Incoming::open(dir.clone(), b"f", &e, true, WAIT).unwrap();
        put_chunk(&mut a, &bytes, 1);
        a.park().unwrap();
        forget_claim(&dir);
        let (b, _) = theirs(&dir, true);
        drop(b);
        let err = a.writer().err().expect("the part changed");
        assert!(err.to_string().contains("changed"), "{err}");
        std::mem::forget(a);
        forget_claim(&dir);

        // Given back and taken again with nobody between: ours goes on.
        let (mut a, _) = Incoming::open(dir.clone(), b"f", &e, false, WAIT).unwrap();
        for i in 0..2 {
            put_chunk(&mut a, &bytes, i);
        }
        a.flush_journal().unwrap();
        a.park().unwrap();
        assert!(!a.holds_descriptor());
        for i in 2..4 {
            put_chunk(&mut a, &bytes, i);
        }
        a.park().unwrap();
        a.expected = Some(*blake3::hash(&bytes).as_bytes());
        a.finish().unwrap();
        assert_eq!(std::fs::read(t.path().join("f")).unwrap(), bytes);
        assert_eq!(listing(t.path()), ["f"]);
    }

    #[test]
    fn a_parked_part_stays_given_back_and_no_lock_goes_under_a_write() {
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 2 * CHUNK_SIZE;
        let (bytes, e) = (data(size as usize), entry(size));
        let part = t.path().join(".f.lh-part");
        let locked_by_us = || {
            let f = std::fs::File::open(&part).unwrap();
            matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock))
        };

        // Complete and parked (waiting for its commit): a checkpoint taken
        // before, committed after, locks the part to journal, then gives
        // the lock back.
        let (mut a, _) = Incoming::open(dir.clone(), b"f", &e, true, WAIT).unwrap();
        put_chunk(&mut a, &bytes, 0);
        put_chunk(&mut a, &bytes, 1);
        let cp = a.take_checkpoint(false).unwrap().unwrap();
        a.park().unwrap();
        assert!(!locked_by_us() && !a.holds_descriptor());
        cp.commit().unwrap();
        assert!(!locked_by_us() && !a.holds_descriptor(), "given back again");
        a.expected = Some(*blake3::hash(&bytes).as_bytes());
        a.finish().unwrap();
        assert_eq!(listing(t.path()), ["f"]);

        // A file dropped (its session failed) while a chunk's write is in
        // flight keeps its lock until that write is done.
        let (mut b, _) = Incoming::open(dir.clone(), b"g", &e, true, WAIT).unwrap();
        let writer = b.writer().unwrap();
        let dropped = std::thread::spawn(move || drop(b));
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!dropped.is_finished(), "waits for the write");
        let gpart = t.path().join(".g.lh-part");
        let theirs = std::fs::File::open(&gpart).unwrap();
        assert!(matches!(
            theirs.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        writer.write_all_at(b"late", 0).unwrap();
        drop(writer);
        dropped.join().unwrap();
        theirs
            .try_lock()
            .expect("given back once the write is done");
    }

    #[test]
    fn a_holder_whose_peer_is_heard_keeps_its_file_and_one_gone_silent_loses_it_in_a_second() {
        use std::time::{Duration, Instant};
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 3 * CHUNK_SIZE;
        let (bytes, e) = (data(size as usize), entry(size));
        let heard = Heard::new();
        let wait = STALE_CLAIM * 3;
        let (mut a, _) =
            Incoming::open_heard(dir.clone(), b"f", &e, true, wait, Some(heard.clone())).unwrap();
        put_chunk(&mut a, &bytes, 0);
        // Its peer sends (a slow link: no chunk completes) for longer than
        // STALE_CLAIM: the file stays a's.
        let (alive, keep) = (
            Arc::new(std::sync::atomic::AtomicBool::new(true)),
            heard.clone(),
        );
        let pinger = {
            let alive = alive.clone();
            std::thread::spawn(move || {
                while alive.load(std::sync::atomic::Ordering::Relaxed) {
                    keep.now();
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let waiter = {
            let (dir, e) = (dir.clone(), e.clone());
            std::thread::spawn(move || {
                let asked = Instant::now();
                let r = Incoming::open(dir, b"f", &e, true, wait);
                (r.map(|(inc, _)| inc), asked.elapsed())
            })
        };
        std::thread::sleep(STALE_CLAIM + Duration::from_millis(500));
        assert!(!waiter.is_finished(), "a's peer is heard: no takeover");
        assert!(a.still_ours().is_ok());
        // The peer goes silent (killed): taken over within about STALE_PEER.
        let silent = Instant::now();
        alive.store(false, std::sync::atomic::Ordering::Relaxed);
        pinger.join().unwrap();
        let (b, _) = waiter.join().unwrap();
        let b = b.expect("taken over");
        let after = silent.elapsed();
        assert!(
            after + Duration::from_millis(100) >= STALE_PEER
                && after < STALE_PEER + Duration::from_millis(600),
            "taken over {after:?} after the peer went silent"
        );
        assert!(a.still_ours().is_err(), "a may not write any more");
        drop(b);
    }

    #[test]
    fn a_waiter_for_a_file_its_holder_then_places_gets_placed_meanwhile_and_makes_no_part() {
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 2 * CHUNK_SIZE;
        let (bytes, e) = (data(size as usize), entry(size));
        let (mut a, _) = Incoming::open(dir.clone(), b"f", &e, true, WAIT).unwrap();
        let waiter = {
            let (dir, e) = (dir.clone(), e.clone());
            std::thread::spawn(move || Incoming::open(dir, b"f", &e, true, WAIT * 5).map(|_| ()))
        };
        std::thread::sleep(std::time::Duration::from_millis(300));
        for i in 0..2 {
            put_chunk(&mut a, &bytes, i);
        }
        a.expected = Some(a.root());
        a.finish().unwrap();
        let err = waiter.join().unwrap().expect_err("nothing left to receive");
        assert!(placed_meanwhile(&err), "{err}");
        assert_eq!(std::fs::read(t.path().join("f")).unwrap(), bytes);
        assert_eq!(listing(t.path()), ["f"], "no part or journal made");
    }

    #[test]
    fn a_silent_holder_is_taken_over_and_may_no_longer_write_journal_or_place() {
        // A client killed without a close leaves its session holding the
        // file until the connection times out; a rerun's session takes the
        // file over once the holder has recorded nothing for STALE_CLAIM.
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 3 * CHUNK_SIZE;
        let (bytes, e) = (data(size as usize), entry(size));
        let (mut a, _) = Incoming::open(dir.clone(), b"f", &e, true, WAIT).unwrap();
        put_chunk(&mut a, &bytes, 0);
        let asked = std::time::Instant::now();
        let wait = STALE_CLAIM + std::time::Duration::from_secs(2);
        let (mut b, ranges) = Incoming::open(dir.clone(), b"f", &e, true, wait).unwrap();
        assert!(asked.elapsed() + std::time::Duration::from_millis(50) >= STALE_CLAIM);
        assert_eq!(ranges, vec![(0, 3)], "nothing of a's was journaled");
        assert!(a.still_ours().is_err(), "a may not write any more");
        let cp = a.take_checkpoint(true).unwrap().expect("a has a record");
        cp.commit().unwrap(); // a no-op now
                              // a's drop neither journals into b's file nor gives up b's claim.
        drop(a);
        let third = Incoming::open(dir.clone(), b"f", &e, true, WAIT / 5);
        assert!(third.is_err(), "b holds the file (and is not silent)");
        for i in 0..3 {
            put_chunk(&mut b, &bytes, i);
        }
        b.expected = Some(*blake3::hash(&bytes).as_bytes());
        b.finish().unwrap();
        assert_eq!(std::fs::read(t.path().join("f")).unwrap(), bytes);
        assert!(!t.path().join(".f.lh-journal").exists());
    }

    #[test]
    fn nothing_is_written_through_a_link_in_the_destination() {
        // A get into `proj` (not there yet) has the parent as its base: a
        // sender's link `proj/l` -> `..` must not carry later entries out.
        let t = tempfile::tempdir().unwrap();
        let base = Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap();
        let mut dest = DestDir::new(base);
        let rel = |p: &[u8]| RelPath::from_wire(p).unwrap();
        dest.make_dir(&rel(b"proj"), 0o755, 0, Default::default())
            .unwrap();
        dest.make_symlink(&rel(b"proj/l"), b"..", 0, &Default::default())
            .unwrap();
        let err = dest
            .parent_of(&rel(b"proj/l/.bashrc"))
            .expect_err("refused");
        assert_eq!(
            err.to_string(),
            "proj/l: is a symbolic link, and longhaul writes nothing through a link in the destination"
        );
        // Nor read through one: a sync's size, mtime or hash of a file there
        // would go back to the sender.
        std::fs::write(t.path().join("secret"), b"s").unwrap();
        let err = dest
            .existing_file(&rel(b"proj/l/secret"))
            .expect_err("refused");
        assert!(
            err.to_string().starts_with("proj/l: is a symbolic link"),
            "{err}"
        );
        let err = dest.hash_file(&rel(b"proj/l/secret")).expect_err("refused");
        assert!(
            err.to_string().starts_with("proj/l: is a symbolic link"),
            "{err}"
        );
        assert!(dest.existing_file(&rel(b"proj/none/x")).unwrap().is_none());
        let err = dest
            .make_dir(&rel(b"proj/l/d/e"), 0o755, 0, Default::default())
            .expect_err("refused");
        assert!(
            err.to_string().starts_with("proj/l: is a symbolic link"),
            "{err}"
        );
        assert!(
            !t.path().join("d").exists(),
            "nothing was created outside proj"
        );
        // A link as the last component of a directory entry is refused too,
        // and a file where a directory is wanted says so.
        let err = dest
            .make_dir(&rel(b"proj/l"), 0o755, 0, Default::default())
            .expect_err("refused");
        assert!(
            err.to_string().starts_with("proj/l: is a symbolic link"),
            "{err}"
        );
        std::fs::write(t.path().join("proj/f"), b"x").unwrap();
        let err = dest.parent_of(&rel(b"proj/f/g")).expect_err("refused");
        assert_eq!(err.to_string(), "proj/f: exists and is not a directory");
        // Real directories, old and new, are walked and created as before.
        let (dir, name) = dest.parent_of(&rel(b"proj/a/b/c")).unwrap();
        assert_eq!(name, b"c");
        dir.write("c", b"ok").unwrap();
        assert_eq!(std::fs::read(t.path().join("proj/a/b/c")).unwrap(), b"ok");
        // A directory this session created counts as fresh; one already there does not.
        std::fs::create_dir(t.path().join("proj/old")).unwrap();
        dest.make_dir(&rel(b"proj/old"), 0o755, 0, Default::default())
            .unwrap();
        dest.make_dir(&rel(b"proj/new"), 0o755, 0, Default::default())
            .unwrap();
        assert!(!dest.in_fresh_dir(&rel(b"proj/old/x")));
        assert!(dest.in_fresh_dir(&rel(b"proj/new/x")));
    }

    /// Directory metadata goes to the directories placed, through their
    /// own handles: never to the base, never through a link swapped in for
    /// a directory before the end, and a mode that takes away the owner's
    /// access still gets its mtime.
    #[test]
    fn directory_modes_reach_only_the_directories_placed() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let base = Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap();
        let mut dest = DestDir::new(base);
        let rel = |p: &[u8]| RelPath::from_wire(p).unwrap();
        let base_mtime = std::fs::metadata(t.path()).unwrap().modified().unwrap();
        dest.make_dir(&RelPath::root(), 0o1777, 1_000_000_000, Default::default())
            .unwrap();
        dest.make_dir(&rel(b"a"), 0o750, 1_000_000_000, Default::default())
            .unwrap();
        dest.make_dir(&rel(b"a/b"), 0o700, 2_000_000_000, Default::default())
            .unwrap();
        dest.make_dir(&rel(b"a/shut"), 0o000, 3_000_000_000, Default::default())
            .unwrap();
        dest.make_dir(&rel(b"swapped"), 0o777, 0, Default::default())
            .unwrap();
        // Before the end, `swapped` becomes a link to a directory inside
        // the base.
        std::fs::create_dir(t.path().join("target")).unwrap();
        std::fs::set_permissions(
            t.path().join("target"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::remove_dir(t.path().join("swapped")).unwrap();
        std::os::unix::fs::symlink("target", t.path().join("swapped")).unwrap();
        let err = dest.finish_dirs().expect_err("the link is refused");
        assert!(
            err.to_string().contains("swapped: is a symbolic link"),
            "{err}"
        );
        assert_eq!(
            mode(&t.path().join("target")),
            0o755,
            "the link's target untouched"
        );
        assert_eq!(mode(t.path()), 0o755, "the base's mode untouched");
        // (Its entries changed it, not the far side's 1 s after the epoch.)
        assert!(
            std::fs::metadata(t.path()).unwrap().modified().unwrap() >= base_mtime,
            "the base's mtime is not the far side's"
        );
        assert_eq!(mode(&t.path().join("a")), 0o750);
        assert_eq!(mode(&t.path().join("a/b")), 0o700);
        assert_eq!(mode(&t.path().join("a/shut")), 0);
        let mtime = |p: &str| {
            let m = std::fs::metadata(t.path().join(p)).unwrap();
            std::os::unix::fs::MetadataExt::mtime(&m)
        };
        assert_eq!((mtime("a"), mtime("a/b"), mtime("a/shut")), (1, 2, 3));
        std::fs::set_permissions(
            t.path().join("a/shut"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
    }

    /// A link entry where a directory of that name is: refused, and no
    /// stray `.NAME.lh-link` left behind.
    #[test]
    fn a_link_over_a_directory_leaves_no_stray_name() {
        let t = tempfile::tempdir().unwrap();
        let base = Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap();
        let mut dest = DestDir::new(base);
        let x = RelPath::from_wire(b"x").unwrap();
        dest.make_dir(&x, 0o755, 0, Default::default()).unwrap();
        std::fs::write(t.path().join("x/in"), b"kept").unwrap();
        dest.make_symlink(&x, b"target", 0, &Default::default())
            .expect_err("refused");
        let names: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x")]);
        assert_eq!(std::fs::read(t.path().join("x/in")).unwrap(), b"kept");
    }

    #[test]
    fn received_modes_lose_special_and_world_write_bits_unless_exact() {
        assert_eq!(received_mode(0o106777, false), 0o775);
        assert_eq!(received_mode(0o1777, false), 0o775);
        assert_eq!(received_mode(0o644, false), 0o644);
        assert_eq!(received_mode(0o106777, true), 0o6777);
    }

    /// A file made with its final mode keeps it; one made with other bits
    /// (the umask's, or a setuid bit, which is never made) is given its mode,
    /// and its owner where that differs. Owners other than one's own need
    /// root (as in CI); without it those cases are left out.
    #[test]
    fn apply_meta_gives_the_mode_and_owner_whatever_the_file_was_made_with() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let dir = File::open(t.path()).unwrap();
        let me = crate::meta::Applied {
            owner: Some(unsafe { (libc::geteuid(), libc::getegid()) }),
            xattrs: vec![],
        };
        let root = unsafe { libc::geteuid() } == 0;
        let other = crate::meta::Applied {
            owner: Some((4321, 4321)),
            xattrs: vec![],
        };
        // (made with, wanted, owner)
        let mut cases = vec![
            (0o640, 0o640, None),
            (0o640, 0o640, Some(&me)),
            (0o600, 0o644, Some(&me)),
            // What the umask takes (write bits, as a rule) is set after all.
            (0o666, 0o666, None),
            (0o777, 0o757, None),
        ];
        if root {
            // A setuid bit is never made, only set; a chown clears it.
            cases.push((0o755, 0o4755, Some(&me)));
            cases.push((0o755, 0o4755, Some(&other)));
            cases.push((0o640, 0o640, Some(&other)));
        }
        for (made, want, owner) in cases {
            let f = crate::unnamed::create_with(&dir, made).unwrap().unwrap();
            apply_meta(&f, want, 1_600_000_000_000_000_000, owner).unwrap();
            let m = f.metadata().unwrap();
            assert_eq!(m.mode() & 0o7777, want, "made {made:o}, wanted {want:o}");
            let (u, g) = owner.and_then(|o| o.owner).unwrap_or((m.uid(), m.gid()));
            assert_eq!((m.uid(), m.gid()), (u, g), "made {made:o}, wanted {want:o}");
            assert_eq!(m.mtime(), 1_600_000_000);
        }
    }

    #[test]
    fn absurd_sizes_are_refused_before_allocating() {
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let err = Incoming::open(dir, b"f", &entry(1 << 52), false, WAIT)
            .err()
            .unwrap();
        assert!(err.to_string().contains("larger than"), "{err}");
    }

    /// Names in `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Opens `name` (one chunk), writes `bytes` as the writer does, and
    /// settles it with the sender's hash `expected` as known at that moment.
    fn write_single(
        dir: &Arc<Dir>,
        name: &[u8],
        bytes: &[u8],
        expected: Option<Digest>,
    ) -> (Incoming, Settled) {
        let e = Entry {
            path: name.to_vec(),
            ..entry(bytes.len() as u64)
        };
        let (mut inc, want) = Incoming::open(dir.clone(), name, &e, true, WAIT).unwrap();
        assert_eq!(want, vec![(0, 1)]);
        assert!(inc.single_chunk());
        inc.expected = expected;
        let file = Writer::plain(inc.file().unwrap());
        let d = Incoming::write_chunk(&file, &inc.plan, 0, &[bytes]).unwrap();
        let settled = inc.placer().settle(&file, d, false).unwrap();
        drop(file);
        inc.settled(&settled);
        inc.record(0, d);
        (inc, settled)
    }

    fn assert_placed(path: &Path, bytes: &[u8]) {
        assert_eq!(std::fs::read(path).unwrap(), bytes);
        let m = std::fs::metadata(path).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o640);
        assert_eq!(
            crate::manifest::system_time_ns(m.modified().unwrap()),
            entry(0).mtime_ns
        );
    }

    #[test]
    fn a_one_chunk_file_is_placed_by_its_writer_or_parked_until_its_hash_comes() {
        let t = tempfile::tempdir().unwrap();
        let mut dest = DestDir::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let (dir, _) = dest.parent_of(&RelPath::from_wire(b"a").unwrap()).unwrap();
        let bytes = data(10_000);
        let hash = *blake3::hash(&bytes).as_bytes();

        // The hash came first: the writer places the file; no part at any time.
        // An earlier, interrupted run of a larger version left a part and a journal.
        std::fs::write(t.path().join(".a.lh-part"), data(3 * CHUNK_SIZE as usize)).unwrap();
        std::fs::write(t.path().join(".a.lh-journal"), b"stale").unwrap();
        let (_, settled) = write_single(&dir, b"a", &bytes, Some(hash));
        assert_eq!(settled, Settled::Placed(hash));
        assert_eq!(
            listing(t.path()),
            ["a"],
            "nothing of the earlier run is left"
        );
        assert_placed(&t.path().join("a"), &bytes);

        // The hash comes after the data: the file waits under its part name,
        // its descriptor closed, and finish renames it.
        let (mut inc, settled) = write_single(&dir, b"b", &bytes, None);
        assert_eq!(settled, Settled::Parked);
        assert_eq!(listing(t.path()), [".b.lh-part", "a"]);
        inc.expected = Some(hash);
        assert!(inc.is_complete());
        inc.finish().unwrap();
        assert_eq!(listing(t.path()), ["a", "b"]);
        assert_placed(&t.path().join("b"), &bytes);

        // The data is not what the sender hashed: nothing is placed.
        let other = *blake3::hash(b"other").as_bytes();
        let (mut inc, settled) = write_single(&dir, b"c", &bytes, Some(other));
        assert!(matches!(settled, Settled::Mismatch { .. }), "{settled:?}");
        inc.discard();
        assert_eq!(listing(t.path()), ["a", "b"]);

        // A name already taken is replaced, as a rename would.
        std::fs::write(t.path().join("a"), b"old").unwrap();
        let (_, settled) = write_single(&dir, b"a", &bytes, Some(hash));
        assert_eq!(settled, Settled::Placed(hash));
        assert_eq!(listing(t.path()), ["a", "b"]);
        assert_placed(&t.path().join("a"), &bytes);

        // An empty file has no write: finish creates and places it.
        let e0 = Entry {
            path: b"empty".to_vec(),
            ..entry(0)
        };
        let (mut inc, want) = Incoming::open(dir, b"empty", &e0, true, WAIT).unwrap();
        assert!(want.is_empty());
        inc.expected = Some(*blake3::hash(b"").as_bytes());
        inc.finish().unwrap();
        assert_eq!(listing(t.path()), ["a", "b", "empty"]);
        assert_placed(&t.path().join("empty"), b"");
    }

    #[test]
    fn a_restart_empties_the_journal_before_it_touches_the_part() {
        // A first run journals two chunks; a run that starts over (no resume:
        // `--sync --checksum`) fails on the part. Had it truncated the part
        // first and died, the records left would pass zeros for data on resume.
        let t = tempfile::tempdir().unwrap();
        let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 3 * CHUNK_SIZE + 100;
        let (bytes, e) = (data(size as usize), entry(size));
        let (mut inc, _) = Incoming::open(dir.clone(), b"f", &e, true, WAIT).unwrap();
        for i in [0u64, 2] {
            put_chunk(&mut inc, &bytes, i);
        }
        inc.flush_journal().unwrap();
        drop(inc);
        let journal = t.path().join(".f.lh-journal");
        let records = |p: &Path| {
            journal::read(std::fs::File::open(p).unwrap(), 4)
                .unwrap()
                .map_or(0, |p| p.synced.len())
        };
        assert_eq!(records(&journal), 2);
        // The part cannot be opened now (a directory took its name): the
        // restart fails on it (taking its lock) before it touches anything.
        let part = t.path().join(".f.lh-part");
        std::fs::remove_file(&part).unwrap();
        std::fs::create_dir(&part).unwrap();
        assert!(Incoming::open(dir.clone(), b"f", &e, false, WAIT).is_err());
        assert!(part.is_dir());
        // A restart that gets the part empties the journal first.
        std::fs::remove_dir(&part).unwrap();
        std::fs::write(&part, &bytes).unwrap();
        let (inc, _) = Incoming::open(dir.clone(), b"f", &e, false, WAIT).unwrap();
        assert_eq!(records(&journal), 0, "no record outlives a restart");
        drop(inc);
        // Records of a part that is gone are not trusted.
        let (mut inc, _) = Incoming::open(dir.clone(), b"f", &e, true, WAIT).unwrap();
        for i in [0u64, 2] {
            put_chunk(&mut inc, &bytes, i);
        }
        inc.flush_journal().unwrap();
        drop(inc);
        std::fs::remove_file(&part).unwrap();
        let (_, want) = Incoming::open(dir, b"f", &e, true, WAIT).unwrap();
        assert_eq!(want, vec![(0, 4)], "a resume trusts nothing");
    }

    #[test]
    fn resume_keeps_journaled_chunks_and_verifies() {
        let t = tempfile::tempdir().unwrap();
        let mut dest = DestDir::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 3 * CHUNK_SIZE + 100;
        let bytes = data(size as usize);
        let e = entry(size);
        let path = RelPath::from_wire(b"sub/f").unwrap();
        let (dir, name) = dest.parent_of(&path).unwrap();

        // First run: chunks 0 and 2 arrive, then the run dies.
        let (mut inc, want) = Incoming::open(dir.clone(), &name, &e, true, WAIT).unwrap();
        assert_eq!(want, vec![(0, 4)]);
        for i in [0u64, 2] {
            put_chunk(&mut inc, &bytes, i);
        }
        inc.flush_journal().unwrap();
        drop(inc);
        assert!(
            !t.path().join("sub/f").exists(),
            "nothing under the final name"
        );

        // Second run: only chunks 1 and 3 are wanted.
        let (mut inc, want) = Incoming::open(dir.clone(), &name, &e, true, WAIT).unwrap();
        assert_eq!(want, vec![(1, 2), (3, 4)]);
        assert_eq!(inc.resumed_bytes, 2 * CHUNK_SIZE);
        for i in [1u64, 3] {
            assert!(inc.check_record(i, inc.plan.len(i).unwrap()).is_ok());
            put_chunk(&mut inc, &bytes, i);
        }
        assert!(inc
            .check_record(1, CHUNK_SIZE)
            .unwrap_err()
            .contains("twice"));
        // A chunk being written (claimed, not yet recorded) is refused too.
        let mut other = Incoming::open(dir.clone(), b"g", &e, false, WAIT)
            .unwrap()
            .0;
        assert!(other.check_record(2, CHUNK_SIZE).is_ok());
        other.claim(2);
        assert!(other
            .check_record(2, CHUNK_SIZE)
            .unwrap_err()
            .contains("twice"));
        other.discard();
        assert!(!inc.is_complete());
        inc.expected = Some(*blake3::hash(&bytes).as_bytes());
        assert!(inc.is_complete());
        inc.finish().unwrap();
        assert_eq!(std::fs::read(t.path().join("sub/f")).unwrap(), bytes);
        let m = std::fs::metadata(t.path().join("sub/f")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o640);
        assert_eq!(
            crate::manifest::system_time_ns(m.modified().unwrap()),
            e.mtime_ns
        );
        let left: Vec<_> = std::fs::read_dir(t.path().join("sub")).unwrap().collect();
        assert_eq!(left.len(), 1, "part and journal removed");
    }

    #[test]
    fn a_checkpoint_journals_only_what_it_took_and_nothing_after_the_file_is_placed() {
        let t = tempfile::tempdir().unwrap();
        let mut dest = DestDir::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 3 * CHUNK_SIZE;
        let bytes = data(size as usize);
        let e = entry(size);
        let (dir, name) = dest.parent_of(&RelPath::from_wire(b"f").unwrap()).unwrap();
        let write = |inc: &mut Incoming, i: u64| put_chunk(inc, &bytes, i);

        // Chunk 0 is taken for a checkpoint; chunk 1 arrives after; the run dies
        // without the drop's flush (as a killed process would).
        let (mut inc, _) = Incoming::open(dir.clone(), &name, &e, true, WAIT).unwrap();
        assert!(
            inc.take_checkpoint(true).unwrap().is_none(),
            "nothing written yet"
        );
        write(&mut inc, 0);
        let cp = inc.take_checkpoint(true).unwrap().unwrap();
        write(&mut inc, 1);
        cp.commit().unwrap();
        // The killed process's lock and claim on the file go with it.
        inc.park().unwrap();
        std::mem::forget(inc);
        RECEIVING
            .lock()
            .unwrap()
            .remove(&Claim::key(&dir, &name).unwrap());
        let (mut inc, want) = Incoming::open(dir.clone(), &name, &e, true, WAIT).unwrap();
        assert_eq!(want, vec![(1, 3)], "the journal names chunk 0 only");

        // A checkpoint taken before the file is placed and committed after it
        // leaves no journal behind.
        write(&mut inc, 1);
        let late = inc.take_checkpoint(true).unwrap().unwrap();
        write(&mut inc, 2);
        inc.expected = Some(*blake3::hash(&bytes).as_bytes());
        inc.finish().unwrap();
        late.commit().unwrap();
        assert_eq!(std::fs::read(t.path().join("f")).unwrap(), bytes);
        let left: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no part, no journal: {left:?}");
    }

    #[test]
    fn mismatch_discards_and_changed_source_restarts() {
        let t = tempfile::tempdir().unwrap();
        let mut dest = DestDir::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
        let size = 2 * CHUNK_SIZE;
        let bytes = data(size as usize);
        let e = entry(size);
        let (dir, name) = dest.parent_of(&RelPath::from_wire(b"f").unwrap()).unwrap();
        let (mut inc, _) = Incoming::open(dir.clone(), &name, &e, true, WAIT).unwrap();
        put_chunk(&mut inc, &bytes, 0);
        inc.flush_journal().unwrap();
        drop(inc);
        // The source changed (other mtime): the journal is not trusted.
        let mut e2 = e.clone();
        e2.mtime_ns += 1;
        let (mut inc, want) = Incoming::open(dir.clone(), &name, &e2, true, WAIT).unwrap();
        assert_eq!(want, vec![(0, 2)]);
        for i in 0..2u64 {
            put_chunk(&mut inc, &bytes, i);
        }
        inc.expected = Some([0u8; 32]);
        match inc.finish() {
            Err(FinishError::Mismatch { expected, .. }) => assert_eq!(expected, "0".repeat(64)),
            other => panic!("expected mismatch, got {other:?}"),
        }
        assert_eq!(
            std::fs::read_dir(t.path()).unwrap().count(),
            0,
            "nothing left behind"
        );
    }

    #[test]
    fn planted_symlinks_do_not_lead_writes_outside() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("d/esc")).unwrap();
        let mut dest =
            DestDir::new(Dir::open_ambient_dir(t.path().join("d"), ambient_authority()).unwrap());
        let p = RelPath::from_wire(b"esc/passwd").unwrap();
        assert!(dest.parent_of(&p).is_err());
        // A link at the target name is replaced, not written through.
        std::fs::write(outside.path().join("victim"), b"keep").unwrap();
        std::os::unix::fs::symlink(outside.path().join("victim"), t.path().join("d/v")).unwrap();
        let (dir, name) = dest.parent_of(&RelPath::from_wire(b"v").unwrap()).unwrap();
        let (mut inc, _) = Incoming::open(dir, &name, &entry(3), false, WAIT).unwrap();
        let file = Writer::plain(inc.file().unwrap());
        let d = Incoming::write_chunk(&file, &inc.plan, 0, &[b"new"]).unwrap();
        inc.record(0, d);
        inc.expected = Some(*blake3::hash(b"new").as_bytes());
        inc.finish().unwrap();
        assert_eq!(
            std::fs::read(outside.path().join("victim")).unwrap(),
            b"keep"
        );
        assert_eq!(std::fs::read(t.path().join("d/v")).unwrap(), b"new");
        assert!(!std::fs::symlink_metadata(t.path().join("d/v"))
            .unwrap()
            .file_type()
            .is_symlink());
    }
}
