//! Reassembly of messages that arrive in several chunks ([`crate::wire::header`], "Chunks").
//!
//! Pure bookkeeping, no I/O: the engine hands every chunk of a multi-chunk message (a first
//! chunk with `FLAG_MORE`, or a CONTINUATION) to [`Reassembly::on_chunk`], which copies it into
//! a buffer of the announced size and returns the message once its last chunk is in. Messages
//! are keyed by `(conn_id, call_id)`: chunks of different messages interleave, chunks of one
//! message arrive in order (one RC QP).

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

use byteexpress_mem::{MemError, Pool, RegisteredBuf};
use bytes::Bytes;

use crate::budget::{Charge, MemoryBudget};
use crate::link_stats::LinkCounters;
use crate::message::Incoming;
use crate::wire::header::{FLAG_MORE, Header, Kind};

/// A peer's chunk that breaks the rules; the link is failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReassemblyError {
    /// The first chunk announces more than this side's `max_message` (bytes, header included).
    #[error("message {key:?} announces {len} bytes, more than the {max}-byte maximum")]
    TooLarge {
        /// `(conn_id, call_id)`.
        key: (u32, u64),
        /// Announced size (bytes).
        len: u64,
        /// Configured maximum (bytes).
        max: u64,
    },
    /// A first chunk for a message already being reassembled.
    #[error("message {0:?} started twice")]
    Restarted((u32, u64)),
    /// A CONTINUATION with no message started under its key.
    #[error("continuation of message {0:?}, which was never started")]
    NotStarted((u32, u64)),
    /// More bytes than the first chunk announced.
    #[error("message {key:?} overruns its announced {len} bytes")]
    Overrun {
        /// `(conn_id, call_id)`.
        key: (u32, u64),
        /// Announced metadata + body (bytes).
        len: u64,
    },
    /// The last chunk (no `FLAG_MORE`) leaves the message short of its announced size.
    #[error("message {key:?} ended after {got} of its announced {len} bytes")]
    Short {
        /// `(conn_id, call_id)`.
        key: (u32, u64),
        /// Bytes received (metadata + body).
        got: u64,
        /// Announced metadata + body (bytes).
        len: u64,
    },
}

/// Where a message is reassembled: registered memory from the link's pool, or the heap.
#[derive(Debug)]
enum Buf {
    Registered(RegisteredBuf),
    Heap(Vec<u8>),
    /// A message refused for want of memory budget: its bytes are counted, not kept.
    Discard(usize),
}

impl Buf {
    fn len(&self) -> usize {
        match self {
            Buf::Registered(b) => b.len(),
            Buf::Heap(v) => v.len(),
            Buf::Discard(n) => *n,
        }
    }

    /// Appends `data`; `false` (nothing written) when it does not fit the buffer, which the
    /// caller's check against the announced length rules out.
    fn extend(&mut self, data: &[u8]) -> bool {
        match self {
            Buf::Registered(b) => b.extend_from_slice(data).is_ok(),
            Buf::Heap(v) => {
                v.extend_from_slice(data);
                true
            }
            Buf::Discard(n) => {
                *n += data.len();
                true
            }
        }
    }

    fn freeze(self) -> Bytes {
        match self {
            Buf::Registered(b) => b.freeze(),
            Buf::Heap(v) => Bytes::from(v),
            Buf::Discard(_) => Bytes::new(),
        }
    }
}

/// A message being reassembled.
#[derive(Debug)]
struct Partial {
    /// The first chunk's header (whole-message lengths).
    header: Header,
    /// Metadata + body so far.
    data: Buf,
    /// Its share of the memory budget, returned when the message is whole.
    _charge: Option<Charge>,
}

impl Partial {
    /// The announced metadata + body (bytes).
    fn len(&self) -> u64 {
        u64::from(self.header.meta_len) + self.header.body_len
    }
}

/// Messages being reassembled on one link, by `(conn_id, call_id)`.
#[derive(Debug)]
pub(crate) struct Reassembly {
    partial: HashMap<(u32, u64), Partial>,
    max_message: u64,
    pool: Option<Pool>,
    counters: Arc<LinkCounters>,
    budget: Option<MemoryBudget>,
    /// First headers of messages refused for want of budget, for the engine to answer.
    refused: Vec<Header>,
}

impl Reassembly {
    /// Accepts messages of at most `max_message` bytes (header + metadata + body), reassembled
    /// in buffers from `pool` when it has one (else, or when none is free, on the heap, counted
    /// in `counters.reassembled_on_heap`).
    pub(crate) fn new(max_message: usize, pool: Option<Pool>, counters: Arc<LinkCounters>) -> Self {
        Reassembly {
            partial: HashMap::new(),
            max_message: max_message as u64,
            pool,
            counters,
            budget: None,
            refused: Vec::new(),
        }
    }

