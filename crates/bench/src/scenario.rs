//! Scenarios as data: a suite file (TOML) names a suite and lists its
//! scenarios, each a link, a data set and the tools to run over it. The
//! built-in suites are files of the same format, compiled in.

use crate::tools::ToolSpec;
use anyhow::{bail, Context, Result};
use longhaul_netem::LinkSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// A suite file as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    /// The `[suite]` table: name, line rate and the defaults of every scenario.
    pub suite: SuiteInfo,
    /// quick / standard / full: how the suite scales down to fit a time budget.
    #[serde(default)]
    pub profile: BTreeMap<String, Profile>,
    /// Sweeps: scenarios that vary one thing, drawn as a line chart.
    #[serde(default)]
    pub sweep: BTreeMap<String, Sweep>,
    /// The `[[scenario]]`s, in the order they run.
    #[serde(rename = "scenario")]
    pub scenarios: Vec<Scenario>,
    /// The replayed study's own figures (`[[published]]`): the report draws
    /// them beside the measured ones, with the ratio.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published: Vec<Published>,
}

/// One number the replayed study published for one of the suite's scenarios.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Published {
    /// The suite's scenario it corresponds to.
    pub scenario: String,
    /// What the study measured, in its words ("FTP over TCP (New-Reno)").
    pub series: String,
    /// The lab tool that replays that series, if one does (`ftp`).
    #[serde(default)]
    pub tool: Option<String>,
    /// The measure: seconds, mbps, ttp or goodput.
    pub metric: Metric,
    /// Its value, in the metric's unit.
    pub value: f64,
    /// Where the study gives it ("Table 5.2", "Sect. 6.2.2, stated in the text").
    pub source: String,
}

/// How a profile scales the suite as written (which is the full study).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// What the profile does, in a sentence; the reports add it to the profile note.
    #[serde(default)]
    pub description: String,
    /// Share of each file group's bytes: the count shrinks while it stays
    /// at least one; a single file shrinks instead (so 10 kB files stay 10 kB
    /// and a 2 GB file becomes 100 MB at 0.05).
    #[serde(default = "unit")]
    pub data_scale: f64,
    /// Factor on every time cap (at least 1 s after scaling).
    #[serde(default = "unit")]
    pub time_scale: f64,
    /// Runs per tool and scenario under this profile, over the scenario's and the
    /// suite's `repeat`; None keeps theirs.
    #[serde(default)]
    pub repeat: Option<u32>,
    /// Only the scenarios whose names match one of these patterns (`*`
    /// matches anything), for suites whose full matrix does not fit.
    #[serde(default)]
    pub only: Vec<String>,
}

/// A family of scenarios that vary one thing (named by their `sweep`, placed
/// by their `x`): the report draws Mbit/s against x, a line per tool.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    /// What x is ("one-way latency (ms)").
    pub x: String,
    /// Title of its chart in report.html; empty means the sweep's name.
    #[serde(default)]
    pub title: String,
    /// Draw x on a log axis.
    #[serde(default)]
    pub log_x: bool,
    /// What y is, a chart each: mbps (default), ttp, goodput, seconds or share.
    #[serde(default = "mbps_only")]
    pub metrics: Vec<Metric>,
}

fn mbps_only() -> Vec<Metric> {
    vec![Metric::Mbps]
}

/// A number a chart can show of each run.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Mbit/s per receiver: delivered bytes × 8 / wall time (the default).
    #[default]
    Mbps,
    /// TTP (seed 003): (delivered payload bytes / the path's rate) / wall time, so
    /// 1.0 is the rate of the scenario's bottleneck ([`Plan::ttp_rate_bps`]).
    Ttp,
    /// G (seed 003): payload bytes delivered (one copy) / bytes the server put on
    /// the wire.
    Goodput,
    /// Wall time of the whole transfer.
    Seconds,
    /// The tool's part of what the bottleneck delivered beside background
    /// traffic (fair beside N TCP flows: 1/(N+1)).
    Share,
    /// Jain's fairness index over the tool's rate and each background TCP
    /// flow's (1 when all are equal).
    Jain,
    /// What the background kept of its rate in the tool's first 10 round
    /// trips (1.0: nothing taken from it at first).
    Kept,
}

impl Metric {
    /// The metric's name on chart axes and in table headings ("Mbit/s", "TTP", ...).
    pub fn label(self) -> &'static str {
        match self {
            Metric::Mbps => "Mbit/s",
            Metric::Ttp => "TTP",
            Metric::Goodput => "goodput G",
            Metric::Seconds => "seconds",
            Metric::Share => "share of the link",
            Metric::Jain => "Jain's index",
            Metric::Kept => "background kept, first 10 RTT",
        }
    }
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters.
pub fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len()).any(|k| {
                    name.is_char_boundary(head.len() + k) && glob(rest, &name[head.len() + k..])
                })
        }
    }
}

/// Competing traffic as a scenario writes it: `tcp_flows` (with an optional
/// `cc`), or `udp_pps` with an optional `udp_size`; either with an optional
/// `lead`. [`Suite::plans_for`] checks and resolves it into [`Background`].
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackgroundSpec {
    /// Bulk TCP flows (0 to 64; 0 means none).
    #[serde(default)]
    pub tcp_flows: Option<u32>,
    /// The TCP flows' congestion control (cubic, bbr or reno; iperf3 -C);
    /// default the scenario's `cc`.
    #[serde(default)]
    pub cc: Option<String>,
    /// UDP datagrams per second at a constant rate (0 to 1,000,000; 0 means none).
    #[serde(default)]
    pub udp_pps: Option<u32>,
    /// UDP payload bytes per datagram (default 1250, as seed 004).
    #[serde(default)]
    pub udp_size: Option<u32>,
    /// How long the background runs before each tool starts ("2s" to "120s";
    /// default 2 s, which TCP flows on a 70 ms path need to fill the link; on a
    /// long path they need more).
    #[serde(default)]
    pub lead: Option<String>,
}

/// Background traffic, resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum Background {
    /// N bulk TCP flows (iperf3 -P N).
    Tcp {
        /// How many.
        flows: u32,
        /// Their congestion control (iperf3 -C); None: the scenario's.
        cc: Option<String>,
    },
    /// Constant-rate UDP: datagrams per second of `size` payload bytes.
    Udp {
        /// Datagrams per second.
        pps: u32,
        /// Payload bytes per datagram (16 to 1472).
        size: u32,
    },
}

/// How long background traffic runs before a tool starts, unless the scenario
/// says (TCP flows on a 70 ms path leave slow start in it).
pub const DEFAULT_BACKGROUND_LEAD: Duration = Duration::from_secs(2);

impl Background {
    /// One line for the reports and results.json's `background`: the number of TCP
    /// flows (and their congestion control when set), or the UDP datagram rate
    /// with its payload rate in Mbit/s.
    pub fn describe(&self) -> String {
        match self {
            Background::Tcp { flows, cc } => format!(
                "{flows} background {}TCP flow{}",
                cc.as_ref().map_or(String::new(), |c| format!("{c} ")),
                if *flows == 1 { "" } else { "s" }
            ),
            Background::Udp { pps, size } => format!(
                "background UDP {pps} datagrams/s of {size} bytes ({:.0} Mbit/s)",
                *pps as f64 * *size as f64 * 8.0 / 1e6
            ),
        }
    }

