//! Files on both ends: the sender's manifest and data source over a set of local
//! paths, and the receiver's crash-safe store.
//!
//! The receiver writes each file to a hidden part file beside its target
//! (`.NAME.lh-part`, as unicast does), confined beneath `--dest` by cap-std. When
//! every byte is in, the file system is synced once, each file's BLAKE3 is checked
//! against the manifest, and only then does it get its mode, mtime and final name.
//! Nothing partial ever stands under a final name; a failed session removes its
//! part files.

use crate::manifest::{Item, Manifest, Segment, MAX_EXTENTS};
use crate::receiver::Store;
use crate::sender::Source;
use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use longhaul_transfer::landing;
use longhaul_transfer::meta::{self, Applied, Policy, Wanted};
use longhaul_transfer::place::{open_read, sibling_name, DestDir, PART};
use longhaul_transfer::walk::Walker;
use longhaul_transfer::{EntryKind, RelPath};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn os(b: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(b))
}

/// Open at most this many part or source files at once.
const MAX_FDS: usize = 64;

/// One local file of the sender's data object.
struct SrcFile {
    root: Arc<Dir>,
    path: RelPath,
}

/// A piece of the data object: `len` bytes of file `file` (an index into
/// the sender's files or the receiver's parts) at `at`, from `obj` in the
/// object.
struct Seg {
    file: usize,
    obj: u64,
    at: u64,
    len: u64,
}

/// The manifest's segments, each with the index of its file among the
/// files in manifest order.
fn segs(m: &Manifest) -> Vec<Seg> {
    let mut index = vec![usize::MAX; m.items.len()];
    let mut n = 0;
    for (i, it) in m.items.iter().enumerate() {
        if it.kind == EntryKind::File {
            index[i] = n;
            n += 1;
        }
    }
    m.segments()
        .into_iter()
        .map(|s: Segment| Seg {
            file: index[s.item],
            obj: s.obj,
            at: s.at,
            len: s.len,
        })
        .collect()
}

/// The sender's view of its paths: manifest plus a [`Source`] over the files.
pub struct FileSet {
    /// Every readable entry under the paths, files hashed: the manifest the session carries.
    pub manifest: Manifest,
    files: Vec<SrcFile>,
    segs: Vec<Seg>,
    open: FdCache,
    /// Problems met while walking (unreadable entries are left out and reported).
    pub skipped: Vec<String>,
}

