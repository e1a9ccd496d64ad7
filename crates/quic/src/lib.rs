//! longhaul-quic: unicast sessions over QUIC (quinn + rustls).
//!
//! One connection per session; control frames on one bidirectional stream, file
//! data on several unidirectional streams (see docs/PROTOCOL.md).
//!
//! The surface: [`get`] and [`put`] with [`ClientOpts`] for a client, [`Server`]
//! with [`ServeOpts`] for a daemon, [`NetOpts`] for the socket and window
//! settings both share, [`Progress`] for live counters and the reports
//! ([`ClientReport`], [`SessionReport`], [`Problem`]) for the outcome. Three
//! modules are public because other crates and the tests speak them directly:
//! [`proto`] (the sans-IO wire format), [`identity`] (keys and trust) and
//! [`wan`] (the sans-IO congestion controller). Inside, the sans-IO unicast
//! cores (`core::send`, `core::recv`) are driven by the `sender` and `receiver`
//! drivers, which `server` and `client` use in either direction.

#![warn(missing_docs, unreachable_pub)]

#[cfg(test)]
mod ack_sim;
mod cc;
mod client;
mod close;
mod conns;
mod control;
mod core;
mod disk;
pub mod identity;
pub mod kept;
mod net;
pub mod proto;
mod ramp;
mod rates;
mod receiver;
mod report;
mod resume;
mod retry;
mod sender;
mod server;
mod sharding;
mod throttle;
pub mod wan;

pub use cc::{parse_rate, CcChoice};
pub use client::{
    get, join_host_port, put, split_host_port, ClientOpts, Interrupt, DEFAULT_STREAMS,
};
pub use net::{NetOpts, SendBudget, DEFAULT_PORT};
pub use report::{
    ClientReport, ConnUse, FileReport, Kind, NotMade, Outage, Problem, Progress, SessionReport,
    Status, Totals, ZeroRtt,
};
pub use retry::DEFAULT_RETRY_FOR;
pub use server::{ServeOpts, Server, DEFAULT_MAX_SESSIONS, DEFAULT_SEND_BUFFER};
pub use sharding::{PlanAt, ShardRole, Sharding};
