//! The node's clock as the kernel's probes read it, and how another node's clock is
//! estimated against it (timelines and who-is-late merge nodes on one time axis).

/// Monotonic time in ns, the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
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
