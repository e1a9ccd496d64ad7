//! The receiving core driven by hand, deterministically: frames and records
//! in the order a test chooses, jobs run by the real [`RecvDisk`] against a
//! temporary directory whenever the test says, simulated time. Hostile
//! senders, fresh sessions, resume and the races between a file's hash and
//! its last write are replayed exactly, without QUIC or threads.

use super::recv::*;
use super::{Role, State};
use crate::disk::RecvDisk;
use crate::proto::{Change, ErrorCode, Frame, Outcome, RecordHeader, Want, What};
use crate::report::{Kind, Progress, Status};
use cap_std::fs::Dir;
use longhaul_transfer::landing::Landing;
use longhaul_transfer::sync::SyncMode;
use longhaul_transfer::{Entry, EntryKind, RelPath, CHUNK_SIZE};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = CHUNK_SIZE as usize;

struct Sim {
    core: RecvCore,
    disk: RecvDisk,
    root: std::path::PathBuf,
    _tmp: Option<tempfile::TempDir>,
    now: Instant,
    /// Frames the core sent, in order.
    sent: Vec<Frame>,
    /// Jobs handed out and not yet run.
    pending: VecDeque<Job>,
    /// Streams made ready, in order.
    ready: Vec<u64>,
    /// The bytes of each buffer handed back (at least 1), as the driver's
    /// gate counts them.
    returned: Vec<u64>,
    /// Run every job as soon as it is handed out.
    auto: bool,
}

fn cfg(fresh: bool) -> RecvConfig {
    RecvConfig {
        sync: SyncMode::Always,
        fresh,
        durable: false,
        max_waiting: 4 * CHUNK_SIZE,
        exact_modes: false,
        specials: false,
        devices: false,
        delete: None,
        dry_run: false,
        shard: None,
    }
}

/// Everything goes into `dest/` of a directory `base`: roots `run`.
fn landing() -> Landing {
    Landing {
        prefix: RelPath::from_wire(b"dest").unwrap(),
        dest_is_dir: true,
        roots: vec![b"run".to_vec()],
    }
}

impl Sim {
    fn new(cfg: RecvConfig) -> Sim {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Sim::at(tmp.path(), cfg);
        s._tmp = Some(tmp);
        s
    }

    /// A durable session, stepped by hand (`auto` off), whose manifest so
    /// far is the root directory and `files` (id, name, data) in it.
    fn durable(files: &[(u64, &str, &[u8])]) -> Sim {
        let mut s = Sim::new(RecvConfig {
            durable: true,
            ..cfg(false)
        });
        s.auto = false;
        s.frame(entry(1, "", EntryKind::Dir, 0));
        for &(id, name, data) in files {
            s.frame(file(id, name, data));
        }
        s
    }

    /// A session receiving into `root` (which the caller keeps).
    fn at(root: &Path, cfg: RecvConfig) -> Sim {
        let base = Dir::open_ambient_dir(root, cap_std::ambient_authority()).unwrap();
        let durable = cfg.durable;
        Sim {
            core: RecvCore::new(cfg, landing(), Arc::new(Progress::default())),
            disk: RecvDisk::new(base, durable),
            root: root.to_path_buf(),
            _tmp: None,
            now: Instant::now(),
            sent: Vec::new(),
            pending: VecDeque::new(),
            ready: Vec::new(),
            returned: Vec::new(),
            auto: true,
        }
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.root.join("dest/run").join(rel)
    }

    fn pump(&mut self) {
        loop {
            while let Some(f) = self.core.poll_frame() {
                self.sent.push(f);
            }
            while let Some(Event::StreamReady { stream, spare }) = self.core.poll_event() {
                self.ready.push(stream);
                self.returned.push((spare.len() as u64).max(1));
            }
            let mut any = false;
            while let Some(j) = self.core.poll_job() {
                self.pending.push_back(j);
                any = true;
            }
            if (!self.auto || self.pending.is_empty()) && !any {
                return;
            }
            if self.auto {
                while let Some(j) = self.pending.pop_front() {
                    let d = self.disk.run(j);
                    self.core.handle_done(self.now, d);
                }
            }
        }
    }

    /// Run the first pending job that `pick` chooses.
    fn run(&mut self, pick: impl Fn(&Job) -> bool) {
        let i = self
            .pending
            .iter()
            .position(pick)
            .unwrap_or_else(|| panic!("no such job among {:?}", self.pending));
        let j = self.pending.remove(i).unwrap();
        let d = self.disk.run(j);
        self.core.handle_done(self.now, d);
        self.pump();
    }

    fn run_all(&mut self) {
        while !self.pending.is_empty() {
            self.run(|_| true);
        }
    }

    fn frame(&mut self, f: Frame) {
        self.core.handle_frame(self.now, f);
        self.pump();
    }

    fn record(&mut self, stream: u64, id: u64, index: u64, data: &[u8], hash: Option<[u8; 32]>) {
        let r = Record {
            stream,
            header: RecordHeader {
                id,
                offset: index * CHUNK_SIZE,
                len: data.len() as u32,
                hash: hash.is_some(),
                zeros: false,
                sparse: false,
            },
            data: data.to_vec(),
            hash,
            zero_digest: None,
        };
        self.core.handle_record(self.now, r);
        self.pump();
    }

    /// A file sent as the sender does: its chunks, its hash with the data
    /// (one chunk) or in `FileDone`.
    fn send_file(&mut self, id: u64, data: &[u8]) {
        let hash = *blake3::hash(data).as_bytes();
        let chunks: Vec<&[u8]> = data.chunks(MIB).collect();
        if chunks.len() == 1 {
            self.record(id, id, 0, data, Some(hash));
        } else {
            for (i, c) in chunks.iter().enumerate() {
                self.record(id, id, i as u64, c, None);
            }
            self.frame(done(id, data));
        }
    }

    fn failed(&self) -> &crate::report::Problem {
        match self.core.state() {
            State::Failed(p) => p,
            s => panic!("expected a failed session, got {s:?}; sent {:?}", self.sent),
        }
    }

    fn fails_with(&self, kind: Kind, needle: &str) {
        let p = self.failed();
        assert_eq!(p.kind, kind, "{p}");
        assert!(p.to_string().contains(needle), "{p:?} lacks {needle:?}");
    }

    fn results(&self) -> Vec<(u64, Outcome)> {
        self.sent
            .iter()
            .filter_map(|f| match f {
                Frame::FileResult { id, outcome } => Some((*id, outcome.clone())),
                _ => None,
            })
            .collect()
    }

    fn wants(&self) -> Vec<(u64, Want)> {
        self.sent
            .iter()
            .filter_map(|f| match f {
                Frame::Want { id, want } => Some((*id, want.clone())),
                _ => None,
            })
            .collect()
    }
}

