//! The local path: RoCE packets between uroce contexts of one host (one
//! network namespace, one user) go through shared memory instead of the
//! kernel's UDP, chosen per destination without configuration.
//!
//! Each `udp` context owns an *inbox*, a file in `/dev/shm` named by its
//! address and slot (`share`; a context alone on its address, as with
//! `UROCE_EXCLUSIVE`, has slot 0's), whose first byte it holds an OFD lock on while it
//! lives. A sender looks a destination up by the packet's address and the
//! slot in its destination QPN's top bits (the slot that owns the QPN):
//! if that inbox exists and its owner lives, the sender claims a lane in
//! it (an OFD lock on the lane's byte: a lane has one writer at a time,
//! and a dead writer's lane is free again) and writes packets there;
//! otherwise the packet takes the kernel as before. The packets are the
//! same RoCE packets, and the receiver is told the addresses a UDP
//! receiver would have seen, so the driver treats them like any other,
//! except for the ICRC: memory does not corrupt packets, so the sender
//! computes none and the receiver checks none (a fifth of the CPU time of
//! a bulk transfer; a local process that means harm could compute one
//! anyway). Multicast, the CM's MADs (QPN 1) and the sharing
//! group's probes stay on UDP.
//!
//! Waking a sleeping receiver: its progress thread raises a flag in the
//! inbox before it sleeps on its sockets and looks at its lanes once more;
//! a sender that finds the flag up after publishing clears it and sends a
//! 16-byte doorbell datagram to the receiver's address (steered to its
//! socket by the QPN it names), which the receiver's socket swallows. So
//! a busy pair makes no system call per packet, and a sleeping one pays
//! one datagram per wake-up.
//!
//! Routes are checked again every `RECHECK`: a receiver that died (its
//! lock gone) or was replaced (another file at the name) is dropped, and
//! its destinations go back to UDP until a live inbox is found.

#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod ring;

use std::fs::{File, OpenOptions};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering, fence};

use uroce_transport::fastmap::FastMap;

use super::share::{self, same_file};
use crate::ofd_lock;
use ring::{Consumer, Empty, LANES, Mapping, Meta, Producer, Push};

/// How often routes and lanes are checked for dead owners.
const RECHECK_NS: u64 = 100_000_000;
/// The most packet bytes a sender keeps behind one full lane.
const MAX_BACKLOG: usize = 16 << 20;
/// A backlog that has not moved for this long (its receiver stopped
/// reading) is dropped: the transport resends what needs resending.
const BACKLOG_STUCK_NS: u64 = 1_000_000_000;
/// The byte whose lock the inbox's owner holds; lane `i`'s is `1 + i`.
const OWNER_BYTE: u64 = 0;
/// A doorbell: a BTH-shaped header (opcode 0xff, manufacturer specific;
/// the destination QPN where the group's steering reads it) and a tag.
const DOORBELL_LEN: usize = 16;
const DOORBELL_TAG: [u8; 8] = *b"uroce-db";

/// The doorbell datagram for the context that owns `qpn`, with the CPU
/// the sender runs on in its second byte (255: unknown): the receiver's
/// progress thread, which the kernel wakes on that CPU, moves off it if
/// another is idle (see `progress`).
pub(crate) fn doorbell(qpn: u32) -> [u8; DOORBELL_LEN] {
    let mut d = [0u8; DOORBELL_LEN];
    d[0] = 0xff;
    d[1] = u8::try_from(crate::sched::current_cpu()).unwrap_or(u8::MAX);
    d[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
    d[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    d[8..].copy_from_slice(&DOORBELL_TAG);
    d
}

/// Whether a received datagram is a doorbell (it carries nothing).
pub(crate) fn is_doorbell(d: &[u8]) -> bool {
    d.len() == DOORBELL_LEN && d[0] == 0xff && d[8..] == DOORBELL_TAG
}

/// The CPU a doorbell's sender ran on, if it said.
pub(crate) fn doorbell_cpu(d: &[u8]) -> Option<u64> {
    d.get(1).filter(|&&c| c != u8::MAX).map(|&c| u64::from(c))
}

/// Whether the local path may be used (`UROCE_NO_SHM` turns it off, for
/// captures and for measuring the kernel path).
pub(crate) fn enabled() -> bool {
    std::env::var_os("UROCE_NO_SHM").is_none()
}

/// Where inboxes live: tmpfs, so that their pages are memory only.
fn inbox_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { crate::published::run_dir() }
}

/// The prefix of every inbox of this run directory (the user's, or the
/// one `UROCE_RUN_DIR` names: contexts that do not share a run directory
/// do not see each other's inboxes either).
fn inbox_prefix() -> String {
    let run = crate::published::run_dir();
    let mut h: u32 = 0x811c_9dc5;
    for b in run.as_os_str().as_encoded_bytes() {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    format!("uroce-{h:08x}-")
}

/// Whether `name` is an inbox's (of any run directory): `uroce-`, the
/// 8-digit hash, `-`, a kind's prefix (see [`Kind`]), `share-`.
fn is_inbox_name(name: &str) -> bool {
    name.strip_prefix("uroce-").is_some_and(|rest| {
        rest.len() > 8
            && rest.as_bytes()[..8].iter().all(u8::is_ascii_hexdigit)
            && [Kind::Udp, Kind::Dpdk].iter().any(|k| {
                rest[8..]
                    .strip_prefix('-')
                    .and_then(|r| r.strip_prefix(k.prefix()))
                    .is_some_and(|r| r.starts_with("share-"))
            })
    })
}

/// Which contexts' inboxes a local path sees. The `udp` backend's reach
/// any context of the host by address; a DPDK device's are its own
/// members' only (frames to the device's own address cannot leave its
/// port and come back), and stay out of the `udp` contexts' sight, so
/// that traffic between a DPDK device and another address keeps to its
/// port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Udp,
    Dpdk,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Self::Udp => "",
            Self::Dpdk => "dpdk-",
        }
    }
}

