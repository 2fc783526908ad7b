//! Software window: bytes posted to the NIC and not yet completed, capped per QP and per
//! device. Beyond the cap, messages wait in software (in the [`sched`](crate::sched) queues)
//! instead of piling up in the NIC's send queue behind the hardware congestion control.
//!
//! Pure state machine: no I/O, no clock (the caller passes `now_us`), no allocation.
//!
//! # Two caps, one post
//! Each QP has a [`Window`]; all QPs of one device charge into one shared [`DeviceWindow`].
//! [`Window::try_post`] takes both and admits a post only if **both** caps allow it, then
//! charges both; [`Window::on_complete`] releases both. There is no way to post on a QP
//! without naming its device account, so the device cap cannot be bypassed. A QP used alone
//! charges into [`DeviceWindow::unlimited`].
//!
//! # Admission rule
//! A post of `bytes` is admitted when, for each of the two accounts (QP, device):
//! `in_flight + bytes <= cap`, **or** `in_flight == 0`.
//! The second clause is the *single-chunk escape*: a window smaller than the largest chunk
//! still lets one chunk through when nothing is in flight, so the window never blocks forever
//! (completions drain `in_flight` to 0, and then any post passes). Such a post is marked
//! [`Ticket::over_cap`]. Consequence: `in_flight <= max(cap, bytes of the one post in
//! flight)` at every admission (checked by `tests/window_props.rs`).
//!
//! # Batches
//! Completions of several posts may be reported together, with one [`Window::on_complete`]
//! of their total (`byteexpress-rpc`'s RDMA engine does so for the SEND completions of one CQ
//! poll with a static window); each post is charged as it is admitted.
//!
//! # Static cap
//! [`Window::fixed`] caps at a number of bytes; [`Window::from_bdp`] sizes that cap to the
//! bandwidth-delay product, bytes/s × RTT µs / 10⁶ ([`bdp_bytes`]).
//!
//! # Adaptive, delay-based cap (AIMD on completion RTT)
//! [`Window::adaptive`] follows the delay-based control of Swift (Kumar et al., SIGCOMM 2020)
//! and Timely (Mittal et al., SIGCOMM 2015), reduced to AIMD on the window, with the RTT of
//! each completion (post → CQE, µs) as the congestion signal. Parameters ([`AdaptiveConfig`]):
//! `min`, `max` (bytes), `target_delay_us` (µs), `additive_increase` (bytes per RTT),
//! `beta_permille` and `max_decrease_permille` (‰). On each completion of `bytes` with
//! `rtt_us` at `now_us`:
//!
//! - `rtt_us < target`: additive increase. Completed bytes accumulate; once a full window's
//!   worth has completed (about one RTT of a busy window), `cwnd += additive_increase`. A window
//!   that is not used does not grow.
//! - `rtt_us > target`: multiplicative decrease, at most once per RTT (only when
//!   `now_us - last_decrease_us >= rtt_us`, as in Swift):
//!   `cwnd -= cwnd × min(beta × (rtt − target) / rtt, max_decrease)`, at least 1 byte, so the
//!   cut is proportional to how far the delay is above target.
//! - `rtt_us == target`: no change.
//!
//! `cwnd` is always clamped to `[min, max]`. `now_us` must be monotonic (any epoch).
//!
//! # Limits
//! The device cap is static. The device-level escape lets one post through an empty device;
//! a QP whose post is larger than the device's free room waits until the device drains (or
//! frees enough room), so a device cap far below (number of QPs × chunk size) lets busy QPs
//! delay a large post. Size the device cap to at least a few chunks per QP.

mod adaptive;
mod bdp;
mod device;
mod error;
mod qp;
mod stats;

pub use adaptive::{AdaptiveConfig, Adjust};
pub use bdp::bdp_bytes;
pub use device::DeviceWindow;
pub(crate) use device::admit;
pub use error::{Limit, WindowError};
pub use qp::{Blocked, Ticket, Window};
pub use stats::WindowStats;
