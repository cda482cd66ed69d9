//! An opened device: the driver, its lock, and the progress thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::device::Device;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::exit::generation;
use crate::progress::{Activity, Driven, Post, progress_thread};
use crate::staging::{Staged, StagedList};
use uroce_transport::Instant;

/// Who drives the protocol (retransmissions, serving a peer's READ, WRITE
/// and atomics, ACKs).
///
/// Chosen with [`Options::progress`] or the `UROCE_PROGRESS` environment
/// variable (`thread` or `inline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A background thread per context, so a passive side serves one-sided
    /// operations while its application does nothing. It busy-polls for a
    /// short adaptive window after activity, then sleeps on the socket; it
    /// steps aside while an application thread is polling (whoever polls
    /// drives progress), so two processes on two cores do not oversubscribe.
    Thread,
    /// No thread: progress happens only inside `post_send`, `post_recv` and
    /// `poll` calls. Lowest overhead; the application must keep polling.
    Inline,
}

/// How to open a device.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Progress mode.
    pub progress: ProgressMode,
    /// Initial busy-poll window of the progress thread.
    pub spin: Duration,
}

impl Default for Options {
    fn default() -> Self {
        let progress = match std::env::var("UROCE_PROGRESS").as_deref() {
            Ok("inline") => ProgressMode::Inline,
            _ => ProgressMode::Thread,
        };
        let spin = std::env::var("UROCE_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_micros(50), Duration::from_micros);
        Self { progress, spin }
    }
}

pub(crate) struct Inner {
    driver: Mutex<Driver>,
    /// Live address handles (AHs hold no driver state, only a count).
    pub(crate) ah_count: std::sync::atomic::AtomicU32,
    /// Live PDs by handle (PDs hold no driver state). A lock of its own,
    /// never held while calling out: a PD may go while the driver is
    /// held.
    pub(crate) pds: Mutex<std::collections::BTreeSet<u32>>,
    /// The async event queue (also held by the driver, which fills it).
    async_events: Arc<crate::channel::EventQueue<crate::AsyncEvent>>,
    pub(crate) device: Device,
    pub(crate) options: Options,
    /// When an application thread last drove progress.
    pub(crate) activity: Arc<Activity>,
    stop: AtomicBool,
    /// Rung by a deferred post while the progress thread sleeps.
    bell: crate::channel::EventQueue<()>,
    /// Where the progress thread publishes the counters (see `published`).
    published: crate::published::Publication,
    /// QPs with WRs staged while the driver was held elsewhere (see
    /// `staging`); the driver holds it too.
    staged: Arc<StagedList>,
    /// The Unix time of the clock's origin, in nanoseconds: a completion
    /// timestamp plus this is its wall-clock time.
    epoch_ns: u64,
    /// The process generation it was opened in (see `exit::generation`):
    /// a context of an earlier one is the parent's, inherited by a fork.
    generation: u64,
    /// Declared last, so dropped last: ends the count of `DROPPING`.
    _dropped: DropMark,
}

/// The live contexts, held across a fork by `fork_prepare`: the parent
/// lets go of them after it, the child never does (an inherited context
/// must not close: its files and connections are the parent's).
static FORK_HOLD: Mutex<Vec<Arc<Inner>>> = Mutex::new(Vec::new());

extern "C" fn fork_prepare() {
    let _ = std::panic::catch_unwind(|| {
        let held: Vec<Arc<Inner>> = LIVE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        *FORK_HOLD.lock().unwrap_or_else(|e| e.into_inner()) = held;
    });
}

extern "C" fn fork_parent() {
    let _ = std::panic::catch_unwind(|| {
        let held = std::mem::take(&mut *FORK_HOLD.lock().unwrap_or_else(|e| e.into_inner()));
        drop(held);
    });
}

extern "C" fn fork_child() {
    crate::exit::new_generation();
    // The parent's contexts being dropped are not this process's to wait
    // for at exit.
    DROPPING.store(0, Ordering::SeqCst);
    if let Ok(mut held) = FORK_HOLD.try_lock() {
        std::mem::forget(std::mem::take(&mut *held));
    }
}

/// Contexts being dropped (from the start of `Inner::drop` to its last
/// field's): the exit hook waits for them. A context whose last reference
/// was the progress thread's is dropped on that thread, and a process
/// that returns from `main` meanwhile would end it halfway, before its
/// backend removed its files.
static DROPPING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The last field of [`Inner`]: its drop ends the context's.
#[derive(Debug, Default)]
struct DropMark;

impl Drop for DropMark {
    fn drop(&mut self) {
        DROPPING.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Inner {
    /// See [`Context::wallclock_ns`] (the clock reads `ns + 1` at `ns`
    /// past its origin, see `Driver::now_at`).
    pub(crate) fn wallclock_ns(&self, timestamp: u64) -> u64 {
        self.epoch_ns + timestamp.saturating_sub(1)
    }

    /// A post rang the doorbell: what it queued leaves now (or with the
    /// burst it belongs to, see `Activity::on_post`), without a receive
    /// pass (a system call that finds nothing, on most posts) and without
    /// the "application is polling" mark (a program that posts and then
    /// waits on memory needs the progress thread to keep receiving).
    /// `awaited`: the post holds a WR whose completion the application
    /// waits for (see `uroce_transport::AWAITED_RUN`): it leaves now, with
    /// the burst queued before it.
    /// `wall_ns` and `now`: the post's clock reading (see
    /// `Inner::clock`).
    pub(crate) fn doorbell(&self, driver: &mut Driver, awaited: bool, wall_ns: u64, now: Instant) {
        match self.activity.on_post(wall_ns, driver.deferred_posts, awaited) {
            Post::Send => {
                crate::timeline::event("post", 0, u64::from(driver.deferred_posts));
                driver.transmit_at(now);
                self.activity.post_sent();
            }
            Post::Queue { wake } => {
                crate::timeline::event(
                    "post",
                    1 + u64::from(wake),
                    u64::from(driver.deferred_posts),
                );
                driver.deferred_posts += 1;
                if wake {
                    self.bell.push(());
                }
            }
        }
    }

    /// Called by application polls: run progress inline, and tell the
    /// background thread to keep out of the way for a while.
    pub(crate) fn app_progress(&self, driver: &mut Driver) {
        self.app_progress_at(driver, self.activity.wall_ns());
    }

    /// [`Inner::app_progress`] with the context's clock read at `wall_ns`.
    pub(crate) fn app_progress_at(&self, driver: &mut Driver, wall_ns: u64) {
        self.activity.touch_at(wall_ns);
        driver.progress_at(driver.now_at(wall_ns));
    }

    /// One clock read for a post or poll: nanoseconds on the context's
    /// clock (for the progress policy) and the protocol's time (the
    /// virtual clock's under simulation).
    pub(crate) fn clock(&self, driver: &Driver) -> (u64, Instant) {
        let wall_ns = self.activity.wall_ns();
        (wall_ns, driver.now_at(wall_ns))
    }

    /// Locks the driver. A poisoned lock (a panic while holding it) is
    /// recovered: the driver's state is updated in steps that leave it
    /// consistent.
    /// The device totals and the per-QP counters; with `all_qps` false,
    /// QPs that have counted nothing yet are left out (what the progress
    /// thread publishes: a thousand idle QPs cost it no counter lines, one
    /// object line each). The objects (QPs, CQs, MRs) for `rdma res`.
    fn snapshot(&self, all_qps: bool) -> crate::published::Snapshot {
        use crate::published::Object;
        let e = self.lock();
        let mut total = e.ep.stats;
        e.backend().add_counters(&mut total);
        let zero = uroce_transport::Stats::default();
        let mut qps: Vec<(u32, uroce_transport::Stats)> = Vec::new();
        let mut objects = Vec::with_capacity(e.ep.qp_count() + e.ep.cq_count() + e.mem.len());
        let srq_of: uroce_transport::fastmap::FastMap<u32, u32> =
            e.ep.qp_links().filter_map(|(qpn, _, _, srq)| Some((qpn, srq?))).collect();
        for q in e.ep.qps() {
            let s = q.stats();
            if *s != zero {
                total.accumulate(s);
                qps.push((q.qpn(), *s));
            } else if all_qps {
                qps.push((q.qpn(), *s));
            }
            let a = q.attr();
            objects.push(Object::Qp {
                qpn: q.qpn(),
                qp_type: q.init().qp_type as u8,
                state: a.state as u8,
                dest_qpn: a.dest_qpn,
                rq_psn: q.expected_psn().value(),
                sq_psn: q.next_psn().value(),
                pd: q.init().pd,
                srq: srq_of.get(&q.qpn()).copied().unwrap_or(0),
            });
        }
        // In number order, as the kernel lists them.
        objects.sort_by_key(|o| if let Object::Qp { qpn, .. } = o { *qpn } else { 0 });
        let mut srqs: Vec<_> = e.ep.srqs().collect();
        srqs.sort_unstable_by_key(|(n, _)| *n);
        for (srqn, srq) in srqs {
            let (srq_type, pd, cq) = match (srq.xrc(), srq.tm()) {
                (Some(x), _) => (1, x.pd, x.cq),
                (None, Some(t)) => (2, 0, t.cq()),
                (None, None) => (0, 0, 0),
            };
            objects.push(Object::Srq { srqn, srq_type, pd, cq });
        }
        let mut users: uroce_transport::fastmap::FastMap<u32, u32> = Default::default();
        for (_, send, recv, _) in e.ep.qp_links() {
            *users.entry(send).or_default() += 1;
            if recv != send {
                *users.entry(recv).or_default() += 1;
            }
        }
        let mut cqs: Vec<u32> = e.ep.cq_ids().collect();
        cqs.sort_unstable();
        for cqn in cqs {
            let cqe = e.ep.cq(cqn).map_or(0, |c| c.lock().capacity() as u32);
            let users = users.get(&cqn).copied().unwrap_or(0);
            objects.push(Object::Cq { cqn, cqe, users });
        }
        for (key, iova, len, pd) in e.mem.listing() {
            objects.push(Object::Mr { key, iova, len, pd });
        }
        drop(e);
        // A PD's users: its QPs and MRs.
        let pds = self.pds.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for pdn in pds {
            let users = objects
                .iter()
                .filter(
                    |o| matches!(o, Object::Qp { pd, .. } | Object::Mr { pd, .. } if *pd == pdn),
                )
                .count() as u32;
            objects.push(Object::Pd { pdn, users });
        }
        qps.sort_by_key(|(qpn, _)| *qpn);
        crate::published::Snapshot {
            device: self.device.name().to_string(),
            pid: std::process::id(),
            device_stats: total,
            qps,
            objects,
        }
    }

    ///
    /// Send WRs staged meanwhile enter their QPs first, so whatever the
    /// holder does next (a pass, a modify, a destroy, a post) comes after
    /// them. Never call it holding a QP's staging (see `staging`).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Driver> {
        let mut d = self.driver.lock().unwrap_or_else(|e| e.into_inner());
        self.take_staged(&mut d);
        d
    }

    /// The driver, if no other thread holds it (see [`Inner::lock`]).
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, Driver>> {
        let mut d = match self.driver.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        self.take_staged(&mut d);
        Some(d)
    }

    /// Puts `q` on the list of queues with staged WRs (once: see
    /// `QpPost::stage`) and wakes a sleeping progress thread to take them
    /// in; a thread stepping aside, or the application's next poll, does
    /// it otherwise.
    pub(crate) fn list_staged(&self, q: Staged) {
        self.staged.push(q);
        if self.activity.wake_sleeping() {
            self.bell.push(());
        }
    }

    /// Moves every staged WR into its QP (see [`Inner::lock`]).
    fn take_staged(&self, d: &mut Driver) {
        if self.staged.any() {
            let now = d.now();
            d.take_staged(now);
        }
    }
}

/// An opened device (`ibv_context`). Cheap to clone; every object created
/// from it keeps it alive.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("device", &self.inner.device.name()).finish()
    }
}

