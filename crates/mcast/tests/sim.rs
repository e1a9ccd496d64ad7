//! The protocol cores against a simulated network: simulated time, seeded loss,
//! per-receiver delay, jitter (reordering), late joiners and vanishing receivers.
//! Every live receiver must end with the sender's bytes, verified by BLAKE3.

use longhaul_mcast::manifest::{Item, Manifest};
use longhaul_mcast::{
    Group, Receiver, ReceiverConfig, ReceiverEvent, RxState, SendTo, Sender, SenderConfig,
    SenderEvent, Source, Store,
};
use longhaul_transfer::EntryKind;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

struct MemSource(Vec<u8>);

impl Source for MemSource {
    fn read_data(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let o = offset as usize;
        buf.copy_from_slice(&self.0[o..o + buf.len()]);
        Ok(())
    }
}

/// Files in memory; `finish` checks every file's BLAKE3 like the real store.
#[derive(Default)]
struct MemStore {
    manifest: Option<Manifest>,
    data: Vec<u8>,
    finished: bool,
    aborted: bool,
    writes: u64,
    /// Lent to a verification: the core must call none of it.
    lent: bool,
}

impl Store for MemStore {
    fn begin(&mut self, m: &Manifest) -> Result<(), String> {
        assert!(!self.lent, "the core used a store lent to a verification");
        self.data = vec![0; m.data_len() as usize];
        self.manifest = Some(m.clone());
        Ok(())
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        assert!(!self.lent, "the core used a store lent to a verification");
        let o = offset as usize;
        self.data[o..o + data.len()].copy_from_slice(data);
        self.writes += 1;
        Ok(())
    }
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        assert!(!self.lent, "the core used a store lent to a verification");
        let o = offset as usize;
        buf.copy_from_slice(&self.data[o..o + buf.len()]);
        Ok(())
    }
    fn finish(&mut self) -> Result<(), String> {
        let m = self.manifest.as_ref().unwrap();
        for s in m.spans() {
            let got = blake3::hash(&self.data[s.offset as usize..(s.offset + s.len) as usize]);
            if *got.as_bytes() != m.items[s.item].hash {
                return Err(format!("file {} does not verify", s.item));
            }
        }
        self.finished = true;
        Ok(())
    }
    fn abort(&mut self) {
        assert!(!self.lent, "the core used a store lent to a verification");
        self.aborted = true;
    }
}

/// A data set: `files` of the given sizes, random bytes.
fn dataset(seed: u64, sizes: &[usize]) -> (Manifest, Vec<u8>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut items = Vec::new();
    let mut data = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        items.push(Item {
            path: format!("f{i:05}").into_bytes(),
            kind: EntryKind::File,
            size: n as u64,
            mode: 0o644,
            mtime_ns: 0,
            link: vec![],
            hash: *blake3::hash(&bytes).as_bytes(),
            extents: None,
            owner: None,
            xattrs: vec![],
        });
        data.extend_from_slice(&bytes);
    }
    (Manifest { items }, data)
}

struct Link {
    delay: Duration,
    jitter: Duration,
    loss: f64,
    /// Packets reach it only from this time on.
    joins: Duration,
    /// It stops existing at this time.
    vanishes: Option<Duration>,
    /// Its store's `finish` takes this long, run apart from the core
    /// (`verify_apart`); zero: the core runs it at once.
    verify: Duration,
}

impl Link {
    fn new(delay_ms: u64, loss: f64) -> Link {
        Link {
            delay: Duration::from_millis(delay_ms),
            jitter: Duration::ZERO,
            loss,
            joins: Duration::ZERO,
            vanishes: None,
            verify: Duration::ZERO,
        }
    }
}

