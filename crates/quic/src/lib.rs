//! longhaul-quic: unicast sessions over QUIC (quinn + rustls).
//!
//! One connection per session; control frames on one bidirectional stream, file
//! data on several unidirectional streams (see docs/PROTOCOL.md). [`proto`] is the
//! sans-IO wire format; [`sender`] and [`receiver`] are the two roles, used by
//! [`server`] and [`client`] in either direction; [`cc`] holds congestion control.

pub mod cc;
pub mod client;
pub mod control;
pub mod core;
pub mod disk;
pub mod identity;
pub mod net;
pub mod proto;
pub mod rates;
pub mod receiver;
pub mod report;
pub mod sender;
pub mod server;
pub mod wan;

pub use client::{get, put, ClientOpts, ClientReport, Interrupt, Totals};
pub use report::{Kind, Problem, Progress};
pub use server::{ServeOpts, Server, DEFAULT_PORT};
