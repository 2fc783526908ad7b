//! `bx devices`: the verbs devices of this host with their limits, port MTU and GID table,
//! in the spirit of `ibv_devices` / `ibv_devinfo`.
//!
//! The first line says why there is no rdma-core device when there is none (no RDMA in the
//! kernel, libibverbs not installed, an empty list), in the verbs layer's words, and that the
//! soft device listed after it needs none. Then one block
//! per device, hardware (rdma-core) devices first, then the userspace soft device.

use std::fmt::Write as _;
use std::net::Ipv6Addr;
use std::process::ExitCode;

use byteexpress_verbs::{Context, GidInfo};

/// Prints the listing; fails only when no device at all could be opened.
pub fn main() -> ExitCode {
    let devices = byteexpress_verbs::devices();
    if let Err(e) = byteexpress_verbs::ibverbs_devices() {
        let why = e.to_string();
        // The verbs error already starts with "no RDMA device" for rdma-core's "none here".
        let why = if why.starts_with("no RDMA device") {
            why
        } else {
            format!("no RDMA device: {why}")
        };
        if devices.is_empty() {
            // Nothing follows: say so instead of pointing at a listing that is not there.
            println!("rdma-core: {why}; the soft device is hidden (BX_SOFT=0): no device found");
        } else {
            // Said as a fact about rdma-core, not as a failure: the soft device follows.
            println!("rdma-core: {why}; the soft device below runs in userspace without a NIC");
        }
    }
    let mut opened = 0;
    let listed = devices.len();
    for d in devices {
        let kind = if d.is_hardware() {
            "rdma-core"
        } else {
            "soft, userspace"
        };
        match d.open() {
            Ok(ctx) => {
                opened += 1;
                print!("{}", describe(&ctx, kind));
            }
            Err(e) => println!("hca_id:\t{}\t({kind})\n\tcannot open: {e}", d.name()),
        }
    }
    if opened == 0 {
        if listed == 0 {
            eprintln!("bx devices: no RDMA device found");
        } else {
            eprintln!("bx devices: none of the {listed} devices could be opened");
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// One device's block: limits, port 1 MTU, and its valid GIDs with the one QPs use marked.
pub fn describe(ctx: &Context, kind: &str) -> String {
    let a = ctx.query();
    let mut s = String::new();
    let _ = writeln!(s, "hca_id:\t{}\t({kind})", ctx.name());
    let _ = writeln!(s, "\tmax_qp_wr:\t\t{}", a.max_qp_wr);
    let _ = writeln!(s, "\tmax_sge:\t\t{}", a.max_sge);
    let _ = writeln!(s, "\tmax_inline_data:\t{}", a.max_inline_data);
    let _ = writeln!(s, "\tmax_cqe:\t\t{}", a.max_cqe);
    let _ = writeln!(s, "\tmax_mr_size:\t\t{:#x}", a.max_mr_size);
    if a.remote_access_needs_shared {
        let _ = writeln!(
            s,
            "\tremote access:\t\tonly on memory from Pd::alloc_shared"
        );
    }
    let _ = writeln!(s, "\t\tport:\t1");
    let _ = writeln!(s, "\t\t\tactive_mtu:\t\t{}", a.active_mtu);
    let gids = ctx.gids();
    if gids.is_empty() && ctx.gid_index().is_none() {
        let _ = writeln!(s, "\t\t\tGIDs:\t\t\tnone (not an rdma-core device)");
    }
    for g in &gids {
        let _ = writeln!(s, "\t\t\t{}", gid_line(g, ctx.gid_index() == Some(g.index)));
    }
    s
}

/// `GID[  1]:\t::ffff:10.0.2.15, RoCE v2 (used by QPs)`.
pub fn gid_line(g: &GidInfo, in_use: bool) -> String {
    let kind = match g.gid_type {
        Some(0) => ", IB",
        Some(1) => ", RoCE v1",
        Some(2) => ", RoCE v2",
        _ => "",
    };
    format!(
        "GID[{:>3}]:\t\t{}{kind}{}",
        g.index,
        Ipv6Addr::from(g.gid),
        if in_use { " (used by QPs)" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_lines_show_the_address_type_and_the_one_in_use() {
        let g = GidInfo {
            index: 1,
            gid: Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x0a00, 0x020f]).octets(),
            gid_type: Some(2),
        };
        assert_eq!(
            gid_line(&g, true),
            "GID[  1]:\t\t::ffff:10.0.2.15, RoCE v2 (used by QPs)"
        );
        let g = GidInfo {
            gid_type: None,
            ..g
        };
        assert_eq!(gid_line(&g, false), "GID[  1]:\t\t::ffff:10.0.2.15");
    }
}
