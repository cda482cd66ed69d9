//! Wire exactness: packets uroce sends over the `udp` backend, captured by
//! tshark on loopback, decode as clean RoCEv2 and carry the ICRC an rxe
//! peer checks (computed here from the captured IP and UDP headers).
//!
//! The local path (shared memory between contexts of one host) is switched
//! off, since the packets must cross the kernel; and so is GSO: on loopback
//! a GRO receiver gets the unsegmented super-packet, and so does the capture tap; on a real wire the
//! kernel segments it and each segment carries the IP ID its ICRC assumed.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tshark_ok() -> bool {
    let ok = Command::new("tshark").arg("-v").output().is_ok_and(|o| o.status.success());
    if !ok {
        assert!(std::env::var_os("CI").is_none(), "tshark is required under CI");
    }
    ok
}

#[test]
fn captured_packets_are_clean_rocev2_with_good_icrc() {
    if !tshark_ok() {
        eprintln!("tshark not installed: skipped");
        return;
    }
    let port = uroce::testing::free_port();
    // Two marker ports, so that a late copy of the first marker cannot pass
    // for the second.
    let (live_port, done_port) = (uroce::testing::free_port(), uroce::testing::free_port());
    let dir = std::env::temp_dir().join(format!("uroce-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap: PathBuf = dir.join("lo.pcapng");
    // -P -l: one line per captured packet (its UDP destination port) as
    // soon as it is in the file, so the test can see the capture is live.
    let mut tshark = Command::new("tshark")
        .args(["-i", "lo", "-B", "64", "-P", "-l", "-T", "fields", "-e", "udp.dstport"])
        .args([
            "-f",
            &format!("udp port {port} or udp port {live_port} or udp port {done_port}"),
            "-w",
        ])
        .arg(&cap)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start tshark");
    let seen = PortLines::new(tshark.stdout.take().unwrap());
    // Live: a marker datagram sent now shows up in the capture.
    let marker = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    assert!(seen.wait_marker(&marker, live_port), "the capture never went live");
    // A short run (about 17 MiB, some 5,000 packets): the capture's 64 MiB
    // buffer holds all of it even if tshark gets no CPU meanwhile (with
    // `-n 20`, 85 MiB, a loaded machine lost the SENDs at its end, ci55).
    let demo = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(["demo", "-n", "4", "--port", &port.to_string()])
        .env("UROCE_NO_GSO", "1")
        // The packets must cross the kernel to be captured: not the local
        // path's shared memory.
        .env("UROCE_NO_SHM", "1")
        .output()
        .expect("run demo");
    assert!(demo.status.success(), "{}", String::from_utf8_lossy(&demo.stderr));
    // Complete: a marker sent after the demo is captured after all of its
    // packets (the tap sees loopback traffic in order).
    assert!(seen.wait_marker(&marker, done_port), "the capture stalled");
    // SIGINT lets tshark finish the file.
    let _ = Command::new("kill").args(["-INT", &tshark.id().to_string()]).status();
    let _ = tshark.wait();

    let out = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(["decode", "--strict", "-p", &port.to_string()])
        .arg(&cap)
        .output()
        .expect("run decode");
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bad ICRC or malformed packets: {summary}");
    let lines = String::from_utf8_lossy(&out.stdout);
    let n = lines.lines().count();
    assert!(n > 1000, "only {n} packets captured: {summary}");
    for op in [
        "RDMA_WRITE_FIRST",
        "RDMA_WRITE_ONLY",
        "RDMA_READ_REQUEST",
        "RDMA_READ_RESPONSE_MIDDLE",
        "FETCH_ADD",
        "COMPARE_SWAP",
        "ATOMIC_ACKNOWLEDGE",
        "SEND_ONLY",
        "ACKNOWLEDGE",
    ] {
        assert!(lines.contains(op), "no {op} in the capture");
    }
    // Wireshark's own dissector: no malformed packet, every one RoCE.
    let ws = Command::new("tshark")
        .args(["-r"])
        .arg(&cap)
        .args([
            "-Y",
            &format!("udp.port=={port}"),
            "-d",
            &format!("udp.port=={port},infiniband"),
            "-T",
            "fields",
            "-e",
            "_ws.malformed",
            "-e",
            "infiniband.bth.opcode",
        ])
        .output()
        .expect("tshark -r");
    let text = String::from_utf8_lossy(&ws.stdout);
    let malformed = text.lines().filter(|l| !l.starts_with('\t') && !l.is_empty()).count();
    let missing = text.lines().filter(|l| l.trim().is_empty()).count();
    assert_eq!(malformed, 0, "tshark finds malformed packets");
    assert_eq!(missing, 0, "tshark did not decode every packet as InfiniBand");
    std::fs::remove_dir_all(&dir).ok();
}

/// The UDP destination ports tshark prints, one line per packet.
struct PortLines(std::sync::mpsc::Receiver<String>);

impl PortLines {
    fn new(out: std::process::ChildStdout) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self(rx)
    }

    /// Sends marker datagrams to `port` until the capture shows one (at
    /// most a minute, however busy the machine).
    fn wait_marker(&self, sock: &std::net::UdpSocket, port: u16) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        let want = port.to_string();
        while Instant::now() < deadline {
            sock.send_to(b"uroce capture marker", ("127.0.0.1", port)).unwrap();
            let until = Instant::now() + Duration::from_millis(200);
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                match self.0.recv_timeout(left) {
                    Ok(l) if l.trim() == want => return true,
                    Ok(_) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return false,
                }
            }
        }
        false
    }
}
