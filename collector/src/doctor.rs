//! `commtap doctor`: what a newcomer runs first on a node. Each check passes, warns or
//! fails, says what it found, and, where something is wrong, how to fix it; the command
//! exits non-zero when something commtap needs is missing.

use std::path::Path;

use serde::Serialize;

use crate::{
    api::{pb, transport::Target},
    attach::{self, LoadOptions},
    discover,
    symbols::{self, file::LibraryFile, LibraryKind},
};

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Pass,
    /// commtap works, with less (said what).
    Warn,
    /// commtap cannot work here until this is fixed.
    Fail,
}

/// One check's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// How it came out.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it (absent when it passed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn pass(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Pass,
            detail: detail.into(),
            fix: None,
        }
    }

    fn not(
        name: &'static str,
        status: Status,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            name,
            status,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// The oldest kernel commtap runs on: uprobe_multi links came in Linux 6.6.
const MIN_KERNEL: (u32, u32) = (6, 6);

/// Runs every check; `daemon` is the socket a node daemon would serve on.
pub async fn run(daemon: &Path) -> Vec<Check> {
    let caps = capabilities();
    let load = if caps.status == Status::Pass {
        bpf_load()
    } else {
        Check::not(
            "bpf",
            Status::Fail,
            "not tried: capabilities are missing",
            "fix the capabilities first",
        )
    };
    vec![
        kernel(),
        caps,
        load,
        btf(),
        bpffs(),
        cgroup2(),
        libraries(),
        ucx(),
        subuids(),
        daemon_check(daemon).await,
    ]
}

fn kernel() -> Check {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    if (major, minor) >= MIN_KERNEL {
        Check::pass(
            "kernel",
            format!("Linux {release}: uprobe_multi links (6.6+)"),
        )
    } else {
        Check::not(
            "kernel",
            Status::Fail,
            format!("Linux {release}: no uprobe_multi links (they came in 6.6)"),
            "run commtap on Linux 6.6 or later",
        )
    }
}

fn capabilities() -> Check {
    match attach::system::check_privileges() {
        Ok(()) => Check::pass(
            "capabilities",
            "CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_CHECKPOINT_RESTORE",
        ),
        Err(e) => Check::not(
            "capabilities",
            Status::Fail,
            e.to_string(),
            "run as root (sudo), or as the commtap systemd service (deploy/commtap.service)",
        ),
    }
}

/// Loads the BPF programs as the daemon would (the verifier's verdict on this kernel).
fn bpf_load() -> Check {
    let started = std::time::Instant::now();
    let loaded = attach::Probes::load(LoadOptions::with_ring_buffer_kib(1024)).and_then(|mut p| {
        // The daemon loads an ABI's programs at its first library: all of them here.
        p.load_all_programs()
    });
    match loaded {
        Ok(()) => Check::pass(
            "bpf",
            format!(
                "the probe programs load and verify ({:.2} s)",
                started.elapsed().as_secs_f64()
            ),
        ),
        Err(e) => Check::not(
            "bpf",
            Status::Fail,
            format!("{e:#}"),
            if e.refused_by_verifier() {
                "this kernel's verifier refused a commtap program: report it with this \
                 output, `uname -r` and `commtap --version`"
            } else {
                "check the kernel's BPF support (CONFIG_BPF_SYSCALL, CONFIG_UPROBES) and `dmesg`"
            },
        ),
    }
}

fn btf() -> Check {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        Check::pass("btf", "/sys/kernel/btf/vmlinux")
    } else {
        Check::not(
            "btf",
            Status::Warn,
            "no kernel BTF: the identity (rank, job) of a process that exits within \
             milliseconds of its first MPI call is lost",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF",
        )
    }
}

fn bpffs() -> Check {
    if attach::state::is_bpffs(Path::new("/sys/fs/bpf")) {
        Check::pass("bpffs", "/sys/fs/bpf")
    } else {
        Check::not(
            "bpffs",
            Status::Warn,
            "/sys/fs/bpf is not a bpffs: a daemon's counts cannot be kept across its restarts",
            "mount -t bpf bpf /sys/fs/bpf (the systemd unit does it)",
        )
    }
}

