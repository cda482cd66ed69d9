//! uroce: the RDMA verbs model (devices, PDs, MRs, CQs, QPs) implemented in
//! user space over RoCEv2/UDP, with no RDMA hardware or kernel module. On
//! the wire it is byte-compatible with Linux Soft-RoCE (rxe).
//!
//! # Quick start
//!
//! Two contexts on two loopback addresses of one host (two processes work
//! the same way), an RC connection between them, and an RDMA WRITE:
//!
//! ```
//! use uroce::{Access, AttrMask, Device, DeviceConfig, Path, QpAttr, QpCaps, QpInitAttr,
//!             QpState, QpType, SendWr, WrOpcode, Completion};
//! # fn main() -> uroce::Result<()> {
//! # let port = 20000 + (std::process::id() % 20000) as u16;
//! let dev = |n: &str, a: &str| Device::from_config(DeviceConfig {
//!     name: n.into(), addr: a.parse().unwrap(), port });
//! let (a, b) = (dev("a", "127.0.0.1").open()?, dev("b", "127.0.0.2").open()?);
//!
//! let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
//! let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
//! let (src, dst) = (pa.alloc_mr(4096, rw)?, pb.alloc_mr(4096, rw)?);
//! src.write(0, b"hello, RDMA")?;
//!
//! let cq_a = a.create_cq(16)?;
//! let cq_b = b.create_cq(16)?;
//! let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1,
//!                     max_recv_sge: 1, max_inline_data: 64 };
//! let qa = pa.create_qp(&QpInitAttr { send_cq: &cq_a, recv_cq: &cq_a, cap: caps,
//!                                     qp_type: QpType::Rc, sq_sig_all: false, srq: None })?;
//! let qb = pb.create_qp(&QpInitAttr { send_cq: &cq_b, recv_cq: &cq_b, cap: caps,
//!                                     qp_type: QpType::Rc, sq_sig_all: false, srq: None })?;
//! // Exchange QPNs and PSNs out of band (here: directly), then connect.
//! uroce::connect(&qa, "127.0.0.2".parse().unwrap(), port, qb.qpn(), 100, 200, rw)?;
//! uroce::connect(&qb, "127.0.0.1".parse().unwrap(), port, qa.qpn(), 200, 100, rw)?;
//!
//! let sge = [src.sge(0, 11)?];
//! qa.post_send(&[SendWr { wr_id: 1, opcode: WrOpcode::RdmaWrite, sgl: &sge,
//!                         remote_addr: dst.addr(), rkey: dst.rkey(), ..Default::default() }])?;
//! let mut wc = [Completion::new(0, uroce::WcStatus::Success, uroce::WcOpcode::Send, 0, false)];
//! while cq_a.poll(&mut wc)? == 0 {}
//! assert_eq!(wc[0].status, uroce::WcStatus::Success);
//! let mut got = [0u8; 11];
//! dst.read(0, &mut got)?;
//! assert_eq!(&got, b"hello, RDMA");
//! # Ok(()) }
//! ```
//!
//! # The model
//!
//! A [`Device`] (an address and UDP port) is opened into a [`Context`]:
//! the device's state in this process, shared by every opener. From the
//! context come protection domains ([`Pd`]), completion queues ([`Cq`])
//! with their [`CompChannel`]s, [`Srq`]s and [`Xrcd`]s; from a PD,
//! registered memory ([`Mr`]), queue pairs ([`Qp`]: RC, UC, UD, XRC),
//! address handles and memory windows. Each object holds what it depends
//! on (a QP its PD and CQs), so no drop order can leave a handle dangling.
//!
//! A QP moves RESET → INIT → RTR → RTS by [`Qp::modify`] (the attributes
//! each step needs are those of `man ibv_modify_qp`), or in one call:
//! [`connect`] with the peer's QPN and PSN, [`activate_ud`] for UD, or the
//! connection manager ([`cm`]). Work is posted to a QP ([`Qp::post_send`],
//! [`Qp::post_recv`]) or an SRQ and reported on a CQ ([`Cq::poll`]); an
//! error completion moves the QP to ERR, as on a NIC.
//!
//! # Memory, and work in flight
//!
//! Registered memory is shared with the network: the device reads it for
//! the application's SENDs and WRITEs and peers write it when its rights
//! allow, at any time. So uroce hands out no Rust references to it:
//!
//! - owned regions ([`Pd::alloc_mr`], the library's memory) are reached
//!   by copying ([`Mr::write`], [`Mr::read`]); posting is safe, since a
//!   work request names memory by key and address, checked when the
//!   device uses it;
//! - dropping a region revokes its keys before its memory is freed: work
//!   still naming it ends with an error completion (`LocProtErr`, or
//!   `RemAccessErr` at the peer), never a touch of freed memory;
//! - memory the application owns is registered `unsafe`ly
//!   ([`Pd::register_raw`]), with the contract written there.
//!
//! `docs/rust-api.md` in the repository says more, and compares this with
//! the `ibverbs`, `sideway` and `async-rdma` crates.
//!
//! # The common case
//!
//! [`session`]: connect through the CM, hand the peer a region as a
//! [`session::RemoteRegion`], then WRITE, READ, SEND and atomics that
//! return (or, under `tokio`, resolve) with their own completion.
//!
//! # Progress
//!
//! See [`ProgressMode`]: a background thread by default, inline progress
//! from every poll and post.
//!
//! # Connecting through the connection manager
//!
//! [`cm`] connects QPs the way librdmacm's users do, with the peer's
//! address and port instead of QPNs exchanged by hand: [`cm::EventChannel`]
//! and [`cm::CmId`] (`rdma_cm_id`'s calls and events), or
//! [`Context::cm_listen`] and [`Context::cm_connect`], which hand back a
//! QP in RTS. The peer may be any RoCE RDMA CM: another uroce process, a
//! librdmacm program on uroce's drop-in library, a kernel rxe host.
//!
//! # Cargo features
//!
//! - `tokio`: [`AsyncCq`], completions as futures (`cq.next().await`);
//!   [`AsyncCmChannel`], `cm::AsyncEventChannel` and `cm_connect_async` /
//!   `cm_listen_async`, the CM as futures.
//!
//! # Status
//!
//! RC, UC and UD queue pairs, SRQs, completion channels, async events and
//! memory windows work over the `udp` backend (UDP GSO/GRO batching, and
//! shared memory between the contexts of one host), the AF_XDP backend
//! (`UROCE_BACKEND=xdp`), the DPDK backend (feature `dpdk`,
//! `UROCE_BACKEND=dpdk`) and the in-process `sim` backend (feature `sim`,
//! for tests); see the README's status table.

