//! Wire exactness: packets uroce sends over the `udp` backend, captured by
//! tshark on loopback, decode as clean RoCEv2 and carry the ICRC an rxe
//! peer checks (computed here from the captured IP and UDP headers).
//!
//! GSO is switched off for the capture: on loopback a GRO receiver gets the
//! unsegmented super-packet, and so does the capture tap; on a real wire the
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
    let dir = std::env::temp_dir().join(format!("uroce-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap: PathBuf = dir.join("lo.pcapng");
    let mut tshark = Command::new("tshark")
        .args(["-i", "lo", "-B", "64", "-f", &format!("udp port {port}"), "-w"])
        .arg(&cap)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tshark");
    // Wait until tshark says it is capturing.
    let err = tshark.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("Capturing on") {
                let _ = tx.send(());
            }
        }
    });
    let t = Instant::now();
    assert!(rx.recv_timeout(Duration::from_secs(20)).is_ok(), "tshark did not start");
    let _ = t;
    std::thread::sleep(Duration::from_millis(200));
    let demo = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(["demo", "-n", "20", "--port", &port.to_string()])
        .env("UROCE_NO_GSO", "1")
        .output()
        .expect("run demo");
    assert!(demo.status.success(), "{}", String::from_utf8_lossy(&demo.stderr));
    std::thread::sleep(Duration::from_millis(500));
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
