//! Modes within reason: the far side never changes the destination's own
//! mode or mtime, and setuid, setgid, sticky and world-write bits arrive
//! dropped unless the receiving side asks for them (`--exact-modes`).

use longhaul_testkit::*;
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// `src/` with a setuid+setgid world-writable file, a sticky world-writable
/// directory holding a file, and a plain file; `src` itself 0777, mtime 2001.
fn source(t: &Tmp) -> std::path::PathBuf {
    let src = t.join("src");
    std::fs::create_dir_all(src.join("sticky")).unwrap();
    std::fs::write(src.join("suid"), b"#!/bin/sh\n").unwrap();
    std::fs::write(src.join("plain"), b"plain").unwrap();
    std::fs::write(src.join("sticky/in"), b"in").unwrap();
    set_mode(&src.join("suid"), 0o6777);
    set_mode(&src.join("plain"), 0o640);
    set_mode(&src.join("sticky"), 0o1777);
    set_mode(&src, 0o777);
    set_mtime_ns(&src, 1_000_000_000_000_000_000);
    src
}

#[test]
fn a_put_cannot_plant_setuid_files_nor_change_the_served_root() {
    let t = Tmp::new("modes-put");
    let src = source(&t);
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    set_mode(&root, 0o755);
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let mut slash = src.clone().into_os_string();
    slash.push("/");
    let put = |srv: &Server, dest: &str| {
        c.run(
            "put",
            [
                OsString::from("--accept-new"),
                slash.clone(),
                srv.remote(dest),
            ],
        )
    };
    put(&srv, "").expect_code(0);
    assert_eq!(mode(&root), 0o755, "the served root's mode");
    // Not the sender's (2001); entries made in it move it, as the kernel
    // does for any directory written into.
    assert_ne!(
        std::fs::metadata(&root).unwrap().mtime(),
        1_000_000_000,
        "the served root's mtime"
    );
    assert_eq!(mode(&root.join("suid")), 0o775);
    assert_eq!(mode(&root.join("sticky")), 0o775);
    assert_eq!(mode(&root.join("plain")), 0o640);
    assert_eq!(std::fs::read(root.join("sticky/in")).unwrap(), b"in");
    // A directory below the root takes the sender's mode, within reason.
    put(&srv, "sub").expect_code(0);
    assert_eq!(mode(&root.join("sub")), 0o775);
    assert_eq!(mode(&root.join("sub/suid")), 0o775);
    srv.kill();

    // A server that asks for exact modes gets them.
    let srv = ServeCfg::new(&root, &t.join("state"))
        .writable()
        .arg("--exact-modes")
        .start();
    put(&srv, "exact").expect_code(0);
    assert_eq!(mode(&root.join("exact")), 0o777);
    assert_eq!(mode(&root.join("exact/suid")), 0o6777);
    assert_eq!(mode(&root.join("exact/sticky")), 0o1777);
}

#[test]
fn a_get_drops_the_servers_special_bits_unless_asked() {
    let t = Tmp::new("modes-get");
    let src = source(&t);
    let srv = Server::start(&src, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let (d1, d2) = (t.join("d1"), t.join("d2"));
    for (d, extra, suid, sticky) in [
        (&d1, None, 0o775, 0o775),
        (&d2, Some("--exact-modes"), 0o6777, 0o1777),
    ] {
        std::fs::create_dir(d).unwrap();
        set_mode(d, 0o700);
        let mut args = vec![OsString::from("--accept-new")];
        args.extend(extra.map(OsString::from));
        args.extend([srv.remote(""), d.clone().into_os_string()]);
        c.run("get", args).expect_code(0);
        assert_eq!(mode(d), 0o700, "the destination keeps its own mode");
        assert_eq!(mode(&d.join("suid")), suid);
        assert_eq!(mode(&d.join("sticky")), sticky);
        assert_eq!(mode(&d.join("plain")), 0o640);
    }
}
