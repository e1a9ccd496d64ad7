//! The `gridftp` tool of the lab: globus-gridftp-server (anonymous, no certificates), globus-url-copy -fast -pp -cc 4 -p 4 -r -cd.

use super::*;

/// globus-gridftp-server (anonymous, no certificates), globus-url-copy -fast -pp -cc 4 -p 4 -r -cd.
pub(super) struct Gridftp;

impl Adapter for Gridftp {
    fn name(&self) -> &'static str {
        "gridftp"
    }

    fn describe(&self) -> &'static str {
        "globus-gridftp-server (anonymous, no certificates), globus-url-copy -fast -pp -cc 4 -p 4 -r -cd"
    }

    fn settings(&self) -> &'static [Setting] {
        &[
            ("p", "globus-url-copy -p: TCP streams per file, default 4", count_1_to_64),
            ("cc", "globus-url-copy -cc: files at once, default 4", count_1_to_64),
            ("pp", "globus-url-copy -pp: pipelining, default yes", yes_no),
            ("fast", "globus-url-copy -fast: reuse data channels, default yes", yes_no),
            (
                "tcp-bs",
                "globus-url-copy -tcp-bs: socket buffer size (capped by the host's net.core.rmem_max), default none",
                size,
            ),
        ]
    }

    fn programs(&self) -> &'static [&'static str] {
        &["globus-gridftp-server", "globus-url-copy"]
    }

    fn packages(&self) -> &'static [&'static str] {
        &["globus-gridftp-server-progs", "globus-gass-copy-progs"]
    }

    fn version_command(&self) -> &'static [&'static str] {
        &["globus-url-copy", "-version"]
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        Ok({
            // Anonymous clear-text GridFTP: the server drops to the `ftp`
            // user, so the data set must be world-readable (it is).
            Commands {
                daemons: vec![s.server_daemon(
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
                actors: s.per_receiver(&|_, r| {
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
        })
    }
}
