//! The probes' cost kept within a budget: where a process calls MPI so often that timing
//! every call would cost more than `--max-overhead` of its time, the time of its hottest
//! routines is sampled (one call in N timed, the others counted at their entry and their
//! return skipped: through uprobe sessions, an untimed call costs an entry only). Calls
//! and bytes are never sampled.

use std::collections::BTreeMap;

use collector_common::{routines::Family, ROUTINES};
use tracing::{debug, info, warn};

use crate::{attach::Probes, clock::monotonic_ns};

/// The kernel's part of a probed call's cost to the calling thread, ns: at the entry the
/// breakpoint trap and the uprobe lookup, at the return the return trampoline. From `cargo
/// xtask bench` on this project's 2-core machine: an unwatched process pays +1,007 ns per
/// call with sessions (an entry only, our program leaving at once) and +1,680 with an entry
/// and a return probe. Our programs' part is measured while commtap runs ([`CallCost`]).
pub const TRAP_ENTRY_NS: u64 = 1_000;
/// See [`TRAP_ENTRY_NS`].
pub const TRAP_RETURN_NS: u64 = 700;
/// Our program's run, ns, until the kernel has measured it (about what a counted call's
/// programs took in the bench).
pub const ASSUMED_PROGRAM_NS: u64 = 200;

/// What a probed call costs its thread, by which the probes' cost is estimated: the
/// kernel's trap ([`TRAP_ENTRY_NS`], [`TRAP_RETURN_NS`]) and a run of our program, whose
/// mean the kernel measures (its BPF run-time statistics, `bpf_stats`, turned on a tenth
/// of a second at a time).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct CallCost {
    /// An entry, ns: the trap and a program run.
    pub entry_ns: u64,
    /// A return, ns: the trampoline and a program run.
    pub return_ns: u64,
    /// The probe programs' mean run, ns, as the kernel measured it.
    pub program_ns: u64,
    /// The program runs it was measured over (0: not measured yet, the assumed 200 ns).
    pub measured_runs: u64,
}

impl CallCost {
    /// Before any measurement.
    pub const ASSUMED: CallCost = CallCost::with_program(ASSUMED_PROGRAM_NS, 0);

    /// With the programs' mean run `program_ns`, measured over `runs`.
    pub const fn with_program(program_ns: u64, runs: u64) -> CallCost {
        CallCost {
            entry_ns: TRAP_ENTRY_NS + program_ns,
            return_ns: TRAP_RETURN_NS + program_ns,
            program_ns,
            measured_runs: runs,
        }
    }
}

/// The probe programs' run time as the kernel measures it, a window at a time: the
/// statistics cost two clock reads per run of every BPF program on the machine while on,
/// so they are on a tenth of a second at a time only (all the time with `--probe-stats`).
#[derive(Default)]
struct ProgramClock {
    /// The open window: since when (monotonic ns), and each program's (runs, ns) then.
    open: Option<(u64, ProgramRuns)>,
    /// When the next window opens.
    next_ns: u64,
    /// Runs and run time measured in all windows so far.
    runs: u64,
    run_ns: u64,
}

/// How long a measuring window stays open, and how often one opens: every second until
/// [`SETTLED_RUNS`] runs are measured, every eight after (the statistics' clock reads
/// cost this virtual machine about a tenth of a probe run while on).
const WINDOW_NS: u64 = 100_000_000;
const WINDOW_EVERY_NS: u64 = 1_000_000_000;
const SETTLED_EVERY_NS: u64 = 8_000_000_000;
/// The runs after which the mean is taken as settled.
const SETTLED_RUNS: u64 = 1_000_000;
/// The runs a mean needs before it replaces the assumed one.
const MIN_RUNS: u64 = 1_000;

