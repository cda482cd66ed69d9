//! One device address shared by many contexts, in one process or many
//! (issue 15, `docs/sharing.md`).
//!
//! Every context binds the device's address and port with `SO_REUSEPORT`,
//! so the kernel keeps their sockets in one group. A classic BPF program
//! attached to the group (`SO_ATTACH_REUSEPORT_CBPF`, no privilege needed)
//! picks each datagram's socket from the BTH destination QPN: every
//! context owns a *slot*, and slot `s` owns QPNs `s << QPN_SHIFT ..`. The
//! program returns a socket's *index* in the group, which the kernel
//! assigns by join order and reshuffles when a socket closes (the last one
//! moves into the hole), so the indices are measured, not assumed: a
//! *probe round* sends one datagram per index through the group, each
//! marked with the index the program is told to pick, and every member
//! that receives one writes down "index k is my slot".
//!
//! What the members share is a small file per device address under the run
//! directory (`registry`), with the slot table and the probe answers. A
//! slot's owner holds an OFD byte lock on the slot's byte as long as it
//! lives (`ofd_lock`), so a slot whose process died, SIGKILL included, is
//! taken back, whatever PID namespace each member runs in. It is locked (`flock`) for membership changes only; the
//! data path never touches it.
//!
//! A context alone in its group costs nothing more than before: the kernel
//! hands every datagram to a group's only socket whatever the program says.

#![deny(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use uroce_transport::cm::Leftover;

use crate::ofd_lock;

/// Contexts that can share one device address.
pub(crate) const SLOTS: usize = 64;
/// Slot `s` owns the QPNs whose top bits are `s`: 2^18 QPNs each, more
/// than a context may create (`limits::MAX_QP`).
pub(crate) const QPN_SHIFT: u32 = 18;

/// The first 8 bytes of a probe datagram. A RoCE packet never starts so:
/// 0x75 is a reserved BTH opcode.
pub(crate) const PROBE_MAGIC: [u8; 8] = *b"uroce-pr";
/// Probe datagram: magic, round (u32 BE), index (u32 BE), then padding
/// that makes each probe of a round a different size (so that receive
/// offload never merges two).
pub(crate) const PROBE_LEN: usize = 16;

const FILE_MAGIC: u64 = u64::from_le_bytes(*b"UROCESH1");
/// File layout, in 8-byte words: magic, membership generation, the round
/// counter, then the slots (two words each: pid, start time), then one
/// probe answer per index.
const W_MAGIC: u64 = 0;
const W_GENERATION: u64 = 1;
const W_ROUND: u64 = 2;
/// The membership generation the last complete round measured.
const W_MEASURED: u64 = 3;
const W_SLOTS: u64 = 8;
const W_ANSWERS: u64 = W_SLOTS + 2 * SLOTS as u64;
/// The last measured index of each slot, plus one (0: unknown).
const W_TABLE: u64 = W_ANSWERS + SLOTS as u64;
/// The ports each slot's connection manager listens on, four per word.
const W_LISTEN: u64 = W_TABLE + SLOTS as u64;
/// Ports a slot can have steered to it.
pub(crate) const LISTEN_PER_SLOT: usize = 16;
/// How many times each slot was taken (while the file lived).
const W_USES: u64 = W_LISTEN + (SLOTS * LISTEN_PER_SLOT / 4) as u64;
const FILE_WORDS: u64 = W_USES + SLOTS as u64;
/// A slot's range is cut in blocks of this many QPNs (a context's most,
/// `limits::MAX_QP`); each new owner of the slot starts in the next.
const QPN_BLOCK: u32 = 1 << 14;
/// Where the slots' liveness locks start, in bytes.
const LOCK_BYTES: u64 = 1 << 20;

/// A slot's owner as the table names it: its pid (for people reading the
/// file; pids mean nothing across PID namespaces) and the slot's use count
/// when it was taken, which no later owner of the slot shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pid: u32,
    token: u64,
}

/// The byte whose OFD lock a slot's owner holds while it lives (past the
/// table's words: locks need no data under them).
fn lock_byte(s: usize) -> u64 {
    LOCK_BYTES + s as u64
}

/// Whether slot `s`'s owner runs: another open file description of the
/// table holds the slot's byte lock (the kernel drops it when the owner's
/// last descriptor closes, however it died). Never true of `file`'s own
/// slot.
fn slot_alive(file: &File, s: usize) -> bool {
    ofd_lock::held_by_other(file, lock_byte(s))
}

/// The shared slot table of one device address.
#[derive(Debug)]
pub(crate) struct Registry {
    file: File,
    /// Held while this member runs a probe round (a second file, so that
    /// a round never blocks a context that opens or closes).
    round_lock: File,
    slot: usize,
    owner: Owner,
    path: PathBuf,
    /// [`Registry::leave`] ran: nothing left for `Drop`.
    left: bool,
    /// Connections of dead members whose slots this member took back,
    /// for the caller to end (see [`Registry::take_leftovers`]).
    leftovers: Vec<Leftover>,
    /// The group's secret (see `secret_at`).
    secret: u64,
}

/// Whether `path` still names the open `file` (not removed or replaced).
pub(crate) fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

fn read_word(f: &File, w: u64) -> u64 {
    let mut b = [0u8; 8];
    match f.read_exact_at(&mut b, w * 8) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => 0,
    }
}

fn write_word(f: &File, w: u64, v: u64) -> io::Result<()> {
    f.write_all_at(&v.to_le_bytes(), w * 8)
}

/// A probe answer: the round, the slot and a check, in one word (written
/// whole by one `pwrite`; the check catches a torn read).
fn answer(round: u32, slot: usize) -> u64 {
    let s = slot as u64 & 0xffff;
    (u64::from(round) << 32) | ((!s & 0xffff) << 16) | s
}

fn parse_answer(v: u64) -> Option<(u32, usize)> {
    let s = v & 0xffff;
    ((v >> 16) & 0xffff == !s & 0xffff).then_some(((v >> 32) as u32, s as usize))
}

/// The table's file: one per address, port and network namespace (the
/// same address in two namespaces is two groups).
pub(crate) fn path_of(addr: SocketAddr) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    crate::published::run_dir().join(format!("share-{netns}-{}-{}", addr.ip(), addr.port()))
}

/// The round lock beside the table.
fn round_path(path: &std::path::Path) -> PathBuf {
    crate::published::with_suffix(path, ".round")
}

/// Where the secret of the group whose table is at `path` is kept.
fn secret_path(path: &Path) -> PathBuf {
    crate::published::with_suffix(path, ".secret")
}

