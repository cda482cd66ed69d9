//! The Internet checksum (RFC 1071), for IPv4 headers and UDP.

/// One's-complement sum of 16-bit big-endian words, folded to 16 bits
/// (not inverted). An odd trailing byte is padded with zero.
pub fn sum(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

/// Folds a 32-bit accumulator and inverts it into a checksum field value.
pub fn finish(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// The checksum of `data` (a header whose checksum field is zero, or one
/// that verifies to 0 when the field is included).
pub fn checksum(data: &[u8]) -> u16 {
    finish(sum(data, 0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3 example bytes: sum 0xddf2, checksum !0xddf2.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(super::checksum(&d), !0xddf2);
    }
}
