//! Peer-tool adapters: how each real program is started in the server host
//! and driven from the client host (a pull: data flows server → client).
//! Each adapter only builds command lines and config files; the runner
//! spawns, times, stops and verifies.

use anyhow::{bail, Result};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

mod ftp;
mod gridftp;
pub(crate) use gridftp::ftp_uid;
mod iperf3;
mod longhaul;
mod longhaul_mc;
mod longhaul_ssh;
mod qcp;
mod rsync;
mod scp;
mod tarnc;
mod udt;
mod uftp;

/// What a peer-tool adapter knows: its name, what it is, the settings a
/// suite may give it, the programs and packages it needs, and how to run one
/// transfer (config files and command lines). Adding a tool is a file in
/// `tools/` and a line in [`ADAPTERS`].
pub trait Adapter: Sync {
    /// The tool's name, as suites, `--tools` and results.json write it.
    fn name(&self) -> &'static str;
    /// What it is, for reports.
    fn describe(&self) -> &'static str;
    /// The settings a suite may give it: (key, what it does, check).
    fn settings(&self) -> &'static [Setting] {
        &[]
    }
    /// Programs it needs (besides longhaul itself).
    fn programs(&self) -> &'static [&'static str] {
        &[]
    }
    /// Debian packages that provide them (or, for [`Adapter::sources`], the
    /// sources and the compiler).
    fn packages(&self) -> &'static [&'static str] {
        &[]
    }
    /// Programs Debian ships only as source, built into [`BUILT`] once the
    /// packages are installed.
    fn sources(&self) -> &'static [Source] {
        &[]
    }
    /// A program built from crates.io into [`BUILT`] by `lab deps` (`cargo
    /// install NAME --locked --version VERSION`): (NAME, VERSION).
    fn crate_install(&self) -> Option<(&'static str, &'static str)> {
        None
    }
    /// The command line that prints its version (first line kept); none
    /// for longhaul's own.
    fn version_command(&self) -> &'static [&'static str] {
        &[]
    }
    /// False for memory-to-memory tools: nothing to verify.
    fn moves_files(&self) -> bool {
        true
    }
    /// Sends one stream that every receiver takes (IP multicast).
    fn multicasts(&self) -> bool {
        false
    }
    /// Writes its config files under `s.run` and returns its command lines
    /// (`s.receivers` is not empty).
    fn commands(&self, s: &Setup) -> Result<Commands>;
    /// Commands run one after another once the daemons are ready and before
    /// the timed actors, not timed (their exit status is not looked at): a
    /// client that has been to the server before. None by default.
    fn warmups(&self, _s: &Setup) -> Vec<Proc> {
        Vec::new()
    }
    /// Whether receiver `i` says it has completed `files` files, for a tool
    /// whose receiver reports it (its run directory is `run`); None where the
    /// tree alone tells (every file there with every byte).
    fn receiver_says_done(&self, _run: &Path, _i: usize, _files: u64) -> Option<bool> {
        None
    }
    /// How it disseminates products as they are written (a `feed`
    /// scenario); None: it does not, and the run is skipped.
    fn feed(&self, _s: &FeedSetup) -> Result<Option<FeedCommands>> {
        Ok(None)
    }
}

/// What the runner gives a tool for a dissemination run.
pub struct FeedSetup<'a> {
    /// The longhaul executable.
    pub exe: &'a Path,
    /// A directory for config files, state and logs.
    pub run: &'a Path,
    /// Where products appear, each renamed in once written (and removed
    /// once older than the backlog and 30 s).
    pub spool: &'a Path,
    /// A directory for the tool's own outboxes ([`FeedCommands::outboxes`]).
    pub feed_dir: &'a Path,
    /// The server host's address in the lab.
    pub server: Ipv4Addr,
    /// Every receiver; products go to each one's `dst`.
    pub receivers: &'a [Receiver],
    /// The rate a push tool sends at, bit/s.
    pub rate_bps: u64,
    /// How long a receiver that was away may ask for what it missed.
    pub backlog: std::time::Duration,
    /// The longest receiver's round trip.
    pub rtt: std::time::Duration,
    /// The suite's settings for this tool.
    pub settings: &'a Settings,
}

/// How a tool runs a dissemination.
#[derive(Debug, Clone)]
pub struct FeedCommands {
    /// What runs in each receiver (one per receiver, in order): started
    /// when it joins, stopped and started again when it restarts.
    pub receivers: Vec<Daemon>,
    /// What runs in the server: each started with the run, or (`Some(i)`)
    /// when receiver i first starts.
    pub senders: Vec<(Option<usize>, Proc)>,
    /// Directories the producer hard-links every product into before it
    /// is ready in the spool (a loop's outgoing box): `(None, dir)` takes
    /// every product, `(Some(i), dir)` those ready once receiver i joined.
    pub outboxes: Vec<(Option<usize>, PathBuf)>,
}