impl FileSet {
    /// Walk `paths` like rsync ([`landing::local_root_name`]): `dir` is sent as
    /// `dir/...`, `dir/` (or `dir/.`) as its contents.
    /// Every file is hashed (BLAKE3) here; `progress` gets the bytes hashed so far.
    /// Each entry carries its owner, and the extended attributes `want` takes;
    /// a sparse file's holes are left out of the data object.
    pub fn build(
        paths: &[PathBuf],
        want: Wanted,
        mut progress: impl FnMut(u64),
    ) -> io::Result<FileSet> {
        let mut items: Vec<Item> = Vec::new();
        let mut files = Vec::new();
        let mut skipped = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut hashed = 0u64;
        for p in paths {
            let name = landing::local_root_name(p);
            let (root, start, prefix) = if name.is_empty() {
                let root = Dir::open_ambient_dir(p, cap_std::ambient_authority())
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
                (root, RelPath::root(), None)
            } else {
                let parent = match p.parent() {
                    Some(x) if !x.as_os_str().is_empty() => x.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                let root = Dir::open_ambient_dir(&parent, cap_std::ambient_authority())
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", parent.display())))?;
                let rel = RelPath::from_wire(&name)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
                (root, rel.clone(), Some(rel))
            };
            let root = Arc::new(root);
            let mut linked = longhaul_transfer::walk::HardLinks::default();
            let walker = Walker::new(&root, &start)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
            for it in walker {
                let mut it = match it {
                    Ok(it) => it,
                    Err(e) => {
                        skipped.push(e.to_string());
                        continue;
                    }
                };
                if it.kind.is_special() {
                    // (A session carries files, directories and links.)
                    let shown = start
                        .join(&it.path)
                        .map(|p| p.display())
                        .unwrap_or_default();
                    skipped.push(format!(
                        "{shown}: a {} is not sent by multicast",
                        it.kind.name()
                    ));
                    continue;
                }
                let rel = match &prefix {
                    Some(pre) if it.path.is_root() => pre.clone(),
                    Some(pre) => pre.join(&it.path).expect("joined path"),
                    None if it.path.is_root() => continue, // the directory itself
                    None => it.path.clone(),
                };
                if !seen.insert(rel.as_bytes().to_vec()) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{} is named twice by the paths given", rel.display()),
                    ));
                }
                let mut hash = [0u8; 32];
                let mut extents = None;
                let mut xattrs = Vec::new();
                linked.mark(&mut it, rel.as_bytes());
                let (kind, link) = (it.kind, it.link);
                let full = start.join(&it.path).expect("joined path");
                if kind == EntryKind::File {
                    let sparse = it.allocated < it.size;
                    match read_file(&root, &full, sparse, want, &mut |n| progress(hashed + n)) {
                        Ok(r) if r.len == it.size => {
                            (hash, extents, xattrs) = (r.hash, r.extents, r.xattrs);
                            hashed += r.len;
                        }
                        Ok(r) => {
                            return Err(io::Error::other(format!(
                                "{}: changed while being read ({} bytes, then {})",
                                rel.display(),
                                it.size,
                                r.len
                            )))
                        }
                        Err(e) => {
                            skipped.push(format!("{}: {e}", rel.display()));
                            continue;
                        }
                    }
                    files.push(SrcFile {
                        root: root.clone(),
                        path: full,
                    });
                } else if kind == EntryKind::Dir {
                    xattrs = meta::xattrs_at(&root, &full, kind, want).unwrap_or_else(|e| {
                        skipped.push(format!(
                            "{}: its extended attributes are not sent: {e}",
                            rel.display()
                        ));
                        Vec::new()
                    });
                }
                items.push(Item {
                    path: rel.as_bytes().to_vec(),
                    kind,
                    size: if kind == EntryKind::File { it.size } else { 0 },
                    mode: it.mode,
                    mtime_ns: it.mtime_ns,
                    link,
                    hash,
                    extents,
                    owner: Some(meta::owner_of(it.uid, it.gid)),
                    xattrs,
                });
            }
        }
        let manifest = Manifest { items };
        Ok(FileSet {
            segs: segs(&manifest),
            manifest,
            files,
            open: FdCache::default(),
            skipped,
        })
    }

    fn file(&mut self, i: usize) -> io::Result<&File> {
        let f = &self.files[i];
        self.open.get(i, || open_read(&f.root, f.path.as_path()))
    }
}

/// What [`read_file`] found of a file.
struct ReadFile {
    hash: [u8; 32],
    len: u64,
    extents: Option<Vec<(u64, u64)>>,
    xattrs: Vec<meta::Xattr>,
}

/// Hash the file at `path` (all of it, holes read as zeros), and with
/// `sparse` find its data extents; its attributes that `want` takes.
fn read_file(
    root: &Dir,
    path: &RelPath,
    sparse: bool,
    want: Wanted,
    progress: &mut dyn FnMut(u64),
) -> io::Result<ReadFile> {
    use std::os::fd::AsFd;
    let mut f = open_read(root, path.as_path())?;
    let size = f.metadata()?.len();
    let extents = match sparse {
        true => {
            let x = longhaul_transfer::walk::data_extents(&f, size, MAX_EXTENTS)?;
            io::Seek::rewind(&mut f)?; // (SEEK_DATA moved the offset)
            x
        }
        false => None,
    };
    let xattrs = meta::read_xattrs(f.as_fd(), want)?;
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let r = f.read(&mut buf)?;
        if r == 0 {
            break;
        }
        h.update(&buf[..r]);
        n += r as u64;
        progress(n);
    }
    Ok(ReadFile {
        hash: *h.finalize().as_bytes(),
        len: n,
        // (A file that changed size is refused by the caller.)
        extents: extents.filter(|_| n == size),
        xattrs,
    })
}

