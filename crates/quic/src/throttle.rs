//! Slows down whoever guesses tokens: a server refuses every session from an
//! address that sent wrong tokens, for a time that doubles with each further
//! wrong one. Sans-IO: the caller passes the time.
//!
//! The first [`FREE`] wrong tokens from an address cost nothing (a typo, a
//! stale file); then the address is refused for [`FIRST_BLOCK`], and each
//! wrong token after that doubles the time, up to [`MAX_BLOCK`]. A refused
//! session's token is not even looked at, so guesses cannot come faster than
//! the schedule, however many connections the guesser opens. A right token
//! forgets the address; so does [`FORGET_AFTER`] without a wrong one. 1,000
//! guesses from one address take over 16 hours instead of a fraction of a
//! second.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Wrong tokens an address may send before it is refused for a while.
pub(crate) const FREE: u32 = 5;
/// How long the first refusal lasts; each further wrong token doubles it.
pub(crate) const FIRST_BLOCK: Duration = Duration::from_secs(1);
/// The longest refusal.
pub(crate) const MAX_BLOCK: Duration = Duration::from_secs(60);
/// An address without a wrong token for this long starts afresh.
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Addresses remembered at most; beyond, the one quiet longest is forgotten.
const MAX_ADDRESSES: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Record {
    failures: u32,
    last: Instant,
    blocked_until: Option<Instant>,
}

/// Wrong tokens per address, and the refusals they earned.
#[derive(Debug, Default)]
pub(crate) struct AuthThrottle {
    by_addr: HashMap<IpAddr, Record>,
}

impl AuthThrottle {
    /// How much longer sessions from `addr` are refused (`None`: not refused).
    pub(crate) fn refused_for(&self, addr: IpAddr, now: Instant) -> Option<Duration> {
        let until = self.by_addr.get(&addr)?.blocked_until?;
        (until > now).then(|| until - now)
    }

    /// A wrong token from `addr`: returns how many it has sent in a row and,
    /// once past [`FREE`], how long it is now refused.
    pub(crate) fn failed(&mut self, addr: IpAddr, now: Instant) -> (u32, Option<Duration>) {
        if !self.by_addr.contains_key(&addr) && self.by_addr.len() >= MAX_ADDRESSES {
            self.by_addr
                .retain(|_, r| now.saturating_duration_since(r.last) < FORGET_AFTER);
            if self.by_addr.len() >= MAX_ADDRESSES {
                let quietest = self
                    .by_addr
                    .iter()
                    .min_by_key(|(_, r)| r.last)
                    .map(|(a, _)| *a);
                if let Some(a) = quietest {
                    self.by_addr.remove(&a);
                }
            }
        }
        let r = self.by_addr.entry(addr).or_insert(Record {
            failures: 0,
            last: now,
            blocked_until: None,
        });
        if now.saturating_duration_since(r.last) >= FORGET_AFTER {
            r.failures = 0;
        }
        r.failures += 1;
        r.last = now;
        let block = (r.failures > FREE).then(|| {
            let doublings = (r.failures - FREE - 1).min(16);
            (FIRST_BLOCK * 2u32.pow(doublings)).min(MAX_BLOCK)
        });
        r.blocked_until = block.map(|b| now + b);
        (r.failures, block)
    }

    /// A right token from `addr`: its wrong ones are forgotten.
    pub(crate) fn succeeded(&mut self, addr: IpAddr) {
        self.by_addr.remove(&addr);
    }
}

