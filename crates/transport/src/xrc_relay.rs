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
//! A relay datagram is a UD SEND with Q_Key [`RELAY_QKEY`] to QPN = the
//! SRQ's number, from and to the same address; its payload starts with
//! `RelayHeader`. SENDs only: a WRITE, READ or atomic through a target
//! QP that names another process's SRQ would reach that process's memory,
//! which only it can; the relay SRQ's PD has no regions, so they are NAKed
//! (remote access error), and the README says so.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::IpAddr;

use crate::fastmap::FastMap;
use crate::memory::{AccessError, Accessor, AtomicOp, Key, Memory, MwBind};
use crate::qp::Transmit;
use crate::qp::attr::Access;
use crate::queue::{RecvCur, sgl_pieces};
use crate::srq::{RELAY_LKEY, RELAY_MAX, RELAY_PD};
use crate::wire::{BthRepr, DethRepr, Opcode, Psn, RocePacket, RocePacketRepr};
use crate::wqe::{Completion, WcFlags, WcOpcode, WcStatus};

/// The Q_Key of relay datagrams (`uRLY`): no CM-made UD QP has it.
pub const RELAY_QKEY: u32 = 0x7552_4c59;
/// Data bytes per relay datagram (a RoCE MTU's worth: every receive path
/// takes it).
const CHUNK: usize = 4096;
/// The relay header's length.
const HEADER: usize = 24;
const VERSION: u8 = 1;
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

/// A message received for another process's SRQ, on its way there.
#[derive(Debug)]
struct Outgoing {
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
    psn: u32,
    /// The device's UDP port, which its other processes share.
    pub(crate) port: u16,
}

impl Default for Relays {
    fn default() -> Self {
        Self {
            bufs: RefCell::default(),
            out: VecDeque::new(),
            incoming: FastMap::default(),
            finished: VecDeque::new(),
            psn: 0,
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
        self.inner.check(key, who, addr, len, access)
    }

    fn check_region(&self, rkey: u32, who: Accessor, access: Access) -> Result<(), AccessError> {
        self.inner.check_region(rkey, who, access)
    }

    fn read(&self, key: Key, who: Accessor, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        if Self::ours(key, who) {
            return Err(AccessError::NotPermitted);
        }
        self.inner.read(key, who, addr, out)
    }

    fn write(&self, key: Key, who: Accessor, addr: u64, data: &[u8]) -> Result<(), AccessError> {
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
        self.inner.atomic(rkey, who, addr, op)
    }

    fn bind_mw(&self, who: Accessor, bind: &MwBind) -> Result<u32, AccessError> {
        self.inner.bind_mw(who, bind)
    }

    fn invalidate(&self, who: Accessor, rkey: u32, remote: bool) -> Result<(), AccessError> {
        self.inner.invalidate(who, rkey, remote)
    }
}

impl Relays {
    /// A completion of a relay SRQ's WQE: the message (its buffer) is
    /// queued for the owner of SRQ `srqn`.
    pub(crate) fn completed(&mut self, srqn: u32, to: IpAddr, sgid_index: u8, c: Completion) {
        let data = self.bufs.get_mut().remove(&c.qp_num).unwrap_or_default();
        self.out.push_back(Outgoing { srqn, to, sgid_index, c, data, sent: 0, first: true });
    }

    /// Whether a relay datagram waits to leave.
    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// The next relay datagram, written into `buf`.
    pub(crate) fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<Transmit> {
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
        let total = repr.packet_len(HEADER + n);
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
            // A message left open (its last chunk lost on the way): its
            // WQE ends in error before the new one starts.
            let mut cur = match self.incoming.remove(&h.target) {
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
            cur.active = false;
            if !srq.pop_claimed(&mut cur) {
                return Err(());
            }
            self.incoming
                .insert(h.target, Incoming { srqn, cur, at: 0, status: WcStatus::Success });
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
        if status == WcStatus::Success {
            if m.at != h.total {
                status = WcStatus::GeneralErr;
            } else {
                status = m.status;
            }
        }
        let mut c = Completion::new(m.cur.wr_id, status, WcOpcode::Recv, h.target, true);
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

    /// Forgets what a destroyed target QP had in flight here.
    pub(crate) fn forget_target(&mut self, target: u32) {
        self.incoming.remove(&target);
        self.bufs.get_mut().remove(&target);
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
}
