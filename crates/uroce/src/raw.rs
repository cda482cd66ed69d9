//! Raw packet QPs (`IBV_QPT_RAW_PACKET`) and the flow rules that steer
//! frames to them (`ibv_create_flow`): a QP of whole Ethernet frames, sent
//! as posted (the application builds every header) and received as its
//! rules match them, with no transport, no PSN and no acknowledgement.
//!
//! A NIC switches frames to QPs by the rules of its port; here one packet
//! socket per context (on the device's interface, opened with its first
//! raw QP; it needs `CAP_NET_RAW`, as the kernel asks of a raw QP's
//! creator) receives every frame the interface receives, and each frame
//! goes, as on mlx5, to the QP of the best (lowest-numbered priority)
//! matching normal rule, else to the `ALL_DEFAULT` rule's (or, multicast,
//! `MC_DEFAULT`'s); every sniffer rule's QP gets a copy. Frames the
//! interface sends are not received again (on `lo`, whatever is sent comes
//! back as received, so raw QPs of one host see each other's frames there).
//! Each process's socket sees every frame: processes do not share a port's
//! rules, as functions of a NIC would not.

use std::collections::{HashMap, VecDeque};

use uroce_transport::{
    Access, Accessor, AttrMask, Completion, Key, Memory, ModifyError, PostError, QpAttr, QpState,
    QpType, RecvWr, SendFlags, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};

use crate::backend::packet::PacketSocket;

/// The longest frame a raw QP sends or receives (a 9000-byte jumbo
/// payload, its Ethernet and VLAN headers).
pub const MAX_FRAME: usize = 9018;

/// What a flow rule matches in one header: a frame matches where its
/// field, masked, equals the value, masked. Each spec of a kind also asks
/// that the frame be of that kind (an IPv4 spec: an IPv4 frame; TCP: a TCP
/// segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowSpec {
    /// Ethernet (`IBV_FLOW_SPEC_ETH`): addresses, EtherType, VLAN tag.
    Eth {
        /// Destination MAC and its mask.
        dst: ([u8; 6], [u8; 6]),
        /// Source MAC and its mask.
        src: ([u8; 6], [u8; 6]),
        /// EtherType (after a VLAN tag, if any) and its mask.
        ether_type: (u16, u16),
        /// VLAN tag control (0 without a tag) and its mask.
        vlan: (u16, u16),
    },
    /// IPv4 (`IBV_FLOW_SPEC_IPV4` and `_IPV4_EXT`).
    Ipv4 {
        /// Source address and mask.
        src: ([u8; 4], [u8; 4]),
        /// Destination address and mask.
        dst: ([u8; 4], [u8; 4]),
        /// Protocol and mask.
        proto: (u8, u8),
        /// Type of service and mask.
        tos: (u8, u8),
        /// Time to live and mask.
        ttl: (u8, u8),
    },
    /// IPv6 (`IBV_FLOW_SPEC_IPV6`).
    Ipv6 {
        /// Source address and mask.
        src: ([u8; 16], [u8; 16]),
        /// Destination address and mask.
        dst: ([u8; 16], [u8; 16]),
        /// Next header and mask.
        next_hdr: (u8, u8),
        /// Traffic class and mask.
        traffic_class: (u8, u8),
        /// Flow label and mask.
        flow_label: (u32, u32),
        /// Hop limit and mask.
        hop_limit: (u8, u8),
    },
    /// TCP ports (`IBV_FLOW_SPEC_TCP`), source and destination with masks.
    Tcp {
        /// Source port and mask.
        src: (u16, u16),
        /// Destination port and mask.
        dst: (u16, u16),
    },
    /// UDP ports (`IBV_FLOW_SPEC_UDP`).
    Udp {
        /// Source port and mask.
        src: (u16, u16),
        /// Destination port and mask.
        dst: (u16, u16),
    },
}

/// What a flow rule takes (`enum ibv_flow_attr_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowKind {
    /// Frames its specs match.
    Normal,
    /// Frames no normal rule takes.
    AllDefault,
    /// Multicast frames no normal rule takes.
    McDefault,
    /// A copy of every frame.
    Sniffer,
}

