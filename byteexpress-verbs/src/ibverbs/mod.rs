//! The rdma-core provider, through `rdma-mummy-sys`, which loads libibverbs at run time.
//!
//! - [`context`]: device open and query (`ibv_open_device(3)`, `ibv_query_device(3)`,
//!   `ibv_query_port(3)`), [`gid`] selection, `DeviceInfo` and `probe`.
//! - [`pd`]: PDs and MRs (`ibv_alloc_pd(3)`, `ibv_reg_mr(3)`); [`mem`]: page-aligned anonymous
//!   memory for `alloc_shared`.
//! - [`cq`]: CQs with a completion channel (`ibv_create_cq(3)`, `ibv_req_notify_cq(3)`,
//!   `ibv_get_cq_event(3)`), [`convert`]: `ibv_wc` and other plain-data conversions.
//! - [`ledger`]: each QP's outstanding WRs: exact queue capacity, callers' `wr_id`s, and flush
//!   completions for WRs posted in ERR.
//! - [`qp`]: RC QPs and their state machine (`ibv_create_qp(3)`, `ibv_modify_qp(3)`);
//!   [`post`]: `ibv_post_send(3)` / `ibv_post_recv(3)`; [`srq`]: shared receive queues
//!   (`ibv_create_srq(3)`, `ibv_post_srq_recv(3)`).
//! - Async events (`ibv_get_async_event(3)`) are read in [`context`].
//!
//! Thread safety: libibverbs objects may be used from several threads at once; posting to and
//! polling of one queue are serialised by the provider library itself (`ibv_post_send(3)`:
//! "thread-safe"; rdma-core's providers lock each queue). Every wrapper here therefore shares
//! its raw pointer between threads, and destroys it exactly once, when the last `Arc` of it
//! drops — after every object that refers to it (Rust ownership orders teardown: QP before CQ
//! and PD, MR before PD and memory, everything before the context).

mod context;
mod convert;
mod cq;
mod gid;
mod ledger;
mod mem;
mod mw;
mod pd;
mod post;
mod qp;
mod srq;

use std::ffi::CStr;

use crate::{Context, Error, Result};

/// Opens the rdma-core device `name` (`ibv_open_device(3)`) on port 1.
pub(crate) fn open(name: &str) -> Result<Context> {
    Ok(Context {
        inner: context::IbvContext::open(name)?,
    })
}

/// An [`Error::Os`] for a verbs call that returned the errno value `errno` (the convention of
/// `ibv_modify_qp(3)`, `ibv_destroy_*`, `ibv_post_*`), or that returned NULL / -1 and set
/// `errno` (pass `None` to read it).
pub(crate) fn os_err(what: &'static str, errno: Option<i32>) -> Error {
    let source = match errno {
        Some(e) => std::io::Error::from_raw_os_error(e),
        None => std::io::Error::last_os_error(),
    };
    Error::Os { what, source }
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

    #[test]
    fn opening_a_missing_device_is_no_device() {
        let err = open("no-such-device-bx").unwrap_err();
        assert!(matches!(err, Error::NoDevice(_)), "{err:?}");
    }
}
