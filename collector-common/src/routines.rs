//! The table of probed MPI and NCCL routines: names, argument positions and byte rules.
//!
//! The BPF programs are generic: one entry and one return program serve every routine, and
//! the attach cookie names the routine. Userspace copies each [`ArgSpec`] of this table into
//! the `ROUTINE_SPECS` array map at load, so the kernel and the report read the same table.
//! Ids are indexes into [`ROUTINES`]; append only, never reorder, so ids stay stable.
//!
//! Byte conventions follow IBM mpitrace for MPI and nccl-tests for NCCL (see README "Byte
//! conventions").

use core::mem::size_of;

/// Marks an unused argument slot in an [`ArgSpec`].
pub const NO_ARG: u8 = 0xff;

/// How the bytes of one call are computed from its arguments.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteRule {
    /// No bytes (waits, tests, barriers, queries).
    None = 0,
    /// `a` (count; 1 when `a` is [`NO_ARG`]) x size(`b`).
    CountType = 1,
    /// Bytes received per the status at `c` (posted `a` x size(`b`) with STATUS_IGNORE).
    RecvStatus = 2,
    /// `a` x size(`b`) sent + `c` x size(`d`) received (Sendrecv). The destination is
    /// `peer`, the source the argument two before the communicator (both Sendrecv
    /// signatures end `source, recvtag, comm, status`): a half whose peer is
    /// `MPI_PROC_NULL` moves nothing.
    Pair = 3,
    /// sum(`a`[0..P]) x size(`b`), P the communicator size (Reduce_scatter).
    SumCounts = 4,
    /// sum(`a`[0..P]) x size(`b`) / P (Alltoallv: bytes per peer).
    SumCountsPerPeer = 5,
    /// `a`[my rank] x size(`b`) (Allgatherv).
    CountAtRank = 6,
    /// `a` x size(`b`) x P (NCCL's AllGather, ReduceScatter ...: the whole vector, as
    /// nccl-tests sizes them).
    CountTypeTimesP = 7,
    /// sum(`a`[i] x size(`b`[i])) / P (Alltoallw).
    SumCountsTypesPerPeer = 8,
    /// Type constructor: new type `*d` has size `a` x `c` (1 if [`NO_ARG`]) x size(`b`).
    CtorProduct = 16,
    /// Type constructor: new type `*d` has size sum(`c`[0..a]) x size(`b`).
    CtorSum = 17,
    /// Type constructor: new type `*d` has size sum(`c`[i] x size(`b`[i]), i < a).
    CtorStruct = 18,
    /// Type constructor: new type `*d` has size prod(`c`[0..a]) x size(`b`) (subarray).
    CtorProdArray = 19,
    /// `MPI_Type_free(*a)`: forget the learnt size.
    TypeFree = 20,
    /// `MPI_Comm_size(a, *d)`: learn the communicator's size.
    CommSize = 21,
    /// `MPI_Comm_rank(a, *d)`: learn this process's rank in the communicator.
    CommRank = 22,
    /// `MPI_Comm_free(*a)`: forget what was learnt or cached of the communicator.
    CommFree = 23,
    /// NCCL communicator creation: on success `*a` is a communicator of `b` ranks in which
    /// this process has rank `c`; its unique id is passed by value from stack argument `d`
    /// on (`d` >= 6) or through the pointer in argument `d`.
    NcclCommInit = 24,
    /// `ncclCommInitAll(comms, n, devs)`: `a`[i], i < `b`, has rank i of `b`.
    NcclCommInitAll = 25,
    /// `ncclCommSplit(comm, color, key, *newcomm, cfg)`: `*d` is part of the communicator
    /// `comm` splits off for color `b` (its size is learnt later, if the program asks).
    NcclCommSplit = 26,
    /// `ncclCommDestroy(a)` / `ncclCommAbort(a)`: forget the communicator.
    NcclCommFree = 27,
    /// `ncclGroupStart()`: opens a group (groups nest).
    GroupStart = 28,
    /// `ncclGroupEnd()`: closes a group; the outermost one is counted as a group.
    GroupEnd = 29,
    /// No function: one completed outermost NCCL group (entry of its start to the return of
    /// its end), with the bytes of the operations enqueued in it.
    GroupSpan = 30,
    /// A host-side wait for the GPU (`cudaStreamSynchronize` & co): ends the thread's
    /// device-time window of NCCL operations.
    DeviceSync = 31,
    /// libfabric: the `size_t` length in argument `a`.
    FabricLen = 32,
    /// libfabric: the sum of the `iov_len`s of the `struct iovec` array in argument `a`,
    /// `b` entries.
    FabricIov = 33,
    /// libfabric: the sum of the `iov_len`s of a `struct fi_msg` (or `fi_msg_tagged`,
    /// `fi_msg_rma`: all start with `msg_iov`, `desc`, `iov_count`) in argument `a`.
    FabricMsg = 34,
    /// NCCL network transport send (`isend(comm, data, size_t size, tag, mhandle, phandle,
    /// **request)`): `a` bytes; an operation only if `*d` (the request) is set on return
    /// (NULL: not posted yet, NCCL tries again).
    NetIsend = 35,
    /// NCCL network transport receive (`irecv(comm, int n, **data, size_t *sizes, ...,
    /// **request)`): sum(`b`[0..`a`]) posted bytes (`size_t`s); an operation only if `*d`
    /// is set on return.
    NetIrecv = 36,
    /// A posted receive: `a` (count) x size(`b`), from `peer` (`MPI_Irecv`).
    RecvPosted = 39,
    /// MPI communicator constructor: `*d` is the new communicator (read at return), `a` the
    /// color or split type that tells its sibling communicators apart (`NO_ARG`: none);
    /// where `b` and `c` are given (`MPI_Cart_create`: `ndims`, `dims`), the product of
    /// the `b` ints at `c` is its size.
    CommCreate = 37,
    /// `MPI_Comm_dup(comm, *d)`: a constructor whose new communicator has `comm`'s size and
    /// ranks.
    CommDup = 38,
    /// `a` x size(`b`) with `a` a 64-bit `MPI_Count` (MPI-4's large-count collectives:
    /// `MPI_Allreduce_c` ...; point-to-point: sent, as [`ByteRule::CountType`]).
    LargeCountType = 40,
    /// [`ByteRule::RecvPosted`] with a 64-bit `MPI_Count` (`MPI_Irecv_c`).
    LargeRecvPosted = 41,
    /// [`ByteRule::RecvStatus`] with a 64-bit `MPI_Count` (`MPI_Recv_c`).
    LargeRecvStatus = 42,
    /// [`ByteRule::Pair`] with 64-bit `MPI_Count`s (`MPI_Sendrecv_c`).
    LargePair = 43,
    /// `MPI_Start(*a)`: the bytes the persistent request moves, learnt at its creation
    /// (its traffic is counted per peer as a send or receive of that creation's would be).
    Start = 44,
    /// `MPI_Startall(a, b[])`: [`ByteRule::Start`] for each of the `a` requests of `b`.
    StartAll = 45,
    /// [`ByteRule::Pair`] of a nonblocking call (`MPI_Isendrecv`): the receive counts its
    /// posted size, from the source it names (no status yet).
    PairPosted = 46,
    /// [`ByteRule::PairPosted`] with 64-bit `MPI_Count`s (`MPI_Isendrecv_c`).
    LargePairPosted = 47,
    /// A partitioned send's creation (`MPI_Psend_init`): `a` partitions (an `int`) x `b`
    /// (the count per partition, an `MPI_Count`) x size(argument `b + 1`).
    Partitioned = 48,
    /// [`ByteRule::Partitioned`] of a receive (`MPI_Precv_init`).
    PartitionedRecv = 49,
    /// The value of argument `a`, an `MPI_Aint` (a window's creation: its size in bytes, as
    /// mpitrace counts it); a negative one is not decoded.
    AintArg = 50,
    /// [`ByteRule::SumCounts`] over 64-bit `MPI_Count`s (`MPI_Reduce_scatter_c`).
    LargeSumCounts = 51,
    /// [`ByteRule::SumCountsPerPeer`] over `MPI_Count`s (`MPI_Alltoallv_c`).
    LargeSumCountsPerPeer = 52,
    /// [`ByteRule::CountAtRank`] over `MPI_Count`s (`MPI_Allgatherv_c`).
    LargeCountAtRank = 53,
    /// [`ByteRule::SumCountsTypesPerPeer`] over `MPI_Count`s (`MPI_Alltoallw_c`).
    LargeSumCountsTypesPerPeer = 54,
    /// [`ByteRule::CtorProduct`] with `MPI_Count`s (`MPI_Type_contiguous_c` ...).
    LargeCtorProduct = 55,
    /// [`ByteRule::CtorSum`] with `MPI_Count`s (`MPI_Type_indexed_c` ...).
    LargeCtorSum = 56,
    /// [`ByteRule::CtorStruct`] with `MPI_Count`s (`MPI_Type_create_struct_c`).
    LargeCtorStruct = 57,
    /// [`ByteRule::CtorProdArray`] with `MPI_Count` sizes (`MPI_Type_create_subarray_c`;
    /// its number of dimensions `a` stays an `int`).
    LargeCtorProdArray = 58,
    /// `MPI_Type_create_darray` (integer-handle ABIs): the elements of the distributed
    /// array this process holds (arguments 0 to 6: size, rank, ndims and the per-dimension
    /// arrays) times the size of type `b`; its new handle `*d`.
    CtorDarray = 59,
    /// [`ByteRule::CtorDarray`] with `MPI_Count` global sizes
    /// (`MPI_Type_create_darray_c`).
    LargeCtorDarray = 60,
    /// UCX `_nbx` operation: `a` (count) elements of the datatype the
    /// `ucp_request_param_t` in argument `b` names (its `datatype` when its `op_attr_mask`
    /// says so, else bytes), the buffer in argument 1 (an iovec array for `UCP_DATATYPE_IOV`).
    UcxParam = 61,
    /// UCX `_nb`/`_nbr` operation: `a` (count) elements of the `ucp_datatype_t` in argument
    /// `b`, the buffer in argument 1.
    UcxDatatype = 62,
    /// UCX RMA `_nb`/`_nbi` operation: the `size_t` length in argument `a` (as
    /// [`ByteRule::FabricLen`], a rule of its own so that its time may be sampled).
    UcxLen = 63,
    /// MPI_Request_free: the request in `*a` is forgotten (a persistent one's entry given
    /// back).
    RequestFree = 64,
    /// `MPI_Wait(a)` (`b` none) or `MPI_Waitall(a, b[])`: completes the request in `*a`, or
    /// the `a` requests of `b`; a nonblocking receive's message arrives in it. Read at
    /// entry (the call resets them), while per-call events are on.
    Completes = 65,
    /// `MPI_Test(a, *c)` (`b` none) or `MPI_Testall(a, b[], *c)`: completes its requests
    /// if its flag `*c` says so at its return.
    MayComplete = 66,
    /// `MPI_Waitany(a, b[], *d)` or `MPI_Testany(a, b[], *d, *c)`: completes request
    /// `*d` of `b` (if its flag `*c`, where it has one, says so).
    CompletesOne = 67,
    /// `MPI_Waitsome`/`MPI_Testsome(a, b[], *c, d[])`: completes the `*c` requests of `b`
    /// whose indices are in `d`.
    CompletesSome = 68,
}

impl ByteRule {
    /// Whether the routine creates a communicator (its new handle is argument `*d`).
    #[inline(always)]
    pub const fn creates_comm(self) -> bool {
        matches!(self, ByteRule::CommCreate | ByteRule::CommDup)
    }

    /// Whether argument `a` points at a handle that the call resets (MPI_Type_free,
    /// MPI_Comm_free, MPI_Request_free): it is read, and what it stood for forgotten, at
    /// entry.
    #[inline(always)]
    pub const fn frees_handle(self) -> bool {
        matches!(
            self,
            ByteRule::TypeFree | ByteRule::CommFree | ByteRule::RequestFree
        )
    }

