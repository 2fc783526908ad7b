//! What a QP knows of its peer: the peer's ring and doorbell, the regions and MRs it announced,
//! and the control channel they arrive on. Everything here came from the peer and is checked
//! before use.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::bell::Bell;
use super::limits;
use super::peer_fd::PeerFd;
use super::ring::Ring;
use super::shm::Mapping;
use super::sock::{MAX_MSG, Recv, Sock};
use super::wire::Msg;
use crate::Access;

/// An MR the peer announced.
#[derive(Debug, Clone)]
struct RemoteMr {
    region: Arc<Mapping>,
    offset: u64,
    len: u64,
    addr: u64,
    access: Access,
}

/// Why a peer address could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// No such key (after draining pending announcements).
    Key,
    /// Outside the MR.
    Range,
    /// The MR lacks the access needed.
    Access,
    /// The peer announced more memory than its mapping budget ([`limits::PEER_MAP_BYTES`] and
    /// the rest): nothing of it is used any more.
    Budget,
}

/// Peer regions this process maps now, all peers together (against
/// [`limits::PROCESS_PEER_MAPS`]).
static PROCESS_MAPS: AtomicU64 = AtomicU64::new(0);
/// Bytes of peer regions this process maps now (against [`limits::PROCESS_PEER_MAP_BYTES`]).
static PROCESS_MAP_BYTES: AtomicU64 = AtomicU64::new(0);

/// Adds `n` to `counter` unless the sum would pass `max`.
fn charge(counter: &AtomicU64, n: u64, max: u64) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
            c.checked_add(n).filter(|&s| s <= max)
        })
        .is_ok()
}

/// The peer of a QP (attached by the device's listener when the peer's `connect` arrives),
/// as the send side uses it (under the QP's send lock).
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) name: Vec<u8>,
    pub(crate) qpn: u32,
    pub(crate) ring: Ring,
    /// The peer's recv CQ doorbell: rung when we publish a completion and its CQ sleeps.
    pub(crate) doorbell: Arc<Bell>,
    /// The peer device's refill doorbell for this connection: rung when the peer's ring, fed
    /// by an SRQ, runs low.
    pub(crate) refill: Option<Bell>,
    /// Access the peer's QP grants us (`qp_access_flags`).
    pub(crate) access: Access,
    /// What the receive side needs of the peer too: its announced memory, staging region,
    /// send-CQ doorbell.
    pub(crate) shared: Arc<PeerShared>,
    /// The connecting side has its ConnectReply: the channel may carry our own Connect and
    /// announcements back (one socket per QP pair instead of two, [`super::qp`]).
    pub(crate) chan_ready: bool,
    /// Our private copies of the indices only we advance in the peer's ring.
    pub(crate) recv_cons: u64,
    pub(crate) comp_prod: u64,
    /// The peer's `recv_prod` as we last read (and checked) it: read again only when the ring
    /// looks empty, so in the steady state the line the peer writes stays in its cache.
    pub(crate) recv_prod_seen: u64,
    /// Completions of ours the peer acknowledged and we reaped (their slots are free again).
    pub(crate) acked: u64,
}

/// The parts of a peer both sides of a QP use: the control channel and what arrived on it
/// (regions, MRs: a leaf lock), the peer's staging region, its send CQ's doorbell.
#[derive(Debug)]
pub(crate) struct PeerShared {
    chan: Arc<Sock>,
    /// The peer's ring, for its `announced` counter.
    ring: Ring,
    /// The peer's send CQ doorbell (its recv CQ's when they are one CQ): rung when we
    /// acknowledge its SENDs and it sleeps waiting for that.
    pub(crate) tx_bell: Arc<Bell>,
    /// Whether `tx_bell` is the same doorbell as the peer's recv CQ doorbell.
    pub(crate) tx_bell_shared: bool,
    /// The peer's staging region, mapped read-only (inline SENDs and SENDs from memory the
    /// peer does not announce are copied there by the peer).
    pub(crate) staging: Option<Mapping>,
    table: Mutex<Table>,
}

