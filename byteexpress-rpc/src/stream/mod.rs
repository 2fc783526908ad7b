//! Streams: gRPC client, server and bidirectional streaming over one call id of a link
//! (wire kinds STREAM_OPEN … WINDOW_UPDATE, `wire::header` "Streams"; gRPC's
//! `doc/PROTOCOL-HTTP2.md`: headers, length-delimited messages, trailers, half-close, RST).
//!
//! Each direction of a stream has a byte window the receiver grants, as HTTP/2's per-stream
//! flow control (RFC 9113 §5.2, §6.9 WINDOW_UPDATE): a sender has at most the receiver's
//! [`Config::stream_window`](crate::Config::stream_window), announced in set-up (HELLO /
//! HELLO_ACK `stream_window`, as SETTINGS_INITIAL_WINDOW_SIZE, §6.5.2), of bytes (40 + body
//! per message) sent and not granted back, except one message of any size when nothing is outstanding; the
//! receiver grants bytes back as the application takes messages. A reader that does not read
//! holds its writer back; a peer that sends beyond the window fails its stream
//! RESOURCE_EXHAUSTED. Messages are numbered per direction and delivered in order; the end of a
//! direction (HALF_CLOSE, the RESPONSE carrying the trailers) carries how many messages came
//! before it and is delivered after them.

pub(crate) mod client;
pub(crate) mod replay;
pub(crate) mod server;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit};

use crate::engine::LinkTx;
use crate::message::Outgoing;
use crate::wire::header::{FLAG_AFTER_HEADERS, HEADER_LEN, Kind};
use crate::{Code, Metadata, Status};

pub use client::{OpenStream, RequestSender, ResponseReceiver};
pub use server::{RequestReceiver, ResponseSender, StreamRequest, StreamService};

/// Window cost of a message of `len` body bytes.
pub(crate) fn cost(len: usize) -> u64 {
    (HEADER_LEN + len) as u64
}

/// One stream's state at one end: what arrived (in order) and what may still be sent.
pub(crate) struct Shared {
    pub(crate) link: LinkTx,
    pub(crate) key: (u32, u64),
    pub(crate) st: Mutex<State>,
    pub(crate) notify: Notify,
}

#[derive(Default)]
pub(crate) struct State {
    // inbound
    pub(crate) window: u64,
    pub(crate) next_seq: u64,
    pub(crate) reorder: BTreeMap<u64, Bytes>,
    pub(crate) queue: VecDeque<Bytes>,
    /// Bytes received and not yet granted back (taken or not).
    pub(crate) buffered: u64,
    /// Bytes taken by the application and not yet granted back.
    pub(crate) ungranted: u64,
    /// Messages the peer sent before its end of the stream, once that end arrived.
    pub(crate) end_at: Option<u64>,
    /// The peer's end: trailers (client side) or half-close (server side, empty), or its status.
    pub(crate) end: Option<Result<Metadata, Status>>,
    /// Initial metadata (client side), once STREAM_HEADERS arrived.
    pub(crate) headers: Option<Metadata>,
    /// Client side: a frame with `FLAG_AFTER_HEADERS` arrived, so STREAM_HEADERS was sent;
    /// nothing of the stream is delivered until it is here.
    pub(crate) headers_due: bool,
    /// The stream failed here (cancelled, deadline, link closed, window broken).
    pub(crate) failed: Option<Status>,
    /// Client side: the server's RESPONSE carried `FLAG_REFUSED` (refused before dispatch).
    pub(crate) refused: bool,
    // outbound
    pub(crate) send_window: u64,
    pub(crate) avail: i64,
    pub(crate) sent: u64,
    /// Sends fail with this once set (the stream ended or failed).
    pub(crate) out_closed: Option<Status>,
    /// The call's place under the server's concurrency limit (client side), freed at the end.
    pub(crate) permit: Option<OwnedSemaphorePermit>,
    /// Server side: a last message to carry in the RESPONSE, headers already sent.
    pub(crate) last: Option<Bytes>,
    pub(crate) headers_sent: bool,
}

