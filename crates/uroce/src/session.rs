//! The common case in a few calls: a [`Session`] is a reliable connection
//! made through the RDMA connection manager (the peer named by address and
//! port, as a TCP socket's), with registered regions to hand the peer as a
//! [`RemoteRegion`] and operations that wait for their own completion:
//! WRITE, READ, SEND/receive, FETCH_ADD, COMPARE_SWAP. Each has an
//! awaitable form under the `tokio` feature (`write_async`, ...).
//!
//! Built on the public verbs API alone ([`Context`], [`Pd`], [`Qp`],
//! [`Cq`], [`crate::cm`]); its code shows what a program using the verbs
//! directly does. Operations on one session run one at a time (`&mut
//! self`); open more sessions for more at once.
//!
//! ```
//! use uroce::session::{RemoteRegion, Session, SessionListener};
//! use uroce::{Device, DeviceConfig};
//! # fn main() -> uroce::Result<()> {
//! # let port = 20000 + (std::process::id() % 20000) as u16 + 1;
//! let open = |addr: &str| {
//!     let cfg = DeviceConfig { name: "uroce0".into(), addr: addr.parse().unwrap(), port };
//!     Device::from_config(cfg).open()
//! };
//! let (server_ctx, client_ctx) = (open("127.0.0.2")?, open("127.0.0.1")?);
//! let listener = SessionListener::bind(&server_ctx, 7500)?;
//! let server = std::thread::spawn(move || -> uroce::Result<Vec<u8>> {
//!     let mut s = listener.accept()?;
//!     let region = s.alloc(64)?;
//!     // Hand the region over; the client says when it has written.
//!     s.send(&RemoteRegion::of(&region).to_bytes())?;
//!     s.recv(&mut [0u8; 8])?;
//!     Ok(region.to_vec())
//! });
//! let mut c = Session::connect(&client_ctx, "127.0.0.2".parse().unwrap(), 7500)?;
//! let mut buf = [0u8; RemoteRegion::ENCODED_LEN];
//! c.recv(&mut buf)?;
//! let remote = RemoteRegion::from_bytes(&buf)?;
//! let local = c.alloc(64)?;
//! local.write(0, b"written remotely")?;
//! c.write(&local, 0, 16, &remote, 0)?;
//! c.send(b"done")?;
//! assert_eq!(&server.join().unwrap()?[..16], b"written remotely");
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use crate::cm::{CmConnection, CmListener};
use crate::{
    Access, CompChannel, Completion, Context, Cq, Error, Mr, Pd, Qp, QpCaps, QpInitAttr, QpType,
    RecvWr, Result, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};

/// Largest message [`Session::send`] takes and [`Session::recv`] returns.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Receives kept posted, so that a peer's SEND finds one waiting.
const RECV_SLOTS: usize = 4;
/// The rights of a session's regions and QP.
const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);
/// Empty polls before a wait sleeps on the completion channel.
const SPINS: u32 = 20_000;
/// How long connection setup may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// `wr_id`s of the receive slots (sends and one-sided operations count up
/// from 1, far below).
const RECV_BASE: u64 = 1 << 62;

/// What a peer needs to reach a region: its address, length and remote
/// key. Its 20-byte encoding ([`RemoteRegion::to_bytes`]) is what goes
/// over the wire (private data, a SEND, any side channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// The region's first address, as the peer names it.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The remote key.
    pub rkey: u32,
}

impl RemoteRegion {
    /// The encoding's length.
    pub const ENCODED_LEN: usize = 20;

    /// The region `mr` as a peer reaches it.
    pub fn of(mr: &Mr) -> Self {
        Self { addr: mr.addr(), len: mr.len() as u64, rkey: mr.rkey() }
    }

