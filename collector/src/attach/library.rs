//! Probing a library: read once (or taken from what was read ahead), counted against its
//! owner's quota, its layout and libfabric tables written for the kernel, and its
//! uprobe_multi links attached; and letting it go when no process maps it.

use std::os::fd::AsFd;

use collector_common::{
    names, routines::class, Abi, Cookie, FabricRanges, FabricText, MAX_FABRIC_RANGES, MAX_LAYOUTS,
    ROUTINES,
};
use tracing::{debug, info, warn};

use super::{
    hook_linker, map_err,
    multi::{self, ProbeKind},
    programs, AttachError, AttachedLibrary, HookedLinker, Probes, MAX_BINDINGS_PER_UID,
    MAX_LIBRARIES_PER_UID, MAX_LINKERS, MAX_LINKERS_PER_UID,
};
use crate::symbols::{
    self,
    file::{FileError, FileStamp},
    Library, LibraryFile, LibraryKind, Placement, ProbePoint,
};

/// A library file by its identity (device, inode), and its name for messages.
type NamedFile = ((u64, u64), String);

/// What was decided on an object mapped, by its identity.
#[derive(Clone, Copy, Debug)]
pub(super) enum Decided {
    /// Probed, in this slot. Its probes hold the file: no other can take its identity.
    Probed(usize),
    /// Not probed (not MPI, not decoded, over its owner's quota ...), on the contents that
    /// had this stamp: nothing holds the file, so another may have its identity later.
    NotProbed(FileStamp),
}

impl Probes {
    /// Notes that `pid` maps the library `dev_inode` (if it is probed).
    pub fn note_mapped(&mut self, dev_inode: (u64, u64), pid: u32) {
        if let Some(Decided::Probed(slot)) = self.seen.get(&dev_inode) {
            self.mapped_by.entry(*slot).or_default().insert(pid);
        }
    }

    /// Lets a user's library go once no process maps it: its probes detached, its slot
    /// free, and read again should a process map it later. Shared libraries stay.
    pub(super) fn release(&mut self, slot: usize) {
        let Some(lib) = self.libraries.get_mut(slot) else {
            return;
        };
        if lib.owner.is_none() || lib.released {
            return;
        }
        info!(
            "letting {} go: no process maps it any more",
            lib.library.path
        );
        multi::detach_all(std::mem::take(&mut lib.links));
        lib.released = true;
        self.seen.remove(&lib.dev_inode);
        self.free_slots.push(slot);
    }

    /// Probes the libraries `files`, commtap's caller's (shared, as `attach_library`'s
    /// `shared`): each is read first, then the programs of the ABIs found among them are
    /// loaded at once, each on a thread of its own, then each is attached. A daemon's start
    /// and `record` ahead of its job probe the system's libraries this way, and verify only
    /// the programs of the ABIs the node has (the verifier takes most of a start: all five
    /// ABIs' programs are ~18 s of a core's time here, where Open MPI's alone is ~2 s).
    /// Returns each library that could not be probed, with why.
    pub fn attach_files(&mut self, files: Vec<LibraryFile>) -> Vec<(String, AttachError)> {
        let (abis, kept) = self.read_ahead_all(files);
        // A failed load is reported by each library it leaves unprobed, below.
        if let Err(e) = self.load_programs_of(&abis) {
            debug!("{e:#}");
        }
        let mut failed = Vec::new();
        for (id, shown) in kept {
            // Read ahead above (or decided on before): never opened again here.
            let open_again = || LibraryFile::open_path(std::path::Path::new(&shown));
            if let Err(e) = self.attach_library(id, true, open_again) {
                failed.push((shown, e));
            }
        }
        failed
    }

    /// Starts verifying, on a thread of its own, the programs of the libraries `files`
    /// (read now, and kept for when a process maps them), which a job about to be launched
    /// will load: the verifier's second or two then overlaps the launcher's start instead
    /// of the ranks' wait at their first load. Whoever needs those programs first waits for
    /// this load (`load_renewing`).
    pub fn prefetch_programs(&mut self, files: Vec<LibraryFile>) {
        let (abis, _) = self.read_ahead_all(files);
        let names = self
            .programs
            .missing(&programs::for_abis(&abis, self.programs.sessions()));
        if names.is_empty() || self.prefetch.is_some() {
            return;
        }
        info!("verifying the probe programs of {names:?} ahead of the job that will need them");
        self.prefetch = Some(self.programs.spawn_load(names));
    }

