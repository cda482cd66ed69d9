//! A whole RoCEv2 transport packet: BTH, extension headers, payload, pad and
//! ICRC, i.e. the payload of a UDP datagram to port 4791.

use crate::atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
use crate::small::{Feth, FethRepr, Ieth, ImmDt, Rdeth, XrcEth};
use crate::{
    Aeth, AethRepr, Bth, BthRepr, Deth, DethRepr, Headers, OpcodeInfo, Operation, Reth, RethRepr,
};
use crate::{BTH_LEN, ICRC_LEN, Result, WireError};

/// A checked view over a RoCEv2 packet (the UDP payload).
///
/// [`RocePacket::new_checked`] validates, once, everything that the layout
/// depends on: the BTH is present and of version 0, the opcode is defined,
/// every extension header the opcode calls for is present, the pad fits, and
/// the 4-byte ICRC trails. Accessors then cannot fail. The ICRC itself is
/// verified separately (it covers the IP and UDP headers too): see
/// [`crate::icrc`].
#[derive(Debug, Clone, Copy)]
pub struct RocePacket<T: AsRef<[u8]>> {
    buffer: T,
    info: &'static OpcodeInfo,
}

impl<T: AsRef<[u8]>> RocePacket<T> {
    /// Validates and wraps a packet.
    ///
    /// # Errors
    /// - [`WireError::Truncated`]: shorter than BTH + ICRC, or than the
    ///   opcode's headers + ICRC;
    /// - [`WireError::BadVersion`]: BTH TVer ≠ 0;
    /// - [`WireError::ReservedOpcode`]: opcode not in the table;
    /// - [`WireError::BadPad`]: pad count larger than the space before the
    ///   ICRC, or non-zero on an opcode without payload;
    /// - [`WireError::BadLength`]: bytes between headers and ICRC on an opcode
    ///   that carries no payload, or an ATOMIC WRITE payload that is not 8 B.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < BTH_LEN + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        let bth = Bth::new_unchecked(b);
        if bth.tver() != crate::bth::BTH_TVER {
            return Err(WireError::BadVersion);
        }
        let info = bth.opcode().info().ok_or(WireError::ReservedOpcode)?;
        if b.len() < info.header_len + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        let area = b.len() - info.header_len - ICRC_LEN;
        let pad = usize::from(bth.pad());
        if pad > area || (!info.has_payload && pad != 0) {
            return Err(WireError::BadPad);
        }
        if !info.has_payload && area != 0 {
            return Err(WireError::BadLength);
        }
        if info.operation == Operation::AtomicWrite && area - pad != 8 {
            return Err(WireError::BadLength);
        }
        Ok(Self { buffer, info })
    }

    /// The opcode's table row.
    #[inline]
    pub fn info(&self) -> &'static OpcodeInfo {
        self.info
    }

    /// The whole packet, ICRC included.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The BTH.
    #[inline]
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(&self.as_bytes()[..BTH_LEN])
    }

    #[inline]
    fn ext(&self, h: Headers, len: usize) -> Option<&[u8]> {
        let off = self.info.headers.offset_of(h)?;
        Some(&self.as_bytes()[off..off + len])
    }

    /// The RDETH, if the opcode has one.
    pub fn rdeth(&self) -> Option<Rdeth<&[u8]>> {
        self.ext(Headers::RDETH, 4).map(Rdeth::new_unchecked)
    }
    /// The DETH, if the opcode has one.
    pub fn deth(&self) -> Option<Deth<&[u8]>> {
        self.ext(Headers::DETH, 8).map(Deth::new_unchecked)
    }
    /// The XRCETH, if the opcode has one.
    pub fn xrceth(&self) -> Option<XrcEth<&[u8]>> {
        self.ext(Headers::XRCETH, 4).map(XrcEth::new_unchecked)
    }
    /// The FETH, if the opcode has one.
    pub fn feth(&self) -> Option<Feth<&[u8]>> {
        self.ext(Headers::FETH, 4).map(Feth::new_unchecked)
    }
    /// The RETH, if the opcode has one.
    pub fn reth(&self) -> Option<Reth<&[u8]>> {
        self.ext(Headers::RETH, 16).map(Reth::new_unchecked)
    }
    /// The AtomicETH, if the opcode has one.
    pub fn atomic_eth(&self) -> Option<AtomicEth<&[u8]>> {
        self.ext(Headers::ATOMIC_ETH, 28).map(AtomicEth::new_unchecked)
    }
    /// The AETH, if the opcode has one.
    pub fn aeth(&self) -> Option<Aeth<&[u8]>> {
        self.ext(Headers::AETH, 4).map(Aeth::new_unchecked)
    }
    /// The AtomicAckETH, if the opcode has one.
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEth<&[u8]>> {
        self.ext(Headers::ATOMIC_ACK_ETH, 8).map(AtomicAckEth::new_unchecked)
    }
    /// The immediate data, if the opcode carries it.
    pub fn immdt(&self) -> Option<ImmDt<&[u8]>> {
        self.ext(Headers::IMMDT, 4).map(ImmDt::new_unchecked)
    }
    /// The IETH, if the opcode has one.
    pub fn ieth(&self) -> Option<Ieth<&[u8]>> {
        self.ext(Headers::IETH, 4).map(Ieth::new_unchecked)
    }

    /// Length of BTH plus extension headers.
    #[inline]
    pub fn header_len(&self) -> usize {
        self.info.header_len
    }

    /// Payload length (pad and ICRC excluded).
    #[inline]
    pub fn payload_len(&self) -> usize {
        self.as_bytes().len() - self.info.header_len - ICRC_LEN - usize::from(self.bth().pad())
    }

    /// The payload.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let start = self.info.header_len;
        &self.as_bytes()[start..start + self.payload_len()]
    }

    /// The pad bytes.
    pub fn pad_bytes(&self) -> &[u8] {
        let b = self.as_bytes();
        let end = b.len() - ICRC_LEN;
        &b[end - usize::from(self.bth().pad())..end]
    }

    /// Everything the ICRC covers after the UDP header: the packet without
    /// its last 4 bytes.
    #[inline]
    pub fn covered(&self) -> &[u8] {
        let b = self.as_bytes();
        &b[..b.len() - ICRC_LEN]
    }

    /// The ICRC as carried on the wire (stored little-endian, as rxe does).
    #[inline]
    pub fn icrc(&self) -> u32 {
        let b = self.as_bytes();
        let n = b.len();
        u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RocePacket<T> {
    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.info.header_len;
        let len = self.payload_len();
        &mut self.buffer.as_mut()[start..start + len]
    }

    /// Stores an ICRC value in the trailing 4 bytes.
    pub fn set_icrc(&mut self, icrc: u32) {
        let b = self.buffer.as_mut();
        let n = b.len();
        b[n - ICRC_LEN..].copy_from_slice(&icrc.to_le_bytes());
    }
}

