//! XRC domains that the processes of one device share, as the kernel
//! shares a domain opened through one file (`ibv_open_xrcd` with an `fd`)
//! between processes: a table file per device and domain file, mapped by
//! every context that opens the domain, lists the domain's XRC SRQs by
//! number with two counters each, WQEs posted and WQEs claimed. A target
//! QP in any process takes a message for an SRQ only against a claim
//! (`uroce_transport::SharedSrq`), and a claim made elsewhere is a WQE kept
//! for the message that process relays here (`uroce_transport::xrc_relay`).
//!
//! Liveness by OFD byte locks, as the shared device's slot table: every
//! opener holds a read lock on [`OPEN_BYTE`] (the last to close finds no
//! other and removes the file), and an SRQ's owner a write lock on its
//! entry's byte while the SRQ lives, so an entry of a killed process is
//! known dead and taken again.
//!
//! Nothing read from the mapping is trusted beyond the counters' meaning:
//! another process of the same user writes it; an SRQ number is only
//! ever compared, and a wrong count at worst sends an RNR NAK or a
//! message to an SRQ that drops it.
//!
//! UNSAFE ISLAND: the table's mapping, and the atomics inside it.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use uroce_transport::{SharedDomain, SharedSrq};

use uroce_transport::fastmap::FastMap;

use crate::ofd_lock;

/// Entries: XRC SRQs a domain can have on one device, all processes
/// together.
const ENTRIES: usize = 1024;
const ENTRY: usize = 32;
const HEADER: usize = 64;
const FILE_LEN: usize = HEADER + ENTRIES * ENTRY;
/// Every opener's read lock (beyond the file's end: locks need no data).
const OPEN_BYTE: u64 = 1 << 20;
/// Entry `i`'s owner holds a write lock on byte `LIVE_BASE + i`.
const LIVE_BASE: u64 = 2 << 20;
/// Where in the header: a count of the changes to the entries' SRQ
/// numbers, which lookups key their index of the table by.
const H_GENERATION: usize = 0;
/// Where in an entry: the SRQ number (0: free), WQEs posted, claimed,
/// and the byte length of the longest posted and not yet taken.
const E_SRQN: usize = 0;
const E_POSTED: usize = 8;
const E_CLAIMED: usize = 16;
const E_MAX_LEN: usize = 24;

/// A shared mapping of a whole table file.
#[derive(Debug)]
struct Mapping {
    base: NonNull<u8>,
}

// SAFETY: plain shared memory, only ever accessed through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `file` (`FILE_LEN` bytes long, checked) read-write.
    fn map(file: &File) -> io::Result<Self> {
        if file.metadata()?.len() != FILE_LEN as u64 {
            return Err(io::ErrorKind::InvalidData.into());
        }
        // SAFETY: a fresh shared mapping of an open file of the checked
        // length; the result is checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(file),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast()).map(|base| Self { base }).ok_or_else(|| io::ErrorKind::Other.into())
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= FILE_LEN);
        // SAFETY: in bounds and aligned (checked; the mapping is page
        // aligned), and only ever accessed atomically by every party.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= FILE_LEN);
        // SAFETY: as `u64_at`.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `FILE_LEN` bytes; nothing borrows it
        // past its owner (`Table`, whose entries hold it by `Arc`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), FILE_LEN) };
    }
}

/// One domain's table as one context opened it.
#[derive(Debug)]
pub(crate) struct Table {
    file: File,
    path: PathBuf,
    map: Mapping,
    /// The entries this opener's SRQs hold (their locks are its own,
    /// which `held_by_other` does not see).
    owned: Mutex<Vec<bool>>,
}

/// The table's path: per network namespace, device address and domain
/// file (its device and inode, as the kernel keys domains).
fn path_of(device: SocketAddr, file_dev: u64, ino: u64) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    crate::published::run_dir().join(format!(
        "xrcd-{netns}-{}-{}.{file_dev:x}-{ino:x}",
        device.ip(),
        device.port()
    ))
}

