//! An inbox file's layout and its lanes: single-producer, single-consumer
//! byte rings in memory that the receiving process and its senders map.
//!
//! One inbox per context (its owner consumes); each sender process claims
//! a lane of its own, so no two writers ever share a ring and a writer
//! that dies mid-packet leaves only its own lane unpublished. A packet is
//! an entry (a 48-byte header naming its addresses and IPv4 ID, then the
//! RoCE packet), 64-byte aligned, never split at the ring's end (a wrap
//! marker sends the reader back to the start). The producer publishes its
//! tail after a run of entries (release), the consumer its head after each
//! entry; both keep a private copy of the other's counter and read the
//! shared one only when theirs says full or empty.
//!
//! Nothing read from the mapping is trusted: another process of the same
//! user writes it. Lengths and counters are checked before use, and a
//! lane that breaks them is skipped (a consumer) or refused (a producer);
//! packets are copied out before anything parses them.
//!
//! UNSAFE ISLAND: the mapping, and the atomics and bytes inside it.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Lanes per inbox: how many sender processes one context takes packets
/// from through memory (more fall back to the kernel's UDP). One bit each
/// in the header's active mask; a lane costs nothing until a sender claims
/// it (its header reserved then, its ring as it fills).
pub(crate) const LANES: usize = 64;
/// Ring bytes per lane (sparse: a tmpfs file holds only touched pages).
pub(crate) const RING: u64 = 4 << 20;
/// The largest packet an entry holds (a UDP payload; RoCE's largest is
/// 4096 bytes of payload and under 100 of headers).
pub(crate) const MAX_PACKET: usize = 9000;
/// The file's size.
pub(crate) const FILE_LEN: u64 = HEADER + LANES as u64 * LANE;

const MAGIC: u64 = u64::from_le_bytes(*b"UROCEIN1");
const HEADER: u64 = 4096;
const LANE_HEADER: u64 = 128;
const LANE: u64 = LANE_HEADER + RING;
/// Header words: the magic (written last), the lane count, the ring size.
const H_MAGIC: u64 = 0;
const H_LANES: u64 = 8;
const H_RING: u64 = 16;
/// The consumer's "about to sleep" flag, on a line of its own.
const H_SLEEPING: u64 = 64;
/// Which lanes a producer claimed (a bit each), on a line of its own.
const H_ACTIVE: u64 = 128;
/// An entry's header.
const ENTRY_HEADER: usize = 48;
const ALIGN: u64 = 64;
/// The smallest page (the mapping is page aligned).
const PAGE: u64 = 4096;
/// An entry length that means "continue at the ring's start".
const WRAP: u32 = u32::MAX;

