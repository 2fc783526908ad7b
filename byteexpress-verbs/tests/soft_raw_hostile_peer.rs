//! A hostile peer process that speaks the soft device's control protocol itself, on raw sockets
//! and memfds (not through the verbs API): it probes the device as link set-up would, attaches a
//! QP of its own making to one of ours, takes that QP's ring when ours connects back, and then
//! writes impossible ring indices into it. Our QP fails (its receives flush), the process goes
//! on, and another QP pair of the same device keeps delivering meanwhile (issue 22, acceptance:
//! "bad ring indices fail its own QP only").
//!
//! The peer is this test binary started again (`child_entry`, role `hostile`).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Child;
use std::time::Duration;

use byteexpress_verbs::{Access, ConnectAttr, Context, QpCap, QpState, WcStatus, WrOp};
use common::peer::{self, get, put};
use common::raw::{
    self, OFF_ANNOUNCED, OFF_COMP_PROD, attach, attach_granting, recv_msg, send_msg,
};
use common::*;

const T: Duration = Duration::from_secs(10);

#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    match role.as_str() {
        r if r.starts_with("hostile-") => child_hostile(&mut s, &r["hostile-".len()..]),
        "tamperer" => child_tamperer(&mut s),
        "inspector" => child_inspector(&mut s),
        "liar" => child_liar(&mut s),
        other => panic!("unknown role {other}"),
    }
}

/// The hostile peer breaks the ring protocol in the way its role names: `indices` (an
/// impossible completion producer index), `key` (a SEND descriptor naming an MR it never
/// announced), `offset` (a staged payload starting past its staging region), `length` (a
/// staged payload running past its end).
fn child_hostile(s: &mut TcpStream, how: &str) {
    let at = attach(s);
    assert_eq!(get(s), b"corrupt");
    match how {
        "indices" => {
            // SAFETY: OFF_COMP_PROD is inside the mapped header, 8-aligned.
            unsafe { raw::put64(at.victim_ring, OFF_COMP_PROD, 1 << 40) };
            raw::ring_bell(at.victim_bell);
        }
        "key" => at.post_send(0, 16, raw::SRC_MR, 0xDEAD_BEEF, 0x1000),
        "offset" => at.post_send(0, 16, raw::SRC_STAGED, 0, raw::STAGE as u64 + 64),
        "length" => at.post_send(0, 32, raw::SRC_STAGED, 0, raw::STAGE as u64 - 16),
        other => panic!("unknown breakage {other}"),
    }
    put(s, b"corrupted");
    assert_eq!(get(s), b"done");
    s.flush().unwrap();
    drop(at); // open to the end: its close would be our death
}

/// Spawns the raw peer playing `role` and connects `victim` to it (default attributes).
fn raw_peer_connected(ctx: &Context, victim: &Side, role: &str, nonce: u64) -> (Child, TcpStream) {
    raw::raw_peer_connected(
        ctx,
        victim,
        "child_entry",
        role,
        nonce,
        &ConnectAttr::default(),
    )
}

#[test]
fn a_raw_peer_writing_impossible_ring_indices_or_descriptors_fails_only_its_own_qp() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let (a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    for (i, how) in ["indices", "key", "offset", "length"]
        .into_iter()
        .enumerate()
    {
        let victim = soft_side(QpCap::default(), 4096);
        let nonce = (0x5EED_u64 + i as u64) ^ u64::from(std::process::id());
        let role = format!("hostile-{how}");
        let (mut child, mut s) = raw_peer_connected(&ctx, &victim, &role, nonce);
        victim.post_recv(1, 0, 64);
        victim.post_recv(2, 64, 64);
        put(&mut s, b"corrupt");
        assert_eq!(get(&mut s), b"corrupted");
        // The victim's receives flush: its QP failed, not the process.
        let rx = poll_n(&victim.recv_cq, 2, T);
        assert_eq!(
            rx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)],
            "{how}"
        );
        assert_eq!(victim.qp.state(), QpState::Err, "{how}");
        // Another pair of the same device delivers meanwhile.
        for i in 0..20u64 {
            b.post_recv(i, 0, 256);
            a.write(0, &i.to_le_bytes());
            a.send(i, WrOp::Send, 0, 8, true).unwrap();
            let rx = poll_n(&b.recv_cq, 1, T);
            assert_eq!((rx[0].wr_id, rx[0].status), (i, WcStatus::Success));
            assert_eq!(b.read(0, 8), i.to_le_bytes());
            assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
        }
        put(&mut s, b"done");
        assert!(
            child.wait().unwrap().success(),
            "the hostile peer ({how}) ran to the end"
        );
    }
}

