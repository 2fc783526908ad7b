//! Pd: a protection domain, and what is made in it (memory, MRs, QPs).

use super::{Cq, Mr, Mw, Qp, SharedMem, UserRegion};
use crate::Error;
use crate::provider::PdImpl;
use crate::{Access, QpCap, Result};
use std::sync::Arc;

/// A protection domain (`ibv_pd`).
#[derive(Debug, Clone)]
pub struct Pd {
    pub(crate) inner: Arc<dyn PdImpl>,
}

impl Pd {
    /// Allocates `len` bytes (rounded up to the page size) that peers may access remotely and
    /// that may back receive buffers on every provider (a memfd mapping on the soft provider,
    /// anonymous memory on NICs). Zero-filled.
    pub fn alloc_shared(&self, len: usize) -> Result<SharedMem> {
        self.alloc_shared_for(len, Access::ALL)
    }

    /// As [`Pd::alloc_shared`], for memory whose MRs will have at most `access` (the widest
    /// set of flags any MR over it will be registered with). A NIC ignores the hint. The soft
    /// provider exposes the memory to peers by it, so a peer can map no more than the flags
    /// allow (issue 22; DESIGN.md 3.1): nothing of memory without LOCAL_WRITE or a remote
    /// flag, a read-only grant of REMOTE_READ memory, read-write only memory with
    /// REMOTE_WRITE or LOCAL_WRITE (a receive buffer). There, `reg_shared` with flags beyond
    /// the hint's class fails with `InvalidArgument`.
    pub fn alloc_shared_for(&self, len: usize, access: Access) -> Result<SharedMem> {
        Ok(SharedMem {
            inner: self.inner.alloc_shared(len, access)?,
        })
    }

    /// Registers `[offset, offset + len)` of `mem` as an MR with `access` (`ibv_reg_mr(3)`).
    /// Errors: `InvalidArgument` when the range is empty, outside `mem` or larger than
    /// `max_mr_size`.
    pub fn reg_shared(
        &self,
        mem: &SharedMem,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Mr> {
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > mem.len()) {
            return Err(Error::InvalidArgument(format!(
                "MR [{offset}, +{len}) outside memory of {} bytes (ibv_reg_mr(3) needs a \
                 non-empty range)",
                mem.len()
            )));
        }
        Ok(Mr::new(
            self.inner.reg_shared(&mem.inner, offset, len, access)?,
            mem.clone(),
            access,
        ))
    }

    /// Registers memory this crate did not allocate: all of `region` as one MR with `access`
    /// (`ibv_reg_mr(3)`). The MR holds `region` (and so its owner): the memory stays mapped
    /// until the MR and every other clone of the region are dropped.
    ///
    /// Errors: `InvalidArgument` for an empty region, a region larger than `max_mr_size`, or
    /// write access (`LOCAL_WRITE`, `REMOTE_WRITE`) on a read-only region
    /// ([`UserRegion::new`]); `Unsupported` for remote access (`REMOTE_*`) on a device whose
    /// [`DeviceAttr::remote_access_needs_shared`](crate::DeviceAttr::remote_access_needs_shared) is true (the soft provider: peers can reach only
    /// memory from [`Pd::alloc_shared`]); `Os` when the device refuses (`ENOMEM`/`EPERM` for
    /// RLIMIT_MEMLOCK on NICs).
    ///
    /// On the soft provider such an MR serves as the source of SEND and RDMA_WRITE and as the
    /// destination of RDMA_READ (with `LOCAL_WRITE`), but never as a receive buffer, which the
    /// peer writes into: [`Qp::post_recv`] refuses it with `Unsupported`.
    pub fn reg_user(&self, region: UserRegion, access: Access) -> Result<Mr> {
        if region.is_empty() {
            return Err(Error::InvalidArgument(
                "empty region (ibv_reg_mr(3) needs length > 0)".into(),
            ));
        }
        let writes = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
        if access.0 & writes.0 != 0 && !region.inner.writable {
            return Err(Error::InvalidArgument(format!(
                "access {access:?} lets the device write into a read-only region \
                 (UserRegion::new); use UserRegion::new_mut"
            )));
        }
        Ok(Mr::new(
            self.inner.reg_user(&region.inner, access)?,
            SharedMem {
                inner: region.inner.clone(),
            },
            access,
        ))
    }

    /// Registers `[addr, addr + len)` of this process as an MR with `access` (`ibv_reg_mr(3)`),
    /// with no owner: see [`UserRegion::from_raw`] and [`Pd::reg_user`] (same errors).
    ///
    /// # Safety
    /// As for [`UserRegion::from_raw`]: the range must stay mapped, readable (and writable, when
    /// `access` lets the device write) and unaliased by Rust references the device could write
    /// through, until the returned MR and every clone of it are dropped.
    pub unsafe fn reg_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        // SAFETY: forwarded to the caller (this function's contract).
        let region = unsafe { UserRegion::from_raw(addr, len) };
        self.reg_user(region, access)
    }

    /// Allocates a type 2 memory window in this PD, unbound (`ibv_alloc_mw(3)` with
    /// `IBV_MW_TYPE_2`). Bind it with [`WrOp::BindMw`](crate::WrOp::BindMw) on a QP of this PD.
    /// Errors: `Unsupported` when the device has no memory windows (`EOPNOTSUPP`); `Os` when it
    /// refuses (`ENOMEM`).
    pub fn alloc_mw(&self) -> Result<Mw> {
        Ok(Mw::new(self.inner.alloc_mw()?, self.clone()))
    }

    /// Creates an RC QP in RESET (`ibv_create_qp(3)`); `cap` may be rounded up, see [`Qp::cap`].
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, cap: QpCap) -> Result<Qp> {
        self.new_qp(send_cq, recv_cq, None, cap)
    }

    /// Declares that no QP will be created in this PD any more: later [`Pd::create_qp`] and
    /// [`Pd::create_qp_with_srq`] calls fail with `InvalidState`. MRs, shared memory and the
    /// PD's existing QPs are unaffected. A hint with no verbs counterpart: rdma-core devices
    /// only record it; the soft provider then closes each memfd of the PD once every QP of
    /// the PD has passed it to its peer (the mappings keep the memory), so a PD whose QPs are
    /// connected holds no fd for its memory (ByteExpress-rs issue 17: fds per link; DESIGN.md
    /// 3.1). Without it, the soft provider keeps one memfd open per PD, since a QP created
    /// later would have to pass the PD's regions to its own peer.
    pub fn finish_qps(&self) {
        self.inner.finish_qps();
    }

    /// [`Pd::create_qp`], optionally attached to `srq` (see [`Pd::create_qp_with_srq`]).
    pub(crate) fn new_qp(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&crate::Srq>,
        cap: QpCap,
    ) -> Result<Qp> {
        if self.inner.qps_finished() {
            return Err(crate::Error::InvalidState(
                "no QP can be created in this PD after Pd::finish_qps".into(),
            ));
        }
        let inner =
            self.inner
                .create_qp(&send_cq.inner, &recv_cq.inner, srq.map(|s| &s.inner), cap)?;
        Ok(Qp {
            _destroy: Arc::new(super::qp::DestroyOnDrop(inner.clone())),
            inner,
            _pd: self.clone(),
            _cqs: [send_cq.clone(), recv_cq.clone()],
            _srq: srq.cloned(),
        })
    }
}
