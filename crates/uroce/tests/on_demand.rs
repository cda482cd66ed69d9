//! On-demand paging over UDP between two contexts: a region registered
//! without touching or pinning its memory, whose pages may be missing or
//! read-only when a peer reaches them. Such an access ends as a remote
//! access error for the peer (and a QP in error), never a fault here; a
//! page mapped later is reached then. The implicit region (the whole
//! address space) and prefetch advice too.

#![allow(unsafe_code)]

use uroce::testing::Side;
use uroce::{Access, Cq, Qp, QpCaps, SendWr, Sge, WcStatus, WrOpcode};

const ALL: Access = Access(1 | 2 | 4 | 8);
const PAGE: usize = 4096;
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

/// A fresh connected RC pair (a QP that met an access error is done).
fn qps(t: &Two) -> (Qp, Qp) {
    uroce::testing::rc_pair(t.port, &t.a, &t.b, CAP, ALL)
}

fn rdma(qp: &Qp, cq: &Cq, opcode: WrOpcode, sge: Sge, remote: u64, rkey: u32) -> WcStatus {
    let sgl = [sge];
    qp.post_send(&[SendWr {
        wr_id: 7,
        opcode,
        sgl: &sgl,
        remote_addr: remote,
        rkey,
        ..SendWr::default()
    }])
    .unwrap();
    uroce::testing::wait_completion(cq).status
}

/// Three anonymous pages, the middle one unmapped: a hole.
fn pages_with_a_hole() -> *mut u8 {
    // SAFETY: a fresh private mapping; the test owns it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            3 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the middle page of our own mapping.
    assert_eq!(unsafe { libc::munmap(p.cast::<u8>().add(PAGE).cast(), PAGE) }, 0);
    p.cast()
}

