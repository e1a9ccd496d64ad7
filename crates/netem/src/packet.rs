//! The little of IPv4 the emulator reads: addresses, protocol and ports.

use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

/// A flow's 5-tuple (ports are 0 for protocols without them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FlowKey {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

/// What the header says, or why it could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parsed {
    V4(FlowKey),
    /// IPv6 or anything that is not IPv4.
    NotV4,
    /// Too short or an impossible header.
    Malformed,
}

pub(crate) fn parse(pkt: &[u8]) -> Parsed {
    let Some(&b0) = pkt.first() else {
        return Parsed::Malformed;
    };
    if b0 >> 4 != 4 {
        return Parsed::NotV4;
    }
    let ihl = (b0 & 0x0f) as usize * 4;
    if ihl < 20 || pkt.len() < ihl {
        return Parsed::Malformed;
    }
    let proto = pkt[9];
    let src = Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]);
    let dst = Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]);
    // Ports only in the first fragment of TCP, UDP, SCTP, UDP-Lite.
    let frag_offset = u16::from_be_bytes([pkt[6], pkt[7]]) & 0x1fff;
    let (sport, dport) = match proto {
        6 | 17 | 132 | 136 if frag_offset == 0 && pkt.len() >= ihl + 4 => (
            u16::from_be_bytes([pkt[ihl], pkt[ihl + 1]]),
            u16::from_be_bytes([pkt[ihl + 2], pkt[ihl + 3]]),
        ),
        _ => (0, 0),
    };
    Parsed::V4(FlowKey {
        src,
        dst,
        proto,
        sport,
        dport,
    })
}

/// True for multicast (224.0.0.0/4) and limited broadcast.
pub(crate) fn is_group(dst: Ipv4Addr) -> bool {
    dst.is_multicast() || dst.is_broadcast()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[9] = 17;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p
    }

    #[test]
    fn reads_the_five_tuple() {
        let p = udp([10, 77, 0, 1], [10, 77, 0, 2], 4000, 53);
        assert_eq!(
            parse(&p),
            Parsed::V4(FlowKey {
                src: Ipv4Addr::new(10, 77, 0, 1),
                dst: Ipv4Addr::new(10, 77, 0, 2),
                proto: 17,
                sport: 4000,
                dport: 53
            })
        );
    }

    #[test]
    fn rejects_what_is_not_ipv4() {
        assert_eq!(parse(&[]), Parsed::Malformed);
        assert_eq!(parse(&[0x60, 0, 0, 0]), Parsed::NotV4);
        assert_eq!(parse(&[0x45; 10]), Parsed::Malformed);
        let mut p = udp([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        p[0] = 0x43; // IHL 12 bytes: impossible
        assert_eq!(parse(&p), Parsed::Malformed);
    }

    #[test]
    fn later_fragments_have_no_ports() {
        let mut p = udp([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        p[7] = 10;
        let Parsed::V4(k) = parse(&p) else { panic!() };
        assert_eq!((k.sport, k.dport), (0, 0));
    }

    #[test]
    fn groups() {
        assert!(is_group(Ipv4Addr::new(239, 1, 2, 3)));
        assert!(is_group(Ipv4Addr::BROADCAST));
        assert!(!is_group(Ipv4Addr::new(10, 77, 0, 2)));
    }
}
