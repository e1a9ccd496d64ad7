//! A hostile put whose manifest announces an absurd file size. The server runs as a
//! separate `longhaul serve` process (capped at 8 GiB of address space, so the test
//! cannot exhaust the machine) because the failure mode is the whole process dying.

use longhaul_quic::proto::{ErrorCode, Frame, Op, PutSync, RootSpec};
use longhaul_testkit::raw::Raw;
use longhaul_testkit::*;
use longhaul_transfer::{Entry, EntryKind};
use std::time::Duration;

async fn hostile_put(port: u16, kh: std::path::PathBuf, size: u64) -> Option<(ErrorCode, String)> {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut r = Raw::connect(addr, kh).await;
    r.patience = Duration::from_secs(5);
    r.hello(Op::Put {
        dest: b"in".to_vec(),
        dest_is_dir: true,
        roots: vec![RootSpec {
            name: b"huge".to_vec(),
        }],
        sync: PutSync::Always,
        durable: false,
        specials: false,
        delete: false,
        filters: vec![],
        dry_run: false,
        numeric_ids: false,
        shard: None,
    })
    .await;
    r.frame(&Frame::Entry(Entry {
        id: 1,
        root: 0,
        path: vec![],
        kind: EntryKind::File,
        size,
        mode: 0o644,
        mtime_ns: 0,
        link: vec![],
        owner: Default::default(),
        xattrs: vec![],
        allocated: 0,
    }))
    .await;
    r.fatal().await
}

/// One Entry announcing a 4 PiB file makes the receiver allocate per-chunk state
/// for 2^32 chunks (`Incoming::open`: `vec![None; plan.count()]`, 33 bytes each)
/// before anything else: the allocation fails and the server process aborts. It
/// must refuse the entry (or fail that file) and go on serving.
#[test]
fn absurd_file_size_in_a_put_manifest_does_not_kill_the_server() {
    let t = Tmp::new("hostile-size");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("ok.txt"), b"ok\n").unwrap();
    let state = t.join("state");
    let mut cfg = ServeCfg::new(&root, &state).writable();
    cfg.address_space = Some(8 << 30);
    let srv = cfg.start();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let fatal = rt.block_on(hostile_put(srv.port, t.join("kh"), 1 << 52));
    std::thread::sleep(Duration::from_millis(300));
    let alive = srv.alive();
    let log = srv.log_text();
    assert!(
        alive,
        "the server process died on a manifest entry of 4 PiB (Fatal seen: {fatal:?}); its log:\n{log}"
    );
    let (code, message) = fatal.expect("the session ends with a Fatal frame");
    assert!(
        matches!(code, ErrorCode::Io | ErrorCode::Protocol),
        "{code:?} {message}"
    );
    assert!(
        std::fs::symlink_metadata(root.join("in/huge")).is_err(),
        "no final file"
    );

    // The server still serves.
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let out = Client::new(t.join("kh2")).run(
        "get",
        [
            std::ffi::OsString::from("--accept-new"),
            srv.remote("ok.txt"),
            dest.clone().into(),
        ],
    );
    out.expect_code(0);
    assert_eq!(std::fs::read(dest.join("ok.txt")).unwrap(), b"ok\n");
}