impl Device {
    /// Opens the device with default [`Options`] (`ibv_open_device`).
    ///
    /// # Errors
    /// [`Error::Open`] if its address cannot be bound (not local, or the
    /// port taken by another process).
    pub fn open(&self) -> Result<Context> {
        self.open_with(Options::default())
    }

    /// The context of this device that the process already has open, or
    /// a new one with default [`Options`]: one driver (and one UDP port)
    /// per device per process, shared by every opener, as the C library's
    /// `ibv_open_device` shares it and as a connection manager in the same
    /// process must.
    ///
    /// # Errors
    /// As [`Device::open`].
    pub fn open_shared(&self) -> Result<Context> {
        static OPEN: Mutex<Vec<(Device, std::sync::Weak<Inner>)>> = Mutex::new(Vec::new());
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        // Not the parent's, in a forked child.
        open.retain(|(_, w)| w.upgrade().is_some_and(|i| i.generation == generation()));
        if let Some(inner) = open.iter().find(|(d, _)| d == self).and_then(|(_, w)| w.upgrade()) {
            return Ok(Context { inner });
        }
        let c = self.open()?;
        open.push((self.clone(), Arc::downgrade(&c.inner)));
        Ok(c)
    }

    /// Opens the device with explicit options.
    ///
    /// # Errors
    /// As [`Device::open`].
    pub fn open_with(&self, options: Options) -> Result<Context> {
        let addr = self.socket_addr();
        let virtual_seed = self.virtual_seed();
        // On a virtual clock, progress is driven by `SimNetwork::run_until`
        // alone: a thread would race it.
        let options = if virtual_seed.is_some() {
            Options { progress: ProgressMode::Inline, ..options }
        } else {
            options
        };
        let backend = self.backend().map_err(|source| Error::Open {
            device: self.name().to_string(),
            addr,
            source,
        })?;
        let events = Arc::new(crate::channel::EventQueue::new().map_err(|source| Error::Open {
            device: self.name().to_string(),
            addr,
            source,
        })?);
        let bell = crate::channel::EventQueue::new()
            .and_then(|b| b.set_nonblocking(true).map(|()| b))
            .map_err(|source| Error::Open { device: self.name().to_string(), addr, source })?;
        let origin = std::time::Instant::now();
        let epoch_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let staged = Arc::new(StagedList::default());
        let inner = Arc::new(Inner {
            bell,
            async_events: events.clone(),
            ah_count: std::sync::atomic::AtomicU32::new(0),
            pds: Mutex::new(std::collections::BTreeSet::new()),
            driver: Mutex::new({
                let mut e = Driver::new(backend, events, origin);
                e.staged = staged.clone();
                if let Some(seed) = virtual_seed {
                    let gid = uroce_wire::grh::gid_of(addr.ip());
                    let a = u64::from_be_bytes(gid[8..].try_into().unwrap_or_default());
                    e.mem.seed_keys(seed ^ a ^ u64::from(addr.port()));
                }
                e
            }),
            device: self.clone(),
            options,
            activity: Arc::new(Activity::new(origin)),
            stop: AtomicBool::new(false),
            published: crate::published::Publication::new(self.name()),
            staged,
            epoch_ns,
            generation: generation(),
            _dropped: DropMark,
        });
        live_contexts_add(&inner);
        if options.progress == ProgressMode::Thread {
            let weak = Arc::downgrade(&inner);
            let activity = inner.activity.clone();
            let handle = std::thread::Builder::new()
                .name(format!("uroce-{}", self.name()))
                .spawn(move || progress_thread(&weak, &activity))
                .map_err(|source| Error::Open { device: self.name().to_string(), addr, source })?;
            let _ = inner.activity.progress_thread.set(handle.thread().clone());
        }
        Ok(Context { inner })
    }
}

