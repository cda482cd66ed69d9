//! Devices and their attributes: `ibv_get_device_list`, names, GUIDs,
//! `ibv_query_device` / `_port` / `_gid` / `_pkey`. Devices come from
//! uroce's configuration, never from sysfs.

use std::ffi::{c_char, c_int};
use std::sync::{Arc, Mutex, OnceLock};

use crate::abi::consts::*;
use crate::abi::*;
use crate::ffi::{copy_cstr, guard, minus_one, null_errno, set_errno};
use crate::objects::{DevShared, ctx};

/// One configured device: its `ibv_device` (which lives as long as the
/// process, as rdma-core's do) and the open engine, shared by every
/// context of this process on it and kept until the process exits.
pub(crate) struct DevEntry {
    pub(crate) ibv: Box<ibv_device>,
    pub(crate) cfg: uroce::Device,
    pub(crate) open: Mutex<Option<(Arc<DevShared>, usize)>>,
}

// SAFETY: `ibv` holds only inline data and NULL pointers; nothing in it is
// shared mutable state (C reads it only).
unsafe impl Send for DevEntry {}
// SAFETY: as above; `open` is behind a mutex.
unsafe impl Sync for DevEntry {}

static DEVICES: OnceLock<Result<Vec<DevEntry>, String>> = OnceLock::new();

/// The devices of this process, read once from uroce's configuration.
pub(crate) fn devices() -> Result<&'static [DevEntry], &'static str> {
    let list = DEVICES.get_or_init(|| {
        let devs = uroce::devices().map_err(|e| {
            let msg = format!("uroce: {e}");
            eprintln!("{msg}");
            msg
        })?;
        Ok(devs.into_iter().enumerate().map(|(i, d)| entry(i, d)).collect())
    });
    list.as_deref().map_err(String::as_str)
}

fn entry(i: usize, cfg: uroce::Device) -> DevEntry {
    // SAFETY: ibv_device is plain C data; all-zero is a valid value.
    let mut ibv: Box<ibv_device> = Box::new(unsafe { std::mem::zeroed() });
    ibv.node_type = IBV_NODE_CA;
    ibv.transport_type = IBV_TRANSPORT_IB;
    copy_cstr(&mut ibv.name, cfg.name());
    copy_cstr(&mut ibv.dev_name, &format!("uverbs{i}"));
    copy_cstr(&mut ibv.dev_path, &format!("/sys/class/infiniband_verbs/uverbs{i}"));
    copy_cstr(&mut ibv.ibdev_path, &format!("/sys/class/infiniband/{}", cfg.name()));
    DevEntry { ibv, cfg, open: Mutex::new(None) }
}

/// The entry of an `ibv_device` pointer, if it is one of ours.
pub(crate) fn entry_of(dev: *mut ibv_device) -> Option<(usize, &'static DevEntry)> {
    let list = devices().ok()?;
    list.iter().enumerate().find(|(_, e)| std::ptr::eq(&*e.ibv, dev))
}

pub(crate) unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard(std::ptr::null_mut(), || {
        let list = match devices() {
            Ok(l) => l,
            Err(_) => return null_errno(libc::EINVAL),
        };
        // malloc'd as rdma-core does, so that ibv_free_device_list is a
        // plain free() whatever the application did to the array.
        // SAFETY: malloc of (n + 1) pointers; NULL is handled.
        let arr = unsafe { libc::malloc((list.len() + 1) * size_of::<*mut ibv_device>()) }
            .cast::<*mut ibv_device>();
        if arr.is_null() {
            return null_errno(libc::ENOMEM);
        }
        for (i, e) in list.iter().enumerate() {
            // SAFETY: i < n + 1 slots allocated above.
            unsafe { arr.add(i).write((&raw const *e.ibv).cast_mut()) };
        }
        // SAFETY: the last slot.
        unsafe { arr.add(list.len()).write(std::ptr::null_mut()) };
        if !num.is_null() {
            // SAFETY: the caller passes NULL or a writable int.
            unsafe { *num = list.len() as c_int };
        }
        arr
    })
}

pub(crate) unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: NULL or an array ibv_get_device_list malloc'd.
    unsafe { libc::free(list.cast()) };
}

pub(crate) unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    guard(std::ptr::null(), || match entry_of(dev) {
        Some((_, e)) => e.ibv.name.as_ptr(),
        None => null_errno::<c_char>(libc::EINVAL),
    })
}

