//! The sending role of a session (the server for `get`, the client for `put`).
//!
//! A walker thread streams the manifest onto the control stream while the receiver
//! answers each file with a `Want` (or, in a fresh session, wants every file
//! whole without saying so); wanted chunks go into one work queue served by
//! N stream workers, so small files are packed back to back on each stream and a
//! large file's chunks spread over all of them. Every chunk is hashed as it is
//! read; the file's BLAKE3 (a tree over the chunk digests) follows in `FileDone`.

use crate::control::{CtlRx, CtlTx};
use crate::proto::{ErrorCode, Frame, Outcome, RecordHeader, Want, DATA_PRELUDE};
use crate::report::{FileReport, Kind, Problem, Progress, SessionReport, Status};
use bytes::Bytes;
use cap_std::fs::Dir;
use longhaul_transfer::chunk::{hex, Digest};
use longhaul_transfer::place::open_read;
use longhaul_transfer::walk::Walker;
use longhaul_transfer::{ChunkPlan, Entry, EntryKind, RelPath};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// One requested root on the sending side: a directory handle and a path inside it.
pub struct Source {
    pub dir: Arc<Dir>,
    pub start: RelPath,
    /// The request ended in `/`: only a directory will do.
    pub must_be_dir: bool,
}

/// A root that could not even be named (bad path): sent as a `RootError`.
pub type SourceResult = Result<Source, (ErrorCode, String)>;

struct SendFile {
    dir: Arc<Dir>,
    path: RelPath,
    display: String,
    plan: ChunkPlan,
    mtime_ns: i64,
    st: Mutex<SendState>,
}

#[derive(Default)]
struct SendState {
    file: Option<Arc<File>>,
    /// Per chunk, once the first is read.
    digests: Vec<Option<Digest>>,
    /// Wanted (or sent unasked, in a fresh session).
    started: bool,
    remaining: u64,
    failed: bool,
    sent: u64,
    /// Bytes the receiver already held (a resumed file's chunks not wanted).
    resumed: u64,
    /// Sent whole unasked (a fresh session): a `Want` for it is a protocol error.
    fresh: bool,
}

enum Job {
    Chunk {
        id: u64,
        f: Arc<SendFile>,
        index: u64,
        send: bool,
    },
    Compare {
        id: u64,
        f: Arc<SendFile>,
        hash: Digest,
    },
    /// Chunks `next..` of a file, handed out one [`Job::Chunk`] at a time
    /// by [`Queue::pop`]: the queue holds one job per file, not per chunk (a
    /// client that asked for 30 files of 1 TiB made a server queue 30
    /// million jobs, 2.7 GB, before any data moved). `send`: which chunks
    /// go out (the others are read and hashed only); None: all of them.
    Chunks {
        id: u64,
        f: Arc<SendFile>,
        next: u64,
        send: Option<Arc<Vec<bool>>>,
    },
}

/// A closable MPMC queue of jobs.
#[derive(Default)]
struct Queue {
    q: Mutex<(VecDeque<Job>, bool)>,
    notify: Notify,
}

impl Queue {
    fn push_all(&self, jobs: impl IntoIterator<Item = Job>) {
        self.q.lock().unwrap().0.extend(jobs);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
    fn close(&self) {
        self.q.lock().unwrap().1 = true;
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
    async fn pop(&self) -> Option<Job> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut g = self.q.lock().unwrap();
                match g.0.front_mut() {
                    // A file's next chunk; its last takes the file's job off.
                    Some(Job::Chunks { id, f, next, send }) => {
                        let job = Job::Chunk {
                            id: *id,
                            f: f.clone(),
                            index: *next,
                            send: send.as_ref().is_none_or(|s| s[*next as usize]),
                        };
                        *next += 1;
                        if *next >= f.plan.count() {
                            g.0.pop_front();
                        }
                        return Some(job);
                    }
                    Some(_) => return g.0.pop_front(),
                    None => {}
                }
                if g.1 {
                    return None;
                }
            }
            notified.await;
        }
    }
}

/// `--max-rate` at the application level: each record gets a departure slot, so
/// the average rate holds at any RTT (a window cap alone cannot on short paths).
struct Pacer {
    bytes_per_sec: f64,
    next: Mutex<Instant>,
}

