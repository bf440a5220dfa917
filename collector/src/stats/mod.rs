//! The profile: per process, per routine, per size bucket and communicator size; built from
//! the kernel's ground-truth counters, merged with one function wherever profiles meet.

mod durations;
pub mod region;
mod sampling;

use std::collections::BTreeMap;

use collector_common::{
    buckets::bucket_range,
    routines::{class, Family, NO_ARG},
    CounterKey, CounterVal, DurationHist, ProcStats, Routine, ROUTINES, UNKNOWN_BUCKET,
};

use serde::{Deserialize, Serialize};

pub use durations::Durations;
pub use sampling::SampledTime;

/// A ground-truth counter as userspace reads it: key, value summed over CPUs, and the
/// duration histogram of its calls.
pub type Counter = (CounterKey, CounterVal, DurationHist);

/// Calls, bytes and time of a set of calls.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Totals {
    /// Number of calls.
    pub calls: u64,
    /// Bytes by the routine's byte rule.
    pub bytes: u64,
    /// Time inside the calls, ns.
    pub time_ns: u64,
}

impl Totals {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Totals) {
        self.calls += other.calls;
        self.bytes += other.bytes;
        self.time_ns += other.time_ns;
    }

    /// Average bytes per call (0 with no calls).
    pub fn avg_bytes(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.bytes as f64 / self.calls as f64
        }
    }
}

/// One message-size bucket of a routine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SizeBucket {
    /// Bucket index (mpitrace bins), absent for calls whose bytes were not decoded.
    pub bucket: Option<u8>,
    /// Smallest byte count the bucket holds.
    pub min_bytes: Option<u64>,
    /// Largest byte count the bucket holds.
    pub max_bytes: Option<u64>,
    /// The calls in it.
    #[serde(flatten)]
    pub totals: Totals,
    /// How long its calls took (absent when none was timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durations: Option<Durations>,
    /// Present when not every call in it was timed: `time_ns` is an estimate (see
    /// `RoutineStats::sampled_time`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_time: Option<SampledTime>,
    /// NCCL: device time of the calls whose completion the host waited for (absent when
    /// none was measured; see README "NCCL device time").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceTime>,
}

/// Device time of NCCL operations: from their enqueue to the return of the host's wait for
/// the GPU that followed, over windows holding only operations of this routine, size
/// bucket and communicator.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct DeviceTime {
    /// Operations in the measured windows.
    pub calls: u64,
    /// Their bytes (nccl-tests' size).
    pub bytes: u64,
    /// Total time of the windows, ns.
    pub time_ns: u64,
    /// Bytes x nccl-tests' bus bandwidth factor of each operation's communicator size
    /// (absent when a communicator's size was unknown).
    pub bus_bytes: Option<u64>,
}

impl DeviceTime {
    /// Nothing measured yet (the start of a merge).
    fn empty() -> DeviceTime {
        DeviceTime {
            bus_bytes: Some(0),
            ..DeviceTime::default()
        }
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &DeviceTime) {
        self.calls += other.calls;
        self.bytes += other.bytes;
        self.time_ns += other.time_ns;
        self.bus_bytes = self.bus_bytes.zip(other.bus_bytes).map(|(a, b)| a + b);
    }

    /// Algorithm bandwidth, GB/s (bytes per ns).
    pub fn algbw_gbps(&self) -> Option<f64> {
        (self.time_ns > 0).then(|| self.bytes as f64 / self.time_ns as f64)
    }

    /// Bus bandwidth, GB/s, where the communicators' sizes are known.
    pub fn busbw_gbps(&self) -> Option<f64> {
        let bus = self.bus_bytes?;
        (self.time_ns > 0).then(|| bus as f64 / self.time_ns as f64)
    }

    /// Time per operation, ns.
    pub fn avg_ns(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.time_ns as f64 / self.calls as f64
        }
    }
}

/// nccl-tests' bus bandwidth factor of an NCCL routine on `n` ranks, as (numerator,
/// denominator): AllReduce 2(n-1)/n; ReduceScatter, AllGather, AlltoAll, Gather, Scatter
/// (n-1)/n; Broadcast, Reduce, Send, Recv 1. `None` for other routines or an unknown size.
pub fn bus_factor(routine: &str, n: u32) -> Option<(u64, u64)> {
    let n = u64::from(n);
    if n == 0 {
        return None;
    }
    // The per-call-config variants (ncclAllReduceConfig ...) move the same data.
    match routine.strip_suffix("Config").unwrap_or(routine) {
        "ncclAllReduce" => Some((2 * (n - 1), n)),
        "ncclReduceScatter" | "ncclAllGather" | "ncclAlltoAll" | "ncclGather" | "ncclScatter" => {
            Some((n - 1, n))
        }
        "ncclBroadcast" | "ncclBcast" | "ncclReduce" | "ncclSend" | "ncclRecv" => Some((1, 1)),
        _ => None,
    }
}