impl Context {
    /// The device's clock now, in nanoseconds: what completion timestamps
    /// ([`crate::Completion::timestamp`]) count, 1 GHz as
    /// [`DeviceAttr::hca_core_clock_khz`](crate::DeviceAttr) says
    /// (`ibv_query_rt_values_ex`'s raw clock). A simulated network's
    /// virtual clock where there is one.
    pub fn clock_ns(&self) -> u64 {
        self.inner.lock().now().as_nanos()
    }

    /// The wall-clock time (nanoseconds since the Unix epoch) of a
    /// completion timestamp (`ibv_wc_read_completion_wallclock_ns`).
    pub fn wallclock_ns(&self, timestamp: u64) -> u64 {
        self.inner.wallclock_ns(timestamp)
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Runs one round of progress now (for [`ProgressMode::Inline`] users
    /// who wait on something other than a CQ).
    pub fn progress(&self) {
        let mut e = self.inner.lock();
        self.inner.app_progress(&mut e);
    }

    /// One progress pass; whether anything happened (the virtual-clock
    /// driver's step).
    #[cfg(feature = "sim")]
    pub(crate) fn drive(&self) -> bool {
        let mut e = self.inner.lock();
        e.progress()
    }

    /// The earliest timer of this context.
    #[cfg(feature = "sim")]
    pub(crate) fn next_deadline(&self) -> Option<uroce_transport::Instant> {
        self.inner.lock().next_deadline()
    }

    /// The next asynchronous event, if any (`ibv_get_async_event`, without
    /// blocking). Runs progress first.
    pub fn poll_async_event(&self) -> Option<crate::AsyncEvent> {
        {
            let mut e = self.inner.lock();
            self.inner.app_progress(&mut e);
        }
        if self.inner.async_events.len() == 0 {
            return None;
        }
        self.inner.async_events.pop().ok()
    }

    /// Waits for the next asynchronous event (`ibv_get_async_event`). In
    /// [`ProgressMode::Inline`] nothing produces events while this blocks:
    /// use [`Context::poll_async_event`] there.
    ///
    /// # Errors
    /// `WouldBlock` if made non-blocking and no event waits; `Interrupted`
    /// when a signal whose handler lacks `SA_RESTART` ends the wait.
    pub fn get_async_event(&self) -> std::io::Result<crate::AsyncEvent> {
        self.inner.async_events.pop()
    }

    /// Hands this context's asynchronous events to `router` first (`None`:
    /// back to the context's own queue alone). The drop-in libibverbs
    /// routes each event to the `ibv_context` that created its object, as
    /// the kernel does; events it does not route stay here.
    pub fn set_async_event_router(
        &self,
        router: Option<Arc<dyn crate::channel::AsyncEventRouter>>,
    ) {
        self.inner.lock().router = router;
    }

    /// Makes [`Context::get_async_event`] non-blocking (as setting
    /// `O_NONBLOCK` on `context->async_fd` does in C).
    ///
    /// # Errors
    /// From `fcntl`.
    pub fn set_async_nonblocking(&self, on: bool) -> std::io::Result<()> {
        self.inner.async_events.set_nonblocking(on)
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    ///
    /// # Errors
    /// [`Error::Limit`] if no descriptor can be created.
    pub fn create_comp_channel(&self) -> Result<crate::CompChannel> {
        let q = crate::channel::EventQueue::new().map_err(|_| Error::Limit("file descriptors"))?;
        Ok(crate::CompChannel { events: Arc::new(q), activity: self.inner.activity.clone() })
    }

    /// Device attributes (`ibv_query_device`).
    pub fn query_device(&self) -> crate::DeviceAttr {
        self.inner.device.attr()
    }

    /// Port attributes (`ibv_query_port`); uroce devices have port 1 only.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another port number.
    pub fn query_port(&self, port: u8) -> Result<crate::PortAttr> {
        if port != 1 {
            return Err(Error::InvalidArgument("port number"));
        }
        let mut p = self.inner.device.port_attr();
        p.gid_tbl_len = self.inner.lock().gid_len() as u32;
        Ok(p)
    }

    /// GID `index` of port 1 (`ibv_query_gid`): index 0 is the device's
    /// address as a RoCEv2 GID, the interface's other addresses follow (see
    /// [`Context::gid_table`]). An empty slot (its address went away) reads
    /// as zeros, as on rxe. Reading a GID readies its address for sending
    /// and receiving: a program reads the GID it is about to give a peer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another port or an index past the
    /// table.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        Ok(self.gid_entry(port, index)?.map_or([0; 16], uroce_wire::grh::gid_of))
    }

    /// GID `index` of port 1 as an address: `None` for an empty slot.
    ///
    /// # Errors
    /// As [`Context::query_gid`].
    pub fn gid_entry(&self, port: u8, index: u32) -> Result<Option<std::net::IpAddr>> {
        let mut e = self.inner.lock();
        if port != 1 || index as usize >= e.gid_len() {
            return Err(Error::InvalidArgument("GID index"));
        }
        let ip = e.gid(index as usize);
        if ip.is_some() {
            // Best effort: an address another device holds still reads.
            let _ = e.use_gid(index as usize);
        }
        Ok(ip)
    }

    /// Port 1's GID table: `(index, address)` for every slot that holds
    /// one. Index 0 is the device's configured address; then the IPv6
    /// link-local, IPv4 and other IPv6 addresses of its interface, in
    /// rxe's order. The table follows address changes (checked every
    /// 100 ms); indices stay stable while the context is open.
    pub fn gid_table(&self) -> Vec<(u32, std::net::IpAddr)> {
        self.inner.lock().gid_entries()
    }

    /// The GID index of local address `addr`, if it is in the table.
    pub fn gid_index_of(&self, addr: std::net::IpAddr) -> Option<u32> {
        self.inner.lock().gid_index_of(addr).map(|i| i as u32)
    }

    /// Device-wide counters (drops before a QP is found: bad ICRC, unknown
    /// QPN, malformed), plus the sum over live QPs.
    pub fn stats(&self) -> uroce_transport::Stats {
        self.snapshot().device_stats
    }

    /// Whether this context was opened by the parent of this (forked)
    /// process: it is the parent's, and the child must open the device
    /// again (the drop-in library and [`Device::open_shared`] do) rather
    /// than use it; dropping it in the child leaves it to the parent.
    pub fn is_inherited(&self) -> bool {
        self.inner.generation != generation()
    }

    /// The device totals and every live QP's counters, as `uroce stat`
    /// shows them.
    pub fn snapshot(&self) -> crate::published::Snapshot {
        self.inner.snapshot(true)
    }
}

/// Every open context of the process, for the exit hook.
static LIVE: Mutex<Vec<std::sync::Weak<Inner>>> = Mutex::new(Vec::new());

/// Records a new context; the first one registers the exit hook.
fn live_contexts_add(inner: &Arc<Inner>) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    static HOOKED: std::sync::Once = std::sync::Once::new();
    HOOKED.call_once(|| {
        crate::exit::register(send_held_acks_at_exit);
        crate::exit::on_fork(fork_prepare, fork_parent, fork_child);
    });
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(inner));
}

