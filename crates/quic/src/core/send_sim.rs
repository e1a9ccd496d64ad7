//! The sending core driven by hand: the walk, the receiver's frames and idle
//! lanes in the order a test chooses, reads served from memory (the source
//! handle is the file's bytes), simulated time. What goes out on which lane,
//! in which order, and what the receiver is told, is checked exactly.

use super::send::*;
use super::{Role, State};
use crate::proto::{ErrorCode, Frame, Outcome, Want};
use crate::report::{Kind, Progress, Status};
use bytes::Bytes;
use longhaul_transfer::{ChunkPlan, Entry, EntryKind, CHUNK_SIZE};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = CHUNK_SIZE as usize;

type Src = Arc<Vec<u8>>;

struct Sim {
    core: SendCore<Src>,
    now: Instant,
    sent: Vec<Frame>,
    /// Records put on lanes, in order.
    out: Vec<Transmit>,
    /// Make the file with this id unreadable.
    unreadable: Option<u64>,
    /// The sources are sparse: a chunk of zeros is a hole.
    sparse: bool,
    /// Files (by id) whose last check finds them changed: 5 bytes now.
    changing: Vec<u64>,
    /// Lanes report idle again as soon as they have written.
    auto_idle: bool,
    /// Every chunk read: (id, index).
    read: std::cell::RefCell<Vec<(u64, u64)>>,
}

impl Sim {
    fn new(fresh: bool, lanes: usize, max_rate: u64) -> Sim {
        let cfg = SendConfig {
            fresh,
            max_rate,
            peer_makes: (false, false),
        };
        let mut s = Sim {
            core: SendCore::new(cfg, lanes, Arc::new(Progress::default())),
            now: Instant::now(),
            sent: Vec::new(),
            out: Vec::new(),
            unreadable: None,
            sparse: false,
            changing: Vec::new(),
            auto_idle: true,
            read: Default::default(),
        };
        s.pump();
        s
    }

    fn pump(&mut self) {
        loop {
            let mut any = false;
            while let Some(f) = self.core.poll_frame() {
                self.sent.push(f);
            }
            while let Some(j) = self.core.poll_job() {
                any = true;
                if let Some(d) = self.run(j) {
                    self.core.handle_done(self.now, d);
                }
            }
            while let Some(t) = self.core.poll_transmit() {
                any = true;
                let (lane, len) = (t.lane, t.data.len() as u64);
                self.out.push(t);
                if self.auto_idle {
                    self.core.handle_written(self.now, lane, len);
                }
            }
            if !any {
                return;
            }
        }
    }

    fn run(&self, j: Job<Src>) -> Option<Done> {
        Some(match j {
            Job::Read {
                lane,
                id,
                index,
                src,
                plan,
                send,
                charged,
                check,
                ..
            } => {
                self.read.borrow_mut().push((id, index));
                let result = if self.unreadable == Some(id) {
                    Err(std::io::Error::other("unreadable"))
                } else if check.is_some() && self.changing.contains(&id) {
                    // (A file of one chunk is checked by its read.)
                    Err(std::io::Error::other(super::send::Changed {
                        size: 5,
                        mtime_ns: 9,
                    }))
                } else {
                    let (o, n) = (
                        plan.offset(index) as usize,
                        plan.len(index).unwrap() as usize,
                    );
                    let data = &src[o..o + n];
                    let mut h = plan.hasher(index);
                    h.update(data);
                    // (A sparse source's chunk of zeros goes without data.)
                    let zeros = self.sparse && data.iter().all(|&b| b == 0);
                    let shape = longhaul_transfer::place::Shape {
                        zeros,
                        sparse: self.sparse,
                    };
                    match zeros {
                        true => Ok((Bytes::new(), h.finish(), shape)),
                        false => Ok((Bytes::copy_from_slice(data), h.finish(), shape)),
                    }
                };
                Done::Read {
                    lane,
                    id,
                    index,
                    send,
                    charged,
                    result,
                }
            }
            Job::Check { id, .. } => Done::Checked {
                id,
                result: match self.changing.contains(&id) {
                    true => Err(std::io::Error::other(super::send::Changed {
                        size: 5,
                        mtime_ns: 9,
                    })),
                    false => Ok(()),
                },
            },
            Job::Compare { lane, id, src } => Done::Compared {
                lane,
                id,
                result: Ok(*blake3::hash(&src).as_bytes()),
            },
            Job::Close { .. } => return None,
        })
    }

