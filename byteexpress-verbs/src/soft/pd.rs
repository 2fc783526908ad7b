//! Protection domains, shared memory and memory regions of the soft device.
//!
//! An MR's region (memfd) and the MR itself are announced to every peer connected to a QP of the
//! MR's PD: at connect time for MRs that exist then, at registration time (before `reg_shared`
//! returns) for later ones, and deregistration is announced on drop.
//!
//! Mappings follow access (issue 22, item 1): `alloc_shared` memory belongs to one
//! [`Exposure`] class, chosen from the widest access it will be registered with, and one memfd
//! never holds regions of two classes. Local-only memory is never sent to a peer; read-only
//! memory goes in arenas sealed `F_SEAL_FUTURE_WRITE` and passed as `O_RDONLY` fds; only
//! writable memory is passed read-write.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use super::device::{CONTROL_TIMEOUT, SoftDevice};
use super::limits;
use super::qp::SoftQp;
use super::ring::Ring;
use super::shm::{Arena, Mapping};
use super::sock::Sock;
use super::srq::SoftSrq;
use super::wire::Msg;
use crate::objects::UserMem;
use crate::provider::{CqImpl, MrImpl, PdImpl, QpImpl, SharedMemImpl, SrqImpl};
use crate::{Access, Error, QpCap, Result, SrqAttr};

/// A QP's connection to its peer device, used to announce this PD's MRs.
#[derive(Debug)]
pub(crate) struct Conn {
    sock: Arc<Sock>,
    /// The connecting QP's own ring: its `announced` counter tells the peer what to expect.
    ring: Ring,
    /// Regions whose memfd this peer already has.
    sent: Mutex<HashSet<u64>>,
    /// Arenas whose memfd this peer was sent: retired when this connection ends, so no
    /// region made later is carved where that peer could still map it.
    exposed: Mutex<Vec<Arc<Arena>>>,
    /// An announcement could not be sent: the peer was dropped ([`Conn::fail`]).
    failed: AtomicBool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        for a in self.exposed.get_mut().drain(..) {
            a.retire();
        }
    }
}

impl Conn {
    pub(crate) fn new(sock: Arc<Sock>, ring: Ring) -> Conn {
        Conn {
            sock,
            ring,
            sent: Mutex::new(HashSet::new()),
            exposed: Mutex::new(Vec::new()),
            failed: AtomicBool::new(false),
        }
    }

