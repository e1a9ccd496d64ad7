//! `get --ssh` and `put --ssh`: the far side started over an ssh login, the
//! data over QUIC. The client runs `ssh HOST longhaul serve --once --root /`;
//! that server binds a UDP port, makes a fresh key and a one-time token, and
//! prints one line of JSON ([`Hello`]) on its standard output, which ssh
//! carries back. The client pins that fingerprint (the known-hosts file is
//! neither read nor written), sends that token, and moves the data as any
//! get or put. Closing ssh's standard input ends the remote server; so does
//! the end of its one session, or a client that never comes.
//!
//! Paths follow scp: relative to the remote home, absolute allowed. The
//! remote server's root is `/` (the ssh user's own permissions confine it);
//! the client makes each path absolute with the remote working directory
//! the server reports, resolves `.` and `..` in the text, and sends it
//! relative to `/`, as the protocol wants.

use crate::args::{GetArgs, PutArgs, SshArgs, TransferArgs};
use crate::{client_opts, drive, usage};
use anyhow::Result;
use longhaul_quic::{join_host_port, Progress, Server};
use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::net::IpAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The line `serve --once` prints for its client.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct Hello {
    /// The version of this line (1).
    pub longhaul_ssh: u32,
    /// The UDP port the server listens on.
    pub port: u16,
    /// The address the ssh session came in on (from `SSH_CONNECTION`): the
    /// one the client reaches this host at, whatever ssh's configuration
    /// calls it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// The server's certificate fingerprint (SHA256:...).
    pub fingerprint: String,
    /// The one-time token the server wants in `Hello.token`.
    pub token: String,
    /// The server's working directory (the ssh user's home), as bytes in
    /// hex: relative paths are relative to it.
    pub cwd_hex: String,
}

/// How long the remote side may take to answer (a password typed at ssh's
/// prompt included).
const HELLO_WAIT: Duration = Duration::from_secs(120);
/// How long the QUIC handshake may go unanswered: the server is known to be
/// up, so silence means UDP does not get through.
const UDP_WAIT: Duration = Duration::from_secs(10);
/// How long ssh may take to exit once its standard input is closed.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// The server address of this ssh session (`SSH_CONNECTION` is "client-ip
/// client-port server-ip server-port").
pub(crate) fn ssh_connection_ip() -> Option<IpAddr> {
    let v = std::env::var("SSH_CONNECTION").ok()?;
    v.split_whitespace().nth(2)?.parse().ok()
}

/// `LOW-HIGH` (or one port) as the list of its ports.
pub(crate) fn parse_port_range(s: &str) -> Result<Vec<u16>, String> {
    let bad = || format!("--port-range {s:?}: give LOW-HIGH, e.g. 50000-50100");
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (a.trim(), b.trim()),
        None => (s.trim(), s.trim()),
    };
    let (lo, hi): (u16, u16) = (
        lo.parse().map_err(|_| bad())?,
        hi.parse().map_err(|_| bad())?,
    );
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    Ok((lo..=hi).collect())
}

/// `serve --once` after binding: print the line for the client, serve one
/// session, and end with it, with standard input (ssh gone), or with Ctrl-C.
pub(crate) async fn serve_once(server: Server, addr: Option<IpAddr>, token: &[u8]) -> Result<i32> {
    let cwd = std::env::current_dir()?;
    // (Before the hello: a signal right after it finds the handlers.)
    let stop = crate::stop_signal(true);
    let hello = Hello {
        longhaul_ssh: 1,
        port: server.local_addr()?.port(),
        addr: addr.map(|a| a.to_string()),
        fingerprint: server.fingerprint.clone(),
        token: String::from_utf8_lossy(token).into_owned(),
        cwd_hex: hex(cwd.as_os_str().as_bytes()),
    };
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string(&hello)?)?;
        out.flush()?;
    }
    // Standard input ends when the ssh session does.
    let (tx, stdin_closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut sink = [0u8; 256];
        let mut stdin = std::io::stdin().lock();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    let close = server.closer();
    tokio::select! {
        r = server.run() => r?,
        _ = stdin_closed => close.await,
        // (Returning removes the fresh key's temporary directory.)
        _ = stop => close.await,
    }
    Ok(0)
}