    fn walk(&mut self, path: &str, kind: EntryKind, data: Option<Vec<u8>>) {
        let size = data.as_ref().map_or(0, |d| d.len() as u64);
        let w = Walked::Entry {
            root: 0,
            entry: Entry {
                id: 0,
                root: 0,
                path: path.as_bytes().to_vec(),
                kind,
                size,
                mode: 0o644,
                mtime_ns: 1,
                link: vec![],
                owner: Default::default(),
                xattrs: vec![],
                allocated: 0,
            },
            display: path.to_string(),
            src: data.map(Arc::new),
        };
        self.core.handle_walked(self.now, w);
        self.pump();
    }

    fn file(&mut self, path: &str, data: &[u8]) {
        self.walk(path, EntryKind::File, Some(data.to_vec()));
    }

    fn frame(&mut self, f: Frame) {
        self.core.handle_frame(self.now, f);
        self.pump();
    }

    fn fails_with(&self, needle: &str) {
        match self.core.state() {
            State::Failed(p) => assert!(p.to_string().contains(needle), "{p} lacks {needle:?}"),
            s => panic!("expected a failure with {needle:?}, got {s:?}"),
        }
    }

    /// What file `id` put on the wire, by chunk index, in order.
    fn chunks_of(&self, id: u64) -> Vec<u64> {
        self.out
            .iter()
            .filter(|t| t.header.id == id)
            .map(|t| t.header.chunk())
            .collect()
    }

    /// The bytes of file `id` as they went out, put together.
    fn bytes_of(&self, id: u64, size: usize) -> Vec<u8> {
        let mut b = vec![0u8; size];
        for t in self.out.iter().filter(|t| t.header.id == id) {
            let o = t.header.offset as usize;
            b[o..o + t.data.len()].copy_from_slice(&t.data);
        }
        b
    }
}

/// File `id`'s `FileDone` went out with the BLAKE3 of `data`; the receiver
/// then says it verified: the report.
fn verified(s: &mut Sim, id: u64, data: &[u8]) -> crate::report::SessionReport {
    assert!(
        s.sent.contains(&Frame::FileDone {
            id,
            hash: *blake3::hash(data).as_bytes(),
            unchanged: false
        }),
        "{:?}",
        s.sent
    );
    s.frame(Frame::FileResult {
        id,
        outcome: Outcome::Verified,
    });
    s.core.take_report()
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(17).wrapping_add(seed))
        .collect()
}

#[test]
fn files_go_out_when_wanted_their_hash_with_the_data_or_after_it() {
    let mut s = Sim::new(false, 2, 0);
    let small = bytes(700, 1);
    let big = bytes(3 * MIB + 9, 2);
    s.walk("", EntryKind::Dir, None);
    s.file("small", &small);
    s.file("big", &big);
    s.file("empty", b"");
    s.core.handle_walked(s.now, Walked::End);
    s.pump();
    let ids: Vec<u64> = s
        .sent
        .iter()
        .filter_map(|f| match f {
            Frame::Entry(e) => Some(e.id),
            _ => None,
        })
        .collect();
    assert_eq!(ids, [1, 2, 3, 4], "ids rise from 1");
    assert_eq!(s.sent.last(), Some(&Frame::ManifestEnd));
    assert!(s.out.is_empty(), "nothing is read before it is wanted");
    for id in [2, 3, 4] {
        s.frame(Frame::Want {
            id,
            want: Want::All,
        });
    }
    // The small file: one record with its hash behind it, no FileDone.
    let rec = s.out.iter().find(|t| t.header.id == 2).unwrap();
    assert_eq!(rec.hash, Some(*blake3::hash(&small).as_bytes()));
    // The big one: every chunk once, over both lanes, then FileDone.
    let mut chunks = s.chunks_of(3);
    chunks.sort();
    assert_eq!(chunks, [0, 1, 2, 3]);
    let lanes: std::collections::BTreeSet<usize> = s
        .out
        .iter()
        .filter(|t| t.header.id == 3)
        .map(|t| t.lane)
        .collect();
    assert_eq!(lanes.len(), 2, "a big file's chunks spread over the lanes");
    assert_eq!(s.bytes_of(3, big.len()), big);
    let dones: Vec<(u64, [u8; 32])> = s
        .sent
        .iter()
        .filter_map(|f| match f {
            Frame::FileDone { id, hash, .. } => Some((*id, *hash)),
            _ => None,
        })
        .collect();
    assert_eq!(
        dones,
        [
            (3, *blake3::hash(&big).as_bytes()),
            (4, *blake3::hash(b"").as_bytes())
        ]
    );
    for id in [2, 3, 4] {
        s.frame(Frame::FileResult {
            id,
            outcome: Outcome::Verified,
        });
    }
    s.frame(Frame::Done {
        ok: true,
        behind_ms: 1500,
    });
    assert_eq!(*s.core.state(), State::Finished);
    let r = s.core.take_report();
    assert_eq!(
        r.held_back_s, 1.5,
        "the receiver's time behind, from its Done"
    );
    assert_eq!(r.dirs, 1);
    assert!(r.problems.is_empty());
    let big_r = r.files.iter().find(|f| f.path == "big").unwrap();
    assert_eq!(big_r.bytes_transferred, big.len() as u64);
    assert_eq!(
        big_r.blake3.as_deref(),
        Some(blake3::hash(&big).to_hex().as_str())
    );
}

