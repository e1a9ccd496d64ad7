//! The sending role's driver (the server for `get`, the client for `put`):
//! feeds the sans-IO core ([`crate::core::send`]) with the tree walk (a
//! blocking thread), the receiver's frames and finished reads, and puts the
//! records it hands out on the data streams, one lane (task and stream) per
//! `--streams`. Reads up to 64 KiB run on the driver's own task, larger ones
//! and whole-file hashes on the blocking pool.

use crate::conns::{ConnSlot, Conns, Slots};
use crate::control::{CtlRx, CtlTx};
use crate::core::repair::{repair_symbols, repairs_worth_it, symbol_size, LossMeter};
use crate::core::send::{
    in_hand_limit, Done, Job, PathView, SendConfig, SendCore, Transmit, Walked,
};
use crate::core::Role;
use crate::proto::{ErrorCode, Frame, DATA_PRELUDE, MAX_PROTECTED, REPAIRED_PRELUDE};
use crate::receiver::BATCH;
use crate::report::{Kind, Problem, Progress, SessionReport};
use bytes::Bytes;
use cap_std::fs::Dir;
use longhaul_transfer::chunk::Digest;
use longhaul_transfer::place::open_read;
use longhaul_transfer::place::Shape;
use longhaul_transfer::walk::{WalkError, WalkItem, Walker};
use longhaul_transfer::{ChunkPlan, Entry, EntryKind, RelPath};
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc;

/// One requested root on the sending side: a directory handle and a path inside it.
pub(crate) struct SendRoot {
    pub dir: Arc<Dir>,
    pub start: RelPath,
    /// The request ended in `/`: only a directory will do.
    pub must_be_dir: bool,
    /// The name it lands under at the destination (empty: its contents
    /// land there): what `filter` rules are matched beneath.
    pub name: Vec<u8>,
    /// A listed get (a shard's): only these paths beneath `start`, found
    /// one by one, not by a walk.
    pub only: Option<Vec<RelPath>>,
}

/// A root that could not even be named (bad path): sent as a `RootError`.
pub(crate) type SendRootResult = Result<SendRoot, (ErrorCode, String)>;

/// A source file, as the core's jobs name it.
#[derive(Debug)]
pub(crate) struct SrcFile {
    dir: Arc<Dir>,
    path: RelPath,
    /// It took fewer blocks than its size needs when it was walked: its
    /// chunks are looked for in holes. (One that turns sparse after the
    /// walk is read whole: the same bytes, sent as data.)
    sparse: bool,
}

type Src = Arc<SrcFile>;

/// How a session's sending side runs.
#[derive(Debug, Clone)]
pub(crate) struct SendOpts {
    /// Data streams at once.
    pub streams: usize,
    /// Cap on the sending rate (bits/s), 0 = none.
    pub max_rate: u64,
    /// Send every file whole at once, unasked (a fresh session: a get's
    /// `Hello.fresh`, a put's `Welcome.fresh`).
    pub fresh: bool,
    /// The connection's send window, kept by its tuner
    /// ([`crate::net::Tuned::send_window`]): the lanes together hold at most
    /// a quarter of it in hand ([`crate::core::send::in_hand_limit`]).
    pub send_window: Arc<AtomicU64>,
    /// What the walk leaves out (`--exclude`, `--include`).
    pub filter: Arc<longhaul_transfer::filter::Filter>,
    /// See [`SendConfig::peer_makes`].
    pub peer_makes: (bool, bool),
    /// The extended attributes and ACLs the walk reads (`--xattrs`,
    /// `--acls`); owners always go.
    pub meta: longhaul_transfer::meta::Wanted,
    /// A put that sends its files before the server's `Welcome` (in its
    /// first flight, `Hello.fresh`): the `Welcome` comes meanwhile on the
    /// control stream and is taken here. A `Welcome.fresh` of false ends
    /// the session (its data was sent for a fresh one).
    pub welcome: Option<Arc<Welcomed>>,
}

/// The `Welcome` a put that did not wait for it got ([`SendOpts::welcome`]):
/// the server's name and its `fresh`, once it came.
#[derive(Debug, Default)]
pub(crate) struct Welcomed(Mutex<Option<(String, bool)>>);

impl Welcomed {
    /// The server's name and `Welcome.fresh`, once the `Welcome` came.
    pub(crate) fn get(&self) -> Option<(String, bool)> {
        self.0.lock().unwrap().clone()
    }
}

