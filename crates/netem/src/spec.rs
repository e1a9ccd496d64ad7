//! Link specifications: the text a user writes (`rate=1G delay=35ms loss=1e-3`)
//! and the typed form the link model runs on.
//!
//! A spec is a whitespace-separated list of `key=value` tokens. A token applies
//! to both directions unless it is prefixed with `up:` (host → hub) or `down:`
//! (hub → host). Keys:
//!
//! | key | value | meaning |
//! |---|---|---|
//! | `rate` | `1G`, `100M`, `256k`, `1500000` (bit/s; `bit`/`bps` suffix allowed) | serialisation rate; absent = unlimited |
//! | `delay` | `35ms`, `1.5s`, `500us`, `0` | one-way propagation delay |
//! | `jitter` | duration | each packet's delay varies uniformly in ±jitter (order is kept) |
//! | `loss` | `1e-3`, `0.1%`, `ge:p=..,r=..,h=..,k=..`, `burst:RATE:len=N` | loss model |
//! | `queue` | `50pkts`, `50`, `256KB`, `1MiB` | drop-tail queue limit in packets or bytes |
//!
//! Gilbert-Elliott uses the classic notation: `p` = P(good → bad), `r` = P(bad →
//! good), `h` = P(packet survives | bad), `k` = P(packet survives | good); so
//! `ge:p=0.001,r=0.3,h=0,k=1` loses every packet in the bad state and none in the
//! good one. `burst:1e-3:len=4` loses bursts of exactly 4 packets, starting them
//! so that the long-run loss rate is 1e-3.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Errors from parsing a spec; each names the token at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    /// A token without `=` (not `key=value`); holds the token.
    #[error("'{0}': expected key=value (keys: rate, delay, jitter, loss, queue; optional up:/down: prefix)")]
    Syntax(String),
    #[error("'{token}': unknown key '{key}' (keys: rate, delay, jitter, loss, queue)")]
    /// A key other than rate, delay, jitter, loss and queue.
    UnknownKey {
        /// The token as written, with any `up:`/`down:` prefix.
        token: String,
        /// The key that is not known.
        key: String,
    },
    #[error("'{token}': {why}")]
    /// A known key whose value does not parse or is out of range; also jitter
    /// larger than delay in a direction.
    Value {
        /// The token as written (the whole spec when jitter exceeds delay).
        token: String,
        /// Why the value was refused, for the user.
        why: String,
    },
}

/// A loss model, as specified.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "model", rename_all = "snake_case")]
pub enum LossSpec {
    /// No loss.
    #[default]
    None,
    /// Each packet is lost independently with probability `p`.
    Bernoulli {
        /// Probability that a packet is lost, in [0, 1] (the parser makes 0 `None`).
        p: f64,
    },
    /// Two-state Markov chain (see the module docs for the notation).
    GilbertElliott {
        /// P(good → bad), drawn before each packet.
        p: f64,
        /// P(bad → good), drawn before each packet.
        r: f64,
        /// P(packet survives | bad state); 0 by default.
        h: f64,
        /// P(packet survives | good state); 1 by default.
        k: f64,
    },
    /// Bursts of exactly `len` packets, with long-run loss rate `rate`.
    Burst {
        /// Long-run fraction of packets lost, in [0, 1).
        rate: f64,
        /// Packets lost in each burst, exactly (1 to 1,000,000).
        len: u32,
    },
}

impl LossSpec {
    /// The long-run fraction of packets this model loses.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            LossSpec::None => 0.0,
            LossSpec::Bernoulli { p } => p,
            LossSpec::GilbertElliott { p, r, h, k } => {
                if p + r == 0.0 {
                    return 1.0 - k;
                }
                let pi_bad = p / (p + r);
                pi_bad * (1.0 - h) + (1.0 - pi_bad) * (1.0 - k)
            }
            LossSpec::Burst { rate, .. } => rate,
        }
    }

    /// Mean length of a run of consecutive losses, where the model defines one
    /// simply (Bernoulli, burst, and Gilbert-Elliott with h=0, k=1).
    pub fn mean_burst(&self) -> Option<f64> {
        match *self {
            LossSpec::None => None,
            LossSpec::Bernoulli { p } => Some(1.0 / (1.0 - p)),
            LossSpec::GilbertElliott { r, h, k, .. } if h == 0.0 && k == 1.0 => Some(1.0 / r),
            LossSpec::GilbertElliott { .. } => None,
            LossSpec::Burst { len, .. } => Some(len as f64),
        }
    }
}

