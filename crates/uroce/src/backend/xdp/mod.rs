//! The AF_XDP backend (`UROCE_BACKEND=xdp`): RoCEv2 frames built and
//! parsed in user space and moved by an AF_XDP socket on the device's
//! interface, bypassing the kernel's UDP stack, on the wire the same as
//! the `udp` backend (so the two, kernel rxe and RoCE NICs interoperate).
//!
//! An XDP program of our own (`bpf`) steers UDP datagrams to the device's
//! port into the socket and passes everything else to the kernel, which
//! keeps answering ARP, neighbour discovery and ping. Around the socket
//! sits a `udp` backend on the same address, exclusive: it receives what
//! the program passes on (IPv4 with options, fragments, queues without a
//! socket), sends where no MAC is known yet (which also makes the kernel
//! resolve it), and keeps multicast, extra addresses and ICMP errors as
//! the `udp` backend has them.
//!
//! Needs `CAP_NET_RAW`, `CAP_NET_ADMIN` and `CAP_BPF` (or root), or the
//! interface's broker (`broker`, `uroce setup xdp IFACE`), which opens the
//! sockets and attaches the program for contexts without them. Copy mode
//! (veth and most drivers have no zero-copy), a socket on every receive
//! queue, frames in several 4 KiB chunks where the kernel has multi-buffer
//! sockets (Linux 6.6; RoCE MTU 4096 on links of MTU 4200 and more; else
//! frames of one chunk, RoCE MTU 2048 at most), IPv4 and IPv6.
//!
//! Shared devices: an interface takes one XDP program, so the first
//! context on it owns the sockets, and its program takes only the QPNs of
//! the owner's slot; a later context of the device (another process, no
//! privilege needed) finds the program there and is a plain `udp` member
//! of the device's group, its datagrams passed to the kernel and steered
//! to it by QPN. `UROCE_XDP_STATS=1` prints the sockets' counters when the
//! backend closes.

mod bpf;
pub(crate) mod broker;
mod fdpass;
mod neigh;
mod netlink;
mod xsk;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use super::udp::UdpBackend;
use super::{Backend, Received, SendBatch, frame};

/// Whether devices use this backend (`UROCE_BACKEND=xdp`).
pub(crate) fn selected() -> bool {
    std::env::var("UROCE_BACKEND").as_deref() == Ok("xdp")
}

/// A socket was refused multi-buffer (`XDP_USE_SG`): frames must fit a
/// chunk.
static ONE_CHUNK_FRAMES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The largest IP packet the sockets take (the port's MTU is capped to
/// it): several chunks' worth, or one chunk's (RoCE MTU 2048 at most)
/// where the kernel has no multi-buffer sockets.
pub(crate) fn max_ip_packet() -> usize {
    let one = ONE_CHUNK_FRAMES.load(std::sync::atomic::Ordering::Relaxed);
    (if one { xsk::MAX_RX_FRAME } else { xsk::MAX_FRAME }) - 14
}

/// The AF_XDP backend of one context.
#[derive(Debug)]
pub(crate) struct XdpBackend {
    udp: UdpBackend,
    // The sockets before the program: closed first. One per receive queue
    // of the interface (a frame arrives on one queue, and only a socket
    // bound to that queue sees it); the first also transmits.
    xsks: Vec<xsk::Xsk>,
    /// The socket `recv` looks at first (they take turns).
    next_rx: usize,
    /// What keeps the program attached: closing it detaches it.
    _program: Program,
    src_mac: [u8; 6],
    port: u16,
    neigh: neigh::Neighbours,
    /// The destination `source_port` was last asked about, and when.
    asked: Option<(IpAddr, Instant)>,
    counters: Counters,
    /// Where a frame longer than a chunk is built before it is cut into
    /// chunks (`xsk::MAX_FRAME` bytes, allocated once).
    long_frame: Vec<u8>,
}

/// The steering program of an interface, attached: dropping it detaches
/// the program.
#[derive(Debug)]
pub(crate) struct Steering {
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
}

/// Whose the interface's program is (held for its drop alone).
#[derive(Debug)]
#[expect(dead_code, reason = "held only to be dropped")]
enum Program {
    /// Attached by this process.
    Own(Steering),
    /// Attached by the broker for as long as this connection is open.
    Brokered(std::os::unix::net::UnixStream),
}

/// The interface's receive queues (a socket is bound to each).
fn queues(iface: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{iface}/queues"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count() as u32
        })
        .unwrap_or(1)
        .max(1)
}

