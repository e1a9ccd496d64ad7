//! The receiving role's protocol as a sans-IO state machine.
//!
//! In: control frames from the sender ([`RecvCore::handle_frame`]), decoded
//! data records ([`RecvCore::handle_record`]), finished file-system jobs
//! ([`RecvCore::handle_done`]) and the time. Out: frames for the sender
//! ([`RecvCore::poll_frame`]), file-system jobs ([`RecvCore::poll_job`]),
//! events for the driver ([`RecvCore::poll_event`]) and the session's end
//! ([`RecvCore::state`]). It opens no file and reads no socket, so every
//! ordering of frames, records and completions can be replayed in a test.
//!
//! What it decides: which entries are acceptable (ids rise, paths land
//! inside the destination, names are not longhaul's own), which records are
//! acceptable (a known file, a chunk inside it, not twice, a hash only on a
//! file's only chunk), when a file is complete and is verified and placed,
//! when its written chunks are journaled, what each file's outcome is, and
//! when the session is over. What the driver does: the jobs, on whatever
//! threads it likes, in any order except that jobs of the manifest lane
//! ([`Job::is_manifest`]) run one at a time in the order given.

use super::{Role, State};
use crate::proto::{
    Change, ErrorCode, Frame, Outcome, RecordHeader, Want, What, CHANGES_PER_FRAME,
};
use crate::report::{FileReport, Kind, Problem, Progress, SessionReport, Status};
use longhaul_transfer::landing::Landing;
use longhaul_transfer::place::{is_reserved_name, Settled, MAX_FILE_SIZE};
use longhaul_transfer::sync::SyncMode;
use longhaul_transfer::{ChunkPlan, Entry, EntryKind, RelPath};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a receiving session runs.
#[derive(Debug, Clone)]
pub(crate) struct RecvConfig {
    pub sync: SyncMode,
    /// The sender sends every file whole without waiting for a `Want` (a
    /// get's `Hello.fresh`, a put's `Welcome.fresh`): none is sent, nothing is
    /// looked up or resumed, and a record may come before its file's entry.
    pub fresh: bool,
    /// Durable files (the default; off with `--no-fsync`): a verified file
    /// gets its name only once its data is on disk ([`Job::Commit`]), and
    /// the destination's file system is synced before `Done`.
    pub durable: bool,
    /// The most record bytes held for entries not yet announced (fresh
    /// sessions only); more ends the session ([`MAX_WAITING`]).
    pub max_waiting: u64,
    /// Keep the modes sent exactly; else within
    /// [`longhaul_transfer::place::SAFE_MODE_BITS`] (no setuid, setgid,
    /// sticky or world-write bit).
    pub exact_modes: bool,
    /// Make the FIFOs and sockets' names sent (`--specials`); else each is
    /// listed as not made.
    pub specials: bool,
    /// Make the device nodes sent (`--devices`; needs root).
    pub devices: bool,
    /// Remove what the destination's directories hold that the manifest
    /// does not name (`--delete`), except what this filter leaves out
    /// (matched as the sender matched it, against the path beneath the
    /// landing's prefix).
    pub delete: Option<Arc<longhaul_transfer::filter::Filter>>,
    /// Write nothing: work out what the session would change, list it in
    /// the report and in `Changes` frames, and want no data (`--dry-run`).
    pub dry_run: bool,
    /// One shard of the transfer (`--shard`): it wants only its part of
    /// the files, by the plan (known at the start when a plan file was
    /// there; else made from the whole manifest, [`Job::Plan`]).
    pub shard: Option<(longhaul_transfer::shard::Shard, Option<Arc<Plan>>)>,
}

use longhaul_transfer::shard::{Part, Plan};

/// The most record bytes a fresh session holds for entries not yet seen. A
/// sender sends a file's entry before its data, so records wait only while
/// the control stream is behind (none did in the lab); without a bound, a
/// client that names a fresh destination could pin a full record on each of
/// its streams (1024 × 1 MiB) for ids it never announces.
pub(crate) const MAX_WAITING: u64 = 64 << 20;

/// A file's written chunks are journaled (as *written* records, without a
/// sync: they hold if the process is killed, and a resume reads them back)
/// as soon as they are written: one checkpoint job per chunk, or per the
/// chunks written while the last one was out. A receiver killed outright
/// refetches only the chunks in flight. (Journaling after 16 chunks or a
/// second, per file, lost nearly everything when many files were under way
/// and the kills came every second: `scripts/soak`.) A clean end, an error
/// or Ctrl-C journals everything, synced.
///
/// How often a checkpoint also syncs the data and journals it as synced
/// (what a power cut cannot take). The sync runs beside the streams, but ext4
/// still stalls the writers while it commits: 1 GiB on loopback took 1.8-1.9 s
/// with no sync, 2.0-3.0 s with one a second, 2.5-2.7 s with one per 250 ms.
pub(crate) const SYNC_EVERY: Duration = Duration::from_secs(5);

/// A verified file waits at most this long (while anything else happens)
/// for its [`Job::Commit`], or until [`COMMIT_FILES`] wait, or nothing else
/// is coming: one sync per batch.
pub(crate) const COMMIT_EVERY: Duration = Duration::from_millis(250);
/// See [`COMMIT_EVERY`].
pub(crate) const COMMIT_FILES: usize = 4096;

/// One data record, decoded by the driver (its header a [`crate::proto::RecordHeader`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The driver's name for the stream it came on (handed back in
    /// [`Event::StreamReady`]).
    pub stream: u64,
    pub header: RecordHeader,
    pub data: Vec<u8>,
    /// The file's BLAKE3, after the data of a file's only chunk.
    pub hash: Option<[u8; 32]>,
    /// A chunk of zeros' digest, from the sender (`header.zeros`).
    pub zero_digest: Option<[u8; 32]>,
}

