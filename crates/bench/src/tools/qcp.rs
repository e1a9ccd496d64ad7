//! The `qcp` tool of the lab: the QUIC Copier (crates.io `qcp`), a file
//! copier on quinn made for long fat paths. Like scp it starts its server
//! over ssh (`qcp --server` in the server host), then moves the data over
//! QUIC; told the path's rate and round trip, as its manual asks.

use super::*;

/// qcp, built by `lab deps` from crates.io.
pub(super) struct Qcp;

/// The release the lab builds (`cargo install qcp --locked --version`).
pub(super) const QCP_VERSION: &str = "0.9.1";

impl Adapter for Qcp {
    fn name(&self) -> &'static str {
        "qcp"
    }

    fn describe(&self) -> &'static str {
        "qcp 0.9.1 (QUIC on quinn, started over ssh), told the link's rate and RTT"
    }

    fn settings(&self) -> &'static [Setting] {
        &[(
            "cc",
            "qcp --congestion: cubic, bbr or newreno; default the suite's kernel cc (reno as newreno), else qcp's cubic",
            qcp_cc,
        )]
    }

    fn programs(&self) -> &'static [&'static str] {
        &["qcp", "sshd", "ssh", "ssh-keygen"]
    }

    fn packages(&self) -> &'static [&'static str] {
        super::scp::SSH_PACKAGES
    }

    fn crate_install(&self) -> Option<(&'static str, &'static str)> {
        Some(("qcp", QCP_VERSION))
    }

    fn version_command(&self) -> &'static [&'static str] {
        &["qcp", "--version"]
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        let (daemon, client_key) = super::scp::sshd(s)?;
        let qcp = which("qcp").map_or("qcp".into(), |x| p(&x));
        // qcp runs `ssh HOST qcp --server`: a wrapper gives ssh the run's key
        // and options.
        let wrapper = s.run.join("qcp-ssh");
        {
            use std::os::unix::fs::PermissionsExt;
            let opts: Vec<String> = super::scp::ssh_options(&client_key)
                .iter()
                .map(|o| sh_quote(o))
                .collect();
            std::fs::write(
                &wrapper,
                format!("#!/bin/sh\nexec ssh {} \"$@\"\n", opts.join(" ")),
            )?;
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        }
        // The data set's top-level entries, each a remote source (qcp does
        // not expand a remote glob as scp's remote shell does).
        let mut tops: Vec<String> = std::fs::read_dir(s.src)?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        tops.sort();
        if tops.is_empty() {
            bail!("{}: nothing to copy", s.src.display());
        }
        // Bytes per second and milliseconds, at least 1.
        let rx = (s.line_rate_bps / 8).max(1).to_string();
        let rtt = s.rtt.as_millis().max(1).to_string();
        let cc = match (s.settings.get("cc"), s.kernel_cc) {
            (Some(c), _) => c.as_str(),
            (None, Some("reno")) => "newreno",
            (None, Some(c)) => c,
            (None, None) => "cubic",
        };
        let mut common = v(&[
            "-q",
            "-r",
            "--rx",
            &rx,
            "--rtt",
            &rtt,
            "--congestion",
            cc,
            "--ssh",
            &p(&wrapper),
            "--remote-qcp-binary",
            &qcp,
        ]);
        if s.mtu > 1500 {
            // qcp probes up to 1,452 bytes unless told: a jumbo path's own.
            common.extend(v(&["--max-mtu", &(s.mtu - 28).to_string()]));
        }
        Ok(Commands {
            daemons: vec![daemon],
            actors: s.per_receiver(&|_, r| {
                let mut argv = vec![qcp.clone()];
                argv.extend(common.iter().cloned());
                for t in &tops {
                    argv.push(format!("root@{a}:{}/{t}", p(s.src)));
                }
                argv.push(format!("{}/", p(&r.dst)));
                argv
            }),
        })
    }
}

fn qcp_cc(v: &str) -> Result<()> {
    match v {
        "cubic" | "bbr" | "newreno" => Ok(()),
        _ => bail!("cubic, bbr or newreno"),
    }
}
