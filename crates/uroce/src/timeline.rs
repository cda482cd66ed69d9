//! An event timeline for finding stalls between processes
//! (`UROCE_TIMELINE=PREFIX`): posts, progress passes with what they
//! received and sent, transmits, probe timeouts, doorbells, polls that
//! found completions, long yields, parks and sleeps of the progress
//! thread, each stamped with the wall clock, so that the files of two
//! processes merge into one exchange (`scripts/timeline`). It showed in
//! minutes what `perf sched` alone did not: which side waited for what.
//!
//! Off unless the variable is set (one atomic load per event site). On,
//! events go into a buffer reserved at the first event (a million; later
//! ones are counted, not kept), and the exit hook writes `PREFIX.<pid>`,
//! one `stamp_ns pid thread event a b cpu` line per event (thread `A`: an
//! application thread, `P`: the progress thread; `cpu`: where it ran).

use std::sync::{Mutex, OnceLock};

/// Events kept per process.
const CAPACITY: usize = 1 << 20;

struct Event {
    ns: u64,
    thread: u8,
    name: &'static str,
    a: u64,
    b: u64,
    cpu: u64,
}

struct Recorded {
    events: Vec<Event>,
    dropped: u64,
}

static EVENTS: Mutex<Recorded> = Mutex::new(Recorded { events: Vec::new(), dropped: 0 });

thread_local! {
    /// `b'P'` on the progress thread.
    static THREAD: std::cell::Cell<u8> = const { std::cell::Cell::new(b'A') };
}

/// Where the timeline goes, if it is on.
fn prefix() -> Option<&'static str> {
    static PREFIX: OnceLock<Option<String>> = OnceLock::new();
    PREFIX.get_or_init(|| std::env::var("UROCE_TIMELINE").ok().filter(|p| !p.is_empty())).as_deref()
}

/// Whether events are recorded.
pub(crate) fn on() -> bool {
    prefix().is_some()
}

/// Marks the calling thread as the progress thread.
pub(crate) fn progress_thread() {
    THREAD.with(|t| t.set(b'P'));
}

/// Records event `name` with its arguments.
pub(crate) fn event(name: &'static str, a: u64, b: u64) {
    if !on() {
        return;
    }
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let thread = THREAD.with(std::cell::Cell::get);
    let cpu = crate::sched::current_cpu();
    let mut r = EVENTS.lock().unwrap_or_else(|e| e.into_inner());
    if r.events.capacity() == 0 {
        r.events.reserve_exact(CAPACITY);
    }
    if r.events.len() < CAPACITY {
        r.events.push(Event { ns, thread, name, a, b, cpu });
    } else {
        r.dropped += 1;
    }
}

/// Writes the events to `PREFIX.<pid>` (from the exit hook).
pub(crate) fn write() {
    use std::io::Write;
    let Some(prefix) = prefix() else { return };
    let Ok(r) = EVENTS.try_lock() else { return };
    let pid = std::process::id();
    let Ok(f) = std::fs::File::create(format!("{prefix}.{pid}")) else { return };
    let mut w = std::io::BufWriter::new(f);
    for e in &r.events {
        let (ns, t, name, a, b, cpu) = (e.ns, e.thread as char, e.name, e.a, e.b, e.cpu);
        let _ = writeln!(w, "{ns} {pid} {t} {name} {a} {b} {cpu}");
    }
    if r.dropped > 0 {
        let _ = writeln!(w, "# {} events past the first {CAPACITY} not kept", r.dropped);
    }
}
