//! How a session's connections end: the application close codes, closing
//! one so that its CONNECTION_CLOSE leaves, and telling a connection lost
//! (to its path, or to a server that asked to be tried later) from one
//! refused. The client and the server both close and both judge closes.

use std::time::{Duration, Instant};

/// The application close code of a session that ended as it should (`done`).
pub(crate) const DONE: u32 = 0;

/// The application close code of a connection the user interrupted.
pub(crate) const INTERRUPTED: u32 = 2;

/// The application close code of connections a shutting-down server closes.
pub(crate) const SHUTDOWN: u32 = 3;
/// The application close code of a connection refused because the server
/// already serves `max_sessions`.
pub(crate) const BUSY: u32 = 4;

/// Whether a connection that ended with `e` was lost to its path (an idle
/// timeout, a stateless reset from a server that restarted) or to a server
/// that asked to be tried later (shutting down, busy), not refused.
pub(crate) fn lost(e: &quinn::ConnectionError) -> bool {
    match e {
        quinn::ConnectionError::TimedOut | quinn::ConnectionError::Reset => true,
        quinn::ConnectionError::ApplicationClosed(a) => {
            a.error_code == quinn::VarInt::from_u32(SHUTDOWN)
                || a.error_code == quinn::VarInt::from_u32(BUSY)
        }
        _ => false,
    }
}

/// Whether a connection that ended with `e` was closed as a session's end
/// ([`DONE`]).
pub(crate) fn done(e: &quinn::ConnectionError) -> bool {
    matches!(e, quinn::ConnectionError::ApplicationClosed(a) if a.error_code == quinn::VarInt::from_u32(DONE))
}

/// Yields to the runtime before [`until`] waits on its timer: a timer's
/// millisecond costs 1-2 ms, and at the end of a get the Done frame or the
/// CONNECTION_CLOSE waited that long in one get of two on a LAN (a 1-file
/// get took 4-7 ms in all).
const YIELDS: usize = 16;

/// Polls `done` until it holds or `max` has passed: first after each of a
/// few yields to the runtime (what is waited for is mostly quinn's
/// connection task sending what was queued, which runs as soon as this task
/// lets it), then every millisecond.
pub(crate) async fn until(max: Duration, done: impl Fn() -> bool) {
    let end = Instant::now() + max;
    for _ in 0..YIELDS {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    while !done() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Close `conn` and wait (at most 250 ms) until the CONNECTION_CLOSE has
/// left. Waiting out the draining period (three PTOs: 2 s or more at 700 ms
/// RTT) would only add to every transfer's time; a server that misses the
/// close times the connection out.
pub(crate) async fn close_sent(conn: &quinn::Connection, code: u32, reason: &[u8]) {
    if conn.close_reason().is_some() {
        return; // closed already (by the peer, say): nothing will be sent
    }
    let sent = conn.stats().udp_tx.datagrams;
    conn.close(code.into(), reason);
    until(Duration::from_millis(250), || {
        conn.stats().udp_tx.datagrams > sent
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_another_task_ends_takes_no_timer_tick() {
        // The other task (quinn's connection task, at the end of a get)
        // runs once this one yields: no millisecond is waited out.
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        tokio::spawn(async move { f.store(true, Ordering::Relaxed) });
        let t0 = tokio::time::Instant::now();
        until(Duration::from_millis(250), || flag.load(Ordering::Relaxed)).await;
        assert!(flag.load(Ordering::Relaxed));
        assert_eq!(tokio::time::Instant::now(), t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_nothing_ends_stops_at_its_bound() {
        let t0 = tokio::time::Instant::now();
        until(Duration::from_millis(5), || false).await;
        assert!(tokio::time::Instant::now() >= t0 + Duration::from_millis(5));
    }
}
