//! The DPDK backend (`UROCE_BACKEND=dpdk`, feature `dpdk`): RoCEv2 frames
//! built and parsed in user space and moved by a DPDK port that the
//! backend owns outright, on the wire the same as the `udp` backend.
//!
//! The port is whatever the EAL arguments make of it (`UROCE_DPDK_EAL`,
//! e.g. `--no-huge -m 128 --no-pci --file-prefix=uroce
//! --vdev=net_af_packet0,iface=eth1`; `UROCE_DPDK_PORT` picks one by
//! number or name, default 0): a kernel interface through `net_af_packet`
//! or `net_af_xdp`, or a NIC bound to a user-space driver;
//! `UROCE_DPDK_MTU` sets its MTU where the driver does not report the
//! link's (af_packet says 1500 whatever its interface has). No kernel
//! stack stands behind it, so the backend answers ARP for the device's
//! address itself and resolves its peers' MACs with ARP requests (frames
//! to a peer not yet resolved wait, up to [`PENDING_MAX`], for the reply).
//! One receive and one transmit queue; an mbuf holds a whole frame at the
//! port's MTU (up to 9 KiB: RoCE MTU 4096 on a jumbo link), and frames
//! that come in several (a port that scatters) are joined.
//!
//! It answers ping (ICMP echo) for its addresses too. What it does not do
//! (yet): IPv6 (neighbour discovery), multicast groups, ICMP errors, the
//! local shared-memory path, several contexts on one port (one process,
//! one context per port: DPDK starts once per process and a port has one
//! owner).

#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod ffi;

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use uroce_wire::arp::{ARP_LEN, ArpOp, ArpRepr, ETHERTYPE_ARP};
use uroce_wire::checksum;
use uroce_wire::eth::{ETH_HEADER_LEN, ETHERTYPE_IPV4, EthernetRepr};
use uroce_wire::ipv4::{IPV4_HEADER_LEN, Ipv4Packet, Ipv4Repr};

/// IP protocol number of ICMP.
const IPPROTO_ICMP: u8 = 1;

use super::{Backend, Received, SendBatch, frame};

/// Whether devices use this backend (`UROCE_BACKEND=dpdk`).
pub(crate) fn selected() -> bool {
    std::env::var("UROCE_BACKEND").as_deref() == Ok("dpdk")
}

/// The MTU of the last port started (0: none yet), for the port
/// attributes: the device's address is on no kernel interface to read it
/// from.
static PORT_MTU: AtomicU32 = AtomicU32::new(0);

/// Whether the last port started has its link up (checked every
/// [`LINK_CHECK`] while a context polls it).
static LINK_UP: AtomicBool = AtomicBool::new(false);
const LINK_CHECK: Duration = Duration::from_millis(100);

/// Whether the DPDK port's link is up (false before a port started).
pub(crate) fn link_up() -> bool {
    LINK_UP.load(Ordering::Relaxed)
}

/// The IP MTU of the DPDK port, once one started.
pub(crate) fn port_mtu() -> Option<usize> {
    match PORT_MTU.load(Ordering::Relaxed) {
        0 => None,
        m => Some(m as usize),
    }
}

/// Frames waiting for their destination's MAC, all destinations together.
const PENDING_MAX: usize = 256;
/// How often an unanswered ARP request is repeated.
const ARP_RETRY: Duration = Duration::from_millis(100);
/// Buffers in the port's pool.
const MBUFS: u32 = 8191;
/// The longest frame built: RoCE MTU 4096 and its headers, with room.
const MAX_FRAME: usize = 9216;

/// The DPDK backend of one context.
#[derive(Debug)]
pub(crate) struct DpdkBackend {
    /// `None` once closed at exit.
    port: Option<ffi::Port>,
    rx: ffi::RxBurst,
    /// A frame spanning several mbufs, joined.
    joined: Vec<u8>,
    /// Where frames are built.
    out: Vec<u8>,
    mac: [u8; 6],
    local: SocketAddr,
    /// The addresses answered for: the device's, then secondary ones.
    ips: Vec<Ipv4Addr>,
    /// Known neighbours (few: a linear search is fastest).
    neigh: Vec<(Ipv4Addr, [u8; 6])>,
    /// ARP requests sent and not answered yet, with when.
    asked: Vec<(Ipv4Addr, Instant)>,
    /// Frames waiting for their destination's MAC (destination MAC zero).
    pending: Vec<(Ipv4Addr, Vec<u8>)>,
    counters: Counters,
    /// When the link was last checked (the driver's nanoseconds).
    link_checked_ns: u64,
}