/// Every tool the lab knows, in the order `--tools` lists them.
pub static ADAPTERS: [&dyn Adapter; 12] = [
    &longhaul::Longhaul,
    &longhaul_mc::LonghaulMc,
    &longhaul_ssh::LonghaulSsh,
    &rsync::Rsync,
    &ftp::Ftp,
    &gridftp::Gridftp,
    &tarnc::Tarnc,
    &scp::Scp,
    &qcp::Qcp,
    &uftp::Uftp,
    &udt::Udt,
    &iperf3::Iperf3,
];

/// Where the lab keeps the programs it builds from source ([`Adapter::sources`]);
/// [`which`] looks there too.
pub const BUILT: &str = "/usr/local/lib/longhaul-lab/bin";

/// What `cargo install --root` takes so that programs land in [`BUILT`].
fn built_root() -> &'static Path {
    Path::new(BUILT).parent().expect("BUILT is .../bin")
}

/// A program Debian ships as C++ source: built with `g++ FLAGS DIR/FILE -o
/// BUILT/PROGRAM LIBS`.
pub struct Source {
    /// The program's name in [`BUILT`].
    pub program: &'static str,
    /// Its source file, in `dir`.
    pub file: &'static str,
    /// The directory the package puts the source in.
    pub dir: &'static str,
    /// The Debian package that ships it.
    pub package: &'static str,
    /// Compiler flags.
    pub flags: &'static [&'static str],
    /// Libraries, after the source.
    pub libs: &'static [&'static str],
}

/// A tool: a handle on its adapter, compared and hashed by name.
#[derive(Clone, Copy)]
pub struct Tool(&'static dyn Adapter);

impl Tool {
    /// Every tool, as [`ADAPTERS`] lists them.
    pub fn all() -> Vec<Tool> {
        ADAPTERS.iter().map(|a| Tool(*a)).collect()
    }

    /// The adapter's name (`rsync`, `gridftp`, ...), as suites and `--tools` write it.
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// What the tool is, in a line ([`Adapter::describe`]).
    pub fn describe(self) -> &'static str {
        self.0.describe()
    }

    /// The settings a suite may give it: (key, what it does, check).
    pub fn settings(self) -> &'static [Setting] {
        self.0.settings()
    }

    /// Programs it needs, looked for on the PATH, in /usr/sbin, /sbin and [`BUILT`] (besides
    /// longhaul itself).
    pub fn programs(self) -> &'static [&'static str] {
        self.0.programs()
    }

    /// Debian packages that provide its programs.
    pub fn packages(self) -> &'static [&'static str] {
        self.0.packages()
    }

    /// Its programs Debian ships as source ([`Adapter::sources`]).
    pub fn sources(self) -> &'static [Source] {
        self.0.sources()
    }

    /// Programs not found on PATH.
    pub fn missing(self) -> Vec<&'static str> {
        self.programs()
            .iter()
            .copied()
            .filter(|p| which(p).is_none())
            .collect()
    }

    /// The command that installs it.
    pub fn install_hint(self) -> String {
        let apt = format!("apt-get install {}", self.packages().join(" "));
        if let Some(cmd) = self.cargo_command() {
            format!("longhaul lab deps --tools {} ({apt}; {cmd})", self.name())
        } else if self.0.sources().is_empty() {
            apt
        } else {
            format!("{apt}, then longhaul lab deps --tools {}", self.name())
        }
    }

    /// The `cargo install` that builds its program into [`BUILT`], for a
    /// tool built from crates.io.
    pub fn cargo_command(self) -> Option<String> {
        let (name, version) = self.0.crate_install()?;
        Some(format!(
            "cargo install {name} --locked --version {version} --root {}",
            built_root().display()
        ))
    }

    /// Builds the programs of [`Adapter::sources`] that are missing, where
    /// their sources are installed; says which it built. Fails with the
    /// compiler's message.
    pub fn build_missing(self) -> Result<Vec<&'static str>> {
        let mut built = Vec::new();
        if let Some((name, version)) = self.0.crate_install() {
            if which(name).is_none() {
                eprintln!("building {name} {version} from crates.io (cargo install; minutes) ...");
                let ok = std::process::Command::new("cargo")
                    .args(["install", name, "--locked", "--version", version, "--root"])
                    .arg(built_root())
                    .status()
                    .map_err(|e| {
                        anyhow::anyhow!("cargo install {name}: {e} (is cargo installed?)")
                    })?
                    .success();
                if !ok {
                    bail!("cargo install {name} --locked --version {version} failed (its output is above)");
                }
                built.push(name);
            }
        }
        for src in self.0.sources() {
            let file = Path::new(src.dir).join(src.file);
            if which(src.program).is_some() {
                continue;
            }
            if !file.exists() {
                let installed = std::process::Command::new("dpkg")
                    .args(["-s", src.package])
                    .output()
                    .is_ok_and(|o| o.status.success());
                if installed {
                    bail!(
                        "{} is installed but {} is not there (does a dpkg path-exclude leave out /usr/share/doc?)",
                        src.package,
                        file.display()
                    );
                }
                continue; // reported as missing, with the install command
            }
            std::fs::create_dir_all(BUILT)?;
            let out = Path::new(BUILT).join(src.program);
            // Built under a temporary name of this process's, so a
            // half-written program is never found and two labs do not race.
            let tmp = out.with_extension(format!("tmp{}", std::process::id()));
            let res = std::process::Command::new("g++")
                .args(src.flags)
                .arg(&file)
                .arg("-o")
                .arg(&tmp)
                .args(src.libs)
                .output();
            match res {
                Ok(o) if o.status.success() => std::fs::rename(&tmp, &out)?,
                Ok(o) => {
                    let _ = std::fs::remove_file(&tmp);
                    bail!(
                        "building {} from {}: g++ failed: {}",
                        src.program,
                        file.display(),
                        String::from_utf8_lossy(&o.stderr).trim()
                    )
                }
                Err(e) => bail!("building {}: g++: {e}", src.program),
            }
            built.push(src.program);
        }
        Ok(built)
    }

    /// False for memory-to-memory tools (iperf3): nothing lands at the receivers, so
    /// no first byte is watched for and no tree is verified.
    pub fn moves_files(self) -> bool {
        self.0.moves_files()
    }

    /// Whether it sends one stream that every receiver takes (IP multicast).
    pub fn multicasts(self) -> bool {
        self.0.multicasts()
    }

    /// Whether receiver `i` reports `files` files complete (see
    /// [`Adapter::receiver_says_done`]); None where only the tree tells.
    pub fn receiver_says_done(self, run: &Path, i: usize, files: u64) -> Option<bool> {
        self.0.receiver_says_done(run, i, files)
    }

    /// The command line that prints its version (the runner keeps the first line);
    /// empty for longhaul, whose executable is asked with `--version`.
    pub fn version_command(self) -> Vec<&'static str> {
        self.0.version_command().to_vec()
    }

    /// Writes its config files under `s.run` and returns its command lines.
    pub fn commands(self, s: &Setup) -> Result<Commands> {
        if s.receivers.is_empty() {
            bail!("no receivers");
        }
        self.0.commands(s)
    }

    /// See [`Adapter::feed`].
    pub fn feed(self, s: &FeedSetup) -> Result<Option<FeedCommands>> {
        self.0.feed(s)
    }

    /// See [`Adapter::warmups`].
    pub fn warmups(self, s: &Setup) -> Vec<Proc> {
        self.0.warmups(s)
    }
}

