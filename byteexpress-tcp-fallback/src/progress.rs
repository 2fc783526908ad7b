//! A hook called whenever bytes move on a stream, so a connection's owner can tell a peer that
//! is slowly sending (or taking) one huge frame from a dead one.

use std::fmt;
use std::sync::Arc;

/// Called with the byte count after every read that returned bytes ([`crate::FrameReader`]) or
/// every write the stream accepted bytes of ([`crate::FrameWriter`]), from the task driving
/// that half. Meant to be cheap (e.g. adding to a counter): it runs once per syscall. An owner
/// should count progress only above some rate, or a peer trickling a byte now and then would
/// look alive for ever.
///
/// Why: a frame of several GiB can take longer than a keepalive timeout to cross a loaded
/// machine, and a frame-level "heard from the peer" sees nothing until it is whole. Bytes read
/// are the peer speaking. Bytes the socket takes are weaker evidence (a socket takes small
/// writes into its buffer whatever the peer does): they say only that a long write of ours is
/// still moving, which is what a PING queued behind it waits for. gRPC over HTTP/2 needs
/// neither, since its PING frames go between DATA frames.
#[derive(Clone)]
pub struct Progress(Arc<dyn Fn(usize) + Send + Sync>);

impl Progress {
    /// A hook calling `f(bytes)`.
    pub fn new(f: impl Fn(usize) + Send + Sync + 'static) -> Self {
        Progress(Arc::new(f))
    }

    pub(crate) fn note(&self, bytes: usize) {
        (self.0)(bytes)
    }
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Progress(..)")
    }
}
