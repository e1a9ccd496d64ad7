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
//! | `outage` | `DUR@START`, `DUR@START/EVERY` (`20s@5s`, `2s@10s/30s`) | the link carries nothing from START for DUR (again every EVERY); repeatable |
//! | `rate` | `RATE@START+DUR`, `RATE@START` (`10M@5s+30s`, `10M@40s`) | a rate step: RATE from START for DUR, then the base `rate=` again; without `+DUR` until the next step (or for good); repeatable |
//!
//! # Schedules
//!
//! `outage=` and the timed `rate=` tokens make the link's *schedule*; START,
//! DUR and EVERY are durations (`500ms`, `5s`, `2m`, at most a day) on the
//! schedule clock. That clock starts when `longhaul lab up` has the lab
//! ready (and `lab schedule start` restarts it at 0, `lab schedule hold`
//! stops it); `lab run` starts it afresh as each tool starts and holds it
//! in between, so each run meets the same schedule. While the clock is held,
//! or before it reaches a step, the link is its base spec. Without a prefix
//! a token applies to both directions: `outage=20s@5s` takes both down,
//! `down:outage=20s@5s` only what the host receives.
//!
//! What an outage loses, exactly: every packet offered to the link during it
//! (`[START, START+DUR)`), and every packet not fully serialised when it
//! begins: the queue and the packet on the serialiser go with the link.
//! Packets already serialised are past the cut (in propagation) and arrive.
//! Nothing else changes: the base rate, delay, jitter, loss model and queue
//! apply again from the end of the outage, to an empty queue. These drops
//! are counted apart from random loss and queue drops (`outage_drop_pkts`).
//!
//! A rate step changes the serialisation rate only: the queue keeps its
//! limit, and each packet is serialised at the rate in force when its
//! serialisation begins (a packet queued before a step and sent after it
//! goes at the new rate). A step may raise or lower the rate, and may be
//! given on a link whose base rate is unlimited (no `rate=`): it is
//! unlimited outside the step.
//!
//! The schedule must read one way only: outages of one direction may not
//! overlap (a periodic one must be shorter than its period, and a direction
//! has at most one periodic outage), and a bounded rate step may not reach
//! into the next one (an open-ended step simply ends where the next begins);
//! two steps may not start at once. A change made to the clock (start,
//! hold) does not reach back to packets already accepted.
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
    #[error("'{0}': expected key=value (keys: rate, delay, jitter, loss, queue, outage; optional up:/down: prefix)")]
    Syntax(String),
    #[error("'{token}': unknown key '{key}' (keys: rate, delay, jitter, loss, queue, outage)")]
    /// A key other than rate, delay, jitter, loss, queue and outage.
    UnknownKey {
        /// The token as written, with any `up:`/`down:` prefix.
        token: String,
        /// The key that is not known.
        key: String,
    },
    #[error("'{token}': {why}")]
    /// A known key whose value does not parse or is out of range; also jitter
    /// larger than delay in a direction, and a schedule token that overlaps
    /// another (the token named is the later one).
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

/// The longest START, DUR or EVERY of a schedule token: a day.
pub const MAX_SCHEDULE_NS: u64 = 86_400_000_000_000;

/// A time the link is down: from `start_ns` on the schedule clock for
/// `dur_ns`, and, with `every_ns`, again every `every_ns` from `start_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Outage {
    /// When it begins, ns on the schedule clock.
    pub start_ns: u64,
    /// How long it lasts, ns (more than 0).
    pub dur_ns: u64,
    /// The period of a repeating outage, ns (more than `dur_ns`); None: once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ns: Option<u64>,
}

impl Outage {
    /// The first of its windows `[s, e)` that ends after `t` (ns on the
    /// schedule clock), if any.
    pub fn window_after(&self, t: u64) -> Option<(u64, u64)> {
        let end = self.start_ns + self.dur_ns;
        match self.every_ns {
            None => (end > t).then_some((self.start_ns, end)),
            Some(every) => {
                let k = if t < end { 0 } else { (t - end) / every + 1 };
                let s = self.start_ns.checked_add(k.checked_mul(every)?)?;
                Some((s, s.checked_add(self.dur_ns)?))
            }
        }
    }
}

