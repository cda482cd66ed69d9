//! The control traffic a port with no kernel behind it must handle itself:
//! ARP and IPv6 neighbour discovery (answering for our addresses, asking
//! for peers'), ICMP and ICMPv6 echo (ping), and the ICMP errors that say a
//! port is closed (a peer's, read; ours, sent). Pure functions over frames:
//! what came, and the frame to send back, written into a buffer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use uroce_wire::arp::{ARP_LEN, ArpOp, ArpRepr, ETHERTYPE_ARP};
use uroce_wire::checksum;
use uroce_wire::eth::{ETH_HEADER_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, EthernetRepr};
use uroce_wire::ipv4::{IPPROTO_UDP, IPV4_HEADER_LEN, Ipv4Packet, Ipv4Repr};
use uroce_wire::ipv6::{IPV6_HEADER_LEN, Ipv6Packet, Ipv6Repr};
use uroce_wire::ndp::{self, IPPROTO_ICMPV6, NdpRepr};

/// IP protocol number of ICMP.
const IPPROTO_ICMP: u8 = 1;
/// IP protocol number of IGMP.
const IPPROTO_IGMP: u8 = 2;
/// IPv6 next header of a hop-by-hop options header (MLD comes behind one).
const NEXT_HOP_BY_HOP: u8 = 0;
/// The all-routers groups, where leaves go (IGMP, MLD).
const ALL_ROUTERS_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 2);
const ALL_ROUTERS_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
/// Where IGMPv3 and MLDv2 reports go (RFC 3376, RFC 3810): the groups of
/// the routers that speak them.
const ALL_V3_ROUTERS_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 22);
const ALL_V3_ROUTERS_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16);
/// ICMPv6 types of MLD (RFC 2710): query, report, done; MLDv2's report
/// (RFC 3810).
const MLD_QUERY: u8 = 130;
const MLD_REPORT: u8 = 131;
const MLD_DONE: u8 = 132;
const MLDV2_REPORT: u8 = 143;
/// IGMP message types: query, the v1, v2 and v3 reports, v2's leave.
const IGMP_QUERY: u8 = 0x11;
const IGMPV1_REPORT: u8 = 0x12;
const IGMPV2_REPORT: u8 = 0x16;
const IGMPV2_LEAVE: u8 = 0x17;
const IGMPV3_REPORT: u8 = 0x22;
/// How long a host speaks an older version after hearing an older
/// querier (RFC 3376 8.12 and RFC 3810 9.12, with the default robustness
/// 2, query interval 125 s and response interval 10 s).
const OLDER_QUERIER_PRESENT_NS: u64 = 260_000_000_000;

/// The version of the membership reports a host sends on one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum ReportVersion {
    /// IGMPv1 (RFC 1112): reports, no leave.
    V1,
    /// IGMPv2 (RFC 2236), or MLDv1 (RFC 2710) for IPv6.
    V2,
    /// IGMPv3 (RFC 3376), or MLDv2 (RFC 3810): what a host speaks until
    /// it hears an older querier, as Linux does.
    V3,
}

/// What a membership report says of its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Membership {
    /// Just joined (IGMPv3/MLDv2: a change to exclude nothing).
    Joined,
    /// Just left (IGMPv3/MLDv2: a change to include nothing).
    Left,
    /// Still joined, in answer to a query (IGMPv3/MLDv2: exclude mode).
    Current,
}

/// The report version of one family: the oldest querier heard within the
/// last `OLDER_QUERIER_PRESENT_NS` sets it (RFC 3376 7.2.1, RFC 3810 8.2.1).
#[derive(Debug, Default)]
pub(super) struct Compat {
    /// Until when (ns) a v1 querier, and a v2 one, counts as present.
    v1_until: u64,
    v2_until: u64,
}

impl Compat {
    /// A query of `version` came at `now_ns`.
    pub(super) fn heard(&mut self, version: ReportVersion, now_ns: u64) {
        let until = now_ns.saturating_add(OLDER_QUERIER_PRESENT_NS);
        match version {
            ReportVersion::V1 => self.v1_until = until,
            ReportVersion::V2 => self.v2_until = until,
            ReportVersion::V3 => {}
        }
    }

    /// The version to report in at `now_ns`.
    pub(super) fn version(&self, now_ns: u64) -> ReportVersion {
        if now_ns < self.v1_until {
            ReportVersion::V1
        } else if now_ns < self.v2_until {
            ReportVersion::V2
        } else {
            ReportVersion::V3
        }
    }
}
/// The all-nodes group, where unsolicited advertisements go.
pub(super) const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// What a received frame is (untagged frames only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Arp,
    /// A UDP datagram to the device's port (IPv4 or IPv6): RoCE.
    Roce,
    /// ICMP or IGMP (IPv4), ICMPv6 (with MLD).
    Icmp,
    /// A UDP datagram to another port: nothing listens there.
    ClosedPort,
    Other,
}

/// Tells what `f` is; `port`: the device's UDP port.
pub(super) fn classify(f: &[u8], port: u16) -> Kind {
    let Some(ethertype) = f.get(12..14).map(|t| u16::from_be_bytes([t[0], t[1]])) else {
        return Kind::Other;
    };
    let ip = &f[ETH_HEADER_LEN.min(f.len())..];
    let (proto, l4) = match ethertype {
        ETHERTYPE_ARP => return Kind::Arp,
        ETHERTYPE_IPV4 if ip.len() >= IPV4_HEADER_LEN => (ip[9], usize::from(ip[0] & 0xf) * 4),
        // MLD comes behind a hop-by-hop options header.
        ETHERTYPE_IPV6 if ip.len() >= IPV6_HEADER_LEN + 8 && ip[6] == NEXT_HOP_BY_HOP => {
            (ip[IPV6_HEADER_LEN], IPV6_HEADER_LEN)
        }
        ETHERTYPE_IPV6 if ip.len() >= IPV6_HEADER_LEN => (ip[6], IPV6_HEADER_LEN),
        _ => return Kind::Other,
    };
    match proto {
        IPPROTO_IGMP if ethertype == ETHERTYPE_IPV4 => Kind::Icmp,
        IPPROTO_UDP => {
            let to_port = ip.get(l4 + 2..l4 + 4).map(|p| u16::from_be_bytes([p[0], p[1]]));
            match to_port {
                Some(p) if p == port => Kind::Roce,
                Some(_) => Kind::ClosedPort,
                None => Kind::Other,
            }
        }
        IPPROTO_ICMP if ethertype == ETHERTYPE_IPV4 => Kind::Icmp,
        IPPROTO_ICMPV6 if ethertype == ETHERTYPE_IPV6 => Kind::Icmp,
        _ => Kind::Other,
    }
}

