//! Address handles (`ibv_ah`): where UD sends go.

use std::net::IpAddr;

use uroce_transport::UdDest;
use uroce_wire::GRH_LEN;
use uroce_wire::grh::GrhInfo;
use uroce_wire::udp::ROCE_V2_PORT;

use crate::error::{Error, Result};
use crate::verbs::Pd;

/// What an address handle points at (`ibv_ah_attr` for RoCE: the GRH
/// fields; the destination GID is an IP address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination address (the destination GID: IPv4-mapped or IPv6).
    pub dst: IpAddr,
    /// Destination UDP port (4791 unless the peer's device uses another).
    pub port: u16,
    /// Source GID index (0: the device address).
    pub sgid_index: u8,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
}

impl AhAttr {
    /// An AH attribute for `dst` with defaults (port 4791, hop limit 64).
    pub fn new(dst: IpAddr) -> Self {
        Self {
            dst,
            port: ROCE_V2_PORT,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
    }

    /// From a destination GID, as `ibv_ah_attr.grh.dgid` holds it.
    pub fn from_gid(gid: [u8; 16]) -> Self {
        let v6 = std::net::Ipv6Addr::from(gid);
        Self::new(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
    }

    /// `ibv_init_ah_from_wc`: the attributes for replying to the sender of
    /// a UD receive, read from the GRH area at the start of its buffer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the completion has no GRH or the area
    /// holds neither an IPv4 nor an IPv6 header.
    pub fn from_wc(wc: &crate::Completion, grh: &[u8; GRH_LEN]) -> Result<Self> {
        if !wc.flags.contains(crate::WcFlags::GRH) {
            return Err(Error::InvalidArgument("completion without GRH"));
        }
        let g = GrhInfo::parse(grh)
            .map_err(|_| Error::InvalidArgument("GRH area holds no IP header"))?;
        Ok(Self {
            dst: g.src,
            port: ROCE_V2_PORT,
            sgid_index: 0,
            hop_limit: g.hop_limit,
            traffic_class: g.traffic_class,
            flow_label: g.flow_label,
        })
    }
}

/// An address handle.
#[derive(Debug)]
pub struct Ah {
    attr: AhAttr,
    pd: Pd,
}

impl Drop for Ah {
    fn drop(&mut self) {
        self.pd.ah_count().fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Pd {
    /// Creates an address handle (`ibv_create_ah`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unspecified destination, a GID
    /// index with no address, or a destination of another address family
    /// than the source GID's; [`Error::Io`] if the source GID's address
    /// cannot be bound (another device holds it).
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah> {
        if attr.dst.is_unspecified() {
            return Err(Error::InvalidArgument("unspecified destination"));
        }
        self.source_for(attr.sgid_index, attr.dst)?;
        let live = self.ah_count().fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if live >= crate::limits::MAX_AH {
            self.ah_count().fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            return Err(Error::Limit("max_ah"));
        }
        Ok(Ah { attr: *attr, pd: self.clone() })
    }
}

impl Ah {
    /// The attributes.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }

    /// The `wr.ud` part of a send WR to QP `remote_qpn` with `remote_qkey`.
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            dst: self.attr.dst,
            dst_port: self.attr.port,
            remote_qpn,
            remote_qkey,
            sgid_index: self.attr.sgid_index,
            traffic_class: self.attr.traffic_class,
        }
    }
}
