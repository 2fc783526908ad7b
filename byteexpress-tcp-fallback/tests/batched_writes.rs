//! `FrameWriter::write_frames`: many frames go out in one vectored write when the stream takes
//! them, arrive whole and in order however few bytes the stream takes per write, and a frame
//! over the limit stops the batch after the frames before it.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use byteexpress_tcp_fallback::{FrameConfig, FrameError, FrameReader, FrameWriter};
use tokio::io::AsyncWrite;

/// A stream that records what is written and counts the write calls; it takes at most `cap`
/// bytes per call.
struct Recorder {
    bytes: Vec<u8>,
    calls: usize,
    cap: usize,
}

impl AsyncWrite for Recorder {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.calls += 1;
        let mut taken = 0;
        for b in bufs {
            let n = b.len().min(self.cap - taken);
            self.bytes.extend_from_slice(&b[..n]);
            taken += n;
            if taken == self.cap {
                break;
            }
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn frame(i: usize) -> (Vec<u8>, Vec<u8>) {
    let head = vec![i as u8; 40];
    let body = (0..i * 37).map(|j| (i + j) as u8).collect();
    (head, body)
}

/// The frames of `bytes`, read back with a `FrameReader`.
async fn read_back(bytes: Vec<u8>, cfg: FrameConfig) -> Vec<Vec<u8>> {
    let mut r = FrameReader::new(&bytes[..], cfg);
    let mut out = Vec::new();
    while let Some(f) = r.read_frame().await.expect("a well-formed stream") {
        out.push(f.to_vec());
    }
    out
}

#[tokio::test]
async fn sixty_four_small_frames_go_out_in_one_vectored_write_and_read_back_in_order() {
    let frames: Vec<_> = (0..64).map(frame).collect();
    let parts: Vec<[&[u8]; 2]> = frames.iter().map(|(h, b)| [&h[..], &b[..]]).collect();
    let refs: Vec<&[&[u8]]> = parts.iter().map(|p| &p[..]).collect();
    let mut w = FrameWriter::new(
        Recorder {
            bytes: Vec::new(),
            calls: 0,
            cap: usize::MAX,
        },
        FrameConfig::default(),
    );
    w.write_frames(&refs).await.expect("write");
    let rec = w.into_inner();
    assert_eq!(rec.calls, 1, "64 frames took {} writes", rec.calls);
    let back = read_back(rec.bytes, FrameConfig::default()).await;
    assert_eq!(back.len(), 64);
    for (i, (f, (h, b))) in back.iter().zip(&frames).enumerate() {
        assert_eq!(f, &[&h[..], &b[..]].concat(), "frame {i}");
    }
}

#[tokio::test]
async fn a_stream_taking_seven_bytes_a_write_still_gets_every_frame_whole() {
    let frames: Vec<_> = (0..20).map(frame).collect();
    let parts: Vec<[&[u8]; 2]> = frames.iter().map(|(h, b)| [&h[..], &b[..]]).collect();
    let refs: Vec<&[&[u8]]> = parts.iter().map(|p| &p[..]).collect();
    let mut w = FrameWriter::new(
        Recorder {
            bytes: Vec::new(),
            calls: 0,
            cap: 7,
        },
        FrameConfig::default(),
    );
    w.write_frames(&refs).await.expect("write");
    let back = read_back(w.into_inner().bytes, FrameConfig::default()).await;
    let want: Vec<Vec<u8>> = frames
        .iter()
        .map(|(h, b)| [&h[..], &b[..]].concat())
        .collect();
    assert_eq!(back, want);
}

#[tokio::test]
async fn a_frame_over_the_limit_stops_the_batch_after_the_frames_before_it() {
    let cfg = FrameConfig { max_frame: 1000 };
    let small = vec![1u8; 10];
    let big = vec![2u8; 1001];
    let (s, b) = ([&small[..]], [&big[..]]);
    let refs: Vec<&[&[u8]]> = vec![&s, &s, &b, &s];
    let mut w = FrameWriter::new(
        Recorder {
            bytes: Vec::new(),
            calls: 0,
            cap: usize::MAX,
        },
        cfg,
    );
    let err = w
        .write_frames(&refs)
        .await
        .expect_err("a frame over the limit");
    assert!(
        matches!(err, FrameError::TooLarge { len: 1001, .. }),
        "{err:?}"
    );
    let back = read_back(w.into_inner().bytes, cfg).await;
    assert_eq!(back, vec![small.clone(), small]);
}