/// A flow rule (`struct ibv_flow_attr` and its specs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowAttr {
    /// What it takes.
    pub kind: FlowKind,
    /// Lower numbers win among normal rules.
    pub priority: u16,
    /// Every spec must match (normal rules).
    pub specs: Vec<FlowSpec>,
}

/// An IPv4 header's fields rules read: source, destination, protocol,
/// TOS, TTL.
type V4 = ([u8; 4], [u8; 4], u8, u8, u8);
/// An IPv6 header's: source, destination, next header, traffic class,
/// flow label, hop limit.
type V6 = ([u8; 16], [u8; 16], u8, u8, u32, u8);

/// A frame's fields, as rules read them.
#[derive(Default)]
struct Fields {
    dst: [u8; 6],
    src: [u8; 6],
    ether_type: u16,
    vlan: u16,
    v4: Option<V4>,
    v6: Option<V6>,
    /// L4 protocol and ports.
    l4: Option<(u8, u16, u16)>,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn array<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at + N)?.try_into().ok()
}

/// Reads a frame's headers (as far as they go; short ones match less).
fn fields(f: &[u8]) -> Option<Fields> {
    let mut x = Fields { dst: array(f, 0)?, src: array(f, 6)?, ..Fields::default() };
    let mut l3 = 14;
    x.ether_type = be16(f, 12)?;
    if x.ether_type == 0x8100 {
        x.vlan = be16(f, 14)?;
        x.ether_type = be16(f, 16)?;
        l3 = 18;
    }
    let ip = f.get(l3..).unwrap_or(&[]);
    let l4 = match x.ether_type {
        0x0800 if ip.len() >= 20 && ip[0] >> 4 == 4 => {
            let proto = ip[9];
            x.v4 = Some((array(ip, 12)?, array(ip, 16)?, proto, ip[1], ip[8]));
            // Later fragments carry no L4 header.
            let later = be16(ip, 6)? & 0x1fff != 0;
            (!later).then(|| (proto, ip.get(usize::from(ip[0] & 0xf) * 4..)))
        }
        0x86dd if ip.len() >= 40 && ip[0] >> 4 == 6 => {
            let word = u32::from_be_bytes(array(ip, 0)?);
            let tc = (word >> 20) as u8;
            x.v6 = Some((array(ip, 8)?, array(ip, 24)?, ip[6], tc, word & 0xf_ffff, ip[7]));
            Some((ip[6], ip.get(40..)))
        }
        _ => None,
    };
    if let Some((proto, Some(l4))) = l4
        && (proto == 6 || proto == 17)
    {
        x.l4 = Some((proto, be16(l4, 0)?, be16(l4, 2)?));
    }
    Some(x)
}

fn eq<const N: usize>(got: &[u8; N], (want, mask): &([u8; N], [u8; N])) -> bool {
    got.iter().zip(want).zip(mask).all(|((g, w), m)| g & m == w & m)
}

fn eq16(got: u16, (want, mask): (u16, u16)) -> bool {
    got & mask == want & mask
}

fn eq8(got: u8, (want, mask): (u8, u8)) -> bool {
    got & mask == want & mask
}

impl FlowSpec {
    fn matches(&self, x: &Fields) -> bool {
        match *self {
            Self::Eth { dst, src, ether_type, vlan } => {
                eq(&x.dst, &dst)
                    && eq(&x.src, &src)
                    && eq16(x.ether_type, ether_type)
                    && eq16(x.vlan, vlan)
            }
            Self::Ipv4 { src, dst, proto, tos, ttl } => x.v4.is_some_and(|(s, d, p, t, l)| {
                eq(&s, &src) && eq(&d, &dst) && eq8(p, proto) && eq8(t, tos) && eq8(l, ttl)
            }),
            Self::Ipv6 { src, dst, next_hdr, traffic_class, flow_label, hop_limit } => {
                x.v6.is_some_and(|(s, d, n, tc, fl, h)| {
                    eq(&s, &src)
                        && eq(&d, &dst)
                        && eq8(n, next_hdr)
                        && eq8(tc, traffic_class)
                        && fl & flow_label.1 == flow_label.0 & flow_label.1
                        && eq8(h, hop_limit)
                })
            }
            Self::Tcp { src, dst } => {
                x.l4.is_some_and(|(p, s, d)| p == 6 && eq16(s, src) && eq16(d, dst))
            }
            Self::Udp { src, dst } => {
                x.l4.is_some_and(|(p, s, d)| p == 17 && eq16(s, src) && eq16(d, dst))
            }
        }
    }
}

