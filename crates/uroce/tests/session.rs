//! The high-level layer: a session through the CM, a region handed to the
//! peer as 20 bytes in a SEND, then WRITE, READ and atomics on it, typed
//! errors for a bad offset and a revoked key, and messages both ways.

use std::net::IpAddr;

use uroce::session::{RemoteRegion, Session, SessionListener};
use uroce::{Error, WcStatus};

#[test]
fn a_session_moves_data_every_way() {
    let port = uroce::testing::free_port();
    let server_ctx = uroce::testing::open("127.0.0.2", port);
    let listener = SessionListener::bind(&server_ctx, 7480).unwrap();
    let (finished, until_finished) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let mut s = listener.accept().unwrap();
        let region = s.alloc(4096).unwrap();
        region.write(0, b"the server's bytes").unwrap();
        s.send(&RemoteRegion::of(&region).to_bytes()).unwrap();
        // Wait for the client's word that it is done, then check.
        let mut msg = [0u8; 64];
        let n = s.recv(&mut msg).unwrap();
        assert_eq!(&msg[..n], b"done");
        let mut got = [0u8; 16];
        region.read(100, &mut got).unwrap();
        assert_eq!(&got, b"written by peer!");
        let mut counter = [0u8; 8];
        region.read(4088, &mut counter).unwrap();
        assert_eq!(u64::from_le_bytes(counter), 99);
        s.send(b"checked").unwrap();
        // The region stays until the client has seen the answer.
        let n = s.recv(&mut msg).unwrap();
        assert_eq!(&msg[..n], b"bye");
        // The session stays up while the client tries a bad key.
        until_finished.recv().unwrap();
        drop(region);
    });

    let ctx = uroce::testing::open("127.0.0.1", port);
    let peer: IpAddr = "127.0.0.2".parse().unwrap();
    let mut s = loop {
        match Session::connect(&ctx, peer, 7480) {
            Ok(s) => break s,
            Err(Error::Rejected { .. }) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(s.peer(), Some(peer));
    let mut buf = [0u8; 64];
    let n = s.recv(&mut buf).unwrap();
    let remote = RemoteRegion::from_bytes(&buf[..n]).unwrap();
    assert_eq!(remote.len, 4096);

    let local = s.alloc(4096).unwrap();
    s.read(&local, 0, 18, &remote, 0).unwrap();
    assert_eq!(&local.to_vec()[..18], b"the server's bytes");
    local.write(200, b"written by peer!").unwrap();
    s.write(&local, 200, 16, &remote, 100).unwrap();
    assert_eq!(s.fetch_add(&remote, 4088, 90).unwrap(), 0);
    assert_eq!(s.compare_swap(&remote, 4088, 90, 99).unwrap(), 90);
    assert_eq!(s.compare_swap(&remote, 4088, 90, 7).unwrap(), 99, "no swap: 99 is not 90");
    // Bounds are checked before anything is posted.
    assert!(matches!(s.write(&local, 0, 16, &remote, 4090), Err(Error::OutOfBounds)));
    s.send(b"done").unwrap();
    let n = s.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"checked");
    // A key that does not exist: the peer NAKs, the operation says why.
    let bogus = RemoteRegion { rkey: remote.rkey ^ 0x55, ..remote };
    s.send(b"bye").unwrap();
    let r = s.write(&local, 0, 8, &bogus, 0);
    assert!(matches!(r, Err(Error::Completion(WcStatus::RemAccessErr))), "{r:?}");
    finished.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn remote_regions_encode_in_twenty_bytes() {
    let r = RemoteRegion { addr: 0x0102_0304_0506_0708, len: 4096, rkey: 0xabcd };
    let b = r.to_bytes();
    assert_eq!(b.len(), RemoteRegion::ENCODED_LEN);
    assert_eq!(RemoteRegion::from_bytes(&b).unwrap(), r);
    assert!(RemoteRegion::from_bytes(&b[..19]).is_err());
}