/// How an open went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opened {
    /// Another process had the domain open.
    Existing,
    /// No other process had it.
    New,
}

impl Table {
    /// Opens (or makes) the table of the domain of file `(file_dev, ino)`
    /// on the device at `device`.
    pub(crate) fn open(device: SocketAddr, file_dev: u64, ino: u64) -> io::Result<(Self, Opened)> {
        let path = path_of(device, file_dev, ino);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
            sweep(dir);
        }
        // The last closer may remove the file between our open and our
        // lock: then the path names another file (or none), and we retry.
        for _ in 0..1000 {
            let file = open_rw(&path)?;
            match ofd_lock::lock_shared(&file, OPEN_BYTE) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The last closer is removing it.
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(e),
            }
            if !crate::backend::share::same_file(&file, &path) {
                continue;
            }
            // Another's read lock shows as a conflict with a write lock.
            let opened = if ofd_lock::held_by_other(&file, OPEN_BYTE) {
                Opened::Existing
            } else {
                Opened::New
            };
            if file.metadata()?.len() != FILE_LEN as u64 {
                // New (or left by a killed process while it was made):
                // zeroed entries are free ones.
                file.set_len(FILE_LEN as u64)?;
            }
            let map = Mapping::map(&file)?;
            let owned = Mutex::new(vec![false; ENTRIES]);
            return Ok((Self { file, path, map, owned }, opened));
        }
        Err(io::ErrorKind::TimedOut.into())
    }

    fn entry(&self, i: usize) -> usize {
        HEADER + i * ENTRY
    }

    /// Whether entry `i`'s owner (this opener or another) is alive.
    fn live(&self, i: usize) -> bool {
        self.owned.lock().unwrap_or_else(|e| e.into_inner())[i]
            || ofd_lock::held_by_other(&self.file, LIVE_BASE + i as u64)
    }

    fn generation(&self) -> &AtomicU64 {
        self.map.u64_at(H_GENERATION)
    }

    /// Entry `i` now lists `srqn` (0: none).
    fn set_srqn(&self, i: usize, srqn: u32) {
        self.map.u32_at(self.entry(i) + E_SRQN).store(srqn, Ordering::Release);
        self.generation().fetch_add(1, Ordering::AcqRel);
    }

    /// Lists SRQ `srqn` (new, no WQE posted) as this opener's: the claims
    /// its WQEs are taken against. `None` when the table is full.
    pub(crate) fn register(self: &Arc<Self>, srqn: u32) -> Option<Arc<dyn SharedSrq>> {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        for (i, mine) in owned.iter_mut().enumerate() {
            if *mine {
                continue;
            }
            let at = self.entry(i);
            let word = self.map.u32_at(at + E_SRQN);
            // A free entry, or one whose owner is gone (its lock went with
            // its process); the lock decides between two takers.
            let free = word.load(Ordering::Acquire) == 0
                || !ofd_lock::held_by_other(&self.file, LIVE_BASE + i as u64);
            if !free || ofd_lock::lock(&self.file, LIVE_BASE + i as u64).is_err() {
                continue;
            }
            for field in [E_POSTED, E_CLAIMED, E_MAX_LEN] {
                self.map.u64_at(at + field).store(0, Ordering::Release);
            }
            self.set_srqn(i, srqn);
            *mine = true;
            return Some(Arc::new(Owned { entry: Entry::new(self.clone(), i, srqn) }));
        }
        None
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // The last opener removes the file: no other read lock is held if
        // the write lock can be had (and a new opener that finds the file
        // gone opens a new one).
        let _ = ofd_lock::unlock(&self.file, OPEN_BYTE);
        if ofd_lock::lock(&self.file, OPEN_BYTE).is_ok()
            && crate::backend::share::same_file(&self.file, &self.path)
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A table as the endpoint looks other processes' SRQs up in it: through
/// an index of the entries by SRQ number, made again when the table's
/// generation says an entry changed, so that a request naming a number
/// nobody has (a hostile peer's, each packet) costs a hash lookup, not a
/// scan of the table.
#[derive(Debug)]
pub(crate) struct Domain {
    table: Arc<Table>,
    index: Mutex<Index>,
}

#[derive(Debug)]
struct Index {
    /// The table's generation the index was made at.
    generation: u64,
    entries: FastMap<u32, usize>,
}

impl Domain {
    pub(crate) fn new(table: Arc<Table>) -> Self {
        let index = Index { generation: u64::MAX, entries: FastMap::default() };
        Self { table, index: Mutex::new(index) }
    }

    /// The entry listing `srqn`, from the index (made again first if the
    /// table changed since).
    fn lookup(&self, srqn: u32) -> Option<usize> {
        let t = &self.table;
        let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        // Read before the entries: a change made during the scan moves it
        // on, and the next lookup scans again.
        let generation = t.generation().load(Ordering::Acquire);
        if index.generation != generation {
            index.entries.clear();
            for i in 0..ENTRIES {
                let n = t.map.u32_at(t.entry(i) + E_SRQN).load(Ordering::Acquire);
                if n == 0 {
                    continue;
                }
                // Two entries of one number: a killed owner's, still
                // listed, and the live one of the process that has its
                // numbers now. The live one wins.
                if let Some(&j) = index.entries.get(&n)
                    && t.live(j)
                {
                    continue;
                }
                index.entries.insert(n, i);
            }
            index.generation = generation;
        }
        let i = *index.entries.get(&srqn)?;
        (t.map.u32_at(t.entry(i) + E_SRQN).load(Ordering::Acquire) == srqn).then_some(i)
    }
}

impl Domain {
    /// Whether number `n` is listed by a live process of the domain (this
    /// one included): an XRC target QP's or an opener's (`xrc_open`).
    pub(crate) fn listed_alive(&self, n: u32) -> bool {
        self.lookup(n).is_some_and(|i| self.table.live(i))
    }
}

impl SharedDomain for Domain {
    fn find(&self, srqn: u32) -> Option<Arc<dyn SharedSrq>> {
        let t = &self.table;
        if srqn == 0 {
            return None;
        }
        let i = self.lookup(srqn)?;
        if t.owned.lock().unwrap_or_else(|e| e.into_inner())[i] {
            // Ours: the SRQ is in this context (a wrong domain's, then).
            return None;
        }
        let entry = Entry::new(t.clone(), i, srqn);
        Some(Arc::new(View { entry, dead: AtomicBool::new(false) }))
    }
}

/// One SRQ's entry.
#[derive(Debug)]
struct Entry {
    table: Arc<Table>,
    i: usize,
    srqn: u32,
}

impl Entry {
    fn new(table: Arc<Table>, i: usize, srqn: u32) -> Self {
        Self { table, i, srqn }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        self.table.map.u64_at(self.table.entry(self.i) + off)
    }

    fn listed(&self) -> bool {
        self.table.map.u32_at(self.table.entry(self.i) + E_SRQN).load(Ordering::Acquire)
            == self.srqn
    }

    fn claim(&self) -> bool {
        let posted = self.word(E_POSTED).load(Ordering::Acquire);
        self.listed()
            && self
                .word(E_CLAIMED)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                    (c < posted).then_some(c + 1)
                })
                .is_ok()
    }
}

