//! An opened rdma-core device: `ibv_open_device(3)`, its limits (`ibv_query_device(3)`,
//! `ibv_query_port(3)`), the selected GID, and the reachability answer for the link layer.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use rdma_mummy_sys as sys;

use super::gid::{self, GidEntry, LINK_LAYER_ETHERNET};
use super::{convert, cq::IbvCq, os_err, pd::IbvMr, pd::IbvPd};
use crate::events::EventHub;
use crate::provider::{ContextImpl, CqImpl, PROVIDER_IBVERBS, PdImpl};
use crate::{AsyncEvent, DeviceAttr, DeviceInfo, Error, GidInfo, QpCap, Result};

/// The port every QP of this provider uses (`port_num` of `ibv_modify_qp(3)`).
pub(crate) const PORT: u8 = 1;
/// Upper bound for `max_rd_atomic` / `max_dest_rd_atomic` (outstanding READs per QP).
const MAX_RD_ATOMIC: i32 = 16;
/// Largest GID table read.
const MAX_GIDS: usize = 4096;
/// `DeviceInfo` encoding version of this provider.
const INFO_VERSION: u8 = 1;
/// `version u8 | link_layer u8 | port u8 | gid_type u8 (0xff unknown) | lid u16 LE |
/// mtu u32 LE | gid [16]`.
const INFO_LEN: usize = 26;

/// The `ibv_context`, closed on drop.
#[derive(Debug)]
struct OwnedCtx(*mut sys::ibv_context);

impl Drop for OwnedCtx {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device and closed once; every PD, CQ, QP and MR of it holds
        // an Arc of the IbvContext that owns this, so none is left (ibv_close_device(3)).
        let rc = unsafe { sys::ibv_close_device(self.0) };
        if rc != 0 {
            tracing::warn!("ibv_close_device: {}", std::io::Error::last_os_error());
        }
    }
}

/// `vendor_id` of rxe (kernel Soft-RoCE: `RXE_VENDOR_ID`, drivers/infiniband/sw/rxe).
const RXE_VENDOR_ID: u32 = 0xff_ffff;

/// An opened device, its port-1 attributes and the GID its QPs use.
#[derive(Debug)]
pub(crate) struct IbvContext {
    me: Weak<IbvContext>,
    ctx: OwnedCtx,
    name: String,
    attr: DeviceAttr,
    /// `IBV_LINK_LAYER_*` of the port.
    pub(crate) link_layer: u8,
    /// The device is rxe (kernel Soft-RoCE, [`RXE_VENDOR_ID`]): its completions carry the
    /// kernel's flag bits ([`convert::KERNEL_WC_WITH_INVALIDATE`]) and its memory windows are
    /// bounded by their MR only ([`DeviceAttr::mw_range_checked`]).
    pub(crate) rxe: bool,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub(crate) lid: u16,
    /// Source GID and its index.
    pub(crate) gid: GidEntry,
    /// Every valid GID of the port, as read at open (for `Context::gids`).
    gid_table: Vec<GidEntry>,
    /// `max_qp_init_rd_atom`, capped: READs this side may have outstanding.
    pub(crate) max_rd_atomic: u8,
    /// `max_qp_rd_atom`, capped: READs a peer may have outstanding here.
    pub(crate) max_dest_rd_atomic: u8,
    /// Live MRs by lkey: inline data is read by the CPU at post time, so its SGEs must lie in
    /// registered (hence mapped) memory, as on the soft provider.
    pub(crate) mrs: Mutex<HashMap<u32, Weak<IbvMr>>>,
    /// Subscribers of the async events.
    events: EventHub,
    /// Serialises readers of the async fd, so events are raised in the device's order.
    event_reader: Mutex<()>,
}

