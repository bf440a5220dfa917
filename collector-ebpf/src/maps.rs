//! Every map the programs share with userspace. Sizes are defaults; userspace may resize
//! them before load (the ring buffer, for one, is `--ring-buffer-kib`).

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use collector_common::{
    launcher::COMM_LEN as LAUNCHER_COMM_LEN, shares::HANDLE_MAP_ENTRIES, ArgSpec, CallState,
    CommInfo, ComponentAddrs, Config, CounterKey, CounterVal, FabricRanges, FabricText, HandleKey,
    IdentityOffsets, Layout, ProcStats, TpOffsets,
};

/// Processes whose calls are counted: tgid -> `collector_common::watch` flags.
#[map]
pub static WATCHED: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

/// When a process last entered `WATCHED` (boot clock, ns), per CPU: entry
/// `watch::LATEST_KERNEL` the kernel's, `watch::LATEST_USERSPACE` userspace's. Kept across
/// restarts with the set: every process in it started no later than the latest stamp, so a
/// kept entry whose pid is a process started since is another process given that pid
/// while no daemon ran. Per CPU, so that no stamp is lowered by a slower write.
#[map]
pub static WATCHED_LATEST: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

/// Processes paused at a library load until userspace continues them: tgid -> when
/// (monotonic ns). Full: nobody more is paused.
#[map]
pub static PAUSED: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// Watched processes whose dynamic linker is changing its list of objects: tgid -> the
/// change (`RT_ADD` or `RT_DELETE` of `<link.h>`), until the list is consistent again
/// (glibc makes one change at a time, under its load lock). An LRU map: a process that
/// dies mid-change crowds out nobody.
#[map]
pub static LINK_CHANGE: LruHashMap<u32, i32> = LruHashMap::with_max_entries(4096, 0);

/// The names of job launchers (`collector_common::launcher`), never paused: name -> 1.
#[map]
pub static LAUNCHERS: HashMap<[u8; LAUNCHER_COMM_LEN], u8> = HashMap::with_max_entries(64, 0);

/// Processes a daemon limited to a cgroup found outside it at their first call (watch-all
/// mode): judged once, not at each of their calls (a cgroup v1 check walks the kernel's
/// structures). Until their exit or exec; an LRU map, so that other jobs' processes never
/// crowd out anything (one evicted is judged again).
#[map]
pub static OUT_OF_SCOPE: LruHashMap<u32, u8> = LruHashMap::with_max_entries(16384, 0);

/// The scope generation, the sum of its two entries: it moves whenever a process found not
/// counted may have become counted. Index 0 is the kernel's (an atomic add at every
/// process or thread made, whose pid may be an old one's, and every exec, a setuid image
/// say); index 1 is userspace's, its only writer (every change of the watched set or the
/// daemon's limits). Each only goes up, so the sum never comes back to a value it had:
/// one counter written by both could (userspace's read-then-write undoing adds made
/// between its read and its write).
#[map]
pub static SCOPE_GEN: Array<u64> = Array::with_max_entries(2, 0);

/// The process last found not counted on a CPU, with the scope generation it was judged
/// in (`crate::process::not_counted`: one u64, written by one store, so that a program
/// preempted on this CPU by another never leaves one's process with the other's
/// generation): a process that calls MPI and is not watched (another job's, another
/// user's) is judged once per CPU, not at each call (the watched set's hash and the limits
/// were half of such a call's program time).
#[map]
pub static NOT_COUNTED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The generation kept at index 0 of `map` (its value plus one, so never 0: a zeroed
/// stamp is nobody's).
#[inline(always)]
pub fn generation(map: &Array<u64>) -> u64 {
    count(map, 0).wrapping_add(1)
}

/// Entry `i` of a counter `map`, read once (0 if there is none).
#[inline(always)]
pub fn count(map: &Array<u64>, i: u32) -> u64 {
    // SAFETY: a plain u64 other CPUs (and userspace) may move at any time; a stale read
    // only makes a stamp look current for the generation it was taken in.
    map.get_ptr(i)
        .map_or(0, |p| unsafe { core::ptr::read_volatile(p) })
}

/// Moves the generation kept at index 0 of `map`.
#[inline(always)]
pub fn advance(map: &Array<u64>) {
    if let Some(p) = map.get_ptr_mut(0) {
        use core::intrinsics::{atomic_xadd, AtomicOrdering};
        // SAFETY: the map's value, updated with BPF's atomic add (several CPUs may move it
        // at once; a lost update could leave a stamp looking current).
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, 1) };
    }
}

