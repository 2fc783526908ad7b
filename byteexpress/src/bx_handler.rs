//! The ByteExpress side of the [`crate::Server`]: each rpc call becomes an `http::Request` for
//! the tonic service its path names, and the service's response (headers, data frames,
//! trailers) becomes the rpc response or status.

use byteexpress_rpc::{Code, Metadata, Response, ServerRequest, Status, Transport};
use http::HeaderMap;
use http_body_util::{BodyExt, Full};

use crate::grpc_status::{GRPC_CONTENT_TYPE, status_of};
use crate::grpc_timeout;
use crate::metadata_map::{TRAILER_PREFIX, headers_to_metadata, metadata_to_headers};
use crate::routes::Routes;

/// How a call reached the service: put in the request's extensions by the [`crate::Server`]
/// on the ByteExpress path (tonic hands extensions on to `tonic::Request::extensions`); absent
/// on the HTTP/2 path. See [`served_over`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedOver(pub Transport);

/// The protocol a tonic request came over: `"rdma"` or `"tcp"` for ByteExpress, `"h2"` for
/// standard gRPC over HTTP/2.
pub fn served_over<T>(req: &tonic::Request<T>) -> &'static str {
    match req.extensions().get::<ServedOver>() {
        Some(ServedOver(Transport::Rdma { .. })) => "rdma",
        Some(ServedOver(Transport::Tcp | Transport::TcpFallback { .. })) => "tcp",
        None => "h2",
    }
}

/// Serves one rpc call with `routes`. The request keeps the rpc body (gRPC-framed) untouched;
/// the remaining deadline is passed on as `grpc-timeout`. Errors: the service's status
/// (trailers-only or in the trailers); INTERNAL when the response lacks `grpc-status`.
pub async fn serve_call(routes: Routes, mut req: ServerRequest) -> Result<Response, Status> {
    let t0 = std::time::Instant::now();
    let method = std::mem::take(&mut req.method);
    let res = serve_call_once(routes, &method, req).await;
    let code = res.as_ref().map_or_else(|s| s.code, |_| Code::Ok);
    record_server_call(&method, code, t0.elapsed());
    res
}

/// Records a call the server finished in the call metrics (side `server`). A path no service
/// answered is `unknown`: a peer cannot grow the label set.
pub(crate) fn record_server_call(method: &str, code: Code, elapsed: std::time::Duration) {
    let method = if code == Code::Unimplemented {
        "unknown"
    } else {
        method
    };
    byteexpress_rpc::metrics::record_call(
        byteexpress_rpc::metrics::Side::Server,
        method,
        code,
        elapsed,
    );
}

/// The `http::Request` a ByteExpress call or stream becomes for the tonic service its
/// `method` path names: POST over "HTTP/2", gRPC content type, `te: trailers`, the time left
/// of `deadline` as `grpc-timeout`, the custom `metadata` as headers, and which transport it
/// came over ([`served_over`]). Errors: UNIMPLEMENTED for a malformed path.
pub(crate) fn service_request(
    method: &str,
    deadline: Option<tokio::time::Instant>,
    metadata: &Metadata,
    transport: Transport,
    body: tonic::body::Body,
) -> Result<http::Request<tonic::body::Body>, Status> {
    let uri: http::Uri = method.parse().map_err(|_| {
        Status::new(
            Code::Unimplemented,
            format!("malformed method path {method:?}"),
        )
    })?;
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
    headers.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(tokio::time::Instant::now());
        if let Ok(v) = http::HeaderValue::from_str(&grpc_timeout::format(left)) {
            headers.insert("grpc-timeout", v);
        }
    }
    metadata_to_headers(metadata, &mut headers, None);
    let mut hreq = http::Request::new(body);
    *hreq.method_mut() = http::Method::POST;
    *hreq.uri_mut() = uri;
    *hreq.version_mut() = http::Version::HTTP_2;
    *hreq.headers_mut() = headers;
    hreq.extensions_mut().insert(ServedOver(transport));
    Ok(hreq)
}

/// `req` without its method, which is `method`.
async fn serve_call_once(
    routes: Routes,
    method: &str,
    req: ServerRequest,
) -> Result<Response, Status> {
    let hreq = service_request(
        method,
        req.deadline,
        &req.metadata,
        req.transport,
        tonic::body::Body::new(Full::new(req.body)),
    )?;
    let (parts, body) = routes.dispatch(hreq).await.into_parts();
    if let Some(status) = status_of(&parts.headers) {
        // trailers-only: the status is in the headers and the body is empty
        return if status.code == Code::Ok {
            Ok(Response {
                metadata: status.metadata,
                body: Default::default(),
            })
        } else {
            Err(status)
        };
    }
    let collected = body
        .collect()
        .await
        .map_err(|s| Status::new(Code::from_u16(s.code() as u16), s.message()))?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let data = collected.to_bytes();
    let mut metadata = Metadata::new();
    headers_to_metadata(&parts.headers, "", &mut metadata);
    match status_of(&trailers) {
        None => Err(Status::new(
            Code::Internal,
            "the service's response has no grpc-status",
        )),
        Some(s) if s.code != Code::Ok => {
            for (k, v) in s.metadata.iter() {
                let _ = metadata.insert(k, v.clone());
            }
            Err(Status::with_metadata(s.code, s.message, metadata))
        }
        Some(_) => {
            headers_to_metadata(&trailers, TRAILER_PREFIX, &mut metadata);
            Ok(Response {
                metadata,
                body: data,
            })
        }
    }
}
