//! The thin UDP driver: sockets, the clock, and the cores' outputs put on the wire.
//!
//! One thread per side. The sender sends what its core says is due, then waits on
//! its socket until the core's next deadline; the receiver waits on its socket and
//! hands every datagram and deadline to its core. Multicast when the group address
//! is multicast; otherwise unicast fan-out: each group datagram goes to every
//! address given.
//!
//! Datagrams move in batches where the kernel allows (quinn-udp): the sender wakes
//! about once a millisecond and hands the kernel that millisecond's datagrams as
//! one UDP GSO send; receivers take GRO aggregates. Per-packet costs (system calls,
//! and in the lab the emulator's reads) drop by the batch size; pacing stays the
//! core's, at millisecond grain.

use crate::channel::{ChannelReceiver, ChannelRxEvent, ChannelSender, ObjectSource, ObjectStore};
use crate::receiver::{Receiver, ReceiverEvent, Store};
use crate::sender::{SendTo, Sender, SenderEvent, Source};
use crate::wire::MAX_DATAGRAM;
use quinn_udp::{RecvMeta, Transmit, UdpSocketState};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{self, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Socket buffers asked for (forced as root): rides out a receiver's pauses while
/// it decodes or verifies.
const SOCKET_BUFFER: usize = 32 << 20;

/// The sender sleeps at least this long between bursts: the datagrams due in it go
/// out as one GSO batch (the core banks at most 2 ms, so this stays below that).
const BURST: Duration = Duration::from_millis(1);
/// A GSO batch: at most this many datagrams, and this many bytes (UDP's limit).
const GSO_SEGMENTS: usize = 64;
const GSO_BYTES: usize = 65_000;
/// Receive buffers per system call, each big enough for a GRO aggregate.
const RECV_BUFS: usize = 8;
const RECV_BUF: usize = 65_536;

/// Where the sender's group datagrams go.
#[derive(Debug, Clone)]
pub enum Targets {
    /// One datagram to this IPv4 multicast group and port.
    Multicast(SocketAddrV4),
    /// Each group datagram to every one of these (unicast) addresses in turn.
    Fanout(Vec<SocketAddr>),
}

fn buffers(s: &Socket) {
    use std::os::fd::AsRawFd;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
        let v = SOCKET_BUFFER as libc::c_int;
        // SAFETY: setsockopt with a c_int value on our own socket.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            // Not root: the plain option, capped by net.core.[rw]mem_max.
            let _ = if opt == libc::SO_RCVBUFFORCE {
                s.set_recv_buffer_size(SOCKET_BUFFER)
            } else {
                s.set_send_buffer_size(SOCKET_BUFFER)
            };
        }
    }
}

/// The sender's socket: an ephemeral port; multicast TTL and interface set.
pub fn sender_socket(
    targets: &Targets,
    interface: Option<Ipv4Addr>,
    ttl: u32,
) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    buffers(&s);
    let bind = SocketAddrV4::new(interface.unwrap_or(Ipv4Addr::UNSPECIFIED), 0);
    s.bind(&SockAddr::from(bind))?;
    if let Targets::Multicast(_) = targets {
        s.set_multicast_ttl_v4(ttl)?;
        s.set_multicast_loop_v4(true)?;
        if let Some(i) = interface {
            s.set_multicast_if_v4(&i)?;
        }
    }
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// The receiver's socket: bound to the group's port (joined on `interface`, or the
/// default), or to a unicast address.
pub fn receiver_socket(addr: SocketAddrV4, interface: Option<Ipv4Addr>) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    buffers(&s);
    s.set_reuse_address(true)?;
    if addr.ip().is_multicast() {
        s.bind(&SockAddr::from(SocketAddrV4::new(
            Ipv4Addr::UNSPECIFIED,
            addr.port(),
        )))?;
        s.join_multicast_v4(addr.ip(), &interface.unwrap_or(Ipv4Addr::UNSPECIFIED))
            .map_err(|e| io::Error::new(e.kind(), format!("joining {}: {e}", addr.ip())))?;
    } else {
        s.bind(&SockAddr::from(addr))?;
    }
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Wait until the socket is readable or `until` (at most `cap`). ppoll, not a
/// socket timeout: SO_RCVTIMEO counts in jiffies (up to 4 ms), far too coarse for
/// pacing datagrams microseconds apart.
fn wait(sock: &UdpSocket, until: Option<Instant>, cap: Duration) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let now = Instant::now();
    let d = until.map_or(cap, |t| t.saturating_duration_since(now).min(cap));
    let ts = libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask change.
    let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Datagrams in, several per system call (GRO aggregates cut at their stride).
