//! The node's clock as the kernel's probes read it, and how another node's clock is
//! estimated against it (timelines and who-is-late merge nodes on one time axis).

/// Monotonic time in ns, the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Boot time in ns (the monotonic clock and the time suspended), the clock a process's
/// start in `/proc` counts from.
pub fn boottime_ns() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

/// `f`'s result, and the CPU time this thread spent in it (the kernel's work for its system
/// calls included).
pub fn cpu_spent<T>(f: impl FnOnce() -> T) -> (T, std::time::Duration) {
    let before = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let out = f();
    let spent = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(before);
    (out, std::time::Duration::from_nanos(spent))
}

/// What clock `clock` reads, in ns.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The node's wall clock now, Unix ns.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The node's wall clock against its monotonic one, read once: every instant converted
/// through one reading keeps the monotonic clock's order (two readings apart can differ by
/// a preemption between their two clock reads).
#[derive(Clone, Copy, Debug)]
pub struct UnixClock {
    /// Unix ns less monotonic ns.
    offset: i128,
}

impl UnixClock {
    /// The clocks as they read now.
    pub fn now() -> UnixClock {
        let mono = monotonic_ns();
        UnixClock {
            offset: i128::from(unix_now_ns()) - i128::from(mono),
        }
    }

    /// The Unix time (ns) of monotonic instant `at`.
    pub fn unix_ns(&self, at: u64) -> u64 {
        u64::try_from(i128::from(at) + self.offset).unwrap_or(0)
    }
}

/// The kernel's tick count (`jiffies`) against the monotonic clock: the probes read the
/// tick count alone where a clock read would cost too much (an untimed call's entry), and
/// its age in ns needs how long a tick is, which no file says (`CONFIG_HZ`). Measured from
/// two readings of both a second or more apart, each taken by the task iterator
/// `task_registers` (`attach::thread_registers`) run on this thread: the first at the
/// session's start ([`TickClock::start`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TickClock {
    /// A reading now: monotonic ns and jiffies.
    now: (u64, u64),
    /// Ns a tick.
    tick_ns: f64,
}

/// The first reading of the tick count ([`TickClock::start`]).
static FIRST_TICKS: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();

/// The tick rates Linux is built with (`CONFIG_HZ`): a measured rate within 3% of one is it.
const KERNEL_HZ: [f64; 5] = [100.0, 250.0, 300.0, 1000.0, 1200.0];

impl TickClock {
    /// Takes the first reading, which later ones measure the tick against, with the task
    /// iterator `registers` (at a session's start: the ages it can tell begin there).
    pub fn start(registers: Option<std::os::fd::BorrowedFd<'_>>) {
        if let Ok(first) = read_ticks(registers) {
            let _ = FIRST_TICKS.set(first);
        }
    }

    /// The tick clock now, read with the task iterator `registers`; `None` where less
    /// than a second has passed since [`TickClock::start`] (no call counted since can be
    /// that old), or where the kernel's tick count cannot be read (no task iterator).
    pub fn now(registers: Option<std::os::fd::BorrowedFd<'_>>) -> Option<TickClock> {
        let now = read_ticks(registers)
            .inspect_err(|e| tracing::debug!(error = %e, "the kernel's tick count cannot be read"))
            .ok()?;
        // Read now for the first time: a second from here, a tick can be told.
        TickClock::between(*FIRST_TICKS.get_or_init(|| now), now)
    }

    /// The tick measured between readings `first` and `now` (monotonic ns, jiffies).
    fn between(first: (u64, u64), now: (u64, u64)) -> Option<TickClock> {
        let (ns, ticks) = (now.0.checked_sub(first.0)?, now.1.checked_sub(first.1)?);
        if ns < 1_000_000_000 || ticks == 0 {
            return None;
        }
        let hz = ticks as f64 * 1e9 / ns as f64;
        let hz = KERNEL_HZ
            .into_iter()
            .find(|k| (hz - k).abs() <= k * 0.03)
            .unwrap_or(hz);
        Some(TickClock {
            now,
            tick_ns: 1e9 / hz,
        })
    }

    /// The monotonic ns of tick count `jiffies` (one tick's precision), where it is not
    /// later than now.
    pub fn monotonic_ns(&self, jiffies: u64) -> Option<u64> {
        let ago = self.now.1.checked_sub(jiffies)? as f64 * self.tick_ns;
        Some(self.now.0.saturating_sub(ago as u64))
    }
}

/// Monotonic ns and jiffies read together by the task iterator `registers`, run on this
/// thread.
fn read_ticks(registers: Option<std::os::fd::BorrowedFd<'_>>) -> std::io::Result<(u64, u64)> {
    let prog = registers.ok_or_else(|| std::io::Error::other("no task iterator"))?;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    let regs = crate::attach::thread_registers(prog, tid)?
        .ok_or_else(|| std::io::Error::other("the task iterator wrote nothing"))?;
    Ok((regs.now_ns, regs.jiffies))
}

/// Clock requests per estimate: the shortest round trip of these bounds the error.
const CLOCK_SAMPLES: usize = 16;

/// A node's clock against ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockEstimate {
    /// Node time minus our time, ns.
    pub offset_ns: i64,
    /// How far off `offset_ns` may be (half the shortest round trip), ns.
    pub error_ns: u64,
}

impl ClockEstimate {
    /// The estimate from one exchange: we read `sent` and `received` around the node's
    /// `remote` reading.
    pub fn from_exchange(sent: u64, remote: u64, received: u64) -> ClockEstimate {
        let rtt = received.saturating_sub(sent);
        let mid = sent + rtt / 2;
        ClockEstimate {
            offset_ns: remote as i64 - mid as i64,
            error_ns: rtt.div_ceil(2),
        }
    }
}

/// Another clock against `ours`: the best of [`CLOCK_SAMPLES`] exchanges, each asking
/// the other side's reading with `ask` (the node API's `Clock`, or the aggregator's), which
/// answers it with the whole reply; with the last reply (it names the other side).
pub async fn best_exchange<F, Fut, T>(
    ours: impl Fn() -> u64,
    mut ask: F,
) -> anyhow::Result<(ClockEstimate, T)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(u64, T)>>,
{
    let mut best: Option<ClockEstimate> = None;
    let mut last = None;
    for _ in 0..CLOCK_SAMPLES {
        let sent = ours();
        let (remote, reply) = ask().await?;
        let received = ours();
        let e = ClockEstimate::from_exchange(sent, remote, received);
        if best.is_none_or(|b| e.error_ns < b.error_ns) {
            best = Some(e);
        }
        last = Some(reply);
    }
    Ok((
        best.expect("at least one sample"),
        last.expect("at least one sample"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tick_is_measured_and_ages_follow() {
        // 250 ticks a second, read 2 s apart (a little off: the readings' own times).
        let c = TickClock::between((10_000_000_000, 5_000), (12_000_000_000, 5_501)).unwrap();
        assert_eq!(c.tick_ns, 4_000_000.0, "snapped to CONFIG_HZ=250");
        assert_eq!(c.monotonic_ns(5_501), Some(12_000_000_000));
        assert_eq!(c.monotonic_ns(5_251), Some(11_000_000_000));
        assert_eq!(c.monotonic_ns(5_502), None, "not later than now");
        // Too close together to tell a tick: no clock.
        assert_eq!(TickClock::between((0, 0), (999_999_999, 250)), None);
    }
}
