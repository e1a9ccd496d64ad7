//! Grammar of `longhaul lab ...`.

use clap::{Args, Subcommand};
use std::path::PathBuf;

pub const LAB_HELP: &str = "\
The lab emulates wide-area paths on this machine: each host is a network namespace
with one address (10.77.0.1, .2, ... in --hosts order), and an emulator process
joins them through per-host links with delay, jitter, loss, rate and a queue.
Needs root.

  longhaul lab up --hosts srv,cli --link 'rate=1G delay=35ms loss=1e-3'
  longhaul lab exec cli -- ping -c 3 srv        # RTT 70 ms
  longhaul lab stats                             # counters per host and direction
  longhaul lab down

A packet crosses its sender's link (up direction), then its receiver's link (down
direction). The first host is the hub's own and is ideal unless --link-to gives it
a link, so --link is the path between the first host and each of the others.";

pub const LINK_HELP: &str = "\
Link SPEC: whitespace-separated key=value, each for both directions unless prefixed
up: (host → hub) or down: (hub → host):
  rate=1G | 100M | 256k        serialisation rate in bit/s of IP bytes (default: unlimited)
  delay=35ms                   one-way delay
  jitter=1ms                   uniform ±jitter per packet (packets keep their order)
  loss=1e-3 | 0.1%             Bernoulli loss
  loss=ge:p=0.001,r=0.3,h=0,k=1  Gilbert-Elliott: p good→bad, r bad→good,
                               h / k = chance a packet survives in bad / good
  loss=burst:1e-3:len=4        bursts of exactly 4 losses at a mean rate of 1e-3
  queue=50pkts | 256KB         drop-tail queue before the rate limit (default 1000pkts)
A schedule, on a clock that starts when the lab is ready (`lab schedule
start` restarts it at 0; `lab run` starts it as each tool starts):
  outage=20s@5s                down from 5 s for 20 s: what is offered meanwhile,
                               and what is queued when it begins, is dropped
                               (counted apart: DOWNDROP in `lab stats`); repeatable
  outage=2s@10s/30s            down 2 s from 10 s, and again every 30 s
  rate=10M@5s+30s              10 Mbit/s from 5 s for 30 s, then the base rate= again
  rate=10M@40s                 10 Mbit/s from 40 s until the next step (or for good)
Outages of one direction may not overlap, nor may a rate step reach into the next.
Example: --link 'rate=1G delay=35ms loss=1e-3 down:queue=2000pkts'
         --link 'rate=100M delay=35ms outage=20s@5s rate=10M@40s+30s'";

#[derive(Args)]
#[command(about = "The WAN lab: emulated paths between network namespaces", long_about = LAB_HELP)]
pub struct LabArgs {
    #[command(subcommand)]
    pub command: LabCommand,
}

#[derive(Args, Clone)]
pub struct LabName {
    /// Name of the lab (lowercase letters and digits); several labs can run at once.
    #[arg(long, default_value = "default", value_name = "LAB")]
    pub name: String,
}

#[derive(Subcommand)]
pub enum LabCommand {
    /// Create the hosts and start the emulator.
    #[command(after_help = LINK_HELP)]
    Up(UpArgs),
    /// Stop a lab and remove its namespaces, processes and files (and any stale lab).
    Down(DownArgs),
    /// Run a command inside a host: exec [--name LAB] HOST -- COMMAND...
    Exec(ExecArgs),
    /// Live counters per host and direction, per flow, and a 100 ms time series.
    Stats(StatsArgs),
    /// Start (at 0) or hold the links' schedule clock (outage=, rate=RATE@START).
    #[command(after_help = SCHEDULE_HELP)]
    Schedule(ScheduleArgs),
    /// UDP probes for checking a path (run them inside hosts with `lab exec`).
    #[command(subcommand)]
    Probe(ProbeCommand),
    /// Run a suite (built-in name or a .toml file): every scenario with every tool, side by side.
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
    /// The main job: longhaul, rsync and FTP over a 1 Gbit/s, 70 ms, 1e-3-loss path, as a table.
    Demo(DemoArgs),
    /// Re-render a run's reports (results.csv, summary.md, the table) from its results.json.
    Report(ReportArgs),
    /// Short markdown tables from runs' results.json: per scenario, longhaul
    /// beside the best peer and their ratio, under the command that reran it.
    #[command(after_help = TABLE_HELP)]
    Table(TableArgs),
    /// Two builds' runs of a suite side by side: per scenario and tool the
    /// rates' medians and quartiles, the change, a rank-sum test's p, CPU.
    #[command(after_help = COMPARE_HELP)]
    Compare(CompareArgs),
    /// Install the peer tools (Debian packages); installs only what is missing.
    Deps(DepsArgs),
    #[command(name = "__supervise", hide = true)]
    Supervise(LabName),
    #[command(name = "__emulate", hide = true)]
    Emulate(LabName),
}

