//! ByteExpress facade: tonic-generated gRPC clients and services over ByteExpress (RDMA, or
//! TCP) with no HTTP/2 on that path, and standard gRPC over HTTP/2 on the same port.
//!
//! - [`Channel`], for clients: `XxxClient::new(Channel::connect("bx://host:port").await?)`.
//! - [`Server`], for services: `Server::builder().add_service(XxxServer::new(svc)).serve(addr)`;
//!   one port serves ByteExpress clients and any gRPC client (HTTP/2).
//! - [`Config`] for settings, [`Status`] and [`Code`] for errors, [`served_over`] for a service
//!   that wants to know how a call reached it, [`is_reserved_header`] for one that copies
//!   metadata onward.
//!
//! - TLS (feature `tls`, rustls with ring): `ServerBuilder::tls_config` with a
//!   `ServerTlsConfig`, [`Channel::connect_with`] with `https://` and `Config::tls`.
//!
//! The mapping follows the gRPC over HTTP/2 spec (`doc/PROTOCOL-HTTP2.md`): path, custom
//! metadata (`-bin` values base64 in HTTP, raw on ByteExpress), `grpc-timeout` as the call
//! deadline (enforced by both ends), status in trailers, errors trailers-only.
//!
//! The parameter-server workload and the echo test service are the `byteexpress-ps` crate; the
//! `bx` tool is the `bx` crate. This crate depends on neither.

mod body;
mod bx_handler;
mod bx_stream;
mod channel;
mod detect;
mod grpc_status;
mod grpc_timeout;
/// The `grpc-timeout` codec, for the `fuzz/` crate's targets only (feature `fuzzing`, off by
/// default); not a stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::grpc_timeout::{format as format_grpc_timeout, parse as parse_grpc_timeout};
}
mod metadata_map;
mod percent;
mod replicas;
mod routes;
mod server;
mod stream_body;
#[cfg(feature = "tls")]
mod tls_port;

pub use body::ReplyBody;
pub use bx_handler::{ServedOver, served_over};
/// The native client under a [`Channel`] ([`Channel::client`], [`Channel::from_client`]).
pub use byteexpress_rpc::Client;
/// A [`Channel`] over a service's replicas: the endpoint set, its sources and settings.
pub use byteexpress_rpc::balance::{
    Backoff, BalanceConfig, CallOptions, Change, Discover, EndpointInfo, EndpointState,
    FailurePercentageEjection, OutlierDetection, OutlierEvent, OutlierEventKind, Policy,
    ReplicaSet, ReplicaSetStats, Resolve, SuccessRateEjection, SystemResolver,
};
/// Retries and hedging (gRPC A6): the service config a [`Channel`] takes
/// ([`Channel::with_service_config`]), its parts and counters; [`Drain`] for a [`Server`].
pub use byteexpress_rpc::retry::{
    AttemptPolicy, HedgingPolicy, MethodConfig, MethodName, RetryPolicy, RetryThrottling,
};
/// TLS (feature `tls`): [`ServerBuilder::tls_config`] on the shared port, [`Config::tls`]
/// and `https://` URIs on a [`Channel`] (`byteexpress_rpc::tls` has the rules).
#[cfg(feature = "tls")]
pub use byteexpress_rpc::tls::{
    ALPN_BXRPC, ALPN_H2, Certificate, ClientTlsConfig, Identity, ServerTlsConfig, TlsError,
};
pub use byteexpress_rpc::{Code, Config, Metadata, SchedMode, Status, Transport, TransportPref};
pub use byteexpress_rpc::{Drain, RetryStats, ServiceConfig, ServiceConfigError};
pub use channel::Channel;
pub use metadata_map::is_reserved_header;
pub use replicas::WaitForReady;
pub use routes::{HttpRequest, HttpResponse, Routes};
pub use server::{Server, ServerBuilder};

/// Boxed error, as tower and http-body use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
