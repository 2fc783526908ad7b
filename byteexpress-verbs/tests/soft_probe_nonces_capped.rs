//! The soft device keeps at most `MAX_PROBE_NONCES` (4096) armed probe nonces: a process
//! that arms more (e.g. a client asking a server for nonce after nonce) cannot grow the
//! device's table without bound; the oldest nonce is dropped first (review of issue 22).
//! Its own binary: arming that many nonces drops the nonces other tests armed.

mod common;

use common::soft;

/// `soft/probes.rs` `MAX_PROBE_NONCES`.
const MAX_PROBE_NONCES: u64 = 4096;

#[test]
fn arming_more_probe_nonces_than_the_cap_drops_the_oldest_only() {
    let ctx = soft();
    let me = ctx.device_info();
    let base = 0xC0FF_EE00_0000_u64;
    for i in 0..=MAX_PROBE_NONCES {
        ctx.expect_probe(base + i);
    }
    assert!(
        !ctx.probe(&me, base).unwrap(),
        "the oldest nonce was dropped when the cap was reached"
    );
    assert!(ctx.probe(&me, base + 1).unwrap(), "the next one is kept");
    assert!(
        ctx.probe(&me, base + MAX_PROBE_NONCES).unwrap(),
        "the newest one is kept"
    );
}
