//! The `uroce` command.

#![deny(unsafe_code)]

mod bench;
mod common;
mod decode;
mod demo;
mod devinfo;
mod measure;
mod peers;
mod perf;
mod pingpong;
mod plot;
mod rping;
mod run;
mod setup;
mod stat;
mod udp_floor;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// RDMA verbs in user space over RoCEv2: tools.
#[derive(Parser)]
#[command(name = "uroce", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print one line per RoCEv2 packet of a pcap/pcapng capture, with an
    /// ICRC verdict (tcpdump-style).
    Decode(decode::Args),
    /// Two processes on this host run every RC operation over UDP and
    /// report what they did and how long it took.
    Demo(demo::Args),
    /// List the devices, as ibv_devices does.
    Devices(devinfo::DevicesArgs),
    /// Print device and port attributes, as ibv_devinfo does.
    Devinfo(devinfo::DevinfoArgs),
    /// ibv_rc/uc/ud/srq_pingpong: SEND ping-pong over a TCP-exchanged
    /// connection, with rdma-core's options and report.
    Pingpong(pingpong::Args),
    /// Sweep message sizes over WRITE, READ, SEND and atomics between two
    /// local processes: table, CSV and plots.
    Bench(bench::Args),
    /// perftest's ib_{send,write,read,atomic}_{bw,lat}: same flags,
    /// exchange and tables.
    Perf(perf::Args),
    /// librdmacm's rping: SEND of buffer advertisements, RDMA READ of the
    /// pattern, RDMA WRITE back, verify (connected over TCP for now).
    Rping(rping::Args),
    /// Run a program on the drop-in libibverbs/librdmacm, with
    /// /dev/infiniband and /sys/class/infiniband entries for uroce's devices
    /// (a private mount namespace; no root needed).
    Run(run::Args),
    /// One-time privileged setup: `setup xdp IFACE` starts the broker that
    /// lets unprivileged processes use the AF_XDP backend on IFACE.
    Setup(setup::Args),
    /// Counters of every process using a device (rxe's hw_counters set,
    /// then uroce's own), read while they run.
    Stat(stat::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Decode(a) => decode::run(&a),
        Command::Demo(a) => demo::run(&a),
        Command::Devices(a) => devinfo::devices(&a),
        Command::Devinfo(a) => devinfo::devinfo(&a),
        Command::Pingpong(a) => pingpong::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::Perf(a) => perf::run(&a),
        Command::Rping(a) => rping::run(&a),
        Command::Run(a) => run::run(&a),
        Command::Setup(a) => setup::run(&a),
        Command::Stat(a) => stat::run(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("uroce: {e:#}");
            ExitCode::FAILURE
        }
    }
}
