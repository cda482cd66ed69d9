//! The connection manager on a tokio runtime (feature `tokio`): a CM
//! event channel whose events are awaited, and the listener and connect
//! calls of [`crate::cm`] as futures.
//!
//! UNSAFE ISLAND (one call): registering the channel's descriptor with
//! tokio's reactor.

use std::io;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::{CmChannel, CmChannelEvent};
use crate::error::{Error, Result};

/// A [`CmChannel`] whose events are awaited.
#[derive(Debug)]
pub struct AsyncCmChannel {
    ch: CmChannel,
    fd: AsyncFd<CmChannel>,
}

impl AsyncCmChannel {
    /// Wraps `ch` (made non-blocking). Must be called within a tokio
    /// runtime with I/O enabled.
    ///
    /// # Errors
    /// I/O errors registering the descriptor.
    pub fn new(ch: CmChannel) -> io::Result<Self> {
        ch.set_nonblocking(true)?;
        // SAFETY: the clone holds the channel's queue, which owns the
        // descriptor, so it stays open (and `as_raw_fd` returns the same
        // number) for as long as the AsyncFd lives.
        let fd = unsafe { AsyncFd::register_with_interest(ch.clone(), Interest::READABLE) }?;
        Ok(Self { ch, fd })
    }

    /// The channel (to route connections and listens to).
    pub fn channel(&self) -> &CmChannel {
        &self.ch
    }

    /// The next event.
    ///
    /// # Errors
    /// An I/O error from the reactor or the descriptor.
    pub async fn next(&self) -> Result<CmChannelEvent> {
        loop {
            let mut guard = self.fd.readable().await.map_err(Error::Io)?;
            match self.ch.get() {
                Ok(e) => return Ok(e),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) => return Err(Error::Io(e)),
            }
        }
    }
}

/// An [`EventChannel`](super::EventChannel) whose events are awaited.
#[derive(Debug)]
pub struct AsyncEventChannel {
    chan: super::EventChannel,
    raw: AsyncCmChannel,
}

impl AsyncEventChannel {
    /// Wraps `chan` (made non-blocking). Must be called within a tokio
    /// runtime with I/O enabled.
    ///
    /// # Errors
    /// I/O errors registering the descriptor.
    pub fn new(chan: super::EventChannel) -> Result<Self> {
        let raw = AsyncCmChannel::new(chan.raw().clone()).map_err(Error::Io)?;
        Ok(Self { chan, raw })
    }

    /// The channel, to create ids on.
    pub fn channel(&self) -> &super::EventChannel {
        &self.chan
    }

    /// The next event.
    ///
    /// # Errors
    /// An I/O error from the reactor or the descriptor.
    pub async fn get_event(&self) -> Result<super::Event> {
        loop {
            let raw = self.raw.next().await?;
            if let Some(e) = self.chan.translate(raw) {
                return Ok(e);
            }
        }
    }
}
