//! The receiving role's driver (the client for `get`, the server for `put`):
//! moves control frames and data records between quinn and the sans-IO core
//! ([`crate::core::recv`]) and runs the core's file-system jobs
//! ([`crate::disk`]): light ones on its own task, the manifest lane's in
//! order, heavy ones on the blocking pool.
//!
//! Each data stream has a task that reads records (header, payload, the
//! hash of a file's only chunk) and hands them to the core, and stops
//! reading while the core holds 256 KiB or 64 of them: a slow disk holds the
//! streams, and QUIC's flow control holds the sender.

use crate::conns::Conns;
use crate::control::{CtlRx, CtlTx};
use crate::core::recv::{Done, Event, Job, Record, RecvConfig, RecvCore, MAX_WAITING};
use crate::core::repair::Block;
use crate::core::Role;
use crate::disk::RecvDisk;
use crate::proto::{
    ProtoError, RecordHeader, Repair, DATA_PRELUDE, RECORD_HASH_LEN, RECORD_HEADER_LEN,
    REPAIRED_PRELUDE,
};
use crate::report::{Kind, Problem, Progress, SessionReport};
use cap_std::fs::Dir;
use longhaul_transfer::landing::Landing;
use longhaul_transfer::place::Heard;
use longhaul_transfer::sync::SyncMode;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, Semaphore};

/// Whether this process runs as root (it may give files any owner).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Where a receiving session's entries go.
pub(crate) struct Destination {
    /// Directory under which every target is resolved (cap-std confined).
    pub base: Dir,
    pub landing: Landing,
}

impl Destination {
    /// See [`Landing::is_fresh`].
    pub(crate) fn is_fresh(&self) -> bool {
        self.landing.is_fresh(&self.base)
    }
}

#[derive(Clone)]
pub(crate) struct RecvOpts {
    pub sync: SyncMode,
    /// See [`RecvConfig::fresh`].
    pub fresh: bool,
    /// Durable files ([`RecvConfig::durable`]).
    pub durable: bool,
    /// See [`RecvConfig::exact_modes`].
    pub exact_modes: bool,
    /// See [`RecvConfig::specials`].
    pub specials: bool,
    /// See [`RecvConfig::devices`].
    pub devices: bool,
    /// See [`RecvConfig::delete`].
    pub delete: Option<Arc<longhaul_transfer::filter::Filter>>,
    /// See [`RecvConfig::dry_run`].
    pub dry_run: bool,
    /// What of the owners and attributes sent this side applies.
    pub meta: longhaul_transfer::meta::Policy,
    /// A server's record of unfinished parts, and the client this session
    /// is for: what it leaves unfinished is recorded there.
    pub keep: Option<(Arc<crate::kept::KeptParts>, String)>,
    /// A shard (`--shard K/N`): which, and where its plan is shared.
    pub shard: Option<crate::sharding::Sharding>,
    /// A shard's plan its client read already (a listed get): not read
    /// again.
    pub plan: Option<Arc<longhaul_transfer::shard::Plan>>,
    /// `--shard finish`: the plan to remove once the session has ended well.
    pub finish_plan: Option<crate::sharding::Sharding>,
}

/// What reaches the driver's loop besides control frames.
enum Input {
    /// A data stream was accepted; its task waits on `ready` between records.
    Stream {
        id: u64,
        ready: mpsc::Sender<Vec<u8>>,
    },
    Record(Record),
    /// A data stream broke (or broke the protocol).
    Failed(Problem),
    /// A job finished on the blocking pool.
    Done(Done),
}

/// A data stream that broke, with the cause ("connection lost: timed out").
fn stream_lost(e: &quinn::ReadError) -> Problem {
    Problem::new(
        Kind::Connection,
        format!("data stream: {}", crate::control::chain(e)),
    )
}

fn protocol(msg: impl Into<String>) -> Problem {
    Problem::new(
        Kind::Connection,
        format!("protocol error from the sender: {}", msg.into()),
    )
}

