//! The GID table of port 1: one RoCEv2 GID per address of the device's
//! interface, as RoCE devices list them.
//!
//! Index 0 is the device's configured address, always: it is the address
//! the user chose, and what `-g 0` and uroce's own tools mean. The
//! interface's other addresses follow in the order the kernel gives rxe's
//! GID table: IPv6 link-local first, then IPv4 (IPv4-mapped), then the
//! other IPv6 addresses. A loopback device is one address of `127.0.0.0/8`
//! (each is a device of its own by convention), so the other IPv4 loopback
//! addresses are left out; `::1` and `127.0.0.1` pair up.
//!
//! Indices are stable while the device is open: an address that goes away
//! leaves its slot empty (`ibv_query_gid` then reads zeros, as on rxe), and
//! a new one takes the first empty slot.

use std::net::IpAddr;

/// The most GIDs a table holds (addresses beyond are not listed).
pub(crate) const MAX_GIDS: usize = 64;

/// A port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GidTable {
    slots: Vec<Option<IpAddr>>,
}

/// Whether an IPv6 address is link-local (fe80::/10).
pub(crate) fn is_link_local(a: IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// The rank of an address in rxe's order: link-local, IPv4, other IPv6.
fn rank(a: IpAddr) -> u8 {
    match a {
        _ if is_link_local(a) => 0,
        IpAddr::V4(_) => 1,
        IpAddr::V6(_) => 2,
    }
}

/// Which of the interface's other addresses (`siblings`, kernel order) a
/// device on `primary` lists, in table order.
pub(crate) fn listed(primary: IpAddr, siblings: &[IpAddr]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = siblings
        .iter()
        .copied()
        .filter(|a| *a != primary && !a.is_unspecified() && !a.is_multicast())
        .filter(|a| !(primary.is_loopback() && a.is_ipv4() && primary.is_ipv4()))
        .collect();
    // A stable sort keeps the kernel's order within each rank.
    out.sort_by_key(|a| rank(*a));
    out.dedup();
    out
}

impl GidTable {
    /// A table holding `primary` at index 0 and `siblings` after it.
    pub(crate) fn new(primary: IpAddr, siblings: &[IpAddr]) -> Self {
        let mut t = Self { slots: vec![Some(primary)] };
        t.refresh(siblings);
        t
    }

    /// The table of a device on `primary`: the host's interface addresses
    /// when `on_host`, else (a simulated network) the one address.
    pub(crate) fn for_device(primary: IpAddr, on_host: bool) -> Self {
        if !on_host {
            return Self::new(primary, &[]);
        }
        Self::new(primary, &crate::netif::siblings_in(&crate::netif::all(), primary))
    }

    /// Follows the interface's current addresses. Returns the addresses
    /// that left the table.
    pub(crate) fn refresh(&mut self, siblings: &[IpAddr]) -> Vec<IpAddr> {
        let Some(primary) = self.slots[0] else { return Vec::new() };
        let now = listed(primary, siblings);
        let mut gone = Vec::new();
        for slot in self.slots.iter_mut().skip(1) {
            if let Some(a) = *slot
                && !now.contains(&a)
            {
                gone.push(a);
                *slot = None;
            }
        }
        for a in now {
            if self.slots.contains(&Some(a)) {
                continue;
            }
            match self.slots.iter().skip(1).position(Option::is_none) {
                Some(i) => self.slots[i + 1] = Some(a),
                None if self.slots.len() < MAX_GIDS => self.slots.push(Some(a)),
                None => {}
            }
        }
        // Empty slots at the end are no index anybody can hold.
        while self.slots.len() > 1 && self.slots.last() == Some(&None) {
            self.slots.pop();
        }
        gone
    }

    /// The address at `index`, if the slot holds one.
    pub(crate) fn get(&self, index: usize) -> Option<IpAddr> {
        self.slots.get(index).copied().flatten()
    }

    /// `(index, address)` for every slot that holds one.
    pub(crate) fn entries(&self) -> Vec<(u32, IpAddr)> {
        self.slots.iter().enumerate().filter_map(|(i, a)| a.map(|a| (i as u32, a))).collect()
    }

    /// The index holding `addr`.
    pub(crate) fn index_of(&self, addr: IpAddr) -> Option<usize> {
        self.slots.iter().position(|s| *s == Some(addr))
    }

    /// The table length (`gid_tbl_len`): slots, empty ones included.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn primary_first_then_link_local_ipv4_ipv6() {
        let sib = [ip("2001:db8::5"), ip("10.0.0.9"), ip("fe80::1"), ip("10.0.0.1")];
        let t = GidTable::new(ip("10.0.0.1"), &sib);
        let got: Vec<_> = (0..t.len()).map(|i| t.get(i).unwrap()).collect();
        assert_eq!(got, [ip("10.0.0.1"), ip("fe80::1"), ip("10.0.0.9"), ip("2001:db8::5")]);
        assert_eq!(t.index_of(ip("10.0.0.9")), Some(2));
    }

    #[test]
    fn loopback_devices_pair_127_0_0_1_with_colon_colon_1_only() {
        let lo = [ip("127.0.0.1"), ip("::1")];
        let t = GidTable::new(ip("127.0.0.1"), &lo);
        assert_eq!((t.len(), t.get(1)), (2, Some(ip("::1"))));
        let t = GidTable::new(ip("127.0.0.2"), &lo);
        assert_eq!((t.len(), t.get(1)), (2, Some(ip("::1"))));
        let t = GidTable::new(ip("::1"), &lo);
        assert_eq!((t.len(), t.get(1)), (2, Some(ip("127.0.0.1"))));
    }

    #[test]
    fn indices_stay_put_as_addresses_come_and_go() {
        let mut t = GidTable::new(ip("10.0.0.1"), &[ip("fe80::1"), ip("10.0.0.2")]);
        assert_eq!(t.get(2), Some(ip("10.0.0.2")));
        let gone = t.refresh(&[ip("10.0.0.2")]);
        assert_eq!(gone, [ip("fe80::1")]);
        assert_eq!((t.get(1), t.get(2), t.len()), (None, Some(ip("10.0.0.2")), 3));
        t.refresh(&[ip("10.0.0.2"), ip("10.0.0.3")]);
        assert_eq!(t.get(1), Some(ip("10.0.0.3")));
        assert_eq!(t.get(2), Some(ip("10.0.0.2")));
        t.refresh(&[ip("10.0.0.3")]);
        assert_eq!(t.len(), 2, "a trailing empty slot is dropped");
        t.refresh(&[]);
        assert_eq!((t.len(), t.get(0)), (1, Some(ip("10.0.0.1"))));
    }
}
