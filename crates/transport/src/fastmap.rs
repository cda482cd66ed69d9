//! Hash maps for the per-packet lookups (a QP by its number, a CQ by its
//! id, a peer by its address) with a cheap multiplicative hash instead of
//! std's SipHash. SipHash resists keys chosen to collide; here the stored
//! keys are ours (QPNs and ids we allocated, addresses we talk to), and a
//! hostile packet only chooses what it looks up, which costs one probe
//! sequence whatever it names. Measured with `scripts/instructions`:
//! SipHash was a third of the instructions of an 8-byte WRITE.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash's multiplier (the golden ratio in 64 bits, odd).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// The hasher: each word is folded in and multiplied (FxHash's scheme),
/// and `finish` mixes the high half down so that the low bits, which pick
/// the bucket, depend on the whole key.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

/// The map's hasher factory.
pub type FastState = BuildHasherDefault<FastHasher>;

/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, FastState>;

/// A `HashSet` with [`FastHasher`].
pub type FastSet<K> = HashSet<K, FastState>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn sequential_ids_spread_over_the_low_bits() {
        // QPNs are handed out in sequence: their hashes must not pile into
        // a few buckets of a small table.
        let s = FastState::default();
        let mut buckets = [0u32; 64];
        for qpn in 0x11..0x11 + 6400u32 {
            buckets[(s.hash_one(qpn) & 63) as usize] += 1;
        }
        assert!(buckets.iter().all(|&n| (50..=150).contains(&n)), "{buckets:?}");
    }

    #[test]
    fn maps_work_with_every_key_kind_used() {
        let mut m: FastMap<u32, u32> = FastMap::default();
        for i in 0..1000 {
            m.insert(i * 7, i);
        }
        assert!((0..1000).all(|i| m[&(i * 7)] == i));
        let mut a: FastMap<std::net::IpAddr, u8> = FastMap::default();
        a.insert("10.0.0.1".parse().unwrap(), 1);
        a.insert("fe80::1".parse().unwrap(), 2);
        assert_eq!(a[&"fe80::1".parse::<std::net::IpAddr>().unwrap()], 2);
        assert!(!a.contains_key(&"10.0.0.2".parse::<std::net::IpAddr>().unwrap()));
    }
}
