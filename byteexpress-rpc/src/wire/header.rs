//! The message header, 40 bytes (48 with the long-body extension), integers little-endian.
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 2 | magic | `0x42 0x58` ("BX") |
//! | 2 | 1 | version | 1 |
//! | 3 | 1 | kind | [`Kind`]: 1 REQUEST, 2 RESPONSE, 3 CANCEL, 4 CREDIT_UPDATE, 5 ERROR, 6 CONTINUATION, 7 PING, 8 PONG, 9 STREAM_OPEN, 10 STREAM_MESSAGE, 11 STREAM_HEADERS, 12 HALF_CLOSE, 13 WINDOW_UPDATE, 14 RESYNC, 15 REPROBE, 16 REPROBE_ACK, 17 SWITCH, 18 RELEASE ([`crate::wire::rendezvous`]) |
//! | 4 | 1 | flags | bit 0: [`FLAG_SLOT_RETURN`] (the sender re-posted the receiver's credit-update slot); bit 1: [`FLAG_MORE`] (more chunks of this message follow, RDMA); bit 2: [`FLAG_END_STREAM`] (STREAM_OPEN: the client sends nothing more); bit 3: [`FLAG_MESSAGE`] (STREAM_OPEN, and RESPONSE of a stream: the body is one message of the stream); bit 4: [`FLAG_AFTER_HEADERS`] (STREAM_MESSAGE and RESPONSE of a stream, server → client: STREAM_HEADERS was sent before it; the client holds the stream's messages and end until the headers arrive); bit 5: [`FLAG_REFUSED`] (RESPONSE, server → client: refused before dispatch, no handler ran, so the client may retry it transparently once: `crate::retry`); bit 6: [`FLAG_LONG`] (the body is longer than `u32::MAX` bytes: `body_len` is `0xFFFF_FFFF` and the 8-byte extension at offset 40 holds the length); bit 7: [`crate::wire::rendezvous::FLAG_RENDEZVOUS`] (RDMA: a 24-byte descriptor follows the header (40 or 48 bytes) instead of the payload, which the receiver READs) |
//! | 5 | 1 | reserved | sent as 0, not checked on receipt |
//! | 6 | 2 | status | gRPC status code (RESPONSE, ERROR); 0 otherwise |
//! | 8 | 4 | conn_id | logical connection the call belongs to |
//! | 12 | 2 | credits | receive buffers re-posted for the peer since the last return (RDMA; 0 on TCP); at most grant + 1 ≤ 4,097 |
//! | 14 | 2 | seq | RDMA: on a SEND that completes a message (a single-chunk message, or the last chunk), the message's number, mod 2^16, among the messages of its direction received over RDMA on this link (from 0; a re-probed QP continues from the count the peer's RESYNC stated); the receiver checks it against its own count; 0 on other SENDs and on TCP. The resync after a fallback states the full count (RESYNC) |
//! | 16 | 8 | call_id | call number, unique per conn_id while the call lives (a server closes the link of a peer that reuses a running one); PING: the ping's number, echoed by its PONG |
//! | 24 | 8 | timeout_us | REQUEST, STREAM_OPEN: time left until the deadline in µs, 0 = none; STREAM_MESSAGE: the message's sequence number in its direction (a STREAM_OPEN's message is 0); HALF_CLOSE, and RESPONSE of a stream: messages sent before it in that direction; WINDOW_UPDATE: bytes granted |
//! | 32 | 4 | meta_len | bytes of metadata of the message ([`crate::wire::meta`]); 0 in a CONTINUATION |
//! | 36 | 4 | body_len | bytes of body of the message; in a CONTINUATION: bytes after this header; `0xFFFF_FFFF` with [`FLAG_LONG`] (the length is in the extension) |
//! | 40 | 8 | body_len_long | only with [`FLAG_LONG`]: bytes of body, u64, more than `u32::MAX`; metadata then starts at byte 48 |
//!
//! # Long bodies
//! A message whose body is at most `u32::MAX` bytes has the 40-byte header above, [`FLAG_LONG`]
//! clear (byte-identical to a header without the extension). A body of more bytes sets
//! [`FLAG_LONG`], writes `0xFFFF_FFFF` in `body_len` and follows the 40 bytes with the body
//! length as a u64 (the extension): the header is then [`LONG_HEADER_LEN`] = 48 bytes, and the
//! metadata starts at byte 48 ([`Header::encoded_len`]). `meta_len` stays 32 bits. Decoding
//! refuses [`FLAG_LONG`] with `body_len` other than `0xFFFF_FFFF`, an extension of at most
//! `u32::MAX`, an extension cut short, and [`FLAG_LONG`] on a CONTINUATION or CREDIT_UPDATE.
//! In memory, [`Header::body_len`] is a u64 and [`Header::flags`] never holds [`FLAG_LONG`]:
//! [`Header::encode`] sets it from the length, [`Header::decode`] clears it.
//!
//! # Streams (kinds 9–13; gRPC's PROTOCOL-HTTP2 over one call id)
//! A stream is one call `(conn_id, call_id)`: STREAM_OPEN (client → server: metadata = method
//! path + request metadata, `timeout_us` the deadline of the whole stream, optionally the first
//! message with [`FLAG_MESSAGE`], [`FLAG_END_STREAM`] when the client will send no more);
//! STREAM_HEADERS (server → client: metadata = "" + the initial metadata, before the first
//! message; every later STREAM_MESSAGE and the RESPONSE carry [`FLAG_AFTER_HEADERS`], and the
//! client delivers none of them before the headers, which on RDMA a one-chunk frame may
//! overtake); STREAM_MESSAGE (either way: one message per frame, numbered in offset 24 from 0
//! per direction, so a one-chunk message that the RDMA scheduler posts ahead of an earlier
//! multi-chunk one is put back in order by the receiver); HALF_CLOSE (client → server, offset
//! 24 = messages sent); the stream ends with a RESPONSE from the server (status, metadata =
//! status message + trailers, offset 24 = messages sent, optionally a last message with
//! [`FLAG_MESSAGE`]), delivered after those messages; CANCEL (client → server) ends it early.
//! WINDOW_UPDATE (either way, offset 24 = bytes) is HTTP/2's WINDOW_UPDATE (RFC 9113 §6.9) per
//! stream: a sender may have at most the receiver's window (its `Config::stream_window`,
//! announced in HELLO / HELLO_ACK, [`crate::wire::hello`]; counted as
//! 40 + body bytes per message) sent and not yet granted back, except one message when nothing
//! is outstanding; the receiver grants bytes back as the application takes messages. A message
//! beyond the window fails the stream RESOURCE_EXHAUSTED, never the link.
//!
//! # Resync (kind 14; after the QP of an RDMA link failed)
//! RESYNC (either way, on the TCP control connection): `call_id` = whole messages this side
//! received from the peer over RDMA (the full count of which `seq` is the low 16 bits),
//! `timeout_us` = whole messages it sent over RDMA; body: from the server, 8 bytes LE, a nonce
//! armed on its device for the client's first re-probe; then, from either side, the *holes*:
//! u64 LE numbers of the peer's rendezvous messages whose descriptor arrived but whose bytes
//! were not all READ, which the peer re-sends too ([`crate::wire::rendezvous`]). Each side sends one when it falls
//! back, reads the peer's, and then re-sends over TCP, in order, the messages the peer's
//! count says it never received, before any new message (DESIGN.md 3.5, "Link life").
//!
//! # Re-probe (kinds 15–17; a fallen-back link takes RDMA back)
//! On the TCP connection of a link in fallback, in order with the messages: REPROBE (client,
//! `call_id` = probe number, body = SELECT_RDMA with a new QP's endpoint), REPROBE_ACK (server,
//! same `call_id`, body = RDMA_ACCEPT with its new QP, connected and with receives posted, or
//! REFUSE), then SWITCH both ways (same `call_id`): each side's last message on TCP. A side
//! sends over the new QP only after it sent its SWITCH and read the peer's, so everything
//! either side sent on TCP is delivered before anything it sends on RDMA. A REPROBE with an
//! empty body asks for a nonce only (the client's went stale: a device forgets an armed nonce
//! after a while, and a probe spends it): the server answers a REPROBE_ACK with an empty body
//! and a fresh nonce in `timeout_us`, and builds no QP.
//!
//! [`Header::decode`] checks `meta_len` and `body_len` against the bytes actually received
//! before anything is sliced. The configured maxima are applied before that, where the bytes
//! arrive: a TCP link refuses a frame over `Config::max_message` unread (its call fails
//! RESOURCE_EXHAUSTED, the link stays), an RDMA SEND cannot
//! exceed the posted receive buffer, and reassembly refuses a first chunk announcing more than
//! `Config::max_message` before it allocates ("Chunks" below). `DESIGN.md` (section 4) has the
//! same tables; change both together.
//!
//! # Chunks (RDMA)
//! A message whose header + metadata + body is larger than one chunk (`Config::max_chunk`,
//! never more than the receive buffer) travels as several SENDs on the link's QP:
//! - the **first chunk** carries the message's own header (kind, status, conn_id, call_id,
//!   timeout_us) with `meta_len` and `body_len` of the **whole** message and [`FLAG_MORE`],
//!   followed by the first bytes of metadata + body (fewer than `meta_len + body_len`); a
//!   long message's first chunk carries the 48-byte header with [`FLAG_LONG`];
//! - each **continuation chunk** carries a header of kind CONTINUATION with the same conn_id
//!   and call_id, `meta_len` 0 and `body_len` = bytes in this chunk, then those bytes;
//!   [`FLAG_MORE`] is set on all but the last.
//!
//! Chunks of different messages may interleave; chunks of one message arrive in order. Every
//! chunk carries its own `credits` and [`FLAG_SLOT_RETURN`] and consumes one credit. The
//! receiver checks the announced size (header length (40, or 48 with [`FLAG_LONG`]) +
//! `meta_len` + `body_len`, computed in u64) against its
//! `Config::max_message` before allocating, then copies each chunk into place; a continuation
//! with no message started, more bytes than announced or a last chunk that leaves the message
//! short fails the link. A message that fits one chunk is one SEND without [`FLAG_MORE`].

