//! Attacks on the root daemon through the files it reads, by an unprivileged local user
//! (uid 65534, `nobody`), run for real against a real daemon: each test passes only when
//! the attack fails **and** the daemon stays healthy (answers `ps` within 2 s, its memory
//! bounded, and still counts a real MPI job of root's exactly). Shared parts:
//! `commtap_tests::attack`.

use std::{os::unix::fs::PermissionsExt, process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

/// Attack: map a crafted `libmpich.so.12`, wait until the daemon has read it, then rename
/// a symlink to a root-owned library over it. A daemon that attaches by path puts its
/// probes, at the crafted file's offsets, into the root-owned file (and so into every root
/// process that maps it). The probes must go into the file that was read, and only there.
#[test]
fn a_library_swapped_after_it_was_read_gets_no_probe_into_root_files() {
    let a = Attack::start("attack-swap");
    let (scratch, lib, crafted) = (&a.scratch, &a.lib, &a.crafted);

    // Root's side: a root-owned library, mapped by a root process.
    let root_dir = scratch.path("root-only");
    std::fs::create_dir_all(&root_dir).expect("dir");
    let victim = root_dir.join("libvictim.so");
    std::fs::copy(lib, &victim).expect("victim copy");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).expect("mode");
    let victim_prog = build_plain_c("attack_victim.c", &["-ldl"]);
    let victim_ready = scratch.path("victim-ready");
    let victim_proc = ChildGuard::spawn(Command::new(&victim_prog).arg(&victim).arg(&victim_ready));
    wait_until("the victim to map its library", LIMIT, || {
        victim_ready.exists()
    });

    // The user's side: the crafted library, and a symlink to the victim ready to swap in.
    let swap = crafted.with_file_name("swap");
    std::os::unix::fs::symlink(&victim, &swap).expect("symlink");
    std::os::unix::fs::lchown(&swap, Some(NOBODY), Some(NOBODY)).expect("lchown");
    let attacker = start_attacker(scratch, &a.map, crafted, "swap", path_str(&swap));
    let done = scratch.path("signals/done");
    wait_until(
        "the attacker to swap the file after the daemon's read",
        LIMIT,
        || done.exists(),
    );
    // Probed: the daemon attached to the library it read (the attacker's own file).
    let pid = u64::from(attacker.0.id());
    wait_for_state(&a.daemon.target, &[pid], "probed");
    assert!(
        std::fs::read_link(crafted).is_ok_and(|t| t == victim),
        "the swap happened"
    );
    assert!(
        !code_equals_file(attacker.0.id(), "/libmpich.so.12 (deleted)", lib),
        "the probe went into the file the daemon read (the attacker's own)"
    );
    assert!(
        code_equals_file(victim_proc.0.id(), "/libvictim.so", &victim),
        "a probe was written into the root-owned library's code"
    );
    drop(victim_proc);
    a.end_healthy();
    drop(attacker);
}

/// Attack: map a library whose path holds two spaces (`a  b/libmpich.so.12`) while a FIFO
/// waits at the path with one (`a b/libmpich.so.12`). A maps parser that splits on
/// whitespace opens the FIFO and blocks the daemon forever. The path is kept verbatim and
/// no FIFO is ever opened.
#[test]
fn a_fifo_behind_a_path_with_spaces_does_not_stop_the_daemon() {
    let scratch = Scratch::new("attack-fifo");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let (lib, map) = attack_programs();
    let dir = nobody_dir(&scratch, "attacker");
    let (two, one) = (dir.join("a  b"), dir.join("a b"));
    for d in [&two, &one] {
        std::fs::create_dir_all(d).expect("dir");
        std::os::unix::fs::chown(d, Some(NOBODY), Some(NOBODY)).expect("chown");
    }
    let crafted = two.join("libmpich.so.12");
    copy_as_nobody(&lib, &crafted);
    sh(&format!(
        "mkfifo '{}'",
        one.join("libmpich.so.12").display()
    ));
    let attacker = start_attacker(&scratch, &map, &crafted, "none", "-");
    wait_for_state(&daemon.target, &[u64::from(attacker.0.id())], "probed");
    let out = commtap_output(&["ps", "--from", &daemon.target]);
    let ps = String::from_utf8_lossy(&out.stdout);
    assert!(
        ps.contains("attacker/a  b/libmpich.so.12"),
        "the library's path is kept verbatim:\n{ps}"
    );
    assert_healthy(&scratch, &daemon);
    drop(attacker);
    daemon.stop(&scratch);
}

