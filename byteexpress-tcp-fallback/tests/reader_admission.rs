//! `FrameReader::read_frame_admit`: a refused frame yields its head, is dropped without being
//! buffered whole, and the frames after it read normally.

use byteexpress_tcp_fallback::{Frame, FrameConfig, FrameReader};

fn encode(payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

#[tokio::test]
async fn a_refused_frame_gives_its_head_is_skipped_unbuffered_and_the_next_frame_follows() {
    let big: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
    let mut bytes = encode(b"small");
    bytes.extend(encode(&big));
    bytes.extend(encode(b"after"));
    // a reader that hands out at most 1000 bytes per read, so the skip spans many reads
    let (mut w, r) = tokio::io::duplex(1000);
    let writer = tokio::spawn(async move {
        tokio::io::AsyncWriteExt::write_all(&mut w, &bytes)
            .await
            .unwrap();
    });
    let mut r = FrameReader::new(r, FrameConfig::default());
    let mut asked = Vec::new();
    let mut admit = |len: usize| {
        asked.push(len);
        len < 1000
    };
    assert_eq!(
        r.read_frame_admit(40, &mut admit).await.unwrap(),
        Some(Frame::Whole(bytes::Bytes::from_static(b"small")))
    );
    match r.read_frame_admit(40, &mut admit).await.unwrap() {
        Some(Frame::Refused { head, len }) => {
            assert_eq!(len, big.len());
            assert_eq!(&head[..], &big[..40]);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        r.buffer_capacity() < 100_000,
        "the refused frame was not buffered: capacity {}",
        r.buffer_capacity()
    );
    assert_eq!(
        r.read_frame_admit(40, &mut admit).await.unwrap(),
        Some(Frame::Whole(bytes::Bytes::from_static(b"after")))
    );
    assert_eq!(r.read_frame_admit(40, &mut admit).await.unwrap(), None);
    assert_eq!(asked, vec![5, big.len(), 5], "asked once per frame");
    writer.await.unwrap();
}
