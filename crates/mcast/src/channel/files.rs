//! A channel's files on both ends: the sender's spool (a directory watched
//! with inotify, its ready files read by id) and the receiver's store (each
//! file into a part file beside its target, verified, given its metadata
//! and named on its own).

use super::recv::{ObjectStore, Resume};
use super::send::ObjectSource;
use crate::manifest::Item;
use cap_std::fs::Dir;
use longhaul_transfer::meta::{self, Applied, Policy, Wanted};
use longhaul_transfer::place::{open_read, sibling_name, DestDir, PART};
use longhaul_transfer::{EntryKind, RelPath};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn os(b: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(b))
}

/// Open at most this many spool files at once.
const MAX_OPEN: usize = 64;

/// The sender's spool: files by id, read from beneath its directory.
pub struct Spool {
    root: Dir,
    paths: HashMap<u32, RelPath>,
    open: HashMap<u32, File>,
}

impl Spool {
    /// A spool beneath `dir`.
    pub fn new(dir: &Path) -> io::Result<Spool> {
        let root = Dir::open_ambient_dir(dir, cap_std::ambient_authority())
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        Ok(Spool {
            root,
            paths: HashMap::new(),
            open: HashMap::new(),
        })
    }

    /// The file at `path` (beneath the spool) is offered as `oid`.
    pub fn add(&mut self, oid: u32, path: RelPath) {
        self.paths.insert(oid, path);
    }

    /// Whether the file at `path` is still the one `item` describes (a
    /// regular file of its size and mtime).
    pub fn unchanged(&self, path: &RelPath, item: &Item) -> bool {
        self.root.symlink_metadata(path.as_path()).is_ok_and(|m| {
            m.is_file()
                && m.len() == item.size
                && m.modified().is_ok_and(|t| {
                    longhaul_transfer::manifest::system_time_ns(t.into_std()) == item.mtime_ns
                })
        })
    }

    /// File `oid` is forgotten by the channel.
    pub fn forget(&mut self, oid: u32) {
        self.paths.remove(&oid);
        self.open.remove(&oid);
    }

    /// The manifest entry of the ready file at `path`: its metadata, owner,
    /// the attributes `want` takes, and its BLAKE3 (the whole file is read).
    pub fn item(&self, path: &RelPath, want: Wanted) -> io::Result<Item> {
        use cap_std::fs::MetadataExt;
        use std::os::fd::AsFd;
        let f = open_read(&self.root, path.as_path())?;
        let m = self.root.symlink_metadata(path.as_path())?;
        if !m.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        let xattrs = meta::read_xattrs(f.as_fd(), want)?;
        let mut h = blake3::Hasher::new();
        let n = io::copy(&mut &f, &mut h)?;
        let size = m.len();
        if n != size {
            return Err(io::Error::other(format!(
                "changed while being read ({size} bytes, then {n})"
            )));
        }
        Ok(Item {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::File,
            size,
            mode: m.mode() & 0o7777,
            mtime_ns: longhaul_transfer::manifest::system_time_ns(m.modified()?.into_std()),
            link: Vec::new(),
            hash: *h.finalize().as_bytes(),
            extents: None,
            owner: Some(meta::owner_of(m.uid(), m.gid())),
            xattrs,
        })
    }
}

impl ObjectSource for Spool {
    fn read(&mut self, oid: u32, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if !self.open.contains_key(&oid) {
            let path = self
                .paths
                .get(&oid)
                .ok_or_else(|| io::Error::other("not in the spool"))?;
            if self.open.len() >= MAX_OPEN {
                self.open.clear();
            }
            let f = open_read(&self.root, path.as_path())?;
            self.open.insert(oid, f);
        }
        self.open[&oid].read_exact_at(buf, offset).map_err(|e| {
            let p = self
                .paths
                .get(&oid)
                .map(|p| p.display())
                .unwrap_or_default();
            io::Error::new(e.kind(), format!("{p}: {e} (did it shrink?)"))
        })
    }
}

