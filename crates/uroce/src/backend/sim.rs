//! The `sim` backend: contexts in one process talk over a [`SimNet`] with
//! seeded faults (loss, duplication, reordering, corruption, delay,
//! bandwidth per direction) instead of sockets, and every packet can be
//! captured to a pcap file for Wireshark.
//!
//! A network made with [`SimNetwork::new`] runs on the real clock (the
//! application and the progress threads run in real time), so faults are
//! reproducible in kind but runs are not bit-for-bit repeatable. One made
//! with [`SimNetwork::new_virtual`] runs on a virtual clock: its contexts
//! have no progress thread, [`SimNetwork::run_until`] drives them and
//! moves the clock from one event to the next, and a run is the same bit
//! for bit for the same seed (keys, packets, faults, completions, times),
//! the whole verbs stack included: CQs, channels, events, SRQs, memory
//! windows.
//!
//! Multicast: a port that joins a group receives every datagram sent to
//! the group at its port number, from other ports and its own (as a kernel
//! socket with `IP_MULTICAST_LOOP`, the default). The faults are drawn
//! once per datagram on the direction sender → group, before it is copied
//! to the members (one segment, as a LAN: a loss loses it for all).

use std::collections::VecDeque;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant as StdInstant;
use uroce_transport::fastmap::FastMap;

use uroce_sim::net::encapsulate;
use uroce_sim::{LinkConfig, SimNet};
use uroce_transport::Instant;
use uroce_wire::UdpDatagram;

use crate::config::DeviceConfig;
use crate::device::Device;

/// A datagram waiting in a port's inbox.
struct Arrived {
    from: SocketAddr,
    /// Its destination address: the port's, or a group it joined.
    to: IpAddr,
    payload: Vec<u8>,
}

struct World {
    net: SimNet,
    inboxes: FastMap<SocketAddr, VecDeque<Arrived>>,
    /// The members (ports) of each multicast group and port number.
    groups: FastMap<SocketAddr, Vec<SocketAddr>>,
    origin: StdInstant,
    /// The virtual clock, for a virtual network.
    virtual_now: Option<Instant>,
    seed: u64,
}

impl World {
    fn now(&self) -> Instant {
        self.virtual_now
            .unwrap_or_else(|| Instant::from_nanos(self.origin.elapsed().as_nanos() as u64 + 1))
    }

    /// Moves every datagram due now into its destination's inbox.
    fn route(&mut self) {
        let now = self.now();
        while let Some((_, _, bytes)) = self.net.pop_due(now) {
            // A datagram whose headers were corrupted may not parse or may
            // name nobody: it is lost, like on a real network.
            let Ok(d) = UdpDatagram::parse(&bytes) else { continue };
            let to = SocketAddr::new(d.ip.dst(), d.udp.dst_port());
            let from = SocketAddr::new(d.ip.src(), d.udp.src_port());
            let unicast = [to];
            let members = match self.groups.get(&to) {
                Some(m) if to.ip().is_multicast() => m.as_slice(),
                _ => &unicast[..],
            };
            for m in members {
                if let Some(q) = self.inboxes.get_mut(m) {
                    let payload = d.udp.payload().to_vec();
                    q.push_back(Arrived { from, to: to.ip(), payload });
                }
            }
        }
    }
}

/// A simulated network shared by the contexts opened on its devices.
#[derive(Clone)]
pub struct SimNetwork {
    world: Arc<Mutex<World>>,
}

impl std::fmt::Debug for SimNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimNetwork")
    }
}

impl SimNetwork {
    /// A network whose every direction has `link`'s faults, drawn from
    /// `seed`.
    pub fn new(seed: u64, link: LinkConfig) -> Self {
        Self::make(seed, link, None)
    }

    /// A network on a virtual clock (see the module documentation): drive
    /// its contexts with [`SimNetwork::run_until`].
    pub fn new_virtual(seed: u64, link: LinkConfig) -> Self {
        Self::make(seed, link, Some(Instant::from_nanos(1)))
    }

    fn make(seed: u64, link: LinkConfig, virtual_now: Option<Instant>) -> Self {
        Self {
            world: Arc::new(Mutex::new(World {
                net: SimNet::new(seed, link),
                inboxes: FastMap::default(),
                groups: FastMap::default(),
                origin: StdInstant::now(),
                virtual_now,
                seed,
            })),
        }
    }

    /// Whether the network runs on a virtual clock.
    pub fn is_virtual(&self) -> bool {
        self.lock().virtual_now.is_some()
    }

    /// The network's time (virtual, or real since creation).
    pub fn now(&self) -> Instant {
        self.lock().now()
    }

    /// The seed of the network's faults (contexts on a virtual network
    /// derive their key bytes from it).
    pub(crate) fn seed(&self) -> u64 {
        self.lock().seed
    }