impl Pacer {
    /// How long to wait before sending `n` bytes.
    fn reserve(&self, n: u64) -> Duration {
        let now = Instant::now();
        let mut next = self.next.lock().unwrap();
        let start = (*next).max(now);
        *next = start + Duration::from_secs_f64(n as f64 / self.bytes_per_sec);
        start - now
    }
}

struct Shared {
    files: Mutex<HashMap<u64, Arc<SendFile>>>,
    pacer: Option<Pacer>,
    dirs: AtomicU64,
    symlinks: AtomicU64,
    queue: Queue,
    ctl: CtlTx,
    progress: Arc<Progress>,
}

/// How a session's sending side runs.
#[derive(Debug, Clone, Copy)]
pub struct SendOpts {
    /// Data streams at once.
    pub streams: usize,
    /// Cap on the sending rate (bits/s), 0 = none.
    pub max_rate: u64,
    /// Send every file whole at once, unasked (a fresh session: a get's
    /// `Hello.fresh`, a put's `Welcome.fresh`).
    pub fresh: bool,
}

/// Run the sending role until the receiver says `Done` (or the session fails).
pub async fn run_sender(
    conn: quinn::Connection,
    ctl: CtlTx,
    rx: &mut CtlRx,
    sources: Vec<SourceResult>,
    opts: SendOpts,
    progress: Arc<Progress>,
) -> Result<SessionReport, Problem> {
    let SendOpts {
        streams,
        max_rate,
        fresh,
    } = opts;
    let shared = Arc::new(Shared {
        files: Mutex::new(HashMap::new()),
        pacer: (max_rate > 0).then(|| Pacer {
            bytes_per_sec: max_rate as f64 / 8.0,
            next: Mutex::new(Instant::now()),
        }),
        dirs: AtomicU64::new(0),
        symlinks: AtomicU64::new(0),
        queue: Queue::default(),
        ctl: ctl.clone(),
        progress,
    });
    let walker = {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || walk_all(&shared, sources, fresh))
    };
    let mut workers = Vec::new();
    for _ in 0..streams.max(1) {
        let (shared, conn) = (shared.clone(), conn.clone());
        workers.push(tokio::spawn(async move { worker(shared, conn).await }));
    }

    let mut report = SessionReport::default();
    let result = control_loop(&shared, rx, &mut report).await;
    shared.queue.close();
    let mut first_err = result.err();
    for w in workers {
        match w.await {
            Ok(Err(p)) => {
                first_err.get_or_insert(p);
            }
            Err(e) => {
                first_err.get_or_insert(Problem::new(Kind::LocalIo, format!("worker: {e}")));
            }
            Ok(Ok(())) => {}
        }
    }
    if first_err.is_some() {
        walker.abort();
    } else if let Ok(Err(p)) = walker.await {
        first_err = Some(p);
    }
    report.dirs = shared.dirs.load(Ordering::Relaxed);
    report.symlinks = shared.symlinks.load(Ordering::Relaxed);
    match first_err {
        Some(p) => Err(p),
        None => Ok(report),
    }
}

