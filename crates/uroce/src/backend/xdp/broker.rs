//! The AF_XDP broker (`uroce setup xdp IFACE`): AF_XDP without privilege.
//!
//! An AF_XDP socket needs `CAP_NET_RAW`, the XDP program `CAP_BPF` and
//! `CAP_NET_ADMIN`, and none of those can be handed down by a file's
//! permissions. So a privileged process, started once per interface,
//! does those steps for the others: a context (any user the broker
//! admits) connects to its Unix socket (an abstract name, so one per
//! network namespace: `uroce-xdp/IFACE`), passes the UDP socket it bound
//! on the device's address and port, and gets back, per receive queue,
//! an AF_XDP socket bound to the queue with its UMEM registered, and the
//! memfd that holds the UMEM; it maps the rings and the UMEM itself
//! (mapping needs no privilege) and runs them as if it had opened them.
//!
//! What a context may steer is what it holds: the broker loads the
//! program for the address and port of the UDP socket passed (bound by
//! the context, so nobody else's traffic), after checking that it is a
//! UDP socket bound to one of the interface's addresses. The program
//! stays attached for as long as the context's connection is open: when
//! it ends by any path, SIGKILL included, the kernel closes the
//! connection and the broker detaches the program (and a broker killed
//! takes its programs with it: the contexts' traffic goes back to their
//! kernel sockets). A context checks the broker is root's (or its own
//! user's) before it passes its socket: an abstract name can be taken by
//! anyone first.

use std::io::{self, Read};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{self as unix, UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{fdpass, xsk};

const MAGIC: [u8; 4] = *b"UXDP";
const VERSION: u16 = 2;
/// A request for the interface's sockets and program.
const OPEN: u16 = 1;
/// A request that the broker end (root's or the broker's user's only).
const STOP: u16 = 2;
/// Request: magic, version, kind, slot (`u32::MAX`: none), reserved.
const REQUEST_LEN: usize = 16;
/// Reply: status (0 or an errno), sockets, multi-buffer bits, text length,
/// zero-copy bits.
const REPLY_LEN: usize = 20;
/// The longest reason a refusal carries.
const MAX_TEXT: usize = 1024;

/// Who the broker serves.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Only root, the broker's user and members of this group (primary or
    /// supplementary); everyone when `None`.
    pub group: Option<u32>,
    /// Busy polling of each socket's queue, in µs (`SO_BUSY_POLL` with
    /// `SO_PREFER_BUSY_POLL`, which need `CAP_NET_ADMIN`): the contexts'
    /// empty receive checks then run the driver's receive themselves.
    pub busy_poll: Option<u32>,
}

/// What a broker granted a context: its connection (the program stays
/// while it is open) and a bound socket per receive queue.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) conn: UnixStream,
    pub(crate) sockets: Vec<xsk::Bound>,
}

/// The broker's name for `iface`, an abstract socket address (per network
/// namespace).
fn address(iface: &str) -> io::Result<unix::SocketAddr> {
    unix::SocketAddr::from_abstract_name(format!("uroce-xdp/{iface}").as_bytes())
}

/// This process's effective user (the owner of `/proc/self`).
fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// Connects to `iface`'s broker; `None` when none serves it. A broker
/// that is neither root's nor this user's is refused.
fn connect(iface: &str) -> io::Result<Option<UnixStream>> {
    let conn = match UnixStream::connect_addr(&address(iface)?) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(None),
        Err(e) => return Err(e),
    };
    let (pid, uid, _) = fdpass::peer_cred(&conn)?;
    if uid != 0 && uid != own_uid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the broker's name for {iface} is held by user {uid} (pid {pid}), not root"),
        ));
    }
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(Some(conn))
}

fn request(kind: u16, slot: Option<u32>) -> [u8; REQUEST_LEN] {
    let mut r = [0u8; REQUEST_LEN];
    r[..4].copy_from_slice(&MAGIC);
    r[4..6].copy_from_slice(&VERSION.to_le_bytes());
    r[6..8].copy_from_slice(&kind.to_le_bytes());
    r[8..12].copy_from_slice(&slot.unwrap_or(u32::MAX).to_le_bytes());
    r
}

/// Reads exactly `buf.len()` bytes, keeping any descriptors that come.
fn read_full(conn: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match fdpass::recv(conn, &mut buf[got..], fds)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    Ok(())
}

