//! `longhaul demo`: a local server and a get of a generated data set, printing the
//! rate. The README's quickstart until the lab (`longhaul lab demo`) exists.

use crate::args::DemoArgs;
use anyhow::{bail, Context, Result};
use longhaul_quic::NetOpts;
use longhaul_quic::{ClientOpts, Progress, ServeOpts, Server};
use longhaul_transfer::testdata;
use longhaul_transfer::units::show_size;
use std::path::Path;
use std::sync::Arc;

fn tree_bytes(p: &Path) -> Result<(u64, u64)> {
    let mut files = 0;
    let mut bytes = 0;
    for e in std::fs::read_dir(p)? {
        let e = e?;
        let m = e.metadata()?;
        if m.is_dir() {
            let (f, b) = tree_bytes(&e.path())?;
            files += f;
            bytes += b;
        } else {
            files += 1;
            bytes += m.len();
        }
    }
    Ok((files, bytes))
}

fn same_tree(a: &Path, b: &Path) -> Result<bool> {
    for e in std::fs::read_dir(a)? {
        let e = e?;
        let other = b.join(e.file_name());
        if e.metadata()?.is_dir() {
            if !same_tree(&e.path(), &other)? {
                return Ok(false);
            }
        } else if blake3::hash(&std::fs::read(e.path())?)
            != blake3::hash(&std::fs::read(&other).unwrap_or_default())
        {
            return Ok(false);
        }
    }
    Ok(true)
}

pub async fn run(a: DemoArgs) -> Result<i32> {
    let tmp;
    let work = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let src = work.join("src");
    eprintln!(
        "longhaul demo: generating 1 x {} and {} x 10 kB in {}",
        show_size(a.big),
        a.small,
        src.display()
    );
    std::fs::create_dir_all(&src)?;
    testdata::write_file(&src.join("big.bin"), 1, a.big).context("generating data")?;
    testdata::write_many(&src.join("small"), 1000, a.small, 10_000).context("generating data")?;

    let server = Server::bind(ServeOpts {
        root: src.clone(),
        listen: "127.0.0.1:0".parse()?,
        read_only: true,
        token: None,
        read_token: None,
        exact_modes: false,
        keep_owners: false,
        anonymous_put: false,
        state_dir: work.join("state"),
        net: NetOpts::default(),
        streams: longhaul_quic::DEFAULT_STREAMS,
        max_sessions: longhaul_quic::DEFAULT_MAX_SESSIONS,
        send_buffer: longhaul_quic::DEFAULT_SEND_BUFFER,
        once: false,
        keep: Default::default(),
    })?;
    let addr = server.local_addr()?;
    let fp = server.fingerprint.clone();
    let srv = tokio::spawn(server.run());
    let opts = ClientOpts::pinned(addr.to_string(), work.join("known_hosts"), fp);
    println!(
        "{:<22} {:>6} {:>10} {:>8} {:>9} {:>9}  verified",
        "set", "files", "MB", "seconds", "Mbit/s", "MB/s"
    );
    let mut all_ok = true;
    for (label, path) in [
        (format!("1 x {}", show_size(a.big)), "big.bin"),
        (format!("{} x 10 kB", a.small), "small"),
    ] {
        let dst = work.join("dst");
        let _ = std::fs::remove_dir_all(&dst);
        std::fs::create_dir_all(&dst)?;
        let r = longhaul_quic::get(
            "127.0.0.1",
            addr.port(),
            &[path.to_string()],
            &dst,
            &opts,
            Arc::new(Progress::default()),
        )
        .await
        .map_err(|p| anyhow::anyhow!("{p}"))?;
        let (files, bytes) = tree_bytes(&dst)?;
        let same = compare(&src, &dst, path)?;
        let ok = r.ok && same;
        all_ok &= ok;
        println!(
            "{:<22} {:>6} {:>10.1} {:>8.2} {:>9.0} {:>9.1}  {}",
            label,
            files,
            bytes as f64 / 1e6,
            r.seconds,
            r.rate_mbps,
            r.rate_mbps / 8.0,
            if ok { "yes" } else { "NO" }
        );
        if a.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        }
    }
    srv.abort();
    if !all_ok {
        bail!("the demo transfer did not verify");
    }
    println!("(loopback on this machine: CPU-bound; the WAN numbers come from the lab)");
    Ok(0)
}

fn compare(src: &Path, dst: &Path, path: &str) -> Result<bool> {
    let s = src.join(path);
    let d = dst.join(path);
    if s.is_dir() {
        same_tree(&s, &d)
    } else {
        Ok(blake3::hash(&std::fs::read(&s)?) == blake3::hash(&std::fs::read(&d)?))
    }
}
