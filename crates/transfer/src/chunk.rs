//! The chunk plan of a file and the BLAKE3 tree over its chunks.
//!
//! A file is cut into chunks of [`CHUNK_SIZE`] bytes (the last may be shorter). Each
//! chunk is a complete BLAKE3 subtree, so its chaining value can be computed by
//! whichever stream carried it, in any order, and the chaining values merge into the
//! file's ordinary BLAKE3 hash (`b3sum` gives the same). A file of one chunk or less
//! is hashed as a whole: its single "chunk digest" is already the root hash.

use blake3::hazmat::{self, ChainingValue, HasherExt, Mode};

/// Chunk size of protocol version 1: 1 MiB (a power of two, as the BLAKE3 tree needs).
pub const CHUNK_SIZE: u64 = 1 << 20;

/// A 32-byte BLAKE3 output: a chunk's chaining value, or a whole file's root hash.
pub type Digest = [u8; 32];

/// How a file of `size` bytes is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlan {
    /// File size in bytes.
    pub size: u64,
}

impl ChunkPlan {
    /// The plan of a file of `size` bytes.
    pub fn new(size: u64) -> Self {
        ChunkPlan { size }
    }

    /// Number of chunks (0 for an empty file).
    pub fn count(&self) -> u64 {
        self.size.div_ceil(CHUNK_SIZE)
    }

    /// Byte offset in the file where chunk `index` starts (not checked against the size).
    pub fn offset(&self, index: u64) -> u64 {
        index * CHUNK_SIZE
    }

    /// Length of chunk `index`, or `None` if it does not exist.
    pub fn len(&self, index: u64) -> Option<u64> {
        if index >= self.count() {
            return None;
        }
        Some((self.size - index * CHUNK_SIZE).min(CHUNK_SIZE))
    }

    /// Is the file empty (0 bytes, no chunks)?
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Is the file hashed as one piece (digest == root)?
    pub fn single(&self) -> bool {
        self.count() <= 1
    }

    /// A hasher for chunk `index` of this file.
    pub fn hasher(&self, index: u64) -> ChunkHasher {
        let mut h = blake3::Hasher::new();
        if !self.single() {
            h.set_input_offset(self.offset(index));
        }
        ChunkHasher {
            hasher: h,
            single: self.single(),
        }
    }

    /// The digest of chunk `index` when it is all zeros (a hole): as costly
    /// as hashing that many zeros, about 0.17 ms for a whole chunk.
    pub fn zero_digest(&self, index: u64) -> Digest {
        let len = self.len(index).unwrap_or(0) as usize;
        let mut h = self.hasher(index);
        h.update(&zeros()[..len]);
        h.finish()
    }

    /// The file's BLAKE3 hash from the digests of all its chunks, in order.
    pub fn root(&self, digests: &[Digest]) -> Digest {
        assert_eq!(digests.len() as u64, self.count(), "one digest per chunk");
        match digests.len() {
            0 => *blake3::hash(b"").as_bytes(),
            1 => digests[0],
            _ => {
                let (l, r) = self.split(0, digests.len());
                let left = self.subtree(digests, 0, l);
                let right = self.subtree(digests, l, r);
                *hazmat::merge_subtrees_root(&left, &right, Mode::Hash).as_bytes()
            }
        }
    }

    /// The digest of a slice of the file: chunks `first..first + digests.len()`
    /// (a shard's part, [`crate::shard`]), from their chaining values in
    /// order. Sender and receiver both compute it, so the slice is checked
    /// end to end without either reading the rest of the file; the chaining
    /// values it covers are those the file's root is later made of.
    pub fn slice_digest(&self, first: u64, digests: &[Digest]) -> Digest {
        let mut h = blake3::Hasher::new_derive_key("longhaul 2026-11-30 slice of a file");
        h.update(&self.size.to_le_bytes());
        h.update(&first.to_le_bytes());
        h.update(&(digests.len() as u64).to_le_bytes());
        for d in digests {
            h.update(d);
        }
        *h.finalize().as_bytes()
    }

    /// Split chunks `[lo, hi)` into BLAKE3's left and right subtree: the left one holds
    /// the largest power of two of chunks that is smaller than the whole.
    fn split(&self, lo: usize, hi: usize) -> (usize, usize) {
        let n = hi - lo;
        debug_assert!(n >= 2);
        let left = 1usize << (usize::BITS - 1 - (n - 1).leading_zeros());
        (lo + left, hi)
    }

