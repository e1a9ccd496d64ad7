//! Shared helpers of the black-box tests (the CLI's, run as a child
//! process): a `longhaul serve` child that is killed on drop, a client
//! runner with a timeout, temporary directories, data generation, and a tree
//! comparison by content and metadata; and [`raw`], a QUIC client that
//! speaks the control protocol frame by frame for hostile tests.

pub mod flood;
pub mod raw;
pub mod ssh;

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `longhaul` binary cargo built for the running test: beside the test
/// binary's `deps/` directory (`target/<profile>/longhaul`).
pub fn bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps/<test>");
    let b = dir.join("longhaul");
    assert!(
        b.exists(),
        "{} not built (run the CLI's tests)",
        b.display()
    );
    b
}
pub const MIB: u64 = 1 << 20;

/// A `longhaul` command that can never read or write the user's own config/state:
/// the XDG directories point at a path that does not exist (and cannot be created).
pub fn longhaul() -> Command {
    let mut c = Command::new(bin());
    c.env_remove("LONGHAUL_TOKEN")
        .env_remove("LONGHAUL_LOG")
        .env("XDG_CONFIG_HOME", "/dev/null/longhaul-tests-no-config")
        .env("XDG_STATE_HOME", "/dev/null/longhaul-tests-no-state")
        .env("NO_COLOR", "1");
    c
}

/// Outcome of a client run.
#[derive(Debug)]
pub struct Out {
    /// Exit status, or -SIGNAL when killed.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Out {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Panic with the whole output unless the exit status is `code`.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code, code,
            "expected exit status {code}, got {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }
}

fn status_code(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| -s.signal().unwrap_or(0))
}

/// Run a command to completion, capturing its output; killed after `timeout`.
pub fn run_timeout(mut cmd: Command, timeout: Duration) -> Out {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawning longhaul");
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for longhaul") {
            break s;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let so = String::from_utf8_lossy(&t1.join().unwrap()).into_owned();
            let se = String::from_utf8_lossy(&t2.join().unwrap()).into_owned();
            panic!("{cmd:?} did not finish within {timeout:?}\nstdout:\n{so}\nstderr:\n{se}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Out {
        code: status_code(status),
        stdout: String::from_utf8_lossy(&t1.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&t2.join().unwrap()).into_owned(),
        elapsed: started.elapsed(),
    }
}

/// Give the child a soft RLIMIT_NOFILE of `n` (the common default is 1024), so a
/// test does not depend on the limit of the machine it runs on.
pub fn limit_nofile(cmd: &mut Command, n: u64) {
    set_rlimit(cmd, libc::RLIMIT_NOFILE, n);
}