/// The secret in the file at `path`: 8 random bytes only the run
/// directory's user can read (0600), made by the first to ask (0 if the
/// file cannot be had). Relay datagrams between a device's members end
/// with it (`uroce_transport::xrc_relay`), so another sender, which
/// cannot read it, cannot forge one. Read and made under the table's
/// lock, as the last member removes it.
fn secret_at(path: &Path) -> u64 {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    for _ in 0..100 {
        let mut b = [0u8; 8];
        if let Ok(mut f) = File::open(path)
            && f.read_exact(&mut b).is_ok()
        {
            return u64::from_be_bytes(b);
        }
        let mut fresh = [0u8; 8];
        if File::open("/dev/urandom").and_then(|mut r| r.read_exact(&mut fresh)).is_err() {
            return 0;
        }
        // Made whole under a temporary name, then linked in: a reader
        // never sees a short file, and of two makers the first wins.
        let tmp = crate::published::with_suffix(path, &format!(".{}", std::process::id()));
        let made = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&fresh));
        if made.is_ok() {
            let _ = std::fs::hard_link(&tmp, path);
        }
        let _ = std::fs::remove_file(&tmp);
    }
    0
}

fn open_rw(path: &PathBuf) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(path)
}

impl Registry {
    /// Takes a free slot of the device at `addr` (after taking back the
    /// slots of processes that are gone), runs `bind` (which joins the
    /// socket to the kernel's group), predicts the socket's index, has
    /// `attach` steer the group by the table, and bumps the generation, so
    /// that the members measure the group anew. All of it under the
    /// table's lock: the kernel numbers the group's sockets in the order
    /// they bind, and the table predicts them in the order members join,
    /// so both must be the same order; and a program attached without the
    /// lock could be built from a table older than the last one attached.
    ///
    /// # Errors
    /// The outer error: the run directory or the file cannot be used, or
    /// all slots are taken (`AddrInUse`). The inner one: `bind`'s (the
    /// slot is given back).
    pub(crate) fn join<T>(
        addr: SocketAddr,
        bind: impl FnOnce() -> io::Result<T>,
        attach: impl FnOnce(&T, &[Insn]),
    ) -> io::Result<io::Result<(Self, T)>> {
        Self::join_at(path_of(addr), None, bind, attach)
    }

    /// [`Registry::join`] taking slot `slot` (`AddrInUse` if a live member
    /// has it): a context's other local addresses (the GIDs besides the
    /// configured one) are shared in groups of their own, where it must
    /// hold the slot its QPNs name.
    pub(crate) fn join_as<T>(
        addr: SocketAddr,
        slot: usize,
        bind: impl FnOnce() -> io::Result<T>,
        attach: impl FnOnce(&T, &[Insn]),
    ) -> io::Result<io::Result<(Self, T)>> {
        Self::join_at(path_of(addr), Some(slot), bind, attach)
    }

