//! The RDMA CM's port table and address-to-device mapping, one copy per
//! process, shared by the Rust ids (`cm::id`) and librdmacm's.
//!
//! Ports follow the kernel's rules (`drivers/infiniband/core/cma.c`): a
//! port of a port space is owned by the ids bound to it; a second bind
//! conflicts unless both ids set REUSEADDR, with EADDRNOTAVAIL when either
//! address is the wildcard and EADDRINUSE when both name the same
//! address; a listen checks a REUSEADDR id again as if it had not, so two
//! listeners never share a port. Listens are exclusive across the
//! processes sharing a device too (the device's CM agent refuses a second
//! listener); binds are checked within the process.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// An id's bind options (`RDMA_OPTION_ID_REUSEADDR`, `_AFONLY`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BindOptions {
    /// Share the port with other REUSEADDR ids until one listens.
    pub reuseaddr: bool,
    /// An IPv6 wildcard covers IPv6 devices only.
    pub afonly: bool,
}

/// An id bound to a port.
#[derive(Debug, Clone, Copy)]
struct Owner {
    id: usize,
    ip: IpAddr,
    opts: BindOptions,
}

/// Which ids own which ports, per port space. Ids are named by a number
/// unique among the live ones (their allocation's address).
#[derive(Debug, Default)]
pub struct PortTable {
    owners: HashMap<(u16, u16), Vec<Owner>>,
}

/// The process's port table.
pub fn port_table() -> MutexGuard<'static, PortTable> {
    static TABLE: LazyLock<Mutex<PortTable>> = LazyLock::new(Mutex::default);
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

impl PortTable {
    /// Why binding `id` to `ip`:`port` would fail, if it would;
    /// `reuseaddr`: the id's option (false: the listen-time check).
    fn conflict(
        &self,
        id: usize,
        space: u16,
        ip: IpAddr,
        port: u16,
        opts: BindOptions,
        reuseaddr: bool,
    ) -> Option<Error> {
        for o in self.owners.get(&(space, port))?.iter().filter(|o| o.id != id) {
            if reuseaddr && o.opts.reuseaddr {
                continue;
            }
            if opts.afonly && o.opts.afonly && ip.is_ipv4() != o.ip.is_ipv4() {
                continue;
            }
            if ip.is_unspecified() || o.ip.is_unspecified() {
                return Some(Error::AddrNotAvailable("the port is bound to the wildcard"));
            }
            if ip == o.ip {
                return Some(Error::InUse("the address and port are bound"));
            }
        }
        None
    }

    /// Binds `id` to `addr` in `space` (an unused port when `addr` names
    /// none: the port is written back), or says why not.
    ///
    /// # Errors
    /// [`Error::InUse`] (EADDRINUSE), [`Error::AddrNotAvailable`].
    pub fn claim(
        &mut self,
        id: usize,
        space: u16,
        addr: &mut SocketAddr,
        opts: BindOptions,
    ) -> Result<()> {
        if addr.port() == 0 {
            addr.set_port(self.ephemeral(space));
        }
        if let Some(e) = self.conflict(id, space, addr.ip(), addr.port(), opts, opts.reuseaddr) {
            return Err(e);
        }
        self.release(id);
        self.owners.entry((space, addr.port())).or_default().push(Owner {
            id,
            ip: addr.ip(),
            opts,
        });
        Ok(())
    }

    /// A port of `space` that no id owns.
    fn ephemeral(&self, space: u16) -> u16 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = ((t ^ std::process::id().rotate_left(7)) % 28000) as u16;
        (0..28000u16)
            .map(|i| 32768 + (start + i) % 28000)
            .find(|p| !self.owners.contains_key(&(space, *p)))
            .unwrap_or(32768 + start)
    }

    /// The listen-time check: a REUSEADDR id may share its port with
    /// others until it listens, never after (its REUSEADDR ends here, in
    /// `opts` too).
    ///
    /// # Errors
    /// [`Error::InUse`] when another id holds the port.
    pub fn listen(
        &mut self,
        id: usize,
        space: u16,
        addr: SocketAddr,
        opts: &mut BindOptions,
    ) -> Result<()> {
        if !opts.reuseaddr {
            return Ok(());
        }
        if self.conflict(id, space, addr.ip(), addr.port(), *opts, false).is_some() {
            return Err(Error::InUse("another id is bound to the port"));
        }
        opts.reuseaddr = false;
        if let Some(me) = self
            .owners
            .get_mut(&(space, addr.port()))
            .and_then(|v| v.iter_mut().find(|w| w.id == id))
        {
            me.opts.reuseaddr = false;
        }
        Ok(())
    }

    /// Forgets `id`'s port (the id is destroyed or rebound).
    pub fn release(&mut self, id: usize) {
        self.owners.retain(|_, v| {
            v.retain(|o| o.id != id);
            !v.is_empty()
        });
    }
}