impl Entry {
    /// One claim given back (none below zero).
    fn release(&self) {
        if self.listed() {
            let claimed = self.word(E_CLAIMED);
            let _ = claimed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
        }
    }
}

/// The owner's entry: posts count here; dropped with the SRQ, it frees
/// the entry.
#[derive(Debug)]
struct Owned {
    entry: Entry,
}

impl SharedSrq for Owned {
    fn claim(&self) -> bool {
        self.entry.claim()
    }

    fn release(&self) {
        self.entry.release();
    }

    fn posted(&self, n: u32) {
        self.entry.word(E_POSTED).fetch_add(u64::from(n), Ordering::AcqRel);
    }

    fn max_len(&self) -> u64 {
        self.entry.word(E_MAX_LEN).load(Ordering::Acquire)
    }

    fn set_max_len(&self, len: u64) {
        self.entry.word(E_MAX_LEN).store(len, Ordering::Release);
    }

    fn alive(&self) -> bool {
        true
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        let e = &self.entry;
        let cleared = e.table.map.u32_at(e.table.entry(e.i) + E_SRQN).compare_exchange(
            e.srqn,
            0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if cleared.is_ok() {
            e.table.generation().fetch_add(1, Ordering::AcqRel);
        }
        let _ = ofd_lock::unlock(&e.table.file, LIVE_BASE + e.i as u64);
        e.table.owned.lock().unwrap_or_else(|p| p.into_inner())[e.i] = false;
    }
}

/// Another process's SRQ, as a target QP here claims its WQEs.
#[derive(Debug)]
struct View {
    entry: Entry,
    /// Its owner was found gone.
    dead: AtomicBool,
}

impl SharedSrq for View {
    fn claim(&self) -> bool {
        if self.entry.claim() {
            return true;
        }
        // None to spare, the usual RNR case: is the owner still there?
        if !ofd_lock::held_by_other(&self.entry.table.file, LIVE_BASE + self.entry.i as u64) {
            self.dead.store(true, Ordering::Release);
        }
        false
    }

