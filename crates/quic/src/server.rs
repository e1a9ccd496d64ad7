//! `longhaul serve`: accept sessions, check the token, serve `get` (as sender) and
//! `put` (as receiver) confined to the root.

use crate::cc::{CcChoice, CcFactory, CcHandle};
use crate::close::{close_sent, lost, BUSY, SHUTDOWN};
use crate::conns::Conns;
use crate::control::{spawn_reader, spawn_writer, CtlRx, CtlTx};
use crate::identity::{provider, Identity};
use crate::net::{
    endpoint, spawn_receive_floor, spawn_window_tuner, udp_socket, Flow, NetOpts, SendBudget, Tuned,
};
use crate::proto::{
    ErrorCode, Frame, Op, ALPN, MAX_CONNECTIONS, MAX_STREAMS, SESSION_KEY_LEN, VERSION,
};
use crate::receiver::{is_root, run_receiver, Destination, RecvOpts};
use crate::report::{Problem, Progress, SessionReport};
use crate::sender::{run_sender, SendOpts, SendRoot, SendRootResult};
use crate::throttle::AuthThrottle;
use anyhow::{Context, Result};
use cap_std::fs::Dir;
use longhaul_transfer::landing::{dest_is_dir as lands_in_dir, Landing};
use longhaul_transfer::shard::Shard;
use longhaul_transfer::RelPath;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

/// How a server runs (`longhaul serve`).
#[derive(Debug, Clone)]
pub struct ServeOpts {
    /// The served directory: every path of a get or a put is resolved beneath
    /// it.
    pub root: PathBuf,
    /// The UDP address to bind (port 0: any free port, see
    /// [`Server::local_addr`]).
    pub listen: SocketAddr,
    /// Refuse every put, whatever the token (`Fatal { code: ReadOnly }`).
    pub read_only: bool,
    /// The token that may read and write. With neither this nor
    /// `read_token` every client may read, and none may write unless
    /// `anonymous_put`; with either, a client must present one of them.
    pub token: Option<Vec<u8>>,
    /// A token that may only read (get).
    pub read_token: Option<Vec<u8>>,
    /// Without tokens: let every client put (`--allow-anonymous-put`).
    pub anonymous_put: bool,
    /// Puts keep the modes sent exactly (`--exact-modes`); else within
    /// [`longhaul_transfer::place::SAFE_MODE_BITS`].
    pub exact_modes: bool,
    /// Puts give what they place the owner and group sent, as root
    /// (`--keep-owners`; a one-shot server does so anyway: it runs as the
    /// ssh login that asked).
    pub keep_owners: bool,
    /// Where the server's certificate and key (`cert.der`, `key.der`) are
    /// kept; created on first start.
    pub state_dir: PathBuf,
    /// Socket, window and rate settings of every connection. `net.cc` is the
    /// controller unless a client's `Hello.cc` names another; `net.max_rate`
    /// caps what the server sends, as a client's `Hello.max_rate` does (the
    /// lower holds when both are set).
    pub net: NetOpts,
    /// Data streams a get is sent on when the client's `Hello.streams` is 0.
    pub streams: usize,
    /// Sessions served at once; a client beyond them is refused at once
    /// (close code 4, `the server is busy…`). 0: no limit.
    pub max_sessions: usize,
    /// Bytes of sent, unacknowledged data all sessions together may hold
    /// ([`crate::net::SendBudget`]); 0: no limit but each one's `--window`.
    pub send_buffer: u64,
    /// Serve one session and return (`serve --once`, started over ssh): the
    /// first that passes the token check; sessions refused before it do
    /// not count.
    pub once: bool,
    /// What is kept of the files puts leave unfinished (recorded in
    /// `state_dir`).
    pub keep: crate::kept::KeepRules,
}

/// The server's send buffer unless told otherwise: a quarter of a
/// gigabyte. One session alone may use all of it: 1 Gbit/s over a 1 s RTT
/// with loss wants more (its window grows to four BDPs), which a larger
/// `--send-buffer` gives.
pub const DEFAULT_SEND_BUFFER: u64 = 256 << 20;

/// Sessions a server serves at once unless told otherwise. Each holds, past
/// its share of the send buffer ([`DEFAULT_SEND_BUFFER`]), up to a 1 MiB
/// chunk per data stream in hand and its connection's state: about 4 MB
/// when its client vanished (200 clients killed mid-get peaked the server
/// at 578 MB, 396 MB with a 64 MiB send buffer).
pub const DEFAULT_MAX_SESSIONS: usize = 64;

/// How long a `once` server waits for its client.
pub(crate) const ONCE_WAIT: Duration = Duration::from_secs(60);
/// How long a `once` server whose session's connection was lost waits for
/// its client to reconnect (a client's default `--retry-for`; a client that
/// gives up sooner ends ssh, and with it the server).
const ONCE_RECONNECT: Duration = crate::retry::DEFAULT_RETRY_FOR;

/// A bound server, ready to run.
pub struct Server {
    endpoint: quinn::Endpoint,
    crypto: Arc<quinn::crypto::rustls::QuicServerConfig>,
    tokens: Tokens,
    factory: Arc<CcFactory>,
    root: Arc<Dir>,
    opts: ServeOpts,
    /// The fingerprint (`SHA256:...`) of the server's certificate, which
    /// clients pin: printed for the user to hand on.
    pub fingerprint: String,
}

impl Server {
    /// Opens the root, loads the identity from the state directory (creating
    /// it on first start) and binds the UDP endpoint; [`Server::run`] then
    /// serves.
    pub fn bind(opts: ServeOpts) -> Result<Server> {
        let root = Dir::open_ambient_dir(&opts.root, cap_std::ambient_authority())
            .with_context(|| format!("opening the served root {}", opts.root.display()))?;
        let id = Identity::load_or_create(&opts.state_dir)?;
        let mut tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(vec![id.cert.clone()], id.key.clone_key())?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        // Session tickets ([`TICKETS_SENT`] per connection), kept here and taken when used
        // (a ticket resumes once: a replayed first flight finds none), so
        // that a client that comes back sends its request in its first
        // flight (0-RTT). A restarted server has none and refuses old
        // tickets. A one-shot server (`--once`, over ssh) has a fresh key
        // every time, and its client keeps no tickets.
        if !opts.once {
            tls.send_tls13_tickets = TICKETS_SENT;
            tls.max_early_data_size = u32::MAX;
            tls.session_storage = rustls::server::ServerSessionMemoryCache::new(TICKETS_KEPT);
        } else {
            tls.send_tls13_tickets = 0;
        }
        let crypto: Arc<quinn::crypto::rustls::QuicServerConfig> =
            Arc::new(quinn::crypto::rustls::QuicServerConfig::try_from(tls)?);
        let factory = CcFactory::new(opts.net.cc, opts.net.max_rate);
        let tokens = Tokens::new()?;
        let sc = server_config(&crypto, &tokens, &opts.net, opts.listen, &factory);
        let endpoint = endpoint(udp_socket(opts.listen)?, Some(sc))?;
        Ok(Server {
            endpoint,
            crypto,
            tokens,
            factory,
            root: Arc::new(root),
            fingerprint: id.fingerprint,
            opts,
        })
    }

