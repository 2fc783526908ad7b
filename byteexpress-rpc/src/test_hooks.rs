//! Test-only fault injection (cargo feature `test-hooks`; without it nothing here can be
//! switched on and the engine's checks compile to nothing).
//!
//! Faults belong to one link, never to the process: a [`LinkFaults`] handle is owned by its
//! link (as eRPC keeps its faults on one `Rpc`). A client reaches its link's handle with
//! `Client::link_faults`, a server handler with `ServerRequest::link_faults` (the test
//! server's `/test.Test/StallReposts` and `/test.Test/FailQp` are the named controls that
//! multi-process tests drive).
//!
//! - [`LinkFaults::stall_reposts`]: the link stops re-posting receive buffers for a while:
//!   received messages are still delivered, but the buffers they consumed are held, so no
//!   credits flow back to the peer, which must wait (backpressure) instead of sending into a
//!   receive queue with nothing posted (RNR). When the stall ends the link re-posts everything
//!   it held and returns the credits.
//! - [`LinkFaults::inject_qp_error`]: the link's QP fails as on a transport fault, which the
//!   link answers by falling back to TCP (DESIGN.md 3.5, "Link life").
//! - [`LinkFaults::inject_qp_fatal`], [`LinkFaults::inject_device_fatal`]: the link's QP, or
//!   its whole device, fails with an error no completion reports, only an async event, which
//!   the link answers by falling back too.

#[cfg(feature = "test-hooks")]
pub use faults::{LinkFaults, UnaskedReprobe};

/// Bytes charged to the shared window of RDMA device `device` in this process (SENDs and
/// READs posted and not yet completed, over all its links): 0 once every link of the device is
/// idle, whatever failed on the way (an observation for tests, not a fault).
#[cfg(feature = "test-hooks")]
pub fn device_window_in_flight(device: &str) -> u64 {
    crate::engine::rdma::device_window(device, 0)
        .lock()
        .in_flight()
}

#[cfg(feature = "test-hooks")]
mod faults {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use byteexpress_verbs::Qp;

    use crate::message::Outgoing;
    use crate::wire::header::{Header, Kind};

    /// A re-probe message a broken or hostile peer sends unasked
    /// ([`LinkFaults::send_unasked`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum UnaskedReprobe {
        /// An empty SWITCH, though no re-probe was agreed.
        Switch,
        /// A REPROBE whose body is 64 KiB of zeros (a set-up message is far smaller).
        Oversized,
    }

    /// The faults of one link; cheap to clone (clones share the link's faults).
    #[derive(Debug, Clone, Default)]
    pub struct LinkFaults {
        inner: Arc<Inner>,
    }

    #[derive(Debug, Default)]
    struct Inner {
        /// End of the stall in progress, if any.
        stall_until: parking_lot::Mutex<Option<Instant>>,
        held: AtomicU64,
        /// The link's QP now (RDMA; replaced at a re-probe).
        qp: parking_lot::Mutex<Option<Qp>>,
        /// Re-probes fail while set (the path stays down).
        reprobes_blocked: std::sync::atomic::AtomicBool,
        /// The link's outgoing queue, for [`LinkFaults::send_unasked`].
        raw: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<Outgoing>>,
    }

    impl LinkFaults {
        /// Stops re-posting receive buffers on this link for `d` from now (replacing any
        /// stall in progress). No effect on a TCP link.
        pub fn stall_reposts(&self, d: Duration) {
            *self.inner.stall_until.lock() = Some(Instant::now() + d);
        }

        /// Receive buffers this link held back by stalls so far (unit: buffers).
        pub fn held_reposts(&self) -> u64 {
            self.inner.held.load(Ordering::SeqCst)
        }

        /// Fails the link's QP as a transport fault would: through the verbs provider's own
        /// per-QP fault hook where it has one (the soft provider: the oldest send WR ends
        /// `RETRY_EXC_ERR`, the rest flush, the peer's sends time out), else by moving the QP
        /// to ERR (every WR flushed). False when the link has no QP (TCP, or in fallback).
        pub fn inject_qp_error(&self) -> bool {
            let Some(qp) = self.inner.qp.lock().clone() else {
                return false;
            };
            if byteexpress_verbs::test_hooks::inject_qp_error(&qp) {
                return true;
            }
            qp.to_err().is_ok()
        }

        /// Fails the link's QP with a local catastrophic error, through the verbs provider's
        /// per-QP hook: the QP enters ERR, completes nothing, and its device raises
        /// `QP_FATAL` for it (`ibv_get_async_event(3)`), which the link answers by falling
        /// back. False when the link has no QP or the provider has no such hook.
        pub fn inject_qp_fatal(&self) -> bool {
            let Some(qp) = self.inner.qp.lock().clone() else {
                return false;
            };
            byteexpress_verbs::test_hooks::inject_qp_fatal(&qp)
        }

        /// Fails the device the link's QP lives on (`DEVICE_FATAL`), through the verbs
        /// provider's per-device hook: every QP of it, in this process, enters ERR and never
        /// completes anything again, not even a flush. False when the link has no QP or the
        /// provider has no such hook.
        pub fn inject_device_fatal(&self) -> bool {
            let Some(qp) = self.inner.qp.lock().clone() else {
                return false;
            };
            byteexpress_verbs::test_hooks::inject_device_fatal_under(&qp)
        }

        /// While `blocked`, this link's re-probes fail as if the path to the peer were still
        /// down (the client's side starts them; set it there). Fallback and backoff go on.
        pub fn block_reprobes(&self, blocked: bool) {
            self.inner.reprobes_blocked.store(blocked, Ordering::SeqCst);
        }

        /// Queues `what` on this link as its next message to the peer (over TCP when the link
        /// is in fallback), as a broken or hostile peer would send it. False when the link is
        /// gone.
        pub fn send_unasked(&self, what: UnaskedReprobe) -> bool {
            let Some(tx) = self.inner.raw.get() else {
                return false;
            };
            let (kind, body) = match what {
                UnaskedReprobe::Switch => (Kind::Switch, Vec::new()),
                UnaskedReprobe::Oversized => (Kind::Reprobe, vec![0u8; 64 << 10]),
            };
            let mut header = Header::new(kind);
            header.call_id = 1;
            tx.send(Outgoing {
                header,
                meta: Vec::new(),
                body: body.into(),
            })
            .is_ok()
        }

        pub(crate) fn set_raw(&self, tx: tokio::sync::mpsc::UnboundedSender<Outgoing>) {
            let _ = self.inner.raw.set(tx);
        }

        pub(crate) fn reprobes_blocked(&self) -> bool {
            self.inner.reprobes_blocked.load(Ordering::SeqCst)
        }

        pub(crate) fn set_qp(&self, qp: Option<Qp>) {
            *self.inner.qp.lock() = qp;
        }

        pub(crate) fn stalled_until(&self) -> Option<Instant> {
            let mut g = self.inner.stall_until.lock();
            match *g {
                Some(t) if t > Instant::now() => Some(t),
                Some(_) => {
                    *g = None;
                    None
                }
                None => None,
            }
        }

        pub(crate) fn count_held(&self) {
            self.inner.held.fetch_add(1, Ordering::SeqCst);
        }
    }
}
