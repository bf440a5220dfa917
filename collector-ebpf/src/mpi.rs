//! MPI's return rules: the bytes of each routine by its byte rule, and what communicator
//! and datatype calls teach (integer-handle ABIs learn sizes here). Reached from the
//! generic return path (`probe`).

use collector_common::{
    mpi_abi,
    routines::{class, NO_ARG as N},
    shares::SharedMap,
    Abi, ArgSpec, ByteRule, CommInfo, HandleKey,
};

use crate::{
    call::{learn_comm, read_handle, Call, CountsWide, ProductWide, SumBody, Typed, TypedWide},
    decode::{
        count_arg, darray_dim, each, product_ints, read, DarrayElements, MAX_DARRAY_DIMS, UNDECODED,
    },
};

/// Whether a returning call's bytes are [`on_p2p_return`]'s: a point-to-point call but a
/// persistent request's start.
#[inline(always)]
pub(crate) fn is_p2p_return(spec: &ArgSpec) -> bool {
    spec.class == class::P2P
        && !matches!(
            ByteRule::from_u8(spec.rule),
            ByteRule::Start | ByteRule::StartAll
        )
}

/// A point-to-point call's bytes and peers at return ([`is_p2p_return`]). Apart from
/// [`on_return`]: each is under a global function of its own, so that the chain of calls
/// under one (down to a peer's entry charged to its user) is not under the other's frame
/// (BPF's 512 bytes of stack are a whole chain's: a uprobe program has no private stack).
#[inline(always)]
pub(crate) fn on_p2p_return(c: &Call, spec: &ArgSpec, comm: Option<CommInfo>) -> Option<u64> {
    let rule = ByteRule::from_u8(spec.rule);
    crate::p2p::on_return(c, spec, rule, crate::p2p::comm_key(c, spec, comm))
}

