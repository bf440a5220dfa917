//! commtap: zero-instrumentation profiler for the communication of MPI, NCCL and libfabric
//! jobs. The `commtap` binary is a command line over this library; the fuzz targets and
//! benchmarks reach its parsers through it.
//!
//! The data flows through one module per stage, each using only the stages before it:
//!
//! - `discover`: which processes, what they map, who they are (`/proc`, the kernel's
//!   process events, a process's memory for libfabric), and the watched set (`tracked`);
//! - `symbols`: reading a library file (opened once, verified, bounded) and what to probe;
//! - `attach`: the kernel side: BPF programs and maps, probes placed per library;
//! - `ingest`: the ring buffer drained into process events and call events;
//! - `stats` and `profile`: the kernel's counters folded per routine, and the job's profile
//!   built from them, once (`profile::build`);
//! - `skew` (who is late) and `trace` (timelines): from the call events;
//! - `report`: renderings of a profile (text, JSON, mpitrace files).
//!
//! `session` holds one profiling session's probes and watched processes; `record` and
//! `daemon` are the two ways of running one. Between processes: `api` (the gRPC types,
//! conversions, errors and transport every side shares), `serve` (the node daemon's
//! servers), `client` (the CLI's reads), `push` (the aggregator's client) and `aggregator`
//! (merging nodes). `clock` is the node's clock and another node's against it.

pub mod aggregator;
pub mod api;
pub mod attach;
pub mod client;
pub mod clock;
pub mod compare;
pub mod daemon;
pub mod discover;
pub mod doctor;
pub mod ingest;
pub mod profile;
pub mod push;
pub mod record;
pub mod report;
pub mod serve;
pub mod session;
pub mod signals;
pub mod skew;
pub mod stats;
pub mod symbols;
pub mod top;
pub mod trace;