/// Stream the manifest; with `fresh`, queue each file whole right after its
/// entry (the receiver sends no `Want`).
fn walk_all(shared: &Shared, sources: Vec<SourceResult>, fresh: bool) -> Result<(), Problem> {
    let mut next_id = 0u64;
    for (root, src) in sources.into_iter().enumerate() {
        let root = root as u32;
        let (src, walker) = match src.and_then(open_root) {
            Ok(x) => x,
            Err((code, message)) => {
                shared.ctl.blocking_send(Frame::RootError {
                    root,
                    code,
                    message,
                })?;
                continue;
            }
        };
        for item in walker {
            let it = match item {
                Ok(it) => it,
                Err(e) => {
                    shared.ctl.blocking_send(Frame::EntryError {
                        root,
                        path: e.path.as_bytes().to_vec(),
                        message: e.error.to_string(),
                    })?;
                    continue;
                }
            };
            next_id += 1;
            let id = next_id;
            match it.kind {
                EntryKind::Dir => shared.dirs.fetch_add(1, Ordering::Relaxed),
                EntryKind::Symlink => shared.symlinks.fetch_add(1, Ordering::Relaxed),
                EntryKind::File => 0,
            };
            let file = if it.kind == EntryKind::File {
                let path = src
                    .start
                    .join(&it.path)
                    .map_err(|e| Problem::new(Kind::LocalIo, e.to_string()))?;
                let plan = ChunkPlan::new(it.size);
                let f = Arc::new(SendFile {
                    dir: src.dir.clone(),
                    display: path.display(),
                    path,
                    plan,
                    mtime_ns: it.mtime_ns,
                    st: Mutex::new(SendState::default()),
                });
                shared.files.lock().unwrap().insert(id, f.clone());
                Progress::add(&shared.progress.files_total, 1);
                Progress::add(&shared.progress.bytes_total, it.size);
                Some(f)
            } else {
                None
            };
            shared.ctl.blocking_send(Frame::Entry(Entry {
                id,
                root,
                path: it.path.as_bytes().to_vec(),
                kind: it.kind,
                size: it.size,
                mode: it.mode,
                mtime_ns: it.mtime_ns,
                link: it.link,
            }))?;
            // After its entry, so that an empty file's FileDone follows it
            // on the control stream; its data may still overtake the entry.
            if let (true, Some(f)) = (fresh, file) {
                let n = f.plan.count();
                start_file(&f, n, true);
                if n == 0 {
                    shared.ctl.blocking_send(empty_done(id, &f))?;
                } else {
                    queue_jobs(shared, id, &f, None);
                }
            }
        }
    }
    shared.ctl.blocking_send(Frame::ManifestEnd)
}

/// Start walking a requested root, or say why it cannot be served.
fn open_root(src: Source) -> Result<(Source, std::iter::Peekable<Walker>), (ErrorCode, String)> {
    let mut walker = match Walker::new(&src.dir, &src.start) {
        Ok(w) => w.peekable(),
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                ErrorCode::NotFound
            } else {
                ErrorCode::Io
            };
            return Err((code, format!("{}: {e}", src.start.display())));
        }
    };
    let root_is_dir = walker
        .peek()
        .is_some_and(|f| f.as_ref().is_ok_and(|f| f.kind == EntryKind::Dir));
    if src.must_be_dir && !root_is_dir {
        return Err((
            ErrorCode::NotFound,
            format!("{}/: not a directory", src.start.display()),
        ));
    }
    Ok((src, walker))
}

fn protocol(msg: impl Into<String>) -> Problem {
    Problem::new(
        Kind::Connection,
        format!("protocol error from the receiver: {}", msg.into()),
    )
}

async fn control_loop(
    shared: &Arc<Shared>,
    rx: &mut CtlRx,
    report: &mut SessionReport,
) -> Result<(), Problem> {
    loop {
        let frame = match rx.recv().await {
            Some(f) => f?,
            None => {
                return Err(Problem::new(
                    Kind::Connection,
                    "the receiver closed the session early",
                ))
            }
        };
        match frame {
            Frame::Want { id, want } => {
                let f = shared.files.lock().unwrap().get(&id).cloned();
                let f = f.ok_or_else(|| protocol(format!("Want for unknown file {id}")))?;
                want_file(shared, id, f, want).await?;
            }
            Frame::FileResult { id, outcome } => {
                let f = shared.files.lock().unwrap().remove(&id);
                let f = f.ok_or_else(|| protocol(format!("FileResult for unknown file {id}")))?;
                let st = f.st.lock().unwrap();
                let (status, error) = match outcome {
                    Outcome::Verified => (Status::Verified, None),
                    Outcome::Skipped => (Status::Skipped, None),
                    Outcome::Failed { code, message } => {
                        let kind = Kind::of_peer(code);
                        report
                            .problems
                            .push(Problem::at(kind, f.display.clone(), message.clone()));
                        (Status::Failed, Some(message))
                    }
                };
                if status == Status::Skipped {
                    Progress::add(&shared.progress.bytes_done, f.plan.size);
                }
                Progress::add(&shared.progress.files_done, 1);
                let done = st.digests.len() as u64 == f.plan.count()
                    && st.digests.iter().all(Option::is_some);
                report.files.push(FileReport {
                    path: f.display.clone(),
                    size: f.plan.size,
                    status,
                    bytes_transferred: st.sent,
                    bytes_resumed: st.resumed,
                    blake3: if done && status == Status::Verified {
                        Some(hex(&f.plan.root(
                            &st.digests.iter().map(|d| d.unwrap()).collect::<Vec<_>>(),
                        )))
                    } else {
                        None
                    },
                    error,
                });
            }
            Frame::Done { ok } => {
                // A receiver's problem outside its files (a directory's mode,
                // --fsync) comes only as `ok: false`: a put must not exit 0.
                if !ok && report.problems.is_empty() {
                    report.problems.push(Problem::new(
                        Kind::Remote,
                        "the receiver ended with a problem outside the files (a directory's mode or mtime, or --fsync); its log says which",
                    ));
                }
                return Ok(());
            }
            Frame::Fatal { code, message } => {
                let kind = Kind::of_peer(code);
                return Err(Problem::new(kind, message));
            }
            other => return Err(protocol(format!("unexpected {other:?}"))),
        }
    }
}

