//! Messages as the engines move them: a header, a metadata section and a body.

use bytes::Bytes;

use crate::wire::header::{Header, Kind};
use crate::wire::{WireError, meta};
use crate::{Code, Metadata};

/// A message to send. `meta` is the encoded metadata section; the engine fills in the header's
/// lengths and credit fields.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub header: Header,
    pub meta: Vec<u8>,
    pub body: Bytes,
}

impl Outgoing {
    /// A message of `kind` with `head` (path or status message) and metadata.
    pub fn new(
        kind: Kind,
        conn_id: u32,
        call_id: u64,
        head: &str,
        md: &Metadata,
        body: Bytes,
    ) -> Self {
        let mut m = Vec::with_capacity(meta::encoded_len(head, md));
        meta::encode(&mut m, head, md);
        let mut header = Header::new(kind);
        header.conn_id = conn_id;
        header.call_id = call_id;
        Outgoing {
            header,
            meta: m,
            body,
        }
    }

    /// A RESPONSE or ERROR carrying a status.
    pub fn status(
        kind: Kind,
        conn_id: u32,
        call_id: u64,
        code: Code,
        message: &str,
        md: &Metadata,
        body: Bytes,
    ) -> Self {
        let mut o = Outgoing::new(kind, conn_id, call_id, message, md, body);
        o.header.status = code as u16;
        o
    }

    /// A RESPONSE ending call `key` (conn_id, call_id) with `code` and `message` alone: no
    /// metadata, no body (a refusal or a failure found before any answer).
    pub fn refusal(key: (u32, u64), code: Code, message: &str) -> Self {
        Outgoing::status(
            Kind::Response,
            key.0,
            key.1,
            code,
            message,
            &Metadata::new(),
            Bytes::new(),
        )
    }

    /// A [`Outgoing::refusal`] marked "refused before dispatch" ([`FLAG_REFUSED`]): only for
    /// a call no handler ran for.
    pub fn refused_before_dispatch(key: (u32, u64), code: Code, message: &str) -> Self {
        let mut o = Outgoing::refusal(key, code, message);
        o.header.flags |= crate::wire::header::FLAG_REFUSED;
        o
    }

    /// Bytes on the wire: header (40, or 48 for a body over `u32::MAX` bytes) + metadata +
    /// body.
    pub fn wire_len(&self) -> usize {
        self.final_header().encoded_len() + self.meta.len() + self.body.len()
    }

    /// The metadata section is too long for the header's 32-bit `meta_len`: such a message
    /// cannot be sent (its call fails, `crate::engine::LinkTx::send`).
    pub fn meta_too_long(&self) -> bool {
        u32::try_from(self.meta.len()).is_err()
    }

    /// The header with its length fields set (`meta_len` saturates at `u32::MAX`: a longer
    /// metadata section is refused before sending, [`Outgoing::meta_too_long`]).
    pub fn final_header(&self) -> Header {
        let mut h = self.header;
        h.meta_len = u32::try_from(self.meta.len()).unwrap_or(u32::MAX);
        h.body_len = self.body.len() as u64;
        h
    }
}

/// A received message; `meta` and `body` are slices of the received buffer (no copy).
#[derive(Debug, Clone)]
pub(crate) struct Incoming {
    pub header: Header,
    pub meta: Bytes,
    pub body: Bytes,
}

impl Incoming {
    /// Splits a received whole message (a TCP frame, or the filled part of a receive buffer
    /// that holds a message of one chunk). Chunks of a larger message (first chunk with
    /// `FLAG_MORE`, CONTINUATION) are errors here: only the RDMA engine reassembles them.
    pub fn parse(msg: Bytes) -> Result<Incoming, WireError> {
        let header = Header::decode(&msg)?;
        if header.more() || header.kind == Kind::Continuation {
            return crate::wire::err(format!(
                "{:?} chunk where a whole message was expected",
                header.kind
            ));
        }
        if header.flags & crate::wire::rendezvous::FLAG_RENDEZVOUS != 0 {
            // Only the RDMA engine takes a descriptor (and READs the payload it names).
            return crate::wire::err("rendezvous descriptor where a whole message was expected");
        }
        // checked by decode: the header, meta_len and body_len bytes are all in msg
        let meta_start = header.encoded_len();
        let meta_end = meta_start + header.meta_len as usize;
        Ok(Incoming {
            header,
            meta: msg.slice(meta_start..meta_end),
            body: msg.slice(meta_end..),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::header::FLAG_MORE;

    #[test]
    fn a_refusal_before_dispatch_carries_bit_5_and_an_ordinary_refusal_does_not() {
        let marked = Outgoing::refused_before_dispatch((3, 9), Code::Unavailable, "draining");
        let h =
            Header::decode(&[&marked.final_header().encode()[..], &marked.meta].concat()).unwrap();
        assert_eq!(h.flags, crate::wire::header::FLAG_REFUSED);
        assert_eq!(crate::wire::header::FLAG_REFUSED, 0x20);
        assert_eq!(
            (h.kind, h.status, h.conn_id, h.call_id),
            (Kind::Response, 14, 3, 9)
        );
        let plain = Outgoing::refusal((3, 9), Code::Unavailable, "x");
        assert_eq!(plain.final_header().flags, 0);
    }

    #[test]
    fn parse_refuses_chunks_of_a_larger_message() {
        let mut first = Header::new(Kind::Request);
        first.body_len = 100;
        first.flags = FLAG_MORE;
        let mut msg = first.encode().to_vec();
        msg.extend_from_slice(&[0; 10]);
        assert!(Incoming::parse(Bytes::from(msg)).is_err(), "first chunk");
        let mut cont = Header::new(Kind::Continuation);
        cont.body_len = 10;
        let mut msg = cont.encode().to_vec();
        msg.extend_from_slice(&[0; 10]);
        assert!(Incoming::parse(Bytes::from(msg)).is_err(), "continuation");
        let whole = Outgoing::new(Kind::Request, 1, 2, "/m", &Metadata::new(), "hi".into());
        let mut msg = whole.final_header().encode().to_vec();
        msg.extend_from_slice(&whole.meta);
        msg.extend_from_slice(&whole.body);
        let parsed = Incoming::parse(Bytes::from(msg)).expect("a whole message");
        assert_eq!(&parsed.body[..], b"hi");
    }
}
