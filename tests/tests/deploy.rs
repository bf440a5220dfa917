//! The shipped deployment files are valid: the systemd unit passes `systemd-analyze
//! verify`, the Slurm scripts are valid shell, and the capabilities the unit grants are all
//! the daemon needs.

use std::{path::Path, process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

#[test]
fn systemd_unit_verifies() {
    let scratch = Scratch::new("deploy");
    let unit = std::fs::read_to_string(repo_root().join("deploy/systemd/commtap.service"))
        .expect("unit file");
    // verify checks that ExecStart's binary exists: point it at the one under test.
    let unit = unit.replace(
        "/usr/local/bin/commtap",
        commtap_bin().to_str().expect("utf8"),
    );
    let path = scratch.path("commtap.service");
    std::fs::write(&path, unit).expect("writing the unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("running systemd-analyze");
    let msgs = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !msgs.contains("commtap.service:"),
        "systemd-analyze verify:\n{msgs}"
    );
}

#[test]
fn slurm_scripts_are_valid_shell() {
    for script in ["prolog.sh", "epilog.sh"] {
        let path = repo_root().join("deploy/slurm").join(script);
        let out = Command::new("sh")
            .arg("-n")
            .arg(&path)
            .output()
            .expect("running sh -n");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The capabilities the unit's `CapabilityBoundingSet=` grants, as `setpriv` wants them
/// (`+bpf,+perfmon,...`).
fn unit_capabilities() -> String {
    let unit = std::fs::read_to_string(repo_root().join("deploy/systemd/commtap.service"))
        .expect("unit file");
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit sets CapabilityBoundingSet=")
        .split_whitespace()
        .map(|c| {
            let name = c.strip_prefix("CAP_").expect("CAP_ names");
            format!("+{}", name.to_lowercase())
        })
        .collect();
    caps.join(",")
}

/// The daemon does its whole job (probes a root MPI job and counts it exactly, reads the
/// ranks' identities and libraries through /proc) with no capability beyond those the unit
/// grants, CAP_SYS_ADMIN not among them: the file systems it would mount are mounted by
/// the unit's privileged ExecStartPre.
#[test]
fn the_daemon_needs_no_capability_beyond_the_units() {
    let caps = unit_capabilities();
    assert!(
        !caps.contains("sys_admin"),
        "the unit grants CAP_SYS_ADMIN: {caps}"
    );
    sh("mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing");
    sh("mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf");
    let scratch = Scratch::new("unit-capabilities");
    let bounding = format!("--bounding-set=-all,{caps}");
    let state = format!("/sys/fs/bpf/commtap-caps-{}", std::process::id());
    let daemon = Daemon::start(
        &scratch,
        &["setpriv", &bounding, "--inh-caps=-all"],
        &[],
        &["--state-dir", &state],
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.child.0.id()))
        .expect("the daemon's status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .expect("CapEff");
    assert_eq!(eff & (1 << 21), 0, "the daemon runs without CAP_SYS_ADMIN");
    let truths = run_truth_job(&scratch.path("truth"), Mpi::OpenMpi, 2);
    let pids = pids_of(&truths);
    wait_for_exited(&daemon.target, &pids);
    let job = pids[0].to_string();
    let profile = report_json(&["report", "--from", &daemon.target, "--job", &job]);
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    nobodys_private_library_is_counted(&scratch, &daemon);
    daemon.stop(&scratch);
    let _ = std::fs::remove_dir_all(&state);
}

/// nobody runs an Open MPI job on its own copy of `libmpi.so.40`: the daemon must read
/// nobody's maps (CAP_SYS_PTRACE) and open the copy through /proc/PID/map_files
/// (CAP_CHECKPOINT_RESTORE) to probe it. Counts after `go` equal the ranks' truths.
fn nobodys_private_library_is_counted(scratch: &Scratch, daemon: &Daemon) {
    let dir = nobody_dir(scratch, "nobody");
    let copy = dir.join("libmpi.so.40");
    copy_as_nobody(Path::new("/lib/x86_64-linux-gnu/libmpi.so.40"), &copy);
    let prog = build_program("mpi_loop.c", Mpi::OpenMpi);
    let launcher = Mpi::OpenMpi.launcher(2);
    let mut cmd = as_nobody(Path::new(&launcher[0]));
    cmd.args(&launcher[1..])
        .args(["-x", "LD_LIBRARY_PATH"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("HOME", &dir)
        .arg(&prog)
        .args([dir.join("ready"), dir.join("go")])
        .arg("20")
        .arg(dir.join("truth"));
    let mut job = ChildGuard::spawn(&mut cmd);
    wait_until("nobody's job to be ready", LIMIT, || {
        dir.join("ready").exists()
    });
    let mut ranks = Vec::new();
    wait_until("both ranks to run", LIMIT, || {
        ranks = pids_running(&prog).into_iter().map(u64::from).collect();
        ranks.len() == 2
    });
    wait_for_state(&daemon.target, &ranks, "probed");
    let ps = commtap_output(&["ps", "--from", &daemon.target]);
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        ps.lines()
            .any(|l| l.starts_with("library ") && l.contains(path_str(&copy))),
        "nobody's copy of libmpi is probed:\n{ps}"
    );
    std::fs::write(dir.join("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "nobody's job failed");
    wait_for_exited(&daemon.target, &ranks);
    let profile = report_json(&["report", "--from", &daemon.target]);
    for truth in read_truths(&dir.join("truth"), 2) {
        let pid = truth["pid"].as_u64().expect("pid");
        let got = routine_table(&rank_by_pid(&profile, pid)["routines"]);
        // Before `go` (MPI_Init, a Barrier ...) is not in the truth: compare what it holds
        // but the Barrier, which both sides of `go` call.
        for (routine, counts) in routine_table(&truth["routines"]) {
            if routine != "MPI_Barrier" {
                assert_eq!(got.get(&routine), Some(&counts), "pid {pid}: {routine}");
            }
        }
    }
}

/// The Slurm epilog, run as slurmd runs it (as root, the job's id and owner in its
/// environment) after a job of 2 ranks: it writes the job's mpitrace files, JSON profile
/// and text report under `COMMTAP_REPORT_DIR/<job>/<host>/`, readable by the job's owner
/// only (directories 0700, files 0600, owned by SLURM_JOB_UID; the base 0711, so each
/// owner can reach theirs), and the profile is the job's truth. A job id that could climb out of the directory gets no report.
#[test]
fn the_slurm_epilog_hands_the_report_to_the_jobs_owner_only() {
    let scratch = Scratch::new("epilog");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let job_id = format!("{}", 7_000_000 + std::process::id());
    let (mut job, ranks) =
        start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 20, &[("SLURM_JOB_ID", &job_id)]);
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let pids: Vec<u64> = ranks.iter().map(|p| u64::from(*p)).collect();
    wait_for_exited(&daemon.target, &pids);

    let reports = scratch.path("reports");
    let bin_dir = commtap_bin().parent().expect("bin dir").to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let epilog = |id: &str| {
        Command::new("sh")
            .arg(repo_root().join("deploy/slurm/epilog.sh"))
            .env("PATH", &path)
            .env("SLURM_JOB_ID", id)
            .env("SLURM_JOB_UID", NOBODY.to_string())
            .env("SLURM_JOB_GID", NOBODY.to_string())
            .env("COMMTAP_REPORT_DIR", &reports)
            .env("COMMTAP_SOCKET", &daemon.socket)
            .output()
            .expect("running the epilog")
    };
    let out = epilog(&job_id);
    assert!(
        out.status.success(),
        "epilog: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_epilog_report(
        &reports,
        &job_id,
        NOBODY,
        &read_truths(&scratch.path("truth"), 2),
    );
    let host = host_name();

    // A job id that is a path gets nothing written anywhere.
    let out = epilog("../../etc");
    assert!(out.status.success(), "the epilog never fails the job");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unexpected job id"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!reports.join("../../etc").join(&host).exists());
    daemon.stop(&scratch);
}

/// `commtap doctor` passes on this machine (what CI runs on) and lists the MPI libraries
/// setup installed; without CAP_BPF it fails, exits 1, and names the capability.
#[test]
fn doctor_passes_here_and_names_a_missing_capability() {
    let scratch = Scratch::new("doctor");
    let absent = scratch.path("no-daemon.sock");
    let out = commtap_output(&["doctor", "--format", "json", "--socket", path_str(&absent)]);
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json: {e}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(out.status.success(), "{checks:#}");
    let check = |name: &str| -> serde_json::Value {
        checks
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} check in {checks:#}"))
            .clone()
    };
    for name in [
        "kernel",
        "capabilities",
        "bpf",
        "btf",
        "bpffs",
        "cgroup",
        "subuids",
    ] {
        assert_eq!(check(name)["status"], "pass", "{:#}", check(name));
    }
    let libs = check("libraries");
    let detail = libs["detail"].as_str().expect("detail");
    assert!(
        detail.contains("libmpi.so.40 (Open MPI") && detail.contains("libmpich.so.12 (MPICH"),
        "{libs:#}"
    );
    // Debian's UCX (libucx0, beneath its MPICH and Open MPI): its data path probed.
    let ucx = check("ucx");
    assert_eq!(ucx["status"], "pass", "{ucx:#}");
    assert!(
        ucx["detail"]
            .as_str()
            .is_some_and(|d| d.contains("libucp.so") && d.contains("data-path functions probed")),
        "{ucx:#}"
    );
    let daemon = check("daemon");
    assert_eq!(daemon["status"], "warn", "{daemon:#}");
    assert!(daemon["fix"]
        .as_str()
        .is_some_and(|f| f.contains("systemctl")));

    let out = Command::new("setpriv")
        .args(["--bounding-set=-bpf", "--inh-caps=-all"])
        .arg(commtap_bin())
        .args(["doctor", "--socket", path_str(&absent)])
        .output()
        .expect("setpriv");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("[FAIL] capabilities") && l.contains("CAP_BPF")),
        "{text}"
    );
}

/// The commands `commtap --help` lists (but `help`).
fn listed_commands() -> Vec<String> {
    let out = commtap_output(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        // A command's line starts at column 2; continuation lines are indented further.
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

/// Completion scripts load in bash and offer every command `--help` lists (zsh's and
/// fish's name them all); the manual pages are one per listed command, render in groff
/// without a warning, and carry each command's options.
#[test]
fn completions_and_manual_pages_cover_every_command() {
    let scratch = Scratch::new("completions");
    let commands = listed_commands();
    assert!(
        commands.len() >= 10 && commands.iter().any(|c| c == "record"),
        "{commands:?}"
    );

    let script = scratch.path("commtap.bash");
    let out = commtap_output(&["completions", "bash"]);
    assert!(out.status.success());
    std::fs::write(&script, &out.stdout).expect("script");
    let offered = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && COMP_WORDS=(commtap '') && COMP_CWORD=1 && _commtap commtap '' commtap \
             && printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            path_str(&script)
        ))
        .output()
        .expect("bash");
    assert!(
        offered.status.success(),
        "{}",
        String::from_utf8_lossy(&offered.stderr)
    );
    let offered = String::from_utf8_lossy(&offered.stdout).into_owned();
    for c in &commands {
        assert!(
            offered.lines().any(|l| l == c),
            "bash does not offer {c}: {offered}"
        );
    }
    for shell in ["zsh", "fish"] {
        let out = commtap_output(&["completions", shell]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{shell}");
        for c in &commands {
            assert!(text.contains(c.as_str()), "{shell} does not name {c}");
        }
    }

    let dir = scratch.path("man");
    let out = commtap_output(&["man", "--out", path_str(&dir)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .expect("man dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    let mut wanted: Vec<String> = commands.iter().map(|c| format!("commtap-{c}.1")).collect();
    wanted.push("commtap.1".into());
    wanted.sort();
    assert_eq!(
        pages, wanted,
        "one page per listed command, none for hidden ones"
    );
    for page in &pages {
        let rendered = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww"])
            .arg(dir.join(page))
            .output()
            .expect("groff");
        let warnings = String::from_utf8_lossy(&rendered.stderr);
        assert!(
            rendered.status.success() && warnings.is_empty(),
            "{page}: {warnings}"
        );
    }
    let record = std::fs::read_to_string(dir.join("commtap-record.1")).expect("record page");
    assert!(
        record.contains("\\-\\-trace") && record.contains("\\-\\-pid"),
        "{record}"
    );
}

/// Options come from the file, the environment over the file, flags over both: a real
/// daemon serves on the socket each of them names in turn (and logs JSON lines when told
/// to, from the file); `config --show` says where each value came from, and `--help` names
/// each option's variable.
#[test]
fn a_daemon_takes_its_options_from_the_file_the_environment_and_flags_in_that_order() {
    let scratch = Scratch::new("config-precedence");
    let (from_file, from_env, from_flag) = (
        scratch.path("file.sock"),
        scratch.path("env.sock"),
        scratch.path("flag.sock"),
    );
    let config = scratch.path("commtap.toml");
    std::fs::write(
        &config,
        format!(
            "log = \"info\"\nlog_format = \"json\"\n\n[daemon]\nsocket = \"{}\"\nno_state = true\n",
            from_file.display()
        ),
    )
    .expect("config file");
    let config = path_str(&config);
    let env_socket = from_env.display().to_string();
    for (env, flag, expected) in [
        (None, None, &from_file),
        (Some(env_socket.clone()), None, &from_env),
        (Some(env_socket), Some(path_str(&from_flag)), &from_flag),
    ] {
        let mut args = vec!["--config", config, "daemon"];
        if let Some(flag) = flag {
            args.extend(["--socket", flag]);
        }
        let env: Vec<(&str, String)> = env
            .into_iter()
            .map(|v| ("COMMTAP_DAEMON_SOCKET", v))
            .collect();
        let shown = {
            let mut show = vec!["--config", config, "config", "--show"];
            show.extend(&args[2..]);
            let out = Command::new(commtap_bin())
                .args(&show)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .output()
                .expect("config --show");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let source = if flag.is_some() {
            "flag"
        } else if !env.is_empty() {
            "environment"
        } else {
            "file"
        };
        let line = shown
            .lines()
            .find(|l| l.starts_with("socket "))
            .unwrap_or_else(|| panic!("no socket in {shown}"));
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            ["socket", source, &expected.display().to_string()],
            "{shown}"
        );
        let daemon = spawn_commtap_with_env(&scratch, &args, &env);
        wait_until("the daemon's socket", LIMIT, || expected.exists());
        for other in [&from_file, &from_env, &from_flag] {
            assert!(
                other == expected || !other.exists(),
                "{} exists",
                other.display()
            );
        }
        // SAFETY: kill(2) of the daemon we spawned.
        unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
        let run = finish_ok(&scratch, daemon, LIMIT);
        // Its log, as the file asked: one JSON object per line.
        let serving = run
            .stderr
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))
            })
            .find(|v| {
                v["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("serving unix://"))
            })
            .unwrap_or_else(|| panic!("no JSON line says where it serves: {}", run.stderr));
        assert_eq!(serving["level"], "INFO", "{serving}");
        assert!(
            serving["message"]
                .as_str()
                .is_some_and(|m| m.ends_with(&expected.display().to_string())),
            "{serving}"
        );
    }
    let help = commtap_output(&["daemon", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("[env: COMMTAP_DAEMON_LISTEN="), "{help}");
}

/// The example configuration holds every option `--help` lists, for the daemon and the
/// aggregator, and is a valid file once every option in it is uncommented.
#[test]
fn the_example_configuration_names_every_option_and_parses() {
    let scratch = Scratch::new("config-example");
    let out = commtap_output(&["config", "--example"]);
    assert!(out.status.success());
    let example = String::from_utf8_lossy(&out.stdout).into_owned();
    // `#key = value    # VARIABLE` lines are options (their defaults, or a placeholder
    // where they have none); `# text` lines their help.
    let uncomment = |with_placeholders: bool| -> String {
        example
            .lines()
            .filter_map(|l| match l.strip_prefix('#') {
                Some(rest) if !rest.starts_with(' ') && rest.contains(" = ") => (with_placeholders
                    || !rest.ends_with("(unset by default)"))
                .then(|| rest.split("    #").next().expect("a key").to_string()),
                Some(_) => None,
                None => Some(l.to_string()),
            })
            .map(|l| l + "\n")
            .collect()
    };
    let uncommented = uncomment(true);
    for command in ["daemon", "aggregator"] {
        let help = commtap_output(&[command, "--help"]);
        let help = String::from_utf8_lossy(&help.stdout);
        let options: Vec<String> = help
            .lines()
            .filter_map(|l| {
                // An option's own line: `  -p, --pid <PID>` or `      --listen <ADDR>`.
                let mut words = l.split_whitespace();
                let first = words.next().filter(|w| w.starts_with('-'))?;
                let long = [first]
                    .into_iter()
                    .chain(words.next())
                    .find(|w| w.starts_with("--"))?;
                let long = long.trim_start_matches("--").trim_end_matches(',');
                (!["help", "version", "config"].contains(&long)).then(|| long.replace('-', "_"))
            })
            .collect();
        let section = uncommented
            .split(&format!("[{command}]\n"))
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .unwrap_or_else(|| panic!("no [{command}] in the example"));
        let top = uncommented.split("\n[").next().expect("top-level keys");
        for option in &options {
            let key = format!("\n{option} = ");
            assert!(
                section.contains(&key) || top.contains(&key) || section.starts_with(&key[1..]),
                "`commtap {command} --{option}` is not in the example"
            );
        }
    }
    // Its defaults uncommented, it is a file commtap takes: each command runs with it (the
    // log filter changed, to see that the file is read).
    let defaults = uncomment(false);
    assert!(defaults.contains("\nlog = \"warn\"\n"), "{defaults}");
    let defaults = defaults.replace("\nlog = \"warn\"\n", "\nlog = \"debug\"\n");
    let file = scratch.path("example.toml");
    std::fs::write(&file, &defaults).expect("write");
    for command in ["daemon", "aggregator", "record", "report", "top"] {
        let out = commtap_output(&["--config", path_str(&file), "config", "--show", command]);
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{command}: {}\n{defaults}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            shown
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["log", "file", "debug"]),
            "{command}: the log filter is not the file's\n{shown}"
        );
    }
    // A typo is refused, naming what is valid.
    std::fs::write(&file, "[daemon]\nkeep_exitted = \"1h\"\n").expect("write");
    let out = commtap_output(&["--config", path_str(&file), "config", "--show", "daemon"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("keep_exitted is no option of `commtap daemon`"),
        "{stderr}"
    );
}

/// Removes the package whatever the test's outcome (the machine is left as it was).
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "commtap"]).output();
    }
}

