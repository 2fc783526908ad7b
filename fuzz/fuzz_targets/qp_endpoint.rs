//! A QP's `Endpoint` and a device's `DeviceInfo` as a peer sends them in the handshake: what
//! parses re-serialises to exactly the input (no trailing bytes, no oversized address).
#![no_main]

use byteexpress_verbs::{DeviceInfo, Endpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ep) = Endpoint::from_bytes(data) {
        assert_eq!(ep.to_bytes(), data);
        assert_eq!(Endpoint::from_bytes(&ep.to_bytes()).ok(), Some(ep));
    }
    if let Ok(info) = DeviceInfo::from_bytes(data) {
        assert_eq!(info.to_bytes(), data);
        assert_eq!(DeviceInfo::from_bytes(&info.to_bytes()).ok(), Some(info));
    }
});
