//! A large frame is read into one buffer of its own size, never a doubled one: a 4 GiB frame
//! arriving in pieces behind an earlier frame made the reader ask for 8.6 GB and the process
//! abort (`BytesMut::reserve` grows a shared buffer to twice its capacity).

use std::alloc::{GlobalAlloc, Layout, System};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use byteexpress_tcp_fallback::{FrameConfig, FrameReader};
use tokio::io::{AsyncRead, ReadBuf};

/// The largest single allocation (or reallocation) asked for so far.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

struct Tracking;

// SAFETY: forwards to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Hands out its bytes in the pieces `sizes` gives (then what is left), as a socket does.
struct Pieces {
    data: Vec<u8>,
    at: usize,
    sizes: Vec<usize>,
}

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let piece = if self.sizes.is_empty() {
            usize::MAX
        } else {
            self.sizes.remove(0)
        };
        let n = (self.data.len() - self.at).min(piece).min(buf.remaining());
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_large_frame_behind_a_small_one_gets_a_buffer_of_its_own_size() {
    const BIG: usize = 24 << 20;
    let mut data = 10u32.to_be_bytes().to_vec();
    data.extend_from_slice(&[7; 10]);
    data.extend_from_slice(&(BIG as u32).to_be_bytes());
    data.extend((0..BIG).map(|i| i as u8));
    let mut r = FrameReader::new(
        Pieces {
            data,
            at: 0,
            // The small frame and the large one's header, then all of it but 100 bytes: the
            // reader then wants the last 100, less than its usual read of 8 KiB.
            sizes: vec![14 + 4, BIG - 100],
        },
        FrameConfig { max_frame: BIG },
    );
    LARGEST.store(0, Ordering::Relaxed); // the test's own input is not the reader's
    let small = r.read_frame().await.unwrap().expect("the small frame");
    assert_eq!(&small[..], &[7; 10]);
    let big = r.read_frame().await.unwrap().expect("the large frame");
    assert_eq!(big.len(), BIG);
    assert!(big.iter().enumerate().all(|(i, &b)| b == i as u8));
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= BIG + (64 << 10),
        "the reader asked for {largest} bytes for a frame of {BIG}"
    );
}