/// Chunks up to this size are read on the driver's own task: a page-cache
/// copy of a few kB costs less than a trip to the blocking pool and back.
const INLINE_READ: u64 = 64 << 10;

enum Input {
    Walked(Walked<Src>),
    /// A lane wrote a record of this many data bytes.
    Written(usize, u64),
    Done(Done),
    Failed(Problem),
}

/// Run the sending role until the receiver says `Done` (or the session fails).
pub(crate) async fn run_sender(
    conns: Conns,
    ctl: CtlTx,
    rx: &mut CtlRx,
    sources: Vec<SendRootResult>,
    opts: SendOpts,
    progress: Arc<Progress>,
) -> (SessionReport, Result<(), Problem>) {
    let cfg = SendConfig {
        fresh: opts.fresh,
        max_rate: opts.max_rate,
        peer_makes: opts.peer_makes,
    };
    let conn = conns.first.clone();
    let slots = Slots::new(conns);
    // Every connection carries at least one lane.
    let lanes = opts.streams.max(slots.count());
    let mut core: SendCore<Src> = SendCore::new(cfg, lanes, progress.clone());
    let (tx, mut inputs) = mpsc::channel::<Input>(1024);
    let walker = {
        let tx = tx.clone();
        let filter = opts.filter.clone();
        let meta = opts.meta;
        tokio::task::spawn_blocking(move || walk_all(sources, &filter, meta, &tx))
    };
    let mut lane_txs = Vec::new();
    let mut lane_tasks = Vec::new();
    let repair_bytes = Arc::new(AtomicU64::new(0));
    let meter: Arc<Mutex<LossMeter>> = Default::default();
    for lane in 0..lanes {
        let (ltx, lrx) = mpsc::unbounded_channel();
        lane_txs.push(ltx);
        let (tx, slot, progress) = (tx.clone(), slots.for_lane(lane), progress.clone());
        let repair_bytes = repair_bytes.clone();
        let loss = Loss {
            shared: meter.clone(),
            first: conn.stable_id(),
            own: LossMeter::default(),
        };
        lane_tasks.push(tokio::spawn(async move {
            if let Err(p) = run_lane(lane, slot, lrx, &tx, &progress, &repair_bytes, loss).await {
                let _ = tx.send(Input::Failed(p)).await;
            }
        }));
    }
    let disk = Arc::new(SendDisk::default());
    let lanes = Lanes {
        txs: lane_txs,
        send_window: opts.send_window,
        connections: slots.count() as u64,
        first: conn.clone(),
        last_path: Default::default(),
        meter,
    };
    let control = Control {
        tx: &ctl,
        rx,
        welcome: opts.welcome.as_deref(),
    };
    let result = match drive(&mut core, &disk, control, &mut inputs, &tx, &lanes).await {
        Err(p) => Err(crate::control::with_close_reason(&conn, p).await),
        ok => ok,
    };
    // The lanes finish their streams once their channels close; the walker
    // and any lane still reporting see the inputs gone.
    drop(lanes);
    drop(inputs);
    walker.abort();
    if result.is_ok() {
        for t in lane_tasks {
            let _ = t.await;
        }
    } else {
        lane_tasks.iter().for_each(|t| t.abort());
    }
    let mut report = core.take_report();
    report.repair_bytes = repair_bytes.load(Ordering::Relaxed);
    (report, result)
}

/// The control stream as the driver uses it.
struct Control<'a> {
    tx: &'a CtlTx,
    rx: &'a mut CtlRx,
    /// See [`SendOpts::welcome`].
    welcome: Option<&'a Welcomed>,
}

