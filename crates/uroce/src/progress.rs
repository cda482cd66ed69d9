//! The progress policy: when the background thread runs, steps aside or
//! sleeps, how application polls and posts share the work with it, and how
//! posts become doorbells.

use std::sync::Weak;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant as StdInstant};

/// When an application thread last drove progress itself (the background
/// thread then steps aside), shared with completion channels: a thread
/// about to block on one hands progress back at once instead of leaving
/// the background thread asleep for the rest of its step-aside.
#[derive(Debug)]
pub(crate) struct Activity {
    origin: StdInstant,
    /// Last application poll, ns since `origin` (0: none recently).
    app_poll_ns: AtomicU64,
    /// Last post, ns since `origin`.
    last_post_ns: AtomicU64,
    /// What the progress thread is doing: `RUNNING`, `PARKED` (stepping
    /// aside) or `SLEEPING` (in `ppoll` on the sockets and the doorbell).
    thread_state: AtomicU8,
    /// What the progress thread holds of the context: `FREE`, `HOLDS` (a
    /// strong reference, for a pass) or `POLLING` (no reference, but in
    /// `ppoll` on the context's descriptors, which keeps its sockets open
    /// until the call returns). Closing waits for both to end.
    thread_mark: AtomicU8,
    pub(crate) progress_thread: std::sync::OnceLock<std::thread::Thread>,
    /// When the application's polls began to find nothing, ns since
    /// `origin` (0: the last one found something).
    empty_since_ns: AtomicU64,
    /// How long polls find nothing before one yields the CPU (see
    /// [`Activity::after_poll`]).
    yield_after_ns: AtomicU64,
}

impl Activity {
    /// `origin`: the context's clock (the driver's too).
    pub(crate) fn new(origin: StdInstant) -> Self {
        Self {
            origin,
            app_poll_ns: AtomicU64::new(0),
            last_post_ns: AtomicU64::new(0),
            thread_state: AtomicU8::new(RUNNING),
            thread_mark: AtomicU8::new(FREE),
            progress_thread: std::sync::OnceLock::new(),
            empty_since_ns: AtomicU64::new(0),
            yield_after_ns: AtomicU64::new(YIELD_AFTER_START.as_nanos() as u64),
        }
    }

    /// An application poll at `wall_ns` found `found` completions. Polls
    /// that keep finding nothing yield the CPU now and then: the work they
    /// wait for may be the peer's progress thread's (a WRITE's responder
    /// is nothing else), and on a small machine that thread may be queued
    /// behind this one on its CPU — the scheduler puts a thread woken by
    /// a datagram on the sender's CPU, and does not move it away while it
    /// runs now and then. There a busy-polling application keeps it off
    /// the CPU for the rest of its time slice (0.7–2.5 ms measured), and
    /// its yield gives it back at once. A yield that returns at once says
    /// the CPU is this thread's alone: the next wait yields later (up to
    /// `YIELD_AFTER_MAX`), so a ping-pong on an idle machine rarely pays
    /// one; one that returns late (another thread ran) makes the next
    /// waits yield after `YIELD_AFTER_MIN`.
    pub(crate) fn after_poll(&self, wall_ns: u64, found: usize) {
        if found > 0 {
            self.empty_since_ns.store(0, Ordering::Relaxed);
            return;
        }
        let since = self.empty_since_ns.load(Ordering::Relaxed);
        if since == 0 {
            self.empty_since_ns.store(wall_ns.max(1), Ordering::Relaxed);
            return;
        }
        let after = self.yield_after_ns.load(Ordering::Relaxed);
        if wall_ns.saturating_sub(since) < after {
            return;
        }
        let yielded = StdInstant::now();
        std::thread::yield_now();
        let took = yielded.elapsed();
        // Taking turns with another busy thread on one CPU, while another
        // CPU idles, this thread moves as the progress thread does: the
        // balancer would not move it (it ran within half a millisecond),
        // and a thread that does not yield (perftest's peer calibrating
        // its clock, hundreds of milliseconds) keeps a yielder waiting
        // for whole slices under EEVDF (2.6 ms measured at the end of an
        // `ib_send_bw` run, a third of its time).
        APP_CROWDING.with(|c| c.borrow_mut().after_yield(took, yielded));
        let next = if took > CROWDED {
            crate::timeline::event("poll-yield", took.as_micros() as u64, 0);
            YIELD_AFTER_MIN.as_nanos() as u64
        } else {
            // Alone: count the next wait from now.
            self.empty_since_ns.store(self.wall_ns(), Ordering::Relaxed);
            (after * 2).min(YIELD_AFTER_MAX.as_nanos() as u64)
        };
        self.yield_after_ns.store(next, Ordering::Relaxed);
    }