/// Attack: truncate the library as the daemon opens it (inotify `IN_OPEN`). A daemon that
/// maps library files dies of SIGBUS reading past the new end. It reads what it needs with
/// bounded reads and gives up on that file.
#[test]
fn a_library_truncated_while_it_is_read_does_not_kill_the_daemon() {
    let a = Attack::start("attack-truncate");
    let _attacker = start_attacker(&a.scratch, &a.map, &a.crafted, "truncate", "-");
    let done = a.scratch.path("signals/done");
    wait_until("the attacker to truncate its library", LIMIT, || {
        done.exists()
    });
    assert_eq!(std::fs::metadata(&a.crafted).expect("crafted").len(), 0);
    a.end_healthy();
}

/// Attack: a small library whose dynamic section repeats `DT_NEEDED` thousands of times,
/// every entry naming one long string. A parser that copies each entry allocates the
/// string once per entry (gigabytes from a file of megabytes). Reads and copies are capped.
#[test]
fn a_library_with_many_long_needed_entries_does_not_bloat_the_daemon() {
    let a = Attack::start("attack-needed");
    // 60,000 DT_NEEDED entries (16 bytes each) naming one 60,000-byte string: a 1 MB file
    // that names 3.6 GB of strings.
    let status = Command::new("python3")
        .arg(repo_root().join("tests/programs/many_needed.py"))
        .arg(&a.crafted)
        .args(["60000", "60000"])
        .status()
        .expect("python3");
    assert!(status.success(), "crafting the library failed");
    let attacker = start_attacker(&a.scratch, &a.map, &a.crafted, "none", "-");
    wait_for_state(&a.daemon.target, &[u64::from(attacker.0.id())], "probed");
    a.end_healthy();
}

/// Attack: a process whose list of mappings (`/proc/PID/maps`) is a quarter of a gigabyte
/// (one page of a file at the end of a 4 KiB path, mapped 60,000 times), which then maps a
/// crafted `libmpich.so.12`. A daemon that reads the list whole holds it all (and reads it
/// again whenever the process's mappings change). It reads at most 8 MiB of it, and
/// `ps` says why the process was not read.
#[test]
fn a_process_with_a_huge_list_of_mappings_does_not_bloat_the_daemon() {
    let a = Attack::start("attack-long-maps");
    let deep = nobody_dir(&a.scratch, "deep");
    let attacker = start_proc_attacker(&a, &["maps", path_str(&deep), "60000"]);
    let pid = attacker.0.id();
    // The attack is real: the list is past 200 MB (counted, not held).
    let mut maps = std::fs::File::open(format!("/proc/{pid}/maps")).expect("maps");
    let listed = std::io::copy(&mut maps, &mut std::io::sink()).expect("reading maps");
    assert!(listed > 200 << 20, "the list is {listed} bytes");
    wait_until("ps to say why the attacker was not read", LIMIT, || {
        ps_field(&a.daemon.target, "unread")
            .get(&u64::from(pid))
            .is_some_and(|why| why.contains("more than 8 MiB"))
    });
    assert_eq!(
        ps_states(&a.daemon.target)
            .get(&u64::from(pid))
            .map(String::as_str),
        Some("no-mpi")
    );
    a.end_healthy();
    drop(attacker);
}