/// A directory watched for files that are ready: closed after writing, or
/// renamed into it (at any depth; names that start with a dot are not
/// watched: a producer's temporary files). A directory made or moved in is
/// watched too: the files moved in with it are ready, and those found in
/// a directory just made are ready at their close or once not written for
/// a second (a producer that writes under a dot name and renames is never
/// caught in between).
pub struct Watch {
    fd: Inotify,
    root: PathBuf,
    dirs: HashMap<WatchDescriptor, RelPath>,
    /// The files reported lately, with their size and mtime: a file found
    /// by scanning a new directory and then closed after writing is
    /// reported once.
    recent: HashMap<RelPath, (u64, std::time::SystemTime)>,
    order: std::collections::VecDeque<RelPath>,
    /// Files found in a directory just made, perhaps still being written:
    /// ready at their close, or once unchanged for [`SETTLED`].
    pending: Vec<RelPath>,
}

/// A file found in a directory just made is ready once it has not been
/// written for this long (if its close did not come first).
const SETTLED: std::time::Duration = std::time::Duration::from_secs(1);

/// Files remembered as reported, at most.
const RECENT: usize = 4096;

impl Watch {
    /// Watch `dir` and the directories beneath it.
    pub fn new(dir: &Path) -> io::Result<Watch> {
        let fd = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let mut w = Watch {
            fd,
            root: dir.to_path_buf(),
            dirs: HashMap::new(),
            recent: HashMap::new(),
            order: Default::default(),
            pending: Vec::new(),
        };
        w.add(&RelPath::root(), &mut Vec::new())?;
        Ok(w)
    }

    /// Watch `rel` and what lies beneath it; the files found there go to
    /// `found` (a directory moved in comes with its files).
    fn add(&mut self, rel: &RelPath, found: &mut Vec<RelPath>) -> io::Result<()> {
        let full = self.root.join(rel.as_path());
        let flags = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_ONLYDIR
            | AddWatchFlags::IN_DONT_FOLLOW;
        let wd = self
            .fd
            .add_watch(&full, flags)
            .map_err(|e| io::Error::other(format!("watching {}: {e}", full.display())))?;
        self.dirs.insert(wd, rel.clone());
        for e in std::fs::read_dir(&full)? {
            let e = e?;
            let name = e.file_name();
            if name.as_bytes().starts_with(b".") {
                continue;
            }
            let Ok(child) =
                rel.join(&RelPath::from_wire(name.as_bytes()).map_err(io::Error::other)?)
            else {
                continue;
            };
            let t = e.file_type()?;
            if t.is_dir() {
                self.add(&child, found)?;
            } else if t.is_file() && !rel.is_root() {
                found.push(child);
            }
        }
        Ok(())
    }

    /// The files that became ready since the last call (none if nothing
    /// happened). Call it at least every second: files found in a new
    /// directory are ready from here once settled.
    pub fn ready(&mut self) -> io::Result<Vec<RelPath>> {
        let mut out = Vec::new();
        loop {
            let events = match self.fd.read_events() {
                Ok(ev) => ev,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => return Err(io::Error::other(format!("inotify: {e}"))),
            };
            for ev in events {
                let (Some(dir), Some(name)) = (self.dirs.get(&ev.wd).cloned(), ev.name) else {
                    continue;
                };
                let name = name.as_bytes();
                if name.starts_with(b".") || longhaul_transfer::place::is_reserved_name(name) {
                    continue;
                }
                let Ok(child) = RelPath::from_wire(name).and_then(|n| dir.join(&n)) else {
                    continue;
                };
                let is_dir = ev.mask.contains(AddWatchFlags::IN_ISDIR);
                if is_dir && ev.mask.contains(AddWatchFlags::IN_MOVED_TO) {
                    // A directory moved in: the files in it are ready.
                    let mut found = Vec::new();
                    if self.add(&child, &mut found).is_ok() {
                        out.extend(found);
                    }
                } else if is_dir && ev.mask.contains(AddWatchFlags::IN_CREATE) {
                    // A directory just made: a file already in it may still
                    // be being written (its close comes), or be done (it
                    // was closed before the watch: ready once settled).
                    let mut found = Vec::new();
                    if self.add(&child, &mut found).is_ok() {
                        self.pending.extend(found);
                    }
                } else if !is_dir
                    && ev
                        .mask
                        .intersects(AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO)
                {
                    self.pending.retain(|p| *p != child);
                    out.push(child);
                }
            }
        }
        let now = std::time::SystemTime::now();
        let root = &self.root;
        self.pending.retain(|p| {
            match std::fs::symlink_metadata(root.join(p.as_path())).and_then(|m| m.modified()) {
                Ok(t) if now.duration_since(t).unwrap_or_default() >= SETTLED => {
                    out.push(p.clone());
                    false
                }
                Ok(_) => true,
                Err(_) => false, // gone
            }
        });
        // Each file once, unless it changed since (written again).
        out.retain(|p| self.first_report(p));
        Ok(out)
    }

