//! Retries and hedging with gRPC's semantics (gRPC proposal A6, "client retries"), driven by
//! a [`ServiceConfig`] attached to a [`Client`](crate::Client)
//! ([`Client::with_service_config`](crate::Client::with_service_config)) or a
//! [`ReplicaSet`](crate::ReplicaSet)
//! ([`ReplicaSet::with_service_config`](crate::ReplicaSet::with_service_config)).
//!
//! # The rule: a call runs twice only when allowed
//! Every attempt ends in one of three ways, and only these lead to another attempt:
//! 1. **Never left the client** (the link closed between picking it and sending, or the send
//!    failed): retried transparently, without limit, within the call's deadline, with or
//!    without a policy.
//! 2. **Reached the server but no handler**: the server answered with a RESPONSE carrying
//!    `FLAG_REFUSED` (wire header bit 5, "refused before dispatch"; it sets it only when no
//!    handler ran: the server is draining, the link's `max_concurrent_calls` is full, or the
//!    request was refused unread for want of memory budget). Retried transparently **once**
//!    (on another endpoint when one is ready); a second refusal is treated as case 3.
//! 3. **Anything else** (the handler ran or may have run: a status from it, a deadline, a link
//!    lost after sending): retried only as the method's policy allows:
//!    - `retryPolicy`: when the code is in `retryableStatusCodes`, fewer than `maxAttempts`
//!      (capped at 5) attempts ran, the throttle allows and the deadline has not passed; after
//!      a backoff of random(0, min(initialBackoff · backoffMultiplier^(n−1), maxBackoff)) before
//!      retry n, or exactly the server's `grpc-retry-pushback-ms` when the failure carried one
//!      (a negative or malformed value: no retry). A retry goes to an endpoint not tried yet
//!      when one is ready.
//!    - `hedgingPolicy`: the first attempt at once, the next ones `hedgingDelay` apart (or at
//!      once after a failure with a `nonFatalStatusCodes` code; after pushback's delay when
//!      the failure carried one; none after a malformed one), each to an endpoint not tried
//!      yet when one is ready, up to `maxAttempts` in flight. The first OK, or the first
//!      failure with a fatal code, ends the call; the other attempts are cancelled (CANCEL on
//!      the wire; the server drops their handlers and answers nothing for them).
//!    - no policy: never.
//!
//! The call's deadline (its own timeout, or the method config's `timeout` when shorter)
//! covers every attempt and backoff. Each attempt that reaches a server carries
//! `grpc-previous-rpc-attempts` (the attempts before it). Throttling (`retryThrottling`): a
//! token count per channel starts at `maxTokens`; a failed attempt of a method with a policy
//! whose code the policy would retry (or hedge past) takes one, a successful call of such a
//! method gives `tokenRatio`; retries and hedges start only while the count is above
//! `maxTokens / 2`.
//!
//! # Streams
//! A stream (client, server or bidirectional streaming) is retried or hedged as a call until
//! it **commits**: when the server's headers or first message (or its end) arrive on an
//! attempt, or when the request messages buffered for replay exceed [`PER_RPC_BUFFER_LIMIT`]
//! (A6's per-RPC buffer limit; the stream then commits to an attempt that has sent them all).
//! Before commit, request messages are kept: a retry sends them again from the first; under
//! a `hedgingPolicy` every attempt in flight is sent each of them, and the first attempt to
//! reach its commit point with headers, a message, OK or a fatal status wins while the
//! others are cancelled (CANCEL on the wire; the server drops their handlers). After the
//! commit, whatever happens is the caller's.
//!
//! Counted in [`RetryStats`] and under the metric names of [`crate::metrics`]
//! (`bx_client_retries_total`, ...); logged at debug (target `byteexpress_rpc::retry`).

pub mod service_config;
mod throttle;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;

pub use service_config::{
    AttemptPolicy, HedgingPolicy, MethodConfig, MethodName, RetryPolicy, RetryThrottling,
    ServiceConfig, ServiceConfigError,
};

use crate::{Code, Status};
use throttle::Throttle;

/// A6's per-RPC buffer limit for request messages kept for replay before a stream commits:
/// 256 KiB (gRPC's default is 256 KiB per call too). Past it, the stream commits.
pub const PER_RPC_BUFFER_LIMIT: usize = 256 << 10;

