//! Just enough pcap for uroce: read classic libpcap and pcapng captures
//! (what tcpdump, tshark and dumpcap write), find the IP packet inside each
//! frame, and write classic pcap files (for `uroce` simulations and tests).

#![forbid(unsafe_code)]

use std::fmt;
use std::io::{self, Write};

use uroce_wire::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, EthernetFrame};

/// Link-layer header types (tcpdump.org/linktypes.html) this crate unwraps.
pub mod linktype {
    /// BSD loopback: 4-byte address family in host order.
    pub const NULL: u32 = 0;
    /// Ethernet II.
    pub const ETHERNET: u32 = 1;
    /// Raw IP (v4 or v6 by the version nibble).
    pub const RAW: u32 = 101;
    /// OpenBSD loopback: 4-byte address family, network order.
    pub const LOOP: u32 = 108;
    /// Linux "cooked" capture v1 (`tcpdump -i any`).
    pub const LINUX_SLL: u32 = 113;
    /// Raw IPv4.
    pub const IPV4: u32 = 228;
    /// Raw IPv6.
    pub const IPV6: u32 = 229;
    /// Linux "cooked" capture v2.
    pub const LINUX_SLL2: u32 = 276;
}

/// Why a capture could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PcapError {
    /// Not a pcap or pcapng file.
    BadMagic,
    /// The file ends inside a header or record.
    Truncated,
    /// A pcapng block is malformed (length, or a packet for an interface
    /// that was never described).
    BadBlock,
}

impl fmt::Display for PcapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BadMagic => "not a pcap or pcapng capture",
            Self::Truncated => "capture file is truncated",
            Self::BadBlock => "malformed pcapng block",
        })
    }
}

impl std::error::Error for PcapError {}

/// One captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Capture time in nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// Link-layer type of `data`.
    pub link_type: u32,
    /// The captured bytes.
    pub data: &'a [u8],
    /// The frame's length on the wire (≥ `data.len()` when snapped).
    pub orig_len: u32,
}

impl<'a> Record<'a> {
    /// The IP packet inside the frame, if the link type is known and the
    /// frame carries IPv4 or IPv6.
    pub fn ip_packet(&self) -> Option<&'a [u8]> {
        network_layer(self.link_type, self.data)
    }
}

/// The IPv4/IPv6 packet inside a frame of the given link type.
pub fn network_layer(link_type: u32, data: &[u8]) -> Option<&[u8]> {
    let is_ip = |p: u16| p == ETHERTYPE_IPV4 || p == ETHERTYPE_IPV6;
    match link_type {
        linktype::ETHERNET => {
            let f = EthernetFrame::new_checked(data).ok()?;
            is_ip(f.ethertype()).then(|| &data[f.header_len()..])
        }
        linktype::RAW | linktype::IPV4 | linktype::IPV6 => Some(data),
        linktype::LINUX_SLL => {
            let p = u16::from_be_bytes([*data.get(14)?, *data.get(15)?]);
            is_ip(p).then(|| &data[16..])
        }
        linktype::LINUX_SLL2 => {
            let p = u16::from_be_bytes([*data.first()?, *data.get(1)?]);
            (is_ip(p) && data.len() >= 20).then(|| &data[20..])
        }
        linktype::NULL | linktype::LOOP => (data.len() > 4).then(|| &data[4..]),
        _ => None,
    }
}

#[derive(Clone, Copy)]
enum Endian {
    Little,
    Big,
}

impl Endian {
    fn u16(self, b: &[u8], at: usize) -> Option<u16> {
        let x = [*b.get(at)?, *b.get(at + 1)?];
        Some(match self {
            Self::Little => u16::from_le_bytes(x),
            Self::Big => u16::from_be_bytes(x),
        })
    }
    fn u32(self, b: &[u8], at: usize) -> Option<u32> {
        let x: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(match self {
            Self::Little => u32::from_le_bytes(x),
            Self::Big => u32::from_be_bytes(x),
        })
    }
}

