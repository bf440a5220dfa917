//! commtap: zero-instrumentation profiler for the communication of MPI, NCCL and libfabric
//! jobs. The `commtap` binary is a command line over this library; the fuzz targets and
//! benchmarks reach its parsers through it.
//!
//! The data flows discover -> symbols -> attach (kernel probes) -> ingest / counters ->
//! stats -> report; each stage is one module. `serve`, `client` and `aggregator` carry
//! profiles between processes; `daemon` and `record` are the two ways of running it.

pub mod aggregator;
pub mod attach;
pub mod client;
pub mod compare;
pub mod daemon;
pub mod discover;
pub mod doctor;
pub mod fabric;
pub mod ingest;
pub mod record;
pub mod report;
pub mod serve;
pub mod session;
pub mod signals;
pub mod skew;
pub mod stats;
pub mod symbols;
pub mod trace;
