//! UNSAFE ISLAND: registered memory.
//!
//! Registered memory is treated like memory shared with another process:
//! uroce never creates a Rust reference to it. Every access, by the
//! transport (a peer's WRITE, a READ response, a receive) or by the
//! application (through [`crate::Mr::write`] / [`crate::Mr::read`]), is a
//! raw-pointer copy bounded by the registration. A region stays mapped for
//! as long as it is registered: owned buffers are freed only after their
//! keys are gone from the table, and raw registrations carry that duty to
//! the caller (`unsafe fn Pd::register_raw`).
//!
//! Invariants (checked where a `// SAFETY:` comment relies on them):
//! 1. A [`Region`] in the table points to `len` bytes that are valid for
//!    reads and writes until it is removed from the table.
//! 2. The table is only used under the context's lock, so a region
//!    is never removed while a copy into it runs.
//! 3. Every copy is bounds-checked against the region before it happens.
//!
//! On-demand regions (`IBV_ACCESS_ON_DEMAND`) are the exception to 1: their
//! memory need not be mapped, now or ever. Their bytes are moved only by
//! `process_vm_readv`/`process_vm_writev` on this process, which the kernel
//! fails with EFAULT where a page is missing or (writing) read-only, so an
//! access there ends as an access error, never a fault.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use uroce_transport::keys::{KeyTable, Region};
use uroce_transport::{Access, AccessError, Accessor, AtomicOp, Key, Memory, MwBind, MwType};

/// Where a registration's bytes are: process memory, reached only by raw
/// copies (pinned regions) or by the kernel's checked copies (on-demand).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Raw {
    /// The host address of the region's first byte (0 for an implicit
    /// on-demand region, whose IOVAs are host addresses).
    base: *mut u8,
    on_demand: bool,
}

impl Raw {
    /// The host address `off` bytes into the region.
    fn at(self, off: usize) -> *mut u8 {
        self.base.wrapping_add(off)
    }
}

// SAFETY: a `Raw` is plain data describing memory whose lifetime the table
// manages (invariant 1); moving it between threads moves no ownership of
// Rust values.
unsafe impl Send for Raw {}

/// The key table of one context over process memory: the checks are
/// `uroce_transport::keys` (shared with the seeded tests); this module
/// adds the copies.
#[derive(Debug)]
pub(crate) struct MemTable {
    keys: KeyTable<Raw>,
}

impl Default for MemTable {
    /// Key bytes from a random seed: keys are not predictable from one run
    /// (or registration) to the next, as hardware and rxe keys.
    fn default() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x7572_6f63_6500);
        Self { keys: KeyTable::new(h.finish()) }
    }
}

impl MemTable {
    /// Makes the key bytes a function of `seed` (a virtual simulation,
    /// repeatable bit for bit).
    pub(crate) fn seed_keys(&mut self, seed: u64) {
        self.keys.seed_keys(seed);
    }

    /// Adds a registration and returns its key.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads and writes until
    /// [`MemTable::deregister`] removes the key.
    pub(crate) unsafe fn register(
        &mut self,
        ptr: NonNull<u8>,
        len: usize,
        addr: u64,
        pd: u32,
        access: Access,
    ) -> u32 {
        let backing = Raw { base: ptr.as_ptr(), on_demand: false };
        self.keys.register(Region { backing, len, addr, pd, access })
    }

    /// Adds an on-demand registration of `len` bytes at host address
    /// `base` (0 and the whole address space for an implicit one), and
    /// returns its key. Its memory need not be mapped: every copy is
    /// checked by the kernel.
    pub(crate) fn register_on_demand(
        &mut self,
        base: usize,
        len: usize,
        addr: u64,
        pd: u32,
        access: Access,
    ) -> u32 {
        let backing = Raw { base: base as *mut u8, on_demand: true };
        self.keys.register(Region { backing, len, addr, pd, access })
    }

    /// Removes a registration; its key fails from now on.
    pub(crate) fn deregister(&mut self, key: u32) -> bool {
        self.keys.deregister(key).is_some()
    }