impl ProgramClock {
    /// Opens or closes the window as its time comes (called at every budget step).
    fn step(&mut self, probes: &mut Probes) {
        let now = monotonic_ns();
        match self.open.take() {
            None if now >= self.next_ns => match probes.measure_program_runs(true) {
                Ok(()) => self.open = Some((now, runs_of(probes))),
                Err(e) => {
                    warn!("the probes' cost stays estimated, not measured: {e:#}");
                    self.next_ns = u64::MAX;
                }
            },
            None => {}
            Some((since, before)) if now.saturating_sub(since) >= WINDOW_NS => {
                for (name, (runs, ns)) in runs_of(probes) {
                    let (r0, n0) = before.get(&name).copied().unwrap_or((0, 0));
                    self.runs += runs.saturating_sub(r0);
                    self.run_ns += ns.saturating_sub(n0);
                }
                if let Err(e) = probes.measure_program_runs(false) {
                    warn!("{e:#}");
                }
                self.next_ns = since
                    + if self.runs < SETTLED_RUNS {
                        WINDOW_EVERY_NS
                    } else {
                        SETTLED_EVERY_NS
                    };
            }
            open => self.open = open,
        }
    }

    /// What a call costs by the measurements so far.
    fn cost(&self) -> CallCost {
        if self.runs < MIN_RUNS {
            return CallCost::ASSUMED;
        }
        CallCost::with_program(self.run_ns / self.runs, self.runs)
    }
}

/// Each loaded probe program's (runs, run ns), by name.
type ProgramRuns = BTreeMap<String, (u64, u64)>;

/// [`ProgramRuns`] now.
fn runs_of(probes: &Probes) -> ProgramRuns {
    probes
        .program_runs()
        .into_iter()
        .map(|p| (p.name, (p.runs, p.run_ns)))
        .collect()
}

/// The most a routine's time is thinned: one call in this many timed.
pub const MAX_ONE_IN: u32 = 1 << 12;

/// How the time of routines that may be sampled is taken.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TimeSampling {
    /// Every call timed (`--time-every-call`).
    EveryCall,
    /// Every routine that may be sampled timed one call in N (`--time-one-in N`).
    OneIn(u32),
    /// Sampling raised on a process's hottest routines while its estimated probe cost
    /// is above this share of its time (`--max-overhead`, 0.01 for 1%).
    Budget(f64),
}

impl TimeSampling {
    /// The default: a budget of 1% of each process's time.
    pub const DEFAULT: TimeSampling = TimeSampling::Budget(0.01);

    /// The mode the command-line options ask for: `--time-every-call`, `--time-one-in N`,
    /// or `--max-overhead PCT` (0: every call timed).
    pub fn from_options(every_call: bool, one_in: Option<u32>, max_overhead_pct: f64) -> Self {
        match (every_call, one_in) {
            (true, _) => TimeSampling::EveryCall,
            (false, Some(n)) if n > 1 => TimeSampling::OneIn(n),
            (false, Some(_)) => TimeSampling::EveryCall,
            (false, None) if max_overhead_pct > 0.0 => {
                TimeSampling::Budget(max_overhead_pct / 100.0)
            }
            (false, None) => TimeSampling::EveryCall,
        }
    }
}

/// The sampling a session applies, and what the budget last saw.
pub struct Budget {
    mode: TimeSampling,
    /// Calls per (process, routine) at the last look, and when that was (monotonic ns).
    last: BTreeMap<(u32, u16), u64>,
    last_ns: u64,
    applied: bool,
    /// How long until the next look: [`LOOK_EVERY`], or longer where reading the counters
    /// took long (a node with many processes), so that looking costs at most 5% of a core.
    wait_ns: u64,
    /// The probe programs' measured run time.
    clock: ProgramClock,
}

/// How often the budget looks at the call rates, at most: a new phase of hot calls runs
/// with every call timed until the look after next, so this is the budget's lag (at a
/// quarter of a second, on the 200 ms tick, a 2-rank call-rate program timed a fifth of its
/// first phase's 1M `MPI_Comm_rank`, each paying a return). A look reads every counter's
/// calls: where that takes long, looks are spaced out (`wait_ns`).
pub const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(40);
const EVERY_NS: u64 = LOOK_EVERY.as_nanos() as u64;