use super::{WireError, err};

/// Header size in bytes (the base header; [`LONG_HEADER_LEN`] with [`FLAG_LONG`]).
pub const HEADER_LEN: usize = 40;
/// Header size in bytes of a message with [`FLAG_LONG`]: the base header and the 8-byte body
/// length.
pub const LONG_HEADER_LEN: usize = 48;
/// `body_len` of a header with [`FLAG_LONG`]: the length is in the extension.
const LONG_MARK: u32 = u32::MAX;
const MAGIC: [u8; 2] = *b"BX";
/// Protocol version carried in byte 2.
pub const VERSION: u8 = 1;
/// Flag bit: the sender re-posted the receive buffer reserved for the peer's credit updates.
pub const FLAG_SLOT_RETURN: u8 = 1;
/// Flag bit: more chunks of this message follow (RDMA chunking, module docs).
pub const FLAG_MORE: u8 = 2;
/// Flag bit (STREAM_OPEN): the client half-closes with this frame (gRPC END_STREAM).
pub const FLAG_END_STREAM: u8 = 4;
/// Flag bit (STREAM_OPEN, RESPONSE of a stream): the body is one message of the stream.
pub const FLAG_MESSAGE: u8 = 8;
/// Flag bit (STREAM_MESSAGE and RESPONSE of a stream, server → client): the server sent
/// STREAM_HEADERS before this frame, so the client delivers nothing of the stream (messages,
/// end) until the headers are here. gRPC puts initial metadata before the first message; on
/// RDMA a multi-chunk STREAM_HEADERS may be overtaken by a one-chunk message.
pub const FLAG_AFTER_HEADERS: u8 = 16;
/// Flag bit (RESPONSE, server → client): the call or stream was refused before dispatch: no
/// handler ran for it, nothing of it was executed. Set only when the server is draining, the
/// link's `max_concurrent_calls` is full, or the request was refused unread for want of the
/// server's memory budget. A client may retry such a call transparently once (gRPC A6's
/// transparent retry; `crate::retry`).
pub const FLAG_REFUSED: u8 = 32;
/// Flag bit: the body is longer than `u32::MAX` bytes; its length follows the 40 header bytes
/// as a u64 (module docs, "Long bodies"). Set by [`Header::encode`] from the length, never
/// kept in [`Header::flags`].
pub const FLAG_LONG: u8 = 64;