/// Announcements applied from the control channel.
#[derive(Debug, Default)]
struct Table {
    regions: HashMap<u64, Arc<Mapping>>,
    mrs: HashMap<u32, RemoteMr>,
    /// The MR `resolve` found last, by key (cleared whenever an announcement is applied).
    last: Option<(u32, RemoteMr)>,
    /// Announcements received (compared with the peer's `announced` counter).
    applied: u64,
    eof: bool,
    /// The answer to our own Connect sent back over this channel: `Some(Ok)` once the peer
    /// attached us, `Some(Err(reason))` if it refused.
    connect_answer: Option<std::result::Result<(), String>>,
    /// The peer asked us to deliver (`Nudge`) since the last `take_nudge`.
    nudged: bool,
    /// Region mappings made for this peer, and their bytes, charged to the process's budget
    /// until the table goes (replaced regions included: the count never goes down).
    maps: u64,
    map_bytes: u64,
    /// The peer went over its mapping budget: its announcements are no longer applied, its
    /// channel counts as ended, and no address of it resolves (the QP fails).
    over_budget: bool,
}

impl Drop for Table {
    fn drop(&mut self) {
        PROCESS_MAPS.fetch_sub(self.maps, Ordering::AcqRel);
        PROCESS_MAP_BYTES.fetch_sub(self.map_bytes, Ordering::AcqRel);
    }
}

impl Table {
    /// Charges one more mapping of `len` bytes to this peer and to the process, or marks the
    /// peer over budget (false).
    fn charge_map(&mut self, len: u64) -> bool {
        let fits_peer = self.maps < limits::PEER_MAPS
            && self
                .map_bytes
                .checked_add(len)
                .is_some_and(|b| b <= limits::PEER_MAP_BYTES);
        if !fits_peer {
            return false;
        }
        if !charge(&PROCESS_MAPS, 1, limits::PROCESS_PEER_MAPS) {
            return false;
        }
        if !charge(&PROCESS_MAP_BYTES, len, limits::PROCESS_PEER_MAP_BYTES) {
            PROCESS_MAPS.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        self.maps += 1;
        self.map_bytes += len;
        true
    }

    /// Gives back a charge whose mapping failed.
    fn refund_map(&mut self, len: u64) {
        self.maps -= 1;
        self.map_bytes -= len;
        PROCESS_MAPS.fetch_sub(1, Ordering::AcqRel);
        PROCESS_MAP_BYTES.fetch_sub(len, Ordering::AcqRel);
    }
}

/// How a Connect's optional parts arrived.
#[derive(Debug)]
pub(crate) struct PeerParts {
    pub(crate) doorbell: Arc<Bell>,
    pub(crate) tx_bell: Option<Arc<Bell>>,
    pub(crate) staging: Option<Mapping>,
    pub(crate) refill: Option<Bell>,
}

impl Peer {
    pub(crate) fn new(
        name: Vec<u8>,
        qpn: u32,
        ring: Ring,
        parts: PeerParts,
        access: Access,
        chan: Arc<Sock>,
    ) -> Peer {
        let shared = Arc::new(PeerShared {
            chan,
            ring: ring.clone(),
            tx_bell_shared: parts.tx_bell.is_none(),
            tx_bell: parts.tx_bell.unwrap_or_else(|| parts.doorbell.clone()),
            staging: parts.staging,
            table: Mutex::new(Table::default()),
        });
        Peer {
            name,
            qpn,
            ring,
            doorbell: parts.doorbell,
            refill: parts.refill,
            access,
            shared,
            chan_ready: false,
            recv_cons: 0,
            comp_prod: 0,
            recv_prod_seen: 0,
            acked: 0,
        }
    }

    /// The control channel the peer's announcements arrive on.
    pub(crate) fn chan(&self) -> &Arc<Sock> {
        &self.shared.chan
    }

    /// The answer to our Connect over the shared channel, once it came.
    pub(crate) fn take_connect_answer(&self) -> Option<std::result::Result<(), String>> {
        self.shared.table.lock().connect_answer.take()
    }

    /// See [`PeerShared::resolve`].
    #[inline]
    pub(crate) fn resolve(
        &mut self,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<*mut u8, Fault> {
        self.shared.resolve(key, addr, len, need)
    }
}

impl PeerShared {
    /// Applies every announcement queued on the control channel. False once the channel hit EOF
    /// (the peer process or QP is gone).
    pub(crate) fn pump(&self) -> bool {
        let mut t = self.table.lock();
        self.pump_locked(&mut t)
    }

