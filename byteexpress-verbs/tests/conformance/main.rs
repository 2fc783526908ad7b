//! The conformance suite: one set of behavioural tests of the verbs API, run against the
//! provider that `BX_PROVIDER` selects (`soft`, the default, on any host; `ibverbs` inside the
//! Soft-RoCE VM through `scripts/vm-tests.sh`). A selected provider that cannot open fails
//! every test; nothing skips.
//!
//! Every test builds its own pair of QPs on one device, connected to each other, so tests are
//! independent. Iteration counts stay small: under TCG emulation each operation costs ~50 µs.
//! Where rxe (kernel Soft-RoCE) and the soft provider may legitimately differ, the verbs man
//! pages decide and the test accepts only what they allow.

#[path = "../common/mod.rs"]
mod common;

mod cross_process;
mod data_path;
mod errors;
mod finish_qps;
mod lifecycle;
mod limits;
mod memory_windows;
mod srq;
mod states;
mod user_memory;

use std::time::Duration;

/// Upper bound for any one completion to arrive.
pub const T: Duration = Duration::from_secs(5);

#[test]
fn the_selected_provider_opens() {
    let ctx = common::provider();
    let kind = common::provider_kind();
    let dev = byteexpress_verbs::devices()
        .into_iter()
        .find(|d| d.name() == ctx.name())
        .expect("the device under test is listed");
    assert_eq!(
        dev.is_hardware(),
        kind == "ibverbs",
        "{kind}: {}",
        ctx.name()
    );
    let attr = ctx.query();
    assert!((256..=4096).contains(&attr.active_mtu), "{attr:?}");
    assert!(
        attr.max_qp_wr >= 16 && attr.max_sge >= 1 && attr.max_cqe >= 16,
        "{attr:?}"
    );
    assert_eq!(attr.remote_access_needs_shared, kind == "soft");
}