    /// Charges every message reassembled (each larger than a chunk) to `budget` when its
    /// first chunk arrives; one that does not fit is not kept (its chunks are checked and dropped) and its
    /// first header is queued for [`Reassembly::take_refused`].
    pub(crate) fn with_budget(mut self, budget: MemoryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// First headers of the messages refused for want of budget since the last call.
    pub(crate) fn take_refused(&mut self) -> Vec<Header> {
        std::mem::take(&mut self.refused)
    }

    /// A buffer for `len` bytes: from the pool while it has room, else from the heap. A pool
    /// that cannot grow for another reason (memlock limit, registration refused) is given up
    /// for the link's life, so later messages do not retry the registration.
    fn buf(&mut self, len: usize) -> Buf {
        let Some(pool) = &self.pool else {
            LinkCounters::bump(&self.counters.reassembled_on_heap);
            return Buf::Heap(Vec::with_capacity(len));
        };
        match pool.try_alloc(len) {
            Ok(b) => return Buf::Registered(b),
            Err(MemError::Exhausted { .. } | MemError::TooLarge { .. }) => {}
            Err(e) => {
                tracing::warn!("reassembly pool given up, reassembling on the heap: {e}");
                self.pool = None;
            }
        }
        LinkCounters::bump(&self.counters.reassembled_on_heap);
        Buf::Heap(Vec::with_capacity(len))
    }

    /// Messages started and not yet complete.
    pub(crate) fn in_progress(&self) -> usize {
        self.partial.len()
    }

    /// Takes one chunk: `h` is its decoded header, `payload` the bytes after it (already
    /// checked against `h` by [`Header::decode`]). Returns the whole message after its last
    /// chunk, copied once into a buffer of the announced size.
    pub(crate) fn on_chunk(
        &mut self,
        h: &Header,
        payload: &[u8],
    ) -> Result<Option<Incoming>, ReassemblyError> {
        let key = (h.conn_id, h.call_id);
        if h.kind != Kind::Continuation {
            debug_assert!(h.more(), "single-chunk messages are not reassembled");
            if h.message_len() > self.max_message {
                return Err(ReassemblyError::TooLarge {
                    key,
                    len: h.message_len(),
                    max: self.max_message,
                });
            }
            if self.partial.contains_key(&key) {
                return Err(ReassemblyError::Restarted(key));
            }
            // Checked above: fits in max_message, which is a usize (the header is 40 bytes, or
            // 48 for a body over u32::MAX bytes).
            let len = (h.message_len() - h.encoded_len() as u64) as usize;
            if payload.len() > len {
                return Err(ReassemblyError::Overrun {
                    key,
                    len: len as u64,
                });
            }
            let charge = self
                .budget
                .as_ref()
                .map(|b| b.try_take(h.message_len() as usize));
            let refused = matches!(charge, Some(None));
            let charge = charge.flatten();
            let mut data = if refused {
                self.refused.push(*h);
                Buf::Discard(0)
            } else {
                self.buf(len)
            };
            let written = data.extend(payload);
            debug_assert!(written, "checked against the announced length");
            let mut header = *h;
            header.flags &= !FLAG_MORE;
            self.partial.insert(
                key,
                Partial {
                    header,
                    data,
                    _charge: charge,
                },
            );
            return Ok(None);
        }
        let Some(p) = self.partial.get_mut(&key) else {
            return Err(ReassemblyError::NotStarted(key));
        };
        let len = p.len();
        let got = (p.data.len() + payload.len()) as u64;
        if got > len {
            return Err(ReassemblyError::Overrun { key, len });
        }
        if !h.more() && got < len {
            return Err(ReassemblyError::Short { key, got, len });
        }
        if !p.data.extend(payload) {
            return Err(ReassemblyError::Overrun { key, len });
        }
        if h.more() {
            return Ok(None);
        }
        let p = self.partial.remove(&key).expect("present above");
        if matches!(p.data, Buf::Discard(_)) {
            return Ok(None);
        }
        let data = p.data.freeze();
        let meta_end = p.header.meta_len as usize;
        Ok(Some(Incoming {
            header: p.header,
            meta: data.slice(..meta_end),
            body: data.slice(meta_end..),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rdma::REASSEMBLY_POOL_BYTES;
    use crate::wire::header::HEADER_LEN;

    fn first(meta_len: u32, body_len: u64, call_id: u64) -> Header {
        let mut h = Header::new(Kind::Request);
        h.conn_id = 1;
        h.call_id = call_id;
        h.status = 7;
        h.timeout_us = 99;
        h.meta_len = meta_len;
        h.body_len = body_len;
        h.flags = FLAG_MORE;
        h
    }

    fn cont(call_id: u64, len: usize, more: bool) -> Header {
        let mut h = Header::new(Kind::Continuation);
        h.conn_id = 1;
        h.call_id = call_id;
        h.body_len = len as u64;
        h.flags = if more { FLAG_MORE } else { 0 };
        h
    }

    #[test]
    fn interleaved_messages_come_out_whole_with_their_first_header() {
        let mut r = Reassembly::new(1 << 20, None, counters());
        let a: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
        let b: Vec<u8> = (0..130u32).map(|i| (i * 3) as u8).collect();
        assert!(r.on_chunk(&first(10, 240, 1), &a[..100]).unwrap().is_none());
        assert!(r.on_chunk(&first(0, 130, 2), &b[..60]).unwrap().is_none());
        assert!(
            r.on_chunk(&cont(1, 100, true), &a[100..200])
                .unwrap()
                .is_none()
        );
        let mb = r.on_chunk(&cont(2, 70, false), &b[60..]).unwrap().unwrap();
        assert_eq!(mb.header.call_id, 2);
        assert_eq!(&mb.body[..], &b[..]);
        assert_eq!(r.in_progress(), 1);
        let ma = r.on_chunk(&cont(1, 50, false), &a[200..]).unwrap().unwrap();
        assert_eq!(&ma.meta[..], &a[..10]);
        assert_eq!(&ma.body[..], &a[10..]);
        assert_eq!((ma.header.status, ma.header.timeout_us), (7, 99));
        assert!(!ma.header.more(), "FLAG_MORE cleared on the whole message");
        assert_eq!(r.in_progress(), 0);
    }

    #[test]
    fn announced_size_over_the_maximum_is_refused_before_allocating() {
        let mut r = Reassembly::new(1000, None, counters());
        let err = r
            .on_chunk(&first(0, u32::MAX.into(), 1), &[0; 10])
            .unwrap_err();
        assert!(matches!(err, ReassemblyError::TooLarge { .. }), "{err}");
        assert_eq!(r.in_progress(), 0);
        // exactly the maximum is fine
        assert!(r.on_chunk(&first(0, 960, 2), &[0; 10]).is_ok());
    }

    #[test]
    fn a_first_chunk_longer_than_its_announced_message_is_an_overrun() {
        for pool in [None, Some(soft_pool(REASSEMBLY_POOL_BYTES))] {
            let mut r = Reassembly::new(1 << 20, pool, counters());
            let err = r.on_chunk(&first(0, 10, 1), &[0; 11]).unwrap_err();
            assert!(matches!(err, ReassemblyError::Overrun { .. }), "{err}");
            assert_eq!(r.in_progress(), 0);
        }
    }

    #[test]
    fn messages_up_to_the_largest_class_are_reassembled_in_registered_memory_larger_ones_on_the_heap()
     {
        let pool = soft_pool(REASSEMBLY_POOL_BYTES);
        let c = counters();
        let mut r = Reassembly::new(8 << 20, Some(pool.clone()), c.clone());
        let body: Vec<u8> = (0..(3usize << 20)).map(|i| (i * 7) as u8).collect();
        let mut whole = Vec::new();
        // 1 MiB fits a 2 MiB class: registered; 3 MiB is above the largest class: heap.
        for (call, len) in [(1u64, 1usize << 20), (2, 3 << 20)] {
            let b = &body[..len];
            assert!(
                r.on_chunk(&first(0, len as u64, call), &b[..1000])
                    .unwrap()
                    .is_none()
            );
            let m = r
                .on_chunk(&cont(call, len - 1000, false), &b[1000..])
                .unwrap()
                .unwrap();
            assert!(&m.body[..] == b, "call {call} body");
            whole.push(m);
        }
        let held = |m: &Incoming| pool.contains(m.body.as_ptr());
        assert!(held(&whole[0]), "1 MiB message in the pool");
        assert!(!held(&whole[1]), "3 MiB message on the heap");
        assert_eq!(c.snapshot().reassembled_on_heap, 1);
    }

    #[test]
    fn a_used_up_pool_sends_messages_to_the_heap_until_its_buffers_come_back() {
        let pool = soft_pool(2 << 20); // one 2 MiB buffer
        let c = counters();
        let mut r = Reassembly::new(8 << 20, Some(pool.clone()), c.clone());
        let mut one = |call: u64| {
            let len = (1 << 20) + 100;
            r.on_chunk(&first(0, len, call), &[1; 100]).unwrap();
            r.on_chunk(
                &cont(call, len as usize - 100, false),
                &vec![2; len as usize - 100],
            )
            .unwrap()
            .unwrap()
        };
        let a = one(1);
        let b = one(2);
        assert!(pool.contains(a.body.as_ptr()) && !pool.contains(b.body.as_ptr()));
        assert_eq!(c.snapshot().reassembled_on_heap, 1);
        drop(a);
        let d = one(3);
        assert!(pool.contains(d.body.as_ptr()), "the buffer came back");
        assert_eq!(c.snapshot().reassembled_on_heap, 1);
    }

    #[test]
    fn a_message_over_the_budget_is_refused_at_its_first_chunk_and_never_kept() {
        let budget = MemoryBudget::new(300 << 10);
        let mut r = Reassembly::new(1 << 20, None, counters()).with_budget(budget.clone());
        let len = 200 << 10; // bytes after the header
        let chunk = vec![7u8; 100 << 10];
        // the first fits the budget and is charged its whole size
        assert!(r.on_chunk(&first(0, len, 1), &chunk).unwrap().is_none());
        assert_eq!(budget.used(), len as usize + HEADER_LEN);
        assert!(r.take_refused().is_empty());
        // the second does not fit: refused at once, its bytes counted and dropped
        assert!(r.on_chunk(&first(0, len, 2), &chunk).unwrap().is_none());
        let refused = r.take_refused();
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].call_id, 2);
        assert_eq!(
            budget.used(),
            len as usize + HEADER_LEN,
            "nothing taken for it"
        );
        assert!(
            r.on_chunk(&cont(2, chunk.len(), false), &chunk)
                .unwrap()
                .is_none()
        );
        assert_eq!(r.in_progress(), 1, "the refused message is gone");
        // the first completes and returns its charge
        let m = r
            .on_chunk(&cont(1, chunk.len(), false), &chunk)
            .unwrap()
            .unwrap();
        assert_eq!(m.body.len(), len as usize);
        assert_eq!(budget.used(), 0);
        // every reassembly is charged, however small
        assert!(
            r.on_chunk(&first(0, 1000, 3), &chunk[..500])
                .unwrap()
                .is_none()
        );
        assert_eq!(budget.used(), 1000 + HEADER_LEN);
    }

    #[test]
    fn a_long_first_chunk_is_sized_in_u64_and_checked_against_max_message_before_allocating() {
        let body = (1u64 << 32) + 1;
        let h = first(10, body, 1);
        assert_eq!(h.encoded_len(), crate::wire::header::LONG_HEADER_LEN);
        let whole = 48 + 10 + body;
        // one byte short of the maximum: refused, nothing started
        let mut r = Reassembly::new(whole as usize - 1, None, counters());
        let err = r.on_chunk(&h, &[0; 100]).unwrap_err();
        assert_eq!(
            err,
            ReassemblyError::TooLarge {
                key: (1, 1),
                len: whole,
                max: whole - 1
            }
        );
        assert_eq!(r.in_progress(), 0);
        // exactly the maximum: started, charged its whole size (48-byte header included)
        let budget = MemoryBudget::new(usize::MAX);
        let mut r = Reassembly::new(whole as usize, None, counters()).with_budget(budget.clone());
        assert!(r.on_chunk(&h, &[0; 100]).unwrap().is_none());
        assert_eq!((r.in_progress(), budget.used() as u64), (1, whole));
        // its continuation may not run past the announced length
        let err = r.on_chunk(&cont(1, 10, false), &[0; 10]).unwrap_err();
        assert!(matches!(err, ReassemblyError::Short { got: 110, len, .. } if len == 10 + body));
    }

    fn counters() -> Arc<LinkCounters> {
        Arc::new(LinkCounters::default())
    }

    /// A reassembly pool on the soft provider registering at most `limit` bytes (a link's
    /// has [`REASSEMBLY_POOL_BYTES`]).
    fn soft_pool(limit: u64) -> Pool {
        let ctx = byteexpress_verbs::soft_device()
            .expect("the soft device is always listed")
            .open()
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        Pool::new(
            &pd,
            byteexpress_mem::PoolConfig {
                limit,
                ..byteexpress_mem::PoolConfig::for_device(&ctx)
            },
        )
        .unwrap()
    }

    #[test]
    fn continuation_without_a_start_overrun_short_end_and_restart_are_errors() {
        let mut r = Reassembly::new(1 << 20, None, counters());
        assert_eq!(
            r.on_chunk(&cont(5, 10, false), &[0; 10]).unwrap_err(),
            ReassemblyError::NotStarted((1, 5))
        );
        r.on_chunk(&first(0, 100, 1), &[0; 50]).unwrap();
        assert!(matches!(
            r.on_chunk(&cont(1, 51, true), &[0; 51]).unwrap_err(),
            ReassemblyError::Overrun { .. }
        ));
        assert!(matches!(
            r.on_chunk(&cont(1, 49, false), &[0; 49]).unwrap_err(),
            ReassemblyError::Short { got: 99, .. }
        ));
        assert_eq!(
            r.on_chunk(&first(0, 100, 1), &[0; 50]).unwrap_err(),
            ReassemblyError::Restarted((1, 1))
        );
    }
}
