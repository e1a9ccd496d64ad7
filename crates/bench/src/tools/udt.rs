//! The `udt` tool of the lab: UDT4 (Debian's libudt 4.11) through the
//! library's own example programs, `sendfile` (server) and `recvfile`
//! (client), built from the sources libudt-dev ships. One UDT connection per
//! file; the client fetches up to `cc` files at once.

use super::*;

/// UDT4's example sendfile server and recvfile client.
pub(super) struct Udt;

/// The example server's port (its default; UDP).
const PORT: u16 = 9000;
/// Where libudt-dev puts the examples' sources.
const EXAMPLES: &str = "/usr/share/doc/libudt-dev/examples";

impl Adapter for Udt {
    fn name(&self) -> &'static str {
        "udt"
    }

    fn describe(&self) -> &'static str {
        "UDT4 (libudt 4.11): the library's example sendfile server and recvfile client, one UDT connection per file, 4 files at once"
    }

    fn settings(&self) -> &'static [Setting] {
        &[(
            "cc",
            "files fetched at once (a recvfile process and UDT connection each), default 4",
            count_1_to_64,
        )]
    }

    fn programs(&self) -> &'static [&'static str] {
        &["udt-sendfile", "udt-recvfile"]
    }

    fn packages(&self) -> &'static [&'static str] {
        &["libudt-dev", "g++"]
    }

    fn version_command(&self) -> &'static [&'static str] {
        &[
            "dpkg-query",
            "-W",
            "-f",
            "libudt ${Version}\\n",
            "libudt-dev",
        ]
    }

    fn sources(&self) -> &'static [Source] {
        // The examples' own Makefile builds them with -DLINUX and links
        // libudt and pthreads; nothing else is changed.
        const FLAGS: &[&str] = &["-O2", "-DLINUX", "-I/usr/include/udt"];
        const LIBS: &[&str] = &["-ludt", "-lpthread"];
        &[
            Source {
                program: "udt-sendfile",
                file: "sendfile.cpp",
                dir: EXAMPLES,
                package: "libudt-dev",
                flags: FLAGS,
                libs: LIBS,
            },
            Source {
                program: "udt-recvfile",
                file: "recvfile.cpp",
                dir: EXAMPLES,
                package: "libudt-dev",
                flags: FLAGS,
                libs: LIBS,
            },
        ]
    }

    fn commands(&self, s: &Setup) -> Result<Commands> {
        let a = s.server.to_string();
        // Where the runner builds them, unless they are on the PATH.
        let path = |prog: &str| p(&which(prog).unwrap_or_else(|| Path::new(BUILT).join(prog)));
        let (send, recv) = (path("udt-sendfile"), path("udt-recvfile"));
        // The examples have no listing: the client is given the files'
        // names, as one would give them to scp.
        let list = s.run.join("files.txt");
        std::fs::write(&list, file_names(s.src)?.join("\n") + "\n")?;
        // sendfile binds 0.0.0.0:PORT (in the server host) and serves any
        // path it is asked for.
        let daemon = s.server_daemon(v(&[&send, &PORT.to_string()]), Proto::Udp, PORT);
        let cc = get(s.settings, "cc", "4").to_string();
        Ok(Commands {
            daemons: vec![daemon],
            actors: s.per_receiver(&|_, r| {
                // One recvfile per file, `cc` at once. recvfile exits 255
                // on an error, on which xargs would stop at once and leave
                // the others running: a failure exits 1 instead, so xargs
                // waits for every fetch and then fails (123).
                let fetch = format!(
                    "mkdir -p -- \"$(dirname -- \"$1\")\" && {} {a} {PORT} {}/\"$1\" \"$1\" || exit 1",
                    sh_quote(&recv),
                    sh_quote(&p(s.src)),
                );
                let script = format!(
                    "cd {} && xargs -d '\\n' -a {} -n 1 -P {cc} sh -c {} fetch",
                    sh_quote(&p(&r.dst)),
                    sh_quote(&p(&list)),
                    sh_quote(&fetch),
                );
                v(&["sh", "-c", &script])
            }),
        })
    }
}
