//! The `longhaul` command: argument parsing and wiring only.

mod args;
mod demo;
mod lab;
mod lab_args;
mod logging;
mod manpages;
mod multicast;
mod progress;
mod ssh;

use anyhow::{Context, Result};
use args::{Cli, Command, TransferArgs};
use longhaul_quic::identity::{
    check_fingerprint_syntax, default_known_hosts, default_rates, default_state_dir, Identity,
    TrustPolicy,
};
use longhaul_quic::proto::MAX_CONNECTIONS;
use longhaul_quic::NetOpts;
use longhaul_quic::{join_host_port, split_host_port, DEFAULT_STREAMS};
use longhaul_quic::{parse_rate, CcChoice};
use longhaul_quic::{ClientOpts, ClientReport, Problem, Progress, ServeOpts, Server};
use longhaul_transfer::shown;
use longhaul_transfer::sync::SyncMode;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// Exit status for usage errors found after parsing (clap uses 2 as well).
const EXIT_USAGE: i32 = 2;
/// Exit status of connection, trust or access problems.
pub(crate) const EXIT_CONNECTION: i32 = 3;
/// Exit status after Ctrl-C (128 + SIGINT, as shells report it).
pub(crate) const EXIT_INTERRUPTED: i32 = 130;

fn main() {
    // Keep 1 MiB chunk buffers on the heap instead of fresh mmaps: no page faults,
    // zeroing or munmap per chunk on the hot path. Two arenas, not eight per
    // core: a server's sessions run on many threads, each arena kept the
    // pages its threads had used, and after a burst of 50 gets 396-707 MB
    // stayed (12 MB with two, which cost nothing on loopback: RELIABILITY).
    // SAFETY: mallopt only tunes glibc's allocator; called before any threads exist.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let mut cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // (The filter rules' order is the command line's, across three flags.)
    if let (
        Some((_, m)),
        Command::Get(args::GetArgs { t, .. }) | Command::Put(args::PutArgs { t, .. }),
    ) = (matches.subcommand(), &mut cli.command)
    {
        match args::ordered_filters(m) {
            Ok(rules) => t.filters = rules,
            Err(e) => std::process::exit(finish(Err(e))),
        }
    }
    // The lab needs no async runtime (and its daemons must not start threads
    // before they block signals).
    let cli = match cli.command {
        Command::Lab(a) => std::process::exit(finish(lab::run(a.command))),
        Command::Completions { shell } => {
            manpages::completions(shell);
            std::process::exit(0)
        }
        Command::Man { dir } => std::process::exit(finish(manpages::write_all(&dir).map(|n| {
            println!("wrote {} man pages to {}", n.len(), dir.display());
            0
        }))),
        Command::Multicast(a) => {
            logging::init("warn", true);
            std::process::exit(finish(multicast::run(a.command)))
        }
        c => Cli { command: c },
    };
    logging::init(
        match &cli.command {
            // The one-shot server's stderr is its ssh client's.
            Command::Serve(a) if a.once => "error",
            Command::Serve(_) => "info",
            _ => "warn",
        },
        matches!(&cli.command, Command::Serve(a) if !a.once),
    );
    // A transfer is one connection, driven by one quinn task: a second
    // worker only moves its tasks between threads (futex wake-ups, cold
    // caches), 1 CPU-s of 8.5 per GB on the lab's 1 Gbit/s path. Disk
    // writes, reads and hashing still run on the blocking pool. A server
    // (many sessions) keeps a worker per core, as does the demo.
    // A transfer over N connections (`--connections`) gets N workers, so
    // that each connection's packets may have a core.
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    let workers = match &cli.command {
        Command::Get(args::GetArgs { t, .. }) | Command::Put(args::PutArgs { t, .. }) => Some(
            t.connections
                .unwrap_or(1)
                .clamp(1, MAX_CONNECTIONS as usize),
        ),
        Command::Serve(a) => match (a.workers, a.once) {
            (Some(n), _) => Some(n.clamp(1, 64)),
            (None, true) => Some(1),
            (None, false) => None,
        },
        _ => None, // the demo runs a server and its clients in one process
    };
    if let Some(n) = workers {
        rt.worker_threads(n);
    }
    let rt = rt.enable_all().build().expect("tokio runtime");
    // The command runs on the workers, not on this thread: a session on
    // the thread that blocks in `block_on` woke a worker (quinn's tasks) and
    // was woken by it at every packet and file, two threads for one.
    let code = rt.block_on(async move {
        match tokio::spawn(run(cli)).await {
            Ok(code) => code,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    });
    // Dropping the runtime drops every task still holding session state, so partial
    // files journal what they hold (after Ctrl-C, say) before the process exits.
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    std::process::exit(code);
}

async fn run(cli: Cli) -> i32 {
    let r = match cli.command {
        Command::Serve(a) => serve(a).await,
        Command::Get(a) => get(a).await,
        Command::Put(a) => put(a).await,
        Command::Demo(a) => demo::run(a).await,
        Command::Lab(_)
        | Command::Multicast(_)
        | Command::Completions { .. }
        | Command::Man { .. } => {
            unreachable!("dispatched before the runtime starts")
        }
    };
    finish(r)
}

/// Turns a command's outcome into an exit status, printing the error.
fn finish(r: Result<i32>) -> i32 {
    match r {
        Ok(code) => code,
        Err(e) => {
            if let Some(Fail(code, msg)) = e.downcast_ref::<Fail>() {
                eprintln!("error: {}", shown(msg));
                return *code;
            }
            eprintln!("error: {}", shown(&format!("{e:#}")));
            1
        }
    }
}

/// An error found after parsing that ends the command with its own exit
/// status: a usage error (2), or the far side over ssh not reached (3).
#[derive(Debug)]
pub(crate) struct Fail(pub(crate) i32, pub(crate) String);
impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}
impl std::error::Error for Fail {}

