//! The rest of what Debian 12's `libibverbs.so.1` exports, so that every
//! program and library linked against it loads (provider libraries link
//! the `IBVERBS_PRIVATE_34` interface):
//!
//! - ECE (`ibv_query_ece`, `ibv_set_ece`): no enhanced connection options
//!   to negotiate: EOPNOTSUPP, what rdma-core returns for such a provider;
//! - the provider interface (`ibv_cmd_*`, `verbs_*`, `execute_ioctl`):
//!   commands for the kernel's uverbs device, which uroce does not use, so
//!   a provider library loaded beside uroce gets EOPNOTSUPP from each (or
//!   NULL with `errno` set; the `void` helpers do nothing);
//! - `ibv_read_ibdev_sysfs_file`, which reads
//!   `/sys/class/infiniband/<dev>/<file>` (present under `uroce run`).

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::ffi::{guard, minus_one, null_errno};

/// Integer-returning stubs: rdma-core's commands return an errno value.
macro_rules! eopnotsupp {
    ($($name:ident)*) => {$(
        pub(crate) unsafe extern "C" fn $name() -> c_int {
            libc::EOPNOTSUPP
        }
    )*};
}

/// Pointer-returning stubs: NULL with `errno` = EOPNOTSUPP.
macro_rules! null_eopnotsupp {
    ($($name:ident)*) => {$(
        pub(crate) unsafe extern "C" fn $name() -> *mut c_void {
            null_errno::<c_void>(libc::EOPNOTSUPP)
        }
    )*};
}

/// `void` helpers with nothing to do here.
macro_rules! nothing {
    ($($name:ident)*) => {$(
        pub(crate) unsafe extern "C" fn $name() {}
    )*};
}

null_eopnotsupp! {
    _verbs_init_and_alloc_context verbs_open_device
}

nothing! {
    ibv_register_driver verbs_register_driver_34 verbs_set_ops verbs_uninit_context __verbs_log
    ibv_copy_path_rec_from_kern ibv_copy_path_rec_to_kern ibv_copy_qp_attr_from_kern
    ibv_copy_ah_attr_from_kern
}

eopnotsupp! {
    ibv_query_ece ibv_set_ece ibv_resolve_eth_l2_from_gid execute_ioctl verbs_init_cq
    ibv_cmd_advise_mr ibv_cmd_alloc_dm ibv_cmd_alloc_mw ibv_cmd_alloc_pd ibv_cmd_attach_mcast
    ibv_cmd_close_xrcd ibv_cmd_create_ah ibv_cmd_create_counters ibv_cmd_create_cq
    ibv_cmd_create_cq_ex ibv_cmd_create_flow ibv_cmd_create_flow_action_esp ibv_cmd_create_qp
    ibv_cmd_create_qp_ex ibv_cmd_create_qp_ex2 ibv_cmd_create_rwq_ind_table ibv_cmd_create_srq
    ibv_cmd_create_srq_ex ibv_cmd_create_wq ibv_cmd_dealloc_mw ibv_cmd_dealloc_pd
    ibv_cmd_dereg_mr ibv_cmd_destroy_ah ibv_cmd_destroy_counters ibv_cmd_destroy_cq
    ibv_cmd_destroy_flow ibv_cmd_destroy_flow_action ibv_cmd_destroy_qp
    ibv_cmd_destroy_rwq_ind_table ibv_cmd_destroy_srq ibv_cmd_destroy_wq ibv_cmd_detach_mcast
    ibv_cmd_free_dm ibv_cmd_get_context ibv_cmd_modify_cq ibv_cmd_modify_flow_action_esp
    ibv_cmd_modify_qp ibv_cmd_modify_qp_ex ibv_cmd_modify_srq ibv_cmd_modify_wq ibv_cmd_open_qp
    ibv_cmd_open_xrcd ibv_cmd_poll_cq ibv_cmd_post_recv ibv_cmd_post_send ibv_cmd_post_srq_recv
    ibv_cmd_query_context ibv_cmd_query_device_any ibv_cmd_query_mr ibv_cmd_query_port
    ibv_cmd_query_qp ibv_cmd_query_srq ibv_cmd_read_counters ibv_cmd_reg_dm_mr
    ibv_cmd_reg_dmabuf_mr ibv_cmd_reg_mr ibv_cmd_req_notify_cq ibv_cmd_rereg_mr
    ibv_cmd_resize_cq
}

