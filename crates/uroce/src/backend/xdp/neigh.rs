//! Next hops and their MAC addresses, read from the kernel's tables (the
//! kernel still answers and resolves ARP and neighbour discovery: the XDP
//! program passes them on): `/proc/net/route` and `/proc/net/arp` for
//! IPv4, `/proc/net/ipv6_route` and a netlink dump (`netlink`) for IPv6.
//! A destination without a known MAC goes through the kernel's UDP socket
//! instead, which also makes the kernel resolve it for the next packets.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

/// How long a looked-up MAC is used before it is read again.
const FRESH: Duration = Duration::from_secs(1);
/// How often a destination without a MAC is looked up again.
const RETRY: Duration = Duration::from_millis(20);

/// The MAC addresses of destinations on one interface.
#[derive(Debug)]
pub(crate) struct Neighbours {
    iface: String,
    ifindex: u32,
    cache: HashMap<IpAddr, (Option<[u8; 6]>, Instant)>,
}

impl Neighbours {
    pub(crate) fn new(iface: &str, ifindex: u32) -> Self {
        Self { iface: iface.to_string(), ifindex, cache: HashMap::new() }
    }

    /// The MAC last looked up for `dst`, however old.
    pub(crate) fn known(&self, dst: IpAddr) -> Option<[u8; 6]> {
        self.cache.get(&dst).and_then(|&(mac, _)| mac)
    }

    /// The MAC to send to `dst` at, if the kernel knows it.
    pub(crate) fn lookup(&mut self, dst: IpAddr, now: Instant) -> Option<[u8; 6]> {
        if let Some(&(mac, at)) = self.cache.get(&dst) {
            let age = now.saturating_duration_since(at);
            if age < if mac.is_some() { FRESH } else { RETRY } {
                return mac;
            }
        }
        let mac = match dst {
            IpAddr::V4(d) => {
                let hop = next_hop(&read("/proc/thread-self/net/route"), &self.iface, d);
                hop.and_then(|h| arp_entry(&read("/proc/thread-self/net/arp"), &self.iface, h))
            }
            IpAddr::V6(d) => {
                let hop = next_hop6(&read("/proc/thread-self/net/ipv6_route"), &self.iface, d);
                let table = super::netlink::ipv6_neighbours(self.ifindex).unwrap_or_default();
                table.into_iter().find(|(ip, _)| *ip == hop).map(|(_, mac)| mac)
            }
        };
        self.cache.insert(dst, (mac, now));
        mac
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The next hop to `dst` through `iface` in a `/proc/net/route` table (the
/// gateway of the longest matching route, or `dst` itself on a link).
pub(crate) fn next_hop(table: &str, iface: &str, dst: Ipv4Addr) -> Option<Ipv4Addr> {
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    let d = u32::from_ne_bytes(dst.octets());
    let mut best: Option<(u32, u32)> = None; // (prefix length, gateway)
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || f[0] != iface {
            continue;
        }
        let (Some(net), Some(gw), Some(mask)) = (hex(f[1]), hex(f[2]), hex(f[7])) else { continue };
        if d & mask == net && best.is_none_or(|(len, _)| mask.count_ones() > len) {
            best = Some((mask.count_ones(), gw));
        }
    }
    // Without a route through the interface, it may still be on its link.
    let gw = best.map_or(0, |(_, gw)| gw);
    Some(if gw == 0 { dst } else { Ipv4Addr::from(gw.to_ne_bytes()) })
}

/// The next hop to `dst` through `iface` in a `/proc/net/ipv6_route` table
/// (the longest matching route's gateway, or `dst` on a link).
pub(crate) fn next_hop6(table: &str, iface: &str, dst: Ipv6Addr) -> Ipv6Addr {
    let d = u128::from(dst);
    let mut best: Option<(u32, u128)> = None;
    for line in table.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 || f[9] != iface {
            continue;
        }
        let (Ok(net), Ok(plen), Ok(gw)) = (
            u128::from_str_radix(f[0], 16),
            u32::from_str_radix(f[1], 16),
            u128::from_str_radix(f[4], 16),
        ) else {
            continue;
        };
        let mask = if plen == 0 { 0 } else { u128::MAX << (128 - plen.min(128)) };
        if d & mask == net && best.is_none_or(|(len, _)| plen > len) {
            best = Some((plen, gw));
        }
    }
    match best {
        Some((_, gw)) if gw != 0 => Ipv6Addr::from(gw),
        _ => dst,
    }
}

/// The complete ARP entry of `ip` on `iface` in a `/proc/net/arp` table.
pub(crate) fn arp_entry(table: &str, iface: &str, ip: Ipv4Addr) -> Option<[u8; 6]> {
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[5] != iface || f[0].parse::<Ipv4Addr>().ok() != Some(ip) {
            continue;
        }
        // ATF_COM: resolved.
        let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).ok()?;
        if flags & 0x2 == 0 {
            return None;
        }
        return parse_mac(f[3]).filter(|m| *m != [0; 6]);
    }
    None
}

/// `aa:bb:cc:dd:ee:ff`.
pub(crate) fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_arp_entries_read() {
        let route = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
            eth0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(next_hop(route, "eth0", ip("192.168.1.7")), Some(ip("192.168.1.7")));
        assert_eq!(next_hop(route, "eth0", ip("8.8.8.8")), Some(ip("192.168.1.1")));
        assert_eq!(next_hop(route, "veth0", ip("10.1.1.1")), Some(ip("10.1.1.1")));
        let arp = "IP address       HW type     Flags       HW address            Mask     Device\n\
            192.168.1.1      0x1         0x2         52:54:00:12:34:56     *        eth0\n\
            192.168.1.9      0x1         0x0         00:00:00:00:00:00     *        eth0\n";
        assert_eq!(
            arp_entry(arp, "eth0", ip("192.168.1.1")),
            Some([0x52, 0x54, 0, 0x12, 0x34, 0x56])
        );
        assert_eq!(arp_entry(arp, "eth0", ip("192.168.1.9")), None, "incomplete");
        assert_eq!(arp_entry(arp, "eth1", ip("192.168.1.1")), None, "another interface");
        assert_eq!(parse_mac("02:00:0a:58:00:01"), Some([2, 0, 10, 0x58, 0, 1]));
        let route6 = "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
            00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0\n";
        let ip6 = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        assert_eq!(next_hop6(route6, "eth0", ip6("fd00::7")), ip6("fd00::7"));
        assert_eq!(next_hop6(route6, "eth0", ip6("2001:db8::1")), ip6("fd00::1"));
        assert_eq!(next_hop6(route6, "veth0", ip6("fe80::1")), ip6("fe80::1"));
        assert_eq!(parse_mac("02:00:0a:58:00"), None);
    }
}
