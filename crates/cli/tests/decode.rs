//! `uroce decode` on the rxe captures: one line per packet, every ICRC ok;
//! a corrupted copy is reported as bad.

use std::path::{Path, PathBuf};
use std::process::Command;

fn vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/vectors/rxe")
}

fn decode(args: &[&str], files: &[PathBuf]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .arg("decode")
        .args(args)
        .args(files)
        .output()
        .expect("run uroce");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn captures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(vectors())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_capture_decodes_with_good_icrc() {
    let mut total = 0;
    for file in captures() {
        let frames = uroce_pcap::Reader::new(&std::fs::read(&file).unwrap()).unwrap().count();
        let (ok, out, err) = decode(&["--strict"], std::slice::from_ref(&file));
        assert!(ok, "{}: {err}", file.display());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), frames, "{}", file.display());
        for l in &lines {
            assert!(l.ends_with(", icrc ok"), "{}: {l}", file.display());
            assert!(l.contains(" > ") && l.contains(".4791: "), "{l}");
        }
        total += lines.len();
    }
    assert_eq!(total, 393);
}

#[test]
fn line_format() {
    let (_, out, _) = decode(&["-t", "none"], &[vectors().join("read_bw.pcap")]);
    let first = out.lines().next().unwrap();
    assert_eq!(
        first,
        "IP 10.50.0.2.49777 > 10.50.0.1.4791: RC RDMA_READ_REQUEST qp 0x000019 psn 0xb7f08e \
         ack-req pkey 0xffff RETH va 0x55e2571dd388 rkey 0xacc dlen 5000, icrc ok"
    );
    let (_, out, _) = decode(&["-t", "none"], &[vectors().join("rnr_nak.pcap")]);
    assert!(out.lines().nth(1).unwrap().contains("AETH RNR-NAK timer 24 (40.96 ms) msn 0"));
    let (_, out, _) = decode(&["-t", "none"], &[vectors().join("rping_cm.pcap")]);
    assert!(
        out.lines().next().unwrap().ends_with(
            "len 256 CM REQ tid 0x2132cfda4 comm 0xa4fd2c13 service 0x0000000001061c06 \
             (tcp port 7174) qpn 0x000021 psn 0xde09fa mtu-code 3 retry 7 rnr-retry 7, icrc ok"
        ),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.contains(
            "CM DREQ tid 0x2132cfda4 comm 0xa4fd2c13 remote-comm 0xc9043ee9 remote-qpn 0x000021"
        )),
        "{out}"
    );
    let (_, out, _) = decode(&["-t", "none", "-v"], &[vectors().join("rc_send_ipv6.pcap")]);
    assert!(
        out.starts_with("IP6 fe80::5054:ff:fe52:2.49476 > fe80::5054:ff:fe52:1.4791: (hlim 64")
    );
}

#[test]
fn corruption_is_reported() {
    let src = std::fs::read(vectors().join("write_lat.pcap")).unwrap();
    let mut bad = src.clone();
    // Flip a payload bit of the first frame (24-byte file header, 16-byte
    // record header, then the frame; byte 100 lies in the RoCE payload).
    bad[24 + 16 + 100] ^= 0x04;
    let dir = std::env::temp_dir().join(format!("uroce-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.pcap");
    std::fs::write(&path, &bad).unwrap();
    let (ok, out, err) = decode(&["--strict"], std::slice::from_ref(&path));
    assert!(!ok, "--strict must fail on a bad ICRC");
    assert!(out.lines().next().unwrap().contains("icrc BAD"), "{out}");
    assert!(err.contains("1 bad ICRC"), "{err}");
    let (ok, _, err) = decode(&[], std::slice::from_ref(&dir.join("missing.pcap")));
    assert!(!ok && err.contains("cannot read"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
