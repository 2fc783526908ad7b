//! [`ReplicaSet`]: endpoints, their links and states, picking, outlier ejection.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backoff::BackoffState;
use super::ewma::{PeakEwma, cost};
use super::outlier::{self, HostWindow};
use super::{BalanceConfig, Policy};
use crate::retry::{AttemptError, Retrier};
use crate::{Client, Code, Config, Request, Response, Status, Transport};

#[path = "set_stream.rs"]
mod set_stream;

/// Options of one call through a [`ReplicaSet`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// gRPC's wait-for-ready (`doc/wait-for-ready.md`). Off (default): the call fails fast
    /// with UNAVAILABLE while every endpoint is in TRANSIENT_FAILURE (its last connection
    /// attempt failed, or it is ejected); it still waits while endpoints are connecting for
    /// the first time. On: the call waits for a ready endpoint until its deadline
    /// (DEADLINE_EXCEEDED then), without a deadline for as long as it takes. `None`
    /// (default): the method's `waitForReady` from the attached
    /// [`ServiceConfig`](crate::ServiceConfig), off without one; `Some(_)` set on the call
    /// wins over the config's either way (gRPC: a call's own setting overrides the service
    /// config's).
    pub wait_for_ready: Option<bool>,
}

/// gRPC connectivity state of one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointState {
    /// Not connecting: the set has not been used yet ([`ReplicaSet`] connects lazily).
    Idle,
    /// A connection attempt (TCP connect and link set-up) is under way.
    Connecting,
    /// A link is up; calls may go to the endpoint unless it is ejected.
    Ready,
    /// The last attempt failed; the next comes after the backoff.
    TransientFailure,
}

/// What [`ReplicaSet::endpoints`] reports of one endpoint.
#[derive(Debug, Clone)]
pub struct EndpointInfo {
    /// `host:port` the endpoint's link connects to.
    pub addr: String,
    /// Connectivity state.
    pub state: EndpointState,
    /// Transport its current link negotiated (`None` while no link is up).
    pub transport: Option<Transport>,
    /// Calls sent to it and not yet answered.
    pub outstanding: usize,
    /// Peak-EWMA latency estimate.
    pub rtt_estimate: Duration,
    /// Whether outlier detection holds it out of picking.
    pub ejected: bool,
    /// Times it was ejected.
    pub ejections: u64,
    /// Calls it ended (any status but CANCELLED).
    pub calls: u64,
    /// Calls that failed (any status but OK and CANCELLED).
    pub failures: u64,
    /// Connection attempts so far (TCP connect and link set-up), successful or not.
    pub attempts: u64,
}

/// Counters of a [`ReplicaSet`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaSetStats {
    /// Ejections by outlier detection.
    pub ejections: u64,
    /// Re-admissions after an ejection time ran out.
    pub readmissions: u64,
    /// Endpoints added (sources' inserts included).
    pub added: u64,
    /// Endpoints removed.
    pub removed: u64,
}

/// An ejection or re-admission ([`ReplicaSet::outlier_events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutlierEvent {
    /// The endpoint's address.
    pub addr: String,
    /// What happened.
    pub kind: OutlierEventKind,
    /// When.
    pub at: Instant,
}

/// Kind of an [`OutlierEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutlierEventKind {
    /// Ejected for this long (A50's growing ejection time); `reason` names the check.
    Ejected {
        /// Ejection time.
        duration: Duration,
        /// `consecutive_failures`, `success_rate` or `failure_percentage`.
        reason: &'static str,
    },
    /// Back in picking.
    Readmitted,
}

enum Conn {
    Idle,
    Connecting,
    Ready(Client),
    Failed,
}

struct EpState {
    conn: Conn,
    /// The last attempt failed and no link came up since (sticky TRANSIENT_FAILURE).
    failed_since_ready: bool,
    ewma: PeakEwma,
    successes: u64,
    failures: u64,
    consecutive: u32,
    ejected: Option<(Instant, Duration)>,
    multiplier: u32,
    ejections: u64,
    calls: u64,
    failed_calls: u64,
    attempts: u64,
}

pub(crate) struct Endpoint {
    pub(crate) id: u64,
    addr: String,
    st: Mutex<EpState>,
    outstanding: AtomicUsize,
    stop: CancellationToken,
}

