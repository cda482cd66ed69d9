//! `ibv_open_qp` of an XRC target QP that another process of the device
//! created. The QP lives in its creator's context (its packets are
//! steered there by QPN), so the opener gets a proxy: its `modify` and
//! `query` are requests to the creator's context, answered over control
//! datagrams (`uroce_transport::Endpoint::send_control`: the relay path
//! between the device's processes, the local path or UDP steered by QPN).
//!
//! Creators list their shared domains' target QPs in the domain's table
//! (`xrc_share`, number tagged [`TARGET_TAG`]) so that an opener finds
//! them; an opener lists its proxy's number (tagged [`OPENER_TAG`]) so
//! that the creator knows it alive. The creator keeps the QP while its
//! own handles or any live opener's remain (the kernel keeps a shared QP
//! until its last handle closes), and forwards the QP's async events to
//! every opener. When the creator's process ends, the QP ends with it: the
//! openers' requests then fail (`ETIMEDOUT`), as the kernel would not do;
//! moving a QP's state to another process is not done.
//!
//! A request is sent again until answered (every 50 ms, for 2 s); the
//! creator answers a resent one from its last answer to that proxy, so a
//! modify is never done twice.

use std::net::IpAddr;
use std::sync::Arc;

use uroce_transport::fastmap::FastMap;
use uroce_transport::wire::{LocalAckTimeout, Mtu, Psn, RnrTimer};
use uroce_transport::{
    Access, AttrMask, ControlDatagram, DeviceEvent, Endpoint, Path, QpAttr, QpState, SharedSrq,
};

/// The table's number for target QP `n` (SRQ numbers are below 2^24).
pub(crate) const TARGET_TAG: u32 = 1 << 31;
/// The table's number for an opener's proxy `n`.
pub(crate) const OPENER_TAG: u32 = 1 << 30;

const VERSION: u8 = 1;
const HEADER: usize = 16;
const ATTR_LEN: usize = 64;

/// What a control datagram asks or says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// An opener's handle now holds the QP.
    Open = 1,
    /// It no longer does.
    Close = 2,
    /// `ibv_modify_qp` (attributes and mask).
    Modify = 3,
    /// `ibv_query_qp`.
    Query = 4,
    /// The answer to a request (errno, and the attributes of a query).
    Reply = 5,
    /// An async event of the QP (its code).
    Event = 6,
}

impl Op {
    fn from_u8(v: u8) -> Option<Self> {
        [Self::Open, Self::Close, Self::Modify, Self::Query, Self::Reply, Self::Event]
            .into_iter()
            .find(|o| *o as u8 == v)
    }
}

/// A control message: the target QP and the proxy are the datagram's
/// numbers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Message {
    pub(crate) op: Op,
    /// The request's ID, which its answer repeats.
    pub(crate) id: u32,
    pub(crate) errno: i32,
    /// A modify's mask, or an event's code.
    pub(crate) word: u32,
    pub(crate) attr: Option<QpAttr>,
}

impl Message {
    pub(crate) fn emit(&self) -> Vec<u8> {
        let mut b = vec![0; HEADER + if self.attr.is_some() { ATTR_LEN } else { 0 }];
        b[0] = VERSION;
        b[1] = self.op as u8;
        b[2] = u8::from(self.attr.is_some());
        b[4..8].copy_from_slice(&self.id.to_be_bytes());
        b[8..12].copy_from_slice(&self.errno.to_be_bytes());
        b[12..16].copy_from_slice(&self.word.to_be_bytes());
        if let Some(a) = &self.attr {
            emit_attr(a, &mut b[HEADER..]);
        }
        b
    }

    pub(crate) fn parse(b: &[u8]) -> Option<Self> {
        let w = |at: usize| Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?));
        if *b.first()? != VERSION {
            return None;
        }
        let attr = match *b.get(2)? {
            0 => None,
            1 => Some(parse_attr(b.get(HEADER..HEADER + ATTR_LEN)?)?),
            _ => return None,
        };
        Some(Self {
            op: Op::from_u8(*b.get(1)?)?,
            id: w(4)?,
            errno: w(8)? as i32,
            word: w(12)?,
            attr,
        })
    }
}

