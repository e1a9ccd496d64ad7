//! Owners and groups, extended attributes and POSIX ACLs: as root, a get
//! with `--xattrs --acls` and a put to a server that keeps owners leave
//! `rsync -naiHAX --numeric-ids` nothing to change; a server that does not
//! keep owners gives a put's files its own user; a receiver sets a
//! `trusted.*` attribute only with `--exact-modes`.

use longhaul_testkit::*;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn root_user() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn lchown(p: &Path, uid: u32, gid: u32) {
    // SAFETY: a NUL-terminated path.
    assert_eq!(
        unsafe { libc::lchown(c(p).as_ptr(), uid, gid) },
        0,
        "{}",
        p.display()
    );
}

fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    // SAFETY: a NUL-terminated path and name, and `value.len()` bytes.
    let r = unsafe {
        libc::setxattr(
            c(p).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "{} {name}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

pub(crate) fn getxattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: as above, into `buf.len()` bytes.
    let r = unsafe {
        libc::getxattr(
            c(p).as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (r >= 0).then(|| buf[..r as usize].to_vec())
}

/// A POSIX ACL in the kernel's xattr form: (tag, perm, id) entries.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend(tag.to_le_bytes());
        v.extend(perm.to_le_bytes());
        v.extend(id.to_le_bytes());
    }
    v
}

const UNDEFINED: u32 = u32::MAX;

/// A tree with owners of every sort, attributes and ACLs.
pub(crate) fn tree(src: &Path) {
    std::fs::create_dir_all(src.join("d")).unwrap();
    gen_file(&src.join("f1"), 1, 5000);
    gen_file(&src.join("d/f2"), 2, 3 << 20);
    std::os::unix::fs::symlink("f1", src.join("l")).unwrap();
    // Numbers with no name here, named ones, nobody.
    lchown(&src.join("f1"), 1234, 5678);
    lchown(&src.join("d"), 1, 1);
    lchown(&src.join("d/f2"), 65534, 65534);
    lchown(&src.join("l"), 1234, 5678);
    setxattr(&src.join("f1"), "user.origin", b"station 7");
    setxattr(&src.join("d"), "user.kind", b"\x00binary\xff");
    // An access ACL on f1 (user 1234 and group 99 may read and write),
    // a default ACL on d.
    let (user_obj, user, group_obj, group, mask, other) = (1, 2, 4, 8, 0x10, 0x20);
    setxattr(
        &src.join("f1"),
        "system.posix_acl_access",
        &acl(&[
            (user_obj, 6, UNDEFINED),
            (user, 6, 1234),
            (group_obj, 4, UNDEFINED),
            (group, 6, 99),
            (mask, 6, UNDEFINED),
            (other, 4, UNDEFINED),
        ]),
    );
    setxattr(
        &src.join("d"),
        "system.posix_acl_default",
        &acl(&[
            (user_obj, 7, UNDEFINED),
            (user, 5, 4321),
            (group_obj, 5, UNDEFINED),
            (mask, 5, UNDEFINED),
            (other, 0, UNDEFINED),
        ]),
    );
}

/// What `rsync -naiHAX --numeric-ids` would change at `dst` (no line: the
/// same tree, owners, attributes and ACLs).
fn rsync_sees(src: &Path, dst: &Path) -> String {
    rsync([
        OsString::from("-naiHAX"),
        "--numeric-ids".into(),
        format!("{}/", src.display()).into(),
        format!("{}/", dst.display()).into(),
    ])
}

/// A directory `name` holding the tree at `root/src`, made as root; None
/// (the test is skipped) without root or extended attributes.
fn setup(name: &str) -> Option<(Tmp, std::path::PathBuf, std::path::PathBuf)> {
    if !root_user() {
        eprintln!("SKIP: owners are kept only as root (and the tree is made as root)");
        return None;
    }
    let t = Tmp::new(name);
    let root = t.join("root");
    let src = root.join("src");
    tree(&src);
    if getxattr(&src.join("f1"), "user.origin").is_none() {
        eprintln!("SKIP: this file system keeps no extended attributes");
        return None;
    }
    Some((t, root, src))
}

#[test]
fn owners_xattrs_and_acls_arrive_as_rsync_sees_them_where_the_receiver_may_set_them() {
    let Some((t, root, src)) = setup("owners") else {
        return;
    };
    let srv = ServeCfg::new(&root, &t.join("state"))
        .writable()
        .arg("--keep-owners")
        .start();
    let c = Client::new(t.join("known_hosts"));
    let flags = ["--xattrs", "--acls"].map(OsString::from);

    // A get, as root: everything.
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let mut a = vec![OsString::from("--accept-new")];
    a.extend(flags.iter().cloned());
    // (By name: the directory received into keeps its own mtime.)
    a.extend([srv.remote("src"), dest.clone().into()]);
    c.run("get", a).expect_code(0);
    let got = dest.join("src");
    assert_eq!(rsync_sees(&src, &got), "");
    // A rerun that skips them still puts back an owner and an attribute
    // changed meanwhile.
    lchown(&got.join("f1"), 0, 0);
    setxattr(&got.join("f1"), "user.origin", b"changed");
    let mut a: Vec<OsString> = flags.to_vec();
    a.extend([srv.remote("src"), dest.clone().into()]);
    c.run("get", a).expect_code(0);
    assert_eq!(rsync_sees(&src, &got), "");

    // Without --xattrs and --acls the owners still come, the rest not.
    let plain = t.join("plain");
    c.run("get", [srv.remote("src/"), plain.clone().into()])
        .expect_code(0);
    let m = std::fs::symlink_metadata(plain.join("f1")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    assert_eq!(getxattr(&plain.join("f1"), "user.origin"), None);

    // A put to a server that keeps owners.
    let mut a: Vec<OsString> = flags.to_vec();
    a.extend([src.clone().into(), srv.remote("up/")]);
    c.run("put", a).expect_code(0);
    assert_eq!(rsync_sees(&src, &root.join("up/src")), "");

    // A server that does not: a put's files are its user's.
    let root2 = t.join("root2");
    std::fs::create_dir(&root2).unwrap();
    let srv2 = ServeCfg::new(&root2, &t.join("state2")).writable().start();
    let c2 = Client::new(t.join("known_hosts2"));
    let mut a: Vec<OsString> = vec!["--accept-new".into()];
    a.extend(flags.iter().cloned());
    a.extend([format!("{}/", src.display()).into(), srv2.remote("up/")]);
    c2.run("put", a).expect_code(0);
    let m = std::fs::symlink_metadata(root2.join("up/f1")).unwrap();
    assert_eq!((m.uid(), m.gid()), (0, 0));
    assert_eq!(
        getxattr(&root2.join("up/f1"), "user.origin").unwrap(),
        b"station 7"
    );

    // trusted.* goes with --xattrs as root, and is set only with
    // --exact-modes.
    setxattr(&src.join("f1"), "trusted.mark", b"t");
    let (no, yes) = (t.join("no-trust"), t.join("trust"));
    for (d, extra) in [(&no, None), (&yes, Some("--exact-modes"))] {
        let mut a: Vec<OsString> = vec!["--xattrs".into()];
        a.extend(extra.map(OsString::from));
        a.extend([srv.remote("src/"), d.clone().into()]);
        c.run("get", a).expect_code(0);
    }
    assert_eq!(getxattr(&no.join("f1"), "trusted.mark"), None);
    assert_eq!(getxattr(&yes.join("f1"), "trusted.mark").unwrap(), b"t");
}

#[test]
fn an_unprivileged_get_keeps_what_a_user_may_set_and_owns_the_rest() {
    if std::process::Command::new("setpriv")
        .arg("--help")
        .output()
        .is_err()
    {
        eprintln!("SKIP: needs setpriv");
        return;
    }
    let Some((t, root, src)) = setup("owners-user") else {
        return;
    };
    set_mode(t.path(), 0o755);
    let srv = ServeCfg::new(&root, &t.join("state")).start();
    // The client runs as nobody, into a directory of its own.
    let home = t.join("home");
    std::fs::create_dir(&home).unwrap();
    lchown(&home, 65534, 65534);
    let dest = home.join("dest");
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin())
        .arg("get")
        .arg("--known-hosts")
        .arg(home.join("kh"))
        .args(["--accept-new", "--xattrs", "--acls"])
        .arg(srv.remote("src"))
        .arg(&dest)
        .env("HOME", &home)
        .env("XDG_STATE_HOME", home.join("state"))
        .env("XDG_CONFIG_HOME", "/dev/null/longhaul-tests-no-config");
    run(cmd).expect_code(0);
    // Everything is nobody's; names, contents, modes, times, attributes
    // and ACLs are as sent.
    for p in list_tree(&dest) {
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65534), "{}", p.display());
    }
    let changes = rsync([
        OsString::from("-rlptAXni"),
        "--numeric-ids".into(),
        format!("{}/", src.display()).into(),
        format!("{}/", dest.join("src").display()).into(),
    ]);
    assert_eq!(changes, "");
}