pub(crate) struct Core {
    cfg: Config,
    bal: BalanceConfig,
    eps: Mutex<Vec<Arc<Endpoint>>>,
    changed: Notify,
    wakers: Mutex<Vec<Waker>>,
    active: watch::Sender<bool>,
    /// Whether the source has given its first endpoints (calls wait before that).
    pub(crate) resolved: AtomicBool,
    rr: AtomicUsize,
    next_id: AtomicU64,
    ejections: AtomicU64,
    readmissions: AtomicU64,
    added: AtomicU64,
    removed: AtomicU64,
    events: broadcast::Sender<OutlierEvent>,
    pub(crate) stop: CancellationToken,
    /// The service config in use, its throttle and counters (`crate::retry`).
    retry: Mutex<Arc<Retrier>>,
}

/// Stops the set's tasks when the last handle goes.
struct Handle {
    core: Arc<Core>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.core.stop.cancel();
    }
}

/// A client over a service's replicas: a set of endpoints (each with its own link, transport
/// negotiated per endpoint), calls balanced over the ready ones ([`Policy`]), outliers ejected
/// ([`OutlierDetection`](super::OutlierDetection)), endpoints coming and going with their
/// source. Cloning shares the set; its background tasks (one per endpoint, the ejection sweep,
/// the source) end when the last clone drops. Needs a tokio runtime.
///
/// Connecting follows gRPC: the set is IDLE until its first call (or
/// [`ReplicaSet::poll_ready`], or [`ReplicaSet::connect_now`]); then every endpoint connects,
/// and reconnects with [`Backoff`](super::Backoff) when its link is lost or an attempt fails.
/// Each endpoint's link is its own ([`Client::connect_unshared`]), not the process registry's.
///
/// A call goes to a second endpoint only as `crate::retry` allows: transparently when it never
/// left the client or a server refused it before dispatch, else as the attached
/// [`ServiceConfig`](crate::ServiceConfig)'s retry or hedging policy says
/// ([`ReplicaSet::with_service_config`]); a retry or hedge goes to an endpoint the call has not
/// tried yet when one is ready.
#[derive(Clone)]
pub struct ReplicaSet {
    h: Arc<Handle>,
}

impl std::fmt::Debug for ReplicaSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaSet")
            .field("endpoints", &self.endpoints())
            .finish()
    }
}

enum Pick {
    Ready(Arc<Endpoint>, Client),
    Wait,
    Fail(String),
}

impl ReplicaSet {
    /// An empty set; its source (static list, DNS, `Discover`) fills it.
    pub(crate) fn empty(cfg: &Config, bal: &BalanceConfig) -> (ReplicaSet, Arc<Core>) {
        let (events, _) = broadcast::channel(1024);
        let core = Arc::new(Core {
            cfg: cfg.clone(),
            bal: bal.clone(),
            eps: Mutex::new(Vec::new()),
            changed: Notify::new(),
            wakers: Mutex::new(Vec::new()),
            active: watch::Sender::new(false),
            resolved: AtomicBool::new(false),
            rr: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            ejections: AtomicU64::new(0),
            readmissions: AtomicU64::new(0),
            added: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            events,
            stop: CancellationToken::new(),
            retry: Mutex::default(),
        });
        tokio::spawn(sweep_task(core.clone()));
        let set = ReplicaSet {
            h: Arc::new(Handle { core: core.clone() }),
        };
        (set, core)
    }

    /// A set over a fixed list of `host:port` addresses, connecting lazily. A host name in
    /// an address is resolved at each connection attempt (use [`ReplicaSet::from_dns`] for one
    /// endpoint per DNS record).
    pub fn from_static<S: AsRef<str>>(
        addrs: impl IntoIterator<Item = S>,
        cfg: &Config,
        bal: &BalanceConfig,
    ) -> ReplicaSet {
        let (set, core) = ReplicaSet::empty(cfg, bal);
        for a in addrs {
            core.add(a.as_ref().to_string());
        }
        core.resolved.store(true, Ordering::SeqCst);
        set
    }

    /// Starts connecting every endpoint now, rather than at the first call.
    pub fn connect_now(&self) {
        self.h.core.activate();
    }

    /// Makes a call with default [`CallOptions`] (fail fast).
    pub async fn call(&self, req: Request) -> Result<Response, Status> {
        self.call_with(req, CallOptions::default()).await
    }

