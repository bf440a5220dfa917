//! Records and map keys/values exchanged between the BPF programs and userspace.
//!
//! No `bool`, no implicit padding: every struct spells out its `_pad` fields and is checked
//! by a `const` assertion below it.

use core::mem::{offset_of, size_of};

/// Which MPI implementation family's ABI a probed library has (decides handle decoding).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abi {
    /// Open MPI (4.x, 5.x): handles are pointers to objects.
    OpenMpi = 1,
    /// MPICH and derivatives (Intel MPI): handles are 32-bit integers encoding builtin sizes.
    Mpich = 2,
    /// NCCL and RCCL: communicators are pointers, datatypes an enum, counts `size_t`.
    Nccl = 3,
    /// libfabric provider ops-table functions (`ep->msg->send` ...): lengths are `size_t`,
    /// vectors `struct iovec`, messages `struct fi_msg`.
    Fabric = 4,
    /// The MPI-5 standard ABI (`libmpi_abi.so`, MPICH 4.2+'s `mpicc_abi`): handles are
    /// pointer-sized, predefined ones small constants, the others pointers to MPICH's
    /// objects (see [`mpi_abi`]).
    MpiAbi = 5,
}

impl Abi {
    /// The ABI with this id, if any.
    pub const fn from_u8(v: u8) -> Option<Abi> {
        match v {
            1 => Some(Abi::OpenMpi),
            2 => Some(Abi::Mpich),
            3 => Some(Abi::Nccl),
            4 => Some(Abi::Fabric),
            5 => Some(Abi::MpiAbi),
            _ => None,
        }
    }

    /// Whether, once read through [`handle`-normalising](mpi_abi::to_mpich), the ABI's
    /// handles are MPICH's integers: sizes of derived types and communicators learnt from
    /// the calls that make or ask them, `MPI_COMM_WORLD` known by value.
    #[inline(always)]
    pub const fn integer_handles(abi: u8) -> bool {
        abi == Abi::Mpich as u8 || abi == Abi::MpiAbi as u8
    }

    /// `MPI_PROC_NULL` in this ABI (Open MPI -2; MPICH and Intel MPI -1, where -2 is
    /// `MPI_ANY_SOURCE`; the MPI-5 ABI -3): a point-to-point call with it moves 0 bytes, whatever its count
    /// (mpitrace's convention: nothing crosses the network).
    #[inline(always)]
    pub const fn proc_null(abi: u8) -> Option<i32> {
        match Abi::from_u8(abi) {
            Some(Abi::OpenMpi) => Some(-2),
            Some(Abi::Mpich) => Some(-1),
            Some(Abi::MpiAbi) => Some(mpi_abi::PROC_NULL),
            _ => None,
        }
    }
}

/// Attach cookie: which routine a probe point is, and which layout slot its library uses.
///
/// Bits 0..16 hold the routine id, bits 16..24 the layout slot (index into the
/// `LAYOUTS` map; for libfabric, the library's number), bits 24..32 the [`Abi`], bits
/// 32..48 the probed libfabric function's index in its library's list, bits 48..56 how
/// far past the function's first byte the probe sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cookie {
    /// Index into [`crate::ROUTINES`].
    pub routine: u16,
    /// Index into the `LAYOUTS` array map.
    pub layout: u8,
    /// The library's [`Abi`] as its `u8` id.
    pub abi: u8,
    /// libfabric: index of the probed function in its library's list (0 otherwise).
    pub function: u16,
    /// libfabric: bytes between the function's start and the probe.
    pub skip: u8,
}

impl Cookie {
    /// Packs the cookie into the 64-bit value the kernel stores per attachment.
    pub const fn pack(self) -> u64 {
        (self.routine as u64)
            | ((self.layout as u64) << 16)
            | ((self.abi as u64) << 24)
            | ((self.function as u64) << 32)
            | ((self.skip as u64) << 48)
    }

    /// Unpacks a cookie read with `bpf_get_attach_cookie`.
    #[inline(always)]
    pub const fn unpack(v: u64) -> Cookie {
        Cookie {
            routine: (v & 0xffff) as u16,
            layout: ((v >> 16) & 0xff) as u8,
            abi: ((v >> 24) & 0xff) as u8,
            function: ((v >> 32) & 0xffff) as u16,
            skip: ((v >> 48) & 0xff) as u8,
        }
    }

    /// The `comm_id` a libfabric call is counted under: its library and function.
    #[inline(always)]
    pub const fn fabric_function(self) -> u64 {
        ((self.layout as u64) << 16) | self.function as u64
    }
}

/// Per-library object layout used to decode handles (filled by userspace per library version).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Open MPI: offset of `size` (size_t) in a datatype object.
    pub dt_size_off: u32,
    /// Open MPI: offset of `c_my_rank` (int) in a communicator.
    pub comm_rank_off: u32,
    /// Open MPI: offset of `c_local_group` (pointer) in a communicator.
    pub comm_group_off: u32,
    /// Open MPI: offset of `grp_proc_count` (int) in a group.
    pub group_size_off: u32,
    /// Open MPI: offset of `c_contextid` (uint32_t) in a communicator, 0 if unknown. Every
    /// member of a communicator holds the same context id (Open MPI agrees on it when the
    /// communicator is created), so it names the communicator across processes.
    pub comm_cid_off: u32,
    /// Explicit padding.
    pub _pad: u32,
}
const _: () = assert!(size_of::<Layout>() == 24);

/// Arguments saved at entry: 6 in registers and 6 from the stack (x86-64 SysV).
pub const MAX_ARGS: usize = 12;

/// Slots in [`CallState::args`] (a power of two >= [`MAX_ARGS`], so that `i & 15`
/// indexes without a bounds check the verifier could lose track of).
pub const ARG_SLOTS: usize = 16;
const _: () = assert!(ARG_SLOTS >= MAX_ARGS && ARG_SLOTS.is_power_of_two());

/// A thread's in-flight MPI call, saved at entry and read at return. Kept in task-local
/// storage (one per thread, freed with the thread); userspace creates that map, so it
/// needs this size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallState {
    /// Monotonic ns at entry.
    pub start_ns: u64,
    /// Arguments (`MAX_ARGS` used).
    pub args: [u64; ARG_SLOTS],
    /// Nested MPI calls currently inside this one (not counted again).
    pub depth: u32,
    /// [`CallState::BUSY`] while the thread is inside an MPI call, 0 when idle.
    pub busy: u32,
    /// NCCL: monotonic ns at the entry of the outermost open `ncclGroupStart`.
    pub group_start_ns: u64,
    /// NCCL: bytes of the operations enqueued in the open group.
    pub group_bytes: u64,
    /// NCCL: `ncclGroupStart` calls not yet matched by `ncclGroupEnd` (groups nest).
    pub group_depth: u32,
    /// NCCL: operations enqueued in the open group.
    pub group_ops: u32,
    /// Device-time window: monotonic ns at the entry of its first NCCL operation (or group).
    pub win_start_ns: u64,
    /// Device-time window: bytes of its operations.
    pub win_bytes: u64,
    /// Device-time window: the counter key of its first operation.
    pub win_key: CounterKey,
    /// Device-time window: NCCL operations (or groups) enqueued since the last device
    /// synchronisation of this thread.
    pub win_ops: u32,
    /// Device-time window: 1 if its operations differ in routine, size bucket or
    /// communicator (then its time cannot be split among them).
    pub win_mixed: u32,
    /// libfabric call made inside an MPI or NCCL call: monotonic ns at its entry.
    pub fab_start_ns: u64,
    /// libfabric (or UCX) call made inside an MPI or NCCL call: its six register
    /// arguments.
    pub fab_args: [u64; 6],
    /// The routine of the call in progress (`args`), for libfabric calls made inside it.
    pub routine: u16,
    /// The routine of the libfabric call in `fab_args`.
    pub fab_routine: u16,
    /// 1 while a libfabric call made inside an MPI or NCCL call is in progress.
    pub fab_busy: u32,
    /// libfabric calls made inside that one (a provider layered on another).
    pub fab_depth: u32,
    /// libfabric calls libfabric made itself (not counted) whose returns are still to come,
    /// made while no counted libfabric call was in progress on the thread.
    pub fab_internal: u32,
    /// The MPI handles this thread's calls decoded last.
    pub cache: HandleCache,
    /// The attach cookie of the call in `args`: its return probe shares the attach point,
    /// so the return reads it here instead of asking the kernel again.
    pub cookie: u64,
    /// The thread's process (a thread's tgid never changes), set when the state is made.
    pub tgid: u32,
    /// Call events this thread tried to emit (sent or dropped): numbers them, so that
    /// userspace sees where one went missing.
    pub events: u32,
    /// The stamp of the handle generation in which the process was last found counted:
    /// a detach bumps the generation, and the next call checks again.
    pub counted_gen: u64,
    /// A persistent request's creation that returned: its bytes plus one (0: none), for
    /// the request to be learnt after the return path (whose stack has no room for it).
    pub persistent_pending: u64,
    /// The routine, plus one (0: none), of the thread's MPI call in progress if it was
    /// counted untimed at its entry: its return is not seen, so a transport call made
    /// while no timed call is in progress on the thread is taken as made by it. Set at
    /// every MPI entry (the MPI library makes transport calls inside MPI calls only).
    pub untimed_parent: u16,
    /// The parent routine of the transport call in progress outside any timed MPI call
    /// (`CounterKey::NO_PARENT`: none).
    pub top_parent: u16,
    /// The thread's last draw for sampled time ([`crate::next_draw`]; 0: none yet): a few
    /// instructions a call where the kernel's random helper cost a helper call.
    pub draws: u32,
    /// The collective in progress's instance number on its communicator plus one (0: not
    /// numbered: the kernel did not see the communicator made, or it is not a collective),
    /// set at its entry (see [`crate::instances`]), with [`CallState::INSTANCE_UNTIMED`].
    pub instance: u64,
    /// Followed receives among the requests of the completion call in progress that may
    /// complete them (`MPI_Test*`, `MPI_Waitany`, `MPI_Waitsome`), kept by (thread, index)
    /// in a [`MaybeKey`] map: its return says which it did (see `posted.rs` in the BPF
    /// crate).
    pub maybe_n: u32,
    /// What the return path just counted, for the call-site counters (`CallState::DONE_*`),
    /// read and cleared after it in the program's own frame (the return path's stack is
    /// full): 0 where it counted nothing (a nested call's return, an orphan).
    pub done: u32,
    /// The bytes of the call the return path just counted.
    pub done_bytes: u64,
    /// Its duration, ns, where `done` is [`CallState::DONE_TIMED`].
    pub done_ns: u64,
    /// Where the program called the Fortran binding last entered on this thread (while
    /// call sites are counted): the site of an MPI call made from within `outer_lo` ..
    /// `outer_hi` (the code of the binding's library), in place of the binding's address.
    pub outer_site: u64,
    /// The start of the code of the library of the binding last entered.
    pub outer_lo: u64,
    /// The end of that code.
    pub outer_hi: u64,
    /// Where on the stack `outer_site` is (the binding's stack pointer at its entry): the
    /// binding has not returned while that word still holds it, above the stack pointer.
    pub outer_sp: u64,
    /// The kernel's jiffies at the entry of the thread's last MPI or NCCL call where it was
    /// counted untimed (`untimed_parent` names it): no clock is read for such a call, and
    /// its return is not seen, so this tick count is all that says since when a thread may
    /// be inside it (a hung job's sampled routine; see `attach::inflight`).
    pub untimed_since_jiffies: u64,
    /// The stack pointer at the entry of the call in progress (`busy`): where its return
    /// address is. A call entered above it, or while that word no longer holds the kernel's
    /// return-probe trampoline, is not nested in it: that call was left without returning
    /// (`longjmp`, an exception), and is given up (`abandoned`).
    pub entry_sp: u64,
    /// The event of the call returning, filled here rather than on the return path's
    /// stack: BPF's 512 bytes of stack are those of a whole chain of calls (a uprobe
    /// program has no private stack), and the return path's is most of them.
    pub event: CallEvent,
    /// A new record of holdings (a process's or a user's: `shares.rs` in the BPF crate),
    /// made here for the same reason, then copied into its map.
    pub new_held: crate::shares::Held,
}
const _: () = assert!(size_of::<CallState>() == 712 + 72 + 96 + 80);

