//! `cargo xtask fuzz`: coverage-guided fuzzing (cargo-fuzz, libFuzzer) of every parser
//! commtap applies to input someone else controls, one target at a time, each from seeds
//! made of real files. Not part of `cargo xtask test` or CI: it runs for minutes.
//!
//! The targets live in `fuzz/` (its own crate, outside the workspace: it needs nightly and
//! a sanitizer). Corpora grow in `fuzz/corpus/<target>/`, crashes land in
//! `fuzz/artifacts/<target>/`, each run's log in `fuzz/target/logs/<target>.log`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::{output, run as run_cmd};

/// Largest library seed copied: libFuzzer cuts every input to `-max_len` anyway, and an ELF
/// cut short of its section headers only reaches the parser's first error.
const MAX_SEED_BYTES: u64 = 64 << 20;

/// Most memory one target may use (MiB), sanitizer's share included.
const RSS_LIMIT_MB: u32 = 1024;

/// Seconds one input may take before libFuzzer reports it as a hang.
const TIMEOUT_S: u32 = 20;

/// A fuzz target: its name (`fuzz/fuzz_targets/<name>.rs`) and the longest input libFuzzer
/// makes for it.
struct Target {
    name: &'static str,
    max_len: usize,
}

/// Every fuzz target, in the order they run.
const TARGETS: &[Target] = &[
    Target {
        name: "library_elf",
        max_len: 4 << 20,
    },
    Target {
        name: "demangled_name",
        // Symbols are read up to 1,024 characters.
        max_len: 4 << 10,
    },
    Target {
        name: "proc_maps",
        max_len: 64 << 10,
    },
    Target {
        name: "proc_identity",
        max_len: 64 << 10,
    },
    Target {
        name: "identity_event",
        // The event is 20,512 bytes; longer inputs are cut.
        max_len: 32 << 10,
    },
    Target {
        name: "kernel_btf",
        // The running kernel's BTF is a seed (about 6 MiB).
        max_len: 16 << 20,
    },
    Target {
        name: "nccl_tests_table",
        max_len: 64 << 10,
    },
    Target {
        name: "profile_json",
        max_len: 64 << 10,
    },
    Target {
        name: "snapshot_push",
        max_len: 64 << 10,
    },
];

/// What one target's run came to.
struct Outcome {
    name: &'static str,
    /// Seconds fuzzed (libFuzzer's count; else the run's, build included).
    seconds: u64,
    runs: Option<u64>,
    crash: Option<String>,
}

/// Fuzzes `targets` (all when empty) for `seconds` each; fails if any crashed.
pub fn run(root: &Path, seconds: u64, targets: &[String]) -> Result<()> {
    let chosen = choose(targets)?;
    let fuzz = root.join("fuzz");
    install_cargo_fuzz()?;
    // Every target and the seed maker, with the flags `cargo fuzz run` uses (so the runs
    // below only link).
    run_cmd(cargo_fuzz(root).arg("build"))?;
    let corpus = fuzz.join("corpus");
    for t in &chosen {
        fs::create_dir_all(corpus.join(t.name))?;
    }
    make_seeds(root, &corpus)?;

    let logs = fuzz.join("target/logs");
    fs::create_dir_all(&logs)?;
    let outcomes = chosen
        .iter()
        .map(|t| fuzz_one(root, t, &corpus, &logs, seconds))
        .collect::<Result<Vec<_>>>()?;

    eprintln!("\n{:<18}{:>10}{:>14}  result", "target", "seconds", "runs");
    for o in &outcomes {
        let runs = o.runs.map_or("?".to_string(), |r| r.to_string());
        let result = o
            .crash
            .as_ref()
            .map_or("no crash".to_string(), |c| format!("CRASH {c}"));
        eprintln!("{:<18}{:>10}{:>14}  {result}", o.name, o.seconds, runs);
    }
    let crashed = outcomes.iter().filter(|o| o.crash.is_some()).count();
    if crashed > 0 {
        bail!(
            "{crashed} fuzz target(s) crashed: reproduce with `cargo +nightly fuzz run TARGET \
             ARTIFACT`, minimise with `cargo +nightly fuzz tmin TARGET ARTIFACT`"
        );
    }
    Ok(())
}

/// The targets named (all when none is), or which names are not targets.
fn choose(targets: &[String]) -> Result<Vec<&'static Target>> {
    if targets.is_empty() {
        return Ok(TARGETS.iter().collect());
    }
    targets
        .iter()
        .map(|name| {
            TARGETS.iter().find(|t| t.name == name).with_context(|| {
                let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
                format!("no fuzz target {name} (one of {})", names.join(", "))
            })
        })
        .collect()
}

