//! The DPDK backend (`UROCE_BACKEND=dpdk`, feature `dpdk`): RoCEv2 frames
//! built and parsed in user space and moved by a DPDK port that the
//! backend owns outright, on the wire the same as the `udp` backend.
//!
//! The port is whatever the EAL arguments make of it (`UROCE_DPDK_EAL`,
//! e.g. `--no-huge -m 128 --no-pci --file-prefix=uroce
//! --vdev=net_af_packet0,iface=eth1`; `UROCE_DPDK_PORT` picks one by
//! number or name, default 0): a kernel interface through `net_af_packet`
//! or `net_af_xdp`, a tap interface (`net_tap`), shared memory with
//! another DPDK process (`net_memif`), or a NIC bound to a user-space driver;
//! `UROCE_DPDK_MTU` sets its MTU where the driver does not report the
//! link's (af_packet says 1500 whatever its interface has). No kernel
//! stack stands behind it, so the backend does what the kernel would
//! (`control`): it answers ARP and IPv6 neighbour solicitations for the
//! device's addresses and ping (ICMP and ICMPv6 echo), announces its
//! addresses, resolves its peers' MACs by ARP or neighbour solicitation
//! (frames to a peer not yet resolved wait for the answer: `neigh`), and
//! reads the port-unreachable errors peers' hosts send. Datagrams to
//! multicast groups joined are taken (the port receives all multicast).
//! One receive and one transmit queue; an mbuf holds a whole frame at the
//! port's MTU (up to 9 KiB: RoCE MTU 4096 on a jumbo link), and frames
//! that come in several (a port that scatters) are joined.
//!
//! Multicast routers and snooping switches are told of the groups joined
//! (IGMPv3 and MLDv2, MLD from the port's link-local address, or the older
//! version an older querier speaks; their queries answered).
//!
//! Several processes share a device, one context each (`members`): each
//! has a port of its own on the interface (af_packet ports only: each
//! sees every frame) and keeps the frames of its slot's QPNs; frames to
//! the device's own address go through shared memory. Each process is an
//! EAL primary of its own (`eal`).

#![deny(unsafe_code)]

mod control;
mod eal;
#[allow(unsafe_code)]
mod ffi;
mod members;
mod neigh;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use uroce_wire::arp::{ARP_LEN, ArpOp, ArpRepr};
use uroce_wire::eth::{ETH_HEADER_LEN, ETHERTYPE_IPV4};
use uroce_wire::ndp::NdpRepr;

use super::shm::{LocalPath, Sent};
use super::{Backend, Received, SendBatch, frame};
use control::{Icmp, Kind, Membership};
use members::Members;
use uroce_transport::cm::Leftover;

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
    ips: Vec<IpAddr>,
    /// Multicast groups joined (their RoCE datagrams are taken).
    groups: Vec<IpAddr>,
    neigh: neigh::Neighbours,
    /// Destinations an ICMP error said nothing listens at, not yet told.
    gone: Vec<SocketAddr>,
    counters: Counters,
    /// When the link was last checked (the driver's nanoseconds).
    link_checked_ns: u64,
    /// The driver's time at the last tick (nanoseconds).
    now_ns: u64,
    /// Port unreachable errors sent in the current second: (the second,
    /// how many).
    unreachables: (u64, u32),
    /// The IGMP and MLD versions our reports take (older queriers heard).
    igmp: control::Compat,
    mld: control::Compat,
    /// This context's slot among the device's members (`None`: the
    /// device is its alone).
    members: Option<Members>,
    /// Shared memory to the device's members (this one included): what is
    /// sent to the device's own addresses.
    local_path: Option<LocalPath>,
    /// Packets taken from the local path in a row (the port gets a turn
    /// after [`LOCAL_STREAK`]).
    local_streak: u32,
}

/// How many packets in a row `recv` takes from the local path before it
/// looks at the port.
const LOCAL_STREAK: u32 = 16;

/// The most port unreachable errors sent in a second.
const UNREACHABLES_PER_SEC: u32 = 100;