/// Run the receiving role until every entry is settled; sends `Done`.
pub(crate) async fn run_receiver(
    conns: Conns,
    ctl: CtlTx,
    rx: &mut CtlRx,
    dest: Destination,
    opts: RecvOpts,
    progress: Arc<Progress>,
) -> (SessionReport, Result<(), Problem>) {
    let cfg = RecvConfig {
        sync: opts.sync,
        fresh: opts.fresh,
        durable: opts.durable,
        exact_modes: opts.exact_modes,
        specials: opts.specials,
        devices: opts.devices,
        max_waiting: MAX_WAITING,
        delete: opts.delete.clone(),
        dry_run: opts.dry_run,
        shard: None,
    };
    // A destination in memory only (tmpfs) has no disk to wait for.
    let durable = opts.durable && !longhaul_transfer::place::in_memory_only(&dest.base);
    let disk = Arc::new(
        RecvDisk::new(dest.base, durable)
            .with_meta(opts.meta)
            .with_sharding(opts.shard.clone()),
    );
    // A shard whose plan file is there plans from it at once; one that
    // cannot read it fails, and tells its peer why.
    let mut cfg = cfg;
    let mut unplanned = None;
    if let Some(sh) = &opts.shard {
        let read = match &opts.plan {
            Some(plan) => Ok(Some(plan.clone())),
            None => disk.read_plan(sh),
        };
        match read {
            Ok(plan) => cfg.shard = Some((sh.shard, plan)),
            Err(e) => unplanned = Some(Problem::new(Kind::LocalIo, e)),
        }
    }
    let mut core = RecvCore::new(cfg, dest.landing, progress.clone());
    if let Some(p) = unplanned {
        core.refuse(p);
    }
    let (tx, mut inputs) = mpsc::channel::<Input>(1024);
    // The stream tasks live in the acceptor's set: aborting the acceptor at
    // the end stops those still reading a stream the sender has not finished
    // yet, and with them their handles on the control stream (whose end the
    // client of a get would otherwise wait a round trip for).
    let heard = disk.heard();
    let gate = Arc::new(Semaphore::new(IN_HAND as usize));
    let held: Held = Default::default();
    let repair: Arc<RepairCounts> = Default::default();
    let conn = conns.first.clone();
    let acceptor = {
        let accept = Accept {
            tx: tx.clone(),
            heard: heard.clone(),
            gate: gate.clone(),
            held: held.clone(),
            progress: progress.clone(),
            next: Default::default(),
            repair: repair.clone(),
            protected: Default::default(),
        };
        tokio::spawn(async move {
            let Conns {
                first, mut more, ..
            } = conns;
            // One acceptor per connection; dropping the set (the task is
            // aborted at the end) stops them and their streams' tasks.
            let mut each = tokio::task::JoinSet::new();
            each.spawn(accept.clone().on(first));
            let mut joining = true;
            loop {
                tokio::select! {
                    c = more.recv(), if joining => match c {
                        Some((_, c)) => {
                            each.spawn(accept.clone().on(c));
                        }
                        None => joining = false,
                    },
                    Some(_) = each.join_next(), if !each.is_empty() => {}
                    else => break,
                }
            }
        })
    };
    let behind = Behind {
        gate: &gate,
        held: &held,
    };
    let result = drive(&mut core, &disk, &ctl, rx, &mut inputs, &tx, behind).await;
    acceptor.abort();
    let result = match result {
        Err(p) => Err(crate::control::with_close_reason(&conn, p).await),
        ok => ok,
    };
    // Whatever happened, keep what is durably written for a rerun.
    let placed = tokio::task::block_in_place(|| {
        let (placed, unfinished) = disk.close_all();
        if result.is_err() {
            let _ = disk.finish_dirs();
        }
        if let Some((kept, client)) = &opts.keep {
            kept.left(client, unfinished);
        }
        placed
    });
    core.placed_late(placed);
    core.set_held_back(held.lock().unwrap().total());
    let (ahead, most) = core.ahead_of_manifest();
    tracing::debug!(
        "{ahead} record(s) came before their manifest entry, at most {} at once",
        longhaul_transfer::units::show_size(most)
    );
    let mut report = core.take_report();
    if let (Ok(()), true, Some(sh)) = (&result, report.problems.is_empty(), &opts.finish_plan) {
        if let Err(e) = disk.remove_plan(sh) {
            tracing::warn!("the shards' plan stays: {e}");
        }
    }
    report.repair_bytes = repair.bytes.load(Ordering::Relaxed);
    report.rebuilt_streams = repair.rebuilt.load(Ordering::Relaxed);
    report.tail_s = repair.tail();
    (report, result)
}

/// A session's tail repair, as the receiver saw it.
#[derive(Debug, Default)]
struct RepairCounts {
    /// Bytes of repair datagrams that came.
    bytes: AtomicU64,
    /// Protected streams rebuilt from them.
    rebuilt: AtomicU64,
    /// When bytes past everything a protected stream held last came (new
    /// data, not a retransmission), and when one was last complete.
    times: Mutex<(Option<Instant>, Option<Instant>)>,
}

impl RepairCounts {
    /// From the last new data of the protected streams until the last of
    /// them was whole: the round trips the tail cost.
    fn tail(&self) -> Option<f64> {
        match *self.times.lock().unwrap() {
            (Some(new), Some(whole)) => Some(whole.saturating_duration_since(new).as_secs_f64()),
            _ => None,
        }
    }
}