/// File-system work for the driver. Each job's result comes back as the
/// [`Done`] of the same name.
#[derive(Debug)]
pub(crate) enum Job {
    /// Create directory `target` (mode, mtime, owner and attributes
    /// applied at the end).
    Dir {
        target: RelPath,
        mode: u32,
        mtime_ns: i64,
        sent: Sent,
    },
    /// Place symlink `target` → `link`.
    Symlink {
        target: RelPath,
        link: Vec<u8>,
        mtime_ns: i64,
        sent: Sent,
    },
    /// Make FIFO, socket or device node `target` (`rdev`: a device's number).
    Special {
        target: RelPath,
        kind: EntryKind,
        rdev: u64,
        mode: u32,
        mtime_ns: i64,
        sent: Sent,
    },
    /// Decide what to want of file `id` (sync mode, resume journal) and, unless
    /// it is skipped, open its part; in a dry run open nothing.
    Open {
        id: u64,
        target: RelPath,
        entry: Entry,
        sync: SyncMode,
        fresh: bool,
        dry: bool,
        /// Only this shard's slice of it: chunks `first..end`, and the
        /// file's runs (which shard moves which chunks).
        slice: Option<(u64, u64, Vec<longhaul_transfer::shard::Run>)>,
    },
    /// A shard whose plan was not known: the listing of the whole manifest,
    /// to be planned from (the plan file written unless one is there, and
    /// the plan read back from it).
    Plan {
        listing: longhaul_transfer::shard::Listing,
    },
    /// A dry run: what making directory, link or node `target` as `entry`
    /// says would change there (nothing, when it is there already).
    Probe { target: RelPath, entry: Entry },
    /// Write chunk `index` of file `id`. For a file of one chunk the writer
    /// also settles it (verifies and places it when `expected` is known).
    Write {
        id: u64,
        index: u64,
        data: Vec<u8>,
        /// A chunk of zeros (`data` empty), or one of a sparse file.
        shape: Shape,
        /// A chunk of zeros' digest, as the sender gave it.
        zero_digest: Option<[u8; 32]>,
        expected: Option<[u8; 32]>,
        stream: u64,
    },
    /// Journal the chunks written so far; with `sync`, make them durable first.
    Checkpoint { id: u64, sync: bool },
    /// Every chunk is written: verify against `expected` and place (or, in a
    /// durable session, leave it verified for a [`Job::Commit`]).
    Finish {
        id: u64,
        expected: [u8; 32],
        size: u64,
    },
    /// Remove the part and journal (the sender's file is unchanged, or the
    /// data did not verify).
    Discard { id: u64 },
    /// The sender gave the file up: journal what is held and close it.
    Close { id: u64 },
    /// Make the data of these verified files durable, then place them
    /// (durable sessions). One is out at a time; the files verified
    /// meanwhile wait for the next, so a slow sync makes batches larger, not
    /// more numerous.
    Commit { ids: Vec<u64> },
    /// Every file is settled: make the hard links (each name `.0` another
    /// name of the file placed at `.1`), remove what `mirror` says
    /// (`--delete`), then apply directory modes and mtimes. With `dry`,
    /// only find which links would be made and what would be removed.
    FinishDirs {
        links: Vec<(RelPath, RelPath)>,
        mirror: Option<Mirror>,
        dry: bool,
    },
    /// Sync the destination's file system (durable sessions): the names and
    /// directory metadata of the files placed.
    SyncFs,
}

impl Job {
    /// Jobs that run one at a time, in order, on the driver's manifest lane
    /// (they share the destination's directory cache).
    pub(crate) fn is_manifest(&self) -> bool {
        matches!(
            self,
            Job::Dir { .. }
                | Job::Symlink { .. }
                | Job::Special { .. }
                | Job::Open { .. }
                | Job::Plan { .. }
                | Job::Probe { .. }
                | Job::FinishDirs { .. }
                | Job::SyncFs
        )
    }
}

/// The owner and attributes an entry came with; the driver applies what
/// its policy allows ([`longhaul_transfer::meta::applied`]).
pub(crate) type Sent = (
    longhaul_transfer::meta::Owner,
    Vec<longhaul_transfer::meta::Xattr>,
);

/// An entry's owner and attributes, taken out of it.
fn sent(e: &mut Entry) -> Sent {
    (std::mem::take(&mut e.owner), std::mem::take(&mut e.xattrs))
}

/// What `--delete` removes: beneath each of `dirs` (the manifest's
/// directories, targets beneath the base), whatever the manifest does not
/// name and `protect` does not leave out.
#[derive(Debug)]
pub(crate) struct Mirror {
    pub dirs: Vec<RelPath>,
    /// Keys ([`path_key`]) of every target the manifest names.
    named: HashSet<u64>,
    protect: Arc<longhaul_transfer::filter::Filter>,
    /// The landing's prefix: a target's path beneath it is what the
    /// filter matches.
    prefix: RelPath,
}

impl Mirror {
    /// Whether `target` (a directory: `is_dir`) stays: the manifest names
    /// it, or the filter leaves it out (rsync's protection of excluded
    /// files), or it is longhaul's own (a part, a journal).
    pub(crate) fn keeps(&self, target: &RelPath, is_dir: bool) -> bool {
        if self.named.contains(&path_key(target)) || is_reserved_name(target.file_name()) {
            return true;
        }
        let rel = match self.prefix.is_root() {
            true => target.as_bytes(),
            false => match target.as_bytes().strip_prefix(self.prefix.as_bytes()) {
                Some(r) => r.strip_prefix(b"/").unwrap_or(r),
                None => return true, // (not beneath the landing: never)
            },
        };
        self.protect.excludes(rel, is_dir)
    }
}

pub(crate) use longhaul_transfer::place::Shape;

/// What [`Job::Open`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Opened {
    /// Already there (`--sync`): not wanted.
    Skip,
    /// A dry run: it would be sent, for this reason.
    Would(What),
    /// A dry run under `--checksum`: same size; it would be sent unless the
    /// sender's BLAKE3 is this one's.
    Compare {
        local: [u8; 32],
        /// The mtime differs (shown with the change, if any).
        mtime: bool,
    },
    /// The part is open. `want`: what to ask the sender for (`All`,
    /// `Chunks` of a resume, `UnlessHash` of `--checksum`).
    Open { want: Want, resumed_bytes: u64 },
}

/// What [`Job::Write`] left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// Written and recorded.
    Chunk,
    /// A file of one chunk, settled by its writer.
    Settled(Settled),
}

/// A finished job.
#[derive(Debug)]
pub(crate) enum Done {
    /// Of [`Job::Dir`] or [`Job::Symlink`].
    Made {
        target: RelPath,
        result: std::io::Result<()>,
    },
    /// Of [`Job::Special`]: a node that could not be made is reported, and
    /// the session goes on.
    MadeSpecial {
        target: RelPath,
        kind: EntryKind,
        result: std::io::Result<()>,
    },
    Opened {
        id: u64,
        result: std::io::Result<Opened>,
    },
    /// `stream` is the job's; `data` is the buffer, back for reuse.
    Written {
        id: u64,
        stream: u64,
        data: Vec<u8>,
        result: std::io::Result<Wrote>,
    },
    Checkpointed {
        id: u64,
        result: std::io::Result<()>,
    },
    /// `waiting`: verified but not placed (a durable session's file waits
    /// for a [`Job::Commit`]).
    Finished {
        id: u64,
        result: Result<[u8; 32], longhaul_transfer::place::FinishError>,
        waiting: bool,
    },
    /// Of [`Job::Finish`] of a shard's slice.
    SliceFinished {
        id: u64,
        result: Result<longhaul_transfer::slice::SliceEnd, longhaul_transfer::place::FinishError>,
    },
    /// Of [`Job::Plan`]: the plan every shard follows, or why there is none.
    Planned(Result<Arc<Plan>, String>),
    /// Of [`Job::Commit`]: each file placed, or why not.
    Committed(Vec<(u64, Result<[u8; 32], longhaul_transfer::place::FinishError>)>),
    Discarded {
        id: u64,
    },
    Closed,
    /// Of [`Job::Probe`]: what would change (None: nothing).
    Probed {
        target: RelPath,
        result: std::io::Result<Option<What>>,
    },
    /// Of [`Job::FinishDirs`]: each hard link's name and outcome (in a dry
    /// run, whether it would be made), each path removed (or that would
    /// be) with whether it is a directory and the outcome, and the
    /// directories'.
    DirsFinished {
        links: Vec<(RelPath, std::io::Result<bool>)>,
        deleted: Vec<(RelPath, bool, std::io::Result<()>)>,
        dirs: std::io::Result<()>,
    },
    Synced(std::io::Result<()>),
}

/// Something the driver acts on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A record of this stream is dealt with (written, or dropped); its
    /// buffer comes back. The driver bounds what a stream has in the core's
    /// hands, so a slow disk holds the streams.
    StreamReady { stream: u64, spare: Vec<u8> },
}

/// The states of one announced file.
#[derive(Debug)]
enum Phase {
    /// [`Job::Open`] is out; records that came meanwhile wait here.
    Opening(Vec<Record>),
    Open,
}

