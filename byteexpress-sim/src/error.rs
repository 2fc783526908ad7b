//! Errors of a simulation run.

use byteexpress_flow::credit::{CreditError, QueueError};
use byteexpress_flow::window::WindowError;

/// Why a run failed: a flow-control rule broken in the simulated protocol (a bug in the model,
/// as the engine would fail the link), a bad configuration, or output that could not be
/// written.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A window account refused a completion or a configuration.
    #[error("window")]
    Window(#[source] WindowError),
    /// The credit protocol was broken.
    #[error("credits")]
    Credit(#[source] CreditError),
    /// Send-queue or CQ accounting was broken.
    #[error("queues")]
    Queue(#[source] QueueError),
    /// A configuration value out of range.
    #[error("bad configuration: {0}")]
    Config(String),
    /// The run hit `max_sim_ns` before the trace finished.
    #[error("the trace did not finish within {0} ns of simulated time")]
    Unfinished(u64),
    /// Writing JSON or a plot failed.
    #[error("writing {path}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Drawing a plot failed.
    #[error("plot {path}: {msg}")]
    Plot {
        /// The file.
        path: String,
        /// What plotters said.
        msg: String,
    },
}
