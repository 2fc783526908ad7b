//! Configuration of a [`crate::Pool`].

use byteexpress_verbs::{Access, Context};

use crate::MemError;

/// Largest class a pool may have, in bytes (so every buffer length fits an SGE's `u32`).
pub const MAX_CLASS_LIMIT: usize = 1 << 30;

/// Page size assumed for chunk lengths, in bytes.
pub(crate) const PAGE: usize = 4096;

/// How a [`crate::Pool`] carves and registers memory. [`PoolConfig::default`] suits an RPC
/// transport; [`PoolConfig::for_device`] also takes the device's `max_mr_size`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Smallest size class, bytes; a power of two. Default 256.
    pub min_class: usize,
    /// Largest size class, bytes; a power of two, at most `chunk_size` and
    /// [`MAX_CLASS_LIMIT`]. Larger requests fail with [`MemError::TooLarge`]. Default 2 MiB.
    pub max_class: usize,
    /// Bytes allocated and registered at a time, a multiple of 4096. Each chunk serves one
    /// class at a time. Default 2 MiB.
    pub chunk_size: usize,
    /// Most bytes the pool registers in all, reserves included. Beyond it allocations wait
    /// ([`crate::Pool::alloc`]) or fail ([`crate::Pool::try_alloc`]). Default 256 MiB.
    pub limit: u64,
    /// Most buffers moved between a thread cache and the pool's free list at once. Default 32.
    pub batch: usize,
    /// Bytes a batch may hold: large classes move fewer buffers (at least one) per batch, so a
    /// thread cache strands at most about `2 × batch_bytes` per class. Default 256 KiB.
    pub batch_bytes: usize,
    /// Largest single MR, bytes: a chunk above it is registered as several MRs. Default
    /// `u64::MAX`; [`PoolConfig::for_device`] takes the device's `max_mr_size`.
    pub max_mr_size: u64,
    /// Access flags of the MRs. Default LOCAL_WRITE: the device may write (receives, READ
    /// responses), no peer may touch the memory by address. Grant remote access only where a
    /// peer must have it; for one message's READ, lend instead ([`crate::Pool::lend_for_read`]).
    pub access: Access,
    /// Ask for transparent huge pages on chunks (`madvise(MADV_HUGEPAGE)`), silently doing
    /// without when the kernel refuses. Explicit `MAP_HUGETLB` pages need a verbs-level
    /// allocation option that `Pd::alloc_shared` does not offer yet. Default true.
    pub huge_pages: bool,
    /// The pool lends messages for an RDMA READ ([`crate::Pool::lend_for_read`]). Its memory
    /// is then allocated as readable by a peer (on the soft provider, mapped read-only by the
    /// peers of the PD; a NIC ignores this), so a pool that never lends (a receive ring, a
    /// reassembly pool) keeps LOCAL_WRITE memory local. Pools whose MRs grant no write (send
    /// rings) are readable anyway. Default false.
    pub lends_for_read: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            min_class: 256,
            max_class: 2 << 20,
            chunk_size: 2 << 20,
            limit: 256 << 20,
            batch: 32,
            batch_bytes: 256 << 10,
            max_mr_size: u64::MAX,
            access: Access::LOCAL_WRITE,
            huge_pages: true,
            lends_for_read: false,
        }
    }
}

impl PoolConfig {
    /// The defaults with `max_mr_size` from `ctx.query()`.
    pub fn for_device(ctx: &Context) -> Self {
        PoolConfig {
            max_mr_size: ctx.query().max_mr_size,
            ..PoolConfig::default()
        }
    }

    /// Bytes per MR piece of a chunk: the whole chunk when the device allows, else the largest
    /// power of two within `max_mr_size`, so power-of-two buffers never straddle two pieces.
    pub(crate) fn mr_span(&self) -> usize {
        if self.chunk_size as u64 <= self.max_mr_size {
            return self.chunk_size;
        }
        1usize << (63 - self.max_mr_size.max(1).leading_zeros())
    }

    /// Buffers of `size` bytes moved per refill or flush.
    pub(crate) fn batch_for(&self, size: usize) -> usize {
        (self.batch_bytes / size).clamp(1, self.batch)
    }

    /// Checks every field; errors name the first bad one.
    pub(crate) fn validate(&self) -> Result<(), MemError> {
        let bad = |what: String| Err(MemError::InvalidConfig(what));
        if !self.min_class.is_power_of_two() || !self.max_class.is_power_of_two() {
            return bad(format!(
                "classes must be powers of two (min_class {}, max_class {})",
                self.min_class, self.max_class
            ));
        }
        if self.min_class > self.max_class || self.max_class > MAX_CLASS_LIMIT {
            return bad(format!(
                "need min_class {} <= max_class {} <= {MAX_CLASS_LIMIT}",
                self.min_class, self.max_class
            ));
        }
        if self.chunk_size == 0
            || !self.chunk_size.is_multiple_of(PAGE)
            || self.chunk_size < self.max_class
        {
            return bad(format!(
                "chunk_size {} must be a multiple of {PAGE} and >= max_class {}",
                self.chunk_size, self.max_class
            ));
        }
        if self.mr_span() < self.max_class {
            return bad(format!(
                "max_class {} exceeds the device's max_mr_size {}",
                self.max_class, self.max_mr_size
            ));
        }
        if self.batch == 0 {
            return bad("batch must be at least 1".into());
        }
        if self
            .access
            .contains(byteexpress_verbs::Access::REMOTE_WRITE)
            && !self.access.contains(byteexpress_verbs::Access::LOCAL_WRITE)
        {
            return bad("REMOTE_WRITE needs LOCAL_WRITE".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::PoolConfig;
    use crate::MemError;

    #[test]
    fn bad_configs_are_refused_with_the_field_named() {
        let cases = [
            PoolConfig {
                min_class: 300,
                ..PoolConfig::default()
            },
            PoolConfig {
                max_class: 4 << 20,
                ..PoolConfig::default()
            },
            PoolConfig {
                chunk_size: 5000,
                ..PoolConfig::default()
            },
            PoolConfig {
                max_mr_size: 1 << 20,
                ..PoolConfig::default()
            },
            PoolConfig {
                batch: 0,
                ..PoolConfig::default()
            },
        ];
        for cfg in cases {
            assert!(
                matches!(cfg.validate(), Err(MemError::InvalidConfig(_))),
                "{cfg:?}"
            );
        }
        assert!(PoolConfig::default().validate().is_ok());
    }

    #[test]
    fn mr_pieces_are_the_largest_power_of_two_within_the_device_limit() {
        let cfg = PoolConfig {
            chunk_size: 8 << 20,
            max_mr_size: (3 << 20) + 5,
            ..PoolConfig::default()
        };
        assert_eq!(cfg.mr_span(), 2 << 20);
        assert_eq!(PoolConfig::default().mr_span(), 2 << 20);
        let odd = PoolConfig {
            chunk_size: 20 << 10,
            max_class: 16 << 10,
            ..PoolConfig::default()
        };
        assert_eq!(odd.mr_span(), 20 << 10, "one MR when the device allows");
        assert_eq!(cfg.batch_for(256), 32);
        assert_eq!(cfg.batch_for(64 << 10), 4);
        assert_eq!(cfg.batch_for(2 << 20), 1);
    }
}
