//! How `uroce run` answers `NETLINK_RDMA` (`rdma link`, `rdma dev`, …)
//! for its program though the kernel has no such family without `ib_core`:
//! a seccomp filter installed in the child, just before it execs, hands
//! two system calls to the supervisor (a user notification) and lets
//! every other call run untouched:
//!
//! - `socket(AF_NETLINK, …, NETLINK_RDMA)`: the supervisor makes a real
//!   netlink socket of the `NETLINK_USERSOCK` family (which needs no
//!   privilege) and puts it into the program as the call's result, so that
//!   `bind`, `getsockname`, `recvmsg`, `poll` and `close` are the kernel's
//!   own;
//! - `sendto(…, addrlen 12)` (a netlink destination): if the socket is one
//!   of those, the supervisor reads the request from the program's memory,
//!   sends the replies (`nldev::answer`) to the socket's port id and
//!   completes the call; any other socket's call goes on unchanged.
//!
//! The filter is inherited by every descendant (a shell, `mpirun`'s
//! ranks). Installing it needs `CAP_SYS_ADMIN` in the program's user
//! namespace, which `uroce run` has in the namespace it makes; without
//! it the program runs without the netlink family, as before. The filter
//! leaves the speculative-store-bypass mitigation as it was
//! (`SECCOMP_FILTER_FLAG_SPEC_ALLOW`), so a program's speed does not change.
//!
//! This module and `mount` are the `uroce` command's only `unsafe`.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;

use super::nldev::{self, DevInfo};

const NETLINK_RDMA: u32 = 20;
const NETLINK_USERSOCK: libc::c_int = 2;
const SOCKADDR_NL_LEN: u32 = 12;
/// The largest request read from a program (nldev requests are tiny).
const MAX_REQUEST: usize = 64 * 1024;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: Option<u32> = Some(0xc000_003e);
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: Option<u32> = Some(0xc000_00b7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH: Option<u32> = None;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt: 0, jf: 0, k }
}

fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16, jt, jf, k }
}

/// The low 32 bits of system call argument `i` in `struct seccomp_data`
/// (little-endian targets).
const fn arg_lo(i: u32) -> u32 {
    16 + 8 * i
}

/// The program: notify `socket(AF_NETLINK, *, NETLINK_RDMA)` and
/// `sendto` with a 12-byte address, allow everything else.
fn filter(arch: u32) -> Vec<libc::sock_filter> {
    let ld = |off: u32| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, off);
    let ret = |v: u32| stmt(libc::BPF_RET | libc::BPF_K, v);
    vec![
        /* 0 */ ld(4),
        /* 1 */ jeq(arch, 0, 9),
        /* 2 */ ld(0),
        /* 3 */ jeq(libc::SYS_socket as u32, 0, 4),
        /* 4 */ ld(arg_lo(0)),
        /* 5 */ jeq(libc::AF_NETLINK as u32, 0, 5),
        /* 6 */ ld(arg_lo(2)),
        /* 7 */ jeq(NETLINK_RDMA, 4, 3),
        /* 8 */ jeq(libc::SYS_sendto as u32, 0, 2),
        /* 9 */ ld(arg_lo(5)),
        /* 10 */ jeq(SOCKADDR_NL_LEN, 1, 0),
        /* 11 */ ret(libc::SECCOMP_RET_ALLOW),
        /* 12 */ ret(libc::SECCOMP_RET_USER_NOTIF),
    ]
}

/// The way the child's listener descriptor comes back to the supervisor.
pub(crate) struct Channel {
    parent: OwnedFd,
    child: OwnedFd,
}

/// A datagram socket pair for [`install_in_child`] and [`listener`];
/// `None` where the architecture has no filter here.
pub(crate) fn channel() -> Option<Channel> {
    AUDIT_ARCH?;
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into the array we own.
    let rc = unsafe {
        libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr())
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: both are fresh descriptors that nothing else owns.
    unsafe {
        Some(Channel { parent: OwnedFd::from_raw_fd(fds[0]), child: OwnedFd::from_raw_fd(fds[1]) })
    }
}

