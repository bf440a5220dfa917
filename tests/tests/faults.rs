//! Faults an operator meets: the aggregator's disk fills up, its database file is
//! corrupted, a node's clock is stepped back. Each test passes only when nothing is lost that the fault did not destroy,
//! and the aggregator says clearly what happened.

use std::{path::Path, process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

/// A tmpfs of `kib` KiB mounted on `dir` (a disk that fills up), unmounted when dropped.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, kib: u32) -> SmallDisk {
        std::fs::create_dir_all(dir).expect("mount point");
        sh(&format!(
            "mount -t tmpfs -o size={kib}k commtap-test {}",
            dir.display()
        ));
        SmallDisk(dir.to_path_buf())
    }

    fn grow(&self, kib: u32) {
        sh(&format!(
            "mount -o remount,size={kib}k {}",
            self.0.display()
        ));
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The aggregator's disk fills up while a daemon pushes 300 ranks: the pushes fail and say
/// why, the aggregator keeps answering, and once there is room again the daemon's next
/// push lands everything, exactly as the daemon has it.
#[test]
fn an_aggregator_whose_disk_fills_up_keeps_serving_and_catches_up() {
    let scratch = Scratch::new("fault-disk-full");
    let disk = SmallDisk::mount(&scratch.path("disk"), 256);
    let agg_scratch = Scratch::new("fault-disk-full-aggregator");
    let (mut aggregator, url) = spawn_local_aggregator(&agg_scratch, &disk.0.join("agg.redb"));
    let node_scratch = Scratch::new("fault-disk-full-node");
    let daemon = Daemon::start(
        &node_scratch,
        &[],
        &["--log", "info"],
        &[
            "--node-name",
            "full-disk-node",
            "--aggregator",
            &url,
            "--push-insecure",
            "--push-interval",
            "200ms",
            "--test-synthetic-ranks",
            "300",
        ],
    );
    let daemon_log =
        || std::fs::read_to_string(node_scratch.path("commtap.stderr")).unwrap_or_default();
    wait_until("a push to fail for want of space", LIMIT, || {
        daemon_log().contains("No space left on device")
    });
    let jobs = commtap_output(&["jobs", "--from", &url]);
    assert!(
        jobs.status.success(),
        "the aggregator stopped answering: {}",
        String::from_utf8_lossy(&jobs.stderr)
    );

    disk.grow(64 << 10);
    let report = |out: &Path, from: &str| try_job_report(&[], from, "synthetic", out);
    let at_node = report(&scratch.path("node.json"), &daemon.target).expect("node report");
    let merged = scratch.path("merged.json");
    wait_until("the aggregator to have every rank", LIMIT, || {
        report(&merged, &url).is_some_and(|p| p["ranks"].as_array().map(Vec::len) == Some(300))
    });
    assert_eq!(
        rank_tables(&read_json(&merged)),
        rank_tables(&at_node),
        "the aggregator holds what the node has, once"
    );
    daemon.stop(&node_scratch);
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    assert!(
        aggregator.wait_with_limit(LIMIT).success(),
        "the aggregator's exit"
    );
}

/// A database file that is not a database, or one whose header was overwritten: the
/// aggregator refuses to start, names the file and the fault, and leaves it as it was
/// (whatever can still be recovered from it is not destroyed by a restart).
#[test]
fn a_corrupted_database_is_refused_at_start_and_left_as_it_was() {
    let scratch = Scratch::new("fault-corrupt-db");
    // A real database, written by an aggregator and closed cleanly.
    let db = scratch.path("agg.redb");
    let (mut aggregator, _) = spawn_local_aggregator(&scratch, &db);
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    assert!(aggregator.wait_with_limit(LIMIT).success());
    let mut bytes = std::fs::read(&db).expect("database");
    assert!(bytes.len() > 512, "{} bytes", bytes.len());
    for b in &mut bytes[..512] {
        *b ^= 0x5a;
    }
    std::fs::write(&db, &bytes).expect("corrupting the header");
    let garbage = scratch.path("garbage.redb");
    std::fs::write(&garbage, vec![0x42u8; 64 << 10]).expect("garbage");
    for file in [&db, &garbage] {
        let before = std::fs::read(file).expect("file");
        let out = commtap_output(&[
            "aggregator",
            "--listen",
            &free_port(),
            "--insecure-tcp",
            "--db",
            path_str(file),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(path_str(file)), "{stderr}");
        assert!(stderr.contains("Not a redb database"), "{stderr}");
        assert_eq!(
            std::fs::read(file).expect("file"),
            before,
            "the file was changed"
        );
    }
}

/// libfaketime, multithreaded variant (the daemon is): Debian's `faketime` package.
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The times of a log's lines (RFC 3339, UTC: in order as strings), in order.
fn log_times(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| {
            // Colour codes around the time, if any.
            let plain = without_colours(l);
            let stamp = plain.split_whitespace().next()?.to_string();
            (stamp.len() >= 20 && stamp.as_bytes()[10] == b'T' && stamp.ends_with('Z'))
                .then_some(stamp)
        })
        .collect()
}

/// A node's wall clock stepped back an hour while its daemon pushes a running job (as NTP
/// steps a clock that ran ahead; libfaketime steps the daemon's, the monotonic clock left
/// alone as a step leaves it): nothing commtap orders or merges by goes by the wall clock,
/// so the pushes after the step are taken and the aggregator ends with the job's exact
/// profile. The daemon's log shows the step (its last line timed before its first).
#[test]
fn a_clock_stepped_back_while_pushing_loses_nothing() {
    let scratch = Scratch::new("fault-clock-step");
    let agg_scratch = Scratch::new("fault-clock-step-aggregator");
    let (mut aggregator, url) = spawn_local_aggregator(&agg_scratch, &agg_scratch.path("agg.redb"));
    let clock = scratch.path("faketime");
    std::fs::write(&clock, "+0\n").expect("clock file");
    let preload = format!("LD_PRELOAD={FAKETIME}");
    let clock_file = format!("FAKETIME_TIMESTAMP_FILE={}", clock.display());
    let node_scratch = Scratch::new("fault-clock-step-node");
    let daemon = Daemon::start(
        &node_scratch,
        &[
            "env",
            &preload,
            &clock_file,
            "FAKETIME_NO_CACHE=1",
            "DONT_FAKE_MONOTONIC=1",
        ],
        &["--log", "info"],
        &[
            "--node-name",
            "stepped",
            "--aggregator",
            &url,
            "--push-insecure",
            "--push-interval",
            "200ms",
        ],
    );
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 20, &[]);
    let ranks: Vec<u64> = ranks.into_iter().map(u64::from).collect();
    let mut jobs = Default::default();
    wait_until("the daemon to name the job", LIMIT, || {
        jobs = ps_field(&daemon.target, "job");
        ranks.iter().all(|p| jobs.contains_key(p))
    });
    let id = jobs[&ranks[0]].clone();
    let merged = scratch.path("merged.json");
    let report = |from: &str, out: &Path| try_job_report(&[], from, &id, out);
    wait_until(
        "the aggregator to have the job before the step",
        LIMIT,
        || report(&url, &merged).is_some_and(|p| p["ranks"].as_array().map(Vec::len) == Some(2)),
    );

    std::fs::write(&clock, "-1h\n").expect("stepping the clock back");
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the job failed");
    wait_for_exited(&daemon.target, &ranks);
    let truths = read_truths(&scratch.path("truth"), 2);
    wait_until(
        "the aggregator to have the job's final profile",
        LIMIT,
        || report(&url, &merged).is_some_and(|p| every_rank_final(&p, 2)),
    );
    let profile = read_json(&merged);
    assert_loop_ranks(&profile, &truths);
    daemon.stop(&node_scratch);
    // The step reached the daemon: its shutdown is logged before its start, by the clock.
    let times = log_times(
        &std::fs::read_to_string(node_scratch.path("commtap.stderr")).expect("daemon log"),
    );
    let (first, last) = (
        times.first().expect("logged"),
        times.last().expect("logged"),
    );
    assert!(
        last < first,
        "the daemon's clock never stepped back: {times:?}"
    );
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    assert!(
        aggregator.wait_with_limit(LIMIT).success(),
        "the aggregator's exit"
    );
}