/// The timer a session's owner calls [`Budget::step`] by: every [`LOOK_EVERY`], a late tick
/// not made up for.
pub fn ticker() -> tokio::time::Interval {
    let mut t = tokio::time::interval(LOOK_EVERY);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

impl Budget {
    /// A budget applying `mode`.
    pub fn new(mode: TimeSampling) -> Budget {
        Budget {
            mode,
            last: BTreeMap::new(),
            last_ns: 0,
            applied: false,
            wait_ns: EVERY_NS,
            clock: ProgramClock::default(),
        }
    }

    /// What a probed call costs, by the kernel's measurements so far.
    pub fn call_cost(&self) -> CallCost {
        self.clock.cost()
    }

    /// Applies the mode: a fixed one at once, a budget from the call rates since the last
    /// look (call it every [`LOOK_EVERY`]).
    pub fn step(&mut self, probes: &mut Probes) {
        self.clock.step(probes);
        if !probes.uses_sessions() {
            if !self.applied && self.mode != TimeSampling::EveryCall {
                info!("every call is timed: sampling needs uprobe sessions (Linux 6.13+)");
            }
            self.applied = true;
            return;
        }
        let plan = match self.mode {
            TimeSampling::EveryCall | TimeSampling::OneIn(_) if self.applied => return,
            TimeSampling::EveryCall => Plan::default(),
            TimeSampling::OneIn(n) => Plan {
                everywhere: sampleable(probes).map(|r| (r, n)).collect(),
                per_process: BTreeMap::new(),
            },
            TimeSampling::Budget(share) => {
                let now = monotonic_ns();
                if self.applied && now.saturating_sub(self.last_ns) < self.wait_ns {
                    return;
                }
                let mut calls: BTreeMap<(u32, u16), u64> = BTreeMap::new();
                for (k, n) in probes.read_counter_calls() {
                    *calls.entry((k.tgid, k.routine)).or_default() += n;
                }
                self.wait_ns = EVERY_NS.max(20 * monotonic_ns().saturating_sub(now));
                let secs = now.saturating_sub(self.last_ns) as f64 / 1e9;
                let last = std::mem::replace(&mut self.last, calls);
                self.last_ns = now;
                if !self.applied {
                    // The first look: rates need a second.
                    self.applied = true;
                    return;
                }
                let rates = rates(&last, &self.last, secs);
                let may: Vec<u16> = sampleable(probes).collect();
                let wanted = one_in_for_budget(&rates, &may, share, self.clock.cost());
                Plan::of(self.last.keys(), wanted)
            }
        };
        self.applied = true;
        apply(probes, &plan);
    }
}

/// How each routine's time is sampled: one N for every process, or each process its own.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// Routine -> N, in every process.
    everywhere: BTreeMap<u16, u32>,
    /// (tgid, routine) -> N: each process its own (1 where it has none).
    per_process: BTreeMap<(u32, u16), u32>,
}

impl Plan {
    /// The budget's per-process `wanted` N, set the cheapest way: a routine that every
    /// process that has called it (`callers`: (tgid, routine), however long ago, so that a
    /// process calling it slowly is never taken for one that does not) wants thinned alike
    /// gets one N everywhere, which the probes read from an array; only where processes
    /// differ does each call look up its process's own (a hash lookup, about a tenth of a
    /// probe's program).
    fn of<'a>(
        callers: impl Iterator<Item = &'a (u32, u16)> + Clone,
        wanted: BTreeMap<(u32, u16), u32>,
    ) -> Plan {
        let mut plan = Plan::default();
        let routines: std::collections::BTreeSet<u16> = wanted.keys().map(|&(_, r)| r).collect();
        for r in routines {
            let mut ns = callers
                .clone()
                .filter(|(_, routine)| *routine == r)
                .map(|k| wanted.get(k).copied().unwrap_or(1));
            let first = ns.next().unwrap_or(1);
            if ns.all(|n| n == first) {
                plan.everywhere.insert(r, first);
            } else {
                plan.per_process.extend(
                    wanted
                        .iter()
                        .filter(|((_, routine), _)| *routine == r)
                        .map(|(k, n)| (*k, *n)),
                );
            }
        }
        plan
    }
}

