//! Ethernet frames around RoCEv2 datagrams, built and parsed with the wire
//! crate's headers: what the kernel's UDP stack does for the `udp`
//! backend, done here for the backends that own their frames (AF_XDP, DPDK).
//!
//! On transmit: IPv4 with DF, TTL 64 and the identification the driver
//! computed the ICRC over, UDP checksum 0 (RoCEv2's ICRC is the integrity
//! check; rxe sends 0 too); IPv6 with a full UDP checksum, as IPv6 asks.
//! On receive the UDP checksum is checked as the kernel checks it, with
//! one form more: zero (IPv4: none sent, as RoCEv2 senders do) or a sum
//! that verifies, or the folded pseudo-header sum that a kernel sender on
//! veth leaves for an offload that never comes (`CHECKSUM_PARTIAL`:
//! `../shared/bypass` found nearly every such frame "bad" otherwise). Any
//! other value is a frame damaged or forged on the way: dropped, counted.
//! The ICRC covers the datagram in any case.

use std::net::{IpAddr, SocketAddr};

use uroce_wire::checksum;
use uroce_wire::eth::{
    ETH_HEADER_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, EthernetFrame, EthernetRepr,
};
use uroce_wire::ipv4::{IPPROTO_UDP, IPV4_HEADER_LEN, Ipv4Packet, Ipv4Repr};
use uroce_wire::ipv6::{IPV6_HEADER_LEN, Ipv6Packet, Ipv6Repr};
use uroce_wire::udp::{UDP_HEADER_LEN, UdpPacket, UdpRepr};

/// Where a frame goes: MACs, addresses and ports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Path {
    pub(crate) src_mac: [u8; 6],
    pub(crate) dst_mac: [u8; 6],
    pub(crate) src: SocketAddr,
    pub(crate) dst: SocketAddr,
}

/// Header bytes before the UDP payload.
pub(crate) fn overhead(v4: bool) -> usize {
    ETH_HEADER_LEN + if v4 { IPV4_HEADER_LEN } else { IPV6_HEADER_LEN } + UDP_HEADER_LEN
}

/// Writes the frame carrying `payload` into `buf`; its length, or `None`
/// when it does not fit or the two addresses' families differ.
pub(crate) fn build(
    buf: &mut [u8],
    p: &Path,
    payload: &[u8],
    ident: u16,
    tos: u8,
) -> Option<usize> {
    let v4 = match (p.src.ip(), p.dst.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => true,
        (IpAddr::V6(_), IpAddr::V6(_)) => false,
        _ => return None,
    };
    let head = overhead(v4);
    let total = head + payload.len();
    if buf.len() < total {
        return None;
    }
    let ethertype = if v4 { ETHERTYPE_IPV4 } else { ETHERTYPE_IPV6 };
    EthernetRepr { dst: p.dst_mac, src: p.src_mac, vlan_tci: None, ethertype }.emit(buf).ok()?;
    let udp_len = UDP_HEADER_LEN + payload.len();
    let ip_at = ETH_HEADER_LEN;
    let udp_at = head - UDP_HEADER_LEN;
    let mut udp = UdpRepr {
        src_port: p.src.port(),
        dst_port: p.dst.port(),
        payload_len: payload.len(),
        checksum: 0,
    };
    match (p.src.ip(), p.dst.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            Ipv4Repr {
                src,
                dst,
                tos,
                ident,
                dont_frag: true,
                ttl: 64,
                protocol: IPPROTO_UDP,
                payload_len: udp_len,
            }
            .emit(&mut buf[ip_at..])
            .ok()?;
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            Ipv6Repr {
                src,
                dst,
                traffic_class: tos,
                flow_label: 0,
                next_header: IPPROTO_UDP,
                hop_limit: 64,
                payload_len: udp_len,
            }
            .emit(&mut buf[ip_at..])
            .ok()?;
            // The pseudo-header (addresses, length, next header), then the
            // UDP header with a zero checksum, then the payload.
            let mut acc = checksum::sum(&src.octets(), 0);
            acc = checksum::sum(&dst.octets(), acc);
            acc += udp_len as u32 + u32::from(IPPROTO_UDP);
            acc = checksum::sum(&udp.to_bytes().ok()?, acc);
            acc = checksum::sum(payload, acc);
            udp.checksum = match checksum::finish(acc) {
                0 => 0xffff,
                c => c,
            };
        }
        _ => return None,
    }
    udp.emit(&mut buf[udp_at..]).ok()?;
    buf[head..total].copy_from_slice(payload);
    Some(total)
}

