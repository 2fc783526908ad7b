//! Frames of `u32::MAX` bytes or more: the escape (`0xFFFF_FFFF` then a `u64` length), its
//! checks, and the unchanged 4-byte form below it.

use std::pin::Pin;
use std::task::{Context, Poll};

use byteexpress_tcp_fallback::{ESCAPE, Frame, FrameConfig, FrameError, FrameReader, FrameWriter};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream of `head`, then `fill` bytes of value `byte` made up as they are read (no memory
/// held for them), then `tail`.
struct Made {
    head: Vec<u8>,
    fill: usize,
    byte: u8,
    tail: Vec<u8>,
    pos: usize,
}

impl AsyncRead for Made {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let (h, f) = (self.head.len(), self.fill);
        let p = self.pos;
        let n = if p < h {
            let n = buf.remaining().min(h - p);
            buf.put_slice(&self.head[p..p + n]);
            n
        } else if p < h + f {
            let n = buf.remaining().min(h + f - p).min(1 << 20);
            let b = self.byte;
            buf.initialize_unfilled_to(n).fill(b);
            buf.advance(n);
            n
        } else {
            let t = p - h - f;
            let n = buf.remaining().min(self.tail.len() - t);
            buf.put_slice(&self.tail[t..t + n]);
            n
        };
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

fn made(head: Vec<u8>, fill: usize, byte: u8, tail: &[u8], max_frame: usize) -> FrameReader<Made> {
    let m = Made {
        head,
        fill,
        byte,
        tail: tail.to_vec(),
        pos: 0,
    };
    FrameReader::new(m, FrameConfig { max_frame })
}

/// A writer that keeps the first 16 bytes written and counts the rest.
#[derive(Default)]
struct Counting {
    first: Vec<u8>,
    total: usize,
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let keep = 16usize.saturating_sub(self.first.len()).min(buf.len());
        self.first.extend_from_slice(&buf[..keep]);
        self.total += buf.len();
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn reader_over(bytes: Vec<u8>, max_frame: usize) -> FrameReader<std::io::Cursor<Vec<u8>>> {
    FrameReader::new(std::io::Cursor::new(bytes), FrameConfig { max_frame })
}

/// An escaped frame header announcing `len` bytes.
fn escaped(len: u64) -> Vec<u8> {
    let mut v = ESCAPE.to_be_bytes().to_vec();
    v.extend_from_slice(&len.to_be_bytes());
    v
}

/// The bytes a writer puts before a payload of `len` bytes (the payload is zeroed memory,
/// mapped lazily, written to a sink that keeps only the first bytes).
async fn prefix_written(len: usize) -> Vec<u8> {
    let payload = vec![0u8; len];
    let mut w = FrameWriter::new(Counting::default(), FrameConfig { max_frame: len });
    w.write_frame(&[&payload]).await.unwrap();
    let out = w.into_inner();
    let prefix = out.total - len;
    assert_eq!(prefix, if len < ESCAPE as usize { 4 } else { 12 });
    out.first[..prefix].to_vec()
}

#[tokio::test]
async fn below_u32_max_the_length_is_4_bytes_and_from_u32_max_on_the_escape() {
    assert_eq!(prefix_written(0).await, [0, 0, 0, 0]);
    assert_eq!(
        prefix_written(ESCAPE as usize - 1).await,
        (ESCAPE - 1).to_be_bytes()
    );
    assert_eq!(
        prefix_written(ESCAPE as usize).await,
        escaped(ESCAPE.into())
    );
    assert_eq!(prefix_written((1 << 32) + 1).await, escaped((1 << 32) + 1));
}

#[tokio::test]
async fn an_escaped_frame_is_read_back_whole() {
    // a small payload in the long form is not what a writer sends, but the reader refuses
    // only lengths below the escape: check the long path end to end on 4 GiB + 1
    // (holds the 4 GiB + 1 frame once, as the reader buffers a whole frame)
    let len = (1usize << 32) + 1;
    let mut head = escaped(len as u64);
    head.push(7);
    let mut tail = vec![9];
    tail.extend_from_slice(&[0, 0, 0, 2, b'o', b'k']);
    let mut r = made(head, len - 2, 5, &tail, len);
    let f = r.read_frame().await.unwrap().unwrap();
    assert_eq!(
        (f.len(), f[0], f[1], f[len - 2], f[len - 1]),
        (len, 7, 5, 5, 9)
    );
    drop(f);
    assert_eq!(&r.read_frame().await.unwrap().unwrap()[..], b"ok");
    assert!(r.read_frame().await.unwrap().is_none());
}

#[tokio::test]
async fn an_escape_with_a_length_below_u32_max_is_garbled() {
    for len in [0u64, 1, u64::from(ESCAPE) - 1] {
        let mut r = reader_over(escaped(len), usize::MAX);
        assert!(
            matches!(r.read_frame().await, Err(FrameError::BadEscape { len: l }) if l == len),
            "{len}"
        );
    }
}

#[tokio::test]
async fn an_escaped_length_over_the_maximum_is_too_large_before_any_allocation() {
    let mut bytes = escaped(u64::MAX);
    bytes.extend_from_slice(&[1; 50]);
    let mut r = reader_over(bytes, 1 << 40);
    let cap = r.buffer_capacity();
    assert!(matches!(
        r.read_frame().await,
        Err(FrameError::TooLarge { len: u64::MAX, .. })
    ));
    assert_eq!(r.buffer_capacity(), cap);
    // the admission check is not asked either
    let mut r = reader_over(escaped(1 << 33), 1 << 32);
    let mut asked = false;
    assert!(matches!(
        r.read_frame_admit(40, |_| {
            asked = true;
            true
        })
        .await,
        Err(FrameError::TooLarge { len, .. }) if len == 1 << 33
    ));
    assert!(!asked);
}

#[tokio::test]
async fn a_stream_ending_inside_an_escaped_header_is_truncated_at_12_bytes() {
    let mut bytes = escaped(1 << 32);
    bytes.truncate(7);
    let mut r = reader_over(bytes, usize::MAX);
    assert!(matches!(
        r.read_frame().await,
        Err(FrameError::Truncated {
            expected: 12,
            received: 7
        })
    ));
}

#[tokio::test]
async fn a_refused_escaped_frame_is_skipped_and_the_next_frame_follows() {
    let len = (1usize << 32) + 3;
    let mut r = made(
        escaped(len as u64),
        len,
        0xCD,
        &[0, 0, 0, 1, b'z'],
        usize::MAX,
    );
    let mut seen = Vec::new();
    let f = r
        .read_frame_admit(48, |l| {
            seen.push(l);
            l < 100
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen, [len]);
    match f {
        Frame::Refused { head, len: l } => {
            assert_eq!((head.len(), l), (48, len));
            assert!(head.iter().all(|b| *b == 0xCD));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(r.buffer_capacity() < 1 << 20, "never buffered whole");
    let next = r.read_frame_admit(48, |_| true).await.unwrap().unwrap();
    assert_eq!(next, Frame::Whole(bytes::Bytes::from_static(b"z")));
}