/// A pcapng interface: its link type and timestamp unit.
#[derive(Clone, Copy)]
struct Interface {
    link_type: u32,
    /// Nanoseconds per timestamp tick, or ticks per nanosecond if negative
    /// resolution finer than 1 ns (stored as a divisor).
    tick: TsUnit,
}

#[derive(Clone, Copy)]
enum TsUnit {
    /// Each tick is this many nanoseconds.
    Nanos(u64),
    /// This many ticks make a nanosecond.
    PerNano(u64),
}

impl TsUnit {
    fn from_tsresol(r: u8) -> Self {
        let exp = u32::from(r & 0x7f);
        if r & 0x80 != 0 {
            // Power of two: 2^-exp seconds. Approximate in nanoseconds.
            let per_sec = 1u64.checked_shl(exp).unwrap_or(u64::MAX);
            if per_sec <= 1_000_000_000 {
                Self::Nanos(1_000_000_000 / per_sec)
            } else {
                Self::PerNano(per_sec / 1_000_000_000)
            }
        } else if exp <= 9 {
            Self::Nanos(10u64.pow(9 - exp))
        } else {
            Self::PerNano(10u64.saturating_pow(exp - 9))
        }
    }
    fn to_ns(self, ticks: u64) -> u64 {
        match self {
            Self::Nanos(n) => ticks.saturating_mul(n),
            Self::PerNano(d) => ticks / d.max(1),
        }
    }
}

enum Format {
    Classic { endian: Endian, nanos: bool, link_type: u32 },
    Ng { endian: Endian, interfaces: Vec<Interface> },
}

/// Iterates over the frames of a capture held in memory.
pub struct Reader<'a> {
    data: &'a [u8],
    at: usize,
    format: Format,
    failed: bool,
}

impl<'a> Reader<'a> {
    /// Recognises a classic pcap (either byte order, µs or ns timestamps)
    /// or a pcapng file.
    ///
    /// # Errors
    /// [`PcapError::BadMagic`] or [`PcapError::Truncated`].
    pub fn new(data: &'a [u8]) -> Result<Self, PcapError> {
        let magic = data.get(..4).ok_or(PcapError::Truncated)?;
        let classic = match magic {
            [0xd4, 0xc3, 0xb2, 0xa1] => Some((Endian::Little, false)),
            [0xa1, 0xb2, 0xc3, 0xd4] => Some((Endian::Big, false)),
            [0x4d, 0x3c, 0xb2, 0xa1] => Some((Endian::Little, true)),
            [0xa1, 0xb2, 0x3c, 0x4d] => Some((Endian::Big, true)),
            _ => None,
        };
        if let Some((endian, nanos)) = classic {
            let link_type = endian.u32(data, 20).ok_or(PcapError::Truncated)? & 0x0fff_ffff;
            return Ok(Self {
                data,
                at: 24,
                format: Format::Classic { endian, nanos, link_type },
                failed: false,
            });
        }
        if magic == [0x0a, 0x0d, 0x0d, 0x0a] {
            let endian = match data.get(8..12).ok_or(PcapError::Truncated)? {
                [0x4d, 0x3c, 0x2b, 0x1a] => Endian::Little,
                [0x1a, 0x2b, 0x3c, 0x4d] => Endian::Big,
                _ => return Err(PcapError::BadMagic),
            };
            return Ok(Self {
                data,
                at: 0,
                format: Format::Ng { endian, interfaces: Vec::new() },
                failed: false,
            });
        }
        Err(PcapError::BadMagic)
    }