#[test]
fn a_sparse_files_holes_go_as_headers_without_data_and_the_lanes_do_not_fill() {
    // 64 MiB of which the last chunk holds data, on one lane whose budget
    // is one record, never written: the holes' room is freed as they go,
    // so all go.
    let mut s = Sim::new(false, 1, 0);
    s.sparse = true;
    s.auto_idle = false;
    let mut data = vec![0u8; 64 * MIB];
    data[63 * MIB + 17] = 6;
    s.walk("", EntryKind::Dir, None);
    s.file("disk.img", &data);
    s.frame(Frame::Want {
        id: 2,
        want: Want::All,
    });
    assert_eq!(
        s.out.len(),
        64,
        "every chunk went without a lane's room being given back"
    );
    for t in &s.out {
        let hole = t.header.chunk() != 63;
        assert_eq!((t.header.zeros, t.header.sparse), (hole, true));
        assert_eq!(t.header.len as usize, MIB);
        assert_eq!(t.data.len(), if hole { 0 } else { MIB });
    }
    // The hash is the whole file's, holes and all.
    let r = verified(&mut s, 2, &data);
    assert_eq!(r.files[0].bytes_transferred, MIB as u64);
}

#[test]
fn a_file_that_changes_while_sent_is_announced_again_once_then_reported() {
    let mut s = Sim::new(false, 1, 0);
    s.changing = vec![2, 3];
    s.walk("", EntryKind::Dir, None);
    s.file("big", &bytes(2 * MIB, 4));
    s.frame(Frame::Want {
        id: 2,
        want: Want::All,
    });
    // Dropped at the receiver, and announced again as it is now.
    let n = s.sent.len();
    assert!(
        matches!(
            &s.sent[n - 2],
            Frame::FileFailed {
                id: 2,
                again: true,
                ..
            }
        ),
        "{:?}",
        &s.sent[n - 2..]
    );
    match &s.sent[n - 1] {
        Frame::Entry(e) => assert_eq!(
            (e.id, e.size, e.mtime_ns, e.path.as_slice()),
            (3, 5, 9, &b"big"[..])
        ),
        f => panic!("{f:?}"),
    }
    // Its second try changes too: reported, not tried again.
    s.frame(Frame::Want {
        id: 3,
        want: Want::All,
    });
    match s.sent.last() {
        Some(Frame::FileFailed {
            id: 3,
            message,
            again: false,
            vanished: false,
        }) => assert!(
            message.contains("big: the file changed while being sent"),
            "{message}"
        ),
        f => panic!("{f:?}"),
    }
}

