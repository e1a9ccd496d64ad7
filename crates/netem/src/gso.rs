//! Segmentation offload, as a TUN device with `IFF_VNET_HDR` hands it over.
//!
//! With TSO/USO enabled on the ports, a host's kernel gives the emulator one
//! frame per TCP (or UDP-GSO) aggregate: a 10-byte `virtio_net_hdr`, then an
//! IPv4 packet of up to 64 KB standing for several wire segments of
//! `gso_size` payload bytes each. The links model every wire segment (queue
//! slot, serialisation time, loss draw); the emulator writes an aggregate
//! back whole when all of its segments arrive together, and cuts it here, as
//! the kernel's own segmentation would, when some were lost or when it has to
//! arrive as several trains.

/// Bytes of the `virtio_net_hdr` before each packet.
pub(crate) const VNET_HDR_LEN: usize = 10;
/// The checksum is partial: the receiver need not verify it.
pub(crate) const F_NEEDS_CSUM: u8 = 1;
pub(crate) const GSO_NONE: u8 = 0;
pub(crate) const GSO_TCPV4: u8 = 1;
pub(crate) const GSO_UDP_L4: u8 = 5;
pub(crate) const GSO_ECN: u8 = 0x80;

/// `struct virtio_net_hdr` (native byte order, as TUN uses by default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Reads the header at the start of `frame` (which must hold one).
    pub(crate) fn parse(frame: &[u8]) -> VnetHdr {
        let u = |i: usize| u16::from_ne_bytes([frame[i], frame[i + 1]]);
        VnetHdr {
            flags: frame[0],
            gso_type: frame[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        }
    }

    pub(crate) fn write(&self, out: &mut [u8]) {
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
    }
}

/// How a packet maps onto wire segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// IP + TCP/UDP header bytes every segment carries.
    pub hdr: u32,
    /// Payload bytes of every segment but the last (0 for a plain packet).
    pub mss: u32,
    /// Number of wire segments.
    pub segs: u32,
    /// Wire bytes of the last segment.
    pub last: u32,
}

impl Shape {
    /// A plain packet of `len` IP bytes: one segment.
    pub(crate) fn single(len: u32) -> Shape {
        Shape {
            hdr: len,
            mss: 0,
            segs: 1,
            last: len,
        }
    }

    /// Wire bytes of segment `i`.
    pub(crate) fn seg_len(&self, i: u32) -> u32 {
        if i + 1 >= self.segs {
            self.last
        } else {
            self.hdr + self.mss
        }
    }

    /// Wire bytes of segments `first..first + count`.
    pub(crate) fn wire_bytes(&self, first: u32, count: u32) -> u64 {
        if count == 0 {
            return 0;
        }
        let end = first + count;
        if end >= self.segs {
            (count as u64 - 1) * (self.hdr + self.mss) as u64 + self.last as u64
        } else {
            count as u64 * (self.hdr + self.mss) as u64
        }
    }
}

/// Why a frame is not a valid aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GsoError {
    TooShort,
    NotIpv4,
    /// GSO type other than TCPv4 or UDP (L4), or not matching the IP protocol.
    UnsupportedType,
    /// Without a partial checksum, or one not where the L4 header says.
    BadChecksumOffload,
    BadHeader,
}

