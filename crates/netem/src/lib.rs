//! The lab's WAN emulator.
//!
//! The core is sans-IO and deterministic: [`spec`] parses link specifications,
//! `loss` holds the seeded loss models, `link` is one direction of a link
//! (queue, rate, loss, delay), and [`hub`] joins hosts' links into one switch.
//! `gso` reads and cuts TSO/USO aggregates, `pcap` formats captures. The Linux driver ([`tun`], [`driver`]) owns a TUN
//! port in each host's network namespace and moves packets through the hub on
//! precise timers.

#![warn(missing_docs, unreachable_pub)]

mod gso;
pub mod hub;
mod link;
mod loss;
mod packet;
mod pcap;
mod pool;
pub mod spec;

pub use hub::{HostConfig, Hub, HubConfig, SiteConfig, Snapshot};
pub use link::Series;
pub use spec::{DirSpec, LinkSpec, LossSpec, Outage, QueueLimit, RateStep, Schedule};
pub mod driver;
pub mod tun;
