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

    pub(crate) fn send(&mut self, dst: SocketAddr, data: &[u8], seg: usize) -> io::Result<()> {
        match self {
            Self::Udp(b) => b.send(dst, data, seg),
            Self::Sim(b) => {
                for p in data.chunks(seg.max(1)) {
                    b.send(dst, p);
                }
                Ok(())
            }
        }
    }

    pub(crate) fn recv(
        &mut self,
        buf: &mut [u8],
    ) -> io::Result<Option<(usize, usize, SocketAddr)>> {
        match self {
            Self::Udp(b) => b.recv(buf),
            Self::Sim(b) => Ok(b.recv(buf).map(|(n, from)| (n, n, from))),
        }
    }

    /// A descriptor to sleep on, if the backend has one.
    pub(crate) fn raw_fd(&self) -> Option<i32> {
        match self {
            Self::Udp(b) => Some(b.raw_fd()),
            Self::Sim(_) => None,
        }
    }
}