    /// Reads the libraries `files` not known yet and keeps them for `attach_library`;
    /// the ABIs of those to be probed, and each file's identity and name.
    fn read_ahead_all(&mut self, files: Vec<LibraryFile>) -> (Vec<Abi>, Vec<NamedFile>) {
        let mut abis = Vec::new();
        let mut kept = Vec::new();
        for file in files {
            let (id, shown) = (file.identity, file.shown.clone());
            if !self.knows(id) {
                let read = symbols::read_library(&file);
                if let Ok(LibraryKind::Probed(lib)) = &read {
                    // (Fortran bindings have a program of their own, loaded at start.)
                    let wanted =
                        (self.transports || lib.abi != Abi::Fabric) && !lib.fortran_bindings;
                    if wanted && !abis.contains(&lib.abi) {
                        abis.push(lib.abi);
                    }
                }
                self.read_ahead.insert(id, (file, read));
            }
            kept.push((id, shown));
        }
        (abis, kept)
    }

    /// Attaches to the library `dev_inode` unless already done, opening it with `open` if
    /// it was never read; `shared` when commtap's caller asked for it (never let go, in no
    /// user's quota). Returns whether it is an MPI or NCCL library now probed.
    pub fn attach_library(
        &mut self,
        dev_inode: (u64, u64),
        shared: bool,
        open: impl FnOnce() -> Result<LibraryFile, FileError>,
    ) -> Result<bool, AttachError> {
        if let Some(state) = self.seen.get(&dev_inode) {
            return Ok(
                matches!(state, Decided::Probed(i) if self.libraries[*i].library.counts_calls()),
            );
        }
        let Some((file, lib, owner)) = self.admit(dev_inode, shared, open) else {
            return Ok(false);
        };
        let _library = tracing::info_span!("library", path = %lib.path).entered();
        // Fortran bindings' program is loaded at start.
        let programs = if lib.fortran_bindings {
            Ok(())
        } else {
            self.load_programs_for(lib.abi)
        };
        if let Err(e) = programs {
            // Not tried again for each process that maps it: verifying takes seconds.
            let why = format!("{}: not probed: {e:#}", lib.path);
            self.unsupported.note(owner, why);
            self.not_probed(dev_inode, &file);
            return Err(e);
        }
        let index = self.free_slots.pop().unwrap_or(self.libraries.len());
        let slot = index as u32;
        if slot >= MAX_LAYOUTS {
            return Err(AttachError::TooManyLibraries);
        }
        self.write_library_maps(slot, &lib)?;
        let (links, failed) = self.attach_links(&lib, slot, &file)?;
        // (A Fortran binding's probe is an entry alone.)
        let through_sessions = self.programs.sessions() && !lib.fortran_bindings;
        log_probing(&lib, &failed);
        let attached = AttachedLibrary {
            library: lib,
            failed,
            dev_inode,
            owner,
            links,
            released: false,
            through_sessions,
        };
        let counted = attached.library.counts_calls();
        if index < self.libraries.len() {
            self.libraries[index] = attached;
        } else {
            self.libraries.push(attached);
        }
        self.seen.insert(dev_inode, Decided::Probed(index));
        Ok(counted)
    }

    /// The user whose quota a library file counts in, where it is a user's own (not root's):
    /// its owner, or for a sub-uid the user given it (one quota for all of theirs).
    fn user_of_file(&self, file: &LibraryFile) -> Option<u32> {
        (file.owner != 0).then(|| self.accounts.of(file.owner))
    }

    /// Probes a dynamic linker a process maps that is not the system's (a container image's,
    /// a Spack glibc's, one a program is started with): from now on its processes pause at
    /// their library loads too. Within caps: a user's own copies cannot take every place.
    fn hook_own_linker(&mut self, file: &LibraryFile, hook: symbols::LinkerHook) {
        if self.linkers.contains_key(&file.identity) {
            return;
        }
        let owner = self.user_of_file(file);
        let held = |o: Option<u32>| self.linkers.values().filter(|l| l.owner == o).count();
        if self.linkers.len() > MAX_LINKERS
            || owner.is_some_and(|_| held(owner) >= MAX_LINKERS_PER_UID)
        {
            warn!(
                "{}: a dynamic linker not probed (at most {MAX_LINKERS}, {MAX_LINKERS_PER_UID} \
                 of one user's): libraries its processes load late are probed after their \
                 first calls",
                file.shown
            );
            return;
        }
        let Some(prog) = self.programs.get(names::programs::LINKER_LOADED) else {
            return;
        };
        match hook_linker(prog.as_fd(), file, hook) {
            Ok(link) => {
                info!(
                    "probing the dynamic linker {}: its processes pause at library loads too",
                    file.shown
                );
                self.linkers
                    .insert(file.identity, HookedLinker { link, owner });
            }
            Err(e) => warn!("{}: {e:#}", file.shown),
        }
    }

