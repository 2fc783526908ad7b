//! [`Channel`]: what a tonic-generated client calls through to reach a ByteExpress server,
//! over RDMA or TCP, without HTTP/2.

use std::convert::Infallible;
use std::task::{Context, Poll};

use byteexpress_rpc::{Client, Code, Config, Metadata, Status, Transport};
use bytes::Bytes;

use crate::body::ReplyBody;
use crate::grpc_status::status_headers;
use crate::metadata_map::headers_to_metadata;
use crate::{BoxError, grpc_timeout};
use byteexpress_rpc::BoxFuture;

/// A ByteExpress client connection as a `tower::Service<http::Request<tonic::body::Body>>`:
/// pass it to a tonic-generated client (`XxxClient::new(channel)`).
///
/// Each call carries the request's path, its custom metadata and its gRPC-framed body
/// (untouched) as one ByteExpress call; `grpc-timeout` becomes the call's deadline, which the
/// client and the server both enforce. The response has the server's headers, its data and
/// trailers with `grpc-status: 0`; an error comes back trailers-only (`grpc-status`,
/// `grpc-message` and the error's metadata in the response headers, empty body), as gRPC
/// servers answer. The service never fails at the tower level: transport failures are
/// statuses too (UNAVAILABLE, RESOURCE_EXHAUSTED for a request above
/// [`Client::max_message`], ...). Every call is a ByteExpress stream
/// (`byteexpress_rpc::stream`; over replicas, on the endpoint the set picks): request
/// messages go as they are produced, answers arrive message by message with the status in
/// trailers after them, and dropping the response cancels the server's handler
/// (`stream_body.rs`).
///
/// Cloning is cheap and shares the connection.
///
/// A channel over a service's replicas (`connect_lazy`, `balance_list`, `from_dns`,
/// `from_replica_set`: see `replicas.rs`) balances its calls over a
/// [`ReplicaSet`](crate::ReplicaSet); its `poll_ready` is Pending while no endpoint is ready
/// (see [`Channel::wait_for_ready`] for the one exception), never an error.
#[derive(Debug, Clone)]
pub struct Channel {
    pub(crate) target: Target,
}

/// What a [`Channel`] sends its calls to.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// One address's logical connection.
    One(Client),
    /// A replica set, and the channel's wait-for-ready when set ([`Channel::wait_for_ready`];
    /// `None`: the service config's per method, else off).
    Set(byteexpress_rpc::ReplicaSet, Option<bool>),
}

impl Channel {
    /// Connects to `uri` (`bx://host:port`) with [`Config::default`], which reads
    /// `BX_TRANSPORT=auto|rdma|rdma-any|tcp`. Errors: INVALID_ARGUMENT for another scheme or a missing
    /// port, and whatever [`Client::connect`] reports (UNAVAILABLE, ...). For TLS
    /// (`https://host:port`) use [`Channel::connect_with`] with `Config::tls`.
    pub async fn connect(uri: &str) -> Result<Channel, Status> {
        Channel::connect_with(uri, &Config::default()).await
    }

    /// Connects to `uri` with `cfg` (e.g. a forced transport). `bx://host:port` is plain TCP
    /// unless `cfg.tls` (feature `tls`) holds a `ClientTlsConfig`;
    /// `https://host:port` is TLS and requires it (the CA to trust, and the domain name when
    /// it is not the URI's host): as tonic's `Endpoint` with `tls_config`. Errors:
    /// INVALID_ARGUMENT for a malformed URI or `https://` without `cfg.tls`, and whatever
    /// [`Client::connect`] reports (UNAVAILABLE for a failed TLS handshake, ...).
    pub async fn connect_with(uri: &str, cfg: &Config) -> Result<Channel, Status> {
        let addr = parse_uri(uri, cfg)?;
        Ok(Channel {
            target: Target::One(Client::connect(addr, cfg).await?),
        })
    }

    /// Wraps an rpc client (its logical connection and link).
    pub fn from_client(client: Client) -> Channel {
        Channel {
            target: Target::One(client),
        }
    }

    /// The transport this channel's link negotiated, with the local device of an RDMA link
    /// (shown as `rdma(rxe0)`, `rdma(soft0)` or `tcp`). For a channel over a replica set: that
    /// of the first ready endpoint, [`Transport::Tcp`] while none is ready (each endpoint's
    /// own is in [`ReplicaSet::endpoints`](crate::ReplicaSet::endpoints)).
    pub fn transport(&self) -> Transport {
        match &self.target {
            Target::One(c) => c.transport(),
            Target::Set(set, _) => set
                .endpoints()
                .iter()
                .find_map(|e| e.transport)
                .unwrap_or(Transport::Tcp),
        }
    }