    /// The number of flows the background's data travels in (1 for UDP).
    pub fn flows(&self) -> usize {
        match self {
            Background::Tcp { flows, .. } => *flows as usize,
            Background::Udp { .. } => 1,
        }
    }
}

fn unit() -> f64 {
    1.0
}

/// The profiles `--profile` accepts; one the suite does not define runs it as written.
pub const PROFILES: [&str; 3] = ["quick", "standard", "full"];
/// The profile used when none is given.
pub const DEFAULT_PROFILE: &str = "standard";

/// Where receivers write (a scenario's `dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    /// The runner's output directory (the machine's disk).
    #[default]
    Disk,
    /// A tmpfs mounted for the scenario: the disk is out of the measurement.
    Tmpfs,
}

/// The `[suite]` table: what the suite is, and the defaults its scenarios inherit.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteInfo {
    /// Suite name (1 to 64 of `A-Z a-z 0-9 - _ .`), the title of its reports.
    pub name: String,
    /// What the suite measures: a paragraph under the title of its reports.
    #[serde(default)]
    pub description: String,
    /// The study it replays (e.g. "seed 000: EUMETSAT WAN study, Table 1").
    #[serde(default)]
    pub cites: String,
    /// The path's line rate (bit/s, e.g. "1G"): the reference of TTP for a
    /// scenario whose links set no rate (the others use their own), and what push
    /// tools send at 90 % of.
    pub line_rate: String,
    /// Throughput a tool must reach to meet the suite's target (Mbit/s).
    #[serde(default)]
    pub target_mbps: Option<f64>,
    /// Tools of every scenario that names none.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Runs per tool and scenario where neither the scenario nor the profile says
    /// (1 to 100; default 1).
    #[serde(default = "one")]
    pub repeat: u32,
    /// Longest a tool may take in one run ("300s", "5m").
    #[serde(default = "five_minutes")]
    pub time_cap: String,
    /// Kernel congestion control of both hosts for TCP tools (cubic, bbr, reno).
    #[serde(default)]
    pub cc: Option<String>,
    /// Where receivers write (disk or tmpfs) in every scenario that does not say.
    #[serde(default)]
    pub dest: Storage,
    /// MTU of the lab's links in every scenario that does not say (576 to
    /// 9000; default 1500).
    #[serde(default)]
    pub mtu: Option<usize>,
    /// What the report's overview and bars show: mbps (default), or seconds
    /// where every tool moves the same data and time separates them (seed
    /// 001's figures).
    #[serde(default)]
    pub measure: Metric,
}

/// One `[[scenario]]` as written: links, data set and tools; what it leaves out
/// comes from `[suite]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Its name, unique in the suite (1 to 64 of `A-Z a-z 0-9 - _ .`); it labels
    /// its runs and report rows.
    pub name: String,
    /// Every receiver's link (emulator SPEC); the server sits at the hub.
    #[serde(default)]
    pub link: Option<String>,
    /// One link per receiver, instead of `link`.
    #[serde(default)]
    pub links: Vec<String>,
    /// How many receivers (default 1, or as many as `links`).
    #[serde(default)]
    pub receivers: Option<usize>,
    /// Where receivers write; None means the suite's `dest`.
    #[serde(default)]
    pub dest: Option<Storage>,
    /// The sweep it belongs to (a `[sweep.NAME]` of the suite) and its place on it.
    #[serde(default)]
    pub sweep: Option<String>,
    /// Its place on the sweep's x axis, in the unit the sweep's `x` names; given
    /// together with `sweep`.
    #[serde(default)]
    pub x: Option<f64>,
    /// Largest TCP buffer the hosts' autotuning may grow to (tcp_rmem and
    /// tcp_wmem maximum, and the host's net.core.rmem_max/wmem_max for
    /// programs that set their own), e.g. "4MiB"; default 128 MiB.
    #[serde(default)]
    pub tcp_max: Option<String>,
    /// Traffic that competes with every tool on the first receiver's path,
    /// server → receiver: `{ tcp_flows = 3 }` or `{ udp_pps = 20000, udp_size = 1250 }`.
    #[serde(default)]
    pub background: Option<BackgroundSpec>,
    /// The data set: groups of generated files of one size (or `tree`).
    #[serde(default)]
    pub files: Vec<FileGroup>,
    /// The data set as an existing directory (an absolute path), instead of
    /// `files`: used as it is (profiles do not scale it), never written;
    /// symlinks count as links.
    #[serde(default)]
    pub tree: Option<String>,
    /// Tools to run (`name` or `name:key=value,...`); empty means the suite's `tools`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Runs per tool (1 to 100); None means the suite's (a profile's `repeat`
    /// overrides both).
    #[serde(default)]
    pub repeat: Option<u32>,
    /// Longest a tool may take in one run ("300s", "5m"); None means the suite's.
    #[serde(default)]
    pub time_cap: Option<String>,
    /// Kernel TCP congestion control of the hosts (cubic, bbr or reno); None means
    /// the suite's.
    #[serde(default)]
    pub cc: Option<String>,
    /// MTU of the lab's links (576 to 9000, e.g. 9000 for jumbo frames); None
    /// means the suite's.
    #[serde(default)]
    pub mtu: Option<usize>,
    /// A dissemination run instead of a data set: a producer writes
    /// products for a while and receivers come and go (instead of `files`
    /// or `tree`).
    #[serde(default)]
    pub feed: Option<FeedSpec>,
}

/// A dissemination scenario as written: `feed = { load = "350M", seconds
/// = 300, ... }`. The producer writes seed 000's mix of products (most of
/// 10-500 kB, one in 25 of 5-50 MB) at `load` for `seconds`; each tool
/// sends them to every receiver as they come; the run then drains.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FeedSpec {
    /// The producer's rate of file bytes ("350M" = 350 Mbit/s).
    pub load: String,
    /// How long it writes (scaled by the profile's time_scale).
    pub seconds: f64,
    /// How long the run waits after the last product for every receiver
    /// to have what it is due ("60s"; default 60 s).
    #[serde(default)]
    pub drain: Option<String>,
    /// The senders' backlog: a receiver that was away is due what was
    /// ready within it; the spool keeps products that long and 30 s more
    /// ("600s"; default 600 s).
    #[serde(default)]
    pub backlog: Option<String>,
    /// The channel's sending rate (default the tool's `rate` setting, else
    /// 90 % of the line rate).
    #[serde(default)]
    pub rate: Option<String>,
    /// A receiver (0-based) that joins late, and when (seconds into the
    /// producer's run, scaled like `seconds`): it is due what is ready
    /// from a second after it joined.
    #[serde(default)]
    pub late: Option<(usize, f64)>,
    /// A receiver (0-based) stopped at a time and started again after a
    /// while (seconds, both scaled): it is due everything.
    #[serde(default)]
    pub restart: Option<(usize, f64, f64)>,
}