struct Node {
    rx: Receiver,
    store: MemStore,
    addr: SocketAddr,
    link: Link,
    ended: Option<longhaul_mcast::ReceiveReport>,
    /// Its store is lent to a verification ending then.
    verifying: Option<Instant>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Ev {
    at: Instant,
    n: u64,
    /// usize::MAX = the sender.
    to: usize,
    from: SocketAddr,
    bytes: Vec<u8>,
}

struct Outcome {
    sender: Sender,
    nodes: Vec<Node>,
    elapsed: Duration,
    events: Vec<SenderEvent>,
    /// When pass 1 started (data began), from the start.
    data_start: Option<Duration>,
}

fn run(cfg: SenderConfig, links: Vec<Link>, names: &[&str], sizes: &[usize], seed: u64) -> Outcome {
    run_keyed(cfg, links, names, sizes, seed, None)
}

fn run_keyed(
    cfg: SenderConfig,
    links: Vec<Link>,
    names: &[&str],
    sizes: &[usize],
    seed: u64,
    key: Option<&[u8]>,
) -> Outcome {
    let (manifest, data) = dataset(seed, sizes);
    let t0 = Instant::now();
    let mut now = t0;
    let saddr: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    let session = 0x5e55 + seed;
    let skey = key.map(|k| longhaul_mcast::seal::Key::from_material(k, session).unwrap());
    let mut sender = Sender::new(
        cfg,
        session,
        skey,
        manifest.encode(),
        data.len() as u64,
        now,
    )
    .unwrap();
    let mut src = MemSource(data.clone());
    let mut nodes: Vec<Node> = links
        .into_iter()
        .enumerate()
        .map(|(i, link)| {
            let mut rc = ReceiverConfig::new(names[i]);
            rc.key_material = key.map(|k| k.to_vec());
            rc.accept_unsealed = key.is_none();
            rc.verify_apart = !link.verify.is_zero();
            let mut rx = Receiver::new(rc).unwrap();
            rx.seed(seed + i as u64);
            Node {
                rx,
                store: MemStore::default(),
                addr: format!("10.0.0.{}:6000", i + 2).parse().unwrap(),
                link,
                ended: None,
                verifying: None,
            }
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xabcdef);
    let mut q: BinaryHeap<Reverse<Ev>> = BinaryHeap::new();
    let mut n = 0u64;
    let mut out = Vec::new();
    let mut events = Vec::new();
    let mut data_start = None;
    let alive = |node: &Node, at: Instant| {
        at >= t0 + node.link.joins && node.link.vanishes.is_none_or(|v| at < t0 + v)
    };
    for _ in 0..20_000_000 {
        // The sender sends what is due.
        while let Some(dest) = sender.poll_transmit(now, &mut src, &mut out).unwrap() {
            for (i, node) in nodes.iter().enumerate() {
                let hit = match dest {
                    SendTo::Group => true,
                    SendTo::To(a) => a == node.addr,
                };
                if !hit || rng.gen::<f64>() < node.link.loss {
                    continue;
                }
                let j = node.link.jitter.mul_f64(rng.gen::<f64>());
                n += 1;
                q.push(Reverse(Ev {
                    at: now + node.link.delay + j,
                    n,
                    to: i,
                    from: saddr,
                    bytes: out.clone(),
                }));
            }
        }
        while let Some(e) = sender.poll_event() {
            if matches!(e, SenderEvent::PassStarted { pass: 1, .. }) {
                data_start = Some(now - t0);
            }
            events.push(e);
        }
        for (i, node) in nodes.iter_mut().enumerate() {
            if !alive(node, now) {
                while node.rx.poll_transmit().is_some() {}
                continue;
            }
            if node.rx.poll_timeout().is_some_and(|t| t <= now) {
                node.rx.handle_timeout(now, &mut node.store);
            }
            if node.rx.finish_due() {
                node.verifying = Some(now + node.link.verify);
                node.store.lent = true;
            }
            if node.verifying.is_some_and(|t| t <= now) {
                node.verifying = None;
                node.store.lent = false;
                let r = node.store.finish();
                node.rx.verified(now, r, &mut node.store);
            }
            while let Some((to, b)) = node.rx.poll_transmit() {
                assert_eq!(to, saddr);
                if rng.gen::<f64>() < node.link.loss {
                    continue;
                }
                n += 1;
                q.push(Reverse(Ev {
                    at: now + node.link.delay,
                    n,
                    to: usize::MAX,
                    from: node.addr,
                    bytes: b,
                }));
            }
            while let Some(e) = node.rx.poll_event() {
                if let ReceiverEvent::Ended(r) = e {
                    node.ended = Some(r);
                }
            }
            let _ = i;
        }
        if sender.is_done()
            && nodes
                .iter()
                .all(|n| n.ended.is_some() || !alive(n, now) || n.rx.poll_timeout().is_none())
        {
            break;
        }
        // Next instant anything happens.
        let mut next = q.peek().map(|e| e.0.at);
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                let t = t.max(now);
                next = Some(next.map_or(t, |x: Instant| x.min(t)));
            }
        };
        consider(sender.poll_timeout());
        for node in &nodes {
            if alive(node, now) {
                consider(node.rx.poll_timeout());
                consider(node.verifying);
            }
        }
        let Some(next) = next else { break };
        // A receiver that joins later wakes nothing by itself; its packets arrive.
        now = now.max(next);
        while q.peek().is_some_and(|e| e.0.at <= now) {
            let Reverse(mut e) = q.pop().unwrap();
            if e.to == usize::MAX {
                sender.handle(now, e.from, &mut e.bytes);
            } else {
                let node = &mut nodes[e.to];
                if alive(node, now) {
                    node.rx.handle(now, e.from, &mut e.bytes, &mut node.store);
                }
            }
        }
        assert!(
            now - t0 < Duration::from_secs(3600),
            "simulation ran an hour"
        );
    }
    if std::env::var("SIMDEBUG").is_ok() {
        for e in &events {
            eprintln!("{e:?}");
        }
        for node in &nodes {
            eprintln!("{} {:?} stats {:?}", node.addr, node.ended, node.rx.stats());
        }
    }
    assert!(sender.is_done(), "sender never finished");
    // Every receiver that completed holds exactly the sender's bytes.
    for node in &nodes {
        if node.store.finished {
            assert_eq!(node.store.data, data, "bytes differ");
        }
    }
    Outcome {
        elapsed: now - t0,
        sender,
        nodes,
        events,
        data_start,
    }
}

