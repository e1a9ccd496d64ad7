//! The `uftp` tool of the lab: uftp → uftpd at 90% of the line rate, closed group; multicast to several receivers, unicast to one.

use super::*;

/// uftp → uftpd at 90% of the line rate, closed group; multicast to several receivers, unicast to one.
pub(super) struct Uftp;

impl Adapter for Uftp {
    fn name(&self) -> &'static str {
        "uftp"
    }

    fn describe(&self) -> &'static str {
        "uftp → uftpd at 90% of the line rate, closed group; multicast to several receivers, unicast to one"
    }

    fn settings(&self) -> &'static [Setting] {
        &[(
            "rate",
            "uftp -R: sending rate, default 90% of the line rate",
            rate,
        )]
    }

    fn programs(&self) -> &'static [&'static str] {
        &["uftp", "uftpd"]
    }

    fn packages(&self) -> &'static [&'static str] {
        &["uftp"]
    }

    fn version_command(&self) -> &'static [&'static str] {
        &["dpkg-query", "-W", "-f=uftp ${Version}\n", "uftp"]
    }

    fn multicasts(&self) -> bool {
        true
    }

    /// uftpd's status file (`-F`) has a `RESULT;...;copied` line per file
    /// it completed: its files fill in at offsets, so a tree of full-length
    /// files may still have gaps smaller than a page.
    fn receiver_says_done(&self, run: &Path, i: usize, files: u64) -> Option<bool> {
        let text =
            std::fs::read_to_string(run.join(format!("uftpd-{i}.status"))).unwrap_or_default();
        let done = text
            .lines()
            .filter(|l| {
                l.starts_with("RESULT;") && (l.ends_with(";copied") || l.ends_with(";overwritten"))
            })
            .count() as u64;
        Some(done >= files)
    }

    /// As a station's operator runs it: uftpd in every receiver, and a loop
    /// in the server that sends what arrived since its last session as one
    /// session to the closed group of every receiver (a receiver that is
    /// away misses that session).
    fn feed(&self, s: &FeedSetup) -> Result<Option<FeedCommands>> {
        let receivers = receiver_daemons(s.receivers, 1044, &|i, r| {
            uftpd(&r.dst, &s.run.join(format!("uftpd-{i}.status")))
        });
        let argv = uftp(s.receivers, s.rate_bps, s.rtt);
        let outbox = s.feed_dir.join("uftp-out");
        let sender = send_loop(
            &s.run.join("uftp-loop.sh"),
            &outbox,
            &s.feed_dir.join("uftp-batch"),
            (&argv, true),
            &s.run.join("uftp-sessions.log"),
            false,
        )?;
        Ok(Some(FeedCommands {
            receivers,
            senders: vec![(None, sender)],
            outboxes: vec![(None, outbox)],
        }))
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        Ok({
            // A push: uftpd waits in every receiver, uftp in the server
            // sends the tree's top-level entries once (multicast) or to
            // the one receiver (unicast), and exits when all are complete.
            let daemons = s.receiver_daemons(1044, &|i, r| {
                uftpd(&r.dst, &s.run.join(format!("uftpd-{i}.status")))
            });
            let mut argv = uftp(s.receivers, s.push_rate()?, s.rtt);
            argv.extend(["-S".into(), p(&s.run.join("uftp.status"))]);
            argv.extend(top_level(s.src)?);
            Commands {
                daemons,
                actors: vec![Proc {
                    host: Host::Server,
                    argv,
                    cwd: Some(s.src.to_path_buf()),
                }],
            }
        })
    }
}

/// The multicast group UFTP announces on and the one its data goes to.
const UFTP_PUBLIC: &str = "230.4.4.1";
const UFTP_PRIVATE: &str = "230.5.5.1";

/// uftp up to its files: to every receiver as a closed group (by
/// multicast; to the one receiver by unicast) at `bps`.
fn uftp(receivers: &[Receiver], bps: u64, rtt: std::time::Duration) -> Vec<String> {
    let ids: Vec<String> = receivers.iter().map(|r| uftp_id(r.addr)).collect();
    let dest = if receivers.len() == 1 {
        receivers[0].addr.to_string()
    } else {
        UFTP_PUBLIC.to_string()
    };
    v(&[
        "uftp",
        "-M",
        &dest,
        "-P",
        UFTP_PRIVATE,
        "-I",
        longhaul_lab::topology::PORT_NAME,
        "-H",
        &ids.join(","),
        "-R",
        &(bps / 1000).max(1).to_string(),
        "-Y",
        "none",
        "-B",
        "8388608",
        "-r",
        &first_grtt(rtt),
        "-s",
        "10",
        "-x",
        "1",
    ])
}

/// uftpd in a receiver: into `dst`, its status lines to `status`.
fn uftpd(dst: &Path, status: &Path) -> Vec<String> {
    v(&[
        "uftpd",
        "-d",
        "-q",
        "-x",
        "1",
        "-I",
        longhaul_lab::topology::PORT_NAME,
        "-B",
        "8388608",
        "-D",
        &p(dst),
        "-F",
        &p(status),
    ])
}

/// A receiver's UFTP client id: its address.
fn uftp_id(addr: std::net::Ipv4Addr) -> String {
    format!("0x{:08X}", u32::from(addr))
}

/// uftp -r: the first group round-trip estimate must cover the path, or
/// the announce phase ends before a far receiver registers.
fn first_grtt(rtt: std::time::Duration) -> String {
    format!("{:.3}:0.001:15", (rtt.as_secs_f64() * 1.5).max(0.01))
}
