//! Congestion control: the one module to replace when the controller changes.
//!
//! longhaul's own is `wan` ([`crate::wan`]; `fair` is its CUBIC mode alone), the
//! default (see `net::NetOpts`). quinn's BBR and CUBIC are
//! offered as they are; `fixed:RATE` is a controller for
//! dedicated links that keeps a window of RATE x RTT and ignores loss. Every
//! controller can be capped (`--max-rate`): the window never exceeds rate x RTT.
//!
//! The sending side of a `get` is the server, whose controller is built before the
//! client has said what it wants. So every connection gets a [`Switchable`]
//! controller; the server looks up its handle right after accepting (see
//! [`CcFactory::take_last`]) and switches it when the client's Hello names a choice.
//! The switch happens before any data is sent.

use anyhow::{bail, Result};
use quinn::congestion::{
    BbrConfig, Controller, ControllerFactory, ControllerMetrics, CubicConfig, NewRenoConfig,
};
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Parse a rate in bits per second (the grammar of
/// [`longhaul_transfer::units`]: `400M`, `1G`, `2.5Gbit`, `50MB/s`); not 0.
pub fn parse_rate(s: &str) -> Result<u64> {
    match longhaul_transfer::units::parse_rate(s)? {
        0 => bail!("{s:?}: a rate must be more than 0"),
        r => Ok(r),
    }
}

/// A congestion controller for the sending side, as `--cc` and `Hello.cc`
/// name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CcChoice {
    /// quinn's BBR, with its default configuration (`bbr`).
    Bbr,
    /// quinn's CUBIC, with its default configuration (`cubic`).
    Cubic,
    /// quinn's NewReno, with its default configuration (`reno` or `newreno`).
    NewReno,
    /// Send at this many bits per second whatever the loss.
    Fixed(u64),
    /// longhaul's controller for long lossy paths ([`crate::wan`]), starting at
    /// this hint (bits/s; 0: measure from scratch).
    Wan(u64),
    /// `wan`'s CUBIC mode alone: takes a fair share beside TCP.
    Fair,
}

impl CcChoice {
    /// Reads a name as `--cc` takes it: `wan`, `wan:RATE`, `fair`, `bbr`,
    /// `cubic`, `reno` (or `newreno`), `fixed:RATE` (RATE as [`parse_rate`]
    /// reads it); anything else is an error.
    pub fn parse(s: &str) -> Result<CcChoice> {
        Ok(match s {
            "bbr" => CcChoice::Bbr,
            "cubic" => CcChoice::Cubic,
            "reno" | "newreno" => CcChoice::NewReno,
            "wan" => CcChoice::Wan(0),
            "fair" => CcChoice::Fair,
            f if f.starts_with("wan:") => CcChoice::Wan(parse_rate(&f[4..])?),
            f if f.starts_with("fixed:") => CcChoice::Fixed(parse_rate(&f[6..])?),
            _ => bail!(
                "unknown congestion controller {s:?}: use wan, wan:HINT, fair, bbr, cubic, reno or fixed:RATE"
            ),
        })
    }

    /// This choice for each of `n` connections that share one path (a
    /// session over several, `--connections`): a start hint or a fixed rate
    /// is the whole path's, so each gets its `n`th part; the others are
    /// unchanged.
    pub fn shared(self, n: usize) -> CcChoice {
        let n = n.max(1) as u64;
        match self {
            CcChoice::Wan(h) => CcChoice::Wan(h / n),
            CcChoice::Fixed(r) => CcChoice::Fixed(r / n),
            other => other,
        }
    }

    /// The name [`CcChoice::parse`] reads back (rates in plain bits/s): what
    /// `Hello.cc` carries and reports show.
    pub fn name(&self) -> String {
        match self {
            CcChoice::Bbr => "bbr".into(),
            CcChoice::Cubic => "cubic".into(),
            CcChoice::NewReno => "reno".into(),
            CcChoice::Fixed(r) => format!("fixed:{r}"),
            CcChoice::Wan(0) => "wan".into(),
            CcChoice::Wan(h) => format!("wan:{h}"),
            CcChoice::Fair => "fair".into(),
        }
    }

