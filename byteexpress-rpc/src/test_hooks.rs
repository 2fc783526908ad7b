//! Test-only fault injection (cargo feature `test-hooks`; without it nothing here can be
//! switched on and the engine's checks compile to nothing).
//!
//! [`stall_reposts`] makes every RDMA link of this process stop re-posting receive buffers for
//! a while: received messages are still delivered, but the buffers they consumed are held, so
//! no credits flow back to the peers, which must wait (backpressure) instead of sending into a
//! receive queue with nothing posted (RNR). When the stall ends, each link re-posts everything
//! it held and returns the credits.

#[cfg(feature = "test-hooks")]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[cfg(feature = "test-hooks")]
static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
/// End of the stall in µs since [`EPOCH`]; 0 = none.
#[cfg(feature = "test-hooks")]
static STALL_UNTIL_US: AtomicU64 = AtomicU64::new(0);
#[cfg(feature = "test-hooks")]
static HELD: AtomicU64 = AtomicU64::new(0);

/// Stops re-posting receive buffers on every RDMA link of this process for `d` from now
/// (replacing any stall in progress).
#[cfg(feature = "test-hooks")]
pub fn stall_reposts(d: std::time::Duration) {
    let epoch = *EPOCH.get_or_init(Instant::now);
    let until = (Instant::now() + d).duration_since(epoch).as_micros() as u64;
    STALL_UNTIL_US.store(until.max(1), Ordering::SeqCst);
}

/// Receive buffers held back by stalls in this process so far (unit: buffers).
#[cfg(feature = "test-hooks")]
pub fn held_reposts() -> u64 {
    HELD.load(Ordering::SeqCst)
}

/// When the stall in progress ends, if one is.
#[inline]
pub(crate) fn reposts_stalled_until() -> Option<Instant> {
    #[cfg(feature = "test-hooks")]
    {
        let until = STALL_UNTIL_US.load(Ordering::Relaxed);
        if until == 0 {
            return None;
        }
        let t = *EPOCH.get()? + std::time::Duration::from_micros(until);
        (t > Instant::now()).then_some(t)
    }
    #[cfg(not(feature = "test-hooks"))]
    None
}

/// Counts one buffer held back by a stall.
#[inline]
pub(crate) fn count_held() {
    #[cfg(feature = "test-hooks")]
    HELD.fetch_add(1, Ordering::SeqCst);
}
