//! The generic entry probe of every routine and the MPI return probes.
//!
//! Entry saves the arguments and a timestamp per thread; return applies the routine's
//! byte rule (from `ROUTINE_SPECS`), updates the ground-truth counters and emits a
//! `CallEvent`. A call made while another is in progress on the same thread (MPI-IO,
//! `MPI_Sendrecv_replace` in some builds, `ncclBcast` → `ncclBroadcast`) is counted once,
//! at the outermost call. NCCL's own return rules are in `nccl`.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, generated::bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use collector_common::{
    routines::class, Abi, ArgSpec, ByteRule, CallEvent, CallState, CommInfo, Config, Cookie,
    CounterKey, EventKind, HandleCache, HandleKey, Layout, ARG_SLOTS, MAX_ARGS, UNKNOWN_BUCKET,
};

use collector_common::routines::NO_ARG as N;

use crate::{
    decode::{
        comm_info, count_arg, handle, int_arg, product_ints, read, shared_comm_id, sum_ints,
        sum_typed, type_size,
    },
    maps::{
        call_state, is_counted, is_watched, new_call_state, still_counted, with_proc_stats, COMMS,
        CONFIG, DTYPES, EVENTS, LAYOUTS, ROUTINE_SPECS,
    },
};

#[inline(always)]
pub(crate) fn cookie(ctx: &impl EbpfContext) -> Cookie {
    Cookie::unpack(raw_cookie(ctx))
}