pub(crate) fn usage(msg: impl Into<String>) -> anyhow::Error {
    Fail(EXIT_USAGE, msg.into()).into()
}

/// A token shorter than this (bytes) draws a warning from `serve`.
const MIN_TOKEN: usize = 16;

/// `serve --new-token FILE`: 32 random bytes as 64 hex digits and a newline,
/// mode 0600, never over an existing file.
fn write_new_token(f: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let hex = random_token();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(f)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => usage(format!(
                "{} exists: not overwriting a token clients may use (remove it first)",
                f.display()
            )),
            _ => anyhow::anyhow!("writing the token file {}: {e}", f.display()),
        })?;
    file.write_all(format!("{hex}\n").as_bytes())?;
    file.sync_all()?;
    Ok(())
}

/// 32 random bytes as 64 hex digits.
pub(crate) fn random_token() -> String {
    use rand::RngCore;
    let mut raw = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// Who may do what on a server, for its banner.
struct Access {
    token: bool,
    read_token: bool,
    anonymous_put: bool,
    read_only: bool,
}

impl Access {
    /// The banner's first line's end.
    fn short(&self) -> &'static str {
        match self {
            Access {
                read_only: true, ..
            } => "read-only (--read-only)",
            Access { token: true, .. } => "token required",
            Access {
                read_token: true, ..
            } => "read-only, token required",
            Access {
                anonymous_put: true,
                ..
            } => "WARNING: anyone may put (--allow-anonymous-put)",
            _ => "read-only: no token",
        }
    }

    /// The banner's access line: who can read, who can write.
    fn long(&self, port: u16, root: &std::path::Path) -> String {
        let root = root.display();
        let who = match (self.token, self.read_token) {
            (false, false) => format!("anyone who can reach UDP {port}"),
            (true, false) => "holders of the --token-file token".into(),
            (false, true) => "holders of the --read-token-file token".into(),
            (true, true) => "holders of either token".into(),
        };
        let write = match (self.read_only, self.token, self.anonymous_put) {
            (true, _, _) => "nobody can write (--read-only)".to_string(),
            (false, true, _) if self.read_token => {
                "only the --token-file token can write".to_string()
            }
            (false, true, _) => "they can write too".to_string(),
            (false, false, true) => format!(
                "WARNING: --allow-anonymous-put: anyone who can reach UDP {port} can write into {root}"
            ),
            (false, false, false) if self.read_token => {
                "nobody can write (no --token-file)".to_string()
            }
            (false, false, false) => {
                "no token, so nobody can write (--token-file FILE lets its holders)".to_string()
            }
        };
        let read = if self.token || self.read_token {
            format!("token required; {who} can read {root}")
        } else if self.anonymous_put {
            format!("no token; {who} can read {root}")
        } else {
            format!("read-only: no token; {who} can read {root}")
        };
        format!("{read}; {write}")
    }
}