#![deny(unsafe_code)]
#![deny(missing_docs)]

mod ah;
#[cfg(feature = "tokio")]
#[allow(unsafe_code)]
mod async_cq;
#[allow(unsafe_code)]
mod backend;
#[allow(unsafe_code)]
mod channel;
pub mod cm;
pub mod config;
mod context;
mod device;
mod dm;
pub(crate) mod driver;
mod error;
#[allow(unsafe_code)]
mod exit;
mod gid;
pub mod limits;
mod link_speed;
#[allow(unsafe_code)]
mod mr;
#[allow(unsafe_code)]
mod netif;
#[allow(unsafe_code)]
mod ofd_lock;
mod progress;
pub mod raw;
#[allow(unsafe_code)]
mod sched;
pub mod session;
mod staging;
mod timeline;
mod verbs;
mod xrc_open;
#[allow(unsafe_code)]
mod xrc_share;

/// The AF_XDP broker (`uroce setup xdp IFACE`): a privileged process that
/// opens AF_XDP sockets and attaches the XDP program for the contexts of
/// unprivileged users, so that `UROCE_BACKEND=xdp` works without
/// capabilities once it runs.
pub mod xdp_broker {
    pub use crate::backend::xdp::broker::{Options, serve, stop};
}

pub use ah::{Ah, AhAttr};
#[cfg(feature = "tokio")]
pub use async_cq::AsyncCq;
#[cfg(feature = "sim")]
pub use backend::sim::SimNetwork;
pub use channel::{AsyncEventQueue, AsyncEventRouter, CompChannel};
#[cfg(feature = "tokio")]
pub use cm::AsyncCmChannel;
pub use config::DeviceConfig;
pub use context::{Context, Options, ProgressMode};
pub mod published;
pub use device::{AtomicCap, Device, DeviceAttr, PortAttr, device, devices};
pub use dm::{DM_ALIGNMENT, Dm};
pub use driver::AsyncEvent;
pub use error::{Error, Result};
pub use link_speed::LinkSpeed;
#[cfg(feature = "sim")]
pub use uroce_sim::LinkConfig;
pub use uroce_transport as transport;
pub use uroce_transport::{
    Access, AttrMask, Completion, MwBind, MwType, Path, QpAttr, QpCaps, QpState, QpType, RecvWr,
    SendFlags, SendWr, Sge, Stats, WcFlags, WcOpcode, WcStatus, WrOpcode,
};
pub use uroce_wire as wire;
pub use uroce_wire::{LocalAckTimeout, Mtu, Psn, RnrTimer};
pub use verbs::{
    Cq, Flow, Mr, Mw, Pd, Qp, QpInitAttr, RwqIndTable, Srq, SrqAttr, Wq, Xrcd, inc_rkey,
};

