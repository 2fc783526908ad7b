//! Link set-up on the TCP connection: HELLO, transport choice, QP handshake ([`crate::wire::hello`]).
//!
//! The client offers its devices; the server arms the client's nonce on its own devices and
//! answers with theirs; the client probes pairs (local device × server device, in preference
//! order: hardware before the soft device) and picks the first that reaches. The TCP connection
//! stays open: as the control channel of an RDMA link, or as the TCP link itself.
//!
//! Which local devices a client offers ([`candidates`]): none under `tcp`; under `rdma` the
//! hardware devices when the host has one (the soft device only where none exists, or with
//! `Config::allow_soft`); under `auto` all, hardware first. A hardware device refused for a
//! configuration error (an invalid `BX_GID_INDEX`) fails the set-up under `auto` and `rdma`
//! alike, naming the index, the device and its valid entries: the link never moves to another
//! device because of it. Each side logs one `info` line per link set up: peer, transport,
//! device, and why a faster path was not taken.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use byteexpress_flow::credit::QueueConfig;
use byteexpress_flow::window::{AdaptiveConfig, Window};
use byteexpress_mem::{BufPool, LargePool, Pool, PoolConfig};
use byteexpress_tcp_fallback::{FrameConfig, FrameReader, FrameWriter};
use byteexpress_verbs::{Access, ConnectAttr, Context, DeviceInfo, Endpoint, QpCap};
use tokio::net::TcpStream;

use crate::Config;
use crate::engine::keepalive::Liveness;
use crate::engine::rdma::{self, RdmaParts};
use crate::engine::{Dispatch, LinkTx, control, tcp};
use crate::error::{NoRdma, SetupError, WhoSet};
use crate::link_io::{LinkRead, LinkStream, LinkWrite};
use crate::link_state::{LinkEvent, LinkMachine};
use crate::wire::CONN_MAGIC;
use crate::wire::header::LONG_HEADER_LEN;
use crate::wire::hello::{HELLO_VERSION, Hello, MAX_STREAM_WINDOW, TransportPref};

type Reader = FrameReader<LinkRead>;
type Writer = FrameWriter<LinkWrite>;

/// The devices of this host as set-up sees them, opened once per process.
pub(crate) struct LocalDevices {
    /// Devices that opened, in preference order (hardware first), with `is_hardware`.
    pub usable: Vec<(Context, bool)>,
    /// Devices that did not open: name, `is_hardware`, and the error.
    pub refused: Vec<(String, bool, byteexpress_verbs::Error)>,
}

impl LocalDevices {
    /// The first hardware device refused for a configuration error (invalid `BX_GID_INDEX`).
    fn config_error(&self) -> Option<&(String, bool, byteexpress_verbs::Error)> {
        self.refused
            .iter()
            .find(|(_, hw, e)| *hw && matches!(e, byteexpress_verbs::Error::InvalidArgument(_)))
    }

    fn has_hardware(&self) -> bool {
        self.usable.iter().any(|(_, hw)| *hw)
    }
}

/// Every device of this host, opened once per process, in preference order. Devices that fail
/// to open are kept in [`LocalDevices::refused`] (and logged).
pub(crate) fn local_devices() -> &'static LocalDevices {
    static DEVICES: OnceLock<LocalDevices> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let mut usable = Vec::new();
        let mut refused = Vec::new();
        for d in byteexpress_verbs::devices() {
            match d.open() {
                Ok(ctx) => usable.push((ctx, d.is_hardware())),
                Err(e) => {
                    tracing::warn!(device = d.name(), "device not usable: {e}");
                    refused.push((d.name().to_string(), d.is_hardware(), e));
                }
            }
        }
        LocalDevices { usable, refused }
    })
}

/// What `transport` means, in the words of whoever set it: `BX_TRANSPORT=…` when the
/// environment holds that value, else the caller's `Config::transport`.
fn who_set(cfg: &Config) -> WhoSet {
    let want = if cfg.allow_soft && cfg.transport == TransportPref::Rdma {
        "rdma-any"
    } else {
        match cfg.transport {
            TransportPref::Auto => "auto",
            TransportPref::Rdma => "rdma",
            TransportPref::Tcp => "tcp",
        }
    };
    match std::env::var("BX_TRANSPORT") {
        Ok(v) if crate::config::parse_transport(&v) == Some(cfg.transport) => WhoSet::Env(v),
        _ => WhoSet::Config(want),
    }
}