// SAFETY: an `ibv_context` may be used from any thread (libibverbs serialises its own state;
// ibv_open_device(3) objects carry no thread affinity); it is closed once, in `OwnedCtx::drop`.
unsafe impl Send for OwnedCtx {}
// SAFETY: see `Send`; every verbs call on the context is thread-safe.
unsafe impl Sync for OwnedCtx {}

impl IbvContext {
    /// Opens `name` and reads its limits, port 1 and GID table.
    pub(crate) fn open(name: &str) -> Result<Arc<IbvContext>> {
        let ctx = open_by_name(name)?;
        // SAFETY: ibv_device_attr is plain C data; all-zero is a valid value.
        let mut dev: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `dev` is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_device(ctx.0, &mut dev) };
        if rc != 0 {
            return Err(os_err("ibv_query_device", Some(rc)));
        }
        // SAFETY: ibv_port_attr is plain C data; all-zero is a valid value.
        let mut port: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `port` is a valid out-pointer of the right size.
        let rc = unsafe { sys::ibv_query_port(ctx.0, PORT, &mut port) };
        if rc != 0 {
            return Err(os_err("ibv_query_port", Some(rc)));
        }
        let entries = read_gid_table(&ctx, port.gid_tbl_len);
        let forced = std::env::var(gid::GID_INDEX_ENV).ok();
        let gid = gid::select_on(name, &entries, port.link_layer, forced.as_deref())?;
        let max_inline_data = probe_max_inline(&ctx);
        // SAFETY: `ctx` is open; its async_fd is an fd of the context, and F_GETFL/F_SETFL only
        // change its status flags (ibv_get_async_event(3): a non-blocking fd may be used).
        let nonblock = unsafe {
            let fd = (*ctx.0).async_fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !nonblock {
            return Err(os_err("fcntl(O_NONBLOCK) on the async event fd", None));
        }
        let clamp = |v: i32| v.clamp(1, MAX_RD_ATOMIC) as u8;
        let rxe = dev.vendor_id == RXE_VENDOR_ID;
        let attr = DeviceAttr {
            max_qp_wr: u32::try_from(dev.max_qp_wr).unwrap_or(0),
            max_sge: u32::try_from(dev.max_sge).unwrap_or(0),
            max_inline_data,
            max_cqe: u32::try_from(dev.max_cqe).unwrap_or(0),
            max_mr_size: dev.max_mr_size,
            active_mtu: convert::mtu_bytes(port.active_mtu),
            remote_access_needs_shared: false,
            mw_range_checked: !rxe,
            max_msg_sz: u64::from(port.max_msg_sz),
            max_reads_outstanding: u32::from(clamp(dev.max_qp_init_rd_atom)),
        };
        tracing::debug!(
            "{name}: port {PORT} link layer {} lid {} gid index {} mtu {}",
            port.link_layer,
            port.lid,
            gid.index,
            attr.active_mtu
        );
        Ok(Arc::new_cyclic(|me| IbvContext {
            me: me.clone(),
            ctx,
            name: name.to_string(),
            attr,
            link_layer: port.link_layer,
            rxe,
            lid: port.lid,
            gid,
            gid_table: entries,
            max_rd_atomic: clamp(dev.max_qp_init_rd_atom),
            max_dest_rd_atomic: clamp(dev.max_qp_rd_atom),
            mrs: Mutex::new(HashMap::new()),
            events: EventHub::default(),
            event_reader: Mutex::new(()),
        }))
    }

    /// The raw context, valid while `self` lives.
    pub(crate) fn raw(&self) -> *mut sys::ibv_context {
        self.ctx.0
    }

    /// Active MTU of the port in bytes.
    pub(crate) fn active_mtu(&self) -> u32 {
        self.attr.active_mtu
    }

    /// True on RoCE (Ethernet link layer): addresses carry a GRH.
    pub(crate) fn is_roce(&self) -> bool {
        self.link_layer == LINK_LAYER_ETHERNET
    }

