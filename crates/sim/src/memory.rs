//! Registered memory for tests: regions backed by vectors, each surrounded
//! by guard bytes that [`TestMemory::guards_intact`] checks, so a test can
//! prove that nothing was written outside a region.

use std::cell::RefCell;

use uroce_transport::{Access, AccessError, Accessor, AtomicOp, Key, Memory};

const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xa5;

#[derive(Debug)]
struct Region {
    lkey: u32,
    rkey: u32,
    pd: u32,
    addr: u64,
    len: usize,
    access: Access,
    valid: bool,
    /// GUARD bytes, the region, GUARD bytes.
    bytes: Vec<u8>,
}

/// Test memory: a set of regions at distinct virtual addresses.
#[derive(Debug, Default)]
pub struct TestMemory {
    regions: RefCell<Vec<Region>>,
    next_addr: u64,
    next_key: u32,
}

impl TestMemory {
    /// No regions.
    pub fn new() -> Self {
        Self { regions: RefCell::new(Vec::new()), next_addr: 0x1000_0000, next_key: 0x100 }
    }

    /// Registers a zeroed region of `len` bytes; returns `(addr, lkey, rkey)`.
    pub fn register(&mut self, pd: u32, len: usize, access: Access) -> (u64, u32, u32) {
        let addr = self.next_addr;
        self.next_addr += (len as u64 + 0xfff) & !0xfff;
        self.next_addr += 0x1000;
        let lkey = self.next_key;
        let rkey = self.next_key + 1;
        self.next_key += 0x100;
        let mut bytes = vec![GUARD_BYTE; len + 2 * GUARD];
        bytes[GUARD..GUARD + len].fill(0);
        self.regions.get_mut().push(Region {
            lkey,
            rkey,
            pd,
            addr,
            len,
            access,
            valid: true,
            bytes,
        });
        (addr, lkey, rkey)
    }

    /// Invalidates a region's keys (deregistration).
    pub fn deregister(&mut self, lkey: u32) {
        for r in self.regions.get_mut().iter_mut().filter(|r| r.lkey == lkey) {
            r.valid = false;
        }
    }

    /// Copies bytes into a region (test setup, no checks but bounds).
    pub fn fill(&self, addr: u64, data: &[u8]) {
        let mut regs = self.regions.borrow_mut();
        let r = regs
            .iter_mut()
            .find(|r| addr >= r.addr && addr + data.len() as u64 <= r.addr + r.len as u64)
            .expect("fill inside a region");
        let off = GUARD + (addr - r.addr) as usize;
        r.bytes[off..off + data.len()].copy_from_slice(data);
    }

    /// Reads bytes from a region (test oracle).
    pub fn snapshot(&self, addr: u64, len: usize) -> Vec<u8> {
        let regs = self.regions.borrow();
        let r = regs
            .iter()
            .find(|r| addr >= r.addr && addr + len as u64 <= r.addr + r.len as u64)
            .expect("snapshot inside a region");
        let off = GUARD + (addr - r.addr) as usize;
        r.bytes[off..off + len].to_vec()
    }

    /// Whether every guard byte around every region is untouched.
    pub fn guards_intact(&self) -> bool {
        self.regions.borrow().iter().all(|r| {
            r.bytes[..GUARD].iter().all(|&b| b == GUARD_BYTE)
                && r.bytes[GUARD + r.len..].iter().all(|&b| b == GUARD_BYTE)
        })
    }

    fn locate(
        &self,
        key: Key,
        pd: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(usize, usize), AccessError> {
        let regs = self.regions.borrow();
        let (i, r) = regs
            .iter()
            .enumerate()
            .find(|(_, r)| {
                r.valid
                    && match key {
                        Key::Local(k) => r.lkey == k,
                        Key::Remote(k) => r.rkey == k,
                    }
            })
            .ok_or(AccessError::InvalidKey)?;
        if r.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !r.access.contains(access) {
            return Err(AccessError::NotPermitted);
        }
        let end = addr.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        if addr < r.addr || end > r.addr + r.len as u64 {
            return Err(AccessError::OutOfBounds);
        }
        Ok((i, GUARD + (addr - r.addr) as usize))
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
        self.locate(key, who.pd, addr, len, access).map(|_| ())
    }

    fn read(&self, key: Key, who: Accessor, addr: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let need = key.needs(false);
        let (i, off) = self.locate(key, who.pd, addr, out.len() as u64, need)?;
        out.copy_from_slice(&self.regions.borrow()[i].bytes[off..off + out.len()]);
        Ok(())
    }

    fn write(&self, key: Key, who: Accessor, addr: u64, data: &[u8]) -> Result<(), AccessError> {
        let need = key.needs(true);
        let (i, off) = self.locate(key, who.pd, addr, data.len() as u64, need)?;
        self.regions.borrow_mut()[i].bytes[off..off + data.len()].copy_from_slice(data);
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
        let (i, off) = self.locate(Key::Remote(rkey), who.pd, addr, 8, Access::REMOTE_ATOMIC)?;
        let mut regs = self.regions.borrow_mut();
        let cell = &mut regs[i].bytes[off..off + 8];
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
        };
        cell.copy_from_slice(&new.to_ne_bytes());
        Ok(orig)
    }
}
