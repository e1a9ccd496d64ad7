//! Descriptors follow the data in flight, not the files announced: parts set
//! up or written hold at most the process's budget of locks (and their data
//! descriptors). (A test binary of its own: it counts the process's
//! descriptors.)

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use longhaul_transfer::manifest::{Entry, EntryKind};
use longhaul_transfer::partlock;
use longhaul_transfer::place::Incoming;
use longhaul_transfer::CHUNK_SIZE;
use std::sync::Arc;
use std::time::Duration;

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn parts_set_up_or_written_hold_at_most_the_budget_of_descriptors() {
    const FILES: usize = 2000;
    // As a process whose soft limit is 256 open files (the budget is read
    // once, after this).
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on a struct of their own type.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = 256;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
    }
    let t = tempfile::tempdir().unwrap();
    let dir = Arc::new(Dir::open_ambient_dir(t.path(), ambient_authority()).unwrap());
    let size = CHUNK_SIZE + 1;
    let entry = |i: usize| Entry {
        id: i as u64,
        root: 0,
        path: format!("f{i}").into_bytes(),
        kind: EntryKind::File,
        size,
        mode: 0o644,
        mtime_ns: 1_600_000_000_000_000_000,
        link: vec![],
        owner: Default::default(),
        xattrs: vec![],
        allocated: 0,
    };
    let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let before = open_descriptors();
    let budget = partlock::budget();
    assert_eq!(budget, 16, "a sixteenth of 256");
    let mut peak = 0;
    let mut files: Vec<Incoming> = (0..FILES)
        .map(|i| {
            let name = format!("f{i}");
            let (inc, want) = Incoming::open(
                dir.clone(),
                name.as_bytes(),
                &entry(i),
                false,
                Duration::from_secs(1),
            )
            .unwrap();
            assert_eq!(want, vec![(0, 2)]);
            peak = peak.max(open_descriptors());
            inc
        })
        .collect();
    assert!(partlock::held() <= budget, "{} held", partlock::held());
    assert!(
        peak <= before + budget + 2,
        "{FILES} parts set up: {peak} descriptors at most, {before} before, budget {budget}"
    );

    // Written, each holds its lock and data descriptor; past the budget,
    // those written longest ago give theirs back.
    let chunk = |inc: &mut Incoming, i: u64| {
        let (o, l) = (
            inc.plan.offset(i) as usize,
            inc.plan.len(i).unwrap() as usize,
        );
        let d = Incoming::write_chunk(&inc.writer().unwrap(), &inc.plan, i, &[&bytes[o..o + l]])
            .unwrap();
        inc.record(i, d);
    };
    peak = 0;
    for inc in files.iter_mut() {
        chunk(inc, 0);
        peak = peak.max(open_descriptors());
    }
    assert!(partlock::held() <= budget, "{} held", partlock::held());
    assert!(
        peak <= before + 2 * budget + 2,
        "{FILES} parts half written: {peak} descriptors at most, {before} before, budget {budget}"
    );
    for inc in files.iter_mut() {
        chunk(inc, 1);
        inc.expected = Some(*blake3::hash(&bytes).as_bytes());
    }
    for inc in files {
        inc.finish().unwrap();
    }
    assert_eq!(partlock::held(), 0);
    assert_eq!(open_descriptors(), before);
    for i in [0, FILES / 2, FILES - 1] {
        assert_eq!(
            std::fs::read(t.path().join(format!("f{i}"))).unwrap(),
            bytes
        );
    }
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), FILES);
}