    fn next_classic(
        &mut self,
        endian: Endian,
        nanos: bool,
        link_type: u32,
    ) -> Option<Result<Record<'a>, PcapError>> {
        let d = self.data;
        if self.at == d.len() {
            return None;
        }
        let h = self.at;
        let (Some(sec), Some(frac), Some(incl), Some(orig)) =
            (endian.u32(d, h), endian.u32(d, h + 4), endian.u32(d, h + 8), endian.u32(d, h + 12))
        else {
            return Some(Err(PcapError::Truncated));
        };
        let start = h + 16;
        let Some(bytes) = d.get(start..start + incl as usize) else {
            return Some(Err(PcapError::Truncated));
        };
        self.at = start + incl as usize;
        let frac_ns = if nanos { u64::from(frac) } else { u64::from(frac) * 1000 };
        Some(Ok(Record {
            ts_ns: u64::from(sec) * 1_000_000_000 + frac_ns,
            link_type,
            data: bytes,
            orig_len: orig,
        }))
    }

    fn next_ng(&mut self) -> Option<Result<Record<'a>, PcapError>> {
        let d = self.data;
        loop {
            if self.at == d.len() {
                return None;
            }
            let Format::Ng { endian, interfaces } = &mut self.format else { return None };
            let h = self.at;
            // A section header may switch byte order.
            if d.get(h..h + 4) == Some(&[0x0a, 0x0d, 0x0d, 0x0a]) {
                *endian = match d.get(h + 8..h + 12) {
                    Some([0x4d, 0x3c, 0x2b, 0x1a]) => Endian::Little,
                    Some([0x1a, 0x2b, 0x3c, 0x4d]) => Endian::Big,
                    _ => return Some(Err(PcapError::BadBlock)),
                };
                interfaces.clear();
            }
            let e = *endian;
            let (Some(kind), Some(len)) = (e.u32(d, h), e.u32(d, h + 4)) else {
                return Some(Err(PcapError::Truncated));
            };
            let len = len as usize;
            if len < 12 || !len.is_multiple_of(4) {
                return Some(Err(PcapError::BadBlock));
            }
            let Some(block) = d.get(h..h + len) else { return Some(Err(PcapError::Truncated)) };
            self.at = h + len;
            let body = &block[8..len - 4];
            match kind {
                // Interface description block.
                1 => {
                    let Some(lt) = e.u16(body, 0) else { return Some(Err(PcapError::BadBlock)) };
                    let mut tick = TsUnit::Nanos(1000);
                    let mut o = 8;
                    while let (Some(code), Some(olen)) = (e.u16(body, o), e.u16(body, o + 2)) {
                        if code == 0 {
                            break;
                        }
                        if let (9, Some(&r)) = (code, body.get(o + 4)) {
                            tick = TsUnit::from_tsresol(r);
                        }
                        o += 4 + usize::from(olen).div_ceil(4) * 4;
                    }
                    interfaces.push(Interface { link_type: u32::from(lt), tick });
                }
                // Enhanced packet block.
                6 => {
                    let (Some(ifid), Some(hi), Some(lo), Some(cap), Some(orig)) = (
                        e.u32(body, 0),
                        e.u32(body, 4),
                        e.u32(body, 8),
                        e.u32(body, 12),
                        e.u32(body, 16),
                    ) else {
                        return Some(Err(PcapError::BadBlock));
                    };
                    let Some(itf) = interfaces.get(ifid as usize) else {
                        return Some(Err(PcapError::BadBlock));
                    };
                    let Some(bytes) = body.get(20..20 + cap as usize) else {
                        return Some(Err(PcapError::BadBlock));
                    };
                    let ticks = (u64::from(hi) << 32) | u64::from(lo);
                    return Some(Ok(Record {
                        ts_ns: itf.tick.to_ns(ticks),
                        link_type: itf.link_type,
                        data: bytes,
                        orig_len: orig,
                    }));
                }
                // Simple packet block: interface 0, no timestamp.
                3 => {
                    let Some(orig) = e.u32(body, 0) else { return Some(Err(PcapError::BadBlock)) };
                    let Some(itf) = interfaces.first() else {
                        return Some(Err(PcapError::BadBlock));
                    };
                    let cap = (orig as usize).min(body.len() - 4);
                    return Some(Ok(Record {
                        ts_ns: 0,
                        link_type: itf.link_type,
                        data: &body[4..4 + cap],
                        orig_len: orig,
                    }));
                }
                _ => {}
            }
        }
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Record<'a>, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let r = match self.format {
            Format::Classic { endian, nanos, link_type } => {
                self.next_classic(endian, nanos, link_type)
            }
            Format::Ng { .. } => self.next_ng(),
        };
        if matches!(r, Some(Err(_))) {
            self.failed = true;
        }
        r
    }
}

