//! UNSAFE ISLAND (small): completion channels and the async event queue,
//! each a queue plus an `eventfd` in semaphore mode, so that a descriptor
//! becomes readable exactly while events wait (usable with poll, epoll and
//! therefore tokio). The only `unsafe` is the eventfd read/write.
//!
//! No lost wake-ups: an event is queued and the counter incremented under
//! the queue's lock; a reader first takes one count from the descriptor
//! (blocking, or failing with EAGAIN when non-blocking) and only then pops
//! one queued event, so counts and queue entries always pair up.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// Waits up to `timeout` for `fd` to become readable; `Ok(false)` on
/// timeout.
fn poll_readable(fd: i32, timeout: std::time::Duration) -> io::Result<bool> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    loop {
        match poll_readable_once(fd, ms) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// One `poll` for `fd` readable, `ms` at most (-1: no limit).
fn poll_readable_once(fd: i32, ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one live pollfd, count 1.
    let r = unsafe { libc::poll(&raw mut pfd, 1, ms) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r > 0) }
}

/// Whether a wait a signal interrupted should start again, as the kernel
/// restarts a blocking read: only if the handler asked for it with
/// `SA_RESTART`. `poll` never restarts and does not say which signal
/// came, so this restarts only when every caught signal's handler has
/// the flag (a program with one handler, the usual case, gets exactly the
/// kernel's answer).
fn handlers_restart() -> bool {
    // Fault signals come from the faulting instruction, never during a
    // wait (and Rust's runtime catches SIGSEGV and SIGBUS without the flag).
    const FAULTS: [i32; 5] =
        [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP];
    (1..=libc::SIGRTMAX()).filter(|s| !FAULTS.contains(s)).all(|sig| {
        // SAFETY: all-zero is a valid sigaction to be overwritten.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries only (no new action); `old` is live and writable.
        let r = unsafe { libc::sigaction(sig, std::ptr::null(), &raw mut old) };
        r != 0
            || old.sa_sigaction == libc::SIG_DFL
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_flags & libc::SA_RESTART != 0
    })
}

/// Sets or clears `O_NONBLOCK` on `fd` (one of ours).
fn set_fd_nonblocking(fd: i32, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor of ours, integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let new = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, new) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A queue of `T` with a readable descriptor.
#[derive(Debug)]
pub(crate) struct EventQueue<T> {
    fd: OwnedFd,
    queue: Mutex<VecDeque<T>>,
}

impl<T> EventQueue<T> {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a negative result is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, queue: Mutex::new(VecDeque::new()) })
    }

    /// Queues an event and makes the descriptor readable.
    pub(crate) fn push(&self, ev: T) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(ev);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Takes one event: blocks while none waits, unless the descriptor was
    /// made non-blocking (then `WouldBlock`).
    ///
    /// A signal caught meanwhile ends the wait with `Interrupted` (EINTR)
    /// when its handler was installed without `SA_RESTART`, and restarts it
    /// otherwise: the kernel decides, as for rdma-core's read of the
    /// channel's descriptor. Programs rely on it: qperf's `SIGALRM` ends a
    /// test's `ibv_get_cq_event` that no completion will end.
    pub(crate) fn pop(&self) -> io::Result<T> {
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our own eventfd.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut count).cast(), 8) };
        if r != 8 {
            return Err(io::Error::last_os_error());
        }
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.pop_front().ok_or_else(|| io::Error::other("event count without event"))
    }

    /// Waits up to `timeout` for the descriptor to become readable.
    /// `Ok(false)` on timeout. A later `pop` may still block if another
    /// reader took the event first.
    pub(crate) fn wait_readable(&self, timeout: std::time::Duration) -> io::Result<bool> {
        poll_readable(self.fd.as_raw_fd(), timeout)
    }

    /// Events waiting.
    pub(crate) fn len(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Sets or clears `O_NONBLOCK` on the descriptor.
    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        set_fd_nonblocking(self.fd.as_raw_fd(), on)
    }
}

impl<T> AsFd for EventQueue<T> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A queue of `T` whose descriptor is readable exactly while the queue
/// holds something (level-triggered: an `eventfd` written when the queue
/// becomes non-empty and read when it becomes empty, both under the
/// queue's lock), so that entries can be withdrawn (`retain`) without a
/// reader ever being woken for nothing or blocking with entries queued.
#[derive(Debug)]
pub(crate) struct LevelQueue<T> {
    fd: OwnedFd,
    queue: Mutex<VecDeque<T>>,
}

impl<T> LevelQueue<T> {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a negative result is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, queue: Mutex::new(VecDeque::new()) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<T>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues an entry; the descriptor becomes readable.
    pub(crate) fn push(&self, ev: T) {
        let mut q = self.lock();
        q.push_back(ev);
        if q.len() == 1 {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
            unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
        }
    }

