//! Peer-tool adapters: how each real program is started in the server host
//! and driven from the client host (a pull: data flows server → client).
//! Each adapter only builds command lines and config files; the runner
//! spawns, times, stops and verifies.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Longhaul,
    Rsync,
    Ftp,
    Tarnc,
    Scp,
    Iperf3,
}

impl std::str::FromStr for Tool {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Tool> {
        Ok(match s {
            "longhaul" => Tool::Longhaul,
            "rsync" => Tool::Rsync,
            "ftp" => Tool::Ftp,
            "tarnc" => Tool::Tarnc,
            "scp" => Tool::Scp,
            "iperf3" => Tool::Iperf3,
            _ => bail!(
                "unknown tool '{s}' (known: {})",
                Tool::ALL.map(|t| t.name()).join(", ")
            ),
        })
    }
}

/// What the runner needs to set a tool up.
pub struct Setup<'a> {
    /// The longhaul executable.
    pub exe: &'a Path,
    /// The data set (in the server host's view; hosts share the file system).
    pub src: &'a Path,
    /// An empty directory the client fills.
    pub dst: &'a Path,
    /// A directory for config files, state and logs.
    pub run: &'a Path,
    pub server: Ipv4Addr,
    /// Bytes of the data set (for memory-to-memory tools).
    pub bytes: u64,
}

/// How to run one transfer.
pub struct Commands {
    pub server: Vec<String>,
    /// The server is ready when this port is bound (TCP: listening).
    pub ready: (Proto, u16),
    pub client: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Tool {
    pub const ALL: [Tool; 6] = [
        Tool::Longhaul,
        Tool::Rsync,
        Tool::Ftp,
        Tool::Tarnc,
        Tool::Scp,
        Tool::Iperf3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tool::Longhaul => "longhaul",
            Tool::Rsync => "rsync",
            Tool::Ftp => "ftp",
            Tool::Tarnc => "tarnc",
            Tool::Scp => "scp",
            Tool::Iperf3 => "iperf3",
        }
    }

