//! `Header::decode`: a header that decodes re-encodes to the bytes it came from (the reserved
//! byte 5 aside), 40 bytes or 48 with FLAG_LONG (whose extension holds a body length over
//! u32::MAX, never kept in the flags), and its lengths agree with the bytes that followed it
//! (with FLAG_RENDEZVOUS: exactly a 24-byte descriptor follows, on a kind with a body).
#![no_main]

use byteexpress_rpc::fuzzing::{FLAG_LONG, HEADER_LEN, Header, Kind, LONG_HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(head) = Header::decode_head(data) else {
        assert!(
            Header::decode(data).is_err(),
            "decode checks what decode_head checks"
        );
        return;
    };
    let hl = head.encoded_len();
    let long = data[4] & FLAG_LONG != 0;
    assert_eq!(hl, if long { LONG_HEADER_LEN } else { HEADER_LEN });
    assert_eq!(long, head.is_long(), "FLAG_LONG iff a body over u32::MAX");
    assert_eq!(head.flags & FLAG_LONG, 0, "FLAG_LONG is not kept in memory");
    if long {
        assert!(!matches!(
            head.kind,
            Kind::Continuation | Kind::CreditUpdate
        ));
    }
    let mut expect = data[..hl].to_vec();
    expect[5] = 0;
    assert_eq!(&head.encode()[..], &expect[..], "re-encodes to its bytes");
    let Ok(h) = Header::decode(data) else {
        return;
    };
    assert_eq!(head, h, "decode and decode_head agree on the header");
    let rest = (data.len() - hl) as u64;
    let announced = u64::from(h.meta_len).saturating_add(h.body_len);
    if h.flags & byteexpress_rpc::fuzzing::FLAG_RENDEZVOUS != 0 {
        // A rendezvous SEND: exactly its descriptor follows, whatever the lengths announce.
        assert_eq!(
            rest,
            byteexpress_rpc::fuzzing::DESCRIPTOR_LEN as u64
        );
        assert!(h.kind.has_body() && !h.more());
        return;
    }
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
