//! `uroce run -- CMD ARGS…`: runs an unmodified verbs program on uroce's
//! drop-in libraries, and shows it the device files engines look for
//! before they touch verbs: `/dev/infiniband/uverbs<N>` (UCX uses only a
//! device whose character device it can read and write) and
//! `/sys/class/infiniband/<dev>` with `…/infiniband_verbs/uverbs<N>` (GID
//! types and netdevs, rate, state, `device/net/<ifname>`, counters).
//!
//! They live in a private mount namespace (inside a user namespace when
//! not root): a `tmpfs` over `/dev` and over `/sys/class` with every
//! original entry bound back, plus uroce's. The character devices are
//! `/dev/null` bound under the kernel's names: the drop-in library never
//! opens them. Nothing changes outside the program's namespace. Where the
//! kernel refuses namespaces the program runs with the libraries only, and
//! `uroce run` says what is missing.
//!
//! `uroce run` stays as the program's parent: it passes on SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT, refreshes the port state and `hw_counters`
//! (summed over every process using the device, as the kernel's) ten times
//! a second, and exits with the program's status.

#[allow(unsafe_code)]
mod mount;
mod nldev;
#[allow(unsafe_code)]
mod notify;
mod tree;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tree::Node;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Only set the library path: no namespace, no device files.
    #[arg(long)]
    no_device_files: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// How often the live files (port state, counters) are rewritten.
const REFRESH: Duration = Duration::from_millis(100);

/// Where the drop-in libraries are: `$UROCE_LIB_DIR`, else `uroce-lib`
/// beside this executable (cargo's `target/<profile>/`).
fn lib_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("UROCE_LIB_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().context("locating the uroce executable")?;
    let dir = exe.parent().map(|p| p.join("uroce-lib")).unwrap_or_default();
    if !dir.join("libibverbs.so.1").exists() {
        bail!(
            "no drop-in libibverbs.so.1 in {} (build it with `cargo build --release -p \
             uroce-ibverbs`, or name its directory in UROCE_LIB_DIR)",
            dir.display()
        );
    }
    Ok(dir)
}

/// Creates the nodes under `root`; files are written beside and renamed,
/// so a reader never sees half a value.
fn apply(root: &Path, nodes: &[Node]) -> std::io::Result<()> {
    for n in nodes {
        let (Node::Dir(p) | Node::File(p, _) | Node::Link(p, _)) = n;
        let path = root.join(p);
        if let Node::Dir(_) = n {
            std::fs::create_dir_all(&path)?;
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match n {
            Node::File(_, text) => {
                let tmp = path.with_extension("uroce-tmp");
                std::fs::write(&tmp, text)?;
                std::fs::rename(&tmp, &path)?;
            }
            Node::Link(_, target) => {
                let _ = std::fs::remove_file(&path);
                std::os::unix::fs::symlink(target, &path)?;
            }
            Node::Dir(_) => {}
        }
    }
    Ok(())
}

/// Builds the device files in this process's (private) mount namespace.
fn build_view(devices: &[uroce::Device]) -> Result<()> {
    mount::overlay(Path::new("/dev"), &["infiniband"]).context("a private /dev")?;
    let ib = Path::new("/dev/infiniband");
    std::fs::create_dir(ib)?;
    let mut names: Vec<String> = (0..devices.len()).map(|i| format!("uverbs{i}")).collect();
    names.push("rdma_cm".into());
    for name in names {
        let node = ib.join(name);
        std::fs::File::create(&node)?;
        mount::bind(Path::new("/dev/null"), &node)
            .with_context(|| format!("binding /dev/null on {}", node.display()))?;
    }
    let class = Path::new("/sys/class");
    mount::overlay(class, &["infiniband", "infiniband_verbs"]).context("a private /sys/class")?;
    std::fs::create_dir_all(class.join("infiniband"))?;
    std::fs::create_dir_all(class.join("infiniband_verbs"))?;
    for (i, d) in devices.iter().enumerate() {
        apply(class, &tree::device_nodes(i, d))?;
    }
    Ok(())
}

pub(crate) fn run(a: &Args) -> Result<ExitCode> {
    let lib = lib_dir()?;
    let devices = uroce::devices()?;
    let mut view = false;
    if !a.no_device_files {
        match mount::enter_private_namespace() {
            Ok(()) => {
                build_view(&devices).context(
                    "setting up /dev/infiniband and /sys/class/infiniband (--no-device-files \
                     runs without them)",
                )?;
                view = true;
            }
            Err(e) => eprintln!(
                "uroce run: no private mount namespace ({e}): running without \
                 /dev/infiniband and /sys/class/infiniband, so engines that look for them \
                 (UCX) will not use uroce devices"
            ),
        }
    }
    let mut path = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        path.push(":");
        path.push(old);
    }
    mount::block_signals()?;
    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..]).env("LD_LIBRARY_PATH", path);
    mount::unblock_in_child(&mut cmd);
    // The RDMA netlink family (`rdma link`) comes with the device files.
    let channel = if view { notify::channel() } else { None };
    if let Some(ch) = &channel {
        notify::install_in_child(&mut cmd, ch);
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {}", a.command[0]))?;
    // Started after the signals were blocked: the thread must not take
    // the ones the loop below waits for.
    if let Some(listener) = channel.and_then(notify::listener) {
        let devs = devices.clone();
        notify::serve(listener, move || {
            devs.iter().enumerate().map(|(i, d)| tree::netlink_info(i, d)).collect()
        });
    }
    loop {
        if let Some(signal) = mount::wait_signal(REFRESH) {
            mount::kill(child.id(), signal);
        }
        if let Some(status) = child.try_wait()? {
            use std::os::unix::process::ExitStatusExt;
            // A program killed with connections up (SIGKILL) never sent
            // their DREQs: sent for it here, as the kernel CM would.
            for d in &devices {
                if let Err(e) = d.end_leftover_connections() {
                    eprintln!("uroce run: ending {}'s leftover connections: {e}", d.name());
                }
            }
            let code = status.code().or(status.signal().map(|s| 128 + s)).unwrap_or(1);
            return Ok(ExitCode::from(code as u8));
        }
        if view {
            for d in &devices {
                // A failed refresh leaves the previous values: not fatal.
                let _ = apply(Path::new("/sys/class"), &tree::live_nodes(d));
            }
        }
    }
}
