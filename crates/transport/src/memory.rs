//! How the transport reaches registered memory: a trait the verbs layer
//! implements over real registrations (raw pointers, the only `unsafe` in
//! the data path) and tests implement over plain vectors.
//!
//! Every call names the key, the protection domain of the QP, the address
//! range and the access wanted; the implementation checks all of them before
//! a byte moves (IBTA §10.6.3, C10-…: key valid, same PD, rights, bounds).

use crate::qp::attr::Access;

/// Which key space a key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// A local key, from an SGE of this QP's own work request.
    Local(u32),
    /// A remote key, from a peer's RETH or AtomicETH.
    Remote(u32),
}

/// Why an access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessError {
    /// No valid region has this key (never registered, deregistered, or a
    /// stale key byte).
    InvalidKey,
    /// The region belongs to another protection domain.
    WrongPd,
    /// The region does not grant the access.
    NotPermitted,
    /// The range is not inside the region (or overflows).
    OutOfBounds,
    /// An atomic's address is not 8-byte aligned.
    Misaligned,
}

/// An 8-byte atomic operation on remote memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Compare and swap: if the value equals `compare`, store `swap`.
    CompareSwap {
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// Fetch and add.
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

/// Registered memory as the transport sees it. Implementations must be
/// atomic, per address, for [`Memory::atomic`] with respect to other
/// atomics (IBTA §9.4.5: atomics on one address are serialised).
pub trait Memory {
    /// Checks that `[addr, addr+len)` is inside the region of `key`, in `pd`,
    /// with `access` granted (local reads need no right).
    ///
    /// # Errors
    /// The reason it is not.
    fn check(
        &self,
        key: Key,
        pd: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), AccessError>;

    /// Copies `out.len()` bytes from `addr` (checked as by [`Memory::check`]).
    ///
    /// # Errors
    /// The reason the access is refused; nothing is copied then.
    fn read(&self, key: Key, pd: u32, addr: u64, out: &mut [u8]) -> Result<(), AccessError>;

    /// Copies `data` to `addr` (checked, with write rights: `LOCAL_WRITE`
    /// for local keys, `REMOTE_WRITE` for remote keys).
    ///
    /// # Errors
    /// The reason the access is refused; nothing is written then.
    fn write(&self, key: Key, pd: u32, addr: u64, data: &[u8]) -> Result<(), AccessError>;

    /// Performs an 8-byte atomic at `addr` (remote key, `REMOTE_ATOMIC`,
    /// 8-byte aligned) and returns the original value. The value is in the
    /// host's byte order, as verbs atomics operate on native `u64`s.
    ///
    /// # Errors
    /// The reason the access is refused.
    fn atomic(&self, rkey: u32, pd: u32, addr: u64, op: AtomicOp) -> Result<u64, AccessError>;
}