/// `[USER@]HOST:PATH` split into the ssh destination and the path (any
/// bytes). An IPv6 host goes in brackets: `user@[::1]:data`.
fn parse_ssh_remote(s: &OsStr) -> Result<(String, Vec<u8>)> {
    let b = s.as_bytes();
    let bad = || usage(format!("{:?} is not [USER@]HOST:PATH", s.to_string_lossy()));
    let mut depth = 0;
    let colon = b
        .iter()
        .position(|&c| {
            match c {
                b'[' => depth += 1,
                b']' => depth -= 1,
                b':' if depth == 0 => return true,
                _ => {}
            }
            false
        })
        .ok_or_else(bad)?;
    let dest = std::str::from_utf8(&b[..colon]).map_err(|_| bad())?;
    if dest.is_empty() || dest.ends_with('@') {
        return Err(bad());
    }
    if dest.starts_with('-') {
        // ssh would take it for an option (-oProxyCommand=...).
        return Err(usage(format!("{dest:?}: a host may not begin with '-'")));
    }
    Ok((dest.to_string(), b[colon + 1..].to_vec()))
}

/// The host of an ssh destination (`user@host` -> `host`, `[::1]` -> `::1`).
fn host_of(dest: &str) -> &str {
    let h = dest.rsplit_once('@').map_or(dest, |(_, h)| h);
    h.strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h)
}

/// The destination as ssh takes it: an IPv6 host without its brackets.
fn for_ssh(dest: &str) -> String {
    match dest.rsplit_once('@') {
        Some((u, _)) => format!("{u}@{}", host_of(dest)),
        None => host_of(dest).to_string(),
    }
}

/// A remote path as the one-shot server (root `/`) wants it: absolute with
/// `cwd` if relative, `.` and `..` resolved in the text, then without its
/// leading `/`; a trailing `/` (or an empty path: the home itself) means
/// "the contents", as for any get or put.
pub(crate) fn remote_path(cwd: &[u8], p: &[u8]) -> Vec<u8> {
    // `~` and `~/...` are the home, as a remote shell would expand them.
    let p = match p {
        b"~" => b"",
        _ => p.strip_prefix(b"~/").unwrap_or(p),
    };
    let full: Vec<u8> = if p.starts_with(b"/") {
        p.to_vec()
    } else {
        [cwd, b"/", p].concat()
    };
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in full.split(|&x| x == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let contents = p.is_empty() || p.ends_with(b"/") || p.ends_with(b"/.") || p == b".";
    let mut out = parts.join(&b'/');
    if contents && !out.is_empty() {
        out.push(b'/');
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Shell-quotes a word for the remote shell (`'...'`), unless it is made of
/// characters no shell treats specially; a leading `~/` stays unquoted so
/// that the remote shell expands it.
fn quote(w: &str) -> String {
    let plain = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&c))
    };
    if plain(w) {
        return w.to_string();
    }
    if let Some(rest) = w.strip_prefix("~/") {
        if plain(rest) {
            return w.to_string();
        }
        return format!("~/{}", quote(rest));
    }
    format!("'{}'", w.replace('\'', r"'\''"))
}

/// The remote side, started: ssh running `serve --once`, and what it said.
struct Far {
    child: tokio::process::Child,
    hello: Hello,
    /// Closing it ends the remote server.
    stdin: Option<tokio::process::ChildStdin>,
}

/// The user's ssh command (`--ssh-command`, else `ssh`).
fn ssh_command(s: &SshArgs) -> String {
    s.ssh_command.clone().unwrap_or_else(|| "ssh".into())
}

/// `CMD [OPTION] DEST`, the rest of its arguments for the caller to add:
/// the command is the user's, with its options, so a shell splits it.
fn ssh_to(cmd: &str, option: &str, dest: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new("sh");
    c.arg("-c")
        .arg(format!("exec {cmd} {option} \"$@\""))
        .arg("sh")
        .arg(for_ssh(dest))
        .kill_on_drop(true);
    c
}

/// Closes ssh's standard input (the remote server exits with it) and waits
/// [`EXIT_WAIT`] for ssh to end, then kills it; its status, if it ended.
async fn end_ssh(
    child: &mut tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
) -> Option<std::process::ExitStatus> {
    drop(stdin);
    match tokio::time::timeout(EXIT_WAIT, child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            let _ = child.kill().await;
            None
        }
    }
}

/// The far side could not be started or reached: exit status 3.
fn conn_problem(msg: String) -> anyhow::Error {
    crate::Fail(crate::EXIT_CONNECTION, msg).into()
}

