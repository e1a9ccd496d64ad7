//! The sending role's protocol as a sans-IO state machine.
//!
//! In: what the tree walk found ([`SendCore::handle_walked`]), control frames
//! from the receiver ([`SendCore::handle_frame`]), lanes that wrote a record
//! ([`SendCore::handle_written`]), finished reads ([`SendCore::handle_done`]) and
//! the time. Out: frames ([`SendCore::poll_frame`]), read jobs
//! ([`SendCore::poll_job`]), records to put on a lane's stream
//! ([`SendCore::poll_transmit`]) and the session's end
//! ([`SendCore::state`]).
//!
//! A lane is one data stream at a time, driven by the driver. The manifest
//! goes out as the tree is walked; each wanted file (every file, unasked, in
//! a fresh session) becomes one entry in a work queue that hands its chunks
//! to lanes with room one at a time, so small files pack back to back on each
//! stream and a big file's chunks spread over all of them. Every chunk is
//! hashed as it is read; a file's BLAKE3 follows its only record, or its
//! last chunk in `FileDone`.
//!
//! `S` is the driver's handle on a source file; the core only hands it back
//! in jobs.

use super::repair::PROTECT_BYTES;
use super::{Role, State};
use crate::proto::{Frame, Outcome, RecordHeader, Want, RECORD_HASH_LEN, RECORD_HEADER_LEN};
use crate::report::{FileReport, Kind, Problem, Progress, SessionReport, Status};
use bytes::Bytes;
use longhaul_transfer::chunk::{hex, Digest};
use longhaul_transfer::{ChunkPlan, Entry, EntryKind};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most record bytes a data stream carries before the sender finishes it and
/// opens the next (but on a slow link, [`stream_bytes`]). A QUIC receiver
/// buffers out-of-order data per stream and quinn aborts the connection
/// ("too many gaps in stream buffer") when one stream holds more than about
/// a thousand separate ranges; a long fat path whose queue overflows can
/// drop every other packet of a stream with thousands in flight. At 1 MiB
/// (under a thousand packets) a stream cannot reach that, and the
/// connection's window still fills the path: finished streams stay in
/// flight until acknowledged.
pub(crate) const STREAM_BYTES: u64 = 1 << 20;

/// A congestion window this small puts at most about 90 datagrams of 1,452
/// bytes (110 of 1,200) on the wire a round trip. A thousand gaps in one
/// stream take every other datagram of about 2,000 of that stream lost and
/// none repaired: twenty such round trips. So while it stays this small a
/// stream may be long ([`stream_bytes`]).
pub(crate) const SMALL_WINDOW: u64 = 128 << 10;

/// Streams are long only once this much has been sent while the window
/// stayed at most [`SMALL_WINDOW`]: at least four round trips of such
/// windows, each timed by ACKs. A fast path's window is small too until its
/// first ACKs (its first flight and train, under 128 KiB), and a sender that
/// waits (for the receiver's answers, or hashing files to compare) sends
/// nothing, so neither counts; then the window grows a thousandfold in a
/// round trip.
pub(crate) const SMALL_SENT: u64 = 4 * SMALL_WINDOW;

/// Most record bytes a stream carries while streams are long. Every stream
/// past a side's sixteenth has an ID of two bytes in each STREAM frame (a
/// QUIC varint holds 0-63 in one byte, and a side's unidirectional streams
/// are 4n + 2 or 4n + 3), and one byte of 1,500 is 0.07 % of a slow link's
/// time: 0.46 s of 100 files of 1 MB at 1 Mbit/s. Offsets stay under 2^30
/// (4-byte varints; 8 bytes past it).
pub(crate) const LONG_STREAM_BYTES: u64 = 256 << 20;

/// The path as the driver reads it ([`SendCore::set_path`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PathView {
    /// The congestion window, bytes.
    pub cwnd: u64,
    /// Bytes the connection has sent so far (it only grows).
    pub sent: u64,
    /// The most a lane's stream may hold written and not yet acknowledged:
    /// the send window over the lanes (`u64::MAX` when the lanes are spread
    /// over several connections, whose windows the driver does not read).
    pub lane_backlog: u64,
}

/// The most record bytes a stream may carry: [`LONG_STREAM_BYTES`] once
/// [`SMALL_SENT`] went out since `small_from` (the bytes sent when the
/// window was last read at most [`SMALL_WINDOW`] after a larger one, with
/// each lane's share of the send window at most [`STREAM_BYTES`]), else
/// [`STREAM_BYTES`]. A long stream is finished at the first record handed
/// to its lane after the window was read above [`SMALL_WINDOW`]; what it
/// holds then, written and not acknowledged, is within the send window:
/// about its lane's share (at most 1 MiB) while every lane is busy, as in a
/// bulk transfer, and up to all of it (4 MiB) when the others are idle.
pub(crate) fn stream_bytes(small_from: Option<u64>, sent: u64) -> u64 {
    if small_from.is_some_and(|from| sent.saturating_sub(from) >= SMALL_SENT) {
        LONG_STREAM_BYTES
    } else {
        STREAM_BYTES
    }
}

