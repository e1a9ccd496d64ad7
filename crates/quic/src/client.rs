//! `longhaul get` and `longhaul put`: connect, pin the server, send the whole
//! request at once, then play receiver (get) or sender (put).

use crate::cc::CcChoice;
use crate::close::{close_sent, lost, until, INTERRUPTED};
use crate::conns::Conns;
use crate::control::{spawn_reader, spawn_writer, CtlRx, CtlTx};
use crate::identity::{KnownHosts, PinVerifier, TrustOutcome, TrustPolicy};
use crate::net::{
    endpoint, spawn_receive_floor, spawn_window_tuner, udp_socket, Flow, NetOpts, Tuned,
    DEFAULT_PORT,
};
use crate::proto::{ErrorCode, Frame, Hello, Op, RootSpec, MAX_CONNECTIONS, VERSION};
use crate::rates::{worth_remembering, RateMemory};
use crate::receiver::{is_root, run_receiver, Destination, RecvOpts};
use crate::report::{
    ClientReport, ConnUse, Kind, Outage, Problem, Progress, SessionReport, Totals, ZeroRtt,
};
use crate::sender::{run_sender, SendOpts, SendRoot, SendRootResult};
use cap_std::fs::Dir;
use longhaul_transfer::landing::{self, Landing};
use longhaul_transfer::sync::SyncMode;
use longhaul_transfer::RelPath;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How a client's [`get`] or [`put`] runs.
#[derive(Debug, Clone)]
pub struct ClientOpts {
    /// How the server's certificate is trusted: the known-hosts file,
    /// `--fingerprint`, `--accept-new`.
    pub trust: TrustPolicy,
    /// The secret sent in `Hello.token` (`--token-file`); empty when none. A
    /// server without a token accepts any.
    pub token: Vec<u8>,
    /// Controller for the sending side (None: the sender's default).
    pub cc: Option<CcChoice>,
    /// This side's socket, window and controller settings; its `max_rate`
    /// also goes to the server as `Hello.max_rate`.
    pub net: NetOpts,
    /// Data streams the sending side uses; 0 leaves it to that side (4, or a
    /// server's `--streams` on a get).
    pub streams: usize,
    /// QUIC connections the transfer runs over (`--connections`), each its
    /// own endpoint, socket and controller; 0 or 1: one. At most
    /// [`MAX_CONNECTIONS`].
    pub connections: usize,
    /// Which files already at the destination are skipped (`--sync`,
    /// `--sync --checksum`): the client applies it on a get, the server on a
    /// put (`Op::Put.sync`).
    pub sync: SyncMode,
    /// The rate memory (`crate::rates`): None keeps none.
    pub rates: Option<PathBuf>,
    /// The receiving side names a file only once its data is synced, and
    /// syncs its file system before it reports (false: `--no-fsync`).
    pub durable: bool,
    /// A get keeps the modes received exactly (`--exact-modes`), setuid,
    /// setgid, sticky and world-write bits included; else within
    /// [`longhaul_transfer::place::SAFE_MODE_BITS`].
    pub exact_modes: bool,
    /// The receiving side makes the FIFOs and sockets sent (`--specials`);
    /// else each is listed as not made.
    pub specials: bool,
    /// A get makes the device nodes sent (`--devices`, as root); a put's
    /// server never does.
    pub devices: bool,
    /// What the sending side leaves out (`--exclude`, `--include`): a get
    /// sends them to the server (`Op::Get.filters`), a put applies them.
    pub filters: Vec<longhaul_transfer::filter::Rule>,
    /// The receiving side removes what the destination's directories hold
    /// that the transfer does not send, except what `filters` leave out
    /// (`--delete`).
    pub delete: bool,
    /// Nothing is written at the destination: the transfer lists what it
    /// would change (`--dry-run`).
    pub dry_run: bool,
    /// The extended attributes and ACLs that go with each entry
    /// (`--xattrs`, `--acls`).
    pub meta: longhaul_transfer::meta::Wanted,
    /// Owners go by number, not by name (`--numeric-ids`).
    pub numeric_ids: bool,
    /// Closes the transfer's connection on Ctrl-C.
    pub interrupt: Interrupt,
    /// How long the handshake may go unanswered before the server is taken
    /// as unreachable over UDP (None: the idle timeout, 15 s). A one-shot
    /// server started over ssh is known to be up, so silence there means
    /// UDP is blocked, and the user hears it within seconds.
    pub connect_timeout: Option<Duration>,
    /// How long a transfer whose connection was lost (a dead path, a
    /// server restarting) keeps trying to reconnect and resume before it
    /// fails (`--retry-for`); zero: it fails at once. Counted from each
    /// loss. The first connection of a run is not retried.
    pub retry_for: Duration,
    /// Set when the server cannot come back (`--ssh`: the ssh session that
    /// started it ended): a lost connection is then not retried.
    pub gone: Arc<std::sync::atomic::AtomicBool>,
    /// One shard of a transfer (`--shard K/N`: it moves its part of the
    /// files by the plan shared in the plan file, a get's here, a put's at
    /// the server), or its finish (`--shard finish`).
    pub shard: Option<crate::sharding::ShardRole>,
}

/// A handle on a transfer's connection for the user's Ctrl-C: dropping the
/// transfer alone sends no close before the process exits, and the server
/// then holds the session, and the files it was receiving, until its idle
/// timeout (a rerun of a put within it was refused: "already being
/// received").
#[derive(Debug, Clone, Default)]
pub struct Interrupt(Arc<std::sync::Mutex<Option<(quinn::Endpoint, quinn::Connection)>>>);

impl Interrupt {
    fn set(&self, endpoint: &quinn::Endpoint, conn: &quinn::Connection) {
        *self.0.lock().unwrap() = Some((endpoint.clone(), conn.clone()));
    }

    /// Close the connection, if one is up, and wait (at most 250 ms) until
    /// the close has left.
    pub async fn close(&self) {
        let Some((endpoint, conn)) = self.0.lock().unwrap().take() else {
            return;
        };
        close_sent(&conn, INTERRUPTED, b"interrupted by the user").await;
        drop(endpoint);
    }
}

impl ClientOpts {
    /// The data streams this client sends on (a put): its `--streams`, else
    /// [`DEFAULT_STREAMS`].
    fn send_streams(&self) -> usize {
        match self.streams {
            0 => DEFAULT_STREAMS,
            n => n,
        }
    }

    /// The controller the sending side runs: the user's, else the default.
    fn cc_choice(&self) -> CcChoice {
        self.cc.unwrap_or(self.net.cc)
    }

    /// Defaults for a server whose fingerprint is already known (pinned), as the
    /// demo and tests have it: no token, the sender's streams, no sync, the sender's controller.
    pub fn pinned(host: String, known_hosts: PathBuf, fingerprint: String) -> ClientOpts {
        ClientOpts {
            trust: TrustPolicy {
                host,
                known_hosts: Some(known_hosts),
                pinned: Some(fingerprint),
                accept_new: false,
            },
            token: vec![],
            cc: None,
            net: NetOpts::default(),
            streams: 0,
            connections: 1,
            connect_timeout: None,
            retry_for: Duration::ZERO,
            gone: Default::default(),
            sync: SyncMode::SizeMtime,
            rates: None,
            durable: true,
            exact_modes: false,
            specials: false,
            devices: false,
            filters: Vec::new(),
            delete: false,
            dry_run: false,
            meta: Default::default(),
            numeric_ids: false,
            interrupt: Interrupt::default(),
            shard: None,
        }
    }
}

