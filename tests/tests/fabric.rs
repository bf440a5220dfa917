//! libfabric: commtap counts what crosses the fabric through the provider ops tables of
//! the real libfabric (Debian's 1.17, stripped), attached to processes after they start,
//! exactly as the programs posted it, and attributes it to the MPI call that made it.

use std::{
    collections::{BTreeMap, BTreeSet},
    process::Command,
    time::Duration,
};

use commtap_tests::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_mins(2);
const SIZE: u64 = 64;

/// Whether a TCP socket listens on `port` (from /proc/net/tcp).
fn listening(port: u16) -> bool {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((*f.get(1)?, *f.get(3)?))
        })
        .any(|(addr, state)| addr.ends_with(&local) && state == "0A")
}

/// Whether `pid` is stopped (state T in /proc/PID/stat).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
        .unwrap_or(false)
}

/// (calls, bytes) per routine of a profile rank, and each routine's size buckets.
fn ops(rank: &Value) -> BTreeMap<String, (u64, u64)> {
    routine_table(&rank["routines"])
}

/// Runs fi_pingpong (server and client on 127.0.0.1, `iters` x 64 B) with commtap attached
/// to both after they started: the server while it waits for its client, the client
/// stopped before it runs. Returns the profile ranks of the server and the client.
#[track_caller]
fn pingpong(provider: &str, ep: &str, iters: u64) -> (Value, Value) {
    // Every fi_pingpong server listens on the same control port: one run at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let scratch = Scratch::new(&format!("fabric-{provider}-{ep}"));
    // A free control port, not fi_pingpong's fixed default (47592), which anything else on
    // the machine may hold.
    let port: u16 = free_port()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port");
    let args = format!("-p {provider} -e {ep} -I {iters} -S {SIZE}");
    let mut server = ChildGuard::spawn(
        Command::new("sh")
            .arg("-c")
            .arg(format!("exec fi_pingpong {args} -B {port}"))
            .stdout(std::fs::File::create(scratch.path("server.out")).expect("out")),
    );
    wait_until("fi_pingpong's server to listen", LIMIT, || listening(port));
    // The client stops itself before it becomes fi_pingpong: commtap attaches to a
    // process that has started but made no call yet.
    let mut client = ChildGuard::spawn(
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "kill -STOP $$; exec fi_pingpong {args} -P {port} 127.0.0.1"
            ))
            .stdout(std::fs::File::create(scratch.path("client.out")).expect("out")),
    );
    let (spid, cpid) = (server.0.id(), client.0.id());
    wait_until("the client to stop", LIMIT, || stopped(cpid));
    let (commtap, out) = record_attached(&scratch, &[spid, cpid]);
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(cpid as i32, libc::SIGCONT) };
    for (who, p) in [("server", &mut server), ("client", &mut client)] {
        assert!(
            p.wait_with_limit(LIMIT).success(),
            "fi_pingpong {who} failed"
        );
    }
    let run = finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);
    let report = std::fs::read_to_string(scratch.path("client.out")).unwrap_or_default();
    assert!(
        report.contains(&format!("{SIZE}")),
        "fi_pingpong reported no run:\n{report}\n{}",
        run.stderr
    );
    let (server, client) = (
        rank_by_pid(&profile, u64::from(spid)).clone(),
        rank_by_pid(&profile, u64::from(cpid)).clone(),
    );
    // pingpong.c opens one endpoint on each side (rxm's or rxd's, for rdm: not the core
    // endpoints beneath it).
    for (who, rank) in [("server", &server), ("client", &client)] {
        assert_eq!(
            endpoints(rank, "fi_").len(),
            1,
            "{who}: {:?}",
            endpoints(rank, "fi_")
        );
    }
    (server, client)
}

/// What fi_pingpong (libfabric's util/pingpong.c) posts on each side of `iters`
/// iterations of 64 B: `iters` sends (`fi_inject` below the provider's inject size, else
/// `fi_send`); one receive posted at setup, one more per message received (64 B each,
/// its control-message minimum), and for dgram one extra; the final "fin" sendmsg of 4 B.
fn expected(send: &str, iters: u64, extra_recv: u64) -> BTreeMap<String, (u64, u64)> {
    let recvs = iters + 1 + extra_recv;
    BTreeMap::from([
        (send.to_string(), (iters, iters * SIZE)),
        ("fi_msg_recv".to_string(), (recvs, recvs * SIZE)),
        ("fi_msg_sendmsg".to_string(), (1, 4)),
    ])
}