/// The pieces of `offset..offset + len` of the data object, file by file: (file
/// index, offset in that file, range of the caller's buffer). `span` gives a
/// file's (offset, length) in the object; files are sorted by offset. None if
/// the range runs past the last file.
fn pieces<T>(
    files: &[T],
    mut offset: u64,
    len: usize,
    span: impl Fn(&T) -> (u64, u64),
) -> Option<Vec<(usize, u64, std::ops::Range<usize>)>> {
    // The file holding `offset` (empty files skipped).
    let mut i = files.partition_point(|f| {
        let (o, l) = span(f);
        o + l <= offset
    });
    let mut out = Vec::new();
    let mut done = 0usize;
    while done < len {
        let (fo, fl) = span(files.get(i)?);
        let n = ((fo + fl - offset) as usize).min(len - done);
        out.push((i, offset - fo, done..done + n));
        done += n;
        offset += n as u64;
        i += 1;
    }
    Some(out)
}

/// Open files by index, at most [`MAX_FDS`] at once (all are closed when full).
#[derive(Default)]
struct FdCache(HashMap<usize, File>);

impl FdCache {
    fn get(&mut self, i: usize, open: impl FnOnce() -> io::Result<File>) -> io::Result<&File> {
        if !self.0.contains_key(&i) {
            if self.0.len() >= MAX_FDS {
                self.0.clear();
            }
            self.0.insert(i, open()?);
        }
        Ok(&self.0[&i])
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

impl Source for FileSet {
    fn read_data(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let pieces = pieces(&self.segs, offset, buf.len(), |s| (s.obj, s.len))
            .ok_or_else(|| io::Error::other("read beyond the data object"))?;
        for (seg, off, r) in pieces {
            let (i, at) = (self.segs[seg].file, self.segs[seg].at + off);
            self.file(i)?.read_exact_at(&mut buf[r], at).map_err(|e| {
                let p = self.files[i].path.display();
                io::Error::new(e.kind(), format!("{p}: {e} (did it shrink?)"))
            })?;
        }
        Ok(())
    }
}

/// A part file being received.
struct Part {
    dir: Arc<Dir>,
    name: Vec<u8>,
    /// Its entry in the manifest.
    item: usize,
}

/// The receiver's files beneath a destination directory.
pub struct FileStore {
    dest_dir: PathBuf,
    dest: Option<DestDir>,
    manifest: Option<Manifest>,
    parts: Vec<Part>,
    segs: Vec<Seg>,
    open: FdCache,
    /// How long the last `finish` (sync, verify, rename) took.
    finish_time: std::time::Duration,
    /// Keep the modes sent exactly ([`FileStore::exact_modes`]).
    exact_modes: bool,
    /// Which owners and attributes sent are applied ([`FileStore::meta`]).
    policy: Policy,
    /// Where the sealed sessions taken are kept ([`FileStore::sessions_file`]).
    sessions: Option<PathBuf>,
    /// The sealed sessions taken within the window (with the file's, once
    /// read).
    seen: Vec<(u64, u64)>,
    /// A session was taken and is not yet in the file.
    admitted: bool,
}

impl FileStore {
    /// A store writing beneath `dest` (created if missing).
    pub fn new(dest: &Path) -> io::Result<FileStore> {
        std::fs::create_dir_all(dest)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dest.display())))?;
        Ok(FileStore {
            dest_dir: dest.to_path_buf(),
            dest: None,
            manifest: None,
            parts: Vec::new(),
            segs: Vec::new(),
            open: FdCache::default(),
            finish_time: std::time::Duration::ZERO,
            exact_modes: false,
            policy: Policy::default(),
            sessions: None,
            seen: Vec::new(),
            admitted: false,
        })
    }

    /// Keep the sealed sessions taken within [`REPLAY_WINDOW`] in `file`
    /// (one line each: the session id in hex, when it was made in µs since
    /// the Unix epoch), so that a restarted receiver refuses them too;
    /// without one they are kept in memory only.
    pub fn sessions_file(mut self, file: PathBuf) -> FileStore {
        self.sessions = Some(file);
        self
    }

    /// Keep the modes sent exactly, setuid, setgid, sticky and world-write
    /// bits included (`--exact-modes`); by default they are dropped
    /// ([`longhaul_transfer::place::received_mode`]).
    pub fn exact_modes(mut self, exact: bool) -> FileStore {
        self.exact_modes = exact;
        self
    }

    /// Which owners and extended attributes sent are applied (`user.*` and
    /// ACLs always, when sent; owners and `trusted.*` / `security.*` as the
    /// policy says).
    pub fn meta(mut self, policy: Policy) -> FileStore {
        self.policy = policy;
        self
    }

    /// What the policy applies of `it`'s owner and attributes.
    fn applied(&self, it: &Item) -> Applied {
        let policy = Policy {
            owners: self.policy.owners && it.owner.is_some(),
            ..self.policy
        };
        meta::applied(&it.owner.clone().unwrap_or_default(), &it.xattrs, policy)
    }

    fn file(&mut self, i: usize) -> io::Result<&File> {
        let p = &self.parts[i];
        self.open.get(i, || {
            let mut o = OpenOptions::new();
            o.read(true).write(true).follow(FollowSymlinks::No);
            Ok(p.dir
                .open_with(os(&sibling_name(&p.name, PART)), &o)?
                .into_std())
        })
    }

    fn each_piece(
        &mut self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(&File, u64, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let pieces = pieces(&self.segs, offset, len, |s| (s.obj, s.len))
            .ok_or_else(|| io::Error::other("offset beyond the session's files"))?;
        for (seg, off, r) in pieces {
            let (i, at) = (self.segs[seg].file, self.segs[seg].at + off);
            f(self.file(i)?, at, r)?;
        }
        Ok(())
    }

    fn place_all(&mut self) -> Result<(), String> {
        let m = self.manifest.take().expect("begun");
        let mut dest = self.dest.take().expect("begun");
        // One sync for every part file before any takes its final name.
        longhaul_transfer::place::sync_fs(dest.base()).map_err(|e| format!("sync: {e}"))?;
        self.open.clear();
        for p in &self.parts {
            let it = &m.items[p.item];
            let f = open_read(&p.dir, os(&sibling_name(&p.name, PART)))
                .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(&it.path)))?;
            let mut h = blake3::Hasher::new();
            h.update_reader(&f)
                .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(&it.path)))?;
            if *h.finalize().as_bytes() != it.hash {
                return Err(format!(
                    "{} does not verify (BLAKE3 differs from the manifest)",
                    String::from_utf8_lossy(&it.path)
                ));
            }
            let mode = longhaul_transfer::place::received_mode(it.mode, self.exact_modes);
            let applied = self.applied(it);
            longhaul_transfer::place::apply_meta(&f, mode, it.mtime_ns, Some(&applied))
                .and_then(|_| {
                    p.dir
                        .rename(os(&sibling_name(&p.name, PART)), &p.dir, os(&p.name))
                })
                .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(&it.path)))?;
        }
        self.parts.clear();
        self.segs.clear();
        for it in &m.items {
            let rel = RelPath::from_wire(&it.path).expect("validated");
            match it.kind {
                EntryKind::Symlink => dest
                    .make_symlink(&rel, &it.link, it.mtime_ns, &self.applied(it))
                    .map_err(|e| format!("{}: {e}", rel.display()))?,
                // (Its file is placed: linked to it.)
                EntryKind::HardLink => {
                    let first = RelPath::from_wire(&it.link).expect("validated");
                    dest.make_hardlink(&rel, &first)
                        .map_err(|e| format!("{}: {e}", rel.display()))?
                }
                _ => {}
            }
        }
        dest.finish_dirs().map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// A new part file (mode 0600, `size` bytes of holes) beside the target of