/// Asks `iface`'s broker for its sockets and program, steering to the
/// address and port `udp` is bound to (`slot`: the device's slot whose
/// QPNs the program takes, on a shared device). `None`: no broker serves
/// the interface. A refusal is an error with the broker's reason (kind
/// `ResourceBusy` when another process holds the interface's program).
pub(crate) fn open(
    iface: &str,
    udp: std::os::fd::BorrowedFd<'_>,
    slot: Option<u32>,
) -> io::Result<Option<Granted>> {
    let Some(conn) = connect(iface)? else { return Ok(None) };
    fdpass::send(&conn, &request(OPEN, slot), &[udp])?;
    let mut fds = Vec::new();
    let mut head = [0u8; REPLY_LEN];
    read_full(&conn, &mut head, &mut fds)?;
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let (status, count, multi, text_len) = (word(0) as i32, word(4), word(8), word(12));
    let zero_copy = word(16);
    let mut text = vec![0u8; (text_len as usize).min(MAX_TEXT)];
    read_full(&conn, &mut text, &mut fds)?;
    if status != 0 {
        let kind = io::Error::from_raw_os_error(status).kind();
        let text = String::from_utf8_lossy(&text);
        return Err(io::Error::new(kind, format!("the broker refused: {text}")));
    }
    if count == 0 || count > 32 || fds.len() != 2 * count as usize {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the broker's answer is malformed"));
    }
    let mut it = fds.into_iter();
    let sockets = (0..count)
        .map(|i| xsk::Bound {
            sock: it.next().expect("counted"),
            umem: it.next().expect("counted"),
            multi_buffer: multi & (1 << i) != 0,
            zero_copy: zero_copy & (1 << i) != 0,
        })
        .collect();
    Ok(Some(Granted { conn, sockets }))
}

/// Asks `iface`'s broker to end (root or the broker's user only) and waits
/// until it has; `false` when none served it.
pub fn stop(iface: &str) -> io::Result<bool> {
    let Some(conn) = connect(iface)? else { return Ok(false) };
    fdpass::send(&conn, &request(STOP, None), &[])?;
    let mut head = [0u8; REPLY_LEN];
    read_full(&conn, &mut head, &mut Vec::new())?;
    let status = i32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if status != 0 {
        return Err(io::Error::from_raw_os_error(status));
    }
    let t = std::time::Instant::now();
    while UnixStream::connect_addr(&address(iface)?).is_ok() {
        if t.elapsed() > Duration::from_secs(5) {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the broker did not end"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(true)
}

/// The capabilities the broker needs that this process lacks (from
/// `/proc/self/status`' `CapEff`), by name.
fn missing_capabilities() -> Vec<&'static str> {
    let eff = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .unwrap_or(0);
    let has = |bit: u32| eff & (1 << bit) != 0;
    let mut missing = Vec::new();
    if !has(12) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(13) {
        missing.push("CAP_NET_RAW");
    }
    if !has(39) && !has(21) {
        missing.push("CAP_BPF");
    }
    missing
}

/// Serves `iface` until asked to stop (`stop`) or killed: each admitted
/// context's request gets the interface's sockets and program, one
/// context at a time (an interface takes one program; the others are
/// told EBUSY). `ready` is called once the broker's name is bound. A
/// program held when it returns stays until its context ends or this
/// process does (the `uroce setup xdp` process ends right after).
pub fn serve(iface: &str, opts: &Options, ready: impl FnOnce()) -> io::Result<()> {
    let ifindex = crate::netif::index_of_name(iface)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface {iface}")))?;
    let missing = missing_capabilities();
    if !missing.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the AF_XDP broker needs CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF (or root); \
                 missing: {}",
                missing.join(", ")
            ),
        ));
    }
    let listener = UnixListener::bind_addr(&address(iface)?).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(e.kind(), format!("a broker already serves {iface}"))
        } else {
            e
        }
    })?;
    ready();
    // The process holding the interface's program, if any.
    let holder: Arc<Mutex<Option<i32>>> = Arc::new(Mutex::new(None));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for conn in listener.incoming() {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let Ok(conn) = conn else { continue };
        // A thread per connection: one that says nothing holds up no
        // other (each waits at most its read timeout).
        let (iface, opts) = (iface.to_string(), opts.clone());
        let (holder, stop) = (Arc::clone(&holder), Arc::clone(&stop));
        std::thread::spawn(move || {
            if serve_one(&iface, ifindex, &opts, conn, &holder) {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                // Wakes the accept loop, which sees the flag and ends.
                if let Ok(a) = address(&iface) {
                    let _ = UnixStream::connect_addr(&a);
                }
            }
        });
    }
    Ok(())
}

/// A refusal: an errno and the reason.
type Refusal = (i32, String);

fn refuse(errno: i32, text: impl Into<String>) -> Refusal {
    (errno, text.into())
}