    /// Makes a call on an endpoint picked by the set's [`Policy`] among the ready, admitted
    /// ones. `req.timeout` bounds everything: the wait for a ready endpoint (connecting
    /// included) and the call. Errors: DEADLINE_EXCEEDED when the deadline passes, whether
    /// waiting or calling; UNAVAILABLE when `wait_for_ready` is off and every endpoint is in
    /// TRANSIENT_FAILURE or ejected (or the set is empty), or when the picked endpoint's link
    /// fails during the call; else the status of the call ([`Client::call`]).
    pub async fn call_with(&self, req: Request, opts: CallOptions) -> Result<Response, Status> {
        let core = &self.h.core;
        let retry = core.retry.lock().clone();
        let t0 = std::time::Instant::now();
        let plan = retry.plan(&req.method, req.timeout, opts.wait_for_ready);
        let opts = CallOptions {
            wait_for_ready: Some(plan.wait_for_ready),
        };
        let tried = Mutex::new(Vec::new());
        let res = retry
            .run(&req.method, plan.deadline, |info| {
                let (req, tried) = (&req, &tried);
                async move {
                    let (ep, client) = self.pick_untried(info.deadline, opts, tried).await?;
                    // counted by `pick`, so that concurrent picks see it
                    let _out = Outstanding(&ep);
                    let t0 = Instant::now();
                    let res = client.call_attempt(req, info).await;
                    core.record(
                        &ep,
                        &res.as_ref().map_err(|e| e.status.clone()).cloned(),
                        t0.elapsed(),
                    );
                    res
                }
            })
            .await;
        crate::metrics::record_client_call(&req.method, &res, t0);
        res
    }

    /// This set (and every clone of it, which share it) with `sc` governing its calls and
    /// streams: per-method timeout, waitForReady, retry or hedging policy, throttling (gRPC
    /// A6; `crate::retry` has the rule). Replaces the set's earlier config, throttle and
    /// [`ReplicaSet::retry_stats`]. Errors: `sc` fails
    /// [`ServiceConfig::validate`](crate::ServiceConfig::validate).
    pub fn with_service_config(
        self,
        sc: crate::ServiceConfig,
    ) -> Result<ReplicaSet, crate::ServiceConfigError> {
        *self.h.core.retry.lock() = Arc::new(Retrier::new(sc)?);
        Ok(self)
    }

    /// Counters of retries, hedges, throttling, transparent retries and commits of this set's
    /// calls and streams ([`RetryStats`](crate::RetryStats)).
    pub fn retry_stats(&self) -> crate::RetryStats {
        self.h.core.retry.lock().stats()
    }

    pub(crate) fn retrier(&self) -> Arc<Retrier> {
        self.h.core.retry.lock().clone()
    }

    /// [`ReplicaSet::ready_endpoint_avoiding`] the endpoints in `tried` (this call's earlier
    /// attempts), adding the one picked to `tried`. Errors: as that, as an attempt's failure.
    pub(super) async fn pick_untried(
        &self,
        deadline: Option<Instant>,
        opts: CallOptions,
        tried: &Mutex<Vec<u64>>,
    ) -> Result<(Arc<Endpoint>, Client), AttemptError> {
        let avoid = tried.lock().clone();
        let (ep, client, _) = self
            .ready_endpoint_avoiding(deadline, opts, &avoid)
            .await
            .map_err(AttemptError::other)?;
        tried.lock().push(ep.id);
        Ok((ep, client))
    }

