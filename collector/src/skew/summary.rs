//! From finished instances to the "Who is late" report: per rank, how often it arrived
//! last and how long it made the others wait; per routine and size, the skew's
//! distribution; the worst instances; and a sentence naming a rank that stands out.

use std::collections::BTreeMap;

use collector_common::{
    buckets::{bucket_range, RangeLabel},
    ROUTINES, UNKNOWN_BUCKET,
};
use serde::{Deserialize, Serialize};

use super::{
    instances::{Arrival, Instance, MatchCounts},
    FastMap,
};

/// The `skew` object of a profile: who arrived late at collectives, and who waited.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SkewReport {
    /// Collective instances every member of was seen at (estimated where `sampled`).
    pub instances: u64,
    /// Of the instances seen, those that each stood for several: past a communicator's
    /// first 1,024 instances who-is-late follows one in 2 to 64 (the same ones in every
    /// rank, drawn by number), and the counts and times here are estimates from them.
    #[serde(default)]
    pub sampled: u64,
    /// Instances some member of was never seen at (not watched, exited, events lost):
    /// counted, not used.
    pub incomplete: u64,
    /// Instances every member on this node arrived at, whose other members are on other
    /// nodes (a node daemon's view of a job that spans nodes): counted, not used.
    #[serde(default)]
    pub remote: u64,
    /// Instances whose skew is smaller than the error of the nodes' clock offsets (an
    /// aggregator's view): counted, nobody named.
    #[serde(default)]
    pub within_clock_error: u64,
    /// Collective calls on communicators with no shared name (made before commtap watched
    /// the process): not matched.
    pub unidentified: u64,
    /// Collective calls that could not be aligned with the other members' (attached after
    /// their instance, or no clear alignment).
    pub unaligned: u64,
    /// Call events lost before matching (a full ring buffer, a slow reader): the members
    /// they belonged to are realigned by time.
    pub lost: u64,
    /// Per rank, by rank.
    pub ranks: Vec<RankSkew>,
    /// Per routine and size bucket.
    pub routines: Vec<RoutineSkew>,
    /// The instances with the largest skew, largest first.
    pub worst: Vec<WorstInstance>,
    /// Ranks that stand out, in words (`rank 2 (node07) arrived last in ...`).
    pub findings: Vec<String>,
    /// Blocking receives that waited for their send to start (absent: per-call events
    /// were off, so point-to-point calls were not seen one by one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_sender: Option<super::late_sender::LateSenderReport>,
}

/// One rank's part in the job's collective instances.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RankSkew {
    /// World rank.
    pub rank: u32,
    /// Host name.
    pub host: String,
    /// Complete instances it was a member of.
    pub instances: u64,
    /// Instances at which the others waited for it: it arrived last (at a collective whose
    /// data flows from a root, `MPI_Bcast`/`MPI_Scatter`, it was the root and came after
    /// some of the others; at one whose data flows to a root, `MPI_Reduce`/`MPI_Gather`, it
    /// came last of the others, after the root).
    pub last: u64,
    /// Time it made the others wait: the sum of the skews of the instances where it was
    /// last, ns.
    pub caused_ns: u64,
    /// Time it waited for others: the sum over its instances of the arrival of the member
    /// it waited for (the last; at `MPI_Bcast`/`MPI_Scatter` the root; at
    /// `MPI_Reduce`/`MPI_Gather` none but the root's wait for the last) minus its own, ns.
    pub waited_ns: u64,
    /// The highest instance number it entered, on any communicator (in a job with one
    /// communicator, its count of collectives less one): in a hung job, the ranks blocked in
    /// a collective show its number, the rank they wait for a lower one. Where the kernel
    /// numbers the communicator, the number of the last instance the kernel saw it enter;
    /// else that of the last instance the rank's calls returned from.
    #[serde(default)]
    pub seq: Option<u64>,
    /// The same per routine (all sizes).
    #[serde(default)]
    pub routines: Vec<RankRoutineSkew>,
}

/// One rank's part in one routine's instances.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RankRoutineSkew {
    /// C name.
    pub routine: String,
    /// Instances at which the others waited for it.
    pub last: u64,
    /// Time it made the others wait, ns.
    pub caused_ns: u64,
    /// Time it waited for others, ns.
    pub waited_ns: u64,
}

