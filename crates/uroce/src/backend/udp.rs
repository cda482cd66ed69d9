//! The default backend: a kernel UDP socket on the device's address and
//! port. No root, no setup.
//!
//! UNSAFE ISLAND (small): `setsockopt`, `sendmsg`/`recvmsg` with control
//! messages, and `ppoll`, through libc; each call has its `// SAFETY:` note.
//!
//! Batching, as measured on this machine kind: a run of equal-sized packets
//! to one destination leaves in one `sendmsg` with `UDP_SEGMENT` (GSO), and
//! the receiving socket has `UDP_GRO`, so the run crosses loopback or veth
//! unsegmented and arrives in one `recvmsg` with the segment size in a
//! control message. A peer socket without `UDP_GRO` (kernel rxe) receives
//! ordinary packets: the kernel segments on delivery.
//!
//! Wire facts this relies on: an unconnected socket with `IP_PMTUDISC_DO`
//! makes Linux send IPv4 with DF and identification 0; segment `i` of a GSO
//! send gets identification `i`. The driver computes each packet's ICRC
//! with that ID, so every packet is exactly what an rxe peer accepts.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::share;
use uroce_transport::cm::Leftover;

/// The most segments one GSO send carries.
const MAX_SEGMENTS: usize = 64;
/// The most bytes one GSO send carries (the IP payload limit).
const MAX_GSO_BYTES: usize = 65000;

/// The device's sockets: one per local address in use (the configured
/// address first, then the GIDs a QP or AH has used), all on the device's
/// port, plus one per joined multicast group. Each local address is shared
/// with the other contexts of the device (a `SO_REUSEPORT` group and slot
/// table of its own, see `share`) if the configured one is.
#[derive(Debug)]
pub(crate) struct UdpBackend {
    ports: Vec<Port>,
    local: SocketAddr,
    gso: bool,
    /// The device's relay secret (its group's, see `share::Registry`).
    secret: u64,
    /// Which socket the next `recv` tries first (no socket starves).
    next_rx: usize,
    /// One socket per joined multicast group, bound to (group, port): a
    /// socket bound to a unicast address never sees multicast datagrams.
    groups: Vec<(IpAddr, UdpSocket)>,
    /// The ports this context's CM listens on, published in every shared
    /// address's table (an address bound later publishes them too).
    listening: Vec<u16>,
    /// Shared memory to the contexts on this host (see `shm`).
    local_path: Option<super::shm::LocalPath>,
    /// Packets taken from the local path in a row (the sockets get a turn
    /// after `LOCAL_STREAK`).
    local_streak: u32,
    /// Receive calls since the local path last delivered, and since the
    /// sockets were last read (see `recv_any`).
    since_local: u32,
    since_socket: u32,
    /// The CPU the last doorbell's sender ran on (see `shm::doorbell`).
    waker_cpu: Option<u64>,
}

/// How many packets in a row `recv` takes from the local path before it
/// looks at the sockets.
const LOCAL_STREAK: u32 = 16;
/// While the local path carries traffic (a packet within the last
/// `LOCAL_HOT` receive calls), the sockets are read on one call in
/// `SOCKET_EVERY` only: a `recvmsg` that finds nothing costs more than the
/// round trip through memory it would delay.
const LOCAL_HOT: u32 = 256;
const SOCKET_EVERY: u32 = 8;

/// One bound unicast socket.
#[derive(Debug)]
struct Port {
    sock: UdpSocket,
    ip: IpAddr,
    /// What the socket is bound to (with the scope of a link-local
    /// address): where this member's steering probes go.
    bound: SocketAddr,
    /// This context's part in the address's group, if it is shared.
    sharing: Option<Sharing>,
    /// Interface index for link-local addresses (0 otherwise).
    scope: u32,
    gro: bool,
    /// A receive reported an ICMP error (`IP_RECVERR`): its details wait
    /// in the socket's error queue.
    errors: std::cell::Cell<bool>,
}

/// `UDP_NO_CHECK6_RX` (linux/udp.h): not in the libc crate.
const UDP_NO_CHECK6_RX: libc::c_int = 102;

/// Accepts IPv6 datagrams with a zero UDP checksum, which Linux otherwise
/// drops (RFC 8200 forbids them, RFC 6936 allows them for tunnels): rxe
/// sends RoCEv2 over IPv6 with checksum 0, trusting the ICRC, and so may a
/// RoCE NIC.
fn accept_zero_checksum6(fd: i32) -> io::Result<()> {
    setsockopt_int(fd, libc::SOL_UDP, UDP_NO_CHECK6_RX, 1)
}

fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    setsockopt_val(fd, level, name, &value)
}

