//! The `scp` tool of the lab: OpenSSH sshd + scp -r (SFTP protocol), key authentication.

use super::*;

/// OpenSSH sshd + scp -r (SFTP protocol), key authentication.
pub(super) struct Scp;

impl Adapter for Scp {
    fn name(&self) -> &'static str {
        "scp"
    }

    fn describe(&self) -> &'static str {
        "OpenSSH sshd + scp -r (SFTP protocol), key authentication"
    }

    fn programs(&self) -> &'static [&'static str] {
        &["sshd", "scp", "ssh-keygen"]
    }

    fn packages(&self) -> &'static [&'static str] {
        super::scp::SSH_PACKAGES
    }

    fn version_command(&self) -> &'static [&'static str] {
        super::scp::SSH_VERSION
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        let (daemon, client_key) = sshd(s)?;
        Ok(Commands {
            daemons: vec![daemon],
            actors: s.per_receiver(&|_, r| {
                let mut argv = vec!["scp".to_string(), "-q".into(), "-r".into()];
                argv.extend(ssh_options(&client_key));
                // The remote side expands the glob: the tree's contents into DST.
                argv.extend([
                    format!("root@{a}:{}/*", p(s.src)),
                    format!("{}/", p(&r.dst)),
                ]);
                argv
            }),
        })
    }
}

/// The packages of OpenSSH's server and client.
pub(super) const SSH_PACKAGES: &[&str] = &["openssh-server", "openssh-client"];
/// What prints OpenSSH's version.
pub(super) const SSH_VERSION: &[&str] = &["ssh", "-V"];

/// sshd in the server host, key-only, with fresh keys for this run: its
/// daemon, and the client key it trusts.
pub(super) fn sshd(s: &Setup) -> Result<(Daemon, PathBuf)> {
    let a = s.server.to_string();
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
    let daemon = s.server_daemon(v(&[&sshd, "-D", "-e", "-f", &p(&conf)]), Proto::Tcp, 22);
    Ok((daemon, client_key))
}

/// The ssh command line (as `rsync -e` and `--ssh-command` take it) with
/// [`ssh_options`].
pub(super) fn ssh_command(key: &Path) -> String {
    std::iter::once("ssh".to_string())
        .chain(ssh_options(key))
        .collect::<Vec<_>>()
        .join(" ")
}

/// ssh's options for the lab: the run's key, no prompts, no host-key checks
/// (the host key is new every run).
pub(super) fn ssh_options(key: &Path) -> Vec<String> {
    v(&[
        "-i",
        &p(key),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
    ])
}
