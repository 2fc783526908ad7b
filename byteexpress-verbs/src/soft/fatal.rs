//! Fatal errors of the soft device that no completion reports (`IBV_EVENT_QP_FATAL`,
//! `IBV_EVENT_DEVICE_FATAL`, `ibv_get_async_event(3)`), raised by the test hooks.
//!
//! IBTA 11.6.3 calls them local catastrophic errors: the QP (or every QP of the device) goes
//! to ERR and the error comes as an async event, not as a completion. Here a frozen QP:
//! - is in ERR: its recv CQ stops reading its inbound ring, and its ring refuses the peer's
//!   further claims, so the peer's sends end `RETRY_EXC_ERR` as against a dead responder;
//! - completes none of the WRs outstanding at the fault: they are held, with the memory they
//!   name, and the device touches none of it any more;
//! - after a QP fatal error, [`crate::Qp::to_err`] flushes the held WRs (`WR_FLUSH_ERR`, in
//!   order, sends first), as rdma-core providers flush a QP the application moves to ERR
//!   after the event; WRs posted meanwhile flush as on any QP in ERR;
//! - after a device fatal error nothing completes ever again ("flushes never come"): posts are
//!   taken and never complete, as by hardware that is gone, and `to_err` flushes nothing;
//!   the held WRs go with the QP.
//!   QPs created after the fault work (the device as a driver's reset leaves it).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::ack::Flight;
use super::qp::SoftQp;
use super::ring::ERR_BIT;
use super::send::{Blame, Job};
use crate::provider::QpImpl;
use crate::{AsyncEvent, QpState};

/// The WRs a frozen QP holds, outstanding when the fault came.
#[derive(Debug, Default)]
pub(crate) struct Frozen {
    /// The device failed: nothing completes ever again.
    pub(crate) device_dead: bool,
    flights: VecDeque<Flight>,
    jobs: VecDeque<Job>,
}

impl SoftQp {
    /// The QP fails with a local catastrophic error (module docs): it enters ERR without
    /// completing anything and, unless the whole device failed (`device_dead`, whose caller
    /// raises `DEVICE_FATAL` once), raises `QP_FATAL`. A QP already in ERR or RESET is left
    /// alone (false), except that a device failure also stops its pending flushes.
    // Only the test hooks fail a soft QP this way: the soft provider has no local
    // catastrophic error of its own.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    pub(crate) fn freeze(&self, device_dead: bool) -> bool {
        let mut send = self.send.lock();
        let mut frozen = self.frozen.lock();
        if let Some(f) = frozen.as_mut() {
            f.device_dead |= device_dead;
            return false;
        }
        let was = self.state();
        if matches!(was, QpState::Err | QpState::Reset) {
            if device_dead {
                *frozen = Some(Frozen {
                    device_dead,
                    ..Frozen::default()
                });
            }
            return false;
        }
        self.set_state(QpState::Err);
        self.ring.recv_cons().fetch_or(ERR_BIT, Ordering::AcqRel);
        self.outbound.wait.store(u64::MAX, Ordering::Release);
        send.deferred = None;
        send.tx_timer = None;
        send.tx_since = None;
        send.dead_deadline = None;
        *frozen = Some(Frozen {
            device_dead,
            flights: std::mem::take(&mut send.inflight),
            jobs: std::mem::take(&mut send.pending),
        });
        drop(frozen);
        drop(send);
        if !device_dead {
            self.dev
                .events
                .raise(AsyncEvent::QpFatal { qp_num: self.qpn });
        }
        true
    }

    /// The device failed under this QP: nothing completes, posts included.
    pub(crate) fn device_dead(&self) -> bool {
        self.frozen.lock().as_ref().is_some_and(|f| f.device_dead)
    }

    /// `to_err` of a frozen QP: after a QP fatal error the held WRs are flushed (true: done);
    /// after a device fatal error nothing is (true: done). False: the QP is not frozen.
    pub(crate) fn to_err_frozen(&self) -> bool {
        let mut send = self.send.lock();
        let mut frozen = self.frozen.lock();
        match frozen.as_mut() {
            None => false,
            Some(f) if f.device_dead => true,
            Some(f) => {
                send.inflight = std::mem::take(&mut f.flights);
                send.pending = std::mem::take(&mut f.jobs);
                *frozen = None;
                drop(frozen);
                // The state is ERR already: back to RTS for the flush to run as on a live QP.
                self.set_state(QpState::Rts);
                self.fail_locked(&mut send, None, Blame::Oldest);
                true
            }
        }
    }
}
