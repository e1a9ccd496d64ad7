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

    /// The channel: `multicast send --follow` on the spool, an open group,
    /// a receive daemon in every receiver.
    fn feed(&self, s: &FeedSetup) -> Result<Option<FeedCommands>> {
        Ok(Some(channel(s)))
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        Ok({
            // A push like UFTP's: a receive daemon in every receiver, joined
            // to the group; the sender exits 0 once every one has completed
            // and verified.
            let exe = p(s.exe);
            let daemons = s.receiver_daemons(LONGHAUL_PORT, &|i, r| receive(&exe, i, &r.dst));
            let ids: Vec<String> = (0..s.receivers.len()).map(|i| format!("rx{i}")).collect();
            let mut argv = send(&exe, s.push_rate()?);
            argv.extend(v(&[
                "--receivers",
                &ids.join(","),
                "--quiet",
                // The directory's contents, not the directory.
                &format!("{}/", p(s.src)),
            ]));
            Commands {
                daemons,
                actors: vec![Proc {
                    host: Host::Server,
                    argv,
                    cwd: None,
                }],
            }
        })
    }
}

/// The group and port longhaul multicast uses in the lab.
pub(super) const LONGHAUL_GROUP: &str = "239.7.7.7";
pub(super) const LONGHAUL_PORT: u16 = 7000;

/// `multicast receive` into `dst` as receiver `i`.
fn receive(exe: &str, i: usize, dst: &Path) -> Vec<String> {
    v(&[
        exe,
        "multicast",
        "receive",
        "--group",
        &format!("{LONGHAUL_GROUP}:{LONGHAUL_PORT}"),
        "--dest",
        &p(dst),
        "--id",
        &format!("rx{i}"),
        // (The lab's hosts are namespaces of this machine alone.)
        "--accept-any-sender",
    ])
}

/// `multicast send` at `bps`, up to what it sends and to whom.
fn send(exe: &str, bps: u64) -> Vec<String> {
    v(&[
        exe,
        "multicast",
        "send",
        "--group",
        &format!("{LONGHAUL_GROUP}:{LONGHAUL_PORT}"),
        "--rate",
        &bps.to_string(),
    ])
}

/// The channel (`multicast send --follow`) of a dissemination run.
pub(super) fn channel(s: &FeedSetup) -> FeedCommands {
    let exe = p(s.exe);
    let receivers = receiver_daemons(s.receivers, LONGHAUL_PORT, &|i, r| {
        let mut argv = receive(&exe, i, &r.dst);
        argv.extend(v(&[
            // Kept over a restart: where it left the channel.
            "--state-dir",
            &p(&s.run.join(format!("rx{i}-state"))),
            "--json",
        ]));
        argv
    });
    let mut argv = send(&exe, s.rate_bps);
    argv.extend(v(&[
        "--open",
        "--follow",
        &p(s.spool),
        "--backlog",
        &format!("{}s", s.backlog.as_secs()),
        // Its record, this run's own (a new channel each run).
        "--state-dir",
        &p(&s.run.join("send-state")),
    ]));
    FeedCommands {
        receivers,
        senders: vec![(
            None,
            Proc {
                host: Host::Server,
                argv,
                cwd: None,
            },
        )],
        outboxes: Vec::new(),
    }
}
