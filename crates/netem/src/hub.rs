//! The emulator's core: a hub with one port per host. A packet a host sends
//! crosses that host's `up` link, then the `down` link of the host it is
//! addressed to; a multicast or broadcast packet is copied to every other
//! host's `down` link, each copy meeting that link's own losses. Hosts may
//! stand behind a site (several data-transfer nodes behind one WAN link):
//! a unicast packet from a site's host to a host outside it also crosses
//! the site's `up` link, and one to a site's host from outside it the
//! site's `down` link, so the hosts of a site share that bottleneck. Sans-IO: the
//! driver reads packets into pool buffers, hands them to `ingress`, and writes
//! out whatever `poll_egress` returns.

use crate::gso::{self, Shape};
use crate::link::{DirCounters, DirLink, QueueSeries, Series};
use crate::packet::{self, FlowKey, Parsed};
use crate::pool::{BufId, Pool};
use crate::spec::{LinkSpec, Schedule};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

/// One host on the hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostConfig {
    /// The host's name, shown in snapshots.
    pub name: String,
    /// The host's IPv4 address: unicast packets to it leave through this
    /// host's port.
    pub addr: Ipv4Addr,
    /// The host's link to the hub (`up`: host → hub, `down`: hub → host).
    pub link: LinkSpec,
}

/// Hosts behind one shared link (a site's WAN link).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteConfig {
    /// The site's name, shown in snapshots.
    pub name: String,
    /// Its hosts, by port (index into [`HubConfig::hosts`]); a host is in
    /// one site at most.
    pub ports: Vec<u16>,
    /// The site's link to the hub (`up`: out of the site, `down`: into it),
    /// crossed by unicast between its hosts and hosts outside it.
    pub link: LinkSpec,
}

/// What [`Hub::new`] builds: the hosts, the seed, and frame and buffer sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HubConfig {
    /// One port per host, in this order (port `i` is `hosts[i]`).
    pub hosts: Vec<HostConfig>,
    /// Sites: hosts behind a shared link (none: every host on its own).
    #[serde(default)]
    pub sites: Vec<SiteConfig>,
    /// Seed of every random choice; the same seed and traffic replay the same losses.
    pub seed: u64,
    /// Largest packet on the wire (the ports' MTU).
    pub mtu: usize,
    /// Frames start with a `virtio_net_hdr` and may be TSO/USO aggregates of
    /// up to 64 KB (ports opened with `IFF_VNET_HDR` and offloads on).
    pub vnet_hdr: bool,
    /// Cap on the memory of packet buffers (bytes).
    pub buffer_bytes: u64,
}

/// Counts of packets the hub could not place.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HubCounters {
    /// IPv6 and other non-IPv4 packets (dropped).
    pub not_ipv4: u64,
    /// Packets too short, with an impossible header, or aggregates the
    /// emulator cannot cut (dropped).
    pub malformed: u64,
    /// Unicast to an address no host has (dropped).
    pub unroutable: u64,
    /// Packets dropped because the buffer pool was at its cap.
    pub pool_exhausted: u64,
    /// Frames taken in that stood for more than one wire segment (TSO/USO).
    #[serde(default)]
    pub aggregates_in: u64,
    /// Frames written that were cut from an aggregate (around a loss, or a
    /// train of a longer one).
    #[serde(default)]
    pub trains_cut: u64,
}

/// Per-flow counters (offered counts the sender's packets once; delivered
/// counts every copy that reached a host).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowCounters {
    /// Wire packets (segments of an aggregate counted one by one) the sender
    /// handed to the hub.
    pub offered_pkts: u64,
    /// IP bytes of those wire packets.
    pub offered_bytes: u64,
    /// Wire packets written to receiving hosts, every multicast copy counted.
    pub delivered_pkts: u64,
    /// IP bytes of those wire packets.
    pub delivered_bytes: u64,
    /// Wire packets the links dropped (the loss model, a full queue or an
    /// outage, on the sender's link or a receiver's), every multicast copy
    /// counted.
    #[serde(default)]
    pub dropped_pkts: u64,
}

/// Flows beyond this many are not tracked individually.
pub const MAX_FLOWS: usize = 4096;
/// A flow's 100 ms series is let go once the flow has delivered nothing for
/// this long, so that what the series hold follows the flows that are alive
/// (a lab that runs for hours sees thousands of flows come and go).
pub const FLOW_SERIES_IDLE_NS: u64 = 120_000_000_000;
const NO_FLOW: u32 = u32::MAX;
const GROUP: u16 = u16::MAX;

#[derive(Clone, Copy)]
struct Pkt {
    buf: BufId,
    flow: u32,
    src: u16,
    dst: u16,
    /// Length of the whole frame in `buf` (with its `virtio_net_hdr`, if any).
    frame_len: u32,
    shape: Shape,
}

struct Port {
    name: String,
    addr: Ipv4Addr,
    link: LinkSpec,
    up: DirLink<Pkt>,
    down: DirLink<Pkt>,
    /// The site it stands behind.
    site: Option<u16>,
}

struct Site {
    name: String,
    link: LinkSpec,
    up: DirLink<Pkt>,
    down: DirLink<Pkt>,
}

/// A link a train waits on before it is handed to the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    HostUp(usize),
    SiteUp(usize),
    SiteDown(usize),
}

/// A frame to write to `port`: get its bytes from [`Hub::egress_frame`], then
/// [`Hub::release`] its `buf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Egress {
    /// Port (index into [`HubConfig::hosts`]) whose host receives the frame.
    pub port: usize,
    /// Pool buffer holding the sender's whole frame; [`Hub::release`] it once
    /// the frame is written.
    pub buf: BufId,
    /// When it was due (ns); the driver is late by `now - due`.
    pub due: u64,
    /// Wire segments it carries.
    pub segs: u32,
    frame_len: u32,
    shape: Shape,
    first: u32,
}

impl Egress {
    /// True when it is the frame the sender gave, uncut.
    pub fn is_whole(&self) -> bool {
        self.first == 0 && self.segs == self.shape.segs
    }
}