#[derive(Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub lab: LabName,
    /// Host names, comma-separated; the first sits at the hub.
    #[arg(long, value_delimiter = ',', required = true, value_name = "H1,H2,...")]
    pub hosts: Vec<String>,
    /// Link of every host but the first (see below).
    #[arg(long, value_name = "SPEC")]
    pub link: Option<String>,
    /// Link of one host, overriding --link: HOST=SPEC (repeatable); or of
    /// a site: SITE=SPEC.
    #[arg(long, value_name = "HOST=SPEC")]
    pub link_to: Vec<String>,
    /// Hosts behind one shared link, as data-transfer nodes behind a
    /// site's WAN link: NAME=H1,H2,... (repeatable; the link is ideal
    /// unless --link-to NAME=SPEC gives it one). Unicast between a site's
    /// hosts and hosts outside it crosses that link; within the site it
    /// does not.
    #[arg(long, value_name = "NAME=H1,H2,...")]
    pub site: Vec<String>,
    /// Seed of the loss and jitter generators [default: random, printed].
    #[arg(long)]
    pub seed: Option<u64>,
    /// MTU of every host's port.
    #[arg(long, default_value_t = 1500)]
    pub mtu: usize,
    /// Capture every packet the hosts send to this pcap file.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Bytes kept of each captured packet.
    #[arg(long, default_value_t = 68, requires = "pcap")]
    pub snaplen: u32,
    /// Move every wire packet through the emulator on its own, instead of
    /// the TCP/UDP aggregates (up to 64 KB) the hosts' kernels build. Costs
    /// the emulator several times the CPU; the links model wire packets
    /// either way.
    #[arg(long)]
    pub no_offload: bool,
    /// Print the lab (hosts, addresses, namespaces, links) as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DownArgs {
    #[command(flatten)]
    pub lab: LabName,
    /// Stop every lab.
    #[arg(long)]
    pub all: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub lab: LabName,
    /// Host to run in.
    pub host: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub lab: LabName,
    /// Everything (including per-flow counters and the 100 ms time series) as JSON.
    #[arg(long)]
    pub json: bool,
}

const SCHEDULE_HELP: &str = "\
A link's schedule (outage=DUR@START[/EVERY], rate=RATE@START[+DUR]) runs on a
clock that `lab up` starts once the lab is ready. `start` restarts it at 0
now (e.g. just before starting a transfer), `hold` stops it: every link is
then its base spec (up, at its base rate) until the next `start`. Packets
already accepted by a link keep their fate. `lab run` starts the clock as
each tool starts and holds it in between. Prints where the schedule stands
(`--json`: the whole snapshot, taken at the same instant).";

#[derive(Args)]
pub struct ScheduleArgs {
    #[command(flatten)]
    pub lab: LabName,
    /// start: (re)start the schedule clock at 0 now; hold: stop it.
    #[arg(value_parser = ["start", "hold"])]
    pub action: String,
    /// Every counter, as `lab stats --json`, taken as the clock changed.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum ProbeCommand {
    /// Echo UDP datagrams back (the far end of `rtt`); runs until stopped.
    Echo {
        #[arg(long, default_value_t = 7077)]
        port: u16,
    },
    /// Measure round trips to an `echo`: rtt HOST[:PORT]
    Rtt {
        to: String,
        #[arg(long, default_value_t = 20)]
        count: u64,
        /// Milliseconds between probes.
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
        /// Datagram payload bytes.
        #[arg(long, default_value_t = 64)]
        size: usize,
        #[arg(long)]
        json: bool,
    },
    /// Send sequence-numbered datagrams at a rate: send HOST[:PORT]
    Send {
        to: String,
        /// Rate of IP bytes in bit/s (100M, 1G); 0 = as fast as possible.
        #[arg(long, default_value = "10M")]
        rate: String,
        /// Datagram payload bytes (1472 fills a 1500-byte MTU).
        #[arg(long, default_value_t = 1472)]
        size: usize,
        #[arg(long, default_value_t = u64::MAX, hide_default_value = true)]
        count: u64,
        /// Seconds to send for.
        #[arg(long, default_value_t = 5.0)]
        duration: f64,
        #[arg(long)]
        json: bool,
    },
    /// Count what `send` delivers: losses, bursts, rate.
    Sink {
        #[arg(long, default_value_t = 7077)]
        port: u16,
        /// Join this multicast group (e.g. 239.1.2.3).
        #[arg(long)]
        group: Option<std::net::Ipv4Addr>,
        /// Stop after this many ms without a datagram (once one arrived).
        #[arg(long, default_value_t = 1000)]
        idle_ms: u64,
        /// Stop after this many seconds in any case.
        #[arg(long, default_value_t = 60.0)]
        max: f64,
        #[arg(long)]
        json: bool,
    },
}