    /// The underlying rpc client; `None` for a channel over a replica set.
    pub fn client(&self) -> Option<&Client> {
        match &self.target {
            Target::One(c) => Some(c),
            Target::Set(..) => None,
        }
    }
}

/// `bx://host:port` or `https://host:port` → `host:port`; `https://` only with TLS in
/// `cfg` ([`Channel::connect_with`]).
pub(crate) fn parse_uri<'a>(uri: &'a str, cfg: &Config) -> Result<&'a str, Status> {
    let (addr, https) = match (uri.strip_prefix("bx://"), uri.strip_prefix("https://")) {
        (Some(a), _) => (a, false),
        (None, Some(a)) => (a, true),
        (None, None) => {
            return Err(Status::new(
                Code::InvalidArgument,
                format!("{uri:?} is not a bx://host:port or https://host:port URI"),
            ));
        }
    };
    #[cfg(feature = "tls")]
    let has_tls = cfg.tls.is_some();
    #[cfg(not(feature = "tls"))]
    let has_tls = {
        let _ = cfg;
        false
    };
    if https && !has_tls {
        return Err(Status::new(
            Code::InvalidArgument,
            format!(
                "{uri:?}: https:// needs Config::tls (a ClientTlsConfig with the CA to trust; feature `tls`)"
            ),
        ));
    }
    let addr = addr.trim_end_matches('/');
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(addr),
        _ => Err(Status::new(
            Code::InvalidArgument,
            format!("{uri:?} lacks host:port"),
        )),
    }
}

impl<B> tower_service::Service<http::Request<B>> for Channel
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<ReplyBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<ReplyBody>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        match &self.target {
            Target::One(_) => Poll::Ready(Ok(())),
            Target::Set(set, wait) => set.poll_ready(cx, *wait != Some(true)).map(Ok),
        }
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let target = self.target.clone();
        Box::pin(async move {
            Ok(match round_trip(&target, req).await {
                Ok(r) => r,
                Err(status) => trailers_only(&status),
            })
        })
    }
}

/// One call: the request's parts to an rpc request, the rpc response to an HTTP response.
async fn round_trip<B>(
    target: &Target,
    req: http::Request<B>,
) -> Result<http::Response<ReplyBody>, Status>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let timeout = parts.headers.get("grpc-timeout").and_then(|v| {
        let t = grpc_timeout::parse(v.as_bytes());
        if t.is_none() {
            tracing::debug!(value = ?v, "ignoring malformed grpc-timeout");
        }
        t
    });
    let mut metadata = Metadata::new();
    headers_to_metadata(&parts.headers, "", &mut metadata);
    crate::stream_body::stream_call(
        target,
        &parts.extensions,
        parts.uri.path().to_string(),
        metadata,
        timeout,
        body,
    )
    .await
}

/// A trailers-only response carrying `status`.
fn trailers_only(status: &Status) -> http::Response<ReplyBody> {
    let mut out = http::Response::new(ReplyBody::empty());
    *out.headers_mut() = status_headers(status);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_forms() {
        let cfg = Config::default();
        assert_eq!(
            parse_uri("bx://127.0.0.1:5000", &cfg).unwrap(),
            "127.0.0.1:5000"
        );
        assert_eq!(parse_uri("bx://localhost:1/", &cfg).unwrap(), "localhost:1");
        for bad in [
            "http://a:1",
            "bx://a",
            "bx://:5",
            "bx://a:x",
            "a:1",
            "bx://a:70000",
            "https://a:1",
        ] {
            assert_eq!(
                parse_uri(bad, &cfg).unwrap_err().code,
                Code::InvalidArgument,
                "{bad}"
            );
        }
    }

    /// `https://` is TLS: accepted with a `ClientTlsConfig` in the config, refused without.
    #[cfg(feature = "tls")]
    #[test]
    fn https_uris_need_a_client_tls_config() {
        let cfg = Config {
            tls: Some(crate::ClientTlsConfig::new()),
            ..Config::default()
        };
        assert_eq!(
            parse_uri("https://localhost:7/", &cfg).unwrap(),
            "localhost:7"
        );
        let e = parse_uri("https://localhost:7", &Config::default()).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("Config::tls"), "{}", e.message);
    }
}