/// Message kind (byte 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A call: metadata = method path + request metadata, body = request message.
    Request = 1,
    /// A call's end: status, metadata = status message + response metadata, body = response
    /// message (empty unless status is OK).
    Response = 2,
    /// The client gave up on `call_id` (deadline or cancellation): the server cancels the handler.
    Cancel = 3,
    /// Credits only (RDMA), sent into the peer's reserved update slot.
    CreditUpdate = 4,
    /// The link is being closed because of the peer's error; metadata = reason.
    Error = 5,
    /// A further chunk of the message `(conn_id, call_id)` whose first chunk carried
    /// [`FLAG_MORE`]: `meta_len` 0, `body_len` = bytes in this chunk (RDMA only).
    Continuation = 6,
    /// Keepalive probe (TCP only: on a TCP link, or on the TCP control connection of an RDMA
    /// link): `call_id` = the ping's number, no metadata, no body. Answered with PONG.
    Ping = 7,
    /// Answer to PING, with its `call_id`; nothing else.
    Pong = 8,
    /// Opens a stream (module docs, "Streams"): as REQUEST, the body optionally its first
    /// message ([`FLAG_MESSAGE`]), [`FLAG_END_STREAM`] when no more follow.
    StreamOpen = 9,
    /// One message of a stream, either direction; offset 24 = its sequence number.
    StreamMessage = 10,
    /// The server's initial metadata of a stream: metadata = "" + entries, no body.
    StreamHeaders = 11,
    /// The client's half-close; offset 24 = messages it sent.
    HalfClose = 12,
    /// Bytes granted back to the stream's sender (offset 24), as HTTP/2's WINDOW_UPDATE.
    WindowUpdate = 13,
    /// After an RDMA link's QP failed, on its TCP control connection (module docs,
    /// "Resync"): `call_id` = whole messages received over RDMA, `timeout_us` = sent.
    Resync = 14,
    /// Client → server on a fallen-back link's TCP connection: try a new QP. `call_id` = the
    /// probe's number; body = a SELECT_RDMA set-up message ([`crate::wire::hello`]) with the
    /// client's new QP, or empty: a request for a fresh probe nonce only.
    Reprobe = 15,
    /// Server → client, answer to REPROBE `call_id`: body = RDMA_ACCEPT (the server's new QP,
    /// connected, receives posted) or REFUSE, or empty for an empty REPROBE; `timeout_us` = a
    /// nonce armed for the next probe.
    ReprobeAck = 16,
    /// Either way after an accepted REPROBE `call_id`: the sender's last message on TCP; what
    /// it sends next goes over the new QP.
    Switch = 17,
    /// RDMA, reader → lender of a rendezvous message ([`crate::wire::rendezvous`]): the body
    /// was READ; `call_id` = the descriptor's token, `timeout_us` = the window rkey this SEND
    /// invalidates (SEND_WITH_INV) or 0. No metadata, no body. Ignored on TCP (a re-sent one
    /// after a fallback: the loans died with the QP).
    Release = 18,
}