/// Posted receives (a raw QP's or a work queue's), and where their
/// completions go.
#[derive(Debug)]
struct RecvQueue {
    pd: u32,
    cq: u32,
    depth: usize,
    max_sge: u32,
    wqes: VecDeque<(u64, Vec<Sge>)>,
}

/// What became of a frame handed to a receive queue.
#[derive(Debug, PartialEq, Eq)]
enum Delivered {
    /// No receive was posted: dropped.
    NoWqe,
    /// Into the next receive.
    Done,
    /// The receive completed in error (too short, or memory it cannot
    /// write): the queue's other receives were flushed.
    Failed,
}

impl RecvQueue {
    fn new(pd: u32, cq: u32, depth: u32, max_sge: u32) -> Self {
        Self { pd, cq, depth: depth as usize, max_sge, wqes: VecDeque::new() }
    }

    /// Posts `wrs` (`open`: the queue's state takes posts).
    fn post(&mut self, wrs: &[RecvWr<'_>], open: bool) -> Result<(), (usize, PostError)> {
        for (i, wr) in wrs.iter().enumerate() {
            if !open {
                return Err((i, PostError::InvalidState));
            }
            if self.wqes.len() >= self.depth {
                return Err((i, PostError::QueueFull));
            }
            if wr.sgl.len() > self.max_sge as usize {
                return Err((i, PostError::TooManySge));
            }
            self.wqes.push_back((wr.wr_id, wr.sgl.to_vec()));
        }
        Ok(())
    }

    /// Completes every receive with a flush error, in the name of `num`.
    fn flush(&mut self, num: u32, cqs: &mut dyn CqSink) {
        for (wr_id, _) in self.wqes.drain(..) {
            let c = Completion::new(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, num, true);
            cqs.complete(self.cq, c);
        }
    }

    /// Puts `frame` into the next receive, completed in the name of `num`
    /// (a QP's or a work queue's number).
    fn deliver(
        &mut self,
        num: u32,
        frame: &[u8],
        mem: &dyn Memory,
        cqs: &mut dyn CqSink,
    ) -> Delivered {
        let Some((wr_id, sgl)) = self.wqes.pop_front() else { return Delivered::NoWqe };
        let status = scatter(&sgl, Accessor { pd: self.pd, qpn: num }, mem, frame);
        let mut c = Completion::new(wr_id, status, WcOpcode::Recv, num, true);
        c.byte_len = frame.len() as u32;
        cqs.complete(self.cq, c);
        if status == WcStatus::Success {
            return Delivered::Done;
        }
        self.flush(num, cqs);
        Delivered::Failed
    }
}

/// One raw QP's state.
#[derive(Debug)]
struct RawQp {
    pd: u32,
    send_cq: u32,
    state: QpState,
    port: u8,
    sq_sig_all: bool,
    max_send_sge: u32,
    max_inline: u32,
    rq: RecvQueue,
    /// An RSS QP's hash and indirection table: its frames go to the work
    /// queue the hash picks (it has no receive queue of its own).
    rss: Option<Rss>,
}

/// How an RSS QP spreads frames (`struct ibv_rx_hash_conf`): a Toeplitz
/// hash of the fields `fields` names (`IBV_RX_HASH_*` bits) with `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RxHash {
    /// `IBV_RX_HASH_SRC_IPV4` and the rest.
    pub fields: u64,
    /// The Toeplitz key (40 bytes, usually).
    pub key: Vec<u8>,
}

#[derive(Debug)]
struct Rss {
    hash: RxHash,
    /// Work queue numbers, a power of two of them.
    table: Vec<u32>,
}

