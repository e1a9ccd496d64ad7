//! Hard links within a tree: the file's data crosses once, and its other
//! names are linked to it at the destination, by a get and by a put, so
//! that rsync -H finds nothing to change; a rerun keeps them linked.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// `names` under `dir` are one file: one inode, `names.len()` links.
fn one_file(dir: &Path, names: &[&str]) {
    let m: Vec<_> = names
        .iter()
        .map(|n| std::fs::symlink_metadata(dir.join(n)).unwrap())
        .collect();
    let listing = std::process::Command::new("find")
        .args([dir.to_str().unwrap(), "-printf", "%i %n %p\n"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    for (n, x) in names.iter().zip(&m) {
        assert_eq!((x.dev(), x.ino()), (m[0].dev(), m[0].ino()), "{n}");
        assert_eq!(x.nlink(), names.len() as u64, "{n}\n{listing}");
    }
}

#[test]
fn a_file_of_three_names_crosses_once_and_arrives_with_three_names() {
    let t = Tmp::new("hardlinks");
    let root = t.join("root");
    let src = root.join("tree");
    for d in ["a", "b", "c"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    const SIZE: u64 = 3 * MIB + 7;
    gen_file(&src.join("a/f"), 1, SIZE);
    std::fs::hard_link(src.join("a/f"), src.join("a/g")).unwrap();
    std::fs::hard_link(src.join("a/f"), src.join("b/h")).unwrap();
    gen_file(&src.join("c/single"), 2, 1000);
    let names = ["a/f", "a/g", "b/h"];
    let srv = ServeCfg::new(&root, &t.join("state")).writable().start();
    let c = Client::new(t.join("known_hosts"));
    let dest = t.join("dest");
    let get = || {
        let out = c.run(
            "get",
            [
                OsString::from("--accept-new"),
                "--json".into(),
                remote(srv.port, "tree/"),
                dest.clone().into(),
            ],
        );
        out.expect_code(0);
        out.json()
    };

    let j = get();
    assert_eq!(totals(&j, "hardlinks"), 2, "{j:#}");
    assert_eq!(totals(&j, "verified"), 2, "{j:#}");
    assert_eq!(
        totals(&j, "bytes_transferred"),
        SIZE + 1000,
        "the data crossed once"
    );
    one_file(&dest, &names);
    assert_eq!(hash_file(&dest.join("b/h")), hash_file(&src.join("a/f")));
    assert_eq!(rsync_changes("-naiH", &src, &dest), "");

    // Again: nothing crosses, the names stay one file.
    let j = get();
    assert_eq!(totals(&j, "bytes_transferred"), 0, "{j:#}");
    assert_eq!(totals(&j, "hardlinks"), 2);
    one_file(&dest, &names);

    // A put: the server links them too.
    let out = c.run(
        "put",
        [
            OsString::from("--json"),
            src.clone().into(),
            remote(srv.port, "up"),
        ],
    );
    out.expect_code(0);
    assert_eq!(totals(&out.json(), "hardlinks"), 2);
    one_file(&root.join("up/tree"), &names);
    assert_eq!(rsync_changes("-naiH", &src, &root.join("up/tree")), "");
}
