//! Each user's share of the kernel's handle maps. The maps of what a process's handles
//! stand for (its communicators, its datatypes' sizes, its collectives' instance numbers)
//! are the node's, one for every process watched: one user's processes could fill them
//! and leave every other user's calls undecoded. So a user holds at most [`USER_SHARE`]
//! entries of each; an entry past it is refused and counted (`handles_refused`), and the
//! process's calls that needed it are counted as they are when a map is full.
//!
//! A process's entries are charged to the user it ran as when it made its first, given back
//! one by one as it frees its handles, and all at once when it exits.

/// Entries in each handle map (communicators, datatypes, instance numbers), for the node.
pub const HANDLE_MAP_ENTRIES: u32 = 1 << 16;

/// The entries one user may hold in each handle map: a quarter of it.
pub const USER_SHARE: u64 = HANDLE_MAP_ENTRIES as u64 / 4;

/// The users whose holdings the kernel keeps at once (a user past it is refused).
pub const MAX_USERS: u32 = 4096;

/// The processes whose holdings the kernel keeps at once (a process past it is refused).
pub const MAX_HOLDERS: u32 = 16384;

/// The processes of one user whose holdings the kernel keeps at once: a quarter of them,
/// so that one user's many processes cannot leave another's none.
pub const USER_HOLDERS: u64 = MAX_HOLDERS as u64 / 4;

/// The handle maps a share bounds: the index of each in [`Held::entries`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleMap {
    /// Communicators: size, rank and identity (`COMMS`).
    Comms = 0,
    /// Derived datatypes' sizes (`DTYPES`).
    Dtypes = 1,
    /// Collectives' instance numbers (`COLL_SEQ`).
    CollSeq = 2,
}

/// How many handle maps a share bounds.
pub const HANDLE_MAPS: usize = 3;

/// Entries held per handle map, by a user (`USER_HANDLES`) or a process (`PROC_HANDLES`,
/// with the user charged for them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The user charged (a process's: the user it ran as at its first entry; 0 in a
    /// user's own).
    pub uid: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// A user's: its processes holding entries (0 in a process's own).
    pub processes: u64,
    /// Entries held, by [`HandleMap`].
    pub entries: [u64; HANDLE_MAPS],
}
const _: () = assert!(size_of::<Held>() == 40);
const _: () = assert!(core::mem::offset_of!(Held, processes) == 8);
const _: () = assert!(core::mem::offset_of!(Held, entries) == 16);