/// The addresses a server bound to `local` is reachable at: `local` itself,
/// or, bound to 0.0.0.0 (::), every address of that family on the host's
/// interfaces (loopback first).
fn reachable(local: std::net::SocketAddr) -> Vec<std::net::SocketAddr> {
    use std::net::SocketAddr;
    if !local.ip().is_unspecified() {
        return vec![local];
    }
    let mut all: Vec<SocketAddr> = nix::ifaddrs::getifaddrs()
        .into_iter()
        .flatten()
        .filter_map(|i| {
            let a = i.address?;
            let ip: std::net::IpAddr = if let Some(v4) = a.as_sockaddr_in() {
                v4.ip().into()
            } else {
                let v6 = a.as_sockaddr_in6()?;
                // A link-local address needs its interface to be named.
                if v6.ip().segments()[0] & 0xffc0 == 0xfe80 {
                    return None;
                }
                v6.ip().into()
            };
            (ip.is_ipv4() == local.is_ipv4()).then(|| SocketAddr::new(ip, local.port()))
        })
        .collect();
    all.sort_by_key(|a| (!a.ip().is_loopback(), *a));
    all.dedup();
    if all.is_empty() {
        all.push(local);
    }
    all
}

/// `--read-token-file`: the file's token (it must have one).
fn read_token_file(file: &Option<PathBuf>) -> Result<Option<Vec<u8>>> {
    let Some(f) = file else { return Ok(None) };
    let t = std::fs::read(f)
        .map_err(|e| usage(format!("reading the token file {}: {e}", f.display())))?;
    let t = t.strip_suffix(b"\n").unwrap_or(&t).to_vec();
    if t.is_empty() {
        return Err(usage(format!("the token file {} is empty", f.display())));
    }
    Ok(Some(t))
}

fn read_token(file: &Option<PathBuf>) -> Result<Option<Vec<u8>>> {
    if file.is_some() {
        return read_token_file(file);
    }
    Ok(std::env::var_os("LONGHAUL_TOKEN").map(|t| {
        use std::os::unix::ffi::OsStrExt;
        t.as_bytes().to_vec()
    }))
}

fn net_opts(a: &args::NetArgs) -> Result<(NetOpts, Option<CcChoice>)> {
    let (cc, max_rate, window) = (&a.cc, &a.max_rate, &a.window);
    let mut net = NetOpts::default();
    let cc = match cc {
        Some(s) => Some(CcChoice::parse(s).map_err(|e| usage(e.to_string()))?),
        None => None,
    };
    if let Some(c) = cc {
        net.cc = c;
    }
    if let Some(r) = max_rate {
        net.max_rate = parse_rate(r).map_err(|e| usage(format!("--max-rate: {e}")))?;
        net.rate_hint = net.max_rate;
    }
    if let Some(w) = window {
        net.max_window = args::parse_size(w).map_err(|e| usage(format!("--window: {e}")))?;
    }
    Ok((net, cc))
}

