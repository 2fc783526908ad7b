//! The verbs objects upper layers hold. Each wraps a provider's implementation.
//!
//! Ownership follows the verbs rules: an MR keeps its PD and memory alive, a QP keeps its PD and
//! CQs alive, so dropping handles in any order never destroys an object still referred to.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, OnceLock};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::provider::{ContextImpl, CqImpl, MrImpl, PROVIDER_SOFT, PdImpl, QpImpl, SharedMemImpl};
use crate::{
    Access, ConnectAttr, DeviceAttr, DeviceInfo, Endpoint, GidInfo, QpCap, QpState, RecvWr, Result,
    SendWr, Wc,
};

/// An opened RDMA device (`ibv_open_device(3)`), from [`crate::devices`] / [`crate::Device::open`].
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) inner: Arc<dyn ContextImpl>,
}

impl Context {
    /// Device name (`mlx5_0`, `rxe0`, `soft0`).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Limits the device enforces (`ibv_query_device(3)`, `ibv_query_port(3)`).
    pub fn query(&self) -> DeviceAttr {
        self.inner.query()
    }

    /// What a peer needs to tell whether it can reach this device. Send it over the control
    /// channel; the peer passes it to [`Context::probe`].
    pub fn device_info(&self) -> DeviceInfo {
        self.inner.device_info()
    }

    /// Can this device reach the peer device `peer`? `nonce` must have been sent to the peer over
    /// the control channel and handed to its [`Context::expect_probe`] first, which proves that the
    /// device answering is the peer's and not a namesake elsewhere. `Ok(false)` = not reachable.
    pub fn probe(&self, peer: &DeviceInfo, nonce: u64) -> Result<bool> {
        self.inner.probe(peer, nonce)
    }

    /// Server side of [`Context::probe`]: accept probes that carry `nonce`.
    pub fn expect_probe(&self, nonce: u64) {
        self.inner.expect_probe(nonce)
    }

    /// The valid GIDs of the port (`ibv_query_gid_table(3)`, read at open); empty on the soft
    /// device, which has none.
    pub fn gids(&self) -> Vec<GidInfo> {
        self.inner.gids()
    }

    /// Index of the GID this device's QPs use as their source (`sgid_index`): chosen at open
    /// (see the crate docs; `BX_GID_INDEX` overrides it). `None` on the soft device.
    pub fn gid_index(&self) -> Option<u32> {
        self.inner.gid_index()
    }

    /// An [`Endpoint`] of this device's provider built from the fields rdma-core's
    /// `rc_pingpong` exchanges (QPN, PSN, LID, GID) and an MTU in bytes, for peers that speak
    /// that format instead of [`Endpoint::to_bytes`]. Pass it to [`Qp::connect`] as usual.
    /// Errors: `Unsupported` on the soft device, whose endpoints also carry the peer device's
    /// socket address (use [`Endpoint::from_bytes`] there).
    pub fn endpoint_for(
        &self,
        qpn: u32,
        psn: u32,
        lid: u16,
        gid: [u8; 16],
        mtu: u32,
    ) -> Result<Endpoint> {
        let provider = self.inner.device_info().provider;
        if provider == PROVIDER_SOFT {
            return Err(crate::Error::Unsupported(
                "soft endpoints carry a socket address; use Endpoint::from_bytes".into(),
            ));
        }
        Ok(Endpoint {
            provider,
            qpn,
            psn,
            lid,
            gid,
            mtu,
            addr: Vec::new(),
        })
    }

    /// Allocates a protection domain (`ibv_alloc_pd(3)`).
    pub fn alloc_pd(&self) -> Result<Pd> {
        Ok(Pd {
            inner: self.inner.alloc_pd()?,
        })
    }