/// A listed get's `Only` frames: every file of the plan that shard `shard`
/// moves (whole, or a slice of), then `OnlyEnd`.
async fn send_only(
    ctl: &crate::control::CtlTx,
    plan: &longhaul_transfer::shard::Plan,
    shard: u32,
) -> Result<(), Problem> {
    use longhaul_transfer::shard::Part;
    let mine: Vec<(u32, Vec<u8>)> = plan
        .listing()
        .items()
        .iter()
        .enumerate()
        .filter(|&(i, _)| plan.part(i, shard) != Part::None)
        // (A root's own entry comes unasked: a file fetched as a root.)
        .filter(|(_, it)| !it.path.is_empty())
        .map(|(_, it)| (it.root, it.path.clone()))
        .collect();
    for batch in mine.chunks(crate::proto::ONLY_PER_FRAME) {
        ctl.send(Frame::Only(batch.to_vec())).await?;
    }
    ctl.send(Frame::OnlyEnd).await
}

/// `HOST:PORT`, an IPv6 host in brackets: the inverse of [`split_host_port`].
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `HOST[:PORT]` as typed; IPv6 literals in brackets (`[::1]:7878`).
pub fn split_host_port(s: &str) -> Result<(String, u16), String> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("{s:?}: missing ']'"))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| format!("{s:?}: bad port"))?,
            None if tail.is_empty() => DEFAULT_PORT,
            None => return Err(format!("{s:?}: junk after ']'")),
        };
        return Ok((h.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Ok((
            h.to_string(),
            p.parse().map_err(|_| format!("{s:?}: bad port {p:?}"))?,
        )),
        None => Ok((s.to_string(), DEFAULT_PORT)),
    }
}

struct Session {
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
    /// The session's other connections (`--connections`), joined.
    extra: Vec<Extra>,
    ctl: CtlTx,
    writer: crate::control::Writer,
    rx: CtlRx,
    fingerprint: Option<String>,
    server: String,
    /// The server's `Welcome.fresh`: the session runs without `Want`s.
    fresh: bool,
    /// The server's `Welcome.streams`: a get's data streams.
    streams: u32,
    welcomed: Instant,
    /// The connection's congestion controller.
    cc: Option<Arc<crate::cc::CcHandle>>,
    zero_rtt: ZeroRtt,
    /// A put that sends its files in its first flight, before the handshake
    /// and the server's `Welcome` (see [`EarlyPut`]).
    early: Option<EarlyPut>,
}

/// A put that started before its connection's handshake completed and its
/// `Welcome` came ([`crate::sender::SendOpts::welcome`]): both come while
/// its files go.
struct EarlyPut {
    /// The handshake's end: whether the server accepted the 0-RTT data, or
    /// why the connection failed (as [`connect`] says it).
    handshake: tokio::sync::watch::Receiver<Option<Result<bool, Problem>>>,
    welcome: Arc<crate::sender::Welcomed>,
}

/// How a put that started early went, once its sender stopped.
enum Early {
    /// Welcomed, to a fresh destination: the session as any other.
    Welcomed(String),
    /// Its data is lost (0-RTT refused) or was for a fresh destination the
    /// server does not have (`there`: its targets are there): the put goes
    /// again, waiting for the answer.
    Again { why: &'static str, there: bool },
    /// The handshake failed.
    Failed(Problem),
    /// No `Welcome` came: the sender's own end stands.
    Unwelcomed,
}

impl EarlyPut {
    async fn outcome(mut self) -> Early {
        let shake = match self.handshake.wait_for(Option::is_some).await {
            Ok(v) => v.clone().expect("waited for"),
            Err(_) => return Early::Unwelcomed,
        };
        match (shake, self.welcome.get()) {
            (Err(p), _) => Early::Failed(p),
            (Ok(false), _) => Early::Again {
                why: "the server refused the ticket: its 0-RTT data was dropped",
                there: false,
            },
            (Ok(true), Some((_, false))) => Early::Again {
                why: "the destination holds some of the put's targets",
                there: true,
            },
            (Ok(true), Some((server, true))) => Early::Welcomed(server),
            (Ok(true), None) => Early::Unwelcomed,
        }
    }
}

impl Session {
    /// Tunes every connection of the session for the role of `flow` (its
    /// windows; on a get, the receiver's floor under its controller) and
    /// returns the first one's tuner and all of them for the role to run over.
    fn tune(&self, opts: &ClientOpts, flow: Flow) -> (Tuned, Conns) {
        let tune = |conn: &quinn::Connection, cc: &Option<Arc<crate::cc::CcHandle>>| {
            if let (Flow::Rx, Some(cc)) = (flow, cc) {
                spawn_receive_floor(conn.clone(), cc.clone());
            }
            spawn_window_tuner(conn.clone(), opts.net, flow, None)
        };
        let tuned = tune(&self.conn, &self.cc);
        for e in &self.extra {
            tune(&e.conn, &e.cc);
        }
        let others = self.extra.iter().map(|e| e.conn.clone()).collect();
        (tuned, Conns::known(self.conn.clone(), others))
    }
}

/// quinn's figures of a session's connections, the first first.
fn stats_of(first: &quinn::Connection, extra: &[Extra]) -> Vec<quinn::ConnectionStats> {
    let extra = extra.iter().map(|e| e.conn.stats());
    std::iter::once(first.stats()).chain(extra).collect()
}

/// Data streams a sender uses when nobody says (`--streams`).
pub const DEFAULT_STREAMS: usize = 4;

fn conn_err(msg: impl Into<String>) -> Problem {
    Problem::new(Kind::Connection, msg)
}

/// `p`, marked [transient](Problem::transient) when `conn` was [`lost`].
fn marked(mut p: Problem, conn: &quinn::Connection) -> Problem {
    if conn.close_reason().is_some_and(|e| lost(&e)) {
        p.transient = true;
    }
    p
}

/// The verifier's verdict on the server's certificate, once the handshake ran.
type Outcome = Arc<std::sync::Mutex<Option<crate::identity::TrustOutcome>>>;

/// An endpoint, its connection under way, the connection's controller, and
/// the trust verdict to be.
type Dialed = (
    quinn::Endpoint,
    quinn::Connecting,
    Option<Arc<crate::cc::CcHandle>>,
    Outcome,
);

/// A new endpoint (its own UDP socket) and a connection to `addr` under way,
/// trusting the server as `trust` says; its controller's handle. `sends`:
/// this side sends the data (a put); a get's client sends ACKs and small
/// control frames (a FileResult per file, a Want per file when the
/// destination is not fresh), so it does not probe its path's MTU: a probe
/// is a datagram of padding, 1.2 % of what 10 x 10 kB put on a 256 kbit/s
/// link.
fn dial(
    addr: SocketAddr,
    opts: &ClientOpts,
    trust: TrustPolicy,
    sends: bool,
) -> Result<Dialed, Problem> {
    let verifier = Arc::new(PinVerifier::new(trust.clone()));
    let outcome = verifier.outcome.clone();
    let mut tls =
        crate::identity::client_tls(verifier.clone()).map_err(|e| conn_err(e.to_string()))?;
    // A known server's tickets and tokens, kept between runs (0-RTT).
    let resume = crate::resume::Resume::new(&trust, &tls, verifier, outcome.clone());
    if let Some(r) = &resume {
        tls.resumption = rustls::client::Resumption::store(r.clone());
        tls.enable_early_data = true;
    }
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| conn_err(e.to_string()))?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    if let Some(r) = resume {
        cfg.token_store(r);
    }
    // (Each connection of a session over several gets its part of a hint.)
    let choice = opts.cc_choice().shared(opts.connections);
    let factory = crate::cc::CcFactory::new(choice, opts.net.max_rate);
    cfg.transport_config(Arc::new(opts.net.transport(addr, factory.clone(), sends)));
    let bind: SocketAddr = if addr.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .unwrap();
    let socket = udp_socket(bind).map_err(|e| conn_err(format!("{e:#}")))?;
    let endpoint = endpoint(socket, None).map_err(|e| conn_err(format!("{e:#}")))?;
    let connecting = endpoint
        .connect_with(cfg, addr, "longhaul")
        .map_err(|e| conn_err(format!("connecting to {addr}: {e}")))?;
    // (connect_with builds the connection, and its controller, at once.)
    let cc = factory.take_last();
    Ok((endpoint, connecting, cc, outcome))
}