/// A timed rate: `rate_bps` from `start_ns` on the schedule clock, for
/// `dur_ns` (then the base rate again), or, without it, until the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RateStep {
    /// When it begins, ns on the schedule clock.
    pub start_ns: u64,
    /// How long it holds, ns; None: until the next step, or for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dur_ns: Option<u64>,
    /// The serialisation rate meanwhile, bit/s.
    pub rate_bps: u64,
}

/// A direction's outages and rate steps, each list sorted by start (the
/// parser checks that they do not overlap). Times are ns on the schedule
/// clock (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// When the link is down.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outages: Vec<Outage>,
    /// When the rate differs from the base rate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rates: Vec<RateStep>,
}

impl Schedule {
    /// True when nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.outages.is_empty() && self.rates.is_empty()
    }

    /// The outage window `[s, e)` that holds `t`, if the link is down then.
    pub fn outage_at(&self, t: u64) -> Option<(u64, u64)> {
        self.outages
            .iter()
            .filter_map(|o| o.window_after(t))
            .find(|&(s, _)| s <= t)
    }

    /// The start of the earliest outage window that meets `[from, to]`
    /// (one that begins by `to` and ends after `from`).
    pub fn outage_within(&self, from: u64, to: u64) -> Option<u64> {
        self.outages
            .iter()
            .filter_map(|o| o.window_after(from))
            .map(|(s, _)| s)
            .filter(|&s| s <= to)
            .min()
    }

    /// The rate in force at `t`: a step's, else `base` (None: unlimited).
    pub fn rate_at(&self, t: u64, base: Option<u64>) -> Option<u64> {
        let i = self.rates.partition_point(|r| r.start_ns <= t);
        match i.checked_sub(1).map(|i| self.rates[i]) {
            Some(r) if r.dur_ns.is_none_or(|d| t - r.start_ns < d) => Some(r.rate_bps),
            _ => base,
        }
    }

    /// The next time after `t` that the link goes down or up or changes its
    /// rate; None when nothing more is scheduled.
    pub fn next_change(&self, t: u64) -> Option<u64> {
        let outages = self.outages.iter().filter_map(|o| {
            let (s, e) = o.window_after(t)?;
            Some(if s > t { s } else { e })
        });
        let steps = self.rates.iter().flat_map(|r| {
            [Some(r.start_ns), r.dur_ns.map(|d| r.start_ns + d)]
                .into_iter()
                .flatten()
                .filter(|&x| x > t)
        });
        outages.chain(steps).min()
    }
}

/// One direction of a link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// `rate_bps` is set or the schedule has rate steps.
    pub queue: QueueLimit,
    /// Outages and rate steps on the schedule clock.
    #[serde(default, skip_serializing_if = "Schedule::is_empty")]
    pub schedule: Schedule,
}

impl Default for DirSpec {
    fn default() -> Self {
        DirSpec {
            rate_bps: None,
            delay_ns: 0,
            jitter_ns: 0,
            loss: LossSpec::None,
            queue: DEFAULT_QUEUE,
            schedule: Schedule::default(),
        }
    }
}

impl DirSpec {
    /// True when this direction does nothing to packets (they pass straight
    /// through), now and later (no schedule).
    pub fn is_ideal(&self) -> bool {
        self.rate_bps.is_none()
            && self.delay_ns == 0
            && self.jitter_ns == 0
            && self.loss == LossSpec::None
            && self.schedule.is_empty()
    }

    /// True when packets meet a queue and a serialiser: a base rate, or a
    /// rate step in the schedule.
    pub fn is_rate_limited(&self) -> bool {
        self.rate_bps.is_some() || !self.schedule.rates.is_empty()
    }
}

/// Both directions of a host's link: `up` carries what the host sends, `down`
/// what it receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
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

    /// True when either direction has outages or rate steps.
    pub fn has_schedule(&self) -> bool {
        !(self.up.schedule.is_empty() && self.down.schedule.is_empty())
    }
}

