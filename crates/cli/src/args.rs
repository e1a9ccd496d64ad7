//! Command-line grammar. `--help` on each subcommand teaches its use.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

const EXIT_CODES: &str = "\
Exit status:
  0  every file arrived and verified (or was already there)
  2  usage error
  3  connection, trust or access problem (unknown/changed fingerprint, wrong token)
  4  remote error (path missing on the server, server-side I/O, read-only server)
  5  local I/O error (destination not writable, disk full; partials are kept for resume)
  6  verification failed (BLAKE3 mismatch; the bad partial is removed)
  1  anything else that stops a command (e.g. serve cannot bind its port)
  130  interrupted (Ctrl-C); rerun the same command to resume";

#[derive(Parser)]
#[command(
    name = "longhaul",
    version,
    about = "Move file trees fast over long fat networks, verified and resumable.",
    long_about = "longhaul moves file trees over QUIC: one connection, all requests at once, \
many streams, BLAKE3 verification of every file, resumable after any interruption.\n\n\
  longhaul serve --root /data                   # on the source host; prints its fingerprint\n\
  longhaul get srv:run42 ./                     # fetch /data/run42 into ./run42\n\
  longhaul put ./obs srv:incoming/              # send ./obs into /data/incoming/obs\n\
  longhaul demo                                 # local serve + get of generated data",
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve a directory tree to `get` and `put` clients.
    #[command(after_help = SERVE_HELP)]
    Serve(ServeArgs),
    /// Fetch files from a server: get [OPTIONS] HOST[:PORT]:REMOTE_PATH... LOCAL_DEST
    #[command(after_help = GET_HELP)]
    Get(GetArgs),
    /// Send files to a server: put [OPTIONS] LOCAL_PATH... HOST[:PORT]:REMOTE_DEST
    #[command(after_help = PUT_HELP)]
    Put(PutArgs),
    /// Run a local server and fetch a generated data set from it, printing the rate.
    Demo(DemoArgs),
    /// The WAN lab: emulated paths between network namespaces (root).
    Lab(crate::lab_args::LabArgs),
    /// One-to-many: send files to many receivers at once over UDP multicast, RaptorQ repair.
    Multicast(crate::multicast::McArgs),
    /// Print the completion script for a shell: `longhaul completions bash >
    /// /etc/bash_completion.d/longhaul` (zsh: a `_longhaul` file in $fpath;
    /// fish: ~/.config/fish/completions/longhaul.fish).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (longhaul.1, longhaul-get.1, ... one per command)
    /// into DIR, e.g. /usr/local/share/man/man1.
    Man {
        /// Where to write them.
        #[arg(value_name = "DIR")]
        dir: std::path::PathBuf,
    },
}

const GET_HELP: &str = "\
Examples:
  longhaul get --fingerprint SHA256:7vUb... src.example.org:run42 ./   # ./run42
  longhaul get src.example.org:9000:run42/ ./run42     # port 9000; contents of run42
  longhaul get --json src.example.org:run42 /data   # again: only what changed; a report
  longhaul get --ssh ann@src.example.org:run42 ./      # no daemon: started over ssh

HOST[:PORT]: the server (port 7878 unless given; IPv6 in brackets: [::1]:7878:run42).

Paths:
  REMOTE_PATH is relative to the server's --root ('.' or '' is the root itself);
  absolute paths and '..' are refused. Like rsync: 'srv:run42' lands as DEST/run42
  when DEST is a directory, 'srv:run42/' puts the contents of run42 into DEST. A
  single file fetched to a DEST that is not a directory is saved under that name.

Trust:
  The first connection to a server needs --fingerprint SHA256:... (as `longhaul serve`
  printed it) or --accept-new; it is then remembered in the known-hosts file. A
  changed fingerprint is always refused.

Resume and sync:
  Rerunning a command, interrupted or not, sends only what is missing: a file
  the destination already holds with the same size and mtime is skipped (as
  rsync's quick check), and a partial file (`.NAME.lh-part` and its journal
  beside the target) resumes with its missing chunks. --checksum compares BLAKE3
  instead of size and mtime; --overwrite sends every file again.