/// A shared mapping of a whole inbox file.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory; every access goes through
// atomics or through copies whose races are the protocol's (and checked).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `file` (which must be `FILE_LEN` bytes long) read-write.
    pub(crate) fn map(file: &File) -> io::Result<Self> {
        if file.metadata()?.len() != FILE_LEN {
            return Err(io::ErrorKind::InvalidData.into());
        }
        // SAFETY: a fresh shared mapping of an open file of the checked
        // length; the result is checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_LEN as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast()).map(|base| Self { base }).ok_or_else(|| io::ErrorKind::Other.into())
    }

    fn u64_at(&self, off: u64) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= FILE_LEN);
        // SAFETY: in bounds and aligned (checked; the mapping is page
        // aligned), and only ever accessed atomically by every party.
        unsafe { &*self.base.as_ptr().add(off as usize).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: u64) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= FILE_LEN);
        // SAFETY: as `u64_at`.
        unsafe { &*self.base.as_ptr().add(off as usize).cast::<AtomicU32>() }
    }

    /// Copies `bytes` into the mapping at `off`.
    fn write(&self, off: u64, bytes: &[u8]) {
        assert!(off + bytes.len() as u64 <= FILE_LEN);
        // SAFETY: in bounds (checked); the region is the producer's until
        // it publishes, so no reader looks at it meanwhile (one that does,
        // out of protocol, only reads bytes it then checks).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.as_ptr().add(off as usize),
                bytes.len(),
            );
        }
    }

    /// Copies bytes from the mapping at `off` into `out`.
    fn read(&self, off: u64, out: &mut [u8]) {
        assert!(off + out.len() as u64 <= FILE_LEN);
        // SAFETY: in bounds (checked); the bytes were published to us, and
        // we copy them out before anything looks at them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(off as usize),
                out.as_mut_ptr(),
                out.len(),
            );
        }
    }

    /// Maps the pages wholly inside `len` bytes at `off` into our page
    /// tables now, one system call instead of a fault per page at its first
    /// touch (a fresh chunk of 8-byte WRITEs faulted every 32 packets, on
    /// both sides). Only for bytes the tmpfs holds (reserved): populating a
    /// hole would allocate it. Best effort: a failure leaves the faults.
    fn populate(&self, off: u64, len: u64, write: bool) {
        let (start, end) = (off.next_multiple_of(PAGE), (off + len).min(FILE_LEN) / PAGE * PAGE);
        if start >= end {
            return;
        }
        let advice = if write { libc::MADV_POPULATE_WRITE } else { libc::MADV_POPULATE_READ };
        // SAFETY: page-aligned and inside our mapping (checked above);
        // populating changes no byte of it, only our page tables.
        unsafe {
            libc::madvise(
                self.base.as_ptr().add(start as usize).cast(),
                (end - start) as usize,
                advice,
            )
        };
    }

    /// Writes a new inbox's header (the magic last: a mapper that sees it
    /// sees the rest).
    pub(crate) fn init(&self) {
        self.u64_at(H_LANES).store(LANES as u64, Ordering::Relaxed);
        self.u64_at(H_RING).store(RING, Ordering::Relaxed);
        self.u64_at(H_MAGIC).store(MAGIC, Ordering::Release);
    }

    /// Whether the header is an inbox's of this layout.
    pub(crate) fn valid(&self) -> bool {
        self.u64_at(H_MAGIC).load(Ordering::Acquire) == MAGIC
            && self.u64_at(H_LANES).load(Ordering::Relaxed) == LANES as u64
            && self.u64_at(H_RING).load(Ordering::Relaxed) == RING
    }

    /// The consumer's sleep flag (see `LocalPath::prepare_sleep`).
    pub(crate) fn sleeping(&self) -> &AtomicU32 {
        self.u32_at(H_SLEEPING)
    }

    /// The claimed lanes, a bit each.
    pub(crate) fn active(&self) -> &AtomicU64 {
        self.u64_at(H_ACTIVE)
    }

    pub(crate) fn tail(&self, lane: usize) -> &AtomicU64 {
        self.u64_at(lane_base(lane))
    }

    fn head(&self, lane: usize) -> &AtomicU64 {
        self.u64_at(lane_base(lane) + 64)
    }
}

/// Writes only the header of an entry of `len` bytes at the start of
/// `lane`'s ring and publishes it: what a hostile process can do, claiming
/// bytes it never wrote (on a full tmpfs it could not have).
#[cfg(test)]
pub(crate) fn forge_entry(map: &Mapping, lane: usize, meta: &Meta, len: usize) {
    map.write(ring_off(lane, 0), &encode(meta, len));
    map.tail(lane).store(entry_len(len), Ordering::Release);
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our mapping of `FILE_LEN` bytes, unmapped once; no
        // reference into it outlives `self` (they borrow it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), FILE_LEN as usize) };
    }
}

/// The granularity at which a producer reserves ring memory.
const CHUNK: u64 = 256 << 10;
/// `Producer::reserved` with every chunk of the ring reserved.
const ALL_CHUNKS: u32 = u32::MAX >> (32 - RING / CHUNK);

/// Backs `len` bytes at `off` with memory now (`fallocate`), so that a
/// write through the mapping cannot meet a full tmpfs, which would be a
/// SIGBUS instead of an error.
pub(crate) fn reserve(file: &File, off: u64, len: u64) -> io::Result<()> {
    fallocate(file, libc::FALLOC_FL_KEEP_SIZE, off, len)
}