    /// Waits for a ready, admitted endpoint picked by the set's [`Policy`] (connecting an idle
    /// set), for a call or a stream ending at `deadline`, preferring endpoints not in `avoid`
    /// (ids of endpoints the call tried already) when one of those is ready. Returns it
    /// (counted outstanding by the pick), its client and the time left. Errors: UNAVAILABLE
    /// when `wait_for_ready` is off and no endpoint can be ready; DEADLINE_EXCEEDED when the
    /// deadline passes first.
    pub(super) async fn ready_endpoint_avoiding(
        &self,
        deadline: Option<Instant>,
        opts: CallOptions,
        avoid: &[u64],
    ) -> Result<(Arc<Endpoint>, Client, Option<Duration>), Status> {
        let core = &self.h.core;
        core.activate();
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let (ep, client) = loop {
            let changed = core.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match core.pick_avoiding(avoid) {
                Pick::Ready(ep, c) => break (ep, c),
                Pick::Fail(why) if opts.wait_for_ready != Some(true) => {
                    return Err(Status::new(
                        Code::Unavailable,
                        format!("no ready endpoint: {why}"),
                    ));
                }
                _ => {}
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, changed).await.is_err() {
                        return Err(Status::new(
                            Code::DeadlineExceeded,
                            format!(
                                "deadline of {:?} exceeded while waiting for a ready endpoint",
                                timeout.unwrap_or_default()
                            ),
                        ));
                    }
                }
                None => changed.await,
            }
        };
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        Ok((ep, client, left))
    }

    /// Ready when a call would find a ready, admitted endpoint now; Pending (with `cx`'s waker
    /// woken at the next change of any endpoint) otherwise. With `fail_fast`, also Ready while
    /// every endpoint is in TRANSIENT_FAILURE, so that a fail-fast call may fail at once.
    /// Starts connecting an idle set. Never an error.
    pub fn poll_ready(&self, cx: &mut Context<'_>, fail_fast: bool) -> Poll<()> {
        let core = &self.h.core;
        core.activate();
        {
            let mut w = core.wakers.lock();
            if !w.iter().any(|x| x.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
        }
        match core.pick_state() {
            PickState::Ready => Poll::Ready(()),
            PickState::Failed if fail_fast => Poll::Ready(()),
            _ => Poll::Pending,
        }
    }

    /// Largest request in bytes, as on each endpoint's link ([`Config::max_message`]).
    pub fn max_message(&self) -> usize {
        self.h.core.cfg.max_message
    }

    /// Every endpoint as it stands.
    pub fn endpoints(&self) -> Vec<EndpointInfo> {
        let eps = self.h.core.eps.lock().clone();
        eps.iter().map(|e| e.info()).collect()
    }

    /// Counters: ejections, re-admissions, endpoints added and removed.
    pub fn stats(&self) -> ReplicaSetStats {
        let c = &self.h.core;
        ReplicaSetStats {
            ejections: c.ejections.load(Ordering::SeqCst),
            readmissions: c.readmissions.load(Ordering::SeqCst),
            added: c.added.load(Ordering::SeqCst),
            removed: c.removed.load(Ordering::SeqCst),
        }
    }

    /// Ejections and re-admissions from now on (a broadcast of 1,024 events; a receiver that
    /// falls behind loses the oldest). They are also logged (`tracing`, target
    /// `byteexpress_rpc::balance`) and counted ([`ReplicaSet::stats`]).
    pub fn outlier_events(&self) -> broadcast::Receiver<OutlierEvent> {
        self.h.core.events.subscribe()
    }

    /// Resolves at the next change of any endpoint's state (connectivity, ejection, the set
    /// itself), for callers that watch [`ReplicaSet::endpoints`].
    /// The future is registered at this call: a change between the call and the first poll
    /// is not missed.
    pub fn changed(&self) -> impl Future<Output = ()> + Send + '_ {
        self.h.core.changed.notified()
    }
}

struct Outstanding<'a>(&'a Endpoint);

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(PartialEq, Eq)]
enum PickState {
    Ready,
    Wait,
    Failed,
}

impl Endpoint {
    fn info(&self) -> EndpointInfo {
        let st = self.st.lock();
        let (state, transport) = match &st.conn {
            Conn::Idle => (EndpointState::Idle, None),
            Conn::Connecting => (EndpointState::Connecting, None),
            Conn::Ready(c) => (EndpointState::Ready, Some(c.transport())),
            Conn::Failed => (EndpointState::TransientFailure, None),
        };
        EndpointInfo {
            addr: self.addr.clone(),
            state,
            transport,
            outstanding: self.outstanding.load(Ordering::SeqCst),
            rtt_estimate: Duration::from_nanos(st.ewma.estimate_ns() as u64),
            ejected: st.ejected.is_some(),
            ejections: st.ejections,
            calls: st.calls,
            failures: st.failed_calls,
            attempts: st.attempts,
        }
    }
}

impl Core {
    fn activate(&self) {
        self.active
            .send_if_modified(|a| !std::mem::replace(a, true));
    }