    /// [`Registry::join`] with the table at `path`, taking slot `want` if
    /// given, else the first free one.
    fn join_at<T>(
        path: PathBuf,
        want: Option<usize>,
        bind: impl FnOnce() -> io::Result<T>,
        attach: impl FnOnce(&T, &[Insn]),
    ) -> io::Result<io::Result<(Self, T)>> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
            sweep_once(dir, &path);
        }
        // The last member to leave removes the file: a file locked after
        // that is not the table any more, and is opened again.
        let file = loop {
            let file = open_rw(&path)?;
            file.lock()?;
            if same_file(&file, &path) {
                break file;
            }
        };
        let mut leftovers = Vec::new();
        let taken = open_rw(&round_path(&path)).and_then(|round_lock| {
            Ok((round_lock, Self::take_slot(&file, &path, want, &mut leftovers)?))
        });
        let (round_lock, (slot, owner)) = match taken {
            Ok(t) => t,
            Err(e) => {
                let _ = file.unlock();
                return Err(e);
            }
        };
        let secret = secret_at(&secret_path(&path));
        let bound = bind();
        if let Ok(t) = &bound {
            if (0..SLOTS).any(|s| s != slot && slot_alive(&file, s)) {
                append(&file, slot);
            } else {
                // The group's only socket: index 0, and nothing to measure.
                write_table(&file, &[(slot, 0)]);
                let _ = write_word(&file, W_MEASURED, read_word(&file, W_GENERATION));
            }
            attach(t, &steering_of(&file));
        } else {
            let _ = clear_slot(&file, slot);
            let _ = bump(&file);
            let _ = ofd_lock::unlock(&file, lock_byte(slot));
        }
        let _ = file.unlock();
        let left = false;
        Ok(bound
            .map(|t| (Self { file, round_lock, slot, owner, path, left, leftovers, secret }, t)))
    }

    /// Leaves the group: under the table's lock, the table predicts the
    /// group without this member (the kernel moves the last socket into
    /// its hole), and `close` attaches the program for that through this
    /// member's socket, then closes it. So the others are steered right
    /// from the moment the socket goes (not from their next check), and
    /// the kernel's reshuffles and the table's predictions happen in the
    /// same order.
    pub(crate) fn leave(mut self, close: impl FnOnce(&[Insn])) {
        let locked = self.file.lock().is_ok();
        predict_leave(&self.file, self.slot);
        close(&steering_of(&self.file));
        self.leave_locked();
        self.left = true;
        if locked {
            let _ = self.file.unlock();
        }
    }

    /// Under the table's lock: takes back the slots of members that are
    /// gone, then takes slot `want` (or the first free one) and its
    /// liveness lock.
    fn take_slot(
        file: &File,
        path: &Path,
        want: Option<usize>,
        leftovers: &mut Vec<Leftover>,
    ) -> io::Result<(usize, Owner)> {
        if read_word(file, W_MAGIC) != FILE_MAGIC {
            for w in 0..FILE_WORDS {
                write_word(file, w, 0)?;
            }
            write_word(file, W_MAGIC, FILE_MAGIC)?;
        }
        let mut free = None;
        for s in 0..SLOTS {
            let alive = slot_alive(file, s);
            if slot_owner(file, s).pid != 0 && !alive {
                clear_slot(file, s)?;
                predict_leave(file, s);
                take_connections(path, s, leftovers);
            }
            // A slot whose lock someone holds is not free, even if its
            // words were cleared.
            if free.is_none()
                && want.is_none_or(|w| w == s)
                && !alive
                && ofd_lock::lock(file, lock_byte(s)).is_ok()
            {
                free = Some(s);
            }
        }
        let s = free.ok_or(io::ErrorKind::AddrInUse)?;
        let owner = Owner {
            pid: std::process::id(),
            token: read_word(file, W_USES + s as u64).wrapping_add(1),
        };
        write_word(file, W_USES + s as u64, owner.token)?;
        write_word(file, W_SLOTS + 2 * s as u64, u64::from(owner.pid))?;
        write_word(file, W_SLOTS + 2 * s as u64 + 1, owner.token)?;
        bump(file)?;
        Ok((s, owner))
    }

    /// This context's slot.
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// The group's secret, which relay datagrams between its members end
    /// with.
    pub(crate) fn secret(&self) -> u64 {
        self.secret
    }

    /// Whether another member of the group runs now.
    pub(crate) fn others_alive(&self) -> bool {
        (0..SLOTS).any(|s| s != self.slot && slot_alive(&self.file, s))
    }

    /// The process IDs of the other live members, each as its own PID
    /// namespace numbers it.
    #[cfg(feature = "dpdk")]
    pub(crate) fn other_pids(&self) -> Vec<u32> {
        let pids = slot_pids(&self.file);
        (0..SLOTS)
            .filter(|&s| s != self.slot && pids[s] != 0 && slot_alive(&self.file, s))
            .map(|s| pids[s])
            .collect()
    }

    /// Where in its slot's range this context starts numbering QPs: the
    /// first owner of a slot at its start (QPN 0x11 for a context alone,
    /// as before sharing), each later one a block further, so the QPNs a
    /// dead owner's peers may still send to are not handed out again at
    /// once.
    pub(crate) fn qpn_start(&self) -> u32 {
        let uses = self.owner.token.max(1) - 1;
        let blocks = (1u32 << QPN_SHIFT) / QPN_BLOCK;
        (uses % u64::from(blocks)) as u32 * QPN_BLOCK
    }

    /// The membership generation: changes whenever a context joins or
    /// leaves, or a dead one's slot is taken back.
    pub(crate) fn generation(&self) -> u64 {
        read_word(&self.file, W_GENERATION)
    }

    /// The membership generation the indices in the file were measured
    /// for.
    pub(crate) fn measured(&self) -> u64 {
        read_word(&self.file, W_MEASURED)
    }

    /// Records that the indices in the file are right for `generation`.
    pub(crate) fn set_measured(&self, generation: u64) {
        let _ = write_word(&self.file, W_MEASURED, generation);
    }

    /// The live members' slots, taking back (under the lock) those whose
    /// process is gone. `None` if the lock could not be had.
    pub(crate) fn live_slots(&mut self) -> Vec<usize> {
        let mut live = Vec::new();
        let mut dead = Vec::new();
        for (s, pid) in slot_pids(&self.file).into_iter().enumerate() {
            if pid == 0 {
                continue;
            }
            if s == self.slot || slot_alive(&self.file, s) {
                live.push(s);
            } else {
                dead.push(s);
            }
        }
        if !dead.is_empty() && self.file.lock().is_ok() {
            for s in dead {
                // Checked again under the lock: the slot may have been
                // taken back and given to a new context meanwhile.
                if slot_owner(&self.file, s).pid != 0 && !slot_alive(&self.file, s) {
                    let _ = clear_slot(&self.file, s);
                    let _ = bump(&self.file);
                    predict_leave(&self.file, s);
                    take_connections(&self.path, s, &mut self.leftovers);
                }
            }
            let _ = self.file.unlock();
        }
        live
    }

    /// Becomes the member that runs the next probe round, if no other
    /// member runs one. Returns the round's number.
    pub(crate) fn begin_round(&self) -> Option<u32> {
        if self.round_lock.try_lock().is_err() {
            return None;
        }
        let round = (read_word(&self.file, W_ROUND) as u32).wrapping_add(1).max(1);
        if write_word(&self.file, W_ROUND, u64::from(round)).is_err() {
            let _ = self.round_lock.unlock();
            return None;
        }
        Some(round)
    }

    /// Ends this member's round.
    pub(crate) fn end_round(&self) {
        let _ = self.round_lock.unlock();
    }

    /// Records that this member's socket received the probe for `index`
    /// of `round`.
    pub(crate) fn answer_probe(&self, round: u32, index: u32) {
        if (index as usize) < SLOTS {
            let _ = write_word(&self.file, W_ANSWERS + u64::from(index), answer(round, self.slot));
        }
    }

    /// The slot that answered `index` in `round`, if one did.
    pub(crate) fn answer_of(&self, round: u32, index: usize) -> Option<usize> {
        parse_answer(read_word(&self.file, W_ANSWERS + index as u64))
            .and_then(|(r, s)| (r == round).then_some(s))
    }
}

impl Registry {
    /// Records the indices a round measured (`(slot, index)`; slots not
    /// in it become unknown) unless the membership changed since
    /// `generation` (then the table's newer predictions stay), and has
    /// `attach` steer by the table, all under its lock. Whether the table
    /// was written.
    pub(crate) fn set_table(
        &self,
        table: &[(usize, u32)],
        generation: Option<u64>,
        attach: impl FnOnce(&[Insn]),
    ) -> bool {
        let Ok(()) = self.file.lock() else { return false };
        let write = generation.is_none_or(|g| g == read_word(&self.file, W_GENERATION));
        if write {
            write_table(&self.file, table);
        }
        attach(&steering_of(&self.file));
        let _ = self.file.unlock();
        write
    }

    /// Has `attach` steer the group by the table as it is, under its lock
    /// (see [`Registry::join`]).
    pub(crate) fn steer(&self, attach: impl FnOnce(&[Insn])) {
        let locked = self.file.lock().is_ok();
        attach(&steering_of(&self.file));
        if locked {
            let _ = self.file.unlock();
        }
    }

    /// Records the ports this context's connection manager listens on
    /// (the first [`LISTEN_PER_SLOT`]; 0 is no port) and has `attach` steer
    /// their requests here, unless another live context listens on one of
    /// them: then nothing changes and the answer is `false` (a port has
    /// one listener per address, as on a host).
    pub(crate) fn set_listening(&self, ports: &[u16], attach: impl FnOnce(&[Insn])) -> bool {
        if self.file.lock().is_err() {
            return false;
        }
        let taken = (0..SLOTS).filter(|&s| s != self.slot).any(|s| {
            slot_alive(&self.file, s) && listens_of(&self.file, s).iter().any(|p| ports.contains(p))
        });
        if !taken {
            self.write_listens(ports);
            attach(&steering_of(&self.file));
        }
        let _ = self.file.unlock();
        !taken
    }

    /// The ports the other live members listen on.
    pub(crate) fn listened_by_others(&self) -> Vec<u16> {
        (0..SLOTS)
            .filter(|&s| s != self.slot)
            .map(|s| (s, listens_of(&self.file, s)))
            .filter(|(s, ports)| !ports.is_empty() && slot_alive(&self.file, *s))
            .flat_map(|(_, ports)| ports)
            .collect()
    }