/// All calls of one routine in one process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RoutineStats {
    /// All calls.
    #[serde(flatten)]
    pub totals: Totals,
    /// Calls whose bytes could not be decoded (counted, bytes not guessed).
    pub undecoded_calls: u64,
    /// How long the calls took, all sizes together (absent when none was timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durations: Option<Durations>,
    /// Present when not every call was timed (the routine's time was sampled to keep the
    /// probes' cost down): `time_ns` is then an estimate, from the calls timed, with its
    /// error; calls and bytes stay exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_time: Option<SampledTime>,
    /// Message-size distribution, smallest bucket first, undecoded last.
    pub sizes: Vec<SizeBucket>,
    /// Calls per communicator size ("0": unknown or none).
    pub comm_sizes: BTreeMap<u32, u64>,
    /// NCCL: the calls per communicator (MPI routines have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub communicators: Vec<CommStats>,
    /// libfabric: the calls made inside an MPI or NCCL call, by that routine.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub called_from: BTreeMap<String, Totals>,
    /// libfabric: the calls per endpoint (`struct fid_ep` address in the process, hex).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, Totals>,
}

/// One NCCL communicator's share of a routine's calls.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CommStats {
    /// Identity, the same in every member process (16 hex digits); `None` when unknown (the
    /// communicator was created before commtap attached).
    pub id: Option<String>,
    /// Number of ranks, 0 when unknown.
    pub size: u32,
    /// This process's rank in it, -1 when unknown.
    pub rank: i32,
    /// The calls on it.
    #[serde(flatten)]
    pub totals: Totals,
}

impl CommStats {
    /// The identity as the kernel keeps it (0: unknown) in its printed form.
    pub fn id_of(raw: u64) -> Option<String> {
        (raw != 0).then(|| format!("{raw:016x}"))
    }
}

impl RoutineStats {
    /// The time of the calls that were timed: all of `time_ns`, or where time was sampled
    /// the estimate's share of them (the estimate is their mean times every call).
    pub fn timed_time_ns(&self) -> u64 {
        match self.sampled_time {
            Some(s) if self.totals.calls > 0 => {
                (u128::from(self.totals.time_ns) * u128::from(s.timed_calls)
                    / u128::from(self.totals.calls)) as u64
            }
            _ => self.totals.time_ns,
        }
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &RoutineStats) {
        SampledTime::merge_into(
            &mut self.sampled_time,
            self.totals.calls,
            other.sampled_time.as_ref(),
            other.totals.calls,
        );
        self.totals.merge(&other.totals);
        self.undecoded_calls += other.undecoded_calls;
        Durations::merge_into(&mut self.durations, other.durations.as_ref());
        for b in &other.sizes {
            self.add_bucket(b);
        }
        for (size, calls) in &other.comm_sizes {
            *self.comm_sizes.entry(*size).or_default() += calls;
        }
        for (parent, t) in &other.called_from {
            self.called_from.entry(parent.clone()).or_default().merge(t);
        }
        for (ep, t) in &other.endpoints {
            self.endpoints.entry(ep.clone()).or_default().merge(t);
        }
        merge_communicators(&mut self.communicators, &other.communicators);
    }

    /// Adds the calls of `part` (its `min_bytes`/`max_bytes` are ignored: the bucket's) to
    /// its size bucket.
    fn add_bucket(&mut self, part: &SizeBucket) {
        if let Some(b) = self.sizes.iter_mut().find(|b| b.bucket == part.bucket) {
            SampledTime::merge_into(
                &mut b.sampled_time,
                b.totals.calls,
                part.sampled_time.as_ref(),
                part.totals.calls,
            );
            b.totals.merge(&part.totals);
            Durations::merge_into(&mut b.durations, part.durations.as_ref());
            if let Some(d) = &part.device {
                b.device.get_or_insert_with(DeviceTime::empty).merge(d);
            }
        } else {
            let (min, max) = part.bucket.map(bucket_range).unzip();
            self.sizes.push(SizeBucket {
                min_bytes: min,
                max_bytes: max,
                ..part.clone()
            });
            // Undecoded (None) sorts last.
            self.sizes
                .sort_by_key(|b| b.bucket.map_or(u16::MAX, u16::from));
        }
    }
}

