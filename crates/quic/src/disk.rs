//! The receiving side's file-system work: runs the jobs of
//! [`crate::core::recv`] against the destination (blocking calls; the driver
//! picks the thread). It holds the open part files by id; every decision
//! about what a file is and when it is done is the core's.

use crate::core::recv::{Done, Job, Opened, Wrote};
use crate::proto::{Want, What};
use cap_std::fs::Dir;
use longhaul_transfer::place::{DestDir, FinishError, Heard, Incoming, Settled};
use longhaul_transfer::shard::Run;
use longhaul_transfer::slice::SlicePart;
use longhaul_transfer::sync::{decide, needs_local_hash, Decision, SyncMode};
use longhaul_transfer::{EntryKind, CHUNK_SIZE};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Jobs whose data is at most this many bytes are cheap enough to run on the
/// driver's own task: a page-cache copy and a few metadata calls take
/// microseconds, less than a trip to the blocking pool and back (per 10 kB
/// file, that trip cost more CPU than the write).
pub(crate) const LIGHT_BYTES: u64 = 64 << 10;

/// How long a file that another session of this process is receiving is
/// waited for while that session goes on. It covers the 15 s idle timeout of
/// a session whose peer vanished (killed, or its close lost: under load that
/// session ended 20 s after the client's Ctrl-C), which then ends. A session
/// that is ending is waited for however long its journaling takes: under
/// heavy write load its fdatasync took over 10 s (a put rerun at once after
/// Ctrl-C, beside another test writing gigabytes).
pub(crate) const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Verified files waiting for a [`Job::Commit`] keep their descriptor (an
/// unnamed file is placed by linking it: one call, where a parked one costs
/// a link and a rename, 25 against 8 µs on ext4), up to a quarter of the
/// process's soft RLIMIT_NOFILE (at most 8,192) across its sessions. Beyond
/// that a waiting file is given its part name and closed, so a slow sync
/// cannot exhaust the descriptors. With 256, 15,000 of 20,000 small files
/// were parked and the commits' placing took 0.45 s of a 1.2 s transfer.
fn waiting_open_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        usize::try_from(longhaul_transfer::partlock::soft_nofile() / 4)
            .unwrap_or(usize::MAX)
            .clamp(64, 8192)
    })
}

/// Waiting files holding a descriptor, in all sessions of the process.
static WAITING_OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Files of several chunks a session left unfinished with their parts kept
/// for a resume: targets beneath the destination's base, and sizes.
pub(crate) type Unfinished = Vec<(longhaul_transfer::RelPath, u64)>;

/// A file of several chunks being received: its target beneath the
/// destination's base and size, and where its part is.
struct Target {
    path: longhaul_transfer::RelPath,
    size: u64,
    dir: std::sync::Arc<Dir>,
    name: Vec<u8>,
}

/// The destination of one receiving session and the files it has open.
pub(crate) struct RecvDisk {
    dest: Mutex<DestDir>,
    files: Mutex<HashMap<u64, Incoming>>,
    /// Durable session: a verified file waits in `waiting` until a commit
    /// has synced its data.
    durable: bool,
    waiting: Mutex<Waiting>,
    /// When the session last heard from its peer (the driver sets it): a
    /// newer session may take a file over from a silent one.
    heard: Heard,
    /// Files of several chunks opened and not placed nor discarded, by id:
    /// their targets and sizes, and their directories and names, for the
    /// record of those a session leaves unfinished ([`RecvDisk::close_all`]).
    targets: Mutex<HashMap<u64, Target>>,
    /// What of the owners and attributes sent is applied.
    meta: longhaul_transfer::meta::Policy,
    /// A shard's slices of files, by id, each with the file's runs.
    slices: Mutex<HashMap<u64, (SlicePart, Vec<Run>)>>,
    /// A shard: where its plan is shared.
    sharding: Option<crate::sharding::Sharding>,
}

#[derive(Default)]
struct Waiting {
    /// Each with whether it was let keep its descriptor (a file of one
    /// chunk, counted in `open` and [`WAITING_OPEN`]).
    files: HashMap<u64, (Incoming, bool)>,
    /// Of them, those counted.
    open: usize,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING_OPEN.fetch_sub(self.open, Ordering::Relaxed);
    }
}

