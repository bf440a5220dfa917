//! Writes the seeds that need commtap's own types into `CORPUS/<target>/` (`cargo xtask
//! fuzz` runs it; the seeds copied from real files it makes itself):
//!
//! - `snapshot_push`: PushSnapshots messages as a daemon encodes them;
//! - `profile_json`: a profile as `commtap record --json` writes it;
//! - `identity_event`: the identity event of this very process;
//! - `demangled_name`: C++ and Rust symbols;
//! - `kernel_btf`: small BTF blobs holding the structures commtap looks up: one made up,
//!   one with the running kernel's `task_struct` and `mm_struct` (its whole BTF, also
//!   copied, is megabytes: too slow to mutate).
//!
//! Usage: `make_seeds CORPUS [SEEDS]`; with SEEDS (`fuzz/seeds`), it also checks that the
//! hand-written profiles there parse (a seed that does not only reaches serde's errors).

use std::{collections::BTreeMap, path::Path};

use collector::{
    api::pb::PushSnapshotsRequest,
    api::snapshot::{to_wire, ProcessKey, Snapshot},
    discover::Fabric,
    profile::{JobProfile, RankProfile},
    stats::{CommStats, DeviceTime, Health, RoutineStats, SizeBucket, Totals},
};
use collector_common::{EventKind, IDENTITY_ARGS_LEN, IDENTITY_ENV_LEN};
use prost::Message;

fn main() {
    let corpus = std::env::args_os()
        .nth(1)
        .expect("usage: make_seeds CORPUS");
    let corpus = Path::new(&corpus);
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir).expect("creating a corpus directory");
        std::fs::write(dir.join(name), bytes).expect("writing a seed");
    };

    let ranks: Vec<RankProfile> = (0..3).map(rank).collect();
    let profile = JobProfile {
        libraries: Vec::new(),
        unsupported_libraries: vec!["/opt/x/libmpi_abi.so: not decoded".into()],
        not_profiled: vec!["pid 9: exited".into()],
        call_events: true,
        ..JobProfile::of_ranks(ranks.clone())
    };
    let json = serde_json::to_string_pretty(&profile).expect("a profile serialises");
    write("profile_json", "generated.json", json.as_bytes());
    let one = JobProfile::of_ranks(vec![ranks[0].clone()]);
    let json = serde_json::to_string(&one).expect("a profile serialises");
    write("profile_json", "generated_one_rank.json", json.as_bytes());

    for n in 1..=ranks.len() {
        let processes = ranks[..n]
            .iter()
            .map(|r| {
                to_wire(&Snapshot {
                    key: ProcessKey {
                        node: r.host.clone(),
                        pid: r.pid,
                        start_ticks: r.start_ticks,
                        boot_id: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into(),
                    },
                    taken_ns: 1_000_000_000 * u64::from(r.rank + 1),
                    rank: r.clone(),
                })
            })
            .collect();
        let req = PushSnapshotsRequest {
            processes,
            ..Default::default()
        };
        write("snapshot_push", &format!("push_{n}"), &req.encode_to_vec());
    }

    // Names as programs' symbol tables hold them (the first byte is the length asked).
    for (i, name) in [
        "\u{ff}_ZN7trainer4Step9negotiateEl",
        "\u{40}_ZN4c10d16ProcessGroupNCCL9allreduceERSt6vectorIN2at6TensorESaIS3_EERKNS_16AllreduceOptionsE",
        "\u{ff}_ZL9negotiatel.constprop.0",
        "\u{20}_Z1fSt4pairIiiES_IS0_S0_ES_IS1_S1_ES_IS2_S2_E",
        "\u{ff}_ZN5trace7collect17h0123456789abcdefE",
        "\u{ff}_RNvCs1234_5trace7collect",
        "\u{ff}main::{lambda(int)#1}",
    ]
    .iter()
    .enumerate()
    {
        write("demangled_name", &format!("name_{i}"), name.as_bytes());
    }
    write("identity_event", "self", &identity_event());
    write("kernel_btf", "minimal", &minimal_btf());
    match std::fs::read("/sys/kernel/btf/vmlinux") {
        Ok(vmlinux) => match kernel_structs_btf(&vmlinux) {
            Some(btf) => write("kernel_btf", "vmlinux_task_mm", &btf),
            None => eprintln!("warning: no task_struct and mm_struct in this kernel's BTF"),
        },
        Err(e) => eprintln!("warning: reading /sys/kernel/btf/vmlinux: {e}"),
    }

    if let Some(seeds) = std::env::args_os().nth(2) {
        let dir = Path::new(&seeds).join("profile_json");
        for entry in std::fs::read_dir(&dir).expect("reading the profile seeds") {
            let path = entry.expect("reading the profile seeds").path();
            let bytes = std::fs::read(&path).expect("reading a profile seed");
            if let Err(e) = serde_json::from_slice::<JobProfile>(&bytes) {
                panic!("{} is not a valid profile: {e}", path.display());
            }
        }
    }
}