async fn drive(
    core: &mut SendCore<Src>,
    disk: &Arc<SendDisk>,
    control: Control<'_>,
    inputs: &mut mpsc::Receiver<Input>,
    tx: &mpsc::Sender<Input>,
    lanes: &Lanes,
) -> Result<(), Problem> {
    let Control {
        tx: ctl,
        rx,
        welcome,
    } = control;
    let mut control_open = true;
    loop {
        // (The other connections' windows are taken to be the first's: one path.)
        let window = lanes.send_window.load(Ordering::Relaxed) * lanes.connections;
        core.set_in_hand(Instant::now(), in_hand_limit(window));
        let (tail, path) = lanes.path();
        let limit = core.stream_limit();
        core.set_tail(tail);
        core.set_path(path);
        if core.stream_limit() != limit {
            tracing::debug!(
                cwnd = path.cwnd,
                sent = path.sent,
                "data streams now carry up to {} bytes each",
                core.stream_limit()
            );
        }
        loop {
            let mut idle = true;
            while let Some(f) = core.poll_frame() {
                idle = false;
                if let Err(p) = ctl.send(f).await {
                    core.handle_failure(p);
                }
            }
            while let Some(t) = core.poll_transmit() {
                idle = false;
                let _ = lanes.txs[t.lane].send(t);
            }
            while let Some(job) = core.poll_job() {
                idle = false;
                if disk.is_light(&job) {
                    if let Some(d) = disk.run(job) {
                        core.handle_done(Instant::now(), d);
                    }
                } else {
                    let (disk, tx) = (disk.clone(), tx.clone());
                    tokio::task::spawn_blocking(move || {
                        if let Some(d) = disk.run(job) {
                            let _ = tx.blocking_send(Input::Done(d));
                        }
                    });
                }
            }
            if idle {
                break;
            }
        }
        if let Some(outcome) = core.outcome() {
            return outcome;
        }
        tokio::select! {
            f = rx.recv(), if control_open => {
                control_open = f.is_some();
                match (f, welcome) {
                    (Some(Ok(Frame::Welcome { server, fresh, .. })), Some(w))
                        if w.get().is_none() =>
                    {
                        *w.0.lock().unwrap() = Some((server, fresh));
                        if !fresh {
                            core.handle_failure(Problem::new(
                                Kind::Connection,
                                "the destination holds some of the put's targets: \
                                 its files go again, each as the server wants it",
                            ));
                        }
                    }
                    (f, _) => core.handle_control(Instant::now(), f),
                }
            }
            i = inputs.recv() => {
                // What else is there already goes in before the core's
                // output is acted on (see the receiver's loop).
                let mut next = i;
                for n in 0..BATCH {
                    match next.expect("the driver holds a sender") {
                        Input::Walked(w) => core.handle_walked(Instant::now(), w),
                        Input::Written(lane, n) => core.handle_written(Instant::now(), lane, n),
                        Input::Done(d) => core.handle_done(Instant::now(), d),
                        Input::Failed(p) => core.handle_failure(p),
                    }
                    if n + 1 == BATCH {
                        break; // (the rest after this round's output)
                    }
                    next = match inputs.try_recv() {
                        Ok(i) => Some(i),
                        Err(_) => break,
                    };
                }
            }
        }
    }
}

/// The lanes' channels, and the send window that bounds what they hold.
struct Lanes {
    txs: Vec<mpsc::UnboundedSender<Transmit>>,
    /// The first connection's send window.
    send_window: Arc<AtomicU64>,
    /// The connections the lanes are spread over.
    connections: u64,
    first: quinn::Connection,
    /// The last [`Lanes::path`], and when it was read.
    last_path: Mutex<Option<(Instant, (u64, PathView))>>,
    /// The first connection's loss meter, sampled with the path.
    meter: Arc<Mutex<LossMeter>>,
}

impl Lanes {
    /// The transfer's last window, protected by tail repair: what the
    /// congestion windows hold (a quarter more), at most [`MAX_TAIL`]; none
    /// while the controller times its first train (its window is then
    /// unbounded) or when the peer takes no datagrams; and the path as the
    /// core's stream rule wants it (the first connection's congestion window
    /// and bytes sent, a lane's share of the send window). Read from the
    /// connection at most every [`PATH_EVERY`].
    fn path(&self) -> (u64, PathView) {
        let now = Instant::now();
        let mut last = self.last_path.lock().unwrap();
        if let Some((at, read)) = *last {
            if now < at + PATH_EVERY {
                return read;
            }
        }
        let stats = self.first.stats();
        let path = stats.path;
        self.meter.lock().unwrap().note(now, path.sent_packets);
        let cwnd = path.cwnd;
        let tail = match self.first.max_datagram_size().and_then(symbol_size) {
            Some(_) if cwnd < 1 << 30 => (cwnd * self.connections * 5 / 4).min(MAX_TAIL),
            _ => 0,
        };
        let view = PathView {
            cwnd,
            sent: stats.udp_tx.bytes,
            // (The other connections' windows are not read.)
            lane_backlog: if self.connections > 1 {
                u64::MAX
            } else {
                self.send_window.load(Ordering::Relaxed) / self.txs.len().max(1) as u64
            },
        };
        *last = Some((now, (tail, view)));
        (tail, view)
    }
}

