//! The echo server of `cm_echo` on tokio (feature `tokio`): the listener,
//! the connect and every completion are awaited, so one thread serves
//! both ends. Run:
//! `cargo run --release -p uroce --features tokio --example tokio_echo`.

mod common;

use uroce::{Access, AsyncCq, Context, QpType, RecvWr, SendWr, WcOpcode};

const CM_PORT: u16 = 7472;

/// A CQ on a completion channel of its own, awaited.
fn async_cq(ctx: &Context) -> AsyncCq {
    let channel = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq_with(16, Some(&channel)).unwrap();
    AsyncCq::new(cq, channel).unwrap()
}

async fn serve(ctx: Context) {
    let mut listener = ctx.cm_listen_async(CM_PORT).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = async_cq(&ctx);
    let qp = common::qp(&pd, cq.cq(), QpType::Rc, 8);
    let buf = pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    let _conn = listener.accept(&qp, b"welcome").await.unwrap();
    for _ in 0..3 {
        qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[buf.sge(0, 256).unwrap()] }]).unwrap();
        let c = cq.next().await.unwrap();
        let mut msg = vec![0u8; c.byte_len as usize];
        buf.read(0, &mut msg).unwrap();
        let wr = SendWr {
            flags: uroce::SendFlags::INLINE,
            inline_data: Some(&msg),
            ..SendWr::default()
        };
        qp.post_send(&[wr]).unwrap();
        assert_eq!(cq.next().await.unwrap().opcode, WcOpcode::Send);
    }
}

async fn client(ctx: Context) {
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = async_cq(&ctx);
    let qp = common::qp(&pd, cq.cq(), QpType::Rc, 8);
    let buf = pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    let peer = "127.0.0.2".parse().unwrap();
    let conn = ctx.cm_connect_async(&qp, peer, CM_PORT, b"hello").await.unwrap();
    assert_eq!(&conn.private_data()[..7], b"welcome");
    for text in ["one", "two", "three"] {
        qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[buf.sge(0, 256).unwrap()] }]).unwrap();
        let wr = SendWr {
            flags: uroce::SendFlags::INLINE,
            inline_data: Some(text.as_bytes()),
            ..SendWr::default()
        };
        qp.post_send(&[wr]).unwrap();
        // Our SEND's completion and the echo, in either order.
        let (a, b) = (cq.next().await.unwrap(), cq.next().await.unwrap());
        let echo = if a.opcode == WcOpcode::Recv { a } else { b };
        let mut got = vec![0u8; echo.byte_len as usize];
        buf.read(0, &mut got).unwrap();
        assert_eq!(got, text.as_bytes());
        println!("{text} -> {}", String::from_utf8(got).unwrap());
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    rt.block_on(async {
        let server = tokio::spawn(serve(common::open("127.0.0.2")));
        // The listener is up before the connect: both run on this one
        // thread, and the server task got to its listen first.
        tokio::task::yield_now().await;
        client(common::open("127.0.0.1")).await;
        server.await.unwrap();
    });
}