    /// The address the endpoint is bound to (with the port actually taken
    /// when `listen` named port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    /// Close every connection, telling each client that the server is
    /// shutting down, and wait (at most 1 s) until the closes have left:
    /// a client would otherwise wait out its idle timeout.
    pub fn closer(&self) -> impl std::future::Future<Output = ()> {
        let endpoint = self.endpoint.clone();
        async move {
            endpoint.close(SHUTDOWN.into(), b"the server is shutting down");
            let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        }
    }

    /// Serve until the endpoint is closed.
    pub async fn run(self) -> Result<()> {
        let ctx = Arc::new(Ctx {
            root: self.root.clone(),
            opts: self.opts.clone(),
            throttle: Default::default(),
            pending: Default::default(),
            trimming: AtomicBool::new(false),
            trim_at: std::sync::Mutex::new(Instant::now()),
            budget: (self.opts.send_buffer > 0).then(|| SendBudget::new(self.opts.send_buffer)),
            authed: AtomicBool::new(false),
            done: tokio::sync::Notify::new(),
            relost: tokio::sync::Notify::new(),
            reconnect_by: std::sync::Mutex::new(None),
            sessions: AtomicUsize::new(0),
            joins: Default::default(),
            kept: Arc::new(crate::kept::KeptParts::load(
                self.root.clone(),
                &self.opts.root,
                &self.opts.state_dir,
                self.opts.keep,
            )),
            rtts: Default::default(),
        });
        // What was kept too long goes now, and hourly from now on (until
        // the server stops).
        let _sweeper = {
            let kept = ctx.kept.clone();
            AbortOnDrop(tokio::spawn(async move {
                let mut hourly = tokio::time::interval(Duration::from_secs(3600));
                loop {
                    hourly.tick().await;
                    let kept = kept.clone();
                    let _ = tokio::task::spawn_blocking(move || kept.enforce()).await;
                }
            }))
        };
        let once = self.opts.once;
        // `once`: a client must pass the token check within this.
        let mut deadline = tokio::time::Instant::now() + ONCE_WAIT;
        let mut waiting = once;
        loop {
            let incoming = tokio::select! {
                i = self.endpoint.accept() => i,
                _ = ctx.done.notified(), if once => break,
                _ = ctx.relost.notified(), if once => {
                    if let Some(by) = *ctx.reconnect_by.lock().unwrap() {
                        deadline = by;
                        waiting = true;
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(deadline), if waiting => {
                    if ctx.authed.load(Ordering::Relaxed) {
                        waiting = false;
                        continue;
                    }
                    let waited = match *ctx.reconnect_by.lock().unwrap() {
                        Some(_) => ONCE_RECONNECT,
                        None => ONCE_WAIT,
                    };
                    anyhow::bail!("no client came within {} s; exiting", waited.as_secs());
                }
            };
            let Some(incoming) = incoming else { break };
            let remote = incoming.remote_address();
            // Handshakes in progress are bounded apart from sessions (as
            // sshd's MaxStartups): past a few, a client must prove its
            // address first (a stateless Retry: a forged source costs one
            // packet and no state); past many, or many from one address,
            // an attempt is ignored (its client sends its Initial again).
            tracing::debug!(
                "{remote}: a connection, address validated: {}",
                incoming.remote_address_validated()
            );
            let client = crate::throttle::client_block(remote.ip());
            let (pending, from_ip) = ctx.pending.load(client);
            if pending >= RETRY_ABOVE && !incoming.remote_address_validated() {
                if let Err(e) = incoming.retry() {
                    e.into_incoming().ignore();
                }
                continue;
            }
            if pending >= MAX_PENDING || from_ip >= MAX_PENDING_PER_IP {
                tracing::debug!("{remote}: ignored: {pending} handshakes in progress");
                incoming.ignore();
                continue;
            }
            // accept() builds the connection and its controller synchronously, so the
            // factory's last handle is this connection's.
            // Transport parameters depend on the peer (the path MTU of loopback is known).
            let sc = server_config(
                &self.crypto,
                &self.tokens,
                &self.opts.net,
                remote,
                &self.factory,
            );
            // The client's address-validation token proved its address (a
            // forged source has none for it): what it sends in its first
            // flight is its own ([`early_ok`]).
            let validated = incoming.remote_address_validated();
            let connecting = match incoming.accept_with(Arc::new(sc)) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("{remote}: refused: {e}");
                    continue;
                }
            };
            let cc = self.factory.take_last();
            let slot = Pending::new(&ctx, client);
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let served = Arc::new(AtomicBool::new(false));
                // (An incoming connection always converts: the session may
                // read a request that came in the client's first flight,
                // 0-RTT, while the handshake ends; `Handshake` says when it
                // has.)
                let (conn, accepted) = match connecting.into_0rtt() {
                    Ok(c) => c,
                    Err(_) => unreachable!("an incoming connection converts to 0.5-RTT"),
                };
                let (done, handshake) = tokio::sync::watch::channel(None);
                let watch = {
                    let conn = conn.clone();
                    async move {
                        // (`accepted` resolves when the handshake completes,
                        // whatever its value says on a server, and when the
                        // connection ends before that: then it has a close
                        // reason.)
                        let ok = match tokio::time::timeout(HANDSHAKE_WAIT, accepted).await {
                            Ok(_) => match conn.close_reason() {
                                None => true,
                                Some(e) => {
                                    tracing::info!("{remote}: handshake failed: {e}");
                                    false
                                }
                            },
                            Err(_) => {
                                tracing::info!(
                                    "{remote}: no handshake within {} s",
                                    HANDSHAKE_WAIT.as_secs()
                                );
                                conn.close(VarIntCode::FATAL, b"no handshake");
                                false
                            }
                        };
                        let _ = done.send(Some(ok));
                        ok
                    }
                };
                let handshake = Handshake {
                    ended: handshake,
                    validated,
                };
                let session = session(
                    ctx.clone(),
                    conn.clone(),
                    cc,
                    served.clone(),
                    slot,
                    handshake,
                );
                let (completed, ()) = tokio::join!(watch, session);
                // (Only a handshake that completed measured the path: an
                // Initial with a forged source could acknowledge at will.)
                if completed {
                    ctx.rtts.remember(client, conn.rtt());
                }
                if ctx.opts.once && served.load(Ordering::Relaxed) {
                    // A session whose path died (its client rides the
                    // outage out, `--retry-for`) may be taken again by
                    // the same client, with the same token, while ssh
                    // lives: for up to ONCE_RECONNECT.
                    if conn.close_reason().is_some_and(|e| lost(&e)) {
                        tracing::info!("the session's connection was lost: waiting for its client to reconnect");
                        *ctx.reconnect_by.lock().unwrap() =
                            Some(tokio::time::Instant::now() + ONCE_RECONNECT);
                        ctx.authed.store(false, Ordering::Relaxed);
                        ctx.relost.notify_one();
                    } else {
                        ctx.done.notify_one();
                    }
                }
                give_back_soon(ctx);
            });
        }
        if once {
            // The session's last packets (its close, the ACKs of the
            // client's) leave before the process does.
            let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
        }
        Ok(())
    }
}

