//! The soft device's control protocol and ring layout spoken by hand (raw sockets, memfds,
//! mappings): for tests whose peer is a hostile process, not the verbs API. Mirrors
//! soft/wire.rs and soft/ring.rs (issue 22: every value from such a peer is checked).

use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Child;
use std::time::Duration;

use byteexpress_verbs::{ConnectAttr, Context, Endpoint};

use super::Side;
use super::peer::{self, get, put};

/// Ring geometry of the raw peer's own QP (soft/ring.rs: 512-byte header, WQEs of
/// 16 + 16·sge bytes, completion slots of 64 bytes).
pub const CAP: u32 = 4;
pub const SGE: u32 = 1;
/// Bytes of the raw peer's staging region.
pub const STAGE: usize = 4096;

pub const OFF_RECV_PROD: usize = 0;
pub const OFF_RECV_CONS: usize = 64;
pub const OFF_COMP_PROD: usize = 128;
pub const OFF_COMP_CONS: usize = 192;
/// Control messages the owner sent after its `Connect`.
pub const OFF_ANNOUNCED: usize = 320;
const HDR: usize = 512;
const COMP: usize = 64;
/// `IBV_WC_RECV`: a SEND's descriptor.
pub const OP_RECV: u32 = 128;
/// A descriptor's `src`: in an announced MR, in the staging region.
pub const SRC_MR: u32 = 1;
pub const SRC_STAGED: u32 = 2;

pub fn ring_bytes(cap: u32, sge: u32) -> usize {
    HDR + (16 + 16 * sge as usize) * cap as usize + COMP * cap as usize
}

/// Offset of completion slot `seq` in a ring of `cap` WQEs of `sge` SGEs.
pub fn comp_off(cap: u32, sge: u32, seq: u64) -> usize {
    HDR + (16 + 16 * sge as usize) * cap as usize + COMP * (seq % u64::from(cap)) as usize
}

/// Reads the u64 at `off` of a mapping.
///
/// # Safety
/// `base + off` must be inside a live mapping, 8-aligned.
pub unsafe fn get64(base: *mut libc::c_void, off: usize) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::read_volatile(base.cast::<u8>().add(off).cast::<u64>()) }
}

/// Writes the u64 at `off` of a mapping.
///
/// # Safety
/// As [`get64`], and the mapping writable.
pub unsafe fn put64(base: *mut libc::c_void, off: usize, v: u64) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_volatile(base.cast::<u8>().add(off).cast::<u64>(), v) }
}

/// Reads the u32 at `off` of a mapping.
///
/// # Safety
/// As [`get64`], 4-aligned.
pub unsafe fn get32(base: *mut libc::c_void, off: usize) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::read_volatile(base.cast::<u8>().add(off).cast::<u32>()) }
}

/// Writes the u32 at `off` of a mapping.
///
/// # Safety
/// As [`put64`], 4-aligned.
pub unsafe fn put32(base: *mut libc::c_void, off: usize, v: u32) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_volatile(base.cast::<u8>().add(off).cast::<u32>(), v) }
}

pub fn abstract_addr(name: &[u8]) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path[1..].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    (a, len as libc::socklen_t)
}

pub fn seqpacket() -> OwnedFd {
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

pub fn dial(name: &[u8]) -> OwnedFd {
    let fd = seqpacket();
    let (a, len) = abstract_addr(name);
    // SAFETY: a valid address of `len` bytes.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), (&raw const a).cast(), len) };
    assert_eq!(rc, 0, "connect to the device");
    fd
}

/// Sends one record with `fds`.
pub fn send_msg(sock: RawFd, data: &[u8], fds: &[RawFd]) {
    if let Err(e) = sendmsg(sock, data, fds, 0) {
        panic!("sendmsg: {e}");
    }
}

/// As [`send_msg`] without blocking, returning the error (`WouldBlock` once the other end
/// stopped reading, or a reset once it closed the channel).
pub fn try_send_msg(sock: RawFd, data: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    sendmsg(sock, data, fds, libc::MSG_DONTWAIT)
}

fn sendmsg(sock: RawFd, data: &[u8], fds: &[RawFd], flags: libc::c_int) -> std::io::Result<()> {
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
        let n = libc::sendmsg(sock, &raw const msg, libc::MSG_NOSIGNAL | flags);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        assert_eq!(n, data.len() as isize, "one whole record");
        Ok(())
    }
}

