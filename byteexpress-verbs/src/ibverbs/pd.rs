//! Protection domains (`ibv_alloc_pd(3)`) and memory regions (`ibv_reg_mr(3)`).

use std::sync::{Arc, Weak};

use rdma_mummy_sys as sys;

use super::context::{IbvContext, check_caps};
use super::cq::IbvCq;
use super::mem::AnonMem;
use super::qp::IbvQp;
use super::srq::IbvSrq;
use super::{convert, os_err};
use crate::provider::{ContextImpl, CqImpl, MrImpl, PdImpl, QpImpl, SharedMemImpl, SrqImpl};
use crate::{Access, Error, QpCap, Result, SrqAttr};

/// A protection domain; deallocated when the last MR, QP and handle of it are gone.
#[derive(Debug)]
pub(crate) struct IbvPd {
    me: Weak<IbvPd>,
    pd: *mut sys::ibv_pd,
    pub(crate) ctx: Arc<IbvContext>,
    /// [`PdImpl::finish_qps`] was called.
    qps_finished: std::sync::atomic::AtomicBool,
}

// SAFETY: an `ibv_pd` is only passed to thread-safe verbs calls (reg_mr, create_qp) and
// deallocated once in Drop, after every MR and QP of it (they hold Arcs of it).
unsafe impl Send for IbvPd {}
// SAFETY: as for Send.
unsafe impl Sync for IbvPd {}