async fn want_file(
    shared: &Arc<Shared>,
    id: u64,
    f: Arc<SendFile>,
    want: Want,
) -> Result<(), Problem> {
    let n = f.plan.count();
    let send_mask: Option<Vec<bool>> = match &want {
        Want::Skip => return Ok(()),
        Want::All | Want::UnlessHash(_) => None,
        Want::Chunks(ranges) => {
            let mut m = vec![false; n as usize];
            for &(a, b) in ranges {
                if a > b || b > n {
                    return Err(protocol(format!(
                        "chunk range {a}..{b} outside file {id} of {n} chunks"
                    )));
                }
                m[a as usize..b as usize].iter_mut().for_each(|x| *x = true);
            }
            Some(m)
        }
    };
    if !start_file(&f, n, false) {
        return Err(protocol(format!(
            "a second Want for file {id}, or one in a fresh session"
        )));
    }
    if let Want::UnlessHash(hash) = want {
        shared.queue.push_all([Job::Compare { id, f, hash }]);
        return Ok(());
    }
    queue_chunks(shared, id, &f, send_mask).await
}

/// Queue every chunk of a file (those not in `send` are read and hashed only;
/// None: all go out); an empty file is done at once.
async fn queue_chunks(
    shared: &Shared,
    id: u64,
    f: &Arc<SendFile>,
    send: Option<Vec<bool>>,
) -> Result<(), Problem> {
    if f.plan.count() == 0 {
        return shared.ctl.send(empty_done(id, f)).await;
    }
    queue_jobs(shared, id, f, send);
    Ok(())
}

/// A file is wanted (once; false if it was already, or it is a fresh
/// session's and `fresh` is not this call's). Its chunk digests get room
/// with its first chunk read, not here: a long queue of wanted files holds
/// no per-chunk state.
fn start_file(f: &SendFile, n: u64, fresh: bool) -> bool {
    let mut st = f.st.lock().unwrap();
    if st.started {
        return false;
    }
    st.started = true;
    st.remaining = n;
    st.fresh = fresh;
    true
}

/// An empty file is done as soon as it is wanted.
fn empty_done(id: u64, f: &SendFile) -> Frame {
    Frame::FileDone {
        id,
        hash: f.plan.root(&[]),
        unchanged: false,
    }
}

/// Queue every chunk of a file of at least one chunk (`send`: which go out,
/// None: all).
fn queue_jobs(shared: &Shared, id: u64, f: &Arc<SendFile>, send: Option<Vec<bool>>) {
    let n = f.plan.count();
    debug_assert!(n > 0, "a Chunks job holds at least one chunk");
    let skipped: u64 = send.as_ref().map_or(0, |send| {
        (0..n)
            .filter(|&i| !send[i as usize])
            .filter_map(|i| f.plan.len(i))
            .sum()
    });
    Progress::add(&shared.progress.bytes_done, skipped);
    f.st.lock().unwrap().resumed = skipped;
    shared.queue.push_all([Job::Chunks {
        id,
        f: f.clone(),
        next: 0,
        send: send.map(Arc::new),
    }]);
}

