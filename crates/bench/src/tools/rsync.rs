//! The `rsync` tool of the lab: rsync daemon, rsync -a; or, with
//! `rsync:ssh=yes`, rsync over ssh (sshd in the server host), as most
//! people run it.

use super::*;

/// rsync daemon, rsync -a.
pub(super) struct Rsync;

impl Adapter for Rsync {
    fn name(&self) -> &'static str {
        "rsync"
    }

    fn describe(&self) -> &'static str {
        "rsync daemon, rsync -a"
    }

    fn settings(&self) -> &'static [Setting] {
        &[(
            "ssh",
            "yes: rsync -a -e ssh through sshd in the server host (keys made per run), instead of the rsync daemon",
            yes_no,
        )]
    }

    fn programs(&self) -> &'static [&'static str] {
        &["rsync"]
    }

    fn packages(&self) -> &'static [&'static str] {
        &["rsync"]
    }

    fn version_command(&self) -> &'static [&'static str] {
        &["rsync", "--version"]
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        if get(s.settings, "ssh", "no") == "yes" {
            let (daemon, key) = super::scp::sshd(s)?;
            let ssh = super::scp::ssh_command(&key);
            return Ok(Commands {
                daemons: vec![daemon],
                actors: s.per_receiver(&|_, r| {
                    v(&[
                        "rsync",
                        "-a",
                        "-e",
                        &ssh,
                        &format!("root@{a}:{}/", p(s.src)),
                        &format!("{}/", p(&r.dst)),
                    ])
                }),
            });
        }
        Ok({
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
                daemons: vec![s.server_daemon(
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
                actors: s.per_receiver(&|_, r| {
                    v(&[
                        "rsync",
                        "-a",
                        &format!("rsync://{a}/data/"),
                        &format!("{}/", p(&r.dst)),
                    ])
                }),
            }
        })
    }
}