fn cgroup2() -> Check {
    match discover::cgroup::cgroup2_root() {
        Some(root) => Check::pass("cgroup", format!("cgroup v2 at {}", root.display())),
        None => Check::not(
            "cgroup",
            Status::Warn,
            "no cgroup v2 hierarchy: --container is unavailable (--cgroup, --slurm-job and job ids from cgroups work with v1 hierarchies)",
            "mount the unified cgroup hierarchy (systemd.unified_cgroup_hierarchy=1)",
        ),
    }
}

/// The sub-uids users are given (`/etc/subuid`), which the daemon counts as their users'
/// for every per-user cap: where the file cannot be trusted, each is a user of its own.
fn subuids() -> Check {
    use discover::{
        accounts::{Accounts, AccountsError, SUBUID_FILE},
        directory::{Answer, Directory},
    };
    /// How long the check waits for the user directory.
    const WAIT: std::time::Duration = std::time::Duration::from_secs(10);
    let path = Path::new(SUBUID_FILE);
    let (mut nobody_has, mut unanswered) = (Vec::new(), Vec::new());
    // Here, unlike the daemon's loop, the user directory is waited for, a while.
    let read = Accounts::read(path, &Default::default()).and_then(|a| {
        if a.directory_names().is_empty() {
            return Ok(a);
        }
        let mut users = Directory::default();
        users.ask_for(a.directory_names());
        let deadline = std::time::Instant::now() + WAIT;
        while users.asking() && std::time::Instant::now() < deadline {
            users.take_answers();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        users.take_answers();
        for name in a.directory_names() {
            match users.answers().get(name) {
                Some(Answer::User(_)) => {}
                Some(Answer::NoSuchUser) => nobody_has.push(name.clone()),
                _ => unanswered.push(name.clone()),
            }
        }
        Accounts::read(path, users.answers())
    });
    let some = |names: &[String]| names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    match read {
        Ok(_) if !unanswered.is_empty() => Check::not(
            "subuids",
            Status::Warn,
            format!(
                "the user directory did not answer in {WAIT:?} for {} name(s) {SUBUID_FILE} \
                 gives sub-uids to ({}): until it does, each such range counts as a user of \
                 its own",
                unanswered.len(),
                some(&unanswered)
            ),
            "check that the directory answers (sssd, nslcd): getent passwd NAME".to_string(),
        ),
        Ok(_) if !nobody_has.is_empty() => Check::not(
            "subuids",
            Status::Warn,
            format!(
                "{SUBUID_FILE} gives sub-uids to {} name(s) no user has ({}): each such range \
                 counts as a user of its own, apart from whoever it was meant for",
                nobody_has.len(),
                some(&nobody_has)
            ),
            format!("name each user as `getent passwd NAME` knows it, or by uid, in {SUBUID_FILE}"),
        ),
        Ok(a) if a.ranges().is_empty() => Check::pass(
            "subuids",
            format!("no sub-uids in {SUBUID_FILE}: no user runs processes as many"),
        ),
        Ok(a) => Check::pass(
            "subuids",
            format!(
                "{} sub-uid ranges in {SUBUID_FILE}: each sub-uid counts as the user given it",
                a.ranges().len()
            ),
        ),
        Err(e) => {
            let fix = if matches!(e, AccountsError::Untrusted(_)) {
                format!("chown root:root {SUBUID_FILE} && chmod 644 {SUBUID_FILE}")
            } else {
                format!("make {SUBUID_FILE} readable by root")
            };
            Check::not(
                "subuids",
                Status::Warn,
                format!("{e}: each sub-uid counts as a user of its own, with caps of its own"),
                fix,
            )
        }
    }
}

/// The MPI and NCCL libraries the dynamic linker would find, and whether each decodes.
fn libraries() -> Check {
    let mut probed = Vec::new();
    let mut bindings = Vec::new();
    let mut refused = Vec::new();
    for path in discover::candidate_libraries(&[]) {
        match read_kind(&path) {
            // Not an MPI of their own: probed with --call-sites, for the sites of Fortran
            // programs' calls.
            Ok(LibraryKind::Probed(lib)) if lib.fortran_bindings => {
                bindings.push(path.display().to_string());
            }
            Ok(LibraryKind::Probed(lib)) => {
                probed.push(format!("{} ({})", path.display(), lib.flavor));
            }
            Ok(LibraryKind::Unsupported(why)) => refused.push(format!("{}: {why}", path.display())),
            Ok(LibraryKind::Other | LibraryKind::Linker(_)) => {}
            Err(e) => refused.push(format!("{}: {e}", path.display())),
        }
    }
    let mut detail = if probed.is_empty() {
        "no MPI or NCCL library on the linker's search path".to_string()
    } else {
        format!("decodable: {}", probed.join("; "))
    };
    if !bindings.is_empty() {
        detail.push_str(&format!(
            "; Fortran bindings (probed with --call-sites): {}",
            bindings.join(", ")
        ));
    }
    if !refused.is_empty() {
        detail.push_str(&format!("; not decodable: {}", refused.join("; ")));
    }
    if probed.is_empty() || !refused.is_empty() {
        Check::not(
            "libraries",
            Status::Warn,
            detail,
            "libraries outside the linker's path are found when a process maps them \
             (record --lib PATH probes one before a job starts)",
        )
    } else {
        Check::pass("libraries", detail)
    }
}

/// What reading the library at `path` finds (the error said).
fn read_kind(path: &Path) -> Result<LibraryKind, String> {
    LibraryFile::open_path(path)
        .map_err(|e| e.to_string())
        .and_then(|f| symbols::read_library(&f).map_err(|e| e.to_string()))
}

/// UCX on the linker's path: whether its data path (`ucp_tag_send_nbx` and friends) can
/// be probed, and how much of it the library exports.
fn ucx() -> Check {
    let found = discover::linker_cache(|name| name.starts_with("libucp.so"));
    if found.is_empty() {
        return Check::pass("ucx", "no UCX on the linker's search path");
    }
    let mut probed = Vec::new();
    let mut refused = Vec::new();
    for path in &found {
        match read_kind(path) {
            Ok(LibraryKind::Probed(lib)) => probed.push(format!(
                "{}: {} data-path functions probed{}",
                path.display(),
                lib.probes.len(),
                if lib.missing.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({} absent: {})",
                        lib.missing.len(),
                        lib.missing.join(", ")
                    )
                }
            )),
            Ok(LibraryKind::Unsupported(why)) => refused.push(why),
            Ok(_) => refused.push(format!("{}: no UCX data path", path.display())),
            Err(e) => refused.push(format!("{}: {e}", path.display())),
        }
    }
    if refused.is_empty() {
        Check::pass(
            "ucx",
            format!(
                "UCX {}; its operations are counted inside the MPI calls that make them",
                probed.join("; ")
            ),
        )
    } else {
        Check::not(
            "ucx",
            Status::Warn,
            format!("UCX not probed: {}", refused.join("; ")),
            "nothing to do for MPI profiles (MPI routines over it are counted in full); \
             for the transport's view, a UCX that exports ucp_tag_send_nbx and friends",
        )
    }
}