/// How often the driver reads the connection for [`Lanes::path`].
const PATH_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

/// The most a transfer protects at its end (a gigabit's worth of a 2 s
/// round trip).
const MAX_TAIL: u64 = 256 << 20;

/// A lane finishes its protected stream, and sends its repair, when no
/// record came for this long.
const REPAIR_IDLE: std::time::Duration = std::time::Duration::from_millis(2);

/// A lane's open data stream.
struct Open {
    s: quinn::SendStream,
    /// A protected stream's bytes so far, prelude included.
    block: Option<Vec<u8>>,
}

impl Open {
    fn put(&mut self, b: &[u8]) {
        if let Some(block) = &mut self.block {
            block.extend_from_slice(b);
        }
    }

    /// Finish the stream; a protected one's repair symbols follow as
    /// datagrams, as many as the connection's loss rate asks for, made and
    /// sent by a task in `jobs` (the lane goes on with its next record
    /// meanwhile).
    fn finish(
        mut self,
        conn: &quinn::Connection,
        loss: &Loss,
        repair_bytes: &Arc<AtomicU64>,
        jobs: &mut tokio::task::JoinSet<()>,
    ) {
        let _ = self.s.finish();
        let Some(block) = self.block.take() else {
            return;
        };
        let path = conn.stats().path;
        let loss = loss.rate(conn, &path);
        let Some(t) = conn.max_datagram_size().and_then(symbol_size) else {
            return;
        };
        let k = block.len().div_ceil(t as usize) as u32;
        let rate = path.cwnd as f64 / path.rtt.as_secs_f64().max(1e-3);
        let count = repairs_worth_it(k, t, loss, rate, path.rtt);
        if count == 0 || block.len() > MAX_PROTECTED as usize {
            return;
        }
        let stream = u64::from(self.s.id());
        tracing::debug!(
            "protected stream {stream}: {} bytes, {k} symbols of {t}, {count} repair at loss {loss:.5}",
            block.len()
        );
        let (conn, repair_bytes) = (conn.clone(), repair_bytes.clone());
        jobs.spawn(async move {
            let symbols =
                tokio::task::spawn_blocking(move || repair_symbols(stream, &block, t, count)).await;
            for r in symbols.unwrap_or_default() {
                let d = bytes::Bytes::from(r.encode());
                let n = d.len() as u64;
                if conn.send_datagram_wait(d).await.is_err() {
                    return; // the connection is closing
                }
                repair_bytes.fetch_add(n, Ordering::Relaxed);
            }
        });
    }
}

/// The loss rate tail repair sizes for: the lanes of the session's first
/// connection share one [`LossMeter`], which the driver samples every 5 ms
/// ([`Lanes::tail`]); a lane on another connection samples its own as it
/// writes.
struct Loss {
    shared: Arc<Mutex<LossMeter>>,
    first: usize,
    own: LossMeter,
}

impl Loss {
    fn note(&mut self, conn: &quinn::Connection) {
        let now = Instant::now();
        if conn.stable_id() != self.first && self.own.due(now) {
            self.own.note(now, conn.stats().path.sent_packets);
        }
    }

    /// The loss rate of `conn`, whose statistics are `path`.
    fn rate(&self, conn: &quinn::Connection, path: &quinn::PathStats) -> f64 {
        let now = Instant::now();
        if conn.stable_id() == self.first {
            self.shared
                .lock()
                .unwrap()
                .rate(now, path.rtt, path.lost_packets)
        } else {
            self.own.rate(now, path.rtt, path.lost_packets)
        }
    }
}

