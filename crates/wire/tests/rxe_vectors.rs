//! Ground truth: every packet Linux rxe put on the wire in
//! `tests/vectors/rxe/` (copied from `shared/pcaps/`) must parse, re-emit
//! byte for byte, carry the ICRC we compute, and have any single flipped
//! covered bit caught.

mod common;

use std::collections::BTreeSet;

use common::{Frame, all_frames, capture_names, frames_of, vectors_dir};
use uroce_wire::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, EthernetFrame, EthernetRepr};
use uroce_wire::icrc::{self, IcrcIp};
use uroce_wire::ipv4::Ipv4Repr;
use uroce_wire::ipv6::Ipv6Repr;
use uroce_wire::udp::{self, ROCE_V2_PORT, UdpRepr};
use uroce_wire::{
    IpHeader, NakCode, Opcode, RnrTimer, RocePacket, RocePacketRepr, Syndrome, Transport,
    UdpDatagram,
};

#[test]
fn vendored_copy_matches_shared_pcaps() {
    // When the team's shared directory is beside the checkout, every capture
    // in it must be in our copy, byte for byte (so new vectors are not missed).
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/pcaps");
    let Ok(entries) = std::fs::read_dir(&shared) else {
        eprintln!("no {} here; checking the vendored copy only", shared.display());
        return;
    };
    for e in entries {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if !name.ends_with(".pcap") {
            continue;
        }
        let ours = std::fs::read(vectors_dir().join(&name))
            .unwrap_or_else(|_| panic!("{name} is in shared/pcaps but not vendored"));
        assert_eq!(ours, std::fs::read(e.path()).unwrap(), "{name} differs from shared/pcaps");
    }
}

#[test]
fn all_393_packets_are_present() {
    let frames = all_frames();
    assert_eq!(frames.len(), 393, "the pcaps README counts 393 packets");
    assert_eq!(capture_names().len(), 18);
}

/// Rebuilds the whole frame from parsed representations and compares.
fn reemit(f: &Frame) {
    let eth = EthernetFrame::new_checked(&f.bytes[..]).unwrap();
    let d = UdpDatagram::parse(f.ip()).unwrap_or_else(|e| panic!("{}: {e}", f.name()));
    assert_eq!(d.udp.dst_port(), ROCE_V2_PORT);
    let pkt = d.roce().unwrap_or_else(|e| panic!("{}: {e}", f.name()));
    let repr = RocePacketRepr::parse(&pkt);

    let mut out = vec![0u8; f.bytes.len()];
    let eth_repr = EthernetRepr {
        dst: eth.dst(),
        src: eth.src(),
        vlan_tci: eth.vlan_tci(),
        ethertype: eth.ethertype(),
    };
    let mut at = eth_repr.emit(&mut out).unwrap();
    let roce_len = pkt.as_bytes().len();
    let udp_len = roce_len;
    match d.ip {
        IpHeader::V4(p) => {
            assert_eq!(eth.ethertype(), ETHERTYPE_IPV4);
            assert!(p.checksum_ok(), "{}: IPv4 header checksum", f.name());
            at += Ipv4Repr {
                src: p.src(),
                dst: p.dst(),
                tos: p.tos(),
                ident: p.ident(),
                dont_frag: p.dont_frag(),
                ttl: p.ttl(),
                protocol: p.protocol(),
                payload_len: 8 + udp_len,
            }
            .emit(&mut out[at..])
            .unwrap();
        }
        IpHeader::V6(p) => {
            assert_eq!(eth.ethertype(), ETHERTYPE_IPV6);
            at += Ipv6Repr {
                src: p.src(),
                dst: p.dst(),
                traffic_class: p.traffic_class(),
                flow_label: p.flow_label(),
                next_header: p.next_header(),
                hop_limit: p.hop_limit(),
                payload_len: 8 + udp_len,
            }
            .emit(&mut out[at..])
            .unwrap();
        }
    }
    let ip_start = f.ip_offset();
    at += UdpRepr {
        src_port: d.udp.src_port(),
        dst_port: d.udp.dst_port(),
        payload_len: udp_len,
        checksum: d.udp.checksum(),
    }
    .emit(&mut out[at..])
    .unwrap();
    let n = repr.emit(&mut out[at..], pkt.payload()).unwrap();
    assert_eq!(at + n, f.bytes.len(), "{}: length", f.name());

    // Fill the ICRC from our own re-emitted IP and UDP headers.
    let (ip_part, rest) = out.split_at_mut(at);
    let ip_hdr = IcrcIp::from_header(&ip_part[ip_start..]).unwrap();
    let udp_hdr: [u8; 8] = ip_part[at - 8..at].try_into().unwrap();
    let mut mine = RocePacket::new_checked(&mut rest[..n]).unwrap();
    icrc::fill(ip_hdr, &udp_hdr, &mut mine);

    assert_eq!(out, f.bytes, "{}: re-emitted frame differs", f.name());
}

