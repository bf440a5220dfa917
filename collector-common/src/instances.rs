//! Which collective instances who-is-late follows: every one of a communicator's first
//! [`ALL_BELOW`], then one in [`stride`] (2, doubling with each doubling of the number, up
//! to [`MAX_STRIDE`]), drawn by the instance's number alone. Every member of the
//! communicator numbers its instances alike (the kernel counts them from the
//! communicator's creation), so every member, on every node, draws the same ones with
//! nothing exchanged; and an instance followed stands for `stride` of them.
//!
//! The draw hashes the number (Fibonacci hashing), so that a program slow at every k-th
//! step is neither always nor never drawn.

/// The kernel's count of a communicator made before its process was watched, or whose
/// process was detached since: its calls are not numbered (userspace aligns them by time).
pub const NOT_NUMBERED: u64 = u64::MAX;

/// The bits of a communicator's count (`COLL_SEQ`'s value) that number its collectives: the
/// number its next one takes. Every member counts them alike, so a count that overflows
/// into the bits above does so in every member at once.
pub const INSTANCE_BITS: u64 = (1 << 40) - 1;

/// Where the count of communicators made from a communicator begins in its count (above
/// [`INSTANCE_BITS`]): a constructor on it (collective over it, called by every member in
/// the same order) takes the number found there, which names the child alike in every
/// member, whichever commtap watched it (`CallEvent::made_index`).
pub const MADE_SHIFT: u32 = 40;

/// The most communicators made from one parent that are numbered; those past it are not
/// (nor would their names be), as no count past it could tell them from [`NOT_NUMBERED`].
pub const MAX_MADE: u64 = (1 << (64 - MADE_SHIFT)) - 2;

/// The handle under which the kernel's counts say that a process's `MPI_Init` returned while
/// it was watched and its world has not been met yet (no communicator's handle is 0).
pub const INIT_SEEN: u64 = 0;

/// Instances numbered below this are all followed.
pub const ALL_BELOW: u64 = 1024;

/// The most instances one followed stands for.
pub const MAX_STRIDE: u64 = 64;

/// How many instances around instance `n` one followed stands for: 1 below [`ALL_BELOW`],
/// 2 up to twice that, 4 up to four times, ... [`MAX_STRIDE`] from 32 times on (about 512
/// instances followed per doubling, then 1 in 64).
#[inline(always)]
pub const fn stride(n: u64) -> u64 {
    // Comparisons, not a count of leading zeros: BPF has no instruction for it.
    if n < ALL_BELOW {
        1
    } else if n < 2 * ALL_BELOW {
        2
    } else if n < 4 * ALL_BELOW {
        4
    } else if n < 8 * ALL_BELOW {
        8
    } else if n < 16 * ALL_BELOW {
        16
    } else if n < 32 * ALL_BELOW {
        32
    } else {
        MAX_STRIDE
    }
}

/// Whether instance `n` is followed.
#[inline(always)]
pub const fn drawn(n: u64) -> bool {
    // The top six bits of n × 2^64/φ: equidistributed over consecutive numbers, and over
    // every arithmetic progression of them.
    let top = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58;
    top & (stride(n) - 1) == 0
}

/// How many instances instance `n` stands for: [`stride`] where it is drawn, else 0.
#[inline(always)]
pub const fn weight(n: u64) -> u64 {
    if drawn(n) {
        stride(n)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instance_below_the_threshold_is_drawn() {
        assert!((0..ALL_BELOW).all(drawn));
    }

    #[test]
    fn weights_estimate_the_count_of_instances() {
        // Over each doubling the drawn instances' weights sum to about its length, and
        // over any long run to about the run's.
        for n in [2 * ALL_BELOW, 10_000, 100_000, 1_000_000] {
            let sum: u64 = (0..n).map(weight).sum();
            let err = sum.abs_diff(n) as f64 / n as f64;
            assert!(err < 0.03, "{n}: {sum}");
        }
    }

    #[test]
    fn a_periodic_slow_step_is_drawn_in_proportion() {
        // Every 64th instance slow (a checkpoint, say): drawn at about 1 in 64 of them.
        let slow = || (1_000_000..2_000_000u64).step_by(64);
        let drawn_slow = slow().filter(|n| drawn(*n)).count() as f64;
        let want = slow().count() as f64 / MAX_STRIDE as f64;
        assert!(
            (drawn_slow - want).abs() < 0.1 * want,
            "{drawn_slow} of {want}"
        );
    }

    #[test]
    fn strides_double_by_octave() {
        assert_eq!(stride(ALL_BELOW - 1), 1);
        assert_eq!(stride(ALL_BELOW), 2);
        assert_eq!(stride(4 * ALL_BELOW - 1), 4);
        assert_eq!(stride(32 * ALL_BELOW), MAX_STRIDE);
        assert_eq!(stride(u64::MAX), MAX_STRIDE);
    }
}
