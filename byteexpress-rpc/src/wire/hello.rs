//! Link set-up messages, one per TCP frame after [`super::CONN_MAGIC`].
//!
//! ```text
//! client                                   server
//!   HELLO {version, transport, nonce, stream_window, devices}  →
//!        ← HELLO_ACK {version, max_concurrent_calls, stream_window, devices}   (server armed `nonce`)
//!   (client probes: local device × server device, in order; first reachable pair wins)
//!   SELECT_RDMA {server device, grant, recv_buf, endpoint}  →    or  SELECT_TCP  →
//!                        ← RDMA_ACCEPT {grant, recv_buf, endpoint}  (or REFUSE {reason})
//! ```
//! Encodings (integers little-endian; `bytes16` = u16 length + bytes):
//!
//! | message | type | fields |
//! |---|---|---|
//! | HELLO | 1 | version u16, transport u8 (0 auto, 1 rdma, 2 tcp), nonce u64, stream_window u64 (1..=u64::MAX), count u8, count × bytes16 device info |
//! | HELLO_ACK | 2 | version u16, max_concurrent_calls u32 (1..=u32::MAX), stream_window u64 (1..=u64::MAX), count u8, count × bytes16 device info |
//! | SELECT_RDMA | 3 | server device index u8, grant u32, recv_buf u32, bytes16 endpoint |
//! | SELECT_TCP | 4 | — |
//! | RDMA_ACCEPT | 5 | grant u32, recv_buf u32, bytes16 endpoint |
//! | REFUSE | 6 | bytes16 reason (UTF-8) |
//!
//! `grant` is the credit grant each side configured; the link uses the smaller of the two in
//! both directions (each side posts `grant + 1` receives: `grant` for data, one for credit
//! updates). `recv_buf` is the receive-buffer size in bytes, the largest single SEND (a whole
//! message or one chunk of a larger one) either side may post: the client's, which the server
//! accepts up to its own configured size (echoing it in RDMA_ACCEPT, where the client requires
//! the same value) or refuses. Decoding checks `grant` within 1..=[`MAX_GRANT`] and `recv_buf`
//! within 104 (a header and 64 bytes)..=[`MAX_RECV_BUF`], at most 16 devices, no truncation and
//! no trailing bytes; HELLO_ACK's `max_concurrent_calls` is not 0; neither `stream_window` is 0.
//!
//! `stream_window` is the sender's own per-stream receive window in bytes
//! (`Config::stream_window`), announced as HTTP/2 announces SETTINGS_INITIAL_WINDOW_SIZE (RFC
//! 9113 §6.5.2, §6.9.2): on every stream of the link, each side may have at most the *peer's*
//! announced window sent and not granted back, and grants its own. Values above
//! [`MAX_STREAM_WINDOW`] (2^62) are legal and used as 2^62.
//!
//! What each side does with them: the server does not act on HELLO's transport byte (it only
//! tells the server's logs what the client asked for); the client does not check HELLO_ACK's
//! version; a client pinned to RDMA that finds no reachable pair sends REFUSE; a REFUSE reason
//! is decoded lossily (invalid UTF-8 is replaced, not refused). `DESIGN.md` (section 4.8)
//! documents every message byte by byte; change both together.

use super::{WireError, err};

/// Set-up protocol version (2: HELLO and HELLO_ACK carry `stream_window`).
pub const HELLO_VERSION: u16 = 2;
/// Largest per-stream window a side uses, 2^62 bytes (the bound `Config::stream_window` is
/// checked against): a peer announcing more is held to this.
pub const MAX_STREAM_WINDOW: u64 = 1 << 62;
/// Most credits a peer may grant (bounds the receive buffers we would post for it).
pub const MAX_GRANT: u32 = 4096;
/// Largest receive buffer a peer may announce (16 MiB).
pub const MAX_RECV_BUF: u32 = 16 << 20;
const MAX_DEVICES: usize = 16;

/// What the client asks for (`BX_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportPref {
    /// RDMA when a device reaches the peer, else TCP.
    Auto,
    /// RDMA or fail.
    Rdma,
    /// TCP only.
    Tcp,
}

