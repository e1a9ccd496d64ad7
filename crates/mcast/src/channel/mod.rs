//! A channel: one-to-many dissemination that runs for days (`multicast send
//! --follow DIR`). Files are offered as they become ready and each is sent
//! once at the channel's rate, cut into RaptorQ blocks of its own; receivers
//! join and leave at any time, name each file as soon as it verifies, and
//! after every BEAT say what they have and what they lack, which the sender
//! repairs with fresh symbols for everyone at once. A receiver that was away
//! asks for what it missed, as long as the sender still holds it (the
//! backlog). Wire format: docs/PROTOCOL.md §3.6.
//!
//! - [`ChannelSender`]: the sender's sans-IO core.
//! - [`ChannelReceiver`]: a receiver's sans-IO core.

pub mod files;
mod recv;
mod send;

pub use recv::{
    ChannelReceiver, ChannelReceiverConfig, ChannelRxStats, ObjectStore,
    ReceiverEvent as ChannelRxEvent, Resume,
};
pub use send::{
    ChannelConfig, ChannelEvent, ChannelSender, ChannelState, ChannelStats, Latency, ObjectSource,
    ReceiverState,
};

use std::time::Duration;

/// How often the sender sends a BEAT.
pub const BEAT_EVERY: Duration = Duration::from_millis(100);

/// Symbols beyond K a receiver asks for per block (decoding at K fails ~1 % of the time).
pub const MARGIN: u32 = 2;

/// The largest file a channel carries (the blocks of one file are numbered in a u32).
pub const MAX_FILE: u64 = 1 << 40;

/// How one file is cut into blocks: `block_symbols × symbol_size` bytes each,
/// the last shorter; K of a block is its length in symbols, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) symbol_size: u16,
    pub(crate) block_symbols: u16,
    pub(crate) len: u64,
}

impl Layout {
    /// Check a channel's symbol size and block length.
    pub(crate) fn check(symbol_size: u16, block_symbols: u16) -> Result<(), String> {
        crate::layout::Layout::new(symbol_size, block_symbols, 1, 0).map(|_| ())
    }

    pub(crate) fn new(symbol_size: u16, block_symbols: u16, len: u64) -> Layout {
        Layout {
            symbol_size,
            block_symbols,
            len,
        }
    }

    fn block_bytes(&self) -> u64 {
        self.symbol_size as u64 * self.block_symbols as u64
    }

    /// Blocks of the file (0 for an empty one).
    pub(crate) fn blocks(&self) -> u32 {
        self.len.div_ceil(self.block_bytes()) as u32
    }

    /// Where block `b` starts in the file.
    pub(crate) fn offset(&self, b: u32) -> u64 {
        b as u64 * self.block_bytes()
    }

    /// Bytes of block `b`.
    pub(crate) fn block_len(&self, b: u32) -> usize {
        (self.len - self.offset(b)).min(self.block_bytes()) as usize
    }

    /// Source symbols of block `b`.
    pub(crate) fn k(&self, b: u32) -> u16 {
        self.block_len(b).div_ceil(self.symbol_size as usize) as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_cut_into_blocks_of_whole_symbols() {
        let l = Layout::new(1000, 4, 9_500);
        assert_eq!(l.blocks(), 3);
        assert_eq!((l.offset(2), l.block_len(2), l.k(2)), (8000, 1500, 2));
        assert_eq!((l.block_len(0), l.k(0)), (4000, 4));
        assert_eq!(Layout::new(1000, 4, 0).blocks(), 0);
        assert!(Layout::check(1001, 4).is_err());
    }
}
