//! Decoding MPI handles and arguments in the kernel, per ABI.
//!
//! Open MPI handles are pointers to objects whose layout userspace supplies per library
//! version (`Layout`); MPICH-ABI handles are 32-bit integers that encode builtin sizes, and
//! derived types / communicators are learnt from the calls that create or query them. The
//! MPI-5 ABI's handles are read as MPICH's (`mpi_abi::to_mpich`) and decoded as those,
//! but for their predefined datatypes and their `MPI_Status`.

use aya_ebpf::helpers::{bpf_probe_read_user, generated as gen};
use collector_common::{comm_id, mpi_abi, mpich, nccl, Abi, CommInfo, HandleKey, Layout};

use crate::maps::{COMMS, DTYPES};

/// Largest communicator whose per-rank count arrays are summed in the kernel.
pub const MAX_ARRAY: u32 = CHUNK as u32 * MAX_CHUNKS;
const CHUNK: usize = 16;
const MAX_CHUNKS: u32 = 128;

/// Reads a `T` from the traced process; `None` if the address is not readable.
#[inline(always)]
pub fn read<T>(addr: u64) -> Option<T> {
    if addr == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_user copes with any address and fails cleanly.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}

/// An `int` argument (the upper half of its register is undefined by the ABI).
#[inline(always)]
pub fn int_arg(v: u64) -> i32 {
    v as u32 as i32
}

/// A non-negative `int` count argument.
#[inline(always)]
pub fn count_arg(v: u64) -> Option<u64> {
    let c = int_arg(v);
    if c < 0 {
        None
    } else {
        Some(c as u64)
    }
}

/// Normalises a handle argument: MPICH handles are `int`s, Open MPI's are pointers, and
/// the MPI-5 ABI's become MPICH's (0 if the object cannot be read: no handle's value).
/// Exactly once per handle: an MPICH handle is no MPI-5 ABI handle.
#[inline(always)]
pub fn handle(abi: u8, v: u64) -> u64 {
    if abi == Abi::Mpich as u8 {
        v & 0xffff_ffff
    } else if abi == Abi::MpiAbi as u8 {
        mpi_abi_handle(v)
    } else {
        v
    }
}

/// [`handle`] in the MPI-5 ABI: a function of its own, whose stack is not that of each
/// return program it would be inlined in many times over.
#[inline(never)]
fn mpi_abi_handle(v: u64) -> u64 {
    mpi_abi::to_mpich(v, read::<u32>).unwrap_or(0)
}

/// Size in bytes of one element of datatype handle `h` (normalised by [`handle`]).
#[inline(always)]
pub fn type_size(abi: u8, layout: &Layout, tgid: u32, h: u64) -> Option<u64> {
    type_size_at(abi, layout.dt_size_off, tgid, h)
}

/// [`type_size`], with the one field of the layout it reads.
#[inline(always)]
fn type_size_at(abi: u8, dt_size_off: u32, tgid: u32, h: u64) -> Option<u64> {
    if abi == Abi::OpenMpi as u8 {
        return read::<u64>(h.checked_add(u64::from(dt_size_off))?).filter(|_| h != 0);
    }
    if abi == Abi::Nccl as u8 {
        return nccl::type_size(h as u32);
    }
    let h = h & 0xffff_ffff;
    if let Some(s) = mpich::builtin_type_size(h as u32) {
        return Some(s);
    }
    // SAFETY: plain u64 value.
    unsafe {
        DTYPES.get(HandleKey {
            tgid,
            _pad: 0,
            handle: h,
        })
    }
    .copied()
}

