//! `bx ps`: the parameter-server process ([`serve`](mod@serve)), the benchmark that drives it
//! ([`bench`](mod@bench)) with its settings ([`args`]), its clients ([`clients`]), the plain-TCP floor ([`floor`]), what a
//! row costs ([`usage`]), the report ([`report`], [`rounds`]) and the servers it starts, one or
//! a fleet ([`fleet`]).

pub mod args;
pub mod bench;
pub mod clients;
pub mod fleet;
pub mod floor;
pub mod report;
pub mod rounds;
pub mod serve;
pub mod size;
pub mod usage;