/// A receive work queue's state (`enum ibv_wq_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WqState {
    /// Takes receives, delivers nothing.
    Reset,
    /// Ready.
    Ready,
    /// Receives flushed.
    Error,
}

/// A receive work queue (`ibv_wq`): receives for the RSS QPs whose
/// tables name it.
#[derive(Debug)]
struct WorkQueue {
    state: WqState,
    rq: RecvQueue,
}

/// A context's raw QPs, their rules and their packet socket.
#[derive(Debug, Default)]
pub(crate) struct RawQps {
    sock: Option<PacketSocket>,
    qps: HashMap<u32, RawQp>,
    wqs: HashMap<u32, WorkQueue>,
    rules: Vec<(u32, u32, FlowAttr)>,
    next_rule: u32,
    /// Frames received that no rule took, or whose QP had no receive
    /// posted (dropped, as a NIC drops them).
    pub(crate) dropped: u64,
    frame: Vec<u8>,
}

/// How a raw QP was asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawInit {
    pub(crate) qpn: u32,
    pub(crate) pd: u32,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) sq_sig_all: bool,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline: u32,
    pub(crate) rq_depth: u32,
}

/// Where raw QPs' completions go: the endpoint's CQs.
pub(crate) trait CqSink {
    /// Puts `c` on CQ `cq`.
    fn complete(&mut self, cq: u32, c: Completion);
}

impl RawQps {
    /// Adds a raw QP; the first opens the packet socket on `ifindex`.
    pub(crate) fn create(&mut self, ifindex: u32, init: RawInit) -> std::io::Result<()> {
        if self.sock.is_none() {
            self.sock = Some(PacketSocket::open(ifindex)?);
        }
        self.qps.insert(
            init.qpn,
            RawQp {
                pd: init.pd,
                send_cq: init.send_cq,
                state: QpState::Reset,
                port: 1,
                sq_sig_all: init.sq_sig_all,
                max_send_sge: init.max_send_sge,
                max_inline: init.max_inline,
                rq: RecvQueue::new(init.pd, init.recv_cq, init.rq_depth, init.max_recv_sge),
                rss: None,
            },
        );
        Ok(())
    }

    /// Adds an RSS QP spreading frames over work queues `table` (a power
    /// of two of them, each of this context) by `hash`: ready to receive
    /// at once, as mlx5's are (they have no states to move through).
    pub(crate) fn create_rss(
        &mut self,
        ifindex: u32,
        init: RawInit,
        table: Vec<u32>,
        hash: RxHash,
    ) -> std::io::Result<()> {
        self.create(ifindex, init)?;
        if let Some(q) = self.qps.get_mut(&init.qpn) {
            q.state = QpState::ReadyToReceive;
            q.rss = Some(Rss { hash, table });
        }
        Ok(())
    }

    /// Adds work queue `wqn`.
    pub(crate) fn create_wq(&mut self, wqn: u32, pd: u32, cq: u32, depth: u32, max_sge: u32) {
        let wq = WorkQueue { state: WqState::Reset, rq: RecvQueue::new(pd, cq, depth, max_sge) };
        self.wqs.insert(wqn, wq);
    }

    /// Removes work queue `wqn`.
    pub(crate) fn destroy_wq(&mut self, wqn: u32) {
        self.wqs.remove(&wqn);
    }

    /// `ibv_modify_wq`'s state change: to ERR its receives are flushed,
    /// to RESET dropped.
    pub(crate) fn modify_wq(&mut self, wqn: u32, state: WqState, cqs: &mut dyn CqSink) -> bool {
        let Some(w) = self.wqs.get_mut(&wqn) else { return false };
        match state {
            WqState::Reset => w.rq.wqes.clear(),
            WqState::Error if w.state != WqState::Error => w.rq.flush(wqn, cqs),
            _ => {}
        }
        w.state = state;
        true
    }

    /// The state of work queue `wqn`.
    pub(crate) fn wq_state(&self, wqn: u32) -> Option<WqState> {
        self.wqs.get(&wqn).map(|w| w.state)
    }

