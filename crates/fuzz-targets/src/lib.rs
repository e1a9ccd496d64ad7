//! Fuzz targets: each takes arbitrary bytes, feeds them to a decoder that
//! reads input from outside (the network, a file, the command line), and
//! checks what a decoder owes its caller: no panic, no unbounded allocation,
//! and for what it accepts, a round trip through the matching encoder.
//!
//! [`TARGETS`] lists them with [`seeds`] (valid inputs a mutating fuzzer
//! starts from). `fuzz/` runs them under libFuzzer (`scripts/fuzz`, nightly);
//! `tests/smoke.rs` runs each on its seeds and many mutations on stable, in CI.

#![warn(missing_docs, unreachable_pub)]

use longhaul_quic::proto::{encode, Frame, FrameDecoder, RecordHeader, Repair, RECORD_HEADER_LEN};
use longhaul_transfer::journal;
use std::io::Write;

/// A fuzz target: a name (the cargo-fuzz target's) and its function.
pub type Target = (&'static str, fn(&[u8]));

/// Every target.
pub const TARGETS: &[Target] = &[
    ("frames", frames),
    ("record_header", record_header),
    ("repair", repair),
    ("journal", journal_file),
    ("mcast_wire", mcast_wire),
    ("mcast_manifest", mcast_manifest),
    ("units", units),
    ("link_spec", link_spec),
    ("suite", suite),
    ("known_hosts", known_hosts),
    ("rel_path", rel_path),
];

/// The unicast control stream: frames decoded from arbitrary bytes, fed in
/// two pieces (a frame split across reads). Every frame decoded re-encodes
/// to bytes that decode to the same frame.
pub fn frames(data: &[u8]) {
    let cut = data.first().map_or(0, |&b| b as usize % (data.len() + 1));
    let mut d = FrameDecoder::new();
    d.push(&data[..cut]);
    let mut got = Vec::new();
    let mut pushed_rest = false;
    loop {
        match d.next_frame() {
            Ok(Some(f)) => got.push(f),
            Ok(None) if !pushed_rest => {
                d.push(&data[cut..]);
                pushed_rest = true;
            }
            Ok(None) | Err(_) => break,
        }
        if got.len() > 10_000 {
            break;
        }
    }
    for f in got {
        let mut again = FrameDecoder::new();
        again.push(&encode(&f));
        let back: Option<Frame> = again.next_frame().expect("a re-encoded frame decodes");
        assert_eq!(back.as_ref(), Some(&f), "round trip");
    }
}

/// A data record's header: what decodes re-encodes to the same header.
pub fn record_header(data: &[u8]) {
    let Some(b) = data.get(..RECORD_HEADER_LEN) else {
        return;
    };
    let b: &[u8; RECORD_HEADER_LEN] = b.try_into().unwrap();
    if let Ok(h) = RecordHeader::decode(b) {
        assert_eq!(RecordHeader::decode(&h.encode()).ok(), Some(h));
    }
}

/// A tail-repair datagram (a QUIC datagram from the peer): what decodes
/// re-encodes to the same bytes.
pub fn repair(data: &[u8]) {
    if let Ok(r) = Repair::decode(bytes::Bytes::copy_from_slice(data)) {
        assert_eq!(r.encode(), data, "round trip");
    }
}

/// A resume journal read back for a file of up to 255 chunks: every record
/// names a chunk of the file, and no chunk is both synced and only written.
pub fn journal_file(data: &[u8]) {
    let chunks = data.first().map_or(1, |&b| b as u64);
    if let Some(p) = journal::decode(data, chunks) {
        assert!(p.synced.iter().chain(&p.written).all(|&(i, _)| i < chunks));
        assert!(p
            .written
            .iter()
            .all(|w| p.synced.iter().all(|s| s.0 != w.0)));
    }
}

/// A multicast datagram, plain and sealed: decoding never panics, and a
/// decoded message re-encodes (plain) to a datagram that decodes to it.
pub fn mcast_wire(data: &[u8]) {
    use longhaul_mcast::seal::Key;
    use longhaul_mcast::wire;
    let mut buf = data.to_vec();
    if let Ok((h, msg)) = wire::decode(&mut buf, None) {
        let mut out = Vec::new();
        wire::encode(h.session, &msg, None, &mut out);
        let mut again = out.clone();
        let (h2, msg2) = wire::decode(&mut again, None).expect("a re-encoded datagram decodes");
        assert_eq!((h2.session, &msg2), (h.session, &msg));
    }
    let key = Key::from_material(&[7u8; 32], 1).expect("a key");
    let mut buf = data.to_vec();
    let _ = wire::decode(&mut buf, Some(&key));
}

/// A multicast manifest: what decodes re-encodes and decodes the same.
pub fn mcast_manifest(data: &[u8]) {
    use longhaul_mcast::manifest::Manifest;
    let data_len = data.first().map_or(0, |&b| b as u64 * 1000);
    if let Ok(m) = Manifest::decode(data, data_len) {
        assert_eq!(Manifest::decode(&m.encode(), data_len).ok(), Some(m));
    }
}

/// Sizes, rates and durations as users write them.
pub fn units(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let _ = longhaul_transfer::units::parse_size(s);
    let _ = longhaul_transfer::units::parse_rate(s);
    let _ = longhaul_transfer::units::parse_duration(s);
}

/// A lab link SPEC: what parses prints as a SPEC that parses the same.
pub fn link_spec(data: &[u8]) {
    use longhaul_netem::LinkSpec;
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = s.parse::<LinkSpec>() {
        let shown = spec.to_string();
        let back: LinkSpec = shown.parse().expect("a printed SPEC parses");
        assert_eq!(back, spec, "{shown}");
    }
}

/// A bench suite file (TOML).
pub fn suite(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = longhaul_bench::scenario::Suite::parse(s);
    }
}

