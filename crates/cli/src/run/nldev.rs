//! The RDMA netlink family (`NETLINK_RDMA`, the kernel's "nldev") as
//! `rdma` (iproute2) and other tools speak it, answered from uroce's
//! devices. The kernel offers that family only with `ib_core` loaded, so
//! `uroce run` serves it itself (`notify` hands the requests over); this
//! module is the protocol: a request's bytes in, the reply datagrams out.
//!
//! Answered: the device dump and query (`rdma dev`), ports (`rdma link`),
//! the port's counters (`rdma statistic`), the system attributes
//! (`rdma sys`), a resource summary (`rdma res`: contexts, PDs, QPs, CQs,
//! MRs and SRQs, the objects uroce publishes across processes) and their
//! listings (`rdma res show ctx`, `pd`, `qp`, `cq`, `mr`, `srq`; not
//! `cm_id`). Everything else, links
//! added or deleted by netlink included, fails with `EOPNOTSUPP` and a
//! message saying why, as the kernel refuses what a device cannot do.
//!
//! Replies are framed as the kernel frames them for a socket with
//! `NETLINK_CAP_ACK`: a query is answered by its message and an ACK, a
//! dump by its messages and `NLMSG_DONE`, every datagram at most 4096
//! bytes (what libmnl reads at once).

use uroce::published::Object;

/// `RDMA_NL_NLDEV`: the client number in the message type's top bits.
const NLDEV: u16 = 5;

/// Commands (`RDMA_NLDEV_CMD_*`).
mod cmd {
    pub(super) const GET: u16 = 1;
    pub(super) const NEWLINK: u16 = 3;
    pub(super) const DELLINK: u16 = 4;
    pub(super) const PORT_GET: u16 = 5;
    pub(super) const SYS_GET: u16 = 6;
    pub(super) const RES_GET: u16 = 9;
    pub(super) const RES_QP_GET: u16 = 10;
    pub(super) const RES_CM_ID_GET: u16 = 11;
    pub(super) const RES_CQ_GET: u16 = 12;
    pub(super) const RES_MR_GET: u16 = 13;
    pub(super) const RES_PD_GET: u16 = 14;
    pub(super) const RES_CTX_GET: u16 = 22;
    pub(super) const RES_SRQ_GET: u16 = 23;
    pub(super) const STAT_GET: u16 = 17;
    pub(super) const STAT_GET_STATUS: u16 = 24;
}

/// Attributes (`RDMA_NLDEV_ATTR_*`).
mod attr {
    pub(super) const DEV_INDEX: u16 = 1;
    pub(super) const DEV_NAME: u16 = 2;
    pub(super) const PORT_INDEX: u16 = 3;
    pub(super) const CAP_FLAGS: u16 = 4;
    pub(super) const FW_VERSION: u16 = 5;
    pub(super) const NODE_GUID: u16 = 6;
    pub(super) const SYS_IMAGE_GUID: u16 = 7;
    pub(super) const PORT_STATE: u16 = 12;
    pub(super) const PORT_PHYS_STATE: u16 = 13;
    pub(super) const DEV_NODE_TYPE: u16 = 14;
    pub(super) const RES_SUMMARY: u16 = 15;
    pub(super) const RES_SUMMARY_ENTRY: u16 = 16;
    pub(super) const RES_SUMMARY_ENTRY_NAME: u16 = 17;
    pub(super) const RES_SUMMARY_ENTRY_CURR: u16 = 18;
    pub(super) const RES_QP: u16 = 19;
    pub(super) const RES_QP_ENTRY: u16 = 20;
    pub(super) const RES_LQPN: u16 = 21;
    pub(super) const RES_RQPN: u16 = 22;
    pub(super) const RES_RQ_PSN: u16 = 23;
    pub(super) const RES_SQ_PSN: u16 = 24;
    pub(super) const RES_PATH_MIG_STATE: u16 = 25;
    pub(super) const RES_TYPE: u16 = 26;
    pub(super) const RES_STATE: u16 = 27;
    pub(super) const RES_PID: u16 = 28;
    pub(super) const RES_CQ: u16 = 35;
    pub(super) const RES_CQ_ENTRY: u16 = 36;
    pub(super) const RES_CQE: u16 = 37;
    pub(super) const RES_USECNT: u16 = 38;
    pub(super) const RES_MR: u16 = 40;
    pub(super) const RES_MR_ENTRY: u16 = 41;
    pub(super) const RES_RKEY: u16 = 42;
    pub(super) const RES_LKEY: u16 = 43;
    pub(super) const RES_IOVA: u16 = 44;
    pub(super) const RES_MRLEN: u16 = 45;
    pub(super) const RES_PDN: u16 = 60;
    pub(super) const RES_CQN: u16 = 61;
    pub(super) const RES_MRN: u16 = 62;
    pub(super) const RES_PD: u16 = 46;
    pub(super) const RES_PD_ENTRY: u16 = 47;
    pub(super) const RES_CTXN: u16 = 64;
    pub(super) const RES_CTX: u16 = 86;
    pub(super) const RES_CTX_ENTRY: u16 = 87;
    pub(super) const RES_SRQ: u16 = 88;
    pub(super) const RES_SRQ_ENTRY: u16 = 89;
    pub(super) const RES_SRQN: u16 = 90;
    /// `RDMA_NLDEV_ATTR_STAT_RES` shares `RES_QP`'s number.
    pub(super) const STAT_RES: u16 = 19;
    pub(super) const NDEV_INDEX: u16 = 50;
    pub(super) const NDEV_NAME: u16 = 51;
    pub(super) const NETNS_MODE: u16 = 66;
    pub(super) const DEV_PROTOCOL: u16 = 67;
    pub(super) const STAT_HWCOUNTERS: u16 = 80;
    pub(super) const STAT_HWCOUNTER_ENTRY: u16 = 81;
    pub(super) const STAT_HWCOUNTER_ENTRY_NAME: u16 = 82;
    pub(super) const STAT_HWCOUNTER_ENTRY_VALUE: u16 = 83;
    pub(super) const COPY_ON_FORK: u16 = 93;
    pub(super) const STAT_HWCOUNTER_DYNAMIC: u16 = 95;
}

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_DUMP: u16 = 0x300;
/// The error message carries only the request's header (`NETLINK_CAP_ACK`).
const NLM_F_CAPPED: u16 = 0x100;
/// Extended-ACK attributes follow the error (a message for the user).
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;
/// The largest datagram libmnl's readers take in one `recvmsg`.
const MAX_DATAGRAM: usize = 4096;