    fn release(&self) {
        self.entry.release();
    }

    fn posted(&self, _n: u32) {}

    /// As the owner published it (a liar's length at worst lets a message
    /// through to its own SRQ, or refuses one).
    fn max_len(&self) -> u64 {
        self.entry.word(E_MAX_LEN).load(Ordering::Acquire)
    }

    fn set_max_len(&self, _len: u64) {}

    fn alive(&self) -> bool {
        !self.dead.load(Ordering::Acquire) && self.entry.listed()
    }
}

/// Removes the tables nobody has open: a killed process leaves its own
/// behind (a table being opened this moment, not locked yet, is removed
/// too, and its opener, finding its path gone, opens a new one).
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with("xrcd-") {
            continue;
        }
        let path = e.path();
        if let Ok(f) = OpenOptions::new().read(true).write(true).open(&path)
            && !ofd_lock::held_by_other(&f, OPEN_BYTE)
            && crate::backend::share::same_file(&f, &path)
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn open_rw(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two opens of one table stand for two processes: each has its own
    /// open file description, so its own locks.
    fn two() -> (Arc<Table>, Arc<Table>, PathBuf) {
        let dev: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let ino = u64::from(std::process::id()) << 20 | u64::from(rand_word());
        let (a, first) = Table::open(dev, 0xfeed, ino).unwrap();
        let (b, second) = Table::open(dev, 0xfeed, ino).unwrap();
        assert_eq!((first, second), (Opened::New, Opened::Existing));
        (Arc::new(a), Arc::new(b), path_of(dev, 0xfeed, ino))
    }

    fn third(path: &Path) -> Arc<Table> {
        let dev: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let ino = u64::from_str_radix(name.rsplit('-').next().unwrap(), 16).unwrap();
        Arc::new(Table::open(dev, 0xfeed, ino).unwrap().0)
    }

    fn rand_word() -> u16 {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new().build_hasher().finish() as u16
    }

    #[test]
    fn claims_follow_posts_and_a_gone_srq_is_no_longer_found() {
        let (a, b, path) = two();
        let owned = a.register(0x4_0000).unwrap();
        assert!(
            Domain::new(a.clone()).find(0x4_0000).is_none(),
            "the owner finds its own elsewhere"
        );
        let view = Domain::new(b.clone()).find(0x4_0000).unwrap();
        assert!(Domain::new(b.clone()).find(0x4_0001).is_none());
        assert!(view.alive() && !view.claim(), "nothing posted: nothing to claim");
        owned.posted(2);
        assert!(view.claim() && owned.claim(), "two posted, two claims");
        assert!(!view.claim() && !owned.claim(), "none left");
        view.release();
        assert!(owned.claim(), "a claim given back is free again");
        owned.release();
        owned.release();
        owned.release();
        assert!(view.claim() && view.claim() && !view.claim(), "no count below zero");
        owned.posted(1);
        assert!(view.claim());
        drop(owned);
        assert!(!view.alive(), "destroyed");
        assert!(Domain::new(b.clone()).find(0x4_0000).is_none());
        drop((a, b, view));
        assert!(!path.exists(), "the last to close removes the table");
    }

    #[test]
    fn a_dead_owners_entry_is_known_dead_and_taken_again() {
        let (a, b, path) = two();
        let owned = a.register(0x8_0000).unwrap();
        let view = Domain::new(b.clone()).find(0x8_0000).unwrap();
        // Its process killed: the kernel drops its locks (here, by hand;
        // the entry stays listed, as a killed process leaves it).
        ofd_lock::unlock(&a.file, LIVE_BASE).unwrap();
        assert!(view.alive() && !view.claim());
        assert!(!view.alive(), "a claim that finds none looks for the owner");
        let again = b.register(0x9_0000).unwrap();
        let c = third(&path);
        assert!(
            Domain::new(c.clone()).find(0x9_0000).is_some(),
            "the dead entry taken for a new SRQ"
        );
        assert!(Domain::new(c.clone()).find(0x8_0000).is_none());
        assert_eq!(b.owned.lock().unwrap().iter().position(|&m| m), Some(0), "entry 0 again");
        drop((owned, again));
    }

    /// Lookups go through an index kept by the table's generation: a new
    /// SRQ is found at once, a number nobody has costs no scan, and of two
    /// entries of one number (a killed owner's left listed, and the live
    /// one of the process that has its numbers now) the live one is found.
    #[test]
    fn lookups_follow_the_table_and_prefer_the_live_entry() {
        let (a, b, path) = two();
        let domain = Domain::new(b.clone());
        assert!(domain.find(0x5_0000).is_none());
        let generation = domain.index.lock().unwrap().generation;
        assert!(domain.find(0x5_0001).is_none());
        assert_eq!(domain.index.lock().unwrap().generation, generation, "no change, no scan");
        let first = a.register(0x5_0000).unwrap();
        assert!(domain.find(0x5_0000).is_some(), "registered: found at once");
        drop(first);
        assert!(domain.find(0x5_0000).is_none(), "destroyed: gone at once");
        // Two entries of one number, the dead one first and then last: a
        // killed process's entry left listed (its lock gone), the live one
        // another process's.
        for dead_first in [true, false] {
            let (dead, live) = if dead_first { (0, 1) } else { (1, 0) };
            let c = third(&path);
            let filler = a.register(0x6_0000).unwrap();
            let srq = c.register(0x5_0000).unwrap();
            assert_eq!(c.owned.lock().unwrap().iter().position(|&m| m), Some(1));
            if !dead_first {
                // Swap: the live SRQ's number in entry 0, the dead one's
                // in entry 1 (the filler's entry made dead below).
                drop(filler);
                drop(srq);
                let srq = a.register(0x5_0000).unwrap();
                let filler = c.register(0x6_0000).unwrap();
                c.set_srqn(1, 0x5_0000);
                ofd_lock::unlock(&c.file, LIVE_BASE + 1).unwrap();
                let view = domain.find(0x5_0000).unwrap();
                srq.posted(1);
                assert!(view.claim(), "the live entry's WQE ({live})");
                drop((filler, srq, view, c));
                continue;
            }
            a.set_srqn(dead, 0x5_0000);
            ofd_lock::unlock(&a.file, LIVE_BASE + dead as u64).unwrap();
            let view = domain.find(0x5_0000).unwrap();
            srq.posted(1);
            assert!(view.claim(), "the live entry's WQE ({live})");
            drop((filler, srq, view, c));
        }
    }
}
