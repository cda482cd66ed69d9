//! `uroce setup xdp IFACE`: the one privileged step that lets unprivileged
//! processes use the AF_XDP backend on an interface (`uroce::xdp_broker`).

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context as _, Result, bail};

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Start the AF_XDP broker of an interface (as root, once per boot and
    /// network namespace): it opens AF_XDP sockets and attaches the XDP
    /// program for other users' processes, so that `UROCE_BACKEND=xdp`
    /// needs no capability. Whoever it admits may send raw frames on the
    /// interface, as CAP_NET_RAW would let them.
    Xdp(XdpArgs),
}

#[derive(clap::Args)]
struct XdpArgs {
    /// The interface (of this network namespace).
    iface: String,
    /// Admit only root and this group's members (a name or a number);
    /// every user otherwise.
    #[arg(long)]
    group: Option<String>,
    /// Stay in the foreground (logs on stderr) instead of detaching.
    #[arg(long)]
    foreground: bool,
    /// Busy-poll each socket's queue for this many microseconds: the
    /// contexts' empty receive checks run the driver's receive themselves
    /// (SO_PREFER_BUSY_POLL and SO_BUSY_POLL, set by the broker).
    #[arg(long, value_name = "USECS", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    busy_poll: Option<u32>,
    /// Stop the interface's broker instead (its programs are detached).
    #[arg(long, conflicts_with_all = ["group", "foreground", "busy_poll"])]
    stop: bool,
}

pub(crate) fn run(a: &Args) -> Result<ExitCode> {
    let What::Xdp(x) = &a.what;
    if x.stop {
        if uroce::xdp_broker::stop(&x.iface)? {
            println!("uroce: the AF_XDP broker of {} stopped", x.iface);
        } else {
            println!("uroce: no AF_XDP broker serves {}", x.iface);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let group = x.group.as_deref().map(group_id).transpose()?;
    let opts = uroce::xdp_broker::Options { group, busy_poll: x.busy_poll };
    if x.foreground {
        uroce::xdp_broker::serve(&x.iface, &opts, || {
            println!("uroce: AF_XDP broker of {} ready (pid {})", x.iface, std::process::id());
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    // Detach: the same command in the foreground, in a process group of
    // its own, its output read until it is ready (or has failed).
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["setup", "xdp", &x.iface, "--foreground"]);
    if let Some(us) = x.busy_poll {
        cmd.args(["--busy-poll", &us.to_string()]);
    }
    if let Some(g) = &x.group {
        cmd.args(["--group", g]);
    }
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.contains("ready") {
        print!("{line}");
        println!(
            "uroce: processes may now use UROCE_BACKEND=xdp on {} without privilege \
             (`uroce setup xdp {} --stop` ends it)",
            x.iface, x.iface
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut err = String::new();
    use std::io::Read as _;
    child.stderr.take().expect("piped").read_to_string(&mut err)?;
    let _ = child.wait();
    bail!("the broker did not start: {}", err.trim().trim_start_matches("uroce: "))
}

/// A group's number, from a number or a name in `/etc/group`.
fn group_id(g: &str) -> Result<u32> {
    if let Ok(n) = g.parse() {
        return Ok(n);
    }
    let groups = std::fs::read_to_string("/etc/group").context("reading /etc/group")?;
    groups
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            (f.next() == Some(g)).then(|| f.nth(1).and_then(|n| n.parse().ok())).flatten()
        })
        .with_context(|| format!("no group {g}"))
}
