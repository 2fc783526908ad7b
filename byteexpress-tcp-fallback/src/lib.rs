//! Length-prefixed message frames over tokio TCP: the ByteExpress fallback transport.
//!
//! # Wire format
//! A frame is a 4-byte big-endian unsigned length `N` followed by `N` bytes of opaque payload.
//! `N = 0` is a valid, empty frame. `N = 0xFFFF_FFFF` ([`ESCAPE`]) is an escape: the next 8
//! bytes are the real length as a big-endian `u64`, at least `0xFFFF_FFFF` (a smaller value
//! is [`FrameError::BadEscape`]), then the payload. A payload shorter than `0xFFFF_FFFF`
//! bytes is always sent with the 4-byte length, so such frames are unchanged by the escape. The payload (the `byteexpress-rpc` header, multiplexing and
//! body) is not interpreted here.
//!
//! # Limits
//! Each side has a maximum payload size ([`FrameConfig::max_frame`], default
//! [`DEFAULT_MAX_FRAME`] = 16 MiB + 64 KiB). A received length above it is refused with
//! [`FrameError::TooLarge`] as soon as the header bytes (4, or 12 with the escape) are read,
//! before any memory is reserved for the payload. The stream is then out of step: the connection owner sends its own
//! error frame (defined by the RPC layer) with [`FrameWriter::close_with_frame`] and drops the
//! connection.
//!
//! # Halves
//! [`FrameReader`] and [`FrameWriter`] wrap any `AsyncRead` / `AsyncWrite`, so a TCP stream's
//! owned halves ([`connect`], [`split`]) can be driven from different tasks.
#![forbid(unsafe_code)]

mod config;
mod error;
mod progress;
mod reader;
mod tcp;
mod writer;

pub use config::{DEFAULT_MAX_FRAME, ESCAPE, FrameConfig, HEADER_LEN, LONG_HEADER_LEN};
pub use error::FrameError;
pub use progress::Progress;
pub use reader::{Frame, FrameReader};
pub use tcp::{connect, split};
pub use writer::FrameWriter;