/// The drop-tail queue limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueLimit {
    /// At most this many wire packets not yet fully serialised (the one on the
    /// wire included); a packet arriving to a full queue is dropped.
    Packets(u32),
    /// At most this many IP bytes not yet fully serialised; a packet that
    /// would go over is dropped.
    Bytes(u64),
}

/// Default queue when a rate is set and no queue is given: netem's default.
pub const DEFAULT_QUEUE: QueueLimit = QueueLimit::Packets(1000);

/// One direction of a link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DirSpec {
    /// Serialisation rate in bit/s; `None` = unlimited (no queue either).
    pub rate_bps: Option<u64>,
    /// One-way propagation delay, ns.
    pub delay_ns: u64,
    /// Uniform jitter amplitude (±), ns.
    pub jitter_ns: u64,
    /// Loss model, drawn for each wire packet after its serialisation.
    pub loss: LossSpec,
    /// Drop-tail queue limit in front of the serialiser; used only when
    /// `rate_bps` is set.
    pub queue: QueueLimit,
}

impl Default for DirSpec {
    fn default() -> Self {
        DirSpec {
            rate_bps: None,
            delay_ns: 0,
            jitter_ns: 0,
            loss: LossSpec::None,
            queue: DEFAULT_QUEUE,
        }
    }
}

impl DirSpec {
    /// True when this direction does nothing to packets (they pass straight through).
    pub fn is_ideal(&self) -> bool {
        self.rate_bps.is_none()
            && self.delay_ns == 0
            && self.jitter_ns == 0
            && self.loss == LossSpec::None
    }
}

/// Both directions of a host's link: `up` carries what the host sends, `down`
/// what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct LinkSpec {
    /// Host → hub: what the host sends.
    pub up: DirSpec,
    /// Hub → host: what the host receives.
    pub down: DirSpec,
}

impl LinkSpec {
    /// True when both directions pass packets straight through.
    pub fn is_ideal(&self) -> bool {
        self.up.is_ideal() && self.down.is_ideal()
    }
}

impl std::str::FromStr for LinkSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let mut spec = LinkSpec::default();
        for token in s.split_whitespace() {
            // What an unimpaired spec prints as (and so must read back).
            if token == "ideal" {
                continue;
            }
            let (dirs, kv): (&[bool; 2], &str) = if let Some(rest) = token.strip_prefix("up:") {
                (&[true, false], rest)
            } else if let Some(rest) = token.strip_prefix("down:") {
                (&[false, true], rest)
            } else {
                (&[true, true], token)
            };
            let (key, value) = kv
                .split_once('=')
                .ok_or_else(|| SpecError::Syntax(token.to_string()))?;
            let bad = |why: String| SpecError::Value {
                token: token.to_string(),
                why,
            };
            for (i, dir) in [&mut spec.up, &mut spec.down].into_iter().enumerate() {
                if !dirs[i] {
                    continue;
                }
                match key {
                    "rate" => dir.rate_bps = Some(parse_rate(value).map_err(bad)?),
                    "delay" => dir.delay_ns = parse_duration(value).map_err(bad)?,
                    "jitter" => dir.jitter_ns = parse_duration(value).map_err(bad)?,
                    "loss" => dir.loss = parse_loss(value).map_err(bad)?,
                    "queue" => dir.queue = parse_queue(value).map_err(bad)?,
                    _ => {
                        return Err(SpecError::UnknownKey {
                            token: token.to_string(),
                            key: key.to_string(),
                        })
                    }
                }
            }
        }
        for dir in [&spec.up, &spec.down] {
            if dir.jitter_ns > dir.delay_ns {
                return Err(SpecError::Value {
                    token: s.to_string(),
                    why: format!(
                        "jitter ({}) larger than delay ({}) would need negative delays",
                        fmt_duration(dir.jitter_ns),
                        fmt_duration(dir.delay_ns)
                    ),
                });
            }
        }
        Ok(spec)
    }
}

