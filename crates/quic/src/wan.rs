//! longhaul's own congestion controller for long, lossy paths: a sans-IO state
//! machine (times and byte counts in, a window and a pacing rate out). The
//! quinn adapter lives in `cc`; tests drive this core against a simulated
//! bottleneck (`tests/it/wan_sim.rs`).
//!
//! The model, in the spirit of BBR but with loss read differently:
//! - **Bandwidth**: the delivery rate over each round trip (bytes acknowledged /
//!   time), the largest of the last [`BW_ROUNDS`] rounds.
//! - **Path RTT**: the smallest RTT sample of the last [`MIN_RTT_WINDOW`];
//!   on a slow link it does not rise by as little as the queue its own
//!   window keeps (the headroom's time), or the BDP would grow with that
//!   queue and the queue with the BDP.
//! - **Window** = gain × bandwidth × path RTT / (1 − random loss) + headroom
//!   (ACK aggregation, at least three datagrams, five under 6 Mbit/s); the driver paces at about
//!   window / RTT. Random loss is the share lost in recent rounds without a
//!   queue: a lost packet holds its place in the window until it is declared
//!   lost, so without the factor the window sends only (1 − loss) of the rate.
//! - **Random loss is not congestion.** A round with losses is read as
//!   congestion only when the same round also saw a queue: its smallest RTT stood
//!   above the path RTT by more than [`QUEUE_TARGET`] or 5 % of the path RTT,
//!   whichever is more (ACK delay and jitter stay below that; a full bottleneck queue is
//!   what drops packets under a paced sender; a lossy link drops them with the
//!   queue empty). Then the bandwidth estimate falls to what was delivered.
//! - **Queue**: once started, a round whose smallest RTT exceeds the path RTT by
//!   more than [`QUEUE_TARGET`] makes the next round a drain round, so the
//!   standing queue stays under the target.
//! - **Probing**: a cycle of eight rounds: one probe above the estimate finds new
//!   capacity, the next takes the window back to the BDP without its headroom
//!   (the sender waits while what the probe queued leaves the bottleneck, which
//!   stays busy) until the flight is down to the BDP, then goes on at the
//!   estimate; six cruise at the estimate. The probe is a quarter up, or less
//!   on long paths: at most `PROBE_QUEUE` (25 ms) of queue (at 700 ms, +3.6 %).
//!   A queue seen outside the probe is drained by a round under the BDP by that
//!   and the headroom (at most a quarter).
//! - **Start**: with a hint (a rate remembered for this peer, or `--max-rate`)
//!   it begins at the hint and verifies it within a few rounds (the bandwidth
//!   filter replaces the hint with measurements, and a queue or congested loss
//!   cuts it); without one, its first window is what 1.5 Mbit/s carries over
//!   the handshake's RTT (32-200 datagrams: it must fit a slow link's queue),
//!   and it nearly triples the rate each round (gain 2.89); on paths of 80
//!   ms or more, once a round's estimate grows less than twice, the
//!   bottleneck is near and the gain drops to 2 for the rest of startup (a
//!   window of twice the BDP fits the path and a one-BDP queue, 2.89
//!   overflowed it by most of a BDP); it leaves startup when the bandwidth
//!   stops growing by a quarter for three rounds, or stops growing over a
//!   standing queue (as HyStart), then drains.
//! - **Train**: a cold start on a path of [`TRAIN_MIN_RTT`] or more sends
//!   its first batch of data and what follows it back to back (unpaced),
//!   [`TRAIN_PACKETS`] datagrams that are its first window (with at least
//!   32 datagrams), and times their ACKs: the bottleneck spaces them at its rate,
//!   so the bytes acknowledged after the train's first ACK over the time to
//!   its last ([`TRAIN_MIN_SPAN`] at least) read the path's capacity. Startup
//!   then jumps to [`TRAIN_SHARE`] of it at gain [`TRAIN_GAIN`] (a window
//!   of the capacity's BDP) and goes on from there at that gain: the rounds
//!   after it measure what the path delivers, the jump leaves the estimate
//!   after two, and a window of 1.5 BDP queues at most half a BDP.
//! - **Rounds** end at the end of an ACK ([`Wan::on_end_acks`]) and the
//!   next begins there, so a round's rate is the bytes acknowledged after
//!   its first ACK over the time to its last.
//! - **Slow links**: a round, and a rate sample, spans at least eight
//!   datagrams; a queue counts only when it stands eight datagrams' time
//!   above the path (at 1 Mbit/s one datagram is 11.6 ms). In startup the bandwidth is also sampled at every ACK, as the
//!   delivery rate over the last quarter of a path RTT: a per-round sample
//!   lags the window by a round, so the rate grew 1.7× a round instead of
//!   2.89× (a sample over a whole RTT still averages the growth: 2.1×).
//!   Rates, per ACK and per round, are bytes over the longer of the ACKs'
//!   and the acknowledged packets' own spacing (as BBR's delivery rate):
//!   ACKs a receiver held back and then sent together read above the link
//!   (`fair` keeps its rounds over the ACKs alone).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Rounds the bandwidth filter remembers.
pub const BW_ROUNDS: usize = 10;
/// The path RTT is the smallest sample of the last one to two of these: long
/// enough to span a probe cycle's drain round even at 1 s RTT, short enough to
/// follow a route change.
pub const MIN_RTT_WINDOW: Duration = Duration::from_secs(10);
/// Standing queue allowed at the bottleneck.
pub const QUEUE_TARGET: Duration = Duration::from_millis(10);
const STARTUP_GAIN: f64 = 2.885;
/// Startup's gain once a round's rate grew less than twice the last one's
/// (it was let grow [`STARTUP_GAIN`] times): the pipe is nearly full, and a
/// window of twice the rate fits the path and a one-BDP queue where 2.89
/// times overflowed it by most of a BDP (the lab at 700 ms with no random
/// loss: 67 MB of 500 lost in startup's last rounds, a round of tail more).
const STARTUP_FULL_GAIN: f64 = 2.0;
const DRAIN_GAIN: f64 = 1.0 / STARTUP_GAIN;
/// Rounds after a startup (after its drain round, if it has one) in which
/// the pacer spreads the window over the path RTT ([`Wan::pacing_rtt`]):
/// the one whose window of the BDP drains the queue, and the next, whose
/// smoothed RTT still holds some of it.
const OWN_QUEUE_ROUNDS: u32 = 2;
/// An overflow of the queue cuts the estimate to what was delivered, but to
/// no less than this share of it (BBRv2's loss response, 0.7).
const OVERFLOW_BETA: f64 = 0.7;
/// The most random loss the window makes up for (see `Wan::random_loss`).
const MAX_RANDOM_LOSS: f64 = 0.3;
/// Rounds of a probe cycle: probe up, drain, cruise six.
const CYCLE_ROUNDS: usize = 8;
/// A probe raises the rate by a quarter, or by less on long paths, so that it
/// queues at most this much; the drain that follows removes that and the headroom.
const PROBE_QUEUE: Duration = Duration::from_millis(25);
/// Startup's per-ACK rate samples span the last quarter of the path RTT, but
/// never less than this: on short paths ACKs come in bursts (the receiver's
/// ACK delay, its scheduling) that a shorter span would read as a rate.
const SLIDE_MIN: Duration = Duration::from_millis(20);
/// ... and at least this many datagrams (see `Wan::sample_rate`).
const SAMPLE_PACKETS: u64 = 8;
/// The largest first window, paced over the handshake's RTT: quinn's BBR's
/// (200 datagrams of 1200 bytes), which longhaul used by default before
/// `wan`. With 32 datagrams of 1452 bytes a cold start at 700 ms needed two
/// round trips more to grow as large (eumetsat quick, 5 MB files at 700 ms
/// under a 10 s cap: 2.6-3.4 Mbit/s against bbr's 16).
pub const INITIAL_WINDOW: u64 = 200 * 1200;
/// The first window is what [`FIRST_FLIGHT_BPS`] carries over the handshake's
/// RTT, between [`FIRST_FLIGHT_MIN`] datagrams and [`INITIAL_WINDOW`]. Sent
/// blind (nothing is known of the path's rate before the first ACKs), it must
/// fit the queue of a slow path: 240 kB at once overflowed seed 001's 1 Mbit/s
/// path (50-packet queue, 75 kB) by 160 kB, 16 % of 100 x 10 kB resent.
/// At 1.5 Mbit/s the flight over seed 001's 256 kbit/s, 250 ms satellite
/// path (handshake RTT 287 ms) is 54 kB: 45 datagrams of quinn's first 1200
/// bytes, within its 50-packet queue (at 2 Mbit/s, 60 datagrams lost 10); at
/// 700 ms it is 131 kB, 0.6 of a startup round below the old 240 kB.
pub const FIRST_FLIGHT_BPS: f64 = 1.5e6;
/// The least first window, in datagrams (RFC 9002 allows 10; a 50-packet
/// queue takes 32).
pub const FIRST_FLIGHT_MIN: u64 = 32;
/// A handshake RTT under this is a LAN's (or a metro link's): the first
/// window is [`INITIAL_WINDOW`], and startup's window never goes below it.
/// A slow link's queue is what the first window must fit elsewhere, and a
/// slow link is never this short (a 1,200-byte datagram each way alone
/// takes 2 ms at 10 Mbit/s). On a LAN a first window of 32 datagrams lasts
/// a round trip of the receiver's ACK time (1-3 ms while it makes its
/// first files), and startup's first rounds read the sender's first reads
/// (7 Mbit/s of 1 Gbit/s, a get of 2,000 files of 10 kB): a window of
/// that held the next round to 17 Mbit/s for 15 ms.
pub const LAN_RTT: Duration = Duration::from_millis(3);
/// Datagrams of the first flight sent back to back to time the bottleneck
/// (see [`Wan::on_sent`]); quinn sends up to ten in one GSO batch and the
/// train ends with the batch that reaches this, so it is 30-39 datagrams:
/// within a 50-packet queue, as [`FIRST_FLIGHT_MIN`] is.
pub const TRAIN_PACKETS: u64 = 30;
/// The train starts with the first send of at least this many bytes (four
/// of quinn's smallest datagrams) once the handshake's RTT is known: the
/// first batch of data. Replies on the control stream and ACKs go out alone
/// before it, paced as without a train: a lone reply that started it made
/// it span the milliseconds until the first file was read and hashed, and
/// its ACKs read 127 Mbit/s on a 1 Gbit/s path.
pub const TRAIN_START: u64 = 4 * 1200;
/// Paths shorter than this start without a train: their startup takes a
/// few milliseconds anyway, and their ACK timing is the hosts' scheduling.
pub const TRAIN_MIN_RTT: Duration = Duration::from_millis(10);
/// The train's ACKs must spread over at least this to be read as a rate
/// (a 1 Gbit/s bottleneck spreads 30 datagrams over 350 µs; the hosts'
/// and the lab emulator's wake-ups blur a few tens of µs). Faster paths,
/// whose train comes back in less, start as before.
pub const TRAIN_MIN_SPAN: Duration = Duration::from_micros(100);
/// A train whose ACKs all came at once is read as carried over no less than
/// this (a floor of the path's rate, until the second train reads it): 30
/// datagrams of 1,200 bytes over 1 ms are 288 Mbit/s, 64 of them 614; the
/// jump is two thirds of that.
pub const TRAIN_FLOOR_SPAN: Duration = Duration::from_millis(1);
/// A pause of this between two sends ends the train (the sender ran out of
/// data, or was not scheduled): what follows is no longer back to back, and
/// an ACK time that spans the pause would read a rate far under the link's.
pub const TRAIN_GAP: Duration = Duration::from_millis(1);
/// Startup jumps to this share of the capacity the train read, at
/// [`TRAIN_GAIN`]: paced at the capacity, a window of its BDP. A train
/// reads the capacity, not what other flows leave of it, and ACKs bunched
/// on their way back read high, so the rounds after the jump verify it.
pub const TRAIN_SHARE: f64 = 1.0 / TRAIN_GAIN;
/// Trains a cold start sends at most: a second when the first one's ACKs
/// came too close together to read (in the lab at 700 ms, 1 run in 3:
/// the receiver, sharing two cores with the sender and the emulator, read
/// the whole train at one wake-up and acknowledged it at once), or no
/// further apart than the sender sent it ([`TRAIN_PACED`]), or at two
/// times only.
const TRAIN_TRIES: u32 = 2;
/// The second train is at least this many times as long as the first ...
const TRAIN_AGAIN: u64 = 4;
/// ... and as long as [`TRAIN_AGAIN_BDP`] of the first one's reading (or
/// floor) over the path RTT, up to this many times the first. The lab's
/// emulator hands a millisecond's packets on together, and the receiver
/// acknowledges when it is scheduled: a second train of 190 kB (1.5 ms at
/// 1 Gbit/s) read 146-1,583 Mbit/s of 1,000 at 70 ms, one of 710 kB
/// 761-1,009, and startup took itself for shared (and drained) in 4 of 12
/// gets against none.
const TRAIN_AGAIN_MAX: u64 = 16;
/// The share of the first train's reading's BDP a second train may be: at
/// most a quarter of a BDP more in the bottleneck's queue, for the few
/// milliseconds it takes to leave. After a floor of 288 Mbit/s a path under
/// 20 ms keeps [`TRAIN_AGAIN`] (after a reading of 100 Mbit/s, one under 58
/// ms).
const TRAIN_AGAIN_BDP: f64 = 0.25;
/// A train whose ACKs spread over at most this many times the time it took
/// to send came back at the sender's pace, not the path's (see
/// `Wan::train_ack`).
const TRAIN_PACED: f64 = 1.25;
/// Rounds after the jump that keep it in the estimate: the round under way
/// (its ACKs are of the first flight) and the one that acknowledges what
/// was sent at the jumped rate.
const TRAIN_ROUNDS: u32 = 2;
/// Startup's gain from a train's jump on, instead of 2: the train read the
/// bottleneck, and a window of 1.5 BDP can queue at most half a BDP, which
/// a one-BDP queue holds, also when the train read up to twice the link
/// (a fifth of the lab's trains at 700 ms read 1.35-1.84 Gbit/s of 1). At 2
/// startup's last round overflowed it (a 300 MB get at 700 ms / 1e-3: the
/// train read 896 Mbit/s, the next round 918, then a round at gain 2 lost
/// 11 MB, and the round after the drain delivered 127 Mbit/s while the
/// losses were repaired).
pub const TRAIN_GAIN: f64 = 1.5;
/// Above this many times what the train read, the train read far too low
/// (75 and 105 Mbit/s of 1 Gbit/s were seen): startup grows at 2 again.
const TRAIN_FAR: f64 = 2.0;
/// A startup at [`TRAIN_GAIN`] that ends with at least this share of what
/// the train read had the path to itself: it cruises at once, and the
/// window of one BDP drains its half BDP of queue with the link kept busy
/// (BBR's inflight rule). A round at 1/2.885 with a window of a third left
/// the link idle a third of a round: at 700 ms in the simulation the first
/// 5 s averaged 646 instead of 704 Mbit/s; a round at 0.5 with a window of
/// the BDP still delivered 550-610 Mbit/s in the round after it in the lab.
/// Under it, others share the path, and the drain is the usual one: beside
/// 2-5 CUBIC flows a gentle drain took 1.22-1.67 fair shares (means of 8
/// seeds, single runs to 1.99) where the usual one takes 1.07-1.56; judged
/// by the queue instead (a standing queue under half the path RTT), 2.13
/// beside 5. A train that read high (a sixteenth of them, 1.33-1.84 times
/// the link) is taken for a shared path, and drains as usual.
const TRAIN_ALONE: f64 = 0.75;
/// A round saw a queue only when its least RTT stood this many datagrams'
/// time at the estimated rate above the path RTT (besides [`QUEUE_TARGET`]):
/// at 1 Mbit/s one datagram is 11.6 ms, and a window of the BDP and
/// [`SLOW_HEADROOM_PACKETS`] with a probe's quarter on top keeps up to
/// about six and a half datagrams in the queue at the probe's end (it
/// builds during the round, and the round's least RTT is what counts), so
/// a round whose every packet met a few others there is not yet a
/// standing queue: read as one, every round with a random loss at 10 %
/// was congestion.
const QUEUE_PACKETS: f64 = 8.0;
/// Most ACK aggregation a short path's window makes room for.
const AGG_MAX: Duration = Duration::from_millis(20);
/// Window headroom beyond the BDP, on every path: ACKs come in bursts, and the
/// pacer needs room to keep sending while they are on their way. On a short
/// path the receiver's scheduling, not the wire, delays them.
const HEADROOM: Duration = Duration::from_millis(5);
/// The least headroom, in datagrams (see `Wan::headroom`).
const HEADROOM_PACKETS: u64 = 3;
/// ... and on a slow link, whose estimated rate is under [`SLOW_LINK`]
/// bytes a second, this many (see `Wan::headroom`).
const SLOW_HEADROOM_PACKETS: u64 = 5;
/// The rate under which a link counts as slow for [`SLOW_HEADROOM_PACKETS`]:
/// 6 Mbit/s, where a 1,500-byte datagram takes 2 ms.
const SLOW_LINK: f64 = 750_000.0;

