//! [`Config::validate`]: the size settings checked before a client or server uses them.

use crate::Config;
use crate::wire::header::HEADER_LEN;

/// A size setting of a [`Config`] that cannot work. Reported by [`Config::validate`]; a client
/// gets it as INVALID_ARGUMENT from `Client::connect`, a server as an
/// `io::ErrorKind::InvalidInput` from `serve`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `max_message` must hold a header and fit the header's 32-bit lengths (the wire header's
    /// `meta_len`/`body_len` are u32; gRPC's length prefix is 4 bytes too).
    #[error(
        "max_message {0} bytes is not in 41..=4294967295 (4 GiB - 1, the 32-bit lengths of the wire header)"
    )]
    MaxMessage(u64),
    /// `recv_buf_size` must hold a header and fit the 32-bit length of HELLO.
    #[error("recv_buf_size {0} bytes is not in 41..=4294967295")]
    RecvBufSize(u64),
    /// `max_chunk` must leave room after the 40-byte header.
    #[error("max_chunk {0} bytes leaves no room after the 40-byte header")]
    MaxChunk(u64),
    /// `grant` and `max_send_wr` must be at least 1.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// `stream_window` must be in 1..=2^62 bytes.
    #[error("stream_window {0} bytes is not in 1..=2^62")]
    StreamWindow(u64),
}

impl Config {
    /// Checks the size settings: `max_message` in 41..=4 GiB − 1 (a larger value would be
    /// truncated in the header's u32 lengths), `recv_buf_size` in 41..=4 GiB − 1, `max_chunk`
    /// above 40, `grant`, `max_send_wr`, `memory_budget` and `max_connections` at least 1,
    /// `stream_window` in 1..=2^62. Errors: the first setting that fails ([`ConfigError`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let h = HEADER_LEN as u64;
        let m = self.max_message as u64;
        if m <= h || m > u32::MAX as u64 {
            return Err(ConfigError::MaxMessage(m));
        }
        let r = self.recv_buf_size as u64;
        if r <= h || r > u32::MAX as u64 {
            return Err(ConfigError::RecvBufSize(r));
        }
        if self.max_chunk as u64 <= h {
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
    fn max_message_of_4_gib_or_more_is_refused_not_truncated() {
        for bad in [40usize, 1 << 32, (1 << 32) + 100] {
            let cfg = Config {
                max_message: bad,
                ..Config::default()
            };
            assert_eq!(cfg.validate(), Err(ConfigError::MaxMessage(bad as u64)));
        }
        let cfg = Config {
            max_message: u32::MAX as usize,
            ..Config::default()
        };
        assert_eq!(cfg.validate(), Ok(()));
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