/// The routines whose time may be sampled now: MPI routines whose calls (all, or those
/// ignoring their status) are counted whole at their entry, UCX's operations, and for
/// which no event is wanted (an event carries the call's time).
fn sampleable(probes: &Probes) -> impl Iterator<Item = u16> + '_ {
    ROUTINES.iter().enumerate().filter_map(move |(id, r)| {
        (matches!(r.family(), Family::Mpi | Family::Fabric)
            && r.spec.time_may_be_sampled()
            && !probes.event_wanted_for(&r.spec))
        .then_some(id as u16)
    })
}

/// Calls per second of each process and routine between two readings `secs` apart.
fn rates(
    before: &BTreeMap<(u32, u16), u64>,
    now: &BTreeMap<(u32, u16), u64>,
    secs: f64,
) -> BTreeMap<u32, BTreeMap<u16, f64>> {
    let mut out: BTreeMap<u32, BTreeMap<u16, f64>> = BTreeMap::new();
    if secs <= 0.0 {
        return out;
    }
    for (&(tgid, routine), &calls) in now {
        let was = before.get(&(tgid, routine)).copied().unwrap_or(0);
        let rate = calls.saturating_sub(was) as f64 / secs;
        if rate > 0.0 {
            out.entry(tgid).or_default().insert(routine, rate);
        }
    }
    out
}

/// A process's estimated probe cost per second of its time, ns, with `one_in` applied to
/// the routines that may be sampled.
fn cost_per_sec(rates: &BTreeMap<u16, f64>, one_in: &BTreeMap<u16, u32>, cost: CallCost) -> f64 {
    rates
        .iter()
        .map(|(r, rate)| {
            let n = f64::from(one_in.get(r).copied().unwrap_or(1));
            rate * (cost.entry_ns as f64 + cost.return_ns as f64 / n)
        })
        .sum()
}

/// For each process whose estimated cost is above `share` of its time, the routine whose
/// returns cost it most is thinned (its N doubled) until the estimate fits or nothing is
/// left worth thinning (returns costing under a hundredth of the budget are left timed:
/// where the entries alone pass the budget, thinning them gains nothing): (tgid, routine)
/// -> N. Each process gets what it needs, whatever the others do.
fn one_in_for_budget(
    rates: &BTreeMap<u32, BTreeMap<u16, f64>>,
    may: &[u16],
    share: f64,
    cost: CallCost,
) -> BTreeMap<(u32, u16), u32> {
    let limit = share * 1e9;
    let mut wanted: BTreeMap<(u32, u16), u32> = BTreeMap::new();
    for (&tgid, process) in rates {
        let mut one_in: BTreeMap<u16, u32> = BTreeMap::new();
        while cost_per_sec(process, &one_in, cost) > limit {
            let thinnest = process
                .iter()
                .filter(|(r, _)| may.contains(r))
                .map(|(r, rate)| (*r, rate / f64::from(one_in.get(r).copied().unwrap_or(1))))
                .filter(|(r, timed)| {
                    one_in.get(r).copied().unwrap_or(1) < MAX_ONE_IN
                        && timed * cost.return_ns as f64 > limit / 100.0
                })
                .max_by(|a, b| a.1.total_cmp(&b.1));
            let Some((r, _)) = thinnest else { break };
            *one_in.entry(r).or_insert(1) *= 2;
        }
        wanted.extend(one_in.into_iter().map(|(r, n)| ((tgid, r), n)));
    }
    wanted
}