/// The switch joining every host's link. A frame goes in with
/// [`Hub::ingress`] and comes out, when due, from [`Hub::poll_egress`]; time
/// is in ns and supplied by the caller.
pub struct Hub {
    ports: Vec<Port>,
    sites: Vec<Site>,
    by_addr: FxHashMap<Ipv4Addr, u16>,
    pool: Pool,
    vnet: usize,
    max_frame: usize,
    /// Where a cut train is built before it is written.
    scratch: Vec<u8>,
    flows: FxHashMap<FlowKey, u32>,
    flow_keys: Vec<FlowKey>,
    flow_counters: Vec<FlowCounters>,
    /// Each flow's delivered bytes per 100 ms, and when it last delivered
    /// (ns); None once it was idle for [`FLOW_SERIES_IDLE_NS`].
    flow_series: Vec<Option<(Series, u64)>>,
    /// Packets dropped before reaching any link, and aggregate counts.
    pub counters: HubCounters,
    seed: u64,
    /// When the schedule clock started (ns); None: held.
    schedule_epoch: Option<u64>,
}

impl Hub {
    /// A hub with one port per host of `cfg`, each link direction seeded from
    /// `cfg.seed`, and an empty buffer pool. Panics with 65535 hosts or more,
    /// or a site that names a port twice or one that is not there.
    pub fn new(cfg: &HubConfig) -> Hub {
        assert!(cfg.hosts.len() < GROUP as usize);
        let mut site_of = vec![None; cfg.hosts.len()];
        for (s, site) in cfg.sites.iter().enumerate() {
            for &p in &site.ports {
                assert!(
                    site_of[p as usize].is_none(),
                    "a host is in one site at most"
                );
                site_of[p as usize] = Some(s as u16);
            }
        }
        let n = cfg.hosts.len() as u64;
        let sites = cfg
            .sites
            .iter()
            .enumerate()
            .map(|(s, site)| Site {
                name: site.name.clone(),
                link: site.link.clone(),
                up: DirLink::new(site.link.up.clone(), mix(cfg.seed, 2 * (n + s as u64))),
                down: DirLink::new(
                    site.link.down.clone(),
                    mix(cfg.seed, 2 * (n + s as u64) + 1),
                ),
            })
            .collect();
        let ports: Vec<Port> = cfg
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| Port {
                name: h.name.clone(),
                addr: h.addr,
                link: h.link.clone(),
                up: DirLink::new(h.link.up.clone(), mix(cfg.seed, 2 * i as u64)),
                down: DirLink::new(h.link.down.clone(), mix(cfg.seed, 2 * i as u64 + 1)),
                site: site_of[i],
            })
            .collect();
        let by_addr = ports
            .iter()
            .enumerate()
            .map(|(i, p)| (p.addr, i as u16))
            .collect();
        let vnet = if cfg.vnet_hdr { gso::VNET_HDR_LEN } else { 0 };
        // One spare byte tells a frame that fits from a truncated larger one.
        let small = vnet + cfg.mtu + 1;
        let max_frame = if cfg.vnet_hdr { vnet + 65_536 } else { small };
        let mut sizes = vec![small];
        sizes.extend(
            [8 << 10, 24 << 10]
                .into_iter()
                .filter(|&s| s > small && s < max_frame),
        );
        if max_frame > small {
            sizes.push(max_frame);
        }
        Hub {
            ports,
            sites,
            by_addr,
            pool: Pool::new(&sizes, cfg.buffer_bytes as usize),
            vnet,
            max_frame,
            scratch: vec![0; max_frame],
            flows: FxHashMap::default(),
            flow_keys: Vec::new(),
            flow_counters: Vec::new(),
            flow_series: Vec::new(),
            counters: HubCounters::default(),
            seed: cfg.seed,
            schedule_epoch: Some(0),
        }
    }

    /// True when some link has outages or rate steps.
    pub fn has_schedule(&self) -> bool {
        self.ports.iter().any(|p| p.link.has_schedule())
            || self.sites.iter().any(|s| s.link.has_schedule())
    }

    /// (Re)starts the links' schedule clock at `now`: every link's outages
    /// and rate steps are then timed from `now`. A hub's clock starts at 0
    /// when it is made. Packets already accepted keep their fate.
    pub fn start_schedule(&mut self, now: u64) {
        self.set_epoch(Some(now));
    }

    /// Stops the schedule clock: every link is its base spec (up, at its
    /// base rate) until [`Hub::start_schedule`].
    pub fn hold_schedule(&mut self) {
        self.set_epoch(None);
    }

    fn set_epoch(&mut self, epoch: Option<u64>) {
        self.schedule_epoch = epoch;
        for p in &mut self.ports {
            p.up.set_epoch(epoch);
            p.down.set_epoch(epoch);
        }
        for s in &mut self.sites {
            s.up.set_epoch(epoch);
            s.down.set_epoch(epoch);
        }
    }

    /// Number of ports (one per host).
    pub fn ports(&self) -> usize {
        self.ports.len()
    }

    /// Bytes of `virtio_net_hdr` before each frame's IP packet (0 or 10).
    pub fn vnet_len(&self) -> usize {
        self.vnet
    }

    /// A free buffer large enough for any frame; `None` when the pool is at
    /// its cap (the driver should then read and discard, counting it). A
    /// frame that fills it was truncated.
    pub fn alloc(&mut self) -> Option<BufId> {
        self.pool.get(self.max_frame)
    }

    /// The whole slot `id` (its size class, usually longer than the frame).
    pub fn buf(&self, id: BufId) -> &[u8] {
        self.pool.buf(id)
    }

    /// The whole slot `id`, for the driver to read a frame into.
    pub fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        self.pool.buf_mut(id)
    }

    /// Drops the caller's reference to buffer `id`: after writing an
    /// [`Egress`], or after a read into it failed. The slot is reused once no
    /// train holds it.
    pub fn release(&mut self, id: BufId) {
        self.pool.put(id)
    }

    /// Counts a packet the driver had to discard for want of a buffer.
    pub fn count_pool_exhausted(&mut self) {
        self.counters.pool_exhausted += 1;
    }

    /// Takes ownership of `buf`, holding a `len`-byte frame `port`'s host sent at `now`.
    pub fn ingress(&mut self, now: u64, port: usize, buf: BufId, len: usize) {
        // A small frame moves to a small slot; the large one is free again.
        let buf = self.pool.compact(buf, len);
        let frame = &self.pool.buf(buf)[..len];
        let shape = if self.vnet == 0 {
            Ok(Shape::single(len as u32))
        } else {
            gso::shape(frame)
        };
        let parsed = match shape {
            Ok(_) => packet::parse(&frame[self.vnet..]),
            Err(_) => Parsed::Malformed,
        };
        let key = match parsed {
            Parsed::V4(k) => k,
            Parsed::NotV4 => {
                self.counters.not_ipv4 += 1;
                return self.pool.put(buf);
            }
            Parsed::Malformed => {
                self.counters.malformed += 1;
                return self.pool.put(buf);
            }
        };
        let shape = shape.expect("parsed");
        let dst = if packet::is_group(key.dst) {
            GROUP
        } else {
            match self.by_addr.get(&key.dst) {
                Some(&d) if d as usize != port => d,
                _ => {
                    self.counters.unroutable += 1;
                    return self.pool.put(buf);
                }
            }
        };
        if shape.segs > 1 {
            self.counters.aggregates_in += 1;
        }
        let flow = self.flow_index(key, now);
        if let Some(f) = self.flow_counters.get_mut(flow as usize) {
            f.offered_pkts += shape.segs as u64;
            f.offered_bytes += shape.wire_bytes(0, shape.segs);
        }
        let pkt = Pkt {
            buf,
            flow,
            src: port as u16,
            dst,
            frame_len: len as u32,
            shape,
        };
        let kept = offer(
            &mut self.ports[port].up,
            &mut self.flow_counters,
            now,
            0,
            shape.segs,
            pkt,
        );
        self.pool.hand_over(buf, kept);
    }

    fn flow_index(&mut self, key: FlowKey, now: u64) -> u32 {
        if let Some(&i) = self.flows.get(&key) {
            return i;
        }
        if self.flow_keys.len() >= MAX_FLOWS {
            return NO_FLOW;
        }
        let i = self.flow_keys.len() as u32;
        self.flows.insert(key, i);
        self.flow_keys.push(key);
        self.flow_counters.push(FlowCounters::default());
        self.flow_series.push(Some((Series::new(100), now)));
        // Let go of the series of flows that have gone quiet.
        for slot in &mut self.flow_series {
            if slot
                .as_ref()
                .is_some_and(|(_, last)| now.saturating_sub(*last) >= FLOW_SERIES_IDLE_NS)
            {
                *slot = None;
            }
        }
        i
    }

    /// Moves every train whose `up` link (a host's, or a site's) delivers by
    /// `now` on to the next link of its path, in time order: a site's `up`
    /// or `down` link, or the `down` link(s) of its destination. A multicast
    /// train is offered to every other host's `down` link (sites are not
    /// crossed); they share its buffer.
    fn cross_hub(&mut self, now: u64) {
        loop {
            let hosts = self.ports.iter().enumerate();
            let hosts = hosts.filter_map(|(i, p)| p.up.next_due().map(|d| (d, Stage::HostUp(i))));
            let sites = self.sites.iter().enumerate().flat_map(|(i, s)| {
                [
                    s.up.next_due().map(|d| (d, Stage::SiteUp(i))),
                    s.down.next_due().map(|d| (d, Stage::SiteDown(i))),
                ]
            });
            let next = hosts.chain(sites.flatten()).min();
            let Some((due, stage)) = next.filter(|&(d, _)| d <= now) else {
                return;
            };
            let link = match stage {
                Stage::HostUp(i) => &mut self.ports[i].up,
                Stage::SiteUp(i) => &mut self.sites[i].up,
                Stage::SiteDown(i) => &mut self.sites[i].down,
            };
            let t = link.pop_due(due).expect("due train");
            let pkt = t.item;
            let flows = &mut self.flow_counters;
            let kept = if pkt.dst != GROUP {
                let from = self.ports[pkt.src as usize].site;
                let to = self.ports[pkt.dst as usize].site;
                let next = match stage {
                    Stage::HostUp(_) if from.is_some() && from != to => {
                        &mut self.sites[from.unwrap() as usize].up
                    }
                    Stage::HostUp(_) | Stage::SiteUp(_) if to.is_some() && from != to => {
                        &mut self.sites[to.unwrap() as usize].down
                    }
                    _ => &mut self.ports[pkt.dst as usize].down,
                };
                offer(next, flows, t.due, t.first, t.count, pkt)
            } else {
                let mut kept = 0;
                for (r, port) in self.ports.iter_mut().enumerate() {
                    if r != pkt.src as usize {
                        kept += offer(&mut port.down, flows, t.due, t.first, t.count, pkt);
                    }
                }
                kept
            };
            self.pool.hand_over(pkt.buf, kept);
        }
    }

    /// The next frame to write, if one is due at or before `now`.
    pub fn poll_egress(&mut self, now: u64) -> Option<Egress> {
        self.cross_hub(now);
        let (due, port) = self
            .ports
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.down.next_due().map(|d| (d, i)))
            .min()
            .filter(|&(d, _)| d <= now)?;
        let t = self.ports[port].down.pop_due(due).expect("due train");
        self.ports[port].down.counters.late.record(now - t.due);
        if let Some(f) = self.flow_counters.get_mut(t.item.flow as usize) {
            f.delivered_pkts += t.count as u64;
            f.delivered_bytes += t.bytes;
        }
        if let Some(slot) = self.flow_series.get_mut(t.item.flow as usize) {
            // (A flow that was let go starts a new series when it delivers again.)
            let (s, last) = slot.get_or_insert_with(|| (Series::new(100), t.due));
            s.add(t.due, t.bytes);
            *last = (*last).max(t.due);
        }
        Some(Egress {
            port,
            buf: t.item.buf,
            due: t.due,
            segs: t.count,
            frame_len: t.item.frame_len,
            shape: t.item.shape,
            first: t.first,
        })
    }

    /// The bytes to write for `e`: the sender's frame itself, or the train's
    /// segments cut from it.
    pub fn egress_frame(&mut self, e: &Egress) -> &[u8] {
        let frame = &self.pool.buf(e.buf)[..e.frame_len as usize];
        if e.is_whole() {
            return frame;
        }
        self.counters.trains_cut += 1;
        let n = gso::build_run(frame, &e.shape, e.first, e.segs, &mut self.scratch);
        &self.scratch[..n]
    }

    /// The earliest time anything is due, to set the driver's timer.
    pub fn next_deadline(&self) -> Option<u64> {
        let sites = self.sites.iter().map(|s| (&s.up, &s.down));
        self.ports
            .iter()
            .map(|p| (&p.up, &p.down))
            .chain(sites)
            .flat_map(|(up, down)| [up.next_due(), down.next_due()])
            .flatten()
            .min()
    }

    /// Every counter, for `lab stats`.
    pub fn snapshot(&self, now: u64) -> Snapshot {
        let dir = |l: &DirLink<Pkt>| DirStats {
            counters: l.counters.clone(),
            in_flight: l.in_flight() as u64,
            series: l.series.clone(),
            queue: l.queue_series.clone(),
            schedule: (!l.spec().schedule.is_empty()).then(|| {
                let (down, rate_bps) = l.state_at(now);
                ScheduleNow {
                    schedule: l.spec().schedule.clone(),
                    down,
                    rate_bps,
                    next_change_ms: l.next_change_ms(now),
                }
            }),
        };
        Snapshot {
            uptime_ms: now / 1_000_000,
            schedule: self.has_schedule().then(|| ScheduleClock {
                started_ms: self.schedule_epoch.map(|e| e / 1_000_000),
                elapsed_ms: self
                    .schedule_epoch
                    .map(|e| now.saturating_sub(e) / 1_000_000),
            }),
            seed: self.seed,
            hosts: self
                .ports
                .iter()
                .map(|p| HostStats {
                    name: p.name.clone(),
                    addr: p.addr,
                    link: p.link.to_string(),
                    up: dir(&p.up),
                    down: dir(&p.down),
                })
                .collect(),
            sites: self
                .sites
                .iter()
                .enumerate()
                .map(|(i, s)| SiteStats {
                    name: s.name.clone(),
                    hosts: (self.ports.iter())
                        .filter(|p| p.site == Some(i as u16))
                        .map(|p| p.name.clone())
                        .collect(),
                    link: s.link.to_string(),
                    up: dir(&s.up),
                    down: dir(&s.down),
                })
                .collect(),
            flows: self
                .flow_keys
                .iter()
                .zip(&self.flow_counters)
                .enumerate()
                .map(|(i, (k, c))| FlowStats {
                    flow: *k,
                    counters: c.clone(),
                    series: self
                        .flow_series
                        .get(i)
                        .and_then(|x| x.as_ref())
                        .map(|x| x.0.clone()),
                })
                .collect(),
            hub: self.counters.clone(),
            buffered_packets: self.pool.in_use() as u64,
            buffer_bytes: self.pool.allocated_bytes() as u64,
            cpu_s: 0.0,
        }
    }
}

