//! Helpers for commtap's end-to-end tests: build the ground-truth programs with the real
//! MPI compilers, run the real `commtap` binary (as root, real BPF), and compare profiles
//! with what the programs say they did.
//!
//! These tests need root and a BPF-capable kernel; they fail (never skip) without them.
//! `cargo xtask test` builds commtap and runs them with `--test-threads=1`.

pub mod attack;
mod browser;
mod build;
mod commtap;
mod consumers;
mod kernel;
mod process;
mod slurm;
mod truth;

pub use attack::*;
pub use browser::*;
pub use build::*;
pub use commtap::*;
pub use consumers::*;
pub use kernel::*;
pub use process::*;
pub use slurm::*;
pub use truth::*;