    /// Creates a CQ of at least `cqe` entries with a completion channel (`ibv_create_cq(3)`).
    /// Completions beyond its size overrun it (CQ error), so size it for every WR that can be
    /// outstanding on the QPs that use it.
    pub fn create_cq(&self, cqe: u32) -> Result<Cq> {
        Ok(Cq {
            inner: self.inner.create_cq(cqe)?,
            fd: Arc::new(OnceLock::new()),
        })
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Debug, Clone)]
pub struct Pd {
    pub(crate) inner: Arc<dyn PdImpl>,
}

impl Pd {
    /// Allocates `len` bytes (rounded up to the page size) that peers may access remotely and
    /// that may back receive buffers on every provider (a memfd mapping on the soft provider,
    /// anonymous memory on NICs). Zero-filled.
    pub fn alloc_shared(&self, len: usize) -> Result<SharedMem> {
        Ok(SharedMem {
            inner: self.inner.alloc_shared(len)?,
        })
    }

    /// Registers `[offset, offset + len)` of `mem` as an MR with `access` (`ibv_reg_mr(3)`).
    /// Errors: `InvalidArgument` when the range is outside `mem` or larger than `max_mr_size`.
    pub fn reg_shared(
        &self,
        mem: &SharedMem,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Mr> {
        Ok(Mr {
            inner: self.inner.reg_shared(&mem.inner, offset, len, access)?,
            mem: mem.clone(),
        })
    }

    /// Creates an RC QP in RESET (`ibv_create_qp(3)`); `cap` may be rounded up, see [`Qp::cap`].
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, cap: QpCap) -> Result<Qp> {
        self.new_qp(send_cq, recv_cq, None, cap)
    }

    /// [`Pd::create_qp`], optionally attached to `srq` (see [`Pd::create_qp_with_srq`]).
    pub(crate) fn new_qp(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&crate::Srq>,
        cap: QpCap,
    ) -> Result<Qp> {
        let inner =
            self.inner
                .create_qp(&send_cq.inner, &recv_cq.inner, srq.map(|s| &s.inner), cap)?;
        Ok(Qp {
            inner,
            _pd: self.clone(),
            _cqs: [send_cq.clone(), recv_cq.clone()],
            _srq: srq.cloned(),
        })
    }
}

/// Memory from [`Pd::alloc_shared`]. Clones share one mapping; it is unmapped when the last clone
/// and every MR over it are dropped.
#[derive(Debug, Clone)]
pub struct SharedMem {
    pub(crate) inner: Arc<dyn SharedMemImpl>,
}

impl SharedMem {
    /// Start of the mapping in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// True when the length is 0 (never, for a successful allocation).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A registered memory region (`ibv_mr`). Keeps its memory mapped while alive.
#[derive(Debug, Clone)]
pub struct Mr {
    pub(crate) inner: Arc<dyn MrImpl>,
    mem: SharedMem,
}

impl Mr {
    /// Local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.inner.lkey()
    }
    /// Remote key, for peers' READ/WRITE.
    pub fn rkey(&self) -> u32 {
        self.inner.rkey()
    }
    /// Start address in this process.
    pub fn addr(&self) -> u64 {
        self.inner.addr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    /// True when the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The memory this MR covers part or all of.
    pub fn memory(&self) -> &SharedMem {
        &self.mem
    }
}

/// A completion queue with its completion channel, driven by tokio.
#[derive(Debug, Clone)]
pub struct Cq {
    pub(crate) inner: Arc<dyn CqImpl>,
    /// Registered with the tokio reactor on first [`Cq::ready`] (creating it needs a runtime).
    fd: Arc<OnceLock<AsyncFd<EventFd>>>,
}

/// The CQ's event fd; holds the CQ so the fd stays open while tokio watches it.
#[derive(Debug)]
struct EventFd(Arc<dyn CqImpl>);

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.event_fd()
    }
}