/// What the backend counts (`uroce stat`'s `dpdk_*`).
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    rcvd: u64,
    sent: u64,
    malformed: u64,
    bad_checksum: u64,
    other: u64,
    tx_dropped: u64,
    arp_replies: u64,
    arp_requests: u64,
    echo_replies: u64,
    no_neighbour: u64,
}

fn refused(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("DPDK backend: {what}: {e}"))
}

impl DpdkBackend {
    /// Starts the EAL (first time in the process) and the port, for the
    /// device at `addr` (IPv4).
    pub(crate) fn open(addr: SocketAddr) -> io::Result<Self> {
        let IpAddr::V4(ip) = addr.ip() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "DPDK backend: IPv4 addresses only (no neighbour discovery yet)",
            ));
        };
        let eal = std::env::var("UROCE_DPDK_EAL").unwrap_or_default();
        let args: Vec<String> = eal.split_whitespace().map(str::to_string).collect();
        ffi::start_eal(&args).map_err(|e| refused("starting the EAL (UROCE_DPDK_EAL)", e))?;
        let which = std::env::var("UROCE_DPDK_PORT").unwrap_or_else(|_| "0".into());
        let id = ffi::port_id(&which).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "DPDK backend: no port {which} (give one in UROCE_DPDK_EAL, such as \
                     --vdev=net_af_packet0,iface=eth1)"
                ),
            )
        })?;
        // The port's MTU is what its driver says unless set (af_packet
        // says 1500 whatever its interface has).
        let mtu: u16 = match std::env::var("UROCE_DPDK_MTU") {
            Ok(m) => m.parse().ok().filter(|&m| (576..=9000).contains(&m)).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("DPDK backend: UROCE_DPDK_MTU={m}: an IP MTU from 576 to 9000"),
                )
            })?,
            Err(_) => 0,
        };
        let (port, mac, mtu) = ffi::Port::start(id, mtu, MBUFS)
            .map_err(|e| refused(&format!("starting port {id}"), e))?;
        PORT_MTU.store(u32::from(mtu), Ordering::Relaxed);
        let port_num = if addr.port() == 0 { uroce_wire::udp::ROCE_V2_PORT } else { addr.port() };
        let mut b = Self {
            port: Some(port),
            rx: ffi::RxBurst::new(),
            joined: Vec::with_capacity(MAX_FRAME),
            out: vec![0; MAX_FRAME],
            mac,
            local: SocketAddr::new(addr.ip(), port_num),
            ips: vec![ip],
            neigh: Vec::new(),
            asked: Vec::new(),
            pending: Vec::new(),
            counters: Counters::default(),
            link_checked_ns: 0,
        };
        LINK_UP.store(b.port.as_ref().is_some_and(ffi::Port::link_up), Ordering::Relaxed);
        // Announce the address (gratuitous ARP), so that peers that knew
        // another MAC for it learn this one.
        b.arp(ArpOp::Request, [0xff; 6], ip, [0; 6], ip);
        Ok(b)
    }

    fn lookup(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.neigh.iter().find(|(a, _)| *a == ip).map(|&(_, m)| m)
    }

    /// Records `ip` at `mac`; sends the frames that waited for it.
    fn learn(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        if ip.is_unspecified() || mac[0] & 1 != 0 {
            return;
        }
        match self.neigh.iter_mut().find(|(a, _)| *a == ip) {
            Some(e) if e.1 == mac => return,
            Some(e) => e.1 = mac,
            None => self.neigh.push((ip, mac)),
        }
        self.asked.retain(|(a, _)| *a != ip);
        let mut waiting = std::mem::take(&mut self.pending);
        let before = waiting.len();
        waiting.retain_mut(|(a, f)| {
            if *a != ip {
                return true;
            }
            f[..6].copy_from_slice(&mac);
            let f = std::mem::take(f);
            self.transmit(&f);
            false
        });
        let sent = waiting.len() != before;
        self.pending = waiting;
        if sent {
            self.flush();
        }
    }

    /// Sends an ARP packet from our MAC.
    fn arp(&mut self, op: ArpOp, to: [u8; 6], sender: Ipv4Addr, target_mac: [u8; 6], ip: Ipv4Addr) {
        let mut f = [0u8; ETH_HEADER_LEN + ARP_LEN];
        let eth = EthernetRepr { dst: to, src: self.mac, vlan_tci: None, ethertype: ETHERTYPE_ARP };
        let arp =
            ArpRepr { op, sender_mac: self.mac, sender_ip: sender, target_mac, target_ip: ip };
        if eth.emit(&mut f).is_ok() && arp.emit(&mut f[ETH_HEADER_LEN..]).is_ok() {
            match op {
                ArpOp::Request => self.counters.arp_requests += 1,
                ArpOp::Reply => self.counters.arp_replies += 1,
            }
            self.transmit(&f);
            // Now: a reply comes from a receive pass, which no transmit
            // pass (and its flush) need follow.
            self.flush();
        }
    }

    /// Asks for `ip`'s MAC, unless asked within [`ARP_RETRY`].
    fn ask(&mut self, ip: Ipv4Addr, now: Instant) {
        match self.asked.iter_mut().find(|(a, _)| *a == ip) {
            Some((_, at)) if now.duration_since(*at) < ARP_RETRY => return,
            Some((_, at)) => *at = now,
            None => self.asked.push((ip, now)),
        }
        let me = self.ips[0];
        self.arp(ArpOp::Request, [0xff; 6], me, [0; 6], ip);
    }

    fn transmit(&mut self, f: &[u8]) {
        let Some(port) = self.port.as_mut() else { return };
        match port.send(f) {
            Ok(lost) => {
                self.counters.sent += 1;
                self.counters.tx_dropped += u64::from(lost);
            }
            Err(()) => self.counters.tx_dropped += 1,
        }
    }

    /// An echo request came (`echo_request`): answers it if it is to one
    /// of our addresses, so that `ping` works as over the kernel.
    fn on_echo(&mut self, f: &[u8]) {
        let Ok(ip) = Ipv4Packet::new_checked(&f[ETH_HEADER_LEN..]) else { return };
        if !self.ips.contains(&ip.dst()) {
            self.counters.other += 1;
            return;
        }
        let icmp = ip.payload();
        let n = ETH_HEADER_LEN + IPV4_HEADER_LEN + icmp.len();
        let mut out = std::mem::take(&mut self.out);
        let mut dst = [0u8; 6];
        dst.copy_from_slice(&f[6..12]);
        let eth = EthernetRepr { dst, src: self.mac, vlan_tci: None, ethertype: ETHERTYPE_IPV4 };
        let reply = Ipv4Repr {
            src: ip.dst(),
            dst: ip.src(),
            tos: ip.tos(),
            ident: 0,
            dont_frag: false,
            ttl: 64,
            protocol: IPPROTO_ICMP,
            payload_len: icmp.len(),
        };
        if out.len() >= n
            && eth.emit(&mut out).is_ok()
            && reply.emit(&mut out[ETH_HEADER_LEN..]).is_ok()
        {
            let m = &mut out[ETH_HEADER_LEN + IPV4_HEADER_LEN..n];
            m.copy_from_slice(icmp);
            // Type 0 (echo reply), checksum over the message anew.
            m[0] = 0;
            m[2..4].fill(0);
            let c = checksum::checksum(m);
            m[2..4].copy_from_slice(&c.to_be_bytes());
            self.counters.echo_replies += 1;
            self.transmit(&out[..n]);
            self.flush();
        }
        self.out = out;
    }

    /// An ARP packet came: answer a request for one of our addresses,
    /// learn the sender either way.
    fn on_arp(&mut self, payload: &[u8]) {
        let Ok(a) = ArpRepr::parse(payload) else {
            self.counters.malformed += 1;
            return;
        };
        if a.op == ArpOp::Request && self.ips.contains(&a.target_ip) {
            self.arp(ArpOp::Reply, a.sender_mac, a.target_ip, a.sender_mac, a.sender_ip);
        }
        if a.op == ArpOp::Reply || self.ips.contains(&a.target_ip) {
            self.learn(a.sender_ip, a.sender_mac);
        }
    }
}

