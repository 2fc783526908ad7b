//! Doorbells between processes that no peer can block or silence for another peer.
//!
//! A doorbell wakes a sleeper (a CQ's consumer, the device's progress thread) after a peer
//! published work in shared memory. It was an eventfd; but an eventfd passed to a peer is one
//! open file description in both processes, so the peer can clear its `O_NONBLOCK` and fill its
//! counter, after which our next write to it blocks for good (and Linux has no per-call
//! non-blocking eventfd write: `pwritev2(RWF_NOWAIT)` is `EOPNOTSUPP`). The peer could also read
//! the counter back to zero and so swallow the wake-ups other peers owed us.
//!
//! So a doorbell is a connected pair of `AF_UNIX` `SOCK_DGRAM` sockets made **per connection**
//! by the side that sleeps ([`BellSet::offer`]): it keeps its end in its [`BellSet`], an epoll
//! set of its own, and passes the other end to that one peer. The peer rings with
//! `send(MSG_DONTWAIT)` ([`Bell::ring`]), a per-call flag no file-status change can undo, and
//! every read of ours is `MSG_DONTWAIT` too. What a peer can do to a pair (fill it, shut it
//! down, disconnect it, read it, keep a copy of our end if it made the pair) reaches that
//! pair only, so that connection only, and a doorbell never makes us block. A pair serves
//! both ways when both sides sleep on one CQ (a link): the peer puts the end it was given in
//! its own set ([`BellSet::adopt`]) and we ring it from ours ([`BellIn::bell`]), one fd per
//! side as the eventfd was.
//!
//! The sleeper waits on the set's epoll fd. Every datagram queued on a member wakes the
//! set's waiters again (Linux's epoll calls its own waiters on each member's wake-up, so a
//! consumer registered edge-triggered, as tokio does, sees one edge per ring, as with an
//! eventfd). The queues are drained only now and then ([`BellSet::drain`]): an honest peer rings
//! at most once per arming of its flag in the shared ring, so a drain every few arms keeps them
//! far below the socket buffer, and a peer flooding its doorbell costs us a bounded drain.
//! A wake-up from this process adds an always-readable eventfd, one per process and never
//! passed on, to the set, and the waiter takes it out again when it wakes.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::peer_fd::PeerFd;

use crate::{Error, Result};

/// Datagrams taken from one doorbell per visit: about what one pair can hold (the sender's
/// socket buffer, some 280 one-byte datagrams), so an honest doorbell is emptied in one visit,
/// and a peer flooding its own doorbell makes us read at most this many per visit.
const DRAIN_PER_BELL: usize = 256;
/// Doorbells one `epoll_wait` of a drain returns.
const DRAIN_BELLS: usize = 64;
/// `epoll_wait`s one drain makes at most (level-triggered: a doorbell left non-empty comes
/// back at the end of the ready list): 1024 doorbell visits per drain.
const DRAIN_BATCHES: usize = 16;

/// Token of the process's always-readable eventfd in a set's epoll events (members get 1,
/// 2, …).
const LOCAL: u64 = 0;

