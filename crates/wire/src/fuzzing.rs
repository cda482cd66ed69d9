//! The whole-packet parsing harness shared by the `cargo fuzz` target and the
//! corpus replay test, so that what the fuzzer explores is exactly what the
//! test suite re-checks.
//!
//! [`parse_anything`] reads its input as an Ethernet frame, an IP packet, a
//! bare RoCEv2 packet and a GRH area, touches every accessor, and asserts the
//! invariants the wire layer promises: no panic, and `parse ∘ emit ∘ parse`
//! equal to `parse` for every packet that parses.

use crate::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, EthernetFrame};
use crate::{GRH_LEN, RocePacket, RocePacketRepr, UdpDatagram, grh, icrc};

/// Parses `data` every way the wire layer can. Panics only if an invariant
/// is broken (which is what the fuzzer looks for).
pub fn parse_anything(data: &[u8]) {
    if let Ok(f) = EthernetFrame::new_checked(data) {
        let _ = (f.dst(), f.src(), f.vlan_tci(), f.header_len());
        if matches!(f.ethertype(), ETHERTYPE_IPV4 | ETHERTYPE_IPV6) {
            ip_packet(f.payload());
        }
    }
    ip_packet(data);
    if let Ok(p) = RocePacket::new_checked(data) {
        roce_packet(&p);
    }
    if let Some(g) = data.first_chunk::<GRH_LEN>() {
        let _ = grh::GrhInfo::parse(g);
    }
}

fn ip_packet(data: &[u8]) {
    let Ok(d) = UdpDatagram::parse(data) else { return };
    let _ = (d.ip.src(), d.ip.dst(), d.udp.src_port(), d.udp.dst_port(), d.udp.checksum());
    if let Ok(p) = d.roce() {
        roce_packet(&p);
        let ok = d.verify_icrc().is_ok();
        let expected = d.expected_icrc().ok();
        assert_eq!(ok, expected == Some(p.icrc()));
    }
}

fn roce_packet(p: &RocePacket<&[u8]>) {
    let repr = RocePacketRepr::parse(p);
    assert_eq!(repr.header_len(), p.header_len());
    assert_eq!(repr.packet_len(p.payload_len()), p.as_bytes().len());
    let _ = (p.pad_bytes(), p.icrc(), p.bth().fecn(), p.bth().becn());
    if let Some(a) = p.aeth() {
        let s = a.syndrome();
        assert_eq!(s.to_byte(), a.syndrome_byte());
    }
    // Re-emit the headers and parse them again: identical fields.
    let mut buf = [0u8; 256];
    let n = repr.packet_len(p.payload_len());
    if n <= buf.len() {
        let written = repr.emit(&mut buf, p.payload()).expect("emit of a parsed repr");
        assert_eq!(written, n);
        let again = RocePacket::new_checked(&buf[..n]).expect("re-parse of emitted packet");
        assert_eq!(RocePacketRepr::parse(&again), repr);
        assert_eq!(again.payload(), p.payload());
    } else {
        let hl = repr.emit_headers(&mut buf).expect("emit of parsed headers");
        assert_eq!(hl, p.header_len());
    }
    // The CRC helpers accept anything.
    let mut h = icrc::IcrcHasher::new();
    h.bth_and_rest(p.covered());
    let _ = h.finish();
}