fn emit_attr(a: &QpAttr, out: &mut [u8]) {
    out[0] = a.state as u8;
    out[1] = a.cur_state as u8;
    out[2] = a.port;
    out[3] = a.path_mtu as u8;
    out[4] = a.timeout.exponent();
    out[5] = a.retry_cnt;
    out[6] = a.rnr_retry;
    out[7] = a.max_rd_atomic;
    out[8] = a.min_rnr_timer.code();
    out[9] = a.max_dest_rd_atomic;
    out[10] = u8::from(a.sq_draining_notify);
    out[12..16].copy_from_slice(&a.access.0.to_be_bytes());
    out[16..18].copy_from_slice(&a.pkey_index.to_be_bytes());
    out[20..24].copy_from_slice(&a.qkey.to_be_bytes());
    out[24..28].copy_from_slice(&a.rq_psn.value().to_be_bytes());
    out[28..32].copy_from_slice(&a.sq_psn.value().to_be_bytes());
    out[32..36].copy_from_slice(&a.dest_qpn.to_be_bytes());
    if let Some(p) = &a.path {
        out[11] = 1;
        let (ip, family) = match p.dst {
            IpAddr::V4(v4) => (v4.to_ipv6_mapped(), 4),
            IpAddr::V6(v6) => (v6, 6),
        };
        out[36..52].copy_from_slice(&ip.octets());
        out[52] = family;
        out[53] = p.sgid_index;
        out[54] = p.hop_limit;
        out[55] = p.traffic_class;
        out[56..58].copy_from_slice(&p.dst_port.to_be_bytes());
        out[60..64].copy_from_slice(&p.flow_label.to_be_bytes());
    }
}

fn parse_attr(b: &[u8]) -> Option<QpAttr> {
    let w = |at: usize| Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let path = match b[11] {
        0 => None,
        _ => {
            let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&b[36..52]).ok()?);
            let dst = match b[52] {
                4 => IpAddr::V4(v6.to_ipv4_mapped()?),
                6 => IpAddr::V6(v6),
                _ => return None,
            };
            Some(Path {
                dst,
                dst_port: u16::from_be_bytes([b[56], b[57]]),
                sgid_index: b[53],
                flow_label: w(60)?,
                hop_limit: b[54],
                traffic_class: b[55],
            })
        }
    };
    Some(QpAttr {
        state: QpState::from_ibv(b[0].into())?,
        cur_state: QpState::from_ibv(b[1].into())?,
        access: Access(w(12)?),
        pkey_index: u16::from_be_bytes([b[16], b[17]]),
        port: b[2],
        qkey: w(20)?,
        path,
        path_mtu: Mtu::from_ibv(b[3].into())?,
        timeout: LocalAckTimeout::new(b[4])?,
        retry_cnt: b[5],
        rnr_retry: b[6],
        rq_psn: Psn::new(w(24)? & 0xff_ffff),
        max_rd_atomic: b[7],
        min_rnr_timer: RnrTimer::from_code(b[8] & 0x1f),
        sq_psn: Psn::new(w(28)? & 0xff_ffff),
        max_dest_rd_atomic: b[9],
        dest_qpn: w(32)?,
        sq_draining_notify: b[10] != 0,
    })
}

/// An event's code on the wire (`ibv_event_type`'s), for the QP events a
/// target QP raises.
fn event_code(e: &DeviceEvent) -> Option<(u32, u32)> {
    match *e {
        DeviceEvent::QpFatal { qpn } => Some((qpn, 1)),
        DeviceEvent::QpRequestError { qpn } => Some((qpn, 2)),
        DeviceEvent::QpAccessError { qpn } => Some((qpn, 3)),
        DeviceEvent::SqDrained { qpn } => Some((qpn, 5)),
        DeviceEvent::QpLastWqeReached { qpn } => Some((qpn, 15)),
        _ => None,
    }
}