/// Applies the routine's byte rule (and its bookkeeping side effects) at return; a
/// point-to-point call's but a persistent start's is [`on_p2p_return`]'s.
#[inline(always)]
pub(crate) fn on_return(c: &Call, spec: &ArgSpec, comm: Option<CommInfo>) -> Option<u64> {
    let rule = ByteRule::from_u8(spec.rule);
    if spec.class == class::P2P {
        if matches!(rule, ByteRule::Start | ByteRule::StartAll) {
            let bytes = crate::persistent::on_start(c, spec);
            return (bytes != UNDECODED).then_some(bytes);
        }
        return None;
    }
    let p = comm.map(|c| c.size);
    match rule {
        ByteRule::None => Some(0),
        // A posted receive here is a persistent one's creation (`MPI_Recv_init`), whose
        // peer (`c`) may be MPI_PROC_NULL: nothing named (as mpitrace).
        ByteRule::CountType
        | ByteRule::RecvPosted
        | ByteRule::Partitioned
        | ByteRule::PartitionedRecv => {
            if crate::persistent::peer_is_null(c, spec) {
                Some(0)
            } else if matches!(rule, ByteRule::Partitioned | ByteRule::PartitionedRecv) {
                // The count per partition is an `MPI_Count` (64 bits), the partitions an
                // `int`.
                let per_partition =
                    c.count_type_by(spec.b, spec.b.wrapping_add(1), ByteRule::LargeCountType)?;
                // The product is the size of the caller's buffer (below 2^47 on x86-64), so
                // no overflow check (BPF has no 128-bit multiply, which LLVM would use).
                Some(c.count(spec.a)?.wrapping_mul(per_partition))
            } else {
                c.count_type(spec.a, spec.b)
            }
        }
        ByteRule::SumCounts => Some(c.sum(spec.a, p?)? * c.size(spec.b)?),
        ByteRule::SumCountsPerPeer => {
            (c.sum(spec.a, p?)? * c.size(spec.b)?).checked_div(u64::from(p?))
        }
        ByteRule::CountAtRank => {
            let info = comm?;
            if info.rank < 0 || info.rank as u32 >= info.size {
                return None;
            }
            let n: i32 = read(c.arg(spec.a)? + info.rank as u64 * 4)?;
            Some(count_arg(u64::from(n as u32))? * c.size(spec.b)?)
        }
        ByteRule::LargeSumCounts
        | ByteRule::LargeSumCountsPerPeer
        | ByteRule::LargeCountAtRank
        | ByteRule::LargeSumCountsTypesPerPeer => {
            let bytes = if c.abi == Abi::MpiAbi as u8 {
                large_vector::<true>(c, spec, comm?)
            } else {
                large_vector::<false>(c, spec, comm?)
            };
            (bytes != UNDECODED).then_some(bytes)
        }
        ByteRule::AintArg => c.count_wide(spec.a),
        // A posted receive here is a persistent one's creation (`MPI_Recv_init_c`).
        ByteRule::LargeCountType | ByteRule::LargeRecvPosted => {
            let bytes = large_count_type(c, spec);
            (bytes != UNDECODED).then_some(bytes)
        }
        ByteRule::SumCountsTypesPerPeer => c
            .sum_typed::<Typed>(spec.a, spec.b, p?)?
            .checked_div(u64::from(p?)),
        // Constructors and MPI_Type_free: sizes live in Open MPI's objects; MPICH-ABI
        // libraries attach these routines to `mpi_return_mpich_types` instead.
        ByteRule::CtorProduct
        | ByteRule::CtorSum
        | ByteRule::CtorStruct
        | ByteRule::CtorProdArray
        | ByteRule::TypeFree
        // Its request was forgotten at the entry (`probe::enter`), and a completion's
        // requests read there (`posted`).
        | ByteRule::RequestFree
        | ByteRule::Completes
        | ByteRule::MayComplete
        | ByteRule::CompletesOne
        | ByteRule::CompletesSome => Some(0),
        ByteRule::CommFree => {
            // Forgotten at the entry (`probe::enter`); a fact cached since is dropped.
            crate::cache::bump();
            Some(0)
        }
        ByteRule::CommCreate => {
            // MPI_Cart_create: integer-handle ABIs learn the new communicator's size here,
            // its rank from MPI_Comm_rank on it (which stencil codes ask, where they seldom
            // ask its size: without the size its traffic was put on no world rank).
            if Abi::integer_handles(c.abi) && c.ret == 0 && spec.b != N && spec.c != N {
                learn_cart_size(c, spec);
            }
            Some(0)
        }
        ByteRule::CommDup => {
            // A duplicate has its parent's size and ranks: integer-handle ABIs learn them
            // here, as they would from MPI_Comm_size on it.
            if Abi::integer_handles(c.abi) && c.ret == 0 {
                let new = c.arg(spec.d).and_then(|p| read_handle(c.abi, p));
                if let (Some(parent), Some(new)) = (comm, new) {
                    let key = HandleKey {
                        tgid: c.tgid,
                        _pad: 0,
                        handle: new,
                    };
                    let info = CommInfo::new(parent.size, parent.rank, 0);
                    crate::shares::remember_comm(&key, &info);
                    crate::cache::bump();
                }
            }
            Some(0)
        }
        rule @ (ByteRule::CommSize | ByteRule::CommRank) => {
            if Abi::integer_handles(c.abi) {
                learn_comm(c, spec, rule);
            }
            Some(0)
        }
        // NCCL's rules: its return program handles them (see `nccl`).
        _ => Some(0),
    }
}

