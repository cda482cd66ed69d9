//! UNSAFE ISLAND: one AF_XDP socket with its own UMEM: the frame area, the
//! four rings the kernel shares with us (fill, completion, RX, TX) and
//! their producer/consumer protocol. Everything else of the backend is
//! safe code over [`Xsk`]'s methods.
//!
//! Chunks are `FRAME` bytes; the first `RX_FRAMES` start in the fill ring
//! (the kernel copies received frames into them), the rest are free for
//! transmission and come back through the completion ring. A frame longer
//! than a chunk (RoCE MTU 4096 needs about 4.2 KB) spans several, each
//! descriptor but the last marked `XDP_PKT_CONTD`, when the kernel takes
//! the socket's `XDP_USE_SG` (Linux 6.6); without it, such frames are
//! the kernel's to drop (`XDP_STATISTICS`' rx_dropped).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes per UMEM chunk.
pub(crate) const FRAME: usize = 4096;
/// The longest frame received into one chunk: in copy mode the kernel
/// writes it past `XDP_PACKET_HEADROOM` (256 bytes).
pub(crate) const MAX_RX_FRAME: usize = FRAME - 256;
/// The longest frame taken or sent in several chunks (a 9000-byte jumbo
/// frame and more); a longer one is dropped whole.
pub(crate) const MAX_FRAME: usize = 3 * MAX_RX_FRAME;
/// Frames handed to the kernel for reception.
/// How long a queue may still hold the socket of a process that ended
/// (seen to take over 100 ms on a loaded machine).
const XSK_GONE_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);
const RX_FRAMES: u32 = 1024;
/// Frames for transmission.
const TX_FRAMES: u32 = 1024;
/// Ring sizes (powers of two).
const RING: u32 = 1024;

const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_STATISTICS: libc::c_int = 7;
const XDP_PGOFF_RX_RING: libc::off_t = 0;
const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;
/// `sxdp_flags`: copy mode (veth has no zero-copy).
const XDP_COPY: u16 = 1 << 1;
/// `sxdp_flags`: zero-copy mode (the driver's DMA into the UMEM).
const XDP_ZEROCOPY: u16 = 1 << 2;
/// `sxdp_flags`: frames may span chunks (multi-buffer).
const XDP_USE_SG: u16 = 1 << 4;
/// `SOL_SOCKET` options of busy polling (asm-generic/socket.h).
const SO_BUSY_POLL: libc::c_int = 46;
const SO_PREFER_BUSY_POLL: libc::c_int = 69;
const SO_BUSY_POLL_BUDGET: libc::c_int = 70;
/// `xdp_desc.options`: the frame goes on in the next descriptor.
const XDP_PKT_CONTD: u32 = 1;

#[repr(C)]
#[derive(Default)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct MmapOffsets {
    rx: RingOffset,
    tx: RingOffset,
    fr: RingOffset,
    cr: RingOffset,
}

#[repr(C)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
    flags: u32,
    tx_metadata_len: u32,
}

#[repr(C)]
struct SockaddrXdp {
    family: u16,
    flags: u16,
    ifindex: u32,
    queue_id: u32,
    shared_umem_fd: u32,
}

/// An RX or TX descriptor (`struct xdp_desc`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    options: u32,
}

/// One mapped ring: its producer and consumer indices and descriptors of
/// type `T` (`u64` frame addresses for fill/completion, `Desc` for RX/TX).
struct Ring<T> {
    map: *mut libc::c_void,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    descs: *mut T,
}