/// One more connection of a session over several (`--connections`): its own
/// endpoint and socket, so that its packets are another task's and another
/// socket's work.
pub(crate) struct Extra {
    /// Kept for the connection's life (its socket and driver).
    _endpoint: quinn::Endpoint,
    pub(crate) conn: quinn::Connection,
    pub(crate) cc: Option<Arc<crate::cc::CcHandle>>,
}

/// The SHA-256 fingerprint of the certificate `conn`'s server presented.
fn peer_fingerprint(conn: &quinn::Connection) -> Option<String> {
    let certs = conn
        .peer_identity()?
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    certs.first().map(|c| crate::identity::fingerprint(c))
}

/// Another connection of a session: the handshake, trusting only the
/// certificate the first connection was shown.
async fn handshake(
    addr: SocketAddr,
    opts: ClientOpts,
    trust: TrustPolicy,
    sends: bool,
) -> Result<Extra, Problem> {
    let (endpoint, connecting, cc, _) = dial(addr, &opts, trust, sends)?;
    let t = opts.connect_timeout.unwrap_or(Duration::from_secs(15));
    let conn = match tokio::time::timeout(t, connecting).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(conn_err(e.to_string())),
        Err(_) => return Err(conn_err(format!("no answer within {} s", t.as_secs()))),
    };
    Ok(Extra {
        _endpoint: endpoint,
        conn,
        cc,
    })
}

/// Joins `extra` to the session as connection `index`: a control stream
/// whose only frame is the `Join`. Sent after the session's `Welcome` (a
/// refused `Hello` then costs no Join, nor a wrong token N guesses); the
/// server answers nothing unless it refuses (then it closes the
/// connection, and the session fails, naming why).
async fn send_join(
    extra: &Extra,
    opts: &ClientOpts,
    session: &[u8],
    index: u32,
) -> Result<(), Problem> {
    let join = Frame::Join {
        version: VERSION,
        token: opts.token.clone(),
        session: session.to_vec(),
        index,
    };
    let sent = async {
        let (mut send, _recv) = extra.conn.open_bi().await?;
        send.write_all(&crate::proto::encode(&join)).await?;
        send.finish()?;
        Ok::<_, anyhow::Error>(())
    };
    sent.await
        .map_err(|e| conn_err(format!("connection {index}: sending its Join: {e:#}")))
}

/// A random session key ([`Hello::session`]).
fn session_key() -> Result<Vec<u8>, Problem> {
    use ring::rand::SecureRandom;
    let mut key = vec![0u8; crate::proto::SESSION_KEY_LEN];
    ring::rand::SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| conn_err("no randomness for a session key"))?;
    Ok(key)
}

/// The control stream opened and `hello` written to it: its writer, the
/// writer's task, the reader of the server's frames, and whether the stream
/// was opened in 0-RTT (before the handshake completed).
async fn send_hello(
    conn: &quinn::Connection,
    hello: Frame,
) -> Result<(CtlTx, crate::control::Writer, CtlRx, bool), Problem> {
    let (send, recv) = conn
        .open_bi()
        .await
        .map_err(|e| conn_err(format!("opening the control stream: {e}")))?;
    let early = recv.is_0rtt();
    let (ctl, writer) = spawn_writer(send);
    let rx = spawn_reader(recv);
    ctl.send(hello).await?;
    Ok((ctl, writer, rx, early))
}

/// No handshake within `t`.
fn no_answer(host: &str, port: u16, addr: SocketAddr, t: Duration) -> Problem {
    let named = join_host_port(host, port);
    let shown = if named == addr.to_string() {
        named
    } else {
        format!("{named} ({addr})")
    };
    Problem {
        transient: true,
        ..conn_err(format!(
            "no answer over UDP from {shown} within {} s: the server was started, \
             so UDP port {port} is likely blocked between the hosts (a firewall), \
             or the answers do not come back",
            t.as_secs()
        ))
    }
}

/// The handshake failed with `e`; `trust` is what the verifier saw.
fn connect_error(
    e: quinn::ConnectionError,
    trust: Option<&TrustOutcome>,
    opts: &ClientOpts,
    host: &str,
    port: u16,
    addr: SocketAddr,
) -> Problem {
    if let Some(msg) =
        trust.and_then(|t| t.refusal(&opts.trust.host, opts.trust.known_hosts.as_deref()))
    {
        return conn_err(msg);
    }
    let shown = join_host_port(host, port);
    let hint = match e {
        quinn::ConnectionError::TimedOut => format!(
            " (no answer: is `longhaul serve` running there, and does UDP port {port} reach it?)"
        ),
        _ => String::new(),
    };
    Problem {
        transient: lost(&e),
        ..conn_err(format!("cannot connect to {shown} ({addr}): {e}{hint}"))
    }
}