/// How a sending session runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendConfig {
    /// Send every file whole at once, unasked (a get's `Hello.fresh`, a
    /// put's `Welcome.fresh`).
    pub fresh: bool,
    /// Cap on the sending rate (bits/s), 0 = none: each record gets a
    /// departure time, so the average holds at any RTT.
    pub max_rate: u64,
    /// What the receiver makes of the FIFOs and sockets (true: it was
    /// asked to, `--specials`) and of the device nodes sent: each is
    /// counted as made or listed as not made in this side's report (a
    /// put's server never makes device nodes).
    pub peer_makes: (bool, bool),
}

/// One thing the walk of a requested root found.
#[derive(Debug)]
pub(crate) enum Walked<S> {
    /// The root could not be served.
    RootError {
        root: u32,
        code: crate::proto::ErrorCode,
        message: String,
    },
    /// An entry; `src` is set for a file. `display` names it in reports.
    Entry {
        root: u32,
        entry: Entry,
        display: String,
        src: Option<S>,
    },
    /// Part of the tree could not be read.
    Error {
        root: u32,
        path: Vec<u8>,
        message: String,
    },
    /// The walk is over.
    End,
}

/// File-system work for the driver.
#[derive(Debug)]
pub(crate) enum Job<S> {
    /// Read and hash chunk `index` of file `id` for `lane`. `check`: this is
    /// the file's only chunk; after reading, make sure the source is still
    /// the file announced (its size and mtime).
    Read {
        lane: usize,
        id: u64,
        index: u64,
        src: S,
        plan: ChunkPlan,
        check: Option<i64>,
        /// The chunk goes out (else it is read and hashed only: the
        /// receiver holds it).
        send: bool,
        /// What it takes of the lane's budget while it is read (handed back
        /// in [`Done::Read`]).
        charged: u64,
    },
    /// Every chunk of `id` is read: is the source still the file announced?
    Check {
        id: u64,
        src: S,
        size: u64,
        mtime_ns: i64,
    },
    /// BLAKE3 of the whole file (for the receiver's `UnlessHash`), on `lane`.
    Compare { lane: usize, id: u64, src: S },
    /// The file is done with (sent, failed or unchanged): close it.
    Close { id: u64 },
}

/// A finished job.
#[derive(Debug)]
pub(crate) enum Done {
    Read {
        lane: usize,
        id: u64,
        index: u64,
        /// As in the job.
        send: bool,
        /// As in the job.
        charged: u64,
        /// The data (none for a chunk of zeros), its digest, and its shape.
        result: std::io::Result<(Bytes, Digest, longhaul_transfer::place::Shape)>,
    },
    Checked {
        id: u64,
        result: std::io::Result<()>,
    },
    Compared {
        lane: usize,
        id: u64,
        result: std::io::Result<Digest>,
    },
}

/// A record for a lane's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transmit {
    pub lane: usize,
    /// Finish the lane's stream and open a new one first.
    pub rotate: bool,
    pub header: RecordHeader,
    pub data: Bytes,
    /// What follows the data: the file's BLAKE3 after its only chunk, or
    /// a chunk of zeros' digest ([`RecordHeader::has_trailer`]).
    pub hash: Option<Digest>,
    /// Not before this time (`--max-rate`).
    pub not_before: Option<Instant>,
    /// On a protected stream (tail repair, [`crate::core::repair`]): the
    /// record is in the transfer's last window.
    pub protect: bool,
}

/// What the receiver asked the sender to hash a file for.
#[derive(Debug, Clone, Copy)]
enum Compare {
    /// Send it unless its BLAKE3 is this (`Want::UnlessHash`).
    Unless(Digest),
    /// Only say its BLAKE3 (`Want::HashOnly`).
    Only,
}

