//! The receiving role of a session (the client for `get`, the server for `put`).
//!
//! For each manifest entry it creates directories and symlinks at once, and for a
//! file decides what it wants (skip, everything, or the chunks a resume journal
//! lacks), opening a hidden part file. Data records from any stream are written at
//! their offsets and hashed; a file takes its final name only when every chunk is
//! there and the BLAKE3 root equals the sender's.

use crate::control::{CtlRx, CtlTx};
use crate::proto::{
    ErrorCode, Frame, Outcome, ProtoError, RecordHeader, RootSpec, Want, DATA_PRELUDE,
    RECORD_HASH_LEN, RECORD_HEADER_LEN,
};
use crate::report::{FileReport, Kind, Problem, Progress, SessionReport, Status};
use cap_std::fs::Dir;
use longhaul_transfer::chunk::hex;
use longhaul_transfer::place::{
    is_reserved_name, sibling_name, Checkpoint, Dest, FinishError, Incoming, Settled, JOURNAL,
    MAX_FILE_SIZE, PART,
};
use longhaul_transfer::sync::{decide, needs_local_hash, Decision, SyncMode};
use longhaul_transfer::{Entry, EntryKind, RelPath, CHUNK_SIZE};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Where received entries go.
pub struct DestSpec {
    /// Directory under which every target is resolved (cap-std confined).
    pub base: Dir,
    /// Path of the destination inside `base` (empty: `base` itself).
    pub prefix: RelPath,
    /// The destination is (or must be) a directory: sources go inside it.
    pub dest_is_dir: bool,
    pub roots: Vec<RootSpec>,
}

impl DestSpec {
    /// Where an entry of `root` (whose own kind is `root_kind`) lands.
    fn target(&self, root: u32, root_kind: EntryKind, path: &RelPath) -> Result<RelPath, String> {
        let spec = self
            .roots
            .get(root as usize)
            .ok_or_else(|| format!("entry for unknown root {root}"))?;
        if self.roots.len() == 1 && root_kind != EntryKind::Dir && !self.dest_is_dir {
            if !path.is_root() || self.prefix.is_root() {
                return Err("a single file source cannot have children".into());
            }
            return Ok(self.prefix.clone());
        }
        let base = if spec.name.is_empty() {
            self.prefix.clone()
        } else {
            self.prefix
                .join_name(&spec.name)
                .map_err(|e| e.to_string())?
        };
        base.join(path).map_err(|e| e.to_string())
    }
}

impl DestSpec {
    /// Whether none of the targets this request can create is there yet, nor
    /// a part or journal an earlier run left beside one: every file will be
    /// wanted whole, so the receiver can say so (a get's client in
    /// `Hello.fresh`, a put's server in `Welcome.fresh`) and save the sender a
    /// round trip of `Want`s. A target that is an empty directory
    /// counts as absent. Any doubt (an error, two roots landing on the same
    /// name) says no.
    pub fn is_fresh(&self) -> bool {
        let mut targets: Vec<RelPath> = Vec::new();
        for spec in &self.roots {
            let t = if spec.name.is_empty() {
                Ok(self.prefix.clone())
            } else {
                self.prefix.join_name(&spec.name)
            };
            match t {
                Ok(t) if !targets.contains(&t) => targets.push(t),
                _ => return false,
            }
        }
        // A single file root lands on the destination itself.
        if self.roots.len() == 1 && !self.dest_is_dir && !targets.contains(&self.prefix) {
            targets.push(self.prefix.clone());
        }
        targets.iter().all(|t| self.absent_or_empty(t))
    }