    /// What it is, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Tool::Longhaul => "longhaul serve + get (QUIC)",
            Tool::Rsync => "rsync daemon, rsync -a",
            Tool::Ftp => "vsftpd (anonymous), lftp mirror --parallel=4",
            Tool::Tarnc => "tar | nc, one TCP stream",
            Tool::Scp => "OpenSSH sshd + scp -r (SFTP protocol), key authentication",
            Tool::Iperf3 => "iperf3 -R -n BYTES, memory to memory (ceiling)",
        }
    }

    /// Programs it needs (besides longhaul itself).
    pub fn programs(self) -> &'static [&'static str] {
        match self {
            Tool::Longhaul => &[],
            Tool::Rsync => &["rsync"],
            Tool::Ftp => &["vsftpd", "lftp"],
            Tool::Tarnc => &["tar", "nc"],
            Tool::Scp => &["sshd", "scp", "ssh-keygen"],
            Tool::Iperf3 => &["iperf3"],
        }
    }

    /// Debian packages that provide them.
    pub fn packages(self) -> &'static [&'static str] {
        match self {
            Tool::Longhaul => &[],
            Tool::Rsync => &["rsync"],
            Tool::Ftp => &["vsftpd", "lftp"],
            Tool::Tarnc => &["tar", "netcat-openbsd"],
            Tool::Scp => &["openssh-server", "openssh-client"],
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

    /// The command line that prints its version (first line kept).
    pub fn version_command(self) -> Vec<&'static str> {
        match self {
            Tool::Longhaul => vec![],
            Tool::Rsync => vec!["rsync", "--version"],
            Tool::Ftp => vec!["lftp", "--version"],
            Tool::Tarnc => vec!["tar", "--version"],
            Tool::Scp => vec!["ssh", "-V"],
            Tool::Iperf3 => vec!["iperf3", "--version"],
        }
    }

    /// Writes its config files under `s.run` and returns its command lines.
    pub fn commands(self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        let p = |p: &Path| p.display().to_string();
        let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Ok(match self {
            Tool::Longhaul => {
                let exe = p(s.exe);
                Commands {
                    server: v(&[
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
                    ready: (Proto::Udp, 7878),
                    client: v(&[
                        &exe,
                        "get",
                        "--accept-new",
                        "--known-hosts",
                        &p(&s.run.join("known_hosts")),
                        "--quiet",
                        &format!("{a}:./"),
                        &p(s.dst),
                    ]),
                }
            }
            Tool::Rsync => {
                let conf = s.run.join("rsyncd.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "use chroot = no\nuid = root\ngid = root\n[data]\npath = {}\nread only = yes\n",
                        p(s.src)
                    ),
                )?;
                Commands {
                    server: v(&[
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
                    ready: (Proto::Tcp, 873),
                    client: v(&[
                        "rsync",
                        "-a",
                        &format!("rsync://{a}/data/"),
                        &format!("{}/", p(s.dst)),
                    ]),
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
                let script = format!(
                    "set cmd:fail-exit yes; set net:max-retries 2; set net:timeout 60; \
                     set xfer:clobber on; open ftp://{a}; mirror --parallel=4 . {}",
                    lftp_quote(&p(s.dst))
                );
                Commands {
                    server: v(&["vsftpd", &p(&conf)]),
                    ready: (Proto::Tcp, 21),
                    client: v(&["lftp", "-c", &script]),
                }
            }
            Tool::Tarnc => Commands {
                server: v(&[
                    "sh",
                    "-c",
                    &format!("tar -C {} -cf - . | nc -N -l {a} 5001", sh_quote(&p(s.src))),
                ]),
                ready: (Proto::Tcp, 5001),
                client: v(&[
                    "sh",
                    "-c",
                    &format!("nc -d {a} 5001 | tar -C {} -xf -", sh_quote(&p(s.dst))),
                ]),
            },
            Tool::Scp => {
                // Fresh keys per run: a host key for sshd, a client key it trusts.
                let key = |name: &str| -> Result<std::path::PathBuf> {
                    let f = s.run.join(name);
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
                    server: v(&[&sshd, "-D", "-e", "-f", &p(&conf)]),
                    ready: (Proto::Tcp, 22),
                    client: v(&[
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
                        &format!("{}/", p(s.dst)),
                    ]),
                }
            }
            Tool::Iperf3 => Commands {
                server: v(&["iperf3", "-s", "-1", "-B", &a, "-p", "5201"]),
                ready: (Proto::Tcp, 5201),
                client: v(&[
                    "iperf3",
                    "-c",
                    &a,
                    "-p",
                    "5201",
                    "-R",
                    "-n",
                    &s.bytes.max(1).to_string(),
                ]),
            },
        })
    }
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

    #[test]
    fn quoting_keeps_awkward_paths_whole() {
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("printf %s {}", sh_quote("a b'c$d"))])
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"a b'c$d");
    }

    #[test]
    fn commands_point_at_the_server_and_the_directories() {
        let t = tempfile::tempdir().unwrap();
        let s = Setup {
            exe: Path::new("/x/longhaul"),
            src: Path::new("/data/src"),
            dst: Path::new("/data/dst"),
            run: t.path(),
            server: Ipv4Addr::new(10, 77, 0, 1),
            bytes: 1000,
        };
        for tool in Tool::ALL {
            let c = tool.commands(&s).unwrap();
            let all = format!("{:?} {:?}", c.server, c.client);
            assert!(all.contains("10.77.0.1"), "{tool:?}: {all}");
            if tool.moves_files() {
                assert!(all.contains("/data/dst"), "{tool:?}: {all}");
            }
        }
        let conf = std::fs::read_to_string(t.path().join("rsyncd.conf")).unwrap();
        assert!(conf.contains("path = /data/src") && conf.contains("read only = yes"));
        let conf = std::fs::read_to_string(t.path().join("vsftpd.conf")).unwrap();
        assert!(conf.contains("anon_root=/data/src") && conf.contains("write_enable=NO"));
    }
}
