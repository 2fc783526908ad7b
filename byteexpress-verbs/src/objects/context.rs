//! Context: an opened device.

use super::{Cq, Pd};
use crate::provider::{ContextImpl, PROVIDER_SOFT};
use crate::{DeviceAttr, DeviceInfo, Endpoint, GidInfo, Result};
use std::sync::{Arc, OnceLock};

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

    /// An [`Endpoint`](crate::Endpoint) of this device's provider built from the fields rdma-core's
    /// `rc_pingpong` exchanges (QPN, PSN, LID, GID) and an MTU in bytes, for peers that speak
    /// that format instead of [`Endpoint::to_bytes`](crate::Endpoint::to_bytes). Pass it to [`Qp::connect`](crate::Qp::connect) as usual.
    /// Errors: `Unsupported` on the soft device, whose endpoints also carry the peer device's
    /// socket address (use [`Endpoint::from_bytes`](crate::Endpoint::from_bytes) there).
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
