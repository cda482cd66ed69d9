//! Flow steering to raw packet QPs (`ibv_create_flow`, `ibv_destroy_flow`:
//! the header's inline calls reach these through `verbs_context`): an
//! `ibv_flow_attr` and its specs (Ethernet, IPv4, IPv4 extended, IPv6,
//! TCP, UDP) become a `uroce::raw::FlowAttr`. Tunnel, inner and action
//! specs, egress rules and rules on other QP types are EOPNOTSUPP, what
//! rdma-core answers for a device without them. The kernel keeps seeing
//! the frames a rule takes (a packet socket cannot take them from it), as
//! `IBV_FLOW_ATTR_FLAGS_DONT_TRAP` asks.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};

use uroce::raw::{FlowAttr, FlowKind, FlowSpec};

use crate::abi::*;
use crate::ffi::{Kind, guard, is_live, null_errno};
use crate::objects::{from_c, into_c};
use crate::qp::live_qp;

/// An `ibv_flow`.
#[repr(C)]
pub(crate) struct FlowBox {
    flow: UnsafeCell<IbvFlow>,
    _inner: uroce::Flow,
}

/// `struct ibv_flow`.
#[repr(C)]
struct IbvFlow {
    comp_mask: u32,
    context: *mut ibv_context,
    handle: u32,
}

const SPEC_ETH: u32 = 0x20;
const SPEC_IPV4: u32 = 0x30;
const SPEC_IPV6: u32 = 0x31;
const SPEC_IPV4_EXT: u32 = 0x32;
const SPEC_TCP: u32 = 0x40;
const SPEC_UDP: u32 = 0x41;
/// `sizeof(struct ibv_flow_attr)`: the specs follow it.
const ATTR_LEN: usize = 20;
/// `IBV_FLOW_ATTR_FLAGS_DONT_TRAP`: what a packet socket always does.
const DONT_TRAP: u32 = 1 << 1;

fn take<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], c_int> {
    b.get(at..at + N).and_then(|s| s.try_into().ok()).ok_or(libc::EINVAL)
}

fn be16(b: &[u8], at: usize) -> Result<u16, c_int> {
    take::<2>(b, at).map(u16::from_be_bytes)
}

/// One spec (`b`: its bytes, `size` long) as a rule's match.
fn spec(kind: u32, b: &[u8]) -> Result<FlowSpec, c_int> {
    match kind {
        SPEC_ETH => {
            // val at 6, mask at 22: dst, src, ether_type, vlan_tag.
            let f = |at: usize| -> Result<([u8; 6], [u8; 6], u16, u16), c_int> {
                Ok((take(b, at)?, take(b, at + 6)?, be16(b, at + 12)?, be16(b, at + 14)?))
            };
            let (v, m) = (f(6)?, f(22)?);
            Ok(FlowSpec::Eth {
                dst: (v.0, m.0),
                src: (v.1, m.1),
                ether_type: (v.2, m.2),
                vlan: (v.3, m.3),
            })
        }
        SPEC_IPV4 | SPEC_IPV4_EXT => {
            let ext = kind == SPEC_IPV4_EXT;
            let (val, mask) = if ext { (8, 20) } else { (8, 16) };
            let byte = |at: usize, off: usize| -> Result<u8, c_int> {
                if ext { take::<1>(b, at + off).map(|x| x[0]) } else { Ok(0) }
            };
            let pair = |off| -> Result<(u8, u8), c_int> { Ok((byte(val, off)?, byte(mask, off)?)) };
            Ok(FlowSpec::Ipv4 {
                src: (take(b, val)?, take(b, mask)?),
                dst: (take(b, val + 4)?, take(b, mask + 4)?),
                proto: pair(8)?,
                tos: pair(9)?,
                ttl: pair(10)?,
            })
        }
        SPEC_IPV6 => {
            let (val, mask) = (8, 48);
            let byte = |at: usize| -> Result<u8, c_int> { take::<1>(b, at).map(|x| x[0]) };
            let label =
                |at: usize| -> Result<u32, c_int> { take::<4>(b, at).map(u32::from_be_bytes) };
            Ok(FlowSpec::Ipv6 {
                src: (take(b, val)?, take(b, mask)?),
                dst: (take(b, val + 16)?, take(b, mask + 16)?),
                flow_label: (label(val + 32)?, label(mask + 32)?),
                next_hdr: (byte(val + 36)?, byte(mask + 36)?),
                traffic_class: (byte(val + 37)?, byte(mask + 37)?),
                hop_limit: (byte(val + 38)?, byte(mask + 38)?),
            })
        }
        SPEC_TCP | SPEC_UDP => {
            // val at 6, mask at 10: dst_port, then src_port.
            let dst = (be16(b, 6)?, be16(b, 10)?);
            let src = (be16(b, 8)?, be16(b, 12)?);
            Ok(if kind == SPEC_TCP {
                FlowSpec::Tcp { src, dst }
            } else {
                FlowSpec::Udp { src, dst }
            })
        }
        _ => Err(libc::EOPNOTSUPP),
    }
}

