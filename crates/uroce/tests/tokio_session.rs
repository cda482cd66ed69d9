//! The high-level layer's awaited operations (feature `tokio`): a
//! blocking server thread, a client on a current-thread runtime.
#![cfg(feature = "tokio")]

use std::net::IpAddr;
use std::time::Duration;

use uroce::session::{RemoteRegion, Session, SessionListener};

#[test]
fn session_operations_are_awaited() {
    let port = uroce::testing::free_port();
    let server_ctx = uroce::testing::open("127.0.0.2", port);
    let listener = SessionListener::bind(&server_ctx, 7481).unwrap();
    let server = std::thread::spawn(move || {
        let mut s = listener.accept().unwrap();
        let region = s.alloc(1 << 16).unwrap();
        s.send(&RemoteRegion::of(&region).to_bytes()).unwrap();
        let mut msg = [0u8; 16];
        let n = s.recv(&mut msg).unwrap();
        assert_eq!(&msg[..n], b"done");
        let mut got = vec![0u8; 1 << 16];
        region.read(0, &mut got).unwrap();
        assert!(got[..60_000].iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        s.send(b"ok").unwrap();
        let n = s.recv(&mut msg).unwrap();
        assert_eq!(&msg[..n], b"bye");
    });
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        eprintln!("tokio_session: no progress in 60 s");
        std::process::exit(1);
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    rt.block_on(async {
        let ctx = uroce::testing::open("127.0.0.1", port);
        let peer: IpAddr = "127.0.0.2".parse().unwrap();
        let mut s = Session::connect(&ctx, peer, 7481).unwrap();
        let mut buf = [0u8; 64];
        let n = s.recv_async(&mut buf).await.unwrap();
        let remote = RemoteRegion::from_bytes(&buf[..n]).unwrap();
        let local = s.alloc(1 << 16).unwrap();
        let data: Vec<u8> = (0..60_000).map(|i| (i % 251) as u8).collect();
        local.write(0, &data).unwrap();
        s.write_async(&local, 0, data.len(), &remote, 0).await.unwrap();
        s.read_async(&local, 30_000, 100, &remote, 0).await.unwrap();
        let mut back = [0u8; 100];
        local.read(30_000, &mut back).unwrap();
        assert_eq!(back[..], data[..100]);
        assert_eq!(s.fetch_add_async(&remote, 65_528, 3).await.unwrap(), 0);
        assert_eq!(s.fetch_add_async(&remote, 65_528, 3).await.unwrap(), 3);
        s.send_async(b"done").await.unwrap();
        let n = s.recv_async(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"ok");
        s.send_async(b"bye").await.unwrap();
    });
    server.join().unwrap();
}
