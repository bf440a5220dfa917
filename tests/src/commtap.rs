//! Running the real `commtap` binary: record, the daemon, its clients, certificates.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{
    commtap_bin, mpi_env, path_str, pid_list, read_json, sh, wait_until, ChildGuard, Scratch,
};

/// What a finished `commtap` run left.
pub struct Run {
    /// Its exit status.
    pub status: std::process::ExitStatus,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// What [`record_job`] wrote: the JSON profile, the text report, and the prefix of the
/// truths the program wrote (its last argument).
pub struct RecordedJob {
    /// The JSON profile.
    pub json: PathBuf,
    /// The text report.
    pub text: PathBuf,
    /// The truths' prefix (`<prefix>.<rank>.json`).
    pub truths: PathBuf,
}

/// `commtap record -o TEXT --json JSON -- <np ranks of mpi> PROGRAM ARGS... TRUTHS`, run in
/// `scratch` (its files named with `tag`) with `env` added, to its successful end.
#[track_caller]
pub fn record_job(
    scratch: &Scratch,
    tag: &str,
    (mpi, np): (crate::Mpi, u32),
    (program, args): (&Path, &[String]),
    env: &[(&str, String)],
) -> RecordedJob {
    let job = RecordedJob {
        json: scratch.path(&format!("profile{tag}.json")),
        text: scratch.path(&format!("report{tag}.txt")),
        truths: scratch.path(&format!("truth{tag}")),
    };
    let mut all: Vec<String> = [
        "record",
        "-o",
        path_str(&job.text),
        "--json",
        path_str(&job.json),
    ]
    .map(String::from)
    .to_vec();
    all.push("--".into());
    all.extend(mpi.launcher(np));
    all.push(program.display().to_string());
    all.extend(args.iter().cloned());
    all.push(job.truths.display().to_string());
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    finish_ok(
        scratch,
        spawn_commtap_with_env(scratch, &all, env),
        Duration::from_mins(5),
    );
    job
}

/// Starts `commtap` with `args`, its output going to files in `scratch`.
#[track_caller]
pub fn spawn_commtap(scratch: &Scratch, args: &[&str]) -> ChildGuard {
    spawn_commtap_with_env(scratch, args, &[])
}

/// [`spawn_commtap`] with extra environment variables (which a launched job inherits).
pub fn spawn_commtap_with_env(
    scratch: &Scratch,
    args: &[&str],
    env: &[(&str, String)],
) -> ChildGuard {
    let out = std::fs::File::create(scratch.path("commtap.stdout")).expect("stdout file");
    let err = std::fs::File::create(scratch.path("commtap.stderr")).expect("stderr file");
    let mut cmd = Command::new(commtap_bin());
    mpi_env(&mut cmd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    ChildGuard::spawn(&mut cmd)
}

/// Waits for a `commtap` started by [`spawn_commtap`] and collects its output.
#[track_caller]
pub fn finish_commtap(scratch: &Scratch, mut child: ChildGuard, limit: Duration) -> Run {
    let status = child.wait_with_limit(limit);
    let read = |f: &str| std::fs::read_to_string(scratch.path(f)).unwrap_or_default();
    Run {
        status,
        stdout: read("commtap.stdout"),
        stderr: read("commtap.stderr"),
    }
}

/// Waits for a `commtap` started by [`spawn_commtap`], which must succeed.
#[track_caller]
pub fn finish_ok(scratch: &Scratch, child: ChildGuard, limit: Duration) -> Run {
    let run = finish_commtap(scratch, child, limit);
    assert!(
        run.status.success(),
        "commtap failed: {}\n{}",
        run.status,
        run.stderr
    );
    run
}

/// `record --format text -o TEXT --json JSON`: the start of a `record` command line that
/// writes both reports (the caller adds its other options, `--` and the job).
pub fn record_text_and_json(text: &Path, json: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["record", "--format", "text", "-o"]
        .map(String::from)
        .to_vec();
    args.push(text.display().to_string());
    args.push("--json".into());
    args.push(json.display().to_string());
    args
}

/// Runs `commtap` with `args` to completion (at most `limit`).
#[track_caller]
pub fn run_commtap(scratch: &Scratch, args: &[&str], limit: Duration) -> Run {
    let child = spawn_commtap(scratch, args);
    finish_commtap(scratch, child, limit)
}

/// Starts `commtap record --pid PIDS --format json -o OUT` and waits until it has attached;
/// returns it and OUT.
#[track_caller]
pub fn record_attached(scratch: &Scratch, pids: &[u32]) -> (ChildGuard, PathBuf) {
    record_attached_with(scratch, pids, &[])
}

/// [`record_attached`] with more arguments for `record`.
#[track_caller]
pub fn record_attached_with(
    scratch: &Scratch,
    pids: &[u32],
    extra: &[&str],
) -> (ChildGuard, PathBuf) {
    let out = scratch.path("profile.json");
    let ready = scratch.path("commtap.ready");
    let pids = pid_list(pids);
    let mut args = vec![
        "record",
        "--pid",
        &pids,
        "--format",
        "json",
        "-o",
        path_str(&out),
        "--ready-file",
        path_str(&ready),
    ];
    args.extend_from_slice(extra);
    let commtap = spawn_commtap(scratch, &args);
    wait_until("commtap to attach", Duration::from_mins(1), || {
        ready.exists()
    });
    (commtap, out)
}

/// Starts `commtap trace --from TARGET -o t.json [extra..]` (in `scratch`) and waits until
/// every call from then on goes into the trace (its `--ready-file`); returns it and the
/// trace's path.
#[track_caller]
pub fn spawn_streaming_trace(
    scratch: &Scratch,
    target: &str,
    extra: &[&str],
) -> (ChildGuard, PathBuf) {
    let trace = scratch.path("t.json");
    let ready = scratch.path("trace.ready");
    let mut args = vec![
        "trace",
        "--from",
        target,
        "-o",
        path_str(&trace),
        "--ready-file",
        path_str(&ready),
    ];
    args.extend_from_slice(extra);
    let tracer = spawn_commtap(scratch, &args);
    wait_until("the trace to stream", Duration::from_mins(5), || {
        ready.exists()
    });
    (tracer, trace)
}

/// A `commtap daemon` serving on a socket in its scratch directory; `stop` shuts it down
/// with SIGTERM and checks that it exits cleanly.
pub struct Daemon {
    /// The daemon process.
    pub child: ChildGuard,
    /// Its socket.
    pub socket: PathBuf,
    /// `unix://` + socket.
    pub target: String,
    /// Its peak resident memory once its socket was there, KiB: what it holds before any
    /// work (BPF maps and the ring buffer are mapped by then).
    pub started_peak_kib: u64,
}

impl Daemon {
    /// Starts `[prefix..] commtap [global..] daemon --socket S [args..]` (prefix: e.g.
    /// `ip netns exec NS`) and waits for its socket.
    #[track_caller]
    pub fn start(scratch: &Scratch, prefix: &[&str], global: &[&str], args: &[&str]) -> Daemon {
        let socket = scratch.path("commtap.sock");
        let out = std::fs::File::create(scratch.path("commtap.stdout")).expect("stdout file");
        let err = std::fs::File::create(scratch.path("commtap.stderr")).expect("stderr file");
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(commtap_bin());
                c
            }
            None => Command::new(commtap_bin()),
        };
        cmd.args(global)
            .args(["daemon", "--socket", path_str(&socket)])
            .args(args)
            .stdout(out)
            .stderr(err);
        let child = ChildGuard::spawn(&mut cmd);
        wait_until("the daemon's socket", Duration::from_mins(1), || {
            socket.exists()
        });
        let target = format!("unix://{}", socket.display());
        let started_peak_kib = crate::peak_kib(child.0.id());
        Daemon {
            child,
            socket,
            target,
            started_peak_kib,
        }
    }