/// Repair symbols that came before their stream was accepted wait, at
/// most this many per connection (an honest sender's come at most a
/// congestion window early: its datagrams go ahead of queued stream data).
const EARLY_SYMBOLS: usize = 16_384;
/// Symbols waiting for an open stream's reader at most: a block takes at
/// most K + K / 4 symbols (about 330 repair symbols in 1.5 MiB).
const OPEN_SYMBOLS: usize = 512;

/// Where one connection's repair datagrams go: to the task of the
/// protected stream they name, or to wait for it.
#[derive(Default)]
struct Board {
    slots: HashMap<u64, Slot>,
    early: usize,
}

enum Slot {
    Early(Vec<Repair>),
    Open(mpsc::Sender<Repair>),
    /// The stream is done with: its symbols are dropped.
    Closed,
}

type SharedBoard = Arc<Mutex<Board>>;

impl Board {
    /// Hands `r` to its stream's reader, or keeps it for the stream (true:
    /// kept, for a stream not read yet).
    fn deliver(&mut self, r: Repair) -> bool {
        match self.slots.get_mut(&r.stream) {
            Some(Slot::Open(tx)) => {
                // (Full: the reader is behind; a symbol is as droppable as
                // the datagram it came in.)
                let _ = tx.try_send(r);
                false
            }
            Some(Slot::Closed) => false,
            Some(Slot::Early(v)) if self.early < EARLY_SYMBOLS => {
                v.push(r);
                self.early += 1;
                true
            }
            None if self.early < EARLY_SYMBOLS => {
                self.early += 1;
                self.slots.insert(r.stream, Slot::Early(vec![r]));
                true
            }
            _ => false,
        }
    }

    /// Symbols came for `stream`, which is not read yet.
    fn has_early(&self, stream: u64) -> bool {
        matches!(self.slots.get(&stream), Some(Slot::Early(_)))
    }

    /// A protected stream's symbols from now on (those that came early first).
    fn open(&mut self, stream: u64) -> mpsc::Receiver<Repair> {
        let (tx, rx) = mpsc::channel(OPEN_SYMBOLS);
        if let Some(Slot::Early(v)) = self.slots.remove(&stream) {
            self.early -= v.len();
            for r in v {
                let _ = tx.try_send(r);
            }
        }
        self.slots.insert(stream, Slot::Open(tx));
        rx
    }

    fn close(&mut self, stream: u64) {
        self.slots.insert(stream, Slot::Closed);
    }
}

/// What a connection's acceptor needs: every data stream it accepts gets a
/// task that reads its records for the driver.
#[derive(Clone)]
struct Accept {
    tx: mpsc::Sender<Input>,
    heard: Heard,
    gate: Arc<Semaphore>,
    held: Held,
    progress: Arc<Progress>,
    /// Numbers the streams of every connection of the session.
    next: Arc<std::sync::atomic::AtomicU64>,
    repair: Arc<RepairCounts>,
    /// Bytes the session's protected streams hold ([`PROTECTED_HELD`]).
    protected: Arc<AtomicU64>,
}

impl Accept {
    /// Accepts `conn`'s data streams until it is gone.
    async fn on(self, conn: quinn::Connection) {
        let Accept {
            tx,
            heard,
            gate,
            held,
            progress,
            next,
            repair,
            protected,
        } = self;
        let mut tasks = tokio::task::JoinSet::new();
        let board: SharedBoard = Default::default();
        let early: Arc<tokio::sync::Notify> = Default::default();
        {
            let (conn, board, repair) = (conn.clone(), board.clone(), repair.clone());
            let early = early.clone();
            tasks.spawn(async move {
                while let Ok(d) = conn.read_datagram().await {
                    let n = d.len() as u64;
                    match Repair::decode(d) {
                        Ok(r) => {
                            repair.bytes.fetch_add(n, Ordering::Relaxed);
                            if board.lock().unwrap().deliver(r) {
                                early.notify_waiters();
                            }
                        }
                        Err(e) => tracing::debug!("datagram dropped: {e}"),
                    }
                }
            });
        }
        while let Ok(s) = conn.accept_uni().await {
            progress.first_data.get_or_init(std::time::Instant::now);
            while tasks.try_join_next().is_some() {}
            let id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let (ready, wait) = mpsc::channel(STREAM_RECORDS);
            if tx.send(Input::Stream { id, ready }).await.is_err() {
                break;
            }
            let (tx, heard) = (tx.clone(), heard.clone());
            let (gate, held) = (gate.clone(), held.clone());
            let repair = Repairs {
                board: board.clone(),
                counts: repair.clone(),
                held: protected.clone(),
                early: early.clone(),
            };
            tasks.spawn(async move {
                let _open = HeldBack::open(&held);
                let behind = Behind {
                    gate: &gate,
                    held: &held,
                };
                if let Err(p) = read_stream(id, s, &tx, wait, &heard, behind, repair).await {
                    let _ = tx.send(Input::Failed(p)).await;
                }
            });
        }
        // The connection is gone: let the tasks see it and end.
        while tasks.join_next().await.is_some() {}
    }
}