/// A dissemination scenario, resolved and scaled.
#[derive(Debug, Clone, PartialEq)]
pub struct Feed {
    /// The producer's rate, bit/s of file bytes.
    pub load_bps: u64,
    /// How long it writes.
    pub seconds: Duration,
    /// How long the run waits for receivers after the producer stops.
    pub drain: Duration,
    /// The senders' backlog.
    pub backlog: Duration,
    /// The channel's sending rate, if the scenario sets it.
    pub rate_bps: Option<u64>,
    /// (receiver, joins at).
    pub late: Option<(usize, Duration)>,
    /// (receiver, stopped at, down for).
    pub restart: Option<(usize, Duration, Duration)>,
}

/// One group of a scenario's data set: `count` files of `size` each.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileGroup {
    /// Size of each file ("10kB", "5MB", "1GiB").
    pub size: String,
    /// How many files (1 to 1,000,000 as written; a profile may lower it).
    pub count: u64,
}

fn one() -> u32 {
    1
}

fn five_minutes() -> String {
    "300s".into()
}

/// A scenario with everything resolved and checked.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The scenario's name.
    pub name: String,
    /// One per receiver.
    pub links: Vec<String>,
    /// Where receivers write (the scenario's, else the suite's).
    pub dest: Storage,
    /// The data set.
    pub data: Data,
    /// Tools in the order listed (the scenario's, else the suite's), no label twice.
    pub tools: Vec<ToolSpec>,
    /// (sweep name, x).
    pub sweep: Option<(String, f64)>,
    /// Bytes; None = the lab's default (128 MiB).
    pub tcp_max: Option<u64>,
    /// Competing traffic; None when the scenario has none (or asks for zero).
    pub background: Option<Background>,
    /// How long the background runs before each tool starts.
    pub background_lead: Duration,
    /// Runs per tool: the profile's, else the scenario's, else the suite's (the
    /// runner's `--repeat` overrides it).
    pub repeat: u32,
    /// Longest a tool may take in one run, scaled by the profile (at least 1 s); a
    /// run that reaches it is stopped.
    pub time_cap: Duration,
    /// Kernel TCP congestion control set in every host (the scenario's, else the
    /// suite's); None leaves the hosts' default.
    pub cc: Option<String>,
    /// MTU of every link of the lab (the scenario's, else the suite's, else
    /// 1500).
    pub mtu: usize,
}

/// A scenario's data set, which every receiver gets whole.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// Generated files: groups as (bytes per file, count), scaled by the profile.
    Files(Vec<(u64, u64)>),
    /// An existing directory, used as it is.
    Tree(PathBuf),
    /// Products written while the run goes (a dissemination scenario).
    Feed(Feed),
}

impl Data {
    /// For progress lines: `210 files, 52.0 MB` or `tree /usr/share`.
    pub fn line(&self) -> String {
        match self {
            Data::Files(groups) => format!(
                "{} files, {:.1} MB",
                groups.iter().map(|(_, n)| n).sum::<u64>(),
                groups.iter().map(|(size, n)| size * n).sum::<u64>() as f64 / 1e6
            ),
            Data::Tree(dir) => format!("tree {}", dir.display()),
            Data::Feed(f) => format!(
                "products at {:.0} Mbit/s for {:.0} s",
                f.load_bps as f64 / 1e6,
                f.seconds.as_secs_f64()
            ),
        }
    }
}

impl Plan {
    /// The longest round trip of the receivers' paths (delays and jitter).
    pub fn max_rtt(&self) -> Duration {
        self.links
            .iter()
            .filter_map(|l| l.parse::<LinkSpec>().ok())
            .map(|l| {
                Duration::from_nanos(
                    l.up.delay_ns + l.up.jitter_ns + l.down.delay_ns + l.down.jitter_ns,
                )
            })
            .max()
            .unwrap_or_default()
    }

    /// The rate TTP is taken against, bit/s: the bottleneck on the path the data
    /// takes, which is the receivers' down direction (`down:rate=`, or a plain
    /// `rate=`); with several receivers the slowest limited one, as the run
    /// lasts until the last receiver has the data. Only when no receiver's link
    /// has a rate (unlimited) is it the suite's `line_rate`, given here.
    pub fn ttp_rate_bps(&self, line_rate_bps: u64) -> u64 {
        down_rate_bps(self.links.iter().map(String::as_str)).unwrap_or(line_rate_bps)
    }

    /// The links as one line ("A" or "A | B" for two receivers).
    pub fn link_line(&self) -> String {
        self.links.join(" | ")
    }

    /// The MTU as a report shows it beside the link: nothing at 1500.
    pub fn mtu_note(&self) -> String {
        mtu_note(self.mtu)
    }
}

/// Links' MTU where a scenario does not set one.
pub const DEFAULT_MTU: usize = 1500;

/// ", MTU 9000" for a link of that MTU; nothing at the default 1500.
pub fn mtu_note(mtu: usize) -> String {
    if mtu == DEFAULT_MTU {
        String::new()
    } else {
        format!(", MTU {mtu}")
    }
}

/// A file group at `scale` of its bytes (see `Profile::data_scale`).
pub fn scale_group((size, count): (u64, u64), scale: f64) -> (u64, u64) {
    let n = count as f64 * scale;
    if n >= 1.0 {
        (size, n.round() as u64)
    } else {
        (((size as f64 * n).round() as u64).max(1), 1)
    }
}

/// The built-in suites: (name, TOML).
pub const BUILTIN: &[(&str, &str)] = &[
    ("bigdata", include_str!("../suites/bigdata.toml")),
    ("cc", include_str!("../suites/cc.toml")),
    ("demo", include_str!("../suites/demo.toml")),
    (
        "dissemination",
        include_str!("../suites/dissemination.toml"),
    ),
    ("eumetsat", include_str!("../suites/eumetsat.toml")),
    ("fairness", include_str!("../suites/fairness.toml")),
    (
        "gridftp-parallel",
        include_str!("../suites/gridftp-parallel.toml"),
    ),
    ("multicast", include_str!("../suites/multicast.toml")),
    ("outages", include_str!("../suites/outages.toml")),
    ("qos-ttp", include_str!("../suites/qos-ttp.toml")),
    (
        "sctp-multifile",
        include_str!("../suites/sctp-multifile.toml"),
    ),
    ("slow", include_str!("../suites/slow.toml")),
    ("smoke", include_str!("../suites/smoke.toml")),
    ("startup", include_str!("../suites/startup.toml")),
];

impl Suite {
    /// Keeps only the scenarios whose name matches one of `globs` (`*`
    /// matches any run of characters), and the published figures of those;
    /// an error names the globs when none matches.
    pub fn keep_scenarios(&mut self, globs: &[String]) -> Result<()> {
        let keep = |name: &str| globs.iter().any(|g| glob(g, name));
        self.scenarios.retain(|s| keep(&s.name));
        if self.scenarios.is_empty() {
            bail!(
                "no scenario of suite '{}' matches {}",
                self.suite.name,
                globs.join(",")
            );
        }
        self.published.retain(|p| keep(&p.scenario));
        Ok(())
    }