async fn connect(
    host: &str,
    port: u16,
    opts: &ClientOpts,
    op: Op,
    fresh: bool,
) -> Result<Session, Problem> {
    let op_is_get = matches!(op, Op::Get { .. });
    let addr: SocketAddr = tokio::net::lookup_host((host, port))
        .await
        // (A name that resolved before may not while the path is down.)
        .map_err(|e| Problem {
            transient: true,
            ..conn_err(format!("cannot resolve {host}: {e}"))
        })?
        .next()
        .ok_or_else(|| conn_err(format!("{host} has no address")))?;
    let (endpoint, connecting, cc, outcome) = dial(addr, opts, opts.trust.clone(), !op_is_get)?;
    let n = opts.connections.clamp(1, MAX_CONNECTIONS as usize);
    let session = if n > 1 { session_key()? } else { vec![] };
    let hello = Hello {
        version: VERSION,
        token: opts.token.clone(),
        op,
        max_rate: opts.net.max_rate,
        cc: opts.cc.map(|c| c.name()),
        fresh,
        streams: if op_is_get {
            opts.streams.min(u32::MAX as usize) as u32
        } else {
            0
        },
        connections: n as u32,
        session: session.clone(),
    };
    // A put's `Hello.fresh` says that its files go before the answer, which
    // only one started in the first flight does.
    let (early_hello, hello) = (
        Frame::Hello(hello.clone()),
        Frame::Hello(Hello {
            fresh: fresh && op_is_get,
            ..hello
        }),
    );
    let failed = |e: quinn::ConnectionError| {
        let trust = outcome.lock().unwrap().clone();
        connect_error(e, trust.as_ref(), opts, host, port, addr)
    };
    // A known server whose ticket this client holds: the Hello goes in the
    // first flight (0-RTT), and the handshake completes meanwhile. The
    // server acts on an early Hello only where a replay of it could do no
    // harm (docs/PROTOCOL.md, "0-RTT"); a refused one is sent again.
    let (conn, early, zero_rtt) = match connecting.into_0rtt() {
        // A put to a fresh destination (the caller's guess, `fresh`) does
        // not wait for the handshake or the answer: its files go in the
        // first flight too, and wait in the server's buffers until the
        // handshake has completed (docs/PROTOCOL.md, "0-RTT").
        Ok((conn, accepted)) if !op_is_get && fresh && n == 1 => {
            opts.interrupt.set(&endpoint, &conn);
            // (No RTT is measured before the server's first answer: the
            // first data, its train, is timed by the last connection's.)
            let rtt = crate::resume::Memo::new(&opts.trust).and_then(|m| m.rtt());
            if let (Some(cc), Some(rtt)) = (&cc, rtt) {
                cc.seed_rtt(rtt);
            }
            let (ctl, writer, rx, _) = send_hello(&conn, early_hello).await?;
            let (done, handshake) = tokio::sync::watch::channel(None);
            let (c, o, opts, host) = (
                conn.clone(),
                outcome.clone(),
                opts.clone(),
                host.to_string(),
            );
            tokio::spawn(async move {
                let ended = match opts.connect_timeout {
                    None => Ok(accepted.await),
                    Some(t) => tokio::time::timeout(t, accepted)
                        .await
                        .map_err(|_| no_answer(&host, port, addr, t)),
                };
                let ended = ended.and_then(|accepted| match c.close_reason() {
                    Some(e) if !(accepted && crate::close::done(&e)) => {
                        let trust = o.lock().unwrap().clone();
                        Err(connect_error(e, trust.as_ref(), &opts, &host, port, addr))
                    }
                    _ => Ok(accepted),
                });
                // (Refused or failed, what was sent is lost: the sender
                // stops with the connection.)
                if ended != Ok(true) {
                    c.close(quinn::VarInt::from_u32(0), b"again");
                }
                let _ = done.send(Some(ended));
            });
            return Ok(Session {
                endpoint,
                conn,
                extra: Vec::new(),
                ctl,
                writer,
                rx,
                fingerprint: None,
                server: String::new(),
                fresh: true,
                streams: 0,
                welcomed: Instant::now(),
                cc,
                zero_rtt: ZeroRtt::Accepted,
                early: Some(EarlyPut {
                    handshake,
                    welcome: Default::default(),
                }),
            });
        }
        Ok((conn, accepted)) => {
            opts.interrupt.set(&endpoint, &conn);
            // (A session over several connections pins the others to the
            // certificate this one was shown: the handshake first.)
            // (Its failure is the handshake's, said below, when that failed.)
            let sent = if n == 1 {
                Some(send_hello(&conn, hello.clone()).await)
            } else {
                None
            };
            // (`accepted` resolves when the handshake completes, and, as
            // false, when the connection ends before that: then it has a
            // close reason.)
            let accepted = match opts.connect_timeout {
                None => accepted.await,
                Some(t) => tokio::time::timeout(t, accepted)
                    .await
                    .map_err(|_| no_answer(host, port, addr, t))?,
            };
            // (A session so short that the server answered, ended it and
            // closed within the handshake has its frames still to read.)
            if let Some(e) = conn.close_reason() {
                if !(accepted && crate::close::done(&e) && matches!(sent, Some(Ok(_)))) {
                    return Err(failed(e));
                }
            }
            let zero_rtt = match (&sent, accepted) {
                (None, _) => ZeroRtt::None,
                (Some(_), true) => ZeroRtt::Accepted,
                (Some(_), false) => ZeroRtt::Refused,
            };
            // Refused: the Hello is sent again below, unless its stream
            // was opened after the handshake had completed after all (a
            // busy client): then it went in 1-RTT, and is the one.
            let sent = match sent {
                Some(Ok((ctl, writer, rx, early))) if accepted || !early => Some((ctl, writer, rx)),
                Some(Err(p)) if accepted => return Err(p),
                _ => None,
            };
            (conn, sent, zero_rtt)
        }
        Err(connecting) => {
            let conn = match opts.connect_timeout {
                None => connecting.await,
                Some(t) => tokio::time::timeout(t, connecting)
                    .await
                    .map_err(|_| no_answer(host, port, addr, t))?,
            }
            .map_err(failed)?;
            opts.interrupt.set(&endpoint, &conn);
            (conn, None, ZeroRtt::None)
        }
    };
    let trust = outcome.lock().unwrap().clone();
    let fingerprint = match &trust {
        Some(TrustOutcome::New(fp)) => {
            match &opts.trust.known_hosts {
                Some(kh) => {
                    KnownHosts::new(kh.clone())
                        .add(&opts.trust.host, fp)
                        .map_err(|e| Problem::new(Kind::LocalIo, format!("{e:#}")))?;
                    tracing::info!("added {} {fp} to {}", opts.trust.host, kh.display());
                    Some(fp.clone())
                }
                // Pinned for this connection only (a one-shot server over ssh).
                None => None,
            }
        }
        _ => None,
    };
    // The other connections handshake while the Hello goes out and is
    // answered; each trusts only the certificate this one was shown.
    let mut joining = Vec::new();
    if n > 1 {
        let fp = peer_fingerprint(&conn)
            .ok_or_else(|| conn_err("the server presented no certificate"))?;
        let trust = TrustPolicy {
            host: opts.trust.host.clone(),
            known_hosts: None,
            pinned: Some(fp),
            accept_new: false,
        };
        for _ in 1..n {
            let (opts, trust) = (opts.clone(), trust.clone());
            joining.push(tokio::spawn(handshake(addr, opts, trust, !op_is_get)));
        }
    }
    let (ctl, writer, mut rx) = match early {
        Some(sent) => sent,
        None => {
            let (ctl, writer, rx, _) = send_hello(&conn, hello)
                .await
                .map_err(|p| marked(p, &conn))?;
            (ctl, writer, rx)
        }
    };
    let (server, fresh, streams) = match rx.recv().await {
        Some(Ok(Frame::Welcome {
            server,
            fresh,
            streams,
            ..
        })) => (server, fresh, streams),
        Some(Ok(Frame::Fatal { code, message })) => {
            let kind = Kind::of_peer(code);
            return Err(Problem::new(kind, format!("the server refused: {message}")));
        }
        Some(Ok(other)) => {
            return Err(conn_err(format!(
                "protocol error: expected Welcome, got {other:?}"
            )))
        }
        Some(Err(p)) => return Err(marked(p, &conn)),
        None => {
            let why = conn
                .close_reason()
                .map(|r| r.to_string())
                .unwrap_or_default();
            let p = conn_err(format!("the server closed the connection {why}"));
            return Err(marked(p, &conn));
        }
    };
    let mut extra = Vec::new();
    for (i, j) in joining.into_iter().enumerate() {
        let index = i as u32 + 1;
        let e = j
            .await
            .map_err(|e| conn_err(format!("connection {index}: {e}")))?
            .map_err(|p| conn_err(format!("connection {index}: {}", p.message)))?;
        send_join(&e, opts, &session, index).await?;
        extra.push(e);
    }
    Ok(Session {
        endpoint,
        conn,
        extra,
        ctl,
        writer,
        rx,
        fingerprint,
        server,
        fresh,
        streams,
        welcomed: Instant::now(),
        cc,
        zero_rtt,
        early: None,
    })
}