/// Inputs fed to a core at most before its output is acted on.
pub(crate) const BATCH: usize = 64;

/// The loop: feed the core, act on what it says, until it is done.
async fn drive(
    core: &mut RecvCore,
    disk: &Arc<RecvDisk>,
    ctl: &CtlTx,
    rx: &mut CtlRx,
    inputs: &mut mpsc::Receiver<Input>,
    tx: &mpsc::Sender<Input>,
    behind: Behind<'_>,
) -> Result<(), Problem> {
    let heard = disk.heard();
    let mut streams: HashMap<u64, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let mut control_open = true;
    // What `Done` says, if what comes next ends the session.
    let held_back = |core: &mut RecvCore| core.set_held_back(behind.held.lock().unwrap().total());
    loop {
        loop {
            let mut idle = true;
            while let Some(f) = core.poll_frame() {
                idle = false;
                if let Err(p) = ctl.send(f).await {
                    core.handle_failure(p);
                }
            }
            while let Some(Event::StreamReady { stream, spare }) = core.poll_event() {
                idle = false;
                behind.gate.add_permits(spare.len().max(1));
                if let Some(s) = streams.get(&stream) {
                    if s.try_send(spare).is_err() {
                        streams.remove(&stream); // its task has ended
                    }
                }
            }
            while let Some(job) = core.poll_job() {
                idle = false;
                run_job(core, disk, tx, behind.held, job);
            }
            if idle {
                break;
            }
        }
        if let Some(outcome) = core.outcome() {
            return outcome;
        }
        let deadline = core.poll_timeout();
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now).into()), if deadline.is_some() => {
                held_back(core);
                core.handle_timeout(Instant::now());
            }
            f = rx.recv(), if control_open => {
                heard.now();
                control_open = f.is_some();
                held_back(core);
                core.handle_control(Instant::now(), f);
            }
            i = inputs.recv() => {
                held_back(core);
                // What else is there already goes in before the core's
                // frames go out: fewer, fuller control packets.
                let mut next = i;
                for n in 0..BATCH {
                    match next.expect("the driver holds a sender") {
                        Input::Stream { id, ready } => {
                            streams.insert(id, ready);
                        }
                        Input::Record(r) => core.handle_record(Instant::now(), r),
                        Input::Failed(p) => core.handle_failure(p),
                        Input::Done(d) => core.handle_done(Instant::now(), d),
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

/// Run a job here (light, or the manifest lane's, which runs in order) or
/// on the blocking pool. A job run here that took longer than
/// [`SLOW_INLINE`] counts as time behind (see [`HeldBack::blocked`]).
fn run_job(
    core: &mut RecvCore,
    disk: &Arc<RecvDisk>,
    tx: &mpsc::Sender<Input>,
    held: &Held,
    job: Job,
) {
    let light = disk.is_light(&job);
    if light || job.is_manifest() {
        let start = Instant::now();
        let done = if light {
            disk.run(job)
        } else {
            tokio::task::block_in_place(|| disk.run(job))
        };
        let now = Instant::now();
        let took = now.saturating_duration_since(start);
        // (Only a slow one takes the lock: this is every small file's path.)
        if took > SLOW_INLINE {
            held.lock().unwrap().blocked(took);
        }
        core.handle_done(now, done);
    } else {
        let (disk, tx) = (disk.clone(), tx.clone());
        let syncs = matches!(
            job,
            Job::Checkpoint { sync: true, .. } | Job::Commit { .. } | Job::SyncFs
        );
        tokio::task::spawn_blocking(move || {
            let done = {
                // Syncs wait for a slot of their own first: slow ones must
                // not take every place from the writes.
                let _sync = syncs.then(|| SYNC_JOBS.take());
                let _slot = DISK_JOBS.take();
                disk.run(job)
            };
            let _ = tx.blocking_send(Input::Done(done));
        });
    }
}

/// Jobs on the blocking pool that run at once, in all sessions of the
/// process: the pool starts a thread per queued job (up to 512), and a burst
/// of files finishing together would open a part and a journal each at once.
static DISK_JOBS: longhaul_transfer::place::Slots = longhaul_transfer::place::Slots::new(32);

/// Of them, jobs that sync (checkpoints, commits, the destination's
/// syncfs): an fdatasync may take seconds on a busy disk.
static SYNC_JOBS: longhaul_transfer::place::Slots = longhaul_transfer::place::Slots::new(8);

/// When every open data stream waits for the receiver, and for how long in
/// all: the time the receiver read nothing because it was behind, so that
/// it, not the network, set the pace. (Counting the time any one stream
/// waited read 95 % of every fast transfer into a tmpfs: a stream waits for
/// its 1 MiB record's buffer back while the others read.)
#[derive(Debug, Default)]
struct HeldBack {
    open: usize,
    waiting: usize,
    since: Option<Instant>,
    total: std::time::Duration,
}

type Held = Arc<std::sync::Mutex<HeldBack>>;

/// A job the driver runs itself takes microseconds (a small file's write
/// into the page cache); past this, the disk made it wait.
const SLOW_INLINE: std::time::Duration = std::time::Duration::from_millis(1);

impl HeldBack {
    /// The time so far (a wait under way counts to now).
    fn total(&self) -> std::time::Duration {
        self.total + self.since.map_or(Default::default(), |t| t.elapsed())
    }

    /// The driver ran a job itself for `took` (a small file's write, or
    /// the manifest lane's): no stream was read meanwhile. What it took
    /// over [`SLOW_INLINE`] was the destination's, while a data stream is
    /// open (with none, the network had nothing to send: the directories
    /// and the last sync of an empty put took 1 ms and read as behind), and
    /// unless every stream already waited (that time is counted). A slow
    /// disk's small writes held the whole receiver and counted nothing: a
    /// put of 200 files of 10 kB to a server whose writes took 40 ms each
    /// read 0.004 s behind of 8.2.
    fn blocked(&mut self, took: std::time::Duration) {
        if self.open > 0 && self.since.is_none() {
            self.total += took.saturating_sub(SLOW_INLINE);
        }
    }

    /// The clock runs while every open stream waits.
    fn update(&mut self, now: Instant) {
        let behind = self.open > 0 && self.waiting >= self.open;
        match (behind, self.since) {
            (true, None) => self.since = Some(now),
            (false, Some(t)) => {
                self.total += now.saturating_duration_since(t);
                self.since = None;
            }
            _ => {}
        }
    }

    /// A data stream is read until the returned guard is dropped.
    fn open(held: &Held) -> Guard<'_> {
        Guard::new(held, |h| &mut h.open)
    }

    /// A stream waits until the returned guard is dropped.
    fn start(held: &Held) -> Guard<'_> {
        Guard::new(held, |h| &mut h.waiting)
    }
}

/// An open stream ([`HeldBack::open`]) or a wait ([`HeldBack::start`]),
/// counted while it lives.
struct Guard<'a> {
    held: &'a Held,
    count: fn(&mut HeldBack) -> &mut usize,
}