impl PartialEq for Tool {
    fn eq(&self, other: &Tool) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Tool {}

impl std::hash::Hash for Tool {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.name().hash(h)
    }
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Tool {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Tool> {
        Tool::all()
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = ADAPTERS.iter().map(|a| a.name()).collect();
                anyhow::anyhow!("unknown tool '{s}' (known: {})", known.join(", "))
            })
    }
}

/// Settings of one tool (key → value), as a suite writes them.
pub type Settings = std::collections::BTreeMap<String, String>;

/// A tool as a suite names it: `gridftp`, or with settings,
/// `gridftp:p=8,tcp-bs=4MB`. The whole string labels its runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The adapter.
    pub tool: Tool,
    /// Its settings, each checked by the adapter's [`Setting`] check.
    pub settings: Settings,
    /// `name`, or `name:key=value,...` with the settings in key order: what results and
    /// reports call its runs, so two variants of a tool stay apart.
    pub label: String,
}

impl std::str::FromStr for ToolSpec {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<ToolSpec> {
        let (name, rest) = s.split_once(':').unwrap_or((s, ""));
        let tool: Tool = name.trim().parse()?;
        let mut settings = Settings::new();
        for kv in rest.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, "yes"));
            let Some((_, what, check)) = tool.settings().iter().find(|(key, _, _)| *key == k)
            else {
                let known: Vec<&str> = tool.settings().iter().map(|x| x.0).collect();
                bail!(
                    "{}: no setting '{k}' ({})",
                    tool.name(),
                    if known.is_empty() {
                        "it has none".to_string()
                    } else {
                        format!("it has {}", known.join(", "))
                    }
                );
            };
            check(v).map_err(|e| anyhow::anyhow!("{}: {k}={v}: {e} ({what})", tool.name()))?;
            if settings.insert(k.to_string(), v.to_string()).is_some() {
                bail!("{}: {k} given twice", tool.name());
            }
        }
        let label = if settings.is_empty() {
            tool.name().to_string()
        } else {
            let kv: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{}:{}", tool.name(), kv.join(","))
        };
        Ok(ToolSpec {
            tool,
            settings,
            label,
        })
    }
}

type Check = fn(&str) -> Result<()>;

/// A setting a suite may give a tool: (key, what it does, its check).
pub type Setting = (&'static str, &'static str, Check);

fn count_1_to_16(v: &str) -> Result<()> {
    match v.parse::<u32>() {
        Ok(n) if (1..=16).contains(&n) => Ok(()),
        _ => bail!("a whole number from 1 to 16"),
    }
}

fn count_1_to_64(v: &str) -> Result<()> {
    match v.parse::<u32>() {
        Ok(n) if (1..=64).contains(&n) => Ok(()),
        _ => bail!("a whole number from 1 to 64"),
    }
}

fn yes_no(v: &str) -> Result<()> {
    match v {
        "yes" | "no" => Ok(()),
        _ => bail!("yes or no"),
    }
}

