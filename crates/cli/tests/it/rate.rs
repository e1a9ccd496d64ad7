//! --max-rate caps the sending rate (the server's, for a get).

use longhaul_testkit::*;
use std::ffi::OsString;

/// `get --json OPTIONS...` of the server's `file` into `dest`, afresh.
fn get_json(c: &Client, srv: &Server, dest: &std::path::Path, file: &str, opts: &[&str]) -> Out {
    let _ = std::fs::remove_file(dest.join(file));
    let mut args: Vec<OsString> = vec!["--accept-new".into(), "--json".into()];
    args.extend(opts.iter().map(OsString::from));
    args.extend([srv.remote(file), dest.into()]);
    c.run("get", args)
}

#[test]
fn max_rate_is_honoured() {
    let t = Tmp::new("rate");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    let size = 32 * MIB;
    gen_file(&root.join("f.bin"), 3, size);
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let mut report = Vec::new();
    for rate in [100u64, 200] {
        let out = get_json(
            &c,
            &srv,
            &dest,
            "f.bin",
            &["--max-rate", &format!("{rate}M")],
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
        start_up_figures(&j, rate as f64, &format!("get --max-rate {rate}M"));
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
    // A put reports its start-up too (the first data is what it sent).
    let out = c.run(
        "put",
        [
            OsString::from("--json"),
            OsString::from("--max-rate"),
            OsString::from("100M"),
            root.join("f.bin").into(),
            srv.remote("up.bin"),
        ],
    );
    out.expect_code(0);
    start_up_figures(&out.json(), 100.0, "put --max-rate 100M");
    assert_eq!(
        hash_file(&root.join("up.bin")),
        hash_file(&root.join("f.bin"))
    );
}

/// A capped transfer of 32 MiB (2.7 s at 100 Mbit/s): the first data came
/// after the handshake, within the run; the rate of its second half is the
/// cap (UDP payload: a few % above the file bytes, at most the cap's
/// pacing bursts above); it was at speed from its first 100 ms window
/// (`wan` starts at the cap).
fn start_up_figures(j: &serde_json::Value, cap_mbps: f64, what: &str) {
    let secs = j["seconds"].as_f64().unwrap();
    let first = j["first_data_s"].as_f64().expect("first_data_s");
    assert!(
        first > 0.0 && first < secs / 2.0,
        "{what}: first data {first} s of {secs}"
    );
    let fin = j["final_mbps"].as_f64().expect("final_mbps");
    assert!(
        (0.7 * cap_mbps..=1.25 * cap_mbps).contains(&fin),
        "{what}: final {fin} Mbit/s"
    );
    // (At least one window, 100 ms, by its definition.)
    let ramp = j["to_90pct_s"].as_f64().expect("to_90pct_s");
    assert!(ramp <= 0.5, "{what}: 90 % after {ramp} s");
}

/// Every controller a user can name moves a file intact, and the report says
/// which one ran (the server sends a get, with the client's choice).
#[test]
fn each_congestion_controller_delivers() {
    let t = Tmp::new("ccs");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("f.bin"), 5, 8 * MIB);
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    for cc in [
        "wan",
        "wan:500M",
        "fair",
        "bbr",
        "cubic",
        "reno",
        "fixed:300M",
    ] {
        eprintln!("--cc {cc}");
        let out = get_json(&c, &srv, &dest, "f.bin", &["--cc", cc]);
        out.expect_code(0);
        assert_eq!(
            hash_file(&dest.join("f.bin")),
            hash_file(&root.join("f.bin")),
            "{cc}"
        );
        let want = match cc {
            "wan:500M" => "wan:500000000".to_string(),
            "fixed:300M" => "fixed:300000000".to_string(),
            c => c.to_string(),
        };
        assert_eq!(out.json()["cc"], want.as_str(), "{cc}");
    }
    let out = c.run(
        "get",
        [
            OsString::from("--accept-new"),
            "--cc".into(),
            "vegas".into(),
            srv.remote("f.bin"),
            dest.clone().into(),
        ],
    );
    assert!(
        out.stderr
            .contains("unknown congestion controller \"vegas\""),
        "{}",
        out.stderr
    );
}

/// A large `wan` transfer leaves its data-phase rate in the rate memory, and the
/// next `wan` session with that server starts there (fast start); small
/// transfers, other controllers, --no-rates and a hint of the user's own leave
/// it alone.
#[test]
fn the_rate_memory_gives_wan_its_start() {
    let t = Tmp::new("rates");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("f.bin"), 7, 64 * MIB);
    gen_file(&root.join("small.bin"), 8, MIB);
    std::fs::create_dir(root.join("many")).unwrap();
    for i in 0..100 {
        gen_file(&root.join(format!("many/{i:03}")), 100 + i, 700 * 1024);
    }
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let rates = t.join("rates");
    let get = |file: &str, extra: &[&str]| {
        let out = get_json(&c, &srv, &dest, file, extra);
        out.expect_code(0);
        assert_eq!(hash_file(&dest.join(file)), hash_file(&root.join(file)));
        out.json()
    };
    let r = rates.to_str().unwrap();
    // Small, or not wan: nothing to remember.
    let j = get("f.bin", &["--cc", "bbr", "--rates", r]);
    assert_eq!(j["remembered_bps"], 0);
    assert!(!rates.exists());
    let j = get("small.bin", &["--cc", "wan", "--rates", r]);
    assert_eq!(j["remembered_bps"], 0);
    assert!(!rates.exists());
    // Many smaller files (70 MB in all, 700 kB each): limited by creating
    // files, not by the path; not remembered either.
    let out = get_json(&c, &srv, &dest, "many", &["--cc", "wan", "--rates", r]);
    out.expect_code(0);
    assert_eq!(out.json()["totals"]["verified"], 100);
    assert!(!rates.exists(), "a small-file rate was remembered");
    // Large: remembered under HOST:PORT.
    let j = get("f.bin", &["--cc", "wan", "--rates", r]);
    assert_eq!(j["remembered_bps"], 0);
    assert_eq!(j["cc"], "wan");
    let text = std::fs::read_to_string(&rates).unwrap();
    let key = format!("get:127.0.0.1:{}", srv.port);
    let bps: u64 = text
        .strip_prefix(&format!("{key} "))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("no entry for {key} in {text:?}"));
    // The best second on the wire; a transfer shorter than a second and a
    // quarter has none, and leaves its payload rate.
    let peak = j["peak_bps"].as_u64().expect("peak_bps in the report");
    let data_mbps = 64.0 * MIB as f64 * 8.0 / 1e6 / j["data_seconds"].as_f64().unwrap();
    if peak > 0 {
        assert_eq!(bps, peak, "the best second is remembered");
        assert!(
            peak as f64 / 1e6 >= data_mbps * 0.9,
            "{peak} vs {data_mbps}"
        );
    } else {
        assert!(
            (bps as f64 / 1e6 - data_mbps).abs() < 1.0,
            "{bps} remembered, {data_mbps} Mbit/s measured"
        );
    }
    // The next wan session starts at it, and says so.
    let j = get("small.bin", &["--cc", "wan", "--rates", r]);
    assert_eq!(j["remembered_bps"], bps);
    assert_eq!(j["cc"], format!("wan:{bps}").as_str());
    // A hint of the user's own, another controller, or --no-rates: unused.
    for extra in [
        &["--cc", "wan:300M", "--rates", r][..],
        &["--cc", "wan", "--max-rate", "900M", "--rates", r],
        &["--cc", "bbr", "--rates", r],
        &["--cc", "wan", "--no-rates"],
    ] {
        let j = get("small.bin", extra);
        assert_eq!(j["remembered_bps"], 0, "{extra:?}");
    }
}
