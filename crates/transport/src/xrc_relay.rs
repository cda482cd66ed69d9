//! XRC across processes: a target QP here that receives a message for an
//! SRQ another process owns (both in one XRC domain of one shared device)
//! receives it whole into a relay buffer, against a claim on one of that
//! SRQ's WQEs (so the requester gets an RNR NAK when the owner has none
//! to spare, as from hardware), then relays it to the owner as datagrams
//! on the device's own address: the owner's context takes them because
//! they name its SRQ's number, which comes from its QPN range. There the
//! message is written into the WQE the claim kept and completed on the
//! SRQ's CQ, in the target QP's name, as if the owner had received it.
//!
//! A request that reaches the owner's memory (RDMA WRITE, READ, atomics,
//! SEND with invalidate) cannot be run here: the
//! target asks the owner to run the access (`Relays::ask`: a relay
//! *request* to the SRQ's number), holds the packet and every later one of
//! its connection, and runs them when the owner's *response* (to the
//! target QP's number) is in: the responder then takes its checks' results,
//! an atomic's original value and a READ's data from the answer
//! (`RelayMemory`), so the requester's ACK, NAK, READ response or atomic
//! ACK comes only after the owner has checked the key and placed or read
//! the data, in PSN order. One request per target QP is out at a time; a
//! request is resent until answered, and the owner answers a resent one
//! from what it did (an atomic is never done twice). An owner that is gone
//! or never answers ends the connection (remote operational error).
//!
//! A relay datagram is a UD SEND with Q_Key [`RELAY_QKEY`] from and to the
//! device's own address, its payload ending with the device's secret (8
//! bytes that only the processes sharing the device can read: others
//! cannot forge one); its payload starts with a version byte: 1 for a
//! relayed message's chunk (`RelayHeader`), 2 for a request, 3 for a
//! response, 4 for a control datagram (the driver's).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;

use crate::Instant;
use crate::fastmap::FastMap;
use crate::memory::{AccessError, Accessor, AtomicOp, Key, Memory, MwBind};
use crate::qp::attr::Access;
use crate::qp::{ForeignAccess, Transmit};
use crate::queue::{RecvCur, sgl_pieces};
use crate::srq::{RELAY_LKEY, RELAY_MAX, RELAY_PD, SharedSrq};
use crate::wire::{BthRepr, DethRepr, Opcode, Psn, RocePacket, RocePacketRepr};
use crate::wqe::{Completion, WcFlags, WcOpcode, WcStatus};

/// The Q_Key of relay datagrams (`uRLY`): no CM-made UD QP has it.
pub const RELAY_QKEY: u32 = 0x7552_4c59;
/// Data bytes per relay datagram (a RoCE MTU's worth: every receive path
/// takes it).
const CHUNK: usize = 4096;
/// The relay header's length.
const HEADER: usize = 24;
/// The secret that ends every relay datagram.
const TRAILER: usize = 8;
const VERSION: u8 = 1;
/// The first byte of a relay request (target → owner).
const KIND_REQUEST: u8 = 2;
/// The first byte of a relay response (owner → target).
const KIND_RESPONSE: u8 = 3;
/// The first byte of a control datagram (see
/// [`crate::Endpoint::enable_control`]).
const KIND_CONTROL: u8 = 4;
/// A request's header: kind, op, flags, GID index, target, PSN, R_Key,
/// VA, length, the request's ID, two operands; a WRITE's data follows.
const REQ_HEADER: usize = 48;
/// A response's header: kind, flags, result, 0, target, PSN, the
/// request's ID, the atomic's original value, the READ's length, this
/// chunk's offset.
const RESP_HEADER: usize = 32;
/// How long a target waits for an answer before it asks again, and how
/// many times it asks.
const ASK_AGAIN: core::time::Duration = core::time::Duration::from_millis(20);
const ASKS: u8 = 25;
/// Packets a target holds behind a request (more are dropped: the
/// requester resends them).
const HELD_MAX: usize = 512;
/// READs whose data is kept per target QP, at most (a responder keeps
/// fewer: `RC_MAX_RD_ATOMIC` remembered, and those whose responses are
/// queued).
const READS_KEPT: usize = 4 * crate::RC_MAX_RD_ATOMIC as usize + 16;
/// A WRITE of a message's whole range checked first.
const RQ_CHECK: u8 = 1;
/// The answer codes.
const OK: u8 = 0;
const REFUSED: u8 = 1;
const MISALIGNED: u8 = 2;
/// A relayed message that a WRITE with immediate ended (no data: its
/// length is the WRITE's).
const F_WRITE_IMM: u8 = 32;
const F_FIRST: u8 = 1;
const F_LAST: u8 = 2;
const F_IMM: u8 = 4;
const F_INV: u8 = 8;
const F_SOLICITED: u8 = 16;

/// What precedes each chunk of a relayed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RelayHeader {
    flags: u8,
    /// The completion's status at the target (`ibv_wc_status`).
    status: u8,
    /// The target QP (the completion's `qp_num`).
    target: u32,
    /// The initiator (`src_qp`).
    src_qp: u32,
    imm_or_inv: u32,
    /// The message's length.
    total: u32,
    /// Where this chunk goes in it.
    offset: u32,
}

impl RelayHeader {
    fn emit(&self, out: &mut [u8]) {
        out[0] = VERSION;
        out[1] = self.flags;
        out[2] = self.status;
        out[3] = 0;
        out[4..8].copy_from_slice(&self.target.to_be_bytes());
        out[8..12].copy_from_slice(&self.src_qp.to_be_bytes());
        out[12..16].copy_from_slice(&self.imm_or_inv.to_be_bytes());
        out[16..20].copy_from_slice(&self.total.to_be_bytes());
        out[20..24].copy_from_slice(&self.offset.to_be_bytes());
    }

    fn parse(b: &[u8]) -> Option<Self> {
        let word = |at: usize| Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?));
        if *b.first()? != VERSION {
            return None;
        }
        Some(Self {
            flags: *b.get(1)?,
            status: *b.get(2)?,
            target: word(4)?,
            src_qp: word(8)?,
            imm_or_inv: word(12)?,
            total: word(16)?,
            offset: word(20)?,
        })
    }
}

/// A request's operations.
mod op {
    pub(super) const WRITE: u8 = 1;
    pub(super) const READ: u8 = 2;
    pub(super) const CMP_SWAP: u8 = 3;
    pub(super) const FETCH_ADD: u8 = 4;
    pub(super) const INVALIDATE: u8 = 5;
    /// Take a WQE (and its claim) for a message starting now; answer its
    /// length.
    pub(super) const RESERVE: u8 = 6;
    /// The target went before the message came: put its WQE back.
    pub(super) const CANCEL: u8 = 7;
}