/// Answers one connection; `true` when asked to stop.
fn serve_one(
    iface: &str,
    ifindex: u32,
    opts: &Options,
    conn: UnixStream,
    holder: &Arc<Mutex<Option<i32>>>,
) -> bool {
    // A client that says nothing does not hold the broker up.
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let reply = |r: Result<Vec<xsk::Bound>, Refusal>| {
        let (status, sockets, text) = match r {
            Ok(s) => (0, s, String::new()),
            Err((errno, text)) => (errno, Vec::new(), text),
        };
        let text = &text.as_bytes()[..text.len().min(MAX_TEXT)];
        let bits = |f: fn(&xsk::Bound) -> bool| {
            sockets.iter().enumerate().fold(0u32, |m, (i, b)| m | u32::from(f(b)) << i)
        };
        let (multi, zero_copy) = (bits(|b| b.multi_buffer), bits(|b| b.zero_copy));
        let mut msg = Vec::with_capacity(REPLY_LEN + text.len());
        for w in [status as u32, sockets.len() as u32, multi, text.len() as u32, zero_copy] {
            msg.extend_from_slice(&w.to_le_bytes());
        }
        msg.extend_from_slice(text);
        let fds: Vec<_> = sockets.iter().flat_map(|b| [b.sock.as_fd(), b.umem.as_fd()]).collect();
        // Our copies close when `sockets` goes: the context's are the
        // only ones, and its end releases them.
        fdpass::send(&conn, &msg, &fds).is_ok()
    };
    let Ok((pid, uid, gid)) = fdpass::peer_cred(&conn) else { return false };
    let mut fds = Vec::new();
    let mut req = [0u8; REQUEST_LEN];
    if read_full(&conn, &mut req, &mut fds).is_err()
        || req[..4] != MAGIC
        || u16::from_le_bytes([req[4], req[5]]) != VERSION
    {
        reply(Err(refuse(libc::EPROTO, "not a uroce request of this version")));
        return false;
    }
    let kind = u16::from_le_bytes([req[6], req[7]]);
    let slot = u32::from_le_bytes([req[8], req[9], req[10], req[11]]);
    let owner = uid == 0 || uid == own_uid();
    if kind == STOP {
        if owner {
            reply(Ok(Vec::new()));
            return true;
        }
        reply(Err(refuse(libc::EPERM, "only root or the broker's user may stop it")));
        return false;
    }
    if kind != OPEN {
        reply(Err(refuse(libc::EPROTO, format!("unknown request {kind}"))));
        return false;
    }
    let admitted =
        owner || opts.group.is_none_or(|g| gid == g || fdpass::peer_groups(&conn).contains(&g));
    if !admitted {
        reply(Err(refuse(libc::EACCES, format!("user {uid} is not in the broker's group"))));
        return false;
    }
    let slot = (slot != u32::MAX).then_some(slot);
    let granted = grant(iface, ifindex, fds, slot, holder, pid, opts.busy_poll);
    let (steering, sockets) = match granted {
        Ok(g) => g,
        Err(r) => {
            reply(Err(r));
            return false;
        }
    };
    if !reply(Ok(sockets)) {
        *holder.lock().unwrap_or_else(|e| e.into_inner()) = None;
        return false;
    }
    // The program stays until the context's connection ends.
    let holder = Arc::clone(holder);
    std::thread::spawn(move || {
        let mut conn = conn;
        let _ = conn.set_read_timeout(None);
        let mut b = [0u8; 64];
        while matches!(conn.read(&mut b), Ok(n) if n > 0) {}
        drop(steering);
        *holder.lock().unwrap_or_else(|e| e.into_inner()) = None;
    });
    false
}

/// Checks a request's UDP socket and sets up the interface's program and
/// sockets for it, marking `pid` the holder.
fn grant(
    iface: &str,
    ifindex: u32,
    fds: Vec<OwnedFd>,
    slot: Option<u32>,
    holder: &Mutex<Option<i32>>,
    pid: i32,
    busy_poll: Option<u32>,
) -> Result<(super::Steering, Vec<xsk::Bound>), Refusal> {
    let [udp]: [OwnedFd; 1] =
        fds.try_into().map_err(|_| refuse(libc::EINVAL, "a request carries one UDP socket"))?;
    if fdpass::protocol(udp.as_fd()).ok() != Some(libc::IPPROTO_UDP) {
        return Err(refuse(libc::EINVAL, "the descriptor passed is not a UDP socket"));
    }
    let local: SocketAddr = UdpSocket::from(udp)
        .local_addr()
        .map_err(|e| refuse(libc::EINVAL, format!("the UDP socket's address: {e}")))?;
    if local.port() == 0 || crate::netif::interface_of(local.ip()).as_deref() != Some(iface) {
        return Err(refuse(
            libc::EADDRNOTAVAIL,
            format!("the UDP socket is bound to {local}, not to a port of an address of {iface}"),
        ));
    }
    if slot.is_some_and(|s| s as usize >= crate::backend::share::SLOTS) {
        return Err(refuse(libc::EINVAL, "no such slot"));
    }
    let mut h = holder.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(other) = *h {
        return Err(refuse(
            libc::EBUSY,
            format!("process {other} holds {iface}'s program (an interface takes one)"),
        ));
    }
    let got = super::steer(iface, ifindex, local, slot, busy_poll)
        .map_err(|(what, e)| (e.raw_os_error().unwrap_or(libc::EIO), format!("{what}: {e}")))?;
    *h = Some(pid);
    Ok(got)
}