/// Fuzzes one target for `seconds`, its output in `logs`; a crash is shown with the log's
/// last lines.
fn fuzz_one(root: &Path, t: &Target, corpus: &Path, logs: &Path, seconds: u64) -> Result<Outcome> {
    let log = logs.join(format!("{}.log", t.name));
    eprintln!(
        "fuzzing {} for {seconds} s (log: {})",
        t.name,
        log.display()
    );
    let started = Instant::now();
    let file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let status = cargo_fuzz(root)
        .args(["run", t.name])
        .arg(corpus.join(t.name))
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-max_len={}", t.max_len))
        .arg(format!("-timeout={TIMEOUT_S}"))
        .stdout(file.try_clone()?)
        .stderr(file)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("running cargo fuzz run {}", t.name))?;
    let text = String::from_utf8_lossy(&fs::read(&log)?).into_owned();
    let crash = (!status.success())
        .then(|| artifact(&text).unwrap_or_else(|| format!("{status}: see {}", log.display())));
    if crash.is_some() {
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        for line in tail.iter().rev() {
            eprintln!("  | {line}");
        }
    }
    let (runs, fuzzed) = runs(&text);
    Ok(Outcome {
        name: t.name,
        seconds: fuzzed.unwrap_or(started.elapsed().as_secs()),
        runs,
        crash,
    })
}

/// `cargo +nightly fuzz` on `fuzz/`, building commtap without its BPF programs (the fuzz
/// targets never load them).
fn cargo_fuzz(root: &Path) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .args(["+nightly", "fuzz"])
        .env("COMMTAP_SKIP_BPF_BUILD", "1");
    cmd
}

/// Installs cargo-fuzz unless it is there.
fn install_cargo_fuzz() -> Result<()> {
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if have {
        return Ok(());
    }
    run_cmd(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
}

/// Puts every target's seeds into `corpus/<target>/` (overwriting earlier copies; what
/// libFuzzer added there stays): real files, small programs built from `tests/programs`,
/// the hand-written seeds of `fuzz/seeds/<target>/`, and what `make_seeds` encodes.
fn make_seeds(root: &Path, corpus: &Path) -> Result<()> {
    // Every target's, on a fresh checkout too (the seeds below are written into them).
    for t in TARGETS {
        fs::create_dir_all(corpus.join(t.name))?;
    }
    let seeds = root.join("fuzz/seeds");
    for dir in fs::read_dir(&seeds)? {
        let dir = dir?.path();
        let target = dir.file_name().context("a seed directory has a name")?;
        for file in fs::read_dir(&dir)? {
            let file = file?.path();
            let name = file.file_name().context("a seed has a name")?;
            copy_seed(&file, &corpus.join(target).join(name))?;
        }
    }

    let libs = corpus.join("library_elf");
    for lib in real_libraries() {
        let name = lib.file_name().context("a library has a name")?.to_owned();
        copy_seed(&lib, &libs.join(name))?;
    }
    build_programs(root, &libs);

    // This very process's /proc entries.
    fs::write(corpus.join("proc_maps/self"), fs::read("/proc/self/maps")?)?;
    let identity = [
        fs::read("/proc/self/cmdline")?,
        fs::read("/proc/self/environ")?,
        fs::read("/proc/self/cgroup")?,
    ]
    .join(&0xffu8);
    fs::write(corpus.join("proc_identity/self"), identity)?;
    let slurm = b"srun\0./app\0\xffSLURM_JOB_ID=4242\0SLURM_PROCID=3\0SLURM_NTASKS=8\0\
PMIX_NAMESPACE=slurm.pmix.4242.0\0\xff0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_3\n";
    fs::write(corpus.join("proc_identity/slurm"), slurm)?;

    match fs::read("/sys/kernel/btf/vmlinux") {
        Ok(btf) => fs::write(corpus.join("kernel_btf/vmlinux"), btf)?,
        Err(e) => eprintln!("warning: no /sys/kernel/btf/vmlinux seed: {e}"),
    }

    for file in fs::read_dir(root.join("tests/data"))? {
        let file = file?.path();
        if file.extension().is_some_and(|e| e == "txt") {
            let name = file.file_name().context("a test file has a name")?;
            copy_seed(&file, &corpus.join("nccl_tests_table").join(name))?;
        }
    }

    // identity_event, kernel_btf (a small blob), profile_json, snapshot_push: encoded with
    // commtap's own types by the fuzz crate's seed maker.
    let host = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let host = host
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .context("rustc +nightly -vV names no host")?;
    let maker = root.join(format!("fuzz/target/{host}/release/make_seeds"));
    run_cmd(
        Command::new(&maker)
            .arg(corpus)
            .arg(&seeds)
            .env("ASAN_OPTIONS", "detect_leaks=0"),
    )
}

/// MPI, libfabric and NCCL libraries installed here (those under [`MAX_SEED_BYTES`]).
fn real_libraries() -> Vec<PathBuf> {
    let mut libs: Vec<PathBuf> = [
        "/usr/lib/x86_64-linux-gnu/libmpich.so.12",
        "/usr/lib/x86_64-linux-gnu/libmpi.so.40",
        "/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40",
        "/usr/lib/x86_64-linux-gnu/libfabric.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    // The NCCL wheel PyTorch depends on (`cargo xtask setup` installs it).
    let nccl = output(Command::new("python3").args([
        "-c",
        "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))",
    ]))
    .unwrap_or_default();
    if let Ok(dir) = fs::read_dir(nccl.trim()) {
        libs.extend(
            dir.flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().contains(".so")),
        );
    }
    libs.retain(|lib| match fs::metadata(lib) {
        Ok(m) if m.len() <= MAX_SEED_BYTES => true,
        Ok(m) => {
            eprintln!(
                "note: {} ({} MiB) is not a seed: larger than {} MiB",
                lib.display(),
                m.len() >> 20,
                MAX_SEED_BYTES >> 20
            );
            false
        }
        Err(_) => false,
    });
    libs
}

/// Small ELF files from `tests/programs`, each reaching one kind of library commtap reads
/// (MPI look-alike, NCCL stand-ins, net plugin, CUDA runtime, libfabric without tables),
/// and executables with an RPATH and a RUNPATH (`dynamic_needs`).
fn build_programs(root: &Path, out: &Path) {
    let programs = root.join("tests/programs");
    let builds: &[(&str, &str, &[&str])] = &[
        ("attack_lib.c", "libattack.so", &["-shared", "-fPIC"]),
        (
            "nccl_standin.c",
            "libnccl_standin.so",
            &["-shared", "-fPIC"],
        ),
        (
            "nccl_standin.c",
            "libnccl_hidden.so",
            &["-shared", "-fPIC", "-DHIDDEN_NCCL", "-fvisibility=hidden"],
        ),
        ("nccl_net_plugin.c", "libnccl-net.so", &["-shared", "-fPIC"]),
        ("cudart_standin.c", "libcudart.so", &["-shared", "-fPIC"]),
        // Line tables and C++ names (a call site's file and line, demangled).
        (
            "attack_lib.c",
            "libattack_g.so",
            &["-shared", "-fPIC", "-g"],
        ),
        (
            "attack_lib.c",
            "libattack_cxx.so",
            &["-shared", "-fPIC", "-g", "-x", "c++"],
        ),
        ("fabric_fake.c", "libfabric_fake.so", &["-shared", "-fPIC"]),
        (
            "attack_lib.c",
            "librpath.so",
            &[
                "-shared",
                "-fPIC",
                "-Wl,--disable-new-dtags,-rpath,$ORIGIN/../lib:/opt/mpi/lib",
            ],
        ),
        (
            "attack_lib.c",
            "librunpath.so",
            &[
                "-shared",
                "-fPIC",
                "-Wl,--enable-new-dtags,-rpath,${ORIGIN}/lib",
            ],
        ),
    ];
    for (source, name, flags) in builds {
        let status = Command::new("cc")
            .args(["-O1", "-g0", "-I"])
            .arg(&programs)
            .args(*flags)
            .arg("-o")
            .arg(out.join(format!("built_{name}")))
            .arg(programs.join(source))
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("warning: could not build the seed {name} from {source}");
        }
    }
}