    /// Reads the library `dev_inode` (or takes what was read ahead) and decides whether it
    /// is probed: a library commtap decodes, within its owner's quota (`shared`: none).
    /// Anything else is marked seen, and why it is not probed noted where it matters.
    fn admit(
        &mut self,
        dev_inode: (u64, u64),
        shared: bool,
        open: impl FnOnce() -> Result<LibraryFile, FileError>,
    ) -> Option<(LibraryFile, Library, Option<u32>)> {
        // Objects not probed are remembered so as not to be read again: a user making new
        // files without end would have them remembered without end. Forgotten all at once
        // past a bound (one mapped again is read again).
        if self.seen.len() >= MAX_SEEN {
            self.seen.retain(|_, d| matches!(d, Decided::Probed(_)));
        }
        let (file, read) = match self.read_ahead.remove(&dev_inode) {
            Some(r) => r,
            None => match open() {
                Ok(file) => {
                    let read = symbols::read_library(&file);
                    (file, read)
                }
                Err(e) => {
                    // Not marked seen: another process may map it where it can be opened.
                    debug!(error = format!("{e:#}"), "not probed");
                    return None;
                }
            },
        };
        let lib = match read {
            Ok(LibraryKind::Probed(lib)) if lib.abi == Abi::Fabric && !self.transports => {
                let why = format!(
                    "{}: a transport's data path, left alone as --no-transports asks (MPI \
                     and NCCL are probed)",
                    file.shown
                );
                info!("{why}");
                self.unsupported.note(self.user_of_file(&file), why);
                self.not_probed(dev_inode, &file);
                return None;
            }
            Ok(LibraryKind::Probed(lib)) if lib.fortran_bindings && !self.call_sites() => {
                // Their probes serve call sites alone.
                self.not_probed(dev_inode, &file);
                return None;
            }
            Ok(LibraryKind::Probed(lib)) => lib,
            Ok(LibraryKind::Unsupported(why)) => {
                warn!("{why}");
                self.unsupported.note(self.user_of_file(&file), why);
                self.not_probed(dev_inode, &file);
                return None;
            }
            Ok(LibraryKind::Linker(hook)) => {
                self.hook_own_linker(&file, hook);
                self.not_probed(dev_inode, &file);
                return None;
            }
            Ok(LibraryKind::Other) => {
                self.not_probed(dev_inode, &file);
                return None;
            }
            Err(e) => {
                debug!(library = %file.shown, error = %e, "not probed");
                self.not_probed(dev_inode, &file);
                return None;
            }
        };
        let owner = if shared {
            None
        } else {
            self.user_of_file(&file)
        };
        if let Some(uid) = owner {
            // Fortran bindings apart: they cannot take the places of the MPI they bind.
            let kind = lib.fortran_bindings;
            let held = self
                .libraries()
                .filter(|l| l.owner == Some(uid) && l.library.fortran_bindings == kind)
                .count();
            let (most, what) = if kind {
                (MAX_BINDINGS_PER_UID, "Fortran bindings libraries")
            } else {
                (MAX_LIBRARIES_PER_UID, "libraries")
            };
            if held >= most {
                let why = format!(
                    "{}: user {uid} has {held} {what} of their own probed already \
                     (at most {most}): not probed",
                    file.shown
                );
                warn!("{why}");
                self.unsupported.note(self.user_of_file(&file), why);
                self.not_probed(dev_inode, &file);
                return None;
            }
        }
        Some((file, lib, owner))
    }