/// Adds the communicators of `other` into `mine`, both in (id, size, rank) order, in one
/// pass: a process or job may have tens of thousands (one search and sort per communicator
/// made a report of a process with 16,000 take seconds).
fn merge_communicators(mine: &mut Vec<CommStats>, other: &[CommStats]) {
    if other.is_empty() {
        return;
    }
    fn key(c: &CommStats) -> (Option<&str>, u32, i32) {
        (c.id.as_deref(), c.size, c.rank)
    }
    // Sorted as every merge leaves them, but a profile read back may not be.
    let mut sorted;
    let other = if other.is_sorted_by_key(key) {
        other
    } else {
        sorted = other.to_vec();
        sorted.sort_by(|a, b| key(a).cmp(&key(b)));
        &sorted[..]
    };
    let mut out = Vec::with_capacity(mine.len() + other.len());
    let mut a = std::mem::take(mine).into_iter().peekable();
    let mut b = other.iter().peekable();
    loop {
        let order = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => key(x).cmp(&key(y)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => break,
        };
        let next = match order {
            std::cmp::Ordering::Less => a.next(),
            std::cmp::Ordering::Greater => b.next().cloned(),
            std::cmp::Ordering::Equal => a.next().map(|mut m| {
                if let Some(c) = b.next() {
                    m.totals.merge(&c.totals);
                }
                m
            }),
        };
        let Some(next) = next else { break };
        // One communicator twice in `other` (a profile read back): added into one.
        match out.last_mut() {
            Some(last) if key(last) == key(&next) => last.totals.merge(&next.totals),
            _ => out.push(next),
        }
    }
    *mine = out;
}

/// Makes `Health` and its reading from `ProcStats` from the kernel's list
/// ([`collector_common::kernel_health_counters`]), with what userspace counts besides; the
/// wire form (`api::convert`) is made from the same list.
macro_rules! define_health {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// What commtap could not measure for a process: shown, never hidden.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
        pub struct Health {
            /// Call events received through the ring buffer (with `dropped`: every counted
            /// call).
            #[serde(default)]
            pub events: u64,
            $( $(#[$doc])* #[serde(default)] pub $name: u64, )*
            /// libfabric calls on ops tables no endpoint of the process was seen to use (not
            /// reported as fabric operations).
            #[serde(default)]
            pub fabric_unresolved: u64,
            /// Per-peer counters of freed communicators held outside the kernel's map
            /// (moved out to make room for new ones; their traffic is in `peers`).
            #[serde(default)]
            pub peers_folded: u64,
        }

        impl From<&ProcStats> for Health {
            fn from(s: &ProcStats) -> Self {
                Health { $( $name: s.$name, )* ..Health::default() }
            }
        }

        impl Health {
            /// Adds `other` into `self` (several ranks' health together).
            pub fn merge(&mut self, other: &Health) {
                self.events += other.events;
                $( self.$name += other.$name; )*
                self.fabric_unresolved += other.fabric_unresolved;
                self.peers_folded += other.peers_folded;
            }
        }
    };
}
collector_common::kernel_health_counters!(define_health);

/// Point-to-point traffic of a rank with one peer (MPI).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PeerTraffic {
    /// The peer's world rank; `None` for what cannot be put on a world rank: receives from
    /// `MPI_ANY_SOURCE` with no status to tell the source, calls on a communicator whose
    /// creation was not seen, or whose members' ranks in it are not known.
    pub peer: Option<u32>,
    /// Set while `peer` is a rank in this communicator (its name, alike in every member:
    /// see `skew::identity`), not yet placed on a world rank: the member that is that rank
    /// has not been seen (on another node, until the aggregator merges the nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// Calls that sent to it (a Sendrecv counts once on each side).
    pub sent_calls: u64,
    /// Bytes sent to it.
    pub sent_bytes: u64,
    /// Calls that received from it.
    pub received_calls: u64,
    /// Bytes received from it (posted bytes for nonblocking receives).
    pub received_bytes: u64,
}