fn entry(id: u64, path: &str, kind: EntryKind, size: u64) -> Frame {
    Frame::Entry(Entry {
        id,
        root: 0,
        path: path.as_bytes().to_vec(),
        kind,
        size,
        mode: if kind == EntryKind::Dir { 0o755 } else { 0o640 },
        mtime_ns: 1_600_000_000_000_000_000,
        link: if kind == EntryKind::Symlink {
            b"target".to_vec()
        } else {
            vec![]
        },
        owner: Default::default(),
        xattrs: vec![],
        allocated: 0,
    })
}

fn file(id: u64, path: &str, data: &[u8]) -> Frame {
    entry(id, path, EntryKind::File, data.len() as u64)
}

fn done(id: u64, data: &[u8]) -> Frame {
    Frame::FileDone {
        id,
        hash: *blake3::hash(data).as_bytes(),
        unchanged: false,
    }
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn a_tree_arrives_whole_and_verified() {
    let mut s = Sim::new(cfg(false));
    let small = bytes(10_000, 1);
    let big = bytes(2 * MIB + 5, 2);
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(entry(2, "sub", EntryKind::Dir, 0));
    s.frame(file(3, "sub/small", &small));
    s.frame(file(4, "big", &big));
    s.frame(file(5, "empty", b""));
    s.frame(entry(6, "link", EntryKind::Symlink, 0));
    // The driver's measure of the time it was behind goes out with Done.
    s.core.set_held_back(Duration::from_millis(2250));
    s.frame(Frame::ManifestEnd);
    assert_eq!(
        s.wants(),
        [(3, Want::All), (4, Want::All), (5, Want::All)],
        "a Want per file, in order"
    );
    s.send_file(3, &small);
    s.send_file(4, &big);
    s.frame(done(5, b""));
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
    assert_eq!(
        s.sent.last(),
        Some(&Frame::Done {
            ok: true,
            behind_ms: 2250
        })
    );
    assert_eq!(read(&s.path("sub/small")), small);
    assert_eq!(read(&s.path("big")), big);
    assert_eq!(read(&s.path("empty")), b"");
    assert_eq!(
        std::fs::read_link(s.path("link")).unwrap(),
        Path::new("target")
    );
    let mut ids: Vec<u64> = s.results().iter().map(|r| r.0).collect();
    ids.sort();
    assert_eq!(ids, [3, 4, 5]);
    let r = s.core.take_report();
    assert_eq!(r.held_back_s, 2.25);
    assert_eq!((r.dirs, r.symlinks), (2, 1));
    assert!(r.files.iter().all(|f| f.status == Status::Verified));
    let big_report = r.files.iter().find(|f| f.path == "dest/run/big").unwrap();
    assert_eq!(big_report.bytes_transferred, big.len() as u64);
    assert_eq!(
        big_report.blake3.as_deref(),
        Some(blake3::hash(&big).to_hex().as_str())
    );
    // No part file or journal is left.
    let left: Vec<_> = std::fs::read_dir(s.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".lh-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn specials_are_made_only_when_asked_and_a_device_that_cannot_be_made_fails_alone() {
    use std::os::unix::fs::FileTypeExt;
    // A FIFO and a char device (1, 3) sent; the session run to its end.
    let session = |cfg: RecvConfig| {
        let mut s = Sim::new(cfg);
        s.frame(entry(1, "", EntryKind::Dir, 0));
        s.frame(entry(2, "pipe", EntryKind::Fifo, 0));
        s.frame(entry(3, "null", EntryKind::CharDevice, 259));
        s.frame(Frame::ManifestEnd);
        s.run_all();
        assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
        s
    };
    // Not asked: listed, not made; the session ends well.
    let mut s = session(cfg(false));
    let r = s.core.take_report();
    let listed: Vec<_> = r
        .not_made
        .iter()
        .map(|m| (m.path.as_str(), m.kind))
        .collect();
    assert_eq!(
        listed,
        [("dest/run/pipe", "fifo"), ("dest/run/null", "char device")]
    );
    assert_eq!(r.specials, 0);
    assert!(r.problems.is_empty() && s.results().is_empty());
    assert!(std::fs::symlink_metadata(s.path("pipe")).is_err());
    // Asked: the FIFO is made with its mode; the device node is made as
    // root, and where it cannot be, that one is a problem of its own.
    let mut s = session(RecvConfig {
        specials: true,
        devices: true,
        ..cfg(false)
    });
    let m = std::fs::symlink_metadata(s.path("pipe")).unwrap();
    assert!(m.file_type().is_fifo());
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777,
        0o640
    );
    let r = s.core.take_report();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let m = std::fs::symlink_metadata(s.path("null")).unwrap();
        assert!(m.file_type().is_char_device());
        assert_eq!(std::os::unix::fs::MetadataExt::rdev(&m), 259);
        assert_eq!((r.specials, r.not_made.len()), (2, 0));
    } else {
        assert_eq!((r.specials, r.not_made.len(), r.problems.len()), (1, 1, 1));
        assert!(r.not_made[0].why.contains("need root"), "{:?}", r.not_made);
    }
}

#[test]
fn delete_removes_what_the_manifest_does_not_name_unless_the_source_was_not_read_whole() {
    let protect = longhaul_transfer::filter::Filter::new(&[longhaul_transfer::filter::Rule {
        action: longhaul_transfer::filter::Action::Exclude,
        pattern: b"*.keep".to_vec(),
    }])
    .unwrap();
    let mirror = RecvConfig {
        delete: Some(Arc::new(protect)),
        ..cfg(false)
    };
    // The destination holds, beside what is sent: a file, a directory
    // tree, a protected file, and a part file of longhaul's own.
    let session = |unread: bool| {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("dest/run");
        std::fs::create_dir_all(run.join("old/deeper")).unwrap();
        for f in ["extra", "old/deeper/f", "x.keep", "sub/.z.lh-part"] {
            std::fs::create_dir_all(run.join(f).parent().unwrap()).unwrap();
            std::fs::write(run.join(f), b"x").unwrap();
        }
        let mut s = Sim::at(tmp.path(), mirror.clone());
        s._tmp = Some(tmp);
        s.frame(entry(1, "", EntryKind::Dir, 0));
        s.frame(entry(2, "sub", EntryKind::Dir, 0));
        s.frame(file(3, "sub/a", b"abc"));
        if unread {
            s.frame(Frame::EntryError {
                root: 0,
                path: b"unreadable".to_vec(),
                message: "Permission denied".into(),
            });
        }
        s.frame(Frame::ManifestEnd);
        s.send_file(3, b"abc");
        assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
        s
    };
    let mut s = session(false);
    let gone = |p: &str| Change {
        path: format!("dest/run/{p}").into_bytes(),
        what: What::Deleted {
            dir: p.ends_with('/'),
        },
    };
    let gone_list = [
        gone("extra"),
        gone("old/deeper/f"),
        gone("old/deeper/"),
        gone("old/"),
    ];
    let changes: Vec<Change> = gone_list
        .iter()
        .map(|c| Change {
            path: c.path.strip_suffix(b"/").unwrap_or(&c.path).to_vec(),
            what: c.what,
        })
        .collect();
    assert_eq!(s.core.take_report().changes, changes);
    // The receiver says so before its Done.
    assert!(
        s.sent.contains(&Frame::Changes(changes.clone())),
        "{:?}",
        s.sent
    );
    assert!(!s.path("extra").exists() && !s.path("old").exists());
    assert!(s.path("x.keep").exists() && s.path("sub/.z.lh-part").exists());
    assert_eq!(read(&s.path("sub/a")), b"abc");
    // A sender that could not read part of its tree: nothing is removed,
    // and the report says why.
    let mut s = session(true);
    let r = s.core.take_report();
    assert!(r.changes.is_empty());
    assert!(s.path("extra").exists() && s.path("old/deeper/f").exists());
    assert!(
        r.problems
            .iter()
            .any(|p| p.message.contains("nothing deleted")),
        "{:?}",
        r.problems
    );
}

