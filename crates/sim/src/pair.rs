//! Two RC QPs connected over a [`SimNet`]: the transport's test bench.
//! Each node has its own [`TestMemory`]; [`RcPair::run_until`] steps the
//! virtual clock from event to event (packet arrivals and QP deadlines).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use uroce_transport::{
    Access, AttrMask, Completion, Endpoint, Instant, Path, Qp, QpAttr, QpCaps, QpInit, QpState,
    QpType,
};
use uroce_wire::udp::ROCE_V2_PORT;
use uroce_wire::{LocalAckTimeout, Mtu, Psn, RnrTimer, UdpDatagram};

use crate::net::encapsulate;
use crate::{LinkConfig, SimNet, SplitMix64, TestMemory};

/// One side of the pair: an [`Endpoint`] holding one QP (and B's SRQ),
/// whose completions go to one CQ that [`RcPair::pump`] drains into
/// `completions`.
pub struct Node {
    /// The node's address.
    pub addr: IpAddr,
    /// Its endpoint: demux, timers, scheduling, the CQ.
    pub ep: Endpoint,
    /// Its QP's number (`ep.qp_mut(qpn)` borrows the endpoint alone, where
    /// a test also passes `&mem`).
    pub qpn: u32,
    cq: u32,
    srq: Option<u32>,
    /// Its memory.
    pub mem: TestMemory,
    /// Completions polled so far.
    pub completions: Vec<Completion>,
    /// Datagrams whose ICRC failed (corrupted in flight).
    pub icrc_drops: u64,
}

impl Node {
    fn new(addr: IpAddr, qp: Qp, srq: Option<uroce_transport::Srq>) -> Self {
        let mut ep = Endpoint::new();
        let cq = ep.create_cq(1 << 16);
        let qpn = qp.qpn();
        let srq = srq.map(|s| ep.add_srq(s));
        ep.add_qp(qp, cq, cq, srq);
        Self { addr, ep, qpn, cq, srq, mem: TestMemory::new(), completions: vec![], icrc_drops: 0 }
    }

    /// The node's QP.
    pub fn qp(&self) -> &Qp {
        self.ep.qp(self.qpn).expect("the pair's QP lives as long as the pair")
    }

    /// The node's QP, to post to or drive by hand (it becomes active).
    pub fn qp_mut(&mut self) -> &mut Qp {
        self.ep.qp_mut(self.qpn).expect("the pair's QP lives as long as the pair")
    }

    /// The SRQ the QP receives from, if it uses one.
    pub fn srq(&self) -> Option<&uroce_transport::Srq> {
        self.ep.srq(self.srq?)
    }

    /// The SRQ, to post to.
    pub fn srq_mut(&mut self) -> Option<&mut uroce_transport::Srq> {
        self.ep.srq_mut(self.srq?)
    }

    /// Moves the CQ's completions into `completions`.
    fn drain_cq(&mut self, trace: Option<Instant>) {
        let Some(cq) = self.ep.cq(self.cq) else { return };
        let mut cq = cq.lock();
        while let Some(c) = cq.pop() {
            if let Some(now) = trace {
                eprintln!("{:>12} {}: {c:?}", now.as_nanos(), self.addr);
            }
            self.completions.push(c);
        }
    }
}

/// Connection parameters for both QPs.
#[derive(Debug, Clone, Copy)]
pub struct PairConfig {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer the responders send.
    pub min_rnr_timer: u8,
    /// READ/atomic depth both ways.
    pub rd_atomic: u8,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Send window in PSNs.
    pub max_unacked_psns: u32,
    /// Every WR signaled.
    pub sq_sig_all: bool,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// B's QP receives from a shared receive queue (`b.srq`).
    pub srq_b: bool,
    /// The Q_Key of UD QPs.
    pub qkey: u32,
}

impl Default for PairConfig {
    fn default() -> Self {
        Self {
            mtu: Mtu::Mtu1024,
            timeout: 14, // 67 ms, perftest's and rc_pingpong's default
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1, // 10 µs
            rd_atomic: 4,
            caps: QpCaps {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 256,
            },
            max_unacked_psns: 512,
            sq_sig_all: false,
            qp_type: QpType::Rc,
            srq_b: false,
            qkey: 0x1111_1111,
        }
    }
}