/// `fallocate(2)` over `len` bytes at `off`, keeping the file's size.
fn fallocate(file: &File, mode: libc::c_int, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: `fallocate` on an open descriptor; it changes only the
    // file's allocation or contents (every mode passed keeps its size).
    let r =
        unsafe { libc::fallocate(file.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Reserves what an inbox's owner writes before any sender came: the
/// header. (A lane's counters are reserved by the sender that claims it,
/// before anyone writes them; reading a tmpfs hole takes no memory.)
pub(crate) fn reserve_header(file: &File) -> io::Result<()> {
    reserve(file, 0, HEADER)
}

/// Reserves lane `lane`'s counters, which its producer and its consumer
/// write (the claiming sender's first step).
pub(crate) fn reserve_lane_header(file: &File, lane: usize) -> io::Result<()> {
    reserve(file, lane_base(lane), LANE_HEADER)
}

/// Gives a lane's ring pages back to the system (a tmpfs file keeps every
/// page a sender ever wrote); the ring reads as zeros after. Only for a
/// lane nobody writes: the caller holds the lane's lock.
pub(crate) fn release_ring(file: &File, lane: usize) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(file, mode, ring_off(lane, 0), RING)
}

fn lane_base(lane: usize) -> u64 {
    assert!(lane < LANES);
    HEADER + lane as u64 * LANE
}

/// Where a ring position lies in the file.
fn ring_off(lane: usize, pos: u64) -> u64 {
    lane_base(lane) + LANE_HEADER + pos % RING
}

fn entry_len(packet: usize) -> u64 {
    (ENTRY_HEADER as u64 + packet as u64).div_ceil(ALIGN) * ALIGN
}

/// What an entry says besides the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    /// The sender's address and port.
    pub(crate) from: SocketAddr,
    /// The local address it was sent to.
    pub(crate) to: IpAddr,
    /// The IPv4 ID its ICRC was computed over.
    pub(crate) ip_id: u16,
}

fn encode(meta: &Meta, len: usize) -> [u8; ENTRY_HEADER] {
    let mut h = [0u8; ENTRY_HEADER];
    h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[4..6].copy_from_slice(&meta.ip_id.to_le_bytes());
    h[6] = if meta.from.is_ipv4() { 4 } else { 6 };
    h[8..10].copy_from_slice(&meta.from.port().to_le_bytes());
    let ip16 = |ip: IpAddr| match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    h[12..28].copy_from_slice(&ip16(meta.from.ip()));
    h[28..44].copy_from_slice(&ip16(meta.to));
    h
}

fn decode(h: &[u8; ENTRY_HEADER]) -> Option<(usize, Meta)> {
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let ip_id = u16::from_le_bytes([h[4], h[5]]);
    let port = u16::from_le_bytes([h[8], h[9]]);
    let ip = |b: &[u8]| -> Option<IpAddr> {
        let a = Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?);
        match h[6] {
            4 => a.to_ipv4_mapped().map(IpAddr::V4),
            6 => Some(IpAddr::V6(a)),
            _ => None,
        }
    };
    let from = ip(&h[12..28])?;
    let to = ip(&h[28..44])?;
    Some((len, Meta { from: SocketAddr::new(from, port), to, ip_id }))
}

/// A claimed lane's writing end.
#[derive(Debug)]
pub(crate) struct Producer {
    lane: usize,
    /// Our tail: written entries, published or not.
    tail: u64,
    /// The consumer's head as last read.
    head: u64,
    /// The ring's `CHUNK`s we reserved (a bit each).
    reserved: u32,
    /// The ring filled up: the next chunk boundary reserves a chunk more
    /// instead of wrapping early (see `push`).
    grow: bool,
}

/// What [`Producer::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    Written,
    /// No room until the consumer reads on.
    Full,
    /// The tmpfs is full: this lane cannot grow (nothing was written).
    NoMemory,
}

impl Producer {
    /// Continues lane `lane` where its last producer stopped.
    pub(crate) fn claim(map: &Mapping, lane: usize) -> Self {
        let tail = map.tail(lane).load(Ordering::Acquire);
        Self { lane, tail, head: map.head(lane).load(Ordering::Acquire), reserved: 0, grow: false }
    }

    /// Reserves and maps the chunk that the next packet goes into, so that
    /// a sender's first packets pay no allocation or page fault (a lane is
    /// claimed when a QP is connected, before its traffic); false if the
    /// tmpfs is full.
    pub(crate) fn prepare(&mut self, file: &File, map: &Mapping) -> bool {
        self.reserve(file, map, self.tail, 1)
    }

    /// Free ring bytes, as far as we know (none if the consumer's head
    /// is not where a consumer's can be).
    fn room(&self) -> u64 {
        match self.tail.checked_sub(self.head) {
            Some(used) if used <= RING => RING - used,
            _ => 0,
        }
    }

    /// Whether the chunks under ring bytes `pos .. pos + len` are reserved.
    fn covers(&self, pos: u64, len: u64) -> bool {
        if self.reserved == ALL_CHUNKS {
            return true;
        }
        let (first, last) = ((pos % RING) / CHUNK, (pos % RING + len - 1) / CHUNK);
        (first..=last).all(|c| self.reserved & (1 << c) != 0)
    }

