//! What the tools share: opening the device a user names, GIDs, the
//! out-of-band TCP connection, and waiting for completions (busy polling or
//! a completion channel) without ever hanging.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use uroce::{AhAttr, CompChannel, Completion, Context, Cq, Mtu, WcOpcode, WcStatus};

/// Opens the device called `name`, or the first configured one.
pub(crate) fn open_device(name: Option<&str>) -> Result<Context> {
    let list = uroce::devices()?;
    let dev = match name {
        Some(n) => list.iter().find(|d| d.name() == n).ok_or_else(|| {
            let names: Vec<&str> = list.iter().map(uroce::Device::name).collect();
            anyhow!("IB device {n} not found (configured: {})", names.join(", "))
        })?,
        None => list.first().ok_or_else(|| anyhow!("No IB devices found"))?,
    };
    dev.open()
        .with_context(|| format!("Couldn't open device {} ({})", dev.name(), dev.socket_addr()))
}

/// The local GID at `index` (`-g`); index 0 when none is given, because
/// RoCE cannot address a peer without one.
pub(crate) fn local_gid(ctx: &Context, port: u8, index: Option<i32>) -> Result<[u8; 16]> {
    let i = index.unwrap_or(0);
    let len = ctx.query_port(port).map_or(0, |p| p.gid_tbl_len);
    let bad = || anyhow!("Could not get local gid for gid index {i} (port {port} has {len})");
    let i = u32::try_from(i).map_err(|_| bad())?;
    match ctx.gid_entry(port, i) {
        Ok(Some(a)) => Ok(uroce::wire::grh::gid_of(a)),
        _ => Err(bad()),
    }
}

/// The IP address a peer's GID stands for.
pub(crate) fn ip_of_gid(gid: [u8; 16]) -> Result<IpAddr> {
    if gid == [0; 16] {
        bail!("the peer sent no GID (it runs without -g); RoCE needs one: pass -g 0 on both sides");
    }
    Ok(AhAttr::from_gid(gid).dst)
}

/// `inet_ntop(AF_INET6, gid)`, as the rdma-core tools print GIDs.
pub(crate) fn gid_str(gid: [u8; 16]) -> String {
    Ipv6Addr::from(gid).to_string()
}

/// The 32 hex digits of a GID on the wire of the pingpong/perftest
/// exchanges: the 16 bytes in order.
pub(crate) fn wire_gid(gid: [u8; 16]) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses [`wire_gid`]'s format.
pub(crate) fn parse_wire_gid(s: &str) -> Result<[u8; 16]> {
    let s = s.trim_end_matches('\0');
    if s.len() != 32 || !s.is_ascii() {
        bail!("bad GID {s:?} in the peer's record");
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| anyhow!("bad GID {s:?} in the peer's record"))?;
    }
    Ok(g)
}

/// `-m` in bytes to an MTU.
pub(crate) fn parse_mtu(bytes: u32) -> Result<Mtu> {
    Mtu::from_bytes(bytes as usize)
        .ok_or_else(|| anyhow!("Invalid MTU {bytes} (256, 512, 1024, 2048 or 4096)"))
}

/// How long the out-of-band connection and each wait may take.
pub(crate) const OOB_TIMEOUT: Duration = Duration::from_secs(5);

/// Listens for the client on `port` (all addresses, as the rdma-core tools).
pub(crate) fn listen(port: u16) -> Result<TcpListener> {
    TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .with_context(|| format!("Couldn't listen to port {port}"))
}

/// Accepts one client and sets the exchange timeouts.
pub(crate) fn accept(l: &TcpListener) -> Result<TcpStream> {
    let (s, _) = l.accept().context("accept")?;
    s.set_read_timeout(Some(OOB_TIMEOUT))?;
    s.set_write_timeout(Some(OOB_TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Connects to the server, retrying briefly (it may be starting), and
/// fails with one clear line when nobody listens.
pub(crate) fn connect(host: &str, port: u16) -> Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("Couldn't resolve {host}"))?
        .collect();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(1)) {
                Ok(s) => {
                    s.set_read_timeout(Some(OOB_TIMEOUT))?;
                    s.set_write_timeout(Some(OOB_TIMEOUT))?;
                    s.set_nodelay(true)?;
                    return Ok(s);
                }
                Err(e) => last = Some(e),
            }
        }
        if Instant::now() >= deadline {
            let e = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
            bail!("Couldn't connect to {host}:{port}: {e} (is the server side running?)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads exactly `buf.len()` bytes of the peer's record.
pub(crate) fn read_record(s: &mut TcpStream, buf: &mut [u8]) -> Result<()> {
    s.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            anyhow!(
                "the peer closed the connection during the exchange (mismatched tool or options?)"
            )
        } else {
            anyhow!("Couldn't read remote address: {e}")
        }
    })
}

/// Writes a record.
pub(crate) fn write_record(s: &mut TcpStream, buf: &[u8]) -> Result<()> {
    s.write_all(buf).context("Couldn't send local address")
}