impl IbvPd {
    pub(crate) fn alloc(ctx: Arc<IbvContext>) -> Result<Arc<IbvPd>> {
        // SAFETY: the context is open while `ctx` lives.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.raw()) };
        if pd.is_null() {
            return Err(os_err("ibv_alloc_pd", None));
        }
        Ok(Arc::new_cyclic(|me| IbvPd {
            me: me.clone(),
            pd,
            ctx,
            qps_finished: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// The raw PD, valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut sys::ibv_pd {
        self.pd
    }
}

impl Drop for IbvPd {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc`, deallocated once; no MR or QP of it is left.
        let rc = unsafe { sys::ibv_dealloc_pd(self.pd) };
        if rc != 0 {
            tracing::warn!("ibv_dealloc_pd: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

impl PdImpl for IbvPd {
    /// Only recorded: rdma-core has no such call, and nothing of the PD is released.
    fn finish_qps(&self) {
        self.qps_finished
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn qps_finished(&self) -> bool {
        self.qps_finished.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The access hint changes nothing here: a NIC checks each MR's flags itself.
    fn alloc_shared(&self, len: usize, _access: Access) -> Result<Arc<dyn SharedMemImpl>> {
        Ok(Arc::new(AnonMem::new(len)?))
    }

    /// Any memory can be registered on a NIC: memory of the soft provider works too.
    fn reg_shared(
        &self,
        mem: &Arc<dyn SharedMemImpl>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Arc<dyn MrImpl>> {
        let max = self.ctx.query().max_mr_size;
        if len as u64 > max {
            return Err(Error::InvalidArgument(format!(
                "MR of {len} bytes exceeds max_mr_size {max}"
            )));
        }
        let bits = convert::mr_access_bits(access)?;
        // SAFETY: [offset, offset + len) lies inside the live mapping (checked by the caller,
        // `Pd::reg_shared`); the MR keeps the mapping alive (it holds `mem`) until it is
        // deregistered.
        let mr = unsafe {
            sys::ibv_reg_mr(
                self.pd,
                mem.as_ptr().add(offset).cast(),
                len,
                bits as libc::c_int,
            )
        };
        if mr.is_null() {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Err(Error::InvalidArgument(format!(
                    "ibv_reg_mr refused access {access:?} (REMOTE_WRITE needs LOCAL_WRITE)"
                )));
            }
            return Err(Error::Os {
                what: "ibv_reg_mr",
                source: e,
            });
        }
        let pd = self
            .me
            .upgrade()
            .ok_or_else(|| Error::InvalidState("PD is being destroyed".into()))?;
        // SAFETY: `mr` was just registered and is valid.
        let (lkey, addr) = unsafe { ((*mr).lkey, (*mr).addr as u64) };
        let out = Arc::new(IbvMr {
            mr,
            lkey,
            addr,
            len,
            pd,
            _mem: mem.clone(),
        });
        self.ctx.mrs.lock().insert(lkey, Arc::downgrade(&out));
        Ok(out)
    }

    /// A NIC reaches any registered memory, remote access included: `ibv_reg_mr(3)` over the
    /// region (through [`PdImpl::reg_shared`], which holds the region for the MR's life).
    fn reg_user(
        &self,
        region: &Arc<crate::objects::UserMem>,
        access: Access,
    ) -> Result<Arc<dyn MrImpl>> {
        let mem: Arc<dyn SharedMemImpl> = region.clone();
        self.reg_shared(&mem, 0, mem.len(), access)
    }

    fn create_qp(
        &self,
        send_cq: &Arc<dyn CqImpl>,
        recv_cq: &Arc<dyn CqImpl>,
        srq: Option<&Arc<dyn SrqImpl>>,
        cap: QpCap,
    ) -> Result<Arc<dyn QpImpl>> {
        let (Some(scq), Some(rcq)) = (IbvCq::from_dyn(send_cq), IbvCq::from_dyn(recv_cq)) else {
            return Err(Error::InvalidArgument("CQ of another provider".into()));
        };
        if !Arc::ptr_eq(&scq.ctx, &self.ctx) || !Arc::ptr_eq(&rcq.ctx, &self.ctx) {
            return Err(Error::InvalidArgument("CQ of another device".into()));
        }
        let srq = match srq {
            None => None,
            Some(s) => {
                let s = IbvSrq::from_dyn(s)
                    .ok_or_else(|| Error::InvalidArgument("SRQ of another provider".into()))?;
                if !Arc::ptr_eq(&s.pd.ctx, &self.ctx) {
                    return Err(Error::InvalidArgument("SRQ of another device".into()));
                }
                Some(s)
            }
        };
        let mut checked = cap;
        if srq.is_some() {
            checked.max_recv_wr = 0;
            checked.max_recv_sge = 0;
        }
        check_caps(&self.ctx.query(), &checked)?;
        let pd = self
            .me
            .upgrade()
            .ok_or_else(|| Error::InvalidState("PD is being destroyed".into()))?;
        Ok(IbvQp::create(pd, scq, rcq, srq, cap)?)
    }

    fn create_srq(&self, attr: SrqAttr) -> Result<Arc<dyn SrqImpl>> {
        let pd = self
            .me
            .upgrade()
            .ok_or_else(|| Error::InvalidState("PD is being destroyed".into()))?;
        Ok(IbvSrq::create(pd, attr)?)
    }

    fn alloc_mw(&self) -> Result<Arc<dyn crate::provider::MwImpl>> {
        let pd = self
            .me
            .upgrade()
            .ok_or_else(|| Error::InvalidState("PD is being destroyed".into()))?;
        Ok(Arc::new(super::mw::IbvMw::alloc(pd, self.pd)?))
    }
}

/// A registered memory region; holds its PD and memory so both outlive the registration.
#[derive(Debug)]
pub(crate) struct IbvMr {
    mr: *mut sys::ibv_mr,
    lkey: u32,
    addr: u64,
    len: usize,
    pd: Arc<IbvPd>,
    _mem: Arc<dyn SharedMemImpl>,
}

// SAFETY: the `ibv_mr` is read-only after registration (keys, address) and deregistered once
// in Drop.
unsafe impl Send for IbvMr {}
// SAFETY: as for Send.
unsafe impl Sync for IbvMr {}

impl IbvMr {
    /// True when `[addr, addr + len)` lies inside this MR.
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len as u64)
    }
}

impl IbvMr {
    /// The registration, for a memory-window bind ([`super::post`]).
    pub(crate) fn raw(&self) -> *mut sys::ibv_mr {
        self.mr
    }
}

impl Drop for IbvMr {
    fn drop(&mut self) {
        // Forget the lkey, unless a newer MR already reuses it (the lock also keeps a new
        // registration from taking the lkey before this one is gone).
        let mut mrs = self.pd.ctx.mrs.lock();
        if mrs.get(&self.lkey).is_some_and(|w| w.strong_count() == 0) {
            mrs.remove(&self.lkey);
        }
        // SAFETY: registered in `reg_shared`, deregistered once, before the PD and memory it
        // holds are released (fields drop after this body).
        let rc = unsafe { sys::ibv_dereg_mr(self.mr) };
        drop(mrs);
        if rc != 0 {
            tracing::warn!("ibv_dereg_mr: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

impl MrImpl for IbvMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }

    fn rkey(&self) -> u32 {
        // SAFETY: the MR is registered while `self` lives; the field is not written after.
        unsafe { (*self.mr).rkey }
    }

    fn addr(&self) -> u64 {
        self.addr
    }

    fn len(&self) -> usize {
        self.len
    }
}