    /// A built-in suite by name, or a suite file by path.
    pub fn load(name_or_path: &str) -> Result<Suite> {
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Suite::parse(text).with_context(|| format!("built-in suite {name_or_path}"));
        }
        if !name_or_path.contains('/') && !name_or_path.ends_with(".toml") {
            let names: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
            bail!(
                "no built-in suite '{name_or_path}' (built in: {}); give a path to a .toml file for your own",
                names.join(", ")
            );
        }
        let text = std::fs::read_to_string(name_or_path)
            .with_context(|| format!("reading {name_or_path}"))?;
        Suite::parse(&text).with_context(|| name_or_path.to_string())
    }

    /// Parses a suite's TOML and checks it: no profile but quick, standard and full,
    /// and every scenario resolved under each of the three.
    pub fn parse(text: &str) -> Result<Suite> {
        let s: Suite = toml::from_str(text)?;
        for name in s.profile.keys() {
            if !PROFILES.contains(&name.as_str()) {
                bail!(
                    "profile '{name}': a suite may define {}",
                    PROFILES.join(", ")
                );
            }
        }
        for p in PROFILES {
            s.plans_for(p)?;
        }
        let plans = s.plans_for("full")?;
        for (k, p) in s.published.iter().enumerate() {
            let Some(plan) = plans.iter().find(|x| x.name == p.scenario) else {
                bail!(
                    "published figure '{}' ({}): no scenario of that name",
                    p.series,
                    p.scenario
                );
            };
            if let Some(t) = &p.tool {
                if !plan.tools.iter().any(|x| &x.label == t) {
                    bail!(
                        "published figure '{}' ({}): tool '{t}' does not run in that scenario",
                        p.series,
                        p.scenario
                    );
                }
            }
            if s.published[..k]
                .iter()
                .any(|q| (&q.scenario, &q.series, q.metric) == (&p.scenario, &p.series, p.metric))
            {
                bail!(
                    "published figure '{}' ({}): given twice for the same metric",
                    p.series,
                    p.scenario
                );
            }
            if !(p.value.is_finite() && p.value > 0.0) {
                bail!(
                    "published figure '{}' ({}): the value must be a positive number",
                    p.series,
                    p.scenario
                );
            }
            let own = match p.metric {
                Metric::Share => Some("share"),
                Metric::Jain => Some("jain"),
                Metric::Kept => Some("kept"),
                _ => None,
            };
            if let Some(m) = own {
                bail!("published figure '{}': {m} is not a published measure (seconds, mbps, ttp or goodput)", p.series);
            }
        }
        if s.suite.measure != Metric::Mbps && s.suite.measure != Metric::Seconds {
            bail!("[suite] measure: mbps or seconds");
        }
        Ok(s)
    }

    /// The profile `name` (checked), or None if the suite runs as written under it.
    pub fn profile_of(&self, name: &str) -> Result<Option<&Profile>> {
        if !PROFILES.contains(&name) {
            bail!("profile '{name}' (quick, standard or full)");
        }
        Ok(self.profile.get(name))
    }

    /// The `[suite]` line rate in bit/s, the reference of TTP where a scenario's
    /// links set no rate ([`Plan::ttp_rate_bps`]; checked by
    /// [`Suite::parse`]).
    pub fn line_rate_bps(&self) -> u64 {
        parse_rate(&self.suite.line_rate).expect("checked by plans()")
    }

    /// Every scenario as written, resolved against the suite's defaults and checked.
    pub fn plans(&self) -> Result<Vec<Plan>> {
        self.plans_for("full")
    }

    /// Every scenario under a profile.
    pub fn plans_for(&self, profile: &str) -> Result<Vec<Plan>> {
        let prof = self.profile_of(profile)?;
        let (data_scale, time_scale) = prof.map_or((1.0, 1.0), |p| (p.data_scale, p.time_scale));
        let in_unit = |v: f64| v > 0.0 && v <= 1.0;
        if !in_unit(data_scale) || !in_unit(time_scale) {
            bail!(
                "profile '{profile}': data_scale and time_scale must be more than 0 and at most 1"
            );
        }
        let info = &self.suite;
        check_name("suite", &info.name)?;
        parse_rate(&info.line_rate).context("line_rate")?;
        if self.scenarios.is_empty() {
            bail!("suite '{}' has no [[scenario]]", info.name);
        }
        let only = prof.map_or(&[][..], |p| &p.only[..]);
        let mut plans = Vec::new();
        let mut seen: Vec<&str> = Vec::new();
        for sc in &self.scenarios {
            let ctx = || format!("scenario '{}'", sc.name);
            check_name("scenario", &sc.name)?;
            if seen.contains(&sc.name.as_str()) {
                bail!("scenario '{}' appears twice", sc.name);
            }
            let links: Vec<String> = match (&sc.link, sc.links.is_empty(), sc.receivers) {
                (Some(_), false, _) => bail!("{}: give link or links, not both", ctx()),
                (None, true, _) => bail!("{}: no link (link = \"SPEC\" or links = [...])", ctx()),
                (Some(l), true, n) => vec![l.clone(); n.unwrap_or(1)],
                (None, false, Some(n)) if n != sc.links.len() => {
                    bail!("{}: receivers = {n} but {} links", ctx(), sc.links.len())
                }
                (None, false, _) => sc.links.clone(),
            };
            if !(1..=8).contains(&links.len()) {
                bail!("{}: {} receivers (1 to 8)", ctx(), links.len());
            }
            for l in &links {
                l.parse::<LinkSpec>()
                    .map_err(|e| anyhow::anyhow!("link '{l}': {e}"))
                    .with_context(ctx)?;
            }
            let data = match (&sc.tree, sc.files.is_empty()) {
                _ if sc.feed.is_some() && (sc.tree.is_some() || !sc.files.is_empty()) => {
                    bail!("{}: give feed, files or tree, one of them", ctx())
                }
                _ if sc.feed.is_some() => {
                    let f = sc.feed.as_ref().expect("feed");
                    Data::Feed(resolve_feed(f, links.len(), time_scale).with_context(ctx)?)
                }
                (Some(_), false) => bail!("{}: give files or tree, not both", ctx()),
                (None, true) => bail!(
                    "{}: no data set (files = [{{ size = \"10kB\", count = 100 }}, ...] or tree = \"DIR\")",
                    ctx()
                ),
                // Checked as a directory when the run starts (it may not exist
                // where the suite is written).
                (Some(t), true) if PathBuf::from(t).is_absolute() => Data::Tree(t.into()),
                (Some(t), true) => bail!("{}: tree '{t}': give an absolute path", ctx()),
                (None, false) => {
                    let mut files = Vec::new();
                    for g in &sc.files {
                        let size = parse_size(&g.size).with_context(ctx)?;
                        if g.count == 0 || g.count > 1_000_000 {
                            bail!("{}: count {} (1 to 1000000)", ctx(), g.count);
                        }
                        files.push(scale_group((size, g.count), data_scale));
                    }
                    Data::Files(files)
                }
            };
            let names = if sc.tools.is_empty() {
                &info.tools
            } else {
                &sc.tools
            };
            if names.is_empty() {
                bail!("{}: no tools (set tools in [suite] or the scenario)", ctx());
            }
            let tools = names
                .iter()
                .map(|t| t.parse::<ToolSpec>())
                .collect::<Result<Vec<_>>>()
                .with_context(ctx)?;
            for (i, t) in tools.iter().enumerate() {
                if tools[..i].iter().any(|u| u.label == t.label) {
                    bail!("{}: tool '{}' is listed twice", ctx(), t.label);
                }
            }
            let sweep = match (&sc.sweep, sc.x) {
                (None, None) => None,
                (Some(name), Some(x)) if self.sweep.contains_key(name) && x.is_finite() => {
                    Some((name.clone(), x))
                }
                (Some(name), Some(_)) if !self.sweep.contains_key(name) => {
                    bail!("{}: sweep '{name}' has no [sweep.{name}]", ctx())
                }
                _ => bail!(
                    "{}: a sweep needs both sweep = \"NAME\" and x = NUMBER",
                    ctx()
                ),
            };
            let background = match &sc.background {
                None => None,
                Some(b) => match (b.tcp_flows, b.udp_pps, b.udp_size) {
                    (Some(0), None, None) => None,
                    (Some(n @ 1..=64), None, None) => Some(Background::Tcp {
                        flows: n,
                        cc: b.cc.clone(),
                    }),
                    (None, Some(pps @ 1..=1_000_000), size) if b.cc.is_none() => {
                        let size = size.unwrap_or(1250);
                        if !(16..=1472).contains(&size) {
                            bail!("{}: background udp_size {size} (16 to 1472)", ctx());
                        }
                        Some(Background::Udp { pps, size })
                    }
                    (None, Some(0), _) if b.cc.is_none() => None,
                    _ => bail!(
                        "{}: background is {{ tcp_flows = 0..64, cc = \"cubic|bbr|reno\" }} or {{ udp_pps = 1..1000000, udp_size = 16..1472 }}, either with lead = \"2s\"..\"120s\"",
                        ctx()
                    ),
                },
            };
            if let Some(c) = sc.background.as_ref().and_then(|b| b.cc.as_ref()) {
                if !["cubic", "bbr", "reno"].contains(&c.as_str()) {
                    bail!("{}: background cc '{c}' (cubic, bbr or reno)", ctx());
                }
            }
            let background_lead = match sc.background.as_ref().and_then(|b| b.lead.as_ref()) {
                None => DEFAULT_BACKGROUND_LEAD,
                Some(l) => match parse_duration(l).with_context(ctx)? {
                    d if d >= Duration::from_secs(2) && d <= Duration::from_secs(120) => d,
                    _ => bail!("{}: background lead {l} (2s to 120s)", ctx()),
                },
            };
            let tcp_max = match &sc.tcp_max {
                None => None,
                Some(t) => match parse_size(t).with_context(ctx)? {
                    b @ 65_536..=1_073_741_824 => Some(b),
                    _ => bail!("{}: tcp_max {t} (64KiB to 1GiB)", ctx()),
                },
            };
            let repeat = prof
                .and_then(|p| p.repeat)
                .unwrap_or(sc.repeat.unwrap_or(info.repeat));
            if !(1..=100).contains(&repeat) {
                bail!("{}: repeat {repeat} (1 to 100)", ctx());
            }
            let cap = sc.time_cap.as_ref().unwrap_or(&info.time_cap);
            let time_cap = parse_duration(cap)
                .with_context(ctx)?
                .mul_f64(time_scale)
                .max(Duration::from_secs(1));
            let cc = sc.cc.clone().or_else(|| info.cc.clone());
            if let Some(c) = &cc {
                if !["cubic", "bbr", "reno"].contains(&c.as_str()) {
                    bail!("{}: cc '{c}' (cubic, bbr or reno)", ctx());
                }
            }
            let mtu = sc.mtu.or(info.mtu).unwrap_or(DEFAULT_MTU);
            if !(576..=9000).contains(&mtu) {
                bail!("{}: mtu {mtu} (576 to 9000)", ctx());
            }
            seen.push(&sc.name);
            if !only.is_empty() && !only.iter().any(|g| glob(g, &sc.name)) {
                continue;
            }
            plans.push(Plan {
                name: sc.name.clone(),
                links,
                dest: sc.dest.unwrap_or(info.dest),
                data,
                tools,
                sweep,
                tcp_max,
                background,
                background_lead,
                repeat,
                time_cap,
                cc,
                mtu,
            });
        }
        if plans.is_empty() {
            bail!("profile '{profile}' selects no scenario (only = {only:?})");
        }
        Ok(plans)
    }
}

