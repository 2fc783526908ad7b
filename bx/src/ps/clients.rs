//! The clients of `bx ps bench`'s rows behind one Pull/Push API (`TableClient`):
//! ByteExpress through the tonic facade (`bx/rdma`, `bx/tcp`, their +tls rows), tonic over
//! HTTP/2 (`grpc/h2`), `byteexpress-rpc`'s native API without tonic (`native/rdma`,
//! `native/tcp`: the same protobuf messages as bodies of native calls), and tonic's generated
//! client calling the generated server in this process (`tonic/inproc`). The `floor/tcp` row
//! drives its connections itself ([`super::floor`]).

use std::sync::Arc;
use std::time::Duration;

use byteexpress::{
    BalanceConfig, Channel, Config, EndpointState, ReplicaSet, ServiceConfig, TransportPref,
};
use byteexpress_ps::native::{self, PULL_PATH, PUSH_PATH};
use byteexpress_ps::pb::ps::parameter_server_client::ParameterServerClient;
use byteexpress_ps::pb::ps::parameter_server_server::ParameterServerServer;
use byteexpress_ps::pb::ps::{PullRequest, PushRequest};
use byteexpress_ps::shard::{merge_rows, split_keys};
use byteexpress_ps::{PsService, Store};
use bytes::Bytes;
use tokio::time::Instant;

use super::bench::{BenchArgs, TABLE};
use super::fleet::Servers;

/// A Pull/Push client of one row's kind.
#[derive(Debug, Clone)]
pub(super) enum PsClient {
    /// tonic's generated client on the facade's [`Channel`] (ByteExpress on RDMA or TCP).
    Bx(ParameterServerClient<Channel>),
    /// tonic's generated client on its own HTTP/2 channel.
    H2(ParameterServerClient<tonic::transport::Channel>),
    /// tonic's generated client whose service is the generated server itself (a
    /// `tower::Service` over `http::Request`s): no transport, no socket, the calls encoded,
    /// framed, routed and decoded by tonic's code alone.
    Inproc(ParameterServerClient<ParameterServerServer<PsService>>),
    /// `byteexpress-rpc`'s native client: the protobuf messages as call bodies, no tonic.
    Native(byteexpress_rpc::Client),
}

/// A native call's failure as the tonic status the call loops count.
fn tonic_status(s: byteexpress_rpc::Status) -> tonic::Status {
    tonic::Status::new(tonic::Code::from(s.code as u16 as i32), s.message)
}

/// A native request: `body` to `method`, under `deadline`.
fn native_request(
    method: &str,
    body: Vec<u8>,
    deadline: Option<Duration>,
) -> byteexpress_rpc::Request {
    byteexpress_rpc::Request {
        method: method.to_string(),
        body: Bytes::from(body),
        timeout: deadline,
        ..Default::default()
    }
}

/// `msg` as a request carrying `deadline` (`grpc-timeout`).
fn request<T>(msg: T, deadline: Option<Duration>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(d) = deadline {
        req.set_timeout(d);
    }
    req
}

impl PsClient {
    async fn pull(
        &mut self,
        keys: Vec<u64>,
        deadline: Option<Duration>,
    ) -> Result<(u32, Bytes), tonic::Status> {
        let req = request(
            PullRequest {
                table: TABLE.into(),
                keys,
            },
            deadline,
        );
        let r = match self {
            PsClient::Bx(c) => c.pull(req).await?,
            PsClient::H2(c) => c.pull(req).await?,
            PsClient::Inproc(c) => c.pull(req).await?,
            PsClient::Native(c) => {
                let r = req.into_inner();
                let body = native::pull_request(&r.table, r.keys);
                let a = c
                    .call(native_request(PULL_PATH, body, deadline))
                    .await
                    .map_err(tonic_status)?;
                return native::pull_response(a.body)
                    .map_err(|e| tonic::Status::internal(format!("pull answer: {e}")));
            }
        }
        .into_inner();
        Ok((r.dim, r.values))
    }