/// Loads the steering program for `addr` (`slot`'s QPNs, on a shared
/// device), attaches it to `iface` (native mode where the driver has it,
/// else generic) and binds a socket to each receive queue, in its map.
/// An error names the step that failed, with the system's error.
pub(crate) fn steer(
    iface: &str,
    ifindex: u32,
    addr: SocketAddr,
    slot: Option<u32>,
    busy_poll: Option<u32>,
) -> Result<(Steering, Vec<xsk::Bound>), (String, io::Error)> {
    let queues = queues(iface);
    let map = bpf::create_xskmap(queues).map_err(|e| ("creating the XSKMAP".into(), e))?;
    let prog = bpf::load_xdp(&bpf::steering_program(addr.port(), addr.ip(), map.as_raw_fd(), slot))
        .map_err(|e| ("loading the program".to_string(), e))?;
    let link = bpf::attach_xdp(&prog, ifindex, bpf::XDP_FLAGS_DRV_MODE)
        .or_else(|_| bpf::attach_xdp(&prog, ifindex, bpf::XDP_FLAGS_SKB_MODE))
        .map_err(|e| (format!("attaching to {iface}"), e))?;
    let mut sockets = Vec::new();
    for q in 0..queues {
        let b = xsk::bind(ifindex, q, busy_poll)
            .map_err(|e| (format!("opening the socket of queue {q}"), e))?;
        bpf::map_update(&map, q, b.sock.as_raw_fd() as u32)
            .map_err(|e| ("adding the socket to the map".to_string(), e))?;
        sockets.push(b);
    }
    Ok((Steering { _link: link, _prog: prog, _map: map }, sockets))
}

/// `UROCE_XDP_BUSY_POLL`: busy polling of each socket's queue for this
/// many µs (for a context that attaches its own program; a broker's
/// sockets come as `uroce setup xdp --busy-poll` asked).
fn busy_poll() -> io::Result<Option<u32>> {
    let Some(v) = std::env::var_os("UROCE_XDP_BUSY_POLL") else { return Ok(None) };
    match v.to_str().and_then(|s| s.parse::<u32>().ok()) {
        Some(0) => Ok(None),
        Some(us) if us <= 100_000 => Ok(Some(us)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "UROCE_XDP_BUSY_POLL must be a number of microseconds (0 to 100000)",
        )),
    }
}

/// What the AF_XDP backend counts (`uroce stat`'s `xdp_*`).
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    /// Frames taken from the sockets as RoCE datagrams.
    rcvd: u64,
    /// Frames handed to the transmit ring.
    sent: u64,
    /// Frames received in several chunks.
    rcvd_multi: u64,
    /// Frames sent in several chunks.
    sent_multi: u64,
    /// Frames the sockets received that were no whole UDP datagram to
    /// the device's port (dropped).
    malformed: u64,
    /// Frames with an IPv4 header or UDP checksum that does not verify
    /// (dropped).
    bad_checksum: u64,
    /// Frames that found no transmit buffer (dropped; RC resends).
    tx_full: u64,
    /// Datagrams that came through the kernel (passed on by the program).
    via_kernel: u64,
}