/// A record of chunk `index` of a sparse file of `size` bytes: zeros (no
/// data, its digest) or data.
fn sparse_record(s: &mut Sim, id: u64, size: usize, index: u64, data: Option<&[u8]>) {
    let plan = longhaul_transfer::ChunkPlan::new(size as u64);
    let len = plan.len(index).unwrap() as usize;
    let r = Record {
        stream: id,
        header: RecordHeader {
            id,
            offset: index * CHUNK_SIZE,
            len: len as u32,
            hash: false,
            zeros: data.is_none(),
            sparse: true,
        },
        data: data.map_or(Vec::new(), |d| d.to_vec()),
        hash: None,
        zero_digest: data.is_none().then(|| plan.zero_digest(index)),
    };
    s.core.handle_record(s.now, r);
    s.pump();
}

#[test]
fn a_sparse_file_arrives_with_its_holes_as_holes_and_verified_whole() {
    use std::os::unix::fs::MetadataExt;
    // 3 chunks and a bit: a hole, a chunk with 6 bytes of data in one
    // block, a hole, and a short last chunk that is a hole too.
    let size = 3 * MIB + 5000;
    let mut data = vec![0u8; size];
    data[MIB + 8192..MIB + 8198].copy_from_slice(b"sparse");
    let mut s = Sim::new(cfg(false));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "disk.img", &data));
    s.frame(Frame::ManifestEnd);
    sparse_record(&mut s, 2, size, 0, None);
    sparse_record(&mut s, 2, size, 1, Some(&data[MIB..2 * MIB]));
    sparse_record(&mut s, 2, size, 2, None);
    sparse_record(&mut s, 2, size, 3, None);
    s.frame(done(2, &data));
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
    assert_eq!(s.results(), [(2, Outcome::Verified)]);
    let p = s.path("disk.img");
    assert_eq!(read(&p), data);
    // One 4 KiB block written (tmpfs and ext4 alike), not 3 MiB.
    let blocks = std::fs::metadata(&p).unwrap().blocks();
    assert!(blocks <= 16, "{blocks} blocks of 512 bytes");
    let r = s.core.take_report();
    assert_eq!(r.files[0].bytes_transferred, MIB as u64);
    // A chunk of zeros that carries data is the sender's mistake.
    let mut s = Sim::new(cfg(false));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "x", &data));
    let r = Record {
        stream: 2,
        header: RecordHeader {
            id: 2,
            offset: 0,
            len: MIB as u32,
            hash: false,
            zeros: true,
            sparse: true,
        },
        data: vec![1; 10],
        hash: None,
        zero_digest: Some([0; 32]),
    };
    s.core.handle_record(s.now, r);
    s.pump();
    s.fails_with(Kind::Connection, "a chunk of zeros with data");
}

#[test]
fn a_file_sent_again_drops_its_first_try_and_arrives_as_its_second() {
    let old = bytes(3 * MIB, 1);
    let new = bytes(2 * MIB + 7, 2);
    let mut s = Sim::new(cfg(false));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "f", &old));
    // Two chunks of the first try written, then the sender finds the file
    // changed: it drops it and announces it again.
    s.record(2, 2, 0, &old[..MIB], None);
    s.record(2, 2, 1, &old[MIB..2 * MIB], None);
    s.frame(Frame::FileFailed {
        id: 2,
        message: "f: changed while being sent; sent again".into(),
        vanished: false,
        again: true,
    });
    s.frame(file(3, "f", &new));
    s.frame(Frame::ManifestEnd);
    // (A record of the first try still on its way is dropped.)
    s.record(2, 2, 2, &old[2 * MIB..], None);
    assert_eq!(s.wants().last(), Some(&(3, Want::All)), "{:?}", s.sent);
    s.send_file(3, &new);
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
    // Only the second try is reported, and it is what landed.
    assert_eq!(s.results(), [(3, Outcome::Verified)]);
    assert_eq!(read(&s.path("f")), new);
    let left: Vec<_> = std::fs::read_dir(s.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("f")]);
    let r = s.core.take_report();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

#[test]
fn a_dry_run_wants_no_data_writes_nothing_and_compares_checksums_by_hash_alone() {
    let dry = |sync| RecvConfig {
        dry_run: true,
        sync,
        ..cfg(false)
    };
    // Nothing there: everything would be made or sent; nothing is.
    let mut s = Sim::new(dry(SyncMode::SizeMtime));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(entry(2, "sub", EntryKind::Dir, 0));
    s.frame(file(3, "sub/a", b"abc"));
    s.frame(entry(4, "link", EntryKind::Symlink, 0));
    s.frame(Frame::ManifestEnd);
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
    assert_eq!(s.wants(), [(3, Want::Skip)]);
    assert_eq!(s.results(), [(3, Outcome::WouldSend)]);
    let whats: Vec<(String, What)> = s
        .core
        .take_report()
        .changes
        .into_iter()
        .map(|c| (String::from_utf8(c.path).unwrap(), c.what))
        .collect();
    let new_file = What::File {
        new: true,
        size: false,
        mtime: false,
        checksum: false,
    };
    assert_eq!(
        whats,
        [
            ("dest/run".into(), What::Dir),
            ("dest/run/sub".into(), What::Dir),
            ("dest/run/sub/a".into(), new_file),
            ("dest/run/link".into(), What::Symlink { new: true }),
        ]
    );
    assert!(!s.root.join("dest").exists());
    // --checksum: a file of the same size is hashed on both sides, and
    // no data is wanted; one that matches is skipped, one that does not
    // would be sent. Data sent anyway is refused.
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("dest/run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("same"), b"abc").unwrap();
    std::fs::write(run.join("other"), b"xyz").unwrap();
    let mut s = Sim::at(tmp.path(), dry(SyncMode::Checksum));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "same", b"abc"));
    s.frame(file(3, "other", b"abc"));
    s.frame(Frame::ManifestEnd);
    assert_eq!(s.wants(), [(2, Want::HashOnly), (3, Want::HashOnly)]);
    s.frame(done(2, b"abc"));
    s.frame(done(3, b"abc"));
    assert_eq!(
        s.results(),
        [(2, Outcome::Skipped), (3, Outcome::WouldSend)]
    );
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
    assert_eq!(read(&run.join("other")), b"xyz");
    let mut s = Sim::at(tmp.path(), dry(SyncMode::Checksum));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "same", b"abc"));
    s.record(2, 2, 0, b"abc", Some(*blake3::hash(b"abc").as_bytes()));
    s.fails_with(Kind::Connection, "protocol error");
    assert_eq!(read(&run.join("same")), b"abc");
}

