//! The soft provider's control messages (one seqpacket record from a peer process): what
//! decodes re-decodes from its encoding to the same message, re-encodes to its bytes except
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
    assert_eq!(
        SoftMsg::decode(&bytes),
        Some(m.clone()),
        "decode(encode(x)) == x"
    );
    if data[0] != 2 && data[0] != 4 {
        assert_eq!(bytes, data, "re-encodes to its bytes");
    }
    assert!(m.fds() <= 5, "{m:?} asks for {} fds", m.fds());
});