/// An `io::Error` saying what failed, and what the usual cause is.
fn context(what: &str, e: io::Error) -> io::Error {
    let denied = matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES));
    let hint = if denied && what.starts_with("opening the socket") {
        " (an AF_XDP socket needs CAP_NET_RAW)"
    } else if denied {
        " (the XDP program needs CAP_BPF and CAP_NET_ADMIN, or root)"
    } else if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EEXIST))
        && what.starts_with("opening the socket")
    {
        " (the queue has an AF_XDP socket of another tool)"
    } else if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EEXIST)) {
        " (the interface has an XDP program already: another uroce process, or another tool)"
    } else if e.raw_os_error() == Some(libc::ENOBUFS) {
        " (the UMEM is charged to RLIMIT_MEMLOCK without CAP_IPC_LOCK)"
    } else {
        ""
    };
    io::Error::new(e.kind(), format!("AF_XDP backend: {what}: {e}{hint}"))
}

impl XdpBackend {
    /// Opens the backend for the device at `addr`: its interface, an XDP
    /// program steering `addr`'s port (this context's QPNs, on a shared
    /// address) to an AF_XDP socket per queue. A context that finds
    /// another member of the device owning the interface's program gets
    /// the `udp` backend, a member of the device's group.
    pub(crate) fn open(addr: SocketAddr) -> io::Result<Box<dyn Backend>> {
        let iface = crate::netif::interface_of(addr.ip()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("AF_XDP backend: no interface has address {}", addr.ip()),
            )
        })?;
        let ifindex = crate::netif::index_of_name(&iface)
            .ok_or_else(|| io::Error::other(format!("AF_XDP backend: no index for {iface}")))?;
        let mac = std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))
            .ok()
            .and_then(|s| neigh::parse_mac(&s))
            .ok_or_else(|| io::Error::other(format!("AF_XDP backend: {iface} has no MAC")))?;
        let udp = UdpBackend::bind_with_sharing(addr, true)?;
        let port = udp.local().port();
        let slot = udp.slot();
        // Another member's program: share the device through the kernel.
        let member = |udp: UdpBackend| -> io::Result<Box<dyn Backend>> { Ok(Box::new(udp)) };
        if slot.is_some_and(|(_, others)| others) && netlink::xdp_attached(ifindex)? {
            return member(udp);
        }
        let owner = slot.map(|(s, _)| s as u32);
        let others = slot.is_some_and(|(_, others)| others);
        // A broker's (no privilege needed), else our own.
        let (program, sockets) = match broker::open(&iface, udp.device_socket(), owner) {
            Ok(Some(g)) => (Program::Brokered(g.conn), g.sockets),
            // Another member's program, attached a moment before.
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy && others => return member(udp),
            Err(e) => return Err(context(&format!("the broker of {iface}"), e)),
            Ok(None) => match steer(&iface, ifindex, udp.local(), owner, busy_poll()?) {
                Ok((steering, sockets)) => (Program::Own(steering), sockets),
                Err((_, e))
                    if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EEXIST)) && others =>
                {
                    return member(udp);
                }
                Err((what, e)) => {
                    let denied = matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES));
                    let e = context(&what, e);
                    if !denied {
                        return Err(e);
                    }
                    // Where a broker would have done it for us.
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "{e}; or have root run `uroce setup xdp {iface}` once, after which no privilege is needed"
                        ),
                    ));
                }
            },
        };
        let mut xsks = Vec::new();
        for b in sockets {
            let x = xsk::Xsk::attach(b).map_err(|e| context("mapping a socket's rings", e))?;
            if !x.multi_buffer() {
                ONE_CHUNK_FRAMES.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            xsks.push(x);
        }
        Ok(Box::new(Self {
            udp,
            xsks,
            next_rx: 0,
            _program: program,
            src_mac: mac,
            port,
            neigh: neigh::Neighbours::new(&iface, ifindex),
            asked: None,
            counters: Counters::default(),
            long_frame: vec![0; xsk::MAX_FRAME],
        }))
    }
}

impl Backend for XdpBackend {
    fn relay_secret(&self) -> u64 {
        self.udp.relay_secret()
    }

    fn local(&self) -> SocketAddr {
        self.udp.local()
    }