/// The endpoints a process's fabric operations went through.
fn endpoints(rank: &Value, prefix: &str) -> BTreeSet<String> {
    rank["routines"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, _)| name.starts_with(prefix))
        .flat_map(|(_, r)| r["endpoints"].as_object().into_iter().flatten())
        .map(|(ep, _)| ep.clone())
        .collect()
}

/// The providers of the fabrics a process was seen to open (`fi_fabric`).
fn providers(rank: &Value) -> Vec<&str> {
    rank["fabrics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["provider"].as_str())
        .collect()
}

/// fi_pingpong iterations of each run.
const ITERS: u64 = 20_000;

/// Runs fi_pingpong (`ITERS` x 64 B) and checks that each side posted exactly what
/// pingpong.c posts, sending with `send` (and `extra_recv` more receives), and that the
/// client, watched from its exec, was seen to open a fabric of provider `fabric`.
#[track_caller]
fn pingpong_exact(
    (provider, ep): (&str, &str),
    send: &str,
    extra_recv: u64,
    fabric: &str,
) -> (Value, Value) {
    let (server, client) = pingpong(provider, ep, ITERS);
    assert_eq!(providers(&client), [fabric], "{provider} {ep}: {client:#}");
    for (who, rank) in [("server", &server), ("client", &client)] {
        assert_eq!(
            ops(rank),
            expected(send, ITERS, extra_recv),
            "{provider} {ep} {who}: {rank:#}"
        );
    }
    (server, client)
}

#[test]
fn fi_pingpong_tcp_msg_is_counted_exactly() {
    pingpong_exact(("tcp", "msg"), "fi_msg_inject", 0, "tcp");
}

#[test]
fn fi_pingpong_tcp_rdm_through_rxm_is_counted_once() {
    // The application's provider, not the core fabric rxm opens beneath it.
    let (server, client) = pingpong_exact(("tcp", "rdm"), "fi_msg_send", 0, "tcp;ofi_rxm");
    for (who, rank) in [("server", &server), ("client", &client)] {
        // rxm's calls into tcp beneath it are libfabric's own, not operations.
        assert!(
            rank["fabric_internal"].as_u64() > Some(0),
            "{who}: {rank:#}"
        );
        assert_eq!(rank["in_flight_at_attach"], 0, "{who}: returns all matched");
    }
    // While rxm connects, the client's first send is refused (-FI_EAGAIN) and retried.
    assert!(client["fabric_failed"].as_u64() > Some(0), "{client:#}");
}

#[test]
fn fi_pingpong_udp_rdm_and_dgram_are_counted_exactly() {
    pingpong_exact(("udp", "rdm"), "fi_msg_inject", 0, "udp;ofi_rxd");
    pingpong_exact(("udp", "dgram"), "fi_msg_inject", 1, "udp");
}

/// Open MPI 4.1 over libfabric (mtl ofi, tcp;ofi_rxm): every fabric operation is the one
/// the MPI call made, and is attributed to it.
#[test]
fn open_mpi_over_libfabric_is_attributed_to_mpi_calls() {
    let env = [
        ("FI_PROVIDER", "tcp"),
        ("OMPI_MCA_pml", "cm"),
        ("OMPI_MCA_mtl", "ofi"),
        // Open MPI excludes tcp by default ("too slow"); it is what this machine has.
        ("OMPI_MCA_mtl_ofi_provider_exclude", "shm"),
    ];
    mpi_loop_on_fabric(
        "fabric-ompi",
        Mpi::OpenMpi,
        &env,
        ("fi_tagged_injectdata", "fi_tagged_recv"),
        // rxm's fabric and the core tcp fabric beneath it.
        (&["ofi_rxm", "tcp"], "pml cm, mtl ofi"),
        [((1, 0), (1, 0)); 2],
    );
}

/// Runs mpi_loop on 2 ranks (one Barrier, then N x (Allreduce of 8 B; 16 B Send and
/// Recv)) with commtap attached once they are ready, checks the MPI profile against the
/// truth, that each rank's open fabrics are those of the providers `fabrics`, and on each
/// rank that the fabric operations `send` and `recv` were made by exactly those MPI calls (with 2 ranks an Allreduce is one tagged send and one tagged
/// receive), every `send` by an MPI call. What MPI_Finalize puts on the fabric (the
/// library's own goodbye) is not in the program's truth and is left out. Returns the
/// profile, the truths and commtap's stderr.
#[track_caller]
fn mpi_loop_on_fabric(
    name: &str,
    mpi: Mpi,
    env: &[(&str, &str)],
    (send, recv): (&str, &str),
    (fabrics, transport): (&[&str], &str),
    barrier: [((u64, u64), (u64, u64)); 2],
) -> (Value, Vec<Value>, String) {
    let scratch = Scratch::new(name);
    let n: u64 = 5000;
    let (mut job, ranks) = start_waiting_loop(&scratch, mpi, 2, n, env);
    let trace = scratch.path("t.json");
    // A ring buffer that holds every event of the run (about 70,000 of 104 bytes): the
    // trace is checked call by call, and must not depend on `record` (a debug build, on
    // cores the polling ranks fill) draining as fast as the ranks send.
    let (commtap, out) = record_attached_with(
        &scratch,
        &ranks,
        &["--trace", path_str(&trace), "--ring-buffer-kib", "16384"],
    );
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let run = finish_ok(&scratch, commtap, LIMIT);
    let summary = devtools_summary(&trace);
    let profile = read_json(&out);
    let truths = read_truths(&scratch.path("truth"), 2);
    let ignored: Vec<&str> = ["MPI_Finalize", send, recv]
        .into_iter()
        .chain(other_fabric_ops(&profile, &[send, recv]))
        .collect();
    assert_profile_matches(&profile, &truths, &ignored);
    for truth in &truths {
        let (sent, received) = loop_operations(
            n,
            barrier[truth["rank"].as_u64().expect("rank") as usize % 2],
        );
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        // One endpoint per rank, the MPI library's (the provider's own beneath it are not
        // the application's); UCX's sends name theirs (its receives, the worker).
        let prefix = if send.starts_with("fi_") { "fi_" } else { send };
        let eps = endpoints(rank, prefix);
        assert_eq!(eps.len(), 1, "{eps:?}");
        // Attached after MPI_Init: the fabrics it opened are found in its memory, and so
        // are the components Open MPI selected.
        assert_eq!(providers(rank), fabrics, "fabrics opened; {}", run.stderr);
        assert_eq!(
            rank["mpi_transport"].as_str(),
            Some(transport),
            "the MPI's transport; {}",
            run.stderr
        );
        let from = |op: &str| made_by(rank, op);
        let who = format!("rank {}; {}", truth["rank"], run.stderr);
        assert_eq!(from(send), sent, "{who}");
        assert_eq!(from(recv), received, "{who}");
        assert_eq!(
            rank["routines"][send]["calls"].as_u64(),
            Some(made_by_mpi(rank, send)),
            "every fabric send was made by an MPI call; {who}"
        );
        // In the trace, each of those operations is a slice inside its MPI call's.
        let pid = truth["pid"].as_u64().expect("pid");
        for (op, expected) in [(send, &sent), (recv, &received)] {
            let mut inside: BTreeMap<String, (u64, u64)> = BTreeMap::new();
            for pair in summary["processes"][pid.to_string()]["nested"]
                .as_array()
                .expect("nested")
            {
                let (outer, inner) = (pair[0].as_str(), pair[1].as_str());
                if inner == Some(op) && outer.is_some_and(|o| o.starts_with("MPI_")) {
                    let outer = outer.expect("outer").to_string();
                    if outer != "MPI_Finalize" {
                        inside.entry(outer).or_default().0 += 1;
                    }
                }
            }
            let calls: BTreeMap<String, u64> =
                expected.iter().map(|(k, v)| (k.clone(), v.0)).collect();
            let traced: BTreeMap<String, u64> = inside.into_iter().map(|(k, v)| (k, v.0)).collect();
            assert_eq!(traced, calls, "{op} slices inside MPI calls; {who}");
        }
    }
    (profile, truths, run.stderr)
}

/// What MPICH's barrier of 2 ranks puts on UCX, per rank: (calls, bytes) sent and
/// received. Rank 0 sends one empty and one 1-byte message, rank 1 one empty message.
const MPICH_BARRIER: [((u64, u64), (u64, u64)); 2] = [((2, 1), (1, 0)), ((1, 0), (2, 1))];

/// (calls, bytes) per routine.
type PerRoutine = BTreeMap<String, (u64, u64)>;

/// The transport operations `mpi_loop` of `n` iterations sends and receives, per MPI
/// routine, as (calls, bytes): one each per Allreduce (2 ranks) and per Send or Recv, and
/// what its one `MPI_Barrier` puts there, `barrier` (sent, received).
fn loop_operations(
    n: u64,
    (barrier_sent, barrier_received): ((u64, u64), (u64, u64)),
) -> (PerRoutine, PerRoutine) {
    let ops = |barrier, p2p: &str| {
        BTreeMap::from([
            ("MPI_Allreduce".to_string(), (n, 8 * n)),
            ("MPI_Barrier".to_string(), barrier),
            (p2p.to_string(), (n, 16 * n)),
        ])
    };
    (
        ops(barrier_sent, "MPI_Send"),
        ops(barrier_received, "MPI_Recv"),
    )
}

/// (calls, bytes) of transport operation `op` per MPI routine that made it, on one rank;
/// MPI_Finalize's (the library's own goodbye) left out.
fn made_by(rank: &Value, op: &str) -> PerRoutine {
    let mut m = routine_table(&rank["routines"][op]["called_from"]);
    m.remove("MPI_Finalize");
    m
}

/// The flavors of the libraries a profile probed (`UCX`, `libfabric provider tcp` ...).
fn library_flavors(profile: &Value) -> Vec<&str> {
    profile["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .filter_map(|l| l["flavor"].as_str())
        .collect()
}

/// Fabric operations in `profile` other than `known`.
fn other_fabric_ops<'a>(profile: &'a Value, known: &[&str]) -> Vec<&'a str> {
    let mut ops: Vec<&str> = profile["ranks"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["routines"].as_object().into_iter().flatten())
        .map(|(name, _)| name.as_str())
        .filter(|name| {
            (name.starts_with("fi_") || name.starts_with("ucp_")) && !known.contains(name)
        })
        .collect();
    ops.sort_unstable();
    ops.dedup();
    ops
}