/// Attack: the same process, loading and unloading in a loop a new copy of a library
/// that exports `MPI_Send` (a file never seen, each time), its list of mappings just under
/// what is read of one. Each load pauses it until the daemon has read its mappings again:
/// 8 MiB of escaped paths, about 0.1 s of the daemon's
/// CPU each, which kept the daemon's core (its unit's whole quota, shared with the ring
/// buffers every user's jobs are counted through) busy; and each copy, not probed, was
/// remembered with its reason, listed in every profile. The user's share of reading time
/// is spent after a burst, then a tenth of a core: `ps` says so, the daemon's CPU falls
/// to that; the copies' reasons are listed 32 at most, and once the attacker is gone no
/// copy is held open; root's job is counted exactly meanwhile.
#[test]
fn a_process_loading_libraries_in_a_loop_does_not_take_the_daemons_core() {
    let a = Attack::start("attack-maps-again");
    let deep = nobody_dir(&a.scratch, "deep");
    let again = a.crafted.with_file_name("libagain.so");
    copy_as_nobody(&a.lib, &again);
    // 1,900 lines of 4 KiB: just under what is read of a list (8 MiB), so read whole.
    let attacker = start_proc_attacker(&a, &["maps", path_str(&deep), "1900", path_str(&again)]);
    let pid = attacker.0.id();
    let mut maps = std::fs::File::open(format!("/proc/{pid}/maps")).expect("maps");
    let listed = std::io::copy(&mut maps, &mut std::io::sink()).expect("reading maps");
    assert!(
        (7 << 20..8 << 20).contains(&listed),
        "the list is {listed} bytes"
    );
    // The burst is 30 s of the daemon's CPU: a slow machine's debug build takes longer.
    wait_until("ps to say the attacker's share is spent", 2 * LIMIT, || {
        ps_field(&a.daemon.target, "unread")
            .get(&u64::from(pid))
            .is_some_and(|why| why.contains("is spent for now"))
    });
    // A tenth of a core for the attacker's reads, and what the daemon does anyway
    // (about 2% here); it was a whole core.
    let share = cpu_share(a.daemon.child.0.id(), Duration::from_secs(5));
    eprintln!(
        "the daemon used {:.1}% of a core under the attack",
        share * 100.0
    );
    assert!(share < 0.35, "the daemon used {share:.2} of a core");
    // The burst read dozens of copies (each about 0.2 s): 32 listed, the rest counted.
    let profile = report_json(&["report", "--from", &a.daemon.target]);
    let not_probed: Vec<&str> = profile["unsupported_libraries"]
        .as_array()
        .expect("unsupported_libraries")
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    let copies = not_probed
        .iter()
        .filter(|r| r.contains("libagain.so."))
        .count();
    assert!(copies <= 32, "{copies} copies listed: {not_probed:#?}");
    assert!(
        not_probed
            .iter()
            .any(|r| r.contains("more of users' own files, not listed")),
        "{not_probed:#?}"
    );
    drop(attacker);
    let daemon = a.daemon.child.0.id();
    wait_until("the daemon to hold no copy open", LIMIT, || {
        held_open(daemon, "libagain.so.") == 0
    });
    a.end_healthy();
}

/// How many of `pid`'s open files have `part` in their path.
fn held_open(pid: u32, part: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd")
        .flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().contains(part))
        })
        .count()
}

/// Attack: a process that moves its environment's bounds (`PR_SET_MM_MAP`, which needs no
/// privilege) over a gigabyte it never touches, so that `/proc/PID/environ` reads as a
/// gigabyte, then maps a crafted `libmpich.so.12`. A daemon that reads the environment
/// whole (for the rank and job it names) holds a gigabyte and spends minutes splitting it.
/// It reads 6 MiB at most (what `exec` gives of arguments and environment together) and
/// keeps only the variables that say who the process is: the job the region names first
/// is read.
#[test]
fn a_process_with_a_gigabyte_environment_does_not_bloat_the_daemon() {
    let a = Attack::start("attack-long-environ");
    let marker = "attacked-environ";
    let attacker = start_proc_attacker(&a, &["environ", "1024", marker]);
    let pid = attacker.0.id();
    // The attack is real: its environment spans a gigabyte (fields 50 and 51 of its stat: its bounds).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<u64> = stat[stat.rfind(')').expect("comm") + 2..]
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    assert_eq!(fields[51 - 3] - fields[50 - 3], 1 << 30, "{stat}");
    wait_until("ps to name the attacker's job", LIMIT, || {
        ps_field(&a.daemon.target, "job").get(&u64::from(pid)) == Some(&marker.to_string())
    });
    a.end_healthy();
    drop(attacker);
}

/// Starts `attack_proc` (the attacks through a process's own `/proc` files) as nobody on
/// `a`'s crafted library, with `args` after its first two; waits until it has mapped the
/// library.
fn start_proc_attacker(a: &Attack, args: &[&str]) -> ChildGuard {
    let program = build_plain_c("attack_proc.c", &["-ldl"]);
    let ready = nobody_dir(&a.scratch, "signals").join("ready");
    let mut all = vec![path_str(&a.crafted), path_str(&ready)];
    all.extend_from_slice(args);
    let attacker = spawn_as_nobody(&program, &all);
    wait_until("the attacker to map its library", LIMIT, || ready.exists());
    attacker
}

