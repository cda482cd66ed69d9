//! Counters other processes can read while a program runs, the way rxe's
//! sit in `/sys/class/infiniband/<dev>/ports/1/hw_counters`: each open
//! context's progress thread takes a snapshot of its device totals and
//! per-QP counters about ten times a second, and a writer thread of the
//! process (not the progress thread: a rename can block for milliseconds) writes it to
//! `<run dir>/<device>/<pid>.<context>.<pid namespace>`, whole files only
//! (written beside and renamed), and removes it on close. Beside it,
//! `<name>.live` carries an OFD lock for as long as the context lives, so
//! `uroce stat` sums the files of live contexts only and clears those of
//! processes that died, from any PID namespace (a pid alone would be
//! neither unique nor checkable across them).
//!
//! The run directory is `$UROCE_RUN_DIR`, else `$XDG_RUNTIME_DIR/uroce`,
//! else `/tmp/uroce-<uid>`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use uroce_transport::Stats;

/// rxe's counter names (`hw_counters`) in rxe's order, each with the
/// uroce counter it reads; uroce's own follow them in a snapshot.
pub const RXE_COUNTERS: [&str; 15] = [
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
];

/// One process context's counters, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The device name.
    pub device: String,
    /// The publishing process.
    pub pid: u32,
    /// Device totals (every QP, live or destroyed, and device-level drops).
    pub device_stats: Stats,
    /// Live QPs: number and counters.
    pub qps: Vec<(u32, Stats)>,
    /// The context's objects, for `rdma res show qp/cq/mr`.
    pub objects: Vec<Object>,
}

/// A verbs object as `rdma res show` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Object {
    /// A QP: number, `ib_qp_type`, `ib_qp_state`, the peer's QP number,
    /// the PSNs the responder expects and the requester sends next, PD,
    /// SRQ (0: none).
    Qp {
        qpn: u32,
        qp_type: u8,
        state: u8,
        dest_qpn: u32,
        rq_psn: u32,
        sq_psn: u32,
        pd: u32,
        srq: u32,
    },
    /// An SRQ: number, `ib_srq_type` (basic, XRC, TM), its PD and CQ (0:
    /// none known: a basic SRQ's).
    Srq { srqn: u32, srq_type: u8, pd: u32, cq: u32 },
    /// A CQ: number, size and the QPs using it.
    Cq { cqn: u32, cqe: u32, users: u32 },
    /// A memory region: key (L_Key and R_Key), IOVA, length, PD.
    Mr { key: u32, iova: u64, len: u64, pd: u32 },
    /// A PD: number, and its QPs and MRs.
    Pd { pdn: u32, users: u32 },
}

/// The directory snapshots live under.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UROCE_RUN_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("uroce");
    }
    // The owner of /proc/self is this process's effective uid (no unsafe
    // getuid() outside the unsafe modules).
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    PathBuf::from(format!("/tmp/uroce-{uid}"))
}

/// `path` with `suffix` appended to its file name.
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// Where one context publishes its counters.
///
/// The progress thread only hands a snapshot over ([`Publication::offer`]);
/// a process-wide writer thread puts it on disk. A rename on a disk file
/// system can block for milliseconds (ext4 mounted with `discard` frees
/// the replaced file's blocks synchronously: 0.3–3 ms measured here, in
/// uninterruptible sleep), and the progress thread is what serves the
/// peers: ten such stalls a second cost a short benchmark its result and
/// every latency its tail.
#[derive(Debug)]
pub(crate) struct Publication {
    shared: std::sync::Arc<Shared>,
}

/// What a context and the writer thread share.
#[derive(Debug)]
struct Shared {
    path: PathBuf,
    /// `<path>.live`, locked while the context lives; made at the first
    /// write (a context that never publishes leaves no file).
    live: std::sync::OnceLock<Option<std::fs::File>>,
    /// The snapshot waiting to be written; held while one is written, so
    /// that the context's end (which removes the files) never interleaves
    /// with a write that would leave them behind.
    pending: std::sync::Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    snapshot: Option<Snapshot>,
    /// The context ended: nothing more is written.
    closed: bool,
}

