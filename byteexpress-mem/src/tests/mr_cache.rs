//! The MR cache on the soft device: interval hits, owner identity, LRU limits, pinning by
//! handles, invalidation; proptests over random operation sequences.

use std::collections::HashMap;

use byteexpress_verbs::{Pd, UserRegion};
use bytes::Bytes;
use proptest::prelude::*;

use crate::{MemError, MrCache, MrCacheConfig};

fn pd() -> Pd {
    super::soft_pd()
}

fn cache(max_bytes: u64, max_entries: usize) -> MrCache {
    let cfg = MrCacheConfig {
        max_bytes,
        max_entries,
        ..MrCacheConfig::default()
    };
    MrCache::new(&pd(), cfg).unwrap()
}

#[test]
fn a_second_lookup_inside_the_region_hits_and_shares_the_mr() {
    let c = cache(1 << 20, 8);
    let r = UserRegion::new(vec![1u8; 8192]);
    let a = c.get(&r, 0, 100).unwrap();
    let b = c.get(&r, 4000, 4192).unwrap();
    assert_eq!(a.lkey(), b.lkey());
    assert_eq!(b.addr(), r.addr() + 4000);
    assert_eq!(b.sge().len, 4192);
    let s = c.stats();
    assert_eq!(
        (s.hits, s.misses, s.entries, s.bytes_registered),
        (1, 1, 1, 8192)
    );
    assert!(matches!(
        c.get(&r, 8000, 200),
        Err(MemError::TooLarge { .. })
    ));
}

#[test]
fn another_owner_at_the_same_address_never_hits_the_old_entry() {
    let c = cache(1 << 20, 8);
    let bytes = Bytes::from(vec![2u8; 4096]);
    let old = UserRegion::new(bytes.clone());
    let new = UserRegion::new(bytes.clone());
    assert_eq!(old.addr(), new.addr());
    let a = c.get(&old, 0, 4096).unwrap();
    let b = c.get(&new, 0, 4096).unwrap();
    assert_ne!(a.lkey(), b.lkey());
    assert_eq!(b.region_id(), new.id());
    assert_eq!(c.stats().misses, 2);
}

#[test]
fn idle_entries_are_evicted_lru_first_and_in_use_ones_never() {
    let c = cache(3 * 4096, 8);
    let r: Vec<UserRegion> = (0..4).map(|_| UserRegion::new(vec![0u8; 4096])).collect();
    let pinned = c.get(&r[0], 0, 1).unwrap();
    drop(c.get(&r[1], 0, 1).unwrap());
    drop(c.get(&r[2], 0, 1).unwrap());
    drop(c.get(&r[1], 0, 1).unwrap()); // r1 now more recent than r2
    drop(c.get(&r[3], 0, 1).unwrap()); // evicts r2 (LRU idle), not r0 (in use)
    assert_eq!(c.stats().evictions, 1);
    let hits = c.stats().hits;
    assert_eq!(c.get(&r[0], 0, 1).unwrap().lkey(), pinned.lkey());
    drop(c.get(&r[1], 0, 1).unwrap());
    assert_eq!(c.stats().hits, hits + 2);
    drop(c.get(&r[2], 0, 1).unwrap());
    assert_eq!(c.stats().misses, 5, "r2 was evicted");
}

#[test]
fn a_cache_whose_entries_are_all_in_use_refuses_with_cache_full() {
    let c = cache(8192, 2);
    let a = UserRegion::new(vec![0u8; 4096]);
    let b = UserRegion::new(vec![0u8; 4096]);
    let _ha = c.get(&a, 0, 1).unwrap();
    let _hb = c.get(&b, 0, 1).unwrap();
    let e = c.get(&UserRegion::new(vec![0u8; 16]), 0, 1).unwrap_err();
    assert!(
        matches!(
            e,
            MemError::CacheFull {
                entries: 2,
                max_entries: 2,
                ..
            }
        ),
        "{e}"
    );
    let big = c.get(&UserRegion::new(vec![0u8; 9000]), 0, 1).unwrap_err();
    assert!(
        matches!(
            big,
            MemError::CacheFull {
                requested: 9000,
                ..
            }
        ),
        "{big}"
    );
}

