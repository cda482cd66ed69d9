//! Packet I/O backends: how RoCEv2 packets (UDP payloads) leave and enter
//! a context. The driver (`crate::driver`) sees only the [`Backend`]
//! trait; what a backend is made of stays in its module.

pub(crate) mod share;
mod shm;
// Ethernet framing for the backends that own their frames (AF_XDP, DPDK).
mod frame;
pub(crate) mod packet;

pub(crate) use share::has_connection_lists;

/// Bits of QPN each context owns on a shared address
/// ([`Backend::qpn_range`]).
pub(crate) const QPN_RANGE_BITS: u32 = share::QPN_SHIFT;
#[cfg(feature = "dpdk")]
pub(crate) mod dpdk;
#[cfg(feature = "sim")]
pub(crate) mod sim;
pub(crate) mod udp;
pub(crate) mod xdp;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use uroce_transport::Instant;
use uroce_transport::cm::Leftover;

/// The destination QPN of a packet (BTH bytes 5..8; 0 if it has no BTH).
pub(crate) fn dest_qpn(pkt: &[u8]) -> u32 {
    pkt.get(4..8).map_or(0, |b| u32::from_be_bytes([0, b[1], b[2], b[3]]))
}

/// How many packets, and bytes, one batched send may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendBatch {
    /// Segments per send (1: no batching).
    pub(crate) segments: usize,
    /// Bytes per send.
    pub(crate) bytes: usize,
}

/// A datagram received into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Received {
    /// Bytes; with receive offload a run of `seg`-byte packets (the last
    /// possibly shorter).
    pub(crate) len: usize,
    /// Segment size.
    pub(crate) seg: usize,
    /// The sender.
    pub(crate) from: SocketAddr,
    /// The local address it came to.
    pub(crate) to: IpAddr,
    /// Its IPv4 identification, when the backend sees the IP header (the
    /// ICRC covers it; a UDP socket must recover it, see the driver).
    pub(crate) ip_id: Option<u16>,
    /// It came through memory, not a network (the `udp` backend's local
    /// path): it has no ICRC to check.
    pub(crate) local: bool,
}

/// One context's packet I/O.
pub(crate) trait Backend: Send + std::fmt::Debug {
    /// The device's address and port.
    fn local(&self) -> SocketAddr;

    /// This context's QPN range: its first QPN and where in it to start
    /// counting. Contexts sharing one address own disjoint ranges
    /// (`share::QPN_SHIFT` bits each).
    fn qpn_range(&self) -> (u32, u32) {
        (0, 0)
    }

    /// Housekeeping that needs the clock (sharing the address with other
    /// contexts); called every progress pass, so cheap when nothing is due.
    fn tick(&mut self, _now_ns: u64) {}

    /// The prefix (value, bits) of the CM's communication IDs, when the
    /// address is shared: peers' answers carry our ID and are steered by it.
    fn cm_id_prefix(&self) -> Option<(u32, u32)> {
        None
    }

    /// The ports (low 16 bits of the service IDs) this context's CM
    /// listens on, so that requests for them are steered here. `false`
    /// (and nothing changed) when another context sharing the address
    /// listens on one of them.
    fn set_listening(&mut self, _ports: &[u16]) -> bool {
        true
    }

    /// Lists this context's CM connections where a context that takes
    /// back its place after it died finds them (a shared address); whether
    /// the list was written (or nothing is published here).
    fn publish_connections(&mut self, _conns: &[Leftover]) -> bool {
        true
    }

    /// The connections of dead contexts this one took back the places
    /// of since the last call, for the driver to end with DREQs.
    fn take_leftovers(&mut self) -> Vec<Leftover> {
        Vec::new()
    }

    /// The ports the CMs of other contexts sharing this address listen
    /// on (read from the group's table: for a request about to be
    /// refused, not per packet).
    fn listened_elsewhere(&mut self) -> Vec<u16> {
        Vec::new()
    }

    /// Whether packets to QPN `qpn` at `dst` go through memory rather
    /// than a network: then the driver computes no ICRC for them.
    fn is_local(&mut self, _dst: SocketAddr, _qpn: u32) -> bool {
        false
    }

    /// How runs of equal-sized packets to one destination may leave
    /// together (what the driver gathers before [`Backend::send`]).
    fn batch(&self) -> SendBatch;

