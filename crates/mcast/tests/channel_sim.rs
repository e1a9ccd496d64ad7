//! The channel's cores over a simulated network, in simulated time: files
//! offered as a producer writes them reach every receiver that was joined
//! (or came back within the backlog), each named as soon as it verifies;
//! late joiners, outages, a restarted receiver, backlog expiry, and a day
//! of traffic with the sender's and receivers' state staying bounded.

use longhaul_mcast::channel::{
    ChannelConfig, ChannelEvent, ChannelReceiver, ChannelReceiverConfig, ChannelRxEvent,
    ChannelSender, ObjectSource, ObjectStore,
};
use longhaul_mcast::manifest::Item;
use longhaul_mcast::{Group, SendTo};
use longhaul_transfer::EntryKind;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const WALL: u64 = 1_800_000_000_000_000;

/// The producer's files: bytes by id, as the sender's spool holds them.
#[derive(Default)]
struct Spool(HashMap<u32, Vec<u8>>);

impl ObjectSource for Spool {
    fn read(&mut self, oid: u32, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self
            .0
            .get(&oid)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let o = offset as usize;
        buf.copy_from_slice(&d[o..o + buf.len()]);
        Ok(())
    }
}

/// Files in memory; `finish` checks the BLAKE3 like the real store.
#[derive(Default)]
struct Shelf {
    parts: HashMap<u32, (Item, Vec<u8>)>,
    /// Path → bytes of each file named.
    named: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Files named twice (a duplicate is a defect).
    twice: u32,
}