impl<T: Copy> Ring<T> {
    fn map(fd: RawFd, off: &RingOffset, pgoff: libc::off_t) -> io::Result<Self> {
        let map_len = off.desc as usize + RING as usize * size_of::<T>();
        // SAFETY: maps the ring the kernel set up for this socket at the
        // offset and length it gave; checked for failure.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let at = |o: u64| map.cast::<u8>().wrapping_add(o as usize);
        Ok(Self {
            map,
            map_len,
            producer: at(off.producer).cast(),
            consumer: at(off.consumer).cast(),
            descs: at(off.desc).cast(),
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: inside the live mapping, 4-byte aligned by the kernel.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as `producer`.
        unsafe { &*self.consumer }
    }

    /// Entries the kernel produced that we have not consumed, from index
    /// `at`.
    fn readable(&self) -> (u32, u32) {
        let at = self.consumer().load(Ordering::Relaxed);
        (at, self.producer().load(Ordering::Acquire).wrapping_sub(at))
    }

    fn read(&self, index: u32) -> T {
        // SAFETY: `index & (RING-1)` is inside the descriptor array.
        unsafe { self.descs.add((index & (RING - 1)) as usize).read_volatile() }
    }

    fn consume(&self, n: u32) {
        let at = self.consumer().load(Ordering::Relaxed);
        self.consumer().store(at.wrapping_add(n), Ordering::Release);
    }

    /// Room for entries we produce.
    fn writable(&self) -> (u32, u32) {
        let at = self.producer().load(Ordering::Relaxed);
        (at, RING - at.wrapping_sub(self.consumer().load(Ordering::Acquire)))
    }

    fn write(&self, index: u32, v: T) {
        // SAFETY: `index & (RING-1)` is inside the descriptor array, and
        // the kernel does not read it until the producer moves past it.
        unsafe { self.descs.add((index & (RING - 1)) as usize).write_volatile(v) }
    }

    fn produce(&self, n: u32) {
        let at = self.producer().load(Ordering::Relaxed);
        self.producer().store(at.wrapping_add(n), Ordering::Release);
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps our own mapping once.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// An AF_XDP socket bound to one queue of one interface, with its UMEM.
pub(crate) struct Xsk {
    // Rings before the socket and the area: unmapped first.
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<Desc>,
    tx: Ring<Desc>,
    fd: OwnedFd,
    /// The UMEM, unmapped after the rings and the socket (field order).
    area: Area,
    /// Transmit frames not in the kernel's hands.
    free_tx: Vec<u64>,
    /// TX descriptors written since the last kick.
    unkicked: u32,
    /// The kernel took `XDP_USE_SG`: frames may span chunks.
    multi_buffer: bool,
    /// Bound in zero-copy mode.
    zero_copy: bool,
    /// Busy polling is on (see `set_busy_poll`): an empty receive ring
    /// makes the kernel poll the driver.
    busy_poll: bool,
    /// Where a frame received in several chunks is put together
    /// (`MAX_FRAME` bytes, allocated once).
    joined: Vec<u8>,
}

// SAFETY: the raw pointers are into mappings owned by this value alone;
// it is used by one thread at a time (the backend sits in the driver's
// mutex).
unsafe impl Send for Xsk {}

impl std::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xsk").field("fd", &self.fd).finish_non_exhaustive()
    }
}

fn setsockopt<T>(fd: RawFd, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size passed.
    let r = unsafe {
        libc::setsockopt(fd, SOL_XDP, name, (v as *const T).cast(), size_of::<T>() as u32)
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// The privileged half of a socket, as the broker hands it over: the
/// AF_XDP socket bound to its queue, with its UMEM registered, and the
/// memfd that holds the UMEM (the rings are mapped by whoever uses it).
#[derive(Debug)]
pub(crate) struct Bound {
    pub(crate) sock: OwnedFd,
    pub(crate) umem: OwnedFd,
    /// The kernel took `XDP_USE_SG`: frames may span chunks.
    pub(crate) multi_buffer: bool,
    /// Bound in zero-copy mode.
    pub(crate) zero_copy: bool,
}

/// Asks for busy polling of socket `fd`'s queue: each receive check that
/// finds the ring empty then runs the driver's receive (NAPI) for up to
/// `usecs` µs on the calling thread instead of waiting for its interrupt
/// and softirq (`SO_PREFER_BUSY_POLL`, `SO_BUSY_POLL`, a budget of 64
/// frames). Needs `CAP_NET_ADMIN` (the broker has it).
fn set_busy_poll(fd: RawFd, usecs: u32) -> io::Result<()> {
    let usecs = libc::c_int::try_from(usecs).map_err(|_| io::ErrorKind::InvalidInput)?;
    for (name, v) in [(SO_PREFER_BUSY_POLL, 1), (SO_BUSY_POLL, usecs), (SO_BUSY_POLL_BUDGET, 64)] {
        // SAFETY: an int option of the size passed.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&raw const v).cast(),
                size_of::<libc::c_int>() as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Socket `fd`'s `SO_BUSY_POLL` (µs; 0: off).
fn busy_poll_of(fd: RawFd) -> u32 {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int option read into a live int of the length passed.
    let r = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, SO_BUSY_POLL, (&raw mut v).cast(), &raw mut len)
    };
    if r == 0 { v.max(0) as u32 } else { 0 }
}

/// Bytes of UMEM per socket.
const AREA_LEN: usize = (RX_FRAMES + TX_FRAMES) as usize * FRAME;

/// An AF_XDP socket on queue `queue` of interface `ifindex`, in copy
/// mode, its UMEM in a memfd (so that another process may map it: the
/// kernel pinned its pages at registration, whoever maps them). Needs
/// `CAP_NET_RAW`. A queue that still has another socket (`EBUSY`) is
/// waited on for `XSK_GONE_WITHIN`: the kernel lets go of an ended
/// process's socket in deferred work, after its descriptors are closed
/// (the caller attached the interface's program, so no live member of
/// the device has one).
pub(crate) fn bind(ifindex: u32, queue: u32, busy_poll: Option<u32>) -> io::Result<Bound> {
    // SAFETY: plain socket call; checked.
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: a NUL-terminated name and plain flags; checked.
    let mfd = unsafe { libc::memfd_create(c"uroce-umem".as_ptr(), libc::MFD_CLOEXEC) };
    if mfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nobody else owns.
    let umem = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(mfd) });
    umem.set_len(AREA_LEN as u64)?;
    let area = Area::map(umem.as_raw_fd())?;
    let reg = UmemReg {
        addr: area.ptr as u64,
        len: AREA_LEN as u64,
        chunk_size: FRAME as u32,
        headroom: 0,
        flags: 0,
        tx_metadata_len: 0,
    };
    // Registration pins the pages: our mapping may go after it.
    setsockopt(raw, XDP_UMEM_REG, &reg)?;
    drop(area);
    for name in [XDP_UMEM_FILL_RING, XDP_UMEM_COMPLETION_RING, XDP_RX_RING, XDP_TX_RING] {
        setsockopt(raw, name, &RING)?;
    }
    let start = std::time::Instant::now();
    let bind = |flags: u16| loop {
        let sa = SockaddrXdp {
            family: libc::AF_XDP as u16,
            flags,
            ifindex,
            queue_id: queue,
            shared_umem_fd: 0,
        };
        // SAFETY: a live sockaddr_xdp of the size passed.
        let r = unsafe { libc::bind(raw, (&raw const sa).cast(), size_of::<SockaddrXdp>() as u32) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // The queue still has the socket of a process that ended.
        if e.raw_os_error() != Some(libc::EBUSY) || start.elapsed() >= XSK_GONE_WITHIN {
            return Err(e);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // Zero-copy where the driver has it (veth has not), then copy mode;
    // multi-buffer where the kernel (6.6) and driver have it. A mode
    // refused is EOPNOTSUPP or EINVAL; `UROCE_XDP_COPY=1` skips zero-copy.
    let copy_only = std::env::var_os("UROCE_XDP_COPY").is_some_and(|v| v != "0");
    let modes = [
        (XDP_ZEROCOPY | XDP_USE_SG, true, true),
        (XDP_ZEROCOPY, true, false),
        (XDP_COPY | XDP_USE_SG, false, true),
        (XDP_COPY, false, false),
    ];
    let mut last = io::Error::from(io::ErrorKind::Unsupported);
    for (flags, zero_copy, multi_buffer) in modes {
        if zero_copy && copy_only {
            continue;
        }
        match bind(flags) {
            Ok(()) => {
                if let Some(us) = busy_poll {
                    set_busy_poll(raw, us)?;
                }
                return Ok(Bound { sock, umem: umem.into(), multi_buffer, zero_copy });
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// A shared mapping of a UMEM memfd.
struct Area {
    ptr: *mut u8,
}

impl Area {
    fn map(fd: RawFd) -> io::Result<Self> {
        // SAFETY: a shared mapping of a memfd of `AREA_LEN` bytes (its
        // size checked or set by the caller); checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                AREA_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { ptr: p.cast() })
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), AREA_LEN) };
    }
}

impl Xsk {
    /// Maps a bound socket's UMEM and rings (no privilege needed: the
    /// broker's sockets are used this way) and hands the kernel every
    /// receive chunk.
    pub(crate) fn attach(b: Bound) -> io::Result<Self> {
        let umem = std::fs::File::from(b.umem);
        if umem.metadata()?.len() != AREA_LEN as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a UMEM of another size"));
        }
        let area = Area::map(umem.as_raw_fd())?;
        let raw = b.sock.as_raw_fd();
        let mut off = MmapOffsets::default();
        let mut len = size_of::<MmapOffsets>() as u32;
        // SAFETY: `off` is a live buffer of `len` bytes.
        let r = unsafe {
            libc::getsockopt(raw, SOL_XDP, XDP_MMAP_OFFSETS, (&raw mut off).cast(), &mut len)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let x = Self {
            fill: Ring::<u64>::map(raw, &off.fr, XDP_UMEM_PGOFF_FILL_RING)?,
            comp: Ring::<u64>::map(raw, &off.cr, XDP_UMEM_PGOFF_COMPLETION_RING)?,
            rx: Ring::<Desc>::map(raw, &off.rx, XDP_PGOFF_RX_RING)?,
            tx: Ring::<Desc>::map(raw, &off.tx, XDP_PGOFF_TX_RING)?,
            fd: b.sock,
            area,
            free_tx: (RX_FRAMES..RX_FRAMES + TX_FRAMES)
                .map(|i| u64::from(i) * FRAME as u64)
                .collect(),
            unkicked: 0,
            multi_buffer: b.multi_buffer,
            zero_copy: b.zero_copy,
            busy_poll: busy_poll_of(raw) > 0,
            joined: Vec::with_capacity(MAX_FRAME),
        };
        // Every receive chunk into the fill ring.
        let (at, room) = x.fill.writable();
        let n = RX_FRAMES.min(room);
        for i in 0..n {
            x.fill.write(at.wrapping_add(i), u64::from(i) * FRAME as u64);
        }
        x.fill.produce(n);
        Ok(x)
    }

    /// Whether frames may span chunks (the kernel took `XDP_USE_SG`).
    pub(crate) fn multi_buffer(&self) -> bool {
        self.multi_buffer
    }

    /// Whether the socket runs in zero-copy mode.
    pub(crate) fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The kernel's counters of this socket (`XDP_STATISTICS`): frames
    /// dropped, invalid RX and TX descriptors, RX ring full, fill ring
    /// empty, TX ring empty.
    pub(crate) fn statistics(&self) -> [u64; 6] {
        let mut st = [0u64; 6];
        let mut len = size_of_val(&st) as u32;
        // SAFETY: `st` is a live buffer of `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                self.raw_fd(),
                SOL_XDP,
                XDP_STATISTICS,
                st.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r < 0 { [0; 6] } else { st }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The frame at UMEM address `addr`, `len` bytes, if that is inside
    /// the UMEM (the kernel only gives such; an empty frame otherwise).
    fn frame(&self, addr: u64, len: usize) -> &[u8] {
        let (a, l) = (addr as usize, len.min(FRAME));
        if a.checked_add(l).is_none_or(|end| end > AREA_LEN) {
            return &[];
        }
        // SAFETY: inside our mapping (checked); the kernel wrote it before
        // producing the descriptor and does not touch it until we give
        // the frame back through the fill ring.
        unsafe { std::slice::from_raw_parts(self.area.ptr.add(a), l) }
    }

    /// Calls `f` with the next received frame, if one waits, then gives
    /// its chunks back to the kernel. `None`: nothing received. A frame in
    /// several chunks is put together first (the kernel produces its
    /// descriptors at once; one whose last has not come is left for the
    /// next call); one longer than `MAX_FRAME` is handed over empty.
    pub(crate) fn recv<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let (mut at, mut n) = self.rx.readable();
        if n == 0 && self.busy_poll {
            self.poll_driver();
            (at, n) = self.rx.readable();
        }
        if n == 0 {
            return None;
        }
        let d = self.rx.read(at);
        if d.options & XDP_PKT_CONTD == 0 {
            // In copy mode the data starts past a headroom inside its
            // chunk; the chunk goes back whole.
            let r = f(self.frame(d.addr, d.len as usize));
            self.give_back(at, 1);
            return Some(r);
        }
        let mut count = 1;
        while count < n && self.rx.read(at.wrapping_add(count - 1)).options & XDP_PKT_CONTD != 0 {
            count += 1;
        }
        let complete = self.rx.read(at.wrapping_add(count - 1)).options & XDP_PKT_CONTD == 0;
        if !complete && n < RING {
            return None;
        }
        let mut joined = std::mem::take(&mut self.joined);
        joined.clear();
        let mut fits = complete;
        for i in 0..count {
            let d = self.rx.read(at.wrapping_add(i));
            let piece = self.frame(d.addr, d.len as usize);
            fits &= joined.len() + piece.len() <= MAX_FRAME;
            if fits {
                joined.extend_from_slice(piece);
            }
        }
        let r = f(if fits { &joined } else { &[] });
        self.joined = joined;
        self.give_back(at, count);
        Some(r)
    }

    /// Busy polling: a receive call with no buffer runs the driver's
    /// receive for the socket's queue on this thread.
    fn poll_driver(&self) {
        // SAFETY: no buffer: `recvfrom` with a NULL pointer and length 0
        // is how AF_XDP busy polling is driven.
        unsafe {
            libc::recvfrom(
                self.raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }

    /// Consumes `count` RX descriptors from `at` and puts their chunks
    /// back into the fill ring (always room: it holds every receive
    /// chunk).
    fn give_back(&mut self, at: u32, count: u32) {
        let (fat, room) = self.fill.writable();
        for i in 0..count.min(room) {
            let d = self.rx.read(at.wrapping_add(i));
            self.fill.write(fat.wrapping_add(i), d.addr & !(FRAME as u64 - 1));
        }
        self.rx.consume(count);
        self.fill.produce(count.min(room));
    }

    /// Takes back transmit frames the kernel has sent.
    fn reclaim(&mut self) {
        let (at, n) = self.comp.readable();
        for i in 0..n {
            self.free_tx.push(self.comp.read(at.wrapping_add(i)));
        }
        self.comp.consume(n);
    }

    /// Queues the frame `fill` writes into a frame buffer (returning its
    /// length, or `None` to send nothing); `false` when no frame or ring
    /// slot is free.
    pub(crate) fn send(&mut self, fill: impl FnOnce(&mut [u8]) -> Option<usize>) -> bool {
        if self.free_tx.is_empty() {
            self.reclaim();
        }
        let (at, room) = self.tx.writable();
        if room == 0 {
            return false;
        }
        let Some(addr) = self.free_tx.pop() else { return false };
        // SAFETY: a transmit frame of ours inside the mapping, not in the
        // kernel's hands (it came from the free list).
        let buf =
            unsafe { std::slice::from_raw_parts_mut(self.area.ptr.add(addr as usize), FRAME) };
        let Some(len) = fill(buf).filter(|&n| n <= FRAME) else {
            self.free_tx.push(addr);
            return true; // nothing to send: not a lack of room
        };
        self.tx.write(at, Desc { addr, len: len as u32, options: 0 });
        self.tx.produce(1);
        self.unkicked += 1;
        true
    }

    /// Queues `frame`, longer than a chunk, in as many chunks as it takes
    /// (multi-buffer sockets only); `false` when chunks or ring slots run
    /// short.
    pub(crate) fn send_joined(&mut self, frame: &[u8]) -> bool {
        let pieces = frame.len().div_ceil(FRAME) as u32;
        if !self.multi_buffer || frame.len() > MAX_FRAME {
            return false;
        }
        if self.free_tx.len() < pieces as usize {
            self.reclaim();
        }
        let (at, room) = self.tx.writable();
        if room < pieces || self.free_tx.len() < pieces as usize {
            return false;
        }
        for (i, piece) in frame.chunks(FRAME).enumerate() {
            let Some(addr) = self.free_tx.pop() else { return false };
            // SAFETY: a transmit chunk of ours inside the mapping, not in
            // the kernel's hands (it came from the free list); `piece` is
            // at most a chunk long.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    self.area.ptr.add(addr as usize),
                    piece.len(),
                );
            }
            let last = i as u32 + 1 == pieces;
            let options = if last { 0 } else { XDP_PKT_CONTD };
            self.tx
                .write(at.wrapping_add(i as u32), Desc { addr, len: piece.len() as u32, options });
        }
        self.tx.produce(pieces);
        self.unkicked += pieces;
        true
    }

    /// Tells the kernel to transmit what was queued (copy mode always needs
    /// it), then takes back what it already sent.
    /// In copy mode one call sends at most 32 frames (the kernel's
    /// `TX_BATCH_SIZE`) and says `EAGAIN` when more wait: it is called
    /// until the ring is empty (or the device pushes back for long).
    pub(crate) fn kick(&mut self) {
        if self.unkicked > 0 {
            self.unkicked = 0;
            for _ in 0..RING / 16 {
                // SAFETY: no buffer: `sendto` with a NULL pointer and
                // length 0 is how AF_XDP is told to look at its TX ring.
                let r = unsafe {
                    libc::sendto(
                        self.raw_fd(),
                        std::ptr::null(),
                        0,
                        libc::MSG_DONTWAIT,
                        std::ptr::null(),
                        0,
                    )
                };
                let busy = r < 0
                    && matches!(
                        io::Error::last_os_error().raw_os_error(),
                        Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS)
                    );
                let (_, room) = self.tx.writable();
                if room == RING || (r < 0 && !busy) {
                    break;
                }
            }
        }
        self.reclaim();
    }
}
