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
    fcntl_lock(file, libc::F_OFD_SETLK, &mut flock_at(libc::F_WRLCK, offset)).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EACCES) => io::ErrorKind::WouldBlock.into(),
            _ => e,
        }
    })
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
        drop(a);
        assert!(!held_by_other(&b, 7), "gone with the file");
        let _ = std::fs::remove_file(&path);
    }
}