impl Far {
    /// Runs `CMD DEST 'exec longhaul serve --once --root / ...'` and waits
    /// for the server's line.
    async fn start(s: &SshArgs, dest: &str, serve_args: &[String]) -> Result<Far> {
        let cmd = ssh_command(s);
        let exe = s.longhaul_path.clone().unwrap_or_else(|| "longhaul".into());
        let mut words = vec![
            quote(&exe),
            "serve".into(),
            "--once".into(),
            "--root".into(),
            "/".into(),
        ];
        if let Some(r) = &s.port_range {
            words.extend(["--port-range".into(), quote(r)]);
        }
        words.extend(serve_args.iter().map(|a| quote(a)));
        let remote = format!("exec {}", words.join(" "));
        tracing::debug!("running {cmd} {dest} {remote}");
        let mut child = ssh_to(&cmd, "", dest)
            .arg(&remote)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| conn_problem(format!("cannot run {cmd}: {e}")))?;
        let mut stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let read = async {
            // A remote shell may print something first (any bytes); the
            // server's line is the first that parses.
            let mut line = Vec::new();
            for _ in 0..1000 {
                line.clear();
                if out.read_until(b'\n', &mut line).await? == 0 {
                    return Ok(None);
                }
                if let Ok(h) = serde_json::from_slice::<Hello>(line.trim_ascii()) {
                    return Ok(Some(h));
                }
                tracing::debug!("remote said: {}", String::from_utf8_lossy(&line));
            }
            Ok::<_, std::io::Error>(None)
        };
        let hello = match tokio::time::timeout(HELLO_WAIT, read).await {
            Ok(Ok(Some(h))) => h,
            Ok(r) => {
                // Whatever runs there is told to end, and given a moment.
                let status = end_ssh(&mut child, stdin.take()).await;
                let code = status.and_then(|s| s.code());
                let hint = match code {
                    Some(127) => format!(
                        ": the remote shell did not find `{exe}`; install longhaul there, \
                         or name it with --longhaul-path"
                    ),
                    Some(255) => " (ssh could not log in; its message is above)".into(),
                    Some(0) if r.is_ok() => format!(
                        ": `{exe}` there printed no server line; is it a longhaul \
                         without `serve --once`?"
                    ),
                    _ => String::new(),
                };
                let how = code.map_or("was killed".into(), |c| format!("exited with {c}"));
                return Err(conn_problem(format!(
                    "{cmd} {dest} {how} before the remote longhaul answered{hint}"
                )));
            }
            Err(_) => {
                return Err(conn_problem(format!(
                    "no answer from the remote longhaul over {cmd} {dest} within {} s",
                    HELLO_WAIT.as_secs()
                )))
            }
        };
        if hello.longhaul_ssh != 1 {
            return Err(conn_problem(format!(
                "the remote longhaul speaks version {} of the ssh start, this one 1",
                hello.longhaul_ssh
            )));
        }
        // Nothing more is expected on stdout; keep the pipe drained.
        tokio::spawn(async move {
            let mut sink = tokio::io::sink();
            let _ = tokio::io::copy(&mut out, &mut sink).await;
        });
        Ok(Far {
            child,
            hello,
            stdin,
        })
    }

    /// The remote working directory, as bytes.
    fn cwd(&self) -> Result<Vec<u8>> {
        unhex(&self.hello.cwd_hex)
            .ok_or_else(|| conn_problem("the remote longhaul sent a bad cwd_hex".into()))
    }

    /// (HOST, PORT) to reach the server at: the host ssh connected to (as
    /// `ssh -G` names it, through ~/.ssh/config), if it resolves here; else
    /// the address the server saw the ssh session come in on. (Behind NAT
    /// the latter is a private address; through a jump host the former
    /// may not resolve.)
    async fn target(&self, s: &SshArgs, dest: &str) -> (String, u16) {
        let port = self.hello.port;
        let name = ssh_hostname(s, dest)
            .await
            .unwrap_or_else(|| host_of(dest).to_string());
        let resolves = tokio::net::lookup_host((name.as_str(), port))
            .await
            .is_ok_and(|mut a| a.next().is_some());
        match (&self.hello.addr, resolves) {
            (Some(a), false) => (a.clone(), port),
            _ => (name, port),
        }
    }

    /// Runs the transfer as any get or put ([`drive`]), then ends the far
    /// side; the exit status.
    async fn drive(
        mut self,
        t: &TransferArgs,
        op: &str,
        opts: &longhaul_quic::ClientOpts,
        progress: Arc<Progress>,
        transfer: impl std::future::Future<
            Output = Result<longhaul_quic::ClientReport, longhaul_quic::Problem>,
        >,
    ) -> i32 {
        let run = drive(t, op, &opts.interrupt, progress, transfer);
        tokio::pin!(run);
        // ssh ending takes the server with it: a transfer whose connection
        // is lost then does not wait for it to come back.
        let code = tokio::select! {
            code = &mut run => code,
            _ = self.child.wait() => {
                opts.gone.store(true, std::sync::atomic::Ordering::Relaxed);
                run.await
            }
        };
        self.finish().await;
        code
    }

    /// Close ssh's standard input (the remote server exits) and wait for ssh.
    async fn finish(mut self) {
        if let Some(s) = end_ssh(&mut self.child, self.stdin.take()).await {
            if !s.success() {
                tracing::debug!("ssh ended: {s}");
            }
        }
    }
}