impl State {
    /// Client side: the server sent headers that have not arrived yet (a later frame
    /// overtook them), so nothing of the stream may be delivered.
    pub(crate) fn awaiting_headers(&self) -> bool {
        self.headers_due && self.headers.is_none()
    }
}

impl Shared {
    /// A stream's state with `window` bytes of our own receive window (our
    /// `Config::stream_window`) and `send_window` bytes of the peer's (announced in set-up).
    pub(crate) fn new(link: LinkTx, key: (u32, u64), window: u64, send_window: u64) -> Arc<Shared> {
        let send_window = send_window.clamp(1, crate::wire::hello::MAX_STREAM_WINDOW);
        Arc::new(Shared {
            link,
            key,
            st: Mutex::new(State {
                window,
                send_window,
                avail: send_window as i64,
                ..State::default()
            }),
            notify: Notify::new(),
        })
    }

    fn frame(&self, kind: Kind, n: u64, body: Bytes) -> Outgoing {
        let mut o = Outgoing::new(kind, self.key.0, self.key.1, "", &Metadata::new(), body);
        o.header.timeout_us = n;
        o
    }

    /// A message arrived with sequence number `seq`. Errors: the peer broke the window or sent
    /// a number twice (the caller fails the stream with it).
    pub(crate) fn on_message(&self, seq: u64, body: Bytes) -> Result<(), Status> {
        let mut st = self.st.lock();
        if st.failed.is_some() || st.end_at.is_some_and(|e| seq >= e) {
            return Ok(());
        }
        let c = cost(body.len());
        if st.buffered > 0 && st.buffered + c > st.window {
            return Err(Status::new(
                Code::ResourceExhausted,
                format!(
                    "stream message of {c} bytes beyond the receiver's window of {} ({} \
                     outstanding)",
                    st.window, st.buffered
                ),
            ));
        }
        if seq < st.next_seq || st.reorder.contains_key(&seq) {
            return Err(Status::new(
                Code::Internal,
                format!("stream message number {seq} received twice"),
            ));
        }
        st.buffered += c;
        st.reorder.insert(seq, body);
        loop {
            let next = st.next_seq;
            let Some(b) = st.reorder.remove(&next) else {
                break;
            };
            st.queue.push_back(b);
            st.next_seq += 1;
        }
        drop(st);
        self.notify.notify_waiters();
        Ok(())
    }

    /// The peer's end of its direction arrived, after `count` messages.
    pub(crate) fn on_end(&self, count: u64, end: Result<Metadata, Status>, closes_out: bool) {
        let mut st = self.st.lock();
        if st.end_at.is_none() {
            st.end_at = Some(count);
            st.end = Some(end);
        }
        if closes_out {
            st.permit = None;
            if st.out_closed.is_none() {
                st.out_closed = Some(Status::new(Code::Cancelled, "the stream has ended"));
            }
        }
        drop(st);
        self.notify.notify_waiters();
    }

    /// Bytes granted back by the peer.
    pub(crate) fn on_window_update(&self, n: u64) {
        let mut st = self.st.lock();
        st.avail =
            (st.avail.saturating_add(n.min(i64::MAX as u64) as i64)).min(st.send_window as i64);
        drop(st);
        self.notify.notify_waiters();
    }

    /// Fails the stream here with `why` (sends and receives alike). Returns whether it was
    /// still running.
    pub(crate) fn fail(&self, why: Status) -> bool {
        let mut st = self.st.lock();
        let running = st.failed.is_none() && st.end.is_none();
        if st.failed.is_none() {
            st.failed = Some(why.clone());
        }
        if st.out_closed.is_none() {
            st.out_closed = Some(why);
        }
        st.permit = None;
        drop(st);
        self.notify.notify_waiters();
        running
    }

