//! Custom metadata between HTTP headers (what tonic reads and writes) and ByteExpress
//! [`Metadata`] (what the rpc layer carries).
//!
//! - Reserved headers are the transport's own and are never carried: pseudo-headers (`:*`),
//!   `content-type`, `te`, `user-agent`, `grpc-*` (the facade handles `grpc-timeout`,
//!   `grpc-status` and `grpc-message` itself), and HTTP's connection-level headers.
//! - Keys ending in `-bin` are binary: base64 in HTTP (the gRPC spec: senders emit unpadded,
//!   receivers accept both), raw bytes in [`Metadata`].
//! - The rpc response has one metadata list, so response *trailers* travel in it under the
//!   prefix [`TRAILER_PREFIX`] and are split off again on the client.

use base64::Engine as _;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use byteexpress_rpc::{Metadata, valid_key};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

/// Prefix marking a response trailer inside the rpc response's metadata.
pub const TRAILER_PREFIX: &str = "bxt.";

/// Standard alphabet; emits no padding, accepts padded and unpadded input (gRPC spec).
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// True for the headers that gRPC over HTTP/2 reserves (`doc/PROTOCOL-HTTP2.md`): pseudo-headers,
/// `grpc-*`, and the HTTP headers `content-type`, `te`, `user-agent`, `host`, `content-length`
/// and the connection-specific ones. The facade carries every other header as custom metadata; a
/// service that copies a request's metadata onward (a proxy, an echo) leaves these out.
/// `name` is lower-case, as `http::HeaderName` holds it.
pub fn is_reserved_header(name: &str) -> bool {
    name.starts_with(':')
        || name.starts_with("grpc-")
        || matches!(
            name,
            "content-type"
                | "te"
                | "user-agent"
                | "host"
                | "content-length"
                | "connection"
                | "keep-alive"
                | "proxy-connection"
                | "transfer-encoding"
                | "upgrade"
        )
}

/// The `grpc-*` headers the facade carries as metadata although they are reserved: message
/// compression (`grpc-encoding`, `grpc-accept-encoding`, gRPC's `doc/compression.md`) and the
/// rich error details (`grpc-status-details-bin`), which tonic reads and writes itself; and
/// gRPC A6's `grpc-previous-rpc-attempts` (client → server) and `grpc-retry-pushback-ms`
/// (server → client), which the rpc crate's retries read and write.
pub(crate) fn carried_grpc_header(name: &str) -> bool {
    matches!(
        name,
        "grpc-encoding"
            | "grpc-accept-encoding"
            | "grpc-status-details-bin"
            | "grpc-previous-rpc-attempts"
            | "grpc-retry-pushback-ms"
    )
}

/// Appends the custom metadata of `headers` to `md`, each key prefixed with `prefix` (empty,
/// or [`TRAILER_PREFIX`] for trailers). Entries that cannot be carried (a `-bin` value that is
/// not base64) are dropped and logged, as gRPC implementations drop malformed metadata.
pub fn headers_to_metadata(headers: &HeaderMap, prefix: &str, md: &mut Metadata) {
    for (name, value) in headers {
        let name = name.as_str();
        if is_reserved_header(name) && !carried_grpc_header(name) {
            continue;
        }
        let value = if name.ends_with("-bin") {
            match B64.decode(value.as_bytes()) {
                Ok(v) => Bytes::from(v),
                Err(e) => {
                    tracing::debug!(name, "dropping binary metadata that is not base64: {e}");
                    continue;
                }
            }
        } else {
            Bytes::copy_from_slice(value.as_bytes())
        };
        let key = format!("{prefix}{name}");
        if let Err(e) = md.insert(key, value) {
            tracing::debug!("dropping metadata: {e}");
        }
    }
}