/// A thread's user registers as its last entry into the kernel saved them (`pt_regs`),
/// and the return addresses the kernel moved to its return-probe trampoline, which the
/// task iterator `task_registers` writes: what unwinding a thread's stack needs beyond the
/// stack (`/proc/PID/task/TID/syscall` gives no frame pointer, and a call whose return is
/// probed returns to the trampoline, not to its caller).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegisters {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer (`rbp`).
    pub bp: u64,
    /// Of `returns`, those filled in.
    pub returns_n: u64,
    /// The thread's calls whose returns are probed, latest first: where each one's return
    /// address was on the stack, and that address.
    pub returns: [ReturnSlot; MAX_PROBED_RETURNS],
    /// The monotonic clock as the iterator ran (not the thread's: a reading of the clock
    /// with `jiffies`, which measures the kernel's tick, `clock::TickClock`).
    pub now_ns: u64,
    /// The kernel's tick count as the iterator ran.
    pub jiffies: u64,
}

impl UserRegisters {
    /// What two reads of one thread must agree on (the clock's reading aside).
    pub fn thread_state(&self) -> UserRegisters {
        UserRegisters {
            now_ns: 0,
            jiffies: 0,
            ..*self
        }
    }
}

/// Most of a thread's probed returns [`UserRegisters`] carries (MPI's calls inside calls
/// are few: a collective and its transport's operation).
pub const MAX_PROBED_RETURNS: usize = 8;

/// A return address the kernel replaced with its return-probe trampoline.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReturnSlot {
    /// Where on the stack it was.
    pub slot: u64,
    /// The address.
    pub to: u64,
}

const _: () = assert!(size_of::<UserRegisters>() == 48 + 16 * MAX_PROBED_RETURNS);

/// x86-64's `struct pt_regs`, as 8-byte slots: where `UserRegisters` are read from.
pub mod pt_regs {
    /// `bp`.
    pub const BP: usize = 4;
    /// `ip`.
    pub const IP: usize = 16;
    /// `sp`.
    pub const SP: usize = 19;
}

/// The attach cookie of a Fortran binding's probe (collector-ebpf's `binding_entry`): where
/// the code of the binding's library is, from the probe's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindingCookie {
    /// Bytes from the start of the library's code to the probe.
    pub from_start: u32,
    /// The length of the library's code.
    pub len: u32,
}

impl BindingCookie {
    /// Packs the cookie into the 64-bit value the kernel stores per attachment.
    pub const fn pack(self) -> u64 {
        ((self.from_start as u64) << 32) | self.len as u64
    }

    /// Unpacks a cookie read with `bpf_get_attach_cookie`.
    #[inline(always)]
    pub const fn unpack(v: u64) -> BindingCookie {
        BindingCookie {
            from_start: (v >> 32) as u32,
            len: v as u32,
        }
    }
}

/// A request of a completion call in progress that may complete it: the calling thread
/// and the request's index among the call's requests.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MaybeKey {
    /// The calling thread.
    pub tid: u32,
    /// The request's index in the call's requests.
    pub index: u32,
}
const _: () = assert!(size_of::<MaybeKey>() == 8);

/// A followed receive a completion call may complete, by [`MaybeKey`]: the call (its
/// `start_ns`: an entry left by an earlier call of the thread is not this call's), the
/// receive's request handle, and the call that posted it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaybeArrival {
    /// The completion call's `start_ns`.
    pub call_start_ns: u64,
    /// The receive's request handle.
    pub handle: u64,
    /// The call that posted it.
    pub posted: PostedRecv,
}
const _: () = assert!(size_of::<MaybeArrival>() == 32);

impl CallState {
    /// `busy`: inside a call whose return will be seen.
    pub const BUSY: u32 = 1;
    /// `busy`: inside a call counted at its entry, untimed, whose return will not be seen
    /// (only while the return path counts it, then idle).
    pub const BUSY_UNTIMED: u32 = 2;
    /// In `instance`: a drawn instance whose return is seen for who is late's event, but
    /// whose time its counter takes as an untimed call's (the routine's own draw said so):
    /// the times the profile estimates from stay one call in N at random, where the drawn
    /// instances are all of a communicator's first 1,024.
    pub const INSTANCE_UNTIMED: u64 = 1 << 63;

    /// `done`: the return path counted a timed call.
    pub const DONE_TIMED: u32 = 1;
    /// `done`: the return path counted an untimed call.
    pub const DONE_UNTIMED: u32 = 2;

    /// The call's instance number plus one (0: none), without its flag.
    #[inline(always)]
    pub const fn instance_number(&self) -> u64 {
        self.instance & !Self::INSTANCE_UNTIMED
    }

    /// Whether the counters take the call as timed (its return seen, and its time drawn).
    #[inline(always)]
    pub const fn counted_timed(&self) -> bool {
        self.busy != Self::BUSY_UNTIMED && self.instance & Self::INSTANCE_UNTIMED == 0
    }
}
const _: () = assert!(offset_of!(CallState, cache) == 296);

/// Per-thread cache of the MPI handles a thread's last calls decoded: datatype sizes (Open
/// MPI's are read from the library's object, measured at ~110 ns a read here; MPICH's
/// derived ones are a hash lookup), its last communicator (a hash lookup, ~55 ns) and the
/// counter slots of its last keys (see `COUNTER_SLOTS`). A loop of calls on one
/// communicator and datatype then decodes and counts from here. It is valid while
/// `gen` is one more than the global handle generation, which every datatype or
/// communicator free, every communicator size or rank learnt, every exec of a watched
/// process, every detach and every release of counter slots bumps; a zeroed cache is never
/// valid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandleCache {
    /// Global handle generation + 1 when the entries were filled.
    pub gen: u64,
    /// Datatype handles (0: empty).
    pub types: [u64; 2],
    /// Their sizes in bytes.
    pub type_sizes: [u64; 2],
    /// Communicator handle (0: empty).
    pub comm: u64,
    /// What is known of it.
    pub comm_info: CommInfo,
    /// The `types` slot the next miss fills.
    pub next_type: u32,
    /// The `counter_keys` entry the next miss fills (round robin).
    pub next_counter: u32,
    /// The counter slots of `counter_keys`, plus one (0: empty).
    pub counter_slots: [u32; COUNTER_CACHE],
    /// Keys of the counters this thread updated last ([`CounterKey::words`]): a loop of
    /// up to eight kinds of call (routines, size buckets, communicators) finds all its
    /// keys here.
    pub counter_keys: [[u64; 4]; COUNTER_CACHE],
}

impl HandleCache {
    /// The cached counter slot of key `words`.
    #[inline(always)]
    pub fn counter_slot(&self, words: &[u64; 4]) -> Option<u32> {
        let mut i = 0;
        while i < COUNTER_CACHE {
            let k = &self.counter_keys[i];
            // Word by word: an array `==` becomes a call to a byte-at-a-time `memcmp` in
            // BPF.
            if self.counter_slots[i] != 0
                && k[0] == words[0]
                && k[1] == words[1]
                && k[2] == words[2]
                && k[3] == words[3]
            {
                return Some(self.counter_slots[i] - 1);
            }
            i += 1;
        }
        None
    }

    /// Remembers that key `words` has counter slot `slot`, in place of the oldest entry.
    #[inline(always)]
    pub fn remember_counter(&mut self, words: [u64; 4], slot: u32) {
        let i = self.next_counter as usize % COUNTER_CACHE;
        self.counter_keys[i] = words;
        self.counter_slots[i] = slot + 1;
        self.next_counter = self.next_counter.wrapping_add(1);
    }
}
const _: () = assert!(size_of::<HandleCache>() == 368);

/// Counter keys a thread's handle cache holds.
pub const COUNTER_CACHE: usize = 8;
const _: () = assert!(offset_of!(CallState, group_start_ns) == 144);

/// Number of ground-truth counters (keys) the kernel holds at once.
pub const MAX_COUNTERS: u32 = 131072;

/// Number of library layout slots (distinct probed MPI libraries at once).
pub const MAX_LAYOUTS: u32 = 64;

/// The helper number the session programs call for `bpf_session_is_return()`: no kernel
/// has such a helper, and the loader rewrites each of these calls into the kfunc's.
pub const SESSION_IS_RETURN_CALL: i32 = 0x7ff0;

/// Run-time settings of the BPF programs (the `CONFIG` array's only element).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Non-zero: count every process that calls a probed MPI library (the node daemon),
    /// not only those in `WATCHED`, within the limits below.
    pub watch_all: u32,
    /// commtap's own process id, never counted.
    pub self_tgid: u32,
    /// Watch-all counts only this real user id ([`Config::ANY_UID`]: any).
    pub uid: u32,
    /// Level below the cgroup v2 root of `cgroup_id` (used when `cgroup_id` is not 0 and
    /// `cgroup_v1_subsys` is).
    pub cgroup_level: u32,
    /// Watch-all counts only processes in this cgroup or below it (0: any): its id, the
    /// directory's inode number (a cgroup v1 directory's too).
    pub cgroup_id: u64,
    /// Which calls emit a [`CallEvent`] ([`Config::EVENTS_ALL`], [`Config::EVENTS_COLLECTIVE`]
    /// or both; 0: none). Counts never depend on it; an event costs about as much as the
    /// rest of the probe, so events are on only for the calls something consumes.
    pub call_events: u32,
    /// 0: `cgroup_id` is a cgroup v2's; else it is a cgroup v1's, in the hierarchy of the
    /// controller whose subsystem id (`enum cgroup_subsys_id`) is this less one: a process's
    /// cgroup there is found through [`IdentityOffsets`]'s `cgroup_*` offsets (Slurm's
    /// cgroup v1 plugin puts jobs there, on hosts whose controllers are all v1).
    pub cgroup_v1_subsys: u32,
    /// Until this time (monotonic ns; 0: never), a watched process is paused when its
    /// dynamic linker has mapped new libraries (`dlopen`, or the libraries a program starts
    /// with), before it can run them, and a [`EventKind::Loaded`] event asks userspace to
    /// probe them and continue it: exact from a late library's first call. Userspace
    /// renews it on every look around: if it hangs, pausing stops within a lease.
    pub pause_until_ns: u64,
    /// The share of each map its processes grow that one user may hold, percent
    /// (`shares`; 0: the whole map).
    pub user_share_pct: u32,
    /// The ranges of sub-uids in `SUBUIDS` (`shares::SubuidRange`), sorted: a sub-uid is
    /// charged as the user given it. Their count, and which of its two tables holds them
    /// (`shares::subuid_table`).
    pub subuid_ranges: u32,
    /// Non-zero: count calls per call site too (`SiteKey`), where the calls were made from.
    pub call_sites: u32,
    /// Explicit padding.
    pub _pad: u32,
}
const _: () = assert!(size_of::<Config>() == 56);