#[test]
fn a_destination_that_keeps_no_attributes_gets_the_files_and_one_line_saying_so() {
    let Some((t, root, src)) = setup("owners-ramfs") else {
        return;
    };
    // ramfs keeps no extended attributes (EOPNOTSUPP).
    let mnt = t.join("ramfs");
    std::fs::create_dir(&mnt).unwrap();
    let Ok(_fs) = crate::diskfull::Tmpfs::mount_fs(&mnt, "ramfs", "mode=0755") else {
        eprintln!("SKIP: cannot mount a ramfs");
        return;
    };
    let srv = ServeCfg::new(&root, &t.join("state")).start();
    let c = Client::new(t.join("known_hosts"));
    let get = |json: bool, dest: &Path| {
        let mut a: Vec<OsString> = ["--accept-new", "--xattrs", "--acls"]
            .map(OsString::from)
            .to_vec();
        if json {
            a.push("--json".into());
        }
        a.extend([srv.remote("src"), dest.into()]);
        let out = c.run("get", a);
        out.expect_code(0);
        out
    };
    let out = get(false, &mnt.join("a"));
    assert!(
        out.stdout
            .contains("arrived without their extended attributes or ACLs: the destination's file system keeps none"),
        "{}",
        out.stdout
    );
    assert_eq!(hash_file(&mnt.join("a/src/f1")), hash_file(&src.join("f1")));
    let j = get(true, &mnt.join("b")).json();
    assert!(j["attrs_not_kept"].as_u64().unwrap() >= 2, "{j:#}");
}