const RUN_HELP: &str = "\
Suites:
  demo      longhaul, rsync and FTP over 1 Gbit/s, 70 ms RTT, 1e-3 loss (lab demo)
  smoke     every tool over two short scenarios (CI runs it)
  eumetsat  seed 000's 26 scenarios: 10 kB / 5 MB / 2 GB / mixed files, RTT 70 and
            700 ms, loss 0 / 1e-6 / 1e-3, two receivers for the multicast ones
  gridftp-parallel
            seed 002's sweeps: GridFTP -p 1..12 and -tcp-bs against latency
            1-50 ms and loss 0-5 %, 1 GiB pulls, longhaul beside each
  sctp-multifile
            seed 001: total time for 10 / 100 files of 10 kB-1 MB over 1 Mbit/s
            35 ms, 256 kbit/s 125 ms and 3 Mbit/s 1 ms paths, loss 0-10 %
  slow      seed 001's 1 Mbit/s and 256 kbit/s paths (50-packet queues) and
            10 Mbit/s at 300 ms, loss 0-10 %: small and medium files
  qos-ttp   seed 003: goodput and TTP of one 10 kB-10 MB file over 100 Mbit/s
            at RTT 0.8 and 60 ms, loss 0-25 %
  bigdata   seed 004: throughput against RTT 0-200 ms, background TCP flows
            and background UDP at 75 ms (the study's 10 Gbit/s scaled to 1)
  multicast one sender, three receivers on 700 ms paths with loss 1e-3, 1e-2
            and 5e-2: 1 GiB + 1000 x 10 kB at 400 Mbit/s, longhaul-mc and uftp
  cc        congestion control: 1 Gbit/s with loss 1e-3 at 70 / 700 ms, 1e-2 at
            1 s, and beside 1-6 CUBIC flows at 75 ms; longhaul's --cc choices
            against kernel TCP bbr and cubic
  startup   cold start at 1 Gbit/s, 70 and 700 ms, loss 0 and 1e-3 (round trips
            to 90 % of the link), and joining a full 70 ms path: what a CUBIC
            flow, a BBR flow or 600 Mbit/s of UDP keep in the first 10 RTT
  fairness  --cc fair and the default beside 1 and 5 CUBIC flows and one BBR
            flow at 70 ms, loss 0 and 1e-3: share and Jain's index
  outages   a 300 MB file over 100 Mbit/s at 70 ms RTT whose link goes down
            for 20 s or 60 s, or drops to 10 Mbit/s for 30 s, 5 s into each
            run: longhaul, rsync, GridFTP with its restart options
  FILE      your own suite; the built-in ones are in crates/bench/suites/

Tools: longhaul, longhaul-mc (longhaul multicast), longhaul-ssh (get --ssh
through sshd), rsync, ftp (vsftpd + lftp),
gridftp (globus), tarnc (tar + nc), scp, uftp (multicast to several receivers),
iperf3 (memory to memory), qcp (QUIC over ssh; `lab deps --tools qcp` builds it).

Profiles scale a suite to a time budget (the suite file says how; a suite
without profiles runs as written under each): quick, standard (default), full.
They scale generated files; a scenario's tree is used as it is under each.

A suite file (TOML):
  [suite]
  name = \"mine\"
  line_rate = \"1G\"            # multicast send rate; TTP of links without one
  target_mbps = 350           # optional: marked met or not in summary.md
  tools = [\"longhaul\", \"rsync\", \"ftp\", \"gridftp\", \"tarnc\", \"scp\", \"uftp\", \"iperf3\"]
  repeat = 1
  time_cap = \"300s\"
  cc = \"cubic\"                # kernel congestion control of the TCP tools
  dest = \"disk\"               # or tmpfs: receivers write to memory
  mtu = 1500                   # links' MTU, 576 to 9000 (9000: jumbo frames);
                               # a scenario may set its own
  measure = \"mbps\"            # or seconds: what report.html's overview and
                               # bars show (time, where all move the same data)
  # A tool may carry settings, which then label its runs:
  #   ftp:parallel=N  gridftp:p=N,cc=N,pp=yes|no,fast=yes|no,tcp-bs=SIZE,rst=yes|no
  #   uftp:rate=RATE  longhaul-mc:rate=RATE  iperf3:streams=N,cc=cubic|bbr|reno
  #   longhaul:cc=wan|wan:HINT|fair|bbr|cubic|reno|fixed:RATE,max-rate=RATE,
  #     connections=N  qcp:cc=cubic|bbr|newreno
  background = { tcp_flows = 3 }   # or { udp_pps = 20000, udp_size = 1250 }:
                                   # iperf3 from srv to the first receiver;
                                   # TCP flows may set cc = \"bbr\", either
                                   # lead = \"10s\" (started before the tool;
                                   # default 2s)
  [profile.quick]
  data_scale = 0.05           # 5% of each file group's bytes
  time_scale = 0.1            # time caps x0.1
  only = [\"bigfile-*\"]        # optional: just these scenarios
  [[scenario]]
  name = \"bigfile-700ms\"
  link = \"rate=1G delay=350ms loss=1e-3 queue=58333pkts\"   # every receiver's link
  # A link may carry a schedule, started as each tool starts: outage=20s@5s,
  # rate=10M@5s+30s (see `lab up --help`)
  files = [{ size = \"2GB\", count = 1 }]
  [[scenario]]
  name = \"two-sites\"
  links = [\"rate=1G\", \"rate=1G delay=35ms loss=1e-6\"]    # one per receiver
  files = [{ size = \"10kB\", count = 100 }, { size = \"5MB\", count = 4 }]
  [[scenario]]
  name = \"usr-share\"
  link = \"rate=1G delay=35ms loss=1e-3 queue=5833pkts\"
  tree = \"/usr/share\"         # an existing directory instead of files: served
                               # where it is, read-only, not scaled; symlinks
                               # are compared as links (a tool that follows or
                               # drops them is not identical)
  [sweep.latency]                # scenarios with sweep = \"latency\" and an x
  x = \"one-way latency (ms)\"   # are drawn against x, a line per tool
  metrics = [\"mbps\"]           # charts: mbps, ttp, goodput, seconds, share
  [[scenario]]
  name = \"lat-10ms\"
  sweep = \"latency\"
  x = 10
  tcp_max = \"4MiB\"             # largest TCP buffer in the hosts (default 128 MiB)
  link = \"rate=1G delay=10ms\"
  files = [{ size = \"1GB\", count = 1 }]
  [[published]]                  # a replayed study's own number, drawn beside
  scenario = \"lat-10ms\"        # the measured ones with the ratio
  series = \"GridFTP, 1 stream\" # what the study measured
  tool = \"gridftp\"             # optional: the tool that replays it
  metric = \"mbps\"              # seconds, mbps, ttp or goodput
  value = 286.4
  source = \"Table 5.1\"

Each scenario gets a lab (host srv at the hub, receivers cli, cli2, ... behind
their links) and a generated data set (cached in OUT/data) or its tree (hashed
when the scenario starts; it must exist when the run starts, apart from OUT). Each tool moves it
from srv to every receiver: daemons started and waited for, clients timed
(unicast tools run one client per receiver at once; uftp and longhaul-mc
multicast), all
stopped by PID, every delivered tree verified by BLAKE3. A run that reaches its
time cap is stopped and reported as a timeout with the bytes it delivered.
Results: OUT/results.json (every number, saved after each run), results.csv,
summary.md, report.html. A missing tool is reported as skipped with its install
command (`longhaul lab deps` installs them all).";

#[derive(Args)]
pub struct RunArgs {
    /// Built-in suite (demo, smoke) or a suite file (.toml).
    pub suite: String,
    /// Only these tools, comma-separated (of each scenario's own list); a
    /// name takes all its variants, `gridftp:p=8` just that one.
    #[arg(long, value_delimiter = ',', value_name = "T1,T2")]
    pub tools: Option<Vec<String>>,
    /// Only these scenarios, comma-separated; `*` matches any run of
    /// characters (`--scenarios 'join-*,2GB-700ms-*'`). The profile's own
    /// choice still applies.
    #[arg(long, value_delimiter = ',', value_name = "S1,S2")]
    pub scenarios: Option<Vec<String>>,
    /// Runs per tool and scenario, overriding the suite's.
    #[arg(long)]
    pub repeat: Option<u32>,
    /// How far the suite is scaled down: quick, standard or full.
    #[arg(long, default_value = "standard", value_parser = ["quick", "standard", "full"])]
    pub profile: String,
    /// Where results and generated data go [default: ./lab-results/SUITE].
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
    /// Print results.json on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Name of the lab the run brings up for each scenario; two runs at
    /// once need two names (each lab has its own namespaces, so both use
    /// 10.77.0.x). Runs at once share the CPU: fine for slow links, not
    /// for CPU figures.
    #[arg(long, value_name = "NAME", default_value = longhaul_bench::runner::DEFAULT_LAB)]
    pub lab: String,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Where results and generated data go [default: ./lab-results/demo].
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
    /// Do not install missing tools (they are then reported as skipped).
    #[arg(long)]
    pub no_install: bool,
    /// Print results.json on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ReportArgs {
    /// A directory a `lab run` wrote (with results.json).
    pub dir: std::path::PathBuf,
}

const TABLE_HELP: &str = "\
Each DIR is a directory `lab run` wrote. The table heads with the command
that reproduces it and the run's date; each row is a scenario: longhaul's
figure (the median over its runs), the best peer's (named), and the ratio
(above 1x longhaul is ahead; for seconds and CPU the peer's over
longhaul's). README's Numbers are made with it (scripts/readme-numbers).

Examples:
  longhaul lab table lab-results/startup
  longhaul lab table --figure cpu runs/cpu-70ms
  longhaul lab table --ours longhaul:known=yes --peers longhaul runs/known-700ms";

#[derive(Args)]
pub struct TableArgs {
    /// Directories `lab run` wrote (each with results.json).
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<std::path::PathBuf>,
    /// The figure: mbps, ttp, goodput, seconds, share or cpu (CPU-s per GB,
    /// both ends) [default: the sweep's first metric, else mbps].
    #[arg(long, value_name = "FIGURE", value_parser = longhaul_bench::numbers::Figure::parse)]
    pub figure: Option<longhaul_bench::numbers::Figure>,
    /// The tool label shown as longhaul [default: the best label starting
    /// with "longhaul"].
    #[arg(long, value_name = "LABEL")]
    pub ours: Option<String>,
    /// The tool labels to compare with [default: every label not starting
    /// with "longhaul", but iperf3, which moves no files].
    #[arg(long, value_delimiter = ',', value_name = "L1,L2")]
    pub peers: Option<Vec<String>>,
    /// Add both sides' CPU seconds per GB delivered.
    #[arg(long)]
    pub cpu: bool,
    /// Only the scenarios matching these globs (`*` for any run of
    /// characters), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "GLOBS")]
    pub scenarios: Option<Vec<String>>,
    /// One table of all DIRs' runs (runs of one suite made apart, e.g. one
    /// tool at a time).
    #[arg(long)]
    pub merge: bool,
}

const COMPARE_HELP: &str = "\
On two shared cores a build's rate moves by 5-10 % from run to run and more
from hour to hour: run both builds in turns, many times, each run into its
own directory, then compare. A p over 0.05 says the difference lies within
what the runs' spread gives by chance. scripts/ab-lab runs the turns.

Example:
  for i in 1 2 3 4 5 6; do
    /tmp/lh-old lab run docs/lab/small-lan.toml --repeat 3 --out ab/old-$i
    /tmp/lh-new lab run docs/lab/small-lan.toml --repeat 3 --out ab/new-$i
  done
  longhaul lab compare --before ab/old-* --after ab/new-*";

#[derive(Args)]
pub struct CompareArgs {
    /// Directories `lab run` wrote with the build before (each with results.json).
    #[arg(long, required = true, num_args = 1.., value_name = "DIR")]
    pub before: Vec<std::path::PathBuf>,
    /// Directories `lab run` wrote with the build after.
    #[arg(long, required = true, num_args = 1.., value_name = "DIR")]
    pub after: Vec<std::path::PathBuf>,
    /// Only this tool label [default: every tool].
    #[arg(long, value_name = "LABEL")]
    pub tool: Option<String>,
    /// Only the scenarios matching these globs (`*` for any run of
    /// characters), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "GLOBS")]
    pub scenarios: Option<Vec<String>>,
}

#[derive(Args)]
pub struct DepsArgs {
    /// Only these tools, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_name = "T1,T2")]
    pub tools: Option<Vec<String>>,
    /// Print what would be installed, install nothing.
    #[arg(long)]
    pub dry_run: bool,
}