impl Config {
    /// `uid` value meaning every user.
    pub const ANY_UID: u32 = u32::MAX;
    /// `call_events` bit: every call (timelines, event streams).
    pub const EVENTS_ALL: u32 = 1;
    /// `call_events` bit: collectives, communicator constructors and `MPI_Init` (who is
    /// late).
    pub const EVENTS_COLLECTIVE: u32 = 2;
}

/// Flags in the `WATCHED` map: which processes the probes count.
pub mod watch {
    /// Count this process's calls.
    pub const COUNT: u32 = 1;
    /// Also watch every process this one forks (and their children).
    pub const DESCENDANTS: u32 = 2;
    /// `WATCHED_LATEST`'s entry the kernel stamps as it puts a process in the set.
    pub const LATEST_KERNEL: u32 = 0;
    /// `WATCHED_LATEST`'s entry userspace stamps (the kernel never writes it, so that
    /// neither lowers the other's stamp on a CPU).
    pub const LATEST_USERSPACE: u32 = 1;
}

/// Sampled time per process: a routine's `TIME_ONE_IN` entry holding [`PER_PROCESS`]
/// says each process has its own N in `PROCESS_ONE_IN` (1, every call timed, for a
/// process without one), so that one process's hot loop thins no other's time.
pub mod one_in {
    /// The flag in a routine's `TIME_ONE_IN` entry.
    pub const PER_PROCESS: u32 = 1 << 31;

    /// The `PROCESS_ONE_IN` key of a process's routine.
    #[inline(always)]
    pub const fn key(tgid: u32, routine: u16) -> u64 {
        ((tgid as u64) << 16) | routine as u64
    }
}

/// The launchers of MPI jobs, by the name the kernel gives a process at its exec (the
/// executable's file name, cut to 15 bytes): never paused at their library loads. They
/// call no MPI, so pausing them gains nothing, and Open MPI's `mpirun` forwards the
/// `SIGCONT` that ends each pause to its job's ranks — one line on the job's standard
/// error each time ("Forwarding signal 18 to job"), and a rank paused at its own library
/// load continued before its probes are in place.
pub mod launcher {
    /// Open MPI 4 (ORTE) and 5 (PRRTE), MPICH's and Intel MPI's Hydra, Slurm's `srun`.
    pub const NAMES: [&str; 17] = [
        "mpirun",
        "mpiexec",
        "mpirun.openmpi",
        "mpiexec.openmpi",
        "orterun",
        "orted",
        "oshrun",
        "prterun",
        "prted",
        "prte",
        "mpirun.mpich",
        "mpiexec.mpich",
        "mpiexec.hydra",
        "hydra_pmi_proxy",
        "hydra_bstrap_proxy",
        "srun",
        "slurmstepd",
    ];

    /// Bytes of a process's name in the kernel (`TASK_COMM_LEN`).
    pub const COMM_LEN: usize = 16;

    /// `name` as the kernel holds a process's name: at most 15 bytes, NUL-padded.
    pub const fn comm(name: &str) -> [u8; COMM_LEN] {
        let mut out = [0u8; COMM_LEN];
        let b = name.as_bytes();
        let mut i = 0;
        while i < b.len() && i < COMM_LEN - 1 {
            out[i] = b[i];
            i += 1;
        }
        out
    }
}

/// Most per-peer counters at once (process, communicator, peer, direction).
pub const MAX_PEER_COUNTERS: u32 = 1 << 16;

/// Most per-peer counters of freed communicators that userspace moves out of the kernel's
/// map into `PEERS_FOLDED` (making room there for new ones), all processes together.
pub const MAX_FOLDED_PEERS: u32 = 1 << 18;

/// Key of the per-peer point-to-point counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerKey {
    /// Process id.
    pub tgid: u32,
    /// The peer's rank in the communicator; [`PeerKey::ANY`] for a receive from
    /// `MPI_ANY_SOURCE` whose source was not learnt (no status).
    pub peer: i32,
    /// The communicator: [`PeerKey::WORLD`] for `MPI_COMM_WORLD`, else its handle as this
    /// process sees it.
    pub comm: u64,
    /// [`PeerKey::SENT`] or [`PeerKey::RECEIVED`].
    pub dir: u16,
    /// The communicator's handle's generation ([`comm_generation`]) when the call was made:
    /// a handle freed and given to a new communicator keys the new one's traffic apart
    /// from the old one's, which has other members. [`PeerKey::NAMED`] in userspace's keys
    /// of freed communicators' traffic.
    pub gen: u16,
    /// This process's rank in the communicator, [`PeerKey::ANY`] if unknown: what places a
    /// peer's rank on another communicator on a world rank (see `stats::peers_of`).
    pub me: i32,
}
const _: () = assert!(size_of::<PeerKey>() == 24);
const _: () = assert!(offset_of!(PeerKey, comm) == 8 && offset_of!(PeerKey, gen) == 18);
const _: () = assert!(offset_of!(PeerKey, me) == 20);

impl PeerKey {
    /// `comm` of `MPI_COMM_WORLD` (no handle is 0).
    pub const WORLD: u64 = 0;
    /// `peer` of a receive from any source.
    pub const ANY: i32 = -1;
    /// Sent to the peer.
    pub const SENT: u16 = 0;
    /// Received from the peer (posted bytes for nonblocking receives).
    pub const RECEIVED: u16 = 1;
    /// `comm` of a freed communicator's traffic moved out of the kernel's map with no name,
    /// or past what is kept per process: no handle, so never named nor placed (its calls
    /// and bytes still counted).
    pub const UNPLACED: u64 = u64::MAX;
    /// Set in `gen` of a freed communicator's traffic that userspace keyed by the
    /// communicator's name (alike in every member: `comm` then holds it, not a handle),
    /// moved out of the kernel's map: above every generation ([`comm_generation`]).
    pub const NAMED: u16 = 0x8000;
}

/// A communicator handle's generation ([`CommInfo::gen`]) after `frees` frees of it:
/// wrapping below [`PeerKey::NAMED`].
pub const fn comm_generation(frees: u64) -> u16 {
    (frees % PeerKey::NAMED as u64) as u16
}

/// Calls and bytes of one [`PeerKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerVal {
    /// Calls (a Sendrecv is one call to each of its peers).
    pub calls: u64,
    /// Bytes by the routine's rule, the half to or from this peer.
    pub bytes: u64,
}
const _: () = assert!(size_of::<PeerVal>() == 16);

impl PeerVal {
    /// Adds `other`'s calls and bytes into `self` (CPUs', reads', or moved counters'
    /// together).
    pub fn add(&mut self, other: &PeerVal) {
        self.calls += other.calls;
        self.bytes += other.bytes;
    }
}

/// Most call-site counters at once (process, routine, return address).
pub const MAX_SITE_COUNTERS: u32 = 1 << 16;

/// Key of the call-site counters: where a process's calls of a routine were made from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteKey {
    /// Process id.
    pub tgid: u32,
    /// Index into [`crate::ROUTINES`].
    pub routine: u16,
    /// Explicit padding.
    pub _pad: u16,
    /// The address the call returns to in the caller (the instruction after its `call`).
    pub site: u64,
}
const _: () = assert!(size_of::<SiteKey>() == 16);
const _: () = assert!(offset_of!(SiteKey, site) == 8);

/// Calls, bytes and time of one [`SiteKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteVal {
    /// Calls (outermost MPI or NCCL calls only, as the counters count them).
    pub calls: u64,
    /// Bytes by the routine's rule.
    pub bytes: u64,
    /// The calls whose time was measured (the others' time is sampled away).
    pub timed: u64,
    /// Time of the timed calls, ns.
    pub time_ns: u64,
}
const _: () = assert!(size_of::<SiteVal>() == 32);

/// Key of the ground-truth counters: one per process, routine, size bucket and communicator.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey {
    /// Process id (tgid) of the caller.
    pub tgid: u32,
    /// Index into [`crate::ROUTINES`].
    pub routine: u16,
    /// The MPI or NCCL routine in progress when a libfabric call was made, or
    /// [`CounterKey::NO_PARENT`].
    pub parent: u16,
    /// Size of the call's communicator; 0 when the routine has none or it is unknown.
    pub comm_size: u32,
    /// This process's rank in the communicator (NCCL; -1 when unknown); 0 for MPI, whose
    /// counters are kept per communicator size only, and for libfabric.
    pub comm_rank: i32,
    /// What the call acted on; the routine's family says what it is. NCCL: the
    /// communicator's identity, equal in every member (a hash of its unique id). libfabric:
    /// the endpoint's address. 0 for MPI and when unknown.
    pub object: u64,
    /// [`crate::size_bucket`] of the call's bytes, or [`crate::UNKNOWN_BUCKET`].
    pub bucket: u8,
    /// [`CounterKey::UNRESOLVED_TABLE`], or 0.
    pub flags: u8,
    /// Explicit padding.
    pub _pad: [u8; 6],
}
const _: () = assert!(size_of::<CounterKey>() == 32);
const _: () = assert!(offset_of!(CounterKey, comm_size) == 8);
const _: () = assert!(offset_of!(CounterKey, object) == 16);
const _: () = assert!(offset_of!(CounterKey, bucket) == 24);
const _: () = assert!(offset_of!(CounterKey, flags) == 25);

impl CounterKey {
    /// `parent` of a call made outside any MPI or NCCL call.
    pub const NO_PARENT: u16 = u16::MAX;
    /// `flags`: a libfabric call whose endpoint did not show which table (msg, rma,
    /// tagged) its function belongs to; not shown as a routine's call.
    pub const UNRESOLVED_TABLE: u8 = 1;

    /// The key as four words, to compare in four instructions (a derived `==` compares the
    /// pad bytes one by one).
    #[inline(always)]
    pub const fn words(&self) -> [u64; 4] {
        // SAFETY: a 32-byte `repr(C)` struct whose padding is an explicit field.
        unsafe { core::mem::transmute::<CounterKey, [u64; 4]>(*self) }
    }
}

/// Where a probed libfabric library's code is, as virtual addresses of its file: calls
/// whose return address is inside are libfabric calling itself.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricText {
    /// First address of its executable section.
    pub lo: u64,
    /// One past its last.
    pub hi: u64,
}
const _: () = assert!(size_of::<FabricText>() == 16);

/// Most libfabric code mappings kept per process ([`FabricRanges`]).
pub const MAX_FABRIC_RANGES: usize = 8;

/// Where one process has libfabric's code mapped: libfabric itself and each provider DSO
/// (Intel MPI's `prov/lib*-fi.so`). A libfabric call returning into any of them was made by
/// libfabric (rxm calling tcp across two DSOs), not by the application.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricRanges {
    /// Ranges in use.
    pub n: u32,
    /// Padding.
    pub _pad: u32,
    /// Absolute code ranges in the process.
    pub ranges: [FabricText; MAX_FABRIC_RANGES],
}
const _: () = assert!(size_of::<FabricRanges>() == 136);

/// Value of the ground-truth counters (per CPU: userspace sums the CPUs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterVal {
    /// Completed calls.
    pub calls: u64,
    /// Bytes by the routine's byte rule (0 in the unknown bucket).
    pub bytes: u64,
    /// Time inside the call, entry to return, in nanoseconds.
    pub time_ns: u64,
    /// The fastest call, ns (0: none timed; a call takes far more than a nanosecond).
    pub min_ns: u64,
    /// The slowest call, ns.
    pub max_ns: u64,
    /// Calls counted at their entry and not timed (their routine's time is sampled):
    /// `time_ns`, the extremes and the histogram hold the other `calls - untimed`.
    pub untimed: u64,
}
const _: () = assert!(size_of::<CounterVal>() == 48);