fn cfg(names: &[&str]) -> SenderConfig {
    SenderConfig {
        rate_bps: 100_000_000,
        symbol_size: 1024,
        block_symbols: 256,
        group: Group::Closed(names.iter().map(|s| s.to_string()).collect()),
        announce_window: Duration::from_secs(5),
        ..SenderConfig::default()
    }
}

fn assert_completed(o: &Outcome, names: &[&str]) {
    let report = o.sender.report();
    for name in names {
        let r = report.iter().find(|r| r.name == *name).unwrap();
        assert_eq!(r.state, RxState::Completed, "{name}: {:?}", r.state);
        let node = o.nodes.iter().find(|n| n.rx_name() == *name).unwrap();
        assert!(node.store.finished, "{name} did not verify");
        let ended = node.ended.as_ref().expect("session ended");
        assert!(ended.ok, "{name}: {}", ended.error);
    }
}

impl Node {
    fn rx_name(&self) -> String {
        // Names are given in order; recover from the address.
        let i: usize = self
            .addr
            .ip()
            .to_string()
            .rsplit('.')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        ["a", "b", "c", "d"][i - 2].to_string()
    }
}

/// 3 MB in 21 files, some small (batched into shared blocks), one large.
fn sizes() -> Vec<usize> {
    let mut v = vec![2_000_000, 0, 1, 1024, 256 * 1024];
    v.extend(std::iter::repeat_n(10_000, 16));
    v
}