#[derive(Debug)]
struct OutFile<S> {
    src: S,
    display: String,
    plan: ChunkPlan,
    mtime_ns: i64,
    /// Wanted (or sent unasked, in a fresh session).
    started: bool,
    /// Chunks not yet read.
    remaining: u64,
    /// Per chunk, once the first is read.
    digests: Vec<Option<Digest>>,
    sent: u64,
    /// Bytes the receiver already held (a resumed file's chunks not wanted).
    resumed: u64,
    failed: bool,
    /// What the receiver asked to compare (`UnlessHash`, `HashOnly`),
    /// until the file is hashed.
    compare: Option<Compare>,
    /// A read found it sparse: its chunks are charged [`HOLE_CHARGE`]
    /// while read.
    sparse: bool,
    /// Its entry as announced (sent again, under a new id, if the file
    /// changes while it is sent).
    entry: Entry,
    /// It is the second try of a file that changed while it was sent.
    again: bool,
    /// Only chunks `first..end` are read (`Want::Slice`): its `FileDone`
    /// says their slice digest.
    slice: Option<(u64, u64)>,
}

impl<S> OutFile<S> {
    /// A file announced as `entry` (`again`: its second try), not yet
    /// wanted.
    fn new(src: S, display: String, entry: &Entry, again: bool) -> OutFile<S> {
        OutFile {
            src,
            display,
            plan: ChunkPlan::new(entry.size),
            mtime_ns: entry.mtime_ns,
            started: false,
            remaining: 0,
            digests: Vec::new(),
            sent: 0,
            resumed: 0,
            failed: false,
            compare: None,
            sparse: false,
            entry: entry.clone(),
            again,
            slice: None,
        }
    }
}

impl<S> OutFile<S> {
    /// Once every chunk wanted is read: the file's BLAKE3, or for a slice
    /// its slice digest.
    fn final_hash(&self) -> Digest {
        let (first, end) = self.slice.unwrap_or((0, self.plan.count()));
        let d: Vec<Digest> = self.digests[first as usize..end as usize]
            .iter()
            .map(|d| d.expect("every chunk of it was read"))
            .collect();
        match self.slice {
            Some(_) => self.plan.slice_digest(first, &d),
            None => self.plan.root(&d),
        }
    }
}

/// The source file changed while it was sent: its size and mtime now (the
/// error a read or a check gives; the file is tried once more).
#[derive(Debug)]
pub(crate) struct Changed {
    pub size: u64,
    pub mtime_ns: i64,
}

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the file changed while being sent")
    }
}

impl std::error::Error for Changed {}

/// A wanted file in the queue: its chunks `next..`, handed out one at a
/// time (the queue holds one entry per file, not per chunk: a client that
/// asked for 30 files of 1 TiB made a server queue 30 million jobs before
/// any data moved). `send`: which go out (the others are read and hashed
/// only); None: all.
#[derive(Debug)]
enum Work {
    Chunks {
        id: u64,
        next: u64,
        /// One past the last chunk handed out.
        end: u64,
        send: Option<Arc<Vec<bool>>>,
    },
    Compare {
        id: u64,
    },
}

#[derive(Debug, Default)]
struct Lane {
    /// Bytes the current stream carried.
    carried: u64,
    /// The current stream is protected (tail repair).
    protected: bool,
    /// Bytes being read for it or handed to it and not yet written
    /// ([`LANE_BYTES`]).
    pending: u64,
}

/// How many bytes a lane may have being read or waiting to be written: a
/// lane holds several small records at once (no round trip through the
/// driver per 10 kB file) but one large chunk at a time.
pub(crate) const LANE_BYTES: u64 = 256 << 10;

/// The bytes all lanes together may have in hand (being read, or waiting
/// for room on their stream) for a send window of `window` bytes: a
/// quarter of it, but always room for one record (work is handed out while
/// the lanes hold less than this, so they may hold up to one record more).
/// A session whose peer stopped acknowledging holds its full window in
/// QUIC's buffer plus what its lanes hold outside it: four 1 MiB chunks
/// each, for 64 such sessions of a server, were as much again as their
/// shared send buffer.
/// What a chunk of a sparse file takes of the lanes' budget while it is
/// read: a hole sends nothing, so with a 1 MiB budget (a new connection's)
/// 16 are read and hashed at once, not one (0.17 ms of BLAKE3 each: a
/// 4 GiB hole took 1.05 s one at a time, on loopback).
pub(crate) const HOLE_CHARGE: u64 = 64 << 10;

pub(crate) fn in_hand_limit(window: u64) -> u64 {
    window / 4
}

