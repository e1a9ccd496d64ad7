//! The Linux driver: one thread that moves packets between TUN ports through
//! the [`Hub`]. It sleeps in `epoll_wait` until a port has packets or the
//! hub's next deadline (a `timerfd` on CLOCK_MONOTONIC, absolute time, 1 µs
//! timer slack) comes; it never busy-polls. Reads drain each port in batches,
//! writes drain everything due. Other threads talk to it through a [`Handle`].

use crate::hub::{Hub, Snapshot};
use crate::pcap::PcapWriter;
use crate::tun::Tun;
use std::fs::File;
use std::io::{self, BufWriter};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::Arc;

/// Requests other threads may make.
pub enum Request {
    /// Send a [`Snapshot`] of every counter back on this channel.
    Snapshot(mpsc::SyncSender<Snapshot>),
    /// Start (or restart at 0) the links' schedule clock, or hold it, then
    /// send a [`Snapshot`] taken at that instant back on this channel.
    Schedule(ScheduleOp, mpsc::SyncSender<Snapshot>),
    /// Make [`Driver::run`] return with the final counters.
    Stop,
}

/// What to do with the links' schedule clock (see [`crate::spec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleOp {
    /// Start it at 0 now ([`Hub::start_schedule`]).
    Start,
    /// Hold it: every link its base spec ([`Hub::hold_schedule`]).
    Hold,
}

/// Talks to a running driver from another thread.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Request>,
    wake: Arc<OwnedFd>,
}