#[test]
fn three_receivers_with_independent_loss_all_complete() {
    let names = ["a", "b", "c"];
    let links = vec![Link::new(35, 0.0), Link::new(35, 0.01), Link::new(35, 0.10)];
    let o = run(cfg(&names), links, &names, &sizes(), 1);
    assert_completed(&o, &names);
    let rep = o.sender.report();
    // The loss-free receiver needed no repair pass; the 10 % one did.
    let a = rep.iter().find(|r| r.name == "a").unwrap();
    let c = rep.iter().find(|r| r.name == "c").unwrap();
    assert_eq!(a.passes, 1, "a completed in pass {}", a.passes);
    assert!(c.passes >= 2, "c completed in pass {}", c.passes);
    assert!(
        c.lost > 0 && a.lost == 0,
        "a lost {}, c lost {}",
        a.lost,
        c.lost
    );
    // Repair was sent once for the group, not per receiver: total data symbols
    // stay near (1 + c's loss) of the source, not 3x.
    let st = o.sender.stats();
    let src = o.sender.total_symbols();
    let sent = st.data_packets + st.repair_packets;
    assert!(sent < src * 13 / 10, "sent {sent} symbols for {src}");
    // Lossless receiver: done about when the data is (3.3 MB at 100 Mbit/s
    // ~ 0.27 s after pass 1 started, when the lossy ones had the manifest).
    let ta = a.time.unwrap() - o.data_start.expect("data was sent");
    assert!(
        ta < Duration::from_millis(500),
        "a took {ta:?} after the data started"
    );
}

/// A receiver whose store takes 20 s to verify what it received (gigabytes
/// on a slow disk) answers the sender's polls meanwhile: it is not given up
/// on for silence (5 s), and completes.
#[test]
fn a_receiver_verifying_for_long_is_waited_for() {
    let names = ["a", "b"];
    let mut slow = Link::new(35, 0.01);
    slow.verify = Duration::from_secs(20);
    let o = run(
        cfg(&names),
        vec![Link::new(35, 0.0), slow],
        &names,
        &sizes(),
        4,
    );
    assert_completed(&o, &names);
    let b = o.nodes[1].ended.as_ref().expect("b ended");
    assert!(b.ok, "{b:?}");
    assert!(o.elapsed > Duration::from_secs(20), "{:?}", o.elapsed);
    assert!(o.nodes[1].store.finished);
}

#[test]
fn reordering_and_small_files_only() {
    let names = ["a", "b"];
    let mut l1 = Link::new(30, 0.02);
    l1.jitter = Duration::from_millis(20);
    let mut l2 = Link::new(5, 0.0);
    l2.jitter = Duration::from_millis(3);
    let sizes: Vec<usize> = (0..300).map(|i| 1000 + i * 37).collect();
    let o = run(cfg(&names), vec![l1, l2], &names, &sizes, 2);
    assert_completed(&o, &names);
}

#[test]
fn a_late_joiner_catches_up() {
    let names = ["a", "b", "c"];
    let mut late = Link::new(35, 0.01);
    // Joins in the middle of pass 1 (3.3 MB take 1.3 s at 20 Mbit/s, from 1 s).
    late.joins = Duration::from_millis(1_500);
    let mut c = cfg(&names);
    c.rate_bps = 20_000_000;
    c.announce_window = Duration::from_secs(1);
    let o = run(
        c,
        vec![Link::new(35, 0.0), Link::new(35, 0.0), late],
        &names,
        &sizes(),
        3,
    );
    assert_completed(&o, &names);
    let rep = o.sender.report();
    assert!(rep.iter().find(|r| r.name == "c").unwrap().late);
}