/// An RTT sample that stood above the path RTT by more than [`QUEUE_TARGET`],
/// 5 % of the path RTT, or `packet` times [`QUEUE_PACKETS`] (one datagram's
/// time at the estimated rate), whichever is most, met a queue.
fn queued(rtt: Duration, path: Duration, packet: Duration) -> bool {
    rtt > path
        + QUEUE_TARGET
            .max(path / 20)
            .max(packet.mul_f64(QUEUE_PACKETS))
}

/// A path short enough that [`HEADROOM`] is more queue than a drain round
/// removes (a quarter of the path RTT): under 20 ms.
fn short_path(path: Duration) -> bool {
    path < HEADROOM * 4
}

/// A path as short as a LAN's ([`LAN_RTT`]).
fn lan_path(path: Duration) -> bool {
    path < LAN_RTT
}

/// The phase the controller is in; [`Wan::mode`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Finding the rate without a hint: gain 2.885 (nearly triple a round),
    /// 2 once a round grew less than twice on a path of 80 ms or more, 1.5
    /// after a train's jump ([`TRAIN_GAIN`]), until the bandwidth stops
    /// growing by a quarter for three rounds, or a round is congested. Also
    /// where it starts again when competition ends.
    Startup,
    /// One round at gain 1/2.885 after startup, to empty the queue startup
    /// built; then cruise (`fair`: compete). Not after a startup at 1.5
    /// that had the path to itself (`TRAIN_ALONE`): that one cruises at
    /// once.
    Drain,
    /// At the estimate, in the eight-round probe cycle (probe, drain, six at
    /// gain 1); a hint starts here.
    Cruise,
    /// Other senders keep a queue standing: share with them the way CUBIC does.
    Compete,
    /// Competing, but sending half for a few rounds to see whether the queue
    /// empties (the others have gone).
    Yield,
}

/// CUBIC's constants (RFC 8312), for the competing mode and `fair`.
const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.8;
/// The segment CUBIC counts its growth in: TCP's, so that the window grows
/// as fast as theirs, whatever size our datagrams are.
const CUBIC_MSS: f64 = 1448.0;
/// Rounds in a row with a standing queue that only other senders can be keeping
/// (ours drains it every round it sees it).
pub const COMPETE_AFTER: u32 = 8;
/// Two overflows of the queue within this many rounds mean competition.
pub const OVERFLOW_ROUNDS: u32 = 32;
/// A round whose least RTT is within this (or 2.5 % of the path RTT) of the
/// path RTT saw an empty queue.
const EMPTY_MARGIN: Duration = Duration::from_millis(2);
/// How often a short path's queue is emptied on purpose (see `end_round`).
const FLOOR_EVERY: Duration = Duration::from_secs(5);
/// Rounds in a row without a queue that end competing: the others have gone
/// (loss-based senders keep a queue most of the time).
const CLEAR_ROUNDS: u32 = 4;
/// How often a competing `wan` looks whether the others have gone ...
pub const YIELD_EVERY: Duration = Duration::from_secs(10);
/// ... by sending half its window for this many rounds.
const YIELD_ROUNDS: u32 = 2;

/// A CUBIC window (RFC 8312) in bytes: what `fair` always uses and `wan` uses
/// while it competes with loss-based senders.
#[derive(Debug, Clone)]
struct Cubic {
    cwnd: f64,
    /// The window at the last congestion event, and TCP's estimate since.
    w_max: f64,
    w_est: f64,
    epoch: Option<Instant>,
    /// Losses of packets sent before this belong to the last event.
    recovery: Option<Instant>,
}

impl Cubic {
    fn new(cwnd: f64) -> Cubic {
        Cubic {
            cwnd,
            w_max: cwnd,
            w_est: cwnd,
            epoch: None,
            recovery: None,
        }
    }

    fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64, rtt: Duration) {
        if self.recovery.is_some_and(|r| sent <= r) {
            return;
        }
        let b = bytes as f64;
        let epoch = *self.epoch.get_or_insert(now);
        // RFC 8312's K, from W_max alone: an epoch that starts at W_max (the
        // start of competition) holds its window for K before it probes.
        // RFC 9438's K, from W_max - cwnd (as Linux), probes at once; it
        // took `wan` to 2.4 fair shares beside 5 CUBIC flows and `fair` to
        // 1.2-1.4 beside 3 in the simulation (its start and β were tuned
        // with this K), for little alone: `fair` at 70 ms with 1e-3 loss
        // holds 410 Mbit/s for the K (11 s) and then grows, and with K = 0 its
        // convex growth still needs 20 s to the BDP (lab, 1 GB: 442 Mbit/s
        // against 389-403).
        let k = (self.w_max / CUBIC_MSS * (1.0 - CUBIC_BETA) / CUBIC_C).cbrt();
        let t = (now.saturating_duration_since(epoch) + rtt).as_secs_f64();
        let target = (CUBIC_C * (t - k).powi(3) + self.w_max / CUBIC_MSS) * CUBIC_MSS;
        // TCP-friendly region: 3(1-β)/(1+β) segments per round trip.
        self.w_est += 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA) * CUBIC_MSS * b / self.cwnd;
        let goal = target.max(self.w_est);
        if goal > self.cwnd {
            // At most half again per round trip.
            self.cwnd += (goal - self.cwnd).min(self.cwnd / 2.0) * b / self.cwnd;
        }
    }

    /// A packet sent at `sent` was lost: one cut per round trip of losses.
    fn on_loss(&mut self, now: Instant, sent: Instant, floor: f64) {
        if self.recovery.is_some_and(|r| sent <= r) {
            return;
        }
        self.recovery = Some(now);
        // Fast convergence: a window that lost ground since the last event
        // gives up more, so a newcomer catches up.
        self.w_max = if self.cwnd < self.w_max {
            self.cwnd * (1.0 + CUBIC_BETA) / 2.0
        } else {
            self.cwnd
        };
        self.cwnd = (self.cwnd * CUBIC_BETA).max(floor);
        self.w_est = self.cwnd;
        self.epoch = None;
    }
}

/// The first flight's train (see [`Wan::on_sent`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Train {
    /// Not sent yet: it starts with the first batch of data once an RTT is
    /// known (the handshake's), if the controller starts cold on a long path.
    Ready,
    /// Going out back to back since `start`, the last batch at `last`:
    /// `bytes` so far.
    Sending {
        start: Instant,
        last: Instant,
        bytes: u64,
    },
    /// Sent from `start` to `end` (`bytes`); its ACKs are being timed:
    /// the first ACK's time, the last's, the bytes acknowledged after the
    /// first, the bytes acknowledged or lost so far, and the distinct times
    /// ACKs came at; `path`, the path RTT known before it went out (the
    /// handshake's: its own ACKs' RTTs hold its time on the wire).
    Timing {
        start: Instant,
        end: Instant,
        bytes: u64,
        path: Option<Duration>,
        lost: bool,
        first: Option<Instant>,
        last: Option<Instant>,
        after: u64,
        seen: u64,
        times: u32,
    },
    /// Measured or given up; or not wanted (a hint, `fair`, a short path).
    Done,
}

/// The controller's state: feed it ACKs ([`Wan::on_ack`]) and losses
/// ([`Wan::on_loss`]); read the window ([`Wan::window`]) and the pacing rate
/// ([`Wan::pacing_rate`]).
#[derive(Debug, Clone)]
pub struct Wan {
    mtu: u64,
    mode: Mode,
    /// Bytes per second: the filter's samples, newest last, and its maximum.
    bw_samples: Vec<f64>,
    bw: f64,
    /// Windowed minimum in two buckets: the previous window's and this one's
    /// (since `bucket_start`). Taking a fresh sample when the window expired
    /// would take one with the standing queue in it, and the queue would ratchet.
    min_prev: Option<Duration>,
    min_cur: Option<Duration>,
    bucket_start: Option<Instant>,
    /// The round under way: when it began (the ACK that ended the last
    /// round, or its own first ACK if it began afresh) and the latest send
    /// time of what that ACK covered, bytes acknowledged and lost in it,
    /// and its smallest RTT sample. It ends in `on_end_acks`, at the end
    /// of the first ACK one path RTT (at least eight datagrams' time)
    /// after its start.
    round_start: Option<Instant>,
    round_sent: Option<Instant>,
    round_acked: u64,
    /// Of `round_acked`, the bytes of the ACK that opened a round begun
    /// afresh: delivered before its start, its rate leaves them out (a
    /// round that follows another begins after the ACK that ended it).
    round_first: u64,
    /// The round began afresh (not at the ACK that ended the last).
    round_fresh: bool,
    /// The last ACK's time and the latest send time of what it covered.
    last_ack: Option<(Instant, Instant)>,
    round_lost: u64,
    /// Of `round_lost`, packets sent since the controller last settled
    /// (entered cruise): only those can tell of other senders. A startup's
    /// overshoot is found lost up to a queue's time later (600 ms on a
    /// 1 Mbit/s path with 50 packets of queue), in the rounds after it.
    round_lost_settled: u64,
    /// (acknowledged, lost) bytes of the last [`BW_ROUNDS`] rounds since the
    /// controller settled that saw no queue: their losses are the path's
    /// own (see `Wan::random_loss`).
    loss_rounds: VecDeque<(u64, u64)>,
    settled_since: Option<Instant>,
    /// Rounds completed since the controller began (the first window holds
    /// only until one has measured the path).
    rounds: u64,
    /// The overflow under way (rounds congested one after another): the
    /// estimate before it, and the most one of its rounds delivered.
    overflow: Option<(f64, f64)>,
    round_min_rtt: Option<Duration>,
    /// The last round's smallest RTT sample.
    prev_min_rtt: Option<Duration>,
    cycle: usize,
    /// Startup: the bandwidth at the last growth, and rounds since.
    full_bw: f64,
    full_bw_rounds: u32,
    /// Startup: the estimate at the end of the last round.
    last_round_bw: f64,
    /// Drain the next round (a queue was seen).
    drain_next: bool,
    gain: f64,
    /// `fair`: always CUBIC, never the model.
    fair: bool,
    /// Rounds left in which the pacer spreads the window over the path RTT
    /// (see [`Wan::pacing_rtt`]): those after a startup, while the queue it
    /// built drains.
    own_queue_rounds: u32,
    /// The CUBIC window while competing (set up by `compete`).
    cubic: Cubic,
    /// Rounds in a row that saw a standing queue.
    queued_rounds: u32,
    /// Startup: bytes acknowledged so far, and (ACK time, that count, the
    /// acknowledged packet's send time) about every 1/32 of the span, back
    /// to one span ago: the recent delivery rate at every ACK.
    delivered: u64,
    deliveries: VecDeque<(Instant, u64, Instant)>,
    /// The largest such rate of the round under way.
    round_max_rate: f64,
    /// ACK aggregation, as BBR measures it: bytes acknowledged since `agg_start`
    /// beyond what the bandwidth estimate explains; the largest excess of this
    /// bucket of rounds and of the last.
    agg_start: Option<Instant>,
    agg_acked: u64,
    agg_max: [f64; 2],
    agg_rounds: u32,
    /// A floor phase (window of four datagrams) under way until then, and
    /// when the last began.
    floor_until: Option<Instant>,
    last_floor: Option<Instant>,
    /// Rounds in a row without a queue while competing.
    clear_rounds: u32,
    /// When the queue last overflowed outside a probe round.
    last_overflow: Option<Instant>,
    /// Competing since (or since the last yield), and yield rounds left.
    compete_since: Option<Instant>,
    yield_left: u32,
    /// The first flight's train, and the jump it gave startup with the
    /// rounds it has left in the estimate.
    train: Train,
    jump: Option<(f64, u32)>,
    /// The capacity (bytes/s) the train read, for the startup it jumped:
    /// the least of two trains' readings; `cap_floor`: it is a floor (the
    /// train's ACKs came at once).
    train_cap: Option<f64>,
    cap_floor: bool,
    /// The most a train read (not a floor), beside `train_cap`: startup's
    /// end is judged against each reading.
    train_cap_max: Option<f64>,
    /// A startup that had the path to itself cruised at once: the queue
    /// its first round sees is its own, which the window of the BDP drains.
    own_startup_queue: bool,
    /// What the first train sent, once it is out: the first window.
    train_bytes: Option<u64>,
    /// Trains sent.
    train_tries: u32,
    /// The connection's RTT before this controller took over (the server
    /// switches controllers after the handshake, when the client has said
    /// which it wants): sizes a hinted first round, which otherwise assumes
    /// 100 ms.
    seed_rtt: Option<Duration>,
}

