//! Replays the checked-in `cargo fuzz` corpus (seeded from the rxe captures,
//! grown by fuzzing runs) through the same harness the fuzzer runs.

mod common;

use std::path::{Path, PathBuf};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/wire_packet")
}

#[test]
fn replay_wire_packet_corpus() {
    let mut n = 0;
    for e in std::fs::read_dir(corpus_dir()).expect("fuzz corpus directory") {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        uroce_wire::fuzzing::parse_anything(&data);
        n += 1;
    }
    assert!(n >= 100, "corpus has only {n} inputs");
}

/// FNV-1a, to name corpus files by content without a hashing dependency.
fn fnv(data: &[u8]) -> u64 {
    data.iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Regenerates the seed part of the corpus from the rxe captures: for each
/// capture and opcode, the first two frames whole and their UDP payloads.
/// Run with `cargo test -p uroce-wire --test fuzz_corpus -- --ignored`.
#[test]
#[ignore]
fn regenerate_seed_corpus() {
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut seen = std::collections::HashMap::new();
    for f in common::all_frames() {
        let d = uroce_wire::UdpDatagram::parse(f.ip()).unwrap();
        let op = d.roce().unwrap().bth().opcode().0;
        let count = seen.entry((f.file.clone(), op)).or_insert(0);
        *count += 1;
        if *count > 2 {
            continue;
        }
        for input in [&f.bytes[..], d.udp.payload()] {
            std::fs::write(dir.join(format!("seed-{:016x}", fnv(input))), input).unwrap();
        }
    }
}