async fn serve(a: args::ServeArgs) -> Result<i32> {
    // `--once` keeps its fresh key in a directory removed when it exits.
    let mut _fresh = None;
    let state_dir = match (&a.state_dir, a.once) {
        (Some(d), _) => d.clone(),
        (None, true) => {
            let t = tempfile::Builder::new()
                .prefix("longhaul-once-")
                .tempdir()?;
            let d = t.path().to_path_buf();
            _fresh = Some(t);
            d
        }
        (None, false) => default_state_dir(),
    };
    if a.print_fingerprint {
        println!("{}", Identity::load_or_create(&state_dir)?.fingerprint);
        return Ok(0);
    }
    if let Some(f) = &a.new_token {
        write_new_token(f)?;
        println!(
            "wrote a new token (256 random bits) to {}: serve with --token-file {0}, \
             and give clients a copy (--token-file, or LONGHAUL_TOKEN)",
            f.display()
        );
        return Ok(0);
    }
    let root = a
        .root
        .clone()
        .ok_or_else(|| usage("serve needs --root DIR"))?;
    let (net, _) = net_opts(&a.net)?;
    let mut token = read_token(&a.token_file)?;
    let read_token = read_token_file(&a.read_token_file)?;
    if a.allow_anonymous_put && token.is_some() {
        return Err(usage(
            "--allow-anonymous-put with a token (LONGHAUL_TOKEN): with a token, only its \
             holders may put; drop one of them",
        ));
    }
    if token.is_some() && token == read_token {
        return Err(usage(
            "the read token (--read-token-file) is the read-and-write token: \
             make one with `longhaul serve --new-token FILE`",
        ));
    }
    if a.once && read_token.is_some() {
        return Err(usage(
            "serve --once has one token: --read-token-file does not apply",
        ));
    }
    if a.once && token.is_none() {
        token = Some(random_token().into_bytes());
    }
    if a.once
        && token
            .as_ref()
            .is_some_and(|t| std::str::from_utf8(t).is_err())
    {
        return Err(usage(
            "serve --once sends its token as text: the token is not UTF-8",
        ));
    }
    for (which, t) in [("the", &token), ("the read", &read_token)] {
        if let Some(t) = t.as_ref().filter(|t| t.len() < MIN_TOKEN) {
            eprintln!(
                "longhaul serve: warning: {which} token is only {} bytes and can be guessed; \
                 `longhaul serve --new-token FILE` writes a strong one",
                t.len()
            );
        }
    }
    let ssh_ip = ssh::ssh_connection_ip();
    // Every address, also with --once: behind NAT the address the ssh
    // session came in on is not the one the client reaches.
    let ip = match (a.listen, ssh_ip) {
        (Some(l), _) => l.ip(),
        (None, Some(std::net::IpAddr::V6(_))) if a.once => std::net::Ipv6Addr::UNSPECIFIED.into(),
        _ => std::net::Ipv4Addr::UNSPECIFIED.into(),
    };
    let ports: Vec<u16> = match (&a.port_range, a.listen) {
        (Some(r), _) => ssh::parse_port_range(r).map_err(usage)?,
        (None, Some(l)) => vec![l.port()],
        (None, None) if a.once => vec![0],
        (None, None) => vec![7878],
    };
    let mut opts = ServeOpts {
        root: root.clone(),
        listen: std::net::SocketAddr::new(ip, ports[0]),
        read_only: a.read_only,
        token: token.clone(),
        read_token: read_token.clone(),
        anonymous_put: a.allow_anonymous_put,
        exact_modes: a.exact_modes,
        keep_owners: a.keep_owners,
        state_dir,
        net,
        streams: match a.net.streams {
            Some(0) => return Err(usage("--streams must be at least 1")),
            Some(n) => n,
            None => DEFAULT_STREAMS,
        },
        max_sessions: a.max_sessions,
        send_buffer: match &a.send_buffer {
            Some(b) => args::parse_size(b).map_err(|e| usage(format!("--send-buffer: {e}")))?,
            None => longhaul_quic::DEFAULT_SEND_BUFFER,
        },
        once: a.once,
        keep: longhaul_quic::kept::KeepRules {
            keep_for: longhaul_transfer::units::parse_duration(&a.keep_parts_for)
                .map_err(|e| usage(format!("--keep-parts-for: {e}")))?,
            per_client: a
                .keep_parts_per_client
                .parse()
                .map_err(|e| usage(format!("--keep-parts-per-client: {e}")))?,
            total: a
                .keep_parts
                .parse()
                .map_err(|e| usage(format!("--keep-parts: {e}")))?,
        },
    };
    // The first port of the list that is free.
    let mut bound = Err(anyhow::anyhow!("no port to listen on"));
    for &p in &ports {
        opts.listen.set_port(p);
        bound = Server::bind(opts.clone());
        if bound.is_ok() {
            break;
        }
    }
    let server = bound.with_context(|| match ports.len() {
        1 => format!("listening on {}", opts.listen),
        n => format!("no free UDP port among the {n} of --port-range"),
    })?;
    if a.once {
        return ssh::serve_once(server, ssh_ip, &token.unwrap_or_default()).await;
    }
    let stop = stop_signal(false);
    let local = server.local_addr()?;
    let access = Access {
        token: token.is_some(),
        read_token: read_token.is_some(),
        anonymous_put: a.allow_anonymous_put,
        read_only: a.read_only,
    };
    {
        let mut out = std::io::stdout().lock();
        // The first two lines are what scripts read: the address, then the
        // fingerprint.
        writeln!(
            out,
            "longhaul serve: root {}, listening on {local}, {}",
            root.display(),
            access.short()
        )?;
        writeln!(out, "fingerprint {}", server.fingerprint)?;
        writeln!(out, "access: {}", access.long(local.port(), &root))?;
        writeln!(
            out,
            "reachable at {}",
            reachable(local)
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )?;
        out.flush()?;
    }
    if a.allow_anonymous_put {
        tracing::warn!(
            "--allow-anonymous-put: anyone who can reach UDP {} may write into {}",
            local.port(),
            root.display()
        );
    }
    let close = server.closer();
    tokio::select! {
        r = server.run() => r?,
        _ = stop => {
            eprintln!("longhaul serve: interrupted, closing connections and exiting");
            close.await;
        }
    }
    Ok(0)
}