/// At process exit, posts a burst left queued (or staged) and ACKs held for replies
/// that will never come leave (see `Qp::release_held_ack`), and connections the CM set up are
/// disconnected, as the kernel does for a process's ids: a program that
/// returns from `main` right after its last completion, without closing
/// the device, must not leave its peer retrying a message it received or
/// waiting for a DREQ. Then the backend removes its files (its inbox, its
/// slot in a shared address's table): the drop-in keeps a device open
/// after its last `ibv_close_device`, so perftest and the like always
/// end here. A lock held elsewhere (a
/// thread stopped in the middle of a verb) is waited for briefly, never
/// for ever.
extern "C" fn send_held_acks_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(live) = try_lock_briefly(&LIVE) {
            let ours = live.iter().filter_map(std::sync::Weak::upgrade);
            // Not the parent's contexts, in a forked child.
            for inner in ours.filter(|i| i.generation == generation()) {
                if let Some(mut driver) = try_lock_briefly(&inner.driver) {
                    inner.take_staged(&mut driver);
                    driver.flush_posts();
                    driver.send_held_acks(None);
                    driver.cm_disconnect_all();
                    driver.at_exit();
                }
            }
        }
        // A context being dropped on its progress thread: let it end (its
        // backend removes its files). `EXIT_WAIT` at most: on a loaded
        // machine the thread may wait long for a CPU (a tenth of a second
        // left a context's files behind under CI's load, and once a whole
        // second did, ci55).
        let t = std::time::Instant::now();
        while DROPPING.load(Ordering::SeqCst) > 0 && t.elapsed() < EXIT_WAIT {
            std::thread::sleep(Duration::from_micros(200));
        }
        crate::timeline::write();
    });
}