impl Wan {
    /// `hint`: a starting rate in bits per second (0: none).
    pub fn new(mtu: u16, hint: u64) -> Wan {
        let mut w = Wan {
            mtu: mtu as u64,
            mode: Mode::Startup,
            bw_samples: Vec::new(),
            bw: 0.0,
            min_prev: None,
            min_cur: None,
            bucket_start: None,
            round_start: None,
            round_sent: None,
            round_acked: 0,
            round_first: 0,
            round_fresh: false,
            last_ack: None,
            round_lost: 0,
            round_lost_settled: 0,
            loss_rounds: VecDeque::new(),
            settled_since: None,
            rounds: 0,
            overflow: None,
            round_min_rtt: None,
            prev_min_rtt: None,
            cycle: 0,
            full_bw: 0.0,
            full_bw_rounds: 0,
            last_round_bw: 0.0,
            drain_next: false,
            gain: STARTUP_GAIN,
            fair: false,
            own_queue_rounds: 0,
            cubic: Cubic::new(0.0),
            queued_rounds: 0,
            delivered: 0,
            deliveries: VecDeque::new(),
            round_max_rate: 0.0,
            agg_start: None,
            agg_acked: 0,
            agg_max: [0.0; 2],
            agg_rounds: 0,
            clear_rounds: 0,
            floor_until: None,
            last_floor: None,
            last_overflow: None,
            compete_since: None,
            yield_left: 0,
            seed_rtt: None,
            train: Train::Ready,
            jump: None,
            train_cap: None,
            cap_floor: false,
            train_cap_max: None,
            own_startup_queue: false,
            train_bytes: None,
            train_tries: 0,
        };
        if hint > 0 {
            w.bw = hint as f64 / 8.0;
            w.bw_samples.push(w.bw);
            w.mode = Mode::Cruise;
            w.gain = 1.0;
            w.cycle = 2; // start at gain 1, not with a probe
            w.train = Train::Done;
        }
        w
    }

    /// `--cc fair`: shares a bottleneck with TCP the way CUBIC does: `wan`'s
    /// startup measures what the path gives, then a CUBIC window from there
    /// on, one cut per round trip with losses. (CUBIC's own slow start ends at
    /// the first loss, which beside flows that keep the queue full comes at
    /// once; from that small window CUBIC takes tens of seconds to grow to a
    /// share.)
    pub fn fair(mtu: u16) -> Wan {
        let mut w = Wan::new(mtu, 0);
        w.fair = true;
        w.train = Train::Done;
        w
    }

    /// The RTT the connection measured before this controller existed.
    pub fn seed_rtt(&mut self, rtt: Duration) {
        self.seed_rtt = Some(rtt);
    }

    /// The path's datagram size changed (MTU discovery): the window's floor
    /// follows, or a window below one datagram would stall the sender.
    pub fn set_mtu(&mut self, mtu: u16) {
        self.mtu = mtu as u64;
    }

    /// `bytes` were sent at `now` (quinn reports each batch it sent). A
    /// cold start's first batch of data ([`TRAIN_START`]) once the
    /// handshake's RTT is known starts the train: [`Wan::unpaced`] holds
    /// until [`TRAIN_PACKETS`] datagrams are out or an ACK comes; a send
    /// after a pause of [`TRAIN_GAP`] ends it (that batch is not paced
    /// either, and is not part of the train).
    pub fn on_sent(&mut self, now: Instant, bytes: u64) {
        match self.train {
            Train::Ready => {
                let Some(rtt) = self.known_rtt() else {
                    return; // the handshake: no RTT yet
                };
                // (A hint or `fair` never have a train: see `Wan::new`.)
                if self.mode != Mode::Startup || rtt < TRAIN_MIN_RTT {
                    self.train = Train::Done;
                } else if bytes >= TRAIN_START
                    && (self.train_tries == 0 || self.window() >= TRAIN_PACKETS * self.mtu)
                {
                    // (A second train only where the window holds one.)
                    self.train_tries += 1;
                    self.train = Train::Sending {
                        start: now,
                        last: now,
                        bytes,
                    };
                }
            }
            Train::Sending {
                start,
                last,
                bytes: b,
            } => {
                if now.saturating_duration_since(last) > TRAIN_GAP {
                    // The sender ran dry: the train is what it had.
                    self.train_sent(last);
                    return;
                }
                self.train = Train::Sending {
                    start,
                    last: now,
                    bytes: b + bytes,
                };
            }
            _ => return,
        }
        if let Train::Sending { bytes, .. } = self.train {
            if bytes >= self.train_packets() * self.mtu {
                self.train_sent(now);
            }
        }
    }

    /// Datagrams of the train under way: [`TRAIN_PACKETS`], and
    /// [`Wan::train_times`] that for a second one: the first came back
    /// within [`TRAIN_MIN_SPAN`] (the path carried 30 datagrams within one
    /// wake-up of the receiver: several hundred Mbit/s or more), and a
    /// longer train spreads over more than the hosts' wake-ups.
    fn train_packets(&self) -> u64 {
        TRAIN_PACKETS * self.train_times()
    }

    /// How many times a first train's size the one under way is: 1, or for
    /// a second [`TRAIN_AGAIN_BDP`] of what the first read over the path
    /// RTT, between [`TRAIN_AGAIN`] and [`TRAIN_AGAIN_MAX`] times.
    fn train_times(&self) -> u64 {
        if self.train_tries <= 1 {
            return 1;
        }
        let share = match (self.train_cap, self.known_rtt()) {
            (Some(c), Some(rtt)) => c * rtt.as_secs_f64() * TRAIN_AGAIN_BDP,
            _ => 0.0,
        };
        let one = (TRAIN_PACKETS * self.mtu) as f64;
        ((share / one) as u64).clamp(TRAIN_AGAIN, TRAIN_AGAIN_MAX)
    }

    /// Whether the sender should send what it has now, back to back and
    /// unpaced: the train is going out.
    pub fn unpaced(&self) -> bool {
        matches!(self.train, Train::Sending { .. })
    }

    /// While the train goes out, the bytes it may still send: it ends once
    /// [`TRAIN_PACKETS`] datagrams are out, but the sender sends a batch at
    /// a time (up to 54 datagrams in one GSO send), so a batch must not take
    /// it past the first flight (or four to sixteen times that for a second
    /// train, by what the first read), which fits a slow link's 50-packet
    /// queue: uncapped, a train of 68 datagrams at 256 kbit/s and 290 ms lost
    /// 18 of them in the queue and their repair came 1.4 s later (seed 001's
    /// path B, 10 x 10 kB in 5.5 s instead of 4.0). None when no train is
    /// going out.
    pub fn train_room(&self) -> Option<u64> {
        let Train::Sending { bytes, .. } = self.train else {
            return None;
        };
        let first = (TRAIN_PACKETS * self.mtu).max(self.first_flight());
        Some((first * self.train_times()).saturating_sub(bytes))
    }

    /// The train is out (its last datagrams sent by `end`): time its ACKs.
    fn train_sent(&mut self, end: Instant) {
        if let Train::Sending { start, bytes, .. } = self.train {
            self.train_bytes.get_or_insert(bytes);
            self.train = Train::Timing {
                start,
                end,
                bytes,
                path: self.known_rtt(),
                lost: false,
                first: None,
                last: None,
                after: 0,
                seen: 0,
                times: 0,
            };
        }
    }

    /// An ACK (at `now`) or a loss of `bytes` sent at `sent`: the train's
    /// timing takes it, and reads the capacity once the train is
    /// accounted for or a later datagram's ACK comes.
    fn train_ack(&mut self, now: Instant, sent: Instant, bytes: u64, acked: bool) {
        // An ACK of its own while it goes out (the sender had no more data
        // for a round trip): the train is what was sent, until its last send
        // (not this ACK's time, which would make it look sent as slowly as
        // it came back). ACKs and losses of what went before it do not end
        // it: a second train goes out while the first flight's ACKs come
        // in, and one of those cut it at quinn's first 20 datagrams (in the
        // lab at 700 ms: 29 kB, no reading, seven blind rounds).
        if let Train::Sending { start, last, .. } = self.train {
            if sent < start {
                return;
            }
            self.train_sent(last);
        }
        let rtt = self.known_rtt().unwrap_or(Duration::ZERO);
        let least = SAMPLE_PACKETS * self.mtu;
        let Train::Timing {
            start,
            end,
            bytes: total,
            path: before,
            lost: ref mut train_lost,
            ref mut first,
            ref mut last,
            ref mut after,
            ref mut seen,
            ref mut times,
        } = self.train
        else {
            return;
        };
        if sent < start {
            return; // the handshake's
        }
        let later = sent > end;
        if !later {
            *seen += bytes;
            *train_lost |= !acked;
            if acked {
                match *first {
                    None => {
                        *first = Some(now);
                        *times = 1;
                    }
                    Some(f) if now > f => {
                        *after += bytes;
                        if *last != Some(now) {
                            *times += 1;
                        }
                        *last = Some(now);
                    }
                    Some(_) => {}
                }
            }
        }
        // Read with what came within two round trips of its first ACK (a
        // slow path takes longer to deliver it: 1.1 s at 256 kbit/s).
        let late = now.saturating_duration_since(first.unwrap_or(end)) > rtt * 2;
        if later || *seen >= total || late {
            let (first, last, after, times) = (*first, *last, *after, *times);
            // (All of it delivered: a floor of the path's rate. Part of it
            // lost, beside flows that fill the queue, it is not: the
            // simulator beside 6 CUBIC flows read 2 of 30 datagrams
            // acknowledged at once as the whole train carried in 1 ms.)
            let whole = !*train_lost && *seen >= total;
            self.train = Train::Done;
            // From the first ACK to the last (zero if they came at once).
            let span = first
                .zip(last)
                .map_or(Duration::ZERO, |(f, l)| l.saturating_duration_since(f));
            tracing::trace!(
                bytes = total,
                path_us = before.map_or(0, |p| p.as_micros() as u64),
                first_us =
                    first.map_or(0, |f| f.saturating_duration_since(start).as_micros() as u64),
                sent_us = end.saturating_duration_since(start).as_micros() as u64,
                acks_us = span.as_micros() as u64,
                after,
                later,
                late,
                "wan train timed"
            );
            let read = (span >= TRAIN_MIN_SPAN && after >= least)
                .then(|| after as f64 / span.as_secs_f64());
            // Every ACK of it came within TRAIN_MIN_SPAN (a receiver or a
            // sender that was not scheduled while they came: 1 train in 3
            // at 700 ms in the lab): the path carried 30 datagrams within a
            // wake-up, a fast one. (Not only ACKs at one instant: 20
            // datagrams in one ACK and 10 in the next 59 µs later gave no
            // reading, and startup took 10 round trips, 7 s at 700 ms.)
            // Or they came back as fast as the sender let the train out
            // (its batches spread over up to 0.9 ms while it read files):
            // what it read is the sender's pace, a floor of the path's
            // (194 and 332 Mbit/s of 1 Gbit/s). Or they came at two times
            // only: one interval, which a wake-up of the receiver more or
            // less made 280 Mbit/s of 1 Gbit/s (the lab's emulator hands
            // the receiver 10-datagram aggregates, so a train of 30 comes
            // back in 2-3 ACKs). Either way the next flight is a train
            // again, once; startup jumps on any reading meanwhile.
            let sending = end.saturating_duration_since(start);
            let fast = span < TRAIN_MIN_SPAN || span <= sending.mul_f64(TRAIN_PACED) || times <= 2;
            let again =
                first.is_some() && fast && !later && !late && self.train_tries < TRAIN_TRIES;
            match read {
                Some(capacity) => {
                    self.train_jump(capacity, false);
                    if again {
                        self.train = Train::Ready;
                    }
                }
                None => {
                    // All of it acknowledged at once (within a wake-up):
                    // no rate to read, but the path carried it within the
                    // time its ACK took beyond the path RTT, and over no
                    // less than TRAIN_FLOOR_SPAN: startup jumps to that
                    // floor, so the round the second train leads carries
                    // more than the first flight again (in the lab at 700
                    // ms a third of the 100 x 5 MB gets lost a whole round
                    // so, 0.7 s).
                    let floor = match (first, before) {
                        (Some(f), Some(path)) if whole && span < TRAIN_MIN_SPAN => Some(
                            f.saturating_duration_since(start)
                                .saturating_sub(path)
                                .max(TRAIN_FLOOR_SPAN),
                        ),
                        _ => None,
                    };
                    if let Some(wire) = floor {
                        // (Of a second train no more than TRAIN_AGAIN times
                        // the first counts: over the least span a 576 kB
                        // train would be a floor of 4.6 Gbit/s, where a
                        // path RTT taken a little long hides the time it
                        // took.)
                        let counted = self
                            .train_bytes
                            .map_or(total, |b| total.min(b * TRAIN_AGAIN));
                        self.train_jump(counted as f64 / wire.as_secs_f64(), true);
                    }
                    if again {
                        self.train = Train::Ready;
                    } else if floor.is_none() {
                        // No reading: the first window is what it was
                        // without one.
                        self.train_bytes = None;
                    }
                }
            }
        }
    }

    /// The train read `capacity` (bytes/s), or no less than that (`floor`,
    /// its ACKs came at once): startup jumps to its share, at
    /// [`TRAIN_GAIN`], unless it is already there.
    fn train_jump(&mut self, capacity: f64, floor: bool) {
        let jump = TRAIN_SHARE * capacity;
        tracing::trace!(capacity_mbps = capacity * 8e-6, floor, "wan train");
        if self.mode != Mode::Startup {
            return;
        }
        // Startup's end is judged against the least and the most reading
        // (`Wan::alone`): of two trains in the lab at 700 ms one often
        // read 1.3-1.9 times the link (ACKs bunched on their way back), and
        // judged by it alone startup drained for a whole round as if
        // others shared the path, the link idle for 0.3-0.5 s. A floor
        // counts until a train reads a rate, and never lowers one.
        let jumps = jump > self.bw;
        self.train_cap = match (self.train_cap, self.cap_floor, floor) {
            (None, ..) if !jumps => None,
            (None, ..) | (Some(_), true, false) => {
                self.cap_floor = floor;
                Some(capacity)
            }
            (Some(c), false, false) => Some(c.min(capacity)),
            (Some(c), _, true) => Some(c),
        };
        if self.train_cap.is_some() && !floor {
            self.train_cap_max = Some(self.train_cap_max.map_or(capacity, |m| m.max(capacity)));
        }
        if !jumps {
            return;
        }
        self.bw = jump;
        self.jump = Some((jump, TRAIN_ROUNDS));
        self.gain = TRAIN_GAIN;
        self.full_bw = jump;
        self.full_bw_rounds = 0;
        self.last_round_bw = jump;
    }