    /// `ibv_post_wq_recv`.
    pub(crate) fn post_wq_recv(
        &mut self,
        wqn: u32,
        wrs: &[RecvWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        let Some(w) = self.wqs.get_mut(&wqn) else { return Err((0, PostError::InvalidState)) };
        w.rq.post(wrs, w.state != WqState::Error)
    }

    /// Removes a raw QP and its rules; the last closes the socket.
    pub(crate) fn destroy(&mut self, qpn: u32) {
        self.qps.remove(&qpn);
        self.rules.retain(|r| r.1 != qpn);
        if self.qps.is_empty() {
            self.sock = None;
        }
    }

    /// The QP's state and port.
    pub(crate) fn query(&self, qpn: u32) -> Option<(QpState, u8)> {
        self.qps.get(&qpn).map(|q| (q.state, q.port))
    }

    /// `ibv_modify_qp` on a raw QP: the kernel's rules for the type; to
    /// ERR its receives are flushed, to RESET dropped.
    pub(crate) fn modify(
        &mut self,
        qpn: u32,
        attr: &QpAttr,
        mask: AttrMask,
        cqs: &mut dyn CqSink,
    ) -> Result<(), ModifyError> {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return Err(ModifyError::BadValue("QP destroyed"));
        };
        if q.rss.is_some() {
            return Err(ModifyError::BadValue("an RSS QP has no states to move through"));
        }
        let next = if mask.contains(AttrMask::STATE) { attr.state } else { q.state };
        uroce_transport::check_transition(QpType::RawPacket, q.state, next, mask)?;
        if mask.contains(AttrMask::PORT) {
            if attr.port != 1 {
                return Err(ModifyError::BadValue("port_num"));
            }
            q.port = attr.port;
        }
        match next {
            QpState::Reset => q.rq.wqes.clear(),
            QpState::Error if q.state != QpState::Error => q.rq.flush(qpn, cqs),
            _ => {}
        }
        q.state = next;
        Ok(())
    }

