//! One memory budget for the bytes that peers make this process hold before a message is
//! whole: partly received TCP frames and RDMA reassembly buffers, across all links of a
//! [`Server`](crate::Server) (or, for clients, of the process: one budget per distinct
//! `memory_budget` value, shared by the client links set up with it).
//!
//! A TCP frame larger than [`UNCHARGED`], and every message reassembled from RDMA chunks, is
//! charged its whole announced size when its first bytes arrive, before any memory is set
//! aside for it. If the budget cannot take it, nothing
//! is allocated: its bytes are read and dropped as they come, and the call gets
//! RESOURCE_EXHAUSTED (the server answers the request so; a client fails its own call). The
//! charge is returned when the message is whole and handed on (to the handler or the caller),
//! or when its link dies.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// TCP frames up to this size (bytes) are not charged: a TCP link holds at most one partial
/// frame at a time, so these are bounded by the connection caps instead.
pub(crate) const UNCHARGED: usize = 64 << 10;

/// Bytes held by partly received messages, against a limit (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct MemoryBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: usize,
    used: AtomicUsize,
}

/// Bytes taken from a [`MemoryBudget`]; returned when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    inner: Arc<Inner>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.inner.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub(crate) fn new(limit: usize) -> Self {
        MemoryBudget {
            inner: Arc::new(Inner {
                limit,
                used: AtomicUsize::new(0),
            }),
        }
    }

    /// Takes `bytes` if they fit under the limit with what is already held; `None` (nothing
    /// taken) otherwise.
    pub(crate) fn try_take(&self, bytes: usize) -> Option<Charge> {
        let mut used = self.inner.used.load(Ordering::Acquire);
        loop {
            let next = used.checked_add(bytes).filter(|n| *n <= self.inner.limit)?;
            match self.inner.used.compare_exchange_weak(
                used,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(Charge {
                        inner: self.inner.clone(),
                        bytes,
                    });
                }
                Err(now) => used = now,
            }
        }
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.inner.used.load(Ordering::Acquire)
    }

    /// The limit in bytes.
    pub(crate) fn limit(&self) -> usize {
        self.inner.limit
    }

    /// The status of a message of `len` bytes that the budget refused.
    pub(crate) fn refusal(&self, len: u64) -> crate::Status {
        crate::Status::new(
            crate::Code::ResourceExhausted,
            format!(
                "message of {len} bytes refused: the receiver's memory budget for messages in \
                 transit ({} bytes) has {} bytes in use",
                self.limit(),
                self.used()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_up_to_the_limit_and_returns_on_drop() {
        let b = MemoryBudget::new(100);
        let a = b.try_take(60).expect("fits");
        assert!(b.try_take(41).is_none(), "over the limit");
        let c = b.try_take(40).expect("fits exactly");
        assert_eq!(b.used(), 100);
        drop(a);
        assert_eq!(b.used(), 40);
        assert!(b.try_take(usize::MAX).is_none(), "no overflow");
        drop(c);
        assert_eq!(b.used(), 0);
    }
}