Symlinks are copied as links, their targets unchanged (also absolute ones);
nothing is ever written through a link in the destination.

Over ssh (--ssh, --ssh-command CMD):
  No daemon, no fingerprint to copy: longhaul runs `longhaul serve --once` on
  the far host with your ssh login (keys, agent, ~/.ssh/config as ssh has them),
  learns its UDP port, fingerprint and a one-time token over ssh, and moves the
  data over UDP. HOST is ssh's [USER@]HOST; REMOTE_PATH is relative to the remote
  home, absolute paths and '..' allowed, as with scp. The remote server exits
  with the transfer, or when ssh ends. UDP must reach the far host: the port is
  any free one, or one of --port-range. Needs longhaul in the remote PATH (or
  --longhaul-path).
    longhaul get --ssh-command 'ssh -p 2222 -i ~/.ssh/lab' ann@srv:/data/run42 .

Exit status: 0 ok, 2 usage, 3 connection/trust, 4 remote error, 5 local I/O,
6 verification, 24 only source files vanished meanwhile, 1 other,
130 interrupted.";

const PUT_HELP: &str = "\
Examples:
  longhaul put ./obs dst.example.org:incoming/        # stores incoming/obs
  longhaul put ./obs/ dst.example.org:mirror   # contents of obs; again: only what changed
  longhaul put --ssh ./obs ann@dst.example.org:incoming/   # no daemon: over ssh

HOST[:PORT]: the server (port 7878 unless given; IPv6 in brackets).

Paths:
  REMOTE_DEST is relative to the server's --root. 'put ./obs srv:in/' stores
  in/obs; 'put ./obs/ srv:in' stores the contents of obs in 'in'; a single file to a
  REMOTE_DEST that is not a directory is stored under that name.

Over ssh: as for get (see `longhaul get --help`); REMOTE_DEST is relative to
the remote home.

Resume and sync: as for get, on the server's side: a rerun skips the files the
server holds with the same size and mtime (--checksum: the same BLAKE3) and
sends only the chunks it lacks of the others; --overwrite sends every file again.

Exit status: 0 ok, 2 usage, 3 connection/trust, 4 remote error, 5 local I/O,
6 verification, 24 only source files vanished meanwhile, 1 other,
130 interrupted.";

const SERVE_HELP: &str = "\
Access:
  (no token)            read-only: anyone who can reach the UDP port may get
                        any file beneath --root; every put is refused
  --token-file F        a client must send this token (its --token-file, or
                        LONGHAUL_TOKEN); it may get and put
  --read-token-file R   a token that may only get; with --token-file, either
                        token is accepted, each for what it may do
  --read-only           no put from anyone, whatever the token
  --allow-anonymous-put anyone who can reach the port may put (closed test
                        networks only)
  Wrong tokens slow their sender down (refused for 1 s, doubling to 60 s).
  `longhaul serve --new-token FILE` writes a strong token.

Listening: 0.0.0.0:7878 by default, every IPv4 address of the host (the banner
  names them); `--listen 127.0.0.1:7878` serves this host alone.

Examples:
  longhaul serve --root /data                                  # read-only to all
  longhaul serve --new-token /etc/longhaul/token
  longhaul serve --root /data --token-file /etc/longhaul/token  # token holders read and write
  longhaul serve --root /data --token-file rw.token --read-token-file ro.token

Exit status: 0 stopped (Ctrl-C), 1 cannot bind or open the root, 2 usage.";

