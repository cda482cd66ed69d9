//! Errors of the verbs API, each with the errno rdma-core returns for it.

use std::io;

use uroce_transport::{ModifyError, PostError};

/// An error from a verbs call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No device by that name, or no devices configured.
    #[error("no such RDMA device: {0}")]
    NoDevice(String),
    /// The device configuration is malformed.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The backend could not be set up (e.g. the address is in use).
    #[error("cannot open {device} on {addr}: {source}")]
    Open {
        /// Device name.
        device: String,
        /// Address it binds.
        addr: std::net::SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// An argument is out of range or inconsistent (EINVAL).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A device limit would be exceeded (ENOMEM, as providers report it).
    #[error("device limit reached: {0}")]
    Limit(&'static str),
    /// `ibv_modify_qp` refused the attributes (EINVAL).
    #[error(transparent)]
    Modify(#[from] ModifyError),
    /// A post failed at WR `index`; earlier WRs were posted.
    #[error("work request {index} not posted: {error}")]
    Post {
        /// Index of the first WR not posted.
        index: usize,
        /// Why.
        error: PostError,
    },
    /// An access outside a memory region.
    #[error("access outside the memory region")]
    OutOfBounds,
    /// An I/O error from a descriptor (channels, async events).
    #[error(transparent)]
    Io(std::io::Error),
    /// Nothing came within the time allowed (ETIMEDOUT).
    #[error("timed out: {0}")]
    TimedOut(&'static str),
    /// The peer's connection manager refused (ECONNREFUSED): reason 8
    /// means nobody listens on that port, 28 the application refused.
    #[error("connection refused (CM reject reason {reason})")]
    Rejected {
        /// The REJ's reason (IBTA table 109).
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// Already in use (EADDRINUSE): a port listened on twice.
    #[error("in use: {0}")]
    InUse(&'static str),
    /// The address cannot be had (EADDRNOTAVAIL): not this host's, or its
    /// port is bound to the wildcard.
    #[error("address not available: {0}")]
    AddrNotAvailable(&'static str),
    /// A work request completed with an error status (the operations of
    /// [`crate::session`], which wait for their completion, return it).
    #[error("work request failed: {0:?}")]
    Completion(crate::WcStatus),
}

impl Error {
    /// The errno value (positive) rdma-core would report.
    pub fn errno(&self) -> i32 {
        match self {
            Self::NoDevice(_) => libc::ENODEV,
            Self::Config(_) => libc::EINVAL,
            Self::Open { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Self::InvalidArgument(_) | Self::OutOfBounds => libc::EINVAL,
            Self::Limit(_) => libc::ENOMEM,
            Self::Modify(e) => e.errno(),
            Self::Post { error, .. } => error.errno(),
            Self::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Self::TimedOut(_) => libc::ETIMEDOUT,
            Self::Rejected { .. } => libc::ECONNREFUSED,
            Self::InUse(_) => libc::EADDRINUSE,
            Self::AddrNotAvailable(_) => libc::EADDRNOTAVAIL,
            Self::Completion(_) => libc::EIO,
        }
    }
}

/// The verbs API's result type.
pub type Result<T> = std::result::Result<T, Error>;
