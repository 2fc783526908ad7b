//! A hostile peer process against the soft device's doorbells (issue 22, found in review).
//!
//! A doorbell is shared with a peer as an fd. When it was an eventfd, both processes held one
//! open file description: the peer could clear its `O_NONBLOCK` and fill its counter, and our
//! next ring of it blocked for good (in the thread posting a SEND, or in the device's progress
//! thread); and holding the eventfd of one of our CQs, it could do the same to every other
//! peer ringing that CQ and to our own wake-ups. These tests make the strongest attack the
//! protocol leaves a peer, and check that it costs nobody but the attacker.
//!
//! The peer is this test binary started again (`child_entry`, roles `blocker-*`, `silencer`).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::time::Duration;

use byteexpress_verbs::{ConnectAttr, QpCap, WcStatus, WrOp};
use common::peer::{self, get, put};
use common::raw::{self, CAP, SGE, STAGE, connect_msg, dial, recv_msg, send_msg};
use common::*;

const T: Duration = Duration::from_secs(10);
/// Offset of `armed` in a ring (soft/ring.rs): the owner's CQ sleeps, ring its doorbell.
const OFF_ARMED: usize = 256;
/// Offset of the first receive WQE in a ring (its `num_sge` u32 first).
const OFF_WQE0: usize = 512;

/// The peer process's entry point (not a check of its own: it returns at once in a normal run).
#[test]
fn child_entry() {
    let Some((role, mut s)) = peer::peer_role() else {
        return;
    };
    match role.as_str() {
        "blocker-eventfd" => child_blocker(&mut s, false),
        "blocker-socket" => child_blocker(&mut s, true),
        "silencer" => child_silencer(&mut s),
        other => panic!("unknown role {other}"),
    }
}

/// Whether `fd` is a socket (else, here, an eventfd).
fn is_socket(fd: RawFd) -> bool {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid out-pointers for an int option.
    unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&raw mut v).cast(),
            &raw mut len,
        ) == 0
    }
}

/// Makes the doorbell `fd` (a copy of one shared with the other process) as hostile as it can
/// be made: full, and blocking for whoever writes to the same open file. An eventfd gets its
/// counter filled to the maximum; a socket gets its queue filled; both lose `O_NONBLOCK`.
fn jam(fd: RawFd) {
    if is_socket(fd) {
        // SAFETY: one-byte non-blocking sends from a valid buffer until the queue is full.
        while unsafe { libc::send(fd, [0u8].as_ptr().cast(), 1, libc::MSG_DONTWAIT) } == 1 {}
    } else {
        let max = u64::MAX - 1;
        // SAFETY: an 8-byte write from a valid u64 (an eventfd's counter at its maximum).
        unsafe { libc::write(fd, (&raw const max).cast(), 8) };
    }
    // SAFETY: F_SETFL on an open fd: clears O_NONBLOCK on the shared open file.
    unsafe { libc::fcntl(fd, libc::F_SETFL, 0) };
}

/// Attaches a QP of its own to the victim's with a doorbell of its own making (an eventfd,
/// or the sending end of a datagram socket pair as the device asks), says whether the device
/// accepted it, and if so: takes the victim's Connect back, jams its own doorbell (it keeps a
/// copy of the shared open file), posts one receive WQE and arms its ring, so the victim's
/// next SEND rings that doorbell.
fn child_blocker(s: &mut TcpStream, socket: bool) {
    let dev_name = get(s);
    let nonce = u64::from_le_bytes(get(s).try_into().unwrap());
    let victim_qpn = u32::from_le_bytes(get(s).try_into().unwrap());
    let my_name = format!("bx-blocker-{}", std::process::id()).into_bytes();
    raw::probe(&dev_name, nonce);
    let ring = raw::memfd(c"blocker-ring", raw::ring_bytes(CAP, SGE));
    let stage = raw::memfd(c"blocker-stage", STAGE);
    let my_ring = raw::map(ring.as_raw_fd(), raw::ring_bytes(CAP, SGE), true);
    let (_bell_rx, bell) = if socket {
        raw::doorbell()
    } else {
        // SAFETY: eventfd has no preconditions; owned below (twice: the second is a dup).
        unsafe {
            let e = libc::eventfd(0, libc::EFD_CLOEXEC);
            (OwnedFd::from_raw_fd(libc::dup(e)), OwnedFd::from_raw_fd(e))
        }
    };
    let c = dial(&dev_name);
    send_msg(
        c.as_raw_fd(),
        &connect_msg(0x4242, victim_qpn, &my_name, 0),
        &[ring.as_raw_fd(), bell.as_raw_fd(), stage.as_raw_fd()],
    );
    let (reply, _) = recv_msg(c.as_raw_fd());
    let accepted = reply[..2] == [4, 1];
    put(s, &my_name);
    put(s, if accepted { b"accepted" } else { b"refused" });
    if !accepted {
        return;
    }
    let (m, _victim_fds) = recv_msg(c.as_raw_fd());
    assert_eq!(m[0], 3, "the victim's Connect");
    send_msg(c.as_raw_fd(), &raw::CONNECT_OK, &[]);
    assert_eq!(get(s), b"jam");
    jam(bell.as_raw_fd());
    // SAFETY: offsets inside our own ring's header and first WQE, aligned.
    unsafe {
        raw::put32(my_ring, OFF_WQE0, 1);
        raw::put64(my_ring, raw::OFF_RECV_PROD, 1);
        raw::put32(my_ring, OFF_ARMED, 1);
    }
    put(s, b"jammed");
    assert_eq!(get(s), b"done");
    s.flush().unwrap();
    drop(c); // open to the end: its close would be our death
}