#[derive(Args)]
pub struct ServeArgs {
    /// Directory to serve; every path is confined beneath it.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present_any = ["print_fingerprint", "new_token"]
    )]
    pub root: Option<PathBuf>,
    /// UDP address to listen on [default: 0.0.0.0:7878; with --once, the
    /// address the ssh session came in on (SSH_CONNECTION), any free port].
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// Serve one session, then exit: what `get --ssh` and `put --ssh` start
    /// on the far side. Makes a fresh key (in a temporary directory, unless
    /// --state-dir) and a fresh token (unless --token-file), prints one line
    /// of JSON for the client (port, fingerprint, token, working directory),
    /// and exits when the session ends, when its standard input closes (the
    /// ssh session ended), or when no client has come within 60 s.
    #[arg(long)]
    pub once: bool,
    /// Worker threads of the server's runtime [default: one per core; one
    /// with --once]. A client over ssh with --connections N asks for N.
    #[arg(long, value_name = "N", hide = true)]
    pub workers: Option<usize>,
    /// UDP ports to take the first free one of (LOW-HIGH), for firewalls
    /// that open a range.
    #[arg(long, value_name = "LOW-HIGH", conflicts_with = "listen")]
    pub port_range: Option<String>,
    /// Refuse `put` from everyone, whatever their token.
    #[arg(long, conflicts_with = "allow_anonymous_put")]
    pub read_only: bool,
    /// DANGEROUS: let clients without a token put files into --root.
    /// Without a token a server is read-only; with this, anyone who can
    /// reach its UDP port can write there. For closed test networks only:
    /// elsewhere give writers a token (--token-file).
    #[arg(long, conflicts_with_all = ["token_file", "read_token_file", "once"])]
    pub allow_anonymous_put: bool,
    /// Keep the setuid, setgid and sticky bits and write access for all of
    /// what clients put, exactly as sent (by default dropped: a mode within
    /// 0775).
    #[arg(long)]
    pub exact_modes: bool,
    /// Give what clients put the owner and group they send (by name, or
    /// by number with the client's --numeric-ids), when this server runs as
    /// root. By default a put's files belong to the server's user: a client
    /// cannot give files to other users of this host. (A one-shot server
    /// started over ssh keeps them: it runs as the login that asked.)
    #[arg(long)]
    pub keep_owners: bool,
    /// Sessions served at once; more clients are refused with "the server
    /// is busy" (exit 3) rather than letting memory run out (a session can
    /// hold its windows, up to --window, and some tens of MB). 0: no limit.
    #[arg(long, value_name = "N", default_value_t = longhaul_quic::DEFAULT_MAX_SESSIONS)]
    pub max_sessions: usize,
    /// Memory for data sent and not yet acknowledged, all sessions together
    /// (bytes: 256MiB, 1GiB; 0: no shared bound). A session's send window
    /// grows with its path only from what is free, up to an even share; it
    /// is also what a session holds for a client that vanished, until the
    /// idle timeout. One transfer of 1 Gbit/s over a 1 s lossy path wants
    /// about 500MB [default: 256MiB].
    #[arg(long, value_name = "BYTES")]
    pub send_buffer: Option<String>,
    /// How long the part of a file a put left unfinished is kept for its
    /// resume (a duration: 7d, 12h; 0: not kept). A part with nothing in it
    /// is never kept. Parts a session is receiving are not touched.
    #[arg(long, value_name = "DURATION", default_value = "7d")]
    pub keep_parts_for: String,
    /// What one client's unfinished parts may hold on disk in all (a size,
    /// 1TiB, or a share of the root's file system, 25%); past it its oldest
    /// go (a client is an address; an IPv6 one by its /64).
    #[arg(long, value_name = "SIZE|N%", default_value = "25%")]
    pub keep_parts_per_client: String,
    /// What all clients' unfinished parts may hold on disk in all (a size or
    /// a share of the root's file system); past it the oldest go.
    #[arg(long, value_name = "SIZE|N%", default_value = "50%")]
    pub keep_parts: String,
    /// Require a token; this one (file content, trailing newline ignored)
    /// may get and put. Also LONGHAUL_TOKEN.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Require a token; this one (file content) may only get: hand it to
    /// those who should read but not write. With --token-file, either
    /// token is accepted, each for what it may do.
    #[arg(long, value_name = "FILE")]
    pub read_token_file: Option<PathBuf>,
    /// Where the server keeps its key and certificate [default: $XDG_STATE_HOME/longhaul/server].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print the server's fingerprint (creating its identity if needed) and exit.
    #[arg(long)]
    pub print_fingerprint: bool,
    /// Write a new random token (256 bits, hex) to FILE, readable by its
    /// owner only, and exit; serve with `--token-file FILE` and give clients
    /// the same file. Refuses to overwrite a file.
    #[arg(long, value_name = "FILE", conflicts_with = "print_fingerprint")]
    pub new_token: Option<PathBuf>,
    #[command(flatten)]
    pub net: NetArgs,
}

