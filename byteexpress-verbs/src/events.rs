//! Asynchronous events of a device (`ibv_get_async_event(3)`), fanned out to every subscriber.
//!
//! rdma-core hands each event to one reader of the context's async fd; this crate reads them
//! (and acknowledges them at once, so no `ibv_destroy_*` waits on an unacknowledged event) into
//! an [`EventHub`] that copies each event into the queue of every live [`AsyncEvents`]: several
//! parts of a program (or several tests sharing one device) each see every event raised after
//! they subscribed. The soft provider raises its events straight into its hub.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use crate::provider::ContextImpl;
use crate::{AsyncEvent, Error, Result};

/// Events a subscriber may have queued; older ones are dropped beyond it (and counted).
const MAX_QUEUED: usize = 4096;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A process-wide unique id for a CQ or an SRQ (what [`AsyncEvent`]s name them by).
pub(crate) fn next_object_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<AsyncEvent>,
    dropped: u64,
}

/// One subscriber's queue.
#[derive(Debug, Default)]
pub(crate) struct Sub {
    q: Mutex<Queue>,
    notify: Notify,
}

/// The subscribers of one device context.
#[derive(Debug, Default)]
pub(crate) struct EventHub {
    subs: Mutex<Vec<Weak<Sub>>>,
}

impl EventHub {
    /// Copies `ev` to every live subscriber and wakes them. Never blocks on a subscriber.
    pub(crate) fn raise(&self, ev: AsyncEvent) {
        tracing::debug!("async event {ev:?}");
        let subs: Vec<Arc<Sub>> = {
            let mut s = self.subs.lock();
            s.retain(|w| w.strong_count() > 0);
            s.iter().filter_map(Weak::upgrade).collect()
        };
        for sub in subs {
            {
                let mut q = sub.q.lock();
                if q.events.len() >= MAX_QUEUED {
                    q.events.pop_front();
                    q.dropped += 1;
                }
                q.events.push_back(ev);
            }
            sub.notify.notify_waiters();
        }
    }

    fn subscribe(&self) -> Arc<Sub> {
        let sub = Arc::new(Sub::default());
        let mut s = self.subs.lock();
        s.retain(|w| w.strong_count() > 0);
        s.push(Arc::downgrade(&sub));
        sub
    }
}

/// A subscription to a device's asynchronous events, from [`crate::Context::async_events`]:
/// every event the device raises after the subscription was made, in order
/// (`ibv_get_async_event(3)`; events are acknowledged by this crate as they are read).
///
/// If the subscriber falls more than 4096 events behind, the oldest are dropped and counted in
/// [`AsyncEvents::dropped`].
#[derive(Debug)]
pub struct AsyncEvents {
    ctx: Arc<dyn ContextImpl>,
    sub: Arc<Sub>,
    /// This subscription's own duplicate of the device's async fd, registered with the tokio
    /// reactor on first [`AsyncEvents::next`] (several subscriptions may wait in one runtime).
    fd: Option<AsyncFd<OwnedFd>>,
}

impl AsyncEvents {
    pub(crate) fn new(ctx: Arc<dyn ContextImpl>) -> Result<AsyncEvents> {
        // Events already pending on the device belong to earlier subscribers.
        ctx.pump_events()?;
        let sub = ctx.events().subscribe();
        Ok(AsyncEvents { ctx, sub, fd: None })
    }

    fn pop(&self) -> Option<AsyncEvent> {
        self.sub.q.lock().events.pop_front()
    }

    /// The next event if one is queued, without waiting.
    pub fn try_next(&mut self) -> Result<Option<AsyncEvent>> {
        if let Some(e) = self.pop() {
            return Ok(Some(e));
        }
        self.ctx.pump_events()?;
        Ok(self.pop())
    }

    /// Waits under tokio for the next event.
    pub async fn next(&mut self) -> Result<AsyncEvent> {
        loop {
            if let Some(e) = self.try_next()? {
                return Ok(e);
            }
            let notified = self.sub.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(e) = self.pop() {
                return Ok(e);
            }
            if self.fd.is_none()
                && let Some(raw) = self.ctx.async_fd()
            {
                // SAFETY: `raw` is the device's async fd, open while `self.ctx` lives; dup
                // returns a new fd (or -1, checked) that the OwnedFd then owns alone.
                let dup = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, 0) };
                if dup < 0 {
                    return Err(Error::last_os("dup of the async event fd"));
                }
                // SAFETY: `dup` was just created and is owned by nothing else.
                let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dup) };
                // SAFETY: the AsyncFd owns `owned`, so the fd stays open and the same for the
                // registration's whole life.
                let afd = unsafe {
                    AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE)
                }
                .map_err(|source| Error::Os {
                    what: "AsyncFd::register (async event fd)",
                    source: source.into(),
                })?;
                self.fd = Some(afd);
            }
            match &self.fd {
                None => notified.await,
                Some(afd) => {
                    std::future::poll_fn(|cx| {
                        if notified.as_mut().poll(cx).is_ready() {
                            return std::task::Poll::Ready(Ok(()));
                        }
                        match afd.poll_read_ready(cx) {
                            std::task::Poll::Ready(Ok(mut g)) => {
                                // Cleared before the next pump: data arriving later re-arms it.
                                g.clear_ready();
                                std::task::Poll::Ready(Ok(()))
                            }
                            std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Err(e)),
                            std::task::Poll::Pending => std::task::Poll::Pending,
                        }
                    })
                    .await
                    .map_err(|source| Error::Os {
                        what: "AsyncFd::readable (async event fd)",
                        source,
                    })?;
                }
            }
        }
    }

    /// Events dropped because this subscriber fell more than 4096 behind.
    pub fn dropped(&self) -> u64 {
        self.sub.q.lock().dropped
    }
}