    /// Whether `p` is reported now: not reported before with its current
    /// size and mtime (one that cannot be read is: its reader will say why).
    fn first_report(&mut self, p: &RelPath) -> bool {
        let Ok(m) = std::fs::symlink_metadata(self.root.join(p.as_path())) else {
            return true;
        };
        let stamp = (m.len(), m.modified().unwrap_or(std::time::UNIX_EPOCH));
        if self.recent.get(p) == Some(&stamp) {
            return false;
        }
        if self.recent.insert(p.clone(), stamp).is_none() {
            self.order.push_back(p.clone());
            while self.order.len() > RECENT {
                if let Some(old) = self.order.pop_front() {
                    self.recent.remove(&old);
                }
            }
        }
        true
    }

    /// The inotify descriptor, to wait on.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

/// A receiver's channel files beneath a destination: each into
/// `.NAME.lh-part` beside its target, synced, verified against its BLAKE3,
/// given its owner, attributes, mode and mtime, then named.
pub struct ChannelStore {
    dest: DestDir,
    parts: HashMap<u32, (Arc<Dir>, Vec<u8>, File, Item)>,
    exact_modes: bool,
    policy: Policy,
}

impl ChannelStore {
    /// A store writing beneath `dest` (created if missing).
    pub fn new(dest: &Path, exact_modes: bool, policy: Policy) -> io::Result<ChannelStore> {
        std::fs::create_dir_all(dest)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dest.display())))?;
        let base = Dir::open_ambient_dir(dest, cap_std::ambient_authority())
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dest.display())))?;
        Ok(ChannelStore {
            dest: DestDir::new(base),
            parts: HashMap::new(),
            exact_modes,
            policy,
        })
    }

    fn applied(&self, it: &Item) -> Applied {
        let policy = Policy {
            owners: self.policy.owners && it.owner.is_some(),
            ..self.policy
        };
        meta::applied(&it.owner.clone().unwrap_or_default(), &it.xattrs, policy)
    }

    fn place(&mut self, oid: u32) -> Result<(), String> {
        let (dir, name, f, it) = self.parts.remove(&oid).ok_or("not begun")?;
        let part = sibling_name(&name, PART);
        let shown = String::from_utf8_lossy(&it.path).into_owned();
        let r = (|| -> io::Result<Result<(), String>> {
            f.sync_data()?;
            let mut h = blake3::Hasher::new();
            h.update_reader(open_read(&dir, os(&part))?)?;
            if *h.finalize().as_bytes() != it.hash {
                return Ok(Err(format!(
                    "{shown} does not verify (BLAKE3 differs from its OFFER)"
                )));
            }
            let mode = longhaul_transfer::place::received_mode(it.mode, self.exact_modes);
            longhaul_transfer::place::apply_meta(&f, mode, it.mtime_ns, Some(&self.applied(&it)))?;
            dir.rename(os(&part), &dir, os(&name))?;
            Ok(Ok(()))
        })();
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                let _ = dir.remove_file(os(&part));
                Err(e)
            }
            Err(e) => {
                let _ = dir.remove_file(os(&part));
                Err(format!("{shown}: {e}"))
            }
        }
    }
}

