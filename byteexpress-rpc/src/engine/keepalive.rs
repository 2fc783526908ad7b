//! Keepalive pings and the idle timeout of a link, as gRPC's keepalive (`doc/keepalive.md`):
//! when nothing has been heard from the peer for [`Config::keepalive_interval`], a PING goes
//! out; if nothing (its PONG or any other message) comes back within
//! [`Config::keepalive_timeout`], the peer is taken for dead and the link closed. A link with no
//! call in flight on which nothing at all has arrived for [`Config::idle_timeout`] is closed
//! too. Both watch what arrives on the link as a whole: the messages and chunks on an RDMA
//! link's QP count, so the silent TCP control connection of a live RDMA link is never closed
//! for being idle; on a TCP link so do the bytes of a frame still arriving (`engine/tcp.rs`).
//! A PING queued behind a frame we are still writing waits for it: while the socket keeps
//! taking bytes of that write, the PING's timeout counts from the last bytes it took. So a peer
//! busy with one huge frame either way is not taken for dead, and one that reads our PINGs and
//! answers nothing still is.
//!
//! PING and PONG travel only over TCP: as messages on a TCP link, as frames on the control
//! connection of an RDMA link (the wire header's kinds 7 and 8).

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

use super::{Dispatch, LinkTx};
use crate::Config;
use crate::error::EngineError;

/// The instant link times are counted from.
pub(crate) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// µs since [`epoch`].
pub(crate) fn now_us() -> u64 {
    epoch().elapsed().as_micros() as u64
}

/// The keepalive and idle settings of a link (`Duration::ZERO` = off).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Liveness {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) idle: Duration,
}

impl Liveness {
    pub(crate) fn from_config(cfg: &Config) -> Self {
        Liveness {
            interval: cfg.keepalive_interval,
            timeout: cfg.keepalive_timeout,
            idle: cfg.idle_timeout,
        }
    }

    fn off(&self) -> bool {
        self.interval.is_zero() && self.idle.is_zero()
    }
}

/// Watches `link` until it must be closed, and returns why: the peer did not answer a PING
/// within the timeout, or the link was idle too long. `ping(n)` sends PING number `n`. Never
/// returns when both keepalive and the idle timeout are off.
pub(crate) async fn watch(
    link: &LinkTx,
    live: Liveness,
    dispatch: &dyn Dispatch,
    mut ping: impl FnMut(u64),
) -> EngineError {
    if live.off() {
        return std::future::pending().await;
    }
    let mut next_ping = 1u64;
    // (number, when sent in µs) of the PING awaiting an answer
    let mut outstanding: Option<u64> = None;
    let floor = Duration::from_millis(10);
    loop {
        let now = now_us();
        let heard = link.last_rx_us();
        let quiet = Duration::from_micros(now.saturating_sub(heard));
        let mut wait = Duration::from_secs(3600);
        if let Some(sent) = outstanding {
            // The wait counts from when the PING went out. One still queued behind our own
            // write under way cannot have been answered: while the socket keeps taking bytes
            // of that write, its wait counts from the last bytes taken (a peer that stops
            // reading stops that progress too).
            let out = link.ping_out_us();
            let from = if out >= sent {
                out
            } else {
                link.write_progress_us().map_or(sent, |p| p.max(sent))
            };
            if heard >= sent {
                outstanding = None;
            } else {
                let waited = Duration::from_micros(now.saturating_sub(from));
                if waited >= live.timeout {
                    return EngineError::KeepaliveTimeout(live.timeout);
                }
                // re-checked at least once an interval, so the answer is seen in time to
                // keep the pings at their pace
                wait = wait.min(live.timeout - waited).min(live.interval);
            }
        }
        if !live.idle.is_zero() {
            if quiet >= live.idle && dispatch.calls_in_flight() == 0 {
                return EngineError::Idle(live.idle);
            }
            wait = wait.min(live.idle.saturating_sub(quiet).max(floor));
        }
        if !live.interval.is_zero() && outstanding.is_none() {
            if quiet >= live.interval {
                ping(next_ping);
                next_ping += 1;
                outstanding = Some(now);
                wait = wait.min(live.timeout).min(live.interval);
            } else {
                wait = wait.min(live.interval - quiet);
            }
        }
        tokio::time::sleep(wait.max(floor)).await;
    }
}