/// A counter's slot in the counters' array, which every CPU adds to atomically: its value,
/// padded to 128 bytes so that no two slots' values (each another process's key, counted
/// from another CPU) ever share a 64-byte cache line, wherever the array starts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterSlot {
    /// The counter.
    pub val: CounterVal,
    /// Explicit padding.
    pub _pad: [u64; 10],
}
const _: () = assert!(size_of::<CounterSlot>() == 128);

impl CounterVal {
    /// Adds `calls` calls of `bytes` bytes that took `time_ns` in all (their extremes
    /// unknown: NCCL's device windows).
    #[inline(always)]
    pub fn add(&mut self, calls: u64, bytes: u64, time_ns: u64) {
        self.calls += calls;
        self.bytes += bytes;
        self.time_ns += time_ns;
    }

    /// Adds one call of `bytes` bytes that took `ns`.
    #[inline(always)]
    pub fn add_call(&mut self, bytes: u64, ns: u64) {
        self.add(1, bytes, ns);
        if self.min_ns == 0 || ns < self.min_ns {
            self.min_ns = ns;
        }
        if ns > self.max_ns {
            self.max_ns = ns;
        }
    }

    /// Adds one call of `bytes` bytes whose time was not measured.
    #[inline(always)]
    pub fn add_untimed(&mut self, bytes: u64) {
        self.add(1, bytes, 0);
        self.untimed += 1;
    }

    /// The calls whose time was measured.
    pub fn timed(&self) -> u64 {
        self.calls.saturating_sub(self.untimed)
    }

    /// Adds another CPU's (or counter's) value into this one.
    pub fn merge(&mut self, other: &CounterVal) {
        self.add(other.calls, other.bytes, other.time_ns);
        self.untimed += other.untimed;
        if other.min_ns != 0 && (self.min_ns == 0 || other.min_ns < self.min_ns) {
            self.min_ns = other.min_ns;
        }
        self.max_ns = self.max_ns.max(other.max_ns);
    }
}

/// What the kernel counts per process of what it could not measure, by the names reports
/// give them: the one list from which [`ProcStats`] (the kernel's per-CPU struct), the
/// report's `Health` and its wire form are made. A new counter is a line here and its
/// field in the proto. `$then` is a macro taking the list.
#[macro_export]
macro_rules! kernel_health_counters {
    ($then:ident) => {
        $then! {
            /// Call events lost because the ring buffer was full (counts stay exact).
            dropped,
            /// Calls whose bytes could not be decoded (counted in the unknown bucket).
            undecoded,
            /// MPI calls made inside another MPI call (counted once, at the outer call).
            nested,
            /// Calls already in progress when the probes attached (their returns came
            /// without an entry: not counted).
            in_flight_at_attach,
            /// MPI or NCCL calls left without returning (a `longjmp` or a C++ exception
            /// out of an error handler, a signal handler's `siglongjmp`), found at the
            /// thread's next call or at its end: not counted (their outcome is unknown); the calls after
            /// them are, as the thread's own.
            abandoned,
            /// Calls lost because the kernel's counter map was full, or the process's
            /// user held its share of it (`shares`).
            counter_map_full,
            /// NCCL operations enqueued inside groups (each completed group is one
            /// `ncclGroup`).
            group_ops,
            /// Host waits for the GPU after NCCL operations of different kinds, whose device
            /// time could not be attributed.
            mixed_windows,
            /// libfabric ops-table calls made by libfabric itself (a provider layered on
            /// another, such as rxm on tcp, and progress): not the application's, not
            /// reported.
            fabric_internal,
            /// libfabric calls that returned an error (mostly -FI_EAGAIN: retried), not
            /// counted.
            fabric_failed,
            /// NCCL network transport sends/receives that posted nothing (retried), not
            /// counted.
            net_unposted,
            /// Point-to-point calls left out of the per-peer traffic (its kernel map was
            /// full, or the process's user held its share of it; the flat counters still
            /// have them).
            peers_full,
            /// Calls left out of the call-site counters (their kernel map was full, or
            /// the process's user held its share of it; the flat counters still have
            /// them).
            sites_full,
            /// Device-time windows left out of a timeline because the ring buffer was full
            /// (the profile's device time still has them).
            windows_dropped,
            /// Transport operations (libfabric, UCX) whose bytes could not be decoded (a
            /// UCX generic datatype, MPICH's for a derived MPI type): counted, in the
            /// unknown size bucket; the MPI call that made them has its bytes.
            fabric_undecoded,
            /// Handles (communicators, derived datatypes, collectives' numbering,
            /// persistent requests) the kernel did not keep: its map was full, or the
            /// process's user held its share of it (`shares`), counted at each try (an Open
            /// MPI communicator not kept is read anew, and tried again, at each call); the
            /// calls that needed them are counted as undecoded, or their instances aligned
            /// by time.
            handles_refused,
        }
    };
}

/// Makes [`ProcStats`] from [`kernel_health_counters`]' list.
macro_rules! define_proc_stats {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Per-process health counters and MPI lifetime marks (per-CPU; userspace sums /
        /// maxes).
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct ProcStats {
            $( $(#[$doc])* pub $name: u64, )*
            /// Monotonic ns at which MPI_Init / MPI_Init_thread returned (0: not seen).
            pub init_ns: u64,
            /// Monotonic ns at which MPI_Finalize was entered (0: not seen).
            pub finalize_ns: u64,
            /// CPU time of its threads that ended while watched, ns (`sum_exec_runtime`).
            pub exit_cpu_ns: u64,
            /// Of those threads, user time as the kernel's ticks sampled it, ns: with
            /// `exit_stime_ns`, how `exit_cpu_ns` splits (as `getrusage` splits it).
            pub exit_utime_ns: u64,
            /// Of those threads, system time as the kernel's ticks sampled it, ns.
            pub exit_stime_ns: u64,
            /// Their voluntary context switches.
            pub exit_nvcsw: u64,
            /// Their involuntary context switches.
            pub exit_nivcsw: u64,
            /// The process's largest resident set, pages (`signal_struct.maxrss`, which
            /// the kernel sets when its last thread ends): the largest seen on any CPU.
            pub exit_max_rss_pages: u64,
            /// Its threads that ended while watched.
            pub exit_threads: u64,
            /// 1 once its last thread ended (its usage is then complete).
            pub exit_group: u64,
            /// How it ended: its last thread's `task_struct.exit_code` (the `wait` status:
            /// `exit(N)` is `N << 8`, a signal its number, 0x80 a core dump) plus
            /// [`ProcStats::EXIT_STATUS_KNOWN`]; 0 where not known.
            pub exit_status: u64,
            /// The routine (plus one) of the timed MPI or NCCL call one of its threads was
            /// inside as that thread ended, the longest in it where several were; 0: none.
            pub exit_in_routine: u64,
            /// How long that thread had been inside that call, ns.
            pub exit_in_ns: u64,
            /// That thread's id.
            pub exit_in_tid: u64,
            /// Monotonic ns at which its last thread ended (0: not seen).
            pub exit_ns: u64,
        }

        impl ProcStats {
            /// How many health counters it holds (besides the lifetime marks and the
            /// usage at exit).
            pub const COUNTERS: usize = [$(stringify!($name)),*].len();

            /// Adds another CPU's share: counters sum, lifetime marks take the latest.
            pub fn add(&mut self, o: &ProcStats) {
                $( self.$name += o.$name; )*
                self.init_ns = self.init_ns.max(o.init_ns);
                self.finalize_ns = self.finalize_ns.max(o.finalize_ns);
                self.exit_cpu_ns += o.exit_cpu_ns;
                self.exit_utime_ns += o.exit_utime_ns;
                self.exit_stime_ns += o.exit_stime_ns;
                self.exit_nvcsw += o.exit_nvcsw;
                self.exit_nivcsw += o.exit_nivcsw;
                self.exit_max_rss_pages = self.exit_max_rss_pages.max(o.exit_max_rss_pages);
                self.exit_threads += o.exit_threads;
                self.exit_group = self.exit_group.max(o.exit_group);
                self.exit_status = self.exit_status.max(o.exit_status);
                self.exit_ns = self.exit_ns.max(o.exit_ns);
                if o.exit_in_routine != 0 && (self.exit_in_routine == 0 || o.exit_in_ns > self.exit_in_ns) {
                    self.exit_in_routine = o.exit_in_routine;
                    self.exit_in_ns = o.exit_in_ns;
                    self.exit_in_tid = o.exit_in_tid;
                }
            }
        }
    };
}
kernel_health_counters!(define_proc_stats);
// Every field a u64, nothing between them: the kernel and userspace read the same bytes.
const _: () = assert!(size_of::<ProcStats>() == 8 * (ProcStats::COUNTERS + 15));

impl ProcStats {
    /// Set in [`ProcStats::exit_status`] beside the kernel's exit code (which may be 0).
    pub const EXIT_STATUS_KNOWN: u64 = 1 << 32;
}

/// Offsets of the tracepoint fields commtap reads, parsed by userspace from tracefs
/// `format` files (they differ between kernel versions).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TpOffsets {
    /// `sched_process_fork`: offset of `parent_pid`.
    pub fork_parent_pid: u32,
    /// `sched_process_fork`: offset of `child_pid`.
    pub fork_child_pid: u32,
    /// `sched_process_exit`: offset of `group_dead` (u32::MAX on kernels without it).
    pub exit_group_dead: u32,
    /// `sched_process_exec`: offset of `old_pid`, the id of the thread that called exec
    /// (u32::MAX where the kernel has no such field).
    pub exec_old_pid: u32,
}
const _: () = assert!(size_of::<TpOffsets>() == 16);

/// Offsets into this kernel's `task_struct`, `mm_struct` and cgroup structures, read by
/// userspace from the kernel's BTF: where the kernel side finds a process's environment,
/// arguments and start time when it first sees it (an [`IdentityEvent`]), and its cgroup v1
/// (a daemon limited to one: [`Config::cgroup_v1_subsys`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdentityOffsets {
    /// 1 once userspace filled the offsets in (no identity events before).
    pub valid: u32,
    /// `task_struct.mm`.
    pub task_mm: u32,
    /// `task_struct.start_boottime`.
    pub task_start_boottime: u32,
    /// `mm_struct.arg_start` (`arg_end` follows it).
    pub mm_arg_start: u32,
    /// `mm_struct.env_start` (`env_end` follows it).
    pub mm_env_start: u32,
    /// `task_struct.real_parent`.
    pub task_real_parent: u32,
    /// `task_struct.signal`.
    pub task_signal: u32,
    /// `signal_struct.pids[PIDTYPE_PGID]`: the process group.
    pub signal_pgrp: u32,
    /// `signal_struct.tty`: the controlling terminal.
    pub signal_tty: u32,
    /// `task_struct.ptrace`: non-zero while a tracer (a debugger, strace) holds the task.
    pub task_ptrace: u32,
    /// 1 once the `cgroup_*` offsets below are filled in (a kernel may lack one).
    pub cgroup_valid: u32,
    /// `task_struct.cgroups`: the process's `css_set`.
    pub cgroup_task_cgroups: u32,
    /// `css_set.subsys`: its controllers' states, indexed by subsystem id.
    pub cgroup_css_set_subsys: u32,
    /// `cgroup_subsys_state.cgroup`: the cgroup a state is of.
    pub cgroup_css_cgroup: u32,
    /// `cgroup.kn`: the cgroup's directory.
    pub cgroup_kn: u32,
    /// `kernfs_node.id`: the directory's inode number.
    pub cgroup_kernfs_id: u32,
    /// `kernfs_node.__parent` (`parent` before Linux 6.15): the directory above.
    pub cgroup_kernfs_parent: u32,
    /// 1 once the `userns_*` offsets below are filled in: the user a process's share of
    /// the kernel's maps is charged to is then its user namespace's owner where it runs in
    /// one (a sub-uid), not the uid it runs as.
    pub userns_valid: u32,
    /// `task_struct.cred`: the process's credentials.
    pub userns_task_cred: u32,
    /// `cred.user_ns`: the user namespace its uids belong to.
    pub userns_cred_user_ns: u32,
    /// `user_namespace.level`: 0 for the node's own, 1 for a namespace made in it.
    pub userns_level: u32,
    /// `user_namespace.parent`: the namespace it was made in.
    pub userns_parent: u32,
    /// `user_namespace.owner`: the user (of the node's namespace, a `kuid_t`) who made it.
    pub userns_owner: u32,
    /// `user_namespace.uid_map`: how its uids map to the node's.
    pub userns_uid_map: u32,
    /// `uid_gid_map.nr_extents`: the map's ranges.
    pub uidmap_nr_extents: u32,
    /// `uid_gid_map.extent`: the ranges, where there are at most 5 (in place).
    pub uidmap_extent: u32,
    /// `uid_gid_map.forward`: the ranges, where there are more (sorted by first uid).
    pub uidmap_forward: u32,
    /// `uid_gid_extent.lower_first`: the node's uid a range's first maps to.
    pub extent_lower_first: u32,
    /// 1 once the `usage_*` offsets below (and `task_signal`) are filled in: each
    /// watched thread's CPU time and context switches are added to its process's
    /// [`ProcStats`] as it ends, and the process's largest resident set taken.
    pub usage_valid: u32,
    /// `task_struct.utime`.
    pub usage_task_utime: u32,
    /// `task_struct.stime`.
    pub usage_task_stime: u32,
    /// `task_struct.nvcsw`.
    pub usage_task_nvcsw: u32,
    /// `task_struct.nivcsw`.
    pub usage_task_nivcsw: u32,
    /// `task_struct.se.sum_exec_runtime`.
    pub usage_task_sum_exec_runtime: u32,
    /// `signal_struct.maxrss`.
    pub usage_signal_maxrss: u32,
    /// `signal_struct.live`: the process's threads not ending yet.
    pub usage_signal_live: u32,
    /// `task_struct.exit_code`: how an ending thread ends (its process's `wait` status
    /// where the process ends otherwise than as a group).
    pub usage_task_exit_code: u32,
    /// `signal_struct.flags`: `SIGNAL_GROUP_EXIT` while the whole process ends (a fatal
    /// signal, `exit_group`).
    pub usage_signal_flags: u32,
    /// `signal_struct.group_exit_code`: the process's `wait` status when it ends as a group
    /// (a core dump's mark included, which only the dumping thread's own code has).
    pub usage_signal_group_exit_code: u32,
    /// 1 once the `uret_*` offsets below are filled in: the task iterator then also says
    /// where the kernel moved a thread's return addresses to its return-probe trampoline.
    pub uret_valid: u32,
    /// `task_struct.utask`: the thread's uprobe state.
    pub uret_task_utask: u32,
    /// `uprobe_task.return_instances`: its calls whose returns are probed, latest first.
    pub uret_utask_instances: u32,
    /// `return_instance.stack`: where the call's return address was (its stack pointer at
    /// the entry).
    pub uret_ri_stack: u32,
    /// `return_instance.orig_ret_vaddr`: the return address the trampoline took the place of.
    pub uret_ri_orig: u32,
    /// `return_instance.next`: the call it was made inside.
    pub uret_ri_next: u32,
    /// 1 once the `xol_*` offsets below are filled in: an MPI or NCCL entry made while the
    /// thread's call in progress may have been left without returning (a `longjmp` out of
    /// an error handler) then tells whether it was, by the word at that call's return
    /// address, which holds the kernel's return-probe trampoline while it is in progress.
    pub xol_valid: u32,
    /// `mm_struct.uprobes_state.xol_area`: the process's uprobe page, whose start is the
    /// return-probe trampoline.
    pub xol_mm_area: u32,
    /// `xol_area.vaddr`: where that page is in the process.
    pub xol_vaddr: u32,
}
const _: () = assert!(size_of::<IdentityOffsets>() == 192);