impl Publication {
    /// A name no other context of any process on this host has: pid,
    /// context number, and the PID namespace's inode.
    pub(crate) fn new(device: &str) -> Self {
        use std::os::unix::fs::MetadataExt;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let ns = std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino());
        let name = format!("{}.{n}.{ns}", std::process::id());
        Self::at(run_dir().join(device).join(name))
    }

    fn at(path: PathBuf) -> Self {
        let shared = Shared {
            path,
            live: std::sync::OnceLock::new(),
            pending: std::sync::Mutex::new(Pending::default()),
        };
        Self { shared: std::sync::Arc::new(shared) }
    }

    /// Hands `s` to the writer thread (replacing one not yet written);
    /// never waits for a write under way (the snapshot is then skipped).
    pub(crate) fn offer(&self, s: Snapshot) {
        let Ok(mut p) = self.shared.pending.try_lock() else { return };
        p.snapshot = Some(s);
        drop(p);
        writer::enlist(&self.shared);
    }

    /// Writes `s` now, on the calling thread.
    #[cfg(test)]
    pub(crate) fn write(&self, s: &Snapshot) -> std::io::Result<()> {
        self.shared.write(s)
    }
}

impl Shared {
    /// The liveness lock: made under a temporary name, locked, then
    /// renamed into place, so that no reader ever sees it unlocked.
    fn make_live(&self) -> Option<std::fs::File> {
        let dir = self.path.parent()?;
        std::fs::create_dir_all(dir).ok()?;
        let fresh = with_suffix(&self.path, ".live-new");
        let f = std::fs::File::create(&fresh).ok()?;
        crate::ofd_lock::lock(&f, 0).ok()?;
        std::fs::rename(&fresh, with_suffix(&self.path, ".live")).ok()?;
        Some(f)
    }

    /// Writes `s` whole (a temporary beside it, then a rename).
    fn write(&self, s: &Snapshot) -> std::io::Result<()> {
        if self.live.get_or_init(|| self.make_live()).is_none() {
            return Err(std::io::ErrorKind::Other.into());
        }
        let tmp = with_suffix(&self.path, ".tmp");
        std::fs::write(&tmp, render(s))?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Writes the pending snapshot, if any (the writer thread's step).
    fn flush(&self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.closed {
            return;
        }
        if let Some(s) = p.snapshot.take() {
            // Best effort: a full or read-only disk costs only `uroce stat`.
            let _ = self.write(&s);
        }
    }
}

impl Drop for Publication {
    fn drop(&mut self) {
        // Waits for a write under way, and stops the ones to come.
        let mut p = self.shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.closed = true;
        p.snapshot = None;
        let path = &self.shared.path;
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(with_suffix(path, ".tmp"));
        if self.shared.live.get().is_some_and(Option::is_some) {
            let _ = std::fs::remove_file(with_suffix(path, ".live"));
        }
    }
}

/// The process's writer thread: it writes each waiting publication's
/// latest snapshot, and ends after a second with none (started again by
/// the next offer), so a process without contexts keeps no thread.
mod writer {
    use std::sync::{Arc, Condvar, Mutex, Weak};
    use std::time::Duration;

    use super::Shared;

    /// Publications with a snapshot to write, and whether a thread runs.
    static QUEUE: Mutex<Queue> =
        Mutex::new(Queue { waiting: Vec::new(), running: false, generation: 0 });
    static WORK: Condvar = Condvar::new();

    /// How long the thread waits for work before it ends.
    const LINGER: Duration = Duration::from_secs(1);

    struct Queue {
        waiting: Vec<Weak<Shared>>,
        running: bool,
        /// The process generation the queue is of (see
        /// `exit::generation`): a forked child has no writer thread,
        /// and the parent's publications are not its to write.
        generation: u64,
    }

    /// Puts `shared` on the queue, waking the thread or starting one.
    pub(super) fn enlist(shared: &Arc<Shared>) {
        let mut q = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
        let generation = crate::exit::generation();
        if q.generation != generation {
            *q = Queue { waiting: Vec::new(), running: false, generation };
        }
        if !q.waiting.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(shared))) {
            q.waiting.push(Arc::downgrade(shared));
        }
        if q.running {
            WORK.notify_one();
            return;
        }
        let spawned = std::thread::Builder::new().name("uroce-stat".into()).spawn(run);
        q.running = spawned.is_ok();
    }

    fn run() {
        loop {
            let batch = {
                let mut q = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
                while q.waiting.is_empty() {
                    let (g, wait) = WORK.wait_timeout(q, LINGER).unwrap_or_else(|e| e.into_inner());
                    q = g;
                    if wait.timed_out() && q.waiting.is_empty() {
                        q.running = false;
                        return;
                    }
                }
                std::mem::take(&mut q.waiting)
            };
            // Only weak references: a context that ends meanwhile is not
            // dropped here, and its publication's end waits for a write.
            for w in batch {
                if let Some(s) = w.upgrade() {
                    s.flush();
                }
            }
        }
    }
}

