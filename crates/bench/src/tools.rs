//! Peer-tool adapters: how each real program is started in the server host
//! and driven from the client host (a pull: data flows server → client).
//! Each adapter only builds command lines and config files; the runner
//! spawns, times, stops and verifies.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Longhaul,
    /// longhaul multicast send / receive.
    LonghaulMc,
    Rsync,
    Ftp,
    Gridftp,
    Tarnc,
    Scp,
    Uftp,
    Iperf3,
}

impl std::str::FromStr for Tool {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Tool> {
        Tool::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown tool '{s}' (known: {})",
                    Tool::ALL.map(|t| t.name()).join(", ")
                )
            })
    }
}

/// Settings of one tool (key → value), as a suite writes them.
pub type Settings = std::collections::BTreeMap<String, String>;

/// A tool as a suite names it: `gridftp`, or with settings,
/// `gridftp:p=8,tcp-bs=4MB`. The whole string labels its runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub tool: Tool,
    pub settings: Settings,
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

/// `longhaul get|put` up to its paths: trust on first use, quiet, cold, and
/// the tool's settings.
fn longhaul_client(exe: &str, op: &str, known_hosts: &Path, settings: &Settings) -> Vec<String> {
    let mut argv: Vec<String> = [
        exe,
        op,
        "--accept-new",
        "--known-hosts",
        &known_hosts.display().to_string(),
        "--quiet",
        // Every run starts cold: no rate remembered from the runs before it
        // (on other paths).
        "--no-rates",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    for k in ["cc", "max-rate", "window"] {
        if let Some(x) = settings.get(k) {
            argv.extend([format!("--{k}"), x.clone()]);
        }
    }
    argv
}

/// A setting's value, or the default.
fn get<'a>(s: &'a Settings, k: &str, default: &'a str) -> &'a str {
    s.get(k).map_or(default, |v| v.as_str())
}

/// One receiving host.
#[derive(Debug, Clone)]
pub struct Receiver {
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
    pub server: Ipv4Addr,
    /// One or more; every one gets the whole data set.
    pub receivers: &'a [Receiver],
    /// Bytes of the data set (for memory-to-memory tools).
    pub bytes: u64,
    /// The path's line rate, for tools that send at a set rate (UFTP).
    pub line_rate_bps: u64,
    /// The longest receiver's round trip, for tools that must be told (UFTP).
    pub rtt: std::time::Duration,
    /// The suite's settings for this tool (checked by `ToolSpec`).
    pub settings: &'a Settings,
}

/// Which host a process runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Server,
    /// Receiver i (0-based).
    Receiver(usize),
}

/// One process to start.
#[derive(Debug, Clone)]
pub struct Proc {
    pub host: Host,
    pub argv: Vec<String>,
    /// Its working directory (default: the runner's).
    pub cwd: Option<PathBuf>,
}

/// A process that serves until it is stopped; ready when `port` is bound
/// in its host (TCP: listening).
#[derive(Debug, Clone)]
pub struct Daemon {
    pub proc: Proc,
    pub ready: (Proto, u16),
}

/// How to run one transfer: start the daemons, wait until each is ready,
/// then time the actors from their start until the last one exits.
#[derive(Debug, Clone)]
pub struct Commands {
    pub daemons: Vec<Daemon>,
    pub actors: Vec<Proc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

/// The group and port longhaul multicast uses in the lab.
const LONGHAUL_GROUP: &str = "239.7.7.7";
const LONGHAUL_PORT: u16 = 7000;

/// The multicast group UFTP announces on and the one its data goes to.
const UFTP_PUBLIC: &str = "230.4.4.1";
const UFTP_PRIVATE: &str = "230.5.5.1";

impl Tool {
    pub const ALL: [Tool; 9] = [
        Tool::Longhaul,
        Tool::LonghaulMc,
        Tool::Rsync,
        Tool::Ftp,
        Tool::Gridftp,
        Tool::Tarnc,
        Tool::Scp,
        Tool::Uftp,
        Tool::Iperf3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tool::Longhaul => "longhaul",
            Tool::LonghaulMc => "longhaul-mc",
            Tool::Rsync => "rsync",
            Tool::Ftp => "ftp",
            Tool::Gridftp => "gridftp",
            Tool::Tarnc => "tarnc",
            Tool::Scp => "scp",
            Tool::Uftp => "uftp",
            Tool::Iperf3 => "iperf3",
        }
    }

