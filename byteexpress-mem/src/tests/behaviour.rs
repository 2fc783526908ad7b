//! One behaviour per test, each failing when its feature is missing.

use std::collections::HashSet;
use std::time::Duration;

use bytes::{BufMut, BytesMut};

use super::{pool, small};
use crate::{MemError, PoolConfig};

#[test]
fn growth_stops_at_the_limit_and_exhaustion_is_a_typed_error() {
    let p = pool(PoolConfig {
        limit: 128 << 10,
        ..small()
    });
    assert_eq!(
        p.stats().bytes_registered,
        0,
        "nothing before the first request"
    );
    let held: Vec<_> = (0..8).map(|_| p.try_alloc(16 << 10).unwrap()).collect();
    let s = p.stats();
    assert_eq!((s.bytes_registered, s.chunks), (128 << 10, 2));
    assert!(matches!(
        p.try_alloc(10_000),
        Err(MemError::Exhausted {
            class_size: 16384,
            registered: 131072,
            limit: 131072
        })
    ));
    assert_eq!(p.stats().exhaustions, 1);
    assert_eq!(p.stats().classes[6].in_use, 8);
    drop(held);
    assert!(p.try_alloc(16 << 10).is_ok(), "a drop makes room");
}

#[test]
fn requests_above_the_largest_class_are_refused() {
    let p = pool(small());
    assert!(matches!(
        p.try_alloc((16 << 10) + 1),
        Err(MemError::TooLarge {
            len: 16385,
            max: 16384
        })
    ));
    assert!(matches!(
        p.reserve(1 << 20, 1),
        Err(MemError::TooLarge { .. })
    ));
    assert!(matches!(p.reserve(256, 0), Err(MemError::InvalidConfig(_))));
    assert_eq!(p.class_size(300), Some(512));
}

#[test]
fn a_full_pool_recarves_an_idle_chunk_for_another_class() {
    let p = pool(PoolConfig {
        limit: 64 << 10,
        ..small()
    });
    let big: Vec<_> = (0..4).map(|_| p.try_alloc(16 << 10).unwrap()).collect();
    assert!(p.try_alloc(256).is_err(), "the only chunk is busy");
    let keep = big.into_iter().next();
    p.flush_thread_cache();
    assert!(p.try_alloc(256).is_err(), "one live buffer pins the chunk");
    drop(keep);
    p.flush_thread_cache();
    let small_buf = p.try_alloc(256).unwrap();
    let s = p.stats();
    assert_eq!(
        (s.chunks, s.bytes_registered),
        (1, 64 << 10),
        "no new registration"
    );
    assert_eq!((s.classes[0].chunks, s.classes[6].chunks), (1, 0));
    drop(small_buf);
}

#[test]
fn cache_hits_count_reuse_and_misses_count_refills() {
    let p = pool(small());
    let first = p.try_alloc(1000).unwrap();
    let addr = first.addr();
    drop(first);
    for _ in 0..10 {
        let again = p.try_alloc(1000).unwrap();
        assert_eq!(again.addr(), addr, "the cache hands back the hot buffer");
    }
    let s = p.stats();
    assert_eq!((s.cache_misses, s.cache_hits), (1, 10));
    assert_eq!(s.in_use(), 0);
}

#[test]
fn a_buffer_freed_on_another_thread_goes_home_to_its_pool() {
    let p = pool(PoolConfig {
        limit: 64 << 10,
        ..small()
    });
    let bufs: Vec<_> = (0..4).map(|_| p.try_alloc(16 << 10).unwrap()).collect();
    std::thread::spawn(move || drop(bufs)).join().unwrap();
    assert_eq!(p.stats().in_use(), 0);
    let again: Vec<_> = (0..4).map(|_| p.try_alloc(16 << 10)).collect();
    assert!(
        again.iter().all(|r| r.is_ok()),
        "all four came back: {again:?}"
    );
}

