//! Cq: a completion queue with its completion channel.

use crate::provider::CqImpl;
use crate::{Result, Wc};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, OnceLock};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A completion queue with its completion channel, driven by tokio.
#[derive(Debug, Clone)]
pub struct Cq {
    pub(crate) inner: Arc<dyn CqImpl>,
    /// Registered with the tokio reactor on first [`Cq::ready`] (creating it needs a runtime).
    pub(crate) fd: Arc<OnceLock<AsyncFd<EventFd>>>,
}

/// The CQ's event fd; holds the CQ so the fd stays open while tokio watches it.
#[derive(Debug)]
pub(crate) struct EventFd(Arc<dyn CqImpl>);

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.event_fd()
    }
}

impl Cq {
    /// Moves up to `out.len()` completions into `out` (`ibv_poll_cq(3)`); returns how many.
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        self.inner.poll(out)
    }

    /// Waits until the CQ may have completions: spins on [`Cq::poll`]-able state for up to
    /// `spin` (hybrid polling; zero = none), then arms the CQ (`ibv_req_notify_cq(3)`) and
    /// sleeps on its completion channel under tokio. Returns at once if completions are queued.
    /// Call [`Cq::poll`] afterwards; a spurious wake-up returns with nothing queued.
    pub async fn ready(&self, spin: std::time::Duration) -> Result<()> {
        if self.inner.spin(spin) {
            return Ok(());
        }
        if self.inner.arm()? {
            return Ok(());
        }
        let fd = match self.fd.get() {
            Some(fd) => fd,
            None => {
                // SAFETY: the fd belongs to the CQ that `EventFd` holds an Arc of, so it stays
                // open and the same for the AsyncFd's whole life.
                let fd = unsafe {
                    AsyncFd::register_with_interest(EventFd(self.inner.clone()), Interest::READABLE)
                }
                .map_err(|e| crate::Error::Os {
                    what: "AsyncFd::register",
                    source: e.into(),
                })?;
                let _ = self.fd.set(fd);
                self.fd.get().expect("set just above")
            }
        };
        let mut guard = fd.readable().await.map_err(|source| crate::Error::Os {
            what: "AsyncFd::readable",
            source,
        })?;
        self.inner.ack_event()?;
        guard.clear_ready();
        Ok(())
    }
}