/// Close once this side's role is over. The client of a get received the
/// last data: with every file settled and `Done` sent it closes at once (the
/// server's end of the control stream would come a round trip later and say
/// nothing it needs). The client of a put waits for the server's `Done`, which
/// its end of the control stream follows.
async fn close(
    s: Session,
    started: Instant,
    op: &'static str,
    opts: &ClientOpts,
    r: SessionReport,
) -> ClientReport {
    let Session {
        endpoint,
        conn,
        extra,
        ctl,
        writer,
        mut rx,
        fingerprint,
        server,
        fresh: _,
        streams,
        welcomed,
        cc: _,
        zero_rtt,
        early: _,
    } = s;
    let data_seconds = welcomed.elapsed().as_secs_f64();
    // (A put to this server that starts in its first flight times its first
    // data by this.)
    if let Some(m) = crate::resume::Memo::new(&opts.trust) {
        m.set_rtt(conn.rtt());
    }
    let frames = conn.stats().frame_tx.stream;
    drop(ctl);
    let _ = writer.await;
    if op == "put" {
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while rx.recv().await.is_some() {}
        })
        .await;
    } else {
        // quinn drops stream data it has not sent when the connection
        // closes: let the end of the control stream (Done, then its FIN, a
        // STREAM frame after `frames`) leave first. Losing it costs only the
        // server's summary of the session. A server that had our Done may
        // have closed already: then nothing more can leave (on a LAN one get
        // in five or ten waited the whole 50 ms for it, a quarter of 2,000
        // files of 10 kB).
        until(Duration::from_millis(50), || {
            conn.stats().frame_tx.stream > frames || conn.close_reason().is_some()
        })
        .await;
    }
    let all = stats_of(&conn, &extra);
    tracing::debug!("connection stats: {:?}", all[0]);
    close_sent(&conn, 0, b"done").await;
    for e in &extra {
        close_sent(&e.conn, 0, b"done").await;
    }
    drop(extra);
    drop(endpoint);
    let about = About {
        op,
        server,
        fingerprint,
        streams,
        data_seconds,
        zero_rtt,
    };
    build_report(r, about, opts, started, &all)
}

/// What a report says about its session besides its files.
struct About {
    op: &'static str,
    server: String,
    fingerprint: Option<String>,
    /// The server's data streams (a get's).
    streams: u32,
    data_seconds: f64,
    zero_rtt: ZeroRtt,
}

/// The client's report of a session, ended well or not: its files as far as
/// they went, the totals over them, and the connection's figures.
fn build_report(
    mut r: SessionReport,
    about: About,
    opts: &ClientOpts,
    started: Instant,
    all: &[quinn::ConnectionStats],
) -> ClientReport {
    let stats = &all[0];
    let sum = |f: fn(&quinn::ConnectionStats) -> u64| all.iter().map(f).sum::<u64>();
    let About {
        op,
        server,
        fingerprint,
        streams,
        data_seconds,
        zero_rtt,
    } = about;
    let seconds = started.elapsed().as_secs_f64();
    // (Unstable: the order among equal paths, were a path reported twice,
    // means nothing; it took half the stable sort's 4 ms for 20,000 files,
    // at the end of every such get.)
    r.files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    let t = Totals {
        dirs: r.dirs,
        symlinks: r.symlinks,
        specials: r.specials,
        hardlinks: r.hardlinks,
        other_shards: r.other_shards,
        deleted: r
            .changes
            .iter()
            .filter(|c| matches!(c.what, crate::proto::What::Deleted { .. }))
            .count() as u64,
        ..crate::retry::totals(&r.files)
    };
    ClientReport {
        op,
        ok: r.problems.is_empty(),
        server,
        fingerprint,
        rate_mbps: t.bytes_transferred as f64 * 8.0 / 1e6 / seconds.max(1e-9),
        data_seconds,
        remembered_bps: 0,
        peak_bps: 0,
        totals: t,
        files: r.files,
        problems: r.problems,
        seconds,
        rtt_ms: stats.path.rtt.as_secs_f64() * 1e3,
        retransmitted_bytes: sum(|s| s.path.lost_bytes),
        udp_tx_bytes: sum(|s| s.udp_tx.bytes),
        udp_rx_bytes: sum(|s| s.udp_rx.bytes),
        connections: all.len(),
        per_connection: all
            .iter()
            .map(|s| ConnUse {
                udp_tx_bytes: s.udp_tx.bytes,
                udp_rx_bytes: s.udp_rx.bytes,
                retransmitted_bytes: s.path.lost_bytes,
                rtt_ms: s.path.rtt.as_secs_f64() * 1e3,
                mtu: s.path.current_mtu,
            })
            .collect(),
        mtu: stats.path.current_mtu,
        cc: opts.cc_choice().name(),
        streams: match op {
            "get" => streams as usize,
            _ => opts.send_streams(),
        },
        receiver_behind_s: r.held_back_s,
        repair_bytes: r.repair_bytes,
        rebuilt_streams: r.rebuilt_streams,
        tail_s: r.tail_s,
        first_data_s: None,
        final_mbps: None,
        to_90pct_s: None,
        zero_rtt,
        early_files: false,
        reconnects: 0,
        outages: Vec::new(),
        unsettled: r.unsettled,
        not_made: r.not_made,
        dry_run: opts.dry_run,
        attrs_not_kept: match op {
            "get" => longhaul_transfer::meta::not_held(),
            _ => 0,
        },
        changes: r
            .changes
            .iter()
            .map(|c| crate::report::ChangeReport::of(c, op == "get"))
            .collect(),
    }
}

/// `get HOST:PATH... DEST`. Remote paths are bytes (any but NUL). A lost
/// connection is ridden out as `opts.retry_for` says (see [`ClientOpts::retry_for`]).
pub async fn get<R: AsRef<[u8]>>(
    host: &str,
    port: u16,
    remote: &[R],
    local: &Path,
    opts: &ClientOpts,
    progress: Arc<Progress>,
) -> Result<ClientReport, Problem> {
    ride_out(opts, &progress, |o| {
        let progress = progress.clone();
        async move { get_once(host, port, remote, local, &o, progress).await }
    })
    .await
}

/// `put PATH... HOST:DEST`. The remote destination is bytes (any but NUL).
/// A lost connection is ridden out as `opts.retry_for` says (see [`ClientOpts::retry_for`]).
pub async fn put(
    local: &[PathBuf],
    host: &str,
    port: u16,
    remote_dest: &[u8],
    opts: &ClientOpts,
    progress: Arc<Progress>,
) -> Result<ClientReport, Problem> {
    ride_out(opts, &progress, |o| {
        let progress = progress.clone();
        async move { put_once(local, host, port, remote_dest, &o, progress).await }
    })
    .await
}