/// Session tickets a server sends on each connection (about 100 bytes
/// each). A ticket is sent once the client's Finished has come, 1.5 round
/// trips in: a transfer shorter than that (a small file from a known server,
/// all in the first round trip) ends before its ticket comes, and the
/// client's next run uses the spare.
const TICKETS_SENT: usize = 2;

/// Session tickets a server keeps ([`TICKETS_SENT`] per connection served,
/// the oldest dropped first): about 300 bytes each.
const TICKETS_KEPT: usize = 4096;

/// What address-validation tokens (NEW_TOKEN, and Retry's) are made and
/// checked with: one key and one log of tokens used for the endpoint and
/// every connection, so a token one connection gave is good for the next,
/// and once.
#[derive(Clone)]
struct Tokens {
    key: Arc<dyn quinn::crypto::HandshakeTokenKey>,
    log: Arc<dyn quinn::TokenLog>,
}

impl Tokens {
    fn new() -> Result<Tokens> {
        use ring::rand::SecureRandom;
        let mut master = [0u8; 64];
        ring::rand::SystemRandom::new()
            .fill(&mut master)
            .map_err(|_| anyhow::anyhow!("no randomness for the token key"))?;
        let key = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, &[]).extract(&master);
        Ok(Tokens {
            key: Arc::new(key),
            log: Arc::new(quinn::BloomTokenLog::default()),
        })
    }
}

fn server_config(
    crypto: &Arc<quinn::crypto::rustls::QuicServerConfig>,
    tokens: &Tokens,
    net: &NetOpts,
    peer: SocketAddr,
    factory: &Arc<CcFactory>,
) -> quinn::ServerConfig {
    let mut sc = quinn::ServerConfig::new(crypto.clone(), tokens.key.clone());
    // One token per connection, for the client's next: with it the server
    // may send at full rate before the handshake ends (not three times
    // what it received), so a 0-RTT request's answer is not held back.
    let mut vt = quinn::ValidationTokenConfig::default();
    vt.lifetime(crate::resume::TOKEN_LIFETIME)
        .log(tokens.log.clone())
        .sent(1);
    sc.validation_token_config(vt);
    // (It probes on every connection: the Hello, which names the operation,
    // comes after the transport is set.)
    sc.transport_config(Arc::new(net.transport(peer, factory.clone(), true)));
    sc
}

struct Ctx {
    root: Arc<Dir>,
    opts: ServeOpts,
    /// Wrong tokens per client address, and the refusals they earned.
    throttle: std::sync::Mutex<AuthThrottle>,
    /// Connections accepted that have not passed the token check yet.
    pending: PendingCount,
    /// A hand-back of free memory is scheduled ([`give_back_soon`]), and
    /// when its first step is due.
    trimming: AtomicBool,
    trim_at: std::sync::Mutex<Instant>,
    /// What the sessions' send windows share.
    budget: Option<Arc<SendBudget>>,
    /// A session passed the token check (`once`: the one served; later
    /// ones are refused).
    authed: AtomicBool,
    /// `once`: the session served has ended.
    done: tokio::sync::Notify,
    /// `once`: the session served lost its connection; its client may
    /// take it again until [`Ctx::reconnect_by`].
    relost: tokio::sync::Notify,
    reconnect_by: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// Sessions (a `Hello` taken) being served: what `--max-sessions` caps.
    sessions: AtomicUsize,
    /// Sessions over several connections whose others may still join, by
    /// their key ([`crate::proto::Hello::session`]).
    joins: std::sync::Mutex<HashMap<Vec<u8>, Joining>>,
    /// The parts puts left unfinished, kept for their resume.
    kept: Arc<crate::kept::KeptParts>,
    /// The path RTT of each client's last connection.
    rtts: crate::throttle::RttMemory,
}

/// A task stopped when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Handshakes in progress (accepted, no token-checked `Hello` or `Join`
/// yet) from which a client whose address is not validated gets a Retry.
/// Below it nobody pays Retry's round trip.
pub(crate) const RETRY_ABOVE: usize = 16;
/// Handshakes in progress from which new attempts are ignored, and from one
/// address. Sessions past the token check are never evicted for them.
pub(crate) const MAX_PENDING: usize = 256;
pub(crate) const MAX_PENDING_PER_IP: usize = 32;
/// How long a handshake may take, and then the control stream and its
/// first frame (a connection holds its pending slot at most for both).
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);
const HELLO_WAIT: Duration = Duration::from_secs(10);

/// Handshakes in progress, in all and per client ([`crate::throttle::client_block`]:
/// an IPv6 client by its /64).
#[derive(Default)]
struct PendingCount(std::sync::Mutex<(usize, HashMap<std::net::IpAddr, usize>)>);

impl PendingCount {
    /// In all, and from `ip`.
    fn load(&self, ip: std::net::IpAddr) -> (usize, usize) {
        let g = self.0.lock().unwrap();
        (g.0, g.1.get(&ip).copied().unwrap_or(0))
    }
}

/// A connection counted in [`Ctx::pending`] until its token check passes
/// (or it ends).
struct Pending(Option<(Arc<Ctx>, std::net::IpAddr)>);

impl Pending {
    fn new(ctx: &Arc<Ctx>, ip: std::net::IpAddr) -> Pending {
        let mut g = ctx.pending.0.lock().unwrap();
        g.0 += 1;
        *g.1.entry(ip).or_default() += 1;
        Pending(Some((ctx.clone(), ip)))
    }

    fn release(&mut self) {
        let Some((ctx, ip)) = self.0.take() else {
            return;
        };
        let mut g = ctx.pending.0.lock().unwrap();
        g.0 -= 1;
        if let Some(n) = g.1.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                g.1.remove(&ip);
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.release();
    }
}

/// A connection that joined a session, and its controller.
type Joined = (u32, quinn::Connection, Option<Arc<CcHandle>>);

/// A session over several connections, open for the others to join.
struct Joining {
    /// Which connections have joined (or are the first), by index.
    seen: Vec<bool>,
    /// The session is a put: a connection that joins must be allowed to
    /// write.
    put: bool,
    /// To the session.
    tx: mpsc::UnboundedSender<Joined>,
}

