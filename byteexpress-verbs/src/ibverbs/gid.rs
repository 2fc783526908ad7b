//! Choosing the source GID of a port (`ibv_query_gid_table(3)`), the part of connection
//! set-up that differs between InfiniBand and RoCE.
//!
//! On RoCE every IP address of the netdev appears as GIDs, one per RoCE version; rdma-core's
//! examples take an index from the user (`rc_pingpong -g`). Here: RoCE v2 with an IPv4-mapped
//! address first (routable, and what `rdma_cm` picks for an IPv4 peer), then RoCE v2 with any
//! non-link-local address, then any RoCE v2 GID, then the lowest index; environment variable
//! `BX_GID_INDEX` overrides the choice. On InfiniBand the lowest valid index (normally 0).

use crate::{Error, Result};

/// `IBV_GID_TYPE_ROCE_V2` of `enum ibv_gid_type`.
pub(crate) const GID_TYPE_ROCE_V2: u32 = 2;
/// `IBV_LINK_LAYER_ETHERNET` (verbs.h).
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// Environment variable that forces the GID index.
pub(crate) const GID_INDEX_ENV: &str = "BX_GID_INDEX";

/// One valid (non-zero) GID of the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GidEntry {
    /// Index in the port's GID table (`sgid_index` of `ibv_global_route`).
    pub index: u32,
    /// The GID, network byte order.
    pub gid: [u8; 16],
    /// `enum ibv_gid_type` when the library reports it (`None` from plain `ibv_query_gid`).
    pub gid_type: Option<u32>,
}

/// `::ffff:a.b.c.d`.
pub(crate) fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// `fe80::/10`.
fn is_link_local(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && gid[1] & 0xc0 == 0x80
}

/// Preference rank on Ethernet (RoCE): lower is better.
fn roce_rank(e: &GidEntry) -> u8 {
    let v2 = e.gid_type == Some(GID_TYPE_ROCE_V2);
    match (v2, is_ipv4_mapped(&e.gid), is_link_local(&e.gid)) {
        (true, true, _) => 0,
        (true, false, false) => 1,
        (true, false, true) => 2,
        (false, true, _) => 3,
        _ => 4,
    }
}

/// [`select`] on the port of `device`; an invalid [`GID_INDEX_ENV`] (not a number, out of
/// range, an empty slot) is `InvalidArgument` naming the index, the device and the port's
/// valid entries, so the user can pick one (`bx devices` lists them too).
pub(crate) fn select_on(
    device: &str,
    entries: &[GidEntry],
    link_layer: u8,
    forced: Option<&str>,
) -> Result<GidEntry> {
    select(entries, link_layer, forced).map_err(|e| match e {
        Error::InvalidArgument(why) => Error::InvalidArgument(format!(
            "{why} on {device}; valid entries: {}",
            valid_list(entries)
        )),
        other => other,
    })
}