fn gone() -> io::Error {
    io::Error::other("the file is no longer being received")
}

impl RecvDisk {
    /// `durable`: verified files wait for a [`Job::Commit`].
    pub(crate) fn new(base: Dir, durable: bool) -> RecvDisk {
        RecvDisk {
            dest: Mutex::new(DestDir::new(base)),
            files: Mutex::new(HashMap::new()),
            durable,
            waiting: Mutex::new(Waiting::default()),
            heard: Heard::new(),
            targets: Default::default(),
            meta: Default::default(),
            slices: Default::default(),
            sharding: None,
        }
    }

    /// A shard's plan, if its file is there.
    pub(crate) fn read_plan(
        &self,
        sh: &crate::sharding::Sharding,
    ) -> Result<Option<Arc<longhaul_transfer::shard::Plan>>, String> {
        sh.read(&mut self.dest.lock().unwrap())
    }

    /// Remove a sharded transfer's plan (`--shard finish`).
    pub(crate) fn remove_plan(&self, sh: &crate::sharding::Sharding) -> io::Result<()> {
        sh.remove(&mut self.dest.lock().unwrap())
    }

    /// A shard's destination: its plan is shared in `sharding`'s file.
    pub(crate) fn with_sharding(mut self, sharding: Option<crate::sharding::Sharding>) -> RecvDisk {
        self.sharding = sharding;
        self
    }

    /// What of an entry's owner and attributes this destination applies.
    pub(crate) fn with_meta(mut self, policy: longhaul_transfer::meta::Policy) -> RecvDisk {
        self.meta = policy;
        self
    }

    /// What this destination applies of an item's `owner` and `xattrs`.
    fn applied(
        &self,
        owner: &longhaul_transfer::meta::Owner,
        xattrs: &[longhaul_transfer::meta::Xattr],
    ) -> longhaul_transfer::meta::Applied {
        longhaul_transfer::meta::applied(owner, xattrs, self.meta)
    }

    /// The session's record of when it last heard from its peer.
    pub(crate) fn heard(&self) -> Heard {
        self.heard.clone()
    }

    /// A verified file waits for its commit (closed first when too many
    /// wait open).
    fn wait(&self, id: u64, mut inc: Incoming) -> io::Result<()> {
        let mut w = self.waiting.lock().unwrap();
        let mut counted = false;
        if !inc.single_chunk() {
            // Its part's lock and descriptors go back until its commit.
            inc.park()?;
        } else if inc.holds_descriptor() {
            if WAITING_OPEN.fetch_add(1, Ordering::Relaxed) >= waiting_open_limit() {
                WAITING_OPEN.fetch_sub(1, Ordering::Relaxed);
                inc.park()?;
            } else {
                w.open += 1;
                counted = true;
            }
        }
        w.files.insert(id, (inc, counted));
        Ok(())
    }

    /// Sync the data of the files `ids`, then place them: one fdatasync
    /// for a lone file, else one syncfs per file system they are on. Unless
    /// `replace`, a file whose name is taken is dropped, not placed.
    fn commit(&self, ids: &[u64], replace: bool) -> Vec<(u64, Result<[u8; 32], FinishError>)> {
        let mut batch = Vec::with_capacity(ids.len());
        {
            let mut w = self.waiting.lock().unwrap();
            for id in ids {
                if let Some((inc, counted)) = w.files.remove(id) {
                    if counted {
                        w.open -= 1;
                        WAITING_OPEN.fetch_sub(1, Ordering::Relaxed);
                    }
                    batch.push((*id, inc));
                }
            }
        }
        let synced = match batch.as_mut_slice() {
            [(_, inc)] => inc.sync_data(),
            _ => sync_file_systems(batch.iter().map(|(_, inc)| inc)),
        };
        let done: Vec<_> = batch
            .into_iter()
            .filter_map(|(id, mut inc)| {
                if !replace && inc.target_exists() {
                    inc.discard();
                    return None;
                }
                Some((id, inc))
            })
            .map(|(id, inc)| {
                let r = match &synced {
                    Ok(()) => inc.finish(),
                    Err(e) => Err(FinishError::Io(io::Error::new(
                        e.kind(),
                        format!("syncing the received data: {e}"),
                    ))),
                };
                (id, r)
            })
            .collect();
        // Placed: no longer a part to keep for a resume.
        let mut targets = self.targets.lock().unwrap();
        for (id, r) in &done {
            if r.is_ok() {
                targets.remove(id);
            }
        }
        done
    }

