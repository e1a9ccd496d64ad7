//! Datagrams as large as the path allows, sent in GSO batches that fit one
//! UDP send: a batch over 65,507 bytes fails with EMSGSIZE, which quinn-udp
//! drops without an error, and quinn's black-hole detection then falls back
//! to 1,200-byte datagrams. Loopback allows longhaul's largest, 8,972 bytes
//! (a jumbo frame's), seven to a batch.

use crate::common::serve;
use longhaul_quic::{ClientOpts, Progress};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_over_loopback_keeps_jumbo_datagrams_to_the_end() {
    let lo_mtu: u32 = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .expect("loopback's MTU")
        .trim()
        .parse()
        .unwrap();
    // IPv4 and UDP headers: 28 bytes.
    let expected = lo_mtu.saturating_sub(28).min(8972) as u16;
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let src = t.path().join("big.bin");
    let data: Vec<u8> = (0..48u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let served = serve(&root, &t.path().join("state"), false);
    let opts: ClientOpts = served.client(t.path().join("kh"));
    let report = tokio::time::timeout(
        Duration::from_secs(120),
        longhaul_quic::put(
            &[src],
            "127.0.0.1",
            served.addr.port(),
            b"",
            &opts,
            Arc::new(Progress::default()),
        ),
    )
    .await
    .expect("the put ended")
    .expect("a report");
    assert!(report.ok, "{:?}", report.problems);
    assert!(std::fs::read(root.join("big.bin")).unwrap() == data);
    // The sender probed up to the path's largest datagram and never fell
    // back: no batch of them vanished.
    assert_eq!(report.mtu, expected, "{:?}", report.per_connection);
    assert!(report.per_connection.iter().all(|c| c.mtu == expected));
}