/// A request to the owner of an SRQ to run a memory access for a target
/// QP (one packet's), in the owner's PD: the SRQ's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Request {
    op: u8,
    flags: u8,
    /// The GID index the answer leaves from (the device's address the
    /// request came to).
    sgid_index: u8,
    target: u32,
    psn: u32,
    /// Unique to the request (its resends keep it): what an owner's
    /// memory of its answers is keyed by, so that a target QP number and
    /// PSN used again by a new connection are a new request.
    id: u32,
    rkey: u32,
    va: u64,
    /// The length checked (a WRITE's message, a READ).
    len: u32,
    /// Compare or add.
    a: u64,
    /// Swap.
    b: u64,
}

impl Request {
    fn from_access(acc: ForeignAccess, target: u32, psn: u32, sgid_index: u8) -> Self {
        let mut r = Self {
            op: 0,
            flags: 0,
            sgid_index,
            target,
            psn,
            id: 0,
            rkey: 0,
            va: 0,
            len: 0,
            a: 0,
            b: 0,
        };
        match acc {
            ForeignAccess::Write { rkey, va, check } => {
                (r.op, r.rkey, r.va, r.len) = (op::WRITE, rkey, va, check.unwrap_or(0));
                r.flags = if check.is_some() { RQ_CHECK } else { 0 };
            }
            ForeignAccess::Read { rkey, va, len, .. } => {
                (r.op, r.rkey, r.va, r.len) = (op::READ, rkey, va, len)
            }
            ForeignAccess::CmpSwap { rkey, va, compare, swap } => {
                (r.op, r.rkey, r.va, r.a, r.b) = (op::CMP_SWAP, rkey, va, compare, swap);
            }
            ForeignAccess::FetchAdd { rkey, va, add } => {
                (r.op, r.rkey, r.va, r.a) = (op::FETCH_ADD, rkey, va, add);
            }
            ForeignAccess::Invalidate { rkey } => (r.op, r.rkey) = (op::INVALIDATE, rkey),
            ForeignAccess::Reserve => r.op = op::RESERVE,
        }
        r
    }

    fn emit(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&[KIND_REQUEST, self.op, self.flags, self.sgid_index]);
        out[4..8].copy_from_slice(&self.target.to_be_bytes());
        out[8..12].copy_from_slice(&self.psn.to_be_bytes());
        out[12..16].copy_from_slice(&self.rkey.to_be_bytes());
        out[16..24].copy_from_slice(&self.va.to_be_bytes());
        out[24..28].copy_from_slice(&self.len.to_be_bytes());
        out[28..32].copy_from_slice(&self.id.to_be_bytes());
        out[32..40].copy_from_slice(&self.a.to_be_bytes());
        out[40..48].copy_from_slice(&self.b.to_be_bytes());
    }

    fn parse(b: &[u8]) -> Option<Self> {
        let w = |at: usize| Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?));
        let d = |at: usize| Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?));
        if *b.first()? != KIND_REQUEST || b.len() < REQ_HEADER {
            return None;
        }
        Some(Self {
            op: b[1],
            flags: b[2],
            sgid_index: b[3],
            target: w(4)?,
            psn: w(8)?,
            rkey: w(12)?,
            va: d(16)?,
            len: w(24)?,
            id: w(28)?,
            a: d(32)?,
            b: d(40)?,
        })
    }
}

/// An owner's answer, or one chunk of it (a READ's data comes in chunks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Response {
    last: bool,
    result: u8,
    target: u32,
    psn: u32,
    id: u32,
    orig: u64,
    total: u32,
    offset: u32,
}

impl Response {
    fn emit(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&[
            KIND_RESPONSE,
            if self.last { F_LAST } else { 0 },
            self.result,
            0,
        ]);
        out[4..8].copy_from_slice(&self.target.to_be_bytes());
        out[8..12].copy_from_slice(&self.psn.to_be_bytes());
        out[12..16].copy_from_slice(&self.id.to_be_bytes());
        out[16..24].copy_from_slice(&self.orig.to_be_bytes());
        out[24..28].copy_from_slice(&self.total.to_be_bytes());
        out[28..32].copy_from_slice(&self.offset.to_be_bytes());
    }

    fn parse(b: &[u8]) -> Option<Self> {
        let w = |at: usize| Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?));
        if *b.first()? != KIND_RESPONSE || b.len() < RESP_HEADER {
            return None;
        }
        Some(Self {
            last: b[1] & F_LAST != 0,
            result: b[2],
            target: w(4)?,
            psn: w(8)?,
            id: w(12)?,
            orig: u64::from_be_bytes(b[16..24].try_into().ok()?),
            total: w(24)?,
            offset: w(28)?,
        })
    }
}

/// A request or response, built, waiting to leave.
#[derive(Debug, Clone)]
struct Datagram {
    dest_qpn: u32,
    src_qpn: u32,
    to: IpAddr,
    sgid_index: u8,
    payload: Vec<u8>,
}

/// A packet a target QP holds until an answer is in.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) psn: u32,
    pub(crate) from: IpAddr,
    pub(crate) to: IpAddr,
    pub(crate) bytes: Vec<u8>,
}

/// Where an SRQ's owner is asked: the SRQ's number, the device's address
/// and its GID index.
type Owner = (u32, IpAddr, u8);

/// A target QP's request out to an owner, and the packets held behind it.
#[derive(Debug)]
struct Waiting {
    psn: u32,
    op: u8,
    id: u32,
    /// The request, to ask again.
    request: Datagram,
    owner: Arc<dyn SharedSrq>,
    deadline: Instant,
    asks: u8,
    held: VecDeque<Held>,
    /// A READ's R_Key, VA and length, and its data as it comes.
    read: Option<(u32, u64, u32)>,
    data: Vec<u8>,
}

/// The owner's answer to the request of the packet a target runs now.
#[derive(Debug, Clone, Copy)]
struct Answer {
    psn: u32,
    result: u8,
    orig: u64,
}

/// A READ's data, read by the owner, kept for its responses.
#[derive(Debug)]
struct KeptRead {
    /// The READ's first PSN.
    psn: u32,
    rkey: u32,
    va: u64,
    data: Vec<u8>,
}

