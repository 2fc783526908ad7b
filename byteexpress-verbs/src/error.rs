//! Errors of verbs calls and completion statuses.

/// Status of a work completion, with the numeric values of rdma-core's `enum ibv_wc_status`
/// (`ibv_poll_cq(3)`), so both providers report the same codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a received message is longer than the posted receive buffer.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_PROT_ERR`: an SGE names memory outside its lkey's MR.
    LocProtErr = 4,
    /// `IBV_WC_MW_BIND_ERR`: a [`crate::WrOp::BindMw`] failed when it executed (the window
    /// was still bound, or the MR is gone).
    MwBindErr = 6,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP went to ERR before this WR was processed.
    WrFlushErr = 5,
    /// `IBV_WC_REM_INV_REQ_ERR`
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: rkey, bounds or access flags refused by the responder.
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: the peer did not answer within timeout × (retry_cnt + 1).
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the peer had no receive posted, rnr_retry times.
    RnrRetryExcErr = 13,
    /// `IBV_WC_GENERAL_ERR`
    GeneralErr = 21,
}

impl WcStatus {
    /// The `ibv_wc_status` number.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// Error of a verbs call (not of a completion: those carry a [`WcStatus`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No RDMA device on this host: rdma-core is absent (`EOPNOTSUPP`), the kernel has no RDMA
    /// (`ENOSYS`), or the device list is empty. `ibv_get_device_list(3)`.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// A queue is full: more WRs than max_send_wr / max_recv_wr outstanding (`ENOMEM` in
    /// `ibv_post_send(3)`). Nothing was posted.
    #[error("queue full (ENOMEM): {0}")]
    QueueFull(&'static str),
    /// The QP is in a state that does not allow this call (e.g. post before RTR/RTS), `EINVAL`.
    #[error("invalid QP state: {0}")]
    InvalidState(String),
    /// An argument breaks a device limit or is malformed (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device cannot do this (reported as a capability, e.g. remote access on memory not
    /// allocated by [`crate::Pd::alloc_shared`] on the soft provider).
    #[error("not supported by this device: {0}")]
    Unsupported(String),
    /// The peer cannot be reached or sent something malformed during connection set-up.
    #[error("peer: {0}")]
    Peer(String),
    /// An OS call failed; `errno` as the OS gave it.
    #[error("{what}: {source}")]
    Os {
        /// The call that failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The errno a C verbs call would have returned for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NoDevice(_) => libc::ENODEV,
            Error::QueueFull(_) => libc::ENOMEM,
            Error::InvalidState(_) | Error::InvalidArgument(_) => libc::EINVAL,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::Peer(_) => libc::ECONNREFUSED,
            Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// An [`Error::Os`] from the current `errno`.
    pub(crate) fn last_os(what: &'static str) -> Self {
        Error::Os {
            what,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// Result of a verbs call.
pub type Result<T> = std::result::Result<T, Error>;