    async fn push(
        &mut self,
        keys: Vec<u64>,
        grads: Bytes,
        deadline: Option<Duration>,
    ) -> Result<(), tonic::Status> {
        let req = request(
            PushRequest {
                table: TABLE.into(),
                keys,
                grads,
                lr: 0.01,
            },
            deadline,
        );
        match self {
            PsClient::Bx(c) => c.push(req).await.map(drop),
            PsClient::H2(c) => c.push(req).await.map(drop),
            PsClient::Inproc(c) => c.push(req).await.map(drop),
            PsClient::Native(c) => {
                let r = req.into_inner();
                let body = native::push_request(&r.table, r.keys, r.grads, r.lr);
                c.call(native_request(PUSH_PATH, body, deadline))
                    .await
                    .map(drop)
                    .map_err(tonic_status)
            }
        }
    }
}

/// Why a call failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// A (sub-)call's status, or the deadline: counted in a fleet, fatal otherwise.
    Status(tonic::Status),
    /// An answer of the wrong shape: always fatal, so broken calls are never measured.
    Malformed(String),
}

/// The table as the call loops see it: one client per shard (one shard for a single
/// server), the deadline of every call, the rows' dim.
#[derive(Debug, Clone)]
pub(super) struct TableClient {
    pub(super) shards: Vec<PsClient>,
    pub(super) deadline: Option<Duration>,
    pub(super) dim: usize,
}

impl TableClient {
    /// Runs `f` under the call's deadline (the whole call, all its sub-calls).
    async fn bounded<T>(&self, f: impl Future<Output = Result<T, Failure>>) -> Result<T, Failure> {
        match self.deadline {
            None => f.await,
            Some(d) => tokio::time::timeout(d, f).await.unwrap_or_else(|_| {
                Err(Failure::Status(tonic::Status::deadline_exceeded(format!(
                    "call deadline of {d:?}"
                ))))
            }),
        }
    }

    /// The rows of `keys` in key order (keys × dim × 4 bytes), checked for shape.
    pub(super) async fn pull(&self, keys: Vec<u64>) -> Result<Bytes, Failure> {
        let row = self.dim * 4;
        let n = keys.len();
        if let [one] = self.shards.as_slice() {
            // One server: one call, no split, no join (what a client of one server does; the
            // join's boxed futures and the split's copies cost the bench's client more than
            // some transports do per call).
            let values = self.bounded(self.pull_one(one.clone(), keys)).await?;
            return self.checked(values, n, row);
        }
        let parts = split_keys(&keys, self.shards.len() as u32);
        let calls = parts
            .iter()
            .map(|p| self.pull_one(self.shards[p.shard as usize].clone(), p.keys.clone()));
        let values = self
            .bounded(async {
                let mut answers = futures::future::try_join_all(calls).await?;
                if answers.len() == 1 {
                    return Ok(answers.pop().unwrap_or_default());
                }
                merge_rows(&parts, &answers, row)
                    .map_err(|e| Failure::Malformed(format!("pull: {e}")))
            })
            .await?;
        self.checked(values, n, row)
    }

    /// The answer of one server's Pull, its dim checked.
    async fn pull_one(&self, mut c: PsClient, keys: Vec<u64>) -> Result<Bytes, Failure> {
        let (dim, values) = c.pull(keys, self.deadline).await.map_err(Failure::Status)?;
        if dim as usize != self.dim {
            return Err(Failure::Malformed(format!(
                "pull: dim {dim}, bench dim {}",
                self.dim
            )));
        }
        Ok(values)
    }

    /// `values` if they are `n` rows of `row` bytes.
    fn checked(&self, values: Bytes, n: usize, row: usize) -> Result<Bytes, Failure> {
        if values.len() != n * row {
            return Err(Failure::Malformed(format!(
                "pull: {} bytes for {n} keys x dim {}",
                values.len(),
                self.dim
            )));
        }
        Ok(values)
    }

