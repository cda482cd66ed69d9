//! The wire layer's error type.

use core::fmt;

/// Why a buffer is not a well-formed packet (or cannot hold one).
///
/// A small `Copy` enum so that every drop in the transport can be counted by
/// reason without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is shorter than the headers it must hold, or than a length
    /// field inside it claims.
    Truncated,
    /// A version field is not the one this layer speaks (BTH TVer ≠ 0, IP
    /// version ≠ 4/6).
    BadVersion,
    /// The BTH opcode is reserved or belongs to no transport this table knows.
    ReservedOpcode,
    /// The BTH pad count does not fit the packet (pad longer than the payload
    /// area, or a pad on a packet that carries no payload).
    BadPad,
    /// The invariant CRC does not match the packet.
    IcrcMismatch,
    /// A length field disagrees with the buffer or with another length field.
    BadLength,
    /// The IPv4 header checksum is wrong.
    BadChecksum,
    /// The frame is not IPv4/IPv6 (EtherType or link type not handled).
    UnsupportedProtocol,
    /// The IP packet is a fragment; RoCEv2 packets are never fragmented.
    Fragmented,
    /// The extension headers given to an emitter are not the set the opcode
    /// requires.
    HeaderMismatch,
    /// The output buffer is too small for what is to be emitted.
    BufferTooSmall,
}

impl WireError {
    /// A short, stable, lower-case name (for counters and logs).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Truncated => "truncated",
            Self::BadVersion => "bad_version",
            Self::ReservedOpcode => "reserved_opcode",
            Self::BadPad => "bad_pad",
            Self::IcrcMismatch => "icrc_mismatch",
            Self::BadLength => "bad_length",
            Self::BadChecksum => "bad_checksum",
            Self::UnsupportedProtocol => "unsupported_protocol",
            Self::Fragmented => "fragmented",
            Self::HeaderMismatch => "header_mismatch",
            Self::BufferTooSmall => "buffer_too_small",
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Truncated => "packet truncated",
            Self::BadVersion => "unsupported header version",
            Self::ReservedOpcode => "reserved or unknown BTH opcode",
            Self::BadPad => "BTH pad count does not fit the packet",
            Self::IcrcMismatch => "invariant CRC mismatch",
            Self::BadLength => "inconsistent length field",
            Self::BadChecksum => "bad IPv4 header checksum",
            Self::UnsupportedProtocol => "not an IPv4/IPv6 frame",
            Self::Fragmented => "IP fragment",
            Self::HeaderMismatch => "extension headers do not match the opcode",
            Self::BufferTooSmall => "output buffer too small",
        };
        f.write_str(s)
    }
}

impl core::error::Error for WireError {}

/// The wire layer's result type.
pub type Result<T> = core::result::Result<T, WireError>;
