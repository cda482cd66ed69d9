//! `uroce decode`: a RoCEv2-aware tcpdump for capture files.

use std::fmt::Write as _;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use uroce_pcap::Reader;
use uroce_wire::udp::ROCE_V2_PORT;
use uroce_wire::{IpHeader, Transport, UdpDatagram};

/// How timestamps are printed.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum TimeFormat {
    /// Time of day, UTC (tcpdump's default).
    Abs,
    /// Seconds since the Unix epoch (tcpdump -tt).
    Epoch,
    /// Seconds since the first frame.
    Rel,
    /// No timestamp (tcpdump -t).
    None,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Capture files (pcap or pcapng; Ethernet, raw IP, Linux cooked or loopback).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// UDP destination port that carries RoCEv2.
    #[arg(short, long, default_value_t = ROCE_V2_PORT)]
    port: u16,
    /// Timestamp format.
    #[arg(short, long, value_enum, default_value = "abs")]
    time: TimeFormat,
    /// Also show IP ID, TTL, TOS, UDP checksum and the ICRC value.
    #[arg(short, long)]
    verbose: bool,
    /// Exit with status 1 if any packet has a bad ICRC or is malformed.
    #[arg(long)]
    strict: bool,
}

#[derive(Default)]
struct Totals {
    frames: u64,
    roce: u64,
    bad_icrc: u64,
    malformed: u64,
}

pub(crate) fn run(args: &Args) -> Result<ExitCode> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut totals = Totals::default();
    for path in &args.files {
        let data =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let reader = Reader::new(&data).with_context(|| format!("{}", path.display()))?;
        let mut first_ts = None;
        let mut line = String::new();
        for rec in reader {
            let rec = rec.with_context(|| format!("{}", path.display()))?;
            totals.frames += 1;
            let Some(ip) = rec.ip_packet() else { continue };
            let Ok(dgram) = UdpDatagram::parse(ip) else { continue };
            if dgram.udp.dst_port() != args.port {
                continue;
            }
            totals.roce += 1;
            line.clear();
            let t0 = *first_ts.get_or_insert(rec.ts_ns);
            write_time(&mut line, args.time, rec.ts_ns, t0);
            describe(&mut line, &dgram, args.verbose, &mut totals);
            writeln!(out, "{line}")?;
        }
    }
    out.flush()?;
    eprintln!(
        "{} frames, {} RoCEv2 packets, {} bad ICRC, {} malformed",
        totals.frames, totals.roce, totals.bad_icrc, totals.malformed
    );
    let failed = totals.bad_icrc + totals.malformed > 0;
    Ok(if args.strict && failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn write_time(s: &mut String, fmt: TimeFormat, ts: u64, t0: u64) {
    let _ = match fmt {
        TimeFormat::Abs => {
            let secs = ts / 1_000_000_000;
            let us = (ts % 1_000_000_000) / 1000;
            let day = secs % 86_400;
            write!(s, "{:02}:{:02}:{:02}.{us:06} ", day / 3600, day / 60 % 60, day % 60)
        }
        TimeFormat::Epoch => write!(s, "{}.{:06} ", ts / 1_000_000_000, ts % 1_000_000_000 / 1000),
        TimeFormat::Rel => {
            let d = ts.saturating_sub(t0);
            write!(s, "{}.{:06} ", d / 1_000_000_000, d % 1_000_000_000 / 1000)
        }
        TimeFormat::None => Ok(()),
    };
}

/// Appends `ADDR.PORT > ADDR.PORT: <packet> icrc ok|BAD`.
fn describe(s: &mut String, d: &UdpDatagram<'_>, verbose: bool, totals: &mut Totals) {
    let (family, extra) = match d.ip {
        IpHeader::V4(p) => (
            "IP",
            format!(
                " (id {} ttl {} tos {:#x}{}{})",
                p.ident(),
                p.ttl(),
                p.tos(),
                if p.dont_frag() { " DF" } else { "" },
                if p.checksum_ok() { "" } else { " bad-ip-cksum" }
            ),
        ),
        IpHeader::V6(p) => (
            "IP6",
            format!(
                " (hlim {} class {:#x} flow {:#x})",
                p.hop_limit(),
                p.traffic_class(),
                p.flow_label()
            ),
        ),
    };
    let _ = write!(
        s,
        "{family} {}.{} > {}.{}:",
        d.ip.src(),
        d.udp.src_port(),
        d.ip.dst(),
        d.udp.dst_port()
    );
    if verbose {
        let _ = write!(s, "{extra} udp-cksum {:#06x}:", d.udp.checksum());
    }
    let pkt = match d.roce() {
        Ok(p) => p,
        Err(e) => {
            totals.malformed += 1;
            let _ = write!(s, " malformed RoCEv2 ({e})");
            return;
        }
    };
    let _ = write!(s, " {pkt}");
    if pkt.bth().dest_qpn() == 1 && pkt.info().transport == Transport::Ud {
        describe_mad(s, pkt.payload());
    }
    match d.expected_icrc() {
        Ok(want) if want == pkt.icrc() => {
            let _ = write!(s, ", icrc ok");
            if verbose {
                let _ = write!(s, " {:#010x}", pkt.icrc());
            }
        }
        Ok(want) => {
            totals.bad_icrc += 1;
            let _ = write!(s, ", icrc BAD (wire {:#010x}, computed {want:#010x})", pkt.icrc());
        }
        Err(_) => {
            totals.malformed += 1;
            let _ = write!(s, ", icrc ?");
        }
    }
}

/// Names a management datagram carried to QP1 that is not a CM message
/// (those the packet's own description details: `CM REQ …`).
fn describe_mad(s: &mut String, mad: &[u8]) {
    if mad.len() < 24 || uroce_wire::cm::CmMad::parse(mad).is_ok() {
        return;
    }
    let class = mad[1];
    let method = mad[3];
    let tid =
        u64::from_be_bytes([mad[8], mad[9], mad[10], mad[11], mad[12], mad[13], mad[14], mad[15]]);
    let attr = u16::from_be_bytes([mad[16], mad[17]]);
    let class_name = match class {
        0x01 | 0x81 => "SMP",
        0x03 => "SA",
        0x04 => "PerfMgmt",
        0x07 => "CM",
        _ => "class",
    };
    let attr_name = match (class, attr) {
        (0x07, 0x0010) => "REQ",
        (0x07, 0x0011) => "MRA",
        (0x07, 0x0012) => "REJ",
        (0x07, 0x0013) => "REP",
        (0x07, 0x0014) => "RTU",
        (0x07, 0x0015) => "DREQ",
        (0x07, 0x0016) => "DREP",
        (0x07, 0x0017) => "SIDR_REQ",
        (0x07, 0x0018) => "SIDR_REP",
        (0x07, 0x0019) => "LAP",
        (0x07, 0x001a) => "APR",
        (_, 0x0001) => "ClassPortInfo",
        _ => "attr",
    };
    let _ = write!(
        s,
        " MAD {class_name} {attr_name} (class {class:#04x} method {method:#04x} attr {attr:#06x}) tid {tid:#x}"
    );
}
