//! The private mount namespace `uroce run` gives a program: `unshare(2)`,
//! the uid/gid maps of a user namespace when not root, and the mounts that
//! lay a scratch `tmpfs` over a directory while keeping every entry it had
//! (bound back in from the original, reached through a descriptor opened
//! before the `tmpfs` hid it).
//!
//! The only `unsafe` of the `uroce` command: libc's `unshare`, `mount`,
//! `getuid`/`getgid` and the signal calls of the supervisor.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// This process's real uid and gid.
pub(crate) fn ids() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail and touch no memory of ours.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Moves this (single-threaded) process into a mount namespace of its own,
/// inside a user namespace that maps the caller's ids to themselves when
/// the caller is not root; mounts made after it are seen by this process
/// and its children only.
pub(crate) fn enter_private_namespace() -> io::Result<()> {
    let (uid, gid) = ids();
    let flags = if uid == 0 { libc::CLONE_NEWNS } else { libc::CLONE_NEWUSER | libc::CLONE_NEWNS };
    // SAFETY: unshare takes flags only; it fails (EINVAL) rather than
    // misbehaving if the process has other threads.
    check(unsafe { libc::unshare(flags) })?;
    if uid != 0 {
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    // Nothing mounted from here on propagates back to the host.
    mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_SLAVE, None)
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype.map(|s| CString::new(s).expect("no NUL"));
    let data = data.map(|s| CString::new(s).expect("no NUL"));
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that lives
    // until the call returns.
    check(unsafe {
        libc::mount(ptr(&source), target.as_ptr(), ptr(&fstype), flags, ptr(&data).cast())
    })
}

/// Binds `source` (a file or, recursively, a directory) onto `target`.
pub(crate) fn bind(source: &Path, target: &Path) -> io::Result<()> {
    mount(Some(source), target, None, libc::MS_BIND | libc::MS_REC, None)
}

/// Lays a `tmpfs` over `dir` and puts back every entry it held except
/// those `replace` names (the caller fills those in): directories and
/// device nodes are bound from the original, symlinks copied.
pub(crate) fn overlay(dir: &Path, replace: &[&str]) -> io::Result<()> {
    let original: OwnedFd =
        std::fs::File::open(dir).map(OwnedFd::from).map_err(|e| with_path(e, dir))?;
    let via = Path::new("/proc/self/fd").join(original.as_raw_fd().to_string());
    let mut entries: Vec<_> = std::fs::read_dir(&via)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    mount(None, dir, Some("tmpfs"), libc::MS_NOSUID, Some("mode=0755"))
        .map_err(|e| with_path(e, dir))?;
    for e in entries {
        let name = e.file_name();
        if replace.iter().any(|r| name.as_bytes() == r.as_bytes()) {
            continue;
        }
        let (from, to) = (via.join(&name), dir.join(&name));
        let kind = e.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
            continue;
        }
        if kind.is_dir() {
            std::fs::create_dir(&to)?;
        } else {
            std::fs::File::create(&to)?;
        }
        bind(&from, &to).map_err(|e| with_path(e, &to))?;
    }
    Ok(())
}

fn with_path(e: io::Error, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

/// The signals the supervisor passes on to its program.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The forwarded signals and SIGCHLD (which ends the supervisor's wait).
fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset write only into the set we own, which
    // sigemptyset initialises first.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED.into_iter().chain([libc::SIGCHLD]) {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks the forwarded signals and SIGCHLD in this process, so that the
/// supervisor takes them with [`wait_signal`]; a child spawned with
/// [`unblock_in_child`] gets them back.
pub(crate) fn block_signals() -> io::Result<()> {
    let set = signal_set();
    // SAFETY: a valid set; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
}

/// Makes `cmd`'s process start with the signals [`block_signals`] blocks
/// unblocked (a spawned child inherits the mask).
pub(crate) fn unblock_in_child(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let set = signal_set();
    // SAFETY: between fork and exec the closure calls only
    // pthread_sigmask, which is async-signal-safe, on a set it owns.
    unsafe {
        cmd.pre_exec(move || {
            let rc = libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
        });
    }
}

/// Waits up to `timeout` for a blocked signal; returns it if one came and
/// is to be forwarded (SIGCHLD and timeouts return `None`).
pub(crate) fn wait_signal(timeout: std::time::Duration) -> Option<libc::c_int> {
    let set = signal_set();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: valid set and timespec; no siginfo wanted.
    let s = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
    (s > 0 && s != libc::SIGCHLD).then_some(s)
}

/// Sends `signal` to process `pid`.
pub(crate) fn kill(pid: u32, signal: libc::c_int) {
    // SAFETY: kill takes plain integers; a stale pid is harmless here
    // (the child is not reaped before the supervisor stops forwarding).
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}