    /// `wan` without a hint starts at the session's `--max-rate` if it has one:
    /// the user said what the path carries (and the controller cuts a wrong
    /// hint within a few round trips, see `wan`).
    fn hinted(self, max_rate: u64) -> CcChoice {
        match self {
            CcChoice::Wan(0) if max_rate > 0 => CcChoice::Wan(max_rate),
            c => c,
        }
    }

    /// `rtt`: what the connection measured before this controller (None
    /// for a connection's first).
    fn build(self, now: Instant, mtu: u16, rtt: Option<Duration>) -> Box<dyn Controller> {
        let wan = |mut w: WanController| {
            if let Some(r) = rtt {
                w.core.seed_rtt(r);
            }
            Box::new(w)
        };
        match self {
            CcChoice::Bbr => Arc::new(BbrConfig::default()).build(now, mtu),
            CcChoice::Cubic => Arc::new(CubicConfig::default()).build(now, mtu),
            CcChoice::NewReno => Arc::new(NewRenoConfig::default()).build(now, mtu),
            CcChoice::Fixed(rate) => Box::new(FixedRate::new(rate, mtu)),
            CcChoice::Wan(hint) => wan(WanController::new(mtu, hint)),
            CcChoice::Fair => wan(WanController::fair(mtu)),
        }
    }
}

/// Window for `rate` bits/s over `rtt`, at least a few packets.
fn rate_window(rate: u64, rtt: Duration, mtu: u16) -> u64 {
    ((rate as f64 / 8.0) * rtt.as_secs_f64()) as u64 + 4 * mtu as u64
}

/// Loss-blind controller for dedicated links: window = rate x smoothed RTT.
#[derive(Debug, Clone)]
pub(crate) struct FixedRate {
    rate: u64,
    rtt: Duration,
    mtu: u16,
}

impl FixedRate {
    pub(crate) fn new(rate: u64, mtu: u16) -> Self {
        FixedRate {
            rate,
            rtt: Duration::from_millis(100),
            mtu,
        }
    }
}