pub(crate) unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    guard(0, || match entry_of(dev) {
        Some((_, e)) => e.cfg.guid().to_be(),
        None => {
            set_errno(libc::EINVAL);
            0
        }
    })
}

pub(crate) unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    guard(-1, || entry_of(dev).map_or(-1, |(i, _)| i as c_int))
}

pub(crate) unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    // There is no sysfs tree for uroce devices.
    null_errno::<c_char>(libc::ENOSYS)
}

pub(crate) unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    // Nothing of uroce lives in sysfs: ibv_devinfo then omits board_id.
    minus_one(libc::ENOENT)
}

/// `UROCE_VENDOR_PART_ID`: a part id to report instead of 0. A test hook:
/// perftest takes its `ibv_wr_*` post path only on device ids it knows
/// (e.g. 4119, ConnectX-5), and the generic (old post) path otherwise.
fn part_id_override() -> Option<u32> {
    static V: OnceLock<Option<u32>> = OnceLock::new();
    *V.get_or_init(|| std::env::var("UROCE_VENDOR_PART_ID").ok()?.parse().ok())
}

/// Fills `ibv_device_attr` from uroce's attributes.
pub(crate) fn device_attr(d: &uroce::DeviceAttr) -> ibv_device_attr {
    // SAFETY: plain C data; all-zero is valid.
    let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
    copy_cstr(&mut a.fw_ver, d.fw_ver);
    a.node_guid = d.node_guid.to_be();
    a.sys_image_guid = d.sys_image_guid.to_be();
    a.max_mr_size = d.max_mr_size;
    a.page_size_cap = d.page_size_cap;
    a.vendor_id = d.vendor_id;
    a.vendor_part_id = part_id_override().unwrap_or(d.vendor_part_id);
    a.hw_ver = d.hw_ver;
    let i = |v: u32| v.min(i32::MAX as u32) as c_int;
    a.max_qp = i(d.max_qp);
    a.max_qp_wr = i(d.max_qp_wr);
    a.device_cap_flags = uroce::limits::DEVICE_CAP_FLAGS;
    a.max_sge = i(d.max_sge);
    a.max_sge_rd = i(d.max_sge);
    a.max_cq = i(d.max_cq);
    a.max_cqe = i(d.max_cqe);
    a.max_mr = i(d.max_mr);
    a.max_pd = i(d.max_pd);
    a.max_qp_rd_atom = i(d.max_qp_rd_atom);
    a.max_res_rd_atom = i(d.max_qp_rd_atom.saturating_mul(d.max_qp));
    a.max_qp_init_rd_atom = i(d.max_qp_init_rd_atom);
    a.atomic_cap = d.atomic_cap.to_ibv();
    a.max_mw = i(d.max_mw);
    a.max_mcast_grp = i(d.max_mcast_grp);
    a.max_mcast_qp_attach = i(d.max_mcast_qp_attach);
    a.max_total_mcast_qp_attach = i(d.max_mcast_grp.saturating_mul(d.max_mcast_qp_attach));
    a.max_ah = i(d.max_ah);
    a.max_srq = i(d.max_srq);
    a.max_srq_wr = i(d.max_srq_wr);
    a.max_srq_sge = i(d.max_srq_sge);
    a.max_pkeys = 1;
    a.local_ca_ack_delay = uroce::limits::LOCAL_CA_ACK_DELAY;
    a.phys_port_cnt = d.phys_port_cnt;
    a
}

pub(crate) unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract (a live context of ours, or NULL).
        let Some(c) = (unsafe { ctx(context) }) else { return libc::EINVAL };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller passes a writable ibv_device_attr.
        unsafe { attr.write(device_attr(&c.uroce().query_device())) };
        0
    })
}