/// Offers segments `first..first + count` of `pkt` to `link` (see
/// `DirLink::offer`), and counts what the link dropped of them against the
/// packet's flow. Returns the number of trains kept.
fn offer(
    link: &mut DirLink<Pkt>,
    flows: &mut [FlowCounters],
    now: u64,
    first: u32,
    count: u32,
    pkt: Pkt,
) -> u32 {
    let before = link.counters.dropped_pkts();
    let kept = link.offer(now, &pkt.shape, first, count, pkt);
    if let Some(f) = flows.get_mut(pkt.flow as usize) {
        f.dropped_pkts += link.counters.dropped_pkts() - before;
    }
    kept
}

/// Derives independent per-direction seeds from the lab seed (SplitMix64 finaliser).
fn mix(seed: u64, n: u64) -> u64 {
    let mut z = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One direction of a host's link, in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirStats {
    /// Offered, lost, queue-dropped and delivered wire packets and IP bytes,
    /// queue high-water mark, lateness of delivery.
    #[serde(flatten)]
    pub counters: DirCounters,
    /// Trains (runs of segments delivered together, not packets) accepted
    /// and not yet delivered.
    pub in_flight: u64,
    /// Delivered IP bytes per 100 ms, counted at their due time.
    pub series: Series,
    /// The least queueing delay per 100 ms (rate-limited directions).
    #[serde(default)]
    pub queue: QueueSeries,
    /// The direction's schedule and where it stands, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleNow>,
}