/// A set-up message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Client's opening.
    Hello {
        /// Set-up protocol version.
        version: u16,
        /// Transport asked for.
        pref: TransportPref,
        /// Proof for the devices' reachability probes.
        nonce: u64,
        /// The client's per-stream receive window in bytes (its `Config::stream_window`), as
        /// HTTP/2's SETTINGS_INITIAL_WINDOW_SIZE (RFC 9113 §6.5.2): the most the server may
        /// have sent on one stream and not granted back. Not 0; a value above
        /// [`MAX_STREAM_WINDOW`] is legal and used as that bound.
        stream_window: u64,
        /// Serialised `DeviceInfo` of each client device, in preference order.
        devices: Vec<Vec<u8>>,
    },
    /// Server's answer.
    HelloAck {
        /// Set-up protocol version.
        version: u16,
        /// Most calls the server runs at once on this link, 1..=u32::MAX (its
        /// `Config::max_concurrent_calls`), as HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS: the
        /// client queues calls beyond it; a call over it gets RESOURCE_EXHAUSTED.
        max_concurrent_calls: u32,
        /// The server's per-stream receive window in bytes (its `Config::stream_window`), as
        /// HTTP/2's SETTINGS_INITIAL_WINDOW_SIZE: the most the client may have sent on one
        /// stream and not granted back. Not 0; a value above [`MAX_STREAM_WINDOW`] is legal
        /// and used as that bound.
        stream_window: u64,
        /// Serialised `DeviceInfo` of each local device of the server (none when the server is
        /// pinned to TCP); the client probes which of them it reaches.
        devices: Vec<Vec<u8>>,
    },
    /// Client chose RDMA through server device `device`.
    SelectRdma {
        /// Index into HELLO_ACK's list.
        device: u8,
        /// Client's grant to the server.
        grant: u32,
        /// Client's receive-buffer size.
        recv_buf: u32,
        /// Client QP's serialised `Endpoint`.
        endpoint: Vec<u8>,
    },
    /// Client chose TCP.
    SelectTcp,
    /// Server's QP is connected.
    RdmaAccept {
        /// Server's grant to the client.
        grant: u32,
        /// The client's receive-buffer size, echoed: the size the link uses (the client
        /// refuses any other value).
        recv_buf: u32,
        /// Server QP's serialised `Endpoint`.
        endpoint: Vec<u8>,
    },
    /// Set-up refused.
    Refuse {
        /// Why.
        reason: String,
    },
}

