//! Run inside the Soft-RoCE VM (`scripts/vm-tests.sh`), where rdma-core and the kernel's rxe
//! driver give a real verbs device `rxe0`. A missing device fails these tests; they never skip.
//! The provider-neutral behaviour is in the conformance suite (`tests/conformance/`); these
//! are the rdma-core specifics: device list, GID choice, device info and probe.

use std::process::Command;

use byteexpress_verbs::{ConnectAttr, Context, Error, QpCap, devices};

fn rxe0() -> Context {
    devices()
        .into_iter()
        .find(|d| d.name() == "rxe0")
        .expect("rxe0 is listed")
        .open()
        .expect("rxe0 opens")
}

fn endpoint_gid(ctx: &Context) -> [u8; 16] {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4).unwrap();
    pd.create_qp(&cq, &cq, QpCap::default())
        .unwrap()
        .endpoint()
        .gid
}

#[test]
fn device_list_shows_rxe0() {
    let names = byteexpress_verbs::ibverbs_devices().expect("rdma-core lists devices in the VM");
    assert!(names.iter().any(|n| n == "rxe0"), "devices: {names:?}");
}

#[test]
fn hardware_devices_come_before_the_soft_device() {
    let devs = devices();
    let first_soft = devs
        .iter()
        .position(|d| !d.is_hardware())
        .expect("the soft device is listed");
    assert!(first_soft > 0, "rxe0 first: {devs:?}");
    assert!(devs[..first_soft].iter().all(|d| d.is_hardware()));
    assert_eq!(devs[0].name(), "rxe0");
}

/// The VM's table: 0 link-local, 1 `::ffff:<RXE_IP>` (RoCE v2), 2 SLAAC; index 1 is chosen.
#[test]
fn the_ipv4_mapped_roce_v2_gid_is_chosen() {
    let ctx = rxe0();
    let gid = endpoint_gid(&ctx);
    let ip: std::net::Ipv4Addr = std::env::var("RXE_IP")
        .unwrap_or_else(|_| "10.0.2.15".into())
        .parse()
        .unwrap();
    assert_eq!(gid, ip.to_ipv6_mapped().octets());
    assert_eq!(ctx.query().active_mtu, 1024, "netdev MTU 1500");
}

const CHILD: &str = "BX_IBVERBS_VM_CHILD";

/// Re-runs this binary's `child_gid_override` test with `BX_GID_INDEX` set to `index`. The
/// child's output is captured and shown only when it fails, so it does not land inside this
/// test's own result line.
fn run_child(index: &str) -> bool {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["child_gid_override", "--exact", "--test-threads=1"])
        .env(CHILD, index)
        .env("BX_GID_INDEX", index)
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!(
            "child with BX_GID_INDEX={index} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

/// Only does something when started by `gid_index_env_overrides_the_choice`.
#[test]
fn child_gid_override() {
    let Ok(index) = std::env::var(CHILD) else {
        return;
    };
    let dev = devices().into_iter().find(|d| d.name() == "rxe0").unwrap();
    match index.as_str() {
        "0" => {
            let gid = endpoint_gid(&dev.open().unwrap());
            assert_eq!(&gid[..2], &[0xfe, 0x80], "link-local GID 0: {gid:?}");
        }
        _ => {
            let err = dev.open().unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        }
    }
}

#[test]
fn gid_index_env_overrides_the_choice_and_is_validated() {
    assert!(run_child("0"), "BX_GID_INDEX=0 picks the link-local GID");
    assert!(run_child("999"), "BX_GID_INDEX=999 fails to open");
}

#[test]
fn probe_reaches_another_rxe_device_info_but_not_a_soft_one() {
    let ctx = rxe0();
    let me = ctx.device_info();
    let round = byteexpress_verbs::DeviceInfo::from_bytes(&me.to_bytes()).unwrap();
    assert!(ctx.probe(&round, 1).unwrap());
    let soft = byteexpress_verbs::soft_device().unwrap().open().unwrap();
    assert!(!ctx.probe(&soft.device_info(), 1).unwrap());
    assert!(!soft.probe(&me, 1).unwrap());
}

#[test]
fn an_endpoint_of_the_soft_provider_is_refused() {
    let ctx = rxe0();
    let soft = byteexpress_verbs::soft_device().unwrap().open().unwrap();
    let spd = soft.alloc_pd().unwrap();
    let scq = soft.create_cq(4).unwrap();
    let sqp = spd.create_qp(&scq, &scq, QpCap::default()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCap::default()).unwrap();
    let err = qp.connect(&sqp.endpoint(), &ConnectAttr::default());
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "{err:?}");
    let err = pd.create_qp(&scq, &scq, QpCap::default());
    assert!(
        matches!(err, Err(Error::InvalidArgument(_))),
        "a soft CQ: {err:?}"
    );
}

/// A peer that announces the zero GID (as a broken `ibv_rc_pingpong` line can): rxe refuses
/// the address vector at RTR with `EINVAL`. The error names the call once, with the transition
/// and the attributes given (the zero `dgid` among them), not `ibv_modify_qp(ibv_modify_qp(RTR))`.
#[test]
fn a_refused_qp_transition_names_ibv_modify_qp_once_with_its_attributes() {
    let ctx = rxe0();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let a = pd.create_qp(&cq, &cq, QpCap::default()).unwrap();
    let b = pd.create_qp(&cq, &cq, QpCap::default()).unwrap();
    let ep = b.endpoint();
    let zero_gid = ctx.endpoint_for(ep.qpn, ep.psn, 0, [0; 16], 1024).unwrap();
    let err = a
        .connect(&zero_gid, &ConnectAttr::default())
        .unwrap_err()
        .to_string();
    assert_eq!(err.matches("ibv_modify_qp").count(), 1, "{err}");
    assert!(
        err.contains("ibv_modify_qp(RTR) refused the attributes"),
        "{err}"
    );
    assert!(err.contains("dgid ::)"), "{err}");
    assert!(err.contains(&format!("dest_qp_num {:#x}", ep.qpn)), "{err}");
}
