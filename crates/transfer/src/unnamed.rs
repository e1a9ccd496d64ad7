//! Unnamed files (Linux `O_TMPFILE`): a small file is written into an inode
//! that has no name yet and linked under its final name once verified. No
//! partial file ever stands under any name, and placing the file costs one
//! directory insertion instead of a create plus a rename (a lookup, an insert
//! and a delete in the directory): on 20,000 small files in one directory the
//! directory work was the receiver's largest cost after the data copy.
//!
//! Both calls work on a directory descriptor that cap-std opened beneath the
//! destination, with a single-component name, so they cannot reach outside it.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU8, Ordering};

/// Whether unnamed files can be named here: 0 not known yet, 1 yes, 2 no.
static USABLE: AtomicU8 = AtomicU8::new(0);

/// An unnamed regular file in `dir` (mode 0600), or None when the file
/// system cannot make one, or this process cannot name one (then the caller
/// uses a named part file). The first call tries the whole cycle once, with a
/// file it links and removes again: without the capability `AT_EMPTY_PATH`
/// needs and without /proc, an unnamed file could be written but never named.
pub fn create(dir: &impl AsRawFd) -> io::Result<Option<File>> {
    create_with(dir, 0o600)
}

/// As [`create`], with the permission bits `mode & 0o777` (less the
/// umask, as any new file): the file's final mode where it may have it
/// while it has no name, so that placing it needs no `fchmod` (see
/// [`crate::place::apply_meta`]). Until it is linked no other process can
/// open it whatever its mode.
pub fn create_with(dir: &impl AsRawFd, mode: u32) -> io::Result<Option<File>> {
    let mode = mode & 0o777;
    match USABLE.load(Ordering::Relaxed) {
        1 => open_unnamed(dir, mode),
        2 => Ok(None),
        _ => {
            let Some(probe) = open_unnamed(dir, 0o600)? else {
                USABLE.store(2, Ordering::Relaxed);
                return Ok(None);
            };
            let name = format!(
                ".lh-probe-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            );
            let usable = match link(&probe, dir, name.as_bytes()) {
                Ok(()) => {
                    let c = CString::new(name).expect("no NUL in the probe's name");
                    // SAFETY: a valid directory descriptor and a NUL-terminated name.
                    unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
                    true
                }
                Err(_) => false,
            };
            USABLE.store(if usable { 1 } else { 2 }, Ordering::Relaxed);
            if usable {
                open_unnamed(dir, mode)
            } else {
                Ok(None)
            }
        }
    }
}

fn open_unnamed(dir: &impl AsRawFd, mode: u32) -> io::Result<Option<File>> {
    // SAFETY: a valid directory descriptor and a NUL-terminated path; the
    // returned descriptor is owned by the File.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd >= 0 {
        return Ok(Some(unsafe { File::from_raw_fd(fd) }));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // No O_TMPFILE here (the file system, or an old kernel).
        Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL) => Ok(None),
        _ => Err(e),
    }
}

/// How `link` names an unnamed file: 0 not known yet, 1 `AT_EMPTY_PATH`
/// (needs CAP_DAC_READ_SEARCH on older kernels), 2 `/proc/self/fd/N`.
static HOW: AtomicU8 = AtomicU8::new(0);

/// Gives the unnamed `file` the name `name` in `dir`. Fails with
/// `AlreadyExists` when the name is taken (a link never replaces).
pub fn link(file: &File, dir: &impl AsRawFd, name: &[u8]) -> io::Result<()> {
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if HOW.load(Ordering::Relaxed) != 2 {
        // SAFETY: valid descriptors and NUL-terminated names.
        let r = unsafe {
            libc::linkat(
                file.as_raw_fd(),
                c"".as_ptr(),
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        };
        if r == 0 {
            HOW.store(1, Ordering::Relaxed);
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // ENOENT: the caller lacks the capability AT_EMPTY_PATH asks for.
        if e.raw_os_error() != Some(libc::ENOENT) || HOW.load(Ordering::Relaxed) == 1 {
            return Err(e);
        }
        HOW.store(2, Ordering::Relaxed);
    }
    let proc =
        CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("no NUL in a number");
    // SAFETY: as above.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc.as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn an_unnamed_file_gets_its_name_only_when_linked_and_never_replaces() {
        let t = tempfile::tempdir().unwrap();
        let dir = File::open(t.path()).unwrap();
        let Some(mut f) = create(&dir).unwrap() else {
            eprintln!("no O_TMPFILE on this file system; nothing to test");
            return;
        };
        f.write_all(b"hello").unwrap();
        assert_eq!(
            std::fs::read_dir(t.path()).unwrap().count(),
            0,
            "no name yet"
        );
        link(&f, &dir, b"a").unwrap();
        assert_eq!(std::fs::read(t.path().join("a")).unwrap(), b"hello");
        // A second name for the same inode is fine; a taken one is not.
        std::fs::write(t.path().join("b"), b"other").unwrap();
        let e = link(&f, &dir, b"b").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(t.path().join("b")).unwrap(), b"other");
        // Dropped without a name, an unnamed file leaves nothing behind.
        let g = create(&dir).unwrap().unwrap();
        drop(g);
        let mut names: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
    }
}