    /// Big-endian address, length, key.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut b = [0u8; Self::ENCODED_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..].copy_from_slice(&self.rkey.to_be_bytes());
        b
    }

    /// Decodes [`RemoteRegion::to_bytes`]'s form (extra bytes ignored).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for fewer than 20 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let b: &[u8; Self::ENCODED_LEN] = b
            .get(..Self::ENCODED_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(Error::InvalidArgument("a remote region is 20 bytes"))?;
        let word = |r: std::ops::Range<usize>| -> [u8; 8] { b[r].try_into().unwrap_or([0; 8]) };
        Ok(Self {
            addr: u64::from_be_bytes(word(0..8)),
            len: u64::from_be_bytes(word(8..16)),
            rkey: u32::from_be_bytes([b[16], b[17], b[18], b[19]]),
        })
    }

    /// The address `offset` bytes in, checked against the length for an
    /// access of `len` bytes.
    fn at(&self, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.addr + offset),
            _ => Err(Error::OutOfBounds),
        }
    }
}

/// The SGE for `len` bytes of `local` at `offset`.
fn local_sge(local: &Mr, offset: usize, len: usize) -> Result<Sge> {
    local.sge(offset, u32::try_from(len).map_err(|_| Error::OutOfBounds)?)
}

/// Listens for sessions on a port ([`SessionListener::bind`]).
#[derive(Debug)]
pub struct SessionListener {
    ctx: Context,
    listener: CmListener,
}

impl SessionListener {
    /// Listens on `port` of `ctx`'s device (the RDMA CM's TCP port space).
    ///
    /// # Errors
    /// As [`Context::cm_listen`].
    pub fn bind(ctx: &Context, port: u16) -> Result<Self> {
        Ok(Self { ctx: ctx.clone(), listener: ctx.cm_listen(port)? })
    }

    /// Waits for the next peer and returns the session with it.
    ///
    /// # Errors
    /// As [`crate::cm::CmListener::accept`], or a verbs error setting up.
    pub fn accept(&self) -> Result<Session> {
        let mut s = Session::unconnected(&self.ctx)?;
        s.conn = Some(self.listener.accept(&s.qp, &[], CONNECT_TIMEOUT)?);
        s.post_receives()?;
        Ok(s)
    }
}

/// A connection and what it needs: a PD, a CQ on a completion channel, an
/// RC QP, and buffers for messages.
pub struct Session {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    channel: CompChannel,
    qp: Qp,
    conn: Option<CmConnection>,
    /// Messages: `RECV_SLOTS` receive slots, then the send buffer.
    msgs: Mr,
    /// Completions of receives that came while another operation waited.
    arrived: VecDeque<Completion>,
    next_id: u64,
    #[cfg(feature = "tokio")]
    async_cq: Option<crate::AsyncCq>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session(qp {:#x})", self.qp.qpn())
    }
}

impl Session {
    /// Connects to whoever listens on `port` at `peer` (a
    /// [`SessionListener`], or any RDMA CM server whose QP takes SENDs).
    ///
    /// # Errors
    /// As [`Context::cm_connect`] (refused, timed out), or a verbs error.
    pub fn connect(ctx: &Context, peer: IpAddr, port: u16) -> Result<Self> {
        let mut s = Self::unconnected(ctx)?;
        // Receives go up before the connection exists for the peer.
        s.conn = Some(ctx.cm_connect(&s.qp, peer, port, &[], CONNECT_TIMEOUT)?);
        s.post_receives()?;
        Ok(s)
    }

    fn unconnected(ctx: &Context) -> Result<Self> {
        let pd = ctx.alloc_pd()?;
        let channel = ctx.create_comp_channel()?;
        let cq = ctx.create_cq_with(64, Some(&channel))?;
        let cap = QpCaps {
            max_send_wr: 16,
            max_recv_wr: RECV_SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let attr = QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        };
        let qp = pd.create_qp(&attr)?;
        let msgs = pd.alloc_mr((RECV_SLOTS + 1) * MAX_MESSAGE, Access::LOCAL_WRITE)?;
        Ok(Self {
            ctx: ctx.clone(),
            pd,
            cq,
            channel,
            qp,
            conn: None,
            msgs,
            arrived: VecDeque::new(),
            next_id: 1,
            #[cfg(feature = "tokio")]
            async_cq: None,
        })
    }