/// The size of the Cartesian communicator `MPI_Cart_create` made (`*d`): the product of
/// its `b` dimensions at `c` (ranks past it get `MPI_COMM_NULL`, not kept).
#[inline(always)]
fn learn_cart_size(c: &Call, spec: &ArgSpec) -> Option<()> {
    let ndims = c.arg(spec.b)? as u32;
    // Only the mask bounds the read for the verifier: a range check before it would let
    // LLVM drop the mask. More than 15 dimensions (or a negative count) is refused after.
    let size = product_ints(c.arg(spec.c)?, ndims & 15);
    if ndims > 15 {
        return None;
    }
    let size = u32::try_from(size?).ok()?;
    let new = c.arg(spec.d).and_then(|p| read_handle(c.abi, p))?;
    // (An MPI-5 ABI handle is read as MPICH's, but for its null, which stays its own.)
    if size == 0 || new == collector_common::mpich::COMM_NULL || new == mpi_abi::COMM_NULL {
        return None;
    }
    let key = HandleKey {
        tgid: c.tgid,
        _pad: 0,
        handle: new,
    };
    crate::shares::remember_comm(&key, &CommInfo::new(size, -1, 0));
    crate::cache::bump();
    Some(())
}

/// Datatype constructors and MPI_Type_free (integer-handle ABIs): learn sizes (a freed
/// type is forgotten at its entry).
#[inline(always)]
#[expect(
    clippy::unnecessary_wraps,
    reason = "one of the return rules the generic path picks between, all returning Option"
)]
pub(crate) fn on_type_return(c: &Call, spec: &ArgSpec) -> Option<u64> {
    match ByteRule::from_u8(spec.rule) {
        rule @ (ByteRule::CtorProduct
        | ByteRule::CtorSum
        | ByteRule::CtorStruct
        | ByteRule::CtorProdArray
        | ByteRule::LargeCtorProduct
        | ByteRule::LargeCtorSum
        | ByteRule::LargeCtorStruct
        | ByteRule::LargeCtorProdArray
        | ByteRule::CtorDarray
        | ByteRule::LargeCtorDarray) => learn_type(c, spec, rule),
        ByteRule::TypeFree => {
            // Forgotten at the entry (`probe::enter`); a size cached since is dropped.
            crate::cache::bump();
        }
        _ => {}
    }
    Some(0)
}

/// Size of the type a constructor builds, from its arguments.
#[inline(always)]
fn constructed_size(c: &Call, spec: &ArgSpec, rule: ByteRule) -> Option<u64> {
    match rule {
        ByteRule::LargeCtorProduct
        | ByteRule::LargeCtorSum
        | ByteRule::LargeCtorStruct
        | ByteRule::LargeCtorProdArray => large_constructed_size(c, spec, rule),
        ByteRule::CtorDarray | ByteRule::LargeCtorDarray => {
            let wide = rule == ByteRule::LargeCtorDarray;
            let n = if c.abi == Abi::MpiAbi as u8 {
                darray_elements::<true>(c, wide)
            } else {
                darray_elements::<false>(c, wide)
            };
            // Wrapping, as the other constructors' (the caller's type, below 2^47).
            Some((n != UNDECODED).then_some(n)?.wrapping_mul(c.size(spec.b)?))
        }
        _ => {
            let n = c.count(spec.a)?;
            match rule {
                ByteRule::CtorProduct => Some(n * c.count(spec.c)? * c.size(spec.b)?),
                ByteRule::CtorSum => Some(c.sum(spec.c, n as u32)? * c.size(spec.b)?),
                ByteRule::CtorStruct => c.sum_typed::<Typed>(spec.c, spec.b, n as u32),
                ByteRule::CtorProdArray => {
                    Some(product_ints(c.arg(spec.c)?, n as u32)? * c.size(spec.b)?)
                }
                _ => None,
            }
        }
    }
}