/// `SIGNAL_GROUP_EXIT` of `signal_struct.flags` (`include/linux/sched/signal.h`).
pub const SIGNAL_GROUP_EXIT: u32 = 0x4;

/// Bytes of a process's environment an [`IdentityEvent`] carries.
pub const IDENTITY_ENV_LEN: usize = 16384;
/// Bytes of a process's arguments an [`IdentityEvent`] carries.
pub const IDENTITY_ARGS_LEN: usize = 4096;

/// A process as the kernel saw it when it became known (exec of a watched process, or its
/// first MPI call in watch-all mode): who it is, even if it exits before userspace can
/// read its `/proc` entry. Sent just before the [`ProcEvent`] that reports it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IdentityEvent {
    /// Always [`EventKind::Identity`].
    pub kind: u32,
    /// Process id.
    pub tgid: u32,
    /// Real user id.
    pub uid: u32,
    /// Bytes of `env` filled (NUL-separated `NAME=value`, as `/proc/PID/environ`).
    pub env_len: u32,
    /// Bytes of `args` filled (NUL-separated, as `/proc/PID/cmdline`).
    pub args_len: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// `task_struct.start_boottime` (ns since boot, suspend included).
    pub start_boottime_ns: u64,
    /// The start of its environment.
    pub env: [u8; IDENTITY_ENV_LEN],
    /// The start of its arguments.
    pub args: [u8; IDENTITY_ARGS_LEN],
}
const _: () = assert!(size_of::<IdentityEvent>() == 32 + IDENTITY_ENV_LEN + IDENTITY_ARGS_LEN);

/// Kind of a record in the ring buffer.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A completed MPI call: [`CallEvent`].
    Call = 1,
    /// A watched process called exec: [`ProcEvent`].
    Exec = 2,
    /// A watched process (its thread-group leader) exited: [`ProcEvent`].
    Exit = 3,
    /// A watched process forked a child that is now watched too: [`ProcEvent`].
    Fork = 4,
    /// In watch-all mode, a process not yet watched made its first MPI call and is now
    /// watched: [`ProcEvent`].
    Discovered = 5,
    /// A watched process opened a libfabric fabric (`fi_fabric`): [`FabricEvent`].
    FabricOpen = 6,
    /// Who a process that just became known is: [`IdentityEvent`].
    Identity = 7,
    /// A device-time window ended (a host wait for the GPU after NCCL operations; see
    /// `nccl.rs` in the BPF crate), for timelines: a [`CallEvent`] from the window's first
    /// enqueue to the wait's return, with the operations' routine, bytes and communicator
    /// (`CallEvent::NOT_ATTRIBUTED` when they differ or the wait failed). Sent only while
    /// per-call events are on, and not numbered among the thread's calls.
    DeviceWindow = 8,
    /// A counted process's dynamic linker has mapped new libraries and the process is
    /// paused (`SIGSTOP`) until userspace has probed them and continues it: [`ProcEvent`].
    Loaded = 9,
    /// A watched process called `MPI_Pcontrol(level)`: [`ProcEvent`] whose `parent` is
    /// [`ProcEvent::pcontrol`]'s word (the level, and whether the process was paused
    /// until userspace has read its counters and continues it).
    Pcontrol = 10,
    /// A watched Open MPI process returned from `MPI_Init`: the point-to-point components
    /// its MPI selected there, read from its memory: [`ComponentsEvent`].
    MpiComponents = 11,
    /// The message of a nonblocking receive (`MPI_Irecv`) arrived: a [`CallEvent`] sent at
    /// the entry of the `MPI_Wait`/`MPI_Waitall` that completes it, before that call's own
    /// event, naming the call by its thread and `start_ns` and the receive by
    /// [`CallEvent::posted_by`] (see `posted.rs` in the BPF crate); or, flagged
    /// [`CallEvent::UNTOLD`], the receive is no longer followed. Sent only while per-call
    /// events are on, and not numbered among the thread's calls: it draws the message's
    /// arrow to the wait on a timeline.
    Arrival = 12,
}

/// Longest provider or fabric name carried by a [`FabricEvent`] (NUL included).
pub const FABRIC_NAME_LEN: usize = 32;

/// A watched process opened a fabric: the provider (`tcp;ofi_rxm`) and fabric names from
/// the `struct fi_fabric_attr` it passed to `fi_fabric`, NUL-terminated (truncated).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FabricEvent {
    /// Always [`EventKind::FabricOpen`].
    pub kind: u32,
    /// Process id.
    pub tgid: u32,
    /// `prov_name`.
    pub provider: [u8; FABRIC_NAME_LEN],
    /// `name` (for tcp, the network, e.g. `127.0.0.0/8`).
    pub fabric: [u8; FABRIC_NAME_LEN],
}
const _: () = assert!(size_of::<FabricEvent>() == 72);

/// Where Open MPI keeps the components it selected at `MPI_Init`, in one process (runtime
/// addresses, 0: the library has none): what the kernel reads at `MPI_Init`'s return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ComponentAddrs {
    /// `mca_pml_base_selected_component`: a copy of the selected pml's component struct.
    pub pml: u64,
    /// `ompi_mtl_base_selected_component`: a pointer to the selected mtl's (under pml
    /// `cm`; NULL otherwise).
    pub mtl: u64,
}
const _: () = assert!(size_of::<ComponentAddrs>() == 16);

/// Longest component name a [`ComponentsEvent`] carries (NUL included; Open MPI allows 64,
/// its components' names are a few letters).
pub const COMPONENT_NAME_LEN: usize = 32;

/// Offsets in Open MPI's `mca_base_component_t` (its version 2.1.0, in Open MPI 2 to 5):
/// three `int`s, the project's name (16 bytes), three `int`s, then the framework's name
/// (32 bytes: `pml`), three `int`s, then the component's (64 bytes: `ob1`).
pub mod ompi_component {
    /// The framework's name (`mca_type_name`).
    pub const TYPE_OFF: u64 = 40;
    /// The component's name (`mca_component_name`).
    pub const NAME_OFF: u64 = 84;
    /// `pml` as the `u32` at [`TYPE_OFF`] of a pml component (the name's NUL included).
    pub const PML: u32 = u32::from_le_bytes(*b"pml\0");
    /// `mtl` likewise.
    pub const MTL: u32 = u32::from_le_bytes(*b"mtl\0");
}

/// An Open MPI process's selected point-to-point components (see [`ComponentAddrs`]),
/// NUL-terminated names; `mtl` empty where none was selected.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ComponentsEvent {
    /// Always [`EventKind::MpiComponents`].
    pub kind: u32,
    /// Process id.
    pub tgid: u32,
    /// The pml's name (`ob1`, `ucx`, `cm`).
    pub pml: [u8; COMPONENT_NAME_LEN],
    /// The mtl's name (`ofi`, `psm2`), under pml `cm`.
    pub mtl: [u8; COMPONENT_NAME_LEN],
}
const _: () = assert!(size_of::<ComponentsEvent>() == 72);

