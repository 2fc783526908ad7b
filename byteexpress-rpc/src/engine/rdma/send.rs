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

    /// Bytes all its SENDs put on the wire when cut into chunks of at most `chunk` bytes
    /// (header included, `chunk > HEADER_LEN`): the payload plus one header per chunk. Cut
    /// into pieces of `chunk` bytes, this length gives exactly the SENDs
    /// [`OutMsg::next_chunk`] makes, so the scheduler's chunks and the SENDs coincide.
    pub(super) fn wire_len_in_chunks(&self, chunk: usize) -> u64 {
        let per = chunk - HEADER_LEN;
        let chunks = self.payload_len().div_ceil(per).max(1);
        (self.payload_len() + chunks * HEADER_LEN) as u64
    }

    /// Whether every byte was posted.
    pub(super) fn done(&self) -> bool {
        self.started && self.sent == self.payload_len()
    }

    /// Takes the next chunk, of at most `chunk` bytes (header included, `chunk > HEADER_LEN`):
    /// the whole message if it fits, else the first chunk or a CONTINUATION. Returns its
    /// header (credit fields for the caller to fill) and the payload range `(offset, len)`
    /// to copy after it with [`OutMsg::copy_payload`].
    pub(super) fn next_chunk(&mut self, chunk: usize) -> (Header, usize, usize) {
        let total = self.payload_len();
        let room = chunk - HEADER_LEN;
        let len = (total - self.sent).min(room);
        let more = self.sent + len < total;
        let mut h = if !self.started {
            self.msg.final_header()
        } else {
            let mut h = Header::new(Kind::Continuation);
            h.conn_id = self.msg.header.conn_id;
            h.call_id = self.msg.header.call_id;
            h.body_len = len as u32;
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
