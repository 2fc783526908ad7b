//! [`MrCache`]: memory regions for memory the pool did not allocate ([`UserRegion`]s), registered
//! on first use (`ibv_reg_mr(3)`) and kept for later sends from the same memory.
//!
//! - Key = (start address, owner identity [`UserRegion::id`]): a different owner at the same
//!   address (memory freed and mapped again, or another `Bytes` over the same bytes) never hits
//!   an entry of the old one.
//! - Lookup by interval: entries are indexed by start address in a `BTreeMap`; a hit needs one
//!   entry of the same owner that covers all of `[addr, addr + len)`.
//! - Entries hold their region, hence its owner: cached memory cannot be freed or unmapped
//!   behind the cache's back. It is released by eviction, [`MrCache::invalidate`] or
//!   [`MrCache::clear`] (and then only when no [`CachedMr`] uses it any more).
//! - Bounded: bytes registered ≤ [`MrCacheConfig::max_bytes`] and entries ≤
//!   [`MrCacheConfig::max_entries`] at all times, invalidated entries still in use included.
//!   Idle entries are evicted least recently used first (eviction deregisters); entries in use
//!   are never evicted. When only in-use entries remain, a new registration fails with
//!   [`MemError::CacheFull`] (backpressure: retry after completions release handles).
//! - Registration happens under the cache's lock, so concurrent misses on one region register it
//!   once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use byteexpress_verbs::{Access, Mr, Pd, Sge, UserRegion};
use parking_lot::Mutex;

use crate::MemError;
use crate::error::registration_error;

/// Limits and access of an [`MrCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrCacheConfig {
    /// Most bytes registered by the cache at once (default 1 GiB).
    pub max_bytes: u64,
    /// Most MRs held at once (default 1024).
    pub max_entries: usize,
    /// Access every entry is registered with (default: none, i.e. local reads: sources of SEND
    /// and RDMA_WRITE). Write access needs writable regions ([`UserRegion::new_mut`]).
    pub access: Access,
}

impl Default for MrCacheConfig {
    fn default() -> Self {
        MrCacheConfig {
            max_bytes: 1 << 30,
            max_entries: 1024,
            access: Access::default(),
        }
    }
}

/// Counters of an [`MrCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MrCacheStats {
    /// Lookups served by an existing entry.
    pub hits: u64,
    /// Lookups that registered a new entry (or failed to).
    pub misses: u64,
    /// Idle entries deregistered to make room.
    pub evictions: u64,
    /// Entries removed by [`MrCache::invalidate`] / [`MrCache::clear`].
    pub invalidations: u64,
    /// Bytes registered now (entries in the index plus invalidated ones still in use).
    pub bytes_registered: u64,
    /// MRs held now (same scope as `bytes_registered`).
    pub entries: u64,
    /// Entries with at least one [`CachedMr`] alive.
    pub in_use: u64,
}

#[derive(Debug)]
struct Entry {
    mr: Mr,
    /// Holds the owner; dropped with the entry (after the MR).
    _region: UserRegion,
    start: u64,
    len: u64,
    owner: u64,
    refs: usize,
    /// LRU tick while idle (`refs == 0`).
    tick: u64,
    /// Still findable; false once invalidated.
    indexed: bool,
}

#[derive(Debug, Default)]
struct Inner {
    /// (start, owner) → entry id.
    index: BTreeMap<(u64, u64), u64>,
    entries: HashMap<u64, Entry>,
    /// Idle entries by last use: tick → entry id.
    idle: BTreeMap<u64, u64>,
    next_id: u64,
    tick: u64,
    /// Longest indexed entry, bounding the backward scan of a lookup.
    max_len: u64,
    stats: MrCacheStats,
}

impl Inner {
    fn bytes(&self) -> u64 {
        self.stats.bytes_registered
    }

    /// Removes entry `id` from every structure; returns it so the caller drops (deregisters) it
    /// outside the lock.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        if e.indexed {
            self.index.remove(&(e.start, e.owner));
        }
        if e.refs == 0 {
            self.idle.remove(&e.tick);
        }
        self.stats.bytes_registered -= e.len;
        self.stats.entries -= 1;
        Some(e)
    }

    fn find(&self, addr: u64, end: u64, owner: u64) -> Option<u64> {
        let lo = addr.saturating_sub(self.max_len);
        self.index
            .range((lo, 0)..=(addr, u64::MAX))
            .rev()
            .map(|(_, id)| &self.entries[id])
            .find(|e| e.owner == owner && e.start <= addr && end <= e.start + e.len)
            .map(|e| self.index[&(e.start, e.owner)])
    }

    fn acquire(&mut self, id: u64) {
        let e = self.entries.get_mut(&id).expect("indexed entries exist");
        if e.refs == 0 {
            self.idle.remove(&e.tick);
            self.stats.in_use += 1;
        }
        e.refs += 1;
    }
}