/// What dpkg says of the package: its status line, or None if it knows none.
fn dpkg_status() -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${Status}", "commtap"])
        .output()
        .expect("dpkg-query");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        .filter(|s| !s.contains("not-installed"))
}

/// The Debian package (`deploy/debian/build-deb.sh`, what `cargo xtask package` runs on
/// the release build) installs with `dpkg -i`: its binary runs, its unit verifies, the
/// manual pages, completions, Slurm scripts and configuration are where they belong;
/// `dpkg -r` leaves nothing but the configuration, and `dpkg -P` not even that.
#[test]
fn the_debian_package_installs_runs_and_removes_cleanly() {
    let scratch = Scratch::new("debian-package");
    assert_eq!(
        dpkg_status(),
        None,
        "a commtap package is installed on this machine: this test would replace it"
    );
    let out = Command::new(repo_root().join("deploy/debian/build-deb.sh"))
        .arg(commtap_bin())
        .args(["0.0.0~test", path_str(&scratch.0), "none"])
        .output()
        .expect("build-deb.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let _purge = Purge;
    let sh = |args: &[&str]| {
        let out = Command::new(args[0])
            .args(&args[1..])
            .output()
            .expect("a command");
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    sh(&["dpkg", "-i", &deb]);
    assert!(dpkg_status().is_some_and(|s| s == "install ok installed"));
    let version = sh(&["/usr/bin/commtap", "--version"]);
    assert!(version.starts_with("commtap "), "{version}");
    let verify = Command::new("systemd-analyze")
        .args(["verify", "/lib/systemd/system/commtap.service"])
        .output()
        .expect("systemd-analyze");
    let msgs = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && !msgs.contains("commtap.service:"),
        "systemd-analyze verify:\n{msgs}"
    );
    let unit = std::fs::read_to_string("/lib/systemd/system/commtap.service").expect("unit");
    assert!(unit.contains("ExecStart=/usr/bin/commtap daemon"), "{unit}");
    assert!(
        unit.contains("EnvironmentFile=-/etc/default/commtap"),
        "{unit}"
    );
    for page in listed_commands()
        .iter()
        .map(|c| format!("commtap-{c}.1.gz"))
        .chain(["commtap.1.gz".to_string()])
    {
        sh(&["gzip", "-t", &format!("/usr/share/man/man1/{page}")]);
    }
    for (file, needle) in [
        ("/usr/share/bash-completion/completions/commtap", "_commtap"),
        (
            "/usr/share/zsh/vendor-completions/_commtap",
            "#compdef commtap",
        ),
        (
            "/usr/share/fish/vendor_completions.d/commtap.fish",
            "complete -c commtap",
        ),
        ("/usr/share/commtap/slurm/prolog.sh", "systemctl"),
        ("/usr/share/commtap/slurm/epilog.sh", "commtap report"),
        ("/etc/default/commtap", "COMMTAP_DAEMON_"),
    ] {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(needle), "{file}");
    }
    let example = sh(&["/usr/bin/commtap", "config", "--example"]);
    assert_eq!(
        std::fs::read_to_string("/etc/commtap/commtap.toml").expect("the configuration"),
        example
    );
    // The installed binary reads it (every line commented out: the defaults).
    let shown = sh(&["/usr/bin/commtap", "config", "--show", "daemon"]);
    assert!(
        shown.contains("# configuration file: /etc/commtap/commtap.toml"),
        "{shown}"
    );

    sh(&["dpkg", "-r", "commtap"]);
    assert_eq!(dpkg_status().as_deref(), Some("deinstall ok config-files"));
    for gone in [
        "/usr/bin/commtap",
        "/lib/systemd/system/commtap.service",
        "/usr/share/man/man1/commtap.1.gz",
        "/usr/share/commtap",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is left after dpkg -r");
    }
    assert!(
        Path::new("/etc/commtap/commtap.toml").exists(),
        "the configuration is kept"
    );
    sh(&["dpkg", "-P", "commtap"]);
    assert_eq!(dpkg_status(), None);
    for gone in ["/etc/commtap", "/etc/default/commtap"] {
        assert!(!Path::new(gone).exists(), "{gone} is left after dpkg -P");
    }
}