/// The longest the process's exit waits for a context's progress thread
/// (its pass, its lock, its closing): a pass ends in microseconds, unless
/// its thread waits for a CPU, which on a loaded machine has taken over a
/// second; only a thread stopped in the middle of a verb holds it for
/// good, and then the exit is this much late.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// `lock`, giving up after `EXIT_WAIT` of contention.
fn try_lock_briefly<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    let t = std::time::Instant::now();
    while t.elapsed() < EXIT_WAIT {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
    None
}

impl Drop for Inner {
    /// Closing is synchronous: when the last reference goes, the sockets
    /// close before this returns, so the device's port can be bound again
    /// at once. A progress thread asleep in `ppoll` on them (which keeps
    /// them open until it returns) is rung awake and waited for.
    fn drop(&mut self) {
        DROPPING.fetch_add(1, Ordering::SeqCst);
        self.stop.store(true, Ordering::SeqCst);
        let t = std::time::Instant::now();
        while self.activity.thread_polls() && t.elapsed() < Duration::from_secs(1) {
            self.bell.push(());
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl Drop for Context {
    /// When the progress thread's pass is all that keeps the context alive
    /// after this handle, waits for it to let go, so that the context
    /// closes here (see `Inner::drop`) and not a moment later on that
    /// thread.
    fn drop(&mut self) {
        // The parent's context, in a forked child: its progress thread is
        // not here (and the context is never closed here, see FORK_HOLD).
        if self.inner.generation != generation() {
            return;
        }
        if Arc::strong_count(&self.inner) == 2 && self.inner.activity.thread_holds() {
            self.inner.stop.store(true, Ordering::SeqCst);
            let t = std::time::Instant::now();
            while Arc::strong_count(&self.inner) > 1 && t.elapsed() < EXIT_WAIT {
                std::thread::yield_now();
            }
        }
    }
}

impl Driven for Inner {
    fn activity(&self) -> &Activity {
        &self.activity
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn spin(&self) -> Duration {
        self.options.spin
    }

    fn publish(&self) {
        self.published.offer(self.snapshot(false));
    }

    fn pass(&self) -> (bool, Option<Duration>) {
        let mut d = self.lock();
        let worked = d.progress();
        let now = d.now();
        (worked, d.next_deadline().map(|t| t.saturating_since(now)))
    }

    fn deferred(&self) -> bool {
        self.lock().deferred_posts > 0
    }

    fn sleep_fds(&self) -> Vec<i32> {
        use std::os::fd::{AsFd, AsRawFd};
        let mut fds = self.lock().sleep_fds();
        fds.push(self.bell.as_fd().as_raw_fd());
        fds
    }

    fn drain_bell(&self) {
        while self.bell.pop().is_ok() {}
    }

    fn prepare_sleep(&self) -> bool {
        self.lock().prepare_sleep()
    }

    fn waker_cpu(&self) -> Option<u64> {
        self.lock().take_waker_cpu()
    }
}

impl std::os::fd::AsFd for Context {
    /// The async event descriptor (`context->async_fd`): readable while
    /// asynchronous events wait.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.async_events.as_fd()
    }
}