/// `setsockopt` with a plain C value (`int`, `in_addr`, `ip_mreq`, …).
fn setsockopt_val<T: Copy>(fd: i32, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live `T` for the duration of the call and its
    // size is passed exactly; `fd` is a socket owned by the caller.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            std::ptr::from_ref(value).cast::<libc::c_void>(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// A socket address in C form.
#[repr(C)]
union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

fn to_raw(a: SocketAddr) -> (RawAddr, libc::socklen_t) {
    // SAFETY: all-zero is a valid value for these plain C structs.
    let mut r: RawAddr = unsafe { zeroed() };
    match a {
        SocketAddr::V4(a) => {
            r.v4 = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
                sin_zero: [0; 8],
            };
            (r, size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            r.v6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            (r, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

fn from_raw(r: &RawAddr) -> Option<SocketAddr> {
    // SAFETY: both variants start with the family field; reading it through
    // the v4 variant is reading the common prefix.
    let family = i32::from(unsafe { r.v4.sin_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says the v4 variant was written.
            let a = unsafe { r.v4 };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the v6 variant was written.
            let a = unsafe { r.v6 };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Room for the control messages of one send (a GSO segment size and a
/// TOS) or one receive.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// A UDP socket bound to `addr` with socket option `reuse`
/// (`SO_REUSEPORT`: in the address's steered group; `SO_REUSEADDR`: one of
/// a multicast group's listeners) set before the bind.
fn bind_with(addr: SocketAddr, reuse: libc::c_int) -> io::Result<UdpSocket> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket() takes no pointers; the result is checked.
    let fd = unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns.
    let sock = unsafe { <UdpSocket as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    setsockopt_int(fd, libc::SOL_SOCKET, reuse, 1)?;
    let (raw, len) = to_raw(addr);
    // SAFETY: binds to a live sockaddr of the stated length.
    if unsafe { libc::bind(fd, (&raw const raw).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// Replaces the steering program of `sock`'s `SO_REUSEPORT` group.
fn attach_steering(sock: &UdpSocket, prog: &[share::Insn]) -> io::Result<()> {
    let mut filter: Vec<libc::sock_filter> = prog
        .iter()
        .map(|i| libc::sock_filter { code: i.code, jt: i.jt, jf: i.jf, k: i.k })
        .collect();
    let fprog = libc::sock_fprog {
        len: u16::try_from(filter.len()).map_err(|_| io::ErrorKind::InvalidInput)?,
        filter: filter.as_mut_ptr(),
    };
    setsockopt_val(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ATTACH_REUSEPORT_CBPF, &fprog)
}

/// How often a member looks for contexts that joined, left or died.
const CHECK_EVERY_NS: u64 = 100_000_000;
/// How soon after the last check a misrouted packet brings the next.
const SOON_NS: u64 = 5_000_000;
/// How long a probe round waits for its answers (a member that does not
/// read its socket meanwhile is left out of the table until the next).
const ROUND_LIMIT_NS: u64 = 200_000_000;

impl Drop for UdpBackend {
    fn drop(&mut self) {
        for port in std::mem::take(&mut self.ports).into_iter().rev() {
            port.close();
        }
    }
}

/// This context's part in sharing its address (see `share`).
#[derive(Debug)]
struct Sharing {
    registry: share::Registry,
    next_check_ns: u64,
    last_check_ns: u64,
    /// This member's probe round, while it runs.
    round: Option<Round>,
}

#[derive(Debug)]
struct Round {
    number: u32,
    /// Indices probed: the live members when it began.
    members: usize,
    generation: u64,
    /// When it began; `None` until the first tick sees the clock.
    started_ns: Option<u64>,
}

impl Sharing {
    /// A member that just joined (and was steered by the join itself, see
    /// `Registry::join`); the group is measured at the next check of any
    /// member.
    fn new(registry: share::Registry) -> Self {
        Self { registry, next_check_ns: 0, last_check_ns: 0, round: None }
    }

    /// Alone in the group: index 0, nothing to probe.
    fn steer_alone(&mut self, live: &[usize], sock: &UdpSocket) -> bool {
        if live != [self.registry.slot()] {
            return false;
        }
        let generation = self.registry.generation();
        let alone = [(self.registry.slot(), 0)];
        if self.registry.set_table(&alone, Some(generation), |p| {
            let _ = attach_steering(sock, p);
        }) {
            self.registry.set_measured(generation);
        }
        true
    }

    /// A packet for another member's QPN came here: the group changed
    /// (a member died or left) and the steering is stale, so look now
    /// rather than at the next periodic check.
    fn check_owner(&mut self, packet: &[u8]) {
        if let Some(b) = packet.get(4..8) {
            let qpn = u32::from_be_bytes([0, b[1], b[2], b[3]]);
            if qpn > 1 && (qpn >> share::QPN_SHIFT) as usize != self.registry.slot() {
                // Not every pass: a peer may keep sending to a QP whose
                // process is gone, and a check reads /proc.
                self.next_check_ns = self.next_check_ns.min(self.last_check_ns + SOON_NS);
            }
        }
    }

    /// Publishes the ports this context's CM listens on and steers their
    /// requests here.
    fn set_listening(&mut self, ports: &[u16], sock: &UdpSocket) -> bool {
        self.registry.set_listening(ports, |p| {
            let _ = attach_steering(sock, p);
        })
    }

    /// Advances the membership check and this member's round (cheap when
    /// neither is due).
    fn tick(&mut self, now_ns: u64, sock: &UdpSocket, local: SocketAddr) {
        if let Some(r) = &mut self.round {
            let started = *r.started_ns.get_or_insert(now_ns);
            let answered =
                (0..r.members).filter(|&k| self.registry.answer_of(r.number, k).is_some()).count();
            if answered == r.members || now_ns.saturating_sub(started) > ROUND_LIMIT_NS {
                self.finish_round(sock);
            }
            return;
        }
        if now_ns < self.next_check_ns {
            return;
        }
        self.next_check_ns = now_ns + CHECK_EVERY_NS;
        self.last_check_ns = now_ns;
        // Dead members' slots are taken back here (which bumps the
        // generation).
        let live = self.registry.live_slots();
        let generation = self.registry.generation();
        if generation == self.registry.measured() || self.steer_alone(&live, sock) {
            return;
        }
        // The file's indices as predicted for the change (a socket that
        // left is replaced by the last one; a new one is appended) steer
        // at once; the round then checks them.
        self.registry.steer(|p| {
            let _ = attach_steering(sock, p);
        });
        // Whoever gets the round lock measures; the others look again at
        // their next check.
        let Some(number) = self.registry.begin_round() else { return };
        self.round = Some(Round { number, members: live.len(), generation, started_ns: None });
        // Each probe leaves through the group's current program, which
        // sends it to the index it names.
        for k in 0..live.len() as u32 {
            let _ = sock.send_to(&share::probe(number, k), local);
        }
    }

    /// Attaches the program the round's answers call for, if every index
    /// answered, no slot twice, and nobody joined or left meanwhile; the
    /// round is then the group's measure. An incomplete round changes
    /// nothing: the table's predictions cover every member, and a table of
    /// the members that happened to answer would leave the others' packets
    /// to the kernel's hash (a busy member may not read its socket within
    /// the round's limit). The next check tries again.
    fn finish_round(&mut self, sock: &UdpSocket) {
        let Some(r) = self.round.take() else { return };
        let answers: Vec<(usize, u32)> = (0..r.members)
            .filter_map(|k| self.registry.answer_of(r.number, k).map(|s| (s, k as u32)))
            .collect();
        let mut slots: Vec<usize> = answers.iter().map(|a| a.0).collect();
        slots.sort_unstable();
        slots.dedup();
        let complete = slots.len() == r.members && answers.len() == r.members && r.members > 0;
        // Answers from before a join or leave would undo its prediction:
        // they are written only if the membership is still the round's.
        if complete
            && self.registry.set_table(&answers, Some(r.generation), |p| {
                let _ = attach_steering(sock, p);
            })
        {
            self.registry.set_measured(r.generation);
        }
        self.registry.end_round();
    }
}

impl UdpBackend {
    /// Binds to `addr` and enables GRO where the kernel has it. The
    /// address is shared with other contexts (`share`) unless
    /// `UROCE_EXCLUSIVE` is set or the run directory cannot hold the slot
    /// table; then the bind fails if another context has the address.
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<Self> {
        Self::bind_with(addr, std::env::var_os("UROCE_EXCLUSIVE").is_none(), true)
    }

    /// [`UdpBackend::bind`], sharing the address with other contexts only
    /// if `share` (a second exclusive bind fails with `EADDRINUSE`), and
    /// without an inbox for the local path: for a backend that reads its
    /// packets elsewhere and keeps this one for what the kernel brings.
    pub(crate) fn bind_with_sharing(addr: SocketAddr, share: bool) -> io::Result<Self> {
        Self::bind_with(addr, share, false)
    }

    fn bind_with(addr: SocketAddr, share: bool, inbox: bool) -> io::Result<Self> {
        let table = if share && addr.port() != 0 {
            // Bound while the table is locked (see `Registry::join`).
            share::Registry::join(
                addr,
                || Port::bind(addr, 0, true),
                |port, prog| {
                    let _ = attach_steering(&port.sock, prog);
                },
            )
            .ok()
        } else {
            None
        };
        let (registry, port) = match table {
            Some(joined) => {
                let (r, port) = joined?;
                (Some(r), port)
            }
            // No usable table: the address is this context's alone.
            None => (None, Port::bind(addr, 0, false)?),
        };
        let mut port = port;
        let local = port.bound;
        // Senders find an inbox by the slot their packet's QPN names; a
        // context alone on its address (exclusive, or no slot table) numbers
        // its QPs from the start of slot 0's range, and owns that inbox.
        let local_path = (inbox && super::shm::enabled())
            .then(|| super::shm::LocalPath::new(local, registry.as_ref().map_or(0, |r| r.slot())))
            .and_then(Result::ok);
        // The relay datagrams between the address's contexts end with a
        // secret only they (its user) can read.
        let secret = registry.as_ref().map_or(0, share::Registry::secret);
        port.sharing = registry.map(Sharing::new);
        let gso = std::env::var_os("UROCE_NO_GSO").is_none();
        let listening = Vec::new();
        Ok(Self {
            ports: vec![port],
            local,
            gso,
            next_rx: 0,
            groups: Vec::new(),
            listening,
            local_path,
            local_streak: 0,
            since_local: LOCAL_HOT,
            since_socket: 0,
            waker_cpu: None,
            secret,
        })
    }

    /// The configured address's part in its group, if it is shared.
    fn sharing(&self) -> Option<&Sharing> {
        self.ports.first().and_then(|p| p.sharing.as_ref())
    }

    /// The socket bound to the device's address and port (what the AF_XDP
    /// broker checks a context holds before steering that port to it).
    pub(crate) fn device_socket(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.ports[0].sock.as_fd()
    }

    /// This context's slot on a shared address, and whether another
    /// member runs now; `None` when the address is this context's alone.
    pub(crate) fn slot(&self) -> Option<(usize, bool)> {
        self.sharing().map(|s| (s.registry.slot(), s.registry.others_alive()))
    }

    /// Binds another local address of the device (a GID in use) on the
    /// device's port; a no-op if it is bound already.
    fn bind_local_addr(&mut self, ip: IpAddr) -> io::Result<()> {
        if self.ports.iter().any(|p| p.ip == ip) {
            return Ok(());
        }
        let scope = if crate::gid::is_link_local(ip) {
            crate::netif::index_of(ip).ok_or(io::ErrorKind::AddrNotAvailable)?
        } else {
            0
        };
        let addr = SocketAddr::new(ip, self.local.port());
        // Shared like the configured address, in the slot that names this
        // context's QPNs; alone if that slot is another's here (a context
        // of another device using this address) or the table cannot be
        // used.
        let joined = self.sharing().map(|s| {
            share::Registry::join_as(
                addr,
                s.registry.slot(),
                || Port::bind(addr, scope, true),
                |port, prog| {
                    let _ = attach_steering(&port.sock, prog);
                },
            )
        });
        let port = match joined {
            Some(Ok(bound)) => {
                let (registry, mut port) = bound?;
                if let Some(lp) = self.local_path.as_mut() {
                    // Best effort: without it, packets to this address
                    // take UDP.
                    let _ = lp.add_address(addr, registry.slot());
                }
                let mut sharing = Sharing::new(registry);
                if !self.listening.is_empty() {
                    sharing.set_listening(&self.listening, &port.sock);
                }
                port.sharing = Some(sharing);
                port
            }
            Some(Err(e)) if e.kind() == io::ErrorKind::AddrInUse => return Err(e),
            _ => Port::bind(addr, scope, false)?,
        };
        self.ports.push(port);
        Ok(())
    }

    /// Closes the socket of a local address that went away (never the
    /// configured one).
    fn unbind_local_addr(&mut self, ip: IpAddr) {
        if let Some(i) = self.ports.iter().skip(1).position(|p| p.ip == ip) {
            if let Some(lp) = self.local_path.as_mut() {
                lp.remove_address(ip);
            }
            self.ports.remove(i + 1).close();
            self.next_rx = 0;
        }
    }

    /// Joins multicast `group` on the device's interface.
    fn join_group(&mut self, group: IpAddr) -> io::Result<()> {
        if self.groups.iter().any(|(g, _)| *g == group) {
            return Ok(());
        }
        // SO_REUSEADDR before bind, so that several contexts (and
        // processes) on this host can listen to one group.
        let sock = bind_with(SocketAddr::new(group, self.local.port()), libc::SO_REUSEADDR)?;
        let fd = sock.as_raw_fd();
        match (group, self.local.ip()) {
            (IpAddr::V4(g), IpAddr::V4(local)) => {
                let mreq = libc::ip_mreq {
                    imr_multiaddr: libc::in_addr { s_addr: u32::from(g).to_be() },
                    imr_interface: libc::in_addr { s_addr: u32::from(local).to_be() },
                };
                setsockopt_val(fd, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &mreq)?;
            }
            (IpAddr::V6(g), _) => {
                let ifindex = crate::netif::index_of(self.local.ip()).unwrap_or(0);
                let mreq = libc::ipv6_mreq {
                    ipv6mr_multiaddr: libc::in6_addr { s6_addr: g.octets() },
                    ipv6mr_interface: ifindex,
                };
                setsockopt_val(fd, libc::IPPROTO_IPV6, libc::IPV6_ADD_MEMBERSHIP, &mreq)?;
                accept_zero_checksum6(fd)?;
            }
            _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
        }
        sock.set_nonblocking(true)?;
        self.groups.push((group, sock));
        Ok(())
    }

    /// Leaves multicast `group` (closing its socket drops the membership).
    fn leave_group(&mut self, group: IpAddr) {
        self.groups.retain(|(g, _)| *g != group);
    }

    /// Receives from the joined groups: `(bytes, sender, group)`.
    fn recv_from_groups(&self, buf: &mut [u8]) -> Option<(usize, SocketAddr, IpAddr)> {
        for (g, s) in &self.groups {
            if let Ok((n, from)) = s.recv_from(buf) {
                return Some((n, from, *g));
            }
        }
        None
    }

    /// Every descriptor to wait on.
    fn fds(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.ports.iter().map(|p| p.sock.as_raw_fd()).collect();
        v.extend(self.groups.iter().map(|(_, s)| s.as_raw_fd()));
        v
    }

    /// Receives one datagram (with GRO, possibly a run of packets) into
    /// `buf`: `(bytes, segment size, sender, local address it came to)`, or
    /// `None` when none waits on any socket. Probes of the shared group's
    /// steering (sent by a member, so from the device's own address) are
    /// answered here, not delivered; at most `MAX_PROBES` per call, so
    /// that a flood of datagrams that look like probes cannot hold it.
    fn recv_any(&mut self, buf: &mut [u8]) -> io::Result<Option<super::Received>> {
        const MAX_PROBES: usize = 2 * share::SLOTS;
        let local_first = self.local_streak < LOCAL_STREAK;
        if local_first && let Some(r) = self.recv_local(buf) {
            self.local_streak += 1;
            self.since_local = 0;
            return Ok(Some(r));
        }
        self.local_streak = 0;
        self.since_local = self.since_local.saturating_add(1);
        self.since_socket = self.since_socket.saturating_add(1);
        if local_first && self.since_local < LOCAL_HOT && self.since_socket < SOCKET_EVERY {
            return Ok(None);
        }
        self.since_socket = 0;
        for _ in 0..MAX_PROBES {
            let Some((i, r)) = self.recv_datagram(buf)? else {
                return Ok(if local_first { None } else { self.recv_local(buf) });
            };
            if super::shm::is_doorbell(&buf[..r.len]) {
                // It woke us; the packets are in the inbox.
                self.waker_cpu = super::shm::doorbell_cpu(&buf[..r.len]);
                continue;
            }
            let Some(sharing) = &mut self.ports[i].sharing else {
                return Ok(Some(r));
            };
            if r.from.ip() == r.to
                && let Some((round, index)) = share::parse_probe(&buf[..r.len])
            {
                sharing.registry.answer_probe(round, index);
                continue;
            }
            sharing.check_owner(&buf[..r.len]);
            return Ok(Some(r));
        }
        Ok(None)
    }

    /// The next packet of the local path.
    fn recv_local(&mut self, buf: &mut [u8]) -> Option<super::Received> {
        let (len, m) = self.local_path.as_mut()?.recv(buf)?;
        Some(super::Received { len, seg: len, from: m.from, to: m.to, ip_id: None, local: true })
    }

    /// The next datagram of any socket, taking them in turn, with the
    /// index of the port it came to.
    fn recv_datagram(&mut self, buf: &mut [u8]) -> io::Result<Option<(usize, super::Received)>> {
        let n = self.ports.len();
        for k in 0..n {
            let i = (self.next_rx + k) % n;
            let port = &self.ports[i];
            match port.recv(buf) {
                Ok(Some((len, seg, from))) => {
                    self.next_rx = (i + 1) % n;
                    let r =
                        super::Received { len, seg, from, to: port.ip, ip_id: None, local: false };
                    return Ok(Some((i, r)));
                }
                Ok(None) => {}
                Err(e) if i == 0 => return Err(e),
                // A secondary address's error (it went away) is not the
                // device's.
                Err(_) => {}
            }
        }
        Ok(None)
    }
}

impl super::Backend for UdpBackend {
    fn relay_secret(&self) -> u64 {
        self.secret
    }

    fn local(&self) -> SocketAddr {
        self.local
    }

    fn qpn_range(&self) -> (u32, u32) {
        self.sharing().map_or((0, 0), |s| {
            ((s.registry.slot() as u32) << share::QPN_SHIFT, s.registry.qpn_start())
        })
    }

    fn tick(&mut self, now_ns: u64) {
        if let Some(lp) = self.local_path.as_mut() {
            let sock = &self.ports[0].sock;
            lp.tick(now_ns, &mut |dst, qpn| {
                let _ = sock.send_to(&super::shm::doorbell(qpn), dst);
            });
        }
        for p in &mut self.ports {
            if let Some(sharing) = &mut p.sharing {
                sharing.tick(now_ns, &p.sock, p.bound);
            }
        }
    }

    fn cm_id_prefix(&self) -> Option<(u32, u32)> {
        self.sharing().map(|s| (s.registry.slot() as u32, share::COMM_ID_SLOT_BITS))
    }

    fn set_listening(&mut self, ports: &[u16]) -> bool {
        let Some((first, rest)) = self.ports.split_first_mut() else { return true };
        let Some(sharing) = &mut first.sharing else { return true };
        if !sharing.set_listening(ports, &first.sock) {
            return false;
        }
        // The configured address decides (a port has one listener among
        // the device's contexts); the others follow it.
        for p in rest {
            if let Some(s) = &mut p.sharing {
                s.set_listening(ports, &p.sock);
            }
        }
        self.listening = ports.to_vec();
        true
    }

    fn listened_elsewhere(&mut self) -> Vec<u16> {
        self.sharing().map_or_else(Vec::new, |s| s.registry.listened_by_others())
    }

    fn publish_connections(&mut self, conns: &[Leftover]) -> bool {
        self.sharing().is_none_or(|s| s.registry.publish_connections(conns).is_ok())
    }

    fn take_leftovers(&mut self) -> Vec<Leftover> {
        match self.ports.first_mut().and_then(|p| p.sharing.as_mut()) {
            Some(s) => s.registry.take_leftovers(),
            None => Vec::new(),
        }
    }

    fn is_local(&mut self, dst: SocketAddr, qpn: u32) -> bool {
        self.local_path.as_mut().is_some_and(|lp| lp.reaches(dst, qpn))
    }

    fn batch(&self) -> super::SendBatch {
        if self.gso {
            super::SendBatch { segments: MAX_SEGMENTS, bytes: MAX_GSO_BYTES }
        } else {
            super::SendBatch { segments: 1, bytes: MAX_GSO_BYTES }
        }
    }

    fn send(
        &mut self,
        from: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
        tos: u8,
    ) -> io::Result<()> {
        // One packet, or (with `seg` < `data.len()`) a run of `seg`-byte
        // packets, the last possibly shorter, as one GSO send. `WouldBlock`
        // means the socket buffer is full: the caller counts the packets as
        // lost (the transport retransmits). A source not bound yet is
        // bound now. The socket's port is the source port (as
        // `source_port` says).
        let src = from.ip();
        let i = match self.ports.iter().position(|p| p.ip == src) {
            Some(i) => i,
            None => {
                self.bind_local_addr(src)?;
                self.ports.len() - 1
            }
        };
        if let Some(lp) = self.local_path.as_mut() {
            match lp.send(from, dst, data, seg) {
                super::shm::Sent::NotLocal => {}
                super::shm::Sent::Written(wake) => {
                    if let Some(qpn) = wake {
                        // Best effort: a lost doorbell costs the receiver
                        // its sleep's timeout, not the packets.
                        let _ = self.ports[i].sock.send_to(&super::shm::doorbell(qpn), dst);
                    }
                    return Ok(());
                }
                super::shm::Sent::Full => return Err(io::ErrorKind::WouldBlock.into()),
            }
        }
        let port = &self.ports[i];
        let dst = match dst {
            // A link-local destination is reached through the interface
            // of the address we send from.
            SocketAddr::V6(d) if d.scope_id() == 0 && crate::gid::is_link_local(dst.ip()) => {
                SocketAddr::V6(SocketAddrV6::new(*d.ip(), d.port(), d.flowinfo(), port.scope))
            }
            d => d,
        };
        let gso = (seg < data.len() && self.gso).then_some(seg);
        if gso.is_none() && tos == 0 {
            let r = port.sock.send_to(data, dst).map(|_| ());
            // A failed send may leave an entry in the error queue
            // (`IP_RECVERR`), which keeps the socket readable until read.
            port.errors.set(port.errors.get() || r.is_err());
            return r;
        }
        let r = port.send_msg(dst, data, gso, tos);
        port.errors.set(port.errors.get() || r.is_err());
        if gso.is_some()
            && let Err(e) = &r
            && matches!(
                e.raw_os_error(),
                Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
            )
        {
            // No GSO here: later runs go one packet per send. These packets'
            // ICRCs assumed GSO's IP IDs, so they are lost (and resent).
            self.gso = false;
        }
        r
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<super::Received>> {
        self.recv_any(buf)
    }

    fn raw_fds(&self) -> Vec<i32> {
        self.fds()
    }

    fn take_waker_cpu(&mut self) -> Option<u64> {
        self.waker_cpu.take()
    }

    fn prepare_sleep(&mut self) -> bool {
        // What wakes the thread is on a socket (a doorbell, a remote
        // packet): the next receive reads them first.
        self.since_socket = SOCKET_EVERY;
        self.local_path.as_mut().is_none_or(super::shm::LocalPath::prepare_sleep)
    }

    fn at_exit(&mut self) {
        self.local_path = None;
        for port in self.ports.iter_mut().rev() {
            port.leave_group();
        }
    }

    fn add_counters(&self, stats: &mut uroce_transport::Stats) {
        if let Some(c) = self.local_path.as_ref().map(super::shm::LocalPath::counters) {
            c.add_to(stats);
        }
    }

    fn bind_local(&mut self, ip: IpAddr) -> io::Result<()> {
        self.bind_local_addr(ip)
    }

    fn unbind_local(&mut self, ip: IpAddr) {
        self.unbind_local_addr(ip);
    }

    fn join(&mut self, group: IpAddr) -> io::Result<()> {
        self.join_group(group)
    }

    fn leave(&mut self, group: IpAddr) {
        self.leave_group(group);
    }

    fn unreachable(&mut self, out: &mut Vec<SocketAddr>) {
        for p in &self.ports {
            if p.errors.replace(false) {
                p.drain_errors(out);
            }
        }
    }

    fn recv_group(&mut self, buf: &mut [u8]) -> Option<(usize, SocketAddr, IpAddr)> {
        self.recv_from_groups(buf)
    }
}

impl Port {
    /// A non-blocking socket bound to `addr` with the options the data
    /// path needs.
    /// With `shared`, the socket joins the address's `SO_REUSEPORT` group
    /// (see `share`): other contexts may bind the address too.
    fn bind(addr: SocketAddr, scope: u32, shared: bool) -> io::Result<Self> {
        let addr = match addr {
            SocketAddr::V6(a) if scope != 0 => {
                SocketAddr::V6(SocketAddrV6::new(*a.ip(), a.port(), 0, scope))
            }
            a => a,
        };
        let sock =
            if shared { bind_with(addr, libc::SO_REUSEPORT)? } else { UdpSocket::bind(addr)? };
        sock.set_nonblocking(true)?;
        let fd = sock.as_raw_fd();
        match addr.ip() {
            IpAddr::V4(ip) => {
                setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
                // Multicast sends leave from the device's address.
                let a = libc::in_addr { s_addr: u32::from(ip).to_be() };
                let _ = setsockopt_val(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &a);
            }
            IpAddr::V6(_) => {
                setsockopt_int(
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IP_PMTUDISC_DO,
                )?;
                accept_zero_checksum6(fd)?;
            }
        }
        // Deep buffers: a window's burst must not be dropped by the socket
        // (the kernel caps these at net.core.*mem_max).
        // With CAP_NET_ADMIN the *FORCE options pass that cap: a receiver
        // descheduled on a busy host then loses nothing (UC and UD have no
        // retransmission to hide a socket overflow).
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20).is_err() {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20);
        }
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 8 << 20).is_err() {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 8 << 20);
        }
        let gro = std::env::var_os("UROCE_NO_GRO").is_none()
            && setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        // ICMP errors (a peer whose port is closed: its process is gone)
        // are reported, and read from the error queue (`unreachable`).
        let _ = match addr.ip() {
            IpAddr::V4(_) => setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVERR, 1),
            IpAddr::V6(_) => setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVERR, 1),
        };
        let bound = sock.local_addr()?;
        let errors = std::cell::Cell::new(false);
        Ok(Self { sock, ip: addr.ip(), bound, sharing: None, scope, gro, errors })
    }

    /// Leaves the address's group (as [`Port::close`] does) but keeps the
    /// socket: for the exit hook, whose process may still send and
    /// receive until it ends.
    fn leave_group(&mut self) {
        if let Some(s) = self.sharing.take() {
            s.registry.leave(|prog| {
                let _ = attach_steering(&self.sock, prog);
            });
        }
    }

    /// Closes the socket; a shared address's under its table's lock, after
    /// steering the group as it will be without it (`Registry::leave`).
    fn close(mut self) {
        if let Some(s) = self.sharing.take() {
            s.registry.leave(move |prog| {
                let _ = attach_steering(&self.sock, prog);
                drop(self);
            });
        }
    }

    /// Reads the socket's error queue: the destinations that answered
    /// "port unreachable" (`ECONNREFUSED`), appended to `out`.
    fn drain_errors(&self, out: &mut Vec<SocketAddr>) {
        for _ in 0..64 {
            let mut byte = [0u8; 1];
            let mut refused = false;
            let r = self.recv_msg(&mut byte, libc::MSG_ERRQUEUE, |level, kind, data| {
                let recverr = (level == libc::IPPROTO_IP && kind == libc::IP_RECVERR)
                    || (level == libc::IPPROTO_IPV6 && kind == libc::IPV6_RECVERR);
                // A `sock_extended_err` starts with its `ee_errno` (u32).
                if recverr && let Some(errno) = data.get(..4) {
                    let errno = u32::from_ne_bytes(errno.try_into().unwrap_or_default());
                    refused |= errno == libc::ECONNREFUSED as u32;
                }
            });
            let Ok((_, addr)) = r else { return };
            if refused && let Some(dst) = from_raw(&addr) {
                out.push(dst);
            }
        }
    }

    /// One non-blocking `recvmsg` into `buf` with room for control
    /// messages: the byte count and the sender's raw address. Each control
    /// message is handed to `each` as (level, type, payload).
    fn recv_msg(
        &self,
        buf: &mut [u8],
        flags: libc::c_int,
        mut each: impl FnMut(libc::c_int, libc::c_int, &[u8]),
    ) -> io::Result<(usize, RawAddr)> {
        // SAFETY: all-zero is a valid value for these C structs.
        let mut addr: RawAddr = unsafe { zeroed() };
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut cbuf = CmsgBuf([0; 64]);
        // SAFETY: all-zero is a valid msghdr.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = (&raw mut addr).cast();
        msg.msg_namelen = size_of::<RawAddr>() as libc::socklen_t;
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.0.len() as _;
        // SAFETY: every pointer in msg refers to a live buffer of the stated
        // size; the kernel writes within them.
        let n = unsafe {
            libc::recvmsg(self.sock.as_raw_fd(), &raw mut msg, flags | libc::MSG_DONTWAIT)
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let control_end =
            cbuf.0.as_ptr() as usize + (msg.msg_controllen as usize).min(cbuf.0.len());
        // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG_*
        // macros walk within them, and each payload runs from CMSG_DATA to
        // the end of its message (cmsg_len), cut at the control data's end.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
            while !c.is_null() {
                let head = libc::CMSG_LEN(0) as usize;
                let at = libc::CMSG_DATA(c);
                let len = ((*c).cmsg_len as usize)
                    .saturating_sub(head)
                    .min(control_end.saturating_sub(at as usize));
                let data = std::slice::from_raw_parts(at, len);
                each((*c).cmsg_level, (*c).cmsg_type, data);
                c = libc::CMSG_NXTHDR(&raw const msg, c);
            }
        }
        Ok((n as usize, addr))
    }

    /// One send with control messages: a GSO run of `gso`-byte packets
    /// (`UDP_SEGMENT`) and/or a TOS / traffic class other than 0.
    fn send_msg(
        &self,
        dst: SocketAddr,
        data: &[u8],
        gso: Option<usize>,
        tos: u8,
    ) -> io::Result<()> {
        let (mut addr, alen) = to_raw(dst);
        let mut iov =
            libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        let mut cbuf = CmsgBuf([0; 64]);
        // SAFETY: all-zero is a valid msghdr.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = (&raw mut addr).cast();
        msg.msg_namelen = alen;
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        let (tos_level, tos_type) = match dst {
            SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_TOS),
            SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
        };
        // (level, type, payload): a u16 segment size, an int TOS.
        let seg = gso.map(|s| (s as u16).to_ne_bytes());
        let class = i32::from(tos).to_ne_bytes();
        let cmsgs: [Option<(i32, i32, &[u8])>; 2] = [
            seg.as_ref().map(|b| (libc::SOL_UDP, libc::UDP_SEGMENT, &b[..])),
            (tos != 0).then_some((tos_level, tos_type, &class[..])),
        ];
        // SAFETY: CMSG_SPACE only computes a size.
        let space = |len: usize| unsafe { libc::CMSG_SPACE(len as u32) } as usize;
        msg.msg_controllen = cmsgs.iter().flatten().map(|c| space(c.2.len())).sum::<usize>() as _;
        // SAFETY: the control buffer is 64 aligned bytes, more than
        // CMSG_SPACE(2) + CMSG_SPACE(4) = 48, so each header CMSG_FIRSTHDR
        // and CMSG_NXTHDR hand out is non-null, and it and its 2- or
        // 4-byte payload lie inside the buffer's first msg_controllen
        // bytes.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
            for &(level, kind, payload) in cmsgs.iter().flatten() {
                (*c).cmsg_level = level;
                (*c).cmsg_type = kind;
                (*c).cmsg_len = libc::CMSG_LEN(payload.len() as u32) as _;
                std::ptr::copy_nonoverlapping(payload.as_ptr(), libc::CMSG_DATA(c), payload.len());
                c = libc::CMSG_NXTHDR(&raw const msg, c);
            }
        }
        // SAFETY: msg points to live address, iovec (over `data`) and
        // control buffers for the duration of the call.
        let r = unsafe { libc::sendmsg(self.sock.as_raw_fd(), &raw const msg, 0) };
        if r >= 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    /// A receive's error: an ICMP error reported on the socket (its
    /// details wait in the error queue) is not the socket's failure.
    fn icmp_error(&self, e: io::Error) -> io::Result<Option<(usize, usize, SocketAddr)>> {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH) => {
                self.errors.set(true);
                Ok(None)
            }
            _ => Err(e),
        }
    }

    /// Receives one datagram (with GRO, possibly a run of packets) into
    /// `buf`: `(bytes, segment size, sender)`, or `None` when none waits.
    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, usize, SocketAddr)>> {
        if !self.gro {
            return match self.sock.recv_from(buf) {
                Ok((n, from)) => Ok(Some((n, n, from))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                Err(e) => self.icmp_error(e),
            };
        }
        let mut seg = 0;
        let r = self.recv_msg(buf, 0, |level, kind, data| {
            if level == libc::SOL_UDP
                && kind == libc::UDP_GRO
                && let Some(s) = data.get(..4)
            {
                seg = i32::from_ne_bytes(s.try_into().unwrap_or_default());
            }
        });
        let (n, addr) = match r {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return self.icmp_error(e),
        };
        let seg = if seg > 0 { seg as usize } else { n };
        let Some(from) = from_raw(&addr) else { return Ok(None) };
        Ok(Some((n, seg, from)))
    }
}

/// Blocks until descriptor `fd` is readable or `timeout` passes. Takes a
/// bare number so that a sleeping progress thread keeps no reference to the
/// socket: if the context is closed meanwhile, the poll returns at once
/// (POLLNVAL) or at the timeout, and never touches memory. False when the
/// timeout or a signal ended it.
pub(crate) fn wait_readable(fds: &[i32], timeout: Option<Duration>) -> bool {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let tp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` holds `len` valid pollfds; `tp` is null or points to
    // a timespec alive across the call; no signal mask is passed.
    let n =
        unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, tp, std::ptr::null()) };
    // A signal (EINTR) ended the wait: no descriptor is readable.
    n > 0
}

#[cfg(test)]
mod tests {
    use super::super::Backend;
    use super::*;

    /// Two contexts each alone on its address (`UROCE_EXCLUSIVE`) own slot
    /// 0's inboxes, and their packets go through memory: no ICRC, and
    /// counted by the local path.
    #[test]
    fn exclusive_contexts_have_inboxes_too() {
        if !super::super::shm::enabled() {
            return;
        }
        let port = crate::testing::free_port();
        let at = SocketAddr::new("127.0.0.1".parse().unwrap(), port);
        let from = SocketAddr::new("127.0.0.2".parse().unwrap(), port);
        let mut rx = UdpBackend::bind_with(at, false, true).unwrap();
        let mut tx = UdpBackend::bind_with(from, false, true).unwrap();
        assert!(rx.sharing().is_none() && tx.sharing().is_none(), "exclusive binds");
        let qpn = 0x11u32;
        assert!(tx.is_local(at, qpn), "slot 0's inbox found");
        let mut pkt = vec![0u8; 64];
        pkt[4..8].copy_from_slice(&qpn.to_be_bytes());
        tx.send(from, at, &pkt, pkt.len(), 0).unwrap();
        let mut buf = vec![0u8; 4096];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let got = loop {
            if let Some(r) = rx.recv(&mut buf).unwrap() {
                break r;
            }
            assert!(std::time::Instant::now() < deadline, "nothing arrived");
        };
        assert!(got.local && got.len == 64 && got.from == from && got.to == at.ip());
        let mut stats = uroce_transport::Stats::default();
        rx.add_counters(&mut stats);
        assert_eq!(stats.local_rcvd_pkts, 1);
        // The bind that shares nothing and reads elsewhere (AF_XDP's) has
        // no inbox.
        let other = SocketAddr::new("127.0.0.1".parse().unwrap(), crate::testing::free_port());
        let mut xdp_side = UdpBackend::bind_with_sharing(other, false).unwrap();
        assert!(!tx.is_local(other, qpn) && !xdp_side.is_local(at, qpn));
    }
}
