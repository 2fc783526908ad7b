//! Reads grow while they keep filling what they are offered: a socket holding many 16 KiB
//! frames (64 answers in flight) is read several frames per syscall, not about one read per
//! frame as with a fixed 8 KiB read beyond each frame (`bx ps bench --config c64_16k`
//! counted 2.1 `recvfrom` per call on the TCP rows, against 0.36 for the floor's client).

use std::pin::Pin;
use std::task::{Context, Poll};

use byteexpress_tcp_fallback::{FrameConfig, FrameReader};
use tokio::io::{AsyncRead, ReadBuf};

/// Bytes handed out as a socket with all of them queued would: as many as the read asks for,
/// or `cap` at most. Counts the reads.
struct Queued {
    data: Vec<u8>,
    at: usize,
    cap: usize,
    reads: usize,
}

impl AsyncRead for Queued {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = (self.data.len() - self.at)
            .min(buf.remaining())
            .min(self.cap);
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        self.reads += 1;
        Poll::Ready(Ok(()))
    }
}

fn frames(n: usize, len: usize) -> Vec<u8> {
    let mut data = Vec::new();
    for i in 0..n {
        data.extend_from_slice(&(len as u32).to_be_bytes());
        data.extend((0..len).map(|j| (i + j) as u8));
    }
    data
}

async fn read_all(r: &mut FrameReader<Queued>, n: usize, len: usize) {
    for i in 0..n {
        let f = r.read_frame().await.unwrap().expect("a frame");
        assert_eq!(f.len(), len);
        assert_eq!(f[0], i as u8, "frame {i} whole and in order");
    }
}

#[tokio::test]
async fn queued_16_kib_frames_are_read_several_per_read() {
    const N: usize = 64;
    const LEN: usize = 16 * 1024;
    let q = Queued {
        data: frames(N, LEN),
        at: 0,
        cap: usize::MAX,
        reads: 0,
    };
    let mut r = FrameReader::new(q, FrameConfig { max_frame: 1 << 20 });
    read_all(&mut r, N, LEN).await;
    let reads = r.get_ref().reads;
    eprintln!("{reads} reads for {N} frames");
    assert!(
        reads <= N / 2,
        "{reads} reads for {N} frames of 16 KiB (65 with a fixed 8 KiB read beyond each frame)"
    );
    assert!(
        r.buffer_capacity() <= 2 * (LEN + 64 * 1024),
        "read size stays bounded: capacity {}",
        r.buffer_capacity()
    );
}
