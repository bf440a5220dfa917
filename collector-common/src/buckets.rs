//! Message-size buckets, as IBM mpitrace bins them: 0, 1-4, 5-8, 9-16, then powers of two.

/// Number of size buckets for decoded sizes (bucket 31 holds everything above 2^32 bytes).
pub const BUCKETS: u8 = 32;

/// Bucket for calls whose byte count could not be decoded (never guessed).
pub const UNKNOWN_BUCKET: u8 = 0xff;

/// Bucket index of a message of `bytes` bytes.
///
/// Bucket 0 is exactly 0 bytes, 1 is 1..=4, 2 is 5..=8, 3 is 9..=16 and bucket `k >= 2`
/// holds `2^k + 1 ..= 2^(k+1)`.
#[inline(always)]
pub const fn size_bucket(bytes: u64) -> u8 {
    if bytes == 0 {
        return 0;
    }
    if bytes <= 4 {
        return 1;
    }
    // ceil(log2(bytes)) - 1 for bytes >= 5.
    let ceil_log2 = 64 - (bytes - 1).leading_zeros();
    let b = ceil_log2 - 1;
    if b >= BUCKETS as u32 {
        BUCKETS - 1
    } else {
        b as u8
    }
}

/// Inclusive byte range `(low, high)` that a bucket covers; `high` is `u64::MAX` for the last.
pub const fn bucket_range(bucket: u8) -> (u64, u64) {
    match bucket {
        0 => (0, 0),
        1 => (1, 4),
        b if b >= BUCKETS - 1 => ((1u64 << (BUCKETS - 1)) + 1, u64::MAX),
        b => ((1u64 << b) + 1, 1u64 << (b + 1)),
    }
}

/// How every output spells a size range: `0`, `1-4`, `5-8` ... and `2147483649+` for the
/// last, open bucket. Bytes are the unit; a caller that names it appends ` B`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeLabel {
    /// Smallest size in the range.
    pub lo: u64,
    /// Largest (`u64::MAX`: open).
    pub hi: u64,
}

impl RangeLabel {
    /// The label of bucket `bucket` (see [`bucket_range`]).
    pub const fn of_bucket(bucket: u8) -> RangeLabel {
        let (lo, hi) = bucket_range(bucket);
        RangeLabel { lo, hi }
    }
}

impl core::fmt::Display for RangeLabel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match (self.lo, self.hi) {
            (lo, u64::MAX) => write!(f, "{lo}+"),
            (lo, hi) if lo == hi => write!(f, "{lo}"),
            (lo, hi) => write!(f, "{lo}-{hi}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpitrace_bins() {
        assert_eq!(size_bucket(0), 0);
        for b in 1..=4 {
            assert_eq!(size_bucket(b), 1, "{b}");
        }
        for b in 5..=8 {
            assert_eq!(size_bucket(b), 2, "{b}");
        }
        for b in 9..=16 {
            assert_eq!(size_bucket(b), 3, "{b}");
        }
        assert_eq!(size_bucket(17), 4);
        assert_eq!(size_bucket(32), 4);
        assert_eq!(size_bucket(33), 5);
        assert_eq!(size_bucket(1 << 20), 19);
        assert_eq!(size_bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn labels_are_spelled_one_way() {
        extern crate std;
        use std::string::ToString;
        assert_eq!(RangeLabel::of_bucket(0).to_string(), "0");
        assert_eq!(RangeLabel::of_bucket(2).to_string(), "5-8");
        assert_eq!(
            RangeLabel::of_bucket(BUCKETS - 1).to_string(),
            "2147483649+"
        );
    }

    #[test]
    fn ranges_agree_with_bucket_fn() {
        for bucket in 0..BUCKETS {
            let (lo, hi) = bucket_range(bucket);
            assert_eq!(size_bucket(lo), bucket);
            assert_eq!(size_bucket(hi), bucket);
        }
    }
}