/// A rank with MPI, NCCL and libfabric routines, device time and communicators.
fn rank(rank: u32) -> RankProfile {
    let totals = |calls: u64, bytes: u64| Totals {
        calls,
        bytes,
        time_ns: calls * 1_500 + bytes / 3,
    };
    let bucket = |b: u8, lo: u64, hi: u64, t: Totals| SizeBucket {
        bucket: Some(b),
        min_bytes: Some(lo),
        max_bytes: Some(hi),
        totals: t,
        ..SizeBucket::default()
    };
    let mut routines = BTreeMap::new();
    routines.insert(
        "MPI_Allreduce".to_string(),
        RoutineStats {
            totals: totals(12, 4_104),
            undecoded_calls: 1,
            sizes: vec![
                bucket(2, 5, 8, totals(10, 80)),
                bucket(13, 2_049, 4_096, totals(1, 4_024)),
                SizeBucket {
                    totals: totals(1, 0),
                    ..SizeBucket::default()
                },
            ],
            comm_sizes: BTreeMap::from([(4, 11), (0, 1)]),
            ..RoutineStats::default()
        },
    );
    routines.insert(
        "MPI_Send".to_string(),
        RoutineStats {
            totals: totals(3, 24),
            sizes: vec![bucket(2, 5, 8, totals(3, 24))],
            comm_sizes: BTreeMap::from([(4, 3)]),
            ..RoutineStats::default()
        },
    );
    routines.insert(
        "ncclAllReduce".to_string(),
        RoutineStats {
            totals: totals(4, 1 << 22),
            sizes: vec![SizeBucket {
                device: Some(DeviceTime {
                    calls: 4,
                    bytes: 1 << 22,
                    time_ns: 2_000_000,
                    bus_bytes: Some(3 << 21),
                }),
                ..bucket(21, 524_289, 1 << 20, totals(4, 1 << 22))
            }],
            comm_sizes: BTreeMap::from([(2, 4)]),
            communicators: vec![
                CommStats {
                    id: Some("00000000deadbeef".into()),
                    size: 2,
                    rank: rank as i32 % 2,
                    totals: totals(3, 3 << 20),
                },
                CommStats {
                    id: None,
                    size: 0,
                    rank: -1,
                    totals: totals(1, 1 << 20),
                },
            ],
            ..RoutineStats::default()
        },
    );
    routines.insert(
        "fi_msg_send".to_string(),
        RoutineStats {
            totals: totals(5, 640),
            sizes: vec![bucket(8, 129, 256, totals(5, 640))],
            called_from: BTreeMap::from([("MPI_Send".to_string(), totals(3, 384))]),
            endpoints: BTreeMap::from([("0x55d0c0ffee00".to_string(), totals(5, 640))]),
            ..RoutineStats::default()
        },
    );
    RankProfile {
        rank,
        rank_known: rank != 2,
        pid: 4_242 + rank,
        host: format!("node{}", 17 + rank / 2),
        job: "4242".into(),
        cmdline: "./app --steps 10".into(),
        uid: Some(1_000),
        start_ticks: 81_234 + u64::from(rank),
        exited: rank == 0,
        detached: false,
        unwatched_ns: 0,
        world_size: None,
        elapsed_ns: 2_512_000_000,
        comm_time_ns: 1_830_000_000 - u64::from(rank) * 1_000_000,
        routines,
        health: Health {
            events: 20,
            dropped: u64::from(rank),
            undecoded: 1,
            nested: 2,
            ..Health::default()
        },
        fabrics: vec![Fabric {
            provider: "tcp;ofi_rxm".into(),
            name: "127.0.0.0/8".into(),
        }],
        peers: Vec::new(),
        container: None,
        mpi_transport: Some("ucx".into()),
        comm_ranks: Vec::new(),
        region: None,
        probe_call_cost: None,
        usage: Some(collector::profile::Usage {
            user_ns: 1_200_000_000,
            system_ns: 300_000_000,
            max_rss_bytes: 180 << 20,
            context_switches: Some(42),
            ..Default::default()
        }),
        settings: BTreeMap::from([("NCCL_ALGO".to_string(), "Ring".to_string())]),
        call_sites: vec![collector::profile::CallSite {
            routine: "MPI_Allreduce".into(),
            address: "0x55d0c0ffe1c3".into(),
            object: Some("/home/u/app".into()),
            function: Some("trainer::Step::negotiate(long)".into()),
            offset: 0x51,
            file_address: Some("0x11c3".into()),
            totals: totals(10, 80),
            timed_calls: 10,
            source_file: Some("/home/u/src/app.c".into()),
            source_line: Some(51),
        }],
        call_sites_left_out: 0,
    }
}