/// Receives one record and its fds.
pub fn recv_msg(sock: RawFd) -> (Vec<u8>, Vec<OwnedFd>) {
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

/// `Connect` as soft/wire.rs encodes it (tag 3, version 4), with the flag saying a staging
/// region follows the ring and the doorbell.
pub fn connect_msg(src_qpn: u32, dst_qpn: u32, name: &[u8], access: u32) -> Vec<u8> {
    let mut v = vec![3u8];
    v.extend_from_slice(&4u16.to_le_bytes());
    v.extend_from_slice(&0xBAD_u64.to_le_bytes());
    for x in [src_qpn, dst_qpn, CAP, SGE, access, 2, STAGE as u32] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.extend_from_slice(&(name.len() as u16).to_le_bytes());
    v.extend_from_slice(name);
    v
}

/// A doorbell as the device wants one (soft/bell.rs): a Unix datagram socket pair whose
/// sending end goes in the `Connect`; returns (receiving end, sending end).
pub fn doorbell() -> (OwnedFd, OwnedFd) {
    let mut sv = [0 as RawFd; 2];
    // SAFETY: `sv` has room for two fds; both are owned below.
    unsafe {
        assert_eq!(
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr()
            ),
            0
        );
        (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1]))
    }
}

/// Rings a doorbell the victim sent (one datagram, never blocking).
pub fn ring_bell(fd: RawFd) {
    // SAFETY: a one-byte send from a valid buffer.
    unsafe {
        libc::send(
            fd,
            [1u8].as_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

/// `ConnectReply { ok: true }` (tag 4, ok, empty reason).
pub const CONNECT_OK: [u8; 4] = [4, 1, 0, 0];

/// Maps `len` bytes of `fd` shared, read-write or read-only.
pub fn map(fd: RawFd, len: usize, writable: bool) -> *mut libc::c_void {
    let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
    // SAFETY: a fresh shared mapping of an fd we hold; the result is checked.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    p
}

/// A memfd of `len` bytes, sealed against shrinking (as the device wants a peer's memory).
pub fn memfd(name: &std::ffi::CStr, len: usize) -> OwnedFd {
    // SAFETY: valid name and flags; the fd is owned below and only grown and sealed.
    unsafe {
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
        assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        OwnedFd::from_raw_fd(fd)
    }
}

/// What the raw peer holds once attached: the control channel (one socket per QP pair), the
/// victim's ring (mapped read-write, as the protocol has it) and the fds of its `Connect`, and
/// its own ring and staging region (mapped read-write here).
pub struct Attached {
    pub chan: OwnedFd,
    pub victim_ring: *mut libc::c_void,
    pub victim_cap: u32,
    pub victim_sge: u32,
    /// Ring, then what the victim's `Connect` flags say (a recv-CQ doorbell only without
    /// `BELL_BACK`, bit 3).
    pub victim_fds: Vec<OwnedFd>,
    /// The fd we ring the victim's recv CQ on: our own end of the doorbell pair we made when
    /// the victim rings back on it (`BELL_BACK`, as the device does over a shared channel),
    /// else the doorbell its `Connect` carried.
    pub victim_bell: RawFd,
    /// The victim's end of that doorbell as we hold it: our copy of the end we sent (the
    /// victim keeps it in its CQ's set), or the one its `Connect` carried.
    pub victim_end: RawFd,
    pub my_ring: *mut libc::c_void,
    pub my_stage: *mut libc::c_void,
    _mine: [OwnedFd; 4],
}

impl Attached {
    /// Leaves a SEND's descriptor in completion slot `seq` of the victim's ring (after
    /// claiming receive WQE `seq`), publishes it and rings the victim's doorbell.
    pub fn post_send(&self, seq: u64, byte_len: u32, src: u32, key: u32, addr: u64) {
        let off = comp_off(self.victim_cap, self.victim_sge, seq);
        let r = self.victim_ring;
        // SAFETY: every offset lies in the victim's ring as its Connect sized it, aligned.
        unsafe {
            put64(r, OFF_RECV_CONS, seq + 1);
            put32(r, off, OP_RECV);
            put32(r, off + 4, 0);
            put32(r, off + 8, byte_len);
            put32(r, off + 12, 0);
            put32(r, off + 16, 0);
            put32(r, off + 20, src);
            put64(r, off + 24, seq + 1);
            put32(r, off + 32, key);
            put32(r, off + 36, 0);
            put64(r, off + 40, addr);
            put64(r, OFF_COMP_PROD, seq + 1);
        }
        ring_bell(self.victim_bell);
    }
}

/// Probes the device named `dev_name` with `nonce` as link set-up does (after it, our process
/// may be sent memfds); panics unless the device answers ok.
pub fn probe(dev_name: &[u8], nonce: u64) {
    let p = dial(dev_name);
    let mut msg = vec![1u8];
    msg.extend_from_slice(&nonce.to_le_bytes());
    send_msg(p.as_raw_fd(), &msg, &[]);
    let (reply, _) = recv_msg(p.as_raw_fd());
    assert_eq!((reply[0], reply[1]), (2, 1), "probe answered ok");
}

/// Steps 1–3 of a raw peer: probe, attach a QP of ours to the victim QP (our ring, doorbell
/// and staging region), take the victim's ring when it connects back; our QP grants the
/// victim's `access` (its `Connect`'s access flags).
pub fn attach_granting(s: &mut TcpStream, access: u32) -> Attached {
    let dev_name = get(s);
    let nonce = u64::from_le_bytes(get(s).try_into().unwrap());
    let victim_qpn = u32::from_le_bytes(get(s).try_into().unwrap());
    // The name our QP claims as its device's socket (the victim never dials it: it answers
    // over our channel).
    let my_name = format!("bx-hostile-{}", std::process::id()).into_bytes();
    // 1. The probe, as link set-up makes it.
    probe(&dev_name, nonce);
    // 2. Our Connect to the victim QP, with a ring, a doorbell and a staging region of ours.
    let ring = memfd(c"hostile-ring", ring_bytes(CAP, SGE));
    let stage = memfd(c"hostile-stage", STAGE);
    let (bell_rx, bell) = doorbell();
    let my_ring = map(ring.as_raw_fd(), ring_bytes(CAP, SGE), true);
    let my_stage = map(stage.as_raw_fd(), STAGE, true);
    let c = dial(&dev_name);
    send_msg(
        c.as_raw_fd(),
        &connect_msg(0x4242, victim_qpn, &my_name, access),
        &[ring.as_raw_fd(), bell.as_raw_fd(), stage.as_raw_fd()],
    );
    let (reply, _) = recv_msg(c.as_raw_fd());
    assert_eq!(&reply[..2], &[4, 1], "our Connect accepted");
    put(s, &my_name);
    // 3. The victim connects back over our channel (one socket per QP pair, as the device
    // does): its Connect carries its ring, doorbell and what its flags say.
    let back = c.as_raw_fd();
    let (m, fds) = recv_msg(back);
    assert_eq!(m[0], 3, "a Connect");
    let cap = u32::from_le_bytes(m[19..23].try_into().unwrap());
    let sge = u32::from_le_bytes(m[23..27].try_into().unwrap());
    let flags = u32::from_le_bytes(m[31..35].try_into().unwrap());
    let bell_back = flags & 8 != 0;
    assert_eq!(
        fds.len(),
        1 + usize::from(!bell_back) + (flags & 7).count_ones() as usize,
        "ring, doorbell unless it rings back, and the fds its flags name"
    );
    send_msg(back, &CONNECT_OK, &[]);
    let victim_ring = map(fds[0].as_raw_fd(), ring_bytes(cap, sge), true);
    let (victim_bell, victim_end) = if bell_back {
        (bell_rx.as_raw_fd(), bell.as_raw_fd())
    } else {
        (fds[1].as_raw_fd(), fds[1].as_raw_fd())
    };
    Attached {
        victim_bell,
        victim_end,
        chan: c,
        victim_ring,
        victim_cap: cap,
        victim_sge: sge,
        victim_fds: fds,
        my_ring,
        my_stage,
        _mine: [ring, stage, bell, bell_rx],
    }
}

/// As [`attach_granting`], granting nothing.
pub fn attach(s: &mut TcpStream) -> Attached {
    attach_granting(s, 0)
}

/// Spawns the raw peer playing `role` (test `entry` of this binary), which probes our device
/// with `nonce` (expected here) and attaches a QP of its own to `victim`'s QP; then `victim`
/// connects back with `attr` to the socket the peer names (it probed us: allowed). Returns
/// the child and its control stream.
pub fn raw_peer_connected(
    ctx: &Context,
    victim: &Side,
    entry: &str,
    role: &str,
    nonce: u64,
    attr: &ConnectAttr,
) -> (Child, TcpStream) {
    let (child, s, connected) = raw_peer_connecting(ctx, victim, entry, role, nonce, attr);
    connected.unwrap_or_else(|e| panic!("victim connects to the {role} peer: {e:?}"));
    (child, s)
}

/// As [`raw_peer_connected`], returning the outcome of the victim's connect instead of
/// requiring it to succeed (for peers whose attach our device refuses).
pub fn raw_peer_connecting(
    ctx: &Context,
    victim: &Side,
    entry: &str,
    role: &str,
    nonce: u64,
    attr: &ConnectAttr,
) -> (Child, TcpStream, byteexpress_verbs::Result<()>) {
    const T: Duration = Duration::from_secs(10);
    ctx.expect_probe(nonce);
    let (child, mut s) = peer::spawn_peer(entry, role, T);
    let info = ctx.device_info().to_bytes();
    put(&mut s, &info[3 + 8..]); // the device's socket name
    put(&mut s, &nonce.to_le_bytes());
    put(&mut s, &victim.qp.qp_num().to_le_bytes());
    let name = get(&mut s);
    let mut ep = victim.qp.endpoint().to_bytes()[..31].to_vec();
    ep[1..5].copy_from_slice(&0x4242u32.to_le_bytes());
    ep.extend_from_slice(&(name.len() as u16).to_le_bytes());
    ep.extend_from_slice(&name);
    let connected = victim.qp.connect(&Endpoint::from_bytes(&ep).unwrap(), attr);
    (child, s, connected)
}
