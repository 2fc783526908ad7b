//! Configuration of links, clients and servers.

use std::time::Duration;

use crate::wire::hello::TransportPref;

/// Settings of a client or server. [`Config::default`] reads `BX_TRANSPORT`.
#[derive(Debug, Clone)]
pub struct Config {
    /// Which transport to use (`BX_TRANSPORT=auto|rdma|rdma-any|tcp`, default auto). Forcing
    /// RDMA when no device reaches the peer is an error, never a silent fallback. Under `rdma`
    /// the link takes a hardware device (rdma-core: a NIC or kernel Soft-RoCE) when this host
    /// has one; the userspace soft device only where none exists, or with
    /// [`Config::allow_soft`] (`rdma-any`).
    pub transport: TransportPref,
    /// Size of each RDMA receive buffer in bytes (default 64 KiB): the largest single SEND the
    /// peer may post, so the upper bound of [`Config::max_chunk`].
    pub recv_buf_size: usize,
    /// Largest SEND on an RDMA link in bytes, 40-byte header included (default 64 KiB; the
    /// link uses at most the receive-buffer size, and more than 40). A message larger than
    /// this is cut into chunks of this size, one SEND and one credit each, reassembled by the
    /// receiver; a message that fits is one SEND and reaches the application zero copy.
    pub max_chunk: usize,
    /// Largest message in bytes, header (40 bytes, 48 for a body over 4 GiB − 1) + metadata +
    /// body (default 16 MiB; at most 2^62, `Config::validate`), on RDMA and TCP alike: a
    /// larger call or answer fails with RESOURCE_EXHAUSTED before it is sent. One the peer
    /// sends anyway fails that call only on TCP (refused unread, its bytes dropped as they
    /// arrive), and cuts off the link on RDMA (refused at its first chunk, before anything is
    /// allocated for it). Both sides of a link should use the same value.
    pub max_message: usize,
    /// Messages larger than this many bytes (40-byte header + metadata + body) go over RDMA by
    /// rendezvous (DESIGN.md 3.5 "Rendezvous"): copied once into memory lent to the peer for
    /// one RDMA READ, announced by one SEND of a descriptor, READ by the receiver straight
    /// into the buffer the application gets, released at the receiver's RELEASE; smaller ones
    /// go as SENDs (chunked above `max_chunk`). Default [`DEFAULT_RENDEZVOUS_THRESHOLD`];
    /// 0 = never (always chunks). Each side applies its own to what it sends; TCP ignores it.
    pub rendezvous_threshold: usize,
    /// Bytes of registered memory an RDMA link keeps for reuse after rendezvous, per
    /// direction (lent memory, and memory READ into), default 64 MiB: a message up to this
    /// size reuses memory already mapped and faulted in; larger ones map their own each time.
    pub rendezvous_cache_bytes: u64,
    /// Receive buffers posted for the peer's data (its send credits), default 16. One more is
    /// posted for its credit updates.
    pub grant: u32,
    /// SENDs a link's QP may have outstanding (WRs), default 64. The QP is created with one
    /// send slot more (`max_send_wr` + 1), kept for the drain WR a failed QP gets (DESIGN.md
    /// 3.5, "Link life").
    pub max_send_wr: u32,
    /// Software window of each RDMA link's QP: bytes posted and not yet completed, header
    /// included (default 256 KiB = 4 × the default `max_chunk`; 0 = unlimited). Beyond it,
    /// chunks wait in the link's scheduler. One chunk always passes an empty window.
    pub window_bytes: u64,
    /// Target completion delay of an adaptive window (default 0 = a fixed window of
    /// `window_bytes`). When set, each RDMA link's QP window adapts between one chunk
    /// (`max_chunk`) and `window_bytes` (0 = no upper bound): AIMD on the RTT of each SEND
    /// completion (post → CQE) against this target, in the spirit of Swift and Timely
    /// ([`byteexpress_flow::window::AdaptiveConfig`], default gains; µs resolution, at least
    /// 1 µs). It starts at the upper bound; completions above the target cut it, at most
    /// once per RTT; completions below let it grow by one 64 KiB step per window of completed
    /// bytes. [`LinkStats::window_cap`](crate::LinkStats::window_cap) shows where it stands.
    pub window_target_delay: Duration,
    /// Window shared by all RDMA links on one device in this process, in bytes in flight
    /// (default 0 = unlimited). The first link set up on a device fixes the device's cap.
    pub device_window_bytes: u64,
    /// How an RDMA link orders the chunks of its logical connections (default
    /// [`SchedMode::Fair`]).
    pub sched: SchedMode,
    /// Hybrid polling on RDMA links, a fixed budget: after its last work, a link's engine keeps
    /// polling its CQ and its callers' queue this long before it sleeps on the CQ's completion
    /// channel, whatever the traffic (default 0 = the adaptive policy of `poll_wake_cost`). It
    /// yields to the runtime between polls, so handlers, callers and timers on the same thread
    /// still run; the cost is CPU while polling. A sleeping engine pays a process wake-up
    /// (several µs) for each message that wakes it; polling saves that while messages come
    /// closer together than the budget.
    pub busy_poll: Duration,
    /// Adaptive hybrid polling on RDMA links (used while `busy_poll` is 0): the cost of one
    /// wake-up of a sleeping engine (default 8 µs: about 7.5 µs measured on the development
    /// VM). The engine keeps the running mean of the idle gaps between its rounds of work (a
    /// gap it slept through counted without the wake-up it paid) and, while that mean is
    /// shorter than this, polls for twice this after its last work before it sleeps;
    /// otherwise it sleeps at once, so a link without traffic costs no CPU. 0 = never poll
    /// (sleep at once). Polling pays only while work comes back sooner than a wake-up costs
    /// (ByteExpress design; issue 25 item 4); `LinkStats::idle_polls` and `engine_sleeps`
    /// show what it chose.
    pub poll_wake_cost: Duration,
    /// Time allowed for TCP connect plus link set-up (default 5 s).
    pub connect_timeout: Duration,
    /// Server: time a new connection has to send its whole protocol preface (default 10 s):
    /// the 8-byte [`CONN_MAGIC`](crate::CONN_MAGIC), or, on the facade's shared port, the 24
    /// bytes of the HTTP/2 client preface. Waited for by socket readiness, never polled. A
    /// connection that has not sent it in time is closed.
    pub detect_timeout: Duration,
    /// Server: time the client has to finish set-up after its preface: HELLO, the transport
    /// choice and the QP handshake (default 5 s). A connection that has not finished in time
    /// is closed (UNAVAILABLE "set-up timed out").
    pub handshake_timeout: Duration,
    /// Server: most connections held at once, in any state (default 16,384). A connection
    /// beyond it is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Server: most connections held at once from one remote IP address (default 1,024: the
    /// project's tests open up to 500 from 127.0.0.1). Beyond it, closed when accepted.
    pub max_connections_per_addr: usize,
    /// Bytes that messages still in transit may hold, across all links of a server (for
    /// clients: of the process, one budget per distinct value, shared by the client links set
    /// up with it): partly received TCP frames
    /// larger than 64 KiB and the buffers of messages reassembled from RDMA chunks, charged
    /// their whole size when their first bytes arrive (default 256 MiB). A message that does not fit is never
    /// buffered: its bytes are dropped as they arrive and the call fails RESOURCE_EXHAUSTED.
    pub memory_budget: usize,
    /// Server: most calls it runs at once on one link (default 1,024; at least 1). Announced
    /// to the client in HELLO_ACK, as HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS: the client
    /// queues calls beyond it (the wait counts against each call's deadline), and the server
    /// answers a call over it with RESOURCE_EXHAUSTED without running it.
    pub max_concurrent_calls: u32,
    /// Keepalive, as gRPC's `keepalive_time`: when nothing has arrived on a link for this long,
    /// a PING goes to the peer (default 30 s; zero = no pings). On a TCP link it is a message;
    /// on an RDMA link, a frame on its TCP control connection.
    pub keepalive_interval: Duration,
    /// Keepalive, as gRPC's `keepalive_timeout`: a PING with nothing heard back (its PONG or
    /// any message) within this long closes the link as dead, its calls fail UNAVAILABLE
    /// (default 20 s).
    pub keepalive_timeout: Duration,
    /// A link with no call in flight on which nothing at all arrived for this long (no
    /// message, chunk, PING or PONG) is closed (default 5 min; zero = never). A peer that
    /// answers keepalive pings, or an RDMA link whose QP carries messages, is never idle.
    pub idle_timeout: Duration,
    /// Per-stream window in bytes, each direction (default 1 MiB), as HTTP/2's
    /// SETTINGS_INITIAL_WINDOW_SIZE (RFC 9113 §6.5.2, §6.9): a stream's sender may have this
    /// many bytes (40 + body per message) sent and not yet taken by the receiving application,
    /// plus one message of any size when nothing is outstanding. A peer beyond it fails its
    /// stream RESOURCE_EXHAUSTED. This is the receive window: it is announced to the peer in
    /// set-up (HELLO, HELLO_ACK `stream_window`), which sends within it, while this side sends
    /// within the window the peer announced; the two may differ. 1..=2^62.
    pub stream_window: u64,
    /// Lets `transport = Rdma` take the userspace soft device (`soft0`) even when a hardware
    /// device exists (default false; `BX_TRANSPORT=rdma-any` sets it). `auto` always may,
    /// after the hardware devices.
    pub allow_soft: bool,
    /// An RDMA link whose QP failed runs on its TCP control connection (`tcp(fallback)`) and
    /// tries a new QP (a re-probe, started by the client) after this long (default 100 ms;
    /// zero = never: the link stays on TCP). Each failed re-probe doubles the wait, up to
    /// [`Config::reprobe_backoff_max`]; each is bounded by [`Config::handshake_timeout`].
    pub reprobe_backoff: Duration,
    /// The longest wait between two re-probes of a fallen-back link (default 30 s).
    pub reprobe_backoff_max: Duration,
    /// Client (feature `tls`): TLS on the links this config sets up (default `None`: plain
    /// TCP). The handshake (ALPN `bxrpc/1`) comes first on the TCP connection; the preface,
    /// set-up and every frame of the link's TCP connection travel inside it. RDMA messages do
    /// not (README, "TLS"). Servers take theirs from `Server::with_tls` /
    /// the facade's `ServerBuilder::tls_config`, not from here.
    #[cfg(feature = "tls")]
    pub tls: Option<crate::tls::ClientTlsConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            transport: transport_from_env().unwrap_or(TransportPref::Auto),
            recv_buf_size: 64 << 10,
            grant: 16,
            max_chunk: 64 << 10,
            max_message: 16 << 20,
            rendezvous_threshold: DEFAULT_RENDEZVOUS_THRESHOLD,
            rendezvous_cache_bytes: 64 << 20,
            max_send_wr: 64,
            window_bytes: 256 << 10,
            window_target_delay: Duration::ZERO,
            device_window_bytes: 0,
            sched: SchedMode::Fair,
            busy_poll: Duration::ZERO,
            poll_wake_cost: Duration::from_micros(8),
            connect_timeout: Duration::from_secs(5),
            detect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(5),
            max_connections: 16_384,
            max_connections_per_addr: 1024,
            memory_budget: 256 << 20,
            max_concurrent_calls: 1024,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(300),
            stream_window: 1 << 20,
            allow_soft: allow_soft_from_env(),
            reprobe_backoff: Duration::from_millis(100),
            reprobe_backoff_max: Duration::from_secs(30),
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// Default of [`Config::rendezvous_threshold`] in bytes: messages above it go by RDMA READ.
/// Chosen by measurement (`cargo bench -p integration-tests --bench rendezvous -- --sweep`,
/// DESIGN.md section 6: on the soft provider rendezvous passes chunks from 512 KiB up); a
/// 16 KiB parameter-server reply stays one SEND.
pub const DEFAULT_RENDEZVOUS_THRESHOLD: usize = 512 << 10;

/// Order in which an RDMA link posts the chunks of the messages waiting on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedMode {
    /// `byteexpress_flow::sched`: deficit round robin over logical connections (`conn_id`) on
    /// bytes, messages of one chunk in a latency class served first (at most 8 chunks in a row
    /// while bulk waits), multi-chunk messages in a bulk class. A small call waits behind at
    /// most one chunk of a bulk message.
    #[default]
    Fair,
    /// First in, first out over the same chunks, at both ends of the link: a message's chunks
    /// all go before the next message's, and the receiver copies each chunk as it polls it
    /// (Fair defers chunk copies until the single-chunk messages polled with them are
    /// delivered). No latency class anywhere: for comparison (benchmarks); a small call waits
    /// behind whole bulk messages. Each side applies its own mode to what it sends and
    /// receives.
    Fifo,
}

/// Parses `BX_TRANSPORT`. `None` when unset; an unknown value is reported and ignored.
pub fn transport_from_env() -> Option<TransportPref> {
    let v = std::env::var("BX_TRANSPORT").ok()?;
    match parse_transport(&v) {
        Some(t) => Some(t),
        None => {
            tracing::warn!("BX_TRANSPORT={v:?} is not auto|rdma|rdma-any|tcp; using auto");
            None
        }
    }
}

/// True when `BX_TRANSPORT=rdma-any` (see [`Config::allow_soft`]).
pub fn allow_soft_from_env() -> bool {
    std::env::var("BX_TRANSPORT").is_ok_and(|v| v.eq_ignore_ascii_case("rdma-any"))
}

/// `auto`, `rdma`, `rdma-any` (RDMA on any device, see [`Config::allow_soft`]) or `tcp`
/// (case-insensitive).
pub fn parse_transport(v: &str) -> Option<TransportPref> {
    match v.to_ascii_lowercase().as_str() {
        "auto" => Some(TransportPref::Auto),
        "rdma" | "rdma-any" => Some(TransportPref::Rdma),
        "tcp" => Some(TransportPref::Tcp),
        _ => None,
    }
}
