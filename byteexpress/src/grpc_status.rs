//! `grpc-status` / `grpc-message` headers and trailers-only responses (gRPC over HTTP/2 spec:
//! an error with no message is answered with headers only, `grpc-status` among them).

use byteexpress_rpc::{Code, Metadata, Status};
use http::{HeaderMap, HeaderValue};

use crate::metadata_map::{headers_to_metadata, metadata_to_headers};
use crate::percent;

/// `content-type` of every gRPC response.
pub const GRPC_CONTENT_TYPE: HeaderValue = HeaderValue::from_static("application/grpc");

/// The headers of a trailers-only response for `status`: `content-type`, `grpc-status`,
/// `grpc-message` (percent-encoded) and the status's metadata. A status whose code is `Ok`
/// (never produced by the rpc layer for an error) is reported as UNKNOWN.
pub fn status_headers(status: &Status) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
    let code = if status.code == Code::Ok {
        Code::Unknown
    } else {
        status.code
    };
    h.insert("grpc-status", HeaderValue::from(code as u16));
    if !status.message.is_empty()
        && let Ok(v) = HeaderValue::from_str(&percent::encode(&status.message))
    {
        h.insert("grpc-message", v);
    }
    metadata_to_headers(&status.metadata, &mut h, None);
    h
}

/// The `grpc-status` of `h`, when present. A value that is not a decimal number maps to
/// UNKNOWN, as gRPC clients do.
pub fn code_of(h: &HeaderMap) -> Option<Code> {
    let v = h.get("grpc-status")?;
    Some(
        std::str::from_utf8(v.as_bytes())
            .ok()
            .and_then(|s| s.parse::<u16>().ok())
            .map_or(Code::Unknown, Code::from_u16),
    )
}

/// The status carried by `h` (`grpc-status`, `grpc-message` and custom metadata), when
/// `grpc-status` is present.
pub fn status_of(h: &HeaderMap) -> Option<Status> {
    let code = code_of(h)?;
    let message = h
        .get("grpc-message")
        .map(|v| percent::decode(v.as_bytes()))
        .unwrap_or_default();
    let mut metadata = Metadata::new();
    headers_to_metadata(h, "", &mut metadata);
    Some(Status::with_metadata(code, message, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_through_headers() {
        let mut md = Metadata::new();
        md.insert("x-why", "quota").unwrap();
        md.insert("detail-bin", vec![1u8, 2, 3]).unwrap();
        let s = Status::with_metadata(Code::ResourceExhausted, "too big: 100% ✗", md);
        let h = status_headers(&s);
        assert_eq!(h.get("grpc-status").unwrap(), "8");
        assert_eq!(h.get("grpc-message").unwrap(), "too big: 100%25 %E2%9C%97");
        assert_eq!(status_of(&h), Some(s));
    }

    #[test]
    fn odd_codes() {
        let mut h = HeaderMap::new();
        assert_eq!(code_of(&h), None);
        h.insert("grpc-status", HeaderValue::from_static("banana"));
        assert_eq!(code_of(&h), Some(Code::Unknown));
        h.insert("grpc-status", HeaderValue::from_static("99"));
        assert_eq!(code_of(&h), Some(Code::Unknown));
        assert_eq!(
            status_headers(&Status::new(Code::Ok, ""))
                .get("grpc-status")
                .unwrap(),
            "2"
        );
    }
}