struct Inbox {
    bufs: [Vec<u8>; RECV_BUFS],
    meta: [RecvMeta; RECV_BUFS],
}

impl Inbox {
    fn new() -> Inbox {
        Inbox {
            bufs: std::array::from_fn(|_| vec![0u8; RECV_BUF]),
            meta: [RecvMeta::default(); RECV_BUFS],
        }
    }

    /// One system call's worth of datagrams, each handed to `f`; false when none
    /// was waiting.
    fn recv(
        &mut self,
        state: &UdpSocketState,
        sock: &UdpSocket,
        f: &mut dyn FnMut(SocketAddr, &mut [u8]),
    ) -> io::Result<bool> {
        let n = {
            let mut slices = self.bufs.each_mut().map(|b| IoSliceMut::new(b));
            match state.recv(sock.into(), &mut slices, &mut self.meta) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                            // An ICMP port unreachable from a receiver that went away.
                            | io::ErrorKind::ConnectionRefused
                    ) =>
                {
                    return Ok(false)
                }
                Err(e) => return Err(e),
            }
        };
        for (m, b) in self.meta[..n].iter().zip(self.bufs.iter_mut()) {
            let stride = m.stride.max(1);
            for d in b[..m.len].chunks_mut(stride) {
                if d.len() <= MAX_DATAGRAM {
                    f(m.addr, d);
                }
            }
        }
        Ok(n > 0)
    }
}

/// Datagrams out: runs of equal-sized datagrams to one place go as one GSO send.
struct Outbox<'a> {
    state: &'a UdpSocketState,
    sock: &'a UdpSocket,
    targets: &'a Targets,
    batch: Vec<u8>,
    seg: usize,
    count: usize,
    dest: Option<SendTo>,
    max_segments: usize,
}

impl<'a> Outbox<'a> {
    fn new(state: &'a UdpSocketState, sock: &'a UdpSocket, targets: &'a Targets) -> Outbox<'a> {
        Outbox {
            state,
            sock,
            targets,
            batch: Vec::with_capacity(GSO_BYTES + MAX_DATAGRAM),
            seg: 0,
            count: 0,
            dest: None,
            max_segments: state.max_gso_segments().clamp(1, GSO_SEGMENTS),
        }
    }

    fn push(&mut self, dest: SendTo, d: &[u8]) -> io::Result<()> {
        // GSO: every segment the same size, except a shorter last one.
        let fits = self.dest == Some(dest)
            && d.len() <= self.seg
            && self.count < self.max_segments
            && self.batch.len() + d.len() <= GSO_BYTES;
        if !fits {
            self.flush()?;
        }
        if self.count == 0 {
            self.seg = d.len();
            self.dest = Some(dest);
        }
        self.batch.extend_from_slice(d);
        self.count += 1;
        if d.len() < self.seg {
            self.flush()?; // a short one ends its batch
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        let Some(dest) = self.dest.take() else {
            return Ok(());
        };
        let segment_size = (self.count > 1).then_some(self.seg);
        let send = |to| send(self.state, self.sock, to, &self.batch, segment_size);
        let r = match (dest, self.targets) {
            (SendTo::To(a), _) => send(a),
            (SendTo::Group, Targets::Multicast(g)) => send(SocketAddr::V4(*g)),
            (SendTo::Group, Targets::Fanout(list)) => list.iter().try_for_each(|&a| send(a)),
        };
        self.batch.clear();
        self.count = 0;
        r
    }
}

/// Run a sender to the end. `on_event` sees every event; `stop` aborts the
/// session (END goes out) when set.
pub fn run_sender(
    sock: &UdpSocket,
    targets: &Targets,
    core: &mut Sender,
    src: &mut dyn Source,
    stop: &AtomicBool,
    on_event: &mut dyn FnMut(&Sender, SenderEvent),
) -> io::Result<()> {
    let state = UdpSocketState::new(sock.into())?;
    let mut outbox = Outbox::new(&state, sock, targets);
    let mut inbox = Inbox::new();
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    let mut aborted = false;
    loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) && !aborted {
            core.abort(now);
            aborted = true;
        }
        // Send what is due (bounded, so feedback is read between bursts).
        for _ in 0..256 {
            let dest = match core.poll_transmit(now, src, &mut out) {
                Ok(Some(d)) => d,
                Ok(None) => break,
                Err(e) => {
                    core.abort(now);
                    while let Some(e) = core.poll_event() {
                        on_event(core, e);
                    }
                    // Get the END datagrams out.
                    let t = Instant::now();
                    while let Ok(Some(d)) = core.poll_transmit(t, src, &mut out) {
                        let _ = outbox.push(d, &out);
                    }
                    let _ = outbox.flush();
                    return Err(e);
                }
            };
            outbox.push(dest, &out)?;
        }
        outbox.flush()?;
        while let Some(e) = core.poll_event() {
            on_event(core, e);
        }
        if core.is_done() {
            return Ok(());
        }
        // Sleep until the core's next deadline, but at least a burst's time, so
        // that the next wake finds a batch due (feedback still wakes us at once).
        let until = core
            .poll_timeout()
            .map(|t| if t > now { t.max(now + BURST) } else { t });
        wait(sock, until, Duration::from_millis(100))?;
        while inbox.recv(&state, sock, &mut |from, d| {
            core.handle(Instant::now(), from, d)
        })? {}
    }
}