/// Every field of a RoCEv2 packet's headers, for emission.
///
/// Exactly the extension headers that `bth.opcode` calls for must be `Some`
/// ([`RocePacketRepr::emit_headers`] checks this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RocePacketRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// RDETH: EE context.
    pub rdeth: Option<u32>,
    /// DETH.
    pub deth: Option<DethRepr>,
    /// XRCETH: XRC SRQ number.
    pub xrceth: Option<u32>,
    /// FETH.
    pub feth: Option<FethRepr>,
    /// RETH.
    pub reth: Option<RethRepr>,
    /// AtomicETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH.
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data.
    pub immdt: Option<u32>,
    /// IETH: R_Key to invalidate.
    pub ieth: Option<u32>,
}

impl RocePacketRepr {
    /// Reads every header of a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &RocePacket<T>) -> Self {
        let bth = p.bth();
        Self {
            bth: BthRepr::parse_fields(&bth),
            rdeth: p.rdeth().map(|h| h.eecn()),
            deth: p.deth().map(|h| DethRepr::parse(&h)),
            xrceth: p.xrceth().map(|h| h.xrc_srqn()),
            feth: p
                .feth()
                .map(|h| FethRepr { selectivity: h.selectivity(), placement: h.placement() }),
            reth: p.reth().map(|h| RethRepr::parse(&h)),
            atomic_eth: p.atomic_eth().map(|h| AtomicEthRepr::parse(&h)),
            aeth: p.aeth().map(|h| AethRepr::parse(&h)),
            atomic_ack_eth: p.atomic_ack_eth().map(|h| AtomicAckEthRepr::parse(&h)),
            immdt: p.immdt().map(|h| h.imm()),
            ieth: p.ieth().map(|h| h.rkey()),
        }
    }

    /// The set of extension headers that are `Some`.
    pub fn headers(&self) -> Headers {
        let mut h = Headers::NONE;
        let pairs = [
            (self.rdeth.is_some(), Headers::RDETH),
            (self.deth.is_some(), Headers::DETH),
            (self.xrceth.is_some(), Headers::XRCETH),
            (self.feth.is_some(), Headers::FETH),
            (self.reth.is_some(), Headers::RETH),
            (self.atomic_eth.is_some(), Headers::ATOMIC_ETH),
            (self.aeth.is_some(), Headers::AETH),
            (self.atomic_ack_eth.is_some(), Headers::ATOMIC_ACK_ETH),
            (self.immdt.is_some(), Headers::IMMDT),
            (self.ieth.is_some(), Headers::IETH),
        ];
        for (present, bit) in pairs {
            if present {
                h = h | bit;
            }
        }
        h
    }

    /// BTH plus extension headers, in bytes.
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.headers().len()
    }

    /// Total packet length for a payload of `payload_len` bytes, with the
    /// pad count of `self.bth.pad` and the ICRC.
    pub fn packet_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + usize::from(self.bth.pad & 3) + ICRC_LEN
    }

    /// Writes the BTH and extension headers at the start of `buf`; returns
    /// their length.
    ///
    /// # Errors
    /// [`WireError::ReservedOpcode`] for an undefined opcode,
    /// [`WireError::HeaderMismatch`] when the `Some` headers are not the
    /// opcode's set, [`WireError::BufferTooSmall`] when `buf` cannot hold them.
    pub fn emit_headers(&self, buf: &mut [u8]) -> Result<usize> {
        let info = self.bth.opcode.info().ok_or(WireError::ReservedOpcode)?;
        if info.headers != self.headers() {
            return Err(WireError::HeaderMismatch);
        }
        let len = info.header_len;
        if buf.len() < len {
            return Err(WireError::BufferTooSmall);
        }
        let buf = &mut buf[..len];
        self.bth.emit(&mut Bth::new_unchecked(&mut buf[..BTH_LEN]));
        let h = info.headers;
        let at = |x: Headers| h.offset_of(x).unwrap_or(0);
        if let Some(v) = self.rdeth {
            Rdeth::new_unchecked(&mut buf[at(Headers::RDETH)..]).set_eecn(v);
        }
        if let Some(v) = self.deth {
            v.emit(&mut Deth::new_unchecked(&mut buf[at(Headers::DETH)..]));
        }
        if let Some(v) = self.xrceth {
            XrcEth::new_unchecked(&mut buf[at(Headers::XRCETH)..]).set_xrc_srqn(v);
        }
        if let Some(v) = self.feth {
            Feth::new_unchecked(&mut buf[at(Headers::FETH)..]).set(v.selectivity, v.placement);
        }
        if let Some(v) = self.reth {
            v.emit(&mut Reth::new_unchecked(&mut buf[at(Headers::RETH)..]));
        }
        if let Some(v) = self.atomic_eth {
            v.emit(&mut AtomicEth::new_unchecked(&mut buf[at(Headers::ATOMIC_ETH)..]));
        }
        if let Some(v) = self.aeth {
            v.emit(&mut Aeth::new_unchecked(&mut buf[at(Headers::AETH)..]));
        }
        if let Some(v) = self.atomic_ack_eth {
            v.emit(&mut AtomicAckEth::new_unchecked(&mut buf[at(Headers::ATOMIC_ACK_ETH)..]));
        }
        if let Some(v) = self.immdt {
            ImmDt::new_unchecked(&mut buf[at(Headers::IMMDT)..]).set_imm(v);
        }
        if let Some(v) = self.ieth {
            Ieth::new_unchecked(&mut buf[at(Headers::IETH)..]).set_rkey(v);
        }
        Ok(len)
    }

    /// Writes a whole packet: headers, `payload`, zeroed pad and a zeroed
    /// ICRC (fill it with [`crate::icrc`] once the IP and UDP headers are
    /// known). Returns the packet length.
    ///
    /// # Errors
    /// As [`RocePacketRepr::emit_headers`].
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        let total = self.packet_len(payload.len());
        if buf.len() < total {
            return Err(WireError::BufferTooSmall);
        }
        let hl = self.emit_headers(buf)?;
        buf[hl..hl + payload.len()].copy_from_slice(payload);
        buf[hl + payload.len()..total].fill(0);
        Ok(total)
    }
}
