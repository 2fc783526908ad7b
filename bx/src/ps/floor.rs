//! `floor/tcp`: the least a request/response protocol on kernel TCP costs for the same
//! parameter-server calls, the floor the other rows of `bx ps bench` are measured against.
//!
//! Built as issue 25 asks: the client keeps 4 TCP connections (`--workers`) with TCP_NODELAY
//! and multiplexes its calls on each by a call id; the server answers every complete frame of
//! a read in line, in the connection's one task (no task per call), and writes all the
//! answers of one read with one write; the client likewise sends the next calls of a read's
//! answers with one write. Same store ([`Store`]) and same encoding (the protobuf messages of
//! `proto/ps.proto`, [`byteexpress_ps::native`]) as the other rows.
//!
//! A frame is a 16-byte header, then the body: body length (u32), kind (u32: 1 Pull, 2 Push,
//! 0 the answer of a call, 3 its failure, the body then the message), call id (u64), all
//! little-endian. The client is closed-loop: each of its call slots sends its next call as
//! soon as its answer is in.

use std::sync::Arc;
use std::time::Duration;

use byteexpress_ps::native::{self, Method};
use byteexpress_ps::{KeyRing, Store};
use bytes::{Buf, Bytes, BytesMut};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// Bytes of a frame's header.
const HEADER: usize = 16;
/// Largest frame body accepted (a Pull of 64 Ki keys at dim 256 fits).
const MAX_BODY: usize = 80 << 20;
/// Frame kinds.
const KIND_ANSWER: u32 = 0;
const KIND_PULL: u32 = 1;
const KIND_PUSH: u32 = 2;
const KIND_FAILED: u32 = 3;

/// Why a floor connection or call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FloorError {
    /// The socket failed.
    #[error("floor/tcp socket: {0}")]
    Io(#[from] std::io::Error),
    /// A frame longer than `MAX_BODY` (80 MiB) or of an unknown kind.
    #[error("floor/tcp: bad frame (kind {kind}, {len} bytes)")]
    BadFrame {
        /// Its kind.
        kind: u32,
        /// Its body length.
        len: usize,
    },
    /// The server refused a call; its message.
    #[error("floor/tcp: call failed: {0}")]
    Failed(String),
    /// An answer of the wrong shape.
    #[error("floor/tcp: {0}")]
    Malformed(String),
    /// The peer closed the connection with calls outstanding.
    #[error("floor/tcp: connection closed with calls outstanding")]
    Closed,
}

/// Appends a frame to `out`.
fn put_frame(out: &mut Vec<u8>, kind: u32, id: u64, body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(body);
}

/// Takes the next complete frame off `buf`: (kind, id, body); `None` until one is complete.
/// Errors: a body above [`MAX_BODY`].
fn take_frame(buf: &mut BytesMut) -> Result<Option<(u32, u64, Bytes)>, FloorError> {
    if buf.len() < HEADER {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let kind = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if len > MAX_BODY {
        return Err(FloorError::BadFrame { kind, len });
    }
    if buf.len() < HEADER + len {
        buf.reserve(HEADER + len - buf.len());
        return Ok(None);
    }
    let mut head = buf.split_to(HEADER);
    head.advance(8);
    let id = head.get_u64_le();
    Ok(Some((kind, id, buf.split_to(len).freeze())))
}

/// Serves the floor protocol on `listener` for as long as the process runs, one task per
/// connection.
pub async fn serve(listener: TcpListener, store: Arc<Store>) -> std::io::Result<()> {
    loop {
        let (s, peer) = listener.accept().await?;
        s.set_nodelay(true)?;
        let store = store.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_connection(s, &store).await {
                tracing::debug!(%peer, "floor/tcp connection ended: {e}");
            }
        });
    }
}

