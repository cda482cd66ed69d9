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

impl Key {
    /// The right a read (or with `write`, a write) through this key needs:
    /// none for a local read, LOCAL_WRITE, REMOTE_READ or REMOTE_WRITE.
    pub const fn needs(self, write: bool) -> Access {
        match (self, write) {
            (Self::Local(_), false) => Access::NONE,
            (Self::Local(_), true) => Access::LOCAL_WRITE,
            (Self::Remote(_), false) => Access::REMOTE_READ,
            (Self::Remote(_), true) => Access::REMOTE_WRITE,
        }
    }
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
    /// An on-demand region's page is not mapped in the process (or, for a
    /// write, not writable).
    NotMapped,
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
    /// ATOMIC WRITE (IBA 1.5): store 8 bytes at once. Needs the region's
    /// REMOTE_WRITE right, not REMOTE_ATOMIC (as rxe checks it).
    Write {
        /// The value stored.
        value: u64,
    },
}

impl AtomicOp {
    /// The right the region must grant.
    pub const fn needs(self) -> crate::Access {
        match self {
            Self::Write { .. } => crate::Access::REMOTE_WRITE,
            _ => crate::Access::REMOTE_ATOMIC,
        }
    }
}

/// Who asks for an access: the QP's protection domain and number (type 2
/// memory windows are bound to one QP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Accessor {
    /// Protection domain handle.
    pub pd: u32,
    /// QP number.
    pub qpn: u32,
}

/// Memory window types (IBTA §10.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound with `ibv_bind_mw`, usable by any QP of the PD.
    Type1 = 1,
    /// Type 2: bound with a BIND_MW work request, usable only through the
    /// QP that bound it; invalidated by LOCAL_INV or a remote SEND with
    /// invalidate.
    Type2 = 2,
}

/// A memory window bind (`ibv_mw_bind_info` plus the window and its new key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window's current R_Key.
    pub mw_rkey: u32,
    /// The R_Key it gets: same index, a new key byte (`ibv_inc_rkey`).
    pub new_rkey: u32,
    /// The memory region's L_Key.
    pub mr_lkey: u32,
    /// Start of the window.
    pub addr: u64,
    /// Length of the window (0 unbinds a type 1 window).
    pub length: u64,
    /// Remote rights the window grants.
    pub access: Access,
}

/// Registered memory as the transport sees it. Implementations must be
/// atomic, per address, for [`Memory::atomic`] with respect to other
/// atomics (IBTA §9.4.5: atomics on one address are serialised).
pub trait Memory {
    /// Checks that `[addr, addr+len)` is inside the region of `key`, in
    /// `who`'s PD (and, for a type 2 window, bound to `who`'s QP),
    /// with `access` granted (local reads need no right).
    ///
    /// # Errors
    /// The reason it is not.
    fn check(
        &self,
        key: Key,
        who: Accessor,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), AccessError>;

    /// Whether memory region `rkey` (not a window) is alive, in `who`'s
    /// PD and grants `access`, wherever in it: a FLUSH of the whole
    /// region names no range.
    ///
    /// # Errors
    /// The reason it is not.
    fn check_region(&self, rkey: u32, who: Accessor, access: Access) -> Result<(), AccessError>;

    /// Copies `out.len()` bytes from `addr` (checked as by [`Memory::check`]).
    ///
    /// # Errors
    /// The reason the access is refused; nothing is copied then.
    fn read(&self, key: Key, who: Accessor, addr: u64, out: &mut [u8]) -> Result<(), AccessError>;

    /// Copies `data` to `addr` (checked, with write rights: `LOCAL_WRITE`
    /// for local keys, `REMOTE_WRITE` for remote keys).
    ///
    /// # Errors
    /// The reason the access is refused; nothing is written then.
    fn write(&self, key: Key, who: Accessor, addr: u64, data: &[u8]) -> Result<(), AccessError>;

    /// Performs an 8-byte atomic at `addr` (remote key, `REMOTE_ATOMIC`,
    /// 8-byte aligned) and returns the original value. The value is in the
    /// host's byte order, as verbs atomics operate on native `u64`s.
    ///
    /// # Errors
    /// The reason the access is refused.
    fn atomic(&self, rkey: u32, who: Accessor, addr: u64, op: AtomicOp)
    -> Result<u64, AccessError>;

    /// Binds (or, with length 0, unbinds) a memory window over part of a
    /// region (IBTA §10.6.7.2): the window and region in `who`'s PD, the
    /// region granting MW_BIND, the range inside the region, remote write
    /// or atomic rights only over a region with local write. Returns the
    /// window's new R_Key; the old one fails from then on.
    ///
    /// # Errors
    /// The reason the bind is refused.
    fn bind_mw(&self, who: Accessor, bind: &MwBind) -> Result<u32, AccessError> {
        let _ = (who, bind);
        Err(AccessError::NotPermitted)
    }

    /// Invalidates `rkey` (LOCAL_INV, or the IETH of a SEND with
    /// invalidate when `remote`): a type 2 window of `who`'s PD (and, for
    /// remote invalidation, bound to `who`'s QP).
    ///
    /// # Errors
    /// The reason the invalidation is refused.
    fn invalidate(&self, who: Accessor, rkey: u32, remote: bool) -> Result<(), AccessError> {
        let _ = (who, rkey, remote);
        Err(AccessError::NotPermitted)
    }
}
