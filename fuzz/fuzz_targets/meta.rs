//! The metadata section: what decodes re-encodes to the same bytes, within the key and entry
//! limits, with valid keys.
#![no_main]

use byteexpress_rpc::fuzzing::{decode_meta, encode_meta};
use byteexpress_rpc::valid_key;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((head, md)) = decode_meta(&Bytes::copy_from_slice(data)) else {
        return;
    };
    assert!(md.len() <= 1024, "at most MAX_ENTRIES");
    for (k, v) in md.iter() {
        assert!(valid_key(k) && k.len() <= 256, "{k:?}");
        assert!(v.len() <= data.len());
    }
    assert_eq!(encode_meta(&head, &md), data, "re-encodes to its bytes");
});