#[test]
fn every_packet_parses_reemits_and_has_our_icrc() {
    for f in all_frames() {
        let d = UdpDatagram::parse(f.ip()).unwrap();
        let pkt = d.verify_icrc().unwrap_or_else(|e| panic!("{}: {e}", f.name()));
        assert_eq!(d.expected_icrc().unwrap(), pkt.icrc());
        reemit(&f);
    }
}

/// Whether a bit (offset from the IP header) lies in a field the ICRC masks.
fn masked(is_v4: bool, ip_hl: usize, off: usize) -> bool {
    let in_ip = if is_v4 { matches!(off, 1 | 8 | 10 | 11) } else { off < 4 || off == 7 };
    let udp_ck = off == ip_hl + 6 || off == ip_hl + 7;
    let bth4 = off == ip_hl + 8 + 4;
    in_ip || udp_ck || bth4
}

fn verdict(ip: &[u8]) -> bool {
    UdpDatagram::parse(ip).and_then(|d| d.verify_icrc()).is_ok()
}

#[test]
fn single_bit_flips_are_caught_and_masked_fields_ignored() {
    let mut caught = 0u64;
    let mut ignored = 0u64;
    for f in all_frames() {
        let mut ip = f.ip().to_vec();
        let is_v4 = ip[0] >> 4 == 4;
        let hl = if is_v4 { 20 } else { 40 };
        for off in 0..ip.len() {
            for bit in 0..8 {
                ip[off] ^= 1 << bit;
                let ok = verdict(&ip);
                ip[off] ^= 1 << bit;
                // The IPv6 version nibble shares byte 0 with the traffic
                // class: only its low nibble is masked.
                let is_masked = if !is_v4 && off == 0 { bit < 4 } else { masked(is_v4, hl, off) };
                if is_masked {
                    assert!(ok, "{}: flip in masked byte {off} bit {bit} rejected", f.name());
                    ignored += 1;
                } else {
                    assert!(!ok, "{}: flip at byte {off} bit {bit} not caught", f.name());
                    caught += 1;
                }
            }
        }
    }
    assert!(caught > 1_000_000, "{caught} flips caught, {ignored} ignored");
}

#[test]
fn opcodes_covered() {
    let mut seen = BTreeSet::new();
    for f in all_frames() {
        let d = UdpDatagram::parse(f.ip()).unwrap();
        seen.insert(d.roce().unwrap().bth().opcode().0);
    }
    let expected: BTreeSet<u8> = [
        Opcode::RC_SEND_FIRST,
        Opcode::RC_SEND_MIDDLE,
        Opcode::RC_SEND_LAST,
        Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        Opcode::RC_SEND_ONLY,
        Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
        Opcode::RC_RDMA_WRITE_FIRST,
        Opcode::RC_RDMA_WRITE_MIDDLE,
        Opcode::RC_RDMA_WRITE_LAST,
        Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Opcode::RC_RDMA_WRITE_ONLY,
        Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        Opcode::RC_RDMA_READ_REQUEST,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        Opcode::RC_ACKNOWLEDGE,
        Opcode::RC_ATOMIC_ACKNOWLEDGE,
        Opcode::RC_COMPARE_SWAP,
        Opcode::RC_FETCH_ADD,
        Opcode::UC_SEND_FIRST,
        Opcode::UC_SEND_MIDDLE,
        Opcode::UC_SEND_LAST,
        Opcode::UD_SEND_ONLY,
    ]
    .iter()
    .map(|o| o.0)
    .collect();
    assert_eq!(seen, expected, "opcodes in the captures changed; update the coverage list");
}

