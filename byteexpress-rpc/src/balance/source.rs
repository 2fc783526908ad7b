//! Where a [`ReplicaSet`]'s endpoints come from: a static list
//! ([`ReplicaSet::from_static`]), a DNS name re-resolved periodically through a [`Resolve`]
//! ([`ReplicaSet::from_dns`]), or any `tower::discover::Discover` stream
//! ([`ReplicaSet::from_discover`]).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tower::discover::{Change, Discover};

use super::BalanceConfig;
use super::set::{Core, ReplicaSet};
use crate::{BoxFuture, Code, Config, Status};

/// Turns a host name into addresses: the resolver a [`ReplicaSet::from_dns`] asks at each
/// re-resolution. Injectable, so that tests and other name services plug in.
pub trait Resolve: Send + Sync + 'static {
    /// Every address of `host` with `port` (each A/AAAA record one). Errors: UNAVAILABLE when
    /// the name cannot be resolved now (the set keeps its endpoints and tries again at the
    /// next period).
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<Result<Vec<SocketAddr>, Status>>;
}

/// The system resolver (`getaddrinfo` through `tokio::net::lookup_host`): every A and AAAA
/// record of the name is a replica.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<Result<Vec<SocketAddr>, Status>> {
        let target = format!("{host}:{port}");
        Box::pin(async move {
            let addrs = tokio::net::lookup_host(&target)
                .await
                .map_err(|e| Status::new(Code::Unavailable, format!("resolve {target}: {e}")))?;
            let mut seen = HashSet::new();
            Ok(addrs.filter(|a| seen.insert(*a)).collect())
        })
    }
}

/// `host:port` → (`host`, port); `[v6]:port` too.
fn split_host_port(name: &str) -> Result<(String, u16), Status> {
    let bad = || Status::new(Code::InvalidArgument, format!("{name:?} is not host:port"));
    let (host, port) = name.rsplit_once(':').ok_or_else(bad)?;
    let port = port.parse::<u16>().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

impl ReplicaSet {
    /// A set over every address `resolver` gives for `name` (`host:port`), re-resolved every
    /// [`BalanceConfig::resolve_every`]: new addresses become endpoints, vanished ones are
    /// removed (their calls in flight finish). A failed resolution keeps the endpoints as
    /// they are. Pass [`SystemResolver`] for DNS (gRPC's `dns:` resolver: every A/AAAA record
    /// is a replica). Errors: INVALID_ARGUMENT when `name` is not `host:port`.
    pub fn from_dns(
        name: &str,
        resolver: Arc<dyn Resolve>,
        cfg: &Config,
        bal: &BalanceConfig,
    ) -> Result<ReplicaSet, Status> {
        let (host, port) = split_host_port(name)?;
        let (set, core) = ReplicaSet::empty(cfg, bal);
        tokio::spawn(resolve_task(core, host, port, resolver));
        Ok(set)
    }

    /// A set fed by `discover`: each `Change::Insert(key, addr)` adds an endpoint at `addr`
    /// (`host:port`; an insert under a key already present replaces that endpoint), each
    /// `Change::Remove(key)` removes one (its calls in flight finish on its link). Any
    /// `tower::discover::Discover` works, so a Kubernetes, etcd or Consul watcher plugs in as
    /// a stream of `Result<Change<K, String>, E>`. An error from the stream is logged and the
    /// endpoints stay; when the stream ends the set keeps its last endpoints. Calls wait (or
    /// fail at their deadline) until the stream's first change.
    pub fn from_discover<D>(discover: D, cfg: &Config, bal: &BalanceConfig) -> ReplicaSet
    where
        D: Discover + Send + 'static,
        D::Key: Hash + Eq + Send + std::fmt::Debug,
        D::Service: Into<String>,
        D::Error: std::fmt::Display,
    {
        let (set, core) = ReplicaSet::empty(cfg, bal);
        tokio::spawn(discover_task(core, discover));
        set
    }
}

async fn discover_task<D>(core: Arc<Core>, discover: D)
where
    D: Discover + Send + 'static,
    D::Key: Hash + Eq + Send + std::fmt::Debug,
    D::Service: Into<String>,
    D::Error: std::fmt::Display,
{
    let mut discover = std::pin::pin!(discover);
    let mut ids: HashMap<D::Key, u64> = HashMap::new();
    loop {
        let next = tokio::select! {
            _ = core.stop.cancelled() => return,
            c = std::future::poll_fn(|cx| discover.as_mut().poll_discover(cx)) => c,
        };
        match next {
            None => {
                core.resolved.store(true, Ordering::SeqCst);
                tracing::info!(target: "byteexpress_rpc::balance", "discover stream ended; endpoints stay as they are");
                return;
            }
            Some(Err(e)) => {
                tracing::warn!(target: "byteexpress_rpc::balance", error = %e, "discover stream error; endpoints stay as they are");
            }
            Some(Ok(Change::Insert(key, svc))) => {
                if let Some(old) = ids.remove(&key) {
                    core.remove(old);
                }
                let id = core.add(svc.into());
                ids.insert(key, id);
                core.resolved.store(true, Ordering::SeqCst);
            }
            Some(Ok(Change::Remove(key))) => match ids.remove(&key) {
                Some(id) => core.remove(id),
                None => {
                    tracing::debug!(target: "byteexpress_rpc::balance", ?key, "discover removed an unknown key")
                }
            },
        }
    }
}

async fn resolve_task(core: Arc<Core>, host: String, port: u16, resolver: Arc<dyn Resolve>) {
    let period = core_period(&core);
    loop {
        let res = tokio::select! {
            _ = core.stop.cancelled() => return,
            r = resolver.resolve(&host, port) => r,
        };
        match res {
            Ok(addrs) => {
                let want: HashSet<String> = addrs.iter().map(SocketAddr::to_string).collect();
                let have = core.addrs();
                for (id, a) in &have {
                    if !want.contains(a) {
                        core.remove(*id);
                    }
                }
                let have: HashSet<String> = have.into_iter().map(|(_, a)| a).collect();
                let mut new: Vec<&String> = want.difference(&have).collect();
                new.sort();
                for a in new {
                    core.add(a.clone());
                }
                core.resolved.store(true, Ordering::SeqCst);
            }
            Err(e) => {
                tracing::warn!(target: "byteexpress_rpc::balance", host, port, error = %e, "re-resolution failed; endpoints stay as they are");
            }
        }
        tokio::select! {
            _ = core.stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

fn core_period(core: &Core) -> std::time::Duration {
    core.resolve_every()
        .max(std::time::Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_host_and_port() {
        assert_eq!(
            split_host_port("svc.local:50051").unwrap(),
            ("svc.local".into(), 50051)
        );
        assert_eq!(split_host_port("[::1]:7").unwrap(), ("::1".into(), 7));
        for bad in ["svc", ":5", "a:x", "a:70000"] {
            assert_eq!(
                split_host_port(bad).unwrap_err().code,
                Code::InvalidArgument,
                "{bad}"
            );
        }
    }
}
