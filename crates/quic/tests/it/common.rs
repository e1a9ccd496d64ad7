//! What the in-process server tests share.

use longhaul_quic::NetOpts;
use longhaul_quic::{ClientOpts, ServeOpts, Server};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A server running on the test's runtime; stopped when dropped.
pub struct Served {
    pub addr: SocketAddr,
    pub fingerprint: String,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Served {
    /// A client that trusts this server, remembering it in `known_hosts`.
    pub fn client(&self, known_hosts: PathBuf) -> ClientOpts {
        ClientOpts::pinned(self.addr.to_string(), known_hosts, self.fingerprint.clone())
    }

    /// The server task has not ended (hostile input must not end it).
    #[allow(dead_code)] // each test binary compiles this module; not all ask
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `root` on a free loopback port, its state under `state`, with
/// four data streams and the default network options.
pub fn serve(root: &Path, state: &Path, read_only: bool) -> Served {
    serve_with(opts(root, state, read_only))
}

/// The options of [`serve`], to change before [`serve_with`].
pub fn opts(root: &Path, state: &Path, read_only: bool) -> ServeOpts {
    ServeOpts {
        root: root.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        read_only,
        token: None,
        read_token: None,
        // (A writable test server takes puts without a token.)
        exact_modes: false,
        keep_owners: false,
        anonymous_put: !read_only,
        state_dir: state.to_path_buf(),
        net: NetOpts::default(),
        streams: 4,
        max_sessions: 0,
        send_buffer: longhaul_quic::DEFAULT_SEND_BUFFER,
        once: false,
        keep: Default::default(),
    }
}

/// Serves with `opts`.
pub fn serve_with(opts: ServeOpts) -> Served {
    let server = Server::bind(opts).unwrap();
    Served {
        addr: server.local_addr().unwrap(),
        fingerprint: server.fingerprint.clone(),
        task: tokio::spawn(server.run()),
    }
}