/// Facts from `tests/vectors/rxe/README.md` and the tools' logs.
#[test]
fn fields_match_the_logs() {
    let pkts = |name: &str| -> Vec<(Frame, RocePacketRepr)> {
        frames_of(name)
            .into_iter()
            .map(|f| {
                let r = RocePacketRepr::parse(&UdpDatagram::parse(f.ip()).unwrap().roce().unwrap());
                (f, r)
            })
            .collect()
    };
    // Immediate data of rxegen's SEND and WRITE.
    let imms: BTreeSet<u32> = pkts("imm_send.pcap").iter().filter_map(|(_, r)| r.immdt).collect();
    assert_eq!(imms, [0x1122_3344, 0x5566_7788].into());
    let imms: BTreeSet<u32> = pkts("imm_write.pcap").iter().filter_map(|(_, r)| r.immdt).collect();
    assert_eq!(imms, [0x99aa_bbcc, 0xddee_ff00].into());
    // rxegen's fixed PSNs: B starts at 0x123456.
    assert_eq!(pkts("imm_send.pcap")[0].1.bth.psn.value(), 0x123456);
    // RNR NAK: syndrome 0x38 = timer 24 (40.96 ms), seven times, then ACK 0x1f.
    let rnr = pkts("rnr_nak.pcap");
    let syn: Vec<Syndrome> = rnr.iter().filter_map(|(_, r)| r.aeth.map(|a| a.syndrome)).collect();
    assert_eq!(syn.len(), 8);
    assert!(syn[..7].iter().all(|s| *s == Syndrome::RnrNak(RnrTimer::from_code(24))));
    assert_eq!(syn[7], Syndrome::ACK);
    assert_eq!(RnrTimer::from_code(24).duration().as_micros(), 40_960);
    // NAK PSN sequence error carries the expected PSN; B goes back to it.
    let nak = pkts("nak_psn_seq.pcap");
    let naks: Vec<_> = nak
        .iter()
        .filter(|(_, r)| {
            r.aeth.map(|a| a.syndrome) == Some(Syndrome::Nak(NakCode::PsnSequenceError))
        })
        .collect();
    assert!(!naks.is_empty());
    for (f, r) in &naks {
        let resent = nak
            .iter()
            .filter(|(g, _)| g.index > f.index)
            .any(|(_, q)| q.bth.opcode.info().unwrap().is_request && q.bth.psn == r.bth.psn);
        assert!(resent, "{}: no go-back-N to {}", f.name(), r.bth.psn);
    }
    // UD: Q_Key 0x11111111; RDMA-CM on QP1: Q_Key 0x80010000, src QP 1, PSN 0.
    for (_, r) in pkts("ud_send.pcap") {
        assert_eq!(r.deth.unwrap().qkey, 0x1111_1111);
    }
    let cm = pkts("rping_cm.pcap");
    let (_, first) = &cm[0];
    assert_eq!(first.bth.dest_qpn, 1);
    assert_eq!(first.deth.unwrap().qkey, 0x8001_0000);
    assert_eq!(first.deth.unwrap().src_qpn, 1);
    // WRITE First carries the whole DMA length (5000 B).
    let w = pkts("write_bw.pcap");
    assert!(w.iter().any(|(_, r)| r.reth.map(|x| x.dma_len) == Some(5000)));
    // Multi-packet SEND: 4 × 1024 + 904.
    let lens: Vec<usize> = frames_of("rc_send_multi.pcap")
        .iter()
        .map(|f| UdpDatagram::parse(f.ip()).unwrap().roce().unwrap().payload_len())
        .filter(|&n| n > 0)
        .take(5)
        .collect();
    assert_eq!(lens, [1024, 1024, 1024, 1024, 904]);
}