/// Makes `cmd`'s process install the filter just before it execs and send
/// the filter's listener back over `ch`. A refusal (no `CAP_SYS_ADMIN`)
/// leaves the program as it would be without the filter.
pub(crate) fn install_in_child(cmd: &mut std::process::Command, ch: &Channel) {
    let Some(arch) = AUDIT_ARCH else { return };
    let prog = filter(arch).into_boxed_slice();
    let sock = ch.child.as_raw_fd();
    // SAFETY: between fork and exec the closure makes only system calls
    // (seccomp, sendmsg, close), which are async-signal-safe, on memory it
    // owns (the filter was built before the fork; the control buffer is on
    // the stack), and never fails the exec.
    unsafe {
        cmd.pre_exec(move || {
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            let flags =
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW;
            let fd = libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                flags,
                &fprog as *const libc::sock_fprog,
            );
            if fd >= 0 {
                send_fd(sock, fd as RawFd);
                libc::close(fd as RawFd);
            }
            Ok(())
        });
    }
}

/// Room for one cmsghdr and one descriptor, aligned for cmsghdr
/// (CMSG_SPACE(sizeof(int)) is 24 bytes on 64-bit Linux).
type Control = [u64; 4];

/// A one-byte message whose control buffer can carry one descriptor;
/// it points into `iov` and `control`, which must outlive its use.
fn fd_message(iov: &mut libc::iovec, control: &mut Control, controllen: usize) -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = controllen;
    msg
}

/// Sends descriptor `fd` over the datagram socket `sock` (SCM_RIGHTS).
///
/// # Safety
/// Async-signal-safe: no allocation; `sock` and `fd` are open.
unsafe fn send_fd(sock: RawFd, fd: RawFd) {
    let mut control: Control = [0; 4];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: the message and its buffers live on this stack frame; the
    // control buffer holds CMSG_SPACE(sizeof(int)), which CMSG_FIRSTHDR's
    // non-null result confirms.
    unsafe {
        let msg = fd_message(&mut iov, &mut control, libc::CMSG_SPACE(4) as usize);
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() {
            return;
        }
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        libc::sendmsg(sock, &msg, 0);
    }
}