/// Runs `session` (one session of a get or a put, given its options) and,
/// while a session ends with its connection lost ([`Problem::transient`]),
/// connects again as [`crate::retry::Backoff`] says until a new session is
/// welcomed, for up to `opts.retry_for` from each loss. Each new session
/// resumes from the journals: a file placed is skipped (with `--overwrite`
/// the sessions after the first compare checksums instead, so that the
/// files placed before the loss do not cross again), a chunk journaled is
/// not sent again. The first connection of the run is not retried: a
/// server that never answered, or refused, is said at once. One report
/// comes out ([`crate::retry::merge`]).
async fn ride_out<F, Fut>(
    opts: &ClientOpts,
    progress: &Progress,
    mut session: F,
) -> Result<ClientReport, Problem>
where
    F: FnMut(ClientOpts) -> Fut,
    Fut: std::future::Future<Output = Result<ClientReport, Problem>>,
{
    use crate::retry::{Backoff, Next};
    let started = Instant::now();
    let mut report = session(opts.clone()).await?;
    let mut reports = Vec::new();
    let mut outages = Vec::new();
    let mut again = opts.clone();
    if again.sync == SyncMode::Always {
        again.sync = SyncMode::Checksum;
    }
    loop {
        let cause = match report.problems.first() {
            Some(p) if p.transient && !opts.retry_for.is_zero() => p.message.clone(),
            _ => break,
        };
        let lost_at = Instant::now();
        let rtt = Duration::from_secs_f64(report.rtt_ms.max(0.0) / 1e3);
        let mut backoff = Backoff::new(opts.retry_for, rtt);
        let mut outage = Outage {
            lost_at_s: started.elapsed().as_secs_f64(),
            down_s: None,
            attempts: 0,
            cause: cause.clone(),
        };
        tracing::info!(
            "connection lost ({cause}); reconnecting for up to {:?}",
            opts.retry_for
        );
        reports.push(report);
        *progress.retrying.lock().unwrap() = Some((lost_at, 0));
        let next = loop {
            if opts.gone.load(Ordering::Relaxed) {
                break Err(Some(
                    "the ssh session that started the server has ended: not reconnecting"
                        .to_string(),
                ));
            }
            match backoff.next(lost_at.elapsed()) {
                Next::GiveUp => {
                    break Err(Some(format!(
                        "reconnecting failed for {}: {} attempt(s)",
                        crate::retry::shown(opts.retry_for),
                        backoff.attempts()
                    )))
                }
                Next::Wait(w) => tokio::time::sleep(w).await,
                Next::Attempt(t) => {
                    *progress.retrying.lock().unwrap() = Some((lost_at, backoff.attempts()));
                    let at = lost_at.elapsed();
                    let o = ClientOpts {
                        connect_timeout: Some(t),
                        ..again.clone()
                    };
                    match session(o).await {
                        Ok(r) => break Ok(r),
                        Err(p) if p.transient => {
                            tracing::debug!("reconnecting: {}", p.message);
                            backoff.failed(at, lost_at.elapsed());
                        }
                        Err(p) => {
                            // (Refused: the lost session's problem stays
                            // second.)
                            reports.last_mut().expect("lost").problems.insert(0, p);
                            break Err(None);
                        }
                    }
                }
            }
        };
        *progress.retrying.lock().unwrap() = None;
        outage.attempts = backoff.attempts();
        match next {
            Ok(r) => {
                // (Welcomed when its data phase began.)
                let back = lost_at.elapsed().as_secs_f64() - r.data_seconds;
                outage.down_s = Some(back.max(0.0));
                tracing::info!(
                    "reconnected after {back:.1} s ({} attempt(s)); resuming",
                    outage.attempts
                );
                outages.push(outage);
                report = r;
            }
            Err(why) => {
                report = reports.pop().expect("the lost session's report");
                if let Some(why) = why {
                    report.problems[0].message = format!("{cause} ({why})");
                }
                report.ok = false;
                outages.push(outage);
                break;
            }
        }
    }
    let reconnects = reports.len() as u32;
    reports.push(report);
    let mut merged = crate::retry::merge(reports, started.elapsed().as_secs_f64());
    merged.reconnects = reconnects;
    merged.outages = outages;
    Ok(merged)
}

/// One session of a get.
async fn get_once<R: AsRef<[u8]>>(
    host: &str,
    port: u16,
    remote: &[R],
    local: &Path,
    opts: &ClientOpts,
    progress: Arc<Progress>,
) -> Result<ClientReport, Problem> {
    let started = Instant::now();
    let local_err =
        |e: std::io::Error| Problem::at(Kind::LocalIo, local.display().to_string(), e.to_string());
    let roots: Vec<Vec<u8>> = remote
        .iter()
        .map(|p| landing::root_name(p.as_ref()))
        .collect();
    let trailing = local.as_os_str().as_bytes().ends_with(b"/");
    let (base, prefix, is_dir) = if local.is_dir() {
        (
            Dir::open_ambient_dir(local, cap_std::ambient_authority()).map_err(local_err)?,
            RelPath::root(),
            true,
        )
    } else {
        let parent = match local.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = local.file_name().ok_or_else(|| {
            Problem::new(
                Kind::LocalIo,
                format!("{}: not a usable destination", local.display()),
            )
        })?;
        // A dry run creates nothing: it lands beneath the nearest
        // directory there, and finds the rest absent.
        let (parent, name) = match opts.dry_run {
            true => nearest_dir(&parent, name),
            false => {
                std::fs::create_dir_all(&parent).map_err(local_err)?;
                (parent, name.to_os_string())
            }
        };
        let base =
            Dir::open_ambient_dir(&parent, cap_std::ambient_authority()).map_err(local_err)?;
        let prefix = RelPath::from_wire(name.as_bytes())
            .map_err(|e| Problem::new(Kind::LocalIo, e.to_string()))?;
        (
            base,
            prefix,
            landing::dest_is_dir(false, trailing, remote.len()),
        )
    };
    let spec = Destination {
        base,
        landing: Landing {
            prefix,
            dest_is_dir: is_dir,
            roots,
        },
    };
    let op = Op::Get {
        paths: remote.iter().map(|p| p.as_ref().to_vec()).collect(),
        filters: opts.filters.clone(),
        meta: opts.meta,
        listed: false,
    };
    // A shard that holds its plan asks for its files only: the server then
    // lists nothing, it finds those files one by one.
    let listed = match &opts.shard {
        Some(crate::sharding::ShardRole::Part(sh)) => sh
            .read_path()
            .map_err(|e| Problem::new(Kind::LocalIo, e))?
            .map(|plan| (plan, sh.shard)),
        _ => None,
    };
    let op = match op {
        Op::Get {
            paths,
            filters,
            meta,
            ..
        } => Op::Get {
            paths,
            filters,
            meta,
            listed: listed.is_some(),
        },
        op => op,
    };
    let (opts, remembered) = &recall_rate(opts, "get");
    // (A dry run asks for each file: the server sends none unasked; so
    // does a shard, which wants only its part.)
    let part = matches!(opts.shard, Some(crate::sharding::ShardRole::Part(_)));
    let fresh = !opts.dry_run && !part && spec.is_fresh();
    use crate::sharding::ShardRole;
    let (shard, finish_plan) = match &opts.shard {
        Some(ShardRole::Part(sh)) => (Some(sh.clone()), None),
        Some(ShardRole::Finish(sh)) => (None, Some(sh.clone())),
        None => (None, None),
    };
    let mut s = connect(host, port, opts, op, fresh).await?;
    progress.welcomed();
    if s.fresh != fresh {
        let m = format!(
            "protocol error: a get with Hello.fresh = {fresh} was welcomed with fresh = {}",
            s.fresh
        );
        let failed = (SessionReport::default(), Err(conn_err(m)));
        return finish(s, started, "get", opts, failed).await;
    }
    if let Some((plan, shard)) = &listed {
        if let Err(p) = send_only(&s.ctl, plan, shard.index).await {
            return finish(s, started, "get", opts, (SessionReport::default(), Err(p))).await;
        }
    }
    let (tuned, conns) = s.tune(opts, Flow::Rx);
    let r = run_receiver(
        conns,
        s.ctl.clone(),
        &mut s.rx,
        spec,
        RecvOpts {
            keep: None,
            shard,
            plan: listed.as_ref().map(|(plan, _)| plan.clone()),
            finish_plan,
            sync: opts.sync,
            fresh,
            durable: opts.durable,
            exact_modes: opts.exact_modes,
            specials: opts.specials,
            devices: opts.devices,
            delete: match opts.delete {
                true => Some(Arc::new(
                    longhaul_transfer::filter::Filter::new(&opts.filters)
                        .map_err(|e| Problem::new(Kind::LocalIo, e.to_string()))?,
                )),
                false => None,
            },
            dry_run: opts.dry_run,
            meta: longhaul_transfer::meta::Policy {
                owners: is_root(),
                numeric_ids: opts.numeric_ids,
                privileged: is_root() && opts.exact_modes,
            },
        },
        progress.clone(),
    )
    .await;
    let report = finish(s, started, "get", opts, r).await;
    let report = start_up(report, started, &progress, &tuned);
    remember_rate(
        opts,
        *remembered,
        tuned.peak.load(Ordering::Relaxed),
        report,
    )
}

