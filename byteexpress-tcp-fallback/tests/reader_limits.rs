//! Size limits, truncation, end of stream and read batching of `FrameReader` / `FrameWriter`.

use std::pin::Pin;
use std::task::{Context, Poll};

use byteexpress_tcp_fallback::{FrameConfig, FrameError, FrameReader, FrameWriter};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf, duplex};

fn small(max_frame: usize) -> FrameConfig {
    FrameConfig { max_frame }
}

/// Reader over a fixed byte string (EOF after it).
fn reader_over(bytes: Vec<u8>, cfg: FrameConfig) -> FrameReader<std::io::Cursor<Vec<u8>>> {
    FrameReader::new(std::io::Cursor::new(bytes), cfg)
}

fn encode(payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

#[tokio::test]
async fn header_announcing_4_gib_is_too_large_and_nothing_is_allocated_for_it() {
    let mut bytes = vec![0xFF, 0xFF, 0xFF, 0xFF];
    bytes.extend_from_slice(&(1u64 << 32).to_be_bytes());
    bytes.extend_from_slice(&[0xAB; 100]);
    let mut r = reader_over(bytes, FrameConfig::default());
    let cap_before = r.buffer_capacity();
    match r.read_frame().await {
        Err(FrameError::TooLarge { len, max }) => {
            assert_eq!(len, 1 << 32);
            assert_eq!(max, FrameConfig::default().max_frame);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(r.buffer_capacity() <= 64 * 1024, "{}", r.buffer_capacity());
    assert_eq!(r.buffer_capacity(), cap_before);
    // The stream is out of step: further reads keep failing, still without allocating.
    assert!(matches!(
        r.read_frame().await,
        Err(FrameError::TooLarge { .. })
    ));
    assert_eq!(r.buffer_capacity(), cap_before);
}

#[tokio::test]
async fn one_byte_over_the_maximum_is_refused_and_exactly_the_maximum_is_accepted() {
    let max = 1000;
    let mut r = reader_over(encode(&[7; 1000]), small(max));
    assert_eq!(r.read_frame().await.unwrap().unwrap().len(), 1000);
    let mut r = reader_over(encode(&[7; 1001]), small(max));
    assert!(matches!(
        r.read_frame().await,
        Err(FrameError::TooLarge {
            len: 1001,
            max: 1000
        })
    ));
}

#[tokio::test]
async fn stream_ending_mid_payload_is_truncated() {
    let mut bytes = encode(b"hello world");
    bytes.truncate(4 + 5);
    let mut r = reader_over(bytes, FrameConfig::default());
    assert!(matches!(
        r.read_frame().await,
        Err(FrameError::Truncated {
            expected: 15,
            received: 9
        })
    ));
}

#[tokio::test]
async fn stream_ending_mid_header_is_truncated() {
    let mut bytes = encode(b"ok");
    bytes.extend_from_slice(&[0, 0]);
    let mut r = reader_over(bytes, FrameConfig::default());
    assert_eq!(&r.read_frame().await.unwrap().unwrap()[..], b"ok");
    assert!(matches!(
        r.read_frame().await,
        Err(FrameError::Truncated {
            expected: 4,
            received: 2
        })
    ));
}

#[tokio::test]
async fn clean_eof_between_frames_is_none() {
    let mut r = reader_over(Vec::new(), FrameConfig::default());
    assert!(r.read_frame().await.unwrap().is_none());
    let mut bytes = encode(b"");
    bytes.extend(encode(b"x"));
    let mut r = reader_over(bytes, FrameConfig::default());
    assert_eq!(r.read_frame().await.unwrap().unwrap().len(), 0);
    assert_eq!(&r.read_frame().await.unwrap().unwrap()[..], b"x");
    assert!(r.read_frame().await.unwrap().is_none());
    assert!(r.read_frame().await.unwrap().is_none());
}

/// Counts `poll_read` calls that delivered bytes.
struct CountingReader<R> {
    inner: R,
    reads: usize,
}

impl<R: AsyncRead + Unpin> AsyncRead for CountingReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.reads += 1;
        }
        res
    }
}

#[tokio::test]
async fn many_small_frames_are_split_out_of_one_read() {
    let mut bytes = Vec::new();
    for i in 0..200u8 {
        bytes.extend(encode(&[i; 20]));
    }
    assert!(bytes.len() < 8 * 1024);
    let inner = CountingReader {
        inner: std::io::Cursor::new(bytes),
        reads: 0,
    };
    let mut r = FrameReader::new(inner, FrameConfig::default());
    for i in 0..200u8 {
        assert_eq!(&r.read_frame().await.unwrap().unwrap()[..], &[i; 20]);
    }
    assert_eq!(r.get_ref().reads, 1);
}

#[tokio::test]
async fn writer_refuses_an_oversized_frame_without_writing_anything() {
    let (a, b) = duplex(1 << 16);
    let mut w = FrameWriter::new(a, small(10));
    let big = [0u8; 6];
    assert!(matches!(
        w.write_frame(&[&big, &big]).await,
        Err(FrameError::TooLarge { len: 12, max: 10 })
    ));
    w.write_frame(&[&big[..4], &[], &big[..6]]).await.unwrap();
    w.shutdown().await.unwrap();
    let mut r = FrameReader::new(b, small(10));
    assert_eq!(r.read_frame().await.unwrap().unwrap().len(), 10);
    assert!(r.read_frame().await.unwrap().is_none());
}

#[tokio::test]
async fn close_with_frame_delivers_the_last_frame_then_eof() {
    let (a, b) = duplex(64);
    let mut w = FrameWriter::new(a, FrameConfig::default());
    let mut r = FrameReader::new(b, FrameConfig::default());
    let (sent, got) = tokio::join!(w.close_with_frame(&[b"bad frame: too large"]), async {
        let first = r.read_frame().await.unwrap();
        (first, r.read_frame().await.unwrap())
    });
    sent.unwrap();
    assert_eq!(got.0.as_deref(), Some(&b"bad frame: too large"[..]));
    assert!(got.1.is_none());
    // The shut-down writer refuses further frames instead of panicking.
    let mut a = w.into_inner();
    assert!(a.write_all(b"x").await.is_err());
}
