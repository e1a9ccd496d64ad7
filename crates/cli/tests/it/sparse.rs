//! Sparse files: a 4 GiB file holding a few extents of data crosses as its
//! data (holes go as headers without data), arrives with its holes as holes
//! (no more blocks than the source's, give or take), and verifies whole:
//! the BLAKE3 in the report is that of the whole logical file.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

const GIB: u64 = 1 << 30;

/// A sparse file of `size` bytes with `extents` (offset, bytes) written.
fn sparse(p: &Path, size: u64, extents: &[(u64, &[u8])]) {
    let f = std::fs::File::create(p).unwrap();
    f.set_len(size).unwrap();
    for &(off, data) in extents {
        f.write_all_at(data, off).unwrap();
    }
}

/// Blocks of 512 bytes a file holds.
fn blocks(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks()
}

#[test]
fn a_sparse_file_crosses_as_its_data_and_arrives_with_its_holes() {
    let t = Tmp::new("sparse");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("src")).unwrap();
    // Data in 3 places, one across a chunk boundary; a hole at the end.
    let big = root.join("src/disk.img");
    let across = vec![7u8; 10_000];
    sparse(
        &big,
        4 * GIB,
        &[
            (1_000_000_000, b"hello!"),
            ((3 << 20) - 5000, &across),
            (3 * GIB + 123, b"x"),
        ],
    );
    // A file of one chunk with a hole at its end, and one all hole.
    let small = root.join("src/small");
    sparse(&small, 600_000, &[(0, b"head")]);
    let empty = root.join("src/holes");
    sparse(&empty, 3 << 20, &[]);
    let src_blocks = blocks(&big);
    if src_blocks * 512 >= 4 * GIB {
        eprintln!("SKIP: this file system does not keep holes");
        return;
    }
    let srv = ServeCfg::new(&root, &t.join("state")).writable().start();
    let c = Client::new(t.join("known_hosts"));
    let files = [("disk.img", &big), ("small", &small), ("holes", &empty)];
    let hashes: Vec<blake3::Hash> = files.iter().map(|(_, p)| hash_file(p)).collect();
    let check = |dest: &Path, j: &serde_json::Value| {
        for ((name, src), hash) in files.iter().zip(&hashes) {
            let got = dest.join(name);
            assert_eq!(hash_file(&got), *hash, "{name}");
            assert!(
                blocks(&got) <= 2 * blocks(src).max(8),
                "{name}: {} blocks here, {} at the source",
                blocks(&got),
                blocks(src)
            );
        }
        // Only the chunks with data crossed: 4 of the big file's 4,096
        // (one extent spans two), and the small file's head.
        let moved = j["totals"]["bytes_transferred"].as_u64().unwrap();
        assert!(moved <= (4 << 20) + 600_000, "{moved} bytes moved");
        let reported = j["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"].as_str().unwrap().ends_with("disk.img"))
            .unwrap()["blake3"]
            .clone();
        assert_eq!(reported, hashes[0].to_hex().as_str(), "{j:#}");
    };
    let dest = t.join("dest");
    let out = c.run(
        "get",
        [
            OsString::from("--accept-new"),
            "--json".into(),
            srv.remote("src/"),
            dest.clone().into(),
        ],
    );
    out.expect_code(0);
    check(&dest, &out.json());
    // A put: the server keeps the holes too.
    let out = c.run(
        "put",
        [
            OsString::from("--json"),
            format!("{}/", root.join("src").display()).into(),
            srv.remote("up/"),
        ],
    );
    out.expect_code(0);
    check(&root.join("up"), &out.json());
}