#[test]
fn a_fresh_session_sends_every_file_unasked_right_after_its_entry() {
    let mut s = Sim::new(true, 1, 0);
    s.walk("", EntryKind::Dir, None);
    s.file("a", b"hello");
    s.file("e", b"");
    assert_eq!(s.chunks_of(2), [0]);
    // The empty file's FileDone follows its entry on the control stream.
    let pos = |p: &dyn Fn(&Frame) -> bool| s.sent.iter().position(p).unwrap();
    let entry = pos(&|f| matches!(f, Frame::Entry(e) if e.id == 3));
    let done = pos(&|f| matches!(f, Frame::FileDone { id: 3, .. }));
    assert!(entry < done);
    // A Want in a fresh session is the receiver's mistake.
    s.frame(Frame::Want {
        id: 2,
        want: Want::All,
    });
    s.fails_with("a second Want for file 2, or one in a fresh session");
}

#[test]
fn a_resume_sends_only_the_missing_chunks_and_still_hashes_the_whole_file() {
    let mut s = Sim::new(false, 1, 0);
    let big = bytes(3 * MIB, 3);
    s.walk("", EntryKind::Dir, None);
    s.file("big", &big);
    s.frame(Frame::Want {
        id: 2,
        want: Want::Chunks(vec![(1, 2)]),
    });
    assert_eq!(s.chunks_of(2), [1]);
    let r = verified(&mut s, 2, &big);
    assert_eq!(r.files[0].bytes_resumed, 2 * MIB as u64);
    assert_eq!(r.files[0].bytes_transferred, MIB as u64);
}

#[test]
fn a_slice_reads_only_its_chunks_and_says_their_slice_digest() {
    let mut s = Sim::new(false, 1, 0);
    let big = bytes(5 * MIB - 10, 8);
    s.walk("", EntryKind::Dir, None);
    s.file("big", &big);
    s.frame(Frame::Want {
        id: 2,
        want: Want::Slice {
            first: 1,
            end: 4,
            send: vec![(2, 4)],
        },
    });
    assert_eq!(s.chunks_of(2), [2, 3]);
    assert_eq!(*s.read.borrow(), [(2, 1), (2, 2), (2, 3)]);
    let plan = ChunkPlan::new(big.len() as u64);
    let cvs: Vec<[u8; 32]> = (1..4)
        .map(|i| {
            let o = plan.offset(i) as usize;
            let mut h = plan.hasher(i);
            h.update(&big[o..o + MIB]);
            h.finish()
        })
        .collect();
    assert!(s.sent.contains(&Frame::FileDone {
        id: 2,
        hash: plan.slice_digest(1, &cvs),
        unchanged: false
    }));
    let bad = [
        ((0, 0, vec![]), "slice 0..0 of file 2 of 5 chunks"),
        ((3, 6, vec![]), "slice 3..6 of file 2 of 5 chunks"),
        ((1, 3, vec![(0, 2)]), "chunk range 0..2 outside slice 1..3"),
        ((1, 3, vec![(2, 4)]), "chunk range 2..4 outside slice 1..3"),
    ];
    for ((first, end, send), needle) in bad {
        let mut s = Sim::new(false, 1, 0);
        s.walk("", EntryKind::Dir, None);
        s.file("big", &big);
        s.frame(Frame::Want {
            id: 2,
            want: Want::Slice { first, end, send },
        });
        s.fails_with(needle);
    }
    let mut s = Sim::new(false, 1, 0);
    s.walk("", EntryKind::Dir, None);
    s.file("small", b"one chunk");
    s.frame(Frame::Want {
        id: 2,
        want: Want::Slice {
            first: 0,
            end: 1,
            send: vec![],
        },
    });
    s.fails_with("a slice is a non-empty chunk range of a file of several chunks");
}

#[test]
fn an_unchanged_file_is_compared_not_sent() {
    let mut s = Sim::new(false, 1, 0);
    let a = bytes(5000, 4);
    s.walk("", EntryKind::Dir, None);
    s.file("same", &a);
    s.file("changed", &a);
    s.frame(Frame::Want {
        id: 2,
        want: Want::UnlessHash(*blake3::hash(&a).as_bytes()),
    });
    s.frame(Frame::Want {
        id: 3,
        want: Want::UnlessHash([0; 32]),
    });
    assert!(s.sent.contains(&Frame::FileDone {
        id: 2,
        hash: *blake3::hash(&a).as_bytes(),
        unchanged: true
    }));
    assert!(s.chunks_of(2).is_empty());
    assert_eq!(s.chunks_of(3), [0]);
}

