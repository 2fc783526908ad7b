//! Review of issue 22 (hostile peer): a peer is sent the PD's writable arena as an `O_RDWR`
//! memfd sealed only `F_SEAL_SHRINK | F_SEAL_SEAL` (soft/shm.rs `Arena::create`: no
//! `F_SEAL_GROW`, as the arena grows). The peer grows the file itself and writes past the
//! end we carved so far. Then (a) our next small `alloc_shared` of that PD fails, because our
//! own `ftruncate` to the new end would now shrink the file (refused by our own seal), and
//! (b) a region carved past the peer's end is not zero-filled: it holds what the peer wrote
//! before it was ever allocated.
//!
//! The peer is this test binary started again (`child_entry`, role `grower`).

mod common;

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

use byteexpress_verbs::{Access, ConnectAttr, QpCap};
use common::peer::{self, get, put};
use common::raw::{self, OFF_ANNOUNCED, attach, recv_msg};
use common::*;

const GROW: u64 = 8 << 20;
const MARK: &[u8] = b"written-by-the-peer-before-allocation";

#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    assert_eq!(role, "grower");
    let at = attach(&mut s);
    assert_eq!(get(&mut s), b"grow");
    // SAFETY: OFF_ANNOUNCED is inside the victim's mapped ring header, 8-aligned.
    let n = unsafe { raw::get64(at.victim_ring, OFF_ANNOUNCED) };
    let mut writable: Option<OwnedFd> = None;
    for _ in 0..n {
        let (m, mut fds) = recv_msg(at.chan.as_raw_fd());
        if m[0] == 5 && !fds.is_empty() {
            let fd = fds.remove(0);
            // SAFETY: F_GETFL only reads the fd's flags.
            let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
            if fl & libc::O_ACCMODE == libc::O_RDWR {
                writable = Some(fd);
            }
        }
    }
    let fd = writable.expect("the side's REMOTE_WRITE region came as an O_RDWR memfd");
    // SAFETY: fstat into a zeroed stat; ftruncate and pwrite on the fd we were sent.
    let report = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        assert_eq!(libc::fstat(fd.as_raw_fd(), &mut st), 0);
        let end = st.st_size as u64;
        let grown = libc::ftruncate(fd.as_raw_fd(), (end + GROW) as libc::off_t) == 0;
        // Our mark at every page of the grown part (where the victim's next regions go).
        let mut wrote = true;
        let mut off = end;
        while off < end + GROW {
            wrote &= libc::pwrite(fd.as_raw_fd(), MARK.as_ptr().cast(), MARK.len(), off as i64)
                == MARK.len() as isize;
            off += 4096;
        }
        format!("arena was {end} bytes; grown: {grown}; marks written: {wrote}")
    };
    put(&mut s, report.as_bytes());
    assert_eq!(get(&mut s), b"done");
    s.flush().unwrap();
    drop(at);
}

#[test]
fn a_peer_with_a_writable_grant_cannot_break_or_prefill_our_later_allocations() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let victim = soft_side(QpCap::default(), 4096);
    let nonce = 0x6_0A7_u64 ^ u64::from(std::process::id());
    let (mut child, mut s) = raw::raw_peer_connected(
        &ctx,
        &victim,
        "child_entry",
        "grower",
        nonce,
        &ConnectAttr::default(),
    );
    // Baseline: the PD carves writable memory fine before the peer acts.
    let before = victim.pd.alloc_shared_for(4096, Access::ALL);
    assert!(before.is_ok(), "baseline alloc_shared: {:?}", before.err());
    put(&mut s, b"grow");
    let report = String::from_utf8(get(&mut s)).unwrap();
    let small = victim.pd.alloc_shared_for(4096, Access::ALL);
    let big = victim
        .pd
        .alloc_shared_for(2 * GROW as usize, Access::ALL)
        .expect("a region larger than the peer's growth is carved");
    // SAFETY: `big` maps 2·GROW readable bytes we own.
    let bytes = unsafe { std::slice::from_raw_parts(big.as_ptr(), big.len()) };
    let prefilled = bytes.windows(MARK.len()).any(|w| w == MARK);
    eprintln!(
        "peer: {report}\nsmall alloc_shared after the peer grew the arena: {:?}\n\
         fresh {}-byte region holds the peer's bytes: {prefilled}",
        small.as_ref().map(|m| m.len()).map_err(|e| e.to_string()),
        big.len()
    );
    put(&mut s, b"done");
    assert!(child.wait().unwrap().success(), "the grower ran to the end");
    assert!(
        small.is_ok(),
        "the peer broke our PD's alloc_shared: {:?}",
        small.err()
    );
    assert!(
        !prefilled,
        "a freshly allocated region holds bytes the peer wrote"
    );
}
