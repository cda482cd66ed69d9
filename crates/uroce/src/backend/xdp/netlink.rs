//! UNSAFE ISLAND (small): the kernel's IPv6 neighbour table, read by one
//! `RTM_GETNEIGH` dump over a netlink socket (IPv6 has no `/proc` file for
//! it), and whether an interface has an XDP program (`RTM_GETLINK`: no
//! privilege needed, unlike asking the BPF subsystem). Only the socket
//! calls are unsafe; the messages are parsed from bytes in safe code.

use std::io;
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// Neighbour states whose link-layer address can be used: REACHABLE,
/// STALE, DELAY, PROBE, NOARP, PERMANENT.
const NUD_USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;

/// `IFLA_XDP` and, nested in it, `IFLA_XDP_ATTACHED`.
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;

/// Every usable IPv6 neighbour of interface `ifindex`: (address, MAC).
pub(crate) fn ipv6_neighbours(ifindex: u32) -> io::Result<Vec<(Ipv6Addr, [u8; 6])>> {
    // nlmsghdr (16 bytes) + ndmsg (12 bytes).
    let mut req = [0u8; 28];
    req[0..4].copy_from_slice(&28u32.to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETNEIGH.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[16] = libc::AF_INET6 as u8;
    let mut out = Vec::new();
    ask(&req, |b| parse_dump(b, ifindex, &mut out))?;
    Ok(out)
}

/// Whether interface `ifindex` has an XDP program attached (any mode).
pub(crate) fn xdp_attached(ifindex: u32) -> io::Result<bool> {
    // nlmsghdr (16 bytes) + ifinfomsg (16 bytes): one link, no dump.
    let mut req = [0u8; 32];
    req[0..4].copy_from_slice(&32u32.to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
    req[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[20..24].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    let mut attached = None;
    ask(&req, |b| {
        attached = parse_link(b);
        true
    })?;
    attached.ok_or_else(|| io::Error::other("netlink: no answer about the link"))
}

/// The `IFLA_XDP_ATTACHED` of the link message `b` (an `RTM_NEWLINK`):
/// whether a program is attached; `None` for another message, or one
/// without the attribute.
fn parse_link(b: &[u8]) -> Option<bool> {
    let len = u32_at(b, 0)? as usize;
    if u16_at(b, 4)? != RTM_NEWLINK || len > b.len() {
        return None;
    }
    let xdp = attrs(b.get(32..len)?).find(|&(ty, _)| ty & 0x3fff == IFLA_XDP)?.1;
    let (_, v) = attrs(xdp).find(|&(ty, _)| ty == IFLA_XDP_ATTACHED)?;
    Some(*v.first()? != 0)
}

/// Netlink attributes (type, value) packed in `a`, up to the first one
/// that does not fit.
fn attrs(mut a: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let (len, ty) = (usize::from(u16_at(a, 0)?), u16_at(a, 2)?);
        if len < 4 || len > a.len() {
            return None;
        }
        let v = &a[4..len];
        a = a.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        Some((ty, v))
    })
}

/// Sends `req` to the kernel and hands each answering datagram to `take`
/// until it says the answer is complete.
fn ask(req: &[u8], mut take: impl FnMut(&[u8]) -> bool) -> io::Result<()> {
    // SAFETY: plain socket call; checked.
    let fd = unsafe {
        libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sends our live buffer to the kernel (no address: a netlink
    // socket's default peer is the kernel).
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32768];
    loop {
        // SAFETY: receives into our live buffer of its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 || take(&buf[..n as usize]) {
            return Ok(());
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Adds the neighbours of `ifindex` in one datagram of a dump to `out`;
/// whether the dump ended (`NLMSG_DONE` or an error).
pub(crate) fn parse_dump(mut b: &[u8], ifindex: u32, out: &mut Vec<(Ipv6Addr, [u8; 6])>) -> bool {
    while let (Some(len), Some(ty)) = (u32_at(b, 0), u16_at(b, 4)) {
        let len = len as usize;
        if len < 16 || len > b.len() {
            return true;
        }
        match ty {
            NLMSG_DONE | NLMSG_ERROR => return true,
            RTM_NEWNEIGH => {
                if let Some(n) = neighbour(&b[16..len], ifindex) {
                    out.push(n);
                }
            }
            _ => {}
        }
        b = b.get(len.next_multiple_of(4)..).unwrap_or(&[]);
    }
    false
}

/// One `ndmsg` with its attributes, if it is a usable IPv6 neighbour of
/// `ifindex`.
fn neighbour(m: &[u8], ifindex: u32) -> Option<(Ipv6Addr, [u8; 6])> {
    let family = *m.first()?;
    let index = u32_at(m, 4)?;
    let state = u16_at(m, 8)?;
    if i32::from(family) != libc::AF_INET6 || index != ifindex || state & NUD_USABLE == 0 {
        return None;
    }
    let (mut dst, mut mac) = (None, None);
    for (ty, v) in attrs(m.get(12..)?) {
        match ty {
            NDA_DST => dst = <[u8; 16]>::try_from(v).ok().map(Ipv6Addr::from),
            NDA_LLADDR => mac = <[u8; 6]>::try_from(v).ok(),
            _ => {}
        }
    }
    Some((dst?, mac?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dump datagram of `entries` (ifindex, state, address, MAC), then
    /// `NLMSG_DONE`.
    fn dump(entries: &[(u32, u16, Ipv6Addr, [u8; 6])]) -> Vec<u8> {
        let mut b = Vec::new();
        for &(ifindex, state, ip, mac) in entries {
            let mut m = vec![0u8; 16 + 12];
            m[4..6].copy_from_slice(&RTM_NEWNEIGH.to_ne_bytes());
            m[16] = libc::AF_INET6 as u8;
            m[20..24].copy_from_slice(&ifindex.to_ne_bytes());
            m[24..26].copy_from_slice(&state.to_ne_bytes());
            m.extend_from_slice(&20u16.to_ne_bytes());
            m.extend_from_slice(&NDA_DST.to_ne_bytes());
            m.extend_from_slice(&ip.octets());
            m.extend_from_slice(&10u16.to_ne_bytes());
            m.extend_from_slice(&NDA_LLADDR.to_ne_bytes());
            m.extend_from_slice(&mac);
            m.extend_from_slice(&[0, 0]); // to 4 bytes
            let len = m.len() as u32;
            m[0..4].copy_from_slice(&len.to_ne_bytes());
            b.extend_from_slice(&m);
        }
        let mut done = vec![0u8; 20];
        done[0..4].copy_from_slice(&20u32.to_ne_bytes());
        done[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
        b.extend_from_slice(&done);
        b
    }

    #[test]
    fn dumps_parse_to_usable_neighbours_of_one_interface() {
        let a: Ipv6Addr = "fe80::1".parse().unwrap();
        let b: Ipv6Addr = "fd00::2".parse().unwrap();
        let d = dump(&[
            (3, 0x02, a, [2, 0, 0, 0, 0, 1]),
            (3, 0x01, b, [0; 6]),             // incomplete
            (4, 0x04, b, [2, 0, 0, 0, 0, 9]), // another interface
            (3, 0x04, b, [2, 0, 0, 0, 0, 2]),
        ]);
        let mut out = Vec::new();
        assert!(parse_dump(&d, 3, &mut out), "ends at NLMSG_DONE");
        assert_eq!(out, vec![(a, [2, 0, 0, 0, 0, 1]), (b, [2, 0, 0, 0, 0, 2])]);
        // Truncated datagrams end the parse without a panic.
        for cut in 0..d.len() {
            let _ = parse_dump(&d[..cut], 3, &mut Vec::new());
        }
    }

    #[test]
    fn this_hosts_table_reads() {
        // Whatever it holds, the dump completes.
        let lo = crate::netif::index_of_name("lo").unwrap_or(1);
        assert!(ipv6_neighbours(lo).is_ok());
        // Loopback has no XDP program here (nobody attaches one to it).
        assert!(!xdp_attached(lo).unwrap());
    }

    /// An `RTM_NEWLINK` with an `IFLA_XDP` nest saying `attached`.
    fn link(attached: u8) -> Vec<u8> {
        let mut m = vec![0u8; 32];
        m[4..6].copy_from_slice(&RTM_NEWLINK.to_ne_bytes());
        // IFLA_MTU first, then IFLA_XDP (NLA_F_NESTED set) around
        // IFLA_XDP_ATTACHED.
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&4u16.to_ne_bytes());
        m.extend_from_slice(&1500u32.to_ne_bytes());
        m.extend_from_slice(&12u16.to_ne_bytes());
        m.extend_from_slice(&(IFLA_XDP | 0x8000).to_ne_bytes());
        m.extend_from_slice(&5u16.to_ne_bytes());
        m.extend_from_slice(&IFLA_XDP_ATTACHED.to_ne_bytes());
        m.extend_from_slice(&[attached, 0, 0, 0]);
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn link_messages_say_whether_a_program_is_attached() {
        assert_eq!(parse_link(&link(0)), Some(false));
        assert_eq!(parse_link(&link(2)), Some(true), "XDP_ATTACHED_SKB");
        let l = link(1);
        for cut in 0..l.len() {
            let _ = parse_link(&l[..cut]);
        }
        let mut other = link(1);
        other[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        assert_eq!(parse_link(&other), None);
    }
}
