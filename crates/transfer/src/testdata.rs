//! Generated, incompressible test data (BLAKE3 in XOF mode as a fast keyed stream),
//! for the demo, the benchmarks and the tests.

use std::io::{self, Write};
use std::path::Path;

/// Write `len` pseudo-random bytes derived from `seed` to `path`.
pub fn write_file(path: &Path, seed: u64, len: u64) -> io::Result<()> {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let mut xof = blake3::Hasher::new_keyed(&key).finalize_xof();
    let mut f = io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        xof.fill(&mut buf[..n]);
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()
}

/// `count` files of `size` bytes named `f00000`... in `dir` (created).
pub fn write_many(dir: &Path, seed: u64, count: u64, size: u64) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for i in 0..count {
        write_file(&dir.join(format!("f{i:05}")), seed.wrapping_add(i), size)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn deterministic_and_distinct() {
        let t = tempfile::tempdir().unwrap();
        super::write_file(&t.path().join("a"), 1, 3000).unwrap();
        super::write_file(&t.path().join("b"), 1, 3000).unwrap();
        super::write_file(&t.path().join("c"), 2, 3000).unwrap();
        let r = |n: &str| std::fs::read(t.path().join(n)).unwrap();
        assert_eq!(r("a"), r("b"));
        assert_ne!(r("a"), r("c"));
        assert_eq!(r("a").len(), 3000);
    }
}