    fn post_receives(&self) -> Result<()> {
        (0..RECV_SLOTS).try_for_each(|k| self.post_receive(k))
    }

    fn post_receive(&self, slot: usize) -> Result<()> {
        let sge = [self.msgs.sge(slot * MAX_MESSAGE, MAX_MESSAGE as u32)?];
        self.qp.post_recv(&[RecvWr { wr_id: RECV_BASE + slot as u64, sgl: &sge }])
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The peer's address.
    pub fn peer(&self) -> Option<IpAddr> {
        self.conn.as_ref().map(CmConnection::peer)
    }

    /// A new region of `len` zeroed bytes the peer may read, write and run
    /// atomics on once given its [`RemoteRegion::of`].
    ///
    /// # Errors
    /// As [`Pd::alloc_mr`].
    pub fn alloc(&self, len: usize) -> Result<Mr> {
        self.pd.alloc_mr(len, ALL)
    }

    // ---- what the operations post, and what their completions mean ----

    fn next_wr_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn rdma_wr<'a>(
        opcode: WrOpcode,
        wr_id: u64,
        sgl: &'a [Sge],
        remote: &RemoteRegion,
        remote_offset: u64,
    ) -> Result<SendWr<'a>> {
        let len = sgl.iter().map(|s| u64::from(s.length)).sum();
        let remote_addr = remote.at(remote_offset, len)?;
        Ok(SendWr { wr_id, opcode, sgl, remote_addr, rkey: remote.rkey, ..SendWr::default() })
    }

    /// The outcome of one operation's completion.
    fn outcome(c: &Completion) -> Result<()> {
        if c.status == WcStatus::Success { Ok(()) } else { Err(Error::Completion(c.status)) }
    }

    fn message_from(&mut self, c: &Completion, out: &mut [u8]) -> Result<usize> {
        let slot = (c.wr_id - RECV_BASE) as usize;
        Self::outcome(c)?;
        let n = c.byte_len as usize;
        if n > out.len() {
            self.post_receive(slot)?;
            return Err(Error::InvalidArgument("the message is longer than the buffer"));
        }
        self.msgs.read(slot * MAX_MESSAGE, &mut out[..n])?;
        self.post_receive(slot)?;
        Ok(n)
    }

    fn stage_message(&mut self, data: &[u8]) -> Result<Sge> {
        if data.len() > MAX_MESSAGE {
            return Err(Error::InvalidArgument("a message is at most 64 KiB"));
        }
        self.msgs.write(RECV_SLOTS * MAX_MESSAGE, data)?;
        self.msgs.sge(RECV_SLOTS * MAX_MESSAGE, data.len() as u32)
    }

    // ---- blocking ----

    /// Polls the CQ into `wc`: busily for a while (the common case is a
    /// completion within microseconds), then asleep on the channel.
    fn poll_some(&mut self, wc: &mut [Completion]) -> Result<usize> {
        for _ in 0..SPINS {
            let n = self.cq.poll(wc)?;
            if n > 0 {
                return Ok(n);
            }
            std::hint::spin_loop();
        }
        loop {
            // Armed before the last look, so a completion in between
            // raises the event instead of being missed.
            self.cq.req_notify(false)?;
            let n = self.cq.poll(wc)?;
            if n > 0 {
                return Ok(n);
            }
            if self
                .channel
                .get_event_timeout(Duration::from_millis(100))
                .map_err(Error::Io)?
                .is_some()
            {
                self.cq.ack_events(1);
            }
        }
    }

