//! The fixed-size pool (a thin layer over one pool and its reserve) on the soft device.

mod common;

use byteexpress_mem::{BufPool, MemError, is_pool_memory};
use byteexpress_verbs::Pd;
use bytes::BufMut;

fn pd() -> Pd {
    common::soft().alloc_pd().expect("pd")
}

#[test]
fn exhaustion_is_a_typed_error_and_a_drop_makes_room() {
    let pool = BufPool::for_receives(&pd(), 4096, 2).unwrap();
    let a = pool.alloc().unwrap();
    let _b = pool.alloc().unwrap();
    assert!(matches!(
        pool.alloc(),
        Err(MemError::ReserveEmpty {
            count: 2,
            buf_size: 4096
        })
    ));
    assert_eq!(pool.stats().exhaustions, 1);
    drop(a);
    assert!(pool.alloc().is_ok());
}

#[test]
fn frozen_bytes_stay_in_the_pool_and_return_it_on_the_last_drop() {
    let pool = BufPool::for_receives(&pd(), 4096, 1).unwrap();
    let mut buf = pool.alloc().unwrap();
    buf.put_slice(b"hello registered world");
    let addr = buf.addr();
    let bytes = buf.freeze();
    assert_eq!(&bytes[..], b"hello registered world");
    assert_eq!(bytes.as_ptr() as u64, addr, "no copy on freeze");
    assert!(is_pool_memory(bytes.as_ptr()) && pool.contains(bytes.as_ptr()));
    let slice = bytes.slice(6..16);
    drop(bytes);
    assert_eq!(pool.available(), 0, "a live slice keeps the buffer");
    assert_eq!(&slice[..], b"registered");
    drop(slice);
    assert_eq!(pool.available(), 1, "the last drop returns it");
}

#[test]
fn bufmut_writes_stop_at_the_capacity_and_sges_name_the_filled_bytes() {
    let pool = BufPool::for_receives(&pd(), 64, 1).unwrap();
    let mut buf = pool.alloc().unwrap();
    assert_eq!(buf.remaining_mut(), 64);
    buf.put_bytes(7, 60);
    assert!(
        buf.extend_from_slice(&[0; 5]).is_err(),
        "5 bytes do not fit in 4"
    );
    assert_eq!(buf.len(), 60, "a refused write changes nothing");
    let sge = buf.sge();
    assert_eq!((sge.addr, sge.len, sge.lkey), (buf.addr(), 60, buf.lkey()));
    assert_eq!(buf.recv_sge().len, 64);
}

#[test]
fn buffers_never_overlap_and_memory_outside_pools_is_not_pool_memory() {
    let pool = BufPool::for_receives(&pd(), 256, 16).unwrap();
    let bufs: Vec<_> = (0..16).map(|_| pool.alloc().unwrap()).collect();
    let mut addrs: Vec<u64> = bufs.iter().map(|b| b.addr()).collect();
    addrs.sort();
    assert!(addrs.windows(2).all(|w| w[1] - w[0] >= 256));
    let heap = Box::new([0u8; 16]);
    assert!(!is_pool_memory(heap.as_ptr()));
}

#[test]
fn zero_sized_pools_are_refused() {
    assert!(matches!(
        BufPool::for_receives(&pd(), 0, 4),
        Err(MemError::InvalidConfig(_))
    ));
    assert!(matches!(
        BufPool::for_receives(&pd(), 4096, 0),
        Err(MemError::InvalidConfig(_))
    ));
}

#[test]
fn buffers_of_an_odd_size_keep_that_capacity_and_the_pool_registers_once() {
    let pool = BufPool::for_receives(&pd(), 3000, 5).unwrap();
    let bufs: Vec<_> = (0..5).map(|_| pool.alloc().unwrap()).collect();
    assert!(
        bufs.iter()
            .all(|b| b.capacity() == 3000 && b.recv_sge().len == 3000)
    );
    let s = pool.stats();
    assert_eq!((s.chunks, s.mrs, s.in_use()), (1, 1, 5));
    assert_eq!(
        s.bytes_registered,
        5 * 4096,
        "one chunk of five 4 KiB slots"
    );
    drop(bufs);
    assert_eq!((pool.available(), pool.stats().in_use()), (5, 0));
}
