//! `Header::decode`: a header that decodes re-encodes to the bytes it came from (the reserved
//! byte 5 aside), and its lengths agree with the bytes that followed it.
#![no_main]

use byteexpress_rpc::fuzzing::{HEADER_LEN, Header, Kind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let head = Header::decode_head(data);
    let Ok(h) = Header::decode(data) else {
        return;
    };
    assert_eq!(head, Ok(h), "decode and decode_head agree on the 40 bytes");
    let mut expect = [0u8; HEADER_LEN];
    expect.copy_from_slice(&data[..HEADER_LEN]);
    expect[5] = 0;
    assert_eq!(h.encode(), expect, "re-encodes to its bytes");
    let rest = (data.len() - HEADER_LEN) as u64;
    let announced = u64::from(h.meta_len) + u64::from(h.body_len);
    if h.first_of_many() {
        assert!(
            rest < announced,
            "a first chunk is shorter than its message"
        );
    } else {
        assert_eq!(rest, announced, "lengths match the bytes received");
    }
    if h.kind == Kind::Continuation {
        assert_eq!(h.meta_len, 0);
    }
    assert!(!(h.kind == Kind::CreditUpdate && h.more()));
});
