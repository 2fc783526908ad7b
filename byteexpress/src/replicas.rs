//! [`Channel`]s over a service's replicas: constructors, per-call wait-for-ready.

use std::sync::Arc;

use byteexpress_rpc::{
    BalanceConfig, Config, ReplicaSet, RetryStats, ServiceConfig, ServiceConfigError, Status,
    balance::SystemResolver,
};

use crate::channel::{Channel, Target, parse_uri};

/// Per-call gRPC wait-for-ready for a [`Channel`] over replicas, as a request extension: a
/// tonic user writes
/// `let mut req = tonic::Request::new(msg); req.extensions_mut().insert(WaitForReady(true));`
/// and calls the generated client with `req` (tonic carries extensions to the channel). It
/// overrides the channel's default ([`Channel::wait_for_ready`]) and the service config's
/// `waitForReady` ([`Channel::with_service_config`]) for that call: `true` waits
/// for a ready endpoint until the call's deadline (`grpc-timeout`); `false` fails fast with
/// UNAVAILABLE while every endpoint is in TRANSIENT_FAILURE. Source: gRPC's
/// `doc/wait-for-ready.md`. A single-address channel ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitForReady(pub bool);

impl Channel {
    /// A channel to `uri` (`bx://host:port`) that connects at its first call (or `poll_ready`),
    /// as tonic's `Endpoint::connect_lazy`, with [`Config::default`] and
    /// [`BalanceConfig::default`]: a [`ReplicaSet`] of one endpoint, which reconnects with
    /// gRPC's backoff. Errors: INVALID_ARGUMENT for a malformed URI (nothing else: the server
    /// need not exist yet). Call it inside a tokio runtime (the set's tasks are spawned on it;
    /// panics otherwise), as every constructor over replicas.
    pub fn connect_lazy(uri: &str) -> Result<Channel, Status> {
        Channel::connect_lazy_with(uri, &Config::default(), &BalanceConfig::default())
    }

    /// [`Channel::connect_lazy`] with settings.
    pub fn connect_lazy_with(
        uri: &str,
        cfg: &Config,
        bal: &BalanceConfig,
    ) -> Result<Channel, Status> {
        Channel::balance_list([uri], cfg, bal)
    }

    /// A channel over a static list of `bx://host:port` URIs (or `https://host:port` with
    /// `Config::tls`: see [`Channel::connect_with`]), balanced per `bal.policy`,
    /// connecting lazily. Errors: INVALID_ARGUMENT for a malformed URI.
    pub fn balance_list<S: AsRef<str>>(
        uris: impl IntoIterator<Item = S>,
        cfg: &Config,
        bal: &BalanceConfig,
    ) -> Result<Channel, Status> {
        let mut addrs = Vec::new();
        for u in uris {
            addrs.push(parse_uri(u.as_ref(), cfg)?.to_string());
        }
        Ok(Channel::from_replica_set(ReplicaSet::from_static(
            addrs, cfg, bal,
        )))
    }

    /// A channel over every A/AAAA record of the host in `uri` (`bx://name:port`), resolved by
    /// the system resolver and re-resolved every `bal.resolve_every`
    /// ([`ReplicaSet::from_dns`]; another resolver: build the set and use
    /// [`Channel::from_replica_set`]). Errors: INVALID_ARGUMENT for a malformed URI.
    pub fn from_dns(uri: &str, cfg: &Config, bal: &BalanceConfig) -> Result<Channel, Status> {
        let name = parse_uri(uri, cfg)?;
        Ok(Channel::from_replica_set(ReplicaSet::from_dns(
            name,
            Arc::new(SystemResolver),
            cfg,
            bal,
        )?))
    }

    /// A channel over `set` (e.g. [`ReplicaSet::from_discover`] with a `tower::discover`
    /// stream), failing fast by default.
    pub fn from_replica_set(set: ReplicaSet) -> Channel {
        Channel {
            target: Target::Set(set, None),
        }
    }

    /// Sets this channel's default wait-for-ready (as grpc-java's `withWaitForReady` on a
    /// stub); [`WaitForReady`] on a request overrides it per call. Once set, it wins over the
    /// service config's `waitForReady`; a channel that never set it takes the config's. Since tonic's generated
    /// clients wait for `poll_ready` before each call, `poll_ready` follows it: with
    /// wait-for-ready it is Pending while no endpoint is ready; without (default) it is Pending
    /// while no endpoint is ready and some are still connecting for the first time, and Ready
    /// once every endpoint is in TRANSIENT_FAILURE, so that the call can fail fast with
    /// UNAVAILABLE. Never an error. No effect on a single-address channel.
    pub fn wait_for_ready(self, on: bool) -> Channel {
        match self.target {
            Target::Set(set, _) => Channel {
                target: Target::Set(set, Some(on)),
            },
            one => Channel { target: one },
        }
    }

    /// The replica set under this channel; `None` for a single-address channel.
    pub fn replica_set(&self) -> Option<&ReplicaSet> {
        match &self.target {
            Target::Set(set, _) => Some(set),
            Target::One(_) => None,
        }
    }

    /// This channel with `sc` (gRPC service config: per-method timeout, waitForReady, retry or
    /// hedging policy, retry throttling; `byteexpress_rpc::retry` has the rule) governing its
    /// calls: `channel.with_service_config(ServiceConfig::from_json(json)?)?`. Over replicas it
    /// is the [`ReplicaSet`]'s (shared with every channel and clone over that set); on a
    /// single-address channel, this channel's (clones made after share it). Calls are retried
    /// or hedged until they commit (the answer's headers or first message); request messages
    /// of client- and bidirectional-streaming calls under a retry or hedging policy are kept
    /// up to 256 KiB and sent to every attempt (replayed on a retry, sent to each hedged
    /// attempt). Errors: `sc` fails [`ServiceConfig::validate`].
    pub fn with_service_config(self, sc: ServiceConfig) -> Result<Channel, ServiceConfigError> {
        let target = match self.target {
            Target::One(c) => Target::One(c.with_service_config(sc)?),
            Target::Set(set, wait) => Target::Set(set.with_service_config(sc)?, wait),
        };
        Ok(Channel { target })
    }

    /// Counters of this channel's retries, hedges, throttled attempts, transparent retries and
    /// commits ([`RetryStats`]).
    pub fn retry_stats(&self) -> RetryStats {
        match &self.target {
            Target::One(c) => c.retry_stats(),
            Target::Set(set, _) => set.retry_stats(),
        }
    }
}