#[derive(Debug)]
struct InFile {
    display: String,
    /// Where it lands beneath the base.
    target: RelPath,
    plan: ChunkPlan,
    phase: Phase,
    /// Chunk ranges wanted (`None`: all). Chunks outside were resumed.
    wanted: Option<Vec<(u64, u64)>>,
    /// Chunks written or being written (grows with the data, never with
    /// the size the entry claims).
    got: BTreeSet<u64>,
    /// Wanted chunks not yet written.
    missing: u64,
    writing: usize,
    expected: Option<[u8; 32]>,
    received: u64,
    resumed: u64,
    /// Written chunks not yet journaled (files of several chunks).
    unjournaled: usize,
    /// When the last synced checkpoint went out (the file's opening, at first).
    synced_at: Instant,
    checkpointing: bool,
    /// A finishing job (`Finish`, `Discard`, `Close`, or a settling write) is out.
    settling: bool,
    /// A dry run's `--checksum`: the local BLAKE3 the sender's is compared
    /// with, and whether the mtimes differ.
    compare: Option<([u8; 32], bool)>,
}

impl InFile {
    fn wanted(&self, index: u64) -> bool {
        self.wanted
            .as_ref()
            .is_none_or(|r| r.iter().any(|&(a, b)| (a..b).contains(&index)))
    }

    fn complete(&self) -> bool {
        matches!(self.phase, Phase::Open)
            && self.missing == 0
            && self.writing == 0
            && self.expected.is_some()
            && !self.settling
    }
}

/// The receiving role's state machine.
pub(crate) struct RecvCore {
    cfg: RecvConfig,
    landing: Landing,
    progress: Arc<Progress>,
    root_kinds: HashMap<u32, EntryKind>,
    /// The files this session announced, by a hash of where they land: what
    /// a hard link may name (8 bytes a file).
    file_targets: std::collections::HashSet<u64>,
    /// Files that vanished on the sending side: what was opened of them is
    /// removed, not kept.
    vanished: std::collections::HashSet<u64>,
    /// Hard links to make once every file is placed: the new name, and
    /// where the file it names was placed.
    links: Vec<(RelPath, RelPath)>,
    /// `--delete`: the keys of every target the manifest names, and its
    /// directories.
    named: HashSet<u64>,
    mirror_dirs: Vec<RelPath>,
    /// The sender could not read part of its trees (`RootError`,
    /// `EntryError`): `--delete` removes nothing, as what it left out may
    /// still be there.
    unread: bool,
    /// The highest entry id seen (ids must rise).
    last_entry: u64,
    manifest_done: bool,
    /// A shard's plan, once known.
    plan: Option<Arc<Plan>>,
    /// A shard's file entries held until the plan is made: each with where
    /// it lands and how it is shown.
    held: Vec<(Entry, RelPath, String)>,
    /// A shard's [`Job::Plan`] is out.
    planning: bool,
    /// A shard: the plan's files the manifest announced.
    in_manifest: HashSet<usize>,
    files: HashMap<u64, InFile>,
    /// Files the sender gave up on (`FileFailed`): records of theirs still on
    /// their way (the control stream overtakes the data) are dropped.
    failed: HashSet<u64>,
    /// Fresh sessions: records of entries not yet announced, and their bytes.
    waiting: BTreeMap<u64, Vec<Record>>,
    waiting_bytes: u64,
    /// Records that came before their entry, and the most bytes that
    /// waited so at once (for the log: was the manifest behind the data?).
    ahead: (u64, u64),
    /// Jobs out (not yet `Done`).
    busy: usize,
    /// The end: FinishDirs, then SyncFs, then `Done`.
    ending: bool,
    /// Verified files waiting for the next [`Job::Commit`], and whether one is out.
    to_commit: Vec<u64>,
    /// When the oldest of `to_commit` began to wait.
    waiting_since: Option<Instant>,
    committing: bool,
    frames: VecDeque<Frame>,
    jobs: VecDeque<Job>,
    events: VecDeque<Event>,
    report: SessionReport,
    state: State,
}

fn protocol(msg: impl Into<String>) -> Problem {
    Problem::new(
        Kind::Connection,
        format!("protocol error from the sender: {}", msg.into()),
    )
}

fn io_problem(path: &str, e: impl std::fmt::Display) -> Problem {
    Problem::at(Kind::LocalIo, path, e.to_string())
}

impl RecvCore {
    pub(crate) fn new(cfg: RecvConfig, landing: Landing, progress: Arc<Progress>) -> RecvCore {
        RecvCore {
            plan: cfg.shard.as_ref().and_then(|(_, p)| p.clone()),
            cfg,
            landing,
            progress,
            root_kinds: HashMap::new(),
            links: Vec::new(),
            named: HashSet::new(),
            mirror_dirs: Vec::new(),
            unread: false,
            vanished: Default::default(),
            file_targets: Default::default(),
            last_entry: 0,
            manifest_done: false,
            held: Vec::new(),
            planning: false,
            in_manifest: HashSet::new(),
            files: HashMap::new(),
            failed: HashSet::new(),
            waiting: BTreeMap::new(),
            waiting_bytes: 0,
            ahead: (0, 0),
            busy: 0,
            ending: false,
            to_commit: Vec::new(),
            waiting_since: None,
            committing: false,
            frames: VecDeque::new(),
            jobs: VecDeque::new(),
            events: VecDeque::new(),
            report: SessionReport::default(),
            state: State::Running,
        }
    }

    /// The report so far (complete once the state is not `Running`); a
    /// failed session's files under way in its `unsettled`.
    pub(crate) fn take_report(&mut self) -> SessionReport {
        if matches!(self.state, State::Failed(_)) {
            self.report.unsettled = self
                .files
                .values()
                .map(|f| unsettled(&f.display, f.plan.size, f.received, f.resumed))
                .collect();
        }
        std::mem::take(&mut self.report)
    }

    pub(crate) fn poll_frame(&mut self) -> Option<Frame> {
        self.frames.pop_front()
    }

    pub(crate) fn poll_job(&mut self) -> Option<Job> {
        let j = self.jobs.pop_front();
        if j.is_some() {
            self.busy += 1;
        }
        j
    }

    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Records that came before their entry, and the most bytes that
    /// waited for entries at once.
    pub(crate) fn ahead_of_manifest(&self) -> (u64, u64) {
        self.ahead
    }

    /// Record bytes held for entries not yet announced or opened.
    #[cfg(test)]
    pub(crate) fn waiting_bytes(&self) -> u64 {
        self.waiting_bytes
    }

    fn running(&self) -> bool {
        self.state == State::Running
    }

    /// End the session before it starts, for `p` (its peer is told why
    /// when it is this side's fault).
    pub(crate) fn refuse(&mut self, p: Problem) {
        self.fail(p);
    }

    fn fail(&mut self, p: Problem) {
        if !self.running() {
            return;
        }
        if p.kind == Kind::LocalIo {
            self.frames.push_back(Frame::Fatal {
                code: ErrorCode::Io,
                message: format!("the receiver failed: {p}"),
            });
        }
        self.jobs.clear();
        self.state = State::Failed(p);
    }

