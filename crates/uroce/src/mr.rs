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

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use std::cell::RefCell;

use uroce_transport::{Access, AccessError, Accessor, AtomicOp, Key, Memory, MwBind, MwType};

/// One registration.
#[derive(Debug)]
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    /// The address peers and SGEs name (the registration's IOVA).
    pub(crate) addr: u64,
    pub(crate) pd: u32,
    pub(crate) access: Access,
}

// SAFETY: a Region is plain data describing memory whose lifetime the table
// manages (invariant 1); moving it between threads moves no ownership of
// Rust values.
unsafe impl Send for Region {}

#[derive(Debug, Default)]
struct Slot {
    /// The key byte: changes every time the slot is reused, so stale keys
    /// fail (IBTA §10.6.3.2: the "key" portion of L_Key/R_Key).
    key_byte: u8,
    region: Option<Region>,
}

/// A memory window's binding.
#[derive(Debug, Clone, Copy)]
struct Binding {
    mr_key: u32,
    addr: u64,
    len: u64,
    access: Access,
    /// The QP a type 2 window is bound to.
    qpn: u32,
}

#[derive(Debug)]
struct Window {
    pd: u32,
    kind: MwType,
    bound: Option<Binding>,
}

#[derive(Debug, Default)]
struct WinSlot {
    key_byte: u8,
    win: Option<Window>,
}

/// Bit 23 of a key's index marks a memory window.
const MW_INDEX: u32 = 0x80_0000;

/// The key table of one context: an MR's lkey == rkey == (index << 8) | key
/// byte; a window's rkey has bit 31 set. Windows change state through
/// `&self` (a bind or an invalidation runs inside the transport), hence the
/// RefCell; the table is only ever used under the context's lock.
#[derive(Debug, Default)]
pub(crate) struct MemTable {
    slots: Vec<Slot>,
    free: Vec<usize>,
    live: usize,
    windows: RefCell<Vec<WinSlot>>,
    free_windows: Vec<usize>,
    /// xorshift64* state for key bytes (0 until first used).
    key_rng: u64,
}

impl MemTable {
    /// Makes the key bytes a function of `seed` (a virtual simulation,
    /// repeatable bit for bit).
    pub(crate) fn seed_keys(&mut self, seed: u64) {
        self.key_rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    }

