//! Completion queues with a completion channel each (`ibv_create_comp_channel(3)`,
//! `ibv_create_cq(3)`), polled with `ibv_poll_cq(3)` and armed with `ibv_req_notify_cq(3)`.
//!
//! `pending()` must answer without losing completions, so it polls into a small buffer that
//! `poll()` empties first; one mutex orders both, so completions come out in CQ order.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rdma_mummy_sys as sys;

use super::context::IbvContext;
use super::{convert, os_err};
use crate::provider::CqImpl;
use crate::{Result, Wc};

/// `ibv_wc`s read per `ibv_poll_cq` call.
const BATCH: usize = 16;

/// A CQ and its own completion channel (whose fd is non-blocking).
#[derive(Debug)]
pub(crate) struct IbvCq {
    me: Weak<IbvCq>,
    cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    fd: std::os::fd::RawFd,
    pub(crate) ctx: Arc<IbvContext>,
    /// Polled by `pending`, not yet returned by `poll`.
    buf: Mutex<VecDeque<Wc>>,
}

// SAFETY: `ibv_poll_cq`, `ibv_req_notify_cq` and the completion channel calls are thread-safe
// (the provider locks the CQ; the channel is a file descriptor); this type also serialises its
// own polling with `buf`'s mutex. Both objects are destroyed once, in Drop, after every QP that
// uses the CQ (QPs hold Arcs of it).
unsafe impl Send for IbvCq {}
// SAFETY: as for Send.
unsafe impl Sync for IbvCq {}

impl IbvCq {
    pub(crate) fn create(ctx: Arc<IbvContext>, cqe: u32) -> Result<Arc<IbvCq>> {
        // SAFETY: the context is open while `ctx` lives.
        let channel = unsafe { sys::ibv_create_comp_channel(ctx.raw()) };
        if channel.is_null() {
            return Err(os_err("ibv_create_comp_channel", None));
        }
        // SAFETY: `channel` was just created and is valid.
        let fd = unsafe { (*channel).fd };
        let destroy_channel = || {
            // SAFETY: no CQ uses the channel (creating it failed or it is destroyed already).
            unsafe { sys::ibv_destroy_comp_channel(channel) };
        };
        // SAFETY: `fd` is the channel's open fd; F_GETFL/F_SETFL change only its flags.
        let nonblock = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !nonblock {
            let e = os_err("fcntl(O_NONBLOCK) on the completion channel", None);
            destroy_channel();
            return Err(e);
        }
        let n = libc::c_int::try_from(cqe).unwrap_or(libc::c_int::MAX);
        // SAFETY: the context and channel are valid; no cq_context is used.
        let cq = unsafe { sys::ibv_create_cq(ctx.raw(), n, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = os_err("ibv_create_cq", None);
            destroy_channel();
            return Err(e);
        }
        Ok(Arc::new_cyclic(|me| IbvCq {
            me: me.clone(),
            cq,
            channel,
            fd,
            ctx,
            buf: Mutex::new(VecDeque::new()),
        }))
    }

    /// The CQ behind a provider-neutral handle, if it is an rdma-core CQ.
    pub(crate) fn from_dyn(cq: &Arc<dyn CqImpl>) -> Option<Arc<IbvCq>> {
        cq.as_any().downcast_ref::<IbvCq>()?.me.upgrade()
    }

    /// The raw CQ, valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut sys::ibv_cq {
        self.cq
    }

    /// Polls up to `max` (≤ [`BATCH`]) completions from the device into `out`.
    fn poll_device(&self, max: usize, out: &mut impl Extend<Wc>) -> Result<usize> {
        // SAFETY: ibv_wc is plain C data; all-zero is a valid value.
        let mut raw: [sys::ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        let max = max.min(BATCH);
        // SAFETY: the CQ is valid; `raw` has room for `max` entries.
        let n = unsafe { sys::ibv_poll_cq(self.cq, max as i32, raw.as_mut_ptr()) };
        let n = usize::try_from(n).map_err(|_| os_err("ibv_poll_cq", Some(n.saturating_neg())))?;
        out.extend(raw[..n.min(max)].iter().map(convert::wc));
        Ok(n)
    }

    /// Reads and acknowledges every completion event queued on the channel
    /// (`ibv_get_cq_event(3)`, `ibv_ack_cq_events(3)`); none queued is fine.
    fn drain_events(&self) -> Result<()> {
        loop {
            let mut cq = std::ptr::null_mut();
            let mut cq_ctx = std::ptr::null_mut();
            // SAFETY: the channel is valid and its fd non-blocking; both out-pointers are valid.
            let rc = unsafe { sys::ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(()),
                    _ => Err(crate::Error::Os {
                        what: "ibv_get_cq_event",
                        source: e,
                    }),
                };
            }
            // SAFETY: `cq` is the CQ the event was for (ours: the channel is ours alone); one
            // event was read, one is acknowledged.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
        }
    }
}

impl Drop for IbvCq {
    fn drop(&mut self) {
        // ibv_destroy_cq(3) waits for every event read to be acknowledged: drain first.
        if let Err(e) = self.drain_events() {
            tracing::warn!("draining CQ events before destroy: {e}");
        }
        // SAFETY: created in `create`, destroyed once; no QP uses it any more (they hold Arcs).
        let rc = unsafe { sys::ibv_destroy_cq(self.cq) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_cq: {}", std::io::Error::from_raw_os_error(rc));
        }
        // SAFETY: the only CQ on the channel is destroyed just above.
        let rc = unsafe { sys::ibv_destroy_comp_channel(self.channel) };
        if rc != 0 {
            tracing::warn!(
                "ibv_destroy_comp_channel: {}",
                std::io::Error::from_raw_os_error(rc)
            );
        }
    }
}

impl CqImpl for IbvCq {
    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        let mut buf = self.buf.lock();
        let mut n = 0;
        while n < out.len() {
            match buf.pop_front() {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        while n < out.len() {
            let want = (out.len() - n).min(BATCH);
            let got = self.poll_device(want, &mut *buf)?;
            for wc in buf.drain(..) {
                out[n] = wc;
                n += 1;
            }
            if got < want {
                break;
            }
        }
        Ok(n)
    }

    fn pending(&self) -> bool {
        let mut buf = self.buf.lock();
        if !buf.is_empty() {
            return true;
        }
        // An error here shows again, as an error, on the next poll.
        self.poll_device(BATCH, &mut *buf).is_ok_and(|n| n > 0)
    }

    fn event_fd(&self) -> std::os::fd::RawFd {
        self.fd
    }

    fn arm(&self) -> Result<bool> {
        // SAFETY: the CQ is valid; 0 = notify on any completion.
        let rc = unsafe { sys::ibv_req_notify_cq(self.cq, 0) };
        if rc != 0 {
            return Err(os_err("ibv_req_notify_cq", Some(rc)));
        }
        // A completion queued before arming raises no event: look once more.
        Ok(self.pending())
    }

    fn ack_event(&self) -> Result<()> {
        self.drain_events()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
