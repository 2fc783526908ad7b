//! Completion queues with a completion channel each (`ibv_create_comp_channel(3)`,
//! `ibv_create_cq(3)`), polled with `ibv_poll_cq(3)` and armed with `ibv_req_notify_cq(3)`.
//!
//! `pending()` must answer without losing completions, so it polls into a small buffer that
//! `poll()` empties first; one mutex orders both, so completions come out in CQ order.
//! Device completions pass through the QP's [`Ledger`], which restores the caller's `wr_id`
//! and adds the flush completions of WRs posted in ERR. Those raise no completion event, so
//! the CQ's event fd is an epoll set of the channel's fd and an eventfd rung for them.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use rdma_mummy_sys as sys;

use super::context::IbvContext;
use super::ledger::{Ledger, Wq};
use super::{convert, os_err};
use crate::provider::CqImpl;
use crate::{Result, Wc};

/// `ibv_wc`s read per `ibv_poll_cq` call.
const BATCH: usize = 16;

/// A CQ and its own completion channel (whose fd is non-blocking).
#[derive(Debug)]
pub(crate) struct IbvCq {
    me: Weak<IbvCq>,
    id: u64,
    cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    /// epoll set of the channel's fd and `wake`: readable when either is.
    epfd: OwnedFd,
    /// Rung when flush completions of WRs posted in ERR are queued.
    wake: OwnedFd,
    pub(crate) ctx: Arc<IbvContext>,
    /// Polled by `pending`, not yet returned by `poll`.
    buf: Mutex<VecDeque<Wc>>,
    /// The ledgers of the QPs that complete here, by QP number.
    ledgers: RwLock<HashMap<u32, Arc<Ledger>>>,
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
        let fds = event_fds(fd);
        let (epfd, wake) = match fds {
            Ok(f) => f,
            Err(e) => {
                destroy_channel();
                return Err(e);
            }
        };
        let n = libc::c_int::try_from(cqe).unwrap_or(libc::c_int::MAX);
        let id = crate::events::next_object_id();
        // SAFETY: the context and channel are valid; cq_context carries the id (read back
        // from async events naming this CQ), never dereferenced.
        let cq = unsafe {
            sys::ibv_create_cq(ctx.raw(), n, id as usize as *mut libc::c_void, channel, 0)
        };
        if cq.is_null() {
            let e = os_err("ibv_create_cq", None);
            destroy_channel();
            return Err(e);
        }
        Ok(Arc::new_cyclic(|me| IbvCq {
            me: me.clone(),
            id,
            cq,
            channel,
            epfd,
            wake,
            ctx,
            buf: Mutex::new(VecDeque::new()),
            ledgers: RwLock::new(HashMap::new()),
        }))
    }

    /// Completions of QP `qpn` go through `ledger` from now on.
    pub(crate) fn register(&self, qpn: u32, ledger: Arc<Ledger>) {
        self.ledgers.write().insert(qpn, ledger);
    }

    /// The QP of `ledger` is gone; its late completions are dropped.
    pub(crate) fn unregister(&self, qpn: u32, ledger: &Arc<Ledger>) {
        let mut map = self.ledgers.write();
        if map.get(&qpn).is_some_and(|l| Arc::ptr_eq(l, ledger)) {
            map.remove(&qpn);
        }
    }

    /// Queues the flush completions now at the front of `wq` of `ledger` and wakes a sleeper.
    pub(crate) fn emit_flushed(&self, ledger: &Ledger, wq: Wq) {
        let n = ledger.emit_flushed(wq, &mut self.buf.lock());
        if n > 0 {
            let one = 1u64.to_ne_bytes();
            // SAFETY: `wake` is an open eventfd; the buffer holds 8 bytes.
            let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }

    /// The CQ behind a provider-neutral handle, if it is an rdma-core CQ.
    pub(crate) fn from_dyn(cq: &Arc<dyn CqImpl>) -> Option<Arc<IbvCq>> {
        cq.as_any().downcast_ref::<IbvCq>()?.me.upgrade()
    }

    /// The raw CQ, valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut sys::ibv_cq {
        self.cq
    }

    /// Polls up to `max` (≤ [`BATCH`]) completions from the device and appends what their
    /// QPs' ledgers make of them to `out`; returns how many the device gave.
    fn poll_device(&self, max: usize, out: &mut VecDeque<Wc>) -> Result<usize> {
        // SAFETY: ibv_wc is plain C data; all-zero is a valid value.
        let mut raw: [sys::ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        let max = max.min(BATCH);
        // SAFETY: the CQ is valid; `raw` has room for `max` entries.
        let n = unsafe { sys::ibv_poll_cq(self.cq, max as i32, raw.as_mut_ptr()) };
        let n = usize::try_from(n).map_err(|_| os_err("ibv_poll_cq", Some(n.saturating_neg())))?;
        let ledgers = self.ledgers.read();
        for w in &raw[..n.min(max)] {
            match ledgers.get(&w.qp_num) {
                Some(l) => l.complete(convert::wc(w, self.ctx.rxe), out),
                None => tracing::debug!("completion of destroyed QP {:#x} dropped", w.qp_num),
            }
        }
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

/// An epoll set watching the channel's fd `channel_fd` and a new eventfd (both level-triggered
/// readable), and that eventfd.
fn event_fds(channel_fd: std::os::fd::RawFd) -> Result<(OwnedFd, OwnedFd)> {
    // SAFETY: plain syscall; the result is checked.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(os_err("epoll_create1", None));
    }
    // SAFETY: `ep` was just created and is owned by nothing else.
    let ep = unsafe { OwnedFd::from_raw_fd(ep) };
    // SAFETY: plain syscall; the result is checked.
    let ev = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if ev < 0 {
        return Err(os_err("eventfd", None));
    }
    // SAFETY: `ev` was just created and is owned by nothing else.
    let ev = unsafe { OwnedFd::from_raw_fd(ev) };
    for fd in [channel_fd, ev.as_raw_fd()] {
        let mut e = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: both fds are open; `e` is a valid event.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut e) } != 0 {
            return Err(os_err("epoll_ctl", None));
        }
    }
    Ok((ep, ev))
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
        let len = out.len();
        let mut n = 0;
        let mut take = |buf: &mut VecDeque<Wc>, n: &mut usize| {
            while *n < len {
                let Some(wc) = buf.pop_front() else { break };
                out[*n] = wc;
                *n += 1;
            }
        };
        take(&mut buf, &mut n);
        while n < len {
            let want = (len - n).min(BATCH);
            let got = self.poll_device(want, &mut buf)?;
            take(&mut buf, &mut n);
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
        let _ = self.poll_device(BATCH, &mut buf);
        !buf.is_empty()
    }

    fn event_fd(&self) -> std::os::fd::RawFd {
        self.epfd.as_raw_fd()
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

    fn id(&self) -> u64 {
        self.id
    }

    fn ack_event(&self) -> Result<()> {
        let mut v = [0u8; 8];
        // SAFETY: `wake` is an open non-blocking eventfd; `v` has room for its 8-byte counter.
        let _ = unsafe { libc::read(self.wake.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
        self.drain_events()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