/// What the backend counts (`uroce stat`'s `dpdk_*`).
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    rcvd: u64,
    sent: u64,
    malformed: u64,
    bad_checksum: u64,
    other: u64,
    tx_dropped: u64,
    /// ARP replies and neighbour advertisements sent.
    arp_replies: u64,
    /// ARP requests and neighbour solicitations sent.
    arp_requests: u64,
    echo_replies: u64,
    no_neighbour: u64,
    group_reports: u64,
    port_unreachables: u64,
    /// RoCE frames to the device that another member owns.
    for_others: u64,
}

fn refused(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("DPDK backend: {what}: {e}"))
}

impl DpdkBackend {
    /// Starts the EAL (first time in the process) and the port, for the
    /// device at `addr` (IPv4 or IPv6).
    pub(crate) fn open(addr: SocketAddr) -> io::Result<Self> {
        let given = std::env::var("UROCE_DPDK_EAL").unwrap_or_default();
        let given: Vec<String> = given.split_whitespace().map(str::to_string).collect();
        let (args, base) = eal::own_prefix(&given, std::process::id());
        let fresh =
            ffi::start_eal(&args).map_err(|e| refused("starting the EAL (UROCE_DPDK_EAL)", e))?;
        if fresh && let (Some(base), Some(dir)) = (base, ffi::runtime_dir()) {
            eal::sweep(&dir, &base);
            *eal::REMOVE_AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir);
        }
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
        let port_num = if addr.port() == 0 { uroce_wire::udp::ROCE_V2_PORT } else { addr.port() };
        let local = SocketAddr::new(addr.ip(), port_num);
        // The slot first: a context that cannot share the device is
        // refused before its port starts (an AF_XDP port would take the
        // interface's frames from the members at its start).
        let members = Members::join(local, &ffi::driver_of(id)).map_err(|e| {
            ffi::close_unused(id);
            refused("sharing the device", e)
        })?;
        let (port, mac, mtu) = ffi::Port::start(id, mtu, MBUFS)
            .map_err(|e| refused(&format!("starting port {id}"), e))?;
        PORT_MTU.store(u32::from(mtu), Ordering::Relaxed);
        // Without it, frames to the device's own address go nowhere (and
        // are counted): the port cannot carry them.
        let local_path = LocalPath::for_dpdk(local, members.as_ref().map_or(0, Members::slot)).ok();
        let mut b = Self {
            port: Some(port),
            rx: ffi::RxBurst::new(),
            joined: Vec::with_capacity(MAX_FRAME),
            out: vec![0; MAX_FRAME],
            mac,
            local,
            ips: vec![addr.ip()],
            groups: Vec::new(),
            neigh: neigh::Neighbours::default(),
            gone: Vec::new(),
            counters: Counters::default(),
            link_checked_ns: 0,
            now_ns: 0,
            unreachables: (0, 0),
            igmp: control::Compat::default(),
            mld: control::Compat::default(),
            members,
            local_path,
            local_streak: 0,
        };
        LINK_UP.store(b.port.as_ref().is_some_and(ffi::Port::link_up), Ordering::Relaxed);
        b.announce(addr.ip());
        Ok(b)
    }

    /// Whether this context answers for the device (ARP, neighbour
    /// discovery, ping, closed ports): alone, or the lowest live member.
    fn answers(&self) -> bool {
        self.members.as_ref().is_none_or(Members::answers)
    }

    /// Whether this context answers ARP, neighbour solicitations and ping
    /// for `ip`, one of its addresses: the device's own address is the
    /// lowest member's to answer for; another (a GID a QP used) is bound
    /// by the members that use it, each answering (the lowest member may
    /// not have it).
    fn answers_for(&self, ip: IpAddr) -> bool {
        ip != self.ips[0] || self.answers()
    }

    /// Tells the link that `ip` is at our MAC (a gratuitous ARP request or
    /// an unsolicited neighbour advertisement), so that peers that knew
    /// another MAC for it learn this one.
    fn announce(&mut self, ip: IpAddr) {
        let mac = self.mac;
        self.control(|out| control::announce_frame(out, mac, ip));
        match ip {
            IpAddr::V4(_) => self.counters.arp_requests += 1,
            IpAddr::V6(a) => {
                self.counters.arp_replies += 1;
                // Solicitations for it go to its solicited-node group: a
                // switch that snoops MLD forwards them once it is reported.
                let group = IpAddr::V6(uroce_wire::ndp::solicited_node(a));
                self.report(group, Membership::Joined);
            }
        }
    }

    /// Tells multicast routers and snooping switches what `what` says of
    /// `group`, from our first address of its family, in the version the
    /// family's queriers speak.
    fn report(&mut self, group: IpAddr, what: Membership) {
        let Some(&me) = self.ips.iter().find(|a| a.is_ipv4() == group.is_ipv4()) else { return };
        let mac = self.mac;
        let compat = if group.is_ipv4() { &self.igmp } else { &self.mld };
        let version = compat.version(self.now_ns);
        if self.control(|out| control::membership_frame(out, mac, (me, group), what, version)) {
            self.counters.group_reports += 1;
        }
    }

    /// The groups this device reports: those joined, and the
    /// solicited-node groups of its IPv6 addresses.
    fn reported_groups(&self) -> Vec<IpAddr> {
        let solicited = self.ips.iter().filter_map(|a| match a {
            IpAddr::V6(a) => Some(IpAddr::V6(uroce_wire::ndp::solicited_node(*a))),
            IpAddr::V4(_) => None,
        });
        let mut all: Vec<IpAddr> = self.groups.iter().copied().chain(solicited).collect();
        all.dedup();
        all
    }

    /// Sends the control frame `build` writes, at once: it answers a
    /// receive pass, which no transmit pass (and its flush) need follow.
    fn control(&mut self, build: impl FnOnce(&mut [u8]) -> Option<usize>) -> bool {
        let mut out = std::mem::take(&mut self.out);
        let built = build(&mut out);
        if let Some(n) = built {
            self.transmit(&out[..n]);
            self.flush();
        }
        self.out = out;
        built.is_some()
    }

    /// Records `ip` at `mac`; sends the frames that waited for it.
    fn learn(&mut self, ip: IpAddr, mac: [u8; 6]) {
        let mut neigh = std::mem::take(&mut self.neigh);
        if neigh.learn(ip, mac, |f| self.transmit(f)) > 0 {
            self.flush();
        }
        self.neigh = neigh;
    }

    /// Asks for `ip`'s MAC, unless asked within [`neigh::ASK_RETRY`], from
    /// our first address of its family.
    fn ask(&mut self, ip: IpAddr, now: Instant) {
        let Some(&me) = self.ips.iter().find(|a| a.is_ipv4() == ip.is_ipv4()) else { return };
        if self.neigh.due(ip, now) {
            let mac = self.mac;
            if self.control(|out| control::ask_frame(out, mac, me, ip)) {
                self.counters.arp_requests += 1;
            }
        }
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

    /// An ARP packet came: answer a request for one of our addresses,
    /// learn the sender either way.
    fn on_arp(&mut self, payload: &[u8]) {
        let Ok(a) = ArpRepr::parse(payload) else {
            self.counters.malformed += 1;
            return;
        };
        let ours = self.ips.contains(&IpAddr::V4(a.target_ip));
        if a.op == ArpOp::Request && ours && self.answers_for(IpAddr::V4(a.target_ip)) {
            let mac = self.mac;
            let reply = ArpRepr {
                op: ArpOp::Reply,
                sender_mac: mac,
                sender_ip: a.target_ip,
                target_mac: a.sender_mac,
                target_ip: a.sender_ip,
            };
            if self.control(|out| control::arp_frame(out, mac, a.sender_mac, &reply)) {
                self.counters.arp_replies += 1;
            }
        }
        if a.op == ArpOp::Reply || ours {
            self.learn(IpAddr::V4(a.sender_ip), a.sender_mac);
        }
    }

    /// A UDP datagram to a port nothing listens on came (`f`, copied out
    /// of the port): a port unreachable error back, as a kernel sends
    /// one, so that the sender's socket learns it at once; at most
    /// [`UNREACHABLES_PER_SEC`] a second (the kernel limits them too).
    fn on_closed_port(&mut self, f: &[u8]) {
        self.counters.other += 1;
        if !self.answers() {
            return;
        }
        let second = self.now_ns / 1_000_000_000;
        if self.unreachables.0 != second {
            self.unreachables = (second, 0);
        }
        if self.unreachables.1 >= UNREACHABLES_PER_SEC {
            return;
        }
        let mac = self.mac;
        let ips = std::mem::take(&mut self.ips);
        if self.control(|out| control::port_unreachable(f, out, mac, &ips)) {
            self.counters.port_unreachables += 1;
            self.unreachables.1 += 1;
        }
        self.ips = ips;
    }

    /// An ICMP or ICMPv6 frame came (`f`, copied out of the port).
    fn on_icmp(&mut self, f: &[u8]) {
        match control::icmp(f) {
            Icmp::Echo { to } if self.ips.contains(&to) && self.answers_for(to) => {
                let mac = self.mac;
                if self.control(|out| control::echo_reply(f, out, mac)) {
                    self.counters.echo_replies += 1;
                }
            }
            Icmp::Ndp { from, to: _, msg } => self.on_ndp(from, &f[6..12], msg),
            Icmp::Unreachable { src, dst } if self.ips.contains(&src.ip()) => {
                if !self.gone.contains(&dst) {
                    self.gone.push(dst);
                }
            }
            // A router asks (IGMP or MLD): report the groups asked about
            // (a query from another family's router asks for none of ours).
            // A query of an older version makes our reports that version
            // for a while, as routers of it need.
            Icmp::Query { group, version } => {
                let v4 = f.get(12..14) == Some(&ETHERTYPE_IPV4.to_be_bytes()[..]);
                let compat = if v4 { &mut self.igmp } else { &mut self.mld };
                compat.heard(version, self.now_ns);
                for g in self.reported_groups() {
                    if g.is_ipv4() == v4 && group.is_none_or(|q| q == g) {
                        self.report(g, Membership::Current);
                    }
                }
            }
            _ => self.counters.other += 1,
        }
    }

    /// A neighbour discovery message from `from` (the frame's source MAC
    /// `src_mac`): answer a solicitation for one of our addresses, learn
    /// the sender or the target.
    fn on_ndp(&mut self, from: std::net::Ipv6Addr, src_mac: &[u8], msg: NdpRepr) {
        match msg {
            NdpRepr::Solicit { target, source_mac } => {
                if !self.ips.contains(&IpAddr::V6(target)) {
                    self.counters.other += 1;
                    return;
                }
                if !self.answers_for(IpAddr::V6(target)) {
                    // Another member answers; the sender is learnt all
                    // the same.
                    if let Some(m) = source_mac {
                        self.learn(IpAddr::V6(from), m);
                    }
                    return;
                }
                // From the unspecified address (another host's duplicate
                // address detection): the answer goes to all nodes.
                let (to_ip, to_mac, solicited) = if from.is_unspecified() {
                    let all = control::ALL_NODES;
                    (all, uroce_wire::ndp::multicast_mac(IpAddr::V6(all)), false)
                } else {
                    let mut m = [0u8; 6];
                    m.copy_from_slice(src_mac);
                    (from, source_mac.unwrap_or(m), true)
                };
                let mac = self.mac;
                let na =
                    NdpRepr::Advert { target, target_mac: Some(mac), solicited, overrides: true };
                if self.control(|out| control::ndp_frame(out, (mac, to_mac), (target, to_ip), &na))
                {
                    self.counters.arp_replies += 1;
                }
                if let Some(m) = source_mac {
                    self.learn(IpAddr::V6(from), m);
                }
            }
            NdpRepr::Advert { target, target_mac, .. } => {
                if let Some(m) = target_mac {
                    self.learn(IpAddr::V6(target), m);
                }
            }
        }
    }
}