/// What an owner answered a target's last request, so that the request
/// asked again is answered without being done twice.
#[derive(Debug, Clone, Copy)]
struct Served {
    /// When it was answered.
    at: Instant,
    id: u32,
    op: u8,
    result: u8,
    orig: u64,
}

/// Targets an owner remembers its last answer to (beyond, it forgets
/// those answered longer ago than a target asks again).
const SERVED_MAX: usize = 4096;

/// A message received for another process's SRQ, on its way there.
#[derive(Debug)]
struct Outgoing {
    /// Its place among messages and requests leaving (see
    /// [`Relays::poll_transmit`]).
    seq: u64,
    srqn: u32,
    /// The address it came to: the device's, which the owner shares.
    to: IpAddr,
    sgid_index: u8,
    c: Completion,
    data: Vec<u8>,
    sent: usize,
    first: bool,
}

/// A relayed message being written into the owner's WQE.
#[derive(Debug)]
struct Incoming {
    srqn: u32,
    cur: RecvCur,
    /// Taken for the target's next message, which has not come yet.
    reserved: bool,
    /// The next offset expected.
    at: u32,
    /// The first error met (the WQE completes with it).
    status: WcStatus,
}

/// One context's relay state: buffers filling, messages leaving, and
/// messages arriving.
#[derive(Debug)]
pub(crate) struct Relays {
    /// Relay buffers by target QP (each has one message in progress at
    /// most).
    bufs: RefCell<FastMap<u32, Vec<u8>>>,
    out: VecDeque<Outgoing>,
    /// By target QP: a target QP has one message in progress at a time.
    incoming: FastMap<u32, Incoming>,
    /// Completions of relayed messages, by SRQ number, for the SRQs' CQs.
    pub(crate) finished: VecDeque<(u32, Completion)>,
    /// Responses and control datagrams waiting to leave (first).
    small: VecDeque<Datagram>,
    /// Requests waiting to leave, each with its place among the messages
    /// (a target's message leaves before its request for the next).
    asks: VecDeque<(u64, Datagram)>,
    /// The next place.
    seq: u64,
    /// By target QP: its request out to an owner.
    waiting: FastMap<u32, Waiting>,
    /// By target QP: the answer for the packet it runs now.
    answers: FastMap<u32, Answer>,
    /// By target QP: READ data for its READ responses, newest last.
    reads: FastMap<u32, VecDeque<KeptRead>>,
    /// As an owner, by target QP: the last answer given.
    served: FastMap<u32, Served>,
    /// By target QP: the owner's answer to a reservation, for the packet
    /// of this PSN: the WQE's length, or none to spare.
    grants: FastMap<u32, (u32, Option<u64>, Owner)>,
    /// By target QP: the message it receives into a WQE an owner reserved
    /// (SRQ number, the device's address, GID index), until relayed.
    reserved: FastMap<u32, Owner>,
    /// As an owner: WQEs reserved for messages that never came, to put
    /// back into their SRQs (by number).
    pub(crate) give_back: Vec<(u32, RecvCur)>,
    psn: u32,
    /// The last request's ID (see [`Request`]).
    last_id: u32,
    /// The device's UDP port, which its other processes share.
    pub(crate) port: u16,
    /// The secret every relay datagram ends with (see the module doc).
    secret: u64,
}

impl Default for Relays {
    fn default() -> Self {
        Self {
            bufs: RefCell::default(),
            out: VecDeque::new(),
            incoming: FastMap::default(),
            finished: VecDeque::new(),
            small: VecDeque::new(),
            asks: VecDeque::new(),
            seq: 0,
            waiting: FastMap::default(),
            answers: FastMap::default(),
            reads: FastMap::default(),
            served: FastMap::default(),
            grants: FastMap::default(),
            reserved: FastMap::default(),
            give_back: Vec::new(),
            psn: 0,
            last_id: 0,
            secret: 0,
            port: crate::wire::udp::ROCE_V2_PORT,
        }
    }
}

/// The memory a target QP writes through while it receives for a relay
/// SRQ: relay buffers by [`RELAY_LKEY`] in [`RELAY_PD`], the rest as the
/// context's (where the relay PD has no region).
pub(crate) struct RelayMemory<'a> {
    pub(crate) inner: &'a dyn Memory,
    pub(crate) relays: &'a Relays,
}

impl RelayMemory<'_> {
    fn ours(key: Key, who: Accessor) -> bool {
        key == Key::Local(RELAY_LKEY) && who.pd == RELAY_PD
    }
}

impl Memory for RelayMemory<'_> {
    fn check(
        &self,
        key: Key,
        who: Accessor,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), AccessError> {
        if Self::ours(key, who) {
            return if addr.checked_add(len).is_some_and(|e| e <= RELAY_MAX) {
                Ok(())
            } else {
                Err(AccessError::OutOfBounds)
            };
        }
        if let (Key::Remote(rkey), RELAY_PD) = (key, who.pd) {
            // The owner's memory: its answer (or a READ it answered).
            if let Some(a) = self.relays.answers.get(&who.qpn) {
                return result_of(a.result);
            }
            let kept = self.relays.kept_read(who.qpn, rkey, addr, len);
            return kept.map(|_| ()).ok_or(AccessError::InvalidKey);
        }
        self.inner.check(key, who, addr, len, access)
    }

    fn check_region(&self, rkey: u32, who: Accessor, access: Access) -> Result<(), AccessError> {
        if who.pd == RELAY_PD {
            return self.relays.answer(who.qpn);
        }
        self.inner.check_region(rkey, who, access)
    }

    fn read(&self, key: Key, who: Accessor, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        if Self::ours(key, who) {
            return Err(AccessError::NotPermitted);
        }
        if let (Key::Remote(rkey), RELAY_PD) = (key, who.pd) {
            let kept = self.relays.kept_read(who.qpn, rkey, addr, out.len() as u64);
            out.copy_from_slice(kept.ok_or(AccessError::InvalidKey)?);
            return Ok(());
        }
        self.inner.read(key, who, addr, out)
    }

    fn write(&self, key: Key, who: Accessor, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        if let (Key::Remote(_), RELAY_PD) = (key, who.pd) {
            // Placed by the owner before it answered.
            return self.relays.answer(who.qpn);
        }
        if !Self::ours(key, who) {
            return self.inner.write(key, who, addr, data);
        }
        let end = addr.checked_add(data.len() as u64).filter(|&e| e <= RELAY_MAX);
        let Some(end) = end else { return Err(AccessError::OutOfBounds) };
        let (off, end) = (addr as usize, end as usize);
        let mut bufs = self.relays.bufs.borrow_mut();
        let buf = bufs.entry(who.qpn).or_default();
        if buf.len() < end {
            buf.resize(end, 0);
        }
        buf[off..end].copy_from_slice(data);
        Ok(())
    }

    fn atomic(
        &self,
        rkey: u32,
        who: Accessor,
        addr: u64,
        op: AtomicOp,
    ) -> Result<u64, AccessError> {
        if who.pd == RELAY_PD {
            let a = self.relays.answers.get(&who.qpn).ok_or(AccessError::InvalidKey)?;
            return result_of(a.result).map(|()| a.orig);
        }
        self.inner.atomic(rkey, who, addr, op)
    }

    fn bind_mw(&self, who: Accessor, bind: &MwBind) -> Result<u32, AccessError> {
        self.inner.bind_mw(who, bind)
    }

    fn invalidate(&self, who: Accessor, rkey: u32, remote: bool) -> Result<(), AccessError> {
        if who.pd == RELAY_PD {
            return self.relays.answer(who.qpn);
        }
        self.inner.invalidate(who, rkey, remote)
    }
}