/// One connection: read, answer every complete frame in line, write the answers at once.
async fn serve_connection(mut s: TcpStream, store: &Store) -> Result<(), FloorError> {
    let mut inbuf = BytesMut::with_capacity(256 << 10);
    let mut out = Vec::with_capacity(256 << 10);
    loop {
        if inbuf.capacity() - inbuf.len() < 64 << 10 {
            inbuf.reserve(256 << 10);
        }
        if s.read_buf(&mut inbuf).await? == 0 {
            return Ok(());
        }
        while let Some((kind, id, body)) = take_frame(&mut inbuf)? {
            let method = match kind {
                KIND_PULL => Method::Pull,
                KIND_PUSH => Method::Push,
                _ => {
                    return Err(FloorError::BadFrame {
                        kind,
                        len: body.len(),
                    });
                }
            };
            // the answer is encoded in place after its header, which is written last
            let at = out.len();
            out.extend_from_slice(&[0; HEADER]);
            let kind = match native::answer_into(store, method, body, &mut out) {
                Ok(()) => KIND_ANSWER,
                Err(e) => {
                    out.extend_from_slice(e.to_string().as_bytes());
                    KIND_FAILED
                }
            };
            let len = (out.len() - at - HEADER) as u32;
            out[at..at + 4].copy_from_slice(&len.to_le_bytes());
            out[at + 4..at + 8].copy_from_slice(&kind.to_le_bytes());
            out[at + 8..at + HEADER].copy_from_slice(&id.to_le_bytes());
        }
        if !out.is_empty() {
            s.write_all(&out).await?;
            out.clear();
        }
    }
}

/// Opens a floor connection to `addr` (TCP_NODELAY).
pub async fn connect(addr: &str) -> Result<TcpStream, FloorError> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// One call on its own on `s` (for the bench's check): the answer's body. Errors: the
/// socket, a refused call, a bad frame.
pub async fn call(s: &mut TcpStream, method: Method, body: &[u8]) -> Result<Bytes, FloorError> {
    let kind = match method {
        Method::Pull => KIND_PULL,
        Method::Push => KIND_PUSH,
    };
    let mut out = Vec::new();
    put_frame(&mut out, kind, 1, body);
    s.write_all(&out).await?;
    let mut inbuf = BytesMut::with_capacity(64 << 10);
    loop {
        if let Some((kind, _, body)) = take_frame(&mut inbuf)? {
            return match kind {
                KIND_ANSWER => Ok(body),
                _ => Err(FloorError::Failed(
                    String::from_utf8_lossy(&body).into_owned(),
                )),
            };
        }
        inbuf.reserve(64 << 10);
        if s.read_buf(&mut inbuf).await? == 0 {
            return Err(FloorError::Closed);
        }
    }
}

/// What one connection's calls should be.
#[derive(Debug, Clone)]
pub struct Load {
    /// Table pulled and pushed.
    pub table: &'static str,
    /// Values per row (an answer's `dim` must be it).
    pub dim: usize,
    /// Share of Pushes.
    pub push_ratio: f64,
    /// The gradients of a Push (keys per call × dim × 4 bytes).
    pub grads: Bytes,
}

/// What [`drive`] did: calls answered, and their latencies (µs) when recorded.
#[derive(Debug)]
pub struct Driven {
    /// Calls answered (and checked) before `until`.
    pub calls: u64,
    /// Their latencies, µs.
    pub hist: Histogram<u64>,
}