/// Size of communicator `h` (normalised by [`handle`]) and this process's rank in it. For
/// NCCL, a communicator whose size is not known yet (split off, not asked) still has its
/// identity.
#[inline(always)]
pub fn comm_info(abi: u8, layout: &Layout, tgid: u32, h: u64) -> Option<CommInfo> {
    if abi == Abi::Nccl as u8 {
        if h == 0 {
            return None;
        }
        // SAFETY: plain value.
        return unsafe {
            COMMS.get(HandleKey {
                tgid,
                _pad: 0,
                handle: h,
            })
        }
        .copied();
    }
    if abi == Abi::OpenMpi as u8 {
        if h == 0 {
            return None;
        }
        // Three dependent reads cost more than a lookup: cache per (process, handle),
        // forgotten at MPI_Comm_free (a freed handle's address may be reused).
        let key = HandleKey {
            tgid,
            _pad: 0,
            handle: h,
        };
        // SAFETY: plain value.
        if let Some(info) = unsafe { COMMS.get(key) } {
            return Some(*info);
        }
        let rank: i32 = read(h + u64::from(layout.comm_rank_off))?;
        let group: u64 = read(h + u64::from(layout.comm_group_off))?;
        let size: i32 = read(group.checked_add(u64::from(layout.group_size_off))?)?;
        if size <= 0 {
            return None;
        }
        let id = match layout.comm_cid_off {
            0 => 0,
            off => read::<u32>(h + u64::from(off)).map_or(0, comm_id::ompi),
        };
        let mut info = CommInfo::new(size as u32, rank, id);
        info.gen = crate::generations::comm_gen(tgid, h) as u16;
        // Refused: read from the communicator at each call instead.
        crate::shares::remember_comm(&key, &info);
        return Some(info);
    }
    let h = h & 0xffff_ffff;
    if h == mpich::COMM_SELF {
        return Some(CommInfo::new(1, 0, 0));
    }
    // SAFETY: plain value.
    let info = unsafe {
        COMMS.get(HandleKey {
            tgid,
            _pad: 0,
            handle: h,
        })
    }
    .copied()?;
    if info.size == 0 {
        None
    } else {
        Some(info)
    }
}

/// An identity of communicator `h` that every member shares (see `comm_id`): what was
/// decoded into `info` (Open MPI's context id, NCCL's unique-id hash), else the world for
/// MPICH's world handle, whose size may never have been asked while commtap watched.
#[inline(always)]
pub fn shared_comm_id(abi: u8, h: u64, info: Option<CommInfo>) -> u64 {
    match info {
        Some(i) if i.id != 0 => i.id,
        _ if Abi::integer_handles(abi) && h == mpich::COMM_WORLD => comm_id::WORLD,
        _ => 0,
    }
}

/// Bytes received according to an `MPI_Status` at `status`, per ABI.
#[inline(always)]
pub fn status_bytes(abi: u8, status: u64) -> Option<u64> {
    if abi == Abi::OpenMpi as u8 {
        // { int MPI_SOURCE, MPI_TAG, MPI_ERROR, _cancelled; size_t _ucount; }
        return read::<u64>(status + 16);
    }
    // The MPI-5 ABI's: { int MPI_SOURCE, MPI_TAG, MPI_ERROR, MPI_internal[5] }, MPICH's
    // two count words first in MPI_internal.
    let status = if abi == Abi::MpiAbi as u8 {
        status + mpi_abi::STATUS_COUNT_OFF
    } else {
        status
    };
    // { int count_lo; int count_hi_and_cancelled; int MPI_SOURCE, MPI_TAG, MPI_ERROR; }
    let lo: u32 = read(status)?;
    let hi: u32 = read(status + 4)?;
    Some(((u64::from(hi) >> 1) << 32) | u64::from(lo))
}

/// The source rank an `MPI_Status` at `status` holds, per ABI.
#[inline(always)]
pub fn status_source(abi: u8, status: u64) -> Option<i32> {
    // Open MPI and the MPI-5 ABI: MPI_SOURCE first; MPICH: after the two count words.
    let off = if abi == Abi::Mpich as u8 {
        8
    } else {
        mpi_abi::STATUS_SOURCE_OFF
    };
    read::<i32>(status + off)
}

/// The tag an `MPI_Status` at `status` holds, per ABI (the int after the source).
#[inline(always)]
pub fn status_tag(abi: u8, status: u64) -> Option<i32> {
    let off = if abi == Abi::Mpich as u8 {
        12
    } else {
        mpi_abi::STATUS_TAG_OFF
    };
    read::<i32>(status + off)
}

/// Whether `status` is `MPI_STATUS_IGNORE` in any MPI ABI, for a probe that does not
/// know which (Open MPI's is NULL, MPICH's 1: never a status's address in either).
#[inline(always)]
pub fn status_ignored_in_any_abi(status: u64) -> bool {
    status == 0 || status == mpich::STATUS_IGNORE
}