    fn absent_or_empty(&self, t: &RelPath) -> bool {
        use std::io::ErrorKind::NotFound;
        let empty_dir = |d: std::io::Result<Dir>| {
            d.and_then(|d| d.entries().map(|mut e| e.next().is_none()))
                .unwrap_or(false)
        };
        if t.is_root() {
            return empty_dir(self.base.try_clone());
        }
        match self.base.symlink_metadata(t.as_path()) {
            Ok(m) if m.is_dir() => empty_dir(self.base.open_dir(t.as_path())),
            Ok(_) => false,
            Err(e) if e.kind() == NotFound => {
                let Some(parent) = t.parent() else {
                    return false;
                };
                [PART, JOURNAL].iter().all(|suffix| {
                    let sib = parent
                        .join_name(&sibling_name(t.file_name(), suffix))
                        .map(|p| self.base.symlink_metadata(p.as_path()));
                    matches!(sib, Ok(Err(e)) if e.kind() == NotFound)
                })
            }
            Err(_) => false,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct RecvOpts {
    pub sync: SyncMode,
    /// The sender sends every file whole without waiting for a `Want` (a
    /// get's `Hello.fresh`, a put's `Welcome.fresh`): none is sent, nothing is
    /// looked up or resumed, and a record may come before its file's entry.
    pub fresh: bool,
    /// Sync the destination's file system before `Done` (`--fsync`).
    pub fsync: bool,
}

/// syncfs(2) on the file system that holds `dir`. cap-std's directory
/// descriptors are `O_PATH`, which syncfs refuses (EBADF): it gets one of its
/// own, opened for reading.
fn sync_fs(dir: &cap_std::fs::Dir) -> std::io::Result<()> {
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
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned here alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: syncfs on a descriptor held open for the call.
    match unsafe { libc::syncfs(fd.as_raw_fd()) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

struct InFile {
    inc: Incoming,
    display: String,
    received: u64,
    /// When the last checkpoint of this file was started.
    checkpointed: Instant,
    /// A checkpoint of this file is syncing in the background.
    checkpointing: Arc<AtomicBool>,
}

/// How often a file's written chunks are made durable and journaled for resume:
/// at most this often, and only once 16 chunks (16 MiB) wait. A receiver killed
/// outright refetches at most what arrived since; a clean end, an error or Ctrl-C
/// journals everything. The sync runs beside the streams, but ext4 still stalls
/// the writers while it commits: 1 GiB on loopback took 1.8-1.9 s with no sync,
/// 2.0-3.0 s with one a second, 2.5-2.7 s with one per 250 ms; with one per 16
/// chunks on the stream's own task (before) 3.5-4 s.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);
const CHECKPOINT_MIN_CHUNKS: usize = 16;

struct State {
    files: HashMap<u64, InFile>,
    /// Files taken out of `files` by a stream reader and being verified/renamed:
    /// the session is not over until they are settled too.
    settling: usize,
    /// Files the sender gave up on (`FileFailed`): records of theirs still on
    /// their way (the control stream overtakes the data) are dropped.
    failed: std::collections::HashSet<u64>,
    report: SessionReport,
}

enum Event {
    /// A stream task settled what may have been the last file.
    Settled,
    Failed(Problem),
}

struct Shared {
    st: Mutex<State>,
    ctl: CtlTx,
    progress: Arc<Progress>,
    events: mpsc::UnboundedSender<Event>,
    fresh: bool,
    /// The highest entry id the control loop has acted on (`u64::MAX` once
    /// the manifest has ended): in a fresh session a record of a later file
    /// waits for its entry.
    entries: tokio::sync::watch::Sender<u64>,
    /// Payload bytes of records waiting for their entries (see [`MAX_WAITING`]).
    waiting: AtomicU64,
}

/// The most record bytes a fresh session holds for entries not yet seen. A
/// sender sends a file's entry before its data, so records wait only while
/// the control stream is behind (none did in the lab); without a bound, a
/// client that names a fresh destination could pin a full record on each of
/// its streams (1024 × 1 MiB) for ids it never announces.
pub const MAX_WAITING: u64 = 64 << 20;

fn io_problem(path: &str, e: impl std::fmt::Display) -> Problem {
    Problem::at(Kind::LocalIo, path, e.to_string())
}

/// Run the receiving role until every entry is settled; sends `Done`.
pub async fn run_receiver(
    conn: quinn::Connection,
    ctl: CtlTx,
    rx: &mut CtlRx,
    dest: DestSpec,
    opts: RecvOpts,
    progress: Arc<Progress>,
) -> Result<SessionReport, Problem> {
    let (etx, mut erx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        st: Mutex::new(State {
            files: HashMap::new(),
            settling: 0,
            failed: Default::default(),
            report: SessionReport::default(),
        }),
        ctl: ctl.clone(),
        progress,
        events: etx,
        fresh: opts.fresh,
        entries: tokio::sync::watch::Sender::new(0),
        waiting: AtomicU64::new(0),
    });
    // The stream tasks live in the acceptor's set: aborting the acceptor at
    // the end stops those still reading a stream the sender has not finished
    // yet, and with them their handles on the control stream (whose end the
    // client of a get would otherwise wait a round trip for).
    let acceptor = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            while let Ok(s) = conn.accept_uni().await {
                while tasks.try_join_next().is_some() {}
                let shared = shared.clone();
                tasks.spawn(async move {
                    if let Err(p) = read_stream(&shared, s).await {
                        let _ = shared.events.send(Event::Failed(p));
                    }
                });
            }
            // The connection is gone: let the tasks see it and end.
            while tasks.join_next().await.is_some() {}
        })
    };
    let mut dest_fs = Dest::new(dest.base.try_clone().map_err(|e| io_problem(".", e))?);
    let result = control_loop(&shared, rx, &mut erx, &dest, &mut dest_fs, opts).await;
    acceptor.abort();
    // Whatever happened, keep what is durably written for a rerun.
    let leftovers: Vec<InFile> = {
        let mut st = shared.st.lock().unwrap();
        st.files.drain().map(|(_, f)| f).collect()
    };
    for f in &leftovers {
        f.inc.ending();
    }
    tokio::task::block_in_place(|| {
        for mut f in leftovers {
            let _ = f.inc.flush_journal();
        }
    });
    let dirs = tokio::task::block_in_place(|| dest_fs.finish_dirs());
    let mut report = std::mem::take(&mut shared.st.lock().unwrap().report);
    if let Err(e) = dirs {
        report
            .problems
            .push(Problem::new(Kind::LocalIo, e.to_string()));
    }
    if opts.fsync && result.is_ok() {
        // One syncfs: every file placed, its directory entry, the journals.
        let t = std::time::Instant::now();
        match tokio::task::block_in_place(|| sync_fs(dest_fs.base())) {
            Ok(()) => {
                let secs = t.elapsed().as_secs_f64();
                tracing::info!("synced the destination's file system (--fsync) in {secs:.3} s");
            }
            Err(e) => report.problems.push(Problem::new(
                Kind::LocalIo,
                format!("syncing the destination (--fsync): {e}"),
            )),
        }
    }
    match result {
        Ok(()) => {
            let ok = report.problems.is_empty();
            ctl.send(Frame::Done { ok }).await?;
            Ok(report)
        }
        Err(p) => {
            if p.kind == Kind::LocalIo {
                let _ = ctl
                    .send(Frame::Fatal {
                        code: ErrorCode::Io,
                        message: format!("the receiver failed: {p}"),
                    })
                    .await;
            }
            Err(p)
        }
    }
}

fn protocol(msg: impl Into<String>) -> Problem {
    Problem::new(
        Kind::Connection,
        format!("protocol error from the sender: {}", msg.into()),
    )
}

async fn control_loop(
    shared: &Arc<Shared>,
    rx: &mut CtlRx,
    events: &mut mpsc::UnboundedReceiver<Event>,
    dest: &DestSpec,
    fs: &mut Dest,
    opts: RecvOpts,
) -> Result<(), Problem> {
    let mut manifest_done = false;
    let mut root_kinds: HashMap<u32, EntryKind> = HashMap::new();
    loop {
        if manifest_done {
            let st = shared.st.lock().unwrap();
            if st.files.is_empty() && st.settling == 0 {
                return Ok(());
            }
        }
        let frame = tokio::select! {
            f = rx.recv() => match f {
                Some(f) => f?,
                None => return Err(Problem::new(Kind::Connection, "the sender closed the session early")),
            },
            ev = events.recv() => match ev {
                Some(Event::Settled) | None => continue,
                Some(Event::Failed(p)) => return Err(p),
            },
        };
        match frame {
            Frame::Entry(e) => {
                // Ids rise: a reused one would hand a write in flight for the
                // old file to the new one, which would be placed with that
                // chunk never written.
                let last = *shared.entries.borrow();
                if e.id <= last {
                    return Err(protocol(format!(
                        "entry id {} after {last}: entry ids must rise",
                        e.id
                    )));
                }
                let path = RelPath::from_wire(&e.path).map_err(|err| protocol(err.to_string()))?;
                if path.is_root() {
                    root_kinds.insert(e.root, e.kind);
                }
                let kind = *root_kinds
                    .get(&e.root)
                    .ok_or_else(|| protocol(format!("entry before its root {}", e.root)))?;
                let target = dest.target(e.root, kind, &path).map_err(protocol)?;
                // A small file needs no file-system call yet (its part is created
                // with its first write, and without --sync nothing is looked up):
                // no need to hand the runtime's other tasks to another thread.
                let light = e.kind == EntryKind::File
                    && e.size <= CHUNK_SIZE
                    && (opts.sync == SyncMode::Always || opts.fresh)
                    && fs.parent_cached(&target);
                let replies = if light {
                    on_entry(shared, fs, &e, &target, opts)?
                } else {
                    tokio::task::block_in_place(|| on_entry(shared, fs, &e, &target, opts))?
                };
                shared.entries.send_modify(|s| *s = (*s).max(e.id));
                for f in replies {
                    shared.ctl.send(f).await?;
                }
            }
            Frame::RootError {
                root,
                code,
                message,
            } => {
                // The sender's message names its path ("nope: No such
                // file..."); naming the local root too printed it twice.
                if dest.roots.get(root as usize).is_none() {
                    return Err(protocol(format!("RootError for unknown root {root}")));
                }
                let mut st = shared.st.lock().unwrap();
                let kind = Kind::of_peer(code);
                st.report
                    .problems
                    .push(Problem::new(kind, format!("at the source: {message}")));
            }
            Frame::EntryError { path, message, .. } => {
                let mut st = shared.st.lock().unwrap();
                st.report.problems.push(Problem::at(
                    Kind::Remote,
                    String::from_utf8_lossy(&path),
                    message,
                ));
            }
            Frame::ManifestEnd => {
                manifest_done = true;
                shared.entries.send_replace(u64::MAX);
            }
            Frame::FileDone {
                id,
                hash,
                unchanged,
            } => {
                let done = {
                    let mut st = shared.st.lock().unwrap();
                    let f = st
                        .files
                        .get_mut(&id)
                        .ok_or_else(|| protocol(format!("FileDone for unknown file {id}")))?;
                    if f.inc.expected.is_some() {
                        return Err(protocol(format!("second FileDone for file {id}")));
                    }
                    f.inc.expected = Some(hash);
                    if unchanged || f.inc.is_complete() {
                        st.files.remove(&id)
                    } else {
                        None
                    }
                };
                if let Some(f) = done {
                    if unchanged {
                        let mut f = f;
                        tokio::task::block_in_place(|| f.inc.discard());
                        settle(
                            shared,
                            id,
                            f.display,
                            f.inc.plan.size,
                            0,
                            Status::Skipped,
                            None,
                        )
                        .await?;
                    } else {
                        finish(shared, id, f).await?;
                    }
                }
            }
            Frame::FileFailed { id, message } => {
                let f = {
                    let mut st = shared.st.lock().unwrap();
                    st.failed.insert(id);
                    st.files.remove(&id)
                };
                let mut f =
                    f.ok_or_else(|| protocol(format!("FileFailed for unknown file {id}")))?;
                let _ = tokio::task::block_in_place(|| f.inc.flush_journal());
                let p = Problem::at(Kind::Remote, f.display.clone(), message.clone());
                settle(
                    shared,
                    id,
                    f.display,
                    f.inc.plan.size,
                    f.received,
                    Status::Failed,
                    Some(p),
                )
                .await?;
            }
            Frame::Fatal { code, message } => {
                let kind = Kind::of_peer(code);
                return Err(Problem::new(kind, message));
            }
            other => return Err(protocol(format!("unexpected {other:?}"))),
        }
    }
}

/// Settle a file: report it and tell the sender.
async fn settle(
    shared: &Shared,
    id: u64,
    display: String,
    size: u64,
    received: u64,
    status: Status,
    problem: Option<Problem>,
) -> Result<(), Problem> {
    let outcome = match (&status, &problem) {
        (Status::Verified, _) => Outcome::Verified,
        (Status::Skipped, _) => Outcome::Skipped,
        (Status::Failed, p) => Outcome::Failed {
            code: match p.as_ref().map(|p| p.kind) {
                Some(Kind::Verify) => ErrorCode::Verify,
                _ => ErrorCode::Io,
            },
            message: p.as_ref().map(|p| p.message.clone()).unwrap_or_default(),
        },
    };
    {
        let mut st = shared.st.lock().unwrap();
        st.report.files.push(FileReport {
            path: display,
            size,
            status,
            bytes_transferred: received,
            bytes_resumed: 0,
            blake3: None,
            error: problem.as_ref().map(|p| p.message.clone()),
        });
        if let Some(p) = problem {
            st.report.problems.push(p);
        }
    }
    if status == Status::Skipped {
        Progress::add(&shared.progress.bytes_done, size);
    }
    Progress::add(&shared.progress.files_done, 1);
    shared.ctl.send(Frame::FileResult { id, outcome }).await
}

/// Act on one manifest entry; returns the frames to send back.
fn on_entry(
    shared: &Shared,
    fs: &mut Dest,
    e: &Entry,
    target: &RelPath,
    opts: RecvOpts,
) -> Result<Vec<Frame>, Problem> {
    let display = target.display();
    if is_reserved_name(target.file_name()) {
        return Err(io_problem(
            &display,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a name longhaul keeps for its own part, journal and link files; not received",
            ),
        ));
    }
    match e.kind {
        EntryKind::Dir => {
            fs.make_dir(target, e.mode, e.mtime_ns)
                .map_err(|err| io_problem(&display, err))?;
            shared.st.lock().unwrap().report.dirs += 1;
            Ok(vec![])
        }
        EntryKind::Symlink => {
            fs.make_symlink(target, &e.link, e.mtime_ns)
                .map_err(|err| io_problem(&display, err))?;
            shared.st.lock().unwrap().report.symlinks += 1;
            Ok(vec![])
        }
        EntryKind::File => {
            if e.size > MAX_FILE_SIZE {
                return Err(protocol(format!(
                    "{display}: a file of {} bytes is larger than the {MAX_FILE_SIZE} bytes accepted",
                    e.size
                )));
            }
            Progress::add(&shared.progress.files_total, 1);
            Progress::add(&shared.progress.bytes_total, e.size);
            // Without --sync whatever is there is replaced: no lookup.
            let existing = if opts.sync == SyncMode::Always || opts.fresh {
                None
            } else {
                fs.existing_file(target)
                    .map_err(|err| io_problem(&display, err))?
            };
            let local_hash = if needs_local_hash(opts.sync, e, existing.as_ref()) {
                Some(
                    fs.hash_file(target)
                        .map_err(|err| io_problem(&display, err))?,
                )
            } else {
                None
            };
            let decision = decide(opts.sync, e, existing.as_ref(), local_hash);
            if decision == Decision::Skip {
                // Same bytes by size and mtime; the mode follows the source's
                // (as rsync -a's does).
                if existing.as_ref().is_some_and(|x| x.mode != e.mode & 0o7777) {
                    if let Err(err) = fs.set_mode(target, e.mode) {
                        // (`display` is a name tracing's macros shadow.)
                        let shown = &display;
                        tracing::warn!("{shown}: skipped, but its mode was not updated: {err}");
                    }
                }
                {
                    let mut st = shared.st.lock().unwrap();
                    st.report.files.push(FileReport {
                        path: display,
                        size: e.size,
                        status: Status::Skipped,
                        bytes_transferred: 0,
                        bytes_resumed: 0,
                        blake3: None,
                        error: None,
                    });
                }
                Progress::add(&shared.progress.bytes_done, e.size);
                Progress::add(&shared.progress.files_done, 1);
                return Ok(vec![
                    Frame::Want {
                        id: e.id,
                        want: Want::Skip,
                    },
                    Frame::FileResult {
                        id: e.id,
                        outcome: Outcome::Skipped,
                    },
                ]);
            }
            let (dir, name) = fs
                .parent_of(target)
                .map_err(|err| io_problem(&display, err))?;
            let resume = !matches!(decision, Decision::UnlessHash(_)) && !opts.fresh;
            let (mut inc, ranges) =
                Incoming::open(dir, &name, e, resume).map_err(|err| io_problem(&display, err))?;
            // A fresh session's destination held none of its targets, nor parts.
            if opts.fresh || fs.in_fresh_dir(target) {
                inc.in_fresh_dir();
            }
            let want = match decision {
                Decision::UnlessHash(h) => Want::UnlessHash(h),
                _ if inc.resumed_bytes > 0 => Want::Chunks(ranges),
                _ => Want::All,
            };
            Progress::add(&shared.progress.bytes_done, inc.resumed_bytes);
            shared.st.lock().unwrap().files.insert(
                e.id,
                InFile {
                    inc,
                    display,
                    received: 0,
                    checkpointed: Instant::now(),
                    checkpointing: Arc::new(AtomicBool::new(false)),
                },
            );
            if opts.fresh {
                return Ok(vec![]);
            }
            Ok(vec![Frame::Want { id: e.id, want }])
        }
    }
}

