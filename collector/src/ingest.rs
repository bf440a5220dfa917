//! Draining the ring buffer: call events (latency, timelines) and process lifecycle events.
//!
//! Counts and bytes never depend on this path: they are read from the kernel's counter
//! maps. What the ring buffer could not carry is counted by the kernel per process.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use aya::maps::{MapData, RingBuf};
use collector_common::{
    CallEvent, ComponentsEvent, EventKind, FabricEvent, IdentityEvent, ProcEvent,
    IDENTITY_ARGS_LEN, IDENTITY_ENV_LEN,
};

use crate::discover::Fabric;
use tokio::{
    io::unix::AsyncFd,
    sync::{broadcast, mpsc},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// How often the ring buffer is drained when nothing woke us, in ms.
pub const DRAIN_INTERVAL_MS: u64 = 50;
const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(DRAIN_INTERVAL_MS);

/// A watched process's lifecycle, as the kernel reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessEvent {
    /// It (or its child, now watched) replaced its image.
    Exec {
        /// Process id.
        pid: u32,
        /// Its real user id, from the kernel.
        uid: u32,
        /// When, on the monotonic clock (the kernel's reading, not when we read it).
        ts_ns: u64,
    },
    /// It forked a child that is now watched.
    Fork {
        /// The child.
        pid: u32,
        /// Its parent.
        parent: u32,
        /// The child's real user id (its parent's), from the kernel.
        uid: u32,
        /// When, on the monotonic clock (the kernel's reading, not when we read it).
        ts_ns: u64,
    },
    /// It made its first MPI call (watch-all mode) and is now watched.
    Discovered {
        /// Process id.
        pid: u32,
        /// Its real user id, from the kernel.
        uid: u32,
    },
    /// It exited, at monotonic `ts_ns`.
    Exit {
        /// Process id.
        pid: u32,
        /// When.
        ts_ns: u64,
    },
    /// Who it is, as the kernel saw it when it became known (sent before its `Exec` or
    /// `Discovered`): used where its `/proc` entry cannot be read (it exited).
    Identity {
        /// Process id.
        pid: u32,
        /// Its identity.
        info: Box<crate::discover::ProcessInfo>,
    },
    /// Its dynamic linker mapped new libraries, and the kernel paused it (`SIGSTOP`) until
    /// they are probed: the receiver must continue it.
    Loaded {
        /// Process id.
        pid: u32,
        /// When it was paused, on the monotonic clock.
        ts_ns: u64,
    },
    /// It called `MPI_Pcontrol(level)` at monotonic `ts_ns`; `paused`: the kernel stopped it
    /// there, and the receiver must continue it once it has read its counters.
    Pcontrol {
        /// Process id.
        pid: u32,
        /// The level it passed.
        level: i32,
        /// Whether it was paused.
        paused: bool,
        /// When.
        ts_ns: u64,
    },
    /// It opened a libfabric fabric.
    FabricOpened {
        /// Process id.
        pid: u32,
        /// What it opened.
        fabric: Fabric,
    },
    /// Its MPI said which of its own transports it selected (Open MPI's `pml ob1`).
    MpiTransport {
        /// Process id.
        pid: u32,
        /// What it selected.
        transport: String,
    },
}