/// Checks a `feed` and scales its times by the profile's `time_scale`.
fn resolve_feed(f: &FeedSpec, receivers: usize, time_scale: f64) -> Result<Feed> {
    let load_bps = parse_rate(&f.load).context("feed load")?;
    if !(f.seconds.is_finite() && f.seconds >= 1.0 && f.seconds <= 86_400.0) {
        bail!("feed seconds {} (1 to 86400)", f.seconds);
    }
    let secs = |v: f64| Duration::from_secs_f64(v * time_scale);
    let dur = |v: &Option<String>, default: u64, what: &str| -> Result<Duration> {
        v.as_ref().map_or(Ok(Duration::from_secs(default)), |d| {
            parse_duration(d).with_context(|| format!("feed {what}"))
        })
    };
    let seconds = secs(f.seconds);
    let receiver = |i: usize, what: &str| -> Result<usize> {
        if i >= receivers {
            bail!("feed {what}: receiver {i} of {receivers} (0-based)");
        }
        Ok(i)
    };
    let within = |t: f64, what: &str| -> Result<Duration> {
        if !(t.is_finite() && t >= 0.0 && t < f.seconds) {
            bail!(
                "feed {what}: {t} s is not within the producer's {} s",
                f.seconds
            );
        }
        Ok(secs(t))
    };
    let late = match f.late {
        None => None,
        Some((i, at)) => Some((receiver(i, "late")?, within(at, "late")?)),
    };
    let restart = match f.restart {
        None => None,
        Some((i, at, down)) => {
            if !(down.is_finite() && down > 0.0) {
                bail!("feed restart: down for {down} s");
            }
            Some((receiver(i, "restart")?, within(at, "restart")?, secs(down)))
        }
    };
    if let (Some((a, _)), Some((b, _, _))) = (late, restart) {
        if a == b {
            bail!("feed: receiver {a} both joins late and restarts; give each its own");
        }
    }
    Ok(Feed {
        load_bps,
        seconds,
        drain: dur(&f.drain, 60, "drain")?,
        backlog: dur(&f.backlog, 600, "backlog")?,
        rate_bps: f
            .rate
            .as_deref()
            .map(parse_rate)
            .transpose()
            .context("feed rate")?,
        late,
        restart,
    })
}

fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !ok {
        bail!("{what} name '{name}': use 1 to 64 of A-Z a-z 0-9 - _ .");
    }
    Ok(())
}

/// A size in bytes (the grammar of [`longhaul_transfer::units`]: "10kB" =
/// 10,000, "5MB", "2GB", "1KiB" = 1024, "300"), a whole number up to 10 TB.
pub fn parse_size(s: &str) -> Result<u64> {
    let v = longhaul_transfer::units::parse_size(s)?;
    if v > 10_000_000_000_000 {
        bail!("size '{s}': at most 10 TB");
    }
    Ok(v)
}

/// The slowest rate, bit/s, at which these links deliver to their hosts (the
/// down direction: `down:rate=` or a plain `rate=`); None when none sets one.
pub fn down_rate_bps<'a>(links: impl IntoIterator<Item = &'a str>) -> Option<u64> {
    links
        .into_iter()
        .filter_map(|l| l.parse::<LinkSpec>().ok()?.down.rate_bps)
        .min()
}

