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
use crate::{Error, Sge};

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
    /// Errors: `InvalidArgument` when the range is empty, outside `mem` or larger than
    /// `max_mr_size`.
    pub fn reg_shared(
        &self,
        mem: &SharedMem,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Mr> {
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > mem.len()) {
            return Err(Error::InvalidArgument(format!(
                "MR [{offset}, +{len}) outside memory of {} bytes (ibv_reg_mr(3) needs a \
                 non-empty range)",
                mem.len()
            )));
        }
        Ok(Mr::new(
            self.inner.reg_shared(&mem.inner, offset, len, access)?,
            mem.clone(),
        ))
    }

    /// Registers memory this crate did not allocate: all of `region` as one MR with `access`
    /// (`ibv_reg_mr(3)`). The MR holds `region` (and so its owner): the memory stays mapped
    /// until the MR and every other clone of the region are dropped.
    ///
    /// Errors: `InvalidArgument` for an empty region, a region larger than `max_mr_size`, or
    /// write access (`LOCAL_WRITE`, `REMOTE_WRITE`) on a read-only region
    /// ([`UserRegion::new`]); `Unsupported` for remote access (`REMOTE_*`) on a device whose
    /// [`DeviceAttr::remote_access_needs_shared`] is true (the soft provider: peers can reach only
    /// memory from [`Pd::alloc_shared`]); `Os` when the device refuses (`ENOMEM`/`EPERM` for
    /// RLIMIT_MEMLOCK on NICs).
    ///
    /// On the soft provider such an MR serves as the source of SEND and RDMA_WRITE and as the
    /// destination of RDMA_READ (with `LOCAL_WRITE`), but never as a receive buffer, which the
    /// peer writes into: [`Qp::post_recv`] refuses it with `Unsupported`.
    pub fn reg_user(&self, region: UserRegion, access: Access) -> Result<Mr> {
        if region.is_empty() {
            return Err(Error::InvalidArgument(
                "empty region (ibv_reg_mr(3) needs length > 0)".into(),
            ));
        }
        let writes = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
        if access.0 & writes.0 != 0 && !region.inner.writable {
            return Err(Error::InvalidArgument(format!(
                "access {access:?} lets the device write into a read-only region \
                 (UserRegion::new); use UserRegion::new_mut"
            )));
        }
        Ok(Mr::new(
            self.inner.reg_user(&region.inner, access)?,
            SharedMem {
                inner: region.inner.clone(),
            },
        ))
    }

    /// Registers `[addr, addr + len)` of this process as an MR with `access` (`ibv_reg_mr(3)`),
    /// with no owner: see [`UserRegion::from_raw`] and [`Pd::reg_user`] (same errors).
    ///
    /// # Safety
    /// As for [`UserRegion::from_raw`]: the range must stay mapped, readable (and writable, when
    /// `access` lets the device write) and unaliased by Rust references the device could write
    /// through, until the returned MR and every clone of it are dropped.
    pub unsafe fn reg_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        // SAFETY: forwarded to the caller (this function's contract).
        let region = unsafe { UserRegion::from_raw(addr, len) };
        self.reg_user(region, access)
    }

    /// Creates an RC QP in RESET (`ibv_create_qp(3)`); `cap` may be rounded up, see [`Qp::cap`].
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, cap: QpCap) -> Result<Qp> {
        self.new_qp(send_cq, recv_cq, None, cap)
    }

    /// Declares that no QP will be created in this PD any more: later [`Pd::create_qp`] and
    /// [`Pd::create_qp_with_srq`] calls fail with `InvalidState`. MRs, shared memory and the
    /// PD's existing QPs are unaffected. A hint with no verbs counterpart: rdma-core devices
    /// only record it; the soft provider then closes each memfd of the PD once every QP of
    /// the PD has passed it to its peer (the mappings keep the memory), so a PD whose QPs are
    /// connected holds no fd for its memory (ByteExpress-rs issue 17: fds per link; DESIGN.md
    /// 3.1). Without it, the soft provider keeps one memfd open per PD, since a QP created
    /// later would have to pass the PD's regions to its own peer.
    pub fn finish_qps(&self) {
        self.inner.finish_qps();
    }

    /// [`Pd::create_qp`], optionally attached to `srq` (see [`Pd::create_qp_with_srq`]).
    pub(crate) fn new_qp(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&crate::Srq>,
        cap: QpCap,
    ) -> Result<Qp> {
        if self.inner.qps_finished() {
            return Err(crate::Error::InvalidState(
                "no QP can be created in this PD after Pd::finish_qps".into(),
            ));
        }
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

/// Source of unique [`UserRegion::id`]s.
static NEXT_REGION_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Memory the application owns, for [`Pd::reg_user`]: a `Vec<u8>`, `bytes::Bytes`, `Arc<[u8]>`,
/// a mapping handle — any owner whose bytes stay put while it lives. The region holds the owner,
/// and every MR over the region holds the region, so the memory cannot be freed or unmapped
/// while it is registered. Clones share the owner and the [`UserRegion::id`].
///
/// The address is read once, from the owner after it was moved into its final heap place (the
/// rule `bytes::Bytes::from_owner` relies on), and the owner is never touched again except to
/// drop it.
#[derive(Debug, Clone)]
pub struct UserRegion {
    pub(crate) inner: Arc<UserMem>,
}

/// The state behind a [`UserRegion`].
pub(crate) struct UserMem {
    ptr: *mut u8,
    len: usize,
    /// Registration may grant the device write access ([`UserRegion::new_mut`], `from_raw`).
    pub(crate) writable: bool,
    id: u64,
    /// Dropped only after every MR over the region (they hold Arcs of this).
    _owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for UserMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserMem")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("writable", &self.writable)
            .field("id", &self.id)
            .field("owned", &self._owner.is_some())
            .finish()
    }
}