impl DpdkBackend {
    /// Sends to the device's own address: into the inbox of the member
    /// that owns the packets (this one's too), or nowhere if none does.
    fn send_to_member(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
    ) -> io::Result<()> {
        let packets = data.len().div_ceil(seg.max(1)) as u64;
        let Some(lp) = self.local_path.as_mut() else {
            self.counters.no_neighbour += packets;
            return Ok(());
        };
        let sent = if super::dest_qpn(data) == 1 {
            let slot = self.members.as_mut().map_or(0, |m| m.owner(data));
            lp.send_to_slot(src, dst, data, seg, (dst, slot as u8))
        } else {
            lp.send(src, dst, data, seg)
        };
        match sent {
            // No member owns the QPN: lost, as a datagram to a closed QP.
            Sent::NotLocal => self.counters.no_neighbour += packets,
            // No doorbell: a DPDK member never sleeps on a descriptor.
            Sent::Written(_) => {}
            Sent::Full => return Err(io::ErrorKind::WouldBlock.into()),
        }
        Ok(())
    }

    /// The next RoCE datagram the port brought for this context; what
    /// else came is answered or counted on the way.
    fn recv_port(&mut self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        let udp_port = self.local.port();
        loop {
            let mut joined = std::mem::take(&mut self.joined);
            let got = self.rx.next(&mut joined, |f| match control::classify(f, udp_port) {
                Kind::Arp => {
                    let mut a = [0u8; ARP_LEN];
                    let n = f.len().saturating_sub(ETH_HEADER_LEN).min(ARP_LEN);
                    a[..n].copy_from_slice(&f[ETH_HEADER_LEN..ETH_HEADER_LEN + n]);
                    Step::Arp(a, n)
                }
                Kind::Icmp if f.len() <= buf.len() => {
                    buf[..f.len()].copy_from_slice(f);
                    Step::Icmp(f.len())
                }
                Kind::ClosedPort if f.len() <= buf.len() => {
                    buf[..f.len()].copy_from_slice(f);
                    Step::ClosedPort(f.len())
                }
                Kind::Icmp | Kind::ClosedPort | Kind::Other => Step::Other,
                Kind::Roce => match frame::parse(f, udp_port) {
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
                },
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
                Step::Icmp(n) => self.on_icmp(&buf[..n]),
                Step::ClosedPort(n) => self.on_closed_port(&buf[..n]),
                Step::Other => self.counters.other += 1,
                Step::Malformed => self.counters.malformed += 1,
                Step::BadChecksum => self.counters.bad_checksum += 1,
                Step::Roce(r, mac) => {
                    // To one of our addresses or a group joined (delivered
                    // to the group's QPs as the `udp` backend's group
                    // sockets deliver).
                    if !self.ips.contains(&r.to) && !self.groups.contains(&r.to) {
                        self.counters.other += 1;
                        continue;
                    }
                    self.learn(r.from.ip(), mac);
                    // Every member sees the frame; the one that owns it
                    // takes it (a group's datagram goes to every member
                    // that joined the group).
                    if !self.groups.contains(&r.to)
                        && let Some(m) = self.members.as_mut()
                        && m.owner(&buf[..r.len]) != m.slot()
                    {
                        self.counters.for_others += 1;
                        continue;
                    }
                    self.counters.rcvd += 1;
                    return Ok(Some(r));
                }
            }
        }
    }

    /// A datagram to a group goes to the device's members too (this one
    /// included), through their inboxes at the device's address, as the
    /// kernel loops a multicast datagram back to the host's sockets: the
    /// port does not bring back what it sent. Each keeps it if it joined
    /// the group. Best effort, as multicast is.
    fn send_to_group_members(&mut self, src: SocketAddr, dst: SocketAddr, data: &[u8], seg: usize) {
        let Some(lp) = self.local_path.as_mut() else { return };
        let slots = self.members.as_ref().map_or(&[0][..], Members::live);
        for &slot in slots {
            let _ = lp.send_to_slot(src, dst, data, seg, (self.local, slot as u8));
        }
    }

    /// The next packet a member (or this context) sent to the device, or
    /// to a group this context joined.
    fn recv_local(&mut self, buf: &mut [u8]) -> Option<Received> {
        loop {
            let (len, m) = self.local_path.as_mut()?.recv(buf)?;
            if m.to.is_multicast() && !self.groups.contains(&m.to) {
                self.counters.other += 1;
                continue;
            }
            return Some(Received {
                len,
                seg: len,
                from: m.from,
                to: m.to,
                ip_id: None,
                local: true,
            });
        }
    }
}

impl Backend for DpdkBackend {
    fn relay_secret(&self) -> u64 {
        self.members.as_ref().map_or(0, |m| m.registry().secret())
    }

