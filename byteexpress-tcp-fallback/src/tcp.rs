//! TCP helpers: connect or take a stream, set `TCP_NODELAY`, split into frame halves.

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, ToSocketAddrs};

use crate::{FrameConfig, FrameReader, FrameWriter};

/// Connects to `addr`, sets `TCP_NODELAY` (frames are written whole, so Nagle only adds
/// latency) and returns the two frame halves.
///
/// # Errors
/// The connect or socket-option error.
pub async fn connect(
    addr: impl ToSocketAddrs,
    cfg: FrameConfig,
) -> std::io::Result<(FrameReader<OwnedReadHalf>, FrameWriter<OwnedWriteHalf>)> {
    split(TcpStream::connect(addr).await?, cfg)
}

/// Sets `TCP_NODELAY` on an established stream (e.g. an accepted one) and splits it into frame
/// halves that can be used from different tasks.
///
/// # Errors
/// The socket-option error.
pub fn split(
    stream: TcpStream,
    cfg: FrameConfig,
) -> std::io::Result<(FrameReader<OwnedReadHalf>, FrameWriter<OwnedWriteHalf>)> {
    stream.set_nodelay(true)?;
    let (r, w) = stream.into_split();
    Ok((FrameReader::new(r, cfg), FrameWriter::new(w, cfg)))
}