    /// What it is, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Tool::Longhaul => {
                "longhaul serve + get (QUIC); one get per receiver (op=put: a serve in every receiver, a put to each)"
            }
            Tool::LonghaulMc => {
                "longhaul multicast send → receive (RaptorQ), closed group, at 90% of the line rate; IP multicast to every receiver"
            }
            Tool::Rsync => "rsync daemon, rsync -a",
            Tool::Ftp => "vsftpd (anonymous), lftp mirror --parallel=4 (MDTM off: one round trip less per file)",
            Tool::Gridftp => {
                "globus-gridftp-server (anonymous, no certificates), globus-url-copy -fast -pp -cc 4 -p 4 -r -cd"
            }
            Tool::Tarnc => "tar | nc, one TCP stream per receiver",
            Tool::Scp => "OpenSSH sshd + scp -r (SFTP protocol), key authentication",
            Tool::Uftp => {
                "uftp → uftpd at 90% of the line rate, closed group; multicast to several receivers, unicast to one"
            }
            Tool::Iperf3 => "iperf3 -R -n BYTES, memory to memory (ceiling)",
        }
    }

    /// The settings a suite may give it: (key, what it does, check).
    pub fn settings(self) -> &'static [(&'static str, &'static str, Check)] {
        match self {
            Tool::Ftp => &[("parallel", "lftp mirror --parallel, default 4", count_1_to_64)],
            Tool::Gridftp => &[
                ("p", "globus-url-copy -p: TCP streams per file, default 4", count_1_to_64),
                ("cc", "globus-url-copy -cc: files at once, default 4", count_1_to_64),
                ("pp", "globus-url-copy -pp: pipelining, default yes", yes_no),
                ("fast", "globus-url-copy -fast: reuse data channels, default yes", yes_no),
                (
                    "tcp-bs",
                    "globus-url-copy -tcp-bs: socket buffer size (capped by the host's net.core.rmem_max), default none",
                    size,
                ),
            ],
            Tool::Uftp => &[("rate", "uftp -R: sending rate, default 90% of the line rate", rate)],
            Tool::LonghaulMc => &[(
                "rate",
                "longhaul multicast send --rate, default 90% of the line rate",
                rate,
            )],
            Tool::Iperf3 => &[
                ("streams", "iperf3 -P: parallel streams, default 1", count_1_to_64),
                (
                    "cc",
                    "iperf3 -C: the sender's TCP congestion control, default the suite's (or the kernel's)",
                    kernel_cc,
                ),
            ],
            Tool::Longhaul => &[
                (
                    "op",
                    "get (default: a read-only server beside the data, a get per receiver) or put (a server in every receiver, a put to each from beside the data)",
                    get_or_put,
                ),
                (
                    "cc",
                    "longhaul --cc: the sender's congestion controller for the data, default longhaul's",
                    longhaul_cc,
                ),
                ("max-rate", "longhaul --max-rate: a rate cap and wan's start hint", rate),
                (
                    "window",
                    "longhaul --window: memory bound of the client's windows, default 1G (with op=put the receiving server keeps its own)",
                    size,
                ),
            ],
            _ => &[],
        }
    }

    /// Programs it needs (besides longhaul itself).
    pub fn programs(self) -> &'static [&'static str] {
        match self {
            Tool::Longhaul | Tool::LonghaulMc => &[],
            Tool::Rsync => &["rsync"],
            Tool::Ftp => &["vsftpd", "lftp"],
            Tool::Gridftp => &["globus-gridftp-server", "globus-url-copy"],
            Tool::Tarnc => &["tar", "nc"],
            Tool::Scp => &["sshd", "scp", "ssh-keygen"],
            Tool::Uftp => &["uftp", "uftpd"],
            Tool::Iperf3 => &["iperf3"],
        }
    }

    /// Debian packages that provide them.
    pub fn packages(self) -> &'static [&'static str] {
        match self {
            Tool::Longhaul | Tool::LonghaulMc => &[],
            Tool::Rsync => &["rsync"],
            Tool::Ftp => &["vsftpd", "lftp"],
            Tool::Gridftp => &["globus-gridftp-server-progs", "globus-gass-copy-progs"],
            Tool::Tarnc => &["tar", "netcat-openbsd"],
            Tool::Scp => &["openssh-server", "openssh-client"],
            Tool::Uftp => &["uftp"],
            Tool::Iperf3 => &["iperf3"],
        }
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
        format!("apt-get install {}", self.packages().join(" "))
    }

    /// False for memory-to-memory tools: nothing to verify.
    pub fn moves_files(self) -> bool {
        self != Tool::Iperf3
    }

    /// Sends one stream that every receiver takes (IP multicast).
    pub fn multicasts(self) -> bool {
        matches!(self, Tool::Uftp | Tool::LonghaulMc)
    }

    /// The command line that prints its version (first line kept).
    pub fn version_command(self) -> Vec<&'static str> {
        match self {
            Tool::Longhaul | Tool::LonghaulMc => vec![],
            Tool::Rsync => vec!["rsync", "--version"],
            Tool::Ftp => vec!["lftp", "--version"],
            Tool::Gridftp => vec!["globus-url-copy", "-version"],
            Tool::Tarnc => vec!["tar", "--version"],
            Tool::Scp => vec!["ssh", "-V"],
            Tool::Uftp => vec!["dpkg-query", "-W", "-f=uftp ${Version}\n", "uftp"],
            Tool::Iperf3 => vec!["iperf3", "--version"],
        }
    }

    /// Writes its config files under `s.run` and returns its command lines.
    pub fn commands(self, s: &Setup) -> Result<Commands> {
        if s.receivers.is_empty() {
            bail!("no receivers");
        }
        let a = s.server.to_string();
        let p = |p: &Path| p.display().to_string();
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let server = |argv: Vec<String>, proto, port| Daemon {
            proc: Proc {
                host: Host::Server,
                argv,
                cwd: None,
            },
            ready: (proto, port),
        };
        // One client process per receiver.
        let per_receiver = |f: &dyn Fn(usize, &Receiver) -> Vec<String>| -> Vec<Proc> {
            s.receivers
                .iter()
                .enumerate()
                .map(|(i, r)| Proc {
                    host: Host::Receiver(i),
                    argv: f(i, r),
                    cwd: None,
                })
                .collect()
        };
        // Push tools: a daemon in every receiver, ready once `port` is bound.
        let receiver_daemons =
            |port: u16, f: &dyn Fn(usize, &Receiver) -> Vec<String>| -> Vec<Daemon> {
                per_receiver(f)
                    .into_iter()
                    .map(|proc| Daemon {
                        proc,
                        ready: (Proto::Udp, port),
                    })
                    .collect()
            };
        // Push tools send at a set rate: the suite's, or 90% of the line rate.
        let push_rate = || -> Result<u64> {
            match s.settings.get("rate") {
                Some(r) => longhaul_netem::spec::parse_rate(r).map_err(|e| anyhow::anyhow!(e)),
                None => Ok(s.line_rate_bps / 10 * 9),
            }
        };
        Ok(match self {
            Tool::Longhaul if get(s.settings, "op", "get") == "put" => {
                // A server in every receiver, its root the destination; a put
                // to each from the data's host, in parallel.
                let exe = p(s.exe);
                let daemons = receiver_daemons(7878, &|i, r| {
                    v(&[
                        &exe,
                        "serve",
                        "--root",
                        &p(&r.dst),
                        "--listen",
                        &format!("{}:7878", r.addr),
                        "--state-dir",
                        &p(&s.run.join(format!("serve-state-{i}"))),
                    ])
                });
                let actors = s
                    .receivers
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let mut argv = longhaul_client(
                            &exe,
                            "put",
                            &s.run.join(format!("known_hosts-{i}")),
                            s.settings,
                        );
                        // The directory's contents into the server's root.
                        argv.extend([format!("{}/", p(s.src)), format!("{}:./", r.addr)]);
                        Proc {
                            host: Host::Server,
                            argv,
                            cwd: None,
                        }
                    })
                    .collect();
                Commands { daemons, actors }
            }
            Tool::Longhaul => {
                let exe = p(s.exe);
                Commands {
                    daemons: vec![server(
                        v(&[
                            &exe,
                            "serve",
                            "--root",
                            &p(s.src),
                            "--listen",
                            &format!("{a}:7878"),
                            "--read-only",
                            "--state-dir",
                            &p(&s.run.join("serve-state")),
                        ]),
                        Proto::Udp,
                        7878,
                    )],
                    actors: per_receiver(&|i, r| {
                        let mut argv = longhaul_client(
                            &exe,
                            "get",
                            &s.run.join(format!("known_hosts-{i}")),
                            s.settings,
                        );
                        argv.extend([format!("{a}:./"), p(&r.dst)]);
                        argv
                    }),
                }
            }
            Tool::LonghaulMc => {
                // A push like UFTP's: a receive daemon in every receiver, joined
                // to the group; the sender exits 0 once every one has completed
                // and verified.
                let exe = p(s.exe);
                let group = format!("{LONGHAUL_GROUP}:{LONGHAUL_PORT}");
                let daemons = receiver_daemons(LONGHAUL_PORT, &|i, r| {
                    v(&[
                        &exe,
                        "multicast",
                        "receive",
                        "--group",
                        &group,
                        "--dest",
                        &p(&r.dst),
                        "--id",
                        &format!("rx{i}"),
                    ])
                });
                let bps = push_rate()?;
                let ids: Vec<String> = (0..s.receivers.len()).map(|i| format!("rx{i}")).collect();
                Commands {
                    daemons,
                    actors: vec![Proc {
                        host: Host::Server,
                        argv: v(&[
                            &exe,
                            "multicast",
                            "send",
                            "--group",
                            &group,
                            "--rate",
                            &bps.to_string(),
                            "--receivers",
                            &ids.join(","),
                            "--quiet",
                            // The directory's contents, not the directory.
                            &format!("{}/", p(s.src)),
                        ]),
                        cwd: None,
                    }],
                }
            }
            Tool::Rsync => {
                let conf = s.run.join("rsyncd.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "use chroot = no\nuid = root\ngid = root\nmax connections = 0\n\
                         [data]\npath = {}\nread only = yes\n",
                        p(s.src)
                    ),
                )?;
                Commands {
                    daemons: vec![server(
                        v(&[
                            "rsync",
                            "--daemon",
                            "--no-detach",
                            "--config",
                            &p(&conf),
                            "--address",
                            &a,
                            "--port",
                            "873",
                        ]),
                        Proto::Tcp,
                        873,
                    )],
                    actors: per_receiver(&|_, r| {
                        v(&[
                            "rsync",
                            "-a",
                            &format!("rsync://{a}/data/"),
                            &format!("{}/", p(&r.dst)),
                        ])
                    }),
                }
            }
            Tool::Ftp => {
                let conf = s.run.join("vsftpd.conf");
                std::fs::create_dir_all("/var/run/vsftpd/empty")?;
                std::fs::write(
                    &conf,
                    format!(
                        "listen=YES\nlisten_ipv6=NO\nbackground=NO\nlisten_address={a}\n\
                         listen_port=21\nanonymous_enable=YES\nlocal_enable=NO\n\
                         no_anon_password=YES\nanon_root={}\nwrite_enable=NO\n\
                         pasv_enable=YES\npasv_address={a}\npasv_min_port=30000\n\
                         pasv_max_port=30999\nmax_clients=0\nmax_per_ip=0\n\
                         use_sendfile=YES\nseccomp_sandbox=NO\n\
                         secure_chroot_dir=/var/run/vsftpd/empty\nxferlog_enable=NO\n",
                        p(s.src)
                    ),
                )?;
                Commands {
                    daemons: vec![server(v(&["vsftpd", &p(&conf)]), Proto::Tcp, 21)],
                    actors: per_receiver(&|_, r| {
                        let script = format!(
                            "set cmd:fail-exit yes; set net:max-retries 2; set net:timeout 60; \
                             set xfer:clobber on; set ftp:use-mdtm off; open ftp://{a}; \
                             mirror --parallel={} . {}",
                            get(s.settings, "parallel", "4"),
                            lftp_quote(&p(&r.dst))
                        );
                        v(&["lftp", "-c", &script])
                    }),
                }
            }
            Tool::Gridftp => {
                // Anonymous clear-text GridFTP: the server drops to the `ftp`
                // user, so the data set must be world-readable (it is).
                Commands {
                    daemons: vec![server(
                        v(&[
                            "globus-gridftp-server",
                            "-c",
                            "/dev/null",
                            "-aa",
                            "-anonymous-user",
                            "ftp",
                            "-p",
                            "2811",
                            "-control-interface",
                            &a,
                            "-data-interface",
                            &a,
                            "-d",
                            "error,warn",
                            "-l",
                            &p(&s.run.join("gridftp.log")),
                            "-disable-usage-stats",
                        ]),
                        Proto::Tcp,
                        2811,
                    )],
                    actors: per_receiver(&|_, r| {
                        // Defaults: data channels kept open, 4 files in
                        // flight on pipelined connections, 4 streams per
                        // file: 10 s for 400 files of 10 kB at 70 ms, where
                        // `-p 4 -pp` alone needs over 30.
                        let st = s.settings;
                        let mut argv = vec!["globus-url-copy".to_string()];
                        if get(st, "fast", "yes") == "yes" {
                            argv.push("-fast".into());
                        }
                        if get(st, "pp", "yes") == "yes" {
                            argv.push("-pp".into());
                        }
                        argv.extend(v(&["-cc", get(st, "cc", "4"), "-p", get(st, "p", "4")]));
                        if let Some(bs) = st.get("tcp-bs") {
                            let bytes = longhaul_transfer::units::parse_size(bs).unwrap_or(0);
                            argv.extend(v(&["-tcp-bs", &bytes.to_string()]));
                        }
                        argv.extend(v(&[
                            "-r",
                            "-cd",
                            &format!("ftp://{a}:2811{}/", p(s.src)),
                            &format!("file://{}/", p(&r.dst)),
                        ]));
                        argv
                    }),
                }
            }
            Tool::Tarnc => {
                // nc serves one connection: one listener (port) per receiver.
                let daemons = (0..s.receivers.len())
                    .map(|i| {
                        let port = 5001 + i as u16;
                        server(
                            v(&[
                                "sh",
                                "-c",
                                &format!(
                                    "tar -C {} -cf - . | nc -N -l {a} {port}",
                                    sh_quote(&p(s.src))
                                ),
                            ]),
                            Proto::Tcp,
                            port,
                        )
                    })
                    .collect();
                Commands {
                    daemons,
                    actors: per_receiver(&|i, r| {
                        v(&[
                            "sh",
                            "-c",
                            &format!(
                                "nc -d {a} {} | tar -C {} -xf -",
                                5001 + i,
                                sh_quote(&p(&r.dst))
                            ),
                        ])
                    }),
                }
            }
            Tool::Scp => {
                // Fresh keys per run: a host key for sshd, a client key it trusts.
                let key = |name: &str| -> Result<PathBuf> {
                    let f = s.run.join(name);
                    // ssh-keygen asks before it overwrites.
                    let _ = std::fs::remove_file(&f);
                    let _ = std::fs::remove_file(f.with_extension("pub"));
                    let ok = std::process::Command::new("ssh-keygen")
                        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                        .arg(&f)
                        .status()
                        .is_ok_and(|st| st.success());
                    if !ok {
                        bail!("ssh-keygen could not make {}", f.display());
                    }
                    Ok(f)
                };
                let host_key = key("ssh_host_key")?;
                let client_key = key("client_key")?;
                let auth = s.run.join("authorized_keys");
                std::fs::copy(client_key.with_extension("pub"), &auth)?;
                std::fs::create_dir_all("/run/sshd")?;
                let conf = s.run.join("sshd_config");
                std::fs::write(
                    &conf,
                    format!(
                        "ListenAddress {a}\nPort 22\nHostKey {}\nPidFile none\n\
                         AuthorizedKeysFile {}\nPermitRootLogin prohibit-password\n\
                         PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                         UsePAM no\nUseDNS no\nStrictModes no\nMaxStartups 100:30:200\n\
                         Subsystem sftp internal-sftp\n",
                        p(&host_key),
                        p(&auth)
                    ),
                )?;
                // sshd re-executes itself and wants an absolute path.
                let sshd = which("sshd").map_or("/usr/sbin/sshd".into(), |x| p(&x));
                Commands {
                    daemons: vec![server(
                        v(&[&sshd, "-D", "-e", "-f", &p(&conf)]),
                        Proto::Tcp,
                        22,
                    )],
                    actors: per_receiver(&|_, r| {
                        v(&[
                            "scp",
                            "-q",
                            "-r",
                            "-i",
                            &p(&client_key),
                            "-o",
                            "BatchMode=yes",
                            "-o",
                            "StrictHostKeyChecking=no",
                            "-o",
                            "UserKnownHostsFile=/dev/null",
                            "-o",
                            "LogLevel=ERROR",
                            // The remote side expands the glob: the tree's contents into DST.
                            &format!("root@{a}:{}/*", p(s.src)),
                            &format!("{}/", p(&r.dst)),
                        ])
                    }),
                }
            }
            Tool::Uftp => {
                // A push: uftpd waits in every receiver, uftp in the server
                // sends the tree's top-level entries once (multicast) or to
                // the one receiver (unicast), and exits when all are complete.
                let daemons = receiver_daemons(1044, &|i, r| {
                    v(&[
                        "uftpd",
                        "-d",
                        "-q",
                        "-x",
                        "1",
                        "-I",
                        longhaul_lab::topology::PORT_NAME,
                        "-B",
                        "8388608",
                        "-D",
                        &p(&r.dst),
                        "-F",
                        &p(&s.run.join(format!("uftpd-{i}.status"))),
                    ])
                });
                let ids: Vec<String> = s
                    .receivers
                    .iter()
                    .map(|r| format!("0x{:08X}", u32::from(r.addr)))
                    .collect();
                let dest = if s.receivers.len() == 1 {
                    s.receivers[0].addr.to_string()
                } else {
                    UFTP_PUBLIC.to_string()
                };
                let bps = push_rate()?;
                let kbps = (bps / 1000).max(1).to_string();
                // The first group round-trip estimate must cover the path, or
                // the announce phase ends before a far receiver registers.
                let grtt = format!("{:.3}:0.001:15", (s.rtt.as_secs_f64() * 1.5).max(0.01));
                let mut argv = v(&[
                    "uftp",
                    "-M",
                    &dest,
                    "-P",
                    UFTP_PRIVATE,
                    "-I",
                    longhaul_lab::topology::PORT_NAME,
                    "-H",
                    &ids.join(","),
                    "-R",
                    &kbps,
                    "-Y",
                    "none",
                    "-B",
                    "8388608",
                    "-r",
                    &grtt,
                    "-s",
                    "10",
                    "-x",
                    "1",
                    "-S",
                    &p(&s.run.join("uftp.status")),
                ]);
                argv.extend(top_level(s.src)?);
                Commands {
                    daemons,
                    actors: vec![Proc {
                        host: Host::Server,
                        argv,
                        cwd: Some(s.src.to_path_buf()),
                    }],
                }
            }
            Tool::Iperf3 => {
                // `-s -1` serves one client: one server (port) per receiver.
                let daemons = (0..s.receivers.len())
                    .map(|i| {
                        let port = (5201 + i as u16).to_string();
                        server(
                            v(&["iperf3", "-s", "-1", "-B", &a, "-p", &port]),
                            Proto::Tcp,
                            5201 + i as u16,
                        )
                    })
                    .collect();
                Commands {
                    daemons,
                    actors: per_receiver(&|i, _| {
                        let mut argv = v(&[
                            "iperf3",
                            "-c",
                            &a,
                            "-p",
                            &(5201 + i).to_string(),
                            "-P",
                            get(s.settings, "streams", "1"),
                            "-R",
                            "-n",
                            &s.bytes.max(1).to_string(),
                        ]);
                        // With -R the server sends; iperf3 hands it -C.
                        if let Some(cc) = s.settings.get("cc") {
                            argv.extend(["-C".to_string(), cc.clone()]);
                        }
                        argv
                    }),
                }
            }
        })
    }
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
        .chain(["/usr/sbin".into(), "/sbin".into()])
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

/// Double-quotes `s` for an lftp command line.
fn lftp_quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', r"\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_tools_are_refused() {
        for t in Tool::ALL {
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
        assert_eq!(spec.tool, Tool::Gridftp);
        assert_eq!(spec.label, "gridftp:p=8,pp=no,tcp-bs=4MB");
        let plain: ToolSpec = "rsync".parse().unwrap();
        assert_eq!((plain.label.as_str(), plain.settings.len()), ("rsync", 0));
        let err = |s: &str| s.parse::<ToolSpec>().unwrap_err().to_string();
        assert!(err("gridftp:p=0").contains("p=0: a whole number from 1 to 64"));
        assert!(err("gridftp:q=1").contains("no setting 'q' (it has p, cc, pp, fast, tcp-bs)"));
        assert!(err("rsync:p=1").contains("it has none"));
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
                settings: &Settings::new(),
            };
            for tool in Tool::ALL {
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
                if tool == Tool::LonghaulMc {
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
