//! The `longhaul-ssh` tool of the lab: `longhaul get --ssh` through OpenSSH's
//! sshd in the server host (the one-shot server started over ssh, as scp
//! users would run it), key authentication.

use super::*;

/// `longhaul get --ssh` via sshd, key authentication.
pub(super) struct LonghaulSsh;

impl Adapter for LonghaulSsh {
    fn name(&self) -> &'static str {
        "longhaul-ssh"
    }

    fn describe(&self) -> &'static str {
        "longhaul get --ssh: serve --once started over OpenSSH (key authentication), data over QUIC"
    }

    fn settings(&self) -> &'static [Setting] {
        &[
            (
                "cc",
                "longhaul --cc: the sender's controller (the remote server applies it)",
                longhaul_cc,
            ),
            ("max-rate", "longhaul --max-rate", rate),
        ]
    }

    fn programs(&self) -> &'static [&'static str] {
        &["sshd", "ssh", "ssh-keygen"]
    }

    fn packages(&self) -> &'static [&'static str] {
        super::scp::SSH_PACKAGES
    }

    fn version_command(&self) -> &'static [&'static str] {
        super::scp::SSH_VERSION
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        let (daemon, key) = super::scp::sshd(s)?;
        let exe = p(s.exe);
        let ssh_command = super::scp::ssh_command(&key);
        Ok(Commands {
            daemons: vec![daemon],
            actors: s.per_receiver(&|_, r| {
                let mut argv = v(&[
                    &exe,
                    "get",
                    "--ssh-command",
                    &ssh_command,
                    "--longhaul-path",
                    &exe,
                    "--quiet",
                    // Every run starts cold, as the longhaul tool's.
                    "--no-rates",
                ]);
                for k in ["cc", "max-rate"] {
                    if let Some(x) = s.settings.get(k) {
                        argv.extend([format!("--{k}"), x.clone()]);
                    }
                }
                // The tree's contents into DST.
                argv.extend([format!("root@{a}:{}/", p(s.src)), p(&r.dst)]);
                argv
            }),
        })
    }
}