/// Skew of one routine's instances in one size bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RoutineSkew {
    /// C name.
    pub routine: String,
    /// Size bucket (absent: bytes not decoded).
    pub bucket: Option<u8>,
    /// Smallest byte count of the bucket.
    pub min_bytes: Option<u64>,
    /// Largest byte count of the bucket.
    pub max_bytes: Option<u64>,
    /// Complete instances.
    pub instances: u64,
    /// The instances' skews, ns: the longest wait of each, last arrival minus first (at
    /// `MPI_Bcast`/`MPI_Scatter` the root's arrival minus the first of the others', 0 when
    /// the root came first; at `MPI_Reduce`/`MPI_Gather` the last of the others' minus the
    /// root's, 0 when the root came last).
    pub skew_ns: Quantiles,
    /// The instance's transfer time, the shortest member's duration: what the collective
    /// costs once everyone is there, ns.
    pub transfer_ns: Quantiles,
    /// The rank the others waited for most often (absent when nobody waited).
    pub most_last: Option<LateRank>,
}

/// The rank the others waited for most often at one routine and size.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LateRank {
    /// World rank.
    pub rank: u32,
    /// Host name.
    pub host: String,
    /// Instances at which the others waited for it.
    pub last: u64,
    /// The sum of the skews of those instances (what it made the others wait), ns.
    pub caused_ns: u64,
    /// Median skew of those instances, ns.
    pub median_ns: u64,
}

/// Quantiles of a distribution, ns. p50..p99 are within 3% (a log-linear histogram); max
/// is exact.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Quantiles {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

/// One of the worst instances.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorstInstance {
    /// C name.
    pub routine: String,
    /// The communicator's name (`world`, else a short hash shared by its members).
    pub comm: String,
    /// The instance's number on its communicator.
    pub seq: u64,
    /// The rank the others waited for (see [`RankSkew::last`]).
    pub late_rank: u32,
    /// Its host.
    pub host: String,
    /// The instance's skew (see [`RoutineSkew::skew_ns`]), ns.
    pub skew_ns: u64,
}

/// A log-linear histogram: 32 sub-buckets per power of two (about 3% wide).
#[derive(Clone, Debug, Default)]
struct Histogram {
    /// (bucket, count), by bucket: the buckets a run fills are few (tens), so a sorted
    /// vector is searched faster than a tree is walked, and holds no node per bucket.
    counts: Vec<(u16, u64)>,
    n: u64,
    max: u64,
}

const SUB_BITS: u32 = 5;

impl Histogram {
    /// Adds `v` as `w` values (an instance that stands for `w`).
    fn add(&mut self, v: u64, w: u64) {
        let i = Self::index(v);
        match self.counts.binary_search_by_key(&i, |(b, _)| *b) {
            Ok(at) => self.counts[at].1 += w,
            Err(at) => self.counts.insert(at, (i, w)),
        }
        self.n += w;
        self.max = self.max.max(v);
    }

    fn index(v: u64) -> u16 {
        if v < 1 << (SUB_BITS + 1) {
            return v as u16;
        }
        let e = v.ilog2();
        let sub = (v >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
        ((e - SUB_BITS) << SUB_BITS) as u16 + sub as u16 + (1 << SUB_BITS)
    }

    /// The middle of bucket `i`.
    fn value(i: u16) -> u64 {
        let i = u64::from(i);
        if i < 1 << (SUB_BITS + 1) {
            return i;
        }
        let e = (i >> SUB_BITS) - 1 + u64::from(SUB_BITS);
        let sub = i & ((1 << SUB_BITS) - 1);
        let low = (1u64 << e) + (sub << (e - u64::from(SUB_BITS)));
        low + (1u64 << (e - u64::from(SUB_BITS))) / 2
    }

    fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for &(i, c) in &self.counts {
            seen += c;
            if seen >= rank {
                return Self::value(i).min(self.max);
            }
        }
        self.max
    }

    fn quantiles(&self) -> Quantiles {
        Quantiles {
            p50: self.quantile(0.5),
            p90: self.quantile(0.9),
            p99: self.quantile(0.99),
            max: self.max,
        }
    }
}

/// Who waits for whom at a collective: what its data needs (Scalasca's patterns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Every member needs every other's data (`MPI_Allreduce`, `MPI_Barrier`,
    /// `MPI_Alltoall` ...; NCCL's collectives, whose rings tie every GPU to the next): each
    /// waits for the last to arrive.
    Everyone,
    /// The root's data goes to the others (`MPI_Bcast`, `MPI_Scatter`, `MPI_Scatterv`): a
    /// member waits for the root only (Late Broadcast); one that comes after the root
    /// holds nobody up.
    FromRoot,
    /// The others' data goes to the root (`MPI_Reduce`, `MPI_Gather`, `MPI_Gatherv`): only
    /// the root waits, for the last of the others (Early Reduce).
    ToRoot,
}