/// Ctrl-C (SIGINT), SIGTERM, and with `hangup` SIGHUP: a server's cue to
/// close its connections and exit cleanly (a one-shot server then also
/// removes its temporary key; a daemon keeps SIGHUP as it was given, so
/// `nohup longhaul serve` outlives its terminal). The handlers are in place
/// when this returns, before the future is first polled.
pub(crate) fn stop_signal(hangup: bool) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, Signal, SignalKind};
    async fn on(s: &mut Option<Signal>) {
        match s {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
    let mut int = signal(SignalKind::interrupt()).ok();
    let mut term = signal(SignalKind::terminate()).ok();
    let mut hup = hangup.then(|| signal(SignalKind::hangup()).ok()).flatten();
    async move {
        tokio::select! {
            _ = on(&mut int) => {}
            _ = on(&mut term) => {}
            _ = on(&mut hup) => {}
        }
    }
}

/// `HOST[:PORT]:PATH` split into (`HOST:PORT` key, host, port, path).
/// The host (and port) is text; the path is any bytes (the command line may
/// name a file whose name is not UTF-8).
fn parse_remote(s: &std::ffi::OsStr) -> Result<(String, String, u16, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    let b = s.as_bytes();
    let bad = || usage(format!("{:?} is not HOST[:PORT]:PATH", s.to_string_lossy()));
    let colon = |x: &[u8]| x.iter().position(|&c| c == b':');
    // (host end, then the rest after its ':')
    let (host_end, rest) = if b.starts_with(b"[") {
        let end = b.iter().position(|&c| c == b']').ok_or_else(bad)?;
        let rest = b[end + 1..].strip_prefix(b":").ok_or_else(bad)?;
        (end + 1, rest)
    } else {
        let i = colon(b).ok_or_else(bad)?;
        (i, &b[i + 1..])
    };
    let (port, path) = match colon(rest) {
        Some(i) if i > 0 && rest[..i].iter().all(|c| c.is_ascii_digit()) => {
            (Some(&rest[..i]), &rest[i + 1..])
        }
        _ => (None, rest),
    };
    let text = |x: &[u8]| String::from_utf8(x.to_vec()).map_err(|_| bad());
    let hostport = match port {
        Some(p) => format!("{}:{}", text(&b[..host_end])?, text(p)?),
        None => text(&b[..host_end])?,
    };
    let path = path.to_vec();
    let (host, port) = split_host_port(&hostport).map_err(usage)?;
    if host.is_empty() {
        return Err(bad());
    }
    let key = join_host_port(&host, port);
    Ok((key, host, port, path))
}

pub(crate) fn client_opts(a: &TransferArgs, host_key: String) -> Result<ClientOpts> {
    if let Some(fp) = &a.fingerprint {
        check_fingerprint_syntax(fp).map_err(|e| usage(e.to_string()))?;
    }
    let (net, cc) = net_opts(&a.net)?;
    Ok(ClientOpts {
        trust: TrustPolicy {
            host: host_key,
            known_hosts: Some(a.known_hosts.clone().unwrap_or_else(default_known_hosts)),
            pinned: a.fingerprint.clone(),
            accept_new: a.accept_new,
        },
        token: read_token(&a.token_file)?.unwrap_or_default(),
        cc,
        net,
        streams: match a.net.streams {
            Some(0) => return Err(usage("--streams must be at least 1")),
            Some(n) => n,
            None => 0,
        },
        sync: match (a.overwrite, a.checksum) {
            (true, _) => SyncMode::Always,
            (false, true) => SyncMode::Checksum,
            (false, false) => SyncMode::SizeMtime,
        },
        rates: (!a.no_rates).then(|| a.rates.clone().unwrap_or_else(default_rates)),
        connections: match a.connections {
            Some(0) => return Err(usage("--connections must be at least 1")),
            Some(n) if n > MAX_CONNECTIONS as usize => {
                return Err(usage(format!(
                    "--connections is at most {MAX_CONNECTIONS}, not {n}"
                )))
            }
            Some(n) => n,
            None => 1,
        },
        durable: !a.no_fsync,
        exact_modes: a.exact_modes,
        specials: a.specials,
        devices: a.devices,
        filters: a.filters.clone(),
        delete: a.delete,
        dry_run: a.dry_run,
        meta: longhaul_transfer::meta::Wanted {
            xattrs: a.xattrs,
            acls: a.acls,
        },
        numeric_ids: a.numeric_ids,
        interrupt: Default::default(),
        connect_timeout: None,
        retry_for: a.retry_for,
        shard: None,
        gone: Default::default(),
    })
}

async fn get(a: args::GetArgs) -> Result<i32> {
    if a.paths.len() < 2 {
        return Err(usage("get needs HOST[:PORT]:REMOTE_PATH... LOCAL_DEST"));
    }
    if a.t.ssh.on() {
        return ssh::get(a).await;
    }
    let (remotes, dest) = a.paths.split_at(a.paths.len() - 1);
    let mut key = None;
    let mut paths = Vec::new();
    let (mut host, mut port) = (String::new(), 0);
    for r in remotes {
        let (k, h, p, path) = parse_remote(r)?;
        if key.as_ref().is_some_and(|k0| *k0 != k) {
            return Err(usage(
                "every REMOTE_PATH of one get must name the same HOST:PORT",
            ));
        }
        key = Some(k);
        (host, port) = (h, p);
        paths.push(path);
    }
    let mut opts = client_opts(&a.t, key.unwrap())?;
    let dest = PathBuf::from(&dest[0]);
    if let Some(s) = &a.shard {
        opts.shard = Some(shard_role(s, &a.t, &mut opts, || {
            let plan_file = match &a.plan {
                Some(p) => p.clone(),
                None if dest.is_dir() => dest.join(".longhaul.lh-plan"),
                None => {
                    return Err(usage(format!(
                        "--shard: {} is not a directory, so the shards' plan needs a place: \
                         --plan FILE on a file system every shard sees",
                        dest.display()
                    )))
                }
            };
            let mut source: Vec<String> = paths
                .iter()
                .map(|p| longhaul_transfer::shown(&String::from_utf8_lossy(p)).into_owned())
                .collect();
            source.extend(a.t.filters.iter().map(|r| format!("{r:?}")));
            Ok((longhaul_quic::PlanAt::Path(plan_file), source.join(" ")))
        })?);
    }
    let progress = Arc::new(Progress::default());
    Ok(drive(
        &a.t,
        "get",
        &opts.interrupt,
        progress.clone(),
        longhaul_quic::get(&host, port, &paths, &dest, &opts, progress),
    )
    .await)
}

/// `--shard K/N|auto|auto/N|finish` of a get or a put: which shard, or the
/// finish (a whole-tree `--checksum` that then removes the plan); `place`
/// says where the plan is shared and what keys it (a put's is the
/// server's, in its destination).
fn shard_role(
    shard: &str,
    t: &args::TransferArgs,
    opts: &mut ClientOpts,
    place: impl FnOnce() -> Result<(longhaul_quic::PlanAt, String)>,
) -> Result<longhaul_quic::ShardRole> {
    let finishing = shard == "finish";
    // (`finish` is no shard: any index does for the plan's place.)
    let shard = match shard {
        "finish" => longhaul_transfer::shard::Shard::new(0, 1).expect("1 of 1"),
        s => longhaul_transfer::shard::Shard::parse(s, |k| std::env::var(k).ok())
            .map_err(|e| usage(format!("--shard: {e}")))?,
    };
    for (on, flag) in [
        (t.delete, "--delete"),
        (t.dry_run, "--dry-run"),
        (t.ssh.on(), "--ssh"),
    ] {
        if on && !finishing {
            return Err(usage(format!(
                "--shard and {flag} do not go together: a shard moves its part only \
                 (run {flag} without --shard)"
            )));
        }
    }
    let (plan_file, source) = place()?;
    let sharding = longhaul_quic::Sharding {
        shard,
        plan_file,
        source,
    };
    Ok(match finishing {
        true => {
            // The whole tree once, by BLAKE3 on both sides (what differs is
            // sent again), the directories' times and the links, then the
            // plan removed.
            if opts.sync == SyncMode::SizeMtime {
                opts.sync = SyncMode::Checksum;
            }
            longhaul_quic::ShardRole::Finish(sharding)
        }
        false => longhaul_quic::ShardRole::Part(sharding),
    })
}

async fn put(a: args::PutArgs) -> Result<i32> {
    if a.paths.len() < 2 {
        return Err(usage("put needs LOCAL_PATH... HOST[:PORT]:REMOTE_DEST"));
    }
    if a.t.ssh.on() {
        return ssh::put(a).await;
    }
    let (locals, dest) = a.paths.split_at(a.paths.len() - 1);
    let (key, host, port, rdest) = parse_remote(&dest[0])?;
    let mut opts = client_opts(&a.t, key)?;
    if let Some(s) = &a.shard {
        // (The server keeps a put's plan in its destination, keyed by it.)
        let at = longhaul_quic::PlanAt::Dest(longhaul_transfer::RelPath::root());
        opts.shard = Some(shard_role(s, &a.t, &mut opts, || Ok((at, String::new())))?);
    }
    let locals: Vec<PathBuf> = locals.iter().map(PathBuf::from).collect();
    let progress = Arc::new(Progress::default());
    Ok(drive(
        &a.t,
        "put",
        &opts.interrupt,
        progress.clone(),
        longhaul_quic::put(&locals, &host, port, &rdest, &opts, progress),
    )
    .await)
}

/// Run a transfer under a progress bar; Ctrl-C ends it (partials are journaled as
/// the session state drops, and the connection is closed so that the server
/// ends its side at once) with exit status 130.
pub(crate) async fn drive(
    t: &TransferArgs,
    op: &str,
    interrupt: &longhaul_quic::Interrupt,
    progress: Arc<Progress>,
    transfer: impl std::future::Future<Output = Result<ClientReport, Problem>>,
) -> i32 {
    let bar = progress::start(&progress, t.quiet || t.json);
    let r = tokio::select! {
        r = transfer => Some(r),
        _ = tokio::signal::ctrl_c() => None,
    };
    bar.finish().await;
    match r {
        Some(r) => conclude(r, op, t),
        None => {
            interrupt.close().await;
            eprintln!("longhaul: interrupted; rerun the same command to resume");
            if t.json {
                print_failure(op, &[], true);
            }
            EXIT_INTERRUPTED
        }
    }
}

/// Print the outcome (JSON or human) and pick the exit status.
fn conclude(r: Result<ClientReport, Problem>, op: &str, t: &TransferArgs) -> i32 {
    // The socket errors of a link that was down, in one line (the details
    // of a datagram it could not send are noise here).
    if let (Some((n, first)), false) = (logging::socket_errors(), t.quiet) {
        let first = first.split(", Transmit").next().unwrap_or_default();
        eprintln!(
            "longhaul: the network refused datagrams while the link was down \
             ({n} report(s), at most one per socket and minute): {}",
            shown(first)
        );
    }
    match r {
        Ok(rep) => {
            if let (Some(fp), false) = (&rep.fingerprint, t.quiet || t.json) {
                eprintln!("longhaul: trusted {fp} for this server from now on (known-hosts file)");
            }
            // Problems go to stderr also with --json: a script that keeps only
            // stdout still shows its user why it failed.
            for p in &rep.problems {
                eprintln!("error: {}", shown(&p.to_string()));
            }
            if t.json {
                report(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&rep).expect("report serializes")
                ));
            } else if !t.quiet {
                report(&format!("{}{}\n", changes(&rep), summary(&rep)));
            }
            rep.exit_code()
        }
        Err(p) => {
            eprintln!("error: {}", shown(&p.to_string()));
            if t.json {
                print_failure(op, std::slice::from_ref(&p), false);
            }
            p.kind.exit_code()
        }
    }
}