/// The host name ssh would connect to for `dest` (`ssh -G`: its config
/// applied), when the command is OpenSSH's ssh and says so within 3 s.
async fn ssh_hostname(s: &SshArgs, dest: &str) -> Option<String> {
    let cmd = ssh_command(s);
    let program = cmd.split_whitespace().next()?;
    if Path::new(program).file_name()? != "ssh" {
        return None;
    }
    let run = ssh_to(&cmd, "-G", dest)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(3), run)
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("hostname ").map(|h| h.trim().to_string()))
        .filter(|h| !h.is_empty())
}

/// Options the far side cannot take from the client's Hello.
fn serve_args(t: &TransferArgs) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(w) = &t.net.window {
        v.extend(["--window".into(), w.clone()]);
    }
    if t.exact_modes {
        v.push("--exact-modes".into());
    }
    // A one-shot server runs one worker; a session over N connections
    // wants N there too.
    if let Some(n) = t.connections.filter(|&n| n > 1) {
        v.extend(["--workers".into(), n.to_string()]);
    }
    v
}

/// Refuses the trust options that --ssh replaces.
fn check(t: &TransferArgs) -> Result<()> {
    for (given, name) in [
        (t.fingerprint.is_some(), "--fingerprint"),
        (t.accept_new, "--accept-new"),
        (t.known_hosts.is_some(), "--known-hosts"),
        (t.token_file.is_some(), "--token-file"),
    ] {
        if given {
            return Err(usage(format!(
                "{name} is not used with --ssh: the server's fingerprint and a one-time \
                 token come over the ssh login"
            )));
        }
    }
    Ok(())
}

fn opts_for(
    t: &TransferArgs,
    far: &Far,
    host: &str,
    port: u16,
) -> Result<longhaul_quic::ClientOpts> {
    let mut o = client_opts(t, join_host_port(host, port))?;
    o.trust.known_hosts = None;
    o.trust.pinned = Some(far.hello.fingerprint.clone());
    o.trust.accept_new = false;
    o.token = far.hello.token.clone().into_bytes();
    o.connect_timeout = Some(UDP_WAIT);
    Ok(o)
}

/// `get --ssh [USER@]HOST:PATH... DEST`.
pub(crate) async fn get(a: GetArgs) -> Result<i32> {
    check(&a.t)?;
    let (remotes, dest) = a.paths.split_at(a.paths.len() - 1);
    let mut target = None;
    let mut paths = Vec::new();
    for r in remotes {
        let (d, p) = parse_ssh_remote(r)?;
        if target.as_ref().is_some_and(|t| *t != d) {
            return Err(usage(
                "every REMOTE_PATH of one get must name the same host",
            ));
        }
        target = Some(d);
        paths.push(p);
    }
    let ssh_dest = target.expect("at least one remote");
    let mut args = serve_args(&a.t);
    args.push("--read-only".into());
    let far = Far::start(&a.t.ssh, &ssh_dest, &args).await?;
    let cwd = far.cwd()?;
    let paths: Vec<Vec<u8>> = paths.iter().map(|p| remote_path(&cwd, p)).collect();
    let (host, port) = far.target(&a.t.ssh, &ssh_dest).await;
    let opts = opts_for(&a.t, &far, &host, port)?;
    let dest = PathBuf::from(&dest[0]);
    let progress = Arc::new(Progress::default());
    let get = longhaul_quic::get(&host, port, &paths, &dest, &opts, progress.clone());
    Ok(far.drive(&a.t, "get", &opts, progress, get).await)
}