/// Parses a rate in bit/s (the grammar of [`longhaul_transfer::units`]:
/// `1G`, `100M`, `256k`, `2.5Gbit`, `10mbps`, `1500000`), 1 kbit/s to 1 Tbit/s.
pub fn parse_rate(v: &str) -> Result<u64, String> {
    let bps = longhaul_transfer::units::parse_rate(v).map_err(|e| e.to_string())?;
    if !(1000..=1_000_000_000_000).contains(&bps) {
        return Err(format!("rate {v} out of range (1 kbit/s to 1 Tbit/s)"));
    }
    Ok(bps)
}

/// Parses a duration to ns (`35ms`, `1.5s`, `500us`, `0`), at most 60 s.
pub fn parse_duration(v: &str) -> Result<u64, String> {
    let d = longhaul_transfer::units::parse_duration(v).map_err(|e| e.to_string())?;
    if d > std::time::Duration::from_secs(60) {
        return Err(format!("duration {v} out of range (0 to 60 s)"));
    }
    Ok(d.as_nanos() as u64)
}

fn parse_prob(name: &str, v: &str) -> Result<f64, String> {
    let p = if let Some(pct) = v.strip_suffix('%') {
        pct.parse::<f64>().map(|x| x / 100.0)
    } else {
        v.parse::<f64>()
    }
    .map_err(|_| format!("{name} '{v}' is not a probability (examples: 1e-3, 0.1%)"))?;
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("{name} {v} is not within [0, 1]"));
    }
    Ok(p)
}

/// Parses a loss model: `1e-3`, `0.1%`, `ge:p=..,r=..[,h=..][,k=..]`, `burst:RATE:len=N`.
pub fn parse_loss(v: &str) -> Result<LossSpec, String> {
    if let Some(params) = v.strip_prefix("ge:") {
        let (mut p, mut r, mut h, mut k) = (None, None, 0.0, 1.0);
        for kv in params.split(',') {
            let (key, val) = kv.split_once('=').ok_or_else(|| {
                format!("Gilbert-Elliott parameter '{kv}': expected p=, r=, h= or k=")
            })?;
            let x = parse_prob(key, val)?;
            match key {
                "p" => p = Some(x),
                "r" => r = Some(x),
                "h" => h = x,
                "k" => k = x,
                _ => {
                    return Err(format!(
                        "Gilbert-Elliott has no parameter '{key}' (p, r, h, k)"
                    ))
                }
            }
        }
        let (Some(p), Some(r)) = (p, r) else {
            return Err("Gilbert-Elliott needs p= (good→bad) and r= (bad→good)".into());
        };
        if r == 0.0 && p > 0.0 {
            return Err("Gilbert-Elliott with r=0 never leaves the bad state".into());
        }
        return Ok(LossSpec::GilbertElliott { p, r, h, k });
    }
    if let Some(rest) = v.strip_prefix("burst:") {
        let (rate, len) = rest.split_once(":len=").ok_or_else(|| {
            format!("'{v}': expected burst:RATE:len=N (example: burst:1e-3:len=4)")
        })?;
        let rate = parse_prob("burst rate", rate)?;
        let len: u32 = len
            .parse()
            .ok()
            .filter(|&n| (1..=1_000_000).contains(&n))
            .ok_or_else(|| format!("burst length '{len}' must be a whole number ≥ 1"))?;
        if rate >= 1.0 {
            return Err("a burst loss rate must be below 1".into());
        }
        return Ok(LossSpec::Burst { rate, len });
    }
    let p = parse_prob("loss", v)?;
    Ok(if p == 0.0 {
        LossSpec::None
    } else {
        LossSpec::Bernoulli { p }
    })
}

