//! longhaul-transfer: everything about moving a file set that is not a socket.
//!
//! - [`path`]: validated, root-relative paths (`RelPath`) and request parsing.
//! - [`manifest`]: the entries a sender announces (files, directories, symlinks).
//! - [`meta`]: owners, groups and extended attributes (ACLs among them).
//! - [`chunk`]: the chunk plan and the BLAKE3 tree built from per-chunk chaining values,
//!   so chunks read or written out of order (striped over streams) still yield the
//!   file's ordinary BLAKE3 hash.
//! - [`journal`]: the resume journal of verified chunks beside a partial file.
//! - [`walk`]: a streaming, non-following walk of a tree confined to a root (cap-std).
//! - [`filter`]: `--exclude` / `--include` rules, rsync's patterns, applied by a sender.
//! - [`landing`]: where received entries land (rsync's rules), for every receiver.
//! - [`place`]: the receiver's crash-safe placement: hidden temp file, verify, rename.
//! - [`partlock`]: a part file's lock against other processes, held while its data moves.
//! - [`unnamed`]: unnamed files (`O_TMPFILE`) linked under their name once verified.
//! - [`sync`]: skip/resume/full decisions.
//! - [`shard`]: shards of one transfer (`--shard K/N`): the plan every shard computes
//!   from one listing, and the plan file that shares it.
//! - [`mod@slice`]: a shard's slice of a file: several shards writing one part, each with
//!   its own journal, the last naming the file.
//! - [`mod@shown`]: the far side's names and messages made safe for terminals and logs.
//! - [`units`]: one grammar of sizes, rates and durations for flags, SPECs and suites.
//! - [`testdata`]: seeded, incompressible test data for the demo, the bench and tests.

#![warn(missing_docs, unreachable_pub)]

pub mod chunk;
pub mod fec;
pub mod filter;
pub mod journal;
pub mod landing;
pub mod manifest;
pub mod meta;
pub mod open;
pub mod partlock;
pub mod path;
pub mod place;
pub mod shard;
pub mod shown;
pub mod sibling;
pub mod slice;
pub mod sync;
pub mod testdata;
pub mod units;
pub mod unnamed;
pub mod walk;

pub use chunk::{ChunkPlan, CHUNK_SIZE};
pub use manifest::{Entry, EntryKind};
pub use path::{PathError, RelPath};
pub use shown::shown;