impl Controller for FixedRate {
    fn on_ack(
        &mut self,
        _now: Instant,
        _sent: Instant,
        _bytes: u64,
        _app_limited: bool,
        rtt: &quinn_proto::RttEstimator,
    ) {
        self.rtt = rtt.get();
    }
    fn on_congestion_event(
        &mut self,
        _now: Instant,
        _sent: Instant,
        _persistent: bool,
        _lost: u64,
    ) {
    }
    fn on_mtu_update(&mut self, mtu: u16) {
        self.mtu = mtu;
    }
    fn window(&self) -> u64 {
        rate_window(self.rate, self.rtt, self.mtu)
    }
    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }
    fn initial_window(&self) -> u64 {
        rate_window(self.rate, Duration::from_millis(100), self.mtu)
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// [`crate::wan::Wan`] behind quinn's controller interface. RTT samples are
/// taken per acknowledged packet (ACK time less send time); losses are counted
/// per congestion event quinn reports.
#[derive(Debug, Clone)]
pub(crate) struct WanController {
    core: crate::wan::Wan,
    /// Bytes in flight as quinn counts them: set at the end of each ACK,
    /// raised by what is sent, lowered by what is declared lost. Bounds a
    /// train to its room ([`crate::wan::Wan::train_room`]).
    in_flight: u64,
}

impl WanController {
    pub(crate) fn new(mtu: u16, hint: u64) -> Self {
        WanController {
            core: crate::wan::Wan::new(mtu, hint),
            in_flight: 0,
        }
    }

    pub(crate) fn fair(mtu: u16) -> Self {
        WanController {
            core: crate::wan::Wan::fair(mtu),
            in_flight: 0,
        }
    }
}

/// From this window up quinn neither paces nor holds the sender to the
/// window: `net`'s window tuner takes no send window from one.
pub(crate) const UNPACED_WINDOW: u64 = u32::MAX as u64 + 1;

impl Controller for WanController {
    fn on_sent(&mut self, now: Instant, bytes: u64, _last_packet_number: u64) {
        self.in_flight += bytes;
        self.core.on_sent(now, bytes);
    }
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        _app_limited: bool,
        _rtt: &quinn_proto::RttEstimator,
    ) {
        self.core
            .on_ack(now, bytes, now.saturating_duration_since(sent));
    }
    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        _app_limited: bool,
        _largest: Option<u64>,
    ) {
        self.in_flight = in_flight;
        self.core.on_end_acks(now);
        self.core.on_flight(in_flight);
    }
    fn on_congestion_event(&mut self, now: Instant, sent: Instant, _persistent: bool, lost: u64) {
        self.in_flight = self.in_flight.saturating_sub(lost);
        self.core.on_loss(now, sent, lost);
    }
    fn on_mtu_update(&mut self, mtu: u16) {
        self.core.set_mtu(mtu);
    }
    fn window(&self) -> u64 {
        // While the train goes out: what is in flight and the train's room,
        // so quinn stops within a batch where the train must end; unpaced
        // (`pacing_rtt`), so it leaves back to back.
        match self.core.train_room() {
            Some(room) => self.in_flight + room,
            None => self.core.window(),
        }
    }
    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }
    fn initial_window(&self) -> u64 {
        self.core.window()
    }
    fn pacing_rtt(&self) -> Option<Duration> {
        // (quinn's pacer lets everything out over a zero RTT.)
        if self.core.unpaced() {
            return Some(Duration::ZERO);
        }
        self.core.pacing_rtt()
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// The knobs a session may set on its connection's controller.
#[derive(Debug, Default)]
pub struct CcHandle {
    pending: Mutex<Option<(Option<CcChoice>, u64)>>,
    changed: AtomicBool,
    /// The least window the controller reports (bytes; see
    /// [`CcHandle::set_floor`]).
    floor: AtomicU64,
    /// A path RTT to start from ([`CcHandle::seed_rtt`]).
    seed: Mutex<Option<Duration>>,
}

impl CcHandle {
    /// Switch to `choice` (None keeps the current one) and cap at `max_rate` bits/s
    /// (0 = no cap).
    pub fn set(&self, choice: Option<CcChoice>, max_rate: u64) {
        *self.pending.lock().unwrap() = Some((choice, max_rate));
        self.changed.store(true, Ordering::Release);
    }

    /// Start from `rtt` as the path's RTT while the connection has measured
    /// none: a server answering a request that came in the client's first
    /// flight (0-RTT) has no RTT sample until the handshake ends a round
    /// trip later, and `wan` times its first train and flight by the RTT
    /// (RFC 9002 §6.2.2 lets a resumed connection start from the previous
    /// one's). Ignored once the connection has a sample.
    pub fn seed_rtt(&self, rtt: Duration) {
        *self.seed.lock().unwrap() = Some(rtt);
        self.changed.store(true, Ordering::Release);
    }

    /// The controller's window is at least `bytes` from now on (0: no
    /// floor), above its cap too: the receiving side of a session keeps
    /// it at [`receive_floor`] of what arrives.
    pub fn set_floor(&self, bytes: u64) {
        self.floor.store(bytes, Ordering::Relaxed);
    }
}

/// A receiver's window is at least this share of the bandwidth-delay
/// product of what it receives ([`receive_floor`]).
pub(crate) const RECEIVE_FLOOR_SHARE: f64 = 1.0 / 16.0;

/// The least window for the side of a connection that receives
/// `rx_bytes_per_s` (bytes of UDP payload per second) over `rtt`: [`RECEIVE_FLOOR_SHARE`] of
/// that BDP.
///
/// A receiver sends ACKs, which no controller holds back, but quinn bundles
/// them with what else the receiver sends, the flow-control credit it
/// returns as it reads (MAX_DATA, MAX_STREAMS) and its per-file results on
/// the control stream (`FileResult`, thousands a second with small files),
/// and a packet with such a frame is paced and held to the window like data.
/// Its own controller sees only those few bytes sent, so its window stays
/// at the first flight's (38 kB at 700 ms), and quinn's pacer, which every
/// ACK drains, waits for a full bucket before the next such packet goes: in the lab (20,000 x 10 kB at 700 ms / 1e-3) the
/// client of a get sent no ACK at all for 0.4-0.5 s at a time while 300-470
/// Mbit/s came in, and the sender, its window full of unacknowledged data,
/// stopped. ACKs take 0.4-1.7 % of the bytes they acknowledge; a window of a
/// sixteenth of the received BDP paces at 7.8 % of the received rate, so
/// neither the pacer nor the window ever holds them. What the receiver
/// sends of its own (requests, `Want`s) is no more than it was without the
/// floor on a path that carries little to it, and goes at a few per cent
/// of the path's rate on one that carries much.
pub(crate) fn receive_floor(rx_bytes_per_s: f64, rtt: Duration) -> u64 {
    (rx_bytes_per_s * rtt.as_secs_f64() * RECEIVE_FLOOR_SHARE) as u64
}

/// A controller that can be replaced and capped while the connection lives.
pub(crate) struct Switchable {
    inner: Box<dyn Controller>,
    /// What `inner` was built as.
    choice: CcChoice,
    handle: Arc<CcHandle>,
    max_rate: u64,
    rtt: Duration,
    /// The least RTT measured so far (None before the first ACK).
    min_rtt: Option<Duration>,
    /// The RTT to start from while none is measured ([`CcHandle::seed_rtt`]).
    seed: Option<Duration>,
    mtu: u16,
    created: Instant,
}

impl Switchable {
    fn poll_switch(&mut self) {
        if !self.handle.changed.swap(false, Ordering::Acquire) {
            return;
        }
        let seed = self
            .handle
            .seed
            .lock()
            .unwrap()
            .take()
            .filter(|_| self.min_rtt.is_none());
        let mut rebuild = seed.is_some();
        if let Some((choice, max_rate)) = self.handle.pending.lock().unwrap().take() {
            if let Some(c) = choice {
                self.choice = c;
                rebuild = true;
            }
            self.max_rate = max_rate;
        }
        if let Some(s) = seed {
            self.seed = Some(s);
            self.rtt = s;
        }
        if rebuild {
            self.inner = self.choice.hinted(self.max_rate).build(
                self.created,
                self.mtu,
                self.min_rtt.or(self.seed),
            );
        }
    }
}

impl Switchable {
    /// The controller's window `w` held to the rate cap and raised to the
    /// receive floor.
    fn bounded(&self, w: u64) -> u64 {
        let capped = if self.max_rate == 0 {
            w
        } else {
            w.min(rate_window(self.max_rate, self.rtt, self.mtu))
        };
        capped.max(self.handle.floor.load(Ordering::Relaxed))
    }
}

impl Controller for Switchable {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.poll_switch();
        self.inner.on_sent(now, bytes, last_packet_number)
    }
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &quinn_proto::RttEstimator,
    ) {
        self.rtt = rtt.get();
        self.min_rtt = Some(rtt.min());
        self.inner.on_ack(now, sent, bytes, app_limited, rtt)
    }
    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest: Option<u64>,
    ) {
        self.inner.on_end_acks(now, in_flight, app_limited, largest)
    }
    fn on_congestion_event(&mut self, now: Instant, sent: Instant, persistent: bool, lost: u64) {
        self.inner.on_congestion_event(now, sent, persistent, lost)
    }
    fn on_mtu_update(&mut self, mtu: u16) {
        self.mtu = mtu;
        self.inner.on_mtu_update(mtu)
    }
    fn window(&self) -> u64 {
        self.bounded(self.inner.window())
    }
    fn pacing_rtt(&self) -> Option<Duration> {
        // Only while the window is the controller's own: one held to the
        // rate cap (a window over the smoothed RTT) or raised to the
        // receive floor paces as quinn does. (Asked before every datagram:
        // the window is worked out only when the controller names one.)
        let rtt = self.inner.pacing_rtt()?;
        let own = self.inner.window();
        (self.bounded(own) == own).then_some(rtt)
    }
    fn metrics(&self) -> ControllerMetrics {
        self.inner.metrics()
    }
    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(Switchable {
            inner: self.inner.clone_box(),
            choice: self.choice,
            handle: self.handle.clone(),
            max_rate: self.max_rate,
            rtt: self.rtt,
            min_rtt: self.min_rtt,
            seed: self.seed,
            mtu: self.mtu,
            created: self.created,
        })
    }
    fn initial_window(&self) -> u64 {
        self.inner.initial_window()
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Builds a [`Switchable`] per connection and remembers the handle of the last one.
pub struct CcFactory {
    default: CcChoice,
    max_rate: u64,
    last: Mutex<Option<Arc<CcHandle>>>,
}

impl CcFactory {
    pub fn new(default: CcChoice, max_rate: u64) -> Arc<Self> {
        Arc::new(CcFactory {
            default,
            max_rate,
            last: Mutex::new(None),
        })
    }

    /// The handle of the controller built last. A server that accepts connections
    /// one at a time calls this right after `Incoming::accept`, which builds the
    /// connection (and its controller) synchronously.
    pub fn take_last(&self) -> Option<Arc<CcHandle>> {
        self.last.lock().unwrap().take()
    }
}

impl ControllerFactory for CcFactory {
    fn build(self: Arc<Self>, now: Instant, mtu: u16) -> Box<dyn Controller> {
        let handle = Arc::new(CcHandle::default());
        *self.last.lock().unwrap() = Some(handle.clone());
        Box::new(Switchable {
            inner: self.default.hinted(self.max_rate).build(now, mtu, None),
            choice: self.default,
            handle,
            max_rate: self.max_rate,
            rtt: Duration::from_millis(100),
            min_rtt: None,
            seed: None,
            mtu,
            created: now,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 0-RTT session's seed survives a switch of controller that comes
    /// after it (the client's `Hello.cc`): the first window is the seeded
    /// RTT's, not the least one of a controller that knows no RTT.
    #[test]
    fn a_seeded_rtt_survives_a_later_switch() {
        let factory = CcFactory::new(CcChoice::Wan(0), 0);
        let now = Instant::now();
        let mut fresh = factory.clone().build(now, 1200);
        let cold = fresh.window();
        let mut c = factory.clone().build(now, 1200);
        let handle = factory.take_last().unwrap();
        handle.seed_rtt(Duration::from_millis(700));
        c.on_sent(now, 0, 0);
        let seeded = c.window();
        assert!(seeded > cold, "seeded {seeded} > cold {cold}");
        handle.set(Some(CcChoice::Wan(0)), 0);
        c.on_sent(now, 0, 1);
        assert_eq!(c.window(), seeded, "the switch kept the seed");
        fresh.on_sent(now, 0, 0);
        assert_eq!(fresh.window(), cold);
    }

    #[test]
    fn rates_and_choices_parse() {
        assert_eq!(parse_rate("400M").unwrap(), 400_000_000);
        assert_eq!(parse_rate("1.5G").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("250kbit").unwrap(), 250_000);
        assert_eq!(parse_rate("1000").unwrap(), 1000);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-1G").is_err());
        assert_eq!(
            CcChoice::parse("fixed:1G").unwrap(),
            CcChoice::Fixed(1_000_000_000)
        );
        assert!(CcChoice::parse("vegas").is_err());
        assert_eq!(CcChoice::parse("wan").unwrap(), CcChoice::Wan(0));
        assert_eq!(CcChoice::parse("fair").unwrap(), CcChoice::Fair);
        assert_eq!(CcChoice::Fair.name(), "fair");
        let hinted = CcChoice::parse("wan:900M").unwrap();
        assert_eq!(hinted, CcChoice::Wan(900_000_000));
        assert_eq!(CcChoice::parse(&hinted.name()).unwrap(), hinted);
        // Over 3 connections each gets a third of a hint or a fixed rate.
        assert_eq!(hinted.shared(3), CcChoice::Wan(300_000_000));
        assert_eq!(CcChoice::Fixed(90).shared(3), CcChoice::Fixed(30));
        assert_eq!(CcChoice::Wan(0).shared(4), CcChoice::Wan(0));
        assert_eq!(CcChoice::Bbr.shared(2), CcChoice::Bbr);
        assert_eq!(hinted.shared(0), hinted);
    }

    /// A controller of `choice` as a connection gets it, and its handle.
    fn built(now: Instant, choice: CcChoice) -> (Box<dyn Controller>, Arc<CcHandle>) {
        let f = CcFactory::new(choice, 0);
        let c = f.clone().build(now, 1200);
        let h = f.take_last().unwrap();
        assert!(f.take_last().is_none());
        (c, h)
    }

    #[test]
    fn cap_and_switch_apply() {
        let now = Instant::now();
        let (mut c, h) = built(now, CcChoice::Fixed(8_000_000_000));
        // 8 Gbit/s x 100 ms = 100 MB window.
        assert!(c.window() > 99_000_000);
        // Cap at 80 Mbit/s: 1 MB per 100 ms.
        h.set(None, 80_000_000);
        c.on_sent(now, 1200, 1);
        assert_eq!(c.window(), 1_000_000 + 4 * 1200);
        // Switch to a loss-based controller: its own (small) initial window applies.
        h.set(Some(CcChoice::Cubic), 0);
        c.on_sent(now, 1200, 2);
        assert!(
            c.window() < 100_000,
            "cubic starts small, got {}",
            c.window()
        );
        // wan with a cap and no hint of its own starts at the cap: 100 ms of
        // 400 Mbit/s before any RTT is known (without it: the initial window).
        h.set(Some(CcChoice::Wan(0)), 400_000_000);
        c.on_sent(now, 1200, 3);
        assert_eq!(c.window(), 5_000_000);
        h.set(Some(CcChoice::Wan(0)), 0);
        c.on_sent(now, 1200, 4);
        assert_eq!(c.window(), crate::wan::FIRST_FLIGHT_MIN * 1200);
    }

    /// A controller with a fixed window that paces over a fixed RTT.
    #[derive(Clone)]
    struct Paced(u64);

    impl Controller for Paced {
        fn on_congestion_event(&mut self, _: Instant, _: Instant, _: bool, _: u64) {}
        fn on_mtu_update(&mut self, _: u16) {}
        fn window(&self) -> u64 {
            self.0
        }
        fn clone_box(&self) -> Box<dyn Controller> {
            Box::new(self.clone())
        }
        fn initial_window(&self) -> u64 {
            self.0
        }
        fn pacing_rtt(&self) -> Option<Duration> {
            Some(Duration::from_millis(700))
        }
        fn into_any(self: Box<Self>) -> Box<dyn Any> {
            self
        }
    }

    #[test]
    fn the_pacers_rtt_is_the_controllers_only_while_the_window_is_its_own() {
        let now = Instant::now();
        let handle = Arc::new(CcHandle::default());
        let mut c = Switchable {
            inner: Box::new(Paced(50_000_000)),
            choice: CcChoice::Wan(0),
            handle: handle.clone(),
            max_rate: 0,
            rtt: Duration::from_millis(950),
            min_rtt: Some(Duration::from_millis(700)),
            seed: None,
            mtu: 1200,
            created: now,
        };
        assert_eq!(c.pacing_rtt(), Some(Duration::from_millis(700)));
        // Capped under its window (a window of the cap over the smoothed
        // RTT): paced as quinn does.
        c.max_rate = 80_000_000;
        assert!(c.window() < 50_000_000, "{}", c.window());
        assert_eq!(c.pacing_rtt(), None);
        // A cap above it changes nothing.
        c.max_rate = 8_000_000_000;
        assert_eq!(c.pacing_rtt(), Some(Duration::from_millis(700)));
        // Raised to a receive floor: quinn's again.
        handle.set_floor(60_000_000);
        assert_eq!(c.window(), 60_000_000);
        assert_eq!(c.pacing_rtt(), None);
        // quinn's own controllers name none.
        let (cubic, _) = built(now, CcChoice::Cubic);
        assert_eq!(cubic.pacing_rtt(), None);
    }

    #[test]
    fn a_receivers_floor_lifts_the_window_above_its_controller_and_cap() {
        let now = Instant::now();
        let (mut c, h) = built(now, CcChoice::Wan(0));
        c.on_sent(now, 1200, 1);
        let own = c.window();
        assert_eq!(own, crate::wan::FIRST_FLIGHT_MIN * 1200);
        // 1 Gbit/s coming in over 700 ms: a sixteenth of its 87.5 MB BDP.
        let floor = receive_floor(125e6, Duration::from_millis(700));
        assert_eq!(floor, 5_468_750);
        h.set_floor(floor);
        assert_eq!(c.window(), floor);
        // Above a cap too (a capped get's client caps its own controller).
        h.set(None, 10_000_000);
        c.on_sent(now, 1200, 2);
        assert_eq!(c.window(), floor);
        // A floor under the controller's window changes nothing, and 0
        // takes it away.
        h.set(None, 0);
        c.on_sent(now, 1200, 3);
        h.set_floor(own / 2);
        assert_eq!(c.window(), own);
        h.set_floor(0);
        assert_eq!(c.window(), own);
        // A slow path's receiver keeps its controller's window: 1 Mbit/s at
        // 70 ms is a floor of 546 bytes.
        assert_eq!(receive_floor(125e3, Duration::from_millis(70)), 546);
    }

    #[test]
    fn wans_train_goes_out_unpaced_and_no_further_than_the_first_flight() {
        // A cold `wan` after a 70 ms handshake: a reply alone starts no
        // train and is paced over the smoothed RTT.
        let now = Instant::now();
        let mut c = CcChoice::Wan(0).build(now, 1200, Some(Duration::from_millis(70)));
        c.on_sent(now, 1200, 1);
        assert_eq!(c.pacing_rtt(), None);
        // The first batch of data starts it: unpaced (a zero RTT, which
        // quinn's pacer does not hold), and the window is what is in flight
        // and the train's room, the first flight (32 datagrams at 70 ms).
        c.on_sent(now, 12_000, 11);
        assert_eq!(c.pacing_rtt(), Some(Duration::ZERO));
        let first = crate::wan::FIRST_FLIGHT_MIN * 1200;
        assert_eq!(c.window(), 1200 + first);
        c.on_sent(now, 12_000, 21);
        assert_eq!(c.window(), 1200 + first, "in flight and room move together");
        // 30 datagrams out: the train is timed; the first window is the
        // train's (at least 32 datagrams), paced again.
        c.on_sent(now, 12_000, 31);
        assert_eq!(c.pacing_rtt(), None);
        assert_eq!(c.window(), first);
        // At 290 ms (seed 001's 256 kbit/s path) the first flight is 45
        // datagrams, which its 50-packet queue holds: a batch of 54 after
        // the first ten would take the train to 64; the window stops it
        // at 45.
        let mut c = CcChoice::Wan(0).build(now, 1200, Some(Duration::from_millis(290)));
        c.on_sent(now, 12_000, 10);
        let in_flight = 12_000;
        let room = c.window() - in_flight;
        assert_eq!((in_flight + room) / 1200, 45);
    }
}
