//! Property tests: every header and every opcode round-trips, PSN arithmetic
//! obeys its laws, and no input makes a parser panic.

use core::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use uroce_wire::icrc::{self, IcrcIp};
use uroce_wire::ipv4::{Ipv4Packet, Ipv4Repr};
use uroce_wire::ipv6::{Ipv6Packet, Ipv6Repr};
use uroce_wire::udp::{UdpPacket, UdpRepr};
use uroce_wire::*;

fn bth_strategy(opcode: Opcode) -> impl Strategy<Value = BthRepr> {
    (any::<(bool, bool, u16, bool, bool)>(), 0u32..1 << 24, any::<bool>(), 0u32..1 << 24).prop_map(
        move |((solicited, mig_req, pkey, fecn, becn), dest_qpn, ack_req, psn)| BthRepr {
            opcode,
            solicited,
            mig_req,
            pad: 0,
            pkey,
            fecn,
            becn,
            dest_qpn,
            ack_req,
            psn: Psn::new(psn),
        },
    )
}

/// A repr for `info` with exactly its extension headers, and a payload.
fn packet_strategy(info: &'static OpcodeInfo) -> impl Strategy<Value = (RocePacketRepr, Vec<u8>)> {
    let h = info.headers;
    let payload = if info.operation == Operation::AtomicWrite {
        proptest::collection::vec(any::<u8>(), 8..=8).boxed()
    } else if info.has_payload {
        proptest::collection::vec(any::<u8>(), 0..300).boxed()
    } else {
        Just(Vec::new()).boxed()
    };
    (
        bth_strategy(info.opcode),
        any::<(u32, u32, u32, u32, u32)>(),
        any::<(u64, u32, u32)>(),
        any::<(u64, u32, u64, u64)>(),
        any::<(u8, u32, u64)>(),
        any::<(u8, u8)>(),
        payload,
    )
        .prop_map(
            move |(
                mut bth,
                (eecn, qkey, sqp, xrc, inv),
                reth,
                atomic,
                (syn, msn, orig),
                feth,
                payload,
            )| {
                bth.pad = BthRepr::pad_for(payload.len());
                let pick = |bit: Headers| h.contains(bit);
                let repr = RocePacketRepr {
                    bth,
                    rdeth: pick(Headers::RDETH).then_some(eecn & 0xff_ffff),
                    deth: pick(Headers::DETH)
                        .then_some(DethRepr { qkey, src_qpn: sqp & 0xff_ffff }),
                    xrceth: pick(Headers::XRCETH).then_some(xrc & 0xff_ffff),
                    feth: pick(Headers::FETH)
                        .then_some(FethRepr { selectivity: feth.0 & 3, placement: feth.1 & 0xf }),
                    reth: pick(Headers::RETH).then_some(RethRepr {
                        va: reth.0,
                        rkey: reth.1,
                        dma_len: reth.2,
                    }),
                    atomic_eth: pick(Headers::ATOMIC_ETH).then_some(AtomicEthRepr {
                        va: atomic.0,
                        rkey: atomic.1,
                        swap_add: atomic.2,
                        compare: atomic.3,
                    }),
                    aeth: pick(Headers::AETH).then_some(AethRepr {
                        syndrome: Syndrome::from_byte(syn),
                        msn: msn & 0xff_ffff,
                    }),
                    atomic_ack_eth: pick(Headers::ATOMIC_ACK_ETH)
                        .then_some(AtomicAckEthRepr { orig }),
                    immdt: pick(Headers::IMMDT).then_some(msn),
                    ieth: pick(Headers::IETH).then_some(inv),
                };
                (repr, payload)
            },
        )
}