/// Runs `f` on another thread and waits up to `T` for it: a call that blocks forever fails
/// the test instead of hanging it (the stuck thread dies with the test process).
fn within_t<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(T)
        .unwrap_or_else(|_| panic!("{what} did not return within {T:?}: it blocked"))
}

#[test]
fn a_peer_cannot_make_a_doorbell_we_ring_block_us() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    for (i, socket) in [true, false].into_iter().enumerate() {
        let role = if socket {
            "blocker-socket"
        } else {
            "blocker-eventfd"
        };
        let victim = soft_side(QpCap::default(), 4096);
        let nonce = (0xB10C_u64 + i as u64) ^ u64::from(std::process::id());
        ctx.expect_probe(nonce);
        let (mut child, mut s) = peer::spawn_peer("child_entry", role, T);
        let info = ctx.device_info().to_bytes();
        put(&mut s, &info[3 + 8..]);
        put(&mut s, &nonce.to_le_bytes());
        put(&mut s, &victim.qp.qp_num().to_le_bytes());
        let name = get(&mut s);
        let verdict = get(&mut s);
        if !socket {
            // An eventfd is one open file in both processes: refused as a doorbell.
            assert_eq!(verdict, b"refused", "an eventfd doorbell is refused");
            assert!(child.wait().unwrap().success());
            continue;
        }
        assert_eq!(
            verdict, b"accepted",
            "a datagram socket doorbell is accepted"
        );
        let mut ep = victim.qp.endpoint().to_bytes()[..31].to_vec();
        ep[1..5].copy_from_slice(&0x4242u32.to_le_bytes());
        ep.extend_from_slice(&(name.len() as u16).to_le_bytes());
        ep.extend_from_slice(&name);
        let attr = fast_attr();
        victim
            .qp
            .connect(
                &byteexpress_verbs::Endpoint::from_bytes(&ep).unwrap(),
                &attr,
            )
            .expect("the victim connects back");
        put(&mut s, b"jam");
        assert_eq!(get(&mut s), b"jammed");
        // Our SEND lands in the peer's armed ring and rings its jammed doorbell: the post
        // returns (the send itself fails later, unacknowledged).
        let victim = within_t("a SEND ringing a jammed doorbell", move || {
            victim.write(0, b"ring it!");
            victim.send(1, WrOp::Send, 0, 8, true).unwrap();
            victim
        });
        let wc = poll_n(&victim.send_cq, 1, T);
        assert_eq!(wc.len(), 1, "the unacknowledged SEND completes");
        assert_eq!(wc[0].status, WcStatus::RetryExcErr);
        // The progress thread still runs: a new pair connects through it and delivers.
        let (a, b) = within_t("a new connection", || {
            soft_pair(QpCap::default(), ConnectAttr::default())
        });
        b.post_recv(7, 0, 64);
        a.write(0, b"after");
        a.send(7, WrOp::Send, 0, 5, true).unwrap();
        let rx = poll_n(&b.recv_cq, 1, T);
        assert_eq!((rx[0].wr_id, rx[0].status), (7, WcStatus::Success));
        assert_eq!(b.read(0, 5), b"after");
        put(&mut s, b"done");
        assert!(child.wait().unwrap().success());
    }
}