    fn qpn_range(&self) -> (u32, u32) {
        self.members.as_ref().map_or((0, 0), |m| {
            ((m.slot() as u32) << super::QPN_RANGE_BITS, m.registry().qpn_start())
        })
    }

    fn cm_id_prefix(&self) -> Option<(u32, u32)> {
        self.members.as_ref().map(|m| (m.slot() as u32, super::share::COMM_ID_SLOT_BITS))
    }

    fn set_listening(&mut self, ports: &[u16]) -> bool {
        self.members.as_mut().is_none_or(|m| m.set_listening(ports))
    }

    fn listened_elsewhere(&mut self) -> Vec<u16> {
        self.members.as_ref().map_or_else(Vec::new, |m| m.registry().listened_by_others())
    }

    fn publish_connections(&mut self, conns: &[Leftover]) -> bool {
        self.members.as_ref().is_none_or(|m| m.registry().publish_connections(conns).is_ok())
    }

    fn take_leftovers(&mut self) -> Vec<Leftover> {
        self.members.as_mut().map_or_else(Vec::new, |m| m.registry_mut().take_leftovers())
    }

    fn is_local(&mut self, dst: SocketAddr, qpn: u32) -> bool {
        self.ips.contains(&dst.ip())
            && self.local_path.as_mut().is_some_and(|lp| lp.reaches(dst, qpn))
    }

