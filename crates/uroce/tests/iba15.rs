//! IBA 1.5's ATOMIC WRITE and FLUSH over UDP between two contexts: the
//! value stored at once, the checks a responder makes (alignment, rights
//! on the QP and the region, bounds) each ending the requester's WR with
//! the status rxe gives, and the completions' opcodes and lengths.

use uroce::testing::Side;
use uroce::transport::FlushOp;
use uroce::{Access, Qp, QpCaps, SendWr, WcOpcode, WcStatus, WrOpcode};

const ALL: Access = Access(1 | 2 | 4 | 8);
const CAP: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

struct Two {
    port: u16,
    a: Side,
    b: Side,
}

fn two() -> Two {
    let (port, a, b) = uroce::testing::two_sides();
    Two { port, a, b }
}

/// A connected RC pair whose responder (b) grants `access`.
fn qps(t: &Two, access: Access) -> (Qp, Qp) {
    uroce::testing::rc_pair(t.port, &t.a, &t.b, CAP, access)
}

fn post(t: &Two, qp: &Qp, wr: SendWr<'_>) -> uroce::Completion {
    qp.post_send(&[wr]).unwrap();
    uroce::testing::wait_completion(&t.a.cq)
}

fn atomic_write(addr: u64, rkey: u32, value: u64) -> SendWr<'static> {
    SendWr {
        wr_id: 1,
        opcode: WrOpcode::AtomicWrite,
        remote_addr: addr,
        rkey,
        compare_add: value,
        ..SendWr::default()
    }
}

fn flush(addr: u64, rkey: u32, placement: u8, selectivity: u8, len: u32) -> SendWr<'static> {
    SendWr {
        wr_id: 2,
        opcode: WrOpcode::Flush,
        remote_addr: addr,
        rkey,
        flush: Some(FlushOp { placement, selectivity, len }),
        ..SendWr::default()
    }
}

#[test]
fn atomic_write_stores_eight_bytes_at_once() {
    let t = two();
    let mr = t.b.pd.alloc_mr(4096, ALL).unwrap();
    let (qa, _qb) = qps(&t, ALL);
    let c = post(&t, &qa, atomic_write(mr.addr() + 64, mr.rkey(), 0x0102_0304_0506_0708));
    assert_eq!((c.status, c.opcode, c.byte_len), (WcStatus::Success, WcOpcode::AtomicWrite, 8));
    let mut got = [0u8; 8];
    mr.read(64, &mut got).unwrap();
    assert_eq!(u64::from_ne_bytes(got), 0x0102_0304_0506_0708);
    // Misaligned: an invalid request (rxe), the QP ends.
    let c = post(&t, &qa, atomic_write(mr.addr() + 65, mr.rkey(), 1));
    assert_eq!(c.status, WcStatus::RemInvReqErr);
    // A region without REMOTE_WRITE: a remote access error.
    let ro = t.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let (qa, _qb) = qps(&t, ALL);
    let c = post(&t, &qa, atomic_write(ro.addr(), ro.rkey(), 1));
    assert_eq!(c.status, WcStatus::RemAccessErr);
    // A QP that does not grant REMOTE_WRITE refuses the opcode.
    let (qa, _qb) = qps(&t, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let c = post(&t, &qa, atomic_write(mr.addr(), mr.rkey(), 1));
    assert_eq!(c.status, WcStatus::RemInvReqErr);
}

#[test]
fn flush_checks_placement_rights_and_bounds() {
    let t = two();
    let flushable = ALL | Access::FLUSH_GLOBAL;
    assert!(t.b.pd.alloc_mr(64, ALL | Access::FLUSH_PERSISTENT).is_err(), "no persistent memory");
    let mr = t.b.pd.alloc_mr(4096, flushable).unwrap();
    let (qa, _qb) = qps(&t, flushable);
    // A WRITE, then a FLUSH of its range, then of the whole region.
    let src = t.a.pd.alloc_mr(64, ALL).unwrap();
    src.write(0, b"durable?").unwrap();
    let sgl = [src.sge(0, 8).unwrap()];
    let w = SendWr {
        opcode: WrOpcode::RdmaWrite,
        sgl: &sgl,
        remote_addr: mr.addr(),
        rkey: mr.rkey(),
        ..SendWr::default()
    };
    assert_eq!(post(&t, &qa, w).status, WcStatus::Success);
    let c = post(&t, &qa, flush(mr.addr(), mr.rkey(), FlushOp::GLOBAL, FlushOp::RANGE, 8));
    assert_eq!((c.status, c.opcode, c.byte_len), (WcStatus::Success, WcOpcode::Flush, 8));
    // The whole region: named by its key alone (the address is not looked
    // at, as rxe skips the range).
    let c = post(&t, &qa, flush(0, mr.rkey(), FlushOp::GLOBAL, FlushOp::REGION, 0));
    assert_eq!(c.status, WcStatus::Success);
    // Bad requests are refused before they are posted.
    assert!(qa.post_send(&[flush(mr.addr(), mr.rkey(), 0, FlushOp::RANGE, 8)]).is_err());
    assert!(qa.post_send(&[SendWr { opcode: WrOpcode::Flush, ..SendWr::default() }]).is_err());
    // Out of the region's bounds: a remote access error.
    let c = post(&t, &qa, flush(mr.addr() + 4000, mr.rkey(), FlushOp::GLOBAL, FlushOp::RANGE, 200));
    assert_eq!(c.status, WcStatus::RemAccessErr);
    // A region without FLUSH_GLOBAL: a remote access error.
    let plain = t.b.pd.alloc_mr(64, ALL).unwrap();
    let (qa, _qb) = qps(&t, flushable);
    let c = post(&t, &qa, flush(plain.addr(), plain.rkey(), FlushOp::GLOBAL, FlushOp::RANGE, 8));
    assert_eq!(c.status, WcStatus::RemAccessErr);
    // A QP without FLUSH_GLOBAL, or persistence asked of it: invalid.
    let (qa, _qb) = qps(&t, ALL);
    let c = post(&t, &qa, flush(mr.addr(), mr.rkey(), FlushOp::GLOBAL, FlushOp::RANGE, 8));
    assert_eq!(c.status, WcStatus::RemInvReqErr);
    let (qa, _qb) = qps(&t, flushable);
    let c = post(&t, &qa, flush(mr.addr(), mr.rkey(), FlushOp::PERSISTENT, FlushOp::RANGE, 8));
    assert_eq!(c.status, WcStatus::RemInvReqErr);
}
