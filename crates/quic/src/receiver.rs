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
use crate::core::Role;
use crate::disk::RecvDisk;
use crate::proto::{ProtoError, RecordHeader, DATA_PRELUDE, RECORD_HASH_LEN, RECORD_HEADER_LEN};
use crate::report::{Kind, Problem, Progress, SessionReport};
use cap_std::fs::Dir;
use longhaul_transfer::landing::Landing;
use longhaul_transfer::place::Heard;
use longhaul_transfer::sync::SyncMode;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, Semaphore};

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

#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvOpts {
    pub sync: SyncMode,
    /// See [`RecvConfig::fresh`].
    pub fresh: bool,
    /// Durable files ([`RecvConfig::durable`]).
    pub durable: bool,
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
        max_waiting: MAX_WAITING,
    };
    let mut core = RecvCore::new(cfg, dest.landing, progress.clone());
    // A destination in memory only (tmpfs) has no disk to wait for.
    let durable = opts.durable && !longhaul_transfer::place::in_memory_only(&dest.base);
    let disk = Arc::new(RecvDisk::new(dest.base, durable));
    let (tx, mut inputs) = mpsc::channel::<Input>(1024);
    // The stream tasks live in the acceptor's set: aborting the acceptor at
    // the end stops those still reading a stream the sender has not finished
    // yet, and with them their handles on the control stream (whose end the
    // client of a get would otherwise wait a round trip for).
    let heard = disk.heard();
    let gate = Arc::new(Semaphore::new(IN_HAND as usize));
    let held: Held = Default::default();
    let conn = conns.first.clone();
    let acceptor = {
        let accept = Accept {
            tx: tx.clone(),
            heard: heard.clone(),
            gate: gate.clone(),
            held: held.clone(),
            progress: progress.clone(),
            next: Default::default(),
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
        let placed = disk.close_all();
        if result.is_err() {
            let _ = disk.finish_dirs();
        }
        placed
    });
    core.placed_late(placed);
    core.set_held_back(held.lock().unwrap().total());
    let (ahead, most) = core.ahead_of_manifest();
    tracing::debug!(
        "{ahead} record(s) came before their manifest entry, at most {:.1} MiB at once",
        most as f64 / (1 << 20) as f64
    );
    (core.take_report(), result)
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
        } = self;
        let mut tasks = tokio::task::JoinSet::new();
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
            tasks.spawn(async move {
                let _open = HeldBack::open(&held);
                let behind = Behind {
                    gate: &gate,
                    held: &held,
                };
                if let Err(p) = read_stream(id, s, &tx, wait, &heard, behind).await {
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
                run_job(core, disk, tx, job);
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
/// on the blocking pool.
fn run_job(core: &mut RecvCore, disk: &Arc<RecvDisk>, tx: &mpsc::Sender<Input>, job: Job) {
    if disk.is_light(&job) {
        let done = disk.run(job);
        core.handle_done(Instant::now(), done);
    } else if job.is_manifest() {
        let done = tokio::task::block_in_place(|| disk.run(job));
        core.handle_done(Instant::now(), done);
    } else {
        let (disk, tx) = (disk.clone(), tx.clone());
        tokio::task::spawn_blocking(move || {
            let _ = tx.blocking_send(Input::Done(disk.run(job)));
        });
    }
}

async fn read_exact_or_eof(rs: &mut quinn::RecvStream, buf: &mut [u8]) -> Result<bool, Problem> {
    let mut got = 0;
    while got < buf.len() {
        match rs.read(&mut buf[got..]).await {
            Ok(Some(n)) => got += n,
            Ok(None) if got == 0 => return Ok(false),
            Ok(None) => return Err(protocol(ProtoError::Truncated.to_string())),
            Err(e) => return Err(stream_lost(&e)),
        }
    }
    Ok(true)
}

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

impl HeldBack {
    /// The time so far (a wait under way counts to now).
    fn total(&self) -> std::time::Duration {
        self.total + self.since.map_or(Default::default(), |t| t.elapsed())
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
) -> Result<(), Problem> {
    let mut pre = [0u8; 4];
    if !read_exact_or_eof(&mut rs, &mut pre).await? {
        return Ok(());
    }
    if &pre != DATA_PRELUDE {
        return Err(protocol(ProtoError::BadPrelude.to_string()));
    }
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
        if !read_exact_or_eof(&mut rs, &mut hdr).await? {
            return Ok(());
        }
        let header = RecordHeader::decode(&hdr).map_err(|e| protocol(e.to_string()))?;
        // Room in the session's hands first: a receiver slower than the
        // network (its disk, or a manifest behind the data) stops reading,
        // and QUIC's flow control holds the sender.
        let room = match behind.gate.try_acquire_many(header.len.max(1)) {
            Ok(p) => Ok(p),
            Err(_) => {
                let _waiting = HeldBack::start(behind.held);
                behind.gate.acquire_many(header.len.max(1)).await
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
        data.reserve(header.len as usize);
        while data.len() < header.len as usize {
            match rs.read_chunk(header.len as usize - data.len(), true).await {
                Ok(Some(c)) => {
                    heard.now();
                    data.extend_from_slice(&c.bytes)
                }
                Ok(None) => return Err(protocol(ProtoError::Truncated.to_string())),
                Err(e) => return Err(stream_lost(&e)),
            }
        }
        let hash = if header.hash {
            let mut hash = [0u8; RECORD_HASH_LEN];
            if !read_exact_or_eof(&mut rs, &mut hash).await? {
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
            hash,
        };
        let len = (record.data.len() as u64).max(1);
        if tx.send(Input::Record(record)).await.is_err() {
            return Ok(()); // the session is over
        }
        held += 1;
        held_bytes += len;
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