    /// Did startup have the path to itself? It ended with at least
    /// [`TRAIN_ALONE`] of what a train read, and under [`TRAIN_FAR`] times
    /// it (at [`TRAIN_GAIN`], see `train_gain`). Of two readings the higher
    /// will do, and the lower where startup ended within a third of it:
    /// the first train is the one that asked for a second (its ACKs came
    /// at once or at two times; at 70 ms in the lab the first train of a
    /// small-file get read 196-323 Mbit/s of 1 Gbit/s, its receiver busy
    /// with the first files), and a longer one reads high now and then
    /// (1.3-1.9 times the link at 700 ms).
    fn alone(&self) -> bool {
        let near = |c: f64| self.bw >= TRAIN_ALONE * c && self.bw < TRAIN_FAR * c;
        match (self.train_cap, self.train_cap_max) {
            (Some(least), Some(most)) if most > least => {
                // By the lesser only where startup ended within a third of
                // it: joining a full link (the higher reading its capacity,
                // startup ending at its share) is not being alone because a
                // first train read low.
                near(most) || (near(least) && self.bw * TRAIN_ALONE <= least)
            }
            (Some(c), _) => near(c),
            (None, _) => false,
        }
    }

    /// Startup's gain after a train's jump ([`TRAIN_GAIN`], or 2 once the
    /// estimate is [`TRAIN_FAR`] times what the train read, the most of
    /// two readings): call after the estimate changed.
    fn train_gain(&mut self) {
        let Some(cap) = self.train_cap_max.or(self.train_cap) else {
            return;
        };
        if self.mode == Mode::Startup && self.gain >= TRAIN_GAIN {
            self.gain = if self.bw < TRAIN_FAR * cap {
                TRAIN_GAIN
            } else {
                STARTUP_FULL_GAIN
            };
        }
    }

    /// The phase the controller is in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The bandwidth estimate in bits per second.
    pub fn bandwidth(&self) -> u64 {
        (self.bw * 8.0) as u64
    }