/// The listener the child sent (it did so before its exec, which `spawn`
/// waited for), or `None` if it installed no filter.
pub(crate) fn listener(ch: Channel) -> Option<OwnedFd> {
    drop(ch.child);
    let mut control: Control = [0; 4];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    let size = std::mem::size_of_val(&control);
    let mut msg = fd_message(&mut iov, &mut control, size);
    // SAFETY: as in send_fd; the received descriptor is checked for
    // presence and type before it is owned.
    unsafe {
        let n = libc::recvmsg(
            ch.parent.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        );
        let c = libc::CMSG_FIRSTHDR(&msg);
        if n < 1 || c.is_null() || (*c).cmsg_type != libc::SCM_RIGHTS {
            return None;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
        Some(OwnedFd::from_raw_fd(fd))
    }
}

/// Answers the program's netlink calls on a thread of its own until the
/// process ends; `model` describes the devices at the time of a request.
pub(crate) fn serve(listener: OwnedFd, model: impl Fn() -> Vec<DevInfo> + Send + 'static) {
    std::thread::spawn(move || {
        // SAFETY: socket takes integers; the result is checked.
        let fd = unsafe {
            libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_USERSOCK)
        };
        if fd < 0 {
            eprintln!(
                "uroce run: no netlink socket ({}): rdma link will fail",
                io::Error::last_os_error()
            );
            return;
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let replies = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut server = Server { listener, replies, ours: HashSet::new() };
        while server.next(&model) {}
    });
}

struct Server {
    listener: OwnedFd,
    /// Where replies leave from.
    replies: OwnedFd,
    /// Inodes of the sockets made for the program.
    ours: HashSet<u64>,
}

impl Server {
    /// Takes one notification; false when the listener is unusable.
    fn next(&mut self, model: &impl Fn() -> Vec<DevInfo>) -> bool {
        // SAFETY: the kernel requires a zeroed notification buffer and
        // fills it; the ioctl's pointer is to that buffer.
        let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc = unsafe {
            libc::ioctl(self.listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_RECV, &mut n)
        };
        if rc != 0 {
            // EINTR, or ENOENT: the caller died before we took it.
            let e = io::Error::last_os_error().raw_os_error();
            return matches!(e, Some(libc::EINTR) | Some(libc::ENOENT));
        }
        let args = n.data.args;
        if n.data.nr == libc::SYS_socket as i32 {
            self.socket(n.id, args[1] as libc::c_int);
        } else {
            self.sendto(&n, model);
        }
        true
    }

    fn respond(&self, id: u64, val: i64, errno: i32, flags: u32) {
        let mut r = libc::seccomp_notif_resp { id, val, error: -errno, flags };
        // SAFETY: a valid response for the listener; failure (the caller
        // died) needs nothing done.
        unsafe { libc::ioctl(self.listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &mut r) };
    }

    fn go_on(&self, id: u64) {
        self.respond(id, 0, 0, libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32);
    }

    /// `socket(AF_NETLINK, ty, NETLINK_RDMA)`: a USERSOCK socket, given
    /// to the caller as the call's result.
    fn socket(&mut self, id: u64, ty: libc::c_int) {
        // SAFETY: socket takes integers; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, ty, NETLINK_USERSOCK) };
        if fd < 0 {
            let e = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
            return self.respond(id, 0, e, 0);
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let cloexec = if ty & libc::SOCK_CLOEXEC != 0 { libc::O_CLOEXEC as u32 } else { 0 };
        let add = libc::seccomp_notif_addfd {
            id,
            flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
            srcfd: fd as u32,
            newfd: 0,
            newfd_flags: cloexec,
        };
        // SAFETY: a valid addfd request; with FLAG_SEND a success also
        // completes the caller's system call with the new descriptor.
        let rc = unsafe {
            libc::ioctl(self.listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ADDFD, &add)
        };
        if rc >= 0 {
            self.ours.insert(inode(&sock));
        }
    }

    /// `sendto(fd, buf, len, flags, addr, 12)`: answered here if `fd` is
    /// one of ours and the destination is the kernel (port id 0).
    fn sendto(&mut self, n: &libc::seccomp_notif, model: &impl Fn() -> Vec<DevInfo>) {
        let [fd, buf, len, _, addr, _] = n.data.args;
        let Some(sock) = descriptor_of(n.pid, fd as RawFd) else { return self.go_on(n.id) };
        if !self.ours.contains(&inode(&sock)) {
            return self.go_on(n.id);
        }
        let mut dest = [0u8; 12];
        if read_memory(n.pid, addr, &mut dest).is_err() || dest[4..8] != [0; 4] {
            // Not the kernel: a message to another USERSOCK socket.
            return self.go_on(n.id);
        }
        let len = len as usize;
        if len > MAX_REQUEST {
            return self.respond(n.id, 0, libc::EMSGSIZE, 0);
        }
        let mut request = vec![0u8; len];
        if let Err(e) = read_memory(n.pid, buf, &mut request) {
            return self.respond(n.id, 0, e.raw_os_error().unwrap_or(libc::EFAULT), 0);
        }
        // The caller may have died and its pid been reused meanwhile.
        // SAFETY: ID_VALID reads the id we pass.
        if unsafe {
            libc::ioctl(self.listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &n.id)
        } != 0
        {
            return;
        }
        let Some(portid) = port_id(&sock) else { return self.respond(n.id, 0, libc::EINVAL, 0) };
        for d in nldev::answer(&request, portid, &model()) {
            self.send(portid, &d);
        }
        self.respond(n.id, len as i64, 0, 0);
    }

    fn send(&self, portid: u32, d: &[u8]) {
        // SAFETY: sockaddr_nl is plain data; zeroed is a valid value.
        let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        to.nl_pid = portid;
        // SAFETY: the buffer and address are ours and sized as passed.
        // Non-blocking: a reader that does not read cannot stall us.
        unsafe {
            libc::sendto(
                self.replies.as_raw_fd(),
                d.as_ptr().cast(),
                d.len(),
                libc::MSG_DONTWAIT,
                (&to as *const libc::sockaddr_nl).cast(),
                SOCKADDR_NL_LEN,
            )
        };
    }
}

fn inode(fd: &OwnedFd) -> u64 {
    // SAFETY: fstat fills the stat buffer we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) == 0 { st.st_ino } else { 0 }
    }
}

/// A duplicate of process `pid`'s descriptor `fd` (pidfd_getfd).
fn descriptor_of(pid: u32, fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: both calls take integers; results are checked before being
    // owned.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0);
        if pidfd < 0 {
            return None;
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        let dup = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        (dup >= 0).then(|| OwnedFd::from_raw_fd(dup as RawFd))
    }
}

/// Reads `buf.len()` bytes at `addr` in process `pid`.
fn read_memory(pid: u32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: the local iovec covers exactly `buf`; the remote one is only
    // read by the kernel, which checks it against the other process.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n == buf.len() as isize {
        Ok(())
    } else if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Err(io::Error::from_raw_os_error(libc::EFAULT))
    }
}