    fn subtree(&self, d: &[Digest], lo: usize, hi: usize) -> ChainingValue {
        if hi - lo == 1 {
            return d[lo];
        }
        let (mid, _) = self.split(lo, hi);
        let l = self.subtree(d, lo, mid);
        let r = self.subtree(d, mid, hi);
        hazmat::merge_subtrees_non_root(&l, &r, Mode::Hash)
    }
}

/// One chunk's worth of zeros, allocated once.
pub(crate) fn zeros() -> &'static [u8] {
    static ZEROS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    ZEROS.get_or_init(|| vec![0; CHUNK_SIZE as usize])
}

/// Hashes one chunk; `finish` gives its digest (a chaining value, or the root hash
/// for single-chunk files).
pub struct ChunkHasher {
    hasher: blake3::Hasher,
    single: bool,
}

impl ChunkHasher {
    /// Feed the chunk's next bytes, in file order.
    pub fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
    }

    /// The chunk's digest: its chaining value, or the file's root hash when the file
    /// is a single chunk ([`ChunkPlan::single`]).
    pub fn finish(&self) -> Digest {
        if self.single {
            *self.hasher.finalize().as_bytes()
        } else {
            self.hasher.finalize_non_root()
        }
    }
}

/// Hex form of a digest, as `b3sum` prints it.
pub fn hex(d: &Digest) -> String {
    blake3::Hash::from_bytes(*d).to_hex().to_string()
}

/// `len` bytes of `file` from `offset`, read into fresh memory that is not
/// zeroed first (a 1 MiB chunk's `vec![0; len]` was a memset of every byte
/// a sender reads). An end of file before `len` bytes is `UnexpectedEof`.
pub fn read_at(file: &std::fs::File, len: usize, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let done = buf.len();
        let spare = &mut buf.spare_capacity_mut()[..len - done];
        // SAFETY: pread writes at most `spare.len()` bytes into memory this
        // Vec owns and has not initialised; `set_len` covers only the bytes
        // it reports written.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                spare.len(),
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            // SAFETY: pread wrote these `n` bytes (see above).
            n if n > 0 => unsafe { buf.set_len(done + n as usize) },
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngCore, SeedableRng};

    #[test]
    fn read_at_reads_what_is_there_and_refuses_a_short_file() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        assert_eq!(
            super::read_at(&f, 100_000, 50_000).unwrap(),
            &data[50_000..150_000]
        );
        assert_eq!(super::read_at(&f, 0, 0).unwrap(), Vec::<u8>::new());
        let e = super::read_at(&f, 10, 199_995).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    fn tree_hash(data: &[u8]) -> Digest {
        let plan = ChunkPlan::new(data.len() as u64);
        // Hash the chunks in reverse order to show order does not matter.
        let mut digests = vec![[0u8; 32]; plan.count() as usize];
        for i in (0..plan.count()).rev() {
            let off = plan.offset(i) as usize;
            let len = plan.len(i).unwrap() as usize;
            let mut h = plan.hasher(i);
            h.update(&data[off..off + len]);
            digests[i as usize] = h.finish();
        }
        plan.root(&digests)
    }

    #[test]
    fn tree_of_chunks_equals_plain_blake3() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let c = CHUNK_SIZE as usize;
        let sizes = [
            0,
            1,
            1023,
            1024,
            c - 1,
            c,
            c + 1,
            2 * c,
            2 * c + 5,
            3 * c,
            3 * c + 1,
            4 * c,
            5 * c - 7,
            7 * c + 3,
            8 * c,
            9 * c + 1,
            13 * c,
        ];
        let mut buf = vec![0u8; 13 * c + 1];
        rng.fill_bytes(&mut buf);
        for &n in &sizes {
            assert_eq!(
                hex(&tree_hash(&buf[..n])),
                blake3::hash(&buf[..n]).to_hex().to_string(),
                "size {n}"
            );
        }
    }

    #[test]
    fn plan_covers_file_exactly() {
        for size in [0u64, 1, CHUNK_SIZE, CHUNK_SIZE + 1, 10 * CHUNK_SIZE - 1] {
            let p = ChunkPlan::new(size);
            let total: u64 = (0..p.count()).map(|i| p.len(i).unwrap()).sum();
            assert_eq!(total, size);
            assert_eq!(p.len(p.count()), None);
        }
    }

    #[test]
    fn a_flipped_bit_changes_the_root() {
        let mut data = vec![5u8; 3 * CHUNK_SIZE as usize + 10];
        let a = tree_hash(&data);
        data[2 * CHUNK_SIZE as usize + 3] ^= 1;
        assert_ne!(a, tree_hash(&data));
    }
}