/// The block of addresses one client is counted by: an IPv4 address (also
/// one mapped into IPv6) as it is, an IPv6 one by its /64 (the block one
/// host is usually given: it could take a new address for each attempt).
pub(crate) fn client_block(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn the_first_wrong_tokens_are_free_then_refusals_double_up_to_a_minute() {
        let mut t = AuthThrottle::default();
        let mut now = Instant::now();
        for n in 1..=FREE {
            assert_eq!(t.failed(ip(1), now), (n, None));
            assert_eq!(t.refused_for(ip(1), now), None);
        }
        let mut want = FIRST_BLOCK;
        for n in FREE + 1..FREE + 10 {
            assert_eq!(t.failed(ip(1), now), (n, Some(want)));
            assert_eq!(t.refused_for(ip(1), now), Some(want));
            now += want - Duration::from_millis(1);
            assert!(t.refused_for(ip(1), now).is_some(), "still refused");
            now += Duration::from_millis(1);
            assert_eq!(t.refused_for(ip(1), now), None, "free to try again");
            want = (want * 2).min(MAX_BLOCK);
        }
        assert_eq!(want, MAX_BLOCK);
        // Another address is not affected.
        assert_eq!(t.refused_for(ip(2), now), None);
        assert_eq!(t.failed(ip(2), now), (1, None));
    }

    #[test]
    fn a_right_token_or_ten_quiet_minutes_forget_the_wrong_ones() {
        let mut t = AuthThrottle::default();
        let now = Instant::now();
        for _ in 0..FREE + 1 {
            t.failed(ip(1), now);
        }
        assert!(t.refused_for(ip(1), now).is_some());
        t.succeeded(ip(1));
        assert_eq!(t.refused_for(ip(1), now), None);
        assert_eq!(t.failed(ip(1), now), (1, None));

        for _ in 0..FREE + 3 {
            t.failed(ip(3), now);
        }
        let later = now + FORGET_AFTER;
        assert_eq!(t.refused_for(ip(3), later), None);
        assert_eq!(t.failed(ip(3), later), (1, None), "starts afresh");
    }

    #[test]
    fn a_thousand_guesses_take_hours_and_memory_stays_bounded() {
        let mut t = AuthThrottle::default();
        let mut now = Instant::now();
        let start = now;
        for _ in 0..1000 {
            if let Some(wait) = t.refused_for(ip(1), now) {
                now += wait;
            }
            t.failed(ip(1), now);
        }
        let took = now - start;
        assert!(took > Duration::from_secs(16 * 3600), "{took:?}");
        // Many guessers: the map never grows past its bound.
        for i in 0..(MAX_ADDRESSES as u32 + 100) {
            t.failed(IpAddr::from(i.to_be_bytes()), now);
        }
        assert!(t.by_addr.len() <= MAX_ADDRESSES);
    }
}

/// The path RTT a server last measured to each client (by
/// [`client_block`]), for a connection whose request comes before its own
/// handshake has measured one (0-RTT: [`crate::cc::CcHandle::seed_rtt`]).
/// At most [`RttMemory::CAP`] clients; the one heard from longest ago goes
/// first.
#[derive(Debug, Default)]
pub(crate) struct RttMemory(std::sync::Mutex<HashMap<IpAddr, (Duration, Instant)>>);

impl RttMemory {
    pub(crate) const CAP: usize = 4096;

    pub(crate) fn remember(&self, client: IpAddr, rtt: Duration) {
        let mut m = self.0.lock().unwrap();
        if m.len() >= Self::CAP && !m.contains_key(&client) {
            if let Some(oldest) = m.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| *k) {
                m.remove(&oldest);
            }
        }
        m.insert(client, (rtt, Instant::now()));
    }

    pub(crate) fn get(&self, client: IpAddr) -> Option<Duration> {
        self.0.lock().unwrap().get(&client).map(|(r, _)| *r)
    }
}

#[cfg(test)]
mod rtt_tests {
    use super::*;

    #[test]
    fn the_client_heard_from_longest_ago_goes_first_when_full() {
        let m = RttMemory::default();
        let ip = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(i));
        for i in 0..RttMemory::CAP as u32 {
            m.remember(ip(i), Duration::from_millis(i as u64));
        }
        m.remember(ip(0), Duration::from_millis(700));
        m.remember(ip(1 << 20), Duration::from_millis(5));
        assert_eq!(m.get(ip(0)), Some(Duration::from_millis(700)));
        assert_eq!(m.get(ip(1)), None, "the oldest went");
        assert_eq!(m.get(ip(1 << 20)), Some(Duration::from_millis(5)));
        assert_eq!(m.0.lock().unwrap().len(), RttMemory::CAP);
    }
}