    /// What the kernel needs of the library in layout `slot`: its decoding layout and, for
    /// libfabric, its text range and ops-table functions.
    fn write_library_maps(&mut self, slot: u32, lib: &Library) -> Result<(), AttachError> {
        self.layouts
            .set(slot, lib.layout, 0)
            .map_err(map_err(names::maps::LAYOUTS))?;
        if lib.abi == Abi::Fabric {
            // Where calls from libfabric's own code come from (see collector-ebpf's fabric).
            let (lo, hi) = lib.text;
            self.fabric_text
                .set(slot, FabricText { lo, hi }, 0)
                .map_err(map_err(names::maps::FABRIC_TEXT))?;
            for p in &lib.probes {
                let id = Cookie {
                    routine: p.routine,
                    layout: slot as u8,
                    abi: Abi::Fabric as u8,
                    function: p.function,
                    skip: p.skip,
                }
                .fabric_function();
                self.fabric_funcs
                    .insert(id, p.vaddr, 0)
                    .map_err(map_err(names::maps::FABRIC_FUNCS))?;
            }
        }
        Ok(())
    }

    /// The uprobe_multi links of `lib` in layout `slot` (one per program and kind of
    /// probe point), attached through the open `file`; and the failures, by message.
    fn attach_links(
        &self,
        lib: &Library,
        slot: u32,
        file: &LibraryFile,
    ) -> Result<(Vec<multi::MultiLink>, Vec<String>), AttachError> {
        let mut links = Vec::new();
        let mut failed = Vec::new();
        if lib.fortran_bindings {
            // Entries only (collector-ebpf's `sites::binding_entry`).
            let offsets: Vec<u64> = lib.probes.iter().map(|p| p.offset).collect();
            let cookies: Vec<u64> = lib.probes.iter().map(|p| p.binding_cookie).collect();
            let fd = self
                .programs
                .get(names::programs::BINDING_ENTRY)
                .ok_or(AttachError::Missing("probe program"))?;
            match multi::attach(fd.as_fd(), file, &offsets, &cookies, ProbeKind::Entry) {
                Ok(link) => links.push(link),
                Err(e) => failed.push(format!("{e:#}")),
            }
            return Ok((links, failed));
        }
        let cookie = |p: &ProbePoint| {
            Cookie {
                routine: p.routine,
                layout: slot as u8,
                abi: lib.abi as u8,
                function: p.function,
                skip: p.skip,
            }
            .pack()
        };
        // libfabric's fi_fabric has its own program (it names the provider), without return.
        let (open, all): (Vec<&ProbePoint>, Vec<&ProbePoint>) = lib
            .probes
            .iter()
            .partition(|p| p.routine == collector_common::routines::FABRIC_OPEN);
        let entry = if lib.abi == Abi::Fabric {
            names::programs::FABRIC_ENTRY
        } else {
            names::programs::CALL_ENTRY
        };
        let mut returns = Vec::new();
        match lib.abi {
            Abi::Fabric => returns.push((names::programs::FABRIC_RETURN, all.clone())),
            Abi::OpenMpi => returns.push((names::programs::MPI_RETURN_OMPI, all.clone())),
            Abi::Nccl => returns.push((names::programs::NCCL_RETURN, all.clone())),
            abi @ (Abi::Mpich | Abi::MpiAbi) => {
                // Datatype constructors have their own return program (they learn sizes).
                let (types, rest): (Vec<&ProbePoint>, Vec<&ProbePoint>) = all
                    .iter()
                    .partition(|p| ROUTINES[p.routine as usize].spec.class == class::DATATYPE);
                let (ret, ret_types) = if abi == Abi::Mpich {
                    (
                        names::programs::MPI_RETURN_MPICH,
                        names::programs::MPI_RETURN_MPICH_TYPES,
                    )
                } else {
                    (
                        names::programs::MPI_RETURN_MPI_ABI,
                        names::programs::MPI_RETURN_MPI_ABI_TYPES,
                    )
                };
                returns.push((ret, rest));
                returns.push((ret_types, types));
            }
        }
        // MPI_Pcontrol's own program (the region's bounds) beside the counting one.
        let pcontrol: Vec<&ProbePoint> = all
            .iter()
            .copied()
            .filter(|p| p.routine == collector_common::routines::PCONTROL)
            .collect();
        let mut groups = vec![
            (names::programs::FABRIC_OPEN, ProbeKind::Entry, open),
            (names::programs::MPI_PCONTROL, ProbeKind::Entry, pcontrol),
        ];
        if self.programs.sessions() {
            // One session link per return program: its entry and return in one.
            for (ret, points) in returns {
                let session = names::programs::session_for(ret)
                    .ok_or(AttachError::Missing("session program"))?;
                groups.push((session, ProbeKind::Session, points));
            }
        } else {
            groups.push((entry, ProbeKind::Entry, all));
            groups.extend(returns.into_iter().map(|(r, p)| (r, ProbeKind::Return, p)));
        }
        // Returns before entries: a call that enters between the two attachments would
        // otherwise leave its thread marked busy for good (its return never seen), and
        // every later call of the thread would be taken for a nested one and not counted.
        // The other way round, such a call's return comes without an entry: counted as
        // in flight at attach. A session attaches both at once.
        groups.sort_by_key(|(_, kind, _)| *kind != ProbeKind::Return);
        for (prog, kind, points) in groups {
            if points.is_empty() {
                continue;
            }
            let offsets: Vec<u64> = points.iter().map(|p| p.offset).collect();
            let cookies: Vec<u64> = points.iter().map(|p| cookie(p)).collect();
            let fd = self
                .programs
                .get(prog)
                .ok_or(AttachError::Missing("probe program"))?;
            match multi::attach(fd.as_fd(), file, &offsets, &cookies, kind) {
                Ok(link) => links.push(link),
                Err(e) => failed.push(format!("{e:#}")),
            }
        }
        // Detached the other way round, entries first (`multi::detach_all`).
        Ok((links, failed))
    }