    fn on_frame(&mut self, now: Instant, frame: Frame) -> Result<(), Problem> {
        match frame {
            Frame::Entry(e) => self.on_entry(now, e),
            Frame::RootError {
                root,
                code,
                message,
            } => {
                // The sender's message names its path ("nope: No such
                // file..."); naming the local root too printed it twice.
                if self.landing.roots.get(root as usize).is_none() {
                    return Err(protocol(format!("RootError for unknown root {root}")));
                }
                self.unread = true;
                self.report.problems.push(Problem::new(
                    Kind::of_peer(code),
                    format!("at the source: {message}"),
                ));
                Ok(())
            }
            Frame::EntryError { path, message, .. } => {
                self.unread = true;
                self.report.problems.push(Problem::at(
                    Kind::Remote,
                    String::from_utf8_lossy(&path),
                    message,
                ));
                Ok(())
            }
            Frame::ManifestEnd => {
                self.manifest_done = true;
                if self.cfg.shard.is_some() && self.plan.is_none() {
                    let items = self
                        .held
                        .iter()
                        .map(|(e, _, _)| longhaul_transfer::shard::Item {
                            root: e.root,
                            path: e.path.clone(),
                            size: e.size,
                            mtime_ns: e.mtime_ns,
                        })
                        .collect();
                    self.planning = true;
                    self.jobs.push_back(Job::Plan {
                        listing: longhaul_transfer::shard::Listing::new(items),
                    });
                } else {
                    self.report_unannounced();
                }
                // Records still waiting name files that were never announced.
                self.release_waiting(now, u64::MAX)
            }
            Frame::FileDone {
                id,
                hash,
                unchanged,
            } => {
                let f = self
                    .files
                    .get_mut(&id)
                    .ok_or_else(|| protocol(format!("FileDone for unknown file {id}")))?;
                if f.expected.is_some() {
                    return Err(protocol(format!("second FileDone for file {id}")));
                }
                if unchanged && (f.settling || matches!(f.phase, Phase::Opening(_))) {
                    return Err(protocol(format!(
                        "FileDone unchanged for file {id} before its Want"
                    )));
                }
                f.expected = Some(hash);
                if let Some((local, mtime)) = f.compare {
                    // A dry run's --checksum: no data follows.
                    let f = self.files.remove(&id).expect("looked up above");
                    let same = local == hash && !unchanged;
                    self.would(
                        id,
                        f,
                        (!same).then_some(What::File {
                            new: false,
                            size: false,
                            mtime,
                            checksum: true,
                        }),
                    );
                    return Ok(());
                }
                if unchanged {
                    f.settling = true;
                    self.jobs.push_back(Job::Discard { id });
                } else {
                    self.finish_if_complete(id);
                }
                Ok(())
            }
            Frame::FileFailed {
                id,
                message,
                vanished,
                again,
            } => {
                self.failed.insert(id);
                let f = self
                    .files
                    .get_mut(&id)
                    .ok_or_else(|| protocol(format!("FileFailed for unknown file {id}")))?;
                if f.settling {
                    return Err(protocol(format!("FileFailed for file {id} after its hash")));
                }
                if again {
                    // Sent again under the next entry: nothing of this one is
                    // kept (a journaled part is removed before the next one
                    // claims the name) or reported.
                    let f = self.files.remove(&id).expect("looked up above");
                    tracing::info!(
                        "{}: changed at the source while sent; sent again",
                        f.display
                    );
                    let sub = |c: &std::sync::atomic::AtomicU64, n: u64| {
                        c.fetch_sub(n, std::sync::atomic::Ordering::Relaxed)
                    };
                    sub(&self.progress.files_total, 1);
                    sub(&self.progress.bytes_total, f.plan.size);
                    sub(&self.progress.bytes_done, f.received + f.resumed);
                    self.vanished.insert(id);
                    self.jobs.push_back(match f.plan.count() > 1 {
                        true => Job::Discard { id },
                        // (A file of one chunk leaves no journal: its part
                        // is simply not placed.)
                        false => Job::Close { id },
                    });
                    return Ok(());
                }
                // A write of it may still be out: its Done finds the file gone.
                let display = f.display.clone();
                let (size, received) = (f.plan.size, f.received);
                self.files.remove(&id);
                // A file that vanished leaves no part or journal to resume.
                let p = match vanished {
                    true => {
                        self.vanished.insert(id);
                        self.jobs.push_back(Job::Discard { id });
                        Problem::at(Kind::Vanished, display.clone(), message)
                    }
                    false => {
                        self.jobs.push_back(Job::Close { id });
                        Problem::at(Kind::Remote, display.clone(), message)
                    }
                };
                self.settle(id, display, size, received, Status::Failed, Some(p));
                Ok(())
            }
            Frame::Fatal { code, message } => Err(Problem::new(Kind::of_peer(code), message)),
            other => Err(protocol(format!("unexpected {other:?}"))),
        }
    }

    fn on_entry(&mut self, now: Instant, mut e: Entry) -> Result<(), Problem> {
        e.mode = longhaul_transfer::place::received_mode(e.mode, self.cfg.exact_modes);
        // Ids rise: a reused one would hand a write in flight for the old
        // file to the new one, which would be placed with that chunk never
        // written.
        if e.id <= self.last_entry {
            return Err(protocol(format!(
                "entry id {} after {}: entry ids must rise",
                e.id, self.last_entry
            )));
        }
        self.last_entry = e.id;
        let path = RelPath::from_wire(&e.path).map_err(|err| protocol(err.to_string()))?;
        if path.is_root() {
            self.root_kinds.insert(e.root, e.kind);
        }
        let kind = *self
            .root_kinds
            .get(&e.root)
            .ok_or_else(|| protocol(format!("entry before its root {}", e.root)))?;
        let target = self.landing.target(e.root, kind, &path).map_err(protocol)?;
        let display = target.display();
        if is_reserved_name(target.file_name()) {
            return Err(io_problem(
                &display,
                "a name longhaul keeps for its own part, journal and link files; not received",
            ));
        }
        if self.cfg.delete.is_some() {
            self.named.insert(path_key(&target));
            if e.kind == EntryKind::Dir {
                self.mirror_dirs.push(target.clone());
            }
        }
        let asked = match e.kind {
            k if k.is_device() => self.cfg.devices,
            EntryKind::Fifo | EntryKind::Socket => self.cfg.specials,
            _ => true,
        };
        if self.cfg.dry_run && asked && !matches!(e.kind, EntryKind::File | EntryKind::HardLink) {
            match e.kind {
                EntryKind::Dir => self.report.dirs += 1,
                EntryKind::Symlink => self.report.symlinks += 1,
                _ => {}
            }
            self.jobs.push_back(Job::Probe { target, entry: e });
            return Ok(());
        }
        match e.kind {
            EntryKind::Dir => {
                self.report.dirs += 1;
                self.jobs.push_back(Job::Dir {
                    target,
                    mode: e.mode,
                    mtime_ns: e.mtime_ns,
                    sent: sent(&mut e),
                });
            }
            EntryKind::Symlink => {
                self.report.symlinks += 1;
                self.jobs.push_back(Job::Symlink {
                    target,
                    link: e.link.clone(),
                    mtime_ns: e.mtime_ns,
                    sent: sent(&mut e),
                });
            }
            k @ (EntryKind::Fifo
            | EntryKind::Socket
            | EntryKind::CharDevice
            | EntryKind::BlockDevice) => {
                if asked {
                    self.jobs.push_back(Job::Special {
                        target,
                        kind: k,
                        rdev: e.size,
                        mode: longhaul_transfer::place::received_mode(e.mode, self.cfg.exact_modes),
                        mtime_ns: e.mtime_ns,
                        sent: sent(&mut e),
                    });
                } else {
                    self.report.not_made.push(crate::report::NotMade {
                        path: display,
                        kind: k.name(),
                        why: not_asked(k).into(),
                    });
                }
            }
            EntryKind::HardLink => {
                // (Pre-order and sorted: the first name came before.)
                let first = RelPath::from_wire(&e.link).map_err(|err| protocol(err.to_string()))?;
                let first = self
                    .landing
                    .target(e.root, kind, &first)
                    .map_err(protocol)?;
                // Only to a file this session announced: not to whatever
                // else the destination holds.
                if first == target || !self.file_targets.contains(&path_key(&first)) {
                    return Err(protocol(format!(
                        "{display}: a hard link to a name that is not a file of this session"
                    )));
                }
                // (A shard does not hold every file a link may name: the
                // links are made by `--shard finish`.)
                if self.cfg.shard.is_none() {
                    self.links.push((target, first));
                }
            }
            EntryKind::File => {
                self.file_targets.insert(path_key(&target));
                if e.size > MAX_FILE_SIZE {
                    return Err(protocol(format!(
                        "{display}: a file of {} bytes is larger than the {MAX_FILE_SIZE} bytes accepted",
                        e.size
                    )));
                }
                match (&self.cfg.shard, &self.plan) {
                    (None, _) => self.open_file(now, e.clone(), target, display, None),
                    (Some(_), Some(_)) => self.shard_file(now, e.clone(), target, display),
                    (Some(_), None) => self.held.push((e.clone(), target, display)),
                }
            }
        }
        // Records that overtook this entry (or an earlier one that never came).
        self.release_waiting(now, e.id)
    }

