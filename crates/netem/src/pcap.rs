//! Classic pcap with nanosecond timestamps and raw-IP link type, which tshark,
//! tcpdump and Wireshark read.

use std::io::{self, Write};

/// Nanosecond-resolution pcap magic.
pub(crate) const MAGIC_NS: u32 = 0xa1b2_3c4d;
/// LINKTYPE_RAW: each record starts with an IPv4 or IPv6 header.
pub(crate) const LINKTYPE_RAW: u32 = 101;

pub(crate) struct PcapWriter<W: Write> {
    out: W,
    snaplen: u32,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header; records keep at most `snaplen` bytes of each packet.
    pub(crate) fn new(mut out: W, snaplen: u32) -> io::Result<Self> {
        let snaplen = snaplen.max(1);
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&MAGIC_NS.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_RAW.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out, snaplen })
    }

    /// Records `pkt` seen at `unix_ns` nanoseconds since the epoch.
    pub(crate) fn record(&mut self, unix_ns: u64, pkt: &[u8]) -> io::Result<()> {
        let cap = pkt.len().min(self.snaplen as usize);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((unix_ns / 1_000_000_000) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&((unix_ns % 1_000_000_000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(cap as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(pkt.len() as u32).to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&pkt[..cap])
    }

    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_truncated_record() {
        let mut w = PcapWriter::new(Vec::new(), 68).unwrap();
        let pkt = vec![0x45u8; 100];
        w.record(1_700_000_000_123_456_789, &pkt).unwrap();
        let b = w.out;
        assert_eq!(b.len(), 24 + 16 + 68);
        assert_eq!(&b[0..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
        assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 101);
        assert_eq!(
            u32::from_le_bytes(b[24..28].try_into().unwrap()),
            1_700_000_000
        );
        assert_eq!(
            u32::from_le_bytes(b[28..32].try_into().unwrap()),
            123_456_789
        );
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), 68);
        assert_eq!(u32::from_le_bytes(b[36..40].try_into().unwrap()), 100);
    }
}
