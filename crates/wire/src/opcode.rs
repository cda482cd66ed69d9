//! The BTH opcode table (IBTA Vol 1 §9.2.1, Table 38; RoCEv2 Annex A17 for CNP;
//! IBA 1.5 for FLUSH and ATOMIC WRITE).
//!
//! An opcode is 3 bits of transport and 5 bits of operation. The operation
//! codes are shared by RC, UC, RD and XRC (each allows a subset); UD has only
//! SEND ONLY (with and without immediate); CNP has one opcode. Everything else
//! is reserved, and [`Opcode::info`] returns `None` for it.

use core::fmt;

use crate::{AETH_LEN, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN, BTH_LEN, DETH_LEN, IETH_LEN, IMMDT_LEN};
use crate::{FETH_LEN, RDETH_LEN, RETH_LEN, XRCETH_LEN};

/// A BTH opcode byte. Any value can be held; [`Opcode::info`] tells whether
/// it is defined.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($($name:ident = $val:expr;)*) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Self = Self($val);
            )*
        }
    };
}

opcodes! {
    RC_SEND_FIRST = 0x00;
    RC_SEND_MIDDLE = 0x01;
    RC_SEND_LAST = 0x02;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03;
    RC_SEND_ONLY = 0x04;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05;
    RC_RDMA_WRITE_FIRST = 0x06;
    RC_RDMA_WRITE_MIDDLE = 0x07;
    RC_RDMA_WRITE_LAST = 0x08;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09;
    RC_RDMA_WRITE_ONLY = 0x0a;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b;
    RC_RDMA_READ_REQUEST = 0x0c;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e;
    RC_RDMA_READ_RESPONSE_LAST = 0x0f;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10;
    RC_ACKNOWLEDGE = 0x11;
    RC_ATOMIC_ACKNOWLEDGE = 0x12;
    RC_COMPARE_SWAP = 0x13;
    RC_FETCH_ADD = 0x14;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17;
    RC_FLUSH = 0x1c;
    RC_ATOMIC_WRITE = 0x1d;
    UC_SEND_FIRST = 0x20;
    UC_SEND_MIDDLE = 0x21;
    UC_SEND_LAST = 0x22;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23;
    UC_SEND_ONLY = 0x24;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25;
    UC_RDMA_WRITE_FIRST = 0x26;
    UC_RDMA_WRITE_MIDDLE = 0x27;
    UC_RDMA_WRITE_LAST = 0x28;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29;
    UC_RDMA_WRITE_ONLY = 0x2a;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b;
    RD_RESYNC = 0x55;
    UD_SEND_ONLY = 0x64;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65;
    CNP = 0x81;
}

/// The transport service an opcode belongs to (its top three bits).
/// Variants in the spec's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (`000`).
    Rc,
    /// Unreliable Connected (`001`).
    Uc,
    /// Reliable Datagram (`010`); decoded, never spoken by uroce.
    Rd,
    /// Unreliable Datagram (`011`).
    Ud,
    /// Congestion Notification Packet (`100`, RoCEv2).
    Cnp,
    /// Extended Reliable Connected (`101`).
    Xrc,
}

impl Transport {
    /// The spec's abbreviation: `RC`, `UC`, `RD`, `UD`, `CNP`, `XRC`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Rc => "RC",
            Self::Uc => "UC",
            Self::Rd => "RD",
            Self::Ud => "UD",
            Self::Cnp => "CNP",
            Self::Xrc => "XRC",
        }
    }
}

/// What a packet does, independent of transport and position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (consumes a receive WQE).
    Send,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// ACKNOWLEDGE (ACK or NAK, by the AETH syndrome).
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAcknowledge,
    /// CmpSwap.
    CompareSwap,
    /// FetchAdd.
    FetchAdd,
    /// RD RESYNC.
    Resync,
    /// FLUSH (IBA 1.5).
    Flush,
    /// ATOMIC WRITE (IBA 1.5).
    AtomicWrite,
    /// Congestion notification.
    CongestionNotification,
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet (also every non-data packet).
    Only,
}

/// A set of extension headers, in wire order (IBTA §9.2, Figure 36 and the
/// per-opcode header lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Headers(u16);

