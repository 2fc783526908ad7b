//! The soft provider's control protocol: one message per seqpacket record, little-endian.
//!
//! | tag | message | fds |
//! |---|---|---|
//! | 1 | `Probe { nonce u64 }` | — |
//! | 2 | `ProbeReply { ok u8, dev_id u64 }` | — |
//! | 3 | `Connect { version u16, src_dev u64, src_qpn u32, dst_qpn u32, ring_cap u32, ring_sge u32, access u32, flags u32, stage_len u32, name_len u16, name }` | ring memfd, the recv CQ's doorbell (one end of a new `AF_UNIX` `SOCK_DGRAM` socket pair; none with bit 3), then as `flags` says: the send CQ's doorbell (bit 0: a CQ other than the recv CQ; a new pair's end), the staging region (bit 1: `stage_len` bytes, an `O_RDONLY` memfd sealed against writes), the refill doorbell (bit 2: sent only by a QP fed by an SRQ, rung when its ring runs low; a new pair's end). Bit 3 (`BELL_BACK`): sent over the channel the receiver's own `Connect` came on, the sender rings the receiver on the pair that `Connect` gave it, which also rings the sender's recv CQ |
//! | 4 | `ConnectReply { ok u8, reason_len u16, reason }` | — |
//! | 5 | `Region { id u64, offset u64, len u64 }`: `len` bytes at `offset` (page-aligned) of the memfd | memfd (the PD's arena, shared by its regions; the receiver closes it once mapped) |
//! | 6 | `MrAdd { key u32, region u64, offset u64, len u64, addr u64, access u32 }`: an MR, or a memory window bound on this QP (`key` with bit 31 set: sent on that QP's channel alone when the bind executes, [`super::mw`]) | — |
//! | 7 | `MrDel { key u32 }`: an MR deregistered, or a window invalidated (sent before the invalidating WR completes) | — |
//! | 8 | `Nudge`: a SEND of ours waits for your acknowledgement; deliver even if nobody polls | — |
//!
//! A connection starts with `Probe` (answered, then closed) or `Connect` (answered, then kept as
//! the control channel of that QP: `Region`/`MrAdd`/`MrDel` announcements follow). The peer QP
//! may later send its own `Connect` back over that channel (answered there with
//! `ConnectReply`); the channel then carries both directions' announcements.

/// Protocol version carried in `Connect` (2: receiver-side SEND copy, issue 22 item 2;
/// 3: doorbells are datagram socket pairs, one per connection, [`super::bell`]; 4: completion
/// slots carry a SEND_WITH_INV's rkey, and memory windows are announced, [`super::mw`]).
pub(crate) const VERSION: u16 = 4;

/// `Connect` flag: the send CQ's doorbell follows the recv CQ's.
pub(crate) const CONNECT_SEND_BELL: u32 = 1;
/// `Connect` flag: the staging region's memfd follows.
pub(crate) const CONNECT_STAGING: u32 = 2;
/// `Connect` flag: the refill doorbell comes last.
pub(crate) const CONNECT_REFILL: u32 = 4;
/// `Connect` flag: no recv-CQ doorbell follows the ring; the sender connects back over the
/// channel the receiver's own `Connect` came on and rings the receiver on the doorbell pair
/// that `Connect` gave it (each side keeps one end: [`super::bell`]).
pub(crate) const CONNECT_BELL_BACK: u32 = 8;
/// The flags a `Connect` may carry.
pub(crate) const CONNECT_FLAGS: u32 = 15;

/// How many fds a `Connect` with `flags` carries.
pub(crate) fn connect_fds(flags: u32) -> usize {
    1 + usize::from(flags & CONNECT_BELL_BACK == 0) + (flags & 7).count_ones() as usize
}

/// `Connect` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectMsg {
    pub src_dev: u64,
    pub src_qpn: u32,
    pub dst_qpn: u32,
    /// Receive-ring entries of the sender's QP (its max_recv_wr).
    pub ring_cap: u32,
    /// SGEs per receive WQE of the sender's QP (its max_recv_sge).
    pub ring_sge: u32,
    /// Access the sender's QP grants to the receiver (`qp_access_flags`).
    pub access: u32,
    /// Which optional fds follow (`CONNECT_*`).
    pub flags: u32,
    /// Bytes of the staging region (with `CONNECT_STAGING`).
    pub stage_len: u32,
    /// Sender device's socket name.
    pub name: Vec<u8>,
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    Probe {
        nonce: u64,
    },
    ProbeReply {
        ok: bool,
        dev_id: u64,
    },
    Connect(ConnectMsg),
    ConnectReply {
        ok: bool,
        reason: String,
    },
    Region {
        id: u64,
        offset: u64,
        len: u64,
    },
    MrAdd {
        key: u32,
        region: u64,
        offset: u64,
        len: u64,
        addr: u64,
        access: u32,
    },
    MrDel {
        key: u32,
    },
    Nudge,
}