/// The local devices a client offers under `cfg`, in preference order, and why faster ones
/// were left out (`None` when none was). Errors: a hardware device refused for a
/// configuration error (module docs).
fn candidates(cfg: &Config) -> Result<(Vec<&'static Context>, Option<NoRdma>), SetupError> {
    if cfg.transport == TransportPref::Tcp {
        return Ok((Vec::new(), Some(NoRdma::Forced(who_set(cfg)))));
    }
    let local = local_devices();
    if let Some((name, _, e)) = local.config_error() {
        return Err(SetupError::DeviceConfig {
            device: name.clone(),
            source: e,
        });
    }
    let mut why = None;
    if local.usable.is_empty() {
        why = Some(if local.refused.is_empty() {
            NoRdma::NoDevice
        } else {
            NoRdma::NoneUsable(local.refused.iter().map(|(n, _, _)| n.clone()).collect())
        });
    } else if !local.has_hardware() {
        why = Some(NoRdma::NoHardware);
    }
    let hardware_only =
        cfg.transport == TransportPref::Rdma && !cfg.allow_soft && local.has_hardware();
    let devs = local
        .usable
        .iter()
        .filter(|(_, hw)| *hw || !hardware_only)
        .map(|(c, _)| c)
        .collect();
    Ok((devs, why))
}

async fn send(w: &mut Writer, m: &Hello) -> Result<(), SetupError> {
    w.write_frame(&[&m.encode()])
        .await
        .map_err(SetupError::Write)?;
    w.flush().await.map_err(SetupError::Write)
}

async fn recv(r: &mut Reader) -> Result<Hello, SetupError> {
    let frame = r
        .read_frame()
        .await
        .map_err(SetupError::Read)?
        .ok_or(SetupError::PeerClosed)?;
    if frame.starts_with(b"BX") {
        // an ERROR message instead of a set-up message
        let msg = crate::message::Incoming::parse(frame).map_err(SetupError::Garbled)?;
        return Err(SetupError::PeerError(tcp::peer_reason(&msg)));
    }
    Hello::decode(&frame).map_err(SetupError::Garbled)
}

/// QP attributes of a link. `rnr_retry` 0: credits guarantee a posted receive for every SEND,
/// so an RNR would be a bug and fails the QP instead of hiding behind retries. Ordering makes
/// this hold from the first SEND: each side posts its receives right after `connect`, the
/// server before it sends RDMA_ACCEPT, the client before its first request (and the server
/// sends nothing but answers). timeout 14 (≈ 67 ms) × (retry_cnt 6 + 1) ≈ 0.5 s to declare a
/// silent peer or a dead path (RETRY_EXC_ERR, then the link falls back to TCP); the TCP control
/// connection usually reports a dead peer sooner. `retry_cnt` is 6, not 7: rxe retries a QP whose
/// `retry_cnt` is 7 forever (DESIGN.md 7, checked in the Soft-RoCE VM), so a dropped RoCE path
/// would never fail the QP there and the link would never fall back. `access` REMOTE_READ
/// (`qp_access_flags`): the peer READs the messages lent to it by rendezvous, each through an
/// rkey over exactly that message's bytes (a memory window or an MR of its own, DESIGN.md 3.5
/// "Rendezvous"); no pool of the link grants remote access itself, and the QP refuses every
/// RDMA WRITE (least access).
fn connect_attr() -> ConnectAttr {
    ConnectAttr {
        access: Access::REMOTE_READ,
        min_rnr_timer: 1,
        timeout: 14,
        retry_cnt: 6,
        rnr_retry: 0,
        ..ConnectAttr::default()
    }
}

/// Moves the link's QP to RTS towards `ep` and posts its `grant + 1` receives.
fn connect_qp(
    parts: &mut RdmaParts,
    ep: &Endpoint,
    grant: u32,
) -> Result<rdma::Posted, SetupError> {
    parts.grant = grant;
    parts
        .qp
        .connect(ep, &connect_attr())
        .map_err(SetupError::QpConnect)?;
    rdma::post_initial_receives(parts)
}