/// A direction's schedule and its state when a [`Snapshot`] was taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleNow {
    /// The outages and rate steps of its spec.
    #[serde(flatten)]
    pub schedule: Schedule,
    /// The link is in an outage.
    pub down: bool,
    /// The rate in force, bit/s (None: unlimited).
    pub rate_bps: Option<u64>,
    /// When the next outage begins or ends or the rate changes, ms on the
    /// schedule clock; None when nothing more is scheduled or the clock is
    /// held.
    pub next_change_ms: Option<u64>,
}

/// The links' schedule clock, in a [`Snapshot`] of a hub with a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleClock {
    /// The hub's clock (as `uptime_ms`) when the schedule clock last
    /// started; None while it is held (every link its base spec).
    pub started_ms: Option<u64>,
    /// The schedule clock now, ms since it started; None while held.
    pub elapsed_ms: Option<u64>,
}

/// One host's port, in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostStats {
    /// The host's name ([`HostConfig::name`]).
    pub name: String,
    /// The host's IPv4 address.
    pub addr: Ipv4Addr,
    /// The host's link spec as canonical text (`ideal` for a link that does
    /// nothing).
    pub link: String,
    /// What the host sent (host → hub).
    pub up: DirStats,
    /// What the host received (hub → host).
    pub down: DirStats,
}

/// One site's shared link, in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteStats {
    /// The site's name ([`SiteConfig::name`]).
    pub name: String,
    /// Its hosts' names.
    pub hosts: Vec<String>,
    /// The site's link spec as canonical text.
    pub link: String,
    /// What left the site (site → hub).
    pub up: DirStats,
    /// What entered it (hub → site).
    pub down: DirStats,
}

/// One tracked flow, in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowStats {
    /// Source and destination address, IP protocol and ports (0 for
    /// protocols without ports and for non-first fragments).
    pub flow: FlowKey,
    /// What the flow offered to the hub and what reached hosts.
    #[serde(flatten)]
    pub counters: FlowCounters,
    /// IP bytes delivered per 100 ms, counted at their due time, from the
    /// flow's first delivery; none once it has been idle for
    /// [`FLOW_SERIES_IDLE_NS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<Series>,
}

