//! A raw QUIC client for hostile tests: it speaks longhaul's control frames
//! byte by byte (TLS 1.3 with the trust-on-first-use verifier, the longhaul
//! ALPN), so a test can send what no real client would and read exactly
//! what the server answers.

use longhaul_quic::identity::{PinVerifier, TrustPolicy};
use longhaul_quic::proto::{encode, ErrorCode, Frame, FrameDecoder, Hello, Op, VERSION};
use rustls::client::{Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The client's session store: keeps nothing, counts the TLS 1.3 session
/// tickets the server sent.
#[derive(Debug, Default)]
pub struct TicketCount(AtomicUsize);

impl TicketCount {
    /// Tickets received so far.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl rustls::client::ClientSessionStore for TicketCount {
    fn set_kx_hint(&self, _: ServerName<'static>, _: rustls::NamedGroup) {}
    fn kx_hint(&self, _: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        None
    }
    fn set_tls12_session(&self, _: ServerName<'static>, _: Tls12ClientSessionValue) {}
    fn tls12_session(&self, _: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        None
    }
    fn remove_tls12_session(&self, _: &ServerName<'static>) {}
    fn insert_tls13_ticket(&self, _: ServerName<'static>, _: Tls13ClientSessionValue) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        None
    }
}

/// A client configuration for `addr` that trusts whatever key it shows
/// (recording it in the known-hosts file, if given) and counts the tickets
/// it is sent.
pub(crate) fn client_config(
    addr: SocketAddr,
    kept: Option<(PathBuf, Arc<TicketCount>)>,
) -> quinn::ClientConfig {
    let (known_hosts, tickets) = match kept {
        Some((k, t)) => (Some(k), t),
        None => (None, Arc::default()),
    };
    let verifier = Arc::new(PinVerifier::new(TrustPolicy {
        host: addr.to_string(),
        known_hosts,
        pinned: None,
        accept_new: true,
    }));
    let mut tls = longhaul_quic::identity::client_tls(verifier).unwrap();
    tls.resumption = rustls::client::Resumption::store(tickets);
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    quinn::ClientConfig::new(Arc::new(crypto))
}

/// A connection and its control stream.
pub struct Raw {
    _endpoint: quinn::Endpoint,
    /// Session tickets the server sent on this connection.
    pub tickets: Arc<TicketCount>,
    pub conn: quinn::Connection,
    pub send: quinn::SendStream,
    pub recv: quinn::RecvStream,
    dec: FrameDecoder,
    /// How long [`Raw::next`] waits for a frame.
    pub patience: Duration,
}

impl Raw {
    /// Connects to `addr`, trusting (and recording in `known_hosts`) whatever
    /// key it shows, and opens the control stream.
    pub async fn connect(addr: SocketAddr, known_hosts: PathBuf) -> Raw {
        let tickets = Arc::new(TicketCount::default());
        let cfg = client_config(addr, Some((known_hosts, tickets.clone())));
        let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let conn = endpoint
            .connect_with(cfg, addr, "longhaul")
            .unwrap()
            .await
            .expect("handshake");
        let (send, recv) = conn.open_bi().await.unwrap();
        Raw {
            _endpoint: endpoint,
            tickets,
            conn,
            send,
            recv,
            dec: FrameDecoder::new(),
            patience: Duration::from_secs(10),
        }
    }

    /// Writes raw bytes on the control stream.
    pub async fn write(&mut self, bytes: &[u8]) {
        self.send.write_all(bytes).await.expect("writing");
    }

    /// Writes one encoded frame.
    pub async fn frame(&mut self, f: &Frame) {
        self.write(&encode(f)).await;
    }

    /// The next control frame from the server; `None` at end of stream, on a
    /// connection error, or after [`Raw::patience`].
    pub async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.dec.next_frame().expect("the server's frames decode") {
                return Some(f);
            }
            let chunk = tokio::time::timeout(self.patience, self.recv.read_chunk(1 << 16, true));
            match chunk.await {
                Ok(Ok(Some(c))) => self.dec.push(&c.bytes),
                _ => return None,
            }
        }
    }

    /// A Hello of the current version for `op`, with every option at its default.
    pub async fn hello(&mut self, op: Op) {
        self.frame(&Frame::Hello(Hello {
            version: VERSION,
            token: vec![],
            op,
            max_rate: 0,
            cc: None,
            fresh: false,
            streams: 0,
            connections: 0,
            session: vec![],
        }))
        .await;
    }

    /// A Hello of a put of the one root `root` into the directory `dest`
    /// (`--sync`'s default, not durable).
    pub async fn put_hello(&mut self, dest: &[u8], root: &[u8]) {
        self.hello(Op::Put {
            dest: dest.to_vec(),
            dest_is_dir: true,
            roots: vec![longhaul_quic::proto::RootSpec {
                name: root.to_vec(),
            }],
            sync: longhaul_quic::proto::PutSync::Always,
            durable: false,
            specials: false,
            delete: false,
            filters: vec![],
            dry_run: false,
            numeric_ids: false,
            shard: None,
        })
        .await;
    }

    /// The server's Welcome; returns its `fresh`.
    pub async fn welcome(&mut self) -> bool {
        match self.next().await {
            Some(Frame::Welcome { version, fresh, .. }) => {
                assert_eq!(version, VERSION);
                fresh
            }
            other => panic!("expected Welcome, got {other:?}"),
        }
    }

    /// The first Fatal frame the server sends (other frames are skipped);
    /// `None` if the stream ends without one.
    pub async fn fatal(&mut self) -> Option<(ErrorCode, String)> {
        loop {
            match self.next().await? {
                Frame::Fatal { code, message } => return Some((code, message)),
                _ => continue,
            }
        }
    }

    /// Expects a Fatal frame of `code` whose message holds every one of
    /// `needles` (the server may leave closing to the client).
    pub async fn expect_fatal_frame(&mut self, code: ErrorCode, needles: &[&str]) {
        let Some(fatal) = self.fatal().await else {
            panic!(
                "no Fatal frame (close reason {:?})",
                self.conn.close_reason()
            );
        };
        assert_eq!(fatal.0, code, "{fatal:?}");
        for n in needles {
            assert!(fatal.1.contains(n), "Fatal {:?} lacks {n:?}", fatal.1);
        }
    }

    /// Expects the session to end with a Fatal frame of `code`, and then the
    /// server's application close (code 1), both naming every one of `needles`.
    pub async fn expect_fatal(mut self, code: ErrorCode, needles: &[&str]) {
        self.expect_fatal_frame(code, needles).await;
        let closed = tokio::time::timeout(Duration::from_secs(5), self.conn.closed())
            .await
            .expect("the server closes the connection");
        match closed {
            quinn::ConnectionError::ApplicationClosed(a) => {
                let reason = String::from_utf8_lossy(&a.reason);
                assert_eq!(a.error_code, quinn::VarInt::from_u32(1), "{a:?}");
                for n in needles {
                    assert!(reason.contains(n), "close reason {reason:?} lacks {n:?}");
                }
            }
            other => panic!("expected an application close, got {other:?}"),
        }
    }
}