impl<'a> Guard<'a> {
    fn new(held: &'a Held, count: fn(&mut HeldBack) -> &mut usize) -> Guard<'a> {
        let mut h = held.lock().unwrap();
        *count(&mut h) += 1;
        h.update(Instant::now());
        Guard { held, count }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap();
        *(self.count)(&mut h) -= 1;
        h.update(Instant::now());
    }
}

/// What a stream reader waits on when the receiver is behind.
#[derive(Clone, Copy)]
struct Behind<'a> {
    gate: &'a Semaphore,
    held: &'a Held,
}

/// Record bytes in the core's hands at most, all streams together (waiting
/// for their entry, or for their write): past it the streams stop reading.
/// It equals the core's bound on records waiting for entries
/// ([`MAX_WAITING`]), which an honest sender therefore never reaches: a
/// manifest behind the data (a slow disk creating directories) used to end
/// the session with a protocol error once 64 MiB waited.
const IN_HAND: u64 = MAX_WAITING;

/// Records of one stream in the core's hands at most (and at most
/// [`STREAM_BYTES`] of them, but always one): small files go to the core
/// several at a time, without a round trip between the tasks per file; a
/// large chunk goes alone, as before.
const STREAM_RECORDS: usize = 64;
const STREAM_BYTES: u64 = 256 << 10;

