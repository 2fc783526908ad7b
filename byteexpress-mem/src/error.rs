//! Errors of the allocator, and the RLIMIT_MEMLOCK diagnosis of refused registrations.

/// Errors of [`crate::Pool`], [`crate::RecvReserve`], [`crate::BufPool`] and their buffers.
/// None of them is fatal: exhaustion is backpressure, everything else is a refused request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemError {
    /// The pool reached its limit and has no free buffer of this class; drop buffers (or the
    /// `Bytes` frozen from them) and retry, or wait with [`crate::Pool::alloc`].
    #[error(
        "registered memory exhausted: no free {class_size}-byte buffer and {registered} of {limit} bytes registered"
    )]
    Exhausted {
        /// Bytes per buffer of the class asked for.
        class_size: usize,
        /// Bytes registered by the pool.
        registered: u64,
        /// The pool's limit in bytes.
        limit: u64,
    },
    /// The memory named is not (all) inside one chunk of this pool.
    #[error("{len} bytes at {addr:#x} are not memory of this pool")]
    NotPoolMemory {
        /// First byte named.
        addr: u64,
        /// Bytes named.
        len: usize,
    },
    /// Every buffer of a receive reserve (or [`crate::BufPool`]) is in use.
    #[error("buffer reserve exhausted ({count} buffers of {buf_size} bytes in use)")]
    ReserveEmpty {
        /// Buffers in the reserve.
        count: usize,
        /// Bytes per buffer.
        buf_size: usize,
    },
    /// [`crate::Pool::alloc`] gave up at its deadline while the pool stayed exhausted.
    #[error("no {len}-byte buffer became free before the deadline")]
    DeadlineExceeded {
        /// Bytes asked for.
        len: usize,
    },
    /// The request is larger than the pool's largest class.
    #[error("{len} bytes exceed the largest buffer class ({max} bytes)")]
    TooLarge {
        /// Bytes asked for.
        len: usize,
        /// Bytes of the largest class.
        max: usize,
    },
    /// Data does not fit in the free space of a buffer; nothing was written.
    #[error("{len} bytes do not fit in {free} free")]
    NoRoom {
        /// Bytes offered.
        len: usize,
        /// Bytes free in the buffer.
        free: usize,
    },
    /// The device refused to pin more memory (ENOMEM/EPERM from memory registration): the
    /// process's locked-memory limit is the usual cause.
    #[error(
        "memory registration refused after {registered} bytes (asked {requested} more): RLIMIT_MEMLOCK is {soft} (hard {hard}); raise it (ulimit -l, LimitMEMLOCK=) or lower the pool limit: {source}"
    )]
    Memlock {
        /// Bytes the pool had registered before.
        registered: u64,
        /// Bytes the refused registration asked for.
        requested: u64,
        /// Soft RLIMIT_MEMLOCK in bytes (`unlimited` when `u64::MAX`).
        soft: u64,
        /// Hard RLIMIT_MEMLOCK in bytes.
        hard: u64,
        /// The verbs error.
        #[source]
        source: byteexpress_verbs::Error,
    },
    /// The [`crate::MrCache`] cannot register more without exceeding a limit: every entry is in
    /// use (drop [`crate::CachedMr`] handles as WRs complete, then retry), or the region alone
    /// exceeds `max_bytes`.
    #[error(
        "MR cache full: {requested} more bytes would exceed the limits ({registered} of {max_bytes} bytes, {entries} of {max_entries} entries registered, all in use)"
    )]
    CacheFull {
        /// Bytes the new registration needs.
        requested: u64,
        /// Bytes the cache has registered.
        registered: u64,
        /// [`crate::MrCacheConfig::max_bytes`].
        max_bytes: u64,
        /// Entries the cache holds.
        entries: u64,
        /// [`crate::MrCacheConfig::max_entries`].
        max_entries: usize,
    },
    /// A configuration value is out of range; the message names it.
    #[error("invalid pool configuration: {0}")]
    InvalidConfig(String),
    /// Allocating or registering memory failed for another reason.
    #[error("registering pool memory: {0}")]
    Verbs(#[from] byteexpress_verbs::Error),
}

/// `(soft, hard)` RLIMIT_MEMLOCK of this process in bytes; `u64::MAX` means unlimited.
pub fn memlock_limit() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer to a local.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if rc != 0 {
        return (0, 0);
    }
    let bytes = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            v
        }
    };
    (bytes(lim.rlim_cur), bytes(lim.rlim_max))
}

/// Turns a registration error into [`MemError::Memlock`] when the device refused to pin memory
/// (ENOMEM or EPERM), else into [`MemError::Verbs`].
pub(crate) fn registration_error(
    e: byteexpress_verbs::Error,
    registered: u64,
    requested: u64,
) -> MemError {
    let pinning = matches!(&e, byteexpress_verbs::Error::Os { .. })
        && matches!(e.errno(), libc::ENOMEM | libc::EPERM);
    if pinning {
        let (soft, hard) = memlock_limit();
        MemError::Memlock {
            registered,
            requested,
            soft,
            hard,
            source: e,
        }
    } else {
        MemError::Verbs(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(errno: i32) -> byteexpress_verbs::Error {
        byteexpress_verbs::Error::Os {
            what: "ibv_reg_mr",
            source: std::io::Error::from_raw_os_error(errno),
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "getrlimit is a foreign call")]
    fn a_refused_pinning_names_rlimit_memlock_and_its_value() {
        let (soft, _) = memlock_limit();
        for errno in [libc::ENOMEM, libc::EPERM] {
            let e = registration_error(os(errno), 4 << 20, 2 << 20);
            assert!(matches!(e, MemError::Memlock { requested, .. } if requested == 2 << 20));
            let msg = e.to_string();
            assert!(msg.contains("RLIMIT_MEMLOCK"), "{msg}");
            assert!(msg.contains(&soft.to_string()), "{msg}");
        }
    }

    #[test]
    fn other_registration_errors_stay_verbs_errors() {
        assert!(matches!(
            registration_error(os(libc::EINVAL), 0, 4096),
            MemError::Verbs(_)
        ));
        assert!(matches!(
            registration_error(byteexpress_verbs::Error::QueueFull("sq"), 0, 4096),
            MemError::Verbs(_)
        ));
    }
}