/// The tamperer: sends the victim a body from its staging region (as a SEND of ours would go),
/// and once the victim's handler has it, tries to change it: rewrites its own copy, and looks
/// for the body in every fd and mapping the victim ever gave it, writing over it wherever it
/// can map it writable. Reports what it found.
fn child_tamperer(s: &mut TcpStream) {
    let at = attach(s);
    let body = get(s);
    let recv_key = u32::from_le_bytes(get(s).try_into().unwrap());
    // SAFETY: the body fits our staging region, which is mapped read-write here.
    unsafe { std::ptr::copy(body.as_ptr(), at.my_stage.cast::<u8>(), body.len()) };
    at.post_send(0, body.len() as u32, raw::SRC_STAGED, 0, 0);
    put(s, b"sent");
    assert_eq!(get(s), b"tamper");
    let mut facts = Vec::new();
    // SAFETY: slot 0's ack word and the header's comp_cons lie inside the victim's ring.
    let (acked, ack) = unsafe {
        (
            raw::get64(at.victim_ring, raw::OFF_COMP_CONS),
            raw::get32(
                at.victim_ring,
                raw::comp_off(at.victim_cap, at.victim_sge, 0) + 36,
            ),
        )
    };
    facts.push(format!("acknowledged: {}", acked == 1 && ack == 0));
    // Our own copy, changed after delivery.
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes(at.my_stage.cast::<u8>(), b'X', body.len()) };
    // Every announcement the victim sent: is the receive buffer's MR among them?
    // SAFETY: OFF_ANNOUNCED is inside the mapped header, 8-aligned.
    let n = unsafe { raw::get64(at.victim_ring, OFF_ANNOUNCED) };
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut announced_recv = false;
    for _ in 0..n {
        let (m, got) = recv_msg(at.chan.as_raw_fd());
        if m[0] == 6 {
            announced_recv |= u32::from_le_bytes(m[1..5].try_into().unwrap()) == recv_key;
        }
        fds.extend(got);
    }
    facts.push(format!("receive MR announced: {announced_recv}"));
    // Every fd we got (regions, the victim's ring and staging region), mapped writable where
    // it lets us: the body in any of them is overwritten.
    let mut found_writable = false;
    for fd in fds.iter().chain(&at.victim_fds) {
        // SAFETY: fstat into a zeroed stat; fresh mappings of fds we hold, unmapped after.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) != 0 || st.st_size == 0 {
                continue;
            }
            let len = st.st_size as usize;
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            if p == libc::MAP_FAILED {
                continue;
            }
            let bytes = std::slice::from_raw_parts_mut(p.cast::<u8>(), len);
            if let Some(at) = bytes.windows(body.len()).position(|w| w == body.as_slice()) {
                found_writable = true;
                bytes[at..at + body.len()].fill(b'X');
            }
            libc::munmap(p, len);
        }
    }
    facts.push(format!("body found writable: {found_writable}"));
    put(s, facts.join("\n").as_bytes());
    assert_eq!(get(s), b"done");
    drop(at);
}