/// [`constructed_size`] of a large-count constructor (`MPI_Type_vector_c` ...): its counts
/// are `MPI_Count`s, its arrays of them read in a `bpf_loop`.
#[inline(always)]
fn large_constructed_size(c: &Call, spec: &ArgSpec, rule: ByteRule) -> Option<u64> {
    // A subarray's number of dimensions stays an `int`.
    let n = if rule == ByteRule::LargeCtorProdArray {
        c.count(spec.a)?
    } else {
        c.count_wide(spec.a)?
    };
    // The products are the sizes of the caller's types (below 2^47 on x86-64): wrapping,
    // as BPF has no 128-bit multiply to check them with.
    match rule {
        ByteRule::LargeCtorProduct => Some(
            n.wrapping_mul(c.count_wide(spec.c)?)
                .wrapping_mul(c.size(spec.b)?),
        ),
        ByteRule::LargeCtorSum => array_times_size::<CountsWide>(c, spec, n),
        ByteRule::LargeCtorProdArray => array_times_size::<ProductWide>(c, spec, n),
        _ => c.sum_typed::<TypedWide>(spec.c, spec.b, u32::try_from(n).ok()?),
    }
}

/// `body` over the `n` `MPI_Count`s in argument `c` (their sum, their product), times the
/// size of the type in argument `b`.
#[inline(always)]
fn array_times_size<B: SumBody>(c: &Call, spec: &ArgSpec, n: u64) -> Option<u64> {
    Some(
        c.sum_typed::<B>(spec.c, N, u32::try_from(n).ok()?)?
            .wrapping_mul(c.size(spec.b)?),
    )
}

/// Elements of a distributed array this process holds (`MPI_Type_create_darray(size,
/// rank, ndims, gsizes[], distribs[], dargs[], psizes[], order, oldtype, *newtype)`: the
/// local block's, whatever the order; `wide`: its `_c` form, whose global sizes are
/// `MPI_Count`s), or [`UNDECODED`]. Not inlined, its dimensions read
/// in a `bpf_loop`.
#[inline(never)]
fn darray_elements<const STD: bool>(c: &Call, wide: bool) -> u64 {
    let (Some(size), Some(rank), Some(ndims)) = (c.arg(0), c.arg(1), c.arg(2)) else {
        return UNDECODED;
    };
    let (size, rank, ndims) = (size as u32 as i32, rank as u32 as i32, ndims as u32 as i32);
    if rank < 0 || rank >= size || ndims <= 0 || ndims as u32 > MAX_DARRAY_DIMS {
        return UNDECODED;
    }
    let mut s = DarrayElements {
        gsizes: c.arg(3).unwrap_or(0),
        distribs: c.arg(4).unwrap_or(0),
        dargs: c.arg(5).unwrap_or(0),
        psizes: c.arg(6).unwrap_or(0),
        last: (ndims - 1) as u64,
        left: rank as u64,
        product: 1,
        bad: 0,
        wide: u64::from(wide),
    };
    if each(ndims as u32, darray_dim::<STD>, &mut s) && s.bad == 0 {
        s.product
    } else {
        UNDECODED
    }
}

/// Records the size of a type built by a constructor, keyed by its new handle.
#[inline(always)]
fn learn_type(c: &Call, spec: &ArgSpec, rule: ByteRule) {
    let Some(size) = constructed_size(c, spec, rule) else {
        return;
    };
    let Some(new) = c.arg(spec.d).and_then(|p| read_handle(c.abi, p)) else {
        return;
    };
    crate::shares::remember_word(
        SharedMap::Dtypes,
        &HandleKey {
            tgid: c.tgid,
            _pad: 0,
            handle: new,
        },
        size,
    );
}