    /// Whether a decision was made on the object `dev_inode` (probed, or not to be), or it
    /// was read already.
    pub fn knows(&self, dev_inode: (u64, u64)) -> bool {
        self.seen.contains_key(&dev_inode) || self.read_ahead.contains_key(&dev_inode)
    }

    /// Keeps a library read elsewhere (off the session's lock) for `attach_library`;
    /// whether it was kept (not known already).
    pub fn read_ahead(
        &mut self,
        dev_inode: (u64, u64),
        file: LibraryFile,
        read: Result<LibraryKind, symbols::SymbolError>,
    ) -> bool {
        let new = !self.knows(dev_inode);
        if new {
            self.read_ahead.insert(dev_inode, (file, read));
        }
        new
    }

    /// Forgets the decision not to probe the object `dev_inode` if it was made on other
    /// contents than those with `stamp` (its file now, as a process maps it): that file is
    /// then read as a new one.
    pub fn forget_if_changed(&mut self, dev_inode: (u64, u64), stamp: FileStamp) {
        if matches!(self.seen.get(&dev_inode), Some(Decided::NotProbed(s)) if *s != stamp) {
            debug!(
                ?dev_inode,
                "not the file decided on before under this identity (rewritten, or a deleted \
                 file's inode number given to a new one): read again"
            );
            self.seen.remove(&dev_inode);
        }
    }

    /// Remembers that the object `dev_inode` (the contents of `file`) is not probed.
    fn not_probed(&mut self, dev_inode: (u64, u64), file: &LibraryFile) {
        self.seen.insert(dev_inode, Decided::NotProbed(file.stamp));
    }

    /// Lets go of the libraries among `ids` read ahead and not attached since (their
    /// processes ended, or were not read again, first): each holds its file open.
    pub fn drop_read_ahead(&mut self, ids: &[(u64, u64)]) {
        for id in ids {
            self.read_ahead.remove(id);
        }
    }

