//! An echo server through the RDMA connection manager: the client names
//! the server's address and port, as a TCP client would, and gets back a
//! connected QP (no QP numbers exchanged by hand). The peer could be any
//! RoCE RDMA CM (librdmacm programs, kernel rxe). Each message is echoed
//! back; then the client disconnects.
//! Run: `cargo run --release -p uroce --example cm_echo`.

mod common;

use std::time::Duration;

use uroce::{Access, QpType, RecvWr, SendWr, WcOpcode};

const CM_PORT: u16 = 7471;
const T: Duration = Duration::from_secs(10);

fn main() {
    let server = std::thread::spawn(|| {
        let ctx = common::open("127.0.0.2");
        let listener = ctx.cm_listen(CM_PORT).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let qp = common::qp(&pd, &cq, QpType::Rc, 8);
        let buf = pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
        // The QP is handed over in RESET; accept connects it (RTR, RTS)
        // and replies with our private data.
        let conn = listener.accept(&qp, b"welcome", T).unwrap();
        println!("server: connection from {} (QP {:#x})", conn.peer(), conn.remote_qpn());
        loop {
            qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[buf.sge(0, 256).unwrap()] }]).unwrap();
            let c = common::wait(&cq, 1)[0];
            assert_eq!(c.opcode, WcOpcode::Recv);
            let mut msg = vec![0u8; c.byte_len as usize];
            buf.read(0, &mut msg).unwrap();
            if msg == b"bye" {
                break;
            }
            let wr = SendWr {
                flags: uroce::SendFlags::INLINE,
                inline_data: Some(&msg),
                ..SendWr::default()
            };
            qp.post_send(&[wr]).unwrap();
            common::wait(&cq, 1);
        }
        assert!(conn_ends(&conn), "the client disconnects");
    });

    let ctx = common::open("127.0.0.1");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = common::qp(&pd, &cq, QpType::Rc, 8);
    let buf = pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    // The listener may not be up yet: retry a refused connect briefly.
    let conn = loop {
        match ctx.cm_connect(&qp, "127.0.0.2".parse().unwrap(), CM_PORT, b"hello", T) {
            Ok(c) => break c,
            Err(uroce::Error::Rejected { .. }) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("connect: {e}"),
        }
    };
    assert_eq!(&conn.private_data()[..7], b"welcome");
    for text in ["one", "two", "three"] {
        qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[buf.sge(0, 256).unwrap()] }]).unwrap();
        let wr = SendWr {
            flags: uroce::SendFlags::INLINE,
            inline_data: Some(text.as_bytes()),
            ..SendWr::default()
        };
        qp.post_send(&[wr]).unwrap();
        let done = common::wait(&cq, 2);
        let echo = done.iter().find(|c| c.opcode == WcOpcode::Recv).unwrap();
        let mut got = vec![0u8; echo.byte_len as usize];
        buf.read(0, &mut got).unwrap();
        assert_eq!(got, text.as_bytes());
        println!("client: {text} -> {}", String::from_utf8(got).unwrap());
    }
    let bye =
        SendWr { flags: uroce::SendFlags::INLINE, inline_data: Some(b"bye"), ..SendWr::default() };
    qp.post_send(&[bye]).unwrap();
    common::wait(&cq, 1);
    conn.disconnect(T).unwrap();
    server.join().unwrap();
}

/// Waits for the peer's disconnect.
fn conn_ends(conn: &uroce::cm::CmConnection) -> bool {
    conn.wait_disconnect(T).unwrap()
}
