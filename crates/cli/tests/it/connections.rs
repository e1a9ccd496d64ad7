//! `--connections N`: one get and one put over several QUIC connections,
//! each its own socket: the tree arrives byte for byte, the report names the
//! connections, and every connection carried a share of the data; only the
//! side that sends the data probes its path's MTU.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::path::Path;

/// A 24 MB file and 200 files of 10 kB.
fn tree(dir: &Path) -> u64 {
    std::fs::create_dir_all(dir.join("small")).unwrap();
    gen_file(&dir.join("big.bin"), 11, 24 << 20);
    let pool = gen_bytes(12, 10_000 + 200);
    for i in 0..200 {
        std::fs::write(
            dir.join("small").join(format!("f{i:03}")),
            &pool[i..i + 10_000],
        )
        .unwrap();
    }
    (24 << 20) + 200 * 10_000
}

/// Every connection carried at least a tenth of the payload, in `field`'s
/// direction; and their sum is the report's.
fn shares(j: &serde_json::Value, n: usize, field: &str, payload: u64) {
    assert_eq!(j["connections"], n, "{j}");
    let per = j["per_connection"].as_array().expect("per_connection");
    assert_eq!(per.len(), n);
    let each: Vec<u64> = per.iter().map(|c| c[field].as_u64().unwrap()).collect();
    assert_eq!(
        each.iter().sum::<u64>(),
        j[field].as_u64().unwrap(),
        "{each:?}"
    );
    for (i, b) in each.iter().enumerate() {
        assert!(
            *b >= payload / 10,
            "connection {i} carried {b} of {payload} bytes: {each:?}"
        );
    }
}

/// A get of the tree `set` into a new directory `dest` over `n`
/// connections, trusting the server by `trust`: every file verified, every
/// connection carried a share.
fn get_set(c: &Client, srv: &Server, trust: &[OsString], n: usize, dest: &Path, payload: u64) {
    std::fs::create_dir(dest).unwrap();
    let mut args = trust.to_vec();
    args.extend([
        "--json".into(),
        "--connections".into(),
        n.to_string().into(),
        srv.remote("set"),
        dest.into(),
    ]);
    let out = c.run("get", args);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["totals"]["verified"], 201, "{j}");
    shares(&j, n, "udp_rx_bytes", payload);
    // A get's client sends only ACKs and control frames: it does not probe
    // its path's MTU on any connection, so its datagrams stay at quinn's
    // first 1,200 bytes.
    assert_eq!(j["mtu"], 1200, "{j}");
    for c in j["per_connection"].as_array().unwrap() {
        assert_eq!(c["mtu"], 1200, "{j}");
    }
}

#[test]
fn a_get_and_a_put_over_several_connections() {
    let t = Tmp::new("connections");
    let root = t.join("root");
    let payload = tree(&root.join("set"));
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));

    let dest = t.join("dest");
    get_set(&c, &srv, &["--accept-new".into()], 3, &dest, payload);
    let inside = Compare {
        top_meta: false,
        ..Compare::ALL
    };
    assert_same_tree(&root.join("set"), &dest.join("set"), inside);

    let out = c.run(
        "put",
        [
            OsString::from("--json"),
            "--connections".into(),
            "2".into(),
            dest.join("set").into(),
            srv.remote("back/"),
        ],
    );
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["totals"]["verified"], 201, "{j}");
    shares(&j, 2, "udp_tx_bytes", payload);
    // A put's client sends the data: it probes on every connection, and
    // loopback takes more.
    for c in j["per_connection"].as_array().unwrap() {
        assert!(c["mtu"].as_u64().unwrap() > 1200, "{j}");
    }
    assert_same_tree(&root.join("set"), &root.join("back").join("set"), inside);

    // Out of range: refused before anything is sent.
    let out = c.run(
        "get",
        [
            OsString::from("--connections"),
            "0".into(),
            srv.remote("set"),
            t.join("x").into(),
        ],
    );
    out.expect_code(2);
    assert!(
        out.stderr.contains("--connections must be at least 1"),
        "{}",
        out.stderr
    );
}

/// A server at `--max-sessions 1` serves one session over several
/// connections: it counts sessions, not connections.
#[test]
fn max_sessions_counts_a_session_over_several_connections_once() {
    let t = Tmp::new("connections-max");
    let root = t.join("root");
    let payload = tree(&root.join("set"));
    let srv = ServeCfg::new(&root, &t.join("state"))
        .arg("--max-sessions")
        .arg("1")
        .start();
    let c = Client::new(t.join("kh"));
    let trust = ["--fingerprint".into(), srv.fingerprint.clone().into()];
    get_set(&c, &srv, &trust, 4, &t.join("dest"), payload);
}
