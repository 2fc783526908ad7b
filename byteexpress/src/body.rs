//! The response body the [`crate::Channel`] hands to tonic: at most one data frame (the
//! gRPC-framed message bytes as the server sent them), then the trailers.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Frame, SizeHint};

/// An [`http_body::Body`] of one data frame and optional trailers; never fails.
#[derive(Debug, Default)]
pub struct ReplyBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    /// A streamed answer's frames ([`crate::stream_body`]), after `data`.
    rest: Option<crate::stream_body::StreamRest>,
}

impl ReplyBody {
    /// A body yielding `data` (skipped when empty), then `trailers` (when given).
    pub fn new(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        ReplyBody {
            data: (!data.is_empty()).then_some(data),
            trailers,
            rest: None,
        }
    }

    /// A body yielding a stream's messages as they arrive, then its trailers.
    pub(crate) fn streamed(rest: crate::stream_body::StreamRest) -> Self {
        ReplyBody {
            data: None,
            trailers: None,
            rest: Some(rest),
        }
    }

    /// A body with no frames: the body of a trailers-only response.
    pub fn empty() -> Self {
        ReplyBody::default()
    }
}

impl http_body::Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(d) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        if let Some(rest) = &mut this.rest {
            return match rest.poll_frame(cx) {
                Poll::Ready(None) => {
                    this.rest = None;
                    Poll::Ready(None)
                }
                p => p.map(|f| f.map(Ok)),
            };
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none() && self.rest.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.rest.is_some() {
            return SizeHint::default();
        }
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn yields_data_then_trailers() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", "0".parse().unwrap());
        let c = ReplyBody::new(Bytes::from_static(b"abc"), Some(t))
            .collect()
            .await
            .unwrap();
        assert_eq!(c.trailers().unwrap().get("grpc-status").unwrap(), "0");
        assert_eq!(c.to_bytes(), Bytes::from_static(b"abc"));
        assert!(http_body::Body::is_end_stream(&ReplyBody::empty()));
    }
}