    /// Drives `contexts` on the virtual clock: every context makes
    /// progress until none has work at the current instant, then `done` is
    /// asked, then the clock moves to the next event (a delivery or a
    /// context's timer). Returns whether `done` said yes within `limit` of
    /// virtual time; `false` also when nothing is left to happen.
    ///
    /// # Panics
    /// On a network with a real clock.
    pub fn run_until(
        &self,
        contexts: &[&crate::Context],
        limit: std::time::Duration,
        mut done: impl FnMut() -> bool,
    ) -> bool {
        assert!(self.is_virtual(), "run_until drives a virtual network");
        let end = self.now().as_nanos().saturating_add(limit.as_nanos() as u64);
        loop {
            while contexts.iter().fold(false, |any, c| c.drive() | any) {}
            if done() {
                return true;
            }
            let mut next = self.lock().net.next_delivery();
            for c in contexts {
                next = match (next, c.next_deadline()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            match next {
                Some(t) if t.as_nanos() <= end => {
                    let mut w = self.lock();
                    let now = w.now();
                    w.virtual_now = Some(if t > now { t } else { now });
                }
                _ => return false,
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the faults of the direction `from → to` (by IP address).
    pub fn set_link(&self, from: std::net::IpAddr, to: std::net::IpAddr, link: LinkConfig) {
        self.lock().net.set_link(from, to, link);
    }

    /// A device on this network at `addr:port` (any address: nothing is
    /// bound on the host).
    pub fn device(&self, name: &str, addr: std::net::IpAddr, port: u16) -> Device {
        Device::on_network(
            DeviceConfig { name: name.into(), addr, port },
            std::sync::Arc::new(self.clone()),
        )
    }

    /// Starts recording every datagram put on the network.
    pub fn capture(&self) {
        self.lock().net.capture();
    }

    /// The recording so far as a pcap file (raw IP link type), if
    /// [`SimNetwork::capture`] was called.
    pub fn take_pcap(&self) -> Option<Vec<u8>> {
        self.lock().net.take_pcap()
    }

    /// Delivery counters.
    pub fn stats(&self) -> uroce_sim::net::NetStats {
        self.lock().net.stats
    }
}

impl super::Network for SimNetwork {
    fn attach(&self, local: SocketAddr) -> Box<dyn super::Backend> {
        self.lock().inboxes.entry(local).or_default();
        Box::new(SimPort { net: self.clone(), local })
    }

    fn virtual_seed(&self) -> Option<u64> {
        self.is_virtual().then(|| self.seed())
    }
}

/// One context's attachment to a [`SimNetwork`].
pub(crate) struct SimPort {
    net: SimNetwork,
    local: SocketAddr,
}

impl std::fmt::Debug for SimPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimPort({})", self.local)
    }
}

impl SimPort {
    /// The network's clock.
    pub(crate) fn now(&self) -> Instant {
        self.net.lock().now()
    }

    /// Puts one RoCE packet on the network, framed as Linux would (IPv4 ID
    /// 0 with DF), its ICRC recomputed over that framing.
    fn send_one(&mut self, sport: u16, dst: SocketAddr, roce: &[u8]) {
        let dg = encapsulate(self.local.ip(), dst.ip(), sport, dst.port(), roce);
        let mut w = self.net.lock();
        let now = w.now();
        w.net.send(now, self.local.ip(), dst.ip(), dg);
    }

    fn recv_one(&mut self, buf: &mut [u8]) -> Option<(usize, SocketAddr, IpAddr)> {
        let mut w = self.net.lock();
        w.route();
        let a = w.inboxes.get_mut(&self.local)?.pop_front()?;
        let n = a.payload.len().min(buf.len());
        buf[..n].copy_from_slice(&a.payload[..n]);
        Some((n, a.from, a.to))
    }

    /// This port's membership of `group` (at the port's number).
    fn group_key(&self, group: IpAddr) -> SocketAddr {
        SocketAddr::new(group, self.local.port())
    }
}

impl super::Backend for SimPort {
    fn local(&self) -> SocketAddr {
        self.local
    }

    fn batch(&self) -> super::SendBatch {
        super::SendBatch { segments: 1, bytes: 65000 }
    }

    /// The simulated network carries any port, as a frame backend's
    /// does: the seeded runs put rxe's ports on the wire.
    fn source_port(&mut self, _dst: SocketAddr, wanted: u16) -> u16 {
        wanted
    }

    fn send(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
        _tos: u8,
    ) -> std::io::Result<()> {
        for p in data.chunks(seg.max(1)) {
            self.send_one(src.port(), dst, p);
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<Option<super::Received>> {
        Ok(self.recv_one(buf).map(|(len, from, to)| super::Received {
            len,
            seg: len,
            from,
            to,
            ip_id: None,
            local: false,
        }))
    }

    fn raw_fds(&self) -> Vec<i32> {
        Vec::new()
    }

    fn clock(&self) -> Option<Instant> {
        Some(self.now())
    }

    fn on_host(&self) -> bool {
        false
    }

    fn bind_local(&mut self, ip: std::net::IpAddr) -> std::io::Result<()> {
        if ip == self.local.ip() {
            Ok(())
        } else {
            Err(std::io::ErrorKind::AddrNotAvailable.into())
        }
    }

    fn unbind_local(&mut self, _ip: std::net::IpAddr) {}

    fn join(&mut self, group: IpAddr) -> std::io::Result<()> {
        if !group.is_multicast() || group.is_ipv4() != self.local.is_ipv4() {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        let key = self.group_key(group);
        let local = self.local;
        let mut w = self.net.lock();
        let members = w.groups.entry(key).or_default();
        if !members.contains(&local) {
            members.push(local);
        }
        Ok(())
    }

    fn leave(&mut self, group: IpAddr) {
        let key = self.group_key(group);
        let local = self.local;
        let mut w = self.net.lock();
        if let Some(members) = w.groups.get_mut(&key) {
            members.retain(|m| *m != local);
            if members.is_empty() {
                w.groups.remove(&key);
            }
        }
    }

    fn recv_group(&mut self, _buf: &mut [u8]) -> Option<(usize, SocketAddr, std::net::IpAddr)> {
        None
    }
}

impl Drop for SimPort {
    fn drop(&mut self) {
        let local = self.local;
        let mut w = self.net.lock();
        w.inboxes.remove(&local);
        w.groups.retain(|_, members| {
            members.retain(|m| *m != local);
            !members.is_empty()
        });
    }
}