/// Read records off one data stream: each goes to the core, and reading
/// waits while the core holds [`STREAM_RECORDS`] or [`STREAM_BYTES`] of
/// them (until it hands buffers back).
async fn read_stream(
    id: u64,
    mut rs: quinn::RecvStream,
    tx: &mpsc::Sender<Input>,
    mut ready: mpsc::Receiver<Vec<u8>>,
    heard: &Heard,
    behind: Behind<'_>,
    repairs: Repairs,
) -> Result<(), Problem> {
    // The prelude, read in order; but a stream whose repair symbols come
    // first (its first packet lost, or still on its way) is a protected
    // one, read out of order from its start, prelude and all.
    let stream = u64::from(rs.id());
    let mut pre: Vec<u8> = Vec::with_capacity(DATA_PRELUDE.len());
    let early = loop {
        let wake = repairs.early.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        if repairs.board.lock().unwrap().has_early(stream) {
            break true;
        }
        tokio::select! {
            c = rs.read_chunk(DATA_PRELUDE.len() - pre.len(), true) => match c {
                Ok(Some(c)) => {
                    heard.now();
                    pre.extend_from_slice(&c.bytes);
                    if pre.len() == DATA_PRELUDE.len() {
                        break false;
                    }
                }
                Ok(None) if pre.is_empty() => return Ok(()),
                Ok(None) => return Err(protocol(ProtoError::Truncated.to_string())),
                Err(e) => return Err(stream_lost(&e)),
            },
            _ = &mut wake => {}
        }
    };
    let mut rs = if early || pre == REPAIRED_PRELUDE {
        let mut r = Incoming::Repaired(Box::new(Repaired::new(rs, &pre, repairs)));
        let mut p = [0u8; 4];
        if !r.read_exact_or_eof(&mut p, heard).await? {
            return Ok(());
        }
        if &p != REPAIRED_PRELUDE {
            return Err(protocol(ProtoError::BadPrelude.to_string()));
        }
        r
    } else if pre == DATA_PRELUDE {
        Incoming::Plain(rs)
    } else {
        return Err(protocol(ProtoError::BadPrelude.to_string()));
    };
    let mut spares: Vec<Vec<u8>> = Vec::new();
    let (mut held, mut held_bytes) = (0usize, 0u64);
    loop {
        // Buffers the core is done with; wait for some while it holds too much.
        loop {
            let buf = if held >= STREAM_RECORDS || held_bytes >= STREAM_BYTES {
                let _waiting = HeldBack::start(behind.held);
                match ready.recv().await {
                    Some(b) => b,
                    None => return Ok(()),
                }
            } else {
                match ready.try_recv() {
                    Ok(b) => b,
                    Err(_) => break,
                }
            };
            held -= 1;
            held_bytes -= (buf.len() as u64).max(1);
            spares.push(buf);
        }
        let mut hdr = [0u8; RECORD_HEADER_LEN];
        if !rs.read_exact_or_eof(&mut hdr, heard).await? {
            return Ok(());
        }
        let header = RecordHeader::decode(&hdr).map_err(|e| protocol(e.to_string()))?;
        // Room in the session's hands first: a receiver slower than the
        // network (its disk, or a manifest behind the data) stops reading,
        // and QUIC's flow control holds the sender.
        let carried = header.data_len();
        let room = match behind.gate.try_acquire_many(carried.max(1)) {
            Ok(p) => Ok(p),
            Err(_) => {
                let _waiting = HeldBack::start(behind.held);
                behind.gate.acquire_many(carried.max(1)).await
            }
        };
        match room {
            Ok(p) => p.forget(),
            Err(_) => return Ok(()), // closed: the session is over
        }
        // One contiguous buffer per record: BLAKE3 hashes it with its widest SIMD
        // path and the file sees one write, not one per QUIC frame.
        // The buffer is reused record after record: no allocation or page faults.
        let mut data = spares.pop().unwrap_or_default();
        data.clear();
        data.reserve(carried as usize);
        while data.len() < carried as usize {
            match rs.read_chunk(carried as usize - data.len(), heard).await? {
                Some(c) => data.extend_from_slice(&c),
                None => return Err(protocol(ProtoError::Truncated.to_string())),
            }
        }
        let trailer = if header.has_trailer() {
            let mut hash = [0u8; RECORD_HASH_LEN];
            if !rs.read_exact_or_eof(&mut hash, heard).await? {
                return Err(protocol(ProtoError::Truncated.to_string()));
            }
            Some(hash)
        } else {
            None
        };
        let record = Record {
            stream: id,
            header,
            data,
            hash: trailer.filter(|_| header.hash),
            zero_digest: trailer.filter(|_| header.zeros),
        };
        let len = (record.data.len() as u64).max(1);
        if tx.send(Input::Record(record)).await.is_err() {
            return Ok(()); // the session is over
        }
        held += 1;
        held_bytes += len;
    }
}

/// A connection's repair datagrams, for its stream tasks.
struct Repairs {
    board: SharedBoard,
    counts: Arc<RepairCounts>,
    /// Bytes the session's protected streams hold ([`Block::footprint`]).
    held: Arc<AtomicU64>,
    /// Woken when symbols come for a stream not read yet.
    early: Arc<tokio::sync::Notify>,
}