/// A snapshot as its file holds it.
fn render(s: &Snapshot) -> String {
    let mut text = format!("device {}\npid {}\n", s.device, s.pid);
    for (name, v) in s.device_stats.iter() {
        let _ = writeln!(text, "dev {name} {v}");
    }
    for (qpn, st) in &s.qps {
        for (name, v) in st.iter() {
            let _ = writeln!(text, "qp {qpn} {name} {v}");
        }
    }
    for o in &s.objects {
        let _ = match *o {
            Object::Qp { qpn, qp_type, state, dest_qpn, rq_psn, sq_psn, pd, srq } => writeln!(
                text,
                "res-qp {qpn} {qp_type} {state} {dest_qpn} {rq_psn} {sq_psn} {pd} {srq}"
            ),
            Object::Srq { srqn, srq_type, pd, cq } => {
                writeln!(text, "res-srq {srqn} {srq_type} {pd} {cq}")
            }
            Object::Cq { cqn, cqe, users } => writeln!(text, "res-cq {cqn} {cqe} {users}"),
            Object::Mr { key, iova, len, pd } => writeln!(text, "res-mr {key} {iova} {len} {pd}"),
            Object::Pd { pdn, users } => writeln!(text, "res-pd {pdn} {users}"),
        };
    }
    text
}

/// An object line's fields after its kind.
fn object(kind: &str, f: &[&str]) -> Option<Object> {
    let n = |i: usize| -> Option<u64> { f.get(i)?.parse().ok() };
    let n32 = |i: usize| -> Option<u32> { f.get(i)?.parse().ok() };
    Some(match (kind, f.len()) {
        ("res-qp", 8) => Object::Qp {
            qpn: n32(0)?,
            qp_type: f[1].parse().ok()?,
            state: f[2].parse().ok()?,
            dest_qpn: n32(3)?,
            rq_psn: n32(4)?,
            sq_psn: n32(5)?,
            pd: n32(6)?,
            srq: n32(7)?,
        },
        ("res-srq", 4) => {
            Object::Srq { srqn: n32(0)?, srq_type: f[1].parse().ok()?, pd: n32(2)?, cq: n32(3)? }
        }
        ("res-cq", 3) => Object::Cq { cqn: n32(0)?, cqe: n32(1)?, users: n32(2)? },
        ("res-mr", 4) => Object::Mr { key: n32(0)?, iova: n(1)?, len: n(2)?, pd: n32(3)? },
        ("res-pd", 2) => Object::Pd { pdn: n32(0)?, users: n32(1)? },
        _ => return None,
    })
}

/// Parses a snapshot file; `None` if it is not one.
pub fn parse(text: &str) -> Option<Snapshot> {
    let mut s = Snapshot {
        device: String::new(),
        pid: 0,
        device_stats: Stats::default(),
        qps: Vec::new(),
        objects: Vec::new(),
    };
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["device", d] => s.device = (*d).to_string(),
            ["pid", p] => s.pid = p.parse().ok()?,
            ["dev", name, v] => {
                s.device_stats.set(name, v.parse().ok()?);
            }
            ["qp", qpn, name, v] => {
                let qpn: u32 = qpn.parse().ok()?;
                if s.qps.last().is_none_or(|(q, _)| *q != qpn) {
                    s.qps.push((qpn, Stats::default()));
                }
                s.qps.last_mut()?.1.set(name, v.parse().ok()?);
            }
            [kind, rest @ ..] if kind.starts_with("res-") => s.objects.push(object(kind, rest)?),
            _ => return None,
        }
    }
    (!s.device.is_empty() && s.pid != 0).then_some(s)
}

/// Whether the context that publishes `snapshot` lives: its `.live`
/// file is locked by another open file description.
fn lives(snapshot: &Path) -> bool {
    let live = with_suffix(snapshot, ".live");
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(live)
        .is_ok_and(|f| crate::ofd_lock::held_by_other(&f, 0))
}

/// The snapshots of live contexts for `device` (all devices if `None`);
/// the files of contexts that are gone are removed.
pub fn read_all(device: Option<&str>) -> Vec<Snapshot> {
    read_under(&run_dir(), device)
}