/// A schedule token as parsed, with its text for error messages.
enum Timed {
    Outage(Outage),
    Step(RateStep),
}

impl std::str::FromStr for LinkSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let mut spec = LinkSpec::default();
        // Schedule tokens of each direction (up, down), with their text.
        let mut timed: [Vec<(Timed, &str)>; 2] = [Vec::new(), Vec::new()];
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
                    "rate" if value.contains('@') => {
                        timed[i].push((Timed::Step(parse_step(value).map_err(bad)?), token))
                    }
                    "rate" => dir.rate_bps = Some(parse_rate(value).map_err(bad)?),
                    "delay" => dir.delay_ns = parse_duration(value).map_err(bad)?,
                    "jitter" => dir.jitter_ns = parse_duration(value).map_err(bad)?,
                    "loss" => dir.loss = parse_loss(value).map_err(bad)?,
                    "queue" => dir.queue = parse_queue(value).map_err(bad)?,
                    "outage" => {
                        timed[i].push((Timed::Outage(parse_outage(value).map_err(bad)?), token))
                    }
                    _ => {
                        return Err(SpecError::UnknownKey {
                            token: token.to_string(),
                            key: key.to_string(),
                        })
                    }
                }
            }
        }
        for (dir, timed) in [&mut spec.up, &mut spec.down].into_iter().zip(timed) {
            dir.schedule = check_schedule(timed)?;
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

/// Sorts one direction's schedule tokens and refuses overlaps, naming the
/// later token and the one it meets.
fn check_schedule(timed: Vec<(Timed, &str)>) -> Result<Schedule, SpecError> {
    let mut outages: Vec<(Outage, &str)> = Vec::new();
    let mut steps: Vec<(RateStep, &str)> = Vec::new();
    for (t, token) in timed {
        match t {
            Timed::Outage(o) => outages.push((o, token)),
            Timed::Step(r) => steps.push((r, token)),
        }
    }
    outages.sort();
    steps.sort();
    let clash = |token: &str, why: String| SpecError::Value {
        token: token.to_string(),
        why,
    };
    let periodic: Vec<&(Outage, &str)> = outages
        .iter()
        .filter(|(o, _)| o.every_ns.is_some())
        .collect();
    if let [_, second, ..] = periodic[..] {
        return Err(clash(
            second.1,
            format!(
                "a direction may have one repeating outage (it already has {})",
                periodic[0].1
            ),
        ));
    }
    for (k, (b, b_tok)) in outages.iter().enumerate() {
        for (a, a_tok) in &outages[..k] {
            // Each pair once; a repeating one against a one-off: the
            // repeating one's first window that ends after the other begins.
            let (once, other) = if a.every_ns.is_some() { (b, a) } else { (a, b) };
            let meets = other
                .window_after(once.start_ns)
                .is_some_and(|(s, _)| s < once.start_ns + once.dur_ns);
            if meets {
                return Err(clash(
                    b_tok,
                    format!(
                        "overlaps {a_tok}: outages of one direction may not overlap (make it one outage)"
                    ),
                ));
            }
        }
    }
    for w in steps.windows(2) {
        let ((a, a_tok), (b, b_tok)) = (w[0], w[1]);
        if a.start_ns == b.start_ns {
            return Err(clash(b_tok, format!("starts when {a_tok} does")));
        }
        if let Some(d) = a.dur_ns {
            if a.start_ns + d > b.start_ns {
                return Err(clash(
                    b_tok,
                    format!(
                        "starts at {} but {a_tok} holds until {}",
                        fmt_duration(b.start_ns),
                        fmt_duration(a.start_ns + d)
                    ),
                ));
            }
        }
    }
    Ok(Schedule {
        outages: outages.into_iter().map(|(o, _)| o).collect(),
        rates: steps.into_iter().map(|(r, _)| r).collect(),
    })
}

/// A time on the schedule clock: 0 to a day.
fn parse_when(what: &str, v: &str) -> Result<u64, String> {
    let d = longhaul_transfer::units::parse_duration(v).map_err(|e| format!("{what}: {e}"))?;
    if d.as_nanos() > MAX_SCHEDULE_NS as u128 {
        return Err(format!("{what} {v} out of range (0 to 1 day)"));
    }
    Ok(d.as_nanos() as u64)
}

/// Parses an outage: `DUR@START` or `DUR@START/EVERY` (`20s@5s`, `2s@10s/30s`).
pub fn parse_outage(v: &str) -> Result<Outage, String> {
    let (dur, rest) = v.split_once('@').ok_or_else(|| {
        "expected outage=DUR@START (20s@5s: down from 5 s for 20 s) or DUR@START/EVERY (2s@10s/30s)".to_string()
    })?;
    let (start, every) = match rest.split_once('/') {
        Some((s, e)) => (s, Some(e)),
        None => (rest, None),
    };
    let dur_ns = parse_when("outage length", dur)?;
    if dur_ns == 0 {
        return Err(format!("outage length {dur} must be more than 0"));
    }
    let start_ns = parse_when("outage start", start)?;
    let every_ns = every.map(|e| parse_when("outage period", e)).transpose()?;
    if let Some(e) = every_ns {
        if e <= dur_ns {
            return Err(format!(
                "an outage of {dur} every {} never ends: the period must be longer",
                every.unwrap_or_default()
            ));
        }
    }
    Ok(Outage {
        start_ns,
        dur_ns,
        every_ns,
    })
}

/// Parses a rate step: `RATE@START+DUR` or `RATE@START` (`10M@5s+30s`, `10M@40s`).
pub fn parse_step(v: &str) -> Result<RateStep, String> {
    let (rate, rest) = v.split_once('@').ok_or_else(|| {
        format!("expected rate=RATE@START+DUR (10M@5s+30s) or RATE@START (10M@40s), not {v}")
    })?;
    let (start, dur) = match rest.split_once('+') {
        Some((s, d)) => (s, Some(d)),
        None => (rest, None),
    };
    let rate_bps = parse_rate(rate)?;
    let start_ns = parse_when("rate step start", start)?;
    let dur_ns = dur.map(|d| parse_when("rate step length", d)).transpose()?;
    if dur_ns == Some(0) {
        return Err(format!(
            "rate step length {} must be more than 0",
            dur.unwrap_or_default()
        ));
    }
    Ok(RateStep {
        start_ns,
        dur_ns,
        rate_bps,
    })
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

/// Formats a rate in bit/s as a spec token the parser reads back exactly.
pub(crate) fn fmt_rate(bps: u64) -> String {
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
        t.extend(self.schedule.tokens());
        t
    }
}

impl fmt::Display for Outage {
    /// `DUR@START` or `DUR@START/EVERY`, as `outage=` takes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}@{}",
            fmt_duration(self.dur_ns),
            fmt_duration(self.start_ns)
        )?;
        if let Some(e) = self.every_ns {
            write!(f, "/{}", fmt_duration(e))?;
        }
        Ok(())
    }
}