/// Lower the child's soft limit `res` to `n` (never above the hard limit).
pub fn set_rlimit(cmd: &mut Command, res: libc::__rlimit_resource_t, n: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls (getrlimit/setrlimit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut r = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(res, &mut r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            r.rlim_cur = (n as libc::rlim_t).min(r.rlim_max);
            if libc::setrlimit(res, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

pub fn run(cmd: Command) -> Out {
    run_timeout(cmd, Duration::from_secs(180))
}

/// `HOST:PORT:PATH` for a server on 127.0.0.1, as an OsString (PATH may be non-UTF-8).
pub fn remote(port: u16, path: impl AsRef<OsStr>) -> OsString {
    let mut s = OsString::from(format!("127.0.0.1:{port}:"));
    s.push(path.as_ref());
    s
}

/// A `longhaul serve` child process, killed (by its PID, via `Child::kill`) on drop.
pub struct Server {
    child: std::sync::Mutex<Option<Child>>,
    pub port: u16,
    pub fingerprint: String,
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub log: PathBuf,
}

pub struct ServeCfg<'a> {
    pub root: &'a Path,
    pub state_dir: &'a Path,
    /// 0: any free port.
    pub port: u16,
    pub args: Vec<OsString>,
    pub env: Vec<(String, OsString)>,
    /// Soft RLIMIT_NOFILE of the server process.
    pub nofile: Option<u64>,
    /// RLIMIT_AS (bytes) of the server process.
    pub address_space: Option<u64>,
}

impl<'a> ServeCfg<'a> {
    pub fn new(root: &'a Path, state_dir: &'a Path) -> Self {
        ServeCfg {
            root,
            state_dir,
            port: 0,
            args: Vec::new(),
            env: Vec::new(),
            nofile: None,
            address_space: None,
        }
    }
    pub fn port(mut self, p: u16) -> Self {
        self.port = p;
        self
    }
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn env(mut self, k: &str, v: impl Into<OsString>) -> Self {
        self.env.push((k.to_string(), v.into()));
        self
    }
    /// Let clients without a token put (`--allow-anonymous-put`): a test
    /// server on loopback that takes puts.
    pub fn writable(self) -> Self {
        self.arg("--allow-anonymous-put")
    }
    pub fn nofile(mut self, n: u64) -> Self {
        self.nofile = Some(n);
        self
    }
    pub fn start(self) -> Server {
        Server::start_cfg(self)
    }
}

impl Server {
    pub fn start(root: &Path, state_dir: &Path) -> Server {
        ServeCfg::new(root, state_dir).start()
    }
    /// A server that takes puts without a token ([`ServeCfg::writable`]).
    pub fn start_writable(root: &Path, state_dir: &Path) -> Server {
        ServeCfg::new(root, state_dir).writable().start()
    }

    fn start_cfg(cfg: ServeCfg) -> Server {
        // Bind retries: a port just released by a killed server is normally free at
        // once for UDP, but be tolerant of a slow kernel.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::try_start(&cfg) {
                Ok(s) => return s,
                Err(msg) if cfg.port != 0 && Instant::now() < deadline => {
                    eprintln!("retrying serve on port {}: {msg}", cfg.port);
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(msg) => panic!("{msg}"),
            }
        }
    }

    fn try_start(cfg: &ServeCfg) -> Result<Server, String> {
        let log = cfg.state_dir.with_extension(format!(
            "serve-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let logf = std::fs::File::create(&log).expect("server log file");
        let mut c = longhaul();
        c.arg("serve")
            .arg("--root")
            .arg(cfg.root)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", cfg.port))
            .arg("--state-dir")
            .arg(cfg.state_dir)
            .args(&cfg.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // The server logs every session at info level: to a file, so a full pipe
            // can never block it.
            .stderr(Stdio::from(logf));
        for (k, v) in &cfg.env {
            c.env(k, v);
        }
        if let Some(n) = cfg.nofile {
            limit_nofile(&mut c, n);
        }
        if let Some(n) = cfg.address_space {
            set_rlimit(&mut c, libc::RLIMIT_AS, n);
        }
        let mut child = c.spawn().expect("spawning longhaul serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut l1 = String::new();
        let mut l2 = String::new();
        let _ = out.read_line(&mut l1);
        let _ = out.read_line(&mut l2);
        let fail = |child: &mut Child, what: &str| {
            let _ = child.kill();
            let _ = child.wait();
            format!(
                "longhaul serve did not start ({what}); stdout {l1:?} {l2:?}; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        };
        let Some(addr) = l1
            .trim_end()
            .rsplit_once("listening on ")
            .map(|(_, a)| a.split(',').next().unwrap().to_string())
        else {
            return Err(fail(&mut child, "no 'listening on' line"));
        };
        assert!(
            l1.starts_with(&format!("longhaul serve: root {}, ", cfg.root.display())),
            "first line names the root: {l1:?}"
        );
        let Some(port) = addr
            .strip_prefix("127.0.0.1:")
            .and_then(|p| p.parse::<u16>().ok())
        else {
            return Err(fail(&mut child, "bad address"));
        };
        let Some(fp) = l2.trim_end().strip_prefix("fingerprint ") else {
            return Err(fail(&mut child, "no fingerprint line"));
        };
        assert!(
            fp.starts_with("SHA256:") && fp.len() == 7 + 43,
            "fingerprint form: {fp:?}"
        );
        if cfg.port != 0 {
            assert_eq!(port, cfg.port, "listening on the requested port");
        }
        // Keep stdout open but drained in the background (nothing more is printed).
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = out.read_to_end(&mut sink);
        });
        Ok(Server {
            child: std::sync::Mutex::new(Some(child)),
            port,
            fingerprint: fp.to_string(),
            root: cfg.root.to_path_buf(),
            state_dir: cfg.state_dir.to_path_buf(),
            log,
        })
    }

    /// SIGKILL the server now (kill -9 by PID) and reap it.
    pub fn kill(&self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(|c| c.id())
    }

    /// Is the server process still running?
    pub fn alive(&self) -> bool {
        match &mut *self.child.lock().unwrap() {
            Some(c) => c.try_wait().ok().flatten().is_none(),
            None => false,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn remote(&self, path: impl AsRef<OsStr>) -> OsString {
        remote(self.port, path)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A client bound to one known-hosts file.
pub struct Client {
    pub known_hosts: PathBuf,
}

impl Client {
    pub fn new(known_hosts: impl Into<PathBuf>) -> Client {
        Client {
            known_hosts: known_hosts.into(),
        }
    }

    /// `longhaul SUB --known-hosts KH ARGS...`
    pub fn cmd<I, S>(&self, sub: &str, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = longhaul();
        c.arg(sub)
            .arg("--known-hosts")
            .arg(&self.known_hosts)
            .args(args);
        c
    }

    pub fn run<I, S>(&self, sub: &str, args: I) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run(self.cmd(sub, args))
    }
}

/// A temporary directory that is made writable again before removal (it may hold
/// read-only directories), removed on drop.
pub struct Tmp(Option<tempfile::TempDir>);

impl Tmp {
    pub fn new(label: &str) -> Tmp {
        Tmp(Some(
            tempfile::Builder::new()
                .prefix(&format!("longhaul-test-{label}-"))
                .tempdir()
                .expect("temp dir"),
        ))
    }
    pub fn path(&self) -> &Path {
        self.0.as_ref().unwrap().path()
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path().join(p)
    }
}

fn make_writable(p: &Path) {
    if let Ok(m) = std::fs::symlink_metadata(p) {
        if m.is_dir() {
            let mode = m.permissions().mode();
            if mode & 0o700 != 0o700 {
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o700));
            }
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    make_writable(&e.path());
                }
            }
        }
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            make_writable(t.path());
            let _ = t.close();
        }
    }
}

/// Write `len` pseudo-random bytes from `seed` (BLAKE3 XOF, fast and incompressible).
pub fn gen_file(path: &Path, seed: u64, len: u64) {
    use std::io::Write;
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(b"lh-tests");
    let mut xof = blake3::Hasher::new_keyed(&key).finalize_xof();
    let mut f = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    );
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        xof.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
}

pub fn gen_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(b"lh-bytes");
    let mut v = vec![0u8; len];
    blake3::Hasher::new_keyed(&key).finalize_xof().fill(&mut v);
    v
}

/// BLAKE3 of a file, streamed.
pub fn hash_file(p: &Path) -> blake3::Hash {
    let f = std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut h = blake3::Hasher::new();
    h.update_reader(f).unwrap();
    h.finalize()
}

/// Set a path's mtime (and atime) to `ns` since the epoch, not following symlinks.
pub fn set_mtime_ns(p: &Path, ns: i64) {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let ts = libc::timespec {
        tv_sec: ns.div_euclid(1_000_000_000) as libc::time_t,
        tv_nsec: ns.rem_euclid(1_000_000_000) as _,
    };
    let times = [ts, ts];
    // SAFETY: a valid NUL-terminated path and two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(
        r,
        0,
        "utimensat {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

pub fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    m.mtime() * 1_000_000_000 + m.mtime_nsec()
}

pub fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

fn kind(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_symlink() {
        "symlink"
    } else if t.is_dir() {
        "dir"
    } else if t.is_file() {
        "file"
    } else {
        "other"
    }
}

fn sorted_names(p: &Path) -> Vec<OsString> {
    let mut v: Vec<OsString> = std::fs::read_dir(p)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", p.display()))
        .map(|e| e.unwrap().file_name())
        .collect();
    v.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    v
}

fn same_content(a: &Path, b: &Path) -> bool {
    let (ma, mb) = (std::fs::metadata(a).unwrap(), std::fs::metadata(b).unwrap());
    if ma.len() != mb.len() {
        return false;
    }
    if ma.len() <= 64 << 20 {
        std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
    } else {
        hash_file(a) == hash_file(b)
    }
}

/// What to compare besides names, types, contents and link targets.
#[derive(Clone, Copy)]
pub struct Compare {
    pub mode: bool,
    pub mtime: bool,
    /// Also compare the mode/mtime of the two top directories themselves.
    pub top_meta: bool,
}

impl Compare {
    pub const ALL: Compare = Compare {
        mode: true,
        mtime: true,
        top_meta: true,
    };
    pub const CONTENT: Compare = Compare {
        mode: false,
        mtime: false,
        top_meta: false,
    };
}

/// Differences between two trees (empty when equal): names, file types, bytes,
/// link targets, and per `cmp` modes and mtimes (nanoseconds).
pub fn diff_trees(a: &Path, b: &Path, cmp: Compare) -> Vec<String> {
    let mut out = Vec::new();
    diff_at(a, b, Path::new(""), cmp, true, &mut out);
    out
}

fn diff_at(a: &Path, b: &Path, rel: &Path, cmp: Compare, top: bool, out: &mut Vec<String>) {
    let show = |r: &Path| {
        format!(
            "{:?}",
            if r.as_os_str().is_empty() {
                Path::new(".")
            } else {
                r
            }
        )
    };
    let ma = match std::fs::symlink_metadata(a) {
        Ok(m) => m,
        Err(e) => return out.push(format!("{}: source unreadable: {e}", show(rel))),
    };
    let mb = match std::fs::symlink_metadata(b) {
        Ok(m) => m,
        Err(e) => return out.push(format!("{}: missing at the destination: {e}", show(rel))),
    };
    if kind(&ma) != kind(&mb) {
        return out.push(format!(
            "{}: {} at the source, {} at the destination",
            show(rel),
            kind(&ma),
            kind(&mb)
        ));
    }
    let meta = !top || cmp.top_meta;
    if meta && cmp.mode && !ma.file_type().is_symlink() && ma.mode() & 0o7777 != mb.mode() & 0o7777
    {
        out.push(format!(
            "{}: mode {:o} vs {:o}",
            show(rel),
            ma.mode() & 0o7777,
            mb.mode() & 0o7777
        ));
    }
    if meta && cmp.mtime && mtime_ns(&ma) != mtime_ns(&mb) {
        out.push(format!(
            "{} ({}): mtime {} vs {} ns",
            show(rel),
            kind(&ma),
            mtime_ns(&ma),
            mtime_ns(&mb)
        ));
    }
    let t = ma.file_type();
    if t.is_symlink() {
        let (la, lb) = (
            std::fs::read_link(a).unwrap(),
            std::fs::read_link(b).unwrap(),
        );
        if la != lb {
            out.push(format!("{}: link -> {la:?} vs {lb:?}", show(rel)));
        }
    } else if t.is_file() {
        if !same_content(a, b) {
            out.push(format!(
                "{}: contents differ ({} vs {} bytes)",
                show(rel),
                ma.len(),
                mb.len()
            ));
        }
    } else if t.is_dir() {
        let (na, nb) = (sorted_names(a), sorted_names(b));
        for n in nb.iter().filter(|n| !na.contains(n)) {
            out.push(format!("{}: extra at the destination", show(&rel.join(n))));
        }
        for n in &na {
            diff_at(&a.join(n), &b.join(n), &rel.join(n), cmp, false, out);
        }
    }
}

#[track_caller]
pub fn assert_same_tree(a: &Path, b: &Path, cmp: Compare) {
    let d = diff_trees(a, b, cmp);
    assert!(
        d.is_empty(),
        "{} differs from {} in {} way(s):\n  {}",
        b.display(),
        a.display(),
        d.len(),
        d.join("\n  ")
    );
}

/// Every path under `p` (recursive, not following links).
pub fn list_tree(p: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn walk(p: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let path = e.path();
                out.push(path.clone());
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    walk(&path, out);
                }
            }
        }
    }
    walk(p, &mut out);
    out.sort();
    out
}