/// The shape of `frame` (a `virtio_net_hdr`, then an IPv4 packet).
pub(crate) fn shape(frame: &[u8]) -> Result<Shape, GsoError> {
    if frame.len() < VNET_HDR_LEN {
        return Err(GsoError::TooShort);
    }
    let h = VnetHdr::parse(frame);
    let ip = &frame[VNET_HDR_LEN..];
    let ip_len = ip.len() as u32;
    if h.gso_type == GSO_NONE {
        return Ok(Shape::single(ip_len));
    }
    if ip.len() < 20 {
        return Err(GsoError::TooShort);
    }
    if ip[0] >> 4 != 4 {
        return Err(GsoError::NotIpv4);
    }
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff;
    if ihl < 20 || frag != 0 {
        return Err(GsoError::BadHeader);
    }
    let (proto, l4, csum_offset) = match h.gso_type & !GSO_ECN {
        GSO_TCPV4 => {
            if ip.len() < ihl + 20 {
                return Err(GsoError::TooShort);
            }
            let doff = (ip[ihl + 12] >> 4) as usize * 4;
            if doff < 20 {
                return Err(GsoError::BadHeader);
            }
            (6, doff, 16)
        }
        GSO_UDP_L4 => (17, 8, 6),
        _ => return Err(GsoError::UnsupportedType),
    };
    if ip[9] != proto {
        return Err(GsoError::UnsupportedType);
    }
    if h.flags & F_NEEDS_CSUM == 0
        || h.csum_start as usize != ihl
        || h.csum_offset as usize != csum_offset
    {
        return Err(GsoError::BadChecksumOffload);
    }
    let hdr = (ihl + l4) as u32;
    if ip_len < hdr || h.gso_size == 0 {
        return Err(GsoError::BadHeader);
    }
    let payload = ip_len - hdr;
    let mss = h.gso_size as u32;
    let segs = payload.div_ceil(mss).max(1);
    Ok(Shape {
        hdr,
        mss,
        segs,
        last: hdr + payload - (segs - 1) * mss,
    })
}

/// Writes to `out` the frame carrying segments `first..first + count` of the
/// aggregate `frame` (whose shape is `s`), cut as the kernel's segmentation
/// cuts: IP length, id and checksum, TCP sequence number and flags (CWR on
/// the first segment only, FIN and PSH on the last only), UDP length, and
/// the partial checksum of the new length. One segment goes out as a plain
/// packet, several as a smaller aggregate. Returns the frame's length.
pub(crate) fn build_run(frame: &[u8], s: &Shape, first: u32, count: u32, out: &mut [u8]) -> usize {
    assert!(count >= 1 && first + count <= s.segs && s.mss > 0);
    let h = VnetHdr::parse(frame);
    let ip = &frame[VNET_HDR_LEN..];
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let hdr = s.hdr as usize;
    let includes_last = first + count == s.segs;
    let payload = (s.wire_bytes(first, count) - count as u64 * s.hdr as u64) as usize;
    let from = hdr + (first * s.mss) as usize;
    let total = hdr + payload;

    let (vh, rest) = out.split_at_mut(VNET_HDR_LEN);
    VnetHdr {
        gso_type: if count > 1 { h.gso_type } else { GSO_NONE },
        gso_size: if count > 1 { h.gso_size } else { 0 },
        hdr_len: s.hdr as u16,
        ..h
    }
    .write(vh);
    let pkt = &mut rest[..total];
    pkt[..hdr].copy_from_slice(&ip[..hdr]);
    pkt[hdr..].copy_from_slice(&ip[from..from + payload]);

    pkt[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    let id = u16::from_be_bytes([pkt[4], pkt[5]]).wrapping_add(first as u16);
    pkt[4..6].copy_from_slice(&id.to_be_bytes());
    pkt[10..12].fill(0);
    let c = !fold(sum(&pkt[..ihl]));
    pkt[10..12].copy_from_slice(&c.to_be_bytes());

    let l4_len = (total - ihl) as u32;
    let proto = pkt[9];
    let l4 = &mut pkt[ihl..];
    if proto == 6 {
        let seq = u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]).wrapping_add(first * s.mss);
        l4[4..8].copy_from_slice(&seq.to_be_bytes());
        if first > 0 {
            l4[13] &= !0x80; // CWR
        }
        if !includes_last {
            l4[13] &= !(0x01 | 0x08); // FIN, PSH
        }
    } else {
        l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
    }
    // The partial checksum: the pseudo-header's sum, not complemented; the
    // receiver (or whoever completes it) adds the L4 bytes.
    let at = h.csum_offset as usize;
    let pseudo = sum(&ip[12..20]) + proto as u32 + l4_len;
    l4[at..at + 2].copy_from_slice(&fold(pseudo).to_be_bytes());
    VNET_HDR_LEN + total
}