/// Moves an RC or UC QP from RESET to RTS connected to `peer` (the usual
/// three `ibv_modify_qp` calls of every verbs example), with perftest's
/// timers for RC: timeout 14 (67 ms), 7 retries, infinite RNR retries,
/// 16 outstanding READ/atomics; MTU 4096 on loopback, 1024 otherwise. The
/// source GID is the first of the peer's family and scope
/// ([`Qp::gid_index_for`]).
///
/// # Errors
/// As [`Qp::modify`].
pub fn connect(
    qp: &Qp,
    peer: std::net::IpAddr,
    peer_port: u16,
    peer_qpn: u32,
    my_psn: u32,
    peer_psn: u32,
    access: Access,
) -> Result<()> {
    let mtu = if peer.is_loopback() { Mtu::Mtu4096 } else { Mtu::Mtu1024 };
    connect_with_mtu(qp, peer, peer_port, peer_qpn, my_psn, peer_psn, access, mtu)
}

/// [`connect`] with path MTU `mtu`.
///
/// # Errors
/// As [`Qp::modify`] (an MTU above the port's active one included).
#[allow(clippy::too_many_arguments)] // the fields of the three modifies
pub fn connect_with_mtu(
    qp: &Qp,
    peer: std::net::IpAddr,
    peer_port: u16,
    peer_qpn: u32,
    my_psn: u32,
    peer_psn: u32,
    access: Access,
    mtu: Mtu,
) -> Result<()> {
    let t = qp.qp_type();
    let mut attr = QpAttr { state: QpState::Init, access, ..QpAttr::default() };
    qp.modify(
        &attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )?;
    attr.state = QpState::ReadyToReceive;
    attr.path = Some(Path {
        dst: peer,
        dst_port: peer_port,
        sgid_index: qp.gid_index_for(peer),
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
    });
    attr.path_mtu = mtu;
    attr.dest_qpn = peer_qpn;
    attr.rq_psn = Psn::new(peer_psn);
    attr.max_dest_rd_atomic = 16;
    attr.min_rnr_timer = RnrTimer::from_code(12);
    // What each type takes beyond UC's (the kernel's qp_state_table): RC
    // and the XRC target receive requests, RC and the initiator send them.
    let rtr_rc = if matches!(t, QpType::Rc | QpType::XrcRecv) {
        AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER
    } else {
        AttrMask::NONE
    };
    qp.modify(
        &attr,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | rtr_rc,
    )?;
    attr.state = QpState::ReadyToSend;
    attr.timeout = LocalAckTimeout::saturating(14);
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = Psn::new(my_psn);
    attr.max_rd_atomic = 16;
    let rts_rc = match t {
        QpType::Rc | QpType::XrcSend => {
            AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC
        }
        QpType::XrcRecv => AttrMask::TIMEOUT,
        _ => AttrMask::NONE,
    };
    qp.modify(&attr, AttrMask::STATE | AttrMask::SQ_PSN | rts_rc)
}

/// Moves a UD QP from RESET to RTS with Q_Key `qkey` and first PSN `psn`.
///
/// # Errors
/// As [`Qp::modify`].
pub fn activate_ud(qp: &Qp, qkey: u32, psn: u32) -> Result<()> {
    let mut attr = QpAttr { state: QpState::Init, qkey, ..QpAttr::default() };
    qp.modify(&attr, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY)?;
    attr.state = QpState::ReadyToReceive;
    qp.modify(&attr, AttrMask::STATE)?;
    attr.state = QpState::ReadyToSend;
    attr.sq_psn = Psn::new(psn);
    qp.modify(&attr, AttrMask::STATE | AttrMask::SQ_PSN)
}

/// Helpers for tests and tools that need ports of their own.
#[doc(hidden)]
pub mod testing {
    use std::net::UdpSocket;
    use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

    /// A UDP port free on 127.0.0.1, 127.0.0.2 and ::1 right now. Each
    /// call in a process returns a different port, outside the kernel's
    /// ephemeral range (see `pick_port`).
    pub fn free_port() -> u16 {
        pick_port(|p| {
            let held: Vec<_> = ["127.0.0.1", "127.0.0.2", "::1"]
                .iter()
                .map_while(|ip| UdpSocket::bind((*ip, p)).ok())
                .collect();
            held.len() == 3
        })
    }