/// Whether a wildcard-or-not local address `local` listens on a device
/// of address `dev`: a wildcard covers the devices of its family, an IPv6
/// one IPv4 devices too unless AFONLY.
pub fn listens_on(local: IpAddr, afonly: bool, dev: IpAddr) -> bool {
    if !local.is_unspecified() {
        return local == dev;
    }
    match local {
        IpAddr::V4(_) => dev.is_ipv4(),
        IpAddr::V6(_) => dev.is_ipv6() || !afonly,
    }
}

/// Which of the devices with addresses `devices` reaches `dst` from
/// `src`: the one with the source address when one is given; else the
/// one with the address the kernel would send from; else the first of
/// `dst`'s family.
pub fn device_for(devices: &[IpAddr], src: Option<IpAddr>, dst: IpAddr) -> Option<usize> {
    if let Some(s) = src.filter(|s| !s.is_unspecified()) {
        return devices.iter().position(|&d| d == s);
    }
    if let Some(s) = kernel_source_for(dst)
        && let Some(i) = devices.iter().position(|&d| d == s)
    {
        return Some(i);
    }
    devices.iter().position(|d| d.is_ipv4() == dst.is_ipv4())
}

/// Why a device cannot be bound at `ip`, as the kernel's CM says it: an
/// address of this host that no device has is ENODEV (no RDMA device on
/// that interface), any other EADDRNOTAVAIL.
pub fn unbindable(ip: IpAddr) -> Error {
    if UdpSocket::bind((ip, 0)).is_ok() {
        Error::NoDevice(format!("no uroce device has the address {ip}"))
    } else {
        Error::AddrNotAvailable("not an address of this host")
    }
}

/// The source address the kernel picks for `dst` (a connected UDP
/// socket's local address; nothing is sent).
fn kernel_source_for(dst: IpAddr) -> Option<IpAddr> {
    let any: SocketAddr = if dst.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect((dst, 9)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn binds_conflict_as_the_kernel_says() {
        let mut t = PortTable::default();
        let plain = BindOptions::default();
        t.claim(1, 0x106, &mut sa("10.0.0.1:7000"), plain).unwrap();
        let e = t.claim(2, 0x106, &mut sa("10.0.0.1:7000"), plain).unwrap_err();
        assert_eq!(e.errno(), libc::EADDRINUSE);
        let e = t.claim(2, 0x106, &mut sa("0.0.0.0:7000"), plain).unwrap_err();
        assert_eq!(e.errno(), libc::EADDRNOTAVAIL);
        // Another address, another port space: free.
        t.claim(2, 0x106, &mut sa("10.0.0.2:7000"), plain).unwrap();
        t.claim(3, 0x111, &mut sa("10.0.0.1:7000"), plain).unwrap();
        t.release(1);
        t.claim(4, 0x106, &mut sa("10.0.0.1:7000"), plain).unwrap();
    }

    #[test]
    fn reuseaddr_shares_until_one_listens() {
        let mut t = PortTable::default();
        let mut reuse = BindOptions { reuseaddr: true, afonly: false };
        t.claim(1, 0x106, &mut sa("10.0.0.1:7001"), reuse).unwrap();
        t.claim(2, 0x106, &mut sa("10.0.0.1:7001"), reuse).unwrap();
        let e = t.listen(1, 0x106, sa("10.0.0.1:7001"), &mut reuse).unwrap_err();
        assert_eq!(e.errno(), libc::EADDRINUSE);
        t.release(2);
        t.listen(1, 0x106, sa("10.0.0.1:7001"), &mut reuse).unwrap();
        assert!(!reuse.reuseaddr);
        let e = t.claim(
            3,
            0x106,
            &mut sa("10.0.0.1:7001"),
            BindOptions { reuseaddr: true, afonly: false },
        );
        assert!(e.is_err(), "a listener's port is its own");
    }

    #[test]
    fn an_unnamed_port_is_a_free_one() {
        let mut t = PortTable::default();
        let mut a = sa("10.0.0.1:0");
        t.claim(1, 0x106, &mut a, BindOptions::default()).unwrap();
        assert!((32768..60768).contains(&a.port()));
        let mut b = sa("10.0.0.1:0");
        t.claim(2, 0x106, &mut b, BindOptions::default()).unwrap();
        assert_ne!(a.port(), b.port());
    }

    #[test]
    fn devices_by_source_or_family() {
        let devs: Vec<IpAddr> = vec!["127.0.0.2".parse().unwrap(), "::1".parse().unwrap()];
        assert_eq!(
            device_for(&devs, Some("::1".parse().unwrap()), "::1".parse().unwrap()),
            Some(1)
        );
        assert_eq!(
            device_for(&devs, Some("127.0.0.9".parse().unwrap()), "127.0.0.2".parse().unwrap()),
            None
        );
        assert_eq!(device_for(&devs, None, "10.9.9.9".parse().unwrap()), Some(0));
        assert!(listens_on("::".parse().unwrap(), false, "127.0.0.2".parse().unwrap()));
        assert!(!listens_on("::".parse().unwrap(), true, "127.0.0.2".parse().unwrap()));
        assert!(!listens_on("127.0.0.1".parse().unwrap(), false, "127.0.0.2".parse().unwrap()));
    }
}
