//! The WAN lab: hosts as network namespaces joined by the emulator
//! (`longhaul-netem`), with `up / down / exec / stats` and probes to check a
//! path; and the runner that replays scenarios ([`scenario`]) with longhaul
//! and real peer tools ([`tools`]) over generated data sets ([`dataset`]),
//! and reports them side by side ([`runner`], [`report`], [`html`]).

pub mod daemon;
pub mod dataset;
pub mod html;
pub mod ops;
pub mod probe;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod sys;
pub mod tools;
pub mod topology;