/// Transport knobs shared by `serve`, `get` and `put`.
#[derive(Args)]
pub struct NetArgs {
    /// Data streams the sending side uses at once [default: 4]. For `get`
    /// the server sends: the client asks it for N (at most 64), and without
    /// --streams the server uses its own --streams.
    #[arg(long, value_name = "N")]
    pub streams: Option<usize>,
    /// Congestion control when sending [default: wan]: wan / wan:HINT
    /// (longhaul's controller for long lossy paths: random loss is not read as
    /// congestion; it starts at HINT, else at --max-rate, else at the rate
    /// remembered for the server, else measures from scratch; beside TCP flows
    /// that keep a queue it shares the way CUBIC does), fair (that CUBIC mode
    /// always), bbr, cubic, reno (quinn's), or fixed:RATE (dedicated links:
    /// RATE whatever the loss). For `get` the server sends, and applies the
    /// client's choice.
    #[arg(long, value_name = "CC")]
    pub cc: Option<String>,
    /// Cap the sending rate (bits/s: 400M, 1G, 2.5Gbit; or bytes/s: 50MB/s); a
    /// server caps every session.
    #[arg(long, value_name = "RATE")]
    pub max_rate: Option<String>,
    /// Memory bound of the receive and send windows (bytes: 64MiB, 1GiB, 500MB);
    /// they grow with the measured BDP up to it [default: 1GiB].
    #[arg(long, value_name = "BYTES")]
    pub window: Option<String>,
}

