//! What the kernel would show for a uroce device under `/sys/class`: the
//! files UCX, NCCL, pyverbs and rdma-core's tools read, with the values
//! the drop-in library reports through verbs, so the two never disagree.

use std::net::IpAddr;
use std::path::PathBuf;

use uroce::Device;
use uroce::published::{Object, RXE_COUNTERS, read_all, rxe_value};
use uroce::transport::Stats;

use super::nldev::DevInfo;

/// One node of the tree, its path relative to `/sys/class`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    Dir(PathBuf),
    File(PathBuf, String),
    Link(PathBuf, PathBuf),
}

/// The `uverbs` character device number the kernel would give device
/// `index` (major 231, minors from 192).
fn dev_number(index: usize) -> String {
    format!("231:{}", 192 + index)
}

/// A GID as sysfs prints it: eight groups of four hex digits (GUIDs are
/// printed as ibv_devinfo prints them: `devinfo::guid_str`).
pub(crate) fn gid_text(gid: [u8; 16]) -> String {
    let groups: Vec<String> = gid.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect();
    groups.join(":")
}

/// The port's state and physical state as `ibv_port_state` numbers and
/// sysfs text.
fn port_states(dev: &Device) -> ((u8, &'static str), (u8, &'static str)) {
    if dev.port_attr().active {
        ((4, "4: ACTIVE"), (5, "5: LinkUp"))
    } else {
        ((1, "1: DOWN"), (3, "3: Disabled"))
    }
}

/// The device's counters summed over every process using it (as the
/// kernel's are), with the contexts (their processes' IDs) and their objects (each
/// with its process's ID).
fn totals(dev: &Device) -> (Stats, Vec<u32>, Vec<(u32, Object)>) {
    let mut total = Stats::default();
    let (mut contexts, mut objects) = (Vec::new(), Vec::new());
    for s in read_all(Some(dev.name())) {
        total.accumulate(&s.device_stats);
        contexts.push(s.pid);
        objects.extend(s.objects.iter().map(|o| (s.pid, *o)));
    }
    (total, contexts, objects)
}

/// The parts of the tree that change while programs run: the port's state
/// and its counters (rxe's `hw_counters`).
pub(crate) fn live_nodes(dev: &Device) -> Vec<Node> {
    let port = PathBuf::from("infiniband").join(dev.name()).join("ports/1");
    let ((_, state), (_, phys)) = port_states(dev);
    let (total, _, _) = totals(dev);
    let mut v = vec![
        Node::File(port.join("state"), format!("{state}\n")),
        Node::File(port.join("phys_state"), format!("{phys}\n")),
    ];
    for name in RXE_COUNTERS {
        v.push(Node::File(
            port.join("hw_counters").join(name),
            format!("{}\n", rxe_value(&total, name)),
        ));
    }
    v
}

/// Device `index` as the RDMA netlink family describes it (`rdma dev`,
/// `rdma link`, `rdma statistic`), with the values the tree shows.
pub(crate) fn netlink_info(index: usize, dev: &Device) -> DevInfo {
    let attr = dev.attr();
    let ((state, _), (phys, _)) = port_states(dev);
    let (total, contexts, objects) = totals(dev);
    let netdev = dev.interface().map(|name| {
        let ifindex = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        (name, ifindex)
    });
    DevInfo {
        index: index as u32,
        name: dev.name().to_string(),
        fw_ver: attr.fw_ver.to_string(),
        node_guid: attr.node_guid,
        sys_image_guid: attr.sys_image_guid,
        cap_flags: u64::from(uroce::limits::DEVICE_CAP_FLAGS),
        port_state: state,
        phys_state: phys,
        netdev,
        counters: RXE_COUNTERS.iter().map(|n| (*n, rxe_value(&total, n))).collect(),
        contexts,
        objects,
    }
}