    /// Changes registration `key`'s memory range (`range`: host address,
    /// length, IOVA), PD or rights, each kept when `None`; returns its key
    /// from now on, or `None` for an unknown key. A new range replaces the
    /// registration (the old key fails from now on, so no peer holding it
    /// reaches the new memory); a new PD or new rights alone keep the
    /// keys, as rxe and mlx5 do (rdma-core's tests go on using the rkey
    /// they exchanged before `ibv_rereg_mr` changed the rights). An
    /// on-demand region stays on demand.
    ///
    /// # Safety
    /// A new range of a pinned region must stay valid for reads and writes
    /// until its key is removed.
    pub(crate) unsafe fn reregister(
        &mut self,
        key: u32,
        range: Option<(NonNull<u8>, usize, u64)>,
        pd: Option<u32>,
        access: Option<Access>,
    ) -> Option<u32> {
        if range.is_none() {
            let r = self.keys.lookup_mut(key)?;
            r.pd = pd.unwrap_or(r.pd);
            r.access = access.unwrap_or(r.access);
            return Some(key);
        }
        let mut r = self.keys.deregister(key)?;
        if let Some((ptr, len, iova)) = range {
            (r.backing.base, r.len, r.addr) = (ptr.as_ptr(), len, iova);
        }
        r.pd = pd.unwrap_or(r.pd);
        r.access = access.unwrap_or(r.access);
        Some(self.keys.register(r))
    }

    /// Whether `sge` lies in an on-demand region of PD `pd` (what
    /// `ibv_advise_mr` may prefetch).
    pub(crate) fn on_demand_range(&self, pd: u32, sge: &uroce_transport::Sge) -> bool {
        let who = Accessor { pd, qpn: 0 };
        self.keys
            .locate(Key::Local(sge.lkey), who, sge.addr, u64::from(sge.length), Access::NONE)
            .is_ok_and(|(r, _)| r.backing.on_demand)
    }

    /// Registrations alive.
    /// The live registrations: key, IOVA, length, PD (`rdma res show mr`).
    pub(crate) fn listing(&self) -> impl Iterator<Item = (u32, u64, u64, u32)> + '_ {
        self.keys.keyed_regions().map(|(k, r)| (k, r.addr, r.len as u64, r.pd))
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Allocates an unbound memory window; returns its R_Key.
    pub(crate) fn alloc_mw(&mut self, pd: u32, kind: MwType) -> u32 {
        self.keys.alloc_mw(pd, kind)
    }

    /// Frees a window (named by any of its keys).
    pub(crate) fn dealloc_mw(&mut self, rkey: u32) -> bool {
        self.keys.dealloc_mw(rkey)
    }

    /// A window's current R_Key.
    pub(crate) fn mw_rkey(&self, rkey: u32) -> Option<u32> {
        self.keys.mw_rkey(rkey)
    }

    /// Windows alive.
    pub(crate) fn windows_len(&self) -> usize {
        self.keys.windows_len()
    }

    /// Copies into a region for the application (owned buffers), with
    /// bounds checked against the registration.
    pub(crate) fn app_write(&self, key: u32, offset: usize, data: &[u8]) -> bool {
        let Some(r) = self.keys.lookup(key) else { return false };
        if offset.checked_add(data.len()).is_none_or(|e| e > r.len) {
            return false;
        }
        copy_in(r.backing, offset, data).is_ok()
    }

    /// Copies out of a region for the application.
    pub(crate) fn app_read(&self, key: u32, offset: usize, out: &mut [u8]) -> bool {
        let Some(r) = self.keys.lookup(key) else { return false };
        if offset.checked_add(out.len()).is_none_or(|e| e > r.len) {
            return false;
        }
        copy_out(r.backing, offset, out).is_ok()
    }
}

