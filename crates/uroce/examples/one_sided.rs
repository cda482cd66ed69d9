//! One-sided RDMA: a server registers a region and hands its address,
//! length and remote key to the client (here as 16 bytes, as they would
//! cross a socket); the client WRITEs into it, READs it back and runs
//! atomics on it, while the server's application does nothing at all.
//! Run: `cargo run --release -p uroce --example one_sided`.

mod common;

use uroce::{Access, QpType, SendWr, WcOpcode, WrOpcode};

/// What a peer needs to reach a region: where it is and its key.
#[derive(Debug, Clone, Copy, PartialEq)]
struct RemoteRegion {
    addr: u64,
    len: u32,
    rkey: u32,
}

impl RemoteRegion {
    fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.len.to_be_bytes());
        b[12..].copy_from_slice(&self.rkey.to_be_bytes());
        b
    }

    fn from_bytes(b: [u8; 16]) -> Self {
        let word = |r: std::ops::Range<usize>| u32::from_be_bytes(b[r].try_into().unwrap());
        let addr = u64::from_be_bytes(b[..8].try_into().unwrap());
        Self { addr, len: word(8..12), rkey: word(12..16) }
    }
}

fn main() {
    let (server, client) = (common::open("127.0.0.2"), common::open("127.0.0.1"));
    let (spd, cpd) = (server.alloc_pd().unwrap(), client.alloc_pd().unwrap());
    // The server grants remote reads, writes and atomics on 1 MiB; a
    // remote WRITE needs LOCAL_WRITE granted too (the device writes it).
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let region = spd.alloc_mr(1 << 20, rights | Access::REMOTE_ATOMIC).unwrap();
    let offer = RemoteRegion { addr: region.addr(), len: 1 << 20, rkey: region.rkey() };
    let remote = RemoteRegion::from_bytes(offer.to_bytes());
    assert_eq!(remote, offer);

    let (scq, ccq) = (server.create_cq(16).unwrap(), client.create_cq(64).unwrap());
    let sqp = common::qp(&spd, &scq, QpType::Rc, 16);
    let cqp = common::qp(&cpd, &ccq, QpType::Rc, 64);
    let all = rights | Access::REMOTE_ATOMIC;
    let port = common::port();
    uroce::connect(&cqp, "127.0.0.2".parse().unwrap(), port, sqp.qpn(), 7, 9, all).unwrap();
    uroce::connect(&sqp, "127.0.0.1".parse().unwrap(), port, cqp.qpn(), 9, 7, all).unwrap();

    // The client's own buffers: what it writes, what it reads back into,
    // where the atomics' old values land.
    let local = cpd.alloc_mr(3 << 16, Access::LOCAL_WRITE).unwrap();
    let data: Vec<u8> = (0..1u32 << 16).map(|i| (i * 7 + 3) as u8).collect();
    local.write(0, &data).unwrap();
    let (src, back) = ([local.sge(0, 1 << 16).unwrap()], [local.sge(1 << 16, 1 << 16).unwrap()]);
    let rdma = |wr_id, opcode, sgl, remote_addr| SendWr {
        wr_id,
        opcode,
        sgl,
        remote_addr,
        rkey: remote.rkey,
        ..SendWr::default()
    };
    // WRITE then READ on one QP: the READ sees the WRITE (RC executes in
    // order), so both may be posted at once.
    cqp.post_send(&[
        rdma(1, WrOpcode::RdmaWrite, &src, remote.addr),
        rdma(2, WrOpcode::RdmaRead, &back, remote.addr),
    ])
    .unwrap();
    let done = common::wait(&ccq, 2);
    assert_eq!((done[0].opcode, done[1].opcode), (WcOpcode::RdmaWrite, WcOpcode::RdmaRead));
    assert_eq!(local.to_vec()[1 << 16..2 << 16], data[..], "read back what was written");

    // Atomics on an 8-byte counter at the region's end: ten FETCH_ADDs,
    // each returning the value before it, then a COMPARE_SWAP.
    let counter = remote.addr + u64::from(remote.len) - 8;
    let olds: Vec<[uroce::Sge; 1]> =
        (0..11).map(|i| [local.sge((2 << 16) + 8 * i, 8).unwrap()]).collect();
    let mut wrs: Vec<SendWr> = (0..10)
        .map(|i| SendWr {
            compare_add: 5,
            ..rdma(10 + i as u64, WrOpcode::AtomicFetchAndAdd, &olds[i], counter)
        })
        .collect();
    wrs.push(SendWr {
        compare_add: 50,
        swap: 1,
        ..rdma(20, WrOpcode::AtomicCmpAndSwp, &olds[10], counter)
    });
    cqp.post_send(&wrs).unwrap();
    common::wait(&ccq, wrs.len());
    let old = |i: usize| {
        let mut v = [0u8; 8];
        local.read((2 << 16) + 8 * i, &mut v).unwrap();
        u64::from_le_bytes(v)
    };
    assert_eq!((0..10).map(old).collect::<Vec<_>>(), (0..10).map(|i| 5 * i).collect::<Vec<_>>());
    assert_eq!(old(10), 50, "the swap saw the ten adds");
    let mut v = [0u8; 8];
    region.read((1 << 20) - 8, &mut v).unwrap();
    assert_eq!(u64::from_le_bytes(v), 1, "and replaced the value");
    assert_eq!(scq.pending(), 0, "the server's application saw nothing");
    println!("WRITE, READ, 10 FETCH_ADDs and a COMPARE_SWAP through {remote:?}: all checked");
}
