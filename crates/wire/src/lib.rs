//! RoCEv2 on the wire: the InfiniBand transport headers, the opcode table,
//! 24-bit PSN arithmetic, the invariant CRC, and the Ethernet/IP/UDP framing
//! that raw backends need. No I/O, no allocation, no `unsafe`.
//!
//! # The view / repr contract
//!
//! Every header comes in two forms, after smoltcp:
//!
//! - a **view** (`Bth<T>`, `Reth<T>`, …, [`RocePacket<T>`]) over any
//!   `T: AsRef<[u8]>`: `new_checked` validates the buffer once (length,
//!   version, opcode, pad), after which every accessor reads straight from
//!   the bytes and cannot fail or panic. Views over `AsMut<[u8]>` also have
//!   setters.
//! - a **repr** (`BthRepr`, `RethRepr`, …, [`RocePacketRepr`]): a plain
//!   struct of the fields, with `parse` from a view and `emit` into a buffer.
//!   Reserved bits are ignored on parse and sent as zero, so that
//!   `emit(parse(bytes)) == bytes` for every packet a conforming sender
//!   (such as Linux rxe) produces.
//!
//! Malformed input is a [`WireError`] value, never a panic.
//!
//! ```
//! use uroce_wire::{Opcode, Psn, RocePacket, RocePacketRepr, BthRepr, RethRepr};
//!
//! // Build an RDMA WRITE ONLY carrying 5 bytes.
//! let repr = RocePacketRepr {
//!     bth: BthRepr {
//!         opcode: Opcode::RC_RDMA_WRITE_ONLY,
//!         pad: BthRepr::pad_for(5),
//!         pkey: 0xffff,
//!         dest_qpn: 0x11,
//!         ack_req: true,
//!         psn: Psn::new(0xabcdef),
//!         ..Default::default()
//!     },
//!     reth: Some(RethRepr { va: 0x1000, rkey: 0x1234, dma_len: 5 }),
//!     ..Default::default()
//! };
//! let mut buf = [0u8; 64];
//! let n = repr.emit(&mut buf, b"hello").unwrap();
//! assert_eq!(n, 12 + 16 + 5 + 3 + 4);
//!
//! let pkt = RocePacket::new_checked(&buf[..n]).unwrap();
//! assert_eq!(pkt.payload(), b"hello");
//! assert_eq!(pkt.reth().unwrap().rkey(), 0x1234);
//! assert_eq!(RocePacketRepr::parse(&pkt), repr);
//! ```
//!
//! # ICRC
//!
//! [`icrc`] computes the RoCEv2 invariant CRC exactly as Linux rxe does; the
//! test suite checks it against every packet captured from rxe in
//! `tests/vectors/rxe/`, over IPv4 and IPv6.

#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod aeth;
pub mod arp;
mod atomic;
mod bth;
pub mod checksum;
pub mod cm;
mod datagram;
mod deth;
mod error;
pub mod eth;
mod field;
pub mod fuzzing;
pub mod icrc;
pub mod ipv4;
pub mod ipv6;
pub mod ndp;
mod opcode;
mod packet;
mod pretty;
mod psn;
mod reth;
mod small;
mod timer;
pub mod udp;
mod view;

pub use aeth::{Aeth, AethRepr, CreditCode, NakCode, Syndrome};
pub use atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
pub use bth::{BTH_TVER, Bth, BthRepr};
pub use datagram::{IpHeader, UdpDatagram};
pub use deth::{Deth, DethRepr};
pub use error::{Result, WireError};
pub use opcode::{Headers, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use packet::{RocePacket, RocePacketRepr};
pub use psn::Psn;
pub use reth::{Reth, RethRepr};
pub use small::{Feth, FethRepr, Ieth, ImmDt, Rdeth, XrcEth};
pub use timer::{LocalAckTimeout, Mtu, RnrTimer};

/// BTH length.
pub const BTH_LEN: usize = 12;
/// RDETH length.
pub const RDETH_LEN: usize = 4;
/// DETH length.
pub const DETH_LEN: usize = 8;
/// XRCETH length.
pub const XRCETH_LEN: usize = 4;
/// FETH length.
pub const FETH_LEN: usize = 4;
/// RETH length.
pub const RETH_LEN: usize = 16;
/// AtomicETH length.
pub const ATOMIC_ETH_LEN: usize = 28;
/// AETH length.
pub const AETH_LEN: usize = 4;
/// AtomicAckETH length.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// ImmDt length.
pub const IMMDT_LEN: usize = 4;
/// IETH length.
pub const IETH_LEN: usize = 4;
/// ICRC length.
pub const ICRC_LEN: usize = 4;
/// The 40-byte GRH that verbs place at the start of every UD receive buffer
/// (IBTA §8.3; for RoCEv2 it carries the IP header, see [`grh`]).
pub const GRH_LEN: usize = 40;

pub mod grh;