impl Cq {
    /// Moves up to `out.len()` completions into `out` (`ibv_poll_cq(3)`); returns how many.
    pub fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        self.inner.poll(out)
    }

    /// Waits until the CQ may have completions: spins on [`Cq::poll`]-able state for up to
    /// `spin` (hybrid polling; zero = none), then arms the CQ (`ibv_req_notify_cq(3)`) and
    /// sleeps on its completion channel under tokio. Returns at once if completions are queued.
    /// Call [`Cq::poll`] afterwards; a spurious wake-up returns with nothing queued.
    pub async fn ready(&self, spin: std::time::Duration) -> Result<()> {
        let t0 = std::time::Instant::now();
        loop {
            if self.inner.pending() {
                return Ok(());
            }
            if t0.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        if self.inner.arm()? {
            return Ok(());
        }
        let fd = match self.fd.get() {
            Some(fd) => fd,
            None => {
                // SAFETY: the fd belongs to the CQ that `EventFd` holds an Arc of, so it stays
                // open and the same for the AsyncFd's whole life.
                let fd = unsafe {
                    AsyncFd::register_with_interest(EventFd(self.inner.clone()), Interest::READABLE)
                }
                .map_err(|e| crate::Error::Os {
                    what: "AsyncFd::register",
                    source: e.into(),
                })?;
                let _ = self.fd.set(fd);
                self.fd.get().expect("set just above")
            }
        };
        let mut guard = fd.readable().await.map_err(|source| crate::Error::Os {
            what: "AsyncFd::readable",
            source,
        })?;
        self.inner.ack_event()?;
        guard.clear_ready();
        Ok(())
    }
}

/// An RC queue pair (`ibv_qp`). Keeps its PD, CQs and SRQ alive.
#[derive(Debug, Clone)]
pub struct Qp {
    pub(crate) inner: Arc<dyn QpImpl>,
    _pd: Pd,
    _cqs: [Cq; 2],
    _srq: Option<crate::Srq>,
}

impl Qp {
    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.inner.qp_num()
    }
    /// Current state (`ibv_query_qp(3)`).
    pub fn state(&self) -> QpState {
        self.inner.state()
    }
    /// Granted queue sizes (may exceed what was asked).
    pub fn cap(&self) -> QpCap {
        self.inner.cap()
    }
    /// What the peer needs to connect to this QP; send it over the control channel.
    pub fn endpoint(&self) -> Endpoint {
        self.inner.endpoint()
    }
    /// RESET→INIT→RTR→RTS towards `remote` with `attr` (`ibv_modify_qp(3)` three times).
    /// Errors: `InvalidState` unless in RESET; `InvalidArgument` for an endpoint of another
    /// provider; `Peer` when the peer cannot be reached.
    pub fn connect(&self, remote: &Endpoint, attr: &ConnectAttr) -> Result<()> {
        self.inner.connect(remote, attr)
    }
    /// Moves the QP to ERR: every outstanding WR completes with `WR_FLUSH_ERR`, in order.
    pub fn to_err(&self) -> Result<()> {
        self.inner.to_err()
    }
    /// Posts one send-queue WR (`ibv_post_send(3)`). Errors: `QueueFull` (ENOMEM) beyond
    /// max_send_wr, `InvalidState` before RTS and in SQD, `InvalidArgument` beyond max_send_sge /
    /// max_inline_data. On error nothing was posted.
    ///
    /// The memory named by the SGEs must stay untouched until the WR's completion (or the
    /// completion of a later signaled WR); the device only ever touches memory inside
    /// registered MRs, which stay mapped while the MR lives.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        self.inner.post_send(wr)
    }
    /// Posts one receive WR (`ibv_post_recv(3)`). Errors: `QueueFull` (ENOMEM) beyond
    /// max_recv_wr, `InvalidState` in RESET, `InvalidArgument` beyond max_recv_sge. In ERR the
    /// WR completes with `WR_FLUSH_ERR`, after every earlier WR of the receive queue. (On
    /// rdma-core devices "in ERR" means known to this process: after [`Qp::to_err`] or once an
    /// error completion of the QP was polled; a receive posted in between may never complete
    /// on rxe, which does not flush receives posted in ERR.)
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        self.inner.post_recv(wr)
    }
}
