//! Cutting outgoing messages into chunks: one SEND per chunk, each with its own header
//! ([`crate::wire::header`], "Chunks").

use byteexpress_mem::PoolBuf;

use crate::message::Outgoing;
use crate::wire::header::{FLAG_MORE, HEADER_LEN, Header, Kind};

/// A message being sent, chunk by chunk.
#[derive(Debug)]
pub(super) struct OutMsg {
    msg: Outgoing,
    /// Metadata + body bytes already posted.
    sent: usize,
    /// Its first chunk was posted.
    started: bool,
}

impl OutMsg {
    pub(super) fn new(msg: Outgoing) -> Self {
        OutMsg {
            msg,
            sent: 0,
            started: false,
        }
    }

    /// The message itself.
    pub(super) fn into_msg(self) -> Outgoing {
        self.msg
    }

    /// The logical connection (`conn_id` of its header).
    pub(super) fn conn_id(&self) -> u32 {
        self.msg.header.conn_id
    }

    /// Metadata + body bytes (the message without its header).
    pub(super) fn payload_len(&self) -> usize {
        self.msg.meta.len() + self.msg.body.len()
    }

    /// Bytes of the first chunk's header: 40, or 48 for a body over `u32::MAX` bytes.
    fn first_header_len(&self) -> usize {
        self.msg.final_header().encoded_len()
    }

    /// Bytes all its SENDs put on the wire when cut into chunks of at most `chunk` bytes
    /// (header included, `chunk > LONG_HEADER_LEN`): the payload plus one header per chunk
    /// (the first 48 bytes for a long body, the others 40). Cut into pieces of `chunk` bytes,
    /// this length gives exactly the SENDs [`OutMsg::next_chunk`] makes, so the scheduler's
    /// chunks and the SENDs coincide.
    pub(super) fn wire_len_in_chunks(&self, chunk: usize) -> u64 {
        let first = self.first_header_len();
        let payload = self.payload_len();
        let in_first = chunk - first;
        let rest = payload.saturating_sub(in_first);
        let continuations = rest.div_ceil(chunk - HEADER_LEN);
        (first + payload + continuations * HEADER_LEN) as u64
    }

    /// Whether every byte was posted.
    pub(super) fn done(&self) -> bool {
        self.started && self.sent == self.payload_len()
    }

    /// Takes the next chunk, of at most `chunk` bytes (header included, `chunk >
    /// LONG_HEADER_LEN`):
    /// the whole message if it fits, else the first chunk or a CONTINUATION. Returns its
    /// header (credit fields for the caller to fill) and the payload range `(offset, len)`
    /// to copy after it with [`OutMsg::copy_payload`].
    pub(super) fn next_chunk(&mut self, chunk: usize) -> (Header, usize, usize) {
        let total = self.payload_len();
        let header_len = if self.started {
            HEADER_LEN
        } else {
            self.first_header_len()
        };
        let room = chunk - header_len;
        let len = (total - self.sent).min(room);
        let more = self.sent + len < total;
        let mut h = if !self.started {
            self.msg.final_header()
        } else {
            let mut h = Header::new(Kind::Continuation);
            h.conn_id = self.msg.header.conn_id;
            h.call_id = self.msg.header.call_id;
            h.body_len = len as u64;
            h
        };
        if more {
            h.flags |= FLAG_MORE;
        }
        let off = self.sent;
        self.sent += len;
        self.started = true;
        (h, off, len)
    }

    /// Copies payload bytes `off..off + len` (metadata, then body) into `buf`.
    pub(super) fn copy_payload(
        &self,
        buf: &mut PoolBuf,
        off: usize,
        len: usize,
    ) -> Result<(), byteexpress_mem::MemError> {
        let meta = &self.msg.meta;
        let end = off + len;
        if off < meta.len() {
            buf.extend_from_slice(&meta[off..end.min(meta.len())])?;
        }
        if end > meta.len() {
            let b = off.max(meta.len()) - meta.len();
            buf.extend_from_slice(&self.msg.body[b..end - meta.len()])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::Metadata;
    use crate::wire::header::LONG_HEADER_LEN;

    /// Cuts a message of `body` bytes into chunks of `chunk` bytes; returns each chunk's
    /// (header length, payload length, FLAG_MORE) and checks their sum against
    /// [`OutMsg::wire_len_in_chunks`].
    fn cut(body: usize, chunk: usize) -> Vec<(usize, usize, bool)> {
        // zeroed pages: mapped lazily, so a body over 4 GiB costs no memory here
        let body = Bytes::from(vec![0u8; body]);
        let msg = Outgoing::new(Kind::Request, 1, 2, "/m", &Metadata::new(), body);
        let mut m = OutMsg::new(msg);
        let wire = m.wire_len_in_chunks(chunk);
        let mut out = Vec::new();
        while !m.done() {
            let (h, _, len) = m.next_chunk(chunk);
            assert!(h.encoded_len() + len <= chunk);
            out.push((h.encoded_len(), len, h.more()));
        }
        let sum: u64 = out.iter().map(|(h, l, _)| (h + l) as u64).sum();
        assert_eq!(sum, wire, "the scheduler's bytes are the SENDs' bytes");
        // every chunk but the last is full, as the scheduler cuts `wire`
        assert!(out[..out.len() - 1].iter().all(|(h, l, _)| h + l == chunk));
        out
    }

    #[test]
    fn a_long_message_s_first_chunk_carries_the_48_byte_header_and_chunks_add_up() {
        let chunk = 64 << 10;
        let body = (1usize << 32) + 1;
        let chunks = cut(body, chunk);
        assert_eq!(chunks[0], (LONG_HEADER_LEN, chunk - LONG_HEADER_LEN, true));
        assert!(chunks[1..].iter().all(|c| c.0 == HEADER_LEN));
        let payload: usize = chunks.iter().map(|c| c.1).sum();
        let meta = crate::wire::meta::encoded_len("/m", &Metadata::new());
        assert_eq!(payload, body + meta);
        assert!(!chunks.last().unwrap().2);
    }

    #[test]
    fn a_message_of_u32_max_body_bytes_keeps_the_40_byte_first_header() {
        let chunks = cut(u32::MAX as usize, 1 << 20);
        assert_eq!(chunks[0].0, HEADER_LEN);
    }
}