    /// The rule of the large-count (`_c`) form of a routine of this rule: its counts are
    /// 64-bit `MPI_Count`s where this rule's are `int`s. Panics (at compile time, where the
    /// table is built) for a rule that has none.
    pub const fn large_count(self) -> ByteRule {
        match self {
            ByteRule::None => ByteRule::None,
            ByteRule::AintArg => ByteRule::AintArg,
            ByteRule::CountType | ByteRule::LargeCountType => ByteRule::LargeCountType,
            ByteRule::RecvStatus => ByteRule::LargeRecvStatus,
            ByteRule::RecvPosted => ByteRule::LargeRecvPosted,
            ByteRule::Pair => ByteRule::LargePair,
            ByteRule::PairPosted => ByteRule::LargePairPosted,
            ByteRule::SumCounts => ByteRule::LargeSumCounts,
            ByteRule::SumCountsPerPeer => ByteRule::LargeSumCountsPerPeer,
            ByteRule::CountAtRank => ByteRule::LargeCountAtRank,
            ByteRule::SumCountsTypesPerPeer => ByteRule::LargeSumCountsTypesPerPeer,
            ByteRule::CtorProduct => ByteRule::LargeCtorProduct,
            ByteRule::CtorSum => ByteRule::LargeCtorSum,
            ByteRule::CtorStruct => ByteRule::LargeCtorStruct,
            ByteRule::CtorProdArray => ByteRule::LargeCtorProdArray,
            ByteRule::CtorDarray => ByteRule::LargeCtorDarray,
            _ => panic!("no large-count form of this byte rule"),
        }
    }

    /// The rule with this id (unknown ids decode as `None`).
    #[inline(always)]
    pub const fn from_u8(v: u8) -> ByteRule {
        match v {
            1 => ByteRule::CountType,
            2 => ByteRule::RecvStatus,
            3 => ByteRule::Pair,
            4 => ByteRule::SumCounts,
            5 => ByteRule::SumCountsPerPeer,
            6 => ByteRule::CountAtRank,
            7 => ByteRule::CountTypeTimesP,
            8 => ByteRule::SumCountsTypesPerPeer,
            16 => ByteRule::CtorProduct,
            17 => ByteRule::CtorSum,
            18 => ByteRule::CtorStruct,
            19 => ByteRule::CtorProdArray,
            20 => ByteRule::TypeFree,
            21 => ByteRule::CommSize,
            22 => ByteRule::CommRank,
            23 => ByteRule::CommFree,
            24 => ByteRule::NcclCommInit,
            25 => ByteRule::NcclCommInitAll,
            26 => ByteRule::NcclCommSplit,
            27 => ByteRule::NcclCommFree,
            28 => ByteRule::GroupStart,
            29 => ByteRule::GroupEnd,
            30 => ByteRule::GroupSpan,
            31 => ByteRule::DeviceSync,
            32 => ByteRule::FabricLen,
            33 => ByteRule::FabricIov,
            34 => ByteRule::FabricMsg,
            35 => ByteRule::NetIsend,
            36 => ByteRule::NetIrecv,
            37 => ByteRule::CommCreate,
            38 => ByteRule::CommDup,
            39 => ByteRule::RecvPosted,
            40 => ByteRule::LargeCountType,
            41 => ByteRule::LargeRecvPosted,
            42 => ByteRule::LargeRecvStatus,
            43 => ByteRule::LargePair,
            44 => ByteRule::Start,
            45 => ByteRule::StartAll,
            46 => ByteRule::PairPosted,
            47 => ByteRule::LargePairPosted,
            48 => ByteRule::Partitioned,
            49 => ByteRule::PartitionedRecv,
            50 => ByteRule::AintArg,
            51 => ByteRule::LargeSumCounts,
            52 => ByteRule::LargeSumCountsPerPeer,
            53 => ByteRule::LargeCountAtRank,
            54 => ByteRule::LargeSumCountsTypesPerPeer,
            55 => ByteRule::LargeCtorProduct,
            56 => ByteRule::LargeCtorSum,
            57 => ByteRule::LargeCtorStruct,
            58 => ByteRule::LargeCtorProdArray,
            59 => ByteRule::CtorDarray,
            60 => ByteRule::LargeCtorDarray,
            61 => ByteRule::UcxParam,
            62 => ByteRule::UcxDatatype,
            63 => ByteRule::UcxLen,
            64 => ByteRule::RequestFree,
            65 => ByteRule::Completes,
            66 => ByteRule::MayComplete,
            67 => ByteRule::CompletesOne,
            68 => ByteRule::CompletesSome,
            _ => ByteRule::None,
        }
    }
}

/// Routine classes, for reports and for Init/Finalize bookkeeping.
pub mod class {
    /// Point-to-point (including probes and persistent requests).
    pub const P2P: u8 = 1;
    /// Completion of nonblocking requests (Wait*, Test*).
    pub const COMPLETION: u8 = 2;
    /// Collective (blocking or nonblocking).
    pub const COLLECTIVE: u8 = 3;
    /// One-sided (RMA) data movement and synchronisation.
    pub const ONE_SIDED: u8 = 4;
    /// Communicator queries and management.
    pub const COMM: u8 = 5;
    /// Datatype construction.
    pub const DATATYPE: u8 = 6;
    /// MPI_Init / MPI_Init_thread.
    pub const INIT: u8 = 7;
    /// MPI_Finalize.
    pub const FINALIZE: u8 = 8;
    /// NCCL group calls and completed groups.
    pub const GROUP: u8 = 9;
    /// Host-side waits for the GPU.
    pub const SYNC: u8 = 10;
    /// libfabric data-path operations (ops-table functions).
    pub const FABRIC: u8 = 11;
    /// NCCL's network transport (its proxy thread's sends and receives on a network).
    pub const NET: u8 = 12;
    /// MPI-IO (`MPI_File_*`).
    pub const IO: u8 = 13;
    /// Persistent requests' creation (`MPI_Send_init`, `MPI_Allreduce_init` ...): bytes as
    /// mpitrace counts them, at the creation; the new request is `*d` (a point-to-point
    /// one's peer is argument `c`), and each of its starts moves the data.
    pub const PERSISTENT: u8 = 14;
    /// Calls that move nothing and belong to no other class (`MPI_Pcontrol`, and every
    /// routine counted with its calls and time only).
    pub const OTHER: u8 = 15;
}

/// Which library family a routine belongs to (and which libraries are searched for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `MPI_*`, probed in MPI libraries.
    Mpi,
    /// `nccl*`, probed in NCCL/RCCL libraries or wherever NCCL is linked in.
    Nccl,
    /// CUDA's host-side synchronisation (`cuda*` runtime, `cu*` driver), probed in the
    /// CUDA runtime or driver library, or wherever the runtime is linked in.
    Cuda,
    /// libfabric's data path (`fi_msg_send` for `ep->msg->send` ...), probed through the
    /// provider ops tables of libfabric libraries.
    Fabric,
}

/// Where a routine's arguments are and how its bytes are computed (read by the BPF programs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgSpec {
    /// A [`ByteRule`] as `u8`.
    pub rule: u8,
    /// Rule operand (argument index, 0-based) or [`NO_ARG`].
    pub a: u8,
    /// Rule operand.
    pub b: u8,
    /// Rule operand.
    pub c: u8,
    /// Rule operand.
    pub d: u8,
    /// Argument index of the communicator, or [`NO_ARG`].
    pub comm: u8,
    /// Argument index of the peer rank (dest, source, root, target), or [`NO_ARG`].
    pub peer: u8,
    /// One of [`class`].
    pub class: u8,
}
const _: () = assert!(size_of::<ArgSpec>() == 8);

impl ArgSpec {
    /// Whether who-is-late needs an event for the call: a collective, a communicator
    /// constructor (it names a communicator), or `MPI_Init` (after which a process's count
    /// of world collectives is the instance number).
    #[inline(always)]
    pub const fn matters_for_skew(&self) -> bool {
        self.class == class::COLLECTIVE
            || self.class == class::INIT
            || ByteRule::from_u8(self.rule).creates_comm()
    }

    /// Whether some of its calls' time may be sampled: [`ArgSpec::time_can_be_sampled`]
    /// routines, and receives whose status is `MPI_STATUS_IGNORE` (the kernel decides per
    /// call: see [`ArgSpec::sampled_when_status_ignored`]).
    #[inline(always)]
    pub const fn time_may_be_sampled(&self) -> bool {
        self.time_can_be_sampled() || self.sampled_when_status_ignored()
    }

    /// Whether a call with `MPI_STATUS_IGNORE` may go untimed: a blocking receive whose
    /// status is ignored counts its posted size, known at entry, and its return teaches
    /// nothing (with a status, the bytes and a wildcard's source are read from it at return).
    #[inline(always)]
    pub const fn sampled_when_status_ignored(&self) -> bool {
        self.class == class::P2P
            && (self.rule == ByteRule::RecvStatus as u8
                || self.rule == ByteRule::LargeRecvStatus as u8)
    }

    /// Whether a call's time may be sampled: an MPI routine whose bytes are known from its
    /// arguments at entry and whose return teaches nothing (no status, no new handle), so
    /// that a call left untimed is counted whole at its entry and its return never runs.
    /// Where the return teaches something in one ABI only (MPICH-ABI libraries learn
    /// communicator sizes and ranks at `MPI_Comm_size`/`MPI_Comm_rank`'s return), the
    /// kernel keeps that ABI's calls timed until the fact is learnt.
    #[inline(always)]
    pub const fn time_can_be_sampled(&self) -> bool {
        use ByteRule as B;
        // A UCX operation's bytes are in its arguments, and its return teaches nothing.
        if matches!(
            ByteRule::from_u8(self.rule),
            B::UcxParam | B::UcxDatatype | B::UcxLen
        ) {
            return true;
        }
        matches!(
            self.class,
            class::P2P
                | class::COMPLETION
                | class::COLLECTIVE
                | class::ONE_SIDED
                | class::COMM
                | class::OTHER
        ) && matches!(
            ByteRule::from_u8(self.rule),
            B::None
                | B::CountType
                | B::RecvPosted
                | B::LargeRecvPosted
                | B::SumCounts
                | B::SumCountsPerPeer
                | B::CountAtRank
                | B::CountTypeTimesP
                | B::LargeCountType
                | B::SumCountsTypesPerPeer
                | B::CommSize
                | B::CommRank
                | B::Start
                | B::StartAll
                // The request is read and forgotten at the entry: the return has nothing
                // left to do.
                | B::RequestFree
                // Requests are read at the entry, and only for a timed call.
                | B::Completes
                | B::MayComplete
                | B::CompletesOne
                | B::CompletesSome
        )
    }
}

/// One probed routine: its C name and its argument spec.
#[derive(Clone, Copy, Debug)]
pub struct Routine {
    /// C entry point name (`MPI_Send`, `ncclAllReduce`); the `PMPI_` / `pnccl` aliases
    /// share its address.
    pub name: &'static str,
    /// Argument positions and byte rule.
    pub spec: ArgSpec,
}

impl Routine {
    /// The library family the routine belongs to.
    pub const fn family(&self) -> Family {
        match self.name.as_bytes() {
            [b'n', b'c', b'c', b'l', ..] => Family::Nccl,
            [b'c', b'u', ..] => Family::Cuda,
            // UCX's data path is a transport's, as libfabric's: counted the same way.
            [b'f', b'i', b'_', ..] | [b'u', b'c', b'p', b'_', ..] => Family::Fabric,
            _ => Family::Mpi,
        }
    }

    /// Whether the routine is a function in a library (not a span commtap derives, like a
    /// completed NCCL group).
    pub const fn is_probed(&self) -> bool {
        self.spec.rule != ByteRule::GroupSpan as u8
    }
}

const N: u8 = NO_ARG;

const fn r(
    name: &'static str,
    class: u8,
    rule: ByteRule,
    abcd: [u8; 4],
    comm: u8,
    peer: u8,
) -> Routine {
    Routine {
        name,
        spec: ArgSpec {
            rule: rule as u8,
            a: abcd[0],
            b: abcd[1],
            c: abcd[2],
            d: abcd[3],
            comm,
            peer,
            class,
        },
    }
}

/// A persistent collective's creation: `rule` over arguments `ab` of the blocking routine
/// whose arguments it takes, then (info, request): the request is argument `comm + 2`.
const fn pinit(name: &'static str, rule: ByteRule, ab: [u8; 2], comm: u8) -> Routine {
    r(
        name,
        class::PERSISTENT,
        rule,
        [ab[0], ab[1], N, comm + 2],
        comm,
        N,
    )
}

