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
    let mut cmd = c.cmd(
        "get",
        [
            OsString::from("--accept-new"),
            "--json".into(),
            srv.remote("lead.bin"),
            srv.remote("small"),
            dest.clone().into(),
        ],
    );
    limit_nofile(&mut cmd, NOFILE);
    let t0 = Instant::now();
    let out = run(cmd);
    eprintln!("get of 20,000 files: {:?}", t0.elapsed());
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
    let t0 = Instant::now();
    let mut cmd = c.cmd(
        "put",
        [
            OsString::from("--json"),
            small.clone().into(),
            srv.remote("uploaded/"),
        ],
    );
    limit_nofile(&mut cmd, NOFILE);
    let out = run(cmd);
    eprintln!("put of 20,000 files: {:?}", t0.elapsed());
    out.expect_code(0);
    assert_eq!(totals(&out.json(), "verified"), SMALL_COUNT);
    assert_same_tree(&small, &root.join("uploaded/small"), Compare::ALL);
    eprintln!("whole small-files test: {:?}", started.elapsed());
}