/// Parses a queue limit: `50pkts`, `50p`, `50` (packets) or `256KB`, `1MiB`, `64000B` (bytes).
pub fn parse_queue(v: &str) -> Result<QueueLimit, String> {
    let lower = v.to_ascii_lowercase();
    for suffix in ["pkts", "pkt", "p"] {
        if let Some(n) = lower.strip_suffix(suffix) {
            return parse_count(n, v).map(QueueLimit::Packets);
        }
    }
    let units: [(&str, u64); 7] = [
        ("kib", 1024),
        ("mib", 1 << 20),
        ("kb", 1000),
        ("mb", 1_000_000),
        ("k", 1000),
        ("m", 1_000_000),
        ("b", 1),
    ];
    for (suffix, mult) in units {
        if let Some(n) = lower.strip_suffix(suffix) {
            let n: u64 = n
                .parse()
                .map_err(|_| format!("'{v}' is not a queue size (examples: 50pkts, 256KB)"))?;
            let bytes = n.saturating_mul(mult);
            if !(1500..=1 << 32).contains(&bytes) {
                return Err(format!("queue {v} out of range (1500 B to 4 GiB)"));
            }
            return Ok(QueueLimit::Bytes(bytes));
        }
    }
    parse_count(&lower, v).map(QueueLimit::Packets)
}

fn parse_count(n: &str, v: &str) -> Result<u32, String> {
    n.parse()
        .ok()
        .filter(|&n| (1..=10_000_000).contains(&n))
        .ok_or_else(|| format!("'{v}' is not a queue size (examples: 50pkts, 256KB)"))
}

/// Formats a duration in ns as a spec token the parser reads back exactly:
/// the largest whole unit (`0`, `2s`, `35ms`, `500us`, `7ns`).
pub(crate) fn fmt_duration(ns: u64) -> String {
    if ns == 0 {
        "0".into()
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1000) {
        format!("{}us", ns / 1000)
    } else {
        format!("{ns}ns")
    }
}

fn fmt_rate(bps: u64) -> String {
    if bps.is_multiple_of(1_000_000_000) {
        format!("{}G", bps / 1_000_000_000)
    } else if bps.is_multiple_of(1_000_000) {
        format!("{}M", bps / 1_000_000)
    } else if bps.is_multiple_of(1000) {
        format!("{}k", bps / 1000)
    } else {
        bps.to_string()
    }
}

impl fmt::Display for LossSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LossSpec::None => write!(f, "0"),
            LossSpec::Bernoulli { p } => write!(f, "{p}"),
            LossSpec::GilbertElliott { p, r, h, k } => write!(f, "ge:p={p},r={r},h={h},k={k}"),
            LossSpec::Burst { rate, len } => write!(f, "burst:{rate}:len={len}"),
        }
    }
}

impl fmt::Display for QueueLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            QueueLimit::Packets(n) => write!(f, "{n}pkts"),
            QueueLimit::Bytes(n) => write!(f, "{n}B"),
        }
    }
}

impl DirSpec {
    fn tokens(&self) -> Vec<String> {
        let mut t = Vec::new();
        if let Some(r) = self.rate_bps {
            t.push(format!("rate={}", fmt_rate(r)));
        }
        if self.delay_ns != 0 {
            t.push(format!("delay={}", fmt_duration(self.delay_ns)));
        }
        if self.jitter_ns != 0 {
            t.push(format!("jitter={}", fmt_duration(self.jitter_ns)));
        }
        if self.loss != LossSpec::None {
            t.push(format!("loss={}", self.loss));
        }
        if self.queue != DEFAULT_QUEUE {
            t.push(format!("queue={}", self.queue));
        }
        t
    }
}