impl Shape {
    /// The shape of routine `routine` (an index into [`ROUTINES`]).
    pub fn of(routine: u16) -> Shape {
        let name = ROUTINES.get(routine as usize).map_or("", |r| r.name);
        match name.strip_suffix("_c").unwrap_or(name) {
            "MPI_Bcast" | "MPI_Scatter" | "MPI_Scatterv" => Shape::FromRoot,
            "MPI_Reduce" | "MPI_Gather" | "MPI_Gatherv" => Shape::ToRoot,
            _ => Shape::Everyone,
        }
    }
}

/// The member that arrived last among `arrivals` (the lower pid of two at once).
fn last_of<'a>(
    arrivals: impl Iterator<Item = (usize, &'a Arrival)>,
) -> Option<(usize, &'a Arrival)> {
    arrivals.max_by_key(|(_, a)| (a.start_ns, std::cmp::Reverse(a.pid)))
}

/// What one complete instance held up: the member the others waited for, how long, and
/// each member's wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The member waited for (an index into the arrivals); none where nobody waited.
    pub late: Option<usize>,
    /// The instance's skew: the longest wait (at a collective every member needs, the last
    /// arrival minus the first), ns.
    pub skew: u64,
    /// How far apart the arrivals that decide the verdict are (the first and last; the
    /// root and the first or last of the others), ns: nodes whose clocks are off by more
    /// could have put them the other way round.
    pub margin_ns: u64,
    /// How it was judged: a routine with a root whose root was not found among the members
    /// is judged as one every member needs.
    pub shape: Shape,
    /// The arrival the waits run to (the last's, or, from the root, the root's).
    until_ns: u64,
}

impl Verdict {
    /// The verdict on the arrivals of an instance of `routine`. A rooted collective whose
    /// root is not known among them (its rank in the communicator was not read) is judged
    /// as one every member needs.
    pub fn of(routine: u16, arrivals: &[Arrival]) -> Verdict {
        let mut roots = arrivals.iter().enumerate().filter(|(_, a)| a.root);
        // The routine's name is looked at only where a root was found: never on the path
        // of an `MPI_Allreduce`, whose calls name none.
        let root = match (roots.next(), roots.next()) {
            (Some(root), None) => Some((Shape::of(routine), root)),
            _ => None,
        };
        match root {
            Some((Shape::FromRoot, (at, root))) => {
                let first = arrivals
                    .iter()
                    .filter(|a| !a.root)
                    .map(|a| a.start_ns)
                    .min()
                    .unwrap_or(root.start_ns);
                let skew = root.start_ns.saturating_sub(first);
                Verdict {
                    late: (skew > 0).then_some(at),
                    skew,
                    margin_ns: root.start_ns.abs_diff(first),
                    shape: Shape::FromRoot,
                    until_ns: root.start_ns,
                }
            }
            Some((Shape::ToRoot, (_, root))) => {
                let Some((at, last)) =
                    last_of(arrivals.iter().enumerate().filter(|(_, a)| !a.root))
                else {
                    return Verdict::nobody(Shape::ToRoot);
                };
                let skew = last.start_ns.saturating_sub(root.start_ns);
                Verdict {
                    late: (skew > 0).then_some(at),
                    skew,
                    margin_ns: last.start_ns.abs_diff(root.start_ns),
                    shape: Shape::ToRoot,
                    until_ns: last.start_ns,
                }
            }
            _ => {
                let Some((at, last)) = last_of(arrivals.iter().enumerate()) else {
                    return Verdict::nobody(Shape::Everyone);
                };
                let first = arrivals.iter().map(|a| a.start_ns).min().unwrap_or(0);
                Verdict {
                    late: Some(at),
                    skew: last.start_ns - first,
                    margin_ns: last.start_ns - first,
                    shape: Shape::Everyone,
                    until_ns: last.start_ns,
                }
            }
        }
    }

    /// An instance without the members to judge.
    fn nobody(shape: Shape) -> Verdict {
        Verdict {
            late: None,
            skew: 0,
            margin_ns: 0,
            shape,
            until_ns: 0,
        }
    }

    /// How long member `a` waited, ns.
    pub fn waited(&self, a: &Arrival) -> u64 {
        let waits = match self.shape {
            Shape::Everyone => true,
            Shape::FromRoot => !a.root,
            Shape::ToRoot => a.root,
        };
        if waits && self.late.is_some() {
            self.until_ns.saturating_sub(a.start_ns)
        } else {
            0
        }
    }
}

#[derive(Debug, Default)]
struct PerRank {
    instances: u64,
    last: u64,
    caused_ns: u64,
    waited_ns: u64,
    /// Of `last`, the instances at which it was late by a time worth naming
    /// ([`NOTABLE_NS`]), and what they caused: lateness, not the scheduler's noise.
    late: u64,
    late_ns: u64,
}