    /// Whether `job` is cheap enough for the driver's own task.
    pub(crate) fn is_light(&self, job: &Job) -> bool {
        match job {
            // (A chunk of zeros is a hole punched, its digest the sender's.)
            Job::Write { data, .. } => data.len() as u64 <= LIGHT_BYTES,
            Job::Finish { size, .. } => *size <= LIGHT_BYTES,
            // A small file needs no file-system call yet (its part is created
            // with its first write, and without --sync nothing is looked up).
            Job::Open {
                target,
                entry,
                sync,
                fresh,
                ..
            } => {
                entry.kind == EntryKind::File
                    && entry.size <= CHUNK_SIZE
                    && (*sync == SyncMode::Always || *fresh)
                    && self.dest.lock().unwrap().parent_cached(target)
            }
            _ => false,
        }
    }

    /// Run one job (blocking).
    pub(crate) fn run(&self, job: Job) -> Done {
        match job {
            Job::Dir {
                target,
                mode,
                mtime_ns,
                sent,
            } => {
                let meta = self.applied(&sent.0, &sent.1);
                let result = self
                    .dest
                    .lock()
                    .unwrap()
                    .make_dir(&target, mode, mtime_ns, meta);
                Done::Made { target, result }
            }
            Job::Symlink {
                target,
                link,
                mtime_ns,
                sent,
            } => {
                let meta = self.applied(&sent.0, &sent.1);
                let result = self
                    .dest
                    .lock()
                    .unwrap()
                    .make_symlink(&target, &link, mtime_ns, &meta);
                Done::Made { target, result }
            }
            Job::Special {
                target,
                kind,
                rdev,
                mode,
                mtime_ns,
                sent,
            } => {
                let meta = self.applied(&sent.0, &sent.1);
                let result = self
                    .dest
                    .lock()
                    .unwrap()
                    .make_special(&target, kind, rdev, mode, mtime_ns, &meta);
                Done::MadeSpecial {
                    target,
                    kind,
                    result,
                }
            }
            Job::Open {
                id,
                target,
                entry,
                sync,
                fresh,
                dry,
                slice,
            } => Done::Opened {
                id,
                result: match (dry, slice) {
                    (true, _) => self.open_dry(&target, &entry, sync),
                    (false, Some(slice)) => self.open_slice(id, &target, &entry, sync, slice),
                    (false, None) => self.open(id, &target, &entry, sync, fresh),
                },
            },
            Job::Plan { listing } => Done::Planned(match &self.sharding {
                Some(sh) => sh.write(listing, &mut self.dest.lock().unwrap()),
                None => Err("a plan asked of a session that is not a shard".into()),
            }),
            Job::Probe { target, entry } => {
                let found = self.dest.lock().unwrap().found(&target);
                Done::Probed {
                    result: found.map(|f| would_change(&entry, f.as_ref())),
                    target,
                }
            }
            Job::Write {
                id,
                index,
                data,
                shape,
                zero_digest,
                expected,
                stream,
            } => {
                let result = match self.is_slice(id) {
                    true => self.write_slice(id, index, &data, (shape, zero_digest)),
                    false => self.write(id, index, &data, (shape, zero_digest), expected),
                };
                Done::Written {
                    id,
                    stream,
                    data,
                    result,
                }
            }
            Job::Checkpoint { id, sync } if self.is_slice(id) => {
                let result = match self.slices.lock().unwrap().get_mut(&id) {
                    Some((sp, _)) => sp.checkpoint(sync),
                    None => Ok(()),
                };
                Done::Checkpointed { id, result }
            }
            Job::Checkpoint { id, sync } => {
                let cp = match self.files.lock().unwrap().get_mut(&id) {
                    Some(inc) => inc.take_checkpoint(sync),
                    None => Ok(None),
                };
                let result = cp.and_then(|cp| cp.map_or(Ok(()), |cp| cp.commit()));
                Done::Checkpointed { id, result }
            }
            Job::Finish { id, expected, .. } if self.is_slice(id) => {
                let slice = self.slices.lock().unwrap().remove(&id);
                let result = match slice {
                    Some((sp, runs)) => sp.finish(expected, &runs),
                    None => Err(FinishError::Io(gone())),
                };
                self.targets.lock().unwrap().remove(&id);
                Done::SliceFinished { id, result }
            }
            Job::Finish { id, expected, .. } => {
                let inc = self.files.lock().unwrap().remove(&id);
                let mut waiting = false;
                let result = match inc {
                    Some(mut inc) if self.durable => {
                        inc.expected = Some(expected);
                        inc.verify().and_then(|root| {
                            self.wait(id, inc)?;
                            waiting = true;
                            Ok(root)
                        })
                    }
                    Some(mut inc) => {
                        inc.expected = Some(expected);
                        inc.finish()
                    }
                    None => Err(FinishError::Io(gone())),
                };
                if !waiting && result.is_ok() {
                    self.targets.lock().unwrap().remove(&id);
                }
                Done::Finished {
                    id,
                    result,
                    waiting,
                }
            }
            Job::Commit { ids } => Done::Committed(self.commit(&ids, true)),
            Job::Discard { id } if self.is_slice(id) => {
                if let Some((sp, _)) = self.slices.lock().unwrap().remove(&id) {
                    sp.discard();
                }
                self.targets.lock().unwrap().remove(&id);
                Done::Discarded { id }
            }
            Job::Discard { id } => {
                if let Some(mut inc) = self.files.lock().unwrap().remove(&id) {
                    inc.discard();
                }
                self.targets.lock().unwrap().remove(&id);
                Done::Discarded { id }
            }
            Job::Close { id } if self.is_slice(id) => {
                if let Some((mut sp, _)) = self.slices.lock().unwrap().remove(&id) {
                    let _ = sp.close();
                }
                Done::Closed
            }
            Job::Close { id } => {
                let inc = self.files.lock().unwrap().remove(&id);
                if let Some(mut inc) = inc {
                    let _ = inc.flush_journal();
                }
                Done::Closed
            }
            Job::FinishDirs { links, mirror, dry } => {
                let mut dest = self.dest.lock().unwrap();
                let links = links
                    .into_iter()
                    .map(|(name, first)| {
                        let made = match dry {
                            // (The first name may not be there yet either.)
                            true => dest.same_file(&name, &first).map(|same| !same),
                            false => dest.make_hardlink(&name, &first).map(|()| true),
                        };
                        (name, made)
                    })
                    .collect();
                // Before the directories' mtimes: removing changes them.
                let deleted = match &mirror {
                    Some(m) => dest.delete_extras(&m.dirs, &|p, d| m.keeps(p, d), dry),
                    None => Vec::new(),
                };
                Done::DirsFinished {
                    links,
                    deleted,
                    dirs: match dry {
                        true => Ok(()),
                        false => dest.finish_dirs(),
                    },
                }
            }
            Job::SyncFs => {
                // One syncfs: the names of the files placed, directory
                // metadata, the journals.
                let t = std::time::Instant::now();
                let r = longhaul_transfer::place::sync_fs(self.dest.lock().unwrap().base());
                if r.is_ok() {
                    let secs = t.elapsed().as_secs_f64();
                    tracing::info!("synced the destination's file system in {secs:.3} s");
                }
                Done::Synced(r)
            }
        }
    }