/// Writes an ARP frame from `mac` to `to`; its length.
pub(super) fn arp_frame(out: &mut [u8], mac: [u8; 6], to: [u8; 6], arp: &ArpRepr) -> Option<usize> {
    let eth = EthernetRepr { dst: to, src: mac, vlan_tci: None, ethertype: ETHERTYPE_ARP };
    let n = ETH_HEADER_LEN + ARP_LEN;
    eth.emit(out).ok()?;
    arp.emit(out.get_mut(ETH_HEADER_LEN..n)?).ok()?;
    Some(n)
}

/// Writes an IPv6 frame carrying the ICMPv6 message that `body` writes
/// (given the addresses, it returns the message's length; the checksum
/// is its to set); the frame's length.
fn icmpv6_frame(
    out: &mut [u8],
    (mac, to): ([u8; 6], [u8; 6]),
    (src, dst): (Ipv6Addr, Ipv6Addr),
    hop_limit: u8,
    body: impl FnOnce(&mut [u8]) -> Option<usize>,
) -> Option<usize> {
    let at = ETH_HEADER_LEN + IPV6_HEADER_LEN;
    let len = body(out.get_mut(at..)?)?;
    EthernetRepr { dst: to, src: mac, vlan_tci: None, ethertype: ETHERTYPE_IPV6 }.emit(out).ok()?;
    let ip = Ipv6Repr {
        src,
        dst,
        traffic_class: 0,
        flow_label: 0,
        next_header: IPPROTO_ICMPV6,
        hop_limit,
        payload_len: len,
    };
    ip.emit(&mut out[ETH_HEADER_LEN..]).ok()?;
    Some(at + len)
}

/// Writes an ICMP frame (IPv4) from `mac`/`src` to `to`/`dst`: `body`
/// writes the message after the headers and says its length; its
/// checksum is then computed over it. The frame's length.
fn icmp4_frame(
    out: &mut [u8],
    (mac, to): ([u8; 6], [u8; 6]),
    (src, dst): (Ipv4Addr, Ipv4Addr),
    tos: u8,
    body: impl FnOnce(&mut [u8]) -> Option<usize>,
) -> Option<usize> {
    let at = ETH_HEADER_LEN + IPV4_HEADER_LEN;
    let len = body(out.get_mut(at..)?)?;
    EthernetRepr { dst: to, src: mac, vlan_tci: None, ethertype: ETHERTYPE_IPV4 }.emit(out).ok()?;
    let ip = Ipv4Repr {
        src,
        dst,
        tos,
        ident: 0,
        dont_frag: false,
        ttl: 64,
        protocol: IPPROTO_ICMP,
        payload_len: len,
    };
    ip.emit(&mut out[ETH_HEADER_LEN..]).ok()?;
    let m = out.get_mut(at..at + len)?;
    m.get_mut(2..4)?.fill(0);
    let c = checksum::checksum(m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    Some(at + len)
}

/// Writes a neighbour solicitation or advertisement frame from `mac`/`src`
/// to `to`/`dst`; its length.
pub(super) fn ndp_frame(
    out: &mut [u8],
    macs: ([u8; 6], [u8; 6]),
    (src, dst): (Ipv6Addr, Ipv6Addr),
    msg: &NdpRepr,
) -> Option<usize> {
    icmpv6_frame(out, macs, (src, dst), ndp::NDP_HOP_LIMIT, |b| msg.emit(src, dst, b).ok())
}

/// The frame that asks for `ip`'s MAC, from `me` at `mac`: an ARP request
/// (broadcast) or a neighbour solicitation (to the solicited-node group).
pub(super) fn ask_frame(out: &mut [u8], mac: [u8; 6], me: IpAddr, ip: IpAddr) -> Option<usize> {
    match (me, ip) {
        (IpAddr::V4(me), IpAddr::V4(ip)) => {
            let arp = ArpRepr {
                op: ArpOp::Request,
                sender_mac: mac,
                sender_ip: me,
                target_mac: [0; 6],
                target_ip: ip,
            };
            arp_frame(out, mac, [0xff; 6], &arp)
        }
        (IpAddr::V6(me), IpAddr::V6(ip)) => {
            let group = ndp::solicited_node(ip);
            let to = ndp::multicast_mac(IpAddr::V6(group));
            let ns = NdpRepr::Solicit { target: ip, source_mac: Some(mac) };
            ndp_frame(out, (mac, to), (me, group), &ns)
        }
        _ => None,
    }
}

/// The frame that tells the link `me` is at `mac` (so that peers that knew
/// another MAC for it learn this one): a gratuitous ARP request, or an
/// unsolicited advertisement that overrides, to all nodes.
pub(super) fn announce_frame(out: &mut [u8], mac: [u8; 6], me: IpAddr) -> Option<usize> {
    match me {
        IpAddr::V4(_) => ask_frame(out, mac, me, me),
        IpAddr::V6(me) => {
            let na = NdpRepr::Advert {
                target: me,
                target_mac: Some(mac),
                solicited: false,
                overrides: true,
            };
            let to = ndp::multicast_mac(IpAddr::V6(ALL_NODES));
            ndp_frame(out, (mac, to), (me, ALL_NODES), &na)
        }
    }
}

/// What an ICMP or ICMPv6 frame (see [`classify`]) means to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Icmp {
    /// An echo request to `to`: [`echo_reply`] answers it.
    Echo { to: IpAddr },
    /// A neighbour discovery message from `from` (the IPv6 source) to `to`.
    Ndp { from: Ipv6Addr, to: Ipv6Addr, msg: NdpRepr },
    /// A peer's host says nothing listens at `dst` (port unreachable), about
    /// a datagram of ours from `src`.
    Unreachable { src: SocketAddr, dst: SocketAddr },
    /// A multicast router asks which groups are joined: all (`None`) or
    /// one (IGMP or MLD), in the query of `version`.
    Query { group: Option<IpAddr>, version: ReportVersion },
    /// Anything else, or a message that does not verify.
    Other,
}

/// The UDP ports of the datagram whose start an ICMP error quotes (`l4`:
/// from its UDP header on).
fn quoted_ports(l4: &[u8]) -> Option<(u16, u16)> {
    let p = l4.get(..4)?;
    Some((u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]])))
}

/// Reads an ICMP or ICMPv6 frame (checksums verified).
pub(super) fn icmp(f: &[u8]) -> Icmp {
    match f.get(12..14).map(|t| u16::from_be_bytes([t[0], t[1]])) {
        Some(ETHERTYPE_IPV4) => icmp4(&f[ETH_HEADER_LEN..]),
        Some(ETHERTYPE_IPV6) => icmp6(&f[ETH_HEADER_LEN..]),
        _ => Icmp::Other,
    }
}

