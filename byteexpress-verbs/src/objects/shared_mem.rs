//! SharedMem: memory from `Pd::alloc_shared`.

use crate::provider::SharedMemImpl;
use std::sync::Arc;

/// Memory from [`Pd::alloc_shared`](crate::Pd::alloc_shared). Clones share one mapping; it is unmapped when the last clone
/// and every MR over it are dropped.
#[derive(Debug, Clone)]
pub struct SharedMem {
    pub(crate) inner: Arc<dyn SharedMemImpl>,
}

impl SharedMem {
    /// Start of the mapping in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// True when the length is 0 (never, for a successful allocation).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
