//! The default backend: a kernel UDP socket on the device's address and
//! port. No root, no setup.
//!
//! UNSAFE ISLAND (small): `setsockopt` and `poll` through libc, each call
//! with its `// SAFETY:` note. Everything else is std's `UdpSocket`.
//!
//! Wire facts this relies on (measured on this machine kind): an
//! unconnected socket with `IP_PMTUDISC_DO` makes Linux send IPv4 with DF
//! and identification 0, so the ICRC of our packets is computable here; the
//! UDP checksum is left to the kernel (the ICRC masks it).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// A bound, non-blocking UDP socket.
#[derive(Debug)]
pub(crate) struct UdpBackend {
    sock: UdpSocket,
    local: SocketAddr,
}

fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` lives across the call and its size is passed exactly;
    // `fd` is a socket owned by the caller.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast::<libc::c_void>(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

impl UdpBackend {
    /// Binds to `addr`.
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<Self> {
        let sock = UdpSocket::bind(addr)?;
        sock.set_nonblocking(true)?;
        let fd = sock.as_raw_fd();
        if addr.is_ipv4() {
            setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
        } else {
            setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
        }
        // Deep buffers: a burst of a window's packets must not be dropped by
        // the socket (the kernel caps these at net.core.*mem_max).
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20);
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 8 << 20);
        let local = sock.local_addr()?;
        Ok(Self { sock, local })
    }

    /// The bound address.
    pub(crate) fn local(&self) -> SocketAddr {
        self.local
    }

    /// Sends one RoCE packet. `WouldBlock` means the socket buffer is full:
    /// the caller counts the packet as lost (the transport retransmits).
    pub(crate) fn send(&self, dst: SocketAddr, payload: &[u8]) -> io::Result<()> {
        self.sock.send_to(payload, dst).map(|_| ())
    }

    /// Receives one datagram, or `None` when none is waiting.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddr)>> {
        match self.sock.recv_from(buf) {
            Ok((n, from)) => Ok(Some((n, from))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The socket's descriptor number, for [`wait_readable`].
    pub(crate) fn raw_fd(&self) -> i32 {
        self.sock.as_raw_fd()
    }
}

/// Blocks until descriptor `fd` is readable or `timeout` passes. Takes a
/// bare number so that a sleeping progress thread keeps no reference to the
/// socket: if the context is closed meanwhile, the poll returns at once
/// (POLLNVAL) or at the timeout, and never touches memory.
pub(crate) fn wait_readable(fd: i32, timeout: Option<Duration>) {
    {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
        });
        let tp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: one valid pollfd, count 1; `tp` is null or points to a
        // timespec alive across the call; no signal mask is passed.
        unsafe { libc::ppoll(&raw mut pfd, 1, tp, std::ptr::null()) };
    }
}