/// The sending role's state machine.
pub(crate) struct SendCore<S> {
    cfg: SendConfig,
    progress: Arc<Progress>,
    next_id: u64,
    files: HashMap<u64, OutFile<S>>,
    queue: VecDeque<Work>,
    lanes: Vec<Lane>,
    /// What all lanes together may have in hand ([`in_hand_limit`]); the
    /// first record is always handed out.
    in_hand: u64,
    /// `--max-rate`: when the next record may leave.
    next_departure: Option<Instant>,
    /// The walk is over: every file is known.
    walked: bool,
    /// The records of the transfer's last this many bytes go on protected
    /// streams ([`Self::set_tail`]).
    tail: u64,
    /// What a stream carries before it is finished ([`Self::set_path`]).
    stream_bytes: u64,
    /// The bytes sent when the window was first read small, at most
    /// [`SMALL_WINDOW`] (and each lane's share of the send window at most
    /// [`STREAM_BYTES`]), and has been since.
    small_from: Option<u64>,
    /// Records go on protected streams from now on (a window that shrinks
    /// again does not turn protection off and on, rotating every lane).
    protecting: bool,
    frames: VecDeque<Frame>,
    jobs: VecDeque<Job<S>>,
    transmits: VecDeque<Transmit>,
    report: SessionReport,
    state: State,
}

fn protocol(msg: impl Into<String>) -> Problem {
    Problem::new(
        Kind::Connection,
        format!("protocol error from the receiver: {}", msg.into()),
    )
}

impl<S: Clone> SendCore<S> {
    pub(crate) fn new(cfg: SendConfig, lanes: usize, progress: Arc<Progress>) -> SendCore<S> {
        SendCore {
            cfg,
            progress,
            next_id: 0,
            files: HashMap::new(),
            queue: VecDeque::new(),
            lanes: (0..lanes.max(1)).map(|_| Lane::default()).collect(),
            in_hand: u64::MAX,
            next_departure: None,
            walked: false,
            tail: 0,
            stream_bytes: STREAM_BYTES,
            small_from: None,
            protecting: false,
            frames: VecDeque::new(),
            jobs: VecDeque::new(),
            transmits: VecDeque::new(),
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
                .filter(|f| f.started)
                .map(|f| super::recv::unsettled(&f.display, f.plan.size, f.sent, f.resumed))
                .collect();
        }
        std::mem::take(&mut self.report)
    }

    pub(crate) fn poll_frame(&mut self) -> Option<Frame> {
        self.frames.pop_front()
    }

    pub(crate) fn poll_job(&mut self) -> Option<Job<S>> {
        self.jobs.pop_front()
    }

