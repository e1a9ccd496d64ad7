//! The `gridftp` tool of the lab: globus-gridftp-server (anonymous, no certificates), globus-url-copy -fast -pp -cc 4 -p 4 -r -cd.
//! With `udt=yes`, GridFTP over UDT: GSI servers (certificates made per run)
//! in the server and in every receiver, whose data channels default to the UDT
//! driver, and a third-party transfer between them.

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
                "udt",
                "data over UDT (libglobus-xio-udt-driver) instead of TCP: GSI servers in the server and each receiver, certificates made per run, a third-party transfer between them, stream mode with -cc files at once (-p, -fast and -pp hang over UDT); default no",
                yes_no,
            ),
            (
                "tcp-bs",
                "globus-url-copy -tcp-bs: socket buffer size (capped by the host's net.core.rmem_max), default none",
                size,
            ),
            (
                "rst",
                "yes: restart a failed transfer where it stopped (-rst -rst-retries 0 -rst-interval 2 -rst-timeout 900: retries every 2 s for up to 15 minutes), for paths that go down; a stalled one is left to TCP (with 10.12, -stall-timeout aborts for good instead of restarting); default no",
                yes_no,
            ),
        ]
    }

    fn programs(&self) -> &'static [&'static str] {
        &["globus-gridftp-server", "globus-url-copy", "openssl"]
    }

    fn packages(&self) -> &'static [&'static str] {
        &[
            "globus-gridftp-server-progs",
            "globus-gass-copy-progs",
            "libglobus-xio-udt-driver",
            "openssl",
        ]
    }

    fn version_command(&self) -> &'static [&'static str] {
        &["globus-url-copy", "-version"]
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        if get(s.settings, "udt", "no") == "yes" {
            return udt_commands(s);
        }
        let a = s.server.to_string();
        Ok({
            // Anonymous clear-text GridFTP: the server drops to the `ftp`
            // user, so the data set must be world-readable (it is).
            Commands {
                daemons: vec![s.server_daemon(
                    server_argv(
                        &a,
                        &s.run.join("gridftp.log"),
                        &["-aa", "-anonymous-user", "ftp"],
                    ),
                    Proto::Tcp,
                    2811,
                )],
                actors: s.per_receiver(&|_, r| {
                    let mut argv = vec!["globus-url-copy".to_string()];
                    argv.extend(client_options(s.settings));
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

/// globus-gridftp-server on `addr`:2811, logging errors and warnings to
/// `log`, with `how`: its authentication and data-channel options.
fn server_argv(addr: &str, log: &Path, how: &[&str]) -> Vec<String> {
    let mut argv = v(&[
        "globus-gridftp-server",
        "-c",
        "/dev/null",
        "-p",
        "2811",
        "-control-interface",
        addr,
        "-data-interface",
        addr,
    ]);
    argv.extend(v(how));
    argv.extend(v(&[
        "-d",
        "error,warn",
        "-l",
        &p(log),
        "-disable-usage-stats",
    ]));
    argv
}

/// globus-url-copy's options from the settings. Defaults: data channels kept
/// open, 4 files in flight on pipelined connections, 4 streams per file: 10 s
/// for 400 files of 10 kB at 70 ms, where `-p 4 -pp` alone needs over 30.
fn client_options(st: &Settings) -> Vec<String> {
    let mut argv = Vec::new();
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
    if get(st, "rst", "no") == "yes" {
        argv.extend(v(&RESTART));
    }
    argv
}

/// `gridftp:rst=yes`: restart a transfer that failed (a connection that
/// broke), from its restart markers, every 2 s, for up to 15 minutes. No
/// `-stall-timeout`: tried in the lab (100 Mbit/s, 70 ms, the link down 30 s
/// from 3 s into a 100 MB pull), globus-url-copy 10.12 with `-rst
/// -stall-timeout 15` stopped 15 s into the outage with "the operation was
/// aborted" and did not restart, single file or `-r`, with or without `-pp
/// -cc 4`; without it the TCP connections wait the outage out and the pull
/// completed (59 s).
const RESTART: [&str; 7] = [
    "-rst",
    "-rst-retries",
    "0",
    "-rst-interval",
    "2",
    "-rst-timeout",
    "900",
];

/// The subject of the lab's host certificate (every GSI server's).
const HOST_SUBJECT: &str = "/O=longhaul lab/CN=gridftp-host";
/// The subject of the lab's user certificate, mapped to `ftp`.
const USER_SUBJECT: &str = "/O=longhaul lab/CN=gridftp-user";

/// GridFTP over UDT. globus-url-copy applies a data-channel stack only
/// between two servers (`-dcstack` says "both must be gridftp servers"; for a
/// `file://` end nothing is sent, and `-udt` is ignored: notes/peer-tools.md),
/// and a server changes its stack only for an authenticated (GSI) session.
/// So: a GSI server in the server host and one in each receiver, both with
/// `-dc-default udt`, and each receiver's client moves the tree from the
/// first to its own in a third-party transfer (data over UDT between the
/// servers, the client only on the control channels).
fn udt_commands(s: &Setup) -> Result<Commands> {
    // Extended block mode (MODE E: `-p`, `-fast`, `-pp`) over the UDT driver
    // hangs after the first block here (tried by hand in the lab: each of
    // them alone stalls a 5 MB file that stream mode moves at once), so this
    // runs in stream mode with `-cc` files at once.
    for k in ["p", "fast", "pp", "tcp-bs", "rst"] {
        if s.settings.contains_key(k) {
            bail!("gridftp: {k}= does not apply with udt=yes (stream mode, -cc files at once, no restart)");
        }
    }
    let gsi = Gsi::make(&s.run.join("gsi"))?;
    let server = |addr: &str, log: &Path| {
        let mut argv = gsi.env(&gsi.host);
        argv.extend(v(&[&format!("GRIDMAP={}", p(&gsi.gridmap))]));
        argv.extend(server_argv(
            addr,
            log,
            &[
                "-dc-whitelist",
                "udt,gsi,tcp",
                "-dc-default",
                "udt",
                "-allow-udt",
            ],
        ));
        argv
    };
    let a = s.server.to_string();
    let mut daemons =
        vec![s.server_daemon(server(&a, &s.run.join("gridftp.log")), Proto::Tcp, 2811)];
    let ftp = ftp_uid()?;
    for (i, r) in s.receivers.iter().enumerate() {
        // The receiver's server writes as the mapped user.
        std::os::unix::fs::chown(&r.dst, Some(ftp), None)?;
        daemons.push(Daemon {
            proc: Proc {
                host: Host::Receiver(i),
                argv: server(
                    &r.addr.to_string(),
                    &s.run.join(format!("gridftp-rx{i}.log")),
                ),
                cwd: None,
            },
            ready: (Proto::Tcp, 2811),
        });
    }
    // The client is given the files (`-f`, a source and a destination URL a
    // line), not `-r`: a listing is data-channel traffic between the source
    // server and the client itself, which has no UDT.
    let names = file_names(s.src)?;
    for d in std::iter::once(s.src).chain(s.receivers.iter().map(|r| r.dst.as_path())) {
        if p(d).contains(|c: char| c.is_whitespace() || "%#?".contains(c)) {
            bail!(
                "gridftp:udt=yes: {} cannot be written in a URL list as it is",
                p(d)
            );
        }
    }
    let mut lists = Vec::new();
    for (i, r) in s.receivers.iter().enumerate() {
        let list = s.run.join(format!("gsiftp-urls-{i}.txt"));
        let lines: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    "gsiftp://{a}:2811{}/{n} gsiftp://{}:2811{}/{n}",
                    p(s.src),
                    r.addr,
                    p(&r.dst)
                )
            })
            .collect();
        std::fs::write(&list, lines.join("\n") + "\n")?;
        lists.push(list);
    }
    Ok(Commands {
        daemons,
        actors: s.per_receiver(&|i, _| {
            let mut argv = gsi.env(&gsi.user);
            argv.extend(v(&[
                "globus-url-copy",
                "-cc",
                get(s.settings, "cc", "4"),
                "-ss",
                HOST_SUBJECT,
                "-ds",
                HOST_SUBJECT,
                "-nodcau",
                "-cd",
                "-f",
                &p(&lists[i]),
            ]));
            argv
        }),
    })
}

/// The uid of `ftp`, the user GSI maps the lab's certificate to (and the
/// anonymous GridFTP and FTP servers run as).
pub(crate) fn ftp_uid() -> Result<u32> {
    // SAFETY: getpwnam reads the user database; the entry is read at once,
    // before any other call could reuse its static storage.
    let pw = unsafe { libc::getpwnam(c"ftp".as_ptr()) };
    if pw.is_null() {
        bail!("no user 'ftp' (Debian's vsftpd creates it; or: adduser --system --group ftp)");
    }
    // SAFETY: not null, as checked.
    Ok(unsafe { (*pw).pw_uid })
}

/// A throw-away GSI setup: a CA, a host and a user certificate it signed,
/// the CA directory Globus reads (the CA under both of OpenSSL's subject
/// hashes, with a signing policy) and a grid-mapfile (user -> ftp).
struct Gsi {
    certs: PathBuf,
    host: (PathBuf, PathBuf),
    user: (PathBuf, PathBuf),
    gridmap: PathBuf,
}

impl Gsi {
    fn make(dir: &Path) -> Result<Gsi> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        let certs = dir.join("certificates");
        std::fs::create_dir_all(&certs)?;
        let openssl = |args: &[&str]| -> Result<String> {
            let o = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()?;
            if !o.status.success() {
                bail!(
                    "openssl {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                );
            }
            Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let ca_subject = "/O=longhaul lab/CN=longhaul lab CA";
        openssl(&[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", ca_subject,
        ])?;
        let signed = |name: &str, subject: &str| -> Result<(PathBuf, PathBuf)> {
            let (key, csr, pem) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
            );
            openssl(&[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                subject,
            ])?;
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
            ])?;
            // GSI refuses a key others may read.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.join(&key), std::fs::Permissions::from_mode(0o400))?;
            Ok((dir.join(pem), dir.join(key)))
        };
        let host = signed("host", HOST_SUBJECT)?;
        let user = signed("user", USER_SUBJECT)?;
        let policy = format!(
            "access_id_CA X509 '{ca_subject}'\npos_rights globus CA:sign\ncond_subjects globus '\"/O=longhaul lab/*\"'\n"
        );
        for flag in ["-subject_hash", "-subject_hash_old"] {
            let h = openssl(&["x509", "-in", "ca.pem", "-noout", flag])?;
            std::fs::copy(dir.join("ca.pem"), certs.join(format!("{h}.0")))?;
            std::fs::write(certs.join(format!("{h}.signing_policy")), &policy)?;
        }
        let gridmap = dir.join("grid-mapfile");
        std::fs::write(&gridmap, format!("\"{USER_SUBJECT}\" ftp\n"))?;
        Ok(Gsi {
            certs,
            host,
            user,
            gridmap,
        })
    }

    /// `env X509_USER_CERT=.. X509_USER_KEY=.. X509_CERT_DIR=..`: a command
    /// line's start that runs with the credential `(cert, key)`.
    fn env(&self, (cert, key): &(PathBuf, PathBuf)) -> Vec<String> {
        vec![
            "env".into(),
            format!("X509_USER_CERT={}", p(cert)),
            format!("X509_USER_KEY={}", p(key)),
            format!("X509_CERT_DIR={}", p(&self.certs)),
        ]
    }
}