    /// The next received message, the end (`Ok(None)`) or the failure; `None` while nothing
    /// is there yet. Grants window back when the queue empties or half a window was taken.
    pub(crate) fn take(&self) -> Option<Result<Option<Bytes>, Status>> {
        let mut st = self.st.lock();
        if st.awaiting_headers() {
            return st.failed.clone().map(Err);
        }
        if let Some(b) = st.queue.pop_front() {
            let c = cost(b.len());
            st.buffered -= c;
            st.ungranted += c;
            if st.end_at.is_none()
                && st.failed.is_none()
                && (st.queue.is_empty() || st.ungranted >= st.window / 2)
            {
                let n = std::mem::take(&mut st.ungranted);
                let _ = self
                    .link
                    .send(self.frame(Kind::WindowUpdate, n, Bytes::new()));
            }
            return Some(Ok(Some(b)));
        }
        if let Some(f) = &st.failed {
            return Some(Err(f.clone()));
        }
        // `>=`: an end counting fewer messages than already arrived (a reset, a broken peer)
        // comes after those instead of never
        if st.end_at.is_some_and(|e| st.next_seq >= e) {
            return Some(match st.end.clone().expect("end with end_at") {
                Ok(_) => Ok(None),
                Err(s) => Err(s),
            });
        }
        None
    }

    /// Waits for [`Shared::take`] to have something.
    pub(crate) async fn next(&self) -> Result<Option<Bytes>, Status> {
        loop {
            let n = self.notify.notified();
            if let Some(r) = self.take() {
                return r;
            }
            n.await;
        }
    }

    /// Sends one message as `kind` once the window allows it. Errors: the stream ended or
    /// failed (its status), the link refused it (UNAVAILABLE, RESOURCE_EXHAUSTED).
    pub(crate) async fn send(&self, body: Bytes) -> Result<(), Status> {
        let c = cost(body.len()) as i64;
        loop {
            let n = self.notify.notified();
            {
                let mut st = self.st.lock();
                if let Some(s) = &st.out_closed {
                    return Err(s.clone());
                }
                if st.avail >= c || st.avail == st.send_window as i64 {
                    let seq = st.sent;
                    let mut f = self.frame(Kind::StreamMessage, seq, body);
                    if st.headers_sent {
                        f.header.flags |= FLAG_AFTER_HEADERS;
                    }
                    // a message the link refuses (over max_message, link closed) takes no
                    // number and no window
                    self.link.send(f)?;
                    st.avail -= c;
                    st.sent += 1;
                    return Ok(());
                }
            }
            n.await;
        }
    }

    /// Resolves when sends would fail (the stream ended or failed).
    pub(crate) async fn out_closed(&self) {
        loop {
            let n = self.notify.notified();
            if self.st.lock().out_closed.is_some() {
                return;
            }
            n.await;
        }
    }