/// Sets every routine's N as `plan` says, and 1 (every call) for the others.
fn apply(probes: &mut Probes, plan: &Plan) {
    let before = (
        probes.time_sampled().clone(),
        probes.process_time_sampled().clone(),
    );
    if let Err(e) = probes.set_time_sampling(&plan.everywhere, &plan.per_process) {
        warn!("cannot set the time sampling: {e:#}");
    }
    if (probes.time_sampled(), probes.process_time_sampled()) != (&before.0, &before.1) {
        let name = |r: u16| ROUTINES[r as usize].name;
        let names: Vec<String> = plan
            .everywhere
            .iter()
            .map(|(r, n)| format!("{} 1 in {n}", name(*r)))
            .chain(
                plan.per_process
                    .iter()
                    .map(|((tgid, r), n)| format!("{} 1 in {n} in {tgid}", name(*r))),
            )
            .collect();
        debug!("time sampled: {}", names.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> u16 {
        ROUTINES
            .iter()
            .position(|r| r.name == name)
            .expect("routine") as u16
    }

    #[test]
    fn a_process_within_the_budget_has_every_call_timed() {
        // 1,000 calls/s cost about 2.1 ms a second: 0.2%.
        let rates = [(7, [(id("MPI_Iprobe"), 1_000.0)].into())].into();
        assert!(one_in_for_budget(&rates, &[id("MPI_Iprobe")], 0.01, CallCost::ASSUMED).is_empty());
    }

    #[test]
    fn the_hottest_routine_is_thinned_until_the_estimate_fits() {
        let (probe, send) = (id("MPI_Iprobe"), id("MPI_Send"));
        // 1M Iprobe/s cost 2.1 s a second timed; entries alone 1.2 s: more than any budget,
        // so Iprobe is thinned to the most, and Send (10 calls/s) never.
        let rates = [(7, [(probe, 1e6), (send, 10.0)].into())].into();
        let wanted = one_in_for_budget(&rates, &[probe, send], 0.01, CallCost::ASSUMED);
        assert_eq!(wanted, [((7, probe), MAX_ONE_IN)].into());
        // 5,000 Iprobe/s: 10.5 ms a second timed; 1% of a second is 10 ms: one in 2 (8.25).
        let rates = [(7, [(probe, 5_000.0), (send, 10.0)].into())].into();
        assert_eq!(
            one_in_for_budget(&rates, &[probe, send], 0.01, CallCost::ASSUMED),
            [((7, probe), 2)].into()
        );
    }

    #[test]
    fn the_measured_cost_decides() {
        let probe = id("MPI_Iprobe");
        let rates = [(7, [(probe, 5_000.0)].into())].into();
        // Programs measured at 50 ns a run: 5,000 calls/s cost 5,000 x (1,050 + 750) ns
        // = 9 ms a second, within 1%; at the assumed 200 ns, 10.5 ms: thinned.
        let measured = CallCost::with_program(50, 10_000);
        assert!(one_in_for_budget(&rates, &[probe], 0.01, measured).is_empty());
        assert_eq!(
            one_in_for_budget(&rates, &[probe], 0.01, CallCost::ASSUMED),
            [((7, probe), 2)].into()
        );
    }

    #[test]
    fn processes_that_agree_share_one_n() {
        let (probe, rank) = (id("MPI_Iprobe"), id("MPI_Comm_rank"));
        // Both processes call Iprobe hot: one N everywhere. Comm_rank: 8 hot, 9 slow, or
        // not at all since the last look (every call timed): each its own.
        let callers = [(8, probe), (8, rank), (9, probe), (9, rank)];
        let wanted = [((8, probe), 64), ((9, probe), 64), ((8, rank), 32)].into();
        assert_eq!(
            Plan::of(callers.iter(), wanted),
            Plan {
                everywhere: [(probe, 64)].into(),
                per_process: [((8, rank), 32)].into(),
            }
        );
    }

    #[test]
    fn a_routine_that_may_not_be_sampled_is_never_thinned() {
        let recv = id("MPI_Recv");
        let rates = [(7, [(recv, 1e6)].into())].into();
        assert!(one_in_for_budget(&rates, &[], 0.01, CallCost::ASSUMED).is_empty());
    }

    #[test]
    fn each_process_gets_the_n_it_needs() {
        let probe = id("MPI_Iprobe");
        // Process 9 calls it 1,000 times a second (0.2%): every call timed, although 8's
        // million a second have it thinned to the most.
        let rates = [
            (7, [(probe, 5_000.0)].into()),
            (8, [(probe, 1e6)].into()),
            (9, [(probe, 1_000.0)].into()),
        ]
        .into();
        assert_eq!(
            one_in_for_budget(&rates, &[probe], 0.01, CallCost::ASSUMED),
            [((7, probe), 2), ((8, probe), MAX_ONE_IN)].into()
        );
    }
}