/// This process's identity event, as the kernel would send it.
fn identity_event() -> Vec<u8> {
    let env = std::fs::read("/proc/self/environ").unwrap_or_default();
    let args = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let (env, args) = (
        &env[..env.len().min(IDENTITY_ENV_LEN)],
        &args[..args.len().min(IDENTITY_ARGS_LEN)],
    );
    let mut out = Vec::new();
    for word in [
        EventKind::Identity as u32,
        std::process::id(),
        0,
        env.len() as u32,
        args.len() as u32,
        0,
    ] {
        out.extend_from_slice(&word.to_ne_bytes());
    }
    out.extend_from_slice(&123_456_789_000u64.to_ne_bytes());
    out.extend_from_slice(env);
    out.resize(32 + IDENTITY_ENV_LEN, 0);
    out.extend_from_slice(args);
    out.resize(32 + IDENTITY_ENV_LEN + IDENTITY_ARGS_LEN, 0);
    out
}

/// A BTF blob (Documentation/bpf/btf.rst) with `task_struct.mm`, `task_struct.start_boottime`
/// and `mm_struct`'s `arg_start`..`env_end` inside an anonymous struct, as the kernel's,
/// plus one type of most other kinds.
fn minimal_btf() -> Vec<u8> {
    let mut strings = vec![0u8];
    let mut name = |s: &str| {
        let at = strings.len() as u32;
        strings.extend_from_slice(s.as_bytes());
        strings.push(0);
        at
    };
    let (ulong, mm_struct, task_struct) = (
        name("unsigned long"),
        name("mm_struct"),
        name("task_struct"),
    );
    let fields = ["arg_start", "arg_end", "env_start", "env_end"].map(&mut name);
    let (pgd, mm, start, e, a, f) = (
        name("pgd"),
        name("mm"),
        name("start_boottime"),
        name("e"),
        name("A"),
        name("f"),
    );
    let info =
        |kind: u32, vlen: u32, kind_flag: bool| (u32::from(kind_flag) << 31) | (kind << 24) | vlen;
    let mut types: Vec<u32> = Vec::new();
    // 1: int "unsigned long", 64 bits.
    types.extend([ulong, info(1, 0, false), 8, 64]);
    // 2: anonymous struct { arg_start, arg_end, env_start, env_end }.
    types.extend([0, info(4, 4, false), 32]);
    for (i, f) in fields.iter().enumerate() {
        types.extend([*f, 1, 64 * i as u32]);
    }
    // 3: struct mm_struct { pgd; struct { ... }; }.
    types.extend([mm_struct, info(4, 2, false), 40, pgd, 1, 0, 0, 2, 64]);
    // 4: struct mm_struct *.
    types.extend([0, info(2, 0, false), 3]);
    // 5: struct task_struct { mm (bit 128); start_boottime (bit 256) }, with kind_flag.
    types.extend([task_struct, info(4, 2, true), 64, mm, 4, 128, start, 1, 256]);
    // 6: enum e { A = 1 }.
    types.extend([e, info(6, 1, false), 4, a, 1]);
    // 7: unsigned long[4].
    types.extend([0, info(3, 0, false), 0, 1, 1, 4]);
    // 8: unsigned long (*)(unsigned long), 9: func f.
    types.extend([0, info(13, 1, false), 1, 0, 1]);
    types.extend([f, info(12, 0, false), 8]);
    let types: Vec<u8> = types.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut out = Vec::new();
    out.extend_from_slice(&0xeb9fu16.to_le_bytes());
    out.extend_from_slice(&[1, 0]);
    for word in [
        24,
        0,
        types.len() as u32,
        types.len() as u32,
        strings.len() as u32,
    ] {
        out.extend_from_slice(&u32::to_le_bytes(word));
    }
    out.extend_from_slice(&types);
    out.extend_from_slice(&strings);
    out
}