    /// Nanoseconds since the context's origin (one clock read, which the
    /// post and poll paths pass on instead of reading again).
    pub(crate) fn wall_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// An application poll at `wall_ns`.
    pub(crate) fn touch_at(&self, wall_ns: u64) {
        self.app_poll_ns.store(wall_ns, Ordering::Relaxed);
    }

    pub(crate) fn since_app(&self) -> Duration {
        self.origin
            .elapsed()
            .saturating_sub(Duration::from_nanos(self.app_poll_ns.load(Ordering::Relaxed)))
    }

    /// Whether the progress thread holds a strong reference (a pass).
    pub(crate) fn thread_holds(&self) -> bool {
        self.thread_mark.load(Ordering::SeqCst) == HOLDS
    }

    /// Whether the progress thread sleeps on the context's descriptors.
    pub(crate) fn thread_polls(&self) -> bool {
        self.thread_mark.load(Ordering::SeqCst) == POLLING
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

/// Bounds and start of the empty-poll time before a yield
/// (`Activity::after_poll`).
const YIELD_AFTER_MIN: Duration = Duration::from_micros(2);
const YIELD_AFTER_MAX: Duration = Duration::from_micros(100);
const YIELD_AFTER_START: Duration = Duration::from_micros(20);
/// A yield that took longer than this let another thread run.
const CROWDED: Duration = Duration::from_micros(10);

/// How often the progress thread publishes the counters.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// How long an application poll keeps the background thread away.
const STEP_ASIDE: Duration = Duration::from_micros(200);
/// Posts closer together than this are a burst (see `Inner::doorbell`).
const BURST_GAP: Duration = Duration::from_micros(4);
/// The most posts a burst queues before they leave.
const BURST_POSTS: u32 = 32;
/// What the progress thread holds (`Activity::thread_mark`).
const FREE: u8 = 0;
const HOLDS: u8 = 1;
const POLLING: u8 = 2;
/// Progress thread states (`Activity::thread_state`).
const RUNNING: u8 = 0;
const PARKED: u8 = 1;
const SLEEPING: u8 = 2;
/// Bounds of the adaptive busy-poll window.
const SPIN_MIN: Duration = Duration::from_micros(5);
const SPIN_MAX: Duration = Duration::from_millis(1);

/// A sleep that work ends sooner than this was a mistake: the window
/// grows. Not a multiple of the window alone: waking a thread takes tens
/// of microseconds on a busy small machine (measured here: 25–110 µs), so
/// a window at its minimum would never see a sleep short enough to grow
/// it again, and a steady stream of bursts would pay a wake-up each.
const SOON_AFTER: Duration = Duration::from_micros(500);

/// The scheduler slice the progress thread asks for (see `sched`).
const PROGRESS_SLICE_NS: u64 = 100_000;

/// What the progress thread needs of a context.
pub(crate) trait Driven {
    /// The context's activity record.
    fn activity(&self) -> &Activity;
    /// Whether the context is closing.
    fn stopped(&self) -> bool;
    /// The configured busy-poll window.
    fn spin(&self) -> Duration;
    /// Publishes the counters (best effort).
    fn publish(&self);
    /// One progress pass: whether anything happened, and how long until
    /// the next timer.
    fn pass(&self) -> (bool, Option<Duration>);
    /// Whether posts wait in the queue for a transmit pass.
    fn deferred(&self) -> bool;
    /// Descriptors to sleep on: the backend's, then the doorbell's (only
    /// the doorbell: the backend has none, and the thread naps instead).
    fn sleep_fds(&self) -> Vec<i32>;
    /// Empties the doorbell after a sleep.
    fn drain_bell(&self);
    /// Tells the backend the thread is about to sleep; false if work came
    /// meanwhile (see `Backend::prepare_sleep`).
    fn prepare_sleep(&self) -> bool;
    /// The CPU the sender of the doorbell that woke the thread ran on.
    fn waker_cpu(&self) -> Option<u64>;
}

/// The background thread of one context: it runs progress while there is
/// work, busy-polls for an adaptive window after it, then sleeps on the
/// descriptors; it steps aside while an application thread polls.
/// `activity` is the context's, kept past the context's end so that the
/// thread can say it let go (see `Activity::thread_mark`).
pub(crate) fn progress_thread<T: Driven>(weak: &Weak<T>, activity: &Activity) {
    crate::sched::request_short_slice(PROGRESS_SLICE_NS);
    crate::timeline::progress_thread();
    let mut spin = weak.upgrade().map_or(Duration::from_micros(50), |i| i.spin());
    let mut last_work = StdInstant::now();
    let mut published: Option<StdInstant> = None;
    let mut crowding = Crowding::default();
    let mut woke = false;
    loop {
        let Some(inner) = Held::upgrade(weak, activity) else { return };
        if inner.stopped() {
            return;
        }
        if published.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY) {
            published = Some(StdInstant::now());
            inner.publish();
        }
        let since_app = inner.activity().since_app();
        if since_app < STEP_ASIDE {
            // An application thread is polling and drives progress itself
            // (until it releases progress, which unparks us).
            let state = &inner.activity().thread_state;
            state.store(PARKED, Ordering::SeqCst);
            drop(inner);
            crate::timeline::event("park", 0, 0);
            std::thread::park_timeout(STEP_ASIDE - since_app);
            if let Some(i) = weak.upgrade() {
                i.activity().thread_state.store(RUNNING, Ordering::SeqCst);
            }
            continue;
        }
        let (worked, deadline) = inner.pass();
        if std::mem::take(&mut woke) {
            // A local sender's doorbell wakes the thread on the sender's
            // CPU, where it now takes turns with the sender: off it at
            // once, if another CPU is idle.
            let here = crate::sched::current_cpu();
            if inner.waker_cpu() == Some(here)
                && crowding.woken_onto_sender(StdInstant::now())
                && crate::sched::move_to_another_cpu()
            {
                crate::timeline::event("moved", 0, 0);
            }
        }
        if worked {
            last_work = StdInstant::now();
            continue;
        }
        let idle = last_work.elapsed();
        if idle < spin {
            // Yield rather than spin: on a small machine the thread that
            // needs the core may be an application thread just woken by a
            // completion event. Without a strong reference: an application
            // that closes the context gets its port back at once.
            drop(inner);
            let yielded = StdInstant::now();
            std::thread::yield_now();
            let took = yielded.elapsed();
            if took > Duration::from_micros(20) {
                crate::timeline::event("yield", took.as_micros() as u64, 0);
            }
            crowding.after_yield(took, yielded);
            continue;
        }
        // Going to sleep: if traffic comes back soon after, the window was
        // too short; if we always sleep, shrink it.
        let wait = deadline.unwrap_or(Duration::from_millis(100)).min(Duration::from_millis(100));
        let slept = StdInstant::now();
        // Sleep on the descriptors without the lock and without a strong
        // reference, so the context can close meanwhile. A post that
        // defers after this point sees SLEEPING and rings the doorbell.
        inner.activity().thread_state.store(SLEEPING, Ordering::SeqCst);
        if inner.deferred() || !inner.prepare_sleep() {
            inner.activity().thread_state.store(RUNNING, Ordering::SeqCst);
            continue;
        }
        let fds = inner.sleep_fds();
        inner.release_polling();
        crate::timeline::event("sleep", spin.as_micros() as u64, 0);
        // A nap (no descriptor to sleep on) cannot tell work from time.
        let timed_out = if fds.len() <= 1 {
            std::thread::sleep(wait.min(Duration::from_micros(100)));
            false
        } else {
            !crate::backend::wait_readable(&fds, Some(wait))
        };
        activity.thread_mark.store(FREE, Ordering::SeqCst);
        crate::timeline::event("woke", slept.elapsed().as_micros() as u64, 0);
        if let Some(i) = weak.upgrade() {
            i.activity().thread_state.store(RUNNING, Ordering::SeqCst);
            i.drain_bell();
        }
        woke = true;
        spin = adapt_spin(spin, slept.elapsed(), timed_out);
        last_work = StdInstant::now();
    }
}

/// The busy-poll window after a sleep of `slept`: work that came soon
/// after the thread went to sleep says the window was too short; work that
/// came late, that it was too long. A sleep that its timeout ended (an
/// idle device's, or a timer's) says nothing about the traffic, and keeps
/// the window: otherwise the idle time before a run would shrink it to the
/// least, and the run would begin with a sleep and a wake-up per burst.
fn adapt_spin(spin: Duration, slept: Duration, timed_out: bool) -> Duration {
    if timed_out {
        spin
    } else if slept < (spin * 4).max(SOON_AFTER) {
        (spin * 2).min(SPIN_MAX)
    } else {
        (spin / 2).max(SPIN_MIN)
    }
}

thread_local! {
    /// An application thread's crowding record (its polls' yields).
    static APP_CROWDING: std::cell::RefCell<Crowding> = std::cell::RefCell::new(Crowding::default());
}

/// Yields in a row that let another thread run before the progress
/// thread (or an application thread in a poll) moves to another CPU.
const CROWDED_YIELDS: u32 = 2;

/// Tells when the progress thread shares its CPU with a busy thread, and
/// moves it.
struct Crowding {
    long_yields: u32,
    last_move: Option<StdInstant>,
    /// The least time between moves: doubled by a move after which the
    /// thread is crowded again at once (every CPU is busy), reset by one
    /// that leaves it alone for a while.
    every: Duration,
}

impl Default for Crowding {
    fn default() -> Self {
        Self { long_yields: 0, last_move: None, every: MOVE_EVERY_MIN }
    }
}

impl Crowding {
    /// A yield of the busy-poll window, made at `at`, took `took`: more
    /// than `CROWDED` says another thread ran on this CPU meanwhile.
    /// Moves the thread when that keeps happening.
    fn after_yield(&mut self, took: Duration, at: StdInstant) {
        if self.should_move(took, at) && crate::sched::move_to_another_cpu() {
            crate::timeline::event("moved", self.every.as_micros() as u64, 0);
        }
    }