#[derive(Args)]
pub struct TransferArgs {
    /// Known-hosts file [default: $XDG_CONFIG_HOME/longhaul/known_hosts].
    /// Beside it, FILE.resume (mode 0600) keeps each known server's session
    /// tickets and address-validation tokens, so the next transfer with it
    /// sends its request in its first flight (QUIC 0-RTT: the first data one
    /// round trip after the start, not two; a put's files go with it, unless
    /// it put the same targets there lately); `--json` says `zero_rtt` and
    /// `early_files`.
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// Trust the server only if its fingerprint is this (SHA256:...).
    #[arg(long, value_name = "SHA256:...")]
    pub fingerprint: Option<String>,
    /// Trust a server seen for the first time and remember it.
    #[arg(long)]
    pub accept_new: bool,
    /// The rate memory: the best second of large uncapped `wan` transfers of large files
    /// with each server (per direction), the start of the next one's `wan` (when
    /// neither wan:HINT nor --max-rate gives one)
    /// [default: $XDG_STATE_HOME/longhaul/rates].
    #[arg(long, value_name = "FILE")]
    pub rates: Option<PathBuf>,
    /// Neither use nor update the rate memory.
    #[arg(long, conflicts_with = "rates")]
    pub no_rates: bool,
    /// Send this token (file content); also LONGHAUL_TOKEN.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Skip files whose size and mtime already match at the destination: the
    /// default now, accepted so that older scripts still run.
    #[arg(long, hide = true, conflicts_with = "overwrite")]
    pub sync: bool,
    /// Skip a file only if the destination's copy has the same BLAKE3 hash
    /// (read on both sides), not the same size and mtime.
    #[arg(long, conflicts_with = "overwrite")]
    pub checksum: bool,
    /// Send every file again, even one the destination already holds (a
    /// partial file still resumes from its journal).
    #[arg(long)]
    pub overwrite: bool,
    /// Do not wait for the disk. By default the receiving side (on `put`,
    /// the server) gives a file its name only once its data is on disk
    /// (one fdatasync, or one syncfs for the files verified meanwhile), and
    /// syncs the destination before it reports success: a power cut never
    /// leaves a named file with missing data, and exit 0 means durable.
    /// With --no-fsync the page cache decides when data reaches the disk.
    #[arg(long)]
    pub no_fsync: bool,
    /// Keep the setuid, setgid and sticky bits and write access for all of
    /// the files and directories received, exactly as sent. By default they
    /// are dropped (a mode within 0775), as sftp and rsync without -p do:
    /// the far side cannot plant a setuid or world-writable file. On a get
    /// this side receives; on `put --ssh` the one-shot server does; a plain
    /// put cannot ask (the server decides: `serve --exact-modes`).
    #[arg(long)]
    pub exact_modes: bool,
    /// Leave out what matches PATTERN (rsync's rules: `*.tmp` at any depth,
    /// `/top` anchored at the transfer's root, `cache/` directories only,
    /// `**` across directories, `dir/***` a directory and all beneath); a
    /// directory left out is not walked. Repeatable; with --include and
    /// --exclude-from, the first rule that matches decides, in the order
    /// given.
    #[arg(long, value_name = "PATTERN", value_parser = clap::value_parser!(std::ffi::OsString))]
    pub exclude: Vec<std::ffi::OsString>,
    /// Send what matches PATTERN even if a later --exclude would leave it
    /// out (rsync's --include).
    #[arg(long, value_name = "PATTERN", value_parser = clap::value_parser!(std::ffi::OsString))]
    pub include: Vec<std::ffi::OsString>,
    /// Exclude rules from FILE, one pattern a line (`+ PATTERN` includes,
    /// `- PATTERN` excludes; blank lines and lines starting with `#` or `;`
    /// are skipped), as rsync's --exclude-from.
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,
    /// The rules above, in the order given (filled in after parsing).
    #[arg(skip)]
    pub filters: Vec<longhaul_transfer::filter::Rule>,
    /// Remove what the destination's directories hold that the source's do
    /// not (a mirror, as rsync's --delete): within the directories
    /// transferred, never above them, and nothing that --exclude leaves
    /// out (those stay, as in rsync). Nothing is removed when part of the
    /// source could not be read. Each path removed is listed (`deleting
    /// PATH`; --json `changes`).
    #[arg(long)]
    pub delete: bool,
    /// Write nothing anywhere: list what the transfer would do, one line a
    /// change as `rsync -n -i` does (`>f+++++++++ new`, `>f.st...... changed`,
    /// `cd+++++++++ dir/`, `*deleting gone`; `<` on a put), and exit 0.
    /// Files are compared as a real run would (size and mtime, or
    /// --checksum, which reads both sides; --overwrite lists them all).
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Send each file's and directory's extended attributes and set them
    /// at the destination (rsync's -X): the `user.*` namespace, and as
    /// root `trusted.*` and `security.*` too, which the receiving side
    /// sets only as root with --exact-modes (a file capability is a
    /// privilege, like a setuid bit). Where the destination cannot hold
    /// them the run says so.
    #[arg(long, short = 'X')]
    pub xattrs: bool,
    /// Send POSIX ACLs (access and default) and set them at the
    /// destination (rsync's -A); their entries keep their numeric ids.
    #[arg(long, short = 'A')]
    pub acls: bool,
    /// Give received files the owner and group numbers sent, not the
    /// local ids of the names sent (rsync's --numeric-ids). Owners and
    /// groups are kept whenever the receiving side runs as root (a get as
    /// root; a put to a server started with --keep-owners, or over ssh as
    /// root), as rsync -a does.
    #[arg(long)]
    pub numeric_ids: bool,
    /// Make the FIFOs and Unix sockets' names of the tree at the
    /// destination (rsync's --specials; a socket's name, not a listening
    /// socket). Without it each is listed as not made (summary and
    /// --json `not_made`), never dropped silently.
    #[arg(long)]
    pub specials: bool,
    /// Make the character and block device nodes of the tree on a get
    /// (rsync's --devices; as root: else each fails, exit 5). A put's
    /// server never makes device nodes; they are listed as not made.
    #[arg(long)]
    pub devices: bool,
    /// Durable files are the default now: accepted so that older scripts
    /// still run.
    #[arg(long, hide = true, conflicts_with = "no_fsync")]
    pub fsync: bool,
    /// Run the transfer over N QUIC connections (at most 16), each with its
    /// own socket, controller and thread, its data streams spread over them:
    /// for hosts where one core cannot keep up with the link (10 Gbit/s).
    /// Each connection runs its own congestion control, so N take about N
    /// shares of a shared bottleneck. No rate memory is used or kept
    /// [default: 1].
    #[arg(long, value_name = "N")]
    pub connections: Option<usize>,
    /// When the connection is lost mid-transfer (a dead link, a route flap,
    /// a server restarting), try to reconnect for up to this long and, once
    /// back, resume where it stopped: placed files and journaled chunks do
    /// not cross again. Counted from each loss (found after 15 to 20 s of
    /// silence); `0` fails at once with exit 3. The first connection of a
    /// run is not retried.
    #[arg(long, value_name = "DURATION", default_value = "10m",
          value_parser = crate::multicast::parse_duration)]
    pub retry_for: std::time::Duration,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub ssh: SshArgs,
    /// Print one JSON document with per-file results and totals on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress bar and no summary (errors still go to stderr).
    #[arg(long, short)]
    pub quiet: bool,
}