    fn tick(&mut self, now_ns: u64) {
        self.udp.tick(now_ns);
    }

    // The device's group is the `udp` backend's: its slot numbers the
    // QPs and CM ids, and its table steers the CM's ports.
    fn qpn_range(&self) -> (u32, u32) {
        self.udp.qpn_range()
    }

    fn cm_id_prefix(&self) -> Option<(u32, u32)> {
        self.udp.cm_id_prefix()
    }

    fn set_listening(&mut self, ports: &[u16]) -> bool {
        self.udp.set_listening(ports)
    }

    fn listened_elsewhere(&mut self) -> Vec<u16> {
        self.udp.listened_elsewhere()
    }

    fn publish_connections(&mut self, conns: &[super::Leftover]) -> bool {
        self.udp.publish_connections(conns)
    }

    fn take_leftovers(&mut self) -> Vec<super::Leftover> {
        self.udp.take_leftovers()
    }

    /// One packet per send, each with IP ID 0: what the kernel puts on a
    /// DF datagram of an unconnected socket, so that a `udp` backend peer,
    /// which cannot see the ID and takes the i-th packet of a GRO run as
    /// ID i, checks every frame's ICRC (separate frames are not coalesced
    /// into runs). The frames still leave together: [`Backend::flush`]
    /// tells the kernel once per transmit pass.
    fn batch(&self) -> SendBatch {
        SendBatch { segments: 1, bytes: self.udp.batch().bytes }
    }

    /// The QP's port when the frame goes through the XSK (its MAC is
    /// known); the kernel socket's otherwise.
    fn source_port(&mut self, dst: SocketAddr, wanted: u16) -> u16 {
        let now = Instant::now();
        // The send that follows for this destination reads this clock
        // reading again instead of the clock (one read per packet).
        self.asked = Some((dst.ip(), now));
        if self.neigh.lookup(dst.ip(), now).is_some() { wanted } else { self.port }
    }

    fn send(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
        tos: u8,
    ) -> io::Result<()> {
        // A port of the QP's was given because the MAC was known a moment
        // ago: a lookup that has just gone stale since must not send the
        // frame through the kernel's socket, from its port, which the
        // ICRC does not cover.
        let known = (src.port() != self.port).then(|| self.neigh.known(dst.ip())).flatten();
        let now = match self.asked.take() {
            Some((ip, at)) if ip == dst.ip() => at,
            _ => Instant::now(),
        };
        let Some(dst_mac) = self.neigh.lookup(dst.ip(), now).or(known) else {
            return self.udp.send(src, dst, data, seg, tos);
        };
        let path = frame::Path { src_mac: self.src_mac, dst_mac, src, dst };
        // Segment `i` of a run carries IP ID `i`, as the kernel's GSO
        // gives it (the driver computed the ICRCs over those).
        let head = frame::overhead(dst.is_ipv4());
        for (i, p) in data.chunks(seg.max(1)).enumerate() {
            let tx = &mut self.xsks[0];
            if head + p.len() > xsk::FRAME {
                // Longer than a chunk: built whole, then cut into chunks.
                let long = &mut self.long_frame;
                let sent = frame::build(long, &path, p, i as u16, tos).is_some_and(|n| {
                    tx.send_joined(&long[..n]) || {
                        tx.kick();
                        tx.send_joined(&long[..n])
                    }
                });
                if sent {
                    self.counters.sent += 1;
                    self.counters.sent_multi += 1;
                } else {
                    self.counters.tx_full += 1;
                }
                continue;
            }
            let put = |x: &mut xsk::Xsk| x.send(|buf| frame::build(buf, &path, p, i as u16, tos));
            if put(tx) {
                self.counters.sent += 1;
            } else {
                tx.kick();
                if put(tx) {
                    self.counters.sent += 1;
                } else {
                    self.counters.tx_full += 1;
                }
            }
        }
        Ok(())
    }