async fn finish(shared: &Shared, id: u64, f: InFile) -> Result<(), Problem> {
    let InFile {
        inc,
        display,
        received,
        ..
    } = f;
    let size = inc.plan.size;
    let resumed = inc.resumed_bytes;
    // A small single-chunk file is placed by one link or rename: done here,
    // as its write was.
    let r = if inc.single_chunk() && size <= INLINE_WRITE as u64 {
        inc.finish()
    } else {
        tokio::task::spawn_blocking(move || inc.finish())
            .await
            .map_err(|e| Problem::new(Kind::LocalIo, e.to_string()))?
    };
    match r {
        Ok(root) => placed(shared, id, display, size, received, resumed, root).await,
        Err(FinishError::Mismatch { expected, actual }) => {
            mismatched(shared, id, display, size, received, expected, actual).await
        }
        Err(FinishError::Io(e)) => Err(io_problem(&display, e)),
    }
}

/// Report a file verified and placed, and tell the sender.
async fn placed(
    shared: &Shared,
    id: u64,
    display: String,
    size: u64,
    received: u64,
    resumed: u64,
    root: [u8; 32],
) -> Result<(), Problem> {
    {
        let mut st = shared.st.lock().unwrap();
        st.report.files.push(FileReport {
            path: display,
            size,
            status: Status::Verified,
            bytes_transferred: received,
            bytes_resumed: resumed,
            blake3: Some(hex(&root)),
            error: None,
        });
    }
    Progress::add(&shared.progress.files_done, 1);
    shared
        .ctl
        .send(Frame::FileResult {
            id,
            outcome: Outcome::Verified,
        })
        .await
}

