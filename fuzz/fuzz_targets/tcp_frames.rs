//! The TCP frame reader (stateful) fed a byte stream in arbitrary splits, with and without an
//! admission check: it returns exactly the frames a model parser finds, refuses a length over
//! its maximum, reports a stream ending mid-frame as truncated and a clean end as the end, asks
//! admission once per frame with its length, and never buffers more than a frame and a read.
//! Lengths follow the escape (`0xFFFF_FFFF`, then a u64): one below `0xFFFF_FFFF` is garbled.
#![no_main]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use byteexpress_fuzz::Input;
use byteexpress_tcp_fallback::{Frame, FrameConfig, FrameError, FrameReader};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, ReadBuf};

/// Hands out `data` in reads of the sizes in `splits` (cycled), then end of stream.
struct Splits<'a> {
    data: &'a [u8],
    splits: Vec<usize>,
    k: usize,
}

impl AsyncRead for Splits<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let size = self.splits[self.k % self.splits.len()];
        self.k += 1;
        let n = size.min(self.data.len()).min(buf.remaining());
        let (head, rest) = self.data.split_at(n);
        buf.put_slice(head);
        self.data = rest;
        Poll::Ready(Ok(()))
    }
}

/// Polls a future that never waits (the reader above is always ready) to its end.
fn ready<T>(f: impl Future<Output = T>) -> T {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the frame reader waited on a reader that is always ready"),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut i = Input::new(data);
    let max_frame = usize::from(i.u16());
    let admit_mode = i.u8() & 1 == 1;
    let admit_max = usize::from(i.u16());
    let head_len = usize::from(i.u8());
    let n_splits = usize::from(i.u8() % 16) + 1;
    let splits: Vec<usize> = i
        .bytes(n_splits)
        .iter()
        .map(|&b| usize::from(b) + 1)
        .collect();
    let splits = if splits.is_empty() { vec![1] } else { splits };
    let stream = i.bytes(i.len());
    let mut reader = FrameReader::new(
        Splits {
            data: stream,
            splits,
            k: 0,
        },
        FrameConfig { max_frame },
    );
    let mut pos = 0usize; // model: start of the next frame in `stream`
    loop {
        let left = &stream[pos..];
        // the model's header: (prefix length, payload length), or None while incomplete
        let expect = match left.get(..4) {
            Some(&[0xFF, 0xFF, 0xFF, 0xFF]) => left
                .get(4..12)
                .map(|l| (12usize, u64::from_be_bytes(l.try_into().unwrap()))),
            Some(n) => Some((4, u64::from(u32::from_be_bytes(n.try_into().unwrap())))),
            None => None,
        };
        let mut asked = Vec::new();
        let got = if admit_mode {
            ready(reader.read_frame_admit(head_len, |len| {
                asked.push(len);
                len <= admit_max
            }))
        } else {
            ready(reader.read_frame()).map(|f| f.map(Frame::Whole))
        };
        assert!(
            reader.buffered() <= 12 + max_frame + 256,
            "{} bytes buffered",
            reader.buffered()
        );
        match expect {
            None if left.is_empty() => {
                assert!(matches!(got, Ok(None)), "clean end: {got:?}");
                return;
            }
            None => {
                assert!(matches!(got, Err(FrameError::Truncated { .. })), "{got:?}");
                return;
            }
            Some((12, len)) if len < 0xFFFF_FFFF => {
                assert!(
                    matches!(got, Err(FrameError::BadEscape { len: l }) if l == len),
                    "{got:?}"
                );
                assert!(asked.is_empty(), "admission asked about a garbled length");
                return;
            }
            Some((_, len)) if len > max_frame as u64 => {
                assert!(
                    matches!(got, Err(FrameError::TooLarge { len: l, .. }) if l == len),
                    "{got:?}"
                );
                assert!(
                    asked.is_empty(),
                    "admission asked about a frame over the maximum"
                );
                return;
            }
            Some((prefix, len)) => {
                let len = len as usize;
                let refused = admit_mode && len > admit_max;
                if admit_mode {
                    assert_eq!(asked, [len], "admission asked once, with the length");
                }
                let whole = left.len() >= prefix + len;
                if refused {
                    let head = head_len.min(len);
                    if left.len() < prefix + head {
                        assert!(matches!(got, Err(FrameError::Truncated { .. })), "{got:?}");
                        return;
                    }
                    match got {
                        Ok(Some(Frame::Refused { head: h, len: l })) => {
                            assert_eq!((&h[..], l), (&left[prefix..prefix + head], len));
                        }
                        other => panic!("expected a refused frame of {len}: {other:?}"),
                    }
                    if !whole {
                        let next = ready(reader.read_frame_admit(head_len, |_| {
                            panic!("admission asked inside a refused frame")
                        }));
                        assert!(
                            matches!(next, Err(FrameError::Truncated { .. })),
                            "{next:?}"
                        );
                        return;
                    }
                } else if !whole {
                    assert!(matches!(got, Err(FrameError::Truncated { .. })), "{got:?}");
                    return;
                } else {
                    match got {
                        Ok(Some(Frame::Whole(b))) => {
                            assert_eq!(&b[..], &left[prefix..prefix + len])
                        }
                        other => panic!("expected a frame of {len}: {other:?}"),
                    }
                }
                pos += prefix + len;
            }
        }
    }
});