/// Calls of fabric operation `op` made inside an MPI call, on one rank.
fn made_by_mpi(rank: &Value, op: &str) -> u64 {
    routine_table(&rank["routines"][op]["called_from"])
        .values()
        .map(|v| v.0)
        .sum()
}

/// A libfabric whose data path commtap cannot find is reported, not guessed.
#[test]
fn libfabric_without_ops_tables_is_reported() {
    let scratch = Scratch::new("fabric-fake");
    let lib = compile_c("fabric_fake.c", "libfabric_fake.so", &["-shared", "-fPIC"]);
    let dir = lib.parent().expect("bin dir");
    let prog = compile_c(
        "fabric_fake_main.c",
        "fabric_fake_main",
        &[
            &format!("-L{}", dir.display()),
            "-l:libfabric_fake.so",
            &format!("-Wl,-rpath,{}", dir.display()),
        ],
    );
    let mut cmd = Command::new(&prog);
    cmd.arg(scratch.path("ready"));
    assert_record_refuses(
        &scratch,
        &mut cmd,
        "libfabric without recognisable ops tables",
    );
}

/// Debian's MPICH 4 runs over UCX (ch4:ucx): its point-to-point and collectives post
/// `ucp_tag_send_nbx` and `ucp_tag_recv_nbx`, each counted inside the MPI call that made
/// it, with exactly the bytes the program moved; UCX's own calls are not the application's.
#[test]
fn mpich_over_ucx_is_attributed_to_mpi_calls() {
    ucx_loop("ucx-mpich", Mpi::Mpich, (&[], "ch4:ucx"), MPICH_BARRIER);
}