    /// A dry run's [`Job::Open`]: what a real one would want, opening and
    /// changing nothing.
    fn open_dry(
        &self,
        target: &longhaul_transfer::RelPath,
        e: &longhaul_transfer::Entry,
        sync: SyncMode,
    ) -> io::Result<Opened> {
        // (The real run's decision, without its part.)
        let dest = self.dest.lock().unwrap();
        let Some(x) = dest.existing_file(target)? else {
            // (Nothing there, or something the file replaces.)
            return Ok(Opened::Would(What::File {
                new: true,
                size: false,
                mtime: false,
                checksum: false,
            }));
        };
        let mtime = !longhaul_transfer::sync::same_mtime(x.mtime_ns, e.mtime_ns);
        if needs_local_hash(sync, e, Some(&x)) {
            let local = dest.hash_file(target)?;
            return Ok(Opened::Compare { local, mtime });
        }
        match decide(sync, e, Some(&x), None) {
            Decision::Skip => Ok(Opened::Skip),
            _ => Ok(Opened::Would(What::File {
                new: false,
                size: x.size != e.size,
                mtime,
                checksum: false,
            })),
        }
    }

    fn open(
        &self,
        id: u64,
        target: &longhaul_transfer::RelPath,
        e: &longhaul_transfer::Entry,
        sync: SyncMode,
        fresh: bool,
    ) -> io::Result<Opened> {
        let mut dest = self.dest.lock().unwrap();
        // Without --sync whatever is there is replaced: no lookup.
        let existing = if sync == SyncMode::Always || fresh {
            None
        } else {
            dest.existing_file(target)?
        };
        let local_hash = if needs_local_hash(sync, e, existing.as_ref()) {
            Some(dest.hash_file(target)?)
        } else {
            None
        };
        let decision = decide(sync, e, existing.as_ref(), local_hash);
        if decision == Decision::Skip {
            // Same bytes by size and mtime; the mode follows the source's
            // (as rsync -a's does).
            // (Its owner and attributes too, before the mode: a chown
            // clears setuid bits.)
            if let Err(err) = dest.fix_meta(target, &self.applied(&e.owner, &e.xattrs)) {
                let shown = target.display();
                tracing::warn!(
                    "{shown}: skipped, but its owner or attributes were not updated: {err}"
                );
            }
            if existing.as_ref().is_some_and(|x| x.mode != e.mode & 0o7777) {
                if let Err(err) = dest.set_mode(target, e.mode) {
                    let shown = target.display();
                    tracing::warn!("{shown}: skipped, but its mode was not updated: {err}");
                }
            }
            return Ok(Opened::Skip);
        }
        let (dir, name) = dest.parent_of(target)?;
        let resume = !matches!(decision, Decision::UnlessHash(_)) && !fresh;
        let in_fresh_dir = fresh || dest.in_fresh_dir(target);
        drop(dest);
        let heard = || Some(self.heard.clone());
        let compare = matches!(decision, Decision::UnlessHash(_));
        let open = |dir| match compare {
            true => Incoming::open_to_compare(dir, &name, e, CLAIM_WAIT, heard()),
            false => Incoming::open_heard(dir, &name, e, resume, CLAIM_WAIT, heard()),
        };
        let (mut inc, ranges) = match open(dir.clone()) {
            // The session it waited for placed the same file: done. (A
            // fresh session's sender sends it anyway: received again.)
            Err(err) if longhaul_transfer::place::placed_meanwhile(&err) => {
                if !fresh {
                    return Ok(Opened::Skip);
                }
                open(dir)?
            }
            r => r?,
        };
        // A fresh session's destination held none of its targets, nor parts.
        if in_fresh_dir {
            inc.in_fresh_dir();
        }
        inc.set_meta(self.applied(&e.owner, &e.xattrs));
        let want = match decision {
            Decision::UnlessHash(h) => Want::UnlessHash(h),
            _ if inc.resumed_bytes > 0 => Want::Chunks(ranges),
            _ => Want::All,
        };
        let resumed_bytes = inc.resumed_bytes;
        if !inc.single_chunk() {
            let t = Target {
                path: target.clone(),
                size: e.size,
                dir: inc.dir().clone(),
                name: name.clone(),
            };
            self.targets.lock().unwrap().insert(id, t);
        }
        self.files.lock().unwrap().insert(id, inc);
        Ok(Opened::Open {
            want,
            resumed_bytes,
        })
    }