    /// Files in the work queue (one entry each, however many chunks).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    fn running(&self) -> bool {
        self.state == State::Running
    }

    fn fail(&mut self, p: Problem) {
        if self.running() {
            self.jobs.clear();
            self.transmits.clear();
            self.state = State::Failed(p);
        }
    }

    pub(crate) fn handle_walked(&mut self, now: Instant, w: Walked<S>) {
        if !self.running() {
            return;
        }
        match w {
            Walked::RootError {
                root,
                code,
                message,
            } => self.frames.push_back(Frame::RootError {
                root,
                code,
                message,
            }),
            Walked::Error {
                root,
                path,
                message,
            } => self.frames.push_back(Frame::EntryError {
                root,
                path,
                message,
            }),
            Walked::End => {
                self.walked = true;
                self.frames.push_back(Frame::ManifestEnd)
            }
            Walked::Entry {
                root,
                mut entry,
                display,
                src,
            } => {
                self.next_id += 1;
                let id = self.next_id;
                entry.id = id;
                entry.root = root;
                match entry.kind {
                    EntryKind::Dir => self.report.dirs += 1,
                    EntryKind::Symlink => self.report.symlinks += 1,
                    EntryKind::File => {}
                    EntryKind::HardLink => self.report.hardlinks += 1,
                    k => {
                        let made = match k.is_device() {
                            true => self.cfg.peer_makes.1,
                            false => self.cfg.peer_makes.0,
                        };
                        if made {
                            self.report.specials += 1;
                        } else {
                            self.report.not_made.push(crate::report::NotMade {
                                path: display.clone(),
                                kind: k.name(),
                                why: match k.is_device() {
                                    true => "a server does not make device nodes".into(),
                                    false => super::recv::not_asked(k).into(),
                                },
                            });
                        }
                    }
                }
                let file = (entry.kind == EntryKind::File).then_some(()).and(src);
                if let Some(src) = &file {
                    self.files
                        .insert(id, OutFile::new(src.clone(), display, &entry, false));
                    Progress::add(&self.progress.files_total, 1);
                    Progress::add(&self.progress.bytes_total, entry.size);
                }
                self.frames.push_back(Frame::Entry(entry));
                // After its entry, so that an empty file's FileDone follows
                // it on the control stream; its data may still overtake it.
                if file.is_some() && self.cfg.fresh {
                    self.start(id, None, None);
                }
            }
        }
        self.assign(now);
    }

    /// A file is wanted: queue its chunks (`send`: which go out; `slice`:
    /// only chunks `first..end` are read).
    fn start(&mut self, id: u64, send: Option<Vec<bool>>, slice: Option<(u64, u64)>) {
        let f = self.files.get_mut(&id).expect("a started file is known");
        f.started = true;
        let (first, end) = slice.unwrap_or((0, f.plan.count()));
        f.slice = slice;
        f.remaining = end - first;
        if f.plan.count() == 0 {
            let hash = f.plan.root(&[]);
            self.frames.push_back(Frame::FileDone {
                id,
                hash,
                unchanged: false,
            });
            return;
        }
        if let Some(send) = &send {
            let skipped: u64 = (first..end)
                .filter(|&i| !send[i as usize])
                .filter_map(|i| f.plan.len(i))
                .sum();
            f.resumed = skipped;
            Progress::add(&self.progress.bytes_done, skipped);
        }
        self.queue.push_back(Work::Chunks {
            id,
            next: first,
            end,
            send: send.map(Arc::new),
        });
    }

    fn on_frame(&mut self, frame: Frame) -> Result<(), Problem> {
        match frame {
            Frame::Want { id, want } => {
                let f = self
                    .files
                    .get(&id)
                    .ok_or_else(|| protocol(format!("Want for unknown file {id}")))?;
                if f.started {
                    return Err(protocol(format!(
                        "a second Want for file {id}, or one in a fresh session"
                    )));
                }
                let n = f.plan.count();
                match want {
                    Want::Skip => Ok(()),
                    Want::All => {
                        self.start(id, None, None);
                        Ok(())
                    }
                    Want::UnlessHash(hash) => {
                        let f = self.files.get_mut(&id).expect("looked up");
                        f.started = true;
                        f.compare = Some(Compare::Unless(hash));
                        self.queue.push_back(Work::Compare { id });
                        Ok(())
                    }
                    Want::HashOnly => {
                        let f = self.files.get_mut(&id).expect("looked up");
                        f.started = true;
                        f.compare = Some(Compare::Only);
                        self.queue.push_back(Work::Compare { id });
                        Ok(())
                    }
                    Want::Chunks(ranges) => {
                        let mut m = vec![false; n as usize];
                        for &(a, b) in &ranges {
                            if a > b || b > n {
                                return Err(protocol(format!(
                                    "chunk range {a}..{b} outside file {id} of {n} chunks"
                                )));
                            }
                            m[a as usize..b as usize].iter_mut().for_each(|x| *x = true);
                        }
                        self.start(id, Some(m), None);
                        Ok(())
                    }
                    Want::Slice { first, end, send } => {
                        if n < 2 || first >= end || end > n {
                            return Err(protocol(format!(
                                "slice {first}..{end} of file {id} of {n} chunks: a slice is \
                                 a non-empty chunk range of a file of several chunks"
                            )));
                        }
                        let mut m = vec![false; n as usize];
                        for &(a, b) in &send {
                            if a > b || a < first || b > end {
                                return Err(protocol(format!(
                                    "chunk range {a}..{b} outside slice {first}..{end} of file {id}"
                                )));
                            }
                            m[a as usize..b as usize].iter_mut().for_each(|x| *x = true);
                        }
                        self.start(id, Some(m), Some((first, end)));
                        Ok(())
                    }
                }
            }
            Frame::FileResult { id, outcome } => {
                let f = self
                    .files
                    .remove(&id)
                    .ok_or_else(|| protocol(format!("FileResult for unknown file {id}")))?;
                self.jobs.push_back(Job::Close { id });
                let (status, error) = match outcome {
                    Outcome::Verified => (Status::Verified, None),
                    Outcome::Skipped => (Status::Skipped, None),
                    Outcome::WouldSend => (Status::WouldSend, None),
                    Outcome::Failed { code, message } => {
                        self.report.problems.push(Problem::at(
                            Kind::of_peer(code),
                            f.display.clone(),
                            message.clone(),
                        ));
                        (Status::Failed, Some(message))
                    }
                };
                if status == Status::Skipped {
                    Progress::add(&self.progress.bytes_done, f.plan.size);
                }
                Progress::add(&self.progress.files_done, 1);
                let all = f.digests.len() as u64 == f.plan.count()
                    && f.digests.iter().all(Option::is_some);
                let blake3 = (all && status == Status::Verified).then(|| {
                    let d: Vec<Digest> = f.digests.iter().map(|d| d.unwrap()).collect();
                    hex(&f.plan.root(&d))
                });
                self.report.files.push(FileReport {
                    path: f.display,
                    size: f.plan.size,
                    status,
                    bytes_transferred: f.sent,
                    bytes_resumed: f.resumed,
                    blake3,
                    error,
                });
                Ok(())
            }
            Frame::Done { ok, behind_ms } => {
                // The receiver's time behind is this report's too: a put's
                // client says when the server's disk set the pace.
                self.report.held_back_s = behind_ms as f64 / 1000.0;
                // A receiver's problem outside its files (a directory's mode,
                // the final sync) comes only as `ok: false`: a put must not exit 0.
                if !ok && self.report.problems.is_empty() {
                    self.report.problems.push(Problem::new(
                        Kind::Remote,
                        "the receiver ended with a problem outside the files (a directory's mode or mtime, or the final sync); its log says which",
                    ));
                }
                self.state = State::Finished;
                Ok(())
            }
            Frame::Changes(changes) => {
                self.report.changes.extend(changes);
                Ok(())
            }
            Frame::Fatal { code, message } => Err(Problem::new(Kind::of_peer(code), message)),
            other => Err(protocol(format!("unexpected {other:?}"))),
        }
    }

    /// `lane` wrote a record of `bytes` bytes of data ([`Transmit::data`]).
    pub(crate) fn handle_written(&mut self, now: Instant, lane: usize, bytes: u64) {
        self.release(lane, bytes);
        self.assign(now);
    }

    fn release(&mut self, lane: usize, bytes: u64) {
        if let Some(l) = self.lanes.get_mut(lane) {
            l.pending = l.pending.saturating_sub(bytes);
        }
    }

    /// The bytes the lanes together may have in hand from now on (the send
    /// window's [`in_hand_limit`]); more room hands out more work.
    pub(crate) fn set_in_hand(&mut self, now: Instant, bytes: u64) {
        let more = bytes > self.in_hand;
        self.in_hand = bytes;
        if more {
            self.assign(now);
        }
    }

    /// The transfer's last `bytes` (about a congestion window: what is on
    /// the wire in its last round trip) go on protected streams, whose
    /// losses repair symbols replace ([`crate::core::repair`]); 0: none.
    pub(crate) fn set_tail(&mut self, bytes: u64) {
        self.tail = bytes;
    }

    /// The path now: it sets how long the next records' streams may grow
    /// ([`stream_bytes`]).
    pub(crate) fn set_path(&mut self, path: PathView) {
        if path.cwnd > SMALL_WINDOW || path.lane_backlog > STREAM_BYTES {
            self.small_from = None;
        } else if self.small_from.is_none() {
            self.small_from = Some(path.sent);
        }
        self.stream_bytes = stream_bytes(self.small_from, path.sent);
    }

    /// What a stream carries now before it is finished ([`stream_bytes`]).
    pub(crate) fn stream_limit(&self) -> u64 {
        self.stream_bytes
    }

    /// Hand queued work to lanes with room, while the lanes together hold
    /// less than their limit.
    fn assign(&mut self, _now: Instant) {
        if !self.running() {
            return;
        }
        let mut held: u64 = self.lanes.iter().map(|l| l.pending).sum();
        for lane in 0..self.lanes.len() {
            while self.lanes[lane].pending < LANE_BYTES && (held == 0 || held < self.in_hand) {
                let Some((job, bytes)) = self.next_work(lane) else {
                    return;
                };
                // (A comparison counts as a full lane: it reads a whole file.)
                self.lanes[lane].pending += bytes;
                held += bytes;
                self.jobs.push_back(job);
            }
        }
    }

    /// The next chunk (or comparison) of the queue, for `lane`, and the
    /// bytes it takes of the lane's budget.
    fn next_work(&mut self, lane: usize) -> Option<(Job<S>, u64)> {
        loop {
            let work = self.queue.front_mut()?;
            match work {
                Work::Compare { id } => {
                    let id = *id;
                    self.queue.pop_front();
                    let Some(f) = self.files.get(&id) else {
                        continue;
                    };
                    let job = Job::Compare {
                        lane,
                        id,
                        src: f.src.clone(),
                    };
                    return Some((job, LANE_BYTES));
                }
                Work::Chunks {
                    id,
                    next,
                    end,
                    send,
                } => {
                    let (id, index) = (*id, *next);
                    let sending = send.as_ref().is_none_or(|s| s[index as usize]);
                    *next += 1;
                    let Some(f) = self.files.get(&id) else {
                        self.queue.pop_front();
                        continue;
                    };
                    if *next >= *end {
                        self.queue.pop_front();
                    }
                    if f.failed {
                        continue;
                    }
                    let len = f.plan.len(index).unwrap_or(0);
                    let charged = match f.sparse {
                        true => len.min(HOLE_CHARGE),
                        false => len,
                    };
                    let job = Job::Read {
                        lane,
                        id,
                        index,
                        src: f.src.clone(),
                        plan: f.plan,
                        check: (f.plan.count() == 1).then_some(f.mtime_ns),
                        send: sending,
                        charged,
                    };
                    return Some((job, charged));
                }
            }
        }
    }

    pub(crate) fn handle_done(&mut self, now: Instant, done: Done) {
        if !self.running() {
            return;
        }
        if let Err(p) = self.on_done(now, done) {
            self.fail(p);
        }
        self.assign(now);
    }

    fn on_done(&mut self, now: Instant, done: Done) -> Result<(), Problem> {
        match done {
            Done::Read {
                lane,
                id,
                index,
                send: sending,
                charged,
                result,
            } => {
                let Some(f) = self.files.get_mut(&id) else {
                    self.release(lane, charged);
                    return Ok(());
                };
                let (data, digest, shape) = match result {
                    Ok(x) if !f.failed => x,
                    Ok(_) => {
                        self.release(lane, charged);
                        return Ok(());
                    }
                    Err(e) => {
                        self.file_failed(id, &e);
                        self.release(lane, charged);
                        return Ok(());
                    }
                };
                let len = f.plan.len(index).unwrap_or(0);
                // A sparse file's chunks are charged little while read
                // (most are holes, which send nothing); one with data
                // holds its whole length until it is written.
                f.sparse |= shape.sparse;
                let data_len = data.len() as u64;
                if data_len > charged {
                    self.lanes[lane].pending += data_len - charged;
                }
                let f = self.files.get_mut(&id).expect("looked up above");
                if f.digests.is_empty() {
                    f.digests = vec![None; f.plan.count() as usize];
                }
                if f.digests[index as usize].replace(digest).is_none() {
                    f.remaining -= 1;
                }
                let whole = f.remaining == 0;
                let single = f.plan.count() == 1;
                let hash = whole.then(|| f.final_hash());
                if sending {
                    f.sent += data.len() as u64;
                    Progress::add(&self.progress.bytes_done, data.len() as u64);
                    if shape.zeros {
                        Progress::add(&self.progress.bytes_done, len);
                    }
                    // A file of one chunk has its hash now (its read checked
                    // the source): it goes right behind the data, so the
                    // receiver can verify and place the file when it is
                    // written.
                    let inline = if single { hash } else { None };
                    // A chunk of zeros carries its digest instead of data.
                    let trailer = match shape.zeros {
                        true => Some(digest),
                        false => inline,
                    };
                    let offset = f.plan.offset(index);
                    let header = RecordHeader {
                        id,
                        offset,
                        len: len as u32,
                        hash: inline.is_some(),
                        zeros: shape.zeros,
                        sparse: shape.sparse,
                    };
                    self.transmit(now, lane, header, data, trailer);
                    if shape.zeros {
                        // No data goes: the lane's room for it is free now.
                        self.release(lane, charged);
                    }
                } else {
                    self.release(lane, charged.max(data_len));
                }
                if whole && !single {
                    let f = &self.files[&id];
                    self.jobs.push_back(Job::Check {
                        id,
                        src: f.src.clone(),
                        size: f.plan.size,
                        mtime_ns: f.mtime_ns,
                    });
                } else if whole && !sending {
                    // A file of one chunk the receiver held already.
                    self.frames.push_back(Frame::FileDone {
                        id,
                        hash: hash.expect("whole"),
                        unchanged: false,
                    });
                }
                Ok(())
            }
            Done::Checked { id, result } => {
                let Some(f) = self.files.get(&id) else {
                    return Ok(());
                };
                match result {
                    Ok(()) if !f.failed => {
                        let hash = f.final_hash();
                        self.frames.push_back(Frame::FileDone {
                            id,
                            hash,
                            unchanged: false,
                        });
                    }
                    Ok(()) => {}
                    Err(e) => self.file_failed(id, &e),
                }
                Ok(())
            }
            Done::Compared { lane, id, result } => {
                self.release(lane, LANE_BYTES);
                let Some(f) = self.files.get_mut(&id) else {
                    return Ok(());
                };
                let Some(compare) = f.compare.take() else {
                    return Ok(());
                };
                match (result, compare) {
                    (Ok(hash), Compare::Only) => {
                        self.jobs.push_back(Job::Close { id });
                        self.frames.push_back(Frame::FileDone {
                            id,
                            hash,
                            unchanged: false,
                        });
                    }
                    (Ok(h), Compare::Unless(hash)) if h == hash => {
                        self.jobs.push_back(Job::Close { id });
                        self.frames.push_back(Frame::FileDone {
                            id,
                            hash,
                            unchanged: true,
                        });
                    }
                    (Ok(_), Compare::Unless(_)) => self.start(id, None, None),
                    (Err(e), _) => self.file_failed(id, &e),
                }
                Ok(())
            }
        }
    }

    /// The file could not be read: tell the receiver, read no more of it.
    /// One that is not found was deleted after the walk saw it (vanished).
    /// One that changed while it was sent is sent once more, whole, under
    /// a new id.
    fn file_failed(&mut self, id: u64, e: &std::io::Error) {
        let changed = e.get_ref().and_then(|e| e.downcast_ref::<Changed>());
        if let (Some(c), Some(f)) = (changed, self.files.get(&id)) {
            if !f.again && !f.failed {
                let (size, mtime_ns) = (c.size, c.mtime_ns);
                self.send_again(id, size, mtime_ns);
                return;
            }
        }
        if let Some(f) = self.files.get_mut(&id) {
            if f.failed {
                return;
            }
            f.failed = true;
            let vanished = e.kind() == std::io::ErrorKind::NotFound;
            let message = match vanished {
                true => format!("{}: vanished before it was read ({e})", f.display),
                false => format!("{}: {e}", f.display),
            };
            self.jobs.push_back(Job::Close { id });
            self.frames.push_back(Frame::FileFailed {
                id,
                message,
                vanished,
                again: false,
            });
        }
    }

    /// File `id` changed while it was sent: it is dropped at the receiver
    /// and announced again with its size and mtime now, under a new id
    /// (records of the old one still on their way are then not its).
    fn send_again(&mut self, id: u64, size: u64, mtime_ns: i64) {
        let Some(old) = self.files.remove(&id) else {
            return;
        };
        self.jobs.push_back(Job::Close { id });
        self.frames.push_back(Frame::FileFailed {
            id,
            message: format!("{}: changed while being sent; sent again", old.display),
            vanished: false,
            again: true,
        });
        self.next_id += 1;
        let new = self.next_id;
        let mut entry = old.entry.clone();
        entry.id = new;
        entry.size = size;
        entry.mtime_ns = mtime_ns;
        Progress::add(&self.progress.bytes_total, size);
        self.progress
            .bytes_total
            .fetch_sub(old.plan.size, std::sync::atomic::Ordering::Relaxed);
        self.files
            .insert(new, OutFile::new(old.src, old.display, &entry, true));
        self.frames.push_back(Frame::Entry(entry));
        if self.cfg.fresh {
            self.start(new, None, None);
        }
    }

    fn transmit(
        &mut self,
        now: Instant,
        lane: usize,
        header: RecordHeader,
        data: Bytes,
        hash: Option<Digest>,
    ) {
        let hash_len = if hash.is_some() { RECORD_HASH_LEN } else { 0 };
        let record = (RECORD_HEADER_LEN + data.len() + hash_len) as u64;
        // Within the last `tail` bytes once every file is known (what is
        // left counts what is handed out with this record as done).
        let left = Progress::get(&self.progress.bytes_total)
            .saturating_sub(Progress::get(&self.progress.bytes_done));
        self.protecting |= self.walked && left + data.len() as u64 <= self.tail;
        let protect = self.protecting;
        let l = &mut self.lanes[lane];
        let limit = if protect {
            PROTECT_BYTES
        } else {
            self.stream_bytes
        };
        let rotate = l.carried > 0 && (l.carried + record > limit || protect != l.protected);
        if rotate {
            l.carried = 0;
        }
        l.carried += record;
        l.protected = protect;
        let not_before = (self.cfg.max_rate > 0).then(|| {
            let start = self.next_departure.map_or(now, |t| t.max(now));
            let secs = data.len() as f64 * 8.0 / self.cfg.max_rate as f64;
            self.next_departure = Some(start + Duration::from_secs_f64(secs));
            start
        });
        self.transmits.push_back(Transmit {
            lane,
            rotate,
            header,
            data,
            hash,
            not_before,
            protect,
        });
    }
}

impl<S: Clone> Role for SendCore<S> {
    fn state(&self) -> &State {
        &self.state
    }

    fn handle_control_end(&mut self) {
        self.fail(Problem::new(
            Kind::Connection,
            "the receiver closed the session early",
        ));
    }

    fn handle_failure(&mut self, p: Problem) {
        self.fail(p);
    }

    fn handle_frame(&mut self, now: Instant, frame: Frame) {
        if !self.running() {
            return;
        }
        if let Err(p) = self.on_frame(frame) {
            self.fail(p);
        }
        self.assign(now);
    }
}
