//! A real one-node Slurm cluster for the tests: Debian's `slurmctld`, `slurmd` and `munged`
//! (`cargo xtask setup` installs them), configured in a scratch directory as a site would
//! configure them (`proctrack/cgroup`, so each job has the cgroup Slurm makes for it, and a
//! prolog and an epilog), with their own munge key, socket and state: nothing of the
//! machine's own configuration is read or changed.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{free_port, path_str, wait_until, ChildGuard, Scratch};

/// A running cluster of one node: this host.
pub struct Slurm {
    /// Its `slurm.conf` (commands find it through `SLURM_CONF`).
    pub conf: PathBuf,
    /// The node's name (this host's short name).
    pub node: String,
    // Dropped last to first: the daemons, then munge.
    slurmd: ChildGuard,
    slurmctld: ChildGuard,
    _munged: ChildGuard,
}

/// How long the cluster has to come up, and a job to be scheduled.
const START: Duration = Duration::from_mins(1);

impl Slurm {
    /// Starts munged, slurmctld and slurmd under `scratch/slurm`, with `prolog` and
    /// `epilog` as slurm.conf's `Prolog=` and `Epilog=`. Ports are picked free; a daemon
    /// that could not bind one (taken meanwhile) is started again on others.
    #[track_caller]
    pub fn start(scratch: &Scratch, prolog: &Path, epilog: &Path) -> Slurm {
        let dir = scratch.path("slurm");
        for sub in ["state", "spool", "munge"] {
            std::fs::create_dir_all(dir.join(sub)).expect("creating the cluster's directories");
        }
        let munged = start_munged(&dir.join("munge"));
        let node = host_name();
        let conf = dir.join("slurm.conf");
        // Anything the host has mounted: cgroup v1 (hybrid hosts) or v2 without systemd.
        std::fs::write(
            dir.join("cgroup.conf"),
            "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n",
        )
        .expect("cgroup.conf");
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
        for attempt in 1.. {
            let (ctld_addr, slurmd_addr) = (free_port(), free_port());
            let (ctld_port, slurmd_port) = (port_of(&ctld_addr), port_of(&slurmd_addr));
            std::fs::write(
                &conf,
                format!(
                    "ClusterName=commtap\n\
                     SlurmctldHost={node}(127.0.0.1)\n\
                     SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n\
                     SlurmUser=root\nSlurmdUser=root\n\
                     AuthType=auth/munge\nCredType=cred/munge\n\
                     AuthInfo=socket={munge}\n\
                     StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
                     SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
                     SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
                     ProctrackType=proctrack/cgroup\nTaskPlugin=task/none\n\
                     SchedulerType=sched/builtin\nSelectType=select/linear\n\
                     SlurmdParameters=config_overrides\n\
                     MpiDefault=none\nReturnToService=2\n\
                     JobCompType=jobcomp/none\nJobAcctGatherType=jobacct_gather/none\n\
                     AccountingStorageType=accounting_storage/none\n\
                     Prolog={prolog}\nEpilog={epilog}\n\
                     NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
                     PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP \
                     OverSubscribe=FORCE:4\n",
                    munge = dir.join("munge/socket").display(),
                    d = dir.display(),
                    prolog = prolog.display(),
                    epilog = epilog.display(),
                ),
            )
            .expect("slurm.conf");
            let spawn = |program: &str, flags: &[&str], log: &str| {
                let log = std::fs::File::create(dir.join(log)).expect("log file");
                ChildGuard::spawn(
                    Command::new(program)
                        .args(flags)
                        .args(["-D", "-f"])
                        .arg(&conf)
                        .env("SLURM_CONF", &conf)
                        .stdout(log.try_clone().expect("log"))
                        .stderr(log),
                )
            };
            // `-i`: a fresh cluster, whatever a previous attempt left in its state.
            let mut slurmctld = spawn("slurmctld", &["-i"], "slurmctld.out");
            let mut slurmd = spawn("slurmd", &[], "slurmd.out");
            let deadline = Instant::now() + START;
            let up = loop {
                let exited = |c: &mut ChildGuard| c.0.try_wait().ok().flatten().is_some();
                if exited(&mut slurmctld) || exited(&mut slurmd) {
                    break false;
                }
                if node_state(&conf, &node).is_some_and(|s| s.starts_with("IDLE")) {
                    break true;
                }
                assert!(
                    Instant::now() < deadline,
                    "the Slurm node never became idle:\n{}\n{}",
                    read_log(&dir.join("slurmctld.out")),
                    read_log(&dir.join("slurmd.out"))
                );
                std::thread::sleep(Duration::from_millis(100));
            };
            if up {
                return Slurm {
                    conf,
                    node,
                    slurmd,
                    slurmctld,
                    _munged: munged,
                };
            }
            assert!(
                attempt < 5,
                "slurmctld or slurmd exited at start:\n{}\n{}",
                read_log(&dir.join("slurmctld.out")),
                read_log(&dir.join("slurmd.out"))
            );
        }
        unreachable!()
    }

