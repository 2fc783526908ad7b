//! Memory for `Pd::alloc_shared` on a NIC: a private anonymous mapping ([`crate::AnonMap`]),
//! page-aligned and zero-filled, registered later with `ibv_reg_mr(3)`. Any registered memory
//! may be accessed remotely on a NIC, so nothing here is shared with other processes.

use crate::provider::SharedMemImpl;
use crate::{AnonMap, Error, Result};

/// A page-aligned anonymous mapping, unmapped on drop (every MR over it holds an Arc of it,
/// so none is registered any more by then).
#[derive(Debug)]
pub(crate) struct AnonMem(AnonMap);

impl AnonMem {
    /// `len` bytes (at least one page, rounded up to the page size), zero-filled.
    pub(crate) fn new(len: usize) -> Result<AnonMem> {
        AnonMap::new(len)
            .map(AnonMem)
            .map_err(|source| match source.raw_os_error() {
                Some(libc::EINVAL) => Error::InvalidArgument("memory length overflows".into()),
                _ => Error::Os {
                    what: "mmap",
                    source,
                },
            })
    }
}

impl SharedMemImpl for AnonMem {
    fn as_ptr(&self) -> *mut u8 {
        self.0.addr() as *mut u8
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
