//! TUN ports created inside other network namespaces. The emulator process
//! stays in its own namespace; a short-lived thread enters the host's namespace
//! just long enough to create the device, whose file descriptor keeps working
//! from anywhere. The device is not persistent: it disappears, with its
//! addresses and routes, when the descriptor closes (also on a crash).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_USO4: libc::c_uint = 0x20;
const TUN_F_USO6: libc::c_uint = 0x40;

/// What a port hands over and takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// Plain IP packets of at most the MTU.
    None,
    /// A `virtio_net_hdr` before every packet; the host's kernel leaves TCP
    /// and UDP checksums partial and hands over TCP (TSO) and, where the
    /// kernel can (6.2 and later), UDP (USO) aggregates of up to 64 KB, and
    /// takes them the same way.
    Segmentation,
}

/// A TUN device (IP packets, no packet-info header), non-blocking.
pub struct Tun {
    fd: OwnedFd,
    name: String,
    offload: Offload,
    uso: bool,
}

impl Tun {
    /// Creates TUN device `name` in the network namespace bound at `netns`
    /// (e.g. `/run/netns/lh-lab-srv`).
    pub fn create_in(netns: &Path, name: &str, offload: Offload) -> io::Result<Tun> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name '{name}' must be 1 to 15 bytes"),
            ));
        }
        let ns = File::open(netns)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", netns.display())))?;
        let name = name.to_string();
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on this thread only; the thread ends right after.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    let e = io::Error::last_os_error();
                    return Err(io::Error::new(
                        e.kind(),
                        format!("entering {}: {e}", netns.display()),
                    ));
                }
                Self::create_here(&name, offload)
            })
            .join()
            .map_err(|_| io::Error::other("TUN creation thread panicked"))?
        })
    }

    fn create_here(name: &str, offload: Offload) -> io::Result<Tun> {
        // SAFETY: plain open(2) of a constant path.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("/dev/net/tun: {e}")));
        }
        // SAFETY: fd was just opened and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // struct ifreq: 16-byte name, then the flags (short) in the union.
        let mut ifr = [0u8; 40];
        ifr[..name.len()].copy_from_slice(name.as_bytes());
        let mut flags = IFF_TUN | IFF_NO_PI;
        if offload == Offload::Segmentation {
            flags |= IFF_VNET_HDR;
        }
        ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
        // SAFETY: TUNSETIFF reads and writes a struct ifreq, which `ifr` is large enough for.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, ifr.as_mut_ptr()) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("TUNSETIFF {name}: {e}")));
        }
        let mut uso = false;
        if offload == Offload::Segmentation {
            let set = |f: libc::c_uint| {
                // SAFETY: TUNSETOFFLOAD takes its flags by value.
                unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD, f as libc::c_ulong) == 0 }
            };
            // USO needs both families (kernel ≥ 6.2); TSO and checksums are older.
            uso = set(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_USO4 | TUN_F_USO6);
            if !uso && !set(TUN_F_CSUM | TUN_F_TSO4) {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(
                    e.kind(),
                    format!("TUNSETOFFLOAD {name}: {e}"),
                ));
            }
        }
        Ok(Tun {
            fd,
            name: name.to_string(),
            offload,
            uso,
        })
    }

    /// What the port hands over: plain packets or aggregates.
    pub fn offload(&self) -> Offload {
        self.offload
    }

    /// True when UDP aggregates (USO) pass too, not only TCP ones.
    pub fn udp_segmentation(&self) -> bool {
        self.uso
    }

    /// The interface name it was created with (inside the host's namespace).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads one packet; `WouldBlock` when none is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for buf.len() bytes.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Writes one packet into the host's stack.
    pub fn send(&self, pkt: &[u8]) -> io::Result<usize> {
        // SAFETY: pkt is valid for pkt.len() bytes.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), pkt.as_ptr().cast(), pkt.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