/// The nearest directory there at or above `parent`, and the path of `name`
/// beneath it (a dry run's destination whose parents are missing).
fn nearest_dir(parent: &Path, name: &std::ffi::OsStr) -> (PathBuf, std::ffi::OsString) {
    let mut dir = parent.to_path_buf();
    let mut below = PathBuf::from(name);
    while !dir.is_dir() {
        match (dir.parent(), dir.file_name()) {
            (Some(up), Some(last)) => {
                below = Path::new(last).join(below);
                dir = match up.as_os_str().is_empty() {
                    true => PathBuf::from("."),
                    false => up.to_path_buf(),
                };
            }
            _ => break,
        }
    }
    (dir, below.into_os_string())
}

/// The report's start-up figures: when the first data moved, and how long
/// its flow took to 90 % of its final rate ([`crate::ramp`]).
fn start_up(
    report: Result<ClientReport, Problem>,
    started: Instant,
    progress: &Progress,
    tuned: &Tuned,
) -> Result<ClientReport, Problem> {
    let mut r = report?;
    if let Some(&first) = progress.first_data.get() {
        r.first_data_s = Some(first.saturating_duration_since(started).as_secs_f64());
        let window = Duration::from_secs_f64(r.rtt_ms / 1e3);
        if let Some(ramp) = tuned.series.lock().unwrap().ramp(first, window) {
            r.final_mbps = Some(ramp.final_bps / 1e6);
            r.to_90pct_s = Some(ramp.to_90_s);
        }
    }
    Ok(r)
}

/// A local path of a put: its source and how it is named at the destination
/// (`name`, [`landing::local_root_name`]: empty for a directory's contents).
fn local_source(p: &Path, name: &[u8]) -> Result<(SendRoot, RootSpec), Problem> {
    let meta = std::fs::symlink_metadata(p)
        .map_err(|e| Problem::at(Kind::LocalIo, p.display().to_string(), e.to_string()))?;
    let open = |d: &Path| {
        Dir::open_ambient_dir(d, cap_std::ambient_authority())
            .map_err(|e| Problem::at(Kind::LocalIo, d.display().to_string(), e.to_string()))
    };
    if meta.is_dir() {
        let src = SendRoot {
            dir: Arc::new(open(p)?),
            start: RelPath::root(),
            must_be_dir: false,
            name: name.to_vec(),
            only: None,
        };
        let name = name.to_vec();
        return Ok((src, RootSpec { name }));
    }
    if name.is_empty() {
        let m =
            "not a directory: only a directory's contents can be sent (drop the trailing / or .)";
        return Err(Problem::at(Kind::LocalIo, p.display().to_string(), m));
    }
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let start = RelPath::from_wire(name).map_err(|e| Problem::new(Kind::LocalIo, e.to_string()))?;
    let src = SendRoot {
        dir: Arc::new(open(&parent)?),
        start,
        must_be_dir: false,
        name: name.to_vec(),
        only: None,
    };
    Ok((
        src,
        RootSpec {
            name: name.to_vec(),
        },
    ))
}

/// One session of a put.
async fn put_once(
    local: &[PathBuf],
    host: &str,
    port: u16,
    remote_dest: &[u8],
    opts: &ClientOpts,
    progress: Arc<Progress>,
) -> Result<ClientReport, Problem> {
    let mut early = true;
    loop {
        let p = progress.clone();
        match put_session(local, (host, port), remote_dest, opts, p, early).await {
            Ok(done) => return done,
            Err(why) => {
                tracing::info!("{why}: the put goes again, after the server's answer");
                early = false;
            }
        }
    }
}

