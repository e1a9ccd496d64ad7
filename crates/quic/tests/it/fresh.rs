//! A get into a fresh destination (`Hello.fresh`): the sender does not wait
//! for a `Want`, so a file's data may reach the client before its manifest
//! entry. A scripted server sends the record first and the entry later; the
//! client must wait for the entry, place the file, and refuse data for an
//! entry that is not a file.

use longhaul_quic::identity::{provider, Identity};
use longhaul_quic::proto::{
    encode, Frame, FrameDecoder, Outcome, RecordHeader, ALPN, DATA_PRELUDE, VERSION,
};
use longhaul_quic::{ClientOpts, Kind, Progress};
use longhaul_transfer::{Entry, EntryKind};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const DATA: &[u8] = b"a file whose data overtakes its entry\n";
const MTIME_NS: i64 = 1_600_000_000_123_456_789;

/// What the scripted server sends as the manifest: the root entry of id 1.
fn root_entry(kind: EntryKind) -> Frame {
    Frame::Entry(Entry {
        id: 1,
        root: 0,
        path: vec![],
        kind,
        size: if kind == EntryKind::File {
            DATA.len() as u64
        } else {
            0
        },
        mode: if kind == EntryKind::File {
            0o640
        } else {
            0o755
        },
        mtime_ns: MTIME_NS,
        link: vec![],
        owner: Default::default(),
        xattrs: vec![],
        allocated: 0,
    })
}

/// What the scripted server saw of the client.
struct Seen {
    fresh: bool,
    frames: Vec<Frame>,
}

/// What the scripted server does after its Welcome, in order.
enum Step {
    /// First only: the Welcome says this instead of echoing `Hello.fresh`.
    Welcome(bool),
    /// File 1's only record, with its hash, on a data stream of its own.
    Record,
    /// A control frame.
    Send(Frame),
    Sleep(Duration),
}

/// Serves one session: Welcome, then `steps`; then collects the client's
/// frames until its stream ends or the connection closes.
async fn script(endpoint: quinn::Endpoint, steps: Vec<Step>) -> Seen {
    let conn = endpoint.accept().await.unwrap().await.unwrap();
    let (mut send, mut recv) = conn.accept_bi().await.unwrap();
    let mut dec = FrameDecoder::new();
    let mut frames = Vec::new();
    let next = async |dec: &mut FrameDecoder, recv: &mut quinn::RecvStream| loop {
        if let Some(f) = dec.next_frame().unwrap() {
            return Some(f);
        }
        match recv.read_chunk(1 << 16, true).await {
            Ok(Some(c)) => dec.push(&c.bytes),
            _ => return None,
        }
    };
    let fresh = match next(&mut dec, &mut recv).await {
        Some(Frame::Hello(h)) => h.fresh,
        other => panic!("expected Hello, got {other:?}"),
    };
    let welcome_fresh = match steps.first() {
        Some(Step::Welcome(f)) => *f,
        _ => fresh,
    };
    send.write_all(&encode(&Frame::Welcome {
        version: VERSION,
        server: "scripted".into(),
        fresh: welcome_fresh,
        streams: 0,
    }))
    .await
    .unwrap();
    // (Writes fail once a client that refused something has closed.)
    for step in steps {
        match step {
            Step::Welcome(_) => {}
            Step::Record => {
                let Ok(mut data) = conn.open_uni().await else {
                    break;
                };
                let h = RecordHeader {
                    id: 1,
                    offset: 0,
                    len: DATA.len() as u32,
                    hash: true,
                    zeros: false,
                    sparse: false,
                };
                let mut rec = DATA_PRELUDE.to_vec();
                rec.extend_from_slice(&h.encode());
                rec.extend_from_slice(DATA);
                rec.extend_from_slice(blake3::hash(DATA).as_bytes());
                let _ = data.write_all(&rec).await;
                let _ = data.finish();
            }
            Step::Send(f) => {
                let _ = send.write_all(&encode(&f)).await;
            }
            Step::Sleep(d) => tokio::time::sleep(d).await,
        }
    }
    while let Some(f) = next(&mut dec, &mut recv).await {
        frames.push(f);
    }
    let _ = send.finish();
    Seen { fresh, frames }
}

fn server(state: &Path) -> (quinn::Endpoint, String) {
    let id = Identity::load_or_create(state).unwrap();
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![id.cert.clone()], id.key.clone_key())
        .unwrap();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let ep = quinn::Endpoint::server(cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    (ep, id.fingerprint)
}

/// The record, and 300 ms later the entry of id 1 (it must wait for it).
fn record_first(entry: Frame) -> Vec<Step> {
    vec![
        Step::Record,
        Step::Sleep(Duration::from_millis(300)),
        Step::Send(entry),
        Step::Send(Frame::ManifestEnd),
    ]
}

/// The problem a get ended with: a session that failed reports it first
/// (with the files it settled before), one that never started has only it.
fn failure(
    r: Result<longhaul_quic::ClientReport, longhaul_quic::Problem>,
    what: &str,
) -> longhaul_quic::Problem {
    match r {
        Err(p) => p,
        Ok(rep) if !rep.ok => rep.problems[0].clone(),
        Ok(rep) => panic!("{what}, but it succeeded: {rep:?}"),
    }
}

