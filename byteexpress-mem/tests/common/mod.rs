//! Helpers shared by this crate's integration tests that run on the soft device.
// Each test binary uses its own subset.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use byteexpress_verbs::{Context, Cq, Wc};

/// The process's soft device, opened.
pub fn soft() -> Context {
    byteexpress_verbs::soft_device()
        .expect("soft device")
        .open()
        .expect("open soft device")
}

/// The device `BX_PROVIDER` names, opened: `soft` (default, on any host) or `ibverbs` (the
/// first hardware device: rxe0 inside the Soft-RoCE VM). An unavailable provider panics.
pub fn provider() -> Context {
    let kind = std::env::var("BX_PROVIDER").unwrap_or_else(|_| "soft".into());
    let hardware = match kind.as_str() {
        "soft" => false,
        "ibverbs" => true,
        other => panic!("BX_PROVIDER={other:?}: expected soft or ibverbs"),
    };
    byteexpress_verbs::devices()
        .into_iter()
        .find(|d| d.is_hardware() == hardware)
        .unwrap_or_else(|| panic!("no {kind} device"))
        .open()
        .expect("open the device")
}

/// The next completion of `cq`, polling for up to 5 s.
pub fn one_completion(cq: &Cq) -> Wc {
    completion_within(cq, Duration::from_secs(5))
}

/// The next completion of `cq`, polling for up to `limit`.
pub fn completion_within(cq: &Cq, limit: Duration) -> Wc {
    let deadline = Instant::now() + limit;
    let mut wc = [Wc::default(); 1];
    while Instant::now() < deadline {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion within {limit:?}");
}
