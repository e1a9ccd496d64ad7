//! The WAN lab: hosts as network namespaces joined by the emulator
//! (`longhaul-netem`), with `up / down / exec / stats` and probes to check a path.

pub mod daemon;
pub mod ops;
pub mod probe;
pub mod sys;
pub mod topology;
