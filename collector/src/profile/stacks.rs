//! Reading ranks' stacks for one profile: the call a rank attached to while running was
//! already inside (no probe saw it begin), the untimed call a rank is still inside (its
//! return not seen), and where a call in progress was made from (a hung job's). Under the
//! session's lock, within one time budget a profile.

use std::collections::BTreeSet;

use super::CallSite;
use crate::{
    discover::{self, process_dir::ProcessDir},
    symbols::sites::SiteFiles,
};

/// Longest one profile spends on ranks' stacks (a running thread's sample, the files'
/// tables read for the first time, the unwinding), all ranks together, made under the
/// session's lock; `record`'s last profile waits [`PATIENT_STACKS`].
const STACKS_BUDGET: std::time::Duration = std::time::Duration::from_millis(250);
/// What `record`'s last profile may spend on stacks (it waits for symbols as well).
const PATIENT_STACKS: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads of a thread's stack before it is "not known" (the first and two more).
const STACK_READS: usize = 3;

/// What reads the stacks of ranks inside a call, for one profile: the files' unwinding
/// tables, and their symbols, which name where the call was made.
pub struct StackReading<'a> {
    unwinder: &'a mut crate::symbols::unwind::Unwinder,
    sites: &'a mut SiteFiles,
    /// The task iterator that reads a blocked thread's saved registers.
    registers: Option<std::os::fd::BorrowedFd<'a>>,
    /// The files whose symbols named a call's site in this profile (to be kept).
    pub named_files: BTreeSet<crate::symbols::file::FileKey>,
    /// When this profile stops reading stacks.
    deadline: std::time::Instant,
    /// The kernel's tick against the clock, read once a profile where it is needed.
    ticks: std::cell::OnceCell<Option<crate::clock::TickClock>>,
}

/// What the stacks of a rank's threads whose last call was untimed say of it.
pub enum Untimed {
    /// A thread is still inside it, a second or more after its entry.
    Inside(super::InCall),
    /// None is (or none entered one a second or more ago).
    Past,
    /// None was found inside it, but a stack could not be read or unwound whole, or one
    /// showed another routine.
    Unknown,
}

/// What the stacks of a rank's threads say of the call it was inside when attached to.
pub enum Found {
    /// A thread is inside this routine, called from that site (where named).
    Inside(u16, u32, Option<String>),
    /// Every thread's stack was unwound whole, and none is inside a routine.
    Outside,
    /// None was found inside one, but a stack could not be read or unwound whole (or not
    /// every thread was looked at).
    Unknown,
}