impl ObjectStore for ChannelStore {
    fn begin(&mut self, oid: u32, item: &Item) -> Result<(), String> {
        let (dir, name, f) = crate::store::new_part(&mut self.dest, &item.path, item.size)?;
        self.parts.insert(oid, (dir, name, f, item.clone()));
        Ok(())
    }

    fn write(&mut self, oid: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        let (_, _, f, _) = self
            .parts
            .get(&oid)
            .ok_or_else(|| io::Error::other("not begun"))?;
        f.write_all_at(data, offset)
    }

    fn finish(&mut self, oid: u32) -> Result<(), String> {
        self.place(oid)
    }

    fn abort(&mut self, oid: u32) {
        if let Some((dir, name, _, _)) = self.parts.remove(&oid) {
            let _ = dir.remove_file(os(&sibling_name(&name, PART)));
        }
    }
}

impl Drop for ChannelStore {
    fn drop(&mut self) {
        let oids: Vec<u32> = self.parts.keys().copied().collect();
        for oid in oids {
            self.abort(oid);
        }
    }
}

/// Where a receiver stood on a channel, kept in `file` (a line: the
/// channel in hex, the id below which it has every file, then the ids
/// above it has, comma-separated); None if there is none or it is unreadable.
pub fn read_resume(file: &Path) -> Option<Resume> {
    let t = std::fs::read_to_string(file).ok()?;
    let mut w = t.split_whitespace();
    let channel = u64::from_str_radix(w.next()?, 16).ok()?;
    let below = w.next()?.parse().ok()?;
    let done = match w.next() {
        Some(d) => d.split(',').filter_map(|x| x.parse().ok()).collect(),
        None => Vec::new(),
    };
    Some(Resume {
        channel,
        below,
        done,
    })
}

/// Keep `r` in `file` (written aside and renamed: a crash leaves the old one).
pub fn write_resume(file: &Path, r: &Resume) -> io::Result<()> {
    if let Some(d) = file.parent() {
        std::fs::create_dir_all(d)?;
    }
    let done: Vec<String> = r.done.iter().map(|d| d.to_string()).collect();
    let text = format!("{:016x} {} {}\n", r.channel, r.below, done.join(","));
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file)
}

/// A channel sender's record on disk, so that a restarted sender takes
/// up the same channel (its id, its file ids) and still holds what its
/// backlog held: one JSON line per event, appended (`offer` with the file's
/// id, path, ready time and entry; `forget`; now and then `receivers`, each
/// with the id below which it had every file), rewritten whole when the
/// lines are far more than what is held.
pub struct Journal {
    path: PathBuf,
    file: File,
    lines: usize,
}

