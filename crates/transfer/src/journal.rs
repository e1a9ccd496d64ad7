//! The resume journal kept beside a partial file.
//!
//! Layout (all little-endian):
//! ```text
//! header  "LHJ1" | size u64 | mtime_ns i64 | chunk_size u64          (28 bytes)
//! record  index u64 | digest [32] | check [4] = blake3(index||digest)[..4]   (44 bytes)
//! ```
//! A record is appended only after its chunk was written to the partial file,
//! in one of two kinds:
//! - **synced** (`index` as is): appended after the partial file's data was
//!   synced, so the chunk is durably on disk with that digest, even after a
//!   power cut;
//! - **written** (`index` with bit 63 set): appended without a sync, within
//!   about a second of the write. The chunk survives the process being killed
//!   (it is in the kernel's page cache) but not necessarily a power cut, so a
//!   resume reads it back and checks its digest before trusting it.
//!
//! A chunk may have both (written first, synced at the next sync). A torn or
//! corrupt record at the tail (a crash while appending) ends the journal there;
//! the chunks it would have named are simply fetched again. A reader older
//! than written records stops at the first one (its index is past the file).
//!
//! An **owner** record (`index` = bit 62 alone, the digest a nonce) is
//! appended by each process that sets the part up: a receiver that gave the
//! part's lock back between chunks knows the part is still as it left it
//! when, locked again, the journal still ends where its own appends ended
//! and its owner record still stands where it put it. Readers skip owner
//! records; a reader older than them stops at the first one.

use crate::chunk::{Digest, CHUNK_SIZE};
use std::io::{self, Read, Write};

const MAGIC: &[u8; 4] = b"LHJ1";
const HEADER: usize = 28;
const RECORD: usize = 44;

/// What a journal was started for: the source file's size and mtime as the sender
/// announced them. A journal whose header differs from the entry now received is not resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalHeader {
    /// Size in bytes of the source file.
    pub size: u64,
    /// Modification time of the source file, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

/// Bit 63 of a record's index: the record is of the *written* kind.
const WRITTEN: u64 = 1 << 63;
/// The index of an owner record (see the module's text).
const OWNER: u64 = 1 << 62;
/// Bytes of one record (an owner record too).
pub const RECORD_LEN: u64 = RECORD as u64;

/// A journal's header and its valid records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// What the journal was started for.
    pub header: JournalHeader,
    /// Chunks durably on disk with these digests (synced records), in journal order.
    pub synced: Vec<(u64, Digest)>,
    /// Chunks written but not known to be synced (written records of chunks
    /// without a synced record): read back and check before trusting them.
    pub written: Vec<(u64, Digest)>,
    /// Bytes of the journal up to its first torn or corrupt record (all of
    /// it when there is none): where a resume appends.
    pub valid_len: u64,
}

fn check(index: u64, digest: &Digest) -> [u8; 4] {
    let mut h = blake3::Hasher::new();
    h.update(&index.to_le_bytes());
    h.update(digest);
    let mut out = [0u8; 4];
    out.copy_from_slice(&h.finalize().as_bytes()[..4]);
    out
}

/// The 28-byte header for `h`: magic, size, mtime and this build's [`CHUNK_SIZE`].
pub fn encode_header(h: &JournalHeader) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&h.size.to_le_bytes());
    v.extend_from_slice(&h.mtime_ns.to_le_bytes());
    v.extend_from_slice(&CHUNK_SIZE.to_le_bytes());
    v
}

/// The 44-byte records of `(chunk index, digest)` pairs, each with its check bytes,
/// ready to append after the header: synced records if `synced` (the caller
/// synced the partial file's data first), else written ones.
pub fn encode_records(records: &[(u64, Digest)], synced: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(records.len() * RECORD);
    for (i, d) in records {
        let i = if synced { *i } else { *i | WRITTEN };
        v.extend_from_slice(&i.to_le_bytes());
        v.extend_from_slice(d);
        v.extend_from_slice(&check(i, d));
    }
    v
}

/// The owner record of `nonce` (see the module's text).
pub fn encode_owner(nonce: &Digest) -> [u8; RECORD] {
    let mut v = [0u8; RECORD];
    v[..8].copy_from_slice(&OWNER.to_le_bytes());
    v[8..40].copy_from_slice(nonce);
    v[40..].copy_from_slice(&check(OWNER, nonce));
    v
}