/// One completed MPI call, for latency and timelines (counts come from the counters); or,
/// as [`EventKind::DeviceWindow`], one NCCL device-time window.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallEvent {
    /// [`EventKind::Call`] or [`EventKind::DeviceWindow`]: shares the first field with
    /// every ring-buffer record.
    pub kind: u32,
    /// Process id.
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// Index into [`crate::ROUTINES`].
    pub routine: u16,
    /// Size bucket or [`crate::UNKNOWN_BUCKET`].
    pub bucket: u8,
    /// What else is known of the event ([`CallEvent::NOT_ATTRIBUTED`]).
    pub flags: u8,
    /// Peer rank (dest/source/root/target) in the call's communicator, -1 if none.
    pub peer: i32,
    /// Communicator size, 0 if none or unknown.
    pub comm_size: u32,
    /// Monotonic ns at entry.
    pub start_ns: u64,
    /// Duration in ns.
    pub dur_ns: u64,
    /// Bytes by the routine's rule.
    pub bytes: u64,
    /// The call's communicator handle as this process sees it (0 if none): local to the
    /// process, it ties the call to the creation event that named the communicator.
    pub comm: u64,
    /// An identity of the communicator that every member shares, where the library holds
    /// one (see [`comm_id`]); 0 if not known.
    pub comm_id: u64,
    /// A communicator constructor's new handle (`MPI_Comm_dup`, `MPI_Comm_split` ...), read
    /// at return; 0 otherwise or if unreadable. A collective, which makes nothing, carries
    /// its instance number here instead ([`CallEvent::instance`]): a field of its own would
    /// not fit the kernel's return path, whose stack is full.
    pub created: u64,
    /// This process's rank in the communicator, -1 if unknown.
    pub comm_rank: i32,
    /// `MPI_Comm_split`'s color or `MPI_Comm_split_type`'s type; 0 otherwise.
    pub color: i32,
    /// The thread's count of call events before this one (see [`CallState::events`]): a
    /// gap means events of this thread were lost.
    pub thread_seq: u32,
    /// A point-to-point call's tag: the send's, or the receive's (a wildcard resolved from
    /// the status where there is one). With `peer`, it pairs a send with its receive on a
    /// timeline. A communicator constructor's new handle's generation instead
    /// ([`CallEvent::created_gen`]).
    pub tag: i32,
    /// The receiving half of `MPI_Sendrecv`/`MPI_Sendrecv_replace`: the source (a wildcard
    /// resolved from the status), -1 otherwise.
    pub recv_peer: i32,
    /// The receiving half's tag (resolved likewise). A communicator constructor's place
    /// among those made from its parent instead ([`CallEvent::made_index`]).
    pub recv_tag: i32,
}
const _: () = assert!(size_of::<CallEvent>() == 96);

impl CallEvent {
    /// A collective's instance number on its communicator, counted by the kernel from the
    /// communicator's creation (`MPI_Init` for the world), where it was (see
    /// [`crate::instances`]); `created`, for a collective.
    pub const fn instance(&self) -> Option<u64> {
        self.created.checked_sub(1)
    }

    /// A constructor's place among the communicators its process made from the same parent
    /// (0 for the first), counted by the kernel from the parent's creation (`MPI_Init` for
    /// the world: [`crate::instances::MADE_SHIFT`]), which it carries in `recv_tag`; `None`
    /// where not counted from there (the parent made before commtap watched the process).
    pub const fn made_index(&self) -> Option<u32> {
        if self.recv_tag >= 0 {
            Some(self.recv_tag as u32)
        } else {
            None
        }
    }

    /// A constructor's `recv_tag` where it failed: it made nothing, and is not counted
    /// among those made from its parent (the kernel's count skips it).
    pub const MADE_NOTHING: i32 = -2;

    /// A constructor's new handle's [`CommInfo::gen`], which it carries in `tag` (a
    /// constructor has no tag; a field of its own would not fit, as `created` says).
    pub const fn created_gen(&self) -> u16 {
        self.tag as u16
    }

    /// In [`CallEvent::flags`] of a device window: its operations were of different kinds,
    /// or the wait failed, so its time is not attributed to them (`mixed_windows`).
    pub const NOT_ATTRIBUTED: u8 = 1;
    /// A point-to-point call's `peer`/`recv_peer` that moves no message: `MPI_PROC_NULL`.
    pub const PEER_NONE: i32 = -1;
    /// A point-to-point receive's `peer`/`recv_peer` from a wildcard (`MPI_ANY_SOURCE`)
    /// that no status resolved.
    pub const PEER_ANY: i32 = -2;

    /// In [`CallEvent::flags`] of an arrival: the call may have completed the receive but
    /// the kernel cannot tell (the call failed, or there was no room to keep the receive
    /// through it), or freed it; when its message arrived is not known, and the receive is
    /// no longer followed.
    pub const UNTOLD: u8 = 2;
    /// In [`CallEvent::flags`] of an arrival: sent after its call's own event, by a call
    /// that says at its return which requests it completed (`MPI_Test*`, `MPI_Waitany`,
    /// `MPI_Waitsome`).
    pub const FOLLOWS_CALL: u8 = 4;

    /// An [`EventKind::Arrival`]: the message `posted` waited for arrived during the call
    /// of thread `tid` of `tgid` that entered `routine` at `start_ns` (`flags`:
    /// [`CallEvent::UNTOLD`], [`CallEvent::FOLLOWS_CALL`]). The posting call's thread and
    /// start travel in `comm_size` and `created` (an arrival has neither).
    #[inline(always)]
    pub fn arrival(
        tgid: u32,
        tid: u32,
        routine: u16,
        start_ns: u64,
        posted: &PostedRecv,
        flags: u8,
    ) -> Self {
        CallEvent {
            kind: EventKind::Arrival as u32,
            tgid,
            tid,
            routine,
            flags,
            start_ns,
            comm_size: posted.tid,
            created: posted.start_ns,
            peer: -1,
            comm_rank: -1,
            recv_peer: -1,
            ..CallEvent::default()
        }
    }

    /// An arrival's posting call: (its thread, its `start_ns`).
    pub const fn posted_by(&self) -> (u32, u64) {
        (self.comm_size, self.created)
    }
}

/// A nonblocking receive whose message has not been seen to arrive, kept per (process,
/// request handle) in a [`HandleKey`] map from the receive's return to the wait that
/// completes it: the call that posted it, which names it in an [`EventKind::Arrival`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostedRecv {
    /// The posting call's thread.
    pub tid: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// The posting call's `start_ns`.
    pub start_ns: u64,
}
const _: () = assert!(size_of::<PostedRecv>() == 16);

/// Nonblocking receives followed to their wait at once, for the node (least recently
/// posted given up first: a receive given up draws no arrow, and the trace counts it).
pub const MAX_POSTED: u32 = 1 << 16;
const _: () = assert!(offset_of!(CallEvent, start_ns) == 24);
const _: () = assert!(offset_of!(CallEvent, comm) == 48);
const _: () = assert!(offset_of!(CallEvent, comm_rank) == 72);
const _: () = assert!(offset_of!(CallEvent, tag) == 84);

/// Values of [`CallEvent::comm_id`] for MPI communicators (NCCL's are the hash of the
/// communicator's unique id).
pub mod comm_id {
    /// `MPI_COMM_WORLD`, in every ABI.
    pub const WORLD: u64 = 1 << 62;
    /// Open MPI: this bit or-ed with the communicator's context id (never 0: that is
    /// `WORLD`). Sibling communicators of one split share a context id.
    pub const OMPI_CID: u64 = 1 << 61;

    /// The identity of an Open MPI communicator with context id `cid`.
    #[inline(always)]
    pub const fn ompi(cid: u32) -> u64 {
        if cid == 0 {
            WORLD
        } else {
            OMPI_CID | cid as u64
        }
    }
}

/// A process lifecycle record (exec, exit, fork) for a watched process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcEvent {
    /// An [`EventKind`] value.
    pub kind: u32,
    /// Process id.
    pub tgid: u32,
    /// Parent (for fork) or 0.
    pub parent: u32,
    /// Real user id of the process when the event happened (for fork, the parent's, which
    /// the child inherits): its owner, known even if it exits before `/proc` is read.
    pub uid: u32,
    /// Monotonic ns.
    pub ts_ns: u64,
}
const _: () = assert!(size_of::<ProcEvent>() == 24);

impl ProcEvent {
    /// Bit of a [`EventKind::Pcontrol`] event's `parent` word: the process was paused.
    pub const PCONTROL_PAUSED: u32 = 1 << 31;

    /// The `parent` word of a [`EventKind::Pcontrol`] event: the level (its low 31 bits;
    /// MPI_Pcontrol's levels are small and non-negative) and whether the process was paused.
    pub const fn pcontrol(level: i32, paused: bool) -> u32 {
        (level as u32 & !Self::PCONTROL_PAUSED) | if paused { Self::PCONTROL_PAUSED } else { 0 }
    }

    /// The level and paused flag of a [`EventKind::Pcontrol`] event.
    pub const fn pcontrol_of(&self) -> (i32, bool) {
        (
            (self.parent & !Self::PCONTROL_PAUSED) as i32,
            self.parent & Self::PCONTROL_PAUSED != 0,
        )
    }
}

/// Key of maps indexed by a process and an MPI handle (datatypes, communicators).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HandleKey {
    /// Process id.
    pub tgid: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// The handle's value (an integer for MPICH).
    pub handle: u64,
}
const _: () = assert!(size_of::<HandleKey>() == 16);

/// What each start of a persistent request moves, learnt at its creation (`MPI_Send_init`,
/// `MPI_Allreduce_init` ...); kept per (process, request handle) in a [`HandleKey`] map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PersistentOp {
    /// Bytes by the creating routine's rule.
    pub bytes: u64,
    /// The per-peer counter each start adds to; `tgid` 0 for none (a collective, or a peer
    /// of `MPI_PROC_NULL`).
    pub peer: PeerKey,
}
const _: () = assert!(size_of::<PersistentOp>() == 32);
const _: () = assert!(offset_of!(PersistentOp, peer) == 8);

/// Persistent requests remembered at once, for the node (each user a share of them:
/// [`crate::shares`]); `MPI_Request_free` gives one back.
pub const MAX_PERSISTENT: u32 = 1 << 16;

/// Requests of one `MPI_Startall` whose traffic is counted (more: the call's bytes are not
/// measured, and counted as such).
pub const MAX_STARTALL: u32 = 4096;

/// What is known of a communicator (MPICH ABI: learnt from MPI_Comm_size/rank returns;
/// NCCL: from its creation, `ncclCommCount` and `ncclCommUserRank`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommInfo {
    /// Number of ranks, 0 if unknown.
    pub size: u32,
    /// This process's rank in it, -1 if unknown.
    pub rank: i32,
    /// Identity shared by all its members (NCCL), 0 if unknown.
    pub id: u64,
    /// Communicators split off it so far (NCCL): members split in the same order, so the
    /// sequence number tells apart two splits with the same color.
    pub splits: u32,
    /// How often its handle had been freed in this process while watched, when it was
    /// learnt ([`comm_generation`]): what tells its per-peer traffic ([`PeerKey::gen`]) from that of
    /// an earlier communicator given the same handle.
    pub gen: u16,
    /// Explicit padding.
    pub _pad: u16,
}
const _: () = assert!(size_of::<CommInfo>() == 24);