    /// Sends one announcement and counts it in the ring (Release: the message is queued on
    /// the peer's socket before the peer can see the count). Waits for room in the peer's
    /// socket until `deadline` (`None`: [`CONTROL_TIMEOUT`] from now): a live peer's progress
    /// thread empties it within milliseconds, so a burst of registrations never costs an
    /// honest peer its QP; a peer that leaves its socket full that long (it stopped reading)
    /// is dropped ([`Conn::fail`]), and later announcements skip it at once. Under the PD's
    /// lock, such a peer can hold the PD's registrations once, for at most that long.
    fn send(
        &self,
        m: &Msg,
        fds: &[std::os::fd::RawFd],
        deadline: Option<Instant>,
    ) -> std::io::Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the peer was dropped: an announcement to it could not be sent",
            ));
        }
        let data = m.encode();
        let deadline = deadline.unwrap_or_else(|| Instant::now() + CONTROL_TIMEOUT);
        loop {
            match self.sock.send_nowait(&data, fds) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || !self.sock.wait_writable(left) {
                        self.fail();
                        return Err(e);
                    }
                }
                Err(e) => {
                    self.fail();
                    return Err(e);
                }
            }
        }
        self.ring.announced().fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Drops the peer: it missed an announcement, so nothing more is sent to it, its channel
    /// is shut down (it reads EOF; our QP sees the peer gone, as after its death) and the
    /// arenas it was sent get no new regions.
    fn fail(&self) {
        if self.failed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!("soft: a peer that does not read its announcements is dropped");
        self.sock.shutdown();
        for a in self.exposed.lock().iter() {
            a.retire();
        }
    }

    /// Announces a deregistration.
    /// Whether this peer was sent region `id`'s memfd.
    fn has(&self, id: u64) -> bool {
        self.sent.lock().contains(&id)
    }

    pub(crate) fn withdraw(&self, key: u32) -> std::io::Result<()> {
        self.send(&Msg::MrDel { key }, &[], None)
    }

    /// Sends `mr` (and its region's memfd, the first time), waiting for room as
    /// [`Conn::send`] does.
    /// User memory ([`Backing::User`]) is never announced: peers cannot reach it.
    /// Local-only memory ([`Exposure::Local`]) is not announced either.
    pub(crate) fn announce(&self, mr: &SoftMr) -> std::io::Result<()> {
        self.announce_by(mr, None)
    }

    /// As [`Conn::announce`], waiting for room in the peer's socket until `deadline` (a
    /// connect announcing the PD's MRs, outside the PD's lock).
    pub(crate) fn announce_by(
        &self,
        mr: &SoftMr,
        deadline: Option<Instant>,
    ) -> std::io::Result<()> {
        self.announce_range(mr, mr.key, mr.addr, mr.len as u64, mr.access, deadline)
    }

    /// Announces a bound memory window ([`super::mw`]): `len` bytes at `addr` of `mr` under
    /// `rkey` with `access`. The caller checked that the range lies inside `mr`.
    pub(crate) fn announce_window(
        &self,
        mr: &SoftMr,
        rkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> std::io::Result<()> {
        self.announce_range(mr, rkey, addr, len, access, None)
    }

    /// Sends `[addr, addr + len)` of `mr` as `key` with `access` (and the region's memfd, the
    /// first time).
    fn announce_range(
        &self,
        mr: &SoftMr,
        key: u32,
        addr: u64,
        len: u64,
        access: Access,
        deadline: Option<Instant>,
    ) -> std::io::Result<()> {
        let Backing::Shared(map) = &mr.backing else {
            return Ok(());
        };
        if mr.exposure == Exposure::Local {
            return Ok(());
        }
        let mut sent = self.sent.lock();
        if !sent.contains(&mr.region) {
            let m = Msg::Region {
                id: mr.region,
                offset: map.offset(),
                len: map.len() as u64,
            };
            let closed = || {
                std::io::Error::other(
                    "the region's memfd was closed once every QP of its PD had it (a QP created \
                     after that cannot be given it)",
                )
            };
            match map.arena() {
                Some(a) => {
                    let mut exposed = self.exposed.lock();
                    if !exposed.iter().any(|e| Arc::ptr_eq(e, a)) {
                        exposed.push(a.clone());
                    }
                    drop(exposed);
                    a.pass(|fd| self.send(&m, &[fd], deadline))
                        .ok_or_else(closed)?
                        .map_err(std::io::Error::other)??;
                }
                None => {
                    let fd = map.fd().ok_or_else(closed)?;
                    self.send(&m, &[fd], deadline)?;
                }
            }
            sent.insert(mr.region);
        }
        let m = Msg::MrAdd {
            key,
            region: mr.region,
            offset: mr.offset as u64 + (addr - mr.addr),
            len,
            addr,
            access: access.0,
        };
        self.send(&m, &[], deadline)
    }
}

/// What a peer may do with a region of `alloc_shared` memory, from the widest access it
/// will be registered with (the hint given to `alloc_shared`). One memfd never holds two
/// classes, so an fd never grants more than its class (issue 22, item 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Exposure {
    /// No flag that lets the peer touch it (LOCAL_WRITE only, e.g. receive buffers and the
    /// reassembly pool, or no flag at all): never sent to a peer (its own memfd, closed once
    /// mapped here). A SEND into it is copied by this process ([`super::deliver`]); a SEND
    /// from it is staged ([`super::stage`]).
    Local,
    /// REMOTE_READ (the hint for send pools too, whose SENDs the peer reads in place): passed
    /// sealed `F_SEAL_FUTURE_WRITE` as an `O_RDONLY` fd.
    ReadOnly,
    /// REMOTE_WRITE: passed read-write.
    Writable,
}

