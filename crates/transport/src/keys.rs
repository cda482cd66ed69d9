//! The key table: memory registrations and memory windows, and every check
//! IBTA §10.6 asks for before a byte moves (key valid and current, PD,
//! access rights, bounds; for a window also its binding and, type 2, its
//! QP). One copy, in safe code, generic over how a region's bytes are
//! reached: raw process memory in production (`uroce::mr`), a vector with
//! guard bytes in the seeded tests (`uroce_sim::TestMemory`). Both run the
//! same checks.
//!
//! Keys: an MR's L_Key == R_Key == (index << 8) | key byte; a window's R_Key
//! has bit 31 set. The key byte changes whenever a slot is reused or a
//! window rebound, so stale keys fail. Key bytes come from a generator the
//! owner seeds (randomly in production, from the run's seed in tests).

use std::cell::RefCell;

use crate::memory::{AccessError, Accessor, Key, MwBind, MwType};
use crate::qp::attr::Access;

/// One registration: where its bytes are (`B`) and what it allows.
#[derive(Debug)]
pub struct Region<B> {
    /// How the bytes are reached.
    pub backing: B,
    /// Length in bytes.
    pub len: usize,
    /// The address peers and SGEs name (the registration's IOVA).
    pub addr: u64,
    /// Protection domain.
    pub pd: u32,
    /// Rights granted.
    pub access: Access,
}