/// A rate in bit/s, as the link SPEC writes it ("1G", "100M", "256k").
pub fn parse_rate(s: &str) -> Result<u64> {
    longhaul_netem::spec::parse_rate(s.trim()).map_err(|e| anyhow::anyhow!(e))
}

/// A duration ("300s", "5m", "500ms", "1h"), more than 0 and at most a day.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let d = longhaul_transfer::units::parse_duration(s)?;
    if d.is_zero() || d > Duration::from_secs(86_400) {
        bail!("duration '{s}': more than 0 and at most a day");
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_rates_and_durations() {
        assert_eq!(parse_size("10kB").unwrap(), 10_000);
        assert_eq!(parse_size("1.5MB").unwrap(), 1_500_000);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("0").unwrap(), 0);
        assert!(parse_size("10 parsecs")
            .unwrap_err()
            .to_string()
            .contains("like 10kB"));
        assert!(parse_size("20TB").is_err(), "at most 10 TB");
        assert!(parse_size("1.5B").is_err());
        assert_eq!(parse_rate("1G").unwrap(), 1_000_000_000);
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn every_builtin_suite_parses() {
        for (name, text) in BUILTIN {
            let s = Suite::parse(text).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert_eq!(&s.suite.name, name);
            assert!(!s.plans().unwrap().is_empty());
        }
    }

    #[test]
    fn a_feed_scales_with_the_profile_and_names_what_is_wrong() {
        let s = Suite::load("dissemination").unwrap();
        let quick = &s.plans_for("quick").unwrap()[0];
        let Data::Feed(f) = &quick.data else {
            panic!("{:?}", quick.data)
        };
        assert_eq!(f.load_bps, 350_000_000);
        assert_eq!(f.seconds, Duration::from_secs(60));
        assert_eq!(f.late, Some((3, Duration::from_secs(12))));
        assert_eq!(
            f.restart,
            Some((1, Duration::from_secs(24), Duration::from_secs(6)))
        );
        assert_eq!(f.drain, Duration::from_secs(60), "not scaled");
        let Data::Feed(full) = &s.plans_for("full").unwrap()[0].data else {
            panic!()
        };
        assert_eq!(full.seconds, Duration::from_secs(300));
        let base = BUILTIN
            .iter()
            .find(|(n, _)| *n == "dissemination")
            .unwrap()
            .1;
        let bad = |from: &str, to: &str| {
            let text = base.replace(from, to);
            assert_ne!(text, base, "{from}");
            format!(
                "{:#}",
                Suite::parse(&text).and_then(|s| s.plans()).unwrap_err()
            )
        };
        let e = bad("late = [3, 60]", "late = [4, 60]");
        assert!(e.contains("feed late: receiver 4 of 4"), "{e}");
        let e = bad("late = [3, 60]", "late = [3, 300]");
        assert!(e.contains("not within the producer's 300 s"), "{e}");
        let e = bad("late = [3, 60]", "late = [1, 60]");
        assert!(e.contains("both joins late and restarts"), "{e}");
        let e = bad(
            "late = [3, 60] }",
            "late = [3, 60] }\nfiles = [{ size = \"1MB\", count = 1 }]",
        );
        assert!(e.contains("give feed, files or tree, one of them"), "{e}");
    }

    #[test]
    fn scenarios_are_chosen_by_name_with_globs() {
        let mut s = Suite::load("startup").unwrap();
        s.keep_scenarios(&["join-*".into(), "2GB-700ms-loss0".into()])
            .unwrap();
        let names: Vec<&str> = s.scenarios.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "2GB-700ms-loss0",
                "join-cubic-70ms",
                "join-bbr-70ms",
                "join-udp600-70ms"
            ]
        );
        let mut s = Suite::load("sctp-multifile").unwrap();
        let all = s.published.len();
        s.keep_scenarios(&["A-100x10kB-*".into()]).unwrap();
        assert!(s
            .published
            .iter()
            .all(|p| p.scenario.starts_with("A-100x10kB-")));
        assert!(!s.published.is_empty() && s.published.len() < all);
        let e = Suite::load("startup")
            .unwrap()
            .keep_scenarios(&["nope*".into()])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "no scenario of suite 'startup' matches nope*"
        );
    }

    #[test]
    fn background_takes_a_congestion_control_and_a_lead() {
        let suite = |bg: &str| {
            Suite::parse(&format!(
                "[suite]\nname = \"t\"\ndescription = \"t\"\nline_rate = \"1G\"\ntools = [\"longhaul\"]\n[[scenario]]\nname = \"s\"\nlink = \"rate=1G delay=35ms\"\nbackground = {bg}\nfiles = [{{ size = \"1MB\", count = 1 }}]\n"
            ))
            .and_then(|s| s.plans())
        };
        let p = suite("{ tcp_flows = 2, cc = \"bbr\", lead = \"10s\" }").unwrap();
        assert_eq!(
            p[0].background,
            Some(Background::Tcp {
                flows: 2,
                cc: Some("bbr".into())
            })
        );
        assert_eq!(p[0].background_lead, Duration::from_secs(10));
        assert_eq!(
            p[0].background.as_ref().unwrap().describe(),
            "2 background bbr TCP flows"
        );
        let p = suite("{ udp_pps = 60000, udp_size = 1250 }").unwrap();
        assert_eq!(p[0].background_lead, DEFAULT_BACKGROUND_LEAD);
        assert_eq!(p[0].background.as_ref().unwrap().flows(), 1);
        let e = suite("{ tcp_flows = 1, cc = \"vegas\" }").unwrap_err();
        assert!(e.to_string().contains("background cc 'vegas'"), "{e}");
        let e = suite("{ tcp_flows = 1, lead = \"1s\" }").unwrap_err();
        assert!(
            e.to_string().contains("background lead 1s (2s to 120s)"),
            "{e}"
        );
        let e = suite("{ udp_pps = 100, cc = \"bbr\" }").unwrap_err();
        assert!(e.to_string().contains("background is"), "{e}");
    }

    #[test]
    fn published_figures_name_a_scenario_of_their_suite_and_a_measure() {
        let s = Suite::load("sctp-multifile").unwrap();
        assert_eq!(s.suite.measure, Metric::Seconds);
        let p = s
            .published
            .iter()
            .find(|p| p.scenario == "A-100x1MB-loss03" && p.tool.is_some())
            .expect("seed 001's FTP over TCP at 3 %");
        assert_eq!((p.metric, p.value), (Metric::Seconds, 2210.0));
        assert_eq!(Suite::load("eumetsat").unwrap().suite.measure, Metric::Mbps);
        let base = BUILTIN.iter().find(|(n, _)| *n == "demo").unwrap().1;
        let with = |extra: &str| Suite::parse(&format!("{base}\n{extra}"));
        let figure = |sc: &str, metric: &str, value: &str| {
            format!("[[published]]\nscenario = \"{sc}\"\nseries = \"FTP\"\nmetric = \"{metric}\"\nvalue = {value}\nsource = \"Table 1\"\n")
        };
        let sc = &Suite::load("demo").unwrap().scenarios[0].name.clone();
        assert!(with(&figure(sc, "mbps", "840")).is_ok());
        let e = with(&figure("no-such", "mbps", "840")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "published figure 'FTP' (no-such): no scenario of that name"
        );
        let e = with(&figure(sc, "mbps", "-1")).unwrap_err();
        assert!(e.to_string().contains("a positive number"), "{e}");
        let e = with(&figure(sc, "share", "0.5")).unwrap_err();
        assert!(
            e.to_string().contains("share is not a published measure"),
            "{e}"
        );
        assert!(with(&figure(sc, "speed", "1")).is_err());
        let twice = format!("{0}{0}", figure(sc, "mbps", "840"));
        let e = with(&twice).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
        let tooled = figure(sc, "mbps", "840").replace("series", "tool = \"lftp\"\nseries");
        let e = with(&tooled).unwrap_err();
        assert!(
            e.to_string()
                .contains("tool 'lftp' does not run in that scenario"),
            "{e}"
        );
    }

    /// The suites docs/PERFORMANCE.md gives commands for (docs/lab/*.toml)
    /// still load, and name tools that exist with settings they take.
    #[test]
    fn every_suite_in_docs_lab_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/lab");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_none_or(|x| x != "toml") {
                continue;
            }
            // Loading checks every scenario's tools and their settings too.
            let s = Suite::load(path.to_str().unwrap()).unwrap_or_else(|e| panic!("{e:#}"));
            assert!(!s.plans().unwrap().is_empty(), "{}", path.display());
            n += 1;
        }
        assert!(n >= 5, "{n} suites in {}", dir.display());
    }

    #[test]
    fn profiles_scale_counts_then_single_files() {
        assert_eq!(scale_group((10_000, 20_000), 0.02), (10_000, 400));
        assert_eq!(scale_group((2_000_000_000, 2), 0.02), (80_000_000, 1));
        assert_eq!(scale_group((5_000_000, 40), 0.02), (4_000_000, 1));
        assert_eq!(scale_group((1, 1), 0.01), (1, 1));
        let s = Suite::load("eumetsat").unwrap();
        let full = s.plans_for("full").unwrap();
        let quick = s.plans_for("quick").unwrap();
        assert_eq!((full.len(), quick.len()), (26, 26));
        assert_eq!(full[0].data, Data::Files(vec![(10_000, 20_000)]));
        assert_eq!(quick[0].data, Data::Files(vec![(10_000, 400)]));
        assert_eq!(quick[12].data, Data::Files(vec![(80_000_000, 1)]));
        assert_eq!(full[0].time_cap, Duration::from_secs(3600));
        let cap = quick[0].time_cap.as_secs_f64();
        assert!((cap - 10.0).abs() < 0.01, "{cap}");
        // Categories 5 and 6: a LAN receiver and one behind the path.
        let m = &quick[25];
        assert_eq!(m.name, "26-mcast-2GB-700ms-loss1e-3");
        assert_eq!(m.links.len(), 2);
        assert_eq!(m.max_rtt(), Duration::from_millis(700));
        assert!(quick[..20].iter().all(|p| p.links.len() == 1));
        assert!(s
            .plans_for("fast")
            .unwrap_err()
            .to_string()
            .contains("quick, standard or full"));
    }

    #[test]
    fn gridftp_parallel_sweeps_streams_and_buffers() {
        let s = Suite::load("gridftp-parallel").unwrap();
        let plans = s.plans_for("quick").unwrap();
        assert_eq!(plans.len(), 32);
        let lat = &plans[8];
        assert_eq!(lat.sweep, Some(("latency-4MiB".to_string(), 1.0)));
        assert_eq!(lat.tcp_max, Some(4 << 20));
        assert_eq!(lat.data, Data::Files(vec![(107_374_182, 1)]));
        let labels: Vec<&str> = lat.tools.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels.first(), Some(&"gridftp:p=1"));
        assert_eq!(labels.last(), Some(&"longhaul"));
        let bs = &plans[16];
        assert_eq!(bs.tools[0].label, "gridftp:p=4,tcp-bs=256KiB");
        assert_eq!(bs.tcp_max, Some(16 << 20));
        let loss = plans.last().unwrap();
        assert_eq!(loss.sweep, Some(("loss".to_string(), 5.0)));
        assert!(loss.links[0].contains("loss=5%"));
    }

    #[test]
    fn the_outages_suite_schedules_its_links_and_keeps_quick_inside_the_outage() {
        let s = Suite::load("outages").unwrap();
        let full = s.plans_for("full").unwrap();
        let names: Vec<&str> = full.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "300MB-down20s-at5s",
                "300MB-down60s-at5s",
                "300MB-10M-30s-at5s"
            ]
        );
        let sec = 1_000_000_000;
        for (p, outage, step) in [
            (&full[0], Some(20), None),
            (&full[1], Some(60), None),
            (&full[2], None, Some(30)),
        ] {
            let l: LinkSpec = p.links[0].parse().unwrap();
            assert_eq!(l.down.rate_bps, Some(100_000_000));
            assert_eq!(l.up.delay_ns + l.down.delay_ns, 70_000_000);
            let sch = &l.down.schedule;
            assert_eq!(
                sch.outages.first().map(|o| (o.start_ns, o.dur_ns / sec)),
                outage.map(|d| (5 * sec, d))
            );
            assert_eq!(
                sch.rates
                    .first()
                    .map(|r| (r.start_ns, r.dur_ns, r.rate_bps)),
                step.map(|d| (5 * sec, Some(d * sec), 10_000_000))
            );
            assert_eq!(l.up.schedule, *sch, "both directions");
            assert_eq!(p.data, Data::Files(vec![(300_000_000, 1)]));
            // The outage, the back-off after it and the transfer fit.
            let need = 5 + outage.unwrap_or(0) * 2 + step.unwrap_or(0) + 24;
            assert!(
                p.time_cap.as_secs() >= need + 30,
                "{}: {:?}",
                p.name,
                p.time_cap
            );
            let labels: Vec<&str> = p.tools.iter().map(|t| t.label.as_str()).collect();
            assert_eq!(labels, ["longhaul", "rsync", "gridftp:rst=yes"]);
        }
        // Quick: the file still moves when the link goes at 5 s (12 s at
        // 100 Mbit/s), under the same caps.
        let quick = s.plans_for("quick").unwrap();
        assert_eq!(quick.len(), 2);
        assert_eq!(quick[0].data, Data::Files(vec![(150_000_000, 1)]));
        assert_eq!(quick[0].time_cap, full[0].time_cap);
        assert_eq!(quick[1].name, "300MB-10M-30s-at5s");
    }

    #[test]
    fn globs() {
        assert!(glob("a*", "abc") && glob("*c", "abc") && glob("a*c", "abc") && glob("*", ""));
        assert!(glob("1M-*-loss*", "1M-35ms-loss3") && !glob("1M-*-loss*", "10K-35ms-loss3"));
        assert!(!glob("abc", "abcd") && glob("a**", "a") && glob("é*", "éa"));
    }

    /// A suite "t" at 1G of one scenario "a": `tools` (TOML list items), then
    /// the scenario's `body`.
    fn one_scenario(tools: &str, body: &str) -> String {
        format!("[suite]\nname = \"t\"\nline_rate = \"1G\"\ntools = [{tools}]\n[[scenario]]\nname = \"a\"\n{body}\n")
    }

    #[test]
    fn receivers_and_links() {
        let base = one_scenario(
            "\"uftp\"",
            "LINKS\nfiles = [{ size = \"10kB\", count = 3 }]",
        );
        let plan = |links: &str| {
            Suite::parse(&base.replace("LINKS", links)).map(|s| s.plans().unwrap()[0].clone())
        };
        let p = plan("link = \"delay=5ms\"\nreceivers = 3").unwrap();
        assert_eq!(p.links, vec!["delay=5ms"; 3]);
        assert_eq!(p.link_line(), "delay=5ms | delay=5ms | delay=5ms");
        let p = plan("links = [\"rate=1G\", \"delay=35ms\"]").unwrap();
        assert_eq!(p.links.len(), 2);
        assert_eq!(p.dest, Storage::Disk);
        let err = |l: &str| format!("{:#}", plan(l).unwrap_err());
        assert!(err("links = [\"a=b\"]").contains("link 'a=b'"));
        assert!(err("link = \"\"\nlinks = [\"\"]").contains("not both"));
        assert!(err("links = [\"\"]\nreceivers = 2").contains("receivers = 2 but 1 links"));
        assert!(err("link = \"\"\nreceivers = 9").contains("9 receivers (1 to 8)"));
        assert!(err("dest = \"tape\"\nlink = \"\"").contains("unknown variant `tape`"));
        assert!(err("").contains("no link"));
        let swept = base.replace("LINKS", "link = \"\"\nsweep = \"lat\"\nx = 3");
        assert!(format!("{:#}", Suite::parse(&swept).unwrap_err()).contains("has no [sweep.lat]"));
        let half = base.replace("LINKS", "link = \"\"\nx = 3");
        assert!(format!("{:#}", Suite::parse(&half).unwrap_err()).contains("needs both"));
        let twice = base.replace("LINKS", "link = \"\"\ntools = [\"uftp\", \"uftp\"]");
        assert!(format!("{:#}", Suite::parse(&twice).unwrap_err()).contains("listed twice"));
        let bad_profile = base
            .replace("LINKS", "link = \"\"")
            .replace("[[scenario]]", "[profile.fast]\n[[scenario]]");
        assert!(format!("{:#}", Suite::parse(&bad_profile).unwrap_err()).contains("profile 'fast'"));
    }

    #[test]
    fn mtu_comes_from_the_scenario_else_the_suite_else_1500() {
        let base = one_scenario(
            "\"longhaul\"",
            "link = \"rate=10G\"\nMTU\nfiles = [{ size = \"10kB\", count = 3 }]",
        );
        let plan = |suite: &str, sc: &str| {
            let text = base
                .replace("MTU", sc)
                .replace("[[scenario]]", &format!("{suite}\n[[scenario]]"));
            Suite::parse(&text).and_then(|s| Ok(s.plans()?[0].clone()))
        };
        let p = plan("", "").unwrap();
        assert_eq!((p.mtu, p.mtu_note()), (1500, String::new()));
        let p = plan("", "mtu = 9000").unwrap();
        assert_eq!((p.mtu, p.mtu_note()), (9000, ", MTU 9000".to_string()));
        // The suite's table comes before the scenario: give its mtu there.
        let text = base
            .replace("MTU", "")
            .replace("tools = [", "mtu = 4000\ntools = [");
        assert_eq!(Suite::parse(&text).unwrap().plans().unwrap()[0].mtu, 4000);
        let text = base
            .replace("MTU", "mtu = 9000")
            .replace("tools = [", "mtu = 4000\ntools = [");
        assert_eq!(Suite::parse(&text).unwrap().plans().unwrap()[0].mtu, 9000);
        let err = format!("{:#}", plan("", "mtu = 9001").unwrap_err());
        assert!(
            err.contains("scenario 'a': mtu 9001 (576 to 9000)"),
            "{err}"
        );
    }

    #[test]
    fn a_tree_is_a_data_set_used_as_it_is_and_files_or_tree_not_both() {
        let base = one_scenario("\"longhaul\", \"rsync\"", "link = \"delay=35ms\"\nDATA");
        let parse = |data: &str| {
            Suite::parse(&format!(
                "{}[profile.quick]\ndata_scale = 0.01\n",
                base.replace("DATA", data)
            ))
        };
        let s = parse("tree = \"/usr/share\"").unwrap();
        for profile in PROFILES {
            let p = &s.plans_for(profile).unwrap()[0];
            assert_eq!(p.data, Data::Tree("/usr/share".into()), "{profile}");
            assert_eq!(p.data.line(), "tree /usr/share");
        }
        let note = crate::runner::profile_note(&s, "quick").unwrap();
        assert!(
            note.contains("a tree scenario's directory is used as it is"),
            "{note}"
        );
        // Checked as a directory only when the run starts.
        assert!(parse("tree = \"/no/such/tree\"").is_ok());
        let err = |data: &str| format!("{:#}", parse(data).unwrap_err());
        let both = err("tree = \"/usr/share\"\nfiles = [{ size = \"1kB\", count = 1 }]");
        assert!(
            both.contains("scenario 'a': give files or tree, not both"),
            "{both}"
        );
        assert!(err("").contains("scenario 'a': no data set (files = ["));
        assert!(err("files = []").contains("scenario 'a': no data set"));
        assert!(err("tree = \"usr/share\"").contains("tree 'usr/share': give an absolute path"));
        assert!(err("tree = 3").contains("invalid type"));
    }

    #[test]
    fn mistakes_are_named() {
        let base = r#"
[suite]
name = "t"
line_rate = "1G"
tools = ["longhaul"]
[[scenario]]
name = "a"
link = "delay=35ms"
files = [{ size = "10kB", count = 3 }]
"#;
        let s = Suite::parse(base).unwrap();
        let p = &s.plans().unwrap()[0];
        assert_eq!(p.data, Data::Files(vec![(10_000, 3)]));
        assert_eq!((p.data.line().as_str(), p.repeat), ("3 files, 0.0 MB", 1));
        assert_eq!(p.time_cap, Duration::from_secs(300));
        let err = |from: &str, to: &str| {
            format!("{:#}", Suite::parse(&base.replace(from, to)).unwrap_err())
        };
        assert!(err("delay=35ms", "delay=35parsecs").contains("scenario 'a': link"));
        assert!(err("\"longhaul\"", "\"carrier-pigeon\"").contains("unknown tool 'carrier-pigeon'"));
        assert!(err("count = 3", "count = 0").contains("count 0"));
        assert!(err("name = \"a\"", "name = \"a b\"").contains("scenario name 'a b'"));
        assert!(err("link =", "lnik =").contains("unknown field `lnik`"));
        assert!(err("1G", "fast").contains("line_rate"));
        let twice = format!("{base}\n[[scenario]]\nname = \"a\"\nlink = \"\"\nfiles = [{{ size = \"1B\", count = 1 }}]\n");
        assert!(format!("{:#}", Suite::parse(&twice).unwrap_err()).contains("appears twice"));
    }
}