    fn write_listens(&self, ports: &[u16]) {
        let mut p = [0u16; LISTEN_PER_SLOT];
        for (d, s) in p.iter_mut().zip(ports) {
            *d = *s;
        }
        for (w, chunk) in p.chunks(4).enumerate() {
            let v = chunk.iter().enumerate().fold(0u64, |v, (i, &x)| v | u64::from(x) << (16 * i));
            let at = W_LISTEN + (self.slot * LISTEN_PER_SLOT / 4 + w) as u64;
            let _ = write_word(&self.file, at, v);
        }
    }
}

impl Registry {
    /// The steering program for members that each see every datagram and
    /// keep their own (a DPDK device's): slots stand for the indices, the
    /// members `live` (this one's included) and the ports they listen on
    /// as the table has them now. [`run`] gives a datagram's slot.
    #[cfg(feature = "dpdk")]
    pub(crate) fn program_by_slot(&self, live: &[usize]) -> Vec<Insn> {
        let table: Vec<(usize, u32)> = live.iter().map(|&s| (s, s as u32)).collect();
        let listens: Vec<(u16, u32)> = table
            .iter()
            .flat_map(|&(s, i)| listens_of(&self.file, s).into_iter().map(move |p| (p, i)))
            .collect();
        program(&table, &listens)
    }
}

/// The steering program for the group as `file` describes it: the
/// measured indices, and the ports each slot listens on. The lowest slot
/// with a known index takes the CM datagrams no other rule places.
fn steering_of(file: &File) -> Vec<Insn> {
    let table: Vec<(usize, u32)> =
        read_table(file).into_iter().filter(|t| slot_owner(file, t.0).pid != 0).collect();
    let listens: Vec<(u16, u32)> = table
        .iter()
        .flat_map(|&(s, index)| listens_of(file, s).into_iter().map(move |p| (p, index)))
        .collect();
    program(&table, &listens)
}

/// The ports slot `s` listens on.
fn listens_of(file: &File, s: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for w in 0..LISTEN_PER_SLOT / 4 {
        let v = read_word(file, W_LISTEN + (s * LISTEN_PER_SLOT / 4 + w) as u64);
        out.extend((0..4).map(|i| (v >> (16 * i)) as u16).filter(|&p| p != 0));
    }
    out
}

/// The indices as the file has them: `(slot, index)`.
fn read_table(file: &File) -> Vec<(usize, u32)> {
    (0..SLOTS)
        .filter_map(|s| {
            let v = read_word(file, W_TABLE + s as u64);
            (v > 0 && v <= SLOTS as u64).then(|| (s, (v - 1) as u32))
        })
        .collect()
}

fn write_table(file: &File, table: &[(usize, u32)]) {
    for s in 0..SLOTS {
        let v = table.iter().find(|t| t.0 == s).map_or(0, |t| u64::from(t.1) + 1);
        let _ = write_word(file, W_TABLE + s as u64, v);
    }
}

/// Whether `table` gives indices `0..len` once each.
fn is_permutation(table: &[(usize, u32)]) -> bool {
    let mut seen = [false; SLOTS];
    table.iter().all(|&(_, i)| {
        (i as usize) < table.len() && !std::mem::replace(&mut seen[i as usize], true)
    })
}

/// The indices after slot `gone`'s socket left the group, as the kernel
/// reorders them: the last socket moves into the hole. `None` when the
/// table was not whole (then only a probe round can tell).
fn without(table: &[(usize, u32)], gone: usize) -> Option<Vec<(usize, u32)>> {
    if !is_permutation(table) {
        return None;
    }
    let hole = table.iter().find(|t| t.0 == gone)?.1;
    let last = table.len() as u32 - 1;
    Some(
        table
            .iter()
            .filter(|t| t.0 != gone)
            .map(|&(s, i)| (s, if i == last { hole } else { i }))
            .collect(),
    )
}

/// Updates the file's indices for a member that left (under the lock),
/// or forgets them when they cannot be predicted.
fn predict_leave(file: &File, gone: usize) {
    let table = read_table(file);
    if table.iter().all(|t| t.0 != gone) {
        return;
    }
    write_table(file, &without(&table, gone).unwrap_or_default());
}

impl Registry {
    /// The table's side of leaving (the socket is closed), under its lock.
    fn leave_locked(&self) {
        if slot_owner(&self.file, self.slot) == self.owner {
            let _ = clear_slot(&self.file, self.slot);
            let _ = bump(&self.file);
            predict_leave(&self.file, self.slot);
            let _ = std::fs::remove_file(connections_path(&self.path, self.slot));
        }
        // Gone from now on, not only once the file closes: a member that
        // leaves right after us (under the lock we still hold) must not
        // see our slot alive and leave the files to no one.
        let _ = ofd_lock::unlock(&self.file, lock_byte(self.slot));
        let others = (0..SLOTS).any(|s| s != self.slot && slot_alive(&self.file, s));
        if !others && same_file(&self.file, &self.path) {
            // Removed under the lock; a context that opened it and waits
            // for the lock sees it gone and starts a new one. With it go
            // the lists of members that died unnoticed (no one is left to
            // end their connections).
            for s in 0..SLOTS {
                let _ = std::fs::remove_file(connections_path(&self.path, s));
            }
            let _ = std::fs::remove_file(round_path(&self.path));
            let _ = std::fs::remove_file(secret_path(&self.path));
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Lists this member's connections where a member that takes back its
    /// slot after it died finds them (written beside and renamed, so a
    /// reader sees a whole list; no file for none).
    pub(crate) fn publish_connections(&self, conns: &[Leftover]) -> io::Result<()> {
        use std::fmt::Write as _;
        let path = connections_path(&self.path, self.slot);
        if conns.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let mut text = String::new();
        for c in conns {
            let _ = writeln!(
                text,
                "{} {:08x} {:08x} {:06x} {:016x}",
                c.peer, c.local_id, c.remote_id, c.remote_qpn, c.tid
            );
        }
        let tmp = crate::published::with_suffix(&path, ".new");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)
    }

    /// The connections of dead members this member took back slots of
    /// since the last call: the caller sends their DREQs.
    pub(crate) fn take_leftovers(&mut self) -> Vec<Leftover> {
        std::mem::take(&mut self.leftovers)
    }
}

impl Drop for Registry {
    /// A member dropped without [`Registry::leave`] (its socket closed
    /// first, outside the lock).
    fn drop(&mut self) {
        if !self.left && self.file.lock().is_ok() {
            self.leave_locked();
            let _ = self.file.unlock();
        }
    }
}

/// Whether `name` is a table's (not its round lock, connection lists or
/// a list being written).
fn is_table_name(name: &str) -> bool {
    name.starts_with("share-")
        && !name.ends_with(".round")
        && !name.contains(".conns-")
        && !name.contains(".new")
        && !name.contains(".secret")
}

/// How long the connection lists of a group whose members all died are
/// kept for a member that may take a slot back and end them.
const LEFTOVERS_KEPT: std::time::Duration = std::time::Duration::from_secs(3600);

/// [`sweep`]s `dir` on the first join there of this process: a process
/// joining many groups (tests, many contexts) pays for one pass.
fn sweep_once(dir: &Path, keep: &Path) {
    static SWEPT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut swept = SWEPT.lock().unwrap_or_else(|e| e.into_inner());
    if !swept.iter().any(|d| d == dir) {
        swept.push(dir.to_path_buf());
        drop(swept);
        sweep(dir, keep);
    }
}

/// Removes the tables (and round locks) of groups whose members are all
/// gone: the last member to leave removes its group's files, but one
/// that was killed, or whose process ended without closing the device,
/// leaves them, and every network namespace's link-local address makes
/// a group of its own, never joined again. A group with connection lists
/// younger than [`LEFTOVERS_KEPT`] is kept (a member that takes its slot
/// back ends those connections: a server restarted after a crash), and
/// so is one whose table lock is held (a join or leave under way; the
/// next pass looks again). Removed under the table's lock, as the last
/// leaver does, so a context opening it at the same time starts anew.
fn sweep(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        if path == keep || !is_table_name(&e.file_name().to_string_lossy()) {
            continue;
        }
        let recent = |s| {
            std::fs::metadata(connections_path(&path, s))
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().map_or(true, |age| age < LEFTOVERS_KEPT))
        };
        if (0..SLOTS).any(recent) {
            continue;
        }
        let Ok(file) = OpenOptions::new().read(true).write(true).open(&path) else { continue };
        if file.try_lock().is_err() {
            continue;
        }
        if same_file(&file, &path) && !(0..SLOTS).any(|s| slot_alive(&file, s)) {
            for s in 0..SLOTS {
                let _ = std::fs::remove_file(connections_path(&path, s));
            }
            let _ = std::fs::remove_file(round_path(&path));
            let _ = std::fs::remove_file(secret_path(&path));
            let _ = std::fs::remove_file(&path);
        }
        let _ = file.unlock();
    }
}