#[test]
fn missing_and_read_only_pages_are_access_errors_not_faults() {
    let t = two();
    let base = pages_with_a_hole();
    // SAFETY: no Rust reference points into the pages.
    let odp =
        unsafe { t.b.pd.register_on_demand(base as usize, 3 * PAGE, 0x4000_0000, ALL) }.unwrap();
    let src = t.a.pd.alloc_mr(PAGE, ALL).unwrap();
    src.write(0, b"on demand").unwrap();
    let (qa, _qb) = qps(&t);
    let s9 = src.sge(0, 9).unwrap();
    assert_eq!(
        rdma(&qa, &t.a.cq, WrOpcode::RdmaWrite, s9, 0x4000_0000 + 10, odp.rkey()),
        WcStatus::Success
    );
    let mut got = [0u8; 9];
    odp.read(10, &mut got).unwrap();
    assert_eq!(&got, b"on demand");
    // SAFETY: the first page is mapped; read it through a copy.
    unsafe { std::ptr::copy_nonoverlapping(base.add(10), got.as_mut_ptr(), 9) };
    assert_eq!(&got, b"on demand");
    // READ from the third page (zeroes), then a WRITE into the hole.
    let back = src.sge(100, 8).unwrap();
    let far = 0x4000_0000 + 2 * PAGE as u64;
    assert_eq!(rdma(&qa, &t.a.cq, WrOpcode::RdmaRead, back, far, odp.rkey()), WcStatus::Success);
    let hole = 0x4000_0000 + PAGE as u64 + 64;
    assert_eq!(
        rdma(&qa, &t.a.cq, WrOpcode::RdmaWrite, s9, hole, odp.rkey()),
        WcStatus::RemAccessErr
    );
    assert!(odp.read(PAGE + 64, &mut got).is_err(), "the application's copy fails too");

    // The hole mapped later is reached then; a read-only page is not
    // written; an atomic needs a writable page.
    // SAFETY: mapping the hole of our own mapping again.
    let p = unsafe {
        libc::mmap(
            base.add(PAGE).cast(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(p.cast::<u8>(), base.wrapping_add(PAGE));
    let (qa, _qb) = qps(&t);
    assert_eq!(rdma(&qa, &t.a.cq, WrOpcode::RdmaWrite, s9, hole, odp.rkey()), WcStatus::Success);
    odp.read(PAGE + 64, &mut got).unwrap();
    assert_eq!(&got, b"on demand");
    let fadd = |qp: &Qp, addr| {
        let sgl = [src.sge(200, 8).unwrap()];
        qp.post_send(&[SendWr {
            wr_id: 9,
            opcode: WrOpcode::AtomicFetchAndAdd,
            sgl: &sgl,
            remote_addr: addr,
            rkey: odp.rkey(),
            compare_add: 5,
            ..SendWr::default()
        }])
        .unwrap();
        uroce::testing::wait_completion(&t.a.cq).status
    };
    assert_eq!(fadd(&qa, far), WcStatus::Success);
    let mut v = [0u8; 8];
    odp.read(2 * PAGE, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 5);
    // SAFETY: our own mapping's third page.
    assert_eq!(unsafe { libc::mprotect(base.add(2 * PAGE).cast(), PAGE, libc::PROT_READ) }, 0);
    assert_eq!(fadd(&qa, far), WcStatus::RemAccessErr, "an atomic on a read-only page");
    let (qa, _qb) = qps(&t);
    assert_eq!(
        rdma(&qa, &t.a.cq, WrOpcode::RdmaWrite, s9, far + 16, odp.rkey()),
        WcStatus::RemAccessErr
    );
    drop(odp);
    // SAFETY: our own mapping, no longer registered.
    unsafe { libc::munmap(base.cast(), 3 * PAGE) };
}

#[test]
fn the_implicit_region_is_the_whole_address_space() {
    let t = two();
    // SAFETY: peers get the addresses of `target` only.
    let all = unsafe { t.b.pd.register_implicit_on_demand(ALL) }.unwrap();
    assert_eq!((all.addr(), all.len()), (0, usize::MAX));
    let target = vec![0u8; 64].into_boxed_slice();
    let at = target.as_ptr() as u64;
    let src = t.a.pd.alloc_mr(PAGE, ALL).unwrap();
    src.write(0, b"anywhere").unwrap();
    let (qa, _qb) = qps(&t);
    let s = src.sge(0, 8).unwrap();
    assert_eq!(rdma(&qa, &t.a.cq, WrOpcode::RdmaWrite, s, at + 8, all.rkey()), WcStatus::Success);
    // The WRITE went through the kernel, not a reference: read it back.
    let mut got = [0u8; 8];
    all.read(at as usize + 8, &mut got).unwrap();
    assert_eq!(&got, b"anywhere");
    // Address 0 is never mapped.
    assert_eq!(rdma(&qa, &t.a.cq, WrOpcode::RdmaWrite, s, 0, all.rkey()), WcStatus::RemAccessErr);
    drop(all);
    drop(target);
}

#[test]
fn prefetch_advice_is_for_on_demand_ranges_of_the_pd() {
    let t = two();
    let buf = vec![0u8; 2 * PAGE].into_boxed_slice();
    let addr = buf.as_ptr() as usize;
    // SAFETY: no Rust reference is used while it is registered.
    let odp = unsafe { t.b.pd.register_on_demand(addr, 2 * PAGE, addr as u64, ALL) }.unwrap();
    let pinned = t.b.pd.alloc_mr(PAGE, ALL).unwrap();
    t.b.pd.advise_prefetch(&[odp.sge(0, 2 * PAGE as u32).unwrap()]).unwrap();
    assert!(t.b.pd.advise_prefetch(&[]).is_err());
    assert!(t.b.pd.advise_prefetch(&[pinned.sge(0, 8).unwrap()]).is_err(), "a pinned region");
    let past = Sge { addr: addr as u64 + PAGE as u64, length: 2 * PAGE as u32, lkey: odp.lkey() };
    assert!(t.b.pd.advise_prefetch(&[past]).is_err(), "past its end");
    let other = t.b.ctx.alloc_pd().unwrap();
    assert!(other.advise_prefetch(&[odp.sge(0, 8).unwrap()]).is_err(), "another PD");
    drop(odp);
    drop(buf);
}