/// Text of a NUL-terminated name from the kernel.
fn c_name(raw: &[u8]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// What the ingest loop has seen.
#[derive(Debug)]
pub struct IngestCounters {
    /// Call events received, per process.
    pub call_events: Mutex<BTreeMap<u32, u64>>,
    /// Records too short or of an unknown kind.
    pub malformed: AtomicU64,
    /// Every call event and process exit, in the order the kernel queued them, for whoever
    /// listens (`StreamEvents`, traces); bounded: a slow listener lags and is told how many
    /// it missed.
    pub feed: broadcast::Sender<FeedItem>,
    /// Processes detached since the last drain began, and how many drains began: told the
    /// feed once the events they queued before are on it ([`IngestCounters::detached`]).
    detached: Mutex<(Vec<u32>, u64)>,
    /// How many drains ended (each told the detaches it took at its start).
    drains_ended: tokio::sync::watch::Sender<u64>,
    /// Records one drain reads at most (more than the ring holds): a drain ends, and tells
    /// its detaches, however fast the kernel writes; the rest waits for the next.
    drain_records: usize,
}

/// What the call feed carries.
#[derive(Clone, Copy, Debug)]
pub enum FeedItem {
    /// A completed call.
    Call(CallEvent),
    /// A watched process exited: every call of its came before.
    Exited(u32),
    /// A process's calls before this and after it are not one run of calls: it was
    /// detached (`commtap detach`: after every event it queued before), or is watched again
    /// after its counts were stopped (a detach, a failed attach, `record` letting it go:
    /// its calls in between were not seen, and the kernel's counts start again).
    Detached(u32),
}

/// What a reader of the call feed gets: an item, how many it fell behind by, or the end.
pub type FeedResult = Result<FeedItem, tokio::sync::broadcast::error::RecvError>;

/// The next item already queued on `feed`, without waiting (None: nothing is).
pub fn queued_item(feed: &mut tokio::sync::broadcast::Receiver<FeedItem>) -> Option<FeedResult> {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    match feed.try_recv() {
        Ok(item) => Some(Ok(item)),
        Err(TryRecvError::Lagged(n)) => Some(Err(RecvError::Lagged(n))),
        Err(_) => None,
    }
}

/// Call events the feed holds for its slowest listener, at least.
const FEED_CAPACITY: usize = 1 << 16;

/// Call events the feed holds at most (about 100 MiB of them).
const MAX_FEED_CAPACITY: usize = 1 << 20;

impl IngestCounters {
    /// Counters whose feed holds at least what a ring buffer of `ring_bytes` does: a
    /// listener that falls behind (a trace written by a slow `record`) loses none of what
    /// the kernel could keep, where a larger ring was asked for so that none is lost.
    pub fn for_ring(ring_bytes: u32) -> IngestCounters {
        // Each event is a record of the ring: its 8-byte header and the event.
        let events = ring_bytes as usize / (size_of::<CallEvent>() + 8);
        IngestCounters {
            call_events: Mutex::default(),
            malformed: AtomicU64::default(),
            feed: broadcast::channel(
                events
                    .next_power_of_two()
                    .clamp(FEED_CAPACITY, MAX_FEED_CAPACITY),
            )
            .0,
            detached: Mutex::default(),
            drains_ended: tokio::sync::watch::Sender::new(0),
            // A record is 16 bytes at least (its 8-byte header, its data rounded up to 8):
            // twice the ring's worth.
            drain_records: (ring_bytes as usize / 8).max(1 << 16),
        }
    }

    /// Process `pid` was detached (no event of its is queued from now on): the feed's
    /// readers get [`FeedItem::Detached`] after every event it queued before, at the end of
    /// the next drain, whose number this returns for [`IngestCounters::told`] (past
    /// [`MAX_DETACHED`] waiting, now: its last events may follow).
    pub fn detached(&self, pid: u32) -> u64 {
        let mut detaching = self.detaching();
        let (waiting, begun) = &mut *detaching;
        if waiting.len() < MAX_DETACHED {
            waiting.push(pid);
            *begun + 1
        } else {
            self.tell(FeedItem::Detached(pid));
            *begun
        }
    }

    /// Waits until drain `drain` has ended (its detaches told the feed), for `limit` at
    /// most (no ingest loop runs, or it is stuck): whether it did. A detach that returns
    /// after it is before an attach of the same process on the feed too.
    pub async fn told(&self, drain: u64, limit: std::time::Duration) -> bool {
        let mut ended = self.drains_ended.subscribe();
        tokio::time::timeout(limit, ended.wait_for(|n| *n >= drain))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// A drain begins: the detaches it tells at its end, and its number. Taken before the
    /// ring is read: every event these processes queued before their detach is read in
    /// the drain (but one the kernel was still writing, in the microseconds a probe takes).
    fn drain_begins(&self) -> (Vec<u32>, u64) {
        let mut detaching = self.detaching();
        detaching.1 += 1;
        (std::mem::take(&mut detaching.0), detaching.1)
    }

    /// The detaches waiting for a drain, and the drains begun.
    fn detaching(&self) -> std::sync::MutexGuard<'_, (Vec<u32>, u64)> {
        self.detached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drain `drain` ends: its `detached` are told the feed, after every event it read.
    fn drain_ends(&self, detached: Vec<u32>, drain: u64) {
        for pid in detached {
            self.tell(FeedItem::Detached(pid));
        }
        self.drains_ended.send_replace(drain);
    }

    /// Hands `item` to the feed's readers, if any.
    pub fn tell(&self, item: FeedItem) {
        if self.feed.receiver_count() > 0 {
            let _ = self.feed.send(item);
        }
    }
}

/// Detaches waiting for the next drain, at most.
const MAX_DETACHED: usize = 1 << 12;

impl IngestCounters {
    /// Call events received from `pid`.
    pub fn events_of(&self, pid: u32) -> u64 {
        self.call_events
            .lock()
            .map_or(0, |m| m.get(&pid).copied().unwrap_or(0))
    }
}

/// Drains `ring` until `cancel`, forwarding process events to `tx`.
pub async fn run(
    ring: RingBuf<MapData>,
    tx: mpsc::UnboundedSender<ProcessEvent>,
    counters: Arc<IngestCounters>,
    cancel: CancellationToken,
) {
    // SAFETY: the ring buffer owns its fd for as long as the AsyncFd owns the ring buffer.
    let mut fd = match unsafe { AsyncFd::register(ring) } {
        Ok(fd) => fd,
        Err(e) => {
            warn!("cannot poll the ring buffer: {e}");
            return;
        }
    };
    // Call events wake us only when the buffer fills up (see the BPF side): drain on a
    // short timer too, so timelines stay fresh without a wake-up per call.
    let mut tick = tokio::time::interval(DRAIN_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => drain(fd.get_mut(), &tx, &counters),
            guard = fd.readable_mut() => {
                let Ok(mut guard) = guard else { break };
                drain(guard.get_inner_mut(), &tx, &counters);
                guard.clear_ready();
            }
        }
    }
    drain(fd.get_mut(), &tx, &counters);
}

/// A process's identity from the kernel's [`IdentityEvent`] (`bytes`, length checked).
pub fn identity_event(bytes: &[u8]) -> ProcessEvent {
    // The fixed header, then the two byte arrays read in place (the record is 20 KiB).
    let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let (pid, uid) = (word(4), word(8));
    let env_len = (word(12) as usize).min(IDENTITY_ENV_LEN);
    let args_len = (word(16) as usize).min(IDENTITY_ARGS_LEN);
    let start_ns = u64::from_ne_bytes(bytes[24..32].try_into().expect("8 bytes"));
    let env = &bytes[32..32 + env_len];
    let args = &bytes[32 + IDENTITY_ENV_LEN..32 + IDENTITY_ENV_LEN + args_len];
    // /proc shows start times in clock ticks (USER_HZ, 100 on Linux).
    let start_ticks = start_ns / 10_000_000;
    // The cgroup is read where the identity is used (the session), not on the drain path.
    let info = crate::discover::ProcessInfo::from_parts(pid, Some(uid), start_ticks, args, env);
    ProcessEvent::Identity {
        pid,
        info: Box::new(info),
    }
}

/// The lifecycle event of kind `k` that `ev` reports (None for a kind it cannot be).
fn process_event(k: u32, ev: &ProcEvent) -> Option<ProcessEvent> {
    Some(if k == EventKind::Exec as u32 {
        ProcessEvent::Exec {
            pid: ev.tgid,
            uid: ev.uid,
            ts_ns: ev.ts_ns,
        }
    } else if k == EventKind::Fork as u32 {
        ProcessEvent::Fork {
            pid: ev.tgid,
            parent: ev.parent,
            uid: ev.uid,
            ts_ns: ev.ts_ns,
        }
    } else if k == EventKind::Discovered as u32 {
        ProcessEvent::Discovered {
            pid: ev.tgid,
            uid: ev.uid,
        }
    } else if k == EventKind::Exit as u32 {
        ProcessEvent::Exit {
            pid: ev.tgid,
            ts_ns: ev.ts_ns,
        }
    } else if k == EventKind::Loaded as u32 {
        ProcessEvent::Loaded {
            pid: ev.tgid,
            ts_ns: ev.ts_ns,
        }
    } else if k == EventKind::Pcontrol as u32 {
        let (level, paused) = ev.pcontrol_of();
        ProcessEvent::Pcontrol {
            pid: ev.tgid,
            level,
            paused,
            ts_ns: ev.ts_ns,
        }
    } else {
        return None;
    })
}

/// Drains the ring buffer: process events to `tx`, call events to the feed (counted per
/// process), anything malformed counted.
fn drain(
    ring: &mut RingBuf<MapData>,
    tx: &mpsc::UnboundedSender<ProcessEvent>,
    counters: &IngestCounters,
) {
    let (detached, drain) = counters.drain_begins();
    // Counted locally and merged once per drain: the lock stays off the per-event path.
    let mut calls: BTreeMap<u32, u64> = BTreeMap::new();
    for _ in 0..counters.drain_records {
        let Some(item) = ring.next() else { break };
        let bytes: &[u8] = &item;
        let kind = bytes
            .get(..4)
            .map(|k| u32::from_ne_bytes([k[0], k[1], k[2], k[3]]));
        match kind {
            Some(k)
                if k == EventKind::FabricOpen as u32 && bytes.len() >= size_of::<FabricEvent>() =>
            {
                // SAFETY: length checked; FabricEvent is plain integers and bytes.
                let ev: FabricEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
                let pe = ProcessEvent::FabricOpened {
                    pid: ev.tgid,
                    fabric: Fabric {
                        provider: c_name(&ev.provider),
                        name: c_name(&ev.fabric),
                    },
                };
                debug!(?pe, "process event");
                let _ = tx.send(pe);
            }
            Some(k)
                if k == EventKind::MpiComponents as u32
                    && bytes.len() >= size_of::<ComponentsEvent>() =>
            {
                // SAFETY: length checked; ComponentsEvent is plain integers and bytes.
                let ev: ComponentsEvent =
                    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
                if let Some(transport) = crate::discover::memory::component_names(&ev.pml, &ev.mtl)
                {
                    let pe = ProcessEvent::MpiTransport {
                        pid: ev.tgid,
                        transport,
                    };
                    debug!(?pe, "process event");
                    let _ = tx.send(pe);
                }
            }
            Some(k)
                if k == EventKind::Identity as u32 && bytes.len() >= size_of::<IdentityEvent>() =>
            {
                let pe = identity_event(bytes);
                debug!(?pe, "process event");
                let _ = tx.send(pe);
            }
            Some(k)
                if (k == EventKind::Call as u32
                    || k == EventKind::DeviceWindow as u32
                    || k == EventKind::Arrival as u32)
                    && bytes.len() >= size_of::<CallEvent>() =>
            {
                // SAFETY: length checked; CallEvent is plain integers.
                let ev: CallEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
                // Device windows and arrivals are not calls: `events` (with `dropped`)
                // counts calls.
                if k == EventKind::Call as u32 {
                    *calls.entry(ev.tgid).or_default() += 1;
                }
                counters.tell(FeedItem::Call(ev));
            }
            Some(k) if bytes.len() >= size_of::<ProcEvent>() => {
                // SAFETY: length checked; ProcEvent is plain integers.
                let ev: ProcEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
                let Some(pe) = process_event(k, &ev) else {
                    counters.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if matches!(pe, ProcessEvent::Exit { .. }) {
                    counters.tell(FeedItem::Exited(ev.tgid));
                }
                debug!(?pe, "process event");
                let _ = tx.send(pe);
            }
            _ => {
                counters.malformed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if !calls.is_empty() {
        if let Ok(mut all) = counters.call_events.lock() {
            for (pid, n) in calls {
                *all.entry(pid).or_default() += n;
            }
        }
    }
    counters.drain_ends(detached, drain);
}

#[cfg(test)]
mod detach_tests {
    use super::*;
    use std::time::Duration;

    /// A detach is told the feed at the end of the drain that begins after it, after every
    /// event that drain read; one that comes while a drain runs waits for the next.
    #[tokio::test]
    async fn a_detach_is_told_at_the_end_of_the_next_drain() {
        let c = IngestCounters::for_ring(1 << 16);
        let mut feed = c.feed.subscribe();
        let short = Duration::from_millis(10);
        let drain = c.detached(7);
        assert!(!c.told(drain, short).await, "no drain ended yet");
        let (pids, n) = c.drain_begins();
        assert_eq!((pids.as_slice(), n), ([7].as_slice(), drain));
        let later = c.detached(8);
        assert_eq!(later, drain + 1, "taken by the next drain");
        c.tell(FeedItem::Exited(9));
        c.drain_ends(pids, n);
        assert!(c.told(drain, short).await);
        assert!(!c.told(later, short).await);
        let told: Vec<String> = std::iter::from_fn(|| feed.try_recv().ok())
            .map(|item| format!("{item:?}"))
            .collect();
        assert_eq!(told, ["Exited(9)", "Detached(7)"]);
    }
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    #[test]
    fn identity_events_give_rank_job_and_owner() {
        let mut ev = vec![0u8; size_of::<IdentityEvent>()];
        let env = b"HOME=/x\0OMPI_COMM_WORLD_RANK=3\0OMPI_COMM_WORLD_SIZE=4\0PMIX_NAMESPACE=ns1\0";
        let args = b"./app\0-n\x005\0";
        ev[0..4].copy_from_slice(&(EventKind::Identity as u32).to_ne_bytes());
        ev[4..8].copy_from_slice(&4242u32.to_ne_bytes());
        ev[8..12].copy_from_slice(&1000u32.to_ne_bytes());
        ev[12..16].copy_from_slice(&(env.len() as u32).to_ne_bytes());
        ev[16..20].copy_from_slice(&(args.len() as u32).to_ne_bytes());
        ev[24..32].copy_from_slice(&12_340_000_000u64.to_ne_bytes());
        ev[32..32 + env.len()].copy_from_slice(env);
        ev[32 + IDENTITY_ENV_LEN..32 + IDENTITY_ENV_LEN + args.len()].copy_from_slice(args);
        let ProcessEvent::Identity { pid, info } = identity_event(&ev) else {
            panic!("not an identity");
        };
        assert_eq!(pid, 4242);
        assert_eq!(info.uid, Some(1000));
        assert_eq!((info.rank, info.world_size), (Some(3), Some(4)));
        assert_eq!(info.launcher_job.as_deref(), Some("ns1"));
        assert_eq!(info.cmdline, "./app -n 5");
        assert_eq!(info.start_ticks, 1234);
        // Lengths past the arrays are clamped, never trusted.
        ev[12..16].copy_from_slice(&u32::MAX.to_ne_bytes());
        let ProcessEvent::Identity { info, .. } = identity_event(&ev) else {
            panic!("not an identity");
        };
        assert_eq!(info.rank, Some(3));
    }
}
