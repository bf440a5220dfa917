//! `task_registers`: a task iterator that writes a thread's user registers as its last
//! entry into the kernel saved them (`bpf_task_pt_regs`). A thread blocked in the kernel
//! keeps them while it sleeps, and its stack with them: userspace unwinds that stack to
//! find a call entered before commtap attached, which `/proc` cannot start (it gives no
//! frame pointer). Userspace runs it for one thread at a time (the link's thread filter).
//! It also reads the clock and the kernel's tick count together, which measures the tick
//! (an untimed call's entry stores the tick count alone).

use aya_ebpf::helpers::generated::{bpf_seq_write, bpf_task_pt_regs};
use collector_common::{pt_regs, ReturnSlot, UserRegisters, MAX_PROBED_RETURNS};

use crate::{maps::IDENTITY_OFFSETS, process::kernel_word};

/// The thread's calls whose returns are probed (its `uprobe_task`'s return instances,
/// latest first) into `out`: where the kernel put its trampoline in place of each one's
/// return address, and that address.
#[inline(always)]
fn probed_returns(task: *const u8, out: &mut UserRegisters) {
    let Some(off) = IDENTITY_OFFSETS.get(0) else {
        return;
    };
    if off.uret_valid == 0 {
        return;
    }
    let utask = kernel_word(task, off.uret_task_utask) as *const u8;
    if utask.is_null() {
        return;
    }
    let mut ri = kernel_word(utask, off.uret_utask_instances) as *const u8;
    for i in 0..MAX_PROBED_RETURNS {
        if ri.is_null() {
            return;
        }
        out.returns[i] = ReturnSlot {
            slot: kernel_word(ri, off.uret_ri_stack),
            to: kernel_word(ri, off.uret_ri_orig),
        };
        out.returns_n = i as u64 + 1;
        ri = kernel_word(ri, off.uret_ri_next) as *const u8;
    }
}

/// `struct bpf_iter__task`: the iterator's context.
#[repr(C)]
pub struct IterTask {
    meta: *const IterMeta,
    task: *mut core::ffi::c_void,
}

/// `struct bpf_iter_meta`: its first member is the output's `seq_file`.
#[repr(C)]
pub struct IterMeta {
    seq: *mut core::ffi::c_void,
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub extern "C" fn task_registers(ctx: *mut IterTask) -> i32 {
    // SAFETY: the kernel passes the iterator's context; its pointers are checked by the
    // verifier (a null task ends the iteration).
    unsafe {
        let task = (*ctx).task;
        if task.is_null() {
            return 0;
        }
        let regs = bpf_task_pt_regs(task.cast()) as *const u64;
        if regs.is_null() {
            return 0;
        }
        let mut out = UserRegisters {
            ip: *regs.add(pt_regs::IP),
            sp: *regs.add(pt_regs::SP),
            bp: *regs.add(pt_regs::BP),
            ..UserRegisters::default()
        };
        probed_returns(task.cast(), &mut out);
        out.now_ns = aya_ebpf::helpers::bpf_ktime_get_ns();
        out.jiffies = aya_ebpf::helpers::generated::bpf_jiffies64();
        let seq = (*(*ctx).meta).seq;
        bpf_seq_write(
            seq.cast(),
            (&raw const out).cast(),
            core::mem::size_of::<UserRegisters>() as u32,
        );
    }
    0
}