    /// Wakes calls and `poll_ready`ers waiting for a change.
    pub(crate) fn notify(&self) {
        self.changed.notify_waiters();
        for w in std::mem::take(&mut *self.wakers.lock()) {
            w.wake();
        }
    }

    /// Adds an endpoint and starts its connection task; returns its id.
    pub(crate) fn add(self: &Arc<Self>, addr: String) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ep = Arc::new(Endpoint {
            id,
            addr: addr.clone(),
            st: Mutex::new(EpState {
                conn: Conn::Idle,
                failed_since_ready: false,
                ewma: PeakEwma::new(self.bal.default_rtt, self.bal.rtt_decay),
                successes: 0,
                failures: 0,
                consecutive: 0,
                ejected: None,
                multiplier: 0,
                ejections: 0,
                calls: 0,
                failed_calls: 0,
                attempts: 0,
            }),
            outstanding: AtomicUsize::new(0),
            stop: self.stop.child_token(),
        });
        self.eps.lock().push(ep.clone());
        self.added.fetch_add(1, Ordering::SeqCst);
        tracing::info!(target: "byteexpress_rpc::balance", addr, "endpoint added");
        tokio::spawn(drive(self.clone(), ep));
        self.notify();
        id
    }

    /// Removes an endpoint: no new call goes to it; calls in flight on it finish on its link,
    /// which closes after the last of them.
    pub(crate) fn remove(&self, id: u64) {
        let gone = {
            let mut eps = self.eps.lock();
            let i = eps.iter().position(|e| e.id == id);
            i.map(|i| eps.remove(i))
        };
        if let Some(ep) = gone {
            ep.stop.cancel();
            self.removed.fetch_add(1, Ordering::SeqCst);
            tracing::info!(target: "byteexpress_rpc::balance", addr = ep.addr, "endpoint removed");
            self.notify();
        }
    }

    /// Re-resolution period of a DNS source.
    pub(crate) fn resolve_every(&self) -> Duration {
        self.bal.resolve_every
    }

    /// Ids and addresses of the endpoints.
    pub(crate) fn addrs(&self) -> Vec<(u64, String)> {
        self.eps
            .lock()
            .iter()
            .map(|e| (e.id, e.addr.clone()))
            .collect()
    }

    fn pick_state(&self) -> PickState {
        match self.pick_inner(false, &[]) {
            Pick::Ready(..) => PickState::Ready,
            Pick::Wait => PickState::Wait,
            Pick::Fail(_) => PickState::Failed,
        }
    }

    /// Picks an endpoint for a call; a picked one counts the call as outstanding (the caller
    /// holds an [`Outstanding`] for it).
    fn pick_avoiding(&self, avoid: &[u64]) -> Pick {
        self.pick_inner(true, avoid)
    }

    fn pick_inner(&self, choose: bool, avoid: &[u64]) -> Pick {
        let eps = self.eps.lock().clone();
        if eps.is_empty() {
            return if self.resolved.load(Ordering::SeqCst) {
                Pick::Fail("the set has no endpoints".into())
            } else {
                Pick::Wait
            };
        }
        let mut ready: Vec<(Arc<Endpoint>, Client, Option<f64>)> = Vec::new();
        let mut waiting = false;
        let mut ejected = 0;
        for ep in &eps {
            let st = ep.st.lock();
            match &st.conn {
                Conn::Ready(c) if !c.is_closed() => {
                    if st.ejected.is_some() {
                        ejected += 1;
                    } else {
                        ready.push((ep.clone(), c.clone(), st.ewma.sampled_ns()));
                    }
                }
                Conn::Failed => {}
                _ => waiting |= !st.failed_since_ready,
            }
        }
        if ready.is_empty() {
            if waiting {
                return Pick::Wait;
            }
            return Pick::Fail(format!(
                "{} endpoints, {ejected} ready ones ejected, the others in TRANSIENT_FAILURE",
                eps.len()
            ));
        }
        if !avoid.is_empty() && ready.iter().any(|r| !avoid.contains(&r.0.id)) {
            ready.retain(|r| !avoid.contains(&r.0.id));
        }
        if !choose {
            let (ep, c, _) = ready.swap_remove(0);
            return Pick::Ready(ep, c);
        }
        if ready.len() == 1 {
            let (ep, c, _) = ready.swap_remove(0);
            ep.outstanding.fetch_add(1, Ordering::SeqCst);
            return Pick::Ready(ep, c);
        }
        let i = match self.bal.policy {
            Policy::RoundRobin => self.rr.fetch_add(1, Ordering::Relaxed) % ready.len(),
            Policy::PowerOfTwoChoices => {
                // An endpoint not yet answered is estimated at the default RTT or the mean of
                // the answered ones, whichever is lower, so that a new endpoint gets calls
                // (and its first sample) even under light load.
                let sampled: Vec<f64> = ready.iter().filter_map(|r| r.2).collect();
                let default = self.bal.default_rtt.as_nanos() as f64;
                let fresh = if sampled.is_empty() {
                    default
                } else {
                    default.min(sampled.iter().sum::<f64>() / sampled.len() as f64)
                };
                let est = |r: &(Arc<Endpoint>, Client, Option<f64>)| r.2.unwrap_or(fresh);
                let n = ready.len();
                let a = rand::random_range(0..n);
                let b = (a + rand::random_range(1..n)) % n;
                let ca = cost(
                    est(&ready[a]),
                    ready[a].0.outstanding.load(Ordering::SeqCst),
                );
                let cb = cost(
                    est(&ready[b]),
                    ready[b].0.outstanding.load(Ordering::SeqCst),
                );
                if ca <= cb { a } else { b }
            }
        };
        let (ep, c, _) = ready.swap_remove(i);
        ep.outstanding.fetch_add(1, Ordering::SeqCst);
        Pick::Ready(ep, c)
    }

    /// Counts one call's outcome on `ep`; ejects it on too many consecutive failures.
    fn record(&self, ep: &Arc<Endpoint>, res: &Result<Response, Status>, took: Duration) {
        let code = res.as_ref().err().map(|s| s.code);
        if code == Some(Code::Cancelled) {
            return;
        }
        let now = Instant::now();
        let eject = {
            let mut st = ep.st.lock();
            st.calls += 1;
            if code != Some(Code::Unavailable) {
                st.ewma.observe(took, now);
            }
            match code {
                None => {
                    st.successes += 1;
                    st.consecutive = 0;
                    false
                }
                Some(_) => {
                    st.failures += 1;
                    st.failed_calls += 1;
                    st.consecutive += 1;
                    let limit = self.bal.outlier.consecutive_failures.unwrap_or(0);
                    limit > 0 && st.consecutive >= limit && st.ejected.is_none()
                }
            }
        };
        if eject {
            let eps = self.eps.lock().clone();
            let out = eps.iter().filter(|e| e.st.lock().ejected.is_some()).count();
            if outlier::may_eject(out, eps.len(), self.bal.outlier.max_ejection_percent)
                && eps.iter().any(|e| e.id == ep.id)
            {
                self.eject(ep, "consecutive_failures", now);
            }
        }
    }

    fn eject(&self, ep: &Endpoint, reason: &'static str, now: Instant) {
        let duration = {
            let mut st = ep.st.lock();
            if st.ejected.is_some() {
                return;
            }
            st.multiplier += 1;
            st.ejections += 1;
            st.consecutive = 0;
            let d = outlier::ejection_time(&self.bal.outlier, st.multiplier);
            st.ejected = Some((now, d));
            d
        };
        tracing::warn!(target: "byteexpress_rpc::balance", addr = ep.addr, ?duration, reason, "endpoint ejected");
        // the event goes out before the counters move, so whoever sees a count finds its event
        let _ = self.events.send(OutlierEvent {
            addr: ep.addr.clone(),
            kind: OutlierEventKind::Ejected { duration, reason },
            at: now,
        });
        self.ejections.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(crate::metrics::ENDPOINT_EJECTIONS, "reason" => reason).increment(1);
        self.notify();
    }

    /// One interval of A50: success-rate and failure-percentage ejection over the counts of
    /// the interval just ended, then multipliers and re-admissions.
    fn sweep(&self) {
        let now = Instant::now();
        let eps = self.eps.lock().clone();
        let mut windows: Vec<HostWindow> = eps
            .iter()
            .map(|e| {
                let mut st = e.st.lock();
                HostWindow {
                    successes: std::mem::take(&mut st.successes),
                    failures: std::mem::take(&mut st.failures),
                    ejected: st.ejected.is_some(),
                }
            })
            .collect();
        let mut rand100 = || rand::random_range(0..100u32);
        let newly = outlier::sweep(&self.bal.outlier, &mut windows, &mut rand100);
        for &(i, reason) in &newly {
            self.eject(&eps[i], reason, now);
        }
        let newly: HashSet<usize> = newly.into_iter().map(|(i, _)| i).collect();
        for (i, ep) in eps.iter().enumerate() {
            if newly.contains(&i) {
                continue;
            }
            let readmit = {
                let mut st = ep.st.lock();
                match st.ejected {
                    None => {
                        st.multiplier = st.multiplier.saturating_sub(1);
                        false
                    }
                    Some((at, d)) if now >= at + d => {
                        st.ejected = None;
                        st.consecutive = 0;
                        true
                    }
                    Some(_) => false,
                }
            };
            if readmit {
                tracing::info!(target: "byteexpress_rpc::balance", addr = ep.addr, "endpoint re-admitted");
                // as for an ejection: the event before the counters
                let _ = self.events.send(OutlierEvent {
                    addr: ep.addr.clone(),
                    kind: OutlierEventKind::Readmitted,
                    at: now,
                });
                self.readmissions.fetch_add(1, Ordering::SeqCst);
                metrics::counter!(crate::metrics::ENDPOINT_READMISSIONS).increment(1);
                self.notify();
            }
        }
    }
}

