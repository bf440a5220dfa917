//! commtap's BPF programs.
//!
//! - `call_entry`: one uprobe serves every MPI and NCCL routine; the attach cookie names the
//!   routine and its library's layout (see `collector_common::Cookie`).
//! - `mpi_return_*` / `nccl_return`: the return probes, one per ABI and argument shape.
//! - `fabric_entry` / `fabric_return`: libfabric ops-table functions.
//! - `linker_loaded`: the dynamic linker loaded libraries; pause until they are probed.
//! - `mpi_pcontrol`: `MPI_Pcontrol`; pause while userspace reads the counters.
//! - call sites: `sites`, counted after each return when asked; `binding_entry`: a Fortran
//!   binding's entry, for the site of the MPI call it makes.
//! - `sched_fork` / `sched_exec` / `sched_exit`: follow the watched process tree.
//! - `task_registers`: a thread's saved user registers, for unwinding a blocked stack.
#![no_std]
#![feature(core_intrinsics)]
#![feature(asm_experimental_arch)]
#![allow(internal_features)]
#![no_main]

mod cache;
mod call;
mod counters;
mod decode;
mod fabric;
mod generations;
mod instances;
mod loader;
mod maps;
mod mpi;
mod nccl;
mod p2p;
mod persistent;
mod posted;
mod probe;
mod process;
mod registers;
mod session;
mod shares;
mod sites;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// Required by the BPF loader: the programs call GPL-only helpers (probe_read_user).
#[unsafe(no_mangle)]
#[unsafe(link_section = "license")]
pub static LICENSE: [u8; 4] = *b"GPL\0";