/// `verbs_context.query_device_ex`: the basic attributes, on-demand
/// paging, completion timestamps (a 1 GHz clock, every bit counting),
/// tag matching and device memory; none of the other extended
/// capabilities (TSO, RSS, ...) are reported.
pub(crate) unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract.
        let Some(c) = (unsafe { ctx(context) }) else { return libc::EINVAL };
        // SAFETY: NULL or a readable input struct.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        // SAFETY: the caller gives `attr_size` writable bytes at `attr`.
        unsafe { std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size) };
        let base = device_attr(&c.uroce().query_device());
        // SAFETY: at least sizeof(ibv_device_attr) bytes (checked above).
        unsafe { attr.cast::<ibv_device_attr>().write(base) };
        let d = c.uroce().query_device();
        if attr_size >= std::mem::offset_of!(ibv_device_attr_ex, _ext) {
            // SAFETY: the fields up to `_ext` fit (checked just above).
            unsafe {
                (*attr).odp_caps = [
                    d.odp_general_caps,
                    u64::from(d.odp_rc_caps) | (u64::from(d.odp_uc_caps) << 32),
                    u64::from(d.odp_ud_caps),
                ];
                (*attr).completion_timestamp_mask = d.completion_timestamp_mask;
                (*attr).hca_core_clock = d.hca_core_clock_khz;
                (*attr).device_cap_flags_ex = d.device_cap_flags_ex;
                (*attr).cq_mod_caps = [d.max_cq_count, d.max_cq_period_us];
                // IBV_TM_CAP_RC.
                (*attr).tm_caps =
                    [d.tm_max_rndv_hdr_size, d.tm_max_num_tags, 1, d.tm_max_ops, d.tm_max_sge];
            }
        }
        if attr_size >= std::mem::offset_of!(ibv_device_attr_ex, _ext2) {
            // SAFETY: the fields up to `_ext2` fit (checked just above).
            unsafe { (*attr).max_dm_size = d.max_dm_size };
        }
        if attr_size >= std::mem::offset_of!(ibv_device_attr_ex, phys_port_cnt_ex) {
            // SAFETY: the fields up to `phys_port_cnt_ex` fit.
            unsafe { (*attr).xrc_odp_caps = d.odp_xrc_caps };
        }
        if attr_size >= size_of::<ibv_device_attr_ex>() {
            // SAFETY: the whole struct fits.
            unsafe { (*attr).phys_port_cnt_ex = u32::from(base.phys_port_cnt) };
        }
        0
    })
}

/// `verbs_context.query_rt_values` (`ibv_query_rt_values_ex`): the raw
/// clock is the device clock completion timestamps count, nanoseconds.
pub(crate) unsafe extern "C" fn query_rt_values(
    context: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: verbs contract.
        let Some(c) = (unsafe { ctx(context) }) else { return libc::EINVAL };
        // SAFETY: NULL or the caller's writable values.
        let Some(v) = (unsafe { values.as_mut() }) else { return libc::EINVAL };
        if v.comp_mask & !IBV_VALUES_MASK_RAW_CLOCK != 0 {
            return libc::EINVAL;
        }
        if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
            let ns = c.uroce().clock_ns();
            v.raw_clock.tv_sec = (ns / 1_000_000_000) as libc::time_t;
            v.raw_clock.tv_nsec = (ns % 1_000_000_000) as libc::c_long;
        }
        0
    })
}

/// Port 1's attributes in C form.
fn port_attr(c: &uroce::Context) -> Option<ibv_port_attr> {
    let p = c.query_port(1).ok()?;
    Some(ibv_port_attr {
        state: if p.active { IBV_PORT_ACTIVE } else { IBV_PORT_DOWN },
        max_mtu: p.max_mtu.to_ibv() as c_int,
        active_mtu: p.active_mtu.to_ibv() as c_int,
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: uroce::limits::PORT_CAP_FLAGS,
        max_msg_sz: uroce::limits::MAX_MSG_SZ,
        pkey_tbl_len: p.pkey_tbl_len,
        max_vl_num: 1,
        active_width: p.link.width,
        active_speed: p.link.speed,
        // LinkUp / Disabled.
        phys_state: if p.active { 5 } else { 3 },
        link_layer: IBV_LINK_LAYER_ETHERNET,
        ..ibv_port_attr::default()
    })
}

/// Writes port `port`'s attributes, `len` bytes of them.
fn query_port_into(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: verbs contract.
    let Some(c) = (unsafe { ctx(context) }) else { return libc::EINVAL };
    if attr.is_null() {
        return libc::EINVAL;
    }
    if port != 1 {
        return libc::EINVAL;
    }
    let Some(a) = port_attr(c.uroce()) else { return libc::EINVAL };
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller gives `len` writable bytes: zeroed (a newer
    // header's larger struct), then ours copied in.
    unsafe {
        std::ptr::write_bytes(attr.cast::<u8>(), 0, len);
        std::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), attr.cast::<u8>(), n);
    }
    0
}