    /// Woken at `at` onto the CPU of the local sender that woke it: moves
    /// now, within the limits of [`Crowding::may_move`].
    fn woken_onto_sender(&mut self, at: StdInstant) -> bool {
        self.long_yields = 0;
        self.may_move(at)
    }

    /// Counts a yield that took `took`: `CROWDED_YIELDS` crowded ones in a
    /// row ask for a move (see [`Crowding::may_move`]).
    fn should_move(&mut self, took: Duration, at: StdInstant) -> bool {
        if took <= CROWDED {
            self.long_yields = 0;
            return false;
        }
        self.long_yields += 1;
        if self.long_yields < CROWDED_YIELDS {
            return false;
        }
        self.long_yields = 0;
        self.may_move(at)
    }

    /// Whether a move at `at` is due: not within `every` of the last, which
    /// doubles when the last did not help for long and comes back to its
    /// least when it did.
    fn may_move(&mut self, at: StdInstant) -> bool {
        if let Some(t) = self.last_move {
            let since = at.duration_since(t);
            if since < self.every {
                return false;
            }
            self.every = if since < self.every * 2 {
                (self.every * 2).min(MOVE_EVERY_MAX)
            } else {
                MOVE_EVERY_MIN
            };
        }
        self.last_move = Some(at);
        true
    }
}

/// Bounds of the time between two moves of the progress thread.
const MOVE_EVERY_MIN: Duration = Duration::from_micros(100);
const MOVE_EVERY_MAX: Duration = Duration::from_millis(10);

/// The progress thread's strong reference to its context, with
/// `Activity::thread_mark` kept true to it: `HOLDS` only while the
/// reference is held (set after the upgrade, cleared before the release).
struct Held<'a, T> {
    inner: Option<std::sync::Arc<T>>,
    activity: &'a Activity,
}