/// The verbs objects of one RDMA link.
fn build_rdma(
    ctx: &'static Context,
    cfg: &Config,
    peer_recv_buf: usize,
) -> Result<RdmaParts, SetupError> {
    let v = |source| SetupError::Verbs {
        device: ctx.name(),
        source,
    };
    let m = SetupError::Buffers;
    let pd = ctx.alloc_pd().map_err(v)?;
    let recv_count = (cfg.grant as usize + 1) * 3;
    // One send slot and CQ entry more than the engine posts: the drain WR a failed QP gets
    // (`failover.rs`), whose flush hands back every SEND still held.
    let cq_size = cfg.max_send_wr.saturating_add(1 + recv_count as u32);
    let cq = ctx.create_cq(cq_size).map_err(v)?;
    let attr = ctx.query();
    // Small SENDs go inline (the engine reads what the device granted from `qp.cap()`).
    let cap = QpCap {
        max_send_wr: cfg.max_send_wr.saturating_add(1),
        max_recv_wr: cfg.grant + 1,
        max_inline_data: rdma::INLINE_ASK.min(attr.max_inline_data),
        ..QpCap::default()
    };
    let qp = pd.create_qp(&cq, &cq, cap).map_err(v)?;
    // The link's only QP: a provider may then release what it kept for QPs made later (the
    // soft provider closes the PD's memfds once the peer has them: fds per link, issue 17).
    pd.finish_qps();
    let sends = qp.cap().max_send_wr - 1;
    let queues = QueueConfig::new(sends, cfg.grant + 1, cq_size - 1).map_err(SetupError::Queues)?;
    // Least access (DESIGN.md 3.2): no pool of a link grants a peer anything by address.
    // Receive buffers LOCAL_WRITE (the device writes SENDs into them), send buffers none.
    let recv_pool = BufPool::for_receives(&pd, cfg.recv_buf_size, recv_count).map_err(m)?;
    let send_pool = BufPool::for_sends(&pd, peer_recv_buf, sends as usize).map_err(m)?;
    let reassembly_pool = Pool::new(&pd, reassembly_config(ctx)).map_err(m)?;
    let chunk = cfg.max_chunk.min(peer_recv_buf);
    if chunk <= LONG_HEADER_LEN {
        // a long message's first chunk needs room after its 48-byte header
        return Err(SetupError::ChunkTooSmall {
            chunk,
            header: LONG_HEADER_LEN,
        });
    }
    // Rendezvous loans: memory windows where the device bounds a window by its range (the
    // MR then needs MW_BIND; LOCAL_WRITE as the conformance tests bind), else each loan an
    // MR of its own over a region registered with no access.
    let lend_windows = attr.mw_range_checked;
    let lend_access = if lend_windows {
        Access::LOCAL_WRITE | Access::MW_BIND
    } else {
        Access(0)
    };
    let lend_pool = LargePool::new(&pd, lend_access, true, cfg.rendezvous_cache_bytes);
    let read_pool = LargePool::new(&pd, Access::LOCAL_WRITE, false, cfg.rendezvous_cache_bytes);
    // A descriptor SEND (a long header and the descriptor) must fit a chunk; a threshold of
    // 0 turns rendezvous off.
    let rendezvous_threshold = (cfg.rendezvous_threshold > 0
        && chunk >= crate::wire::header::LONG_HEADER_LEN + crate::wire::rendezvous::DESCRIPTOR_LEN)
        .then_some(cfg.rendezvous_threshold);
    Ok(RdmaParts {
        pd: pd.clone(),
        rendezvous_threshold,
        lend_pool,
        lend_windows,
        max_lent: cfg.memory_budget as u64,
        read_pool,
        read_piece: attr.max_msg_sz.clamp(4096, rdma::read::READ_PIECE),
        max_reads: attr.max_reads_outstanding.max(1),
        qp,
        cq,
        queues,
        recv_pool,
        send_pool,
        reassembly_pool,
        grant: cfg.grant,
        busy_poll: cfg.busy_poll,
        poll_wake_cost: cfg.poll_wake_cost,
        chunk,
        max_message: cfg.max_message,
        window: link_window(cfg, chunk)?,
        device_window: rdma::device_window(ctx.name(), cfg.device_window_bytes),
        sched: cfg.sched,
        device: ctx.name(),
    })
}

/// The reassembly pool of a link: at most [`rdma::REASSEMBLY_POOL_BYTES`], LOCAL_WRITE only
/// (only this process's CPU writes and reads it; a peer reaches none of it by address).
fn reassembly_config(ctx: &Context) -> PoolConfig {
    PoolConfig {
        limit: rdma::REASSEMBLY_POOL_BYTES,
        access: Access::LOCAL_WRITE,
        ..PoolConfig::for_device(ctx)
    }
}