impl PeerTraffic {
    /// The peer's world rank, where the traffic is placed on one.
    pub fn world_peer(&self) -> Option<u32> {
        self.peer.filter(|_| self.comm.is_none())
    }

    /// Point-to-point calls not placed on a world rank.
    pub fn calls_not_on_a_world_rank(&self) -> u64 {
        if self.world_peer().is_some() {
            0
        } else {
            self.sent_calls + self.received_calls
        }
    }

    fn add(&mut self, other: &PeerTraffic) {
        self.sent_calls += other.sent_calls;
        self.sent_bytes += other.sent_bytes;
        self.received_calls += other.received_calls;
        self.received_bytes += other.received_bytes;
    }

    /// Sorts `peers` and merges entries of the same peer: world ranks first, then ranks in
    /// other communicators, then what is nobody's.
    pub fn tidy(peers: &mut Vec<PeerTraffic>) {
        let order = |p: &PeerTraffic| (p.peer.is_none(), p.comm.clone(), p.peer);
        let mut by: BTreeMap<(bool, Option<String>, Option<u32>), PeerTraffic> = BTreeMap::new();
        for p in peers.drain(..) {
            by.entry(order(&p)).and_modify(|e| e.add(&p)).or_insert(p);
        }
        peers.extend(by.into_values());
    }
}

/// A rank's rank in a communicator other than the world (named as in [`PeerTraffic::comm`]),
/// as the kernel saw it in its point-to-point calls there.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub struct CommRank {
    /// The communicator's name.
    pub comm: String,
    /// This process's rank in it.
    pub rank: u32,
}

/// Most communicator ranks kept per process, the first by name (a program making more has
/// the traffic of the others unplaced).
pub const MAX_COMM_RANKS: usize = 4096;

/// The per-peer traffic of process `tgid` from the kernel's counters, in [`PeerTraffic::tidy`]
/// order, and its ranks in the communicators its traffic names. `comm_name` names a local
/// communicator handle alike in every member (where its creation was seen); traffic on a
/// communicator it cannot name is nobody's.
pub fn peers_of(
    tgid: u32,
    counters: &[(collector_common::PeerKey, collector_common::PeerVal)],
    comm_name: impl Fn(u64, u16) -> Option<String>,
) -> (Vec<PeerTraffic>, Vec<CommRank>) {
    use collector_common::PeerKey;
    let mut peers = Vec::new();
    let mut ranks = std::collections::BTreeSet::new();
    for (k, v) in counters.iter().filter(|(k, _)| k.tgid == tgid) {
        let known = |r: i32| u32::try_from(r).ok();
        let (peer, comm) = if k.comm == PeerKey::WORLD {
            (known(k.peer), None)
        } else {
            match comm_name(k.comm, k.gen) {
                Some(name) if known(k.me).is_some() => {
                    ranks.insert(CommRank {
                        comm: name.clone(),
                        rank: k.me as u32,
                    });
                    (known(k.peer), known(k.peer).map(|_| name))
                }
                _ => (None, None),
            }
        };
        let (sent, received) = if k.dir == PeerKey::SENT {
            ((v.calls, v.bytes), (0, 0))
        } else {
            ((0, 0), (v.calls, v.bytes))
        };
        peers.push(PeerTraffic {
            peer,
            comm,
            sent_calls: sent.0,
            sent_bytes: sent.1,
            received_calls: received.0,
            received_bytes: received.1,
        });
    }
    PeerTraffic::tidy(&mut peers);
    // The first by name, not by the counters' order: members of the same communicators
    // keep the same ones, and place each other's traffic there.
    (peers, ranks.into_iter().take(MAX_COMM_RANKS).collect())
}

/// Routines by name, ordered as the routine table orders them.
pub type Routines = BTreeMap<String, RoutineStats>;

/// The transport libraries commtap probes beneath MPI and NCCL: their operations' name
/// prefix, the library's name, and MPICH's netmod over it.
pub const TRANSPORTS: [(&str, &str, &str); 2] =
    [("fi_", "libfabric", "ofi"), ("ucp_", "UCX", "ucx")];

/// Those of [`TRANSPORTS`] that the MPI or NCCL calls in `routines` made operations
/// through.
pub fn transports_beneath(routines: &Routines) -> impl Iterator<Item = &(&str, &str, &str)> {
    TRANSPORTS.iter().filter(|(prefix, ..)| {
        routines
            .iter()
            .any(|(name, s)| name.starts_with(prefix) && !s.called_from.is_empty())
    })
}

