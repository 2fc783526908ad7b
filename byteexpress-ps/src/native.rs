//! The `ps.ParameterServer` service without tonic: the same Pull and Push on the same
//! [`Store`], with the same protobuf messages (`proto/ps.proto`, encoded by prost, without
//! gRPC's 5-byte message prefix), for transports that carry bytes and a method themselves:
//! `byteexpress-rpc`'s native API ([`native_service`]) and the bench's plain TCP floor
//! (`bx ps bench --transports floor/tcp`). What these rows cost beside the tonic rows is what
//! tonic's own code costs.

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use crate::pb::ps::{PullRequest, PullResponse, PushRequest, PushResponse};
use crate::store::{PsError, Store};

/// The method path of Pull, as gRPC names it.
pub const PULL_PATH: &str = "/ps.ParameterServer/Pull";
/// The method path of Push.
pub const PUSH_PATH: &str = "/ps.ParameterServer/Push";

/// A method of the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `Pull(PullRequest) returns (PullResponse)`.
    Pull,
    /// `Push(PushRequest) returns (PushResponse)`.
    Push,
}

impl Method {
    /// The gRPC method path.
    pub fn path(self) -> &'static str {
        match self {
            Method::Pull => PULL_PATH,
            Method::Push => PUSH_PATH,
        }
    }

    /// The method of a gRPC path; `None` for another.
    pub fn from_path(path: &str) -> Option<Method> {
        match path {
            PULL_PATH => Some(Method::Pull),
            PUSH_PATH => Some(Method::Push),
            _ => None,
        }
    }
}

/// Why a call got no answer (gRPC INVALID_ARGUMENT for both).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerError {
    /// The request is not the method's protobuf message.
    #[error("request does not decode: {0}")]
    Decode(#[source] prost::DecodeError),
    /// The store refused it.
    #[error("{0}")]
    Store(#[source] PsError),
}

/// Answers one encoded request of `method` on `store`: the encoded `PullResponse` (dim and the
/// rows, keys × dim × 4 bytes) or the empty `PushResponse`. Errors: [`AnswerError`].
pub fn answer(store: &Store, method: Method, body: Bytes) -> Result<Vec<u8>, AnswerError> {
    let mut out = Vec::new();
    answer_into(store, method, body, &mut out)?;
    Ok(out)
}

/// [`answer`] appending the encoded answer to `out`. A `PullResponse` is written field by
/// field with prost's encoding functions, the rows gathered straight into `out`
/// ([`Store::pull_into`]): the bytes prost's `encode` gives, without a copy of the rows. On an
/// error `out` is as it was.
pub fn answer_into(
    store: &Store,
    method: Method,
    body: Bytes,
    out: &mut Vec<u8>,
) -> Result<(), AnswerError> {
    match method {
        Method::Pull => {
            let r = PullRequest::decode(body).map_err(AnswerError::Decode)?;
            let start = out.len();
            let dim = store.dim() as u32;
            let len = r.keys.len() * store.dim() * 4;
            // proto3: fields at their default value are not written
            if dim != 0 {
                prost::encoding::uint32::encode(1, &dim, out);
            }
            if len != 0 {
                prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, out);
                prost::encoding::encode_varint(len as u64, out);
            }
            store.pull_into(&r.table, &r.keys, out).map_err(|e| {
                out.truncate(start);
                AnswerError::Store(e)
            })
        }
        Method::Push => {
            let r = PushRequest::decode(body).map_err(AnswerError::Decode)?;
            store
                .push(&r.table, &r.keys, &r.grads, r.lr)
                .map_err(AnswerError::Store)?;
            PushResponse {}.encode(out).expect("a Vec grows as needed");
            Ok(())
        }
    }
}

/// The service on `byteexpress-rpc`'s native API ([`byteexpress_rpc::Server::new`]): the
/// handler decodes, runs the store and encodes in the link's call, no tonic in between.
/// Errors to the client: UNIMPLEMENTED for another method, INVALID_ARGUMENT for what
/// [`answer`] refuses.
pub fn native_service(store: Arc<Store>) -> impl byteexpress_rpc::Service {
    move |req: byteexpress_rpc::ServerRequest| {
        let store = store.clone();
        async move {
            let method = Method::from_path(&req.method).ok_or_else(|| {
                byteexpress_rpc::Status::new(
                    byteexpress_rpc::Code::Unimplemented,
                    format!("no method {}", req.method),
                )
            })?;
            let body = answer(&store, method, req.body).map_err(|e| {
                byteexpress_rpc::Status::new(byteexpress_rpc::Code::InvalidArgument, e.to_string())
            })?;
            Ok(byteexpress_rpc::Response {
                body: Bytes::from(body),
                ..Default::default()
            })
        }
    }
}

/// An encoded `PullRequest` for `keys` of `table`.
pub fn pull_request(table: &str, keys: Vec<u64>) -> Vec<u8> {
    PullRequest {
        table: table.to_string(),
        keys,
    }
    .encode_to_vec()
}

/// An encoded `PushRequest`: `grads` (keys × dim × 4 bytes) for `keys`, learning rate `lr`.
pub fn push_request(table: &str, keys: Vec<u64>, grads: Bytes, lr: f32) -> Vec<u8> {
    PushRequest {
        table: table.to_string(),
        keys,
        grads,
        lr,
    }
    .encode_to_vec()
}

/// The dim and rows of an encoded `PullResponse` (the rows a slice of `body`, no copy).
/// Errors: it does not decode.
pub fn pull_response(body: Bytes) -> Result<(u32, Bytes), prost::DecodeError> {
    PullResponse::decode(body).map(|r| (r.dim, r.values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init_value;
    use crate::store::decode_f32s;

    #[test]
    fn answers_pull_and_push_in_protobuf_and_refuses_bad_requests() {
        let s = Store::new(2, &["emb".to_string()], 1);
        let grads = Bytes::from(
            [1.0f32, 0.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let push = push_request("emb", vec![4], grads, 0.5);
        let r = answer(&s, Method::Push, Bytes::from(push)).unwrap();
        assert!(r.is_empty(), "PushResponse has no field");
        let r = answer(
            &s,
            Method::Pull,
            Bytes::from(pull_request("emb", vec![4, 9])),
        )
        .unwrap();
        let (dim, values) = pull_response(Bytes::from(r.clone())).unwrap();
        assert_eq!(dim, 2);
        // byte for byte what prost encodes
        let want = PullResponse {
            dim,
            values: values.clone(),
        };
        assert_eq!(r, want.encode_to_vec());
        let mut out = b"kept".to_vec();
        assert!(
            answer_into(
                &s,
                Method::Pull,
                Bytes::from(pull_request("nope", vec![1])),
                &mut out
            )
            .is_err()
        );
        assert_eq!(out, b"kept", "a refused pull leaves the buffer as it was");
        assert_eq!(
            decode_f32s(&values),
            [
                init_value("emb", 4, 0) - 0.5,
                init_value("emb", 4, 1),
                init_value("emb", 9, 0),
                init_value("emb", 9, 1)
            ]
        );
        assert!(matches!(
            answer(&s, Method::Pull, Bytes::from_static(&[0xff, 0xff])),
            Err(AnswerError::Decode(_))
        ));
        assert!(matches!(
            answer(&s, Method::Pull, Bytes::from(pull_request("nope", vec![1]))),
            Err(AnswerError::Store(PsError::UnknownTable(_)))
        ));
        assert_eq!(Method::from_path(PULL_PATH), Some(Method::Pull));
        assert_eq!(Method::from_path("/ps.ParameterServer/Other"), None);
    }
}