/// Waits for completions by busy polling or through a completion channel
/// (`-e`), failing when none arrives within the timeout.
pub(crate) struct Waiter<'a> {
    cq: &'a Cq,
    channel: Option<&'a CompChannel>,
    timeout: Duration,
    events: u32,
}

impl<'a> Waiter<'a> {
    pub(crate) fn new(
        cq: &'a Cq,
        channel: Option<&'a CompChannel>,
        timeout: Duration,
    ) -> Result<Self> {
        if channel.is_some() {
            cq.req_notify(false).context("Couldn't request CQ notification")?;
        }
        Ok(Self { cq, channel, timeout, events: 0 })
    }

    /// Fills `out` with at least one completion; completions with an error
    /// status are an error naming it, as the rdma-core tools print.
    pub(crate) fn wait(&mut self, out: &mut [Completion]) -> Result<usize> {
        let start = Instant::now();
        loop {
            if let Some(ch) = self.channel {
                // Poll first: completions may have come before the arming.
                let n = self.cq.poll(out)?;
                if n > 0 {
                    return check(&out[..n]).map(|()| n);
                }
                let left = self.timeout.saturating_sub(start.elapsed());
                match ch.get_event_timeout(left).context("Failed to get cq_event")? {
                    Some(_) => {
                        self.events += 1;
                        self.cq.ack_events(1);
                        self.cq.req_notify(false).context("Couldn't request CQ notification")?;
                    }
                    None => return Err(timeout_error(self.timeout)),
                }
            } else {
                let n = self.cq.poll(out)?;
                if n > 0 {
                    return check(&out[..n]).map(|()| n);
                }
                if start.elapsed() > self.timeout {
                    return Err(timeout_error(self.timeout));
                }
            }
        }
    }

    /// CQ events taken (for `-e`).
    pub(crate) fn events(&self) -> u32 {
        self.events
    }
}

fn timeout_error(t: Duration) -> anyhow::Error {
    anyhow!("no completion within {:.0?}: the peer stopped or packets are not getting through", t)
}

fn check(wcs: &[Completion]) -> Result<()> {
    for wc in wcs {
        if wc.status != WcStatus::Success {
            bail!(
                "Failed status {} ({}) for wr_id {}",
                wc.status.as_str(),
                wc.status as u32,
                wc.wr_id
            );
        }
    }
    Ok(())
}

/// An empty completion slot array.
pub(crate) fn wc_array<const N: usize>() -> [Completion; N] {
    [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); N]
}

/// A byte count with an optional K or M suffix (×1024, ×1048576), as
/// perftest's `-s` takes it.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mul) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1024),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let v: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    v.checked_mul(mul).ok_or_else(|| format!("size {s} too large"))
}

/// A 24-bit starting PSN (rdma-core's tools draw theirs with `lrand48`;
/// any value does).
pub(crate) fn random_psn(salt: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (t ^ salt.wrapping_mul(2_654_435_761) ^ std::process::id().rotate_left(13)) & 0xff_ffff
}

/// The attributes rdma-core's examples and perftest give on RESET→RTR of
/// an RC QP.
pub(crate) fn rc_rtr_mask() -> uroce::AttrMask {
    use uroce::AttrMask as M;
    M::STATE
        | M::AV
        | M::PATH_MTU
        | M::DEST_QPN
        | M::RQ_PSN
        | M::MAX_DEST_RD_ATOMIC
        | M::MIN_RNR_TIMER
}

/// The attributes of RTR→RTS for an RC QP.
pub(crate) fn rc_rts_mask() -> uroce::AttrMask {
    use uroce::AttrMask as M;
    M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
}

/// Completions polled while waiting for another kind, kept for later: a
/// receive may complete before the ACK of one's own SEND arrives, and
/// waiting for one must not lose the other.
#[derive(Default)]
pub(crate) struct Stash(std::collections::VecDeque<Completion>);

impl Stash {
    /// The next completion `want` accepts, stashed ones first. A completion
    /// with an error status is returned as soon as it is polled, whatever
    /// `want` says. Between empty polls `keep_waiting` decides whether to
    /// go on (`Ok(false)`: give up with `None`).
    pub(crate) fn next(
        &mut self,
        cq: &Cq,
        want: impl Fn(&Completion) -> bool,
        mut keep_waiting: impl FnMut() -> Result<bool>,
    ) -> Result<Option<Completion>> {
        if let Some(i) = self.0.iter().position(&want) {
            return Ok(self.0.remove(i));
        }
        let mut wc = wc_array::<8>();
        loop {
            let n = cq.poll(&mut wc)?;
            let mut found = None;
            for w in &wc[..n] {
                if w.status != WcStatus::Success {
                    return Ok(Some(*w));
                }
                if found.is_none() && want(w) {
                    found = Some(*w);
                } else {
                    self.0.push_back(*w);
                }
            }
            if found.is_some() {
                return Ok(found);
            }
            if n == 0 && !keep_waiting()? {
                return Ok(None);
            }
        }
    }
}

/// A helper process (a peer's server, the UDP echo) killed and reaped when
/// dropped.
pub(crate) struct KillOnDrop(pub(crate) std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