impl PerRoutine {
    /// The process the others waited for most often, and at which instances.
    fn most_waited_for(&self) -> Option<(u32, &WaitedFor)> {
        let (&pid, at) = self.last.iter().max_by_key(|(p, l)| (l.n, **p))?;
        Some((pid, at))
    }

    fn most_last(&self, whois: Whois) -> Option<LateRank> {
        let (pid, at) = self.most_waited_for()?;
        let (rank, host) = whois(pid)?;
        Some(LateRank {
            rank,
            host,
            last: at.n,
            caused_ns: at.caused_ns,
            median_ns: at.skews.quantile(0.5),
        })
    }
}

/// The instances of one routine and size at which the others waited for one process.
#[derive(Debug, Default)]
struct WaitedFor {
    /// How many.
    n: u64,
    /// The sum of their skews, ns.
    caused_ns: u64,
    /// Their skews.
    skews: Histogram,
    /// Of them, those judged as at a collective every member needs: a routine with a root
    /// whose root was not found among the members is (see [`Verdict::of`]).
    everyone: u64,
}

#[derive(Debug, Default)]
struct PerRoutine {
    instances: u64,
    skew: Histogram,
    transfer: Histogram,
    /// Per process: instances at which the others waited for it.
    last: FastMap<u32, WaitedFor>,
    /// Per process: time it waited for others.
    waited: FastMap<u32, u64>,
}

/// Instances worth keeping as the worst.
const WORST: usize = 10;

/// Accumulates finished instances.
#[derive(Debug, Default)]
pub struct Summary {
    instances: u64,
    /// Complete instances that stood for more than one.
    sampled: u64,
    incomplete: u64,
    remote: u64,
    ranks: FastMap<u32, PerRank>,
    routines: BTreeMap<(u16, u8), PerRoutine>,
    /// (skew, routine, comm, seq, late pid), largest first.
    worst: Vec<(u64, u16, super::CommKey, u64, u32)>,
}

/// Where a process is in the job: world rank and host.
pub type Whois<'a> = &'a dyn Fn(u32) -> Option<(u32, String)>;

impl Summary {
    /// Adds one finished instance, as the `weight` instances it stands for.
    pub fn add(&mut self, inst: &Instance) {
        let w = inst.weight.max(1);
        if !inst.complete {
            if inst.is_remote() {
                self.remote += w;
            } else {
                self.incomplete += w;
            }
            return;
        }
        if inst.arrivals.len() < 2 {
            return;
        }
        self.instances += w;
        if w > 1 {
            self.sampled += 1;
        }
        let verdict = Verdict::of(inst.routine, &inst.arrivals);
        let skew = verdict.skew;
        let transfer = inst
            .arrivals
            .iter()
            .map(|a| a.end_ns.saturating_sub(a.start_ns))
            .min()
            .unwrap_or(0);
        let per = self
            .routines
            .entry((inst.routine, inst.bucket))
            .or_default();
        for a in &inst.arrivals {
            let r = self.ranks.entry(a.pid).or_default();
            r.instances += w;
            let waited = verdict.waited(a) * w;
            r.waited_ns += waited;
            *per.waited.entry(a.pid).or_default() += waited;
        }
        per.instances += w;
        per.skew.add(skew, w);
        per.transfer.add(transfer, w);
        // Nobody waited (a root that sent before the others came, or received after they
        // had all sent): nobody is late.
        let Some(late) = verdict.late.map(|i| inst.arrivals[i].pid) else {
            return;
        };
        let r = self.ranks.entry(late).or_default();
        r.last += w;
        r.caused_ns += skew * w;
        if skew >= NOTABLE_NS {
            r.late += w;
            r.late_ns += skew * w;
        }
        let l = per.last.entry(late).or_default();
        l.n += w;
        l.caused_ns += skew * w;
        l.skews.add(skew, w);
        if verdict.shape == Shape::Everyone {
            l.everyone += w;
        }
        if self.worst.len() < WORST || self.worst.last().is_some_and(|w| skew > w.0) {
            let at = self.worst.partition_point(|w| w.0 >= skew);
            self.worst
                .insert(at, (skew, inst.routine, inst.comm, inst.seq, late));
            self.worst.truncate(WORST);
        }
    }

