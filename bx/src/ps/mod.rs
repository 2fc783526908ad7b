//! `bx ps`: the parameter-server process ([`serve`](mod@serve)), the benchmark that drives it
//! ([`bench`](mod@bench)) and the servers it starts, one or a fleet ([`fleet`]).

pub mod bench;
pub mod fleet;
pub mod serve;
pub mod size;