/// Copies `data` into a region at `off` (bounds checked by the caller).
fn copy_in(r: Raw, off: usize, data: &[u8]) -> Result<(), AccessError> {
    if r.on_demand {
        return checked_copy(r.at(off), data.as_ptr().cast_mut(), data.len(), true);
    }
    // SAFETY: a pinned region: invariant 1 and the caller's bounds check
    // (invariant 3); `copy` tolerates overlap, which a caller could produce
    // by registering its own packet buffer.
    unsafe { std::ptr::copy(data.as_ptr(), r.at(off), data.len()) };
    Ok(())
}

/// Copies out of a region from `off` (bounds checked by the caller).
fn copy_out(r: Raw, off: usize, out: &mut [u8]) -> Result<(), AccessError> {
    if r.on_demand {
        return checked_copy(r.at(off), out.as_mut_ptr(), out.len(), false);
    }
    // SAFETY: as in `copy_in`.
    unsafe { std::ptr::copy(r.at(off), out.as_mut_ptr(), out.len()) };
    Ok(())
}

/// Moves `len` bytes between this process's memory at `remote` (which may
/// be unmapped) and the local buffer `local`, through the kernel:
/// `process_vm_writev` into `remote` when `write`, else
/// `process_vm_readv` from it. A missing or (writing) read-only page is
/// [`AccessError::NotMapped`].
fn checked_copy(
    remote: *mut u8,
    local: *mut u8,
    len: usize,
    write: bool,
) -> Result<(), AccessError> {
    if len == 0 {
        return Ok(());
    }
    let l = libc::iovec { iov_base: local.cast(), iov_len: len };
    let r = libc::iovec { iov_base: remote.cast(), iov_len: len };
    // SAFETY: `local` is a live buffer of `len` bytes (the caller's
    // slice); the kernel checks `remote` and fails instead of faulting.
    let n = unsafe {
        if write {
            libc::process_vm_writev(libc::getpid(), &l, 1, &r, 1, 0)
        } else {
            libc::process_vm_readv(libc::getpid(), &l, 1, &r, 1, 0)
        }
    };
    if n == len as isize { Ok(()) } else { Err(AccessError::NotMapped) }
}

impl MemTable {}

/// The memory an `INLINE` WR is gathered from at post time under the C
/// verbs contract: its SGEs are plain process addresses and their L_Keys
/// are not checked (`man ibv_post_send`: "the L_Key will not be checked";
/// UCX posts inline data from unregistered buffers). Every other access
/// goes to the region table unchanged.
pub(crate) struct UncheckedInline<'a>(pub(crate) &'a MemTable);

/// Copies `out.len()` bytes of this process's memory at `addr` (an inline
/// WR's gather entry under the C verbs contract, read without an L_Key).
///
/// # Safety
/// `addr .. addr + out.len()` is readable memory of this process.
pub(crate) unsafe fn copy_from_process(addr: u64, out: &mut [u8]) {
    // SAFETY: the caller's promise; `out` is a distinct, writable buffer.
    unsafe { std::ptr::copy(addr as usize as *const u8, out.as_mut_ptr(), out.len()) };
}

impl Memory for UncheckedInline<'_> {
    fn check(
        &self,
        key: Key,
        who: Accessor,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), AccessError> {
        self.0.check(key, who, addr, len, access)
    }

    fn check_region(&self, rkey: u32, who: Accessor, access: Access) -> Result<(), AccessError> {
        self.0.check_region(rkey, who, access)
    }

    fn read(&self, key: Key, who: Accessor, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        match key {
            Key::Local(_) if !out.is_empty() => {
                // SAFETY: `Qp::post_send_unchecked_inline`'s contract: the
                // gather list of an inline WR names memory readable for the
                // duration of the post; the transport reads only that range.
                unsafe { copy_from_process(addr, out) };
                Ok(())
            }
            Key::Local(_) => Ok(()),
            Key::Remote(_) => self.0.read(key, who, addr, out),
        }
    }

    fn write(&self, key: Key, who: Accessor, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        self.0.write(key, who, addr, data)
    }

    fn atomic(
        &self,
        rkey: u32,
        who: Accessor,
        addr: u64,
        op: AtomicOp,
    ) -> Result<u64, AccessError> {
        self.0.atomic(rkey, who, addr, op)
    }
}