#[test]
fn a_stream_is_read_again_only_once_its_record_is_written() {
    let mut s = Sim::new(cfg(false));
    s.auto = false;
    let a = bytes(3000, 3);
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "a", &a));
    s.run_all();
    s.record(7, 2, 0, &a, Some(*blake3::hash(&a).as_bytes()));
    assert!(s.ready.is_empty(), "the write is not done yet");
    s.run(|j| matches!(j, Job::Write { .. }));
    assert_eq!(s.ready, [7]);
    assert_eq!(s.results(), [(2, Outcome::Verified)]);
}

#[test]
fn the_hash_and_the_last_write_may_come_in_either_order() {
    for hash_first in [true, false] {
        let mut s = Sim::new(cfg(false));
        s.auto = false;
        let big = bytes(2 * MIB, 4);
        s.frame(entry(1, "", EntryKind::Dir, 0));
        s.frame(file(2, "big", &big));
        s.frame(Frame::ManifestEnd);
        s.run_all();
        s.record(1, 2, 0, &big[..MIB], None);
        s.record(2, 2, 1, &big[MIB..], None);
        s.run(|j| matches!(j, Job::Write { index: 0, .. }));
        // Chunk 0 is journaled at once; that checkpoint ends first.
        s.run(|j| matches!(j, Job::Checkpoint { .. }));
        if hash_first {
            s.frame(done(2, &big));
            assert!(
                !s.pending.iter().any(|j| matches!(j, Job::Finish { .. })),
                "no Finish while a write is out"
            );
        }
        s.run(|j| matches!(j, Job::Write { index: 1, .. }));
        if !hash_first {
            assert!(s.pending.is_empty(), "nothing to do without the hash");
            s.frame(done(2, &big));
        }
        s.run(|j| matches!(j, Job::Finish { .. }));
        s.run_all(); // FinishDirs
        assert_eq!(*s.core.state(), State::Finished, "hash first: {hash_first}");
        assert_eq!(read(&s.path("big")), big);
    }
}

#[test]
fn a_small_file_whose_hash_comes_after_its_data_is_parked_then_placed() {
    let mut s = Sim::new(cfg(false));
    let a = bytes(5000, 5);
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "a", &a));
    s.record(1, 2, 0, &a, None);
    assert!(!s.path("a").exists(), "not placed before it is verified");
    s.frame(done(2, &a));
    s.frame(Frame::ManifestEnd);
    assert_eq!(*s.core.state(), State::Finished);
    assert_eq!(read(&s.path("a")), a);
}

#[test]
fn a_durable_session_names_files_only_after_a_commit_and_batches_what_waits() {
    let (a, b, c) = (bytes(3000, 1), bytes(4000, 2), bytes(2 * MIB + 5, 3));
    let mut s = Sim::durable(&[(2, "a", &a), (3, "b", &b), (4, "c", &c)]);
    s.frame(Frame::ManifestEnd);
    s.run_all();
    s.send_file(2, &a);
    s.run(|j| matches!(j, Job::Write { id: 2, .. }));
    // Verified and written, but neither named nor reported: it waits for
    // more to commit with, up to COMMIT_EVERY.
    assert!(!s.path("a").exists());
    assert!(s.results().is_empty());
    assert!(s.pending.is_empty(), "{:?}", s.pending);
    s.now += COMMIT_EVERY;
    s.send_file(3, &b);
    assert!(
        matches!(s.pending.back(), Some(Job::Commit { ids }) if ids == &[2]),
        "{:?}",
        s.pending
    );
    // Files verified while that commit is out wait for the next one, together.
    s.run(|j| matches!(j, Job::Write { id: 3, .. }));
    s.send_file(4, &c);
    while s
        .pending
        .iter()
        .any(|j| matches!(j, Job::Write { .. } | Job::Checkpoint { .. }))
    {
        s.run(|j| matches!(j, Job::Write { .. } | Job::Checkpoint { .. }));
    }
    s.run(|j| matches!(j, Job::Finish { id: 4, .. }));
    assert!(
        !s.path("c").exists(),
        "a large file waits for its commit too"
    );
    let commits = |s: &Sim| {
        s.pending
            .iter()
            .filter(|j| matches!(j, Job::Commit { .. }))
            .count()
    };
    assert_eq!(commits(&s), 1, "one commit out at a time: {:?}", s.pending);
    s.run(|j| matches!(j, Job::Commit { .. }));
    assert_eq!(read(&s.path("a")), a);
    assert_eq!(s.results(), [(2, Outcome::Verified)]);
    assert!(!s.path("b").exists());
    // Nothing else is coming: the rest is committed at once.
    assert!(matches!(s.pending.front(), Some(Job::Commit { ids }) if ids == &[3, 4]));
    s.run_all(); // the second commit, FinishDirs, SyncFs
    assert_eq!(*s.core.state(), State::Finished);
    assert_eq!(read(&s.path("b")), b);
    assert_eq!(read(&s.path("c")), c);
    let ok: Vec<u64> = s.results().into_iter().map(|(id, _)| id).collect();
    assert_eq!(ok, [2, 3, 4]);
    assert!(matches!(
        s.sent.last(),
        Some(Frame::Done {
            ok: true,
            behind_ms: 0
        })
    ));
}

#[test]
fn a_verified_file_is_committed_on_time_even_when_the_sender_goes_silent() {
    let (a, b) = (bytes(3000, 1), bytes(4000, 2));
    let mut s = Sim::durable(&[(2, "a", &a), (3, "b", &b)]);
    s.run_all();
    assert_eq!(s.core.poll_timeout(), None, "nothing waits");
    s.send_file(2, &a);
    s.run(|j| matches!(j, Job::Write { id: 2, .. }));
    assert!(s.pending.is_empty());
    // File 3 never comes: the timer, not another event, sends the commit.
    assert_eq!(s.core.poll_timeout(), Some(s.now + COMMIT_EVERY));
    s.now += COMMIT_EVERY;
    s.core.handle_timeout(s.now);
    s.pump();
    assert!(matches!(s.pending.front(), Some(Job::Commit { ids }) if ids == &[2]));
    assert_eq!(s.core.poll_timeout(), None, "a commit is out");
    s.run_all();
    assert_eq!(read(&s.path("a")), a);
    assert_eq!(s.results(), [(2, Outcome::Verified)]);
}

