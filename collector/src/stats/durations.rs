//! How long calls took, beyond their total: the exact fastest and slowest call and the
//! kernel's log2 histogram, per size bucket and per routine; merged like every count.

use collector_common::{durations::duration_range, DurationHist, DURATION_BUCKETS};
use serde::{Deserialize, Serialize};

/// The distribution of a set of calls' durations. The buckets in use are kept from the
/// first to the last that holds calls: a profile holds one of these per routine and size
/// bucket, so the 32 buckets of the kernel's histogram would weigh on a node's thousands
/// of ranks (the daemon's 10,000-rank test), where a routine's calls fill a few.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "DurationsJson", into = "DurationsJson")]
pub struct Durations {
    /// The fastest call, ns.
    pub min_ns: u64,
    /// The slowest call, ns.
    pub max_ns: u64,
    /// The bucket ([`collector_common::duration_bucket`]) of `calls[0]`.
    first: u8,
    /// Calls per bucket, from `first` on.
    calls: Vec<u64>,
}

impl Durations {
    /// The durations the kernel counted for one counter; `None` when no call was timed.
    pub fn of_counter(min_ns: u64, max_ns: u64, hist: &DurationHist) -> Option<Durations> {
        Durations::from_buckets(min_ns, max_ns, hist.calls.iter().copied().enumerate())
    }

    /// Durations from (bucket, calls) pairs; `None` when none holds calls. Buckets past the
    /// last are left out.
    pub fn from_buckets(
        min_ns: u64,
        max_ns: u64,
        buckets: impl IntoIterator<Item = (usize, u64)>,
    ) -> Option<Durations> {
        let mut d = Durations {
            min_ns,
            max_ns,
            ..Durations::default()
        };
        for (b, n) in buckets {
            if b < DURATION_BUCKETS {
                d.add(b, n);
            }
        }
        (d.timed() > 0).then_some(d)
    }

    /// Adds `n` calls to bucket `b` (< [`DURATION_BUCKETS`]).
    fn add(&mut self, b: usize, n: u64) {
        if n == 0 {
            return;
        }
        if self.calls.is_empty() {
            self.first = b as u8;
        } else if b < usize::from(self.first) {
            let grow = usize::from(self.first) - b;
            self.calls.splice(0..0, std::iter::repeat_n(0, grow));
            self.first = b as u8;
        }
        let i = b - usize::from(self.first);
        if i >= self.calls.len() {
            self.calls.resize(i + 1, 0);
        }
        self.calls[i] += n;
    }

    /// Calls in bucket `b`.
    pub fn calls_in(&self, b: usize) -> u64 {
        b.checked_sub(usize::from(self.first))
            .and_then(|i| self.calls.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// (bucket, calls) of the buckets in use, in order.
    pub fn buckets(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let first = usize::from(self.first);
        self.calls
            .iter()
            .enumerate()
            .map(move |(i, &n)| (first + i, n))
    }

    /// Calls in the histogram.
    pub fn timed(&self) -> u64 {
        self.calls.iter().sum()
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Durations) {
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        for (b, n) in other.buckets() {
            self.add(b, n);
        }
    }

    /// Merges `other` into `into`, which may hold nothing yet.
    pub fn merge_into(into: &mut Option<Durations>, other: Option<&Durations>) {
        match (into.as_mut(), other) {
            (Some(a), Some(b)) => a.merge(b),
            (None, Some(b)) => *into = Some(b.clone()),
            (_, None) => {}
        }
    }

    /// The duration below which a share `q` (0..=1) of the calls fall, to the resolution of
    /// the histogram: the upper end of the bucket holding that call, bounded by the
    /// exact extremes (so a bucket holding the slowest call answers with that call).
    pub fn quantile_ns(&self, q: f64) -> u64 {
        let total = self.timed();
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total.max(1));
        let mut seen = 0;
        for (b, n) in self.buckets() {
            seen += n;
            if seen >= rank {
                let (_, hi) = duration_range(b);
                return hi.min(self.max_ns).max(self.min_ns);
            }
        }
        self.max_ns
    }
}

impl schemars::JsonSchema for Durations {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Durations".into()
    }

    /// The JSON form's.
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        DurationsJson::json_schema(generator)
    }
}

/// The JSON form: only the buckets that hold calls, each with its range.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct DurationsJson {
    /// The fastest call, ns.
    min_ns: u64,
    /// The slowest call, ns.
    max_ns: u64,
    /// The log2 buckets holding calls, fastest first.
    buckets: Vec<DurationBucketJson>,
}

/// Calls that took from `from_ns` up to (not including) `to_ns`; no `to_ns` in the last.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct DurationBucketJson {
    /// Shortest duration the bucket holds, ns.
    from_ns: u64,
    /// Where the next bucket starts, ns (none for the last, open bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    to_ns: Option<u64>,
    /// Calls that took that long.
    calls: u64,
}

impl From<Durations> for DurationsJson {
    fn from(d: Durations) -> Self {
        let buckets = d
            .buckets()
            .filter(|&(_, n)| n > 0)
            .map(|(b, calls)| {
                let (from_ns, to) = duration_range(b);
                DurationBucketJson {
                    from_ns,
                    to_ns: (to != u64::MAX).then_some(to),
                    calls,
                }
            })
            .collect();
        DurationsJson {
            min_ns: d.min_ns,
            max_ns: d.max_ns,
            buckets,
        }
    }
}

impl From<DurationsJson> for Durations {
    fn from(j: DurationsJson) -> Self {
        let mut d = Durations {
            min_ns: j.min_ns,
            max_ns: j.max_ns,
            ..Durations::default()
        };
        for b in j.buckets {
            d.add(collector_common::duration_bucket(b.from_ns), b.calls);
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collector_common::duration_bucket;

    fn of(ns: &[u64]) -> Durations {
        let mut h = DurationHist::default();
        for &n in ns {
            h.calls[duration_bucket(n)] += 1;
        }
        Durations::of_counter(*ns.iter().min().unwrap(), *ns.iter().max().unwrap(), &h).unwrap()
    }

    #[test]
    fn merges_and_round_trips_through_json() {
        let mut a = of(&[600, 700, 5_000]);
        a.merge(&of(&[300, 1 << 45]));
        assert_eq!((a.min_ns, a.max_ns, a.timed()), (300, 1 << 45, 5));
        let json = serde_json::to_string(&a).unwrap();
        assert!(
            json.contains(r#"{"from_ns":512,"to_ns":1024,"calls":2}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Durations>(&json).unwrap(), a);
    }

    #[test]
    fn buckets_in_use_grow_both_ways() {
        let mut d = of(&[5_000]);
        d.merge(&of(&[600, 1 << 30]));
        assert_eq!(d.calls_in(duration_bucket(600)), 1);
        assert_eq!(d.calls_in(duration_bucket(5_000)), 1);
        assert_eq!(d.calls_in(duration_bucket(1 << 30)), 1);
        assert_eq!(d.calls_in(0), 0);
        assert_eq!(d.calls_in(DURATION_BUCKETS + 5), 0);
        assert_eq!(
            d.buckets().count(),
            duration_bucket(1 << 30) - duration_bucket(600) + 1
        );
    }

    #[test]
    fn quantiles_stay_within_the_extremes() {
        let d = of(&[1_000, 1_100, 1_200, 90_000]);
        // The second and third calls are in [1024, 2048).
        assert_eq!(d.quantile_ns(0.5), 2_048);
        assert_eq!(d.quantile_ns(0.75), 2_048);
        assert_eq!(d.quantile_ns(1.0), 90_000);
        assert_eq!(d.quantile_ns(0.0), 1_024);
    }
}
