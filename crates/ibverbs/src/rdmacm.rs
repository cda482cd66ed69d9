//! `librdmacm.so.1` (the same file as `libibverbs.so.1`): uroce has no RDMA
//! connection manager yet, so every call fails cleanly with ENOSYS. This is
//! enough for programs that import librdmacm but connect over their own
//! TCP exchange (perftest without `-R`/`-z`). `rdma_event_str` works.

use std::ffi::{c_char, c_int, c_void};

use crate::ffi::{minus_one, null_errno};

pub(crate) unsafe extern "C" fn rdma_create_event_channel() -> *mut c_void {
    null_errno(libc::ENOSYS)
}

pub(crate) unsafe extern "C" fn rdma_destroy_event_channel(_channel: *mut c_void) {}

/// Defines `rdma_*` functions returning -1 with `errno = ENOSYS`.
macro_rules! enosys {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            $(let _ = $arg;)*
            minus_one(libc::ENOSYS)
        }
    )*};
}

enosys! {
    rdma_create_id(channel: *mut c_void, id: *mut *mut c_void, context: *mut c_void, ps: c_int);
    rdma_destroy_id(id: *mut c_void);
    rdma_bind_addr(id: *mut c_void, addr: *mut c_void);
    rdma_resolve_addr(id: *mut c_void, src: *mut c_void, dst: *mut c_void, timeout_ms: c_int);
    rdma_resolve_route(id: *mut c_void, timeout_ms: c_int);
    rdma_create_qp(id: *mut c_void, pd: *mut c_void, attr: *mut c_void);
    rdma_create_qp_ex(id: *mut c_void, attr: *mut c_void);
    rdma_connect(id: *mut c_void, param: *mut c_void);
    rdma_listen(id: *mut c_void, backlog: c_int);
    rdma_accept(id: *mut c_void, param: *mut c_void);
    rdma_reject(id: *mut c_void, data: *const c_void, len: u8);
    rdma_disconnect(id: *mut c_void);
    rdma_get_cm_event(channel: *mut c_void, event: *mut *mut c_void);
    rdma_ack_cm_event(event: *mut c_void);
    rdma_set_option(id: *mut c_void, level: c_int, name: c_int, val: *mut c_void, len: usize);
    rdma_migrate_id(id: *mut c_void, channel: *mut c_void);
    rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: *const c_void, res: *mut *mut c_void);
    rdma_establish(id: *mut c_void);
    rdma_init_qp_attr(id: *mut c_void, attr: *mut c_void, mask: *mut c_int);
    rpoll(fds: *mut c_void, nfds: u64, timeout: c_int);
}

pub(crate) unsafe extern "C" fn rdma_destroy_qp(_id: *mut c_void) {}

pub(crate) unsafe extern "C" fn rdma_freeaddrinfo(_res: *mut c_void) {}

pub(crate) unsafe extern "C" fn rdma_get_src_port(_id: *mut c_void) -> u16 {
    0
}

pub(crate) unsafe extern "C" fn rdma_get_dst_port(_id: *mut c_void) -> u16 {
    0
}

pub(crate) unsafe extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static str = match event {
        0 => "RDMA_CM_EVENT_ADDR_RESOLVED\0",
        1 => "RDMA_CM_EVENT_ADDR_ERROR\0",
        2 => "RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        3 => "RDMA_CM_EVENT_ROUTE_ERROR\0",
        4 => "RDMA_CM_EVENT_CONNECT_REQUEST\0",
        5 => "RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        6 => "RDMA_CM_EVENT_CONNECT_ERROR\0",
        7 => "RDMA_CM_EVENT_UNREACHABLE\0",
        8 => "RDMA_CM_EVENT_REJECTED\0",
        9 => "RDMA_CM_EVENT_ESTABLISHED\0",
        10 => "RDMA_CM_EVENT_DISCONNECTED\0",
        11 => "RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        12 => "RDMA_CM_EVENT_MULTICAST_JOIN\0",
        13 => "RDMA_CM_EVENT_MULTICAST_ERROR\0",
        14 => "RDMA_CM_EVENT_ADDR_CHANGE\0",
        15 => "RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => "UNKNOWN EVENT\0",
    };
    s.as_ptr().cast()
}