    /// A random key byte other than `old`: keys are not predictable from
    /// one run (or registration) to the next, as hardware and rxe keys.
    fn fresh_key_byte(&mut self, old: u8) -> u8 {
        if self.key_rng == 0 {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(self as *const Self as usize);
            self.key_rng = h.finish() | 1;
        }
        loop {
            let mut x = self.key_rng;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.key_rng = x;
            let b = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
            if b != old {
                return b;
            }
        }
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
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                // Index 0 is never used, so no valid key is 0.
                if self.slots.is_empty() {
                    self.slots.push(Slot::default());
                }
                self.slots.push(Slot::default());
                self.slots.len() - 1
            }
        };
        let key_byte = self.fresh_key_byte(self.slots[idx].key_byte);
        let slot = &mut self.slots[idx];
        slot.key_byte = key_byte;
        slot.region = Some(Region { ptr, len, addr, pd, access });
        self.live += 1;
        ((idx as u32) << 8) | u32::from(slot.key_byte)
    }

    /// Removes a registration; its key fails from now on.
    pub(crate) fn deregister(&mut self, key: u32) -> bool {
        let idx = (key >> 8) as usize;
        match self.slots.get_mut(idx) {
            Some(s) if s.region.is_some() && u32::from(s.key_byte) == key & 0xff => {
                s.region = None;
                self.free.push(idx);
                self.live -= 1;
                true
            }
            _ => false,
        }
    }

    /// Registrations alive.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    fn lookup(&self, key: u32) -> Option<&Region> {
        let s = self.slots.get((key >> 8) as usize)?;
        if u32::from(s.key_byte) != key & 0xff {
            return None;
        }
        s.region.as_ref()
    }

    /// Finds the region and the byte offset of `[addr, addr+len)` in it,
    /// after every check of §10.6.3: key valid, PD, rights, bounds.
    fn locate(
        &self,
        key: Key,
        who: Accessor,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(&Region, usize), AccessError> {
        let (k, region_access) = match key {
            // A window checked the remote rights; the region underneath
            // only has to be alive and in the same PD.
            Key::Remote(k) if k & (MW_INDEX << 8) != 0 => {
                (self.resolve_mw(k, who, addr, len, access)?, Access::NONE)
            }
            Key::Local(k) | Key::Remote(k) => (k, access),
        };
        let r = self.lookup(k).ok_or(AccessError::InvalidKey)?;
        if r.pd != who.pd {
            return Err(AccessError::WrongPd);
        }
        if !r.access.contains(region_access) {
            return Err(AccessError::NotPermitted);
        }
        let end = addr.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        if addr < r.addr || end > r.addr + r.len as u64 {
            return Err(AccessError::OutOfBounds);
        }
        Ok((r, (addr - r.addr) as usize))
    }

    /// Allocates an unbound memory window; returns its R_Key.
    pub(crate) fn alloc_mw(&mut self, pd: u32, kind: MwType) -> u32 {
        let wins = self.windows.get_mut();
        let idx = match self.free_windows.pop() {
            Some(i) => i,
            None => {
                wins.push(WinSlot::default());
                wins.len() - 1
            }
        };
        let old = wins[idx].key_byte;
        let key_byte = self.fresh_key_byte(old);
        let wins = self.windows.get_mut();
        let slot = &mut wins[idx];
        slot.key_byte = key_byte;
        slot.win = Some(Window { pd, kind, bound: None });
        ((MW_INDEX | idx as u32) << 8) | u32::from(slot.key_byte)
    }

    /// Frees a window (named by any of its keys).
    pub(crate) fn dealloc_mw(&mut self, rkey: u32) -> bool {
        let idx = ((rkey >> 8) & !MW_INDEX) as usize;
        match self.windows.get_mut().get_mut(idx) {
            Some(s) if s.win.is_some() => {
                s.win = None;
                self.free_windows.push(idx);
                true
            }
            _ => false,
        }
    }

    /// A window's current R_Key.
    pub(crate) fn mw_rkey(&self, rkey: u32) -> Option<u32> {
        let idx = ((rkey >> 8) & !MW_INDEX) as usize;
        let w = self.windows.borrow();
        let s = w.get(idx)?;
        s.win.as_ref()?;
        Some((rkey & !0xff) | u32::from(s.key_byte))
    }

    /// Windows alive.
    pub(crate) fn windows_len(&self) -> usize {
        self.windows.borrow().iter().filter(|w| w.win.is_some()).count()
    }

    /// Checks an access through window `rkey` and returns the key of the
    /// region underneath.
    fn resolve_mw(
        &self,
        rkey: u32,
        who: Accessor,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, AccessError> {
        let idx = ((rkey >> 8) & !MW_INDEX) as usize;
        let wins = self.windows.borrow();
        let s = wins.get(idx).ok_or(AccessError::InvalidKey)?;
        if u32::from(s.key_byte) != rkey & 0xff {
            return Err(AccessError::InvalidKey);
        }
        let w = s.win.as_ref().ok_or(AccessError::InvalidKey)?;
        let b = w.bound.ok_or(AccessError::InvalidKey)?;
        if w.pd != who.pd {
            return Err(AccessError::WrongPd);
        }
        if w.kind == MwType::Type2 && b.qpn != who.qpn {
            return Err(AccessError::InvalidKey);
        }
        if !b.access.contains(access) {
            return Err(AccessError::NotPermitted);
        }
        let end = addr.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        if addr < b.addr || end > b.addr + b.len {
            return Err(AccessError::OutOfBounds);
        }
        Ok(b.mr_key)
    }

    /// Copies into a region for the application (owned buffers), with
    /// bounds checked against the registration.
    pub(crate) fn app_write(&self, key: u32, offset: usize, data: &[u8]) -> bool {
        let Some(r) = self.lookup(key) else { return false };
        if offset.checked_add(data.len()).is_none_or(|e| e > r.len) {
            return false;
        }
        // SAFETY: invariant 1 and the bounds check above; `data` is a Rust
        // slice that cannot overlap registered memory we never lend out.
        unsafe { std::ptr::copy(data.as_ptr(), r.ptr.as_ptr().add(offset), data.len()) };
        true
    }

    /// Copies out of a region for the application.
    pub(crate) fn app_read(&self, key: u32, offset: usize, out: &mut [u8]) -> bool {
        let Some(r) = self.lookup(key) else { return false };
        if offset.checked_add(out.len()).is_none_or(|e| e > r.len) {
            return false;
        }
        // SAFETY: invariant 1 and the bounds check above.
        unsafe { std::ptr::copy(r.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        true
    }
}

/// The memory an `INLINE` WR is gathered from at post time under the C
/// verbs contract: its SGEs are plain process addresses and their L_Keys
/// are not checked (`man ibv_post_send`: "the L_Key will not be checked";
/// UCX posts inline data from unregistered buffers). Every other access
/// goes to the region table unchanged.
pub(crate) struct UncheckedInline<'a>(pub(crate) &'a MemTable);

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

    fn read(&self, key: Key, who: Accessor, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        match key {
            Key::Local(_) if !out.is_empty() => {
                // SAFETY: `Qp::post_send_unchecked_inline`'s contract: the
                // gather list of an inline WR names memory readable for the
                // duration of the post; the transport reads only that range.
                unsafe {
                    std::ptr::copy(addr as usize as *const u8, out.as_mut_ptr(), out.len());
                }
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
        self.locate(key, who, addr, len, access).map(|_| ())
    }

    fn read(&self, key: Key, who: Accessor, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let (r, off) = self.locate(key, who, addr, out.len() as u64, key.needs(false))?;
        // SAFETY: `locate` checked bounds (invariant 3) and the region is
        // alive (invariants 1, 2). `copy` tolerates overlap, which a caller
        // could produce by registering its own packet buffer.
        unsafe { std::ptr::copy(r.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn write(&self, key: Key, who: Accessor, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        let (r, off) = self.locate(key, who, addr, data.len() as u64, key.needs(true))?;
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy(data.as_ptr(), r.ptr.as_ptr().add(off), data.len()) };
        Ok(())
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
        let (r, off) = self.locate(Key::Remote(rkey), who, addr, 8, Access::REMOTE_ATOMIC)?;
        let p = r.ptr.as_ptr().wrapping_add(off);
        if !(p as usize).is_multiple_of(8) {
            // The IOVA is aligned but the host address is not (a
            // registration whose IOVA differs from its address).
            return Err(AccessError::Misaligned);
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
        })
    }

    fn bind_mw(&self, who: Accessor, bind: &MwBind) -> Result<u32, AccessError> {
        if bind.new_rkey & !0xff != bind.mw_rkey & !0xff {
            return Err(AccessError::InvalidKey);
        }
        // The region: alive, same PD, MW_BIND granted, the range inside it,
        // and local write under remote write or atomic rights.
        if bind.length > 0 {
            let r = self.lookup(bind.mr_lkey).ok_or(AccessError::InvalidKey)?;
            if r.pd != who.pd {
                return Err(AccessError::WrongPd);
            }
            let remote_writes = Access(Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0);
            if !r.access.contains(Access::MW_BIND)
                || (bind.access.0 & remote_writes.0 != 0 && !r.access.contains(Access::LOCAL_WRITE))
            {
                return Err(AccessError::NotPermitted);
            }
            let end = bind.addr.checked_add(bind.length).ok_or(AccessError::OutOfBounds)?;
            if bind.addr < r.addr || end > r.addr + r.len as u64 {
                return Err(AccessError::OutOfBounds);
            }
        }
        let idx = ((bind.mw_rkey >> 8) & !MW_INDEX) as usize;
        let mut wins = self.windows.borrow_mut();
        let s = wins.get_mut(idx).ok_or(AccessError::InvalidKey)?;
        if u32::from(s.key_byte) != bind.mw_rkey & 0xff {
            return Err(AccessError::InvalidKey);
        }
        let w = s.win.as_mut().ok_or(AccessError::InvalidKey)?;
        if w.pd != who.pd {
            return Err(AccessError::WrongPd);
        }
        // A bound type 2 window must be invalidated before a new bind.
        if w.kind == MwType::Type2 && w.bound.is_some() {
            return Err(AccessError::NotPermitted);
        }
        w.bound = (bind.length > 0).then_some(Binding {
            mr_key: bind.mr_lkey,
            addr: bind.addr,
            len: bind.length,
            access: bind.access,
            qpn: who.qpn,
        });
        s.key_byte = bind.new_rkey as u8;
        Ok(bind.new_rkey)
    }

    fn invalidate(&self, who: Accessor, rkey: u32, remote: bool) -> Result<(), AccessError> {
        if rkey & (MW_INDEX << 8) == 0 {
            // Regular MRs cannot be invalidated (no fast-registration MRs).
            return Err(AccessError::NotPermitted);
        }
        let idx = ((rkey >> 8) & !MW_INDEX) as usize;
        let mut wins = self.windows.borrow_mut();
        let s = wins.get_mut(idx).ok_or(AccessError::InvalidKey)?;
        if u32::from(s.key_byte) != rkey & 0xff {
            return Err(AccessError::InvalidKey);
        }
        let w = s.win.as_mut().ok_or(AccessError::InvalidKey)?;
        let b = w.bound.ok_or(AccessError::InvalidKey)?;
        if w.pd != who.pd {
            return Err(AccessError::WrongPd);
        }
        if w.kind != MwType::Type2 || (remote && b.qpn != who.qpn) {
            return Err(AccessError::NotPermitted);
        }
        w.bound = None;
        Ok(())
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
