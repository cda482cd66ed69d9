//! IPv6 neighbour discovery (RFC 4861) and ICMPv6 echo: what a backend
//! that owns its port outright (DPDK) needs to answer for its IPv6
//! address and to learn its peers' MACs, as [`crate::arp`] does for IPv4.
//! The messages are ICMPv6 (next header 58) with their checksum over the
//! IPv6 pseudo-header; a neighbour discovery message is taken only with a
//! hop limit of 255 (it was not forwarded) and code 0, as RFC 4861 §7.1.1
//! asks.

use core::net::{IpAddr, Ipv6Addr};

use crate::checksum;
use crate::{Result, WireError};

/// Next-header number of ICMPv6.
pub const IPPROTO_ICMPV6: u8 = 58;
/// ICMPv6 type of an echo request.
pub const ECHO_REQUEST: u8 = 128;
/// ICMPv6 type of an echo reply.
pub const ECHO_REPLY: u8 = 129;
/// ICMPv6 type of a neighbour solicitation.
pub const NEIGHBOR_SOLICIT: u8 = 135;
/// ICMPv6 type of a neighbour advertisement.
pub const NEIGHBOR_ADVERT: u8 = 136;
/// The hop limit neighbour discovery is sent with and checked against.
pub const NDP_HOP_LIMIT: u8 = 255;
/// Length of a solicitation or advertisement with a link-layer option.
pub const NDP_LEN: usize = 32;

/// Option type: the sender's link-layer address (in a solicitation).
const OPT_SOURCE_LL: u8 = 1;
/// Option type: the target's link-layer address (in an advertisement).
const OPT_TARGET_LL: u8 = 2;

/// A neighbour solicitation or advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NdpRepr {
    /// Who has `target`? `source_mac`: the asker's MAC, absent when it
    /// asks from the unspecified address (duplicate address detection).
    Solicit {
        /// The address asked about.
        target: Ipv6Addr,
        /// The asker's link-layer address option.
        source_mac: Option<[u8; 6]>,
    },
    /// `target` is at `target_mac`.
    Advert {
        /// The address told about.
        target: Ipv6Addr,
        /// The link-layer address option.
        target_mac: Option<[u8; 6]>,
        /// In answer to a solicitation (S flag).
        solicited: bool,
        /// Replaces what the receiver knew (O flag).
        overrides: bool,
    },
}

/// The ICMPv6 checksum of `msg` (its checksum field zero, or included to
/// verify as 0) between `src` and `dst`.
pub fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut acc = checksum::sum(&src.octets(), 0);
    acc = checksum::sum(&dst.octets(), acc);
    acc += msg.len() as u32 + u32::from(IPPROTO_ICMPV6);
    checksum::finish(checksum::sum(msg, acc))
}

/// Writes `msg`'s checksum field (bytes 2–3) for `src` → `dst`.
pub fn set_icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &mut [u8]) {
    if msg.len() >= 4 {
        msg[2..4].fill(0);
        let c = icmpv6_checksum(src, dst, msg);
        msg[2..4].copy_from_slice(&c.to_be_bytes());
    }
}