#[test]
fn an_unreadable_file_fails_alone_and_is_read_no_more() {
    let mut s = Sim::new(false, 2, 0);
    s.walk("", EntryKind::Dir, None);
    s.file("bad", &bytes(4 * MIB, 5));
    s.file("good", b"fine");
    s.unreadable = Some(2);
    s.frame(Frame::Want {
        id: 2,
        want: Want::All,
    });
    s.frame(Frame::Want {
        id: 3,
        want: Want::All,
    });
    let failed: Vec<&Frame> = s
        .sent
        .iter()
        .filter(|f| matches!(f, Frame::FileFailed { .. }))
        .collect();
    assert_eq!(failed.len(), 1, "one FileFailed: {failed:?}");
    assert!(
        matches!(failed[0], Frame::FileFailed { id: 2, message, vanished: false, .. } if message.contains("bad: unreadable"))
    );
    assert!(s.chunks_of(2).is_empty());
    assert_eq!(s.chunks_of(3), [0]);
    s.frame(Frame::FileResult {
        id: 2,
        outcome: Outcome::Failed {
            code: ErrorCode::Io,
            message: "unreadable at the source".into(),
        },
    });
    let r = s.core.take_report();
    assert_eq!(r.files[0].status, Status::Failed);
    assert_eq!(r.problems[0].kind, Kind::Remote);
}

#[test]
fn hostile_receivers_end_the_session_precisely() {
    let start = || {
        let mut s = Sim::new(false, 1, 0);
        s.walk("", EntryKind::Dir, None);
        s.file("a", &bytes(2 * MIB, 6));
        s
    };
    let cases: Vec<(Frame, &str)> = vec![
        (
            Frame::Want {
                id: 9,
                want: Want::All,
            },
            "Want for unknown file 9",
        ),
        (
            Frame::Want {
                id: 1,
                want: Want::All,
            },
            "Want for unknown file 1",
        ),
        (
            Frame::Want {
                id: 2,
                want: Want::Chunks(vec![(1, 3)]),
            },
            "chunk range 1..3 outside file 2 of 2 chunks",
        ),
        (
            Frame::Want {
                id: 2,
                want: Want::Chunks(vec![(2, 1)]),
            },
            "chunk range 2..1 outside file 2",
        ),
        (
            Frame::FileResult {
                id: 7,
                outcome: Outcome::Verified,
            },
            "FileResult for unknown file 7",
        ),
        (Frame::ManifestEnd, "unexpected ManifestEnd"),
    ];
    for (f, needle) in cases {
        let mut s = start();
        s.frame(f);
        s.fails_with(needle);
    }
    let mut s = start();
    s.frame(Frame::Want {
        id: 2,
        want: Want::All,
    });
    s.frame(Frame::Want {
        id: 2,
        want: Want::All,
    });
    s.fails_with("a second Want for file 2");
}

#[test]
fn the_queue_holds_one_entry_per_file_however_large() {
    let mut s = Sim::new(false, 1, 0);
    s.auto_idle = false;
    s.walk("", EntryKind::Dir, None);
    // A 1 TiB file is announced without its bytes (they are never read here).
    let huge = Walked::Entry {
        root: 0,
        entry: Entry {
            id: 0,
            root: 0,
            path: b"huge".to_vec(),
            kind: EntryKind::File,
            size: 1 << 40,
            mode: 0o644,
            mtime_ns: 1,
            link: vec![],
            owner: Default::default(),
            xattrs: vec![],
            allocated: 0,
        },
        display: "huge".into(),
        src: Some(Arc::new(Vec::new())),
    };
    s.core.handle_walked(s.now, huge);
    s.file("b", b"b");
    s.core.handle_frame(
        s.now,
        Frame::Want {
            id: 2,
            want: Want::All,
        },
    );
    s.core.handle_frame(
        s.now,
        Frame::Want {
            id: 3,
            want: Want::All,
        },
    );
    assert_eq!(s.core.queued(), 2, "two files, two entries");
    match s.core.poll_job() {
        Some(Job::Read {
            id: 2, index: 0, ..
        }) => {}
        j => panic!("{j:?}"),
    }
    assert!(
        s.core.poll_job().is_none(),
        "a lane holds one large chunk at a time"
    );
}

