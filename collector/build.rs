//! Builds `collector-ebpf` for the BPF target with the nightly toolchain and bpf-linker
//! (set up by `cargo xtask setup`), so the object can be embedded in the `commtap` binary.

use std::{env, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    compile_protos()?;
    build_ebpf()
}

/// Generates the gRPC code from `proto/commtap/v1/*.proto`, the single source of the wire
/// API, plus the descriptor set that server reflection serves; and Perfetto's trace messages.
fn compile_protos() -> Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let proto = manifest.join("../proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let files = [
        "commtap/v1/profile.proto",
        "commtap/v1/node.proto",
        "commtap/v1/aggregator.proto",
    ]
    .map(|f| proto.join(f));
    // A rank's rare parts stay off the line: thousands of ranks are held and copied.
    tonic_prost_build::configure()
        .boxed(".commtap.v1.RankProfile.container")
        .boxed(".commtap.v1.RankProfile.region")
        .file_descriptor_set_path(out.join("commtap_descriptor.bin"))
        .compile_protos(&files, std::slice::from_ref(&proto))
        .context("compiling proto/commtap/v1 (needs protoc: `cargo xtask setup` installs protobuf-compiler)")?;
    // Perfetto's trace format, for `.pftrace` timelines: messages only, not served.
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_protos(&[proto.join("perfetto/trace.proto")], &[proto])
        .context("compiling proto/perfetto/trace.proto")?;
    Ok(())
}

/// Set to build without the BPF toolchain (`cargo check`, clippy, rust-analyzer, fuzz
/// targets): the embedded object is then empty, and loading the probes fails with a clear
/// error at run time. `cargo xtask` never sets it.
const SKIP: &str = "COMMTAP_SKIP_BPF_BUILD";

fn build_ebpf() -> Result<()> {
    println!("cargo:rerun-if-env-changed={SKIP}");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    if env::var_os(SKIP).is_some_and(|v| v != "0") {
        println!("cargo:warning={SKIP} is set: the BPF programs are not built (this commtap cannot probe)");
        std::fs::write(out.join("collector.bpf.o"), b"")?;
        return Ok(());
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf = manifest.join("../collector-ebpf");
    let common = manifest.join("../collector-common");
    for dir in [ebpf.join("src"), common.join("src")] {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    for file in ["Cargo.toml", ".cargo/config.toml"] {
        println!("cargo:rerun-if-changed={}", ebpf.join(file).display());
    }
    let target_dir = out.join("ebpf-target");

    let mut cmd = Command::new("rustup");
    cmd.current_dir(&ebpf)
        .args([
            "run",
            "nightly",
            "cargo",
            "build",
            "--release",
            "--target",
            "bpfel-unknown-none",
        ])
        .args(["-Z", "build-std=core", "--bins"])
        .arg("--target-dir")
        .arg(&target_dir);
    // The outer cargo's settings (stable rustc, clippy's wrapper, host flags) must not leak in.
    for var in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTUP_TOOLCHAIN",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().context(
        "running `rustup run nightly cargo build` for collector-ebpf (run `cargo xtask setup`)",
    )?;
    if !status.success() {
        bail!("building collector-ebpf failed: {status} (needs nightly + rust-src + bpf-linker: `cargo xtask setup`)");
    }
    let obj = target_dir.join("bpfel-unknown-none/release/collector");
    std::fs::copy(&obj, out.join("collector.bpf.o"))
        .with_context(|| format!("copying {}", obj.display()))?;
    Ok(())
}
