//! How a session's bytes are cut into source blocks.
//!
//! A session carries two objects: the manifest (object 0) and the data (object 1:
//! every file's bytes back to back, in manifest order, so a thousand 10 kB files
//! share blocks instead of costing a block and a feedback round each). Each object is
//! cut into blocks of at most `block_symbols × symbol_size` bytes; blocks are
//! numbered globally, the manifest's first. A block of `len` bytes has
//! `K = ceil(len / symbol_size)` source symbols, the last one zero-padded.

/// Smallest and largest symbol sizes accepted from a sender (RaptorQ needs a
/// multiple of the 8-byte alignment used here).
pub(crate) const MIN_SYMBOL: u16 = 64;
pub(crate) const MAX_SYMBOL: u16 = 8192;
pub(crate) const ALIGN: u16 = longhaul_transfer::fec::ALIGN;
/// Largest number of source symbols per block accepted (RFC 6330 allows 56403).
pub(crate) const MAX_BLOCK_SYMBOLS: u16 = 8192;
/// Largest manifest accepted (64 MiB: about a million entries).
pub(crate) const MAX_MANIFEST: u64 = 64 << 20;
/// Largest data object accepted (16 TiB).
pub(crate) const MAX_DATA: u64 = 1 << 44;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Object {
    Manifest,
    Data,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub symbol_size: u16,
    pub block_symbols: u16,
    pub manifest_len: u64,
    pub data_len: u64,
    manifest_blocks: u32,
    data_blocks: u32,
}

/// Where one block lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub object: Object,
    /// Offset within its object.
    pub offset: u64,
    pub len: u64,
    /// Source symbols.
    pub k: u16,
}

impl Layout {
    /// Check a sender's parameters; the error says which one is out of range.
    pub(crate) fn new(
        symbol_size: u16,
        block_symbols: u16,
        manifest_len: u64,
        data_len: u64,
    ) -> Result<Layout, String> {
        if !(MIN_SYMBOL..=MAX_SYMBOL).contains(&symbol_size) || !symbol_size.is_multiple_of(ALIGN) {
            return Err(format!(
                "symbol size {symbol_size}: must be a multiple of {ALIGN} in {MIN_SYMBOL}..={MAX_SYMBOL}"
            ));
        }
        if !(1..=MAX_BLOCK_SYMBOLS).contains(&block_symbols) {
            return Err(format!(
                "block of {block_symbols} symbols: must be 1..={MAX_BLOCK_SYMBOLS}"
            ));
        }
        if manifest_len == 0 || manifest_len > MAX_MANIFEST {
            return Err(format!(
                "manifest of {manifest_len} bytes: must be 1..={MAX_MANIFEST}"
            ));
        }
        if data_len > MAX_DATA {
            return Err(format!("data of {data_len} bytes exceeds {MAX_DATA}"));
        }
        let bb = symbol_size as u64 * block_symbols as u64;
        Ok(Layout {
            symbol_size,
            block_symbols,
            manifest_len,
            data_len,
            manifest_blocks: manifest_len.div_ceil(bb) as u32,
            data_blocks: data_len.div_ceil(bb) as u32,
        })
    }

    pub(crate) fn block_bytes(&self) -> u64 {
        self.symbol_size as u64 * self.block_symbols as u64
    }

    pub(crate) fn manifest_blocks(&self) -> u32 {
        self.manifest_blocks
    }

    pub(crate) fn blocks(&self) -> u32 {
        self.manifest_blocks + self.data_blocks
    }

    /// Global numbers of the data object's blocks.
    pub(crate) fn data_range(&self) -> std::ops::Range<u32> {
        self.manifest_blocks..self.blocks()
    }

    pub(crate) fn block(&self, b: u32) -> Option<Block> {
        let (object, i, total) = if b < self.manifest_blocks {
            (Object::Manifest, b, self.manifest_len)
        } else if b < self.blocks() {
            (Object::Data, b - self.manifest_blocks, self.data_len)
        } else {
            return None;
        };
        let offset = i as u64 * self.block_bytes();
        let len = (total - offset).min(self.block_bytes());
        Some(Block {
            object,
            offset,
            len,
            k: len.div_ceil(self.symbol_size as u64) as u16,
        })
    }

    /// Source symbols in the whole session.
    pub(crate) fn total_symbols(&self) -> u64 {
        (0..self.blocks())
            .map(|b| self.block(b).map_or(0, |x| x.k as u64))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_both_objects_exactly() {
        let l = Layout::new(1000, 4, 9500, 8000).unwrap();
        assert_eq!(l.manifest_blocks(), 3);
        assert_eq!(l.blocks(), 5);
        let b: Vec<Block> = (0..5).map(|i| l.block(i).unwrap()).collect();
        assert_eq!(
            (b[2].object, b[2].offset, b[2].len, b[2].k),
            (Object::Manifest, 8000, 1500, 2)
        );
        assert_eq!(
            (b[3].object, b[3].offset, b[3].len, b[3].k),
            (Object::Data, 0, 4000, 4)
        );
        assert_eq!((b[4].offset, b[4].len), (4000, 4000));
        assert_eq!(l.block(5), None);
        assert_eq!(l.total_symbols(), 4 + 4 + 2 + 4 + 4);
        assert_eq!(l.data_range(), 3..5);
        // No data at all: just the manifest.
        let l = Layout::new(1000, 4, 10, 0).unwrap();
        assert_eq!((l.blocks(), l.data_range()), (1, 1..1));
    }

    #[test]
    fn hostile_parameters_are_refused() {
        assert!(Layout::new(1001, 4, 10, 0)
            .unwrap_err()
            .contains("multiple of 8"));
        assert!(Layout::new(8, 4, 10, 0).is_err());
        assert!(Layout::new(1000, 0, 10, 0).is_err());
        assert!(Layout::new(1000, 9000, 10, 0).is_err());
        assert!(Layout::new(1000, 4, 0, 0).is_err());
        assert!(Layout::new(1000, 4, MAX_MANIFEST + 1, 0).is_err());
        assert!(Layout::new(1000, 4, 10, MAX_DATA + 1).is_err());
    }
}