    /// A live MR that contains `[addr, addr + len)`: the one of `lkey` if it does, else any.
    pub(crate) fn mr_containing(&self, lkey: u32, addr: u64, len: u64) -> Option<Arc<IbvMr>> {
        let hit = |mr: &Arc<IbvMr>| mr.contains(addr, len);
        // Arcs upgraded under the lock are dropped after it: dropping the last one takes it.
        let (by_key, all) = {
            let mrs = self.mrs.lock();
            let by_key = mrs.get(&lkey).and_then(Weak::upgrade);
            let all: Vec<Arc<IbvMr>> = if by_key.as_ref().is_some_and(hit) {
                Vec::new()
            } else {
                mrs.values().filter_map(Weak::upgrade).collect()
            };
            (by_key, all)
        };
        by_key.filter(hit).or_else(|| all.into_iter().find(hit))
    }

    fn arc(&self) -> Result<Arc<IbvContext>> {
        self.me
            .upgrade()
            .ok_or_else(|| Error::InvalidState("device context is closing".into()))
    }
}

/// Opens the device called `name` from rdma-core's list.
fn open_by_name(name: &str) -> Result<OwnedCtx> {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(super::null_list_error(
            std::io::Error::last_os_error().raw_os_error(),
        ));
    }
    let mut found = std::ptr::null_mut();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: `list` holds `n` device pointers (ibv_get_device_list(3)).
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a listed device; its name is NUL-terminated and outlives the list.
        let dev_name = unsafe { sys::ibv_get_device_name(dev) };
        // SAFETY: non-NULL, NUL-terminated (checked first).
        if !dev_name.is_null() && unsafe { CStr::from_ptr(dev_name) }.to_bytes() == name.as_bytes()
        {
            found = dev;
            break;
        }
    }
    let ctx = if found.is_null() {
        Err(Error::NoDevice(format!(
            "no rdma-core device named {name:?}"
        )))
    } else {
        // SAFETY: `found` is a device of the live list; the context stays valid after the list
        // is freed (ibv_get_device_list(3): open the devices, then free the list).
        let ctx = unsafe { sys::ibv_open_device(found) };
        if ctx.is_null() {
            Err(os_err("ibv_open_device", None))
        } else {
            Ok(OwnedCtx(ctx))
        }
    };
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { sys::ibv_free_device_list(list) };
    ctx
}

/// The valid GIDs of [`PORT`]: `ibv_query_gid_table(3)` (with GID types), else entry by entry
/// with `ibv_query_gid(3)` (types unknown) on libraries without it.
fn read_gid_table(ctx: &OwnedCtx, len: i32) -> Vec<GidEntry> {
    let len = usize::try_from(len).unwrap_or(0).min(MAX_GIDS);
    // SAFETY: ibv_gid_entry is plain C data; all-zero is a valid value.
    let mut raw: Vec<sys::ibv_gid_entry> = vec![unsafe { std::mem::zeroed() }; len.max(1)];
    // SAFETY: `raw` has room for `len` entries; the context is open.
    let n = unsafe { sys::ibv_query_gid_table(ctx.0, raw.as_mut_ptr(), raw.len(), 0) };
    if let Ok(n) = usize::try_from(n) {
        return raw[..n.min(raw.len())]
            .iter()
            .filter(|e| e.port_num == u32::from(PORT))
            // SAFETY: `raw` is the only member every GID union value has.
            .map(|e| (e, unsafe { e.gid.raw }))
            .filter(|(_, g)| g.iter().any(|&b| b != 0))
            .map(|(e, g)| GidEntry {
                index: e.gid_index,
                gid: g,
                gid_type: Some(e.gid_type),
            })
            .collect();
    }
    let mut out = Vec::new();
    for i in 0..len {
        // SAFETY: ibv_gid is plain C data; all-zero is valid.
        let mut g: sys::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `g` is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_gid(ctx.0, PORT, i as i32, &mut g) };
        // SAFETY: `raw` is the only member every GID union value has.
        let g = unsafe { g.raw };
        if rc == 0 && g.iter().any(|&b| b != 0) {
            out.push(GidEntry {
                index: i as u32,
                gid: g,
                gid_type: None,
            });
        }
    }
    out
}

