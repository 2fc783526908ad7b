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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Child;
use std::time::Duration;

use byteexpress_verbs::{Access, ConnectAttr, Context, Endpoint, QpCap, QpState, WcStatus, WrOp};
use common::peer::{self, get, put};
use common::*;

const T: Duration = Duration::from_secs(10);

/// Ring geometry of the hostile peer's own QP (soft/ring.rs: 512-byte header, WQEs of
/// 16 + 16·sge bytes, completions of 32 bytes).
const CAP: u32 = 4;
const SGE: u32 = 1;

fn ring_bytes(cap: u32, sge: u32) -> usize {
    512 + (16 + 16 * sge as usize) * cap as usize + 32 * cap as usize
}

/// `comp_prod` in a ring's header (written by the sender, here the hostile peer).
const OFF_COMP_PROD: usize = 128;

#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    match role.as_str() {
        "hostile" => child_hostile(&mut s),
        "inspector" => child_inspector(&mut s),
        "liar" => child_liar(&mut s),
        other => panic!("unknown role {other}"),
    }
}

fn abstract_addr(name: &[u8]) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path[1..].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    (a, len as libc::socklen_t)
}

fn seqpacket() -> OwnedFd {
    // SAFETY: plain syscall; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: just created, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: 10,
        tv_usec: 0,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: a valid timeval.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
    fd
}

fn dial(name: &[u8]) -> OwnedFd {
    let fd = seqpacket();
    let (a, len) = abstract_addr(name);
    // SAFETY: a valid address of `len` bytes.
    assert_eq!(
        unsafe { libc::connect(fd.as_raw_fd(), (&raw const a).cast(), len) },
        0,
        "connect to the device"
    );
    fd
}

/// Sends one record with `fds`.
fn send_msg(sock: RawFd, data: &[u8], fds: &[RawFd]) {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; the control buffer fits up to 4 fds.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let bytes = std::mem::size_of_val(fds) as u32;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(bytes) as _;
            let c = libc::CMSG_FIRSTHDR(&raw const msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(c),
                bytes as usize,
            );
        }
        assert_eq!(
            libc::sendmsg(sock, &raw const msg, libc::MSG_NOSIGNAL),
            data.len() as isize
        );
    }
}

/// Receives one record and its fds.
fn recv_msg(sock: RawFd) -> (Vec<u8>, Vec<OwnedFd>) {
    let mut buf = vec![0u8; 2048];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    let mut fds = Vec::new();
    // SAFETY: valid iovec and control buffers; the fds the kernel installed are owned here.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        let n = libc::recvmsg(sock, &raw mut msg, libc::MSG_CMSG_CLOEXEC);
        assert!(n > 0, "no record from the device");
        buf.truncate(n as usize);
        let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
        while !c.is_null() {
            if (*c).cmsg_type == libc::SCM_RIGHTS {
                let k = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..k {
                    let fd =
                        std::ptr::read_unaligned(libc::CMSG_DATA(c).add(i * 4).cast::<RawFd>());
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&raw const msg, c);
        }
    }
    (buf, fds)
}

/// `Connect` as soft/wire.rs encodes it (tag 3).
fn connect_msg(src_qpn: u32, dst_qpn: u32, name: &[u8], access: u32) -> Vec<u8> {
    let mut v = vec![3u8];
    v.extend_from_slice(&1u16.to_le_bytes());
    v.extend_from_slice(&0xBAD_u64.to_le_bytes());
    for x in [src_qpn, dst_qpn, CAP, SGE, access] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.extend_from_slice(&(name.len() as u16).to_le_bytes());
    v.extend_from_slice(name);
    v
}

/// `ConnectReply { ok: true }` (tag 4, ok, empty reason).
const CONNECT_OK: [u8; 4] = [4, 1, 0, 0];

/// What the hostile peer holds once attached: the control channel (one socket per QP pair),
/// the victim's ring (mapped read-write, as the protocol has it) and its doorbell.
struct Attached {
    chan: OwnedFd,
    victim_ring: *mut libc::c_void,
    victim_fds: Vec<OwnedFd>,
}

/// Steps 1–3 of the hostile peer: probe, attach a QP of ours to the victim QP, take the
/// victim's ring when it connects back.
fn attach(s: &mut TcpStream) -> Attached {
    attach_granting(s, 0)
}

