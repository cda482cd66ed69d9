//! Packet I/O backends: how RoCEv2 packets (UDP payloads) leave and enter
//! a context.

pub(crate) mod sim;
pub(crate) mod udp;

use std::io;
use std::net::SocketAddr;

/// The backend of one context.
#[derive(Debug)]
pub(crate) enum Backend {
    /// Kernel UDP socket.
    Udp(udp::UdpBackend),
    /// In-process simulated network.
    Sim(sim::SimPort),
}

impl Backend {
    pub(crate) fn local(&self) -> SocketAddr {
        match self {
            Self::Udp(b) => b.local(),
            Self::Sim(b) => b.local(),
        }
    }

    /// Whether runs of packets may leave as one GSO send.
    pub(crate) fn gso(&self) -> bool {
        match self {
            Self::Udp(b) => b.gso(),
            Self::Sim(_) => false,
        }
    }

    /// Sends from local address `src` (a GID of the device).
    pub(crate) fn send(
        &mut self,
        src: std::net::IpAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
    ) -> io::Result<()> {
        match self {
            Self::Udp(b) => b.send(src, dst, data, seg),
            Self::Sim(b) => {
                for p in data.chunks(seg.max(1)) {
                    b.send(dst, p);
                }
                Ok(())
            }
        }
    }

    /// A datagram (or GRO run): `(bytes, segment size, sender, the local
    /// address it came to)`.
    pub(crate) fn recv(
        &mut self,
        buf: &mut [u8],
    ) -> io::Result<Option<(usize, usize, SocketAddr, std::net::IpAddr)>> {
        match self {
            Self::Udp(b) => b.recv(buf),
            Self::Sim(b) => {
                let to = b.local().ip();
                Ok(b.recv(buf).map(|(n, from)| (n, n, from, to)))
            }
        }
    }

    /// Starts receiving on (and sending from) another local address.
    pub(crate) fn bind_local(&mut self, ip: std::net::IpAddr) -> io::Result<()> {
        match self {
            Self::Udp(b) => b.bind_local(ip),
            Self::Sim(b) if b.local().ip() == ip => Ok(()),
            Self::Sim(_) => Err(io::Error::from(io::ErrorKind::AddrNotAvailable)),
        }
    }

    /// Stops using a local address that went away.
    pub(crate) fn unbind_local(&mut self, ip: std::net::IpAddr) {
        if let Self::Udp(b) = self {
            b.unbind_local(ip);
        }
    }

    /// Descriptors to sleep on (none for the simulated network).
    pub(crate) fn raw_fds(&self) -> Vec<i32> {
        match self {
            Self::Udp(b) => b.raw_fds(),
            Self::Sim(_) => Vec::new(),
        }
    }

    /// Joins a multicast group.
    pub(crate) fn join(&mut self, group: std::net::IpAddr) -> io::Result<()> {
        match self {
            Self::Udp(b) => b.join(group),
            Self::Sim(_) => Err(io::Error::from(io::ErrorKind::Unsupported)),
        }
    }

    /// Leaves a multicast group.
    pub(crate) fn leave(&mut self, group: std::net::IpAddr) {
        if let Self::Udp(b) = self {
            b.leave(group);
        }
    }

    /// A datagram received on a joined group: `(bytes, sender, group)`.
    pub(crate) fn recv_group(
        &mut self,
        buf: &mut [u8],
    ) -> Option<(usize, SocketAddr, std::net::IpAddr)> {
        match self {
            Self::Udp(b) => b.recv_group(buf),
            Self::Sim(_) => None,
        }
    }
}