/// Largest inline size the device grants an RC QP with one SGE: rdma-core has no device
/// attribute for it (`ibv_create_qp(3)` reports it per QP), so a throw-away QP asks.
fn probe_max_inline(ctx: &OwnedCtx) -> u32 {
    // SAFETY: the context is open; every object created here is destroyed before returning,
    // QP before CQ and PD.
    unsafe {
        let pd = sys::ibv_alloc_pd(ctx.0);
        if pd.is_null() {
            return 0;
        }
        let cq = sys::ibv_create_cq(ctx.0, 2, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        let mut granted = 0;
        if !cq.is_null() {
            for want in [1024u32, 512, 256, 128, 64, 0] {
                let mut init: sys::ibv_qp_init_attr = std::mem::zeroed();
                init.send_cq = cq;
                init.recv_cq = cq;
                init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
                init.cap = sys::ibv_qp_cap {
                    max_send_wr: 1,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: want,
                };
                let qp = sys::ibv_create_qp(pd, &mut init);
                if !qp.is_null() {
                    granted = init.cap.max_inline_data;
                    sys::ibv_destroy_qp(qp);
                    break;
                }
            }
            sys::ibv_destroy_cq(cq);
        }
        sys::ibv_dealloc_pd(pd);
        granted
    }
}

/// Parsed [`DeviceInfo`] of an rdma-core device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeerInfo {
    link_layer: u8,
    gid_type: Option<u32>,
    lid: u16,
    gid: [u8; 16],
}

fn parse_info(info: &DeviceInfo) -> Option<PeerInfo> {
    let b = &info.bytes;
    if info.provider != PROVIDER_IBVERBS || b.len() != INFO_LEN || b[0] != INFO_VERSION {
        return None;
    }
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&b[10..26]);
    Some(PeerInfo {
        link_layer: b[1],
        gid_type: (b[3] != 0xff).then_some(u32::from(b[3])),
        lid: u16::from_le_bytes([b[4], b[5]]),
        gid,
    })
}

/// Can a device with `me` plausibly reach `peer`? Same link layer; RoCE: the peer has a GID of
/// a compatible RoCE version; InfiniBand: the peer has a LID and the same subnet prefix.
fn reachable(me: &PeerInfo, peer: &PeerInfo) -> bool {
    if me.link_layer != peer.link_layer {
        return false;
    }
    if me.link_layer == LINK_LAYER_ETHERNET {
        let compatible = match (me.gid_type, peer.gid_type) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        compatible && peer.gid.iter().any(|&b| b != 0)
    } else {
        peer.lid != 0 && me.gid[..8] == peer.gid[..8]
    }
}

impl IbvContext {
    fn me_info(&self) -> PeerInfo {
        PeerInfo {
            link_layer: self.link_layer,
            gid_type: self.gid.gid_type,
            lid: self.lid,
            gid: self.gid.gid,
        }
    }
}

impl ContextImpl for IbvContext {
    fn name(&self) -> &str {
        &self.name
    }

    fn query(&self) -> DeviceAttr {
        self.attr.clone()
    }

    fn device_info(&self) -> DeviceInfo {
        let mut b = Vec::with_capacity(INFO_LEN);
        b.extend_from_slice(&[INFO_VERSION, self.link_layer, PORT]);
        b.push(
            self.gid
                .gid_type
                .and_then(|t| u8::try_from(t).ok())
                .unwrap_or(0xff),
        );
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.extend_from_slice(&self.attr.active_mtu.to_le_bytes());
        b.extend_from_slice(&self.gid.gid);
        DeviceInfo {
            provider: PROVIDER_IBVERBS,
            bytes: b,
        }
    }

