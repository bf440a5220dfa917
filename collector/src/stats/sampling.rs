//! Time from sampled calls: where the kernel timed one call in N of a routine (chosen at
//! random, see `--max-overhead`), the calls and bytes are exact and the time is estimated
//! from the timed ones, with its error.

use collector_common::{durations::duration_range, CounterVal};
use serde::{Deserialize, Serialize};

use super::Durations;

/// How a routine's time was estimated where not every call was timed.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct SampledTime {
    /// Calls whose time was measured (the others were counted, not timed): the durations
    /// histogram holds these.
    pub timed_calls: u64,
    /// Half-width of the estimate's 95% confidence interval, ns: the time the calls really
    /// took lies within `time_ns` ± this in 95 of 100 such estimates.
    pub error_ns: u64,
}

impl SampledTime {
    /// Adds `other` (independent calls: their variances add) into `self`.
    pub fn merge(&mut self, other: &SampledTime) {
        self.timed_calls += other.timed_calls;
        self.error_ns = (self.error_ns as f64).hypot(other.error_ns as f64).round() as u64;
    }

    /// Merges the sampling of `other_calls` calls (`other`; absent: every call timed) into
    /// that of `calls` calls (`into`).
    pub fn merge_into(
        into: &mut Option<SampledTime>,
        calls: u64,
        other: Option<&SampledTime>,
        other_calls: u64,
    ) {
        let every = |calls| SampledTime {
            timed_calls: calls,
            error_ns: 0,
        };
        if into.is_none() && other.is_none() {
            return;
        }
        let mut merged = into.unwrap_or(every(calls));
        merged.merge(&other.copied().unwrap_or(every(other_calls)));
        *into = Some(merged);
    }
}

/// The timed calls of one routine in one process, over all its counters (sizes,
/// communicators): what a counter none of whose calls was drawn borrows.
#[derive(Clone, Debug, Default)]
pub struct Pool {
    time_ns: u64,
    timed: u64,
    durations: Option<Durations>,
}

impl Pool {
    /// Adds a counter's timed calls.
    pub fn add(&mut self, v: &CounterVal, durations: Option<&Durations>) {
        self.time_ns += v.time_ns;
        self.timed += v.timed();
        Durations::merge_into(&mut self.durations, durations);
    }
}

/// The time of a counter's calls: measured when every call was timed, else the timed
/// calls' mean times the calls (each call was timed with the same chance), with its error.
/// A counter none of whose calls was drawn takes the mean of the routine's timed calls in
/// the process (`pool`); with none there either, it adds no time (`timed_calls` 0 says so).
pub fn estimate(
    v: &CounterVal,
    durations: Option<&Durations>,
    pool: &Pool,
) -> (u64, Option<SampledTime>) {
    if v.untimed == 0 {
        return (v.time_ns, None);
    }
    let timed = v.timed();
    let calls = v.calls as f64;
    let (error, estimate) = if timed > 0 {
        let n = timed as f64;
        let mean = v.time_ns as f64 / n;
        let var = durations.map_or(0.0, |d| variance(d, mean, n));
        // Sampling without replacement from the calls: the finite-population correction.
        let standard_error = calls * (var / n * (1.0 - n / calls)).max(0.0).sqrt();
        (1.96 * standard_error, mean * calls)
    } else if let (Some(d), true) = (&pool.durations, pool.timed > 0) {
        let n = pool.timed as f64;
        let mean = pool.time_ns as f64 / n;
        let sd = variance(d, mean, n).sqrt();
        // The calls' own spread, and the borrowed mean's.
        (
            1.96 * (calls.sqrt() * sd + calls * sd / n.sqrt()),
            mean * calls,
        )
    } else {
        (0.0, 0.0)
    };
    (
        estimate.round() as u64,
        Some(SampledTime {
            timed_calls: timed,
            error_ns: error.round() as u64,
        }),
    )
}