#[test]
fn rxe_wire_conventions() {
    // Per sender: IPv4 DF set, TTL 64, TOS 0, IP ID +1 per packet, UDP
    // checksum 0; P_Key 0xffff.
    for name in capture_names() {
        let mut last_id: std::collections::HashMap<std::net::Ipv4Addr, u16> = Default::default();
        for f in frames_of(&name) {
            let d = UdpDatagram::parse(f.ip()).unwrap();
            assert_eq!(d.udp.checksum(), 0, "{}", f.name());
            assert_eq!(d.roce().unwrap().bth().pkey(), 0xffff);
            if let IpHeader::V4(p) = d.ip {
                assert!(p.dont_frag() && p.ttl() == 64 && p.tos() == 0, "{}", f.name());
                if let Some(prev) = last_id.insert(p.src(), p.ident()) {
                    // Captured on one side: the other side's IDs are all seen,
                    // except where tc dropped some (nak_psn_seq, captured on B).
                    assert!(p.ident().wrapping_sub(prev) >= 1, "{}", f.name());
                }
            }
        }
    }
}

#[test]
fn rxe_udp_source_port_rule() {
    // Connections set up without RDMA-CM: both sides use the same QPN here,
    // and rxe derives the port from the QPN pair. UD and QP1: hash of the
    // sender's QPN (from the DETH).
    let cm_made = ["rping_cm.pcap", "rdma_cm_send_bw.pcap"];
    let mut checked = 0;
    for f in all_frames() {
        let d = UdpDatagram::parse(f.ip()).unwrap();
        let p = d.roce().unwrap();
        let info = p.info();
        let sport = d.udp.src_port();
        if info.transport == Transport::Ud {
            assert_eq!(sport, udp::rxe_ud_sport(p.deth().unwrap().src_qpn()), "{}", f.name());
            checked += 1;
        } else if !cm_made.contains(&f.file.as_str()) {
            let qpn = p.bth().dest_qpn();
            assert_eq!(sport, udp::rxe_connected_sport(0, qpn, qpn), "{}", f.name());
            checked += 1;
        }
    }
    assert!(checked > 250);
}

#[test]
fn unknown_ipv4_ids_are_recovered_from_the_icrc() {
    use uroce_wire::icrc::ipv4_id::IdSolver;
    let mut solved = 0;
    for f in all_frames() {
        let d = UdpDatagram::parse(f.ip()).unwrap();
        let IpHeader::V4(ip) = d.ip else { continue };
        let pkt = d.roce().unwrap();
        // What a UDP socket sees: everything but the ID, which it sets to 0.
        let mut hdr: [u8; 20] = ip.fixed_header().try_into().unwrap();
        hdr[4] = 0;
        hdr[5] = 0;
        let zero = icrc::compute(IcrcIp::V4(&hdr), d.udp_header(), pkt.covered());
        let solver = IdSolver::new(pkt.covered().len());
        assert_eq!(solver.solve(zero ^ pkt.icrc()), Some(ip.ident()), "{}", f.name());
        // A corrupted payload byte almost never yields a solution.
        let mut bad = pkt.covered().to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0x10;
        let zero_bad = icrc::compute(IcrcIp::V4(&hdr), d.udp_header(), &bad);
        if let Some(x) = solver.solve(zero_bad ^ pkt.icrc()) {
            // Possible with probability 2^-16; it must then be a different ID.
            assert_ne!(x, ip.ident());
        }
        solved += 1;
    }
    assert!(solved > 350);
}
