//! Counters other processes can read while a program runs, the way rxe's
//! sit in `/sys/class/infiniband/<dev>/ports/1/hw_counters`: each open
//! context's progress thread writes a snapshot of its device totals and
//! per-QP counters about ten times a second to
//! `<run dir>/<device>/<pid>.<context>`, whole files only (written beside
//! and renamed), and removes it on close. `uroce stat` sums the files of
//! live processes.
//!
//! The run directory is `$UROCE_RUN_DIR`, else `$XDG_RUNTIME_DIR/uroce`,
//! else `/tmp/uroce-<uid>`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use uroce_transport::Stats;

/// rxe's counter names (`hw_counters`) in rxe's order, each with the
/// uroce counter it reads; uroce's own follow them in a snapshot.
pub const RXE_COUNTERS: [&str; 15] = [
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
];

/// One process context's counters, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The device name.
    pub device: String,
    /// The publishing process.
    pub pid: u32,
    /// Device totals (every QP, live or destroyed, and device-level drops).
    pub device_stats: Stats,
    /// Live QPs: number and counters.
    pub qps: Vec<(u32, Stats)>,
}

/// The directory snapshots live under.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UROCE_RUN_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("uroce");
    }
    // The owner of /proc/self is this process's effective uid (no unsafe
    // getuid() outside the unsafe modules).
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    PathBuf::from(format!("/tmp/uroce-{uid}"))
}

/// Where this context publishes: a name unique in the process.
pub(crate) fn path_for(device: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    run_dir().join(device).join(format!("{}.{n}", std::process::id()))
}

/// Writes `s` to `path` whole (a temporary beside it, then a rename).
pub(crate) fn write(path: &Path, s: &Snapshot) -> std::io::Result<()> {
    let mut text = format!("device {}\npid {}\n", s.device, s.pid);
    for (name, v) in s.device_stats.iter() {
        let _ = writeln!(text, "dev {name} {v}");
    }
    for (qpn, st) in &s.qps {
        for (name, v) in st.iter() {
            let _ = writeln!(text, "qp {qpn} {name} {v}");
        }
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Parses a snapshot file; `None` if it is not one.
pub fn parse(text: &str) -> Option<Snapshot> {
    let mut s =
        Snapshot { device: String::new(), pid: 0, device_stats: Stats::default(), qps: Vec::new() };
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["device", d] => s.device = (*d).to_string(),
            ["pid", p] => s.pid = p.parse().ok()?,
            ["dev", name, v] => {
                s.device_stats.set(name, v.parse().ok()?);
            }
            ["qp", qpn, name, v] => {
                let qpn: u32 = qpn.parse().ok()?;
                if s.qps.last().is_none_or(|(q, _)| *q != qpn) {
                    s.qps.push((qpn, Stats::default()));
                }
                s.qps.last_mut()?.1.set(name, v.parse().ok()?);
            }
            _ => return None,
        }
    }
    (!s.device.is_empty() && s.pid != 0).then_some(s)
}

/// The snapshots of live processes for `device` (all devices if `None`);
/// files left by processes that died are removed.
pub fn read_all(device: Option<&str>) -> Vec<Snapshot> {
    let mut out = Vec::new();
    let Ok(devs) = std::fs::read_dir(run_dir()) else { return out };
    for d in devs.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        if device.is_some_and(|want| want != name) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(d.path()) else { continue };
        for f in files.flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "tmp") {
                continue;
            }
            let Some(s) = std::fs::read_to_string(&p).ok().and_then(|t| parse(&t)) else {
                continue;
            };
            if Path::new(&format!("/proc/{}", s.pid)).exists() {
                out.push(s);
            } else {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    out.sort_by_key(|s| (s.device.clone(), s.pid));
    out
}

/// The value rxe's counter `name` has in `s`.
pub fn rxe_value(s: &Stats, name: &str) -> u64 {
    s.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip_and_name_every_rxe_counter() {
        let mut a = Stats { sent_pkts: 7, rdma_recvs: 3, ..Stats::default() };
        a.ack_deferred = 2;
        let s = Snapshot {
            device: "uroce0".into(),
            pid: 42,
            device_stats: a,
            qps: vec![(0x11, Stats { rcvd_seq_err: 5, ..Stats::default() }), (0x12, a)],
        };
        let dir = std::env::temp_dir().join(format!("uroce-pub-{}", std::process::id()));
        let p = dir.join("uroce0").join("42.0");
        write(&p, &s).unwrap();
        let back = parse(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back, s);
        for name in RXE_COUNTERS {
            assert!(a.iter().any(|(n, _)| n == name), "{name} is not a uroce counter");
        }
        assert_eq!(rxe_value(&a, "ack_deferred"), 2);
        assert!(parse("device x\npid 1\nbogus line\n").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