    /// A TCP port free on 127.0.0.1 right now; each call in a process
    /// returns a different port.
    pub fn free_tcp_port() -> u16 {
        pick_port(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
    }

    /// A port that `free` finds free, outside the kernel's ephemeral range
    /// (`ip_local_port_range`): a port the kernel hands out by itself
    /// (`bind` to port 0, `connect`) can be taken by any socket of any
    /// process between this check and the caller's own bind, which a busy
    /// CI once saw (a perftest server's device found its UDP port taken);
    /// outside that range only another chooser could. The search starts
    /// at a point that differs between processes and moves on with each
    /// call.
    fn pick_port(free: impl Fn(u16) -> bool) -> u16 {
        static CALLS: AtomicU32 = AtomicU32::new(0);
        let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| {
                let mut v = s.split_whitespace().map(|w| w.parse::<u32>().ok());
                Some((v.next()??, v.next()??))
            })
            .unwrap_or((32768, 60999));
        // The larger of the spans below and above it (from 10000 up:
        // lower ports are services').
        let below = (10_000, low.max(10_000));
        let above: (u32, u32) = ((high + 1).max(10_000), 65_536);
        let (start, end) =
            if below.1 - below.0 >= above.1.saturating_sub(above.0) { below } else { above };
        let span = end.saturating_sub(start);
        if span >= 1000 {
            let seed = std::process::id().wrapping_mul(2_654_435_761);
            let call = CALLS.fetch_add(1, Ordering::Relaxed);
            for k in 0..span {
                let off = seed.wrapping_add(call.wrapping_mul(7919)).wrapping_add(k) % span;
                let port = (start + off) as u16;
                if free(port) {
                    return port;
                }
            }
        }
        // No room outside the ephemeral range: one the kernel picks.
        static LAST: AtomicU16 = AtomicU16::new(0);
        loop {
            let Ok(a) = UdpSocket::bind("127.0.0.1:0") else { continue };
            let Ok(port) = a.local_addr().map(|a| a.port()) else { continue };
            drop(a);
            if LAST.swap(port, Ordering::Relaxed) != port && free(port) {
                return port;
            }
        }
    }