/// Run a channel's sender until `stop` is set. Between bursts `tick`
/// takes the core's events and offers the files that became ready.
pub fn run_channel_sender<S: ObjectSource>(
    sock: &UdpSocket,
    targets: &Targets,
    core: &mut ChannelSender,
    src: &mut S,
    stop: &AtomicBool,
    tick: &mut dyn FnMut(&mut ChannelSender, &mut S, Instant),
) -> io::Result<()> {
    let state = UdpSocketState::new(sock.into())?;
    let mut outbox = Outbox::new(&state, sock, targets);
    let mut inbox = Inbox::new();
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        for _ in 0..256 {
            match core.poll_transmit(now, src, &mut out)? {
                Some(d) => outbox.push(d, &out)?,
                None => break,
            }
        }
        outbox.flush()?;
        tick(core, src, now);
        let until = core
            .poll_timeout()
            .map(|t| if t > now { t.max(now + BURST) } else { t });
        wait(sock, until, Duration::from_millis(100))?;
        while inbox.recv(&state, sock, &mut |from, d| {
            core.handle(Instant::now(), from, d)
        })? {}
    }
    Ok(())
}

fn writable(sock: &UdpSocket) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut pfd, 1, 100) } < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// One send (a GSO batch when `segment_size` is set), waiting while the socket
/// buffer is full.
fn send(
    state: &UdpSocketState,
    sock: &UdpSocket,
    to: SocketAddr,
    bytes: &[u8],
    segment_size: Option<usize>,
) -> io::Result<()> {
    let t = Transmit {
        destination: to,
        ecn: None,
        contents: bytes,
        segment_size,
        src_ip: None,
    };
    loop {
        match state.try_send(sock.into(), &t) {
            Ok(()) => return Ok(()),
            // The socket buffer is full: wait until it drains (nonblocking socket).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writable(sock)?,
            // A receiver that went away (ICMP unreachable on a fan-out target).
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // No GSO here after all: quinn-udp has noted it; send them one by one.
            Err(e)
                if segment_size.is_some()
                    && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) =>
            {
                for d in bytes.chunks(segment_size.unwrap_or(bytes.len())) {
                    send(state, sock, to, d, None)?;
                }
                return Ok(());
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("send to {to}: {e}"))),
        }
    }
}

/// Run a receiver until `stop` is set, or (with `once`) until its first session
/// ends. Events go to `on_event`. The core must have
/// [`crate::ReceiverConfig::verify_apart`]: a session's files are verified
/// on a thread of their own while the sender's polls are answered.
pub fn run_receiver(
    sock: &UdpSocket,
    core: &mut Receiver,
    store: &mut (dyn Store + Send),
    stop: &AtomicBool,
    once: bool,
    on_event: &mut dyn FnMut(&Receiver, ReceiverEvent),
    mut chan: Option<ChannelPart<'_>>,
) -> io::Result<()> {
    let state = UdpSocketState::new(sock.into())?;
    let mut inbox = Inbox::new();
    loop {
        if stop.load(Ordering::Relaxed) {
            store.abort();
            return Ok(());
        }
        let ended = turn(
            sock, &state, &mut inbox, core, store, on_event, &mut chan, LOOK,
        )?;
        if core.finish_due() {
            let result = std::thread::scope(|sc| {
                let worker = sc.spawn(|| store.finish());
                // Meanwhile the core answers polls and touches no store.
                let mut away = Lent;
                while !worker.is_finished() {
                    turn(
                        sock,
                        &state,
                        &mut inbox,
                        core,
                        &mut away,
                        on_event,
                        &mut chan,
                        LOOK / 10,
                    )?;
                }
                let r = worker.join();
                Ok::<_, io::Error>(r.unwrap_or_else(|_| Err("verifying panicked".into())))
            })?;
            core.verified(Instant::now(), result, store);
        }
        if once && ended {
            return Ok(());
        }
    }
}