/// One lane: puts the records it is given on its data stream (a new one
/// when the core says so), paced, and says when it is free again. A
/// protected stream (tail repair) is finished, and its repair sent, when
/// the core rotates it or no record came for [`REPAIR_IDLE`].
async fn run_lane(
    lane: usize,
    mut slot: ConnSlot,
    mut records: mpsc::UnboundedReceiver<Transmit>,
    tx: &mpsc::Sender<Input>,
    progress: &Progress,
    repair_bytes: &Arc<AtomicU64>,
    mut loss: Loss,
) -> Result<(), Problem> {
    let lost = |e: quinn::WriteError| {
        Problem::new(
            Kind::Connection,
            format!("data stream: {}", crate::control::chain(&e)),
        )
    };
    let mut stream: Option<Open> = None;
    let mut up: Option<quinn::Connection> = None;
    // Repair being made and sent; what is left when the lane ends (the
    // session is over) is dropped.
    let mut jobs = tokio::task::JoinSet::new();
    loop {
        if let Some(c) = &up {
            loss.note(c);
        }
        while jobs.try_join_next().is_some() {}
        let protected = stream.as_ref().is_some_and(|o| o.block.is_some());
        let t = if protected {
            match tokio::time::timeout(REPAIR_IDLE, records.recv()).await {
                Ok(t) => t,
                Err(_) => {
                    let (open, conn) = (stream.take().expect("protected"), up.as_ref());
                    let conn = conn.expect("opened on it");
                    open.finish(conn, &loss, repair_bytes, &mut jobs);
                    continue;
                }
            }
        } else {
            records.recv().await
        };
        let Some(t) = t else { break };
        let conn = match &up {
            Some(c) => c.clone(),
            None => up.insert(slot.get().await?).clone(),
        };
        if t.rotate {
            if let Some(old) = stream.take() {
                old.finish(&conn, &loss, repair_bytes, &mut jobs);
            }
        }
        if stream.is_none() {
            let mut s = conn.open_uni().await.map_err(|e| {
                Problem::new(Kind::Connection, format!("opening a data stream: {e}"))
            })?;
            let prelude = if t.protect {
                REPAIRED_PRELUDE
            } else {
                DATA_PRELUDE
            };
            s.write_all(prelude).await.map_err(lost)?;
            stream = Some(Open {
                s,
                block: t.protect.then(|| prelude.to_vec()),
            });
        }
        if let Some(at) = t.not_before {
            // A slow --max-rate books slots seconds ahead: a connection
            // that closes meanwhile ends the wait.
            tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => {}
                e = conn.closed() => {
                    return Err(Problem::new(
                        Kind::Connection,
                        format!("data stream: {}", crate::control::chain(&e)),
                    ))
                }
            }
        }
        let o = stream.as_mut().expect("opened above");
        let header = t.header.encode();
        o.s.write_all(&header).await.map_err(lost)?;
        o.put(&header);
        let n = t.data.len() as u64;
        o.put(&t.data);
        o.s.write_chunk(t.data).await.map_err(lost)?;
        // (After a slow --max-rate's wait for its slot, not at the stream's
        // opening.)
        progress.first_data.get_or_init(Instant::now);
        if let Some(h) = t.hash {
            o.s.write_all(&h).await.map_err(lost)?;
            o.put(&h);
        }
        if tx.send(Input::Written(lane, n)).await.is_err() {
            break;
        }
    }
    if let Some(mut o) = stream {
        // The session is over: no repair for the last stream.
        let _ = o.s.finish();
    }
    Ok(())
}

