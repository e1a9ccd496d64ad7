//! longhaul-mcast: one-to-many dissemination.
//!
//! - [`wire`]: the datagrams (version 1), plain or sealed.
//! - [`seal`]: ChaCha20-Poly1305 with a per-session key from a shared key file.
//! - `layout`: the manifest and data objects cut into source blocks.
//! - [`manifest`]: what a session carries (paths, sizes, modes, mtimes, BLAKE3).
//! - [`fec`]: RaptorQ encoding and decoding of one block.
//! - `sender`, `receiver` ([`Sender`], [`Receiver`]): the sans-IO protocol cores (datagrams and time in;
//!   datagrams, deadlines and events out).
//! - [`store`]: the receiver's files (crash-safe: part files, verify, rename) and
//!   the sender's source over a file set.
//! - [`channel`]: a channel that runs for days: files sent as they are
//!   written, receivers that come and go (sans-IO cores).
//! - [`udp`]: the thin UDP driver (multicast, or unicast fan-out).

#![warn(missing_docs, unreachable_pub)]

pub mod channel;
pub use longhaul_transfer::fec;
mod json;
mod layout;
pub mod manifest;
mod receiver;
pub mod seal;
mod sender;
pub mod store;
pub mod udp;
pub mod wire;

pub use receiver::{ReceiveReport, Receiver, ReceiverConfig, ReceiverEvent, ReceiverStats, Store};
pub use sender::{
    Group, RxReport, RxState, SendTo, Sender, SenderConfig, SenderEvent, SenderStats, Source,
};