/// What an MPI says of its transport, an MPICH device built with several netmods (`ch4:ucx
/// ofi`: one is chosen at `MPI_Init`) narrowed to the one its calls' operations in
/// `routines` went through (`ch4:ucx`).
pub fn transport_used(said: &str, routines: &Routines) -> String {
    if let Some(netmods) = said.strip_prefix("ch4:").filter(|n| n.contains(' ')) {
        if let Some((.., netmod)) =
            transports_beneath(routines).find(|(.., n)| netmods.split(' ').any(|m| m == *n))
        {
            return format!("ch4:{netmod}");
        }
    }
    said.to_string()
}

/// Builds the per-routine statistics of process `tgid` from the kernel's counters and NCCL
/// device-time windows.
pub fn routines_of(
    tgid: u32,
    counters: &[Counter],
    device: &[(CounterKey, CounterVal)],
) -> Routines {
    let mut out = Routines::new();
    let mine: Vec<(&CounterKey, &CounterVal, Option<Durations>)> = counters
        .iter()
        .filter(|(k, ..)| k.tgid == tgid)
        .map(|(k, v, hist)| (k, v, Durations::of_counter(v.min_ns, v.max_ns, hist)))
        .collect();
    // Only routines with untimed calls borrow from a pool (all their counters feed it).
    let mut pools: BTreeMap<u16, sampling::Pool> = mine
        .iter()
        .filter(|(_, v, _)| v.untimed > 0)
        .map(|(k, ..)| (k.routine, sampling::Pool::default()))
        .collect();
    for (k, v, durations) in &mine {
        if let Some(pool) = pools.get_mut(&k.routine) {
            pool.add(v, durations.as_ref());
        }
    }
    let no_pool = sampling::Pool::default();
    // NCCL communicators per routine, gathered apart: merged counter by counter, each would
    // be a pass over all the routine's others.
    type CommKey = (Option<String>, u32, i32);
    let mut communicators: BTreeMap<&'static str, BTreeMap<CommKey, Totals>> = BTreeMap::new();
    for (k, v, durations) in mine {
        let Some(routine) = shown(k) else {
            continue;
        };
        let pool = pools.get(&k.routine).unwrap_or(&no_pool);
        let (time_ns, sampled_time) = sampling::estimate(v, durations.as_ref(), pool);
        let totals = Totals {
            calls: v.calls,
            bytes: v.bytes,
            time_ns,
        };
        let bucket = (k.bucket != UNKNOWN_BUCKET).then_some(k.bucket);
        let mut one = RoutineStats {
            totals,
            sampled_time,
            ..Default::default()
        };
        if bucket.is_none() {
            one.undecoded_calls = v.calls;
        }
        one.add_bucket(&SizeBucket {
            bucket,
            totals,
            durations: durations.clone(),
            sampled_time,
            ..SizeBucket::default()
        });
        one.durations = durations;
        one.comm_sizes.insert(k.comm_size, v.calls);
        if routine.family() == Family::Nccl && routine.spec.comm != NO_ARG {
            communicators
                .entry(routine.name)
                .or_default()
                .entry((CommStats::id_of(k.object), k.comm_size, k.comm_rank))
                .or_default()
                .merge(&totals);
        }
        if let Some(parent) = ROUTINES.get(k.parent as usize) {
            one.called_from.insert(parent.name.to_string(), totals);
        }
        if routine.family() == Family::Fabric && k.object != 0 {
            // The kernel keys libfabric calls by endpoint (the call's first argument).
            one.endpoints.insert(format!("{:#x}", k.object), totals);
        }
        out.entry(routine.name.to_string()).or_default().merge(&one);
    }
    for (routine, comms) in communicators {
        let stats = out.entry(routine.to_string()).or_default();
        stats.communicators = comms
            .into_iter()
            .map(|((id, size, rank), totals)| CommStats {
                id,
                size,
                rank,
                totals,
            })
            .collect();
    }
    for (k, v) in device.iter().filter(|(k, _)| k.tgid == tgid) {
        let Some(routine) = ROUTINES.get(k.routine as usize) else {
            continue;
        };
        let bucket = (k.bucket != UNKNOWN_BUCKET).then_some(k.bucket);
        let d = DeviceTime {
            calls: v.calls,
            bytes: v.bytes,
            time_ns: v.time_ns,
            bus_bytes: bus_factor(routine.name, k.comm_size).map(|(a, b)| v.bytes * a / b),
        };
        let stats = out.entry(routine.name.to_string()).or_default();
        stats.add_bucket(&SizeBucket {
            bucket,
            device: Some(d),
            ..SizeBucket::default()
        });
    }
    out
}

