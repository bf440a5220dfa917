//! The names userspace asks the BPF object for: its maps and programs. In collector-ebpf
//! they are the identifiers of the `#[map]` statics and program functions; a name that
//! disagrees fails the load, naming it.

/// Map names.
pub mod maps {
    /// Processes whose calls are counted, with their watch flags.
    pub const WATCHED: &str = "WATCHED";
    /// When a process last entered `WATCHED` (boot clock, ns), per CPU, the kernel's and
    /// userspace's apart (`collector_common::watch::LATEST_*`).
    pub const WATCHED_LATEST: &str = "WATCHED_LATEST";
    /// The scope generation: the kernel's and userspace's counts of the changes that may
    /// make a process not counted a counted one (userspace's: the watched set, the limits).
    pub const SCOPE_GEN: &str = "SCOPE_GEN";
    /// Counter keys and their slots.
    pub const COUNTER_SLOTS: &str = "COUNTER_SLOTS";
    /// Per-CPU counter values by slot.
    pub const COUNTER_VALUES: &str = "COUNTER_VALUES";
    /// Duration histograms by counter slot.
    pub const COUNTER_DURATIONS: &str = "COUNTER_DURATIONS";
    /// Slots given back, to be given to new keys.
    pub const FREE_SLOTS: &str = "FREE_SLOTS";
    /// The first counter slot never given to a key.
    pub const NEXT_FRESH_SLOT: &str = "NEXT_FRESH_SLOT";
    /// The handle generation that makes threads drop cached slots and handles.
    pub const HANDLE_GEN: &str = "HANDLE_GEN";
    /// NCCL device-time windows per operation key.
    pub const DEVICE_TIME: &str = "DEVICE_TIME";
    /// Point-to-point traffic per peer.
    pub const PEERS: &str = "PEERS";
    /// Point-to-point traffic per peer of freed communicators, moved out of `PEERS` by
    /// userspace (written by it alone; a map so that it is kept with `PEERS`).
    pub const PEERS_FOLDED: &str = "PEERS_FOLDED";
    /// Calls, bytes and time per call site.
    pub const CALL_SITES: &str = "CALL_SITES";
    /// Per-process health counters and times.
    pub const PROC_STATS: &str = "PROC_STATS";
    /// Communicators learnt per process.
    pub const COMMS: &str = "COMMS";
    /// Per process and communicator handle: how often the handle was freed.
    pub const COMM_FREES: &str = "COMM_FREES";
    /// Entries of the shared maps each user holds (`shares`).
    pub const USER_HELD: &str = "USER_HELD";
    /// Per user, what userspace gave back of the shared maps' entries (processes forgotten).
    pub const USER_RELEASED: &str = "USER_RELEASED";
    /// Entries of the shared maps each process holds, and its user.
    pub const PROC_HELD: &str = "PROC_HELD";
    /// The node's sub-uid ranges and the users given them, sorted (`shares`).
    pub const SUBUIDS: &str = "SUBUIDS";
    /// Per process and communicator: the number its next collective takes.
    pub const COLL_SEQ: &str = "COLL_SEQ";
    /// Datatype sizes learnt per process.
    pub const DTYPES: &str = "DTYPES";
    /// What each start of a persistent request moves, learnt at its creation.
    pub const PERSISTENT: &str = "PERSISTENT";
    /// The settings userspace writes.
    pub const CONFIG: &str = "CONFIG";
    /// Decoding layouts per library slot.
    pub const LAYOUTS: &str = "LAYOUTS";
    /// libfabric functions and their slots.
    pub const FABRIC_FUNCS: &str = "FABRIC_FUNCS";
    /// libfabric text ranges per library slot.
    pub const FABRIC_TEXT: &str = "FABRIC_TEXT";
    /// libfabric code ranges per process.
    pub const FABRIC_RANGES: &str = "FABRIC_RANGES";
    /// Where each Open MPI process keeps its selected components.
    pub const MPI_COMPONENTS: &str = "MPI_COMPONENTS";
    /// The ring buffer of process and call events.
    pub const EVENTS: &str = "EVENTS";
    /// The routine table.
    pub const ROUTINE_SPECS: &str = "ROUTINE_SPECS";
    /// This kernel's `task_struct` offsets for identity events.
    pub const IDENTITY_OFFSETS: &str = "IDENTITY_OFFSETS";
    /// This kernel's tracepoint field offsets.
    pub const TP_OFFSETS: &str = "TP_OFFSETS";
    /// Per routine: time one call in N (0 or 1: every call).
    pub const TIME_ONE_IN: &str = "TIME_ONE_IN";
    /// Per process and routine: its own N, where the routine's `TIME_ONE_IN` says so.
    pub const PROCESS_ONE_IN: &str = "PROCESS_ONE_IN";
    /// Processes paused at a library load, not yet continued: pid -> when (monotonic ns).
    pub const PAUSED: &str = "PAUSED";
    /// The task-local storage of in-flight calls (created by userspace).
    pub const TASK_STATE: &str = "TASK_STATE";
    /// The names of job launchers, never paused at their library loads.
    pub const LAUNCHERS: &str = "LAUNCHERS";

