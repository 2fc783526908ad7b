//! The ByteExpress side of the [`crate::Server`] for streams: each stream becomes an
//! `http::Request` whose body yields the client's messages as they arrive, for the tonic
//! service its path names; the service's response headers, data frames and trailers go back as
//! the stream's initial metadata, messages and trailers (gRPC's `doc/PROTOCOL-HTTP2.md`).
//! Dropping the handler (client cancel, deadline, link gone) drops the service's response body
//! and so its handler's stream.

use byteexpress_rpc::stream::{RequestReceiver, ResponseSender, StreamRequest};
use byteexpress_rpc::{Code, Metadata, Status};
use futures::FutureExt;
use http::HeaderMap;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use crate::bx_handler::{record_server_call, service_request};
use crate::grpc_status::{code_of, status_of};
use crate::metadata_map::{TRAILER_PREFIX, headers_to_metadata};
use crate::routes::Routes;

/// Serves one stream with `routes`. Returns the trailers (custom trailer metadata under
/// [`TRAILER_PREFIX`], and the response headers unprefixed when no headers frame was sent) or
/// the status the service ended with. The outcome is recorded in the call metrics (side
/// `server`; CANCELLED when the handler is dropped first: client cancel, deadline, link gone).
pub async fn serve_stream(
    routes: Routes,
    mut req: StreamRequest,
    rx: RequestReceiver,
    tx: ResponseSender,
) -> Result<Metadata, Status> {
    let mut metric = CallMetric {
        method: std::mem::take(&mut req.method),
        t0: std::time::Instant::now(),
        code: Code::Cancelled,
    };
    let res = serve_stream_once(routes, &metric.method, req, rx, tx).await;
    metric.code = res.as_ref().map_or_else(|s| s.code, |_| Code::Ok);
    res
}

/// One call's entry in the call metrics, recorded when dropped (so a handler dropped midway
/// counts as CANCELLED).
struct CallMetric {
    method: String,
    t0: std::time::Instant,
    code: Code,
}

impl Drop for CallMetric {
    fn drop(&mut self) {
        record_server_call(&self.method, self.code, self.t0.elapsed());
    }
}

/// `req` without its method, which is `method`.
async fn serve_stream_once(
    routes: Routes,
    method: &str,
    req: StreamRequest,
    rx: RequestReceiver,
    mut tx: ResponseSender,
) -> Result<Metadata, Status> {
    let frames = futures::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.message().await {
            Ok(Some(m)) => Some((Ok::<_, tonic::Status>(Frame::data(m)), Some(rx))),
            Ok(None) => None,
            Err(s) => {
                // The stream's status, its typed cause kept as the tonic status's source.
                let mut t =
                    tonic::Status::new(tonic::Code::from_i32(s.code as i32), s.message.clone());
                t.set_source(std::sync::Arc::new(s));
                Some((Err(t), None))
            }
        }
    });
    let hreq = service_request(
        method,
        req.deadline,
        &req.metadata,
        req.transport,
        tonic::body::Body::new(StreamBody::new(frames)),
    )?;

    let (parts, mut body) = routes.dispatch(hreq).await.into_parts();
    if let Some(status) = status_of(&parts.headers) {
        // trailers-only
        return if status.code == Code::Ok {
            Ok(status.metadata)
        } else {
            Err(status)
        };
    }
    let mut head_md = Metadata::new();
    headers_to_metadata(&parts.headers, "", &mut head_md);
    let body_err = |s: tonic::Status| Status::new(Code::from_u16(s.code() as u16), s.message());
    let mut peeked = None;
    loop {
        let frame = match peeked.take() {
            Some(f) => f,
            None => match body.frame().now_or_never() {
                Some(f) => f,
                None => {
                    tx.send_headers(&head_md)?;
                    body.frame().await
                }
            },
        };
        let frame = match frame {
            None => {
                return Err(Status::new(
                    Code::Internal,
                    "the service's response has no grpc-status",
                ));
            }
            Some(Err(e)) => return Err(body_err(e)),
            Some(Ok(f)) => f,
        };
        match frame.into_data() {
            Ok(data) => {
                let next = body.frame().now_or_never();
                if !tx.headers_sent()
                    && let Some(Some(Ok(f))) = &next
                    && let Some(t) = f.trailers_ref()
                    && code_of(t) == Some(Code::Ok)
                {
                    // one message then OK: one frame with the trailers, as a unary answer
                    tx.send_last(data);
                    return finish(t, &head_md, false);
                }
                tx.send_headers(&head_md)?;
                tx.send(data).await?;
                peeked = next;
            }
            Err(f) => {
                let t = f.into_trailers().unwrap_or_default();
                let sent = tx.headers_sent();
                return finish(&t, &head_md, sent);
            }
        }
    }
}

/// The end of a stream from the service's trailers `t`.
fn finish(t: &HeaderMap, head_md: &Metadata, headers_sent: bool) -> Result<Metadata, Status> {
    let mut md = Metadata::new();
    if !headers_sent {
        for (k, v) in head_md.iter() {
            let _ = md.insert(k, v.clone());
        }
    }
    match status_of(t) {
        None => Err(Status::new(
            Code::Internal,
            "the service's response has no grpc-status",
        )),
        Some(s) if s.code != Code::Ok => {
            for (k, v) in s.metadata.iter() {
                let _ = md.insert(k, v.clone());
            }
            Err(Status::with_metadata(s.code, s.message, md))
        }
        Some(_) => {
            headers_to_metadata(t, TRAILER_PREFIX, &mut md);
            Ok(md)
        }
    }
}
