//! Tests of the allocator's logic. Outside miri they run on the soft device's registered memory;
//! under miri (which cannot call the provider's system calls) on heap chunks with made-up keys.

mod behaviour;
mod properties;

use crate::{Pool, PoolConfig};

/// A pool on the soft device (or the heap under miri).
pub(crate) fn pool(cfg: PoolConfig) -> Pool {
    #[cfg(miri)]
    {
        Pool::with_backend(Box::new(crate::backing::HeapBackend::default()), cfg).unwrap()
    }
    #[cfg(not(miri))]
    {
        Pool::new(&soft_pd(), cfg).unwrap()
    }
}

/// A protection domain on the soft device.
#[cfg(not(miri))]
pub(crate) fn soft_pd() -> byteexpress_verbs::Pd {
    byteexpress_verbs::soft_device()
        .expect("soft device")
        .open()
        .expect("open soft device")
        .alloc_pd()
        .expect("pd")
}

/// Classes 256 B to 16 KiB in 64 KiB chunks, at most four chunks, batches of 8.
pub(crate) fn small() -> PoolConfig {
    PoolConfig {
        min_class: 256,
        max_class: 16 << 10,
        chunk_size: 64 << 10,
        limit: 256 << 10,
        batch: 8,
        batch_bytes: 16 << 10,
        huge_pages: false,
        ..PoolConfig::default()
    }
}

#[cfg(not(miri))]
mod mr_cache;
