//! What the in-process server tests share.

use longhaul_quic::net::NetOpts;
use longhaul_quic::{ServeOpts, Server};
use std::path::Path;

/// A server of `root` on a free loopback port, its state under `state`,
/// with four data streams and the default network options.
pub fn bind(root: &Path, state: &Path, read_only: bool) -> Server {
    Server::bind(ServeOpts {
        root: root.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        read_only,
        token: None,
        state_dir: state.to_path_buf(),
        net: NetOpts::default(),
        streams: 4,
    })
    .unwrap()
}