    /// Open a file entry (`slice`: only a shard's chunks of it).
    fn open_file(
        &mut self,
        now: Instant,
        e: Entry,
        target: RelPath,
        display: String,
        slice: Option<(u64, u64, Vec<longhaul_transfer::shard::Run>)>,
    ) {
        Progress::add(&self.progress.files_total, 1);
        Progress::add(&self.progress.bytes_total, e.size);
        self.files.insert(
            e.id,
            InFile {
                display,
                target: target.clone(),
                plan: ChunkPlan::new(e.size),
                phase: Phase::Opening(Vec::new()),
                wanted: None,
                got: BTreeSet::new(),
                missing: 0,
                writing: 0,
                expected: None,
                received: 0,
                resumed: 0,
                unjournaled: 0,
                synced_at: now,
                checkpointing: false,
                settling: false,
                compare: None,
            },
        );
        self.jobs.push_back(Job::Open {
            id: e.id,
            target,
            sync: self.cfg.sync,
            fresh: self.cfg.fresh,
            dry: self.cfg.dry_run,
            entry: e,
            slice,
        });
    }

    /// A shard's file: open what the plan gives this shard of it; want
    /// nothing of the rest.
    fn shard_file(&mut self, now: Instant, e: Entry, target: RelPath, display: String) {
        let (Some((shard, _)), Some(plan)) = (&self.cfg.shard, &self.plan) else {
            return;
        };
        let (shard, plan) = (*shard, plan.clone());
        let fail = |me: &mut RecvCore, why: &str| {
            me.frames.push_back(Frame::Want {
                id: e.id,
                want: Want::Skip,
            });
            let p = Problem::at(Kind::Remote, display.clone(), why.to_string());
            me.settle(e.id, display.clone(), e.size, 0, Status::Failed, Some(p));
        };
        let found = plan.find(e.root, &e.path);
        if let Some((i, _)) = found {
            self.in_manifest.insert(i);
        }
        let Some((i, item)) = found else {
            return fail(
                self,
                "not in the shard plan: the source gained it after its listing; \
                 a transfer without --shard brings it",
            );
        };
        if item.size != e.size || item.mtime_ns != e.mtime_ns {
            return fail(
                self,
                "changed since the shard plan listed it; a transfer without --shard brings it",
            );
        }
        match plan.part(i, shard.index) {
            Part::None => {
                self.report.other_shards += 1;
                self.frames.push_back(Frame::Want {
                    id: e.id,
                    want: Want::Skip,
                });
            }
            Part::Whole => self.open_file(now, e, target, display, None),
            Part::Chunks { first, end } => {
                let runs = plan.runs(i).to_vec();
                self.open_file(now, e, target, display, Some((first, end, runs)))
            }
        }
    }

    /// Once the manifest has ended and the plan is known: the files of the
    /// plan this shard moves that the sender did not announce are gone
    /// from the source (or were left out), and reported so.
    fn report_unannounced(&mut self) {
        let (Some((shard, _)), Some(plan)) = (&self.cfg.shard, &self.plan) else {
            return;
        };
        let (shard, plan) = (*shard, plan.clone());
        for (i, item) in plan.listing().items().iter().enumerate() {
            if self.in_manifest.contains(&i) || plan.part(i, shard.index) == Part::None {
                continue;
            }
            let path = RelPath::from_wire(&item.path).ok();
            let kind = self.root_kinds.get(&item.root).copied();
            let display = match (path, kind) {
                (Some(p), Some(k)) => match self.landing.target(item.root, k, &p) {
                    Ok(t) => t.display(),
                    Err(_) => p.display(),
                },
                (Some(p), None) => p.display(),
                (None, _) => String::from_utf8_lossy(&item.path).into_owned(),
            };
            let why = "not at the source: gone since the shard plan listed it";
            let p = Problem::at(Kind::Vanished, display.clone(), why);
            self.report_file(display, item.size, 0, Status::Failed, Some(p));
        }
    }

    /// Hand records waiting for entries up to `upto` on.
    fn release_waiting(&mut self, now: Instant, upto: u64) -> Result<(), Problem> {
        if self.waiting.is_empty() {
            return Ok(());
        }
        let stay = match upto.checked_add(1) {
            Some(next) => self.waiting.split_off(&next),
            None => BTreeMap::new(),
        };
        let go = std::mem::replace(&mut self.waiting, stay);
        for r in go.into_values().flatten() {
            self.waiting_bytes -= r.data.len() as u64;
            self.on_record(now, r)?;
        }
        Ok(())
    }

    pub(crate) fn handle_record(&mut self, now: Instant, r: Record) {
        if !self.running() {
            return;
        }
        if let Err(p) = self.on_record(now, r) {
            self.fail(p);
        }
        self.commit_if_due(now);
        self.check_end();
    }

    fn ready(&mut self, stream: u64, spare: Vec<u8>) {
        self.events.push_back(Event::StreamReady { stream, spare });
    }