/// `path` beneath `dest`, its directories made: the directory, the
/// target's name, and the part open for reading and writing.
pub(crate) fn new_part(
    dest: &mut DestDir,
    path: &[u8],
    size: u64,
) -> Result<(Arc<Dir>, Vec<u8>, File), String> {
    let rel = RelPath::from_wire(path).map_err(|e| e.to_string())?;
    let (dir, name) = dest
        .parent_of(&rel)
        .map_err(|e| format!("{}: {e}", rel.display()))?;
    let mut o = OpenOptions::new();
    o.write(true)
        .read(true)
        .create(true)
        .truncate(true)
        .follow(FollowSymlinks::No);
    {
        use cap_std::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let f = dir
        .open_with(os(&sibling_name(&name, PART)), &o)
        .and_then(|f| f.set_len(size).map(|_| f))
        .map_err(|e| format!("{}: {e}", rel.display()))?;
    Ok((dir, name, f.into_std()))
}

/// How far a sealed session's making may lie from this receiver's clock
/// (either way) for it to be taken: a session recorded and replayed later
/// than this is refused for its age, sooner by the record of
/// [`FileStore::sessions_file`].
pub const REPLAY_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// This host's clock, µs since the Unix epoch: what a sender stamps a
/// session with ([`crate::SenderConfig::created_us`]) and what a receiver
/// checks it against.
pub fn wall_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

impl FileStore {
    /// [`Store::admit`] at `now_us` (this host's clock, µs since the Unix epoch).
    fn admit_at(&mut self, session: u64, created_us: u64, now_us: u64) -> Result<(), String> {
        let window = REPLAY_WINDOW.as_micros() as u64;
        if created_us.saturating_add(window) < now_us {
            return Err(format!(
                "made {} s ago, more than {} s: a replay (or the sender's clock is that far behind)",
                (now_us - created_us) / 1_000_000,
                REPLAY_WINDOW.as_secs()
            ));
        }
        if created_us > now_us.saturating_add(window) {
            return Err(format!(
                "made {} s from now: the sender's clock is more than {} s ahead",
                (created_us - now_us) / 1_000_000,
                REPLAY_WINDOW.as_secs()
            ));
        }
        // What the file holds (sessions taken before a restart), with what
        // this process took; unreadable, this process's alone.
        if let Some(path) = &self.sessions {
            match std::fs::read_to_string(path) {
                Ok(t) => {
                    for l in t.lines() {
                        let Some((id, at)) = l.split_once(' ') else {
                            continue;
                        };
                        if let (Ok(id), Ok(at)) = (u64::from_str_radix(id, 16), at.parse()) {
                            if !self.seen.iter().any(|&(s, _)| s == id) {
                                self.seen.push((id, at));
                            }
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(
                    "{}: {e}; replays are refused from this run's memory only",
                    path.display()
                ),
            }
        }
        if self.seen.iter().any(|&(id, _)| id == session) {
            return Err("taken before: a replay of a session this receiver has had".into());
        }
        self.seen
            .retain(|&(_, at)| at.saturating_add(window) >= now_us);
        self.seen.push((session, created_us));
        // Kept on disk once the session ends (a receiver restarted during
        // it may still take it: the sender goes on with it).
        self.admitted = true;
        Ok(())
    }

    /// The session taken ended: the sessions taken, kept in the file (a
    /// failure to is logged: it costs only the replay check across a
    /// restart).
    fn record_sessions(&mut self) {
        if !std::mem::take(&mut self.admitted) {
            return;
        }
        let Some(path) = &self.sessions else {
            return;
        };
        let text: String = self
            .seen
            .iter()
            .map(|(id, at)| format!("{id:016x} {at}\n"))
            .collect();
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        let written = (|| {
            if let Some(d) = path.parent() {
                std::fs::create_dir_all(d)?;
            }
            let mut f = File::create(&tmp)?;
            io::Write::write_all(&mut f, text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            tracing::warn!("recording the sessions taken in {}: {e}", path.display());
        }
    }
}

impl Store for FileStore {
    fn admit(&mut self, session: u64, created_us: u64) -> Result<(), String> {
        self.admit_at(session, created_us, wall_clock_us())
    }

    fn begin(&mut self, m: &Manifest) -> Result<(), String> {
        self.drop_parts();
        let base = Dir::open_ambient_dir(&self.dest_dir, cap_std::ambient_authority())
            .map_err(|e| format!("{}: {e}", self.dest_dir.display()))?;
        let mut dest = DestDir::new(base);
        let spans = m.spans();
        let mut parts = Vec::with_capacity(spans.len());
        for it in &m.items {
            let rel = RelPath::from_wire(&it.path).map_err(|e| e.to_string())?;
            if it.kind == EntryKind::Dir {
                let mode = longhaul_transfer::place::received_mode(it.mode, self.exact_modes);
                dest.make_dir(&rel, mode, it.mtime_ns, self.applied(it))
                    .map_err(|e| format!("{}: {e}", rel.display()))?;
            }
        }
        for s in spans {
            let it = &m.items[s.item];
            // (Its holes stay holes: only its data extents are written.)
            let (dir, name, _) = new_part(&mut dest, &it.path, it.size)?;
            parts.push(Part {
                dir,
                name,
                item: s.item,
            });
        }
        self.dest = Some(dest);
        self.manifest = Some(m.clone());
        self.parts = parts;
        self.segs = segs(m);
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.each_piece(offset, data.len(), |f, at, r| f.write_all_at(&data[r], at))
    }

    fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len();
        self.each_piece(offset, len, |f, at, r| f.read_exact_at(&mut buf[r], at))
    }

    fn finish(&mut self) -> Result<(), String> {
        let t = std::time::Instant::now();
        let r = self.place_all();
        self.finish_time = t.elapsed();
        self.record_sessions();
        r
    }

    fn finish_time(&self) -> std::time::Duration {
        self.finish_time
    }

    fn abort(&mut self) {
        self.drop_parts();
        self.record_sessions();
    }
}

impl FileStore {
    /// Remove what `begin` and `write` left.
    fn drop_parts(&mut self) {
        self.open.clear();
        for p in self.parts.drain(..) {
            let _ = p.dir.remove_file(os(&sibling_name(&p.name, PART)));
        }
        self.segs.clear();
        self.manifest = None;
        self.dest = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_taken_once_within_the_window_and_remembered_across_restarts() {
        let t = tempfile::tempdir().unwrap();
        let now = 1_800_000_000_000_000u64;
        let w = REPLAY_WINDOW.as_micros() as u64;
        let file = t.path().join("state/sessions");
        let store = || {
            FileStore::new(&t.path().join("dest"))
                .unwrap()
                .sessions_file(file.clone())
        };
        let mut s = store();
        s.admit_at(1, now - 5_000_000, now).unwrap();
        s.abort();
        s.admit_at(2, now, now).unwrap();
        let e = s.admit_at(1, now - 5_000_000, now).unwrap_err();
        assert!(e.contains("a replay"), "{e}");
        s.abort();
        // A session taken and not ended (the receiver was killed during
        // it) may be taken again after a restart; ended ones may not.
        s.admit_at(7, now, now).unwrap();
        let mut s = store();
        s.admit_at(7, now, now + 1).unwrap();
        s.abort();
        let e = s.admit_at(2, now, now + 1).unwrap_err();
        assert!(e.contains("a replay"), "{e}");
        let e = s.admit_at(3, now - w - 1_000_000, now).unwrap_err();
        assert!(e.starts_with("made 601 s ago"), "{e}");
        let e = s.admit_at(4, now + w + 2_000_000, now).unwrap_err();
        assert!(e.starts_with("made 602 s from now"), "{e}");
        // Entries older than the window are forgotten as new ones come.
        let mut s = store();
        s.admit_at(5, now + w, now + w).unwrap();
        s.abort();
        let kept = std::fs::read_to_string(&file).unwrap();
        assert_eq!(kept.lines().count(), 3, "{kept}");
        assert!(
            !kept.contains("0000000000000001 "),
            "1 is past the window: {kept}"
        );
        assert_eq!(
            std::fs::read_dir(t.path().join("dest")).unwrap().count(),
            0,
            "nothing in the destination"
        );
    }
}