/// The attachment's cookie as the kernel keeps it.
#[inline(always)]
fn raw_cookie(ctx: &impl EbpfContext) -> u64 {
    // SAFETY: the helper only reads the attachment's cookie.
    unsafe { aya_ebpf::helpers::generated::bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// Entry of any probed routine (MPI or NCCL); arguments per `ROUTINE_SPECS[cookie.routine]`.
#[uprobe]
pub fn call_entry(ctx: ProbeContext) -> u32 {
    // A thread has call state only if its process was counted when it first called MPI,
    // and loses it when it exits; so the watched set is consulted once per thread (and
    // again after a detach), and the process id is asked of the kernel only then.
    let packed = raw_cookie(&ctx);
    let c = Cookie::unpack(packed);
    let Some(spec) = ROUTINE_SPECS.get(c.routine as u32) else {
        return 0;
    };
    let existing = call_state(false);
    let tgid = match existing {
        Some(e) => {
            // SAFETY: the thread's own entry; only this thread touches it.
            let e = unsafe { &mut *e };
            if e.busy != 0 {
                e.depth += 1;
                with_proc_stats(e.tgid, |s| s.nested += 1);
                return 0;
            }
            if !still_counted(e) {
                return 0;
            }
            e.tgid
        }
        None => {
            let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
            // A wait for the GPU alone does not make a process one to profile (every CUDA
            // program makes them); it counts in processes already watched.
            let counted = if spec.class == class::SYNC {
                is_watched(tgid)
            } else {
                is_counted(tgid)
            };
            if !counted {
                return 0;
            }
            tgid
        }
    };
    let Some(e) = existing.or_else(|| new_call_state(tgid)) else {
        // No storage could be created (memory, or the storage lock busy): not counted.
        with_proc_stats(tgid, |s| s.counters_full += 1);
        return 0;
    };
    // SAFETY: the thread's own, idle state. Only the call's fields are written: an open
    // NCCL group and device-time window outlive the call. Argument slots the routine's
    // spec does not name keep older values; nothing reads them.
    let e = unsafe { &mut *e };
    // SAFETY: regs points at this probe's saved registers.
    let regs = unsafe { &*ctx.regs };
    e.args[0] = regs.rdi;
    e.args[1] = regs.rsi;
    e.args[2] = regs.rdx;
    e.args[3] = regs.rcx;
    e.args[4] = regs.r8;
    e.args[5] = regs.r9;
    if uses_stack_args(spec) {
        // Arguments 7.. are on the stack above the return address (probes sit before any
        // push). SAFETY: reading the traced thread's stack into the thread's state; the
        // helper zeroes the destination when the read fails.
        unsafe {
            bpf_probe_read_user(
                e.args[6..MAX_ARGS].as_mut_ptr().cast(),
                ((MAX_ARGS - 6) * 8) as u32,
                (regs.rsp + 8) as *const core::ffi::c_void,
            )
        };
    }
    if ByteRule::from_u8(spec.rule).frees_handle() {
        // Before the handle goes: no thread may keep it cached across the free.
        crate::cache::bump();
        // The call resets the handle to MPI_*_NULL: read it now (an MPICH-ABI handle is
        // an int; `handle()` drops the upper half later).
        let i = (spec.a & 15) as usize;
        e.args[i] = read::<u64>(e.args[i]).unwrap_or(0);
    }
    e.depth = 0;
    e.routine = c.routine;
    e.cookie = packed;
    e.start_ns = unsafe { bpf_ktime_get_ns() };
    e.busy = 1;
    0
}

/// Whether any operand of `spec` is a stack argument (7th or later).
#[inline(always)]
fn uses_stack_args(spec: &ArgSpec) -> bool {
    let on_stack = |i: u8| i != N && i >= 6;
    on_stack(spec.a)
        || on_stack(spec.b)
        || on_stack(spec.c)
        || on_stack(spec.d)
        || on_stack(spec.comm)
        || on_stack(spec.peer)
}

/// Return of any MPI routine of an Open MPI library (same attach points as `mpi_entry`).
#[uretprobe]
pub fn mpi_return_ompi(ctx: RetProbeContext) -> u32 {
    on_return_probe::<{ Abi::OpenMpi as u8 }, false>(ctx)
}

/// Return of any MPI routine of an MPICH-ABI library but its datatype constructors.
#[uretprobe]
pub fn mpi_return_mpich(ctx: RetProbeContext) -> u32 {
    on_return_probe::<{ Abi::Mpich as u8 }, false>(ctx)
}

/// Return of the datatype constructors and MPI_Type_free of an MPICH-ABI library, whose
/// integer handles carry no size for derived types: the sizes are learnt here.
#[uretprobe]
pub fn mpi_return_mpich_types(ctx: RetProbeContext) -> u32 {
    on_return_probe::<{ Abi::Mpich as u8 }, true>(ctx)
}

/// One program per ABI and argument shape: with both constants, each program carries only
/// its own decoding paths, which keeps the verifier's work small.
#[inline(always)]
pub(crate) fn on_return_probe<const ABI: u8, const TYPES: bool>(ctx: RetProbeContext) -> u32 {
    let now = unsafe { bpf_ktime_get_ns() };
    let ret: i32 = ctx.ret();
    // Only counted processes have call state: no need to look the process up again.
    let e = match call_state(false) {
        // SAFETY: the thread's own entry.
        Some(e) if unsafe { (*e).busy } != 0 => unsafe { &mut *e },
        _ => {
            let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
            if is_counted(tgid) {
                with_proc_stats(tgid, |s| s.orphan_returns += 1);
            }
            return 0;
        }
    };
    if e.depth > 0 {
        e.depth -= 1;
        return 0;
    }
    let start_ns = e.start_ns;
    let tgid = e.tgid;
    // The entry's cookie: the outermost call returns through the same attach point.
    let c = Cookie::unpack(e.cookie);
    let Some(spec) = ROUTINE_SPECS.get(c.routine as u32) else {
        return 0;
    };
    let Some(layout) = LAYOUTS.get(c.layout as u32) else {
        return 0;
    };
    let spec = *spec;
    let args = &e.args;

    let cache = core::ptr::addr_of_mut!(e.cache);
    let comm = arg(args, spec.comm).and_then(|h| {
        let decode = || comm_info(ABI, layout, tgid, h);
        if ABI == Abi::Nccl as u8 {
            // NCCL's communicators are learnt and relearnt by many calls: not cached.
            decode()
        } else {
            crate::cache::comm_info(cache, handle(ABI, h), decode)
        }
    });
    let call = Call {
        abi: ABI,
        layout,
        tgid,
        args,
        ret,
        cache,
    };
    if ABI == Abi::Nccl as u8 && crate::nccl::unposted(&call, &spec) {
        with_proc_stats(tgid, |s| s.net_unposted += 1);
        e.busy = 0;
        return 0;
    }
    let out = if ABI == Abi::Nccl as u8 {
        crate::nccl::on_return(&call, &spec, comm)
    } else if TYPES {
        on_type_return(&call, &spec)
    } else {
        on_return(&call, &spec, comm)
    };
    let dur = now.saturating_sub(start_ns);

    match spec.class {
        class::INIT => with_proc_stats(tgid, |s| s.init_ns = now),
        class::FINALIZE => with_proc_stats(tgid, |s| s.finalize_ns = start_ns),
        _ => {}
    }

    let (bucket, bytes) = match out {
        Some(b) => (collector_common::size_bucket(b), b),
        None => {
            with_proc_stats(tgid, |s| s.undecoded += 1);
            (UNKNOWN_BUCKET, 0)
        }
    };
    let comm_size = comm.map(|c| c.size).unwrap_or(0);
    // Only NCCL keeps counters per communicator; MPI's are per communicator size.
    let (comm_rank, comm_id) = match comm {
        _ if ABI != Abi::Nccl as u8 => (0, 0),
        Some(c) => (c.rank, c.id),
        None => (-1, 0),
    };
    let key = CounterKey {
        tgid,
        routine: c.routine,
        parent: CounterKey::NO_PARENT,
        comm_size,
        comm_rank,
        comm_id,
        bucket,
        _pad: [0; 7],
    };
    let events = match CONFIG.get(0).map_or(0, |c| c.call_events) {
        0 => false,
        m if m & Config::EVENTS_ALL != 0 => true,
        _ => spec.matters_for_skew(),
    };
    // Read before `e` is borrowed for the counters, and only for an event.
    let ev = events.then(|| {
        let mut ev = CallEvent {
            kind: EventKind::Call as u32,
            tgid,
            tid: bpf_get_current_pid_tgid() as u32,
            routine: c.routine,
            bucket,
            comm_size,
            start_ns,
            dur_ns: dur,
            bytes,
            ..CallEvent::default()
        };
        describe_call(&mut ev, &call, &spec, comm);
        ev
    });
    crate::counters::add(e, &key, 1, bytes, dur);
    if ABI == Abi::Nccl as u8 {
        crate::nccl::after_call(e, &spec, &key, bytes, start_ns, now, ret);
    }
    if let Some(mut ev) = ev {
        emit_call(e, &mut ev);
    }
    // Last: `args` pointed into this entry.
    e.busy = 0;
    0
}

/// Fills what an event says of the call beyond its counters: the peer, the communicator
/// (local handle, shared identity, this process's rank) and what a constructor created.
#[inline(always)]
fn describe_call(ev: &mut CallEvent, c: &Call, spec: &ArgSpec, comm: Option<CommInfo>) {
    ev.peer = c.arg(spec.peer).map(int_arg).unwrap_or(-1);
    ev.comm = c.arg(spec.comm).map_or(0, |h| handle(c.abi, h));
    ev.comm_id = shared_comm_id(c.abi, ev.comm, comm);
    ev.comm_rank = comm.map_or(-1, |i| i.rank);
    if c.ret == 0 && ByteRule::from_u8(spec.rule).creates_comm() {
        ev.color = c.arg(spec.a).map(int_arg).unwrap_or(0);
        ev.created = c
            .arg(spec.d)
            .and_then(|p| read_handle(c.abi, p))
            .unwrap_or(0);
    }
}

/// The handle a call stored at `p` (an `int` in integer-handle ABIs, a pointer otherwise).
#[inline(always)]
fn read_handle(abi: u8, p: u64) -> Option<u64> {
    if abi == Abi::Mpich as u8 {
        read::<u32>(p).map(u64::from)
    } else {
        read::<u64>(p)
    }
}

/// Whether every call emits an event (a trace or a stream is open, or asked for).
#[inline(always)]
pub(crate) fn call_events_on() -> bool {
    CONFIG
        .get(0)
        .is_some_and(|c| c.call_events & Config::EVENTS_ALL != 0)
}

/// Sends a completed call of the thread whose state is `e` to userspace, numbered in the
/// thread's events (a gap tells userspace events were lost); a full ring buffer counts it
/// as dropped.
#[inline(always)]
pub(crate) fn emit_call(e: &mut CallState, ev: &mut CallEvent) {
    ev.thread_seq = e.events;
    e.events = e.events.wrapping_add(1);
    if EVENTS.output::<CallEvent>(&*ev, batched_wakeup()).is_err() {
        with_proc_stats(ev.tgid, |s| s.events_dropped += 1);
    }
}

/// Ring-buffer flags for a call event: wake the consumer only once the buffer is a quarter
/// full. Waking it for every event costs a context switch per MPI call, which on busy
/// nodes (ranks on every core) multiplies the probe cost; userspace also drains on a timer.
#[inline(always)]
fn batched_wakeup() -> u64 {
    use aya_ebpf::bindings::{
        BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE,
    };
    let avail = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    let size = EVENTS.query(BPF_RB_RING_SIZE as u64);
    if avail >= size / 4 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

#[inline(always)]
pub(crate) fn arg(args: &[u64; ARG_SLOTS], i: u8) -> Option<u64> {
    // Operands are < MAX_ARGS or NO_ARG (checked by collector-common's tests). Only the
    // mask bounds the index: a range check here lets LLVM drop the mask, and the verifier
    // then loses the bound.
    if i == N {
        None
    } else {
        Some(args[(i & 15) as usize])
    }
}

/// A returning call's decoding context.
pub(crate) struct Call<'a> {
    pub abi: u8,
    pub layout: &'a Layout,
    pub tgid: u32,
    pub args: &'a [u64; ARG_SLOTS],
    /// The routine's return value (`int`: MPI and NCCL both return 0 on success).
    pub ret: i32,
    /// The thread's handle cache.
    pub cache: *mut HandleCache,
}

impl Call<'_> {
    #[inline(always)]
    pub fn arg(&self, i: u8) -> Option<u64> {
        arg(self.args, i)
    }

    /// Size of the datatype in argument `i`.
    #[inline(always)]
    fn size(&self, i: u8) -> Option<u64> {
        let h = handle(self.abi, self.arg(i)?);
        let decode = || type_size(self.abi, self.layout, self.tgid, h);
        if self.abi == Abi::Nccl as u8 {
            // An enum: nothing to look up.
            decode()
        } else {
            crate::cache::type_size(self.cache, h, decode)
        }
    }

    /// The count in argument `i` (one element when the operand is absent).
    #[inline(always)]
    fn count(&self, i: u8) -> Option<u64> {
        if i == N {
            Some(1)
        } else if self.abi == Abi::Nccl as u8 {
            // size_t
            self.arg(i)
        } else {
            count_arg(self.arg(i)?)
        }
    }

    /// `count(a) x size(b)`.
    #[inline(always)]
    pub fn count_type(&self, a: u8, b: u8) -> Option<u64> {
        Some(self.count(a)? * self.size(b)?)
    }

    /// Sum of the int array in argument `i` over `n` entries.
    #[inline(always)]
    fn sum(&self, i: u8, n: u32) -> Option<u64> {
        sum_ints(self.arg(i)?, n)
    }

    #[inline(always)]
    fn sum_typed(&self, counts: u8, types: u8, n: u32) -> Option<u64> {
        sum_typed(
            self.abi,
            self.layout,
            self.tgid,
            self.arg(counts)?,
            self.arg(types)?,
            n,
        )
    }
}

/// Applies the routine's byte rule (and its bookkeeping side effects) at return.
#[inline(always)]
fn on_return(c: &Call, spec: &ArgSpec, comm: Option<CommInfo>) -> Option<u64> {
    let p = comm.map(|c| c.size);
    let rule = ByteRule::from_u8(spec.rule);
    if spec.class == class::P2P {
        return crate::p2p::on_return(c, spec, rule, crate::p2p::comm_key(c, spec, comm));
    }
    match rule {
        ByteRule::None => Some(0),
        ByteRule::CountType => c.count_type(spec.a, spec.b),
        ByteRule::SumCounts => Some(c.sum(spec.a, p?)? * c.size(spec.b)?),
        ByteRule::SumCountsPerPeer => (c.sum(spec.a, p?)? * c.size(spec.b)?).checked_div(p? as u64),
        ByteRule::CountAtRank => {
            let info = comm?;
            if info.rank < 0 || info.rank as u32 >= info.size {
                return None;
            }
            let n: i32 = read(c.arg(spec.a)? + info.rank as u64 * 4)?;
            Some(count_arg(n as u32 as u64)? * c.size(spec.b)?)
        }
        ByteRule::CountTypeTimesP => Some(c.count_type(spec.a, spec.b)? * p? as u64),
        ByteRule::SumCountsTypesPerPeer => c.sum_typed(spec.a, spec.b, p?)?.checked_div(p? as u64),
        // Constructors and MPI_Type_free: sizes live in Open MPI's objects; MPICH-ABI
        // libraries attach these routines to `mpi_return_mpich_types` instead.
        ByteRule::CtorProduct
        | ByteRule::CtorSum
        | ByteRule::CtorStruct
        | ByteRule::CtorProdArray
        | ByteRule::TypeFree => Some(0),
        ByteRule::CommFree => {
            crate::cache::bump();
            let h = handle(c.abi, c.args[0]);
            let _ = COMMS.remove(HandleKey {
                tgid: c.tgid,
                _pad: 0,
                handle: h,
            });
            Some(0)
        }
        ByteRule::CommCreate => Some(0),
        ByteRule::CommDup => {
            // A duplicate has its parent's size and ranks: integer-handle ABIs learn them
            // here, as they would from MPI_Comm_size on it.
            if c.abi == Abi::Mpich as u8 && c.ret == 0 {
                if let (Some(parent), Some(new)) = (comm, c.arg(spec.d).and_then(read::<u32>)) {
                    let key = HandleKey {
                        tgid: c.tgid,
                        _pad: 0,
                        handle: new as u64,
                    };
                    let _ = COMMS.insert(key, CommInfo::new(parent.size, parent.rank, 0), 0);
                    crate::cache::bump();
                }
            }
            Some(0)
        }
        rule @ (ByteRule::CommSize | ByteRule::CommRank) => {
            if c.abi == Abi::Mpich as u8 {
                learn_comm(c, spec, rule);
            }
            Some(0)
        }
        // NCCL's rules: its return program handles them (see `nccl`).
        _ => Some(0),
    }
}

/// Datatype constructors and MPI_Type_free (integer-handle ABIs): learn or forget sizes.
#[inline(always)]
fn on_type_return(c: &Call, spec: &ArgSpec) -> Option<u64> {
    match ByteRule::from_u8(spec.rule) {
        rule @ (ByteRule::CtorProduct
        | ByteRule::CtorSum
        | ByteRule::CtorStruct
        | ByteRule::CtorProdArray) => learn_type(c, spec, rule),
        ByteRule::TypeFree => {
            crate::cache::bump();
            let _ = DTYPES.remove(HandleKey {
                tgid: c.tgid,
                _pad: 0,
                handle: c.args[0] & 0xffff_ffff,
            });
        }
        _ => {}
    }
    Some(0)
}

/// Size of the type a constructor builds, from its arguments.
#[inline(always)]
fn constructed_size(c: &Call, spec: &ArgSpec, rule: ByteRule) -> Option<u64> {
    let n = c.count(spec.a)?;
    match rule {
        ByteRule::CtorProduct => Some(n * c.count(spec.c)? * c.size(spec.b)?),
        ByteRule::CtorSum => Some(c.sum(spec.c, n as u32)? * c.size(spec.b)?),
        ByteRule::CtorStruct => c.sum_typed(spec.c, spec.b, n as u32),
        ByteRule::CtorProdArray => Some(product_ints(c.arg(spec.c)?, n as u32)? * c.size(spec.b)?),
        _ => None,
    }
}

/// Records the size of a type built by a constructor, keyed by its new handle.
#[inline(always)]
fn learn_type(c: &Call, spec: &ArgSpec, rule: ByteRule) {
    let Some(size) = constructed_size(c, spec, rule) else {
        return;
    };
    let Some(new) = c.arg(spec.d).and_then(read::<u32>) else {
        return;
    };
    let _ = DTYPES.insert(
        HandleKey {
            tgid: c.tgid,
            _pad: 0,
            handle: new as u64,
        },
        size,
        0,
    );
}

/// Records a communicator's size or this process's rank in it.
#[inline(always)]
pub(crate) fn learn_comm(c: &Call, spec: &ArgSpec, rule: ByteRule) {
    let Some(h) = c.arg(spec.a) else { return };
    let Some(v) = c.arg(spec.d).and_then(read::<i32>) else {
        return;
    };
    let key = HandleKey {
        tgid: c.tgid,
        _pad: 0,
        handle: handle(c.abi, h),
    };
    // SAFETY: plain value.
    let mut info = unsafe { COMMS.get(key) }
        .copied()
        .unwrap_or(CommInfo::new(0, -1, 0));
    if rule == ByteRule::CommSize {
        info.size = v as u32;
    } else {
        info.rank = v;
    }
    let _ = COMMS.insert(key, info, 0);
    crate::cache::bump();
}
