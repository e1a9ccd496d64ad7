//! The `longhaul-mc` tool of the lab: longhaul multicast send → receive (RaptorQ), closed group, at 90% of the line rate; IP multicast to every receiver.

use super::*;

/// longhaul multicast send → receive (RaptorQ), closed group, at 90% of the line rate; IP multicast to every receiver.
pub(super) struct LonghaulMc;

impl Adapter for LonghaulMc {
    fn name(&self) -> &'static str {
        "longhaul-mc"
    }

    fn describe(&self) -> &'static str {
        "longhaul multicast send → receive (RaptorQ), closed group, at 90% of the line rate; IP multicast to every receiver"
    }

    fn settings(&self) -> &'static [Setting] {
        &[(
            "rate",
            "longhaul multicast send --rate, default 90% of the line rate",
            rate,
        )]
    }

    fn multicasts(&self) -> bool {
        true
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        Ok({
            // A push like UFTP's: a receive daemon in every receiver, joined
            // to the group; the sender exits 0 once every one has completed
            // and verified.
            let exe = p(s.exe);
            let group = format!("{LONGHAUL_GROUP}:{LONGHAUL_PORT}");
            let daemons = s.receiver_daemons(LONGHAUL_PORT, &|i, r| {
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
                    // (The lab's hosts are namespaces of this machine
                    // alone.)
                    "--accept-any-sender",
                ])
            });
            let bps = s.push_rate()?;
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
        })
    }
}

/// The group and port longhaul multicast uses in the lab.
pub(super) const LONGHAUL_GROUP: &str = "239.7.7.7";
pub(super) const LONGHAUL_PORT: u16 = 7000;