/// The library lines of `commtap ps` (as root) whose path contains `part`.
fn probed_libraries_with(daemon: &Daemon, part: &str) -> usize {
    let out = commtap_output(&["ps", "--from", &daemon.target]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("library ") && l.contains(part))
        .count()
}

/// Attack: map many copies of a tiny fake MPI library to use up the daemon's 64 library
/// slots, so that no later MPI build (a venv, Spack) is probed until a restart. A user's
/// own libraries are limited to 8 at once and let go when no process maps them: root's
/// library mapped after the attack is probed, and once the attacker's processes are gone
/// so are their libraries.
#[test]
fn one_user_cannot_use_up_the_library_slots() {
    library_slots_attack("attack-slots", &[], |_| NOBODY);
}

/// Attack: the same, by a user given sub-uids (as rootless containers are): each copy
/// owned by another of nobody's sub-uids (root chowns them here, as nobody's processes in
/// its user namespace would make them), so that a cap per uid would never be met. The
/// daemon reads the sub-uids from its `--subuid-file` (`/etc/subuid`'s form): every copy is
/// nobody's, 8 are probed, and root's library still is. Without the file all 10 were.
#[test]
fn a_user_with_sub_uids_cannot_use_up_the_library_slots() {
    const SUB_UIDS: u32 = 3_000_000;
    let scratch = Scratch::new("attack-slots-subuids-file");
    let subuids = nobody_subuid_file(&scratch, SUB_UIDS);
    library_slots_attack(
        "attack-slots-subuids",
        &["--subuid-file", path_str(&subuids)],
        |i| SUB_UIDS + i as u32,
    );
}

/// Nobody maps 10 copies of a fake MPI library, the `i`-th owned by `owner(i)`, beside a
/// daemon started with `args`: 8 are probed; root's own copy mapped after is probed; the
/// attacker's are let go once its processes are gone.
fn library_slots_attack(name: &str, args: &[&str], owner: impl Fn(usize) -> u32) {
    let scratch = Scratch::new(name);
    let daemon = Daemon::start(&scratch, &[], &[], args);
    let (lib, map) = attack_programs();
    let dir = nobody_dir(&scratch, "attacker");
    let mut attackers = Vec::new();
    for i in 0..10 {
        let sub = dir.join(format!("d{i}"));
        std::fs::create_dir_all(&sub).expect("dir");
        std::os::unix::fs::chown(&sub, Some(NOBODY), Some(NOBODY)).expect("chown");
        let copy = sub.join("libmpich.so.12");
        std::fs::copy(&lib, &copy).expect("copy");
        std::os::unix::fs::chown(&copy, Some(owner(i)), Some(owner(i))).expect("chown");
        let signals = nobody_dir(&scratch, &format!("signals{i}"));
        let ready = signals.join("ready");
        attackers.push(spawn_as_nobody(
            &map,
            &[
                path_str(&copy),
                path_str(&ready),
                "none",
                "-",
                path_str(&signals.join("done")),
            ],
        ));
        wait_until("an attacker to map its copy", LIMIT, || ready.exists());
    }
    let pids: Vec<u64> = attackers.iter().map(|c| u64::from(c.0.id())).collect();
    wait_until("the daemon to look at every attacker", LIMIT, || {
        let states = ps_states(&daemon.target);
        pids.iter().all(|p| states.contains_key(p))
    });
    assert_eq!(
        probed_libraries_with(&daemon, "/attacker/d"),
        8,
        "one user's libraries probed at once"
    );

    // Root's own build, mapped now, still gets a slot.
    let root_dir = scratch.path("root-build");
    std::fs::create_dir_all(&root_dir).expect("dir");
    let root_lib = root_dir.join("libmpich.so.12");
    std::fs::copy(&lib, &root_lib).expect("copy");
    let root_ready = scratch.path("root-ready");
    let root = ChildGuard::spawn(Command::new(&map).args([
        path_str(&root_lib),
        path_str(&root_ready),
        "none",
        "-",
        path_str(&scratch.path("root-done")),
    ]));
    wait_until("root's process to map its library", LIMIT, || {
        root_ready.exists()
    });
    wait_for_state(&daemon.target, &[u64::from(root.0.id())], "probed");
    assert_eq!(probed_libraries_with(&daemon, "/root-build/"), 1);

    // The attacker's processes end: their libraries are let go.
    drop(attackers);
    wait_until("the attacker's libraries to be let go", LIMIT, || {
        probed_libraries_with(&daemon, "/attacker/d") == 0
    });
    assert_eq!(probed_libraries_with(&daemon, "/root-build/"), 1);
    drop(root);
    assert_healthy(&scratch, &daemon);
    daemon.stop(&scratch);
}

