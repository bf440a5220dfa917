//! `cargo xtask bench`: probe overhead per MPI call, measured in one run.
use std::path::Path;

use anyhow::Result;

/// Runs the benchmarks and writes their figures under `target/bench/`.
pub fn run(_root: &Path) -> Result<()> {
    anyhow::bail!("the probe-overhead benchmark is not written yet")
}
