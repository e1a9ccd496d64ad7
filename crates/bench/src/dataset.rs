//! Data sets for lab runs: files of random bytes, generated from a seed (so a
//! data set is the same on every run and machine) and cached by their
//! description, or an existing directory tree used as it is; and a tree hash
//! to verify what a tool delivered.

use anyhow::{bail, Context, Result};
use longhaul_transfer::testdata;
use std::path::{Path, PathBuf};

/// A data set: generated, or an existing tree.
#[derive(Debug, Clone)]
pub(crate) struct DataSet {
    /// Where it is (the tools' source; never written).
    pub dir: PathBuf,
    /// Regular files.
    pub files: u64,
    /// Symlinks (none in a generated one).
    pub links: u64,
    /// Bytes of the regular files.
    pub bytes: u64,
    /// Its [`tree_hash`].
    pub hash: String,
    /// What it is: `generated 3x10000+1x0`, `tree /usr/share`.
    pub what: String,
}

impl DataSet {
    /// One line for progress and reports: `tree /usr/share: 46012 files,
    /// 3905 symlinks, 556123456 bytes (556.1 MB)`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{}: {} files{}, {} bytes ({:.1} MB)",
            self.what,
            self.files,
            if self.links > 0 {
                format!(", {} symlinks", self.links)
            } else {
                String::new()
            },
            self.bytes,
            self.bytes as f64 / 1e6
        )
    }
}