fn event_of(qpn: u32, code: u32) -> Option<DeviceEvent> {
    Some(match code {
        1 => DeviceEvent::QpFatal { qpn },
        2 => DeviceEvent::QpRequestError { qpn },
        3 => DeviceEvent::QpAccessError { qpn },
        5 => DeviceEvent::SqDrained { qpn },
        15 => DeviceEvent::QpLastWqeReached { qpn },
        _ => return None,
    })
}

/// A context's side of opened target QPs.
#[derive(Default)]
pub(crate) struct Opens {
    /// As a creator: its target QPs of shared domains, by number.
    targets: FastMap<u32, Shared>,
    /// As an opener: the requests waiting for an answer, and the answers
    /// in, by request ID.
    replies: FastMap<u32, Option<Message>>,
    /// As an opener: its proxies' numbers and the target QP of each.
    proxies: FastMap<u32, u32>,
    last_id: u32,
    /// Control datagrams may come (a target QP was listed, or a request
    /// made): the driver looks for them from then on.
    enabled: bool,
    /// Domains whose handles here are all closed while target QPs of
    /// theirs are kept for openers: shared until the last goes.
    closed: Vec<u32>,
}

/// A target QP of a shared domain, as its creator keeps it.
struct Shared {
    /// Its domain.
    xrcd: u32,
    /// Its listing in the domain's table, where openers find it.
    _listing: Arc<dyn SharedSrq>,
    domain: Arc<crate::xrc_share::Domain>,
    /// Openers' proxies, with the last answer each was given (request ID
    /// and datagram body), for a request sent again.
    openers: FastMap<u32, (u32, Vec<u8>)>,
    /// Whether a handle of this process still holds it.
    local: bool,
}

/// What [`Opens`] needs of the driver that holds it.
pub(crate) trait Host {
    fn endpoint(&mut self) -> &mut Endpoint;
    /// The device's own address and its GID index: where control
    /// datagrams go (every process of the device has it).
    fn control_addr(&self) -> (IpAddr, u8);
    fn modify_qp(&mut self, qpn: u32, attr: &QpAttr, mask: AttrMask) -> crate::Result<()>;
    fn destroy_qp(&mut self, qpn: u32);
}

fn send(host: &mut dyn Host, (dest, src): (u32, u32), body: &[u8]) {
    let (to, sgid) = host.control_addr();
    host.endpoint().send_control((dest, src), to, sgid, body);
}

impl Opens {
    /// Lists target QP `qpn` of a shared domain, so that other processes
    /// may open it; control datagrams reach this context from now on.
    pub(crate) fn share_target(
        &mut self,
        ep: &mut Endpoint,
        (xrcd, qpn): (u32, u32),
        listing: Arc<dyn SharedSrq>,
        domain: Arc<crate::xrc_share::Domain>,
    ) {
        ep.enable_control(256);
        self.enabled = true;
        let openers = FastMap::default();
        let s = Shared { xrcd, _listing: listing, domain, openers, local: true };
        self.targets.insert(qpn, s);
    }

    /// Whether target QPs of domain `xrcd` are kept for other processes'
    /// handles after this process's went (`ibv_close_xrcd` is EBUSY
    /// meanwhile, as the kernel's is while a QP uses the domain).
    pub(crate) fn keeps_domain(&self, xrcd: u32) -> bool {
        self.targets.values().any(|s| s.xrcd == xrcd && !s.local)
    }

    /// Domain `xrcd`'s last handle here went: whether to stop sharing it
    /// now (else when its last kept target QP goes).
    pub(crate) fn domain_closed(&mut self, xrcd: u32) -> bool {
        // A target QP whose handle here goes after the domain's (a
        // handle's fields drop in order) may be kept too.
        if self.targets.values().any(|s| s.xrcd == xrcd) {
            self.closed.push(xrcd);
            return false;
        }
        true
    }

    /// Target QP `qpn` is gone: so is its domain, if closed here and
    /// keeping no other.
    fn forget(&mut self, ep: &mut Endpoint, qpn: u32) {
        let Some(s) = self.targets.remove(&qpn) else { return };
        if self.closed.contains(&s.xrcd) && !self.targets.values().any(|t| t.xrcd == s.xrcd) {
            self.closed.retain(|&x| x != s.xrcd);
            ep.unshare_xrcd(s.xrcd);
        }
    }

