//! UNSAFE ISLAND: what the broker's Unix socket needs beyond std:
//! descriptors passed with a message (`SCM_RIGHTS`), the peer's
//! credentials (`SO_PEERCRED`, `SO_PEERGROUPS`) and a socket's protocol
//! (`SO_PROTOCOL`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The most descriptors one message carries (two per queue).
pub(crate) const MAX_FDS: usize = 64;

/// Room for `MAX_FDS` descriptors' control message, aligned for
/// `cmsghdr`.
#[repr(C, align(8))]
struct Control([u8; 24 + 4 * MAX_FDS]);

/// Sends `data` with descriptors `fds` (at most `MAX_FDS`) in one
/// `sendmsg`.
pub(crate) fn send(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors"));
    }
    let mut control = Control([0; 24 + 4 * MAX_FDS]);
    let mut iov = libc::iovec { iov_base: data.as_ptr().cast_mut().cast(), iov_len: data.len() };
    // SAFETY: an all-zero msghdr is valid; every pointer set below is to a
    // buffer that lives across the call (the kernel only reads `data`).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = (4 * fds.len()) as u32;
        msg.msg_control = control.0.as_mut_ptr().cast();
        // SAFETY: arithmetic only; CMSG_SPACE of at most MAX_FDS
        // descriptors fits `Control`.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        // SAFETY: the control buffer holds CMSG_SPACE(bytes) (checked by
        // CMSG_FIRSTHDR's non-null result); each descriptor is written
        // unaligned inside the header's data.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            if c.is_null() {
                return Err(io::Error::other("no room for the control message"));
            }
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            let at = libc::CMSG_DATA(c).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                at.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    // SAFETY: `msg` and what it points at are live; checked.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "a short send"));
    }
    Ok(())
}

/// Receives into `buf`, the descriptors that came with it appended to
/// `fds` (close-on-exec); 0 at the end of the stream.
pub(crate) fn recv(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut control = Control([0; 24 + 4 * MAX_FDS]);
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: as in `send`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    // SAFETY: `msg` and its buffers are live; checked.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: walks the control messages the kernel wrote inside
    // `control` (CMSG_NXTHDR stops at `msg_controllen`); each
    // SCM_RIGHTS descriptor is new in this process and owned once.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let len = (*c).cmsg_len - (data as usize - c as usize);
                let at = data.cast::<RawFd>();
                for i in 0..len / 4 {
                    fds.push(OwnedFd::from_raw_fd(at.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "descriptors cut off"));
    }
    Ok(n as usize)
}

/// The peer's process, user and group (`SO_PEERCRED`: as of its
/// `connect` or `listen`).
pub(crate) fn peer_cred(sock: &UnixStream) -> io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a live buffer of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

/// The peer's supplementary groups (`SO_PEERGROUPS`, Linux 4.13), up to
/// 256; empty where the kernel cannot tell.
pub(crate) fn peer_groups(sock: &UnixStream) -> Vec<u32> {
    let mut groups = [0u32; 256];
    let mut len = size_of_val(&groups) as libc::socklen_t;
    // SAFETY: `groups` is a live buffer of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Vec::new();
    }
    groups[..(len as usize / 4).min(groups.len())].to_vec()
}

/// The protocol of socket `fd` (`SO_PROTOCOL`), e.g. `IPPROTO_UDP`.
pub(crate) fn protocol(fd: BorrowedFd<'_>) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` is a live buffer of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PROTOCOL,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}