use class::{
    COLLECTIVE, COMM, COMPLETION, DATATYPE, FABRIC, FINALIZE, GROUP, INIT, IO, NET, ONE_SIDED,
    OTHER, P2P, PERSISTENT, SYNC,
};
use ByteRule as B;

/// Every routine commtap probes: those listed, then the large-count forms, then every
/// other. Index = routine id, which a daemon's pinned counters keep across restarts and
/// upgrades: the lists are append only, and a routine added to one would move the ids of
/// those after it (add a list after them, or change the pinned layout's tag).
pub const ROUTINES: &[Routine] = &ALL_ROUTINES;

#[expect(
    clippy::large_const_arrays,
    reason = "built and read at compile time (`routine_index`), and only through `ROUTINES`, \
              a reference: one copy"
)]
const ALL_ROUTINES: [Routine; LISTED_ROUTINES.len() + LARGE_COUNT.len() + EVERY_OTHER.len()] = {
    let mut all =
        [LISTED_ROUTINES[0]; LISTED_ROUTINES.len() + LARGE_COUNT.len() + EVERY_OTHER.len()];
    let mut i = 0;
    while i < LISTED_ROUTINES.len() {
        all[i] = LISTED_ROUTINES[i];
        i += 1;
    }
    let mut k = 0;
    while k < LARGE_COUNT.len() {
        all[i] = large_count_form(LARGE_COUNT[k]);
        i += 1;
        k += 1;
    }
    k = 0;
    while k < EVERY_OTHER.len() {
        all[i] = EVERY_OTHER[k];
        i += 1;
        k += 1;
    }
    all
};

/// Every other routine of the MPI standard (MPI-1 to MPI-5) that an MPI here exports (Open
/// MPI 4.1 and 5.0, MPICH 4.0 and 5.0 with its standard ABI, Intel MPI 2021), so that the
/// flat profile holds every call the application makes and a call a library makes inside
/// one of them is nested, not the application's. Counted with their calls and time; they
/// move nothing (no bytes), but for `MPI_Rget_accumulate`, whose origin buffer is counted
/// as `MPI_Get_accumulate`'s, and `MPI_Type_create_darray(_c)`, a datatype constructor.
/// Not probed: the timers (`MPI_Wtime`, `MPI_Wtick`: called in the hottest loops, in tens
/// of nanoseconds), handle conversions (`MPI_Comm_f2c`,
/// `MPI_Type_c2f`, `MPI_Comm_toint` ...: Fortran and Python bindings make them around
/// their calls), the tool interface (`MPI_T_*`: a tool's, not the application's), and the
/// predefined callbacks (`MPI_COMM_DUP_FN` ...: the library calls them). Append only.
const EVERY_OTHER: &[Routine] = &[
    // (oaddr, ocount, otype, raddr, rcount, rtype, target, ...): as MPI_Get_accumulate.
    r(
        "MPI_Rget_accumulate",
        ONE_SIDED,
        B::CountType,
        [1, 2, N, N],
        N,
        6,
    ),
    r(
        "MPI_Rget_accumulate_c",
        ONE_SIDED,
        B::LargeCountType,
        [1, 2, N, N],
        N,
        6,
    ),
    calls_only("MPI_Abi_get_fortran_booleans"),
    calls_only("MPI_Abi_get_fortran_info"),
    calls_only("MPI_Abi_get_info"),
    calls_only("MPI_Abi_get_version"),
    calls_only("MPI_Abi_set_fortran_booleans"),
    calls_only("MPI_Abi_set_fortran_info"),
    calls_only("MPI_Abort"),
    calls_only("MPI_Add_error_class"),
    calls_only("MPI_Add_error_code"),
    calls_only("MPI_Add_error_string"),
    calls_only("MPI_Address"),
    calls_only("MPI_Aint_add"),
    calls_only("MPI_Aint_diff"),
    calls_only("MPI_Alloc_mem"),
    calls_only("MPI_Attr_delete"),
    calls_only("MPI_Attr_get"),
    calls_only("MPI_Attr_put"),
    calls_only("MPI_Buffer_attach"),
    calls_only("MPI_Buffer_attach_c"),
    calls_only("MPI_Buffer_detach"),
    calls_only("MPI_Buffer_detach_c"),
    calls_only("MPI_Buffer_flush"),
    calls_only("MPI_Buffer_iflush"),
    calls_only("MPI_Cart_coords"),
    calls_only("MPI_Cart_get"),
    calls_only("MPI_Cart_map"),
    calls_only("MPI_Cart_rank"),
    calls_only("MPI_Cart_shift"),
    calls_only("MPI_Cart_sub"),
    calls_only("MPI_Cartdim_get"),
    calls_only("MPI_Close_port"),
    calls_only("MPI_Comm_accept"),
    calls_only("MPI_Comm_attach_buffer"),
    calls_only("MPI_Comm_attach_buffer_c"),
    calls_only("MPI_Comm_call_errhandler"),
    calls_only("MPI_Comm_compare"),
    calls_only("MPI_Comm_connect"),
    calls_only("MPI_Comm_create_errhandler"),
    calls_only("MPI_Comm_create_from_group"),
    calls_only("MPI_Comm_create_group"),
    calls_only("MPI_Comm_create_keyval"),
    calls_only("MPI_Comm_delete_attr"),
    calls_only("MPI_Comm_detach_buffer"),
    calls_only("MPI_Comm_detach_buffer_c"),
    calls_only("MPI_Comm_disconnect"),
    calls_only("MPI_Comm_dup_with_info"),
    calls_only("MPI_Comm_flush_buffer"),
    calls_only("MPI_Comm_free_keyval"),
    calls_only("MPI_Comm_get_attr"),
    calls_only("MPI_Comm_get_errhandler"),
    calls_only("MPI_Comm_get_info"),
    calls_only("MPI_Comm_get_name"),
    calls_only("MPI_Comm_get_parent"),
    calls_only("MPI_Comm_group"),
    calls_only("MPI_Comm_idup"),
    calls_only("MPI_Comm_idup_with_info"),
    calls_only("MPI_Comm_iflush_buffer"),
    calls_only("MPI_Comm_join"),
    calls_only("MPI_Comm_remote_group"),
    calls_only("MPI_Comm_remote_size"),
    calls_only("MPI_Comm_set_attr"),
    calls_only("MPI_Comm_set_errhandler"),
    calls_only("MPI_Comm_set_info"),
    calls_only("MPI_Comm_set_name"),
    calls_only("MPI_Comm_spawn"),
    calls_only("MPI_Comm_spawn_multiple"),
    calls_only("MPI_Comm_test_inter"),
    calls_only("MPI_Dims_create"),
    calls_only("MPI_Dist_graph_create"),
    calls_only("MPI_Dist_graph_create_adjacent"),
    calls_only("MPI_Dist_graph_neighbors"),
    calls_only("MPI_Dist_graph_neighbors_count"),
    calls_only("MPI_Errhandler_create"),
    calls_only("MPI_Errhandler_free"),
    calls_only("MPI_Errhandler_get"),
    calls_only("MPI_Errhandler_set"),
    calls_only("MPI_Error_class"),
    calls_only("MPI_Error_string"),
    calls_only("MPI_File_call_errhandler"),
    calls_only("MPI_File_create_errhandler"),
    calls_only("MPI_File_get_amode"),
    calls_only("MPI_File_get_atomicity"),
    calls_only("MPI_File_get_byte_offset"),
    calls_only("MPI_File_get_errhandler"),
    calls_only("MPI_File_get_group"),
    calls_only("MPI_File_get_info"),
    calls_only("MPI_File_get_position_shared"),
    calls_only("MPI_File_get_type_extent"),
    calls_only("MPI_File_get_type_extent_c"),
    calls_only("MPI_File_read_ordered_begin"),
    calls_only("MPI_File_read_ordered_begin_c"),
    calls_only("MPI_File_read_ordered_end"),
    calls_only("MPI_File_set_errhandler"),
    calls_only("MPI_File_write_ordered_begin"),
    calls_only("MPI_File_write_ordered_begin_c"),
    calls_only("MPI_File_write_ordered_end"),
    calls_only("MPI_Finalized"),
    calls_only("MPI_Free_mem"),
    calls_only("MPI_Get_address"),
    calls_only("MPI_Get_count"),
    calls_only("MPI_Get_count_c"),
    calls_only("MPI_Get_elements"),
    calls_only("MPI_Get_elements_c"),
    calls_only("MPI_Get_elements_x"),
    calls_only("MPI_Get_hw_resource_info"),
    calls_only("MPI_Get_library_version"),
    calls_only("MPI_Get_processor_name"),
    calls_only("MPI_Get_version"),
    calls_only("MPI_Graph_create"),
    calls_only("MPI_Graph_get"),
    calls_only("MPI_Graph_map"),
    calls_only("MPI_Graph_neighbors"),
    calls_only("MPI_Graph_neighbors_count"),
    calls_only("MPI_Graphdims_get"),
    calls_only("MPI_Grequest_complete"),
    calls_only("MPI_Grequest_start"),
    calls_only("MPI_Group_compare"),
    calls_only("MPI_Group_difference"),
    calls_only("MPI_Group_excl"),
    calls_only("MPI_Group_free"),
    calls_only("MPI_Group_from_session_pset"),
    calls_only("MPI_Group_incl"),
    calls_only("MPI_Group_intersection"),
    calls_only("MPI_Group_range_excl"),
    calls_only("MPI_Group_range_incl"),
    calls_only("MPI_Group_rank"),
    calls_only("MPI_Group_size"),
    calls_only("MPI_Group_translate_ranks"),
    calls_only("MPI_Group_union"),
    calls_only("MPI_Info_create"),
    calls_only("MPI_Info_create_env"),
    calls_only("MPI_Info_delete"),
    calls_only("MPI_Info_dup"),
    calls_only("MPI_Info_free"),
    calls_only("MPI_Info_get"),
    calls_only("MPI_Info_get_nkeys"),
    calls_only("MPI_Info_get_nthkey"),
    calls_only("MPI_Info_get_string"),
    calls_only("MPI_Info_get_valuelen"),
    calls_only("MPI_Info_set"),
    calls_only("MPI_Initialized"),
    calls_only("MPI_Intercomm_create"),
    calls_only("MPI_Intercomm_create_from_groups"),
    calls_only("MPI_Intercomm_merge"),
    calls_only("MPI_Is_thread_main"),
    calls_only("MPI_Keyval_create"),
    calls_only("MPI_Keyval_free"),
    calls_only("MPI_Lookup_name"),
    calls_only("MPI_Op_commutative"),
    calls_only("MPI_Op_create"),
    calls_only("MPI_Op_create_c"),
    calls_only("MPI_Op_free"),
    calls_only("MPI_Open_port"),
    calls_only("MPI_Pack"),
    calls_only("MPI_Pack_c"),
    calls_only("MPI_Pack_external"),
    calls_only("MPI_Pack_external_c"),
    calls_only("MPI_Pack_external_size"),
    calls_only("MPI_Pack_external_size_c"),
    calls_only("MPI_Pack_size"),
    calls_only("MPI_Pack_size_c"),
    calls_only("MPI_Publish_name"),
    calls_only("MPI_Query_thread"),
    calls_only("MPI_Reduce_local"),
    calls_only("MPI_Reduce_local_c"),
    calls_only("MPI_Register_datarep"),
    calls_only("MPI_Register_datarep_c"),
    calls_only("MPI_Remove_error_class"),
    calls_only("MPI_Remove_error_code"),
    calls_only("MPI_Remove_error_string"),
    calls_only("MPI_Request_get_status"),
    calls_only("MPI_Request_get_status_all"),
    calls_only("MPI_Request_get_status_any"),
    calls_only("MPI_Request_get_status_some"),
    calls_only("MPI_Session_attach_buffer"),
    calls_only("MPI_Session_attach_buffer_c"),
    calls_only("MPI_Session_call_errhandler"),
    calls_only("MPI_Session_create_errhandler"),
    calls_only("MPI_Session_detach_buffer"),
    calls_only("MPI_Session_detach_buffer_c"),
    calls_only("MPI_Session_finalize"),
    calls_only("MPI_Session_flush_buffer"),
    calls_only("MPI_Session_get_errhandler"),
    calls_only("MPI_Session_get_info"),
    calls_only("MPI_Session_get_nth_pset"),
    calls_only("MPI_Session_get_num_psets"),
    calls_only("MPI_Session_get_pset_info"),
    calls_only("MPI_Session_iflush_buffer"),
    calls_only("MPI_Session_init"),
    calls_only("MPI_Session_set_errhandler"),
    calls_only("MPI_Session_set_info"),
    calls_only("MPI_Status_f2f08"),
    calls_only("MPI_Status_get_error"),
    calls_only("MPI_Status_get_source"),
    calls_only("MPI_Status_get_tag"),
    calls_only("MPI_Status_set_cancelled"),
    calls_only("MPI_Status_set_elements"),
    calls_only("MPI_Status_set_elements_c"),
    calls_only("MPI_Status_set_elements_x"),
    calls_only("MPI_Status_set_error"),
    calls_only("MPI_Status_set_source"),
    calls_only("MPI_Status_set_tag"),
    calls_only("MPI_Test_cancelled"),
    calls_only("MPI_Topo_test"),
    // (size, rank, ndims, gsizes[], distribs[], dargs[], psizes[], order, oldtype,
    // *newtype): its size learnt as the other constructors' (Open MPI reads it from the
    // type).
    r(
        "MPI_Type_create_darray",
        DATATYPE,
        B::CtorDarray,
        [2, 8, 3, 9],
        N,
        N,
    ),
    r(
        "MPI_Type_create_darray_c",
        DATATYPE,
        B::LargeCtorDarray,
        [2, 8, 3, 9],
        N,
        N,
    ),
    calls_only("MPI_Type_create_f90_complex"),
    calls_only("MPI_Type_create_f90_integer"),
    calls_only("MPI_Type_create_f90_real"),
    calls_only("MPI_Type_create_keyval"),
    calls_only("MPI_Type_delete_attr"),
    calls_only("MPI_Type_extent"),
    calls_only("MPI_Type_free_keyval"),
    calls_only("MPI_Type_get_attr"),
    calls_only("MPI_Type_get_contents"),
    calls_only("MPI_Type_get_contents_c"),
    calls_only("MPI_Type_get_envelope"),
    calls_only("MPI_Type_get_envelope_c"),
    calls_only("MPI_Type_get_extent"),
    calls_only("MPI_Type_get_extent_c"),
    calls_only("MPI_Type_get_extent_x"),
    calls_only("MPI_Type_get_name"),
    calls_only("MPI_Type_get_true_extent"),
    calls_only("MPI_Type_get_true_extent_c"),
    calls_only("MPI_Type_get_true_extent_x"),
    calls_only("MPI_Type_get_value_index"),
    calls_only("MPI_Type_hindexed"),
    calls_only("MPI_Type_lb"),
    calls_only("MPI_Type_match_size"),
    calls_only("MPI_Type_set_attr"),
    calls_only("MPI_Type_set_name"),
    calls_only("MPI_Type_size"),
    calls_only("MPI_Type_size_c"),
    calls_only("MPI_Type_size_x"),
    calls_only("MPI_Type_struct"),
    calls_only("MPI_Type_ub"),
    calls_only("MPI_Unpack"),
    calls_only("MPI_Unpack_c"),
    calls_only("MPI_Unpack_external"),
    calls_only("MPI_Unpack_external_c"),
    calls_only("MPI_Unpublish_name"),
    calls_only("MPI_Win_attach"),
    calls_only("MPI_Win_call_errhandler"),
    calls_only("MPI_Win_create_errhandler"),
    calls_only("MPI_Win_create_keyval"),
    calls_only("MPI_Win_delete_attr"),
    calls_only("MPI_Win_detach"),
    calls_only("MPI_Win_free_keyval"),
    calls_only("MPI_Win_get_attr"),
    calls_only("MPI_Win_get_errhandler"),
    calls_only("MPI_Win_get_group"),
    calls_only("MPI_Win_get_info"),
    calls_only("MPI_Win_get_name"),
    calls_only("MPI_Win_set_attr"),
    calls_only("MPI_Win_set_errhandler"),
    calls_only("MPI_Win_set_info"),
    calls_only("MPI_Win_set_name"),
    calls_only("MPI_Win_shared_query"),
    calls_only("MPI_Win_shared_query_c"),
    calls_only("MPI_Win_sync"),
    calls_only("MPI_Win_test"),
];

