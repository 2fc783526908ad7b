//! A packet-level discrete-event simulator of incast at a parameter server, which drives the
//! real `byteexpress_flow` (its windows, credits and admission gates, the functions
//! `byteexpress-rpc`'s RDMA engine calls) on simulated time (issue 26).
//!
//! - Network ([`world`]): hosts with NICs ([`nic`]) on one switch ([`switch`]) with a shared
//!   buffer under the dynamic-threshold policy, per-port egress FIFOs, PFC per ingress queue
//!   ([`pfc`]), RED/ECN ([`ecn`]); links at a rate with a propagation delay per hop; an event
//!   queue keyed by (time, sequence) ([`event`]); a seeded RNG.
//! - Senders: DCQCN ([`dcqcn`]), RDMA RC go-back-N ([`gbn`]), TCP NewReno and DCTCP ([`tcp`]).
//! - The trace ([`trace`]): N workers push a gradient shard to a parameter server and pull,
//!   with compute time between steps, over three arms ([`arms`]): TCP, RDMA with DCQCN only,
//!   and RDMA with DCQCN under ByteExpress windows and credits ([`rpc`]).
//! - Results ([`report`]): push latency percentiles, PFC pauses, queue depth, goodput; table,
//!   JSON, SVG plots ([`plot`]).
//!
//! Every constant is a field of [`config::SimConfig`]; its `Default`s are issue 26's.
#![forbid(unsafe_code)]

pub mod arms;
pub mod config;
pub mod dcqcn;
pub mod ecn;
pub mod error;
pub mod event;
pub mod flow;
pub mod gbn;
pub mod msgq;
pub mod nic;
pub mod packet;
pub mod pfc;
pub mod plot;
pub mod report;
pub mod rpc;
pub mod switch;
pub mod tcp;
pub mod trace;
pub mod world;
