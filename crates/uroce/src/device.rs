//! Devices and their attributes (`ibv_get_device_list`, `ibv_query_device`,
//! `ibv_query_port`, `ibv_query_gid`).

use std::net::{IpAddr, SocketAddr};

use uroce_wire::Mtu;

use crate::config::{self, DeviceConfig};
use crate::error::{Error, Result};
use crate::limits;
use crate::link_speed::LinkSpeed;

/// A configured device (not yet opened).
#[derive(Debug, Clone)]
pub struct Device {
    cfg: DeviceConfig,
    /// The network the device is on, when it is not the host's (a
    /// simulated one).
    net: Option<std::sync::Arc<dyn crate::backend::Network>>,
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.cfg == other.cfg && self.is_simulated() == other.is_simulated()
    }
}

impl Eq for Device {}

/// The devices of this process (see [`crate::config`] for where they come
/// from).
///
/// # Errors
/// [`Error::Config`] when the configuration is malformed.
pub fn devices() -> Result<Vec<Device>> {
    Ok(config::load()?.into_iter().map(Device::from_config).collect())
}

/// The device called `name`, or the first one when `name` is `None`.
///
/// # Errors
/// [`Error::NoDevice`], or [`Error::Config`].
pub fn device(name: Option<&str>) -> Result<Device> {
    let list = devices()?;
    match name {
        Some(n) => {
            list.into_iter().find(|d| d.name() == n).ok_or_else(|| Error::NoDevice(n.to_string()))
        }
        None => list.into_iter().next().ok_or_else(|| Error::NoDevice("(none configured)".into())),
    }
}

/// The node GUID of the device on `addr` (see [`Device::guid`]).
pub(crate) fn guid_of(addr: IpAddr) -> u64 {
    let o: [u8; 16] = uroce_wire::grh::gid_of(addr);
    let mut g = [0u8; 8];
    g[0] = 0x02; // locally administered
    g[1] = 0x75; // 'u'
    g[2..8].copy_from_slice(&o[10..16]);
    u64::from_be_bytes(g)
}

impl Device {
    /// A device from an explicit configuration (tests, tools).
    pub fn from_config(cfg: DeviceConfig) -> Self {
        Self { cfg, net: None }
    }

    /// A device on a network of its own (not the host's).
    #[cfg(feature = "sim")]
    pub(crate) fn on_network(
        cfg: DeviceConfig,
        net: std::sync::Arc<dyn crate::backend::Network>,
    ) -> Self {
        Self { cfg, net: Some(net) }
    }

    /// Whether the device is on a simulated network.
    fn is_simulated(&self) -> bool {
        self.net.is_some()
    }

    /// The seed of the device's virtual network, if it is on one.
    pub(crate) fn virtual_seed(&self) -> Option<u64> {
        self.net.as_ref().and_then(|n| n.virtual_seed())
    }

