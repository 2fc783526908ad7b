//! Entry points for the `fuzz/` crate's targets (feature `fuzzing`, off by default): the
//! crate's private decoders, reachable from outside without making the wire protocol public.
//! Not a stable API; nothing outside `fuzz/` should use it.

use std::sync::Arc;

use bytes::Bytes;

use crate::Metadata;
use crate::budget::MemoryBudget;
use crate::engine::LinkTx;
use crate::engine::rdma::reassembly::Reassembly;
use crate::link_stats::LinkCounters;
use crate::message::{Incoming, Outgoing};
use crate::stream::Shared;

pub use crate::wire::header::{FLAG_LONG, FLAG_MORE, HEADER_LEN, Header, Kind, LONG_HEADER_LEN};
pub use crate::wire::hello::Hello;
pub use crate::wire::rendezvous::{DESCRIPTOR_LEN, Descriptor, FLAG_RENDEZVOUS};
pub use crate::wire::{CONN_MAGIC, WireError};

/// A whole message split into its header, metadata section and body (as the engines see it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The decoded header.
    pub header: Header,
    /// The metadata section (`meta_len` bytes).
    pub meta: Bytes,
    /// The body (`body_len` bytes).
    pub body: Bytes,
}

impl From<Incoming> for Message {
    fn from(m: Incoming) -> Self {
        Message {
            header: m.header,
            meta: m.meta,
            body: m.body,
        }
    }
}

/// Splits a received whole message (a TCP frame, or a one-chunk RDMA SEND): STREAM_* frames,
/// REQUEST, RESPONSE and the rest.
pub fn parse_message(msg: Bytes) -> Result<Message, WireError> {
    Incoming::parse(msg).map(Message::from)
}

/// Parses a metadata section: the head (path or status message) and the entries.
pub fn decode_meta(meta: &Bytes) -> Result<(String, Metadata), WireError> {
    crate::wire::meta::decode(meta)
}

/// Encodes a metadata section as the sender does.
pub fn encode_meta(head: &str, md: &Metadata) -> Vec<u8> {
    let mut v = Vec::with_capacity(crate::wire::meta::encoded_len(head, md));
    crate::wire::meta::encode(&mut v, head, md);
    v
}

/// The RDMA engine's reassembly of chunked messages, on the heap (no device), optionally with
/// a memory budget.
#[derive(Debug)]
pub struct Reassembler(Reassembly);

impl Reassembler {
    /// Messages of at most `max_message` bytes; `budget`: bytes of the memory budget, if any.
    pub fn new(max_message: usize, budget: Option<usize>) -> Self {
        let r = Reassembly::new(max_message, None, Arc::new(LinkCounters::default()));
        Reassembler(match budget {
            Some(b) => r.with_budget(MemoryBudget::new(b)),
            None => r,
        })
    }

    /// One chunk (a first chunk with [`FLAG_MORE`], or a CONTINUATION) as the engine hands it
    /// over: `h` decoded from the SEND, `payload` the bytes after the header. `Err` is the
    /// reassembly error's text (the link would be failed).
    pub fn on_chunk(&mut self, h: &Header, payload: &[u8]) -> Result<Option<Message>, String> {
        self.0
            .on_chunk(h, payload)
            .map(|m| m.map(Message::from))
            .map_err(|e| e.to_string())
    }

    /// First headers of messages refused for the budget since the last call.
    pub fn take_refused(&mut self) -> Vec<Header> {
        self.0.take_refused()
    }

    /// Messages started and not complete.
    pub fn in_progress(&self) -> usize {
        self.0.in_progress()
    }
}

/// The receiving end of one stream direction (what the link engine drives on STREAM_MESSAGE,
/// HALF_CLOSE / RESPONSE and what the application takes): numbering, reordering, the window.
pub struct StreamIn {
    shared: Arc<Shared>,
    rx: tokio::sync::mpsc::UnboundedReceiver<Outgoing>,
}

impl std::fmt::Debug for StreamIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamIn").finish_non_exhaustive()
    }
}

impl StreamIn {
    /// A stream with `window` bytes of receive window.
    pub fn new(window: u64) -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let link = LinkTx::new(tx, crate::Transport::Tcp, 1 << 20);
        StreamIn {
            shared: Shared::new(link, (1, 2), window, window),
            rx,
        }
    }

    /// Message `seq` arrived; `Err`: the stream fails with this code.
    pub fn on_message(&self, seq: u64, body: Bytes) -> Result<(), crate::Code> {
        self.shared.on_message(seq, body).map_err(|s| s.code)
    }

    /// The peer's end arrived after `count` messages.
    pub fn on_end(&self, count: u64) {
        self.shared.on_end(count, Ok(Metadata::new()), false);
    }

    /// What the application gets next: `None` nothing yet, `Some(Ok(None))` the end.
    pub fn take(&self) -> Option<Result<Option<Bytes>, crate::Code>> {
        self.shared.take().map(|r| r.map_err(|s| s.code))
    }

    /// Bytes granted back to the peer (WINDOW_UPDATE frames sent) since the last call.
    pub fn granted(&mut self) -> u64 {
        let mut n = 0;
        while let Ok(o) = self.rx.try_recv() {
            assert_eq!(
                o.header.kind,
                Kind::WindowUpdate,
                "only window updates are sent"
            );
            n += o.header.timeout_us;
        }
        n
    }
}
