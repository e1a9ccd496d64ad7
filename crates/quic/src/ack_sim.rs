//! ACK frequency on longhaul's transport, deterministically: two
//! quinn-proto connections with longhaul's settings (`NetOpts::transport`,
//! the `wan` controller, the patched quinn) over a simulated path (a rate,
//! a one-way delay, a 1,500-byte MTU, no loss) in simulated time. The
//! sender (the client, as in a put) writes one stream; the receiver reads
//! it as it comes.

use crate::cc::{CcChoice, CcFactory};
use crate::identity::{provider, PinVerifier, TrustPolicy};
use crate::net::NetOpts;
use crate::proto::ALPN;
use bytes::BytesMut;
use quinn_proto::{
    ClientConfig, Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig,
    Event, ServerConfig, StreamEvent, StreamId,
};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One direction of the path: serialised at `bps`, delivered `delay` later,
/// datagrams over the MTU's payload dropped (quinn's MTU probes).
struct Link {
    bps: f64,
    delay: Duration,
    busy_until: Instant,
    queue: VecDeque<(Instant, Vec<u8>)>,
}

impl Link {
    fn new(bps: f64, delay: Duration, now: Instant) -> Link {
        Link {
            bps,
            delay,
            busy_until: now,
            queue: VecDeque::new(),
        }
    }

    fn send(&mut self, now: Instant, datagram: &[u8]) {
        if datagram.len() > 1472 {
            return;
        }
        let start = self.busy_until.max(now);
        let done = start + Duration::from_secs_f64((datagram.len() + 28) as f64 * 8.0 / self.bps);
        self.busy_until = done;
        self.queue.push_back((done + self.delay, datagram.to_vec()));
    }
}

/// What a run saw.
struct Outcome {
    /// When the receiver had every byte, and when the sender learnt that
    /// all of them were acknowledged (the stream's `Finished`).
    received: Duration,
    acked: Duration,
    /// ACK frames the sender received, packets it sent.
    acks: u64,
    packets: u64,
}

const CLIENT: &str = "10.99.0.2:40000";
const SERVER: &str = "10.99.0.1:4433";

