//! Registered memory for ByteExpress: buffers the NIC (or the soft provider) reads and writes
//! directly, so payloads move between the application and the network with no extra copy.
//!
//! This version offers one size class: a [`BufPool`] of fixed-size buffers carved from a single
//! [`byteexpress_verbs::Pd::alloc_shared`] chunk registered once. A [`PoolBuf`] knows its address,
//! lkey and rkey, fills through [`bytes::BufMut`], and freezes into [`bytes::Bytes`] (through
//! `Bytes::from_owner`) whose last clone returns the buffer to its pool.
//!
//! Invariant (DESIGN.md): memory named in a posted WR belongs to that WR until its completion.
//! Upper layers keep the [`PoolBuf`] inside the record of the posted WR and take it back only from
//! the WR's completion, so the buffer cannot return to the pool while the device may touch it.

mod pool;
mod registry;

pub use pool::{BufPool, MemError, PoolBuf, PoolStats};
pub use registry::is_pool_memory;