/// FNV-1a: the handler's checksum of the body it was given.
fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn a_body_a_raw_peer_sent_cannot_change_under_the_handler_reading_it() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let victim = soft_side(QpCap::default(), 4096);
    // A receive buffer as links register them: LOCAL_WRITE only.
    let rx_mem = victim
        .pd
        .alloc_shared_for(4096, Access::LOCAL_WRITE)
        .unwrap();
    let rx_mr = victim
        .pd
        .reg_shared(&rx_mem, 0, 4096, Access::LOCAL_WRITE)
        .unwrap();
    let nonce = 0x7A3_u64 ^ u64::from(std::process::id());
    let (mut child, mut s) = raw_peer_connected(&ctx, &victim, "tamperer", nonce);
    victim
        .qp
        .post_recv(&byteexpress_verbs::RecvWr {
            wr_id: 9,
            sg_list: &[byteexpress_verbs::Sge {
                addr: rx_mr.addr(),
                len: 4096,
                lkey: rx_mr.lkey(),
            }],
        })
        .unwrap();
    let body = format!("request body {} 0123456789abcdef", std::process::id()).into_bytes();
    put(&mut s, &body);
    put(&mut s, &rx_mr.lkey().to_le_bytes());
    assert_eq!(get(&mut s), b"sent");
    let rx = poll_n(&victim.recv_cq, 1, T);
    assert_eq!(
        (rx[0].wr_id, rx[0].status, rx[0].byte_len as usize),
        (9, WcStatus::Success, body.len())
    );
    // The handler reads the body in place and checksums it.
    // SAFETY: the receive completed: its bytes are ours to read.
    let got = unsafe { std::slice::from_raw_parts(rx_mem.as_ptr(), body.len()) };
    let sum = checksum(got);
    assert_eq!(got, body.as_slice());
    put(&mut s, b"tamper");
    let facts = String::from_utf8(get(&mut s)).unwrap();
    // SAFETY: as above.
    let again = unsafe { std::slice::from_raw_parts(rx_mem.as_ptr(), body.len()) };
    assert_eq!(checksum(again), sum, "the body changed under the handler");
    put(&mut s, b"done");
    assert!(
        child.wait().unwrap().success(),
        "the tamperer ran to the end"
    );
    for want in [
        "acknowledged: true",
        "receive MR announced: false",
        "body found writable: false",
    ] {
        assert!(
            facts.lines().any(|l| l == want),
            "want {want:?}; the peer saw:\n{facts}"
        );
    }
}