impl Handle {
    /// A snapshot of every counter; `None` if the driver has stopped.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.tx.send(Request::Snapshot(tx)).ok()?;
        self.kick();
        rx.recv().ok()
    }

    /// Starts or holds the schedule clock; the snapshot is taken at the same
    /// instant. `None` if the driver has stopped.
    pub fn schedule(&self, op: ScheduleOp) -> Option<Snapshot> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.tx.send(Request::Schedule(op, tx)).ok()?;
        self.kick();
        rx.recv().ok()
    }

    /// Asks the driver to stop; `run` then returns.
    pub fn stop(&self) {
        let _ = self.tx.send(Request::Stop);
        self.kick();
    }

    fn kick(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to an eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// Driver options.
pub struct Options {
    /// Capture every packet the hosts send (first `snaplen` bytes).
    pub pcap: Option<(File, u32)>,
    /// Minimum time between two timer wake-ups (ns). Under load, packets due
    /// in between leave together, at most this late; sparse packets still
    /// leave on time. 0 = wake for every deadline.
    pub batch_ns: u64,
    /// Stop when one of these signals arrives (read from a signalfd). The
    /// caller must have blocked them in every thread before spawning any.
    pub stop_signals: Option<libc::sigset_t>,
}

/// Counts of the driver's own I/O troubles.
#[derive(Debug, Default, Clone)]
pub struct IoCounters {
    /// Frames whose write to a TUN port failed (the frame is lost).
    pub write_errors: u64,
    /// Reads from a TUN port that failed with anything but `WouldBlock`.
    pub read_errors: u64,
    /// Frames that filled their whole buffer slot, so may have been
    /// truncated; dropped.
    pub oversize: u64,
}

/// The emulator's packet loop: owns the hub, one TUN port per hub port, the
/// timer and the optional capture; [`Driver::run`] runs it on the calling
/// thread.
pub struct Driver {
    hub: Hub,
    tuns: Vec<Tun>,
    pcap: Option<PcapWriter<BufWriter<File>>>,
    rx: mpsc::Receiver<Request>,
    wake: Arc<OwnedFd>,
    timer: OwnedFd,
    _signals: Option<OwnedFd>,
    epoll: OwnedFd,
    base_ns: u64,
    unix_base_ns: u64,
    batch_ns: u64,
    /// The driver's own I/O error counts; not part of any [`Snapshot`].
    pub io: IoCounters,
}

const READ_BATCH: usize = 64;
const TAG_TIMER: u64 = u64::MAX;
const TAG_WAKE: u64 = u64::MAX - 1;
const TAG_SIGNAL: u64 = u64::MAX - 2;

fn check(r: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if r < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(r)
    }
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Driver {
    /// A driver whose `tuns[i]` serves hub port `i` (panics unless there is
    /// one TUN per port), and a [`Handle`] to it. Creates the epoll set, the
    /// timerfd, the eventfd and (with `opts.stop_signals`) the signalfd, opens
    /// the capture, and sets the calling thread's timer slack to 1 µs. The
    /// driver's clock (ns) starts at 0 here.
    pub fn new(hub: Hub, tuns: Vec<Tun>, opts: Options) -> io::Result<(Driver, Handle)> {
        assert_eq!(hub.ports(), tuns.len(), "one TUN per hub port");
        // SAFETY: each call creates a new descriptor that we own at once.
        let own = |fd: libc::c_int| unsafe { OwnedFd::from_raw_fd(fd) };
        let epoll = own(check(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?);
        let timer = own(check(
            unsafe {
                libc::timerfd_create(
                    libc::CLOCK_MONOTONIC,
                    libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
                )
            },
            "timerfd_create",
        )?);
        let wake = Arc::new(own(check(
            unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) },
            "eventfd",
        )?));
        let signals = match &opts.stop_signals {
            Some(set) => {
                // SAFETY: signalfd with a valid set creates a new descriptor.
                let fd = unsafe { libc::signalfd(-1, set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
                Some(own(check(fd, "signalfd")?))
            }
            None => None,
        };
        // Wake on timers to the microsecond rather than the default 50 µs slack.
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };

        let add = |fd: RawFd, tag: u64| -> io::Result<()> {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: tag,
            };
            // SAFETY: ev is a valid epoll_event.
            check(
                unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) },
                "epoll_ctl",
            )
            .map(|_| ())
        };
        for (i, t) in tuns.iter().enumerate() {
            add(t.as_raw_fd(), i as u64)?;
        }
        add(timer.as_raw_fd(), TAG_TIMER)?;
        add(wake.as_raw_fd(), TAG_WAKE)?;
        if let Some(s) = &signals {
            add(s.as_raw_fd(), TAG_SIGNAL)?;
        }
        let pcap = match opts.pcap {
            Some((file, snaplen)) => Some(PcapWriter::new(
                BufWriter::with_capacity(1 << 20, file),
                snaplen,
            )?),
            None => None,
        };
        let unix_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let (tx, rx) = mpsc::channel();
        let handle = Handle {
            tx,
            wake: wake.clone(),
        };
        Ok((
            Driver {
                hub,
                tuns,
                pcap,
                rx,
                wake,
                timer,
                _signals: signals,
                epoll,
                base_ns: mono_ns(),
                unix_base_ns: unix_now,
                batch_ns: opts.batch_ns,
                io: IoCounters::default(),
            },
            handle,
        ))
    }

    fn now(&self) -> u64 {
        mono_ns() - self.base_ns
    }

    /// Runs until stopped (by a [`Handle`] or a signal); returns the final counters.
    pub fn run(mut self) -> io::Result<Snapshot> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        let mut armed: Option<u64> = None;
        let mut last_flush = 0u64;
        loop {
            let now = self.now();
            if self.hub.next_deadline().is_some_and(|d| d <= now) {
                self.flush_due();
                last_flush = now;
            }
            // Sleep until the next deadline (not sooner than batch_ns after the
            // last flush), or not at all if it has passed.
            let now = self.now();
            let timeout = match self.hub.next_deadline() {
                Some(d) => {
                    let at = d.max(last_flush + self.batch_ns);
                    if at <= now {
                        0
                    } else {
                        if armed != Some(at) {
                            self.arm(at)?;
                            armed = Some(at);
                        }
                        -1
                    }
                }
                None => -1,
            };
            // SAFETY: events has room for events.len() entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    timeout,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for ev in &events[..n as usize] {
                match ev.u64 {
                    TAG_TIMER => {
                        drain_fd(self.timer.as_raw_fd());
                        armed = None;
                    }
                    TAG_WAKE => {
                        drain_fd(self.wake.as_raw_fd());
                        if self.serve_requests() {
                            return Ok(self.finish());
                        }
                    }
                    TAG_SIGNAL => return Ok(self.finish()),
                    port => self.read_port(port as usize),
                }
            }
        }
    }

    fn finish(mut self) -> Snapshot {
        if let Some(p) = &mut self.pcap {
            let _ = p.flush();
        }
        self.snapshot_now()
    }

    /// The hub's counters and this process's CPU time.
    fn snapshot_now(&self) -> Snapshot {
        let mut s = self.hub.snapshot(self.now());
        s.cpu_s = process_cpu_s();
        s
    }

    /// Answers queued requests; true when asked to stop.
    fn serve_requests(&mut self) -> bool {
        while let Ok(req) = self.rx.try_recv() {
            match req {
                Request::Snapshot(reply) => {
                    if let Some(p) = &mut self.pcap {
                        let _ = p.flush();
                    }
                    let _ = reply.send(self.snapshot_now());
                }
                Request::Schedule(op, reply) => {
                    // Deliver what is due first, so that the clock's start
                    // does not reach back to packets already on their way.
                    self.flush_due();
                    match op {
                        ScheduleOp::Start => self.hub.start_schedule(self.now()),
                        ScheduleOp::Hold => self.hub.hold_schedule(),
                    }
                    let _ = reply.send(self.snapshot_now());
                }
                Request::Stop => return true,
            }
        }
        false
    }

    fn arm(&self, deadline: u64) -> io::Result<()> {
        let at = self.base_ns + deadline;
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at / 1_000_000_000) as libc::time_t,
                tv_nsec: (at % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: spec is a valid itimerspec.
        check(
            unsafe {
                libc::timerfd_settime(
                    self.timer.as_raw_fd(),
                    libc::TFD_TIMER_ABSTIME,
                    &spec,
                    std::ptr::null_mut(),
                )
            },
            "timerfd_settime",
        )
        .map(|_| ())
    }

    /// Writes every packet that is due.
    fn flush_due(&mut self) {
        let mut now = self.now();
        let mut n = 0u32;
        while let Some(e) = self.hub.poll_egress(now) {
            let frame = self.hub.egress_frame(&e);
            if self.tuns[e.port].send(frame).is_err() {
                self.io.write_errors += 1;
            }
            self.hub.release(e.buf);
            n += 1;
            if n.is_multiple_of(8) {
                now = self.now();
            }
        }
    }

    /// Reads up to a batch of packets from one port.
    fn read_port(&mut self, port: usize) {
        for _ in 0..READ_BATCH {
            let Some(id) = self.hub.alloc() else {
                // Pool at its cap: read and discard, so the port does not stall.
                let mut scratch = [0u8; 1];
                match self.tuns[port].recv(&mut scratch) {
                    Ok(_) => {
                        self.hub.count_pool_exhausted();
                        continue;
                    }
                    Err(_) => return,
                }
            };
            let buf = self.hub.buf_mut(id);
            let slot = buf.len();
            match self.tuns[port].recv(buf) {
                Ok(len) if len < slot => {
                    let now = self.now();
                    if let Some(p) = &mut self.pcap {
                        let ip = &self.hub.buf(id)[self.hub.vnet_len().min(len)..len];
                        let _ = p.record(self.unix_base_ns + now, ip);
                    }
                    self.hub.ingress(now, port, id, len);
                }
                Ok(_) => {
                    self.io.oversize += 1;
                    self.hub.release(id);
                }
                Err(e) => {
                    self.hub.release(id);
                    if e.kind() != io::ErrorKind::WouldBlock {
                        self.io.read_errors += 1;
                    }
                    return;
                }
            }
        }
    }
}

fn drain_fd(fd: RawFd) {
    let mut b = [0u8; 128];
    // SAFETY: reading into a local buffer; non-blocking descriptors.
    unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
}

/// User + system CPU seconds of this process, all its threads.
fn process_cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}
