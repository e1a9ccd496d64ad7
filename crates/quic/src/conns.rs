//! The QUIC connections one session runs over (`--connections N`): the
//! first, whose control stream carries the session, and the others as they
//! join it (a client opens them at once; a server hears their `Join`s). Data
//! lanes are spread over them, lane `i` on connection `i mod N`.

use crate::report::{Kind, Problem};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How long a lane waits for its connection to join before the session fails.
pub(crate) const JOIN_WAIT: Duration = Duration::from_secs(10);

/// A session's connections: the first, and the others as they come up.
pub(crate) struct Conns {
    /// The connection of the control stream.
    pub first: quinn::Connection,
    /// How many the session runs over, the first included (at least 1).
    pub count: usize,
    /// The others with their index (1 to `count` − 1), each once it is up.
    pub more: mpsc::UnboundedReceiver<(u32, quinn::Connection)>,
}

impl Conns {
    /// A session over one connection.
    pub(crate) fn one(first: quinn::Connection) -> Conns {
        Conns::known(first, vec![])
    }

    /// A session over `first` and `others` (index 1, 2, ...), all up.
    pub(crate) fn known(first: quinn::Connection, others: Vec<quinn::Connection>) -> Conns {
        let (tx, more) = mpsc::unbounded_channel();
        let count = others.len() + 1;
        for (i, c) in others.into_iter().enumerate() {
            let _ = tx.send((i as u32 + 1, c));
        }
        Conns { first, count, more }
    }
}

/// Connection `i` of a session for the lanes that use it, once it is up
/// (`C`: a connection; generic for the tests).
pub(crate) struct Slots<C = quinn::Connection> {
    slots: Vec<watch::Receiver<Option<C>>>,
    /// Fills the slots as the connections come; aborted on drop.
    filler: tokio::task::JoinHandle<()>,
}

impl Slots {
    /// Slots for `conns`, the first filled at once.
    pub(crate) fn new(conns: Conns) -> Slots {
        Slots::of(conns.first, conns.count, conns.more)
    }
}

impl<C: Clone + Send + Sync + 'static> Slots<C> {
    /// Slots for `count` connections: `first`, then the others from `more`
    /// (index, connection) as they come.
    fn of(first: C, count: usize, mut more: mpsc::UnboundedReceiver<(u32, C)>) -> Slots<C> {
        let (txs, slots): (Vec<_>, Vec<_>) = (0..count.max(1))
            .map(|i| watch::channel((i == 0).then(|| first.clone())))
            .unzip();
        let filler = tokio::spawn(async move {
            while let Some((i, c)) = more.recv().await {
                if let Some(tx) = txs.get(i as usize) {
                    let _ = tx.send(Some(c));
                }
            }
        });
        Slots { slots, filler }
    }

    /// How many connections the session runs over.
    pub(crate) fn count(&self) -> usize {
        self.slots.len()
    }

    /// The connection lane `lane` sends or receives on, waiting up to
    /// [`JOIN_WAIT`] for it to join.
    pub(crate) fn for_lane(&self, lane: usize) -> ConnSlot<C> {
        let i = lane % self.slots.len();
        ConnSlot {
            index: i,
            rx: self.slots[i].clone(),
        }
    }
}

impl<C> Drop for Slots<C> {
    fn drop(&mut self) {
        self.filler.abort();
    }
}

/// One lane's connection, possibly not up yet.
pub(crate) struct ConnSlot<C = quinn::Connection> {
    index: usize,
    rx: watch::Receiver<Option<C>>,
}

impl<C: Clone> ConnSlot<C> {
    /// The connection, once it has joined (at once for the first).
    pub(crate) async fn get(&mut self) -> Result<C, Problem> {
        let index = self.index;
        let missing = || {
            Problem::new(
                Kind::Connection,
                format!(
                    "connection {index} of the session did not join within {} s",
                    JOIN_WAIT.as_secs()
                ),
            )
        };
        match tokio::time::timeout(JOIN_WAIT, self.rx.wait_for(|c| c.is_some())).await {
            Ok(Ok(c)) => Ok(c.clone().expect("waited for it")),
            _ => Err(missing()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn lanes_take_their_connection_once_it_joins_or_fail_after_the_wait() {
        let (tx, more) = mpsc::unbounded_channel();
        let slots = Slots::of("first", 3, more);
        assert_eq!(slots.count(), 3);
        // Lanes 0 and 3 on the first, 1 and 4 on the second, 2 on the third.
        assert_eq!(slots.for_lane(3).get().await.unwrap(), "first");
        let mut second = slots.for_lane(4);
        let mut third = slots.for_lane(2);
        let waiting = tokio::spawn(async move { second.get().await });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished(), "the lane waits for its connection");
        tx.send((1, "second")).unwrap();
        assert_eq!(waiting.await.unwrap().unwrap(), "second");
        // The third never joins: its lane gives up after JOIN_WAIT.
        let started = tokio::time::Instant::now();
        let e = third.get().await.unwrap_err();
        assert_eq!(started.elapsed(), JOIN_WAIT);
        assert!(
            e.message
                .contains("connection 2 of the session did not join within 10 s"),
            "{e}"
        );
        // An index past the session's connections is ignored.
        tx.send((7, "stray")).unwrap();
        assert_eq!(slots.for_lane(1).get().await.unwrap(), "second");
    }
}
