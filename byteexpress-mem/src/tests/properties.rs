//! Properties over random sequences of allocations and frees.

use std::sync::mpsc;

use proptest::prelude::*;

use super::{pool, small};
use crate::{MemError, PoolConfig, RegisteredBuf};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: if cfg!(miri) { 3 } else { 48 },
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Largest request; smaller under miri, where stamping every byte is slow.
const MAX_LEN: usize = if cfg!(miri) { 2048 } else { 16 << 10 };

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free(usize),
}

fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0usize..=MAX_LEN).prop_map(Op::Alloc),
        2 => any::<usize>().prop_map(Op::Free),
    ];
    proptest::collection::vec(op, 1..max)
}

/// Fills a buffer with a pattern unique to `tag`, so an overlap shows as a corrupted pattern.
fn stamp(buf: &mut RegisteredBuf, tag: u32) {
    buf.clear();
    let cap = buf.capacity();
    let bytes = tag.to_le_bytes();
    for i in 0..cap {
        bytes::BufMut::put_u8(buf, bytes[i % 4]);
    }
}

fn stamped(buf: &RegisteredBuf, tag: u32) -> bool {
    let bytes = tag.to_le_bytes();
    buf.as_slice()
        .iter()
        .enumerate()
        .all(|(i, &b)| b == bytes[i % 4])
}

/// `[addr, addr + class size)` of every live buffer is disjoint from every other's.
fn disjoint(p: &crate::Pool, live: &[(RegisteredBuf, u32)]) -> bool {
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .map(|(b, _)| {
            let size = p.class_size(b.capacity()).unwrap() as u64;
            (b.addr(), b.addr() + size)
        })
        .collect();
    spans.sort();
    spans.windows(2).all(|w| w[0].1 <= w[1].0)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn live_buffers_never_overlap_are_aligned_and_all_return(seq in ops(if cfg!(miri) { 24 } else { 200 })) {
        let p = pool(small());
        let mut live: Vec<(RegisteredBuf, u32)> = Vec::new();
        for (tag, op) in seq.into_iter().enumerate() {
            match op {
                Op::Alloc(len) => match p.try_alloc(len) {
                    Ok(mut b) => {
                        let size = p.class_size(len).unwrap();
                        prop_assert_eq!(b.capacity(), len);
                        prop_assert_eq!(b.addr() % size.min(4096) as u64, 0, "aligned to its class");
                        stamp(&mut b, tag as u32);
                        live.push((b, tag as u32));
                        prop_assert!(disjoint(&p, &live));
                    }
                    Err(MemError::Exhausted { .. }) => {
                        prop_assert!(p.stats().bytes_registered + small().chunk_size as u64 > small().limit);
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                },
                Op::Free(i) if !live.is_empty() => {
                    let (b, tag) = live.swap_remove(i % live.len());
                    prop_assert!(stamped(&b, tag), "another buffer wrote into this one");
                }
                Op::Free(_) => {}
            }
            prop_assert_eq!(p.stats().in_use(), live.len() as u64);
        }
        for (b, tag) in &live {
            prop_assert!(stamped(b, *tag));
        }
        drop(live);
        let s = p.stats();
        prop_assert_eq!(s.in_use(), 0);
        prop_assert!(s.classes.iter().all(|c| c.in_use == 0));
        prop_assert!(s.bytes_registered <= s.limit);
    }

    #[test]
    fn concurrent_alloc_and_cross_thread_free_lose_nothing(
        threads in 2usize..4,
        seqs in proptest::collection::vec(ops(if cfg!(miri) { 12 } else { 120 }), 4),
    ) {
        let p = pool(PoolConfig { limit: 1 << 20, ..small() });
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..threads).map(|_| mpsc::channel::<(RegisteredBuf, u32)>()).unzip();
        let handles: Vec<_> = rxs.into_iter().enumerate().map(|(t, rx)| {
            let p = p.clone();
            let next = txs[(t + 1) % threads].clone();
            let seq = seqs[t].clone();
            std::thread::spawn(move || -> Result<(), String> {
                let mut live: Vec<(RegisteredBuf, u32)> = Vec::new();
                for (i, op) in seq.into_iter().enumerate() {
                    let tag = (t as u32) << 16 | i as u32;
                    match op {
                        Op::Alloc(len) => if let Ok(mut b) = p.try_alloc(len) {
                            stamp(&mut b, tag);
                            live.push((b, tag));
                        },
                        Op::Free(k) if !live.is_empty() => {
                            let (b, tag) = live.swap_remove(k % live.len());
                            if !stamped(&b, tag) {
                                return Err(format!("buffer {tag:#x} overwritten"));
                            }
                            // Every other buffer is freed by the next thread.
                            if k % 2 == 0 { drop(b) } else { let _ = next.send((b, tag)); }
                        }
                        Op::Free(_) => {}
                    }
                    while let Ok((b, tag)) = rx.try_recv() {
                        if !stamped(&b, tag) {
                            return Err(format!("handed-over buffer {tag:#x} overwritten"));
                        }
                    }
                }
                drop(next);
                for (b, tag) in live {
                    if !stamped(&b, tag) {
                        return Err(format!("buffer {tag:#x} overwritten"));
                    }
                }
                Ok(())
            })
        }).collect();
        drop(txs);
        for h in handles {
            prop_assert_eq!(h.join().unwrap(), Ok(()));
        }
        // Buffers still in flight in channels dropped with the receivers above.
        let s = p.stats();
        prop_assert_eq!(s.in_use(), 0, "{:?}", s);
        p.flush_thread_cache();
        // Every buffer is back on a free list: the pool can hand out all it ever carved again.
        let size = 16 << 10;
        let want = (s.limit / size as u64) as usize;
        let all: Vec<_> = (0..want).map(|_| p.try_alloc(size)).collect();
        prop_assert!(all.iter().all(|r| r.is_ok()), "{:?}", all.iter().find(|r| r.is_err()));
    }

    #[test]
    fn a_full_send_side_never_stops_receives_from_being_reposted(
        recv_n in 1usize..8,
        send_lens in proptest::collection::vec(1usize..=16 << 10, 1..64),
        rounds in 1usize..20,
    ) {
        let p = pool(PoolConfig { limit: 128 << 10, ..small() });
        // As the RPC engine does: `recv_n` posted, as many more held by the application.
        let reserve = p.reserve(4096, 2 * recv_n).unwrap();
        let mut posted: Vec<RegisteredBuf> = (0..recv_n).map(|_| reserve.take().unwrap()).collect();
        let mut held: Vec<RegisteredBuf> = Vec::new();
        // The send side takes everything it can, until the pool refuses.
        let mut sends = Vec::new();
        for len in send_lens.iter().cycle().take(256) {
            match p.try_alloc(*len) {
                Ok(b) => sends.push(b),
                Err(MemError::Exhausted { .. }) => {}
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
        prop_assert!(p.try_alloc(16 << 10).is_err(), "the send side is full");
        for _ in 0..rounds {
            // A receive completes: the application keeps its buffer, a fresh one is posted.
            if held.len() == recv_n {
                held.remove(0);
            }
            held.push(posted.remove(0));
            let fresh = reserve.take();
            prop_assert!(fresh.is_ok(), "{:?}", fresh);
            posted.push(fresh.unwrap());
        }
        prop_assert!(p.try_alloc(16 << 10).is_err(), "the send side stayed full");
        drop((posted, held));
        prop_assert_eq!(reserve.available(), 2 * recv_n);
        drop(sends);
    }
}
