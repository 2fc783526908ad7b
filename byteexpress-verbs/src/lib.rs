//! Safe RDMA verbs for ByteExpress: devices, PD, MR, memory windows, CQ, RC QP, SRQ and async
//! events, over two
//! providers chosen at run time.
//!
//! - `ibverbs`: rdma-core's libibverbs, loaded at run time through `rdma-mummy-sys`, so a binary
//!   built anywhere starts anywhere and reports "no RDMA device" instead of failing to link.
//! - `soft`: a userspace provider with the semantics of an RC QP between processes of one host
//!   (and within one process): memory shared through memfd, doorbells through eventfd, one copy
//!   per operation, done by the initiator at post time as a NIC's DMA would.
//!
//! Upper layers use only the types of this crate; nothing above it can tell which provider runs.
//! Semantics follow the verbs man pages (`ibv_post_send(3)`, `ibv_poll_cq(3)`,
//! `ibv_modify_qp(3)`); where the soft provider differs, its docs say so.

mod anon;
mod copy;
mod endpoint;
mod error;
mod events;
mod ibverbs;
mod objects;
mod provider;
mod soft;
mod srq;
mod types;
mod wr;

pub use anon::{AnonMap, page_size};
pub use copy::{STREAM_MIN, dma_copy};
pub use endpoint::{DeviceInfo, Endpoint, GidInfo};
pub use error::{Error, Result, WcStatus};
pub use events::AsyncEvents;
pub use objects::{Context, Cq, Mr, Mw, Pd, Qp, SharedMem, UserRegion};
pub use soft::trust::ALLOW_UIDS_ENV as SOFT_ALLOW_UIDS_ENV;
pub use srq::Srq;
pub use types::{
    Access, AsyncEvent, ConnectAttr, DeviceAttr, MwBind, QpCap, QpState, RecvWr, SendWr, Sge,
    SrqAttr, Wc, WcOpcode, WrOp,
};

/// Fault injection for this crate's own tests (feature `test-hooks`); not a stable API.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub use soft::test_hooks;

/// The soft provider's decoders, for the `fuzz/` crate's targets only (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use soft::fuzzing;

/// A device that can be opened.
#[derive(Debug, Clone)]
pub struct Device {
    name: String,
    kind: DeviceKind,
}

#[derive(Debug, Clone)]
enum DeviceKind {
    Ibverbs,
    Soft,
}

impl Device {
    /// Device name (`mlx5_0`, `rxe0`, `soft0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for a hardware (or kernel Soft-RoCE) device, false for the userspace soft provider.
    /// Upper layers use it only to order devices (hardware first) and to apply a user's
    /// choice between them (`BX_TRANSPORT=rdma` takes hardware when it exists), never to
    /// change how a device is driven.
    pub fn is_hardware(&self) -> bool {
        matches!(self.kind, DeviceKind::Ibverbs)
    }

    /// Opens the device (`ibv_open_device(3)`). The soft device is one per process; opening it
    /// again returns the same context.
    pub fn open(&self) -> Result<Context> {
        match self.kind {
            DeviceKind::Ibverbs => ibverbs::open(&self.name),
            DeviceKind::Soft => soft::open(),
        }
    }
}

/// Every device on this host, hardware (rdma-core) devices first, then the soft device `soft0`
/// unless `BX_SOFT=0`. rdma-core's "no RDMA" answers (ENOSYS, EOPNOTSUPP, an empty list) leave
/// only the soft device; [`ibverbs_devices`] reports them as [`Error::NoDevice`].
pub fn devices() -> Vec<Device> {
    let mut out: Vec<Device> = match ibverbs_devices() {
        Ok(names) => names
            .into_iter()
            .map(|name| Device {
                name,
                kind: DeviceKind::Ibverbs,
            })
            .collect(),
        Err(e) => {
            tracing::debug!("no rdma-core device: {e}");
            Vec::new()
        }
    };
    if std::env::var("BX_SOFT").map(|v| v != "0").unwrap_or(true) {
        out.push(Device {
            name: soft::DEVICE_NAME.to_string(),
            kind: DeviceKind::Soft,
        });
    }
    out
}

/// The userspace soft device `soft0` as [`devices`] lists it: `None` when `BX_SOFT=0` hides it.
/// For tests and hosts without an RDMA NIC; upper layers pick devices from [`devices`].
pub fn soft_device() -> Option<Device> {
    devices().into_iter().find(|d| !d.is_hardware())
}

/// Names of rdma-core devices (`ibv_get_device_list(3)`). Errors: [`Error::NoDevice`] when
/// libibverbs is absent, the kernel has no RDMA, or the list is empty.
pub fn ibverbs_devices() -> Result<Vec<String>> {
    ibverbs::device_names()
}
