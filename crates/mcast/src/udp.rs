//! The thin UDP driver: sockets, the clock, and the cores' outputs put on the wire.
//!
//! One thread per side. The sender sends what its core says is due, then waits on
//! its socket until the core's next deadline; the receiver waits on its socket and
//! hands every datagram and deadline to its core. Multicast when the group address
//! is multicast; otherwise unicast fan-out: each group datagram goes to every
//! address given.

use crate::receiver::{Receiver, ReceiverEvent, Store};
use crate::sender::{Dest, Sender, SenderEvent, Source};
use crate::wire::MAX_DATAGRAM;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Socket buffers asked for (forced as root): rides out a receiver's pauses while
/// it decodes or verifies.
const SOCKET_BUFFER: usize = 32 << 20;

/// Where the sender's group datagrams go.
#[derive(Debug, Clone)]
pub enum Targets {
    Multicast(SocketAddrV4),
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

fn recv(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddr)>> {
    match sock.recv_from(buf) {
        Ok(x) => Ok(Some(x)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Ok(None)
        }
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        // An ICMP port unreachable from a receiver that went away.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(None),
        Err(e) => Err(e),
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
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
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
                    let _ = flush(sock, targets, core, src, &mut out);
                    return Err(e);
                }
            };
            send(sock, targets, dest, &out)?;
        }
        while let Some(e) = core.poll_event() {
            on_event(core, e);
        }
        if core.is_done() {
            return Ok(());
        }
        wait(sock, core.poll_timeout(), Duration::from_millis(100))?;
        while let Some((n, from)) = recv(sock, &mut buf)? {
            core.handle(Instant::now(), from, &mut buf[..n]);
        }
    }
}

/// After an abort: get the END datagrams out.
fn flush(
    sock: &UdpSocket,
    targets: &Targets,
    core: &mut Sender,
    src: &mut dyn Source,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let now = Instant::now();
    while let Ok(Some(d)) = core.poll_transmit(now, src, out) {
        send(sock, targets, d, out)?;
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

fn send(sock: &UdpSocket, targets: &Targets, dest: Dest, bytes: &[u8]) -> io::Result<()> {
    let one = |to: SocketAddr| loop {
        match sock.send_to(bytes, to) {
            Ok(_) => return Ok(()),
            // The socket buffer is full: wait until it drains (nonblocking socket).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writable(sock)?,
            // A receiver that went away (ICMP unreachable on a fan-out target).
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("send to {to}: {e}"))),
        }
    };
    match (dest, targets) {
        (Dest::To(a), _) => one(a),
        (Dest::Group, Targets::Multicast(g)) => one(SocketAddr::V4(*g)),
        (Dest::Group, Targets::Fanout(list)) => list.iter().try_for_each(|&a| one(a)),
    }
}

/// Run a receiver until `stop` is set, or (with `once`) until its first session
/// ends. Events go to `on_event`.
pub fn run_receiver(
    sock: &UdpSocket,
    core: &mut Receiver,
    store: &mut dyn Store,
    stop: &AtomicBool,
    once: bool,
    on_event: &mut dyn FnMut(&Receiver, ReceiverEvent),
) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    loop {
        if stop.load(Ordering::Relaxed) {
            store.abort();
            return Ok(());
        }
        wait(sock, core.poll_timeout(), Duration::from_millis(200))?;
        // Up to a batch of datagrams, then deadlines and answers.
        for _ in 0..64 {
            match recv(sock, &mut buf)? {
                Some((n, from)) => core.handle(Instant::now(), from, &mut buf[..n], store),
                None => break,
            }
        }
        let now = Instant::now();
        if core.poll_timeout().is_some_and(|t| t <= now) {
            core.handle_timeout(now, store);
        }
        while let Some((to, b)) = core.poll_transmit() {
            match sock.send_to(&b, to) {
                Ok(_) => {}
                // Feedback is best effort: a full buffer or a vanished sender.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::WouldBlock
                    ) => {}
                Err(e) => return Err(io::Error::new(e.kind(), format!("send to {to}: {e}"))),
            }
        }
        let mut ended = false;
        while let Some(e) = core.poll_event() {
            ended |= matches!(e, ReceiverEvent::Ended(_));
            on_event(core, e);
        }
        if once && ended {
            return Ok(());
        }
    }
}