/// A received RoCEv2 datagram inside a frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Parsed<'a> {
    pub(crate) from: SocketAddr,
    pub(crate) to: IpAddr,
    /// IPv4 identification (0 for IPv6).
    pub(crate) ip_id: u16,
    pub(crate) payload: &'a [u8],
}

/// Why a frame was not taken (each counted apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not a whole UDP datagram to the device's port: truncated, lengths
    /// that disagree, a fragment, another protocol or port.
    Malformed,
    /// An IPv4 header or UDP checksum that does not verify.
    BadChecksum,
}

/// The UDP datagram to `port` in `frame`, if it is one: IPv4 (header
/// checksum verified, not a fragment) or IPv6 (no extension headers),
/// with a UDP checksum as the module's notes say.
pub(crate) fn parse(frame: &[u8], port: u16) -> Result<Parsed<'_>, Refused> {
    use Refused::{BadChecksum, Malformed};
    let eth = EthernetFrame::new_checked(frame).map_err(|_| Malformed)?;
    let at = eth.header_len();
    // (sender, receiver, IP ID, where the UDP header starts and ends)
    let (from_ip, to, ip_id, l4) = match eth.ethertype() {
        ETHERTYPE_IPV4 => {
            let ip = Ipv4Packet::new_checked(eth.payload()).map_err(|_| Malformed)?;
            if ip.more_frags() || ip.frag_offset() != 0 || ip.protocol() != IPPROTO_UDP {
                return Err(Malformed);
            }
            if !ip.checksum_ok() {
                return Err(BadChecksum);
            }
            let l4 = at + ip.header_len()..at + ip.total_len();
            (IpAddr::V4(ip.src()), IpAddr::V4(ip.dst()), ip.ident(), l4)
        }
        ETHERTYPE_IPV6 => {
            let ip = Ipv6Packet::new_checked(eth.payload()).map_err(|_| Malformed)?;
            if ip.next_header() != IPPROTO_UDP {
                return Err(Malformed);
            }
            let l4 = at + IPV6_HEADER_LEN..at + IPV6_HEADER_LEN + ip.payload_len();
            (IpAddr::V6(ip.src()), IpAddr::V6(ip.dst()), 0, l4)
        }
        _ => return Err(Malformed),
    };
    let l4 = frame.get(l4).ok_or(Malformed)?;
    let udp = UdpPacket::new_checked(l4).map_err(|_| Malformed)?;
    if udp.dst_port() != port {
        return Err(Malformed);
    }
    let datagram = l4.get(..udp.len()).filter(|d| d.len() >= UDP_HEADER_LEN).ok_or(Malformed)?;
    let octets = |ip: IpAddr| match ip {
        IpAddr::V4(a) => checksum::sum(&a.octets(), 0),
        IpAddr::V6(a) => checksum::sum(&a.octets(), 0),
    };
    let pseudo = octets(from_ip) + octets(to) + datagram.len() as u32 + u32::from(IPPROTO_UDP);
    if !udp_checksum_ok(datagram, pseudo, from_ip.is_ipv4()) {
        return Err(BadChecksum);
    }
    let from = SocketAddr::new(from_ip, udp.src_port());
    let payload = datagram.get(UDP_HEADER_LEN..).ok_or(Malformed)?;
    Ok(Parsed { from, to, ip_id, payload })
}