/// The routine table (`collector_common::ROUTINES` specs), indexed by routine id.
#[map]
pub static ROUTINE_SPECS: Array<ArgSpec> = Array::with_max_entries(1024, 0);

/// Per routine id: time one call in N, chosen at random (0 or 1: every call). Only for
/// routines whose time may be sampled (`ArgSpec::time_may_be_sampled`), and only through
/// uprobe sessions, whose entry can skip the return.
#[map]
pub static TIME_ONE_IN: Array<u32> = Array::with_max_entries(1024, 0);

/// Per process and routine (`one_in::key`): the process's own N, for the routines whose
/// `TIME_ONE_IN` entry says `one_in::PER_PROCESS` (the budget's, one process's need at a
/// time). Written by userspace only.
#[map]
pub static PROCESS_ONE_IN: HashMap<u64, u32> = HashMap::with_max_entries(65536, 0);

/// The N of `routine` in process `tgid`: one call in N timed (0 or 1: every call).
#[inline(always)]
pub fn time_one_in(routine: u16, tgid: u32) -> u32 {
    use collector_common::one_in;
    let n = TIME_ONE_IN.get(u32::from(routine)).copied().unwrap_or(0);
    if n & one_in::PER_PROCESS == 0 {
        return n;
    }
    // SAFETY: plain value.
    unsafe { PROCESS_ONE_IN.get(one_in::key(tgid, routine)) }
        .copied()
        .unwrap_or(1)
}

/// Whether a call of a routine timed one call in `n` goes untimed: the thread's next draw
/// ([`collector_common::next_draw`], its sequence in `draws` seeded from the kernel's
/// generator at its first) is not a multiple of `n`.
#[inline(always)]
pub fn not_drawn(n: u32, draws: &mut u32) -> bool {
    if n <= 1 {
        return false;
    }
    let mut x = *draws;
    if x == 0 {
        // SAFETY: the helper only returns a pseudo-random number. Never 0: a xorshift
        // state of 0 stays 0.
        x = unsafe { aya_ebpf::helpers::bpf_get_prandom_u32() } | 1;
    }
    x = collector_common::next_draw(x);
    *draws = x;
    !x.is_multiple_of(n)
}

/// Object layouts per probed library, indexed by the cookie's layout slot.
#[map]
pub static LAYOUTS: Array<Layout> = Array::with_max_entries(collector_common::MAX_LAYOUTS, 0);

/// Run-time settings (index 0).
#[map]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// Tracepoint field offsets for this kernel (index 0).
#[map]
pub static TP_OFFSETS: Array<TpOffsets> = Array::with_max_entries(1, 0);

/// This kernel's `task_struct`/`mm_struct` offsets for identity events (index 0).
#[map]
pub static IDENTITY_OFFSETS: Array<IdentityOffsets> = Array::with_max_entries(1, 0);

/// In-flight call state per thread. In the object this is a placeholder: userspace creates
/// the real map, a `BPF_MAP_TYPE_TASK_STORAGE` (which aya-ebpf cannot declare and which
/// needs BTF), and relocates the MPI programs against it. Task storage costs about a tenth
/// of a hash-map update here and is freed with its thread.
#[map]
pub static TASK_STATE: HashMap<u32, CallState> = HashMap::with_max_entries(1, 0);

/// This thread's call state; created on first use when `create`.
#[inline(always)]
pub fn call_state(create: bool) -> Option<*mut CallState> {
    use aya_ebpf::{bindings::BPF_LOCAL_STORAGE_GET_F_CREATE, helpers::generated as h};
    let flags = if create {
        u64::from(BPF_LOCAL_STORAGE_GET_F_CREATE)
    } else {
        0
    };
    // SAFETY: helpers with the map's own address (relocated to the task-storage map) and
    // the current task's BTF pointer; a NULL result means no storage.
    let p = unsafe {
        h::bpf_task_storage_get(
            core::ptr::addr_of!(TASK_STATE) as *mut core::ffi::c_void,
            h::bpf_get_current_task_btf(),
            core::ptr::null_mut(),
            flags,
        )
    };
    if p.is_null() {
        None
    } else {
        Some(p.cast())
    }
}

/// This thread's call state, made if needed for a thread of counted process `tgid`.
#[inline(always)]
pub fn new_call_state(tgid: u32) -> Option<*mut CallState> {
    let e = call_state(true)?;
    // SAFETY: the thread's own state.
    unsafe {
        (*e).tgid = tgid;
        (*e).counted_gen = crate::cache::stamp();
    }
    Some(e)
}