    /// The queue just became empty: the descriptor stops being readable.
    /// Its count is non-zero (written when the queue filled), so the read
    /// never blocks.
    fn drained(&self) {
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our own eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut count).cast(), 8) };
    }

    /// Takes the oldest entry, if any.
    pub(crate) fn try_pop(&self) -> Option<T> {
        let mut q = self.lock();
        let e = q.pop_front()?;
        if q.is_empty() {
            self.drained();
        }
        Some(e)
    }

    /// Takes the oldest entry: waits while there is none, unless the
    /// descriptor was made non-blocking (by us or by its owner, with
    /// `fcntl`): then `WouldBlock`. A caught signal ends the wait with
    /// `Interrupted` unless its handler asked for restarts
    /// ([`handlers_restart`]), as the kernel's blocking `rdma_get_cm_event`.
    pub(crate) fn pop(&self) -> io::Result<T> {
        loop {
            if let Some(e) = self.try_pop() {
                return Ok(e);
            }
            // SAFETY: fcntl on our own descriptor, integer arguments only.
            let flags = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL) };
            if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                // EAGAIN itself, not just its kind: the C ABI hands the
                // errno on (rdma_get_cm_event on a non-blocking channel).
                return Err(io::Error::from_raw_os_error(libc::EAGAIN));
            }
            if let Err(e) = poll_readable_once(self.fd.as_raw_fd(), -1)
                && (e.kind() != io::ErrorKind::Interrupted || !handlers_restart())
            {
                return Err(e);
            }
        }
    }

    /// Waits up to `timeout` for an entry. `Ok(false)` on timeout.
    pub(crate) fn wait_readable(&self, timeout: std::time::Duration) -> io::Result<bool> {
        poll_readable(self.fd.as_raw_fd(), timeout)
    }

    /// Keeps only the entries `keep` accepts.
    pub(crate) fn retain(&self, keep: impl FnMut(&T) -> bool) {
        let mut q = self.lock();
        let had = !q.is_empty();
        q.retain(keep);
        if had && q.is_empty() {
            self.drained();
        }
    }

    /// Entries waiting.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Sets or clears `O_NONBLOCK` on the descriptor.
    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        set_fd_nonblocking(self.fd.as_raw_fd(), on)
    }
}

impl<T> AsFd for LevelQueue<T> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A completion channel (`ibv_comp_channel`): CQs created on it report
/// "a completion arrived" here once armed with [`crate::Cq::req_notify`].
/// Its descriptor ([`AsFd`]) is readable while events wait.
#[derive(Clone, Debug)]
pub struct CompChannel {
    pub(crate) events: Arc<EventQueue<u32>>,
    /// The context's record of application polling, released before a
    /// blocking wait so that the progress thread serves the wait.
    pub(crate) activity: Arc<crate::progress::Activity>,
}

impl CompChannel {
    /// Waits for the next CQ event (`ibv_get_cq_event`) and returns the
    /// handle of the CQ that raised it ([`crate::Cq::handle`]). Blocks
    /// unless the channel is non-blocking. Completions must still be
    /// acknowledged on the CQ ([`crate::Cq::ack_events`]).
    ///
    /// # Errors
    /// `WouldBlock` on a non-blocking channel with no event; `Interrupted`
    /// when a signal whose handler lacks `SA_RESTART` ends the wait.
    pub fn get_event(&self) -> io::Result<u32> {
        self.activity.release();
        self.events.pop()
    }

    /// [`CompChannel::get_event`] giving up after `timeout`: `Ok(None)` when
    /// no event came. (With several readers on one channel, one that saw
    /// the descriptor readable may lose the event to another and then
    /// block; give each reader its own channel.)
    ///
    /// # Errors
    /// From `poll` or the descriptor read.
    pub fn get_event_timeout(&self, timeout: std::time::Duration) -> io::Result<Option<u32>> {
        self.activity.release();
        if self.events.wait_readable(timeout)? { self.events.pop().map(Some) } else { Ok(None) }
    }

    /// Makes [`CompChannel::get_event`] non-blocking (as setting
    /// `O_NONBLOCK` on `channel->fd` does in C).
    ///
    /// # Errors
    /// From `fcntl`.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.events.set_nonblocking(on)
    }

    /// Events waiting to be read.
    pub fn pending(&self) -> usize {
        self.events.len()
    }
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.events.fd.as_raw_fd()
    }
}

/// A queue of asynchronous events with its own descriptor, readable while
/// events wait: what a C library that opens several `ibv_context`s on one
/// [`crate::Context`] gives each of them as its `async_fd`, filled by an
/// [`AsyncEventRouter`].
#[derive(Debug)]
pub struct AsyncEventQueue(EventQueue<crate::AsyncEvent>);

impl AsyncEventQueue {
    /// A new, empty, blocking queue.
    ///
    /// # Errors
    /// From `eventfd`.
    pub fn new() -> io::Result<Self> {
        EventQueue::new().map(Self)
    }

    /// Queues an event and makes the descriptor readable.
    pub fn push(&self, event: crate::AsyncEvent) {
        self.0.push(event);
    }

