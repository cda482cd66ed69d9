//! What the drop-in test binaries share: the library and the `uroce`
//! binary as this test profile builds them, and waiting for a child with a
//! deadline.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where the library and the `uroce` binary are, built once per run.
pub(crate) struct Env {
    pub(crate) lib_dir: PathBuf,
    pub(crate) uroce: PathBuf,
}

/// Builds (once) and locates the cdylib and the CLI of this test profile
/// (`target/debug/uroce-lib`, `target/debug/uroce`).
pub(crate) fn env() -> &'static Env {
    env_with(&[])
}

/// [`env`], the library built with `features` of `uroce-ibverbs` (the
/// first call's features hold for the whole test binary).
pub(crate) fn env_with(features: &[&str]) -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut args = vec!["build", "--profile", "test", "-p", "uroce-ibverbs", "-p", "uroce-cli"];
        let list = features.join(",");
        if !features.is_empty() {
            args.extend(["--features", &list]);
        }
        let status = Command::new(env!("CARGO"))
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo");
        assert!(status.success(), "building the library and the CLI failed");
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.ancestors().nth(2).unwrap().to_path_buf();
        let e = Env { lib_dir: profile_dir.join("uroce-lib"), uroce: profile_dir.join("uroce") };
        assert!(e.lib_dir.join("libibverbs.so.1").exists(), "{} not built", e.lib_dir.display());
        e
    })
}

/// Whether `tool` is on the `PATH`.
pub(crate) fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Waits for `child` up to `deadline`, killing it after (its whole
/// process group when it leads one).
pub(crate) fn finish(mut child: Child, deadline: Instant) -> (Output, bool) {
    let timed_out = loop {
        match child.try_wait().unwrap() {
            Some(_) => break false,
            None if Instant::now() >= deadline => {
                if leads_group(child.id()) {
                    // bash's own kill (bash is essential; /bin/kill is procps).
                    let _ = Command::new("bash")
                        .args(["-c", &format!("kill -KILL -- -{}", child.id())])
                        .stderr(std::process::Stdio::null())
                        .status();
                }
                let _ = child.kill();
                break true;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let status = child.wait().unwrap();
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    // A caller may have taken a pipe to read it as the child runs.
    if let Some(mut o) = child.stdout.take() {
        o.read_to_end(&mut stdout).unwrap();
    }
    if let Some(mut e) = child.stderr.take() {
        e.read_to_end(&mut stderr).unwrap();
    }
    (Output { status, stdout, stderr }, timed_out)
}

/// Whether process `pid` leads its process group (field 5 of its stat).
fn leads_group(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after_name.split_whitespace().nth(2) == Some(&pid.to_string())
}

/// Both output streams of a run.
pub(crate) fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A reservation of huge pages (`vm.nr_hugepages`), given back on drop.
pub(crate) struct HugePages {
    before: String,
}

impl HugePages {
    const KNOB: &str = "/proc/sys/vm/nr_hugepages";

    pub(crate) fn reserve(n: u64) -> Self {
        let before = std::fs::read_to_string(Self::KNOB).unwrap().trim().to_string();
        if before.parse::<u64>().unwrap_or(0) < n {
            let set = std::fs::write(Self::KNOB, n.to_string());
            let now: u64 = std::fs::read_to_string(Self::KNOB).unwrap().trim().parse().unwrap();
            assert!(
                set.is_ok() && now >= n,
                "reserving {n} huge pages (needs root): {set:?}, {now}"
            );
        }
        Self { before }
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::KNOB, &self.before);
    }
}
