//! The soft provider's control messages (one seqpacket record from a peer process): what
//! decodes re-decodes from its encoding to the same message (a CONNECT_REPLY, whose reason a
//! sender cuts to 512 bytes at a character boundary: to the same bytes), re-encodes to its bytes except
//! where decoding normalises (PROBE_REPLY's `ok` byte, CONNECT_REPLY's lossy reason), and
//! never asks for more fds than a CONNECT carries.
#![no_main]

use byteexpress_verbs::fuzzing::SoftMsg;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(m) = SoftMsg::decode(data) else {
        return;
    };
    let bytes = m.encode();
    let again = SoftMsg::decode(&bytes).expect("its encoding decodes");
    if data[0] == 4 {
        // A sender cuts a CONNECT_REPLY's reason to 512 bytes: stable from then on.
        assert_eq!(
            again.encode(),
            bytes,
            "encode(decode(encode(x))) == encode(x)"
        );
    } else {
        assert_eq!(again, m, "decode(encode(x)) == x");
    }
    if data[0] != 2 && data[0] != 4 {
        assert_eq!(bytes, data, "re-encodes to its bytes");
    }
    assert!(m.fds() <= 5, "{m:?} asks for {} fds", m.fds());
});