/// Whether `f` is an ICMP echo request in an untagged IPv4 packet whose
/// header and message checksums verify (not a fragment).
fn echo_request(f: &[u8]) -> bool {
    if f.get(12..14) != Some(&ETHERTYPE_IPV4.to_be_bytes()[..]) {
        return false;
    }
    let Ok(ip) = Ipv4Packet::new_checked(&f[ETH_HEADER_LEN..]) else { return false };
    let icmp = ip.payload();
    ip.protocol() == IPPROTO_ICMP
        && ip.checksum_ok()
        && !ip.more_frags()
        && ip.frag_offset() == 0
        && icmp.len() >= 8
        && icmp[0] == 8
        && checksum::checksum(icmp) == 0
}

/// Whether `f` is an IPv4 UDP datagram to `port` (untagged), so that
/// other traffic on the port (IPv6, TCP, other UDP) is told apart from
/// damaged RoCE frames.
fn roce_frame(f: &[u8], port: u16) -> bool {
    let Some(ip) = f.get(ETH_HEADER_LEN..) else { return false };
    if f.get(12..14) != Some(&ETHERTYPE_IPV4.to_be_bytes()[..]) || ip.len() < 20 {
        return false;
    }
    let ihl = usize::from(ip[0] & 0xf) * 4;
    ip[9] == uroce_wire::ipv4::IPPROTO_UDP
        && ip.get(ihl + 2..ihl + 4).is_some_and(|p| u16::from_be_bytes([p[0], p[1]]) == port)
}

