//! How long calls took, beyond their total: the exact fastest and slowest call and the
//! kernel's log2 histogram, per size bucket and per routine; merged like every count.

use collector_common::{durations::duration_range, DurationHist, DURATION_BUCKETS};
use serde::{Deserialize, Serialize};

/// The distribution of a set of calls' durations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "DurationsJson", into = "DurationsJson")]
pub struct Durations {
    /// The fastest call, ns.
    pub min_ns: u64,
    /// The slowest call, ns.
    pub max_ns: u64,
    /// Calls per bucket ([`collector_common::duration_bucket`]).
    pub calls: [u64; DURATION_BUCKETS],
}

impl Durations {
    /// The durations the kernel counted for one counter; `None` when no call was timed.
    pub fn of_counter(min_ns: u64, max_ns: u64, hist: &DurationHist) -> Option<Durations> {
        let d = Durations {
            min_ns,
            max_ns,
            calls: hist.calls,
        };
        (d.timed() > 0).then_some(d)
    }

    /// Calls in the histogram.
    pub fn timed(&self) -> u64 {
        self.calls.iter().sum()
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Durations) {
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        for (a, b) in self.calls.iter_mut().zip(other.calls) {
            *a += b;
        }
    }

    /// Merges `other` into `into`, which may hold nothing yet.
    pub fn merge_into(into: &mut Option<Durations>, other: Option<&Durations>) {
        match (into.as_mut(), other) {
            (Some(a), Some(b)) => a.merge(b),
            (None, Some(b)) => *into = Some(*b),
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
        for (b, n) in self.calls.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (_, hi) = duration_range(b);
                return hi.min(self.max_ns).max(self.min_ns);
            }
        }
        self.max_ns
    }
}

/// The JSON form: only the buckets that hold calls, each with its range.
#[derive(Serialize, Deserialize)]
struct DurationsJson {
    min_ns: u64,
    max_ns: u64,
    buckets: Vec<DurationBucketJson>,
}

/// Calls that took from `from_ns` up to (not including) `to_ns`; no `to_ns` in the last.
#[derive(Serialize, Deserialize)]
struct DurationBucketJson {
    from_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    to_ns: Option<u64>,
    calls: u64,
}

impl From<Durations> for DurationsJson {
    fn from(d: Durations) -> Self {
        let buckets = (0..DURATION_BUCKETS)
            .filter(|&b| d.calls[b] > 0)
            .map(|b| {
                let (from_ns, to) = duration_range(b);
                DurationBucketJson {
                    from_ns,
                    to_ns: (to != u64::MAX).then_some(to),
                    calls: d.calls[b],
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
        let mut calls = [0; DURATION_BUCKETS];
        for b in j.buckets {
            calls[collector_common::duration_bucket(b.from_ns)] += b.calls;
        }
        Durations {
            min_ns: j.min_ns,
            max_ns: j.max_ns,
            calls,
        }
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
    fn quantiles_stay_within_the_extremes() {
        let d = of(&[1_000, 1_100, 1_200, 90_000]);
        // The second and third calls are in [1024, 2048).
        assert_eq!(d.quantile_ns(0.5), 2_048);
        assert_eq!(d.quantile_ns(0.75), 2_048);
        assert_eq!(d.quantile_ns(1.0), 90_000);
        assert_eq!(d.quantile_ns(0.0), 1_024);
    }
}