/// Whether the UDP checksum of `datagram` (header and payload) is one a
/// receiver takes; `pseudo`: the pseudo-header's sum.
fn udp_checksum_ok(datagram: &[u8], pseudo: u32, v4: bool) -> bool {
    let field = u16::from_be_bytes([datagram[6], datagram[7]]);
    if field == 0 {
        // None computed: allowed over IPv4 only.
        return v4;
    }
    // Left for an offload (checked first: it costs no pass over the data).
    if field == !checksum::finish(pseudo) {
        return true;
    }
    checksum::finish(checksum::sum(datagram, pseudo)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(src: &str, dst: &str) -> Path {
        Path {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: SocketAddr::new(src.parse().unwrap(), 4791),
            dst: SocketAddr::new(dst.parse().unwrap(), 4791),
        }
    }

    #[test]
    fn frames_parse_back_to_what_was_built() {
        for (src, dst) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
            let p = path(src, dst);
            let payload: Vec<u8> = (0..300u16).map(|i| i as u8).collect();
            let mut buf = [0u8; 2048];
            let n = build(&mut buf, &p, &payload, 7, 0).unwrap();
            assert_eq!(n, overhead(p.src.is_ipv4()) + payload.len());
            let got = parse(&buf[..n], 4791).unwrap();
            assert_eq!(got.from, p.src);
            assert_eq!(got.to, p.dst.ip());
            assert_eq!(got.ip_id, if p.src.is_ipv4() { 7 } else { 0 });
            assert_eq!(got.payload, &payload[..]);
            assert_eq!(parse(&buf[..n], 4792), Err(Refused::Malformed), "another port");
            assert_eq!(parse(&buf[..n - 1], 4791), Err(Refused::Malformed), "truncated");
            if !p.src.is_ipv4() {
                // The UDP checksum verifies over the pseudo-header.
                let v6 = Ipv6Packet::new_checked(&buf[ETH_HEADER_LEN..n]).unwrap();
                let (IpAddr::V6(s), IpAddr::V6(d)) = (p.src.ip(), p.dst.ip()) else {
                    unreachable!()
                };
                let mut acc = checksum::sum(&s.octets(), 0);
                acc = checksum::sum(&d.octets(), acc);
                acc += (8 + payload.len()) as u32 + 17;
                acc = checksum::sum(v6.payload(), acc);
                assert_eq!(checksum::finish(acc), 0);
            }
        }
        // A corrupted IPv4 header checksum, and mixed families.
        let p = path("10.0.0.1", "10.0.0.2");
        let mut buf = [0u8; 256];
        let n = build(&mut buf, &p, b"x", 0, 0).unwrap();
        buf[ETH_HEADER_LEN + 8] ^= 1;
        assert_eq!(parse(&buf[..n], 4791), Err(Refused::BadChecksum));
        assert!(build(&mut buf, &path("10.0.0.1", "fd00::2"), b"x", 0, 0).is_none());
        assert!(build(&mut [0u8; 40], &p, b"x", 0, 0).is_none(), "too small");
    }

    /// Where the UDP checksum field of a built frame is.
    fn udp_check_at(v4: bool) -> usize {
        overhead(v4) - UDP_HEADER_LEN + 6
    }

    /// The folded pseudo-header sum a kernel sender on veth leaves in the
    /// field for an offload (`CHECKSUM_PARTIAL`), for the frame in `buf`.
    fn partial(buf: &[u8], v4: bool, udp_len: usize) -> u16 {
        let ip = &buf[ETH_HEADER_LEN..];
        let (s, d) = if v4 { (&ip[12..16], &ip[16..20]) } else { (&ip[8..24], &ip[24..40]) };
        let acc = checksum::sum(d, checksum::sum(s, 0)) + udp_len as u32 + 17;
        !checksum::finish(acc)
    }

    #[test]
    fn udp_checksums_are_checked_as_the_kernel_does_and_offload_leftovers_taken() {
        let payload = [0x5au8; 100];
        for (src, dst) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
            let v4 = src.contains('.');
            let mut buf = [0u8; 512];
            let n = build(&mut buf, &path(src, dst), &payload, 0, 0).unwrap();
            let at = udp_check_at(v4);
            let set = |buf: &mut [u8], v: u16| buf[at..at + 2].copy_from_slice(&v.to_be_bytes());
            // A full checksum (computed here for IPv4, which `build` leaves 0).
            let datagram = overhead(v4) - UDP_HEADER_LEN..n;
            let pseudo = u32::from(partial(&buf, v4, datagram.len()));
            set(&mut buf, 0);
            let full = match checksum::finish(checksum::sum(&buf[datagram.clone()], pseudo)) {
                0 => 0xffff,
                c => c,
            };
            set(&mut buf, full);
            assert!(parse(&buf[..n], 4791).is_ok(), "{src}: a full checksum");
            let left = partial(&buf, v4, datagram.len());
            set(&mut buf, left);
            assert!(parse(&buf[..n], 4791).is_ok(), "{src}: left for an offload");
            set(&mut buf, full ^ 0x0100);
            assert_eq!(parse(&buf[..n], 4791), Err(Refused::BadChecksum), "{src}: wrong");
            set(&mut buf, 0);
            let none = parse(&buf[..n], 4791);
            if v4 {
                assert!(none.is_ok(), "IPv4 may carry none");
            } else {
                assert_eq!(none, Err(Refused::BadChecksum), "IPv6 must carry one");
            }
            // A payload damaged under a full checksum.
            set(&mut buf, full);
            buf[n - 1] ^= 0x40;
            assert_eq!(parse(&buf[..n], 4791), Err(Refused::BadChecksum), "{src}: damaged");
        }
        // A UDP length below its own header: refused, no panic.
        let mut buf = [0u8; 256];
        let n = build(&mut buf, &path("10.0.0.1", "10.0.0.2"), &payload, 0, 0).unwrap();
        let len_at = overhead(true) - UDP_HEADER_LEN + 4;
        buf[len_at..len_at + 2].copy_from_slice(&3u16.to_be_bytes());
        assert_eq!(parse(&buf[..n], 4791), Err(Refused::Malformed));
    }
}