/// A routine counted with its calls and time only.
const fn calls_only(name: &'static str) -> Routine {
    r(name, OTHER, B::None, [N; 4], N, N)
}

/// The large-count form `name` (`MPI_Igather_c`) of the listed routine without its `_c`:
/// the same arguments at the same places, its counts `MPI_Count`s and its displacements
/// `MPI_Aint`s (MPI-4, section 5.2.1), so the same spec with the rule's large-count form.
const fn large_count_form(name: &'static str) -> Routine {
    let (base, suffix) = name.as_bytes().split_at(name.len() - 2);
    assert!(
        const_eq(suffix, b"_c"),
        "a large-count routine's name ends in _c"
    );
    let mut i = 0;
    while i < LISTED_ROUTINES.len() {
        let r = LISTED_ROUTINES[i];
        if const_eq(r.name.as_bytes(), base) {
            let mut spec = r.spec;
            spec.rule = ByteRule::from_u8(spec.rule).large_count() as u8;
            return Routine { name, spec };
        }
        i += 1;
    }
    panic!("a large-count routine whose base routine is not listed")
}

/// MPI-4's large-count routines (MPICH 4 and 5 export them) beyond those listed with
/// their own spec: each counted as its own routine, by its base routine's rule over its
/// 64-bit counts (a datatype constructor's: the size of the type it makes). Append only.
const LARGE_COUNT: &[&str] = &[
    "MPI_Accumulate_c",
    "MPI_Allgather_init_c",
    "MPI_Allgatherv_c",
    "MPI_Allgatherv_init_c",
    "MPI_Allreduce_init_c",
    "MPI_Alltoall_init_c",
    "MPI_Alltoallv_c",
    "MPI_Alltoallv_init_c",
    "MPI_Alltoallw_c",
    "MPI_Alltoallw_init_c",
    "MPI_Bcast_init_c",
    "MPI_Bsend_init_c",
    "MPI_Exscan_init_c",
    "MPI_File_iread_all_c",
    "MPI_File_iread_at_all_c",
    "MPI_File_iread_at_c",
    "MPI_File_iread_c",
    "MPI_File_iread_shared_c",
    "MPI_File_iwrite_all_c",
    "MPI_File_iwrite_at_all_c",
    "MPI_File_iwrite_at_c",
    "MPI_File_iwrite_c",
    "MPI_File_iwrite_shared_c",
    "MPI_File_read_all_begin_c",
    "MPI_File_read_all_c",
    "MPI_File_read_at_all_begin_c",
    "MPI_File_read_at_all_c",
    "MPI_File_read_at_c",
    "MPI_File_read_c",
    "MPI_File_read_ordered_c",
    "MPI_File_read_shared_c",
    "MPI_File_write_all_begin_c",
    "MPI_File_write_all_c",
    "MPI_File_write_at_all_begin_c",
    "MPI_File_write_at_all_c",
    "MPI_File_write_at_c",
    "MPI_File_write_c",
    "MPI_File_write_ordered_c",
    "MPI_File_write_shared_c",
    "MPI_Gather_init_c",
    "MPI_Gatherv_c",
    "MPI_Gatherv_init_c",
    "MPI_Get_accumulate_c",
    "MPI_Get_c",
    "MPI_Iallgather_c",
    "MPI_Iallgatherv_c",
    "MPI_Ialltoall_c",
    "MPI_Ialltoallv_c",
    "MPI_Ialltoallw_c",
    "MPI_Iexscan_c",
    "MPI_Igather_c",
    "MPI_Igatherv_c",
    "MPI_Imrecv_c",
    "MPI_Ineighbor_allgather_c",
    "MPI_Ineighbor_allgatherv_c",
    "MPI_Ineighbor_alltoall_c",
    "MPI_Ineighbor_alltoallv_c",
    "MPI_Ineighbor_alltoallw_c",
    "MPI_Ireduce_c",
    "MPI_Ireduce_scatter_block_c",
    "MPI_Ireduce_scatter_c",
    "MPI_Iscan_c",
    "MPI_Iscatter_c",
    "MPI_Iscatterv_c",
    "MPI_Mrecv_c",
    "MPI_Neighbor_allgather_c",
    "MPI_Neighbor_allgather_init_c",
    "MPI_Neighbor_allgatherv_c",
    "MPI_Neighbor_allgatherv_init_c",
    "MPI_Neighbor_alltoall_c",
    "MPI_Neighbor_alltoall_init_c",
    "MPI_Neighbor_alltoallv_c",
    "MPI_Neighbor_alltoallv_init_c",
    "MPI_Neighbor_alltoallw_c",
    "MPI_Neighbor_alltoallw_init_c",
    "MPI_Put_c",
    "MPI_Raccumulate_c",
    "MPI_Recv_init_c",
    "MPI_Reduce_init_c",
    "MPI_Reduce_scatter_block_c",
    "MPI_Reduce_scatter_block_init_c",
    "MPI_Reduce_scatter_c",
    "MPI_Reduce_scatter_init_c",
    "MPI_Rget_c",
    "MPI_Rput_c",
    "MPI_Rsend_init_c",
    "MPI_Scan_init_c",
    "MPI_Scatter_init_c",
    "MPI_Scatterv_c",
    "MPI_Scatterv_init_c",
    "MPI_Send_init_c",
    "MPI_Ssend_init_c",
    "MPI_Win_allocate_c",
    "MPI_Win_allocate_shared_c",
    "MPI_Win_create_c",
    "MPI_Type_contiguous_c",
    "MPI_Type_vector_c",
    "MPI_Type_create_hvector_c",
    "MPI_Type_indexed_c",
    "MPI_Type_create_hindexed_c",
    "MPI_Type_create_indexed_block_c",
    "MPI_Type_create_hindexed_block_c",
    "MPI_Type_create_struct_c",
    "MPI_Type_create_resized_c",
    "MPI_Type_create_subarray_c",
];