/// Hands the heap's free memory back to the system 2 s after sessions stop
/// ending (each end pushes that moment back: quinn keeps a closed
/// connection for a few round trips), and again 13 s after that (tokio's
/// idle blocking threads have exited by then, leaving their arenas' memory
/// free). glibc keeps what a burst of sessions freed: 50 concurrent gets
/// left a server at 1.4 GB, idle, instead of its 7 MB. (Waiting for the
/// last session to end was not enough: one may wait 30 s for its client's
/// close.)
fn give_back_soon(ctx: Arc<Ctx>) {
    *ctx.trim_at.lock().unwrap() = Instant::now() + Duration::from_secs(2);
    if ctx.trimming.swap(true, Ordering::Relaxed) {
        return;
    }
    tokio::spawn(async move {
        loop {
            let at = *ctx.trim_at.lock().unwrap();
            if Instant::now() >= at {
                break;
            }
            tokio::time::sleep_until(at.into()).await;
        }
        trim();
        tokio::time::sleep(Duration::from_secs(13)).await;
        trim();
        ctx.trimming.store(false, Ordering::Relaxed);
    });
}

/// Returns free heap pages to the system (glibc's `malloc_trim`).
fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// `once` (started over ssh, root `/`): the request path with the symlinks
/// of its directories resolved, as the ssh user's shell would follow them.
/// Beneath a root every absolute link is an escape (cap-std refuses it:
/// `~/data -> /scratch/data` could not be named), but the root `/` holds
/// everything and the ssh user's own permissions confine it. The last
/// component stays as named (a link named in a get is sent as a link),
/// unless a trailing `/` asks for what it holds. Elsewhere: unchanged.
fn follow_dir_links(opts: &ServeOpts, p: &[u8]) -> Vec<u8> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    if !opts.once || opts.root != Path::new("/") {
        return p.to_vec();
    }
    let slash = p.ends_with(b"/");
    let parts: Vec<&[u8]> = p.split(|&c| c == b'/').filter(|c| !c.is_empty()).collect();
    let (dirs, last) = match parts.split_last() {
        None => return p.to_vec(),
        Some(_) if slash => (&parts[..], None),
        Some((last, dirs)) => (dirs, Some(*last)),
    };
    // The longest leading run of directories that exists, made canonical.
    let mut k = dirs.len();
    let base = loop {
        if k == 0 {
            break Vec::new();
        }
        let path = Path::new("/").join(std::ffi::OsStr::from_bytes(&dirs[..k].join(&b'/')));
        if let Ok(c) = std::fs::canonicalize(&path) {
            break c.into_os_string().into_vec();
        }
        k -= 1;
    };
    let mut out: Vec<u8> = base.strip_prefix(b"/").unwrap_or(&base).to_vec();
    for c in dirs[k..].iter().chain(last.as_slice()) {
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(c);
    }
    if slash && !out.is_empty() {
        out.push(b'/');
    }
    out
}

async fn fatal(
    ctl: &CtlTx,
    conn: &quinn::Connection,
    handshake: &Handshake,
    code: ErrorCode,
    message: String,
) {
    tracing::warn!("{}: {message}", conn.remote_address());
    // (A refusal of a frame that came in 0-RTT waits for the handshake: a
    // close before it ends loses its reason, RFC 9000 §10.2.3.)
    handshake.done().await;
    let _ = ctl
        .send(Frame::Fatal {
            code,
            message: message.clone(),
        })
        .await;
    // Give the frame a moment to leave before the connection goes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut reason = message.into_bytes();
    reason.truncate(512);
    conn.close(VarIntCode::FATAL, &reason);
}

struct VarIntCode;
impl VarIntCode {
    const DONE: quinn::VarInt = quinn::VarInt::from_u32(crate::close::DONE);
    const FATAL: quinn::VarInt = quinn::VarInt::from_u32(1);
}

/// Refuses `conn`: the server already serves `max` sessions.
async fn busy(conn: &quinn::Connection, handshake: &Handshake, max: usize) {
    handshake.done().await;
    let m = format!(
        "the server is busy: it already serves {max} session(s) (its --max-sessions); try again later"
    );
    close_sent(conn, BUSY, m.as_bytes()).await;
}

/// Counts a session (a `Hello` taken) while it lives.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A session's entry in the registry of those others may join
/// ([`Ctx::joins`]), and the connections that joined it: dropping it, at
/// whichever return of the session, removes the entry (if it is still this
/// session's) and closes them; one that joins after that is closed by the
/// task that hands it on.
struct Registered {
    ctx: Arc<Ctx>,
    key: Vec<u8>,
    tx: mpsc::UnboundedSender<Joined>,
    /// None once the session is over.
    others: Arc<std::sync::Mutex<Option<Vec<quinn::Connection>>>>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        {
            let mut joins = self.ctx.joins.lock().unwrap();
            if joins
                .get(&self.key)
                .is_some_and(|j| j.tx.same_channel(&self.tx))
            {
                joins.remove(&self.key);
            }
        }
        for c in self.others.lock().unwrap().take().unwrap_or_default() {
            c.close(VarIntCode::DONE, b"done");
        }
    }
}

/// The first frame of a connection's control stream: a `Hello` (a new
/// session) or a `Join` (another connection of one).
async fn first_frame(
    rx: &mut CtlRx,
    by: impl std::future::Future<Output = ()>,
) -> Result<Frame, (ErrorCode, String)> {
    let protocol = |m: String| (ErrorCode::Protocol, m);
    let got = tokio::select! {
        f = rx.recv() => f,
        () = by => return Err(protocol(format!("no Hello within {} s", HELLO_WAIT.as_secs()))),
    };
    match got {
        None => Err(protocol("connection closed before Hello".into())),
        // A Hello of another version, which did not decode as ours.
        Some(Err(p)) if p.peer_version.is_some() => Err((ErrorCode::Version, p.message)),
        Some(Err(p)) => Err(protocol(p.message)),
        Some(Ok(f @ (Frame::Hello(_) | Frame::Join { .. }))) => Ok(f),
        Some(Ok(other)) => Err(protocol(format!(
            "protocol error: expected Hello, got {other:?}"
        ))),
    }
}

/// The refusal of a `Hello` or a `Join` of another protocol version.
fn unsupported(version: u32) -> (ErrorCode, String) {
    let m = format!("protocol version {version} is not supported (this server speaks {VERSION})");
    (ErrorCode::Version, m)
}