/// An answer's code as the access's result.
fn result_of(code: u8) -> Result<(), AccessError> {
    match code {
        OK => Ok(()),
        MISALIGNED => Err(AccessError::Misaligned),
        _ => Err(AccessError::InvalidKey),
    }
}

/// An access's result as an answer's code.
fn code_of(r: Result<(), AccessError>) -> u8 {
    match r {
        Ok(()) => OK,
        Err(AccessError::Misaligned) => MISALIGNED,
        Err(_) => REFUSED,
    }
}

impl Relays {
    /// A completion of a relay SRQ's WQE: the message (its buffer) is
    /// queued for the owner of SRQ `srqn`.
    pub(crate) fn completed(&mut self, srqn: u32, to: IpAddr, sgid_index: u8, c: Completion) {
        if !self.reserved.is_empty() {
            self.reserved.remove(&c.qp_num);
        }
        let data = self.bufs.get_mut().remove(&c.qp_num).unwrap_or_default();
        let seq = self.next_seq();
        self.out.push_back(Outgoing { seq, srqn, to, sgid_index, c, data, sent: 0, first: true });
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Queues a request, behind the messages already leaving.
    fn push_ask(&mut self, d: Datagram) {
        let seq = self.next_seq();
        self.asks.push_back((seq, d));
    }

    /// Whether a relay datagram waits to leave.
    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty() || !self.small.is_empty() || !self.asks.is_empty()
    }