/// Starting the far side over ssh.
#[derive(Args, Clone)]
pub struct SshArgs {
    /// Reach the far host over ssh: run `longhaul serve --once` there with
    /// your ssh login, and move the data over QUIC (UDP) to the port it
    /// reports. HOST is then ssh's [USER@]HOST, paths are relative to the
    /// remote home (absolute allowed), and nothing needs to be trusted by
    /// hand: the server's fingerprint and a one-time token come back over
    /// ssh. The known-hosts file is not used.
    #[arg(long)]
    pub ssh: bool,
    /// The ssh command to run, with its options (as rsync's -e; implies
    /// --ssh) [default: ssh].
    #[arg(long, value_name = "CMD")]
    pub ssh_command: Option<String>,
    /// The longhaul binary on the remote host (implies --ssh) [default:
    /// longhaul, in the remote PATH].
    #[arg(long, value_name = "PATH")]
    pub longhaul_path: Option<String>,
    /// UDP ports the remote server may listen on (LOW-HIGH), for firewalls
    /// that open a range (implies --ssh) [default: any free port].
    #[arg(long, value_name = "LOW-HIGH")]
    pub port_range: Option<String>,
}

impl SshArgs {
    /// Whether the far side is reached over ssh.
    pub fn on(&self) -> bool {
        self.ssh
            || self.ssh_command.is_some()
            || self.longhaul_path.is_some()
            || self.port_range.is_some()
    }
}

#[derive(Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub t: TransferArgs,
    /// Move only shard K of N of the transfer (1/4 .. 4/4), so that N
    /// processes on several hosts sharing DEST's file system move it
    /// together: each a byte-balanced part (whole small files, chunk ranges
    /// of large ones), every byte once, the last shard of a file naming it
    /// once all its parts are checked. `auto` reads the launcher's index:
    /// LONGHAUL_SHARD=K/N, a Slurm array or step, Open MPI, MPICH, or a
    /// Kubernetes Indexed Job with `auto/N`. Rerun a failed shard alone.
    /// `finish`, once every shard is done: check the whole tree by BLAKE3
    /// on both sides (sending again what differs), set the directories'
    /// times, make the hard links and remove the plan.
    #[arg(long, value_name = "K/N|auto|auto/N|finish")]
    pub shard: Option<String>,
    /// Where the shards share the listing they all plan from: the first
    /// shard lists the source and writes it, the others read it (default:
    /// DEST/.longhaul.lh-plan; DEST must then be a directory). Remove it
    /// before a new transfer of a changed source.
    #[arg(long, value_name = "FILE", requires = "shard")]
    pub plan: Option<PathBuf>,
    /// HOST[:PORT]:REMOTE_PATH... LOCAL_DEST
    #[arg(required = true, num_args = 2.., value_name = "PATHS", allow_hyphen_values = false)]
    pub paths: Vec<std::ffi::OsString>,
}