/// The QP window of an RDMA link sending chunks of at most `chunk` bytes: fixed at
/// `Config::window_bytes` (0 = unlimited), or adaptive between `chunk` and that when
/// `Config::window_target_delay` is set.
fn link_window(cfg: &Config, chunk: usize) -> Result<Window, SetupError> {
    let max = match cfg.window_bytes {
        0 => u64::MAX,
        cap => cap,
    };
    if cfg.window_target_delay.is_zero() {
        return Ok(Window::fixed(max).expect("non-zero cap"));
    }
    let target_us = u64::try_from(cfg.window_target_delay.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    let min = (chunk as u64).min(max);
    AdaptiveConfig::new(min, max, target_us)
        .map(Window::adaptive)
        .map_err(SetupError::Window)
}

/// Why a re-probe failed. Crate-private: it becomes the cause of the link's `ProbeFailed`
/// transition, and the REFUSE reason a server answers; the link itself goes on over TCP.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReprobeError {
    /// A re-probe offered by the server (only the client starts them).
    #[error("re-probes are started by the client")]
    NotClient,
    /// The server armed no nonce for the probe.
    #[error("no probe nonce from the server")]
    NoNonce,
    /// The server's device did not answer the probe: the path is still down.
    #[error("the server's device does not answer its probe")]
    Unreachable,
    /// Building or connecting the new QP, or posting its receives, failed.
    #[error("new QP")]
    Qp(#[source] SetupError),
    /// A set-up message in a re-probe does not decode.
    #[error("undecodable re-probe message")]
    Wire(#[source] crate::wire::WireError),
    /// The server sent SWITCH before this client sent its own.
    #[error("a SWITCH before this side's")]
    UnaskedSwitch,
    /// A set-up message of another type than the re-probe step expects.
    #[error("expected {0}")]
    Unexpected(&'static str),
    /// The peer's QP endpoint does not decode.
    #[error("peer QP endpoint")]
    Endpoint(#[source] byteexpress_verbs::Error),
    /// A receive-buffer size other than the link's.
    #[error("receive buffers of {got} bytes, the link's are {want}")]
    RecvBuf {
        /// The size offered.
        got: usize,
        /// The link's size.
        want: usize,
    },
    /// The server answered REFUSE.
    #[error("the server refused: {0}")]
    Refused(String),
    /// REPROBE could not be queued: the link closed.
    #[error("the link closed")]
    LinkClosed,
    /// A test fault holds the path down (`LinkFaults::block_reprobes`).
    #[cfg(feature = "test-hooks")]
    #[error("blocked by a test fault")]
    Blocked,
}

impl ReprobeError {
    /// The error with its causes, for a log line or a REFUSE reason.
    pub(crate) fn chain(&self) -> String {
        crate::status::chain(self)
    }
}

/// What a fallen-back RDMA link needs to take RDMA back (a re-probe, DESIGN.md 3.5 "Link
/// life"): the local device and settings its first QP was built with and, on the client, the
/// server device it reached. Both sides build a new QP on the same devices.
#[derive(Debug, Clone)]
pub(crate) struct Prober {
    ctx: &'static Context,
    /// The settings the link's QP was built with (on the server, with the client's
    /// receive-buffer size).
    cfg: Config,
    /// Client: the server device's `DeviceInfo` (probed again before each re-probe) and its
    /// index in HELLO_ACK's list. `None` on the server.
    server_dev: Option<(DeviceInfo, u8)>,
}

impl Prober {
    /// Whether this side starts re-probes (the client does; the server answers).
    pub(crate) fn is_client(&self) -> bool {
        self.server_dev.is_some()
    }

    /// First wait before a re-probe, the most it grows to (`Config::reprobe_backoff`,
    /// `Config::reprobe_backoff_max`), and the time limit of one (`Config::handshake_timeout`).
    pub(crate) fn timing(&self) -> (Duration, Duration, Duration) {
        (
            self.cfg.reprobe_backoff,
            self.cfg.reprobe_backoff_max.max(self.cfg.reprobe_backoff),
            self.cfg.handshake_timeout,
        )
    }

    /// Client: probes the server's device with `nonce` (armed by the server), builds a new QP
    /// and returns it with the SELECT_RDMA that offers it.
    pub(crate) fn offer(&self, nonce: u64) -> Result<(RdmaParts, Vec<u8>), ReprobeError> {
        let Some((info, dev)) = &self.server_dev else {
            return Err(ReprobeError::NotClient);
        };
        if !self.ctx.probe(info, nonce).unwrap_or(false) {
            return Err(ReprobeError::Unreachable);
        }
        let parts =
            build_rdma(self.ctx, &self.cfg, self.cfg.recv_buf_size).map_err(ReprobeError::Qp)?;
        let select = Hello::SelectRdma {
            device: *dev,
            grant: self.cfg.grant,
            recv_buf: self.cfg.recv_buf_size as u32,
            endpoint: parts.qp.endpoint().to_bytes(),
        };
        Ok((parts, select.encode()))
    }

    /// Client: connects `parts` to the server's answer (RDMA_ACCEPT) and posts its receives.
    pub(crate) fn complete(
        &self,
        parts: &mut RdmaParts,
        answer: &[u8],
    ) -> Result<rdma::Posted, ReprobeError> {
        let decoded = Hello::decode(answer).map_err(ReprobeError::Wire)?;
        let (grant, recv_buf, ep) = match decoded {
            Hello::RdmaAccept {
                grant,
                recv_buf,
                endpoint,
            } => (grant, recv_buf as usize, endpoint),
            Hello::Refuse { reason } => return Err(ReprobeError::Refused(reason)),
            _ => return Err(ReprobeError::Unexpected("RDMA_ACCEPT or REFUSE")),
        };
        if recv_buf != self.cfg.recv_buf_size {
            return Err(ReprobeError::RecvBuf {
                got: recv_buf,
                want: self.cfg.recv_buf_size,
            });
        }
        let ep = Endpoint::from_bytes(&ep).map_err(ReprobeError::Endpoint)?;
        connect_qp(parts, &ep, grant.min(self.cfg.grant)).map_err(ReprobeError::Qp)
    }

    /// Server: arms a fresh nonce on its device for the client's next re-probe.
    pub(crate) fn arm(&self) -> u64 {
        let nonce = rand::random::<u64>();
        self.ctx.expect_probe(nonce);
        nonce
    }

    /// Server: answers a client's SELECT_RDMA with a new QP connected to the client's, its
    /// receives posted, and the RDMA_ACCEPT to send back.
    pub(crate) fn answer(
        &self,
        select: &[u8],
    ) -> Result<(RdmaParts, rdma::Posted, Vec<u8>), ReprobeError> {
        let decoded = Hello::decode(select).map_err(ReprobeError::Wire)?;
        let Hello::SelectRdma {
            grant,
            recv_buf,
            endpoint,
            ..
        } = decoded
        else {
            return Err(ReprobeError::Unexpected("SELECT_RDMA"));
        };
        if recv_buf as usize != self.cfg.recv_buf_size {
            return Err(ReprobeError::RecvBuf {
                got: recv_buf as usize,
                want: self.cfg.recv_buf_size,
            });
        }
        let ep = Endpoint::from_bytes(&endpoint).map_err(ReprobeError::Endpoint)?;
        let mut parts =
            build_rdma(self.ctx, &self.cfg, recv_buf as usize).map_err(ReprobeError::Qp)?;
        let posted =
            connect_qp(&mut parts, &ep, grant.min(self.cfg.grant)).map_err(ReprobeError::Qp)?;
        let accept = Hello::RdmaAccept {
            grant: self.cfg.grant,
            recv_buf,
            endpoint: parts.qp.endpoint().to_bytes(),
        };
        Ok((parts, posted, accept.encode()))
    }
}

/// Sets `TCP_NODELAY` (a socket option: the same under TLS) and splits `stream` into frame
/// halves.
fn split(stream: LinkStream, cfg: &Config) -> (Reader, Writer) {
    let _ = stream.tcp().set_nodelay(true);
    let (r, w) = stream.into_split();
    let fc = FrameConfig {
        max_frame: cfg.max_message,
    };
    (FrameReader::new(r, fc), FrameWriter::new(w, fc))
}

/// Client side: connects to `addr`, negotiates, starts the engine. Returns the link and the
/// most calls the server runs at once on it (HELLO_ACK's `max_concurrent_calls`).
pub(crate) async fn connect(
    addr: &str,
    cfg: &Config,
    dispatch: Arc<dyn Dispatch>,
) -> Result<(LinkTx, u32), SetupError> {
    // Device choice comes first: a configuration error makes no connection at all.
    let (local, mut why) = candidates(cfg)?;
    let mut max_calls = 1;
    let fut = async {
        let connect_err = |source| SetupError::Connect {
            addr: addr.to_string(),
            source,
        };
        let stream = TcpStream::connect(addr).await.map_err(connect_err)?;
        // frames are written whole, so Nagle only adds latency
        let _ = stream.set_nodelay(true);
        // with TLS the handshake comes first, and everything below goes inside it
        #[cfg(feature = "tls")]
        let mut stream = match &cfg.tls {
            Some(tls) => crate::tls::connect(tls, addr, stream)
                .await
                .map_err(|source| SetupError::Tls {
                    peer: addr.to_string(),
                    source,
                })?,
            None => LinkStream::from(stream),
        };
        #[cfg(not(feature = "tls"))]
        let mut stream = LinkStream::from(stream);
        tokio::io::AsyncWriteExt::write_all(&mut stream, &CONN_MAGIC)
            .await
            .map_err(connect_err)?;
        let (mut r, mut w) = split(stream, cfg);
        let nonce = rand::random::<u64>();
        let devices = local.iter().map(|c| c.device_info().to_bytes()).collect();
        send(
            &mut w,
            &Hello::Hello {
                version: HELLO_VERSION,
                pref: cfg.transport,
                nonce,
                stream_window: cfg.stream_window.max(1),
                devices,
            },
        )
        .await?;
        let Hello::HelloAck {
            devices: remote,
            max_concurrent_calls,
            stream_window,
            ..
        } = recv(&mut r).await?
        else {
            return Err(SetupError::Unexpected("HELLO_ACK"));
        };
        max_calls = max_concurrent_calls;
        dispatch.peer_stream_window(stream_window.min(MAX_STREAM_WINDOW));
        let chosen = pick_device(&local, &remote, nonce);
        let Some((ctx, server_dev)) = chosen else {
            // Devices were offered and none reached the server: that is why the link is on
            // TCP, whatever left faster devices out before (a soft device refused by the
            // server's uid check was reported as "no hardware RDMA device").
            let why = if local.is_empty() { why } else { None };
            let why = why.unwrap_or_else(|| {
                if remote.is_empty() {
                    NoRdma::PeerOffersNone(addr.to_string())
                } else {
                    NoRdma::Unreachable {
                        local: local.iter().map(|c| c.name()).collect(),
                        addr: addr.to_string(),
                        remote: remote.len(),
                    }
                }
            });
            if cfg.transport == TransportPref::Rdma {
                let _ = send(
                    &mut w,
                    &Hello::Refuse {
                        reason: "client requires RDMA".into(),
                    },
                )
                .await;
                return Err(SetupError::RdmaRequired {
                    who: who_set(cfg),
                    addr: addr.to_string(),
                    why,
                });
            }
            send(&mut w, &Hello::SelectTcp).await?;
            log_link(false, addr, "tcp", "-", Some(&why));
            let machine = LinkMachine::new("client");
            let _ = machine.apply(LinkEvent::HelloTcp, &"SELECT_TCP sent");
            return Ok(tcp::spawn(
                r,
                w,
                cfg.max_message,
                dispatch,
                Liveness::from_config(cfg),
                machine,
            ));
        };
        let machine = LinkMachine::new("client");
        let _ = machine.apply(LinkEvent::HelloRdma, &format_args!("{} chosen", ctx.name()));
        let mut parts = build_rdma(ctx, cfg, cfg.recv_buf_size)?;
        let endpoint = parts.qp.endpoint().to_bytes();
        send(
            &mut w,
            &Hello::SelectRdma {
                device: server_dev as u8,
                grant: cfg.grant,
                recv_buf: cfg.recv_buf_size as u32,
                endpoint,
            },
        )
        .await?;
        let (grant, recv_buf, ep) = match recv(&mut r).await? {
            Hello::RdmaAccept {
                grant,
                recv_buf,
                endpoint,
            } => (grant, recv_buf as usize, endpoint),
            Hello::Refuse { reason } => {
                return Err(SetupError::Refused {
                    side: "server refused RDMA",
                    reason,
                });
            }
            _ => return Err(SetupError::Unexpected("RDMA_ACCEPT")),
        };
        let ep =
            Endpoint::from_bytes(&ep).map_err(|e| SetupError::PeerAddress("server endpoint", e))?;
        if recv_buf != cfg.recv_buf_size {
            return Err(SetupError::RecvBufMismatch {
                got: recv_buf,
                want: cfg.recv_buf_size,
            });
        }
        // Receives are posted before our first SEND, and the server sends only answers.
        let posted = connect_qp(&mut parts, &ep, grant.min(cfg.grant))?;
        if why.is_none() && cfg.transport == TransportPref::Rdma && !cfg.allow_soft {
            let skipped = local_devices().usable.len() - local.len();
            if skipped > 0 {
                why = Some(NoRdma::SoftSkipped(who_set(cfg)));
            }
        }
        log_link(false, addr, "rdma", ctx.name(), why.as_ref());
        let _ = machine.apply(LinkEvent::QpUp, &"QP connected");
        let info = DeviceInfo::from_bytes(&remote[server_dev])
            .map_err(|e| SetupError::PeerAddress("server device", e))?;
        let prober = Prober {
            ctx,
            cfg: cfg.clone(),
            server_dev: Some((info, server_dev as u8)),
        };
        Ok(control::start_rdma(
            parts,
            (r, w),
            dispatch,
            posted,
            Liveness::from_config(cfg),
            machine,
            prober,
        ))
    };
    let link = tokio::time::timeout(cfg.connect_timeout, fut)
        .await
        .unwrap_or_else(|source| {
            Err(SetupError::Timeout {
                peer: addr.to_string(),
                after: cfg.connect_timeout,
                source,
            })
        })?;
    Ok((link, max_calls))
}

/// The one `info` line of a link set up: `link set up` on the client, `link accepted` on the
/// server, with the peer, transport, device (`-` on TCP) and why a faster path was not taken
/// (quoted; `"-"` when none was passed over).
fn log_link(accepted: bool, peer: &str, transport: &str, device: &str, why: Option<&NoRdma>) {
    let why = why.map_or_else(|| "-".to_string(), ToString::to_string);
    if accepted {
        tracing::info!(%peer, %transport, %device, ?why, "link accepted");
    } else {
        tracing::info!(%peer, %transport, %device, ?why, "link set up");
    }
}

/// First (local device, index of server device) pair whose probe succeeds.
fn pick_device(
    local: &[&'static Context],
    remote: &[Vec<u8>],
    nonce: u64,
) -> Option<(&'static Context, usize)> {
    for &ctx in local {
        for (i, info) in remote.iter().enumerate() {
            let Ok(info) = DeviceInfo::from_bytes(info) else {
                continue;
            };
            match ctx.probe(&info, nonce) {
                Ok(true) => return Some((ctx, i)),
                Ok(false) => {}
                Err(e) => tracing::debug!(device = ctx.name(), "probe failed: {e}"),
            }
        }
    }
    None
}

/// Server side: runs set-up on a connection whose [`CONN_MAGIC`] was already read (inside
/// its TLS session, if it has one). Each link uses one receive-buffer size for both
/// directions: the client's.
pub(crate) async fn accept(
    stream: LinkStream,
    cfg: &Config,
    dispatch: Arc<dyn Dispatch>,
) -> Result<LinkTx, SetupError> {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let (mut r, mut w) = split(stream, cfg);
    let fut = async {
        let Hello::Hello {
            version,
            nonce,
            stream_window,
            ..
        } = recv(&mut r).await?
        else {
            return Err(SetupError::Unexpected("HELLO"));
        };
        dispatch.peer_stream_window(stream_window.min(MAX_STREAM_WINDOW));
        if version != HELLO_VERSION {
            send(
                &mut w,
                &Hello::Refuse {
                    reason: SetupError::Version(version).to_string(),
                },
            )
            .await?;
            return Err(SetupError::Version(version));
        }
        let local: Vec<&'static Context> = if cfg.transport == TransportPref::Tcp {
            Vec::new()
        } else {
            local_devices().usable.iter().map(|(c, _)| c).collect()
        };
        local.iter().for_each(|c| c.expect_probe(nonce));
        let devices = local.iter().map(|c| c.device_info().to_bytes()).collect();
        send(
            &mut w,
            &Hello::HelloAck {
                version: HELLO_VERSION,
                max_concurrent_calls: cfg.max_concurrent_calls.max(1),
                stream_window: cfg.stream_window.max(1),
                devices,
            },
        )
        .await?;
        match recv(&mut r).await? {
            Hello::SelectTcp if cfg.transport == TransportPref::Rdma => {
                send(
                    &mut w,
                    &Hello::Refuse {
                        reason: "server requires RDMA".into(),
                    },
                )
                .await?;
                Err(SetupError::ClientChoseTcp)
            }
            Hello::SelectTcp => {
                let why = if cfg.transport == TransportPref::Tcp {
                    NoRdma::Forced(who_set(cfg))
                } else {
                    NoRdma::ClientChoseTcp
                };
                log_link(true, &peer, "tcp", "-", Some(&why));
                Ok(None)
            }
            Hello::SelectRdma {
                device,
                grant,
                recv_buf,
                endpoint,
            } => {
                let ctx = *local
                    .get(device as usize)
                    .ok_or(SetupError::UnknownDevice)?;
                if recv_buf as usize > cfg.recv_buf_size {
                    let e = SetupError::RecvBufTooLarge {
                        got: recv_buf as usize,
                        max: cfg.recv_buf_size,
                    };
                    send(
                        &mut w,
                        &Hello::Refuse {
                            reason: e.to_string(),
                        },
                    )
                    .await?;
                    return Err(e);
                }
                let ep = Endpoint::from_bytes(&endpoint)
                    .map_err(|e| SetupError::PeerAddress("client endpoint", e))?;
                let mut scfg = cfg.clone();
                scfg.recv_buf_size = recv_buf as usize; // one buffer size per link: the client's
                let mut parts = build_rdma(ctx, &scfg, recv_buf as usize)?;
                // Receives are posted before RDMA_ACCEPT tells the client it may send.
                let posted = connect_qp(&mut parts, &ep, grant.min(cfg.grant))?;
                let accept = Hello::RdmaAccept {
                    grant: cfg.grant,
                    recv_buf,
                    endpoint: parts.qp.endpoint().to_bytes(),
                };
                send(&mut w, &accept).await?;
                log_link(true, &peer, "rdma", ctx.name(), None);
                let prober = Prober {
                    ctx,
                    cfg: scfg,
                    server_dev: None,
                };
                Ok(Some((parts, posted, prober)))
            }
            Hello::Refuse { reason } => Err(SetupError::Refused {
                side: "client",
                reason,
            }),
            _ => Err(SetupError::Unexpected("SELECT")),
        }
    };
    match tokio::time::timeout(cfg.handshake_timeout, fut).await {
        Ok(Ok(None)) => {
            let machine = LinkMachine::new("server");
            let _ = machine.apply(LinkEvent::HelloTcp, &"SELECT_TCP received");
            Ok(tcp::spawn(
                r,
                w,
                cfg.max_message,
                dispatch,
                Liveness::from_config(cfg),
                machine,
            ))
        }
        Ok(Ok(Some((parts, posted, prober)))) => {
            let machine = LinkMachine::new("server");
            let _ = machine.apply(
                LinkEvent::HelloRdma,
                &format_args!("{} chosen", prober.ctx.name()),
            );
            let _ = machine.apply(LinkEvent::QpUp, &"QP connected");
            Ok(control::start_rdma(
                parts,
                (r, w),
                dispatch,
                posted,
                Liveness::from_config(cfg),
                machine,
                prober,
            ))
        }
        Ok(Err(e)) => Err(e),
        Err(source) => Err(SetupError::Timeout {
            peer,
            after: cfg.handshake_timeout,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Least access (issue 22, DESIGN.md 3.2): a link's receive ring LOCAL_WRITE, its send ring
    /// nothing, its reassembly pool LOCAL_WRITE, its QP REMOTE_READ only (rendezvous READs,
    /// each through a per-message rkey); no pool grants REMOTE_WRITE or REMOTE_READ (the rings
    /// and the QP were `Access::ALL`, so a peer with a leaked rkey could WRITE into a receive
    /// buffer).
    #[test]
    fn a_links_pools_grant_no_remote_access_and_its_qp_only_remote_read() {
        let ctx: &'static Context = Box::leak(Box::new(
            byteexpress_verbs::soft_device()
                .expect("the soft device is always listed")
                .open()
                .unwrap(),
        ));
        let cfg = Config::default();
        let parts = build_rdma(ctx, &cfg, cfg.recv_buf_size).unwrap();
        assert_eq!(
            parts.recv_pool.access(),
            Access::LOCAL_WRITE,
            "receive ring"
        );
        assert_eq!(parts.send_pool.access(), Access(0), "send ring");
        assert_eq!(
            parts.reassembly_pool.config().access,
            Access::LOCAL_WRITE,
            "reassembly pool"
        );
        assert_eq!(
            connect_attr().access,
            Access::REMOTE_READ,
            "the QP grants READ (rendezvous) and nothing else"
        );
        for (what, a) in [
            ("receive", parts.recv_pool.access()),
            ("send", parts.send_pool.access()),
            ("reassembly", parts.reassembly_pool.config().access),
        ] {
            assert!(
                a.0 & (Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0) == 0,
                "{what} pool grants remote access: {a:?}"
            );
        }
    }
}