    fn local(&self) -> SocketAddr {
        self.local
    }

    fn tick(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        if let Some(lp) = self.local_path.as_mut() {
            lp.tick(now_ns, &mut |_, _| {});
        }
        if let Some(m) = self.members.as_mut() {
            m.tick(now_ns);
        }
        if now_ns.saturating_sub(self.link_checked_ns) >= LINK_CHECK.as_nanos() as u64 {
            self.link_checked_ns = now_ns;
            if let Some(p) = self.port.as_ref() {
                LINK_UP.store(p.link_up(), Ordering::Relaxed);
            }
            self.counters.no_neighbour += self.neigh.expire(Instant::now()) as u64;
        }
    }

    /// One packet per send, each with IP ID 0, as the AF_XDP backend
    /// (see there); the frames leave in bursts at [`Backend::flush`].
    fn batch(&self) -> SendBatch {
        SendBatch { segments: 1, bytes: 65_000 }
    }

    /// Every frame is ours to build: the QP's port.
    fn source_port(&mut self, _dst: SocketAddr, wanted: u16) -> u16 {
        wanted
    }

    fn send(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
        tos: u8,
    ) -> io::Result<()> {
        if src.is_ipv4() != dst.is_ipv4() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "DPDK backend: source and destination of different families",
            ));
        }
        let to = dst.ip();
        if self.ips.contains(&to) {
            return self.send_to_member(src, dst, data, seg);
        }
        let dst_mac = self.neigh.lookup(to);
        let path = frame::Path { src_mac: self.mac, dst_mac: dst_mac.unwrap_or([0; 6]), src, dst };
        for (i, p) in data.chunks(seg.max(1)).enumerate() {
            let mut out = std::mem::take(&mut self.out);
            if let Some(n) = frame::build(&mut out, &path, p, i as u16, tos) {
                if dst_mac.is_some() {
                    self.transmit(&out[..n]);
                } else if !self.neigh.wait(to, &out[..n]) {
                    self.counters.no_neighbour += 1;
                }
            }
            self.out = out;
        }
        if dst_mac.is_none() {
            self.ask(to, Instant::now());
        }
        if to.is_multicast() {
            self.send_to_group_members(src, dst, data, seg);
        }
        Ok(())
    }

    fn flush(&mut self) {
        if let Some(port) = self.port.as_mut() {
            self.counters.tx_dropped += u64::from(port.flush());
        }
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        if self.local_streak < LOCAL_STREAK
            && let Some(r) = self.recv_local(buf)
        {
            self.local_streak += 1;
            return Ok(Some(r));
        }
        self.local_streak = 0;
        match self.recv_port(buf)? {
            Some(r) => Ok(Some(r)),
            None => Ok(self.recv_local(buf)),
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
        self.local_path = None;
        if let Some(m) = self.members.take() {
            m.leave();
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
        stats.dpdk_port_unreachables += c.port_unreachables;
        stats.dpdk_no_neighbour += c.no_neighbour;
        stats.dpdk_group_reports += c.group_reports;
        stats.dpdk_rx_for_others += c.for_others;
        if let Some(c) = self.local_path.as_ref().map(LocalPath::counters) {
            c.add_to(stats);
        }
        if let Some(p) = self.port.as_ref() {
            let st = p.stats();
            stats.dpdk_rx_missed += st[2] + st[5];
            stats.dpdk_port_errors += st[3] + st[4];
        }
    }

    fn on_host(&self) -> bool {
        false
    }

    /// Another address answered for (ARP or neighbour discovery) and
    /// taken traffic for; announced at once.
    fn bind_local(&mut self, ip: IpAddr) -> io::Result<()> {
        if ip.is_multicast() || ip.is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("DPDK backend: {ip} cannot be a device address"),
            ));
        }
        if !self.ips.contains(&ip) {
            self.ips.push(ip);
            self.announce(ip);
            // The members reach this context at it too.
            if let Some(lp) = self.local_path.as_mut() {
                let slot = self.members.as_ref().map_or(0, Members::slot);
                let _ = lp.add_address(SocketAddr::new(ip, self.local.port()), slot);
            }
        }
        Ok(())
    }

    fn unbind_local(&mut self, ip: IpAddr) {
        if ip != self.ips[0] {
            self.ips.retain(|&x| x != ip);
            if let Some(lp) = self.local_path.as_mut() {
                lp.remove_address(ip);
            }
        }
    }

    /// RoCE datagrams to `group` are taken from now on (the port receives
    /// every multicast frame: see `shim.c`); multicast routers and
    /// snooping switches are told (an IGMPv3 or MLDv2 report, or the older
    /// version an older querier asks for; queries answered).
    fn join(&mut self, group: IpAddr) -> io::Result<()> {
        if !group.is_multicast() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("DPDK backend: {group} is not a multicast address"),
            ));
        }
        if !self.groups.contains(&group) {
            self.groups.push(group);
            self.report(group, Membership::Joined);
        }
        Ok(())
    }

    fn leave(&mut self, group: IpAddr) {
        if self.groups.contains(&group) {
            self.groups.retain(|&g| g != group);
            self.report(group, Membership::Left);
        }
    }

    /// None: a group's datagrams come through [`Backend::recv`], with the
    /// group as their destination.
    fn recv_group(&mut self, _buf: &mut [u8]) -> Option<(usize, SocketAddr, IpAddr)> {
        None
    }

    fn unreachable(&mut self, out: &mut Vec<SocketAddr>) {
        out.append(&mut self.gone);
    }
}

/// What one received frame turned out to be.
enum Step {
    Arp([u8; ARP_LEN], usize),
    /// An ICMP or ICMPv6 message, its frame copied into the receive
    /// buffer (its length).
    Icmp(usize),
    /// A UDP datagram to a port nothing listens on, likewise.
    ClosedPort(usize),
    Roce(Received, [u8; 6]),
    Other,
    Malformed,
    BadChecksum,
}