    /// Posts `wr` and waits for its completion; receives that complete
    /// meanwhile are kept for [`Session::recv`].
    fn run(&mut self, wr: &SendWr<'_>) -> Result<Completion> {
        self.qp.post_send(std::slice::from_ref(wr))?;
        let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 8];
        loop {
            let n = self.poll_some(&mut wc)?;
            let mut mine = None;
            for c in &wc[..n] {
                if c.wr_id == wr.wr_id && !c.is_recv {
                    mine = Some(*c);
                } else if c.is_recv {
                    self.arrived.push_back(*c);
                }
            }
            if let Some(c) = mine {
                return Ok(c);
            }
        }
    }

    /// A WRITE or READ between `local` and `remote`, waited for.
    fn one_sided(
        &mut self,
        opcode: WrOpcode,
        local: &Mr,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
    ) -> Result<()> {
        let sge = [local_sge(local, offset, len)?];
        let id = self.next_wr_id();
        let wr = Self::rdma_wr(opcode, id, &sge, remote, remote_offset)?;
        Self::outcome(&self.run(&wr)?)
    }

    /// WRITEs `len` bytes of `local` from `offset` to `remote` at
    /// `remote_offset`; returns once the peer has them.
    ///
    /// # Errors
    /// Bounds ([`Error::OutOfBounds`]), a post error, or the completion's
    /// status ([`Error::Completion`]: e.g. a key the peer revoked).
    pub fn write(
        &mut self,
        local: &Mr,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
    ) -> Result<()> {
        self.one_sided(WrOpcode::RdmaWrite, local, offset, len, remote, remote_offset)
    }

    /// READs `len` bytes of `remote` at `remote_offset` into `local` at
    /// `offset`.
    ///
    /// # Errors
    /// As [`Session::write`].
    pub fn read(
        &mut self,
        local: &Mr,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
    ) -> Result<()> {
        self.one_sided(WrOpcode::RdmaRead, local, offset, len, remote, remote_offset)
    }

    /// Atomically adds `add` to the 8 bytes of `remote` at `remote_offset`
    /// (8-aligned); returns the value before.
    ///
    /// # Errors
    /// As [`Session::write`].
    pub fn fetch_add(
        &mut self,
        remote: &RemoteRegion,
        remote_offset: u64,
        add: u64,
    ) -> Result<u64> {
        self.atomic(WrOpcode::AtomicFetchAndAdd, remote, remote_offset, add, 0)
    }

    /// Atomically replaces the 8 bytes of `remote` at `remote_offset` with
    /// `swap` if they equal `compare`; returns the value before.
    ///
    /// # Errors
    /// As [`Session::write`].
    pub fn compare_swap(
        &mut self,
        remote: &RemoteRegion,
        remote_offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        self.atomic(WrOpcode::AtomicCmpAndSwp, remote, remote_offset, compare, swap)
    }

    fn atomic(
        &mut self,
        opcode: WrOpcode,
        remote: &RemoteRegion,
        remote_offset: u64,
        compare_add: u64,
        swap: u64,
    ) -> Result<u64> {
        // The old value lands in the first 8 bytes of the send buffer.
        let sge = [self.msgs.sge(RECV_SLOTS * MAX_MESSAGE, 8)?];
        let id = self.next_wr_id();
        let wr =
            SendWr { compare_add, swap, ..Self::rdma_wr(opcode, id, &sge, remote, remote_offset)? };
        Self::outcome(&self.run(&wr)?)?;
        let mut old = [0u8; 8];
        self.msgs.read(RECV_SLOTS * MAX_MESSAGE, &mut old)?;
        Ok(u64::from_le_bytes(old))
    }

    /// SENDs `data` (at most [`MAX_MESSAGE`] bytes) to the peer's next
    /// receive; returns once it was taken.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a longer message; as
    /// [`Session::write`].
    pub fn send(&mut self, data: &[u8]) -> Result<()> {
        let sge = [self.stage_message(data)?];
        let wr = SendWr { wr_id: self.next_wr_id(), sgl: &sge, ..SendWr::default() };
        Self::outcome(&self.run(&wr)?)
    }

    /// Waits for the peer's next SEND and copies it into `out`; returns
    /// its length.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `out` is shorter than the message
    /// (which is then lost, as a datagram socket loses it); a receive's
    /// error status ([`Error::Completion`]).
    pub fn recv(&mut self, out: &mut [u8]) -> Result<usize> {
        let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false); 8];
        while self.arrived.is_empty() {
            let n = self.poll_some(&mut wc)?;
            self.arrived.extend(wc[..n].iter().filter(|c| c.is_recv));
        }
        let c = self.arrived.pop_front().expect("one arrived");
        self.message_from(&c, out)
    }

    /// Disconnects (the peer sees its connection end) and waits up to a
    /// second for its answer.
    ///
    /// # Errors
    /// As [`crate::cm::CmConnection::disconnect`].
    pub fn close(mut self) -> Result<()> {
        match self.conn.take() {
            Some(c) => c.disconnect(Duration::from_secs(1)),
            None => Ok(()),
        }
    }
}