    fn is_slice(&self, id: u64) -> bool {
        self.slices.lock().unwrap().contains_key(&id)
    }

    /// A shard's [`Job::Open`] of its slice `first..end` of a file: skipped
    /// when the file is there already (as [`RecvDisk::open`] decides), else
    /// the slice's part and journal, and the chunks of it still missing.
    fn open_slice(
        &self,
        id: u64,
        target: &longhaul_transfer::RelPath,
        e: &longhaul_transfer::Entry,
        sync: SyncMode,
        (first, end, runs): (u64, u64, Vec<Run>),
    ) -> io::Result<Opened> {
        let Some(sharding) = &self.sharding else {
            return Err(io::Error::other(
                "a slice opened in a session that is not a shard",
            ));
        };
        let mut dest = self.dest.lock().unwrap();
        let existing = dest.existing_file(target)?;
        // (By size and mtime: a slice cannot be compared by its hash.)
        let mode = match sync {
            SyncMode::Always => SyncMode::Always,
            _ => SyncMode::SizeMtime,
        };
        if decide(mode, e, existing.as_ref(), None) == Decision::Skip {
            return Ok(Opened::Skip);
        }
        let (dir, name) = dest.parent_of(target)?;
        drop(dest);
        let (mut sp, missing) =
            SlicePart::open(dir.clone(), &name, e, sharding.shard, (first, end))?;
        sp.set_meta(self.applied(&e.owner, &e.xattrs));
        let resumed_bytes = sp.resumed_bytes;
        self.targets.lock().unwrap().insert(
            id,
            Target {
                path: target.clone(),
                size: e.size,
                dir,
                name,
            },
        );
        self.slices.lock().unwrap().insert(id, (sp, runs));
        Ok(Opened::Open {
            want: Want::Slice {
                first,
                end,
                send: missing,
            },
            resumed_bytes,
        })
    }