/// Copies `from` to `to` unless it is larger than [`MAX_SEED_BYTES`].
fn copy_seed(from: &Path, to: &Path) -> Result<()> {
    if fs::metadata(from)?.len() > MAX_SEED_BYTES {
        return Ok(());
    }
    fs::create_dir_all(to.parent().context("a seed has a directory")?)?;
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// The runs libFuzzer made and in how many seconds, from its closing `Done N runs in S
/// second(s)`; else (it stopped on a crash) the runs of its last `#N` status line.
fn runs(log: &str) -> (Option<u64>, Option<u64>) {
    let done = log.lines().rev().find_map(|l| {
        let mut words = l.strip_prefix("Done ")?.split_whitespace();
        let runs = words.next()?.parse().ok()?;
        Some((runs, words.nth(2)?.parse().ok()?))
    });
    if let Some((runs, seconds)) = done {
        return (Some(runs), Some(seconds));
    }
    let last = log.lines().rev().find_map(|l| {
        let n = l.strip_prefix('#')?;
        let end = n.find(|c: char| !c.is_ascii_digit())?;
        n[..end].parse().ok()
    });
    (last, None)
}

/// The crash input libFuzzer wrote, from its log.
fn artifact(log: &str) -> Option<String> {
    log.lines()
        .find_map(|l| l.split_once("Test unit written to "))
        .map(|(_, path)| path.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libfuzzer_logs_are_read() {
        let log = "#2\tINITED cov: 10 ft: 10 corp: 1/1b exec/s: 0 rss: 30Mb\n\
                   #1048576\tpulse  cov: 10 ft: 10 corp: 1/1b exec/s: 349525 rss: 30Mb\n\
                   Done 1234567 runs in 3 second(s)\n";
        assert_eq!(runs(log), (Some(1_234_567), Some(3)));
        let crash = "#77\tNEW    cov: 11\n==1== ERROR: libFuzzer: deadly signal\n\
                     artifact_prefix='a/'; Test unit written to a/crash-da39a3ee\n";
        assert_eq!(runs(crash), (Some(77), None));
        assert_eq!(artifact(crash).as_deref(), Some("a/crash-da39a3ee"));
    }
}