/// [`read_all`] in the run directory `root`.
fn read_under(root: &Path, device: Option<&str>) -> Vec<Snapshot> {
    let mut out = Vec::new();
    let Ok(devs) = std::fs::read_dir(root) else { return out };
    for d in devs.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        if device.is_some_and(|want| want != name) || !d.path().is_dir() {
            continue;
        }
        let Ok(files) = std::fs::read_dir(d.path()) else { continue };
        for f in files.flatten() {
            let p = f.path();
            let file = f.file_name().to_string_lossy().into_owned();
            // A lock being made, a snapshot being written, or a lock: each
            // belongs to the snapshot named without its suffix.
            let base = [".live-new", ".tmp", ".live"]
                .iter()
                .find_map(|sfx| file.strip_suffix(sfx).map(|b| (b.to_string(), *sfx)));
            match base {
                Some((_, ".live-new")) => {}
                Some((b, _)) => {
                    if !lives(&d.path().join(b)) {
                        let _ = std::fs::remove_file(&p);
                    }
                }
                None => {
                    if !lives(&p) {
                        let _ = std::fs::remove_file(&p);
                    } else if let Some(s) = std::fs::read_to_string(&p).ok().and_then(|t| parse(&t))
                    {
                        out.push(s);
                    }
                }
            }
        }
    }
    out.sort_by_key(|s| (s.device.clone(), s.pid));
    out
}

/// The value rxe's counter `name` has in `s`.
pub fn rxe_value(s: &Stats, name: &str) -> u64 {
    s.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offers reach the disk through the writer thread, and a context
    /// that ends at any moment of a write leaves no file behind.
    #[test]
    fn offers_are_written_by_the_writer_and_an_end_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("uroce-pub-offer-{}", std::process::id()));
        let dev = dir.join("uroce0");
        let s = |pid| Snapshot {
            device: "uroce0".into(),
            pid,
            device_stats: Stats { sent_pkts: u64::from(pid), ..Stats::default() },
            qps: Vec::new(),
            objects: Vec::new(),
        };
        let p = Publication::at(dev.join("7.0.1"));
        p.offer(s(7));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while read_under(&dir, None) != vec![s(7)] {
            assert!(std::time::Instant::now() < deadline, "the writer never wrote");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(p);
        for i in 0..50 {
            let p = Publication::at(dev.join(format!("8.{i}.1")));
            p.offer(s(8));
            if i % 2 == 0 {
                std::thread::yield_now();
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(std::fs::read_dir(&dev).map_or(0, Iterator::count), 0, "nothing left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn snapshots_round_trip_and_name_every_rxe_counter() {
        let mut a = Stats { sent_pkts: 7, rdma_recvs: 3, ..Stats::default() };
        a.ack_deferred = 2;
        let s = Snapshot {
            device: "uroce0".into(),
            pid: 42,
            device_stats: a,
            qps: vec![(0x11, Stats { rcvd_seq_err: 5, ..Stats::default() }), (0x12, a)],
            objects: vec![
                Object::Qp {
                    qpn: 0x11,
                    qp_type: 2,
                    state: 3,
                    dest_qpn: 0x40,
                    rq_psn: 9,
                    sq_psn: 0xff_ffff,
                    pd: 1,
                    srq: 0x13,
                },
                Object::Srq { srqn: 0x13, srq_type: 2, pd: 0, cq: 2 },
                Object::Cq { cqn: 2, cqe: 255, users: 2 },
                Object::Mr { key: 0x1a2b, iova: u64::MAX, len: 1 << 40, pd: 1 },
                Object::Pd { pdn: 1, users: 2 },
            ],
        };
        let dir = std::env::temp_dir().join(format!("uroce-pub-{}", std::process::id()));
        let dev = dir.join("uroce0");
        let p = Publication::at(dev.join("42.0.7"));
        p.write(&s).unwrap();
        p.write(&s).unwrap();
        // Left by processes that died: an old-style snapshot, a temporary,
        // and a snapshot whose lock nobody holds.
        std::fs::write(dev.join("1.0"), render(&s)).unwrap();
        std::fs::write(dev.join("9.tmp"), "").unwrap();
        std::fs::write(dev.join("5.0.7"), render(&s)).unwrap();
        std::fs::write(dev.join("5.0.7.live"), "").unwrap();
        assert_eq!(read_under(&dir, Some("uroce0")), vec![s.clone()], "only the live one");
        let mut left: Vec<String> = std::fs::read_dir(&dev)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["42.0.7", "42.0.7.live"], "the dead ones' files are cleared");
        drop(p);
        assert_eq!(std::fs::read_dir(&dev).unwrap().count(), 0, "a context removes its own");
        for name in RXE_COUNTERS {
            assert!(a.iter().any(|(n, _)| n == name), "{name} is not a uroce counter");
        }
        assert_eq!(rxe_value(&a, "ack_deferred"), 2);
        assert!(parse("device x\npid 1\nbogus line\n").is_none());
        assert!(parse("device x\npid 1\nres-qp 1 2 3\n").is_none(), "a short object line");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