fn configs(server: SocketAddr) -> (ClientConfig, ServerConfig) {
    let net = NetOpts::default();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["longhaul".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let mut sc = ServerConfig::with_crypto(Arc::new(crypto));
    let receives = CcFactory::new(CcChoice::Wan(0), 0);
    sc.transport_config(Arc::new(net.transport(
        CLIENT.parse().unwrap(),
        receives,
        false,
    )));

    let verifier = Arc::new(PinVerifier::new(TrustPolicy {
        host: server.to_string(),
        known_hosts: None,
        pinned: None,
        accept_new: true,
    }));
    let tls = crate::identity::client_tls(verifier).unwrap();
    let crypto = quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut cc = ClientConfig::new(Arc::new(crypto));
    let sends = CcFactory::new(CcChoice::Wan(0), 0);
    cc.transport_config(Arc::new(net.transport(server, sends, true)));
    (cc, sc)
}

/// One side's datagrams onto its link, and its events to and from its
/// endpoint; whether anything moved.
fn pump(
    ep: &mut Endpoint,
    (ch, conn): &mut (ConnectionHandle, Connection),
    link: &mut Link,
    now: Instant,
    buf: &mut Vec<u8>,
) -> bool {
    let mut moved = false;
    while let Some(t) = conn.poll_transmit(now, 1, buf) {
        link.send(now, &buf[..t.size]);
        buf.clear();
        moved = true;
    }
    while let Some(ev) = conn.poll_endpoint_events() {
        if let Some(ev) = ep.handle_event(*ch, ev) {
            conn.handle_event(ev);
        }
        moved = true;
    }
    moved
}

/// Sends `bytes` on one stream over a path of `bps` and `one_way` delay.
fn run(bps: f64, one_way: Duration, bytes: usize) -> Outcome {
    let t0 = Instant::now();
    let mut now = t0;
    let (caddr, saddr): (SocketAddr, SocketAddr) =
        (CLIENT.parse().unwrap(), SERVER.parse().unwrap());
    let (ccfg, scfg) = configs(saddr);
    let seed = |b: u8| Some([b; 32]);
    let mut cep = Endpoint::new(Arc::new(EndpointConfig::default()), None, true, seed(1));
    let mut sep = Endpoint::new(
        Arc::new(EndpointConfig::default()),
        Some(Arc::new(scfg)),
        true,
        seed(2),
    );
    let (cch, client) = cep.connect(now, ccfg, saddr, "longhaul").unwrap();
    let mut client = (cch, client);
    let mut server: Option<(ConnectionHandle, Connection)> = None;
    let mut up = Link::new(bps, one_way, now);
    let mut down = Link::new(bps, one_way, now);
    let data = vec![0x5au8; bytes];
    let (mut stream, mut written, mut finished) = (None::<StreamId>, 0usize, false);
    let (mut got, mut received, mut acked) = (0usize, None, None);
    let mut buf = Vec::new();
    while acked.is_none() {
        assert!(
            now - t0 < Duration::from_secs(120),
            "stuck: {got} of {bytes} bytes"
        );
        // The sender's application: write while the stream takes it.
        while let Some(ev) = client.1.poll() {
            match ev {
                Event::Connected => stream = client.1.streams().open(Dir::Uni),
                Event::Stream(StreamEvent::Finished { .. }) => acked = Some(now - t0),
                Event::ConnectionLost { reason } => panic!("lost: {reason}"),
                _ => {}
            }
        }
        if let (Some(id), false) = (stream, finished) {
            let mut s = client.1.send_stream(id);
            while written < bytes {
                match s.write(&data[written..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => written += n,
                }
            }
            if written == bytes {
                s.finish().unwrap();
                finished = true;
            }
        }
        // The receiver's application: read all there is.
        if let Some((_, conn)) = &mut server {
            while let Some(ev) = conn.poll() {
                if let Event::ConnectionLost { reason } = ev {
                    panic!("lost: {reason}");
                }
            }
            while let Some(id) = conn.streams().accept(Dir::Uni) {
                let _ = id;
            }
            let mut rs = conn.recv_stream(StreamId::new(quinn_proto::Side::Client, Dir::Uni, 0));
            if let Ok(mut chunks) = rs.read(true) {
                while let Ok(Some(c)) = chunks.next(usize::MAX) {
                    got += c.bytes.len();
                }
                let _ = chunks.finalize();
            }
            if got == bytes && received.is_none() {
                received = Some(now - t0);
            }
        }
        // Transmit, and route endpoint events.
        loop {
            let mut moved = pump(&mut cep, &mut client, &mut up, now, &mut buf);
            if let Some(server) = &mut server {
                moved |= pump(&mut sep, server, &mut down, now, &mut buf);
            }
            if !moved {
                break;
            }
        }
        // The next event: a delivery or a timer.
        let mut next = [
            up.queue.front().map(|d| d.0),
            down.queue.front().map(|d| d.0),
            client.1.poll_timeout(),
            server.as_mut().and_then(|s| s.1.poll_timeout()),
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("something pending");
        next = next.max(now);
        now = next;
        while up.queue.front().is_some_and(|d| d.0 <= now) {
            let (_, d) = up.queue.pop_front().unwrap();
            match sep.handle(now, caddr, None, None, BytesMut::from(&d[..]), &mut buf) {
                Some(DatagramEvent::NewConnection(inc)) => {
                    let mut resp = Vec::new();
                    server = Some(sep.accept(inc, now, &mut resp, None).unwrap());
                }
                Some(DatagramEvent::ConnectionEvent(_, ev)) => {
                    server.as_mut().expect("accepted").1.handle_event(ev)
                }
                Some(DatagramEvent::Response(_)) | None => {}
            }
            buf.clear();
        }
        while down.queue.front().is_some_and(|d| d.0 <= now) {
            let (_, d) = down.queue.pop_front().unwrap();
            if let Some(DatagramEvent::ConnectionEvent(_, ev)) =
                cep.handle(now, saddr, None, None, BytesMut::from(&d[..]), &mut buf)
            {
                client.1.handle_event(ev);
            }
            buf.clear();
        }
        for conn in std::iter::once(&mut client.1).chain(server.as_mut().map(|s| &mut s.1)) {
            if conn.poll_timeout().is_some_and(|t| t <= now) {
                conn.handle_timeout(now);
            }
        }
    }
    let stats = client.1.stats();
    Outcome {
        received: received.expect("all received before all acknowledged"),
        acked: acked.unwrap(),
        acks: stats.frame_rx.acks,
        packets: stats.path.sent_packets,
    }
}

/// A fast, long flight is acknowledged once per 2 ms of it (here up to 128
/// ack-eliciting packets apart, the most), not every other packet; and the
/// last of it at once, though the receiver could hold it for 25 ms.
#[test]
fn a_fast_long_flight_is_acknowledged_rarely_and_its_end_at_once() {
    let one_way = Duration::from_millis(20);
    let o = run(1e9, one_way, 64 << 20);
    // (Every other packet would be 1 in 2; the receiver's own packets,
    // window updates, carry ACKs too.)
    assert!(
        o.acks * 10 < o.packets,
        "{} ACK frames for {} packets",
        o.acks,
        o.packets
    );
    // The sender ran out of data and asked for the ACK at once: it came a
    // one-way delay (and a last datagram's serialisation) after the
    // receiver had everything, not its max_ack_delay (25 ms) later.
    let lag = o.acked - o.received;
    assert!(
        lag < one_way + Duration::from_millis(3),
        "all acknowledged {lag:?} after all received"
    );
}

/// Where an ACK per sixteenth of the flight would be held longer than 2 ms
/// (seed 001's path D: 10 Mbit/s, 300 ms, 16 packets are 19 ms), and on a
/// slow link, every other packet is acknowledged, as without the extension.
#[test]
fn slow_paths_are_acknowledged_every_other_packet() {
    for (bps, one_way, bytes) in [
        (1e6, Duration::from_millis(125), 200_000),
        (10e6, Duration::from_millis(150), 3_000_000),
    ] {
        let o = run(bps, one_way, bytes);
        assert!(
            o.acks * 5 > o.packets * 2,
            "{bps} bit/s: {} ACK frames for {} packets",
            o.acks,
            o.packets
        );
    }
}
