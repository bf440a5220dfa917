//! A call in progress, as every routine's path sees it: the attachment's cookie, the
//! saved arguments and how they decode, what a communicator call teaches (MPI and NCCL
//! alike), and the call event sent to userspace.

use aya_ebpf::EbpfContext;
use collector_common::{
    comm_id, mpich,
    routines::{class, NO_ARG as N},
    Abi, ArgSpec, ByteRule, CallEvent, CallState, CommInfo, Config, Cookie, HandleCache, HandleKey,
    Layout, ARG_SLOTS,
};

use crate::{
    decode::{
        add_counts_wide, add_typed, add_typed_std, add_typed_wide, add_typed_wide_std, count_arg,
        each, handle, int_arg, mul_counts_wide, read, shared_comm_id, sum_ints, type_size,
        LoopBody, TypedSum, MAX_TYPED, UNDECODED,
    },
    maps::{add_proc_stat, COMMS, CONFIG, EVENTS},
};

#[inline(always)]
pub(crate) fn cookie(ctx: &impl EbpfContext) -> Cookie {
    Cookie::unpack(raw_cookie(ctx))
}

/// The attachment's cookie as the kernel keeps it.
#[inline(always)]
pub(crate) fn raw_cookie(ctx: &impl EbpfContext) -> u64 {
    // SAFETY: the helper only reads the attachment's cookie.
    unsafe { aya_ebpf::helpers::generated::bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// Fills what an event says of the call beyond its counters: the peer, the communicator
/// (local handle, shared identity, this process's rank) and what a constructor created.
#[inline(always)]
pub(crate) fn describe_call(ev: &mut CallEvent, c: &Call, spec: &ArgSpec, comm: Option<CommInfo>) {
    ev.peer = c.arg(spec.peer).map_or(-1, int_arg);
    ev.comm = c.arg(spec.comm).map_or(0, |h| handle(c.abi, h));
    ev.comm_id = shared_comm_id(c.abi, ev.comm, comm);
    ev.comm_rank = comm.map_or(-1, |i| i.rank);
    ev.recv_peer = -1;
    crate::p2p::describe_match(ev, c, spec);
    let creates = ByteRule::from_u8(spec.rule).creates_comm();
    if creates && c.ret != 0 {
        ev.recv_tag = CallEvent::MADE_NOTHING;
    }
    if creates && c.ret == 0 {
        ev.recv_tag = crate::instances::child_made(c.tgid, ev.comm, ev.comm_id == comm_id::WORLD);
        ev.color = c.arg(spec.a).map_or(0, int_arg);
        ev.created = c
            .arg(spec.d)
            .and_then(|p| read_handle(c.abi, p))
            .unwrap_or(0);
        crate::instances::made(c.tgid, ev.created);
        ev.tag = crate::generations::comm_gen(c.tgid, ev.created) as i32;
    }
    if spec.class == class::INIT {
        crate::instances::init_returned(c.tgid);
    }
}

/// The handle a call stored at `p` (an `int` in MPICH's ABI, a pointer otherwise),
/// normalised (as `handle`).
#[inline(always)]
pub(crate) fn read_handle(abi: u8, p: u64) -> Option<u64> {
    crate::decode::element_handle(abi, p, 0)
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
    // The buffer's fill is asked at one event in WAKEUP_CHECK_EVERY of each thread: the
    // query reads positions every other CPU writes (a cache miss each, a quarter of what
    // sending an event cost in `perf`), and a quarter of the buffer is far more than the
    // events busy threads send between two asks.
    let flags = if ev.thread_seq.is_multiple_of(WAKEUP_CHECK_EVERY) {
        batched_wakeup()
    } else {
        u64::from(aya_ebpf::bindings::BPF_RB_NO_WAKEUP)
    };
    if EVENTS.output::<CallEvent>(&*ev, flags).is_err() {
        add_proc_stat(ev.tgid, 1, |s| &mut s.dropped);
    }
}

/// A thread asks whether the consumer should be woken at one of its events in this many:
/// a wake-up comes at most 7 of each sending thread's events late (in the default 1 MiB
/// buffer, a thousand threads sending at once stay within the three quarters left).
const WAKEUP_CHECK_EVERY: u32 = 8;

/// Sends an event that is not one of the thread's calls (a device window) to userspace,
/// unnumbered; whether the ring buffer had room.
#[inline(always)]
pub(crate) fn emit_unnumbered(ev: &CallEvent) -> bool {
    EVENTS.output::<CallEvent>(ev, batched_wakeup()).is_ok()
}

/// Ring-buffer flags for an event: wake the consumer only once the buffer is a quarter
/// full. Waking it for every event costs a context switch per MPI call, which on busy
/// nodes (ranks on every core) multiplies the probe cost; userspace also drains on a timer.
/// (The ring's size is asked too: `--ring-buffer-kib` sets it at load, and a quarter of
/// the default's would never be reached in a smaller one, left to the timer alone.)
#[inline(always)]
fn batched_wakeup() -> u64 {
    use aya_ebpf::bindings::{
        BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE,
    };
    let avail = EVENTS.query(u64::from(BPF_RB_AVAIL_DATA));
    if avail >= EVENTS.query(u64::from(BPF_RB_RING_SIZE)) / 4 {
        u64::from(BPF_RB_FORCE_WAKEUP)
    } else {
        u64::from(BPF_RB_NO_WAKEUP)
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
    pub fn size(&self, i: u8) -> Option<u64> {
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
    pub fn count(&self, i: u8) -> Option<u64> {
        if i == N {
            Some(1)
        } else if self.abi == Abi::Nccl as u8 {
            // size_t
            self.arg(i)
        } else {
            count_arg(self.arg(i)?)
        }
    }

    /// The `MPI_Count` in argument `i` (one element when the operand is absent), if not
    /// negative.
    #[inline(always)]
    pub fn count_wide(&self, i: u8) -> Option<u64> {
        if i == N {
            Some(1)
        } else {
            self.arg(i).filter(|n| (*n as i64) >= 0)
        }
    }

    /// `count(a) x size(b)`.
    #[inline(always)]
    pub fn count_type(&self, a: u8, b: u8) -> Option<u64> {
        Some(self.count(a)? * self.size(b)?)
    }

    /// [`Call::count_type`], the count an `int`, or MPI-4's 64-bit `MPI_Count` for the
    /// large-count rules (`MPI_Send_c` ...).
    #[inline(always)]
    pub fn count_type_by(&self, a: u8, b: u8, rule: ByteRule) -> Option<u64> {
        let n = if matches!(
            rule,
            ByteRule::LargeCountType
                | ByteRule::LargeRecvPosted
                | ByteRule::LargeRecvStatus
                | ByteRule::LargePair
                | ByteRule::LargePairPosted
        ) {
            self.count_wide(a)?
        } else {
            self.count(a)?
        };
        Some(n * self.size(b)?)
    }

    /// Sum of the int array in argument `i` over `n` entries.
    #[inline(always)]
    pub fn sum(&self, i: u8, n: u32) -> Option<u64> {
        sum_ints(self.arg(i)?, n)
    }

    /// The sum of `B`'s body over the `n` elements of the arrays in arguments `counts` and
    /// `types` ([`Typed`]: sum(counts[i] x size(types[i])); [`TypedWide`]: the same of
    /// `MPI_Count`s; [`CountsWide`]: the `MPI_Count`s alone, `types` unused;
    /// [`ProductWide`]: their product).
    #[inline(always)]
    pub fn sum_typed<B: SumBody>(&self, counts: u8, types: u8, n: u32) -> Option<u64> {
        // `abi` is the return program's constant wherever this is inlined into it.
        if self.abi == Abi::MpiAbi as u8 {
            self.sum_typed_in::<B, true>(counts, types, n)
        } else {
            self.sum_typed_in::<B, false>(counts, types, n)
        }
    }

    /// [`Call::sum_typed`] where the caller knows whether the ABI is the MPI-5 one
    /// (`STD`): a function not inlined into its return program, whose `abi` the verifier
    /// does not know, would have both bodies verified in every program.
    #[inline(always)]
    pub fn sum_typed_in<B: SumBody, const STD: bool>(
        &self,
        counts: u8,
        types: u8,
        n: u32,
    ) -> Option<u64> {
        let total = sum_typed::<B, STD>(self, counts, types, n);
        (total != UNDECODED).then_some(total)
    }
}

/// Which `bpf_loop` body a [`Call::sum_typed`] runs: a type, so that each is a function of
/// its own with its body a constant (the verifier follows a callback passed as a value
/// through every state of its callers: the MPICH return program had none to spare).
pub(crate) trait SumBody {
    const BODY: LoopBody;
    /// The body in the MPI-5 ABI (a body of its own where it reads handles).
    const STD_BODY: LoopBody = Self::BODY;
    /// The total before the first element (1 for a product).
    const START: u64 = 0;
}

/// [`add_typed`]: `int` counts times their types' sizes.
pub(crate) struct Typed;
impl SumBody for Typed {
    const BODY: LoopBody = add_typed;
    const STD_BODY: LoopBody = add_typed_std;
}

/// [`add_typed_wide`]: `MPI_Count` counts times their types' sizes.
pub(crate) struct TypedWide;
impl SumBody for TypedWide {
    const BODY: LoopBody = add_typed_wide;
    const STD_BODY: LoopBody = add_typed_wide_std;
}

/// [`add_counts_wide`]: `MPI_Count` counts alone.
pub(crate) struct CountsWide;
impl SumBody for CountsWide {
    const BODY: LoopBody = add_counts_wide;
}

/// [`mul_counts_wide`]: the product of `MPI_Count`s (a subarray's sizes).
pub(crate) struct ProductWide;
impl SumBody for ProductWide {
    const BODY: LoopBody = mul_counts_wide;
    const START: u64 = 1;
}

/// [`Call::sum_typed`], or [`UNDECODED`]: the elements read in a `bpf_loop`. Not inlined
/// (and returning a plain number): the loop's state is in this frame, not in the return
/// program's, which has no room left.
#[inline(never)]
fn sum_typed<B: SumBody, const STD: bool>(c: &Call, counts: u8, types: u8, n: u32) -> u64 {
    let Some(counts) = c.arg(counts) else {
        return UNDECODED;
    };
    if n > MAX_TYPED {
        return UNDECODED;
    }
    let mut sum = TypedSum {
        counts,
        types: c.arg(types).unwrap_or(0),
        total: B::START,
        dt_size_off: c.layout.dt_size_off,
        tgid: c.tgid,
        abi: u32::from(c.abi),
        bad: 0,
    };
    let body = if STD { B::STD_BODY } else { B::BODY };
    if each(n, body, &mut sum) && sum.bad == 0 {
        sum.total
    } else {
        UNDECODED
    }
}

/// Whether `info` holds what `rule` (`MPI_Comm_size` or `MPI_Comm_rank`) would learn.
#[inline(always)]
pub(crate) fn comm_fact_known(info: &CommInfo, rule: ByteRule) -> bool {
    if rule == ByteRule::CommSize {
        info.size != 0
    } else {
        info.rank >= 0
    }
}

/// Whether the fact `rule` (`MPI_Comm_size` or `MPI_Comm_rank`) would learn of
/// communicator `h` (an integer handle) is known, where the thread's cache holds `h`: a
/// loop of such queries then asks the map nothing. What the cache holds is in the map (a
/// fact learnt bumps every cache), but for MPI_COMM_SELF, whose facts the cache holds as
/// constants before the map has learnt them: None for it, as for a handle not cached.
#[inline(always)]
pub(crate) fn cached_comm_fact(cache: *mut HandleCache, h: u64, rule: ByteRule) -> Option<bool> {
    let cached = crate::cache::current(cache);
    (h != 0 && (h & 0xffff_ffff) != mpich::COMM_SELF && cached.comm == h)
        .then(|| comm_fact_known(&cached.comm_info, rule))
}

/// Records a communicator's size or this process's rank in it.
#[inline(always)]
pub(crate) fn learn_comm(c: &Call, spec: &ArgSpec, rule: ByteRule) {
    let Some(h) = c.arg(spec.a) else { return };
    let h = handle(c.abi, h);
    // The return path decoded the call's communicator into the thread's cache just now.
    if cached_comm_fact(c.cache, h, rule) == Some(true) {
        return;
    }
    let key = HandleKey {
        tgid: c.tgid,
        _pad: 0,
        handle: h,
    };
    // SAFETY: plain value.
    let mut info = unsafe { COMMS.get(key) }
        .copied()
        .unwrap_or(CommInfo::new(0, -1, 0));
    // Learnt once: a handle's size and rank hold until it is freed (which forgets them).
    // So the entry may leave later calls untimed, and count them here at entry, when the
    // output argument is not written yet (`probe::left_untimed`).
    if comm_fact_known(&info, rule) {
        return;
    }
    let Some(v) = c.arg(spec.d).and_then(read::<i32>) else {
        return;
    };
    if rule == ByteRule::CommSize {
        info.size = v as u32;
    } else {
        info.rank = v;
    }
    crate::shares::remember_comm(&key, &info);
    crate::cache::bump();
}