impl Exposure {
    /// The class registration with `access` needs.
    pub(crate) fn of(access: Access) -> Exposure {
        if access.contains(Access::REMOTE_WRITE) {
            Exposure::Writable
        } else if access.contains(Access::REMOTE_READ) {
            Exposure::ReadOnly
        } else {
            Exposure::Local
        }
    }
}

/// A region carved from an arena: its id (`SoftShm::id`) and its mapping.
type Carved = (u64, Weak<Mapping>);

/// MRs and peer connections of a PD.
#[derive(Debug, Default)]
pub(crate) struct PdState {
    pub(crate) mrs: Vec<Weak<SoftMr>>,
    pub(crate) conns: Vec<Weak<Conn>>,
    /// Where `alloc_shared` carves regions: one memfd for the PD's regions (one fd however
    /// many), replaced by a fresh one once a peer that was sent it is gone, or once it is
    /// closed.
    arena: Option<Arc<Arena>>,
    /// As `arena`, for read-only memory ([`Exposure::ReadOnly`]); replaced once sealed (at
    /// its first pass to a peer).
    ro_arena: Option<Arc<Arena>>,
    /// The PD's arenas, each with the regions carved from it.
    arenas: Vec<(Weak<Arena>, Vec<Carved>)>,
    /// No QP will be created in the PD any more (`Pd::finish_qps`).
    qps_finished: bool,
    /// Live QPs of the PD.
    qps: usize,
    /// Of those, the ones connected (their [`Conn`] made and all MRs announced on it).
    connected: usize,
}

impl PdState {
    /// Closes the memfd of every arena that no peer can still need: once no QP will be
    /// created in the PD (`Pd::finish_qps`) and every live QP of it is connected, an arena
    /// that went to a peer and whose every live region went to every live peer of the PD is
    /// closed (and retired: later regions go to a new arena, passed and closed in turn). Its
    /// regions stay mapped here and at the peers. So a connected PD costs no fd once its
    /// regions are registered (issue 17: fds per link).
    pub(crate) fn close_passed_arenas(&mut self) {
        self.arenas.retain(|(a, _)| a.strong_count() > 0);
        if !self.qps_finished || self.connected < self.qps {
            return;
        }
        let conns: Vec<Arc<Conn>> = self.conns.iter().filter_map(Weak::upgrade).collect();
        for (a, regions) in &mut self.arenas {
            regions.retain(|(_, m)| m.strong_count() > 0);
            let Some(a) = a.upgrade() else { continue };
            if a.is_passed()
                && a.is_open()
                && regions
                    .iter()
                    .all(|(id, _)| conns.iter().all(|c| c.has(*id)))
            {
                a.close();
            }
        }
    }
}

/// A protection domain.
#[derive(Debug)]
pub(crate) struct SoftPd {
    me: Weak<SoftPd>,
    pub(crate) id: u64,
    pub(crate) dev: Arc<SoftDevice>,
    pub(crate) state: Mutex<PdState>,
}

impl SoftPd {
    /// Refuses receive SGEs in user memory (`reg_user`), as `DeviceAttr::
    /// remote_access_needs_shared` promises. Made for the initiator's copy (the peer wrote
    /// receives through its mapping of our memory); since this process copies SENDs into its
    /// receive buffers itself ([`super::deliver`]) it could be lifted (DESIGN.md 3.1, not built).
    #[inline]
    pub(crate) fn check_recv_sges(&self, sges: &[crate::Sge]) -> Result<()> {
        // Counted before a user MR is published, so an MR whose key the caller holds counts.
        if self.dev.user_mrs.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.check_recv_sges_in_tables(sges)
    }

    /// [`SoftPd::check_recv_sges`] once some user MR exists: looks each key up.
    #[cold]
    fn check_recv_sges_in_tables(&self, sges: &[crate::Sge]) -> Result<()> {
        for s in sges {
            if self.dev.lookup_mr(s.lkey).is_some_and(|mr| mr.is_user()) {
                return Err(Error::Unsupported(format!(
                    "soft device: receive buffer {:#x}+{} is user memory (reg_user); receive \
                     buffers must come from Pd::alloc_shared (DeviceAttr::remote_access_needs_shared)",
                    s.addr, s.len
                )));
            }
        }
        Ok(())
    }