/// The lanes whose bits `mask` has, in order (one step per set bit).
fn lanes_in(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        let lane = (mask != 0).then(|| mask.trailing_zeros() as usize)?;
        mask &= mask - 1;
        Some(lane)
    })
}

/// The inbox of the context of kind `kind` holding slot `slot` of the
/// device at `addr`.
fn inbox_path(dir: &Path, kind: Kind, addr: SocketAddr, slot: usize) -> PathBuf {
    let table = share::path_of(addr);
    let name = table.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dir.join(format!("{}{}{name}.{slot}", inbox_prefix(), kind.prefix()))
}

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// Counters of the local path (`uroce stat`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    pub(crate) sent: u64,
    pub(crate) received: u64,
    pub(crate) doorbells: u64,
    /// Packets lost to a full lane: a backlog at its bound, or dropped
    /// when its receiver stopped reading (resent by the transport).
    pub(crate) full: u64,
    /// Lanes that broke the ring's rules (their packets dropped).
    pub(crate) broken: u64,
    /// Lanes whose senders went and whose memory was given back.
    pub(crate) released: u64,
    /// Times a lane could not grow (a full tmpfs): UDP took over.
    pub(crate) no_memory: u64,
}

impl Counters {
    /// Adds these to the device's counters (`local_*`).
    pub(crate) fn add_to(&self, stats: &mut uroce_transport::Stats) {
        stats.local_sent_pkts += self.sent;
        stats.local_rcvd_pkts += self.received;
        stats.local_doorbells += self.doorbells;
        stats.local_lane_full += self.full;
        stats.local_lane_broken += self.broken;
        stats.local_lane_released += self.released;
        stats.local_no_memory += self.no_memory;
    }
}

/// What [`LocalPath::send`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// The destination has no live inbox here: use UDP.
    NotLocal,
    /// Written, or queued behind a full lane; `Some(qpn)`: the receiver
    /// sleeps, ring its doorbell.
    Written(Option<u32>),
    /// The lane is full and its backlog at its bound: the packets are
    /// lost (the transport resends).
    Full,
}

/// This context's inbox.
#[derive(Debug)]
struct Inbox {
    /// Holds the owner lock.
    file: File,
    path: PathBuf,
    map: Mapping,
    lanes: [Consumer; LANES],
    /// The local addresses packets may be sent to, and the other names
    /// (links) of the file: one per secondary address in use.
    addr: IpAddr,
    aliases: Vec<(IpAddr, PathBuf)>,
}