    /// The path RTT: the smallest RTT sample of the current and the previous
    /// [`MIN_RTT_WINDOW`] (which does not move on while competing); None
    /// before any ACK.
    pub fn min_rtt(&self) -> Option<Duration> {
        match (self.min_prev, self.min_cur) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The queue this controller's own window keeps standing at the
    /// bottleneck of a slow link ([`SLOW_LINK`]) when it cruises alone: at
    /// most its headroom's time at the estimated rate, which is also what
    /// the window has beyond the BDP, so a path that grew longer by no
    /// more than this still gets a window of its BDP. The path-RTT filter
    /// does not rise by this much or less (see `on_ack`). Zero elsewhere.
    fn own_queue(&self, path: Duration) -> Duration {
        if !self.slow_link() {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(self.headroom(path) / self.bw)
    }

    /// The estimated rate is under [`SLOW_LINK`] (and there is one).
    fn slow_link(&self) -> bool {
        self.bw > 0.0 && self.bw < SLOW_LINK
    }

    /// The path RTT, or before any ACK of this controller's the
    /// connection's (the handshake's).
    fn known_rtt(&self) -> Option<Duration> {
        self.min_rtt().or(self.seed_rtt)
    }

    /// The factor on bandwidth × path RTT for the window, and on the
    /// bandwidth for the pacing rate, this round: 2.885 in startup (2 near
    /// the bottleneck, 1.5 after a train's jump), 1/2.885
    /// in drain, the probe cycle's in cruise; 1 in compete and yield, where
    /// the CUBIC window rules instead.
    pub fn gain(&self) -> f64 {
        self.gain
    }

    /// The rate to pace at, bits per second (0 before any estimate).
    pub fn pacing_rate(&self) -> u64 {
        match (self.mode, self.min_rtt()) {
            (Mode::Compete | Mode::Yield, Some(rtt)) => {
                (self.window() as f64 * 8.0 / rtt.as_secs_f64().max(1e-6)) as u64
            }
            (Mode::Compete | Mode::Yield, None) => 0,
            _ => (self.gain * self.bw * 8.0 / (1.0 - self.random_loss())) as u64,
        }
    }

    /// The round trip the driver's pacer spreads the window over (quinn's,
    /// patched: `Controller::pacing_rtt`), None for the smoothed RTT. The
    /// path RTT for two rounds after a startup (after its drain round, if
    /// it has one), while the window of the BDP drains the queue startup
    /// built: the smoothed RTT holds that queue for a round or two, and a
    /// pacer at the window over it sent under the link while the queue
    /// emptied (at 700 ms the smoothed RTT stood at 870-980 ms,
    /// the flight fell to 64 MB under a window of 86 MB, and the round
    /// delivered 570 Mbit/s of 1 Gbit/s). Not otherwise: a queue that
    /// others keep standing belongs in the pacing rate (paced over the path
    /// RTT throughout, beside 5 CUBIC flows the default took 2.08 fair
    /// shares in the simulator, against at most 2), nor in `fair`.
    pub fn pacing_rtt(&self) -> Option<Duration> {
        match self.mode {
            Mode::Compete | Mode::Yield | Mode::Startup => None,
            _ if self.fair || self.own_queue_rounds == 0 => None,
            _ => self.min_rtt(),
        }
    }

    /// The share of bytes the path loses with no queue (random loss), over
    /// the last [`BW_ROUNDS`] rounds that saw none, at most
    /// 30 %. The bandwidth is what was delivered; a lost
    /// packet holds its place in the window until it is declared lost, a
    /// round later, so a window of the delivered rate's BDP sends only
    /// (1 - loss) of it: at 10 Mbit/s, 300 ms and 10 % loss each probe
    /// (+8 %) delivered 0.97 of the estimate, and the estimate sank with
    /// every cycle, to 4.6 Mbit/s in 40 s. The window and the pacing rate
    /// are therefore the delivered rate's divided by (1 - loss).
    pub fn random_loss(&self) -> f64 {
        let (acked, lost) = self
            .loss_rounds
            .iter()
            .fold((0u64, 0u64), |(a, l), &(x, y)| (a + x, l + y));
        if acked + lost == 0 {
            return 0.0;
        }
        (lost as f64 / (acked + lost) as f64).min(MAX_RANDOM_LOSS)
    }

    /// The smallest window: four datagrams of the current size.
    fn min_window(&self) -> u64 {
        4 * self.mtu
    }

    /// Bytes allowed in flight. Before any RTT is known: the initial window.
    pub fn window(&self) -> u64 {
        // A train was the first flight: the rest of it, paced after the
        // train, put 8 datagrams more into a 256 kbit/s path's queue in the
        // first round trip than the paced flight alone (whose pacer had not
        // let all of it out when the first ACKs came), and the queue
        // overflowed at the end of startup (10 x 10 kB: 4.2 s instead of 4.0).
        let initial = match self.train_bytes {
            Some(b) => b.max(FIRST_FLIGHT_MIN * self.mtu),
            None => self.first_flight(),
        };
        if self.floor_until.is_some() {
            return self.min_window();
        }
        match self.mode {
            Mode::Compete => return (self.cubic.cwnd as u64).max(self.min_window()),
            Mode::Yield => return (self.cubic.cwnd as u64 / 2).max(self.min_window()),
            _ => {}
        }
        let Some(rtt) = self.min_rtt() else {
            return if self.bw > 0.0 {
                // A hint, no RTT of its own yet: a round at the hinted rate
                // over the connection's RTT so far (else 100 ms). Pacing
                // spreads it over that round.
                let round = self.seed_rtt.map_or(0.1, |r| r.as_secs_f64());
                ((self.bw * round) as u64).max(initial)
            } else {
                initial
            };
        };
        let bdp = self.bw * rtt.as_secs_f64() / (1.0 - self.random_loss());
        let head = self.headroom(rtt);
        let w = (self.gain * bdp + head) as u64;
        if self.mode == Mode::Startup && (self.rounds == 0 || lan_path(rtt)) {
            w.max(initial)
        } else {
            w.max(self.min_window())
        }
    }

    /// The first window: [`FIRST_FLIGHT_BPS`] over the path RTT known (the
    /// handshake's), between [`FIRST_FLIGHT_MIN`] datagrams and
    /// [`INITIAL_WINDOW`] (that on a path under [`LAN_RTT`]); the least of
    /// them before any RTT is known.
    pub fn first_flight(&self) -> u64 {
        let least = FIRST_FLIGHT_MIN * self.mtu;
        match self.known_rtt() {
            Some(rtt) if lan_path(rtt) => INITIAL_WINDOW.max(least),
            Some(rtt) => ((FIRST_FLIGHT_BPS / 8.0 * rtt.as_secs_f64()) as u64)
                .clamp(least, INITIAL_WINDOW.max(least)),
            None => least,
        }
    }

    /// One datagram's time on the wire at the estimated rate (zero before
    /// an estimate).
    fn packet_time(&self) -> Duration {
        if self.bw > 0.0 {
            Duration::from_secs_f64(self.mtu as f64 / self.bw)
        } else {
            Duration::ZERO
        }
    }

    /// Window beyond the BDP for ACKs that come late or in bursts:
    /// [`HEADROOM`] of data, and on a short path (under 4 × `HEADROOM`)
    /// the ACK aggregation measured, up to [`AGG_MAX`] of data. On
    /// loopback the receiver's process, scheduled on the same cores, ACKs in
    /// bursts of several ms; with 5 ms alone `wan` took 3.2-3.35 s for 1 GiB
    /// where bbr (which adds its aggregation too) took 2.7-2.8 s. Never less
    /// than [`HEADROOM_PACKETS`] datagrams: on a slow link 5 ms is less than
    /// one, and a receiver that acknowledges every second datagram holds
    /// the first's ACK for a datagram's time (11.6 ms at 1 Mbit/s), so a
    /// window of the BDP and 5 ms delivered 0.85 of the rate, and the
    /// estimate, the maximum of what was delivered, followed it down.
    ///
    /// On a slow link ([`SLOW_LINK`]) the least is
    /// [`SLOW_HEADROOM_PACKETS`]: there a lost datagram holds its place in
    /// the window until it is declared lost, the loss the window makes up
    /// for is an estimate, and a queue of three datagrams ran dry now and
    /// then under random loss: path A's link (1 Mbit/s, 70 ms) stood idle
    /// 0.1-1.2 % of the time at 1-10 % loss, where GridFTP's reno kept 30-40
    /// datagrams standing (100 x 1 MB at 10 %: 933 s against its 929). Five
    /// are 58 ms at 1 Mbit/s, 230 ms at 256 kbit/s (the lab's standing
    /// queue, the median of each second's least wait, 35 ms on path A and
    /// 96-188 ms on path B: the round after each probe takes 5 ms off, and
    /// the ACKs of every second datagram come at once); the path-RTT
    /// filter does not take that queue for the path (see `own_queue`). By
    /// rate, not by a datagram's time: the simulator's datagrams are 9,000
    /// bytes, and more of them for flows under 36 Mbit/s moved `fair`
    /// beside CUBIC at 1 Gbit/s.
    fn headroom(&self, path: Duration) -> f64 {
        let packets = if self.slow_link() {
            SLOW_HEADROOM_PACKETS
        } else {
            HEADROOM_PACKETS
        };
        let base = (self.bw * HEADROOM.as_secs_f64()).max((packets * self.mtu) as f64);
        if !short_path(path) {
            return base;
        }
        let agg = self.agg_max[0].max(self.agg_max[1]);
        base.max(agg.min(self.bw * AGG_MAX.as_secs_f64()))
    }

    /// ACK aggregation: restart the epoch whenever the ACKs fall behind the
    /// bandwidth estimate, and keep the largest excess.
    fn aggregation(&mut self, now: Instant, bytes: u64) {
        let start = *self.agg_start.get_or_insert(now);
        let mut expected = self.bw * now.saturating_duration_since(start).as_secs_f64();
        if self.agg_acked as f64 <= expected {
            self.agg_start = Some(now);
            self.agg_acked = 0;
            expected = 0.0;
        }
        self.agg_acked += bytes;
        let extra = self.agg_acked as f64 - expected;
        self.agg_max[1] = self.agg_max[1].max(extra);
    }

    /// A packet of `bytes` was acknowledged; `rtt` is this ACK's sample.
    pub fn on_ack(&mut self, now: Instant, bytes: u64, rtt: Duration) {
        let bucket = *self.bucket_start.get_or_insert(now);
        // While competing, the queue others keep never drains: the path RTT
        // stays what it was, or their queue would pass for the path.
        let competing = matches!(self.mode, Mode::Compete | Mode::Yield);
        if !competing && now.saturating_duration_since(bucket) >= MIN_RTT_WINDOW {
            // The bucket that ends becomes the previous one, and the path
            // RTT its minimum, unless that rose above the path RTT by no
            // more than the queue this window keeps standing by itself:
            // then the path is kept. With that queue in every sample (a
            // slow link's headroom is several datagrams, more than a drain
            // round takes off), the filter took it for the path every
            // 10-20 s, the window grew by it, and the queue with the window
            // (the simulator at 1 Mbit/s: 580 ms standing after 300 s; path
            // A at loss 0 in the lab: 348 ms on 100 x 1 MB). A path that
            // grew longer by more than that is taken at this rotation (10-20
            // s after the change); by less, never, and the headroom covers
            // it. Only on a slow link: elsewhere the round after a probe
            // takes off the whole headroom (5 ms) and the path is seen
            // again every cycle, and short paths empty their queue now and
            // then (a floor phase).
            let path = self.min_rtt();
            let next = self.min_cur.take();
            self.min_prev = match (path, next) {
                (Some(path), Some(n)) if n > path && n <= path + self.own_queue(path) => Some(path),
                _ => next,
            };
            self.bucket_start = Some(now);
        }
        self.min_cur = Some(self.min_cur.map_or(rtt, |m| m.min(rtt)));
        if self.floor_until.is_some_and(|t| now >= t) {
            self.floor_until = None;
        }
        self.round_min_rtt = Some(self.round_min_rtt.map_or(rtt, |m| m.min(rtt)));
        self.round_acked += bytes;
        // The send time; a sample older than the clock allows has none.
        let sent = now.checked_sub(rtt).unwrap_or(now);
        if !matches!(self.train, Train::Ready | Train::Done) {
            self.train_ack(now, sent, bytes, true);
        }
        // A hinted start cruises from its first ACK.
        if self.mode == Mode::Cruise && self.settled_since.is_none() {
            self.settled_since = Some(now);
        }
        // (Not in startup, whose estimate lags what it delivers by design:
        // on a LAN, whose startup keeps its first window of 240 kB, the
        // ACKs of rounds that read a few Mbit/s came as 20 ms of
        // "aggregation", and the headroom of it kept a standing queue.)
        if self.mode != Mode::Startup {
            self.aggregation(now, bytes);
        }
        // Not in `fair`: it takes its CUBIC window from the estimate startup
        // ends with, and the higher per-ACK one gave it 1.5-1.9 fair shares
        // beside 5 CUBIC flows in the simulation.
        if self.mode == Mode::Startup && !self.fair {
            self.sample_rate(now, sent, bytes, rtt);
        }
        if self.mode == Mode::Compete {
            let path = self.min_rtt().unwrap_or(rtt);
            self.cubic.on_ack(now, sent, bytes, path);
        }
        // The round under way: one that follows another begins at the ACK
        // that ended it; if no ACK came for a round's length after that
        // (the sender had nothing to send) it begins afresh at this one,
        // whose bytes were delivered before it and are left out of its
        // rate. (A pause within a round still reads low, as before: the
        // filter keeps the largest rate. ACK frames quinn handles at the
        // same instant as the one that ended a round count in the next,
        // whose send spacing keeps them from reading high; in `fair`,
        // which times rounds by the ACKs alone, they can, by their share
        // of a round.)
        let len = self.round_len();
        if self.round_acked == bytes
            && self
                .round_start
                .is_some_and(|s| now.saturating_duration_since(s) >= len)
        {
            self.round_start = None;
        }
        if self.round_start.is_none() {
            self.round_start = Some(now);
            self.round_sent = Some(sent);
            self.round_fresh = true;
        }
        if self.round_fresh && self.round_start == Some(now) {
            self.round_first += bytes;
            self.round_sent = self.round_sent.max(Some(sent));
        }
        self.last_ack = Some(match self.last_ack {
            Some((t, s)) if t == now => (now, s.max(sent)),
            _ => (now, sent),
        });
    }

    /// A round lasts one path RTT (at least 1 ms), and on a slow link at
    /// least [`SAMPLE_PACKETS`] datagrams' time: at 1 Mbit/s and 72 ms a
    /// round held six, and one more or less in it read as +-16 % of the
    /// rate. (The path RTT is known from the first ACK on: `on_ack` puts
    /// its sample into the filter before it asks.)
    fn round_len(&self) -> Duration {
        self.min_rtt()
            .unwrap_or_default()
            .max(Duration::from_millis(1))
            .max(self.packet_time() * SAMPLE_PACKETS as u32)
    }

    /// Every datagram the ACK that came at `now` covered has been counted
    /// (`on_ack`; quinn calls this before it declares losses): the round
    /// under way ends here if it has run its length, and the next begins
    /// at this ACK. Each round is then the bytes acknowledged after its
    /// first ACK up to and including its last, over the time between
    /// them, and all the datagrams one ACK covers (a receiver acknowledges
    /// every second one) fall in one round. Ended at the datagram that
    /// reached the length, before the rest of its ACK was counted, and
    /// begun with the next ACK, a round of n ACKs was read over n - 1
    /// spacings: 8/7 or 7/8 of a 1 Mbit/s link by how an ACK's datagrams
    /// fell (1.13-1.3 Mbit/s on path A at 10 % loss), and the filter's
    /// maximum kept the high ones, so the window held a datagram or two
    /// more than the BDP and its headroom.
    pub fn on_end_acks(&mut self, now: Instant) {
        let (Some(start), Some((last, last_sent))) = (self.round_start, self.last_ack) else {
            return;
        };
        if last != now {
            return;
        }
        let len = self.round_len();
        let acks = now.saturating_duration_since(start);
        if acks < len {
            return;
        }
        // Its rate is over the longer of the ACKs' and the packets' own
        // spacing, as the per-ACK samples': a round that began with ACKs
        // held back 75 ms read 140 Mbit/s of 80. (Not in `fair`, whose
        // CUBIC start is tuned with the rates as they were: beside 6
        // CUBIC flows it took 1.37 fair shares instead of 1.0-1.3.)
        let first_sent = self.round_sent.unwrap_or(last_sent);
        let sends = last_sent.saturating_duration_since(first_sent);
        let span = if self.fair { acks } else { acks.max(sends) };
        self.end_round(now, span);
        self.round_start = Some(now);
        self.round_sent = Some(last_sent);
    }

    /// Bytes in flight once an ACK has been counted (quinn's count, after
    /// [`Wan::on_end_acks`]). The probe cycle's drain round has done its
    /// work once the flight is down to its window, the BDP: what the probe
    /// queued has left the bottleneck, and the packets sent now see the
    /// path RTT. The rest of the round goes at gain 1, as BBRv2 leaves its
    /// ProbeBW DOWN phase: held at the BDP for the whole round, the flight
    /// left the link short by the ACKs' own delay (an ACK per sixteenth of
    /// the flight or per 2 ms, and the receiver's wake-up). Not startup's
    /// drain (a third of the BDP until the round ends: ended at the BDP,
    /// beside 6 CUBIC flows the default took 2.62 fair shares in the
    /// simulator, and whether others keep the queue shows only a round
    /// later), nor a drain for a queue seen outside the probe (2.08), nor
    /// in `fair` or a short path's floor phase.
    pub fn on_flight(&mut self, in_flight: u64) {
        if self.mode == Mode::Cruise
            && self.cycle == 1
            && !self.fair
            && self.gain < 1.0
            && self.floor_until.is_none()
            && in_flight <= self.window()
        {
            self.gain = 1.0;
        }
    }

    /// Startup: the delivery rate over the last quarter of the path RTT (at
    /// least [`SLIDE_MIN`]), once that much history is there and while the
    /// queue is empty, raises the estimate at once instead of at the round's
    /// end. `sent`: when the acknowledged packet left (`now` - `rtt`).
    fn sample_rate(&mut self, now: Instant, sent: Instant, bytes: u64, rtt: Duration) {
        self.delivered += bytes;
        let Some(path) = self.min_rtt() else {
            return;
        };
        let span = (path / 4).max(SLIDE_MIN);
        if self
            .deliveries
            .back()
            .is_none_or(|&(t, ..)| now.saturating_duration_since(t) >= span / 32)
        {
            self.deliveries.push_back((now, self.delivered, sent));
        }
        // Keep the newest entry at least one span old, and at least
        // SAMPLE_PACKETS datagrams back, as the reference: on a slow link a
        // span is two datagrams, and a receiver that acknowledges every
        // second one makes that twice the rate (1.4 Mbit/s on a 1 Mbit/s path).
        let least = SAMPLE_PACKETS * self.mtu;
        let delivered = self.delivered;
        while self.deliveries.get(1).is_some_and(|&(t, d, _)| {
            now.saturating_duration_since(t) >= span && delivered - d >= least
        }) {
            self.deliveries.pop_front();
        }
        let &(t0, d0, s0) = self.deliveries.front().expect("pushed above");
        if self.delivered - d0 < least {
            return;
        }
        let elapsed = now.saturating_duration_since(t0);
        // Only while this ACK saw no queue: a standing queue (the pipe is
        // full, or other senders keep it) makes the ACKs bunch, and beside 5-6
        // CUBIC flows in the lab these samples took `wan` to 2.1 fair shares.
        let queued = queued(rtt, path, self.packet_time());
        if elapsed >= span && !queued {
            // Over the longer of the ACKs' and the packets' own spacing (as
            // BBR's delivery rate): ACKs held back and then sent together
            // (the receiver not scheduled) read far above the link: 1,772
            // Mbit/s of 1 Gbit/s at 700 ms in the lab, a window of 2.7 BDP
            // and 23 MB lost.
            let elapsed = elapsed.max(sent.saturating_duration_since(s0));
            let rate = (self.delivered - d0) as f64 / elapsed.as_secs_f64();
            self.round_max_rate = self.round_max_rate.max(rate);
            self.bw = self.bw.max(rate);
            self.train_gain();
        }
    }

    /// `bytes` sent at `sent` were declared lost.
    pub fn on_loss(&mut self, now: Instant, sent: Instant, bytes: u64) {
        self.round_lost += bytes;
        if !matches!(self.train, Train::Ready | Train::Done) {
            self.train_ack(now, sent, bytes, false);
        }
        if self.settled_since.is_some_and(|t| sent >= t) {
            self.round_lost_settled += bytes;
        }
        if matches!(self.mode, Mode::Compete | Mode::Yield) && !self.queue_empty() {
            self.cubic.on_loss(now, sent, self.min_window() as f64);
        }
    }

    /// While competing: the queue was empty through this round and the last
    /// (their least RTT within [`EMPTY_MARGIN`] of the path's), so a loss now
    /// is the link's, not the queue's. Loss-based senders beside us keep a
    /// queue; alone, a CUBIC window fills one only above the BDP.
    fn queue_empty(&self) -> bool {
        let Some(path) = self.min_rtt() else {
            return false;
        };
        let margin = EMPTY_MARGIN.max(path / 40).max(self.packet_time() * 2);
        [self.round_min_rtt, self.prev_min_rtt]
            .iter()
            .all(|r| r.is_some_and(|r| r <= path + margin))
    }

    /// Other senders keep the queue standing: compete the way they do, from
    /// the window the model had.
    fn compete(&mut self, now: Instant) {
        // From the window of the round that ends (after startup, the drain's:
        // about a third of the BDP). Starting at gain 1 instead gave `fair`
        // 1.5-1.8 fair shares beside 5 CUBIC flows in the simulation, with the
        // β tuned for this start; both are to be tuned together.
        let mut c = Cubic::new(self.window() as f64);
        c.recovery = Some(now);
        self.cubic = c;
        self.mode = Mode::Compete;
        self.gain = 1.0;
        self.own_startup_queue = false;
        self.compete_since = Some(now);
        self.clear_rounds = 0;
    }

    /// Startup and its drain are over: cruise at the estimate (starting the
    /// probe cycle at gain 1, not with a probe).
    fn settle(&mut self, now: Instant) {
        self.queued_rounds = 0;
        self.settled_since = Some(now);
        self.mode = Mode::Cruise;
        self.cycle = 2;
        self.gain = 1.0;
    }

    /// Competition has gone: find the rate again, from the bandwidth measured.
    fn restart(&mut self, now: Instant) {
        self.settled_since = None;
        self.mode = Mode::Startup;
        self.gain = STARTUP_GAIN;
        self.train_cap = None;
        self.train_cap_max = None;
        self.own_startup_queue = false;
        self.full_bw = self.bw;
        self.full_bw_rounds = 0;
        self.last_round_bw = 0.0;
        self.queued_rounds = 0;
        self.last_overflow = None;
        self.bucket_start = Some(now);
    }

    /// Whether other senders share the bottleneck and fill its queue: it
    /// stood for [`COMPETE_AFTER`] rounds in a row although we drained it, or it
    /// overflowed twice within [`OVERFLOW_ROUNDS`] rounds outside our probes
    /// (alone, only a probe can fill it; random losses alone never count, as
    /// they come without a queue).
    /// `overflow`: this round began an overflow of the queue (it is
    /// congested, the last was not) with packets sent since the controller
    /// settled.
    fn competition(&mut self, now: Instant, path: Duration, overflow: bool) -> bool {
        if self.queued_rounds >= COMPETE_AFTER {
            return true;
        }
        if !overflow || self.cycle == 0 {
            return false;
        }
        let recent = self
            .last_overflow
            .is_some_and(|t| now.saturating_duration_since(t) <= path * OVERFLOW_ROUNDS);
        self.last_overflow = Some(now);
        recent
    }

    /// The window's share of `q` of the path RTT, at most a quarter.
    fn step(&self, q: Duration) -> f64 {
        let rtt = self.min_rtt().unwrap_or(Duration::from_millis(100));
        (q.as_secs_f64() / rtt.as_secs_f64().max(1e-3)).min(0.25)
    }

    /// Gain of round `i` of the probe cycle. The round after the probe
    /// takes the window back to the BDP without the headroom: the window,
    /// not the pacer, sets quinn's rate (it paces at 1.25 x window / RTT),
    /// so the sender pauses until what the probe queued has left the
    /// bottleneck, which stays busy meanwhile, and then keeps one BDP in
    /// flight: the queue empties and the path RTT is seen again, with no
    /// round below the link. A window a quarter under the BDP (as BBR's
    /// pacing drain) left the link a quarter idle for a round in every
    /// cycle (lab, 70 ms: 0.72-0.78 of the rate in the round after it).
    fn cycle_gain(&self, i: usize) -> f64 {
        match i {
            0 => 1.0 + self.step(PROBE_QUEUE),
            1 => 1.0 - self.step(HEADROOM),
            _ => 1.0,
        }
    }

    /// Gain of a round that drains a queue seen outside the probe (one our
    /// window did not build alone: an estimate above the path's rate).
    fn drain_gain(&self) -> f64 {
        1.0 - self.step(PROBE_QUEUE + HEADROOM)
    }

    fn end_round(&mut self, now: Instant, len: Duration) {
        let prev_bw = self.bw;
        // What was delivered after the round's first ACK, over the time
        // from it to the last (see `on_end_acks`).
        let rate =
            self.round_acked.saturating_sub(self.round_first) as f64 / len.as_secs_f64().max(1e-6);
        let path = self.min_rtt().unwrap_or(len);
        if self.floor_until.is_some() {
            // A floor round measures nothing but the path RTT.
            self.next_round();
            return;
        }
        let queued = self
            .round_min_rtt
            .is_some_and(|r| queued(r, path, self.packet_time()));
        let congested = queued && self.round_lost > 0;
        // A new overflow of packets sent since the controller settled: the
        // rounds of one overflow, or a startup's losses found late, are not
        // two overflows.
        let new_overflow = congested && self.overflow.is_none() && self.round_lost_settled > 0;
        // In startup the per-ACK samples count too (they are ahead of the
        // round's own), unless the queue overflowed: then only what arrived.
        let rate = if congested {
            rate
        } else {
            rate.max(self.round_max_rate)
        };
        let measured_before = self.bw_samples.iter().copied().fold(0.0, f64::max);
        self.bw_samples.push(rate);
        if self.bw_samples.len() > BW_ROUNDS {
            self.bw_samples.remove(0);
        }
        if congested {
            // The queue overflowed: the estimate falls to what was delivered,
            // but once per overflow (rounds congested one after another) and
            // to no less than OVERFLOW_BETA of what it was before it. The
            // rounds of an overflow deliver less than the path carries (the
            // burst's losses are repaired first, startup's drain sends at a
            // third): at 70 ms and 1e-2 with a one-BDP queue, startup's last
            // round lost a whole window and the next delivered 145-330
            // Mbit/s of a 1 Gbit/s path; taken as the estimate, probes needed
            // seconds to win the rate back (20,000 x 10 kB at 233-390 Mbit/s
            // in half the runs).
            // (Not from a train's jump: read high, it would stay as 0.7 of
            // itself.)
            let before = if self.jump.is_some() {
                measured_before
            } else {
                prev_bw
            };
            let (before, best) = self.overflow.get_or_insert((before, 0.0));
            *best = best.max(rate);
            let cut = best.max(OVERFLOW_BETA * *before);
            self.bw_samples.clear();
            self.bw_samples.push(cut);
            self.jump = None;
        } else {
            self.overflow = None;
        }
        self.bw = self.bw_samples.iter().copied().fold(0.0, f64::max);
        // A train's jump holds until the rounds after it have measured
        // what it sent.
        if let Some((jump, left)) = self.jump {
            self.bw = self.bw.max(jump);
            self.jump = (left > 1).then_some((jump, left - 1));
        }
        self.queued_rounds = if queued { self.queued_rounds + 1 } else { 0 };
        // Only losses of packets sent since the controller settled: a
        // startup's overflow is found lost in the drain and cruise rounds
        // after it, where no queue is left to tell it from random loss
        // (it read as 17 % on a 3 % path).
        if !queued && self.settled_since.is_some() {
            self.loss_rounds
                .push_back((self.round_acked, self.round_lost_settled));
            if self.loss_rounds.len() > BW_ROUNDS {
                self.loss_rounds.pop_front();
            }
        }
        let competing =
            self.mode == Mode::Cruise && !self.fair && self.competition(now, path, new_overflow);
        tracing::trace!(
            mode = ?self.mode,
            gain = self.gain,
            rate_mbps = rate * 8e-6,
            bw_mbps = self.bw * 8e-6,
            round_min_rtt_ms = self.round_min_rtt.map_or(0.0, |r| r.as_secs_f64() * 1e3),
            path_ms = path.as_secs_f64() * 1e3,
            lost = self.round_lost,
            window = self.window(),
            w_max = self.cubic.w_max as u64,
            queued,
            congested,
            "wan round"
        );
        match self.mode {
            Mode::Startup => {
                // Less than twice the last round's estimate, where the
                // window let it grow 2.89 times (2.5-2.7 measured): the
                // bottleneck is near; grow at 2 for the rest of startup
                // (a round held back by something else, the sender's data
                // or an ACK spike, costs the ramp a few tenths of a round
                // each round after; a return to 2.89 when a round at 2
                // still grew by half was tried: the round after the trigger
                // reads that much at the link too, and the overflow came
                // back). Not on paths under 4 x SLIDE_MIN, where the
                // per-ACK samples span most of a round and growth reads
                // about 2.1 anyway.
                if !self.fair && self.last_round_bw > 0.0 && path >= 4 * SLIDE_MIN {
                    let growth = self.bw / self.last_round_bw;
                    if growth < 2.0 {
                        self.gain = self.gain.min(STARTUP_FULL_GAIN);
                    }
                }
                self.last_round_bw = self.bw;
                if self.bw > self.full_bw * 1.25 {
                    self.full_bw = self.bw;
                    self.full_bw_rounds = 0;
                } else {
                    self.full_bw_rounds += 1;
                }
                // A queue standing while the rate no longer grows: the pipe
                // is full (as HyStart's delay rule). On a slow path with a
                // deep queue the rate stops growing in the second round and
                // three more at 2.885 fill 600 ms of queue before a loss.
                let full = queued && self.full_bw_rounds >= 1 && !self.fair;
                if self.full_bw_rounds >= 3 || congested || full {
                    self.deliveries.clear();
                    if self.alone() {
                        // A window of TRAIN_GAIN BDP queued at most
                        // (TRAIN_GAIN - 1) of one: the window of the BDP
                        // drains it (see TRAIN_ALONE).
                        self.settle(now);
                        self.own_queue_rounds = OWN_QUEUE_ROUNDS + 1;
                        self.own_startup_queue = true;
                    } else {
                        self.mode = Mode::Drain;
                        self.gain = DRAIN_GAIN;
                        self.own_queue_rounds = OWN_QUEUE_ROUNDS + 2;
                    }
                } else {
                    self.train_gain();
                }
            }
            Mode::Drain if self.fair => self.compete(now),
            Mode::Drain => self.settle(now),
            Mode::Compete => {
                // Look now and then whether the others have gone (never in
                // `fair`: it behaves as TCP does, whoever else is there).
                // Rounds without a queue say so at once; a queue that our own
                // window keeps needs a yield to tell.
                let since = self.compete_since.unwrap_or(now);
                let every = YIELD_EVERY.max(path * 4 * CYCLE_ROUNDS as u32);
                self.clear_rounds = if queued { 0 } else { self.clear_rounds + 1 };
                if !self.fair && self.clear_rounds >= CLEAR_ROUNDS {
                    self.restart(now);
                } else if !self.fair && now.saturating_duration_since(since) >= every {
                    self.mode = Mode::Yield;
                    self.yield_left = YIELD_ROUNDS;
                }
            }
            Mode::Yield => {
                if !queued {
                    // The queue emptied at half our window: nobody else keeps it.
                    self.restart(now);
                } else {
                    self.yield_left = self.yield_left.saturating_sub(1);
                    if self.yield_left == 0 {
                        self.mode = Mode::Compete;
                        self.compete_since = Some(now);
                    }
                }
            }
            Mode::Cruise if competing => self.compete(now),
            Mode::Cruise => {
                self.cycle = (self.cycle + 1) % CYCLE_ROUNDS;
                self.gain = self.cycle_gain(self.cycle);
                // A queue seen outside the probe: drain it next round. Not
                // in the first round after startup, whose window of the BDP
                // is draining startup's own queue (a startup that cruised
                // at once, `TRAIN_ALONE`): its least RTT still holds that
                // queue, and a drain round after it left the link idle for
                // a third of the next (70 ms: 553 Mbit/s, then 752).
                let own = std::mem::take(&mut self.own_startup_queue);
                if queued && self.cycle != 1 && !own {
                    self.drain_next = true;
                }
                if self.drain_next && self.gain >= 1.0 {
                    self.gain = self.drain_gain();
                    self.drain_next = false;
                }
                // On a short path the headroom is more queue than a drain
                // round removes (a quarter of the path RTT): now and then
                // send almost nothing until the queue is surely gone, so the
                // path RTT is measured again and the queue cannot ratchet.
                // The first one [`FLOOR_EVERY`] into cruise: startup measured
                // the path (its first rounds see no queue) and the path-RTT
                // filter keeps that for [`MIN_RTT_WINDOW`]; a floor at once
                // held the window at four datagrams for 20 ms right after
                // startup, a tenth of a LAN get of 2,000 files of 10 kB.
                let last = *self.last_floor.get_or_insert(now);
                if short_path(path) && now - last >= FLOOR_EVERY {
                    self.floor_until = Some(now + path * 2 + QUEUE_TARGET * 2);
                    self.last_floor = Some(now);
                }
            }
        }
        self.next_round();
    }

    /// The round's counters start afresh with the next ACK.
    fn next_round(&mut self) {
        self.rounds += 1;
        self.own_queue_rounds = self.own_queue_rounds.saturating_sub(1);
        self.round_lost_settled = 0;
        self.agg_rounds += 1;
        if self.agg_rounds >= BW_ROUNDS as u32 {
            self.agg_rounds = 0;
            self.agg_max = [self.agg_max[1], 0.0];
        }
        self.round_start = None;
        self.round_sent = None;
        self.round_acked = 0;
        self.round_first = 0;
        self.round_fresh = false;
        self.round_lost = 0;
        self.round_max_rate = 0.0;
        self.prev_min_rtt = self.round_min_rtt.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One ACK of `bytes` at `at`, as quinn reports it: the datagrams, then
    /// the end of the ACK.
    fn ack(w: &mut Wan, at: Instant, bytes: u64, rtt: Duration) {
        w.on_ack(at, bytes, rtt);
        w.on_end_acks(at);
    }

    #[test]
    fn a_hint_starts_at_its_rate_and_the_window_follows_the_bdp() {
        let w = Wan::new(1452, 800_000_000);
        assert_eq!(w.mode(), Mode::Cruise);
        assert_eq!(w.pacing_rate(), 800_000_000);
        // No RTT yet: 100 ms at the hint.
        assert_eq!(w.window(), 10_000_000);
        let t = Instant::now();
        let mut w = w;
        ack(&mut w, t, 1452, Duration::from_millis(700));
        // 100 MB/s x 0.7 s + 5 ms of headroom.
        assert_eq!(w.window(), 70_000_000 + 500_000);
        // Switched to after the handshake measured 700 ms (a server's
        // controller): the first round is a whole RTT at the hint, not 100 ms
        // (which held a fresh get's first round trip at 1/7 of the rate).
        let mut w = Wan::new(1452, 800_000_000);
        w.seed_rtt(Duration::from_millis(700));
        assert_eq!(w.window(), 70_000_000);
    }

    #[test]
    fn the_probe_drain_ends_once_the_flight_is_down_to_the_bdp() {
        let t = Instant::now();
        let mut w = Wan::new(1452, 800_000_000);
        ack(&mut w, t, 1452, Duration::from_millis(70));
        // The probe cycle's drain round: the window is the BDP.
        w.cycle = 1;
        w.gain = w.cycle_gain(1);
        assert!(w.gain < 1.0);
        let bdp = w.window();
        w.on_flight(bdp + 1452);
        assert!(w.gain < 1.0, "the probe's queue is still there");
        w.on_flight(bdp);
        assert_eq!(w.gain, 1.0, "down to the BDP: on at the estimate");
        // A drain for a queue seen outside the probe (others' perhaps)
        // runs its round, and so does `fair`'s.
        w.cycle = 3;
        w.gain = w.drain_gain();
        w.on_flight(0);
        assert!(w.gain < 1.0);
        let mut f = Wan::fair(1452);
        ack(&mut f, t, 1452, Duration::from_millis(70));
        f.mode = Mode::Cruise;
        f.cycle = 1;
        f.gain = f.cycle_gain(1);
        f.on_flight(0);
        assert!(f.gain < 1.0);
    }

    #[test]
    fn the_queue_of_startup_is_not_drained_twice() {
        // The first round after a startup that cruised at once still sees
        // that startup's queue (its window of the BDP is draining it): no
        // drain round after it. A queue seen a round later is drained.
        let t = Instant::now();
        let rtt = Duration::from_millis(70);
        let mut w = Wan::new(1452, 800_000_000);
        ack(&mut w, t, 1452, rtt);
        w.cycle = 2;
        w.own_startup_queue = true;
        w.round_min_rtt = Some(rtt + Duration::from_millis(40));
        w.end_round(t + rtt, rtt);
        assert_eq!((w.gain, w.drain_next), (1.0, false));
        w.round_min_rtt = Some(rtt + Duration::from_millis(40));
        w.end_round(t + rtt * 2, rtt);
        assert_eq!(w.gain, w.drain_gain(), "a queue that stays: drained");
    }

    #[test]
    fn the_pacer_spreads_the_window_over_the_path_rtt_not_over_a_queue() {
        // Cruising at 800 Mbit/s on a 700 ms path; a queue then stands 250
        // ms (a startup's end): quinn's smoothed RTT would say 950 ms and
        // pace a window of the BDP at 0.74 of the rate, while the window is
        // of the path's 700 ms.
        let t = Instant::now();
        let mut w = Wan::new(1452, 800_000_000);
        assert_eq!(w.pacing_rtt(), None, "no RTT yet: quinn's own");
        ack(&mut w, t, 1452, Duration::from_millis(700));
        ack(
            &mut w,
            t + Duration::from_millis(10),
            1452,
            Duration::from_millis(950),
        );
        assert_eq!(w.pacing_rtt(), None, "no startup of its own: quinn's");
        w.own_queue_rounds = OWN_QUEUE_ROUNDS;
        assert_eq!(w.pacing_rtt(), Some(Duration::from_millis(700)));
        w.next_round();
        assert_eq!(w.pacing_rtt(), Some(Duration::from_millis(700)));
        w.next_round();
        assert_eq!(w.pacing_rtt(), None, "two rounds on: the queue is gone");
        w.own_queue_rounds = OWN_QUEUE_ROUNDS;
        // Where the window is CUBIC's, a standing queue is part of its
        // round trip: the smoothed RTT.
        w.mode = Mode::Compete;
        assert_eq!(w.pacing_rtt(), None);
        w.mode = Mode::Yield;
        assert_eq!(w.pacing_rtt(), None);
        let mut f = Wan::fair(1452);
        ack(&mut f, t, 1452, Duration::from_millis(700));
        assert_eq!(f.pacing_rtt(), None);
    }

    #[test]
    fn the_window_always_holds_a_few_datagrams_of_the_current_size() {
        // A tiny path (loopback: 100 µs, a slow hint) after MTU discovery grew
        // datagrams from 1200 to 6500 bytes: below one datagram it would stall.
        // (At 1 kbit/s the link is slow: its headroom of five datagrams is
        // the window, above the floor of four. A window under four
        // datagrams, here a competing CUBIC window of 100 bytes, is held
        // at the floor.)
        let mut w = Wan::new(1200, 1000);
        ack(&mut w, Instant::now(), 1200, Duration::from_micros(100));
        assert_eq!(w.window(), SLOW_HEADROOM_PACKETS * 1200);
        w.set_mtu(6500);
        assert_eq!(w.window(), SLOW_HEADROOM_PACKETS * 6500);
        w.mode = Mode::Compete;
        w.cubic.cwnd = 100.0;
        assert_eq!(w.window(), 4 * 6500);
        w.set_mtu(1200);
        assert_eq!(w.window(), 4 * 1200);
    }

    #[test]
    fn a_lan_starts_with_a_larger_window_that_startup_keeps() {
        let t = Instant::now();
        // Handshake RTTs of 0.4 ms (a LAN), 10 ms and 290 ms (no LAN).
        for (rtt_us, first) in [
            (400, INITIAL_WINDOW),
            (10_000, FIRST_FLIGHT_MIN * 1452),
            (290_000, 54_374), // 1.5 Mbit/s over 290 ms
        ] {
            let mut w = Wan::new(1452, 0);
            w.seed_rtt(Duration::from_micros(rtt_us));
            assert_eq!(w.first_flight(), first, "{rtt_us} us");
            assert_eq!(w.window(), first, "{rtt_us} us");
        }
        // First rounds that read the sender's first reads (7 Mbit/s: 4.4
        // kB every 5 ms): the LAN's startup keeps its first window, a
        // longer path's grows from what it read.
        let mut lan = Wan::new(1452, 0);
        lan.seed_rtt(Duration::from_micros(400));
        let mut metro = Wan::new(1452, 0);
        metro.seed_rtt(Duration::from_millis(10));
        for w in [&mut lan, &mut metro] {
            let rtt = w.known_rtt().unwrap();
            for k in 0..8u64 {
                ack(w, t + Duration::from_millis(5 * k), 4400, rtt);
            }
            assert_eq!(w.mode(), Mode::Startup);
            assert!(w.bandwidth() < 10_000_000, "{}", w.bandwidth());
        }
        assert_eq!(lan.window(), INITIAL_WINDOW);
        assert!(
            metro.window() < FIRST_FLIGHT_MIN * 1452,
            "{}",
            metro.window()
        );
        // Nor do those ACKs, far above what startup estimated, count as ACK
        // aggregation: the headroom after startup is its least.
        assert_eq!(lan.agg_max, [0.0; 2]);
    }

    #[test]
    fn a_short_path_keeps_the_headroom_for_late_acks() {
        // Loopback or a LAN: 100 µs RTT, 8 Gbit/s. The BDP is 100 kB, but ACKs
        // wait for the receiver's process; without 5 ms of headroom the window
        // starved (half bbr's rate on loopback).
        let mut w = Wan::new(6500, 8_000_000_000);
        ack(&mut w, Instant::now(), 6500, Duration::from_micros(100));
        assert_eq!(w.window(), 100_000 + 5_000_000);
    }

    #[test]
    fn a_slow_link_keeps_five_datagrams_beyond_its_bdp_a_faster_one_three() {
        // Hinted 1, 5 and 10 Mbit/s on a 70 ms path with 1452-byte
        // datagrams: under 6 Mbit/s the least headroom is five datagrams
        // (11.6 ms at 5 Mbit/s, more than 5 ms of data); at 10 Mbit/s it
        // is three, and 5 ms of data (4.3 datagrams) is more.
        for (bps, least) in [(1_000_000u64, 5.0), (5_000_000, 5.0), (10_000_000, 4.3)] {
            let mut w = Wan::new(1452, bps);
            ack(&mut w, Instant::now(), 1452, Duration::from_millis(70));
            let bdp = bps as f64 / 8.0 * 0.07;
            let head = (w.window() as f64 - bdp) / 1452.0;
            assert!(
                (head - least).abs() < 0.05,
                "{bps} bit/s: {head:.2} datagrams beyond the BDP, expected {least}"
            );
        }
    }

    #[test]
    fn a_short_path_makes_room_for_the_ack_bursts_it_measured_a_long_one_does_not() {
        // 1 Gbit/s hinted. ACKs come in bursts: nothing for 10 ms, then 10 ms
        // worth (1.25 MB) at once, as from a receiver that was not scheduled.
        for (rtt, head_ms) in [
            (Duration::from_micros(200), 10.0),
            (Duration::from_millis(70), 5.0),
        ] {
            let mut w = Wan::new(1452, 1_000_000_000);
            let mut t = Instant::now();
            for _ in 0..20 {
                t += Duration::from_millis(10);
                for _ in 0..10 {
                    ack(&mut w, t, 125_000, rtt);
                }
            }
            let bw = w.bandwidth() as f64 / 8.0;
            let head = (w.window() as f64 - bw * rtt.as_secs_f64()) / bw * 1e3;
            assert!(
                (head - head_ms).abs() < 0.5,
                "{rtt:?}: {head:.2} ms of headroom, expected {head_ms}"
            );
        }
    }

    /// A cold controller after a handshake of `rtt`, its first flight out:
    /// one datagram of reply, 3 ms later the train in batches of ten
    /// 1200-byte datagrams. Returns the train's send time.
    fn train_sent(w: &mut Wan, t: &mut Instant, rtt: Duration) -> Instant {
        w.seed_rtt(rtt);
        w.on_sent(*t, 1200);
        assert!(!w.unpaced(), "a lone datagram starts no train");
        *t += Duration::from_millis(3);
        let start = *t;
        for batch in 0..3 {
            w.on_sent(*t, 12_000);
            assert_eq!(w.unpaced(), batch < 2, "after batch {batch}");
            *t += Duration::from_micros(20);
        }
        start
    }

    /// A fresh cold controller whose first train (see `train_sent`) is out,
    /// and the train's send time.
    fn cold_train(rtt: Duration) -> (Wan, Instant) {
        let mut w = Wan::new(1200, 0);
        let sent = train_sent(&mut w, &mut Instant::now(), rtt);
        (w, sent)
    }

    /// A second train from `t` in batches of ten 1200-byte datagrams, 20 µs
    /// apart: the batches it took.
    fn train_again(w: &mut Wan, mut t: Instant) -> u32 {
        let mut batches = 0;
        loop {
            w.on_sent(t, 12_000);
            batches += 1;
            if !w.unpaced() || batches > 100 {
                return batches;
            }
            t += Duration::from_micros(20);
        }
    }

    /// ACKs of the train sent at `sent`: two datagrams each, spaced as a
    /// bottleneck of `mbps` delivers them (all at once if 0).
    fn train_acked(w: &mut Wan, sent: Instant, rtt: Duration, mbps: u64) -> Instant {
        train_acked_n(w, sent, rtt, mbps, 30)
    }

    /// ... of a train of `n` datagrams.
    fn train_acked_n(w: &mut Wan, sent: Instant, rtt: Duration, mbps: u64, n: u32) -> Instant {
        let gap = Duration::from_secs_f64(if mbps == 0 {
            0.0
        } else {
            2400.0 * 8.0 / (mbps as f64 * 1e6)
        });
        let mut at = sent + rtt;
        for _ in 0..n / 2 {
            w.on_ack(at, 1200, at - sent);
            ack(w, at, 1200, at - sent);
            at += gap;
        }
        at
    }

    /// ACKs of the train sent at `sent` at two times: its first 20
    /// datagrams one RTT later, the last 10 `gap` after them.
    fn train_acked_twice(w: &mut Wan, sent: Instant, rtt: Duration, gap: Duration) {
        let first = sent + rtt;
        for i in 0..30 {
            let at = if i < 20 { first } else { first + gap };
            w.on_ack(at, 1200, at - sent);
            if i == 19 || i == 29 {
                w.on_end_acks(at);
            }
        }
    }

    #[test]
    fn a_train_reads_the_bottleneck_and_startup_jumps_to_two_thirds_of_it_at_one_and_a_half() {
        for mbps in [50u64, 1000] {
            let rtt = Duration::from_millis(700);
            let (mut w, sent) = cold_train(rtt);
            assert_eq!(w.bandwidth(), 0);
            let first = w.window();
            train_acked(&mut w, sent, rtt, mbps);
            // 28 datagrams after the first ACK over 14 gaps: the link's rate
            // exactly; the estimate is two thirds of it, at gain 1.5.
            let bw = w.bandwidth() as f64 / 1e6;
            assert!(
                (bw - mbps as f64 * 2.0 / 3.0).abs() < mbps as f64 * 0.01,
                "{mbps} Mbit/s link: estimate {bw:.1}"
            );
            assert_eq!(w.mode(), Mode::Startup);
            assert_eq!(w.gain(), TRAIN_GAIN);
            // The window: about the link's BDP (and the headroom).
            let bdp = mbps as f64 * 1e6 / 8.0 * 0.7;
            let win = w.window() as f64;
            assert!(
                win > first as f64 && (win / bdp - 1.0).abs() < 0.03,
                "{mbps} Mbit/s: window {win} for a BDP of {bdp}"
            );
        }
    }

    #[test]
    fn no_train_with_a_hint_in_fair_or_on_a_short_path() {
        let t = Instant::now();
        let cases = [
            ("hint", Wan::new(1200, 100_000_000), 700),
            ("fair", Wan::fair(1200), 700),
            ("5 ms", Wan::new(1200, 0), 5),
        ];
        for (what, mut w, ms) in cases {
            w.seed_rtt(Duration::from_millis(ms));
            w.on_sent(t, 12_000);
            assert!(!w.unpaced(), "{what}: a train");
        }
        // Nor before an RTT is known (the handshake's own packets).
        let mut w = Wan::new(1200, 0);
        w.on_sent(t, 12_000);
        assert!(!w.unpaced(), "a train before any RTT");
    }

    #[test]
    fn a_train_whose_acks_come_at_once_is_sent_again_once_and_too_few_acks_give_no_jump() {
        let rtt = Duration::from_millis(70);
        // All ACKs at one instant (a receiver that slept through the
        // train): no span, but the path carried its 36 kB within the 2.88
        // ms the ACK came after the handshake's RTT: at least 100 Mbit/s,
        // and startup jumps to two thirds of that meanwhile.
        let (mut w, sent) = cold_train(rtt);
        let wire = Duration::from_micros(2880);
        for _ in 0..15 {
            w.on_ack(sent + rtt + wire, 2400, rtt + wire);
        }
        w.on_end_acks(sent + rtt + wire);
        let bw = w.bandwidth() as f64 / 1e6;
        assert!((bw - 66.7).abs() < 1.0, "{bw}");
        // The next flight is a train again, six times as long (a quarter
        // of the floor's BDP: 219 kB); its reading can only raise the jump.
        let again = sent + rtt + Duration::from_millis(4);
        assert_eq!(train_again(&mut w, again), 18);
        train_acked_n(&mut w, again, rtt, 100, 180);
        let bw = w.bandwidth() as f64 / 1e6;
        assert!((bw - 66.7).abs() < 1.0, "{bw}");
        // At once one RTT after it went out: a fast path, read as no faster
        // than the train over 1 ms (288 Mbit/s); the second train reads
        // the path.
        let (mut w, sent) = cold_train(rtt);
        train_acked(&mut w, sent, rtt, 0);
        let bw = w.bandwidth() as f64 / 1e6;
        assert!((bw - 192.0).abs() < 1.0, "{bw}");
        // Sixteen times as long (a quarter of the floor's BDP is 630 kB,
        // over the most): 576 kB, five times the link's millisecond.
        let again = sent + rtt + Duration::from_millis(1);
        assert_eq!(train_again(&mut w, again), 48);
        train_acked_n(&mut w, again, rtt, 1000, 480);
        let bw = w.bandwidth() as f64 / 1e6;
        assert!((bw - 666.7).abs() < 7.0, "{bw}");
        // 20 datagrams in one ACK and 10 in the next 59 µs later: too close
        // to read, a fast path too (the floor's jump); a second train.
        let (mut w, sent) = cold_train(rtt);
        train_acked_twice(&mut w, sent, rtt, Duration::from_micros(59));
        assert_eq!(w.bandwidth(), 192_000_000);
        let again = sent + rtt + Duration::from_millis(1);
        assert_eq!(train_again(&mut w, again), 48);
        // A train the sender let out over 0.9 ms (three batches 450 µs
        // apart) whose ACKs spread no further: it read the sender's pace
        // (about 300 Mbit/s), a floor; startup jumps on it, and the next
        // flight is a train again.
        let mut w = Wan::new(1200, 0);
        w.seed_rtt(rtt);
        let sent = Instant::now();
        for batch in 0..3 {
            w.on_sent(sent + Duration::from_micros(450) * batch, 12_000);
        }
        let gap = Duration::from_micros(950) / 14;
        let mut at = sent + rtt;
        for _ in 0..15 {
            ack(&mut w, at, 2400, at - sent);
            at += gap;
        }
        let bw = w.bandwidth() as f64 / 1e6;
        assert!((150.0..250.0).contains(&bw), "{bw}");
        assert_eq!(train_again(&mut w, at + Duration::from_millis(1)), 48);
        // 20 datagrams in one ACK and 10 in the next 300 µs later: one
        // interval, read (320 Mbit/s), and a second train may read more.
        let (mut w, sent) = cold_train(rtt);
        train_acked_twice(&mut w, sent, rtt, Duration::from_micros(300));
        let bw = w.bandwidth() as f64 / 1e6;
        assert!((bw - 213.3).abs() < 1.0, "{bw}");
        let again = sent + rtt + Duration::from_millis(1);
        assert_eq!(train_again(&mut w, again), 48);
        // Two that cannot be read: no third (and the floor of the longer,
        // of no more than four times the first's bytes).
        let (mut w, sent) = cold_train(rtt);
        train_acked(&mut w, sent, rtt, 0);
        let again = sent + rtt + Duration::from_millis(1);
        assert_eq!(train_again(&mut w, again), 48);
        train_acked_n(&mut w, again, rtt, 0, 480);
        w.on_sent(again + rtt * 2, 12_000);
        assert!(!w.unpaced(), "a third train");
        let bw = w.bandwidth() as f64 / 1e6;
        assert!((bw - 768.0).abs() < 8.0, "{bw}");
        // Cut short: the sender had one batch of data, then nothing for 3 ms.
        let mut w = Wan::new(1200, 0);
        w.seed_rtt(rtt);
        let sent = Instant::now();
        w.on_sent(sent, 6_000);
        assert!(w.unpaced());
        w.on_sent(sent + Duration::from_millis(3), 1200);
        assert!(!w.unpaced(), "the train ends at a pause");
        let mut at = sent + rtt;
        for _ in 0..5 {
            ack(&mut w, at, 1200, at - sent);
            at += Duration::from_micros(100);
        }
        // Four datagrams after the first ACK: too few to read a rate.
        ack(&mut w, at, 1200, rtt);
        assert!(w.bandwidth() < 1_000_000, "{} bit/s", w.bandwidth());
    }

    #[test]
    fn a_second_train_is_a_quarter_of_the_first_ones_bdp_between_four_and_sixteen_times_it() {
        // After a floor of 288 Mbit/s (36 kB at once): a quarter of its BDP
        // over 15 ms is 135 kB, under four first trains (144 kB: 12
        // batches); over 20 ms five (180 kB), over 40 ms ten (360 kB); over
        // 70 ms and more, sixteen (576 kB, 48 batches).
        for (ms, batches) in [(15, 12), (20, 15), (40, 30), (70, 48), (700, 48)] {
            let rtt = Duration::from_millis(ms);
            let (mut w, sent) = cold_train(rtt);
            train_acked(&mut w, sent, rtt, 0);
            let again = sent + rtt + Duration::from_millis(1);
            assert_eq!(train_again(&mut w, again), batches, "{ms} ms");
        }
        // A first train that read 50 Mbit/s is no fast path: no second.
        let rtt = Duration::from_millis(700);
        let (mut w, sent) = cold_train(rtt);
        train_acked(&mut w, sent, rtt, 50);
        assert!(!w.unpaced());
        w.on_sent(sent + rtt + Duration::from_millis(1), 12_000);
        assert!(!w.unpaced(), "a second train after a reading");
    }

    #[test]
    fn acks_of_the_first_flight_do_not_cut_a_second_train_its_own_do() {
        let rtt = Duration::from_millis(700);
        let (mut w, sent) = cold_train(rtt);
        train_acked(&mut w, sent, rtt, 0);
        // The second train goes out while the ACKs of the first flight's
        // paced rest (sent from 2 ms after the first train) come in.
        let again = sent + rtt + Duration::from_millis(1);
        let mut t = again;
        let mut batches = 0;
        while batches == 0 || (w.unpaced() && batches <= 100) {
            w.on_sent(t, 12_000);
            batches += 1;
            let of = sent + Duration::from_millis(2) + Duration::from_micros(batches * 10);
            let at = t + Duration::from_micros(5);
            ack(&mut w, at, 1200, at - of);
            t += Duration::from_micros(20);
        }
        assert_eq!(batches, 48, "the second train's batches");
        // An ACK of the train's own datagrams while it goes out ends it (the
        // sender had nothing more for a round trip).
        let (mut w, sent) = cold_train(rtt);
        train_acked(&mut w, sent, rtt, 0);
        let again = sent + rtt + Duration::from_millis(1);
        w.on_sent(again, 12_000);
        assert!(w.unpaced());
        let at = again + Duration::from_micros(50);
        ack(&mut w, at, 1200, at - again);
        assert!(!w.unpaced(), "an ACK of the train itself ends it");
    }

    #[test]
    fn a_jump_the_path_does_not_deliver_leaves_the_estimate_after_two_rounds() {
        let rtt = Duration::from_millis(100);
        let (mut w, sent) = cold_train(rtt);
        // The train read 1 Gbit/s (ACKs bunched), the path gives 100 Mbit/s.
        let mut t = train_acked(&mut w, sent, rtt, 1000);
        assert!((w.bandwidth() as f64 / 1e6 - 666.7).abs() < 5.0);
        let mut bws = Vec::new();
        for _ in 0..3 {
            bws.push(round(&mut w, &mut t, 100, Duration::ZERO, 0));
        }
        // The round under way and the next keep it; then what was delivered
        // (100 Mbit/s, and the per-ACK samples a little over it).
        assert!(bws[0] >= 666.0 && bws[1] >= 666.0, "{bws:?}");
        assert!((99.0..=115.0).contains(&bws[2]), "{bws:?}");
        // A jump the queue overflows under is cut from what was measured,
        // not to 0.7 of itself (350 Mbit/s on a 100 Mbit/s path).
        let (mut w, sent) = cold_train(rtt);
        let mut t = train_acked(&mut w, sent, rtt, 1000);
        let q = Duration::from_millis(40);
        let cut: Vec<f64> = (0..2)
            .map(|_| round(&mut w, &mut t, 100, q, 10_000))
            .collect();
        assert!(cut[1] < 120.0, "overflow after the jump: {cut:?} Mbit/s");
    }

    #[test]
    fn after_a_trains_jump_startup_grows_at_one_and_a_half() {
        let rtt = Duration::from_millis(100);
        // The train read twice the link (its ACKs bunched): the jump paces
        // at what it read, at 1.5, and the rounds deliver the link.
        let (mut w, sent) = cold_train(rtt);
        let mut t = train_acked(&mut w, sent, rtt, 2000);
        for _ in 0..2 {
            assert_eq!((w.mode(), w.gain()), (Mode::Startup, TRAIN_GAIN));
            // A window of 1.5 times the estimate's BDP (and the headroom).
            let bdp = w.bandwidth() as f64 / 8.0 * 0.1;
            assert!(w.window() as f64 <= 1.56 * bdp, "{}", w.window());
            round(&mut w, &mut t, 1000, Duration::ZERO, 0);
        }
        assert_eq!((w.mode(), w.gain()), (Mode::Startup, TRAIN_GAIN));
        // The train read a fifth of the link: at three times its reading
        // startup grows at 2 again.
        let (mut w, sent) = cold_train(rtt);
        let mut t = train_acked(&mut w, sent, rtt, 200);
        round(&mut w, &mut t, 200, Duration::ZERO, 0);
        round(&mut w, &mut t, 300, Duration::ZERO, 0);
        assert_eq!(w.gain(), TRAIN_GAIN);
        round(&mut w, &mut t, 650, Duration::ZERO, 0);
        assert_eq!((w.mode(), w.gain()), (Mode::Startup, STARTUP_FULL_GAIN));
    }

    #[test]
    fn a_startup_that_got_what_the_train_read_cruises_at_once_others_drain_as_usual() {
        let rtt = Duration::from_millis(100);
        let q = Duration::from_millis(40);
        // Read 2 Gbit/s (bunched) or 1 (right), delivered 1: alone, the
        // second; the first cannot tell 1 Gbit/s from others taking half.
        let expect = [(1000, Mode::Cruise, 1.0), (2000, Mode::Drain, DRAIN_GAIN)];
        for (read, mode, gain) in expect {
            let (mut w, sent) = cold_train(rtt);
            let mut t = train_acked(&mut w, sent, rtt, read);
            // Two rounds without a queue, then a queue stands: startup ends.
            let mut rounds = 0;
            while w.mode() == Mode::Startup && rounds < 6 {
                let queue = if rounds < 2 { Duration::ZERO } else { q };
                round(&mut w, &mut t, 1000, queue, 0);
                rounds += 1;
            }
            assert_eq!((w.mode(), w.gain()), (mode, gain), "read {read}");
            // Cruising, the window of the BDP (and the headroom) drains the
            // queue startup's 1.5 BDP built.
            let bdp = w.bandwidth() as f64 / 8.0 * 0.1;
            let most = if mode == Mode::Cruise {
                1.06
            } else {
                DRAIN_GAIN + 0.06
            };
            assert!(
                w.window() as f64 <= most * bdp,
                "read {read}: {}",
                w.window()
            );
        }
    }

    #[test]
    fn startups_end_is_judged_against_either_reading_and_a_floor_gives_way() {
        let gbit = |g: f64| g * 125e6;
        // Two readings, 1.9 and 1.1 Gbit/s of a 1 Gbit/s link: the jump is
        // the higher's, and a startup that ends at the link had it to
        // itself (by the lower).
        let mut w = Wan::new(1200, 0);
        w.train_jump(gbit(1.9), false);
        w.train_jump(gbit(1.1), false);
        assert_eq!(w.train_cap, Some(gbit(1.1)));
        assert!((w.bw - TRAIN_SHARE * gbit(1.9)).abs() < 1.0);
        w.bw = gbit(0.95);
        assert!(w.alone());
        // 0.3 and 1.0 (the first train's receiver was busy): alone by the
        // higher; by 0.3 alone, the estimate is too far above it to judge.
        let mut w = Wan::new(1200, 0);
        w.train_jump(gbit(0.3), false);
        w.train_jump(gbit(1.0), false);
        assert_eq!(
            (w.train_cap, w.train_cap_max),
            (Some(gbit(0.3)), Some(gbit(1.0)))
        );
        w.bw = gbit(0.95);
        assert!(w.alone());
        w.train_cap_max = None;
        assert!(!w.alone());
        // Startup ends where neither reading says alone: too far above
        // 0.3, under three quarters of 1.0.
        w.train_cap_max = Some(gbit(1.0));
        w.bw = gbit(0.65);
        assert!(!w.alone());
        // Joining a full link: the higher reading is its capacity, startup
        // ends at its share, half; near 0.3 but not within a third of it.
        w.bw = gbit(0.5);
        assert!(!w.alone());
        // Lower first, higher second: the same judge, the higher jump.
        let mut w = Wan::new(1200, 0);
        w.train_jump(gbit(1.1), false);
        w.train_jump(gbit(1.9), false);
        assert_eq!(w.train_cap, Some(gbit(1.1)));
        assert!((w.bw - TRAIN_SHARE * gbit(1.9)).abs() < 1.0);
        // A floor (ACKs at once) gives way to a reading, even a lower one
        // (it jumps no further), and never lowers one.
        let mut w = Wan::new(1200, 0);
        w.train_jump(gbit(0.6), true);
        assert_eq!((w.train_cap, w.cap_floor), (Some(gbit(0.6)), true));
        w.train_jump(gbit(0.5), false);
        assert_eq!((w.train_cap, w.cap_floor), (Some(gbit(0.5)), false));
        assert!((w.bw - TRAIN_SHARE * gbit(0.6)).abs() < 1.0);
        w.train_jump(gbit(0.1), true);
        assert_eq!(w.train_cap, Some(gbit(0.5)));
    }

    #[test]
    fn acks_held_back_and_sent_together_do_not_read_above_the_rate_sent() {
        // Startup, 80 Mbit/s delivered (a datagram every 120 µs), 100 ms
        // path; the receiver holds its ACKs for 75 ms once, then sends them
        // together.
        let mut w = Wan::new(1200, 0);
        let rtt = Duration::from_millis(100);
        let gap = Duration::from_micros(120);
        let start = Instant::now();
        let (stall, resume) = (Duration::from_millis(300), Duration::from_millis(375));
        for i in 0..5000u32 {
            let sent = start + gap * i;
            let arrives = sent + rtt;
            let since = arrives - start;
            let at = if since >= stall && since < resume {
                start + resume
            } else {
                arrives
            };
            ack(&mut w, at, 1200, at - sent);
        }
        let bw = w.bandwidth() as f64 / 1e6;
        assert!(bw <= 85.0, "estimate {bw:.0} Mbit/s for 80 sent");
    }

    /// One round of 100 ms (the path RTT): `mbps` delivered in ACKs every
    /// 100 µs, each seeing `queue` above the path RTT, and with `loss`
    /// bytes declared lost per ACK. Returns the estimate after the ACK that
    /// closes it, in Mbit/s.
    fn round(w: &mut Wan, t: &mut Instant, mbps: u64, queue: Duration, loss: u64) -> f64 {
        let rtt = Duration::from_millis(100);
        let bytes = mbps * 1_000_000 / 8 / 10_000;
        let before = w.rounds;
        // (Until the round has run its 100 ms: 1,000 ACKs, and one more
        // for the first, which begins at its first ACK.)
        for i in 0.. {
            if w.rounds != before {
                break;
            }
            assert!(i <= 1001, "no round ended after {i} ACKs over 100 ms");
            *t += Duration::from_micros(100);
            if loss > 0 {
                w.on_loss(*t, *t, loss);
            }
            ack(w, *t, bytes, rtt + queue);
        }
        w.bandwidth() as f64 / 1e6
    }

    /// ACKs of two `bytes`-byte datagrams each, spaced as a link of `bps`
    /// delivers them, from `t` for `secs`, each pair's second datagram
    /// `rtt` after it was sent (the first waited a datagram's time more).
    fn pairs(w: &mut Wan, t: &mut Instant, bps: f64, bytes: u64, rtt: Duration, secs: f64) {
        let one = Duration::from_secs_f64(bytes as f64 * 8.0 / bps);
        let end = *t + Duration::from_secs_f64(secs);
        while *t < end {
            *t += one * 2;
            w.on_ack(*t, bytes, rtt + one);
            w.on_ack(*t, bytes, rtt);
            w.on_end_acks(*t);
        }
    }

    #[test]
    fn a_round_reads_the_link_whatever_its_acks_cover() {
        // 1 Mbit/s at 72 ms, an ACK for every second 1452-byte datagram: a
        // round is eight datagrams or so. Ended at the datagram that
        // reached its length and begun with the next ACK, rounds read 8/7
        // or 7/8 of the link by how an ACK's datagrams fell, and the
        // filter kept the high ones. (A hint of half the link: the
        // estimate is what the rounds read.)
        let mut w = Wan::new(1452, 500_000);
        let mut t = Instant::now();
        pairs(&mut w, &mut t, 1e6, 1452, Duration::from_millis(72), 5.0);
        let bw = w.bandwidth() as f64;
        assert!(
            (bw - 1e6).abs() < 0.005e6,
            "{:.4} Mbit/s read on a 1 Mbit/s link",
            bw / 1e6
        );
    }

    #[test]
    fn on_a_slow_link_the_path_rtt_keeps_its_own_queue_out() {
        // 1 Mbit/s, 72 ms: five datagrams of headroom are 58 ms. A standing
        // queue of 40 ms (the window's own) never becomes the path RTT; a
        // path 80 ms longer does, once the filter's buckets turn (10-20 s).
        // At 100 Mbit/s, where the round after a probe takes the whole
        // headroom off, 8 ms more is taken as it always was. (Rises under
        // what a round reads as a queue, 93 and 10 ms: a queue that stands
        // round after round is taken for other senders.)
        let path = Duration::from_millis(72);
        let ms = Duration::from_millis;
        let mut w = Wan::new(1452, 1_000_000);
        let mut t = Instant::now();
        pairs(&mut w, &mut t, 1e6, 1452, path, 5.0);
        assert_eq!(w.min_rtt(), Some(path));
        pairs(&mut w, &mut t, 1e6, 1452, path + ms(40), 30.0);
        assert_eq!(w.min_rtt(), Some(path), "40 ms of the window's own queue");
        pairs(&mut w, &mut t, 1e6, 1452, path + ms(80), 25.0);
        assert_eq!(w.min_rtt(), Some(path + ms(80)), "a path 80 ms longer");
        assert_eq!(w.mode(), Mode::Cruise);

        let mut w = Wan::new(1452, 100_000_000);
        let mut t = Instant::now();
        pairs(&mut w, &mut t, 100e6, 145_200, path, 5.0);
        pairs(&mut w, &mut t, 100e6, 145_200, path + ms(8), 25.0);
        assert_eq!(w.min_rtt(), Some(path + ms(8)), "100 Mbit/s, 8 ms longer");
        assert_eq!(w.mode(), Mode::Cruise);
    }

    #[test]
    fn losses_without_a_queue_keep_the_rate_losses_with_one_cut_it() {
        for (queue, cut) in [(Duration::ZERO, false), (Duration::from_millis(40), true)] {
            let mut w = Wan::new(1452, 1_000_000_000);
            let mut t = Instant::now();
            // 1 Gbit/s delivered at the path RTT, then 500 Mbit/s with
            // losses, at the path RTT or 40 ms above it.
            round(&mut w, &mut t, 1000, Duration::ZERO, 0);
            let bw = round(&mut w, &mut t, 500, queue, 100);
            if cut {
                // To what was delivered, but not below 0.7 of the estimate.
                assert!((bw - 700.0).abs() < 7.0, "congested loss: {bw} Mbit/s");
            } else {
                assert!(bw >= 1000.0, "random loss cut the rate to {bw} Mbit/s");
            }
        }
    }

    #[test]
    fn an_overflow_cuts_the_estimate_once_however_little_its_rounds_deliver() {
        let q = Duration::from_millis(40);
        let mut w = Wan::new(1452, 1_000_000_000);
        let mut t = Instant::now();
        round(&mut w, &mut t, 1000, Duration::ZERO, 0);
        // The overflow: 935 Mbit/s delivered, then two rounds of repairs
        // that deliver 145 and 330 (the lab's 70 ms, 1e-2 start).
        let first = round(&mut w, &mut t, 935, q, 10_000);
        assert!((first - 935.0).abs() < 10.0, "{first}");
        for low in [145, 330] {
            let bw = round(&mut w, &mut t, low, q, 10_000);
            assert!((bw - 935.0).abs() < 10.0, "{low} Mbit/s delivered: {bw}");
        }
        // A clear round ends the overflow; the next one cuts again, to 0.7 of
        // the estimate when even less was delivered.
        round(&mut w, &mut t, 900, Duration::ZERO, 0);
        let bw = round(&mut w, &mut t, 200, q, 10_000);
        assert!((bw - 0.7 * 935.0).abs() < 10.0, "second overflow: {bw}");
        // A path whose rate fell is followed, in steps of 0.7.
        let bw2 = round(&mut w, &mut t, 200, Duration::ZERO, 0);
        let bw3 = round(&mut w, &mut t, 200, q, 10_000);
        assert!(bw3 < bw2 * 0.71 && bw3 >= 200.0, "{bw2} then {bw3}");
    }
}
