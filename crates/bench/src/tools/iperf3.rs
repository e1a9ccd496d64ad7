//! The `iperf3` tool of the lab: iperf3 -R -n BYTES, memory to memory (ceiling).

use super::*;

/// iperf3 -R -n BYTES, memory to memory (ceiling).
pub(super) struct Iperf3;

impl Adapter for Iperf3 {
    fn name(&self) -> &'static str {
        "iperf3"
    }

    fn describe(&self) -> &'static str {
        "iperf3 -R -n BYTES, memory to memory (ceiling)"
    }

    fn settings(&self) -> &'static [Setting] {
        &[
            ("streams", "iperf3 -P: parallel streams, default 1", count_1_to_64),
            (
                "cc",
                "iperf3 -C: the sender's TCP congestion control, default the suite's (or the kernel's)",
                kernel_cc,
            ),
        ]
    }

    fn programs(&self) -> &'static [&'static str] {
        &["iperf3"]
    }

    fn packages(&self) -> &'static [&'static str] {
        &["iperf3"]
    }

    fn version_command(&self) -> &'static [&'static str] {
        &["iperf3", "--version"]
    }

    fn moves_files(&self) -> bool {
        false
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        Ok({
            // `-s -1` serves one client: one server (port) per receiver.
            let daemons = (0..s.receivers.len())
                .map(|i| {
                    let port = (5201 + i as u16).to_string();
                    s.server_daemon(
                        v(&["iperf3", "-s", "-1", "-B", &a, "-p", &port]),
                        Proto::Tcp,
                        5201 + i as u16,
                    )
                })
                .collect();
            Commands {
                daemons,
                actors: s.per_receiver(&|i, _| {
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
        })
    }
}
