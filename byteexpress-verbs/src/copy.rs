//! Copies of large payloads the way a NIC's DMA writes them: past the cache.
//!
//! The soft provider copies the data of an RDMA READ or WRITE, and byteexpress-mem a message
//! it lends for READ, with this copy instead of `memcpy` (a SEND's payload, read by its
//! receiver at once, goes through the cache). Beyond [`STREAM_MIN`] bytes it writes
//! the destination with non-temporal stores (`movntdq`, `vmovntdq`): the bytes go to memory
//! without first reading each destination line into the cache and without evicting the
//! reader's working set, as a device's DMA does. On this project's 2-core AMD EPYC, copying
//! 256 MiB in 1 MiB pieces (a READ's pieces): glibc `memcpy` 10.0 GB/s, SSE2 streaming
//! 16.4 GB/s, AVX2 streaming 19.3 GB/s (DESIGN.md 6.24). Smaller copies, overlapping ranges
//! and other architectures use `std::ptr::copy`.

/// Bytes from which [`dma_copy`] streams past the cache (smaller copies are likely read
/// again soon, from the cache): the smallest READ piece the RPC engine posts.
pub const STREAM_MIN: usize = 64 << 10;

/// Copies `len` bytes from `src` to `dst`: with non-temporal stores when `len` ≥
/// [`STREAM_MIN`] and the ranges do not overlap (x86-64), else as `std::ptr::copy`. The
/// streamed stores are fenced (`sfence`) before it returns, so a store the caller makes
/// afterwards (a completion, a length) is not seen before the copied bytes.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, as for
/// `std::ptr::copy`; the ranges may overlap.
pub unsafe fn dma_copy(dst: *mut u8, src: *const u8, len: usize) {
    let (s, d) = (src as usize, dst as usize);
    let apart =
        s.checked_add(len).is_some_and(|e| e <= d) || d.checked_add(len).is_some_and(|e| e <= s);
    if len >= STREAM_MIN && apart {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the caller's contract, and the ranges do not overlap.
            unsafe { x86::stream(dst, src, len) };
            return;
        }
    }
    // SAFETY: the caller's contract; `copy` allows overlap.
    unsafe { std::ptr::copy(src, dst, len) };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128, _mm256_loadu_si256,
        _mm256_stream_si256,
    };

    /// Bytes per loop step: one cache line.
    const LINE: usize = 64;

    /// Streams `len` non-overlapping bytes: a plain copy up to `dst`'s next cache line, then
    /// whole lines with streaming stores, then a plain copy of the tail, then `sfence`.
    ///
    /// # Safety
    /// As [`super::dma_copy`], and the ranges do not overlap.
    pub(super) unsafe fn stream(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: the caller's contract; AVX2 asked for only where the CPU has it.
        unsafe { stream_with(dst, src, len, std::is_x86_feature_detected!("avx2")) }
    }

    /// As [`stream`], with AVX2 stores when `avx2`, else SSE2.
    ///
    /// # Safety
    /// As [`stream`]; `avx2` only on a CPU that has AVX2.
    pub(super) unsafe fn stream_with(dst: *mut u8, src: *const u8, len: usize, avx2: bool) {
        let head = (LINE - dst as usize % LINE) % LINE;
        let head = head.min(len);
        let lines = (len - head) / LINE;
        let tail = len - head - lines * LINE;
        // SAFETY: `head ≤ len`; both ranges valid for `len` bytes and apart (caller).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        // SAFETY: `[head, head + lines × 64)` lies inside both ranges and `dst + head` is
        // 64-byte aligned, as the streaming stores need; AVX2 only where the CPU has it
        // (the caller's contract).
        unsafe {
            let (d, s) = (dst.add(head), src.add(head));
            if avx2 {
                lines_avx2(d, s, lines);
            } else {
                lines_sse2(d, s, lines);
            }
        }
        let done = head + lines * LINE;
        // SAFETY: `[done, len)` lies inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), tail) };
        // SAFETY: `sfence` has no memory operands; SSE is part of x86-64.
        unsafe { _mm_sfence() };
    }

    /// # Safety
    /// `dst` 64-byte aligned; `lines × 64` bytes valid at both; the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn lines_avx2(dst: *mut u8, src: *const u8, lines: usize) {
        for i in 0..lines {
            // SAFETY: line `i` lies inside both ranges; `dst + 64 i` and `+ 32` are 32-byte
            // aligned; unaligned loads have no alignment need.
            unsafe {
                let (d, s) = (dst.add(i * LINE), src.add(i * LINE));
                let a = _mm256_loadu_si256(s.cast::<__m256i>());
                let b = _mm256_loadu_si256(s.add(32).cast::<__m256i>());
                _mm256_stream_si256(d.cast::<__m256i>(), a);
                _mm256_stream_si256(d.add(32).cast::<__m256i>(), b);
            }
        }
    }

    /// # Safety
    /// `dst` 64-byte aligned; `lines × 64` bytes valid at both.
    unsafe fn lines_sse2(dst: *mut u8, src: *const u8, lines: usize) {
        for i in 0..lines {
            // SAFETY: line `i` lies inside both ranges; each 16-byte store is 16-byte aligned;
            // SSE2 is part of x86-64.
            unsafe {
                let (d, s) = (dst.add(i * LINE), src.add(i * LINE));
                for k in 0..4 {
                    let v = _mm_loadu_si128(s.add(16 * k).cast::<__m128i>());
                    _mm_stream_si128(d.add(16 * k).cast::<__m128i>(), v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every offset pair and length class around the streaming threshold and the cache-line
    /// head and tail copies exactly, and nothing outside the destination range changes.
    #[test]
    fn streamed_copies_are_exact_at_every_alignment_and_touch_only_their_range() {
        let n = STREAM_MIN + 300;
        let src: Vec<u8> = (0..n + 128).map(|i| (i * 7 + 3) as u8).collect();
        for len in [
            0,
            1,
            63,
            64,
            65,
            STREAM_MIN - 1,
            STREAM_MIN,
            STREAM_MIN + 1,
            n,
        ] {
            for (so, doff) in [(0, 0), (1, 0), (0, 1), (13, 57), (63, 64)] {
                let mut dst = vec![0xAAu8; n + 192];
                // SAFETY: `so + len ≤ src.len()` and `doff + len ≤ dst.len()`, two vectors.
                unsafe { dma_copy(dst.as_mut_ptr().add(doff), src.as_ptr().add(so), len) };
                assert_eq!(
                    &dst[doff..doff + len],
                    &src[so..so + len],
                    "len {len} at {so}/{doff}"
                );
                assert!(dst[..doff].iter().all(|&b| b == 0xAA), "before the range");
                assert!(
                    dst[doff + len..].iter().all(|&b| b == 0xAA),
                    "after the range"
                );
            }
        }
    }

    /// Both instruction sets' line loops copy exactly (a CPU with AVX2 would otherwise never
    /// run the SSE2 loop under test).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_sse2_and_avx2_line_loops_copy_exactly() {
        let len = STREAM_MIN + 77;
        let src: Vec<u8> = (0..len + 64).map(|i| (i * 13 + 1) as u8).collect();
        let mut sets = vec![false];
        if std::is_x86_feature_detected!("avx2") {
            sets.push(true);
        }
        for avx2 in sets {
            for (so, doff) in [(0, 0), (5, 9), (63, 1)] {
                let mut dst = vec![0u8; len + 128];
                // SAFETY: both ranges lie inside their vectors and do not overlap; AVX2 only
                // when detected.
                unsafe {
                    x86::stream_with(dst.as_mut_ptr().add(doff), src.as_ptr().add(so), len, avx2)
                };
                assert_eq!(&dst[doff..doff + len], &src[so..so + len], "avx2 {avx2}");
                assert!(dst[doff + len..].iter().all(|&b| b == 0));
            }
        }
    }

    /// Overlapping ranges are copied as `memmove` would (no streaming).
    #[test]
    fn overlapping_ranges_copy_as_memmove() {
        let len = STREAM_MIN + 100;
        let mut buf: Vec<u8> = (0..len + 4096).map(|i| i as u8).collect();
        let want: Vec<u8> = buf[..len].to_vec();
        let p = buf.as_mut_ptr();
        // SAFETY: both ranges lie inside `buf`.
        unsafe { dma_copy(p.add(4096), p, len) };
        assert_eq!(&buf[4096..4096 + len], &want[..]);
    }
}
