//! --max-rate caps the sending rate (the server's, for a get).

mod common;

use common::*;
use std::ffi::OsString;

#[test]
fn max_rate_is_honoured() {
    let t = Tmp::new("rate");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    let size = 32 * MIB;
    gen_file(&root.join("f.bin"), 3, size);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let mut report = Vec::new();
    for rate in [100u64, 200] {
        let _ = std::fs::remove_file(dest.join("f.bin"));
        let out = c.run(
            "get",
            [
                OsString::from("--accept-new"),
                "--json".into(),
                "--max-rate".into(),
                format!("{rate}M").into(),
                srv.remote("f.bin"),
                dest.clone().into(),
            ],
        );
        out.expect_code(0);
        let j = out.json();
        assert_eq!(
            hash_file(&dest.join("f.bin")),
            hash_file(&root.join("f.bin"))
        );
        let secs = j["seconds"].as_f64().unwrap();
        let mbps = size as f64 * 8.0 / 1e6 / secs;
        eprintln!(
            "--max-rate {rate}M: {mbps:.0} Mbit/s in {secs:.2} s, rtt {} ms",
            j["rtt_ms"]
        );
        // Generous: within 25 % above the cap (pacing bursts, handshake excluded).
        if mbps > rate as f64 * 1.25 {
            report.push(format!(
                "--max-rate {rate}M moved {size} bytes at {mbps:.0} Mbit/s ({secs:.2} s, RTT {} ms)",
                j["rtt_ms"]
            ));
        }
    }
    assert!(
        report.is_empty(),
        "rate cap not honoured:\n{}",
        report.join("\n")
    );
}