    /// The report, with processes named by `whois` (processes it does not know are left
    /// out of the per-rank table) and their highest instance numbers by `seq`.
    pub fn report(
        &self,
        counts: MatchCounts,
        unidentified: u64,
        lost: u64,
        whois: Whois,
        seq: &dyn Fn(u32) -> Option<u64>,
    ) -> SkewReport {
        let mut ranks: Vec<RankSkew> = self
            .ranks
            .iter()
            .filter_map(|(pid, r)| {
                let (rank, host) = whois(*pid)?;
                Some(RankSkew {
                    rank,
                    host,
                    instances: r.instances,
                    last: r.last,
                    caused_ns: r.caused_ns,
                    waited_ns: r.waited_ns,
                    seq: seq(*pid),
                    routines: self.rank_routines(*pid),
                })
            })
            .collect();
        ranks.sort_by_key(|r| r.rank);
        let name = |id: u16| {
            ROUTINES
                .get(id as usize)
                .map_or("?", |r| r.name)
                .to_string()
        };
        let routines = self
            .routines
            .iter()
            .map(|(&(routine, bucket), per)| {
                let known = (bucket != UNKNOWN_BUCKET).then_some(bucket);
                let (min_bytes, max_bytes) = known.map(bucket_range).unzip();
                RoutineSkew {
                    routine: name(routine),
                    bucket: known,
                    min_bytes,
                    max_bytes,
                    instances: per.instances,
                    skew_ns: per.skew.quantiles(),
                    transfer_ns: per.transfer.quantiles(),
                    most_last: per.most_last(whois),
                }
            })
            .collect();
        let worst = self
            .worst
            .iter()
            .map(|&(skew, routine, comm, seq, pid)| {
                let (late_rank, host) = whois(pid).unwrap_or((u32::MAX, String::new()));
                WorstInstance {
                    routine: name(routine),
                    comm: comm.label(),
                    seq,
                    late_rank,
                    host,
                    skew_ns: skew,
                }
            })
            .collect();
        SkewReport {
            instances: self.instances,
            sampled: self.sampled,
            incomplete: self.incomplete,
            remote: self.remote,
            within_clock_error: 0,
            unidentified,
            unaligned: counts.unaligned + counts.conflicts,
            lost,
            ranks,
            routines,
            worst,
            findings: self.findings(whois),
            late_sender: None,
        }
    }

    /// One process's last / caused / waited per routine, all sizes together.
    fn rank_routines(&self, pid: u32) -> Vec<RankRoutineSkew> {
        let mut by: BTreeMap<u16, RankRoutineSkew> = BTreeMap::new();
        for (&(routine, _), per) in &self.routines {
            let Some(&waited) = per.waited.get(&pid) else {
                continue;
            };
            let (last, caused) = per.last.get(&pid).map_or((0, 0), |l| (l.n, l.caused_ns));
            let e = by.entry(routine).or_insert_with(|| RankRoutineSkew {
                routine: ROUTINES
                    .get(routine as usize)
                    .map_or("?", |r| r.name)
                    .to_string(),
                ..Default::default()
            });
            e.last += last;
            e.caused_ns += caused;
            e.waited_ns += waited;
        }
        by.into_values().collect()
    }

    /// A sentence per (routine, size) where one rank was last in most instances and kept
    /// the others waiting for a time worth naming; first, where no such sentence names it,
    /// one for the rank that held the others up longest of all ([`Summary::heaviest`]).
    fn findings(&self, whois: Whois) -> Vec<String> {
        let mut out = Vec::new();
        let mut named = Vec::new();
        for (&(routine, bucket), per) in &self.routines {
            if per.instances < MIN_INSTANCES {
                continue;
            }
            let Some((pid, at)) = per.most_waited_for() else {
                continue;
            };
            let Some((rank, host)) = whois(pid) else {
                continue;
            };
            let (last, caused, median) = (at.n, at.caused_ns, at.skews.quantile(0.5));
            // Said as at a collective every member needs unless all its instances were
            // judged by their root.
            let shape = if at.everyone == 0 {
                Shape::of(routine)
            } else {
                Shape::Everyone
            };
            let share = last as f64 / per.instances as f64;
            if share < STANDS_OUT || median < NOTABLE_NS {
                continue;
            }
            let size = size_in_words(bucket);
            let (share, name) = (
                share * 100.0,
                ROUTINES.get(routine as usize).map_or("?", |r| r.name),
            );
            let (median, caused) = (human_ns(median), human_ns(caused));
            named.push(pid);
            out.push(match shape {
                Shape::Everyone => format!(
                    "rank {rank} ({host}) arrived last in {share:.0}% of {name}{size} instances, {median} late on median; the other ranks waited {caused} for it"
                ),
                Shape::FromRoot => format!(
                    "rank {rank} ({host}), the root, arrived late in {share:.0}% of {name}{size} instances, {median} on median; the other ranks waited {caused} for it"
                ),
                Shape::ToRoot => format!(
                    "rank {rank} ({host}) arrived last in {share:.0}% of {name}{size} instances, {median} after the root on median; the root waited {caused} for it"
                ),
            });
        }
        if let Some((pid, said)) = self.heaviest(whois) {
            if !named.contains(&pid) {
                out.insert(0, said);
            }
        }
        out
    }