    /// The device's packet I/O: a UDP socket on its address, or its port on
    /// its own network.
    pub(crate) fn backend(&self) -> std::io::Result<Box<dyn crate::backend::Backend>> {
        match &self.net {
            Some(net) => Ok(net.attach(self.socket_addr())),
            None if crate::backend::xdp::selected() => {
                crate::backend::xdp::XdpBackend::open(self.socket_addr())
            }
            #[cfg(feature = "dpdk")]
            None if crate::backend::dpdk::selected() => {
                Ok(Box::new(crate::backend::dpdk::DpdkBackend::open(self.socket_addr())?))
            }
            #[cfg(not(feature = "dpdk"))]
            None if std::env::var("UROCE_BACKEND").as_deref() == Ok("dpdk") => {
                Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "UROCE_BACKEND=dpdk: this build has no DPDK backend (build with \
                     `--features uroce/dpdk`, which needs libdpdk-dev)",
                ))
            }
            None => Ok(Box::new(crate::backend::udp::UdpBackend::bind(self.socket_addr())?)),
        }
    }

    /// Ends the CM connections that contexts of this device left up when
    /// their process died without closing them (SIGKILL), if no context
    /// sharing the device has yet: opens a context for a moment, which
    /// takes back their places and sends each connection's peer the DREQ
    /// a host's kernel CM sends when a process's cm_ids die with it.
    /// `uroce run` calls this when its program ends. Whether a context
    /// was opened (a dead process's list was there).
    ///
    /// # Errors
    /// Opening the context's.
    pub fn end_leftover_connections(&self) -> Result<bool> {
        if self.is_simulated() || !crate::backend::has_connection_lists(self.socket_addr()) {
            return Ok(false);
        }
        let ctx = self.open()?;
        ctx.progress();
        Ok(true)
    }

    /// Name (`uroce0`, …).
    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// The IP address and UDP port the device uses.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.cfg.addr, self.cfg.port)
    }

    /// The node GUID: derived from the IP address, as rxe derives it from
    /// the MAC (EUI-64 style), so it is stable and distinct per address.
    pub fn guid(&self) -> u64 {
        guid_of(self.cfg.addr)
    }

    /// The network interface holding the device's address, if any.
    pub fn interface(&self) -> Option<String> {
        crate::netif::interface_of(self.cfg.addr)
    }

    /// GID 0: the device address as a RoCEv2 GID (IPv4-mapped for IPv4).
    pub fn gid(&self) -> [u8; 16] {
        uroce_wire::grh::gid_of(self.cfg.addr)
    }

    /// Port 1's GID table as it would be if the device were opened now:
    /// `(index, address)` per entry (an open context keeps its own, with
    /// stable indices: [`crate::Context::gid_table`]).
    pub fn gid_table(&self) -> Vec<(u32, IpAddr)> {
        self.gid_table_now().entries()
    }

    pub(crate) fn gid_table_now(&self) -> crate::gid::GidTable {
        crate::gid::GidTable::for_device(self.cfg.addr, self.on_host())
    }

    /// Whether the host's interfaces describe the device (its addresses,
    /// link and MTU): not on a simulated network, nor on a DPDK port,
    /// which the kernel does not see.
    fn on_host(&self) -> bool {
        !self.is_simulated() && !dpdk_selected()
    }

    /// Device attributes.
    pub fn attr(&self) -> DeviceAttr {
        DeviceAttr {
            fw_ver: concat!("uroce ", env!("CARGO_PKG_VERSION")),
            node_guid: self.guid(),
            sys_image_guid: self.guid(),
            max_mr_size: limits::MAX_MR_SIZE,
            page_size_cap: 0xffff_f000,
            vendor_id: limits::VENDOR_ID,
            vendor_part_id: limits::VENDOR_PART_ID,
            hw_ver: 0,
            max_qp: limits::MAX_QP,
            max_qp_wr: limits::MAX_QP_WR,
            max_sge: limits::MAX_SGE,
            max_cq: limits::MAX_CQ,
            max_cqe: limits::MAX_CQE,
            max_mr: limits::MAX_MR,
            max_pd: limits::MAX_PD,
            max_qp_rd_atom: limits::MAX_QP_RD_ATOM,
            max_qp_init_rd_atom: limits::MAX_QP_RD_ATOM,
            max_inline_data: limits::MAX_INLINE,
            max_srq: limits::MAX_SRQ,
            max_srq_wr: limits::MAX_SRQ_WR,
            max_srq_sge: limits::MAX_SGE,
            max_ah: limits::MAX_AH,
            max_mw: limits::MAX_MW,
            max_mcast_grp: limits::MAX_MCAST_GRP,
            max_mcast_qp_attach: limits::MAX_MCAST_QP_ATTACH,
            atomic_cap: AtomicCap::Hca,
            phys_port_cnt: 1,
            hca_core_clock_khz: 1_000_000,
            completion_timestamp_mask: u64::MAX,
            max_dm_size: limits::MAX_DM_SIZE,
            tm_max_rndv_hdr_size: uroce_transport::tm::MAX_RNDV_HDR,
            tm_max_num_tags: uroce_transport::tm::MAX_TAGS,
            tm_max_ops: uroce_transport::tm::MAX_OPS,
            tm_max_sge: 1,
            device_cap_flags_ex: u64::from(limits::DEVICE_CAP_FLAGS)
                | limits::DEVICE_CAP_FLAGS_EX_HIGH,
            // IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT.
            odp_general_caps: 0b11,
            // SEND, RECV, WRITE, READ, ATOMIC, SRQ_RECV: every access is
            // checked the same way, whatever the transport.
            odp_rc_caps: 0x3f,
            odp_uc_caps: 0x27,
            odp_ud_caps: 0x23,
            odp_xrc_caps: 0x3f,
            max_cq_count: limits::MAX_CQ_COUNT,
            max_cq_period_us: limits::MAX_CQ_PERIOD_US,
        }
    }

    /// Port 1's attributes.
    pub fn port_attr(&self) -> PortAttr {
        let mut link_mtu = link_mtu(self.cfg.addr);
        if self.net.is_none() && crate::backend::xdp::selected() {
            link_mtu = link_mtu.min(crate::backend::xdp::max_ip_packet());
        }
        if self.net.is_none() && dpdk_selected() {
            link_mtu = dpdk_port_mtu();
        }
        let over = if self.cfg.addr.is_ipv4() { 20 } else { 40 } + 8 + 12 + 28 + 4;
        PortAttr {
            active: if self.net.is_none() && dpdk_selected() {
                dpdk_link_up()
            } else {
                crate::netif::link_up(self.cfg.addr)
            },
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::for_link_mtu(link_mtu, over).unwrap_or(Mtu::Mtu256),
            gid_tbl_len: self.gid_table_now().len() as u32,
            pkey_tbl_len: 1,
            link_layer_ethernet: true,
            ip_mtu: link_mtu,
            link: LinkSpeed::for_ethernet(
                crate::netif::interface_of(self.cfg.addr)
                    .and_then(|i| crate::link_speed::interface_mbps(&i)),
            ),
        }
    }
}

