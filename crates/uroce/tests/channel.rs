//! Completion channels and the async event descriptor: arming, solicited
//! events, the descriptor's readability, and no lost wake-ups when a
//! sleeping consumer races a fast producer.

use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use uroce::{
    Access, CompChannel, Completion, Context, Cq, Device, DeviceConfig, Mr, Qp, QpCaps, RecvWr,
    SendFlags, SendWr, WcOpcode, WcStatus,
};

const ALL: Access = Access(1 | 2 | 4 | 8);

struct Side {
    ctx: Context,
    qp: Qp,
    cq: Cq,
    mr: Mr,
}

fn side(addr: &str, port: u16, ch: Option<&CompChannel>, ctx: Option<Context>) -> Side {
    let ctx = ctx.unwrap_or_else(|| uroce::testing::open(addr, port));
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_with(4096, ch).unwrap();
    let mr = pd.alloc_mr(1 << 20, ALL).unwrap();
    let cap = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 4096,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = uroce::testing::rc_qp(&pd, &cq, cap, false);
    Side { ctx, qp, cq, mr }
}

fn pair(port: u16) -> (Side, Side, CompChannel) {
    let b_ctx = Device::from_config(DeviceConfig {
        name: "b".into(),
        addr: "127.0.0.2".parse().unwrap(),
        port,
    })
    .open()
    .unwrap();
    let ch = b_ctx.create_comp_channel().unwrap();
    let a = side("127.0.0.1", port, None, None);
    let b = side("127.0.0.2", port, Some(&ch), Some(b_ctx));
    let (ia, ib): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    uroce::connect(&a.qp, ib, port, b.qp.qpn(), 1, 2, ALL).unwrap();
    uroce::connect(&b.qp, ia, port, a.qp.qpn(), 2, 1, ALL).unwrap();
    (a, b, ch)
}

fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&raw mut p, 1, ms) == 1 }
}

fn send(a: &Side, solicited: bool) {
    let flags =
        if solicited { SendFlags::SOLICITED | SendFlags::INLINE } else { SendFlags::INLINE };
    a.qp.post_send(&[SendWr { wr_id: 1, flags, inline_data: Some(b"ping"), ..SendWr::default() }])
        .unwrap();
}

fn port(k: u16) -> u16 {
    let _ = k;
    uroce::testing::free_port()
}