impl Msg {
    /// How many fds must accompany this message.
    pub(crate) fn fds(&self) -> usize {
        match self {
            Msg::Connect(c) => connect_fds(c.flags),
            Msg::Region { .. } => 1,
            _ => 0,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        match self {
            Msg::Probe { nonce } => {
                v.push(1);
                v.extend_from_slice(&nonce.to_le_bytes());
            }
            Msg::ProbeReply { ok, dev_id } => {
                v.push(2);
                v.push(*ok as u8);
                v.extend_from_slice(&dev_id.to_le_bytes());
            }
            Msg::Connect(c) => {
                v.push(3);
                v.extend_from_slice(&VERSION.to_le_bytes());
                v.extend_from_slice(&c.src_dev.to_le_bytes());
                for x in [
                    c.src_qpn,
                    c.dst_qpn,
                    c.ring_cap,
                    c.ring_sge,
                    c.access,
                    c.flags,
                    c.stage_len,
                ] {
                    v.extend_from_slice(&x.to_le_bytes());
                }
                v.extend_from_slice(&(c.name.len() as u16).to_le_bytes());
                v.extend_from_slice(&c.name);
            }
            Msg::ConnectReply { ok, reason } => {
                v.push(4);
                v.push(*ok as u8);
                // At most 512 bytes, cut at a character boundary (a cut inside one would
                // reach the peer as U+FFFD).
                let mut n = reason.len().min(512);
                while !reason.is_char_boundary(n) {
                    n -= 1;
                }
                let r = &reason.as_bytes()[..n];
                v.extend_from_slice(&(r.len() as u16).to_le_bytes());
                v.extend_from_slice(r);
            }
            Msg::Region { id, offset, len } => {
                v.push(5);
                v.extend_from_slice(&id.to_le_bytes());
                v.extend_from_slice(&offset.to_le_bytes());
                v.extend_from_slice(&len.to_le_bytes());
            }
            Msg::MrAdd {
                key,
                region,
                offset,
                len,
                addr,
                access,
            } => {
                v.push(6);
                v.extend_from_slice(&key.to_le_bytes());
                for x in [region, offset, len, addr] {
                    v.extend_from_slice(&x.to_le_bytes());
                }
                v.extend_from_slice(&access.to_le_bytes());
            }
            Msg::MrDel { key } => {
                v.push(7);
                v.extend_from_slice(&key.to_le_bytes());
            }
            Msg::Nudge => v.push(8),
        }
        v
    }

    /// Parses one record; `None` for anything malformed (unknown tag, wrong length, bad
    /// version).
    pub(crate) fn decode(b: &[u8]) -> Option<Msg> {
        let mut r = Reader { b, at: 0 };
        let msg = match r.u8()? {
            1 => Msg::Probe { nonce: r.u64()? },
            2 => Msg::ProbeReply {
                ok: r.u8()? == 1,
                dev_id: r.u64()?,
            },
            3 => {
                if r.u16()? != VERSION {
                    return None;
                }
                let src_dev = r.u64()?;
                let (src_qpn, dst_qpn, ring_cap, ring_sge, access) =
                    (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
                let (flags, stage_len) = (r.u32()?, r.u32()?);
                if flags & !CONNECT_FLAGS != 0 {
                    return None;
                }
                let n = r.u16()? as usize;
                let name = r.bytes(n)?.to_vec();
                Msg::Connect(ConnectMsg {
                    src_dev,
                    src_qpn,
                    dst_qpn,
                    ring_cap,
                    ring_sge,
                    access,
                    flags,
                    stage_len,
                    name,
                })
            }
            4 => {
                let ok = r.u8()? == 1;
                let n = r.u16()? as usize;
                let reason = String::from_utf8_lossy(r.bytes(n)?).into_owned();
                Msg::ConnectReply { ok, reason }
            }
            5 => Msg::Region {
                id: r.u64()?,
                offset: r.u64()?,
                len: r.u64()?,
            },
            6 => Msg::MrAdd {
                key: r.u32()?,
                region: r.u64()?,
                offset: r.u64()?,
                len: r.u64()?,
                addr: r.u64()?,
                access: r.u32()?,
            },
            7 => Msg::MrDel { key: r.u32()? },
            8 => Msg::Nudge,
            _ => return None,
        };
        (r.at == b.len()).then_some(msg)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Msg> {
        vec![
            Msg::Probe { nonce: 7 },
            Msg::ProbeReply {
                ok: true,
                dev_id: 9,
            },
            Msg::Connect(ConnectMsg {
                src_dev: 1,
                src_qpn: 2,
                dst_qpn: 3,
                ring_cap: 4,
                ring_sge: 5,
                access: 6,
                flags: CONNECT_SEND_BELL | CONNECT_STAGING,
                stage_len: 65536,
                name: b"bx-soft-1-2".to_vec(),
            }),
            Msg::ConnectReply {
                ok: false,
                reason: "no such QP".into(),
            },
            Msg::Region {
                id: 1,
                offset: 8192,
                len: 4096,
            },
            Msg::MrAdd {
                key: 1,
                region: 2,
                offset: 3,
                len: 4,
                addr: 5,
                access: 7,
            },
            Msg::MrDel { key: 11 },
            Msg::Nudge,
        ]
    }

    #[test]
    fn messages_round_trip_and_truncations_are_rejected() {
        for m in all() {
            let b = m.encode();
            assert_eq!(Msg::decode(&b), Some(m.clone()));
            for cut in 0..b.len() {
                assert_eq!(Msg::decode(&b[..cut]), None, "{m:?} cut at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert_eq!(Msg::decode(&long), None);
        }
        assert_eq!(Msg::decode(&[99]), None);
    }

    #[test]
    fn a_connect_reply_reason_is_cut_at_a_char_boundary_and_re_encodes_the_same() {
        // 511 ASCII bytes then a 2-byte character: 512 bytes would split it.
        let reason = format!("{}é", "a".repeat(511));
        let m = Msg::ConnectReply { ok: false, reason };
        let back = Msg::decode(&m.encode()).expect("decodes");
        assert_eq!(
            back,
            Msg::ConnectReply {
                ok: false,
                reason: "a".repeat(511)
            }
        );
        // The fuzz input that found it (soft_msg target): a peer's long, partly invalid reason
        // re-encoded and decoded again must re-encode to the same bytes.
        let found = include_bytes!("../../testdata/soft_msg_connect_reply_cut_mid_char.bin");
        let once = Msg::decode(found).expect("the input decodes").encode();
        let twice = Msg::decode(&once).expect("its encoding decodes").encode();
        assert_eq!(once, twice);
    }
}