impl Headers {
    /// No extension header.
    pub const NONE: Self = Self(0);
    /// Reliable Datagram ETH (4 B).
    pub const RDETH: Self = Self(1 << 0);
    /// Datagram ETH (8 B).
    pub const DETH: Self = Self(1 << 1);
    /// XRC ETH (4 B).
    pub const XRCETH: Self = Self(1 << 2);
    /// FLUSH ETH (4 B).
    pub const FETH: Self = Self(1 << 3);
    /// RDMA ETH (16 B).
    pub const RETH: Self = Self(1 << 4);
    /// Atomic ETH (28 B).
    pub const ATOMIC_ETH: Self = Self(1 << 5);
    /// ACK ETH (4 B).
    pub const AETH: Self = Self(1 << 6);
    /// Atomic ACK ETH (8 B).
    pub const ATOMIC_ACK_ETH: Self = Self(1 << 7);
    /// Immediate data (4 B).
    pub const IMMDT: Self = Self(1 << 8);
    /// Invalidate ETH (4 B).
    pub const IETH: Self = Self(1 << 9);

    /// Every header, in wire order, with its length.
    pub const ORDER: [(Self, usize); 10] = [
        (Self::RDETH, RDETH_LEN),
        (Self::DETH, DETH_LEN),
        (Self::XRCETH, XRCETH_LEN),
        (Self::FETH, FETH_LEN),
        (Self::RETH, RETH_LEN),
        (Self::ATOMIC_ETH, ATOMIC_ETH_LEN),
        (Self::AETH, AETH_LEN),
        (Self::ATOMIC_ACK_ETH, ATOMIC_ACK_ETH_LEN),
        (Self::IMMDT, IMMDT_LEN),
        (Self::IETH, IETH_LEN),
    ];

    /// The union of two sets.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether every header of `other` is in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits (stable only within one build).
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// Total length of the headers in the set.
    pub const fn len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.contains(Self::ORDER[i].0) {
                n += Self::ORDER[i].1;
            }
            i += 1;
        }
        n
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Offset of `header` from the start of the BTH, if it is in the set.
    pub const fn offset_of(self, header: Self) -> Option<usize> {
        if !self.contains(header) || header.0.count_ones() != 1 {
            return None;
        }
        let mut off = BTH_LEN;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if Self::ORDER[i].0.0 == header.0 {
                return Some(off);
            }
            if self.contains(Self::ORDER[i].0) {
                off += Self::ORDER[i].1;
            }
            i += 1;
        }
        None
    }
}

impl core::ops::BitOr for Headers {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

/// Everything the table knows about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode itself.
    pub opcode: Opcode,
    /// Transport service.
    pub transport: Transport,
    /// What the packet does.
    pub operation: Operation,
    /// Position in its message.
    pub position: Position,
    /// The operation's spec name without the transport, e.g. `SEND_FIRST`.
    pub name: &'static str,
    /// Extension headers that follow the BTH, in wire order.
    pub headers: Headers,
    /// BTH plus extension headers, in bytes.
    pub header_len: usize,
    /// Whether a payload may follow the headers.
    pub has_payload: bool,
    /// Sent by a requester (as opposed to a responder's ACK or READ response).
    pub is_request: bool,
}

impl OpcodeInfo {
    /// Carries immediate data.
    pub const fn has_immediate(&self) -> bool {
        self.headers.contains(Headers::IMMDT)
    }

    /// Carries an invalidate R_Key.
    pub const fn has_invalidate(&self) -> bool {
        self.headers.contains(Headers::IETH)
    }

    /// Carries an AETH (ACK, NAK, READ response first/last/only, atomic ACK).
    pub const fn has_aeth(&self) -> bool {
        self.headers.contains(Headers::AETH)
    }

    /// First or only packet of a message.
    pub const fn starts_message(&self) -> bool {
        matches!(self.position, Position::First | Position::Only)
    }

    /// Last or only packet of a message.
    pub const fn ends_message(&self) -> bool {
        matches!(self.position, Position::Last | Position::Only)
    }
}

/// One row of the per-operation part of the table: everything but the
/// transport-specific headers.
struct OpRow {
    name: &'static str,
    operation: Operation,
    position: Position,
    headers: Headers,
    has_payload: bool,
    is_request: bool,
}

const fn row(
    name: &'static str,
    operation: Operation,
    position: Position,
    headers: Headers,
    has_payload: bool,
    is_request: bool,
) -> Option<OpRow> {
    Some(OpRow { name, operation, position, headers, has_payload, is_request })
}