#[test]
fn a_failed_session_places_its_verified_files_but_never_over_a_newer_copy() {
    let (a, b, c) = (bytes(3000, 1), bytes(4000, 2), bytes(10, 3));
    let mut s = Sim::durable(&[(2, "a", &a), (3, "b", &b), (4, "c", &c)]);
    s.run_all();
    s.send_file(2, &a);
    s.run(|j| matches!(j, Job::Write { id: 2, .. }));
    s.send_file(3, &b);
    s.run(|j| matches!(j, Job::Write { id: 3, .. }));
    // Meanwhile a rerun placed a newer "b"; then this session fails.
    std::fs::write(s.path("b"), b"newer").unwrap();
    s.core
        .handle_failure(crate::report::Problem::new(Kind::Connection, "gone"));
    let (placed, _) = s.disk.close_all();
    s.core.placed_late(placed);
    assert_eq!(read(&s.path("a")), a, "verified, synced and placed");
    assert_eq!(read(&s.path("b")), b"newer", "not replaced");
    let report = s.core.take_report();
    let verified: Vec<&str> = report
        .files
        .iter()
        .filter(|f| f.status == Status::Verified)
        .map(|f| f.path.as_str())
        .collect();
    assert_eq!(verified.len(), 1, "{verified:?}");
    assert!(verified[0].ends_with('a'), "{verified:?}");
}

#[test]
fn fresh_records_wait_for_their_entries_within_a_bound() {
    let mut s = Sim::new(cfg(true));
    let a = bytes(9000, 6);
    s.frame(entry(1, "", EntryKind::Dir, 0));
    // The record overtakes its entry: held, its stream not yet readied.
    s.record(3, 2, 0, &a, Some(*blake3::hash(&a).as_bytes()));
    assert_eq!(s.core.waiting_bytes(), a.len() as u64);
    assert!(s.ready.is_empty());
    s.frame(file(2, "a", &a));
    assert_eq!(s.ready, [3]);
    assert!(s.wants().is_empty(), "a fresh session sends no Want");
    s.frame(Frame::ManifestEnd);
    assert_eq!(*s.core.state(), State::Finished);
    assert_eq!(read(&s.path("a")), a);

    // More than the bound for entries never announced.
    let mut s = Sim::new(cfg(true));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    let chunk = bytes(MIB, 7);
    for id in 10..14 {
        s.record(id, id, 0, &chunk, None);
    }
    assert_eq!(*s.core.state(), State::Running, "4 MiB is the bound");
    s.record(14, 14, 0, &chunk, None);
    s.fails_with(
        Kind::Connection,
        "more than 4.19 MB of data waits for manifest entries (file 14 not announced)",
    );

    // Data for an entry that is not a file.
    let mut s = Sim::new(cfg(true));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.record(1, 2, 0, b"x", None);
    s.frame(entry(2, "d", EntryKind::Dir, 0));
    s.fails_with(Kind::Connection, "data for unknown or settled file 2");

    // Data for an id the manifest never names.
    let mut s = Sim::new(cfg(true));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.record(1, 9, 0, b"x", None);
    s.frame(Frame::ManifestEnd);
    s.fails_with(Kind::Connection, "data for unknown or settled file 9");
}

/// A lost packet holds only what comes after it on its own stream: the
/// records of the other streams are written, verified and placed while that
/// stream waits for its repair. (QUIC delivers each stream in order, so the
/// files behind the loss on the same stream wait too; the sender starts a
/// new stream every `STREAM_BYTES`, which bounds them, but on a slow link,
/// where a round trip is far shorter than a stream's time on the wire.)
#[test]
fn a_lost_packet_holds_only_the_files_behind_it_on_its_stream() {
    let mut s = Sim::new(cfg(true));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    // 40 files of 10 kB on 4 streams, as the sender's lanes take them.
    let files: Vec<(u64, Vec<u8>)> = (2..42u64).map(|id| (id, bytes(10_000, id as u8))).collect();
    for (id, d) in &files {
        s.frame(file(*id, &format!("f{id}"), d));
    }
    let stream = |id: u64| id % 4;
    // Stream 1's third record is lost: it and those behind it wait.
    let held = |id: u64| stream(id) == 1 && id >= 13;
    let send = |s: &mut Sim, id: u64, d: &[u8]| {
        s.record(stream(id), id, 0, d, Some(*blake3::hash(d).as_bytes()))
    };
    for (id, d) in files.iter().filter(|(id, _)| !held(*id)) {
        send(&mut s, *id, d);
    }
    let mut placed: Vec<u64> = s.results().into_iter().map(|(id, _)| id).collect();
    placed.sort();
    let others: Vec<u64> = files.iter().map(|f| f.0).filter(|&id| !held(id)).collect();
    assert_eq!(placed, others, "every file not behind the loss, placed");
    assert!(s.results().iter().all(|(_, o)| *o == Outcome::Verified));
    for (id, d) in &files {
        let p = s.path(&format!("f{id}"));
        if held(*id) {
            assert!(!p.exists(), "f{id} is behind the loss");
        } else {
            assert_eq!(read(&p), *d, "f{id}");
        }
    }
    // The repair comes: the stream's records follow, in order.
    for (id, d) in files.iter().filter(|(id, _)| held(*id)) {
        send(&mut s, *id, d);
    }
    s.frame(Frame::ManifestEnd);
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
    for (id, d) in &files {
        assert_eq!(read(&s.path(&format!("f{id}"))), *d, "f{id}");
    }
}

#[test]
fn a_not_fresh_session_refuses_data_before_its_entry() {
    let mut s = Sim::new(cfg(false));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.record(1, 2, 0, b"x", None);
    s.fails_with(Kind::Connection, "data for unknown or settled file 2");
}

/// A record as (file id, chunk index, data, the hash it carries).
type Rec = (u64, u64, Vec<u8>, Option<[u8; 32]>);

/// A session given `frames`, then `records` (each on stream 1).
fn hostile(frames: Vec<Frame>, records: Vec<Rec>) -> Sim {
    let mut s = Sim::new(cfg(false));
    for f in frames {
        s.frame(f);
    }
    for (id, index, data, hash) in records {
        s.record(1, id, index, &data, hash);
    }
    s
}