#[test]
fn a_lane_holds_several_small_records_up_to_its_budget() {
    let mut s = Sim::new(true, 1, 0);
    s.auto_idle = false;
    s.walk("", EntryKind::Dir, None);
    for i in 0..100 {
        s.file(&format!("f{i}"), &bytes(10_000, i));
    }
    // Records of 10 kB up to 256 KiB are handed out before any is written.
    assert_eq!(s.out.len(), 27);
    let t = s.out[0].clone();
    s.core.handle_written(s.now, t.lane, t.data.len() as u64);
    s.pump();
    assert_eq!(s.out.len(), 28, "one written, one more handed out");
}

#[test]
fn no_stream_carries_more_than_its_budget_or_one_record() {
    let mut s = Sim::new(true, 1, 0);
    s.walk("", EntryKind::Dir, None);
    for i in 0..300 {
        s.file(&format!("s{i}"), &bytes(10_000, i as u8));
    }
    s.file("big", &bytes(5 * MIB, 7));
    for i in 0..2000 {
        s.file(&format!("t{i}"), &bytes(700, i as u8));
    }
    let streams = streams(&s.out);
    for &(b, n) in &streams {
        assert!(b <= STREAM_BYTES || n == 1, "{n} records, {b} bytes");
    }
    let total: u64 = streams.iter().map(|s| s.0).sum();
    assert!(
        streams.len() as u64 <= 2 * total.div_ceil(STREAM_BYTES),
        "{} streams for {total} bytes",
        streams.len()
    );
    assert_eq!(s.out.len(), 300 + 5 + 2000, "every record once");
}

/// (record bytes, records) of each stream the transmits went on, in order
/// (one lane).
fn streams(out: &[Transmit]) -> Vec<(u64, usize)> {
    let mut streams: Vec<(u64, usize)> = vec![(0, 0)];
    for t in out {
        let rec = (crate::proto::RECORD_HEADER_LEN + t.data.len()) as u64
            + if t.hash.is_some() { 32 } else { 0 };
        if t.rotate {
            streams.push((0, 0));
        }
        let last = streams.last_mut().unwrap();
        last.0 += rec;
        last.1 += 1;
    }
    streams
}

