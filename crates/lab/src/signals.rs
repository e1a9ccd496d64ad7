//! Stop signals for the lab's long-running processes (the emulator daemon, a
//! suite run, a multicast session): SIGINT, SIGTERM and SIGHUP are blocked
//! in every thread and taken by one waiting thread (or the emulator's
//! signalfd), so that an interrupted run always reaches its clean-up.

use std::io;

/// SIGINT, SIGTERM and SIGHUP: the signals that stop a lab, a suite run or
/// the emulator.
pub fn stop_set() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local, zero-initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks the stop signals in this thread (and every thread it spawns
/// afterwards) so that only [`wait_stop`] or a signalfd sees them. Call it
/// before spawning any thread.
pub fn block_stop() -> io::Result<()> {
    let set = stop_set();
    // SAFETY: pthread_sigmask with a valid set.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Waits for a stop signal (blocked beforehand by [`block_stop`]); returns
/// which one.
pub fn wait_stop() -> Option<libc::c_int> {
    let set = stop_set();
    let mut sig = 0;
    // SAFETY: sigwait with a valid set and out-pointer.
    (unsafe { libc::sigwait(&set, &mut sig) } == 0).then_some(sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_stop_signal_is_taken_by_wait_stop() {
        // A thread of its own, so the test harness's other threads keep
        // their masks; the signal is sent to this thread only.
        std::thread::spawn(|| {
            block_stop().unwrap();
            // SAFETY: pthread_kill to our own thread with a valid signal.
            let r = unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGHUP) };
            assert_eq!(r, 0);
            assert_eq!(wait_stop(), Some(libc::SIGHUP));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_stop_set_holds_the_three_signals_and_no_other() {
        let set = stop_set();
        for s in 1..32 {
            // SAFETY: sigismember on a valid set.
            let member = unsafe { libc::sigismember(&set, s) } == 1;
            let want = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP].contains(&s);
            assert_eq!(member, want, "signal {s}");
        }
    }
}
