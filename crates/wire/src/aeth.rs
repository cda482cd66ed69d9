//! ACK Extended Transport Header (IBTA §9.3.8 / §9.7.5.1.4, 4 bytes):
//! an 8-bit syndrome and a 24-bit message sequence number.
//!
//! Syndrome bits 7:5 select ACK (`000`), RNR NAK (`001`) or NAK (`011`);
//! bits 4:0 then carry a credit code, an RNR timer or a NAK code.

use core::fmt;

use crate::field::{be24, set_be24};
use crate::timer::RnrTimer;
use crate::view::header_view;

header_view!(
    /// A view over an AETH.
    Aeth,
    4
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// The raw syndrome byte.
    pub fn syndrome_byte(&self) -> u8 {
        self.raw()[0]
    }
    /// The decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(self.raw()[0])
    }
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        be24(self.raw(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.raw_mut()[0] = s.to_byte();
    }
    /// Sets the MSN (low 24 bits).
    pub fn set_msn(&mut self, msn: u32) {
        set_be24(self.raw_mut(), 1, msn & 0xff_ffff);
    }
}

/// AETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number.
    pub msn: u32,
}

impl AethRepr {
    /// Reads an AETH.
    pub fn parse<T: AsRef<[u8]>>(h: &Aeth<T>) -> Self {
        Self { syndrome: h.syndrome(), msn: h.msn() }
    }
    /// Writes an AETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Aeth<T>) {
        h.set_syndrome(self.syndrome);
        h.set_msn(self.msn);
    }
}

/// End-to-end credit count of an ACK (IBTA §9.7.7.2.4, Table 46): a 5-bit
/// logarithmic code. Code 31 means "invalid": the responder does not do
/// end-to-end flow control, which is what rxe always sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CreditCode(u8);

impl CreditCode {
    /// "No credit information" (code 31).
    pub const INVALID: Self = Self(31);

    const TABLE: [u16; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];

    /// A code from its 5-bit value.
    pub const fn from_code(code: u8) -> Self {
        Self(code & 0x1f)
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The number of receive WQEs the code stands for, or `None` for code 31.
    pub const fn credits(self) -> Option<u16> {
        if self.0 == 31 { None } else { Some(Self::TABLE[self.0 as usize]) }
    }

    /// The largest code whose credit count does not exceed `n`.
    pub const fn for_credits(n: u32) -> Self {
        let mut code = 0;
        while code < 30 && (Self::TABLE[code + 1] as u32) <= n {
            code += 1;
        }
        Self(code as u8)
    }
}

/// NAK codes (IBTA §9.7.5.2.1 C9-... Table 45). Variants in spec order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: the BTH PSN is the PSN the responder expected.
    PsnSequenceError,
    /// Invalid request.
    InvalidRequest,
    /// Remote access error (R_Key, bounds, access rights).
    RemoteAccessError,
    /// Remote operational error.
    RemoteOperationalError,
    /// Invalid RD request.
    InvalidRdRequest,
    /// A reserved code (5..=31), kept so that decoding is lossless.
    Reserved(u8),
}

impl NakCode {
    /// From the low 5 bits of a NAK syndrome.
    pub const fn from_code(code: u8) -> Self {
        match code & 0x1f {
            0 => Self::PsnSequenceError,
            1 => Self::InvalidRequest,
            2 => Self::RemoteAccessError,
            3 => Self::RemoteOperationalError,
            4 => Self::InvalidRdRequest,
            c => Self::Reserved(c),
        }
    }
    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        match self {
            Self::PsnSequenceError => 0,
            Self::InvalidRequest => 1,
            Self::RemoteAccessError => 2,
            Self::RemoteOperationalError => 3,
            Self::InvalidRdRequest => 4,
            Self::Reserved(c) => c & 0x1f,
        }
    }
    /// Short name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::PsnSequenceError => "psn-seq-err",
            Self::InvalidRequest => "inv-req",
            Self::RemoteAccessError => "rem-access-err",
            Self::RemoteOperationalError => "rem-op-err",
            Self::InvalidRdRequest => "inv-rd-req",
            Self::Reserved(_) => "reserved",
        }
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement, with end-to-end credits.
    Ack(CreditCode),
    /// Receiver not ready: retry after the timer.
    RnrNak(RnrTimer),
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Syndrome type `010`, `1xx`: reserved; the raw byte is kept.
    Reserved(u8),
}

impl Syndrome {
    /// An ACK without credit information (syndrome 0x1f), as rxe sends.
    pub const ACK: Self = Self::Ack(CreditCode::INVALID);

    /// Decodes a syndrome byte. Total: every byte maps to some value, and
    /// [`Syndrome::to_byte`] gives it back.
    pub const fn from_byte(b: u8) -> Self {
        match b >> 5 {
            0b000 => Self::Ack(CreditCode::from_code(b)),
            0b001 => Self::RnrNak(RnrTimer::from_code(b)),
            0b011 => Self::Nak(NakCode::from_code(b)),
            _ => Self::Reserved(b),
        }
    }

    /// Encodes the syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            Self::Ack(c) => c.code(),
            Self::RnrNak(t) => 0x20 | t.code(),
            Self::Nak(n) => 0x60 | n.code(),
            Self::Reserved(b) => b,
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ack(c) => match c.credits() {
                Some(n) => write!(f, "ACK credits {n}"),
                None => f.write_str("ACK"),
            },
            Self::RnrNak(t) => {
                let us = t.duration().as_micros();
                write!(f, "RNR-NAK timer {} ({}.{:02} ms)", t.code(), us / 1000, (us % 1000) / 10)
            }
            Self::Nak(n) => write!(f, "NAK {}", n.name()),
            Self::Reserved(b) => write!(f, "reserved-syndrome {b:#04x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_round_trip_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
    }

    #[test]
    fn rxe_values() {
        // From the pcaps: 0x1f = ACK without credits, 0x38 = RNR timer 24,
        // 0x60 = NAK PSN sequence error.
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::ACK);
        assert_eq!(Syndrome::from_byte(0x38), Syndrome::RnrNak(RnrTimer::from_code(24)));
        assert_eq!(Syndrome::from_byte(0x60), Syndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(Syndrome::from_byte(0x62), Syndrome::Nak(NakCode::RemoteAccessError));
    }

    #[test]
    fn credits() {
        assert_eq!(CreditCode::from_code(0).credits(), Some(0));
        assert_eq!(CreditCode::from_code(5).credits(), Some(6));
        assert_eq!(CreditCode::from_code(30).credits(), Some(32768));
        assert_eq!(CreditCode::INVALID.credits(), None);
        assert_eq!(CreditCode::for_credits(7).code(), 5);
        assert_eq!(CreditCode::for_credits(100_000).code(), 30);
        for c in 0..31 {
            let n = CreditCode::from_code(c).credits().unwrap();
            assert_eq!(CreditCode::for_credits(u32::from(n)).code(), c);
        }
    }
}