/// Whether `status` is `MPI_STATUS_IGNORE` in this ABI.
#[inline(always)]
pub fn status_ignored(abi: u8, status: u64) -> bool {
    status == 0 || (abi == Abi::Mpich as u8 && status == mpich::STATUS_IGNORE)
}

/// Reads up to `CHUNK` ints at `addr` into `buf` (only `n` of them are meaningful).
#[inline(always)]
fn read_chunk(addr: u64, n: u32, buf: &mut [i32; CHUNK]) -> bool {
    // Read exactly what is asked: past the array's end may be an unmapped page.
    let bytes = if n >= CHUNK as u32 {
        CHUNK as u32 * 4
    } else {
        n * 4
    };
    // SAFETY: buf is CHUNK*4 bytes and bytes <= CHUNK*4; the helper checks the user side.
    let rc = unsafe { gen::bpf_probe_read_user(buf.as_mut_ptr().cast(), bytes, addr as *const _) };
    rc == 0
}

/// Sum of the `n` non-negative ints at `addr` (`None` if any is negative or unreadable).
///
/// Branch-free per element (the chunk is zeroed and read to its exact length, negatives
/// are OR-ed into one sign check) so the verifier walks each chunk once.
#[inline(always)]
pub fn sum_ints(addr: u64, n: u32) -> Option<u64> {
    if n > MAX_ARRAY || addr == 0 {
        return None;
    }
    let mut total = 0u64;
    let mut sign = 0i32;
    for c in 0..MAX_CHUNKS {
        let base = c * CHUNK as u32;
        if base >= n {
            break;
        }
        let mut chunk = [0i32; CHUNK];
        if !read_chunk(addr + u64::from(base) * 4, n - base, &mut chunk) {
            return None;
        }
        for v in chunk {
            sign |= v;
            total += u64::from(v as u32);
        }
    }
    if sign < 0 {
        None
    } else {
        Some(total)
    }
}

/// Product of the `n` (at most 16) positive ints at `addr` (subarray sizes).
#[inline(always)]
pub fn product_ints(addr: u64, n: u32) -> Option<u64> {
    if n > CHUNK as u32 {
        return None;
    }
    let mut chunk = [0i32; CHUNK];
    if !read_chunk(addr, n, &mut chunk) {
        return None;
    }
    let mut p = 1u64;
    for (i, v) in chunk.iter().enumerate() {
        if (i as u32) < n {
            if *v < 0 {
                return None;
            }
            p *= *v as u64;
        }
    }
    Some(p)
}

/// What a decoder returning a plain number (not an `Option`: see its callers) returns when
/// it cannot tell.
pub const UNDECODED: u64 = u64::MAX;

/// A `bpf_loop` body: called with the iteration and the loop's context; 0 goes on, 1 stops.
pub type LoopBody = extern "C" fn(u64, *mut core::ffi::c_void) -> i64;

/// Runs `body` `n` times over `ctx` in a `bpf_loop`, whose body the verifier checks once
/// (an unrolled loop is checked at every iteration, in each state of its caller); whether
/// every iteration ran.
#[inline(always)]
pub fn each<T>(n: u32, body: LoopBody, ctx: &mut T) -> bool {
    // SAFETY: `body` is a BPF function of this object; its context is `ctx`, alive for the
    // call.
    let done = unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            n,
            body as *mut core::ffi::c_void,
            core::ptr::from_mut(ctx).cast(),
            0,
        )
    };
    done == i64::from(n)
}

/// Largest array summed element by element with a type lookup each (struct types,
/// Alltoallw: one count and type per rank), in a `bpf_loop`.
pub const MAX_TYPED: u32 = 1 << 16;

/// What [`add_typed`] and its kin sum up, on their caller's stack.
#[repr(C)]
pub struct TypedSum {
    /// Address of the counts (`int`s, or `MPI_Count`s for the `_wide` bodies).
    pub counts: u64,
    /// Address of the datatype handles (`int`s in MPICH's ABI, pointers in Open MPI's);
    /// unused by [`add_counts_wide`].
    pub types: u64,
    /// The sum so far.
    pub total: u64,
    /// The layout's `dt_size_off` (Open MPI: where a datatype holds its size).
    pub dt_size_off: u32,
    pub tgid: u32,
    pub abi: u32,
    /// 1 once an element could not be read or sized (a negative count, an unknown type).
    pub bad: u32,
}

