//! Ethernet frames around RoCEv2 datagrams, built and parsed with the wire
//! crate's headers: what the kernel's UDP stack does for the `udp`
//! backend, done here for the AF_XDP socket.
//!
//! On transmit: IPv4 with DF, TTL 64 and the identification the driver
//! computed the ICRC over, UDP checksum 0 (RoCEv2's ICRC is the integrity
//! check; rxe sends 0 too); IPv6 with a full UDP checksum, as IPv6 asks.
//! On receive the UDP checksum is not checked: a kernel sender on veth
//! leaves only the pseudo-header sum in it (checksum offload), and the ICRC
//! covers the datagram anyway.

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

/// The UDP datagram to `port` in `frame`, if it is one: IPv4 (header
/// checksum verified, not a fragment) or IPv6 (no extension headers).
pub(crate) fn parse(frame: &[u8], port: u16) -> Option<Parsed<'_>> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let at = eth.header_len();
    // (sender, receiver, IP ID, where the UDP header starts and ends)
    let (from_ip, to, ip_id, l4) = match eth.ethertype() {
        ETHERTYPE_IPV4 => {
            let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
            if !ip.checksum_ok()
                || ip.more_frags()
                || ip.frag_offset() != 0
                || ip.protocol() != IPPROTO_UDP
            {
                return None;
            }
            let l4 = at + ip.header_len()..at + ip.total_len();
            (IpAddr::V4(ip.src()), IpAddr::V4(ip.dst()), ip.ident(), l4)
        }
        ETHERTYPE_IPV6 => {
            let ip = Ipv6Packet::new_checked(eth.payload()).ok()?;
            if ip.next_header() != IPPROTO_UDP {
                return None;
            }
            let l4 = at + IPV6_HEADER_LEN..at + IPV6_HEADER_LEN + ip.payload_len();
            (IpAddr::V6(ip.src()), IpAddr::V6(ip.dst()), 0, l4)
        }
        _ => return None,
    };
    let l4 = frame.get(l4)?;
    let udp = UdpPacket::new_checked(l4).ok()?;
    if udp.dst_port() != port {
        return None;
    }
    let from = SocketAddr::new(from_ip, udp.src_port());
    let payload = l4.get(UDP_HEADER_LEN..udp.len())?;
    Some(Parsed { from, to, ip_id, payload })
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
            assert!(parse(&buf[..n], 4792).is_none(), "another port is not ours");
            assert!(parse(&buf[..n - 1], 4791).is_none(), "a truncated frame");
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
        assert!(parse(&buf[..n], 4791).is_none());
        assert!(build(&mut buf, &path("10.0.0.1", "fd00::2"), b"x", 0, 0).is_none());
        assert!(build(&mut [0u8; 40], &p, b"x", 0, 0).is_none(), "too small");
    }
}