    /// `ibv_post_recv` on a raw QP.
    pub(crate) fn post_recv(
        &mut self,
        qpn: u32,
        wrs: &[RecvWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        let Some(q) = self.qps.get_mut(&qpn) else { return Err((0, PostError::InvalidState)) };
        q.rq.post(wrs, q.state != QpState::Reset)
    }

    /// `ibv_post_send` on a raw QP: each WR one frame, sent at once (SEND
    /// only; a frame shorter than an Ethernet header or longer than
    /// `MAX_FRAME` completes with a local length error, memory the QP
    /// cannot read with a local protection error).
    /// `inline`: how an `INLINE` WR's gather list is read (the C verbs
    /// contract reads it as plain memory, without an L_Key check); every
    /// other WR's goes through `mem`'s key checks.
    pub(crate) fn post_send(
        &mut self,
        qpn: u32,
        wrs: &[SendWr<'_>],
        mem: &dyn Memory,
        inline: Option<&dyn Memory>,
        cqs: &mut dyn CqSink,
    ) -> Result<(), (usize, PostError)> {
        let Some(q) = self.qps.get(&qpn) else { return Err((0, PostError::InvalidState)) };
        let Some(sock) = &self.sock else { return Err((0, PostError::InvalidState)) };
        let who = Accessor { pd: q.pd, qpn };
        for (i, wr) in wrs.iter().enumerate() {
            if q.state != QpState::ReadyToSend {
                return Err((i, PostError::InvalidState));
            }
            if wr.opcode != WrOpcode::Send {
                return Err((i, PostError::InvalidOpcode));
            }
            if wr.sgl.len() > q.max_send_sge as usize {
                return Err((i, PostError::TooManySge));
            }
            let frame = &mut self.frame;
            frame.clear();
            let is_inline = wr.flags.0 & SendFlags::INLINE.0 != 0;
            let status = if let Some(data) = wr.inline_data {
                if data.len() > q.max_inline as usize {
                    return Err((i, PostError::InlineTooLong));
                }
                frame.extend_from_slice(data);
                WcStatus::Success
            } else if is_inline {
                let len: usize = wr.sgl.iter().map(|s| s.length as usize).sum();
                if len > q.max_inline as usize {
                    return Err((i, PostError::InlineTooLong));
                }
                gather(wr.sgl, who, inline.unwrap_or(mem), frame)
            } else {
                gather(wr.sgl, who, mem, frame)
            };
            let status = match status {
                WcStatus::Success if frame.len() < 14 || frame.len() > MAX_FRAME => {
                    WcStatus::LocLenErr
                }
                // A frame the interface refuses is lost, as on a wire.
                WcStatus::Success => {
                    let _ = sock.send(frame);
                    WcStatus::Success
                }
                other => other,
            };
            let signaled = q.sq_sig_all || wr.flags.0 & SendFlags::SIGNALED.0 != 0;
            if signaled || status != WcStatus::Success {
                let mut c = Completion::new(wr.wr_id, status, WcOpcode::Send, qpn, false);
                c.byte_len = frame.len() as u32;
                cqs.complete(q.send_cq, c);
            }
        }
        Ok(())
    }

    /// Receives what waits on the packet socket (at most `budget` frames)
    /// and hands each to its rules' QPs; whether any came.
    pub(crate) fn poll(&mut self, budget: usize, mem: &dyn Memory, cqs: &mut dyn CqSink) -> bool {
        let Some(sock) = self.sock.take() else { return false };
        let mut buf = std::mem::take(&mut self.frame);
        buf.resize(MAX_FRAME, 0);
        let mut any = false;
        for _ in 0..budget {
            let Some((n, whole)) = sock.recv(&mut buf) else { break };
            any = true;
            if whole > MAX_FRAME {
                self.dropped += 1;
                continue;
            }
            let frame = &buf[..n];
            // Read once, for the rules and for an RSS hash.
            let Some(x) = fields(frame) else {
                self.dropped += 1;
                continue;
            };
            let targets = self.targets(&x);
            if targets.is_empty() {
                self.dropped += 1;
            }
            for qpn in targets {
                self.deliver(qpn, frame, &x, mem, cqs);
            }
        }
        self.frame = buf;
        self.sock = Some(sock);
        any
    }

    /// The QPs a frame goes to: sniffers', and the best normal rule's (or
    /// a default rule's).
    fn targets(&self, x: &Fields) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        let mut best: Option<(u16, u32)> = None;
        for (_, qpn, r) in &self.rules {
            match r.kind {
                FlowKind::Sniffer => out.push(*qpn),
                FlowKind::Normal
                    if r.specs.iter().all(|s| s.matches(x))
                        && best.is_none_or(|(p, _)| r.priority < p) =>
                {
                    best = Some((r.priority, *qpn));
                }
                _ => {}
            }
        }
        let fallback = || {
            let multicast = x.dst[0] & 1 != 0;
            let kind = |k| self.rules.iter().find(|r| r.2.kind == k).map(|r| r.1);
            multicast
                .then(|| kind(FlowKind::McDefault))
                .flatten()
                .or_else(|| kind(FlowKind::AllDefault))
        };
        if let Some(qpn) = best.map(|(_, q)| q).or_else(fallback)
            && !out.contains(&qpn)
        {
            out.push(qpn);
        }
        out
    }

    /// Puts `frame` into QP `qpn`'s next receive, if it takes frames (an
    /// RSS QP's: the work queue its hash picks).
    fn deliver(
        &mut self,
        qpn: u32,
        frame: &[u8],
        x: &Fields,
        mem: &dyn Memory,
        cqs: &mut dyn CqSink,
    ) {
        if let Some(rss) = self.qps.get(&qpn).and_then(|q| q.rss.as_ref()) {
            let h = toeplitz(&rss.hash.key, &hash_input(x, rss.hash.fields));
            let wqn = rss.table[h as usize & (rss.table.len() - 1)];
            return self.deliver_wq(wqn, frame, mem, cqs);
        }
        let Some(q) = self.qps.get_mut(&qpn) else { return };
        if !matches!(q.state, QpState::ReadyToReceive | QpState::ReadyToSend) {
            self.dropped += 1;
            return;
        }
        match q.rq.deliver(qpn, frame, mem, cqs) {
            Delivered::NoWqe => self.dropped += 1,
            // A receive error moves the QP to ERR.
            Delivered::Failed => q.state = QpState::Error,
            Delivered::Done => {}
        }
    }

    /// Puts `frame` into work queue `wqn`'s next receive.
    fn deliver_wq(&mut self, wqn: u32, frame: &[u8], mem: &dyn Memory, cqs: &mut dyn CqSink) {
        let Some(w) = self.wqs.get_mut(&wqn) else { return };
        if w.state != WqState::Ready {
            self.dropped += 1;
            return;
        }
        match w.rq.deliver(wqn, frame, mem, cqs) {
            Delivered::NoWqe => self.dropped += 1,
            Delivered::Failed => w.state = WqState::Error,
            Delivered::Done => {}
        }
    }

    /// Adds a rule steering to QP `qpn`; its handle.
    pub(crate) fn add_rule(&mut self, qpn: u32, attr: FlowAttr) -> Option<u32> {
        if !self.qps.contains_key(&qpn) {
            return None;
        }
        self.next_rule += 1;
        self.rules.push((self.next_rule, qpn, attr));
        Some(self.next_rule)
    }

    /// Removes rule `id`; false if there is none.
    pub(crate) fn remove_rule(&mut self, id: u32) -> bool {
        let before = self.rules.len();
        self.rules.retain(|r| r.0 != id);
        self.rules.len() != before
    }

    /// The packet socket's descriptor, to sleep on.
    pub(crate) fn raw_fd(&self) -> Option<i32> {
        self.sock.as_ref().map(PacketSocket::raw_fd)
    }
}

/// What an RSS hash reads of a frame's fields, in the order RSS defines: source
/// and destination address, then source and destination port (each only
/// if `mask` names it and the frame has it).
fn hash_input(x: &Fields, mask: u64) -> Vec<u8> {
    const SRC_IPV4: u64 = 1;
    const DST_IPV4: u64 = 2;
    const SRC_IPV6: u64 = 4;
    const DST_IPV6: u64 = 8;
    const TCP_PORTS: (u64, u64) = (0x10, 0x20);
    const UDP_PORTS: (u64, u64) = (0x40, 0x80);
    let mut out = Vec::with_capacity(36);
    if let Some((src, dst, ..)) = x.v4 {
        if mask & SRC_IPV4 != 0 {
            out.extend_from_slice(&src);
        }
        if mask & DST_IPV4 != 0 {
            out.extend_from_slice(&dst);
        }
    }
    if let Some((src, dst, ..)) = x.v6 {
        if mask & SRC_IPV6 != 0 {
            out.extend_from_slice(&src);
        }
        if mask & DST_IPV6 != 0 {
            out.extend_from_slice(&dst);
        }
    }
    if let Some((proto, sport, dport)) = x.l4 {
        let (s, d) = if proto == 6 { TCP_PORTS } else { UDP_PORTS };
        if mask & s != 0 {
            out.extend_from_slice(&sport.to_be_bytes());
        }
        if mask & d != 0 {
            out.extend_from_slice(&dport.to_be_bytes());
        }
    }
    out
}

/// The Toeplitz hash of `input` under `key` (Microsoft's RSS hash): for
/// each set bit of the input, the 32 key bits starting at its position.
fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let key_bit = |i: usize| key.get(i / 8).map_or(0, |b| u32::from(b >> (7 - i % 8)) & 1);
    let mut window = (0..32).fold(0u32, |w, i| (w << 1) | key_bit(i));
    let mut hash = 0;
    for (i, byte) in input.iter().enumerate() {
        for bit in 0..8 {
            if byte & (0x80 >> bit) != 0 {
                hash ^= window;
            }
            window = (window << 1) | key_bit(32 + i * 8 + bit);
        }
    }
    hash
}