impl ObjectStore for Shelf {
    fn begin(&mut self, oid: u32, item: &Item) -> Result<(), String> {
        self.parts
            .insert(oid, (item.clone(), vec![0; item.size as usize]));
        Ok(())
    }
    fn write(&mut self, oid: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        let p = &mut self.parts.get_mut(&oid).expect("begun").1;
        p[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn finish(&mut self, oid: u32) -> Result<(), String> {
        let (item, data) = self.parts.remove(&oid).expect("begun");
        if *blake3::hash(&data).as_bytes() != item.hash {
            return Err("does not verify".into());
        }
        if self.named.insert(item.path, data).is_some() {
            self.twice += 1;
        }
        Ok(())
    }
    fn abort(&mut self, oid: u32) {
        self.parts.remove(&oid);
    }
}

#[derive(Clone)]
struct Link {
    delay: Duration,
    loss: f64,
    /// Joins (starts) at this time.
    joins: Duration,
    /// Down (both ways) during these spells.
    down: Vec<(Duration, Duration)>,
    /// The receiver process restarts at this time (state lost but its
    /// resume point and its files).
    restarts: Option<Duration>,
}

impl Link {
    fn new(delay_ms: u64, loss: f64) -> Link {
        Link {
            delay: Duration::from_millis(delay_ms),
            loss,
            joins: Duration::ZERO,
            down: Vec::new(),
            restarts: None,
        }
    }
    fn up(&self, t: Duration) -> bool {
        t >= self.joins && !self.down.iter().any(|&(a, b)| t >= a && t < b)
    }
}

struct Node {
    name: String,
    rx: ChannelReceiver,
    shelf: Shelf,
    addr: SocketAddr,
    link: Link,
    events: Vec<ChannelRxEvent>,
    restarted: bool,
    /// Most files in progress at once.
    most_in_progress: usize,
    /// Datagrams and bytes it sent (its feedback).
    sent: (u64, u64),
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Ev {
    at: Instant,
    n: u64,
    to: usize,
    bytes: Vec<u8>,
}

/// A file the producer writes at `at`.
struct Product {
    at: Duration,
    size: usize,
}

struct Run {
    sender: ChannelSender,
    nodes: Vec<Node>,
    /// Path, bytes and offer time of every file offered.
    offered: Vec<(Vec<u8>, Vec<u8>, Duration)>,
    sender_events: Vec<(Duration, ChannelEvent)>,
    most_held: usize,
}

/// The manifest entry of a file at `path` holding `bytes`.
fn entry(path: &[u8], bytes: &[u8]) -> Item {
    Item {
        path: path.to_vec(),
        kind: EntryKind::File,
        size: bytes.len() as u64,
        mode: 0o644,
        mtime_ns: 0,
        link: vec![],
        hash: *blake3::hash(bytes).as_bytes(),
        extents: None,
        owner: None,
        xattrs: vec![],
    }
}

fn rx_config(name: &str) -> ChannelReceiverConfig {
    let mut c = ChannelReceiverConfig::new(name);
    c.accept_unsealed = true;
    c
}

fn run(
    cfg: ChannelConfig,
    links: Vec<Link>,
    products: &[Product],
    end: Duration,
    seed: u64,
) -> Run {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let t0 = Instant::now();
    let mut now = t0;
    let saddr: SocketAddr = "10.0.0.1:7000".parse().unwrap();
    let mut sender = ChannelSender::new(cfg, 0xc4a7 + seed, None, now, WALL).unwrap();
    let mut spool = Spool::default();
    let mut nodes: Vec<Node> = links
        .into_iter()
        .enumerate()
        .map(|(i, link)| Node {
            name: format!("r{i}"),
            rx: ChannelReceiver::new(rx_config(&format!("r{i}")), now, WALL).unwrap(),
            shelf: Shelf::default(),
            addr: format!("10.0.1.{}:7000", i + 1).parse().unwrap(),
            link,
            events: Vec::new(),
            restarted: false,
            most_in_progress: 0,
            sent: (0, 0),
        })
        .collect();
    let mut q: BinaryHeap<Reverse<Ev>> = BinaryHeap::new();
    let mut n = 0u64;
    let mut out = Vec::new();
    let mut offered = Vec::new();
    let mut next_product = 0;
    let mut sender_events = Vec::new();
    let mut most_held = 0;
    while now - t0 < end {
        let t = now - t0;
        // The producer.
        while next_product < products.len() && products[next_product].at <= t {
            let p = &products[next_product];
            let bytes: Vec<u8> = (0..p.size).map(|_| rng.gen()).collect();
            let path = format!("p/{next_product:06}.dat").into_bytes();
            let item = entry(&path, &bytes);
            let oid = sender
                .offer(now, item, WALL + t.as_micros() as u64, false)
                .unwrap();
            spool.0.insert(oid, bytes.clone());
            offered.push((path, bytes, t));
            next_product += 1;
        }
        // Restarts.
        for node in nodes.iter_mut() {
            if node.link.restarts.is_some_and(|r| t >= r) && !node.restarted {
                node.restarted = true;
                let mut c = rx_config(&node.name);
                c.resume = node.rx.resume_point();
                node.rx = ChannelReceiver::new(c, now, WALL + t.as_micros() as u64).unwrap();
                // Parts of the old process are gone with it.
                node.shelf.parts.clear();
            }
        }
        while let Some(to) = sender.poll_transmit(now, &mut spool, &mut out).unwrap() {
            for (i, node) in nodes.iter().enumerate() {
                let hit = match to {
                    SendTo::Group => true,
                    SendTo::To(a) => a == node.addr,
                };
                if hit && rng.gen::<f64>() >= node.link.loss {
                    n += 1;
                    q.push(Reverse(Ev {
                        at: now + node.link.delay,
                        n,
                        to: i,
                        bytes: out.clone(),
                    }));
                }
            }
        }
        while let Some(e) = sender.poll_event() {
            sender_events.push((t, e));
        }
        most_held = most_held.max(sender.state().held);
        for (i, node) in nodes.iter_mut().enumerate() {
            if t < node.link.joins {
                continue; // (not started yet)
            }
            // Its timers run while its link is down; what it sends is lost.
            if node.rx.poll_timeout().is_some_and(|x| x <= now) {
                node.rx.handle_timeout(now, &mut node.shelf);
            }
            let up = node.link.up(t);
            while let Some((to, b)) = node.rx.poll_transmit() {
                assert_eq!(to, saddr);
                node.sent.0 += 1;
                node.sent.1 += b.len() as u64;
                if up && rng.gen::<f64>() >= node.link.loss {
                    n += 1;
                    q.push(Reverse(Ev {
                        at: now + node.link.delay,
                        n,
                        to: usize::MAX - i,
                        bytes: b,
                    }));
                }
            }
            while let Some(e) = node.rx.poll_event() {
                node.events.push(e);
            }
            node.most_in_progress = node.most_in_progress.max(node.rx.in_progress());
        }
        // The next instant anything happens.
        let mut next = q.peek().map(|e| e.0.at);
        let mut consider = |x: Option<Instant>| {
            if let Some(x) = x {
                let x = x.max(now);
                next = Some(next.map_or(x, |y: Instant| y.min(x)));
            }
        };
        consider(sender.poll_timeout());
        for node in &nodes {
            if now - t0 >= node.link.joins {
                consider(node.rx.poll_timeout());
            }
            consider(
                node.link
                    .restarts
                    .filter(|_| !node.restarted)
                    .map(|r| t0 + r),
            );
        }
        if let Some(p) = products.get(next_product) {
            consider(Some(t0 + p.at));
        }
        // Links coming up wake their receivers.
        for node in &nodes {
            for &(_, b) in &node.link.down {
                if t0 + b > now {
                    consider(Some(t0 + b));
                }
            }
            if t0 + node.link.joins > now {
                consider(Some(t0 + node.link.joins));
            }
        }
        let Some(next) = next else { break };
        now = next.max(now);
        let t = now - t0;
        while q.peek().is_some_and(|e| e.0.at <= now) {
            let Reverse(mut e) = q.pop().unwrap();
            if e.to > usize::MAX / 2 {
                let i = usize::MAX - e.to;
                if nodes[i].link.up(t) {
                    sender.handle(now, nodes[i].addr, &mut e.bytes);
                }
            } else {
                let node = &mut nodes[e.to];
                if node.link.up(t) {
                    node.rx.handle(now, saddr, &mut e.bytes, &mut node.shelf);
                }
            }
        }
    }
    Run {
        sender,
        nodes,
        offered,
        sender_events,
        most_held,
    }
}

fn cfg() -> ChannelConfig {
    ChannelConfig {
        rate_bps: 50_000_000,
        symbol_size: 1024,
        block_symbols: 256,
        group: Group::Open,
        backlog: Duration::from_secs(600),
        ..ChannelConfig::default()
    }
}

/// A producer writing files of seed 000's mix (many 10-500 kB, some of
/// 5 MB) every `every`, from `from` to `to`.
fn products(from: Duration, to: Duration, every: Duration, seed: u64) -> Vec<Product> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = Vec::new();
    let mut t = from;
    while t < to {
        let size = match rng.gen_range(0..20) {
            0 => 5_000_000,
            1..=3 => rng.gen_range(100_000..500_000),
            _ => rng.gen_range(10_000..100_000),
        };
        v.push(Product { at: t, size });
        t += every;
    }
    v
}

/// The files `node` holds are exactly the offered ones it was due, byte
/// for byte, each once; latencies as reported.
fn check(run: &Run, node: usize, due: impl Fn(Duration) -> bool) -> Vec<i64> {
    let nd = &run.nodes[node];
    assert_eq!(nd.shelf.twice, 0, "r{node}: a file named twice");
    let mut missing = Vec::new();
    for (path, bytes, at) in &run.offered {
        match nd.shelf.named.get(path) {
            Some(b) => assert_eq!(b, bytes, "r{node}: {path:?} differs"),
            None if due(*at) => missing.push(String::from_utf8_lossy(path).into_owned()),
            None => {}
        }
    }
    assert!(
        missing.is_empty(),
        "r{node} lacks {} file(s) it was due, e.g. {:?}; its events: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)],
        nd.events
            .iter()
            .filter(|e| !matches!(e, ChannelRxEvent::File { .. }))
            .collect::<Vec<_>>()
    );
    nd.events
        .iter()
        .filter_map(|e| match e {
            ChannelRxEvent::File { latency_us, .. } => Some(*latency_us),
            _ => None,
        })
        .collect()
}

fn p99(mut v: Vec<i64>) -> Duration {
    v.sort();
    Duration::from_micros(v[(v.len() * 99 / 100).min(v.len() - 1)].max(0) as u64)
}

#[test]
fn files_reach_every_receiver_as_they_are_written_through_loss() {
    let links = vec![
        Link::new(35, 0.0),
        Link::new(35, 1e-3),
        Link::new(350, 1e-2),
        Link::new(350, 5e-2),
    ];
    // About 25 Mbit/s of products for 60 s, on a 50 Mbit/s channel.
    let prods = products(
        Duration::from_millis(500),
        Duration::from_secs(60),
        Duration::from_millis(100),
        1,
    );
    let r = run(cfg(), links, &prods, Duration::from_secs(90), 1);
    let seen = r.sender.state().receivers;
    assert_eq!(seen.len(), 4);
    for (i, at_sender) in seen.iter().enumerate() {
        let lat = check(&r, i, |_| true);
        assert_eq!(lat.len(), prods.len(), "r{i}");
        let p = p99(lat);
        eprintln!("r{i}: p99 latency {p:?}");
        let bound = if i < 2 { 3 } else { 6 };
        assert!(p < Duration::from_secs(bound), "r{i}: p99 latency {p:?}");
        // The sender's view: every file, each reported done a little
        // later than it was (the STATUS's way back, up to an interval),
        // its percentile a bucket's edge (at most 15 % over).
        assert_eq!(at_sender.name, format!("r{i}"));
        let at_sender = &at_sender.latency;
        assert_eq!(at_sender.files(), prods.len() as u64, "r{i}");
        let q = Duration::from_secs_f64(at_sender.quantile(0.99).unwrap());
        let delay = r.nodes[i].link.delay;
        assert!(
            q >= p && q <= p.mul_f64(1.15) + delay + Duration::from_millis(1200),
            "r{i}: p99 {p:?} at the receiver, {q:?} at the sender"
        );
    }
    // Everything was had by everyone: nothing is held.
    assert_eq!(r.sender.state().held, 0);
    let st = r.sender.stats();
    eprintln!("{st:?}");
}

#[test]
fn late_joiners_an_outage_and_a_restart_within_the_backlog_catch_up() {
    let mut late = Link::new(35, 1e-3);
    late.joins = Duration::from_secs(20);
    let mut out = Link::new(350, 1e-2);
    out.down = vec![(Duration::from_secs(15), Duration::from_secs(35))];
    let mut restart = Link::new(35, 1e-3);
    restart.down = vec![(Duration::from_secs(25), Duration::from_secs(30))];
    restart.restarts = Some(Duration::from_secs(29));
    let links = vec![Link::new(35, 0.0), late, out, restart];
    let prods = products(
        Duration::from_millis(500),
        Duration::from_secs(50),
        Duration::from_millis(100),
        2,
    );
    let r = run(cfg(), links, &prods, Duration::from_secs(90), 2);
    check(&r, 0, |_| true);
    // The late joiner: everything written after it joined (and maybe a
    // little before: the file under way when it came).
    check(&r, 1, |at| at >= Duration::from_secs(21));
    // Away for 20 s, and restarted: everything, from the backlog.
    check(&r, 2, |_| true);
    check(&r, 3, |_| true);
    assert!(r
        .sender_events
        .iter()
        .any(|(_, e)| matches!(e, ChannelEvent::Away { name } if name == "r2")));
}

#[test]
fn a_receiver_away_longer_than_the_backlog_misses_what_expired_and_gets_the_rest() {
    let mut away = Link::new(35, 0.0);
    away.down = vec![(Duration::from_secs(10), Duration::from_secs(50))];
    let links = vec![Link::new(35, 0.0), away];
    let mut c = cfg();
    c.backlog = Duration::from_secs(20);
    let prods = products(
        Duration::from_millis(500),
        Duration::from_secs(70),
        Duration::from_millis(200),
        3,
    );
    let r = run(c, links, &prods, Duration::from_secs(100), 3);
    check(&r, 0, |_| true);
    // Files written more than the backlog before it came back are gone; the
    // rest arrive (but for those that expire while it catches up: the first
    // two seconds' worth).
    check(&r, 1, |at| {
        at < Duration::from_secs(9) || at >= Duration::from_secs(33)
    });
    let missed: u32 = r.nodes[1]
        .events
        .iter()
        .filter_map(|e| match e {
            ChannelRxEvent::Missed { count, .. } => Some(*count),
            _ => None,
        })
        .sum();
    assert!(missed > 0, "{:?}", r.nodes[1].events);
}

#[test]
fn a_day_of_products_keeps_the_state_bounded() {
    // A small file every 2 s for 24 hours to three receivers, one of them
    // lossy and one away for an hour: the sender holds only what someone
    // lacks, within the backlog; receivers hold only files in progress.
    let mut away = Link::new(35, 0.0);
    away.down = vec![(Duration::from_secs(6 * 3600), Duration::from_secs(7 * 3600))];
    let links = vec![Link::new(35, 0.0), Link::new(350, 1e-2), away];
    let mut c = cfg();
    c.backlog = Duration::from_secs(1800);
    let day = Duration::from_secs(24 * 3600);
    let prods: Vec<Product> = (0..day.as_secs() / 2)
        .map(|i| Product {
            at: Duration::from_secs(i * 2 + 1),
            size: 20_000 + (i as usize * 7919) % 30_000,
        })
        .collect();
    let r = run(c, links, &prods, day + Duration::from_secs(60), 4);
    check(&r, 0, |_| true);
    check(&r, 1, |_| true);
    // Back after an hour with a 30 min backlog: the first half hour missed.
    check(&r, 2, |at| {
        at < Duration::from_secs(6 * 3600) || at >= Duration::from_secs(6 * 3600 + 1800 + 5)
    });
    assert!(r.nodes[2]
        .events
        .iter()
        .any(|e| matches!(e, ChannelRxEvent::Missed { .. })));
    // At most the files of a backlog held (900 at one per 2 s), never the day's 43,200.
    assert!(r.most_held <= 950, "the sender held {} files", r.most_held);
    for (i, n) in r.nodes.iter().enumerate() {
        // (Catching up, it asks for 128 files at a time.)
        assert!(
            n.most_in_progress <= 150,
            "r{i}: {} in progress",
            n.most_in_progress
        );
    }
}

#[test]
fn a_receiver_catching_up_does_not_hold_up_the_others() {
    // About 35 Mbit/s of products on a 50 Mbit/s channel; r1 is away for
    // 20 s (87 MB of files) and catches up from the backlog, in what the
    // live files leave, while r0's files keep their pace.
    let mut away = Link::new(35, 0.0);
    away.down = vec![(Duration::from_secs(10), Duration::from_secs(30))];
    let links = vec![Link::new(35, 0.0), away];
    let prods: Vec<Product> = products(
        Duration::from_millis(500),
        Duration::from_secs(60),
        Duration::from_millis(100),
        5,
    )
    .into_iter()
    .map(|p| Product {
        size: p.size * 13 / 10,
        ..p
    })
    .collect();
    let r = run(cfg(), links, &prods, Duration::from_secs(120), 5);
    let lat0 = check(&r, 0, |_| true);
    check(&r, 1, |_| true);
    // The same without the outage.
    let calm = run(
        cfg(),
        vec![Link::new(35, 0.0), Link::new(35, 0.0)],
        &prods,
        Duration::from_secs(120),
        5,
    );
    let base = p99(check(&calm, 0, |_| true));
    let p = p99(lat0);
    eprintln!("r0: p99 latency {p:?} while r1 caught up, {base:?} without");
    assert!(
        p < base * 5 / 4 + Duration::from_millis(300),
        "r0: p99 latency {p:?}, {base:?} without"
    );
}

#[test]
fn a_receiver_far_away_catches_up_many_small_files_while_many_live_ones_are_in_progress() {
    // 200 files of 20 kB a second (32 Mbit/s) on a 50 Mbit/s channel; r1,
    // 700 ms away, is down from 10 s to 20 s (2,000 files) and restarts.
    // At any moment about a hundred live files are in progress at r1 (a
    // round trip for their repair): the files it asks for again must not
    // wait for those to be fewer, or it catches up only once the producer
    // stops (40 s in) and its oldest files wait a minute.
    let mut away = Link::new(350, 1e-3);
    away.down = vec![(Duration::from_secs(10), Duration::from_secs(20))];
    away.restarts = Some(Duration::from_secs(19));
    let links = vec![Link::new(35, 1e-3), away];
    let prods: Vec<Product> = (0..8000)
        .map(|k| Product {
            at: Duration::from_millis(5 * k),
            size: 20_000,
        })
        .collect();
    let r = run(cfg(), links, &prods, Duration::from_secs(90), 7);
    // (Due what was written once it had joined, a round trip in.)
    let joined = |at: Duration| at >= Duration::from_secs(1);
    check(&r, 0, joined);
    let lat = check(&r, 1, joined);
    let worst = Duration::from_micros(*lat.iter().max().unwrap() as u64);
    eprintln!("r1: worst latency {worst:?}");
    // 40 MB to catch up in what 32 Mbit/s of live files leave of 50:
    // about 25 s after it is back, so its oldest files wait about 35 s.
    assert!(
        worst < Duration::from_secs(45),
        "r1: worst latency {worst:?}"
    );
}

#[test]
fn a_hundred_lossy_receivers_send_bounded_feedback_and_all_get_everything() {
    // 100 receivers at 700 ms, each losing 1 % on its own; 2 Mbit/s of
    // small products for 20 s on a 10 Mbit/s channel.
    let links: Vec<Link> = (0..100).map(|_| Link::new(350, 1e-2)).collect();
    let prods: Vec<Product> = (0..400)
        .map(|k| Product {
            at: Duration::from_millis(500 + 50 * k),
            size: 12_000,
        })
        .collect();
    let cfg = ChannelConfig {
        rate_bps: 10_000_000,
        ..cfg()
    };
    let end = Duration::from_secs(40);
    let r = run(cfg, links, &prods, end, 11);
    let mut most = (0, 0);
    for (i, n) in r.nodes.iter().enumerate() {
        // (Due what was written once it had joined, a round trip in.)
        check(&r, i, |at| at >= Duration::from_secs(1));
        most = (most.0.max(n.sent.0), most.1.max(n.sent.1));
    }
    // Each receiver: a STATUS after a BEAT only while it lacks something
    // (at most 10 a second), else one a second, and its JOINs.
    let per_s = |x: u64| x as f64 / end.as_secs_f64();
    eprintln!(
        "most feedback of a receiver: {:.1} datagrams/s, {:.0} B/s",
        per_s(most.0),
        per_s(most.1)
    );
    assert!(per_s(most.0) <= 11.0, "{most:?}");
    assert!(per_s(most.1) <= 2_000.0, "{most:?}");
    // ... so the sender hears at most 1,100 a second from all of them,
    // and held every file no longer than it took them all to have it.
    assert_eq!(r.sender.state().held, 0);
    assert_eq!(r.sender.stats().dropped, 0);
}

/// A sender restarted on a new port from its record: a receiver that
/// stayed moves to it on its first BEAT and gets the files offered from
/// then on (and, being away meanwhile, nothing twice); an old BEAT of the
/// channel replayed from elsewhere does not move it.
#[test]
fn a_receiver_follows_its_channel_to_a_restarted_sender_and_not_to_a_replay() {
    let (a, b, c): (SocketAddr, SocketAddr, SocketAddr) = (
        "10.0.0.1:7000".parse().unwrap(),
        "10.0.0.1:7001".parse().unwrap(),
        "10.0.0.9:7000".parse().unwrap(),
    );
    let me: SocketAddr = "10.0.1.1:7000".parse().unwrap();
    let t0 = Instant::now();
    let mut rx = ChannelReceiver::new(rx_config("r0"), t0, WALL).unwrap();
    let mut shelf = Shelf::default();
    let mut spool = Spool::default();
    let file = |n: u8| {
        let bytes: Vec<u8> = (0..30_000u32).map(|i| (i as u8) ^ n).collect();
        (entry(&[b'f', n], &bytes), bytes)
    };
    let mut now = t0;
    let mut first = ChannelSender::new(cfg(), 0x5eed, None, t0, WALL).unwrap();
    let (i1, b1) = file(1);
    let old_beat = pump(
        &mut now, me, &mut first, a, &mut rx, &mut shelf, &mut spool, 1,
    )
    .unwrap();
    let oid = first.offer(now, i1.clone(), WALL, false).unwrap();
    spool.0.insert(oid, b1.clone());
    pump(
        &mut now, me, &mut first, a, &mut rx, &mut shelf, &mut spool, 2,
    );
    assert_eq!(shelf.named.get(&i1.path), Some(&b1));
    // Restarted from its record on port 7001, a few seconds on.
    let mut second = ChannelSender::new(cfg(), 0x5eed, None, now, WALL + 5_000_000).unwrap();
    second.restore(
        now,
        WALL + 5_000_000,
        first.next_oid(),
        vec![(oid, i1.clone(), WALL, false)],
        vec![("r0".into(), 0)],
    );
    pump(
        &mut now,
        me,
        &mut second,
        b,
        &mut rx,
        &mut shelf,
        &mut spool,
        2,
    );
    let (i2, b2) = file(2);
    let oid2 = second
        .offer(now, i2.clone(), WALL + 7_000_000, false)
        .unwrap();
    assert_eq!(oid2, oid + 1, "ids go on");
    spool.0.insert(oid2, b2.clone());
    // An old BEAT replayed from elsewhere, mid-way: ignored.
    let mut replay = old_beat.clone();
    rx.handle(now, c, &mut replay, &mut shelf);
    pump(
        &mut now,
        me,
        &mut second,
        b,
        &mut rx,
        &mut shelf,
        &mut spool,
        2,
    );
    assert_eq!(
        shelf.named.get(&i2.path),
        Some(&b2),
        "followed the restarted sender"
    );
    assert_eq!(shelf.twice, 0);
    let moved: Vec<_> = std::iter::from_fn(|| rx.poll_event())
        .filter_map(|e| match e {
            ChannelRxEvent::Joined { sender, .. } => Some(sender),
            _ => None,
        })
        .collect();
    assert_eq!(
        moved,
        [a, b],
        "joined at a, moved to b, never to the replay's c"
    );
}

/// Both ways at once, for `secs` of simulated time in 1 ms steps, the
/// sender's datagrams coming from `addr`; the last BEAT it sent.
#[allow(clippy::too_many_arguments)]
fn pump(
    now: &mut Instant,
    me: SocketAddr,
    s: &mut ChannelSender,
    addr: SocketAddr,
    rx: &mut ChannelReceiver,
    shelf: &mut Shelf,
    spool: &mut Spool,
    secs: u64,
) -> Option<Vec<u8>> {
    use longhaul_mcast::wire::{header, Kind};
    let mut out = Vec::new();
    let mut beat = None;
    for _ in 0..secs * 1000 {
        *now += Duration::from_millis(1);
        while s.poll_transmit(*now, spool, &mut out).unwrap().is_some() {
            if header(&out).is_ok_and(|h| h.kind == Kind::Beat) {
                beat = Some(out.clone());
            }
            rx.handle(*now, addr, &mut out, shelf);
        }
        if rx.poll_timeout().is_some_and(|t| t <= *now) {
            rx.handle_timeout(*now, shelf);
        }
        while let Some((_, mut d)) = rx.poll_transmit() {
            s.handle(*now, me, &mut d);
        }
        while s.poll_event().is_some() {}
    }
    beat
}
