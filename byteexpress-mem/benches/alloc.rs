//! Allocation cost of registered buffers: the pool's cached path, a free on another thread, and
//! the two alternatives it replaces (heap `Vec`, registering every message).

use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use byteexpress_mem::{Pool, PoolConfig};
use byteexpress_verbs::{Access, Pd};
use criterion::{Criterion, criterion_group, criterion_main};

#[path = "../tests/common/mod.rs"]
mod common;

fn soft_pd() -> Pd {
    common::soft().alloc_pd().expect("pd")
}

/// Allocates `iters` items on this thread and drops each on another thread.
fn cross_thread<T: Send + 'static>(iters: u64, mut make: impl FnMut() -> T) -> Duration {
    let (tx, rx) = mpsc::sync_channel::<T>(1024);
    let freer = std::thread::spawn(move || {
        for item in rx {
            drop(item)
        }
    });
    let start = Instant::now();
    for _ in 0..iters {
        tx.send(make()).unwrap();
    }
    drop(tx);
    freer.join().unwrap();
    start.elapsed()
}

fn alloc(c: &mut Criterion) {
    let pd = soft_pd();
    let pool = Pool::new(&pd, PoolConfig::default()).unwrap();
    let mut g = c.benchmark_group("alloc_free_4KiB");
    g.bench_function("pool_cached", |b| {
        b.iter(|| drop(black_box(pool.try_alloc(black_box(4096)).unwrap())))
    });
    g.bench_function("vec", |b| {
        b.iter(|| drop(black_box(Vec::<u8>::with_capacity(black_box(4096)))))
    });
    let mem = pd.alloc_shared(1 << 20).unwrap();
    g.bench_function("reg_shared_per_message", |b| {
        let mut off = 0;
        b.iter(|| {
            let mr = pd.reg_shared(&mem, off, 4096, Access::ALL).unwrap();
            off = (off + 4096) % (1 << 20);
            drop(black_box(mr))
        })
    });
    g.bench_function("pool_cross_thread_free", |b| {
        b.iter_custom(|iters| cross_thread(iters, || pool.try_alloc(4096).unwrap()))
    });
    g.bench_function("vec_cross_thread_free", |b| {
        b.iter_custom(|iters| cross_thread(iters, || Vec::<u8>::with_capacity(black_box(4096))))
    });
    g.finish();
    let mut g = c.benchmark_group("alloc_free_sizes");
    for len in [256usize, 64 << 10, 2 << 20] {
        g.bench_function(format!("pool_cached_{len}"), |b| {
            b.iter(|| drop(black_box(pool.try_alloc(black_box(len)).unwrap())))
        });
    }
    g.finish();
    let s = pool.stats();
    eprintln!(
        "pool after the benches: {} bytes registered in {} chunks, cache hits {}, misses {}",
        s.bytes_registered, s.chunks, s.cache_hits, s.cache_misses
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = alloc
}
criterion_main!(benches);