fn open_source(f: &SendFile) -> std::io::Result<Arc<File>> {
    let mut st = f.st.lock().unwrap();
    if let Some(file) = &st.file {
        return Ok(file.clone());
    }
    let file = Arc::new(open_read(&f.dir, f.path.as_path())?);
    st.file = Some(file.clone());
    Ok(file)
}

fn read_chunk(f: &SendFile, index: u64) -> std::io::Result<(Bytes, Digest)> {
    let file = open_source(f)?;
    let len = f.plan.len(index).expect("planned chunk") as usize;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, f.plan.offset(index))
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                std::io::Error::new(e.kind(), "the file shrank while being sent")
            } else {
                e
            }
        })?;
    let mut h = f.plan.hasher(index);
    h.update(&buf);
    Ok((Bytes::from(buf), h.finish()))
}

/// After the last chunk: the source must still be the file the manifest described.
fn check_unchanged(f: &SendFile, file: &File) -> std::io::Result<()> {
    let m = file.metadata()?;
    let mtime = longhaul_transfer::manifest::system_time_ns(m.modified()?);
    if m.len() != f.plan.size || mtime != f.mtime_ns {
        return Err(std::io::Error::other("the file changed while being sent"));
    }
    Ok(())
}

async fn fail_file(shared: &Shared, id: u64, f: &SendFile, message: String) -> Result<(), Problem> {
    {
        let mut st = f.st.lock().unwrap();
        if st.failed {
            return Ok(());
        }
        st.failed = true;
        st.file = None;
    }
    shared.ctl.send(Frame::FileFailed { id, message }).await
}

/// Most record bytes a data stream carries before the sender finishes it and
/// opens the next. A QUIC receiver buffers out-of-order data per stream and
/// quinn aborts the connection ("too many gaps in stream buffer") when one
/// stream holds more than about a thousand separate ranges; a long fat path
/// whose queue overflows can drop every other packet of a stream with
/// thousands in flight. At 1 MiB (under a thousand packets) a stream cannot
/// reach that, and the connection's window still fills the path: finished
/// streams stay in flight until acknowledged.
pub const STREAM_BYTES: u64 = 1 << 20;

/// Counts what the current data stream carried; says when to start another.
#[derive(Debug, Default)]
struct StreamBudget {
    carried: u64,
}

impl StreamBudget {
    /// Before a record of `len` bytes: true if it must go on a new stream
    /// (the current one is not empty and would pass `STREAM_BYTES`).
    fn rotate_before(&mut self, len: u64) -> bool {
        let rotate = self.carried > 0 && self.carried + len > STREAM_BYTES;
        if rotate {
            self.carried = 0;
        }
        self.carried += len;
        rotate
    }
}

/// Where a file stands after one of its chunks was read.
enum Finish {
    NotYet,
    /// Every chunk read, the source unchanged: the file's BLAKE3.
    Hash(Digest),
    /// The file failed (the receiver was told).
    Failed,
}

/// Notes chunk `index` read (and sent, if `send`); after the file's last
/// chunk, checks that the source did not change.
async fn chunk_read(
    shared: &Shared,
    id: u64,
    f: &SendFile,
    index: u64,
    digest: Digest,
    send: bool,
) -> Result<Finish, Problem> {
    let finished = {
        let mut st = f.st.lock().unwrap();
        if st.digests.is_empty() {
            st.digests = vec![None; f.plan.count() as usize];
        }
        if st.digests[index as usize].replace(digest).is_none() {
            st.remaining -= 1;
        }
        if send {
            st.sent += f.plan.len(index).unwrap_or(0);
        }
        if st.remaining == 0 && !st.failed {
            let digests: Vec<Digest> = st.digests.iter().map(|d| d.unwrap()).collect();
            Some((f.plan.root(&digests), st.file.take()))
        } else {
            None
        }
    };
    let Some((hash, file)) = finished else {
        return Ok(Finish::NotYet);
    };
    if let Some(Err(e)) = file.map(|file| check_unchanged(f, &file)) {
        fail_file(shared, id, f, format!("{}: {e}", f.display)).await?;
        return Ok(Finish::Failed);
    }
    Ok(Finish::Hash(hash))
}

/// Chunks up to this size are read on the worker's own task.
const INLINE_READ: u64 = 64 << 10;