impl Kind {
    /// Kinds that carry an application message (metadata and body), which may go by
    /// rendezvous: REQUEST, RESPONSE, STREAM_OPEN, STREAM_MESSAGE, STREAM_HEADERS.
    pub fn has_body(self) -> bool {
        matches!(
            self,
            Kind::Request
                | Kind::Response
                | Kind::StreamOpen
                | Kind::StreamMessage
                | Kind::StreamHeaders
        )
    }

    /// REPROBE, REPROBE_ACK or SWITCH: messages of a re-probe, for the link, not the
    /// application.
    pub fn is_reprobe(self) -> bool {
        matches!(self, Kind::Reprobe | Kind::ReprobeAck | Kind::Switch)
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message kind.
    pub kind: Kind,
    /// Flag bits ([`FLAG_LONG`] excepted: it follows from `body_len`).
    pub flags: u8,
    /// gRPC status code.
    pub status: u16,
    /// Logical connection.
    pub conn_id: u32,
    /// Piggybacked credit return (at most grant + 1).
    pub credits: u16,
    /// RDMA: number of the message this SEND completes in its direction, mod 2^16.
    pub seq: u16,
    /// Call number.
    pub call_id: u64,
    /// Time left in µs (REQUEST), 0 = no deadline.
    pub timeout_us: u64,
    /// Metadata bytes.
    pub meta_len: u32,
    /// Body bytes; more than `u32::MAX` is sent with [`FLAG_LONG`] and the 48-byte header.
    pub body_len: u64,
}

/// An encoded header: 40 bytes, or 48 with [`FLAG_LONG`]. Dereferences to those bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodedHeader {
    buf: [u8; LONG_HEADER_LEN],
    len: usize,
}

