//! Registered memory for tests: regions backed by vectors, each surrounded
//! by guard bytes that [`TestMemory::guards_intact`] checks, so a test can
//! prove that nothing was written outside a region. The key checks are the
//! production ones (`uroce_transport::keys`); only where the bytes live
//! differs.

use std::cell::RefCell;

use uroce_transport::keys::{KeyTable, Region};
use uroce_transport::{Access, AccessError, Accessor, AtomicOp, Key, Memory, MwBind};

const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xa5;

/// A region's bytes: GUARD bytes, the region, GUARD bytes.
#[derive(Debug)]
pub struct Guarded(RefCell<Vec<u8>>);

/// Test memory: a set of regions at distinct virtual addresses.
#[derive(Debug)]
pub struct TestMemory {
    keys: KeyTable<Guarded>,
    /// Deregistered regions, kept for the test's oracle and guard checks.
    retired: Vec<Region<Guarded>>,
    next_addr: u64,
}

impl Default for TestMemory {
    fn default() -> Self {
        Self::new()
    }
}

impl TestMemory {
    /// No regions; key bytes from a fixed seed (runs repeat bit for bit).
    pub fn new() -> Self {
        Self { keys: KeyTable::new(0x005e_ed0f_b175), retired: Vec::new(), next_addr: 0x1000_0000 }
    }

    /// Registers a zeroed region of `len` bytes; returns `(addr, lkey,
    /// rkey)` (the same key, as on rxe).
    pub fn register(&mut self, pd: u32, len: usize, access: Access) -> (u64, u32, u32) {
        let addr = self.next_addr;
        self.next_addr += (len as u64 + 0xfff) & !0xfff;
        self.next_addr += 0x1000;
        let mut bytes = vec![GUARD_BYTE; len + 2 * GUARD];
        bytes[GUARD..GUARD + len].fill(0);
        let backing = Guarded(RefCell::new(bytes));
        let key = self.keys.register(Region { backing, len, addr, pd, access });
        (addr, key, key)
    }

    /// Invalidates a region's keys (deregistration). The bytes stay
    /// readable through [`TestMemory::snapshot`] for the test's checks.
    pub fn deregister(&mut self, lkey: u32) {
        if let Some(r) = self.keys.deregister(lkey) {
            self.retired.push(r);
        }
    }

    fn with_region<T>(&self, addr: u64, len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
        let r = self
            .keys
            .regions()
            .chain(self.retired.iter())
            .find(|r| addr >= r.addr && addr + len as u64 <= r.addr + r.len as u64)
            .expect("an address inside a region");
        let off = GUARD + (addr - r.addr) as usize;
        f(&mut r.backing.0.borrow_mut()[off..off + len])
    }

    /// Copies bytes into a region (test setup, no checks but bounds).
    pub fn fill(&self, addr: u64, data: &[u8]) {
        self.with_region(addr, data.len(), |b| b.copy_from_slice(data));
    }

    /// Reads bytes from a region (test oracle).
    pub fn snapshot(&self, addr: u64, len: usize) -> Vec<u8> {
        self.with_region(addr, len, |b| b.to_vec())
    }

    /// Whether every guard byte around every region is untouched.
    pub fn guards_intact(&self) -> bool {
        self.keys.regions().chain(self.retired.iter()).all(|r| {
            let b = r.backing.0.borrow();
            b[..GUARD].iter().all(|&x| x == GUARD_BYTE)
                && b[GUARD + r.len..].iter().all(|&x| x == GUARD_BYTE)
        })
    }
}

impl Memory for TestMemory {
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
        let (r, off) = self.keys.locate(key, who, addr, out.len() as u64, key.needs(false))?;
        out.copy_from_slice(&r.backing.0.borrow()[GUARD + off..GUARD + off + out.len()]);
        Ok(())
    }

    fn write(&self, key: Key, who: Accessor, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        let (r, off) = self.keys.locate(key, who, addr, data.len() as u64, key.needs(true))?;
        r.backing.0.borrow_mut()[GUARD + off..GUARD + off + data.len()].copy_from_slice(data);
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
        let (r, off) = self.keys.locate(Key::Remote(rkey), who, addr, 8, op.needs())?;
        let mut bytes = r.backing.0.borrow_mut();
        let cell = &mut bytes[GUARD + off..GUARD + off + 8];
        let orig = u64::from_ne_bytes(cell.try_into().map_err(|_| AccessError::OutOfBounds)?);
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
        cell.copy_from_slice(&new.to_ne_bytes());
        Ok(orig)
    }

    fn bind_mw(&self, who: Accessor, bind: &MwBind) -> Result<u32, AccessError> {
        self.keys.bind_mw(who, bind)
    }

    fn invalidate(&self, who: Accessor, rkey: u32, remote: bool) -> Result<(), AccessError> {
        self.keys.invalidate(who, rkey, remote)
    }
}
