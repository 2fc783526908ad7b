//! A whole received message (a TCP frame or one-chunk SEND): REQUEST, RESPONSE and the
//! STREAM_* frames with their numbering in offset 24. What parses splits the input exactly
//! into header, metadata and body, is never a chunk, and its metadata section, when it
//! decodes, re-encodes to the same bytes.
#![no_main]

use byteexpress_rpc::fuzzing::{Kind, decode_meta, encode_meta, parse_message};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = parse_message(Bytes::copy_from_slice(data)) else {
        return;
    };
    let h = m.header;
    assert!(!h.more() && h.kind != Kind::Continuation, "never a chunk");
    assert_eq!(m.meta.len(), h.meta_len as usize);
    assert_eq!(m.body.len(), h.body_len as usize);
    let hl = h.encoded_len();
    assert_eq!(hl + m.meta.len() + m.body.len(), data.len());
    assert_eq!(&data[hl..hl + m.meta.len()], &m.meta[..]);
    assert_eq!(&data[hl + m.meta.len()..], &m.body[..]);
    if let Ok((head, md)) = decode_meta(&m.meta) {
        assert_eq!(encode_meta(&head, &md), &m.meta[..]);
    }
});