/// Sets a session's connection up for its role: its controller as the
/// client asked, the receiver's floor under it on a put, and its windows'
/// tuner (the first connection's and each that joins).
fn set_up(
    ctx: &Ctx,
    conn: &quinn::Connection,
    cc: &Option<Arc<CcHandle>>,
    (choice, rate): (Option<CcChoice>, u64),
    flow: Flow,
) -> Tuned {
    if let Some(handle) = cc {
        handle.set(choice, rate);
        if flow == Flow::Rx {
            spawn_receive_floor(conn.clone(), handle.clone());
        }
    }
    spawn_window_tuner(conn.clone(), ctx.opts.net, flow, ctx.budget.clone())
}

/// What a client may do, as its token says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// No token, and the server has none: read, and write only with
    /// `anonymous_put`.
    Anonymous,
    /// The read token: get only.
    Reader,
    /// The read-and-write token (or `once`'s).
    Writer,
}

/// The token check of a `Hello` or a `Join` from `remote`, with the
/// throttle on wrong guesses: the client's role, or the refusal's message.
fn check_token(ctx: &Ctx, remote: SocketAddr, token: &[u8]) -> Result<Role, String> {
    let o = &ctx.opts;
    if o.token.is_none() && o.read_token.is_none() {
        return Ok(Role::Anonymous);
    }
    // An IPv6 client by its /64: a new address per guess gains nothing.
    let ip = crate::throttle::client_block(remote.ip());
    let refused = ctx.throttle.lock().unwrap().refused_for(ip, Instant::now());
    if let Some(wait) = refused {
        return Err(format!(
            "access denied: too many wrong tokens from {ip}; try again in {} s",
            wait.as_secs() + 1
        ));
    }
    // Both compared, whichever matches, so timing tells neither apart.
    let write = token_ok(&o.token, token);
    let read = token_ok(&o.read_token, token);
    let role = match (write, read) {
        (true, _) => Role::Writer,
        (false, true) => Role::Reader,
        (false, false) => {
            let (n, block) = ctx.throttle.lock().unwrap().failed(ip, Instant::now());
            if let Some(b) = block {
                tracing::warn!(
                    "{ip}: {n} wrong tokens in a row: refused for {} s",
                    b.as_secs()
                );
            }
            return Err("access denied: wrong or missing token".to_string());
        }
    };
    ctx.throttle.lock().unwrap().succeeded(ip);
    Ok(role)
}

/// Why `role` may not put on this server (None: it may).
fn put_refusal(opts: &ServeOpts, role: Role) -> Option<(ErrorCode, String)> {
    if opts.read_only {
        let m = "this server is read-only (--read-only): put refused".to_string();
        return Some((ErrorCode::ReadOnly, m));
    }
    let m = match role {
        Role::Writer => return None,
        Role::Anonymous if opts.anonymous_put => return None,
        Role::Anonymous => {
            "put refused: the server is read-only for clients without a token (start it \
             with --token-file FILE and give clients that token, or with \
             --allow-anonymous-put to let anyone write)"
        }
        Role::Reader => {
            "put refused: this token may only read (the server's --read-token-file); \
             a put needs the token of its --token-file"
        }
    };
    Some((ErrorCode::Auth, m.to_string()))
}

/// A connection's `Join`: hands it to the session it names. Err: the
/// refusal.
fn join(
    ctx: &Ctx,
    conn: &quinn::Connection,
    cc: Option<Arc<CcHandle>>,
    version: u32,
    token: &[u8],
    session: &[u8],
    index: u32,
) -> Result<(), (ErrorCode, String)> {
    if version != VERSION {
        return Err(unsupported(version));
    }
    let role = check_token(ctx, conn.remote_address(), token).map_err(|m| (ErrorCode::Auth, m))?;
    // (The client sends its Joins after the Welcome, which the server
    // sends after registering the session: an unknown key is not early.)
    let mut joins = ctx.joins.lock().unwrap();
    let Some(s) = joins.get_mut(session) else {
        let m = "no session to join with this key (unknown, or over)".to_string();
        return Err((ErrorCode::Protocol, m));
    };
    let i = index as usize;
    if i >= s.seen.len() || s.seen[i] {
        let m = format!(
            "connection {index} cannot join: the session runs over {} and has it",
            s.seen.len()
        );
        return Err((ErrorCode::Protocol, m));
    }
    // A connection carries the session's data: on a put, only one whose
    // token may write.
    if s.put {
        if let Some(refusal) = put_refusal(&ctx.opts, role) {
            return Err(refusal);
        }
    }
    s.seen[i] = true;
    let _ = s.tx.send((index, conn.clone(), cc));
    Ok(())
}

/// `got` is the token `expected` (never, when the server has none).
fn token_ok(expected: &Option<Vec<u8>>, got: &[u8]) -> bool {
    match expected {
        None => false,
        Some(t) => {
            // Compare digests so neither content nor length leaks through timing.
            let a = blake3::hash(t);
            let b = blake3::hash(got);
            a.as_bytes().ct_eq(b.as_bytes()).into()
        }
    }
}

/// One client's session. `served` is set once it passed the token check
/// (for `once`: as the session the server exists for).
/// A connection's handshake as its session sees it.
struct Handshake {
    /// Whether it has completed (the client's Finished verified): None
    /// while it runs.
    ended: tokio::sync::watch::Receiver<Option<bool>>,
    /// The client's address was validated before it (a NEW_TOKEN token).
    validated: bool,
}

impl Handshake {
    /// Whether the handshake has ended (completed or failed).
    fn ended(&self) -> bool {
        self.ended.borrow().is_some()
    }

    /// Waits for the handshake's end: true when it completed.
    async fn done(&self) -> bool {
        match self.ended.clone().wait_for(Option::is_some).await {
            Ok(v) => v.unwrap_or(false),
            Err(_) => false,
        }
    }
}

/// Whether a session may act on `first`, its first frame, before its
/// connection's handshake has completed: the frame may have come in the
/// client's first flight (0-RTT), which an attacker can record and replay
/// (RFC 9001 §9.2; docs/PROTOCOL.md §1.12), and a first flight's source
/// address may be forged. Only from a client whose address a token
/// validated (a replayed token is refused: it validates once), and only a
/// `Hello` of one connection: a get's is served at once (a replay makes
/// the server read files and send them encrypted to keys only the real
/// client holds); a put's is answered (its `Welcome` only looks at the
/// destination), and the session waits for the handshake before it takes
/// any data ([`session`]). Anything else waits for the handshake: its token
/// check (a wrong one counts against the address), its session slot, a
/// session over several connections and a connection's `Join` (they
/// register the session's key).
fn early_ok(first: &Frame, validated: bool) -> bool {
    validated && matches!(first, Frame::Hello(h) if h.connections <= 1)
}