/// Attaches to the victim QP (whose recv CQ an honest QP shares), then does its worst to the
/// doorbell of that CQ: fills the victim's end of it and makes that end blocking (it holds a
/// copy of the same open file: it made the pair), then keeps reading it and shuts it down.
fn child_silencer(s: &mut TcpStream) {
    let at = raw::attach(s);
    assert_eq!(get(s), b"jam");
    let end = at.victim_end;
    if is_socket(end) {
        // SAFETY: one-byte non-blocking sends into the victim's end until its queue is full.
        while unsafe { libc::send(at.victim_bell, [0u8].as_ptr().cast(), 1, libc::MSG_DONTWAIT) }
            == 1
        {}
        // SAFETY: F_SETFL on an open fd: clears O_NONBLOCK on the shared open file.
        unsafe { libc::fcntl(end, libc::F_SETFL, 0) };
    } else {
        jam(end);
    }
    put(s, b"jammed");
    // Swallow what anyone rings there, as long as the victim wants.
    let mut b = [0u8; 8];
    loop {
        // SAFETY: a read of at most 8 bytes into a valid buffer, without blocking.
        unsafe { libc::recv(end, b.as_mut_ptr().cast(), 8, libc::MSG_DONTWAIT) };
        if is_socket(end) {
            // SAFETY: shutdown of an open socket.
            unsafe { libc::shutdown(end, libc::SHUT_RDWR) };
        }
        std::thread::sleep(Duration::from_millis(1));
        let mut done = [0u8; 4];
        s.set_nonblocking(true).unwrap();
        let r = std::io::Read::read(s, &mut done);
        s.set_nonblocking(false).unwrap();
        if !matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
            break; // "done", or the test ended
        }
    }
    drop(at);
}

#[test]
fn a_peer_cannot_block_or_silence_a_doorbell_of_a_cq_other_peers_share() {
    if peer::peer_role().is_some() {
        return;
    }
    let ctx = soft();
    let (a, b) = soft_pair(QpCap::default(), ConnectAttr::default());
    // The victim QP delivers into b's recv CQ: that CQ's doorbell goes to the hostile peer.
    let pd = ctx.alloc_pd().unwrap();
    let send_cq = ctx.create_cq(64).unwrap();
    let qp = pd
        .create_qp(&send_cq, &b.recv_cq, QpCap::default())
        .unwrap();
    let mem = pd.alloc_shared(4096).unwrap();
    let mr = pd
        .reg_shared(&mem, 0, mem.len(), byteexpress_verbs::Access::LOCAL_WRITE)
        .unwrap();
    let victim = Side {
        pd,
        qp,
        send_cq,
        recv_cq: b.recv_cq.clone(),
        mem,
        mr,
    };
    let nonce = 0x51_1E_u64 ^ u64::from(std::process::id());
    let (mut child, mut s) = raw::raw_peer_connected(
        &ctx,
        &victim,
        "child_entry",
        "silencer",
        nonce,
        &ConnectAttr::default(),
    );
    put(&mut s, b"jam");
    assert_eq!(get(&mut s), b"jammed");
    // b's consumer sleeps on the shared CQ; each SEND of a wakes it (a rings its own doorbell
    // of that CQ, which the hostile peer never held).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = (std::sync::Arc::new(a), std::sync::Arc::new(b));
    for i in 0..20u64 {
        b.post_recv(i, 0, 64);
        let got = rt.block_on(async {
            let sender = a.clone();
            let send = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(2)); // after b's consumer sleeps
                sender.write(0, &i.to_le_bytes());
                sender.send(i, WrOp::Send, 0, 8, true).unwrap();
            });
            let mut out = [byteexpress_verbs::Wc::default(); 4];
            let got = tokio::time::timeout(T, async {
                loop {
                    b.recv_cq.ready(Duration::ZERO).await.unwrap();
                    let n = b.recv_cq.poll(&mut out).unwrap();
                    if n > 0 {
                        return out[..n].to_vec();
                    }
                }
            })
            .await
            .unwrap_or_else(|_| panic!("message {i}: the sleeping consumer was never woken"));
            // A blocked doorbell write would leave the sender stuck here.
            within_t("the honest sender", move || send.join().unwrap());
            got
        });
        assert_eq!((got[0].wr_id, got[0].status), (i, WcStatus::Success));
        assert_eq!(b.read(0, 8), i.to_le_bytes());
        assert_eq!(poll_n(&a.send_cq, 1, T)[0].status, WcStatus::Success);
    }
    put(&mut s, b"done");
    assert!(child.wait().unwrap().success());
    drop(victim);
}