/// What a journal held when it was opened.
#[derive(Debug, Default, PartialEq)]
pub struct Kept {
    /// The channel's id (None: a new channel).
    pub channel: Option<u64>,
    /// The next file id.
    pub next_oid: u32,
    /// Files held: (id, path, ready µs since the epoch, entry).
    pub files: Vec<(u32, String, u64, Item)>,
    /// Receivers: (name, every file below this id had).
    pub receivers: Vec<(String, u32)>,
    /// Ids reserved but with no offer on record (a power loss took the
    /// last lines): they may have been used, so they are not used again;
    /// a receiver that asks is told they are gone.
    pub unrecorded: std::ops::Range<u32>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Line {
    Channel(String),
    Offer {
        oid: u32,
        path: String,
        ready_us: u64,
        item: Box<Item>,
    },
    Forget(u32),
    Receivers(Vec<(String, u32)>),
    /// Ids below this may be in use (reserved before they are).
    Next(u32),
    /// Ids below this were used, each on record; none above (written
    /// when rewritten and at a clean stop).
    Used(u32),
}

impl Journal {
    /// Opens (or starts) the journal at `path`: what it kept, and the
    /// journal, rewritten compact under `channel` (the kept id, or a new
    /// one when it kept none). A line cut short by a crash ends it.
    pub fn open(path: &Path, new_channel: u64) -> io::Result<(Journal, Kept)> {
        let mut kept = Kept::default();
        let mut files: std::collections::BTreeMap<u32, (String, u64, Item)> = Default::default();
        let (mut used, mut reserved) = (0, 0);
        if let Ok(text) = std::fs::read_to_string(path) {
            for l in text.lines() {
                let Ok(line) = serde_json::from_str::<Line>(l) else {
                    break;
                };
                match line {
                    Line::Channel(c) => kept.channel = u64::from_str_radix(&c, 16).ok(),
                    Line::Offer {
                        oid,
                        path,
                        ready_us,
                        item,
                    } => {
                        used = used.max(oid + 1);
                        files.insert(oid, (path, ready_us, *item));
                    }
                    Line::Forget(oid) => {
                        files.remove(&oid);
                    }
                    Line::Receivers(r) => kept.receivers = r,
                    Line::Next(n) => reserved = reserved.max(n),
                    Line::Used(n) => (used, reserved) = (n, n),
                }
            }
        }
        if kept.channel.is_none() {
            kept = Kept::default();
            files.clear();
        }
        // Ids run on past the reservation: those reserved beyond the last
        // offer on record may have been used.
        kept.unrecorded = used..reserved.max(used);
        kept.next_oid = used.max(reserved);
        kept.files = files
            .into_iter()
            .map(|(oid, (p, r, i))| (oid, p, r, i))
            .collect();
        let channel = kept.channel.unwrap_or(new_channel);
        let j = Journal::rewrite(
            path,
            channel,
            (kept.next_oid, kept.next_oid),
            &kept.files,
            &kept.receivers,
        )?;
        Ok((j, kept))
    }

    fn rewrite(
        path: &Path,
        channel: u64,
        (used, reserved): (u32, u32),
        files: &[(u32, String, u64, Item)],
        receivers: &[(String, u32)],
    ) -> io::Result<Journal> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let mut text = json_line(&Line::Channel(format!("{channel:016x}")));
        text += &json_line(&Line::Used(used));
        text += &json_line(&Line::Next(reserved));
        for (oid, p, ready_us, item) in files {
            text += &json_line(&Line::Offer {
                oid: *oid,
                path: p.clone(),
                ready_us: *ready_us,
                item: Box::new(item.clone()),
            });
        }
        text += &json_line(&Line::Receivers(receivers.to_vec()));
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, text)?;
        File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, path)?;
        let file = std::fs::OpenOptions::new().append(true).open(path)?;
        Ok(Journal {
            path: path.to_path_buf(),
            file,
            lines: 4 + files.len(),
        })
    }

    fn append(&mut self, line: &Line) -> io::Result<()> {
        use std::io::Write;
        self.lines += 1;
        self.file.write_all(json_line(line).as_bytes())
    }

    /// File `oid` (at `path` beneath the spool, ready at `ready_us`) is offered.
    pub fn offered(&mut self, oid: u32, path: &str, ready_us: u64, item: &Item) -> io::Result<()> {
        self.append(&Line::Offer {
            oid,
            path: path.into(),
            ready_us,
            item: Box::new(item.clone()),
        })
    }

    /// File `oid` is forgotten.
    pub fn forgotten(&mut self, oid: u32) -> io::Result<()> {
        self.append(&Line::Forget(oid))
    }

    /// Ids below `upto` may be used (synced to disk before they are).
    pub fn reserve(&mut self, upto: u32) -> io::Result<()> {
        self.append(&Line::Next(upto))?;
        self.file.sync_data()
    }

    /// A clean stop: ids below `next_oid` were used, each on record, and
    /// no other.
    pub fn stopped(&mut self, next_oid: u32) -> io::Result<()> {
        self.append(&Line::Used(next_oid))?;
        self.file.sync_data()
    }

    /// Where the receivers stand (now and then; synced to disk). With
    /// `held` (the files held now) and the ids reserved, the journal is
    /// rewritten compact once its lines are more than twice those and a
    /// thousand.
    pub fn receivers(
        &mut self,
        channel: u64,
        ids: (u32, u32),
        receivers: &[(String, u32)],
        held: impl FnOnce() -> Vec<(u32, String, u64, Item)>,
    ) -> io::Result<()> {
        if self.lines > 1000 {
            let held = held();
            if self.lines > 2 * held.len() + 1000 {
                *self = Journal::rewrite(&self.path, channel, ids, &held, receivers)?;
                return Ok(());
            }
        }
        self.append(&Line::Receivers(receivers.to_vec()))?;
        self.file.sync_data()
    }
}