/// Writes a classic pcap file with nanosecond timestamps.
pub struct Writer<W: Write> {
    out: W,
}

impl<W: Write> Writer<W> {
    /// Writes the file header.
    ///
    /// # Errors
    /// I/O errors from `out`.
    pub fn new(mut out: W, link_type: u32) -> io::Result<Self> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&0xa1b2_3c4du32.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&262_144u32.to_le_bytes());
        h[20..24].copy_from_slice(&link_type.to_le_bytes());
        out.write_all(&h)?;
        Ok(Self { out })
    }

    /// Appends one frame.
    ///
    /// # Errors
    /// I/O errors from `out`; `InvalidInput` for a frame over 4 GiB.
    pub fn write(&mut self, ts_ns: u64, frame: &[u8]) -> io::Result<()> {
        let len =
            u32::try_from(frame.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let sec = u32::try_from(ts_ns / 1_000_000_000).unwrap_or(u32::MAX);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&sec.to_le_bytes());
        h[4..8].copy_from_slice(&((ts_ns % 1_000_000_000) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(frame)
    }

    /// Flushes and returns the output.
    ///
    /// # Errors
    /// I/O errors from flushing.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read() {
        let mut w = Writer::new(Vec::new(), linktype::RAW).unwrap();
        w.write(1_500_000_000_123_456_789, &[0x45, 1, 2]).unwrap();
        w.write(7, &[0x60]).unwrap();
        let buf = w.finish().unwrap();
        let recs: Vec<_> = Reader::new(&buf).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].ts_ns, 1_500_000_000_123_456_789);
        assert_eq!(recs[0].data, &[0x45, 1, 2]);
        assert_eq!(recs[1].ip_packet(), Some(&[0x60][..]));
    }

    #[test]
    fn pcapng_minimal() {
        // SHB (28 B), IDB with tsresol=9 (ns), one EPB carrying 4 bytes.
        let mut f = Vec::new();
        let block = |f: &mut Vec<u8>, kind: u32, body: &[u8]| {
            let len = (12 + body.len()) as u32;
            f.extend_from_slice(&kind.to_le_bytes());
            f.extend_from_slice(&len.to_le_bytes());
            f.extend_from_slice(body);
            f.extend_from_slice(&len.to_le_bytes());
        };
        let mut shb = Vec::new();
        shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
        shb.extend_from_slice(&[1, 0, 0, 0]);
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        block(&mut f, 0x0a0d_0d0a, &shb);
        let mut idb = vec![101, 0, 0, 0, 0, 0, 4, 0];
        idb.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
        block(&mut f, 1, &idb);
        let mut epb = Vec::new();
        for v in [0u32, 0, 1000, 4, 4] {
            epb.extend_from_slice(&v.to_le_bytes());
        }
        epb.extend_from_slice(&[0x45, 0, 0, 0]);
        block(&mut f, 6, &epb);
        let recs: Vec<_> = Reader::new(&f).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].ts_ns, 1000);
        assert_eq!(recs[0].link_type, linktype::RAW);
    }

    #[test]
    fn garbage() {
        assert_eq!(Reader::new(b"nope").err(), Some(PcapError::BadMagic));
        let mut r = Reader::new(&[
            0xd4, 0xc3, 0xb2, 0xa1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9,
        ])
        .unwrap();
        assert_eq!(r.next(), Some(Err(PcapError::Truncated)));
        assert_eq!(r.next(), None);
    }
}
