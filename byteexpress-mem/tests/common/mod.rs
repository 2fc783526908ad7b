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

/// The next completion of `cq`, polling for up to 5 s.
pub fn one_completion(cq: &Cq) -> Wc {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut wc = [Wc::default(); 1];
    while Instant::now() < deadline {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion within 5 s");
}