/// The most a session's protected streams may hold at once, every
/// connection together ([`Block::footprint`]: the bytes that came, never
/// their holes, and a little for each piece). Their data is read out of
/// order, and QUIC gives its flow-control credit back as it is read: this
/// bound, not the receive windows, limits what a sender can make them keep.
/// An honest one protects at most 256 MiB (and each stream is read as it
/// comes).
const PROTECTED_HELD: u64 = 512 << 20;

/// A data stream as its records are read: in order from quinn, or (a
/// protected stream) rebuilt in a [`Block`] from what quinn hands over in
/// any order and the stream's repair symbols.
enum Incoming {
    Plain(quinn::RecvStream),
    Repaired(Box<Repaired>),
}

impl Incoming {
    /// Fill `buf`; false at the stream's end before any of it.
    async fn read_exact_or_eof(&mut self, buf: &mut [u8], heard: &Heard) -> Result<bool, Problem> {
        let mut got = 0;
        while got < buf.len() {
            match self.read_chunk(buf.len() - got, heard).await? {
                Some(c) => {
                    buf[got..got + c.len()].copy_from_slice(&c);
                    got += c.len();
                }
                None if got == 0 => return Ok(false),
                None => return Err(protocol(ProtoError::Truncated.to_string())),
            }
        }
        Ok(true)
    }

    /// The next bytes, at most `max`; None at the stream's end.
    async fn read_chunk(
        &mut self,
        max: usize,
        heard: &Heard,
    ) -> Result<Option<bytes::Bytes>, Problem> {
        match self {
            Incoming::Plain(rs) => match rs.read_chunk(max, true).await {
                Ok(Some(c)) => {
                    heard.now();
                    Ok(Some(c.bytes))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(stream_lost(&e)),
            },
            Incoming::Repaired(r) => r.next(max, heard).await,
        }
    }
}

/// How long a protected stream's reader waits for more before it tries a
/// rebuild with what it has.
const QUIET: std::time::Duration = std::time::Duration::from_millis(5);

/// A protected stream being read.
struct Repaired {
    rs: quinn::RecvStream,
    block: Block,
    symbols: mpsc::Receiver<Repair>,
    stream: u64,
    repairs: Repairs,
    /// Bytes handed to the record reader, from the stream's start.
    at: u64,
    /// Something came since the last try after a quiet spell.
    quiet_armed: bool,
    /// What this stream's block is counted for in [`Repairs::held`].
    charged: u64,
    /// quinn has nothing more: the stream ended whole, or it was rebuilt
    /// and stopped.
    quinn_done: bool,
}

impl Repaired {
    /// `start`: the stream's first bytes, read in order (its prelude or
    /// part of it); the reader starts at the stream's start.
    fn new(rs: quinn::RecvStream, start: &[u8], repairs: Repairs) -> Repaired {
        let stream = u64::from(rs.id());
        let symbols = repairs.board.lock().unwrap().open(stream);
        let mut block = Block::default();
        block.insert(0, start).expect("the prelude fits any block");
        Repaired {
            rs,
            block,
            symbols,
            stream,
            repairs,
            at: 0,
            quiet_armed: false,
            charged: 0,
            quinn_done: false,
        }
    }

    async fn next(&mut self, max: usize, heard: &Heard) -> Result<Option<bytes::Bytes>, Problem> {
        loop {
            let end = self.block.contiguous();
            if end > self.at {
                let b = bytes::Bytes::copy_from_slice(self.block.chunk(self.at, max));
                self.at += b.len() as u64;
                return Ok(Some(b));
            }
            // The end: every byte read, and QUIC's end of the stream seen
            // (its length checked against the symbols') or the block rebuilt.
            if self.block.len() == Some(self.at) && self.block.complete() && self.quinn_done {
                return Ok(None);
            }
            let whole = self.block.complete();
            if !whole && tracing::enabled!(tracing::Level::TRACE) {
                let (symbols, holes) = self.block.shortfall();
                tracing::trace!(
                    "protected stream {}: waits at {} of {:?} bytes ({} held), {holes} symbols missing, {symbols} repair symbols",
                    self.stream,
                    self.at,
                    self.block.len(),
                    self.block.contiguous(),
                );
            }
            // A rebuild is tried once the stream's last bytes came (what
            // is missing then was lost, not still on its way), or when
            // nothing came for QUIET (its last packet may be the lost one):
            // decoding while the data still streams in rebuilt every
            // block of a lossless transfer, at a few ms of CPU each.
            let quiet = tokio::time::sleep(QUIET);
            let can_wait = self.quiet_armed && self.block.has_symbols() && !whole;
            tokio::select! {
                c = self.rs.read_chunk(usize::MAX, false), if !self.quinn_done => match c {
                    Ok(Some(c)) => {
                        heard.now();
                        let new = c.offset + c.bytes.len() as u64 > self.block.extent();
                        self.block.insert(c.offset, &c.bytes).map_err(protocol)?;
                        if new {
                            self.repairs.counts.times.lock().unwrap().0 = Some(Instant::now());
                        }
                        self.quiet_armed = true;
                        self.charge()?;
                        if self.block.all_sent() {
                            self.rebuild(false);
                        }
                    }
                    Ok(None) => {
                        self.quinn_done = true;
                        self.block.finished().map_err(protocol)?;
                    }
                    Err(e) => return Err(stream_lost(&e)),
                },
                r = self.symbols.recv() => {
                    let r = r.expect("the board holds the sender while the stream is open");
                    self.block.add(r).map_err(protocol)?;
                    self.quiet_armed = true;
                    self.charge()?;
                    if self.block.all_sent() {
                        self.rebuild(true);
                    }
                }
                _ = quiet, if can_wait => {
                    self.quiet_armed = false;
                    self.rebuild(true);
                }
            }
            if !whole && self.block.complete() {
                self.repairs.counts.times.lock().unwrap().1 = Some(Instant::now());
            }
        }
    }