/// The 5-bit operation codes shared by the connected and RD transports.
const fn op_row(low: u8) -> Option<OpRow> {
    use Operation as O;
    use Position as P;
    const H0: Headers = Headers::NONE;
    const IMM: Headers = Headers::IMMDT;
    const RETH: Headers = Headers::RETH;
    const AETH: Headers = Headers::AETH;
    match low {
        0x00 => row("SEND_FIRST", O::Send, P::First, H0, true, true),
        0x01 => row("SEND_MIDDLE", O::Send, P::Middle, H0, true, true),
        0x02 => row("SEND_LAST", O::Send, P::Last, H0, true, true),
        0x03 => row("SEND_LAST_WITH_IMMEDIATE", O::Send, P::Last, IMM, true, true),
        0x04 => row("SEND_ONLY", O::Send, P::Only, H0, true, true),
        0x05 => row("SEND_ONLY_WITH_IMMEDIATE", O::Send, P::Only, IMM, true, true),
        0x06 => row("RDMA_WRITE_FIRST", O::RdmaWrite, P::First, RETH, true, true),
        0x07 => row("RDMA_WRITE_MIDDLE", O::RdmaWrite, P::Middle, H0, true, true),
        0x08 => row("RDMA_WRITE_LAST", O::RdmaWrite, P::Last, H0, true, true),
        0x09 => row("RDMA_WRITE_LAST_WITH_IMMEDIATE", O::RdmaWrite, P::Last, IMM, true, true),
        0x0a => row("RDMA_WRITE_ONLY", O::RdmaWrite, P::Only, RETH, true, true),
        0x0b => row(
            "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            O::RdmaWrite,
            P::Only,
            RETH.union(IMM),
            true,
            true,
        ),
        0x0c => row("RDMA_READ_REQUEST", O::RdmaReadRequest, P::Only, RETH, false, true),
        0x0d => row("RDMA_READ_RESPONSE_FIRST", O::RdmaReadResponse, P::First, AETH, true, false),
        0x0e => row("RDMA_READ_RESPONSE_MIDDLE", O::RdmaReadResponse, P::Middle, H0, true, false),
        0x0f => row("RDMA_READ_RESPONSE_LAST", O::RdmaReadResponse, P::Last, AETH, true, false),
        0x10 => row("RDMA_READ_RESPONSE_ONLY", O::RdmaReadResponse, P::Only, AETH, true, false),
        0x11 => row("ACKNOWLEDGE", O::Acknowledge, P::Only, AETH, false, false),
        0x12 => row(
            "ATOMIC_ACKNOWLEDGE",
            O::AtomicAcknowledge,
            P::Only,
            AETH.union(Headers::ATOMIC_ACK_ETH),
            false,
            false,
        ),
        0x13 => row("COMPARE_SWAP", O::CompareSwap, P::Only, Headers::ATOMIC_ETH, false, true),
        0x14 => row("FETCH_ADD", O::FetchAdd, P::Only, Headers::ATOMIC_ETH, false, true),
        0x15 => row("RESYNC", O::Resync, P::Only, H0, false, true),
        0x16 => row("SEND_LAST_WITH_INVALIDATE", O::Send, P::Last, Headers::IETH, true, true),
        0x17 => row("SEND_ONLY_WITH_INVALIDATE", O::Send, P::Only, Headers::IETH, true, true),
        0x1c => row("FLUSH", O::Flush, P::Only, Headers::FETH.union(RETH), false, true),
        0x1d => row("ATOMIC_WRITE", O::AtomicWrite, P::Only, RETH, true, true),
        _ => None,
    }
}

