//! Volume: one 1 GiB file, and 20,000 files of 10 kB behind a large file in one get
//! and back with a put. Slow by nature (tens of seconds on 2 cores in the dev
//! profile); prints its timings.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::path::Path;
use std::time::Instant;

const BIG: u64 = 1 << 30;
const SMALL_COUNT: u64 = 20_000;
const SMALL_SIZE: usize = 10_000;
/// The soft open-files limit most systems give a login session.
const NOFILE: u64 = 1024;
/// A tight one, for the tests of descriptors held per file or level.
const TIGHT: u64 = 256;

/// `op` with `args` run as `c` with at most `nofile` open files; prints
/// how long it took, for `what`.
fn run_limited(c: &Client, op: &str, args: Vec<OsString>, nofile: u64, what: &str) -> Out {
    let mut cmd = c.cmd(op, args);
    limit_nofile(&mut cmd, nofile);
    let t0 = Instant::now();
    let out = run(cmd);
    eprintln!("{op} of {what}: {:?}", t0.elapsed());
    out
}

fn small_files(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    // 20,000 distinct files (each begins with its own index, then seeded bytes).
    let pool = gen_bytes(7, SMALL_SIZE + SMALL_COUNT as usize);
    for i in 0..SMALL_COUNT as usize {
        let mut data = pool[i..i + SMALL_SIZE].to_vec();
        data[..8].copy_from_slice(&(i as u64).to_le_bytes());
        std::fs::write(dir.join(format!("f{i:05}.dat")), data).unwrap();
    }
}

#[test]
fn one_gib_file() {
    let t = Tmp::new("bulk-gib");
    let root = t.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let started = Instant::now();
    gen_file(&root.join("big.bin"), 42, BIG);
    let big_hash = hash_file(&root.join("big.bin"));
    eprintln!("generated and hashed 1 GiB in {:?}", started.elapsed());

    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let out = c.run(
        "get",
        [
            OsString::from("--accept-new"),
            "--json".into(),
            srv.remote("big.bin"),
            dest.clone().into(),
        ],
    );
    out.expect_code(0);
    let j = out.json();
    eprintln!(
        "get of 1 GiB: {:.2} s, {:.0} Mbit/s, {} retransmitted bytes",
        j["seconds"].as_f64().unwrap(),
        j["rate_mbps"].as_f64().unwrap(),
        j["retransmitted_bytes"]
    );
    assert_eq!(j["ok"], true);
    assert_eq!(totals(&j, "files"), 1);
    assert_eq!(totals(&j, "verified"), 1);
    assert_eq!(totals(&j, "bytes"), BIG);
    assert_eq!(totals(&j, "bytes_transferred"), BIG);
    let rx = j["udp_rx_bytes"].as_u64().unwrap();
    assert!(
        (BIG..BIG + BIG / 10).contains(&rx),
        "udp_rx_bytes is the payload plus a few % of overhead: {rx}"
    );
    assert_eq!(
        files_by_path(&j)["big.bin"]["blake3"].as_str(),
        Some(big_hash.to_hex().as_str())
    );
    assert_eq!(hash_file(&dest.join("big.bin")), big_hash);
    // DEST itself is not a copy of the root: compare what is inside.
    let inside = Compare {
        top_meta: false,
        ..Compare::ALL
    };
    assert_same_tree(&root, &dest, inside);
    eprintln!("whole 1 GiB test: {:?}", started.elapsed());
}

/// 20,000 small files queued behind a 100 MiB file, with the usual soft limit of
/// 1024 open files on both sides: the receiver must not hold a descriptor for every
/// file the manifest announced but whose data has not arrived yet.
#[test]
fn twenty_thousand_small_files_with_1024_open_files() {
    let t = Tmp::new("bulk-small");
    let root = t.join("root");
    let small = root.join("small");
    let started = Instant::now();
    small_files(&small);
    gen_file(&root.join("lead.bin"), 43, 100 * MIB);
    eprintln!(
        "generated 20,000 x 10 kB + 100 MiB in {:?}",
        started.elapsed()
    );

    let srv = ServeCfg::new(&root, &t.join("state"))
        .writable()
        .nofile(NOFILE)
        .start();
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let args = vec![
        "--accept-new".into(),
        "--json".into(),
        srv.remote("lead.bin"),
        srv.remote("small"),
        dest.clone().into(),
    ];
    let out = run_limited(&c, "get", args, NOFILE, "20,000 files");
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["ok"], true);
    assert_eq!(totals(&j, "files"), SMALL_COUNT + 1);
    assert_eq!(totals(&j, "verified"), SMALL_COUNT + 1);
    assert_eq!(
        totals(&j, "bytes"),
        100 * MIB + SMALL_COUNT * SMALL_SIZE as u64
    );
    assert_same_tree(&root, &dest, Compare::CONTENT);
    assert_same_tree(&small, &dest.join("small"), Compare::ALL);

    // And back up with a put (the server is the receiver now).
    let args = vec![
        "--json".into(),
        small.clone().into(),
        srv.remote("uploaded/"),
    ];
    let out = run_limited(&c, "put", args, NOFILE, "20,000 files");
    out.expect_code(0);
    assert_eq!(totals(&out.json(), "verified"), SMALL_COUNT);
    assert_same_tree(&small, &root.join("uploaded/small"), Compare::ALL);
    eprintln!("whole small-files test: {:?}", started.elapsed());
}