/// [`mpi_loop_on_fabric`] over UCX, whose tagged sends and receives are the loop's, and
/// only those: its one `MPI_Barrier` puts `barrier` (per rank, what it sends and receives)
/// on UCX; every operation's bytes are known; the UCX library is probed.
#[track_caller]
fn ucx_loop(
    name: &str,
    mpi: Mpi,
    (env, transport): (&[(&str, &str)], &str),
    barrier: [((u64, u64), (u64, u64)); 2],
) {
    let (profile, truths, stderr) = mpi_loop_on_fabric(
        name,
        mpi,
        env,
        ("ucp_tag_send_nbx", "ucp_tag_recv_nbx"),
        (&[], transport),
        barrier,
    );
    for truth in &truths {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        let on_ucx = routines_named(rank, "ucp_");
        assert_eq!(
            on_ucx,
            ["ucp_tag_recv_nbx", "ucp_tag_send_nbx"],
            "rank {}; {stderr}",
            truth["rank"]
        );
        // Contiguous buffers only: every operation's bytes known.
        assert_eq!(rank["fabric_undecoded"], 0, "{stderr}");
    }
    let flavors = library_flavors(&profile);
    assert!(flavors.contains(&"UCX"), "UCX probed: {flavors:?}");
}

/// `mpi_loop` of `n` iterations on 2 ranks of Debian's MPICH (over UCX), `record` attached
/// with `flags` once they are ready; the MPI profile equals the truth (MPI_Finalize's own
/// traffic aside). Returns the profile, the truths and commtap's stderr.
#[track_caller]
fn mpich_loop_attached(name: &str, n: u64, flags: &[&str]) -> (Value, Vec<Value>, String) {
    let scratch = Scratch::new(name);
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::Mpich, 2, n, &[]);
    let (commtap, out) = record_attached_with(&scratch, &ranks, flags);
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let run = finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);
    let truths = read_truths(&scratch.path("truth"), 2);
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    (profile, truths, run.stderr)
}