/// A known-hosts file, looked up for a host.
pub fn known_hosts(data: &[u8]) {
    use longhaul_quic::identity::KnownHosts;
    // A scratch directory of this thread's own, made for each input and
    // removed after it: nothing is left in the temporary directory.
    thread_local! {
        static FILE: std::path::PathBuf = std::env::temp_dir()
            .join(format!(
                "lh-fuzz-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ))
            .join("known_hosts");
    }
    FILE.with(|p| {
        let dir = p.parent().expect("the file is in a directory");
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::File::create(p))
            .and_then(|mut f| f.write_all(data))
            .expect("writing the scratch file");
        let kh = KnownHosts::new(p.clone());
        let _ = kh.lookup("example.org:7878");
        let _ = kh.lookup("[::1]:7878");
        let _ = std::fs::remove_dir_all(dir);
    });
}

/// A path from the wire (strict) and from a user (lenient): what is accepted
/// never climbs out of its root or starts at `/`.
pub fn rel_path(data: &[u8]) {
    use longhaul_transfer::RelPath;
    for p in [
        RelPath::from_wire(data).ok(),
        RelPath::from_request(data).ok(),
    ]
    .into_iter()
    .flatten()
    {
        let b = p.as_bytes();
        assert!(!b.starts_with(b"/"), "{b:?}");
        assert!(b.split(|&c| c == b'/').all(|c| c != b".."), "{b:?}");
        assert!(!b.contains(&0), "{b:?}");
    }
}

/// Valid inputs of target `name` to start mutating from.
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "frames" => seed_frames(),
        "record_header" => vec![vec![0; RECORD_HEADER_LEN]],
        "repair" => vec![Repair {
            stream: 3,
            len: 5000,
            symbol_size: 1024,
            esi: 5,
            symbol: vec![1; 1024].into(),
        }
        .encode()],
        "journal" => {
            let h = journal::JournalHeader {
                size: 3 << 20,
                mtime_ns: 42,
            };
            let mut j = journal::encode_header(&h);
            j.extend(journal::encode_records(&[(0, [1; 32]), (2, [2; 32])], true));
            j.extend(journal::encode_records(&[(1, [3; 32])], false));
            vec![j]
        }
        "units" => ["1G", "2.5Gbit", "50MB/s", "64MiB", "500ms", "0", "1e3"]
            .map(|s| s.as_bytes().to_vec())
            .to_vec(),
        "link_spec" => [
            "rate=1G delay=35ms queue=5834pkts loss=1e-3",
            "up: rate=100M delay=10ms, down: rate=1G jitter=1ms loss=ge:0.01,0.3",
        ]
        .map(|s| s.as_bytes().to_vec())
        .to_vec(),
        "suite" => vec![b"[suite]\nname = \"x\"\nline_rate = \"1G\"\ntools = [\"longhaul\"]\n\n[[scenario]]\nname = \"a\"\nlink = \"rate=1G delay=35ms\"\nfiles = [{ size = \"10kB\", count = 4 }]\n".to_vec()],
        "known_hosts" => vec![b"example.org:7878 SHA256:abc\n# comment\n[::1]:7878 SHA256:def\n".to_vec()],
        "rel_path" => [&b"a/b/c"[..], b"run42/", b"./x", b"a//b"].map(<[u8]>::to_vec).to_vec(),
        _ => vec![Vec::new()],
    }
}

fn seed_frames() -> Vec<Vec<u8>> {
    use longhaul_quic::proto::{Hello, Op, VERSION};
    let hello = Frame::Hello(Hello {
        version: VERSION,
        token: b"t".to_vec(),
        op: Op::Get {
            paths: vec![b"run42".to_vec()],
            filters: vec![],
            meta: Default::default(),
            listed: false,
        },
        max_rate: 0,
        cc: None,
        fresh: true,
        streams: 4,
        connections: 0,
        session: vec![],
    });
    let mut two = encode(&hello);
    two.extend(encode(&Frame::ManifestEnd));
    vec![encode(&hello), two]
}