impl fmt::Display for RateStep {
    /// `RATE@START+DUR` or `RATE@START`, as `rate=` takes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}@{}",
            fmt_rate(self.rate_bps),
            fmt_duration(self.start_ns)
        )?;
        if let Some(d) = self.dur_ns {
            write!(f, "+{}", fmt_duration(d))?;
        }
        Ok(())
    }
}

impl Schedule {
    /// The spec tokens that write it (`rate=10M@5s+30s`, `outage=20s@5s`).
    pub fn tokens(&self) -> Vec<String> {
        let steps = self.rates.iter().map(|r| format!("rate={r}"));
        let outages = self.outages.iter().map(|o| format!("outage={o}"));
        steps.chain(outages).collect()
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
    fn parses_schedules_per_direction_and_sorts_them() {
        let s: LinkSpec = "rate=100M delay=35ms outage=20s@5s rate=10M@50s+30s rate=10M@5s+30s up:outage=2s@100s/30s down:rate=50M@2m"
            .parse()
            .unwrap();
        assert_eq!(s.up.rate_bps, Some(100_000_000));
        let sec = 1_000_000_000;
        let once = Outage {
            start_ns: 5 * sec,
            dur_ns: 20 * sec,
            every_ns: None,
        };
        let every = Outage {
            start_ns: 100 * sec,
            dur_ns: 2 * sec,
            every_ns: Some(30 * sec),
        };
        assert_eq!(s.up.schedule.outages, [once, every]);
        assert_eq!(s.down.schedule.outages, [once]);
        let step = |start, dur, rate| RateStep {
            start_ns: start * sec,
            dur_ns: dur,
            rate_bps: rate,
        };
        assert_eq!(
            s.up.schedule.rates,
            [
                step(5, Some(30 * sec), 10_000_000),
                step(50, Some(30 * sec), 10_000_000)
            ]
        );
        assert_eq!(s.down.schedule.rates[2], step(120, None, 50_000_000));
        assert!(s.has_schedule() && !s.is_ideal());
        assert!(!"outage=1s@1s".parse::<LinkSpec>().unwrap().up.is_ideal());
    }

    #[test]
    fn schedules_print_back() {
        for text in [
            "rate=100M delay=35ms outage=20s@5s",
            "rate=100M rate=10M@5s+30s",
            "rate=10M@40s outage=2s@10s/30s",
            "delay=1ms up:outage=500ms@0 down:rate=1G@1s+1500ms down:rate=2M@1h",
            "rate=1G rate=256k@2s rate=10M@3s+1s outage=1s@10s outage=1s@20s/1m",
        ] {
            let s: LinkSpec = text.parse().unwrap();
            let shown = s.to_string();
            let again: LinkSpec = shown.parse().unwrap();
            assert_eq!(s, again, "{text} -> {shown}");
        }
        let s: LinkSpec = "down:outage=20s@5s rate=100M rate=10M@5s+30s"
            .parse()
            .unwrap();
        assert_eq!(
            s.to_string(),
            "rate=100M rate=10M@5s+30s down:outage=20s@5s"
        );
        let s: LinkSpec = "outage=2s@10s/30s rate=10M@40s".parse().unwrap();
        assert_eq!(s.to_string(), "rate=10M@40s outage=2s@10s/30s");
    }

    #[test]
    fn random_schedules_that_parse_print_back_the_same() {
        // Specs of 1 to 5 schedule tokens drawn from small pools (overlaps
        // are common, so both outcomes occur): whatever parses prints as
        // text that parses to the same spec, as the link_spec fuzz target asks.
        let whens = ["0", "1s", "1500ms", "5s", "20s", "30s", "1m"];
        let rates = ["10M", "256k", "1G", "2500000"];
        let prefixes = ["", "up:", "down:"];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut pick = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let (mut parsed, mut refused) = (0, 0);
        for _ in 0..3000 {
            let mut text = String::from("rate=100M delay=5ms");
            for _ in 0..1 + pick(5) {
                let pre = prefixes[pick(3)];
                let (a, b, c) = (whens[pick(7)], whens[pick(7)], whens[pick(7)]);
                let token = match pick(4) {
                    0 => format!("{pre}outage={a}@{b}"),
                    1 => format!("{pre}outage={a}@{b}/{c}"),
                    2 => format!("{pre}rate={}@{b}+{c}", rates[pick(4)]),
                    _ => format!("{pre}rate={}@{b}", rates[pick(4)]),
                };
                text.push(' ');
                text.push_str(&token);
            }
            match text.parse::<LinkSpec>() {
                Ok(spec) => {
                    parsed += 1;
                    let shown = spec.to_string();
                    assert_eq!(
                        shown.parse::<LinkSpec>().as_ref(),
                        Ok(&spec),
                        "{text} -> {shown}"
                    );
                }
                Err(e) => {
                    refused += 1;
                    assert!(matches!(e, SpecError::Value { .. }), "{text}: {e}");
                }
            }
        }
        assert!(
            parsed > 300 && refused > 300,
            "{parsed} parsed, {refused} refused"
        );
    }

    #[test]
    fn bad_schedules_name_their_token() {
        let err = |text: &str| text.parse::<LinkSpec>().unwrap_err().to_string();
        let cases = [
            ("outage=20s", "'outage=20s': expected outage=DUR@START"),
            (
                "outage=0s@5s",
                "'outage=0s@5s': outage length 0s must be more than 0",
            ),
            ("outage=5s@soon", "'outage=5s@soon': outage start: duration"),
            (
                "outage=5s@1s/5s",
                "'outage=5s@1s/5s': an outage of 5s every 5s never ends",
            ),
            (
                "outage=1s@2d",
                "'outage=1s@2d': outage start 2d out of range (0 to 1 day)",
            ),
            (
                "outage=10s@5s outage=5s@10s",
                "'outage=5s@10s': overlaps outage=10s@5s",
            ),
            (
                "outage=2s@10s/30s outage=3s@39s",
                "'outage=3s@39s': overlaps outage=2s@10s/30s",
            ),
            (
                "outage=3s@38s outage=2s@10s/30s",
                "'outage=3s@38s': overlaps outage=2s@10s/30s",
            ),
            (
                "outage=1s@0s/10s outage=1s@5s/20s",
                "'outage=1s@5s/20s': a direction may have one repeating outage",
            ),
            (
                "outage=5s@0s up:outage=5s@3s",
                "'up:outage=5s@3s': overlaps outage=5s@0s",
            ),
            (
                "rate=10M@5s+30s rate=20M@20s",
                "'rate=20M@20s': starts at 20s but rate=10M@5s+30s holds until 35s",
            ),
            ("rate=10M@5s rate=20M@5s+1s", "starts when rate=10M@5s does"),
            ("rate=fast@5s", "'rate=fast@5s':"),
            ("rate=10M@5s+0s", "rate step length 0s must be more than 0"),
            ("rate=10M@5s+", "'rate=10M@5s+': rate step length"),
            ("outrage=1s@1s", "unknown key 'outrage'"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text}: {e}");
        }
        // Touching is not overlapping; other directions do not meet.
        for ok in [
            "outage=5s@0s outage=5s@5s",
            "rate=10M@5s+30s rate=20M@35s",
            "rate=10M@5s rate=20M@20s",
            "up:outage=5s@0s down:outage=5s@3s",
            "outage=2s@10s/30s outage=3s@42s",
        ] {
            assert!(ok.parse::<LinkSpec>().is_ok(), "{ok}");
        }
    }

    #[test]
    fn schedule_lookups() {
        let ms = 1_000_000;
        let s: LinkSpec = "rate=100M rate=10M@1s+1s rate=50M@3s rate=20M@4s+1s outage=100ms@10s/1s"
            .parse()
            .unwrap();
        let sch = &s.up.schedule;
        let base = Some(100_000_000);
        let rate = |t: u64| sch.rate_at(t * ms, base).map(|r| r / 1_000_000);
        assert_eq!(
            [0, 999, 1000, 1999, 2000, 3000, 3999, 4000, 4999, 5000].map(rate),
            [100, 100, 10, 10, 100, 50, 50, 20, 20, 100].map(Some)
        );
        assert_eq!(sch.outage_at(9_999 * ms), None);
        assert_eq!(sch.outage_at(10_000 * ms), Some((10_000 * ms, 10_100 * ms)));
        assert_eq!(sch.outage_at(12_050 * ms), Some((12_000 * ms, 12_100 * ms)));
        assert_eq!(sch.outage_at(12_100 * ms), None);
        assert_eq!(sch.outage_within(12_100 * ms, 12_999 * ms), None);
        assert_eq!(
            sch.outage_within(12_100 * ms, 13_000 * ms),
            Some(13_000 * ms)
        );
        let next = |t: u64| sch.next_change(t * ms).map(|x| x / ms);
        assert_eq!(next(0), Some(1000));
        assert_eq!(next(1000), Some(2000));
        assert_eq!(next(5000), Some(10_000));
        assert_eq!(next(10_000), Some(10_100));
        assert_eq!(next(10_100), Some(11_000));
        let none: LinkSpec = "rate=10M@1s".parse().unwrap();
        assert_eq!(none.up.schedule.next_change(2_000 * ms), None);
        assert_eq!(none.up.schedule.rate_at(0, None), None);
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
