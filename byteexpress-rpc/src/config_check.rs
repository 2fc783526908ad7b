//! [`Config::validate`]: the size settings checked before a client or server uses them.

use crate::Config;
use crate::wire::header::{HEADER_LEN, LONG_HEADER_LEN};

/// The largest `max_message` accepted, 2^62 bytes: bodies longer than `u32::MAX` travel with a
/// 64-bit length ([`crate::wire::header::FLAG_LONG`], the TCP frame's escape), and 2^62 keeps
/// every sum of lengths far from overflowing a u64 (the bound of `stream_window` too).
pub const MAX_MESSAGE_LIMIT: u64 = 1 << 62;

/// A size setting of a [`Config`] that cannot work. Reported by [`Config::validate`]; a client
/// gets it as INVALID_ARGUMENT from `Client::connect`, a server as an
/// `io::ErrorKind::InvalidInput` from `serve`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `max_message` must hold a header and be at most [`MAX_MESSAGE_LIMIT`] (2^62 bytes).
    #[error("max_message {0} bytes is not in 41..=2^62")]
    MaxMessage(u64),
    /// `recv_buf_size` must hold a header and fit the 32-bit length of HELLO.
    #[error("recv_buf_size {0} bytes is not in 41..=4294967295")]
    RecvBufSize(u64),
    /// `max_chunk` must leave room after the 48-byte header of a long message.
    #[error("max_chunk {0} bytes leaves no room after the 48-byte long header")]
    MaxChunk(u64),
    /// `grant` and `max_send_wr` must be at least 1.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// `stream_window` must be in 1..=2^62 bytes.
    #[error("stream_window {0} bytes is not in 1..=2^62")]
    StreamWindow(u64),
}

impl Config {
    /// Checks the size settings: `max_message` in 41..=2^62 ([`MAX_MESSAGE_LIMIT`]; bodies
    /// over 4 GiB − 1 use the header's 64-bit length), `recv_buf_size` in 41..=4 GiB − 1 (the
    /// 32-bit `recv_buf` of set-up), `max_chunk` above 48 (the long header), `grant`, `max_send_wr`, `memory_budget` and `max_connections` at least 1,
    /// `stream_window` in 1..=2^62. Errors: the first setting that fails ([`ConfigError`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let h = HEADER_LEN as u64;
        let m = self.max_message as u64;
        if m <= h || m > MAX_MESSAGE_LIMIT {
            return Err(ConfigError::MaxMessage(m));
        }
        let r = self.recv_buf_size as u64;
        if r <= h || r > u32::MAX as u64 {
            return Err(ConfigError::RecvBufSize(r));
        }
        if self.max_chunk <= LONG_HEADER_LEN {
            return Err(ConfigError::MaxChunk(self.max_chunk as u64));
        }
        for (name, v) in [
            ("grant", self.grant as u64),
            ("max_send_wr", self.max_send_wr as u64),
            ("memory_budget", self.memory_budget as u64),
            ("max_connections", self.max_connections as u64),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.stream_window == 0 || self.stream_window > 1 << 62 {
            return Err(ConfigError::StreamWindow(self.stream_window));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Config::default().validate(), Ok(()));
    }

    #[test]
    fn max_message_above_2_pow_62_is_refused_and_4_gib_or_more_is_accepted() {
        for bad in [40usize, (1 << 62) + 1, usize::MAX] {
            let cfg = Config {
                max_message: bad,
                ..Config::default()
            };
            assert_eq!(cfg.validate(), Err(ConfigError::MaxMessage(bad as u64)));
        }
        for good in [u32::MAX as usize, 1 << 32, (1 << 32) + 100, 1 << 62] {
            let cfg = Config {
                max_message: good,
                ..Config::default()
            };
            assert_eq!(cfg.validate(), Ok(()), "{good}");
        }
    }

    #[test]
    fn max_chunk_must_leave_room_after_the_long_header() {
        for (chunk, ok) in [(48, false), (49, true)] {
            let cfg = Config {
                max_chunk: chunk,
                ..Config::default()
            };
            assert_eq!(cfg.validate().is_ok(), ok, "{chunk}");
        }
    }

    #[test]
    fn every_size_setting_is_checked() {
        let d = Config::default;
        let cases = [
            Config {
                recv_buf_size: 40,
                ..d()
            },
            Config {
                max_chunk: 40,
                ..d()
            },
            Config { grant: 0, ..d() },
            Config {
                max_send_wr: 0,
                ..d()
            },
            Config {
                memory_budget: 0,
                ..d()
            },
            Config {
                max_connections: 0,
                ..d()
            },
            Config {
                stream_window: 0,
                ..d()
            },
        ];
        for c in cases {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }
}