    fn on_record(&mut self, now: Instant, r: Record) -> Result<(), Problem> {
        let h = r.header;
        // The entry travels on the control stream and may come later.
        if h.id > self.last_entry && !self.manifest_done {
            if !self.cfg.fresh {
                return Err(protocol(format!(
                    "data for unknown or settled file {}",
                    h.id
                )));
            }
            let held = self.waiting_bytes + r.data.len() as u64;
            if held > self.cfg.max_waiting {
                return Err(protocol(format!(
                    "more than {} of data waits for manifest entries (file {} not announced)",
                    longhaul_transfer::units::show_size(self.cfg.max_waiting),
                    h.id
                )));
            }
            self.waiting_bytes = held;
            self.ahead = (self.ahead.0 + 1, self.ahead.1.max(held));
            self.waiting.entry(h.id).or_default().push(r);
            return Ok(());
        }
        if !self.files.contains_key(&h.id) && self.failed.contains(&h.id) {
            // The sender gave the file up after sending this.
            self.ready(r.stream, r.data);
            return Ok(());
        }
        let f = self
            .files
            .get_mut(&h.id)
            .ok_or_else(|| protocol(format!("data for unknown or settled file {}", h.id)))?;
        if let Phase::Opening(held) = &mut f.phase {
            self.waiting_bytes += r.data.len() as u64;
            held.push(r);
            return Ok(());
        }
        let index = h.chunk();
        match f.plan.len(index) {
            None => {
                return Err(protocol(format!(
                    "chunk {index} is beyond the file ({} bytes)",
                    f.plan.size
                )))
            }
            Some(l) if l != h.len as u64 => {
                return Err(protocol(format!(
                    "chunk {index} has {} bytes, expected {l}",
                    h.len
                )))
            }
            Some(_) if f.got.contains(&index) || !f.wanted(index) => {
                return Err(protocol(format!("chunk {index} sent twice")))
            }
            Some(_)
                if r.data.len() != h.data_len() as usize || r.zero_digest.is_some() != h.zeros =>
            {
                return Err(protocol(format!(
                    "chunk {index}: a chunk of zeros with data"
                )))
            }
            Some(_) => {}
        }
        if h.zeros {
            // (Written as it is: no data moves for it.)
            Progress::add(&self.progress.bytes_done, h.len as u64);
        }
        if let Some(hash) = r.hash {
            if f.plan.count() != 1 || f.expected.is_some() {
                return Err(protocol(format!(
                    "a hash on a record of file {}, which has {} chunks{}",
                    h.id,
                    f.plan.count(),
                    if f.expected.is_some() {
                        " and whose hash came already"
                    } else {
                        ""
                    }
                )));
            }
            f.expected = Some(hash);
        }
        f.got.insert(index);
        f.writing += 1;
        if f.plan.count() == 1 {
            // Its writer settles it (with the hash, if known by now).
            f.settling = f.expected.is_some();
        }
        let _ = now;
        self.jobs.push_back(Job::Write {
            id: h.id,
            index,
            data: r.data,
            shape: Shape {
                zeros: h.zeros,
                sparse: h.sparse,
            },
            zero_digest: r.zero_digest,
            expected: f.expected,
            stream: r.stream,
        });
        Ok(())
    }

    pub(crate) fn handle_done(&mut self, now: Instant, done: Done) {
        self.busy -= 1;
        if self.running() {
            if let Err(p) = self.on_done(now, done) {
                self.fail(p);
            }
            self.commit_if_due(now);
        } else if let Done::Written { stream, data, .. } = done {
            self.ready(stream, data);
        }
        self.check_end();
    }

    fn on_done(&mut self, now: Instant, done: Done) -> Result<(), Problem> {
        match done {
            Done::Made { target, result } => result.map_err(|e| io_problem(&target.display(), e)),
            Done::MadeSpecial {
                target,
                kind,
                result,
            } => {
                match result {
                    Ok(()) => self.report.specials += 1,
                    Err(e) => {
                        let why = match e.raw_os_error() {
                            Some(libc::EPERM) if kind.is_device() => {
                                format!("{e} (device nodes need root)")
                            }
                            _ => e.to_string(),
                        };
                        let path = target.display();
                        self.report.not_made.push(crate::report::NotMade {
                            path: path.clone(),
                            kind: kind.name(),
                            why: why.clone(),
                        });
                        self.report.problems.push(Problem::at(
                            Kind::LocalIo,
                            path,
                            format!("making a {}: {why}", kind.name()),
                        ));
                    }
                }
                Ok(())
            }
            Done::Opened { id, result } => self.on_opened(now, id, result),
            Done::Written {
                id,
                stream,
                data,
                result,
                ..
            } => {
                let len = data.len() as u64;
                self.ready(stream, data);
                self.on_written(now, id, len, result)
            }
            Done::Checkpointed { id, result } => {
                if let Some(f) = self.files.get_mut(&id) {
                    f.checkpointing = false;
                    if let Err(e) = result {
                        return Err(io_problem(&f.display, e));
                    }
                    self.checkpoint_if_due(now, id);
                    self.finish_if_complete(id);
                } else if let Err(e) = result {
                    return Err(Problem::new(Kind::LocalIo, e.to_string()));
                }
                Ok(())
            }
            Done::Finished {
                id,
                result,
                waiting,
            } => {
                if waiting && result.is_ok() {
                    if self.files.contains_key(&id) {
                        self.to_commit.push(id);
                    }
                    return Ok(());
                }
                self.finished(id, result)
            }
            Done::SliceFinished { id, result } => {
                use longhaul_transfer::slice::SliceEnd;
                match result {
                    Ok(SliceEnd::Placed(root)) => self.finished(id, Ok(root)),
                    Ok(SliceEnd::Waiting(_) | SliceEnd::PlacedByOther) => {
                        let Some(f) = self.files.remove(&id) else {
                            return Ok(());
                        };
                        self.report.files.push(FileReport {
                            path: f.display,
                            size: f.plan.size,
                            status: Status::Slice,
                            bytes_transferred: f.received,
                            bytes_resumed: f.resumed,
                            blake3: None,
                            error: None,
                        });
                        Progress::add(&self.progress.files_done, 1);
                        self.frames.push_back(Frame::FileResult {
                            id,
                            outcome: Outcome::Verified,
                        });
                        Ok(())
                    }
                    Err(e) => self.finished(id, Err(e)),
                }
            }
            Done::Planned(result) => {
                self.planning = false;
                let plan = result.map_err(|e| Problem::new(Kind::LocalIo, e))?;
                self.plan = Some(plan);
                for (e, target, display) in std::mem::take(&mut self.held) {
                    self.shard_file(now, e, target, display);
                }
                self.report_unannounced();
                Ok(())
            }
            Done::Committed(results) => {
                self.committing = false;
                for (id, result) in results {
                    self.finished(id, result)?;
                }
                Ok(())
            }
            Done::Discarded { id } => {
                // The sender's file equals ours (`UnlessHash`).
                let Some(f) = self.files.remove(&id) else {
                    return Ok(());
                };
                self.settle(id, f.display, f.plan.size, 0, Status::Skipped, None);
                Ok(())
            }
            Done::Closed => Ok(()),
            Done::Probed { target, result } => {
                match result {
                    Ok(Some(what)) => self.changed(&target, what),
                    Ok(None) => {}
                    Err(e) => self.report.problems.push(io_problem(&target.display(), e)),
                }
                Ok(())
            }
            Done::DirsFinished {
                links,
                deleted,
                dirs: r,
            } => {
                for (name, made) in links {
                    match made {
                        Ok(true) if self.cfg.dry_run => self.changed(&name, What::HardLink),
                        Ok(true) => self.report.hardlinks += 1,
                        Ok(false) => {}
                        Err(e) => self.report.problems.push(Problem::at(
                            Kind::LocalIo,
                            name.display(),
                            format!("making a hard link: {e}"),
                        )),
                    }
                }
                for (path, dir, result) in deleted {
                    match result {
                        Ok(()) => self.changed(&path, What::Deleted { dir }),
                        Err(e) => self.report.problems.push(Problem::at(
                            Kind::LocalIo,
                            path.display(),
                            format!("deleting: {e}"),
                        )),
                    }
                }
                if let Err(e) = r {
                    self.report
                        .problems
                        .push(Problem::new(Kind::LocalIo, e.to_string()));
                }
                for batch in self.report.changes.chunks(CHANGES_PER_FRAME) {
                    self.frames.push_back(Frame::Changes(batch.to_vec()));
                }
                if self.cfg.durable && !self.cfg.dry_run && self.report.problems.is_empty() {
                    self.jobs.push_back(Job::SyncFs);
                } else {
                    self.end();
                }
                Ok(())
            }
            Done::Synced(r) => {
                if let Err(e) = r {
                    self.report.problems.push(Problem::new(
                        Kind::LocalIo,
                        format!("syncing the destination: {e}"),
                    ));
                }
                self.end();
                Ok(())
            }
        }
    }