const fn build(op: u8) -> Option<OpcodeInfo> {
    let low = op & 0x1f;
    let (transport, allowed) = match op >> 5 {
        // RC: everything but RESYNC (RD only).
        0b000 => (Transport::Rc, low <= 0x14 || matches!(low, 0x16 | 0x17 | 0x1c | 0x1d)),
        // UC: SEND and RDMA WRITE only.
        0b001 => (Transport::Uc, low <= 0x0b),
        // RD: no invalidate, no IBA 1.5 operations.
        0b010 => (Transport::Rd, low <= 0x15),
        // UD: SEND ONLY with and without immediate.
        0b011 => (Transport::Ud, matches!(low, 0x04 | 0x05)),
        0b100 => {
            if low == 0x01 {
                return Some(OpcodeInfo {
                    opcode: Opcode(op),
                    transport: Transport::Cnp,
                    operation: Operation::CongestionNotification,
                    position: Position::Only,
                    name: "CNP",
                    headers: Headers::NONE,
                    header_len: BTH_LEN,
                    // 16 reserved bytes follow the BTH (RoCEv2 Annex A17.9).
                    has_payload: true,
                    is_request: false,
                });
            }
            return None;
        }
        0b101 => (Transport::Xrc, low <= 0x14 || matches!(low, 0x16 | 0x17)),
        _ => return None,
    };
    if !allowed {
        return None;
    }
    let r = match op_row(low) {
        Some(r) => r,
        None => return None,
    };
    let headers = match transport {
        // RD: every packet carries the RDETH; requests also a DETH.
        Transport::Rd if r.is_request => Headers::RDETH.union(Headers::DETH).union(r.headers),
        Transport::Rd => Headers::RDETH.union(r.headers),
        Transport::Ud => Headers::DETH.union(r.headers),
        // XRC: requests name the target SRQ in an XRCETH.
        Transport::Xrc if r.is_request => Headers::XRCETH.union(r.headers),
        _ => r.headers,
    };
    Some(OpcodeInfo {
        opcode: Opcode(op),
        transport,
        operation: r.operation,
        position: r.position,
        name: r.name,
        headers,
        header_len: BTH_LEN + headers.len(),
        has_payload: r.has_payload,
        is_request: r.is_request,
    })
}

static TABLE: [Option<OpcodeInfo>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = build(i as u8);
        i += 1;
    }
    t
};

impl Opcode {
    /// The table row for this opcode, or `None` if it is reserved.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    /// Iterate over every defined opcode's row.
    pub fn all() -> impl Iterator<Item = &'static OpcodeInfo> {
        TABLE.iter().flatten()
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opcode({:#04x} {})", self.0, self)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) if i.transport == Transport::Cnp => f.write_str("CNP"),
            Some(i) => write!(f, "{} {}", i.transport.name(), i.name),
            None => write!(f, "reserved({:#04x})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_size_per_transport() {
        let count = |t| Opcode::all().filter(|i| i.transport == t).count();
        assert_eq!(count(Transport::Rc), 25);
        assert_eq!(count(Transport::Uc), 12);
        assert_eq!(count(Transport::Rd), 22);
        assert_eq!(count(Transport::Ud), 2);
        assert_eq!(count(Transport::Cnp), 1);
        assert_eq!(count(Transport::Xrc), 23);
    }

    #[test]
    fn header_lengths_match_spec() {
        // IBTA Table 38 and rxe_opcode.c lengths (BTH included).
        let len = |o: Opcode| o.info().unwrap().header_len;
        assert_eq!(len(Opcode::RC_SEND_FIRST), 12);
        assert_eq!(len(Opcode::RC_RDMA_WRITE_FIRST), 28);
        assert_eq!(len(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE), 32);
        assert_eq!(len(Opcode::RC_RDMA_READ_RESPONSE_FIRST), 16);
        assert_eq!(len(Opcode::RC_ATOMIC_ACKNOWLEDGE), 24);
        assert_eq!(len(Opcode::RC_COMPARE_SWAP), 40);
        assert_eq!(len(Opcode::RC_FLUSH), 32);
        assert_eq!(len(Opcode::UD_SEND_ONLY), 20);
        assert_eq!(len(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE), 24);
        assert_eq!(len(Opcode(0x4c)), 12 + 4 + 8 + 16); // RD READ request
        assert_eq!(len(Opcode(0xac)), 12 + 4 + 16); // XRC READ request
        assert_eq!(len(Opcode(0xad)), 16); // XRC READ response: no XRCETH
    }

    #[test]
    fn reserved_opcodes() {
        for op in
            [0x15u8, 0x18, 0x1a, 0x1f, 0x2c, 0x36, 0x56, 0x60, 0x66, 0x80, 0x82, 0xb5, 0xc0, 0xff]
        {
            assert!(Opcode(op).info().is_none(), "{op:#x}");
        }
    }

    #[test]
    fn offsets() {
        let h = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap().headers;
        assert_eq!(h.offset_of(Headers::AETH), Some(12));
        assert_eq!(h.offset_of(Headers::ATOMIC_ACK_ETH), Some(16));
        assert_eq!(h.offset_of(Headers::RETH), None);
        let h = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap().headers;
        assert_eq!(h.offset_of(Headers::IMMDT), Some(28));
    }
}