    /// Pushes `grads` (keys × dim × 4 bytes) for `keys`.
    pub(super) async fn push(&self, keys: Vec<u64>, grads: &Bytes) -> Result<(), Failure> {
        if let [one] = self.shards.as_slice() {
            let mut c = one.clone();
            let call = async {
                c.push(keys, grads.clone(), self.deadline)
                    .await
                    .map_err(Failure::Status)
            };
            return self.bounded(call).await;
        }
        let row = self.dim * 4;
        let parts = split_keys(&keys, self.shards.len() as u32);
        let one = parts.len() == 1;
        let calls = parts.iter().map(|p| {
            let mut c = self.shards[p.shard as usize].clone();
            let grads = if one {
                grads.clone()
            } else {
                p.gather(grads, row)
            };
            let keys = p.keys.clone();
            async move {
                c.push(keys, grads, self.deadline)
                    .await
                    .map_err(Failure::Status)
            }
        });
        self.bounded(async { futures::future::try_join_all(calls).await.map(drop) })
            .await
    }
}

/// Whether `transport` is a TLS row (`tcp+tls`, `rdma+tls`, `h2+tls`).
pub(super) fn is_tls(transport: &str) -> bool {
    transport.ends_with("+tls")
}

/// The TLS config of a ByteExpress +tls row's clients: `--tls-ca` trusted, `--tls-domain`
/// asked for. Errors: no `--tls-ca`.
fn bx_tls(args: &BenchArgs) -> Result<byteexpress::ClientTlsConfig, String> {
    let ca = args
        .tls_ca
        .as_ref()
        .ok_or("+tls rows need --tls-ca (the CA the clients trust)")?;
    Ok(byteexpress::ClientTlsConfig::new()
        .ca_certificate(byteexpress::Certificate::from_pem_file(ca))
        .domain_name(args.tls_domain.clone()))
}

/// The tonic TLS config of an h2+tls row: `--tls-ca` trusted, `--tls-domain` asked for.
/// Errors: no `--tls-ca`, or it cannot be read.
fn h2_tls(args: &BenchArgs) -> Result<tonic::transport::ClientTlsConfig, String> {
    let ca = args
        .tls_ca
        .as_ref()
        .ok_or("+tls rows need --tls-ca (the CA the clients trust)")?;
    let pem = std::fs::read(ca).map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
    Ok(tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pem))
        .domain_name(args.tls_domain.clone()))
}

/// The rpc settings of an rdma or tcp row, `max_message` raised to fit the dense pushes.
pub(super) fn bx_config(transport: &str, args: &BenchArgs) -> Config {
    let transport = if transport.starts_with("rdma") {
        TransportPref::Rdma
    } else {
        TransportPref::Tcp
    };
    let d = Config::default();
    let max_message = match args.push_max_message() {
        Ok(Some(m)) => (m as usize).max(d.max_message),
        _ => d.max_message,
    };
    Config {
        transport,
        max_message,
        busy_poll: args
            .busy_poll_us
            .map_or(d.busy_poll, std::time::Duration::from_micros),
        poll_wake_cost: args
            .poll_wake_us
            .map_or(d.poll_wake_cost, std::time::Duration::from_micros),
        ..d
    }
}

/// The channel to one shard's replicas at `addrs` for `transport`, with the replica set of
/// an rdma or tcp row: the one place where a fleet's channels are built, with the service
/// config `sc` (retries or hedging) on rdma and tcp rows.
fn shard_channel(
    transport: &str,
    args: &BenchArgs,
    addrs: &[String],
    bal: &BalanceConfig,
    sc: Option<&ServiceConfig>,
) -> Result<(PsClient, Option<ReplicaSet>), String> {
    match transport {
        "rdma" | "tcp" => {
            let uris = addrs.iter().map(|a| format!("bx://{a}"));
            let mut ch = Channel::balance_list(uris, &bx_config(transport, args), bal)
                .map_err(|e| format!("{transport}: {e}"))?;
            if let Some(sc) = sc {
                ch = ch
                    .with_service_config(sc.clone())
                    .map_err(|e| format!("{transport}: service config: {e}"))?;
            }
            let set = ch.replica_set().cloned();
            Ok((PsClient::Bx(ParameterServerClient::new(ch)), set))
        }
        "h2" => {
            let mut eps = Vec::new();
            for a in addrs {
                eps.push(
                    tonic::transport::Endpoint::from_shared(format!("http://{a}"))
                        .map_err(|e| e.to_string())?
                        .tcp_nodelay(true),
                );
            }
            let ch = tonic::transport::Channel::balance_list(eps.into_iter());
            Ok((PsClient::H2(ParameterServerClient::new(ch)), None))
        }
        other => Err(format!("unknown transport {other:?} (rdma, tcp or h2)")),
    }
}

