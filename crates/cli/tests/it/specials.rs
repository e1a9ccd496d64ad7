//! FIFOs, sockets and device nodes: a receiver lists each as not made
//! unless asked (`--specials`, `--devices`), never drops one silently; asked,
//! it makes them with their kind, mode, mtime and device number, so that
//! rsync itself then finds nothing to change. A put's server makes FIFOs and
//! sockets when asked, and never device nodes.

use longhaul_testkit::*;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

pub(crate) fn root_user() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn mknod(p: &Path, kind: libc::mode_t, mode: u32, dev: libc::dev_t) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    let r = unsafe { libc::mknod(c.as_ptr(), kind | mode, dev) };
    assert_eq!(
        r,
        0,
        "mknod {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    set_mode(p, mode);
}

/// A tree with a file, a FIFO, a socket's name and, as root, a character
/// and a block device; the specials' kinds by name.
pub(crate) fn tree(src: &Path) -> BTreeMap<&'static str, &'static str> {
    std::fs::create_dir_all(src.join("sub")).unwrap();
    gen_file(&src.join("f.bin"), 1, 5000);
    mknod(&src.join("sub/pipe"), libc::S_IFIFO, 0o640, 0);
    drop(std::os::unix::net::UnixListener::bind(src.join("sub/sock")).unwrap());
    set_mode(&src.join("sub/sock"), 0o755);
    let mut kinds = BTreeMap::from([("sub/pipe", "fifo"), ("sub/sock", "socket")]);
    if root_user() {
        mknod(
            &src.join("sub/null"),
            libc::S_IFCHR,
            0o600,
            libc::makedev(1, 3),
        );
        mknod(
            &src.join("sub/loop"),
            libc::S_IFBLK,
            0o660,
            libc::makedev(7, 200),
        );
        kinds.insert("sub/null", "char device");
        kinds.insert("sub/loop", "block device");
    }
    for (i, name) in kinds.keys().enumerate() {
        let p = src.join(name);
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let t = libc::timespec {
            tv_sec: 1_600_000_000 + i as i64,
            tv_nsec: 123_000_000,
        };
        // SAFETY: a NUL-terminated path and two timespecs.
        let r = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                [t, t].as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        assert_eq!(r, 0);
    }
    kinds
}

/// The `not_made` list of a report: path → (kind, why).
fn not_made(j: &serde_json::Value) -> BTreeMap<String, (String, String)> {
    j["not_made"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap().to_string();
            (s("path"), (s("kind"), s("why")))
        })
        .collect()
}

/// `a` and `b` are the same kind of node, with the same permissions, mtime
/// and device number.
fn same_node(a: &Path, b: &Path) {
    let (x, y) = (
        std::fs::symlink_metadata(a).unwrap(),
        std::fs::symlink_metadata(b).unwrap(),
    );
    let kind = |m: &std::fs::Metadata| {
        let t = m.file_type();
        (
            t.is_fifo(),
            t.is_socket(),
            t.is_char_device(),
            t.is_block_device(),
        )
    };
    assert_eq!(kind(&x), kind(&y), "{}", b.display());
    assert_eq!(x.mode(), y.mode(), "{}", b.display());
    assert_eq!(x.rdev(), y.rdev(), "{}", b.display());
    assert_eq!(
        (x.mtime(), x.mtime_nsec()),
        (y.mtime(), y.mtime_nsec()),
        "{}",
        b.display()
    );
}

#[test]
fn specials_are_listed_as_not_made_unless_asked_and_made_as_they_were_when_asked() {
    let t = Tmp::new("specials");
    let root = t.join("root");
    let kinds = tree(&root.join("tree"));
    let srv = ServeCfg::new(&root, &t.join("state")).writable().start();
    let c = Client::new(t.join("known_hosts"));
    let get = |dest: &Path, extra: &[&str]| {
        let mut a: Vec<OsString> = ["--accept-new", "--json"].map(OsString::from).to_vec();
        a.extend(extra.iter().map(OsString::from));
        a.extend([remote(srv.port, "tree/"), dest.into()]);
        let out = c.run("get", a);
        out.expect_code(0);
        out.json()
    };

    // Not asked: every special is listed, with its kind and why; none made.
    let plain = t.join("plain");
    let j = get(&plain, &[]);
    let listed = not_made(&j);
    assert_eq!(listed.len(), kinds.len(), "{j:#}");
    for (name, kind) in &kinds {
        let (k, why) = &listed[&format!("plain/{name}")];
        assert_eq!(k, kind);
        assert!(
            why.contains("--specials") || why.contains("--devices"),
            "{why}"
        );
        assert!(
            std::fs::symlink_metadata(plain.join(name)).is_err(),
            "{name} was made"
        );
    }
    assert_eq!(totals(&j, "specials"), 0);
    assert_eq!(
        hash_file(&plain.join("f.bin")),
        hash_file(&root.join("tree/f.bin"))
    );

    // Asked: made as they were; rsync finds nothing to change.
    let asked = t.join("asked");
    let j = get(&asked, &["--specials", "--devices"]);
    assert!(not_made(&j).is_empty(), "{j:#}");
    assert_eq!(totals(&j, "specials"), kinds.len() as u64);
    for name in kinds.keys() {
        same_node(&root.join("tree").join(name), &asked.join(name));
    }
    assert_eq!(rsync_changes("-naiD", &root.join("tree"), &asked), "");

    // A put: the server makes the FIFO and the socket's name it is asked
    // for, and no device node.
    let out = c.run(
        "put",
        [
            OsString::from("--specials"),
            "--json".into(),
            root.join("tree").into(),
            remote(srv.port, "up"),
        ],
    );
    out.expect_code(0);
    let j = out.json();
    let up = root.join("up/tree");
    let mut made = 0;
    for (name, kind) in &kinds {
        if kind.ends_with("device") {
            assert!(
                std::fs::symlink_metadata(up.join(name)).is_err(),
                "{name} was made"
            );
            let listed = not_made(&j);
            let (_, why) = listed.get(*name).unwrap_or_else(|| panic!("{j:#}"));
            assert_eq!(why, "a server does not make device nodes");
        } else {
            same_node(&root.join("tree").join(name), &up.join(name));
            made += 1;
        }
    }
    assert_eq!(totals(&j, "specials"), made);
}
