//! Registered memory for ByteExpress: buffers the NIC (or the soft provider) reads and writes
//! directly, so payloads move between the application and the network with no extra copy.
//!
//! - [`Pool`]: power-of-two size classes ([`PoolConfig::min_class`] 256 B to
//!   [`PoolConfig::max_class`] 2 MiB by default) carved from chunks of
//!   [`PoolConfig::chunk_size`] bytes (2 MiB) that come from [`byteexpress_verbs::Pd::alloc_shared`]
//!   and are registered once; a chunk above the device's `max_mr_size` is registered as several
//!   MRs, cut so that no buffer straddles two. Chunks are added on demand up to
//!   [`PoolConfig::limit`] bytes; at the limit, a chunk whose buffers are all free moves to the
//!   class that needs it, still registered. Huge pages: transparent ones are requested with
//!   `madvise`; explicit `MAP_HUGETLB` pages need an allocation option in `byteexpress-verbs`.
//! - Thread-local caches per pool and class, refilled and flushed in batches (module `cache`
//!   documents where a buffer freed on another thread goes).
//! - [`RegisteredBuf`] implements [`bytes::BufMut`], knows address, lkey, rkey and its
//!   [`byteexpress_verbs::Sge`], and [`RegisteredBuf::freeze`]s into [`bytes::Bytes`] through
//!   `Bytes::from_owner`: the last clone returns the memory. `BytesMut::from(bytes)` copies and
//!   releases the buffer at once.
//! - [`RecvReserve`] ([`Pool::reserve`]): receive buffers that ordinary allocations cannot take.
//! - Exhaustion is backpressure: [`Pool::alloc`] waits (with an optional deadline),
//!   [`Pool::try_alloc`] returns [`MemError::Exhausted`]; a registration refused for
//!   RLIMIT_MEMLOCK says so ([`MemError::Memlock`]).
//! - [`PoolStats`]: bytes registered, buffers in use per class, cache hits and misses, waits,
//!   exhaustions.
//! - [`MrCache`]: MRs for memory the pool did not allocate ([`byteexpress_verbs::UserRegion`]:
//!   `Vec`, `Bytes`, [`AnonMap`] …): interval lookup keyed by address and owner, LRU bounded in
//!   bytes and entries, in-use entries pinned by [`CachedMr`] handles, `invalidate(range)`.
//! - [`LargePool`] / [`LargeBuf`]: registered buffers of any size, one region and MR each,
//!   reused through a bounded free list: the rendezvous of large messages (a body lent for a
//!   peer's READ, the destination we READ into).
//! - [`BufPool`]: a fixed number of equal buffers, a thin layer over one pool and reserve.
//! - Least access (DESIGN.md 3.2): pools grant LOCAL_WRITE by default ([`PoolConfig::access`]),
//!   a link's receive ring LOCAL_WRITE ([`BufPool::for_receives`]) and its send ring nothing
//!   ([`BufPool::for_sends`]); no peer reaches them by address. Bytes a peer must RDMA READ are
//!   lent for one message ([`Pool::lend_for_read`] → [`ReadLoan`]: their own REMOTE_READ MR,
//!   deregistered when the loan ends).
//!
//! - [`PostedSends`]: send WRs in posting order, signaled or not ([`SendFlags`]), each
//!   holding its buffer until a completion covers it (selective signaling), or none when
//!   posted inline.
//!
//! Invariant (DESIGN.md): memory named in a posted WR belongs to that WR until its completion.
//! Upper layers keep the buffer inside the record of the posted WR and take it back only from
//! the WR's completion, so it cannot return to the pool while the device may touch it.

mod backing;
mod buf;
mod cache;
mod class;
mod config;
mod error;
mod fixed;
mod large;
mod loan;
mod mmap;
mod mr_cache;
mod pool;
mod posted;
mod posted_sends;
mod registry;
mod reserve;
mod shared;
mod stats;

#[cfg(test)]
mod tests;

pub use buf::RegisteredBuf;
pub use config::{MAX_CLASS_LIMIT, PoolConfig};
pub use error::{MemError, memlock_limit};
pub use fixed::{BufPool, PoolBuf};
pub use large::{IN_STEP, LargeBuf, LargePool, REGION_ALIGN};
pub use loan::ReadLoan;
pub use mmap::AnonMap;
pub use mr_cache::{CachedMr, MrCache, MrCacheConfig, MrCacheStats};
pub use pool::Pool;
pub use posted::PostedBufs;
pub use posted_sends::{Done, PostedSends, SendFlags};
pub use registry::is_pool_memory;
pub use reserve::RecvReserve;
pub use stats::{ClassStats, PoolStats};