async fn get_with(
    steps: Vec<Step>,
    dest: &Path,
    t: &Path,
) -> (
    Result<longhaul_quic::ClientReport, longhaul_quic::Problem>,
    Seen,
) {
    let (ep, fp) = server(&t.join("state"));
    let port = ep.local_addr().unwrap().port();
    let srv = tokio::spawn(script(ep, steps));
    let opts = ClientOpts::pinned(format!("127.0.0.1:{port}"), t.join("known_hosts"), fp);
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        longhaul_quic::get(
            "127.0.0.1",
            port,
            &["f.txt".to_string()],
            dest,
            &opts,
            Arc::new(Progress::default()),
        ),
    )
    .await
    .expect("the get ended");
    let seen = tokio::time::timeout(Duration::from_secs(20), srv)
        .await
        .expect("the server's script ended")
        .unwrap();
    (r, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_overtakes_its_entry_waits_for_it() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let steps = record_first(root_entry(EntryKind::File));
    let (r, seen) = get_with(steps, &dest, t.path()).await;
    let report = r.expect("the get succeeded");
    assert!(seen.fresh, "an empty destination is fresh");
    assert!(report.ok, "{:?}", report.problems);
    assert_eq!(report.totals.verified, 1);
    let placed = dest.join("f.txt");
    assert_eq!(std::fs::read(&placed).unwrap(), DATA);
    let meta = std::fs::metadata(&placed).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    let mtime = meta
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    assert_eq!(mtime.as_nanos() as i64, MTIME_NS);
    let names: Vec<_> = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f.txt"], "nothing else is left");
    // No Want in a fresh get; the file's result, then Done.
    assert!(
        !seen.frames.iter().any(|f| matches!(f, Frame::Want { .. })),
        "{:?}",
        seen.frames
    );
    assert!(seen.frames.iter().any(|f| matches!(
        f,
        Frame::FileResult {
            id: 1,
            outcome: Outcome::Verified
        }
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_for_an_entry_that_is_not_a_file_ends_the_session() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    // The entry first this time: once the manifest has ended and nothing is
    // left to settle, the session is over, and a record still on its way
    // would only be dropped.
    let steps = vec![
        Step::Send(root_entry(EntryKind::Dir)),
        Step::Sleep(Duration::from_millis(100)),
        Step::Record,
        Step::Sleep(Duration::from_millis(300)),
        Step::Send(Frame::ManifestEnd),
    ];
    let (r, seen) = get_with(steps, &dest, t.path()).await;
    assert!(seen.fresh);
    let p = failure(r, "the get failed");
    assert_eq!(p.kind, Kind::Connection, "{p}");
    assert!(
        p.message
            .contains("protocol error from the sender: data for unknown or settled file 1"),
        "{p}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_holds_a_target_is_not_fresh() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    // An earlier run's part of the target: the client must ask per file (and
    // the scripted server, which sends unasked, is refused at the record).
    std::fs::write(dest.join(".f.txt.lh-part"), b"stale").unwrap();
    let steps = record_first(root_entry(EntryKind::File));
    let (r, seen) = get_with(steps, &dest, t.path()).await;
    assert!(!seen.fresh, "a part beside the target: not fresh");
    let p = failure(r, "the unasked record is refused");
    assert!(
        p.message.contains("data for unknown or settled file 1"),
        "{p}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_welcomed_as_not_fresh_when_it_asked_fresh_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let mut steps = vec![Step::Welcome(false)];
    steps.extend(record_first(root_entry(EntryKind::File)));
    let (r, seen) = get_with(steps, &dest, t.path()).await;
    assert!(seen.fresh, "an empty destination is fresh");
    let p = failure(r, "the get failed");
    assert_eq!(p.kind, Kind::Connection, "{p}");
    assert!(
        p.message.contains(
            "protocol error: a get with Hello.fresh = true was welcomed with fresh = false"
        ),
        "{p}"
    );
    assert!(
        std::fs::read_dir(&dest).unwrap().next().is_none(),
        "nothing is written"
    );
}

/// A put whose receiver ends with `Done { ok: false }` and no file failed (a
/// directory's mode, the final sync) is not a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_whose_receiver_says_not_ok_fails() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("empty-dir");
    std::fs::create_dir(&src).unwrap();
    let (ep, fp) = server(&t.path().join("state"));
    let port = ep.local_addr().unwrap().port();
    let srv = tokio::spawn(script(
        ep,
        vec![
            Step::Sleep(Duration::from_millis(200)),
            Step::Send(Frame::Done {
                ok: false,
                behind_ms: 0,
            }),
        ],
    ));
    let opts = ClientOpts::pinned(format!("127.0.0.1:{port}"), t.path().join("kh"), fp);
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        longhaul_quic::put(
            &[src],
            "127.0.0.1",
            port,
            b"in/",
            &opts,
            Arc::new(Progress::default()),
        ),
    )
    .await
    .expect("the put ended");
    let _ = tokio::time::timeout(Duration::from_secs(20), srv).await;
    let report = r.expect("a report");
    assert!(!report.ok);
    assert_eq!(
        report.problems[0].kind,
        Kind::Remote,
        "{:?}",
        report.problems
    );
    assert!(
        report.problems[0]
            .message
            .contains("the receiver ended with a problem outside the files"),
        "{:?}",
        report.problems
    );
}
