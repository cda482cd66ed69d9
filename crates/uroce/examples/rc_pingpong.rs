//! RC ping-pong, the Rust `ibv_rc_pingpong`: two endpoints (threads here,
//! processes or hosts alike) exchange their QP numbers out of band, then
//! bounce a 4 KiB message back and forth with SEND/RECV, checking every
//! byte. Run: `cargo run --release -p uroce --example rc_pingpong`.

use std::net::IpAddr;
use std::sync::mpsc::{self, Receiver, Sender};

use uroce::{
    Access, Completion, Cq, Device, DeviceConfig, QpCaps, QpInitAttr, QpType, RecvWr, SendWr,
    WcOpcode, WcStatus,
};

const SIZE: usize = 4096;
const ITERS: u32 = 1000;

/// Waits for `n` completions (in whatever order they come) and checks
/// that each succeeded; returns their opcodes.
fn wait(cq: &Cq, n: usize) -> Vec<WcOpcode> {
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 2];
    let mut got = Vec::new();
    while got.len() < n {
        let k = cq.poll(&mut wc[..n - got.len()]).expect("poll");
        for c in &wc[..k] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            got.push(c.opcode);
        }
    }
    got
}

/// One side; it pings first if `first`. `tx`/`rx` carry the QP number,
/// as ibv_rc_pingpong's TCP connection does.
fn side(me: &str, peer: &str, port: u16, first: bool, tx: Sender<u32>, rx: Receiver<u32>) {
    let addr: IpAddr = me.parse().unwrap();
    let ctx = Device::from_config(DeviceConfig { name: me.into(), addr, port }).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    // Unlike a socket's buffers, memory must be registered before the
    // device may touch it: the first half is sent from, the second
    // received into.
    let mr = pd.alloc_mr(2 * SIZE, Access::LOCAL_WRITE).unwrap();
    let (out, inbox) = ([mr.sge(0, SIZE as u32).unwrap()], [mr.sge(SIZE, SIZE as u32).unwrap()]);
    let cq = ctx.create_cq(4).unwrap();
    let cap = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    tx.send(qp.qpn()).unwrap();
    let peer_qpn = rx.recv().unwrap();
    // The starting PSNs: any values both sides agree on.
    let (mine, theirs) = if first { (1, 2) } else { (2, 1) };
    let peer = peer.parse().unwrap();
    uroce::connect(&qp, peer, port, peer_qpn, mine, theirs, Access::LOCAL_WRITE).unwrap();
    // A receive must be posted before the peer's SEND arrives: there is
    // no kernel buffer to hold a message meanwhile. Both sides post theirs
    // before either sends.
    qp.post_recv(&[RecvWr { wr_id: 1, sgl: &inbox }]).unwrap();
    tx.send(0).unwrap();
    rx.recv().unwrap();

    let pattern = |i: u32| -> Vec<u8> { (0..SIZE as u32).map(|k| (k ^ i) as u8).collect() };
    let mut got = vec![0u8; SIZE];
    let send = || qp.post_send(&[SendWr { wr_id: 2, sgl: &out, ..SendWr::default() }]).unwrap();
    for i in 0..ITERS {
        if first {
            mr.write(0, &pattern(i)).unwrap();
            send();
            // Our SEND's completion and the echo, in either order: the
            // outbox is ours again and the echo is in.
            assert_eq!(sorted(wait(&cq, 2)), [WcOpcode::Send, WcOpcode::Recv]);
            mr.read(SIZE, &mut got).unwrap();
            assert!(got == pattern(i), "echo {i}");
            qp.post_recv(&[RecvWr { wr_id: 1, sgl: &inbox }]).unwrap();
        } else {
            // The ping, and (after the first) the completion of our last
            // echo: completions of one CQ come in the order things
            // happened, not in the order of our requests.
            let want =
                if i == 0 { vec![WcOpcode::Recv] } else { vec![WcOpcode::Send, WcOpcode::Recv] };
            assert_eq!(sorted(wait(&cq, want.len())), want);
            mr.read(SIZE, &mut got).unwrap();
            assert!(got == pattern(i), "ping {i}");
            // The next receive goes up before the echo leaves: the next
            // ping may come before this SEND completes (were no receive
            // posted, an RNR NAK would make the pinger wait and resend).
            qp.post_recv(&[RecvWr { wr_id: 1, sgl: &inbox }]).unwrap();
            mr.write(0, &got).unwrap();
            send();
        }
    }
    if !first {
        assert_eq!(wait(&cq, 1), [WcOpcode::Send]);
    }
}

fn sorted(mut ops: Vec<WcOpcode>) -> Vec<WcOpcode> {
    ops.sort_by_key(|o| *o as u32);
    ops
}

fn main() {
    let port = std::env::var("UROCE_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(18515);
    let (to_b, from_a) = mpsc::channel();
    let (to_a, from_b) = mpsc::channel();
    let start = std::time::Instant::now();
    let b = std::thread::spawn(move || side("127.0.0.2", "127.0.0.1", port, false, to_a, from_a));
    side("127.0.0.1", "127.0.0.2", port, true, to_b, from_b);
    b.join().unwrap();
    let t = start.elapsed();
    let each = t.as_secs_f64() * 1e6 / f64::from(ITERS);
    println!("{ITERS} round trips of {SIZE} B in {t:.2?} ({each:.1} µs each), every byte checked");
}