#[test]
fn a_vanished_receiver_is_given_up_and_does_not_stall_the_rest() {
    let names = ["a", "b", "c"];
    let mut gone = Link::new(35, 0.05);
    gone.vanishes = Some(Duration::from_millis(300));
    let o = run(
        cfg(&names),
        vec![Link::new(35, 0.0), Link::new(35, 0.05), gone],
        &names,
        &sizes(),
        4,
    );
    assert_completed(&o, &["a", "b"]);
    let rep = o.sender.report();
    let c = rep.iter().find(|r| r.name == "c").unwrap();
    assert!(
        matches!(&c.state, RxState::GaveUp(w) if w.contains("no answer")),
        "{:?}",
        c.state
    );
    assert!(o
        .events
        .iter()
        .any(|e| matches!(e, SenderEvent::GaveUp { name, .. } if name == "c")));
    assert!(o.elapsed < Duration::from_secs(30), "took {:?}", o.elapsed);
}

#[test]
fn a_named_receiver_that_never_comes_is_reported() {
    let names = ["a", "b"];
    let mut c = cfg(&names);
    c.announce_window = Duration::from_secs(1);
    let mut never = Link::new(35, 0.0);
    never.joins = Duration::from_secs(10_000);
    let o = run(c, vec![Link::new(35, 0.0), never], &names, &sizes(), 5);
    assert_completed(&o, &["a"]);
    let b = o
        .sender
        .report()
        .into_iter()
        .find(|r| r.name == "b")
        .unwrap();
    assert_eq!(b.state, RxState::GaveUp("never registered".into()));
}

#[test]
fn open_group_takes_whoever_registers() {
    let names = ["a", "b"];
    let mut c = cfg(&names);
    c.group = Group::Open;
    c.announce_window = Duration::from_millis(500);
    let o = run(
        c,
        vec![Link::new(10, 0.01), Link::new(10, 0.0)],
        &names,
        &sizes(),
        6,
    );
    assert_completed(&o, &names);
}

#[test]
fn only_a_manifest_no_data() {
    let names = ["a"];
    let o = run(cfg(&names), vec![Link::new(10, 0.0)], &names, &[0, 0], 7);
    assert_completed(&o, &names);
}

#[test]
fn many_seeds_many_losses() {
    let names = ["a", "b", "c"];
    let sizes: Vec<usize> = vec![300_000, 5, 40_000, 0, 70_001];
    for seed in 100..120 {
        let mut l1 = Link::new(20, 0.01);
        l1.jitter = Duration::from_millis(5);
        let l2 = Link::new(3, 0.2);
        let o = run(
            cfg(&names),
            vec![Link::new(1, 0.0), l1, l2],
            &names,
            &sizes,
            seed,
        );
        assert_completed(&o, &names);
    }
}

#[test]
fn sealed_sessions_complete_and_unkeyed_receivers_stay_out() {
    let names = ["a", "b"];
    let key: &[u8] = b"0123456789abcdef0123456789abcdef";
    let o = run_keyed(
        cfg(&names),
        vec![Link::new(10, 0.0), Link::new(10, 0.05)],
        &names,
        &sizes(),
        8,
        Some(key),
    );
    assert_completed(&o, &names);
}