fn icmp4(b: &[u8]) -> Icmp {
    let Ok(ip) = Ipv4Packet::new_checked(b) else { return Icmp::Other };
    let m = ip.payload();
    if ip.protocol() == IPPROTO_IGMP {
        return igmp(&ip);
    }
    if ip.protocol() != IPPROTO_ICMP
        || !ip.checksum_ok()
        || ip.more_frags()
        || ip.frag_offset() != 0
        || m.len() < 8
        || checksum::checksum(m) != 0
    {
        return Icmp::Other;
    }
    match (m[0], m[1]) {
        (8, 0) => Icmp::Echo { to: IpAddr::V4(ip.dst()) },
        // Destination unreachable, port unreachable: the datagram's IPv4
        // header and at least 8 bytes of it follow.
        (3, 3) => quoted4(&m[8..]),
        _ => Icmp::Other,
    }
}

/// The UDP datagram an ICMP error quotes: its IPv4 header and ports, read
/// by hand (the header's total length says more than the quote has: only
/// the datagram's start is quoted).
fn quoted4(q: &[u8]) -> Icmp {
    let Some(&v) = q.first() else { return Icmp::Other };
    let ihl = usize::from(v & 0xf) * 4;
    if v >> 4 != 4 || ihl < IPV4_HEADER_LEN || q.len() < ihl || q[9] != IPPROTO_UDP {
        return Icmp::Other;
    }
    let Some((sport, dport)) = quoted_ports(&q[ihl..]) else { return Icmp::Other };
    let src = Ipv4Addr::new(q[12], q[13], q[14], q[15]);
    let dst = Ipv4Addr::new(q[16], q[17], q[18], q[19]);
    Icmp::Unreachable {
        src: SocketAddr::new(IpAddr::V4(src), sport),
        dst: SocketAddr::new(IpAddr::V4(dst), dport),
    }
}

/// An IGMP query, its version told as RFC 3376 7.1 tells it: 8 bytes with
/// a zero maximum response time is v1, 8 bytes v2, 12 or more v3 (other
/// lengths are ignored); the IPv4 header's and the message's checksums
/// verified.
fn igmp(ip: &Ipv4Packet<&[u8]>) -> Icmp {
    let m = ip.payload();
    let version = match m.len() {
        8 if m.get(1) == Some(&0) => ReportVersion::V1,
        8 => ReportVersion::V2,
        12.. => ReportVersion::V3,
        _ => return Icmp::Other,
    };
    if !ip.checksum_ok() || m[0] != IGMP_QUERY || checksum::checksum(m) != 0 {
        return Icmp::Other;
    }
    let g = Ipv4Addr::new(m[4], m[5], m[6], m[7]);
    Icmp::Query { group: (!g.is_unspecified()).then_some(IpAddr::V4(g)), version }
}

/// An MLD query behind its hop-by-hop header `h` (the packet's payload),
/// from `from` to `to`: 24 bytes is MLDv1, 28 or more MLDv2 (RFC 3810
/// 8.1; other lengths are ignored).
fn mld_query(from: Ipv6Addr, to: Ipv6Addr, h: &[u8]) -> Icmp {
    let len = usize::from(h.get(1).copied().unwrap_or(0)) * 8 + 8;
    let Some(m) = h.get(len..) else { return Icmp::Other };
    let version = match m.len() {
        24 => ReportVersion::V2,
        28.. => ReportVersion::V3,
        _ => return Icmp::Other,
    };
    if h[0] != IPPROTO_ICMPV6 || m[0] != MLD_QUERY || m[1] != 0 {
        return Icmp::Other;
    }
    if ndp::icmpv6_checksum(from, to, m) != 0 {
        return Icmp::Other;
    }
    let mut g = [0u8; 16];
    g.copy_from_slice(&m[8..24]);
    let g = Ipv6Addr::from(g);
    Icmp::Query { group: (!g.is_unspecified()).then_some(IpAddr::V6(g)), version }
}

fn icmp6(b: &[u8]) -> Icmp {
    let Ok(ip) = Ipv6Packet::new_checked(b) else { return Icmp::Other };
    let m = ip.payload();
    let (from, to) = (ip.src(), ip.dst());
    if ip.next_header() == NEXT_HOP_BY_HOP {
        return mld_query(from, to, m);
    }
    if ip.next_header() != IPPROTO_ICMPV6 || m.len() < 8 {
        return Icmp::Other;
    }
    match m[0] {
        ndp::NEIGHBOR_SOLICIT | ndp::NEIGHBOR_ADVERT => {
            match NdpRepr::parse(from, to, ip.hop_limit(), m) {
                Ok(msg) => Icmp::Ndp { from, to, msg },
                Err(_) => Icmp::Other,
            }
        }
        _ if ndp::icmpv6_checksum(from, to, m) != 0 => Icmp::Other,
        ndp::ECHO_REQUEST if m[1] == 0 => Icmp::Echo { to: IpAddr::V6(to) },
        // Destination unreachable, port unreachable (4): the invoking
        // packet's IPv6 header and what of it fits follow.
        ICMPV6_UNREACHABLE if m[1] == 4 => {
            let q = &m[8..];
            if q.len() < IPV6_HEADER_LEN || q[6] != IPPROTO_UDP {
                return Icmp::Other;
            }
            let Some((sport, dport)) = quoted_ports(&q[IPV6_HEADER_LEN..]) else {
                return Icmp::Other;
            };
            let addr = |at: usize| {
                let mut o = [0u8; 16];
                o.copy_from_slice(&q[at..at + 16]);
                IpAddr::V6(Ipv6Addr::from(o))
            };
            Icmp::Unreachable {
                src: SocketAddr::new(addr(8), sport),
                dst: SocketAddr::new(addr(24), dport),
            }
        }
        _ => Icmp::Other,
    }
}

/// The IPv6 link-local address of `mac` (modified EUI-64, RFC 4291): the
/// source of MLD messages, which must come from one.
pub(super) fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    let [a, b, c, d, e, f] = mac;
    Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, a ^ 2, b, c, 0xff, 0xfe, d, e, f])
}