    /// The rank that held the others up longest at collectives, in words, where it holds
    /// most of all the waiting and was truly late (by [`NOTABLE_NS`] or more) at enough
    /// instances for most of it. A rank whose step takes longer is late at each step's
    /// first collective alone, too few of any routine's instances to be named by
    /// [`Summary::findings`]' rule, yet the one everybody waits for.
    fn heaviest(&self, whois: Whois) -> Option<(u32, String)> {
        let total: u64 = self.ranks.values().map(|r| r.caused_ns).sum();
        let (&pid, top) = self
            .ranks
            .iter()
            .max_by_key(|(pid, r)| (r.caused_ns, **pid))?;
        if total == 0
            || (top.caused_ns as f64) < HOLDS_MOST * total as f64
            || top.late < MIN_INSTANCES
            || top.late_ns.saturating_mul(2) < top.caused_ns
        {
            return None;
        }
        let (rank, host) = whois(pid)?;
        let ((routine, bucket), at, per) = self
            .routines
            .iter()
            .filter_map(|(key, per)| Some((*key, per.last.get(&pid)?, per)))
            .max_by_key(|(key, at, _)| (at.caused_ns, std::cmp::Reverse(*key)))?;
        let size = size_in_words(bucket);
        let name = ROUTINES.get(routine as usize).map_or("?", |r| r.name);
        let share = top.caused_ns as f64 * 100.0 / total as f64;
        Some((
            pid,
            format!(
                "rank {rank} ({host}) held the others up longest: {}, {share:.0}% of all the \
                 waiting at collectives, late by {} or more at {} instances; most at \
                 {name}{size}, where the others waited for it at {} of {} instances",
                human_ns(top.caused_ns),
                human_ns(NOTABLE_NS),
                top.late,
                at.n,
                per.instances
            ),
        ))
    }
}

/// Instances of a routine and size before a rank can be said to stand out.
const MIN_INSTANCES: u64 = 10;
/// Share of instances a rank must be last in to be named (on an oversubscribed node the
/// rank the scheduler runs last is last in about three quarters of quiet instances).
const STANDS_OUT: f64 = 0.9;
/// Median lateness below which nobody is named (scheduling noise).
const NOTABLE_NS: u64 = 100_000;
/// Share of all the waiting at collectives the rank that caused most must hold to be
/// named for it.
const HOLDS_MOST: f64 = 0.5;

/// ` (5-8 B)`: a size bucket as a sentence names it after its routine (nothing where its
/// bytes were not decoded).
fn size_in_words(bucket: u8) -> String {
    if bucket == UNKNOWN_BUCKET {
        return String::new();
    }
    let (lo, hi) = bucket_range(bucket);
    format!(" ({})", bytes_range(lo, hi))
}

/// `5-8 B`: a size range as the report names it.
pub fn bytes_range(lo: u64, hi: u64) -> String {
    format!("{} B", RangeLabel { lo, hi })
}