impl Memory for MemTable {
    fn check(
        &self,
        key: Key,
        who: Accessor,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), AccessError> {
        self.keys.locate(key, who, addr, len, access).map(|_| ())
    }

    fn check_region(&self, rkey: u32, who: Accessor, access: Access) -> Result<(), AccessError> {
        self.keys.check_region(rkey, who, access)
    }

    fn read(&self, key: Key, who: Accessor, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        // `locate` checked bounds (invariant 3) and the region is alive
        // (invariants 1, 2).
        let (r, off) = self.keys.locate(key, who, addr, out.len() as u64, key.needs(false))?;
        copy_out(r.backing, off, out)
    }

    fn write(&self, key: Key, who: Accessor, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        let (r, off) = self.keys.locate(key, who, addr, data.len() as u64, key.needs(true))?;
        copy_in(r.backing, off, data)
    }

    fn atomic(
        &self,
        rkey: u32,
        who: Accessor,
        addr: u64,
        op: AtomicOp,
    ) -> Result<u64, AccessError> {
        if !addr.is_multiple_of(8) {
            return Err(AccessError::Misaligned);
        }
        let (r, off) = self.keys.locate(Key::Remote(rkey), who, addr, 8, op.needs())?;
        let p = r.backing.at(off);
        if !(p as usize).is_multiple_of(8) {
            // The IOVA is aligned but the host address is not (a
            // registration whose IOVA differs from its address).
            return Err(AccessError::Misaligned);
        }
        if r.backing.on_demand {
            // Through the kernel, as every on-demand access: read, compute,
            // write. Atomic with respect to the device's other atomics (the
            // table is used under the context's lock, invariant 2), which is
            // what IBV_ATOMIC_HCA promises; a page missing or read-only is
            // an access error.
            let mut old = [0u8; 8];
            checked_copy(p, old.as_mut_ptr(), 8, false)?;
            let orig = u64::from_ne_bytes(old);
            let new = match op {
                AtomicOp::CompareSwap { compare, swap } => {
                    if orig == compare {
                        swap
                    } else {
                        orig
                    }
                }
                AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
                AtomicOp::Write { value } => value,
            };
            let mut bytes = new.to_ne_bytes();
            checked_copy(p, bytes.as_mut_ptr(), 8, true)?;
            return Ok(orig);
        }
        // SAFETY: 8 in-bounds, 8-aligned bytes of a live region (checked
        // above). Using an atomic makes the operation atomic with respect to
        // other atomics on the address, from any thread (IBTA §9.4.5).
        let cell = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        Ok(match op {
            AtomicOp::CompareSwap { compare, swap } => {
                match cell.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(v) | Err(v) => v,
                }
            }
            AtomicOp::FetchAdd { add } => cell.fetch_add(add, Ordering::AcqRel),
            // After every earlier operation's bytes, as IBA 1.5 asks.
            AtomicOp::Write { value } => cell.swap(value, Ordering::AcqRel),
        })
    }

    fn bind_mw(&self, who: Accessor, bind: &MwBind) -> Result<u32, AccessError> {
        self.keys.bind_mw(who, bind)
    }

    fn invalidate(&self, who: Accessor, rkey: u32, remote: bool) -> Result<(), AccessError> {
        self.keys.invalidate(who, rkey, remote)
    }
}

/// Zeroed, page-aligned memory owned by uroce, for registrations whose
/// buffer uroce allocates ([`crate::Pd::alloc_mr`]).
#[derive(Debug)]
pub(crate) struct OwnedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is exclusively owned; access goes through the table.
unsafe impl Send for OwnedBuf {}
// SAFETY: as above: `&OwnedBuf` exposes only the pointer value.
unsafe impl Sync for OwnedBuf {}