/// The exported `ibv_query_port`: old binaries pass the 48-byte
/// `_compat_ibv_port_attr`, so only that much is written.
pub(crate) unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    guard(libc::EIO, || query_port_into(context, port, attr, COMPAT_PORT_ATTR_LEN))
}

/// `verbs_context.query_port`, which the header's `ibv_query_port` macro
/// calls with the full size.
pub(crate) unsafe extern "C" fn query_port(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    guard(libc::EIO, || query_port_into(context, port, attr, len))
}

/// GID `index` of `port`: `Ok(None)` for an empty slot of the table.
fn gid_at(context: *mut ibv_context, port: u8, index: c_int) -> Result<Option<[u8; 16]>, c_int> {
    // SAFETY: verbs contract.
    let c = unsafe { ctx(context) }.ok_or(libc::EINVAL)?;
    if port != 1 || index < 0 {
        return Err(libc::EINVAL);
    }
    c.uroce()
        .gid_entry(1, index as u32)
        .map(|g| g.map(uroce::wire::grh::gid_of))
        .map_err(|_| libc::EINVAL)
}

pub(crate) unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        if gid.is_null() {
            return minus_one(libc::EINVAL);
        }
        match gid_at(context, port, index) {
            Ok(g) => {
                // SAFETY: the caller passes a writable ibv_gid.
                unsafe { (*gid).raw = g.unwrap_or([0; 16]) };
                0
            }
            Err(e) => minus_one(e),
        }
    })
}

/// One GID table entry, or ENODATA for an empty slot.
fn gid_entry(context: *mut ibv_context, port: u8, index: u32) -> Result<ibv_gid_entry, c_int> {
    let g = gid_at(context, port, index as c_int)?.ok_or(libc::ENODATA)?;
    // SAFETY: verbs contract (checked non-NULL by gid_at).
    let c = unsafe { ctx(context) }.ok_or(libc::EINVAL)?;
    Ok(ibv_gid_entry {
        gid: ibv_gid { raw: g },
        gid_index: index,
        port_num: u32::from(port),
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: crate::misc::ifindex_of(c.uroce().device()),
    })
}

pub(crate) unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        if entry.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        let Ok(port) = u8::try_from(port) else { return libc::EINVAL };
        match gid_entry(context, port, index) {
            Ok(e) => {
                // SAFETY: the caller gives `entry_size` ≥ 32 writable bytes.
                unsafe { entry.write(e) };
                0
            }
            Err(e) => e,
        }
    })
}

pub(crate) unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        if entries.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: verbs contract.
        let Some(c) = (unsafe { ctx(context) }) else { return -(libc::EINVAL as isize) };
        let len = c.uroce().query_port(1).map_or(0, |p| p.gid_tbl_len);
        let mut n = 0usize;
        for i in 0..len {
            let Ok(e) = gid_entry(context, 1, i) else { continue };
            if n == max_entries {
                return -(libc::EINVAL as isize);
            }
            // SAFETY: `entries` has max_entries slots of entry_size bytes.
            unsafe { entries.cast::<u8>().add(n * entry_size).cast::<ibv_gid_entry>().write(e) };
            n += 1;
        }
        n as isize
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, used by ibv_devinfo): the
/// sysfs numbering, where RoCE v2 is 1.
pub(crate) unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut u32,
) -> c_int {
    guard(-1, || {
        if ty.is_null() {
            return minus_one(libc::EINVAL);
        }
        match gid_at(context, port, index as c_int) {
            Ok(_) => {
                // SAFETY: the caller passes a writable u32.
                unsafe { *ty = IBV_GID_TYPE_SYSFS_ROCE_V2 };
                0
            }
            Err(e) => minus_one(e),
        }
    })
}

pub(crate) unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: verbs contract.
        if unsafe { ctx(context) }.is_none() || pkey.is_null() || port != 1 || index != 0 {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: the caller passes a writable u16 (network order).
        unsafe { *pkey = uroce::transport::qp::DEFAULT_PKEY.to_be() };
        0
    })
}

pub(crate) unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: verbs contract.
        if unsafe { ctx(context) }.is_none() || port != 1 {
            return minus_one(libc::EINVAL);
        }
        if u16::from_be(pkey) == uroce::transport::qp::DEFAULT_PKEY {
            0
        } else {
            minus_one(libc::ENOENT)
        }
    })
}
