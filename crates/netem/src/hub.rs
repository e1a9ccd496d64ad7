//! The emulator's core: a hub with one port per host. A packet a host sends
//! crosses that host's `up` link, then the `down` link of the host it is
//! addressed to; a multicast or broadcast packet is copied to every other
//! host's `down` link, each copy meeting that link's own losses. Sans-IO: the
//! driver reads packets into pool buffers, hands them to `ingress`, and writes
//! out whatever `poll_egress` returns.

use crate::link::{DirCounters, DirLink, Offer, Series};
use crate::packet::{self, FlowKey, Parsed};
use crate::pool::{BufId, Pool};
use crate::spec::LinkSpec;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

/// One host on the hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostConfig {
    pub name: String,
    pub addr: Ipv4Addr,
    pub link: LinkSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HubConfig {
    pub hosts: Vec<HostConfig>,
    /// Seed of every random choice; the same seed and traffic replay the same losses.
    pub seed: u64,
    /// Largest packet (the ports' MTU).
    pub mtu: usize,
    /// Cap on buffered packets (memory = this × slot size).
    pub max_packets: u32,
}

/// Counts of packets the hub could not place.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HubCounters {
    /// IPv6 and other non-IPv4 packets (dropped).
    pub not_ipv4: u64,
    /// Packets too short or with an impossible header (dropped).
    pub malformed: u64,
    /// Unicast to an address no host has (dropped).
    pub unroutable: u64,
    /// Packets dropped because the buffer pool was at its cap.
    pub pool_exhausted: u64,
}

/// Per-flow counters (offered counts the sender's packets once; delivered
/// counts every copy that reached a host).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowCounters {
    pub offered_pkts: u64,
    pub offered_bytes: u64,
    pub delivered_pkts: u64,
    pub delivered_bytes: u64,
}

/// Flows beyond this many are not tracked individually.
pub const MAX_FLOWS: usize = 4096;
const NO_FLOW: u32 = u32::MAX;
const GROUP: u16 = u16::MAX;

#[derive(Clone, Copy)]
struct Pkt {
    buf: BufId,
    flow: u32,
    src: u16,
    dst: u16,
}

struct Port {
    name: String,
    addr: Ipv4Addr,
    link: LinkSpec,
    up: DirLink<Pkt>,
    down: DirLink<Pkt>,
}

/// A packet to write to `port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Egress {
    pub port: usize,
    pub buf: BufId,
    pub len: usize,
    /// When it was due (ns); the driver is late by `now - due`.
    pub due: u64,
}

pub struct Hub {
    ports: Vec<Port>,
    by_addr: FxHashMap<Ipv4Addr, u16>,
    pool: Pool,
    flows: FxHashMap<FlowKey, u32>,
    flow_keys: Vec<FlowKey>,
    flow_counters: Vec<FlowCounters>,
    pub counters: HubCounters,
    seed: u64,
}