const EINVAL: i32 = 22;
const ENODEV: i32 = 19;
const EOPNOTSUPP: i32 = 95;

/// One device as the family describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DevInfo {
    /// The device's index (its `uverbs` number).
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) fw_ver: String,
    /// As `ibv_devinfo` prints it: the first group is the top 16 bits.
    pub(crate) node_guid: u64,
    pub(crate) sys_image_guid: u64,
    pub(crate) cap_flags: u64,
    /// `ibv_port_state` and the physical state (5 = LinkUp, 3 = Disabled).
    pub(crate) port_state: u8,
    pub(crate) phys_state: u8,
    /// The interface holding the device's address, and its index.
    pub(crate) netdev: Option<(String, u32)>,
    /// The port's counters, rxe's names.
    pub(crate) counters: Vec<(&'static str, u64)>,
    /// Live contexts over every process using the device: each one's
    /// process ID.
    pub(crate) contexts: Vec<u32>,
    /// Their QPs, CQs and MRs, each with its process's ID.
    pub(crate) objects: Vec<(u32, Object)>,
}

impl DevInfo {
    /// How many of the objects `of` picks.
    fn count(&self, of: fn(&Object) -> bool) -> u64 {
        self.objects.iter().filter(|(_, o)| of(o)).count() as u64
    }
}

/// Objects per message of a listing (each under 100 bytes: a message stays
/// within a datagram).
const OBJECTS_PER_MESSAGE: usize = 32;

/// One object's entry of a listing, with the attributes the kernel gives
/// it (`ib_qp_type` 2, 3 and 9/10 are RC, UC and XRC: connected, with a
/// peer and its PSN).
fn object_entry(m: &mut Msg, pid: u32, o: &Object) {
    match *o {
        Object::Qp { qpn, qp_type, state, dest_qpn, rq_psn, sq_psn, pd, .. } => {
            let connected = matches!(qp_type, 2 | 3 | 9 | 10);
            m.begin(attr::RES_QP_ENTRY).u32(attr::PORT_INDEX, 1).u32(attr::RES_LQPN, qpn);
            if connected {
                m.u32(attr::RES_RQPN, dest_qpn).u32(attr::RES_RQ_PSN, rq_psn);
            }
            m.u32(attr::RES_SQ_PSN, sq_psn);
            if connected {
                // MIGRATED: no alternate path.
                m.u8(attr::RES_PATH_MIG_STATE, 0);
            }
            m.u8(attr::RES_TYPE, qp_type).u8(attr::RES_STATE, state);
            m.u32(attr::RES_PID, pid).u32(attr::RES_PDN, pd).end();
        }
        Object::Cq { cqn, cqe, users } => {
            m.begin(attr::RES_CQ_ENTRY).u32(attr::RES_CQE, cqe).u64(attr::RES_USECNT, users.into());
            m.u32(attr::RES_PID, pid).u32(attr::RES_CQN, cqn).end();
        }
        Object::Srq { srqn, srq_type, pd, cq } => {
            // Left open: the caller adds the QP table and closes it.
            m.begin(attr::RES_SRQ_ENTRY).u32(attr::RES_SRQN, srqn).u8(attr::RES_TYPE, srq_type);
            if pd != 0 {
                m.u32(attr::RES_PDN, pd);
            }
            if cq != 0 {
                m.u32(attr::RES_CQN, cq);
            }
            m.u32(attr::RES_PID, pid);
        }
        Object::Pd { pdn, users } => {
            m.begin(attr::RES_PD_ENTRY).u64(attr::RES_USECNT, users.into());
            m.u32(attr::RES_PID, pid).u32(attr::RES_PDN, pdn).end();
        }
        Object::Mr { key, iova, len, pd } => {
            m.begin(attr::RES_MR_ENTRY).u32(attr::RES_RKEY, key).u32(attr::RES_LKEY, key);
            m.u64(attr::RES_IOVA, iova).u64(attr::RES_MRLEN, len).u32(attr::RES_PID, pid);
            m.u32(attr::RES_MRN, key >> 8).u32(attr::RES_PDN, pd).end();
        }
    }
}

