//! Ranks in containers, made here with real kernel namespaces as container runtimes make
//! them: found, probed through the process, named with their pid inside and the container.

use std::{path::Path, process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

/// A container id as Docker makes them (64 hex digits).
const ID: &str = "c0ffee00d15ea5e5c0ffee00d15ea5e5c0ffee00d15ea5e5c0ffee00d15ea5e5";

/// `mpi_dlopen`'s Allreduces after its go.
const N: &str = "200";

/// A shell script that starts `mpi_dlopen` in a container: the shell joins `cgroup`, then
/// `unshare` makes a pid and a mount namespace, and `chroot` enters a root of its own
/// (`scratch/rootfs`: the host's /usr and /etc bound in, its own /proc and /tmp) whose
/// `/opt/mpi` is a tmpfs mounted only inside, holding a copy of Open MPI's libmpi: no path
/// outside the container reaches that file. `work` is bound at `/work`.
fn container_script(scratch: &Scratch, cgroup: &Path, work: &Path) -> String {
    let root = scratch.path("rootfs");
    for d in ["usr", "etc", "proc", "dev", "sys", "tmp", "opt/mpi", "work"] {
        std::fs::create_dir_all(root.join(d)).expect("the container's root");
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        let _ = std::os::unix::fs::symlink(to, root.join(link));
    }
    let libmpi =
        std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libmpi.so.40").expect("Open MPI's libmpi");
    format!(
        "set -e\n\
         echo $$ > {cg}/cgroup.procs\n\
         exec unshare --pid --fork --mount --propagation private sh -ec '\n\
           for d in usr etc dev sys; do mount --rbind /$d {r}/$d; done\n\
           mount -t proc proc {r}/proc\n\
           mount -t tmpfs tmpfs {r}/tmp\n\
           mount -t tmpfs tmpfs {r}/opt/mpi\n\
           cp {libmpi} {r}/opt/mpi/libmpi.so.40\n\
           mount --bind {w} {r}/work\n\
           chroot {r} /work/mpi_dlopen /opt/mpi/libmpi.so.40 /work/ready /work/go {N} /work/truth\n\
         '\n",
        cg = cgroup.display(),
        r = root.display(),
        w = work.display(),
        libmpi = libmpi.display(),
    )
}

/// A rank in a container (its own pid and mount namespaces and root, its libmpi on a tmpfs
/// only the container sees, its cgroup named as Docker names one: `docker-<id>.scope`),
/// beside the same program on the host with a copy of libmpi of its own. A daemon scoped
/// with `--container <the id's first 12 digits>` finds the rank inside by the library it
/// maps, probes that library through the process, counts it exactly from its `MPI_Init`,
/// and names it with its host pid, its pid inside (the one it wrote in its truth) and the
/// container's id and cgroup, in `ps` and in the profile; the program on the host is not
/// counted.
#[test]
fn a_rank_in_a_container_is_found_probed_and_named_with_its_pid_inside() {
    let scratch = Scratch::new("container");
    let runtime = CgroupGuard::new("commtap-containers");
    let cgroup = CgroupGuard(runtime.0.join(format!("docker-{ID}.scope")));
    std::fs::create_dir_all(&cgroup.0).expect("the container's cgroup");
    let daemon = Daemon::start(&scratch, &[], &[], &["--container", &ID[..12]]);

    let prog = build_plain_c("mpi_dlopen.c", &["-ldl"]);
    let work = scratch.path("work");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::copy(&prog, work.join("mpi_dlopen")).expect("copying the program");
    let mut inside = ChildGuard::spawn(mpi_env(
        Command::new("sh")
            .arg("-c")
            .arg(container_script(&scratch, &cgroup.0, &work)),
    ));

    // The same program on the host, outside the container's cgroup.
    let host = scratch.path("host");
    std::fs::create_dir_all(&host).expect("host dir");
    let host_lib = host.join("libmpi.so.40");
    std::fs::copy(
        std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libmpi.so.40").expect("libmpi"),
        &host_lib,
    )
    .expect("copying libmpi");
    let mut outside = ChildGuard::spawn(mpi_env(Command::new(&prog).args([
        path_str(&host_lib),
        path_str(&host.join("ready")),
        path_str(&host.join("go")),
        N,
        path_str(&host.join("truth")),
    ])));

    wait_until("both programs to load libmpi", LIMIT, || {
        work.join("ready").exists() && host.join("ready").exists()
    });
    let mut listed = Default::default();
    wait_until(
        "the daemon to probe the rank in the container",
        LIMIT,
        || {
            listed = ps_field(&daemon.target, "state");
            listed.values().any(|s| s == "probed")
        },
    );
    let pid = *listed
        .iter()
        .find(|(_, s)| *s == "probed")
        .map(|(p, _)| p)
        .expect("a probed process");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let nspid: Vec<&str> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .expect("NSpid")
        .split_whitespace()
        .collect();
    assert_eq!(
        nspid.len(),
        2,
        "pid {pid} is not in a pid namespace: {nspid:?}"
    );
    assert_eq!(nspid[0], pid.to_string());

    // ps names the container and the pid inside.
    let out = commtap_output(&["ps", "--from", &daemon.target]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.lines().any(|l| l.contains(&pid.to_string())
            && l.contains(&format!("{} pid {}", &ID[..12], nspid[1]))),
        "{table}"
    );

    std::fs::write(work.join("go"), b"go").expect("go file");
    std::fs::write(host.join("go"), b"go").expect("go file");
    assert!(
        inside.wait_with_limit(LIMIT).success(),
        "the container's program failed"
    );
    assert!(
        outside.wait_with_limit(LIMIT).success(),
        "the host's program failed"
    );
    wait_for_exited(&daemon.target, &[pid]);

    let profile = report_json(&["report", "--from", &daemon.target]);
    let mut truth = read_truths(&work.join("truth"), 1).remove(0);
    let rank = rank_by_pid(&profile, pid);
    assert_eq!(rank["container"]["pid"], truth["pid"], "the pid inside");
    assert_eq!(rank["container"]["id"], ID);
    assert_eq!(
        rank["container"]["cgroup"].as_str(),
        Some(
            format!(
                "/{}",
                cgroup
                    .0
                    .strip_prefix(cgroup2_root())
                    .expect("in v2")
                    .display()
            )
            .as_str()
        )
    );
    // The truth knows its pid inside; the profile is by host pid.
    truth["pid"] = pid.into();
    assert_profile_matches(&profile, &[truth], &["MPI_Finalize"]);
    let libs = probed_paths(&profile);
    assert!(
        libs.contains(&format!("/opt/mpi/libmpi.so.40 (root of pid {pid})").as_str()),
        "the container's own libmpi, as the rank names it: {libs:?}"
    );
    let text = commtap_output(&["report", "--from", &daemon.target]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines().any(|l| l.contains("Ranks in containers")),
        "{text}"
    );
    drop(cgroup);
    daemon.stop(&scratch);
}
