//! The `longhaul` tool of the lab: longhaul serve + get (QUIC); one get per receiver (op=put: a serve in every receiver, a put to each).

use super::*;

/// longhaul serve + get (QUIC); one get per receiver (op=put: a serve in every receiver, a put to each).
pub(super) struct Longhaul;

impl Adapter for Longhaul {
    fn name(&self) -> &'static str {
        "longhaul"
    }

    fn describe(&self) -> &'static str {
        "longhaul serve + get (QUIC); one get per receiver (op=put: a serve in every receiver, a put to each)"
    }

    fn settings(&self) -> &'static [Setting] {
        &[
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
                "longhaul --window: memory bound of the client's windows, default 1GiB (with op=put the receiving server keeps its own)",
                size,
            ),
            (
                "connections",
                "longhaul --connections: QUIC connections of the transfer, each its own socket and thread, default 1",
                count_1_to_16,
            ),
            (
                "known",
                "yes: a known server (a get of a path that is not there first, untimed, so the client holds a session ticket and a token: the timed transfer starts in 0-RTT); default no, first contact",
                yes_no,
            ),
        ]
    }

    fn warmups(&self, s: &Setup) -> Vec<Proc> {
        if get(s.settings, "known", "no") != "yes" {
            return Vec::new();
        }
        let exe = p(s.exe);
        let put = get(s.settings, "op", "get") == "put";
        s.receivers
            .iter()
            .enumerate()
            .map(|(i, r)| {
                // The same client (known-hosts file, so its tickets and
                // tokens) as the timed run's; a path the server does not
                // hold: the handshake and the request, no data.
                let mut argv = longhaul_client(
                    &exe,
                    "get",
                    &s.run.join(format!("known_hosts-{i}")),
                    s.settings,
                );
                let (host, server) = if put {
                    (Host::Server, r.addr.to_string())
                } else {
                    (Host::Receiver(i), s.server.to_string())
                };
                argv.extend([
                    format!("{server}:{WARMUP_PATH}"),
                    p(&s.run.join(format!("warmup-{i}"))),
                ]);
                Proc {
                    host,
                    argv,
                    cwd: None,
                }
            })
            .collect()
    }

    /// Unicast for reference: a server in every receiver, its root the
    /// destination, and per receiver a loop that puts what arrived since
    /// its last put (a put that fails, as when the receiver is down, is
    /// tried again with what came meanwhile).
    fn feed(&self, s: &FeedSetup) -> Result<Option<FeedCommands>> {
        let exe = p(s.exe);
        let receivers = receiver_daemons(s.receivers, 7878, &|i, r| {
            put_server(&exe, r, &s.run.join(format!("serve-state-{i}")))
        });
        let mut senders = Vec::new();
        let mut outboxes = Vec::new();
        for (i, r) in s.receivers.iter().enumerate() {
            let mut put = longhaul_client(
                &exe,
                "put",
                &s.run.join(format!("known_hosts-{i}")),
                s.settings,
            );
            put.extend(["./".to_string(), format!("{}:./", r.addr)]);
            let outbox = s.feed_dir.join(format!("put-out-{i}"));
            senders.push((
                Some(i),
                send_loop(
                    &s.run.join(format!("put-loop-{i}.sh")),
                    &outbox,
                    &s.feed_dir.join(format!("put-batch-{i}")),
                    (&put, false),
                    &s.run.join(format!("put-{i}.log")),
                    true,
                )?,
            ));
            outboxes.push((Some(i), outbox));
        }
        Ok(Some(FeedCommands {
            receivers,
            senders,
            outboxes,
        }))
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        Ok({
            if get(s.settings, "op", "get") == "put" {
                // A server in every receiver, its root the destination; a put
                // to each from the data's host, in parallel.
                let exe = p(s.exe);
                let daemons = s.receiver_daemons(7878, &|i, r| {
                    put_server(&exe, r, &s.run.join(format!("serve-state-{i}")))
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
            } else {
                let exe = p(s.exe);
                Commands {
                    daemons: vec![s.server_daemon(
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
                    actors: s.per_receiver(&|i, r| {
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
        })
    }
}

/// A server in a receiver that takes puts into its destination.
fn put_server(exe: &str, r: &Receiver, state: &Path) -> Vec<String> {
    v(&[
        exe,
        "serve",
        "--root",
        &p(&r.dst),
        "--listen",
        &format!("{}:7878", r.addr),
        "--state-dir",
        &p(state),
        // (The lab's hosts are namespaces of this machine alone.)
        "--allow-anonymous-put",
    ])
}

/// What a `known=yes` warm-up asks the server for: a path no data set holds.
const WARMUP_PATH: &str = ".longhaul-lab-warmup";

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
    for k in ["cc", "max-rate", "window", "connections"] {
        if let Some(x) = settings.get(k) {
            argv.extend([format!("--{k}"), x.clone()]);
        }
    }
    argv
}