#[test]
fn hostile_senders_end_the_session_precisely() {
    let root = || entry(1, "", EntryKind::Dir, 0);
    let cases: Vec<(Sim, Kind, &str)> = vec![
        (
            hostile(vec![root(), file(5, "a", b"x"), file(5, "b", b"y")], vec![]),
            Kind::Connection,
            "entry id 5 after 5: entry ids must rise",
        ),
        (
            hostile(vec![entry(1, "a", EntryKind::File, 1)], vec![]),
            Kind::Connection,
            "entry before its root 0",
        ),
        (
            hostile(vec![root(), file(2, "../x", b"x")], vec![]),
            Kind::Connection,
            "protocol error from the sender",
        ),
        (
            hostile(vec![root(), file(2, ".x.lh-part", b"x")], vec![]),
            Kind::LocalIo,
            "a name longhaul keeps",
        ),
        (
            hostile(
                vec![root(), entry(2, "huge", EntryKind::File, 1 << 50)],
                vec![],
            ),
            Kind::Connection,
            "is larger than the",
        ),
        (
            hostile(
                vec![root(), file(2, "a", &[0; 10])],
                vec![(2, 1, vec![0; 10], None)],
            ),
            Kind::Connection,
            "chunk 1 is beyond the file (10 bytes)",
        ),
        (
            hostile(
                vec![root(), file(2, "a", &[0; 10])],
                vec![(2, 0, vec![0; 9], None)],
            ),
            Kind::Connection,
            "chunk 0 has 9 bytes, expected 10",
        ),
        (
            hostile(
                vec![root(), file(2, "a", &[0; 10])],
                vec![(2, 0, vec![0; 10], None), (2, 0, vec![0; 10], None)],
            ),
            Kind::Connection,
            "chunk 0 sent twice",
        ),
        (
            hostile(
                vec![root(), file(2, "a", &vec![0; MIB + 1])],
                vec![(2, 0, vec![0; MIB], Some([0; 32]))],
            ),
            Kind::Connection,
            "a hash on a record of file 2, which has 2 chunks",
        ),
        (
            hostile(
                vec![
                    root(),
                    file(2, "a", &vec![0; MIB + 1]),
                    done(2, b""),
                    done(2, b""),
                ],
                vec![],
            ),
            Kind::Connection,
            "second FileDone for file 2",
        ),
        (
            hostile(vec![root(), done(7, b"")], vec![]),
            Kind::Connection,
            "FileDone for unknown file 7",
        ),
        (
            hostile(
                vec![
                    root(),
                    Frame::RootError {
                        root: 3,
                        code: ErrorCode::NotFound,
                        message: "x".into(),
                    },
                ],
                vec![],
            ),
            Kind::Connection,
            "RootError for unknown root 3",
        ),
        (
            hostile(
                vec![
                    root(),
                    Frame::Done {
                        ok: true,
                        behind_ms: 0,
                    },
                ],
                vec![],
            ),
            Kind::Connection,
            "unexpected Done",
        ),
    ];
    for (s, kind, needle) in cases {
        s.fails_with(kind, needle);
        // The receiver's own failure is told to the sender.
        let fatal = s.sent.iter().any(|f| matches!(f, Frame::Fatal { .. }));
        assert_eq!(fatal, kind == Kind::LocalIo, "{needle}");
    }
}

#[test]
fn a_file_that_does_not_verify_is_reported_and_removed() {
    let mut s = Sim::new(cfg(false));
    let a = bytes(2000, 8);
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "a", &a));
    s.record(1, 2, 0, &a, Some([9; 32]));
    s.frame(Frame::ManifestEnd);
    assert_eq!(*s.core.state(), State::Finished);
    assert_eq!(
        s.sent.last(),
        Some(&Frame::Done {
            ok: false,
            behind_ms: 0
        })
    );
    match &s.results()[..] {
        [(2, Outcome::Failed { code, message })] => {
            assert_eq!(*code, ErrorCode::Verify);
            assert!(message.contains("BLAKE3 mismatch"), "{message}");
        }
        r => panic!("{r:?}"),
    }
    let names: Vec<_> = std::fs::read_dir(s.path("")).unwrap().collect();
    assert!(names.is_empty(), "neither the file nor its part: {names:?}");
    assert_eq!(s.core.take_report().problems[0].kind, Kind::Verify);
}

#[test]
fn a_file_that_vanished_on_the_sending_side_leaves_no_part_or_journal() {
    let mut s = Sim::new(cfg(false));
    let big = bytes(3 * MIB, 11);
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "big", &big));
    s.frame(Frame::ManifestEnd);
    s.record(1, 2, 0, &big[..MIB], None);
    s.frame(Frame::FileFailed {
        id: 2,
        message: "big: vanished before it was read".into(),
        vanished: true,
        again: false,
    });
    s.run_all();
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
    assert!(matches!(
        s.results()[..],
        [(
            2,
            Outcome::Failed {
                code: ErrorCode::Vanished,
                ..
            }
        )]
    ));
    let left: Vec<_> = std::fs::read_dir(s.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(s.core.take_report().problems[0].kind, Kind::Vanished);
}

#[test]
fn a_hard_link_may_name_only_a_file_of_the_session() {
    let link = |to: &str| {
        let mut s = Sim::new(cfg(false));
        s.frame(entry(1, "", EntryKind::Dir, 0));
        s.frame(file(2, "a", b"data"));
        s.frame(Frame::Entry(Entry {
            link: to.as_bytes().to_vec(),
            ..match entry(3, "b", EntryKind::HardLink, 4) {
                Frame::Entry(e) => e,
                _ => unreachable!(),
            }
        }));
        s
    };
    // A name of the destination this session did not send (or the link
    // itself): refused.
    for to in ["elsewhere", "b"] {
        let mut s = link(to);
        s.run_all();
        s.fails_with(Kind::Connection, "not a file of this session");
    }
    // The file it sent: linked at the end.
    let mut s = link("a");
    s.frame(Frame::ManifestEnd);
    s.send_file(2, b"data");
    s.run_all();
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
    assert_eq!(read(&s.path("b")), b"data");
    assert_eq!(s.core.take_report().hardlinks, 1);
}

#[test]
fn a_file_the_sender_gives_up_fails_alone() {
    let mut s = Sim::new(cfg(false));
    s.auto = false;
    let big = bytes(2 * MIB, 9);
    let b = bytes(100, 10);
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "big", &big));
    s.frame(file(3, "b", &b));
    s.run_all();
    s.record(1, 2, 0, &big[..MIB], None);
    // Given up with a write out; a record of it still on its way.
    s.frame(Frame::FileFailed {
        id: 2,
        message: "the file shrank".into(),
        vanished: false,
        again: false,
    });
    s.record(2, 2, 1, &big[MIB..], None);
    assert_eq!(s.ready, [2], "the late record is dropped at once");
    s.auto = true;
    s.run_all();
    s.send_file(3, &b);
    s.frame(Frame::ManifestEnd);
    assert_eq!(*s.core.state(), State::Finished);
    assert_eq!(
        s.sent.last(),
        Some(&Frame::Done {
            ok: false,
            behind_ms: 0
        })
    );
    assert_eq!(read(&s.path("b")), b);
    assert!(!s.path("big").exists());
    let r = s.core.take_report();
    assert_eq!(r.problems.len(), 1);
    assert_eq!(r.problems[0].kind, Kind::Remote);
}

