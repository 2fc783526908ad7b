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
//! by the side that sleeps ([`BellSet::offer`]): it keeps the receiving end in its
//! [`BellSet`], an epoll set of its own, and passes the sending end to that one peer. The peer
//! rings with `send(MSG_DONTWAIT)` ([`Bell::ring`]), a per-call flag no file-status change
//! can undo. What a peer can do to its doorbell (fill it, shut it down, read it) reaches its own
//! connection only, and a doorbell we ring can never make us block.
//!
//! The sleeper waits on the set's epoll fd. Every datagram queued on a member wakes the
//! set's waiters again (Linux's epoll calls its own waiters on each member's wake-up, so a
//! consumer registered edge-triggered, as tokio does, sees one edge per ring, as with an
//! eventfd). The queues are drained only now and then ([`BellSet::drain`]): an honest peer rings
//! at most once per arming of its flag in the shared ring, so a drain every few arms keeps them
//! far below the socket buffer, and a peer flooding its doorbell costs us a bounded drain.
//! The set also holds an eventfd that is never passed on, for wake-ups from this process.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::{Error, Result};

/// Datagrams taken from one doorbell per drain: a peer flooding its own doorbell makes us read
/// at most this many per drain (the rest waits for the next one).
const DRAIN_PER_BELL: usize = 64;
/// Doorbells one drain visits (more wait for the next drain; the set stays readable).
const DRAIN_BELLS: usize = 64;

/// Token of the local eventfd in a set's epoll events (receiving ends get 1, 2, …).
const LOCAL: u64 = 0;

/// The epoll fd of a set and its members by token, shared by the set and the receiving ends
/// registered in it (each removes itself on drop). A drain reads a member through the map, so
/// it never reads an fd number that a member closed concurrently and something else reused.
#[derive(Debug)]
struct Epoll {
    fd: OwnedFd,
    members: Mutex<HashMap<u64, Arc<OwnedFd>>>,
    next: AtomicU64,
}

/// An epoll set of the receiving ends of doorbells given to peers, plus a local eventfd.
#[derive(Debug)]
pub(crate) struct BellSet {
    ep: Arc<Epoll>,
    /// Wake-ups from this process; never leaves it.
    local: OwnedFd,
}

/// The receiving end of a doorbell given to a peer; leaves its set when dropped (the QP that
/// offered it goes).
#[derive(Debug)]
pub(crate) struct BellIn {
    ep: Arc<Epoll>,
    token: u64,
}

/// A peer's doorbell: the sending end of a datagram socket pair the peer made.
#[derive(Debug)]
pub(crate) struct Bell {
    tx: OwnedFd,
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
        });
        // SAFETY: eventfd has no memory-safety preconditions.
        let local = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if local < 0 {
            return Err(last_os("eventfd"));
        }
        // SAFETY: just created, owned by nothing else.
        let local = unsafe { OwnedFd::from_raw_fd(local) };
        ctl(&ep, libc::EPOLL_CTL_ADD, local.as_raw_fd(), LOCAL).map_err(|source| Error::Os {
            what: "epoll_ctl(ADD)",
            source,
        })?;
        Ok(BellSet { ep, local })
    }

    /// The fd to wait on: readable once any doorbell of the set rang.
    pub(crate) fn fd(&self) -> RawFd {
        self.ep.fd.as_raw_fd()
    }

    /// Wakes the set's waiter from this process.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own non-blocking eventfd, which no
        // other process holds (so no one can make it blocking). A full counter (2^64 − 2
        // unread wake-ups) fails harmlessly: the set is readable then anyway.
        unsafe { libc::write(self.local.as_raw_fd(), (&raw const one).cast(), 8) };
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
        // Only the peer sends; nothing is ever sent back on this pair.
        // SAFETY: `rx` is an open socket.
        unsafe { libc::shutdown(rx.as_raw_fd(), libc::SHUT_WR) };
        let token = self.ep.next.fetch_add(1, Ordering::Relaxed);
        let mut members = self.ep.members.lock();
        ctl(&self.ep, libc::EPOLL_CTL_ADD, rx.as_raw_fd(), token).map_err(|source| Error::Os {
            what: "epoll_ctl(ADD)",
            source,
        })?;
        members.insert(token, Arc::new(rx));
        drop(members);
        Ok((
            BellIn {
                ep: self.ep.clone(),
                token,
            },
            tx,
        ))
    }

    /// Empties the doorbells that rang (at most [`DRAIN_BELLS`] of them, [`DRAIN_PER_BELL`]
    /// datagrams each) and the local eventfd. Never blocks: every fd read here is ours alone.
    pub(crate) fn drain(&self) {
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
        for ev in evs.iter().take(n.max(0) as usize) {
            let token = ev.u64;
            if token == LOCAL {
                let mut v: u64 = 0;
                // SAFETY: reads at most 8 bytes into a valid u64 from our own non-blocking
                // eventfd.
                unsafe { libc::read(self.local.as_raw_fd(), (&raw mut v).cast(), 8) };
                continue;
            }
            // The member's fd stays open while this clone of it lives (a member that left
            // meanwhile is skipped).
            let Some(rx) = self.ep.members.lock().get(&token).cloned() else {
                continue;
            };
            let fd = rx.as_raw_fd();
            let mut b = [0u8; 16];
            for _ in 0..DRAIN_PER_BELL {
                // SAFETY: `b` is a valid buffer of its length; MSG_DONTWAIT never sleeps.
                let r =
                    unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
                if r <= 0 {
                    break;
                }
            }
        }
    }
}

impl Drop for BellIn {
    fn drop(&mut self) {
        if let Some(rx) = self.ep.members.lock().remove(&self.token) {
            let _ = ctl(&self.ep, libc::EPOLL_CTL_DEL, rx.as_raw_fd(), self.token);
        }
    }
}

impl Bell {
    /// A peer's doorbell, checked to be the sending end of a Unix datagram socket (anything
    /// else is refused: a peer choosing the kind of fd could choose one whose writes block).
    pub(crate) fn from_peer(fd: OwnedFd) -> std::result::Result<Bell, String> {
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
        Ok(Bell { tx: fd })
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
        let bell = Bell::from_peer(tx).unwrap();
        assert!(!readable(set.fd()));
        bell.ring();
        bell.ring();
        assert!(readable(set.fd()));
        set.drain();
        assert!(!readable(set.fd()));
        set.signal();
        assert!(readable(set.fd()));
        set.drain();
        assert!(!readable(set.fd()));
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
        let bell = Bell::from_peer(tx).unwrap();
        // Blocking here would hang the test (and, in the provider, the progress thread).
        for _ in 0..1000 {
            bell.ring();
        }
    }

    #[test]
    fn an_eventfd_or_a_stream_socket_is_refused_as_a_doorbell() {
        // SAFETY: eventfd has no preconditions; owned below.
        let efd = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) };
        assert!(Bell::from_peer(efd).is_err());
        let mut sv = [0; 2];
        // SAFETY: valid array for two fds.
        assert_eq!(
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) },
            0
        );
        // SAFETY: just created.
        let (a, _b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
        assert!(Bell::from_peer(a).is_err());
    }

    #[test]
    fn a_dropped_receiving_end_leaves_its_set() {
        let set = BellSet::new().unwrap();
        let (rx, tx) = set.offer().unwrap();
        let bell = Bell::from_peer(tx).unwrap();
        drop(rx);
        bell.ring();
        assert!(!readable(set.fd()), "a bell whose QP went wakes nobody");
    }
}