/// Time sampled one call in three (`--time-one-in 3`, no trace: no event wants the
/// calls): MPICH's `MPI_Send`, `MPI_Recv` and `MPI_Allreduce` and UCX's operations go
/// untimed two times in three, counted at their entry, and every UCX operation still counts
/// under the MPI call that made it: an operation made inside an MPI call counted untimed
/// (whose return is not seen) is that call's.
#[test]
fn sampled_mpi_calls_over_ucx_keep_their_operations() {
    let n: u64 = 3000;
    let (profile, truths, stderr) =
        mpich_loop_attached("ucx-sampled", n, &["--time-one-in", "3", "--no-skew"]);
    for truth in &truths {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        let who = format!("rank {}; {stderr}", truth["rank"]);
        let (sent, received) = loop_operations(
            n,
            MPICH_BARRIER[truth["rank"].as_u64().expect("rank") as usize % 2],
        );
        assert_eq!(made_by(rank, "ucp_tag_send_nbx"), sent, "{who}");
        assert_eq!(made_by(rank, "ucp_tag_recv_nbx"), received, "{who}");
        // Both the MPI calls and the operations were sampled (thousands of draws of 2 in
        // 3: none left untimed is no chance).
        for name in [
            "MPI_Send",
            "MPI_Allreduce",
            "ucp_tag_send_nbx",
            "ucp_tag_recv_nbx",
        ] {
            let r = &rank["routines"][name];
            let timed = r["sampled_time"]["timed_calls"].as_u64();
            let calls = r["calls"].as_u64().expect("calls");
            assert!(
                timed.is_some_and(|t| t < calls),
                "{name}: {timed:?} of {calls} timed; {who}"
            );
        }
    }
}