/// Whether `hay` contains `needle`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The inspector: attaches as the hostile peer does, reads every announcement the victim sent
/// (regions with their fds, MRs), and reports what it could do with them, one line per fact.
fn child_inspector(s: &mut TcpStream) {
    let at = attach(s);
    let local_key = u32::from_le_bytes(get(s).try_into().unwrap());
    let ro_key = u32::from_le_bytes(get(s).try_into().unwrap());
    let local_mark = get(s);
    let ro_mark = get(s);
    assert_eq!(get(s), b"inspect");
    // SAFETY: offset 320 is inside the mapped header, 8-aligned.
    let n = unsafe {
        std::ptr::read_volatile(at.victim_ring.cast::<u8>().add(OFF_ANNOUNCED).cast::<u64>())
    };
    let mut regions: Vec<(u64, OwnedFd)> = Vec::new();
    let mut mrs: Vec<(u32, u64)> = Vec::new(); // (key, region)
    for _ in 0..n {
        let (m, mut fds) = recv_msg(at.chan.as_raw_fd());
        match m[0] {
            5 => regions.push((
                u64::from_le_bytes(m[1..9].try_into().unwrap()),
                fds.remove(0),
            )),
            6 => mrs.push((
                u32::from_le_bytes(m[1..5].try_into().unwrap()),
                u64::from_le_bytes(m[5..13].try_into().unwrap()),
            )),
            _ => {}
        }
    }
    let mut facts = Vec::new();
    facts.push(format!(
        "local MR announced: {}",
        mrs.iter().any(|(k, _)| *k == local_key)
    ));
    // Every fd we were sent, mapped whole (read-only): local-only bytes must be in none.
    let mut local_seen = false;
    for (_, fd) in &regions {
        // SAFETY: fstat into a zeroed stat; a fresh read-only shared mapping of the whole
        // file, read as bytes and unmapped before the next.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(libc::fstat(fd.as_raw_fd(), &mut st), 0);
            let len = st.st_size as usize;
            if len == 0 {
                continue;
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            local_seen |= contains(std::slice::from_raw_parts(p.cast::<u8>(), len), &local_mark);
            libc::munmap(p, len);
        }
    }
    facts.push(format!("local bytes in a sent fd: {local_seen}"));
    let ro_region = mrs.iter().find(|(k, _)| *k == ro_key).map(|(_, r)| *r);
    let ro_fd = regions
        .iter()
        .find(|(id, _)| Some(*id) == ro_region)
        .map(|(_, fd)| fd.as_raw_fd())
        .expect("the REMOTE_READ MR and its region were announced");
    // SAFETY: mappings of the fd we were sent (each checked, unmapped); an fd of our own
    // reopened through /proc and closed; a pwrite of 1 byte from a local.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        assert_eq!(libc::fstat(ro_fd, &mut st), 0);
        let len = st.st_size as usize;
        let r = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            ro_fd,
            0,
        );
        assert_ne!(r, libc::MAP_FAILED);
        let bytes = std::slice::from_raw_parts(r.cast::<u8>(), len);
        facts.push(format!(
            "read-only grant readable: {}",
            contains(bytes, &ro_mark)
        ));
        facts.push(format!(
            "read-only grant mprotect writable: {}",
            libc::mprotect(r, len, libc::PROT_READ | libc::PROT_WRITE) == 0
        ));
        libc::munmap(r, len);
        let w = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            ro_fd,
            0,
        );
        facts.push(format!(
            "read-only grant mapped writable: {}",
            w != libc::MAP_FAILED
        ));
        if w != libc::MAP_FAILED {
            libc::munmap(w, len);
        }
        let path = std::ffi::CString::new(format!("/proc/self/fd/{ro_fd}")).unwrap();
        let rw = libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        let mut upgraded = false;
        if rw >= 0 {
            let w = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                rw,
                0,
            );
            if w != libc::MAP_FAILED {
                upgraded = true;
                libc::munmap(w, len);
            }
            let b = 0u8;
            upgraded |= libc::pwrite(rw, (&raw const b).cast(), 1, 0) == 1;
            libc::close(rw);
        }
        facts.push(format!("read-only grant reopened writable: {upgraded}"));
    }
    put(s, facts.join("\n").as_bytes());
    assert_eq!(get(s), b"done");
    drop(at);
}