/// The whole tree of device `index` (its `uverbs` number): the
/// `infiniband/<dev>` directory and its `infiniband_verbs/uverbs<index>`.
pub(crate) fn device_nodes(index: usize, dev: &Device) -> Vec<Node> {
    let name = dev.name();
    let root = PathBuf::from("infiniband").join(name);
    let port = root.join("ports/1");
    let attr = dev.attr();
    let pattr = dev.port_attr();
    let uverbs = format!("uverbs{index}");
    let file = |p: PathBuf, s: &str| Node::File(p, format!("{s}\n"));
    let mut v = vec![
        Node::Dir(port.join("gids")),
        Node::Dir(port.join("gid_attrs/types")),
        Node::Dir(port.join("gid_attrs/ndevs")),
        Node::Dir(port.join("pkeys")),
        Node::Dir(port.join("hw_counters")),
        Node::Dir(root.join("device/net")),
        Node::Dir(root.join("device/infiniband_verbs").join(&uverbs)),
        Node::Dir(PathBuf::from("infiniband_verbs").join(&uverbs)),
        file(root.join("node_type"), "1: CA"),
        file(root.join("node_guid"), &crate::devinfo::guid_str(attr.node_guid)),
        file(root.join("sys_image_guid"), &crate::devinfo::guid_str(attr.sys_image_guid)),
        file(root.join("fw_ver"), attr.fw_ver),
        file(root.join("hca_type"), "uroce"),
        file(root.join("hw_rev"), &attr.hw_ver.to_string()),
        file(root.join("board_id"), "uroce"),
        file(root.join("node_desc"), name),
        file(port.join("rate"), &pattr.link.rate()),
        file(port.join("link_layer"), "Ethernet"),
        file(port.join("lid"), "0x0"),
        file(port.join("sm_lid"), "0x0"),
        file(port.join("lid_mask_count"), "0"),
        file(port.join("sm_sl"), "0"),
        file(port.join("cap_mask"), &format!("0x{:08x}", uroce::limits::PORT_CAP_FLAGS)),
        file(port.join("pkeys/0"), "0xffff"),
        file(PathBuf::from("infiniband_verbs/abi_version"), "6"),
    ];
    let ifname = dev.interface();
    if let Some(ifname) = &ifname {
        v.push(Node::Link(
            root.join("device/net").join(ifname),
            PathBuf::from("/sys/class/net").join(ifname),
        ));
    }
    // Every index up to the table's length exists, as in the kernel; an
    // empty slot reads zeros and has no type or netdev.
    let table = dev.gid_table();
    for i in 0..pattr.gid_tbl_len {
        let addr: Option<IpAddr> = table.iter().find(|(k, _)| *k == i).map(|(_, a)| *a);
        let gid = addr.map_or([0u8; 16], uroce::wire::grh::gid_of);
        v.push(file(port.join("gids").join(i.to_string()), &gid_text(gid)));
        if addr.is_some() {
            v.push(file(port.join("gid_attrs/types").join(i.to_string()), "RoCE v2"));
            if let Some(ifname) = &ifname {
                v.push(file(port.join("gid_attrs/ndevs").join(i.to_string()), ifname));
            }
        }
    }
    for dir in [
        PathBuf::from("infiniband_verbs").join(&uverbs),
        root.join("device/infiniband_verbs").join(&uverbs),
    ] {
        v.push(file(dir.join("ibdev"), name));
        v.push(file(dir.join("abi_version"), "1"));
        v.push(file(dir.join("dev"), &dev_number(index)));
    }
    v.extend(live_nodes(dev));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_are_spelled_as_sysfs_spells_them() {
        let gid = uroce::wire::grh::gid_of("192.168.1.2".parse().unwrap());
        assert_eq!(gid_text(gid), "0000:0000:0000:0000:0000:ffff:c0a8:0102");
    }

    #[test]
    fn a_device_lists_its_gid_port_and_verbs_files() {
        let dev = Device::from_config(uroce::DeviceConfig {
            name: "uroce7".into(),
            addr: "127.0.0.1".parse().unwrap(),
            port: 4791,
        });
        let nodes = device_nodes(3, &dev);
        let file = |p: &str| {
            nodes.iter().find_map(|n| match n {
                Node::File(q, s) if q == &PathBuf::from(p) => Some(s.clone()),
                _ => None,
            })
        };
        assert_eq!(
            file("infiniband/uroce7/ports/1/gids/0").unwrap(),
            "0000:0000:0000:0000:0000:ffff:7f00:0001\n"
        );
        assert_eq!(file("infiniband/uroce7/ports/1/gid_attrs/types/0").unwrap(), "RoCE v2\n");
        assert_eq!(file("infiniband/uroce7/ports/1/link_layer").unwrap(), "Ethernet\n");
        assert_eq!(file("infiniband_verbs/uverbs3/ibdev").unwrap(), "uroce7\n");
        assert_eq!(file("infiniband_verbs/uverbs3/dev").unwrap(), "231:195\n");
        assert_eq!(
            file("infiniband/uroce7/node_guid").unwrap(),
            format!("{}\n", crate::devinfo::guid_str(dev.guid()))
        );
        assert!(file("infiniband/uroce7/ports/1/hw_counters/sent_pkts").is_some());
        assert!(nodes.iter().any(|n| matches!(n, Node::Link(p, t)
            if p == &PathBuf::from("infiniband/uroce7/device/net/lo") && t == &PathBuf::from("/sys/class/net/lo"))));
    }
}