/// Sets its flag when dropped.
struct Owner(Vec<u8>, std::sync::Arc<std::sync::atomic::AtomicBool>);
impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}
impl Drop for Owner {
    fn drop(&mut self) {
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn invalidation_releases_the_owner_once_no_handle_uses_the_entry() {
    use std::sync::atomic::Ordering::SeqCst;
    let c = cache(1 << 20, 8);
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = UserRegion::new(Owner(vec![0u8; 4096], dropped.clone()));
    let (addr, id) = (r.addr(), r.id());
    let h = c.get(&r, 10, 10).unwrap();
    drop(r);
    assert!(!dropped.load(SeqCst), "the cache holds the owner");
    assert_eq!(
        c.invalidate(addr + 100, 1),
        1,
        "an overlapping range invalidates the entry"
    );
    assert_eq!(c.invalidate(addr + 100, 1), 0);
    assert!(!dropped.load(SeqCst), "the handle still uses it");
    assert_eq!(c.stats().entries, 1);
    drop(h);
    assert!(
        dropped.load(SeqCst),
        "last handle gone: deregistered and released"
    );
    let s = c.stats();
    assert_eq!((s.entries, s.bytes_registered, s.invalidations), (0, 0, 1));
    let _ = id;
    // A range just past the region does not touch an entry.
    let r2 = UserRegion::new(vec![0u8; 4096]);
    drop(c.get(&r2, 0, 1).unwrap());
    assert_eq!(c.invalidate(r2.addr() + 4096, 4096), 0);
    assert_eq!(c.invalidate(r2.addr() - 1, 1), 0);
    assert_eq!(c.invalidate_region(&r2), 1);
    assert_eq!(c.stats().entries, 0);
}

#[derive(Debug, Clone)]
enum Op {
    /// Look up a range of region slot `slot` (fractions of its length) and maybe keep the handle.
    Get {
        slot: usize,
        off: u16,
        len: u16,
        keep: bool,
    },
    /// Drop a kept handle.
    Release { which: usize },
    /// Invalidate the range of a slot's region.
    Invalidate { slot: usize },
    /// The slot's memory gets a new owner at the same address (freed and re-allocated).
    NewOwner { slot: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6usize, any::<u16>(), any::<u16>(), any::<bool>())
            .prop_map(|(slot, off, len, keep)| Op::Get { slot, off, len, keep }),
        2 => (0..8usize).prop_map(|which| Op::Release { which }),
        1 => (0..6usize).prop_map(|slot| Op::Invalidate { slot }),
        1 => (0..6usize).prop_map(|slot| Op::NewOwner { slot }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn lookups_cover_requests_limits_hold_and_pinned_entries_survive(
        ops in proptest::collection::vec(op(), 1..60),
        max_kib in 8u64..40,
        max_entries in 1usize..5,
    ) {
        let max_bytes = max_kib << 10;
        let c = cache(max_bytes, max_entries);
        // Three buffers; slots 0-5 are regions over a buffer or a slice of it, so owners overlap.
        let bufs: Vec<Bytes> = (0..3).map(|i| Bytes::from(vec![i as u8; (i + 1) * 3000])).collect();
        let view = |slot: usize| {
            let b = &bufs[slot % 3];
            if slot < 3 { b.clone() } else { b.slice(b.len() / 3..) }
        };
        let mut regions: Vec<UserRegion> = (0..6).map(|s| UserRegion::new(view(s))).collect();
        let mut kept: Vec<(crate::CachedMr, usize)> = Vec::new();
        // region id → lkey of its entry while a kept handle pins it and it was not invalidated.
        let mut pinned: HashMap<u64, u32> = HashMap::new();
        for op in ops {
            match op {
                Op::Get { slot, off, len, keep } => {
                    let r = &regions[slot];
                    let off = off as usize % r.len();
                    let len = 1 + len as usize % (r.len() - off);
                    let before = c.stats();
                    match c.get(r, off, len) {
                        Ok(h) => {
                            let (addr, end) = (r.addr() + off as u64, r.addr() + (off + len) as u64);
                            prop_assert_eq!(h.addr(), addr);
                            prop_assert!(h.mr().addr() <= addr && end <= h.mr().addr() + h.mr().len() as u64,
                                "entry {:#x}+{} does not cover {:#x}..{:#x}", h.mr().addr(), h.mr().len(), addr, end);
                            prop_assert_eq!(h.region_id(), r.id());
                            if let Some(&lkey) = pinned.get(&r.id()) {
                                prop_assert_eq!(h.lkey(), lkey, "a pinned entry was replaced");
                                prop_assert_eq!(c.stats().hits, before.hits + 1);
                            }
                            if keep {
                                pinned.insert(r.id(), h.lkey());
                                kept.push((h, slot));
                            }
                        }
                        Err(MemError::CacheFull { requested, registered, entries, .. }) => {
                            prop_assert!(!pinned.contains_key(&r.id()), "a pinned region must hit");
                            // The region alone is too large, or only in-use entries are left and
                            // they leave no room.
                            let s = c.stats();
                            if requested <= max_bytes {
                                prop_assert_eq!(s.in_use, s.entries);
                                prop_assert!(registered + requested > max_bytes || entries as usize >= max_entries);
                            }
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                Op::Release { which } => {
                    if !kept.is_empty() {
                        let (h, _) = kept.remove(which % kept.len());
                        let (id, lkey) = (h.region_id(), h.lkey());
                        drop(h);
                        // The pin holds while a handle on the same entry is kept; a handle on
                        // an older, invalidated entry of the region does not pin the new one.
                        if pinned.get(&id) == Some(&lkey)
                            && !kept.iter().any(|(k, _)| k.region_id() == id && k.lkey() == lkey)
                        {
                            pinned.remove(&id);
                        }
                    }
                }
                Op::Invalidate { slot } => {
                    let r = &regions[slot];
                    c.invalidate(r.addr(), r.len() as u64);
                    // Every region overlapping it may be invalidated: forget their pins.
                    pinned.clear();
                    let _ = slot;
                }
                Op::NewOwner { slot } => {
                    let old = regions[slot].id();
                    regions[slot] = UserRegion::new(view(slot));
                    prop_assert_ne!(regions[slot].id(), old);
                    let before = c.stats().misses;
                    if let Ok(h) = c.get(&regions[slot], 0, 1) {
                        prop_assert_eq!(h.region_id(), regions[slot].id());
                    }
                    prop_assert_eq!(c.stats().misses, before + 1, "a new owner is registered anew");
                }
            }
            let s = c.stats();
            prop_assert!(s.bytes_registered <= max_bytes, "{:?}", s);
            prop_assert!(s.entries as usize <= max_entries, "{:?}", s);
        }
        drop(kept);
        c.clear();
        let s = c.stats();
        prop_assert_eq!((s.entries, s.bytes_registered, s.in_use), (0, 0, 0));
    }
}