    /// Whether the object `dev_inode` is a libfabric library or provider that commtap
    /// probes (opened with `open` and read now if it was not, and kept for
    /// `attach_library`); never with `--no-transports`.
    pub fn is_fabric_file(
        &mut self,
        dev_inode: (u64, u64),
        open: impl FnOnce() -> Result<LibraryFile, FileError>,
    ) -> bool {
        // With --no-transports no transport program runs, so their code ranges serve nothing.
        if !self.transports {
            return false;
        }
        if let Some(state) = self.seen.get(&dev_inode) {
            return matches!(state, Decided::Probed(i) if self.libraries[*i].library.abi == Abi::Fabric);
        }
        let read = match self.read_ahead.entry(dev_inode) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let Ok(file) = open() else {
                    return false;
                };
                let read = symbols::read_library(&file);
                e.insert((file, read))
            }
        };
        matches!(&read.1, Ok(LibraryKind::Probed(lib)) if lib.abi == Abi::Fabric)
    }

    /// Tells the kernel where `pid` has libfabric's code (libfabric and provider DSOs), so
    /// that calls one provider makes to another are known as libfabric's own. Beyond
    /// `MAX_FABRIC_RANGES` the rest is left out (a warning says so).
    pub fn set_fabric_ranges(&mut self, pid: u32, code: &[(u64, u64)]) -> Result<(), AttachError> {
        if code.is_empty() {
            return Ok(());
        }
        let mut r = FabricRanges::default();
        for (i, &(lo, hi)) in code.iter().take(MAX_FABRIC_RANGES).enumerate() {
            r.ranges[i] = FabricText { lo, hi };
            r.n = i as u32 + 1;
        }
        if code.len() > MAX_FABRIC_RANGES {
            warn!(
                "PID {pid}: {} libfabric code mappings, {MAX_FABRIC_RANGES} kept: calls from the others count as the application's",
                code.len()
            );
        }
        self.fabric_ranges
            .insert(pid, r, 0)
            .map_err(map_err(names::maps::FABRIC_RANGES))
    }

    /// Tells the kernel where `pid`'s Open MPI keeps the components it selects at
    /// `MPI_Init` (read at its return).
    pub fn set_mpi_components(
        &mut self,
        pid: u32,
        at: collector_common::ComponentAddrs,
    ) -> Result<(), AttachError> {
        self.mpi_components
            .insert(pid, at, 0)
            .map_err(map_err(names::maps::MPI_COMPONENTS))
    }

    /// The probed library that is the object `dev_inode`, if any.
    pub fn library_of(&self, dev_inode: (u64, u64)) -> Option<&symbols::Library> {
        let Decided::Probed(i) = *self.seen.get(&dev_inode)? else {
            return None;
        };
        Some(&self.libraries[i].library)
    }

    /// Libraries probed now (not those let go).
    pub fn libraries(&self) -> impl Iterator<Item = &AttachedLibrary> {
        self.libraries.iter().filter(|l| !l.released)
    }

    /// Libraries seen but not decoded (an unknown MPI ABI, NCCL without symbols), and how
    /// many more were not listed.
    pub fn unsupported(&self) -> Vec<String> {
        self.unsupported.list()
    }
}

/// Most objects remembered (probed or not): a node's processes map a few thousand files.
const MAX_SEEN: usize = 65_536;

/// Most reasons kept of a user's own files not probed: a user can make new files without
/// end, and each reason is in every profile.
const MAX_NOT_PROBED_PER_USER: usize = 32;

/// Why libraries seen were not probed, a user's own files' a bounded number of them.
#[derive(Debug, Default)]
pub struct NotProbed {
    /// Each reason, once, with the user whose file it is (`None`: root's).
    reasons: Vec<(Option<u32>, String)>,
    /// Reasons past a user's bound.
    left_out: u64,
}

impl NotProbed {
    /// Notes `why`, of a file of `user` (`None`: root's).
    pub fn note(&mut self, user: Option<u32>, why: String) {
        if self.reasons.iter().any(|(_, r)| *r == why) {
            return;
        }
        let held = || self.reasons.iter().filter(|(u, _)| *u == user).count();
        if user.is_some() && held() >= MAX_NOT_PROBED_PER_USER {
            self.left_out += 1;
            return;
        }
        self.reasons.push((user, why));
    }

    /// The reasons, and a last line for those not listed.
    pub fn list(&self) -> Vec<String> {
        let mut out: Vec<String> = self.reasons.iter().map(|(_, r)| r.clone()).collect();
        if self.left_out > 0 {
            out.push(format!(
                "{} more of users' own files, not listed (at most {MAX_NOT_PROBED_PER_USER} \
                 a user)",
                self.left_out
            ));
        }
        out
    }
}

/// Says what was probed in `lib` and how.
fn log_probing(lib: &Library, failed: &[String]) {
    let single = lib
        .probes
        .iter()
        .filter(|p| p.placement == Placement::SingleStepped)
        .count();
    let skipped = lib
        .probes
        .iter()
        .filter(|p| p.placement == Placement::MovedPastSingleStep)
        .count();
    info!(
        library = %lib.path,
        flavor = %lib.flavor,
        routines = lib.probes.len(),
        moved_past_single_step = skipped,
        single_stepped = single,
        failed = failed.len(),
        "probing"
    );
}
