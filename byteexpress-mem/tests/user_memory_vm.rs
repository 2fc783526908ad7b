//! Memory the pool did not allocate, sent through the [`MrCache`] on the provider `BX_PROVIDER`
//! selects: `soft` (default, on any host) or `ibverbs` (rxe0 inside the Soft-RoCE VM, through
//! `scripts/vm-tests.sh`). An unavailable provider fails the test; nothing skips.
//!
//! The MAP_FIXED scenario: region A is mapped, registered through the cache and sent; its entry
//! is invalidated and its owner dropped (munmap); region B is mapped at the same address
//! (`MAP_FIXED_NOREPLACE`) with other bytes and sent through the cache again. The peer must
//! receive B: an MR left over from A would make a NIC read A's pages, still pinned under the old
//! registration (`ibv_reg_mr(3)` pins the pages present at registration time).
//!
//! RLIMIT_MEMLOCK: a re-executed child drops every capability (`capset(2)`, so CAP_IPC_LOCK no
//! longer exempts it), sets RLIMIT_MEMLOCK to 64 KiB (`setrlimit(2)`) and grows a [`Pool`] past
//! it: the error must be [`MemError::Memlock`] naming the limit. Only on `ibverbs`: the soft
//! provider pins nothing, so there is no limit to hit.

use std::time::Duration;

use byteexpress_mem::{AnonMap, MemError, MrCache, MrCacheConfig, Pool, PoolConfig};
use byteexpress_verbs::{
    Access, ConnectAttr, Cq, Mr, Qp, QpCap, RecvWr, SendWr, SharedMem, UserRegion, Wc, WcStatus,
    WrOp,
};

const LEN: usize = 64 << 10;

mod common;
use common::provider;

/// The next completion of `cq`, polling for up to 10 s.
fn wait_one(cq: &Cq) -> Wc {
    common::completion_within(cq, Duration::from_secs(10))
}

struct Peer {
    qp: Qp,
    cq: Cq,
    mem: SharedMem,
    mr: Mr,
}

/// Posts a receive of the whole buffer, SENDs `sge` from `qp`, returns the received bytes.
fn send_and_receive(qp: &Qp, cq: &Cq, peer: &Peer, sge: byteexpress_verbs::Sge) -> Vec<u8> {
    let rsge = [peer.mr.sge(0, LEN as u32).unwrap()];
    peer.qp
        .post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &rsge,
        })
        .unwrap();
    qp.post_send(&SendWr {
        wr_id: 2,
        op: WrOp::Send,
        sg_list: &[sge],
        signaled: true,
        inline: false,
    })
    .unwrap();
    let tx = wait_one(cq);
    assert_eq!(tx.status, WcStatus::Success, "{tx:?}");
    let rx = wait_one(&peer.cq);
    assert_eq!(rx.status, WcStatus::Success, "{rx:?}");
    let n = rx.byte_len as usize;
    let mut out = vec![0u8; n];
    // SAFETY: `n` ≤ LEN bytes of the peer's live mapping; the receive completed.
    unsafe { std::ptr::copy_nonoverlapping(peer.mem.as_ptr(), out.as_mut_ptr(), n) };
    out
}

fn fill(map: &mut AnonMap, seed: u8) -> Vec<u8> {
    let bytes: Vec<u8> = (0..map.len())
        .map(|i| seed ^ (i as u8).wrapping_mul(31) ^ (i >> 10) as u8)
        .collect();
    map.as_mut().copy_from_slice(&bytes);
    bytes
}