/// A channel receiver beside the session receiver of [`run_receiver`]:
/// BEAT, OFFER and CHUNK datagrams, and ACKs of its channel, go to it.
pub struct ChannelPart<'a> {
    /// The channel's core.
    pub core: &'a mut ChannelReceiver,
    /// Where its files go.
    pub store: &'a mut dyn ObjectStore,
    /// Its events.
    pub on_event: &'a mut dyn FnMut(&ChannelReceiver, ChannelRxEvent),
}

impl ChannelPart<'_> {
    fn takes(&self, d: &[u8]) -> bool {
        use crate::wire::Kind;
        match crate::wire::header(d) {
            Ok(h) => match h.kind {
                Kind::Beat | Kind::Offer | Kind::Chunk => true,
                Kind::Ack => self.core.channel() == Some(h.session),
                _ => false,
            },
            Err(_) => false,
        }
    }
}

/// Feedback is best effort: a full buffer or a vanished sender is no error.
fn best_effort(r: io::Result<usize>, to: SocketAddr) -> io::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionRefused | io::ErrorKind::WouldBlock
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(io::Error::new(e.kind(), format!("send to {to}: {e}"))),
    }
}

/// How often a waiting receiver looks at its stop flag.
const LOOK: Duration = Duration::from_millis(200);

/// One turn of a receiver's loop: wait for datagrams or the core's next
/// deadline, hand them in, send its answers, pass its events on. True if
/// a session ended. It waits at most `look`. A channel's datagrams go to
/// the channel's core, if there is one.
#[allow(clippy::too_many_arguments)]
fn turn(
    sock: &UdpSocket,
    state: &UdpSocketState,
    inbox: &mut Inbox,
    core: &mut Receiver,
    store: &mut dyn Store,
    on_event: &mut dyn FnMut(&Receiver, ReceiverEvent),
    chan: &mut Option<ChannelPart<'_>>,
    look: Duration,
) -> io::Result<bool> {
    let due = match (
        core.poll_timeout(),
        chan.as_ref().and_then(|c| c.core.poll_timeout()),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    wait(sock, due, look)?;
    // Up to a few system calls' worth of datagrams, then deadlines and answers.
    for _ in 0..8 {
        let got = inbox.recv(state, sock, &mut |from, d| {
            let now = Instant::now();
            match chan.as_mut().filter(|c| c.takes(d)) {
                Some(c) => c.core.handle(now, from, d, c.store),
                None => core.handle(now, from, d, store),
            }
        })?;
        if !got {
            break;
        }
    }
    let now = Instant::now();
    if core.poll_timeout().is_some_and(|t| t <= now) {
        core.handle_timeout(now, store);
    }
    if let Some(c) = chan.as_mut() {
        if c.core.poll_timeout().is_some_and(|t| t <= now) {
            c.core.handle_timeout(now, c.store);
        }
        while let Some((to, b)) = c.core.poll_transmit() {
            best_effort(sock.send_to(&b, to), to)?;
        }
        while let Some(e) = c.core.poll_event() {
            (c.on_event)(c.core, e);
        }
    }
    while let Some((to, b)) = core.poll_transmit() {
        best_effort(sock.send_to(&b, to), to)?;
    }
    let mut ended = false;
    while let Some(e) = core.poll_event() {
        ended |= matches!(e, ReceiverEvent::Ended(_));
        on_event(core, e);
    }
    Ok(ended)
}

/// The store while it is lent to the verifying thread: the core calls
/// none of it then ([`Receiver::finish_due`]); if it did, it would fail.
struct Lent;

impl Store for Lent {
    fn begin(&mut self, _: &crate::manifest::Manifest) -> Result<(), String> {
        Err("the store is verifying a session".into())
    }
    fn write(&mut self, _: u64, _: &[u8]) -> io::Result<()> {
        Err(io::Error::other("the store is verifying a session"))
    }
    fn read(&mut self, _: u64, _: &mut [u8]) -> io::Result<()> {
        Err(io::Error::other("the store is verifying a session"))
    }
    fn finish(&mut self) -> Result<(), String> {
        Err("the store is verifying a session".into())
    }
    fn abort(&mut self) {}
    fn admit(&mut self, _: u64, _: u64) -> Result<(), String> {
        Err("the store is verifying a session".into())
    }
}
