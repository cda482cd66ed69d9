//! A deterministic in-process network for testing uroce: a virtual clock,
//! per-direction seeded faults (loss, duplication, reordering, bit
//! corruption, delay, jitter, bandwidth), IPv4/UDP framing with a real ICRC,
//! and a pcap writer so any run opens in Wireshark. The same seed gives the
//! same run, bit for bit.

#![forbid(unsafe_code)]

pub mod memory;
pub mod net;
pub mod pair;
mod rng;

pub use memory::TestMemory;
pub use net::{LinkConfig, SimNet};
pub use pair::RcPair;
pub use rng::SplitMix64;