    /// [`Job::Write`] of a chunk of a shard's slice.
    fn write_slice(
        &self,
        id: u64,
        index: u64,
        data: &[u8],
        (shape, zero_digest): (crate::core::recv::Shape, Option<[u8; 32]>),
    ) -> io::Result<Wrote> {
        let (writer, plan) = {
            let slices = self.slices.lock().unwrap();
            let Some((sp, _)) = slices.get(&id) else {
                return Ok(Wrote::Chunk); // given up meanwhile
            };
            // (The core checked the record against the slice wanted.)
            (sp.writer(), sp.plan())
        };
        let digest = Incoming::write_shaped(&writer, &plan, index, data, shape, zero_digest)?;
        if let Some((sp, _)) = self.slices.lock().unwrap().get_mut(&id) {
            sp.record(index, digest);
        }
        Ok(Wrote::Chunk)
    }

    fn write(
        &self,
        id: u64,
        index: u64,
        data: &[u8],
        (shape, zero_digest): (crate::core::recv::Shape, Option<[u8; 32]>),
        expected: Option<[u8; 32]>,
    ) -> io::Result<Wrote> {
        let (file, plan, placer) = {
            let mut files = self.files.lock().unwrap();
            let Some(inc) = files.get_mut(&id) else {
                return Ok(Wrote::Chunk); // given up meanwhile
            };
            inc.still_ours()?;
            inc.claim(index);
            if inc.single_chunk() && expected.is_some() {
                inc.expected = expected;
            }
            // A file of several chunks has its part locked while this lives.
            let file = inc.writer()?;
            // A file of one chunk is whole after this write: its writer gives
            // it its mode and mtime with this descriptor and, with the hash
            // that came in the record, verifies and places it too.
            let placer = inc.single_chunk().then(|| inc.placer());
            (file, inc.plan, placer)
        };
        #[cfg(debug_assertions)]
        test_write_delay();
        let digest = Incoming::write_shaped(&file, &plan, index, data, shape, zero_digest)?;
        if self.durable && placer.is_none() && !data.is_empty() {
            longhaul_transfer::place::start_writeback(&file, plan.offset(index), data.len() as u64);
        }
        let settled = placer
            .map(|p| p.settle(&file, digest, self.durable))
            .transpose()?;
        drop(file);
        let mut files = self.files.lock().unwrap();
        let Some(inc) = files.get_mut(&id) else {
            return Ok(Wrote::Chunk);
        };
        match settled {
            Some(how @ (Settled::Placed(_) | Settled::Mismatch { .. })) => {
                let mut inc = files.remove(&id).expect("looked up above");
                drop(files);
                inc.settled(&how);
                if matches!(how, Settled::Mismatch { .. }) {
                    inc.discard();
                }
                Ok(Wrote::Settled(how))
            }
            Some(how @ Settled::Verified(_)) => {
                let mut inc = files.remove(&id).expect("looked up above");
                drop(files);
                inc.settled(&how);
                inc.record(index, digest);
                self.wait(id, inc)?;
                Ok(Wrote::Settled(how))
            }
            Some(how @ Settled::Parked) => {
                inc.settled(&how);
                inc.record(index, digest);
                Ok(Wrote::Settled(how))
            }
            None => {
                inc.record(index, digest);
                Ok(Wrote::Chunk)
            }
        }
    }

