//! A destination without room: a file that cannot fit is refused at once
//! (exit 5, "does not fit", nothing written); one whose disk fills while it
//! is received fails with "No space left", its partial kept for a rerun and
//! nothing under the final name. Needs root (mounts an 8 MiB tmpfs).

use longhaul_testkit::*;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A file system mounted on a directory (an 8 MiB tmpfs, say), unmounted
/// on drop.
pub(crate) struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> std::io::Result<Tmpfs> {
        Tmpfs::mount_fs(dir, "tmpfs", &format!("size={size},mode=0755"))
    }

    /// A file system of type `fstype` (`tmpfs`, `ramfs`) with mount options
    /// `data` on `dir` (as root).
    pub(crate) fn mount_fs(dir: &Path, fstype: &str, data: &str) -> std::io::Result<Tmpfs> {
        let c = |s: &[u8]| CString::new(s).unwrap();
        let (src, target, fstype, data) = (
            c(fstype.as_bytes()),
            c(dir.as_os_str().as_bytes()),
            c(fstype.as_bytes()),
            c(data.as_bytes()),
        );
        // SAFETY: valid NUL-terminated strings; data is a mount option string.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                data.as_ptr() as *const libc::c_void,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let t = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path; MNT_DETACH so a lingering file handle cannot keep it.
        let r = unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
        if r != 0 {
            eprintln!(
                "umount {}: {}",
                self.0.display(),
                std::io::Error::last_os_error()
            );
        }
    }
}

/// An 8 MiB tmpfs at `t/small-disk`, or `None` (the test is skipped) when
/// it cannot be mounted here.
fn small_disk(t: &Tmp, test: &str) -> Option<(Tmpfs, PathBuf)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED {test}: needs root to mount a tmpfs");
        return None;
    }
    let mnt = t.join("small-disk");
    std::fs::create_dir(&mnt).unwrap();
    match Tmpfs::mount(&mnt, "8m") {
        Ok(m) => Some((m, mnt)),
        Err(e) => {
            eprintln!("SKIPPED {test}: mount tmpfs: {e}");
            None
        }
    }
}

#[test]
fn a_file_that_cannot_fit_is_refused_at_once_and_exits_5() {
    let t = Tmp::new("diskfull");
    let Some((_fs, mnt)) = small_disk(&t, "a_file_that_cannot_fit_is_refused_at_once_and_exits_5")
    else {
        return;
    };
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("big.bin"), 5, 20 * MIB);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));

    let out = c.run(
        "get",
        [
            OsString::from("--accept-new"),
            srv.remote("big.bin"),
            mnt.clone().into(),
        ],
    );
    out.expect_code(5);
    assert!(
        out.stderr
            .contains("big.bin: does not fit: it needs 20.97 MB and its file system has"),
        "{}",
        out.stderr
    );
    assert_eq!(list_tree(&mnt), Vec::<PathBuf>::new(), "nothing written");

    // The JSON form says the same.
    let out = c.run(
        "get",
        [
            OsString::from("--json"),
            srv.remote("big.bin"),
            mnt.clone().into(),
        ],
    );
    out.expect_code(5);
    let j = out.json();
    assert_eq!(j["ok"], false);
    let p = &j["problems"][0];
    assert_eq!(p["kind"], "local_io", "{j:#}");
    assert!(
        p["message"].as_str().unwrap().contains("does not fit"),
        "{j:#}"
    );
    assert!(
        out.stderr.contains("does not fit"),
        "with --json the problem still reaches stderr: {}",
        out.stderr
    );
    assert!(srv.alive(), "the server is unaffected");

    // A tree whose small file fits and whose large one does not: the failed
    // session's report still lists the file if it was verified and placed
    // (the large one's refusal may come before the small one's data).
    std::fs::create_dir(root.join("tree")).unwrap();
    std::fs::write(root.join("tree/a-small.txt"), b"fits\n").unwrap();
    gen_file(&root.join("tree/z-big.bin"), 6, 20 * MIB);
    let out = c.run(
        "get",
        [
            OsString::from("--json"),
            srv.remote("tree"),
            mnt.clone().into(),
        ],
    );
    out.expect_code(5);
    let j = out.json();
    assert_eq!(j["ok"], false, "{j:#}");
    assert_eq!(j["problems"][0]["kind"], "local_io", "{j:#}");
    let small = mnt.join("tree/a-small.txt");
    if small.exists() {
        assert_eq!(totals(&j, "verified"), 1, "{j:#}");
        assert_eq!(
            files_by_path(&j)["tree/a-small.txt"]["status"],
            "verified",
            "{j:#}"
        );
        assert_eq!(std::fs::read(&small).unwrap(), b"fits\n");
    } else {
        assert_eq!(totals(&j, "verified"), 0, "{j:#}");
    }
    assert!(!mnt.join("tree/z-big.bin").exists());
    assert!(
        !mnt.join("tree/.z-big.bin.lh-part").exists(),
        "no part made"
    );
}

