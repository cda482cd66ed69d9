//! Port events: a device whose interface loses its link reports PORT_ERR,
//! and PORT_ACTIVE when it comes back. The test makes its own veth pair
//! (one end in a network namespace of its own) and removes both; it needs
//! root, which CI has.

use std::process::Command;
use std::time::{Duration, Instant};

use uroce::{AsyncEvent, Device, DeviceConfig};

fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().is_ok_and(|s| s.success())
}

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn event(ctx: &uroce::Context) -> Option<AsyncEvent> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Some(e) = ctx.poll_async_event() {
            return Some(e);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn link_down_and_up_raise_port_events() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !ip(&["-V"]) {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root with iproute2");
        eprintln!("needs root and iproute2: skipped");
        return;
    }
    let id = std::process::id() % 100_000;
    let (ns, a, b) = (format!("uroce-pt{id}"), format!("urpa{id}"), format!("urpb{id}"));
    let addr = format!("10.251.{}.{}", (id >> 8) & 0xff, (id & 0xff).max(1));
    assert!(ip(&["netns", "add", &ns]));
    let _cleanup = Cleanup(ns.clone());
    assert!(ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]));
    assert!(ip(&["link", "set", &b, "netns", &ns]));
    assert!(ip(&["addr", "add", &format!("{addr}/32"), "dev", &a]));
    assert!(ip(&["link", "set", &a, "up"]));
    assert!(ip(&["-n", &ns, "link", "set", &b, "up"]));
    std::thread::sleep(Duration::from_millis(200));

    let dev = Device::from_config(DeviceConfig {
        name: "pt".into(),
        addr: addr.parse().unwrap(),
        port: 4791,
    });
    assert!(dev.port_attr().active, "veth up with its peer up: port active");
    let ctx = dev.open().unwrap();
    // Peer down: no carrier on our end.
    assert!(ip(&["-n", &ns, "link", "set", &b, "down"]));
    assert_eq!(event(&ctx), Some(AsyncEvent::PortError));
    assert!(!ctx.query_port(1).unwrap().active);
    assert!(ip(&["-n", &ns, "link", "set", &b, "up"]));
    assert_eq!(event(&ctx), Some(AsyncEvent::PortActive));
    drop(ctx);
    let _ = Command::new("ip").args(["link", "del", &a]).status();
}