/// Where slot `s`'s owner lists its connections.
fn connections_path(table: &Path, s: usize) -> PathBuf {
    crate::published::with_suffix(table, &format!(".conns-{s}"))
}

/// Whether a context of the device at `addr` has listed connections (a
/// live one, or one that died and whose slot nobody took back yet).
pub(crate) fn has_connection_lists(addr: SocketAddr) -> bool {
    has_connection_lists_at(&path_of(addr))
}

fn has_connection_lists_at(table: &Path) -> bool {
    (0..SLOTS).any(|s| connections_path(table, s).exists())
}

/// Appends the connections dead slot `s`'s owner listed to `out`, and
/// removes the list (under the table's lock, before the slot is given
/// again).
fn take_connections(table: &Path, s: usize, out: &mut Vec<Leftover>) {
    let path = connections_path(table, s);
    if let Ok(text) = std::fs::read_to_string(&path) {
        out.extend(text.lines().filter_map(parse_connection));
    }
    let _ = std::fs::remove_file(&path);
}

/// One line of a connections list.
fn parse_connection(line: &str) -> Option<Leftover> {
    let mut f = line.split(' ');
    let peer = f.next()?.parse().ok()?;
    let mut hex = || f.next().and_then(|v| u64::from_str_radix(v, 16).ok());
    let local_id = u32::try_from(hex()?).ok()?;
    let remote_id = u32::try_from(hex()?).ok()?;
    let remote_qpn = u32::try_from(hex()?).ok()?;
    let tid = hex()?;
    Some(Leftover { peer, local_id, remote_id, remote_qpn, tid })
}

/// The kernel appended slot `s`'s socket to the group: so does the table.
fn append(file: &File, s: usize) {
    let mut table = read_table(file);
    if is_permutation(&table) && !table.is_empty() {
        table.push((s, table.len() as u32));
        write_table(file, &table);
    }
}

/// Every slot's owner pid (0: free), in one read: the periodic check
/// runs on the progress thread, where 64 `pread`s cost a quarter of a
/// millisecond.
fn slot_pids(file: &File) -> [u32; SLOTS] {
    let mut b = [0u8; SLOTS * 16];
    let mut pids = [0u32; SLOTS];
    if file.read_exact_at(&mut b, W_SLOTS * 8).is_ok() {
        for (s, pid) in pids.iter_mut().enumerate() {
            let w = &b[s * 16..s * 16 + 8];
            *pid = u64::from_le_bytes(w.try_into().unwrap_or_default()) as u32;
        }
    }
    pids
}

fn slot_owner(file: &File, s: usize) -> Owner {
    Owner {
        pid: read_word(file, W_SLOTS + 2 * s as u64) as u32,
        token: read_word(file, W_SLOTS + 2 * s as u64 + 1),
    }
}

fn clear_slot(file: &File, s: usize) -> io::Result<()> {
    for w in 0..LISTEN_PER_SLOT / 4 {
        write_word(file, W_LISTEN + (s * LISTEN_PER_SLOT / 4 + w) as u64, 0)?;
    }
    write_word(file, W_SLOTS + 2 * s as u64, 0)?;
    write_word(file, W_SLOTS + 2 * s as u64 + 1, 0)
}

fn bump(file: &File) -> io::Result<()> {
    write_word(file, W_GENERATION, read_word(file, W_GENERATION).wrapping_add(1))
}

/// A probe datagram for `index` of `round`.
pub(crate) fn probe(round: u32, index: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(PROBE_LEN + index as usize);
    p.extend_from_slice(&PROBE_MAGIC);
    p.extend_from_slice(&round.to_be_bytes());
    p.extend_from_slice(&index.to_be_bytes());
    p.resize(PROBE_LEN + index as usize, 0);
    p
}

/// A received datagram's probe fields, if it is one.
pub(crate) fn parse_probe(d: &[u8]) -> Option<(u32, u32)> {
    if d.len() < PROBE_LEN || d[..8] != PROBE_MAGIC {
        return None;
    }
    let round = u32::from_be_bytes(d[8..12].try_into().ok()?);
    let index = u32::from_be_bytes(d[12..16].try_into().ok()?);
    Some((round, index))
}

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Insn {
    pub(crate) code: u16,
    pub(crate) jt: u8,
    pub(crate) jf: u8,
    pub(crate) k: u32,
}

const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const JA: u16 = 0x05;
const JEQ_K: u16 = 0x15;
const AND_K: u16 = 0x54;
const RSH_K: u16 = 0x74;
const RET_K: u16 = 0x06;
const RET_A: u16 = 0x16;