/// Two connected RC QPs over a simulated network.
pub struct RcPair {
    /// Node A (10.0.0.1, QPN 0x11).
    pub a: Node,
    /// Node B (10.0.0.2, QPN 0x22).
    pub b: Node,
    /// The network.
    pub net: SimNet,
    /// Virtual time.
    pub now: Instant,
    buf: Vec<u8>,
    /// Print every packet and timer to stderr (`UROCE_SIM_TRACE=1`).
    pub trace: bool,
}

/// The PD handle both sides use.
pub const PD: u32 = 1;

impl RcPair {
    /// A connected pair; the starting PSNs come from `seed`, as does every
    /// fault of `link` (used in both directions).
    pub fn new(seed: u64, link: LinkConfig, cfg: PairConfig) -> Self {
        let mut rng = SplitMix64::new(seed ^ 0x5eed);
        let a_addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let b_addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let mk = |qpn, uses_srq| {
            Qp::new(QpInit {
                qpn,
                qp_type: cfg.qp_type,
                pd: PD,
                caps: cfg.caps,
                sq_sig_all: cfg.sq_sig_all,
                max_unacked_psns: cfg.max_unacked_psns,
                port_mtu: cfg.mtu,
                uses_srq,
            })
        };
        let mut a = Node::new(a_addr, mk(0x11, false), None);
        let srq = cfg
            .srq_b
            .then(|| uroce_transport::Srq::new(cfg.caps.max_recv_wr, cfg.caps.max_recv_sge));
        let mut b = Node::new(b_addr, mk(0x22, cfg.srq_b), srq);
        let psn_a = Psn::new(rng.next_u64() as u32);
        let psn_b = Psn::new(rng.next_u64() as u32);
        connect(a.qp_mut(), b_addr, 0x22, psn_a, psn_b, &cfg);
        connect(b.qp_mut(), a_addr, 0x11, psn_b, psn_a, &cfg);
        let trace = std::env::var_os("UROCE_SIM_TRACE").is_some();
        Self {
            a,
            b,
            net: SimNet::new(seed, link),
            now: Instant::from_nanos(1),
            buf: vec![0; 8192],
            trace,
        }
    }

    /// Runs everything due at the current time: deliveries, then expired
    /// timers, then every packet the endpoints are ready to send.
    pub fn pump(&mut self) {
        while let Some((src, dst, bytes)) = self.net.pop_due(self.now) {
            let node = if dst == self.a.addr { &mut self.a } else { &mut self.b };
            let Ok(d) = UdpDatagram::parse(&bytes) else {
                node.icrc_drops += 1;
                continue;
            };
            let Ok(pkt) = d.verify_icrc() else {
                node.icrc_drops += 1;
                if self.trace {
                    eprintln!("{:>12} {src} -> {dst}: ICRC bad, dropped", self.now.as_nanos());
                }
                continue;
            };
            if self.trace {
                eprintln!("{:>12} {src} -> {dst}: rx {pkt}", self.now.as_nanos());
            }
            if d.udp.dst_port() != ROCE_V2_PORT {
                node.icrc_drops += 1;
                continue;
            }
            node.ep.handle_datagram(self.now, src, dst, &pkt, &node.mem);
        }
        for node in [&mut self.a, &mut self.b] {
            if node.ep.poll_timeout().is_some_and(|t| t <= self.now) {
                if self.trace {
                    eprintln!("{:>12} {}: timer", self.now.as_nanos(), node.addr);
                }
                node.ep.handle_timeout(self.now);
            }
            for _ in 0..1_000_000 {
                let Some(t) = node.ep.poll_transmit(self.now, &node.mem, &mut self.buf) else {
                    break;
                };
                if let (true, Ok(p)) =
                    (self.trace, uroce_wire::RocePacket::new_checked(&self.buf[..t.len]))
                {
                    eprintln!("{:>12} {} tx {p}", self.now.as_nanos(), node.addr);
                }
                let dg = encapsulate(node.addr, t.dst, t.src_port, t.dst_port, &self.buf[..t.len]);
                self.net.send(self.now, node.addr, t.dst, dg);
            }
            node.drain_cq(self.trace.then_some(self.now));
        }
    }