/// `3.1 ms`, `4.6 s`, `850 us`.
pub fn human_ns(ns: u64) -> String {
    let v = ns as f64;
    if v >= 1e9 {
        format!("{:.1} s", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.1} ms", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0} us", v / 1e3)
    } else {
        format!("{ns} ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skew::instances::Arrival;

    #[test]
    fn histogram_quantiles_within_three_percent() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.add(v * 1000, 1);
        }
        for (q, want) in [
            (0.5, 50_000_000f64),
            (0.9, 90_000_000.0),
            (0.99, 99_000_000.0),
        ] {
            let got = h.quantile(q) as f64;
            assert!((got - want).abs() / want < 0.03, "q{q}: {got} vs {want}");
        }
        assert_eq!(h.max, 100_000_000);
        for v in [0u64, 1, 63, 64, 65, 1 << 40] {
            let mid = Histogram::value(Histogram::index(v));
            assert!(
                mid.abs_diff(v) as f64 <= v as f64 * 0.03 + 1.0,
                "{v} -> {mid}"
            );
        }
    }

    #[test]
    fn instances_with_members_elsewhere_are_remote_not_incomplete() {
        let mut s = Summary::default();
        let a = |pid| Arrival {
            pid,
            start_ns: 1,
            end_ns: 2,
            root: false,
        };
        let inst = |arrivals: Vec<Arrival>, local_members| Instance {
            comm: crate::skew::CommKey::WORLD,
            seq: 0,
            routine: 0,
            bucket: 0,
            complete: false,
            local_members,
            numbered_from_start: true,
            size: 4,
            arrivals,
            weight: 1,
        };
        // Both members on this node arrived; the other two are elsewhere.
        s.add(&inst(vec![a(1), a(2)], 2));
        // One of the two on this node never came.
        s.add(&inst(vec![a(1)], 2));
        let r = s.report(MatchCounts::default(), 0, 0, &|_| None, &|_| None);
        assert_eq!((r.instances, r.remote, r.incomplete), (0, 1, 1));
    }

    #[test]
    fn the_late_rank_is_named_with_what_it_caused() {
        let r = twenty("MPI_Allreduce", 2, None);
        assert_eq!(r.instances, 20);
        assert_eq!(r.ranks[2].last, 20);
        assert_eq!(r.ranks[2].caused_ns, 20 * 3_000_000);
        assert_eq!(r.ranks[0].waited_ns, 20 * 3_000_000);
        assert_eq!(r.ranks[3].waited_ns, 20 * (3_000_000 - 30));
        assert_eq!(r.worst.len(), 10);
        assert_eq!(r.worst[0].late_rank, 2);
        assert_eq!(r.findings.len(), 1);
        assert!(
            r.findings[0].starts_with("rank 2 (node2) arrived last in 100% of MPI_Allreduce (5-8 B) instances, 3.0 ms late on median"),
            "{}",
            r.findings[0]
        );
    }

    /// 20 instances of `routine` on 4 ranks, `root` flagged the root (of a routine with one;
    /// none: no member knew its rank): rank `late` arrives 3 ms after the others, who arrive
    /// 10 ns apart by pid; every call ends at 3.1 ms.
    fn twenty(routine: &str, late: u32, root: Option<u32>) -> SkewReport {
        let routine = collector_common::routines::routine_id(routine).expect("a routine");
        let mut s = Summary::default();
        for seq in 0..20u64 {
            let base = seq * 1_000_000_000;
            let arrivals = (0..4u32)
                .map(|pid| Arrival {
                    pid,
                    start_ns: base
                        + if pid == late {
                            3_000_000
                        } else {
                            u64::from(pid) * 10
                        },
                    end_ns: base + 3_100_000,
                    root: Some(pid) == root,
                })
                .collect();
            s.add(&Instance {
                comm: crate::skew::CommKey::WORLD,
                seq,
                routine,
                bucket: 2,
                complete: true,
                local_members: 4,
                numbered_from_start: true,
                size: 4,
                arrivals,
                weight: 1,
            });
        }
        let whois = |pid: u32| Some((pid, format!("node{pid}")));
        s.report(MatchCounts::default(), 0, 0, &whois, &|_| None)
    }

    /// 20 steps of 3 ranks, each 50 `MPI_Allreduce` of 8 bytes: rank `slow` computes
    /// longer and comes 15 ms late to each step's first; the rest of each step, whoever
    /// the scheduler runs last is a few microseconds late, rank 0 most often (`noise_last`
    /// of every 49). Named by `heaviest`'s sentence alone where `slow` is given.
    fn steps(slow: Option<u32>, noise_last: u64) -> SkewReport {
        let routine = collector_common::routines::routine_id("MPI_Allreduce").expect("a routine");
        let mut s = Summary::default();
        for seq in 0..20 * 50u64 {
            let base = seq * 100_000_000;
            let first = seq % 50 == 0;
            let last = match slow {
                Some(slow) if first => slow,
                _ if seq % 49 < noise_last => 0,
                _ => 2,
            };
            let late_by = if first && slow.is_some() {
                15_000_000
            } else {
                5_000
            };
            let arrivals = (0..3u32)
                .map(|pid| Arrival {
                    pid,
                    start_ns: base + if pid == last { late_by } else { u64::from(pid) },
                    end_ns: base + late_by + 10_000,
                    root: false,
                })
                .collect();
            s.add(&Instance {
                comm: crate::skew::CommKey::WORLD,
                seq,
                routine,
                bucket: 2,
                complete: true,
                local_members: 3,
                numbered_from_start: true,
                size: 3,
                arrivals,
                weight: 1,
            });
        }
        let whois = |pid: u32| Some((pid, format!("node{pid}")));
        s.report(MatchCounts::default(), 0, 0, &whois, &|_| None)
    }

    #[test]
    fn a_rank_late_once_a_step_is_named_as_the_one_the_others_waited_for() {
        let r = steps(Some(1), 40);
        // Last at 20 of 1,000 instances: no routine's sentence names it.
        assert_eq!(r.ranks[1].last, 20);
        assert_eq!(r.routines[0].most_last.as_ref().map(|l| l.rank), Some(0));
        assert_eq!(r.findings.len(), 1, "{:?}", r.findings);
        assert_eq!(
            r.findings[0],
            "rank 1 (node1) held the others up longest: 300.0 ms, 98% of all the waiting at \
             collectives, late by 100 us or more at 20 instances; most at MPI_Allreduce \
             (5-8 B), where the others waited for it at 20 of 1000 instances"
        );
        // The scheduler's noise alone names nobody, however uneven.
        let r = steps(None, 40);
        assert!(r.ranks[0].caused_ns > 0);
        assert!(r.findings.is_empty(), "{:?}", r.findings);
    }

    #[test]
    fn a_late_root_of_a_broadcast_kept_the_others_waiting() {
        let r = twenty("MPI_Bcast", 0, Some(0));
        assert_eq!(r.ranks[0].last, 20);
        // From the first of the others (rank 1, at 10 ns) to the root.
        assert_eq!(r.ranks[0].caused_ns, 20 * (3_000_000 - 10));
        assert_eq!(r.ranks[0].waited_ns, 0);
        assert_eq!(r.ranks[3].waited_ns, 20 * (3_000_000 - 30));
        assert_eq!(r.routines[0].most_last.as_ref().map(|l| l.rank), Some(0));
        assert_eq!(r.findings.len(), 1);
        assert!(
            r.findings[0].starts_with(
                "rank 0 (node0), the root, arrived late in 100% of MPI_Bcast (5-8 B) instances"
            ),
            "{}",
            r.findings[0]
        );
    }

    #[test]
    fn a_late_member_of_a_broadcast_held_nobody_up() {
        let r = twenty("MPI_Bcast", 2, Some(0));
        assert_eq!(r.instances, 20);
        // The root came first: nobody waited, nobody is named.
        assert!(r
            .ranks
            .iter()
            .all(|k| k.last == 0 && k.caused_ns == 0 && k.waited_ns == 0));
        assert_eq!(r.routines[0].most_last, None);
        assert_eq!(r.routines[0].skew_ns.max, 0);
        assert!(r.worst.is_empty());
        assert!(r.findings.is_empty(), "{:?}", r.findings);
    }

    #[test]
    fn the_root_of_a_reduce_waited_for_its_last_member_alone() {
        let r = twenty("MPI_Reduce", 2, Some(0));
        assert_eq!(r.ranks[2].last, 20);
        assert_eq!(r.ranks[2].caused_ns, 20 * 3_000_000);
        assert_eq!(r.ranks[0].waited_ns, 20 * 3_000_000);
        for k in [1, 2, 3] {
            assert_eq!(r.ranks[k].waited_ns, 0, "rank {k} sends and leaves");
        }
        assert_eq!(r.worst[0].late_rank, 2);
        assert!(
            r.findings[0].starts_with("rank 2 (node2) arrived last in 100% of MPI_Reduce (5-8 B) instances, 3.0 ms after the root on median; the root waited"),
            "{}",
            r.findings[0]
        );
        // A late root of a gather waits for nobody, and nobody for it.
        let r = twenty("MPI_Gather", 0, Some(0));
        assert!(r.ranks.iter().all(|k| k.last == 0 && k.waited_ns == 0));
        assert!(r.findings.is_empty());
    }

    #[test]
    fn a_broadcast_whose_root_was_not_found_is_said_as_everyone_waits() {
        let r = twenty("MPI_Bcast", 2, None);
        assert_eq!(r.ranks[2].last, 20);
        assert_eq!(r.ranks[0].waited_ns, 20 * 3_000_000);
        assert!(
            r.findings[0].starts_with("rank 2 (node2) arrived last in 100% of MPI_Bcast"),
            "{}",
            r.findings[0]
        );
    }

    #[test]
    fn a_rooted_collective_without_its_root_is_judged_as_everyone_waits() {
        let mut arrivals: Vec<Arrival> = (0..3u32)
            .map(|pid| Arrival {
                pid,
                start_ns: u64::from(pid) * 100,
                end_ns: 1_000,
                root: false,
            })
            .collect();
        let bcast = collector_common::routines::routine_id("MPI_Bcast").expect("a routine");
        let v = Verdict::of(bcast, &arrivals);
        assert_eq!((v.late, v.skew), (Some(2), 200));
        assert_eq!(v.waited(&arrivals[0]), 200);
        // Two members claiming to be root (a rank not read alike): the same.
        arrivals[0].root = true;
        arrivals[1].root = true;
        assert_eq!(Verdict::of(bcast, &arrivals).late, Some(2));
        // One root, the middle one: the first of the others waited for it.
        arrivals[0].root = false;
        let v = Verdict::of(bcast, &arrivals);
        assert_eq!((v.late, v.skew, v.margin_ns), (Some(1), 100, 100));
        assert_eq!(v.waited(&arrivals[2]), 0);
    }
}