    /// Reserves the chunks under ring bytes `pos .. pos + len` and maps
    /// them into our page tables (one pass over the ring reserves them
    /// all; later passes cost nothing).
    fn reserve(&mut self, file: &File, map: &Mapping, pos: u64, len: u64) -> bool {
        // Once the whole ring is reserved (its first lap), nothing to do:
        // this runs twice per packet.
        if self.reserved == ALL_CHUNKS {
            return true;
        }
        let (first, last) = ((pos % RING) / CHUNK, (pos % RING + len - 1) / CHUNK);
        for c in first..=last {
            if self.reserved & (1 << c) == 0 {
                let off = ring_off(self.lane, c * CHUNK);
                if reserve(file, off, CHUNK).is_err() {
                    return false;
                }
                map.populate(off, CHUNK, true);
                self.reserved |= 1 << c;
                self.grow = false;
            }
        }
        true
    }

    /// Writes one entry (unpublished); `Full` if the ring has no room,
    /// `NoMemory` if the memory under it cannot be had.
    pub(crate) fn push(&mut self, file: &File, map: &Mapping, meta: &Meta, packet: &[u8]) -> Push {
        if packet.len() > MAX_PACKET {
            return Push::Full;
        }
        let need = entry_len(packet.len());
        let to_end = RING - self.tail % RING;
        let mut skip = if need > to_end { to_end } else { 0 };
        // (The entry and the 4 bytes after it, where a wrap marker may go
        // next: so a wrap never needs a chunk of its own.)
        if skip == 0
            && !self.grow
            && to_end < RING
            && self.covers(self.tail, 4)
            && !self.covers(self.tail, need + 4)
        {
            // The entry would reach memory not reserved yet: back to the
            // ring's start instead, if the consumer has read past the room
            // it needs there. A consumer that keeps up so keeps the ring
            // in its first chunk (reserved and mapped at the claim, warm
            // in cache); reserving and mapping a chunk costs 100-150 µs
            // here, a stall in the middle of a stream. The ring grows a
            // chunk each time it fills (bursts larger than it).
            self.head = map.head(self.lane).load(Ordering::Acquire);
            if self.room() >= to_end + need {
                skip = to_end;
            }
        }
        if self.room() < skip + need {
            self.head = map.head(self.lane).load(Ordering::Acquire);
            if self.room() < skip + need {
                self.grow = self.reserved != ALL_CHUNKS;
                return Push::Full;
            }
        }
        if !self.reserve(file, map, self.tail, 4)
            || !self.reserve(file, map, self.tail + skip, need)
        {
            return Push::NoMemory;
        }
        if skip > 0 {
            map.write(ring_off(self.lane, self.tail), &WRAP.to_le_bytes());
            self.tail += skip;
        }
        let at = ring_off(self.lane, self.tail);
        map.write(at, &encode(meta, packet.len()));
        map.write(at + ENTRY_HEADER as u64, packet);
        self.tail += need;
        Push::Written
    }

    /// Makes the written entries visible to the consumer.
    pub(crate) fn publish(&self, map: &Mapping) {
        map.tail(self.lane).store(self.tail, Ordering::Release);
    }
}

/// A lane's reading end (the inbox owner's).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Consumer {
    /// Our head.
    head: u64,
    /// The producer's tail as last read.
    tail: u64,
    /// The ring's `CHUNK`s mapped into our page tables (a bit each).
    mapped: u32,
}

/// Why [`Consumer::pop`] gave nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Empty {
    /// Nothing published.
    Idle,
    /// The lane broke the protocol; what it held was skipped.
    Broken,
}

impl Consumer {
    /// Starts reading lane `lane` at its current head.
    pub(crate) fn open(map: &Mapping, lane: usize) -> Self {
        let head = map.head(lane).load(Ordering::Acquire);
        Self { head, tail: head, mapped: 0 }
    }

    /// Whether a published entry waits (reads the shared tail).
    pub(crate) fn ready(&mut self, map: &Mapping, lane: usize) -> bool {
        self.tail = map.tail(lane).load(Ordering::Acquire);
        self.tail != self.head
    }