/// Appends the entries of `md` to HTTP headers. With `trailers: None` every entry goes to
/// `headers`; with `Some(map)`, entries under [`TRAILER_PREFIX`] go to `map` without it.
/// Reserved names and values that are not valid header values (e.g. a non-`-bin` value with
/// control bytes) are dropped and logged.
pub fn metadata_to_headers(
    md: &Metadata,
    headers: &mut HeaderMap,
    mut trailers: Option<&mut HeaderMap>,
) {
    for (key, value) in md.iter() {
        let (key, target) = match (key.strip_prefix(TRAILER_PREFIX), trailers.as_deref_mut()) {
            (Some(k), Some(t)) => (k, t),
            _ => (key, &mut *headers),
        };
        if (is_reserved_header(key) && !carried_grpc_header(key)) || !valid_key(key) {
            tracing::debug!(key, "dropping reserved or invalid metadata key");
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(key.as_bytes()) else {
            continue;
        };
        let value = if key.ends_with("-bin") {
            HeaderValue::from_maybe_shared(Bytes::from(B64.encode(value)))
        } else {
            HeaderValue::from_maybe_shared(value.clone())
        };
        match value {
            Ok(v) => {
                target.append(name, v);
            }
            Err(_) => tracing::debug!(
                key,
                "dropping metadata value that is not a valid header value"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hm(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_static(v));
        }
        m
    }

    #[test]
    fn reserved_headers_are_skipped() {
        let h = hm(&[
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("user-agent", "tonic"),
            ("grpc-timeout", "1S"),
            ("grpc-message", "x"),
            ("grpc-accept-encoding", "gzip"),
            ("x-user", "alice"),
        ]);
        let mut md = Metadata::new();
        headers_to_metadata(&h, "", &mut md);
        // compression headers are carried (issue 21); every other reserved one is not
        assert_eq!(
            md.iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<Vec<_>>(),
            vec![
                ("grpc-accept-encoding".into(), Bytes::from("gzip")),
                ("x-user".into(), Bytes::from("alice"))
            ]
        );
    }

    #[test]
    fn binary_values_are_base64_in_http_and_raw_in_metadata() {
        let raw = Bytes::from_static(&[0, 1, 2, 0xff, 0xfe]);
        let mut md = Metadata::new();
        md.insert("trace-bin", raw.clone()).unwrap();
        let mut h = HeaderMap::new();
        metadata_to_headers(&md, &mut h, None);
        assert_eq!(h.get("trace-bin").unwrap(), "AAEC//4"); // unpadded
        let mut back = Metadata::new();
        headers_to_metadata(&h, "", &mut back);
        assert_eq!(back.get("trace-bin"), Some(&raw));
        // padded input is accepted too; garbage is dropped
        let mut back = Metadata::new();
        headers_to_metadata(
            &hm(&[("a-bin", "AAEC//4="), ("b-bin", "***")]),
            "",
            &mut back,
        );
        assert_eq!(back.get("a-bin"), Some(&raw));
        assert_eq!(back.get("b-bin"), None);
    }

    #[test]
    fn trailers_travel_under_a_prefix() {
        let mut md = Metadata::new();
        headers_to_metadata(&hm(&[("x-h", "1")]), "", &mut md);
        headers_to_metadata(
            &hm(&[("x-t", "2"), ("grpc-status", "0")]),
            TRAILER_PREFIX,
            &mut md,
        );
        assert_eq!(md.get("bxt.x-t").map(|v| &v[..]), Some(&b"2"[..]));
        let (mut h, mut t) = (HeaderMap::new(), HeaderMap::new());
        metadata_to_headers(&md, &mut h, Some(&mut t));
        assert_eq!(h.get("x-h").unwrap(), "1");
        assert_eq!(t.get("x-t").unwrap(), "2");
        assert_eq!((h.len(), t.len()), (1, 1));
    }

    #[test]
    fn invalid_values_and_reserved_keys_are_dropped() {
        let mut md = Metadata::new();
        md.insert("x-bad", Bytes::from_static(b"a\nb")).unwrap();
        md.insert("te", "trailers").unwrap();
        md.insert("x-ok", "fine").unwrap();
        let mut h = HeaderMap::new();
        metadata_to_headers(&md, &mut h, None);
        assert_eq!(h.len(), 1);
        assert_eq!(h.get("x-ok").unwrap(), "fine");
    }
}