    /// Plausibility only: no packet is exchanged (`nonce` is unused); the QP handshake proves
    /// the path, and a failure there falls back to TCP like any other.
    fn probe(&self, peer: &DeviceInfo, _nonce: u64) -> Result<bool> {
        Ok(parse_info(peer).is_some_and(|p| reachable(&self.me_info(), &p)))
    }

    fn expect_probe(&self, _nonce: u64) {}

    fn alloc_pd(&self) -> Result<Arc<dyn PdImpl>> {
        Ok(IbvPd::alloc(self.arc()?)?)
    }

    fn gids(&self) -> Vec<GidInfo> {
        self.gid_table
            .iter()
            .map(|e| GidInfo {
                index: e.index,
                gid: e.gid,
                gid_type: e.gid_type,
            })
            .collect()
    }

    fn gid_index(&self) -> Option<u32> {
        Some(self.gid.index)
    }

    fn create_cq(&self, cqe: u32) -> Result<Arc<dyn CqImpl>> {
        if cqe == 0 || cqe > self.attr.max_cqe {
            return Err(Error::InvalidArgument(format!(
                "CQ of {cqe} entries (device maximum {})",
                self.attr.max_cqe
            )));
        }
        Ok(IbvCq::create(self.arc()?, cqe)?)
    }

    fn events(&self) -> &EventHub {
        &self.events
    }

    /// `ibv_get_async_event(3)` on the non-blocking fd until EAGAIN; each event is converted,
    /// acknowledged (`ibv_ack_async_event`) and raised.
    fn pump_events(&self) -> Result<()> {
        let _one = self.event_reader.lock();
        loop {
            // `ibv_async_event` is read through raw pointers only: its `event_type` is a Rust
            // enum, and a value this binding does not know would be undefined behaviour.
            let mut raw = std::mem::MaybeUninit::<[u64; 2]>::zeroed();
            let ev = raw.as_mut_ptr().cast::<sys::ibv_async_event>();
            // SAFETY: the context is open; `ev` points to 16 writable, aligned bytes, enough
            // for an `ibv_async_event` (checked at compile time below).
            let rc = unsafe { sys::ibv_get_async_event(self.ctx.0, ev) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(()),
                    _ => Err(Error::Os {
                        what: "ibv_get_async_event",
                        source: e,
                    }),
                };
            }
            // SAFETY: the call filled the struct: the type at its offset as a plain u32, the
            // element union's first 8 bytes as a pointer (or the port number's int).
            let (code, elem, port) = unsafe {
                (
                    std::ptr::addr_of!((*ev).event_type).cast::<u32>().read(),
                    raw.as_ptr().cast::<usize>().read(),
                    raw.as_ptr().cast::<i32>().read(),
                )
            };
            // SAFETY: until the event is acknowledged, the object it names stays alive
            // (ibv_get_async_event(3): destroy waits for the acknowledgement); the pointer is
            // of the kind `code` says; only plain fields set at creation are read.
            let event = unsafe {
                match code {
                    0 => AsyncEvent::CqErr {
                        cq: (*(elem as *const sys::ibv_cq)).cq_context as usize as u64,
                    },
                    1..=5 | 16 => {
                        let qp_num = (*(elem as *const sys::ibv_qp)).qp_num;
                        match code {
                            1 => AsyncEvent::QpFatal { qp_num },
                            2 => AsyncEvent::QpReqErr { qp_num },
                            3 => AsyncEvent::QpAccessErr { qp_num },
                            4 => AsyncEvent::CommEst { qp_num },
                            5 => AsyncEvent::SqDrained { qp_num },
                            _ => AsyncEvent::QpLastWqeReached { qp_num },
                        }
                    }
                    14 | 15 => {
                        let srq = (*(elem as *const sys::ibv_srq)).srq_context as usize as u64;
                        if code == 14 {
                            AsyncEvent::SrqErr { srq }
                        } else {
                            AsyncEvent::SrqLimitReached { srq }
                        }
                    }
                    8 => AsyncEvent::DeviceFatal,
                    9 => AsyncEvent::PortActive {
                        port: u8::try_from(port).unwrap_or(0),
                    },
                    10 => AsyncEvent::PortErr {
                        port: u8::try_from(port).unwrap_or(0),
                    },
                    code => AsyncEvent::Other { code },
                }
            };
            // SAFETY: `ev` is the event just read, acknowledged once.
            unsafe { sys::ibv_ack_async_event(ev) };
            self.events.raise(event);
        }
    }

    fn async_fd(&self) -> Option<std::os::fd::RawFd> {
        // SAFETY: the context is open while `self` lives; the field is not written after open.
        Some(unsafe { (*self.ctx.0).async_fd })
    }
}

