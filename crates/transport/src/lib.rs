//! Sans-IO RoCEv2 transport: the QP state machine and the requester,
//! responder and completer engines.
//!
//! The rules of this crate: it never reads a clock, opens a socket or spawns
//! a thread. Time is passed in as [`Instant`]; every timer is a deadline the
//! caller is told about. The same inputs give the same outputs, bit for bit,
//! which is what makes seeded fault simulation possible.
//!
//! Status: only the time base exists so far; the engines land with issue 3
//! (see the README's status table).

#![forbid(unsafe_code)]

mod time;

pub use time::Instant;
pub use uroce_wire as wire;
