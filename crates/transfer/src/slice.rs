//! A shard's slice of a file ([`crate::shard`]): chunks `first..end` of a
//! file that several shards receive at once into one part file, on a file
//! system they share.
//!
//! Every shard writes its chunks into the same part (`.NAME.lh-part`,
//! created by whichever comes first, grown to the file's size, never
//! truncated) and journals them in a journal of its own,
//! `.NAME.lh-slice-K-N` (the resume journal's format, [`crate::journal`]),
//! which it holds locked while it receives. When its slice is written it
//! checks the slice against the sender's slice digest, syncs the part's
//! data and journals every chunk as synced. Then, under the part's lock,
//! it reads the journals of all the file's shards: when they name every
//! chunk, the file's BLAKE3 is the root of their chaining values, and this
//! shard (the last, whichever it is) gives the part its mode, times and
//! attributes, renames it to `NAME` and removes the journals. Otherwise
//! the file waits for the others. Only synced records of other shards are
//! trusted: they may write from other hosts, whose unsynced data this one
//! may not see.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Seek, Write};
use std::sync::Arc;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};

use crate::chunk::{hex, ChunkPlan, Digest};
use crate::journal::{self, JournalHeader};
use crate::manifest::Entry;
use crate::place::{apply_meta, read_back, FinishError};
use crate::shard::{Run, Shard};
use crate::sibling::{sibling_name, PART};

/// Suffix of a shard's slice journal, `.NAME.lh-slice-K-N`.
pub(crate) const SLICE: &str = "lh-slice";

fn os(b: &[u8]) -> &std::path::Path {
    use std::os::unix::ffi::OsStrExt;
    std::path::Path::new(std::ffi::OsStr::from_bytes(b))
}

/// The journal of shard `shard`'s slice of `name`.
pub fn journal_name(name: &[u8], shard: Shard) -> Vec<u8> {
    sibling_name(
        name,
        &format!("{SLICE}-{}-{}", shard.index as u64 + 1, shard.count),
    )
}

/// How a slice's finish left its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceEnd {
    /// This shard completed the file: verified chunk by chunk, its BLAKE3
    /// this, and under its name.
    Placed(Digest),
    /// The slice is verified and durable; the file waits for these shards
    /// (1-based) to finish theirs.
    Waiting(Vec<u32>),
    /// Another shard completed and named the file meanwhile.
    PlacedByOther,
}

/// A shard's slice of a file being received.
pub struct SlicePart {
    dir: Arc<Dir>,
    name: Vec<u8>,
    plan: ChunkPlan,
    shard: Shard,
    first: u64,
    end: u64,
    header: JournalHeader,
    /// This shard's journal, locked while it lives.
    journal: File,
    part: Arc<File>,
    digests: BTreeMap<u64, Digest>,
    /// Written, not yet journaled.
    pending: Vec<(u64, Digest)>,
    /// Journaled as written, not yet as synced.
    unsynced: Vec<(u64, Digest)>,
    mode: u32,
    mtime_ns: i64,
    meta: Option<Arc<crate::meta::Applied>>,
    /// Bytes of the slice an earlier run left, kept.
    pub resumed_bytes: u64,
}

fn busy(name: &[u8], shard: Shard) -> io::Error {
    io::Error::new(
        io::ErrorKind::WouldBlock,
        format!(
            "shard {shard} of {} is being received by another process",
            crate::shown(&String::from_utf8_lossy(name))
        ),
    )
}

