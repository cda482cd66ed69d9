//! The floor under uroce's latency: a plain UDP ping-pong between the
//! same two addresses and the same two processes' shape as `uroce bench`
//! (127.0.0.1 → 127.0.0.2, both sides busy-polling non-blocking sockets,
//! as uroce's benchmark busy-polls its CQs). Whatever uroce adds above this
//! is the cost of the RDMA stack itself; the kernel's UDP path is beneath
//! both. A peer of `uroce bench --peers` that needs no installation.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::common::KillOnDrop;

const SERVER: &str = "127.0.0.2";
const CLIENT: &str = "127.0.0.1";
/// The largest UDP payload (IPv4).
const MAX_PAYLOAD: usize = 65_507;
/// The echo server exits after this long without a datagram (a client
/// that died without killing it).
const IDLE_EXIT: Duration = Duration::from_secs(30);

/// The echo side (`uroce bench --udp-echo PORT`, started by [`measure`]):
/// returns every datagram to its sender until idle for `IDLE_EXIT`.
pub(crate) fn echo(port: u16) -> Result<ExitCode> {
    let sock =
        UdpSocket::bind((SERVER, port)).with_context(|| format!("binding {SERVER}:{port}"))?;
    sock.set_nonblocking(true)?;
    let mut buf = vec![0u8; MAX_PAYLOAD];
    let mut last = Instant::now();
    loop {
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                sock.send_to(&buf[..n], from)?;
                last = Instant::now();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if last.elapsed() > IDLE_EXIT {
                    return Ok(ExitCode::SUCCESS);
                }
                std::hint::spin_loop();
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sends `msg` and busy-polls for its echo; the round trip, or `None`
/// after `limit` (a lost datagram).
fn round_trip(sock: &UdpSocket, msg: &[u8], buf: &mut [u8], limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    sock.send(msg).ok()?;
    loop {
        match sock.recv(buf) {
            Ok(n) if n == msg.len() => return Some(t.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if t.elapsed() > limit {
                    return None;
                }
                std::hint::spin_loop();
            }
            Err(_) => return None,
        }
    }
}

/// Half the median round trip of `iters` ping-pongs of `size` bytes, in
/// microseconds.
fn one_way_us(sock: &UdpSocket, size: usize, iters: u32) -> Option<f64> {
    let msg = vec![0x5au8; size];
    let mut buf = vec![0u8; MAX_PAYLOAD];
    let limit = Duration::from_millis(200);
    for _ in 0..(iters / 10).max(10) {
        round_trip(sock, &msg, &mut buf, limit)?;
    }
    let mut rtts: Vec<Duration> =
        (0..iters).filter_map(|_| round_trip(sock, &msg, &mut buf, limit)).collect();
    if rtts.len() < iters as usize / 2 {
        return None;
    }
    rtts.sort_unstable();
    Some(rtts[rtts.len() / 2].as_secs_f64() * 1e6 / 2.0)
}

/// The floor's one-way latency (µs) for each size a datagram can carry.
pub(crate) fn measure(
    sizes: &[usize],
    iters: impl Fn(usize) -> u32,
) -> Option<Vec<(usize, Option<f64>)>> {
    let exe = std::env::current_exe().ok()?;
    let port = uroce::testing::free_port();
    let _echo = KillOnDrop(
        Command::new(exe)
            .args(["bench", "--udp-echo", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .ok()?,
    );
    let sock = UdpSocket::bind((CLIENT, 0)).ok()?;
    sock.connect(SocketAddr::new(SERVER.parse().ok()?, port)).ok()?;
    sock.set_nonblocking(true).ok()?;
    // Ready when a probe comes back (the echo process binds meanwhile).
    let mut buf = [0u8; 64];
    let start = Instant::now();
    while round_trip(&sock, &[1, 2], &mut buf, Duration::from_millis(20)).is_none() {
        if start.elapsed() > Duration::from_secs(5) {
            return None;
        }
    }
    Some(
        sizes
            .iter()
            .filter(|&&s| s <= MAX_PAYLOAD)
            .map(|&s| (s, one_way_us(&sock, s, iters(s))))
            .collect(),
    )
}