/// Garbage, truncations, bit flips and out-of-range fields thrown at a receiver in
/// the middle of a session are dropped and counted; the session still completes.
#[test]
fn hostile_datagrams_are_dropped_never_fatal() {
    use longhaul_mcast::wire::{self, DataHdr, Msg};
    let (manifest, data) = dataset(9, &[50_000, 10]);
    let t0 = Instant::now();
    let saddr: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    let evil: SocketAddr = "10.0.0.66:5000".parse().unwrap();
    let mut c = cfg(&["a"]);
    c.announce_window = Duration::from_millis(100);
    let mut sender = Sender::new(c, 77, None, manifest.encode(), data.len() as u64, t0).unwrap();
    let mut rc = ReceiverConfig::new("a");
    rc.accept_unsealed = true;
    let mut rx = Receiver::new(rc).unwrap();
    let mut store = MemStore::default();
    let mut src = MemSource(data.clone());
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut out = Vec::new();
    let mut now = t0;
    let mut ended = None;
    let mut hostile = 0u64;
    while ended.is_none() && now < t0 + Duration::from_secs(60) {
        while let Some(_d) = sender.poll_transmit(now, &mut src, &mut out).unwrap() {
            // Mangled copies first: flipped bytes, truncation, and junk fields.
            let mut bad = out.clone();
            let kind = rng.gen_range(0..4);
            match kind {
                0 => {
                    let i = rng.gen_range(0..bad.len());
                    bad[i] ^= 1 << rng.gen_range(0..8);
                }
                1 => bad.truncate(rng.gen_range(0..bad.len())),
                2 => bad = (0..rng.gen_range(0..2000)).map(|_| rng.gen()).collect(),
                _ => {
                    let mut n = rng.gen_range(1..3000);
                    if n == 1024 {
                        n += 1;
                    }
                    let sym = vec![0u8; n];
                    let h = DataHdr {
                        seq: rng.gen(),
                        block: rng.gen_range(0..5),
                        esi: rng.gen(),
                    };
                    wire::encode(77, &Msg::Data(h, &sym), None, &mut bad);
                }
            }
            // Bit flips come from elsewhere: from the sender's own address, without
            // a key, a flipped symbol is indistinguishable from a real one (the
            // manifest's BLAKE3 would catch it; sealed sessions drop it).
            let from = if kind == 0 || rng.gen() { evil } else { saddr };
            rx.handle(now, from, &mut bad, &mut store);
            hostile += 1;
            rx.handle(now, saddr, &mut out.clone(), &mut store);
        }
        if rx.poll_timeout().is_some_and(|t| t <= now) {
            rx.handle_timeout(now, &mut store);
        }
        while let Some((_, mut b)) = rx.poll_transmit() {
            sender.handle(now, "10.0.0.2:6000".parse().unwrap(), &mut b);
        }
        while let Some(e) = rx.poll_event() {
            if let ReceiverEvent::Ended(r) = e {
                ended = Some(r);
            }
        }
        now += Duration::from_micros(200);
    }
    let r = ended.expect("session ended");
    assert!(r.ok, "{}", r.error);
    assert_eq!(store.data, data);
    assert!(
        rx.stats().dropped > hostile / 4,
        "dropped {} of {hostile}",
        rx.stats().dropped
    );
}

#[test]
fn a_held_up_sender_keeps_its_rate_in_bounded_bursts() {
    use longhaul_mcast::wire::{self, Msg, Register};
    // The driver calls the sender once a millisecond, but every 25 ms it is held
    // up for 6 ms (a block's encoding, or another process on the core).
    let (manifest, data) = dataset(4, &[3_000_000]);
    let t0 = Instant::now();
    let rx: SocketAddr = "10.0.0.2:6000".parse().unwrap();
    let mut c = cfg(&["a"]);
    c.rate_bps = 100_000_000;
    let catch_up = c.catch_up;
    let mut s = Sender::new(c, 5, None, manifest.encode(), data.len() as u64, t0).unwrap();
    let mut src = MemSource(data);
    let mut out = Vec::new();
    let mut reg = Vec::new();
    let m = Msg::Register(Register {
        name: "a".into(),
        echo_us: 0,
        held_us: 0,
    });
    wire::encode(5, &m, None, &mut reg);
    s.handle(t0 + Duration::from_millis(5), rx, &mut reg);
    let mut now = t0 + Duration::from_millis(5);
    let (mut planned, mut sent, mut wire_bits) = (None, 0u64, 0u64);
    let (mut first, mut last, mut biggest) = (None, now, 0u64);
    let mut tick = 0u32;
    while planned.is_none_or(|p| sent < p) {
        assert!(now < t0 + Duration::from_secs(10), "pass 1 never ended");
        let mut burst = 0u64;
        while let Some(_d) = s.poll_transmit(now, &mut src, &mut out).unwrap() {
            let st = s.stats();
            if st.data_packets + st.repair_packets > sent {
                sent = st.data_packets + st.repair_packets;
                wire_bits += (out.len() as u64 + 28) * 8;
                burst += (out.len() as u64 + 28) * 8;
                first.get_or_insert(now);
                last = now;
            }
        }
        biggest = biggest.max(burst);
        while let Some(e) = s.poll_event() {
            if let SenderEvent::PassStarted {
                pass: 1, symbols, ..
            } = e
            {
                planned = Some(symbols);
            }
        }
        tick += 1;
        now += Duration::from_millis(if tick.is_multiple_of(25) { 7 } else { 1 });
    }
    let took = (last - first.unwrap()).as_secs_f64();
    let ideal = wire_bits as f64 / 100e6;
    // The average rate holds: the stalls were made up...
    assert!(
        took < ideal * 1.02 + 0.002,
        "pass 1 took {took:.4} s, {ideal:.4} s at the rate"
    );
    // ...but no burst exceeds what the catch-up allows plus one tick's worth.
    let cap = (catch_up.as_secs_f64() + 0.001) * 100e6 + 12_000.0;
    assert!(
        (biggest as f64) <= cap,
        "a burst of {biggest} bits, cap {cap}"
    );
    assert!(biggest as f64 > 6e-3 * 100e6, "the stalls were not made up");
}