/// One session of a put. `early`: it may send its files in its first flight,
/// before the server's answer (a known server, 0-RTT, one connection, a
/// plain put of targets this client did not put there lately); Err says why
/// such a put must go again, waiting for the answer (nothing of it was
/// taken).
async fn put_session(
    local: &[PathBuf],
    (host, port): (&str, u16),
    remote_dest: &[u8],
    opts: &ClientOpts,
    progress: Arc<Progress>,
    early: bool,
) -> Result<Result<ClientReport, Problem>, &'static str> {
    let started = Instant::now();
    let mut sources: Vec<SendRootResult> = Vec::new();
    let mut roots = Vec::new();
    // A local path that cannot be sent fails alone, as a missing remote
    // path of a get does: the others still go (all failing: nothing to do).
    let mut unsendable = Vec::new();
    for p in local {
        let name = landing::local_root_name(p);
        match local_source(p, &name) {
            Ok((src, root)) => {
                sources.push(Ok(src));
                roots.push(root);
            }
            Err(problem) => {
                sources.push(Err((ErrorCode::NotFound, problem.to_string())));
                roots.push(RootSpec { name });
                unsendable.push(problem);
            }
        }
    }
    if unsendable.len() == local.len() {
        return Ok(Err(unsendable.remove(0)));
    }
    let key = crate::resume::put_key(
        remote_dest,
        &roots.iter().map(|r| r.name.clone()).collect::<Vec<_>>(),
    );
    let early = early
        && !opts.dry_run
        && opts.shard.is_none()
        && opts.connections <= 1
        && crate::resume::Memo::new(&opts.trust).is_some_and(|m| !m.put_seen(&key));
    let op = Op::Put {
        dest: remote_dest.to_vec(),
        // The server adds whether it is a directory there.
        dest_is_dir: landing::dest_is_dir(false, remote_dest.ends_with(b"/"), local.len()),
        roots,
        sync: opts.sync.into(),
        durable: opts.durable,
        specials: opts.specials,
        delete: opts.delete,
        filters: match opts.delete {
            true => opts.filters.clone(),
            false => Vec::new(),
        },
        dry_run: opts.dry_run,
        numeric_ids: opts.numeric_ids,
        shard: opts.shard.as_ref().map(|role| {
            let s = role.sharding().shard;
            crate::proto::ShardReq {
                index: s.index,
                count: s.count,
                finish: matches!(role, crate::sharding::ShardRole::Finish(_)),
            }
        }),
    };
    let filter = match longhaul_transfer::filter::Filter::new(&opts.filters) {
        Ok(f) => Arc::new(f),
        Err(e) => return Ok(Err(Problem::new(Kind::LocalIo, e.to_string()))),
    };
    let (opts, remembered) = &recall_rate(opts, "put");
    let mut s = match connect(host, port, opts, op, early).await {
        Ok(s) => s,
        Err(p) => return Ok(Err(p)),
    };
    progress.welcomed();
    let (tuned, conns) = s.tune(opts, Flow::Tx);
    let welcome = s.early.as_ref().map(|e| e.welcome.clone());
    let r = run_sender(
        conns,
        s.ctl.clone(),
        &mut s.rx,
        sources,
        SendOpts {
            streams: opts.send_streams(),
            max_rate: opts.net.max_rate,
            fresh: s.fresh,
            send_window: tuned.send_window.clone(),
            peer_makes: (opts.specials, false),
            meta: opts.meta,
            filter,
            welcome,
        },
        progress.clone(),
    )
    .await;
    let early = s.early.is_some();
    let welcomed = match s.early.take() {
        None => true,
        Some(e) => match e.outcome().await {
            Early::Welcomed(server) => {
                s.server = server;
                true
            }
            Early::Again { why, there } => {
                if let (Some(m), true) = (crate::resume::Memo::new(&opts.trust), there) {
                    m.add_put(key);
                }
                s.conn.close(quinn::VarInt::from_u32(0), b"again");
                return Err(why);
            }
            Early::Failed(p) => return Ok(Err(p)),
            Early::Unwelcomed => false,
        },
    };
    // (Its targets are there now, some of them at least: put again, they
    // would not be fresh. On first contact the server is known by now.)
    if let (Some(m), true) = (crate::resume::Memo::new(&opts.trust), welcomed) {
        m.add_put(key);
    }
    let (mut rep, result) = r;
    rep.problems.splice(0..0, unsendable);
    let report = finish(s, started, "put", opts, (rep, result))
        .await
        .map(|r| ClientReport {
            early_files: early,
            ..r
        });
    let report = start_up(report, started, &progress, &tuned);
    Ok(remember_rate(
        opts,
        *remembered,
        tuned.peak.load(Ordering::Relaxed),
        report,
    ))
}

/// The key of a server and a direction in the rate memory: the known-hosts
/// key (`HOST:PORT`) after the operation (`get:` the rate from it, `put:` to it).
fn server_key(op: &str, opts: &ClientOpts) -> String {
    format!("{op}:{}", opts.trust.host)
}

/// The options a session runs with: `wan` without a hint of its own, and
/// without --max-rate, starts at the rate remembered for this server. Returns
/// them and that rate (0: none).
fn recall_rate(opts: &ClientOpts, op: &str) -> (ClientOpts, u64) {
    let mut o = opts.clone();
    // (Over several connections each controller would start at it: none.)
    let unhinted =
        opts.cc_choice() == CcChoice::Wan(0) && opts.net.max_rate == 0 && opts.connections <= 1;
    let remembered = match &opts.rates {
        Some(p) if unhinted => RateMemory::new(p.clone())
            .recall(&server_key(op, opts), SystemTime::now())
            .unwrap_or(0),
        _ => 0,
    };
    if remembered > 0 {
        o.cc = Some(CcChoice::Wan(remembered));
    }
    (o, remembered)
}

/// Remembers the best second of a large, complete `wan` transfer of large
/// files without a rate cap (another controller's rate, a capped one, or
/// small files' say less about the path; see [`worth_remembering`]); without
/// a second measured, the payload rate of its data phase.
fn remember_rate(
    opts: &ClientOpts,
    remembered: u64,
    peak: u64,
    report: Result<ClientReport, Problem>,
) -> Result<ClientReport, Problem> {
    let mut report = report?;
    report.remembered_bps = remembered;
    report.peak_bps = peak;
    let t = &report.totals;
    // (Over several connections the peak is the first one's share.)
    let wan = matches!(opts.cc_choice(), CcChoice::Wan(_))
        && opts.net.max_rate == 0
        && opts.connections <= 1;
    if let (Some(p), true) = (
        &opts.rates,
        wan && report.ok && worth_remembering(t.bytes_transferred, t.verified),
    ) {
        let mean = (t.bytes_transferred as f64 * 8.0 / report.data_seconds.max(1e-3)) as u64;
        let bps = if peak > 0 { peak } else { mean };
        let m = RateMemory::new(p.clone());
        if let Err(e) = m.remember(&server_key(report.op, opts), bps, SystemTime::now()) {
            tracing::warn!("not remembering the rate: {e:#}");
        }
    }
    Ok(report)
}

/// Ends the session. A session that failed still reports what it did: the
/// files verified and placed before the failure, whose problem comes first.
async fn finish(
    s: Session,
    started: Instant,
    op: &'static str,
    opts: &ClientOpts,
    (mut report, result): (SessionReport, Result<(), Problem>),
) -> Result<ClientReport, Problem> {
    let p = match result {
        Ok(()) => return Ok(close(s, started, op, opts, report).await),
        Err(p) => p,
    };
    let why = s.conn.close_reason();
    // A connection the server refused to join says why in its close (a
    // Fatal, code 1).
    let mut p = p;
    for (i, e) in s.extra.iter().enumerate() {
        if let Some(quinn::ConnectionError::ApplicationClosed(a)) = e.conn.close_reason() {
            if a.error_code == quinn::VarInt::from_u32(1) {
                p.message = format!(
                    "{} (the server refused connection {}: {})",
                    p.message,
                    i + 1,
                    String::from_utf8_lossy(&a.reason)
                );
            }
        }
    }
    s.conn.close(1u32.into(), p.message.as_bytes());
    for e in &s.extra {
        e.conn.close(1u32.into(), p.message.as_bytes());
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), s.endpoint.wait_idle()).await;
    let transient = why.as_ref().is_some_and(lost);
    let p = match why {
        Some(quinn::ConnectionError::ApplicationClosed(a)) if p.kind == Kind::Connection => {
            Problem::new(
                Kind::Connection,
                format!(
                    "{}: the server closed the session: {}",
                    p.message,
                    String::from_utf8_lossy(&a.reason)
                ),
            )
        }
        _ => p,
    };
    let p = Problem { transient, ..p };
    report.problems.insert(0, p);
    let about = About {
        op,
        server: s.server,
        fingerprint: s.fingerprint,
        streams: s.streams,
        data_seconds: s.welcomed.elapsed().as_secs_f64(),
        zero_rtt: s.zero_rtt,
    };
    let all = stats_of(&s.conn, &s.extra);
    Ok(build_report(report, about, opts, started, &all))
}
