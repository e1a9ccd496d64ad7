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
mod throttle;
pub mod wan;

pub use cc::{parse_rate, CcChoice};
pub use client::{
    get, join_host_port, put, split_host_port, ClientOpts, ClientReport, ConnUse, Interrupt,
    Totals, ZeroRtt, DEFAULT_STREAMS,
};
pub use net::{NetOpts, SendBudget};
pub use report::{FileReport, Kind, NotMade, Problem, Progress, SessionReport, Status};
pub use retry::{Outage, DEFAULT_RETRY_FOR};
pub use server::{ServeOpts, Server, DEFAULT_MAX_SESSIONS, DEFAULT_PORT, DEFAULT_SEND_BUFFER};
