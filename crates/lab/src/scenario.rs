//! Scenarios as data: a suite file (TOML) names a suite and lists its
//! scenarios, each a link, a data set and the tools to run over it. The
//! built-in suites are files of the same format, compiled in.

use crate::tools::Tool;
use anyhow::{bail, Context, Result};
use longhaul_netem::LinkSpec;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A suite file as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    pub suite: SuiteInfo,
    #[serde(rename = "scenario")]
    pub scenarios: Vec<Scenario>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteInfo {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The study it replays (e.g. "seed 000: EUMETSAT WAN study, Table 1").
    #[serde(default)]
    pub cites: String,
    /// The path's line rate (bit/s, e.g. "1G"), for TTP.
    pub line_rate: String,
    /// Throughput a tool must reach to meet the suite's target (Mbit/s).
    #[serde(default)]
    pub target_mbps: Option<f64>,
    /// Tools of every scenario that names none.
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default = "one")]
    pub repeat: u32,
    /// Longest a tool may take in one run ("300s", "5m").
    #[serde(default = "five_minutes")]
    pub time_cap: String,
    /// Kernel congestion control of both hosts for TCP tools (cubic, bbr, reno).
    #[serde(default)]
    pub cc: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    /// The client's link (emulator SPEC); the server sits at the hub.
    pub link: String,
    /// The data set: groups of files of one size.
    pub files: Vec<FileGroup>,
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub repeat: Option<u32>,
    #[serde(default)]
    pub time_cap: Option<String>,
    #[serde(default)]
    pub cc: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileGroup {
    /// Size of each file ("10kB", "5MB", "1GiB").
    pub size: String,
    pub count: u64,
}

fn one() -> u32 {
    1
}

fn five_minutes() -> String {
    "300s".into()
}

/// A scenario with everything resolved and checked.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub name: String,
    pub link: String,
    pub files: Vec<(u64, u64)>,
    pub tools: Vec<Tool>,
    pub repeat: u32,
    pub time_cap: Duration,
    pub cc: Option<String>,
}

impl Plan {
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(size, n)| size * n).sum()
    }

    pub fn file_count(&self) -> u64 {
        self.files.iter().map(|(_, n)| n).sum()
    }
}

/// The built-in suites: (name, TOML).
pub const BUILTIN: &[(&str, &str)] = &[
    ("demo", include_str!("../suites/demo.toml")),
    ("smoke", include_str!("../suites/smoke.toml")),
];

impl Suite {
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

    pub fn parse(text: &str) -> Result<Suite> {
        let s: Suite = toml::from_str(text)?;
        s.plans()?;
        Ok(s)
    }

    pub fn line_rate_bps(&self) -> u64 {
        parse_rate(&self.suite.line_rate).expect("checked by plans()")
    }

    /// Every scenario, resolved against the suite's defaults and checked.
    pub fn plans(&self) -> Result<Vec<Plan>> {
        let info = &self.suite;
        check_name("suite", &info.name)?;
        parse_rate(&info.line_rate).context("line_rate")?;
        if self.scenarios.is_empty() {
            bail!("suite '{}' has no [[scenario]]", info.name);
        }
        let mut plans = Vec::new();
        for sc in &self.scenarios {
            let ctx = || format!("scenario '{}'", sc.name);
            check_name("scenario", &sc.name)?;
            if plans.iter().any(|p: &Plan| p.name == sc.name) {
                bail!("scenario '{}' appears twice", sc.name);
            }
            sc.link
                .parse::<LinkSpec>()
                .map_err(|e| anyhow::anyhow!("link: {e}"))
                .with_context(ctx)?;
            if sc.files.is_empty() {
                bail!("{}: files is empty", ctx());
            }
            let mut files = Vec::new();
            for g in &sc.files {
                let size = parse_size(&g.size).with_context(ctx)?;
                if g.count == 0 || g.count > 1_000_000 {
                    bail!("{}: count {} (1 to 1000000)", ctx(), g.count);
                }
                files.push((size, g.count));
            }
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
                .map(|t| t.parse::<Tool>())
                .collect::<Result<Vec<_>>>()
                .with_context(ctx)?;
            let repeat = sc.repeat.unwrap_or(info.repeat);
            if !(1..=100).contains(&repeat) {
                bail!("{}: repeat {repeat} (1 to 100)", ctx());
            }
            let cap = sc.time_cap.as_ref().unwrap_or(&info.time_cap);
            let time_cap = parse_duration(cap).with_context(ctx)?;
            let cc = sc.cc.clone().or_else(|| info.cc.clone());
            if let Some(c) = &cc {
                if !["cubic", "bbr", "reno"].contains(&c.as_str()) {
                    bail!("{}: cc '{c}' (cubic, bbr or reno)", ctx());
                }
            }
            plans.push(Plan {
                name: sc.name.clone(),
                link: sc.link.clone(),
                files,
                tools,
                repeat,
                time_cap,
                cc,
            });
        }
        Ok(plans)
    }
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

/// "10kB" = 10,000; "5MB"; "2GB"; "1KiB" = 1024; "1MiB"; "1GiB"; "300" or "300B".
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" | "k" => 1_000,
        "MB" | "M" => 1_000_000,
        "GB" | "G" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        u => bail!("size '{s}': unknown unit '{u}' (B, kB, MB, GB, KiB, MiB, GiB)"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("size '{s}': expected a number and a unit, like 10kB"))?;
    let v = n * mult as f64;
    if !(0.0..=1e13).contains(&v) || v.fract() != 0.0 {
        bail!("size '{s}': a whole number of bytes up to 10 TB");
    }
    Ok(v as u64)
}

/// A rate in bit/s, as the link SPEC writes it ("1G", "100M", "256k").
pub fn parse_rate(s: &str) -> Result<u64> {
    longhaul_netem::spec::parse_rate(s.trim()).map_err(|e| anyhow::anyhow!(e))
}

/// "300s", "5m", "500ms", "1h".
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("duration '{s}': expected a number and a unit, like 300s"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => bail!("duration '{s}': unit ms, s, m or h"),
    };
    if !(secs > 0.0 && secs <= 86_400.0) {
        bail!("duration '{s}': more than 0 and at most a day");
    }
    Ok(Duration::from_secs_f64(secs))
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
            .contains("unknown unit"));
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
        assert_eq!((p.bytes(), p.file_count(), p.repeat), (30_000, 3, 1));
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