/// The socket's port id, binding it first (as a send would) if unbound.
fn port_id(sock: &OwnedFd) -> Option<u32> {
    // SAFETY: sockaddr_nl is plain data; the calls write at most `len`
    // bytes into it and take our descriptor.
    unsafe {
        let mut a: libc::sockaddr_nl = std::mem::zeroed();
        let mut len = SOCKADDR_NL_LEN;
        let p = (&mut a as *mut libc::sockaddr_nl).cast::<libc::sockaddr>();
        if libc::getsockname(sock.as_raw_fd(), p, &mut len) != 0 {
            return None;
        }
        if a.nl_pid == 0 {
            a.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            libc::bind(sock.as_raw_fd(), p, SOCKADDR_NL_LEN);
            if libc::getsockname(sock.as_raw_fd(), p, &mut len) != 0 {
                return None;
            }
        }
        (a.nl_pid != 0).then_some(a.nl_pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter's jumps land where its comments say.
    #[test]
    fn the_filter_notifies_exactly_the_two_calls() {
        let f = filter(0xc000_003e);
        let run = |nr: u32, args: [u32; 6]| -> u32 {
            let mut data = [0u32; 16];
            data[0] = nr;
            data[1] = 0xc000_003e;
            for (i, a) in args.iter().enumerate() {
                data[4 + 2 * i] = *a;
            }
            let (mut pc, mut acc) = (0usize, 0u32);
            loop {
                let i = f[pc];
                match i.code as u32 {
                    c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                        acc = data[i.k as usize / 4]
                    }
                    c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                    _ => {
                        pc += if acc == i.k { i.jt } else { i.jf } as usize;
                    }
                }
                pc += 1;
            }
        };
        let notify = libc::SECCOMP_RET_USER_NOTIF;
        let allow = libc::SECCOMP_RET_ALLOW;
        let socket = libc::SYS_socket as u32;
        let sendto = libc::SYS_sendto as u32;
        assert_eq!(run(socket, [16, 3, 20, 0, 0, 0]), notify);
        assert_eq!(run(socket, [16, 3, 0, 0, 0, 0]), allow);
        assert_eq!(run(socket, [2, 2, 20, 0, 0, 0]), allow);
        assert_eq!(run(sendto, [3, 0, 16, 0, 0, 12]), notify);
        assert_eq!(run(sendto, [3, 0, 16, 0, 0, 16]), allow);
        assert_eq!(run(libc::SYS_read as u32, [16, 3, 20, 0, 0, 12]), allow);
    }
}
