//! Interfaces and their addresses, via `getifaddrs`: which interface holds
//! the device's address (its MTU, its link state) and which other addresses
//! it has (the GID table).
//!
//! UNSAFE ISLAND (small): walking the C list `getifaddrs` returns.

use std::ffi::CStr;
use std::net::IpAddr;

/// One address of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IfAddr {
    /// Interface name.
    pub(crate) name: String,
    /// The address.
    pub(crate) addr: IpAddr,
    /// `ifa_flags` (IFF_UP, IFF_RUNNING, …).
    pub(crate) flags: u32,
}

/// Every address of every interface, in the kernel's order.
pub(crate) fn all() -> Vec<IfAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid
        // until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr of the family it names.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: family AF_INET means a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6 means a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push(IfAddr { name, addr, flags: ifa.ifa_flags });
    }
    // SAFETY: frees the list getifaddrs allocated, once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The interface holding `addr` (name and flags) in `list`. 127.0.0.2 and
/// friends live on `lo` without being listed.
fn find(list: &[IfAddr], addr: IpAddr) -> Option<(String, u32)> {
    list.iter().find(|a| a.addr == addr).map(|a| (a.name.clone(), a.flags)).or_else(|| {
        addr.is_loopback().then(|| ("lo".to_string(), (libc::IFF_UP | libc::IFF_RUNNING) as u32))
    })
}

/// The name of the interface that has `addr`, if any.
pub(crate) fn interface_of(addr: IpAddr) -> Option<String> {
    find(&all(), addr).map(|(name, _)| name)
}

/// Whether `addr` is on an interface that is up and running (the port
/// state a uroce device reports).
pub(crate) fn link_up_in(list: &[IfAddr], addr: IpAddr) -> bool {
    match find(list, addr) {
        Some((_, flags)) => {
            let want = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
            flags & want == want
        }
        None => false,
    }
}

/// [`link_up_in`] on a fresh listing.
pub(crate) fn link_up(addr: IpAddr) -> bool {
    link_up_in(&all(), addr)
}

/// The other addresses of the interface that holds `addr`, in the kernel's
/// order (`addr` itself excluded).
pub(crate) fn siblings_in(list: &[IfAddr], addr: IpAddr) -> Vec<IpAddr> {
    let Some((name, _)) = find(list, addr) else { return Vec::new() };
    let mut out: Vec<IpAddr> = Vec::new();
    for a in list.iter().filter(|a| a.name == name && a.addr != addr) {
        if !out.contains(&a.addr) {
            out.push(a.addr);
        }
    }
    out
}

/// The interface index of the interface that has `addr` (for IPv6
/// multicast membership and link-local scope).
pub(crate) fn index_of(addr: IpAddr) -> Option<u32> {
    index_of_name(&interface_of(addr)?)
}

/// The index of interface `name`.
pub(crate) fn index_of_name(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}
