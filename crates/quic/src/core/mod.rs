//! Sans-IO cores of the unicast roles: frames, records, finished I/O and the
//! time in; frames, file-system jobs and events out. The drivers
//! ([`crate::receiver`], [`crate::sender`]) move bytes between them and quinn and run the jobs.

pub(crate) mod recv;
pub(crate) mod repair;
pub(crate) mod send;

use crate::proto::Frame;
use crate::report::Problem;
use std::time::Instant;

/// Where a role's session stands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum State {
    Running,
    /// Done: the receiver settled every entry (and queued `Done`), or the
    /// sender read the receiver's `Done`.
    Finished,
    /// The session failed; a `Fatal` for the peer is queued when this
    /// side's disk failed, otherwise the driver closes.
    Failed(Problem),
}

/// What both roles take from the control stream.
pub(crate) trait Role {
    fn handle_frame(&mut self, now: Instant, frame: Frame);
    /// The session failed outside the core (a stream, the connection).
    fn handle_failure(&mut self, p: Problem);
    /// The control stream ended before the session did.
    fn handle_control_end(&mut self);
    fn state(&self) -> &State;

    /// Feed what the control stream's reader delivered (`None`: it ended).
    fn handle_control(&mut self, now: Instant, item: Option<Result<Frame, Problem>>) {
        match item {
            Some(Ok(frame)) => self.handle_frame(now, frame),
            Some(Err(p)) => self.handle_failure(p),
            None => self.handle_control_end(),
        }
    }

    /// `Some` once the session is over.
    fn outcome(&self) -> Option<Result<(), Problem>> {
        match self.state() {
            State::Running => None,
            State::Finished => Some(Ok(())),
            State::Failed(p) => Some(Err(p.clone())),
        }
    }
}

#[cfg(test)]
mod recv_sim;
#[cfg(test)]
mod send_sim;
