//! The rdma-core provider. In this issue: device listing only, through `rdma-mummy-sys`, which
//! loads libibverbs at run time.

use std::ffi::CStr;

use crate::{Context, Error, Result};

/// Opens an rdma-core device (comes with the verbs issue).
pub(crate) fn open(_name: &str) -> Result<Context> {
    Err(Error::Unsupported(
        "ibverbs provider: opening devices comes with the verbs issue".into(),
    ))
}

/// Names of rdma-core devices (`ibv_get_device_list(3)`).
pub(crate) fn device_names() -> Result<Vec<String>> {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the call returns NULL or a list we free below.
    let list = unsafe { rdma_mummy_sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(null_list_error(
            std::io::Error::last_os_error().raw_os_error(),
        ));
    }
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: `list` holds `n` valid device pointers (ibv_get_device_list(3)).
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a device of the list; its name is a NUL-terminated string that
        // lives as long as the list.
        let name = unsafe { rdma_mummy_sys::ibv_get_device_name(dev) };
        if !name.is_null() {
            // SAFETY: non-NULL, NUL-terminated, alive until the list is freed below.
            names.push(
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { rdma_mummy_sys::ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(Error::NoDevice("rdma-core lists no RDMA device".into()));
    }
    Ok(names)
}

/// The error for a NULL device list with `errno`: rdma-core's two "no RDMA here" answers
/// (ENOSYS: the kernel has no RDMA; EOPNOTSUPP: libibverbs is not installed) are
/// [`Error::NoDevice`]; anything else is an OS error.
fn null_list_error(errno: Option<i32>) -> Error {
    match errno {
        Some(libc::ENOSYS) => {
            Error::NoDevice("the kernel has no RDMA support (ibv_get_device_list: ENOSYS)".into())
        }
        Some(libc::EOPNOTSUPP) => {
            Error::NoDevice("libibverbs is not installed (ibv_get_device_list: EOPNOTSUPP)".into())
        }
        Some(e) => Error::Os {
            what: "ibv_get_device_list",
            source: std::io::Error::from_raw_os_error(e),
        },
        None => Error::NoDevice("ibv_get_device_list returned NULL".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rdma_errnos_map_to_no_device() {
        for e in [libc::ENOSYS, libc::EOPNOTSUPP] {
            let err = null_list_error(Some(e));
            assert!(matches!(err, Error::NoDevice(_)), "{e}: {err:?}");
            assert_eq!(err.errno(), libc::ENODEV);
        }
        assert!(matches!(null_list_error(None), Error::NoDevice(_)));
    }

    #[test]
    fn other_errnos_stay_os_errors() {
        let err = null_list_error(Some(libc::ENOMEM));
        assert!(matches!(err, Error::Os { .. }));
        assert_eq!(err.errno(), libc::ENOMEM);
    }

    #[test]
    fn device_listing_never_returns_an_empty_list() {
        match device_names() {
            Ok(names) => assert!(!names.is_empty()),
            Err(e) => assert!(matches!(e, Error::NoDevice(_)), "{e:?}"),
        }
    }
}
