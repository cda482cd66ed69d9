//! The progress policy: when the background thread runs, steps aside or
//! sleeps, how application polls and posts share the work with it, and how
//! posts become doorbells.

use std::sync::Weak;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant as StdInstant};

use crate::context::Inner;
use crate::driver::Driver;

/// When an application thread last drove progress itself (the background
/// thread then steps aside), shared with completion channels: a thread
/// about to block on one hands progress back at once instead of leaving
/// the background thread asleep for the rest of its step-aside.
#[derive(Debug)]
pub(crate) struct Activity {
    pub(crate) origin: StdInstant,
    /// Last application poll, ns since `origin` (0: none recently).
    app_poll_ns: AtomicU64,
    /// Last post, ns since `origin`.
    pub(crate) last_post_ns: AtomicU64,
    /// What the progress thread is doing: `RUNNING`, `PARKED` (stepping
    /// aside) or `SLEEPING` (in `ppoll` on the sockets and the doorbell).
    pub(crate) thread_state: AtomicU8,
    pub(crate) progress_thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            origin: StdInstant::now(),
            app_poll_ns: AtomicU64::new(0),
            last_post_ns: AtomicU64::new(0),
            thread_state: AtomicU8::new(RUNNING),
            progress_thread: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn touch(&self) {
        self.app_poll_ns.store(self.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn since_app(&self) -> Duration {
        self.origin
            .elapsed()
            .saturating_sub(Duration::from_nanos(self.app_poll_ns.load(Ordering::Relaxed)))
    }

    /// The application stops polling (it is about to sleep on a channel or
    /// has armed a CQ to do so): the background thread resumes now.
    pub(crate) fn release(&self) {
        if self.app_poll_ns.swap(0, Ordering::Relaxed) != 0
            && let Some(t) = self.progress_thread.get()
        {
            t.unpark();
        }
    }
}

/// How often the progress thread publishes the counters.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// How long an application poll keeps the background thread away.
pub(crate) const STEP_ASIDE: Duration = Duration::from_micros(200);
/// Posts closer together than this are a burst (see `Inner::doorbell`).
pub(crate) const BURST_GAP: Duration = Duration::from_micros(4);
/// The most posts a burst queues before they leave.
pub(crate) const BURST_POSTS: u32 = 32;
/// Progress thread states (`Activity::thread_state`).
pub(crate) const RUNNING: u8 = 0;
pub(crate) const PARKED: u8 = 1;
pub(crate) const SLEEPING: u8 = 2;
/// Bounds of the adaptive busy-poll window.
pub(crate) const SPIN_MIN: Duration = Duration::from_micros(5);
pub(crate) const SPIN_MAX: Duration = Duration::from_millis(1);

/// The scheduler slice the progress thread asks for (see `sched`).
pub(crate) const PROGRESS_SLICE_NS: u64 = 100_000;

pub(crate) fn progress_thread(weak: &Weak<Inner>) {
    crate::sched::request_short_slice(PROGRESS_SLICE_NS);
    let mut spin = weak.upgrade().map_or(Duration::from_micros(50), |i| i.options.spin);
    let mut last_work = StdInstant::now();
    let mut published: Option<StdInstant> = None;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        if published.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY) {
            published = Some(StdInstant::now());
            // Best effort: a full or read-only disk costs only `uroce stat`.
            let _ = crate::published::write(&inner.published, &inner.snapshot(false));
        }
        let since_app = inner.activity.since_app();
        if since_app < STEP_ASIDE {
            // An application thread is polling and drives progress itself
            // (until it releases progress or defers a post, which unparks
            // us).
            let state = &inner.activity.thread_state;
            state.store(PARKED, Ordering::SeqCst);
            let deferred = inner.lock().deferred_posts > 0;
            if deferred {
                state.store(RUNNING, Ordering::SeqCst);
            } else {
                drop(inner);
                std::thread::park_timeout(STEP_ASIDE - since_app);
                if let Some(i) = weak.upgrade() {
                    i.activity.thread_state.store(RUNNING, Ordering::SeqCst);
                }
                continue;
            }
        }
        let (worked, deadline) = {
            let mut e = inner.lock();
            let w = e.progress();
            (w, e.next_deadline().map(|d| (d, e.now())))
        };
        if worked {
            last_work = StdInstant::now();
            continue;
        }
        let idle = last_work.elapsed();
        if idle < spin {
            // Yield rather than spin: on a small machine the thread that
            // needs the core may be an application thread just woken by a
            // completion event.
            std::thread::yield_now();
            continue;
        }
        // Going to sleep: if traffic comes back soon after, the window was
        // too short; if we always sleep, shrink it.
        let wait = deadline
            .map_or(Duration::from_millis(100), |(d, now)| d.saturating_since(now))
            .min(Duration::from_millis(100));
        let slept = StdInstant::now();
        // Sleep on the socket without the lock and without a strong
        // reference, so the context can close meanwhile. (A simulated
        // network has no descriptor: nap briefly instead.)
        inner.activity.thread_state.store(SLEEPING, Ordering::SeqCst);
        let (mut fds, deferred) = {
            let e = inner.lock();
            (e.backend().raw_fds(), e.deferred_posts > 0)
        };
        if deferred {
            // A post came in between: no sleep.
            inner.activity.thread_state.store(RUNNING, Ordering::SeqCst);
            continue;
        }
        {
            use std::os::fd::{AsFd, AsRawFd};
            fds.push(inner.bell.as_fd().as_raw_fd());
        }
        drop(inner);
        if fds.len() == 1 {
            std::thread::sleep(wait.min(Duration::from_micros(100)));
        } else {
            crate::backend::wait_readable(&fds, Some(wait));
        }
        if let Some(i) = weak.upgrade() {
            i.activity.thread_state.store(RUNNING, Ordering::SeqCst);
            while i.bell.pop().is_ok() {}
        }
        spin = if slept.elapsed() < spin * 4 {
            (spin * 2).min(SPIN_MAX)
        } else {
            (spin / 2).max(SPIN_MIN)
        };
        last_work = StdInstant::now();
    }
}