#[test]
fn an_interrupted_file_resumes_from_its_journal() {
    let big = bytes(3 * MIB, 11);
    let tmp = tempfile::tempdir().unwrap();
    let start = |s: &mut Sim| {
        s.frame(entry(1, "", EntryKind::Dir, 0));
        s.frame(file(2, "big", &big));
    };
    let mut s = Sim::at(tmp.path(), cfg(false));
    start(&mut s);
    s.record(1, 2, 0, &big[..MIB], None);
    s.record(1, 2, 2, &big[2 * MIB..], None);
    // The connection drops: the driver keeps what is written.
    s.core.handle_control_end();
    s.fails_with(Kind::Connection, "the sender closed the session early");
    s.disk.close_all();
    drop(s);

    // A rerun wants only the missing chunk, and refuses one it holds.
    let mut s = Sim::at(tmp.path(), cfg(false));
    start(&mut s);
    assert_eq!(s.wants(), [(2, Want::Chunks(vec![(1, 2)]))]);
    s.record(1, 2, 0, &big[..MIB], None);
    s.fails_with(Kind::Connection, "chunk 0 sent twice");
    s.disk.close_all();
    drop(s);

    let mut s = Sim::at(tmp.path(), cfg(false));
    start(&mut s);
    assert_eq!(s.wants(), [(2, Want::Chunks(vec![(1, 2)]))]);
    s.record(1, 2, 1, &big[MIB..2 * MIB], None);
    s.frame(done(2, &big));
    s.frame(Frame::ManifestEnd);
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.sent);
    assert_eq!(read(&s.path("big")), big);
    let r = s.core.take_report();
    assert_eq!(r.files[0].bytes_resumed, 2 * MIB as u64);
    assert_eq!(r.files[0].bytes_transferred, MIB as u64);
    assert!(!s.path(".big.lh-journal").exists());
}

/// The journal's records: (synced, written) chunk counts.
fn journaled(s: &Sim, name: &str, chunks: u64) -> (usize, usize) {
    let f = std::fs::File::open(s.path(name)).unwrap();
    let p = longhaul_transfer::journal::read(f, chunks)
        .unwrap()
        .unwrap();
    (p.synced.len(), p.written.len())
}

#[test]
fn written_chunks_are_journaled_at_once_and_synced_every_few_seconds() {
    let mut s = Sim::new(cfg(false));
    let n = 40u64;
    let data = bytes(n as usize * MIB, 12);
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "big", &data));
    s.auto = false;
    s.run_all();
    let chunk = |i: u64| &data[i as usize * MIB..(i as usize + 1) * MIB];
    let checkpoints = |s: &Sim| -> Vec<bool> {
        s.pending
            .iter()
            .filter_map(|j| match j {
                Job::Checkpoint { sync, .. } => Some(*sync),
                _ => None,
            })
            .collect()
    };
    // The first written chunk is journaled at once, unsynced; chunks written
    // while that checkpoint is out wait for it, then go in the next.
    s.now += Duration::from_millis(300);
    s.record(1, 2, 0, chunk(0), None);
    s.run(|j| matches!(j, Job::Write { .. }));
    assert_eq!(checkpoints(&s), [false]);
    for i in 1..3 {
        s.record(1, 2, i, chunk(i), None);
        s.run(|j| matches!(j, Job::Write { .. }));
    }
    assert_eq!(checkpoints(&s), [false], "one checkpoint out at a time");
    s.run(|j| matches!(j, Job::Checkpoint { .. }));
    assert_eq!(checkpoints(&s), [false], "the next takes what waited");
    s.run_all();
    assert_eq!(journaled(&s, ".big.lh-journal", n), (0, 3));
    // Five seconds after the file opened, a checkpoint syncs first and
    // journals every chunk so far as synced.
    s.now += Duration::from_secs(5);
    s.record(1, 2, 3, chunk(3), None);
    s.run(|j| matches!(j, Job::Write { .. }));
    assert_eq!(checkpoints(&s), [true]);
    s.run_all();
    assert_eq!(journaled(&s, ".big.lh-journal", n), (4, 0));
}

#[test]
fn a_failing_disk_ends_the_session_and_tells_the_sender() {
    let mut s = Sim::new(cfg(false));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    // A regular file where the directory `sub` must go.
    std::fs::write(s.path("sub"), b"in the way").unwrap();
    s.frame(entry(2, "sub", EntryKind::Dir, 0));
    s.fails_with(Kind::LocalIo, "dest/run/sub");
    assert!(matches!(
        s.sent.last(),
        Some(Frame::Fatal {
            code: ErrorCode::Io,
            ..
        })
    ));
}

