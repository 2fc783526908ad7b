//! Run inside the Soft-RoCE VM (`scripts/vm-tests.sh`), where rdma-core and the kernel's rxe
//! driver give a real verbs device `rxe0`. A missing device fails these tests; they never skip.

#[test]
fn device_list_shows_rxe0() {
    let names = byteexpress_verbs::ibverbs_devices().expect("rdma-core lists devices in the VM");
    assert!(names.iter().any(|n| n == "rxe0"), "devices: {names:?}");
}

#[test]
fn hardware_devices_come_before_the_soft_device() {
    let devs = byteexpress_verbs::devices();
    let first_soft = devs
        .iter()
        .position(|d| !d.is_hardware())
        .expect("the soft device is listed");
    assert!(first_soft > 0, "rxe0 first: {devs:?}");
    assert!(devs[..first_soft].iter().all(|d| d.is_hardware()));
    assert_eq!(devs[0].name(), "rxe0");
}
