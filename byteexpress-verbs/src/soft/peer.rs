//! What a QP knows of its peer: the peer's ring and doorbell, the regions and MRs it announced,
//! and the control channel they arrive on. Everything here came from the peer and is checked
//! before use.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::limits;
use super::ring::Ring;
use super::shm::{EventFd, Mapping};
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
}

/// The peer of a QP (attached by the device's listener when the peer's `connect` arrives).
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) name: Vec<u8>,
    pub(crate) qpn: u32,
    pub(crate) ring: Ring,
    pub(crate) doorbell: EventFd,
    /// The peer device's refill eventfd: rung when an SRQ-fed ring of the peer runs low.
    /// One per peer process and device, shared by all our QPs attached to it (an fd per link
    /// saved, [`super::device`]).
    pub(crate) refill: Option<Arc<EventFd>>,
    /// Access the peer's QP grants us (`qp_access_flags`).
    pub(crate) access: Access,
    chan: Arc<Sock>,
    /// The connecting side has its ConnectReply: the channel may carry our own Connect and
    /// announcements back (one socket per QP pair instead of two, [`super::qp`]).
    pub(crate) chan_ready: bool,
    /// The answer to our own Connect sent back over this channel: `Some(Ok)` once the peer
    /// attached us, `Some(Err(reason))` if it refused.
    pub(crate) connect_answer: Option<std::result::Result<(), String>>,
    regions: HashMap<u64, Arc<Mapping>>,
    mrs: HashMap<u32, RemoteMr>,
    /// The MR `resolve` found last, by key (cleared whenever an announcement is applied).
    last: Option<(u32, RemoteMr)>,
    /// Our private copies of the indices only we advance in the peer's ring.
    pub(crate) recv_cons: u64,
    pub(crate) comp_prod: u64,
    /// The peer's indices as we last read (and checked) them: `recv_prod` is read again only
    /// when the ring looks empty, `comp_cons` only when the completion ring looks full, so in
    /// the steady state the cache lines the peer writes for them stay in its cache.
    pub(crate) recv_prod_seen: u64,
    pub(crate) comp_cons_seen: u64,
    /// Announcements received (compared with the peer's `announced` counter).
    applied: u64,
    eof: bool,
}

impl Peer {
    pub(crate) fn new(
        name: Vec<u8>,
        qpn: u32,
        ring: Ring,
        doorbell: EventFd,
        refill: Option<Arc<EventFd>>,
        access: Access,
        chan: Arc<Sock>,
    ) -> Peer {
        Peer {
            name,
            qpn,
            ring,
            doorbell,
            refill,
            access,
            chan,
            chan_ready: false,
            connect_answer: None,
            regions: HashMap::new(),
            mrs: HashMap::new(),
            last: None,
            recv_cons: 0,
            comp_prod: 0,
            recv_prod_seen: 0,
            comp_cons_seen: 0,
            applied: 0,
            eof: false,
        }
    }

    /// The control channel the peer's announcements arrive on.
    pub(crate) fn chan(&self) -> &Arc<Sock> {
        &self.chan
    }

    /// Applies every announcement queued on the control channel. False once the channel hit EOF
    /// (the peer process or QP is gone).
    pub(crate) fn pump(&mut self) -> bool {
        if self.eof {
            return false;
        }
        let mut buf = [0u8; MAX_MSG];
        loop {
            match self.chan.recv(&mut buf, false) {
                Ok(Recv::Msg(n, fds)) => {
                    // The answer to our Connect over a shared channel is not an announcement
                    // (the peer's `announced` counter does not count it).
                    if let Some(Msg::ConnectReply { ok, reason }) =
                        Msg::decode(&buf[..n]).filter(|_| fds.is_empty())
                    {
                        self.connect_answer = Some(if ok { Ok(()) } else { Err(reason) });
                        continue;
                    }
                    self.applied += 1;
                    self.apply(&buf[..n], fds);
                }
                Ok(Recv::Empty) => return true,
                Ok(Recv::Eof) | Err(_) => {
                    self.eof = true;
                    return false;
                }
            }
        }
    }

    fn apply(&mut self, b: &[u8], fds: Vec<OwnedFd>) {
        self.last = None;
        let Some(msg) = Msg::decode(b).filter(|m| m.fds() == fds.len()) else {
            tracing::warn!(
                "soft: malformed announcement from peer QP {:#x} ignored",
                self.qpn
            );
            return;
        };
        match msg {
            Msg::Region { id, offset, len } => {
                let Some(fd) = fds.into_iter().next() else {
                    return;
                };
                if self.regions.len() >= limits::MAX_PEER_REGIONS || len > limits::MAX_MR_SIZE {
                    tracing::warn!("soft: peer region {id} refused (limits)");
                    return;
                }
                match Mapping::open(fd, offset, len as usize) {
                    Ok(m) => {
                        self.regions.insert(id, Arc::new(m));
                    }
                    Err(e) => tracing::warn!("soft: peer region {id} refused: {e}"),
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
                let Some(map) = self.regions.get(&region) else {
                    tracing::warn!("soft: peer MR {key:#x} names unknown region {region}");
                    return;
                };
                let fits = offset
                    .checked_add(len)
                    .is_some_and(|e| e <= map.len() as u64)
                    && addr.checked_add(len).is_some();
                if !fits || self.mrs.len() >= limits::MAX_PEER_REGIONS {
                    tracing::warn!("soft: peer MR {key:#x} refused (range or limits)");
                    return;
                }
                // A read-only grant backs no MR we would write into (a receive buffer or a
                // WRITE target): we never store through a read-only mapping.
                if !map.writable()
                    && Access(access).0 & (Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0) != 0
                {
                    tracing::warn!(
                        "soft: peer MR {key:#x} refused (writable over a read-only grant)"
                    );
                    return;
                }
                self.mrs.insert(
                    key,
                    RemoteMr {
                        region: map.clone(),
                        offset,
                        len,
                        addr,
                        access: Access(access),
                    },
                );
            }
            Msg::MrDel { key } => {
                self.mrs.remove(&key);
            }
            _ => tracing::warn!("soft: unexpected message on control channel ignored"),
        }
    }

    /// Pointer (in our mapping of the peer's memory) to the peer's `[addr, addr + len)` in its
    /// MR `key`, which must grant `need`. An unknown key, or announcements the peer sent that
    /// we have not applied yet, first drain the control channel.
    #[inline]
    pub(crate) fn resolve(
        &mut self,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<*mut u8, Fault> {
        if self
            .ring
            .announced()
            .load(std::sync::atomic::Ordering::Acquire)
            != self.applied
        {
            self.pump();
        }
        if self.last.as_ref().is_none_or(|(k, _)| *k != key) {
            if !self.mrs.contains_key(&key) {
                self.pump();
            }
            let mr = self.mrs.get(&key).ok_or(Fault::Key)?;
            self.last = Some((key, mr.clone()));
        }
        let Some((_, mr)) = &self.last else {
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
}