impl Hub {
    pub fn new(cfg: &HubConfig) -> Hub {
        assert!(cfg.hosts.len() < GROUP as usize);
        let ports: Vec<Port> = cfg
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| Port {
                name: h.name.clone(),
                addr: h.addr,
                link: h.link,
                up: DirLink::new(h.link.up, mix(cfg.seed, 2 * i as u64)),
                down: DirLink::new(h.link.down, mix(cfg.seed, 2 * i as u64 + 1)),
            })
            .collect();
        let by_addr = ports
            .iter()
            .enumerate()
            .map(|(i, p)| (p.addr, i as u16))
            .collect();
        Hub {
            ports,
            by_addr,
            // One spare byte tells a full-MTU packet from a truncated larger one.
            pool: Pool::new(cfg.mtu + 1, cfg.max_packets),
            flows: FxHashMap::default(),
            flow_keys: Vec::new(),
            flow_counters: Vec::new(),
            counters: HubCounters::default(),
            seed: cfg.seed,
        }
    }

    pub fn ports(&self) -> usize {
        self.ports.len()
    }

    /// A free buffer to read a packet into; `None` when the pool is at its cap
    /// (the driver should then read and discard, counting it).
    pub fn alloc(&mut self) -> Option<BufId> {
        self.pool.get()
    }

    pub fn buf(&self, id: BufId) -> &[u8] {
        self.pool.buf(id)
    }

    pub fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        self.pool.buf_mut(id)
    }

    pub fn release(&mut self, id: BufId) {
        self.pool.put(id)
    }

    /// Counts a packet the driver had to discard for want of a buffer.
    pub fn count_pool_exhausted(&mut self) {
        self.counters.pool_exhausted += 1;
    }

    /// Takes ownership of `buf`, holding a `len`-byte packet `port`'s host sent at `now`.
    pub fn ingress(&mut self, now: u64, port: usize, buf: BufId, len: usize) {
        let key = match packet::parse(&self.pool.buf(buf)[..len]) {
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
        let flow = self.flow_index(key);
        if let Some(f) = self.flow_counters.get_mut(flow as usize) {
            f.offered_pkts += 1;
            f.offered_bytes += len as u64;
        }
        let pkt = Pkt {
            buf,
            flow,
            src: port as u16,
            dst,
        };
        match self.ports[port].up.offer(now, len as u32, pkt) {
            Offer::Accepted => {}
            Offer::Lost(p) | Offer::QueueFull(p) => self.pool.put(p.buf),
        }
    }

    fn flow_index(&mut self, key: FlowKey) -> u32 {
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
        i
    }

    /// Moves every packet whose `up` link delivers by `now` onto the `down`
    /// link(s) of its destination, in time order.
    fn cross_hub(&mut self, now: u64) {
        loop {
            let next = self
                .ports
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.up.next_due().map(|d| (d, i)))
                .min();
            let Some((due, i)) = next.filter(|&(d, _)| d <= now) else {
                return;
            };
            let (_, len, pkt) = self.ports[i].up.pop_due(due).expect("due packet");
            if pkt.dst != GROUP {
                self.offer_down(due, pkt.dst as usize, len, pkt);
                continue;
            }
            // Replicate: the original goes to the last receiver, copies to the others.
            let src = pkt.src as usize;
            let Some(last) = (0..self.ports.len()).rev().find(|&r| r != src) else {
                self.pool.put(pkt.buf);
                continue;
            };
            for r in 0..last {
                if r == src {
                    continue;
                }
                let Some(copy) = self.pool.get() else {
                    self.counters.pool_exhausted += 1;
                    continue;
                };
                self.pool.copy(pkt.buf, copy, len as usize);
                self.offer_down(due, r, len, Pkt { buf: copy, ..pkt });
            }
            self.offer_down(due, last, len, pkt);
        }
    }

    fn offer_down(&mut self, at: u64, port: usize, len: u32, pkt: Pkt) {
        match self.ports[port].down.offer(at, len, pkt) {
            Offer::Accepted => {}
            Offer::Lost(p) | Offer::QueueFull(p) => self.pool.put(p.buf),
        }
    }

    /// The next packet to write, if one is due at or before `now`. The driver
    /// writes `buf[..len]` to `port` and then calls `release(buf)`.
    pub fn poll_egress(&mut self, now: u64) -> Option<Egress> {
        self.cross_hub(now);
        let (due, port) = self
            .ports
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.down.next_due().map(|d| (d, i)))
            .min()
            .filter(|&(d, _)| d <= now)?;
        let (due, len, pkt) = self.ports[port].down.pop_due(due).expect("due packet");
        let down = &mut self.ports[port].down;
        down.counters.late.record(now - due);
        if let Some(f) = self.flow_counters.get_mut(pkt.flow as usize) {
            f.delivered_pkts += 1;
            f.delivered_bytes += len as u64;
        }
        Some(Egress {
            port,
            buf: pkt.buf,
            len: len as usize,
            due,
        })
    }

    /// The earliest time anything is due, to set the driver's timer.
    pub fn next_deadline(&self) -> Option<u64> {
        self.ports
            .iter()
            .flat_map(|p| [p.up.next_due(), p.down.next_due()])
            .flatten()
            .min()
    }

    /// Every counter, for `lab stats`.
    pub fn snapshot(&self, now: u64) -> Snapshot {
        let dir = |l: &DirLink<Pkt>| DirStats {
            counters: l.counters.clone(),
            in_flight: l.in_flight() as u64,
            series: l.series.clone(),
        };
        Snapshot {
            uptime_ms: now / 1_000_000,
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
            flows: self
                .flow_keys
                .iter()
                .zip(&self.flow_counters)
                .map(|(k, c)| FlowStats {
                    flow: *k,
                    counters: c.clone(),
                })
                .collect(),
            hub: self.counters.clone(),
            buffered_packets: self.pool.in_use() as u64,
        }
    }
}

/// Derives independent per-direction seeds from the lab seed (SplitMix64 finaliser).
fn mix(seed: u64, n: u64) -> u64 {
    let mut z = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirStats {
    #[serde(flatten)]
    pub counters: DirCounters,
    pub in_flight: u64,
    pub series: Series,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostStats {
    pub name: String,
    pub addr: Ipv4Addr,
    pub link: String,
    /// What the host sent (host → hub).
    pub up: DirStats,
    /// What the host received (hub → host).
    pub down: DirStats,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowStats {
    pub flow: FlowKey,
    #[serde(flatten)]
    pub counters: FlowCounters,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub uptime_ms: u64,
    pub seed: u64,
    pub hosts: Vec<HostStats>,
    pub flows: Vec<FlowStats>,
    pub hub: HubCounters,
    pub buffered_packets: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn hub(links: &[&str]) -> Hub {
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
            seed: 1,
            mtu: 1500,
            max_packets: 100_000,
        })
    }

    fn udp(h: &mut Hub, now: u64, from: usize, dst: [u8; 4], seq: u32, len: usize) {
        let id = h.alloc().unwrap();
        let b = h.buf_mut(id);
        b[..len].fill(0);
        b[0] = 0x45;
        b[9] = 17;
        b[12..16].copy_from_slice(&[10, 77, 0, from as u8 + 1]);
        b[16..20].copy_from_slice(&dst);
        b[20..22].copy_from_slice(&5000u16.to_be_bytes());
        b[22..24].copy_from_slice(&6000u16.to_be_bytes());
        b[28..32].copy_from_slice(&seq.to_be_bytes());
        h.ingress(now, from, id, len);
    }

    /// Everything delivered up to `until`: (port, due, seq).
    fn drain(h: &mut Hub, until: u64) -> Vec<(usize, u64, u32)> {
        let mut out = Vec::new();
        while let Some(e) = h.poll_egress(until) {
            let seq = u32::from_be_bytes(h.buf(e.buf)[28..32].try_into().unwrap());
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
                pool_exhausted: 0
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
}
