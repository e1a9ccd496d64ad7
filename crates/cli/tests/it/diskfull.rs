//! A destination that fills up: exit 5, "No space left", the partial kept for a
//! rerun and nothing under the final name. Needs root (mounts an 8 MiB tmpfs).

use longhaul_testkit::*;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// An 8 MiB tmpfs mounted on a directory, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> std::io::Result<Tmpfs> {
        let c = |s: &[u8]| CString::new(s).unwrap();
        let (src, target, fstype, data) = (
            c(b"tmpfs"),
            c(dir.as_os_str().as_bytes()),
            c(b"tmpfs"),
            c(format!("size={size},mode=0755").as_bytes()),
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

#[test]
fn disk_full_keeps_the_partial_and_exits_5() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED disk_full_keeps_the_partial_and_exits_5: needs root to mount a tmpfs");
        return;
    }
    let t = Tmp::new("diskfull");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("big.bin"), 5, 20 * MIB);
    let mnt = t.join("small-disk");
    std::fs::create_dir(&mnt).unwrap();
    let _fs = match Tmpfs::mount(&mnt, "8m") {
        Ok(m) => m,
        Err(e) => {
            eprintln!("SKIPPED disk_full_keeps_the_partial_and_exits_5: mount tmpfs: {e}");
            return;
        }
    };
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
        out.stderr.contains("No space left on device"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("big.bin"),
        "names the file: {}",
        out.stderr
    );
    let part = mnt.join(".big.bin.lh-part");
    assert!(part.is_file(), "the partial is kept: {:?}", list_tree(&mnt));
    assert!(
        std::fs::symlink_metadata(mnt.join("big.bin")).is_err(),
        "nothing stands under the final name: {:?}",
        list_tree(&mnt)
    );
    let names: Vec<_> = list_tree(&mnt);
    assert!(
        names.iter().all(|p| p
            .file_name()
            .unwrap()
            .as_bytes()
            .starts_with(b".big.bin.lh-")),
        "only the part file and its journal: {names:?}"
    );
    // Every chunk the journal names is in the partial with the source's bytes.
    let held = std::fs::read(&part).unwrap();
    let src = std::fs::read(root.join("big.bin")).unwrap();
    let journal = std::fs::File::open(mnt.join(".big.bin.lh-journal"))
        .ok()
        .and_then(|f| longhaul_transfer::journal::read(f, 20).unwrap());
    let named = journal.map_or(vec![], |j| [j.synced, j.written].concat());
    for (i, _) in named {
        let i = i as usize;
        let r = i * MIB as usize..(i + 1) * MIB as usize;
        assert!(
            held[r.clone()] == src[r],
            "journaled chunk {i} holds other bytes"
        );
    }

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
        p["message"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{j:#}"
    );
    assert!(std::fs::symlink_metadata(mnt.join("big.bin")).is_err());
    assert!(
        out.stderr.contains("No space left on device"),
        "with --json the problem still reaches stderr: {}",
        out.stderr
    );
    assert!(srv.alive(), "the server is unaffected");

    // A tree whose small file fits and whose large one does not: the failed
    // session's report still lists the file that was verified and placed.
    for n in list_tree(&mnt) {
        std::fs::remove_file(n).unwrap();
    }
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
    assert_eq!(totals(&j, "verified"), 1, "{j:#}");
    assert_eq!(
        files_by_path(&j)["tree/a-small.txt"]["status"],
        "verified",
        "{j:#}"
    );
    assert_eq!(
        std::fs::read(mnt.join("tree/a-small.txt")).unwrap(),
        b"fits\n"
    );
}
