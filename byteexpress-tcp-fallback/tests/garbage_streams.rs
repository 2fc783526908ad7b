//! Arbitrary byte streams never panic the reader, and valid streams decode exactly, whatever
//! the chunking of the underlying reads.

use byteexpress_tcp_fallback::{FrameConfig, FrameError, FrameReader, FrameWriter};
use proptest::prelude::*;
use tokio::io::{AsyncWriteExt, duplex};

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Writes `bytes` in chunks of `chunk` through a small duplex pipe and reads frames until end
/// or error.
async fn read_all(
    bytes: Vec<u8>,
    chunk: usize,
    cfg: FrameConfig,
) -> (Vec<bytes::Bytes>, Result<(), FrameError>) {
    let (mut a, b) = duplex(97);
    let writer = async move {
        for c in bytes.chunks(chunk) {
            if a.write_all(c).await.is_err() {
                return;
            }
        }
        let _ = a.shutdown().await;
    };
    let reader = async move {
        let mut r = FrameReader::new(b, cfg);
        let mut frames = Vec::new();
        loop {
            match r.read_frame().await {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => return (frames, Ok(())),
                Err(e) => return (frames, Err(e)),
            }
        }
    };
    tokio::join!(writer, reader).1
}

proptest! {
    #[test]
    fn garbage_never_panics_and_frames_respect_the_maximum(
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
        chunk in 1usize..64,
        max in 0usize..300,
    ) {
        let input_len = bytes.len();
        let (frames, end) = block_on(read_all(bytes, chunk, FrameConfig { max_frame: max }));
        let mut consumed = 0;
        for f in &frames {
            prop_assert!(f.len() <= max);
            consumed += 4 + f.len();
        }
        prop_assert!(consumed <= input_len);
        match end {
            Ok(()) => prop_assert_eq!(consumed, input_len),
            Err(FrameError::TooLarge { max: m, .. }) => prop_assert_eq!(m, max),
            Err(FrameError::Truncated { received, .. }) => {
                prop_assert_eq!(consumed + received, input_len)
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn valid_streams_decode_to_the_frames_written(
        payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..20),
        chunk in 1usize..512,
    ) {
        let mut encoded = Vec::new();
        block_on(async {
            let mut w = FrameWriter::new(&mut encoded, FrameConfig::default());
            for p in &payloads {
                w.write_frame(&[p]).await.unwrap();
            }
        });
        let (frames, end) = block_on(read_all(encoded, chunk, FrameConfig::default()));
        prop_assert!(end.is_ok(), "{end:?}");
        prop_assert_eq!(frames.len(), payloads.len());
        for (f, p) in frames.iter().zip(&payloads) {
            prop_assert_eq!(&f[..], &p[..]);
        }
    }
}