async fn session(
    ctx: Arc<Ctx>,
    conn: quinn::Connection,
    cc: Option<Arc<CcHandle>>,
    served: Arc<AtomicBool>,
    mut slot: Pending,
    handshake: Handshake,
) {
    let remote = conn.remote_address();
    // The control stream and its first frame within HELLO_WAIT of the
    // handshake's end (the session starts as the connection is accepted; a
    // handshake that does not end within HANDSHAKE_WAIT closes it).
    let hello_by = {
        let mut ended = handshake.ended.clone();
        async move {
            let _ = ended.wait_for(Option::is_some).await;
            tokio::time::sleep(HELLO_WAIT).await;
        }
    };
    tokio::pin!(hello_by);
    let stream = tokio::select! {
        s = conn.accept_bi() => s.ok(),
        () = &mut hello_by => None,
    };
    let Some((send, recv)) = stream else {
        conn.close(VarIntCode::FATAL, b"no control stream");
        return;
    };
    let (ctl, writer) = spawn_writer(send);
    let mut rx = spawn_reader(recv);
    let first = first_frame(&mut rx, &mut hello_by).await;
    if !first
        .as_ref()
        .is_ok_and(|f| early_ok(f, handshake.validated))
    {
        if !handshake.ended() {
            tracing::debug!("{remote}: the first frame came before the handshake ended: it waits");
        }
        if !handshake.done().await {
            tracing::debug!("{remote}: no handshake: the first frame is dropped unread");
            return;
        }
    }
    // A request before the handshake ended came in the first flight: the
    // connection has no RTT sample yet; start from the last one's.
    if !handshake.ended() {
        let client = crate::throttle::client_block(remote.ip());
        if let (Some(cc), Some(rtt)) = (&cc, ctx.rtts.get(client)) {
            cc.seed_rtt(rtt);
        }
    }
    let h = match first {
        Ok(Frame::Hello(h)) => h,
        Ok(Frame::Join {
            version,
            token,
            session,
            index,
        }) => {
            let joined = join(&ctx, &conn, cc, version, &token, &session, index);
            if let Err((code, m)) = joined {
                fatal(&ctl, &conn, &handshake, code, m).await;
            }
            return;
        }
        Ok(_) => unreachable!("first_frame returns a Hello or a Join"),
        Err((code, m)) => return fatal(&ctl, &conn, &handshake, code, m).await,
    };
    if h.version != VERSION {
        let (code, m) = unsupported(h.version);
        return fatal(&ctl, &conn, &handshake, code, m).await;
    }
    let role = match check_token(&ctx, remote, &h.token) {
        Ok(r) => r,
        Err(m) => return fatal(&ctl, &conn, &handshake, ErrorCode::Auth, m).await,
    };
    // Past the token check: a session, no longer a handshake. Only such
    // count toward --max-sessions.
    slot.release();
    let max = ctx.opts.max_sessions;
    let before = ctx.sessions.fetch_add(1, Ordering::Relaxed);
    let _counted = Counted(&ctx.sessions);
    if max > 0 && before >= max {
        tracing::warn!("{remote}: refused: already serving {max} session(s) (--max-sessions)");
        return busy(&conn, &handshake, max).await;
    }
    if matches!(h.op, Op::Put { .. }) {
        if let Some((code, m)) = put_refusal(&ctx.opts, role) {
            return fatal(&ctl, &conn, &handshake, code, m).await;
        }
        if role == Role::Anonymous {
            tracing::warn!("{remote}: put without a token (--allow-anonymous-put)");
        }
    }
    // `once`: the first session past the token check is the one served.
    if ctx.authed.swap(true, Ordering::Relaxed) && ctx.opts.once {
        let m = "this one-shot server already serves its session".to_string();
        return fatal(&ctl, &conn, &handshake, ErrorCode::Auth, m).await;
    }
    served.store(true, Ordering::Relaxed);
    let rate = match (h.max_rate, ctx.opts.net.max_rate) {
        (0, s) => s,
        (c, 0) => c,
        (c, s) => c.min(s),
    };
    let choice = match h.cc.as_deref().map(CcChoice::parse) {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            return fatal(&ctl, &conn, &handshake, ErrorCode::Protocol, e.to_string()).await
        }
        None => None,
    };
    let n = h.connections.max(1);
    // Each connection of a session over several gets its part of a hint.
    let choice = choice.map(|c| c.shared(n as usize));
    if n > MAX_CONNECTIONS {
        let m = format!("a session runs over at most {MAX_CONNECTIONS} connections, not {n}");
        return fatal(&ctl, &conn, &handshake, ErrorCode::Protocol, m).await;
    }
    if n > 1 && h.session.len() != SESSION_KEY_LEN {
        let m = format!("a session key is {SESSION_KEY_LEN} bytes");
        return fatal(&ctl, &conn, &handshake, ErrorCode::Protocol, m).await;
    }
    let started = Instant::now();
    let progress = Arc::new(Progress::default());
    // (The peak is the client's to remember.)
    let flow = match h.op {
        Op::Get { .. } => Flow::Tx,
        Op::Put { .. } => Flow::Rx,
    };
    let put = flow == Flow::Rx;
    let tuned = set_up(&ctx, &conn, &cc, (choice, rate), flow);
    let mut registered = None;
    let conns = if n > 1 {
        let (tx, mut joined) = mpsc::unbounded_channel::<Joined>();
        let mut seen = vec![false; n as usize];
        seen[0] = true;
        let taken = {
            let mut joins = ctx.joins.lock().unwrap();
            let taken = joins.contains_key(&h.session);
            if !taken {
                let tx = tx.clone();
                joins.insert(h.session.clone(), Joining { seen, put, tx });
            }
            taken
        };
        if taken {
            let m = "another session has this session key".to_string();
            return fatal(&ctl, &conn, &handshake, ErrorCode::Protocol, m).await;
        }
        let others = Arc::new(std::sync::Mutex::new(Some(Vec::new())));
        // Each connection that joins is set up as the first was, then goes
        // to the role; one that comes after the session is closed.
        let (more_tx, more) = mpsc::unbounded_channel();
        let (ctx2, others2) = (ctx.clone(), others.clone());
        tokio::spawn(async move {
            while let Some((i, c, cc)) = joined.recv().await {
                match others2.lock().unwrap().as_mut() {
                    Some(o) => o.push(c.clone()),
                    None => {
                        c.close(VarIntCode::DONE, b"the session is over");
                        continue;
                    }
                }
                set_up(&ctx2, &c, &cc, (choice, rate), flow);
                let _ = more_tx.send((i, c));
            }
        });
        registered = Some(Registered {
            ctx: ctx.clone(),
            key: h.session.clone(),
            tx,
            others,
        });
        Conns {
            first: conn.clone(),
            count: n as usize,
            more,
        }
    } else {
        Conns::one(conn.clone())
    };
    // (A put's: its client sends its files before this server's answer.)
    let early_files = h.fresh;
    let (what, result): (String, Result<SessionReport, Problem>) = match h.op {
        Op::Get {
            paths,
            filters,
            meta,
            listed,
        } => {
            let filter = match longhaul_transfer::filter::Filter::new(&filters) {
                Ok(f) => Arc::new(f),
                Err(e) => {
                    return fatal(&ctl, &conn, &handshake, ErrorCode::BadPath, e.to_string()).await
                }
            };
            // The client's --streams, else ours.
            // (At least one per connection.)
            let streams = match h.streams {
                0 => ctx.opts.streams,
                n => n.min(MAX_STREAMS) as usize,
            }
            .max(n as usize);
            let _ = ctl
                .send(Frame::Welcome {
                    version: VERSION,
                    server: server_name(),
                    fresh: h.fresh,
                    streams: streams as u32,
                })
                .await;
            // A shard's list of the files it wants, instead of a walk (it
            // sends it once welcomed).
            let mut only = match listed {
                true => match read_only(&mut rx, paths.len()).await {
                    Ok(lists) => Some(lists),
                    Err(m) => return fatal(&ctl, &conn, &handshake, ErrorCode::Protocol, m).await,
                },
                false => None,
            };
            let sources: Vec<SendRootResult> = paths
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let name = longhaul_transfer::landing::root_name(p);
                    let p = &follow_dir_links(&ctx.opts, p);
                    RelPath::from_request(p)
                        .map(|start| SendRoot {
                            dir: ctx.root.clone(),
                            start,
                            must_be_dir: p.ends_with(b"/"),
                            name,
                            only: only.as_mut().map(|l| std::mem::take(&mut l[i])),
                        })
                        .map_err(|e| (ErrorCode::BadPath, e.to_string()))
                })
                .collect();
            let what = format!("get of {} path(s)", paths.len());
            let (report, result) = run_sender(
                conns,
                ctl.clone(),
                &mut rx,
                sources,
                SendOpts {
                    streams,
                    max_rate: rate,
                    fresh: h.fresh,
                    send_window: tuned.send_window,
                    // (The client decides what it makes; its report says.)
                    peer_makes: (true, true),
                    filter,
                    meta,
                    welcome: None,
                },
                progress,
            )
            .await;
            (what, result.map(|()| report))
        }
        Op::Put {
            dest,
            dest_is_dir,
            roots,
            sync,
            durable,
            specials,
            delete,
            filters,
            dry_run,
            numeric_ids,
            shard,
        } => {
            let shard = match shard.map(|s| (Shard::new(s.index, s.count), s.finish)) {
                None => None,
                Some((Ok(s), finish)) if !(delete || dry_run) => Some((s, finish)),
                Some((Ok(_), _)) => {
                    let m = "a put's shard cannot delete or be a dry run";
                    return fatal(&ctl, &conn, &handshake, ErrorCode::Protocol, m.into()).await;
                }
                Some((Err(e), _)) => {
                    return fatal(&ctl, &conn, &handshake, ErrorCode::Protocol, e).await
                }
            };
            let protect = match delete {
                true => match longhaul_transfer::filter::Filter::new(&filters) {
                    Ok(f) => Some(Arc::new(f)),
                    Err(e) => {
                        return fatal(&ctl, &conn, &handshake, ErrorCode::BadPath, e.to_string())
                            .await
                    }
                },
                false => None,
            };
            let prefix = match RelPath::from_request(&follow_dir_links(&ctx.opts, &dest)) {
                Ok(p) => p,
                Err(e) => {
                    return fatal(&ctl, &conn, &handshake, ErrorCode::BadPath, e.to_string()).await
                }
            };
            let is_dir = prefix.is_root()
                || ctx
                    .root
                    .symlink_metadata(prefix.as_path())
                    .is_ok_and(|m| m.is_dir());
            let base = match ctx.root.try_clone() {
                Ok(b) => b,
                Err(e) => {
                    return fatal(&ctl, &conn, &handshake, ErrorCode::Io, e.to_string()).await
                }
            };
            let spec = Destination {
                base,
                landing: Landing {
                    prefix,
                    // (The client counted the roots and saw the slash.)
                    dest_is_dir: lands_in_dir(is_dir, dest_is_dir, 1),
                    roots: roots.into_iter().map(|r| r.name).collect(),
                },
            };
            // A put's shards share their plan in the destination: in the
            // directory the roots land in, or beside the one file.
            let sharding = match shard.map(|(s, finish)| put_sharding(&spec.landing, s, finish)) {
                None => None,
                Some(Ok(sh)) => Some(sh),
                Some(Err(e)) => {
                    return fatal(&ctl, &conn, &handshake, ErrorCode::BadPath, e.to_string()).await
                }
            };
            // None of the put's targets here, nor parts of them: the client
            // sends each file at once, and nothing is looked up or resumed.
            // (A dry run's client waits for a Want for each file, and so
            // does a shard's, which the server wants a part of.)
            let part = matches!(sharding, Some((_, false)));
            let fresh = !dry_run && !part && spec.is_fresh();
            let _ = ctl
                .send(Frame::Welcome {
                    version: VERSION,
                    server: server_name(),
                    fresh,
                    streams: 0,
                })
                .await;
            // A client that sent its files before this answer (as to a
            // fresh destination) into one that holds some of its targets:
            // none of it is read, and the client connects again and waits
            // for its `Want`s. (Its close ends this session.)
            if early_files && !fresh {
                tracing::info!(
                    "{remote}: a put sent before its answer, into a destination \
                     that holds some of its targets: dropped unread, the client sends again"
                );
                if handshake.done().await {
                    let _ = tokio::time::timeout(HELLO_WAIT, conn.closed()).await;
                }
                conn.close(VarIntCode::DONE, b"not fresh");
                return;
            }
            if early_files {
                tracing::debug!("{remote}: a fresh put whose files come before its answer");
            }
            // Nothing is created, placed or named before the handshake has
            // completed: a `Hello` that came in 0-RTT may be a replay, which
            // cannot complete it (the client's data, sent after this
            // `Welcome`, waits in quinn's buffers meanwhile).
            if !handshake.ended() {
                tracing::debug!("{remote}: a put before the handshake ended: its data waits");
            }
            if !handshake.done().await {
                tracing::debug!("{remote}: no handshake: the put's data is dropped unread");
                return;
            }
            let what = match (dry_run, fresh) {
                (true, _) => "dry-run put",
                (false, true) => "fresh put",
                (false, false) => "put",
            }
            .to_string();
            let opts = RecvOpts {
                keep: Some((ctx.kept.clone(), crate::kept::client_of(remote.ip()))),
                shard: sharding.clone().filter(|(_, f)| !f).map(|(s, _)| s),
                finish_plan: sharding.filter(|(_, f)| *f).map(|(s, _)| s),
                plan: None,
                sync: sync.into(),
                fresh,
                durable,
                exact_modes: ctx.opts.exact_modes,
                specials,
                // (A client must not plant device nodes in a served tree.)
                devices: false,
                delete: protect,
                dry_run,
                meta: longhaul_transfer::meta::Policy {
                    owners: is_root() && (ctx.opts.once || ctx.opts.keep_owners),
                    numeric_ids,
                    privileged: is_root() && ctx.opts.exact_modes,
                },
            };
            let not_held = longhaul_transfer::meta::not_held();
            let (report, result) =
                run_receiver(conns, ctl.clone(), &mut rx, spec, opts, progress).await;
            let n = longhaul_transfer::meta::not_held() - not_held;
            if n > 0 {
                tracing::warn!(
                    "{remote}: {n} item(s) placed without their extended attributes or ACLs: this file system keeps none"
                );
            }
            (what, result.map(|()| report))
        }
    };
    // The session's other connections end with it (and none joins now).
    let _registered = registered;
    let secs = started.elapsed().as_secs_f64();
    tracing::debug!("{remote}: connection stats: {:?}", conn.stats());
    // A get's client closes as soon as it has settled every file; its Done
    // may not have been read yet.
    if result.is_err() && conn.close_reason().is_some_and(|e| crate::close::done(&e)) {
        tracing::info!("{remote}: {what}: the client closed as done after {secs:.2} s");
        return;
    }
    let silent = conn.close_reason().is_some_and(|e| lost(&e));
    match &result {
        Ok(r) => {
            let behind = match r.held_back_s {
                b if b >= 0.2 && put => {
                    format!("; behind for {b:.1} s (this side's disk set the pace)")
                }
                b if b >= 0.2 => {
                    format!("; the client was behind for {b:.1} s (its disk set the pace)")
                }
                _ => String::new(),
            };
            tracing::info!(
                "{remote}: {what}: {} file(s), {} problem(s) in {secs:.2} s{behind}",
                r.files.len(),
                r.problems.len()
            );
            for p in &r.problems {
                tracing::warn!("{remote}: {what}: {p}");
            }
        }
        // (Said once: its client may be riding the outage out.)
        Err(p) if silent => {
            let why = conn
                .close_reason()
                .map(|e| e.to_string())
                .unwrap_or_default();
            let kept = match put {
                true => "; the parts and journals of its unfinished files stay for its resume",
                false => "",
            };
            tracing::info!(
                "{remote}: {what}: the client went silent ({why}) after {secs:.2} s{kept}: {p}"
            );
        }
        Err(p) => tracing::warn!("{remote}: {what} failed: {p}"),
    }
    let failed = result.is_err();
    if let Err(p) = result {
        // (A connection gone silent can carry no Fatal.)
        if p.kind != crate::report::Kind::LocalIo && !silent {
            return fatal(&ctl, &conn, &handshake, ErrorCode::Protocol, p.message).await;
        }
    }
    drop(ctl);
    let writer = writer.await;
    // The session is over: close it here rather than wait for the client's
    // close (a single datagram; lost, it left this session to the idle
    // timeout, holding its memory and, on a put, its files). A get's client
    // has sent `Done`, all it needed is in. A put's client needs our `Done`
    // (and a failed session's client our `Fatal`): close once the client has
    // acknowledged all of the control stream, and give its own close a
    // moment: the client reads our `Done` just after acknowledging it, and
    // a close that overtakes its reading loses what quinn had not yet handed
    // over (a short session's Welcome and Done, all within the handshake).
    if put || failed {
        if let Ok(Ok(send)) = writer {
            let acked = tokio::time::timeout(Duration::from_secs(30), async {
                tokio::select! {
                    _ = send.stopped() => {}
                    _ = conn.closed() => {}
                }
            })
            .await;
            if acked.is_ok() {
                let grace =
                    (conn.rtt() * 2 + Duration::from_millis(200)).min(Duration::from_secs(5));
                let _ = tokio::time::timeout(grace, conn.closed()).await;
            }
        }
    }
    close_sent(&conn, 0, b"done").await;
}