    fn flush(&mut self) {
        self.xsks[0].kick();
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        let port = self.port;
        let n = self.xsks.len();
        let mut idle = 0;
        while idle < n {
            let got = self.xsks[self.next_rx].recv(|f| {
                let multi = f.len() > xsk::MAX_RX_FRAME;
                let p = frame::parse(f, port)?;
                let n = p.payload.len();
                // Larger than the driver's buffer: cannot happen.
                let dst = buf.get_mut(..n).ok_or(frame::Refused::Malformed)?;
                dst.copy_from_slice(p.payload);
                let r = Received {
                    len: n,
                    seg: n,
                    from: p.from,
                    to: p.to,
                    ip_id: p.from.is_ipv4().then_some(p.ip_id),
                    local: false,
                };
                Ok((r, multi))
            });
            match got {
                Some(Ok((r, multi))) => {
                    self.counters.rcvd += 1;
                    self.counters.rcvd_multi += u64::from(multi);
                    return Ok(Some(r));
                }
                Some(Err(frame::Refused::Malformed)) => self.counters.malformed += 1,
                Some(Err(frame::Refused::BadChecksum)) => self.counters.bad_checksum += 1,
                None => {
                    idle += 1;
                    self.next_rx = (self.next_rx + 1) % n;
                }
            }
        }
        let r = self.udp.recv(buf);
        if let Ok(Some(_)) = r {
            self.counters.via_kernel += 1;
        }
        r
    }

    fn at_exit(&mut self) {
        self.udp.at_exit();
    }

    fn add_counters(&self, stats: &mut uroce_transport::Stats) {
        self.udp.add_counters(stats);
        let c = &self.counters;
        stats.xdp_rcvd_frames += c.rcvd;
        stats.xdp_sent_frames += c.sent;
        stats.xdp_rx_multi_chunk += c.rcvd_multi;
        stats.xdp_tx_multi_chunk += c.sent_multi;
        stats.xdp_rx_malformed += c.malformed;
        stats.xdp_rx_bad_checksum += c.bad_checksum;
        stats.xdp_tx_full += c.tx_full;
        stats.xdp_via_kernel += c.via_kernel;
        // The kernel's own counts (`struct xdp_statistics`), every socket.
        for st in self.xsks.iter().map(xsk::Xsk::statistics) {
            stats.xdp_rx_dropped += st[0];
            stats.xdp_rx_invalid += st[1];
            stats.xdp_rx_ring_full += st[3];
            stats.xdp_fill_empty += st[4];
        }
        for x in &self.xsks {
            stats.xdp_zero_copy_sockets += u64::from(x.zero_copy());
        }
    }

    fn raw_fds(&self) -> Vec<i32> {
        let mut v = self.udp.raw_fds();
        v.extend(self.xsks.iter().map(xsk::Xsk::raw_fd));
        v
    }

    fn bind_local(&mut self, ip: IpAddr) -> io::Result<()> {
        self.udp.bind_local(ip)
    }

    fn unbind_local(&mut self, ip: IpAddr) {
        self.udp.unbind_local(ip);
    }

    fn join(&mut self, group: IpAddr) -> io::Result<()> {
        self.udp.join(group)
    }

    fn leave(&mut self, group: IpAddr) {
        self.udp.leave(group);
    }

    fn recv_group(&mut self, buf: &mut [u8]) -> Option<(usize, SocketAddr, IpAddr)> {
        self.udp.recv_group(buf)
    }

    fn unreachable(&mut self, out: &mut Vec<SocketAddr>) {
        self.udp.unreachable(out);
    }
}

impl Drop for XdpBackend {
    fn drop(&mut self) {
        if std::env::var_os("UROCE_XDP_STATS").is_some() {
            let st: Vec<[u64; 6]> = self.xsks.iter().map(xsk::Xsk::statistics).collect();
            eprintln!(
                "uroce xdp: {:?} sockets (dropped, rx invalid, tx invalid, rx ring full, fill empty, tx empty) {st:?}",
                self.counters
            );
        }
    }
}