#[test]
fn memory_remapped_at_the_same_address_is_registered_anew_and_sent_with_its_new_bytes() {
    let ctx = provider();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCap::default()).unwrap();
    let peer_cq = ctx.create_cq(16).unwrap();
    let peer_qp = pd.create_qp(&peer_cq, &peer_cq, QpCap::default()).unwrap();
    let mem = pd.alloc_shared(LEN).unwrap();
    let mr = pd.reg_shared(&mem, 0, LEN, Access::LOCAL_WRITE).unwrap();
    qp.connect(&peer_qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    peer_qp
        .connect(&qp.endpoint(), &ConnectAttr::default())
        .unwrap();
    let peer = Peer {
        qp: peer_qp,
        cq: peer_cq,
        mem,
        mr,
    };
    let cache = MrCache::new(&pd, MrCacheConfig::default()).unwrap();

    let mut a = AnonMap::new(LEN).unwrap();
    let pattern_a = fill(&mut a, 0xa5);
    let addr = a.addr();
    let region_a = UserRegion::new(a);
    let h = cache.get(&region_a, 0, LEN).unwrap();
    assert_eq!(send_and_receive(&qp, &cq, &peer, h.sge()), pattern_a);
    let lkey_a = h.lkey();
    drop(h); // the WR completed
    drop(region_a); // the cache still holds the owner: A stays mapped
    let e = AnonMap::new_at(addr, LEN).expect_err("A is still mapped under the cache");
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");

    assert_eq!(cache.invalidate(addr as u64, LEN as u64), 1);
    assert_eq!(cache.stats().entries, 0, "deregistered and A unmapped");

    let mut b = AnonMap::new_at(addr, LEN).expect("A's address is free again");
    assert_eq!(b.addr(), addr);
    let pattern_b = fill(&mut b, 0x3c);
    assert_ne!(pattern_a, pattern_b);
    let region_b = UserRegion::new(b);
    let misses = cache.stats().misses;
    let h = cache.get(&region_b, 0, LEN).unwrap();
    assert_eq!(cache.stats().misses, misses + 1, "B is registered anew");
    assert_eq!(h.addr(), addr as u64);
    let got = send_and_receive(&qp, &cq, &peer, h.sge());
    assert!(
        got == pattern_b,
        "the peer received A's bytes (or others), not B's: stale MR {lkey_a:#x}"
    );
}

#[test]
fn a_new_owner_at_the_same_address_misses_even_without_invalidation() {
    let ctx = provider();
    let pd = ctx.alloc_pd().unwrap();
    let cache = MrCache::new(&pd, MrCacheConfig::default()).unwrap();
    let bytes = bytes::Bytes::from(vec![7u8; 8192]);
    let first = cache.get(&UserRegion::new(bytes.clone()), 0, 8192).unwrap();
    let second = cache.get(&UserRegion::new(bytes.clone()), 0, 8192).unwrap();
    assert_eq!(first.addr(), second.addr());
    assert_ne!(first.region_id(), second.region_id());
    assert_eq!(cache.stats().misses, 2);
}

/// RLIMIT_MEMLOCK the child sets, bytes.
const MEMLOCK: u64 = 64 << 10;

/// `struct __user_cap_header_struct` (linux/capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct` (linux/capability.h).
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops every capability of this process (CAP_IPC_LOCK included), irrevocably.
fn drop_all_capabilities() {
    let mut hdr = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads one header and two data structs (version 3) through valid pointers.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

fn memlock_child() {
    let lim = libc::rlimit {
        rlim_cur: MEMLOCK,
        rlim_max: MEMLOCK,
    };
    // SAFETY: setrlimit reads one rlimit through a valid pointer.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
    drop_all_capabilities();
    let ctx = provider();
    let pd = ctx.alloc_pd().unwrap();
    let cfg = PoolConfig {
        min_class: 4096,
        max_class: 16 << 10,
        chunk_size: 64 << 10,
        limit: 1 << 20,
        huge_pages: false,
        ..PoolConfig::for_device(&ctx)
    };
    let pool = Pool::new(&pd, cfg).unwrap();
    let mut held = Vec::new();
    for _ in 0..64 {
        match pool.try_alloc(16 << 10) {
            Ok(b) => held.push(b),
            Err(e @ MemError::Memlock { soft, .. }) => {
                assert_eq!(soft, MEMLOCK, "{e}");
                let msg = e.to_string();
                assert!(
                    msg.contains("RLIMIT_MEMLOCK") && msg.contains(&MEMLOCK.to_string()),
                    "{msg}"
                );
                assert!(
                    held.len() as u64 * (16 << 10) <= MEMLOCK,
                    "{} buffers of 16 KiB were pinned under a 64 KiB limit",
                    held.len()
                );
                return;
            }
            Err(e) => panic!("expected MemError::Memlock, got {e}"),
        }
    }
    panic!("1 MiB registered under RLIMIT_MEMLOCK = 64 KiB without CAP_IPC_LOCK");
}

#[test]
fn a_pool_growing_past_rlimit_memlock_without_cap_ipc_lock_fails_with_memlock() {
    if std::env::var_os("BX_MEMLOCK_CHILD").is_some() {
        memlock_child();
        return;
    }
    if std::env::var("BX_PROVIDER").as_deref() != Ok("ibverbs") {
        eprintln!("skipped: the soft provider pins no memory, so RLIMIT_MEMLOCK never applies");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_pool_growing_past_rlimit_memlock_without_cap_ipc_lock_fails_with_memlock",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BX_MEMLOCK_CHILD", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
