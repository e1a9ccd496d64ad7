//! The `tarnc` tool of the lab: tar | nc, one TCP stream per receiver.

use super::*;

/// tar | nc, one TCP stream per receiver.
pub(super) struct Tarnc;

impl Adapter for Tarnc {
    fn name(&self) -> &'static str {
        "tarnc"
    }

    fn describe(&self) -> &'static str {
        "tar | nc, one TCP stream per receiver"
    }

    fn programs(&self) -> &'static [&'static str] {
        &["tar", "nc"]
    }

    fn packages(&self) -> &'static [&'static str] {
        &["tar", "netcat-openbsd"]
    }

    fn version_command(&self) -> &'static [&'static str] {
        &["tar", "--version"]
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        Ok({
            // nc serves one connection: one listener (port) per receiver.
            let daemons = (0..s.receivers.len())
                .map(|i| {
                    let port = 5001 + i as u16;
                    s.server_daemon(
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
                actors: s.per_receiver(&|i, r| {
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
        })
    }
}
