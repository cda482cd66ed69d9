//! Sleeping until work completes, instead of polling: a CQ on a
//! completion channel, armed with `req_notify`, raises one event when a
//! completion arrives; the channel's descriptor becomes readable, so it
//! sits in `poll`/`epoll` beside sockets. After an event: acknowledge it,
//! re-arm, then drain the CQ (re-arming first means a completion that
//! comes meanwhile raises the next event instead of being missed).
//! Run: `cargo run --release -p uroce --example completion_events`.

mod common;

use std::os::fd::AsRawFd;

use uroce::{Access, QpType, RecvWr, SendWr};

fn main() {
    let (a, b) = (common::open("127.0.0.1"), common::open("127.0.0.2"));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let channel = b.create_comp_channel().unwrap();
    let cb = b.create_cq_with(16, Some(&channel)).unwrap();
    let ca = a.create_cq(16).unwrap();
    let (qa, qb) = (common::qp(&pa, &ca, QpType::Rc, 16), common::qp(&pb, &cb, QpType::Rc, 16));
    let port = common::port();
    let rw = Access::LOCAL_WRITE;
    uroce::connect(&qa, "127.0.0.2".parse().unwrap(), port, qb.qpn(), 1, 2, rw).unwrap();
    uroce::connect(&qb, "127.0.0.1".parse().unwrap(), port, qa.qpn(), 2, 1, rw).unwrap();
    let inbox = pb.alloc_mr(16 * 64, Access::LOCAL_WRITE).unwrap();
    for i in 0..16 {
        qb.post_recv(&[RecvWr { wr_id: i, sgl: &[inbox.sge(64 * i as usize, 64).unwrap()] }])
            .unwrap();
    }
    cb.req_notify(false).unwrap();

    // A sender thread: ten messages, 20 ms apart.
    let sender = std::thread::spawn(move || {
        for i in 0..10u32 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let text = format!("event {i}");
            let wr = SendWr {
                wr_id: u64::from(i),
                flags: uroce::SendFlags::INLINE,
                inline_data: Some(text.as_bytes()),
                ..SendWr::default()
            };
            qa.post_send(&[wr]).unwrap();
            common::wait(&ca, 1);
        }
    });
    let (mut got, mut events) = (0, 0);
    while got < 10 {
        // Asleep in poll(2) until the channel's descriptor is readable.
        let mut pfd = libc::pollfd { fd: channel.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
        assert_eq!(n, 1, "no event within 5 s");
        let cq_handle = channel.get_event().unwrap();
        assert_eq!(cq_handle, cb.handle());
        events += 1;
        cb.ack_events(1);
        cb.req_notify(false).unwrap();
        let mut wc =
            [uroce::Completion::new(0, uroce::WcStatus::Success, uroce::WcOpcode::Send, 0, false);
                16];
        let k = cb.poll(&mut wc).unwrap();
        for c in &wc[..k] {
            let mut text = vec![0u8; c.byte_len as usize];
            inbox.read(64 * c.wr_id as usize, &mut text).unwrap();
            assert_eq!(String::from_utf8(text).unwrap(), format!("event {got}"));
            got += 1;
        }
    }
    sender.join().unwrap();
    println!("10 messages taken on {events} completion events, asleep in between");
}