fn size(v: &str) -> Result<()> {
    match longhaul_transfer::units::parse_size(v)? {
        4096..=1_073_741_824 => Ok(()),
        _ => bail!("4KiB to 1GiB"),
    }
}

fn rate(v: &str) -> Result<()> {
    longhaul_netem::spec::parse_rate(v)
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!(e))
}

/// `longhaul get --cc`: checked by the CLI itself, which says what it takes;
/// here only the form, so a typo fails when the suite loads, not mid-run.
fn longhaul_cc(v: &str) -> Result<()> {
    let (name, arg) = v.split_once(':').unwrap_or((v, ""));
    match (name, arg) {
        ("wan" | "fair" | "bbr" | "cubic" | "reno", "") => Ok(()),
        ("wan" | "fixed", r) if !r.is_empty() => rate(r),
        _ => bail!("wan, wan:HINT, fair, bbr, cubic, reno or fixed:RATE"),
    }
}

/// Which way longhaul moves the data set.
fn get_or_put(v: &str) -> Result<()> {
    match v {
        "get" | "put" => Ok(()),
        _ => bail!("get or put"),
    }
}

/// A kernel TCP congestion control iperf3 may ask for (`-C`).
fn kernel_cc(v: &str) -> Result<()> {
    match v {
        "cubic" | "bbr" | "reno" => Ok(()),
        _ => bail!("cubic, bbr or reno"),
    }
}

/// A setting's value, or the default.
fn get<'a>(s: &'a Settings, k: &str, default: &'a str) -> &'a str {
    s.get(k).map_or(default, |v| v.as_str())
}

/// One receiving host.
#[derive(Debug, Clone)]
pub struct Receiver {
    /// Its address in the lab.
    pub addr: Ipv4Addr,
    /// An empty directory the transfer fills.
    pub dst: PathBuf,
}

/// What the runner needs to set a tool up.
pub struct Setup<'a> {
    /// The longhaul executable.
    pub exe: &'a Path,
    /// The data set (in the server host's view; hosts share the file system).
    pub src: &'a Path,
    /// A directory for config files, state and logs.
    pub run: &'a Path,
    /// The server host's address in the lab.
    pub server: Ipv4Addr,
    /// One or more; every one gets the whole data set.
    pub receivers: &'a [Receiver],
    /// Bytes of the data set (for memory-to-memory tools).
    pub bytes: u64,
    /// The path's line rate, for tools that send at a set rate (UFTP).
    pub line_rate_bps: u64,
    /// The longest receiver's round trip, for tools that must be told (UFTP).
    pub rtt: std::time::Duration,
    /// The links' MTU, for tools that must be told to use a larger one.
    pub mtu: usize,
    /// The kernel TCP congestion control the suite gives the hosts, for a
    /// tool with its own (qcp) to follow.
    pub kernel_cc: Option<&'a str>,
    /// The suite's settings for this tool (checked by `ToolSpec`).
    pub settings: &'a Settings,
}

/// Which host a process runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// The server host (`srv`, at the emulator's hub).
    Server,
    /// Receiver i (0-based).
    Receiver(usize),
}

/// One process to start.
#[derive(Debug, Clone)]
pub struct Proc {
    /// The host whose network namespace it runs in.
    pub host: Host,
    /// Program and arguments, run with `ip netns exec` in that host.
    pub argv: Vec<String>,
    /// Its working directory (default: the runner's).
    pub cwd: Option<PathBuf>,
}

/// A process that serves until it is stopped; ready when `port` is bound
/// in its host (TCP: listening).
#[derive(Debug, Clone)]
pub struct Daemon {
    /// The process to start.
    pub proc: Proc,
    /// The port whose binding in its host says it is ready, and its protocol.
    pub ready: (Proto, u16),
}

/// How to run one transfer: start the daemons, wait until each is ready,
/// then time the actors from their start until the last one exits.
#[derive(Debug, Clone)]
pub struct Commands {
    /// Started first, one by one, each awaited until it is ready; stopped after the
    /// actors.
    pub daemons: Vec<Daemon>,
    /// Started together once the daemons are ready; the run is timed until the last
    /// one exits.
    pub actors: Vec<Proc>,
}

/// The transport protocol of a daemon's ready port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// TCP: ready once a socket listens on the port.
    Tcp,
    /// UDP: ready once a socket is bound to the port.
    Udp,
}

impl Setup<'_> {
    /// A daemon in the server host, ready once `port` is bound.
    fn server_daemon(&self, argv: Vec<String>, proto: Proto, port: u16) -> Daemon {
        Daemon {
            proc: Proc {
                host: Host::Server,
                argv,
                cwd: None,
            },
            ready: (proto, port),
        }
    }

    /// One client process per receiver.
    fn per_receiver(&self, f: &dyn Fn(usize, &Receiver) -> Vec<String>) -> Vec<Proc> {
        per_receiver(self.receivers, f)
    }

    /// Push tools: a daemon in every receiver, ready once UDP `port` is bound.
    fn receiver_daemons(
        &self,
        port: u16,
        f: &dyn Fn(usize, &Receiver) -> Vec<String>,
    ) -> Vec<Daemon> {
        receiver_daemons(self.receivers, port, f)
    }

    /// Push tools send at a set rate: the suite's, or 90% of the line rate.
    fn push_rate(&self) -> Result<u64> {
        match self.settings.get("rate") {
            Some(r) => longhaul_netem::spec::parse_rate(r).map_err(|e| anyhow::anyhow!(e)),
            None => Ok(self.line_rate_bps / 10 * 9),
        }
    }
}

