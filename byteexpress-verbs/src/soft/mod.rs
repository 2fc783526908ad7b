//! The soft provider: RC QP semantics in userspace, between processes of one host and within
//! one process, with the data path of a NIC doing DMA (DESIGN.md, byteexpress-verbs).
//!
//! - [`device`]: the one device per process (`soft0`), its abstract Unix socket, its progress
//!   thread (listener, control channels, RNR and retry timers, peer death).
//! - [`pd`]: PDs, shared memory (`alloc_shared`, memfd) and MRs, announced to connected peers.
//! - [`qp`]: QP state machine, connect; [`send`]: the initiator (WRITE/READ copy engine, SEND
//!   descriptors); [`ack`]: completion on the peer's ACK; [`deliver`]: the receiver's copy of
//!   a SEND; [`stage`]: the
//!   staging region for SEND payloads a peer cannot read in place.
//! - [`cq`]: CQs: local completions plus the inbound rings of their QPs.
//! - [`fatal`]: QP and device fatal errors (no completion; an async event).
//! - [`srq`]: SRQs, lending receive WQEs in batches to the rings of their QPs.
//! - [`peer`]: what a QP knows of its peer (mapped ring and regions, MR table).
//! - [`trust`]: who may connect (uid allow-list) and who may be sent memory (probed pids);
//!   [`probes`]: the probe nonces the device expects (bounded).
//! - [`bell`]: doorbells a peer can neither block nor silence for another peer.
//! - [`ring`], [`shm`], [`sock`], [`wire`], [`timing`]: building blocks.

mod ack;
mod bell;
mod comp_slot;
mod cq;
mod deliver;
mod device;
mod fatal;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod mw;
mod pd;
mod peer;
mod peer_fd;
mod probes;
mod qp;
mod ring;
mod send;
mod shm;
mod sock;
mod srq;
mod stage;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
mod timing;
pub(crate) mod trust;
mod wire;

use crate::{Context, Result};

/// Name of the soft device.
pub(crate) const DEVICE_NAME: &str = "soft0";

/// Device limits, reported by `query()` and enforced.
pub(crate) mod limits {
    pub const MAX_QP_WR: u32 = 16 * 1024;
    pub const MAX_SGE: u32 = 16;
    pub const MAX_INLINE: u32 = 1024;
    pub const MAX_CQE: u32 = 1 << 20;
    pub const MAX_MR_SIZE: u64 = 1 << 40;
    pub const MTU: u32 = 4096;
    /// READs reported as outstanding per QP (`max_qp_init_rd_atom`): the soft provider
    /// executes a READ when it is posted, so this bounds nothing but what callers keep in flight.
    pub const MAX_RD_ATOMIC: u32 = 16;
    /// Regions / MRs a peer may announce on one connection.
    pub const MAX_PEER_REGIONS: usize = 1 << 16;
    /// Peer memory mapping budgets (a peer's regions are mapped into our address space and
    /// each takes one of the process's `vm.max_map_count` mappings). A link's PD announces a
    /// handful of arenas' regions (byteexpress-mem's pools: 2 MiB chunks, 256 MiB per pool by
    /// default, so about 128 regions a pool), far below these. A region over budget fails that
    /// peer's QP ([`super::peer`]).
    /// Region mappings per peer QP.
    pub const PEER_MAPS: u64 = 1024;
    /// Bytes of region mappings per peer QP (64 GiB).
    pub const PEER_MAP_BYTES: u64 = 64 << 30;
    /// Peer region mappings in the whole process, all peers together (of the default
    /// `vm.max_map_count`, 65 530).
    pub const PROCESS_PEER_MAPS: u64 = 16 * 1024;
    /// Bytes of peer region mappings in the whole process (16 TiB of the 128 TiB of a 47-bit
    /// address space).
    pub const PROCESS_PEER_MAP_BYTES: u64 = 16 << 40;
    /// Largest staging region a peer may send (bytes).
    pub const MAX_STAGE: u32 = 16 << 20;
}

/// Opens the process's soft device (the same context every time).
pub(crate) fn open() -> Result<Context> {
    Ok(Context {
        inner: device::device()?,
    })
}