    /// Whether the peer sent a `Nudge` since the last call.
    pub(crate) fn take_nudge(&self) -> bool {
        std::mem::take(&mut self.table.lock().nudged)
    }

    /// Asks the peer's device to deliver what we posted even if nobody polls its CQ.
    pub(crate) fn nudge(&self) {
        let _ = self.chan.try_send(&Msg::Nudge.encode());
    }

    fn pump_locked(&self, t: &mut Table) -> bool {
        if t.eof || t.over_budget {
            return false;
        }
        let mut buf = [0u8; MAX_MSG];
        loop {
            match self.chan.recv(&mut buf, false) {
                Ok(Recv::Msg(n, fds)) => {
                    // The answer to our Connect over a shared channel and a nudge are not
                    // announcements (the peer's `announced` counter does not count them).
                    match Msg::decode(&buf[..n]).filter(|_| fds.is_empty()) {
                        Some(Msg::ConnectReply { ok, reason }) => {
                            t.connect_answer = Some(if ok { Ok(()) } else { Err(reason) });
                            continue;
                        }
                        Some(Msg::Nudge) => {
                            t.nudged = true;
                            continue;
                        }
                        _ => {}
                    }
                    t.applied += 1;
                    Self::apply(t, &buf[..n], fds);
                    if t.over_budget {
                        return false;
                    }
                }
                Ok(Recv::Empty) => return true,
                Ok(Recv::Eof) | Err(_) => {
                    t.eof = true;
                    return false;
                }
            }
        }
    }

    fn apply(t: &mut Table, b: &[u8], fds: Vec<PeerFd>) {
        t.last = None;
        let Some(msg) = Msg::decode(b).filter(|m| m.fds() == fds.len()) else {
            tracing::warn!("soft: malformed announcement from a peer ignored");
            return;
        };
        match msg {
            Msg::Region { id, offset, len } => {
                let Some(fd) = fds.into_iter().next() else {
                    return;
                };
                // Anything but a memfd is closed off this thread, unmapped ([`PeerFd`]).
                let Some(fd) = fd.into_memfd() else {
                    tracing::warn!("soft: peer region {id} is not a memfd: refused");
                    return;
                };
                if t.regions.len() >= limits::MAX_PEER_REGIONS || len > limits::MAX_MR_SIZE {
                    tracing::warn!("soft: peer region {id} refused (limits)");
                    return;
                }
                // Address space and mappings are the whole process's: a peer that announces
                // more than its budget (or than the process has left for peers) loses its QP.
                if !t.charge_map(len) {
                    tracing::warn!(
                        "soft: peer region {id} ({len} bytes) over the mapping budget: \
                         the peer's QP fails"
                    );
                    t.over_budget = true;
                    t.last = None;
                    return;
                }
                match Mapping::open(fd, offset, len as usize) {
                    Ok(m) => {
                        t.regions.insert(id, Arc::new(m));
                    }
                    Err(e) => {
                        t.refund_map(len);
                        tracing::warn!("soft: peer region {id} refused: {e}");
                    }
                }
            }
            Msg::MrAdd {
                key,
                region,
                offset,
                len,
                addr,
                access,
            } => {
                let Some(map) = t.regions.get(&region) else {
                    tracing::warn!("soft: peer MR {key:#x} names unknown region {region}");
                    return;
                };
                let fits = offset
                    .checked_add(len)
                    .is_some_and(|e| e <= map.len() as u64)
                    && addr.checked_add(len).is_some();
                if !fits || t.mrs.len() >= limits::MAX_PEER_REGIONS {
                    tracing::warn!("soft: peer MR {key:#x} refused (range or limits)");
                    return;
                }
                // A read-only grant backs no MR we would write into (a WRITE target): we
                // never store through a read-only mapping.
                if !map.writable() && Access(access).contains(Access::REMOTE_WRITE) {
                    tracing::warn!(
                        "soft: peer MR {key:#x} refused (writable over a read-only grant)"
                    );
                    return;
                }
                let region = map.clone();
                t.mrs.insert(
                    key,
                    RemoteMr {
                        region,
                        offset,
                        len,
                        addr,
                        access: Access(access),
                    },
                );
            }
            Msg::MrDel { key } => {
                t.mrs.remove(&key);
            }
            _ => tracing::warn!("soft: unexpected message on control channel ignored"),
        }
    }