/// `__ioctl_final_num_attrs(num_attrs, link)`: the attribute count of a
/// command buffer chain; with no chains built here, the count given.
pub(crate) unsafe extern "C" fn __ioctl_final_num_attrs(num_attrs: u32, _link: *mut c_void) -> u32 {
    num_attrs
}

/// `ibv_read_ibdev_sysfs_file(buf, size, ibdev, fnfmt, ...)`: reads
/// `/sys/class/infiniband/<ibdev>/<file>` into `buf`, without its trailing
/// newline, NUL-terminated; returns the length or -1 with `errno`.
///
/// C-variadic definitions are not stable Rust; on x86-64 the first two
/// integer or pointer arguments after `fnfmt` arrive in the registers
/// named here, which is all rdma-core's own formats use (`%u`, `%d`,
/// `%s`). A format wanting more is refused (EINVAL).
pub(crate) unsafe extern "C" fn ibv_read_ibdev_sysfs_file(
    buf: *mut c_char,
    size: usize,
    ibdev: *const c_char,
    fnfmt: *const c_char,
    arg0: usize,
    arg1: usize,
) -> c_int {
    guard(-1, || {
        if buf.is_null() || size == 0 || ibdev.is_null() || fnfmt.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: NUL-terminated strings from the caller.
        let (dev, fmt) = unsafe { (CStr::from_ptr(ibdev), CStr::from_ptr(fnfmt)) };
        // SAFETY: `%s` arguments are the caller's NUL-terminated strings.
        let Some(file) = format_path(fmt.to_bytes(), [arg0, arg1], |p| unsafe {
            CStr::from_ptr(p as *const c_char).to_string_lossy().into_owned()
        }) else {
            return minus_one(libc::EINVAL);
        };
        let path = format!("/sys/class/infiniband/{}/{file}", dev.to_string_lossy());
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) => return minus_one(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        let text = text.strip_suffix(b"\n").unwrap_or(&text);
        let n = text.len().min(size - 1);
        // SAFETY: the caller's buffer holds `size` bytes; n < size.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
        n as c_int
    })
}

/// Expands `%u`, `%d`, `%x`, `%s` and `%%` in `fmt` with `args` in order;
/// `None` for anything else or more conversions than arguments.
fn format_path(fmt: &[u8], args: [usize; 2], string: impl Fn(usize) -> String) -> Option<String> {
    let mut out = String::new();
    let mut next = args.into_iter();
    let mut bytes = fmt.iter();
    while let Some(&b) = bytes.next() {
        if b != b'%' {
            out.push(b as char);
            continue;
        }
        match bytes.next()? {
            b'%' => out.push('%'),
            b'u' => out.push_str(&(next.next()? as u32).to_string()),
            b'd' => out.push_str(&(next.next()? as u32 as i32).to_string()),
            b'x' => out.push_str(&format!("{:x}", next.next()? as u32)),
            b's' => {
                let p = next.next()?;
                if p == 0 {
                    return None;
                }
                out.push_str(&string(p));
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::format_path;

    #[test]
    fn sysfs_file_formats_expand_as_printf_would() {
        let s = |_: usize| "uverbs0".to_string();
        assert_eq!(
            format_path(b"ports/%u/gid_attrs/types/%u", [1, 3], s).unwrap(),
            "ports/1/gid_attrs/types/3"
        );
        assert_eq!(format_path(b"node_guid", [0, 0], s).unwrap(), "node_guid");
        assert_eq!(format_path(b"device/%s/x%%", [8, 0], s).unwrap(), "device/uverbs0/x%");
        assert_eq!(format_path(b"a/%d", [u32::MAX as usize, 0], s).unwrap(), "a/-1");
        assert!(format_path(b"%u/%u/%u", [1, 2], s).is_none());
        assert!(format_path(b"%lu", [1, 2], s).is_none());
        assert!(format_path(b"%s", [0, 0], s).is_none());
    }
}