    /// Count the block's growth against the connection's bound.
    fn charge(&mut self) -> Result<(), Problem> {
        let now = self.block.footprint();
        let grew = now.saturating_sub(self.charged);
        self.charged = now.max(self.charged);
        let all = self.repairs.held.fetch_add(grew, Ordering::Relaxed) + grew;
        if all > PROTECTED_HELD {
            return Err(protocol(format!(
                "protected streams hold more than {}",
                longhaul_transfer::units::show_size(PROTECTED_HELD)
            )));
        }
        Ok(())
    }

    /// Fill the holes from the repair symbols once they suffice (a symbol
    /// or the data may come last); `recount` as [`Block::try_rebuild`].
    fn rebuild(&mut self, recount: bool) {
        // RaptorQ takes a few ms: off the runtime's worker (a get has one,
        // which also drives the connection).
        let rebuilt = tokio::task::block_in_place(|| self.block.try_rebuild(recount));
        if rebuilt {
            tracing::debug!("protected stream {} rebuilt", self.stream);
            self.repairs.counts.rebuilt.fetch_add(1, Ordering::Relaxed);
            // Nothing more is needed from QUIC: its sender may stop
            // retransmitting.
            let _ = self.rs.stop(quinn::VarInt::from_u32(0));
            self.quinn_done = true;
        }
    }
}

impl Drop for Repaired {
    fn drop(&mut self) {
        self.repairs.board.lock().unwrap().close(self.stream);
        self.repairs.held.fetch_sub(self.charged, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn behind_only_while_every_open_stream_waits() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Two streams open; one waits for its buffer back from 0 to 100 ms
        // while the other reads: not behind.
        let mut h = HeldBack {
            open: 2,
            ..Default::default()
        };
        h.update(at(0));
        h.waiting = 1;
        h.update(at(0));
        h.waiting = 0;
        h.update(at(100));
        assert_eq!(h.total(), Duration::ZERO);
        // Both wait from 100 to 130 ms: 30 ms behind.
        h.waiting = 2;
        h.update(at(100));
        h.waiting = 1;
        h.update(at(130));
        assert_eq!(h.total, Duration::from_millis(30));
        // The reading one ends at 150 ms, the other still waits: behind
        // again until it is done waiting at 170 ms.
        h.open = 1;
        h.update(at(150));
        h.waiting = 0;
        h.update(at(170));
        assert_eq!(h.total, Duration::from_millis(50));
        // No stream open: nothing to be behind on.
        h.open = 0;
        h.update(at(200));
        assert_eq!(h.since, None);
        assert_eq!(h.total, Duration::from_millis(50));
    }

    #[test]
    fn the_guards_count_streams_and_waits() {
        let held: Held = Default::default();
        let a = HeldBack::open(&held);
        let b = HeldBack::open(&held);
        let w = HeldBack::start(&held);
        assert!(held.lock().unwrap().since.is_none(), "one of two waits");
        let w2 = HeldBack::start(&held);
        assert!(held.lock().unwrap().since.is_some(), "both wait");
        drop(w);
        assert!(held.lock().unwrap().since.is_none());
        drop(a);
        assert!(held.lock().unwrap().since.is_some(), "the open one waits");
        drop(w2);
        drop(b);
        let h = held.lock().unwrap();
        assert_eq!((h.open, h.waiting, h.since), (0, 0, None));
    }
}
