//! The control stream's I/O: a writer task that batches frames onto the stream and
//! a reader task that decodes them, so session loops can `select!` on a channel.

use crate::proto::{encode, Frame, FrameDecoder};
use crate::report::{Kind, Problem};
use quinn::{RecvStream, SendStream};
use tokio::sync::mpsc;

/// Sends frames on the control stream. Dropping every clone finishes the stream.
#[derive(Clone)]
pub(crate) struct CtlTx(mpsc::Sender<Frame>);

impl CtlTx {
    pub(crate) async fn send(&self, f: Frame) -> Result<(), Problem> {
        self.0
            .send(f)
            .await
            .map_err(|_| Problem::new(Kind::Connection, "control stream closed"))
    }
}

pub(crate) type CtlRx = mpsc::Receiver<Result<Frame, Problem>>;

/// quinn's priority for the control stream (data streams keep the default 0).
pub(crate) const CONTROL_PRIORITY: i32 = 1;

/// The control stream's writer task.
pub(crate) type Writer = tokio::task::JoinHandle<Result<SendStream, Problem>>;

/// Start the writer; the returned handle ends when the stream is finished,
/// and hands the stream back (to wait until the peer has acknowledged it all).
pub(crate) fn spawn_writer(mut send: SendStream) -> (CtlTx, Writer) {
    // Control frames go before data queued on the data streams: a request,
    // an answer or a file's hash is a few bytes that the peer waits on (a
    // receiver places a small file as soon as it has both its data and its
    // hash; behind the data, the hash came hundreds of files late).
    let _ = send.set_priority(CONTROL_PRIORITY);
    let (tx, mut rx) = mpsc::channel::<Frame>(1024);
    let task = tokio::spawn(async move {
        let mut buf = Vec::with_capacity(64 * 1024);
        while let Some(f) = rx.recv().await {
            buf.extend_from_slice(&encode(&f));
            while buf.len() < 256 * 1024 {
                match rx.try_recv() {
                    Ok(f) => buf.extend_from_slice(&encode(&f)),
                    Err(_) => break,
                }
            }
            send.write_all(&buf).await.map_err(|e| {
                Problem::new(Kind::Connection, format!("control stream: {}", chain(&e)))
            })?;
            buf.clear();
        }
        let _ = send.finish();
        Ok(send)
    });
    (CtlTx(tx), task)
}

/// A peer whose control stream ended early usually closed the connection
/// just after (Ctrl-C, a shutdown): wait a moment for that close and name
/// its reason ("the sender closed the session early: closed by peer: 2
/// (interrupted by the user)"), so logs and reports say why.
pub(crate) async fn with_close_reason(conn: &quinn::Connection, p: Problem) -> Problem {
    if p.kind != Kind::Connection || !p.message.ends_with("closed the session early") {
        return p;
    }
    let wait = std::time::Duration::from_millis(250);
    match tokio::time::timeout(wait, conn.closed()).await {
        Ok(e) => Problem {
            message: format!("{}: {}", p.message, chain(&e)),
            ..p
        },
        Err(_) => p,
    }
}

/// An error with its causes ("connection lost: timed out"): quinn's stream
/// errors name only the outer one.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.ends_with(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// Start the reader. A protocol error is delivered as the last item; a clean end
/// of stream closes the channel.
pub(crate) fn spawn_reader(mut recv: RecvStream) -> CtlRx {
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(async move {
        if let Err(p) = read_frames(&mut recv, &tx).await {
            let _ = tx.send(Err(p)).await;
        }
    });
    rx
}

/// Decode frames until the stream ends cleanly (Ok) or fails (Err, to be delivered).
async fn read_frames(
    recv: &mut RecvStream,
    tx: &mpsc::Sender<Result<Frame, Problem>>,
) -> Result<(), Problem> {
    let protocol = |e: crate::proto::ProtoError| Problem {
        peer_version: match e {
            crate::proto::ProtoError::Version(v) => Some(v),
            _ => None,
        },
        ..Problem::new(Kind::Connection, format!("protocol error: {e}"))
    };
    let mut dec = FrameDecoder::new();
    loop {
        while let Some(f) = dec.next_frame().map_err(protocol)? {
            if tx.send(Ok(f)).await.is_err() {
                return Ok(()); // nobody listens any more
            }
        }
        match recv.read_chunk(64 * 1024, true).await {
            Ok(Some(c)) => dec.push(&c.bytes),
            Ok(None) => return dec.finish().map_err(protocol),
            Err(e) => {
                return Err(Problem::new(
                    Kind::Connection,
                    format!("control stream: {}", chain(&e)),
                ))
            }
        }
    }
}
