//! Each user's share of the kernel's maps that its processes grow. The maps of what a
//! process's handles stand for (its communicators, its datatypes' sizes, its collectives'
//! instance numbers, its persistent requests), its counters' slots and its per-peer
//! traffic are the node's, one
//! for every process counted: one user's processes could fill them and leave every other
//! user's calls undecoded or uncounted. So a user holds at most a share of each (a
//! percentage of the map, `Config::user_share_pct`, by default
//! [`DEFAULT_USER_SHARE_PCT`]); an entry past it is refused and counted (in
//! `handles_refused`, `counter_map_full` or `peers_full`), as one is when the map is full.
//!
//! A process's entries are charged to the user it ran as when it made its first (in a user
//! namespace, to the user who made it, or where root did, to the container it is; a
//! sub-uid, to the user given it: [`SubuidRange`]), given back one by one as it frees its
//! handles, and all at once when the daemon forgets it (after its exit or a detach).

/// Entries in each handle map (communicators, datatypes, instance numbers), for the node.
pub const HANDLE_MAP_ENTRIES: u32 = 1 << 16;

/// The share of each map one user may hold, percent, unless the daemon is told otherwise
/// (`--user-share`): half, so that one user's processes leave every other user at least
/// the other half, and one job alone on its node (the usual case) rarely meets it.
pub const DEFAULT_USER_SHARE_PCT: u32 = 50;

/// The users whose holdings the kernel keeps at once (a user past it is refused).
pub const MAX_USERS: u32 = 4096;

/// The processes whose holdings the kernel keeps at once (a process past it is refused;
/// one user's processes are a share of it too).
pub const MAX_HOLDERS: u32 = 16384;

/// The maps a share bounds: the index of each in [`Held::entries`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedMap {
    /// Communicators: size, rank and identity (`COMMS`).
    Comms = 0,
    /// Derived datatypes' sizes (`DTYPES`).
    Dtypes = 1,
    /// Collectives' instance numbers (`COLL_SEQ`).
    CollSeq = 2,
    /// Counters' slots (`COUNTER_SLOTS`).
    Counters = 3,
    /// Per-peer traffic (`PEERS`).
    Peers = 4,
    /// Persistent requests: what each start moves (`PERSISTENT`).
    Persistent = 5,
    /// Call sites (`CALL_SITES`).
    Sites = 6,
    /// Communicator handles freed: how often each (`COMM_FREES`).
    CommFrees = 7,
}

/// How many maps a share bounds.
pub const SHARED_MAPS: usize = 8;

/// The entries of each shared map, by [`SharedMap`].
pub const CAPACITY: [u64; SHARED_MAPS] = [
    HANDLE_MAP_ENTRIES as u64,
    HANDLE_MAP_ENTRIES as u64,
    HANDLE_MAP_ENTRIES as u64,
    crate::MAX_COUNTERS as u64,
    crate::MAX_PEER_COUNTERS as u64,
    crate::MAX_PERSISTENT as u64,
    crate::MAX_SITE_COUNTERS as u64,
    HANDLE_MAP_ENTRIES as u64,
];

/// The entries one user may hold of a map of `capacity` entries, with shares of `pct`
/// percent (0, a `Config` never set: the whole map).
#[inline(always)]
pub const fn share_of(capacity: u64, pct: u32) -> u64 {
    if pct == 0 || pct >= 100 {
        capacity
    } else {
        capacity * pct as u64 / 100
    }
}

/// Entries held per shared map, by a user (`USER_HELD`) or a process (`PROC_HELD`, with
/// the user charged for them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The user charged (a process's: the user it ran as at its first entry, as the module
    /// says; 0 in a user's own).
    pub uid: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// A user's: its processes holding entries (0 in a process's own).
    pub processes: u64,
    /// Entries held, by [`SharedMap`].
    pub entries: [u64; SHARED_MAPS],
}
const _: () = assert!(size_of::<Held>() == 80);
const _: () = assert!(core::mem::offset_of!(Held, processes) == 8);
const _: () = assert!(core::mem::offset_of!(Held, entries) == 16);

/// The most sub-uid ranges the kernel keeps (`SUBUIDS`); userspace reads no more.
pub const MAX_SUBUID_RANGES: u32 = 16384;

/// `SUBUIDS` holds two tables of [`MAX_SUBUID_RANGES`]: the kernel searches one while
/// userspace writes the other, then names the new one (the top bit of
/// `Config::subuid_ranges`). With one table, a process whose first entry came while it was
/// rewritten found none, and kept its raw sub-uid as its user for life.
pub const SUBUID_TABLES: u32 = 2;

/// The bit of `Config::subuid_ranges` that says its ranges are in `SUBUIDS`' second table.
pub const SUBUID_SECOND_TABLE: u32 = 1 << 31;

/// Where in `SUBUIDS` the ranges `Config::subuid_ranges` (`word`) names start, and how many.
#[inline(always)]
pub const fn subuid_table(word: u32) -> (u32, u32) {
    let count = word & !SUBUID_SECOND_TABLE;
    let count = if count < MAX_SUBUID_RANGES {
        count
    } else {
        MAX_SUBUID_RANGES
    };
    if word & SUBUID_SECOND_TABLE != 0 {
        (MAX_SUBUID_RANGES, count)
    } else {
        (0, count)
    }
}

/// A range of sub-uids (`/etc/subuid`) and the user given them: each is charged as that
/// user, who could otherwise run a process as any of them (a setuid program it made in its
/// user namespace runs as its owner outside it too).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubuidRange {
    /// The first sub-uid.
    pub start: u32,
    /// How many (the last is `start + count - 1`).
    pub count: u32,
    /// The user given them; 0 for root's, which container engines hand out (LXD): see
    /// [`SubuidRange::account`].
    pub owner: u32,
}
const _: () = assert!(size_of::<SubuidRange>() == 12);

impl SubuidRange {
    /// Whether `uid` is one of these sub-uids.
    #[inline(always)]
    pub const fn holds(&self, uid: u32) -> bool {
        uid >= self.start && uid - self.start < self.count
    }

    /// The user sub-uid `uid` of this range is charged as: the user given the range; in
    /// root's, its block of 65,536 (a container's uids span one or two, not root's share,
    /// nor one user each: a setuid program a container's uid owns runs as it outside too).
    #[inline(always)]
    pub const fn account(&self, uid: u32) -> u32 {
        if self.owner == 0 {
            uid & !0xffff
        } else {
            self.owner
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sub_uid_word_names_a_table_and_a_count_within_it() {
        assert_eq!(subuid_table(0), (0, 0));
        assert_eq!(subuid_table(7), (0, 7));
        assert_eq!(
            subuid_table(SUBUID_SECOND_TABLE | 7),
            (MAX_SUBUID_RANGES, 7)
        );
        assert_eq!(
            subuid_table(u32::MAX),
            (MAX_SUBUID_RANGES, MAX_SUBUID_RANGES)
        );
        assert_eq!(subuid_table(MAX_SUBUID_RANGES + 1), (0, MAX_SUBUID_RANGES));
    }

    #[test]
    fn a_share_is_a_percentage_of_the_map_and_never_more_than_it() {
        assert_eq!(share_of(65536, 50), 32768);
        assert_eq!(share_of(131072, 25), 32768);
        assert_eq!(share_of(65536, 0), 65536);
        assert_eq!(share_of(65536, 100), 65536);
        assert_eq!(share_of(65536, 250), 65536);
        assert_eq!(share_of(3, 1), 0);
    }
}
