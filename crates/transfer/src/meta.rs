//! Owners, groups and extended attributes (POSIX ACLs among them): what a
//! sender reads of each item and what a receiver may apply.
//!
//! Every entry carries its owner and group, by number and by name; a
//! receiver applies them only where it may (as root, and on a served tree
//! only when the server says so), mapped by name unless `--numeric-ids`, as
//! rsync does. Extended attributes go when asked (`--xattrs`: the `user.*`
//! namespace, and as root `trusted.*` and `security.*`; `--acls`:
//! `system.posix_acl_access` and `system.posix_acl_default`, whose entries
//! keep their numeric ids). A receiver applies `trusted.*` and `security.*`
//! (file capabilities among them) only as root with `--exact-modes`, the
//! trust that keeps setuid bits.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Mutex;

pub use crate::manifest::{Owner, Xattr};

/// A file's or directory's access ACL, as an extended attribute.
pub const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// A directory's default ACL, as an extended attribute.
pub const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// What a sender reads besides owners (a get asks it in its request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wanted {
    /// Extended attributes (`--xattrs`).
    pub xattrs: bool,
    /// POSIX ACLs (`--acls`).
    pub acls: bool,
}

impl Wanted {
    /// Whether an attribute named `name` goes.
    pub fn takes(&self, name: &[u8]) -> bool {
        match is_acl(name) {
            true => self.acls,
            false => self.xattrs && !name.starts_with(b"system."),
        }
    }

    /// Nothing but owners.
    pub fn none(&self) -> bool {
        !self.xattrs && !self.acls
    }
}

/// An ACL's attribute name.
pub fn is_acl(name: &[u8]) -> bool {
    name == ACL_ACCESS || name == ACL_DEFAULT
}

/// What a receiver may apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// Give items the owner and group sent (needs root).
    pub owners: bool,
    /// Take the numbers sent as they are, not the local ids of the names.
    pub numeric_ids: bool,
    /// Apply `trusted.*` and `security.*` attributes too (root with
    /// `--exact-modes`).
    pub privileged: bool,
}

/// What is applied to one received item.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// The local uid and gid to give it.
    pub owner: Option<(u32, u32)>,
    /// The attributes to set.
    pub xattrs: Vec<Xattr>,
}

impl Applied {
    /// Nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.owner.is_none() && self.xattrs.is_empty()
    }
}

/// What `policy` lets a receiver apply of `owner` and `xattrs`.
pub fn applied(owner: &Owner, xattrs: &[Xattr], policy: Policy) -> Applied {
    let owner = policy.owners.then(|| match policy.numeric_ids {
        true => (owner.uid, owner.gid),
        false => (
            local_id(&USERS, &owner.user, owner.uid, true),
            local_id(&GROUPS, &owner.group, owner.gid, false),
        ),
    });
    let xattrs = xattrs
        .iter()
        .filter(|x| {
            is_acl(&x.name)
                || x.name.starts_with(b"user.")
                || (policy.privileged
                    && (x.name.starts_with(b"trusted.") || x.name.starts_with(b"security.")))
        })
        .cloned()
        .collect();
    Applied { owner, xattrs }
}

type Cache = Mutex<Option<HashMap<Vec<u8>, Option<u32>>>>;
static USERS: Cache = Mutex::new(None);
static GROUPS: Cache = Mutex::new(None);
static USER_NAMES: Mutex<Option<HashMap<u32, Vec<u8>>>> = Mutex::new(None);
static GROUP_NAMES: Mutex<Option<HashMap<u32, Vec<u8>>>> = Mutex::new(None);

/// The local id of `name` (a user's or a group's), or `id` when it has no
/// name or none here (rsync's rule).
fn local_id(cache: &Cache, name: &[u8], id: u32, user: bool) -> u32 {
    if name.is_empty() {
        return id;
    }
    let mut c = cache.lock().unwrap();
    let found = *c
        .get_or_insert_with(HashMap::new)
        .entry(name.to_vec())
        .or_insert_with(|| {
            let name = std::str::from_utf8(name).ok()?;
            match user {
                true => nix::unistd::User::from_name(name)
                    .ok()
                    .flatten()
                    .map(|u| u.uid.as_raw()),
                false => nix::unistd::Group::from_name(name)
                    .ok()
                    .flatten()
                    .map(|g| g.gid.as_raw()),
            }
        });
    found.unwrap_or(id)
}