/// A request's header and attributes.
struct Request<'a> {
    header: &'a [u8],
    kind: u16,
    flags: u16,
    seq: u32,
    attrs: &'a [u8],
}

impl<'a> Request<'a> {
    fn parse(b: &'a [u8]) -> Option<Self> {
        let len = u32::from_ne_bytes(b.get(0..4)?.try_into().ok()?) as usize;
        if len < 16 || len > b.len() {
            return None;
        }
        let u16_at = |o: usize| u16::from_ne_bytes([b[o], b[o + 1]]);
        Some(Self {
            header: &b[..16],
            kind: u16_at(4),
            flags: u16_at(6),
            seq: u32::from_ne_bytes(b[8..12].try_into().ok()?),
            attrs: &b[16..len],
        })
    }

    /// The first attribute of type `t`.
    fn attr(&self, t: u16) -> Option<&'a [u8]> {
        let mut rest = self.attrs;
        while rest.len() >= 4 {
            let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
            let kind = u16::from_ne_bytes([rest[2], rest[3]]) & 0x3fff;
            if len < 4 || len > rest.len() {
                return None;
            }
            if kind == t {
                return Some(&rest[4..len]);
            }
            rest = &rest[align(len).min(rest.len())..];
        }
        None
    }

    fn u32_attr(&self, t: u16) -> Option<u32> {
        self.attr(t).and_then(|v| Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?)))
    }

    fn is_dump(&self) -> bool {
        self.flags & NLM_F_DUMP == NLM_F_DUMP
    }
}

const fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// One netlink message being built.
struct Msg {
    b: Vec<u8>,
    nests: Vec<usize>,
}

impl Msg {
    fn new(kind: u16, flags: u16, seq: u32, portid: u32) -> Self {
        let mut b = Vec::with_capacity(256);
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&portid.to_ne_bytes());
        Self { b, nests: Vec::new() }
    }

    /// An attribute: its length counts the payload, not the padding.
    fn put(&mut self, t: u16, payload: &[u8]) -> &mut Self {
        self.b.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        self.b.extend_from_slice(&t.to_ne_bytes());
        self.b.extend_from_slice(payload);
        self.b.resize(align(self.b.len()), 0);
        self
    }

    fn u8(&mut self, t: u16, v: u8) -> &mut Self {
        self.put(t, &[v])
    }

    fn u32(&mut self, t: u16, v: u32) -> &mut Self {
        self.put(t, &v.to_ne_bytes())
    }

    fn u64(&mut self, t: u16, v: u64) -> &mut Self {
        self.put(t, &v.to_ne_bytes())
    }

    fn str(&mut self, t: u16, s: &str) -> &mut Self {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.put(t, &v)
    }

    fn begin(&mut self, t: u16) -> &mut Self {
        self.nests.push(self.b.len());
        self.put(t, &[])
    }

    fn end(&mut self) -> &mut Self {
        if let Some(at) = self.nests.pop() {
            let len = (self.b.len() - at) as u16;
            self.b[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.b.len() as u32;
        self.b[0..4].copy_from_slice(&len.to_ne_bytes());
        self.b
    }
}

/// The replies to one request from the socket bound to `portid`, as
/// datagrams in order. Malformed requests get `EINVAL`; anything not
/// served gets `EOPNOTSUPP` with a reason.
pub(crate) fn answer(request: &[u8], portid: u32, devices: &[DevInfo]) -> Vec<Vec<u8>> {
    let Some(r) = Request::parse(request) else { return Vec::new() };
    let reply = Replier { r: &r, portid };
    if r.flags & NLM_F_REQUEST == 0 || r.kind >> 10 != NLDEV {
        return reply.error(EOPNOTSUPP, "uroce answers only the RDMA device (nldev) requests");
    }
    let op = r.kind & 0x3ff;
    let device = || {
        let i = r.u32_attr(attr::DEV_INDEX)?;
        devices.iter().find(|d| d.index == i)
    };
    // Every uroce device has one port.
    let port_ok = || r.u32_attr(attr::PORT_INDEX) == Some(1);
    match op {
        cmd::GET if r.is_dump() => reply.dump(devices.iter().map(|d| reply.device(op, d))),
        cmd::PORT_GET if r.is_dump() => reply.dump(
            devices
                .iter()
                .filter(|d| r.u32_attr(attr::DEV_INDEX).is_none_or(|i| i == d.index))
                .map(|d| reply.port(op, d)),
        ),
        cmd::RES_GET if r.is_dump() => reply.dump(devices.iter().map(|d| reply.summary(op, d))),
        // Counters bound to QPs (`rdma statistic qp`): uroce has none.
        cmd::STAT_GET | cmd::STAT_GET_STATUS if r.is_dump() => reply.dump(std::iter::empty()),
        cmd::GET | cmd::PORT_GET | cmd::RES_GET | cmd::STAT_GET | cmd::STAT_GET_STATUS => {
            let Some(d) = device() else { return reply.error(ENODEV, "no such uroce device") };
            if op != cmd::GET && op != cmd::RES_GET && !port_ok() {
                return reply.error(EINVAL, "uroce devices have one port, port 1");
            }
            if op == cmd::STAT_GET && r.attr(attr::STAT_RES).is_some() {
                return reply.error(EOPNOTSUPP, "uroce has no per-QP counter objects");
            }
            let m = match op {
                cmd::GET => reply.device(op, d),
                cmd::PORT_GET => reply.port(op, d),
                cmd::RES_GET => reply.summary(op, d),
                _ => reply.counters(op, d),
            };
            reply.one(m)
        }
        cmd::RES_QP_GET
        | cmd::RES_CQ_GET
        | cmd::RES_MR_GET
        | cmd::RES_PD_GET
        | cmd::RES_CTX_GET
        | cmd::RES_SRQ_GET => {
            let listed: Vec<&DevInfo> = match r.u32_attr(attr::DEV_INDEX) {
                Some(_) => match device() {
                    Some(d) => vec![d],
                    None => return reply.error(ENODEV, "no such uroce device"),
                },
                None => devices.iter().collect(),
            };
            let msgs = listed.into_iter().flat_map(|d| reply.objects(op, d)).collect::<Vec<_>>();
            if r.is_dump() { reply.dump(msgs.into_iter()) } else { reply.all(msgs) }
        }
        cmd::SYS_GET => {
            let mut m = reply.msg(op, 0);
            // Every network namespace sees the devices; registered memory
            // stays the parent's across fork (the child's copy is its own).
            m.u8(attr::NETNS_MODE, 1).u8(attr::COPY_ON_FORK, 1);
            reply.one(m.finish())
        }
        cmd::NEWLINK | cmd::DELLINK => reply.error(
            EOPNOTSUPP,
            "uroce devices are configured with UROCE_DEVICES or devices.conf, not by netlink",
        ),
        cmd::RES_CM_ID_GET => {
            reply.error(EOPNOTSUPP, "uroce lists no CM ids (`rdma res show qp` has their QPs)")
        }
        _ => reply.error(EOPNOTSUPP, "not served by uroce run"),
    }
}

/// Builds the replies to one request.
struct Replier<'a> {
    r: &'a Request<'a>,
    portid: u32,
}