/// The metadata key of the attempts before this one (A6).
pub const PREVIOUS_ATTEMPTS: &str = "grpc-previous-rpc-attempts";
/// The trailer key of a server's retry pushback in ms (A6).
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// Counters of the retries and hedges of a [`Client`](crate::Client) or
/// [`ReplicaSet`](crate::ReplicaSet) (every call through it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryStats {
    /// Attempts started (first attempts, retries, hedges and transparent retries).
    pub attempts: u64,
    /// Retries a `retryPolicy` made.
    pub retries: u64,
    /// Hedged attempts after the first that a `hedgingPolicy` started.
    pub hedges: u64,
    /// Retries or hedges not started because the throttle had too few tokens.
    pub throttled: u64,
    /// Transparent retries (an attempt that never left the client, or that the server
    /// refused before dispatch).
    pub transparent_retries: u64,
    /// Calls of a method with a policy that committed to an attempt (its answer, headers or
    /// first message arrived).
    pub commits: u64,
    /// Streams that committed because their replay buffer passed [`PER_RPC_BUFFER_LIMIT`].
    pub buffer_commits: u64,
}

#[derive(Debug, Default)]
struct Counters {
    attempts: AtomicU64,
    retries: AtomicU64,
    hedges: AtomicU64,
    throttled: AtomicU64,
    transparent: AtomicU64,
    commits: AtomicU64,
    buffer_commits: AtomicU64,
}

/// A service config in use: the config, its throttle, the counters.
#[derive(Debug, Default)]
pub(crate) struct Retrier {
    cfg: ServiceConfig,
    throttle: Option<Throttle>,
    n: Counters,
}

/// How far a failed attempt got (module docs, "The rule").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Never left the client.
    Local,
    /// The server refused it before any handler (`FLAG_REFUSED`).
    Refused,
    /// Anything else.
    Other,
}

/// A failed attempt.
#[derive(Debug, Clone)]
pub(crate) struct AttemptError {
    pub(crate) status: Status,
    pub(crate) stage: Stage,
}

impl AttemptError {
    pub(crate) fn other(status: Status) -> Self {
        AttemptError {
            status,
            stage: Stage::Other,
        }
    }
    pub(crate) fn local(status: Status) -> Self {
        AttemptError {
            status,
            stage: Stage::Local,
        }
    }
}

/// What the driver tells an attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttemptInfo {
    /// Attempts before this one that reached a server (`grpc-previous-rpc-attempts`).
    pub(crate) previous: u32,
    /// The call's deadline.
    pub(crate) deadline: Option<Instant>,
    /// Whether to send `grpc-previous-rpc-attempts`: on every attempt of a method with a
    /// policy (0 on the first), on transparent retries of others.
    pub(crate) send_previous: bool,
}

impl AttemptInfo {
    /// `md` with `grpc-previous-rpc-attempts` when this attempt carries it.
    pub(crate) fn metadata(&self, md: &crate::Metadata) -> crate::Metadata {
        if self.send_previous {
            with_previous(md, self.previous)
        } else {
            md.clone()
        }
    }
}

/// A call's settings from the config: its deadline and wait-for-ready.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallPlan {
    pub(crate) deadline: Option<Instant>,
    pub(crate) wait_for_ready: bool,
}

impl Retrier {
    /// A retrier of `cfg` (validated).
    pub(crate) fn new(cfg: ServiceConfig) -> Result<Retrier, ServiceConfigError> {
        cfg.validate()?;
        Ok(Retrier {
            throttle: cfg.retry_throttling.as_ref().map(Throttle::new),
            cfg,
            n: Counters::default(),
        })
    }

    pub(crate) fn stats(&self) -> RetryStats {
        let l = |a: &AtomicU64| a.load(Ordering::SeqCst);
        RetryStats {
            attempts: l(&self.n.attempts),
            retries: l(&self.n.retries),
            hedges: l(&self.n.hedges),
            throttled: l(&self.n.throttled),
            transparent_retries: l(&self.n.transparent),
            commits: l(&self.n.commits),
            buffer_commits: l(&self.n.buffer_commits),
        }
    }

