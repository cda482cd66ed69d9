//! UNSAFE ISLAND: an `AF_PACKET` socket on one interface, what a raw
//! packet QP sends its frames through and receives them from. Needs
//! `CAP_NET_RAW`, as the kernel asks of a raw packet QP's creator.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `ETH_P_ALL` in network order: every protocol.
const ETH_P_ALL_BE: u16 = (libc::ETH_P_ALL as u16).to_be();

/// A packet socket bound to one interface, non-blocking.
#[derive(Debug)]
pub(crate) struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    /// A socket that sends on and receives every frame of interface
    /// `ifindex`.
    pub(crate) fn open(ifindex: u32) -> io::Result<Self> {
        // SAFETY: plain socket call; checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(ETH_P_ALL_BE),
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = ETH_P_ALL_BE;
        sa.sll_ifindex = ifindex as i32;
        // SAFETY: a live sockaddr_ll of the size passed.
        let r = unsafe {
            libc::bind(
                raw,
                (&raw const sa).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// Sends one whole frame (Ethernet header included).
    pub(crate) fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is live for the call.
        let n = unsafe {
            libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT)
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next frame the interface received (not one it sent), into
    /// `buf`: its length (cut to `buf`'s) and its whole length; `None`
    /// when none waits.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> Option<(usize, usize)> {
        loop {
            // SAFETY: all-zero is a valid sockaddr_ll.
            let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: `buf` and `sa` are live buffers of the sizes passed;
            // MSG_TRUNC makes the result the frame's whole length.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    (&raw mut sa).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                return None;
            }
            // The interface's own transmissions come back as outgoing.
            if sa.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            let whole = n as usize;
            return Some((whole.min(buf.len()), whole));
        }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