const _: () = assert!(std::mem::size_of::<sys::ibv_async_event>() <= 16);
const _: () = assert!(std::mem::align_of::<sys::ibv_async_event>() <= 8);

/// Caps beyond the device's limits are refused before rdma-core sees them.
pub(crate) fn check_caps(attr: &DeviceAttr, cap: &QpCap) -> Result<()> {
    let checks = [
        ("max_send_wr", cap.max_send_wr, attr.max_qp_wr),
        ("max_recv_wr", cap.max_recv_wr, attr.max_qp_wr),
        ("max_send_sge", cap.max_send_sge, attr.max_sge),
        ("max_recv_sge", cap.max_recv_sge, attr.max_sge),
        ("max_inline_data", cap.max_inline_data, attr.max_inline_data),
    ];
    for (what, v, max) in checks {
        if v > max {
            return Err(Error::InvalidArgument(format!(
                "{what} {v} exceeds the device limit {max}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(link_layer: u8, gid_type: Option<u32>, lid: u16, gid: [u8; 16]) -> PeerInfo {
        PeerInfo {
            link_layer,
            gid_type,
            lid,
            gid,
        }
    }

    const G: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];

    #[test]
    fn roce_reaches_a_peer_with_a_gid_of_the_same_version() {
        let me = info(LINK_LAYER_ETHERNET, Some(2), 0, G);
        assert!(reachable(&me, &info(LINK_LAYER_ETHERNET, Some(2), 0, G)));
        assert!(!reachable(&me, &info(LINK_LAYER_ETHERNET, Some(1), 0, G)));
        assert!(!reachable(
            &me,
            &info(LINK_LAYER_ETHERNET, Some(2), 0, [0; 16])
        ));
        assert!(!reachable(&me, &info(1, Some(2), 5, G)), "IB peer");
    }

    #[test]
    fn infiniband_needs_a_lid_and_the_same_subnet() {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        let me = info(1, None, 1, g);
        assert!(reachable(&me, &info(1, None, 7, g)));
        assert!(!reachable(&me, &info(1, None, 0, g)));
        let mut other = g;
        other[7] = 1;
        assert!(!reachable(&me, &info(1, None, 7, other)));
    }

    #[test]
    fn device_info_of_another_provider_or_length_is_unreachable() {
        let good = DeviceInfo {
            provider: PROVIDER_IBVERBS,
            bytes: vec![INFO_VERSION; INFO_LEN],
        };
        assert!(parse_info(&good).is_some());
        let soft = DeviceInfo {
            provider: crate::provider::PROVIDER_SOFT,
            bytes: good.bytes.clone(),
        };
        assert!(parse_info(&soft).is_none());
        let short = DeviceInfo {
            provider: PROVIDER_IBVERBS,
            bytes: vec![INFO_VERSION; INFO_LEN - 1],
        };
        assert!(parse_info(&short).is_none());
        let future = DeviceInfo {
            provider: PROVIDER_IBVERBS,
            bytes: vec![INFO_VERSION + 1; INFO_LEN],
        };
        assert!(parse_info(&future).is_none());
    }
}
