//! Call durations as the kernel counts them: a log2 histogram per counter, beside the
//! counter's exact fastest and slowest call.

/// Number of duration buckets.
pub const DURATION_BUCKETS: usize = 32;

/// log2 of the upper end of bucket 0: calls under 512 ns, which is less than a uprobe pair
/// costs, land there together.
const FIRST_LOG2: u32 = 9;

/// Bucket of a call that took `ns` nanoseconds: 0 holds `[0, 512)`, bucket `i` in `1..31`
/// holds `[2^(i+8), 2^(i+9))`, and 31 everything from 2^39 ns (about 9 minutes) on.
#[inline(always)]
pub const fn duration_bucket(ns: u64) -> usize {
    if ns < 1 << FIRST_LOG2 {
        return 0;
    }
    let log2 = ns.ilog2();
    let b = (log2 + 1 - FIRST_LOG2) as usize;
    if b >= DURATION_BUCKETS {
        DURATION_BUCKETS - 1
    } else {
        b
    }
}

/// The range `[low, high)` of durations, in ns, bucket `b` holds (`high` is `u64::MAX` for
/// the last, open bucket).
pub const fn duration_range(b: usize) -> (u64, u64) {
    match b {
        0 => (0, 1 << FIRST_LOG2),
        b if b >= DURATION_BUCKETS - 1 => {
            (1 << (DURATION_BUCKETS as u32 - 2 + FIRST_LOG2), u64::MAX)
        }
        b => (
            1 << (b as u32 + FIRST_LOG2 - 1),
            1 << (b as u32 + FIRST_LOG2),
        ),
    }
}

/// The draw after `x` in a thread's sequence for sampled time (xorshift32, Marsaglia 2003:
/// period 2^32 - 1 over the non-zero states, so a non-zero `x` never gives 0). A call whose
/// routine is timed one call in N is timed when its draw is a multiple of N.
#[inline(always)]
pub const fn next_draw(mut x: u32) -> u32 {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    x
}

/// The duration histogram of one counter, in a slot of a map shared by every CPU (the
/// kernel adds atomically): per-CPU copies would cost 256 bytes per slot and CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationHist {
    /// Calls per [`duration_bucket`].
    pub calls: [u64; DURATION_BUCKETS],
}
const _: () = assert!(size_of::<DurationHist>() == 8 * DURATION_BUCKETS);

impl Default for DurationHist {
    fn default() -> Self {
        DurationHist {
            calls: [0; DURATION_BUCKETS],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_time_one_call_in_n_evenly() {
        // 64 × 10,000 draws from a thread's seed: each residue mod 64 (the one that is
        // timed, and every other) within 5% of 10,000, and never a zero state.
        let mut x = 0x9e37_79b9_u32;
        let mut seen = [0u32; 64];
        for _ in 0..64 * 10_000 {
            x = next_draw(x);
            assert_ne!(x, 0);
            seen[(x % 64) as usize] += 1;
        }
        for (r, n) in seen.iter().enumerate() {
            assert!((9_500..=10_500).contains(n), "residue {r}: {n}");
        }
    }

    #[test]
    fn ranges_agree_with_bucket_fn() {
        for b in 0..DURATION_BUCKETS {
            let (lo, hi) = duration_range(b);
            assert_eq!(duration_bucket(lo), b, "{b}");
            assert_eq!(duration_bucket(hi - 1), b, "{b}");
            if b + 1 < DURATION_BUCKETS {
                assert_eq!(duration_range(b + 1).0, hi);
            }
        }
        assert_eq!(duration_bucket(0), 0);
        assert_eq!(duration_bucket(511), 0);
        assert_eq!(duration_bucket(512), 1);
        assert_eq!(duration_bucket(1023), 1);
        assert_eq!(duration_bucket(1024), 2);
        assert_eq!(duration_bucket(u64::MAX), DURATION_BUCKETS - 1);
    }
}
