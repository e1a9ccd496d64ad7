//! The CLI's black-box tests, one binary: each module runs the `longhaul`
//! binary (helpers in `longhaul-testkit`) as a user would. (The lab's tests
//! are a binary of their own, `tests/lab.rs`: they measure the emulator's
//! timing and want the machine to themselves.) `scripts/test` runs this
//! binary one test at a time: some measure rates or time a rerun, and the
//! bulk tests write gigabytes.

mod access;
mod announced;
mod bulk;
mod close;
mod connections;
mod diskfull;
mod filters;
mod hardlinks;
mod holes;
mod hostile_size;
mod interrupt;
mod mirror;
mod modes;
mod multicast;
mod names;
mod outage;
mod owners;
mod paths;
mod progress_line;
mod put_fresh;
mod rate;
mod recipes;
mod resume;
mod shards;
mod slow_receiver;
mod sparse;
mod specials;
mod ssh;
mod sync;
mod tree;
mod trust;
mod two_writers;
mod vanished;
mod zero_rtt;