/// Parse a journal. `None` if the header is missing, foreign or for another chunk
/// size; records past the first torn/corrupt one, or naming a chunk beyond the file,
/// are dropped.
pub fn decode(bytes: &[u8], chunks: u64) -> Option<Parsed> {
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return None;
    }
    let u = |r: std::ops::Range<usize>| u64::from_le_bytes(bytes[r].try_into().unwrap());
    let header = JournalHeader {
        size: u(4..12),
        mtime_ns: u(12..20) as i64,
    };
    if u(20..28) != CHUNK_SIZE {
        return None;
    }
    let mut synced = Vec::new();
    let mut written = std::collections::BTreeMap::new();
    let mut valid_len = HEADER as u64;
    for rec in bytes[HEADER..].chunks_exact(RECORD) {
        let raw = u64::from_le_bytes(rec[..8].try_into().unwrap());
        let digest: Digest = rec[8..40].try_into().unwrap();
        let index = raw & !WRITTEN;
        if rec[40..44] != check(raw, &digest) {
            break;
        }
        if raw == OWNER {
            valid_len += RECORD_LEN;
            continue;
        }
        if index >= chunks {
            break;
        }
        valid_len += RECORD_LEN;
        if raw & WRITTEN == 0 {
            synced.push((index, digest));
        } else {
            written.insert(index, digest);
        }
    }
    for (i, _) in &synced {
        written.remove(i);
    }
    Some(Parsed {
        header,
        synced,
        written: written.into_iter().collect(),
        valid_len,
    })
}

/// Read and parse a journal from any reader.
pub fn read(mut r: impl Read, chunks: u64) -> io::Result<Option<Parsed>> {
    let mut buf = Vec::new();
    r.read_to_end(&mut buf)?;
    Ok(decode(&buf, chunks))
}

/// Append records (synced or written, see [`encode_records`]) to an open journal file.
pub fn append(mut w: impl Write, records: &[(u64, Digest)], synced: bool) -> io::Result<()> {
    w.write_all(&encode_records(records, synced))?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_torn_tail() {
        let h = JournalHeader {
            size: 5 * CHUNK_SIZE,
            mtime_ns: -42,
        };
        let recs = vec![(0u64, [1u8; 32]), (3, [2u8; 32]), (4, [3u8; 32])];
        let mut bytes = encode_header(&h);
        bytes.extend(encode_records(&recs, true));
        let parsed = decode(&bytes, 5).unwrap();
        assert_eq!((parsed.header, &parsed.synced), (h, &recs));
        assert!(parsed.written.is_empty());
        assert_eq!(parsed.valid_len, bytes.len() as u64);
        // torn last record
        let torn = &bytes[..bytes.len() - 5];
        assert_eq!(decode(torn, 5).unwrap().synced, recs[..2].to_vec());
        assert_eq!(
            decode(torn, 5).unwrap().valid_len,
            (HEADER + 2 * RECORD) as u64
        );
        // corrupt middle record stops the journal there
        let mut bad = bytes.clone();
        bad[HEADER + RECORD + 10] ^= 0xff;
        assert_eq!(decode(&bad, 5).unwrap().synced, recs[..1].to_vec());
        // a record beyond the file is refused
        assert_eq!(decode(&bytes, 4).unwrap().synced, recs[..2].to_vec());
        // foreign file
        assert_eq!(decode(b"hello world, not a journal at all", 5), None);
    }

    #[test]
    fn owner_records_are_skipped() {
        let h = JournalHeader {
            size: 3 * CHUNK_SIZE,
            mtime_ns: 1,
        };
        let mut bytes = encode_header(&h);
        bytes.extend(encode_owner(&[9; 32]));
        bytes.extend(encode_records(&[(0, [1; 32])], true));
        bytes.extend(encode_owner(&[8; 32]));
        bytes.extend(encode_records(&[(2, [3; 32])], false));
        let p = decode(&bytes, 3).unwrap();
        assert_eq!(p.synced, vec![(0, [1; 32])]);
        assert_eq!(p.written, vec![(2, [3; 32])]);
        // A corrupt owner record ends the journal like any other.
        let mut bad = bytes.clone();
        bad[HEADER + 20] ^= 1;
        assert_eq!(decode(&bad, 3).unwrap().synced, vec![]);
    }

    #[test]
    fn written_records_are_told_apart_and_a_later_sync_supersedes_them() {
        let h = JournalHeader {
            size: 5 * CHUNK_SIZE,
            mtime_ns: 7,
        };
        let mut bytes = encode_header(&h);
        bytes.extend(encode_records(&[(0, [1; 32]), (1, [2; 32])], false));
        bytes.extend(encode_records(&[(0, [1; 32]), (1, [2; 32])], true));
        bytes.extend(encode_records(&[(2, [3; 32])], false));
        let p = decode(&bytes, 5).unwrap();
        assert_eq!(p.synced, vec![(0, [1; 32]), (1, [2; 32])]);
        assert_eq!(p.written, vec![(2, [3; 32])]);
        // The flag is covered by the check bytes: a record cannot turn from
        // written into synced by a flipped bit.
        let mut flipped = bytes.clone();
        let last = bytes.len() - RECORD;
        flipped[last + 7] ^= 0x80;
        let p = decode(&flipped, 5).unwrap();
        assert_eq!(p.synced.len(), 2);
        assert!(p.written.is_empty());
    }
}