    /// The next event time, if anything is pending.
    fn next_event(&self) -> Option<Instant> {
        [self.net.next_delivery(), self.a.ep.next_deadline(), self.b.ep.next_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Steps until `done` holds or the clock passes `limit`; returns whether
    /// `done` held.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Self) -> bool) -> bool {
        let end = self.now.saturating_add(limit);
        loop {
            self.pump();
            if done(self) {
                return true;
            }
            match self.next_event() {
                Some(t) if t <= end => self.now = t.max(self.now),
                _ => return false,
            }
        }
    }

    /// Runs until nothing is in flight and no timer is armed (or `limit`).
    pub fn run_until_idle(&mut self, limit: Duration) -> bool {
        self.run_until(limit, |p| p.next_event().is_none())
    }
}

/// Moves `qp` from RESET to RTS connected to QP `peer_qpn` at `peer` (a
/// UD QP to RTS, no peer), with `cfg`'s MTU, timers and READ/atomic
/// depth and every access right: the three `ibv_modify_qp` calls of a
/// verbs program, for tests that build their QPs themselves.
pub fn connect(
    qp: &mut Qp,
    peer: IpAddr,
    peer_qpn: u32,
    sq_psn: Psn,
    rq_psn: Psn,
    cfg: &PairConfig,
) {
    let now = Instant::ZERO;
    if cfg.qp_type == QpType::Ud {
        // UD: INIT with a Q_Key, RTR, RTS with a first PSN; no peer.
        let mut attr = QpAttr { state: QpState::Init, qkey: cfg.qkey, ..QpAttr::default() };
        qp.modify(
            now,
            &attr,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        )
        .expect("UD INIT");
        attr.state = QpState::ReadyToReceive;
        qp.modify(now, &attr, AttrMask::STATE).expect("UD RTR");
        attr.state = QpState::ReadyToSend;
        attr.sq_psn = sq_psn;
        qp.modify(now, &attr, AttrMask::STATE | AttrMask::SQ_PSN).expect("UD RTS");
        let _ = (peer, peer_qpn, rq_psn);
        return;
    }
    let mut attr = QpAttr {
        state: QpState::Init,
        access: Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC
            | Access::FLUSH_GLOBAL,
        ..QpAttr::default()
    };
    qp.modify(
        now,
        &attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .expect("INIT");
    attr.state = QpState::ReadyToReceive;
    attr.path = Some(Path {
        dst: peer,
        dst_port: ROCE_V2_PORT,
        sgid_index: 0,
        flow_label: 0,
        hop_limit: 64,
        traffic_class: 0,
    });
    attr.path_mtu = cfg.mtu;
    attr.dest_qpn = peer_qpn;
    attr.rq_psn = rq_psn;
    attr.max_dest_rd_atomic = cfg.rd_atomic;
    attr.min_rnr_timer = RnrTimer::from_code(cfg.min_rnr_timer);
    let rc = cfg.qp_type == QpType::Rc;
    let rc_rtr =
        if rc { AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER } else { AttrMask::NONE };
    qp.modify(
        now,
        &attr,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | rc_rtr,
    )
    .expect("RTR");
    attr.state = QpState::ReadyToSend;
    attr.timeout = LocalAckTimeout::saturating(cfg.timeout);
    attr.retry_cnt = cfg.retry_cnt;
    attr.rnr_retry = cfg.rnr_retry;
    attr.sq_psn = sq_psn;
    attr.max_rd_atomic = cfg.rd_atomic;
    let rc_rts = if rc {
        AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC
    } else {
        AttrMask::NONE
    };
    qp.modify(now, &attr, AttrMask::STATE | AttrMask::SQ_PSN | rc_rts).expect("RTS");
}