/// `--json` for a transfer that produced no report (it failed before or
/// outside its files, or was interrupted): the report's shape, so a script
/// reads `ok`, `problems`, `files` and `totals` whatever happened.
fn print_failure(op: &str, problems: &[Problem], interrupted: bool) {
    let doc = serde_json::json!({
        "op": op,
        "ok": false,
        "interrupted": interrupted,
        "problems": problems,
        "files": [],
        "totals": longhaul_quic::Totals::default(),
    });
    report(&format!(
        "{}\n",
        serde_json::to_string_pretty(&doc).expect("serializes")
    ));
}

/// Writes a transfer's report to stdout. A reader that went away (`| head`)
/// takes nothing from the transfer, whose exit code stands: no panic.
fn report(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("longhaul: cannot write the report to stdout: {e}");
        }
    }
}

/// The changes a dry run would make, one line each as `rsync -i` writes
/// them; or the paths a real run deleted, as `rsync -v` says them.
fn changes(r: &ClientReport) -> String {
    r.changes
        .iter()
        .map(|c| match r.dry_run {
            true => format!("{:<11} {}\n", c.item, shown(&c.path)),
            false => format!("deleting {}\n", shown(&c.path)),
        })
        .collect()
}

fn summary(r: &ClientReport) -> String {
    if r.dry_run {
        let t = &r.totals;
        return format!(
            "{} --dry-run: {} file(s) would be sent ({:.1} MB), {} skipped, {} failed; \
             {} change(s) listed, {} deletion(s); nothing was written",
            r.op,
            t.would_send,
            t.bytes_would_send as f64 / 1e6,
            t.skipped,
            t.failed,
            r.changes.len(),
            t.deleted
        );
    }
    let t = &r.totals;
    // Say so when the destination, not the network, set the pace for a
    // tenth of the run or more.
    let behind = match r.receiver_behind_s {
        b if b >= 0.2 && b >= r.seconds / 10.0 => format!(
            "\nthe destination was behind for {b:.1} of {:.1} s: its disk (or CPU) set the pace, not the network",
            r.seconds
        ),
        _ => String::new(),
    };
    let start = match (r.first_data_s, r.to_90pct_s, r.final_mbps) {
        (Some(f), Some(t), Some(m)) => format!(
            "\nfirst data after {f:.2} s; 90 % of the final {m:.1} Mbit/s {t:.2} s after that"
        ),
        (Some(f), _, _) => format!("\nfirst data after {f:.2} s"),
        _ => String::new(),
    };
    let repair = match (r.repair_bytes, r.op) {
        (0, _) => String::new(),
        (b, "get") => format!(
            "\ntail repair: {} stream(s) of the last window rebuilt from {:.1} kB of repair symbols",
            r.rebuilt_streams,
            b as f64 / 1e3
        ),
        (b, _) => format!(
            "\ntail repair: {:.1} kB of repair symbols sent for the last window",
            b as f64 / 1e3
        ),
    };
    let not_made = match r.not_made.len() {
        0 => String::new(),
        n => {
            let shown_ones: Vec<String> = r
                .not_made
                .iter()
                .take(3)
                .map(|m| format!("{} {} ({})", m.kind, shown(&m.path), m.why))
                .collect();
            let more = match n {
                1..=3 => String::new(),
                _ => format!(", and {} more (--json lists them)", n - 3),
            };
            format!(
                "\n{n} special file(s) not made: {}{more}",
                shown_ones.join(", ")
            )
        }
    };
    let names = format!(
        "{} symlink(s){}{}",
        t.symlinks,
        match t.hardlinks {
            0 => String::new(),
            n => format!(", {n} hard link(s)"),
        },
        match t.specials {
            0 => String::new(),
            n => format!(", {n} special file(s)"),
        }
    );
    let outages: String = r
        .outages
        .iter()
        .filter_map(|o| {
            o.down_s.map(|d| {
                format!(
                    "\nlink lost at {:.1} s ({}): reconnected {d:.1} s later ({} attempt(s)) and resumed",
                    o.lost_at_s,
                    shown(&o.cause),
                    o.attempts
                )
            })
        })
        .collect();
    let attrs = match r.attrs_not_kept {
        0 => String::new(),
        n => format!(
            "\n{n} item(s) arrived without their extended attributes or ACLs: the destination's file system keeps none"
        ),
    };
    let deleted = match t.deleted {
        0 => String::new(),
        n => format!("\n{n} path(s) deleted at the destination (--delete)"),
    };
    let shards = match (t.slices, t.other_shards) {
        (0, 0) => String::new(),
        (s, o) => format!(
            "\nthis shard: {s} part(s) of files received and checked (each file named by \
             the shard that completes it); {o} file(s) moved by other shards"
        ),
    };
    format!(
        "{}: {} file(s), {} verified, {} skipped, {} failed; {} dir(s), {}\n\
         {:.1} MB moved in {:.2} s = {:.1} Mbit/s ({:.1} MB/s); {:.1} MB resumed, \
         {:.1} MB skipped; \
         RTT {:.2} ms; {} B retransmitted; {} stream(s){}, cc {}{}{}{}{}{}{}{}{}",
        r.op,
        t.files,
        t.verified,
        t.skipped,
        t.failed,
        t.dirs,
        names,
        t.bytes_transferred as f64 / 1e6,
        r.seconds,
        r.rate_mbps,
        r.rate_mbps / 8.0,
        t.bytes_resumed as f64 / 1e6,
        t.bytes_skipped as f64 / 1e6,
        r.rtt_ms,
        r.retransmitted_bytes,
        r.streams,
        match r.connections {
            1 => String::new(),
            n => format!(" over {n} connections"),
        },
        r.cc,
        start,
        repair,
        behind,
        outages,
        not_made,
        deleted,
        attrs,
        shards
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    fn parsed(s: &[u8]) -> (String, String, u16, Vec<u8>) {
        parse_remote(OsStr::from_bytes(s)).unwrap()
    }

    #[test]
    fn remote_specs_split_into_host_port_and_a_path_of_any_bytes() {
        let d = longhaul_quic::DEFAULT_PORT;
        assert_eq!(
            parsed(b"h:run42"),
            (format!("h:{d}"), "h".into(), d, b"run42".to_vec())
        );
        assert_eq!(
            parsed(b"h:9000:a/b"),
            ("h:9000".into(), "h".into(), 9000, b"a/b".to_vec())
        );
        // Digits alone are a path: the port needs its own colon.
        assert_eq!(parsed(b"h:2024").3, b"2024");
        assert_eq!(parsed(b"h:").3, b"");
        assert_eq!(
            parsed(b"[::1]:9000:x"),
            ("[::1]:9000".into(), "::1".into(), 9000, b"x".to_vec())
        );
        assert_eq!(parsed(b"[::1]:x").2, d);
        assert_eq!(parsed(b"h:bad\xffname/\xfe").3, b"bad\xffname/\xfe");
        for wrong in [&b"nohost"[..], b":path", b"[::1]x", b"h\xff:p"] {
            let e = parse_remote(OsStr::from_bytes(wrong)).expect_err("refused");
            assert!(e.to_string().contains("is not HOST[:PORT]:PATH"), "{e}");
        }
    }
}
