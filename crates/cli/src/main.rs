//! The `uroce` command.

mod decode;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Decode(a) => decode::run(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("uroce: {e:#}");
            ExitCode::FAILURE
        }
    }
}