/// `put --ssh PATH... [USER@]HOST:DEST`.
pub(crate) async fn put(a: PutArgs) -> Result<i32> {
    check(&a.t)?;
    let (locals, dest) = a.paths.split_at(a.paths.len() - 1);
    let (ssh_dest, rdest) = parse_ssh_remote(&dest[0])?;
    let far = Far::start(&a.t.ssh, &ssh_dest, &serve_args(&a.t)).await?;
    let rdest = remote_path(&far.cwd()?, &rdest);
    let (host, port) = far.target(&a.t.ssh, &ssh_dest).await;
    let opts = opts_for(&a.t, &far, &host, port)?;
    let locals: Vec<PathBuf> = locals.iter().map(PathBuf::from).collect();
    let progress = Arc::new(Progress::default());
    let put = longhaul_quic::put(&locals, &host, port, &rdest, &opts, progress.clone());
    Ok(far.drive(&a.t, "put", &opts, progress, put).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_paths_are_made_absolute_with_the_home_and_resolved() {
        let home = b"/home/ann";
        let t = |p: &str| String::from_utf8(remote_path(home, p.as_bytes())).unwrap();
        assert_eq!(t("run42"), "home/ann/run42");
        assert_eq!(t("run42/"), "home/ann/run42/");
        assert_eq!(t(""), "home/ann/");
        assert_eq!(t("."), "home/ann/");
        assert_eq!(t("/data/x"), "data/x");
        assert_eq!(t("../bob/x"), "home/bob/x");
        assert_eq!(t("a/./b/../c"), "home/ann/a/c");
        assert_eq!(t("/../../etc"), "etc");
        assert_eq!(t("/"), "");
        assert_eq!(t("~"), "home/ann/");
        assert_eq!(t("~/x"), "home/ann/x");
        assert_eq!(t("~bob/x"), "home/ann/~bob/x");
        // Any bytes pass through.
        assert_eq!(remote_path(home, b"\xff/x"), b"home/ann/\xff/x");
    }

    #[test]
    fn ssh_remotes_split_at_the_first_colon_outside_brackets() {
        let p = |s: &str| parse_ssh_remote(OsStr::new(s)).map_err(|e| e.to_string());
        assert_eq!(
            p("ann@srv:run42").unwrap(),
            ("ann@srv".into(), b"run42".to_vec())
        );
        assert_eq!(p("srv:").unwrap(), ("srv".into(), vec![]));
        assert_eq!(p("srv:a:b").unwrap(), ("srv".into(), b"a:b".to_vec()));
        assert_eq!(
            p("ann@[::1]:x").unwrap(),
            ("ann@[::1]".into(), b"x".to_vec())
        );
        assert!(p("nocolon").is_err());
        assert!(p(":x").is_err());
        assert!(p("ann@:x").is_err());
        assert!(p("-oProxyCommand=evil:x").is_err());
        assert_eq!(for_ssh("ann@[::1]"), "ann@::1");
        assert_eq!(for_ssh("[::1]"), "::1");
        assert_eq!(for_ssh("srv"), "srv");
        assert_eq!(host_of("ann@[::1]"), "::1");
        assert_eq!(host_of("ann@srv"), "srv");
        assert_eq!(host_of("srv"), "srv");
    }

    #[test]
    fn port_ranges() {
        assert_eq!(
            parse_port_range("50000-50002").unwrap(),
            vec![50000, 50001, 50002]
        );
        assert_eq!(parse_port_range("7000").unwrap(), vec![7000]);
        assert!(parse_port_range("9-3").is_err());
        assert!(parse_port_range("0-3").is_err());
        assert!(parse_port_range("x").is_err());
    }

    #[test]
    fn remote_words_are_quoted_only_where_needed() {
        assert_eq!(quote("longhaul"), "longhaul");
        assert_eq!(quote("/opt/long haul/bin"), "'/opt/long haul/bin'");
        assert_eq!(quote("~/bin/longhaul"), "~/bin/longhaul");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn the_hello_line_round_trips_and_cwd_bytes_survive() {
        let h = Hello {
            longhaul_ssh: 1,
            port: 50001,
            addr: Some("10.0.0.1".into()),
            fingerprint: "SHA256:abc".into(),
            token: "00ff".into(),
            cwd_hex: hex(b"/home/\xffx"),
        };
        let line = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<Hello>(&line).unwrap(), h);
        assert_eq!(unhex(&h.cwd_hex).unwrap(), b"/home/\xffx");
        assert_eq!(unhex("abc"), None);
    }
}