/// As [`attach`], our QP granting the victim's `access` (its `Connect`'s access flags).
fn attach_granting(s: &mut TcpStream, access: u32) -> Attached {
    let dev_name = get(s);
    let nonce = u64::from_le_bytes(get(s).try_into().unwrap());
    let victim_qpn = u32::from_le_bytes(get(s).try_into().unwrap());
    // The name our QP claims as its device's socket (the victim never dials it: it answers
    // over our channel).
    let my_name = format!("bx-hostile-{}", std::process::id()).into_bytes();
    // 1. The probe, as link set-up makes it.
    let p = dial(&dev_name);
    let mut probe = vec![1u8];
    probe.extend_from_slice(&nonce.to_le_bytes());
    send_msg(p.as_raw_fd(), &probe, &[]);
    let (reply, _) = recv_msg(p.as_raw_fd());
    assert_eq!((reply[0], reply[1]), (2, 1), "probe answered ok");
    // 2. Our Connect to the victim QP, with a ring and a doorbell of ours.
    // SAFETY: valid name and flags.
    let ring = unsafe {
        libc::memfd_create(
            c"hostile-ring".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    // SAFETY: `ring` is our memfd; eventfd has no preconditions.
    let bell = unsafe {
        assert_eq!(
            libc::ftruncate(ring, ring_bytes(CAP, SGE) as libc::off_t),
            0
        );
        assert_eq!(libc::fcntl(ring, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        libc::eventfd(0, libc::EFD_CLOEXEC)
    };
    let c = dial(&dev_name);
    send_msg(
        c.as_raw_fd(),
        &connect_msg(0x4242, victim_qpn, &my_name, access),
        &[ring, bell],
    );
    let (reply, _) = recv_msg(c.as_raw_fd());
    assert_eq!(&reply[..2], &[4, 1], "our Connect accepted");
    put(s, &my_name);
    // 3. The victim connects back over our channel (one socket per QP pair, as the device
    // does): its Connect carries its ring and doorbell.
    let back = c.as_raw_fd();
    let (m, fds) = recv_msg(back);
    assert_eq!(m[0], 3, "a Connect");
    let cap = u32::from_le_bytes(m[19..23].try_into().unwrap());
    let sge = u32::from_le_bytes(m[23..27].try_into().unwrap());
    assert_eq!(fds.len(), 2, "ring and doorbell");
    send_msg(back, &CONNECT_OK, &[]);
    let bytes = ring_bytes(cap, sge);
    // SAFETY: maps the victim's ring, which is at least `bytes` long (its device sized it).
    let victim_ring = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fds[0].as_raw_fd(),
            0,
        )
    };
    assert_ne!(victim_ring, libc::MAP_FAILED);
    Attached {
        chan: c,
        victim_ring,
        victim_fds: fds,
    }
}

fn child_hostile(s: &mut TcpStream) {
    let Attached {
        victim_ring,
        victim_fds: fds,
        chan: _chan, // open to the end: its close would be our death
    } = attach(s);
    assert_eq!(get(s), b"corrupt");
    // 4. An impossible completion producer index, and the doorbell.
    // SAFETY: offset 128 is inside the mapped header, 8-aligned.
    unsafe {
        std::ptr::write_volatile(
            victim_ring.cast::<u8>().add(OFF_COMP_PROD).cast::<u64>(),
            1 << 40,
        );
        let one = 1u64;
        libc::write(fds[1].as_raw_fd(), (&raw const one).cast(), 8);
    }
    put(s, b"corrupted");
    assert_eq!(get(s), b"done");
    s.flush().unwrap();
}

/// Spawns the raw peer playing `role`, which probes our device with `nonce` (expected here)
/// and attaches a QP of its own to `victim`'s QP; then `victim` connects back to the socket
/// the peer names (it probed us: allowed). Returns the child and its control stream.
fn raw_peer_connected(ctx: &Context, victim: &Side, role: &str, nonce: u64) -> (Child, TcpStream) {
    ctx.expect_probe(nonce);
    let (child, mut s) = peer::spawn_peer("child_entry", role, T);
    let info = ctx.device_info().to_bytes();
    put(&mut s, &info[3 + 8..]); // the device's socket name
    put(&mut s, &nonce.to_le_bytes());
    put(&mut s, &victim.qp.qp_num().to_le_bytes());
    let name = get(&mut s);
    let mut ep = victim.qp.endpoint().to_bytes()[..31].to_vec();
    ep[1..5].copy_from_slice(&0x4242u32.to_le_bytes());
    ep.extend_from_slice(&(name.len() as u16).to_le_bytes());
    ep.extend_from_slice(&name);
    victim
        .qp
        .connect(&Endpoint::from_bytes(&ep).unwrap(), &ConnectAttr::default())
        .unwrap_or_else(|e| panic!("victim connects to the {role} peer: {e:?}"));
    (child, s)
}

#[test]
fn a_raw_peer_writing_impossible_ring_indices_fails_only_its_own_qp() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let victim = soft_side(QpCap::default(), 4096);
    let (a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    let nonce = 0x5EED_u64 ^ u64::from(std::process::id());
    let (mut child, mut s) = raw_peer_connected(&ctx, &victim, "hostile", nonce);
    victim.post_recv(1, 0, 64);
    victim.post_recv(2, 64, 64);
    put(&mut s, b"corrupt");
    assert_eq!(get(&mut s), b"corrupted");
    // The victim's receives flush: its QP failed, not the process.
    let rx = poll_n(&victim.recv_cq, 2, T);
    assert_eq!(
        rx.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(victim.qp.state(), QpState::Err);
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
        "the hostile peer ran to the end"
    );
}

/// `announced` in a ring's header: control messages the owner sent after its `Connect`.
const OFF_ANNOUNCED: usize = 320;

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