/// A receiver without a key that was not told to take unsealed sessions
/// refuses one: a single `Refused` event however often it is announced,
/// nothing sent back (no REGISTER), nothing stored; told to, it takes it.
#[test]
fn a_keyless_receiver_refuses_unsealed_sessions_unless_told_to_take_them() {
    let (manifest, data) = dataset(3, &[20_000]);
    let t0 = Instant::now();
    let saddr: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    for accept in [false, true] {
        let mut c = cfg(&["a"]);
        c.announce_window = Duration::from_millis(100);
        let mut sender =
            Sender::new(c, 78, None, manifest.encode(), data.len() as u64, t0).unwrap();
        let mut rc = ReceiverConfig::new("a");
        rc.accept_unsealed = accept;
        let mut rx = Receiver::new(rc).unwrap();
        let mut store = MemStore::default();
        let mut src = MemSource(data.clone());
        let (mut out, mut now) = (Vec::new(), t0);
        let (mut refused, mut replies, mut ended) = (Vec::new(), 0, None);
        let mut announced = 0;
        while ended.is_none() && now < t0 + Duration::from_secs(5) {
            while let Some(_d) = sender.poll_transmit(now, &mut src, &mut out).unwrap() {
                announced += 1;
                rx.handle(now, saddr, &mut out.clone(), &mut store);
            }
            if rx.poll_timeout().is_some_and(|t| t <= now) {
                rx.handle_timeout(now, &mut store);
            }
            while let Some((_, mut b)) = rx.poll_transmit() {
                replies += 1;
                sender.handle(now, "10.0.0.2:6000".parse().unwrap(), &mut b);
            }
            while let Some(e) = rx.poll_event() {
                match e {
                    ReceiverEvent::Refused {
                        session,
                        sender,
                        why,
                    } => {
                        assert_eq!(why, "not sealed, and this receiver has no key");
                        refused.push((session, sender))
                    }
                    ReceiverEvent::Ended(r) => ended = Some(r),
                    _ => {}
                }
            }
            while sender.poll_event().is_some() {}
            now += Duration::from_millis(1);
        }
        if accept {
            assert!(refused.is_empty(), "{refused:?}");
            assert!(ended.expect("session ended").ok);
            assert_eq!(store.data, data);
        } else {
            assert!(announced > 1, "the sender announced {announced} times");
            assert_eq!(refused, vec![(78, saddr)], "one Refused per session");
            assert_eq!(replies, 0, "a refused session gets no REGISTER");
            assert!(ended.is_none());
            assert!(
                store.manifest.is_none() && store.writes == 0,
                "nothing stored"
            );
        }
    }
}
