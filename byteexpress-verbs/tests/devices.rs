//! Device listing, the soft device's identity and its reachability probe.

mod common;

use byteexpress_verbs::{DeviceInfo, Error, devices, ibverbs_devices};
use common::soft;

#[test]
fn soft_device_is_listed_last_and_opens_as_one_context() {
    let list = devices();
    let last = list.last().expect("at least soft0");
    assert_eq!(last.name(), "soft0");
    assert!(!last.is_hardware());
    assert!(list[..list.len() - 1].iter().all(|d| d.is_hardware()));
    let a = last.open().unwrap();
    let b = last.open().unwrap();
    assert_eq!(a.name(), "soft0");
    assert_eq!(
        a.device_info(),
        b.device_info(),
        "one soft device per process"
    );
}

#[test]
fn ibverbs_listing_reports_no_device_rather_than_an_empty_list() {
    match ibverbs_devices() {
        Ok(names) => assert!(!names.is_empty()),
        Err(e) => assert!(matches!(e, Error::NoDevice(_)), "{e:?}"),
    }
}

#[test]
fn probe_answers_only_expected_nonces_once() {
    let ctx = soft();
    let me = ctx.device_info();
    assert!(!ctx.probe(&me, 41).unwrap(), "not expected");
    ctx.expect_probe(42);
    assert!(ctx.probe(&me, 42).unwrap());
    assert!(!ctx.probe(&me, 42).unwrap(), "used up");
}

#[test]
fn probe_of_unreachable_or_foreign_devices_is_false() {
    let ctx = soft();
    ctx.expect_probe(7);
    let mut bytes = ctx.device_info().to_bytes();
    let n = bytes.len();
    bytes[n - 1] ^= 0x01; // another socket name: nobody listens there
    assert!(
        !ctx.probe(&DeviceInfo::from_bytes(&bytes).unwrap(), 7)
            .unwrap()
    );
    let ibverbs = DeviceInfo::from_bytes(&[1, 2, 0, 0xfe, 0x80]).unwrap();
    assert!(!ctx.probe(&ibverbs, 7).unwrap());
    assert!(
        ctx.probe(&ctx.device_info(), 7).unwrap(),
        "the nonce was not used up by those"
    );
    ctx.expect_probe(8);
    let mut wrong_id = ctx.device_info().to_bytes();
    wrong_id[3] ^= 0xff; // same socket, another device id: a namesake, not our peer
    assert!(
        !ctx.probe(&DeviceInfo::from_bytes(&wrong_id).unwrap(), 8)
            .unwrap()
    );
}