/// `--no-transports`: MPICH over UCX with MPI probed alone. Every MPI call is counted
/// exactly as the program made it, no UCX operation is (its library is not probed), and
/// the profile says why, naming the flag.
#[test]
fn no_transports_probes_mpich_alone_and_says_so() {
    let (profile, truths, stderr) = mpich_loop_attached("ucx-none", 3000, &["--no-transports"]);
    for truth in &truths {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        let on_ucx = routines_named(rank, "ucp_");
        assert!(
            on_ucx.is_empty(),
            "rank {}: {on_ucx:?}; {stderr}",
            truth["rank"]
        );
    }
    let flavors = library_flavors(&profile);
    assert!(!flavors.contains(&"UCX"), "UCX not probed: {flavors:?}");
    let left: Vec<&str> = profile["unsupported_libraries"]
        .as_array()
        .expect("unsupported_libraries")
        .iter()
        .filter_map(Value::as_str)
        .filter(|why| why.contains("libucp") && why.contains("--no-transports"))
        .collect();
    assert_eq!(left.len(), 1, "{:?}", profile["unsupported_libraries"]);
}

/// Open MPI 5 from its wheel over UCX (`pml ucx`, told to take any transport: this machine
/// has no InfiniBand), its own bundled `libucp`: the same.
#[test]
fn open_mpi_5_over_ucx_is_attributed_to_mpi_calls() {
    ucx_loop(
        "ucx-ompi5",
        Mpi::OpenMpi5,
        (
            &[
                ("OMPI_MCA_pml", "ucx"),
                ("OMPI_MCA_pml_ucx_tls", "any"),
                ("OMPI_MCA_pml_ucx_devices", "any"),
            ],
            "pml ucx",
        ),
        [((1, 0), (1, 0)); 2],
    );
}

/// MPICH 5 from its wheel over `ch4:ucx` (its shared memory turned off, which it would use
/// between ranks of one node), its own bundled `libucp`: the same.
#[test]
fn mpich_5_over_ucx_is_attributed_to_mpi_calls() {
    ucx_loop(
        "ucx-mpich5",
        Mpi::Mpich5,
        // The wheel's MPICH is built with two netmods (`ch4:ucx ofi`): the one its calls
        // went through is named.
        (
            &[("MPIR_CVAR_CH4_NETMOD", "ucx"), ("MPIR_CVAR_NOLOCAL", "1")],
            "ch4:ucx",
        ),
        [((1, 0), (1, 0)); 2],
    );
}

/// Intel MPI from PyPI over its own bundled libfabric, whose providers are separate DSOs
/// (`prov/librxm-fi.so` over `prov/libtcp-fi.so`): the MPI profile equals the truth and
/// what crosses the fabric is the application endpoint's (rxm's) operations, each made by
/// an MPI call; rxm's own calls into tcp, across the two DSOs, are libfabric's.
#[test]
fn intel_mpi_over_its_bundled_libfabric_is_attributed_to_mpi_calls() {
    let (profile, truths, stderr) = mpi_loop_on_fabric(
        "fabric-impi",
        Mpi::IntelMpi,
        &[],
        ("fi_tagged_inject", "fi_tagged_recv"),
        // Intel's libfabric serves FI_EP_RDM from tcp itself (no rxm fabric opened).
        (&["tcp"], "ch4:ofi"),
        [((1, 0), (1, 0)); 2],
    );
    for truth in &truths {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        let on_fabric = routines_named(rank, "fi_");
        // The application endpoint's tagged operations only (and Finalize's one send):
        // none of the msg operations beneath, which the provider makes itself.
        let ops = ["fi_tagged_inject", "fi_tagged_recv", "fi_tagged_send"];
        assert_eq!(on_fabric, ops, "rank {}; {stderr}", truth["rank"]);
        assert!(
            rank["fabric_internal"].as_u64() > Some(0),
            "the provider's own calls across its DSOs are libfabric's"
        );
        for op in ops {
            assert_eq!(
                rank["routines"][op]["calls"].as_u64(),
                Some(made_by_mpi(rank, op)),
                "every {op} was made by an MPI call"
            );
        }
    }
    let flavors = library_flavors(&profile);
    for provider in ["libfabric provider rxm", "libfabric provider tcp"] {
        assert!(
            flavors.contains(&provider),
            "{provider} probed: {flavors:?}"
        );
    }
}