/// Report a file whose data did not hash to the sender's BLAKE3.
async fn mismatched(
    shared: &Shared,
    id: u64,
    display: String,
    size: u64,
    received: u64,
    expected: String,
    actual: String,
) -> Result<(), Problem> {
    let p = Problem::at(
        Kind::Verify,
        display.clone(),
        format!("BLAKE3 mismatch: sender {expected}, received {actual}; the part file was removed"),
    );
    settle(shared, id, display, size, received, Status::Failed, Some(p)).await
}

/// Sync and journal `cp` on the blocking pool while the streams go on writing; a
/// failure ends the session as a write error would. `finish` and `discard` wait
/// for it (the checkpoint's lock), so a file is never placed under a sync.
fn checkpoint_in_background(shared: &Shared, cp: Checkpoint, f: &InFile) {
    let busy = f.checkpointing.clone();
    let display = f.display.clone();
    let events = shared.events.clone();
    tokio::task::spawn_blocking(move || {
        let r = cp.commit();
        busy.store(false, Ordering::Release);
        if let Err(e) = r {
            let _ = events.send(Event::Failed(io_problem(&display, e)));
        }
    });
}

async fn read_exact_or_eof(rs: &mut quinn::RecvStream, buf: &mut [u8]) -> Result<bool, Problem> {
    let mut got = 0;
    while got < buf.len() {
        match rs.read(&mut buf[got..]).await {
            Ok(Some(n)) => got += n,
            Ok(None) if got == 0 => return Ok(false),
            Ok(None) => return Err(protocol(ProtoError::Truncated.to_string())),
            Err(e) => return Err(Problem::new(Kind::Connection, format!("data stream: {e}"))),
        }
    }
    Ok(true)
}