/// One element of a [`TypedSum`] of `int` counts (`bpf_loop`'s body, which the verifier
/// checks once: walked element by element, 32 type lookups were a good part of the return
/// programs' verification, and an Alltoallw of more than 32 ranks went undecoded).
pub extern "C" fn add_typed(i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes its caller's `TypedSum`.
    let s = unsafe { &mut *ctx.cast::<TypedSum>() };
    let abi = s.abi as u8;
    // Written out, not with the helpers below that the `MPI_Count` bodies use: so written,
    // the MPICH return program's verification went past the kernel's limit on pending
    // branches ("the sequence of 8193 jumps is too complex").
    let size = read::<i32>(s.counts + i * 4)
        .filter(|c| *c >= 0)
        .and_then(|c| {
            let t = if abi == Abi::Mpich as u8 {
                u64::from(read::<u32>(s.types + i * 4)?)
            } else {
                read::<u64>(s.types + i * 8)?
            };
            Some(c as u64 * type_size_at(abi, s.dt_size_off, s.tgid, t)?)
        });
    if let Some(b) = size {
        s.total += b;
        0
    } else {
        // Set, not counted: the verifier iterates the body until its states repeat.
        s.bad = 1;
        1
    }
}

/// Element `i` of an array of handles at `base`, normalised (as [`handle`]).
#[inline(always)]
pub fn element_handle(abi: u8, base: u64, i: u64) -> Option<u64> {
    if abi == Abi::Mpich as u8 {
        read::<u32>(base + i * 4).map(u64::from)
    } else {
        read::<u64>(base + i * 8).map(|h| handle(abi, h))
    }
}

/// The size of element `i`'s datatype in a [`TypedSum`] (Open MPI's or MPICH's ABI).
#[inline(always)]
fn element_type_size(s: &TypedSum, abi: u8, i: u64) -> Option<u64> {
    let t = if abi == Abi::Mpich as u8 {
        u64::from(read::<u32>(s.types + i * 4)?)
    } else {
        read::<u64>(s.types + i * 8)?
    };
    type_size_at(abi, s.dt_size_off, s.tgid, t)
}

/// [`element_type_size`] in the MPI-5 ABI, for its own bodies: each body verifies its
/// ABI's path alone (the verifier walks every branch of a body, and the MPICH return
/// program had no pending branches to spare for a third ABI's).
#[inline(always)]
fn std_element_type_size(s: &TypedSum, i: u64) -> Option<u64> {
    let t = handle(Abi::MpiAbi as u8, read::<u64>(s.types + i * 8)?);
    type_size_at(Abi::Mpich as u8, 0, s.tgid, t)
}

/// [`add_typed`] in the MPI-5 ABI.
pub extern "C" fn add_typed_std(i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes its caller's `TypedSum`.
    let s = unsafe { &mut *ctx.cast::<TypedSum>() };
    let size = read::<i32>(s.counts + i * 4)
        .filter(|c| *c >= 0)
        .and_then(|c| Some(c as u64 * std_element_type_size(s, i)?));
    add_to(s, size)
}

/// [`add_typed_wide`] in the MPI-5 ABI.
pub extern "C" fn add_typed_wide_std(i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes its caller's `TypedSum`.
    let s = unsafe { &mut *ctx.cast::<TypedSum>() };
    let size = read::<i64>(s.counts + i * 8)
        .filter(|c| *c >= 0)
        .and_then(|c| Some((c as u64).wrapping_mul(std_element_type_size(s, i)?)));
    add_to(s, size)
}

/// Adds an element's bytes (`Some`) to `s`, or marks it bad (as [`add_typed`] does);
/// what a `bpf_loop` body returns (0: go on, 1: stop).
#[inline(always)]
fn add_to(s: &mut TypedSum, bytes: Option<u64>) -> i64 {
    if let Some(b) = bytes {
        s.total += b;
        0
    } else {
        // Set, not counted: the verifier iterates the body until its states repeat.
        s.bad = 1;
        1
    }
}

