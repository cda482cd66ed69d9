//! rdma-core's own test suite (pyverbs; Debian's `python3-pyverbs` ships it
//! under `/usr/share/doc/rdma-core/tests`) on the drop-in library, under
//! `uroce run`: device and port queries, PDs, MRs (re-registration, device
//! memory, memory windows, ODP), CQs and extended CQs, every QP type's
//! traffic, SRQs, XRC, atomics, parent domains, the RDMA CM between forked
//! processes, raw packet QPs and flow steering, tag matching SRQs. Every
//! test must pass or be
//! skipped for one of the reasons `ALLOWED_SKIPS` lists (or fail as
//! `KNOWN_ERRORS` says).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{HugePages, env, finish, text};

/// Why a test of the suite may be skipped here, by the start of the reason
/// it gives.
const ALLOWED_SKIPS: &[(&str, &str)] = &[
    ("Can not run the test over non MLX5 device", "mlx5's vendor extensions"),
    ("Could not open mlx5 context", "mlx5's vendor extensions"),
    ("Can not run the test over non EFA device", "EFA's vendor extensions"),
    ("Converting timestamp to nanoseconds is not supported", "an mlx5 call"),
    ("Allocating dmabuf is not supported", "no GPU render node for dma-buf"),
    ("cuda-python", "no CUDA"),
    ("PCI device must be passed", "VFIO to a PCI device"),
    ("All gid indices populated", "nothing to check"),
];

/// Tests that fail here for a reason listed (what they need is not
/// implemented, and they do not skip themselves for it).
const KNOWN_ERRORS: &[(&str, &str)] = &[];

#[test]
fn rdma_core_test_suite_passes() {
    let suite = Path::new("/usr/share/doc/rdma-core/tests");
    let python = Path::new("/usr/bin/python3");
    if !suite.join("run_tests.py").exists() || !python.exists() {
        assert!(std::env::var_os("CI").is_none(), "CI installs python3-pyverbs");
        eprintln!("no python3-pyverbs: skipped");
        return;
    }
    // The suite's modules, some gzipped by Debian, in a directory of ours.
    let dir = std::env::temp_dir().join(format!("uroce-rdma-core-tests-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let copied = Command::new("cp").arg("-r").arg(suite).arg(&dir).status().unwrap();
    assert!(copied.success(), "copying the suite");
    let gz: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gz"))
        .collect();
    if !gz.is_empty() {
        let unzipped = Command::new("gunzip").arg("-f").args(&gz).status().unwrap();
        assert!(unzipped.success(), "gunzip");
    }
    // The huge-page tests (ODP, parent domains) need 2 MiB pages: as
    // root, some are reserved (and given back); otherwise they skip.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    let _pages = root.then(|| HugePages::reserve(64));
    // GID 0 is the device's IPv4 address, GID 1 its IPv6 one (::1).
    for gid in ["0", "1"] {
        run_suite(&dir, python, gid, root);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the suite in `dir` on GID index `gid`; checks its results
/// (`huge_pages`: some are reserved, so no test may skip for lack of them).
fn run_suite(dir: &Path, python: &Path, gid: &str, huge_pages: bool) {
    let e = env();
    let udp = uroce::testing::free_port();
    let child = Command::new(&e.uroce)
        .args(["run", "--"])
        .arg(python)
        .arg(dir.join("run_tests.py"))
        .args(["--dev", "uroce0", "--gid", gid, "-v"])
        .env("UROCE_LIB_DIR", &e.lib_dir)
        .env("UROCE_DEVICES", format!("uroce0=127.0.0.1:{udp}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, timed_out) = finish(child, Instant::now() + Duration::from_secs(900));
    let log = text(&out);
    assert!(!timed_out, "the suite did not end within 15 minutes:\n{log}");
    let ran: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no summary:\n{log}"));
    assert!(ran > 250, "only {ran} tests ran:\n{log}");
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("ERROR: ") || l.starts_with("FAIL: "))
        .filter(|l| !KNOWN_ERRORS.iter().any(|(name, _)| l.contains(name)))
        .collect();
    assert!(bad.is_empty(), "{}\n\n{log}", bad.join("\n"));
    let mut passed = 0;
    let mut skipped = 0;
    for l in log.lines() {
        if l.ends_with(" ... ok") {
            passed += 1;
        }
        let Some((_, reason)) = l.split_once(" ... skipped '") else { continue };
        skipped += 1;
        let no_pages = !huge_pages && reason.starts_with("There are no huge pages");
        assert!(
            no_pages || ALLOWED_SKIPS.iter().any(|(start, _)| reason.starts_with(start)),
            "a test skipped for a reason not allowed: {l}"
        );
    }
    eprintln!("rdma-core's tests, GID {gid}: {ran} ran, {passed} passed, {skipped} skipped");
    assert!(passed > 100, "{passed} passed:\n{log}");
}