impl<'a, T> Held<'a, T> {
    fn upgrade(weak: &Weak<T>, activity: &'a Activity) -> Option<Self> {
        let inner = weak.upgrade()?;
        activity.thread_mark.store(HOLDS, Ordering::SeqCst);
        Some(Self { inner: Some(inner), activity })
    }

    /// Lets go, marked as polling the context's descriptors: a close that
    /// follows sees it and rings the thread awake (`Inner::drop`).
    fn release_polling(mut self) {
        self.activity.thread_mark.store(POLLING, Ordering::SeqCst);
        self.inner = None;
    }
}

impl<T> std::ops::Deref for Held<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.inner.as_deref().expect("held until released")
    }
}

impl<T> Drop for Held<'_, T> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            self.activity.thread_mark.store(FREE, Ordering::SeqCst);
            drop(inner);
        }
    }
}

/// What a post does with the work it queued (see [`Activity::on_post`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Post {
    /// Transmit now, then call [`Activity::post_sent`].
    Send,
    /// Leave it queued; `wake`: ring the doorbell (the thread sleeps).
    Queue {
        /// The progress thread is asleep and must be woken.
        wake: bool,
    },
}

impl Activity {
    /// A post rang the doorbell with `deferred` posts already queued. A
    /// post that follows another within `BURST_GAP` of its return (a
    /// program filling its send queue one WR per call) only queues, up to
    /// `BURST_POSTS`, when a progress thread runs: the batch leaves as GSO
    /// runs with the next poll, the burst's cap or the thread. An isolated
    /// post (a ping-pong) leaves at once.
    pub(crate) fn on_post(&self, now: u64, deferred: u32, awaited: bool) -> Post {
        let last = self.last_post_ns.swap(now, Ordering::Relaxed);
        let bursty = now.saturating_sub(last) < BURST_GAP.as_nanos() as u64;
        if awaited || !(bursty && deferred < BURST_POSTS && self.progress_thread.get().is_some()) {
            return Post::Send;
        }
        // A thread stepping aside resumes within `STEP_ASIDE` (and the
        // application, which is polling, polls before that); a sleeping
        // one is woken.
        let wake = self.thread_state.load(Ordering::SeqCst) == SLEEPING;
        if wake {
            self.thread_state.store(RUNNING, Ordering::SeqCst);
        }
        Post::Queue { wake }
    }

