//! Review of issue 22 (hostile peer): one raw peer announces many `Region`s of 1 TiB each over
//! its control channel (one sparse memfd, sealed against shrinking, passed again and again). The
//! victim maps every one of them (soft/peer.rs `apply`: up to `MAX_PEER_REGIONS` = 65 536
//! regions of up to `MAX_MR_SIZE` = 1 TiB each, per peer, never unmapped while the QP lives),
//! so a single peer can take the whole 47-bit address space (128 TiB) of the victim process:
//! every later mmap of the process fails (other links' rings, other peers' regions, large
//! allocations), which costs every other peer, not the one that misbehaved.
//!
//! The peer is this test binary started again (`child_entry`, role `hoarder`).
//!
//! Fixed by mapping budgets (DESIGN.md 3.1, soft/mod.rs `limits`): at most 1024 region
//! mappings and 64 GiB per peer QP, 16 Ki mappings and 16 TiB for all peers of the process;
//! a region over budget fails that peer's QP (its SEND is not delivered).

/// The per-peer budgets the victim enforces (soft/mod.rs `limits::PEER_MAPS`,
/// `limits::PEER_MAP_BYTES`).
const PEER_MAPS: usize = 1024;
const PEER_MAP_BYTES: u64 = 64 << 30;

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

use byteexpress_verbs::{ConnectAttr, QpCap, WcStatus};
use common::peer::{self, get, put};
use common::raw::{self, OFF_ANNOUNCED, attach};
use common::*;

const T: Duration = Duration::from_secs(20);
const TIB: u64 = 1 << 40;
/// The two tests measure this process's whole address space and mapping count: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    assert_eq!(role, "hoarder");
    let at = attach(&mut s);
    let huge = u64::from_le_bytes(get(&mut s).try_into().unwrap());
    let each = u64::from_le_bytes(get(&mut s).try_into().unwrap());
    // One sparse memfd of 1 TiB, sealed against shrinking: costs the peer nothing.
    let big = raw::memfd(c"hoard", 4096);
    // SAFETY: our own memfd; growing it is allowed by its seals.
    let rc = unsafe { libc::ftruncate(big.as_raw_fd(), each as libc::off_t) };
    assert_eq!(rc, 0);
    let small = raw::memfd(c"hoard-src", 4096);
    let region = |id: u64, len: u64| {
        let mut m = vec![5u8];
        for x in [id, 0, len] {
            m.extend_from_slice(&x.to_le_bytes());
        }
        m
    };
    // The victim may stop reading (or close the channel) once we are over its budget: we
    // stop when the channel stays full for 2 s, or fails.
    let mut sent = 0;
    let mut id = 0;
    while id < huge {
        match raw::try_send_msg(
            at.chan.as_raw_fd(),
            &region(1000 + id, each),
            &[big.as_raw_fd()],
        ) {
            Ok(()) => {
                sent += 1;
                id += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut p = libc::pollfd {
                    fd: at.chan.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                if unsafe { libc::poll(&mut p, 1, 2000) } <= 0 {
                    eprintln!("hoarder: the victim stopped reading after {sent} regions");
                    break;
                }
            }
            Err(e) => {
                eprintln!("hoarder: the channel failed after {sent} regions: {e}");
                break;
            }
        }
    }
    // A small region and an MR over it: the source of the SEND that makes the victim apply
    // every announcement (its receiver resolves the descriptor's key).
    let _ = raw::try_send_msg(at.chan.as_raw_fd(), &region(1, 4096), &[small.as_raw_fd()]);
    let mut mr = vec![6u8];
    mr.extend_from_slice(&0x55u32.to_le_bytes());
    for x in [1u64, 0, 4096, 0x10_0000] {
        mr.extend_from_slice(&x.to_le_bytes());
    }
    mr.extend_from_slice(&0u32.to_le_bytes());
    let _ = raw::try_send_msg(at.chan.as_raw_fd(), &mr, &[]);
    // SAFETY: OFF_ANNOUNCED is inside our own mapped ring header, 8-aligned.
    unsafe { raw::put64(at.my_ring, OFF_ANNOUNCED, huge + 2) };
    assert_eq!(get(&mut s), b"send");
    at.post_send(0, 16, raw::SRC_MR, 0x55, 0x10_0000);
    put(&mut s, b"sent");
    assert_eq!(get(&mut s), b"done");
    s.flush().unwrap();
    drop(at);
}