impl OwnedBuf {
    /// Allocates `len` zeroed bytes (at least one page, page-aligned).
    pub(crate) fn new(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(4096), 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        NonNull::new(p).map(|ptr| Self { ptr, layout })
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Copies `data` in at `offset`, if it fits within the first `len`
    /// bytes. The caller holds the context's lock (invariant 2: the
    /// buffer may be registered, and the transport writes it under it).
    pub(crate) fn copy_in(&self, len: usize, offset: usize, data: &[u8]) -> bool {
        if len > self.layout.size() || offset.checked_add(data.len()).is_none_or(|e| e > len) {
            return false;
        }
        // SAFETY: in bounds of our allocation (checked above); `data` is
        // a Rust slice, which cannot overlap a buffer we never lend out.
        unsafe { std::ptr::copy(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        true
    }

    /// Copies out from `offset`, as [`OwnedBuf::copy_in`].
    pub(crate) fn copy_out(&self, len: usize, offset: usize, out: &mut [u8]) -> bool {
        if len > self.layout.size() || offset.checked_add(out.len()).is_none_or(|e| e > len) {
            return false;
        }
        // SAFETY: as in `copy_in`.
        unsafe { std::ptr::copy(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        true
    }
}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A7: Accessor = Accessor { pd: 7, qpn: 1 };
    const A8: Accessor = Accessor { pd: 8, qpn: 1 };

    #[test]
    fn keys_checks_and_stale_keys() {
        let buf = OwnedBuf::new(100).unwrap();
        let mut t = MemTable::default();
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        // SAFETY: `buf` outlives the registration (deregistered below).
        let k = unsafe { t.register(buf.ptr(), 100, 0x1000, 7, all) };
        assert_ne!(k, 0);
        t.write(Key::Remote(k), A7, 0x1000 + 8, &5u64.to_ne_bytes()).unwrap();
        assert_eq!(t.atomic(k, A7, 0x1008, AtomicOp::FetchAdd { add: 2 }), Ok(5));
        assert_eq!(t.atomic(k, A7, 0x1008, AtomicOp::CompareSwap { compare: 7, swap: 1 }), Ok(7));
        let mut out = [0u8; 8];
        t.read(Key::Local(k), A7, 0x1008, &mut out).unwrap();
        assert_eq!(u64::from_ne_bytes(out), 1);
        assert_eq!(t.check(Key::Remote(k), A8, 0x1000, 1, Access::NONE), Err(AccessError::WrongPd));
        assert_eq!(
            t.check(Key::Remote(k), A7, 0x1000, 101, Access::NONE),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            t.check(Key::Remote(k), A7, 0xfff, 1, Access::NONE),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            t.check(Key::Remote(k), A7, u64::MAX, 2, Access::NONE),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            t.atomic(k, A7, 0x1004, AtomicOp::FetchAdd { add: 1 }),
            Err(AccessError::Misaligned)
        );
        assert!(t.deregister(k));
        assert_eq!(
            t.check(Key::Remote(k), A7, 0x1000, 1, Access::NONE),
            Err(AccessError::InvalidKey)
        );
        // Re-registration in the same slot gets a different key byte.
        // SAFETY: as above.
        let k2 = unsafe { t.register(buf.ptr(), 100, 0x1000, 7, Access::NONE) };
        assert_eq!(k2 >> 8, k >> 8);
        assert_ne!(k2, k);
        assert_eq!(
            t.check(Key::Remote(k), A7, 0x1000, 1, Access::NONE),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(
            t.check(Key::Remote(k2), A7, 0x1000, 1, Access::REMOTE_READ),
            Err(AccessError::NotPermitted)
        );
        assert!(t.deregister(k2));
    }

    #[test]
    fn first_keys_are_not_predictable() {
        let buf = OwnedBuf::new(8).unwrap();
        let firsts: Vec<u32> = (0..8)
            .map(|_| {
                let mut t = MemTable::default();
                // SAFETY: `buf` outlives the table.
                unsafe { t.register(buf.ptr(), 8, 0x1000, 1, Access::NONE) }
            })
            .collect();
        // Eight tables agreeing by chance: 2^-56.
        assert!(firsts.iter().any(|k| *k != firsts[0]), "{firsts:x?}");
        assert!(firsts.iter().all(|k| k >> 8 == 1));
    }
}