/// The longest spec (`struct ibv_flow_spec_ipv6`, 88 bytes, and room).
const MAX_SPEC: usize = 256;

/// Reads an `ibv_flow_attr` and its specs, each found after the last by
/// its own `size`, as libibverbs walks them (the attribute's `size` is
/// not relied on: pyverbs leaves it at the header's).
///
/// # Safety
/// `attr` points at a readable `ibv_flow_attr` followed by its
/// `num_of_specs` specs, each as long as its `size` says.
unsafe fn read_attr(attr: *const u8) -> Result<(FlowAttr, u8), c_int> {
    // SAFETY: the caller gives at least the fixed header.
    let head = unsafe { std::slice::from_raw_parts(attr, ATTR_LEN) };
    let comp_mask = u32::from_ne_bytes(take(head, 0)?);
    let kind = u32::from_ne_bytes(take(head, 4)?);
    let priority = u16::from_ne_bytes(take(head, 10)?);
    let (count, port) = (head[12], head[13]);
    let flags = u32::from_ne_bytes(take(head, 16)?);
    if comp_mask != 0 {
        return Err(libc::EINVAL);
    }
    if flags & !DONT_TRAP != 0 {
        // Egress rules and the rest.
        return Err(libc::EOPNOTSUPP);
    }
    let kind = match kind {
        0 => FlowKind::Normal,
        1 => FlowKind::AllDefault,
        2 => FlowKind::McDefault,
        3 => FlowKind::Sniffer,
        _ => return Err(libc::EINVAL),
    };
    let mut specs = Vec::with_capacity(usize::from(count));
    let mut at = ATTR_LEN;
    for _ in 0..count {
        // SAFETY: a spec starts with its type and size (8 bytes with
        // padding), then is `size` bytes long (the caller's contract).
        let header = unsafe { std::slice::from_raw_parts(attr.add(at), 8) };
        let kind = u32::from_ne_bytes(take(header, 0)?);
        let len = u16::from_ne_bytes(take(header, 4)?) as usize;
        if !(8..=MAX_SPEC).contains(&len) {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(attr.add(at), len) };
        specs.push(spec(kind, bytes)?);
        at += len;
    }
    Ok((FlowAttr { kind, priority, specs }, port))
}

/// `verbs_context.ibv_create_flow`.
pub(crate) unsafe extern "C" fn create_flow(qp: *mut ibv_qp, attr: *mut c_void) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let Some(q) = live_qp(qp) else { return null_errno(libc::EINVAL) };
        if attr.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: the caller's flow attributes, `size` bytes long.
        let (flow, port) = match unsafe { read_attr(attr.cast()) } {
            Ok(a) => a,
            Err(e) => return null_errno(e),
        };
        if port != 1 {
            return null_errno(libc::EINVAL);
        }
        if q.inner.qp_type() != uroce::QpType::RawPacket {
            return null_errno(libc::EOPNOTSUPP);
        }
        let inner = match q.inner.create_flow(flow) {
            Ok(f) => f,
            Err(e) => return null_errno(e.errno()),
        };
        // SAFETY: a live QP's public struct.
        let context = unsafe { (*qp).context };
        let handle = inner.id();
        let b = FlowBox {
            flow: UnsafeCell::new(IbvFlow { comp_mask: 0, context, handle }),
            _inner: inner,
        };
        into_c(b, Kind::Flow).cast()
    })
}