impl CommInfo {
    /// A communicator of `size` ranks (0: unknown) in which this process is `rank`.
    #[inline(always)]
    pub const fn new(size: u32, rank: i32, id: u64) -> CommInfo {
        CommInfo {
            size,
            rank,
            id,
            splits: 0,
            gen: 0,
            _pad: 0,
        }
    }
}

/// NCCL ABI facts (nccl.h 2.19 to 2.32; RCCL shares them).
pub mod nccl {
    /// Bytes of one element of `ncclDataType_t` value `t`: Int8, Uint8, Int32, Uint32,
    /// Int64, Uint64, Float16, Float32, Float64, Bfloat16, Float8e4m3, Float8e5m2.
    /// `None` for a value this table does not know (a newer NCCL): never guessed.
    #[inline(always)]
    pub const fn type_size(t: u32) -> Option<u64> {
        match t {
            0 | 1 | 10 | 11 => Some(1),
            2 | 3 | 7 => Some(4),
            4 | 5 | 8 => Some(8),
            6 | 9 => Some(2),
            _ => None,
        }
    }

    /// Words of an `ncclUniqueId` (128 bytes) hashed into a communicator id: its bootstrap
    /// magic and root address live in the first 48 bytes.
    pub const ID_WORDS: usize = 6;

    /// Folds words of a unique id (or of other identifying values) into a communicator id
    /// (FNV-1a over 64-bit words; never 0, which means unknown).
    #[inline(always)]
    pub const fn mix(h: u64, w: u64) -> u64 {
        let h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
        if h == 0 {
            1
        } else {
            h
        }
    }

    /// Start value of [`mix`].
    pub const SEED: u64 = 0xcbf2_9ce4_8422_2325;
}

/// MPICH ABI constants (MPICH 3/4 and Intel MPI share them).
pub mod mpich {
    /// `MPI_COMM_NULL`.
    pub const COMM_NULL: u64 = 0x0400_0000;
    /// `MPI_COMM_WORLD`.
    pub const COMM_WORLD: u64 = 0x4400_0000;
    /// `MPI_COMM_SELF`.
    pub const COMM_SELF: u64 = 0x4400_0001;
    /// `MPI_STATUS_IGNORE` / `MPI_STATUSES_IGNORE` are `(MPI_Status *)1`.
    pub const STATUS_IGNORE: u64 = 1;

    /// `MPI_DISTRIBUTE_BLOCK` (`mpi.h`; Intel MPI's the same).
    pub const DISTRIBUTE_BLOCK: i32 = 121;
    /// `MPI_DISTRIBUTE_CYCLIC`.
    pub const DISTRIBUTE_CYCLIC: i32 = 122;
    /// `MPI_DISTRIBUTE_NONE`.
    pub const DISTRIBUTE_NONE: i32 = 123;
    /// `MPI_DISTRIBUTE_DFLT_DARG`.
    pub const DISTRIBUTE_DFLT_DARG: i32 = -49767;

    /// Elements of one dimension of a distributed array (`MPI_Type_create_darray`) that
    /// the process at coordinate `r` of the `p` along it holds: `g` elements distributed by
    /// `distrib` with argument `darg` (MPI-4.1, section 5.1.4: one block of `darg`, by
    /// default `ceil(g / p)`, each; or blocks of `darg`, by default 1, dealt round the `p`
    /// cyclically). `None` for arguments MPI would refuse.
    #[inline(always)]
    pub fn darray_local(g: i64, distrib: i32, darg: i32, p: i32, r: u64) -> Option<u64> {
        if g < 0 || p <= 0 || r >= p as u64 {
            return None;
        }
        let (g, p) = (g as u64, p as u64);
        let block = |default: u64| match darg {
            DISTRIBUTE_DFLT_DARG => Some(default),
            b if b > 0 => Some(b as u64),
            _ => None,
        };
        match distrib {
            DISTRIBUTE_NONE => Some(g),
            DISTRIBUTE_BLOCK => {
                let b = block(g.div_ceil(p))?;
                Some(b.min(g.saturating_sub(r * b)))
            }
            DISTRIBUTE_CYCLIC => {
                let b = block(1)?;
                let cycle = b * p;
                Some(g / cycle * b + b.min((g % cycle).saturating_sub(r * b)))
            }
            _ => None,
        }
    }

    /// A builtin datatype handle of `size` bytes (below 256), as MPICH encodes one: what
    /// [`builtin_type_size`] decodes.
    #[inline(always)]
    pub const fn builtin_type_handle(size: u64) -> u64 {
        0x4c00_0000 | ((size & 0xff) << 8)
    }

    /// Size in bytes of a predefined datatype handle, if the handle encodes it or is a
    /// known pair type; `None` for derived types (looked up in the learnt-types map).
    #[inline(always)]
    pub const fn builtin_type_size(h: u32) -> Option<u64> {
        if h >> 30 == 1 && (h >> 26) & 0xf == 3 {
            return Some(((h >> 8) & 0xff) as u64);
        }
        // Pair types are preallocated direct objects with fixed handles.
        match h {
            0x8c00_0000 => Some(8),  // MPI_FLOAT_INT
            0x8c00_0001 => Some(12), // MPI_DOUBLE_INT
            0x8c00_0002 => Some(12), // MPI_LONG_INT
            0x8c00_0003 => Some(6),  // MPI_SHORT_INT
            0x8c00_0004 => Some(20), // MPI_LONG_DOUBLE_INT
            _ => None,
        }
    }
}

/// The MPI-5 standard ABI (`mpi_abi.h`, MPI-5.0 chapter 20; MPICH's `libmpi_abi.so`).
///
/// Predefined handles are constants below [`BUILTIN_LIMIT`]; any other handle is a
/// pointer to the implementation's object. MPICH's objects begin with MPICH's own integer
/// handle (its `MPIR_OBJECT_HEADER`, which its ABI layer reads to convert): commtap reads
/// it too, and from there decodes as for MPICH's ABI ([`to_mpich`]).
pub mod mpi_abi {
    /// Every predefined handle is below this value (`mpi_abi.h`: 0x1000).
    pub const BUILTIN_LIMIT: u64 = 0x1000;
    /// `MPI_COMM_NULL`.
    pub const COMM_NULL: u64 = 0x100;
    /// `MPI_COMM_WORLD`.
    pub const COMM_WORLD: u64 = 0x101;
    /// `MPI_COMM_SELF`.
    pub const COMM_SELF: u64 = 0x102;
    /// `MPI_PROC_NULL` (`MPI_ANY_SOURCE` is -1, `MPI_ROOT` -4).
    pub const PROC_NULL: i32 = -3;
    /// `MPI_DISTRIBUTE_NONE`.
    pub const DISTRIBUTE_NONE: i32 = 16;
    /// `MPI_DISTRIBUTE_BLOCK`.
    pub const DISTRIBUTE_BLOCK: i32 = 17;
    /// `MPI_DISTRIBUTE_CYCLIC`.
    pub const DISTRIBUTE_CYCLIC: i32 = 18;
    /// `MPI_DISTRIBUTE_DFLT_DARG` (so a `darg` of 19 is the default, as the ABI has it).
    pub const DISTRIBUTE_DFLT_DARG: i32 = 19;

    /// A darray dimension's distribution and argument as MPICH's constants, which
    /// [`super::mpich::darray_local`] takes.
    #[inline(always)]
    pub const fn darray_to_mpich(distrib: i32, darg: i32) -> (i32, i32) {
        use super::mpich;
        let distrib = match distrib {
            DISTRIBUTE_NONE => mpich::DISTRIBUTE_NONE,
            DISTRIBUTE_BLOCK => mpich::DISTRIBUTE_BLOCK,
            DISTRIBUTE_CYCLIC => mpich::DISTRIBUTE_CYCLIC,
            // Not a distribution: `darray_local` refuses it.
            _ => 0,
        };
        let darg = if darg == DISTRIBUTE_DFLT_DARG {
            mpich::DISTRIBUTE_DFLT_DARG
        } else {
            darg
        };
        (distrib, darg)
    }

    /// Offset of an `MPI_Status`'s received byte count: after `MPI_SOURCE`, `MPI_TAG`,
    /// `MPI_ERROR`, MPICH keeps its `count_lo` and `count_hi_and_cancelled` in
    /// `MPI_internal[0..2]` (measured: a receive of 12,345 bytes left 0x3039 at +12).
    pub const STATUS_COUNT_OFF: u64 = 12;
    /// Offset of `MPI_SOURCE` in an `MPI_Status`.
    pub const STATUS_SOURCE_OFF: u64 = 0;
    /// Offset of `MPI_TAG` in an `MPI_Status`.
    pub const STATUS_TAG_OFF: u64 = 4;

    /// MPICH's handle for predefined handle `h`: the communicators commtap knows by
    /// value, and for a predefined datatype a builtin MPICH handle of its size (so every
    /// handle, once read, decodes as MPICH's); `h` itself otherwise.
    #[inline(always)]
    pub const fn builtin_to_mpich(h: u64) -> u64 {
        match h {
            COMM_WORLD => super::mpich::COMM_WORLD,
            COMM_SELF => super::mpich::COMM_SELF,
            _ => match builtin_type_size(h) {
                Some(size) => super::mpich::builtin_type_handle(size),
                None => h,
            },
        }
    }

    /// MPICH's integer handle for ABI handle `h`, reading a non-predefined handle's object
    /// with `read_int` (its first `int`); `None` if it cannot be read.
    #[inline(always)]
    pub fn to_mpich(h: u64, read_int: impl FnOnce(u64) -> Option<u32>) -> Option<u64> {
        if h < BUILTIN_LIMIT {
            Some(builtin_to_mpich(h))
        } else {
            read_int(h).map(u64::from)
        }
    }

    /// Sizes of the predefined datatypes 0x200..0x240 on x86-64 Linux (LP64), by value:
    /// the C and Fortran types whose size the platform decides, and the pair types.
    pub(crate) const PLATFORM_SIZES: [u8; 64] = {
        let mut t = [0u8; 64];
        let sized: [(usize, u8); 41] = [
            (0x01, 8),  // AINT
            (0x02, 8),  // COUNT
            (0x03, 8),  // OFFSET
            (0x07, 1),  // PACKED
            (0x08, 2),  // SHORT
            (0x09, 4),  // INT
            (0x0a, 8),  // LONG
            (0x0b, 8),  // LONG_LONG
            (0x0c, 2),  // UNSIGNED_SHORT
            (0x0d, 4),  // UNSIGNED
            (0x0e, 8),  // UNSIGNED_LONG
            (0x0f, 8),  // UNSIGNED_LONG_LONG
            (0x10, 4),  // FLOAT
            (0x12, 8),  // C_FLOAT_COMPLEX
            (0x13, 8),  // CXX_FLOAT_COMPLEX
            (0x14, 8),  // DOUBLE
            (0x16, 16), // C_DOUBLE_COMPLEX
            (0x17, 16), // CXX_DOUBLE_COMPLEX
            (0x18, 4),  // LOGICAL
            (0x19, 4),  // INTEGER
            (0x1a, 4),  // REAL
            (0x1b, 8),  // COMPLEX
            (0x1c, 8),  // DOUBLE_PRECISION
            (0x1d, 16), // DOUBLE_COMPLEX
            (0x1e, 1),  // CHARACTER
            (0x20, 16), // LONG_DOUBLE
            (0x24, 32), // C_LONG_DOUBLE_COMPLEX
            (0x25, 32), // CXX_LONG_DOUBLE_COMPLEX
            (0x28, 8),  // FLOAT_INT
            (0x29, 12), // DOUBLE_INT
            (0x2a, 12), // LONG_INT
            (0x2b, 8),  // 2INT
            (0x2c, 6),  // SHORT_INT
            (0x2d, 20), // LONG_DOUBLE_INT
            (0x30, 8),  // 2REAL
            (0x31, 16), // 2DOUBLE_PRECISION
            (0x32, 8),  // 2INTEGER
            (0x38, 1),  // C_BOOL
            (0x39, 1),  // CXX_BOOL
            (0x3c, 4),  // WCHAR
            (0x00, 0),  // DATATYPE_NULL
        ];
        let mut i = 0;
        while i < sized.len() {
            t[sized[i].0] = sized[i].1;
            i += 1;
        }
        t
    };