#[derive(Args)]
pub struct PutArgs {
    #[command(flatten)]
    pub t: TransferArgs,
    /// Move only shard K of N of the put (1/4 .. 4/4), so that N processes
    /// on several hosts sharing the source's file system, sending to
    /// servers that share the destination's, move it together: each a
    /// byte-balanced part, every byte once; the servers share the plan in
    /// the destination (`.longhaul.lh-plan`). `auto` reads the launcher's
    /// index as a get's does; `finish`, once every shard is done: every file
    /// checked by BLAKE3, the hard links and directory times made, the plan
    /// removed.
    #[arg(long, value_name = "K/N|auto|auto/N|finish")]
    pub shard: Option<String>,
    /// LOCAL_PATH... HOST[:PORT]:REMOTE_DEST
    #[arg(required = true, num_args = 2.., value_name = "PATHS")]
    pub paths: Vec<std::ffi::OsString>,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Work directory (default: a temporary directory, removed afterwards).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Size of the large file (SI units: 256MB; binary ones if written: 256MiB).
    #[arg(long, value_name = "SIZE", default_value = "256MB", value_parser = parse_size)]
    pub big: u64,
    /// Number of 10 kB files.
    #[arg(long, default_value_t = 2000)]
    pub small: u64,
    /// Print the JSON report of the get.
    #[arg(long)]
    pub json: bool,
}

/// Parse a byte size (the grammar of [`longhaul_transfer::units`]: `64MiB`,
/// `1GiB`, `500MB`, `1048576`); not 0.
pub fn parse_size(s: &str) -> Result<u64, String> {
    match longhaul_transfer::units::parse_size(s) {
        Ok(0) => Err(format!("{s:?}: a size must be more than 0")),
        r => r.map_err(|e| e.to_string()),
    }
}

/// The `--exclude`, `--include` and `--exclude-from` rules of a get or a
/// put, in the order they were given (clap keeps each flag's values apart;
/// their positions give the order).
pub fn ordered_filters(
    m: &clap::ArgMatches,
) -> anyhow::Result<Vec<longhaul_transfer::filter::Rule>> {
    use longhaul_transfer::filter::{parse_exclude_from, Action, Rule};
    use std::os::unix::ffi::OsStrExt;
    let mut at: Vec<(usize, usize, Rule)> = Vec::new();
    for (id, action) in [("exclude", Action::Exclude), ("include", Action::Include)] {
        if let (Some(idx), Some(vals)) = (m.indices_of(id), m.get_many::<std::ffi::OsString>(id)) {
            for (i, v) in idx.zip(vals) {
                let pattern = v.as_bytes().to_vec();
                at.push((i, 0, Rule { action, pattern }));
            }
        }
    }
    if let (Some(idx), Some(files)) = (
        m.indices_of("exclude_from"),
        m.get_many::<PathBuf>("exclude_from"),
    ) {
        for (i, f) in idx.zip(files) {
            let text = std::fs::read(f)
                .map_err(|e| crate::usage(format!("--exclude-from {}: {e}", f.display())))?;
            for (k, r) in parse_exclude_from(&text).into_iter().enumerate() {
                at.push((i, k, r));
            }
        }
    }
    at.sort_by_key(|(i, k, _)| (*i, *k));
    let rules: Vec<Rule> = at.into_iter().map(|(_, _, r)| r).collect();
    longhaul_transfer::filter::Filter::new(&rules).map_err(|e| crate::usage(e.to_string()))?;
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("256M").unwrap(), 256_000_000);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("0").is_err());
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
