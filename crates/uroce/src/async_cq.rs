//! Completions as futures on a tokio runtime (feature `tokio`).
//!
//! UNSAFE ISLAND (one call): registering the channel descriptor with
//! tokio's reactor.
//!
//! An [`AsyncCq`] owns a CQ created on a completion channel and registers
//! the channel's descriptor with tokio's reactor. `next().await` polls the
//! CQ, arms it, polls again (closing the race with completions that
//! arrived before arming) and only then waits for the descriptor.

use std::io;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::channel::CompChannel;
use crate::error::{Error, Result};
use crate::verbs::Cq;
use crate::{Completion, WcOpcode, WcStatus};

/// A CQ whose completions are awaited.
pub struct AsyncCq {
    cq: Cq,
    channel: CompChannel,
    fd: AsyncFd<CompChannel>,
}

impl std::fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AsyncCq({:?})", self.cq)
    }
}

impl AsyncCq {
    /// Wraps `cq`, which must have been created on `channel`. Must be
    /// called within a tokio runtime with I/O enabled. The channel is made
    /// non-blocking. Progress must come from the context's progress thread
    /// (the default [`crate::ProgressMode::Thread`]).
    ///
    /// # Errors
    /// I/O errors registering the descriptor.
    pub fn new(cq: Cq, channel: CompChannel) -> io::Result<Self> {
        channel.set_nonblocking(true)?;
        // SAFETY: the clone holds the channel's event queue, which owns the
        // descriptor, so it stays open (and `as_raw_fd` returns the same
        // number) for as long as the AsyncFd lives.
        let fd = unsafe { AsyncFd::register_with_interest(channel.clone(), Interest::READABLE) }?;
        Ok(Self { cq, channel, fd })
    }

    /// The CQ.
    pub fn cq(&self) -> &Cq {
        &self.cq
    }

    fn try_one(&self) -> Result<Option<Completion>> {
        let mut wc = [Completion::new(0, WcStatus::Success, WcOpcode::Send, 0, false)];
        Ok((self.cq.poll(&mut wc)? == 1).then_some(wc[0]))
    }

    /// The next completion.
    ///
    /// # Errors
    /// As [`Cq::poll`], or an I/O error from the reactor.
    pub async fn next(&mut self) -> Result<Completion> {
        loop {
            if let Some(c) = self.try_one()? {
                return Ok(c);
            }
            self.cq.req_notify(false)?;
            if let Some(c) = self.try_one()? {
                return Ok(c);
            }
            let mut guard = self.fd.readable().await.map_err(Error::Io)?;
            match self.channel.get_event() {
                Ok(_) => self.cq.ack_events(1),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(source) => return Err(Error::Io(source)),
            }
        }
    }
}
