//! A QP's staging region: where a SEND whose payload the peer cannot read where it lies (inline
//! data, several SGEs, memory not announced to the peer: user memory, LOCAL_WRITE memory) is
//! copied at post time, for the peer's receiver to copy from ([`super::deliver`]). One memfd
//! per QP, passed only to that QP's peer, as an `O_RDONLY` fd sealed against writes; a byte
//! ring whose space is freed in order as the peer acknowledges the SENDs in it.

use std::sync::Arc;

use super::shm::{Arena, Mapping};
use crate::Result;

/// Bytes of a QP's staging region (touched only as far as it is used).
pub(crate) const STAGE_BYTES: usize = 256 * 1024;

/// Staged payloads start at multiples of this.
const ALIGN: u64 = 64;

/// The sender's view of its staging region.
#[derive(Debug)]
pub(crate) struct Staging {
    /// The memfd until passed to the peer (then closed).
    arena: Option<Arc<Arena>>,
    map: Mapping,
    /// Bytes handed out and freed, free-running.
    head: u64,
    tail: u64,
}

/// Where a payload went: its offset, and the `head` that frees it once acknowledged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Staged {
    pub(crate) off: u64,
    pub(crate) end: u64,
    /// `head` before it.
    from: u64,
}

impl Staging {
    pub(crate) fn new() -> Result<Staging> {
        let arena = Arena::create(c"bx-soft-stage", true)?;
        let map = arena.alloc(STAGE_BYTES)?;
        Ok(Staging {
            arena: Some(arena),
            map,
            head: 0,
            tail: 0,
        })
    }

    /// Bytes of the region.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The arena to pass to the peer in our `Connect` (sealed read-only by the pass).
    pub(crate) fn arena(&self) -> Option<&Arc<Arena>> {
        self.arena.as_ref()
    }

    /// After the `Connect` went: the memfd is closed (the mapping stays).
    pub(crate) fn passed(&mut self) {
        if let Some(a) = self.arena.take() {
            a.close();
        }
    }

    /// Room for `n` bytes, contiguous, or `None` while earlier payloads fill it (`n` must
    /// not exceed [`Staging::len`]).
    fn alloc(&mut self, n: usize) -> Option<Staged> {
        let cap = self.map.len() as u64;
        let n = (n as u64).next_multiple_of(ALIGN).max(ALIGN);
        let pos = self.head % cap;
        let pad = if pos + n > cap { cap - pos } else { 0 };
        if self.head - self.tail + pad + n > cap {
            return None;
        }
        let off = (pos + pad) % cap;
        let from = self.head;
        self.head += pad + n;
        Some(Staged {
            off,
            end: self.head,
            from,
        })
    }

    /// Copies the gather list `segs` (`total` bytes) into the region; `None` while full.
    pub(crate) fn put(&mut self, segs: &[(*mut u8, usize)], total: usize) -> Option<Staged> {
        let at = self.alloc(total)?;
        // SAFETY: `alloc` returned `total` bytes (rounded up) at `at.off` inside our writable
        // mapping, not handed out to any unacknowledged payload; the caller guarantees the
        // segments are readable.
        unsafe {
            let dst = self.map.ptr().add(at.off as usize);
            super::send::scatter_gather(segs, &[(dst, total)]);
        }
        Some(at)
    }

    /// Takes back the last payload staged (it was never handed to the peer).
    pub(crate) fn unput(&mut self, st: Staged) {
        if self.head == st.end {
            self.head = st.from;
        }
    }

    /// Frees everything (the QP failed: nothing staged will be acknowledged).
    pub(crate) fn release_all(&mut self) {
        self.tail = self.head;
    }

    /// The peer acknowledged every payload up to the one that ended at `end`.
    pub(crate) fn release(&mut self, end: u64) {
        if end > self.tail && end <= self.head {
            self.tail = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_payloads_wrap_and_wait_for_acknowledgement() {
        let mut s = Staging::new().unwrap();
        let cap = s.len();
        let a = s.alloc(cap / 2).unwrap();
        let b = s.alloc(cap / 4).unwrap();
        assert_eq!((a.off, b.off), (0, cap as u64 / 2));
        // Does not fit before the end, and the start is still in use.
        assert!(s.alloc(cap / 2).is_none());
        s.release(a.end);
        let c = s.alloc(cap / 2).unwrap();
        assert_eq!(c.off, 0, "wrapped to the start");
        assert!(
            s.alloc(ALIGN as usize).is_none(),
            "full until b is acknowledged"
        );
        s.release(b.end);
        let d = s.alloc(ALIGN as usize).unwrap();
        assert_eq!(d.off, cap as u64 / 2, "after c");
        s.release(c.end);
        assert_eq!(s.head, s.tail + ALIGN, "only the last payload is held");
    }
}