#[test]
fn a_disk_that_fills_midway_keeps_the_partial_and_exits_5() {
    let t = Tmp::new("diskfull-midway");
    let Some((_fs, mnt)) = small_disk(&t, "a_disk_that_fills_midway_keeps_the_partial_and_exits_5")
    else {
        return;
    };
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("big.bin"), 5, 6 * MIB);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    // It fits when it starts (6 of 8 MiB); once its part is there, another
    // writer takes 5 MiB of the disk (as much as it can get).
    let get = {
        let cmd = c.cmd(
            "get",
            [
                OsString::from("--accept-new"),
                "--max-rate".into(),
                "16M".into(),
                srv.remote("big.bin"),
                mnt.clone().into(),
            ],
        );
        std::thread::spawn(move || run_timeout(cmd, std::time::Duration::from_secs(60)))
    };
    let part = mnt.join(".big.bin.lh-part");
    let started = std::time::Instant::now();
    while !part.exists() {
        assert!(started.elapsed().as_secs() < 30, "no part file appeared");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(mnt.join("filler")).unwrap();
        for _ in 0..5 * 16 {
            if filler.write_all(&[7u8; 64 << 10]).is_err() {
                break;
            }
        }
    }
    let out = get.join().unwrap();
    out.expect_code(5);
    assert!(
        out.stderr.contains("No space left on device"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("big.bin"),
        "names the file: {}",
        out.stderr
    );
    assert!(part.is_file(), "the partial is kept: {:?}", list_tree(&mnt));
    assert!(
        std::fs::symlink_metadata(mnt.join("big.bin")).is_err(),
        "nothing stands under the final name: {:?}",
        list_tree(&mnt)
    );
    let names: Vec<_> = list_tree(&mnt);
    assert!(
        names.iter().all(|p| {
            let n = p.file_name().unwrap().as_bytes();
            n.starts_with(b".big.bin.lh-") || n == b"filler"
        }),
        "only the part file and its journal: {names:?}"
    );
    // Every chunk the journal names is in the partial with the source's bytes.
    let held = std::fs::read(&part).unwrap();
    let src = std::fs::read(root.join("big.bin")).unwrap();
    let journal = std::fs::File::open(mnt.join(".big.bin.lh-journal"))
        .ok()
        .and_then(|f| longhaul_transfer::journal::read(f, 6).unwrap());
    let named = journal.map_or(vec![], |j| [j.synced, j.written].concat());
    for (i, _) in named {
        let i = i as usize;
        let r = i * MIB as usize..(i + 1) * MIB as usize;
        assert!(
            held[r.clone()] == src[r],
            "journaled chunk {i} holds other bytes"
        );
    }
    assert!(srv.alive(), "the server is unaffected");
}

#[test]
fn a_sparse_file_larger_than_the_disk_fits_when_its_data_does() {
    let t = Tmp::new("diskfull-sparse");
    let Some((_fs, mnt)) = small_disk(&t, "a_sparse_file_larger_than_the_disk_fits") else {
        return;
    };
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    // 1 GiB holding 1 MiB of data, onto an 8 MiB disk.
    let img = root.join("disk.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(1 << 30).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &vec![9u8; MIB as usize], 512 * MIB).unwrap();
    drop(f);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    c.run(
        "get",
        [
            OsString::from("--accept-new"),
            srv.remote("disk.img"),
            mnt.clone().into(),
        ],
    )
    .expect_code(0);
    assert_eq!(hash_file(&mnt.join("disk.img")), hash_file(&img));
}

#[test]
fn checksum_of_files_already_there_needs_no_room_for_a_second_copy() {
    let t = Tmp::new("diskfull-checksum");
    let test = "checksum_of_files_already_there_needs_no_room_for_a_second_copy";
    let Some((_fs, mnt)) = small_disk(&t, test) else {
        return;
    };
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    // 5 MiB of the 8: a second copy would not fit.
    gen_file(&root.join("f.bin"), 9, 5 * MIB);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let get = |extra: &str| {
        let out = c.run(
            "get",
            [
                OsString::from("--accept-new"),
                OsString::from("--json"),
                OsString::from(extra),
                srv.remote("f.bin"),
                mnt.clone().into(),
            ],
        );
        out.expect_code(0);
        out.json()
    };
    get("--quiet");
    let j = get("--checksum");
    assert_eq!(totals(&j, "skipped"), 1, "{j:#}");
    assert_eq!(totals(&j, "bytes_transferred"), 0, "{j:#}");
    assert_eq!(list_tree(&mnt), [mnt.join("f.bin")], "no part left");
}