impl<'a> StackReading<'a> {
    /// For one profile: patient where `sites` waits for files' symbols (`record`'s last).
    pub fn new(
        unwinder: &'a mut crate::symbols::unwind::Unwinder,
        sites: &'a mut SiteFiles,
        registers: Option<std::os::fd::BorrowedFd<'a>>,
    ) -> StackReading<'a> {
        let budget = if sites.waits() {
            PATIENT_STACKS
        } else {
            STACKS_BUDGET
        };
        StackReading {
            unwinder,
            sites,
            registers,
            named_files: BTreeSet::new(),
            deadline: std::time::Instant::now() + budget,
            ticks: std::cell::OnceCell::new(),
        }
    }

    /// The stacks of `process`'s threads `tids`, within what is left of the profile's
    /// budget.
    fn stacks_of(&self, process: &ProcessDir, tids: &[u32]) -> Vec<discover::stack::ThreadStack> {
        let wait = self
            .deadline
            .saturating_duration_since(std::time::Instant::now());
        discover::stack::stacks(process, tids, wait, self.registers)
    }

    /// Whether `process`'s thread in `call` has left it without returning (see
    /// [`discover::stack::left_call`]); not where that cannot be told, nor once the
    /// profile's time for stacks is spent.
    pub fn left_call(&self, process: &ProcessDir, call: &crate::attach::InProgress) -> bool {
        std::time::Instant::now() < self.deadline
            && discover::stack::left_call(process, call.tid, call.entry_sp, self.registers)
                == Some(true)
    }

    /// The MPI or NCCL call one of `process`'s threads `unseen` (whose calls no probe saw
    /// begin) is inside, by its stack: a call entered before the attach.
    pub fn entered_before_attach(
        &mut self,
        process: &ProcessDir,
        unseen: &crate::attach::Unseen,
    ) -> Found {
        let threads: Vec<(u32, u64)> = unseen.threads.iter().map(|&tid| (tid, 0)).collect();
        self.first_inside(process, &threads, unseen.whole)
    }

    /// The untimed call one of `process`'s threads `untimed` (whose last call was counted
    /// untimed: its return not seen) is still inside, by its stack, where it was entered
    /// [`super::LONG_CALL_NS`] or more before `end_ns`: the call, its time in it so far
    /// (to a tick), and where it was made. Threads past their untimed call are remembered
    /// so, and not looked at again until they call again.
    pub fn untimed_call(
        &mut self,
        process: &ProcessDir,
        untimed: &[crate::attach::InProgress],
        end_ns: u64,
    ) -> Untimed {
        let registers = self.registers;
        // None: less than a second since the start (before which no call is long), or no
        // task iterator (untimed calls need uprobe sessions, Linux 6.13+, which has it): as
        // the kernel's state alone says, no call.
        let Some(ticks) = *self
            .ticks
            .get_or_init(|| crate::clock::TickClock::now(registers))
        else {
            return Untimed::Past;
        };
        // Those entered a second or more ago, and the ns they have been in them.
        let long: Vec<(&crate::attach::InProgress, u64)> = untimed
            .iter()
            .filter_map(|c| {
                let for_ns = end_ns.saturating_sub(ticks.monotonic_ns(c.since_ns)?);
                (for_ns >= super::LONG_CALL_NS).then_some((c, for_ns))
            })
            .collect();
        let threads: Vec<(u32, u64)> = long.iter().map(|(c, _)| (c.tid, c.since_ns)).collect();
        match self.first_inside(process, &threads, true) {
            Found::Inside(routine, tid, called_from) => {
                let call = long
                    .iter()
                    .find(|(c, _)| c.tid == tid)
                    // Another routine outermost: not the call whose entry the ticks date.
                    .filter(|(c, _)| c.routine == routine)
                    .and_then(|(_, for_ns)| super::InCall::of(usize::from(routine), *for_ns, tid));
                call.map_or(Untimed::Unknown, |c| {
                    Untimed::Inside(super::InCall { called_from, ..c })
                })
            }
            Found::Outside => Untimed::Past,
            Found::Unknown => Untimed::Unknown,
        }
    }

    /// The first of `process`'s `threads` (thread, the tick count of its last call's entry
    /// where that was untimed, else 0) found inside an MPI or NCCL routine by its stack;
    /// those unwound whole and inside none are remembered. `whole`: `threads` are all the
    /// threads to look at (else none found is `Unknown`).
    fn first_inside(&mut self, process: &ProcessDir, threads: &[(u32, u64)], whole: bool) -> Found {
        let pid = process.pid();
        let mut pending: Vec<u32> = threads
            .iter()
            .filter(|&&(tid, key)| !self.unwinder.known_outside((pid, tid, key)))
            .map(|&(tid, _)| tid)
            .collect();
        if !pending.is_empty() {
            if std::time::Instant::now() >= self.deadline {
                return Found::Unknown;
            }
            let Ok(objects) = discover::mapped_objects_in(process) else {
                return Found::Unknown;
            };
            // A running thread's sample can land where its stack does not unwind whole
            // (code with no call frame information, the vDSO's): sampled again, twice.
            for _ in 0..STACK_READS {
                if pending.is_empty() || std::time::Instant::now() >= self.deadline {
                    break;
                }
                let stacks = self.stacks_of(process, &pending);
                // Not sampled (not given a CPU in time): looked at again too.
                let mut again: Vec<u32> = pending
                    .iter()
                    .copied()
                    .filter(|tid| !stacks.iter().any(|s| s.tid == *tid))
                    .collect();
                for s in &stacks {
                    let unwound = self.unwinder.unwind(&objects, s, self.deadline);
                    tracing::debug!(pid, tid = s.tid, ?unwound, "a stack unwound");
                    if let Some(routine) = unwound.routine {
                        let site = unwound
                            .site
                            .map(|a| self.site_label(pid, &objects, routine, a));
                        return Found::Inside(routine, s.tid, site);
                    }
                    if unwound.complete {
                        let key = threads.iter().find(|t| t.0 == s.tid).map_or(0, |t| t.1);
                        self.unwinder.remember_outside((pid, s.tid, key));
                    } else {
                        again.push(s.tid);
                    }
                }
                pending = again;
            }
        }
        if whole && pending.is_empty() {
            Found::Outside
        } else {
            Found::Unknown
        }
    }

    /// Where `call`, which the kernel saw `process`'s thread enter at `since_ns`, was made, by
    /// the thread's stack (its return address, which the kernel's return probe moved off
    /// the stack, from the task iterator); `None` where the stack shows another routine
    /// outermost, or none.
    pub fn called_from(
        &mut self,
        process: &ProcessDir,
        call: &super::InCall,
        since_ns: u64,
    ) -> Option<String> {
        let pid = process.pid();
        let key = (pid, call.thread, since_ns);
        if let Some(named) = self.unwinder.named_site(key) {
            return Some(named.to_string());
        }
        if std::time::Instant::now() >= self.deadline {
            return None;
        }
        let routine = collector_common::routines::routine_id(&call.routine)?;
        let objects = discover::mapped_objects_in(process).ok()?;
        let stack = self.stacks_of(process, &[call.thread]).pop()?;
        let unwound = self.unwinder.unwind(&objects, &stack, self.deadline);
        tracing::debug!(pid, tid = call.thread, ?unwound, "a stack unwound");
        let site = unwound.site.filter(|_| unwound.routine == Some(routine))?;
        let label = self.site_label(pid, &objects, routine, site);
        // Kept once named by its function (not before its file's symbols are read): the
        // same call is not unwound again at every profile.
        if !label.starts_with("0x") {
            self.unwinder.remember_site(key, &label);
        }
        Some(label)
    }

    /// `site` (an address `pid` returns to from `routine`) as reports name a call site.
    fn site_label(
        &mut self,
        pid: u32,
        objects: &[discover::MappedObject],
        routine: u16,
        site: u64,
    ) -> String {
        self.sites.ask(pid, objects);
        self.named_files
            .extend(objects.iter().map(discover::MappedObject::contents));
        let name = collector_common::ROUTINES
            .get(usize::from(routine))
            .map_or_else(String::new, |r| r.name.to_string());
        CallSite::named(name, site, self.sites.name(objects, site)).label()
    }
}
