//! Communicator handles' generations: how often each process freed each handle. An MPI
//! library gives a freed communicator's handle (MPICH's integer, Open MPI's pointer) to the
//! next one it makes, likely of other members; the per-peer counters key a communicator's
//! traffic by its handle and generation, so that the two are never added together.

use aya_ebpf::{macros::map, maps::HashMap};
use collector_common::{
    comm_generation,
    shares::{SharedMap, HANDLE_MAP_ENTRIES},
    HandleKey,
};

/// Per (process, communicator handle): how often the handle was freed while watched.
/// Charged to the process's user (`shares`); forgotten with the process.
#[map]
pub static COMM_FREES: HashMap<HandleKey, u64> = HashMap::with_max_entries(HANDLE_MAP_ENTRIES, 0);

/// At the entry of `MPI_Comm_free` of `h` (normalised): the next communicator given `h`
/// is its next generation. (Where the user's share is spent, the two share one: counted in
/// the process's `handles_refused`.)
#[inline(always)]
pub fn freed(tgid: u32, h: u64) {
    let next = u64::from(comm_gen(tgid, h)) + 1;
    crate::shares::remember_word(
        SharedMap::CommFrees,
        &HandleKey {
            tgid,
            _pad: 0,
            handle: h,
        },
        next,
    );
}

/// The generation of communicator handle `h` (normalised) in process `tgid`: how often it
/// was freed ([`collector_common::comm_generation`]). A global
/// function, with its own stack frame: the return paths that ask have little left.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn comm_gen(tgid: u32, h: u64) -> u32 {
    let key = HandleKey {
        tgid,
        _pad: 0,
        handle: h,
    };
    // SAFETY: plain value.
    unsafe { COMM_FREES.get(key) }.map_or(0, |n| u32::from(comm_generation(*n)))
}