/// Records up to this size are written on the stream's own task, not the
/// blocking pool.
const INLINE_WRITE: usize = 64 << 10;

async fn read_stream(shared: &Shared, mut rs: quinn::RecvStream) -> Result<(), Problem> {
    let mut pre = [0u8; 4];
    if !read_exact_or_eof(&mut rs, &mut pre).await? {
        return Ok(());
    }
    if &pre != DATA_PRELUDE {
        return Err(protocol(ProtoError::BadPrelude.to_string()));
    }
    let mut spare: Vec<u8> = Vec::new();
    let mut entries = shared.entries.subscribe();
    loop {
        let mut hdr = [0u8; RECORD_HEADER_LEN];
        if !read_exact_or_eof(&mut rs, &mut hdr).await? {
            return Ok(());
        }
        let h = RecordHeader::decode(&hdr).map_err(|e| protocol(e.to_string()))?;
        let index = h.chunk();
        // One contiguous buffer per record: BLAKE3 hashes it with its widest SIMD
        // path and the file sees one write, not one per QUIC frame.
        // The buffer is reused record after record: no allocation or page faults.
        let mut buf = std::mem::take(&mut spare);
        buf.clear();
        buf.reserve(h.len as usize);
        while buf.len() < h.len as usize {
            match rs.read_chunk(h.len as usize - buf.len(), true).await {
                Ok(Some(c)) => buf.extend_from_slice(&c.bytes),
                Ok(None) => return Err(protocol(ProtoError::Truncated.to_string())),
                Err(e) => return Err(Problem::new(Kind::Connection, format!("data stream: {e}"))),
            }
        }
        let mut hash = [0u8; RECORD_HASH_LEN];
        if h.hash && !read_exact_or_eof(&mut rs, &mut hash).await? {
            return Err(protocol(ProtoError::Truncated.to_string()));
        }
        // The entry travels on the control stream and may come later.
        if shared.fresh && *entries.borrow() < h.id {
            let len = h.len as u64;
            let held = shared.waiting.fetch_add(len, Ordering::Relaxed) + len;
            if held > MAX_WAITING {
                return Err(protocol(format!(
                    "more than {} MiB of data waits for manifest entries (file {} not announced)",
                    MAX_WAITING >> 20,
                    h.id
                )));
            }
            let seen = entries.wait_for(|&seen| seen >= h.id).await.is_ok();
            shared.waiting.fetch_sub(len, Ordering::Relaxed);
            if !seen {
                return Ok(()); // the session is over
            }
        }
        let (file, plan, placer) = {
            let mut st = shared.st.lock().unwrap();
            if !st.files.contains_key(&h.id) && st.failed.contains(&h.id) {
                continue; // the sender gave the file up after sending this
            }
            let f = st
                .files
                .get_mut(&h.id)
                .ok_or_else(|| protocol(format!("data for unknown or settled file {}", h.id)))?;
            f.inc.check_record(index, h.len as u64).map_err(protocol)?;
            f.inc.claim(index);
            if h.hash {
                if f.inc.plan.count() != 1 || f.inc.expected.is_some() {
                    return Err(protocol(format!(
                        "a hash on a record of file {}, which has {} chunks{}",
                        h.id,
                        f.inc.plan.count(),
                        if f.inc.expected.is_some() {
                            " and whose hash came already"
                        } else {
                            ""
                        }
                    )));
                }
                f.inc.expected = Some(hash);
            }
            let file = f.inc.file().map_err(|e| io_problem(&f.display, e))?;
            // A file of one chunk is whole after this write: its writer gives
            // it its mode and mtime with this descriptor and, with the hash
            // that came in the record, verifies and places it too.
            let placer = f.inc.single_chunk().then(|| f.inc.placer());
            (file, f.inc.plan, placer)
        };

        let write = move |buf: Vec<u8>| {
            let r = (|| {
                let d = Incoming::write_chunk(&file, &plan, index, &[&buf])?;
                let settled = placer.map(|p| p.settle(&file, d)).transpose()?;
                Ok::<_, std::io::Error>((d, settled))
            })();
            (r, buf)
        };
        // A small record is written here: the page-cache copy and the few
        // metadata calls take microseconds, less than handing them to the
        // blocking pool and back (per 10 kB file, that handoff cost more CPU
        // than the write).
        let (r, buf) = if buf.len() <= INLINE_WRITE {
            write(buf)
        } else {
            tokio::task::spawn_blocking(move || write(buf))
                .await
                .map_err(|e| Problem::new(Kind::LocalIo, e.to_string()))?
        };
        spare = buf;
        let done = 'done: {
            let mut st = shared.st.lock().unwrap();
            let Some(f) = st.files.get_mut(&h.id) else {
                break 'done Done::Not; // failed meanwhile
            };
            let (digest, settled) = r.map_err(|e| io_problem(&f.display, e))?;
            match settled {
                Some(how @ (Settled::Placed(_) | Settled::Mismatch { .. })) => {
                    Progress::add(&shared.progress.bytes_done, h.len as u64);
                    let mut f = st.files.remove(&h.id).expect("looked up above");
                    f.received += h.len as u64;
                    f.inc.settled(&how);
                    st.settling += 1;
                    break 'done Done::Settled(f, how);
                }
                Some(how @ Settled::Parked) => f.inc.settled(&how),
                None => {}
            }
            f.inc.record(index, digest);
            f.received += h.len as u64;
            Progress::add(&shared.progress.bytes_done, h.len as u64);
            // Under the session lock: only the background task clears the flag.
            if f.inc.pending_records() >= CHECKPOINT_MIN_CHUNKS
                && f.checkpointed.elapsed() >= CHECKPOINT_EVERY
                && !f.checkpointing.load(Ordering::Acquire)
            {
                let cp = f
                    .inc
                    .take_checkpoint()
                    .map_err(|e| io_problem(&f.display, e))?;
                if let Some(cp) = cp {
                    f.checkpointed = Instant::now();
                    f.checkpointing.store(true, Ordering::Release);
                    checkpoint_in_background(shared, cp, f);
                }
            }
            if f.inc.is_complete() {
                st.settling += 1;
                Done::Finish(st.files.remove(&h.id).expect("looked up above"))
            } else {
                Done::Not
            }
        };
        let r = match done {
            Done::Not => continue,
            Done::Finish(f) => finish(shared, h.id, f).await,
            Done::Settled(f, Settled::Placed(root)) => {
                let size = f.inc.plan.size;
                placed(shared, h.id, f.display, size, f.received, 0, root).await
            }
            Done::Settled(mut f, Settled::Mismatch { expected, actual }) => {
                tokio::task::block_in_place(|| f.inc.discard());
                let size = f.inc.plan.size;
                mismatched(shared, h.id, f.display, size, f.received, expected, actual).await
            }
            Done::Settled(_, Settled::Parked) => unreachable!("a parked file stays"),
        };
        // An error first: with `settling` still up the control loop cannot
        // end before it has the Failed event this task's end sends.
        r?;
        let idle = {
            let mut st = shared.st.lock().unwrap();
            st.settling -= 1;
            st.files.is_empty() && st.settling == 0
        };
        // The control loop needs waking only when this may have been the last
        // file (it looks again after every frame); a wake per file cost a
        // futex round trip per file.
        if idle {
            let _ = shared.events.send(Event::Settled);
        }
    }
}

/// What a written record leaves to do once the session lock is released.
enum Done {
    Not,
    /// Complete: verify and place.
    Finish(InFile),
    /// Its writer verified and placed it, or found it corrupt.
    Settled(InFile, Settled),
}