/// A path as an argument.
fn p(p: &Path) -> String {
    p.display().to_string()
}

/// Arguments as owned strings.
fn v(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|x| x.to_string()).collect()
}

/// Every file of the data set at `src` (regular files and symlinks), as
/// paths relative to it, sorted: for tools that are given the files to fetch.
/// Names with white space are refused (the lists are split on it).
fn file_names(src: &Path) -> Result<Vec<String>> {
    let mut entries = Vec::new();
    crate::dataset::walk(src, src, &mut entries)?;
    let mut names = Vec::new();
    for (f, _) in entries {
        let name = f.to_string_lossy().into_owned();
        if name.contains(char::is_whitespace) {
            bail!("a file name with white space: {name:?}");
        }
        names.push(name);
    }
    names.sort();
    Ok(names)
}

/// The names in `dir`, sorted.
fn top_level(dir: &Path) -> Result<Vec<String>> {
    let mut names = std::fs::read_dir(dir)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<Vec<_>>>()?;
    names.sort();
    if names.is_empty() {
        bail!("{} is empty", dir.display());
    }
    Ok(names)
}

/// The path of `prog` on PATH.
pub fn which(prog: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into(), BUILT.into()])
        .map(|d| d.join(prog))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Single-quotes `s` for sh.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// One process in each receiver.
fn per_receiver(receivers: &[Receiver], f: &dyn Fn(usize, &Receiver) -> Vec<String>) -> Vec<Proc> {
    receivers
        .iter()
        .enumerate()
        .map(|(i, r)| Proc {
            host: Host::Receiver(i),
            argv: f(i, r),
            cwd: None,
        })
        .collect()
}

/// A daemon in every receiver, ready once UDP `port` is bound.
fn receiver_daemons(
    receivers: &[Receiver],
    port: u16,
    f: &dyn Fn(usize, &Receiver) -> Vec<String>,
) -> Vec<Daemon> {
    per_receiver(receivers, f)
        .into_iter()
        .map(|proc| Daemon {
            proc,
            ready: (Proto::Udp, port),
        })
        .collect()
}

