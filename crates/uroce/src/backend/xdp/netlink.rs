//! UNSAFE ISLAND (small): the kernel's IPv6 neighbour table, read by one
//! `RTM_GETNEIGH` dump over a netlink socket (IPv6 has no `/proc` file for
//! it). Only the socket calls are unsafe; the messages are parsed from
//! bytes in safe code.

use std::io;
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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

/// Every usable IPv6 neighbour of interface `ifindex`: (address, MAC).
pub(crate) fn ipv6_neighbours(ifindex: u32) -> io::Result<Vec<(Ipv6Addr, [u8; 6])>> {
    // SAFETY: plain socket call; checked.
    let fd = unsafe {
        libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // nlmsghdr (16 bytes) + ndmsg (12 bytes).
    let mut req = [0u8; 28];
    req[0..4].copy_from_slice(&28u32.to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETNEIGH.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[16] = libc::AF_INET6 as u8;
    // SAFETY: sends our live buffer to the kernel (no address: a netlink
    // socket's default peer is the kernel).
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 32768];
    loop {
        // SAFETY: receives into our live buffer of its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if parse_dump(&buf[..n as usize], ifindex, &mut out) || n == 0 {
            return Ok(out);
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
    let mut a = m.get(12..)?;
    while let (Some(len), Some(ty)) = (u16_at(a, 0), u16_at(a, 2)) {
        let len = usize::from(len);
        if len < 4 || len > a.len() {
            break;
        }
        let v = &a[4..len];
        match ty {
            NDA_DST => dst = <[u8; 16]>::try_from(v).ok().map(Ipv6Addr::from),
            NDA_LLADDR => mac = <[u8; 6]>::try_from(v).ok(),
            _ => {}
        }
        a = a.get(len.next_multiple_of(4)..).unwrap_or(&[]);
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
    }
}
