//! Each user's share of the daemon's time for reading their processes' lists of mappings.
//!
//! Reading `/proc/PID/maps` costs the reader what the process chose: the kernel escapes
//! every byte of every mapped file's path, so 8 MiB of list (the most read of one process)
//! takes about 0.1 s of the daemon's CPU. A process of any user that maps a rank library
//! and then loads a library in a loop has its list read at every load (it is paused until
//! read): one such process kept the daemon's core (its unit's whole quota) busy, and with
//! it the ring buffers every other user's jobs are counted through. Each user (an account:
//! a uid and the sub-uids it was given) may spend a burst, enough for a node's worth of
//! ranks starting at once, then a tenth of a core; past that, their processes' reads
//! wait for the share to refill (a paused process stays paused, up to the pause's own
//! limit). What is done next for what was read (the libraries it names read and
//! attached) is charged too. Root's processes are never held back.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use super::{process_dir::ProcessDir, DiscoverError};

/// What an account may spend at once: a node's ranks starting together are read at each
/// library load (measured, debug build: 50 ms for a 2-rank Open MPI job, 7 ms a Python
/// extension module imported; a PyTorch rank imports hundreds).
pub const BURST: Duration = Duration::from_secs(30);

/// The share refills at this fraction of a core: a user past the burst keeps the daemon
/// busy a tenth of the time at most.
pub const RATE: f64 = 0.1;

/// The account that is never held back (root's processes: root could stop the daemon).
const ROOT: u32 = 0;

/// What each account has left; an account absent has all of [`BURST`].
#[derive(Debug, Default)]
pub struct ReadShares {
    left: HashMap<u32, Left>,
}

/// An account's share: the time it has left (negative: in debt, after a read that took
/// more than was left) as of `at`.
#[derive(Clone, Copy, Debug)]
struct Left {
    secs: f64,
    at: Instant,
}

/// An account's share is spent: how long until it may read again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spent {
    /// Until the share is back above nothing.
    pub ready_in: Duration,
}

impl ReadShares {
    /// `read` of `process` within the share of the account its real owner is charged to
    /// (`account`: a uid's account); its owner's share spent, an error that says so.
    pub fn read_process<T>(
        &mut self,
        process: &ProcessDir,
        account: impl Fn(u32) -> u32,
        read: impl FnOnce(&ProcessDir) -> Result<T, DiscoverError>,
    ) -> Result<T, DiscoverError> {
        let uid = process.real_uid()?;
        self.read_at(account(uid), Instant::now(), || read(process))
            .unwrap_or_else(|spent| {
                Err(DiscoverError::ShareSpent {
                    pid: process.pid(),
                    uid,
                    ready_in_s: spent.ready_in.as_secs().max(1),
                })
            })
    }

    /// Charges `account` for `spent` of CPU done for one of its processes elsewhere (its
    /// libraries read and attached).
    pub fn charge(&mut self, account: u32, spent: Duration) {
        if account != ROOT {
            self.charge_at(account, Instant::now(), spent);
        }
    }

    /// Runs `read` for `account` if its share is not spent at `now`, charging it the CPU
    /// time this thread spent in it (the kernel's time writing the list is the reader's).
    fn read_at<T>(
        &mut self,
        account: u32,
        now: Instant,
        read: impl FnOnce() -> T,
    ) -> Result<T, Spent> {
        if account == ROOT {
            return Ok(read());
        }
        self.forget_refilled(now);
        if let Some(left) = self.left.get(&account).map(|l| l.at(now)) {
            if left <= 0.0 {
                return Err(Spent {
                    ready_in: Duration::from_secs_f64(-left / RATE),
                });
            }
        }
        let (out, spent) = crate::clock::cpu_spent(read);
        self.charge_at(account, now, spent);
        Ok(out)
    }

    fn charge_at(&mut self, account: u32, now: Instant, spent: Duration) {
        let left = self
            .left
            .get(&account)
            .map_or(BURST.as_secs_f64(), |l| l.at(now));
        self.left.insert(
            account,
            Left {
                secs: left - spent.as_secs_f64(),
                at: now,
            },
        );
    }

    /// Drops the accounts whose share is whole again: what is kept is bounded by the users
    /// reading now.
    fn forget_refilled(&mut self, now: Instant) {
        self.left.retain(|_, l| l.at(now) < BURST.as_secs_f64());
    }
}

impl Left {
    /// What is left at `now`, refilled since `at`.
    fn at(&self, now: Instant) -> f64 {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * RATE;
        (self.secs + refill).min(BURST.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_share_refills_at_its_rate_and_root_is_never_held() {
        let mut shares = ReadShares::default();
        let t0 = Instant::now();
        // A read that took the whole burst and one second more: in debt.
        shares.charge_at(7, t0, BURST + Duration::from_secs(1));
        let spent = shares.read_at(7, t0, || ()).unwrap_err();
        assert!((spent.ready_in.as_secs_f64() - 1.0 / RATE).abs() < 1e-6);
        // Another account, and root, read all the same.
        assert!(shares.read_at(8, t0, || ()).is_ok());
        shares.charge_at(ROOT, t0, BURST * 2);
        assert!(shares.read_at(ROOT, t0, || ()).is_ok());
        // Once refilled past nothing, it reads again.
        let later = t0 + Duration::from_secs_f64(1.0 / RATE + 0.5);
        assert_eq!(shares.read_at(7, later, || 42), Ok(42));
    }

    #[test]
    fn a_whole_share_is_forgotten() {
        let mut shares = ReadShares::default();
        let t0 = Instant::now();
        shares.charge_at(7, t0, Duration::from_secs(1));
        shares.forget_refilled(t0 + Duration::from_secs_f64(0.5 / RATE));
        assert_eq!(shares.left.len(), 1);
        shares.forget_refilled(t0 + Duration::from_secs_f64(1.0 / RATE));
        assert!(shares.left.is_empty());
    }
}