/// The routines listed with their own spec. Index = routine id (see [`ROUTINES`]).
const LISTED_ROUTINES: &[Routine] = &[
    // Environment.
    r("MPI_Init", INIT, B::None, [N; 4], N, N),
    r("MPI_Init_thread", INIT, B::None, [N; 4], N, N),
    r("MPI_Finalize", FINALIZE, B::None, [N; 4], N, N),
    r("MPI_Comm_rank", COMM, B::CommRank, [0, N, N, 1], 0, N),
    r("MPI_Comm_size", COMM, B::CommSize, [0, N, N, 1], 0, N),
    // Blocking point-to-point: (buf, count, type, peer, tag, comm[, status]).
    r("MPI_Send", P2P, B::CountType, [1, 2, N, N], 5, 3),
    r("MPI_Bsend", P2P, B::CountType, [1, 2, N, N], 5, 3),
    r("MPI_Ssend", P2P, B::CountType, [1, 2, N, N], 5, 3),
    r("MPI_Rsend", P2P, B::CountType, [1, 2, N, N], 5, 3),
    r("MPI_Recv", P2P, B::RecvStatus, [1, 2, 6, N], 5, 3),
    // Nonblocking point-to-point: bytes belong to the post.
    r("MPI_Isend", P2P, B::CountType, [1, 2, N, N], 5, 3),
    r("MPI_Ibsend", P2P, B::CountType, [1, 2, N, N], 5, 3),
    r("MPI_Issend", P2P, B::CountType, [1, 2, N, N], 5, 3),
    r("MPI_Irsend", P2P, B::CountType, [1, 2, N, N], 5, 3),
    // Its request `*d` is followed to the wait that completes it (`B::Completes`).
    r("MPI_Irecv", P2P, B::RecvPosted, [1, 2, N, 6], 5, 3),
    // (sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, source, rtag, comm, status)
    r("MPI_Sendrecv", P2P, B::Pair, [1, 2, 6, 7], 10, 3),
    // (buf, count, type, dest, stag, source, rtag, comm, status): sent and received.
    r("MPI_Sendrecv_replace", P2P, B::Pair, [1, 2, 1, 2], 7, 3),
    // Probes: (source, tag, comm, ...).
    r("MPI_Probe", P2P, B::None, [N; 4], 2, 0),
    r("MPI_Iprobe", P2P, B::None, [N; 4], 2, 0),
    r("MPI_Mprobe", P2P, B::None, [N; 4], 2, 0),
    r("MPI_Improbe", P2P, B::None, [N; 4], 2, 0),
    // (buf, count, type, message, status) / (buf, count, type, message, request)
    r("MPI_Mrecv", P2P, B::RecvStatus, [1, 2, 4, N], N, N),
    r("MPI_Imrecv", P2P, B::CountType, [1, 2, N, N], N, N),
    // Persistent requests (buf, count, type, peer, tag, comm, request): bytes as mpitrace
    // counts them, at the creation, and the request learnt (`c` the peer, `d` the request);
    // each start moves them again, to or from that peer. The creation's event names its
    // channel (peer and tag), on which a timeline then numbers no message: the starts
    // name none.
    r(
        "MPI_Send_init",
        PERSISTENT,
        B::CountType,
        [1, 2, 3, 6],
        5,
        3,
    ),
    r(
        "MPI_Recv_init",
        PERSISTENT,
        B::RecvPosted,
        [1, 2, 3, 6],
        5,
        3,
    ),
    r("MPI_Start", P2P, B::Start, [0, N, N, N], N, N),
    r("MPI_Startall", P2P, B::StartAll, [0, 1, N, N], N, N),
    // Completion.
    // (request*, status) / (count, requests[], statuses)
    r("MPI_Wait", COMPLETION, B::Completes, [0, N, N, N], N, N),
    r("MPI_Waitall", COMPLETION, B::Completes, [0, 1, N, N], N, N),
    // (count, requests[], *index, status) / (incount, requests[], *outcount, indices[],
    // statuses)
    r(
        "MPI_Waitany",
        COMPLETION,
        B::CompletesOne,
        [0, 1, N, 2],
        N,
        N,
    ),
    r(
        "MPI_Waitsome",
        COMPLETION,
        B::CompletesSome,
        [0, 1, 2, 3],
        N,
        N,
    ),
    // (request*, *flag, status) / (count, requests[], *flag, statuses) / (count,
    // requests[], *index, *flag, status) / as MPI_Waitsome
    r("MPI_Test", COMPLETION, B::MayComplete, [0, N, 1, N], N, N),
    r(
        "MPI_Testall",
        COMPLETION,
        B::MayComplete,
        [0, 1, 2, N],
        N,
        N,
    ),
    r(
        "MPI_Testany",
        COMPLETION,
        B::CompletesOne,
        [0, 1, 3, 2],
        N,
        N,
    ),
    r(
        "MPI_Testsome",
        COMPLETION,
        B::CompletesSome,
        [0, 1, 2, 3],
        N,
        N,
    ),
    r(
        "MPI_Request_free",
        COMPLETION,
        B::RequestFree,
        [0, N, N, N],
        N,
        N,
    ),
    r("MPI_Cancel", COMPLETION, B::None, [N; 4], N, N),
    // Blocking collectives.
    r("MPI_Barrier", COLLECTIVE, B::None, [N; 4], 0, N),
    // (buf, count, type, root, comm)
    r("MPI_Bcast", COLLECTIVE, B::CountType, [1, 2, N, N], 4, 3),
    // (sbuf, rbuf, count, type, op, root, comm)
    r("MPI_Reduce", COLLECTIVE, B::CountType, [2, 3, N, N], 6, 5),
    // (sbuf, rbuf, count, type, op, comm)
    r(
        "MPI_Allreduce",
        COLLECTIVE,
        B::CountType,
        [2, 3, N, N],
        5,
        N,
    ),
    r(
        "MPI_Reduce_scatter",
        COLLECTIVE,
        B::SumCounts,
        [2, 3, N, N],
        5,
        N,
    ),
    r(
        "MPI_Reduce_scatter_block",
        COLLECTIVE,
        B::CountType,
        [2, 3, N, N],
        5,
        N,
    ),
    r("MPI_Scan", COLLECTIVE, B::CountType, [2, 3, N, N], 5, N),
    r("MPI_Exscan", COLLECTIVE, B::CountType, [2, 3, N, N], 5, N),
    // (sbuf, scount, stype, rbuf, rcount, rtype, root, comm): bytes sent by each rank.
    r("MPI_Gather", COLLECTIVE, B::CountType, [1, 2, N, N], 7, 6),
    // (sbuf, scount, stype, rbuf, rcounts, displs, rtype, root, comm)
    r("MPI_Gatherv", COLLECTIVE, B::CountType, [1, 2, N, N], 8, 7),
    // (sbuf, scount, stype, rbuf, rcount, rtype, root, comm): bytes received by each rank.
    r("MPI_Scatter", COLLECTIVE, B::CountType, [4, 5, N, N], 7, 6),
    // (sbuf, scounts, displs, stype, rbuf, rcount, rtype, root, comm)
    r("MPI_Scatterv", COLLECTIVE, B::CountType, [5, 6, N, N], 8, 7),
    // (sbuf, scount, stype, rbuf, rcount, rtype, comm)
    r(
        "MPI_Allgather",
        COLLECTIVE,
        B::CountType,
        [4, 5, N, N],
        6,
        N,
    ),
    // (sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm)
    r(
        "MPI_Allgatherv",
        COLLECTIVE,
        B::CountAtRank,
        [4, 6, N, N],
        7,
        N,
    ),
    // (sbuf, scount, stype, rbuf, rcount, rtype, comm): bytes per peer.
    r("MPI_Alltoall", COLLECTIVE, B::CountType, [1, 2, N, N], 6, N),
    // (sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm)
    r(
        "MPI_Alltoallv",
        COLLECTIVE,
        B::SumCountsPerPeer,
        [1, 3, N, N],
        8,
        N,
    ),
    // (sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm)
    r(
        "MPI_Alltoallw",
        COLLECTIVE,
        B::SumCountsTypesPerPeer,
        [1, 3, N, N],
        8,
        N,
    ),
    // Nonblocking collectives: counted at the start by the blocking rule.
    r("MPI_Ibarrier", COLLECTIVE, B::None, [N; 4], 0, N),
    r("MPI_Ibcast", COLLECTIVE, B::CountType, [1, 2, N, N], 4, 3),
    r("MPI_Ireduce", COLLECTIVE, B::CountType, [2, 3, N, N], 6, 5),
    r(
        "MPI_Iallreduce",
        COLLECTIVE,
        B::CountType,
        [2, 3, N, N],
        5,
        N,
    ),
    r(
        "MPI_Ireduce_scatter",
        COLLECTIVE,
        B::SumCounts,
        [2, 3, N, N],
        5,
        N,
    ),
    r(
        "MPI_Ireduce_scatter_block",
        COLLECTIVE,
        B::CountType,
        [2, 3, N, N],
        5,
        N,
    ),
    r("MPI_Iscan", COLLECTIVE, B::CountType, [2, 3, N, N], 5, N),
    r("MPI_Iexscan", COLLECTIVE, B::CountType, [2, 3, N, N], 5, N),
    r("MPI_Igather", COLLECTIVE, B::CountType, [1, 2, N, N], 7, 6),
    r("MPI_Igatherv", COLLECTIVE, B::CountType, [1, 2, N, N], 8, 7),
    r("MPI_Iscatter", COLLECTIVE, B::CountType, [4, 5, N, N], 7, 6),
    r(
        "MPI_Iscatterv",
        COLLECTIVE,
        B::CountType,
        [5, 6, N, N],
        8,
        7,
    ),
    r(
        "MPI_Iallgather",
        COLLECTIVE,
        B::CountType,
        [4, 5, N, N],
        6,
        N,
    ),
    r(
        "MPI_Iallgatherv",
        COLLECTIVE,
        B::CountAtRank,
        [4, 6, N, N],
        7,
        N,
    ),
    r(
        "MPI_Ialltoall",
        COLLECTIVE,
        B::CountType,
        [1, 2, N, N],
        6,
        N,
    ),
    r(
        "MPI_Ialltoallv",
        COLLECTIVE,
        B::SumCountsPerPeer,
        [1, 3, N, N],
        8,
        N,
    ),
    r(
        "MPI_Ialltoallw",
        COLLECTIVE,
        B::SumCountsTypesPerPeer,
        [1, 3, N, N],
        8,
        N,
    ),
    // One-sided: (oaddr, ocount, otype, target, tdisp, tcount, ttype, [op,] win).
    r("MPI_Put", ONE_SIDED, B::CountType, [1, 2, N, N], N, 3),
    r("MPI_Get", ONE_SIDED, B::CountType, [1, 2, N, N], N, 3),
    r(
        "MPI_Accumulate",
        ONE_SIDED,
        B::CountType,
        [1, 2, N, N],
        N,
        3,
    ),
    r("MPI_Rput", ONE_SIDED, B::CountType, [1, 2, N, N], N, 3),
    r("MPI_Rget", ONE_SIDED, B::CountType, [1, 2, N, N], N, 3),
    r(
        "MPI_Raccumulate",
        ONE_SIDED,
        B::CountType,
        [1, 2, N, N],
        N,
        3,
    ),
    // (oaddr, ocount, otype, raddr, rcount, rtype, target, tdisp, tcount, ttype, op, win)
    r(
        "MPI_Get_accumulate",
        ONE_SIDED,
        B::CountType,
        [1, 2, N, N],
        N,
        6,
    ),
    // (oaddr, raddr, type, target, tdisp, op, win): one element.
    r(
        "MPI_Fetch_and_op",
        ONE_SIDED,
        B::CountType,
        [N, 2, N, N],
        N,
        3,
    ),
    // (oaddr, caddr, raddr, type, target, tdisp, win): one element.
    r(
        "MPI_Compare_and_swap",
        ONE_SIDED,
        B::CountType,
        [N, 3, N, N],
        N,
        4,
    ),
    r("MPI_Win_fence", ONE_SIDED, B::None, [N; 4], N, N),
    r("MPI_Win_lock", ONE_SIDED, B::None, [N; 4], N, 1),
    r("MPI_Win_unlock", ONE_SIDED, B::None, [N; 4], N, 0),
    r("MPI_Win_lock_all", ONE_SIDED, B::None, [N; 4], N, N),
    r("MPI_Win_unlock_all", ONE_SIDED, B::None, [N; 4], N, N),
    r("MPI_Win_flush", ONE_SIDED, B::None, [N; 4], N, 0),
    r("MPI_Win_flush_all", ONE_SIDED, B::None, [N; 4], N, N),
    r("MPI_Win_flush_local", ONE_SIDED, B::None, [N; 4], N, 0),
    r("MPI_Win_flush_local_all", ONE_SIDED, B::None, [N; 4], N, N),
    r("MPI_Win_post", ONE_SIDED, B::None, [N; 4], N, N),
    r("MPI_Win_start", ONE_SIDED, B::None, [N; 4], N, N),
    r("MPI_Win_complete", ONE_SIDED, B::None, [N; 4], N, N),
    r("MPI_Win_wait", ONE_SIDED, B::None, [N; 4], N, N),
    // Communicator management (sizes of new communicators are learnt from Comm_size).
    // (comm, *newcomm)
    r("MPI_Comm_dup", COMM, B::CommDup, [N, N, N, 1], 0, N),
    // (comm, color, key, *newcomm)
    r("MPI_Comm_split", COMM, B::CommCreate, [1, N, N, 3], 0, N),
    // (comm, group, *newcomm)
    r("MPI_Comm_create", COMM, B::CommCreate, [N, N, N, 2], 0, N),
    r("MPI_Comm_free", COMM, B::CommFree, [0, N, N, N], N, N),
    // Datatype constructors: sizes learnt in the kernel for integer-handle ABIs.
    // (count, oldtype, *newtype)
    r(
        "MPI_Type_contiguous",
        DATATYPE,
        B::CtorProduct,
        [0, 1, N, 2],
        N,
        N,
    ),
    // (count, blocklength, stride, oldtype, *newtype)
    r(
        "MPI_Type_vector",
        DATATYPE,
        B::CtorProduct,
        [0, 3, 1, 4],
        N,
        N,
    ),
    r(
        "MPI_Type_hvector",
        DATATYPE,
        B::CtorProduct,
        [0, 3, 1, 4],
        N,
        N,
    ),
    r(
        "MPI_Type_create_hvector",
        DATATYPE,
        B::CtorProduct,
        [0, 3, 1, 4],
        N,
        N,
    ),
    // (count, blocklengths[], displacements[], oldtype, *newtype)
    r("MPI_Type_indexed", DATATYPE, B::CtorSum, [0, 3, 1, 4], N, N),
    r(
        "MPI_Type_create_hindexed",
        DATATYPE,
        B::CtorSum,
        [0, 3, 1, 4],
        N,
        N,
    ),
    // (count, blocklength, displacements[], oldtype, *newtype)
    r(
        "MPI_Type_create_indexed_block",
        DATATYPE,
        B::CtorProduct,
        [0, 3, 1, 4],
        N,
        N,
    ),
    r(
        "MPI_Type_create_hindexed_block",
        DATATYPE,
        B::CtorProduct,
        [0, 3, 1, 4],
        N,
        N,
    ),
    // (count, blocklengths[], displacements[], types[], *newtype)
    r(
        "MPI_Type_create_struct",
        DATATYPE,
        B::CtorStruct,
        [0, 3, 1, 4],
        N,
        N,
    ),
    // (oldtype, lb, extent, *newtype): extent changes, size does not.
    r(
        "MPI_Type_create_resized",
        DATATYPE,
        B::CtorProduct,
        [N, 0, N, 3],
        N,
        N,
    ),
    // (oldtype, *newtype)
    r("MPI_Type_dup", DATATYPE, B::CtorProduct, [N, 0, N, 1], N, N),
    // (ndims, sizes[], subsizes[], starts[], order, oldtype, *newtype)
    r(
        "MPI_Type_create_subarray",
        DATATYPE,
        B::CtorProdArray,
        [0, 5, 2, 6],
        N,
        N,
    ),
    r("MPI_Type_commit", DATATYPE, B::None, [N; 4], N, N),
    // (*datatype)
    r("MPI_Type_free", DATATYPE, B::TypeFree, [0, N, N, N], N, N),
    // NCCL (nccl.h 2.32). Bytes follow nccl-tests: count x type size, and for the
    // collectives whose count is per rank the whole buffer, count x type size x nranks.
    // (sbuf, rbuf, count, type, op, comm, stream)
    r(
        "ncclAllReduce",
        COLLECTIVE,
        B::CountType,
        [2, 3, N, N],
        5,
        N,
    ),
    // (sbuf, rbuf, count, type, root, comm, stream)
    r(
        "ncclBroadcast",
        COLLECTIVE,
        B::CountType,
        [2, 3, N, N],
        5,
        4,
    ),
    // (buf, count, type, root, comm, stream): calls ncclBroadcast, counted once.
    r("ncclBcast", COLLECTIVE, B::CountType, [1, 2, N, N], 4, 3),
    // (sbuf, rbuf, count, type, op, root, comm, stream)
    r("ncclReduce", COLLECTIVE, B::CountType, [2, 3, N, N], 6, 5),
    // (sbuf, rbuf, sendcount, type, comm, stream)
    r(
        "ncclAllGather",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        4,
        N,
    ),
    // (sbuf, rbuf, recvcount, type, op, comm, stream)
    r(
        "ncclReduceScatter",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        5,
        N,
    ),
    // (sbuf, rbuf, count per peer, type, comm, stream)
    r(
        "ncclAlltoAll",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        4,
        N,
    ),
    // (sbuf, rbuf, count per rank, type, root, comm, stream)
    r(
        "ncclGather",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        5,
        4,
    ),
    r(
        "ncclScatter",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        5,
        4,
    ),
    // (buf, count, type, peer, comm, stream)
    r("ncclSend", P2P, B::CountType, [1, 2, N, N], 4, 3),
    r("ncclRecv", P2P, B::CountType, [1, 2, N, N], 4, 3),
    r("ncclGroupStart", GROUP, B::GroupStart, [N; 4], N, N),
    r("ncclGroupEnd", GROUP, B::GroupEnd, [N; 4], N, N),
    r("ncclGroup", GROUP, B::GroupSpan, [N; 4], N, N),
    // (*comm, nranks, ncclUniqueId by value (on the stack), rank[, config])
    r(
        "ncclCommInitRank",
        COMM,
        B::NcclCommInit,
        [0, 1, 2, 6],
        N,
        N,
    ),
    r(
        "ncclCommInitRankConfig",
        COMM,
        B::NcclCommInit,
        [0, 1, 2, 6],
        N,
        N,
    ),
    // (*newcomm, nranks, myrank, nId, commIds*, config)
    r(
        "ncclCommInitRankScalable",
        COMM,
        B::NcclCommInit,
        [0, 1, 2, 4],
        N,
        N,
    ),
    // (comms[], ndev, devlist)
    r(
        "ncclCommInitAll",
        COMM,
        B::NcclCommInitAll,
        [0, 1, N, N],
        N,
        N,
    ),
    // (comm, color, key, *newcomm, config)
    r("ncclCommSplit", COMM, B::NcclCommSplit, [0, 1, N, 3], 0, N),
    r("ncclCommDestroy", COMM, B::NcclCommFree, [0, N, N, N], N, N),
    r("ncclCommAbort", COMM, B::NcclCommFree, [0, N, N, N], N, N),
    // (comm, *count) / (comm, *rank)
    r("ncclCommCount", COMM, B::CommSize, [0, N, N, 1], 0, N),
    r("ncclCommUserRank", COMM, B::CommRank, [0, N, N, 1], 0, N),
    // The host waits for the GPU after NCCL operations (see README "NCCL device time").
    r("cudaStreamSynchronize", SYNC, B::DeviceSync, [N; 4], N, N),
    r("cudaEventSynchronize", SYNC, B::DeviceSync, [N; 4], N, N),
    r("cudaDeviceSynchronize", SYNC, B::DeviceSync, [N; 4], N, N),
    r("cuStreamSynchronize", SYNC, B::DeviceSync, [N; 4], N, N),
    r("cuEventSynchronize", SYNC, B::DeviceSync, [N; 4], N, N),
    r("cuCtxSynchronize", SYNC, B::DeviceSync, [N; 4], N, N),
    // libfabric ops-table slots (fi_endpoint.h, fi_tagged.h, fi_rma.h), in `fid_ep` order:
    // msg, rma, tagged; each table's nine functions in their struct order. The kernel
    // counts every slot under its `fi_msg_*` id with the table in the key; userspace names
    // the table's kind once an endpoint is seen to use it (see collector's `fabric`).
    fab("fi_msg_recv", B::FabricLen),
    fab("fi_msg_recvv", B::FabricIov),
    fab("fi_msg_recvmsg", B::FabricMsg),
    fab("fi_msg_send", B::FabricLen),
    fab("fi_msg_sendv", B::FabricIov),
    fab("fi_msg_sendmsg", B::FabricMsg),
    fab("fi_msg_inject", B::FabricLen),
    fab("fi_msg_senddata", B::FabricLen),
    fab("fi_msg_injectdata", B::FabricLen),
    fab("fi_rma_read", B::FabricLen),
    fab("fi_rma_readv", B::FabricIov),
    fab("fi_rma_readmsg", B::FabricMsg),
    fab("fi_rma_write", B::FabricLen),
    fab("fi_rma_writev", B::FabricIov),
    fab("fi_rma_writemsg", B::FabricMsg),
    fab("fi_rma_inject", B::FabricLen),
    fab("fi_rma_writedata", B::FabricLen),
    fab("fi_rma_injectdata", B::FabricLen),
    fab("fi_tagged_recv", B::FabricLen),
    fab("fi_tagged_recvv", B::FabricIov),
    fab("fi_tagged_recvmsg", B::FabricMsg),
    fab("fi_tagged_send", B::FabricLen),
    fab("fi_tagged_sendv", B::FabricIov),
    fab("fi_tagged_sendmsg", B::FabricMsg),
    fab("fi_tagged_inject", B::FabricLen),
    fab("fi_tagged_senddata", B::FabricLen),
    fab("fi_tagged_injectdata", B::FabricLen),
    // UCX's data path (ucp.h): exported functions, each probed by its symbol. Operands:
    // the count, then the param (`_nbx`) or datatype (`_nb`, `_nbr`); lengths in bytes for
    // the `_nb`/`_nbi` RMA forms. `ucp_am_send_nbx`'s param is its 7th argument, read from
    // the stack at its entry into the buffer's slot (4).
    ucx("ucp_tag_send_nbx", B::UcxParam, 2, 4),
    ucx("ucp_tag_send_sync_nbx", B::UcxParam, 2, 4),
    ucx("ucp_tag_recv_nbx", B::UcxParam, 2, 5),
    ucx("ucp_put_nbx", B::UcxParam, 2, 5),
    ucx("ucp_get_nbx", B::UcxParam, 2, 5),
    ucx("ucp_stream_send_nbx", B::UcxParam, 2, 3),
    ucx("ucp_am_send_nbx", B::UcxParam, 5, 4),
    ucx("ucp_tag_send_nb", B::UcxDatatype, 2, 3),
    ucx("ucp_tag_send_nbr", B::UcxDatatype, 2, 3),
    ucx("ucp_tag_send_sync_nb", B::UcxDatatype, 2, 3),
    ucx("ucp_tag_recv_nb", B::UcxDatatype, 2, 3),
    ucx("ucp_tag_recv_nbr", B::UcxDatatype, 2, 3),
    ucx("ucp_stream_send_nb", B::UcxDatatype, 2, 3),
    ucx("ucp_am_send_nb", B::UcxDatatype, 3, 4),
    ucx("ucp_put_nb", B::UcxLen, 2, N),
    ucx("ucp_put_nbi", B::UcxLen, 2, N),
    ucx("ucp_get_nb", B::UcxLen, 2, N),
    ucx("ucp_get_nbi", B::UcxLen, 2, N),
    // NCCL 2.32's per-call-config variants: the same arguments, then a config pointer.
    r(
        "ncclAllReduceConfig",
        COLLECTIVE,
        B::CountType,
        [2, 3, N, N],
        5,
        N,
    ),
    r(
        "ncclBroadcastConfig",
        COLLECTIVE,
        B::CountType,
        [2, 3, N, N],
        5,
        4,
    ),
    r(
        "ncclReduceConfig",
        COLLECTIVE,
        B::CountType,
        [2, 3, N, N],
        6,
        5,
    ),
    r(
        "ncclAllGatherConfig",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        4,
        N,
    ),
    r(
        "ncclReduceScatterConfig",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        5,
        N,
    ),
    r(
        "ncclAlltoAllConfig",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        4,
        N,
    ),
    r(
        "ncclGatherConfig",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        5,
        4,
    ),
    r(
        "ncclScatterConfig",
        COLLECTIVE,
        B::CountTypeTimesP,
        [2, 3, N, N],
        5,
        4,
    ),
    // NCCL's built-in network transports (NET/Socket, NET/IB), driven by its proxy thread:
    // what actually crosses the network, message by message. Local C++ functions, found
    // by their mangled names (symbols' `NCCL_NET_SIGNATURES`).
    r("ncclNetSocketIsend", NET, B::NetIsend, [2, N, N, 6], N, N),
    r("ncclNetSocketIrecv", NET, B::NetIrecv, [1, 3, N, 7], N, N),
    r("ncclIbIsend", NET, B::NetIsend, [2, N, N, 6], N, N),
    r("ncclIbIrecv", NET, B::NetIrecv, [1, 3, N, 7], N, N),
    // libfabric's exported `fi_fabric(attr, **fabric, ctx)`: names the provider a process
    // opens (its own program reports it; no counters).
    r("fi_fabric", COMM, B::None, [N; 4], N, N),
    // An external NCCL net plugin's (`libnccl-net*.so`) isend/irecv, found through its
    // exported `ncclNetPlugin_v10`..`_v12` table (the same signatures as the built-ins).
    r("ncclNetPluginIsend", NET, B::NetIsend, [2, N, N, 6], N, N),
    r("ncclNetPluginIrecv", NET, B::NetIrecv, [1, 3, N, 7], N, N),
    // (comm, split_type, key, info, *newcomm): one communicator per node for
    // MPI_COMM_TYPE_SHARED, so the type alone does not tell siblings apart (the host does).
    r(
        "MPI_Comm_split_type",
        COMM,
        B::CommCreate,
        [1, N, N, 4],
        0,
        N,
    ),
    // MPI-4's large-count point-to-point (`MPI_Count` counts), counted as their own
    // routines, with their base routine's arguments and per-peer traffic.
    r("MPI_Send_c", P2P, B::LargeCountType, [1, 2, N, N], 5, 3),
    r("MPI_Bsend_c", P2P, B::LargeCountType, [1, 2, N, N], 5, 3),
    r("MPI_Ssend_c", P2P, B::LargeCountType, [1, 2, N, N], 5, 3),
    r("MPI_Rsend_c", P2P, B::LargeCountType, [1, 2, N, N], 5, 3),
    r("MPI_Isend_c", P2P, B::LargeCountType, [1, 2, N, N], 5, 3),
    r("MPI_Ibsend_c", P2P, B::LargeCountType, [1, 2, N, N], 5, 3),
    r("MPI_Issend_c", P2P, B::LargeCountType, [1, 2, N, N], 5, 3),
    r("MPI_Irsend_c", P2P, B::LargeCountType, [1, 2, N, N], 5, 3),
    r("MPI_Recv_c", P2P, B::LargeRecvStatus, [1, 2, 6, N], 5, 3),
    r("MPI_Irecv_c", P2P, B::LargeRecvPosted, [1, 2, N, 6], 5, 3),
    r("MPI_Sendrecv_c", P2P, B::LargePair, [1, 2, 6, 7], 10, 3),
    r(
        "MPI_Sendrecv_replace_c",
        P2P,
        B::LargePair,
        [1, 2, 1, 2],
        7,
        3,
    ),
    // MPI-4's large-count collectives (`MPI_Count` counts), counted as their own routines,
    // with their base routine's arguments.
    r(
        "MPI_Bcast_c",
        COLLECTIVE,
        B::LargeCountType,
        [1, 2, N, N],
        4,
        3,
    ),
    r(
        "MPI_Reduce_c",
        COLLECTIVE,
        B::LargeCountType,
        [2, 3, N, N],
        6,
        5,
    ),
    r(
        "MPI_Allreduce_c",
        COLLECTIVE,
        B::LargeCountType,
        [2, 3, N, N],
        5,
        N,
    ),
    r(
        "MPI_Scan_c",
        COLLECTIVE,
        B::LargeCountType,
        [2, 3, N, N],
        5,
        N,
    ),
    r(
        "MPI_Exscan_c",
        COLLECTIVE,
        B::LargeCountType,
        [2, 3, N, N],
        5,
        N,
    ),
    r(
        "MPI_Gather_c",
        COLLECTIVE,
        B::LargeCountType,
        [1, 2, N, N],
        7,
        6,
    ),
    r(
        "MPI_Scatter_c",
        COLLECTIVE,
        B::LargeCountType,
        [4, 5, N, N],
        7,
        6,
    ),
    r(
        "MPI_Allgather_c",
        COLLECTIVE,
        B::LargeCountType,
        [4, 5, N, N],
        6,
        N,
    ),
    r(
        "MPI_Alltoall_c",
        COLLECTIVE,
        B::LargeCountType,
        [1, 2, N, N],
        6,
        N,
    ),
    r(
        "MPI_Ibcast_c",
        COLLECTIVE,
        B::LargeCountType,
        [1, 2, N, N],
        4,
        3,
    ),
    r(
        "MPI_Iallreduce_c",
        COLLECTIVE,
        B::LargeCountType,
        [2, 3, N, N],
        5,
        N,
    ),
    // MPI-IO: calls and time for every routine; reads and writes count × type size, as
    // mpitrace counts them. ROMIO's collective writes call MPI_Send and friends inside:
    // probed, those are nested calls, not the application's.
    r("MPI_File_open", IO, B::None, [N; 4], 0, N),
    r("MPI_File_close", IO, B::None, [N; 4], N, N),
    r("MPI_File_delete", IO, B::None, [N; 4], N, N),
    r("MPI_File_set_size", IO, B::None, [N; 4], N, N),
    r("MPI_File_preallocate", IO, B::None, [N; 4], N, N),
    r("MPI_File_get_size", IO, B::None, [N; 4], N, N),
    r("MPI_File_set_view", IO, B::None, [N; 4], N, N),
    r("MPI_File_get_view", IO, B::None, [N; 4], N, N),
    r("MPI_File_seek", IO, B::None, [N; 4], N, N),
    r("MPI_File_seek_shared", IO, B::None, [N; 4], N, N),
    r("MPI_File_get_position", IO, B::None, [N; 4], N, N),
    r("MPI_File_sync", IO, B::None, [N; 4], N, N),
    r("MPI_File_set_atomicity", IO, B::None, [N; 4], N, N),
    r("MPI_File_set_info", IO, B::None, [N; 4], N, N),
    // (fh, buf, count, type, status or request)
    r("MPI_File_read", IO, B::CountType, [2, 3, N, N], N, N),
    r("MPI_File_read_all", IO, B::CountType, [2, 3, N, N], N, N),
    r("MPI_File_write", IO, B::CountType, [2, 3, N, N], N, N),
    r("MPI_File_write_all", IO, B::CountType, [2, 3, N, N], N, N),
    r("MPI_File_read_shared", IO, B::CountType, [2, 3, N, N], N, N),
    r(
        "MPI_File_write_shared",
        IO,
        B::CountType,
        [2, 3, N, N],
        N,
        N,
    ),
    r(
        "MPI_File_read_ordered",
        IO,
        B::CountType,
        [2, 3, N, N],
        N,
        N,
    ),
    r(
        "MPI_File_write_ordered",
        IO,
        B::CountType,
        [2, 3, N, N],
        N,
        N,
    ),
    r("MPI_File_iread", IO, B::CountType, [2, 3, N, N], N, N),
    r("MPI_File_iwrite", IO, B::CountType, [2, 3, N, N], N, N),
    r("MPI_File_iread_all", IO, B::CountType, [2, 3, N, N], N, N),
    r("MPI_File_iwrite_all", IO, B::CountType, [2, 3, N, N], N, N),
    r(
        "MPI_File_iread_shared",
        IO,
        B::CountType,
        [2, 3, N, N],
        N,
        N,
    ),
    r(
        "MPI_File_iwrite_shared",
        IO,
        B::CountType,
        [2, 3, N, N],
        N,
        N,
    ),
    r(
        "MPI_File_read_all_begin",
        IO,
        B::CountType,
        [2, 3, N, N],
        N,
        N,
    ),
    r(
        "MPI_File_write_all_begin",
        IO,
        B::CountType,
        [2, 3, N, N],
        N,
        N,
    ),
    r("MPI_File_read_all_end", IO, B::None, [N; 4], N, N),
    r("MPI_File_write_all_end", IO, B::None, [N; 4], N, N),
    // (fh, offset, buf, count, type, status or request)
    r("MPI_File_read_at", IO, B::CountType, [3, 4, N, N], N, N),
    r("MPI_File_read_at_all", IO, B::CountType, [3, 4, N, N], N, N),
    r("MPI_File_write_at", IO, B::CountType, [3, 4, N, N], N, N),
    r(
        "MPI_File_write_at_all",
        IO,
        B::CountType,
        [3, 4, N, N],
        N,
        N,
    ),
    r("MPI_File_iread_at", IO, B::CountType, [3, 4, N, N], N, N),
    r("MPI_File_iwrite_at", IO, B::CountType, [3, 4, N, N], N, N),
    r(
        "MPI_File_iread_at_all",
        IO,
        B::CountType,
        [3, 4, N, N],
        N,
        N,
    ),
    r(
        "MPI_File_iwrite_at_all",
        IO,
        B::CountType,
        [3, 4, N, N],
        N,
        N,
    ),
    r(
        "MPI_File_read_at_all_begin",
        IO,
        B::CountType,
        [3, 4, N, N],
        N,
        N,
    ),
    r(
        "MPI_File_write_at_all_begin",
        IO,
        B::CountType,
        [3, 4, N, N],
        N,
        N,
    ),
    r("MPI_File_read_at_all_end", IO, B::None, [N; 4], N, N),
    r("MPI_File_write_at_all_end", IO, B::None, [N; 4], N, N),
    // Windows: (base, size, disp_unit, info, comm, win); the allocating ones (size,
    // disp_unit, info, comm, baseptr, win); (info, comm, win).
    // (base, size, disp_unit, info, comm, win) and (size, disp_unit, info, comm, baseptr,
    // win): the window's size, as mpitrace counts them.
    r("MPI_Win_create", ONE_SIDED, B::AintArg, [1, N, N, N], 4, N),
    r(
        "MPI_Win_allocate",
        ONE_SIDED,
        B::AintArg,
        [0, N, N, N],
        3,
        N,
    ),
    r(
        "MPI_Win_allocate_shared",
        ONE_SIDED,
        B::AintArg,
        [0, N, N, N],
        3,
        N,
    ),
    r("MPI_Win_create_dynamic", ONE_SIDED, B::None, [N; 4], 1, N),
    r("MPI_Win_free", ONE_SIDED, B::None, [N; 4], N, N),
    // The other persistent sends: (buf, count, type, peer, tag, comm, request).
    r(
        "MPI_Bsend_init",
        PERSISTENT,
        B::CountType,
        [1, 2, 3, 6],
        5,
        3,
    ),
    r(
        "MPI_Ssend_init",
        PERSISTENT,
        B::CountType,
        [1, 2, 3, 6],
        5,
        3,
    ),
    r(
        "MPI_Rsend_init",
        PERSISTENT,
        B::CountType,
        [1, 2, 3, 6],
        5,
        3,
    ),
    // The profiler's hook (level, ...): counted; its region is not yet honoured.
    r("MPI_Pcontrol", OTHER, B::None, [N; 4], N, N),
    // A Cartesian communicator (comm_old, ndims, dims, periods, reorder, *comm_cart): the
    // topology neighbourhood collectives run on. `b` and `c` its dimensions, whose product
    // is its size (integer-handle ABIs learn it at the return).
    r("MPI_Cart_create", COMM, B::CommCreate, [N, 1, 2, 5], 0, N),
    // Neighbourhood collectives: the bytes a rank sends to each neighbour, as Alltoall's
    // per peer. (sbuf, scount, stype, rbuf, rcount, rtype, comm[, request])
    r(
        "MPI_Neighbor_allgather",
        COLLECTIVE,
        B::CountType,
        [1, 2, N, N],
        6,
        N,
    ),
    r(
        "MPI_Neighbor_alltoall",
        COLLECTIVE,
        B::CountType,
        [1, 2, N, N],
        6,
        N,
    ),
    r(
        "MPI_Ineighbor_allgather",
        COLLECTIVE,
        B::CountType,
        [1, 2, N, N],
        6,
        N,
    ),
    r(
        "MPI_Ineighbor_alltoall",
        COLLECTIVE,
        B::CountType,
        [1, 2, N, N],
        6,
        N,
    ),
    // (sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm[, request])
    r(
        "MPI_Neighbor_allgatherv",
        COLLECTIVE,
        B::CountType,
        [1, 2, N, N],
        7,
        N,
    ),
    r(
        "MPI_Ineighbor_allgatherv",
        COLLECTIVE,
        B::CountType,
        [1, 2, N, N],
        7,
        N,
    ),
    // (sbuf, scounts, sdispls, stype[s], rbuf, rcounts, rdispls, rtype[s], comm[, request]):
    // one count per neighbour, whose number is the topology's (not read): calls and time.
    r("MPI_Neighbor_alltoallv", COLLECTIVE, B::None, [N; 4], 8, N),
    r("MPI_Ineighbor_alltoallv", COLLECTIVE, B::None, [N; 4], 8, N),
    r("MPI_Neighbor_alltoallw", COLLECTIVE, B::None, [N; 4], 8, N),
    r("MPI_Ineighbor_alltoallw", COLLECTIVE, B::None, [N; 4], 8, N),
    // MPI-4's persistent collectives (MPICH 4's `MPI_*_init`, Open MPI 4.1's `MPIX_*_init`):
    // the blocking routine's arguments, then (info, request). Bytes by its rule at the
    // creation; each start moves them again.
    pinit("MPI_Barrier_init", B::None, [N, N], 0),
    pinit("MPI_Bcast_init", B::CountType, [1, 2], 4),
    pinit("MPI_Reduce_init", B::CountType, [2, 3], 6),
    pinit("MPI_Allreduce_init", B::CountType, [2, 3], 5),
    pinit("MPI_Reduce_scatter_init", B::SumCounts, [2, 3], 5),
    pinit("MPI_Reduce_scatter_block_init", B::CountType, [2, 3], 5),
    pinit("MPI_Scan_init", B::CountType, [2, 3], 5),
    pinit("MPI_Exscan_init", B::CountType, [2, 3], 5),
    pinit("MPI_Gather_init", B::CountType, [1, 2], 7),
    pinit("MPI_Gatherv_init", B::CountType, [1, 2], 8),
    pinit("MPI_Scatter_init", B::CountType, [4, 5], 7),
    pinit("MPI_Scatterv_init", B::CountType, [5, 6], 8),
    pinit("MPI_Allgather_init", B::CountType, [4, 5], 6),
    pinit("MPI_Allgatherv_init", B::CountAtRank, [4, 6], 7),
    pinit("MPI_Alltoall_init", B::CountType, [1, 2], 6),
    pinit("MPI_Alltoallv_init", B::SumCountsPerPeer, [1, 3], 8),
    pinit("MPI_Alltoallw_init", B::SumCountsTypesPerPeer, [1, 3], 8),
    pinit("MPI_Neighbor_allgather_init", B::CountType, [1, 2], 6),
    pinit("MPI_Neighbor_alltoall_init", B::CountType, [1, 2], 6),
    pinit("MPI_Neighbor_allgatherv_init", B::CountType, [1, 2], 7),
    pinit("MPI_Neighbor_alltoallv_init", B::None, [N, N], 8),
    pinit("MPI_Neighbor_alltoallw_init", B::None, [N, N], 8),
    pinit("MPIX_Barrier_init", B::None, [N, N], 0),
    pinit("MPIX_Bcast_init", B::CountType, [1, 2], 4),
    pinit("MPIX_Reduce_init", B::CountType, [2, 3], 6),
    pinit("MPIX_Allreduce_init", B::CountType, [2, 3], 5),
    pinit("MPIX_Reduce_scatter_init", B::SumCounts, [2, 3], 5),
    pinit("MPIX_Reduce_scatter_block_init", B::CountType, [2, 3], 5),
    pinit("MPIX_Scan_init", B::CountType, [2, 3], 5),
    pinit("MPIX_Exscan_init", B::CountType, [2, 3], 5),
    pinit("MPIX_Gather_init", B::CountType, [1, 2], 7),
    pinit("MPIX_Gatherv_init", B::CountType, [1, 2], 8),
    pinit("MPIX_Scatter_init", B::CountType, [4, 5], 7),
    pinit("MPIX_Scatterv_init", B::CountType, [5, 6], 8),
    pinit("MPIX_Allgather_init", B::CountType, [4, 5], 6),
    pinit("MPIX_Allgatherv_init", B::CountAtRank, [4, 6], 7),
    pinit("MPIX_Alltoall_init", B::CountType, [1, 2], 6),
    pinit("MPIX_Alltoallv_init", B::SumCountsPerPeer, [1, 3], 8),
    pinit("MPIX_Alltoallw_init", B::SumCountsTypesPerPeer, [1, 3], 8),
    pinit("MPIX_Neighbor_allgather_init", B::CountType, [1, 2], 6),
    pinit("MPIX_Neighbor_alltoall_init", B::CountType, [1, 2], 6),
    pinit("MPIX_Neighbor_allgatherv_init", B::CountType, [1, 2], 7),
    pinit("MPIX_Neighbor_alltoallv_init", B::None, [N, N], 8),
    pinit("MPIX_Neighbor_alltoallw_init", B::None, [N, N], 8),
    // MPI-4's nonblocking Sendrecv: (sbuf, scount, stype, dest, stag, rbuf, rcount, rtype,
    // source, rtag, comm, request) and (buf, count, type, dest, stag, source, rtag, comm,
    // request); the receive counts its posted size.
    r("MPI_Isendrecv", P2P, B::PairPosted, [1, 2, 6, 7], 10, 3),
    r(
        "MPI_Isendrecv_replace",
        P2P,
        B::PairPosted,
        [1, 2, 1, 2],
        7,
        3,
    ),
    r(
        "MPI_Isendrecv_c",
        P2P,
        B::LargePairPosted,
        [1, 2, 6, 7],
        10,
        3,
    ),
    r(
        "MPI_Isendrecv_replace_c",
        P2P,
        B::LargePairPosted,
        [1, 2, 1, 2],
        7,
        3,
    ),
    // MPI-4's partitioned point-to-point: (buf, partitions, count, type, peer, tag, comm,
    // info, request) creates a persistent request of partitions x count elements, started
    // with MPI_Start; the partitions are marked ready or tested one by one.
    r(
        "MPI_Psend_init",
        PERSISTENT,
        B::Partitioned,
        [1, 2, 4, 8],
        6,
        N,
    ),
    r(
        "MPI_Precv_init",
        PERSISTENT,
        B::PartitionedRecv,
        [1, 2, 4, 8],
        6,
        N,
    ),
    r("MPI_Pready", P2P, B::None, [N; 4], N, N),
    r("MPI_Pready_range", P2P, B::None, [N; 4], N, N),
    r("MPI_Pready_list", P2P, B::None, [N; 4], N, N),
    r("MPI_Parrived", P2P, B::None, [N; 4], N, N),
];

