//! The `ftp` tool of the lab: vsftpd (anonymous), lftp mirror --parallel=4 (MDTM off: one round trip less per file).

use super::*;

/// vsftpd (anonymous), lftp mirror --parallel=4 (MDTM off: one round trip less per file).
pub(super) struct Ftp;

impl Adapter for Ftp {
    fn name(&self) -> &'static str {
        "ftp"
    }

    fn describe(&self) -> &'static str {
        "vsftpd (anonymous), lftp mirror --parallel=4 (MDTM off: one round trip less per file)"
    }

    fn settings(&self) -> &'static [Setting] {
        &[(
            "parallel",
            "lftp mirror --parallel, default 4",
            count_1_to_64,
        )]
    }

    fn programs(&self) -> &'static [&'static str] {
        &["vsftpd", "lftp"]
    }

    fn packages(&self) -> &'static [&'static str] {
        &["vsftpd", "lftp"]
    }

    fn version_command(&self) -> &'static [&'static str] {
        &["lftp", "--version"]
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        Ok({
            let conf = s.run.join("vsftpd.conf");
            std::fs::create_dir_all("/var/run/vsftpd/empty")?;
            std::fs::write(
                &conf,
                format!(
                    "listen=YES\nlisten_ipv6=NO\nbackground=NO\nlisten_address={a}\n\
                 listen_port=21\nanonymous_enable=YES\nlocal_enable=NO\n\
                 no_anon_password=YES\nanon_root={}\nwrite_enable=NO\n\
                 pasv_enable=YES\npasv_address={a}\npasv_min_port=30000\n\
                 pasv_max_port=30999\nmax_clients=0\nmax_per_ip=0\n\
                 use_sendfile=YES\nseccomp_sandbox=NO\n\
                 secure_chroot_dir=/var/run/vsftpd/empty\nxferlog_enable=NO\n",
                    p(s.src)
                ),
            )?;
            Commands {
                daemons: vec![s.server_daemon(v(&["vsftpd", &p(&conf)]), Proto::Tcp, 21)],
                actors: s.per_receiver(&|_, r| {
                    let script = format!(
                        "set cmd:fail-exit yes; set net:max-retries 2; set net:timeout 60; \
                     set xfer:clobber on; set ftp:use-mdtm off; open ftp://{a}; \
                     mirror --parallel={} . {}",
                        get(s.settings, "parallel", "4"),
                        lftp_quote(&p(&r.dst))
                    );
                    v(&["lftp", "-c", &script])
                }),
            }
        })
    }
}

/// Double-quotes `s` for an lftp command line.
fn lftp_quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', r"\\").replace('"', "\\\""))
}