/// Canonical text: parses back to the same spec. Tokens shared by both
/// directions are written once; the rest get `up:`/`down:` prefixes.
impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let up = self.up.tokens();
        let down = self.down.tokens();
        let mut out: Vec<String> = Vec::new();
        for t in &up {
            if down.contains(t) {
                out.push(t.clone());
            } else {
                out.push(format!("up:{t}"));
            }
        }
        for t in &down {
            if !up.contains(t) {
                out.push(format!("down:{t}"));
            }
        }
        if out.is_empty() {
            return write!(f, "ideal");
        }
        write!(f, "{}", out.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ideal_spec_prints_as_ideal_and_reads_back() {
        // Found by the link_spec fuzz target: "" parsed, printed as "ideal",
        // and "ideal" did not parse.
        let ideal: LinkSpec = "".parse().unwrap();
        assert_eq!(ideal.to_string(), "ideal");
        assert_eq!("ideal".parse::<LinkSpec>().unwrap(), ideal);
    }

    #[test]
    fn parses_the_issue_examples() {
        let s: LinkSpec = "rate=1G delay=35ms jitter=1ms loss=1e-3 queue=50pkts"
            .parse()
            .unwrap();
        assert_eq!(s.up, s.down);
        assert_eq!(s.up.rate_bps, Some(1_000_000_000));
        assert_eq!(s.up.delay_ns, 35_000_000);
        assert_eq!(s.up.jitter_ns, 1_000_000);
        assert_eq!(s.up.loss, LossSpec::Bernoulli { p: 1e-3 });
        assert_eq!(s.up.queue, QueueLimit::Packets(50));

        let ge: LinkSpec = "loss=ge:p=0.001,r=0.3,h=0.0,k=1.0".parse().unwrap();
        assert_eq!(
            ge.down.loss,
            LossSpec::GilbertElliott {
                p: 0.001,
                r: 0.3,
                h: 0.0,
                k: 1.0
            }
        );
        let b: LinkSpec = "loss=burst:1e-3:len=4".parse().unwrap();
        assert_eq!(b.up.loss, LossSpec::Burst { rate: 1e-3, len: 4 });
    }

    #[test]
    fn direction_prefixes_apply_to_one_side() {
        let s: LinkSpec = "delay=35ms up:rate=100M down:rate=1G down:loss=1%"
            .parse()
            .unwrap();
        assert_eq!(s.up.rate_bps, Some(100_000_000));
        assert_eq!(s.down.rate_bps, Some(1_000_000_000));
        assert_eq!(s.up.delay_ns, s.down.delay_ns);
        assert_eq!(s.up.loss, LossSpec::None);
        assert_eq!(s.down.loss, LossSpec::Bernoulli { p: 0.01 });
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "rate=1G delay=35ms jitter=1ms loss=0.001 queue=50pkts",
            "delay=350ms up:rate=256k down:rate=3M down:loss=ge:p=0.01,r=0.3,h=0,k=1",
            "rate=2500000 queue=64000B loss=burst:0.001:len=4",
        ] {
            let s: LinkSpec = text.parse().unwrap();
            let again: LinkSpec = s.to_string().parse().unwrap();
            assert_eq!(s, again, "{text} -> {s}");
        }
        assert_eq!(LinkSpec::default().to_string(), "ideal");
    }

    #[test]
    fn errors_name_the_token() {
        let e = "rate=fast".parse::<LinkSpec>().unwrap_err();
        assert!(e.to_string().contains("'rate=fast'"), "{e}");
        let e = "delay=35".parse::<LinkSpec>().unwrap_err();
        assert!(e.to_string().contains("needs a unit"), "{e}");
        let e = "colour=red".parse::<LinkSpec>().unwrap_err();
        assert!(matches!(e, SpecError::UnknownKey { .. }), "{e}");
        let e = "loss=1.5".parse::<LinkSpec>().unwrap_err();
        assert!(e.to_string().contains("within [0, 1]"), "{e}");
        let e = "delay=1ms jitter=2ms".parse::<LinkSpec>().unwrap_err();
        assert!(e.to_string().contains("jitter"), "{e}");
        let e = "loss=ge:p=0.1".parse::<LinkSpec>().unwrap_err();
        assert!(e.to_string().contains("needs p="), "{e}");
        assert!("rate".parse::<LinkSpec>().is_err());
    }

    #[test]
    fn model_moments() {
        let ge = LossSpec::GilbertElliott {
            p: 0.001,
            r: 0.3,
            h: 0.0,
            k: 1.0,
        };
        assert!((ge.mean_loss() - 0.001 / 0.301).abs() < 1e-12);
        assert!((ge.mean_burst().unwrap() - 1.0 / 0.3).abs() < 1e-12);
        assert_eq!(
            LossSpec::Burst { rate: 0.01, len: 4 }.mean_burst(),
            Some(4.0)
        );
    }
}
