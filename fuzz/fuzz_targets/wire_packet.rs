//! Whole-packet parser: Ethernet, IP, UDP, RoCEv2 and GRH interpretations of
//! arbitrary bytes (see `uroce_wire::fuzzing`). The corpus in
//! `fuzz/corpus/wire_packet` is replayed by `cargo test`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    uroce_wire::fuzzing::parse_anything(data);
});