/// Virtual memory of this process (VmSize, bytes).
fn vm_size() -> u64 {
    let st = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = st.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Whether an anonymous PROT_NONE reservation of `len` bytes fits in our address space now.
fn can_reserve(len: u64) -> bool {
    // SAFETY: a fresh PROT_NONE anonymous mapping, unmapped at once.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return false;
        }
        libc::munmap(p, len as usize);
        true
    }
}

#[test]
fn a_peer_announcing_huge_regions_cannot_take_our_address_space() {
    if peer::peer_role().is_some() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = soft();
    let victim = soft_side(QpCap::default(), 4096);
    let nonce = 0xA5_u64 ^ u64::from(std::process::id());
    let (mut child, mut s) = raw::raw_peer_connected(
        &ctx,
        &victim,
        "child_entry",
        "hoarder",
        nonce,
        &ConnectAttr::default(),
    );
    // The largest reservation that fits now (TiB): the peer announces that many TiB less 4,
    // so the test process keeps some room to report.
    let free_tib = (1..=128u64)
        .take_while(|t| can_reserve(t * TIB))
        .last()
        .unwrap_or(0);
    assert!(
        free_tib > 8,
        "baseline: {free_tib} TiB of address space free"
    );
    let huge = free_tib - 4;
    put(&mut s, &huge.to_le_bytes());
    put(&mut s, &TIB.to_le_bytes());
    let before = vm_size();
    victim.post_recv(1, 0, 64);
    put(&mut s, b"send");
    assert_eq!(get(&mut s), b"sent");
    let wc = poll_n(&victim.recv_cq, 1, T);
    let after = vm_size();
    let grew = after.saturating_sub(before);
    let still = can_reserve(8 * TIB);
    eprintln!(
        "recv wc {:?}; VmSize grew by {} GiB ({} TiB) after one peer's announcements; \
         {free_tib} TiB reservable before, 8 TiB reservable afterwards: {still}",
        wc[0].status,
        grew >> 30,
        grew >> 40
    );
    put(&mut s, b"done");
    assert!(
        child.wait().unwrap().success(),
        "the hoarder ran to the end"
    );
    assert_ne!(
        wc[0].status,
        WcStatus::Success,
        "the peer that went over its budget lost its QP"
    );
    assert!(
        grew <= PEER_MAP_BYTES,
        "one peer made us map {} TiB of its memfds (address space every other peer needs)",
        grew >> 40
    );
    assert!(
        still,
        "after one peer's announcements our process cannot reserve 8 TiB (it could {free_tib})"
    );
}

/// Mappings of this process (lines of /proc/self/maps).
fn map_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// The same peer with small regions: each is one more mapping of ours (a VMA), and the
/// per-peer limit (`MAX_PEER_REGIONS`, 65 536) exceeds the whole process's default
/// `vm.max_map_count` (65 530): one peer can leave the process no mapping to make (a ring
/// for another link, another peer's region, a thread stack, a large allocation).
#[test]
fn a_peer_announcing_many_small_regions_cannot_take_our_mapping_slots() {
    if peer::peer_role().is_some() {
        return;
    }
    let limit: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = soft();
    let victim = soft_side(QpCap::default(), 4096);
    let nonce = 0xA6_u64 ^ u64::from(std::process::id());
    let (mut child, mut s) = raw::raw_peer_connected(
        &ctx,
        &victim,
        "child_entry",
        "hoarder",
        nonce,
        &ConnectAttr::default(),
    );
    let before = map_count();
    // Leave ~2000 slots so the test process can still report.
    let n = (limit.saturating_sub(before + 2000)) as u64;
    put(&mut s, &n.to_le_bytes());
    put(&mut s, &4096u64.to_le_bytes());
    victim.post_recv(1, 0, 64);
    put(&mut s, b"send");
    assert_eq!(get(&mut s), b"sent");
    let wc = poll_n(&victim.recv_cq, 1, T);
    let after = map_count();
    eprintln!(
        "recv wc {:?}; mappings {before} -> {after} of vm.max_map_count {limit} after one \
         peer announced {n} regions of 4 KiB",
        wc[0].status
    );
    put(&mut s, b"done");
    assert!(
        child.wait().unwrap().success(),
        "the hoarder ran to the end"
    );
    assert_ne!(
        wc[0].status,
        WcStatus::Success,
        "the peer that went over its budget lost its QP"
    );
    // The budget, and a little for what the rest of the process mapped meanwhile.
    assert!(
        after.saturating_sub(before) <= PEER_MAPS + 64,
        "one peer made us hold {} mappings of the process's {limit}",
        after - before
    );
}