async fn worker(shared: Arc<Shared>, conn: quinn::Connection) -> Result<(), Problem> {
    let mut stream: Option<quinn::SendStream> = None;
    let mut budget = StreamBudget::default();
    let lost = |e: quinn::WriteError| {
        Problem::new(
            Kind::Connection,
            format!("data stream: {}", crate::control::chain(&e)),
        )
    };
    while let Some(job) = shared.queue.pop().await {
        match job {
            Job::Chunks { .. } => unreachable!("Queue::pop hands out one chunk at a time"),
            Job::Compare { id, f, hash } => {
                let f2 = f.clone();
                let r = tokio::task::spawn_blocking(move || -> std::io::Result<Digest> {
                    let file = open_source(&f2)?;
                    let mut h = blake3::Hasher::new();
                    h.update_reader(&*file)?;
                    Ok(*h.finalize().as_bytes())
                })
                .await
                .map_err(|e| Problem::new(Kind::LocalIo, e.to_string()))?;
                match r {
                    Ok(h) if h == hash => {
                        f.st.lock().unwrap().file = None;
                        shared
                            .ctl
                            .send(Frame::FileDone {
                                id,
                                hash,
                                unchanged: true,
                            })
                            .await?;
                    }
                    Ok(_) => {
                        queue_chunks(&shared, id, &f, None).await?;
                    }
                    Err(e) => fail_file(&shared, id, &f, format!("{}: {e}", f.display)).await?,
                }
            }
            Job::Chunk { id, f, index, send } => {
                if f.st.lock().unwrap().failed {
                    continue;
                }
                // A small chunk is read here: a page-cache copy of a few kB
                // costs less than a trip to the blocking pool and back.
                let r = if f.plan.len(index).unwrap_or(0) <= INLINE_READ {
                    read_chunk(&f, index)
                } else {
                    let f2 = f.clone();
                    tokio::task::spawn_blocking(move || read_chunk(&f2, index))
                        .await
                        .map_err(|e| Problem::new(Kind::LocalIo, e.to_string()))?
                };
                let (data, digest) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        fail_file(&shared, id, &f, format!("{}: {e}", f.display)).await?;
                        continue;
                    }
                };
                // A file of one chunk has its hash now: it goes on the data
                // stream right behind the data (no FileDone), so the receiver
                // can verify and place the file as soon as it is written.
                let inline_hash = if send && f.plan.count() == 1 {
                    match chunk_read(&shared, id, &f, index, digest, send).await? {
                        Finish::Hash(h) => Some(h),
                        Finish::Failed | Finish::NotYet => continue,
                    }
                } else {
                    None
                };
                if send {
                    let hash_len = if inline_hash.is_some() {
                        crate::proto::RECORD_HASH_LEN
                    } else {
                        0
                    };
                    let record = (crate::proto::RECORD_HEADER_LEN + data.len() + hash_len) as u64;
                    if budget.rotate_before(record) {
                        if let Some(mut old) = stream.take() {
                            let _ = old.finish();
                        }
                    }
                    if stream.is_none() {
                        let mut s = conn.open_uni().await.map_err(|e| {
                            Problem::new(Kind::Connection, format!("opening a data stream: {e}"))
                        })?;
                        s.write_all(DATA_PRELUDE).await.map_err(lost)?;
                        stream = Some(s);
                    }
                    if let Some(p) = &shared.pacer {
                        // A slow --max-rate books slots seconds ahead: a
                        // connection that closes meanwhile ends the wait.
                        tokio::select! {
                            _ = tokio::time::sleep(p.reserve(data.len() as u64)) => {}
                            e = conn.closed() => {
                                return Err(Problem::new(
                                    Kind::Connection,
                                    format!("data stream: {}", crate::control::chain(&e)),
                                ))
                            }
                        }
                    }
                    let s = stream.as_mut().unwrap();
                    let hdr = RecordHeader {
                        id,
                        offset: f.plan.offset(index),
                        len: data.len() as u32,
                        hash: inline_hash.is_some(),
                    };
                    s.write_all(&hdr.encode()).await.map_err(lost)?;
                    let n = data.len() as u64;
                    s.write_chunk(data).await.map_err(lost)?;
                    if let Some(h) = inline_hash {
                        s.write_all(&h).await.map_err(lost)?;
                    }
                    Progress::add(&shared.progress.bytes_done, n);
                }
                if inline_hash.is_none() {
                    if let Finish::Hash(hash) =
                        chunk_read(&shared, id, &f, index, digest, send).await?
                    {
                        shared
                            .ctl
                            .send(Frame::FileDone {
                                id,
                                hash,
                                unchanged: false,
                            })
                            .await?;
                    }
                }
            }
        }
    }
    if let Some(mut s) = stream {
        let _ = s.finish();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64) -> Arc<SendFile> {
        let t = std::env::temp_dir();
        Arc::new(SendFile {
            dir: Arc::new(Dir::open_ambient_dir(t, cap_std::ambient_authority()).unwrap()),
            path: RelPath::from_wire(b"x").unwrap(),
            display: "x".into(),
            plan: ChunkPlan::new(size),
            mtime_ns: 0,
            st: Mutex::default(),
        })
    }

    #[tokio::test]
    async fn the_queue_holds_a_job_per_file_and_hands_out_its_chunks_in_order() {
        let q = Queue::default();
        let mib = longhaul_transfer::CHUNK_SIZE;
        // A file of 1 TiB is one job in the queue, whatever its chunk count.
        q.push_all([
            Job::Chunks {
                id: 1,
                f: file(3 * mib),
                next: 0,
                send: Some(Arc::new(vec![true, false, true])),
            },
            Job::Chunks {
                id: 2,
                f: file(1 << 40),
                next: 0,
                send: None,
            },
        ]);
        assert_eq!(q.q.lock().unwrap().0.len(), 2);
        let mut got = Vec::new();
        for _ in 0..5 {
            match q.pop().await {
                Some(Job::Chunk {
                    id, index, send, ..
                }) => got.push((id, index, send)),
                _ => panic!("a chunk"),
            }
        }
        assert_eq!(
            got,
            [
                (1, 0, true),
                (1, 1, false),
                (1, 2, true),
                (2, 0, true),
                (2, 1, true)
            ]
        );
        assert_eq!(q.q.lock().unwrap().0.len(), 1, "file 2 still one job");
        // A file's last chunk takes its job off the queue; what follows comes next.
        q.q.lock().unwrap().0.clear();
        q.push_all([
            Job::Chunks {
                id: 3,
                f: file(10),
                next: 0,
                send: None,
            },
            Job::Compare {
                id: 4,
                f: file(10),
                hash: [0; 32],
            },
        ]);
        assert!(matches!(
            q.pop().await,
            Some(Job::Chunk {
                id: 3,
                index: 0,
                ..
            })
        ));
        assert!(matches!(q.pop().await, Some(Job::Compare { id: 4, .. })));
        q.close();
        assert!(q.pop().await.is_none());
    }

    #[test]
    fn no_data_stream_carries_more_than_the_budget_or_one_record() {
        let h = crate::proto::RECORD_HEADER_LEN as u64;
        // Small files packed back to back, then 1 MiB chunks, then small again.
        let records: Vec<u64> = std::iter::repeat_n(10_000 + h, 300)
            .chain(std::iter::repeat_n((1 << 20) + h, 5))
            .chain(std::iter::repeat_n(700 + h, 2000))
            .collect();
        let mut b = StreamBudget::default();
        let mut streams: Vec<Vec<u64>> = Vec::new();
        for &r in &records {
            if b.rotate_before(r) || streams.is_empty() {
                streams.push(Vec::new());
            }
            streams.last_mut().unwrap().push(r);
        }
        let total: u64 = records.iter().sum();
        for s in &streams {
            let bytes: u64 = s.iter().sum();
            assert!(!s.is_empty());
            assert!(
                bytes <= STREAM_BYTES || s.len() == 1,
                "{} records, {bytes} bytes",
                s.len()
            );
        }
        // Each full stream is well used: the streams are few.
        assert!(
            streams.len() as u64 <= 2 * total.div_ceil(STREAM_BYTES),
            "{}",
            streams.len()
        );
        assert_eq!(
            streams.iter().map(|s| s.len()).sum::<usize>(),
            records.len()
        );
    }
}
