//! Open-file-description byte locks (`F_OFD_SETLK`, `F_OFD_GETLK`): how a
//! shared device's members tell whether a slot's owner still runs, and
//! `uroce stat` whether a context that published counters does.
//!
//! The kernel drops such a lock when the last descriptor of the open file
//! goes, whatever killed its process (SIGKILL included), and answers
//! `F_OFD_GETLK` from any PID namespace: unlike a pid, it cannot be
//! misread by a process that sees other pids, and it cannot be reused. A
//! lock lives exactly as long as the descriptors that also keep the
//! member's socket in the group (a forked child holds both).
//!
//! UNSAFE ISLAND (small): `fcntl` with a `struct flock`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// A `struct flock` for the one byte at `offset`.
fn flock_at(kind: libc::c_int, offset: u64) -> libc::flock {
    // SAFETY: `flock` is plain data; all-zero is a valid value (and the
    // `l_pid` of 0 that OFD locks require).
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = kind as libc::c_short;
    f.l_whence = libc::SEEK_SET as libc::c_short;
    f.l_start = offset as libc::off_t;
    f.l_len = 1;
    f
}

fn fcntl_lock(file: &File, cmd: libc::c_int, f: &mut libc::flock) -> io::Result<()> {
    // SAFETY: `file` is an open descriptor and `f` a valid, writable
    // `struct flock` for the duration of the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, std::ptr::from_mut(f)) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Takes the write lock on byte `offset` through `file`'s open file
/// description, without waiting (`WouldBlock` if another holds it).
pub(crate) fn lock(file: &File, offset: u64) -> io::Result<()> {
    take(file, libc::F_WRLCK, offset)
}

fn take(file: &File, kind: libc::c_int, offset: u64) -> io::Result<()> {
    fcntl_lock(file, libc::F_OFD_SETLK, &mut flock_at(kind, offset)).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EACCES) => io::ErrorKind::WouldBlock.into(),
            _ => e,
        }
    })
}

/// Takes a read (shared) lock on byte `offset`, without waiting
/// (`WouldBlock` while another holds the write lock): many holders may
/// share it, and a write lock on it succeeds only when no other does.
pub(crate) fn lock_shared(file: &File, offset: u64) -> io::Result<()> {
    take(file, libc::F_RDLCK, offset)
}

/// Lets go of byte `offset` (the lock also goes with the file).
pub(crate) fn unlock(file: &File, offset: u64) -> io::Result<()> {
    fcntl_lock(file, libc::F_OFD_SETLK, &mut flock_at(libc::F_UNLCK, offset))
}

/// Whether another open file description (this process's or another's)
/// holds a lock on byte `offset`. `file`'s own locks do not count.
pub(crate) fn held_by_other(file: &File, offset: u64) -> bool {
    let mut f = flock_at(libc::F_WRLCK, offset);
    // An error (none is expected for a valid descriptor) reads as "held":
    // never take a slot back on a doubt.
    fcntl_lock(file, libc::F_OFD_GETLK, &mut f).is_err() || i32::from(f.l_type) != libc::F_UNLCK
}

/// Whether another open file description, or a process by a classic
/// `fcntl` record lock, holds a lock anywhere in the file (such as the lock
/// a DPDK primary holds on part of its `config` while it runs).
#[cfg(feature = "dpdk")]
pub(crate) fn any_held_by_other(file: &File) -> bool {
    let mut f = flock_at(libc::F_WRLCK, 0);
    f.l_len = 0; // to the end of the file, however far it grows
    fcntl_lock(file, libc::F_OFD_GETLK, &mut f).is_err() || i32::from(f.l_type) != libc::F_UNLCK
}

/// Takes a classic (process-owned) `fcntl` write lock on byte `offset`, as
/// programs other than uroce lock their files: for tests.
#[cfg(all(test, feature = "dpdk"))]
pub(crate) fn record_lock(file: &File, offset: u64) -> io::Result<()> {
    fcntl_lock(file, libc::F_SETLK, &mut flock_at(libc::F_WRLCK, offset))
}

/// Which of the `n` (at most 64) bytes from `first` on another open file
/// description holds a lock on, a bit each (bit `i`: byte `first + i`):
/// one `F_OFD_GETLK` per lock found, plus one. An error reads as "held",
/// as in [`held_by_other`].
pub(crate) fn held_bits(file: &File, first: u64, n: u32) -> u64 {
    let end = first + u64::from(n.min(64));
    let mut bits = 0u64;
    let mut at = first;
    while at < end {
        let mut f = flock_at(libc::F_WRLCK, at);
        f.l_len = (end - at) as libc::off_t;
        let failed = fcntl_lock(file, libc::F_OFD_GETLK, &mut f).is_err();
        if !failed && i32::from(f.l_type) == libc::F_UNLCK {
            break;
        }
        // The lock found (all the rest on an error): its bytes inside the
        // range are marked, and the search goes on past it (a length of 0
        // means "to the end of the file").
        let start = if failed { at } else { (f.l_start.max(0) as u64).max(at) };
        let stop = if failed || f.l_len == 0 {
            end
        } else {
            (f.l_start as u64).saturating_add(f.l_len as u64).clamp(start + 1, end)
        };
        for b in start..stop {
            bits |= 1 << (b - first);
        }
        at = stop;
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_seen_from_another_description_until_it_goes() {
        let path = std::env::temp_dir().join(format!("uroce-ofd-test-{}", std::process::id()));
        let a = File::create(&path).unwrap();
        let b = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        assert!(!held_by_other(&b, 7));
        lock(&a, 7).unwrap();
        assert!(held_by_other(&b, 7), "seen from another description");
        assert!(!held_by_other(&a, 7), "not from its own");
        assert!(!held_by_other(&b, 8), "one byte only");
        assert_eq!(lock(&b, 7).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        unlock(&a, 7).unwrap();
        assert!(!held_by_other(&b, 7));
        lock(&a, 7).unwrap();
        lock(&a, 9).unwrap();
        lock(&a, 64).unwrap();
        lock(&a, 70).unwrap();
        assert_eq!(held_bits(&b, 1, 64), (1 << 6) | (1 << 8) | (1 << 63), "bytes 7, 9, 64");
        assert_eq!(held_bits(&b, 8, 2), 1 << 1, "byte 9 of 8..10");
        assert_eq!(held_bits(&a, 1, 64), 0, "not its own");
        drop(a);
        assert!(!held_by_other(&b, 7), "gone with the file");
        assert_eq!(held_bits(&b, 1, 64), 0);
        let _ = std::fs::remove_file(&path);
    }
}