// SAFETY: `ptr` is only passed to the device (registration) and used by the soft provider through
// raw-pointer copies, like any registered memory; the owner itself is `Send + Sync` and is only
// dropped, never accessed.
unsafe impl Send for UserMem {}
// SAFETY: as for Send.
unsafe impl Sync for UserMem {}

impl SharedMemImpl for UserMem {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl UserRegion {
    fn build(
        ptr: *mut u8,
        len: usize,
        writable: bool,
        owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> UserRegion {
        UserRegion {
            inner: Arc::new(UserMem {
                ptr,
                len,
                writable,
                id: NEXT_REGION_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                _owner: owner,
            }),
        }
    }

    /// A read-only region over the bytes of `owner` (`owner.as_ref()`): it may be the source of
    /// sends and writes and be read remotely, never written by the device.
    pub fn new<T: AsRef<[u8]> + Send + Sync + 'static>(owner: T) -> UserRegion {
        let owner = Box::new(owner);
        let bytes: &[u8] = (*owner).as_ref();
        let (ptr, len) = (bytes.as_ptr().cast_mut(), bytes.len());
        Self::build(ptr, len, false, Some(owner))
    }

    /// A writable region over the bytes of `owner` (`owner.as_mut()`): registration may also
    /// grant `LOCAL_WRITE`/`REMOTE_WRITE`. The owner is out of reach from then on, so the device
    /// writes into memory no Rust reference points at.
    pub fn new_mut<T: AsMut<[u8]> + Send + Sync + 'static>(owner: T) -> UserRegion {
        let mut owner = Box::new(owner);
        let bytes: &mut [u8] = (*owner).as_mut();
        let (ptr, len) = (bytes.as_mut_ptr(), bytes.len());
        Self::build(ptr, len, true, Some(owner))
    }

    /// A writable region over `[addr, addr + len)` with no owner.
    ///
    /// # Safety
    /// The range must stay mapped, readable and writable, with no Rust reference to it that a
    /// device write could invalidate, until every clone of the region and every MR over it are
    /// dropped.
    pub unsafe fn from_raw(addr: *mut u8, len: usize) -> UserRegion {
        Self::build(addr, len, true, None)
    }

    /// Start address in this process.
    pub fn addr(&self) -> u64 {
        self.inner.ptr as u64
    }

    /// Start of the region, for reading it (or writing, when it is writable and no WR uses it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True when the region has no bytes (it cannot be registered).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// True for [`UserRegion::new_mut`] and [`UserRegion::from_raw`] regions.
    pub fn is_writable(&self) -> bool {
        self.inner.writable
    }

    /// Identity of the owner: unique per [`UserRegion::new`] / `new_mut` / `from_raw` call in this
    /// process and shared by clones, so a different owner at the same address has another id.
    pub fn id(&self) -> u64 {
        self.inner.id
    }
}

/// A registered memory region (`ibv_mr`). Keeps its memory mapped while alive.
#[derive(Debug, Clone)]
pub struct Mr {
    /// The registration, held: the MR is deregistered when its last handle drops.
    _reg: Arc<dyn MrImpl>,
    mem: SharedMem,
    /// Copies of what the registration reports, which never changes after registration: every
    /// message builds SGEs from them, without a call through `dyn MrImpl`.
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
}

impl Mr {
    fn new(reg: Arc<dyn MrImpl>, mem: SharedMem) -> Mr {
        Mr {
            lkey: reg.lkey(),
            rkey: reg.rkey(),
            addr: reg.addr(),
            len: reg.len(),
            _reg: reg,
            mem,
        }
    }

    /// Local key, for SGEs.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key, for peers' READ/WRITE.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Start address in this process.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The memory this MR covers part or all of (for [`Pd::reg_user`] MRs: the user region).
    pub fn memory(&self) -> &SharedMem {
        &self.mem
    }
    /// An SGE of `len` bytes at `offset` bytes into this MR; `None` when that range is not
    /// inside it.
    pub fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
        let end = offset.checked_add(len as usize)?;
        (end <= self.len()).then(|| Sge {
            addr: self.addr() + offset as u64,
            len,
            lkey: self.lkey(),
        })
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
        if self.inner.spin(spin) {
            return Ok(());
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