/// A sender far ahead of a slow disk, fed to the core as the driver
/// (`receiver.rs`) does: a record goes in only while the records in the
/// core's hands (waiting for their entry, or for their write) leave room
/// under a gate equal to the core's bound on waiting data; the manifest
/// trickles in behind the data; jobs complete one at a time, 5 ms of
/// simulated time each, in the order handed out. The tree is shaped like
/// /usr/share scaled down 50 times: nested directories, mostly small files,
/// a few over a chunk, symlinks.
#[test]
fn a_usr_share_shaped_tree_onto_a_slow_disk_completes_with_bounded_buffers() {
    const GATE: u64 = 2 * CHUNK_SIZE;
    const LANES: u64 = 4;
    let mut s = Sim::new(RecvConfig {
        max_waiting: GATE,
        ..cfg(true)
    });
    s.auto = false;
    // The control stream's frames, in the order the sender sends them, and
    // each lane's records.
    let mut control: VecDeque<Frame> = VecDeque::new();
    let mut lanes: Vec<VecDeque<Record>> = (0..LANES).map(|_| VecDeque::new()).collect();
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut links: Vec<String> = Vec::new();
    control.push_back(entry(1, "", EntryKind::Dir, 0));
    let mut id = 1u64;
    for d in 0..64u64 {
        let dir = if d % 4 == 0 {
            format!("d{d}")
        } else {
            format!("d{}/s{d}", d - d % 4)
        };
        id += 1;
        control.push_back(entry(id, &dir, EntryKind::Dir, 0));
        for f in 0..15u64 {
            id += 1;
            let name = format!("{dir}/f{f}");
            if f == 14 && d % 2 == 0 {
                control.push_back(entry(id, &name, EntryKind::Symlink, 0));
                links.push(name);
                continue;
            }
            // 200 B to 24 kB, and one file in 40 of 1-3 chunks.
            let size = if (d * 15 + f) % 40 == 7 {
                CHUNK_SIZE as usize * (1 + (f as usize % 3)) + 999
            } else {
                200 + ((d * 7919 + f * 104_729) % 24_000) as usize
            };
            let data = bytes(size, (d * 15 + f) as u8);
            control.push_back(file(id, &name, &data));
            let chunks: Vec<&[u8]> = data.chunks(MIB).collect();
            let one = chunks.len() == 1;
            for (i, c) in chunks.iter().enumerate() {
                let lane = &mut lanes[((id + i as u64) % LANES) as usize];
                lane.push_back(Record {
                    stream: (id + i as u64) % LANES,
                    header: RecordHeader {
                        id,
                        offset: i as u64 * CHUNK_SIZE,
                        len: c.len() as u32,
                        hash: one,
                        zeros: false,
                        sparse: false,
                    },
                    data: c.to_vec(),
                    hash: one.then(|| *blake3::hash(&data).as_bytes()),
                    zero_digest: None,
                });
            }
            if !one {
                control.push_back(done(id, &data));
            }
            files.push((name, data));
        }
    }
    control.push_back(Frame::ManifestEnd);
    let total = files.len();
    assert!(total > 800, "{total} files");

    // The network: every step, two control frames and whatever records the
    // gate lets through; the disk: one job per step.
    let (mut in_hand, mut most_in_hand, mut ahead, mut returned) = (0u64, 0u64, 0usize, 0usize);
    let mut entries_seen = 0u64;
    let mut steps = 0u32;
    while *s.core.state() == State::Running {
        steps += 1;
        assert!(steps < 200_000, "stalled: {} jobs pending", s.pending.len());
        for _ in 0..2 {
            if let Some(f) = control.pop_front() {
                if let Frame::Entry(e) = &f {
                    entries_seen = e.id;
                }
                s.core.handle_frame(s.now, f);
            }
        }
        for lane in lanes.iter_mut() {
            while let Some(r) = lane.front() {
                let len = (r.data.len() as u64).max(1);
                if in_hand + len > GATE {
                    break;
                }
                let r = lane.pop_front().unwrap();
                ahead += usize::from(r.header.id > entries_seen);
                in_hand += len;
                most_in_hand = most_in_hand.max(in_hand);
                s.core.handle_record(s.now, r);
            }
        }
        s.pump();
        if let Some(j) = s.pending.pop_front() {
            s.now += Duration::from_millis(5);
            let d = s.disk.run(j);
            s.core.handle_done(s.now, d);
            s.pump();
        }
        if s.core.poll_timeout().is_some_and(|t| t <= s.now) {
            s.core.handle_timeout(s.now);
            s.pump();
        }
        for b in s.returned.drain(..) {
            in_hand -= b;
            returned += 1;
        }
    }
    assert_eq!(*s.core.state(), State::Finished, "{:?}", s.core.state());
    assert_eq!(
        s.sent.last(),
        Some(&Frame::Done {
            ok: true,
            behind_ms: 0
        })
    );
    assert!(most_in_hand <= GATE, "{most_in_hand} bytes in hand");
    assert!(ahead > 50, "only {ahead} records came before their entry");
    assert_eq!(in_hand, 0, "every buffer came back");
    assert!(
        returned > total,
        "{returned} buffers back for {total} files"
    );
    for (name, data) in &files {
        assert!(read(&s.path(name)) == *data, "{name} differs");
    }
    for l in &links {
        assert_eq!(std::fs::read_link(s.path(l)).unwrap(), Path::new("target"));
    }
}

#[test]
fn a_shard_plans_from_the_whole_manifest_then_wants_only_its_part() {
    use longhaul_transfer::shard::Shard;
    let tmp = tempfile::tempdir().unwrap();
    let sharding = crate::sharding::Sharding {
        shard: Shard::new(1, 2).unwrap(),
        plan_file: crate::sharding::PlanAt::Path(tmp.path().join(".longhaul.lh-plan")),
        source: "run".into(),
    };
    let mut s = Sim::at(
        tmp.path(),
        RecvConfig {
            shard: Some((sharding.shard, None)),
            ..cfg(false)
        },
    );
    let base = Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).unwrap();
    s.disk = RecvDisk::new(base, false).with_sharding(Some(sharding.clone()));
    let (a, big, z) = (bytes(1000, 1), bytes(4 * MIB, 2), bytes(1000, 3));
    s.frame(entry(1, "", EntryKind::Dir, 0));
    s.frame(file(2, "a", &a));
    s.frame(file(3, "big", &big));
    s.frame(file(4, "z", &z));
    // Nothing is wanted before the plan, which needs the whole listing.
    assert!(!s.sent.iter().any(|f| matches!(f, Frame::Want { .. })));
    s.frame(Frame::ManifestEnd);
    // The files laid end to end: a (1000 bytes), big (4 MiB), z (1000):
    // half is 2 MiB + 1000, where big's chunk 2 starts.
    let wants: Vec<&Frame> = s
        .sent
        .iter()
        .filter(|f| matches!(f, Frame::Want { .. }))
        .collect();
    assert_eq!(
        wants,
        [
            &Frame::Want {
                id: 2,
                want: Want::Skip
            },
            &Frame::Want {
                id: 3,
                want: Want::Slice {
                    first: 2,
                    end: 4,
                    send: vec![(2, 4)]
                }
            },
            &Frame::Want {
                id: 4,
                want: Want::All
            },
        ]
    );
    assert!(
        tmp.path().join(".longhaul.lh-plan").is_file(),
        "the plan file is written"
    );
    // Its part: chunks 2 and 3, checked against the slice digest; the file
    // waits for shard 1.
    let plan = longhaul_transfer::ChunkPlan::new(big.len() as u64);
    let mut cvs = Vec::new();
    for i in 2..4u64 {
        let c = &big[i as usize * MIB..(i as usize + 1) * MIB];
        let mut h = plan.hasher(i);
        h.update(c);
        cvs.push(h.finish());
        s.record(3, 3, i, c, None);
    }
    s.frame(Frame::FileDone {
        id: 3,
        hash: plan.slice_digest(2, &cvs),
        unchanged: false,
    });
    s.send_file(4, &z);
    let r = s.core.take_report();
    let status = |p: &str| r.files.iter().find(|f| f.path.ends_with(p)).unwrap().status;
    assert_eq!(status("big"), Status::Slice);
    assert_eq!(status("z"), Status::Verified);
    assert_eq!(r.other_shards, 1);
    assert!(!s.path("big").exists());
    assert_eq!(std::fs::read(s.path("z")).unwrap(), z);
}