#[test]
fn arming_and_solicited_only() {
    let (a, b, ch) = pair(port(0));
    for i in 0..4 {
        b.qp.post_recv(&[RecvWr { wr_id: i, sgl: &[b.mr.sge(0, 64).unwrap()] }]).unwrap();
    }
    let fd = ch.as_fd().as_raw_fd();
    // Not armed: a completion raises no event.
    send(&a, false);
    let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 4];
    let t = Instant::now();
    while b.cq.poll(&mut wc).unwrap() == 0 {
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    assert!(!readable(fd, 50));
    // Armed: the next completion raises exactly one event.
    b.cq.req_notify(false).unwrap();
    send(&a, false);
    assert!(readable(fd, 5000), "channel fd not readable after a completion");
    assert_eq!(ch.get_event().unwrap(), b.cq.handle());
    assert_eq!(b.cq.unacked_events(), 1);
    b.cq.ack_events(1);
    assert_eq!(b.cq.unacked_events(), 0);
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 1);
    // Solicited only: an unsolicited SEND does not wake, a solicited one does.
    b.cq.req_notify(true).unwrap();
    send(&a, false);
    let t = Instant::now();
    while b.cq.poll(&mut wc).unwrap() == 0 {
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    assert!(!readable(fd, 50), "an unsolicited receive woke a solicited-only CQ");
    send(&a, true);
    assert!(readable(fd, 5000));
    assert_eq!(ch.get_event().unwrap(), b.cq.handle());
    b.cq.ack_events(1);
    let t = Instant::now();
    while b.cq.poll(&mut wc).unwrap() == 0 {
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    assert!(wc[0].solicited);
    // Non-blocking: nothing waits, so WouldBlock.
    ch.set_nonblocking(true).unwrap();
    assert_eq!(ch.get_event().unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    // A CQ without a channel cannot be armed.
    assert!(a.cq.req_notify(false).is_err());
}

#[test]
fn no_lost_wakeups_under_stress() {
    const N: u64 = 3000;
    let (a, b, ch) = pair(port(1));
    for i in 0..N {
        b.qp.post_recv(&[RecvWr { wr_id: i, sgl: &[b.mr.sge(0, 64).unwrap()] }]).unwrap();
    }
    // The consumer sleeps on the channel with the canonical loop: arm, poll
    // until empty, then block; the producer sends as fast as it can.
    let consumer = std::thread::spawn(move || {
        let mut got = 0u64;
        let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 64];
        let deadline = Instant::now() + Duration::from_secs(60);
        while got < N {
            b.cq.req_notify(false).unwrap();
            loop {
                let n = b.cq.poll(&mut wc).unwrap();
                if n == 0 {
                    break;
                }
                got += n as u64;
            }
            if got >= N {
                break;
            }
            assert!(Instant::now() < deadline, "stuck at {got} of {N}");
            let fd = ch.as_fd().as_raw_fd();
            if readable(fd, 2000) {
                let cq = ch.get_event().unwrap();
                assert_eq!(cq, b.cq.handle());
                b.cq.ack_events(1);
            }
        }
        (got, b)
    });
    for i in 0..N {
        let flags =
            if i % 7 == 0 { SendFlags::INLINE | SendFlags::SIGNALED } else { SendFlags::INLINE };
        loop {
            match a.qp.post_send(&[SendWr {
                wr_id: i,
                flags,
                inline_data: Some(b"x"),
                ..SendWr::default()
            }]) {
                Ok(()) => break,
                Err(_) => {
                    // Send queue full: reap completions and retry.
                    let mut wc =
                        [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 64];
                    let _ = a.cq.poll(&mut wc);
                }
            }
        }
        if i % 97 == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let (got, _b) = consumer.join().unwrap();
    assert_eq!(got, N);
    let _ = a.ctx.stats();
}

#[test]
fn async_event_descriptor() {
    let (a, _b, _ch) = pair(port(2));
    let fd = a.ctx.as_fd().as_raw_fd();
    assert!(!readable(fd, 10));
    a.qp.modify(
        &uroce::QpAttr { state: uroce::QpState::Error, ..Default::default() },
        uroce::AttrMask::STATE,
    )
    .unwrap();
    // A user-requested move to ERR raises no QP_FATAL; an overrun does.
    let small = a.ctx.create_cq(1).unwrap();
    let pd = a.ctx.alloc_pd().unwrap();
    let cap = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let q = uroce::testing::rc_qp(&pd, &small, cap, true);
    q.modify(
        &uroce::QpAttr { state: uroce::QpState::Init, ..Default::default() },
        uroce::AttrMask::STATE
            | uroce::AttrMask::PKEY_INDEX
            | uroce::AttrMask::PORT
            | uroce::AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    q.post_recv(&[RecvWr { wr_id: 1, sgl: &[] }, RecvWr { wr_id: 2, sgl: &[] }]).unwrap();
    q.modify(
        &uroce::QpAttr { state: uroce::QpState::Error, ..Default::default() },
        uroce::AttrMask::STATE,
    )
    .unwrap();
    let t = Instant::now();
    while !readable(fd, 10) {
        a.ctx.progress();
        assert!(t.elapsed() < Duration::from_secs(5), "no async event");
    }
    assert_eq!(a.ctx.get_async_event().unwrap(), uroce::AsyncEvent::CqError { cq: small.handle() });
}

#[test]
fn concurrent_pollers_share_a_cq_and_its_channel() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    const N: u64 = 2000;
    let (a, b, ch) = pair(port(3));
    for i in 0..N {
        b.qp.post_recv(&[RecvWr { wr_id: i, sgl: &[b.mr.sge(0, 64).unwrap()] }]).unwrap();
    }
    ch.set_nonblocking(true).unwrap();
    let total = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let mut workers = vec![];
    for _ in 0..2 {
        let (cq, ch, total, seen) = (b.cq.clone(), ch.clone(), total.clone(), seen.clone());
        workers.push(std::thread::spawn(move || {
            let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 32];
            let deadline = Instant::now() + Duration::from_secs(60);
            while total.load(Ordering::SeqCst) < N {
                assert!(Instant::now() < deadline, "stuck at {}", total.load(Ordering::SeqCst));
                cq.req_notify(false).unwrap();
                let n = cq.poll(&mut wc).unwrap();
                if n > 0 {
                    let mut s = seen.lock().unwrap();
                    for c in &wc[..n] {
                        assert!(s.insert(c.wr_id), "completion {} delivered twice", c.wr_id);
                    }
                    total.fetch_add(n as u64, Ordering::SeqCst);
                    continue;
                }
                if readable(ch.as_fd().as_raw_fd(), 50) && ch.get_event().is_ok() {
                    cq.ack_events(1);
                }
            }
        }));
    }
    for i in 0..N {
        loop {
            let r = a.qp.post_send(&[SendWr {
                wr_id: i,
                flags: SendFlags::INLINE | SendFlags::SIGNALED,
                inline_data: Some(b"y"),
                ..SendWr::default()
            }]);
            if r.is_ok() {
                break;
            }
            let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 64];
            let _ = a.cq.poll(&mut wc);
        }
    }
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(total.load(Ordering::SeqCst), N);
    assert_eq!(seen.lock().unwrap().len() as u64, N);
}
