//! The parameter-server workload (`proto/ps.proto`): embedding tables sharded by key, a tonic
//! service over them, the `bx ps serve` process and the `bx ps bench` driver.

pub mod bench;
pub mod cpu;
pub mod serve;
pub mod service;
pub mod table;

pub use service::PsService;
pub use table::{Store, init_value};