/// Connects every endpoint of `set` now and waits (at most 30 s) until all are READY.
/// Errors, prefixed `"{transport}: "` (a row that cannot be set up): an endpoint went to
/// TRANSIENT_FAILURE, or time ran out.
async fn all_ready(set: &ReplicaSet, transport: &str) -> Result<(), String> {
    set.connect_now();
    let limit = Instant::now() + Duration::from_secs(30);
    loop {
        let changed = set.changed();
        let eps = set.endpoints();
        if let Some(e) = eps
            .iter()
            .find(|e| e.state == EndpointState::TransientFailure)
        {
            return Err(format!(
                "{transport}: --transports {transport}: replica {} failed to connect",
                e.addr
            ));
        }
        if eps.iter().all(|e| e.state == EndpointState::Ready) {
            return Ok(());
        }
        tokio::time::timeout_at(limit, changed)
            .await
            .map_err(|_| format!("{transport}: replicas not ready within 30 s"))?;
    }
}

/// Connects a fleet's table for `transport`: one channel per shard over its replicas,
/// every replica connected. Returns the table, the shards' replica sets (none for h2) and
/// the row's label.
pub(super) async fn connect_fleet(
    transport: &str,
    servers: &Servers,
    args: &BenchArgs,
) -> Result<(TableClient, Vec<ReplicaSet>, String), String> {
    let bal = BalanceConfig::default();
    let sc = args.service_config()?;
    let (mut shards, mut sets) = (Vec::new(), Vec::new());
    for replicas in &servers.shards {
        let addrs: Vec<String> = replicas.iter().map(|r| r.addr.clone()).collect();
        let (client, set) = shard_channel(transport, args, &addrs, &bal, sc.as_ref())?;
        if let Some(set) = set {
            all_ready(&set, transport).await?;
            sets.push(set);
        }
        shards.push(client);
    }
    let label = match sets.first().and_then(|s| s.endpoints().first()?.transport) {
        Some(t) => format!("bx/{t}"),
        None => "grpc/h2".into(),
    };
    let table = TableClient {
        shards,
        deadline: args.deadline(),
        dim: args.dim,
    };
    Ok((table, sets, label))
}