    /// The next packet, copied into `buf`: its length and what the entry
    /// says of it.
    pub(crate) fn pop(
        &mut self,
        map: &Mapping,
        lane: usize,
        buf: &mut [u8],
    ) -> Result<(usize, Meta), Empty> {
        loop {
            if self.head == self.tail && !self.ready(map, lane) {
                return Err(Empty::Idle);
            }
            let avail = self.tail.wrapping_sub(self.head);
            let at = ring_off(lane, self.head);
            self.map_chunk(map, lane);
            let mut h = [0u8; ENTRY_HEADER];
            let to_end = RING - self.head % RING;
            if !(4..=RING).contains(&avail) || !self.head.is_multiple_of(ALIGN) {
                return Err(self.skip(map, lane));
            }
            map.read(at, &mut h[..4.min(to_end as usize)]);
            if u32::from_le_bytes([h[0], h[1], h[2], h[3]]) == WRAP {
                if avail < to_end {
                    return Err(self.skip(map, lane));
                }
                self.head += to_end;
                continue;
            }
            if avail < ENTRY_HEADER as u64 || to_end < ENTRY_HEADER as u64 {
                return Err(self.skip(map, lane));
            }
            map.read(at, &mut h);
            let Some((len, meta)) = decode(&h) else { return Err(self.skip(map, lane)) };
            let need = entry_len(len);
            if len > MAX_PACKET || len > buf.len() || need > avail || need > to_end {
                return Err(self.skip(map, lane));
            }
            map.read(at + ENTRY_HEADER as u64, &mut buf[..len]);
            self.head += need;
            map.head(lane).store(self.head, Ordering::Release);
            return Ok((len, meta));
        }
    }

    /// Maps the chunk under our head at its first entry (or before, when
    /// idle: see `LocalPath::prepare_sleep`): its producer reserved it
    /// whole before writing there, or reserves it at its claim.
    pub(crate) fn map_chunk(&mut self, map: &Mapping, lane: usize) {
        if self.mapped == ALL_CHUNKS {
            return;
        }
        let c = (self.head % RING) / CHUNK;
        if self.mapped & (1 << c) == 0 {
            self.mapped |= 1 << c;
            map.populate(ring_off(lane, c * CHUNK), CHUNK, false);
        }
    }

