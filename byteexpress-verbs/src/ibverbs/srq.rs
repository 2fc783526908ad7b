//! Shared receive queues: `ibv_create_srq(3)`, `ibv_post_srq_recv(3)`, `ibv_modify_srq(3)`.
//!
//! Each WR goes to the device with `wr_id = SRQ_TAG | number`; the SRQ's [`SrqLedger`] keeps
//! the caller's `wr_id`, so `QueueFull` comes at exactly the granted `max_wr` (rxe accepts
//! more), and any attached QP's completion finds it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use rdma_mummy_sys::{self as sys, ibv_srq_attr_mask};

use super::ledger::SrqLedger;
use super::os_err;
use super::pd::IbvPd;
use super::post::with_sges;
use crate::provider::{ContextImpl, SrqImpl};
use crate::{Error, RecvWr, Result, SrqAttr};

/// An SRQ; holds its PD. QPs attached to it hold it, so it is destroyed after them.
#[derive(Debug)]
pub(crate) struct IbvSrq {
    me: Weak<IbvSrq>,
    srq: *mut sys::ibv_srq,
    id: u64,
    max_wr: u32,
    max_sge: u32,
    limit: AtomicU32,
    pub(crate) ledger: Arc<SrqLedger>,
    pub(crate) pd: Arc<IbvPd>,
}

// SAFETY: `ibv_post_srq_recv` and `ibv_modify_srq` are thread-safe (the provider locks the
// SRQ); the SRQ is destroyed once, in Drop, after every QP attached to it (they hold Arcs).
unsafe impl Send for IbvSrq {}
// SAFETY: as for Send.
unsafe impl Sync for IbvSrq {}

impl IbvSrq {
    pub(crate) fn create(pd: Arc<IbvPd>, attr: SrqAttr) -> Result<Arc<IbvSrq>> {
        let dev = pd.ctx.query();
        if attr.max_wr > dev.max_qp_wr || attr.max_sge > dev.max_sge {
            return Err(Error::InvalidArgument(format!(
                "SRQ {attr:?} exceeds the device limits (max_qp_wr {}, max_sge {})",
                dev.max_qp_wr, dev.max_sge
            )));
        }
        let max_wr = attr.max_wr.max(1);
        if attr.srq_limit > max_wr {
            return Err(Error::InvalidArgument(format!(
                "srq_limit {} above max_wr {max_wr}",
                attr.srq_limit
            )));
        }
        let id = crate::events::next_object_id();
        let mut init = sys::ibv_srq_init_attr {
            // The id, read back from async events naming this SRQ.
            srq_context: id as usize as *mut libc::c_void,
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge: attr.max_sge.max(1),
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is alive (held by the SRQ below); `init` is valid and receives the
        // granted sizes.
        let srq = unsafe { sys::ibv_create_srq(pd.raw(), &mut init) };
        if srq.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EINVAL) => {
                    Error::InvalidArgument(format!("ibv_create_srq refused {attr:?}"))
                }
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
                    Error::Unsupported("the device has no SRQ (ibv_create_srq)".into())
                }
                _ => Error::Os {
                    what: "ibv_create_srq",
                    source: e,
                },
            });
        }
        // Capacity as asked: rxe grants (and accepts) more than it reports.
        let out = Arc::new_cyclic(|me| IbvSrq {
            me: me.clone(),
            srq,
            id,
            max_wr,
            max_sge: init.attr.max_sge.max(attr.max_sge.max(1)),
            limit: AtomicU32::new(0),
            ledger: Arc::new(SrqLedger::new(max_wr)),
            pd,
        });
        if attr.srq_limit > 0 {
            out.arm_limit(attr.srq_limit)?;
        }
        Ok(out)
    }

    /// The raw SRQ, valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut sys::ibv_srq {
        self.srq
    }

    /// The SRQ behind a provider-neutral handle, if it is an rdma-core SRQ.
    pub(crate) fn from_dyn(s: &Arc<dyn SrqImpl>) -> Option<Arc<IbvSrq>> {
        s.as_any().downcast_ref::<IbvSrq>()?.me.upgrade()
    }
}

impl Drop for IbvSrq {
    fn drop(&mut self) {
        // SAFETY: created in `create`, destroyed once; no QP is attached any more (they hold
        // Arcs of it), and its PD is a field, dropped after.
        let rc = unsafe { sys::ibv_destroy_srq(self.srq) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_srq: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

impl SrqImpl for IbvSrq {
    fn id(&self) -> u64 {
        self.id
    }

    fn attr(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: self.limit.load(Ordering::Acquire),
        }
    }

    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        crate::wr::check_srq_recv(wr, self.max_sge)?;
        let r = self.ledger.post(wr.wr_id, |device_wr_id| {
            with_sges(wr.sg_list, |sges, num| {
                let mut w = sys::ibv_recv_wr {
                    wr_id: device_wr_id,
                    next: std::ptr::null_mut(),
                    sg_list: sges,
                    num_sge: num,
                };
                let mut bad = std::ptr::null_mut();
                // SAFETY: the SRQ is valid; `w` and its SGE array live across the call; the
                // buffers are registered memory the caller leaves to the device until the
                // completion.
                let rc = unsafe { sys::ibv_post_srq_recv(self.srq, &mut w, &mut bad) };
                match rc {
                    0 => Ok(()),
                    libc::ENOMEM => Err(Error::QueueFull("shared receive queue (max_wr) full")),
                    libc::EINVAL => Err(Error::InvalidArgument(
                        "ibv_post_srq_recv refused the WR (EINVAL)".into(),
                    )),
                    e => Err(os_err("ibv_post_srq_recv", Some(e))),
                }
            })
        });
        r.unwrap_or(Err(Error::QueueFull("shared receive queue (max_wr) full")))
    }

    fn arm_limit(&self, limit: u32) -> Result<()> {
        if limit > self.max_wr {
            return Err(Error::InvalidArgument(format!(
                "srq_limit {limit} above max_wr {}",
                self.max_wr
            )));
        }
        let mut a = sys::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: the SRQ is valid; `a` is a valid attribute struct.
        let rc = unsafe {
            sys::ibv_modify_srq(
                self.srq,
                &mut a,
                ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as libc::c_int,
            )
        };
        match rc {
            0 => {
                self.limit.store(limit, Ordering::Release);
                Ok(())
            }
            libc::EINVAL => Err(Error::InvalidArgument(format!(
                "ibv_modify_srq refused srq_limit {limit}"
            ))),
            libc::EOPNOTSUPP => Err(Error::Unsupported(
                "the device cannot arm an SRQ limit".into(),
            )),
            e => Err(os_err("ibv_modify_srq(IBV_SRQ_LIMIT)", Some(e))),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