impl SlicePart {
    /// Open shard `shard`'s slice `first..end` of `entry`, to be received
    /// into the part of `name` in `dir`; what an earlier run of the same
    /// shard journaled for the same source (size and mtime) is kept, and
    /// the chunk ranges of the slice still missing are returned.
    pub fn open(
        dir: Arc<Dir>,
        name: &[u8],
        entry: &Entry,
        shard: Shard,
        (first, end): (u64, u64),
    ) -> io::Result<(SlicePart, Vec<(u64, u64)>)> {
        let plan = ChunkPlan::new(entry.size);
        if first >= end || end > plan.count() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slice {first}..{end} of a file of {} chunks", plan.count()),
            ));
        }
        let header = JournalHeader {
            size: entry.size,
            mtime_ns: entry.mtime_ns,
        };
        let mut o = OpenOptions::new();
        o.read(true)
            .write(true)
            .create(true)
            .follow(FollowSymlinks::No)
            .mode(0o600);
        let mut journal = dir
            .open_with(os(&journal_name(name, shard)), &o)?
            .into_std();
        match journal.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(busy(name, shard)),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        let parsed = journal::read(&journal, plan.count())?.filter(|p| p.header == header);
        let part = dir.open_with(os(&sibling_name(name, PART)), &o)?.into_std();
        let len = part.metadata()?.len();
        if len > entry.size {
            return Err(io::Error::other(format!(
                "its part file holds {len} bytes, more than the file's {}: it is of another \
                 version of the file; remove the part and every shard's journal of it to start over",
                entry.size
            )));
        }
        if len < entry.size {
            // Every shard grows it to the same size; none truncates it.
            part.set_len(entry.size)?;
        }
        let in_slice = |i: &u64| (first..end).contains(i);
        let mut digests = BTreeMap::new();
        let mut unsynced = Vec::new();
        match parsed {
            Some(p) => {
                journal.set_len(p.valid_len)?;
                journal.seek(io::SeekFrom::Start(p.valid_len))?;
                digests.extend(p.synced.into_iter().filter(|(i, _)| in_slice(i)));
                for (i, d) in p.written.into_iter().filter(|(i, _)| in_slice(i)) {
                    if !digests.contains_key(&i) && read_back(&part, &plan, i)? == d {
                        digests.insert(i, d);
                        unsynced.push((i, d));
                    }
                }
            }
            None => {
                journal.set_len(0)?;
                journal.seek(io::SeekFrom::Start(0))?;
                journal.write_all(&journal::encode_header(&header))?;
                journal.sync_data()?;
            }
        }
        let resumed_bytes = digests.keys().filter_map(|&i| plan.len(i)).sum();
        let mut missing = Vec::new();
        let mut at = first;
        for &i in digests.keys() {
            if i > at {
                missing.push((at, i));
            }
            at = i + 1;
        }
        if at < end {
            missing.push((at, end));
        }
        Ok((
            SlicePart {
                dir,
                name: name.to_vec(),
                plan,
                shard,
                first,
                end,
                header,
                journal,
                part: Arc::new(part),
                digests,
                pending: Vec::new(),
                unsynced,
                mode: entry.mode,
                mtime_ns: entry.mtime_ns,
                meta: None,
                resumed_bytes,
            },
            missing,
        ))
    }

    /// The owner and attributes the file gets when it is placed.
    pub fn set_meta(&mut self, meta: crate::meta::Applied) {
        self.meta = Some(Arc::new(meta));
    }

    /// The file's chunk plan.
    pub fn plan(&self) -> ChunkPlan {
        self.plan
    }

    /// A writer of the part (it needs no lock of the caller's), for
    /// [`crate::place::Incoming::write_shaped`].
    pub fn writer(&self) -> crate::partlock::Writer {
        crate::partlock::Writer::plain(self.part.clone())
    }

    /// Note that chunk `index` is written with `digest`.
    pub fn record(&mut self, index: u64, digest: Digest) {
        if self.digests.insert(index, digest).is_none() {
            self.pending.push((index, digest));
        }
    }

    /// Journal what is written: as *written* records, or with `sync` the
    /// part's data synced first and every chunk not yet journaled so as
    /// *synced*.
    pub fn checkpoint(&mut self, sync: bool) -> io::Result<()> {
        if !sync {
            if self.pending.is_empty() {
                return Ok(());
            }
            journal::append(&self.journal, &self.pending, false)?;
            self.unsynced.append(&mut self.pending);
            return Ok(());
        }
        let mut all = std::mem::take(&mut self.unsynced);
        all.append(&mut self.pending);
        if all.is_empty() {
            return Ok(());
        }
        self.part.sync_data()?;
        if let Err(e) = journal::append(&self.journal, &all, true) {
            self.unsynced = all;
            return Err(e);
        }
        self.journal.sync_data()
    }

    /// Every chunk of the slice written?
    pub fn is_complete(&self) -> bool {
        (self.first..self.end).all(|i| self.digests.contains_key(&i))
    }

    /// Once every chunk of the slice is written: check it against the
    /// sender's slice digest `expected`, make it durable, and complete the
    /// file if the other shards' journals (the file's `runs`) name every
    /// other chunk. On a mismatch this shard's journal is emptied (the
    /// chunks are fetched again) and the part left to the others.
    pub fn finish(mut self, expected: Digest, runs: &[Run]) -> Result<SliceEnd, FinishError> {
        let mine: Vec<Digest> = (self.first..self.end)
            .map(|i| self.digests.get(&i).copied())
            .collect::<Option<_>>()
            .ok_or_else(|| io::Error::other("the slice is not complete"))?;
        let actual = self.plan.slice_digest(self.first, &mine);
        if actual != expected {
            self.pending.clear();
            self.unsynced.clear();
            let _ = self.journal.set_len(0).and_then(|()| {
                self.journal.seek(io::SeekFrom::Start(0))?;
                self.journal
                    .write_all(&journal::encode_header(&self.header))
            });
            return Err(FinishError::Mismatch {
                expected: hex(&expected),
                actual: hex(&actual),
            });
        }
        self.checkpoint(true)?;
        self.complete(runs)
    }

    /// Under the part's lock: place the file if every shard's journal
    /// names its chunks.
    fn complete(&self, runs: &[Run]) -> Result<SliceEnd, FinishError> {
        self.part.lock()?;
        let part_name = sibling_name(&self.name, PART);
        let ours = ident(&self.part)?;
        match self.dir.symlink_metadata(os(&part_name)) {
            Ok(m) if (m.dev(), m.ino()) == ours => {}
            _ => {
                // The part is gone or another: if the name holds ours, the
                // shard that came last placed it.
                let placed = self
                    .dir
                    .symlink_metadata(os(&self.name))
                    .is_ok_and(|m| (m.dev(), m.ino()) == ours);
                return match placed {
                    true => Ok(SliceEnd::PlacedByOther),
                    false => Err(FinishError::Io(io::Error::other(
                        "its part file was removed or replaced while this shard received it",
                    ))),
                };
            }
        }
        let mut all: BTreeMap<u64, Digest> = BTreeMap::new();
        let mut lacking = Vec::new();
        for run in runs {
            let shard = Shard {
                index: run.shard,
                count: self.shard.count,
            };
            let got: BTreeMap<u64, Digest> = match run.shard == self.shard.index {
                true => self
                    .digests
                    .range(run.first..run.end)
                    .map(|(&i, &d)| (i, d))
                    .collect(),
                false => crate::open::open_read(&self.dir, os(&journal_name(&self.name, shard)))
                    .ok()
                    .and_then(|f| journal::read(f, self.plan.count()).ok().flatten())
                    .filter(|p| p.header == self.header)
                    .map(|p| {
                        p.synced
                            .into_iter()
                            .filter(|(i, _)| (run.first..run.end).contains(i))
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            if got.len() as u64 != run.end - run.first {
                lacking.push(run.shard + 1);
            }
            all.extend(got);
        }
        if !lacking.is_empty() {
            return Ok(SliceEnd::Waiting(lacking));
        }
        let digests: Vec<Digest> = all.into_values().collect();
        if digests.len() as u64 != self.plan.count() {
            return Err(FinishError::Io(io::Error::other(
                "the shards' runs do not cover the file",
            )));
        }
        let root = self.plan.root(&digests);
        apply_meta(&self.part, self.mode, self.mtime_ns, self.meta.as_deref())?;
        self.dir.rename(os(&part_name), &self.dir, os(&self.name))?;
        for run in runs {
            let shard = Shard {
                index: run.shard,
                count: self.shard.count,
            };
            let _ = self.dir.remove_file(os(&journal_name(&self.name, shard)));
        }
        // A resume journal an earlier, unsharded receiver left beside the
        // same part describes nothing now.
        let _ = self
            .dir
            .remove_file(os(&sibling_name(&self.name, crate::sibling::JOURNAL)));
        // The name, durable: each shard synced its data before journaling.
        crate::place::sync_dir(&self.dir)?;
        Ok(SliceEnd::Placed(root))
    }

    /// The session ends before the slice is finished: journal what is
    /// written, durably, for a rerun.
    pub fn close(&mut self) -> io::Result<()> {
        self.checkpoint(true)
    }

    /// The sender's file is gone: this shard's journal goes (the part,
    /// which others may be writing, stays).
    pub fn discard(self) {
        let _ = self
            .dir
            .remove_file(os(&journal_name(&self.name, self.shard)));
    }
}

fn ident(f: &File) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::CHUNK_SIZE;
    use crate::manifest::EntryKind;
    use crate::place::{Incoming, Shape};
    use crate::shard::{Item, Listing, Plan};

    fn entry(size: u64) -> Entry {
        Entry {
            id: 1,
            root: 0,
            path: b"big".to_vec(),
            kind: EntryKind::File,
            size,
            mode: 0o640,
            mtime_ns: 1_600_000_000_000_000_000,
            link: Vec::new(),
            owner: Default::default(),
            xattrs: Vec::new(),
            allocated: 0,
        }
    }

    fn data(size: u64) -> Vec<u8> {
        (0..size).map(|i| (i * 7 + i / 4099) as u8).collect()
    }

    /// Receive shard `s`'s slice of `src` into `dir` (`stop_after`: write
    /// only that many chunks, as a killed shard would, journaled written).
    fn receive(
        dir: &Arc<Dir>,
        plan: &Plan,
        src: &[u8],
        s: u32,
        stop_after: Option<usize>,
    ) -> Option<Result<SliceEnd, FinishError>> {
        let e = entry(src.len() as u64);
        let runs = plan.runs(0);
        let run = *runs.iter().find(|r| r.shard == s)?;
        let shard = Shard::new(s, plan.count()).unwrap();
        let (mut sp, missing) =
            SlicePart::open(dir.clone(), b"big", &e, shard, (run.first, run.end)).unwrap();
        let cp = ChunkPlan::new(src.len() as u64);
        let mut n = 0;
        for &(a, b) in &missing {
            for i in a..b {
                if stop_after.is_some_and(|k| n == k) {
                    sp.checkpoint(false).unwrap();
                    return None;
                }
                let off = cp.offset(i) as usize;
                let chunk = &src[off..off + cp.len(i).unwrap() as usize];
                let d = Incoming::write_shaped(&sp.writer(), &cp, i, chunk, Shape::default(), None)
                    .unwrap();
                sp.record(i, d);
                n += 1;
            }
        }
        assert!(sp.is_complete());
        // The sender's slice digest, from the source.
        let cvs: Vec<Digest> = (run.first..run.end)
            .map(|i| {
                let off = cp.offset(i) as usize;
                let mut h = cp.hasher(i);
                h.update(&src[off..off + cp.len(i).unwrap() as usize]);
                h.finish()
            })
            .collect();
        let expected = cp.slice_digest(run.first, &cvs);
        Some(sp.finish(expected, runs))
    }

    /// A destination directory and the plan of one file `big` of `size`
    /// bytes cut into `shards`.
    fn one_file(size: u64, shards: u32) -> (tempfile::TempDir, Arc<Dir>, Plan) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).unwrap();
        let listing = Listing::new(vec![Item {
            root: 0,
            path: b"big".to_vec(),
            size,
            mtime_ns: 0,
        }]);
        (tmp, Arc::new(dir), Plan::new(listing, shards))
    }

    #[test]
    fn shards_in_any_order_place_one_verified_file_and_leave_nothing() {
        let size = 9 * CHUNK_SIZE + 12_345;
        let src = data(size);
        for order in [[0u32, 1, 2], [2, 0, 1], [1, 2, 0]] {
            let (tmp, dir, plan) = one_file(size, 3);
            // An unsharded receiver's journal, left from an earlier run.
            std::fs::write(tmp.path().join(".big.lh-journal"), b"LHJ1").unwrap();
            let mut ends = Vec::new();
            for s in order {
                ends.push(receive(&dir, &plan, &src, s, None).unwrap().unwrap());
            }
            assert!(matches!(ends[0], SliceEnd::Waiting(_)), "{ends:?}");
            assert!(matches!(ends[1], SliceEnd::Waiting(_)), "{ends:?}");
            let SliceEnd::Placed(root) = ends[2] else {
                panic!("{ends:?}")
            };
            assert_eq!(root, *blake3::hash(&src).as_bytes());
            assert_eq!(std::fs::read(tmp.path().join("big")).unwrap(), src);
            let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
            assert_eq!(left.len(), 1, "only the file: {left:?}");
            use std::os::unix::fs::PermissionsExt;
            let m = std::fs::metadata(tmp.path().join("big")).unwrap();
            assert_eq!(m.permissions().mode() & 0o7777, 0o640);
        }
    }

    #[test]
    fn a_killed_shard_rerun_resumes_its_slice_and_completes_the_file() {
        let size = 8 * CHUNK_SIZE;
        let src = data(size);
        let (tmp, dir, plan) = one_file(size, 2);
        assert!(receive(&dir, &plan, &src, 0, Some(2)).is_none());
        let end = receive(&dir, &plan, &src, 1, None).unwrap().unwrap();
        assert_eq!(end, SliceEnd::Waiting(vec![1]));
        // The rerun finds its two chunks journaled and fetches the rest.
        let e = entry(size);
        let (sp, missing) =
            SlicePart::open(dir.clone(), b"big", &e, Shard::new(0, 2).unwrap(), (0, 4)).unwrap();
        assert_eq!(missing, vec![(2, 4)]);
        assert_eq!(sp.resumed_bytes, 2 * CHUNK_SIZE);
        drop(sp);
        let end = receive(&dir, &plan, &src, 0, None).unwrap().unwrap();
        assert_eq!(end, SliceEnd::Placed(*blake3::hash(&src).as_bytes()));
        assert_eq!(std::fs::read(tmp.path().join("big")).unwrap(), src);
    }

    #[test]
    fn a_slice_that_does_not_match_the_senders_is_fetched_again_and_a_busy_one_refused() {
        let size = 4 * CHUNK_SIZE;
        let src = data(size);
        let tmp = tempfile::tempdir().unwrap();
        let dir =
            Arc::new(Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).unwrap());
        let e = entry(size);
        let shard = Shard::new(0, 2).unwrap();
        let (mut sp, _) = SlicePart::open(dir.clone(), b"big", &e, shard, (0, 2)).unwrap();
        let again = SlicePart::open(dir.clone(), b"big", &e, shard, (0, 2));
        assert_eq!(again.err().unwrap().kind(), io::ErrorKind::WouldBlock);
        let cp = ChunkPlan::new(size);
        for i in 0..2 {
            let off = cp.offset(i) as usize;
            let d = Incoming::write_shaped(
                &sp.writer(),
                &cp,
                i,
                &src[off..off + CHUNK_SIZE as usize],
                Shape::default(),
                None,
            )
            .unwrap();
            sp.record(i, d);
        }
        let runs = [
            Run {
                shard: 0,
                first: 0,
                end: 2,
            },
            Run {
                shard: 1,
                first: 2,
                end: 4,
            },
        ];
        let r = sp.finish([9; 32], &runs);
        assert!(matches!(r, Err(FinishError::Mismatch { .. })));
        let (_, missing) = SlicePart::open(dir.clone(), b"big", &e, shard, (0, 2)).unwrap();
        assert_eq!(missing, vec![(0, 2)]);
    }
}