/// What the kernel does with an index past the group's sockets: picks one
/// by its hash, as if there were no program.
pub(crate) const ANY: u32 = u32::MAX;

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// Where a CM MAD's fields are, from the start of the UDP payload (BTH
/// 12 bytes, DETH 8, then the MAD): the attribute ID; the message's first
/// two words (REQ, SIDR_REQ, SIDR_REP: the sender's or our request ID;
/// the others: the sender's ID, then ours); the REQ's and SIDR_REQ's
/// service ID ends with the port.
const MAD_ATTR: u32 = 36;
const MAD_ID0: u32 = 44;
const MAD_ID1: u32 = 48;
const MAD_SERVICE_PORT: u32 = 58;
const ATTR_REQ: u32 = 0x0010;
const ATTR_SIDR_REQ: u32 = 0x0017;
const ATTR_SIDR_REP: u32 = 0x0018;
/// Communication IDs carry the slot in their top bits (`CmAgent::set_id_prefix`).
pub(crate) const COMM_ID_SLOT_BITS: u32 = 6;
/// Ports steered by one program (its size stays far below the kernel's
/// 4096 instructions).
const MAX_LISTENS: usize = 1024;

/// The steering program. Offsets are from the start of the UDP payload:
/// - a probe (bytes 0..8 the magic) goes to the index in bytes 12..16;
/// - a packet to a QPN other than 1 goes to the socket of the slot in the
///   QPN's top bits, as `table` (`(slot, index)`) says, or anywhere;
/// - a CM datagram (QPN 1): a REQ or SIDR_REQ to whoever listens on its
///   service's port (`listens`: `(port, index)`), any other MAD to the slot
///   in the top bits of the communication ID it carries for us; and what
///   no rule places to the lowest slot's connection manager, which answers
///   as a host with nobody listening does.
pub(crate) fn program(table: &[(usize, u32)], listens: &[(u16, u32)]) -> Vec<Insn> {
    let m0 = u32::from_be_bytes(PROBE_MAGIC[..4].try_into().unwrap_or_default());
    let m1 = u32::from_be_bytes(PROBE_MAGIC[4..].try_into().unwrap_or_default());
    let table = &table[..table.len().min(SLOTS)];
    let listens = &listens[..listens.len().min(MAX_LISTENS)];
    let leader = table.iter().min_by_key(|t| t.0).map_or(ANY, |t| t.1);
    // `slot → index` comparisons, then `default`.
    let lookup = |p: &mut Vec<Insn>, default: u32| {
        for &(slot, index) in table {
            p.push(insn(JEQ_K, 0, 1, slot as u32));
            p.push(insn(RET_K, 0, 0, index));
        }
        p.push(insn(RET_K, 0, 0, default));
    };
    let lookup_len = (2 * table.len() + 1) as u8;
    let mut p = vec![
        insn(LD_W_ABS, 0, 0, 0),
        insn(JEQ_K, 0, 4, m0), // not a probe: to 6
        insn(LD_W_ABS, 0, 0, 4),
        insn(JEQ_K, 0, 2, m1), // not a probe: to 6
        insn(LD_W_ABS, 0, 0, 12),
        insn(RET_A, 0, 0, 0),    // the probe's index
        insn(LD_W_ABS, 0, 0, 4), // BTH bytes 4..8
        insn(AND_K, 0, 0, 0x00ff_ffff),
        insn(JEQ_K, 1 + lookup_len, 0, 1), // QPN 1: to the CM part
        insn(RSH_K, 0, 0, QPN_SHIFT),
    ];
    lookup(&mut p, ANY);
    // The CM part.
    let to_req = 6 + lookup_len;
    p.push(insn(LD_H_ABS, 0, 0, MAD_ATTR));
    p.push(insn(JEQ_K, to_req, 0, ATTR_REQ));
    p.push(insn(JEQ_K, to_req - 1, 0, ATTR_SIDR_REQ));
    p.push(insn(JEQ_K, 0, 2, ATTR_SIDR_REP));
    p.push(insn(LD_W_ABS, 0, 0, MAD_ID0));
    p.push(insn(JA, 0, 0, 1));
    p.push(insn(LD_W_ABS, 0, 0, MAD_ID1));
    p.push(insn(RSH_K, 0, 0, 32 - COMM_ID_SLOT_BITS));
    lookup(&mut p, leader);
    p.push(insn(LD_H_ABS, 0, 0, MAD_SERVICE_PORT));
    for &(port, index) in listens {
        p.push(insn(JEQ_K, 0, 1, u32::from(port)));
        p.push(insn(RET_K, 0, 0, index));
    }
    p.push(insn(RET_K, 0, 0, leader));
    p
}