    /// A Slurm command (`sbatch`, `scontrol`...) that talks to this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// Submits `script` (in `dir`, where the job runs and writes `<script>.out`) as
    /// `nobody`'s job of `tasks` tasks (munge vouches for the uid); returns the job id.
    #[track_caller]
    pub fn sbatch_as_nobody(&self, tasks: u32, dir: &Path, script: &Path) -> String {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["sbatch", "--parsable", "-n", &tasks.to_string(), "-D"])
            .arg(dir)
            .arg("-o")
            .arg(PathBuf::from(format!("{}.out", script.display())))
            .arg(script)
            .env("SLURM_CONF", &self.conf)
            .output()
            .expect("running sbatch");
        assert!(
            out.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()),
            "sbatch said {id:?}"
        );
        id
    }

    /// The job's state (`RUNNING`, `COMPLETED`...), as `scontrol show job` says it.
    pub fn job_state(&self, job: &str) -> Option<String> {
        let out = self
            .command("scontrol")
            .args(["show", "job", "-o", job])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        field(&String::from_utf8_lossy(&out.stdout), "JobState")
    }

    /// Waits until the job has ended (its epilog included) in state `COMPLETED`.
    #[track_caller]
    pub fn wait_completed(&self, job: &str, limit: Duration) {
        assert_eq!(self.wait_ended(job, limit), "COMPLETED", "Slurm job {job}");
    }

    /// Waits until the job has ended (its epilog included); its final state (`COMPLETED`,
    /// `CANCELLED`...).
    #[track_caller]
    pub fn wait_ended(&self, job: &str, limit: Duration) -> String {
        let mut state = None;
        wait_until(&format!("Slurm job {job} to end"), limit, || {
            state = self.job_state(job);
            state
                .as_deref()
                .is_some_and(|s| !["PENDING", "CONFIGURING", "RUNNING", "COMPLETING"].contains(&s))
        });
        state.unwrap_or_default()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // A job left running (a test failed) is cancelled: slurmd kills what is in its
        // cgroup, which would outlive slurmd otherwise.
        let _ = self
            .command("scancel")
            .args(["--partition", "test"])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline
            && self
                .command("squeue")
                .args(["--noheader", "--format", "%i"])
                .output()
                .is_ok_and(|o| o.status.success() && !o.stdout.is_empty())
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        for child in [&mut self.slurmd, &mut self.slurmctld] {
            // SAFETY: kill(2) of a daemon this test spawned.
            unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.0.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// munged on its own key and socket in `dir` (which it wants searchable by all, and
/// writable by none but its owner).
fn start_munged(dir: &Path) -> ChildGuard {
    use std::os::unix::fs::PermissionsExt;
    let key = dir.join("munge.key");
    let mut bytes = vec![0u8; 1024];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .expect("reading /dev/urandom");
    std::fs::write(&key, &bytes).expect("munge key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let socket = dir.join("socket");
    let log = std::fs::File::create(dir.join("munged.out")).expect("munged log");
    let munged = ChildGuard::spawn(
        Command::new("munged")
            .arg("--foreground")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--pid-file={}", dir.join("munged.pid").display()))
            .arg(format!("--log-file={}", dir.join("munged.log").display()))
            .arg(format!("--seed-file={}", dir.join("munged.seed").display()))
            .stdout(log.try_clone().expect("log"))
            .stderr(log),
    );
    wait_until("munged's socket", START, || socket.exists());
    munged
}

/// The node's state (`IDLE`, `DOWN*`...), as `scontrol show node` says it.
fn node_state(conf: &Path, node: &str) -> Option<String> {
    let out = Command::new("scontrol")
        .args(["show", "node", "-o", node])
        .env("SLURM_CONF", conf)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    field(&String::from_utf8_lossy(&out.stdout), "State")
}

/// `KEY=value` from a line of `scontrol show -o`.
fn field(line: &str, key: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
}

/// This host's short name (what `hostname -s` prints; Slurm's node name here).
pub fn host_name() -> String {
    let out = Command::new("hostname")
        .arg("-s")
        .output()
        .expect("running hostname");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn port_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(_, p)| p)
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("{}: {e}", path_str(path)))
}

/// Asserts what the Slurm epilog leaves for `job` under `reports` (its
/// `COMMTAP_REPORT_DIR`) after a job of `owner`'s whose ranks wrote `truths` (`mpi_loop`'s):
/// `<job>/<host>/` holds `profile.json`, `report.txt` and one `mpi_profile.<job>.<rank>`
/// per rank, readable by the owner only (directories 0700, files 0600, owned by `owner`;
/// the base 0711, so each owner can reach theirs), and the profile is the job's, exactly
/// its ranks and their truth. Returns the profile.
#[track_caller]
pub fn assert_epilog_report(
    reports: &Path,
    job: &str,
    owner: u32,
    truths: &[serde_json::Value],
) -> serde_json::Value {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = reports.join(job).join(host_name());
    let mut files = vec![dir.join("profile.json"), dir.join("report.txt")];
    files.extend((0..truths.len()).map(|r| dir.join(format!("mpi_profile.{job}.{r}"))));
    // The base: others may pass through to their own job's directory, not list it.
    let base = std::fs::metadata(reports)
        .expect("the report base")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(base, 0o711, "{base:o}");
    for d in [reports.join(job), dir.clone()] {
        let m = std::fs::metadata(&d).expect("report directory");
        assert_eq!(m.permissions().mode() & 0o777, 0o700, "{}", d.display());
        assert_eq!(m.uid(), owner, "{}", d.display());
    }
    for f in &files {
        let m = std::fs::metadata(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(m.permissions().mode() & 0o777, 0o600, "{}", f.display());
        assert_eq!(m.uid(), owner, "{}", f.display());
    }
    let profile = crate::read_json(&dir.join("profile.json"));
    assert_eq!(profile["job"], job);
    let mut pids: Vec<u64> = profile["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .filter_map(|r| r["pid"].as_u64())
        .collect();
    pids.sort_unstable();
    let mut want = crate::pids_of(truths);
    want.sort_unstable();
    assert_eq!(pids, want, "the job's ranks, and no other process");
    crate::assert_loop_ranks(&profile, truths);
    profile
}