/// Runs A50's interval sweep until the set goes.
async fn sweep_task(core: Arc<Core>) {
    let period = core.bal.outlier.interval.max(Duration::from_millis(1));
    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = core.stop.cancelled() => return,
            _ = tick.tick() => core.sweep(),
        }
    }
}

/// One endpoint's connection life: connect when the set is active, back off after a failed
/// attempt, reconnect when the link is lost; ends when the endpoint is removed or the set
/// goes.
async fn drive(core: Arc<Core>, ep: Arc<Endpoint>) {
    let mut active = core.active.subscribe();
    tokio::select! {
        _ = ep.stop.cancelled() => return,
        r = active.wait_for(|a| *a) => if r.is_err() { return },
    }
    let set = |conn: Conn, failed: Option<bool>| {
        let mut st = ep.st.lock();
        st.conn = conn;
        if let Some(f) = failed {
            st.failed_since_ready = f;
        }
        drop(st);
        core.notify();
    };
    let mut backoff = BackoffState::new(core.bal.backoff);
    loop {
        ep.st.lock().attempts += 1;
        set(Conn::Connecting, None);
        let started = Instant::now();
        let mut cfg = core.cfg.clone();
        cfg.connect_timeout = backoff.attempt_timeout();
        let attempt = tokio::select! {
            _ = ep.stop.cancelled() => return,
            r = Client::connect_unshared(&ep.addr, &cfg) => r,
        };
        match attempt {
            Ok(client) => {
                let up = Instant::now();
                tracing::info!(target: "byteexpress_rpc::balance", addr = ep.addr, transport = %client.transport(), "endpoint ready");
                set(Conn::Ready(client.clone()), Some(false));
                tokio::select! {
                    _ = ep.stop.cancelled() => return,
                    _ = client.link_closed() => {}
                }
                tracing::info!(target: "byteexpress_rpc::balance", addr = ep.addr, "endpoint's link lost; reconnecting");
                // A link that lived at least INITIAL_BACKOFF counts as a success: reconnect at
                // once with the backoff reset. One that died sooner (a peer that accepts and
                // drops links) counts as a failed attempt, so such a peer is retried at the
                // backoff's pace, not in a tight loop.
                if up.elapsed() >= core.bal.backoff.initial {
                    backoff.reset();
                } else {
                    let wait = backoff.failed(rand::random::<f64>());
                    set(Conn::Failed, Some(true));
                    tokio::select! {
                        _ = ep.stop.cancelled() => return,
                        _ = tokio::time::sleep_until(started + wait) => {}
                    }
                }
            }
            Err(e) => {
                let wait = backoff.failed(rand::random::<f64>());
                tracing::debug!(target: "byteexpress_rpc::balance", addr = ep.addr, error = %e, ?wait, "connection attempt failed");
                set(Conn::Failed, Some(true));
                tokio::select! {
                    _ = ep.stop.cancelled() => return,
                    _ = tokio::time::sleep_until(started + wait) => {}
                }
            }
        }
    }
}