    /// A QP of this PD connected (its MRs announced to its peer).
    pub(crate) fn qp_connected(&self) {
        let mut st = self.state.lock();
        st.connected += 1;
        st.close_passed_arenas();
    }

    /// A QP of this PD is gone (`connected`: it had connected).
    pub(crate) fn qp_dropped(&self, connected: bool) {
        let mut st = self.state.lock();
        st.qps = st.qps.saturating_sub(1);
        if connected {
            st.connected = st.connected.saturating_sub(1);
        }
        st.close_passed_arenas();
    }

    pub(crate) fn new(dev: Arc<SoftDevice>) -> Arc<SoftPd> {
        Arc::new_cyclic(|me| SoftPd {
            me: me.clone(),
            id: dev.alloc_id(),
            dev,
            state: Mutex::new(PdState::default()),
        })
    }
}

/// Memory from `alloc_shared`: a sealed memfd mapping.
#[derive(Debug)]
pub(crate) struct SoftShm {
    pub(crate) id: u64,
    pub(crate) map: Arc<Mapping>,
    /// Its class: MRs over it need no more ([`Exposure::of`]).
    pub(crate) exposure: Exposure,
}

impl SharedMemImpl for SoftShm {
    fn as_ptr(&self) -> *mut u8 {
        self.map.ptr()
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The memory under a soft MR.
#[derive(Debug, Clone)]
pub(crate) enum Backing {
    /// A memfd region from `alloc_shared`, announced to peers.
    Shared(Arc<Mapping>),
    /// Memory the application owns (`reg_user`): local access only, never announced.
    User(Arc<UserMem>),
}

impl Backing {
    fn base(&self) -> *mut u8 {
        match self {
            Backing::Shared(m) => m.ptr(),
            Backing::User(u) => u.as_ptr(),
        }
    }
}

/// Pointer to `[addr, addr + len)` when that range lies inside the MR of `mr_len` bytes at
/// virtual address `mr_addr`, which starts `offset` bytes into `backing`.
#[inline]
fn range_in(
    backing: &Backing,
    offset: usize,
    mr_addr: u64,
    mr_len: usize,
    addr: u64,
    len: u64,
) -> Option<*mut u8> {
    let end = addr.checked_add(len)?;
    if addr < mr_addr || end > mr_addr + mr_len as u64 {
        return None;
    }
    let off = offset + (addr - mr_addr) as usize;
    // SAFETY: `off + len <= offset + mr_len <=` the backing's length (checked at registration
    // and above), so the pointer stays inside the backing memory, which the caller holds.
    Some(unsafe { backing.base().add(off) })
}

/// What `post_send` needs of a local MR in shared memory, cached per QP ([`MrCache`]) so that
/// the common case takes no lock and changes no reference count: the MR is still registered
/// exactly while its strong count is above 0 (deregistration is its drop), and the entry's own
/// handle on the backing memory keeps that memory mapped during a copy.
#[derive(Debug)]
struct CachedMr {
    key: u32,
    mr: Weak<SoftMr>,
    pd: u64,
    access: Access,
    /// Announced to the PD's peers (they can read it in place).
    announced: bool,
    backing: Backing,
    offset: usize,
    addr: u64,
    len: usize,
}

impl CachedMr {
    #[inline]
    fn range(&self, addr: u64, len: u64) -> Option<*mut u8> {
        range_in(&self.backing, self.offset, self.addr, self.len, addr, len)
    }

    #[inline]
    fn registered(&self) -> bool {
        self.mr.strong_count() > 0
    }
}

/// Entries of an [`MrCache`].
const MR_CACHE: usize = 4;

/// The last few local MRs a QP's sends used (under its send lock). Only MRs over
/// `alloc_shared` memory are cached: the entry holds their mapping, which at worst stays
/// mapped until the entry is replaced or the QP dropped; user memory (`reg_user`) is never
/// held beyond its MRs, so it is looked up in the device's table every time.
#[derive(Debug, Default)]
pub(crate) struct MrCache {
    slots: [Option<CachedMr>; MR_CACHE],
    /// Slot the next miss replaces (round robin).
    next: usize,
}

impl MrCache {
    /// Like [`MrCache::resolve`], from the cache alone (`None` on a miss, or when the range
    /// is not inside the cached MR): takes no lock and no MR handle.
    #[inline]
    pub(crate) fn hit(
        &self,
        key: u32,
        addr: u64,
        len: u64,
    ) -> Option<(*mut u8, u64, Access, bool)> {
        let e = self.slots.iter().flatten().find(|e| e.key == key)?;
        if !e.registered() {
            return None;
        }
        Some((e.range(addr, len)?, e.pd, e.access, e.announced))
    }

    /// Where `[addr, addr + len)` lies in memory, if inside the MR with `key` registered on
    /// `dev`, with that MR's PD id, access flags and whether it is announced to peers. Hits in the cache take no lock; a miss
    /// looks the key up in the device's table and hands the MR to `keep` (dropped after the
    /// caller's locks), which also keeps user memory alive during the caller's copy.
    #[inline]
    pub(crate) fn resolve(
        &mut self,
        dev: &SoftDevice,
        key: u32,
        addr: u64,
        len: u64,
        keep: &mut super::send::Keep,
    ) -> Option<(*mut u8, u64, Access, bool)> {
        let mut hit = None;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            match slot {
                Some(e) if !e.registered() => *slot = None,
                Some(e) if e.key == key => hit = Some(i),
                _ => {}
            }
        }
        if let Some(e) = hit.and_then(|i| self.slots[i].as_ref()) {
            return Some((e.range(addr, len)?, e.pd, e.access, e.announced));
        }
        let mr = dev.lookup_mr(key)?;
        let found = mr
            .range(addr, len)
            .map(|p| (p, mr.pd.id, mr.access, mr.announced()));
        if !mr.is_user() {
            let i = self.next;
            self.next = (i + 1) % MR_CACHE;
            self.slots[i] = Some(CachedMr {
                key,
                mr: Arc::downgrade(&mr),
                pd: mr.pd.id,
                access: mr.access,
                announced: mr.announced(),
                backing: mr.backing.clone(),
                offset: mr.offset,
                addr: mr.addr,
                len: mr.len,
            });
        }
        keep.push(mr);
        found
    }
}

/// A registered memory region (lkey = rkey).
#[derive(Debug)]
pub(crate) struct SoftMr {
    pub(crate) key: u32,
    pub(crate) pd: Arc<SoftPd>,
    /// Id of the region (memfd or user region) it lies in.
    pub(crate) region: u64,
    /// That region's memory (kept alive).
    pub(crate) backing: Backing,
    /// Offset in the region.
    pub(crate) offset: usize,
    pub(crate) len: usize,
    /// Virtual address in this process (= mapping start + offset).
    pub(crate) addr: u64,
    pub(crate) access: Access,
    /// Its memory's class (`Local` for user memory).
    pub(crate) exposure: Exposure,
}

impl SoftMr {
    /// Pointer to `[addr, addr + len)` when that range lies inside this MR.
    pub(crate) fn range(&self, addr: u64, len: u64) -> Option<*mut u8> {
        range_in(&self.backing, self.offset, self.addr, self.len, addr, len)
    }