    /// Sends the frame ending this side's direction (`kind`) with the count of messages sent.
    pub(crate) fn send_end(&self, kind: Kind) -> Result<(), Status> {
        let st = self.st.lock();
        if let Some(s) = &st.out_closed {
            return Err(s.clone());
        }
        self.link.send(self.frame(kind, st.sent, Bytes::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Transport;

    fn shared(window: u64) -> (Arc<Shared>, tokio::sync::mpsc::UnboundedReceiver<Outgoing>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let link = LinkTx::new(tx, Transport::Tcp, 1 << 20);
        (Shared::new(link, (1, 2), window, window), rx)
    }

    #[test]
    fn a_message_beyond_the_window_is_refused_unless_nothing_is_outstanding() {
        let (s, _rx) = shared(1000);
        // one message larger than the window passes an empty window
        s.on_message(0, Bytes::from(vec![0; 5000])).unwrap();
        let err = s.on_message(1, Bytes::from(vec![0; 10])).unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted);
        let (s, _rx) = shared(1000);
        s.on_message(0, Bytes::from(vec![0; 400])).unwrap();
        s.on_message(1, Bytes::from(vec![0; 400])).unwrap();
        assert_eq!(
            s.on_message(2, Bytes::from(vec![0; 400])).unwrap_err().code,
            Code::ResourceExhausted,
            "3 × 440 bytes > 1000"
        );
    }

    #[test]
    fn messages_are_delivered_in_number_order_and_the_end_after_them() {
        let (s, _rx) = shared(1 << 20);
        s.on_end(3, Ok(Metadata::new()), false);
        s.on_message(2, Bytes::from_static(b"c")).unwrap();
        assert!(s.take().is_none(), "message 0 not here yet");
        s.on_message(0, Bytes::from_static(b"a")).unwrap();
        s.on_message(1, Bytes::from_static(b"b")).unwrap();
        assert_eq!(
            s.on_message(3, Bytes::from_static(b"late")),
            Ok(()),
            "a number at or past the end's count: ignored"
        );
        for want in [&b"a"[..], b"b", b"c"] {
            assert_eq!(&s.take().unwrap().unwrap().unwrap()[..], want);
        }
        assert_eq!(s.take().unwrap(), Ok(None));
    }

    #[tokio::test]
    async fn messages_and_end_after_headers_wait_for_the_headers_that_they_overtook() {
        let (s, _rx) = shared(1 << 20);
        s.st.lock().headers_due = true; // a frame with FLAG_AFTER_HEADERS arrived first
        s.on_message(0, Bytes::from_static(b"a")).unwrap();
        s.on_end(1, Ok(Metadata::new()), false);
        assert!(s.take().is_none(), "held until the headers arrive");
        let mut md = Metadata::new();
        md.insert("x-h", Bytes::from_static(b"1")).unwrap();
        s.st.lock().headers = Some(md);
        assert_eq!(&s.take().unwrap().unwrap().unwrap()[..], b"a");
        assert_eq!(s.take().unwrap(), Ok(None));

        // the sender marks its messages once it sent headers
        let (tx, mut out) = shared(1 << 20);
        tx.send(Bytes::new()).await.unwrap();
        tx.st.lock().headers_sent = true;
        tx.send(Bytes::new()).await.unwrap();
        assert_eq!(
            out.recv().await.unwrap().header.flags & FLAG_AFTER_HEADERS,
            0
        );
        assert_ne!(
            out.recv().await.unwrap().header.flags & FLAG_AFTER_HEADERS,
            0
        );
    }

    #[test]
    fn an_end_counting_fewer_messages_than_arrived_is_delivered_after_them() {
        let (s, _rx) = shared(1 << 20);
        s.on_message(0, Bytes::from_static(b"a")).unwrap();
        s.on_message(1, Bytes::from_static(b"b")).unwrap();
        s.on_end(0, Err(Status::new(Code::ResourceExhausted, "reset")), true);
        assert_eq!(&s.take().unwrap().unwrap().unwrap()[..], b"a");
        assert_eq!(&s.take().unwrap().unwrap().unwrap()[..], b"b");
        assert_eq!(
            s.take().expect("the end, not a hang").unwrap_err().code,
            Code::ResourceExhausted
        );
    }

    #[test]
    fn a_number_received_twice_fails_the_stream() {
        let (s, _rx) = shared(1 << 20);
        s.on_message(1, Bytes::new()).unwrap();
        assert_eq!(
            s.on_message(1, Bytes::new()).unwrap_err().code,
            Code::Internal
        );
    }

    #[tokio::test]
    async fn taking_messages_grants_the_window_back_and_the_sender_waits_for_it() {
        let (rx_side, mut wire) = shared(1000);
        rx_side.on_message(0, Bytes::from(vec![0; 400])).unwrap();
        rx_side.on_message(1, Bytes::from(vec![0; 400])).unwrap();
        rx_side.take().unwrap().unwrap();
        assert!(
            wire.try_recv().is_err(),
            "no grant while the queue holds less than half taken"
        );
        rx_side.take().unwrap().unwrap();
        let grant = wire
            .try_recv()
            .expect("a WINDOW_UPDATE once the queue is empty");
        assert_eq!(grant.header.kind, Kind::WindowUpdate);
        assert_eq!(grant.header.timeout_us, 880);

        let (tx_side, mut out) = shared(1000);
        tx_side.send(Bytes::from(vec![0; 400])).await.unwrap();
        tx_side.send(Bytes::from(vec![0; 400])).await.unwrap();
        let third = tokio::spawn({
            let s = tx_side.clone();
            async move { s.send(Bytes::from(vec![0; 400])).await }
        });
        for n in 0..2 {
            assert_eq!(out.recv().await.unwrap().header.timeout_us, n);
        }
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "held at the window");
        tx_side.on_window_update(440);
        third.await.unwrap().unwrap();
        assert_eq!(out.recv().await.unwrap().header.timeout_us, 2);
    }
}