/// Whether devices use the DPDK backend (and this build has it).
fn dpdk_selected() -> bool {
    #[cfg(feature = "dpdk")]
    return crate::backend::dpdk::selected();
    #[cfg(not(feature = "dpdk"))]
    false
}

/// Whether the DPDK port's link is up.
fn dpdk_link_up() -> bool {
    #[cfg(feature = "dpdk")]
    return crate::backend::dpdk::link_up();
    #[cfg(not(feature = "dpdk"))]
    false
}

/// The DPDK port's IP MTU (1500 until a port started).
fn dpdk_port_mtu() -> usize {
    #[cfg(feature = "dpdk")]
    return crate::backend::dpdk::port_mtu().unwrap_or(1500);
    #[cfg(not(feature = "dpdk"))]
    1500
}

/// The IP MTU of the interface holding `addr` (65536 for loopback when it
/// cannot be read; 1500 for other addresses).
fn link_mtu(addr: IpAddr) -> usize {
    let fallback = if addr.is_loopback() { 65536 } else { 1500 };
    let Some(ifname) = crate::netif::interface_of(addr) else { return fallback };
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(fallback)
}

/// `ibv_device_attr`, the parts with meaning here.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct DeviceAttr {
    pub fw_ver: &'static str,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_inline_data: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_ah: u32,
    pub max_mw: u32,
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    /// What atomics are atomic with respect to.
    pub atomic_cap: AtomicCap,
    pub phys_port_cnt: u8,
    /// The clock completion timestamps count (kHz): 1 GHz, nanoseconds.
    pub hca_core_clock_khz: u64,
    /// The bits of a completion timestamp that count (all of them).
    pub completion_timestamp_mask: u64,
    /// The largest device memory allocation.
    pub max_dm_size: u64,
    /// `device_cap_flags_ex`: `device_cap_flags` and the 64-bit ones
    /// (ATOMIC WRITE, FLUSH to global visibility).
    pub device_cap_flags_ex: u64,
    /// On-demand paging (`ibv_odp_caps`): general (`IBV_ODP_SUPPORT*`) and
    /// per transport (`IBV_ODP_SUPPORT_SEND` …).
    pub odp_general_caps: u64,
    pub odp_rc_caps: u32,
    pub odp_uc_caps: u32,
    pub odp_ud_caps: u32,
    pub odp_xrc_caps: u32,
    /// CQ event moderation (`cq_mod_caps`): largest count, period in µs.
    pub max_cq_count: u16,
    pub max_cq_period_us: u16,
    /// Tag matching (`ibv_tm_caps`, for RC): the longest rendezvous
    /// request, tagged buffers per SRQ, list operations at once, SGEs per
    /// tagged buffer.
    pub tm_max_rndv_hdr_size: u32,
    pub tm_max_num_tags: u32,
    pub tm_max_ops: u32,
    pub tm_max_sge: u32,
}

/// `ibv_atomic_cap`: what a device's atomics are atomic with respect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicCap {
    /// No atomics (`IBV_ATOMIC_NONE`).
    None,
    /// Atomic among the device's own atomic operations (`IBV_ATOMIC_HCA`).
    /// What uroce reports, as rxe does: UCX enables device atomics only for
    /// this value. (uroce's atomics are in fact also atomic with respect to
    /// the CPU's own atomic instructions on the same 8 bytes.)
    Hca,
    /// Atomic with respect to the CPU and every device (`IBV_ATOMIC_GLOB`).
    Global,
}

impl AtomicCap {
    /// The `ibv_atomic_cap` value.
    pub const fn to_ibv(self) -> i32 {
        match self {
            Self::None => 0,
            Self::Hca => 1,
            Self::Global => 2,
        }
    }

    /// The name `ibv_devinfo` prints.
    pub const fn name(self) -> &'static str {
        match self {
            Self::None => "ATOMIC_NONE",
            Self::Hca => "ATOMIC_HCA",
            Self::Global => "ATOMIC_GLOB",
        }
    }
}

/// `ibv_port_attr`, the parts with meaning here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Port state ACTIVE.
    pub active: bool,
    /// Largest path MTU.
    pub max_mtu: Mtu,
    /// Path MTU the link allows.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// RoCE: link layer Ethernet.
    pub link_layer_ethernet: bool,
    /// The interface's IP MTU.
    pub ip_mtu: usize,
    /// Width and speed from the interface's Ethernet speed, as rxe's.
    pub link: LinkSpeed,
}