/// NCCL device time: per operation key, the windows from an operation's enqueue to the
/// return of the host's next wait for the GPU (calls = operations in those windows).
/// Entries are allocated as keys come, like every per-CPU hash here: preallocated, the
/// per-CPU hashes took 3.5 MiB per possible CPU (0.9 GiB of a 256-CPU node's memory, and
/// 0.2 s of each start) whatever was counted.
#[map]
pub static DEVICE_TIME: PerCpuHashMap<CounterKey, CounterVal> =
    PerCpuHashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// libfabric: the table kind (0 msg, 1 rma, 2 tagged) of each probed function seen called
/// on an endpoint whose table of that kind holds it, by `Cookie::fabric_function`.
#[map]
pub static FABRIC_KINDS: HashMap<u64, u8> = HashMap::with_max_entries(16384, 0);

/// libfabric: the file virtual address of each probed function, by
/// `Cookie::fabric_function` (with the probe's address, the library's load bias).
#[map]
pub static FABRIC_FUNCS: HashMap<u64, u64> = HashMap::with_max_entries(65536, 0);

/// libfabric: each probed library's code range, by its layout slot.
#[map]
pub static FABRIC_TEXT: Array<FabricText> =
    Array::with_max_entries(collector_common::MAX_LAYOUTS, 0);

/// libfabric: per process, where libfabric and its provider DSOs have their code.
#[map]
pub static FABRIC_RANGES: HashMap<u32, FabricRanges> = HashMap::with_max_entries(16384, 0);

/// Open MPI: per process, where its selected components are kept (read at `MPI_Init`'s
/// return).
#[map]
pub static MPI_COMPONENTS: HashMap<u32, ComponentAddrs> = HashMap::with_max_entries(16384, 0);

/// Health counters and MPI lifetime marks per process.
#[map]
pub static PROC_STATS: PerCpuHashMap<u32, ProcStats> =
    PerCpuHashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Sizes of derived datatypes learnt from constructors (integer-handle ABIs).
#[map]
pub static DTYPES: HashMap<HandleKey, u64> = HashMap::with_max_entries(HANDLE_MAP_ENTRIES, 0);

/// Communicator size and rank learnt from MPI_Comm_size / MPI_Comm_rank (integer-handle ABIs).
#[map]
pub static COMMS: HashMap<HandleKey, CommInfo> = HashMap::with_max_entries(HANDLE_MAP_ENTRIES, 0);

/// Call and process events for userspace (latency, timelines, process tracking).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// The size of [`EVENTS`], bytes.
pub const EVENTS_BYTES: u32 = 1 << 20;

/// Applies `f` to this CPU's stats of `tgid`, creating them first if needed. What `f`
/// adds it adds atomically ([`add_proc_stat`]): a uprobe's or a tracepoint's program may be
/// preempted (the kernel gives them no private stack for that reason), and another thread
/// of the process run meanwhile on the same CPU changes the same value, so a plain `+=`
/// across the preemption would lose that thread's counts. What `f` stores outright (a
/// time, a status) may be stored by the last writer.
#[inline(always)]
pub fn with_proc_stats(tgid: u32, f: impl FnOnce(&mut ProcStats)) {
    let made = || {
        new_proc_stats(tgid);
        PROC_STATS.get_ptr_mut(tgid)
    };
    let Some(s) = PROC_STATS.get_ptr_mut(tgid).or_else(made) else {
        return;
    };
    // SAFETY: per-CPU value of this CPU; its counters are only added to atomically.
    f(unsafe { &mut *s });
}

/// Adds `v` to the counter `field` picks of this CPU's stats of `tgid`, atomically (see
/// [`with_proc_stats`]).
#[inline(always)]
pub fn add_proc_stat(tgid: u32, v: u64, field: impl FnOnce(&mut ProcStats) -> &mut u64) {
    with_proc_stats(tgid, |s| {
        // SAFETY: a field of a map value.
        unsafe { crate::counters::add_atomic(core::ptr::from_mut(field(s)), v) }
    });
}

/// Zero stats, which new entries of [`PROC_STATS`] are copied from: nothing writes it.
#[map]
pub static ZERO_PROC_STATS: Array<ProcStats> = Array::with_max_entries(1, 0);

/// Makes `tgid`'s stats, zero, where another CPU has not made them first. Copied from
/// [`ZERO_PROC_STATS`], not from zero stats on the stack: BPF's 512 bytes of stack are
/// those of a whole chain of calls (uprobe programs have no private stack: they may be
/// preempted), and a deep return path calls this.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn new_proc_stats(tgid: u32) -> u32 {
    if let Some(zero) = ZERO_PROC_STATS.get(0) {
        let _ = PROC_STATS.insert(tgid, zero, u64::from(BPF_NOEXIST));
    }
    // A global function must return a scalar.
    0
}