/// Accessors into the `--json` report.
pub fn totals(j: &serde_json::Value, field: &str) -> u64 {
    j["totals"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("totals.{field} missing in {j:#}"))
}

pub fn files_by_path(
    j: &serde_json::Value,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    j["files"]
        .as_array()
        .unwrap_or_else(|| panic!("files[] missing in {j:#}"))
        .iter()
        .map(|f| (f["path"].as_str().unwrap().to_string(), f.clone()))
        .collect()
}

/// Distinct chunks a resume journal names (synced or written records; a
/// chunk may have both), 0 if there is no journal yet.
pub fn journaled_chunks(journal: &Path, chunks: u64) -> u64 {
    let Ok(f) = std::fs::File::open(journal) else {
        return 0;
    };
    match longhaul_transfer::journal::read(f, chunks) {
        Ok(Some(p)) => (p.synced.len() + p.written.len()) as u64,
        _ => 0,
    }
}

/// A UDP relay between a client and a server on loopback that can cut the
/// client off after its first flight (what it sent before the server's
/// first answer), send that flight again, or cut the path both ways (an
/// outage). Its answers go to the client address heard from last.
pub struct Relay {
    /// The address clients send to.
    pub front: SocketAddr,
    /// [`Relay::PASS`], [`Relay::FIRST_FLIGHT`] or [`Relay::CUT`].
    mode: Arc<AtomicU8>,
    /// The server has answered since the mode was set.
    answered: Arc<AtomicBool>,
    /// The client datagrams of the first flight since the mode was set.
    flight: Arc<Mutex<Vec<Vec<u8>>>>,
    back: Arc<UdpSocket>,
}