    /// Drops everything the lane published (it broke the protocol).
    fn skip(&mut self, map: &Mapping, lane: usize) -> Empty {
        self.head = self.tail;
        map.head(lane).store(self.head, Ordering::Release);
        Empty::Broken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::from(a))
    }

    fn inbox() -> (File, Mapping, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "uroce-ring-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(FILE_LEN).unwrap();
        let m = Mapping::map(&f).unwrap();
        m.init();
        (f, m, path)
    }

    fn meta(i: u16) -> Meta {
        Meta { from: SocketAddr::new(v4([127, 0, 0, 2]), 4791), to: v4([127, 0, 0, 1]), ip_id: i }
    }

    #[test]
    fn entries_cross_the_ring_end_in_order_and_a_full_ring_refuses() {
        let (f, m, path) = inbox();
        let other = Mapping::map(&f).unwrap();
        assert!(other.valid());
        let mut p = Producer::claim(&m, 3);
        let mut c = Consumer::open(&other, 3);
        let mut buf = vec![0u8; MAX_PACKET];
        let mut sent = 0u32;
        let mut got = 0u32;
        // Sizes that do not divide the ring: the end is crossed many times.
        for round in 0..4000u32 {
            let len = 40 + (round as usize * 977) % 4200;
            let pkt: Vec<u8> = (0..len).map(|k| (k as u32 ^ sent) as u8).collect();
            if p.push(&f, &m, &meta(sent as u16), &pkt) == Push::Written {
                sent += 1;
            } else {
                assert!(p.room() < entry_len(len) * 2, "refused with room");
            }
            p.publish(&m);
            if round % 3 != 0 {
                while let Ok((n, mt)) = c.pop(&other, 3, &mut buf) {
                    assert_eq!(mt.ip_id, got as u16);
                    assert_eq!(mt, meta(got as u16));
                    assert!(buf[..n].iter().enumerate().all(|(k, b)| *b == (k as u32 ^ got) as u8));
                    got += 1;
                }
            }
        }
        while c.pop(&other, 3, &mut buf).is_ok() {
            got += 1;
        }
        assert_eq!(got, sent);
        drop(f);
        let _ = std::fs::remove_file(path);
    }

    /// A consumer that keeps up keeps its producer in the first chunk,
    /// lap after lap (nothing more reserved or mapped); one that stops
    /// lets the ring grow to its whole size, and the packets arrive in
    /// order either way.
    #[test]
    fn a_consumer_that_keeps_up_keeps_the_ring_in_its_first_chunk() {
        let (f, m, path) = inbox();
        let mut p = Producer::claim(&m, 2);
        assert!(p.prepare(&f, &m));
        assert_eq!(p.reserved, 1);
        let mut c = Consumer::open(&m, 2);
        let mut buf = vec![0u8; MAX_PACKET];
        let (mut sent, mut got) = (0u32, 0u32);
        let mut check = |c: &mut Consumer, got: &mut u32| {
            while let Ok((n, mt)) = c.pop(&m, 2, &mut buf) {
                assert_eq!((n, mt.ip_id), (40 + *got as usize % 200, *got as u16));
                *got += 1;
            }
        };
        let mut bytes = 0;
        while bytes < 10 * RING {
            let len = 40 + sent as usize % 200;
            assert_eq!(p.push(&f, &m, &meta(sent as u16), &vec![1u8; len]), Push::Written);
            p.publish(&m);
            bytes += entry_len(len);
            sent += 1;
            if sent.is_multiple_of(7) {
                check(&mut c, &mut got);
            }
        }
        check(&mut c, &mut got);
        assert_eq!((got, p.reserved, c.mapped), (sent, 1, 1));
        // A consumer that reads only after each burst of 4 MiB: each burst
        // fills the ring, and the ring grows a chunk each time.
        for burst in 1..=RING / CHUNK {
            let mut bytes = 0;
            while bytes < RING {
                let len = 40 + sent as usize % 200;
                if p.push(&f, &m, &meta(sent as u16), &vec![1u8; len]) != Push::Written {
                    break;
                }
                bytes += entry_len(len);
                sent += 1;
            }
            assert!(bytes >= (CHUNK * burst).min(RING) - 4096, "{bytes} after {burst} bursts");
            p.publish(&m);
            check(&mut c, &mut got);
        }
        assert_eq!(p.reserved, ALL_CHUNKS);
        assert_eq!(got, sent);
        drop(f);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_lying_producer_is_skipped_and_a_lying_consumer_refused() {
        let (f, m, path) = inbox();
        let mut p = Producer::claim(&m, 0);
        let mut c = Consumer::open(&m, 0);
        let mut buf = vec![0u8; 64];
        assert_eq!(p.push(&f, &m, &meta(1), &[7u8; 100]), Push::Written);
        p.publish(&m);
        // Bigger than the reader's buffer: skipped, not truncated.
        assert_eq!(c.pop(&m, 0, &mut buf), Err(Empty::Broken));
        assert_eq!(c.pop(&m, 0, &mut buf), Err(Empty::Idle));
        // A tail far beyond the ring.
        m.tail(0).store(u64::MAX / 2, Ordering::Release);
        assert_eq!(c.pop(&m, 0, &mut buf), Err(Empty::Broken));
        // A head ahead of the tail: the producer sees no room.
        m.head(0).store(u64::MAX, Ordering::Release);
        let mut p = Producer::claim(&m, 0);
        assert_eq!(p.push(&f, &m, &meta(2), &[1u8; 8]), Push::Full);
        // A garbage header.
        let mut p = Producer::claim(&m, 1);
        let mut c = Consumer::open(&m, 1);
        m.write(ring_off(1, 0), &[0xee; 64]);
        p.tail = 64;
        p.publish(&m);
        assert_eq!(c.pop(&m, 1, &mut buf), Err(Empty::Broken));
        drop(f);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn two_threads_move_a_million_packets_through_one_lane() {
        let (f, m, path) = inbox();
        let reader = Mapping::map(&f).unwrap();
        let n = 1_000_000u32;
        let t = std::thread::spawn(move || {
            let mut c = Consumer::open(&reader, 5);
            let mut buf = vec![0u8; MAX_PACKET];
            let mut next = 0u32;
            while next < n {
                if let Ok((len, mt)) = c.pop(&reader, 5, &mut buf) {
                    assert_eq!(len, 8 + (next as usize % 64));
                    assert_eq!(&buf[..4], &next.to_le_bytes());
                    assert_eq!(mt.ip_id, next as u16);
                    next += 1;
                }
            }
        });
        let mut p = Producer::claim(&m, 5);
        let mut pkt = [0u8; 72];
        let mut i = 0u32;
        while i < n {
            pkt[..4].copy_from_slice(&i.to_le_bytes());
            if p.push(&f, &m, &meta(i as u16), &pkt[..8 + (i as usize % 64)]) == Push::Written {
                i += 1;
                if i.is_multiple_of(16) {
                    p.publish(&m);
                }
            } else {
                p.publish(&m);
                std::thread::yield_now();
            }
        }
        p.publish(&m);
        t.join().unwrap();
        drop(f);
        let _ = std::fs::remove_file(path);
    }
}