    /// The last handle of this process to target QP `qpn` went: whether
    /// to destroy it (no other process's handle holds it).
    pub(crate) fn target_dropped(&mut self, ep: &mut Endpoint, qpn: u32) -> bool {
        if let Some(s) = self.targets.get_mut(&qpn)
            && !s.openers.is_empty()
        {
            s.local = false;
            return false;
        }
        self.forget(ep, qpn);
        true
    }

    /// As an opener: sends request `op` about target QP `target` from
    /// proxy `proxy` (ID `id`, 0 for a new one); returns its ID.
    pub(crate) fn request(
        &mut self,
        host: &mut dyn Host,
        (target, proxy): (u32, u32),
        id: u32,
        (op, word, attr): (Op, u32, Option<QpAttr>),
    ) -> u32 {
        host.endpoint().enable_control(256);
        self.enabled = true;
        self.proxies.insert(proxy, target);
        let id = if id != 0 {
            id
        } else {
            self.last_id = self.last_id.wrapping_add(1).max(1);
            if op != Op::Close {
                self.replies.insert(self.last_id, None);
            }
            self.last_id
        };
        let m = Message { op, id, errno: 0, word, attr };
        send(host, (target, proxy), &m.emit());
        id
    }

    /// As an opener: the answer to request `id`, once in.
    pub(crate) fn take_reply(&mut self, id: u32) -> Option<Message> {
        self.replies.get(&id)?.as_ref()?;
        self.replies.remove(&id).flatten()
    }

    /// As an opener: request `id` is given up.
    pub(crate) fn forget_request(&mut self, id: u32) {
        self.replies.remove(&id);
    }

    /// As an opener: proxy `proxy` is closed (its handle went).
    pub(crate) fn close(&mut self, host: &mut dyn Host, target: u32, proxy: u32) {
        self.request(host, (target, proxy), 0, (Op::Close, 0, None));
        self.proxies.remove(&proxy);
    }

    /// Takes the control datagrams that came: requests to this context's
    /// target QPs, answers and events for its proxies.
    pub(crate) fn drive(&mut self, host: &mut dyn Host) -> bool {
        let mut work = false;
        while let Some(d) = host.endpoint().poll_control() {
            work = true;
            let Some(m) = Message::parse(&d.body) else { continue };
            match m.op {
                Op::Reply => {
                    // Only an answer someone waits for is kept.
                    if self.proxies.contains_key(&d.dest_qpn)
                        && let Some(slot @ None) = self.replies.get_mut(&m.id)
                    {
                        *slot = Some(m);
                    }
                }
                Op::Event => {
                    if let Some(&target) = self.proxies.get(&d.dest_qpn)
                        && target == d.src_qpn
                        && let Some(e) = event_of(target, m.word)
                    {
                        host.endpoint().push_event(e);
                    }
                }
                _ => self.serve(host, &d, &m),
            }
        }
        work
    }

