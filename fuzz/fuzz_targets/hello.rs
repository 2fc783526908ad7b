//! HELLO and the other set-up (QP handshake) messages: what decodes re-encodes to its bytes
//! (a REFUSE's reason is decoded lossily, so it only round-trips as a value), and the device
//! and endpoint blobs inside, when they parse, re-serialise to the same bytes.
#![no_main]

use byteexpress_rpc::fuzzing::Hello;
use byteexpress_verbs::{DeviceInfo, Endpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Hello::decode(data) else {
        return;
    };
    let bytes = m.encode();
    assert_eq!(
        Hello::decode(&bytes),
        Ok(m.clone()),
        "decode(encode(x)) == x"
    );
    match &m {
        Hello::Refuse { .. } => {}
        _ => assert_eq!(bytes, data, "re-encodes to its bytes"),
    }
    match &m {
        Hello::Hello { devices, .. } | Hello::HelloAck { devices, .. } => {
            assert!(devices.len() <= 16);
            for d in devices {
                if let Ok(info) = DeviceInfo::from_bytes(d) {
                    assert_eq!(&info.to_bytes(), d);
                }
            }
        }
        Hello::SelectRdma { endpoint, .. } | Hello::RdmaAccept { endpoint, .. } => {
            if let Ok(ep) = Endpoint::from_bytes(endpoint) {
                assert_eq!(&ep.to_bytes(), endpoint);
            }
        }
        Hello::SelectTcp | Hello::Refuse { .. } => {}
    }
});
