//! `bx ps`: the parameter-server process ([`serve`](mod@serve)) and the benchmark that drives it
//! ([`bench`](mod@bench)).

pub mod bench;
pub mod serve;
