//! Loading the rxe capture vectors.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

/// Directory of the vendored rxe captures.
pub fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/rxe")
}

/// One frame of a capture.
pub struct Frame {
    pub file: String,
    pub index: usize,
    pub ts_ns: u64,
    pub bytes: Vec<u8>,
    pub link_type: u32,
}

impl Frame {
    /// The IP packet inside the frame.
    pub fn ip(&self) -> &[u8] {
        uroce_pcap::network_layer(self.link_type, &self.bytes).expect("IP frame")
    }
    /// Offset of the IP header within the frame.
    pub fn ip_offset(&self) -> usize {
        self.bytes.len() - self.ip().len()
    }
    pub fn name(&self) -> String {
        format!("{}#{}", self.file, self.index + 1)
    }
}

/// Every `.pcap` file name in the vectors directory, sorted.
pub fn capture_names() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(vectors_dir())
        .expect("vectors dir")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    v.sort();
    v
}

/// Every frame of one capture.
pub fn frames_of(name: &str) -> Vec<Frame> {
    let data = std::fs::read(vectors_dir().join(name)).expect("read capture");
    uroce_pcap::Reader::new(&data)
        .expect("pcap header")
        .enumerate()
        .map(|(index, r)| {
            let r = r.expect("pcap record");
            Frame {
                file: name.to_string(),
                index,
                ts_ns: r.ts_ns,
                bytes: r.data.to_vec(),
                link_type: r.link_type,
            }
        })
        .collect()
}

/// Every frame of every capture.
pub fn all_frames() -> Vec<Frame> {
    capture_names().iter().flat_map(|n| frames_of(n)).collect()
}