    /// SIGTERM; the daemon must exit cleanly and remove its socket.
    #[track_caller]
    pub fn stop(self, scratch: &Scratch) {
        // SAFETY: kill(2) of the daemon we spawned (`ip netns exec` execs it: same pid).
        unsafe { libc::kill(self.child.0.id() as i32, libc::SIGTERM) };
        let run = finish_commtap(scratch, self.child, Duration::from_mins(1));
        assert!(
            run.status.success(),
            "daemon exit: {}\n{}",
            run.status,
            run.stderr
        );
        assert!(!self.socket.exists(), "the socket is removed at shutdown");
    }
}

/// [`http_get`], or None while nothing listens at `addr` (a server still starting: for
/// polls).
pub fn try_http_get(addr: &str, path: &str) -> Option<String> {
    std::net::TcpStream::connect(addr).ok()?;
    Some(http_get(addr, path))
}

/// A minimal HTTP/1.0 GET against a server of ours on loopback; returns the body.
#[track_caller]
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("response");
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP body in {resp:?}"));
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    body.to_string()
}

/// A test CA and a server certificate for 127.0.0.1 and the test namespaces' host
/// addresses (10.231.1.1, 10.231.2.1): (ca, cert, key).
pub fn make_certs(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let d = dir.display();
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,IP:10.231.1.1,IP:10.231.2.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext.cnf");
    sh(&format!(
        "cd {d} && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 \
         -subj /CN=commtap-test-ca 2>&1 && openssl req -newkey rsa:2048 -nodes -keyout server.key \
         -out server.csr -subj /CN=aggregator 2>&1 && openssl x509 -req -in server.csr -CA ca.pem \
         -CAkey ca.key -CAcreateserial -out server.pem -days 1 -extfile ext.cnf 2>&1"
    ));
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

/// A client certificate with common name `cn` and, if given, organizational unit `ou` (an
/// aggregator reads a caller's role there), signed by the CA [`make_certs`] made in `dir`:
/// (cert, key). It serves as a server's too (for `cn` and 127.0.0.1): a daemon's one
/// identity pushes to the aggregator and serves its `--listen`.
pub fn make_client_cert(dir: &Path, cn: &str, ou: Option<&str>) -> (PathBuf, PathBuf) {
    let d = dir.display();
    let name = format!("{cn}-{}", ou.unwrap_or("none"));
    std::fs::write(
        dir.join(format!("{name}.cnf")),
        format!("subjectAltName=DNS:{cn},IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth,serverAuth\n"),
    )
    .expect("client cnf");
    let subject = match ou {
        Some(ou) => format!("/OU={ou}/CN={cn}"),
        None => format!("/CN={cn}"),
    };
    sh(&format!(
        "cd {d} && openssl req -newkey rsa:2048 -nodes -keyout {name}.key -out {name}.csr \
         -subj {subject} 2>&1 && openssl x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key \
         -CAcreateserial -out {name}.pem -days 1 -extfile {name}.cnf 2>&1"
    ));
    (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    )
}

/// Starts `program` (which creates `scratch/ready` once it mapped what it maps), and
/// asserts `commtap record --pid` refuses it with exit status 2 and `needle` in its message.
#[track_caller]
pub fn assert_record_refuses(scratch: &Scratch, program: &mut Command, needle: &str) {
    let app = ChildGuard::spawn(program);
    wait_until("the program to be ready", Duration::from_mins(1), || {
        scratch.path("ready").exists()
    });
    let pid = app.0.id().to_string();
    let run = run_commtap(scratch, &["record", "--pid", &pid], Duration::from_mins(2));
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(run.stderr.contains(needle), "{}", run.stderr);
}

/// Runs `commtap ARGS` to completion and returns its output.
pub fn commtap_output(args: &[&str]) -> std::process::Output {
    Command::new(commtap_bin())
        .args(args)
        .output()
        .expect("running commtap")
}

/// `commtap ARGS --format json` (a `report`), which must succeed: its JSON profile.
#[track_caller]
pub fn report_json(args: &[&str]) -> Value {
    let out = commtap_output(&[args, &["--format", "json"]].concat());
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let profile = serde_json::from_slice(&out.stdout).expect("JSON profile");
    crate::assert_valid_profile(&profile);
    profile
}

/// A job of `mpi_stuck` (2 ranks) hung for certain: rank 0 inside its `MPI_Sendrecv`,
/// rank 1 outside MPI until `go` exists.
pub struct StuckJob {
    /// The launcher.
    pub job: ChildGuard,
    /// The file that releases it.
    pub go: PathBuf,
    /// The program.
    pub program: PathBuf,
    /// Rank 0's pid.
    pub zero: u64,
    /// Rank 1's pid.
    pub one: u64,
    /// The source line of rank 0's `MPI_Sendrecv`, as the program wrote it down.
    pub line: u64,
}

/// Starts `mpi_stuck` by `mpi` in `scratch` (numbered in Slurm job `job_id`, where given)
/// and waits until rank 0 is inside its `MPI_Sendrecv` for certain.
#[track_caller]
pub fn start_stuck_job(scratch: &Scratch, mpi: crate::Mpi, job_id: Option<&str>) -> StuckJob {
    let (go, prefix) = (scratch.path("go"), scratch.path("truth"));
    let program = crate::build_program("mpi_stuck.c", mpi);
    let job = ChildGuard::spawn(&mut crate::mpi_launch(
        mpi,
        2,
        job_id,
        &program,
        &[path_str(&go), path_str(&prefix)],
    ));
    let stuck = PathBuf::from(format!("{}.stuck", prefix.display()));
    wait_until(
        "rank 0 inside its MPI_Sendrecv",
        Duration::from_mins(5),
        || stuck.exists(),
    );
    let truths = crate::read_truths(&prefix, 2);
    let line = read_json(&PathBuf::from(format!("{}.call.json", prefix.display())))["line"]
        .as_u64()
        .expect("the call's line");
    StuckJob {
        job,
        go,
        program,
        zero: crate::pid_of_rank(&truths, 0),
        one: crate::pid_of_rank(&truths, 1),
        line,
    }
}

/// Asserts `profile` shows `stuck` as it is: rank 0 inside its `MPI_Sendrecv` on its main
/// thread, entered before commtap attached, called from `main` at the line the program
/// wrote down; rank 1 in no call, and known to be. Returns the call's site.
#[track_caller]
pub fn assert_stuck_where_it_is(profile: &Value, stuck: &StuckJob) -> String {
    let zero = crate::rank_by_pid(profile, stuck.zero);
    let call = &zero["in_call"];
    assert_eq!(call["routine"], "MPI_Sendrecv", "{zero}");
    assert_eq!(call["before_attach"], true, "{call}");
    assert_eq!(call["thread"], stuck.zero, "{call}");
    let name = stuck.program.file_name().expect("name").to_string_lossy();
    let from = call["called_from"].as_str().expect("called_from");
    assert!(
        from.starts_with("main+0x")
            && from.ends_with(&format!(" at mpi_stuck.c:{} ({name})", stuck.line)),
        "{call}"
    );
    let one = crate::rank_by_pid(profile, stuck.one);
    assert!(
        one.get("in_call").is_none() && one.get("in_call_unknown").is_none(),
        "{one}"
    );
    from.to_string()
}

/// Waits until the daemon at `target` shows job `job` hung as `mpi_hang` hangs it with
/// rank 1 late: rank 0 inside its `MPI_Barrier` for a second or more, called from the
/// program's `main` at the barrier's line (the kernel's record of its probed return read
/// back), rank 1 (waiting for the go, outside MPI) in no call. Returns that live profile.
#[track_caller]
pub fn wait_for_rank_0_hung_in_its_barrier(target: &str, job: &str, limit: Duration) -> Value {
    let mut profile = Value::Null;
    // The barrier's line in the program's source, which its call site names.
    let source = std::fs::read_to_string(crate::repo_root().join("tests/programs/mpi_hang.c"))
        .expect("mpi_hang.c");
    let line = source
        .lines()
        .position(|l| l.trim() == "MPI_Barrier(MPI_COMM_WORLD);")
        .expect("the barrier's line")
        + 1;
    let at = format!(" at mpi_hang.c:{line} (mpi_hang");
    crate::wait_until(
        "rank 0 seen in its barrier, rank 1 outside MPI",
        limit,
        || {
            // Until the daemon has read the ranks' environment, it knows no such job.
            let out =
                commtap_output(&["report", "--from", target, "--job", job, "--format", "json"]);
            let Ok(live) = serde_json::from_slice::<Value>(&out.stdout) else {
                return false;
            };
            profile = live;
            let (zero, one) = (
                crate::rank_numbered(&profile, 0),
                crate::rank_numbered(&profile, 1),
            );
            zero["in_call"]["routine"] == "MPI_Barrier"
                && zero["in_call"]["for_ns"]
                    .as_u64()
                    .is_some_and(|ns| ns >= 1_000_000_000)
                // Where it was made, once the daemon has read the program's symbols.
                && zero["in_call"]["called_from"]
                    .as_str()
                    .is_some_and(|f| f.starts_with("main+0x") && f.contains(&at))
                && one.is_object()
                && one.get("in_call").is_none()
        },
    );
    profile
}

/// The state (`probed`, `exited` ...) of each process `commtap ps` lists.
pub fn ps_states(target: &str) -> std::collections::BTreeMap<u64, String> {
    ps_field(target, "state")
}

/// `field` (`state`, `job` ...) of each process `commtap ps --json` lists, by pid.
pub fn ps_field(target: &str, field: &str) -> std::collections::BTreeMap<u64, String> {
    let out = commtap_output(&["ps", "--from", target, "--format", "json"]);
    let Ok(listed) = serde_json::from_slice::<Value>(&out.stdout) else {
        // Not answering yet (the daemon starting): nothing listed.
        return std::collections::BTreeMap::new();
    };
    listed["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["pid"].as_u64()?, p[field].as_str()?.to_string())))
        .collect()
}

#[track_caller]
/// Waits until the daemon lists every one of `pids` in `state`. By pid: a daemon that
/// watches the whole node also sees the processes of tests running beside this one.
pub fn wait_for_state(target: &str, pids: &[u64], state: &str) {
    wait_until(
        &format!("the daemon to list {pids:?} as {state}"),
        // Only bounds a failure: a loaded machine may need the daemon's next /proc scan,
        // a program's verification and a settling delay.
        Duration::from_mins(3),
        || {
            let states = ps_states(target);
            pids.iter()
                .all(|p| states.get(p).is_some_and(|s| s == state))
        },
    );
}

/// Waits until the daemon lists every one of `pids` as exited (their profiles final).
#[track_caller]
pub fn wait_for_exited(target: &str, pids: &[u64]) {
    wait_for_state(target, pids, "exited");
}

/// `commtap GLOBAL.. report --from FROM --job JOB --format json -o OUT`: the profile, or
/// None if the report failed (not there yet, say).
pub fn try_job_report(global: &[&str], from: &str, job: &str, out: &Path) -> Option<Value> {
    let args = [
        global,
        &[
            "report",
            "--from",
            from,
            "--job",
            job,
            "--format",
            "json",
            "-o",
            path_str(out),
        ],
    ]
    .concat();
    commtap_output(&args)
        .status
        .success()
        .then(|| read_json(out))
}

/// An aggregator on a free local port over plain TCP (`--insecure-tcp`), its database at
/// `db`: its guard and URL, once it answers.
pub fn spawn_local_aggregator(scratch: &Scratch, db: &Path) -> (ChildGuard, String) {
    let addr = crate::free_port();
    let args = [
        "--log",
        "info",
        "aggregator",
        "--listen",
        &addr,
        "--insecure-tcp",
        "--db",
        path_str(db),
    ];
    let child = spawn_commtap(scratch, &args);
    let url = format!("http://{addr}");
    wait_until("the aggregator to listen", Duration::from_mins(1), || {
        commtap_output(&["jobs", "--from", &url]).status.success()
    });
    (child, url)
}

/// Whether `profile` has `n` ranks, each with its final profile (exited).
pub fn every_rank_final(profile: &Value, n: usize) -> bool {
    profile["ranks"]
        .as_array()
        .is_some_and(|r| r.len() == n && r.iter().all(|x| x["exited"] == true))
}

/// Two simulated nodes on this host: a daemon each, named `node-a` and `node-b`, watching
/// one of `halves` and pushing to the aggregator at `url` every 200 ms, `node-b`'s clock
/// `offset_b_ns` ahead (`--test-clock-offset-ns`). Returns once each has probed its ranks.
pub fn start_two_nodes(
    halves: [&[u32]; 2],
    url: &str,
    offset_b_ns: &str,
) -> Vec<(Scratch, Daemon)> {
    let mut daemons = Vec::new();
    for ((node, pids), clock) in ["node-a", "node-b"]
        .into_iter()
        .zip(halves)
        .zip(["0", offset_b_ns])
    {
        let node_scratch = Scratch::new(&format!("two-nodes-{node}"));
        let list = pid_list(pids);
        let d = Daemon::start(
            &node_scratch,
            &[],
            &[],
            &[
                "--node-name",
                node,
                "--pid",
                &list,
                "--test-clock-offset-ns",
                clock,
                "--aggregator",
                url,
                "--push-insecure",
                "--push-interval",
                "200ms",
            ],
        );
        let watched: Vec<u64> = pids.iter().map(|p| u64::from(*p)).collect();
        wait_for_state(&d.target, &watched, "probed");
        daemons.push((node_scratch, d));
    }
    daemons
}

/// A log line without its colour codes (ESC [ ... m).
pub fn without_colours(line: &str) -> String {
    line.split('\x1b')
        .map(|part| {
            part.split_once('m')
                .filter(|_| part.starts_with('['))
                .map_or(part, |(_, rest)| rest)
        })
        .collect()
}