#[derive(Debug)]
struct Shared {
    pd: Pd,
    cfg: MrCacheConfig,
    inner: Mutex<Inner>,
}

/// A cache of MRs over [`UserRegion`]s (module docs). Clones share the cache.
#[derive(Debug, Clone)]
pub struct MrCache {
    shared: Arc<Shared>,
}

/// A registered range handed out by [`MrCache::get`]: its entry cannot be evicted or
/// deregistered while this handle (or a clone) lives. Keep it with the posted WR until the WR's
/// completion (DESIGN.md's invariant), then drop it.
#[derive(Debug)]
pub struct CachedMr {
    shared: Arc<Shared>,
    id: u64,
    mr: Mr,
    owner: u64,
    addr: u64,
    len: u32,
}

impl CachedMr {
    /// Start of the requested range in this process.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length of the requested range in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }
    /// True when the requested range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Local key of the MR.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    /// [`UserRegion::id`] of the owner whose entry serves this range.
    pub fn region_id(&self) -> u64 {
        self.owner
    }
    /// The whole MR the range lies in (it may cover more).
    pub fn mr(&self) -> &Mr {
        &self.mr
    }
    /// The SGE of the requested range.
    pub fn sge(&self) -> Sge {
        Sge {
            addr: self.addr,
            len: self.len,
            lkey: self.mr.lkey(),
        }
    }
}

impl Clone for CachedMr {
    fn clone(&self) -> Self {
        self.shared.inner.lock().acquire(self.id);
        CachedMr {
            shared: self.shared.clone(),
            id: self.id,
            mr: self.mr.clone(),
            owner: self.owner,
            addr: self.addr,
            len: self.len,
        }
    }
}

impl Drop for CachedMr {
    fn drop(&mut self) {
        let gone = {
            let mut inner = self.shared.inner.lock();
            let inner = &mut *inner;
            let Some(e) = inner.entries.get_mut(&self.id) else {
                return;
            };
            e.refs -= 1;
            if e.refs > 0 {
                return;
            }
            inner.stats.in_use -= 1;
            if e.indexed {
                inner.tick += 1;
                e.tick = inner.tick;
                inner.idle.insert(e.tick, self.id);
                None
            } else {
                inner.remove(self.id)
            }
        };
        drop(gone); // deregisters outside the lock
    }
}