/// [`add_typed`] of `MPI_Count` counts (`MPI_Alltoallw_c`). A body of its own, not a
/// branch in one: the verifier explores each branch of a body in every caller state, and
/// the MPICH return program had none to spare.
pub extern "C" fn add_typed_wide(i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes its caller's `TypedSum`.
    let s = unsafe { &mut *ctx.cast::<TypedSum>() };
    let abi = s.abi as u8;
    // A count times a type's size is the caller's buffer (below 2^47 on x86-64): no
    // overflow check (BPF has no 128-bit multiply, which LLVM would use).
    let size = read::<i64>(s.counts + i * 8)
        .filter(|c| *c >= 0)
        .and_then(|c| Some((c as u64).wrapping_mul(element_type_size(s, abi, i)?)));
    add_to(s, size)
}

/// One `MPI_Count` of a [`TypedSum`] without types (`MPI_Alltoallv_c`'s counts).
pub extern "C" fn add_counts_wide(i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes its caller's `TypedSum`.
    let s = unsafe { &mut *ctx.cast::<TypedSum>() };
    let count = read::<i64>(s.counts + i * 8).filter(|c| *c >= 0);
    add_to(s, count.map(|c| c as u64))
}

/// One `MPI_Count` of a [`TypedSum`] that multiplies (a subarray's sizes: its total
/// starts at 1).
pub extern "C" fn mul_counts_wide(i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes its caller's `TypedSum`.
    let s = unsafe { &mut *ctx.cast::<TypedSum>() };
    match read::<i64>(s.counts + i * 8).filter(|c| *c >= 0) {
        Some(c) => {
            s.total = s.total.wrapping_mul(c as u64);
            0
        }
        None => add_to(s, None),
    }
}

/// Largest number of dimensions of a distributed array decoded (`MPI_Type_create_darray`).
pub const MAX_DARRAY_DIMS: u32 = 64;

/// What [`darray_dim`] works on, on its caller's stack: a darray's arrays (one `int` per
/// dimension) and the elements this process holds so far.
#[repr(C)]
pub struct DarrayElements {
    pub gsizes: u64,
    pub distribs: u64,
    pub dargs: u64,
    pub psizes: u64,
    /// The last dimension's index: the process grid is row-major, so its coordinates come
    /// off the rank from the last dimension on.
    pub last: u64,
    /// The rank, divided by the grid sizes of the dimensions done.
    pub left: u64,
    pub product: u64,
    /// 1 once a dimension could not be read or was invalid.
    pub bad: u64,
    /// 1: the global sizes are `MPI_Count`s (`MPI_Type_create_darray_c`), not `int`s.
    pub wide: u64,
}

/// One dimension of a [`DarrayElements`], the last first (`bpf_loop`'s body).
/// `STD`: the MPI-5 ABI's constants (a body of its own: see [`std_element_type_size`]).
pub extern "C" fn darray_dim<const STD: bool>(k: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes its caller's `DarrayElements`.
    let s = unsafe { &mut *ctx.cast::<DarrayElements>() };
    let i = s.last.wrapping_sub(k);
    let at = |base: u64| read::<i32>(base.wrapping_add(i.wrapping_mul(4)));
    let g = if s.wide == 0 {
        at(s.gsizes).map(i64::from)
    } else {
        read::<i64>(s.gsizes.wrapping_add(i.wrapping_mul(8)))
    };
    let local = match (g, at(s.distribs), at(s.dargs), at(s.psizes)) {
        (Some(g), Some(distrib), Some(darg), Some(p)) if p > 0 => {
            let r = s.left % p as u64;
            s.left /= p as u64;
            let (distrib, darg) = if STD {
                mpi_abi::darray_to_mpich(distrib, darg)
            } else {
                (distrib, darg)
            };
            mpich::darray_local(g, distrib, darg, p, r)
        }
        _ => None,
    };
    if let Some(n) = local {
        s.product = s.product.wrapping_mul(n);
        0
    } else {
        s.bad = 1;
        1
    }
}
