//! What the kernel holds for commtap: the BPF programs loaded, read through bpf(2) as
//! `bpftool prog` reads them.

use std::time::Duration;

/// A loaded BPF program: its name and when it was loaded (ns since boot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedProgram {
    /// Its name (the first 15 bytes).
    pub name: String,
    /// `CLOCK_BOOTTIME` at its load.
    pub load_time_ns: u64,
}

const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `bpf_prog_info` up to its name (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct ProgInfo {
    kind: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_OBJ_GET: libc::c_long = 7;

fn bpf(cmd: libc::c_long, attr: &mut [u64]) -> libc::c_long {
    // SAFETY: `attr` is a zeroed bpf_attr prefix of the size given, as these commands read.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), size_of_val(attr)) }
}

/// Whether the BPF hash map pinned at `path`, keyed by a `u32` (a pid), holds `key`.
pub fn pinned_map_holds(path: &std::path::Path, key: u32) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let fd = bpf(BPF_OBJ_GET, &mut [c.as_ptr() as u64, 0, 0]);
    assert!(
        fd >= 0,
        "{}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    // Room for any value of these maps.
    let mut value = [0u64; 64];
    let mut attr = [
        fd as u64,
        (&raw const key) as u64,
        value.as_mut_ptr() as u64,
        0,
    ];
    let found = bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) == 0;
    let missing = std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
    // SAFETY: the descriptor bpf(2) just gave us.
    unsafe { libc::close(fd as libc::c_int) };
    assert!(found || missing, "looking {key} up in {}", path.display());
    found
}

/// Every BPF program loaded now (root only).
pub fn loaded_bpf_programs() -> Vec<LoadedProgram> {
    let mut programs = Vec::new();
    let mut id = 0u32;
    loop {
        let mut attr = [u64::from(id), 0, 0];
        if bpf(BPF_PROG_GET_NEXT_ID, &mut attr) != 0 {
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::ENOENT),
                "listing BPF programs (root is needed)"
            );
            return programs;
        }
        // next_id is the second u32 of the attribute.
        id = (attr[0] >> 32) as u32;
        let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut [u64::from(id), 0, 0]);
        if fd < 0 {
            continue; // unloaded meanwhile
        }
        let mut info = ProgInfo::default();
        let mut attr = [
            fd as u64 | ((size_of::<ProgInfo>() as u64) << 32),
            (&raw mut info) as u64,
            0,
        ];
        let rc = bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr);
        // SAFETY: the descriptor bpf(2) just gave us.
        unsafe { libc::close(fd as libc::c_int) };
        if rc == 0 {
            let len = info.name.iter().position(|&b| b == 0).unwrap_or(16);
            programs.push(LoadedProgram {
                name: String::from_utf8_lossy(&info.name[..len]).into_owned(),
                load_time_ns: info.load_time,
            });
        }
    }
}

/// Now, on the clock of [`LoadedProgram::load_time_ns`].
pub fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a timespec to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Waits until no commtap program loaded since `since_ns` is loaded any more (a commtap
/// that has ended may leave its detach to a child: see `Probes::detach_in_background`);
/// fails after `limit`, naming those left.
pub fn wait_for_commtap_programs_unloaded(since_ns: u64, limit: Duration) {
    use collector_common::names::programs::{PROBES, SCHED_EXEC, SCHED_EXIT, SCHED_FORK, SESSIONS};
    let ours = || {
        loaded_bpf_programs()
            .into_iter()
            .filter(|p| {
                p.load_time_ns >= since_ns
                    && PROBES
                        .iter()
                        .chain(&SESSIONS)
                        .chain(&[SCHED_FORK, SCHED_EXEC, SCHED_EXIT])
                        .any(|n| p.name == n[..n.len().min(15)])
            })
            .collect::<Vec<_>>()
    };
    let limit_at = std::time::Instant::now() + limit;
    loop {
        let left = ours();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < limit_at,
            "commtap's programs still loaded after {limit:?}: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