/// The solicited-node multicast address of `a` (ff02::1:ffXX:XXXX), where
/// solicitations for it are sent.
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet group address of a multicast IP address (RFC 1112 §6.4:
/// 01:00:5e and the low 23 bits; RFC 2464 §7: 33:33 and the low 32 bits).
pub fn multicast_mac(group: IpAddr) -> [u8; 6] {
    match group {
        IpAddr::V4(a) => {
            let o = a.octets();
            [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            [0x33, 0x33, o[12], o[13], o[14], o[15]]
        }
    }
}

impl NdpRepr {
    /// Reads a neighbour discovery message: `msg` is the ICMPv6 message of
    /// a packet from `src` to `dst` with hop limit `hop_limit`.
    ///
    /// # Errors
    /// [`WireError::UnsupportedProtocol`] for another ICMPv6 type;
    /// [`WireError::Truncated`] for a message shorter than its fixed part;
    /// [`WireError::BadChecksum`]; [`WireError::BadLength`] for a zero-
    /// length option or one past the end; [`WireError::HeaderMismatch`]
    /// for what RFC 4861 §7.1 says to drop (hop limit below 255, a code,
    /// a multicast target, a solicitation from the unspecified address
    /// that is not to a solicited-node address or carries a link-layer
    /// address, a solicited advertisement to a multicast address).
    pub fn parse(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, msg: &[u8]) -> Result<Self> {
        let kind = *msg.first().ok_or(WireError::Truncated)?;
        if kind != NEIGHBOR_SOLICIT && kind != NEIGHBOR_ADVERT {
            return Err(WireError::UnsupportedProtocol);
        }
        if msg.len() < 24 {
            return Err(WireError::Truncated);
        }
        if icmpv6_checksum(src, dst, msg) != 0 {
            return Err(WireError::BadChecksum);
        }
        let mut t = [0u8; 16];
        t.copy_from_slice(&msg[8..24]);
        let target = Ipv6Addr::from(t);
        if hop_limit != NDP_HOP_LIMIT || msg[1] != 0 || target.is_multicast() {
            return Err(WireError::HeaderMismatch);
        }
        // Options: (type, length in units of 8 bytes, value).
        let mut mac = None;
        let mut rest = &msg[24..];
        while rest.len() >= 2 {
            let len = usize::from(rest[1]) * 8;
            if len == 0 || len > rest.len() {
                return Err(WireError::BadLength);
            }
            let wanted = if kind == NEIGHBOR_SOLICIT { OPT_SOURCE_LL } else { OPT_TARGET_LL };
            if rest[0] == wanted && len >= 8 {
                let mut m = [0u8; 6];
                m.copy_from_slice(&rest[2..8]);
                mac = Some(m);
            }
            rest = &rest[len..];
        }
        if kind == NEIGHBOR_SOLICIT {
            if src.is_unspecified() && (mac.is_some() || dst != solicited_node(target)) {
                return Err(WireError::HeaderMismatch);
            }
            return Ok(Self::Solicit { target, source_mac: mac });
        }
        let flags = msg[4];
        let solicited = flags & 0x40 != 0;
        if solicited && dst.is_multicast() {
            return Err(WireError::HeaderMismatch);
        }
        Ok(Self::Advert { target, target_mac: mac, solicited, overrides: flags & 0x20 != 0 })
    }

    /// Writes the message (with its one link-layer option, if any, and
    /// the checksum for `src` → `dst`); returns its length.
    ///
    /// # Errors
    /// [`WireError::BufferTooSmall`].
    pub fn emit(&self, src: Ipv6Addr, dst: Ipv6Addr, b: &mut [u8]) -> Result<usize> {
        let (kind, target, mac, flags, opt) = match *self {
            Self::Solicit { target, source_mac } => {
                (NEIGHBOR_SOLICIT, target, source_mac, 0, OPT_SOURCE_LL)
            }
            Self::Advert { target, target_mac, solicited, overrides } => (
                NEIGHBOR_ADVERT,
                target,
                target_mac,
                (u8::from(solicited) << 6) | (u8::from(overrides) << 5),
                OPT_TARGET_LL,
            ),
        };
        let len = if mac.is_some() { NDP_LEN } else { 24 };
        let b = b.get_mut(..len).ok_or(WireError::BufferTooSmall)?;
        b.fill(0);
        b[0] = kind;
        b[4] = flags;
        b[8..24].copy_from_slice(&target.octets());
        if let Some(m) = mac {
            b[24] = opt;
            b[25] = 1;
            b[26..32].copy_from_slice(&m);
        }
        set_icmpv6_checksum(src, dst, b);
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// The ICMPv6 message of a solicitation captured from Linux 6.18
    /// (`ping -6 fd31::2` from fd31::1, MAC 02:00:00:00:00:01, to the
    /// solicited-node group ff02::1:ff00:2; hop limit 255): the kernel's
    /// checksum is 0x7d35.
    fn linux_solicit() -> [u8; 32] {
        let mut m = [0u8; 32];
        let hex = b"87007d3500000000fd3100000000000000000000000000020101020000000001";
        for (i, b) in m.iter_mut().enumerate() {
            let d = |c: u8| (c as char).to_digit(16).unwrap() as u8;
            *b = d(hex[2 * i]) << 4 | d(hex[2 * i + 1]);
        }
        m
    }

    #[test]
    fn solicitations_and_advertisements_round_trip() {
        let (me, peer) = (a("fd31::2"), a("fd31::1"));
        let sn = solicited_node(me);
        assert_eq!(sn, a("ff02::1:ff00:2"));
        let m = linux_solicit();
        let s = NdpRepr::parse(peer, sn, 255, &m).unwrap();
        assert_eq!(s, NdpRepr::Solicit { target: me, source_mac: Some([2, 0, 0, 0, 0, 1]) });
        let mut out = [0u8; 64];
        assert_eq!(s.emit(peer, sn, &mut out), Ok(32));
        assert_eq!(out[..32], m, "the same bytes back, Linux's checksum too");
        let adv = NdpRepr::Advert {
            target: me,
            target_mac: Some([2, 0, 0, 0, 0, 2]),
            solicited: true,
            overrides: true,
        };
        let n = adv.emit(me, peer, &mut out).unwrap();
        assert_eq!((n, out[4]), (32, 0x60));
        assert_eq!(icmpv6_checksum(me, peer, &out[..n]), 0);
        assert_eq!(NdpRepr::parse(me, peer, 255, &out[..n]), Ok(adv));
    }

    #[test]
    fn what_rfc_4861_drops_is_refused() {
        let (me, peer) = (a("fd31::2"), a("fd31::1"));
        let sn = solicited_node(me);
        let m = linux_solicit();
        assert_eq!(NdpRepr::parse(peer, sn, 64, &m), Err(WireError::HeaderMismatch), "forwarded");
        assert_eq!(NdpRepr::parse(peer, sn, 255, &m[..23]), Err(WireError::Truncated));
        let mut bad = m;
        bad[31] ^= 1;
        assert_eq!(NdpRepr::parse(peer, sn, 255, &bad), Err(WireError::BadChecksum));
        let mut zero_opt = m;
        zero_opt[25] = 0;
        set_icmpv6_checksum(peer, sn, &mut zero_opt);
        assert_eq!(NdpRepr::parse(peer, sn, 255, &zero_opt), Err(WireError::BadLength));
        // Duplicate address detection: from ::, to the solicited-node
        // address, without a link-layer address.
        let dad = NdpRepr::Solicit { target: me, source_mac: None };
        let mut out = [0u8; 32];
        let n = dad.emit(Ipv6Addr::UNSPECIFIED, sn, &mut out).unwrap();
        assert_eq!(NdpRepr::parse(Ipv6Addr::UNSPECIFIED, sn, 255, &out[..n]), Ok(dad));
        let n = NdpRepr::Solicit { target: me, source_mac: Some([2; 6]) }
            .emit(Ipv6Addr::UNSPECIFIED, sn, &mut out)
            .unwrap();
        assert_eq!(
            NdpRepr::parse(Ipv6Addr::UNSPECIFIED, sn, 255, &out[..n]),
            Err(WireError::HeaderMismatch)
        );
        // Linux's own duplicate address detection carries a nonce option
        // (type 14), which is skipped.
        let mut nonce = [0u8; 32];
        nonce[0] = 135;
        nonce[8..24].copy_from_slice(&a("fe80::ff:fe00:1").octets());
        nonce[24..32].copy_from_slice(&[14, 1, 0x15, 0x86, 0xac, 0x2c, 0x82, 0xc2]);
        let sn1 = solicited_node(a("fe80::ff:fe00:1"));
        set_icmpv6_checksum(Ipv6Addr::UNSPECIFIED, sn1, &mut nonce);
        assert_eq!(
            NdpRepr::parse(Ipv6Addr::UNSPECIFIED, sn1, 255, &nonce),
            Ok(NdpRepr::Solicit { target: a("fe80::ff:fe00:1"), source_mac: None })
        );
        let mut echo = [0u8; 24];
        echo[0] = ECHO_REQUEST;
        assert_eq!(NdpRepr::parse(peer, me, 255, &echo), Err(WireError::UnsupportedProtocol));
        // Whatever bytes come, no panic.
        let mut junk = [0u8; 40];
        for (i, b) in junk.iter_mut().enumerate() {
            *b = [135u8, 0, 1, 0][i % 4];
        }
        for len in 0..junk.len() {
            let _ = NdpRepr::parse(peer, me, 255, &junk[..len]);
        }
    }

    #[test]
    fn group_addresses_map_to_ethernet_groups() {
        assert_eq!(multicast_mac("239.255.77.1".parse().unwrap()), [0x01, 0x00, 0x5e, 0x7f, 77, 1]);
        assert_eq!(multicast_mac(IpAddr::V6(a("ff02::1:ff00:2"))), [0x33, 0x33, 0xff, 0, 0, 2]);
    }
}