/// Attack: a library whose `MPI_Send` symbol names data (bytes that look like a function
/// prologue), not code. Probes go only into executable sections: MPI_Send is not probed,
/// MPI_Recv (real code) is.
#[test]
fn a_symbol_that_names_data_is_never_probed() {
    let a = Attack::start("attack-data-symbol");
    let lib = compile_c(
        "attack_data_symbol.c",
        "libattack_data_symbol.so",
        &["-shared", "-fPIC"],
    );
    copy_as_nobody(&lib, &a.crafted);
    let attacker = start_attacker(&a.scratch, &a.map, &a.crafted, "none", "-");
    wait_for_state(&a.daemon.target, &[u64::from(attacker.0.id())], "probed");
    let out = commtap_output(&["ps", "--from", &a.daemon.target]);
    let ps = String::from_utf8_lossy(&out.stdout);
    // MPI_Recv is code: probed. MPI_Send names 64 bytes of data that start like a
    // function (push %rbp; mov %rsp,%rbp): never probed.
    let line = ps
        .lines()
        .find(|l| l.starts_with("library ") && l.contains("/attacker/libmpich.so.12"))
        .unwrap_or_else(|| panic!("the crafted library is listed:\n{ps}"));
    assert!(
        line.ends_with(": 1 probes"),
        "only MPI_Recv is probed: {line}"
    );
    a.end_healthy();
}

/// Attack: a program of nobody's whose own line tables (`.debug_line`) are hostile, run
/// beside a daemon counting call sites, which reads a program's symbols and line tables
/// to name its calls: a DWARF 5 header listing 600,000 files of one byte each, and a DWARF 4
/// program defining 600,000 files as it runs (`tests/programs/hostile_dwarf.py`). A reader
/// that keeps what it parses allocates some ninety bytes per byte of them (about 100 MB
/// from a 4.8 MB section, which is read whole); both are skipped before they are parsed,
/// and the call is still named by its function (the program's symbols read), without a
/// line.
#[test]
fn a_program_with_hostile_line_tables_does_not_bloat_the_daemon() {
    let scratch = Scratch::new("attack-dwarf");
    let daemon = Daemon::start(&scratch, &[], &[], &["--call-sites"]);
    let (lib, _) = attack_programs();
    let dir = nobody_dir(&scratch, "attacker");
    let crafted_lib = dir.join("libmpich.so.12");
    copy_as_nobody(&lib, &crafted_lib);
    let built = compile_c("attack_dwarf.c", "attack_dwarf", &["-g", "-ldl"]);
    let (blob, hostile) = (scratch.path("debug_line"), scratch.path("attack_dwarf"));
    std::fs::copy(&built, &hostile).expect("copying the program");
    let status = Command::new("python3")
        .arg(repo_root().join("tests/programs/hostile_dwarf.py"))
        .arg(&blob)
        .arg("600000")
        .status()
        .expect("python3");
    assert!(status.success(), "crafting the line tables failed");
    let status = Command::new("objcopy")
        .arg("--remove-section=.debug_line")
        .arg(format!("--add-section=.debug_line={}", blob.display()))
        .arg(&hostile)
        .status()
        .expect("objcopy");
    assert!(status.success(), "objcopy failed");
    let program = dir.join("attack_dwarf");
    copy_as_nobody(&hostile, &program);
    let signals = nobody_dir(&scratch, "signals");
    let (ready, go, done) = (
        signals.join("ready"),
        signals.join("go"),
        signals.join("done"),
    );
    let attacker = spawn_as_nobody(
        &program,
        &[
            path_str(&crafted_lib),
            path_str(&ready),
            path_str(&go),
            path_str(&done),
        ],
    );
    wait_until("the attacker to map its library", LIMIT, || ready.exists());
    let pid = attacker.0.id();
    wait_for_state(&daemon.target, &[u64::from(pid)], "probed");
    std::fs::write(&go, b"").expect("go file");
    wait_until("the attacker's call", LIMIT, || done.exists());
    let mut profile = serde_json::Value::Null;
    let site = |profile: &serde_json::Value| {
        profile["ranks"]
            .as_array()?
            .iter()
            .find(|r| r["pid"] == pid)?["call_sites"]
            .as_array()?
            .iter()
            .find(|s| s["routine"] == "MPI_Send" && s["function"] == "main")
            .cloned()
    };
    wait_until("the attacker's call site named", LIMIT, || {
        profile = report_json(&["report", "--from", &daemon.target]);
        site(&profile).is_some()
    });
    let site = site(&profile).expect("named");
    assert_eq!(site["calls"], 1, "{site}");
    assert!(site.get("source_line").is_none(), "{site}");
    assert_healthy(&scratch, &daemon);
    drop(attacker);
    daemon.stop(&scratch);
}