    /// The next relay datagram, written into `buf`.
    /// Answers and control datagrams first; then messages and requests in
    /// the order they were queued, so that an owner sees a target's
    /// message before its request for the next one (a reservation the
    /// message did not use yet is one the target gave up).
    pub(crate) fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        if let Some(d) = self.small.front() {
            let t = self.datagram(d, buf)?;
            self.small.pop_front();
            return Some(t);
        }
        let ask_first = match (self.asks.front(), self.out.front()) {
            (Some((a, _)), Some(m)) => *a < m.seq,
            (a, _) => a.is_some(),
        };
        if ask_first {
            let t = self.datagram(&self.asks.front()?.1, buf)?;
            self.asks.pop_front();
            return Some(t);
        }
        let m = self.out.front_mut()?;
        let n = (m.data.len() - m.sent).min(CHUNK);
        let repr = RocePacketRepr {
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY,
                pkey: 0xffff,
                dest_qpn: m.srqn,
                psn: Psn::new(self.psn),
                ..BthRepr::default()
            },
            deth: Some(DethRepr { qkey: RELAY_QKEY, src_qpn: m.c.qp_num }),
            ..RocePacketRepr::default()
        };
        let total = repr.packet_len(HEADER + n + TRAILER);
        if buf.len() < total {
            return None;
        }
        let hl = repr.emit_headers(buf).ok()?;
        let last = m.sent + n == m.data.len();
        let mut flags = 0;
        if m.first {
            flags |= F_FIRST;
        }
        if last {
            flags |= F_LAST;
        }
        if m.c.flags.contains(WcFlags::WITH_IMM) {
            flags |= F_IMM;
        }
        if m.c.flags.contains(WcFlags::WITH_INV) {
            flags |= F_INV;
        }
        if m.c.solicited {
            flags |= F_SOLICITED;
        }
        if m.c.opcode == WcOpcode::RecvRdmaWithImm {
            flags |= F_WRITE_IMM;
        }
        RelayHeader {
            flags,
            status: m.c.status as u8,
            target: m.c.qp_num,
            src_qp: m.c.src_qp,
            imm_or_inv: m.c.imm_or_inv,
            total: m.c.byte_len,
            offset: m.sent as u32,
        }
        .emit(&mut buf[hl..hl + HEADER]);
        buf[hl + HEADER..hl + HEADER + n].copy_from_slice(&m.data[m.sent..m.sent + n]);
        let end = hl + HEADER + n;
        buf[end..end + TRAILER].copy_from_slice(&self.secret.to_be_bytes());
        m.sent += n;
        m.first = false;
        let t = Transmit {
            len: total,
            dst: m.to,
            dst_port: self.port,
            src_port: crate::wire::udp::rxe_ud_sport(m.c.qp_num),
            sgid_index: m.sgid_index,
            traffic_class: 0,
        };
        if last {
            self.out.pop_front();
        }
        self.psn = (self.psn + 1) & 0xff_ffff;
        Some(t)
    }

    /// Whether `pkt` (from `from` to `to`) is a relay datagram: only such
    /// are given to [`Relays::arrived`].
    pub(crate) fn is_relay(pkt: &RocePacket<&[u8]>, from: IpAddr, to: IpAddr) -> bool {
        from == to
            && pkt.bth().opcode() == Opcode::UD_SEND_ONLY
            && pkt.deth().is_some_and(|d| d.qkey() == RELAY_QKEY)
    }

    /// The body of relay datagram `pkt` (from `from` to `to`): its payload
    /// without the secret, if it is a relay datagram and ends with the
    /// device's secret.
    pub(crate) fn body<'a>(
        &self,
        pkt: &'a RocePacket<&[u8]>,
        from: IpAddr,
        to: IpAddr,
    ) -> Option<&'a [u8]> {
        if !Self::is_relay(pkt, from, to) {
            return None;
        }
        let p = pkt.payload();
        let (body, trailer) = p.split_at_checked(p.len().checked_sub(TRAILER)?)?;
        (trailer == self.secret.to_be_bytes()).then_some(body)
    }

    /// Sets the device's secret (see the module doc).
    pub(crate) fn set_secret(&mut self, secret: u64) {
        self.secret = secret;
    }

    /// A relay datagram for `srq` (number `srqn`, of PD `pd`): written
    /// into the WQE its message took (the first chunk takes the one the
    /// claim kept); the last chunk's completion joins
    /// [`Relays::finished`]. A chunk out of turn or malformed: `Err`
    /// (counted by the caller); an open message it breaks completes in
    /// error.
    pub(crate) fn arrived(
        &mut self,
        srqn: u32,
        srq: &mut crate::srq::Srq,
        pd: u32,
        payload: &[u8],
        mem: &dyn Memory,
    ) -> Result<(), ()> {
        let h = RelayHeader::parse(payload).ok_or(())?;
        let data = &payload[HEADER..];
        if h.flags & F_FIRST != 0 {
            match self.incoming.remove(&h.target) {
                // The WQE this message's reservation took.
                Some(mut m) if m.reserved && m.srqn == srqn => {
                    m.reserved = false;
                    self.incoming.insert(h.target, m);
                }
                other => {
                    let mut cur = match other {
                        // A reservation for another SRQ, unused: put back.
                        Some(m) if m.reserved => {
                            self.give_back.push((m.srqn, m.cur));
                            RecvCur::new(1)
                        }
                        // A message left open (its last chunk lost on the
                        // way): its WQE ends in error before the new one.
                        Some(open) => {
                            let c = Completion::new(
                                open.cur.wr_id,
                                WcStatus::GeneralErr,
                                WcOpcode::Recv,
                                h.target,
                                true,
                            );
                            self.finished.push_back((open.srqn, c));
                            open.cur
                        }
                        None => RecvCur::new(1),
                    };
                    // Not reserved (the target claimed it): the oldest.
                    cur.active = false;
                    if !srq.pop_claimed(&mut cur) {
                        return Err(());
                    }
                    let status = WcStatus::Success;
                    let m = Incoming { srqn, cur, reserved: false, at: 0, status };
                    self.incoming.insert(h.target, m);
                }
            }
        }
        let Some(m) = self.incoming.get_mut(&h.target).filter(|m| m.srqn == srqn) else {
            return Err(());
        };
        let fits = u64::from(h.offset) + data.len() as u64 <= m.cur.length;
        if h.offset != m.at || u64::from(h.offset) + data.len() as u64 > u64::from(h.total) {
            m.status = WcStatus::GeneralErr;
        } else if !fits {
            m.status = WcStatus::LocLenErr;
        } else if m.status == WcStatus::Success {
            let who = Accessor { pd, qpn: h.target };
            let mut at = 0usize;
            for (sge, off, l) in sgl_pieces(&m.cur.sges, u64::from(h.offset), data.len() as u64) {
                let chunk = &data[at..at + l as usize];
                if mem.write(Key::Local(sge.lkey), who, sge.addr + off, chunk).is_err() {
                    m.status = WcStatus::LocProtErr;
                    break;
                }
                at += l as usize;
            }
        }
        m.at = h.offset.saturating_add(data.len() as u32);
        if h.flags & F_LAST == 0 {
            return Ok(());
        }
        let m = self.incoming.remove(&h.target).ok_or(())?;
        let mut status = status_of(h.status);
        // A WRITE with immediate's data is in place already: none came.
        let write_imm = h.flags & F_WRITE_IMM != 0;
        if status == WcStatus::Success {
            if m.at != if write_imm { 0 } else { h.total } {
                status = WcStatus::GeneralErr;
            } else {
                status = m.status;
            }
        }
        let opcode = if write_imm { WcOpcode::RecvRdmaWithImm } else { WcOpcode::Recv };
        let mut c = Completion::new(m.cur.wr_id, status, opcode, h.target, true);
        c.byte_len = h.total;
        c.src_qp = h.src_qp;
        c.solicited = h.flags & F_SOLICITED != 0;
        if h.flags & F_IMM != 0 {
            c.imm_or_inv = h.imm_or_inv;
            c.flags = WcFlags::WITH_IMM;
        } else if h.flags & F_INV != 0 {
            c.imm_or_inv = h.imm_or_inv;
            c.flags = WcFlags::WITH_INV;
        }
        self.finished.push_back((srqn, c));
        Ok(())
    }

    /// Forgets what a destroyed target QP had in flight here. A WQE an
    /// owner reserved for the message it was receiving goes back to the
    /// owner's SRQ (true: the claim is given back with it).
    pub(crate) fn forget_target(&mut self, target: u32) -> bool {
        self.incoming.remove(&target);
        self.bufs.get_mut().remove(&target);
        self.answers.remove(&target);
        self.reads.remove(&target);
        // A WQE an owner reserved (or may have: asked, or granted and not
        // taken yet) goes back.
        let asked = self.waiting.remove(&target).filter(|w| w.op == op::RESERVE);
        let asked = asked.map(|w| (w.request.dest_qpn, w.request.to, w.request.sgid_index));
        let granted = self.grants.remove(&target).filter(|g| g.1.is_some()).map(|g| g.2);
        let reserved = self.reserved.remove(&target);
        let Some((srqn, to, sgid_index)) = reserved.or(granted).or(asked) else { return false };
        self.cancel(target, srqn, to, sgid_index);
        true
    }

    /// Builds datagram `d` (a request or a response) into `buf`.
    fn datagram(&self, d: &Datagram, buf: &mut [u8]) -> Option<Transmit> {
        let repr = RocePacketRepr {
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY,
                pkey: 0xffff,
                dest_qpn: d.dest_qpn,
                psn: Psn::new(self.psn),
                ..BthRepr::default()
            },
            deth: Some(DethRepr { qkey: RELAY_QKEY, src_qpn: d.src_qpn }),
            ..RocePacketRepr::default()
        };
        let total = repr.packet_len(d.payload.len() + TRAILER);
        if buf.len() < total {
            return None;
        }
        let hl = repr.emit_headers(buf).ok()?;
        let end = hl + d.payload.len();
        buf[hl..end].copy_from_slice(&d.payload);
        buf[end..end + TRAILER].copy_from_slice(&self.secret.to_be_bytes());
        Some(Transmit {
            len: total,
            dst: d.to,
            dst_port: self.port,
            src_port: crate::wire::udp::rxe_ud_sport(d.src_qpn),
            sgid_index: d.sgid_index,
            traffic_class: 0,
        })
    }

    // ---- a target's side of a memory access in another process ----

    /// Whether target QP `target` waits for an owner's answer (its
    /// packets are held meanwhile).
    pub(crate) fn is_waiting(&self, target: u32) -> bool {
        !self.waiting.is_empty() && self.waiting.contains_key(&target)
    }

    /// Holds packet `h` (PSN `psn`) of target `target` behind its request:
    /// false when it is dropped instead (too many held; the requester
    /// resends it). A copy of a packet held already is dropped quietly.
    pub(crate) fn hold(&mut self, target: u32, psn: u32, h: Held) -> bool {
        let Some(w) = self.waiting.get_mut(&target) else { return false };
        if w.held.iter().any(|x| x.psn == psn) {
            return true;
        }
        if w.held.len() >= HELD_MAX {
            return false;
        }
        w.held.push_back(h);
        true
    }

    /// Whether access `acc` of target `target`'s packet `psn` can run now:
    /// its answer is in, or it reads what a READ kept.
    pub(crate) fn can_answer(&self, target: u32, psn: u32, acc: &ForeignAccess) -> bool {
        match *acc {
            ForeignAccess::Reserve => self.grants.get(&target).is_some_and(|g| g.0 == psn),
            // A resent READ is answered from the data its first answer
            // brought, while kept; a new one is always asked (the memory
            // may have changed since).
            ForeignAccess::Read { rkey, va, len, resent: true }
                if self.kept_read(target, rkey, va, len.into()).is_some() =>
            {
                true
            }
            _ => self.answers.get(&target).is_some_and(|a| a.psn == psn),
        }
    }

    /// The owner's answer to the reservation for target `target`'s packet
    /// `psn`, if asked: the WQE's length, or none to spare.
    pub(crate) fn grant(&self, target: u32, psn: u32) -> Option<Option<u64>> {
        if self.grants.is_empty() {
            return None;
        }
        self.grants.get(&target).filter(|g| g.0 == psn).map(|g| g.1)
    }

    /// Target `target` took the WQE an owner reserved, for a message for
    /// SRQ `srqn` (at address `to`, GID index `sgid_index`).
    pub(crate) fn took_reserved(&mut self, target: u32, srqn: u32, to: IpAddr, sgid_index: u8) {
        self.grants.remove(&target);
        self.reserved.insert(target, (srqn, to, sgid_index));
    }

    /// Asks `owner`, the owner of SRQ `srqn`, to run access `acc` of
    /// target `target`'s packet `psn` (its payload `data`, a WRITE's), and
    /// holds that packet, `held`, until the answer.
    pub(crate) fn ask(
        &mut self,
        now: Instant,
        owner: Arc<dyn SharedSrq>,
        (target, psn, srqn): (u32, u32, u32),
        (to, sgid_index): (IpAddr, u8),
        (acc, data): (ForeignAccess, &[u8]),
        held: Held,
    ) {
        if self.last_id == 0 {
            // Seeded by the time: another process that later has this
            // context's QPN range starts elsewhere.
            self.last_id = (now.as_nanos() as u32) | 1;
        }
        self.last_id = self.last_id.wrapping_add(1);
        let r = Request { id: self.last_id, ..Request::from_access(acc, target, psn, sgid_index) };
        let data = if r.op == op::WRITE { data } else { &[] };
        let mut payload = vec![0; REQ_HEADER + data.len()];
        r.emit(&mut payload[..REQ_HEADER]);
        payload[REQ_HEADER..].copy_from_slice(data);
        let request = Datagram { dest_qpn: srqn, src_qpn: target, to, sgid_index, payload };
        self.push_ask(request.clone());
        let read = match acc {
            ForeignAccess::Read { rkey, va, len, .. } => Some((rkey, va, len)),
            _ => None,
        };
        let w = Waiting {
            psn,
            op: r.op,
            id: r.id,
            request,
            owner,
            deadline: now.saturating_add(ASK_AGAIN),
            asks: 1,
            held: VecDeque::from([held]),
            read,
            data: Vec::new(),
        };
        self.waiting.insert(target, w);
    }

    /// A response for target `target`: when it completes the answer, the
    /// packets held (the one asked for first), to run in order.
    pub(crate) fn answered(
        &mut self,
        now: Instant,
        target: u32,
        payload: &[u8],
    ) -> Option<VecDeque<Held>> {
        let r = Response::parse(payload).filter(|r| r.target == target)?;
        let w = self.waiting.get_mut(&target).filter(|w| w.psn == r.psn && w.id == r.id)?;
        if let (Some((_, _, len)), OK) = (w.read, r.result) {
            let chunk = &payload[RESP_HEADER..];
            if r.offset == 0 {
                w.data.clear();
            }
            let fits = w.data.len() + chunk.len() <= len as usize;
            if r.offset as usize != w.data.len() || r.total != len || !fits {
                // Out of order (or another answer's): asked again later.
                w.data.clear();
                return None;
            }
            w.data.extend_from_slice(chunk);
            // Coming: not asked again while it keeps coming.
            w.deadline = now.saturating_add(ASK_AGAIN);
            if !r.last || w.data.len() != len as usize {
                return None;
            }
        } else if !r.last {
            return None;
        }
        let w = self.waiting.remove(&target)?;
        if let (Some((rkey, va, _)), OK) = (w.read, r.result) {
            self.keep_read(target, KeptRead { psn: r.psn, rkey, va, data: w.data });
        }
        if w.op == op::RESERVE {
            let len = (r.result == OK).then_some(r.orig);
            let d = &w.request;
            self.grants.insert(target, (r.psn, len, (d.dest_qpn, d.to, d.sgid_index)));
        } else {
            self.answers.insert(target, Answer { psn: r.psn, result: r.result, orig: r.orig });
        }
        Some(w.held)
    }

    /// The packet an answer was for has run: the answer is spent.
    pub(crate) fn answer_used(&mut self, target: u32) {
        if !self.answers.is_empty() {
            self.answers.remove(&target);
        }
        if !self.grants.is_empty()
            && let Some((_, Some(_), (srqn, to, sgid))) = self.grants.remove(&target)
        {
            // Granted and not taken (the packet did not run): back.
            self.cancel(target, srqn, to, sgid);
        }
    }

    /// The answer for the packet target `target` runs now, as a result.
    fn answer(&self, target: u32) -> Result<(), AccessError> {
        self.answers.get(&target).map_or(Err(AccessError::InvalidKey), |a| result_of(a.result))
    }

    /// Keeps a READ's data for its responses and for the READ resent
    /// (until [`Relays::prune_reads`] finds the responder done with it).
    fn keep_read(&mut self, target: u32, k: KeptRead) {
        let kept = self.reads.entry(target).or_default();
        // Past what any responder keeps: the oldest goes.
        if kept.len() >= READS_KEPT {
            kept.pop_front();
        }
        kept.push_back(k);
    }

    /// Drops the READ data of target `target` that its responder no
    /// longer needs (`needed(first PSN, length)`: a response still to
    /// send, or the READ still remembered for a resend).
    pub(crate) fn prune_reads(&mut self, target: u32, needed: impl Fn(u32, u32) -> bool) {
        if let Some(kept) = self.reads.get_mut(&target) {
            kept.retain(|k| needed(k.psn, k.data.len() as u32));
            if kept.is_empty() {
                self.reads.remove(&target);
            }
        }
    }

    /// `len` bytes at `va` of key `rkey` from a READ target `target` kept.
    fn kept_read(&self, target: u32, rkey: u32, va: u64, len: u64) -> Option<&[u8]> {
        self.reads.get(&target)?.iter().rev().find_map(|k| {
            let off = va.checked_sub(k.va)?;
            let end = off.checked_add(len)?;
            (k.rkey == rkey && end <= k.data.len() as u64)
                .then(|| &k.data[off as usize..end as usize])
        })
    }

    /// When the next unanswered request is asked again.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        // Asked every progress pass: an emptied map still has its buckets
        // to scan.
        if self.waiting.is_empty() {
            return None;
        }
        self.waiting.values().map(|w| w.deadline).min()
    }

    /// Asks again the requests unanswered at `now`; the targets whose
    /// owner is gone, or never answered, are given up (into `gave_up`:
    /// their connections end) with the packets they held.
    pub(crate) fn ask_again(&mut self, now: Instant, gave_up: &mut Vec<u32>) {
        let mut again = Vec::new();
        for (&target, w) in &mut self.waiting {
            if w.deadline > now {
                continue;
            }
            if !w.owner.alive() || w.asks >= ASKS {
                gave_up.push(target);
                continue;
            }
            w.asks += 1;
            w.deadline = now.saturating_add(ASK_AGAIN);
            again.push(w.request.clone());
        }
        for d in again {
            self.push_ask(d);
        }
        for &t in gave_up.iter() {
            // A reservation the owner may have made goes back.
            if let Some(w) = self.waiting.remove(&t)
                && w.op == op::RESERVE
            {
                let d = &w.request;
                self.cancel(t, d.dest_qpn, d.to, d.sgid_index);
            }
        }
    }

    /// Tells SRQ `srqn`'s owner that target `target` will not use the WQE
    /// it reserved (if it did).
    fn cancel(&mut self, target: u32, srqn: u32, to: IpAddr, sgid_index: u8) {
        let r = Request::from_access(ForeignAccess::Reserve, target, 0, sgid_index);
        let mut payload = vec![0; REQ_HEADER];
        Request { op: op::CANCEL, ..r }.emit(&mut payload);
        self.push_ask(Datagram { dest_qpn: srqn, src_qpn: target, to, sgid_index, payload });
    }

    // ---- an owner's side ----

    /// A control datagram's body, if `payload` is one.
    pub(crate) fn control_body(payload: &[u8]) -> Option<&[u8]> {
        payload.split_first().filter(|(k, _)| **k == KIND_CONTROL).map(|(_, b)| b)
    }

    /// Queues a control datagram.
    pub(crate) fn control(
        &mut self,
        dest_qpn: u32,
        src_qpn: u32,
        to: IpAddr,
        sgid_index: u8,
        body: &[u8],
    ) {
        let mut payload = Vec::with_capacity(1 + body.len());
        payload.push(KIND_CONTROL);
        payload.extend_from_slice(body);
        self.small.push_back(Datagram { dest_qpn, src_qpn, to, sgid_index, payload });
    }

    /// Whether a relay datagram's payload is a target's request.
    pub(crate) fn is_request(payload: &[u8]) -> bool {
        payload.first() == Some(&KIND_REQUEST)
    }

    /// A target's request to SRQ `srqn` here (of PD `pd`), which came to
    /// address `to`: the access runs as this context's responder would run
    /// it (key, PD, rights, bounds, alignment, then the bytes), and the
    /// answer goes back. A request asked again is answered from what was
    /// done (a READ is read again). `Err`: malformed.
    pub(crate) fn serve(
        &mut self,
        now: Instant,
        (srqn, srq): (u32, &mut crate::srq::Srq),
        pd: u32,
        to: IpAddr,
        payload: &[u8],
        mem: &dyn Memory,
    ) -> Result<(), ()> {
        let r = Request::parse(payload).ok_or(())?;
        if r.op == op::CANCEL {
            // Fire and forget: the target is gone.
            if let Some(m) = self.incoming.remove(&r.target) {
                if m.reserved && m.srqn == srqn {
                    self.give_back.push((srqn, m.cur));
                } else {
                    self.incoming.insert(r.target, m);
                }
            }
            return Ok(());
        }
        let data = &payload[REQ_HEADER..];
        let who = Accessor { pd, qpn: r.target };
        if r.op != op::READ
            && let Some(s) = self.served.get(&r.target).filter(|s| s.id == r.id && s.op == r.op)
        {
            let (result, orig) = (s.result, s.orig);
            self.respond(srqn, to, &r, (result, orig), &[]);
            return Ok(());
        }
        let remote = Key::Remote(r.rkey);
        let atomic = |op| match mem.atomic(r.rkey, who, r.va, op) {
            Ok(v) => (OK, v),
            Err(e) => (code_of(Err(e)), 0),
        };
        let (result, orig) = match r.op {
            op::WRITE => {
                let mut res = Ok(());
                if r.flags & RQ_CHECK != 0 {
                    res = mem.check(remote, who, r.va, r.len.into(), Access::REMOTE_WRITE);
                }
                if res.is_ok() && !data.is_empty() {
                    res = mem.write(remote, who, r.va, data);
                }
                (code_of(res), 0)
            }
            op::READ => {
                if u64::from(r.len) > RELAY_MAX {
                    return Err(());
                }
                let mut out = Vec::new();
                let res = mem.check(remote, who, r.va, r.len.into(), Access::REMOTE_READ).and_then(
                    |()| {
                        out.resize(r.len as usize, 0);
                        mem.read(remote, who, r.va, &mut out)
                    },
                );
                let code = code_of(res);
                let data = if code == OK { &out[..] } else { &[] };
                self.respond(srqn, to, &r, (code, 0), data);
                return Ok(());
            }
            op::CMP_SWAP => atomic(AtomicOp::CompareSwap { compare: r.a, swap: r.b }),
            op::FETCH_ADD => atomic(AtomicOp::FetchAdd { add: r.a }),
            op::INVALIDATE => (code_of(mem.invalidate(who, r.rkey, true)), 0),
            op::RESERVE => self.reserve(r.target, srqn, srq),
            _ => return Err(()),
        };
        // What was done is remembered (a refusal did nothing: asked again,
        // it is tried again, as a reservation after an RNR NAK must be).
        if result == OK {
            if self.served.len() >= SERVED_MAX {
                // Past every target's asking again: forgotten.
                let old = |s: &Served| now.saturating_since(s.at) > ASK_AGAIN * u32::from(ASKS);
                self.served.retain(|_, s| !old(s));
            }
            let s = Served { at: now, id: r.id, op: r.op, result, orig };
            self.served.insert(r.target, s);
        }
        self.respond(srqn, to, &r, (result, orig), &[]);
        Ok(())
    }

    /// Takes the oldest WQE of `srq` (number `srqn`), against a claim, for
    /// target `target`'s next message: its length, or none to spare. A
    /// reservation the target left unused (its message never ran: it asks
    /// only once the one before is relayed) goes back first.
    fn reserve(&mut self, target: u32, srqn: u32, srq: &mut crate::srq::Srq) -> (u8, u64) {
        if let Some(m) = self.incoming.remove(&target) {
            if m.reserved {
                self.give_back.push((m.srqn, m.cur));
            } else {
                self.incoming.insert(target, m);
            }
        }
        let Some(claims) = srq.shared().cloned() else { return (REFUSED, 0) };
        if !claims.claim() {
            return (REFUSED, 0);
        }
        let mut cur = RecvCur::new(1);
        if !srq.pop_claimed(&mut cur) {
            claims.release();
            return (REFUSED, 0);
        }
        cur.active = false;
        let len = cur.length;
        // An open message of this target (its last chunk lost) stays open
        // until its next message's first chunk ends it.
        let status = WcStatus::Success;
        if let Some(open) =
            self.incoming.insert(target, Incoming { srqn, cur, reserved: true, at: 0, status })
        {
            let c =
                Completion::new(open.cur.wr_id, WcStatus::GeneralErr, WcOpcode::Recv, target, true);
            self.finished.push_back((open.srqn, c));
        }
        (OK, len)
    }

    /// Queues the answer to request `r` (a READ's data in chunks).
    fn respond(
        &mut self,
        srqn: u32,
        to: IpAddr,
        r: &Request,
        (result, orig): (u8, u64),
        data: &[u8],
    ) {
        let mut offset = 0;
        loop {
            let n = (data.len() - offset).min(CHUNK);
            let last = offset + n == data.len();
            let mut payload = vec![0; RESP_HEADER + n];
            Response {
                last,
                result,
                target: r.target,
                psn: r.psn,
                id: r.id,
                orig,
                total: data.len() as u32,
                offset: offset as u32,
            }
            .emit(&mut payload[..RESP_HEADER]);
            payload[RESP_HEADER..].copy_from_slice(&data[offset..offset + n]);
            let (dest_qpn, sgid_index) = (r.target, r.sgid_index);
            self.small.push_back(Datagram { dest_qpn, src_qpn: srqn, to, sgid_index, payload });
            offset += n;
            if last {
                break;
            }
        }
    }
}

