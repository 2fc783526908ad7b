//! A client over a service's replicas: [`ReplicaSet`].
//!
//! - **Endpoint sources** ([`source`]): a static list, a DNS name re-resolved periodically
//!   through a [`Resolve`] (the system resolver by default; every A/AAAA record is a replica),
//!   or any `tower::discover::Discover` stream (a Kubernetes, etcd or Consul watcher).
//! - **Connecting** as gRPC does: lazily, each endpoint on a link of its own, reconnecting with
//!   gRPC's connection backoff ([`Backoff`]); a call's deadline bounds the wait for a ready
//!   endpoint; `wait_for_ready` per call ([`CallOptions`]).
//! - **Balancing** ([`Policy`]): power of two choices by outstanding calls × peak-EWMA latency,
//!   as `tower::load::PeakEwma` weighs them, or round robin.
//! - **Outlier ejection** ([`OutlierDetection`]): gRPC A50's success-rate and
//!   failure-percentage ejection plus consecutive-failure ejection.

mod backoff;
mod ewma;
mod outlier;
mod set;
pub mod source;

use std::time::Duration;

pub use backoff::Backoff;
pub use outlier::{FailurePercentageEjection, OutlierDetection, SuccessRateEjection};
pub use set::{
    CallOptions, EndpointInfo, EndpointState, OutlierEvent, OutlierEventKind, ReplicaSet,
    ReplicaSetStats,
};
pub use source::{Resolve, SystemResolver};
/// `tower::discover`'s trait and change type, for [`ReplicaSet::from_discover`].
pub use tower::discover::{Change, Discover};

/// How a [`ReplicaSet`] picks an endpoint among the ready, admitted ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Power of two choices: two endpoints drawn at random, the one with the lower cost
    /// `peak-EWMA latency × (outstanding calls + 1)` takes the call (`tower::balance::p2c` with
    /// `tower::load::PeakEwma`'s cost).
    #[default]
    PowerOfTwoChoices,
    /// Each call to the next endpoint in turn (gRPC's `round_robin`).
    RoundRobin,
}

/// Settings of a [`ReplicaSet`] above its links (the links' own settings are the
/// [`Config`](crate::Config) given beside it).
#[derive(Debug, Clone, PartialEq)]
pub struct BalanceConfig {
    /// Picking policy (default [`Policy::PowerOfTwoChoices`]).
    pub policy: Policy,
    /// Reconnection backoff of each endpoint (default: gRPC's constants).
    pub backoff: Backoff,
    /// Outlier ejection (default: A50's defaults and 5 consecutive failures).
    pub outlier: OutlierDetection,
    /// Latency estimate of an endpoint before its first answer (default 30 ms, as
    /// `tower::load::PeakEwma` is commonly set up), or the mean estimate of the endpoints
    /// that have answered if that is lower: a new endpoint is tried, without being preferred,
    /// even when the others answer much faster. Its first answer replaces the estimate.
    pub default_rtt: Duration,
    /// Decay time of the peak-EWMA latency estimate (default 10 s): a sample `decay` after the
    /// last weighs 1 − 1/e.
    pub rtt_decay: Duration,
    /// Period of DNS re-resolution for [`ReplicaSet::from_dns`] (default 30 s, gRPC's
    /// minimum time between DNS resolutions).
    pub resolve_every: Duration,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig {
            policy: Policy::default(),
            backoff: Backoff::default(),
            outlier: OutlierDetection::default(),
            default_rtt: Duration::from_millis(30),
            rtt_decay: Duration::from_secs(10),
            resolve_every: Duration::from_secs(30),
        }
    }
}