/// Whether a counter holds calls the profile shows as a routine's: all but libfabric
/// calls whose endpoint did not show which table their function is in.
fn shown(k: &CounterKey) -> Option<&'static Routine> {
    let routine = ROUTINES.get(k.routine as usize)?;
    (k.flags & CounterKey::UNRESOLVED_TABLE == 0).then_some(routine)
}

/// libfabric calls of `tgid` whose endpoint did not show which table their function is in
/// (a function of another table of the same shape, connection management say).
pub fn fabric_unresolved(tgid: u32, counters: &[Counter]) -> u64 {
    counters
        .iter()
        .filter(|(k, ..)| {
            k.tgid == tgid && shown(k).is_none() && (k.routine as usize) < ROUTINES.len()
        })
        .map(|(_, v, _)| v.calls)
        .sum()
}

/// MPI communication time of a process: every MPI routine but MPI_Init and MPI_Finalize.
/// NCCL's times are enqueue times, not communication, and are not part of it.
pub fn communication_ns(routines: &Routines) -> u64 {
    routines
        .iter()
        .filter(|(name, _)| is_communication(name))
        .map(|(_, r)| r.totals.time_ns)
        .sum()
}

/// Whether a routine's time is communication time (see [`communication_ns`]).
pub fn is_communication(name: &str) -> bool {
    collector_common::routines::routine_id(name).is_none_or(is_communication_id)
}

/// [`is_communication`] of the routine with index `id` in `ROUTINES`.
pub fn is_communication_id(id: u16) -> bool {
    ROUTINES.get(usize::from(id)).is_some_and(|r| {
        r.family() == Family::Mpi && !matches!(r.spec.class, class::INIT | class::FINALIZE)
    })
}