/// A file system mounted for nobody alone (`fuse_hang`: what `fusermount3` mounts for any
/// user) whose file `page` never answers a read; unmounted, its server gone, when dropped
/// (before the daemon, whose thread a read may still hold until then).
struct HungFileSystem {
    server: Option<ChildGuard>,
    mount: std::path::PathBuf,
    /// Created by the server at its first read asked.
    asked: std::path::PathBuf,
}

impl HungFileSystem {
    fn mount(scratch: &Scratch) -> HungFileSystem {
        let program = build_plain_c("fuse_hang.c", &[]);
        let mount = nobody_dir(scratch, "hung");
        let ready = scratch.path("hung-mounted");
        let asked = scratch.path("hung-read-asked");
        let server = ChildGuard::spawn(
            Command::new(&program)
                .arg(&mount)
                .args([&NOBODY.to_string(), &NOBODY.to_string()])
                .arg(&ready)
                .env("FUSE_HANG_ASKED", &asked),
        );
        wait_until("the file system to be mounted", LIMIT, || ready.exists());
        HungFileSystem {
            server: Some(server),
            mount,
            asked,
        }
    }
}

impl Drop for HungFileSystem {
    fn drop(&mut self) {
        // Its server gone, the kernel ends every read waiting on it.
        drop(self.server.take());
        let c = std::ffi::CString::new(path_str(&self.mount)).expect("path");
        // SAFETY: umount2(2) of the mount this test made, detached.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Attack: map a page of the user's own FUSE file system, which never answers a read, over
/// the Open MPI data the daemon reads from a process attached after its `MPI_Init` (the
/// selected pml and mtl components), then let a daemon start. The kernel faults the page
/// in for the daemon's read without asking whose mount it is, and the daemon waited on
/// the file system forever, its socket never served. The read is given up after a
/// quarter of a second and that user's processes' memory is not read meanwhile: the
/// daemon serves, says so in its log, and counts root's job exactly.
#[test]
fn a_process_pointing_the_daemon_at_a_hung_fuse_page_does_not_stop_it() {
    let scratch = Scratch::new("attack-fuse-page");
    // Declared first, dropped last: after the file system has let its reads go.
    let daemon;
    let hung = HungFileSystem::mount(&scratch);
    let program = build_plain_c("attack_fuse_page.c", &["-ldl"]);
    let ready = nobody_dir(&scratch, "signals").join("ready");
    let attacker = spawn_as_nobody(
        &program,
        &[
            path_str(&system_library("libmpi.so.40")),
            path_str(&hung.mount.join("page")),
            path_str(&ready),
        ],
    );
    wait_until("the attacker to map the hung page", LIMIT, || {
        ready.exists()
    });
    daemon = Daemon::start(&scratch, &[], &[], &[]);
    wait_for_state(&daemon.target, &[u64::from(attacker.0.id())], "probed");
    assert!(
        hung.asked.exists(),
        "the daemon's read reached the file system"
    );
    let log = std::fs::read_to_string(scratch.path("commtap.stderr")).expect("log");
    assert!(
        log.contains("a read of a process's memory did not return"),
        "{log}"
    );
    assert_healthy(&scratch, &daemon);
    drop(attacker);
    drop(hung);
    daemon.stop(&scratch);
}