    /// The deadline (the caller's timeout or the method config's, whichever is shorter, from
    /// now) and wait-for-ready: the caller's when it set one (either way: a call's own
    /// setting wins), else the method config's `waitForReady`, else off.
    pub(crate) fn plan(
        &self,
        method: &str,
        timeout: Option<Duration>,
        wfr: Option<bool>,
    ) -> CallPlan {
        let mc = self.cfg.method(method);
        let t = match (timeout, mc.and_then(|m| m.timeout)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        CallPlan {
            // a timeout past what an Instant can hold is no deadline (never a panic)
            deadline: t.and_then(|t| Instant::now().checked_add(t)),
            wait_for_ready: wfr.or(mc.and_then(|m| m.wait_for_ready)).unwrap_or(false),
        }
    }

    /// The policy of `method`, if any.
    pub(crate) fn policy(&self, method: &str) -> Option<AttemptPolicy> {
        self.cfg.method(method).and_then(|m| m.policy.clone())
    }

    /// Counts a stream committed for its replay buffer.
    pub(crate) fn buffer_commit(&self, method: &str) {
        self.n.buffer_commits.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(crate::metrics::RETRY_COMMITS, "method" => method.to_string(), "reason" => "buffer_limit")
            .increment(1);
        tracing::debug!(target: "byteexpress_rpc::retry", method, "stream committed: replay buffer full");
    }

    /// Runs a call: `attempt` as often as the rule (module docs) allows. `attempt` is given
    /// the attempt's number of earlier server-reaching attempts and the deadline; its future
    /// is dropped to cancel it (hedging's losers).
    pub(crate) async fn run<T, F, Fut>(
        &self,
        method: &str,
        deadline: Option<Instant>,
        attempt: F,
    ) -> Result<T, Status>
    where
        F: FnMut(AttemptInfo) -> Fut,
        Fut: Future<Output = Result<T, AttemptError>>,
    {
        self.run_committable(method, deadline, || false, attempt)
            .await
    }

    /// [`Retrier::run`] for a call that may commit before it has an answer (a replayed
    /// stream past [`PER_RPC_BUFFER_LIMIT`]): once `buffer_committed()` is true no attempt
    /// is started (a failure then ends the call; A6's commit) and the attempt that completes
    /// gives no throttle token back (it has no answer yet: not a success).
    pub(crate) async fn run_committable<T, F, Fut>(
        &self,
        method: &str,
        deadline: Option<Instant>,
        buffer_committed: impl Fn() -> bool,
        mut attempt: F,
    ) -> Result<T, Status>
    where
        F: FnMut(AttemptInfo) -> Fut,
        Fut: Future<Output = Result<T, AttemptError>>,
    {
        let policy = self.cfg.method(method).and_then(|m| m.policy.clone());
        let has_policy = policy.is_some();
        let info = move |previous: u32| AttemptInfo {
            previous,
            deadline,
            send_previous: has_policy || previous > 0,
        };
        match policy {
            Some(AttemptPolicy::Hedging(h)) => {
                self.hedge(method, deadline, &h, &buffer_committed, |n| {
                    attempt(info(n))
                })
                .await
            }
            retry => {
                let retry = match retry {
                    Some(AttemptPolicy::Retry(r)) => Some(r),
                    _ => None,
                };
                let mut previous = 0u32;
                let mut counted = 1u32;
                let mut refused_once = false;
                let mut backoff_n = 0u32;
                loop {
                    self.n.attempts.fetch_add(1, Ordering::SeqCst);
                    let err = match attempt(info(previous)).await {
                        Ok(v) => {
                            if retry.is_some() && !buffer_committed() {
                                self.committed(method);
                            }
                            return Ok(v);
                        }
                        Err(e) => e,
                    };
                    if buffer_committed() {
                        // committed on the buffer limit: this was the last attempt
                        return Err(err.status);
                    }
                    let late = deadline.is_some_and(|d| Instant::now() >= d);
                    match err.stage {
                        // never left the client, and its time is up (A6: transparent
                        // retries only within the deadline)
                        Stage::Local if late => return Err(local_past_deadline(&err.status)),
                        Stage::Local => {
                            self.transparent(method, &err.status);
                            tokio::task::yield_now().await;
                            continue;
                        }
                        Stage::Refused if !refused_once && !late => {
                            refused_once = true;
                            previous += 1;
                            self.transparent(method, &err.status);
                            continue;
                        }
                        _ => {}
                    }
                    if err.stage != Stage::Local {
                        previous += 1;
                    }
                    let Some(p) = &retry else {
                        return Err(err.status);
                    };
                    if !p.retryable_status_codes.contains(&err.status.code) {
                        return Err(err.status);
                    }
                    let allowed = self.throttle.as_ref().is_none_or(|t| t.failure());
                    if counted >= p.max_attempts.min(service_config::MAX_ATTEMPTS_CAP) || late {
                        return Err(err.status);
                    }
                    let wait = match pushback(&err.status) {
                        Pushback::None => {
                            backoff_n += 1;
                            throttle::backoff(p, backoff_n, rand::random::<f64>())
                        }
                        Pushback::After(d) => {
                            backoff_n = 0;
                            d
                        }
                        Pushback::Stop => {
                            tracing::debug!(target: "byteexpress_rpc::retry", method, "server pushback says no retry");
                            return Err(err.status);
                        }
                    };
                    if !allowed {
                        self.n.throttled.fetch_add(1, Ordering::SeqCst);
                        metrics::counter!(crate::metrics::RETRIES_THROTTLED, "method" => method.to_string()).increment(1);
                        tracing::debug!(target: "byteexpress_rpc::retry", method, "retry throttled");
                        return Err(err.status);
                    }
                    let at = later(wait);
                    if deadline.is_some_and(|d| at >= d) {
                        if let Some(d) = deadline {
                            tokio::time::sleep_until(d).await;
                        }
                        return Err(Status::new(
                            Code::DeadlineExceeded,
                            format!("deadline exceeded in retry backoff after: {}", err.status),
                        ));
                    }
                    tokio::time::sleep_until(at).await;
                    counted += 1;
                    self.n.retries.fetch_add(1, Ordering::SeqCst);
                    metrics::counter!(crate::metrics::RETRIES, "method" => method.to_string())
                        .increment(1);
                    tracing::debug!(target: "byteexpress_rpc::retry", method, attempt = counted, ?wait, error = %err.status, "retrying");
                }
            }
        }
    }

    async fn hedge<T, F, Fut>(
        &self,
        method: &str,
        deadline: Option<Instant>,
        p: &HedgingPolicy,
        buffer_committed: &impl Fn() -> bool,
        mut attempt: F,
    ) -> Result<T, Status>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, AttemptError>>,
    {
        let max = p.max_attempts.min(service_config::MAX_ATTEMPTS_CAP);
        let mut inflight = FuturesUnordered::new();
        let mut started = 0u32; // policy attempts started
        let mut previous = 0u32;
        let mut refused_once = false;
        let mut stop = false;
        let mut last: Option<Status> = None;
        self.n.attempts.fetch_add(1, Ordering::SeqCst);
        inflight.push(attempt(previous));
        started += 1;
        previous += 1;
        let mut next_at = later(p.hedging_delay);
        loop {
            let can_start = !stop && started < max;
            if inflight.is_empty() && !can_start {
                return Err(last.unwrap_or_else(|| {
                    Status::new(Code::Unavailable, "every hedged attempt failed")
                }));
            }
            let timer = async {
                if can_start {
                    tokio::time::sleep_until(next_at).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                Some(res) = inflight.next(), if !inflight.is_empty() => {
                    let err = match res {
                        Ok(v) => {
                            if !buffer_committed() {
                                self.committed(method);
                            }
                            return Ok(v); // dropping `inflight` cancels the others
                        }
                        Err(e) => e,
                    };
                    if buffer_committed() {
                        // committed on the buffer limit: no other attempt starts; those in
                        // flight may still complete
                        stop = true;
                        last = Some(err.status);
                        continue;
                    }
                    let late = deadline.is_some_and(|d| Instant::now() >= d);
                    if err.stage == Stage::Local && late {
                        return Err(local_past_deadline(&err.status));
                    }
                    let again = match err.stage {
                        Stage::Local => true,
                        Stage::Refused if !refused_once => {
                            refused_once = true;
                            !late
                        }
                        _ => false,
                    };
                    if again {
                        self.transparent(method, &err.status);
                        self.n.attempts.fetch_add(1, Ordering::SeqCst);
                        inflight.push(attempt(previous));
                        previous += 1;
                        continue;
                    }
                    if !p.non_fatal_status_codes.contains(&err.status.code) {
                        return Err(err.status); // fatal: the others are cancelled
                    }
                    if let Some(t) = &self.throttle {
                        t.failure();
                    }
                    match pushback(&err.status) {
                        Pushback::None => next_at = Instant::now(),
                        Pushback::After(d) => next_at = later(d),
                        Pushback::Stop => stop = true,
                    }
                    last = Some(err.status);
                }
                () = timer => {
                    if buffer_committed() {
                        stop = true;
                        continue;
                    }
                    if self.throttle.as_ref().is_some_and(|t| !t.allows()) {
                        self.n.throttled.fetch_add(1, Ordering::SeqCst);
                        metrics::counter!(crate::metrics::RETRIES_THROTTLED, "method" => method.to_string()).increment(1);
                        tracing::debug!(target: "byteexpress_rpc::retry", method, "hedge throttled");
                        stop = true;
                        continue;
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        stop = true;
                        continue;
                    }
                    self.n.attempts.fetch_add(1, Ordering::SeqCst);
                    self.n.hedges.fetch_add(1, Ordering::SeqCst);
                    metrics::counter!(crate::metrics::HEDGES, "method" => method.to_string()).increment(1);
                    tracing::debug!(target: "byteexpress_rpc::retry", method, attempt = started + 1, "hedging");
                    inflight.push(attempt(previous));
                    started += 1;
                    previous += 1;
                    next_at = later(p.hedging_delay);
                }
            }
        }
    }

    fn committed(&self, method: &str) {
        if let Some(t) = &self.throttle {
            t.success();
        }
        self.n.commits.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(crate::metrics::RETRY_COMMITS, "method" => method.to_string(), "reason" => "response")
            .increment(1);
    }

    fn transparent(&self, method: &str, why: &Status) {
        self.n.transparent.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(crate::metrics::TRANSPARENT_RETRIES, "method" => method.to_string())
            .increment(1);
        tracing::debug!(target: "byteexpress_rpc::retry", method, error = %why, "transparent retry");
    }
}

enum Pushback {
    None,
    After(Duration),
    Stop,
}

/// A6: `grpc-retry-pushback-ms` absent = the policy's backoff; a non-negative integer = that
/// many ms; anything else (negative, malformed) = no retry.
fn pushback(s: &Status) -> Pushback {
    match s.metadata.get(RETRY_PUSHBACK) {
        None => Pushback::None,
        Some(v) => match std::str::from_utf8(v)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        {
            Some(ms) => Pushback::After(Duration::from_millis(ms)),
            None => Pushback::Stop,
        },
    }
}

/// `md` with `grpc-previous-rpc-attempts` set to `n` (replacing any earlier value).
fn with_previous(md: &crate::Metadata, n: u32) -> crate::Metadata {
    let mut out = crate::Metadata::new();
    for (k, v) in md.iter() {
        if k != PREVIOUS_ATTEMPTS {
            out.push_unchecked(k.to_string(), v.clone());
        }
    }
    out.push_unchecked(PREVIOUS_ATTEMPTS.to_string(), n.to_string().into());
    out
}

/// The status of a call whose attempts never left the client until its deadline passed.
fn local_past_deadline(why: &Status) -> Status {
    Status::new(
        Code::DeadlineExceeded,
        format!("deadline exceeded before the call left the client: {why}"),
    )
}

/// `d` from now, or a far future (30 years) when that is past what an `Instant` can hold:
/// a huge backoff, pushback or hedging delay waits "forever" (the deadline still ends the
/// call) instead of panicking on overflow.
fn later(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}

#[cfg(test)]
mod review_tests {
    use super::*;

    /// Review of issue 19: proto3 JSON durations stop at 315,576,000,000 s; a service config
    /// with a larger `timeout` (or `hedgingDelay`, `maxBackoff`) must be refused, not accepted
    /// and then overflow `Instant + Duration` (a panic) on every call of the method.
    #[test]
    fn a_timeout_beyond_proto3s_duration_range_is_refused_not_a_panic_per_call() {
        let json = r#"{"methodConfig": [{"name": [{"service": "t.T"}],
            "timeout": "18446744073709551615s"}]}"#;
        let Ok(sc) = ServiceConfig::from_json(json) else {
            return; // refused: the fix
        };
        let r = Retrier::new(sc).expect("validated");
        let plan = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.plan("/t.T/M", None, None).deadline
        }));
        assert!(
            plan.is_ok(),
            "accepted a timeout of u64::MAX s, and planning a call of the method panicked"
        );
    }

    /// proto3's maximum itself is accepted; a caller's own timeout past what an `Instant`
    /// holds is planned as no deadline, not a panic.
    #[test]
    fn proto3s_maximum_duration_is_accepted_and_a_huge_caller_timeout_is_no_deadline() {
        assert_eq!(
            service_config::parse_duration("315576000000.999999999s"),
            Some(service_config::MAX_DURATION)
        );
        assert_eq!(service_config::parse_duration("315576000001s"), None);
        let r = Retrier::new(ServiceConfig::default()).unwrap();
        assert_eq!(r.plan("/t.T/M", Some(Duration::MAX), None).deadline, None);
        assert!(later(Duration::MAX) > Instant::now());
    }

    fn retry_config(throttling: bool) -> ServiceConfig {
        let t = if throttling {
            r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5}"#
        } else {
            ""
        };
        ServiceConfig::from_json(&format!(
            r#"{{"methodConfig": [{{"name": [{{"service": "t.T"}}],
            "retryPolicy": {{"maxAttempts": 4, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
                "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}}}]{t}}}"#
        ))
        .unwrap()
    }

    /// A6: transparent retries of a call that never left the client run within its
    /// deadline; past it the call ends DEADLINE_EXCEEDED (it ended with the local error).
    #[tokio::test]
    async fn a_call_that_never_left_the_client_past_its_deadline_ends_deadline_exceeded() {
        for cfg in [ServiceConfig::default(), retry_config(false)] {
            let r = Retrier::new(cfg).unwrap();
            let deadline = Some(Instant::now() + Duration::from_millis(30));
            let res: Result<(), Status> = r
                .run("/t.T/M", deadline, |_| async {
                    Err(AttemptError::local(Status::new(
                        Code::Unavailable,
                        "no link",
                    )))
                })
                .await;
            assert_eq!(res.unwrap_err().code, Code::DeadlineExceeded);
        }
    }

    /// A6: a stream committed on its buffer limit starts no other attempt when the committed
    /// one fails.
    #[tokio::test]
    async fn a_buffer_committed_stream_starts_no_attempt_after_its_attempt_fails() {
        let r = Retrier::new(retry_config(false)).unwrap();
        let n = AtomicU64::new(0);
        let res: Result<(), Status> = r
            .run_committable(
                "/t.T/M",
                None,
                || n.load(Ordering::SeqCst) > 0,
                |_| {
                    n.fetch_add(1, Ordering::SeqCst);
                    async { Err(AttemptError::other(Status::new(Code::Unavailable, "x"))) }
                },
            )
            .await;
        assert_eq!(res.unwrap_err().code, Code::Unavailable);
        assert_eq!(n.load(Ordering::SeqCst), 1, "attempts after the commit");
    }

    /// A6's throttle: a stream that completes its attempt because it committed on the buffer
    /// limit has no answer yet, so it gives no token back as a success.
    #[tokio::test]
    async fn a_buffer_committed_stream_gives_no_throttle_token_back() {
        let r = Retrier::new(retry_config(true)).unwrap();
        let t = r.throttle.as_ref().unwrap();
        t.failure();
        let before = t.milli_tokens();
        let res: Result<(), Status> = r
            .run_committable("/t.T/M", None, || true, |_| async { Ok(()) })
            .await;
        assert!(res.is_ok());
        assert_eq!(t.milli_tokens(), before);
        // an answered call does give tokenRatio back
        let res: Result<(), Status> = r.run("/t.T/M", None, |_| async { Ok(()) }).await;
        assert!(res.is_ok());
        assert_eq!(t.milli_tokens(), before + 500);
    }
}