impl Relay {
    /// Relay everything.
    pub const PASS: u8 = 0;
    /// Relay only each connection's first flight.
    pub const FIRST_FLIGHT: u8 = 1;
    /// Relay nothing, either way: the link is down.
    pub const CUT: u8 = 2;

    /// A relay to `server`.
    pub fn start(server: SocketAddr) -> Relay {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let back = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        back.connect(server).unwrap();
        let client: Arc<Mutex<Option<SocketAddr>>> = Default::default();
        let mode = Arc::new(AtomicU8::new(0));
        let answered = Arc::new(AtomicBool::new(false));
        let flight: Arc<Mutex<Vec<Vec<u8>>>> = Default::default();
        {
            let (front, back, client) = (front.clone(), back.clone(), client.clone());
            let (mode, answered, flight) = (mode.clone(), answered.clone(), flight.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while let Ok((n, from)) = front.recv_from(&mut buf) {
                    *client.lock().unwrap() = Some(from);
                    let m = mode.load(Ordering::SeqCst);
                    if m == Relay::CUT {
                        continue;
                    }
                    if !answered.load(Ordering::SeqCst) {
                        flight.lock().unwrap().push(buf[..n].to_vec());
                    } else if m == Relay::FIRST_FLIGHT {
                        continue;
                    }
                    let _ = back.send(&buf[..n]);
                }
            });
        }
        {
            let (front, back) = (front.clone(), back.clone());
            let (mode, answered, flight) = (mode.clone(), answered.clone(), flight.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = back.recv(&mut buf) {
                    if mode.load(Ordering::SeqCst) == Relay::CUT {
                        continue;
                    }
                    // An answer ends the first flight only once the flight
                    // has begun: a late retransmission of the server's to an
                    // earlier connection (a replayed flight it answered) is
                    // not an answer to the next client.
                    if !flight.lock().unwrap().is_empty() {
                        answered.store(true, Ordering::SeqCst);
                    }
                    if let Some(c) = *client.lock().unwrap() {
                        let _ = front.send_to(&buf[..n], c);
                    }
                }
            });
        }
        Relay {
            front: front.local_addr().unwrap(),
            mode,
            answered,
            flight,
            back,
        }
    }

    /// From now on: `mode`, and a new first flight to record.
    pub fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
        self.flight.lock().unwrap().clear();
        self.answered.store(false, Ordering::SeqCst);
    }

    /// Sends the recorded first flight to the server again, from the same
    /// address.
    pub fn replay(&self) -> usize {
        let flight = self.flight.lock().unwrap().clone();
        for d in &flight {
            self.back.send(d).unwrap();
        }
        flight.len()
    }
}

/// Runs rsync with `args`; its standard output (it must succeed).
pub fn rsync<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = Command::new("rsync")
        .args(args)
        .output()
        .expect("rsync runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `rsync -n FLAGS --numeric-ids SRC/ DST/` would change to make `dst`
/// like `src` (its itemized lines with `-i` among FLAGS; empty: the same
/// tree as rsync sees it).
pub fn rsync_changes(flags: &str, src: &Path, dst: &Path) -> String {
    rsync([
        OsString::from(flags),
        "--numeric-ids".into(),
        format!("{}/", src.display()).into(),
        format!("{}/", dst.display()).into(),
    ])
}