impl Inbox {
    /// Creates the inbox of slot `slot` at `local` (replacing a dead
    /// owner's), after removing the inboxes whose owners are gone.
    fn create(dir: &Path, kind: Kind, local: SocketAddr, slot: usize) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        sweep(dir);
        let path = inbox_path(dir, kind, local, slot);
        let tmp = crate::published::with_suffix(&path, &format!(".new{}", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        let made = (|| {
            ofd_lock::lock(&file, OWNER_BYTE)?;
            file.set_len(ring::FILE_LEN)?;
            ring::reserve_header(&file)?;
            let map = Mapping::map(&file)?;
            map.init();
            std::fs::rename(&tmp, &path)?;
            Ok(map)
        })();
        let map = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let lanes = std::array::from_fn(|i| Consumer::open(&map, i));
        Ok(Self { file, path, map, lanes, addr: local.ip(), aliases: Vec::new() })
    }
}

impl Inbox {
    fn takes(&self, to: IpAddr) -> bool {
        to == self.addr || self.aliases.iter().any(|(a, _)| *a == to)
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        let names = std::iter::once(&self.path).chain(self.aliases.iter().map(|(_, p)| p));
        for p in names {
            if same_file(&self.file, p) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Removes the inboxes whose owners are gone: a SIGKILLed context leaves
/// its file behind. Every run directory's, not only this one's: a test or
/// a tool with a run directory of its own may never make an inbox again,
/// and an inbox nobody holds the owner lock of is dead whoever made it
/// (other users' inboxes are 0600: not opened, left alone).
fn sweep(dir: &Path) {
    let Ok(dir) = std::fs::read_dir(dir) else { return };
    for e in dir.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !is_inbox_name(&name) {
            continue;
        }
        // An inbox being made is locked only a moment after its file
        // appears: a fresh one is left to its maker.
        let fresh = e.metadata().ok().and_then(|m| m.modified().ok()).is_some_and(|t| {
            t.elapsed().map_or(true, |age| age < std::time::Duration::from_secs(60))
        });
        if name.contains(".new") && fresh {
            continue;
        }
        if let Ok(f) = open_rw(&e.path())
            && !ofd_lock::held_by_other(&f, OWNER_BYTE)
            && same_file(&f, &e.path())
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A lane claimed in another context's inbox.
#[derive(Debug)]
struct Outbox {
    /// Holds the lane's lock.
    file: File,
    path: PathBuf,
    map: Mapping,
    producer: Producer,
    /// Packets the full lane could not take yet, in order (their bytes in
    /// `backlog_bytes`): memory is a lossless link, as RoCE expects of its
    /// fabric, so a receiver that falls behind slows its sender instead of
    /// losing packets (UC, UD and RC alike). Bounded by `MAX_BACKLOG`.
    backlog: std::collections::VecDeque<(Meta, std::ops::Range<usize>)>,
    backlog_bytes: Vec<u8>,
    /// When the backlog last moved (or began), for a receiver that stopped.
    backlog_moved_ns: Option<u64>,
}

/// What [`Outbox::drain`] met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    /// The backlog is empty.
    All,
    /// The lane filled again.
    Partly,
    /// The tmpfs is full.
    NoMemory,
}

impl Outbox {
    /// Claims a free lane of the live inbox at `path`, if there is one.
    fn open(path: PathBuf) -> Option<Self> {
        let file = open_rw(&path).ok()?;
        let map = Mapping::map(&file).ok()?;
        if !map.valid() || !ofd_lock::held_by_other(&file, OWNER_BYTE) {
            return None;
        }
        let lane = (0..LANES).find(|l| ofd_lock::lock(&file, 1 + *l as u64).is_ok())?;
        if ring::reserve_lane_header(&file, lane).is_err() {
            // A full tmpfs: UDP it is (the lock goes with the file).
            return None;
        }
        map.active().fetch_or(1 << lane, Ordering::SeqCst);
        let mut producer = Producer::claim(&map, lane);
        if !producer.prepare(&file, &map) {
            return None;
        }
        Some(Self {
            file,
            path,
            map,
            producer,
            backlog: std::collections::VecDeque::new(),
            backlog_bytes: Vec::new(),
            backlog_moved_ns: None,
        })
    }

    /// Writes what waits in the backlog while the lane has room: how many
    /// packets it wrote, and what stopped it.
    fn drain(&mut self) -> (u64, Drained) {
        let mut written = 0;
        while let Some((meta, r)) = self.backlog.front() {
            let pkt = &self.backlog_bytes[r.clone()];
            match self.producer.push(&self.file, &self.map, meta, pkt) {
                Push::Written => {
                    written += 1;
                    self.backlog.pop_front();
                }
                Push::Full => return (written, Drained::Partly),
                Push::NoMemory => return (written, Drained::NoMemory),
            }
        }
        self.backlog_bytes.clear();
        (written, Drained::All)
    }

    /// Queues a packet behind the full lane; false if the backlog is at
    /// its bound (the packet is lost, as a full switch buffer loses it).
    fn queue(&mut self, meta: Meta, pkt: &[u8]) -> bool {
        if self.backlog_bytes.len() + pkt.len() > MAX_BACKLOG {
            return false;
        }
        let at = self.backlog_bytes.len();
        self.backlog_bytes.extend_from_slice(pkt);
        self.backlog.push_back((meta, at..at + pkt.len()));
        true
    }

    /// Tells the receiver about what was written; whether it sleeps and
    /// must be woken (its flag taken down).
    fn publish(&self) -> bool {
        self.producer.publish(&self.map);
        // The tail's store before the flag's load (the receiver raises the
        // flag, then looks at the tails: one of us sees the other).
        fence(Ordering::SeqCst);
        let sleeping = self.map.sleeping();
        sleeping.load(Ordering::Relaxed) != 0 && sleeping.swap(0, Ordering::SeqCst) != 0
    }

    fn alive(&self) -> bool {
        ofd_lock::held_by_other(&self.file, OWNER_BYTE) && same_file(&self.file, &self.path)
    }
}

/// A destination (address, slot) and what reaches it.
type RouteKey = (SocketAddr, u8);

/// The slot owning QPN `qpn`, for the local path: none for the CM's QP1
/// (its MADs are steered by their contents: the caller names the slot)
/// and for multicast.
fn slot_of(dst: SocketAddr, qpn: u32) -> Option<u8> {
    (qpn > 1 && !dst.ip().is_multicast()).then_some((qpn >> share::QPN_SHIFT) as u8)
}

/// The lane to the context of kind `kind` holding slot `slot` at `dst`,
/// found (or found missing) on first use.
fn route<'a>(
    dir: &Path,
    kind: Kind,
    routes: &'a mut FastMap<RouteKey, Option<Outbox>>,
    dst: SocketAddr,
    slot: u8,
) -> Option<&'a mut Outbox> {
    routes
        .entry((dst, slot))
        .or_insert_with(|| Outbox::open(inbox_path(dir, kind, dst, usize::from(slot))))
        .as_mut()
}

/// One context's local path: its inbox and its lanes in others'.
#[derive(Debug)]
pub(crate) struct LocalPath {
    /// Where inboxes are (`/dev/shm`).
    dir: PathBuf,
    kind: Kind,
    inbox: Inbox,
    routes: FastMap<RouteKey, Option<Outbox>>,
    checked_ns: u64,
    /// The lane `recv` looks at first (no lane starves).
    next_lane: usize,
    /// Some route has a backlog (see `Outbox::backlog`).
    backlogged: bool,
    counters: Counters,
}

impl LocalPath {
    /// The local path of the context holding slot `slot` at `local`.
    pub(crate) fn new(local: SocketAddr, slot: usize) -> io::Result<Self> {
        Self::new_in(inbox_dir(), Kind::Udp, local, slot)
    }

    /// The local path between the members of a DPDK device (see [`Kind`]).
    #[cfg(any(test, feature = "dpdk"))]
    pub(crate) fn for_dpdk(local: SocketAddr, slot: usize) -> io::Result<Self> {
        Self::new_in(inbox_dir(), Kind::Dpdk, local, slot)
    }

    /// [`LocalPath::new`] with the inboxes in `dir`.
    fn new_in(dir: PathBuf, kind: Kind, local: SocketAddr, slot: usize) -> io::Result<Self> {
        Ok(Self {
            inbox: Inbox::create(&dir, kind, local, slot)?,
            dir,
            kind,
            routes: FastMap::default(),
            checked_ns: 0,
            next_lane: 0,
            backlogged: false,
            counters: Counters::default(),
        })
    }