    /// The maps that carry a node's counts across a daemon restart (the others are refilled
    /// at start, or hold per-run state such as library slots); `PAUSED` too, so that a
    /// daemon restarted after a crash continues the processes its predecessor paused. Not
    /// the shares (`USER_HELD` & co): started empty, a user's entries from before the
    /// restart go uncharged (until its processes are forgotten), where a share kept could
    /// count processes no daemon will forget.
    pub const KEPT: [&str; 17] = [
        WATCHED,
        WATCHED_LATEST,
        COUNTER_SLOTS,
        COUNTER_VALUES,
        COUNTER_DURATIONS,
        FREE_SLOTS,
        NEXT_FRESH_SLOT,
        DEVICE_TIME,
        PEERS,
        PEERS_FOLDED,
        CALL_SITES,
        PROC_STATS,
        COMMS,
        COMM_FREES,
        DTYPES,
        PERSISTENT,
        PAUSED,
    ];
}

/// Program names.
pub mod programs {
    /// Entry of every MPI and NCCL routine.
    pub const CALL_ENTRY: &str = "call_entry";
    /// Return of Open MPI's routines.
    pub const MPI_RETURN_OMPI: &str = "mpi_return_ompi";
    /// Return of an MPICH-ABI library's routines but its datatype constructors.
    pub const MPI_RETURN_MPICH: &str = "mpi_return_mpich";
    /// Return of an MPICH-ABI library's datatype constructors and `MPI_Type_free`.
    pub const MPI_RETURN_MPICH_TYPES: &str = "mpi_return_mpich_types";
    /// Return of an MPI-5-ABI library's routines but its datatype constructors.
    pub const MPI_RETURN_MPI_ABI: &str = "mpi_return_mpi_abi";
    /// Return of an MPI-5-ABI library's datatype constructors and `MPI_Type_free`.
    pub const MPI_RETURN_MPI_ABI_TYPES: &str = "mpi_return_mpi_abi_types";
    /// Return of NCCL's routines.
    pub const NCCL_RETURN: &str = "nccl_return";
    /// Entry and return of Open MPI's routines, as a uprobe session.
    pub const SESS_OMPI: &str = "sess_ompi";
    /// `MPI_RETURN_MPICH`'s routines, as a uprobe session.
    pub const SESS_MPICH: &str = "sess_mpich";
    /// `MPI_RETURN_MPICH_TYPES`'s routines, as a uprobe session.
    pub const SESS_MPICH_TYPES: &str = "sess_mpich_types";
    /// `MPI_RETURN_MPI_ABI`'s routines, as a uprobe session.
    pub const SESS_MPI_ABI: &str = "sess_mpi_abi";
    /// `MPI_RETURN_MPI_ABI_TYPES`'s routines, as a uprobe session.
    pub const SESS_MPI_ABI_TYPES: &str = "sess_mpi_abi_types";
    /// NCCL's routines, as a uprobe session.
    pub const SESS_NCCL: &str = "sess_nccl";
    /// libfabric's and UCX's functions, as a uprobe session.
    pub const SESS_FABRIC: &str = "sess_fabric";
    /// Entry of a libfabric ops-table function.
    pub const FABRIC_ENTRY: &str = "fabric_entry";
    /// Return of a libfabric ops-table function.
    pub const FABRIC_RETURN: &str = "fabric_return";
    /// libfabric's `fi_fabric`.
    pub const FABRIC_OPEN: &str = "fabric_open";
    /// The dynamic linker's `_dl_debug_state`: libraries were loaded.
    pub const LINKER_LOADED: &str = "linker_loaded";
    /// `MPI_Pcontrol`: the profiled region starts or pauses.
    pub const MPI_PCONTROL: &str = "mpi_pcontrol";
    /// Entry of an MPI's Fortran binding (while call sites are counted): the program's
    /// call into it, for the site of the MPI call the binding makes.
    pub const BINDING_ENTRY: &str = "binding_entry";
    /// `sched:sched_process_fork`.
    pub const SCHED_FORK: &str = "sched_fork";
    /// `sched:sched_process_exec`.
    pub const SCHED_EXEC: &str = "sched_exec";
    /// `sched:sched_process_exit`.
    pub const SCHED_EXIT: &str = "sched_exit";
    /// A task iterator: a thread's user registers as its last kernel entry saved them.
    pub const TASK_REGISTERS: &str = "task_registers";

    /// The session program that stands for an entry probe of `CALL_ENTRY` with a return
    /// probe of the given program.
    pub const fn session_for(ret: &str) -> Option<&'static str> {
        match ret.as_bytes() {
            b"mpi_return_ompi" => Some(SESS_OMPI),
            b"mpi_return_mpich" => Some(SESS_MPICH),
            b"mpi_return_mpich_types" => Some(SESS_MPICH_TYPES),
            b"mpi_return_mpi_abi" => Some(SESS_MPI_ABI),
            b"mpi_return_mpi_abi_types" => Some(SESS_MPI_ABI_TYPES),
            b"nccl_return" => Some(SESS_NCCL),
            b"fabric_return" => Some(SESS_FABRIC),
            _ => None,
        }
    }

    /// The session programs (uprobe_multi links of the session kind).
    pub const SESSIONS: [&str; 7] = [
        SESS_OMPI,
        SESS_MPICH,
        SESS_MPICH_TYPES,
        SESS_MPI_ABI,
        SESS_MPI_ABI_TYPES,
        SESS_NCCL,
        SESS_FABRIC,
    ];

    /// The programs attached through uprobe_multi links.
    pub const PROBES: [&str; 12] = [
        CALL_ENTRY,
        MPI_RETURN_OMPI,
        MPI_RETURN_MPICH,
        MPI_RETURN_MPICH_TYPES,
        MPI_RETURN_MPI_ABI,
        MPI_RETURN_MPI_ABI_TYPES,
        NCCL_RETURN,
        FABRIC_ENTRY,
        FABRIC_RETURN,
        FABRIC_OPEN,
        LINKER_LOADED,
        MPI_PCONTROL,
    ];
}
