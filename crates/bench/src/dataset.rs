//! Data sets for lab runs: files of random bytes, generated from a seed (so a
//! data set is the same on every run and machine), cached by their
//! description, and a tree hash to verify what a tool delivered.

use anyhow::{bail, Context, Result};
use longhaul_transfer::testdata;
use std::path::{Path, PathBuf};

/// A generated data set.
#[derive(Debug, Clone)]
pub(crate) struct DataSet {
    pub dir: PathBuf,
    pub files: u64,
    pub bytes: u64,
    pub hash: String,
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
    if let Ok(hash) = std::fs::read_to_string(&done) {
        let (files, bytes) = count(groups);
        return Ok(DataSet {
            dir,
            files,
            bytes,
            hash: hash.trim().to_string(),
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
    let (files, bytes, hash) = tree_hash(&dir)?;
    if (files, bytes) != count(groups) {
        bail!(
            "generated {files} files of {bytes} bytes in {}",
            dir.display()
        );
    }
    std::fs::write(&done, &hash)?;
    Ok(DataSet {
        dir,
        files,
        bytes,
        hash,
    })
}

fn count(groups: &[(u64, u64)]) -> (u64, u64) {
    groups
        .iter()
        .fold((0, 0), |(f, b), (s, n)| (f + n, b + s * n))
}

/// (files, bytes, hash) of the regular files under `dir`: BLAKE3 over every
/// file's relative path, length and contents, in path order. Names and bytes
/// only: modes, times and owners (which tools treat differently) do not count.
pub(crate) fn tree_hash(dir: &Path) -> Result<(u64, u64, String)> {
    let mut paths = Vec::new();
    walk(dir, dir, &mut paths)?;
    paths.sort();
    let mut h = blake3::Hasher::new();
    let mut bytes = 0u64;
    for rel in &paths {
        let full = dir.join(rel);
        let mut fh = blake3::Hasher::new();
        let file = std::fs::File::open(&full).with_context(|| format!("{}", full.display()))?;
        fh.update_reader(file)
            .with_context(|| format!("reading {}", full.display()))?;
        let len = std::fs::metadata(&full)?.len();
        bytes += len;
        let name = rel.as_os_str().as_encoded_bytes();
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name);
        h.update(&len.to_le_bytes());
        h.update(fh.finalize().as_bytes());
    }
    Ok((paths.len() as u64, bytes, h.finalize().to_hex().to_string()))
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let t = e.file_type()?;
        let p = e.path();
        if t.is_dir() {
            walk(root, &p, out)?;
        } else if t.is_file() {
            out.push(p.strip_prefix(root).expect("under root").to_path_buf());
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
        assert_eq!(tree_hash(&d.dir).unwrap().2, d.hash);
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
        assert_eq!(tree_hash(&copy).unwrap().2, d.hash);
        let f = copy.join("g0-10000B/f0000001");
        let mut b = std::fs::read(&f).unwrap();
        b[5000] ^= 1;
        std::fs::write(&f, &b).unwrap();
        assert_ne!(tree_hash(&copy).unwrap().2, d.hash);
        b[5000] ^= 1;
        std::fs::write(&f, &b).unwrap();
        assert_eq!(tree_hash(&copy).unwrap().2, d.hash);
        std::fs::rename(&f, copy.join("g0-10000B/renamed")).unwrap();
        assert_ne!(tree_hash(&copy).unwrap().2, d.hash);
    }
}