/// Drives `slots` calls in flight on `s` until `until`, keys from `ring`: sends one call per
/// slot, then for every read, checks each answer (a Pull's `dim` and length), records its
/// latency (from the write that sent it to the read that brought it) and sends that slot's
/// next call, the read's new calls in one write. Stops sending at `until` and returns when
/// every slot's last answer is in. Errors: the socket, a refused call, a malformed answer.
pub async fn drive(
    s: &mut TcpStream,
    slots: usize,
    ring: &KeyRing,
    load: &Load,
    until: Instant,
    seed: u64,
) -> Result<Driven, FloorError> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut hist = Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds");
    // per slot: when its call went, whether it is a Pull and of how many keys
    let mut sent: Vec<(Instant, bool, usize)> = Vec::with_capacity(slots);
    let mut out = Vec::with_capacity(64 << 10);
    let next = |out: &mut Vec<u8>, id: u64, rng: &mut SmallRng| {
        let keys = ring.next_keys().to_vec();
        let n = keys.len();
        if rng.random::<f64>() < load.push_ratio {
            let body = native::push_request(load.table, keys, load.grads.clone(), 0.01);
            put_frame(out, KIND_PUSH, id, &body);
            (false, n)
        } else {
            put_frame(out, KIND_PULL, id, &native::pull_request(load.table, keys));
            (true, n)
        }
    };
    for id in 0..slots {
        let (pull, n) = next(&mut out, id as u64, &mut rng);
        sent.push((Instant::now(), pull, n));
    }
    let t = Instant::now();
    sent.iter_mut().for_each(|s| s.0 = t);
    s.write_all(&out).await?;
    out.clear();
    let mut outstanding = slots;
    let mut calls = 0u64;
    let mut inbuf = BytesMut::with_capacity(256 << 10);
    while outstanding > 0 {
        if inbuf.capacity() - inbuf.len() < 64 << 10 {
            inbuf.reserve(256 << 10);
        }
        if s.read_buf(&mut inbuf).await? == 0 {
            return Err(FloorError::Closed);
        }
        let now = Instant::now();
        let mut resent = Vec::new();
        while let Some((kind, id, body)) = take_frame(&mut inbuf)? {
            let slot = sent
                .get(id as usize)
                .copied()
                .ok_or_else(|| FloorError::Malformed(format!("answer to unknown call {id}")))?;
            if kind != KIND_ANSWER {
                return Err(FloorError::Failed(
                    String::from_utf8_lossy(&body).into_owned(),
                ));
            }
            let (t0, pull, n) = slot;
            if pull {
                let (dim, values) = native::pull_response(body)
                    .map_err(|e| FloorError::Malformed(format!("pull answer: {e}")))?;
                if dim as usize != load.dim || values.len() != n * load.dim * 4 {
                    return Err(FloorError::Malformed(format!(
                        "pull: dim {dim} and {} bytes for {n} keys of dim {}",
                        values.len(),
                        load.dim
                    )));
                }
            }
            calls += 1;
            hist.saturating_record((now - t0).as_micros().max(1) as u64);
            if now < until {
                let (pull, n) = next(&mut out, id, &mut rng);
                resent.push((id as usize, pull, n));
            } else {
                outstanding -= 1;
            }
        }
        if !out.is_empty() {
            s.write_all(&out).await?;
            out.clear();
            let t = Instant::now();
            for (id, pull, n) in resent {
                sent[id] = (t, pull, n);
            }
        }
    }
    Ok(Driven { calls, hist })
}

/// How long [`drive`] may wait past `until` for the last answers.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_taken_whole_in_order_and_oversized_ones_refused() {
        let mut out = Vec::new();
        put_frame(&mut out, KIND_PULL, 7, b"abc");
        put_frame(&mut out, KIND_ANSWER, u64::MAX, b"");
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&out[..10]);
        assert!(take_frame(&mut buf).unwrap().is_none(), "half a header");
        buf.extend_from_slice(&out[10..18]);
        assert!(take_frame(&mut buf).unwrap().is_none(), "half a body");
        buf.extend_from_slice(&out[18..]);
        let (k, id, b) = take_frame(&mut buf).unwrap().unwrap();
        assert_eq!((k, id, &b[..]), (KIND_PULL, 7, &b"abc"[..]));
        let (k, id, b) = take_frame(&mut buf).unwrap().unwrap();
        assert_eq!((k, id, b.len()), (KIND_ANSWER, u64::MAX, 0));
        assert!(buf.is_empty());
        let mut big = BytesMut::new();
        big.extend_from_slice(&((MAX_BODY + 1) as u32).to_le_bytes());
        big.extend_from_slice(&[0; 12]);
        assert!(matches!(
            take_frame(&mut big),
            Err(FloorError::BadFrame { .. })
        ));
    }
}