    /// True for memory the application owns (`reg_user`), which peers cannot reach.
    pub(crate) fn is_user(&self) -> bool {
        matches!(self.backing, Backing::User(_))
    }

    /// Announced to the peers of its PD ([`Conn::announce`]): they can read it in place.
    pub(crate) fn announced(&self) -> bool {
        !self.is_user() && self.exposure != Exposure::Local
    }
}

impl MrImpl for SoftMr {
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.pd.dev.mrs.write().remove(&self.key);
        if self.is_user() {
            self.pd.dev.user_mrs.fetch_sub(1, Ordering::AcqRel);
            return; // never announced
        }
        let mut st = self.pd.state.lock();
        st.mrs.retain(|w| w.strong_count() > 0);
        st.conns.retain(|w| w.strong_count() > 0);
        for c in st.conns.iter().filter_map(Weak::upgrade) {
            let _ = c.withdraw(self.key);
        }
    }
}

impl PdImpl for SoftPd {
    fn alloc_shared(&self, len: usize, access: Access) -> Result<Arc<dyn SharedMemImpl>> {
        if len as u64 > limits::MAX_MR_SIZE {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes exceed max_mr_size {}",
                limits::MAX_MR_SIZE
            )));
        }
        let exposure = Exposure::of(access);
        let id = self.dev.alloc_id();
        if exposure == Exposure::Local {
            // Never sent: a memfd of its own, closed at once (no fd held).
            let map = Mapping::create(len, c"bx-soft-local")?;
            map.close_fd();
            return Ok(Arc::new(SoftShm {
                id,
                map: Arc::new(map),
                exposure,
            }));
        }
        // Carved under the PD's lock, so no arena is closed between its choice and the carving,
        // and the region is on its arena's list before any close decision. A read-only arena
        // sealed meanwhile (by a pass, under its own lock) refuses: a fresh one takes over.
        let mut st = self.state.lock();
        let mut tries = 0;
        let (arena, map) = loop {
            tries += 1;
            let current = match exposure {
                Exposure::ReadOnly => &mut st.ro_arena,
                _ => &mut st.arena,
            };
            let arena = match current {
                Some(a) if !a.is_retired() => a.clone(),
                _ => {
                    let ro = exposure == Exposure::ReadOnly;
                    let a = Arena::create(if ro { c"bx-soft-pd-ro" } else { c"bx-soft-pd" }, ro)?;
                    *current = Some(a.clone());
                    st.arenas.push((Arc::downgrade(&a), Vec::new()));
                    a
                }
            };
            match arena.alloc(len) {
                Ok(m) => break (arena, Arc::new(m)),
                Err(Error::InvalidState(_)) if tries < 3 => continue,
                Err(e) => return Err(e),
            }
        };
        if let Some((_, regions)) = st
            .arenas
            .iter_mut()
            .find(|(a, _)| std::ptr::eq(a.as_ptr(), Arc::as_ptr(&arena)))
        {
            regions.push((id, Arc::downgrade(&map)));
        }
        drop(st);
        Ok(Arc::new(SoftShm { id, map, exposure }))
    }

    fn reg_shared(
        &self,
        mem: &Arc<dyn SharedMemImpl>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Arc<dyn MrImpl>> {
        let shm = mem.as_any().downcast_ref::<SoftShm>().ok_or_else(|| {
            Error::InvalidArgument("memory was not allocated by the soft device".into())
        })?;
        if len as u64 > limits::MAX_MR_SIZE {
            return Err(Error::InvalidArgument(format!(
                "MR of {len} bytes exceeds max_mr_size {}",
                limits::MAX_MR_SIZE
            )));
        }
        if access.0 & !Access::MR_FLAGS.0 != 0 {
            return Err(Error::InvalidArgument(format!(
                "unknown access flags {:#x}",
                access.0
            )));
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "REMOTE_WRITE needs LOCAL_WRITE (ibv_reg_mr(3))".into(),
            ));
        }
        if Exposure::of(access) > shm.exposure {
            return Err(Error::InvalidArgument(format!(
                "soft device: access {access:?} exceeds what the memory was allocated for \
                 ({:?} exposure; Pd::alloc_shared_for's access hint)",
                shm.exposure
            )));
        }
        let pd = self.me.upgrade().expect("a PD in use is alive");
        let mut st = self.state.lock();
        let mr = Arc::new(SoftMr {
            key: self.dev.alloc_key(),
            pd,
            region: shm.id,
            backing: Backing::Shared(shm.map.clone()),
            offset,
            len,
            addr: shm.map.ptr() as u64 + offset as u64,
            access,
            exposure: shm.exposure,
        });
        self.dev.mrs.write().insert(mr.key, Arc::downgrade(&mr));
        st.mrs.retain(|w| w.strong_count() > 0);
        st.conns.retain(|w| w.strong_count() > 0);
        st.mrs.push(Arc::downgrade(&mr));
        for c in st.conns.iter().filter_map(Weak::upgrade) {
            if let Err(e) = c.announce(&mr) {
                // The peer is gone, or stuck and dropped (`Conn::fail`); its QP fails through
                // the control channel.
                tracing::debug!("soft: announcing MR {:#x} failed: {e}", mr.key);
            }
        }
        st.close_passed_arenas();
        Ok(mr)
    }

    /// Local access only: the peer process cannot map user memory, so `REMOTE_*` is refused as
    /// a device capability (`DeviceAttr::remote_access_needs_shared`, DESIGN.md). The MR is not
    /// announced to peers; the sender copies from it in `post_send`.
    fn reg_user(&self, region: &Arc<UserMem>, access: Access) -> Result<Arc<dyn MrImpl>> {
        if access.0 & !Access::MR_FLAGS.0 != 0 {
            return Err(Error::InvalidArgument(format!(
                "unknown access flags {:#x}",
                access.0
            )));
        }
        if access.0 & (Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0) != 0 {
            return Err(Error::Unsupported(format!(
                "soft device: remote access ({access:?}) needs memory from Pd::alloc_shared \
                 (DeviceAttr::remote_access_needs_shared); user memory is local-only"
            )));
        }
        let len = region.len();
        if len == 0 || len as u64 > limits::MAX_MR_SIZE {
            return Err(Error::InvalidArgument(format!(
                "MR of {len} bytes: must be 1..={} (max_mr_size)",
                limits::MAX_MR_SIZE
            )));
        }
        let pd = self.me.upgrade().expect("a PD in use is alive");
        let mr = Arc::new(SoftMr {
            key: self.dev.alloc_key(),
            pd,
            region: self.dev.alloc_id(),
            backing: Backing::User(region.clone()),
            offset: 0,
            len,
            addr: region.as_ptr() as u64,
            access,
            exposure: Exposure::Local,
        });
        self.dev.user_mrs.fetch_add(1, Ordering::AcqRel);
        self.dev.mrs.write().insert(mr.key, Arc::downgrade(&mr));
        Ok(mr)
    }

    fn create_qp(
        &self,
        send_cq: &Arc<dyn CqImpl>,
        recv_cq: &Arc<dyn CqImpl>,
        srq: Option<&Arc<dyn SrqImpl>>,
        cap: QpCap,
    ) -> Result<Arc<dyn QpImpl>> {
        let pd = self.me.upgrade().expect("a PD in use is alive");
        let srq = match srq {
            None => None,
            Some(s) => Some(
                SoftSrq::from_dyn(s)
                    .ok_or_else(|| Error::InvalidArgument("SRQ of another device".into()))?,
            ),
        };
        // Counted before it exists, under the same lock as the check, so no QP is made once
        // `finish_qps` may have closed the PD's arenas.
        {
            let mut st = self.state.lock();
            if st.qps_finished {
                return Err(Error::InvalidState(
                    "no QP can be created in this PD after Pd::finish_qps".into(),
                ));
            }
            st.qps += 1;
        }
        let qp = SoftQp::create(pd, send_cq, recv_cq, srq, cap).inspect_err(|_| {
            let mut st = self.state.lock();
            st.qps = st.qps.saturating_sub(1);
        })?;
        Ok(qp)
    }

    fn finish_qps(&self) {
        let mut st = self.state.lock();
        st.qps_finished = true;
        st.close_passed_arenas();
    }

    fn qps_finished(&self) -> bool {
        self.state.lock().qps_finished
    }

    fn create_srq(&self, attr: SrqAttr) -> Result<Arc<dyn SrqImpl>> {
        let pd = self.me.upgrade().expect("a PD in use is alive");
        Ok(SoftSrq::create(pd, attr)?)
    }

    fn alloc_mw(&self) -> Result<Arc<dyn crate::provider::MwImpl>> {
        let pd = self.me.upgrade().expect("a PD in use is alive");
        Ok(self.dev.alloc_mw(pd)?)
    }
}