    /// Whether something listens on TCP `port` (any address), read from
    /// /proc so that no connection is spent on the probe (a server that
    /// accepts one connection would take the probe for its client).
    pub fn tcp_listening(port: u16) -> bool {
        let needle = format!(":{port:04X}");
        ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f).is_ok_and(|t| {
                t.lines().skip(1).any(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.len() > 3 && w[1].ends_with(&needle) && w[3] == "0A"
                })
            })
        })
    }

    /// Waits until a UDP socket is bound to `port` (any address), for at
    /// most `limit`: a uroce device opened by a process that is still
    /// starting (read from /proc, nothing sent). Returns whether one is.
    pub fn wait_udp_bound(port: u16, limit: std::time::Duration) -> bool {
        let needle = format!(":{port:04X}");
        let deadline = std::time::Instant::now() + limit;
        loop {
            let bound = ["/proc/net/udp", "/proc/net/udp6"].iter().any(|f| {
                std::fs::read_to_string(f).is_ok_and(|t| {
                    t.lines()
                        .skip(1)
                        .any(|l| l.split_whitespace().nth(1).is_some_and(|a| a.ends_with(&needle)))
                })
            });
            if bound {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Waits until something listens on TCP `port`, for at most `limit`
    /// (a server process that is still starting, on a busy machine).
    /// Returns whether it does.
    pub fn wait_tcp_listening(port: u16, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if tcp_listening(port) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// The next `n` completions of `cq`, busy-polling (test code: panics
    /// after 10 s without them).
    pub fn wait_completions(cq: &crate::Cq, n: usize) -> Vec<crate::Completion> {
        use crate::{Completion, WcOpcode, WcStatus};
        let mut out = Vec::with_capacity(n);
        let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 16];
        let t = std::time::Instant::now();
        while out.len() < n {
            let k = cq.poll(&mut wc[..(n - out.len()).min(16)]).expect("polling the CQ");
            out.extend_from_slice(&wc[..k]);
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "got {} of {n} completions",
                out.len()
            );
        }
        out
    }

    /// Appends every completion `cq` has now to `out` (the seeded
    /// simulations poll this way between steps of the virtual clock).
    pub fn poll_all(cq: &crate::Cq, out: &mut Vec<crate::Completion>) {
        use crate::{Completion, WcOpcode, WcStatus};
        let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 16];
        loop {
            let n = cq.poll(&mut wc).expect("polling the CQ");
            out.extend_from_slice(&wc[..n]);
            if n < wc.len() {
                return;
            }
        }
    }

    /// Two contexts on 127.0.0.1 and 127.0.0.2 (one UDP port), each with
    /// a PD and a CQ of 64 entries: the two sides of a test.
    pub fn two_sides() -> (u16, Side, Side) {
        let port = free_port();
        let side = |addr| {
            let ctx = open(addr, port);
            let pd = ctx.alloc_pd().expect("a PD");
            let cq = ctx.create_cq(64).expect("a CQ");
            Side { ctx, pd, cq }
        };
        (port, side("127.0.0.1"), side("127.0.0.2"))
    }

    /// One side of [`two_sides`].
    pub struct Side {
        /// Its context.
        pub ctx: crate::Context,
        /// A PD.
        pub pd: crate::Pd,
        /// A CQ for both queues of its QPs.
        pub cq: crate::Cq,
    }

    /// A connected pair of RC QPs between the sides of [`two_sides`] (a
    /// at 127.0.0.1, b at 127.0.0.2), every WR signaled; b's QP grants
    /// `b_access`, a's every remote right.
    pub fn rc_pair(
        port: u16,
        a: &Side,
        b: &Side,
        cap: crate::QpCaps,
        b_access: crate::Access,
    ) -> (crate::Qp, crate::Qp) {
        let all = crate::Access(1 | 2 | 4 | 8);
        let qa = rc_qp(&a.pd, &a.cq, cap, true);
        let qb = rc_qp(&b.pd, &b.cq, cap, true);
        let (ia, ib) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        crate::connect(&qa, ib, port, qb.qpn(), 1, 2, all).expect("connecting a");
        crate::connect(&qb, ia, port, qa.qpn(), 2, 1, b_access).expect("connecting b");
        (qa, qb)
    }

    /// The next completion of `cq`, busy-polling (test code: panics after
    /// 10 s without one).
    pub fn wait_completion(cq: &crate::Cq) -> crate::Completion {
        use crate::{Completion, WcOpcode, WcStatus};
        let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false)];
        let t = std::time::Instant::now();
        loop {
            if cq.poll(&mut wc).expect("polling the CQ") == 1 {
                return wc[0];
            }
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "no completion");
        }
    }

    /// Opens a device on `addr:port` (test code: panics on failure).
    pub fn open(addr: &str, port: u16) -> crate::Context {
        let addr = addr.parse().expect("an IP address");
        crate::Device::from_config(crate::DeviceConfig { name: "test".into(), addr, port })
            .open()
            .expect("opening the test device")
    }

    /// Opens a device on `addr` at a port free right now, trying again
    /// when another thread's probe or device took the port meanwhile (test
    /// code: panics after 100 attempts).
    pub fn open_any(addr: &str) -> crate::Context {
        let ip = addr.parse().expect("an IP address");
        for _ in 0..100 {
            let port = free_port();
            let cfg = crate::DeviceConfig { name: "test".into(), addr: ip, port };
            match crate::Device::from_config(cfg).open() {
                Ok(c) => return c,
                Err(crate::Error::Open { source, .. })
                    if source.kind() == std::io::ErrorKind::AddrInUse => {}
                Err(e) => panic!("opening the test device: {e}"),
            }
        }
        panic!("no free port for a test device on {addr}");
    }

    /// An RC QP on `pd` with both queues on `cq`, no SRQ (test code:
    /// panics on failure).
    pub fn rc_qp(
        pd: &crate::Pd,
        cq: &crate::Cq,
        cap: crate::QpCaps,
        sq_sig_all: bool,
    ) -> crate::Qp {
        pd.create_qp(&crate::QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap,
            qp_type: crate::QpType::Rc,
            sq_sig_all,
            srq: None,
        })
        .expect("creating the test QP")
    }

    /// A UD QP on `pd` with `cq` for both queues, every send signalled,
    /// moved to RTS with `qkey` and starting PSN `sq_psn`.
    pub fn ud_qp(
        pd: &crate::Pd,
        cq: &crate::Cq,
        cap: crate::QpCaps,
        qkey: u32,
        sq_psn: u32,
    ) -> crate::Qp {
        let qp = pd
            .create_qp(&crate::QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                cap,
                qp_type: crate::QpType::Ud,
                sq_sig_all: true,
                srq: None,
            })
            .expect("creating the test QP");
        crate::activate_ud(&qp, qkey, sq_psn).expect("activating the test QP");
        qp
    }
}