impl MrCache {
    /// An empty cache registering on `pd`. Errors: `InvalidConfig` for a zero limit.
    pub fn new(pd: &Pd, cfg: MrCacheConfig) -> Result<MrCache, MemError> {
        if cfg.max_bytes == 0 || cfg.max_entries == 0 {
            return Err(MemError::InvalidConfig(format!(
                "MR cache limits must be positive: {cfg:?}"
            )));
        }
        Ok(MrCache {
            shared: Arc::new(Shared {
                pd: pd.clone(),
                cfg,
                inner: Mutex::new(Inner::default()),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> MrCacheConfig {
        self.shared.cfg
    }

    /// The MR for `[offset, offset + len)` of `region`: a cached entry of the same owner covering
    /// the range (hit), or a new registration of the whole region (miss), evicting idle entries
    /// least recently used first while a limit would be exceeded.
    ///
    /// Errors: `TooLarge` when the range is outside the region (or `len` > 2^32 − 1, the SGE
    /// limit); `CacheFull` when the region alone exceeds a limit or only entries in use remain;
    /// `Memlock` / `Verbs` when the device refuses the registration (see [`Pd::reg_user`]).
    pub fn get(
        &self,
        region: &UserRegion,
        offset: usize,
        len: usize,
    ) -> Result<CachedMr, MemError> {
        let sge_len = u32::try_from(len).map_err(|_| MemError::TooLarge {
            len,
            max: u32::MAX as usize,
        })?;
        if offset.checked_add(len).is_none_or(|end| end > region.len()) {
            return Err(MemError::TooLarge {
                len: offset.saturating_add(len),
                max: region.len(),
            });
        }
        let addr = region.addr() + offset as u64;
        let end = addr + len as u64;
        let mut evicted = Vec::new();
        let mut inner = self.shared.inner.lock();
        let id = match inner.find(addr, end, region.id()) {
            Some(id) => {
                inner.stats.hits += 1;
                id
            }
            None => {
                inner.stats.misses += 1;
                let need = region.len() as u64;
                let cfg = self.shared.cfg;
                if need > cfg.max_bytes {
                    return Err(MemError::CacheFull {
                        requested: need,
                        registered: inner.bytes(),
                        max_bytes: cfg.max_bytes,
                        entries: inner.stats.entries,
                        max_entries: cfg.max_entries,
                    });
                }
                while inner.bytes() + need > cfg.max_bytes
                    || inner.stats.entries as usize + 1 > cfg.max_entries
                {
                    let Some((_, &victim)) = inner.idle.iter().next() else {
                        let full = MemError::CacheFull {
                            requested: need,
                            registered: inner.bytes(),
                            max_bytes: cfg.max_bytes,
                            entries: inner.stats.entries,
                            max_entries: cfg.max_entries,
                        };
                        drop(inner);
                        return Err(full);
                    };
                    evicted.extend(inner.remove(victim));
                    inner.stats.evictions += 1;
                }
                let mr = match self.shared.pd.reg_user(region.clone(), cfg.access) {
                    Ok(mr) => mr,
                    Err(e) => {
                        let registered = inner.bytes();
                        drop(inner);
                        return Err(registration_error(e, registered, need));
                    }
                };
                inner.next_id += 1;
                let id = inner.next_id;
                let start = region.addr();
                inner.index.insert((start, region.id()), id);
                inner.entries.insert(
                    id,
                    Entry {
                        mr,
                        _region: region.clone(),
                        start,
                        len: need,
                        owner: region.id(),
                        refs: 0,
                        tick: 0,
                        indexed: true,
                    },
                );
                inner.max_len = inner.max_len.max(need);
                inner.stats.bytes_registered += need;
                inner.stats.entries += 1;
                // Idle until acquired just below.
                inner.tick += 1;
                let t = inner.tick;
                inner.entries.get_mut(&id).expect("just inserted").tick = t;
                inner.idle.insert(t, id);
                id
            }
        };
        inner.acquire(id);
        let mr = inner.entries[&id].mr.clone();
        drop(inner);
        drop(evicted); // deregisters outside the lock
        Ok(CachedMr {
            shared: self.shared.clone(),
            id,
            mr,
            owner: region.id(),
            addr,
            len: sge_len,
        })
    }

    /// Forgets every entry overlapping `[addr, addr + len)` (memory the caller knows changed or
    /// is about to be unmapped): idle ones are deregistered now, releasing their owners; ones in
    /// use are no longer found and are deregistered when their last [`CachedMr`] drops. Returns
    /// how many entries were forgotten.
    pub fn invalidate(&self, addr: u64, len: u64) -> usize {
        let end = addr.saturating_add(len);
        let mut gone = Vec::new();
        let n;
        {
            let mut inner = self.shared.inner.lock();
            let lo = addr.saturating_sub(inner.max_len);
            let hit: Vec<(u64, u64, u64)> = inner
                .index
                .range((lo, 0)..(end, 0))
                .map(|(&(start, owner), &id)| (start, owner, id))
                .filter(|&(start, _, id)| start < end && addr < start + inner.entries[&id].len)
                .collect();
            n = hit.len();
            for (start, owner, id) in hit {
                inner.stats.invalidations += 1;
                if inner.entries[&id].refs == 0 {
                    gone.extend(inner.remove(id));
                } else {
                    inner.index.remove(&(start, owner));
                    inner.entries.get_mut(&id).expect("indexed").indexed = false;
                }
            }
        }
        drop(gone);
        n
    }

    /// Forgets every entry of `region`'s owner (all of its address range).
    pub fn invalidate_region(&self, region: &UserRegion) -> usize {
        let mut gone = Vec::new();
        let mut n = 0;
        {
            let mut inner = self.shared.inner.lock();
            let ids: Vec<u64> = inner
                .entries
                .iter()
                .filter(|(_, e)| e.indexed && e.owner == region.id())
                .map(|(&id, _)| id)
                .collect();
            for id in ids {
                n += 1;
                inner.stats.invalidations += 1;
                let e = &inner.entries[&id];
                if e.refs == 0 {
                    gone.extend(inner.remove(id));
                } else {
                    let key = (e.start, e.owner);
                    inner.index.remove(&key);
                    inner.entries.get_mut(&id).expect("present").indexed = false;
                }
            }
        }
        drop(gone);
        n
    }

    /// Forgets every entry (as [`MrCache::invalidate`] over all memory).
    pub fn clear(&self) -> usize {
        self.invalidate(0, u64::MAX)
    }

    /// Counters and current occupancy.
    pub fn stats(&self) -> MrCacheStats {
        self.shared.inner.lock().stats
    }
}