/// Every counter of a hub at one moment: what `lab stats` returns and what
/// the benchmark's metrics read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The hub's clock when the snapshot was taken, ms; the driver's clock
    /// starts at 0 when the driver is created.
    pub uptime_ms: u64,
    /// The schedule clock, when some link has outages or rate steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleClock>,
    /// The seed the hub was built with ([`HubConfig::seed`]).
    pub seed: u64,
    /// One entry per port, in port order.
    pub hosts: Vec<HostStats>,
    /// One entry per site, in the order configured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<SiteStats>,
    /// Per-flow counters, in the order flows were first seen (at most
    /// [`MAX_FLOWS`]).
    pub flows: Vec<FlowStats>,
    /// Packets dropped before reaching any link, and aggregate counts.
    pub hub: HubCounters,
    /// Buffers holding packets (a shared buffer counts once).
    pub buffered_packets: u64,
    /// Memory the buffer pool has grown to.
    #[serde(default)]
    pub buffer_bytes: u64,
    /// CPU seconds (user + system, every thread) the emulator's process has
    /// used so far: set by the driver, 0 from a hub alone.
    #[serde(default)]
    pub cpu_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn hub(links: &[&str]) -> Hub {
        hub_with(links, false)
    }

    fn hub_with(links: &[&str], vnet_hdr: bool) -> Hub {
        let hosts = links
            .iter()
            .enumerate()
            .map(|(i, l)| HostConfig {
                name: format!("h{i}"),
                addr: Ipv4Addr::new(10, 77, 0, i as u8 + 1),
                link: l.parse().unwrap(),
            })
            .collect();
        Hub::new(&HubConfig {
            hosts,
            sites: Vec::new(),
            seed: 1,
            mtu: 1500,
            vnet_hdr,
            buffer_bytes: 256 << 20,
        })
    }

    /// Hosts h0..h3 on ideal links: h0 and h1 behind site `a` (`a_link`),
    /// h2 and h3 behind site `b` (ideal).
    fn two_sites(a_link: &str) -> Hub {
        let mut h = hub(&["", "", "", ""]);
        let cfg = HubConfig {
            hosts: h
                .ports
                .iter()
                .map(|p| HostConfig {
                    name: p.name.clone(),
                    addr: p.addr,
                    link: p.link.clone(),
                })
                .collect(),
            sites: vec![
                SiteConfig {
                    name: "a".into(),
                    ports: vec![0, 1],
                    link: a_link.parse().unwrap(),
                },
                SiteConfig {
                    name: "b".into(),
                    ports: vec![2, 3],
                    link: LinkSpec::default(),
                },
            ],
            seed: 1,
            mtu: 1500,
            vnet_hdr: false,
            buffer_bytes: 256 << 20,
        };
        h = Hub::new(&cfg);
        h
    }

    #[test]
    fn hosts_of_a_site_share_its_link_to_other_sites_not_to_each_other() {
        // Site a's link: 35 ms each way, 12 Mbit/s (1 ms per 1500 bytes).
        let mut h = two_sites("delay=35ms rate=12M");
        // Within the site: no delay.
        udp(&mut h, 0, 0, [10, 77, 0, 2], 1, 1500);
        assert_eq!(drain(&mut h, 0), vec![(1, 0, 1)]);
        // h0 -> h2 and h1 -> h3 at once: both cross a's up link, one after
        // the other.
        udp(&mut h, 0, 0, [10, 77, 0, 3], 2, 1500);
        udp_from(&mut h, 0, 1, 5000, [10, 77, 0, 4], 3, 1500);
        assert_eq!(
            drain(&mut h, u64::MAX),
            vec![(2, 36 * MS, 2), (3, 37 * MS, 3)]
        );
        // The way back crosses a's down link: 35 ms and its rate.
        udp(&mut h, 100 * MS, 3, [10, 77, 0, 1], 4, 1500);
        assert_eq!(drain(&mut h, u64::MAX), vec![(0, 136 * MS, 4)]);
        let s = h.snapshot(200 * MS);
        assert_eq!(s.sites[0].hosts, ["h0", "h1"]);
        assert_eq!(s.sites[0].up.counters.delivered_pkts, 2);
        assert_eq!(s.sites[0].down.counters.delivered_pkts, 1);
        assert_eq!(s.sites[1].down.counters.delivered_pkts, 2);
        assert_eq!(h.pool.in_use(), 0);
    }

    fn udp(h: &mut Hub, now: u64, from: usize, dst: [u8; 4], seq: u32, len: usize) {
        udp_from(h, now, from, 5000, dst, seq, len);
    }

    /// A UDP datagram from source port `sport` (another flow than `udp`'s).
    fn udp_from(
        h: &mut Hub,
        now: u64,
        from: usize,
        sport: u16,
        dst: [u8; 4],
        seq: u32,
        len: usize,
    ) {
        let id = h.alloc().unwrap();
        let b = h.buf_mut(id);
        b[..len].fill(0);
        b[0] = 0x45;
        b[9] = 17;
        b[12..16].copy_from_slice(&[10, 77, 0, from as u8 + 1]);
        b[16..20].copy_from_slice(&dst);
        b[20..22].copy_from_slice(&sport.to_be_bytes());
        b[22..24].copy_from_slice(&6000u16.to_be_bytes());
        b[28..32].copy_from_slice(&seq.to_be_bytes());
        h.ingress(now, from, id, len);
    }

    /// Everything delivered up to `until`: (port, due, seq).
    fn drain(h: &mut Hub, until: u64) -> Vec<(usize, u64, u32)> {
        let mut out = Vec::new();
        while let Some(e) = h.poll_egress(until) {
            assert!(e.is_whole());
            let seq = u32::from_be_bytes(h.egress_frame(&e)[28..32].try_into().unwrap());
            out.push((e.port, e.due, seq));
            h.release(e.buf);
        }
        out
    }

    #[test]
    fn unicast_crosses_the_senders_up_and_the_receivers_down_link() {
        // Server ideal; client 35 ms each way: RTT 70 ms between them.
        let mut h = hub(&["", "delay=35ms"]);
        udp(&mut h, 0, 0, [10, 77, 0, 2], 1, 100);
        assert_eq!(h.next_deadline(), Some(0));
        assert_eq!(drain(&mut h, 35 * MS - 1), vec![]);
        assert_eq!(drain(&mut h, 35 * MS), vec![(1, 35 * MS, 1)]);
        udp(&mut h, 40 * MS, 1, [10, 77, 0, 1], 2, 100);
        assert_eq!(h.next_deadline(), Some(75 * MS));
        assert_eq!(drain(&mut h, u64::MAX), vec![(0, 75 * MS, 2)]);
        assert_eq!(h.pool.in_use(), 0);
    }

    #[test]
    fn client_to_client_crosses_both_links() {
        let mut h = hub(&["", "delay=10ms", "delay=20ms"]);
        udp(&mut h, 0, 1, [10, 77, 0, 3], 7, 100);
        assert_eq!(drain(&mut h, u64::MAX), vec![(2, 30 * MS, 7)]);
    }

    #[test]
    fn multicast_reaches_every_other_host_with_independent_losses() {
        let mut h = hub(&["", "loss=0.2", "loss=0.2"]);
        let n = 20_000;
        for seq in 0..n {
            udp(&mut h, seq as u64, 0, [239, 1, 1, 1], seq, 200);
        }
        let got = drain(&mut h, u64::MAX);
        let at = |p| {
            got.iter()
                .filter(|g| g.0 == p)
                .map(|g| g.2)
                .collect::<Vec<_>>()
        };
        let (a, b) = (at(1), at(2));
        assert!(at(0).is_empty(), "the sender gets no copy");
        for v in [&a, &b] {
            let rate = 1.0 - v.len() as f64 / n as f64;
            assert!((rate - 0.2).abs() < 0.015, "loss {rate}");
        }
        // Independent: both lost ≈ 0.04 of packets.
        let both_lost = (0..n)
            .filter(|s| a.binary_search(s).is_err() && b.binary_search(s).is_err())
            .count() as f64
            / n as f64;
        assert!((both_lost - 0.04).abs() < 0.01, "both lost {both_lost}");
        assert_eq!(h.pool.in_use(), 0);
    }

    #[test]
    fn what_cannot_be_routed_is_counted_and_freed() {
        let mut h = hub(&["", ""]);
        udp(&mut h, 0, 0, [10, 77, 0, 99], 0, 100);
        udp(&mut h, 0, 0, [10, 77, 0, 1], 0, 100); // to itself
        let id = h.alloc().unwrap();
        h.buf_mut(id)[0] = 0x60;
        h.ingress(0, 1, id, 40);
        let id = h.alloc().unwrap();
        h.buf_mut(id)[0] = 0x45;
        h.ingress(0, 1, id, 3);
        assert_eq!(
            h.counters,
            HubCounters {
                not_ipv4: 1,
                malformed: 1,
                unroutable: 2,
                ..Default::default()
            }
        );
        assert_eq!(h.pool.in_use(), 0);
    }

    #[test]
    fn flows_and_lateness_are_counted() {
        let mut h = hub(&["", "delay=1ms"]);
        for s in 0..10 {
            udp(&mut h, 0, 0, [10, 77, 0, 2], s, 500);
        }
        // Polled 3 µs after the due time.
        let mut n = 0;
        while let Some(e) = h.poll_egress(MS + 3000) {
            h.release(e.buf);
            n += 1;
        }
        assert_eq!(n, 10);
        let s = h.snapshot(2 * MS);
        assert_eq!(s.flows.len(), 1);
        assert_eq!(s.flows[0].counters.delivered_bytes, 5000);
        assert_eq!(s.flows[0].flow.dport, 6000);
        assert_eq!(s.hosts[1].down.counters.late.max_ns, 3000);
        assert_eq!(s.hosts[1].down.counters.delivered_pkts, 10);
        assert_eq!(s.hosts[0].up.counters.offered_bytes, 5000);
        assert_eq!(s.hosts[1].link, "delay=1ms");
        // Per 100 ms, from the flow's first delivery (1 ms in: bucket 0).
        let series = s.flows[0].series.as_ref().expect("a flow series");
        assert_eq!((series.first, series.bytes.iter().sum::<u64>()), (0, 5000));
    }

    #[test]
    fn each_flow_keeps_its_own_series_from_its_first_delivery() {
        let mut h = hub(&["", "delay=10ms"]);
        udp(&mut h, 0, 0, [10, 77, 0, 2], 0, 500);
        // A second flow (another source port) 250 ms later, twice.
        for k in 0..2u64 {
            udp_from(
                &mut h,
                (250 + 100 * k) * MS,
                0,
                5001,
                [10, 77, 0, 2],
                0,
                300,
            );
        }
        assert_eq!(drain(&mut h, 500 * MS).len(), 3);
        let s = h.snapshot(500 * MS);
        assert_eq!(s.flows.len(), 2);
        let a = s.flows[0].series.as_ref().unwrap();
        let b = s.flows[1].series.as_ref().unwrap();
        assert_eq!((a.first, Vec::from(a.bytes.clone())), (0, vec![500]));
        assert_eq!((b.first, Vec::from(b.bytes.clone())), (2, vec![300, 300]));
        assert_eq!(s.flows[1].flow.sport, 5001);
    }

    #[test]
    fn a_flows_drops_are_counted_on_every_link_it_crosses() {
        // Unicast: the sender's link holds 4 in its queue, the receiver's 2.
        let mut h = hub(&["rate=1M queue=4pkts", "rate=1M queue=2pkts"]);
        for s in 0..10 {
            udp(&mut h, 0, 0, [10, 77, 0, 2], s, 500);
        }
        let got = drain(&mut h, 2000 * MS).len() as u64;
        let s = h.snapshot(2000 * MS);
        let f = &s.flows[0].counters;
        let (up, down) = (&s.hosts[0].up.counters, &s.hosts[1].down.counters);
        assert!(up.queue_drop_pkts > 0, "{up:?}");
        assert_eq!(f.dropped_pkts, up.queue_drop_pkts + down.queue_drop_pkts);
        assert_eq!((f.offered_pkts, f.delivered_pkts), (10, got));
        assert_eq!(f.dropped_pkts + got, 10);
        // Multicast: each receiver's link drops its own copies.
        let mut h = hub(&["", "rate=1M queue=2pkts", "rate=1M queue=3pkts"]);
        for s in 0..10 {
            udp(&mut h, 0, 0, [239, 1, 1, 1], s, 500);
        }
        let got = drain(&mut h, 2000 * MS).len() as u64;
        let s = h.snapshot(2000 * MS);
        let f = &s.flows[0].counters;
        let drops: u64 = s.hosts[1..]
            .iter()
            .map(|x| x.down.counters.queue_drop_pkts)
            .sum();
        assert!(drops >= 10, "{drops}");
        assert_eq!(f.dropped_pkts, drops);
        assert_eq!(f.delivered_pkts, got);
        assert_eq!(f.dropped_pkts + got, 20, "two copies of each");
    }

    #[test]
    fn a_quiet_flows_series_is_let_go_and_starts_again_when_it_delivers() {
        let mut h = hub(&["", ""]);
        udp(&mut h, 0, 0, [10, 77, 0, 2], 0, 500);
        drain(&mut h, MS);
        // Another flow 130 s later: the first has been quiet for over 120 s.
        udp_from(&mut h, 130_000 * MS, 0, 5001, [10, 77, 0, 2], 0, 300);
        drain(&mut h, 130_001 * MS);
        let s = h.snapshot(130_001 * MS);
        assert!(s.flows[0].series.is_none(), "{:?}", s.flows[0].series);
        assert_eq!(s.flows[0].counters.delivered_bytes, 500, "counters stay");
        assert!(s.flows[1].series.is_some());
        // The first flow delivers again at 140 s: a new series from there.
        udp(&mut h, 140_000 * MS, 0, [10, 77, 0, 2], 1, 500);
        drain(&mut h, 140_001 * MS);
        let s = h.snapshot(140_001 * MS);
        let series = s.flows[0].series.as_ref().expect("started again");
        assert_eq!(
            (series.first, Vec::from(series.bytes.clone())),
            (1400, vec![500])
        );
    }

    /// Sends a datagram each way between hosts 0 and 1 every ms over
    /// `[0, secs)`; returns the sequence numbers (send ms) each host got.
    fn both_ways(h: &mut Hub, secs: u32) -> [Vec<u32>; 2] {
        let mut got = [Vec::new(), Vec::new()];
        for ms in 0..secs * 1000 {
            let now = ms as u64 * MS;
            for (port, _, seq) in drain(h, now) {
                got[port].push(seq);
            }
            udp(h, now, 0, [10, 77, 0, 2], ms, 200);
            udp(h, now, 1, [10, 77, 0, 1], ms, 200);
        }
        for (port, _, seq) in drain(h, u64::MAX) {
            got[port].push(seq);
        }
        got
    }

    #[test]
    fn an_outage_with_a_direction_prefix_takes_down_that_direction_only() {
        // Host 1 receives nothing from 1 s to 2 s; what it sends passes.
        let mut h = hub(&["", "delay=5ms down:outage=1s@1s"]);
        let [at0, at1] = both_ways(&mut h, 3);
        assert_eq!(at0, (0..3000).collect::<Vec<u32>>());
        let want: Vec<u32> = (0..3000).filter(|t| !(1000..2000).contains(t)).collect();
        assert_eq!(at1, want);
        let s = h.snapshot(3000 * MS);
        let (up, down) = (&s.hosts[1].up, &s.hosts[1].down);
        assert_eq!(up.counters.outage_drop_pkts, 0);
        assert_eq!(down.counters.outage_drop_pkts, 1000);
        assert_eq!(down.counters.lost_pkts + down.counters.queue_drop_pkts, 0);
        assert!(up.schedule.is_none());
        // The flow from host 0 to host 1 counts them as its drops.
        let f = s
            .flows
            .iter()
            .find(|f| f.flow.dst == Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(f.unwrap().counters.dropped_pkts, 1000);
        // Without a prefix both directions go down.
        let mut h = hub(&["", "delay=5ms outage=1s@1s"]);
        let [at0, at1] = both_ways(&mut h, 3);
        assert_eq!((at0.len(), at1.len()), (2000, 2000));
        assert!(!at0.contains(&1500) && at0.contains(&2000));
    }

    #[test]
    fn the_snapshot_shows_the_schedule_and_where_it_stands() {
        let mut h = hub(&["", "rate=100M delay=5ms rate=10M@3s+1s down:outage=1s@1s"]);
        let s = h.snapshot(1500 * MS);
        let clock = s.schedule.as_ref().unwrap();
        assert_eq!((clock.started_ms, clock.elapsed_ms), (Some(0), Some(1500)));
        let down = s.hosts[1].down.schedule.as_ref().unwrap();
        assert!(down.down);
        assert_eq!(down.rate_bps, Some(100_000_000));
        assert_eq!(down.next_change_ms, Some(2000));
        assert_eq!(down.schedule.outages.len(), 1);
        let up = s.hosts[1].up.schedule.as_ref().unwrap();
        assert!(!up.down);
        assert_eq!(up.next_change_ms, Some(3000));
        assert_eq!(
            s.hosts[1].link,
            "rate=100M delay=5ms rate=10M@3s+1s down:outage=1s@1s"
        );
        // Restarted at 10 s: 3.5 s into it the step holds.
        h.start_schedule(10_000 * MS);
        let s = h.snapshot(13_500 * MS);
        let up = s.hosts[1].up.schedule.as_ref().unwrap();
        assert_eq!((up.down, up.rate_bps), (false, Some(10_000_000)));
        assert_eq!(s.schedule.as_ref().unwrap().elapsed_ms, Some(3500));
        // Held: base spec, nothing next.
        h.hold_schedule();
        let s = h.snapshot(13_500 * MS);
        let up = s.hosts[1].up.schedule.as_ref().unwrap();
        assert_eq!((up.rate_bps, up.next_change_ms), (Some(100_000_000), None));
        assert_eq!(s.schedule.as_ref().unwrap().started_ms, None);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["hosts"][1]["down"]["schedule"]["outages"][0]["dur_ns"],
            1_000_000_000u64
        );
        assert_eq!(json["hosts"][1]["down"]["outage_drop_pkts"], 0);
        // A hub without a schedule says nothing of one.
        let s = hub(&["", "delay=5ms"]).snapshot(0);
        assert!(s.schedule.is_none() && s.hosts[1].down.schedule.is_none());
        let json = serde_json::to_value(&s).unwrap();
        assert!(json.get("schedule").is_none());
    }

    #[test]
    fn the_same_seed_replays_the_same_losses() {
        let run = || {
            let mut h = hub(&["", "loss=0.3 delay=1ms"]);
            for s in 0..500 {
                udp(&mut h, s as u64 * 1000, 0, [10, 77, 0, 2], s, 100);
            }
            drain(&mut h, u64::MAX)
        };
        assert_eq!(run(), run());
    }

    /// Bytes without a period, so a payload is found at one offset only.
    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Sends a TCP or UDP aggregate of `data` from host 0 to `dst` and
    /// returns, per receiving port, the (offset, payload) of every frame
    /// written, cut trains included.
    fn send_aggregate(
        h: &mut Hub,
        proto: u8,
        dst: [u8; 4],
        data: &[u8],
    ) -> Vec<(usize, usize, Vec<u8>)> {
        let mut f = crate::gso::tests::aggregate(proto, data, 1448, 0x10);
        f[gso::VNET_HDR_LEN + 16..gso::VNET_HDR_LEN + 20].copy_from_slice(&dst);
        let id = h.alloc().unwrap();
        h.buf_mut(id)[..f.len()].copy_from_slice(&f);
        h.ingress(0, 0, id, f.len());
        let mut got = Vec::new();
        while let Some(e) = h.poll_egress(u64::MAX) {
            let frame = h.egress_frame(&e).to_vec();
            h.release(e.buf);
            let ip = &frame[gso::VNET_HDR_LEN..];
            assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, ip.len());
            let (off, hdr) = if proto == 6 {
                let seq = u32::from_be_bytes([ip[24], ip[25], ip[26], ip[27]]);
                (seq.wrapping_sub(0xffff_f000) as usize, 40)
            } else {
                // UDP trains only start at segment boundaries: find it by content.
                let p = &ip[28..];
                let at = data.windows(p.len()).position(|w| w == p).unwrap();
                (at, 28)
            };
            let vh = gso::VnetHdr::parse(&frame);
            assert_eq!(vh.gso_type != gso::GSO_NONE, e.segs > 1);
            assert_eq!(
                ip.len() - hdr,
                data[off..].len().min(e.segs as usize * 1448)
            );
            got.push((e.port, off, ip[hdr..].to_vec()));
        }
        got
    }

    #[test]
    fn an_aggregate_arrives_whole_over_a_clean_path() {
        let mut h = hub_with(&["", "rate=1G delay=10ms"], true);
        let data = noise(60_000);
        let got = send_aggregate(&mut h, 6, [10, 77, 0, 2], &data);
        assert_eq!(got, vec![(1, 0, data.clone())]);
        let s = h.snapshot(0);
        assert_eq!((s.hub.aggregates_in, s.hub.trains_cut), (1, 0));
        let segs = data.len().div_ceil(1448) as u64;
        assert_eq!(s.hosts[1].down.counters.delivered_pkts, segs);
        assert_eq!(
            s.hosts[1].down.counters.delivered_bytes,
            data.len() as u64 + 40 * segs
        );
        assert_eq!(s.flows[0].counters.offered_pkts, segs);
        assert_eq!(h.pool.in_use(), 0);
    }

    #[test]
    fn a_lossy_path_delivers_exactly_the_segments_that_survived() {
        let data = noise(60_000);
        for proto in [6, 17] {
            let mut h = hub_with(&["", "loss=0.2 delay=10ms"], true);
            let got = send_aggregate(&mut h, proto, [10, 77, 0, 2], &data);
            let c = &h.snapshot(0).hosts[1].down.counters;
            assert!(c.lost_pkts > 0 && got.len() > 1, "cut into trains: {c:?}");
            assert_eq!(h.counters.trains_cut, got.len() as u64);
            // Every byte that arrived is the sender's byte at that offset,
            // trains do not overlap, and what is missing is what was lost.
            let mut covered = vec![false; data.len()];
            for (_, off, payload) in &got {
                assert_eq!(&data[*off..off + payload.len()], &payload[..]);
                for c in &mut covered[*off..off + payload.len()] {
                    assert!(!*c, "overlap");
                    *c = true;
                }
            }
            let missing = covered.iter().filter(|c| !**c).count() as u64;
            let hdr = if proto == 6 { 40 } else { 28 };
            assert_eq!(missing, c.lost_bytes - hdr * c.lost_pkts);
            assert_eq!(h.pool.in_use(), 0);
        }
    }

    #[test]
    fn a_multicast_aggregate_is_shared_and_lost_independently() {
        let mut h = hub_with(&["", "loss=0.3", "loss=0.3", ""], true);
        let data = noise(40_000);
        let got = send_aggregate(&mut h, 17, [239, 1, 2, 3], &data);
        let bytes = |p| {
            got.iter()
                .filter(|g| g.0 == p)
                .map(|g| g.2.len())
                .sum::<usize>()
        };
        assert_eq!(bytes(0), 0, "the sender gets no copy");
        assert_eq!(bytes(3), data.len(), "the clean receiver gets it all");
        assert!(bytes(1) < data.len() && bytes(2) < data.len());
        let offsets = |p| {
            got.iter()
                .filter(|g| g.0 == p)
                .map(|g| g.1)
                .collect::<Vec<_>>()
        };
        assert_ne!(offsets(1), offsets(2), "independent losses");
        assert_eq!(h.pool.in_use(), 0);
    }

    #[test]
    fn aggregates_it_cannot_cut_are_dropped_and_counted() {
        let mut h = hub_with(&["", ""], true);
        let mut f = crate::gso::tests::aggregate(6, &[7; 5000], 1448, 0);
        f[0] = 0; // no partial checksum
        let id = h.alloc().unwrap();
        h.buf_mut(id)[..f.len()].copy_from_slice(&f);
        h.ingress(0, 0, id, f.len());
        let id = h.alloc().unwrap();
        h.ingress(0, 0, id, 4); // shorter than its header
        assert_eq!(h.counters.malformed, 2);
        assert_eq!(h.pool.in_use(), 0);
    }
}