    /// The sizes [`PLATFORM_SIZES`] holds, each a 4-bit code's (its index here).
    const SIZE_CODES: [u8; 10] = [0, 1, 2, 4, 8, 16, 32, 6, 12, 20];

    /// [`SIZE_CODES`] packed 6 bits each, indexed by code.
    const CODE_SIZES: u64 = {
        let mut w = 0u64;
        let mut i = 0;
        while i < SIZE_CODES.len() {
            w |= (SIZE_CODES[i] as u64) << (i * 6);
            i += 1;
        }
        w
    };

    /// [`PLATFORM_SIZES`] as 4-bit codes, 16 to a word: looked up by shifts, not by a
    /// tree of branches (the verifier walks every branch of a `bpf_loop` body).
    const PACKED_SIZES: [u64; 4] = {
        let mut words = [0u64; 4];
        let mut i = 0;
        while i < 64 {
            let mut code = 0;
            while SIZE_CODES[code] != PLATFORM_SIZES[i] {
                code += 1;
            }
            words[i / 16] |= (code as u64) << ((i % 16) * 4);
            i += 1;
        }
        words
    };

    /// Size in bytes of predefined datatype `h` on x86-64 Linux (LP64), `None` for any other
    /// handle. The ABI encodes the size of its fixed-size types (0x240..0x300) in the value,
    /// as log2 in bits 3..6; the others are [`PLATFORM_SIZES`]. Checked against the
    /// library's own `MPI_Type_size` by an end-to-end test.
    #[inline(always)]
    pub const fn builtin_type_size(h: u64) -> Option<u64> {
        if h >= 0x240 && h < 0x300 {
            return Some(1 << ((h >> 3) & 7));
        }
        if h < 0x200 || h >= 0x240 {
            return None;
        }
        // Constants, not an array indexed at run time (which BPF would copy to its stack).
        const W: [u64; 4] = PACKED_SIZES;
        const W0: u64 = W[0];
        const W1: u64 = W[1];
        const W2: u64 = W[2];
        const W3: u64 = W[3];
        let i = h - 0x200;
        let word = if i < 16 {
            W0
        } else if i < 32 {
            W1
        } else if i < 48 {
            W2
        } else {
            W3
        };
        let code = (word >> ((i & 15) * 4)) & 15;
        match (CODE_SIZES >> (code * 6)) & 63 {
            0 => None,
            size => Some(size),
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::{
        CommInfo, Config, CounterKey, CounterSlot, CounterVal, FabricText, HandleKey,
        IdentityOffsets, Layout, PeerKey, PeerVal, PersistentOp, ProcStats, TpOffsets,
    };

    /// Marks plain-old-data types that userspace reads out of BPF maps.
    macro_rules! pod {
        ($($t:ty),* $(,)?) => {
            $(
                // SAFETY: a #[repr(C)] struct of plain integers with explicit padding
                // (the layout assertions above check each).
                unsafe impl aya::Pod for $t {}
            )*
        };
    }

    pod!(
        Layout,
        CounterKey,
        CounterSlot,
        CounterVal,
        PeerKey,
        PeerVal,
        crate::SiteKey,
        crate::SiteVal,
        ProcStats,
        HandleKey,
        CommInfo,
        PersistentOp,
        TpOffsets,
        IdentityOffsets,
        Config,
        FabricText,
        crate::ComponentAddrs,
        crate::FabricRanges,
        crate::ArgSpec,
        crate::DurationHist,
        crate::shares::Held,
        crate::shares::SubuidRange,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpi_abi_predefined_types_have_their_platform_sizes() {
        use mpi_abi::builtin_type_size as size;
        // mpi_abi.h's values: the fixed-size types by their encoding, the others listed.
        for (h, bytes) in [
            (0x240, 1),  // INT8_T
            (0x243, 1),  // CHAR
            (0x247, 1),  // BYTE
            (0x249, 2),  // UINT16_T
            (0x251, 4),  // UINT32_T
            (0x258, 8),  // INT64_T
            (0x2d3, 4),  // COMPLEX4
            (0x2e2, 16), // REAL16
            (0x2eb, 32), // COMPLEX32
            (0x209, 4),  // INT
            (0x20a, 8),  // LONG
            (0x214, 8),  // DOUBLE
            (0x220, 16), // LONG_DOUBLE
            (0x229, 12), // DOUBLE_INT
            (0x22d, 20), // LONG_DOUBLE_INT
            (0x23c, 4),  // WCHAR
        ] {
            assert_eq!(size(h), Some(bytes), "{h:#x}");
        }
        // The packed lookup holds the table.
        for (i, bytes) in mpi_abi::PLATFORM_SIZES.iter().enumerate() {
            let want = (*bytes != 0).then_some(u64::from(*bytes));
            assert_eq!(size(0x200 + i as u64), want, "{:#x}", 0x200 + i);
        }
        // MPI_DATATYPE_NULL, a communicator, an MPICH handle, a pointer.
        for h in [0x200, 0x101, 0x4c00_0405, 0x7f00_1234_5000] {
            assert_eq!(size(h), None, "{h:#x}");
        }
        let read = |_| Some(0x8400_0002);
        assert_eq!(mpi_abi::to_mpich(0x101, read), Some(mpich::COMM_WORLD));
        assert_eq!(mpi_abi::to_mpich(0x102, read), Some(mpich::COMM_SELF));
        let int = mpi_abi::to_mpich(0x209, read).expect("INT");
        assert_eq!(mpich::builtin_type_size(int as u32), Some(4));
        let double_int = mpi_abi::to_mpich(0x229, read).expect("DOUBLE_INT");
        assert_eq!(mpich::builtin_type_size(double_int as u32), Some(12));
        assert_eq!(mpi_abi::to_mpich(0x180, read), Some(0x180)); // MPI_REQUEST_NULL
        assert_eq!(mpi_abi::to_mpich(0x7f00_1234_5000, read), Some(0x8400_0002));
        assert_eq!(mpi_abi::to_mpich(0x7f00_1234_5000, |_| None), None);
        assert!(Abi::integer_handles(Abi::MpiAbi as u8));
        assert_eq!(Abi::proc_null(Abi::MpiAbi as u8), Some(-3));
    }

    #[test]
    fn a_darray_dimension_holds_what_the_standard_deals_each_process() {
        extern crate std;
        use mpich::{
            darray_local, DISTRIBUTE_BLOCK as BLOCK, DISTRIBUTE_CYCLIC as CYCLIC,
            DISTRIBUTE_DFLT_DARG as DFLT, DISTRIBUTE_NONE as NONE,
        };
        let all = |g, d, a, p: i32| -> std::vec::Vec<Option<u64>> {
            (0..p as u64).map(|r| darray_local(g, d, a, p, r)).collect()
        };
        // 10 over 3 in blocks of ceil(10 / 3) = 4: 4, 4, 2; in blocks of 5: 5, 5, 0.
        assert_eq!(all(10, BLOCK, DFLT, 3), [Some(4), Some(4), Some(2)]);
        assert_eq!(all(10, BLOCK, 5, 3), [Some(5), Some(5), Some(0)]);
        // Cyclic by 1: 0 3 6 9 | 1 4 7 | 2 5 8; by 2: 0-1 6-7 | 2-3 8-9 | 4-5.
        assert_eq!(all(10, CYCLIC, DFLT, 3), [Some(4), Some(3), Some(3)]);
        assert_eq!(all(10, CYCLIC, 2, 3), [Some(4), Some(4), Some(2)]);
        // 7 by 3 over 2: 0-2 6 | 3-5.
        assert_eq!(all(7, CYCLIC, 3, 2), [Some(4), Some(3)]);
        assert_eq!(all(7, NONE, DFLT, 1), [Some(7)]);
        // What MPI refuses: a process grid of 0, a negative block, an unknown kind.
        assert_eq!(darray_local(7, BLOCK, DFLT, 0, 0), None);
        assert_eq!(darray_local(7, CYCLIC, -2, 2, 0), None);
        assert_eq!(darray_local(7, 999, DFLT, 2, 0), None);
        assert_eq!(darray_local(7, BLOCK, DFLT, 2, 2), None);
    }

    #[test]
    fn a_loop_of_up_to_eight_keys_finds_them_all_in_the_counter_cache() {
        let key = |routine: &str, bucket: u8| {
            CounterKey {
                tgid: 4242,
                routine: crate::routines::routine_id(routine).expect("routine"),
                parent: CounterKey::NO_PARENT,
                comm_size: 2,
                bucket,
                ..CounterKey::default()
            }
            .words()
        };
        let keys = [
            key("MPI_Isend", 10),
            key("MPI_Isend", 11),
            key("MPI_Irecv", 10),
            key("MPI_Irecv", 11),
            key("MPI_Waitall", 0),
            key("MPI_Allreduce", 4),
            key("MPI_Send", 10),
            key("MPI_Recv", 10),
        ];
        let mut cache = HandleCache::default();
        for (slot, k) in keys.iter().enumerate() {
            assert_eq!(cache.counter_slot(k), None);
            cache.remember_counter(*k, slot as u32);
        }
        for _ in 0..3 {
            for (slot, k) in keys.iter().enumerate() {
                assert_eq!(cache.counter_slot(k), Some(slot as u32));
            }
        }
        // A ninth key takes the oldest entry's place.
        let ninth = key("MPI_Barrier", 0);
        cache.remember_counter(ninth, 8);
        assert_eq!(cache.counter_slot(&ninth), Some(8));
        assert_eq!(cache.counter_slot(&keys[0]), None);
        assert_eq!(cache.counter_slot(&keys[1]), Some(1));
    }

    #[test]
    fn cookie_roundtrip() {
        let c = Cookie {
            routine: 513,
            layout: 7,
            abi: Abi::Mpich as u8,
            function: 300,
            skip: 4,
        };
        assert_eq!(Cookie::unpack(c.pack()), c);
        assert_eq!(c.fabric_function(), (7 << 16) | 0x12c);
    }

    #[test]
    fn mpich_builtin_sizes() {
        // Values measured on MPICH 4.0.2 (TARGETS.md §3).
        assert_eq!(mpich::builtin_type_size(0x4c00_0101), Some(1)); // CHAR
        assert_eq!(mpich::builtin_type_size(0x4c00_0405), Some(4)); // INT
        assert_eq!(mpich::builtin_type_size(0x4c00_080b), Some(8)); // DOUBLE
        assert_eq!(mpich::builtin_type_size(0x4c00_100c), Some(16)); // LONG_DOUBLE
        assert_eq!(mpich::builtin_type_size(0x8c00_0001), Some(12)); // DOUBLE_INT
        assert_eq!(mpich::builtin_type_size(0x8c00_0010), None); // derived
        assert_eq!(mpich::builtin_type_size(0x4400_0000), None); // a communicator
    }
}