/// `0 (fe80::5054:ff:fe12:3456, RoCE v2), 1 (::ffff:10.0.2.15, RoCE v2)`, or `none`.
fn valid_list(entries: &[GidEntry]) -> String {
    if entries.is_empty() {
        return "none".into();
    }
    let kind = |t: Option<u32>| match t {
        Some(0) => ", IB",
        Some(1) => ", RoCE v1",
        Some(2) => ", RoCE v2",
        _ => "",
    };
    entries
        .iter()
        .map(|e| {
            format!(
                "{} ({}{})",
                e.index,
                std::net::Ipv6Addr::from(e.gid),
                kind(e.gid_type)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Picks the GID to use from the port's valid GIDs. `forced` is the value of
/// [`GID_INDEX_ENV`], if set: it must name one of `entries`, else `InvalidArgument`.
/// No valid GID at all is `NoDevice` on Ethernet (RoCE needs one) and index 0 on InfiniBand.
pub(crate) fn select(
    entries: &[GidEntry],
    link_layer: u8,
    forced: Option<&str>,
) -> Result<GidEntry> {
    if let Some(v) = forced {
        let idx: u32 = v.trim().parse().map_err(|_| {
            Error::InvalidArgument(format!("{GID_INDEX_ENV}={v:?} is not a GID index"))
        })?;
        return entries
            .iter()
            .find(|e| e.index == idx)
            .copied()
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{GID_INDEX_ENV}={idx}: no valid GID at that index"))
            });
    }
    let best = if link_layer == LINK_LAYER_ETHERNET {
        entries.iter().min_by_key(|e| (roce_rank(e), e.index))
    } else {
        entries.iter().min_by_key(|e| e.index)
    };
    match best {
        Some(e) => Ok(*e),
        None if link_layer == LINK_LAYER_ETHERNET => Err(Error::NoDevice(
            "RoCE port has no valid GID (no IP address on its netdev?)".into(),
        )),
        None => Ok(GidEntry {
            index: 0,
            gid: [0; 16],
            gid_type: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(index: u32, gid: [u8; 16], t: Option<u32>) -> GidEntry {
        GidEntry {
            index,
            gid,
            gid_type: t,
        }
    }

    const LL: [u8; 16] = [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56,
    ];
    const V4: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];
    const SITE: [u8; 16] = [
        0xfe, 0xc0, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56,
    ];

    /// The rxe VM's table: 0 link-local, 1 IPv4-mapped, 2 SLAAC, all RoCE v2.
    #[test]
    fn roce_prefers_the_ipv4_mapped_v2_gid() {
        let t = [e(0, LL, Some(2)), e(1, V4, Some(2)), e(2, SITE, Some(2))];
        assert_eq!(select(&t, LINK_LAYER_ETHERNET, None).unwrap().index, 1);
        // RoCE v1 duplicates (mlx5 lists each address twice) lose to v2.
        let t = [e(0, V4, Some(1)), e(1, LL, Some(2)), e(2, V4, Some(2))];
        assert_eq!(select(&t, LINK_LAYER_ETHERNET, None).unwrap().index, 2);
        // Without an IPv4 address a routable v2 GID beats the link-local one.
        let t = [e(0, LL, Some(2)), e(3, SITE, Some(2))];
        assert_eq!(select(&t, LINK_LAYER_ETHERNET, None).unwrap().index, 3);
    }

    #[test]
    fn infiniband_takes_the_lowest_index() {
        let t = [e(2, V4, None), e(0, LL, None)];
        assert_eq!(select(&t, 1, None).unwrap().index, 0);
        assert_eq!(select(&[], 1, None).unwrap().index, 0);
    }

    #[test]
    fn the_environment_overrides_and_is_validated() {
        let t = [e(0, LL, Some(2)), e(1, V4, Some(2))];
        assert_eq!(select(&t, LINK_LAYER_ETHERNET, Some("0")).unwrap().index, 0);
        for bad in ["7", "x", "-1", ""] {
            let err = select(&t, LINK_LAYER_ETHERNET, Some(bad)).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad}: {err:?}");
        }
    }

    #[test]
    fn an_invalid_index_names_itself_the_device_and_the_valid_entries() {
        let t = [e(0, LL, Some(2)), e(1, V4, Some(2))];
        let err = select_on("rxe0", &t, LINK_LAYER_ETHERNET, Some("99")).unwrap_err();
        let msg = err.to_string();
        for part in [
            "BX_GID_INDEX=99",
            "rxe0",
            "0 (fe80::",
            "1 (::ffff:10.0.2.15, RoCE v2)",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg:?}");
        }
        let msg = select_on("rxe0", &t, LINK_LAYER_ETHERNET, Some("x"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("\"x\" is not a GID index on rxe0"), "{msg}");
        assert_eq!(
            select_on("rxe0", &t, LINK_LAYER_ETHERNET, Some("1"))
                .unwrap()
                .index,
            1
        );
    }

    #[test]
    fn roce_without_any_gid_is_no_device() {
        let err = select(&[], LINK_LAYER_ETHERNET, None).unwrap_err();
        assert!(matches!(err, Error::NoDevice(_)), "{err:?}");
    }
}
