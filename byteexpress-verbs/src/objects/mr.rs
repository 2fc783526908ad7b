//! Mr: a registered memory region.

use super::SharedMem;
use crate::Sge;
use crate::provider::MrImpl;
use std::sync::Arc;

/// A registered memory region (`ibv_mr`). Keeps its memory mapped while alive.
#[derive(Debug, Clone)]
pub struct Mr {
    /// The registration, held: the MR is deregistered when its last handle drops.
    pub(crate) _reg: Arc<dyn MrImpl>,
    pub(crate) mem: SharedMem,
    /// Copies of what the registration reports, which never changes after registration: every
    /// message builds SGEs from them, without a call through `dyn MrImpl`.
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    /// The access flags it was registered with.
    pub(crate) access: crate::Access,
}

impl Mr {
    pub(crate) fn new(reg: Arc<dyn MrImpl>, mem: SharedMem, access: crate::Access) -> Mr {
        Mr {
            access,
            lkey: reg.lkey(),
            rkey: reg.rkey(),
            addr: reg.addr(),
            len: reg.len(),
            _reg: reg,
            mem,
        }
    }

    /// Local key, for SGEs.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key, for peers' READ/WRITE.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Start address in this process.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// The access flags it was registered with.
    pub fn access(&self) -> crate::Access {
        self.access
    }
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The memory this MR covers part or all of (for [`Pd::reg_user`](crate::Pd::reg_user) MRs: the user region).
    pub fn memory(&self) -> &SharedMem {
        &self.mem
    }
    /// An SGE of `len` bytes at `offset` bytes into this MR; `None` when that range is not
    /// inside it.
    pub fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
        let end = offset.checked_add(len as usize)?;
        (end <= self.len()).then(|| Sge {
            addr: self.addr() + offset as u64,
            len,
            lkey: self.lkey(),
        })
    }
}
