//! Out-of-band connection data, exchanged by upper layers over their own control channel.
//!
//! Both are opaque to upper layers: they serialise them with [`DeviceInfo::to_bytes`] /
//! [`Endpoint::to_bytes`] and hand the peer's bytes back to this crate.

use crate::{Error, Result};

/// What a device tells a peer about itself so the peer can ask "can I reach it?"
/// (for ibverbs: GID, LID, port MTU; for the soft provider: its Unix socket name and host id).
/// Encoding: `provider: u8, len: u16 LE, bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub(crate) provider: u8,
    pub(crate) bytes: Vec<u8>,
}

/// What a QP tells its peer to connect to it: QPN, PSN, LID, GID, MTU (as rdma-core's
/// `rc_pingpong` exchanges), plus a provider address (the soft device's socket name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Provider tag, so a soft endpoint is never given to an ibverbs QP.
    pub(crate) provider: u8,
    /// QP number (24 bits used).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits used).
    pub psn: u32,
    /// Port LID (InfiniBand); 0 on RoCE.
    pub lid: u16,
    /// GID (RoCE: IPv4-mapped IPv6 address).
    pub gid: [u8; 16],
    /// Active MTU in bytes.
    pub mtu: u32,
    /// Provider-specific address bytes.
    pub(crate) addr: Vec<u8>,
}

/// One valid entry of a port's GID table (`ibv_query_gid_table(3)`), for display and diagnosis
/// (`bx devices`); the GID a QP uses is chosen by the device, see [`crate::Context::gid_index`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidInfo {
    /// Index in the port's GID table (what rdma-core tools take as `-g`).
    pub index: u32,
    /// The GID, network byte order (RoCE: an IPv6 or IPv4-mapped IPv6 address).
    pub gid: [u8; 16],
    /// `enum ibv_gid_type` when the library reports it: 0 InfiniBand, 1 RoCE v1, 2 RoCE v2.
    pub gid_type: Option<u32>,
}

const MAX_ADDR: usize = 1024;

impl DeviceInfo {
    /// Wire form: `provider u8 | len u16 LE | bytes`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(3 + self.bytes.len());
        v.push(self.provider);
        v.extend_from_slice(&(self.bytes.len() as u16).to_le_bytes());
        v.extend_from_slice(&self.bytes);
        v
    }

    /// Parses [`DeviceInfo::to_bytes`]; rejects truncated or oversized input.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() < 3 {
            return Err(Error::Peer("device info truncated".into()));
        }
        let len = u16::from_le_bytes([b[1], b[2]]) as usize;
        if len > MAX_ADDR || b.len() != 3 + len {
            return Err(Error::Peer("device info length mismatch".into()));
        }
        Ok(DeviceInfo {
            provider: b[0],
            bytes: b[3..].to_vec(),
        })
    }
}

impl Endpoint {
    /// Wire form: `provider u8 | qpn u32 | psn u32 | lid u16 | gid [16] | mtu u32 | len u16 | addr`,
    /// integers little-endian (33 bytes + addr).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(33 + self.addr.len());
        v.push(self.provider);
        v.extend_from_slice(&self.qpn.to_le_bytes());
        v.extend_from_slice(&self.psn.to_le_bytes());
        v.extend_from_slice(&self.lid.to_le_bytes());
        v.extend_from_slice(&self.gid);
        v.extend_from_slice(&self.mtu.to_le_bytes());
        v.extend_from_slice(&(self.addr.len() as u16).to_le_bytes());
        v.extend_from_slice(&self.addr);
        v
    }

    /// Parses [`Endpoint::to_bytes`]; rejects truncated or oversized input.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() < 33 {
            return Err(Error::Peer("endpoint truncated".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let len = u16::from_le_bytes([b[31], b[32]]) as usize;
        if len > MAX_ADDR || b.len() != 33 + len {
            return Err(Error::Peer("endpoint length mismatch".into()));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[11..27]);
        Ok(Endpoint {
            provider: b[0],
            qpn: u32_at(1),
            psn: u32_at(5),
            lid: u16::from_le_bytes([b[9], b[10]]),
            gid,
            mtu: u32_at(27),
            addr: b[33..].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trips_and_rejects_truncation() {
        let e = Endpoint {
            provider: 2,
            qpn: 0x123456,
            psn: 77,
            lid: 3,
            gid: [9; 16],
            mtu: 4096,
            addr: b"abc".to_vec(),
        };
        let b = e.to_bytes();
        assert_eq!(Endpoint::from_bytes(&b).unwrap(), e);
        for cut in 0..b.len() {
            assert!(Endpoint::from_bytes(&b[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn device_info_rejects_length_lies() {
        let d = DeviceInfo {
            provider: 1,
            bytes: vec![1, 2, 3],
        };
        let mut b = d.to_bytes();
        assert_eq!(DeviceInfo::from_bytes(&b).unwrap(), d);
        b[1] = 200;
        assert!(DeviceInfo::from_bytes(&b).is_err());
    }
}
