//! The per-device window account, shared by every link of one device in this process.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use byteexpress_flow::window::DeviceWindow;
use parking_lot::Mutex;

/// A device's shared account of bytes in flight.
pub(crate) type SharedDeviceWindow = Arc<Mutex<DeviceWindow>>;

/// The account of device `name`, created on first use with a cap of `cap` bytes (0 =
/// unlimited). Later links of the device share it whatever cap they ask for: the first link's
/// `Config::device_window_bytes` sets it for the process.
pub(crate) fn device_window(name: &str, cap: u64) -> SharedDeviceWindow {
    static DEVICES: OnceLock<Mutex<HashMap<String, SharedDeviceWindow>>> = OnceLock::new();
    DEVICES
        .get_or_init(Default::default)
        .lock()
        .entry(name.to_string())
        .or_insert_with(|| {
            Arc::new(Mutex::new(
                DeviceWindow::new(cap).unwrap_or_else(|_| DeviceWindow::unlimited()),
            ))
        })
        .clone()
}
