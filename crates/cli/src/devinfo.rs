//! `uroce devices` and `uroce devinfo`: what `ibv_devices` and
//! `ibv_devinfo` print, line for line, from the device configuration the
//! library uses (`UROCE_DEVICES`, the config file, or the default device).

use std::net::Ipv6Addr;
use std::process::ExitCode;

use anyhow::{Result, bail};
use uroce::{Device, limits};

#[derive(clap::Args)]
pub(crate) struct DevicesArgs {}

#[derive(clap::Args)]
pub(crate) struct DevinfoArgs {
    /// Use this device (default: all devices).
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// Show only this port (uroce devices have one port, 1).
    #[arg(short = 'i', long = "ib-port")]
    port: Option<u8>,
    /// Print only the device names.
    #[arg(short = 'l', long)]
    list: bool,
    /// Print all attributes, the GID table included.
    #[arg(short = 'v', long)]
    verbose: bool,
}

pub(crate) fn devices(_: &DevicesArgs) -> Result<ExitCode> {
    let list = uroce::devices()?;
    println!("    {:<16}\t   node GUID", "device");
    println!("    {:<16}\t----------------", "------");
    for d in &list {
        println!("    {:<16}\t{:016x}", d.name(), d.guid());
    }
    Ok(ExitCode::SUCCESS)
}