    /// The session is over, however it ended: every file still open keeps
    /// what is durably written for a rerun (synced and journaled), and a
    /// session waiting for one of its targets may take it over.
    /// Verified files still waiting for their commit are synced and placed
    /// where their name is free (a rerun may have placed a newer copy while
    /// this session was dying): returned, to be reported, with the files
    /// of several chunks left unfinished whose part is kept (their targets
    /// beneath the destination's base, and sizes).
    pub(crate) fn close_all(&self) -> (Vec<(u64, [u8; 32])>, Unfinished) {
        for (_, (mut sp, _)) in self.slices.lock().unwrap().drain() {
            let _ = sp.close();
        }
        let left: Vec<(u64, Incoming)> = self.files.lock().unwrap().drain().collect();
        for (_, f) in &left {
            f.ending();
        }
        let ids: Vec<u64> = self.waiting.lock().unwrap().files.keys().copied().collect();
        let placed = self
            .commit(&ids, false)
            .into_iter()
            .filter_map(|(id, r)| r.ok().map(|root| (id, root)))
            .collect();
        let mut targets = self.targets.lock().unwrap();
        for (id, mut f) in left {
            let _ = f.flush_journal();
            if !f.is_closed() && f.holds_no_chunk() {
                // Nothing to resume from: no part is kept for it.
                f.discard();
                targets.remove(&id);
            }
        }
        // What is left unfinished: the files whose part is still there
        // (left open, closed after the sender gave up on them, or failed
        // when placed).
        let unfinished = targets
            .drain()
            .filter(|(_, t)| longhaul_transfer::place::part_metadata(&t.dir, &t.name).is_some())
            .map(|(_, t)| (t.path, t.size))
            .collect();
        (placed, unfinished)
    }

    /// Directory modes and mtimes, when the session ends without
    /// [`Job::FinishDirs`] (it failed).
    pub(crate) fn finish_dirs(&self) -> io::Result<()> {
        self.dest.lock().unwrap().finish_dirs()
    }
}

/// One syncfs per file system that `files` are received on.
fn sync_file_systems<'a>(files: impl Iterator<Item = &'a Incoming>) -> io::Result<()> {
    let mut seen = HashMap::new();
    for inc in files {
        seen.entry(inc.device()?)
            .or_insert_with(|| inc.dir().clone());
    }
    for dir in seen.values() {
        longhaul_transfer::place::sync_fs(dir)?;
    }
    Ok(())
}

/// Debug builds only: `LONGHAUL_TEST_WRITE_DELAY_MS` makes every write of
/// file data that long, so that a test can have a receiver slower than the
/// network (loopback) without a slow disk.
#[cfg(debug_assertions)]
fn test_write_delay() {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    let d = DELAY.get_or_init(|| {
        std::env::var("LONGHAUL_TEST_WRITE_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(std::time::Duration::from_millis)
    });
    if let Some(d) = d {
        std::thread::sleep(*d);
    }
}

/// What making `e` (a directory, symlink or special file) changes where
/// `found` is (None: nothing is there); None when it is there already as
/// `e` would make it.
fn would_change(
    e: &longhaul_transfer::Entry,
    found: Option<&longhaul_transfer::place::Found>,
) -> Option<What> {
    let same_kind = found.is_some_and(|f| f.kind == Some(e.kind));
    match e.kind {
        EntryKind::Dir => (!same_kind).then_some(What::Dir),
        EntryKind::Symlink => match found {
            Some(f) if same_kind && f.link == e.link => None,
            _ => Some(What::Symlink { new: !same_kind }),
        },
        k => match found {
            Some(f) if same_kind && (!k.is_device() || f.rdev == e.size) => None,
            _ => Some(What::Special {
                device: k.is_device(),
            }),
        },
    }
}