    /// Pointer (in our mapping of the peer's memory) to the peer's `[addr, addr + len)` in its
    /// MR `key`, which must grant `need`. An unknown key, or announcements the peer sent that
    /// we have not applied yet, first drain the control channel. The pointer stays valid while
    /// this `PeerShared` lives: a region, once mapped, is never unmapped before it.
    #[inline]
    pub(crate) fn resolve(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<*mut u8, Fault> {
        let mut t = self.table.lock();
        if t.over_budget {
            return Err(Fault::Budget);
        }
        if self
            .ring
            .announced()
            .load(std::sync::atomic::Ordering::Acquire)
            != t.applied
        {
            self.pump_locked(&mut t);
        }
        if t.last.as_ref().is_none_or(|(k, _)| *k != key) {
            if !t.mrs.contains_key(&key) {
                self.pump_locked(&mut t);
            }
            if t.over_budget {
                return Err(Fault::Budget);
            }
            let mr = t.mrs.get(&key).ok_or(Fault::Key)?.clone();
            t.last = Some((key, mr));
        }
        let Some((_, mr)) = &t.last else {
            return Err(Fault::Key);
        };
        if !mr.access.contains(need) {
            return Err(Fault::Access);
        }
        let end = addr.checked_add(len).ok_or(Fault::Range)?;
        if addr < mr.addr || end > mr.addr + mr.len {
            return Err(Fault::Range);
        }
        let off = (mr.offset + (addr - mr.addr)) as usize;
        // SAFETY: `off + len <= mr.offset + mr.len <= region.len()` (checked when the MR was
        // announced and above), so the pointer stays inside our mapping of the region.
        Ok(unsafe { mr.region.ptr().add(off) })
    }

    /// Pointer to `[off, off + len)` of the peer's staging region (mapped read-only), if the
    /// peer sent one and the range lies inside it.
    pub(crate) fn staged(&self, off: u64, len: u64) -> Option<*const u8> {
        let st = self.staging.as_ref()?;
        let end = off.checked_add(len)?;
        if end > st.len() as u64 {
            return None;
        }
        // SAFETY: `off + len <= st.len()`, checked above: inside the mapping, which lives as
        // long as `self`.
        Some(unsafe { st.ptr().add(off as usize) }.cast_const())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_past_its_budget_is_refused_and_leaves_the_counter_unchanged() {
        let c = AtomicU64::new(0);
        assert!(charge(&c, 3, 4));
        assert!(!charge(&c, 2, 4), "3 + 2 > 4");
        assert_eq!(c.load(Ordering::Acquire), 3);
        assert!(charge(&c, 1, 4), "exactly the budget");
        assert!(!charge(&c, u64::MAX, u64::MAX), "no overflow");
        assert_eq!(c.load(Ordering::Acquire), 4);
    }

    #[test]
    fn a_peer_table_takes_at_most_its_mapping_budget_and_gives_its_charge_back() {
        let mut t = Table::default();
        for _ in 0..limits::PEER_MAPS {
            assert!(t.charge_map(4096));
        }
        assert!(!t.charge_map(4096), "one mapping past the per-peer budget");
        let mut u = Table::default();
        assert!(
            !u.charge_map(limits::PEER_MAP_BYTES + 1),
            "more bytes than the per-peer budget"
        );
        assert!(u.charge_map(limits::PEER_MAP_BYTES), "exactly the budget");
        assert_eq!(u.map_bytes, limits::PEER_MAP_BYTES);
        // Dropping the tables gives the process's charge back (other tests of this binary may
        // map peer regions meanwhile, so only the bound is checked).
        drop((t, u));
        assert!(PROCESS_MAP_BYTES.load(Ordering::Acquire) < limits::PEER_MAP_BYTES);
    }
}