#[test]
fn frozen_bytes_return_the_buffer_on_the_last_drop_and_bytesmut_copies() {
    let p = pool(small());
    let mut buf = p.try_alloc(64).unwrap();
    buf.put_slice(b"hello registered world");
    let addr = buf.addr();
    let bytes = buf.freeze();
    assert_eq!(bytes.as_ptr() as u64, addr, "no copy on freeze");
    assert!(p.contains(bytes.as_ptr()));
    let slice = bytes.slice(6..16);
    drop(bytes);
    assert_eq!(p.stats().in_use(), 1, "a live slice keeps the buffer");
    assert_eq!(&slice[..], b"registered");
    let copy = BytesMut::from(slice);
    assert_ne!(copy.as_ptr() as u64, addr + 6, "BytesMut::from copies");
    assert_eq!(p.stats().in_use(), 0, "and releases the buffer at once");
    assert_eq!(&copy[..], b"registered");
}

#[test]
fn bufmut_writes_stop_at_the_requested_capacity() {
    let p = pool(small());
    let mut buf = p.try_alloc(100).unwrap();
    assert_eq!((buf.capacity(), buf.remaining_mut()), (100, 100));
    buf.put_bytes(7, 96);
    assert!(matches!(
        buf.extend_from_slice(&[0; 5]),
        Err(MemError::NoRoom { len: 5, free: 4 })
    ));
    assert_eq!(buf.len(), 96, "a refused write changes nothing");
    let sge = buf.sge();
    assert_eq!((sge.addr, sge.len, sge.lkey), (buf.addr(), 96, buf.lkey()));
    assert_eq!(buf.recv_sge().len, 100);
    buf.set_len(1000);
    assert_eq!(buf.len(), 100, "set_len clamps to the capacity");
}

#[test]
fn chunks_above_max_mr_size_are_registered_as_several_mrs_no_buffer_straddling_two() {
    let p = pool(PoolConfig {
        max_mr_size: (16 << 10) + 5,
        limit: 64 << 10,
        ..small()
    });
    let bufs: Vec<_> = (0..16).map(|_| p.try_alloc(4096).unwrap()).collect();
    let s = p.stats();
    assert_eq!((s.chunks, s.mrs), (1, 4));
    let base = bufs.iter().map(|b| b.addr()).min().unwrap();
    let lkeys: HashSet<u32> = bufs.iter().map(|b| b.lkey()).collect();
    assert_eq!(lkeys.len(), 4);
    for a in &bufs {
        for b in &bufs {
            let same_mr = (a.addr() - base) / (16 << 10) == (b.addr() - base) / (16 << 10);
            assert_eq!(same_mr, a.lkey() == b.lkey());
        }
    }
}

#[test]
fn reserve_buffers_come_back_to_the_reserve_then_to_the_pool() {
    let p = pool(PoolConfig {
        limit: 64 << 10,
        ..small()
    });
    let r = p.reserve(4000, 8).unwrap();
    assert_eq!((r.count(), r.available(), r.buf_size()), (8, 8, 4000));
    assert_eq!(p.stats().classes[4].reserved, 8);
    let a = r.take().unwrap();
    assert_eq!((a.capacity(), p.stats().classes[4].in_use), (4000, 1));
    drop(a);
    assert_eq!(r.available(), 8);
    let held: Vec<_> = (0..8).map(|_| r.take().unwrap()).collect();
    assert!(matches!(
        r.take(),
        Err(MemError::ReserveEmpty {
            count: 8,
            buf_size: 4000
        })
    ));
    drop(held);
    // The reserve holds half the only chunk: the pool can give out the other half only.
    let out: Vec<_> = (0..8).map(|_| p.try_alloc(4096).unwrap()).collect();
    assert!(p.try_alloc(4096).is_err());
    drop(r);
    assert_eq!(p.stats().classes[4].reserved, 0);
    assert!(
        p.try_alloc(4096).is_ok(),
        "a dropped reserve returns its buffers"
    );
    drop(out);
}

#[tokio::test]
async fn a_waiting_alloc_wakes_when_another_thread_frees() {
    let p = pool(PoolConfig {
        limit: 64 << 10,
        ..small()
    });
    let mut held: Vec<_> = (0..4).map(|_| p.try_alloc(16 << 10).unwrap()).collect();
    let last = held.pop().unwrap();
    let freer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        drop(last);
    });
    let got = p.alloc(16 << 10, None).await.unwrap();
    assert_eq!(got.capacity(), 16 << 10);
    assert_eq!(p.stats().waits, 1);
    freer.join().unwrap();
}