    /// Takes one event: blocks while none waits, unless the descriptor was
    /// made non-blocking (here or with `fcntl`), then `WouldBlock`.
    ///
    /// # Errors
    /// `WouldBlock`; `Interrupted` when a signal whose handler lacks
    /// `SA_RESTART` ends the wait; or from the descriptor read.
    pub fn pop(&self) -> io::Result<crate::AsyncEvent> {
        self.0.pop()
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
}

impl AsFd for AsyncEventQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Decides where a context's asynchronous events go
/// ([`crate::Context::set_async_event_router`]): the kernel gives every
/// `ibv_context` its own event queue, with the events of the objects it
/// created and every port event, while uroce runs one engine per device
/// in a process, whatever number of contexts a C program opens on it.
pub trait AsyncEventRouter: Send + Sync + std::fmt::Debug {
    /// Delivers `event` (called by the progress engine, with the context's
    /// driver held: take no lock that is held while calling into the
    /// context). `false`: not routed, it goes to the context's own queue
    /// ([`crate::Context::get_async_event`]).
    fn route(&self, event: &crate::AsyncEvent) -> bool;
}

#[cfg(test)]
mod level_tests {
    use super::{EventQueue, LevelQueue};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn readable_exactly_while_entries_wait() {
        let q = LevelQueue::new().unwrap();
        let ready = |q: &LevelQueue<u32>| q.wait_readable(Duration::ZERO).unwrap();
        assert!(!ready(&q));
        q.push(1);
        q.push(2);
        q.push(3);
        assert!(ready(&q));
        // Withdrawing some keeps it readable; withdrawing all does not.
        q.retain(|&e| e != 2);
        assert!(ready(&q));
        assert_eq!(q.try_pop(), Some(1));
        assert!(ready(&q));
        q.retain(|_| false);
        assert!(!ready(&q), "nothing left: a reader must not wake");
        assert_eq!(q.try_pop(), None);
        // A non-blocking pop on an empty queue says so instead of waiting.
        q.set_nonblocking(true).unwrap();
        assert_eq!(q.pop().unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        q.push(4);
        assert_eq!(q.pop().unwrap(), 4);
        assert!(!ready(&q));
    }

    /// Installs `handler`-less catching of SIGUSR2 (`SA_RESTART` or not)
    /// and returns the previous action to put back.
    fn catch_usr2(restart: bool) -> libc::sigaction {
        extern "C" fn caught(_: i32) {}
        // SAFETY: all-zero is a valid sigaction, filled in below.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = caught as *const () as usize;
        act.sa_flags = if restart { libc::SA_RESTART } else { 0 };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both structs live; SIGUSR2 is only sent to our own thread.
        assert_eq!(unsafe { libc::sigaction(libc::SIGUSR2, &raw const act, &raw mut old) }, 0);
        old
    }

    /// Runs `wait` on a thread and signals it (SIGUSR2) until it returns
    /// or `give_up` passes; then `push`es and waits for the result.
    fn signalled<R: Send + 'static>(
        wait: impl FnOnce() -> R + Send + 'static,
        push: impl FnOnce(),
        give_up: std::time::Duration,
    ) -> (bool, R) {
        use std::os::unix::thread::JoinHandleExt;
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || tx.send(wait()).unwrap());
        let end = std::time::Instant::now() + give_up;
        while std::time::Instant::now() < end {
            // SAFETY: the thread is alive until it has sent (it is joined
            // below), and SIGUSR2 is caught.
            unsafe { libc::pthread_kill(t.as_pthread_t(), libc::SIGUSR2) };
            if let Ok(r) = rx.recv_timeout(std::time::Duration::from_millis(20)) {
                t.join().unwrap();
                return (true, r);
            }
        }
        push();
        let r = rx.recv().unwrap();
        t.join().unwrap();
        (false, r)
    }

    #[test]
    fn a_caught_signal_ends_a_wait_unless_its_handler_restarts() {
        let ev = Arc::new(EventQueue::<u32>::new().unwrap());
        let lv = Arc::new(LevelQueue::<u32>::new().unwrap());
        let old = catch_usr2(false);
        let (e, l) = (ev.clone(), lv.clone());
        // (The pushes only end a wait that failed to end.)
        let (ended, r) = signalled(move || e.pop(), || ev.push(0), Duration::from_secs(5));
        assert!(ended && r.unwrap_err().kind() == std::io::ErrorKind::Interrupted);
        let (ended, r) = signalled(move || l.pop(), || lv.push(0), Duration::from_secs(5));
        assert!(ended && r.unwrap_err().kind() == std::io::ErrorKind::Interrupted);
        // With SA_RESTART the waits go on through the signals and return
        // what comes after.
        catch_usr2(true);
        let (e, l) = (ev.clone(), lv.clone());
        let (ended, r) = signalled(move || e.pop(), || ev.push(7), Duration::from_millis(200));
        assert!(!ended && r.unwrap() == 7);
        let (ended, r) = signalled(move || l.pop(), || lv.push(8), Duration::from_millis(200));
        assert!(!ended && r.unwrap() == 8);
        // SAFETY: puts back the action saved above.
        unsafe { libc::sigaction(libc::SIGUSR2, &raw const old, std::ptr::null_mut()) };
    }
}