impl Backend for DpdkBackend {
    fn local(&self) -> SocketAddr {
        self.local
    }

    fn tick(&mut self, now_ns: u64) {
        if now_ns.saturating_sub(self.link_checked_ns) >= LINK_CHECK.as_nanos() as u64 {
            self.link_checked_ns = now_ns;
            if let Some(p) = self.port.as_ref() {
                LINK_UP.store(p.link_up(), Ordering::Relaxed);
            }
        }
    }

    /// One packet per send, each with IP ID 0, as the AF_XDP backend
    /// (see there); the frames leave in bursts at [`Backend::flush`].
    fn batch(&self) -> SendBatch {
        SendBatch { segments: 1, bytes: 65_000 }
    }

    fn send(
        &mut self,
        src: IpAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
        tos: u8,
    ) -> io::Result<()> {
        let IpAddr::V4(to) = dst.ip() else {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "DPDK backend: IPv4 only"));
        };
        let dst_mac = self.lookup(to);
        let path = frame::Path {
            src_mac: self.mac,
            dst_mac: dst_mac.unwrap_or([0; 6]),
            src: SocketAddr::new(src, self.local.port()),
            dst,
        };
        for (i, p) in data.chunks(seg.max(1)).enumerate() {
            let mut out = std::mem::take(&mut self.out);
            if let Some(n) = frame::build(&mut out, &path, p, i as u16, tos) {
                if dst_mac.is_some() {
                    self.transmit(&out[..n]);
                } else if self.pending.len() < PENDING_MAX {
                    self.pending.push((to, out[..n].to_vec()));
                } else {
                    self.counters.no_neighbour += 1;
                }
            }
            self.out = out;
        }
        if dst_mac.is_none() {
            self.ask(to, Instant::now());
        }
        Ok(())
    }

    fn flush(&mut self) {
        if let Some(port) = self.port.as_mut() {
            self.counters.tx_dropped += u64::from(port.flush());
        }
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        let udp_port = self.local.port();
        loop {
            let mut joined = std::mem::take(&mut self.joined);
            let got = self.rx.next(&mut joined, |f| {
                if f.get(12..14) == Some(&ETHERTYPE_ARP.to_be_bytes()[..]) {
                    let mut a = [0u8; ARP_LEN];
                    let n = f.len().saturating_sub(ETH_HEADER_LEN).min(ARP_LEN);
                    a[..n].copy_from_slice(&f[ETH_HEADER_LEN..ETH_HEADER_LEN + n]);
                    return Step::Arp(a, n);
                }
                if !roce_frame(f, udp_port) {
                    if echo_request(f) && f.len() <= buf.len() {
                        buf[..f.len()].copy_from_slice(f);
                        return Step::Echo(f.len());
                    }
                    return Step::Other;
                }
                match frame::parse(f, udp_port) {
                    Ok(p) => {
                        let n = p.payload.len();
                        let Some(dst) = buf.get_mut(..n) else { return Step::Malformed };
                        dst.copy_from_slice(p.payload);
                        let mut mac = [0u8; 6];
                        mac.copy_from_slice(&f[6..12]);
                        let r = Received {
                            len: n,
                            seg: n,
                            from: p.from,
                            to: p.to,
                            ip_id: Some(p.ip_id),
                            local: false,
                        };
                        Step::Roce(r, mac)
                    }
                    Err(frame::Refused::Malformed) => Step::Malformed,
                    Err(frame::Refused::BadChecksum) => Step::BadChecksum,
                }
            });
            self.joined = joined;
            let Some(step) = got else {
                let Some(port) = self.port.as_mut() else { return Ok(None) };
                if port.receive(&mut self.rx) == 0 {
                    return Ok(None);
                }
                continue;
            };
            match step {
                Step::Arp(a, n) => self.on_arp(&a[..n]),
                Step::Echo(n) => self.on_echo(&buf[..n]),
                Step::Other => self.counters.other += 1,
                Step::Malformed => self.counters.malformed += 1,
                Step::BadChecksum => self.counters.bad_checksum += 1,
                Step::Roce(r, mac) => {
                    let IpAddr::V4(to) = r.to else { continue };
                    if !self.ips.contains(&to) {
                        self.counters.other += 1;
                        continue;
                    }
                    if let IpAddr::V4(from) = r.from.ip() {
                        self.learn(from, mac);
                    }
                    self.counters.rcvd += 1;
                    return Ok(Some(r));
                }
            }
        }
    }

    /// None: the port has no descriptor, so the progress thread naps
    /// between polls (as DPDK applications poll).
    fn raw_fds(&self) -> Vec<i32> {
        Vec::new()
    }

    fn at_exit(&mut self) {
        self.flush();
        self.rx = ffi::RxBurst::new();
        if let Some(p) = self.port.take() {
            p.close();
        }
    }

    fn add_counters(&self, stats: &mut uroce_transport::Stats) {
        let c = &self.counters;
        stats.dpdk_rcvd_frames += c.rcvd;
        stats.dpdk_sent_frames += c.sent;
        stats.dpdk_rx_malformed += c.malformed;
        stats.dpdk_rx_bad_checksum += c.bad_checksum;
        stats.dpdk_rx_other += c.other;
        stats.dpdk_tx_dropped += c.tx_dropped;
        stats.dpdk_arp_replies += c.arp_replies;
        stats.dpdk_arp_requests += c.arp_requests;
        stats.dpdk_echo_replies += c.echo_replies;
        stats.dpdk_no_neighbour += c.no_neighbour;
        if let Some(p) = self.port.as_ref() {
            let st = p.stats();
            stats.dpdk_rx_missed += st[2] + st[5];
            stats.dpdk_port_errors += st[3] + st[4];
        }
    }

    fn on_host(&self) -> bool {
        false
    }

    fn bind_local(&mut self, ip: IpAddr) -> io::Result<()> {
        match ip {
            IpAddr::V4(a) if !self.ips.contains(&a) => {
                self.ips.push(a);
                Ok(())
            }
            IpAddr::V4(_) => Ok(()),
            IpAddr::V6(_) => {
                Err(io::Error::new(io::ErrorKind::Unsupported, "DPDK backend: IPv4 only"))
            }
        }
    }

    fn unbind_local(&mut self, ip: IpAddr) {
        if let IpAddr::V4(a) = ip
            && a != self.ips[0]
        {
            self.ips.retain(|&x| x != a);
        }
    }

    fn join(&mut self, _group: IpAddr) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "DPDK backend: multicast groups are not supported yet",
        ))
    }

    fn leave(&mut self, _group: IpAddr) {}

    fn recv_group(&mut self, _buf: &mut [u8]) -> Option<(usize, SocketAddr, IpAddr)> {
        None
    }
}

/// What one received frame turned out to be.
enum Step {
    Arp([u8; ARP_LEN], usize),
    /// An ICMP echo request, copied into the receive buffer (its length).
    Echo(usize),
    Roce(Received, [u8; 6]),
    Other,
    Malformed,
    BadChecksum,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_frames_are_told_from_other_traffic() {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[14 + 22..14 + 24].copy_from_slice(&4791u16.to_be_bytes());
        assert!(roce_frame(&f, 4791));
        assert!(!roce_frame(&f, 4792));
        f[14 + 9] = 6; // TCP
        assert!(!roce_frame(&f, 4791));
        assert!(!roce_frame(&f[..20], 4791));
    }
}