#[test]
fn under_a_small_window_a_stream_is_long_and_it_ends_when_the_window_grows() {
    let mut s = Sim::new(true, 1, 0);
    s.walk("", EntryKind::Dir, None);
    let record = 10_000 + crate::proto::RECORD_HEADER_LEN as u64 + 32;
    let small = |sent| PathView {
        cwnd: 16 << 10,
        sent,
        lane_backlog: STREAM_BYTES,
    };
    let files = |s: &mut Sim, tag: &str, n: usize| {
        for i in 0..n {
            s.file(&format!("{tag}{i}"), &bytes(10_000, i as u8));
        }
    };
    // A 1 Mbit/s path's window, and nothing sent under it yet, however
    // long it lasts (a sender waiting for the receiver): streams of 1 MiB.
    s.core.set_path(small(1000));
    s.core.set_path(small(1000));
    files(&mut s, "a", 150);
    assert_eq!(streams(&s.out).len(), 2, "1.5 MB: two streams");
    // Almost SMALL_SENT sent under it: still 1 MiB.
    s.core.set_path(small(1000 + SMALL_SENT - 1));
    files(&mut s, "b", 100);
    let n = streams(&s.out).len();
    assert!(streams(&s.out).iter().all(|&(b, _)| b <= STREAM_BYTES));
    // SMALL_SENT sent: the next 300 files of 10 kB go on the open stream
    // (3 MB, not three streams).
    s.core.set_path(small(1000 + SMALL_SENT));
    files(&mut s, "c", 300);
    let long = streams(&s.out);
    assert_eq!(long.len(), n, "{long:?}");
    assert!(long[n - 1].0 > 2 * STREAM_BYTES, "{long:?}");
    // The window grows past SMALL_WINDOW: the next record opens a new
    // stream, and streams hold 1 MiB again.
    s.core.set_path(PathView {
        cwnd: SMALL_WINDOW + 1,
        ..small(2 << 20)
    });
    files(&mut s, "d", 300);
    let after = streams(&s.out);
    assert_eq!(after[..n], long[..]);
    assert!(after.len() >= n + 3, "{after:?}");
    assert!(
        after[n..].iter().all(|&(b, _)| b <= STREAM_BYTES),
        "{after:?}"
    );
    assert_eq!(after[n..].iter().map(|s| s.0).sum::<u64>(), 300 * record);
    // Small again: the count starts over from what was sent by then.
    s.core.set_path(small(3 << 20));
    s.core.set_path(small((3 << 20) + SMALL_SENT - 1));
    files(&mut s, "e", 200);
    let again = streams(&s.out);
    assert!(
        again[n..].iter().all(|&(b, _)| b <= STREAM_BYTES),
        "{again:?}"
    );
    s.core.set_path(small((3 << 20) + SMALL_SENT));
    files(&mut s, "f", 200);
    assert!(streams(&s.out).last().unwrap().0 > STREAM_BYTES);
    // A lane whose share of the send window is over 1 MiB (one lane, or a
    // send window grown on a faster path) could hold more than that of a
    // long stream unsent when the window grows: streams stay at 1 MiB. So
    // too over several connections (the driver passes u64::MAX).
    for lane_backlog in [STREAM_BYTES + 1, u64::MAX] {
        let mut s = Sim::new(true, 1, 0);
        s.walk("", EntryKind::Dir, None);
        let big = |sent| PathView {
            lane_backlog,
            ..small(sent)
        };
        s.core.set_path(big(0));
        s.core.set_path(big(10 * SMALL_SENT));
        files(&mut s, "g", 300);
        let st = streams(&s.out);
        assert!(st.iter().all(|&(b, _)| b <= STREAM_BYTES), "{st:?}");
    }
}

#[test]
fn max_rate_gives_each_record_its_departure_time() {
    let mut s = Sim::new(true, 2, 8_000_000); // 1 MB/s
    s.walk("", EntryKind::Dir, None);
    for i in 0..4 {
        s.file(&format!("f{i}"), &bytes(100_000, i));
    }
    let times: Vec<Duration> = s
        .out
        .iter()
        .map(|t| t.not_before.unwrap() - s.now)
        .collect();
    assert_eq!(
        times,
        [0, 100, 200, 300].map(Duration::from_millis),
        "100 kB apart at 1 MB/s, across lanes"
    );
}

#[test]
fn the_lanes_hold_no_more_than_the_in_hand_limit_and_at_least_one_record() {
    let mut s = Sim::new(true, 4, 0);
    s.auto_idle = false;
    // A send window of 4 MiB: the four lanes hold one 1 MiB chunk between them.
    s.core.set_in_hand(s.now, in_hand_limit(4 * MIB as u64));
    s.walk("", EntryKind::Dir, None);
    s.file("big", &bytes(8 * MIB, 3));
    assert_eq!(s.out.len(), 1, "one chunk in hand");
    // Below one record, the first is still handed out.
    s.core.set_in_hand(s.now, 1);
    let t = s.out[0].clone();
    s.core.handle_written(s.now, t.lane, t.data.len() as u64);
    s.pump();
    assert_eq!(s.out.len(), 2, "one written, the next in hand");
    // A window of 12 MiB: three chunks at once.
    s.core.set_in_hand(s.now, in_hand_limit(12 * MIB as u64));
    s.pump();
    assert_eq!(s.out.len(), 4, "room grew: two more handed out at once");
    let lanes: std::collections::HashSet<usize> = s.out[1..].iter().map(|t| t.lane).collect();
    assert_eq!(lanes.len(), 3, "on three lanes");
    // Everything goes out once the lanes write.
    s.auto_idle = true;
    for t in &s.out[1..] {
        s.core.handle_written(s.now, t.lane, t.data.len() as u64);
    }
    s.pump();
    assert_eq!(s.bytes_of(2, 8 * MIB), bytes(8 * MIB, 3), "the file whole");
}