/// Most paths, and path bytes, a listed get may name (`Frame::Only`): a
/// shard of a tree of ten million files, and what it costs a server to
/// hold them.
const MAX_ONLY: (usize, usize) = (10_000_000, 1 << 30);

/// A listed get's `Only` frames, up to its `OnlyEnd`: per root, the paths
/// it wants. An error says what is wrong with them.
async fn read_only(rx: &mut CtlRx, roots: usize) -> Result<Vec<Vec<RelPath>>, String> {
    let mut lists = vec![Vec::new(); roots];
    let (mut count, mut bytes) = (0usize, 0usize);
    loop {
        match rx.recv().await {
            Some(Ok(Frame::Only(items))) => {
                for (root, path) in items {
                    count += 1;
                    bytes += path.len();
                    if count > MAX_ONLY.0 || bytes > MAX_ONLY.1 {
                        return Err(format!(
                            "a listed get names more than {} paths or {} bytes of them",
                            MAX_ONLY.0, MAX_ONLY.1
                        ));
                    }
                    let p = RelPath::from_wire(&path).map_err(|e| e.to_string())?;
                    if p.is_root() {
                        return Err("a listed get names a root itself".into());
                    }
                    lists
                        .get_mut(root as usize)
                        .ok_or_else(|| format!("a listed path of root {root}, of {roots}"))?
                        .push(p);
                }
            }
            Some(Ok(Frame::OnlyEnd)) => return Ok(lists),
            Some(Ok(other)) => return Err(format!("{other:?} among a listed get's paths")),
            Some(Err(p)) => return Err(p.to_string()),
            None => return Err("the client went before the end of its list".into()),
        }
    }
}

/// A put's shard and where its shards share their plan: in the directory
/// the roots land in, or beside the one file (`finish`: the put that ends
/// them).
fn put_sharding(
    l: &Landing,
    shard: Shard,
    finish: bool,
) -> Result<(crate::sharding::Sharding, bool), longhaul_transfer::PathError> {
    use longhaul_transfer::place::sibling_name;
    let plan = match (l.dest_is_dir, l.prefix.parent()) {
        (false, Some(parent)) => parent.join_name(&sibling_name(
            l.prefix.file_name(),
            longhaul_transfer::sibling::PLAN,
        ))?,
        _ => l.prefix.join_name(b".longhaul.lh-plan")?,
    };
    let roots: Vec<String> = l
        .roots
        .iter()
        .map(|r| longhaul_transfer::shown(&String::from_utf8_lossy(r)).into_owned())
        .collect();
    let sharding = crate::sharding::Sharding {
        shard,
        plan_file: crate::sharding::PlanAt::Dest(plan),
        source: format!("put {} {}", l.prefix.display(), roots.join(" ")),
    };
    Ok((sharding, finish))
}

fn server_name() -> String {
    format!("longhaul {}", env!("CARGO_PKG_VERSION"))
}