impl Replier<'_> {
    fn msg(&self, op: u16, flags: u16) -> Msg {
        Msg::new((NLDEV << 10) | op, flags, self.r.seq, self.portid)
    }

    fn flags(&self) -> u16 {
        if self.r.is_dump() { NLM_F_MULTI } else { 0 }
    }

    fn identity(&self, m: &mut Msg, d: &DevInfo) {
        m.u32(attr::DEV_INDEX, d.index).str(attr::DEV_NAME, &d.name);
    }

    /// `RDMA_NLDEV_CMD_GET`: the device (its port count in `PORT_INDEX`).
    fn device(&self, op: u16, d: &DevInfo) -> Vec<u8> {
        let mut m = self.msg(op, self.flags());
        self.identity(&mut m, d);
        m.u32(attr::PORT_INDEX, 1)
            .u64(attr::CAP_FLAGS, d.cap_flags)
            .str(attr::FW_VERSION, &d.fw_ver)
            .u64(attr::NODE_GUID, d.node_guid)
            .u64(attr::SYS_IMAGE_GUID, d.sys_image_guid)
            .u8(attr::DEV_NODE_TYPE, 1)
            .str(attr::DEV_PROTOCOL, "roce");
        m.finish()
    }

    /// `RDMA_NLDEV_CMD_PORT_GET`: what the kernel sends for a RoCE port.
    fn port(&self, op: u16, d: &DevInfo) -> Vec<u8> {
        let mut m = self.msg(op, self.flags());
        self.identity(&mut m, d);
        m.u32(attr::PORT_INDEX, 1)
            .u8(attr::PORT_STATE, d.port_state)
            .u8(attr::PORT_PHYS_STATE, d.phys_state);
        if let Some((name, index)) = &d.netdev {
            m.u32(attr::NDEV_INDEX, *index).str(attr::NDEV_NAME, name);
        }
        m.finish()
    }

    /// `RDMA_NLDEV_CMD_RES_GET`: counts of the objects uroce publishes.
    fn summary(&self, op: u16, d: &DevInfo) -> Vec<u8> {
        let mut m = self.msg(op, self.flags());
        self.identity(&mut m, d);
        m.begin(attr::RES_SUMMARY);
        let qps = d.count(|o| matches!(o, Object::Qp { .. }));
        let cqs = d.count(|o| matches!(o, Object::Cq { .. }));
        let mrs = d.count(|o| matches!(o, Object::Mr { .. }));
        let pds = d.count(|o| matches!(o, Object::Pd { .. }));
        let srqs = d.count(|o| matches!(o, Object::Srq { .. }));
        let ctxs = d.contexts.len() as u64;
        let counts =
            [("pd", pds), ("cq", cqs), ("qp", qps), ("mr", mrs), ("ctx", ctxs), ("srq", srqs)];
        for (name, n) in counts {
            m.begin(attr::RES_SUMMARY_ENTRY)
                .str(attr::RES_SUMMARY_ENTRY_NAME, name)
                .u64(attr::RES_SUMMARY_ENTRY_CURR, n)
                .end();
        }
        m.end();
        m.finish()
    }

    /// `RDMA_NLDEV_CMD_STAT_GET` (values) and `_STAT_GET_STATUS` (names,
    /// none of them optional).
    fn counters(&self, op: u16, d: &DevInfo) -> Vec<u8> {
        let mut m = self.msg(op, 0);
        self.identity(&mut m, d);
        m.u32(attr::PORT_INDEX, 1).begin(attr::STAT_HWCOUNTERS);
        for (name, v) in &d.counters {
            m.begin(attr::STAT_HWCOUNTER_ENTRY).str(attr::STAT_HWCOUNTER_ENTRY_NAME, name);
            if op == cmd::STAT_GET {
                m.u64(attr::STAT_HWCOUNTER_ENTRY_VALUE, *v);
            } else {
                m.u8(attr::STAT_HWCOUNTER_DYNAMIC, 0);
            }
            m.end();
        }
        m.end();
        m.finish()
    }

    /// `RDMA_NLDEV_CMD_RES_{QP,CQ,MR}_GET`: device `d`'s objects of the
    /// kind, as the kernel lists them (messages of at most
    /// `OBJECTS_PER_MESSAGE`; one, empty, when there are none). An
    /// object's ID attribute in the request picks that one.
    fn objects(&self, op: u16, d: &DevInfo) -> Vec<Vec<u8>> {
        let (table, want) = match op {
            cmd::RES_QP_GET => (attr::RES_QP, self.r.u32_attr(attr::RES_LQPN)),
            cmd::RES_CQ_GET => (attr::RES_CQ, self.r.u32_attr(attr::RES_CQN)),
            cmd::RES_MR_GET => (attr::RES_MR, self.r.u32_attr(attr::RES_MRN)),
            cmd::RES_SRQ_GET => (attr::RES_SRQ, self.r.u32_attr(attr::RES_SRQN)),
            cmd::RES_CTX_GET => return self.contexts(op, d),
            _ => (attr::RES_PD, self.r.u32_attr(attr::RES_PDN)),
        };
        let picked: Vec<&(u32, Object)> = d
            .objects
            .iter()
            .filter(|(_, o)| match (op, o) {
                (cmd::RES_QP_GET, Object::Qp { qpn, .. }) => want.is_none_or(|w| w == *qpn),
                (cmd::RES_CQ_GET, Object::Cq { cqn, .. }) => want.is_none_or(|w| w == *cqn),
                (cmd::RES_MR_GET, Object::Mr { key, .. }) => want.is_none_or(|w| w == key >> 8),
                (cmd::RES_PD_GET, Object::Pd { pdn, .. }) => want.is_none_or(|w| w == *pdn),
                (cmd::RES_SRQ_GET, Object::Srq { srqn, .. }) => want.is_none_or(|w| w == *srqn),
                _ => false,
            })
            .collect();
        let chunks: Vec<&[&(u32, Object)]> = if picked.is_empty() {
            vec![&[]]
        } else {
            picked.chunks(OBJECTS_PER_MESSAGE).collect()
        };
        chunks
            .into_iter()
            .map(|chunk| {
                let mut m = self.msg(op, self.flags());
                self.identity(&mut m, d);
                m.begin(table);
                for (pid, o) in chunk {
                    object_entry(&mut m, *pid, o);
                    if let Object::Srq { srqn, .. } = o {
                        // Its QPs (iproute2 wants the table, empty or not).
                        m.begin(attr::RES_QP);
                        for (p, q) in &d.objects {
                            if let Object::Qp { qpn, srq, .. } = q
                                && p == pid
                                && srq == srqn
                            {
                                m.begin(attr::RES_QP_ENTRY).u32(attr::RES_LQPN, *qpn).end();
                            }
                        }
                        m.end().end();
                    }
                }
                m.end();
                m.finish()
            })
            .collect()
    }

    /// `RDMA_NLDEV_CMD_RES_CTX_GET`: device `d`'s contexts, numbered in
    /// the order their processes published them (one message).
    fn contexts(&self, op: u16, d: &DevInfo) -> Vec<Vec<u8>> {
        let mut m = self.msg(op, self.flags());
        self.identity(&mut m, d);
        m.begin(attr::RES_CTX);
        let want = self.r.u32_attr(attr::RES_CTXN);
        for (ctxn, pid) in d.contexts.iter().enumerate() {
            if want.is_none_or(|w| w as usize == ctxn) {
                m.begin(attr::RES_CTX_ENTRY).u32(attr::RES_CTXN, ctxn as u32);
                m.u32(attr::RES_PID, *pid).end();
            }
        }
        m.end();
        vec![m.finish()]
    }

    /// A query's answer: the messages, then the ACK.
    fn all(&self, mut msgs: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        msgs.push(self.error_msg(0, ""));
        msgs
    }

    /// A query's answer: the message, then the ACK.
    fn one(&self, m: Vec<u8>) -> Vec<Vec<u8>> {
        vec![m, self.error_msg(0, "")]
    }

    /// A dump's answer: the messages packed into datagrams, then DONE.
    fn dump(&self, msgs: impl Iterator<Item = Vec<u8>>) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        let mut done = Msg::new(NLMSG_DONE, NLM_F_MULTI, self.r.seq, self.portid);
        // The error code (0): read whether or not the tool checks the length.
        done.b.extend_from_slice(&0i32.to_ne_bytes());
        for m in msgs.chain(std::iter::once(done.finish())) {
            match out.last_mut() {
                Some(last) if last.len() + m.len() <= MAX_DATAGRAM => last.extend_from_slice(&m),
                _ => out.push(m),
            }
        }
        out
    }

    fn error(&self, errno: i32, why: &str) -> Vec<Vec<u8>> {
        vec![self.error_msg(errno, why)]
    }

    /// `NLMSG_ERROR` carrying `-errno` (0: an ACK), the request's header
    /// and, if `why` is not empty, a message for the user.
    fn error_msg(&self, errno: i32, why: &str) -> Vec<u8> {
        let flags = if why.is_empty() { NLM_F_CAPPED } else { NLM_F_CAPPED | NLM_F_ACK_TLVS };
        let mut m = Msg::new(NLMSG_ERROR, flags, self.r.seq, self.portid);
        m.b.extend_from_slice(&(-errno).to_ne_bytes());
        m.b.extend_from_slice(self.r.header);
        if !why.is_empty() {
            m.str(NLMSGERR_ATTR_MSG, why);
        }
        m.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(index: u32) -> DevInfo {
        DevInfo {
            index,
            name: format!("uroce{index}"),
            fw_ver: "1.0".into(),
            node_guid: 0x0250_56ff_fea7_7d03,
            sys_image_guid: 0x0250_56ff_fea7_7d03,
            cap_flags: 0x21,
            port_state: 4,
            phys_state: 5,
            netdev: Some(("lo".into(), 1)),
            counters: vec![("sent_pkts", 7), ("rcvd_pkts", 9)],
            contexts: vec![40, 41],
            objects: vec![
                (
                    40,
                    Object::Qp {
                        qpn: 17,
                        qp_type: 2,
                        state: 3,
                        dest_qpn: 18,
                        rq_psn: 5,
                        sq_psn: 6,
                        pd: 1,
                        srq: 0,
                    },
                ),
                (
                    40,
                    Object::Qp {
                        qpn: 19,
                        qp_type: 4,
                        state: 3,
                        dest_qpn: 0,
                        rq_psn: 0,
                        sq_psn: 9,
                        pd: 1,
                        srq: 0,
                    },
                ),
                (40, Object::Cq { cqn: 1, cqe: 255, users: 2 }),
                (41, Object::Mr { key: 0x2a7, iova: 0x7000, len: 4096, pd: 1 }),
                (40, Object::Pd { pdn: 1, users: 2 }),
            ],
        }
    }

    fn request(op: u16, flags: u16, attrs: &[(u16, u32)]) -> Vec<u8> {
        let mut m = Msg::new((NLDEV << 10) | op, flags, 42, 0);
        for (t, v) in attrs {
            m.u32(*t, *v);
        }
        m.finish()
    }

    /// The messages of a reply, as (type, flags, seq, pid, body).
    fn messages(datagrams: &[Vec<u8>]) -> Vec<(u16, u16, u32, u32, Vec<u8>)> {
        let mut out = Vec::new();
        for d in datagrams {
            assert!(d.len() <= MAX_DATAGRAM);
            let mut rest = &d[..];
            while !rest.is_empty() {
                let r = Request::parse(rest).expect("a whole message");
                let len = 16 + r.attrs.len();
                let pid = u32::from_ne_bytes(rest[12..16].try_into().unwrap());
                out.push((r.kind, r.flags, r.seq, pid, r.attrs.to_vec()));
                rest = &rest[align(len)..];
            }
        }
        out
    }

    fn attrs_of(body: &[u8]) -> Request<'_> {
        Request { header: &[], kind: 0, flags: 0, seq: 0, attrs: body }
    }

    #[test]
    fn the_device_dump_lists_every_device_then_done() {
        let devs = [dev(0), dev(1)];
        let m = messages(&answer(&request(cmd::GET, 0x305, &[]), 77, &devs));
        assert_eq!(m.len(), 3);
        for (i, (kind, flags, seq, pid, body)) in m[..2].iter().enumerate() {
            assert_eq!((*kind, *flags, *seq, *pid), (0x1401, NLM_F_MULTI, 42, 77));
            let a = attrs_of(body);
            assert_eq!(a.u32_attr(attr::DEV_INDEX), Some(i as u32));
            assert_eq!(a.attr(attr::DEV_NAME), Some(format!("uroce{i}\0").as_bytes()));
            assert_eq!(a.u32_attr(attr::PORT_INDEX), Some(1));
            // Exact lengths: a u8 is 5 bytes, a u64 12.
            assert_eq!(a.attr(attr::DEV_NODE_TYPE), Some(&[1u8][..]));
            assert_eq!(a.attr(attr::NODE_GUID).map(<[u8]>::len), Some(8));
        }
        assert_eq!((m[2].0, m[2].4.len()), (NLMSG_DONE, 4));
    }

    #[test]
    fn a_port_query_gets_state_netdev_and_an_ack() {
        let q = request(cmd::PORT_GET, 0x5, &[(attr::DEV_INDEX, 1), (attr::PORT_INDEX, 1)]);
        let m = messages(&answer(&q, 5, &[dev(0), dev(1)]));
        assert_eq!(m.len(), 2);
        let a = attrs_of(&m[0].4);
        assert_eq!(a.attr(attr::PORT_STATE), Some(&[4u8][..]));
        assert_eq!(a.attr(attr::PORT_PHYS_STATE), Some(&[5u8][..]));
        assert_eq!(a.attr(attr::NDEV_NAME), Some(&b"lo\0"[..]));
        assert_eq!(a.u32_attr(attr::NDEV_INDEX), Some(1));
        // The ACK: error 0 and the request's header.
        assert_eq!(m[1].0, NLMSG_ERROR);
        assert_eq!(&m[1].4[..4], &0i32.to_ne_bytes());
        assert_eq!(&m[1].4[4..20], &q[..16]);
        // Port 2 and device 9 do not exist.
        let q = request(cmd::PORT_GET, 0x5, &[(attr::DEV_INDEX, 1), (attr::PORT_INDEX, 2)]);
        let m = messages(&answer(&q, 5, &[dev(1)]));
        assert_eq!(&m[0].4[..4], &(-EINVAL).to_ne_bytes());
        let q = request(cmd::GET, 0x5, &[(attr::DEV_INDEX, 9)]);
        let m = messages(&answer(&q, 5, &[dev(1)]));
        assert_eq!(&m[0].4[..4], &(-ENODEV).to_ne_bytes());
    }

    #[test]
    fn counters_come_as_named_entries() {
        let q = request(cmd::STAT_GET, 0x5, &[(attr::DEV_INDEX, 0), (attr::PORT_INDEX, 1)]);
        let m = messages(&answer(&q, 5, &[dev(0)]));
        let a = attrs_of(&m[0].4);
        let nest = attrs_of(a.attr(attr::STAT_HWCOUNTERS).unwrap());
        let first = attrs_of(nest.attr(attr::STAT_HWCOUNTER_ENTRY).unwrap());
        assert_eq!(first.attr(attr::STAT_HWCOUNTER_ENTRY_NAME), Some(&b"sent_pkts\0"[..]));
        assert_eq!(first.attr(attr::STAT_HWCOUNTER_ENTRY_VALUE), Some(&7u64.to_ne_bytes()[..]));
    }

    /// `rdma res show qp/cq/mr/pd`: each device's objects under its table,
    /// with the attributes iproute2 requires (a UD QP without a peer), one
    /// picked by its ID, a device without any listing an empty table; and
    /// many split into several messages.
    #[test]
    fn objects_are_listed_as_the_kernel_lists_them() {
        let entries = |m: &[(u16, u16, u32, u32, Vec<u8>)], table: u16| -> Vec<Vec<u8>> {
            let mut out = Vec::new();
            for (_, _, _, _, body) in m.iter().filter(|x| x.0 >> 10 == NLDEV) {
                let t = attrs_of(body).attr(table).expect("the table").to_vec();
                let mut rest = &t[..];
                while rest.len() >= 4 {
                    let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
                    out.push(rest[4..len].to_vec());
                    rest = &rest[align(len).min(rest.len())..];
                }
            }
            out
        };
        let devs = [dev(0), dev(1)];
        let q = request(cmd::RES_QP_GET, 0x305, &[(attr::DEV_INDEX, 1), (attr::PORT_INDEX, 1)]);
        let m = messages(&answer(&q, 5, &devs));
        assert_eq!(m.last().unwrap().0, NLMSG_DONE);
        let qps = entries(&m, attr::RES_QP);
        assert_eq!(qps.len(), 2);
        let rc = attrs_of(&qps[0]);
        assert_eq!(rc.u32_attr(attr::RES_LQPN), Some(17));
        assert_eq!(rc.u32_attr(attr::RES_RQPN), Some(18));
        assert_eq!(rc.u32_attr(attr::RES_SQ_PSN), Some(6));
        assert_eq!(rc.attr(attr::RES_TYPE), Some(&[2u8][..]));
        assert_eq!(rc.attr(attr::RES_STATE), Some(&[3u8][..]));
        assert_eq!(rc.u32_attr(attr::RES_PID), Some(40));
        assert_eq!(rc.u32_attr(attr::PORT_INDEX), Some(1));
        let ud = attrs_of(&qps[1]);
        assert_eq!((ud.attr(attr::RES_RQPN), ud.u32_attr(attr::RES_SQ_PSN)), (None, Some(9)));
        // One QP by its number, as a query.
        let q = request(cmd::RES_QP_GET, 0x5, &[(attr::DEV_INDEX, 0), (attr::RES_LQPN, 19)]);
        let m = messages(&answer(&q, 5, &devs));
        assert_eq!(entries(&m, attr::RES_QP).len(), 1);
        assert_eq!(m.last().unwrap().0, NLMSG_ERROR);
        let cq = entries(
            &messages(&answer(&request(cmd::RES_CQ_GET, 0x305, &[]), 5, &devs)),
            attr::RES_CQ,
        );
        assert_eq!(cq.len(), 2, "one per device");
        assert_eq!(attrs_of(&cq[0]).attr(attr::RES_USECNT), Some(&2u64.to_ne_bytes()[..]));
        let mr = entries(
            &messages(&answer(&request(cmd::RES_MR_GET, 0x305, &[]), 5, &devs)),
            attr::RES_MR,
        );
        let a = attrs_of(&mr[0]);
        assert_eq!((a.u32_attr(attr::RES_RKEY), a.u32_attr(attr::RES_MRN)), (Some(0x2a7), Some(2)));
        assert_eq!(a.u32_attr(attr::RES_PID), Some(41));
        // SRQs with the QPs on them (a table, empty too), contexts.
        let mut d = dev(0);
        d.objects.push((40, Object::Srq { srqn: 9, srq_type: 2, pd: 0, cq: 1 }));
        if let Object::Qp { srq, .. } = &mut d.objects[0].1 {
            *srq = 9;
        }
        d.objects.push((41, Object::Srq { srqn: 10, srq_type: 0, pd: 0, cq: 0 }));
        let srqs = entries(
            &messages(&answer(&request(cmd::RES_SRQ_GET, 0x305, &[]), 5, &[d])),
            attr::RES_SRQ,
        );
        assert_eq!(srqs.len(), 2);
        let tm = attrs_of(&srqs[0]);
        assert_eq!(
            (tm.u32_attr(attr::RES_SRQN), tm.attr(attr::RES_TYPE)),
            (Some(9), Some(&[2u8][..]))
        );
        assert_eq!((tm.u32_attr(attr::RES_CQN), tm.u32_attr(attr::RES_PDN)), (Some(1), None));
        let qps = attrs_of(tm.attr(attr::RES_QP).unwrap());
        assert_eq!(
            attrs_of(qps.attr(attr::RES_QP_ENTRY).unwrap()).u32_attr(attr::RES_LQPN),
            Some(17)
        );
        assert_eq!(attrs_of(&srqs[1]).attr(attr::RES_QP), Some(&[][..]), "an empty table");
        let ctx = entries(
            &messages(&answer(&request(cmd::RES_CTX_GET, 0x305, &[]), 5, &devs[..1])),
            attr::RES_CTX,
        );
        let pids: Vec<_> = ctx.iter().map(|c| attrs_of(c).u32_attr(attr::RES_PID)).collect();
        assert_eq!(pids, [Some(40), Some(41)]);
        // A device with none: an empty table.
        let mut bare = dev(2);
        bare.objects.clear();
        let m = messages(&answer(&request(cmd::RES_QP_GET, 0x305, &[]), 5, &[bare]));
        assert_eq!((m.len(), entries(&m, attr::RES_QP).len()), (2, 0));
        let pd = entries(
            &messages(&answer(&request(cmd::RES_PD_GET, 0x305, &[]), 5, &devs)),
            attr::RES_PD,
        );
        let a = attrs_of(&pd[0]);
        assert_eq!(a.attr(attr::RES_USECNT), Some(&2u64.to_ne_bytes()[..]));
        assert_eq!((a.u32_attr(attr::RES_PDN), a.u32_attr(attr::RES_PID)), (Some(1), Some(40)));
        // A thousand QPs: every one, in datagrams libmnl reads.
        let mut many = dev(0);
        many.objects = (0..1000)
            .map(|i| {
                let qp = Object::Qp {
                    qpn: i,
                    qp_type: 2,
                    state: 3,
                    dest_qpn: i,
                    rq_psn: 0,
                    sq_psn: 0,
                    pd: 1,
                    srq: 0,
                };
                (7, qp)
            })
            .collect();
        let m = messages(&answer(&request(cmd::RES_QP_GET, 0x305, &[]), 5, &[many]));
        assert_eq!(entries(&m, attr::RES_QP).len(), 1000);
    }

    #[test]
    fn adding_a_link_is_refused_with_a_reason() {
        let q = request(cmd::NEWLINK, 0x5, &[]);
        let m = messages(&answer(&q, 5, &[dev(0)]));
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].1, NLM_F_CAPPED | NLM_F_ACK_TLVS);
        assert_eq!(&m[0].4[..4], &(-EOPNOTSUPP).to_ne_bytes());
        let tlvs = attrs_of(&m[0].4[20..]);
        assert!(tlvs.attr(NLMSGERR_ATTR_MSG).unwrap().ends_with(b"netlink\0"));
        // Garbage gets nothing rather than a panic.
        assert!(answer(&[1, 2, 3], 5, &[]).is_empty());
        assert!(answer(&[200, 0, 0, 0, 1, 20, 5, 0], 5, &[]).is_empty());
    }

    #[test]
    fn a_large_dump_is_split_into_datagrams_libmnl_can_read() {
        let devs: Vec<DevInfo> = (0..100).map(dev).collect();
        let d = answer(&request(cmd::GET, 0x305, &[]), 1, &devs);
        assert!(d.len() > 1);
        assert_eq!(messages(&d).len(), 101);
    }
}