/// Writes the frame that tells multicast routers (and snooping switches)
/// from `mac` what `what` says of `group`, in the report `version`: from
/// `me`, IGMPv1 (no leave: `None`), IGMPv2 (a leave to all routers) or an
/// IGMPv3 report with one group record; from our link-local address,
/// MLDv1 (a done to all routers; `V1` is v1 too) or an MLDv2 report with
/// one record. Each with the router alert option and a hop limit of 1, as
/// Linux sends them. `None` when `me` is not of `group`'s family.
pub(super) fn membership_frame(
    out: &mut [u8],
    mac: [u8; 6],
    (me, group): (IpAddr, IpAddr),
    what: Membership,
    version: ReportVersion,
) -> Option<usize> {
    // IGMPv3 and MLDv2 record types (RFC 3376 4.2.12): MODE_IS_EXCLUDE,
    // CHANGE_TO_INCLUDE_MODE, CHANGE_TO_EXCLUDE_MODE, with no sources.
    let record = match what {
        Membership::Current => 2,
        Membership::Left => 3,
        Membership::Joined => 4,
    };
    let left = what == Membership::Left;
    match (me, group) {
        (IpAddr::V4(me), IpAddr::V4(g)) => {
            let (kind, dst, len) = match version {
                ReportVersion::V1 if left => return None,
                ReportVersion::V1 => (IGMPV1_REPORT, g, 8),
                ReportVersion::V2 if left => (IGMPV2_LEAVE, ALL_ROUTERS_V4, 8),
                ReportVersion::V2 => (IGMPV2_REPORT, g, 8),
                ReportVersion::V3 => (IGMPV3_REPORT, ALL_V3_ROUTERS_V4, 16),
            };
            let to = ndp::multicast_mac(IpAddr::V4(dst));
            let n = ETH_HEADER_LEN + 24 + len;
            let f = out.get_mut(..n)?;
            EthernetRepr { dst: to, src: mac, vlan_tci: None, ethertype: ETHERTYPE_IPV4 }
                .emit(f)
                .ok()?;
            // IPv4 with one option, router alert (RFC 2113): IHL 6, DF,
            // TTL 1; TOS 0xc0 (internetwork control), as Linux sends IGMP.
            let ip = &mut f[ETH_HEADER_LEN..];
            ip[..24].fill(0);
            (ip[0], ip[1], ip[6], ip[8], ip[9]) = (0x46, 0xc0, 0x40, 1, IPPROTO_IGMP);
            ip[2..4].copy_from_slice(&(24 + len as u16).to_be_bytes());
            ip[20..22].copy_from_slice(&[0x94, 0x04]);
            ip[12..16].copy_from_slice(&me.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            let c = checksum::checksum(&ip[..24]);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            let m = &mut ip[24..24 + len];
            m.fill(0);
            m[0] = kind;
            if version == ReportVersion::V3 {
                // One group record: its type, no auxiliary data or sources.
                m[7] = 1;
                m[8] = record;
                m[12..16].copy_from_slice(&g.octets());
            } else {
                m[4..8].copy_from_slice(&g.octets());
            }
            let c = checksum::checksum(m);
            m[2..4].copy_from_slice(&c.to_be_bytes());
            Some(n)
        }
        (IpAddr::V6(_), IpAddr::V6(g)) => {
            let src = link_local(mac);
            let (kind, dst, len) = match version {
                ReportVersion::V1 | ReportVersion::V2 if left => (MLD_DONE, ALL_ROUTERS_V6, 24),
                ReportVersion::V1 | ReportVersion::V2 => (MLD_REPORT, g, 24),
                ReportVersion::V3 => (MLDV2_REPORT, ALL_V3_ROUTERS_V6, 28),
            };
            let to = ndp::multicast_mac(IpAddr::V6(dst));
            let at = ETH_HEADER_LEN + IPV6_HEADER_LEN;
            let n = at + 8 + len;
            let f = out.get_mut(..n)?;
            EthernetRepr { dst: to, src: mac, vlan_tci: None, ethertype: ETHERTYPE_IPV6 }
                .emit(f)
                .ok()?;
            let ip = Ipv6Repr {
                src,
                dst,
                traffic_class: 0,
                flow_label: 0,
                next_header: NEXT_HOP_BY_HOP,
                hop_limit: 1,
                payload_len: 8 + len,
            };
            ip.emit(&mut f[ETH_HEADER_LEN..]).ok()?;
            // Hop-by-hop: next ICMPv6, 8 bytes, router alert (value 0:
            // MLD), then a PadN of no data.
            f[at..at + 8].copy_from_slice(&[IPPROTO_ICMPV6, 0, 5, 2, 0, 0, 1, 0]);
            let m = &mut f[at + 8..];
            m.fill(0);
            m[0] = kind;
            if version == ReportVersion::V3 {
                m[7] = 1;
                m[8] = record;
                m[12..28].copy_from_slice(&g.octets());
            } else {
                m[8..24].copy_from_slice(&g.octets());
            }
            ndp::set_icmpv6_checksum(src, dst, m);
            Some(n)
        }
        _ => None,
    }
}

/// Writes the echo reply to the echo request `f` (see [`icmp`]) from
/// `mac`; its length.
pub(super) fn echo_reply(f: &[u8], out: &mut [u8], mac: [u8; 6]) -> Option<usize> {
    let mut to = [0u8; 6];
    to.copy_from_slice(f.get(6..12)?);
    let ethertype = f.get(12..14)?;
    match u16::from_be_bytes([ethertype[0], ethertype[1]]) {
        ETHERTYPE_IPV4 => {
            let ip = Ipv4Packet::new_checked(&f[ETH_HEADER_LEN..]).ok()?;
            let m = ip.payload();
            icmp4_frame(out, (mac, to), (ip.dst(), ip.src()), ip.tos(), |b| {
                let r = b.get_mut(..m.len())?;
                r.copy_from_slice(m);
                r[0] = 0; // echo reply
                Some(m.len())
            })
        }
        ETHERTYPE_IPV6 => {
            let ip = Ipv6Packet::new_checked(&f[ETH_HEADER_LEN..]).ok()?;
            let m = ip.payload();
            let (src, dst) = (ip.dst(), ip.src());
            icmpv6_frame(out, (mac, to), (src, dst), 64, |b| {
                let r = b.get_mut(..m.len())?;
                r.copy_from_slice(m);
                r[0] = ndp::ECHO_REPLY;
                ndp::set_icmpv6_checksum(src, dst, r);
                Some(m.len())
            })
        }
        _ => None,
    }
}

/// The longest ICMP error (IPv4: RFC 1812's 576 bytes; IPv6: the minimum
/// MTU, RFC 4443), quote included.
const ERROR_MAX_V4: usize = 576;
const ERROR_MAX_V6: usize = 1280;

/// Writes the port unreachable error (ICMP type 3 code 3, ICMPv6 type 1
/// code 4) for the UDP datagram `f` (see [`Kind::ClosedPort`]) to one of
/// `ours`, from `mac`, quoting as much of the datagram as the error may
/// hold; its length. `None` (no error sent, as RFC 1122 and 4443 say) for
/// a datagram to another address (multicast and broadcast included), from
/// an address no error may go to (unspecified, multicast, broadcast,
/// loopback), or a fragment past the first.
pub(super) fn port_unreachable(
    f: &[u8],
    out: &mut [u8],
    mac: [u8; 6],
    ours: &[IpAddr],
) -> Option<usize> {
    let mut to = [0u8; 6];
    to.copy_from_slice(f.get(6..12)?);
    if to[0] & 1 != 0 {
        return None; // a multicast or broadcast sender's MAC: forged
    }
    let ethertype = f.get(12..14)?;
    match u16::from_be_bytes([ethertype[0], ethertype[1]]) {
        ETHERTYPE_IPV4 => {
            let ip = Ipv4Packet::new_checked(&f[ETH_HEADER_LEN..]).ok()?;
            let (src, dst) = (ip.src(), ip.dst());
            if !ours.contains(&IpAddr::V4(dst))
                || src.is_unspecified()
                || src.is_multicast()
                || src.is_broadcast()
                || src.is_loopback()
                || ip.frag_offset() != 0
                || !ip.checksum_ok()
            {
                return None;
            }
            let whole = f.get(ETH_HEADER_LEN..ETH_HEADER_LEN + ip.total_len())?;
            let quote = &whole[..whole.len().min(ERROR_MAX_V4 - IPV4_HEADER_LEN - 8)];
            icmp4_frame(out, (mac, to), (dst, src), 0, |b| {
                let r = b.get_mut(..8 + quote.len())?;
                r[..8].copy_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
                r[8..].copy_from_slice(quote);
                Some(r.len())
            })
        }
        ETHERTYPE_IPV6 => {
            let ip = Ipv6Packet::new_checked(&f[ETH_HEADER_LEN..]).ok()?;
            let (src, dst) = (ip.src(), ip.dst());
            if !ours.contains(&IpAddr::V6(dst))
                || src.is_unspecified()
                || src.is_multicast()
                || src.is_loopback()
            {
                return None;
            }
            let whole =
                f.get(ETH_HEADER_LEN..ETH_HEADER_LEN + IPV6_HEADER_LEN + ip.payload_len())?;
            let quote = &whole[..whole.len().min(ERROR_MAX_V6 - IPV6_HEADER_LEN - 8)];
            icmpv6_frame(out, (mac, to), (dst, src), 64, |b| {
                let r = b.get_mut(..8 + quote.len())?;
                r[..8].copy_from_slice(&[ICMPV6_UNREACHABLE, 4, 0, 0, 0, 0, 0, 0]);
                r[8..].copy_from_slice(quote);
                ndp::set_icmpv6_checksum(dst, src, r);
                Some(r.len())
            })
        }
        _ => None,
    }
}

/// ICMPv6 destination unreachable (RFC 4443).
const ICMPV6_UNREACHABLE: u8 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn roce_frames_are_told_from_other_traffic() {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[14 + 22..14 + 24].copy_from_slice(&4791u16.to_be_bytes());
        assert_eq!(classify(&f, 4791), Kind::Roce);
        assert_eq!(classify(&f, 4792), Kind::ClosedPort);
        f[14 + 9] = 6; // TCP
        assert_eq!(classify(&f, 4791), Kind::Other);
        f[14 + 9] = 1;
        assert_eq!(classify(&f, 4791), Kind::Icmp);
        assert_eq!(classify(&f[..20], 4791), Kind::Other);
        assert_eq!(classify(&f[..5], 4791), Kind::Other);
        let mut g = vec![0u8; 14 + 40 + 8];
        g[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        g[14 + 6] = 17;
        g[14 + 42..14 + 44].copy_from_slice(&4791u16.to_be_bytes());
        assert_eq!(classify(&g, 4791), Kind::Roce);
        g[14 + 6] = 58;
        assert_eq!(classify(&g, 4791), Kind::Icmp);
    }

    /// A solicitation we send is one a peer takes, and the advertisement
    /// it answers with is one we take.
    #[test]
    fn neighbour_discovery_frames_parse_back() {
        let (me, peer) = (v6("fd31::2"), v6("fd31::1"));
        let mut out = [0u8; 256];
        let n = ask_frame(&mut out, MAC_B, IpAddr::V6(me), IpAddr::V6(peer)).unwrap();
        assert_eq!(out[..6], [0x33, 0x33, 0xff, 0, 0, 1]);
        assert_eq!(classify(&out[..n], 4791), Kind::Icmp);
        assert_eq!(
            icmp(&out[..n]),
            Icmp::Ndp {
                from: me,
                to: ndp::solicited_node(peer),
                msg: NdpRepr::Solicit { target: peer, source_mac: Some(MAC_B) }
            }
        );
        let n = announce_frame(&mut out, MAC_B, IpAddr::V6(me)).unwrap();
        let Icmp::Ndp { to, msg, .. } = icmp(&out[..n]) else { panic!("{:?}", icmp(&out[..n])) };
        assert_eq!(to, ALL_NODES);
        assert!(matches!(msg, NdpRepr::Advert { overrides: true, solicited: false, .. }));
        // ARP: a request for the peer, and the announcement of ourselves.
        let n =
            ask_frame(&mut out, MAC_A, "10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())
                .unwrap();
        assert_eq!((n, classify(&out[..n], 4791)), (42, Kind::Arp));
        assert_eq!(ArpRepr::parse(&out[14..n]).unwrap().op, ArpOp::Request);
    }

    /// Echo requests (IPv4 and IPv6) get a reply the other side's checks
    /// take; a request with a wrong checksum is not one.
    #[test]
    fn pings_are_answered() {
        for (a, b) in [("10.0.0.1", "10.0.0.2"), ("fd31::1", "fd31::2")] {
            let (a, b): (IpAddr, IpAddr) = (a.parse().unwrap(), b.parse().unwrap());
            let mut req = [0u8; 256];
            let n = build_echo(&mut req, (a, b), 8, 128);
            assert_eq!(icmp(&req[..n]), Icmp::Echo { to: b });
            let mut out = [0u8; 256];
            let m = echo_reply(&req[..n], &mut out, MAC_B).unwrap();
            assert_eq!((m, out[..6] == MAC_A), (n, true));
            assert_eq!(icmp(&out[..m]), Icmp::Other, "a reply is no request");
            let at = m - 20;
            assert_eq!(out[at..m], req[at..n], "the data comes back");
            let ty = if a.is_ipv4() { 0 } else { 129 };
            let icmp_at = if a.is_ipv4() { 34 } else { 54 };
            assert_eq!(out[icmp_at], ty);
            // The reply verifies: flip it into a request and parse it.
            out[icmp_at] = if a.is_ipv4() { 8 } else { 128 };
            let sum_off = icmp_at + 2;
            let old = u16::from_be_bytes([out[sum_off], out[sum_off + 1]]);
            let fixed = fix_sum(old, u16::from(ty) << 8, u16::from(out[icmp_at]) << 8);
            out[sum_off..sum_off + 2].copy_from_slice(&fixed.to_be_bytes());
            assert_eq!(icmp(&out[..m]), Icmp::Echo { to: a });
            req[n - 1] ^= 1;
            assert_eq!(icmp(&req[..n]), Icmp::Other, "a damaged request");
        }
    }

    /// One's-complement update of a checksum for a changed 16-bit word.
    fn fix_sum(sum: u16, old: u16, new: u16) -> u16 {
        let acc = u32::from(!sum) + u32::from(!old) + u32::from(new);
        checksum::finish(acc)
    }

    /// An echo request `a` → `b` (ICMP type `ty4` or `ty6`), 28 bytes, from
    /// `MAC_A` to `MAC_B`.
    fn build_echo(f: &mut [u8], (a, b): (IpAddr, IpAddr), ty4: u8, ty6: u8) -> usize {
        f[..6].copy_from_slice(&MAC_B);
        f[6..12].copy_from_slice(&MAC_A);
        let data: Vec<u8> = (0..28u8).collect();
        match (a, b) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
                let ip = Ipv4Repr {
                    src: s,
                    dst: d,
                    tos: 0,
                    ident: 1,
                    dont_frag: true,
                    ttl: 64,
                    protocol: IPPROTO_ICMP,
                    payload_len: 28,
                };
                ip.emit(&mut f[14..]).unwrap();
                let m = &mut f[34..62];
                m.copy_from_slice(&data);
                m[0] = ty4;
                m[1] = 0;
                m[2..4].fill(0);
                let c = checksum::checksum(m);
                m[2..4].copy_from_slice(&c.to_be_bytes());
                62
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => icmpv6_frame(f, (MAC_A, MAC_B), (s, d), 64, |m| {
                m[..28].copy_from_slice(&data);
                m[0] = ty6;
                m[1] = 0;
                ndp::set_icmpv6_checksum(s, d, &mut m[..28]);
                Some(28)
            })
            .unwrap(),
            _ => unreachable!(),
        }
    }

    /// A UDP datagram of `len` payload bytes from `from` (MAC A) to `to`
    /// (MAC B), as a peer's kernel sends it.
    fn udp_frame(from: SocketAddr, to: SocketAddr, len: usize) -> Vec<u8> {
        let path =
            crate::backend::frame::Path { src_mac: MAC_A, dst_mac: MAC_B, src: from, dst: to };
        let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut f = vec![0u8; len + 100];
        let n = crate::backend::frame::build(&mut f, &path, &payload, 7, 0).unwrap();
        f.truncate(n);
        f
    }

    /// A datagram to a closed port of ours gets a port unreachable error
    /// that quotes it (a peer's host reads it as we read theirs: the
    /// same parser), at most 576 bytes over IPv4 and 1280 over IPv6; none
    /// for a datagram to another address, from a multicast or unspecified
    /// source, or for a later fragment.
    #[test]
    fn closed_ports_answer_port_unreachable() {
        for (me, peer) in [("10.0.0.2", "10.0.0.1"), ("fd31::2", "fd31::1")] {
            let (me, peer): (IpAddr, IpAddr) = (me.parse().unwrap(), peer.parse().unwrap());
            let (to, from) = (SocketAddr::new(me, 9), SocketAddr::new(peer, 40000));
            let f = udp_frame(from, to, 100);
            assert_eq!(classify(&f, 4791), Kind::ClosedPort);
            let mut out = [0u8; 2048];
            let n = port_unreachable(&f, &mut out, MAC_B, &[me]).unwrap();
            assert_eq!(
                (&out[..6], &out[6..12]),
                (&MAC_A[..], &MAC_B[..]),
                "back to the sender's MAC"
            );
            assert_eq!(icmp(&out[..n]), Icmp::Unreachable { src: from, dst: to });
            // A long datagram is quoted in part.
            let long = udp_frame(from, to, 3000);
            let n = port_unreachable(&long, &mut out, MAC_B, &[me]).unwrap();
            assert_eq!(n - 14, if me.is_ipv4() { 576 } else { 1280 });
            assert_eq!(icmp(&out[..n]), Icmp::Unreachable { src: from, dst: to });
            // Not ours, or not to be answered.
            assert_eq!(port_unreachable(&f, &mut out, MAC_B, &[peer]), None, "another address");
            let bogus: IpAddr = if me.is_ipv4() { "224.0.0.9" } else { "ff02::9" }.parse().unwrap();
            let from_group = udp_frame(SocketAddr::new(bogus, 5), to, 10);
            assert_eq!(port_unreachable(&from_group, &mut out, MAC_B, &[me]), None, "multicast");
            let mut odd_mac = f.clone();
            odd_mac[6] |= 1;
            assert_eq!(port_unreachable(&odd_mac, &mut out, MAC_B, &[me]), None, "group MAC");
            if me.is_ipv4() {
                let mut frag = f.clone();
                frag[14 + 7] = 1; // fragment offset 8
                let c = checksum::checksum(&{
                    let mut h = frag[14..34].to_vec();
                    h[10..12].fill(0);
                    h
                });
                frag[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
                assert_eq!(
                    port_unreachable(&frag, &mut out, MAC_B, &[me]),
                    None,
                    "a later fragment"
                );
            }
            // Truncated frames: no panic, no error sent.
            for cut in 0..f.len() {
                let _ = port_unreachable(&f[..cut], &mut out, MAC_B, &[me]);
            }
        }
    }

    /// Membership reports and leaves of every version verify as a router
    /// checks them: header and message checksums, router alert, hop limit
    /// 1, the link-local source for MLD, the destination each version
    /// names; routers' queries are read back with their version.
    #[test]
    fn membership_reports_verify_and_queries_are_read() {
        use Membership::{Current, Joined, Left};
        use ReportVersion::{V1, V2, V3};
        let me4: IpAddr = "10.0.0.1".parse().unwrap();
        let me6: IpAddr = "fd31::1".parse().unwrap();
        let g4: IpAddr = "239.255.77.1".parse().unwrap();
        let g6: IpAddr = "ff0e::77".parse().unwrap();
        let mut out = [0u8; 256];
        for version in [V1, V2, V3] {
            for what in [Joined, Left, Current] {
                let frame = membership_frame(&mut out, MAC_A, (me4, g4), what, version);
                let Some(n) = frame else {
                    assert_eq!((version, what), (V1, Left), "IGMPv1 alone has no leave");
                    continue;
                };
                let ip = Ipv4Packet::new_checked(&out[ETH_HEADER_LEN..n]).unwrap();
                assert!(ip.checksum_ok());
                assert_eq!((ip.header_len(), ip.ttl(), ip.protocol()), (24, 1, IPPROTO_IGMP));
                assert_eq!(&out[ETH_HEADER_LEN + 20..ETH_HEADER_LEN + 22], &[0x94, 0x04]);
                let m = ip.payload();
                assert_eq!(checksum::checksum(m), 0);
                let (kind, to) = match (version, what) {
                    (V1, _) => (IGMPV1_REPORT, g4),
                    (V2, Left) => (IGMPV2_LEAVE, IpAddr::V4(ALL_ROUTERS_V4)),
                    (V2, _) => (IGMPV2_REPORT, g4),
                    (V3, _) => (IGMPV3_REPORT, IpAddr::V4(ALL_V3_ROUTERS_V4)),
                };
                assert_eq!((IpAddr::V4(ip.dst()), out[..6] == ndp::multicast_mac(to)), (to, true));
                assert_eq!(m[0], kind);
                if version == V3 {
                    // One record, of the type `what` says, for the group.
                    let record = [Joined, Left, Current].iter().position(|w| *w == what);
                    assert_eq!(
                        (m.len(), &m[6..8], m[8]),
                        (16, &[0, 1][..], [4, 3, 2][record.unwrap()])
                    );
                    assert_eq!(&m[9..12], &[0, 0, 0], "no auxiliary data, no sources");
                    assert_eq!(&m[12..16], &[239, 255, 77, 1]);
                } else {
                    assert_eq!((m.len(), &m[4..8]), (8, &[239, 255, 77, 1][..]));
                }
                assert_eq!(classify(&out[..n], 4791), Kind::Icmp);
                assert_eq!(icmp(&out[..n]), Icmp::Other, "a report is no query");
                let n = membership_frame(&mut out, MAC_A, (me6, g6), what, version).unwrap();
                let ip = Ipv6Packet::new_checked(&out[ETH_HEADER_LEN..n]).unwrap();
                assert_eq!((ip.next_header(), ip.hop_limit()), (NEXT_HOP_BY_HOP, 1));
                assert_eq!(ip.src(), v6("fe80::ff:fe00:1"), "link-local of 02:00:00:00:00:01");
                let m = &ip.payload()[8..];
                let (kind, to) = match (version, what) {
                    (V3, _) => (MLDV2_REPORT, ALL_V3_ROUTERS_V6),
                    (_, Left) => (MLD_DONE, ALL_ROUTERS_V6),
                    _ => (MLD_REPORT, v6("ff0e::77")),
                };
                assert_eq!((m[0], ip.dst()), (kind, to));
                assert_eq!(out[..6], ndp::multicast_mac(IpAddr::V6(to)));
                if version == V3 {
                    assert_eq!(
                        (m.len(), &m[6..8], &m[12..28]),
                        (28, &[0, 1][..], &v6("ff0e::77").octets()[..])
                    );
                } else {
                    assert_eq!((m.len(), &m[8..24]), (24, &v6("ff0e::77").octets()[..]));
                }
                assert_eq!(ndp::icmpv6_checksum(ip.src(), ip.dst(), m), 0);
                assert_eq!(classify(&out[..n], 4791), Kind::Icmp);
            }
        }
        assert!(
            membership_frame(&mut out, MAC_A, (me4, g6), Joined, V3).is_none(),
            "families differ"
        );
        // Queries, each of its version by its length: IGMPv1 (no maximum
        // response time), v2, v3 (12 bytes and more); MLDv1, MLDv2 (28
        // bytes and more); damaged ones and odd lengths are no queries.
        let igmp_query = |len: usize, max_resp: u8, group: [u8; 4]| {
            let mut f = vec![0u8; ETH_HEADER_LEN + 20 + len];
            f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            let ip = Ipv4Repr {
                src: Ipv4Addr::new(10, 0, 0, 9),
                dst: Ipv4Addr::new(224, 0, 0, 1),
                tos: 0xc0,
                ident: 0,
                dont_frag: false,
                ttl: 1,
                protocol: IPPROTO_IGMP,
                payload_len: len,
            };
            ip.emit(&mut f[ETH_HEADER_LEN..]).unwrap();
            let m = &mut f[ETH_HEADER_LEN + 20..];
            (m[0], m[1]) = (IGMP_QUERY, max_resp);
            m[4..8].copy_from_slice(&group);
            let c = checksum::checksum(m);
            m[2..4].copy_from_slice(&c.to_be_bytes());
            f
        };
        assert_eq!(icmp(&igmp_query(8, 0, [0; 4])), Icmp::Query { group: None, version: V1 });
        assert_eq!(icmp(&igmp_query(8, 100, [0; 4])), Icmp::Query { group: None, version: V2 });
        let q = igmp_query(12, 100, [239, 255, 77, 1]);
        assert_eq!(icmp(&q), Icmp::Query { group: Some(g4), version: V3 });
        assert_eq!(icmp(&igmp_query(10, 100, [0; 4])), Icmp::Other, "9 to 11 bytes: ignored");
        let mut bad = q.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(icmp(&bad), Icmp::Other);
        let mld_query = |len: usize| {
            let mut f = vec![0u8; 256];
            let (src, dst) = (v6("fe80::9"), v6("ff02::1"));
            let n = icmpv6_frame(&mut f, (MAC_B, MAC_A), (src, dst), 1, |b| {
                b[..8].copy_from_slice(&[IPPROTO_ICMPV6, 0, 5, 2, 0, 0, 1, 0]);
                let m = &mut b[8..8 + len];
                m.fill(0);
                m[0] = MLD_QUERY;
                m[8..24].copy_from_slice(&v6("ff0e::77").octets());
                ndp::set_icmpv6_checksum(src, dst, m);
                Some(8 + len)
            })
            .unwrap();
            f[ETH_HEADER_LEN + 6] = NEXT_HOP_BY_HOP;
            f.truncate(n);
            f
        };
        assert_eq!(icmp(&mld_query(24)), Icmp::Query { group: Some(g6), version: V2 });
        assert_eq!(icmp(&mld_query(28)), Icmp::Query { group: Some(g6), version: V3 });
        assert_eq!(icmp(&mld_query(26)), Icmp::Other, "25 to 27 bytes: ignored");
        let mut bad = mld_query(28);
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(icmp(&bad), Icmp::Other);
    }

    /// A host reports in v3 (IGMPv3, MLDv2) until it hears an older
    /// querier, then in the oldest version heard for 260 s after the last
    /// such query.
    #[test]
    fn reports_follow_the_oldest_querier_heard() {
        use ReportVersion::{V1, V2, V3};
        let s = 1_000_000_000u64;
        let mut c = Compat::default();
        assert_eq!(c.version(0), V3);
        c.heard(V3, 5 * s);
        assert_eq!(c.version(5 * s), V3);
        c.heard(V2, 10 * s);
        assert_eq!((c.version(10 * s), c.version(269 * s)), (V2, V2));
        c.heard(V1, 20 * s);
        assert_eq!((c.version(21 * s), c.version(279 * s)), (V1, V1));
        assert_eq!(c.version(280 * s), V3, "both older queriers timed out");
        c.heard(V2, 300 * s);
        c.heard(V2, 400 * s);
        assert_eq!((c.version(659 * s), c.version(660 * s)), (V2, V3), "260 s after the last");
    }

    /// Wireshark's dissectors (tshark, which the test command installs)
    /// take every control frame we build: checksums good, nothing
    /// malformed, each message what it should be.
    #[test]
    fn tshark_dissects_our_control_frames() {
        use std::process::Command;
        if Command::new("tshark").arg("-v").output().is_err() {
            assert!(std::env::var_os("CI").is_none(), "tshark is required under CI");
            eprintln!("tshark not installed: skipped");
            return;
        }
        let (a4, b4): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (a6, b6): (IpAddr, IpAddr) = ("fd31::1".parse().unwrap(), "fd31::2".parse().unwrap());
        let mut frames: Vec<Vec<u8>> = Vec::new();
        let mut add = |build: &dyn Fn(&mut [u8]) -> Option<usize>| {
            let mut out = [0u8; 512];
            let n = build(&mut out).unwrap();
            frames.push(out[..n].to_vec());
        };
        add(&|o| ask_frame(o, MAC_A, a4, b4));
        add(&|o| ask_frame(o, MAC_A, a6, b6));
        add(&|o| announce_frame(o, MAC_A, a6));
        let mut igmp_frames = 0;
        for (me, g) in [(a4, "239.255.77.1"), (a6, "ff0e::77")] {
            for version in [ReportVersion::V1, ReportVersion::V2, ReportVersion::V3] {
                for what in [Membership::Joined, Membership::Left, Membership::Current] {
                    let g = g.parse().unwrap();
                    if membership_frame(&mut [0; 512], MAC_A, (me, g), what, version).is_some() {
                        add(&|o| membership_frame(o, MAC_A, (me, g), what, version));
                        igmp_frames += usize::from(me.is_ipv4());
                    }
                }
            }
        }
        for (a, b) in [(a4, b4), (a6, b6)] {
            let mut req = [0u8; 256];
            let n = build_echo(&mut req, (a, b), 8, 128);
            add(&|o| echo_reply(&req[..n], o, MAC_B));
            let dgram = udp_frame(SocketAddr::new(a, 40000), SocketAddr::new(b, 9), 40);
            add(&|o| port_unreachable(&dgram, o, MAC_B, &[b]));
        }
        // A pcap file (version 2.4, Ethernet) of them.
        let mut pcap = Vec::new();
        pcap.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        pcap.extend_from_slice(&[2, 0, 4, 0]);
        for w in [0u32, 0, 65535, 1] {
            pcap.extend_from_slice(&w.to_le_bytes());
        }
        for f in &frames {
            for w in [0u32, 0, f.len() as u32, f.len() as u32] {
                pcap.extend_from_slice(&w.to_le_bytes());
            }
            pcap.extend_from_slice(f);
        }
        let path = std::env::temp_dir().join(format!("uroce-dpdk-ctl-{}.pcap", std::process::id()));
        std::fs::write(&path, &pcap).unwrap();
        let out = Command::new("tshark")
            .args(["-n", "-V", "-o", "ip.check_checksum:TRUE", "-r"])
            .arg(&path)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&path);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for bad in ["Malformed", "[Bad", "Bad]", "incorrect", "Checksum Status: Bad"] {
            assert!(!text.contains(bad), "{bad}: {text}");
        }
        for want in [
            "Neighbor Solicitation",
            "Neighbor Advertisement",
            "Membership Report",
            "Leave Group",
            "Multicast Listener Report",
            "Multicast Listener Done",
            "Multicast Listener Report Message v2",
            "Change To Exclude Mode",
            "Change To Include Mode",
            "Mode Is Exclude",
            "Router Alert",
            "Echo (ping) reply",
            "Port unreachable",
        ] {
            assert!(text.contains(want), "no {want}: {text}");
        }
        // Every message's checksum (the ARP request has none), and the
        // IPv4 headers' (the IGMP frames, the echo reply, the port
        // unreachable and the header it quotes).
        assert_eq!(text.matches("[Checksum Status: Good]").count(), frames.len() - 1, "{text}");
        let headers = text.matches("[Header checksum status: Good]").count();
        assert_eq!(headers, igmp_frames + 3, "{text}");
    }

    /// Port unreachable, as Linux sends it (the quoted datagram's IP header
    /// and 8 bytes of it, IPv4; as much as fits, IPv6), names the
    /// destination; a quote of TCP does not.
    #[test]
    fn port_unreachable_names_the_destination() {
        let me: SocketAddr = "10.0.0.1:4791".parse().unwrap();
        let peer: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let (IpAddr::V4(s), IpAddr::V4(d)) = (me.ip(), peer.ip()) else { unreachable!() };
        let mut f = vec![0u8; 14 + 20 + 8 + 20 + 8];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let outer = Ipv4Repr {
            src: d,
            dst: s,
            tos: 0xc0,
            ident: 0,
            dont_frag: false,
            ttl: 64,
            protocol: IPPROTO_ICMP,
            payload_len: 36,
        };
        outer.emit(&mut f[14..]).unwrap();
        // The quoted datagram was 100 bytes long; only its start is here.
        let quoted = Ipv4Repr {
            src: s,
            dst: d,
            tos: 0,
            ident: 5,
            dont_frag: true,
            ttl: 64,
            protocol: IPPROTO_UDP,
            payload_len: 80,
        };
        quoted.emit(&mut f[42..]).unwrap();
        f[62..64].copy_from_slice(&4791u16.to_be_bytes());
        f[64..66].copy_from_slice(&4791u16.to_be_bytes());
        f[34] = 3;
        f[35] = 3;
        let c = checksum::checksum(&f[34..]);
        f[36..38].copy_from_slice(&c.to_be_bytes());
        assert_eq!(icmp(&f), Icmp::Unreachable { src: me, dst: peer });
        f[42 + 9] = 6;
        f[36..38].fill(0);
        let c = checksum::checksum(&f[34..]);
        f[36..38].copy_from_slice(&c.to_be_bytes());
        assert_eq!(icmp(&f), Icmp::Other, "TCP");
        // IPv6.
        let (a, b) = (v6("fd31::1"), v6("fd31::2"));
        let mut g = [0u8; 256];
        let n = icmpv6_frame(&mut g, (MAC_B, MAC_A), (b, a), 64, |m| {
            m[..8].copy_from_slice(&[1, 4, 0, 0, 0, 0, 0, 0]);
            let inner = Ipv6Repr {
                src: a,
                dst: b,
                traffic_class: 0,
                flow_label: 0,
                next_header: IPPROTO_UDP,
                hop_limit: 64,
                payload_len: 60,
            };
            inner.emit(&mut m[8..]).unwrap();
            m[48..50].copy_from_slice(&4791u16.to_be_bytes());
            m[50..52].copy_from_slice(&4792u16.to_be_bytes());
            ndp::set_icmpv6_checksum(b, a, &mut m[..56]);
            Some(56)
        })
        .unwrap();
        assert_eq!(
            icmp(&g[..n]),
            Icmp::Unreachable {
                src: SocketAddr::new(IpAddr::V6(a), 4791),
                dst: SocketAddr::new(IpAddr::V6(b), 4792)
            }
        );
    }
}