/// A libfabric ops-table slot: `(ep, buf, len, ...)`, `(ep, iov, desc, count, ...)` or
/// `(ep, msg, flags)`.
const fn fab(name: &'static str, rule: ByteRule) -> Routine {
    let abcd = match rule {
        ByteRule::FabricIov => [1, 3, N, N],
        ByteRule::FabricMsg => [1, N, N, N],
        _ => [2, N, N, N],
    };
    r(name, FABRIC, rule, abcd, N, N)
}

/// A UCX data-path function: `count` and `what` (its param or datatype) operands.
const fn ucx(name: &'static str, rule: ByteRule, count: u8, what: u8) -> Routine {
    r(name, FABRIC, rule, [count, what, N, N], N, N)
}

/// Id of the first UCX routine; they run to [`UCX_END`].
pub const UCX_FIRST: u16 = routine_index("ucp_tag_send_nbx");
/// One past the last UCX routine.
pub const UCX_END: u16 = routine_index("ucp_get_nbi") + 1;
/// Id of `ucp_am_send_nbx`, whose param the entry reads from the stack.
pub const UCX_AM_SEND_NBX: u16 = routine_index("ucp_am_send_nbx");

/// Id of the first libfabric slot (`fi_msg_recv`); slot `s` of table kind `k` (0 msg, 1
/// rma, 2 tagged) is `FABRIC_FIRST + 9k + s`.
pub const FABRIC_FIRST: u16 = routine_index("fi_msg_recv");
/// Slots per libfabric ops table.
pub const FABRIC_SLOTS: u16 = 9;
/// `sizeof(struct fi_ops_msg)` (and `fi_ops_tagged`, `fi_ops_rma`): a `size_t` equal to
/// the table's own size, then the slots.
pub const FI_OPS_TABLE_SIZE: u64 = 8 + 8 * FABRIC_SLOTS as u64;
/// Offset in `struct fid_ep` of its `msg` table pointer; `rma` and `tagged` follow (+48,
/// +56), in the order of the table kinds of the slot ids.
pub const FID_EP_TABLES_OFF: u64 = 40;
/// Id of libfabric's `fi_fabric`.
pub const FABRIC_OPEN: u16 = routine_index("fi_fabric");
/// `MPI_Pcontrol`'s routine id (it has a program of its own besides the counting one).
pub const PCONTROL: u16 = routine_index("MPI_Pcontrol");