fn json_line(l: &Line) -> String {
    let mut s = serde_json::to_string(l).expect("a journal line");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, size: u64) -> Item {
        Item {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::File,
            size,
            mode: 0o644,
            mtime_ns: 7,
            link: vec![],
            hash: [3; 32],
            extents: None,
            owner: None,
            xattrs: vec![],
        }
    }

    #[test]
    fn a_journal_gives_a_restarted_sender_its_channel_and_what_it_held() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("state/channel-send-x");
        let (mut j, kept) = Journal::open(&f, 0xfeed).unwrap();
        assert_eq!(kept, Kept::default(), "a new channel");
        for oid in 0..5 {
            let p = format!("p{oid}");
            j.offered(oid, &p, 1000 + u64::from(oid), &entry(&p, 10))
                .unwrap();
        }
        j.forgotten(1).unwrap();
        j.receivers(
            0xfeed,
            (5, 5),
            &[("a".into(), 2), ("b".into(), 4)],
            Vec::new,
        )
        .unwrap();
        drop(j);
        // A crash in the middle of a line: the rest of it is not taken.
        let mut text = std::fs::read_to_string(&f).unwrap();
        text += r#"{"offer":{"oid":9,"path":"p9""#;
        std::fs::write(&f, text).unwrap();
        let (mut j, kept) = Journal::open(&f, 0xbeef).unwrap();
        assert_eq!(kept.channel, Some(0xfeed));
        assert_eq!(kept.next_oid, 5);
        let ids: Vec<u32> = kept.files.iter().map(|x| x.0).collect();
        assert_eq!(ids, [0, 2, 3, 4]);
        assert_eq!(kept.files[1], (2, "p2".into(), 1002, entry("p2", 10)));
        assert_eq!(kept.receivers, vec![("a".into(), 2), ("b".into(), 4)]);
        // Many events: rewritten compact, to what is held.
        for oid in 5..2000 {
            j.offered(oid, "q", 1, &entry("q", 1)).unwrap();
            j.forgotten(oid).unwrap();
        }
        let before = std::fs::metadata(&f).unwrap().len();
        let held = kept.files.clone();
        j.receivers(0xfeed, (2000, 2000), &[("a".into(), 4)], || held)
            .unwrap();
        assert!(std::fs::metadata(&f).unwrap().len() < before / 100);
        drop(j);
        let (_, again) = Journal::open(&f, 1).unwrap();
        assert_eq!(again.channel, Some(0xfeed));
        assert_eq!(again.files, kept.files);
        assert_eq!(again.receivers, vec![("a".into(), 4)]);
        // Ids are never used twice, though none of the last is held.
        assert_eq!(again.next_oid, 2000);
        // Ids reserved and then a power loss (no offer on record beyond
        // 1999): the next sender starts above the reservation, and the ids
        // in between are known to be unrecorded.
        let (mut j, _) = Journal::open(&f, 1).unwrap();
        j.reserve(2064).unwrap();
        drop(j);
        let (mut j, k) = Journal::open(&f, 1).unwrap();
        assert_eq!((k.next_oid, k.unrecorded.clone()), (2064, 2000..2064));
        // A clean stop (ids reserved, fewer used): nothing unrecorded.
        j.reserve(2128).unwrap();
        j.stopped(2070).unwrap();
        drop(j);
        let (_, k) = Journal::open(&f, 1).unwrap();
        assert_eq!((k.next_oid, k.unrecorded.clone()), (2070, 2070..2070));
        // Not a journal: a new channel.
        std::fs::write(&f, "junk").unwrap();
        let (_, none) = Journal::open(&f, 2).unwrap();
        assert_eq!(none, Kept::default());
    }

    #[test]
    fn a_resume_point_survives_the_file() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("state/channel-x");
        let r = Resume {
            channel: 0xabc,
            below: 17,
            done: vec![19, 22],
        };
        write_resume(&f, &r).unwrap();
        assert_eq!(read_resume(&f), Some(r));
        std::fs::write(&f, "junk").unwrap();
        assert_eq!(read_resume(&f), None);
    }

    #[test]
    fn a_file_is_ready_once_when_it_is_closed_or_renamed_in_at_any_depth() {
        use std::io::Write;
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("old"), b"there before").unwrap();
        let mut w = Watch::new(t.path()).unwrap();
        let names = |v: Vec<RelPath>| -> Vec<String> { v.iter().map(|p| p.display()).collect() };
        assert!(
            w.ready().unwrap().is_empty(),
            "files there before are not new"
        );
        std::fs::write(t.path().join("a"), b"1").unwrap();
        std::fs::write(t.path().join(".b"), b"2").unwrap();
        std::fs::rename(t.path().join(".b"), t.path().join("b")).unwrap();
        assert_eq!(names(w.ready().unwrap()), ["a", "b"]);
        // A directory made, and a file in it written before the directory is
        // watched and closed after (the scan finds it, then its close comes):
        // once.
        std::fs::create_dir(t.path().join("d")).unwrap();
        let mut f = std::fs::File::create(t.path().join("d/c")).unwrap();
        f.write_all(b"3").unwrap();
        assert!(w.ready().unwrap().is_empty(), "still being written");
        f.write_all(b"3").unwrap();
        drop(f);
        assert_eq!(names(w.ready().unwrap()), ["d/c"]);
        assert!(w.ready().unwrap().is_empty());
        // One closed before its directory was watched: ready once settled.
        std::fs::create_dir(t.path().join("e")).unwrap();
        std::fs::write(t.path().join("e/done"), b"5").unwrap();
        assert!(w.ready().unwrap().is_empty());
        std::thread::sleep(SETTLED + std::time::Duration::from_millis(100));
        assert_eq!(names(w.ready().unwrap()), ["e/done"]);
        assert!(w.ready().unwrap().is_empty());
        // Written again: ready again.
        std::fs::write(t.path().join("d/c"), b"33").unwrap();
        assert_eq!(names(w.ready().unwrap()), ["d/c"]);
        // A directory moved in with its files.
        std::fs::create_dir_all(t.path().join(".x/y")).unwrap();
        std::fs::write(t.path().join(".x/y/z"), b"4").unwrap();
        std::fs::rename(t.path().join(".x"), t.path().join("x")).unwrap();
        assert_eq!(names(w.ready().unwrap()), ["x/y/z"]);
    }

    #[test]
    fn a_file_that_does_not_verify_is_not_named() {
        let t = tempfile::tempdir().unwrap();
        let mut s = ChannelStore::new(t.path(), false, Policy::default()).unwrap();
        let item = |hash| Item {
            path: b"a/b/f.dat".to_vec(),
            kind: EntryKind::File,
            size: 5,
            mode: 0o640,
            mtime_ns: 1_500_000_000_000_000_000,
            link: vec![],
            hash,
            extents: None,
            owner: None,
            xattrs: vec![],
        };
        s.begin(1, &item([0; 32])).unwrap();
        s.write(1, 0, b"hello").unwrap();
        let e = s.finish(1).unwrap_err();
        assert!(e.contains("does not verify"), "{e}");
        assert!(!t.path().join("a/b/f.dat").exists());
        assert_eq!(std::fs::read_dir(t.path().join("a/b")).unwrap().count(), 0);
        s.begin(2, &item(*blake3::hash(b"hello").as_bytes()))
            .unwrap();
        s.write(2, 0, b"hello").unwrap();
        s.finish(2).unwrap();
        assert_eq!(std::fs::read(t.path().join("a/b/f.dat")).unwrap(), b"hello");
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(t.path().join("a/b/f.dat")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o640);
    }
}