/// The owner and group of an item with `uid` and `gid`, with their local
/// names (looked up once per id).
pub fn owner_of(uid: u32, gid: u32) -> Owner {
    let user = name_of(&USER_NAMES, uid, |id| {
        nix::unistd::User::from_uid(id.into())
            .ok()
            .flatten()
            .map(|u| u.name.into_bytes())
    });
    let group = name_of(&GROUP_NAMES, gid, |id| {
        nix::unistd::Group::from_gid(id.into())
            .ok()
            .flatten()
            .map(|g| g.name.into_bytes())
    });
    Owner {
        uid,
        gid,
        user,
        group,
    }
}

/// The name of `id` in `cache`, looked up with `lookup` the first time
/// (empty: it has none).
fn name_of(
    cache: &Mutex<Option<HashMap<u32, Vec<u8>>>>,
    id: u32,
    lookup: fn(u32) -> Option<Vec<u8>>,
) -> Vec<u8> {
    cache
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(id)
        .or_insert_with(|| lookup(id).unwrap_or_default())
        .clone()
}

/// The attributes of the open file or directory `fd` that `want` takes
/// (those this process may read).
pub fn read_xattrs(fd: BorrowedFd<'_>, want: Wanted) -> io::Result<Vec<Xattr>> {
    if want.none() {
        return Ok(Vec::new());
    }
    let reopened = usable(fd)?;
    let fd = reopened.as_ref().map_or(fd.as_raw_fd(), |f| f.as_raw_fd());
    let mut names = vec![0u8; 1024];
    let n = loop {
        // SAFETY: flistxattr writes at most `names.len()` bytes into it.
        let n = unsafe { libc::flistxattr(fd, names.as_mut_ptr().cast(), names.len()) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) => names.resize(names.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(e),
        }
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if !want.takes(name) {
            continue;
        }
        let c = CString::new(name).map_err(io::Error::other)?;
        let mut value = vec![0u8; 256];
        loop {
            // SAFETY: fgetxattr writes at most `value.len()` bytes into it.
            let n =
                unsafe { libc::fgetxattr(fd, c.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
            if n >= 0 {
                value.truncate(n as usize);
                break;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ERANGE) => value.resize(value.len() * 4, 0),
                // Gone meanwhile, or not ours to read (trusted.* as a user).
                Some(libc::ENODATA) | Some(libc::EPERM) | Some(libc::EACCES) => {
                    value.clear();
                    break;
                }
                _ => return Err(e),
            }
        }
        out.push(Xattr {
            name: name.to_vec(),
            value,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The attributes `want` takes of the file or directory at `path` beneath
/// `dir` (none of a link or a special file: opening a device could act on
/// it).
pub fn xattrs_at(
    dir: &cap_std::fs::Dir,
    path: &crate::RelPath,
    kind: crate::EntryKind,
    want: Wanted,
) -> io::Result<Vec<Xattr>> {
    use std::os::fd::AsFd;
    if want.none() {
        return Ok(Vec::new());
    }
    match kind {
        crate::EntryKind::File => {
            crate::open::open_read(dir, path.as_path()).and_then(|f| read_xattrs(f.as_fd(), want))
        }
        crate::EntryKind::Dir if path.is_root() => read_xattrs(dir.as_fd(), want),
        crate::EntryKind::Dir => dir
            .open_dir(path.as_path())
            .and_then(|d| read_xattrs(d.as_fd(), want)),
        _ => Ok(Vec::new()),
    }
}

/// Items whose attributes this process could not set because their file
/// system keeps none (`ENOTSUP`): they are placed without them and
/// counted here, for one line at the end of the run.
static NOT_HELD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many items so far arrived without their attributes because their
/// file system keeps none.
pub fn not_held() -> u64 {
    NOT_HELD.load(std::sync::atomic::Ordering::Relaxed)
}

/// Give the open file or directory `fd` what `a` says: its owner first
/// (a chown clears setuid bits: the caller sets the mode after), then each
/// attribute. A file system that keeps no attributes is counted
/// ([`not_held`]), not an error.
pub fn apply_fd(fd: BorrowedFd<'_>, a: &Applied) -> io::Result<()> {
    if a.is_empty() {
        return Ok(());
    }
    // (An `O_PATH` descriptor fails the first call with EBADF, before it
    // changed anything: asking first cost every small file a syscall.)
    match apply_raw(fd.as_raw_fd(), a) {
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => match usable(fd)? {
            Some(f) => apply_raw(f.as_raw_fd(), a),
            None => Err(e),
        },
        r => r,
    }
}

fn apply_raw(fd: std::os::fd::RawFd, a: &Applied) -> io::Result<()> {
    if let Some((uid, gid)) = a.owner {
        // SAFETY: fchown on a descriptor the caller holds.
        if unsafe { libc::fchown(fd, uid, gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    for x in &a.xattrs {
        let c = CString::new(x.name.clone()).map_err(io::Error::other)?;
        // SAFETY: fsetxattr reads `value.len()` bytes of the value.
        let r =
            unsafe { libc::fsetxattr(fd, c.as_ptr(), x.value.as_ptr().cast(), x.value.len(), 0) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                NOT_HELD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(());
            }
            if e.raw_os_error() == Some(libc::EBADF) {
                return Err(e); // (an `O_PATH` descriptor: see `apply_fd`)
            }
            return Err(io::Error::new(
                e.kind(),
                format!("setting {}: {e}", String::from_utf8_lossy(&x.name)),
            ));
        }
    }
    Ok(())
}

/// A directory held by an `O_PATH` descriptor (as cap-std holds them),
/// opened for real: attributes and owners are not read or set through
/// `O_PATH`. None when `fd` is usable as it is.
fn usable(fd: BorrowedFd<'_>) -> io::Result<Option<std::os::fd::OwnedFd>> {
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl F_GETFL on a descriptor the caller holds.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_PATH == 0 {
        return Ok(None);
    }
    // SAFETY: openat of "." beneath a descriptor the caller holds; the new
    // descriptor is owned by the result.
    let r = unsafe {
        libc::openat(
            fd.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `r` is a descriptor just opened and owned by nothing else.
    Ok(Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(r) }))
}

/// Give `name` in the directory `dir` (not followed if a link) the owner
/// `a` says; links and special files take no attributes here.
pub fn apply_owner_at(dir: BorrowedFd<'_>, name: &[u8], a: &Applied) -> io::Result<()> {
    let Some((uid, gid)) = a.owner else {
        return Ok(());
    };
    let c = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: fchownat reads a NUL-terminated name relative to a
    // descriptor the caller holds.
    let r = unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            c.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(name: &str) -> Xattr {
        Xattr {
            name: name.as_bytes().to_vec(),
            value: b"v".to_vec(),
        }
    }

    #[test]
    fn what_goes_and_what_is_applied_follow_the_flags_and_the_trust() {
        let all = Wanted {
            xattrs: true,
            acls: true,
        };
        assert!(all.takes(b"user.a") && all.takes(b"trusted.b") && all.takes(ACL_DEFAULT));
        assert!(!all.takes(b"system.nfs4_acl"));
        let only_acls = Wanted {
            xattrs: false,
            acls: true,
        };
        assert!(only_acls.takes(ACL_ACCESS) && !only_acls.takes(b"user.a"));
        let sent = [
            x("user.a"),
            x("security.capability"),
            x("trusted.t"),
            x("system.posix_acl_access"),
        ];
        let owner = Owner {
            uid: 4242,
            gid: 4343,
            user: b"no-such-user-here".to_vec(),
            group: b"root".to_vec(),
        };
        // Without trust: user attributes and ACLs only, no owner.
        let a = applied(&owner, &sent, Policy::default());
        let names: Vec<&[u8]> = a.xattrs.iter().map(|x| x.name.as_slice()).collect();
        assert_eq!(names, [&b"user.a"[..], ACL_ACCESS]);
        assert_eq!(a.owner, None);
        // As root: an unknown name keeps its number, a known one maps.
        let p = Policy {
            owners: true,
            numeric_ids: false,
            privileged: true,
        };
        let a = applied(&owner, &sent, p);
        assert_eq!(a.owner, Some((4242, 0)));
        assert_eq!(a.xattrs.len(), 4);
        let a = applied(
            &owner,
            &[],
            Policy {
                numeric_ids: true,
                ..p
            },
        );
        assert_eq!(a.owner, Some((4242, 4343)));
    }
}