async fn daemon_check(socket: &Path) -> Check {
    let target = Target::Unix(socket.to_path_buf());
    if !socket.exists() {
        return Check::not(
            "daemon",
            Status::Warn,
            format!("no daemon on {}", socket.display()),
            "systemctl enable --now commtap (or run `commtap daemon`)",
        );
    }
    let answer = async {
        let channel = crate::api::transport::connect(&target).await?;
        let mut client = crate::api::node_client(channel);
        let resp = client.list_processes(pb::ListProcessesRequest {}).await?;
        anyhow::Ok(resp.into_inner())
    };
    match tokio::time::timeout(std::time::Duration::from_secs(5), answer).await {
        Ok(Ok(list)) => Check::pass(
            "daemon",
            format!(
                "serving on {}: {} processes, {} libraries probed",
                socket.display(),
                list.processes.len(),
                list.libraries.len()
            ),
        ),
        Ok(Err(e)) => Check::not(
            "daemon",
            Status::Fail,
            format!("{}: {e:#}", socket.display()),
            "see `journalctl -u commtap`",
        ),
        Err(_) => Check::not(
            "daemon",
            Status::Fail,
            format!("{}: no answer within 5 s", socket.display()),
            "see `journalctl -u commtap`",
        ),
    }
}

/// The checks as text, one per line, fixes indented below.
pub fn render(checks: &[Check]) -> String {
    let mut o = String::new();
    for c in checks {
        let tag = match c.status {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        o.push_str(&format!("[{tag}] {:<13} {}\n", c.name, c.detail));
        if let Some(fix) = &c.fix {
            o.push_str(&format!("       {:<13} fix: {fix}\n", ""));
        }
    }
    o
}