/// Walk every requested root, handing what is found to the core.
fn walk_all(
    sources: Vec<SendRootResult>,
    filter: &Arc<longhaul_transfer::filter::Filter>,
    meta: longhaul_transfer::meta::Wanted,
    tx: &mpsc::Sender<Input>,
) {
    let send = |w: Walked<Src>| tx.blocking_send(Input::Walked(w)).is_ok();
    for (root, src) in sources.into_iter().enumerate() {
        let root = root as u32;
        // (Hard links are kept within a root.)
        let mut linked = longhaul_transfer::walk::HardLinks::default();
        let (mut src, walker) = match src.and_then(|s| open_root(s, filter)) {
            Ok(x) => x,
            Err((code, message)) => {
                if !send(Walked::RootError {
                    root,
                    code,
                    message,
                }) {
                    return;
                }
                continue;
            }
        };
        // A listed get: the root's own entry, then each path asked for.
        let only = src.only.take();
        let items: Box<dyn Iterator<Item = Result<WalkItem, WalkError>>> = match only {
            None => Box::new(walker),
            Some(paths) => {
                let (dir, start) = (src.dir.clone(), src.start.clone());
                let found = paths.into_iter().filter_map(move |p| {
                    match longhaul_transfer::walk::item_at(&dir, &start, &p) {
                        Ok(Some(it)) => Some(Ok(it)),
                        // (Gone since the plan: the receiver reports what it lacks.)
                        Ok(None) => None,
                        Err(error) => Some(Err(WalkError { path: p, error })),
                    }
                });
                Box::new(walker.take(1).chain(found))
            }
        };
        for item in items {
            let w = match item {
                Err(e) => Walked::Error {
                    root,
                    path: e.path.as_bytes().to_vec(),
                    message: e.error.to_string(),
                },
                Ok(mut it) => {
                    let path = match src.start.join(&it.path) {
                        Ok(p) => p,
                        Err(e) => {
                            let p = Problem::new(Kind::LocalIo, e.to_string());
                            let _ = tx.blocking_send(Input::Failed(p));
                            return;
                        }
                    };
                    let name = it.path.as_bytes().to_vec();
                    linked.mark(&mut it, &name);
                    let (kind, link) = (it.kind, it.link);
                    let file = (kind == EntryKind::File).then(|| {
                        Arc::new(SrcFile {
                            dir: src.dir.clone(),
                            path: path.clone(),
                            sparse: it.allocated < it.size,
                        })
                    });
                    Walked::Entry {
                        root,
                        display: path.display(),
                        entry: Entry {
                            id: 0,
                            root,
                            path: it.path.as_bytes().to_vec(),
                            kind,
                            size: it.size,
                            mode: it.mode,
                            mtime_ns: it.mtime_ns,
                            link,
                            owner: longhaul_transfer::meta::owner_of(it.uid, it.gid),
                            xattrs: xattrs_of(&src.dir, &path, kind, meta),
                            allocated: match kind == EntryKind::File && it.allocated < it.size {
                                true => it.allocated,
                                false => 0,
                            },
                        },
                        src: file,
                    }
                }
            };
            if !send(w) {
                return;
            }
        }
    }
    send(Walked::End);
}

/// Start walking a requested root, or say why it cannot be served.
fn open_root(
    src: SendRoot,
    filter: &Arc<longhaul_transfer::filter::Filter>,
) -> Result<(SendRoot, std::iter::Peekable<Walker>), (ErrorCode, String)> {
    let walker = match Walker::new(&src.dir, &src.start) {
        Ok(w) => w,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                ErrorCode::NotFound
            } else {
                ErrorCode::Io
            };
            return Err((code, format!("{}: {e}", src.start.display())));
        }
    };
    if src.must_be_dir && walker.start_kind() != Some(EntryKind::Dir) {
        return Err((
            ErrorCode::NotFound,
            format!("{}/: not a directory", src.start.display()),
        ));
    }
    // (A root the rules leave out sends nothing, as rsync does.)
    let walker = walker.filtered(filter.clone(), src.name.clone()).peekable();
    Ok((src, walker))
}

/// The sending side's file-system work: the source files open while their
/// chunks are read, by id.
#[derive(Default)]
pub(crate) struct SendDisk {
    open: Mutex<HashMap<u64, Arc<File>>>,
}

impl SendDisk {
    fn is_light(&self, job: &Job<Src>) -> bool {
        match job {
            Job::Read { plan, index, .. } => plan.len(*index).unwrap_or(0) <= INLINE_READ,
            Job::Check { .. } | Job::Close { .. } => true,
            Job::Compare { .. } => false,
        }
    }

    fn file(&self, id: u64, src: &SrcFile) -> std::io::Result<Arc<File>> {
        if let Some(f) = self.open.lock().unwrap().get(&id) {
            return Ok(f.clone());
        }
        let f = Arc::new(open_read(&src.dir, src.path.as_path())?);
        self.open.lock().unwrap().insert(id, f.clone());
        Ok(f)
    }

    fn close(&self, id: u64) {
        self.open.lock().unwrap().remove(&id);
    }

