//! The bpffs directory where a daemon's counting maps are pinned, so that a restarted
//! daemon carries on with the counts of the one before.

use std::path::{Path, PathBuf};

use collector_common::{names, CommInfo, CounterKey, CounterVal, HandleKey, ProcStats, ROUTINES};

use super::AttachError;

/// `BPF_FS_MAGIC`, the file-system type of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The directory under `base` for this build's map layout: pinned maps of another layout
/// (an older commtap) are never reused. `a2`: slots are handed out from a fresh-slot
/// counter as well as the free stack (an older daemon's pins have no counter); `a3`:
/// persistent requests are kept (`PERSISTENT`); `a4`: the counters' values are one array
/// shared by the CPUs (a per-CPU one before); `a5`: `PERSISTENT` is a hash map under each
/// user's share, an LRU before (a pin is reopened whatever its type: an older daemon's LRU
/// would go on pushing one user's requests out for another's); `a6`: freed communicators'
/// per-peer counters are moved into `PEERS_FOLDED`, and handles' generations wrap at 15
/// bits (an older daemon would not read the moved ones); `a7`: each communicator's count
/// in `COLL_SEQ` holds how many were made from it above its collectives' (an older daemon
/// would read them as collectives); `a8`: `WATCHED_LATEST` stamps when processes enter
/// the watched set (an older daemon reusing the pins would leave the stamps stale, and the
/// next daemon would take the processes it watched for others given their pids); `t`: the
/// call sites' keys
/// (`CALL_SITES`, kept since).
pub fn state_dir_for_layout(base: &Path) -> PathBuf {
    let tag = format!(
        "layout-a8-k{}-s{}-v{}-d{}-p{}-c{}-h{}-r{}-e{}-t{}",
        size_of::<CounterKey>(),
        collector_common::MAX_COUNTERS,
        size_of::<CounterVal>(),
        size_of::<collector_common::DurationHist>(),
        size_of::<ProcStats>(),
        size_of::<CommInfo>(),
        size_of::<HandleKey>(),
        ROUTINES.len(),
        size_of::<collector_common::PeerKey>(),
        size_of::<collector_common::SiteKey>()
    );
    base.join(tag)
}

/// Creates `dir` and checks it is on a bpffs, where maps can be pinned (mounting bpffs on
/// /sys/fs/bpf first if nothing is mounted there, as systemd does at boot).
pub fn prepare_state_dir(dir: &Path) -> Result<(), AttachError> {
    let bpffs = Path::new("/sys/fs/bpf");
    if dir.starts_with(bpffs) && fs_type(bpffs) != Some(BPF_FS_MAGIC) {
        // SAFETY: mount(2) with static NUL-terminated strings.
        let rc = unsafe {
            libc::mount(
                c"bpf".as_ptr(),
                c"/sys/fs/bpf".as_ptr(),
                c"bpf".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(AttachError::StateDir(format!(
                "mounting bpffs on /sys/fs/bpf: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| AttachError::StateDir(format!("creating {}: {e}", dir.display())))?;
    if fs_type(dir) != Some(BPF_FS_MAGIC) {
        return Err(AttachError::StateDir(format!(
            "{} is not on a bpf file system (mount -t bpf bpf /sys/fs/bpf)",
            dir.display()
        )));
    }
    Ok(())
}

/// Unpins the kept maps in `dir` and removes it (and its parent, if that is left empty).
pub fn remove_state_dir(dir: &Path) {
    for map in names::maps::KEPT {
        let _ = std::fs::remove_file(dir.join(map));
    }
    let _ = std::fs::remove_dir(dir);
    if let Some(parent) = dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
}

/// Whether `path` is a mounted bpffs.
pub fn is_bpffs(path: &Path) -> bool {
    fs_type(path) == Some(BPF_FS_MAGIC)
}

/// The file-system type (`statfs.f_type`) of `path`.
fn fs_type(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: `statfs` is plain integers, for which all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs(2) with a NUL-terminated path into a struct of the right type.
    (unsafe { libc::statfs(c.as_ptr(), &raw mut st) } == 0).then_some(st.f_type as i64)
}