/// Connects `n` clients of one server for `transport` (`native` the server's native port, for
/// the native rows; a tonic/inproc row serves itself, from a store of its own in this
/// process); returns them and the negotiated transport's label.
pub(super) async fn connect(
    transport: &str,
    addr: &str,
    native: Option<&str>,
    n: usize,
    args: &BenchArgs,
) -> Result<(Vec<TableClient>, String), String> {
    let mut clients = Vec::with_capacity(n);
    let mut label = String::new();
    // the store of a tonic/inproc row, in this process, shared by its clients
    let mut inproc: Option<Arc<Store>> = None;
    for _ in 0..n.max(1) {
        let c = match transport {
            "rdma" | "tcp" | "rdma+tls" | "tcp+tls" => {
                let mut cfg = bx_config(transport, args);
                let mut scheme = "bx";
                if is_tls(transport) {
                    cfg.tls = Some(bx_tls(args)?);
                    scheme = "https";
                }
                let ch = Channel::connect_with(&format!("{scheme}://{addr}"), &cfg)
                    .await
                    .map_err(|e| format!("{transport}: --transports {transport}: {e}"))?;
                label = format!("bx/{}", ch.transport());
                if is_tls(transport) {
                    label.push_str("+tls");
                }
                PsClient::Bx(ParameterServerClient::new(ch))
            }
            "h2+tls" => {
                let ch = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
                    .map_err(|e| e.to_string())?
                    .tls_config(h2_tls(args)?)
                    .map_err(|e| format!("h2+tls: {e}"))?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .map_err(|e| format!("h2+tls: {e}"))?;
                label = "grpc/h2+tls".into();
                PsClient::H2(ParameterServerClient::new(ch))
            }
            "h2" => {
                let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|e| e.to_string())?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .map_err(|e| format!("h2: {e}"))?;
                label = "grpc/h2".into();
                PsClient::H2(ParameterServerClient::new(ch))
            }
            "native/rdma" | "native/tcp" => {
                let addr = native.ok_or_else(|| {
                    format!("{transport}: --transports {transport}: the server has no native port (a server the bench starts has)")
                })?;
                let cfg = bx_config(transport.trim_start_matches("native/"), args);
                let c = byteexpress_rpc::Client::connect(addr, &cfg)
                    .await
                    .map_err(|e| format!("{transport}: --transports {transport}: {e}"))?;
                label = format!("native/{}", c.transport());
                PsClient::Native(c)
            }
            "tonic/inproc" => {
                let store = inproc
                    .get_or_insert_with(|| Arc::new(Store::new(args.dim, &[TABLE.to_string()], 64)))
                    .clone();
                label = "tonic/inproc".into();
                PsClient::Inproc(ParameterServerClient::new(PsService::new(store).server()))
            }
            other => {
                return Err(format!(
                    "unknown transport {other:?} (rdma, tcp, h2, rdma+tls, tcp+tls, h2+tls, native/rdma, native/tcp, tonic/inproc or floor/tcp)"
                ));
            }
        };
        clients.push(TableClient {
            shards: vec![c],
            deadline: args.deadline(),
            dim: args.dim,
        });
    }
    Ok((clients, label))
}

#[cfg(test)]
mod tests {
    use byteexpress_ps::{decode_f32s, init_value};

    use super::*;

    fn args(argv: &[&str]) -> BenchArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct A {
            #[command(flatten)]
            b: BenchArgs,
        }
        A::parse_from(std::iter::once("bench").chain(argv.iter().copied())).b
    }

    /// The tonic/inproc row's clients call tonic's generated server in this process, all on
    /// one store: a push through one is what the other pulls, and the init everywhere else.
    #[tokio::test(flavor = "current_thread")]
    async fn tonic_inproc_clients_share_one_in_process_store_and_their_pushes_land() {
        let a = args(&["--dim", "4"]);
        let (clients, label) = connect("tonic/inproc", "127.0.0.1:9", None, 2, &a)
            .await
            .unwrap();
        assert_eq!((label.as_str(), clients.len()), ("tonic/inproc", 2));
        assert!(matches!(clients[0].shards[0], PsClient::Inproc(_)));
        let g = Bytes::from(
            [1.0f32, 2.0, 0.0, -1.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        clients[0].push(vec![3], &g).await.unwrap();
        let v = decode_f32s(&clients[1].pull(vec![3, 4]).await.unwrap());
        for (i, g) in [1.0f32, 2.0, 0.0, -1.0].iter().enumerate() {
            assert_eq!(v[i], init_value(TABLE, 3, i as u32) - 0.01 * g, "value {i}");
            assert_eq!(v[4 + i], init_value(TABLE, 4, i as u32));
        }
    }

    /// The native rows need the server's native port; without one they are refused with the
    /// row's name first (so the bench skips them, as an RDMA row without a device).
    #[tokio::test(flavor = "current_thread")]
    async fn a_native_row_without_a_native_port_is_refused_naming_the_row() {
        let e = connect("native/tcp", "127.0.0.1:9", None, 1, &args(&[]))
            .await
            .unwrap_err();
        assert!(e.starts_with("native/tcp: "), "{e}");
    }
}