#[tokio::test]
async fn a_wait_gives_up_at_its_deadline_with_a_typed_error() {
    let p = pool(PoolConfig {
        limit: 64 << 10,
        ..small()
    });
    let _held: Vec<_> = (0..4).map(|_| p.try_alloc(16 << 10).unwrap()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(20);
    let r = p.alloc(8 << 10, Some(deadline)).await;
    assert!(
        matches!(r, Err(MemError::DeadlineExceeded { len: 8192 })),
        "{r:?}"
    );
    let s = p.stats();
    assert_eq!((s.waits, s.exhaustions), (1, 1));
    assert_eq!(
        p.shared.waiters.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the waiter unregistered"
    );
}

#[test]
fn a_buffer_outlives_its_pool_handles_and_the_pool_goes_with_the_last_buffer() {
    let p = pool(small());
    let weak = std::sync::Arc::downgrade(&p.shared);
    let mut buf = p.try_alloc(1000).unwrap();
    let cached: Vec<_> = (0..3).map(|_| p.try_alloc(1000).unwrap()).collect();
    drop(cached);
    assert!(p.shared.leases() >= 4, "cached and held slots are leased");
    drop(p);
    assert!(weak.upgrade().is_some(), "a live buffer keeps its pool");
    assert_eq!(
        weak.upgrade().unwrap().leases(),
        1,
        "the last handle's thread handed its cached slots back"
    );
    buf.put_slice(b"still registered");
    assert_eq!(buf.as_slice(), b"still registered");
    drop(buf);
    assert!(weak.upgrade().is_none(), "the last buffer freed the pool");
}

#[test]
fn another_thread_hands_back_the_cached_buffers_of_an_orphaned_pool_at_its_next_use() {
    let p = pool(small());
    let other = pool(small());
    let weak = std::sync::Arc::downgrade(&p.shared);
    let bufs: Vec<_> = (0..4).map(|_| p.try_alloc(4096).unwrap()).collect();
    let (to_freer, freer_rx) = std::sync::mpsc::channel::<()>();
    let (freed_tx, freed) = std::sync::mpsc::channel::<()>();
    let freer = std::thread::spawn(move || {
        drop(bufs); // into this thread's cache of `p`
        freed_tx.send(()).unwrap();
        freer_rx.recv().unwrap();
        // Any use of any pool looks for orphaned pools first.
        drop(other.try_alloc(100).unwrap());
        freed_tx.send(()).unwrap();
        freer_rx.recv().unwrap();
    });
    freed.recv().unwrap();
    assert_eq!(p.stats().in_use(), 0);
    drop(p);
    assert!(
        weak.upgrade().is_some(),
        "the other thread still caches its buffers"
    );
    to_freer.send(()).unwrap();
    freed.recv().unwrap();
    assert!(
        weak.upgrade().is_none(),
        "handed back at that thread's next use"
    );
    to_freer.send(()).unwrap();
    freer.join().unwrap();
}

#[test]
fn frees_of_an_orphaned_pool_bypass_caches_and_stats_stay_exact() {
    let p = pool(small());
    let r = p.reserve(256, 2).unwrap();
    let bufs: Vec<_> = (0..5).map(|_| p.try_alloc(2000).unwrap()).collect();
    let weak = std::sync::Arc::downgrade(&p.shared);
    drop(p);
    let s = r.stats();
    assert_eq!((s.classes[3].in_use, s.classes[0].reserved), (5, 2));
    std::thread::spawn(move || drop(bufs)).join().unwrap();
    let shared = weak.upgrade().unwrap();
    assert_eq!(shared.leases(), 0, "every slot went straight home");
    drop(shared);
    assert_eq!(r.stats().in_use(), 0);
    drop(r);
    assert!(weak.upgrade().is_none(), "the reserve was the last holder");
}