/// The running kernel's `task_struct` and `mm_struct`, with every anonymous struct or union
/// nested in them, as a BTF blob of their own (every other member's type becomes one
/// integer type): the layout commtap reads, in a few kilobytes.
fn kernel_structs_btf(vmlinux: &[u8]) -> Option<Vec<u8>> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            vmlinux.get(at..at + 4)?.try_into().ok()?,
        ))
    };
    let hdr_len = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
    let strings = vmlinux.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    let name = |at: u32| -> &[u8] {
        let rest = strings.get(at as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|b| *b == 0).unwrap_or(rest.len())]
    };
    // Every struct and union by id: its name, info, size and members (name, type, offset).
    type Struct = (u32, u32, u32, Vec<(u32, u32, u32)>);
    let mut structs: BTreeMap<u32, Struct> = BTreeMap::new();
    let mut by_name: BTreeMap<&[u8], u32> = BTreeMap::new();
    let (mut at, end, mut id) = (hdr_len + type_off, hdr_len + type_off + type_len, 1u32);
    while at < end {
        let (name_off, info, size) = (u32_at(at)?, u32_at(at + 4)?, u32_at(at + 8)?);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        at += 12;
        if kind == 4 || kind == 5 {
            let member = |i: usize| {
                let m = at + 12 * i;
                Some((u32_at(m)?, u32_at(m + 4)?, u32_at(m + 8)?))
            };
            let members = (0..vlen).map(member).collect::<Option<Vec<_>>>()?;
            if kind == 4 && name_off != 0 {
                by_name.entry(name(name_off)).or_insert(id);
            }
            structs.insert(id, (name_off, info, size, members));
        }
        at += match kind {
            1 | 14 | 17 => 4,
            3 => 12,
            4 | 5 | 15 | 19 => 12 * vlen,
            6 | 13 => 8 * vlen,
            _ => 0,
        };
        id += 1;
    }
    // The structs kept, in order; each's new id is its index + 2 (1 is the integer type).
    let mut kept = vec![
        *by_name.get(&b"task_struct"[..])?,
        *by_name.get(&b"mm_struct"[..])?,
    ];
    let mut i = 0;
    while i < kept.len() {
        for &(m_name, ty, _) in &structs[&kept[i]].3 {
            if m_name == 0 && structs.contains_key(&ty) && !kept.contains(&ty) {
                kept.push(ty);
            }
        }
        i += 1;
    }
    let new_id = |old: u32| kept.iter().position(|k| *k == old).map(|i| i as u32 + 2);
    let mut new_strings = b"\0long\0".to_vec();
    let mut intern = |at: u32| -> u32 {
        if at == 0 {
            return 0;
        }
        let offset = new_strings.len() as u32;
        new_strings.extend_from_slice(name(at));
        new_strings.push(0);
        offset
    };
    let mut words: Vec<u32> = vec![1, 1 << 24, 8, 64];
    for old in &kept {
        let (name_off, info, size, members) = &structs[old];
        words.extend([intern(*name_off), *info, *size]);
        for &(m_name, ty, offset) in members {
            let ty = if m_name == 0 {
                new_id(ty).unwrap_or(1)
            } else {
                1
            };
            words.extend([intern(m_name), ty, offset]);
        }
    }
    let types: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut out = vmlinux.get(..4)?.to_vec();
    for word in [24, 0, types.len(), types.len(), new_strings.len()] {
        out.extend_from_slice(&(word as u32).to_le_bytes());
    }
    out.extend_from_slice(&types);
    out.extend_from_slice(&new_strings);
    Some(out)
}