/// Id of the routine named `name`, at compile time (panics if there is none).
pub const fn routine_index(name: &str) -> u16 {
    let mut i = 0;
    while i < ROUTINES.len() {
        if const_eq(ROUTINES[i].name.as_bytes(), name.as_bytes()) {
            return i as u16;
        }
        i += 1;
    }
    panic!("no such routine")
}

const fn const_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Id of the span counted per completed outermost NCCL group.
pub const NCCL_GROUP: u16 = routine_index("ncclGroup");

/// Number of routines in [`ROUTINES`].
pub const ROUTINE_COUNT: usize = ROUTINES.len();
const _: () = assert!(ROUTINE_COUNT < u16::MAX as usize);
// The kernel's per-routine maps (`ROUTINE_SPECS`, `TIME_ONE_IN`) hold 1,024.
const _: () = assert!(ROUTINE_COUNT <= 1024);

/// Id of the routine with this C name (`MPI_Send`), if commtap probes it.
pub fn routine_id(name: &str) -> Option<u16> {
    ROUTINES
        .iter()
        .position(|r| const_eq(r.name.as_bytes(), name.as_bytes()))
        .map(|i| i as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_unique_and_well_formed() {
        for (i, r) in ROUTINES.iter().enumerate() {
            assert!(
                r.name.starts_with("MPI_")
                    || r.name.starts_with("MPIX_")
                    || r.name.starts_with("nccl")
                    || r.name.starts_with("cu")
                    || r.name.starts_with("fi_")
                    || r.name.starts_with("ucp_"),
                "{}",
                r.name
            );
            assert_eq!(routine_id(r.name), Some(i as u16), "duplicate {}", r.name);
        }
    }

    #[test]
    fn ucx_routines_are_one_run_of_transport_routines() {
        for (i, r) in ROUTINES.iter().enumerate() {
            let ucx = (UCX_FIRST..UCX_END).contains(&(i as u16));
            assert_eq!(r.name.starts_with("ucp_"), ucx, "{}", r.name);
            if ucx {
                assert_eq!(r.family(), Family::Fabric, "{}", r.name);
                // Operands within the six register arguments the transport entry saves.
                assert!(
                    r.spec.a < 6 && (r.spec.b < 6 || r.spec.b == NO_ARG),
                    "{}",
                    r.name
                );
            }
        }
    }

    #[test]
    fn persistent_creations_name_their_request_and_channel_and_no_message() {
        for r in ROUTINES
            .iter()
            .filter(|r| r.spec.class == class::PERSISTENT)
        {
            assert_ne!(r.spec.d, NO_ARG, "{}", r.name);
            // A point-to-point one names its channel (peer `c`, then the tag), on which a
            // timeline then numbers no message; it is no message itself (not `P2P`).
            assert!(
                r.spec.peer == NO_ARG || r.spec.peer == r.spec.c,
                "{}",
                r.name
            );
        }
    }

    #[test]
    fn persistent_collectives_count_as_their_blocking_routine() {
        extern crate std;
        let mut seen = 0;
        for r in ROUTINES
            .iter()
            .filter(|r| r.spec.class == class::PERSISTENT)
        {
            if r.spec.c != NO_ARG {
                continue; // point-to-point: the peer is argument c
            }
            // MPI_Allreduce_init_c's blocking routine is MPI_Allreduce_c.
            let (name, large) = r
                .name
                .strip_suffix("_c")
                .map_or((r.name, ""), |n| (n, "_c"));
            let base = name.strip_suffix("_init").expect(r.name);
            let base = std::format!("MPI_{}{large}", base.split_once('_').expect(r.name).1);
            let b = ROUTINES[usize::from(routine_id(&base).expect(r.name))].spec;
            assert_eq!(
                (r.spec.rule, r.spec.a, r.spec.b, r.spec.comm, r.spec.d),
                (b.rule, b.a, b.b, b.comm, b.comm + 2),
                "{}",
                r.name
            );
            seen += 1;
        }
        assert_eq!(seen, 44 + 21);
    }

    #[test]
    fn arg_indexes_fit_the_saved_arguments() {
        for r in ROUTINES {
            let s = r.spec;
            for a in [s.a, s.b, s.c, s.d, s.comm, s.peer] {
                assert!(
                    a == NO_ARG || (a as usize) < crate::wire::MAX_ARGS,
                    "{}",
                    r.name
                );
            }
        }
    }
}