/// The status a relay header carries (an unknown one reads as a general
/// error).
fn status_of(v: u8) -> WcStatus {
    use WcStatus::*;
    [
        Success,
        LocLenErr,
        LocQpOpErr,
        LocProtErr,
        WrFlushErr,
        MwBindErr,
        BadRespErr,
        LocAccessErr,
        RemInvReqErr,
        RemAccessErr,
        RemOpErr,
        RetryExcErr,
        RnrRetryExcErr,
        FatalErr,
    ]
    .into_iter()
    .find(|s| *s as u8 == v)
    .unwrap_or(GeneralErr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_refusals() {
        let h = RelayHeader {
            flags: F_FIRST | F_IMM,
            status: 0,
            target: 0x4_0001,
            src_qp: 0x8_0002,
            imm_or_inv: 0xdead_beef,
            total: 9000,
            offset: 4096,
        };
        let mut b = [0u8; HEADER];
        h.emit(&mut b);
        assert_eq!(RelayHeader::parse(&b), Some(h));
        assert_eq!(RelayHeader::parse(&b[..HEADER - 1]), None);
        b[0] = 9;
        assert_eq!(RelayHeader::parse(&b), None);
        assert_eq!(RelayHeader::parse(&[]), None);
    }

    #[test]
    fn requests_and_responses_round_trip_and_refuse_what_is_not_theirs() {
        let acc = ForeignAccess::CmpSwap { rkey: 0x1234, va: 0x7000_0008, compare: 5, swap: 9 };
        let r = Request::from_access(acc, 0x4_0001, 0xff_fffe, 1);
        let mut b = [0u8; REQ_HEADER];
        r.emit(&mut b);
        assert_eq!(Request::parse(&b), Some(r));
        assert_eq!((r.op, r.a, r.b, r.sgid_index), (op::CMP_SWAP, 5, 9, 1));
        assert_eq!(Request::parse(&b[..REQ_HEADER - 1]), None);
        let w = Request::from_access(
            ForeignAccess::Write { rkey: 1, va: 2, check: Some(3000) },
            7,
            8,
            0,
        );
        assert_eq!((w.flags, w.len), (RQ_CHECK, 3000));
        let resp = Response {
            last: true,
            result: MISALIGNED,
            target: 7,
            psn: 8,
            id: 9,
            orig: u64::MAX,
            total: 4096,
            offset: 0,
        };
        let mut c = [0u8; RESP_HEADER];
        resp.emit(&mut c);
        assert_eq!(Response::parse(&c), Some(resp));
        assert_eq!(Request::parse(&c), None, "a response is no request");
        assert_eq!(Response::parse(&b), None, "a request is no response");
        assert_eq!(result_of(MISALIGNED), Err(AccessError::Misaligned));
        assert_eq!(code_of(Err(AccessError::WrongPd)), REFUSED);
    }
}