impl Inner {
    /// A post rang the doorbell: what it queued leaves now, without a
    /// receive pass (a system call that finds nothing, on most posts) and
    /// without the "application is polling" mark (a program that posts and
    /// then waits on memory needs the progress thread to keep receiving).
    ///
    /// A post that follows another within `BURST_GAP` (a program filling
    /// its send queue one WR per call) only queues, up to `BURST_POSTS`
    /// posts, when a progress thread runs: the batch leaves as GSO runs
    /// with the next poll, the burst's cap or the progress thread, which a
    /// deferred post wakes if it is stepping aside or asleep. An isolated
    /// post (a ping-pong) leaves at once.
    pub(crate) fn doorbell(&self, driver: &mut Driver) {
        let a = &self.activity;
        // The gap since the previous post *returned*: its own transmit
        // must not make the next post look isolated.
        let now = a.origin.elapsed().as_nanos() as u64;
        let last = a.last_post_ns.swap(now, Ordering::Relaxed);
        let bursty = now.saturating_sub(last) < BURST_GAP.as_nanos() as u64;
        if bursty && driver.deferred_posts < BURST_POSTS && a.progress_thread.get().is_some() {
            driver.deferred_posts += 1;
            // A thread stepping aside resumes within `STEP_ASIDE` (and the
            // application polls before that, as it is polling); a sleeping
            // one is woken.
            if a.thread_state.load(Ordering::SeqCst) == SLEEPING {
                a.thread_state.store(RUNNING, Ordering::SeqCst);
                self.bell.push(());
            }
            return;
        }
        driver.transmit_now();
        a.last_post_ns.store(a.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Called by application polls: run progress inline, and tell the
    /// background thread to keep out of the way for a while.
    pub(crate) fn app_progress(&self, driver: &mut Driver) {
        self.activity.touch();
        driver.progress();
    }
}