    /// A file's finishing job (or its commit) is back: placed, or why not.
    fn finished(
        &mut self,
        id: u64,
        result: Result<[u8; 32], longhaul_transfer::place::FinishError>,
    ) -> Result<(), Problem> {
        let Some(f) = self.files.remove(&id) else {
            return Ok(());
        };
        let size = f.plan.size;
        match result {
            Ok(root) => {
                self.placed(id, f.display, size, f.received, f.resumed, root);
                Ok(())
            }
            Err(longhaul_transfer::place::FinishError::Mismatch { expected, actual }) => {
                self.mismatched(id, f.display, size, f.received, expected, actual);
                Ok(())
            }
            Err(longhaul_transfer::place::FinishError::Io(e)) => Err(io_problem(&f.display, e)),
        }
    }

    /// Files the driver placed after the session failed (verified before,
    /// synced and placed as it closed): reported like any other.
    pub(crate) fn placed_late(&mut self, placed: Vec<(u64, [u8; 32])>) {
        for (id, root) in placed {
            // (Placed: this cannot fail.)
            let _ = self.finished(id, Ok(root));
        }
    }

    /// The time so far during which the driver read no data because the
    /// receiver was behind: the report's, and `Done`'s.
    pub(crate) fn set_held_back(&mut self, d: Duration) {
        self.report.held_back_s = d.as_secs_f64();
    }

