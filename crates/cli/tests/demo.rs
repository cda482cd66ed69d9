//! `uroce demo` between two real processes over UDP on 127.0.0.1 and
//! 127.0.0.2: every RC operation, data and atomics verified by the tool.

use std::process::Command;

#[test]
fn two_processes_run_every_rc_operation() {
    // A port of our own so parallel test runs do not collide.
    let port = uroce::testing::free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(["demo", "-n", "50", "--port", &port.to_string()])
        .output()
        .expect("run uroce demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    for want in [
        "RDMA WRITE 8 B",
        "RDMA READ 8 B",
        "RDMA WRITE 64 KiB",
        "RDMA READ 64 KiB",
        "ATOMIC FETCH_AND_ADD",
        "(51 fetch-adds counted, then swapped to 0xc0ffee)",
        "data verified",
        "server: received SEND of 16 bytes: \"hello from uroce\"",
        "SEND 1 KiB to an SRQ-backed QP",
        "server: 16 SENDs on QP",
        "landed in the shared receive queue",
        "\"pong from the server's UD QP\"",
        "replied through an AH made from it",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
}