impl std::ops::Deref for EncodedHeader {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for EncodedHeader {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

impl Header {
    /// A header of `kind` with every other field zero.
    pub fn new(kind: Kind) -> Self {
        Header {
            kind,
            flags: 0,
            status: 0,
            conn_id: 0,
            credits: 0,
            seq: 0,
            call_id: 0,
            timeout_us: 0,
            meta_len: 0,
            body_len: 0,
        }
    }

    /// The body is longer than `u32::MAX` bytes: encoded with [`FLAG_LONG`].
    pub fn is_long(&self) -> bool {
        self.body_len > u64::from(u32::MAX)
    }

    /// Bytes [`Header::encode`] writes: [`HEADER_LEN`] (40), or [`LONG_HEADER_LEN`] (48) for a
    /// body longer than `u32::MAX` bytes. Metadata starts this many bytes into a message.
    pub fn encoded_len(&self) -> usize {
        if self.is_long() {
            LONG_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the 40 bytes, or 48 with [`FLAG_LONG`] for a body longer than `u32::MAX`.
    pub fn encode(&self) -> EncodedHeader {
        let mut b = [0u8; LONG_HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4] = self.flags & !FLAG_LONG;
        b[6..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..12].copy_from_slice(&self.conn_id.to_le_bytes());
        b[12..14].copy_from_slice(&self.credits.to_le_bytes());
        b[14..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.call_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.timeout_us.to_le_bytes());
        b[32..36].copy_from_slice(&self.meta_len.to_le_bytes());
        match u32::try_from(self.body_len) {
            Ok(len) => b[36..40].copy_from_slice(&len.to_le_bytes()),
            Err(_) => {
                b[4] |= FLAG_LONG;
                b[36..40].copy_from_slice(&LONG_MARK.to_le_bytes());
                b[40..48].copy_from_slice(&self.body_len.to_le_bytes());
            }
        }
        EncodedHeader {
            buf: b,
            len: self.encoded_len(),
        }
    }

    /// Parses a message's first bytes and checks its lengths against the bytes that follow
    /// (`msg.len() - ` [`Header::encoded_len`]): equal to `meta_len + body_len`, except in a first chunk
    /// ([`FLAG_MORE`] set, kind not CONTINUATION), which must be shorter than that. A
    /// CONTINUATION must have `meta_len` 0; a CREDIT_UPDATE must not have [`FLAG_MORE`].
    /// Errors name the first broken field.
    pub fn decode(msg: &[u8]) -> Result<Header, WireError> {
        let h = Self::decode_head(msg)?;
        let rest = (msg.len() - h.encoded_len()) as u64;
        let announced = u64::from(h.meta_len).saturating_add(h.body_len);
        if h.flags & super::rendezvous::FLAG_RENDEZVOUS != 0 {
            if h.more() || !h.kind.has_body() {
                return err(format!(
                    "FLAG_RENDEZVOUS on a {:?} or with FLAG_MORE",
                    h.kind
                ));
            }
            if rest != super::rendezvous::DESCRIPTOR_LEN as u64 {
                return err(format!(
                    "rendezvous SEND with {rest} bytes after the header"
                ));
            }
            return Ok(h);
        }
        if h.first_of_many() {
            if rest >= announced {
                return err(format!(
                    "first chunk of {rest} bytes with FLAG_MORE, but meta_len {} + body_len {} \
                     fit in it",
                    h.meta_len, h.body_len
                ));
            }
        } else if announced != rest {
            return err(format!(
                "meta_len {} + body_len {} != {rest} bytes received",
                h.meta_len, h.body_len
            ));
        }
        Ok(h)
    }

    /// The checks of [`Header::decode`] on the header bytes alone (40, or 48 with
    /// [`FLAG_LONG`]), without the lengths against the bytes that follow (for a message whose
    /// body is refused unread, e.g. over the memory budget).
    pub fn decode_head(msg: &[u8]) -> Result<Header, WireError> {
        if msg.len() < HEADER_LEN {
            return err(format!(
                "{} bytes, shorter than the {HEADER_LEN}-byte header",
                msg.len()
            ));
        }
        if msg[0..2] != MAGIC {
            return err("bad magic");
        }
        if msg[2] != VERSION {
            return err(format!("unsupported version {}", msg[2]));
        }
        let kind = match msg[3] {
            1 => Kind::Request,
            2 => Kind::Response,
            3 => Kind::Cancel,
            4 => Kind::CreditUpdate,
            5 => Kind::Error,
            6 => Kind::Continuation,
            7 => Kind::Ping,
            8 => Kind::Pong,
            9 => Kind::StreamOpen,
            10 => Kind::StreamMessage,
            11 => Kind::StreamHeaders,
            12 => Kind::HalfClose,
            13 => Kind::WindowUpdate,
            14 => Kind::Resync,
            15 => Kind::Reprobe,
            16 => Kind::ReprobeAck,
            17 => Kind::Switch,
            18 => Kind::Release,
            k => return err(format!("unknown kind {k}")),
        };
        let u32_at = |i: usize| u32::from_le_bytes(msg[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(msg[i..i + 8].try_into().expect("8 bytes"));
        let long = msg[4] & FLAG_LONG != 0;
        let body_len = if long {
            if u32_at(36) != LONG_MARK {
                return err(format!(
                    "FLAG_LONG with body_len {} (must be 0xFFFFFFFF)",
                    u32_at(36)
                ));
            }
            if msg.len() < LONG_HEADER_LEN {
                return err(format!(
                    "FLAG_LONG header of {} bytes, shorter than {LONG_HEADER_LEN}",
                    msg.len()
                ));
            }
            let len = u64_at(40);
            if len <= u64::from(u32::MAX) {
                return err(format!(
                    "FLAG_LONG with a body of {len} bytes (at most u32::MAX)"
                ));
            }
            len
        } else {
            u64::from(u32_at(36))
        };
        let h = Header {
            kind,
            flags: msg[4] & !FLAG_LONG,
            status: u16::from_le_bytes([msg[6], msg[7]]),
            conn_id: u32_at(8),
            credits: u16::from_le_bytes([msg[12], msg[13]]),
            seq: u16::from_le_bytes([msg[14], msg[15]]),
            call_id: u64_at(16),
            timeout_us: u64_at(24),
            meta_len: u32_at(32),
            body_len,
        };
        if long && matches!(h.kind, Kind::Continuation | Kind::CreditUpdate) {
            return err(format!("{:?} with FLAG_LONG", h.kind));
        }
        if h.kind == Kind::Continuation && h.meta_len != 0 {
            return err(format!("CONTINUATION with meta_len {}", h.meta_len));
        }
        if h.kind == Kind::CreditUpdate && h.more() {
            return err("CREDIT_UPDATE with FLAG_MORE");
        }
        Ok(h)
    }

    /// [`FLAG_MORE`] is set: more chunks of this message follow.
    pub fn more(&self) -> bool {
        self.flags & FLAG_MORE != 0
    }

    /// The first chunk of a message cut into several ([`FLAG_MORE`] on a kind other than
    /// CONTINUATION).
    pub fn first_of_many(&self) -> bool {
        self.more() && self.kind != Kind::Continuation
    }

    /// Size of the whole message this header announces: [`Header::encoded_len`] (40 or 48) +
    /// `meta_len` + `body_len` (bytes; saturating at `u64::MAX`, beyond any limit). For a
    /// CONTINUATION, the size of this chunk.
    pub fn message_len(&self) -> u64 {
        (self.encoded_len() as u64 + u64::from(self.meta_len)).saturating_add(self.body_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_every_field() {
        let h = Header {
            kind: Kind::Response,
            flags: FLAG_SLOT_RETURN,
            status: 14,
            conn_id: 0xdead_beef,
            credits: 7,
            seq: 0xfffe,
            call_id: u64::MAX - 1,
            timeout_us: 1_000_000,
            meta_len: 3,
            body_len: 5,
        };
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(&[0; 8]);
        assert_eq!(Header::decode(&msg).unwrap(), h);
    }

    #[test]
    fn ping_and_pong_are_a_header_alone_carrying_the_ping_number() {
        for kind in [Kind::Ping, Kind::Pong] {
            let mut h = Header::new(kind);
            h.call_id = 77;
            let msg = h.encode();
            assert_eq!(msg[3], kind as u8);
            let d = Header::decode(&msg).expect("decodes");
            assert_eq!((d.kind, d.call_id), (kind, 77));
        }
        assert_eq!((Kind::Ping as u8, Kind::Pong as u8), (7, 8));
    }

    #[test]
    fn stream_kinds_have_their_numbers_and_round_trip() {
        for (kind, n) in [
            (Kind::StreamOpen, 9),
            (Kind::StreamMessage, 10),
            (Kind::StreamHeaders, 11),
            (Kind::HalfClose, 12),
            (Kind::WindowUpdate, 13),
            (Kind::Resync, 14),
            (Kind::Reprobe, 15),
            (Kind::ReprobeAck, 16),
            (Kind::Switch, 17),
        ] {
            let mut h = Header::new(kind);
            h.timeout_us = 65_536;
            h.flags = FLAG_END_STREAM | FLAG_MESSAGE;
            let msg = h.encode();
            assert_eq!(msg[3], n);
            assert_eq!(Header::decode(&msg).unwrap(), h);
        }
    }

    #[test]
    fn header_rejects_lengths_that_disagree_with_the_message() {
        let mut h = Header::new(Kind::Request);
        h.body_len = u64::from(u32::MAX);
        let msg = h.encode();
        assert!(Header::decode(&msg).is_err());
    }

    #[test]
    fn header_rejects_short_bad_magic_version_and_kind() {
        let good = Header::new(Kind::Cancel).encode();
        assert!(Header::decode(&good[..39]).is_err());
        for (i, v) in [(0, b'X'), (2, 9), (3, 0), (3, 19)] {
            let mut b = good;
            b[i] = v;
            assert!(Header::decode(&b).is_err(), "byte {i} = {v}");
        }
    }

    #[test]
    fn first_chunk_may_be_shorter_than_its_lengths_only_with_flag_more() {
        let mut h = Header::new(Kind::Request);
        h.meta_len = 10;
        h.body_len = 1000;
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(&[0; 100]);
        assert!(Header::decode(&msg).is_err(), "short without FLAG_MORE");
        h.flags = FLAG_MORE;
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(&[0; 100]);
        let d = Header::decode(&msg).unwrap();
        assert!(d.first_of_many());
        assert_eq!(d.message_len(), 1050);
        // a "first chunk" that already holds the whole message is malformed
        let mut whole = h.encode().to_vec();
        whole.extend_from_slice(&[0; 1010]);
        assert!(
            Header::decode(&whole).is_err(),
            "FLAG_MORE on a complete message"
        );
    }

    #[test]
    fn continuation_carries_its_own_length_and_no_metadata() {
        let mut h = Header::new(Kind::Continuation);
        h.conn_id = 3;
        h.call_id = 9;
        h.body_len = 5;
        h.flags = FLAG_MORE;
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(&[1; 5]);
        let d = Header::decode(&msg).unwrap();
        assert_eq!(d, h);
        assert!(d.more() && !d.first_of_many());
        msg.push(0);
        assert!(
            Header::decode(&msg).is_err(),
            "body_len must match the chunk"
        );
        h.meta_len = 1;
        h.body_len = 4;
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(&[1; 5]);
        assert!(Header::decode(&msg).is_err(), "meta_len must be 0");
    }

    #[test]
    fn credit_update_cannot_be_chunked() {
        let mut h = Header::new(Kind::CreditUpdate);
        h.flags = FLAG_MORE;
        h.body_len = 1;
        assert!(Header::decode(&h.encode()).is_err());
    }

    /// A rendezvous SEND carries exactly a descriptor after its header, on a kind with a body,
    /// never with FLAG_MORE; anything else is the peer's protocol error.
    #[test]
    fn a_rendezvous_header_is_followed_by_exactly_one_descriptor() {
        use crate::wire::rendezvous::{DESCRIPTOR_LEN, FLAG_RENDEZVOUS};
        let mut h = Header::new(Kind::Request);
        h.flags = FLAG_RENDEZVOUS;
        h.meta_len = 10;
        h.body_len = 1 << 30;
        let msg = |h: &Header, extra: usize| [&h.encode()[..], &vec![0; extra]].concat();
        assert!(Header::decode(&msg(&h, DESCRIPTOR_LEN)).is_ok());
        assert!(Header::decode(&msg(&h, DESCRIPTOR_LEN - 1)).is_err());
        assert!(Header::decode(&msg(&h, DESCRIPTOR_LEN + 1)).is_err());
        let mut more = h;
        more.flags |= FLAG_MORE;
        assert!(Header::decode(&msg(&more, DESCRIPTOR_LEN)).is_err());
        let mut cancel = h;
        cancel.kind = Kind::Cancel;
        assert!(Header::decode(&msg(&cancel, DESCRIPTOR_LEN)).is_err());
    }

    /// A REQUEST header with 3 bytes of metadata and `body_len` bytes of body.
    fn long_request(body_len: u64) -> Header {
        let mut h = Header::new(Kind::Request);
        h.conn_id = 4;
        h.call_id = 5;
        h.meta_len = 3;
        h.body_len = body_len;
        h
    }

    #[test]
    fn a_body_of_u32_max_bytes_keeps_the_40_byte_header_without_flag_long() {
        let h = long_request(u64::from(u32::MAX));
        let b = h.encode();
        assert_eq!((b.len(), h.encoded_len()), (HEADER_LEN, HEADER_LEN));
        assert_eq!(b[4] & FLAG_LONG, 0);
        assert_eq!(&b[36..40], &[0xFF; 4]);
        let d = Header::decode_head(&b).unwrap();
        assert_eq!(d, h);
        assert_eq!(d.message_len(), 40 + 3 + u64::from(u32::MAX));
    }

    #[test]
    fn a_body_of_u32_max_plus_one_bytes_has_the_48_byte_long_header() {
        let len = u64::from(u32::MAX) + 1;
        let h = long_request(len);
        let b = h.encode();
        assert_eq!(
            (b.len(), h.encoded_len()),
            (LONG_HEADER_LEN, LONG_HEADER_LEN)
        );
        assert_eq!(FLAG_LONG, 0x40);
        assert_eq!(b[4], FLAG_LONG);
        assert_eq!(&b[36..40], &[0xFF; 4]);
        assert_eq!(&b[40..48], &len.to_le_bytes());
        let d = Header::decode_head(&b).unwrap();
        assert_eq!(d, h, "FLAG_LONG is not kept in memory");
        assert_eq!(d.flags, 0);
        assert_eq!(d.message_len(), 48 + 3 + len);
        // a first chunk of it decodes, its payload counted after 48 bytes
        let mut first = h;
        first.flags = FLAG_MORE;
        let mut msg = first.encode().to_vec();
        msg.extend_from_slice(&[9; 100]);
        let d = Header::decode(&msg).unwrap();
        assert!(d.first_of_many() && d.is_long());
        assert_eq!(d.body_len, len);
    }

    #[test]
    fn a_long_header_with_a_wrong_mark_a_small_length_or_cut_short_is_refused() {
        let good = long_request(1 << 40).encode();
        assert!(Header::decode_head(&good).is_ok());
        let mut b = good;
        b[36] = 0xFE;
        assert!(
            Header::decode_head(&b).is_err(),
            "body_len field not 0xFFFFFFFF"
        );
        for small in [0u64, 1, u64::from(u32::MAX)] {
            let mut b = good;
            b[40..48].copy_from_slice(&small.to_le_bytes());
            assert!(Header::decode_head(&b).is_err(), "extension {small}");
        }
        for cut in [40, 41, 47] {
            assert!(Header::decode_head(&good[..cut]).is_err(), "cut at {cut}");
        }
        // FLAG_LONG set by hand on a short body: the mark is missing
        let mut b = long_request(10).encode().to_vec();
        b[4] |= FLAG_LONG;
        b.extend_from_slice(&[0; 13]);
        assert!(Header::decode(&b).is_err());
    }

    #[test]
    fn continuation_and_credit_update_cannot_be_long() {
        for kind in [Kind::Continuation, Kind::CreditUpdate] {
            let mut h = Header::new(kind);
            h.body_len = 1 << 33;
            assert!(Header::decode_head(&h.encode()).is_err(), "{kind:?}");
        }
    }

    #[test]
    fn huge_announced_lengths_do_not_overflow() {
        let mut h = long_request(u64::MAX);
        h.meta_len = u32::MAX;
        let b = h.encode();
        assert_eq!(Header::decode_head(&b).unwrap().message_len(), u64::MAX);
        assert!(Header::decode(&b).is_err());
    }
}