    fn run(&self, job: Job<Src>) -> Option<Done> {
        Some(match job {
            Job::Read {
                lane,
                id,
                index,
                src,
                plan,
                check,
                send,
                charged,
            } => {
                let result = self.read_chunk(id, &src, &plan, index).and_then(|r| {
                    if let Some(mtime_ns) = check {
                        let file = self.file(id, &src)?;
                        self.close(id);
                        check_unchanged(&file, plan.size, mtime_ns)?;
                    }
                    Ok(r)
                });
                Done::Read {
                    lane,
                    id,
                    index,
                    send,
                    charged,
                    result,
                }
            }
            Job::Check {
                id,
                src,
                size,
                mtime_ns,
            } => {
                let result = self
                    .file(id, &src)
                    .and_then(|f| check_unchanged(&f, size, mtime_ns));
                self.close(id);
                Done::Checked { id, result }
            }
            Job::Compare { lane, id, src } => {
                let result = self.file(id, &src).and_then(|file| {
                    let mut h = blake3::Hasher::new();
                    h.update_reader(&*file)?;
                    Ok(*h.finalize().as_bytes())
                });
                Done::Compared { lane, id, result }
            }
            Job::Close { id } => {
                self.close(id);
                return None;
            }
        })
    }

    fn read_chunk(
        &self,
        id: u64,
        src: &SrcFile,
        plan: &ChunkPlan,
        index: u64,
    ) -> std::io::Result<(Bytes, Digest, Shape)> {
        // (Whether it is sparse is the walk's word: no second stat.)
        let (file, sparse) = (self.file(id, src)?, src.sparse);
        let len = plan.len(index).expect("planned chunk") as usize;
        // A sparse file's chunks that lie in a hole are not read: they go
        // as zeros, without data.
        if sparse && in_hole(&file, plan.offset(index), len as u64)? {
            let shape = Shape {
                zeros: true,
                sparse,
            };
            return Ok((Bytes::new(), plan.zero_digest(index), shape));
        }
        let buf =
            longhaul_transfer::chunk::read_at(&file, len, plan.offset(index)).map_err(|e| {
                // (It shrank: a file that changed.)
                match (e.kind(), file.metadata()) {
                    (std::io::ErrorKind::UnexpectedEof, Ok(m)) => changed(&m),
                    (std::io::ErrorKind::UnexpectedEof, Err(_)) => {
                        std::io::Error::new(e.kind(), "the file shrank while being sent")
                    }
                    _ => e,
                }
            })?;
        let mut h = plan.hasher(index);
        h.update(&buf);
        let shape = Shape {
            zeros: false,
            sparse,
        };
        Ok((Bytes::from(buf), h.finish(), shape))
    }
}

/// [`longhaul_transfer::meta::xattrs_at`]; one that cannot be read is
/// logged and sent without them.
fn xattrs_of(
    dir: &Dir,
    path: &RelPath,
    kind: EntryKind,
    want: longhaul_transfer::meta::Wanted,
) -> Vec<longhaul_transfer::meta::Xattr> {
    longhaul_transfer::meta::xattrs_at(dir, path, kind, want).unwrap_or_else(|e| {
        tracing::warn!(
            "{}: its extended attributes are not sent: {e}",
            path.display()
        );
        Vec::new()
    })
}

/// Whether `len` bytes of `file` at `off` lie in a hole (SEEK_DATA finds no
/// data before their end). A file system without SEEK_DATA says there is
/// data everywhere.
fn in_hole(file: &File, off: u64, len: u64) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: lseek on a descriptor this function borrows (the reads use
    // pread: the offset it moves is not theirs).
    let data = unsafe { libc::lseek(file.as_raw_fd(), off as libc::off_t, libc::SEEK_DATA) };
    if data < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(true), // no data after `off`
            Some(libc::EINVAL) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(data as u64 >= off + len)
}

/// After the last chunk: the source must still be the file the manifest described.
/// (Its error says the file's size and mtime now: the file is tried once
/// more, [`crate::core::send::Changed`].)
fn check_unchanged(file: &File, size: u64, mtime_ns: i64) -> std::io::Result<()> {
    let m = file.metadata()?;
    let mtime = longhaul_transfer::manifest::system_time_ns(m.modified()?);
    if m.len() != size || mtime != mtime_ns {
        return Err(changed(&m));
    }
    Ok(())
}

/// The error of a file that changed while it was sent, with what it is now.
fn changed(m: &std::fs::Metadata) -> std::io::Error {
    let mtime_ns = m
        .modified()
        .map_or(0, longhaul_transfer::manifest::system_time_ns);
    std::io::Error::other(crate::core::send::Changed {
        size: m.len(),
        mtime_ns,
    })
}