/// The bytes of a large-count routine whose counts are an array of `MPI_Count`s, one per
/// rank of `comm` (`MPI_Alltoallv_c` ...), by its rule; or [`UNDECODED`]. Not inlined, and
/// its arrays read in a `bpf_loop`: the return programs have no verifier states to spare.
#[inline(never)]
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "takes the routine's spec as the other return rules do"
)]
fn large_vector<const STD: bool>(c: &Call, spec: &ArgSpec, comm: CommInfo) -> u64 {
    let p = comm.size;
    let rule = ByteRule::from_u8(spec.rule);
    let bytes = if rule == ByteRule::LargeCountAtRank {
        if comm.rank < 0 || comm.rank as u32 >= p {
            return UNDECODED;
        }
        c.arg(spec.a)
            .and_then(|counts| read::<i64>(counts + comm.rank as u64 * 8))
            .filter(|n| *n >= 0)
            .and_then(|n| Some(n as u64 * c.size(spec.b)?))
    } else if rule == ByteRule::LargeSumCountsTypesPerPeer {
        c.sum_typed_in::<TypedWide, STD>(spec.a, spec.b, p)
            .and_then(|b| b.checked_div(u64::from(p)))
    } else {
        let total = c
            .sum_typed_in::<CountsWide, STD>(spec.a, N, p)
            .and_then(|n| Some(n * c.size(spec.b)?));
        if rule == ByteRule::LargeSumCountsPerPeer {
            total.and_then(|b| b.checked_div(u64::from(p)))
        } else {
            total
        }
    };
    bytes.unwrap_or(UNDECODED)
}

/// `MPI_Count` argument `a` x size(`b`) (0 for a persistent creation naming `MPI_PROC_NULL`),
/// or [`UNDECODED`]. A function of its own returning
/// a plain number: inlined (or returning an `Option`), it reshaped the code around it,
/// and the verifier lost bounds it had before.
#[inline(never)]
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "takes the routine's spec as the other return rules do"
)]
fn large_count_type(c: &Call, spec: &ArgSpec) -> u64 {
    // A persistent request's creation (`MPI_Send_init_c`) to or from MPI_PROC_NULL: nothing
    // named (as mpitrace).
    if crate::persistent::peer_is_null(c, spec) {
        return 0;
    }
    let (a, b) = (spec.a, spec.b);
    let n = c.args[usize::from(a) & (collector_common::ARG_SLOTS - 1)];
    if (n as i64) < 0 {
        return UNDECODED;
    }
    // No 128-bit multiply in BPF: overflow is ruled out by a division.
    match c.size(b) {
        Some(s) if s == 0 || n <= (UNDECODED - 1) / s => n.wrapping_mul(s),
        _ => UNDECODED,
    }
}

/// At `MPI_Init`'s return in an Open MPI process: reports the pml it selected (and the mtl,
/// under pml `cm`), read where userspace said its library keeps them. Out of line: the
/// return path's stack has no room for the event.
#[inline(never)]
pub(crate) fn send_components(tgid: u32) {
    use aya_ebpf::helpers::bpf_probe_read_user_str_bytes;
    use collector_common::{ompi_component as oc, ComponentsEvent, EventKind, COMPONENT_NAME_LEN};
    // SAFETY: a plain lookup; the value is copied out at once.
    let Some(at) = (unsafe { crate::maps::MPI_COMPONENTS.get(tgid) }).copied() else {
        return;
    };
    let mut ev = ComponentsEvent {
        kind: EventKind::MpiComponents as u32,
        tgid,
        pml: [0; COMPONENT_NAME_LEN],
        mtl: [0; COMPONENT_NAME_LEN],
    };
    let mtl = if at.mtl == 0 {
        0
    } else {
        read::<u64>(at.mtl).unwrap_or(0)
    };
    for (component, kind, out) in [(at.pml, oc::PML, &mut ev.pml), (mtl, oc::MTL, &mut ev.mtl)] {
        // Only a component of the framework it should be: the name is read where the
        // struct says it is.
        if component != 0 && read::<u32>(component.wrapping_add(oc::TYPE_OFF)) == Some(kind) {
            // SAFETY: the helper copies at most the buffer and stops at a fault.
            let _ = unsafe {
                bpf_probe_read_user_str_bytes(
                    component.wrapping_add(oc::NAME_OFF) as *const u8,
                    out,
                )
            };
        }
    }
    if ev.pml[0] != 0 {
        // A lost report leaves the transport unnamed; nothing is counted from it.
        let _ = crate::maps::EVENTS.output::<ComponentsEvent>(&ev, 0);
    }
}
