//! Types shared by commtap's BPF programs and its userspace collector.
//!
//! Everything that crosses the kernel/user boundary is defined here once, as `#[repr(C)]`
//! structs with explicit padding and compile-time size/offset checks, so that the two sides
//! cannot drift apart.
#![no_std]

pub mod buckets;
pub mod durations;
pub mod instances;
pub mod names;
pub mod routines;
pub mod shares;
pub mod wire;

pub use buckets::{size_bucket, BUCKETS, UNKNOWN_BUCKET};
pub use durations::{duration_bucket, next_draw, DurationHist, DURATION_BUCKETS};
pub use routines::{ArgSpec, ByteRule, Routine, ROUTINES, ROUTINE_COUNT};
pub use wire::*;
