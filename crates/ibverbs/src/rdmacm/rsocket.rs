//! rsockets (`rsocket`, `rsend`, `rpoll`, …): librdmacm's socket-like
//! API over RC QPs is not implemented; each call fails with ENOSYS, so a
//! program linked against it loads and gets a clear error (rsocket
//! preloading users fall back to plain sockets on it).

use std::ffi::c_long;

use crate::ffi::set_errno;

macro_rules! enosys {
    ($($name:ident)*) => {$(
        // Arguments are ignored; every result is an int, ssize_t or off_t.
        pub(crate) unsafe extern "C" fn $name() -> c_long {
            set_errno(libc::ENOSYS);
            -1
        }
    )*};
}

enosys! {
    rpoll raccept rbind rclose rconnect rfcntl rgetpeername rgetsockname rgetsockopt riomap riounmap riowrite rlisten rread rreadv rrecv rrecvfrom rrecvmsg rselect rsend rsendmsg rsendto rsetsockopt rshutdown rsocket rwrite rwritev
}
