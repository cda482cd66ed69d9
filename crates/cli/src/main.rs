//! The `uroce` command.

mod decode;
mod demo;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Decode(a) => decode::run(&a),
        Command::Demo(a) => demo::run(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("uroce: {e:#}");
            ExitCode::FAILURE
        }
    }
}
