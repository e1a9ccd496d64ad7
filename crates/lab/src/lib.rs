//! The WAN lab environment: hosts as network namespaces joined by the
//! emulator (`longhaul-netem`), with `up / down / exec / stats`
//! ([`topology`], [`ops`], [`daemon`]) and probes to check a path
//! ([`probe`]). The benchmark that runs tools over it is `longhaul-bench`.

#![warn(missing_docs, unreachable_pub)]

pub mod daemon;
pub mod ops;
pub mod probe;
pub mod signals;
pub mod sys;
pub mod topology;