/// `verbs_context.ibv_destroy_flow`.
pub(crate) unsafe extern "C" fn destroy_flow(flow: *mut c_void) -> c_int {
    guard(libc::EIO, || {
        if !is_live(flow.cast::<FlowBox>(), Kind::Flow) {
            return libc::EINVAL;
        }
        // SAFETY: registered as a flow ⇒ made by into_c::<FlowBox>.
        drop(unsafe { from_c(flow.cast::<FlowBox>(), Kind::Flow) });
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `ibv_flow_attr` header for `count` specs.
    fn header(kind: u32, count: u8, flags: u32) -> Vec<u8> {
        let mut b = vec![0u8; ATTR_LEN];
        b[4..8].copy_from_slice(&kind.to_ne_bytes());
        b[8..10].copy_from_slice(&(ATTR_LEN as u16).to_ne_bytes());
        b[10..12].copy_from_slice(&7u16.to_ne_bytes());
        b[12] = count;
        b[13] = 1;
        b[16..20].copy_from_slice(&flags.to_ne_bytes());
        b
    }

    /// A spec of `kind` whose size field says `len` (at least its 8-byte
    /// header is there).
    fn spec_bytes(kind: u32, len: u16) -> Vec<u8> {
        let mut b = vec![0u8; usize::from(len).max(8)];
        b[..4].copy_from_slice(&kind.to_ne_bytes());
        b[4..6].copy_from_slice(&len.to_ne_bytes());
        b
    }

    fn read(b: &[u8]) -> Result<(FlowAttr, u8), c_int> {
        // SAFETY: `b` holds the header and every spec its sizes name.
        unsafe { read_attr(b.as_ptr()) }
    }

    #[test]
    fn specs_are_read_at_rdma_core_44s_offsets() {
        let mut b = header(0, 2, 0);
        let mut eth = spec_bytes(SPEC_ETH, 40);
        eth[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]); // val.dst_mac
        eth[18..20].copy_from_slice(&0x0800u16.to_be_bytes()); // val.ether_type
        eth[22..28].fill(0xff); // mask.dst_mac
        eth[34..36].fill(0xff); // mask.ether_type
        let mut udp = spec_bytes(SPEC_UDP, 16);
        udp[6..8].copy_from_slice(&4791u16.to_be_bytes()); // val.dst_port
        udp[10..12].fill(0xff); // mask.dst_port
        b.extend(eth);
        b.extend(udp);
        let (attr, port) = read(&b).unwrap();
        assert_eq!((attr.kind, attr.priority, port), (FlowKind::Normal, 7, 1));
        assert_eq!(
            attr.specs,
            vec![
                FlowSpec::Eth {
                    dst: ([2, 0, 0, 0, 0, 9], [0xff; 6]),
                    src: ([0; 6], [0; 6]),
                    ether_type: (0x0800, 0xffff),
                    vlan: (0, 0),
                },
                FlowSpec::Udp { src: (0, 0), dst: (4791, 0xffff) },
            ]
        );
    }

    #[test]
    fn what_is_not_done_is_refused_plainly() {
        let with = |kind: u32, len: u16| {
            let mut b = header(0, 1, 0);
            b.extend(spec_bytes(kind, len));
            read(&b).map(|_| ())
        };
        assert_eq!(with(0x100 | SPEC_ETH, 40), Err(libc::EOPNOTSUPP), "inner specs");
        assert_eq!(with(0x1001, 8), Err(libc::EOPNOTSUPP), "a drop action");
        assert_eq!(with(SPEC_ETH, 4), Err(libc::EINVAL), "a spec shorter than its header");
        assert_eq!(with(SPEC_ETH, 1000), Err(libc::EINVAL), "an absurd size");
        assert_eq!(with(SPEC_ETH, 12), Err(libc::EINVAL), "an Ethernet spec cut short");
        let egress = header(0, 0, 1 << 2);
        assert_eq!(read(&egress).map(|_| ()), Err(libc::EOPNOTSUPP), "egress rules");
        let dont_trap = header(3, 0, DONT_TRAP);
        assert_eq!(read(&dont_trap).unwrap().0.kind, FlowKind::Sniffer);
        assert_eq!(read(&header(9, 0, 0)).map(|_| ()), Err(libc::EINVAL), "an unknown type");
    }
}