/// An eventfd whose counter is 1 and never read: always readable, never leaves the process.
/// Adding it to a set is a wake-up from this process ([`BellSet::signal`]), taking it out
/// consumes that wake-up: one fd per process instead of one per set.
fn ready_fd() -> Result<RawFd> {
    static READY: OnceLock<std::result::Result<OwnedFd, String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            // SAFETY: eventfd has no memory-safety preconditions.
            let fd = unsafe { libc::eventfd(1, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
            // SAFETY: just created, owned by nothing else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .as_ref()
        .map(|fd| fd.as_raw_fd())
        .map_err(|e| Error::InvalidState(format!("eventfd for local wake-ups: {e}")))
}

/// The epoll fd of a set and its members by token, shared by the set and the receiving ends
/// registered in it (each removes itself on drop). A drain reads a member through the map, so
/// it never reads an fd number that a member closed concurrently and something else reused.
#[derive(Debug)]
struct Epoll {
    fd: OwnedFd,
    members: Mutex<HashMap<u64, Arc<PeerFd>>>,
    next: AtomicU64,
    /// The always-readable eventfd is in the set: a local wake-up is pending (the lock
    /// orders adding and removing it).
    local: Mutex<bool>,
    /// A lock-free hint of `local` for the consumer's fast path.
    local_hint: AtomicBool,
}

/// An epoll set of the receiving ends of doorbells given to peers; wake-ups from this process
/// add the process's always-readable eventfd to it.
#[derive(Debug)]
pub(crate) struct BellSet {
    ep: Arc<Epoll>,
    ready: RawFd,
}

/// The receiving end of a doorbell given to a peer; leaves its set when dropped (the QP that
/// offered it goes).
#[derive(Debug)]
pub(crate) struct BellIn {
    ep: Arc<Epoll>,
    token: u64,
    fd: Arc<PeerFd>,
}

/// A doorbell we ring: one end of a datagram socket pair, whose other end is in a peer's set.
/// The pair may serve both ways ([`BellIn::bell`], [`BellSet::adopt`]): each end receives
/// what the other sends.
#[derive(Debug, Clone)]
pub(crate) struct Bell {
    tx: Arc<PeerFd>,
}

fn last_os(what: &'static str) -> Error {
    Error::last_os(what)
}

fn ctl(ep: &Epoll, op: libc::c_int, fd: RawFd, token: u64) -> std::io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: both fds are open; `ev` is a valid epoll_event (ignored for EPOLL_CTL_DEL).
    if unsafe { libc::epoll_ctl(ep.fd.as_raw_fd(), op, fd, &raw mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl BellSet {
    pub(crate) fn new() -> Result<BellSet> {
        // SAFETY: plain syscall; the result is checked.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(last_os("epoll_create1"));
        }
        // SAFETY: just created, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(ep) };
        let ep = Arc::new(Epoll {
            fd,
            members: Mutex::new(HashMap::new()),
            next: AtomicU64::new(LOCAL + 1),
            local: Mutex::new(false),
            local_hint: AtomicBool::new(false),
        });
        Ok(BellSet {
            ep,
            ready: ready_fd()?,
        })
    }

    /// The fd to wait on: readable once any doorbell of the set rang.
    pub(crate) fn fd(&self) -> RawFd {
        self.ep.fd.as_raw_fd()
    }

    /// Wakes the set's waiter from this process: adds the always-readable eventfd, which
    /// makes the set readable and wakes its waiters (as a ring does). Nothing to do while a
    /// wake-up is pending ([`BellSet::consume_local`] not called since).
    pub(crate) fn signal(&self) {
        let mut local = self.ep.local.lock();
        if !*local {
            // The hint goes up before the eventfd goes in: a waiter the addition wakes must
            // not find the hint still down and leave the eventfd in the set, or every later
            // signal would find a wake-up pending and wake nobody.
            self.ep.local_hint.store(true, Ordering::SeqCst);
            if ctl(&self.ep, libc::EPOLL_CTL_ADD, self.ready, LOCAL).is_ok() {
                *local = true;
            } else {
                self.ep.local_hint.store(false, Ordering::SeqCst);
            }
        }
    }

    /// Consumes a pending local wake-up (the waiter woke): the next [`BellSet::signal`]
    /// wakes it again.
    pub(crate) fn consume_local(&self) {
        if !self.ep.local_hint.load(Ordering::SeqCst) {
            return;
        }
        let mut local = self.ep.local.lock();
        if *local {
            let _ = ctl(&self.ep, libc::EPOLL_CTL_DEL, self.ready, LOCAL);
            *local = false;
            self.ep.local_hint.store(false, Ordering::SeqCst);
        }
    }

    /// A new doorbell for one peer: its receiving end joins the set (kept by the caller for
    /// as long as the peer may ring), its sending end goes to the peer (`SCM_RIGHTS`) and is
    /// closed here once sent.
    pub(crate) fn offer(&self) -> Result<(BellIn, OwnedFd)> {
        let mut sv = [0 as RawFd; 2];
        // SAFETY: `sv` has room for the two fds; the result is checked.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            )
        };
        if rc < 0 {
            return Err(last_os("socketpair(doorbell)"));
        }
        // SAFETY: both fds were just created and are owned by nothing else.
        let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
        Ok((self.join(Arc::new(PeerFd::new(rx)))?, tx))
    }

    /// Puts the end of a peer's doorbell we ring into this set too, so the peer rings us on
    /// the same pair (from its end): one fd for both ways. What a peer can do to a pair it
    /// made still reaches that pair only (module doc).
    pub(crate) fn adopt(&self, bell: &Bell) -> Result<BellIn> {
        self.join(bell.tx.clone())
    }

    fn join(&self, fd: Arc<PeerFd>) -> Result<BellIn> {
        refuse_rights(fd.raw());
        let token = self.ep.next.fetch_add(1, Ordering::Relaxed);
        let mut members = self.ep.members.lock();
        ctl(&self.ep, libc::EPOLL_CTL_ADD, fd.as_raw_fd(), token).map_err(|source| Error::Os {
            what: "epoll_ctl(ADD)",
            source,
        })?;
        members.insert(token, fd.clone());
        drop(members);
        Ok(BellIn {
            ep: self.ep.clone(),
            token,
            fd,
        })
    }

    /// Empties the doorbells that rang (up to [`DRAIN_BELLS`] × [`DRAIN_BATCHES`] visits of
    /// at most [`DRAIN_PER_BELL`] datagrams) and consumes a local wake-up. Never blocks: every read is
    /// `MSG_DONTWAIT`.
    pub(crate) fn drain(&self) {
        for _ in 0..DRAIN_BATCHES {
            if self.drain_batch() < DRAIN_BELLS {
                break;
            }
        }
    }

    /// One `epoll_wait` of [`BellSet::drain`]; returns how many members it reported.
    fn drain_batch(&self) -> usize {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; DRAIN_BELLS];
        // SAFETY: `evs` has room for DRAIN_BELLS events; timeout 0 never sleeps.
        let n = unsafe {
            libc::epoll_wait(
                self.ep.fd.as_raw_fd(),
                evs.as_mut_ptr(),
                DRAIN_BELLS as libc::c_int,
                0,
            )
        };
        let n = n.max(0) as usize;
        for ev in evs.iter().take(n) {
            let token = ev.u64;
            if token == LOCAL {
                self.consume_local();
                continue;
            }
            // The member's fd stays open while this clone of it lives (a member that left
            // meanwhile is skipped).
            let Some(rx) = self.ep.members.lock().get(&token).cloned() else {
                continue;
            };
            for _ in 0..DRAIN_PER_BELL {
                if !take_one(rx.raw()) {
                    break;
                }
            }
        }
        n
    }
}

/// `SO_PASSRIGHTS` (Linux 6.16): with it off, a sender's `SCM_RIGHTS` to the socket fails
/// `EPERM`. Not in the libc crate yet; older kernels refuse the option (`ENOPROTOOPT`), and
/// then [`take_one`] still keeps a passed file's close off this thread.
const SO_PASSRIGHTS: libc::c_int = 83;

/// Refuses files sent to our end of a doorbell, where the kernel can.
fn refuse_rights(fd: RawFd) {
    let off: libc::c_int = 0;
    // SAFETY: an int option on an open socket; failure (an older kernel) is harmless.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&raw const off).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Takes one datagram off a doorbell without blocking; false when there was none. Files a peer
/// sent with it (`SCM_RIGHTS`) are received whole (room for the most one message carries, so
/// the kernel closes none here) and closed off this thread ([`super::peer_fd`]): a peer's
/// lingering socket must not stall the CQ's consumer or the progress thread.
fn take_one(fd: RawFd) -> bool {
    let mut b = [0u8; 16];
    let mut iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: b.len(),
    };
    let mut cbuf = [0u64; super::sock::CMSG_WORDS];
    // SAFETY: an all-zero msghdr is a valid value of this plain C struct.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: `msg` points to live, writable iovec and control buffers; MSG_DONTWAIT never
    // sleeps.
    let r = unsafe {
        libc::recvmsg(
            fd,
            &raw mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if r < 0 {
        return false;
    }
    // Any files that came with it go to the closer thread as they drop here.
    // SAFETY: `msg` was just filled by this successful recvmsg; `cbuf` is live.
    drop(unsafe { super::peer_fd::received_fds(&msg) });
    // A datagram may be empty; 0 bytes and no control data is a shut-down socket's EOF.
    r > 0 || msg.msg_controllen > 0
}

impl BellIn {
    /// The same pair as a doorbell to ring: the peer that holds the other end receives it.
    pub(crate) fn bell(&self) -> Bell {
        Bell {
            tx: self.fd.clone(),
        }
    }
}

impl Drop for BellIn {
    fn drop(&mut self) {
        if self.ep.members.lock().remove(&self.token).is_some() {
            let _ = ctl(
                &self.ep,
                libc::EPOLL_CTL_DEL,
                self.fd.as_raw_fd(),
                self.token,
            );
        }
    }
}

impl Bell {
    /// A peer's doorbell, checked to be the sending end of a Unix datagram socket (anything
    /// else is refused: a peer choosing the kind of fd could choose one whose writes block).
    pub(crate) fn from_peer(fd: PeerFd) -> std::result::Result<Bell, String> {
        let opt = |name: libc::c_int| -> Option<libc::c_int> {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `v` and `len` are valid for getsockopt's int option.
            let rc = unsafe {
                libc::getsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    name,
                    (&raw mut v).cast(),
                    &raw mut len,
                )
            };
            (rc == 0).then_some(v)
        };
        if opt(libc::SO_DOMAIN) != Some(libc::AF_UNIX)
            || opt(libc::SO_TYPE) != Some(libc::SOCK_DGRAM)
        {
            return Err("a doorbell must be a Unix datagram socket".into());
        }
        Ok(Bell { tx: Arc::new(fd) })
    }

    /// Rings: one datagram, never blocking whatever the peer did to the socket (a full queue,
    /// a shut-down or disconnected socket lose only this peer's wake-up).
    pub(crate) fn ring(&self) {
        // SAFETY: sends one byte from a valid buffer; MSG_DONTWAIT never sleeps and
        // MSG_NOSIGNAL keeps a closed peer from raising SIGPIPE.
        unsafe {
            libc::send(
                self.tx.as_raw_fd(),
                [1u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; timeout 0.
        unsafe { libc::poll(&raw mut p, 1, 0) };
        p.revents & libc::POLLIN != 0
    }

    #[test]
    fn a_rung_bell_makes_its_set_readable_until_drained() {
        let set = BellSet::new().unwrap();
        let (_rx, tx) = set.offer().unwrap();
        let bell = Bell::from_peer(PeerFd::new(tx)).unwrap();
        assert!(!readable(set.fd()));
        bell.ring();
        bell.ring();
        assert!(readable(set.fd()));
        set.drain();
        assert!(!readable(set.fd()));
        set.signal();
        set.signal();
        assert!(readable(set.fd()));
        set.consume_local();
        assert!(!readable(set.fd()));
        set.signal();
        assert!(readable(set.fd()), "a wake-up after the last was consumed");
        set.drain();
        assert!(!readable(set.fd()));
    }

    /// Regression (review of issue 22): `signal` raised the fast-path hint only after adding
    /// the eventfd, so a waiter woken by the addition could find the hint down, leave the
    /// eventfd in the set, and from then on every `signal` found a wake-up pending and made no
    /// edge: a consumer slept on a CQ holding a completion (echo_rtt's p99 was the 1 ms nudge).
    #[test]
    fn a_waiter_woken_by_a_local_signal_always_consumes_it_so_the_next_signal_wakes_again() {
        let set = Arc::new(BellSet::new().unwrap());
        // An edge-triggered outer epoll, as tokio registers a CQ's fd.
        // SAFETY: plain syscall; owned below.
        let outer = unsafe { OwnedFd::from_raw_fd(libc::epoll_create1(libc::EPOLL_CLOEXEC)) };
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: 1,
        };
        // SAFETY: both fds are open; `ev` is valid.
        let rc = unsafe {
            libc::epoll_ctl(
                outer.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                set.fd(),
                &raw mut ev,
            )
        };
        assert_eq!(rc, 0);
        let outer = Arc::new(outer);
        for round in 0..2000 {
            let (s2, o2) = (set.clone(), outer.clone());
            let waiter = std::thread::spawn(move || {
                let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
                // SAFETY: `evs` has room for 4 events.
                let n = unsafe { libc::epoll_wait(o2.as_raw_fd(), evs.as_mut_ptr(), 4, 5000) };
                s2.consume_local(); // what `ack_event` does once woken
                n
            });
            std::thread::sleep(std::time::Duration::from_micros(20));
            set.signal();
            assert_eq!(
                waiter.join().unwrap(),
                1,
                "round {round}: the signal woke the waiter"
            );
            assert!(
                !readable(set.fd()),
                "round {round}: the woken waiter left the local wake-up pending"
            );
        }
    }

    /// Sends `file` over the doorbell end `tx` (`SCM_RIGHTS`), as a hostile peer would.
    fn send_file(tx: RawFd, file: RawFd) -> std::io::Result<()> {
        crate::soft::peer_fd::tests::send_fds(tx, &[file])
    }

    /// Regression (review of issue 22, F1): a peer sent a TCP socket with `SO_LINGER` and
    /// unsent data over its doorbell; the drain received it without room for files, the
    /// kernel closed it in the draining thread, and that close waited out the linger time
    /// (3.06 s measured): a CQ's consumer or the device's progress thread, stalled at will.
    #[test]
    fn a_lingering_socket_a_peer_sends_over_a_doorbell_never_stalls_the_drain() {
        use crate::soft::peer_fd::tests::lingering_socket;
        let set = BellSet::new().unwrap();
        let (rx, tx) = set.offer().unwrap();
        let (file, _l) = lingering_socket(3);
        // Where the kernel refuses files to our end (SO_PASSRIGHTS, Linux 6.16): EPERM.
        if let Err(e) = send_file(tx.as_raw_fd(), file.as_raw_fd()) {
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        }
        // A peer that made the pair keeps a copy of our end and allows files again (or the
        // kernel is older): the file arrives, and the drain must not close it in place.
        let on: libc::c_int = 1;
        // SAFETY: an int option on an open socket.
        unsafe {
            libc::setsockopt(
                rx.fd.raw(),
                libc::SOL_SOCKET,
                SO_PASSRIGHTS,
                (&raw const on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        send_file(tx.as_raw_fd(), file.as_raw_fd()).unwrap();
        drop(file); // the copy in flight is now the last one
        assert!(readable(set.fd()));
        let t0 = std::time::Instant::now();
        set.drain();
        let took = t0.elapsed();
        assert!(!readable(set.fd()), "drained");
        assert!(
            took < std::time::Duration::from_secs(2),
            "the drain closed the peer's lingering socket in place: {took:?}"
        );
    }

    /// Regression (review of issue 22, F6): a drain visited 64 doorbells and took 64 rings
    /// from each, so on a CQ shared by more than 256 connections that each ring once per arm
    /// (drained every 16 arms) the queues grew until rings failed and woke nobody.
    #[test]
    fn one_drain_empties_two_hundred_doorbells_with_a_hundred_rings_each() {
        let set = BellSet::new().unwrap();
        let bells: Vec<(BellIn, Bell)> = (0..200)
            .map(|_| {
                let (rx, tx) = set.offer().unwrap();
                (rx, Bell::from_peer(PeerFd::new(tx)).unwrap())
            })
            .collect();
        for (_, b) in &bells {
            for _ in 0..100 {
                b.ring();
            }
        }
        set.drain();
        assert!(!readable(set.fd()), "rings left after one drain");
    }

    #[test]
    fn a_pair_adopted_by_the_peer_rings_both_ways_and_each_side_drains_only_its_end() {
        let (ours, theirs) = (BellSet::new().unwrap(), BellSet::new().unwrap());
        let (our_end, their_fd) = ours.offer().unwrap();
        let to_us_from_them = Bell::from_peer(PeerFd::new(their_fd)).unwrap();
        let _their_end = theirs.adopt(&to_us_from_them).unwrap();
        let to_them = our_end.bell();
        to_them.ring();
        assert!(readable(theirs.fd()) && !readable(ours.fd()));
        to_us_from_them.ring();
        assert!(readable(ours.fd()));
        ours.drain();
        assert!(!readable(ours.fd()) && readable(theirs.fd()));
        theirs.drain();
        assert!(!readable(theirs.fd()));
    }

    #[test]
    fn a_bell_whose_queue_is_full_and_whose_socket_is_made_blocking_never_blocks_the_ringer() {
        let set = BellSet::new().unwrap();
        let (_rx, tx) = set.offer().unwrap();
        // The peer keeps a copy of the same open file, clears O_NONBLOCK on it, fills the queue.
        // SAFETY: dup of an open fd; the result is owned below.
        let dup = unsafe { OwnedFd::from_raw_fd(libc::dup(tx.as_raw_fd())) };
        // SAFETY: F_SETFL on an open fd.
        unsafe { libc::fcntl(dup.as_raw_fd(), libc::F_SETFL, 0) };
        let mut filled = 0;
        // SAFETY: a one-byte send that fails with EAGAIN once the queue is full.
        while unsafe {
            libc::send(
                dup.as_raw_fd(),
                [0u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT,
            )
        } == 1
        {
            filled += 1;
        }
        assert!(filled > 0);
        let bell = Bell::from_peer(PeerFd::new(tx)).unwrap();
        // Blocking here would hang the test (and, in the provider, the progress thread).
        for _ in 0..1000 {
            bell.ring();
        }
    }

    #[test]
    fn an_eventfd_or_a_stream_socket_is_refused_as_a_doorbell() {
        // SAFETY: eventfd has no preconditions; owned below.
        let efd = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) };
        assert!(Bell::from_peer(PeerFd::new(efd)).is_err());
        let mut sv = [0; 2];
        // SAFETY: valid array for two fds.
        let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: just created.
        let (a, _b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
        assert!(Bell::from_peer(PeerFd::new(a)).is_err());
    }

    #[test]
    fn a_dropped_receiving_end_leaves_its_set() {
        let set = BellSet::new().unwrap();
        let (rx, tx) = set.offer().unwrap();
        let bell = Bell::from_peer(PeerFd::new(tx)).unwrap();
        drop(rx);
        bell.ring();
        assert!(!readable(set.fd()), "a bell whose QP went wakes nobody");
    }
}
