//! The [`crate::Channel`]'s calls as ByteExpress streams: the request body's data frames go out
//! as they come (each one stream message), the answer's initial metadata comes back as the HTTP
//! response headers as soon as the server sends it, each message as a data frame, and the
//! status and trailers as HTTP trailers after them (gRPC's `doc/PROTOCOL-HTTP2.md`: Response →
//! Response-Headers *Length-Prefixed-Message Trailers). A call whose request body is complete
//! at once and whose answer is one message goes as two frames (STREAM_OPEN with the message and
//! the half-close, RESPONSE with the message and trailers), as a unary call.

use std::pin::Pin;
use std::task::{Context, Poll};

use byteexpress_rpc::stream::{OpenStream, ResponseReceiver};
use byteexpress_rpc::{CallOptions, Code, Metadata, Status};
use bytes::Bytes;
use futures::FutureExt;
use futures::stream::BoxStream;
use http::HeaderMap;
use http_body::Frame;
use http_body_util::BodyExt;

use crate::body::ReplyBody;
use crate::channel::Target;
use crate::grpc_status::{GRPC_CONTENT_TYPE, status_headers};
use crate::metadata_map::metadata_to_headers;
use crate::{BoxError, WaitForReady};

/// The rest of a streamed answer: data frames, then trailers (see [`ReplyBody`]).
pub struct StreamRest {
    frames: std::sync::Mutex<BoxStream<'static, Frame<Bytes>>>,
}

impl std::fmt::Debug for StreamRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamRest")
    }
}

impl StreamRest {
    pub(crate) fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame<Bytes>>> {
        let frames = self.frames.get_mut().unwrap_or_else(|p| p.into_inner());
        futures::Stream::poll_next(Pin::new(frames), cx)
    }
}

/// Trailers of a stream that ended with `end`.
fn trailers_of(end: Result<Metadata, Status>) -> HeaderMap {
    match end {
        Ok(md) => {
            let mut t = HeaderMap::new();
            t.insert("grpc-status", http::HeaderValue::from_static("0"));
            let mut plain = HeaderMap::new();
            metadata_to_headers(&md, &mut plain, Some(&mut t));
            t.extend(plain);
            t
        }
        Err(s) => {
            let mut t = status_headers(&s);
            t.remove(http::header::CONTENT_TYPE);
            t
        }
    }
}

/// One call of a channel as a stream (over a replica set: on the endpoint it picks).
pub(crate) async fn stream_call<B>(
    target: &Target,
    ext: &http::Extensions,
    method: String,
    metadata: Metadata,
    timeout: Option<std::time::Duration>,
    body: B,
) -> Result<http::Response<ReplyBody>, Status>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let read_err = |e: B::Error| {
        let e: BoxError = e.into();
        Status::new(Code::Internal, format!("reading the request body: {e}"))
    };
    // A request already complete (a unary or server-streaming call) goes in the opening frame.
    let mut first = None;
    let mut half_close = false;
    let mut stash: Option<Bytes> = None;
    match body.frame().now_or_never() {
        Some(None) => half_close = true,
        Some(Some(Err(e))) => return Err(read_err(e)),
        Some(Some(Ok(f))) => {
            if let Ok(d) = f.into_data() {
                first = Some(d);
                // the body may have ended already
                if body.is_end_stream() {
                    half_close = true;
                } else {
                    match body.frame().now_or_never() {
                        Some(None) => half_close = true,
                        Some(Some(Ok(f))) => stash = f.into_data().ok(),
                        Some(Some(Err(e))) => return Err(read_err(e)),
                        None => {}
                    }
                }
            } else {
                half_close = true;
            }
        }
        None => {}
    }
    let open = OpenStream {
        method,
        metadata,
        timeout,
        first,
        half_close,
    };
    let (mut tx, mut rx) = match target {
        Target::One(client) => client.open_stream(open).await?,
        Target::Set(set, wait) => {
            let wait_for_ready = ext.get::<WaitForReady>().map(|w| w.0).or(*wait);
            set.open_stream_with(open, CallOptions { wait_for_ready })
                .await?
        }
    };
    if !half_close {
        tokio::spawn(async move {
            if let Some(d) = stash
                && tx.send(d).await.is_err()
            {
                return;
            }
            loop {
                // owned data only across the send's await (the body's error need not be Send)
                let data: Result<Option<Bytes>, Option<BoxError>> = {
                    let frame = tokio::select! {
                        () = tx.closed() => return,
                        f = body.frame() => f,
                    };
                    match frame {
                        Some(Ok(f)) => Ok(f.into_data().ok()),
                        Some(Err(e)) => Err(Some(e.into())),
                        None => Err(None),
                    }
                };
                let data = match data {
                    Ok(d) => d,
                    Err(e) => {
                        if let Some(e) = e {
                            tracing::debug!("request body failed: {e}; half-closing");
                        }
                        break;
                    }
                };
                if let Some(d) = data
                    && tx.send(d).await.is_err()
                {
                    return;
                }
            }
            let _ = tx.finish();
        });
    } else {
        drop(tx);
    }
    let headers_md = rx.headers().await?;
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
    let mut early: Vec<Bytes> = Vec::new();
    if !rx.headers_sent() {
        // No initial metadata frame: a unary answer (its headers ride in the trailers'
        // metadata, unprefixed) or an error alone, read whole. A server that sends a second
        // message without headers (a native handler that never sent any, or a broken peer) is
        // streamed from there on with empty headers: at most two messages are held here.
        let mut end = None;
        while end.is_none() && early.len() < 2 {
            match rx.message().await {
                Ok(Some(m)) => early.push(m),
                Ok(None) => end = Some(Ok(rx.trailers().unwrap_or_default())),
                Err(s) => end = Some(Err(s)),
            }
        }
        if let Some(end) = end {
            let data: Bytes = early.pop().unwrap_or_default();
            return unary_answer(headers, data, end);
        }
    }
    metadata_to_headers(&headers_md, &mut headers, None);
    let frames = futures::StreamExt::chain(
        futures::stream::iter(early.into_iter().map(Frame::data)),
        futures::stream::unfold(Some(rx), |rx| async move {
            let mut rx: ResponseReceiver = rx?;
            match rx.message().await {
                Ok(Some(m)) => Some((Frame::data(m), Some(rx))),
                Ok(None) => {
                    let t = trailers_of(Ok(rx.trailers().unwrap_or_default()));
                    Some((Frame::trailers(t), None))
                }
                Err(s) => Some((Frame::trailers(trailers_of(Err(s))), None)),
            }
        }),
    );
    let mut out = http::Response::new(ReplyBody::streamed(StreamRest {
        frames: std::sync::Mutex::new(Box::pin(frames)),
    }));
    *out.headers_mut() = headers;
    Ok(out)
}

/// The answer of a stream that ended with at most one message and no initial metadata frame.
fn unary_answer(
    mut headers: HeaderMap,
    data: Bytes,
    end: Result<Metadata, Status>,
) -> Result<http::Response<ReplyBody>, Status> {
    {
        match end {
            Err(s) if data.is_empty() => Err(s),
            end => {
                let mut trailers = HeaderMap::new();
                if let Ok(md) = &end {
                    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                    metadata_to_headers(md, &mut headers, Some(&mut trailers));
                } else {
                    trailers = trailers_of(end);
                }
                let mut out = http::Response::new(ReplyBody::new(data, Some(trailers)));
                *out.headers_mut() = headers;
                Ok(out)
            }
        }
    }
}