/// `xxxx:xxxx:xxxx:xxxx`, as ibv_devinfo prints GUIDs.
pub(crate) fn guid_str(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        g >> 48,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

const CAP_NAMES: [(u32, &str); 7] = [
    (1 << 7, "CURR_QP_STATE_MOD"),
    (1 << 10, "PORT_ACTIVE_EVENT"),
    (1 << 11, "SYS_IMAGE_GUID"),
    (1 << 12, "RC_RNR_NAK_GEN"),
    (1 << 17, "MEM_WINDOW"),
    (1 << 21, "MEM_MGT_EXTENSIONS"),
    (1 << 24, "MEM_WINDOW_TYPE_2B"),
];

pub(crate) fn devinfo(a: &DevinfoArgs) -> Result<ExitCode> {
    let list = uroce::devices()?;
    if a.list {
        println!("{} HCA{} found:", list.len(), if list.len() == 1 { "" } else { "s" });
        for d in &list {
            println!("\t{}", d.name());
        }
        println!();
        return Ok(ExitCode::SUCCESS);
    }
    if a.port == Some(0) {
        bail!("invalid port 0 (ports are numbered from 1)");
    }
    let chosen: Vec<&Device> = match &a.dev {
        Some(n) => match list.iter().find(|d| d.name() == n) {
            Some(d) => vec![d],
            None => bail!("IB device '{n}' wasn't found (configured: {})", names(&list)),
        },
        None if list.is_empty() => bail!("No IB devices found"),
        None => list.iter().collect(),
    };
    for d in chosen {
        print_device(d, a)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn names(list: &[Device]) -> String {
    let v: Vec<&str> = list.iter().map(Device::name).collect();
    if v.is_empty() { "none".into() } else { v.join(", ") }
}

fn print_device(d: &Device, a: &DevinfoArgs) -> Result<()> {
    let at = d.attr();
    if let Some(p) = a.port
        && p > at.phys_port_cnt
    {
        bail!("Invalid port {p} requested for device {} (it has {})", d.name(), at.phys_port_cnt);
    }
    println!("hca_id:\t{}", d.name());
    println!("\ttransport:\t\t\tInfiniBand (0)");
    println!("\tfw_ver:\t\t\t\t{}", at.fw_ver);
    println!("\tnode_guid:\t\t\t{}", guid_str(at.node_guid));
    println!("\tsys_image_guid:\t\t\t{}", guid_str(at.sys_image_guid));
    println!("\tvendor_id:\t\t\t0x{:04x}", at.vendor_id);
    println!("\tvendor_part_id:\t\t\t{}", at.vendor_part_id);
    println!("\thw_ver:\t\t\t\t0x{:X}", at.hw_ver);
    println!("\tphys_port_cnt:\t\t\t{}", at.phys_port_cnt);
    if a.verbose {
        println!("\tmax_mr_size:\t\t\t0x{:x}", at.max_mr_size);
        println!("\tpage_size_cap:\t\t\t0x{:x}", at.page_size_cap);
        println!("\tmax_qp:\t\t\t\t{}", at.max_qp);
        println!("\tmax_qp_wr:\t\t\t{}", at.max_qp_wr);
        println!("\tdevice_cap_flags:\t\t0x{:08x}", limits::DEVICE_CAP_FLAGS);
        for (bit, name) in CAP_NAMES {
            if limits::DEVICE_CAP_FLAGS & bit != 0 {
                println!("\t\t\t\t\t{name}");
            }
        }
        println!("\tmax_sge:\t\t\t{}", at.max_sge);
        println!("\tmax_sge_rd:\t\t\t{}", at.max_sge);
        println!("\tmax_cq:\t\t\t\t{}", at.max_cq);
        println!("\tmax_cqe:\t\t\t{}", at.max_cqe);
        println!("\tmax_mr:\t\t\t\t{}", at.max_mr);
        println!("\tmax_pd:\t\t\t\t{}", at.max_pd);
        println!("\tmax_qp_rd_atom:\t\t\t{}", at.max_qp_rd_atom);
        println!("\tmax_ee_rd_atom:\t\t\t0");
        println!("\tmax_res_rd_atom:\t\t{}", at.max_qp_rd_atom * at.max_qp);
        println!("\tmax_qp_init_rd_atom:\t\t{}", at.max_qp_init_rd_atom);
        println!("\tmax_ee_init_rd_atom:\t\t0");
        let (cap, code) = (at.atomic_cap.name(), at.atomic_cap.to_ibv());
        println!("\tatomic_cap:\t\t\t{cap} ({code})");
        println!("\tmax_ee:\t\t\t\t0");
        println!("\tmax_rdd:\t\t\t0");
        println!("\tmax_mw:\t\t\t\t{}", at.max_mw);
        println!("\tmax_raw_ipv6_qp:\t\t0");
        println!("\tmax_raw_ethy_qp:\t\t0");
        println!("\tmax_mcast_grp:\t\t\t{}", at.max_mcast_grp);
        println!("\tmax_mcast_qp_attach:\t\t{}", at.max_mcast_qp_attach);
        println!("\tmax_total_mcast_qp_attach:\t{}", at.max_mcast_grp * at.max_mcast_qp_attach);
        println!("\tmax_ah:\t\t\t\t{}", at.max_ah);
        println!("\tmax_fmr:\t\t\t0");
        println!("\tmax_srq:\t\t\t{}", at.max_srq);
        println!("\tmax_srq_wr:\t\t\t{}", at.max_srq_wr);
        println!("\tmax_srq_sge:\t\t\t{}", at.max_srq_sge);
        println!("\tmax_pkeys:\t\t\t1");
        println!("\tlocal_ca_ack_delay:\t\t{}", limits::LOCAL_CA_ACK_DELAY);
        // The extended attributes (ibv_query_device_ex): completion
        // timestamps, and none of the others.
        print_odp(&at);
        println!("\tcompletion timestamp_mask:\t\t\t0x{:016x}", at.completion_timestamp_mask);
        println!("\thca_core_clock:\t\t\t{}kHZ", at.hca_core_clock_khz);
        let ex = at.device_cap_flags_ex;
        println!("\tdevice_cap_flags_ex:\t\t0x{ex:X}");
        // ibv_devinfo names two of the high flags; the rest are "unknown".
        let unknown = ex & 0xffff_ffff_0000_0000 & !((1 << 34) | (1 << 36));
        if unknown != 0 {
            println!("\t\t\t\t\tUnknown flags: 0x{unknown:X}");
        }
        print!("{EXTENDED_NONE}");
        println!("\tmax_rndv_hdr_size:\t\t{}", at.tm_max_rndv_hdr_size);
        println!("\tmax_num_tags:\t\t\t{}", at.tm_max_num_tags);
        println!("\tmax_ops:\t\t\t{}", at.tm_max_ops);
        println!("\tmax_sge:\t\t\t{}", at.tm_max_sge);
        caps_lines("flags", 1, &["IBV_TM_CAP_RC"]);
        println!("\n\tcq moderation caps:");
        println!("\t\tmax_cq_count:\t{}", at.max_cq_count);
        println!("\t\tmax_cq_period:\t{} us\n", at.max_cq_period_us);
        println!("\tmaximum available device memory:\t{}Bytes\n", at.max_dm_size);
        println!("\tnum_comp_vectors:\t\t1");
    }
    let p = d.port_attr();
    if a.port.is_none_or(|x| x == 1) {
        println!("\t\tport:\t1");
        let (state, code) = if p.active { ("PORT_ACTIVE", 4) } else { ("PORT_DOWN", 1) };
        println!("\t\t\tstate:\t\t\t{state} ({code})");
        println!("\t\t\tmax_mtu:\t\t{} ({})", p.max_mtu.bytes(), p.max_mtu.to_ibv());
        println!("\t\t\tactive_mtu:\t\t{} ({})", p.active_mtu.bytes(), p.active_mtu.to_ibv());
        println!("\t\t\tsm_lid:\t\t\t0");
        println!("\t\t\tport_lid:\t\t0");
        println!("\t\t\tport_lmc:\t\t0x00");
        println!("\t\t\tlink_layer:\t\tEthernet");
        if a.verbose {
            println!("\t\t\tmax_msg_sz:\t\t0x{:x}", limits::MAX_MSG_SZ);
            println!("\t\t\tport_cap_flags:\t\t0x{:08x}", limits::PORT_CAP_FLAGS);
            println!("\t\t\tport_cap_flags2:\t0x0000");
            println!("\t\t\tmax_vl_num:\t\t1 (1)");
            println!("\t\t\tbad_pkey_cntr:\t\t0x0");
            println!("\t\t\tqkey_viol_cntr:\t\t0x0");
            println!("\t\t\tsm_sl:\t\t\t0");
            println!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
            println!("\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
            println!("\t\t\tsubnet_timeout:\t\t0");
            println!("\t\t\tinit_type_reply:\t0");
            println!("\t\t\tactive_width:\t\t{}", p.link.width_str());
            println!("\t\t\tactive_speed:\t\t{}", p.link.speed_str());
            let phys = if p.active { "LINK_UP (5)" } else { "DISABLED (3)" };
            println!("\t\t\tphys_state:\t\t{phys}");
            for (i, a) in d.gid_table() {
                let gid = Ipv6Addr::from(uroce::wire::grh::gid_of(a));
                println!("\t\t\tGID[{i:>3}]:\t\t{gid}, RoCE v2");
            }
        }
        println!();
    }
    Ok(())
}

/// `ibv_devinfo -v`'s lines for a set of capability bits (as it names
/// them), or "NO SUPPORT".
fn caps_lines(title: &str, bits: u64, names: &[&str]) {
    println!("\t{title}:");
    let set: Vec<&str> =
        names.iter().enumerate().filter(|(i, _)| bits & (1 << i) != 0).map(|(_, n)| *n).collect();
    if set.is_empty() && !names.is_empty() && title != "general_odp_caps" {
        println!("\t\t\t\t\tNO SUPPORT");
    }
    for n in set {
        println!("\t\t\t\t\t{n}");
    }
}

/// On-demand paging as `ibv_devinfo -v` prints it.
fn print_odp(at: &uroce::DeviceAttr) {
    const TRANSPORT: [&str; 6] = [
        "SUPPORT_SEND",
        "SUPPORT_RECV",
        "SUPPORT_WRITE",
        "SUPPORT_READ",
        "SUPPORT_ATOMIC",
        "SUPPORT_SRQ",
    ];
    caps_lines("general_odp_caps", at.odp_general_caps, &["ODP_SUPPORT", "ODP_SUPPORT_IMPLICIT"]);
    caps_lines("rc_odp_caps", u64::from(at.odp_rc_caps), &TRANSPORT);
    caps_lines("uc_odp_caps", u64::from(at.odp_uc_caps), &TRANSPORT);
    caps_lines("ud_odp_caps", u64::from(at.odp_ud_caps), &TRANSPORT);
    caps_lines("xrc_odp_caps", u64::from(at.odp_xrc_caps), &TRANSPORT);
}

/// What ibv_devinfo -v prints after the clock for a device with none of
/// the other extended capabilities (TSO, RSS, packet pacing); tag
/// matching follows.
const EXTENDED_NONE: &str = "\ttso_caps:
\t\tmax_tso:\t\t\t0
\trss_caps:
\t\tmax_rwq_indirection_tables:\t\t\t0
\t\tmax_rwq_indirection_table_size:\t\t\t0
\t\trx_hash_function:\t\t\t\t0x0
\t\trx_hash_fields_mask:\t\t\t\t0x0
\tmax_wq_type_rq:\t\t\t0
\tpacket_pacing_caps:
\t\tqp_rate_limit_min:\t0kbps
\t\tqp_rate_limit_max:\t0kbps
";
