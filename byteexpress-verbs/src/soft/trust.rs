//! Who the soft device talks to (issue 22, item 3).
//!
//! - **uid**: a connection accepted on the device's socket, and a socket the device dials, is
//!   used only when the process at the other end (`SO_PEERCRED`, unix(7): the connecting
//!   process's credentials for an accepted socket, the listener's for a dialed one) runs as
//!   our effective uid, or as a uid of the allow-list [`ALLOW_UIDS_ENV`]. Others are closed
//!   before a byte is read or written.
//! - **pid**: memfds (a QP's ring, a PD's arenas) go only to a process whose device took part
//!   in a successful nonce probe with ours (`Context::probe` / `Context::expect_probe`): the
//!   process that probed us with a nonce we expected, or the process whose device answered
//!   our probe. Our own process is always trusted. So a QP `connect` refuses to dial an
//!   endpoint address (a socket name the remote side chose) that belongs to any other
//!   process, and an inbound `Connect` from a process that never probed is refused.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Environment variable with extra uids allowed to connect to (and be dialed by) this
/// process's soft device: decimal uids separated by commas, read once when the device opens.
/// Our own effective uid is always allowed. Unparsable entries are ignored (with a warning).
pub const ALLOW_UIDS_ENV: &str = "BX_SOFT_ALLOW_UIDS";

/// How long a process stays trusted after its last successful probe: longer than any link
/// set-up between a probe and the QP connects that follow it.
const VERIFIED_TTL: Duration = Duration::from_secs(120);

/// The device's trust state.
#[derive(Debug)]
pub(crate) struct Trust {
    own_pid: libc::pid_t,
    uids: Vec<libc::uid_t>,
    verified: Mutex<HashMap<libc::pid_t, Instant>>,
}

impl Trust {
    /// Our euid plus the uids of [`ALLOW_UIDS_ENV`].
    pub(crate) fn from_env() -> Trust {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let mut uids = vec![unsafe { libc::geteuid() }];
        if let Ok(v) = std::env::var(ALLOW_UIDS_ENV) {
            for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                match part.parse::<libc::uid_t>() {
                    Ok(u) => uids.push(u),
                    Err(_) => tracing::warn!("{ALLOW_UIDS_ENV}: {part:?} is not a uid, ignored"),
                }
            }
        }
        Trust {
            own_pid: std::process::id() as libc::pid_t,
            uids,
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a process running as `uid` may talk to the device.
    pub(crate) fn uid_allowed(&self, uid: libc::uid_t) -> bool {
        self.uids.contains(&uid)
    }

    /// Records that process `pid` took part in a successful probe with us.
    pub(crate) fn verify(&self, pid: libc::pid_t) {
        let now = Instant::now();
        let mut v = self.verified.lock();
        v.retain(|_, t| now.duration_since(*t) < VERIFIED_TTL);
        v.insert(pid, now);
    }

    /// Whether memfds may go to process `pid`: ours, or one verified by a probe.
    pub(crate) fn may_receive_memory(&self, pid: libc::pid_t) -> bool {
        pid == self.own_pid
            || self
                .verified
                .lock()
                .get(&pid)
                .is_some_and(|t| t.elapsed() < VERIFIED_TTL)
    }

    /// Checks the process at the other end of `sock` (dialed or accepted): its uid must be
    /// allowed and, when `memory`, it must be trusted with memfds.
    pub(crate) fn check(&self, sock: &super::sock::Sock, memory: bool) -> Result<(), String> {
        let cred = sock.peer_cred().map_err(|e| format!("SO_PEERCRED: {e}"))?;
        if !self.uid_allowed(cred.uid) {
            return Err(format!(
                "peer process {} runs as uid {}, not allowed (own uid or {ALLOW_UIDS_ENV})",
                cred.pid, cred.uid
            ));
        }
        if memory && !self.may_receive_memory(cred.pid) {
            return Err(format!(
                "peer process {} took part in no successful probe with this device \
                 (Context::probe / expect_probe): no memory is passed to it",
                cred.pid
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_pid_is_trusted_others_only_once_verified() {
        let t = Trust::from_env();
        assert!(t.may_receive_memory(std::process::id() as libc::pid_t));
        assert!(!t.may_receive_memory(1));
        t.verify(1);
        assert!(t.may_receive_memory(1));
        // SAFETY: geteuid cannot fail.
        assert!(t.uid_allowed(unsafe { libc::geteuid() }));
    }
}
