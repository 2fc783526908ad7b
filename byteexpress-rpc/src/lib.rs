//! ByteExpress RPC: unary calls between processes over RDMA (any `byteexpress-verbs` device) or
//! TCP, behind one API.
//!
//! - A **link** joins this process to a peer address: one TCP connection (set-up, then control
//!   channel or the transport itself) and, when a local device reaches the peer, one RC QP.
//!   Many logical connections ([`Client`]s) share it, each with its own `conn_id` in every
//!   message header (the wire header of `DESIGN.md`).
//! - Transport choice: `BX_TRANSPORT=auto|rdma|rdma-any|tcp` ([`Config::transport`],
//!   [`Config::allow_soft`]); auto takes the first local device that reaches the peer (hardware
//!   before the soft device), else TCP; rdma takes hardware where the host has it. Every client
//!   reports what it negotiated, device included ([`Client::transport`]: `rdma(rxe0)`).
//! - Link and call events go to the `metrics` facade under the names of [`metrics`].
//! - On RDMA, receiver credits (`byteexpress-flow`) keep every SEND matched by a posted receive;
//!   messages larger than a chunk ([`Config::max_chunk`]) go as several SENDs, ordered among
//!   logical connections by a fair scheduler and capped by a software window
//!   ([`Config::window_bytes`]); single-chunk bodies reach the application as slices of
//!   registered receive buffers (zero copy). [`Client::link_stats`] counts what happened.
//! - Calls carry gRPC status codes, metadata and a deadline that both sides enforce; a client
//!   that gives up cancels the server's handler.
//! - Streams ([`stream`]): client, server and bidirectional streaming with gRPC's rules
//!   (headers, messages in order both ways at once, half-close, trailers after the messages,
//!   cancellation, a deadline on the whole stream) and a per-stream window in bytes granted by
//!   the receiver, as HTTP/2's WINDOW_UPDATE ([`Config::stream_window`]).
//!
//! - Retries and hedging with gRPC A6's semantics ([`retry`]): a [`ServiceConfig`] attached to
//!   a [`Client`] or [`ReplicaSet`] retries or hedges calls and streams as its policies say; a
//!   call runs twice only when it never left the client, when a server refused it before
//!   dispatch (marked on the wire; a draining server does that: [`Drain`]), or when its
//!   policy allows (the full rule is in [`retry`]).
//!
//! - TLS (feature `tls`, rustls with ring): the `tls` module, `Config::tls` for clients,
//!   `Server::with_tls` for servers; it covers the TCP connection (set-up, the TCP path,
//!   an RDMA link's control connection), not RDMA messages.
//!
//! Design: the ByteExpress preprint's transport under an RPC framework; the repository's
//! `DESIGN.md` describes the layering and the wire protocol byte by byte.

pub mod accept;
pub mod balance;
mod budget;
mod client;
mod config;
mod config_check;
mod engine;
mod error;
// The private decoders, for the `fuzz/` crate's targets only (feature `fuzzing`, off by default).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod link_io;
mod link_state;
#[cfg(test)]
mod link_state_table;
mod link_stats;
mod message;
mod metadata;
pub mod metrics;
pub mod retry;
mod server;
mod setup;
mod status;
pub mod stream;
#[cfg(feature = "tls")]
pub mod tls;
// The wire protocol is this crate's own business: outside it, only [`CONN_MAGIC`] is public
// (re-exported below). The `test-hooks` feature opens the whole module to tests that speak the
// protocol by hand (hostile-peer and limit tests in integration-tests).
#[cfg(feature = "test-hooks")]
pub mod wire;
#[cfg(not(feature = "test-hooks"))]
mod wire;

#[cfg(feature = "test-hooks")]
pub mod test_hooks;
#[cfg(not(feature = "test-hooks"))]
mod test_hooks;

pub use balance::{BalanceConfig, CallOptions, Policy, ReplicaSet};
pub use byteexpress_verbs::QpState;
pub use client::{Client, Request, Response};
pub use config::{
    Config, DEFAULT_RENDEZVOUS_THRESHOLD, SchedMode, parse_transport, transport_from_env,
};
pub use config_check::ConfigError;
pub use link_io::LinkStream;
pub use link_state::LinkState;
pub use link_stats::{GateRefusals, LinkStats};
pub use metadata::{Metadata, valid_key};
pub use retry::{RetryStats, ServiceConfig, ServiceConfigError};
pub use server::{BoxFuture, Drain, Server, ServerRequest, Service};
pub use status::{Code, Status};
#[cfg(feature = "tls")]
pub use tls::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig, TlsError};
pub use wire::hello::TransportPref;

/// The first 8 bytes a ByteExpress client sends on its TCP connection (`"BXRPC"`, 0, 0, the
/// protocol version). Public for servers that share one port with other protocols: the
/// `byteexpress` facade reads a connection's first bytes and serves HTTP/2 unless they are
/// these. The wire protocol itself (header, HELLO) is private to this crate; `DESIGN.md`
/// documents it byte by byte.
pub use wire::CONN_MAGIC;

/// The transport a link runs on, with the local device of an RDMA link. Shown as
/// `rdma(<device>)` (`rdma(rxe0)`, `rdma(mlx5_0)`, `rdma(soft0)` for the userspace soft
/// device), `tcp`, or `tcp(fallback)` for an RDMA link whose QP failed and which runs on its
/// TCP control connection until a re-probe takes RDMA back ([`LinkState::FallbackTcp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// An RC QP on the named local verbs device (hardware, kernel Soft-RoCE, or `soft0`).
    Rdma {
        /// The local device's name, as `bx devices` lists it.
        device: &'static str,
    },
    /// Frames on the kernel TCP connection.
    Tcp,
    /// An RDMA link in fallback: its QP on the named device failed, and messages go as
    /// frames on the link's TCP control connection. Shown as `tcp(fallback)`.
    TcpFallback {
        /// The local device of the QP that failed.
        device: &'static str,
    },
}

impl Transport {
    /// `"rdma"` or `"tcp"`, without the device.
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Rdma { .. } => "rdma",
            Transport::Tcp | Transport::TcpFallback { .. } => "tcp",
        }
    }

    /// The local device of an RDMA link; `None` on TCP (in fallback too).
    pub fn device(&self) -> Option<&'static str> {
        match self {
            Transport::Rdma { device } => Some(device),
            Transport::Tcp | Transport::TcpFallback { .. } => None,
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Rdma { device } => write!(f, "rdma({device})"),
            Transport::Tcp => f.write_str("tcp"),
            Transport::TcpFallback { .. } => f.write_str("tcp(fallback)"),
        }
    }
}
