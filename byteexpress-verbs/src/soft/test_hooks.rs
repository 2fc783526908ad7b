//! Fault injection for tests (feature `test-hooks`): plays a hostile peer by writing bogus
//! values into a QP's shared ring, as a broken peer process could; fails one QP as a
//! transport fault would; raises the fatal errors no completion reports (QP_FATAL for one
//! QP, DEVICE_FATAL for the device, [`super::fatal`]).

use std::sync::atomic::Ordering;

use crate::Qp;

/// An index of a QP's ring that its peer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingIndex {
    /// Producer index of the QP's inbound completion ring (the peer's sender advances it).
    InboundCompletionProducer,
    /// Consumer index of the QP's receive ring (the peer's sender claims WQEs with it).
    ReceiveConsumer,
}

/// Overwrites `which` in `qp`'s own ring with `value`, as a hostile peer could. False when
/// `qp` is not a soft QP of this process.
pub fn corrupt_ring_index(qp: &Qp, which: RingIndex, value: u64) -> bool {
    let Some(q) = soft_qp(qp) else {
        return false;
    };
    let word = match which {
        RingIndex::InboundCompletionProducer => q.ring.comp_prod(),
        RingIndex::ReceiveConsumer => q.ring.recv_cons(),
    };
    word.store(value, Ordering::Release);
    true
}

/// The provider's QP behind `qp`, held alive as a CQ poll or the device's progress thread
/// holds it for a moment; dropping the guard releases it.
#[derive(Debug)]
pub struct ProviderHold(#[allow(dead_code)] std::sync::Arc<super::qp::SoftQp>);

/// Holds `qp`'s provider QP past the drop of every [`Qp`] handle (see [`ProviderHold`]).
/// `None` when `qp` is not a soft QP of this process.
pub fn hold_provider_qp(qp: &Qp) -> Option<ProviderHold> {
    soft_qp(qp).map(ProviderHold)
}

/// Fails `qp` as a transport fault would (a dead path, a port down): its oldest outstanding
/// send WR completes with `RETRY_EXC_ERR`, every other WR is flushed (`WR_FLUSH_ERR`, sends
/// first), the QP enters ERR, and its ring refuses the peer's further claims, so the peer's
/// sends time out with `RETRY_EXC_ERR` as against a dead responder. Per QP: no other QP of the
/// process is touched. False when `qp` is not a soft QP of this process (another provider's
/// QP with the same number included).
pub fn inject_qp_error(qp: &Qp) -> bool {
    // The same QP, not another provider's QP with the same number.
    let Some(q) = soft_qp(qp) else {
        return false;
    };
    q.ring
        .recv_cons()
        .fetch_or(super::ring::ERR_BIT, Ordering::AcqRel);
    let mut send = q.send.lock();
    q.fail_locked(
        &mut send,
        Some(crate::WcStatus::RetryExcErr),
        super::send::Blame::Oldest,
    );
    true
}

/// The soft QP behind `qp`: the same QP, not another provider's QP with the same number.
fn soft_qp(qp: &Qp) -> Option<std::sync::Arc<super::qp::SoftQp>> {
    let dev = super::device::opened()?;
    let q = dev
        .qps
        .lock()
        .get(&qp.qp_num())
        .and_then(std::sync::Weak::upgrade)?;
    std::ptr::addr_eq(
        std::sync::Arc::as_ptr(&qp.inner),
        std::sync::Arc::as_ptr(&q),
    )
    .then_some(q)
}

/// Fails `qp` with a local catastrophic error (`IBV_EVENT_QP_FATAL`, IBTA 11.6.3): the QP
/// enters ERR, raises `QP_FATAL` on its device's async events, and completes none of its
/// outstanding WRs until [`Qp::to_err`] flushes them; the peer's sends time out
/// (`RETRY_EXC_ERR`). Per QP: no other QP is touched. False when `qp` is not a live soft QP
/// of this process (or is already in ERR or RESET).
pub fn inject_qp_fatal(qp: &Qp) -> bool {
    soft_qp(qp).is_some_and(|q| q.freeze(false))
}

/// Fails the device of `ctx` (`IBV_EVENT_DEVICE_FATAL`): every QP it has now enters ERR with
/// nothing completed, ever (no flush either: posts are taken and never complete, `to_err`
/// flushes nothing),
/// and `DEVICE_FATAL` is raised on its async events. QPs created afterwards work (the device
/// as a reset leaves it). False when `ctx` is not this process's soft device.
pub fn inject_device_fatal(ctx: &crate::Context) -> bool {
    let Some(dev) = super::device::opened() else {
        return false;
    };
    if !std::ptr::addr_eq(
        std::sync::Arc::as_ptr(&ctx.inner),
        std::sync::Arc::as_ptr(&dev),
    ) {
        return false;
    }
    fail_device(&dev);
    true
}

/// [`inject_device_fatal`] for the device `qp` lives on. False when `qp` is not a live soft
/// QP of this process.
pub fn inject_device_fatal_under(qp: &Qp) -> bool {
    match soft_qp(qp) {
        Some(q) => {
            fail_device(&q.dev);
            true
        }
        None => false,
    }
}

fn fail_device(dev: &super::device::SoftDevice) {
    let qps: Vec<_> = dev
        .qps
        .lock()
        .values()
        .filter_map(std::sync::Weak::upgrade)
        .collect();
    for q in qps {
        q.freeze(true);
    }
    dev.events.raise(crate::AsyncEvent::DeviceFatal);
}