    /// As a creator: runs an opener's request to one of its target QPs,
    /// and answers it.
    fn serve(&mut self, host: &mut dyn Host, d: &ControlDatagram, m: &Message) {
        let (target, proxy) = (d.dest_qpn, d.src_qpn);
        let Some(s) = self.targets.get_mut(&target) else {
            // Not (or no longer) ours: the opener's request fails.
            if m.op != Op::Close {
                let r =
                    Message { op: Op::Reply, id: m.id, errno: libc::EINVAL, word: 0, attr: None };
                send(host, (proxy, target), &r.emit());
            }
            return;
        };
        if let Some((id, body)) = s.openers.get(&proxy)
            && *id == m.id
        {
            // Asked again (the answer lost): the same answer.
            let body = body.clone();
            send(host, (proxy, target), &body);
            return;
        }
        let mut reply = Message { op: Op::Reply, id: m.id, errno: 0, word: 0, attr: None };
        match m.op {
            Op::Open => {
                s.openers.insert(proxy, (0, Vec::new()));
            }
            Op::Close => {
                s.openers.remove(&proxy);
                if s.openers.is_empty() && !s.local {
                    self.forget(host.endpoint(), target);
                    host.destroy_qp(target);
                }
                return;
            }
            _ if !s.openers.contains_key(&proxy) => reply.errno = libc::EINVAL,
            Op::Modify => {
                let attr = m.attr.unwrap_or_default();
                if let Err(e) = host.modify_qp(target, &attr, AttrMask(m.word)) {
                    reply.errno = e.errno();
                }
            }
            Op::Query => match host.endpoint().qp(target) {
                Some(q) => reply.attr = Some(q.attr()),
                None => reply.errno = libc::EINVAL,
            },
            Op::Reply | Op::Event => return,
        }
        let body = reply.emit();
        if let Some(o) = self.targets.get_mut(&target).and_then(|s| s.openers.get_mut(&proxy)) {
            *o = (m.id, body.clone());
        }
        send(host, (proxy, target), &body);
    }

    /// As a creator: sends a target QP's async event to its openers too.
    pub(crate) fn forward(&self, host: &mut dyn Host, e: &DeviceEvent) {
        let Some((qpn, code)) = event_code(e) else { return };
        let Some(s) = self.targets.get(&qpn) else { return };
        let m = Message { op: Op::Event, id: 0, errno: 0, word: code, attr: None }.emit();
        for &p in s.openers.keys() {
            send(host, (p, qpn), &m);
        }
    }

    /// As a creator: forgets openers whose process is gone (their listing
    /// went with it), and destroys the target QPs nobody holds any more.
    pub(crate) fn check_openers(&mut self, host: &mut dyn Host) {
        let mut gone = Vec::new();
        for (&qpn, s) in &mut self.targets {
            s.openers.retain(|&p, _| s.domain.listed_alive(OPENER_TAG | p));
            if s.openers.is_empty() && !s.local {
                gone.push(qpn);
            }
        }
        for qpn in gone {
            self.forget(host.endpoint(), qpn);
            host.destroy_qp(qpn);
        }
    }

    /// Whether this context ever listed a target QP or opened another
    /// process's (the driver then looks for control datagrams).
    pub(crate) fn any(&self) -> bool {
        self.enabled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_with_and_without_attributes() {
        let attr = QpAttr {
            state: QpState::ReadyToReceive,
            access: Access(7),
            path: Some(Path {
                dst: "10.1.2.3".parse().unwrap(),
                dst_port: 4791,
                sgid_index: 1,
                flow_label: 0xabcde,
                hop_limit: 64,
                traffic_class: 0x20,
            }),
            path_mtu: Mtu::Mtu4096,
            rq_psn: Psn::new(0x12_3456),
            dest_qpn: 0x4_0001,
            max_dest_rd_atomic: 16,
            min_rnr_timer: RnrTimer::from_code(12),
            ..QpAttr::default()
        };
        let m = Message { op: Op::Modify, id: 9, errno: 0, word: 0x1234, attr: Some(attr) };
        assert_eq!(Message::parse(&m.emit()), Some(m));
        let mut v6 = attr;
        v6.path.as_mut().unwrap().dst = "fe80::1".parse().unwrap();
        let m = Message { op: Op::Reply, id: 1, errno: -22, word: 0, attr: Some(v6) };
        assert_eq!(Message::parse(&m.emit()), Some(m));
        let m = Message { op: Op::Event, id: 0, errno: 0, word: 1, attr: None };
        assert_eq!(Message::parse(&m.emit()), Some(m.clone()));
        let mut bad = m.emit();
        bad[1] = 99;
        assert_eq!(Message::parse(&bad), None, "an unknown op");
        assert_eq!(Message::parse(&[]), None);
        assert_eq!(event_of(5, 1), Some(DeviceEvent::QpFatal { qpn: 5 }));
        assert_eq!(event_code(&DeviceEvent::QpFatal { qpn: 5 }), Some((5, 1)));
    }
}