/// A chain of `depth` directories `d/d/...` beneath `base`, with `leaf`
/// holding `data` at the bottom, made one level at a time (the whole path
/// is longer than PATH_MAX).
fn deep_chain(base: &Path, depth: usize, data: &[u8]) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    std::fs::create_dir_all(base).unwrap();
    let mut dir: OwnedFd = std::fs::File::open(base).unwrap().into();
    for _ in 0..depth {
        // SAFETY: plain syscalls on a descriptor we own and a C string.
        unsafe {
            assert_eq!(libc::mkdirat(dir.as_raw_fd(), c"d".as_ptr(), 0o755), 0);
            let fd = libc::openat(
                dir.as_raw_fd(),
                c"d".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            );
            assert!(fd >= 0);
            dir = OwnedFd::from_raw_fd(fd);
        }
    }
    // SAFETY: as above.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c"leaf".as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o644,
        )
    };
    assert!(fd >= 0);
    // SAFETY: a descriptor just opened, owned by the File from here on.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    std::io::Write::write_all(&mut f, data).unwrap();
}

/// The bottom of a chain made by [`deep_chain`]: its depth and its leaf's bytes.
fn read_chain(base: &Path) -> (usize, Vec<u8>) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut dir: OwnedFd = std::fs::File::open(base).unwrap().into();
    let mut depth = 0;
    loop {
        // SAFETY: plain syscalls on a descriptor we own and a C string.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c"d".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            )
        };
        if fd < 0 {
            break;
        }
        // SAFETY: a descriptor just opened.
        dir = unsafe { OwnedFd::from_raw_fd(fd) };
        depth += 1;
    }
    // SAFETY: as above.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c"leaf".as_ptr(), libc::O_RDONLY) };
    assert!(fd >= 0, "no leaf at depth {depth}");
    // SAFETY: a descriptor just opened, owned by the File from here on.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut data).unwrap();
    (depth, data)
}

/// A tree 2,000 directories deep goes up with a put and back with a get
/// when both sides may open 256 files: the walk keeps a few levels open,
/// not one per level.
#[test]
fn a_tree_2000_deep_with_256_open_files() {
    const DEPTH: usize = 2000;
    let t = Tmp::new("bulk-deep");
    deep_chain(&t.join("src/deep"), DEPTH, b"at the bottom");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = ServeCfg::new(&root, &t.join("state"))
        .writable()
        .nofile(TIGHT)
        .start();
    let c = Client::new(t.join("kh"));
    let args = vec![
        "--accept-new".into(),
        "--quiet".into(),
        t.join("src/deep").into(),
        srv.remote(""),
    ];
    run_limited(&c, "put", args, TIGHT, "a 2,000-deep tree").expect_code(0);
    assert_eq!(
        read_chain(&root.join("deep")),
        (DEPTH, b"at the bottom".to_vec())
    );

    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let args = vec!["--quiet".into(), srv.remote("deep"), dest.clone().into()];
    run_limited(&c, "get", args, TIGHT, "a 2,000-deep tree").expect_code(0);
    assert_eq!(
        read_chain(&dest.join("deep")),
        (DEPTH, b"at the bottom".to_vec())
    );
}

/// 2,000 files of two chunks each go down with a get (durable: complete
/// files wait for their commit) and up with a put when both sides may open
/// 256 files: a process keeps at most its budget of parts locked (set up or
/// written), and a file waiting for its commit holds none. The sources are
/// sparse (eight bytes of their own, then a hole), so the test writes what
/// it receives, not what it sends.
#[test]
fn two_thousand_large_files_with_256_open_files() {
    const FILES: usize = 2000;
    let t = Tmp::new("bulk-large");
    let src = t.join("root/large");
    std::fs::create_dir_all(&src).unwrap();
    let size = longhaul_transfer::CHUNK_SIZE + 1;
    for i in 0..FILES {
        let f = std::fs::File::create(src.join(format!("f{i:04}"))).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, &(i as u64).to_le_bytes(), 0).unwrap();
        f.set_len(size).unwrap();
    }
    let root = t.join("root");
    let srv = ServeCfg::new(&root, &t.join("state"))
        .writable()
        .nofile(TIGHT)
        .start();
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let what = "2,000 files of 1 MiB + 1";
    let args: Vec<OsString> = vec![
        "--quiet".into(),
        "--accept-new".into(),
        srv.remote("large"),
        dest.clone().into(),
    ];
    run_limited(&c, "get", args, TIGHT, what).expect_code(0);
    assert_same_tree(&src, &dest.join("large"), Compare::CONTENT);

    let args: Vec<OsString> = vec![
        "--quiet".into(),
        "--no-fsync".into(),
        dest.join("large").into(),
        srv.remote("up/"),
    ];
    run_limited(&c, "put", args, TIGHT, what).expect_code(0);
    assert_same_tree(&src, &root.join("up/large"), Compare::CONTENT);
}