#[derive(Debug)]
struct Slot<B> {
    key_byte: u8,
    region: Option<Region<B>>,
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

/// The window slot a window key names (any of its key bytes).
fn window_index(rkey: u32) -> usize {
    ((rkey >> 8) & !MW_INDEX) as usize
}

/// Registrations and windows of one device. Windows change state through
/// `&self` (a bind or an invalidation runs inside the transport, which
/// holds the table shared), hence the `RefCell`: the table belongs to one
/// thread at a time.
#[derive(Debug)]
pub struct KeyTable<B> {
    slots: Vec<Slot<B>>,
    free: Vec<usize>,
    live: usize,
    windows: RefCell<Vec<WinSlot>>,
    free_windows: Vec<usize>,
    /// xorshift64 state for key bytes (never 0).
    key_rng: u64,
}

impl<B> KeyTable<B> {
    /// An empty table whose key bytes follow from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            windows: RefCell::new(Vec::new()),
            free_windows: Vec::new(),
            key_rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        }
    }

    /// Restarts the key bytes from `seed` (a run that must repeat bit for
    /// bit).
    pub fn seed_keys(&mut self, seed: u64) {
        self.key_rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    }

    /// A key byte other than `old`.
    fn fresh_key_byte(&mut self, old: u8) -> u8 {
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

    /// Adds a registration; returns its key (L_Key and R_Key).
    pub fn register(&mut self, region: Region<B>) -> u32 {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                // Index 0 is never used, so no valid key is 0.
                if self.slots.is_empty() {
                    self.slots.push(Slot { key_byte: 0, region: None });
                }
                self.slots.push(Slot { key_byte: 0, region: None });
                self.slots.len() - 1
            }
        };
        let key_byte = self.fresh_key_byte(self.slots[idx].key_byte);
        let slot = &mut self.slots[idx];
        slot.key_byte = key_byte;
        slot.region = Some(region);
        self.live += 1;
        ((idx as u32) << 8) | u32::from(key_byte)
    }

    /// Removes a registration (its key fails from now on) and hands back
    /// its region.
    pub fn deregister(&mut self, key: u32) -> Option<Region<B>> {
        let idx = (key >> 8) as usize;
        let s = self.slots.get_mut(idx)?;
        if s.region.is_none() || u32::from(s.key_byte) != key & 0xff || key & (MW_INDEX << 8) != 0 {
            return None;
        }
        self.free.push(idx);
        self.live -= 1;
        s.region.take()
    }

    /// Registrations alive.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Every live registration.
    pub fn regions(&self) -> impl Iterator<Item = &Region<B>> {
        self.slots.iter().filter_map(|s| s.region.as_ref())
    }

    /// Every live registration with its key (L_Key and R_Key).
    pub fn keyed_regions(&self) -> impl Iterator<Item = (u32, &Region<B>)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.region.as_ref().map(|r| (((i as u32) << 8) | u32::from(s.key_byte), r))
        })
    }

    /// The registration of MR key `key`, without access checks (the owner's
    /// own copies).
    pub fn lookup(&self, key: u32) -> Option<&Region<B>> {
        let s = self.slots.get((key >> 8) as usize)?;
        if u32::from(s.key_byte) != key & 0xff {
            return None;
        }
        s.region.as_ref()
    }

    /// The region registered under `key`, to change its PD or rights in
    /// place (`ibv_rereg_mr` without a new translation keeps the keys).
    pub fn lookup_mut(&mut self, key: u32) -> Option<&mut Region<B>> {
        let s = self.slots.get_mut((key >> 8) as usize)?;
        if u32::from(s.key_byte) != key & 0xff || key & (MW_INDEX << 8) != 0 {
            return None;
        }
        s.region.as_mut()
    }

    /// The region and the byte offset of `[addr, addr+len)` in it, after
    /// every check of §10.6.3: key valid, PD, rights, bounds (through a
    /// window: its binding, its QP for type 2, its rights and bounds, then
    /// the region underneath alive and in the PD).
    ///
    /// # Errors
    /// The first check that fails.
    pub fn locate(
        &self,
        key: Key,
        who: Accessor,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(&Region<B>, usize), AccessError> {
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

    /// Whether region `rkey` (not a window) is alive, in `who`'s PD and
    /// grants `access` (see `Memory::check_region`).
    ///
    /// # Errors
    /// The first check that fails.
    pub fn check_region(
        &self,
        rkey: u32,
        who: Accessor,
        access: Access,
    ) -> Result<(), AccessError> {
        if rkey & (MW_INDEX << 8) != 0 {
            return Err(AccessError::InvalidKey);
        }
        let r = self.lookup(rkey).ok_or(AccessError::InvalidKey)?;
        if r.pd != who.pd {
            return Err(AccessError::WrongPd);
        }
        if !r.access.contains(access) {
            return Err(AccessError::NotPermitted);
        }
        Ok(())
    }

    /// Allocates an unbound memory window; returns its R_Key.
    pub fn alloc_mw(&mut self, pd: u32, kind: MwType) -> u32 {
        let idx = match self.free_windows.pop() {
            Some(i) => i,
            None => {
                let wins = self.windows.get_mut();
                wins.push(WinSlot::default());
                wins.len() - 1
            }
        };
        let old = self.windows.get_mut()[idx].key_byte;
        let key_byte = self.fresh_key_byte(old);
        let slot = &mut self.windows.get_mut()[idx];
        slot.key_byte = key_byte;
        slot.win = Some(Window { pd, kind, bound: None });
        ((MW_INDEX | idx as u32) << 8) | u32::from(key_byte)
    }

    /// Frees a window (named by any of its keys).
    pub fn dealloc_mw(&mut self, rkey: u32) -> bool {
        let idx = window_index(rkey);
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
    pub fn mw_rkey(&self, rkey: u32) -> Option<u32> {
        let idx = window_index(rkey);
        let w = self.windows.borrow();
        let s = w.get(idx)?;
        s.win.as_ref()?;
        Some((rkey & !0xff) | u32::from(s.key_byte))
    }

    /// Windows alive.
    pub fn windows_len(&self) -> usize {
        self.windows.borrow().iter().filter(|w| w.win.is_some()).count()
    }

    /// Checks an access through window `rkey`; returns the key of the
    /// region underneath.
    fn resolve_mw(
        &self,
        rkey: u32,
        who: Accessor,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, AccessError> {
        let idx = window_index(rkey);
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

    /// Binds (or, with length 0, unbinds) a window: `Memory::bind_mw`.
    ///
    /// # Errors
    /// A key, PD, rights or bounds check that fails, or a bound type 2
    /// window.
    pub fn bind_mw(&self, who: Accessor, bind: &MwBind) -> Result<u32, AccessError> {
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
        let idx = window_index(bind.mw_rkey);
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

    /// Invalidates a type 2 window (LOCAL_INV, or SEND with invalidate when
    /// `remote`): `Memory::invalidate`.
    ///
    /// # Errors
    /// A regular MR, an unknown or unbound window, another PD, a type 1
    /// window, or (remote) another QP's window.
    pub fn invalidate(&self, who: Accessor, rkey: u32, remote: bool) -> Result<(), AccessError> {
        if rkey & (MW_INDEX << 8) == 0 {
            // Regular MRs cannot be invalidated (no fast-registration MRs).
            return Err(AccessError::NotPermitted);
        }
        let idx = window_index(rkey);
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
