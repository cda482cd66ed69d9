//! Several processes on one DPDK device (issue 17), one context each.
//!
//! Each process opens a port of its own on the interface (an `af_packet`
//! port sees every frame the interface receives), so every member sees
//! every frame, and keeps its own: a context takes a slot in the
//! address's table (`share::Registry`, as the `udp` backend's contexts
//! do), and slot `s` owns the QPNs `s << QPN_SHIFT ..`. The CM's MADs
//! (QPN 1) go where the `udp` backend's steering program sends them (a
//! REQ to whoever listens on its port, any other MAD to the slot in the
//! communication ID, the rest to the lowest slot), the same program run
//! here per MAD (`share::run`) with slots for indices. ARP, neighbour
//! discovery, ping and port unreachable errors are answered by the lowest
//! live slot only, so a peer gets one answer, not one per member.
//!
//! What a member sends to the device's own address cannot leave the port
//! and come back (a NIC does not loop it, nor does an `af_packet` socket
//! that bypasses the qdisc): it goes through shared memory instead, into
//! the inbox of the member that owns it (`shm::LocalPath`, of the DPDK
//! kind: only the device's own members find it).

use std::io;
use std::net::SocketAddr;

use super::super::share::{self, Insn};

/// How often the live members are looked at again (a dead member's slot
/// taken back, the lowest slot and the CM's steering brought up to date).
const CHECK_NS: u64 = 100_000_000;

/// This context's part in sharing its DPDK device.
#[derive(Debug)]
pub(super) struct Members {
    registry: share::Registry,
    /// The live members' slots at the last check, lowest first (this
    /// one's always among them).
    live: Vec<usize>,
    /// The CM's steering for `live` (slots as indices).
    cm: Vec<Insn>,
    next_check_ns: u64,
}

impl Members {
    /// Takes a slot of the device at `local`, for a context whose port's
    /// driver is `driver`. `None` when no table can be kept (no usable run
    /// directory): the device is then this context's alone. Refused
    /// (`AddrInUse`, with why) when every slot is taken, or another member
    /// lives and this context cannot share with it: it asked for the
    /// device alone (`UROCE_EXCLUSIVE`), its port is not an af_packet one
    /// (a NIC's queue, a tap, memif or AF_XDP gives each opener part of the
    /// frames, or none), or the member's process ID and ours agree modulo
    /// 65536 (one process, or two PID namespaces): DPDK 22.11 puts an
    /// af_packet port's socket in the fanout group `pid ^ ifindex`, and the
    /// kernel would split the frames between the two.
    pub(super) fn join(local: SocketAddr, driver: &str) -> io::Result<Option<Self>> {
        let registry = match share::Registry::join(local, || Ok(()), |(), _| {}) {
            Ok(joined) => joined?.0,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => return Err(e),
            Err(_) => return Ok(None),
        };
        let why = if !registry.others_alive() {
            None
        } else if std::env::var_os("UROCE_EXCLUSIVE").is_some() {
            Some("UROCE_EXCLUSIVE is set".to_string())
        } else if driver != "net_af_packet" {
            Some(format!(
                "a {driver} port cannot be shared (only net_af_packet ports are: each sees \
                 every frame)"
            ))
        } else if registry.other_pids().iter().any(|p| p & 0xffff == std::process::id() & 0xffff) {
            Some(
                "a process has one context per DPDK device (DPDK's af_packet ports of one \
                 process, or of processes whose IDs agree modulo 65536 in other PID \
                 namespaces, share a fanout group and would split the frames)"
                    .to_string(),
            )
        } else {
            None
        };
        if let Some(why) = why {
            // Dropping the registry gives the slot back.
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{local} is in use by another context, and {why}"),
            ));
        }
        let mut m = Self { registry, live: Vec::new(), cm: Vec::new(), next_check_ns: 0 };
        m.refresh();
        Ok(Some(m))
    }

    /// Reads the live members and the ports they listen on again.
    fn refresh(&mut self) {
        self.live = self.registry.live_slots();
        self.cm = self.registry.program_by_slot(&self.live);
    }

    pub(super) fn slot(&self) -> usize {
        self.registry.slot()
    }

    pub(super) fn registry(&self) -> &share::Registry {
        &self.registry
    }

    pub(super) fn registry_mut(&mut self) -> &mut share::Registry {
        &mut self.registry
    }

    /// The live members' slots (as of the last check), this one's among
    /// them.
    pub(super) fn live(&self) -> &[usize] {
        &self.live
    }

    /// The lowest live slot: the member that answers for the device.
    fn first(&self) -> usize {
        self.live.first().copied().unwrap_or_else(|| self.slot())
    }

    /// Whether this member answers ARP, neighbour solicitations, ping and
    /// datagrams to closed ports for the device.
    pub(super) fn answers(&self) -> bool {
        self.first() == self.slot()
    }

    /// Looks at the members again when due (cheap otherwise).
    pub(super) fn tick(&mut self, now_ns: u64) {
        if now_ns >= self.next_check_ns {
            self.next_check_ns = now_ns + CHECK_NS;
            self.refresh();
        }
    }

    /// The ports this context's CM listens on: published, and steered
    /// here; `false` if another live member listens on one of them.
    pub(super) fn set_listening(&mut self, ports: &[u16]) -> bool {
        let ok = self.registry.set_listening(ports, |_| {});
        self.refresh();
        ok
    }

    /// The slot that owns `packet` (a RoCE datagram to the device, BTH
    /// first): the one its QPN names, or for a CM MAD the one the steering
    /// picks. A MAD left to the lowest slot may be a member's that joined
    /// or began to listen since the last check: the table is read again
    /// then (MADs are few).
    pub(super) fn owner(&mut self, packet: &[u8]) -> usize {
        let qpn = super::super::dest_qpn(packet);
        if qpn != 1 {
            return (qpn >> share::QPN_SHIFT) as usize;
        }
        let pick = |cm: &[Insn], first: usize| match share::run(cm, packet) {
            share::ANY => first,
            s => s as usize,
        };
        let s = pick(&self.cm, self.first());
        if s != self.first() {
            return s;
        }
        self.refresh();
        pick(&self.cm, self.first())
    }

    /// Leaves the table (at exit: nothing drops the backend then).
    pub(super) fn leave(self) {
        self.registry.leave(|_| {});
    }
}