/// The variance of `n` calls of mean `mean` from their histogram: each bucket's calls at
/// its middle, within the exact extremes.
fn variance(d: &Durations, mean: f64, n: f64) -> f64 {
    let squares: f64 = d
        .buckets()
        .map(|(b, k)| {
            let (lo, hi) = duration_range(b);
            let hi = hi.min(d.max_ns.max(lo));
            let mid = f64::midpoint(lo as f64, hi as f64).clamp(d.min_ns as f64, d.max_ns as f64);
            k as f64 * (mid - mean).powi(2)
        })
        .sum();
    squares / (n - 1.0).max(1.0)
}

#[cfg(test)]
mod tests {
    use collector_common::{duration_bucket, DurationHist};

    use super::*;

    fn counter(durations: &[u64], untimed: u64) -> (CounterVal, Option<Durations>) {
        let mut v = CounterVal::default();
        let mut h = DurationHist::default();
        for d in durations {
            v.add_call(8, *d);
            h.calls[duration_bucket(*d)] += 1;
        }
        for _ in 0..untimed {
            v.add_untimed(8);
        }
        let d = Durations::of_counter(v.min_ns, v.max_ns, &h);
        (v, d)
    }

    #[test]
    fn every_call_timed_is_measured_not_estimated() {
        let (v, d) = counter(&[1_000, 3_000], 0);
        assert_eq!(estimate(&v, d.as_ref(), &Pool::default()), (4_000, None));
    }

    #[test]
    fn equal_calls_scale_exactly_with_no_error() {
        let (v, d) = counter(&[2_000; 10], 30);
        assert_eq!(
            estimate(&v, d.as_ref(), &Pool::default()),
            (
                80_000,
                Some(SampledTime {
                    timed_calls: 10,
                    error_ns: 0
                })
            )
        );
    }

    #[test]
    fn varied_calls_have_an_error_that_shrinks_as_more_are_timed() {
        let few = counter(&[1_000, 100_000, 1_000, 100_000], 96);
        let many = counter(&[1_000, 100_000].repeat(25), 50);
        let (t, e) = estimate(&few.0, few.1.as_ref(), &Pool::default());
        assert_eq!(t, 50_500 * 100);
        let (few_err, many_err) = (
            e.expect("sampled").error_ns,
            estimate(&many.0, many.1.as_ref(), &Pool::default())
                .1
                .expect("sampled")
                .error_ns,
        );
        assert!(few_err > many_err && many_err > 0, "{few_err} {many_err}");
    }

    #[test]
    fn untimed_only_adds_calls_and_no_time() {
        let (v, d) = counter(&[], 5);
        assert_eq!(v.calls, 5);
        assert_eq!(
            estimate(&v, d.as_ref(), &Pool::default()),
            (
                0,
                Some(SampledTime {
                    timed_calls: 0,
                    error_ns: 0
                })
            )
        );
    }

    #[test]
    fn a_counter_with_no_call_timed_borrows_the_routines_mean() {
        let (timed, d) = counter(&[1_000, 3_000], 2);
        let mut pool = Pool::default();
        pool.add(&timed, d.as_ref());
        let (none, nd) = counter(&[], 10);
        let (t, s) = estimate(&none, nd.as_ref(), &pool);
        assert_eq!(t, 20_000);
        let s = s.expect("sampled");
        assert_eq!(s.timed_calls, 0);
        assert!(s.error_ns > 0, "{s:?}");
    }

    #[test]
    fn errors_of_independent_parts_add_in_quadrature() {
        let mut a = Some(SampledTime {
            timed_calls: 3,
            error_ns: 300,
        });
        SampledTime::merge_into(
            &mut a,
            9,
            Some(&SampledTime {
                timed_calls: 4,
                error_ns: 400,
            }),
            8,
        );
        assert_eq!(
            a,
            Some(SampledTime {
                timed_calls: 7,
                error_ns: 500
            })
        );
        // Calls all timed count as timed, with no error.
        SampledTime::merge_into(&mut a, 17, None, 5);
        assert_eq!(
            a,
            Some(SampledTime {
                timed_calls: 12,
                error_ns: 500
            })
        );
        let mut none = None;
        SampledTime::merge_into(&mut none, 3, None, 5);
        assert_eq!(none, None);
    }
}