/// Gathers `sgl` into `out` (each SGE checked against the QP's PD).
fn gather(sgl: &[Sge], who: Accessor, mem: &dyn Memory, out: &mut Vec<u8>) -> WcStatus {
    for s in sgl {
        let at = out.len();
        if at + s.length as usize > MAX_FRAME {
            return WcStatus::LocLenErr;
        }
        out.resize(at + s.length as usize, 0);
        if mem.read(Key::Local(s.lkey), who, s.addr, &mut out[at..]).is_err() {
            return WcStatus::LocProtErr;
        }
    }
    WcStatus::Success
}

/// Scatters `frame` over `sgl` (LOCAL_WRITE checked); a frame longer than
/// the list is a local length error.
fn scatter(sgl: &[Sge], who: Accessor, mem: &dyn Memory, frame: &[u8]) -> WcStatus {
    let room: u64 = sgl.iter().map(|s| u64::from(s.length)).sum();
    if frame.len() as u64 > room {
        return WcStatus::LocLenErr;
    }
    let mut rest = frame;
    for s in sgl {
        if rest.is_empty() {
            break;
        }
        let n = rest.len().min(s.length as usize);
        if mem.check(Key::Local(s.lkey), who, s.addr, n as u64, Access::LOCAL_WRITE).is_err()
            || mem.write(Key::Local(s.lkey), who, s.addr, &rest[..n]).is_err()
        {
            return WcStatus::LocProtErr;
        }
        rest = &rest[n..];
    }
    WcStatus::Success
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp4(dst_port: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + 4];
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&dst_port.to_be_bytes());
        f
    }

    fn rules(list: &[(u32, FlowAttr)]) -> RawQps {
        let mut r = RawQps::default();
        for (qpn, a) in list {
            r.qps.insert(
                *qpn,
                RawQp {
                    pd: 1,
                    send_cq: 0,
                    state: QpState::ReadyToSend,
                    port: 1,
                    sq_sig_all: false,
                    max_send_sge: 1,
                    max_inline: 0,
                    rq: RecvQueue::new(1, 0, 4, 1),
                    rss: None,
                },
            );
            r.add_rule(*qpn, a.clone());
        }
        r
    }

    /// Microsoft's RSS verification suite: 66.9.149.187:2794 ->
    /// 161.142.100.80:1766 hashes to 0x51ccc178 with ports, 0x323e8fc2
    /// without.
    #[test]
    fn toeplitz_matches_the_rss_verification_vectors() {
        let key = [
            0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
            0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
            0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
        ];
        let ips = [66u8, 9, 149, 187, 161, 142, 100, 80];
        assert_eq!(toeplitz(&key, &ips), 0x323e_8fc2);
        let mut with_ports = ips.to_vec();
        with_ports.extend_from_slice(&2794u16.to_be_bytes());
        with_ports.extend_from_slice(&1766u16.to_be_bytes());
        assert_eq!(toeplitz(&key, &with_ports), 0x51cc_c178);
    }

    #[test]
    fn the_best_matching_rule_takes_a_frame_and_sniffers_see_all() {
        let udp = |port: u16| FlowSpec::Udp { src: (0, 0), dst: (port, 0xffff) };
        let eth = FlowSpec::Eth {
            dst: ([0x02, 0, 0, 0, 0, 1], [0xff; 6]),
            src: ([0; 6], [0; 6]),
            ether_type: (0x0800, 0xffff),
            vlan: (0, 0),
        };
        let normal = |priority, specs| FlowAttr { kind: FlowKind::Normal, priority, specs };
        let r = rules(&[
            (10, normal(5, vec![eth, udp(4000)])),
            (11, normal(1, vec![udp(4000)])),
            (12, normal(0, vec![udp(5000)])),
            (13, FlowAttr { kind: FlowKind::AllDefault, priority: 0, specs: vec![] }),
            (14, FlowAttr { kind: FlowKind::Sniffer, priority: 0, specs: vec![] }),
        ]);
        let targets = |f: &[u8]| fields(f).map_or_else(Vec::new, |x| r.targets(&x));
        assert_eq!(targets(&udp4(4000)), vec![14, 11], "priority 1 beats 5");
        assert_eq!(targets(&udp4(5000)), vec![14, 12]);
        assert_eq!(targets(&udp4(6000)), vec![14, 13], "to the default rule");
        let mut tcp = udp4(4000);
        tcp[23] = 6;
        assert_eq!(targets(&tcp), vec![14, 13], "a UDP spec takes no TCP segment");
        assert_eq!(targets(&[0u8; 10]), Vec::<u32>::new(), "no whole Ethernet header");
    }
}
