//! The size-class ladder: powers of two from `min_class` to `max_class` bytes.
//!
//! Why powers of two and not a finer geometric ladder: every class then divides a power-of-two
//! span exactly, so a chunk carved for one class has no tail waste, a buffer never straddles two
//! MRs when a chunk is registered in several, and every buffer is aligned to its own size (up to
//! the page size of the mapping). The class of a length is one leading-zeros instruction. The
//! price is internal waste of at most half a buffer (a quarter on average for uniform sizes);
//! RPC messages are encoded into a buffer of `encoded_len()` rounded up, and registered memory is
//! bounded by [`crate::PoolConfig::limit`] rather than by this waste, so the simpler ladder wins.

/// The classes of a pool, `1 << min_shift ..= 1 << max_shift` bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Classes {
    min_shift: u32,
    max_shift: u32,
}

impl Classes {
    /// `min` and `max` are powers of two with `min <= max` (checked by the config).
    pub(crate) fn new(min: usize, max: usize) -> Self {
        Classes {
            min_shift: min.trailing_zeros(),
            max_shift: max.trailing_zeros(),
        }
    }

    /// Number of classes.
    pub(crate) fn count(&self) -> usize {
        (self.max_shift - self.min_shift + 1) as usize
    }

    /// The smallest class holding `len` bytes, or `None` when `len` exceeds the largest class.
    /// A zero length gets the smallest class.
    #[inline]
    pub(crate) fn index(&self, len: usize) -> Option<usize> {
        let shift = if len <= 1 {
            0
        } else {
            usize::BITS - (len - 1).leading_zeros()
        };
        if shift > self.max_shift {
            return None;
        }
        Some(shift.max(self.min_shift) as usize - self.min_shift as usize)
    }

    /// Bytes per buffer of class `idx`.
    pub(crate) fn size(&self, idx: usize) -> usize {
        1usize << (self.min_shift as usize + idx)
    }

    /// Bytes of the largest class.
    pub(crate) fn max_size(&self) -> usize {
        1usize << self.max_shift
    }
}

#[cfg(test)]
mod tests {
    use super::Classes;

    #[test]
    fn a_length_gets_the_smallest_power_of_two_class_that_holds_it() {
        let c = Classes::new(256, 2 << 20);
        assert_eq!(c.count(), 14);
        assert_eq!(c.index(0), Some(0));
        assert_eq!(c.index(1), Some(0));
        assert_eq!(c.index(256), Some(0));
        assert_eq!(c.index(257), Some(1));
        assert_eq!(c.size(1), 512);
        assert_eq!(c.index(2 << 20), Some(13));
        assert_eq!(c.size(13), 2 << 20);
        assert_eq!(c.index((2 << 20) + 1), None);
        assert_eq!(c.index(usize::MAX), None);
        for len in [3usize, 1000, 4096, 4097, 65_535, 1 << 20] {
            let i = c.index(len).unwrap();
            assert!(c.size(i) >= len && (i == 0 || c.size(i - 1) < len));
        }
    }
}