fn any_opcode_info() -> impl Strategy<Value = &'static OpcodeInfo> {
    let all: Vec<&'static OpcodeInfo> = Opcode::all().collect();
    proptest::sample::select(all)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn every_opcode_round_trips((repr, payload) in any_opcode_info().prop_flat_map(packet_strategy)) {
        let mut buf = vec![0u8; repr.packet_len(payload.len())];
        let n = repr.emit(&mut buf, &payload).unwrap();
        prop_assert_eq!(n, buf.len());
        let p = RocePacket::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(RocePacketRepr::parse(&p), repr);
        prop_assert_eq!(p.payload(), &payload[..]);
        prop_assert_eq!(p.header_len(), repr.bth.opcode.info().unwrap().header_len);
        prop_assert_eq!((p.header_len() + p.payload_len() + p.pad_bytes().len()) % 4, 0);
    }

    #[test]
    fn emit_rejects_wrong_header_sets((mut repr, payload) in any_opcode_info().prop_flat_map(packet_strategy)) {
        // Toggle the RETH: never what the opcode wants.
        repr.reth = if repr.reth.is_some() { None } else { Some(RethRepr::default()) };
        let mut buf = vec![0u8; 512];
        prop_assert_eq!(repr.emit(&mut buf, &payload), Err(WireError::HeaderMismatch));
    }

    #[test]
    fn bth_round_trips(b in any::<[u8; 12]>()) {
        let view = Bth::new_checked(&b[..]).unwrap();
        match BthRepr::parse(&view) {
            Ok(r) => {
                let mut out = [0u8; 12];
                r.emit(&mut Bth::new_unchecked(&mut out[..]));
                // Equal except the reserved bits, which are sent as zero.
                let mut masked = b;
                masked[4] &= 0xc0;
                masked[8] &= 0x80;
                prop_assert_eq!(out, masked);
            }
            Err(e) => prop_assert_eq!(e, WireError::BadVersion),
        }
    }

    #[test]
    fn fixed_headers_round_trip(b in any::<[u8; 28]>()) {
        let r = RethRepr::parse(&Reth::new_checked(&b[..]).unwrap());
        let mut o = [0u8; 16];
        r.emit(&mut Reth::new_unchecked(&mut o[..]));
        prop_assert_eq!(&o[..], &b[..16]);

        let r = AtomicEthRepr::parse(&AtomicEth::new_checked(&b[..]).unwrap());
        let mut o = [0u8; 28];
        r.emit(&mut AtomicEth::new_unchecked(&mut o[..]));
        prop_assert_eq!(&o[..], &b[..]);

        let r = AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&b[..]).unwrap());
        let mut o = [0u8; 8];
        r.emit(&mut AtomicAckEth::new_unchecked(&mut o[..]));
        prop_assert_eq!(&o[..], &b[..8]);

        let r = AethRepr::parse(&Aeth::new_checked(&b[..]).unwrap());
        let mut o = [0u8; 4];
        r.emit(&mut Aeth::new_unchecked(&mut o[..]));
        prop_assert_eq!(&o[..], &b[..4]);

        let r = DethRepr::parse(&Deth::new_checked(&b[..]).unwrap());
        let mut o = [0u8; 8];
        r.emit(&mut Deth::new_unchecked(&mut o[..]));
        let mut want = [0u8; 8];
        want.copy_from_slice(&b[..8]);
        want[4] = 0; // reserved
        prop_assert_eq!(o, want);

        let mut o = [0u8; 4];
        ImmDt::new_unchecked(&mut o[..]).set_imm(ImmDt::new_checked(&b[..]).unwrap().imm());
        prop_assert_eq!(&o[..], &b[..4]);
        Ieth::new_unchecked(&mut o[..]).set_rkey(Ieth::new_checked(&b[..]).unwrap().rkey());
        prop_assert_eq!(&o[..], &b[..4]);
    }

    #[test]
    fn short_headers_are_errors(n in 0usize..28) {
        let b = vec![0u8; n];
        prop_assert_eq!(Bth::new_checked(&b[..]).is_err(), n < 12);
        prop_assert_eq!(Reth::new_checked(&b[..]).is_err(), n < 16);
        prop_assert_eq!(AtomicEth::new_checked(&b[..]).is_err(), n < 28);
        prop_assert_eq!(Deth::new_checked(&b[..]).is_err(), n < 8);
        prop_assert_eq!(Aeth::new_checked(&b[..]).is_err(), n < 4);
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        uroce_wire::fuzzing::parse_anything(&b);
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_bth_never_panic(
        op in any::<u8>(), rest in proptest::collection::vec(any::<u8>(), 0..120), flags in 0u8..0x40,
    ) {
        let mut b = vec![op, flags & 0x30, 0xff, 0xff, 0, 0, 0, 1, 0x80, 0, 0, 1];
        b.extend_from_slice(&rest);
        if let Ok(p) = RocePacket::new_checked(&b[..]) {
            prop_assert!(p.header_len() + p.payload_len() + 4 <= b.len());
        }
        uroce_wire::fuzzing::parse_anything(&b);
    }

    #[test]
    fn psn_laws(a in 0u32..1 << 24, n in 0u32..1 << 24, b in 0u32..1 << 24) {
        let (pa, pb) = (Psn::new(a), Psn::new(b));
        prop_assert_eq!(pa.add(n).distance_from(pa), n);
        prop_assert_eq!(pa.add(n).sub(n), pa);
        prop_assert_eq!(pa.diff(pb) == 0, a == b);
        if pa.diff(pb) != -(1 << 23) {
            prop_assert_eq!(pa.diff(pb), -pb.diff(pa));
        }
        prop_assert_eq!(pa.is_before(pb), pa.diff(pb) < 0);
        prop_assert_eq!(pa.compare(pb), pa.diff(pb).cmp(&0));
        prop_assert!(pa.add(n).in_window(pa, n + 1));
        prop_assert!(!pa.add(n).in_window(pa, n));
        if n > 0 && n < 1 << 23 {
            prop_assert!(pa.is_before(pa.add(n)));
        }
    }

    #[test]
    fn ip_and_udp_round_trip(
        s4 in any::<[u8; 4]>(), d4 in any::<[u8; 4]>(), s6 in any::<[u8; 16]>(), d6 in any::<[u8; 16]>(),
        tos in any::<u8>(), ident in any::<u16>(), df in any::<bool>(), ttl in any::<u8>(),
        flow in 0u32..1 << 20, len in 0usize..9000, sport in any::<u16>(),
    ) {
        let v4 = Ipv4Repr {
            src: Ipv4Addr::from(s4), dst: Ipv4Addr::from(d4), tos, ident, dont_frag: df, ttl,
            protocol: 17, payload_len: len,
        };
        let mut buf = vec![0u8; 20 + len];
        v4.emit(&mut buf).unwrap();
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        prop_assert!(p.checksum_ok());
        prop_assert_eq!(
            (p.src(), p.dst(), p.tos(), p.ident(), p.dont_frag(), p.ttl(), p.payload().len()),
            (v4.src, v4.dst, tos, ident, df, ttl, len)
        );
        let v6 = Ipv6Repr {
            src: Ipv6Addr::from(s6), dst: Ipv6Addr::from(d6), traffic_class: tos, flow_label: flow,
            next_header: 17, hop_limit: ttl, payload_len: len,
        };
        let mut buf = vec![0u8; 40 + len];
        v6.emit(&mut buf).unwrap();
        let p = Ipv6Packet::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(
            (p.src(), p.dst(), p.traffic_class(), p.flow_label(), p.hop_limit(), p.payload().len()),
            (v6.src, v6.dst, tos, flow, ttl, len)
        );
        let u = UdpRepr { src_port: sport, dst_port: 4791, payload_len: len, checksum: 0 };
        let mut buf = vec![0u8; 8 + len];
        u.emit(&mut buf).unwrap();
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        prop_assert_eq!((p.src_port(), p.dst_port(), p.payload().len()), (sport, 4791, len));
    }

    #[test]
    fn icrc_fill_then_verify_and_flip((repr, payload) in any_opcode_info().prop_flat_map(packet_strategy),
                                      flip in any::<usize>(), v6 in any::<bool>()) {
        let mut pkt = vec![0u8; repr.packet_len(payload.len())];
        repr.emit(&mut pkt, &payload).unwrap();
        let udp = UdpRepr { src_port: 0xc000, dst_port: 4791, payload_len: pkt.len(), checksum: 0 }
            .to_bytes().unwrap();
        let ip4 = Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1), dst: Ipv4Addr::new(10, 0, 0, 2), tos: 0, ident: 0,
            dont_frag: true, ttl: 64, protocol: 17, payload_len: 8 + pkt.len(),
        }.to_bytes().unwrap();
        let ip6 = Ipv6Repr {
            src: Ipv6Addr::LOCALHOST, dst: Ipv6Addr::LOCALHOST, traffic_class: 0, flow_label: 0,
            next_header: 17, hop_limit: 64, payload_len: 8 + pkt.len(),
        }.to_bytes().unwrap();
        let ip = if v6 { IcrcIp::V6(&ip6) } else { IcrcIp::V4(&ip4) };
        let mut p = RocePacket::new_checked(&mut pkt[..]).unwrap();
        icrc::fill(ip, &udp, &mut p);
        prop_assert!(icrc::verify(ip, &udp, &p).is_ok());
        // Flip one covered bit (anything but BTH byte 4).
        let bit = flip % (pkt.len() * 8);
        if bit / 8 != 4 {
            pkt[bit / 8] ^= 1 << (bit % 8);
            let c = icrc::compute(ip, &udp, &pkt[..pkt.len() - 4]);
            let wire = u32::from_le_bytes(pkt[pkt.len() - 4..].try_into().unwrap());
            prop_assert_ne!(c, wire);
        }
    }
}