    /// Receives at another local address too (a secondary GID the
    /// context bound, holding slot `slot` of its group): the inbox gets a
    /// second name there, replacing a dead owner's file.
    pub(crate) fn add_address(&mut self, addr: SocketAddr, slot: usize) -> io::Result<()> {
        if self.inbox.takes(addr.ip()) {
            return Ok(());
        }
        let name = inbox_path(&self.dir, self.kind, addr, slot);
        let tmp = crate::published::with_suffix(&name, &format!(".new{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::fs::hard_link(&self.inbox.path, &tmp)?;
        if let Err(e) = std::fs::rename(&tmp, &name) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        self.inbox.aliases.push((addr.ip(), name));
        Ok(())
    }

    /// Stops receiving at a secondary address.
    pub(crate) fn remove_address(&mut self, ip: IpAddr) {
        if let Some(i) = self.inbox.aliases.iter().position(|(a, _)| *a == ip) {
            let (_, name) = self.inbox.aliases.swap_remove(i);
            if same_file(&self.inbox.file, &name) {
                let _ = std::fs::remove_file(name);
            }
        }
    }

    /// The counters so far.
    pub(crate) fn counters(&self) -> Counters {
        self.counters
    }

    /// Sends a packet, or a run of `seg`-byte packets, from `from` to `dst`
    /// through memory if `dst` is a context on this host. Packet `i` of a
    /// run is marked with IPv4 ID `i`, as the kernel's segmentation would.
    pub(crate) fn send(
        &mut self,
        from: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
    ) -> Sent {
        let qpn = super::dest_qpn(data);
        match slot_of(dst, qpn) {
            Some(slot) => self.send_to_slot(from, dst, data, seg, (dst, slot)),
            None => Sent::NotLocal,
        }
    }

    /// [`LocalPath::send`] to `dst` through the inbox of the context
    /// holding slot `at.1` of the device at `at.0`, whatever QPN the
    /// packets name: the CM's MADs (steered by their contents), and a
    /// DPDK member's datagrams to a group (`dst`) for the device's other
    /// members.
    pub(crate) fn send_to_slot(
        &mut self,
        from: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
        seg: usize,
        at: (SocketAddr, u8),
    ) -> Sent {
        let qpn = super::dest_qpn(data);
        let (device, slot) = at;
        let Some(out) = route(&self.dir, self.kind, &mut self.routes, device, slot) else {
            return Sent::NotLocal;
        };
        let mut written = 0;
        let mut no_memory = false;
        // Packets queued behind a full lane go first: order is kept.
        if !out.backlog.is_empty() {
            let (w, d) = out.drain();
            written += w;
            no_memory = d == Drained::NoMemory;
        }
        let (mut queued, mut dropped) = (0u64, 0u64);
        for (i, pkt) in data.chunks(seg.max(1)).enumerate() {
            let meta = Meta { from, to: dst.ip(), ip_id: i as u16 };
            if no_memory {
                break;
            }
            if out.backlog.is_empty() {
                match out.producer.push(&out.file, &out.map, &meta, pkt) {
                    Push::Written => {
                        written += 1;
                        continue;
                    }
                    Push::Full => {}
                    Push::NoMemory => {
                        no_memory = true;
                        break;
                    }
                }
            }
            if out.queue(meta, pkt) {
                queued += 1;
            } else {
                dropped += 1;
            }
        }
        let wake = written > 0 && out.publish();
        if queued > 0 && !self.backlogged {
            self.backlogged = true;
        }
        self.counters.sent += written;
        self.counters.full += dropped;
        if no_memory {
            // The tmpfs is full: this destination takes UDP until the next
            // check, and what waited for the lane is lost. (These packets
            // were built without an ICRC, so the receiver drops them and
            // the transport resends them.)
            self.counters.no_memory += 1;
            self.counters.full += out.backlog.len() as u64;
            self.routes.insert((device, slot), None);
            return if written > 0 { Sent::Written(None) } else { Sent::NotLocal };
        }
        if wake {
            self.counters.doorbells += 1;
            crate::timeline::event("doorbell", u64::from(qpn), 0);
        }
        if written == 0 && queued == 0 {
            return Sent::Full;
        }
        Sent::Written(wake.then_some(qpn))
    }

    /// Moves the senders' backlogs into their lanes as the receivers read
    /// on (every progress pass, while any waits); `wake` is called for a
    /// receiver that sleeps. A backlog that has not moved for
    /// `BACKLOG_STUCK_NS` is dropped.
    fn drain_backlogs(&mut self, now_ns: u64, wake: &mut dyn FnMut(SocketAddr, u32)) {
        let mut left = false;
        let mut lost = 0;
        for ((dst, slot), out) in self.routes.iter_mut() {
            let Some(out) = out.as_mut().filter(|o| !o.backlog.is_empty()) else { continue };
            let (written, d) = out.drain();
            self.counters.sent += written;
            if written > 0 && out.publish() {
                self.counters.doorbells += 1;
                wake(*dst, u32::from(*slot) << share::QPN_SHIFT);
            }
            let since = *out.backlog_moved_ns.get_or_insert(now_ns);
            if written > 0 {
                out.backlog_moved_ns = Some(now_ns);
            }
            let stuck = now_ns.saturating_sub(since) > BACKLOG_STUCK_NS;
            if d == Drained::NoMemory || stuck {
                lost += out.backlog.len() as u64;
                out.backlog.clear();
                out.backlog_bytes.clear();
            }
            if out.backlog.is_empty() {
                out.backlog_moved_ns = None;
            } else {
                left = true;
            }
        }
        self.counters.full += lost;
        self.backlogged = left;
    }

    /// Whether packets to QPN `qpn` at `dst` go through memory (then they
    /// need no ICRC: nothing corrupts them on the way).
    pub(crate) fn reaches(&mut self, dst: SocketAddr, qpn: u32) -> bool {
        let Some(slot) = slot_of(dst, qpn) else { return false };
        route(&self.dir, self.kind, &mut self.routes, dst, slot).is_some()
    }

    /// The next packet in the inbox, copied into `buf`: `(len, meta)`.
    pub(crate) fn recv(&mut self, buf: &mut [u8]) -> Option<(usize, Meta)> {
        let active = self.inbox.map.active().load(Ordering::Acquire);
        if active == 0 {
            return None;
        }
        // The claimed lanes, starting after the last one read.
        let next = self.next_lane;
        for lane in lanes_in(active.rotate_right(next as u32)).map(|k| (next + k) % LANES) {
            match self.inbox.lanes[lane].pop(&self.inbox.map, lane, buf) {
                // A DPDK device's members also pass each other the
                // datagrams they send to groups (the receiver keeps those
                // of the groups it joined).
                Ok((len, meta))
                    if self.inbox.takes(meta.to)
                        || (self.kind == Kind::Dpdk && meta.to.is_multicast()) =>
                {
                    self.next_lane = (lane + 1) % LANES;
                    self.counters.received += 1;
                    return Some((len, meta));
                }
                // Sent to an address not ours: a broken sender.
                Ok(_) | Err(Empty::Broken) => self.counters.broken += 1,
                Err(Empty::Idle) => {}
            }
        }
        None
    }

    /// The progress thread is about to sleep on the sockets: raises the
    /// flag that makes senders ring the doorbell; false (flag down again)
    /// if a packet came meanwhile, so the thread must not sleep.
    pub(crate) fn prepare_sleep(&mut self) -> bool {
        if self.backlogged {
            // Packets wait for a receiver to read on: keep passing (a
            // receiver that stopped has its backlog dropped after
            // `BACKLOG_STUCK_NS`).
            return false;
        }
        let map = &self.inbox.map;
        map.sleeping().store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let active = map.active().load(Ordering::SeqCst);
        // Idle time maps what a new sender's first packets will land on
        // (a fault per page, 70 µs a chunk, otherwise paid then).
        for l in lanes_in(active) {
            self.inbox.lanes[l].map_chunk(map, l);
        }
        let waiting = lanes_in(active).any(|l| self.inbox.lanes[l].ready(map, l));
        if waiting {
            map.sleeping().store(0, Ordering::Relaxed);
            return false;
        }
        // The flag stays up until a sender takes it down: a receive by
        // another thread's pass (an application's poll) does not mean the
        // progress thread is awake. One that woke by its timeout costs the
        // next sender a doorbell it did not need.
        true
    }

    /// Every `RECHECK_NS`: forgets routes to inboxes that are gone and
    /// destinations that had none (they may have one now), and takes back
    /// the lanes of senders that are gone and left nothing unread.
    pub(crate) fn tick(&mut self, now_ns: u64, wake: &mut dyn FnMut(SocketAddr, u32)) {
        if self.backlogged {
            self.drain_backlogs(now_ns, wake);
        }
        if now_ns.saturating_sub(self.checked_ns) < RECHECK_NS {
            return;
        }
        self.checked_ns = now_ns;
        self.routes.retain(|_, r| r.as_ref().is_some_and(Outbox::alive));
        let map = &self.inbox.map;
        let active = map.active().load(Ordering::Acquire);
        // One lock query per held lane, not one per lane.
        let holders = ofd_lock::held_bits(&self.inbox.file, 1, LANES as u32);
        for l in 0..LANES {
            let held = holders & (1 << l) != 0;
            if active & (1 << l) == 0 {
                // The mask is in shared memory: a lane a sender holds is
                // read again even if its bit was lost.
                if held {
                    map.active().fetch_or(1 << l, Ordering::SeqCst);
                }
                continue;
            }
            if !held && !self.inbox.lanes[l].ready(map, l) {
                // Its sender is gone and left nothing unread. Holding the
                // lane's lock meanwhile (no sender can claim it), its pages
                // go back to the system: up to `RING` bytes of memory.
                if ofd_lock::lock(&self.inbox.file, 1 + l as u64).is_ok() {
                    map.active().fetch_and(!(1 << l), Ordering::SeqCst);
                    if ring::release_ring(&self.inbox.file, l).is_ok() {
                        self.counters.released += 1;
                    }
                    let _ = ofd_lock::unlock(&self.inbox.file, 1 + l as u64);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A device address no other test uses: its port stays bound on
    /// 127.0.0.1 and 127.0.0.2 for the rest of the test process, so no
    /// other test (nor another process's device) is handed it meanwhile,
    /// and two tests never share inbox or lane names.
    fn addr() -> SocketAddr {
        static HELD: std::sync::Mutex<Vec<std::net::UdpSocket>> = std::sync::Mutex::new(Vec::new());
        loop {
            let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let port = a.local_addr().unwrap().port();
            if let Ok(b) = std::net::UdpSocket::bind(("127.0.0.2", port)) {
                HELD.lock().unwrap_or_else(|e| e.into_inner()).extend([a, b]);
                return SocketAddr::new("127.0.0.1".parse().unwrap(), port);
            }
        }
    }

    /// A doorbell names its QPN where the steering reads it and carries
    /// the sender's CPU; anything else is no doorbell.
    #[test]
    fn a_doorbell_carries_its_senders_cpu() {
        let d = doorbell(0x04_0011);
        assert!(is_doorbell(&d));
        assert_eq!(crate::backend::dest_qpn(&d), 0x04_0011);
        let cpu = crate::sched::current_cpu();
        // The thread may have moved between the two reads.
        assert!(doorbell_cpu(&d).is_some_and(|c| c < 256), "{d:?} on CPU {cpu}");
        let mut unknown = d;
        unknown[1] = u8::MAX;
        assert_eq!(doorbell_cpu(&unknown), None);
        assert!(!is_doorbell(&d[..15]) && !is_doorbell(&[0u8; 16]));
    }

    /// Runs `step` with a clock advancing by `RECHECK_NS` each time until
    /// it says done (10 s at most). A file closed here may keep its lock a
    /// moment longer: a child forked by another test's thread (the tmpfs
    /// test runs `mount`) holds a copy of every descriptor until it execs.
    fn until(start_ns: u64, what: &str, mut step: impl FnMut(u64) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut now = start_ns;
        while !step(now) {
            assert!(std::time::Instant::now() < deadline, "{what}: never");
            std::thread::sleep(std::time::Duration::from_millis(1));
            now += RECHECK_NS;
        }
    }

    /// A receiver's address, a sender's on the same port, and a QPN of
    /// the receiver's slot `slot`.
    fn ends(slot: u32) -> (SocketAddr, SocketAddr, u32) {
        let at = addr();
        let from = SocketAddr::new("127.0.0.2".parse().unwrap(), at.port());
        (at, from, (slot << share::QPN_SHIFT) | 0x11)
    }

    /// A packet for QPN `qpn` (slot in its top bits).
    fn packet(qpn: u32, fill: u8, len: usize) -> Vec<u8> {
        let mut p = vec![fill; len];
        p[4..8].copy_from_slice(&qpn.to_be_bytes());
        p[4] = 0;
        p
    }

    /// A DPDK device's members reach each other's inboxes, QP1 MADs
    /// included when the slot is named, and only each other's: a `udp`
    /// context at the same address sees none of them, nor they its.
    #[test]
    fn dpdk_members_reach_their_own_kind_only() {
        let (at, _, qpn) = ends(2);
        let mut rx = LocalPath::for_dpdk(at, 2).unwrap();
        let mut tx = LocalPath::for_dpdk(at, 0).unwrap();
        let mut udp = LocalPath::new(at, 5).unwrap();
        assert!(tx.reaches(at, qpn) && !udp.reaches(at, qpn));
        assert!(!tx.reaches(at, (5 << share::QPN_SHIFT) | 0x11), "a udp inbox");
        assert_eq!(tx.send(at, at, &packet(qpn, 7, 100), 100), Sent::Written(None));
        // QP1 goes by the slot its contents name, never by its QPN.
        assert_eq!(tx.send(at, at, &packet(1, 8, 300), 300), Sent::NotLocal);
        assert_eq!(tx.send_to_slot(at, at, &packet(1, 8, 300), 300, (at, 2)), Sent::Written(None));
        assert_eq!(tx.send_to_slot(at, at, &packet(1, 8, 300), 300, (at, 6)), Sent::NotLocal);
        // A group's datagram, through the inbox of the device's member.
        let group = SocketAddr::new("239.1.2.3".parse().unwrap(), at.port());
        let to_group = packet(0xff_ffff, 9, 200);
        assert_eq!(tx.send_to_slot(at, group, &to_group, 200, (at, 2)), Sent::Written(None));
        let mut buf = vec![0u8; 4096];
        let (n, m) = rx.recv(&mut buf).unwrap();
        assert_eq!((n, buf[20], m.to), (100, 7, at.ip()));
        let (n, _) = rx.recv(&mut buf).unwrap();
        assert_eq!((n, buf[20], crate::backend::dest_qpn(&buf[..n])), (300, 8, 1));
        let (n, m) = rx.recv(&mut buf).unwrap();
        assert_eq!((n, buf[20], m.to), (200, 9, group.ip()));
        assert!(rx.recv(&mut buf).is_none() && udp.recv(&mut buf).is_none());
    }

    #[test]
    fn packets_reach_the_owner_of_the_qpn_and_a_gone_owner_is_dropped() {
        let (at, from, qpn) = ends(3);
        let mut rx = LocalPath::new(at, 3).unwrap();
        let mut tx = LocalPath::new(from, 0).unwrap();
        let mut buf = vec![0u8; 9000];
        // Slot 3's QPN: through memory, a run split in packets.
        let run = [packet(qpn, 1, 100), packet(qpn, 2, 100), packet(qpn, 3, 60)].concat();
        assert_eq!(tx.send(from, at, &run, 100), Sent::Written(None));
        for (fill, len) in [(1u8, 100), (2, 100), (3, 60)] {
            let (n, m) = rx.recv(&mut buf).unwrap();
            assert_eq!((n, buf[10], m.from, m.to), (len, fill, from, at.ip()));
        }
        assert!(rx.recv(&mut buf).is_none());
        // Another slot's QPN, the CM's QP1, multicast: not here.
        assert_eq!(tx.send(from, at, &packet(0x11, 0, 64), 64), Sent::NotLocal);
        assert_eq!(tx.send(from, at, &packet(1, 0, 64), 64), Sent::NotLocal);
        let group = SocketAddr::new("239.1.2.3".parse().unwrap(), at.port());
        assert_eq!(tx.send(from, group, &packet(qpn, 0, 64), 64), Sent::NotLocal);
        // A receiver about to sleep gets a doorbell with the next packet.
        assert!(rx.prepare_sleep());
        assert_eq!(tx.send(from, at, &packet(qpn, 4, 64), 64), Sent::Written(Some(qpn)));
        assert_eq!(tx.send(from, at, &packet(qpn, 5, 64), 64), Sent::Written(None));
        assert!(!rx.prepare_sleep(), "packets wait: no sleep");
        assert_eq!(rx.recv(&mut buf).map(|(n, _)| (n, buf[10])), Some((64, 4)));
        assert_eq!(rx.recv(&mut buf).map(|(n, _)| (n, buf[10])), Some((64, 5)));
        // A secondary address of the receiver: a second name of its inbox,
        // until it stops using the address.
        let second = SocketAddr::new("127.0.0.3".parse().unwrap(), at.port());
        rx.add_address(second, 3).unwrap();
        assert_eq!(tx.send(from, second, &packet(qpn, 8, 64), 64), Sent::Written(None));
        assert_eq!(rx.recv(&mut buf).map(|(_, m)| (buf[10], m.to)), Some((8, second.ip())));
        rx.remove_address(second.ip());
        assert!(!inbox_path(&rx.dir, Kind::Udp, second, 3).exists());
        tx.tick(RECHECK_NS / 2 * 3, &mut |_, _| {});
        assert_eq!(tx.send(from, second, &packet(qpn, 8, 64), 64), Sent::NotLocal);
        // The owner goes: the route is dropped at the next check, and a
        // new owner of the slot is found.
        drop(rx);
        let mut now = 0;
        until(3 * RECHECK_NS, "the gone owner's route dropped", |t| {
            now = t;
            tx.tick(t, &mut |_, _| {});
            !tx.routes.contains_key(&(at, 3))
        });
        assert_eq!(tx.send(from, at, &packet(qpn, 6, 64), 64), Sent::NotLocal);
        let mut rx = LocalPath::new(at, 3).unwrap();
        tx.tick(now + RECHECK_NS, &mut |_, _| {});
        assert_eq!(tx.send(from, at, &packet(qpn, 7, 64), 64), Sent::Written(None));
        assert_eq!(rx.recv(&mut buf).map(|(n, _)| (n, buf[10])), Some((64, 7)));
        assert_eq!(tx.counters().sent, 7);
    }

    /// A receiver that falls behind slows its sender instead of losing
    /// packets: what a full lane cannot take waits in the sender's
    /// backlog, in order, and moves as the receiver reads on (each pass);
    /// a receiver that stops reading has the backlog dropped after
    /// `BACKLOG_STUCK_NS`.
    #[test]
    fn a_full_lane_queues_in_order_and_a_stopped_receiver_is_given_up() {
        let (at, from, qpn) = ends(6);
        let mut rx = LocalPath::new(at, 6).unwrap();
        let mut tx = LocalPath::new(from, 0).unwrap();
        let mut buf = vec![0u8; 9000];
        let mut wakes = 0;
        let n = 3 * (ring::RING as u32 / 4160);
        for i in 0..n {
            let mut p = packet(qpn, 1, 4096);
            p[100..104].copy_from_slice(&i.to_le_bytes());
            assert!(matches!(tx.send(from, at, &p, 4096), Sent::Written(_)), "packet {i}");
        }
        assert!(tx.backlogged);
        let mut got = 0u32;
        let mut now = 0;
        while got < n {
            while let Some((len, _)) = rx.recv(&mut buf) {
                assert_eq!((len, &buf[100..104]), (4096, &got.to_le_bytes()[..]), "in order");
                got += 1;
            }
            now += 1000;
            tx.tick(now, &mut |d, q| {
                assert_eq!((d, q >> share::QPN_SHIFT), (at, 6));
                wakes += 1;
            });
            assert!(now < 1_000_000, "the backlog never drained");
        }
        assert!(!tx.backlogged && tx.prepare_sleep());
        assert_eq!((tx.counters().sent, tx.counters().full), (u64::from(n), 0));
        // A receiver that stops: after a second without progress the
        // backlog goes (counted), and the sender may sleep again.
        for _ in 0..2 * (ring::RING / 4160) {
            let _ = tx.send(from, at, &packet(qpn, 1, 4096), 4096);
        }
        assert!(tx.backlogged && !tx.prepare_sleep());
        tx.tick(now + 1, &mut |_, _| {});
        tx.tick(now + 2 + BACKLOG_STUCK_NS, &mut |_, _| {});
        assert!(!tx.backlogged);
        assert!(tx.counters().full > 0, "{:?}", tx.counters());
        let _ = wakes;
    }

    /// A sender that goes leaves its lane's pages behind in the tmpfs
    /// file; the owner's check gives them back once the lane is read.
    #[test]
    fn a_gone_senders_lane_gives_its_memory_back() {
        use std::os::unix::fs::MetadataExt;
        let (at, from, qpn) = ends(2);
        let mut rx = LocalPath::new(at, 2).unwrap();
        let path = inbox_path(&rx.dir, Kind::Udp, at, 2);
        let blocks = || std::fs::metadata(&path).unwrap().blocks();
        let before = blocks();
        let mut tx = LocalPath::new(from, 0).unwrap();
        let mut buf = vec![0u8; 9000];
        // A receiver that lags 2 MiB behind: the lane grows to hold it.
        for _ in 0..512 {
            assert_eq!(tx.send(from, at, &packet(qpn, 1, 4096), 4096), Sent::Written(None));
        }
        for _ in 0..512 {
            assert!(rx.recv(&mut buf).is_some());
        }
        let used = blocks();
        assert!(used >= before + 4096, "{before} → {used} blocks");
        rx.tick(RECHECK_NS, &mut |_, _| {});
        assert_eq!(rx.counters().released, 0, "its sender is alive");
        drop(tx);
        until(2 * RECHECK_NS, "the gone sender's lane released", |t| {
            rx.tick(t, &mut |_, _| {});
            rx.counters().released > 0
        });
        assert_eq!(rx.counters().released, 1);
        assert!(blocks() <= before + 8, "{before} → {used} → {} blocks", blocks());
        // The lane serves a new sender.
        let mut tx = LocalPath::new(from, 0).unwrap();
        assert_eq!(tx.send(from, at, &packet(qpn, 2, 64), 64), Sent::Written(None));
        assert_eq!(rx.recv(&mut buf).map(|(n, _)| (n, buf[10])), Some((64, 2)));
    }

    /// A tmpfs that fills up (a container's 64 MiB `/dev/shm`) stops a
    /// lane from growing: the sender is told before it writes (no SIGBUS),
    /// what it wrote arrives, and the destination takes UDP.
    #[test]
    fn a_full_tmpfs_sends_the_destination_back_to_udp() {
        let dir = std::env::temp_dir().join(format!("uroce-shm-full-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            assert!(std::env::var_os("CI").is_none(), "mounting a tmpfs needs root under CI");
            eprintln!("cannot mount a tmpfs here: skipped");
            return;
        }
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(&self.0).status();
                let _ = std::fs::remove_dir(&self.0);
            }
        }
        let _unmount = Unmount(dir.clone());
        let (at, from, qpn) = ends(4);
        let mut rx = LocalPath::new_in(dir.clone(), Kind::Udp, at, 4).unwrap();
        let mut tx = LocalPath::new_in(dir.clone(), Kind::Udp, from, 0).unwrap();
        let mut buf = vec![0u8; 9000];
        let (mut sent, mut got) = (0u32, 0u32);
        // The receiver reads nothing meanwhile: the lane must grow (its
        // ring, 4 MiB, is larger than the tmpfs).
        loop {
            let mut p = packet(qpn, 3, 4096);
            p[100..104].copy_from_slice(&sent.to_le_bytes());
            match tx.send(from, at, &p, 4096) {
                Sent::Written(_) => sent += 1,
                Sent::NotLocal => break,
                Sent::Full => panic!("the ring cannot be full: it is larger than the tmpfs"),
            }
            assert!(sent < 2000, "1 MiB of tmpfs never ran out");
        }
        while let Some((n, _)) = rx.recv(&mut buf) {
            assert_eq!((n, &buf[100..104]), (4096, &got.to_le_bytes()[..]));
            got += 1;
        }
        assert!(sent > 10, "{sent}");
        assert_eq!(got, sent, "what was written arrived");
        assert_eq!(tx.counters().no_memory, 1);
        // Until the next check, the destination stays on UDP.
        assert_eq!(tx.send(from, at, &packet(qpn, 3, 64), 64), Sent::NotLocal);
        // A local process that publishes an entry over ring memory nobody
        // reserved (its header on the lane's first page, which the inbox
        // reserved, its 4000 bytes running into the next, a hole), with
        // the tmpfs full: the owner's read of the hole takes no memory
        // (Linux 6.18: zeros, no SIGBUS), and the zeros go on to the
        // transport, which drops them as it drops any malformed packet.
        let f = open_rw(&inbox_path(&dir, Kind::Udp, at, 4)).unwrap();
        let hostile = Mapping::map(&f).unwrap();
        let lane = LANES - 1;
        let m = Meta { from, to: at.ip(), ip_id: 0 };
        ring::forge_entry(&hostile, lane, &m, 4000);
        hostile.active().fetch_or(1 << lane, Ordering::SeqCst);
        buf[..4000].fill(0xee);
        assert_eq!(rx.recv(&mut buf), Some((4000, m)));
        assert!(buf[..4000].iter().all(|b| *b == 0), "the hole reads as zeros");
    }

    /// More senders than the 16 lanes of old: 40 processes' worth of
    /// senders (each its own open file, so its own lane) reach one inbox
    /// through memory, every packet in order per sender.
    #[test]
    fn forty_senders_each_get_a_lane() {
        let (at, from, qpn) = ends(7);
        let mut rx = LocalPath::new(at, 7).unwrap();
        let mut txs: Vec<LocalPath> =
            (0..40).map(|k| LocalPath::new(from, 20 + k).unwrap()).collect();
        let mut buf = vec![0u8; 9000];
        for round in 0..3u8 {
            for (k, tx) in txs.iter_mut().enumerate() {
                let mut p = packet(qpn, round, 64);
                p[10] = k as u8;
                assert!(matches!(tx.send(from, at, &p, 64), Sent::Written(_)), "sender {k}");
            }
        }
        let mut seen = [0u8; 40];
        while let Some((n, _)) = rx.recv(&mut buf) {
            let k = usize::from(buf[10]);
            assert_eq!((n, buf[20]), (64, seen[k]), "sender {k}'s packets in order");
            seen[k] += 1;
        }
        assert_eq!(seen, [3u8; 40]);
        assert_eq!(rx.counters().received, 120);
    }

    /// A dead inbox of any run directory is swept (the one of a test
    /// with a run directory of its own would otherwise stay forever); a
    /// live one, a fresh one being made and other files stay.
    #[test]
    fn dead_inboxes_of_every_run_directory_are_swept() {
        let dir = std::env::temp_dir().join(format!("uroce-shm-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str| {
            let p = dir.join(name);
            std::fs::write(&p, b"x").unwrap();
            p
        };
        let dead = file("uroce-0badf00d-share-4026531840-127.0.0.1-4791.0");
        let making = file("uroce-0badf00d-share-4026531840-127.0.0.1-4791.1.new77");
        let other = file("uroce-0badf00d-table");
        let live = file("uroce-12345678-share-4026531840-127.0.0.1-4791.2");
        let held = open_rw(&live).unwrap();
        ofd_lock::lock(&held, OWNER_BYTE).unwrap();
        sweep(&dir);
        assert!(!dead.exists(), "a dead inbox of another run directory is removed");
        assert!(making.exists() && other.exists() && live.exists());
        drop(held);
        until(0, "the inbox of a gone owner swept", |_| {
            sweep(&dir);
            !live.exists()
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(is_inbox_name(
            &inbox_path(&dir, Kind::Udp, addr(), 3).file_name().unwrap().to_string_lossy()
        ));
    }

    /// A local process that writes garbage into an inbox (headers, lane
    /// counters, entries) costs the owner those lanes' packets, counted,
    /// and nothing else: no panic, and a sender that keeps the rules still
    /// gets through.
    #[test]
    fn garbage_written_into_an_inbox_is_counted_and_survived() {
        let (at, from, qpn) = ends(5);
        let mut rx = LocalPath::new(at, 5).unwrap();
        let mut tx = LocalPath::new(from, 1).unwrap();
        let evil = open_rw(&inbox_path(&rx.dir, Kind::Udp, at, 5)).unwrap();
        let mut buf = vec![0u8; 9000];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut good = 0;
        let mut sent = 0;
        let mut drain = |rx: &mut LocalPath, buf: &mut [u8]| {
            while let Some((n, m)) = rx.recv(buf) {
                if n == 200 && m.from == from && buf[10] == 9 {
                    good += 1;
                }
            }
        };
        for round in 0..3000u64 {
            // Somewhere in the header's lane mask or in other lanes' heads,
            // tails and rings (lane 0 is the honest sender's).
            let lane = 1 + next() % 3;
            let base = 4096 + lane * (128 + ring::RING);
            let off = match next() % 4 {
                0 => 128,
                1 => base,
                2 => base + 64,
                _ => base + 128 + next() % 8192,
            };
            let word = next().to_le_bytes();
            let _ = evil.write_all_at(&word[..(1 + next() % 8) as usize], off);
            drain(&mut rx, &mut buf);
            if round % 100 == 0 {
                // The owner's periodic check also restores the mask bits
                // of lanes a live sender holds.
                rx.tick((round / 100 + 1) * RECHECK_NS, &mut |_, _| {});
                assert_eq!(tx.send(from, at, &packet(qpn, 9, 200), 200), Sent::Written(None));
                sent += 1;
            }
        }
        rx.tick(1000 * RECHECK_NS, &mut |_, _| {});
        drain(&mut rx, &mut buf);
        assert!(rx.counters().broken > 0, "{:?}", rx.counters());
        assert_eq!(good, sent, "every honest packet arrives");
    }
}