    /// When the core wants [`RecvCore::handle_timeout`] at the latest: the
    /// verified files waiting for a commit are due then, even if nothing
    /// else happens (a sender that went silent).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if !self.running() || self.committing {
            return None;
        }
        self.waiting_since.map(|t| t + COMMIT_EVERY)
    }

    /// The time is `now` (see [`RecvCore::poll_timeout`]).
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.commit_if_due(now);
        self.check_end();
    }

    /// Send the verified files waiting for their names to the disk, unless
    /// a commit is out (its end calls this again).
    fn commit_if_due(&mut self, now: Instant) {
        if !self.running() || self.committing || self.to_commit.is_empty() {
            return;
        }
        let since = *self.waiting_since.get_or_insert(now);
        // Nothing else is coming: no reason to wait for more.
        let last = self.manifest_done
            && self.waiting.is_empty()
            && self.files.len() == self.to_commit.len();
        if last
            || self.to_commit.len() >= COMMIT_FILES
            || now.saturating_duration_since(since) >= COMMIT_EVERY
        {
            self.committing = true;
            self.waiting_since = None;
            let ids = std::mem::take(&mut self.to_commit);
            self.jobs.push_back(Job::Commit { ids });
        }
    }

    fn on_opened(
        &mut self,
        now: Instant,
        id: u64,
        result: std::io::Result<Opened>,
    ) -> Result<(), Problem> {
        let Some(f) = self.files.get_mut(&id) else {
            // The sender gave it up meanwhile: close what was opened (or,
            // for a file that vanished there, remove it).
            if matches!(result, Ok(Opened::Open { .. })) {
                match self.vanished.contains(&id) {
                    true => self.jobs.push_back(Job::Discard { id }),
                    false => self.jobs.push_back(Job::Close { id }),
                }
            }
            return Ok(());
        };
        let opened = result.map_err(|e| io_problem(&f.display, e))?;
        let held = match std::mem::replace(&mut f.phase, Phase::Open) {
            Phase::Opening(held) => held,
            Phase::Open => return Err(protocol(format!("file {id} opened twice"))),
        };
        match opened {
            Opened::Would(what) => {
                let f = self.files.remove(&id).expect("looked up above");
                self.frames.push_back(Frame::Want {
                    id,
                    want: Want::Skip,
                });
                self.would(id, f, Some(what));
            }
            Opened::Compare { local, mtime } => {
                f.compare = Some((local, mtime));
                f.wanted = Some(Vec::new());
                self.frames.push_back(Frame::Want {
                    id,
                    want: Want::HashOnly,
                });
            }
            Opened::Skip => {
                let f = self.files.remove(&id).expect("looked up above");
                let size = f.plan.size;
                if !self.cfg.fresh {
                    self.frames.push_back(Frame::Want {
                        id,
                        want: Want::Skip,
                    });
                }
                self.settle(id, f.display, size, 0, Status::Skipped, None);
                // A fresh session never skips; anything held is refused below.
                for r in held {
                    self.waiting_bytes -= r.data.len() as u64;
                    self.on_record(now, r)?;
                }
            }
            Opened::Open {
                want,
                resumed_bytes,
            } => {
                f.wanted = match &want {
                    Want::Chunks(r) | Want::Slice { send: r, .. } => Some(r.clone()),
                    _ => None,
                };
                f.missing = match &f.wanted {
                    Some(r) => r.iter().map(|&(a, b)| b.saturating_sub(a)).sum(),
                    None => f.plan.count(),
                };
                f.resumed = resumed_bytes;
                Progress::add(&self.progress.bytes_done, resumed_bytes);
                if !self.cfg.fresh {
                    self.frames.push_back(Frame::Want { id, want });
                }
                for r in held {
                    self.waiting_bytes -= r.data.len() as u64;
                    self.on_record(now, r)?;
                }
                // A file of no chunks, or all resumed: complete with its hash.
                self.finish_if_complete(id);
            }
        }
        Ok(())
    }

    fn on_written(
        &mut self,
        now: Instant,
        id: u64,
        len: u64,
        result: std::io::Result<Wrote>,
    ) -> Result<(), Problem> {
        let Some(f) = self.files.get_mut(&id) else {
            return Ok(()); // failed meanwhile
        };
        let wrote = result.map_err(|e| io_problem(&f.display, e))?;
        f.writing -= 1;
        f.missing -= 1;
        f.received += len;
        Progress::add(&self.progress.bytes_done, len);
        match wrote {
            Wrote::Settled(Settled::Placed(root)) => {
                let f = self.files.remove(&id).expect("looked up above");
                self.placed(id, f.display, f.plan.size, f.received, 0, root);
                return Ok(());
            }
            Wrote::Settled(Settled::Mismatch { expected, actual }) => {
                // The writer removed the part.
                let f = self.files.remove(&id).expect("looked up above");
                self.mismatched(id, f.display, f.plan.size, f.received, expected, actual);
                return Ok(());
            }
            Wrote::Settled(Settled::Parked) => f.settling = false,
            Wrote::Settled(Settled::Verified(_)) => {
                // Its name waits for its data to reach the disk.
                f.settling = true;
                self.to_commit.push(id);
                return Ok(());
            }
            Wrote::Chunk => {
                if f.plan.count() > 1 {
                    f.unjournaled += 1;
                }
            }
        }
        self.checkpoint_if_due(now, id);
        self.finish_if_complete(id);
        Ok(())
    }

    /// Journal file `id`'s newly written chunks, unless a checkpoint is out
    /// (its end calls this again) or the file is complete (its end journals
    /// nothing: the part is placed).
    fn checkpoint_if_due(&mut self, now: Instant, id: u64) {
        let Some(f) = self.files.get_mut(&id) else {
            return;
        };
        if f.unjournaled > 0 && !f.checkpointing && f.missing > 0 {
            let sync = now.saturating_duration_since(f.synced_at) >= SYNC_EVERY;
            f.unjournaled = 0;
            if sync {
                f.synced_at = now;
            }
            f.checkpointing = true;
            self.jobs.push_back(Job::Checkpoint { id, sync });
        }
    }

    fn finish_if_complete(&mut self, id: u64) {
        let Some(f) = self.files.get_mut(&id) else {
            return;
        };
        if f.complete() && !f.checkpointing {
            f.settling = true;
            let expected = f.expected.expect("complete");
            let size = f.plan.size;
            self.jobs.push_back(Job::Finish { id, expected, size });
        }
    }

    /// Report a file verified and placed, and tell the sender.
    fn placed(
        &mut self,
        id: u64,
        display: String,
        size: u64,
        received: u64,
        resumed: u64,
        root: [u8; 32],
    ) {
        self.report.files.push(FileReport {
            path: display,
            size,
            status: Status::Verified,
            bytes_transferred: received,
            bytes_resumed: resumed,
            blake3: Some(longhaul_transfer::chunk::hex(&root)),
            error: None,
        });
        Progress::add(&self.progress.files_done, 1);
        self.frames.push_back(Frame::FileResult {
            id,
            outcome: Outcome::Verified,
        });
    }

    /// Report a file whose data did not hash to the sender's BLAKE3.
    fn mismatched(
        &mut self,
        id: u64,
        display: String,
        size: u64,
        received: u64,
        expected: String,
        actual: String,
    ) {
        let p = Problem::at(
            Kind::Verify,
            display.clone(),
            format!(
                "BLAKE3 mismatch: sender {expected}, received {actual}; the part file was removed"
            ),
        );
        self.settle(id, display, size, received, Status::Failed, Some(p));
    }

    /// Report a file skipped or failed, and tell the sender.
    fn settle(
        &mut self,
        id: u64,
        display: String,
        size: u64,
        received: u64,
        status: Status,
        problem: Option<Problem>,
    ) {
        let outcome = match (&status, &problem) {
            (Status::Verified, _) => Outcome::Verified,
            (Status::Skipped, _) => Outcome::Skipped,
            (Status::WouldSend, _) => Outcome::WouldSend,
            (Status::Slice, _) => Outcome::Verified,
            (Status::Failed, p) => Outcome::Failed {
                code: match p.as_ref().map(|p| p.kind) {
                    Some(Kind::Verify) => ErrorCode::Verify,
                    Some(Kind::Vanished) => ErrorCode::Vanished,
                    _ => ErrorCode::Io,
                },
                message: p.as_ref().map(|p| p.message.clone()).unwrap_or_default(),
            },
        };
        self.report_file(display, size, received, status, problem);
        if status == Status::Skipped {
            Progress::add(&self.progress.bytes_done, size);
        }
        Progress::add(&self.progress.files_done, 1);
        self.frames.push_back(Frame::FileResult { id, outcome });
    }

    /// A file's line in the report, and its problem if any.
    fn report_file(
        &mut self,
        display: String,
        size: u64,
        received: u64,
        status: Status,
        problem: Option<Problem>,
    ) {
        self.report.files.push(FileReport {
            path: display,
            size,
            status,
            bytes_transferred: received,
            bytes_resumed: 0,
            blake3: None,
            error: problem.as_ref().map(|p| p.message.clone()),
        });
        if let Some(p) = problem {
            self.report.problems.push(p);
        }
    }

    /// A dry run's file settled: it would be sent for `what`'s reason, or
    /// (None) it would be skipped.
    fn would(&mut self, id: u64, f: InFile, what: Option<What>) {
        let target = f.target.clone();
        let status = match what {
            Some(w) => {
                self.changed(&target, w);
                Status::WouldSend
            }
            None => Status::Skipped,
        };
        self.settle(id, f.display, f.plan.size, 0, status, None);
    }

    /// One change made, or in a dry run one that would be.
    fn changed(&mut self, target: &RelPath, what: What) {
        self.report.changes.push(Change {
            path: target.as_bytes().to_vec(),
            what,
        });
    }

    /// After every entry is settled: directory metadata, the sync, `Done`.
    fn check_end(&mut self) {
        if self.running()
            && self.manifest_done
            && !self.planning
            && !self.ending
            && self.files.is_empty()
            && self.waiting.is_empty()
            && self.to_commit.is_empty()
            && self.busy == 0
            && self.jobs.is_empty()
        {
            self.ending = true;
            let links = std::mem::take(&mut self.links);
            let mirror = match (&self.cfg.delete, self.unread) {
                (Some(_), true) => {
                    self.report.problems.push(Problem::new(
                        Kind::Remote,
                        "nothing deleted (--delete): the source could not be read whole",
                    ));
                    None
                }
                (Some(protect), false) => Some(Mirror {
                    dirs: std::mem::take(&mut self.mirror_dirs),
                    named: std::mem::take(&mut self.named),
                    protect: protect.clone(),
                    prefix: self.landing.prefix.clone(),
                }),
                (None, _) => None,
            };
            self.jobs.push_back(Job::FinishDirs {
                links,
                mirror,
                dry: self.cfg.dry_run,
            });
        }
    }

    fn end(&mut self) {
        let ok = self.report.problems.is_empty();
        let behind_ms = (self.report.held_back_s * 1000.0) as u64;
        self.frames.push_back(Frame::Done { ok, behind_ms });
        self.state = State::Finished;
    }
}

impl Role for RecvCore {
    fn state(&self) -> &State {
        &self.state
    }

    fn handle_control_end(&mut self) {
        if self.running() && !self.ending {
            self.fail(Problem::new(
                Kind::Connection,
                "the sender closed the session early",
            ));
        }
    }

    fn handle_failure(&mut self, p: Problem) {
        self.fail(p);
    }

    fn handle_frame(&mut self, now: Instant, frame: Frame) {
        if !self.running() {
            return;
        }
        if let Err(p) = self.on_frame(now, frame) {
            self.fail(p);
        }
        self.commit_if_due(now);
        self.check_end();
    }
}

/// A file under way when its session failed ([`SessionReport::unsettled`]).
pub(crate) fn unsettled(display: &str, size: u64, moved: u64, resumed: u64) -> FileReport {
    FileReport {
        path: display.to_string(),
        size,
        status: Status::Failed,
        bytes_transferred: moved,
        bytes_resumed: resumed,
        blake3: None,
        error: Some("the session ended before it did".into()),
    }
}

/// Why a special file of `kind` was not made when not asked for.
pub(crate) fn not_asked(kind: EntryKind) -> &'static str {
    match kind.is_device() {
        true => "not asked for (--devices makes device nodes, as root)",
        false => "not asked for (--specials makes FIFOs and sockets)",
    }
}

/// A path's key in [`RecvCore::file_targets`] (SipHash, keyed per process:
/// a sender cannot aim collisions at it).
fn path_key(p: &RelPath) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut h = KEYS.get_or_init(Default::default).build_hasher();
    h.write(p.as_bytes());
    h.finish()
}
