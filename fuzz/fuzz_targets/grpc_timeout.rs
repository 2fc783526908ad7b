//! `grpc-timeout` values: what parses is 1–8 digits and a unit, and formatting the parsed
//! duration gives a value that parses back to no less (a deadline is never shortened);
//! formatting any duration gives a value that parses.
#![no_main]

use std::time::Duration;

use byteexpress::fuzzing::{format_grpc_timeout, parse_grpc_timeout};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(d) = parse_grpc_timeout(data) {
        assert!((2..=9).contains(&data.len()), "1-8 digits and a unit");
        let back = parse_grpc_timeout(format_grpc_timeout(d).as_bytes()).expect("own format");
        assert!(back >= d, "{d:?} -> {back:?}");
    }
    if data.len() >= 12 {
        let secs = u64::from_le_bytes(data[..8].try_into().unwrap());
        let nanos = u32::from_le_bytes(data[8..12].try_into().unwrap()) % 1_000_000_000;
        let d = Duration::new(secs, nanos);
        let s = format_grpc_timeout(d);
        let back = parse_grpc_timeout(s.as_bytes()).expect("own format parses");
        let cap = Duration::from_secs(99_999_999 * 3600);
        assert!(back >= d.min(cap), "{d:?} -> {s} -> {back:?}");
    }
});