/// The directory (under `root`) that holds the data set of `groups`
/// ((size, count) pairs), generating it unless a complete copy is there.
pub(crate) fn prepare(root: &Path, groups: &[(u64, u64)]) -> Result<DataSet> {
    let key = groups
        .iter()
        .map(|(s, n)| format!("{n}x{s}"))
        .collect::<Vec<_>>()
        .join("+");
    let dir = root.join(&key);
    let done = root.join(format!("{key}.done"));
    let what = format!("generated {key}");
    let (files, bytes) = count(groups);
    if let Ok(hash) = std::fs::read_to_string(&done) {
        return Ok(DataSet {
            dir,
            files,
            links: 0,
            bytes,
            hash: hash.trim().to_string(),
            what,
        });
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    for (g, &(size, n)) in groups.iter().enumerate() {
        let sub = dir.join(format!("g{g}-{size}B"));
        std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
        for i in 0..n {
            let path = sub.join(format!("f{i:07}"));
            testdata::write_file(&path, (g as u64) << 40 | i, size)
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let sum = tree_hash(&dir)?;
    if (sum.files, sum.bytes) != (files, bytes) {
        bail!(
            "generated {} files of {} bytes in {}",
            sum.files,
            sum.bytes,
            dir.display()
        );
    }
    std::fs::write(&done, &sum.hash)?;
    Ok(DataSet {
        dir,
        files,
        links: 0,
        bytes,
        hash: sum.hash,
        what,
    })
}

/// The directory `tree` as it is, for a run whose output goes to `out`
/// (canonical): checked by [`check_tree`], then hashed (every run, since a
/// tree may change between runs). It is never written or removed.
pub(crate) fn existing(tree: &Path, out: &Path) -> Result<DataSet> {
    let dir = check_tree(tree, out)?;
    let sum = tree_hash(&dir)?;
    if sum.files + sum.links == 0 {
        bail!("tree {}: holds no file or symlink", tree.display());
    }
    Ok(DataSet {
        dir,
        files: sum.files,
        links: sum.links,
        bytes: sum.bytes,
        hash: sum.hash,
        what: format!("tree {}", tree.display()),
    })
}

/// `tree`, canonical, once it is an existing directory apart from `out`
/// (canonical; receivers write beneath it, so neither may hold the other).
pub(crate) fn check_tree(tree: &Path, out: &Path) -> Result<PathBuf> {
    if !std::fs::metadata(tree).is_ok_and(|m| m.is_dir()) {
        bail!("tree {}: not an existing directory", tree.display());
    }
    let dir = std::fs::canonicalize(tree).with_context(|| format!("tree {}", tree.display()))?;
    if out.starts_with(&dir) || dir.starts_with(out) {
        bail!(
            "tree {} and the output directory {} overlap (receivers write beneath the latter): give --out outside the tree",
            tree.display(),
            out.display()
        );
    }
    Ok(dir)
}

fn count(groups: &[(u64, u64)]) -> (u64, u64) {
    groups
        .iter()
        .fold((0, 0), |(f, b), (s, n)| (f + n, b + s * n))
}

/// What [`tree_hash`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TreeSum {
    /// Regular files.
    pub files: u64,
    /// Symlinks.
    pub links: u64,
    /// Bytes of the regular files.
    pub bytes: u64,
    /// BLAKE3, hex.
    pub hash: String,
}

/// Stands where a regular file's length would in [`tree_hash`] to mark a
/// symlink (no file is 2^64 - 1 bytes long).
const SYMLINK: u64 = u64::MAX;

/// BLAKE3 over every regular file's and symlink's relative path, in path
/// order: a file by its length and content hash, a symlink by a marker and
/// its target's bytes (never followed, so a dangling one hashes too).
/// Directories are walked, not hashed (an empty one does not count). Names,
/// bytes and link targets only: modes, times and owners (which tools treat
/// differently) do not count. A socket, FIFO or device is an error naming
/// its path. For a tree without symlinks the hash is what it was before
/// symlinks counted, so the `.done` markers of generated sets stay valid.
pub(crate) fn tree_hash(dir: &Path) -> Result<TreeSum> {
    let mut entries = Vec::new();
    walk(dir, dir, &mut entries)?;
    entries.sort();
    let mut h = blake3::Hasher::new();
    let (mut bytes, mut links) = (0u64, 0u64);
    for (rel, is_link) in &entries {
        let full = dir.join(rel);
        let name = rel.as_os_str().as_encoded_bytes();
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name);
        if *is_link {
            let target =
                std::fs::read_link(&full).with_context(|| format!("reading {}", full.display()))?;
            let target = target.as_os_str().as_encoded_bytes();
            h.update(&SYMLINK.to_le_bytes());
            h.update(&(target.len() as u64).to_le_bytes());
            h.update(target);
            links += 1;
            continue;
        }
        let mut fh = blake3::Hasher::new();
        let file = std::fs::File::open(&full).with_context(|| format!("{}", full.display()))?;
        fh.update_reader(file)
            .with_context(|| format!("reading {}", full.display()))?;
        let len = std::fs::metadata(&full)?.len();
        bytes += len;
        h.update(&len.to_le_bytes());
        h.update(fh.finalize().as_bytes());
    }
    Ok(TreeSum {
        files: entries.len() as u64 - links,
        links,
        bytes,
        hash: h.finalize().to_hex().to_string(),
    })
}

/// Every regular file and symlink under `dir`, relative to `root`, with
/// whether it is a symlink.
pub(crate) fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, bool)>) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let t = e.file_type()?;
        let p = e.path();
        if t.is_dir() {
            walk(root, &p, out)?;
        } else if t.is_file() || t.is_symlink() {
            out.push((
                p.strip_prefix(root).expect("under root").to_path_buf(),
                t.is_symlink(),
            ));
        } else {
            let kind = if t.is_socket() {
                "a socket"
            } else if t.is_fifo() {
                "a FIFO"
            } else if t.is_block_device() || t.is_char_device() {
                "a device"
            } else {
                "of an unknown type"
            };
            bail!(
                "{}: {kind}, not a regular file, directory or symlink",
                p.display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_the_same_every_time_and_hashed_by_content() {
        let t = tempfile::tempdir().unwrap();
        let d = prepare(t.path(), &[(10_000, 3), (0, 1), (1_500_000, 1)]).unwrap();
        assert_eq!((d.files, d.bytes), (5, 1_530_000));
        assert_eq!(tree_hash(&d.dir).unwrap().hash, d.hash);
        // Cached: the marker is trusted, nothing regenerated.
        let again = prepare(t.path(), &[(10_000, 3), (0, 1), (1_500_000, 1)]).unwrap();
        assert_eq!(again.hash, d.hash);
        // Deterministic: a fresh generation gives the same bytes.
        let t2 = tempfile::tempdir().unwrap();
        let d2 = prepare(t2.path(), &[(10_000, 3), (0, 1), (1_500_000, 1)]).unwrap();
        assert_eq!(d2.hash, d.hash);
        // Copies compare equal; one changed byte or one renamed file does not.
        let copy = t.path().join("copy");
        std::process::Command::new("cp")
            .arg("-a")
            .arg(&d.dir)
            .arg(&copy)
            .status()
            .unwrap();
        assert_eq!(tree_hash(&copy).unwrap().hash, d.hash);
        let f = copy.join("g0-10000B/f0000001");
        let mut b = std::fs::read(&f).unwrap();
        b[5000] ^= 1;
        std::fs::write(&f, &b).unwrap();
        assert_ne!(tree_hash(&copy).unwrap().hash, d.hash);
        b[5000] ^= 1;
        std::fs::write(&f, &b).unwrap();
        assert_eq!(tree_hash(&copy).unwrap().hash, d.hash);
        std::fs::rename(&f, copy.join("g0-10000B/renamed")).unwrap();
        assert_ne!(tree_hash(&copy).unwrap().hash, d.hash);
        // The hash of a tree without symlinks is the one the `.done` markers
        // of earlier runs hold (before symlinks counted).
        assert_eq!(
            d.hash,
            "6e68ebd7d8c13dc5b8c27e304d60bcdda304e44e9a2e7cbb3e7485b0db4ddf2f"
        );
        assert_eq!(d.what, "generated 3x10000+1x0+1x1500000");
    }

    /// `root/tree`: files `a` and `sub/b` (9 bytes), links `to-a` → `a`,
    /// `to-sub` → `sub` and `sub/dangling` → `../nowhere`.
    fn tree_with_links(root: &Path) -> PathBuf {
        use std::os::unix::fs::symlink;
        let d = root.join("tree");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("a"), b"alpha").unwrap();
        std::fs::write(d.join("sub/b"), b"beta").unwrap();
        symlink("a", d.join("to-a")).unwrap();
        symlink("../nowhere", d.join("sub/dangling")).unwrap();
        symlink("sub", d.join("to-sub")).unwrap();
        d
    }

    #[test]
    fn symlinks_hash_as_links_never_followed_and_other_types_are_refused() {
        use std::os::unix::fs::symlink;
        let t = tempfile::tempdir().unwrap();
        let d = tree_with_links(t.path());
        let sum = tree_hash(&d).unwrap();
        // Links counted as links (the dangling one too), not followed: the
        // link to a directory is not walked, its target's bytes not counted.
        assert_eq!((sum.files, sum.links, sum.bytes), (2, 3, 9));
        let hash = sum.hash;
        // A copy that keeps links as links is identical.
        let copy = t.path().join("copy");
        let cp = std::process::Command::new("cp")
            .arg("-a")
            .arg(&d)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(cp.success());
        assert_eq!(tree_hash(&copy).unwrap().hash, hash);
        // Another target, even of a dangling link, is another tree.
        let dangling = copy.join("sub/dangling");
        std::fs::remove_file(&dangling).unwrap();
        symlink("../elsewhere", &dangling).unwrap();
        assert_ne!(tree_hash(&copy).unwrap().hash, hash);
        std::fs::remove_file(&dangling).unwrap();
        symlink("../nowhere", &dangling).unwrap();
        assert_eq!(tree_hash(&copy).unwrap().hash, hash);
        // A tool that follows a link (a file with its target's bytes in its
        // place) or drops it does not deliver the same tree.
        std::fs::remove_file(copy.join("to-a")).unwrap();
        assert_ne!(tree_hash(&copy).unwrap().hash, hash, "dropped");
        std::fs::write(copy.join("to-a"), b"alpha").unwrap();
        let followed = tree_hash(&copy).unwrap();
        assert_eq!((followed.files, followed.links), (3, 2));
        assert_ne!(followed.hash, hash, "followed");
        // A link whose target is the bytes of a file's (length, hash) record
        // is still a link.
        assert_ne!(followed.hash, tree_hash(&d).unwrap().hash);
        // Sockets, FIFOs and devices are named, not skipped.
        let fifo = d.join("sub/pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = format!("{:#}", tree_hash(&d).unwrap_err());
        assert!(
            e.contains(&format!("{}: a FIFO, not a regular file", fifo.display())),
            "{e}"
        );
    }

    #[test]
    fn an_existing_tree_is_used_where_it_is_and_apart_from_the_output() {
        let t = tempfile::tempdir().unwrap();
        let tree = tree_with_links(t.path());
        let out = t.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        let out = std::fs::canonicalize(&out).unwrap();
        let d = existing(&tree, &out).unwrap();
        assert_eq!(d.dir, std::fs::canonicalize(&tree).unwrap());
        assert_eq!(d.hash, tree_hash(&tree).unwrap().hash);
        assert_eq!(
            d.describe(),
            format!(
                "tree {}: 2 files, 3 symlinks, 9 bytes (0.0 MB)",
                tree.display()
            )
        );
        let err = |tree: &Path, out: &Path| format!("{:#}", existing(tree, out).unwrap_err());
        assert!(err(&t.path().join("none"), &out).contains("none: not an existing directory"));
        assert!(err(&tree.join("a"), &out).contains("not an existing directory"));
        assert!(err(&tree, &d.dir.join("sub")).contains("overlap"));
        assert!(err(t.path(), &out).contains("overlap"));
        std::fs::create_dir_all(t.path().join("empty/dir")).unwrap();
        assert!(err(&t.path().join("empty"), &out).contains("holds no file or symlink"));
        // Nothing was written into the tree.
        assert_eq!(tree_hash(&tree).unwrap().hash, d.hash);
    }
}
