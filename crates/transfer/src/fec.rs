//! RaptorQ (RFC 6330, the `raptorq` crate) over one source block: the
//! multicast sender's repair, and a unicast transfer's tail repair.
//!
//! Symbols are identified by their encoding symbol id (ESI): `0..K` are the block's
//! own bytes (the code is systematic, so source symbols need no encoding at all),
//! `K..` repair symbols, any `K` + a few of which rebuild the block. The crate's
//! source block number is always 0 here: blocks are numbered on the wire, and one
//! decoder serves one block.

use raptorq::{
    EncodingPacket, ObjectTransmissionInformation, PayloadId, SourceBlockDecoder,
    SourceBlockEncoder,
};

/// Largest ESI RaptorQ allows (24 bits).
pub const MAX_ESI: u32 = (1 << 24) - 1;

/// Symbol sizes are multiples of this (RaptorQ's symbol alignment `Al`).
pub const ALIGN: u16 = 8;

fn config(k: u16, symbol_size: u16) -> ObjectTransmissionInformation {
    ObjectTransmissionInformation::new(
        k as u64 * symbol_size as u64,
        symbol_size,
        1,
        1,
        ALIGN as u8,
    )
}

/// Makes repair symbols for one block.
pub struct Encoder {
    enc: SourceBlockEncoder,
    k: u16,
}

impl Encoder {
    /// `data` is the block (at most `k × symbol_size` bytes; the rest is zero).
    pub fn new(data: &[u8], k: u16, symbol_size: u16) -> Encoder {
        let full = k as usize * symbol_size as usize;
        assert!(data.len() <= full);
        let enc = if data.len() == full {
            SourceBlockEncoder::new(0, &config(k, symbol_size), data)
        } else {
            let mut padded = data.to_vec();
            padded.resize(full, 0);
            SourceBlockEncoder::new(0, &config(k, symbol_size), &padded)
        };
        Encoder { enc, k }
    }

    /// Repair symbols with ESIs `esi..esi + n` (each at least K).
    pub fn repair(&self, esi: u32, n: u32) -> Vec<Vec<u8>> {
        assert!(esi >= self.k as u32 && esi + n <= MAX_ESI + 1);
        self.enc
            .repair_packets(esi - self.k as u32, n)
            .into_iter()
            .map(|p| p.split().1)
            .collect()
    }
}

/// Rebuild a block of `k` source symbols from any symbols received, each exactly
/// `symbol_size` bytes (the caller checks). `None` when these do not suffice yet
/// (fewer than K, or the rare unlucky set; a few more symbols fix that).
pub fn decode(
    k: u16,
    symbol_size: u16,
    symbols: impl IntoIterator<Item = (u32, Vec<u8>)>,
) -> Option<Vec<u8>> {
    let mut d = SourceBlockDecoder::new(0, &config(k, symbol_size), k as u64 * symbol_size as u64);
    d.decode(
        symbols
            .into_iter()
            .map(|(esi, s)| EncodingPacket::new(PayloadId::new(0, esi), s)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn any_k_plus_two_symbols_rebuild_the_block() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for &(k, t, len) in &[(1u16, 64u16, 10usize), (10, 64, 600), (100, 1400, 139_999)] {
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let enc = Encoder::new(&data, k, t);
            let mut syms: Vec<(u32, Vec<u8>)> = Vec::new();
            let mut padded = data.clone();
            padded.resize(k as usize * t as usize, 0);
            for (i, c) in padded.chunks(t as usize).enumerate() {
                syms.push((i as u32, c.to_vec()));
            }
            for (j, r) in enc
                .repair(k as u32, 2 * k as u32 + 4)
                .into_iter()
                .enumerate()
            {
                syms.push((k as u32 + j as u32, r));
            }
            // Keep a random K + 2 of them, mostly repair.
            let mut picked = Vec::new();
            while picked.len() < k as usize + 2 {
                let i = rng.gen_range(0..syms.len());
                picked.push(syms.swap_remove(i));
            }
            let got = decode(k, t, picked).expect("decode");
            assert_eq!(&got[..len], &data[..]);
            // K - 1 symbols never suffice.
            let few: Vec<_> = syms.into_iter().take(k as usize - 1).collect();
            assert_eq!(decode(k, t, few), None);
        }
    }
}