/// One's-complement sum of big-endian 16-bit words (odd byte padded), unfolded.
pub(crate) fn sum(b: &[u8]) -> u32 {
    let mut s = 0u32;
    let mut it = b.chunks_exact(2);
    for w in &mut it {
        s += u16::from_be_bytes([w[0], w[1]]) as u32;
    }
    if let [x] = it.remainder() {
        s += (*x as u32) << 8;
    }
    s
}

/// Folds a 32-bit one's-complement sum to 16 bits.
pub(crate) fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A TCP (proto 6) or UDP (17) aggregate from 10.77.0.1 to 10.77.0.2 as a
    /// host's kernel hands it over: partial checksum, `payload` cut at `mss`.
    pub(crate) fn aggregate(proto: u8, payload: &[u8], mss: u16, tcp_flags: u8) -> Vec<u8> {
        let l4 = if proto == 6 { 20 } else { 8 };
        let total = 20 + l4 + payload.len();
        let mut f = vec![0u8; VNET_HDR_LEN + total];
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if proto == 6 { GSO_TCPV4 } else { GSO_UDP_L4 },
            hdr_len: (20 + l4) as u16,
            gso_size: mss,
            csum_start: 20,
            csum_offset: if proto == 6 { 16 } else { 6 },
        }
        .write(&mut f);
        let ip = &mut f[VNET_HDR_LEN..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0xfff0u16.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = proto;
        ip[12..16].copy_from_slice(&[10, 77, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 77, 0, 2]);
        ip[20..22].copy_from_slice(&40000u16.to_be_bytes());
        ip[22..24].copy_from_slice(&5201u16.to_be_bytes());
        if proto == 6 {
            ip[24..28].copy_from_slice(&0xffff_f000u32.to_be_bytes());
            ip[32] = 5 << 4;
            ip[33] = tcp_flags;
        } else {
            ip[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        }
        ip[20 + l4..].copy_from_slice(payload);
        f
    }

    /// Completes the partial checksum as a NIC would and checks both the IP
    /// and the L4 checksum; returns (seq or 0, flags or 0, payload).
    fn complete_and_verify(frame: &mut [u8]) -> (u32, u8, Vec<u8>) {
        let h = VnetHdr::parse(frame);
        let ip = &mut frame[VNET_HDR_LEN..];
        let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
        assert_eq!(total, ip.len(), "IP length");
        assert_eq!(fold(sum(&ip[..20])), 0xffff, "IP checksum");
        let start = h.csum_start as usize;
        let at = start + h.csum_offset as usize;
        let c = !fold(sum(&ip[start..]));
        ip[at..at + 2].copy_from_slice(&c.to_be_bytes());
        let pseudo = sum(&ip[12..20]) + ip[9] as u32 + (total - 20) as u32;
        assert_eq!(fold(pseudo + sum(&ip[20..])), 0xffff, "L4 checksum");
        if ip[9] == 6 {
            let seq = u32::from_be_bytes([ip[24], ip[25], ip[26], ip[27]]);
            (seq, ip[33], ip[40..].to_vec())
        } else {
            let ulen = u16::from_be_bytes([ip[24], ip[25]]) as usize;
            assert_eq!(ulen, total - 20, "UDP length");
            (0, 0, ip[28..].to_vec())
        }
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn shape_counts_wire_segments() {
        let f = aggregate(6, &pattern(10_000), 1448, 0x18);
        let s = shape(&f).unwrap();
        assert_eq!((s.hdr, s.mss, s.segs), (40, 1448, 7));
        assert_eq!(s.last, 40 + 10_000 - 6 * 1448);
        assert_eq!(s.wire_bytes(0, 7), 10_000 + 7 * 40);
        assert_eq!(s.wire_bytes(2, 3), 3 * 1488);
        let u = shape(&aggregate(17, &pattern(14_000), 1400, 0)).unwrap();
        assert_eq!((u.hdr, u.segs, u.last), (28, 10, 1428));
        // A plain packet is one segment of its IP length.
        let mut plain = vec![0u8; VNET_HDR_LEN + 84];
        plain[VNET_HDR_LEN] = 0x45;
        assert_eq!(shape(&plain).unwrap(), Shape::single(84));
    }

    #[test]
    fn shape_refuses_what_it_cannot_cut() {
        let good = aggregate(6, &pattern(3000), 1448, 0);
        let mut f = good.clone();
        f[1] = 4; // TCPv6
        assert_eq!(shape(&f), Err(GsoError::UnsupportedType));
        let mut f = good.clone();
        f[0] = 0;
        assert_eq!(shape(&f), Err(GsoError::BadChecksumOffload));
        let mut f = good.clone();
        f[VNET_HDR_LEN + 9] = 17;
        assert_eq!(shape(&f), Err(GsoError::UnsupportedType));
        let mut f = good.clone();
        f[VNET_HDR_LEN + 6] = 0x20; // more fragments
        assert_eq!(shape(&f), Err(GsoError::BadHeader));
        let mut f = good.clone();
        f[4] = 0;
        f[5] = 0; // gso_size 0
        assert_eq!(shape(&f), Err(GsoError::BadHeader));
        assert_eq!(shape(&good[..VNET_HDR_LEN + 30]), Err(GsoError::TooShort));
        assert_eq!(shape(&good[..4]), Err(GsoError::TooShort));
    }

    #[test]
    fn tcp_runs_are_cut_like_the_kernel_cuts() {
        let data = pattern(10_000);
        // CWR | PSH | FIN | ACK
        let f = aggregate(6, &data, 1448, 0x80 | 0x08 | 0x01 | 0x10);
        let s = shape(&f).unwrap();
        let mut out = vec![0u8; f.len()];
        // Every segment alone, and runs in between: payload and sequence
        // numbers line up, flags sit where the kernel puts them.
        for (first, count) in [(0, 1), (1, 1), (6, 1), (0, 3), (2, 5), (1, 5), (0, 7)] {
            let n = build_run(&f, &s, first, count, &mut out);
            let h = VnetHdr::parse(&out);
            assert_eq!(h.gso_type, if count > 1 { GSO_TCPV4 } else { GSO_NONE });
            let (seq, flags, payload) = complete_and_verify(&mut out[..n]);
            let from = (first * 1448) as usize;
            assert_eq!(payload, &data[from..(from + payload.len())]);
            assert_eq!(
                payload.len() as u64,
                s.wire_bytes(first, count) - 40 * count as u64
            );
            assert_eq!(seq, 0xffff_f000u32.wrapping_add(from as u32), "seq wraps");
            assert_eq!(flags & 0x80 != 0, first == 0, "CWR on the first only");
            let last = first + count == 7;
            assert_eq!(flags & 0x09 == 0x09, last, "FIN and PSH on the last only");
            assert_eq!(flags & 0x10, 0x10, "ACK kept");
            let id = u16::from_be_bytes([out[14], out[15]]);
            assert_eq!(id, 0xfff0u16.wrapping_add(first as u16));
        }
    }

    #[test]
    fn udp_runs_are_datagrams_of_gso_size() {
        let data = pattern(14_000 - 3);
        let f = aggregate(17, &data, 1400, 0);
        let s = shape(&f).unwrap();
        let mut out = vec![0u8; f.len()];
        let mut joined = Vec::new();
        for i in 0..s.segs {
            let n = build_run(&f, &s, i, 1, &mut out);
            let (_, _, payload) = complete_and_verify(&mut out[..n]);
            assert!(payload.len() == 1400 || i == s.segs - 1);
            joined.extend(payload);
        }
        assert_eq!(joined, data);
        let n = build_run(&f, &s, 3, 4, &mut out);
        assert_eq!(VnetHdr::parse(&out).gso_size, 1400);
        let (_, _, payload) = complete_and_verify(&mut out[..n]);
        assert_eq!(payload, &data[4200..9800]);
    }
}