    /// A post staged its WRs (see `staging`): whether the progress thread
    /// sleeps and must be woken to take them in (it is marked running, so
    /// that one wake serves every stager until it sleeps again).
    pub(crate) fn wake_sleeping(&self) -> bool {
        self.thread_state
            .compare_exchange(SLEEPING, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The post's transmit is done: the next post's gap counts from now,
    /// so that this transmit does not make it look isolated.
    pub(crate) fn post_sent(&self) {
        self.last_post_ns.store(self.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Posts in a tight loop: whether any of `n` was queued rather than
    /// sent (a preempted test thread can make one gap look isolated).
    fn any_queued(a: &Activity, n: usize) -> Option<Post> {
        (0..n).map(|_| a.on_post(a.wall_ns(), 0, false)).find(|p| *p != Post::Send)
    }

    /// Two crowded yields in a row move the thread; moves that do not
    /// help (crowded again at once) come less often, and a move that
    /// helped lets the next come soon.
    #[test]
    fn a_crowded_progress_thread_moves_and_backs_off_when_moves_do_not_help() {
        let t0 = StdInstant::now();
        let long = CROWDED * 3;
        let mut c = Crowding::default();
        // One long yield is not enough; a short one starts the count again.
        assert!(!c.should_move(long, t0));
        assert!(!c.should_move(Duration::ZERO, t0));
        assert!(!c.should_move(long, t0));
        assert!(c.should_move(long, t0));
        // Crowded again at once: not before `every`, and then the wait doubles.
        let at = |us: u64| t0 + Duration::from_micros(us);
        assert!(!c.should_move(long, at(50)));
        assert!(!c.should_move(long, at(60)));
        assert!(!c.should_move(long, at(120)));
        assert!(c.should_move(long, at(130)));
        assert_eq!(c.every, MOVE_EVERY_MIN * 2);
        // A move that kept it alone for a while resets the wait.
        assert!(!c.should_move(long, at(20_000)));
        assert!(c.should_move(long, at(20_010)));
        assert_eq!(c.every, MOVE_EVERY_MIN);
        // Woken onto the sender's CPU: at once, but not more often.
        assert!(!c.woken_onto_sender(at(20_050)), "within `every` of the last move");
        assert!(c.woken_onto_sender(at(20_200)));
        assert_eq!(c.long_yields, 0);
    }

    /// Work soon after a sleep grows the busy-poll window, work long after
    /// shrinks it, within its bounds; a sleep its timeout ended (an idle
    /// device) keeps it, so that idle time before a run does not leave the
    /// run a window at its least.
    #[test]
    fn the_busy_poll_window_follows_the_traffic_not_idle_timeouts() {
        let us = Duration::from_micros;
        assert_eq!(adapt_spin(us(50), us(30), false), us(100), "work came soon");
        assert_eq!(adapt_spin(SPIN_MAX, us(30), false), SPIN_MAX);
        assert_eq!(adapt_spin(us(50), Duration::from_millis(5), false), us(25), "came late");
        assert_eq!(adapt_spin(SPIN_MIN, Duration::from_millis(5), false), SPIN_MIN);
        let mut spin = us(50);
        for _ in 0..20 {
            spin = adapt_spin(spin, Duration::from_millis(100), true);
        }
        assert_eq!(spin, us(50), "idle timeouts leave the window alone");
    }

    /// Empty polls yield only after `yield_after_ns` of finding nothing; a
    /// yield that returns at once doubles the wait (up to the maximum) and
    /// counts it from then; a poll that finds something starts over.
    #[test]
    fn empty_polls_yield_later_while_the_cpu_is_theirs() {
        let a = Activity::new(StdInstant::now());
        let start = YIELD_AFTER_START.as_nanos() as u64;
        let after = |a: &Activity| a.yield_after_ns.load(Ordering::Relaxed);
        a.after_poll(1_000, 0);
        assert_eq!(a.empty_since_ns.load(Ordering::Relaxed), 1_000);
        a.after_poll(1_000 + start - 1, 0);
        assert_eq!(after(&a), start, "not yet");
        // Alone on its CPU (a test thread's yield returns at once, or is
        // counted crowded on a loaded machine: then the minimum).
        a.after_poll(1_000 + start, 0);
        assert!(
            [2 * start, YIELD_AFTER_MIN.as_nanos() as u64].contains(&after(&a)),
            "{}",
            after(&a)
        );
        a.after_poll(5_000_000, 3);
        assert_eq!(a.empty_since_ns.load(Ordering::Relaxed), 0, "found: starts over");
        a.yield_after_ns.store(YIELD_AFTER_MAX.as_nanos() as u64, Ordering::Relaxed);
        a.after_poll(6_000_000, 0);
        a.after_poll(6_000_000 + YIELD_AFTER_MAX.as_nanos() as u64, 0);
        assert!(after(&a) <= YIELD_AFTER_MAX.as_nanos() as u64, "capped");
    }

    #[test]
    fn bursts_queue_only_with_a_thread_and_isolated_posts_send() {
        let a = Activity::new(StdInstant::now());
        assert_eq!(any_queued(&a, 50), None, "no progress thread: every post sends");
        let _ = a.progress_thread.set(std::thread::current());
        a.post_sent();
        assert_eq!(any_queued(&a, 50), Some(Post::Queue { wake: false }));
        // An isolated post sends, and the gap counts from the last return.
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(a.on_post(a.wall_ns(), 0, false), Post::Send);
        // A full burst sends whatever the gap.
        assert_eq!(a.on_post(a.wall_ns(), BURST_POSTS, false), Post::Send);
    }

    #[test]
    fn a_queued_post_wakes_a_sleeping_thread_once() {
        let a = Activity::new(StdInstant::now());
        let _ = a.progress_thread.set(std::thread::current());
        a.post_sent();
        a.thread_state.store(SLEEPING, Ordering::SeqCst);
        assert_eq!(any_queued(&a, 50), Some(Post::Queue { wake: true }));
        assert_eq!(a.thread_state.load(Ordering::SeqCst), RUNNING);
        assert_eq!(any_queued(&a, 50), Some(Post::Queue { wake: false }), "already woken");
        a.thread_state.store(PARKED, Ordering::SeqCst);
        assert_eq!(
            any_queued(&a, 50),
            Some(Post::Queue { wake: false }),
            "a thread stepping aside resumes by itself"
        );
    }
}