#[cfg(feature = "tokio")]
impl Session {
    /// The CQ as futures (made at the first awaited operation, within the
    /// runtime).
    fn async_cq(&mut self) -> Result<&mut crate::AsyncCq> {
        if self.async_cq.is_none() {
            let a =
                crate::AsyncCq::new(self.cq.clone(), self.channel.clone()).map_err(Error::Io)?;
            self.async_cq = Some(a);
        }
        Ok(self.async_cq.as_mut().expect("made above"))
    }

    async fn run_async(&mut self, wr: &SendWr<'_>) -> Result<Completion> {
        self.qp.post_send(std::slice::from_ref(wr))?;
        loop {
            let c = self.async_cq()?.next().await?;
            if c.wr_id == wr.wr_id && !c.is_recv {
                return Ok(c);
            }
            if c.is_recv {
                self.arrived.push_back(c);
            }
        }
    }

    async fn one_sided_async(
        &mut self,
        opcode: WrOpcode,
        local: &Mr,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
    ) -> Result<()> {
        let sge = [local_sge(local, offset, len)?];
        let id = self.next_wr_id();
        let wr = Self::rdma_wr(opcode, id, &sge, remote, remote_offset)?;
        Self::outcome(&self.run_async(&wr).await?)
    }

    /// [`Session::write`], awaited.
    ///
    /// # Errors
    /// As [`Session::write`].
    pub async fn write_async(
        &mut self,
        local: &Mr,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
    ) -> Result<()> {
        self.one_sided_async(WrOpcode::RdmaWrite, local, offset, len, remote, remote_offset).await
    }

    /// [`Session::read`], awaited.
    ///
    /// # Errors
    /// As [`Session::read`].
    pub async fn read_async(
        &mut self,
        local: &Mr,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
    ) -> Result<()> {
        self.one_sided_async(WrOpcode::RdmaRead, local, offset, len, remote, remote_offset).await
    }

    /// [`Session::fetch_add`], awaited.
    ///
    /// # Errors
    /// As [`Session::fetch_add`].
    pub async fn fetch_add_async(
        &mut self,
        remote: &RemoteRegion,
        remote_offset: u64,
        add: u64,
    ) -> Result<u64> {
        let sge = [self.msgs.sge(RECV_SLOTS * MAX_MESSAGE, 8)?];
        let id = self.next_wr_id();
        let wr = SendWr {
            compare_add: add,
            ..Self::rdma_wr(WrOpcode::AtomicFetchAndAdd, id, &sge, remote, remote_offset)?
        };
        Self::outcome(&self.run_async(&wr).await?)?;
        let mut old = [0u8; 8];
        self.msgs.read(RECV_SLOTS * MAX_MESSAGE, &mut old)?;
        Ok(u64::from_le_bytes(old))
    }

    /// [`Session::send`], awaited.
    ///
    /// # Errors
    /// As [`Session::send`].
    pub async fn send_async(&mut self, data: &[u8]) -> Result<()> {
        let sge = [self.stage_message(data)?];
        let wr = SendWr { wr_id: self.next_wr_id(), sgl: &sge, ..SendWr::default() };
        Self::outcome(&self.run_async(&wr).await?)
    }

    /// [`Session::recv`], awaited.
    ///
    /// # Errors
    /// As [`Session::recv`].
    pub async fn recv_async(&mut self, out: &mut [u8]) -> Result<usize> {
        while self.arrived.is_empty() {
            let c = self.async_cq()?.next().await?;
            if c.is_recv {
                self.arrived.push_back(c);
            }
        }
        let c = self.arrived.pop_front().expect("one arrived");
        self.message_from(&c, out)
    }
}
