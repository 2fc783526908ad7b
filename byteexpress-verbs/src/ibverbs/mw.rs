//! Type 2 memory windows (`ibv_alloc_mw(3)`, `ibv_dealloc_mw(3)`), bound and invalidated by
//! WRs ([`super::post`]).

use std::sync::Arc;

use parking_lot::Mutex;
use rdma_mummy_sys as sys;

use super::pd::IbvPd;
use crate::provider::MwImpl;
use crate::{Error, Result};

/// A type 2 memory window; deallocated on drop (which invalidates it if bound).
#[derive(Debug)]
pub(crate) struct IbvMw {
    /// The window. Its `rkey` field is what the next bind names as the window's current key
    /// (`ibv_post_send(3)` reads it): updated under this lock by each posted bind.
    pub(crate) mw: Mutex<*mut sys::ibv_mw>,
    rkey: u32,
    _pd: Arc<IbvPd>,
}

// SAFETY: the `ibv_mw` is written only under its lock (a bind's new rkey) and deallocated once
// in Drop; rdma-core's MW calls are thread-safe.
unsafe impl Send for IbvMw {}
// SAFETY: as for Send.
unsafe impl Sync for IbvMw {}

impl IbvMw {
    /// `ibv_alloc_mw(pd, IBV_MW_TYPE_2)`. Errors: `Unsupported` when the device has no type 2
    /// windows (`EOPNOTSUPP`, no `alloc_mw` op), `Os` for any other refusal.
    pub(crate) fn alloc(pd: Arc<IbvPd>, raw_pd: *mut sys::ibv_pd) -> Result<IbvMw> {
        // SAFETY: `raw_pd` is the live PD `pd` holds; the call returns a new window or null.
        let mw = unsafe { sys::ibv_alloc_mw(raw_pd, sys::ibv_mw_type::IBV_MW_TYPE_2) };
        if mw.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Error::Unsupported(format!(
                    "ibv_alloc_mw(IBV_MW_TYPE_2): the device has no type 2 memory windows ({e})"
                )),
                _ => Error::Os {
                    what: "ibv_alloc_mw",
                    source: e,
                },
            });
        }
        // SAFETY: `mw` was just allocated and is valid.
        let rkey = unsafe { (*mw).rkey };
        Ok(IbvMw {
            mw: Mutex::new(mw),
            rkey,
            _pd: pd,
        })
    }
}

impl MwImpl for IbvMw {
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for IbvMw {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc`, deallocated once, before the PD it holds.
        let rc = unsafe { sys::ibv_dealloc_mw(*self.mw.get_mut()) };
        if rc != 0 {
            tracing::warn!("ibv_dealloc_mw: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}