    /// The UDP source port a packet to `dst` leaves from when its QP asks
    /// for `wanted` (rxe's: `0xC000` and a hash of the QPs, spreading a
    /// host's flows over a fabric's equal-cost paths): a backend that
    /// builds its frames takes it; a kernel socket sends from its own
    /// port (the default). The driver computes the ICRC, which covers the
    /// port, over what this returns.
    fn source_port(&mut self, _dst: SocketAddr, _wanted: u16) -> u16 {
        self.local().port()
    }

    /// Sends from `src` (a local address, and the port
    /// [`Backend::source_port`] gave): one packet, or (with `seg` <
    /// `data.len()`) a run of `seg`-byte packets as one send; `tos`: the IP
    /// header's TOS (IPv4) or traffic class (IPv6).
    fn send(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
        tos: u8,
    ) -> io::Result<()>;

    /// Hands what [`Backend::send`] queued to the network, for a backend
    /// that batches its own way (the driver calls it after each transmit
    /// pass).
    fn flush(&mut self) {}

    /// The next datagram (or run), if one waits.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<Received>>;

    /// Descriptors to sleep on while idle (none: the progress thread naps).
    fn raw_fds(&self) -> Vec<i32>;

    /// The CPU that the sender of the last doorbell read ran on (the
    /// local path's senders wake a sleeping receiver with one), once.
    fn take_waker_cpu(&mut self) -> Option<u64> {
        None
    }

    /// The progress thread is about to sleep on [`Backend::raw_fds`]: a
    /// backend whose packets can arrive without making them readable (the
    /// local path's shared memory) asks its senders to wake it; false if
    /// a packet came meanwhile and the thread must not sleep.
    fn prepare_sleep(&mut self) -> bool {
        true
    }

    /// The process exits with the context open (nothing drops it): removes
    /// what would outlive the process in the file system — the local
    /// path's inbox, this member's slot in a shared address's table, or
    /// the whole table if it is the last — and keeps the sockets, which
    /// the progress thread may still use until the process ends.
    fn at_exit(&mut self) {}

    /// Adds the backend's own counters to the device's.
    fn add_counters(&self, _stats: &mut uroce_transport::Stats) {}

    /// The backend's own clock, if it has one (a simulated network's).
    fn clock(&self) -> Option<Instant> {
        None
    }

    /// The secret the relay datagrams between the processes sharing this
    /// device end with (0: none shares it).
    fn relay_secret(&self) -> u64 {
        0
    }

    /// Whether the host's interfaces describe this device: its GID table
    /// and its port's state (not for a simulated network).
    fn on_host(&self) -> bool {
        true
    }

    /// Starts receiving on (and sending from) another local address.
    fn bind_local(&mut self, ip: IpAddr) -> io::Result<()>;

    /// Stops using a local address that went away.
    fn unbind_local(&mut self, ip: IpAddr);

    /// Joins a multicast group.
    fn join(&mut self, group: IpAddr) -> io::Result<()>;

    /// Leaves a multicast group.
    fn leave(&mut self, group: IpAddr);

    /// A datagram received on a joined group: `(bytes, sender, group)`.
    fn recv_group(&mut self, buf: &mut [u8]) -> Option<(usize, SocketAddr, IpAddr)>;

    /// Appends the destinations the network said nothing listens on
    /// (ICMP port unreachable) since the last call.
    fn unreachable(&mut self, _out: &mut Vec<SocketAddr>) {}
}

/// A network other than the host's that devices can be put on (the
/// simulated one), so that `Device` need not know what it is made of.
pub(crate) trait Network: Send + Sync + std::fmt::Debug {
    /// A backend for the device at `local`.
    fn attach(&self, local: SocketAddr) -> Box<dyn Backend>;

    /// The seed, when the network runs on a virtual clock (contexts on it
    /// then derive their keys and PSNs from it, for reproducible runs).
    fn virtual_seed(&self) -> Option<u64>;
}

/// Blocks until one of `fds` is readable or `timeout` passes. Takes bare
/// numbers so that a sleeping progress thread keeps no reference to the
/// backend: if the context is closed meanwhile, the poll returns at once
/// (POLLNVAL) or at the timeout, and never touches memory. False when the
/// timeout ended it.
pub(crate) fn wait_readable(fds: &[i32], timeout: Option<Duration>) -> bool {
    udp::wait_readable(fds, timeout)
}