/// A loop that sends what arrives in `outbox`: each turn moves what is
/// there into `batch` (a product is whole once linked there) and runs
/// `argv` in `batch` (followed, with `all`, by the batch's names: the
/// shell's `./*`), its output appended to `log`; `keep_failed` keeps a
/// batch whose send failed for the next turn (a unicast put), else it is
/// dropped (a UFTP session that ended is over). The script is written to
/// `script`; the process runs `sh` on it.
fn send_loop(
    script: &Path,
    outbox: &Path,
    batch: &Path,
    (argv, all): (&[String], bool),
    log: &Path,
    keep_failed: bool,
) -> Result<Proc> {
    // (The batch's names are the producer's, none with a quote or a
    // leading dash.)
    let mut send: Vec<String> = argv.iter().map(|a| sh_quote(a)).collect();
    if all {
        send.push("./*".into());
    }
    let send = format!("{} >> {} 2>&1", send.join(" "), sh_quote(&p(log)));
    let on_fail = if keep_failed {
        "sleep 1"
    } else {
        "rm -f -- ./*"
    };
    let text = format!(
        "# A sender's loop over its outgoing box (written by the lab).\n\
         set -u\n\
         O={o}\nB={b}\n\
         mkdir -p \"$B\"\n\
         cd \"$B\" || exit 1\n\
         while :; do\n\
         \x20   find \"$O\" -maxdepth 1 -type f ! -name '.*' -exec mv -t \"$B\" {{}} +\n\
         \x20   if [ -z \"$(ls -A)\" ]; then sleep 0.2; continue; fi\n\
         \x20   if {send}; then rm -f -- ./*; else {on_fail}; fi\n\
         done\n",
        o = sh_quote(&p(outbox)),
        b = sh_quote(&p(batch)),
    );
    std::fs::write(script, text)?;
    Ok(Proc {
        host: Host::Server,
        argv: v(&["sh", &p(script)]),
        cwd: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_adapter_has_a_name_of_its_own_and_a_description() {
        let mut names: Vec<&str> = ADAPTERS.iter().map(|a| a.name()).collect();
        assert!(ADAPTERS.iter().all(|a| !a.describe().is_empty()));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ADAPTERS.len(), "{names:?}");
    }

    #[test]
    fn names_round_trip_and_unknown_tools_are_refused() {
        for t in Tool::all() {
            assert_eq!(t.name().parse::<Tool>().unwrap(), t);
        }
        let e = "scp2".parse::<Tool>().unwrap_err().to_string();
        assert!(
            e.contains("unknown tool 'scp2'") && e.contains("rsync"),
            "{e}"
        );
    }

    /// A setup at 1 Gbit/s with the server at 10.77.0.1.
    fn setup<'a>(
        src: &'a Path,
        run: &'a Path,
        receivers: &'a [Receiver],
        settings: &'a Settings,
    ) -> Setup<'a> {
        Setup {
            exe: Path::new("/x/longhaul"),
            src,
            run,
            server: Ipv4Addr::new(10, 77, 0, 1),
            receivers,
            bytes: 1,
            line_rate_bps: 1_000_000_000,
            rtt: std::time::Duration::ZERO,
            mtu: 1500,
            kernel_cc: None,
            settings,
        }
    }

    /// The first client command `tool` runs for one receiver, as Debug text.
    fn first_client(tool: Tool, settings: &Settings) -> String {
        let t = tempfile::tempdir().unwrap();
        let rx = [Receiver {
            addr: Ipv4Addr::new(10, 77, 0, 2),
            dst: PathBuf::from("/d"),
        }];
        let s = setup(t.path(), t.path(), &rx, settings);
        format!("{:?}", tool.commands(&s).unwrap().actors[0].argv)
    }

    #[test]
    fn settings_are_checked_and_reach_the_command() {
        let spec: ToolSpec = "gridftp:tcp-bs=4MB,p=8,pp=no".parse().unwrap();
        assert_eq!(spec.tool, "gridftp".parse::<Tool>().unwrap());
        assert_eq!(format!("{:?}", spec.tool), "gridftp");
        assert_eq!(spec.label, "gridftp:p=8,pp=no,tcp-bs=4MB");
        let plain: ToolSpec = "rsync".parse().unwrap();
        assert_eq!((plain.label.as_str(), plain.settings.len()), ("rsync", 0));
        let err = |s: &str| s.parse::<ToolSpec>().unwrap_err().to_string();
        assert!(err("gridftp:p=0").contains("p=0: a whole number from 1 to 64"));
        assert!(err("gridftp:q=1")
            .contains("no setting 'q' (it has p, cc, pp, fast, udt, tcp-bs, rst)"));
        assert!(err("rsync:p=1").contains("no setting 'p' (it has ssh)"));
        assert!(err("tarnc:p=1").contains("it has none"));
        assert!(err("gridftp:p=2,p=3").contains("given twice"));
        assert!(err("uftp:rate=fast").contains("rate=fast"));
        let setup = |settings: &Settings| first_client(spec.tool, settings);
        let argv = setup(&spec.settings);
        assert!(
            argv.contains("\"-fast\", \"-cc\", \"4\", \"-p\", \"8\", \"-tcp-bs\", \"4000000\""),
            "{argv}"
        );
        assert!(!argv.contains("-pp"), "{argv}");
        let argv = setup(&Settings::new());
        assert!(
            argv.contains("\"-fast\", \"-pp\", \"-cc\", \"4\", \"-p\", \"4\", \"-r\""),
            "{argv}"
        );
        assert!(!argv.contains("-rst"), "{argv}");
        // rst=yes: restarts what fails.
        let rst: ToolSpec = "gridftp:rst=yes".parse().unwrap();
        let argv = setup(&rst.settings);
        assert!(
            argv.contains("\"-p\", \"4\", \"-rst\", \"-rst-retries\", \"0\", \"-rst-interval\", \"2\", \"-rst-timeout\", \"900\", \"-r\""),
            "{argv}"
        );
        assert!(err("gridftp:rst=maybe").contains("rst=maybe"));
    }

    #[test]
    fn qcp_is_told_the_path_and_fetches_each_top_level_entry() {
        let qcp: Tool = "qcp".parse().unwrap();
        assert!(qcp.install_hint().contains(
            "cargo install qcp --locked --version 0.9.1 --root /usr/local/lib/longhaul-lab"
        ));
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("g0")).unwrap();
        std::fs::write(src.join("top.bin"), b"x").unwrap();
        let rx = [Receiver {
            addr: Ipv4Addr::new(10, 77, 0, 2),
            dst: PathBuf::from("/d"),
        }];
        let settings = Settings::new();
        let mut s = setup(&src, t.path(), &rx, &settings);
        s.rtt = std::time::Duration::from_millis(70);
        let c = qcp.commands(&s).unwrap();
        assert_eq!(c.daemons.len(), 1, "sshd in the server host");
        let argv = c.actors[0].argv.join(" ");
        let src = src.display();
        assert!(
            argv.contains(&format!(
                " -q -r --rx 125000000 --rtt 70 --congestion cubic --ssh {}/qcp-ssh --remote-qcp-binary ",
                t.path().display()
            )) && argv.ends_with(&format!(
                " root@10.77.0.1:{src}/g0 root@10.77.0.1:{src}/top.bin /d/"
            )),
            "{argv}"
        );
        assert!(!argv.contains("--max-mtu"), "{argv}");
        assert!(argv.contains(" --congestion cubic "), "{argv}");
        s.kernel_cc = Some("bbr");
        let argv = qcp.commands(&s).unwrap().actors[0].argv.join(" ");
        assert!(argv.contains(" --congestion bbr "), "{argv}");
        let reno: Settings = [("cc".to_string(), "newreno".to_string())].into();
        s.settings = &reno;
        let argv = qcp.commands(&s).unwrap().actors[0].argv.join(" ");
        assert!(argv.contains(" --congestion newreno "), "{argv}");
        let wrapper = std::fs::read_to_string(t.path().join("qcp-ssh")).unwrap();
        assert!(
            wrapper.starts_with("#!/bin/sh\nexec ssh '-i' ") && wrapper.ends_with(" \"$@\"\n"),
            "{wrapper}"
        );
        s.mtu = 9000;
        let argv = qcp.commands(&s).unwrap().actors[0].argv.join(" ");
        assert!(argv.contains(" --max-mtu 8972 "), "{argv}");
    }

    #[test]
    fn gridftp_over_udt_is_a_third_party_transfer_between_gsi_servers() {
        let spec: ToolSpec = "gridftp:udt=yes,cc=2".parse().unwrap();
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("a"), b"1").unwrap();
        std::fs::write(src.join("sub/b"), b"2").unwrap();
        let rx = [Receiver {
            addr: Ipv4Addr::new(10, 77, 0, 2),
            dst: t.path().join("dst"),
        }];
        std::fs::create_dir_all(&rx[0].dst).unwrap();
        // Extended block mode does not run over UDT (refused before any
        // certificate is made).
        let p2: ToolSpec = "gridftp:udt=yes,p=2".parse().unwrap();
        let s = setup(&src, t.path(), &rx, &p2.settings);
        let e = p2.tool.commands(&s).unwrap_err().to_string();
        assert!(e.contains("p= does not apply with udt=yes"), "{e}");
        let s = setup(&src, t.path(), &rx, &spec.settings);
        let c = match spec.tool.commands(&s) {
            Ok(c) => c,
            // Certificates need openssl, and the mapping the GridFTP
            // packages' `ftp` user.
            Err(e) if std::env::var_os("LONGHAUL_REQUIRE_LAB").is_none() => {
                eprintln!("SKIP: {e:#}");
                return;
            }
            Err(e) => panic!("{e:#}"),
        };
        // A server in the server host and one in the receiver, both GSI
        // with UDT data channels.
        assert_eq!(c.daemons.len(), 2);
        assert_eq!(c.daemons[1].proc.host, Host::Receiver(0));
        for d in &c.daemons {
            let a = format!("{:?}", d.proc.argv);
            assert!(a.contains(r#""-dc-default", "udt""#), "{a}");
            assert!(
                a.contains("X509_USER_CERT=") && a.contains("GRIDMAP="),
                "{a}"
            );
            assert!(!a.contains("-aa"), "{a}");
        }
        let a = format!("{:?}", c.actors[0].argv);
        assert!(a.contains(r#""globus-url-copy", "-cc", "2", "-ss""#), "{a}");
        assert!(!a.contains("-fast") && !a.contains("\"-p\""), "{a}");
        let list = std::fs::read_to_string(t.path().join("gsiftp-urls-0.txt")).unwrap();
        let (s0, d0) = (src.display(), rx[0].dst.display());
        assert_eq!(
            list,
            format!(
                "gsiftp://10.77.0.1:2811{s0}/a gsiftp://10.77.0.2:2811{d0}/a\n\
                 gsiftp://10.77.0.1:2811{s0}/sub/b gsiftp://10.77.0.2:2811{d0}/sub/b\n"
            )
        );
    }

    #[test]
    fn congestion_control_settings_reach_longhaul_and_iperf3() {
        let err = |s: &str| s.parse::<ToolSpec>().unwrap_err().to_string();
        assert!(err("longhaul:cc=vegas").contains("wan, wan:HINT, fair, bbr"));
        assert!(err("longhaul:cc=wan:fast").contains("cc=wan:fast"));
        assert!(err("iperf3:cc=vegas").contains("cubic, bbr or reno"));
        let argv = |spec: &str| {
            let spec: ToolSpec = spec.parse().unwrap();
            first_client(spec.tool, &spec.settings)
        };
        let a = argv("longhaul:cc=wan:1G,max-rate=900M");
        assert!(
            a.ends_with(r#""--cc", "wan:1G", "--max-rate", "900M", "10.77.0.1:./", "/d"]"#),
            "{a}"
        );
        assert!(!argv("longhaul").contains("--cc"));
        let a = argv("longhaul:cc=wan:1G,window=1G");
        assert!(
            a.ends_with(r#""--cc", "wan:1G", "--window", "1G", "10.77.0.1:./", "/d"]"#),
            "{a}"
        );
        assert!(err("longhaul:window=lots").contains("window=lots"));
        assert!(err("longhaul:op=push").contains("op=push: get or put"));
        assert!(argv("iperf3:cc=bbr").ends_with(r#""-C", "bbr"]"#));
        assert!(!argv("iperf3").contains("-C"));
    }

    #[test]
    fn quoting_keeps_awkward_paths_whole() {
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("printf %s {}", sh_quote("a b'c$d"))])
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"a b'c$d");
    }

    #[test]
    fn commands_point_at_the_server_and_every_receiver() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("g0")).unwrap();
        std::fs::write(src.join("top.bin"), b"x").unwrap();
        let rx = |i: u8| Receiver {
            addr: Ipv4Addr::new(10, 77, 0, 2 + i),
            dst: PathBuf::from(format!("/data/dst-{i}")),
        };
        for n in [1u8, 2] {
            let receivers: Vec<Receiver> = (0..n).map(rx).collect();
            let s = Setup {
                exe: Path::new("/x/longhaul"),
                src: &src,
                run: t.path(),
                server: Ipv4Addr::new(10, 77, 0, 1),
                receivers: &receivers,
                bytes: 1000,
                line_rate_bps: 1_000_000_000,
                rtt: std::time::Duration::from_millis(70),
                mtu: 1500,
                kernel_cc: None,
                settings: &Settings::new(),
            };
            for tool in Tool::all() {
                let c = tool.commands(&s).unwrap();
                let all = format!("{:?} {:?}", c.daemons, c.actors);
                // Pulls name the server; UFTP pushes from it.
                assert_eq!(
                    all.contains("10.77.0.1"),
                    !tool.multicasts(),
                    "{tool:?}: {all}"
                );
                let hosts: Vec<Host> = c
                    .daemons
                    .iter()
                    .map(|d| d.proc.host)
                    .chain(c.actors.iter().map(|a| a.host))
                    .collect();
                for (i, r) in receivers.iter().enumerate() {
                    // Every receiver runs something and, for file tools, gets its own directory.
                    assert!(hosts.contains(&Host::Receiver(i)), "{tool:?}: {all}");
                    if tool.moves_files() {
                        assert!(
                            all.contains(&r.dst.display().to_string()),
                            "{tool:?}: {all}"
                        );
                    }
                }
                if tool.name() == "longhaul-mc" {
                    assert_eq!(c.actors.len(), 1, "one sender");
                    let ids = if n == 1 { "rx0" } else { "rx0,rx1" };
                    assert!(
                        all.contains(&format!("\"--receivers\", \"{ids}\"")),
                        "{all}"
                    );
                    assert!(all.contains("\"239.7.7.7:7000\"") && all.contains("\"900000000\""));
                    assert!(all.contains(&format!("\"{}/\"", src.display())), "{all}");
                } else if tool.multicasts() {
                    assert_eq!(c.actors.len(), 1, "one sender");
                    assert_eq!(all.contains("230.4.4.1"), n > 1, "{all}");
                    assert!(
                        all.contains("0x0A4D0002") && all.contains("\"900000\""),
                        "{all}"
                    );
                    assert!(all.contains("\"0.105:0.001:15\""), "{all}");
                    assert!(all.contains("\"g0\", \"top.bin\""), "{all}");
                } else {
                    assert_eq!(
                        c.actors.len(),
                        n as usize,
                        "{tool:?}: one client per receiver"
                    );
                }
                // Listeners that serve one client each need a port each.
                for (k, d) in c.daemons.iter().enumerate() {
                    let clash = c.daemons[..k]
                        .iter()
                        .any(|e| e.proc.host == d.proc.host && e.ready.1 == d.ready.1);
                    assert!(!clash, "{tool:?}: {all}");
                }
            }
        }
        let conf = std::fs::read_to_string(t.path().join("rsyncd.conf")).unwrap();
        assert!(
            conf.contains(&format!("path = {}", src.display())) && conf.contains("read only = yes")
        );
        let conf = std::fs::read_to_string(t.path().join("vsftpd.conf")).unwrap();
        assert!(conf.contains("anon_root=") && conf.contains("write_enable=NO"));
    }

    #[test]
    fn longhaul_puts_from_the_data_to_a_server_in_every_receiver() {
        let t = tempfile::tempdir().unwrap();
        let rx = [
            Receiver {
                addr: Ipv4Addr::new(10, 77, 0, 2),
                dst: PathBuf::from("/d0"),
            },
            Receiver {
                addr: Ipv4Addr::new(10, 77, 0, 3),
                dst: PathBuf::from("/d1"),
            },
        ];
        let spec: ToolSpec = "longhaul:op=put,cc=fair".parse().unwrap();
        let s = setup(Path::new("/data"), t.path(), &rx, &spec.settings);
        let c = spec.tool.commands(&s).unwrap();
        let daemons: Vec<_> = c.daemons.iter().map(|d| (d.proc.host, d.ready)).collect();
        assert_eq!(
            daemons,
            [
                (Host::Receiver(0), (Proto::Udp, 7878)),
                (Host::Receiver(1), (Proto::Udp, 7878))
            ]
        );
        let serve = format!("{:?}", c.daemons[1].proc.argv);
        assert!(
            serve.contains(r#""serve", "--root", "/d1", "--listen", "10.77.0.3:7878""#),
            "{serve}"
        );
        assert!(!serve.contains("--read-only"), "{serve}");
        assert_eq!(c.actors.len(), 2);
        assert!(c.actors.iter().all(|a| a.host == Host::Server));
        let put = format!("{:?}", c.actors[1].argv);
        assert!(
            put.contains(r#""/x/longhaul", "put", "--accept-new""#),
            "{put}"
        );
        assert!(
            put.ends_with(r#""--no-rates", "--cc", "fair", "/data/", "10.77.0.3:./"]"#),
            "{put}"
        );
    }
}