#[test]
fn a_raw_peer_gets_read_only_grants_it_cannot_upgrade_and_nothing_of_local_only_memory() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let victim = soft_side(QpCap::default(), 4096);
    let pid = std::process::id();
    let local_mark = format!("bx-local-only-{pid}-a1b2c3d4e5f6").into_bytes();
    let ro_mark = format!("bx-read-only-{pid}-f6e5d4c3b2a1").into_bytes();
    // Memory of each class, made before the connect (announced by it) and after the side's
    // own region (a receive buffer, writable class), in the same PD.
    let ro = victim
        .pd
        .alloc_shared_for(4096, Access::REMOTE_READ)
        .unwrap();
    // SAFETY: writes inside memory we own and nothing else touches yet.
    unsafe { std::ptr::copy(ro_mark.as_ptr(), ro.as_ptr().add(100), ro_mark.len()) };
    let ro_mr = victim
        .pd
        .reg_shared(&ro, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert!(
        victim
            .pd
            .reg_shared(&ro, 0, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .is_err(),
        "memory allocated for REMOTE_READ cannot be registered writable"
    );
    let local = victim.pd.alloc_shared_for(4096, Access(0)).unwrap();
    // SAFETY: as above.
    unsafe {
        std::ptr::copy(
            local_mark.as_ptr(),
            local.as_ptr().add(200),
            local_mark.len(),
        )
    };
    let local_mr = victim.pd.reg_shared(&local, 0, 4096, Access(0)).unwrap();
    let nonce = 0x1D5EC7_u64 ^ u64::from(pid);
    let (mut child, mut s) = raw_peer_connected(&ctx, &victim, "inspector", nonce);
    put(&mut s, &local_mr.lkey().to_le_bytes());
    put(&mut s, &ro_mr.rkey().to_le_bytes());
    put(&mut s, &local_mark);
    put(&mut s, &ro_mark);
    put(&mut s, b"inspect");
    let facts = String::from_utf8(get(&mut s)).unwrap();
    put(&mut s, b"done");
    assert!(
        child.wait().unwrap().success(),
        "the inspector ran to the end"
    );
    for want in [
        "local MR announced: false",
        "local bytes in a sent fd: false",
        "read-only grant readable: true",
        "read-only grant mprotect writable: false",
        "read-only grant mapped writable: false",
        "read-only grant reopened writable: false",
    ] {
        assert!(
            facts.lines().any(|l| l == want),
            "want {want:?}; the peer saw:\n{facts}"
        );
    }
    drop((local, ro));
}

/// The liar: grants the victim's QP every access, then announces a region of its own as an
/// `O_RDONLY` fd with an MR over it that claims REMOTE_WRITE. The victim must refuse that MR
/// rather than store through its read-only mapping (which would kill it with SIGSEGV).
fn child_liar(s: &mut TcpStream) {
    let at = attach_granting(s, 7);
    // SAFETY: valid name and flags; our own memfd, grown, sealed, reopened read-only.
    let ro = unsafe {
        let m = libc::memfd_create(
            c"liar".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        assert!(m >= 0);
        assert_eq!(libc::ftruncate(m, 4096), 0);
        assert_eq!(libc::fcntl(m, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        let path = std::ffi::CString::new(format!("/proc/self/fd/{m}")).unwrap();
        let ro = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        assert!(ro >= 0);
        OwnedFd::from_raw_fd(ro)
    };
    let mut region = vec![5u8];
    for x in [1u64, 0, 4096] {
        region.extend_from_slice(&x.to_le_bytes());
    }
    send_msg(at.chan.as_raw_fd(), &region, &[ro.as_raw_fd()]);
    let mut mr = vec![6u8];
    mr.extend_from_slice(&0x777u32.to_le_bytes());
    for x in [1u64, 0, 4096, 0x10_0000] {
        mr.extend_from_slice(&x.to_le_bytes());
    }
    mr.extend_from_slice(&7u32.to_le_bytes());
    send_msg(at.chan.as_raw_fd(), &mr, &[]);
    put(s, b"announced");
    assert_eq!(get(s), b"done");
    drop(at);
}

#[test]
fn a_peer_mr_claiming_write_access_over_a_read_only_grant_is_refused() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let victim = soft_side(QpCap::default(), 4096);
    let nonce = 0x11A2_u64 ^ u64::from(std::process::id());
    let (mut child, mut s) = raw_peer_connected(&ctx, &victim, "liar", nonce);
    assert_eq!(get(&mut s), b"announced");
    victim.write(0, b"would be stored");
    victim
        .send(
            1,
            WrOp::Write {
                remote_addr: 0x10_0000,
                rkey: 0x777,
            },
            0,
            15,
            true,
        )
        .unwrap();
    let wc = poll_n(&victim.send_cq, 1, T);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (1, WcStatus::RemAccessErr),
        "the MR is unknown to the victim: never written through a read-only mapping"
    );
    put(&mut s, b"done");
    assert!(child.wait().unwrap().success(), "the liar ran to the end");
}
