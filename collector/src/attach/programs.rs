//! The uprobe_multi probe programs, each loaded when a library first needs it.
//!
//! Why not all at start: the verifier takes most of commtap's start-up. The session
//! programs of Open MPI and MPICH are each ~400,000 instructions to verify (1–2 s of a core
//! here), NCCL's and MPICH's datatype constructors' a third of that; loading them all made
//! `commtap record -- true` take 2.2 s on this 2-core machine, and every start pay for the
//! three ABIs a job does not use. Only the dynamic linker's and `MPI_Pcontrol`'s small
//! programs are loaded at start; an ABI's programs are verified at the first library of
//! that ABI, while the process that loaded it waits paused (its pause renewed meanwhile).

use std::{
    collections::HashMap,
    io,
    os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd},
    sync::{mpsc, Arc},
};

use collector_common::{names::programs as p, Abi};

use super::multi;

/// The programs loaded so far, and what loading the others needs.
pub struct ProgramSet {
    /// Every map the programs refer to, by name: descriptors of our own, so that the maps
    /// stay open for later loads whatever becomes of the handles `Probes` keeps (shared
    /// with the loads in flight, which may outlive the set).
    maps: Arc<HashMap<String, OwnedFd>>,
    /// `bpf_session_is_return`'s BTF id while MPI and NCCL are probed through uprobe
    /// sessions (None: entry and return probes).
    session_kfunc: Option<u32>,
    loaded: HashMap<String, OwnedFd>,
}

/// Programs being loaded on a thread of their own.
pub struct PendingLoad {
    /// What is being loaded.
    pub names: Vec<&'static str>,
    /// The load's outcome, once it is done.
    pub rx: mpsc::Receiver<Result<HashMap<String, OwnedFd>, multi::MultiError>>,
}

/// The programs loaded at start, whatever the libraries: small, and needed before any.
pub const AT_START: [&str; 3] = [p::LINKER_LOADED, p::MPI_PCONTROL, p::BINDING_ENTRY];

/// The programs that probe a library of `abi`, through uprobe sessions or not.
pub fn for_abi(abi: Abi, sessions: bool) -> &'static [&'static str] {
    match (abi, sessions) {
        (Abi::Fabric, true) => &[p::SESS_FABRIC, p::FABRIC_OPEN],
        (Abi::Fabric, false) => &[p::FABRIC_ENTRY, p::FABRIC_RETURN, p::FABRIC_OPEN],
        (Abi::OpenMpi, true) => &[p::SESS_OMPI],
        (Abi::Mpich, true) => &[p::SESS_MPICH, p::SESS_MPICH_TYPES],
        (Abi::MpiAbi, true) => &[p::SESS_MPI_ABI, p::SESS_MPI_ABI_TYPES],
        (Abi::Nccl, true) => &[p::SESS_NCCL],
        (Abi::OpenMpi, false) => &[p::CALL_ENTRY, p::MPI_RETURN_OMPI],
        (Abi::Mpich, false) => &[
            p::CALL_ENTRY,
            p::MPI_RETURN_MPICH,
            p::MPI_RETURN_MPICH_TYPES,
        ],
        (Abi::MpiAbi, false) => &[
            p::CALL_ENTRY,
            p::MPI_RETURN_MPI_ABI,
            p::MPI_RETURN_MPI_ABI_TYPES,
        ],
        (Abi::Nccl, false) => &[p::CALL_ENTRY, p::NCCL_RETURN],
    }
}

/// The programs that probe libraries of `abis`, each once.
pub fn for_abis(abis: &[Abi], sessions: bool) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = abis
        .iter()
        .flat_map(|abi| for_abi(*abi, sessions).iter().copied())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Every ABI, for loading every program (`commtap doctor`).
pub const ABIS: [Abi; 5] = [
    Abi::OpenMpi,
    Abi::Mpich,
    Abi::MpiAbi,
    Abi::Nccl,
    Abi::Fabric,
];

impl ProgramSet {
    /// A set with nothing loaded, over the maps `maps` (by name; duplicated here).
    pub fn new(maps: &HashMap<String, RawFd>, session_kfunc: Option<u32>) -> io::Result<Self> {
        let maps = maps
            .iter()
            .map(|(name, fd)| {
                // SAFETY: the caller's descriptors are open for the duration of this call.
                let fd = unsafe { BorrowedFd::borrow_raw(*fd) };
                Ok((name.clone(), fd.try_clone_to_owned()?))
            })
            .collect::<io::Result<_>>()?;
        Ok(ProgramSet {
            maps: Arc::new(maps),
            session_kfunc,
            loaded: HashMap::new(),
        })
    }

    /// Whether libraries are (from now on) probed through uprobe sessions.
    pub fn sessions(&self) -> bool {
        self.session_kfunc.is_some()
    }

    /// Probes libraries through entry and return probes from now on (the kernel refused a
    /// session program).
    pub fn stop_sessions(&mut self) {
        self.session_kfunc = None;
    }

    /// The loaded program `name`.
    pub fn get(&self, name: &str) -> Option<&OwnedFd> {
        self.loaded.get(name)
    }

    /// Every loaded program, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &OwnedFd)> {
        self.loaded.iter()
    }

    /// Of `names`, those not loaded yet.
    pub fn missing(&self, names: &[&'static str]) -> Vec<&'static str> {
        names
            .iter()
            .copied()
            .filter(|n| !self.loaded.contains_key(*n))
            .collect()
    }

    /// A load of `names` that borrows nothing of the set: run it on another thread while
    /// this one goes on, then [`ProgramSet::add`] its programs.
    pub fn loader(
        &self,
        names: Vec<&'static str>,
    ) -> impl FnOnce() -> Result<HashMap<String, OwnedFd>, multi::MultiError> + Send + 'static {
        let maps = Arc::clone(&self.maps);
        let kfunc = self.session_kfunc;
        move || {
            let fds: HashMap<String, RawFd> = maps
                .iter()
                .map(|(n, fd)| (n.clone(), fd.as_raw_fd()))
                .collect();
            multi::load_programs(super::BPF_OBJECT, &fds, &names, kfunc)
        }
    }

    /// A load of `names` started on a thread of its own (see `Probes::load_renewing`).
    pub fn spawn_load(&self, names: Vec<&'static str>) -> PendingLoad {
        let load = self.loader(names.clone());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(load());
        });
        PendingLoad { names, rx }
    }

    /// Keeps programs a [`ProgramSet::loader`] loaded.
    pub fn add(&mut self, programs: HashMap<String, OwnedFd>) {
        self.loaded.extend(programs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_abi_has_its_return_programs_and_sessions_stand_for_them() {
        for abi in ABIS {
            let classic = for_abi(abi, false);
            let sessions = for_abi(abi, true);
            if abi == Abi::Fabric {
                // The transports' pair, or their session; fi_fabric's own entry either way.
                assert!(classic.contains(&p::FABRIC_ENTRY), "{classic:?}");
                let returns: Vec<&str> = classic.iter().filter_map(|r| p::session_for(r)).collect();
                assert_eq!(returns, [p::SESS_FABRIC]);
                assert_eq!(sessions, [p::SESS_FABRIC, p::FABRIC_OPEN]);
                assert!(classic.contains(&p::FABRIC_OPEN), "{classic:?}");
                continue;
            }
            assert!(classic.contains(&p::CALL_ENTRY), "{abi:?}");
            let returns: Vec<&str> = classic.iter().filter_map(|r| p::session_for(r)).collect();
            assert_eq!(returns, sessions, "{abi:?}");
        }
    }
}
