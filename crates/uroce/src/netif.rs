//! Which network interface holds an address (for its MTU), via
//! `getifaddrs`.
//!
//! UNSAFE ISLAND (small): walking the C list `getifaddrs` returns.

use std::ffi::CStr;
use std::net::IpAddr;

/// The name of the interface that has `addr`, if any.
pub(crate) fn interface_of(addr: IpAddr) -> Option<String> {
    find(addr).map(|(name, _)| name)
}

/// Whether `addr` is on an interface that is up and running (the port
/// state a uroce device reports). 127.0.0.0/8 addresses other than the
/// listed ones live on `lo`, which is always up.
pub(crate) fn link_up(addr: IpAddr) -> bool {
    match find(addr) {
        Some((_, flags)) => {
            let want = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
            flags & want == want
        }
        None => addr.is_loopback(),
    }
}

/// The interface holding `addr`: its name and `ifa_flags`.
fn find(addr: IpAddr) -> Option<(String, u32)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return None;
    }
    let mut found = None;
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
        let a = match family {
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
        if a == addr {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
            found = Some((name, ifa.ifa_flags));
            break;
        }
    }
    // SAFETY: frees the list getifaddrs allocated, once.
    unsafe { libc::freeifaddrs(head) };
    // 127.0.0.2 and friends live on lo without being listed.
    found.or_else(|| {
        addr.is_loopback().then(|| ("lo".to_string(), (libc::IFF_UP | libc::IFF_RUNNING) as u32))
    })
}

/// The interface index of the interface that has `addr` (for IPv6
/// multicast membership).
pub(crate) fn index_of(addr: IpAddr) -> Option<u32> {
    let name = interface_of(addr)?;
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}