/// The routines of `family` in the order mpitrace lists them: the routine table's order.
pub fn table_order(routines: &Routines, family: Family) -> Vec<(&String, &RoutineStats)> {
    let id = |name: &str| collector_common::routines::routine_id(name);
    let mut v: Vec<_> = routines
        .iter()
        .filter(|(name, _)| {
            id(name).map_or(family == Family::Mpi, |i| {
                ROUTINES[i as usize].family() == family
            })
        })
        .collect();
    v.sort_by_key(|(name, _)| id(name).unwrap_or(u16::MAX));
    v
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn communicators_merge_in_order_adding_the_same_ones() {
        let comm = |id: Option<&str>, size: u32, calls: u64| CommStats {
            id: id.map(String::from),
            size,
            rank: 0,
            totals: Totals {
                calls,
                bytes: calls * 8,
                time_ns: 0,
            },
        };
        let mut mine = vec![
            comm(None, 2, 1),
            comm(Some("a"), 2, 2),
            comm(Some("c"), 4, 3),
        ];
        // Not in order, and one twice, as a profile read back may be.
        let other = [
            comm(Some("c"), 4, 10),
            comm(None, 2, 20),
            comm(Some("b"), 8, 30),
            comm(Some("b"), 8, 5),
        ];
        merge_communicators(&mut mine, &other);
        let got: Vec<(Option<&str>, u32, u64, u64)> = mine
            .iter()
            .map(|c| (c.id.as_deref(), c.size, c.totals.calls, c.totals.bytes))
            .collect();
        assert_eq!(
            got,
            [
                (None, 2, 21, 168),
                (Some("a"), 2, 2, 16),
                (Some("b"), 8, 35, 280),
                (Some("c"), 4, 13, 104),
            ]
        );
    }

    /// An MPICH built with two netmods is narrowed to the one its MPI calls' operations went
    /// through; other transports, and a device whose calls made none, stay as said.
    #[test]
    fn a_device_of_several_netmods_is_narrowed_by_the_operations_made() {
        let mut routines = Routines::new();
        assert_eq!(transport_used("ch4:ucx ofi", &routines), "ch4:ucx ofi");
        // UCX's own calls (no MPI call made them) do not tell.
        routines.insert("ucp_tag_send_nbx".into(), RoutineStats::default());
        assert_eq!(transport_used("ch4:ucx ofi", &routines), "ch4:ucx ofi");
        let mut made = RoutineStats::default();
        made.called_from
            .insert("MPI_Send".into(), Totals::default());
        routines.insert("fi_tagged_send".into(), made);
        assert_eq!(transport_used("ch4:ucx ofi", &routines), "ch4:ofi");
        assert_eq!(transport_used("ch4:ucx", &routines), "ch4:ucx");
        assert_eq!(transport_used("pml ob1", &routines), "pml ob1");
        assert_eq!(
            transports_beneath(&routines)
                .map(|(_, library, _)| *library)
                .collect::<Vec<_>>(),
            ["libfabric"]
        );
    }

    /// A counter key of an MPI routine (or an NCCL one on no known communicator).
    pub(crate) fn key(tgid: u32, routine: &str, bucket: u8, comm_size: u32) -> CounterKey {
        let routine = collector_common::routines::routine_id(routine).unwrap();
        CounterKey {
            tgid,
            routine,
            parent: CounterKey::NO_PARENT,
            comm_size,
            comm_rank: 0,
            object: 0,
            bucket,
            flags: 0,
            _pad: [0; 6],
        }
    }

    /// Traffic on the world goes to world ranks; on a named communicator to that
    /// communicator's ranks (with this process's rank there); on an unnamed one, or where
    /// this process's rank there is unknown, to nobody.
    #[test]
    fn peers_are_kept_by_world_rank_or_by_rank_in_a_named_communicator() {
        use collector_common::{PeerKey, PeerVal};
        let k = |comm, peer, dir, me| PeerKey {
            tgid: 7,
            peer,
            comm,
            dir,
            gen: 0,
            me,
        };
        let v = |calls, bytes| PeerVal { calls, bytes };
        let counters = vec![
            (k(PeerKey::WORLD, 1, PeerKey::SENT, 0), v(2, 16)),
            (k(PeerKey::WORLD, 1, PeerKey::RECEIVED, 0), v(1, 8)),
            (k(0x10, 1, PeerKey::SENT, 0), v(3, 30)),
            (k(0x10, PeerKey::ANY, PeerKey::RECEIVED, 0), v(1, 4)),
            (k(0x20, 0, PeerKey::SENT, 1), v(5, 50)),
            (k(0x30, 0, PeerKey::SENT, PeerKey::ANY), v(7, 70)),
            // 0x10 freed and given to another communicator, where this process is rank 1.
            (
                PeerKey {
                    gen: 1,
                    ..k(0x10, 2, PeerKey::SENT, 1)
                },
                v(4, 40),
            ),
            (
                PeerKey {
                    tgid: 8,
                    ..k(PeerKey::WORLD, 0, PeerKey::SENT, 0)
                },
                v(9, 9),
            ),
        ];
        let name = |h: u64, gen: u16| (h != 0x20).then(|| format!("c{h:x}.{gen}"));
        let (peers, ranks) = peers_of(7, &counters, name);
        let t = |peer, comm: Option<&str>, sent: (u64, u64), received: (u64, u64)| PeerTraffic {
            peer,
            comm: comm.map(String::from),
            sent_calls: sent.0,
            sent_bytes: sent.1,
            received_calls: received.0,
            received_bytes: received.1,
        };
        assert_eq!(
            peers,
            vec![
                t(Some(1), None, (2, 16), (1, 8)),
                t(Some(1), Some("c10.0"), (3, 30), (0, 0)),
                t(Some(2), Some("c10.1"), (4, 40), (0, 0)),
                t(None, None, (5 + 7, 50 + 70), (1, 4)),
            ]
        );
        // A rank unknown (0x30) or a communicator unnamed (0x20) teaches nothing.
        assert_eq!(
            ranks,
            vec![
                CommRank {
                    comm: "c10.0".into(),
                    rank: 0
                },
                CommRank {
                    comm: "c10.1".into(),
                    rank: 1
                }
            ]
        );
        assert_eq!(peers[1].world_peer(), None);
        assert_eq!(
            peers
                .iter()
                .map(PeerTraffic::calls_not_on_a_world_rank)
                .sum::<u64>(),
            3 + 4 + 5 + 7 + 1
        );
    }

    #[test]
    fn counters_fold_into_routines() {
        let c = vec![
            (
                key(7, "MPI_Allreduce", 2, 4),
                CounterVal {
                    calls: 10,
                    bytes: 80,
                    time_ns: 100,
                    ..CounterVal::default()
                },
                DurationHist::default(),
            ),
            (
                key(7, "MPI_Allreduce", 2, 2),
                CounterVal {
                    calls: 5,
                    bytes: 40,
                    time_ns: 50,
                    ..CounterVal::default()
                },
                DurationHist::default(),
            ),
            (
                key(7, "MPI_Allreduce", 10, 4),
                CounterVal {
                    calls: 1,
                    bytes: 2000,
                    time_ns: 9,
                    ..CounterVal::default()
                },
                DurationHist::default(),
            ),
            (
                key(7, "MPI_Send", UNKNOWN_BUCKET, 4),
                CounterVal {
                    calls: 3,
                    bytes: 0,
                    time_ns: 3,
                    ..CounterVal::default()
                },
                DurationHist::default(),
            ),
            (
                key(8, "MPI_Send", 1, 4),
                CounterVal {
                    calls: 1,
                    bytes: 4,
                    time_ns: 1,
                    ..CounterVal::default()
                },
                DurationHist::default(),
            ),
        ];
        let r = routines_of(7, &c, &[]);
        let ar = &r["MPI_Allreduce"];
        assert_eq!(
            ar.totals,
            Totals {
                calls: 16,
                bytes: 2120,
                time_ns: 159
            }
        );
        assert_eq!(ar.sizes.len(), 2);
        assert_eq!(ar.sizes[0].bucket, Some(2));
        assert_eq!(ar.sizes[0].totals.calls, 15);
        assert_eq!(ar.comm_sizes, BTreeMap::from([(2, 5), (4, 11)]));
        let s = &r["MPI_Send"];
        assert_eq!(s.undecoded_calls, 3);
        assert_eq!(s.sizes[0].bucket, None);
        assert_eq!(communication_ns(&r), 162);
    }

    #[test]
    fn merge_is_associative() {
        let c = |n| {
            vec![(
                key(1, "MPI_Bcast", 3, 4),
                CounterVal {
                    calls: n,
                    bytes: 16 * n,
                    time_ns: n,
                    ..CounterVal::default()
                },
                DurationHist::default(),
            )]
        };
        let (a, b, d) = (
            routines_of(1, &c(1), &[]),
            routines_of(1, &c(2), &[]),
            routines_of(1, &c(3), &[]),
        );
        let mut ab_d = a["MPI_Bcast"].clone();
        ab_d.merge(&b["MPI_Bcast"]);
        ab_d.merge(&d["MPI_Bcast"]);
        let mut bd = b["MPI_Bcast"].clone();
        bd.merge(&d["MPI_Bcast"]);
        let mut a_bd = a["MPI_Bcast"].clone();
        a_bd.merge(&bd);
        assert_eq!(ab_d, a_bd);
        assert_eq!(ab_d.totals.calls, 6);
    }

    #[test]
    fn device_time_takes_the_bus_factor_of_its_communicator_size() {
        let mut k = key(3, "ncclAllReduce", 20, 8);
        k.object = 9;
        let c = vec![(
            k,
            CounterVal {
                calls: 4,
                bytes: 4 << 20,
                time_ns: 100,
                ..CounterVal::default()
            },
            DurationHist::default(),
        )];
        let d = vec![(
            k,
            CounterVal {
                calls: 2,
                bytes: 2 << 20,
                time_ns: 2_000_000,
                ..CounterVal::default()
            },
        )];
        let r = routines_of(3, &c, &d);
        let dev = r["ncclAllReduce"].sizes[0].device.expect("device time");
        // 2(n-1)/n on 8 ranks.
        assert_eq!(dev.bus_bytes, Some((2 << 20) * 14 / 8));
        assert_eq!(dev.algbw_gbps(), Some(f64::from(2 << 20) / 2e6));
        // An unknown size leaves bus bandwidth unknown, and merging keeps it so.
        let unknown = vec![(key(3, "ncclAllReduce", 20, 0), d[0].1)];
        let mut merged = r["ncclAllReduce"].clone();
        merged.merge(&routines_of(3, &c, &unknown)["ncclAllReduce"]);
        let dev = merged.sizes[0].device.expect("device time");
        assert_eq!((dev.calls, dev.bus_bytes), (4, None));
        assert_eq!(bus_factor("ncclBroadcast", 8), Some((1, 1)));
        assert_eq!(bus_factor("ncclAllGather", 4), Some((3, 4)));
        assert_eq!(bus_factor("ncclAllGather", 0), None);
    }
}