impl Hello {
    /// Serialises the message.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        let bytes16 = |v: &mut Vec<u8>, b: &[u8]| {
            let b = &b[..b.len().min(u16::MAX as usize)];
            v.extend_from_slice(&(b.len() as u16).to_le_bytes());
            v.extend_from_slice(b);
        };
        match self {
            Hello::Hello {
                version,
                pref,
                nonce,
                stream_window,
                devices,
            } => {
                v.push(1);
                v.extend_from_slice(&version.to_le_bytes());
                v.push(match pref {
                    TransportPref::Auto => 0,
                    TransportPref::Rdma => 1,
                    TransportPref::Tcp => 2,
                });
                v.extend_from_slice(&nonce.to_le_bytes());
                v.extend_from_slice(&stream_window.to_le_bytes());
                v.push(devices.len().min(MAX_DEVICES) as u8);
                devices
                    .iter()
                    .take(MAX_DEVICES)
                    .for_each(|d| bytes16(&mut v, d));
            }
            Hello::HelloAck {
                version,
                max_concurrent_calls,
                stream_window,
                devices,
            } => {
                v.push(2);
                v.extend_from_slice(&version.to_le_bytes());
                v.extend_from_slice(&max_concurrent_calls.to_le_bytes());
                v.extend_from_slice(&stream_window.to_le_bytes());
                v.push(devices.len().min(MAX_DEVICES) as u8);
                devices
                    .iter()
                    .take(MAX_DEVICES)
                    .for_each(|d| bytes16(&mut v, d));
            }
            Hello::SelectRdma {
                device,
                grant,
                recv_buf,
                endpoint,
            } => {
                v.push(3);
                v.push(*device);
                v.extend_from_slice(&grant.to_le_bytes());
                v.extend_from_slice(&recv_buf.to_le_bytes());
                bytes16(&mut v, endpoint);
            }
            Hello::SelectTcp => v.push(4),
            Hello::RdmaAccept {
                grant,
                recv_buf,
                endpoint,
            } => {
                v.push(5);
                v.extend_from_slice(&grant.to_le_bytes());
                v.extend_from_slice(&recv_buf.to_le_bytes());
                bytes16(&mut v, endpoint);
            }
            Hello::Refuse { reason } => {
                v.push(6);
                bytes16(&mut v, reason.as_bytes());
            }
        }
        v
    }

    /// Parses a set-up message, checking every length and limit.
    pub fn decode(b: &[u8]) -> Result<Hello, WireError> {
        let mut r = Reader { b, pos: 0 };
        let msg = match r.u8()? {
            1 => {
                let version = r.u16()?;
                let pref = match r.u8()? {
                    0 => TransportPref::Auto,
                    1 => TransportPref::Rdma,
                    2 => TransportPref::Tcp,
                    p => return err(format!("unknown transport preference {p}")),
                };
                let nonce = r.u64()?;
                let stream_window = r.stream_window()?;
                let devices = r.devices()?;
                Hello::Hello {
                    version,
                    pref,
                    nonce,
                    stream_window,
                    devices,
                }
            }
            2 => {
                let version = r.u16()?;
                let max_concurrent_calls = r.u32()?;
                if max_concurrent_calls == 0 {
                    return err("HELLO_ACK with max_concurrent_calls 0");
                }
                Hello::HelloAck {
                    version,
                    max_concurrent_calls,
                    stream_window: r.stream_window()?,
                    devices: r.devices()?,
                }
            }
            3 => {
                let device = r.u8()?;
                let (grant, recv_buf) = r.grant()?;
                Hello::SelectRdma {
                    device,
                    grant,
                    recv_buf,
                    endpoint: r.bytes16()?.to_vec(),
                }
            }
            4 => Hello::SelectTcp,
            5 => {
                let (grant, recv_buf) = r.grant()?;
                Hello::RdmaAccept {
                    grant,
                    recv_buf,
                    endpoint: r.bytes16()?.to_vec(),
                }
            }
            6 => Hello::Refuse {
                reason: String::from_utf8_lossy(r.bytes16()?).into_owned(),
            },
            t => return err(format!("unknown set-up message type {t}")),
        };
        if r.pos != b.len() {
            return err("trailing bytes after set-up message");
        }
        Ok(msg)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.b.len() - self.pos < n {
            return err("set-up message truncated");
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn stream_window(&mut self) -> Result<u64, WireError> {
        match self.u64()? {
            0 => err("stream_window 0"),
            w => Ok(w),
        }
    }
    fn bytes16(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    fn devices(&mut self) -> Result<Vec<Vec<u8>>, WireError> {
        let n = self.u8()? as usize;
        if n > MAX_DEVICES {
            return err(format!("{n} devices, more than {MAX_DEVICES}"));
        }
        (0..n).map(|_| self.bytes16().map(<[u8]>::to_vec)).collect()
    }
    fn grant(&mut self) -> Result<(u32, u32), WireError> {
        let (grant, recv_buf) = (self.u32()?, self.u32()?);
        if grant == 0 || grant > MAX_GRANT {
            return err(format!("grant {grant} outside 1..={MAX_GRANT}"));
        }
        if !(crate::wire::header::HEADER_LEN as u32 + 64..=MAX_RECV_BUF).contains(&recv_buf) {
            return err(format!("receive buffer of {recv_buf} bytes"));
        }
        Ok((grant, recv_buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setup_message_round_trips() {
        let msgs = [
            Hello::Hello {
                version: 1,
                pref: TransportPref::Rdma,
                nonce: 42,
                stream_window: u64::MAX,
                devices: vec![vec![1, 2], vec![]],
            },
            Hello::HelloAck {
                version: 1,
                max_concurrent_calls: 100,
                stream_window: 64 << 10,
                devices: vec![vec![3]],
            },
            Hello::SelectRdma {
                device: 0,
                grant: 8,
                recv_buf: 65536,
                endpoint: vec![9; 40],
            },
            Hello::SelectTcp,
            Hello::RdmaAccept {
                grant: 16,
                recv_buf: 4096,
                endpoint: vec![7; 33],
            },
            Hello::Refuse {
                reason: "no".into(),
            },
        ];
        for m in msgs {
            let b = m.encode();
            assert_eq!(Hello::decode(&b).unwrap(), m);
            for cut in 0..b.len() {
                assert!(Hello::decode(&b[..cut]).is_err());
            }
        }
    }

    #[test]
    fn setup_rejects_grant_and_buffer_outside_limits() {
        for (grant, buf) in [
            (0, 65536),
            (MAX_GRANT + 1, 65536),
            (8, 10),
            (8, MAX_RECV_BUF + 1),
        ] {
            let b = Hello::RdmaAccept {
                grant,
                recv_buf: buf,
                endpoint: vec![],
            }
            .encode();
            assert!(Hello::decode(&b).is_err(), "grant {grant} buf {buf}");
        }
    }

    #[test]
    fn hello_and_hello_ack_carry_the_stream_window_and_refuse_0() {
        let hello = |w| Hello::Hello {
            version: HELLO_VERSION,
            pref: TransportPref::Auto,
            nonce: 7,
            stream_window: w,
            devices: vec![],
        };
        let ack = |w| Hello::HelloAck {
            version: HELLO_VERSION,
            max_concurrent_calls: 1,
            stream_window: w,
            devices: vec![],
        };
        for w in [1, 64 << 10, 4 << 20, MAX_STREAM_WINDOW + 1, u64::MAX] {
            for m in [hello(w), ack(w)] {
                let b = m.encode();
                assert_eq!(Hello::decode(&b).unwrap(), m);
            }
        }
        // byte positions: HELLO type 1, version 2, transport 1, nonce 8, then the window
        let b = hello(0x0102_0304_0506_0708).encode();
        assert_eq!(&b[12..20], &0x0102_0304_0506_0708u64.to_le_bytes());
        // HELLO_ACK type 1, version 2, max_concurrent_calls 4, then the window
        let b = ack(0x0102_0304_0506_0708).encode();
        assert_eq!(&b[7..15], &0x0102_0304_0506_0708u64.to_le_bytes());
        for m in [hello(0), ack(0)] {
            let e = Hello::decode(&m.encode()).unwrap_err();
            assert!(e.to_string().contains("stream_window 0"), "{e}");
        }
        // a HELLO cut inside its window (a version-1 HELLO has none) is refused
        let b = hello(4 << 20).encode();
        for cut in 12..20 {
            assert!(Hello::decode(&b[..cut]).is_err());
        }
        let mut v1 = b[..12].to_vec();
        v1.push(0); // no devices: a version-1 HELLO
        assert!(
            Hello::decode(&v1).is_err(),
            "version-1 HELLO without a window"
        );
    }
}