/// Runs `prog` over `packet` as the kernel's classic BPF would (for the
/// instructions [`program`] uses); a load past the end returns 0.
#[cfg(any(test, feature = "dpdk"))]
pub(crate) fn run(prog: &[Insn], packet: &[u8]) -> u32 {
    let mut a = 0u32;
    let mut pc = 0usize;
    while let Some(i) = prog.get(pc) {
        pc += 1;
        match i.code {
            LD_W_ABS => {
                let at = i.k as usize;
                let Some(b) = packet.get(at..at + 4) else { return 0 };
                a = u32::from_be_bytes(b.try_into().unwrap_or_default());
            }
            LD_H_ABS => {
                let at = i.k as usize;
                let Some(b) = packet.get(at..at + 2) else { return 0 };
                a = u32::from(u16::from_be_bytes(b.try_into().unwrap_or_default()));
            }
            JA => pc += i.k as usize,
            JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
            AND_K => a &= i.k,
            RSH_K => a >>= i.k,
            RET_K => return i.k,
            RET_A => return a,
            _ => return 0,
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bth_to(qpn: u32) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x04; // RC SEND Only
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p
    }

    /// A CM MAD to QPN 1: attribute `attr`, its first two words.
    fn mad(attr: u16, id0: u32, id1: u32, port: u16) -> Vec<u8> {
        let mut p = bth_to(1);
        p.resize(256, 0);
        p[12] = 0x80; // DETH Q_Key 0x80010000
        p[14] = 0x01;
        p[20] = 1; // base version
        p[21] = 7; // CM class
        p[36..38].copy_from_slice(&attr.to_be_bytes());
        p[44..48].copy_from_slice(&id0.to_be_bytes());
        p[48..52].copy_from_slice(&id1.to_be_bytes());
        p[58..60].copy_from_slice(&port.to_be_bytes());
        p
    }

    /// A fresh directory of this test's own and the table's path in it.
    fn table_in_fresh_dir(tag: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("uroce-share-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("share-table");
        (dir, path)
    }

    fn join(path: &std::path::Path) -> Registry {
        Registry::join_at(path.to_path_buf(), None, || Ok(()), |(), _| {}).unwrap().unwrap().0
    }

    fn id_of(slot: u32) -> u32 {
        (slot << (32 - COMM_ID_SLOT_BITS)) | 0x1234
    }

    #[test]
    fn the_program_steers_by_slot_probe_and_cm() {
        let prog = program(&[(0, 2), (1, 0), (5, 1)], &[(7174, 1), (9999, 0)]);
        assert_eq!(run(&prog, &bth_to(0x11)), 2, "slot 0");
        assert_eq!(run(&prog, &bth_to((1 << QPN_SHIFT) | 7)), 0, "slot 1");
        assert_eq!(run(&prog, &bth_to((5 << QPN_SHIFT) | 0x3ffff)), 1, "slot 5");
        assert_eq!(run(&prog, &bth_to(3 << QPN_SHIFT)), ANY, "an unknown slot");
        for k in [0, 3, 63] {
            assert_eq!(run(&prog, &probe(9, k)), k, "probe {k}");
        }
        // A datagram that starts like a probe but is not one.
        let mut p = probe(1, 3);
        p[6] = b'x';
        assert_eq!(run(&prog, &p), run(&prog, &bth_to(u32::from_be_bytes([0, b'-', b'x', b'r']))));
        // CM: requests by port, the rest by our communication ID.
        assert_eq!(run(&prog, &mad(0x10, 55, 0, 7174)), 1, "REQ to a listener");
        assert_eq!(run(&prog, &mad(0x17, 55, 0, 9999)), 0, "SIDR_REQ to a listener");
        assert_eq!(run(&prog, &mad(0x10, 55, 0, 1)), 2, "REQ nobody listens to: slot 0's");
        assert_eq!(run(&prog, &mad(0x13, 55, id_of(5), 0)), 1, "REP for slot 5");
        assert_eq!(run(&prog, &mad(0x15, 55, id_of(1), 0)), 0, "DREQ for slot 1");
        assert_eq!(run(&prog, &mad(0x12, 55, id_of(0), 0)), 2, "REJ for slot 0");
        assert_eq!(run(&prog, &mad(0x18, id_of(5), 0, 0)), 1, "SIDR_REP for slot 5");
        assert_eq!(run(&prog, &mad(0x14, 55, id_of(9), 0)), 2, "RTU for a slot gone");
        // With nothing measured, everything may go anywhere.
        assert_eq!(run(&program(&[], &[]), &mad(0x10, 1, 0, 7174)), ANY);
        assert_eq!(run(&program(&[], &[]), &bth_to(0x11)), ANY);
        // The largest program stays within the kernel's limit and its jumps.
        let table: Vec<(usize, u32)> = (0..SLOTS).map(|s| (s, s as u32)).collect();
        let listens: Vec<(u16, u32)> = (1..5000).map(|p| (p as u16, 3)).collect();
        let big = program(&table, &listens);
        assert!(big.len() < 4096, "{}", big.len());
        assert_eq!(run(&big, &mad(0x10, 1, 0, 1000)), 3);
        assert_eq!(run(&big, &bth_to(63 << QPN_SHIFT)), 63);
        assert_eq!(run(&big, &mad(0x16, 1, id_of(63), 0)), 63);
    }

    #[test]
    fn a_leaving_socket_is_replaced_by_the_last() {
        let t = [(0, 0), (3, 1), (5, 2), (9, 3)];
        assert_eq!(without(&t, 3), Some(vec![(0, 0), (5, 2), (9, 1)]));
        assert_eq!(without(&t, 9), Some(vec![(0, 0), (3, 1), (5, 2)]));
        assert_eq!(without(&[(4, 0)], 4), Some(vec![]));
        assert_eq!(without(&[(0, 0), (1, 2)], 0), None, "not a whole table");
        assert_eq!(without(&t, 7), None, "not a member");
    }

    /// A slot whose process is gone is taken back by the next member that
    /// looks, the indices are predicted as the kernel reorders them, and
    /// the slot's next owner is appended and starts a QPN block further.
    #[test]
    fn a_dead_members_slot_is_taken_back() {
        let (dir, path) = table_in_fresh_dir("test");
        let mut a = join(&path);
        let b = join(&path);
        let c = join(&path);
        assert_eq!((a.slot(), b.slot(), c.slot()), (0, 1, 2));
        assert_eq!(read_table(&a.file), vec![(0, 0), (1, 1), (2, 2)], "predicted in join order");
        a.set_table(&[(0, 0), (1, 1), (2, 2)], None, |_| {});
        // Slot 1's owner dies: its lock goes (as when the kernel closes a
        // killed process's files), its words stay.
        ofd_lock::unlock(&b.file, lock_byte(1)).unwrap();
        let generation = a.generation();
        assert_eq!(a.live_slots(), vec![0, 2]);
        assert!(a.generation() > generation, "a change the members measure");
        assert_eq!(read_table(&a.file), vec![(0, 0), (2, 1)], "the last moved into the hole");
        let d = join(&path);
        assert_eq!(d.slot(), 1, "the slot taken back");
        assert_eq!(read_table(&a.file), vec![(0, 0), (1, 2), (2, 1)], "appended");
        assert_eq!(a.qpn_start(), 0);
        assert_eq!(d.qpn_start(), QPN_BLOCK, "its second owner starts a block further");
        // The dead member's late drop leaves its successor's slot alone.
        drop(b);
        assert_eq!(slot_owner(&a.file, 1), d.owner);
        assert_eq!(a.live_slots(), vec![0, 1, 2]);
        // A member that leaves: the last index fills its place.
        drop(c);
        assert_eq!(read_table(&a.file), vec![(0, 0), (1, 1)]);
        drop((a, d));
        assert!(!path.exists(), "the last member removes the table");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn probes_and_answers_round_trip() {
        let p = probe(77, 5);
        assert_eq!(p.len(), PROBE_LEN + 5);
        assert_eq!(parse_probe(&p), Some((77, 5)));
        assert_eq!(parse_probe(&bth_to(5)), None);
        assert_eq!(parse_answer(answer(3, 17)), Some((3, 17)));
        assert_eq!(parse_answer(answer(3, 17) ^ 1), None, "a torn word");
    }

    /// Joins are predicted in the order they bind and steered at once; a
    /// join whose bind fails gives its slot back; a leaver steers the
    /// group as it will be before its socket closes.
    #[test]
    fn joins_and_leaves_steer_under_the_lock() {
        let (dir, path) = table_in_fresh_dir("steer");
        let mut a = join(&path);
        assert_eq!(read_table(&a.file), vec![(0, 0)], "alone: index 0");
        assert_eq!(a.measured(), a.generation(), "nothing to measure");
        let b = join(&path);
        let mut steered = None;
        let (c, ()) = Registry::join_at(
            path.clone(),
            None,
            || Ok(()),
            |(), prog| {
                steered = Some(run(prog, &bth_to(2 << QPN_SHIFT)));
            },
        )
        .unwrap()
        .unwrap();
        assert_eq!(steered, Some(2), "the joiner's program knows its index");
        assert_eq!(read_table(&a.file), vec![(0, 0), (1, 1), (2, 2)]);
        let failed = Registry::join_at(
            path.clone(),
            None,
            || Err::<(), _>(io::ErrorKind::AddrInUse.into()),
            |(), _| panic!("no program for a socket that did not bind"),
        )
        .unwrap();
        assert_eq!(failed.unwrap_err().kind(), io::ErrorKind::AddrInUse);
        assert_eq!(a.live_slots(), vec![0, 1, 2], "the failed join's slot is free");
        let mut steered = None;
        b.leave(|prog| steered = Some(run(prog, &bth_to(2 << QPN_SHIFT))));
        assert_eq!(steered, Some(1), "the last socket steered into the leaver's hole");
        assert_eq!(read_table(&a.file), vec![(0, 0), (2, 1)]);
        assert_eq!(a.live_slots(), vec![0, 2]);
        drop((a, c));
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A context's other addresses are joined in the slot its QPNs name:
    /// given if free (however many lower ones are), refused while a live
    /// member holds it, given again once that member is gone.
    #[test]
    fn a_second_address_is_joined_in_the_named_slot() {
        let (dir, path) = table_in_fresh_dir("named");
        let join_as = |s| Registry::join_at(path.clone(), Some(s), || Ok(()), |(), _| {});
        let (c, ()) = join_as(3).unwrap().unwrap();
        assert_eq!(c.slot(), 3);
        assert_eq!(read_table(&c.file), vec![(3, 0)], "alone: index 0");
        let mut a = join(&path);
        assert_eq!(a.slot(), 0, "a plain join takes the first free slot");
        assert_eq!(read_table(&a.file), vec![(0, 1), (3, 0)]);
        assert_eq!(join_as(3).unwrap_err().kind(), io::ErrorKind::AddrInUse, "slot 3 is live");
        assert_eq!(join_as(SLOTS).unwrap_err().kind(), io::ErrorKind::AddrInUse, "no such slot");
        assert_eq!(a.live_slots(), vec![0, 3], "a refused join leaves nothing behind");
        c.leave(|_| {});
        let (again, ()) = join_as(3).unwrap().unwrap();
        assert_eq!(again.slot(), 3);
        assert_eq!(read_table(&a.file), vec![(0, 0), (3, 1)]);
        drop((a, again));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A member's connection list reads back as written (IPv4 and IPv6
    /// peers, full-width IDs), is gone when it has none, and a torn or
    /// foreign line is skipped.
    #[test]
    fn connection_lists_read_back() {
        let (dir, path) = table_in_fresh_dir("conns");
        let a = join(&path);
        let conns = [
            Leftover {
                peer: "10.0.0.2".parse().unwrap(),
                local_id: 0xfc00_0001,
                remote_id: 0x1234_5678,
                remote_qpn: 0xff_ffff,
                tid: u64::MAX,
            },
            Leftover {
                peer: "fe80::1".parse().unwrap(),
                local_id: 1,
                remote_id: 2,
                remote_qpn: 3,
                tid: 4,
            },
        ];
        a.publish_connections(&conns).unwrap();
        assert!(has_connection_lists_at(&path));
        let list = connections_path(&path, a.slot());
        let mut text = std::fs::read_to_string(&list).unwrap();
        text.push_str("10.0.0.3 zz\n");
        std::fs::write(&list, text).unwrap();
        let mut got = Vec::new();
        take_connections(&path, a.slot(), &mut got);
        assert_eq!(got, conns);
        assert!(!list.exists(), "taken lists are removed");
        a.publish_connections(&conns).unwrap();
        a.publish_connections(&[]).unwrap();
        assert!(!has_connection_lists_at(&path), "no list for no connections");
        drop(a);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A group whose members all died is swept with its round lock; a
    /// live group, and a dead one whose connections a later member must
    /// end, are kept, the latter for an hour.
    #[test]
    fn dead_groups_are_swept() {
        let (dir, live) = table_in_fresh_dir("sweep");
        let a = join(&live);
        let died = |name: &str| {
            let path = dir.join(name);
            let mut m = join(&path);
            m.left = true; // killed: its files close, its words stay
            (m.slot(), path)
        };
        let (_, dead) = died("share-dead");
        let (slot, with_conns) = died("share-with-conns");
        let list = connections_path(&with_conns, slot);
        std::fs::write(&list, "10.0.0.2 1 2 3 4\n").unwrap();
        assert!(dead.exists() && round_path(&dead).exists());
        sweep(&dir, &dir.join("share-none"));
        assert!(!dead.exists() && !round_path(&dead).exists(), "a dead group is swept");
        assert!(live.exists(), "a live group is kept");
        assert!(with_conns.exists() && list.exists(), "a group with connection lists is kept");
        let old = std::time::SystemTime::now() - LEFTOVERS_KEPT - std::time::Duration::from_secs(1);
        File::options().write(true).open(&list).unwrap().set_modified(old).unwrap();
        sweep(&dir, &dir.join("share-none"));
        assert!(!with_conns.exists() && !list.exists(), "unless the lists are old");
        assert!(live.exists());
        assert!(!is_table_name("share-1-10.0.0.1-4791.round"));
        assert!(!is_table_name("share-1-10.0.0.1-4791.conns-3"));
        assert!(is_table_name("share-1-fe80::1-4791"));
        assert!(!is_table_name("share-1-10.0.0.1-4791.secret"), "a device's secret stays");
        drop(a);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A group's secret: made once, the same for every member that asks,
    /// readable by its user only.
    #[test]
    fn a_groups_secret_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("uroce-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = secret_path(&dir.join("share-1-10.0.0.1-4791"));
        let first = secret_at(&path);
        assert_ne!(first, 0);
        assert_eq!(secret_at(&path), first);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Liveness is the slot's lock, not a pid: a member whose pid means
    /// something else in this PID namespace (pid 1 of a container, a pid
    /// that exited here) is alive while it holds its lock.
    #[test]
    fn a_member_lives_while_its_lock_does() {
        let (dir, path) = table_in_fresh_dir("lock");
        let mut a = join(&path);
        let b = join(&path);
        for pid in [1, 0x7fff_fff0] {
            write_word(&a.file, W_SLOTS + 2, pid).unwrap();
            assert_eq!(a.live_slots(), vec![0, 1], "pid {pid}");
            assert_eq!(join(&path).slot(), 2, "slot 1 is not free");
        }
        drop((a, b));
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
