//! Naming call sites: the address an MPI or NCCL call returned to, placed in the object its
//! process mapped there and named by the function of that object's symbol table that
//! holds it (mpitrace's profile by call site).
//!
//! A rank has often exited by the time its profile is written, its mappings gone with it:
//! so each process's executable mappings are kept as discovery read them (at its exec, at
//! each library load), and each file it maps is opened then, once (`LibraryFile`: verified
//! to be the very file mapped), and read only when one of its addresses is named. Files
//! are the node's: every rank of a job maps the same ones.

use std::{
    collections::BTreeMap,
    sync::{mpsc, Arc},
};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use super::{Elf, LibraryFile};
use crate::discover::MappedObject;

/// Most files kept open for naming call sites; past it a new file's sites are left
/// unnamed (a daemon on a node of many jobs, each with its own executables).
pub const MAX_FILES: usize = 1024;
/// Most function symbols read from one file (libtorch_cpu has about 600,000).
const MAX_FUNCTIONS: usize = 2 << 20;
/// Longest function name kept (C++ templates can run to many kilobytes).
const MAX_NAME: usize = 512;
/// Most bytes of names read from one file.
const MAX_NAME_BYTES: usize = 64 << 20;

/// Where a call was made from, as far as it could be named.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Named {
    /// The file mapped at the address, as the process named it.
    pub object: Option<String>,
    /// The function holding it, by the file's symbols.
    pub function: Option<String>,
    /// The address's distance from that function's start.
    pub offset: u64,
    /// The address as the file's own (its symbols' and debuggers' addresses), where the
    /// file could be read.
    pub file_address: Option<u64>,
}

/// A file's functions, sorted by address (file-relative, as its symbols say).
#[derive(Debug, Default)]
struct Functions {
    /// Address, size (0: unknown), name.
    by_address: Vec<(u64, u64, Box<str>)>,
    /// The virtual address the file's first byte is loaded at (its first segment's: 0 for
    /// libraries and position-independent executables).
    base: u64,
}

impl Functions {
    /// The memory it holds, about.
    fn bytes(&self) -> u64 {
        let names: usize = self.by_address.iter().map(|(_, _, n)| n.len()).sum();
        (self.by_address.len() * size_of::<(u64, u64, Box<str>)>() + names) as u64
    }

    /// The function holding file-relative address `at`, and the distance from its start.
    fn holding(&self, at: u64) -> Option<(&str, u64)> {
        let i = self.by_address.partition_point(|(a, ..)| *a <= at);
        let (start, size, name) = self.by_address.get(i.checked_sub(1)?)?;
        // A symbol without a size (hand-written assembly) holds what follows it up to the
        // next one.
        (*size == 0 || at < start + size).then(|| (&**name, at - start))
    }
}

/// A file opened for naming.
#[derive(Debug)]
enum SiteFile {
    /// Being read by the reader thread.
    Reading,
    /// Read (or found unreadable, not calling MPI or NCCL, or past the memory cap: no
    /// functions).
    Read(Arc<Functions>),
}

/// Most bytes the function tables of all files may hold (names and entries); a file read
/// past it is left unread, its sites named by file and address.
pub const MAX_HELD_BYTES: u64 = 256 << 20;

/// The files of the processes whose call sites are counted, by identity.
///
/// Symbol tables are read by a thread of their own, as soon as a file is opened (a
/// framework's library holds hundreds of thousands of symbols: a second's read), so that
/// a daemon's loop never waits for one: a site is named once its file is read, by the
/// next profile. `record` waits for them ([`SiteFiles::wait_for_reads`]): its profile is
/// the last. Only the files that can hold a call site are read whole: the program, and
/// the files that call MPI or NCCL by name.
#[derive(Debug, Default)]
pub struct SiteFiles {
    files: BTreeMap<(u64, u64), SiteFile>,
    reader: Option<Reader>,
    wait: bool,
    /// Bytes the function tables read hold.
    held: u64,
}

/// The thread that reads symbol tables, and the way to it and back.
#[derive(Debug)]
struct Reader {
    ask: mpsc::Sender<((u64, u64), LibraryFile, bool)>,
    read: mpsc::Receiver<((u64, u64), Functions)>,
}

impl Reader {
    fn start() -> Option<Reader> {
        let (ask, asked) = mpsc::channel::<((u64, u64), LibraryFile, bool)>();
        let (done, read) = mpsc::channel();
        std::thread::Builder::new()
            .name("commtap-symbols".into())
            .spawn(move || {
                // Ends when the files' owner is dropped (the sender with it).
                for (id, file, program) in asked {
                    let functions = read_functions(&file, program).unwrap_or_else(|e| {
                        tracing::debug!(file = %file.shown, error = %e, "call sites not named");
                        Functions::default()
                    });
                    if done.send((id, functions)).is_err() {
                        return;
                    }
                }
            })
            .map_err(
                |e| tracing::warn!(error = %e, "no thread to read symbols: call sites not named"),
            )
            .ok()?;
        Some(Reader { ask, read })
    }
}

impl SiteFiles {
    /// Makes naming wait for the files' reads (a last profile), instead of naming sites
    /// by file and address until they are read.
    pub fn wait_for_reads(&mut self, wait: bool) {
        self.wait = wait;
    }

    /// Opens, through `open`, the files among `objects` not already open (up to
    /// [`MAX_FILES`]), and has them read; the first is the program.
    pub fn open_new(
        &mut self,
        objects: &[MappedObject],
        open: impl Fn(&MappedObject) -> Option<LibraryFile>,
    ) {
        if self.reader.is_none() && !objects.is_empty() {
            self.reader = Reader::start();
        }
        for (i, o) in objects.iter().enumerate() {
            if self.files.len() >= MAX_FILES {
                return;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = self.files.entry(o.dev_inode) {
                if let Some(file) = open(o) {
                    let asked = self
                        .reader
                        .as_ref()
                        .is_some_and(|r| r.ask.send((o.dev_inode, file, i == 0)).is_ok());
                    e.insert(if asked {
                        SiteFile::Reading
                    } else {
                        SiteFile::Read(Arc::default())
                    });
                }
            }
        }
    }

    /// Closes the files none of `mapped` is.
    pub fn keep_only(&mut self, mapped: &std::collections::BTreeSet<(u64, u64)>) {
        let mut freed = 0;
        self.files.retain(|id, f| {
            let keep = mapped.contains(id);
            if let (false, SiteFile::Read(functions)) = (keep, f) {
                freed += functions.bytes();
            }
            keep
        });
        self.held = self.held.saturating_sub(freed);
    }

    /// Names `address` of a process that mapped `objects`.
    pub fn name(&mut self, objects: &[MappedObject], address: u64) -> Named {
        let Some(o) = objects
            .iter()
            .find(|o| o.code.iter().any(|(lo, hi)| (*lo..*hi).contains(&address)))
        else {
            return Named::default();
        };
        let object = Some(o.path.display().to_string());
        let (Some(bias), Some(functions)) = (o.bias, self.functions(o.dev_inode)) else {
            return Named {
                object,
                ..Named::default()
            };
        };
        let at = address - bias + functions.base;
        let (function, offset) = functions
            .holding(at)
            .map_or((None, 0), |(name, offset)| (Some(name.to_string()), offset));
        Named {
            object,
            function,
            offset,
            file_address: Some(at),
        }
    }

    /// The functions of the file `id`, once read (waited for, where naming waits).
    fn functions(&mut self, id: (u64, u64)) -> Option<Arc<Functions>> {
        self.take_reads(false);
        while self.wait && matches!(self.files.get(&id), Some(SiteFile::Reading)) {
            if !self.take_reads(true) {
                break;
            }
        }
        match self.files.get(&id)? {
            SiteFile::Read(f) => Some(Arc::clone(f)),
            SiteFile::Reading => None,
        }
    }

    /// Keeps the tables the reader has finished (waiting for one, if `block`); whether
    /// the reader is still there.
    fn take_reads(&mut self, block: bool) -> bool {
        let Some(reader) = &self.reader else {
            return false;
        };
        let mut got = Vec::new();
        if block {
            match reader.read.recv() {
                Ok(r) => got.push(r),
                Err(_) => return false,
            }
        }
        got.extend(reader.read.try_iter());
        for (id, functions) in got {
            let bytes = functions.bytes();
            let functions = if self.held + bytes > MAX_HELD_BYTES {
                tracing::warn!(
                    bytes,
                    held = self.held,
                    "symbol tables past their memory cap: call sites in this file named by address"
                );
                Functions::default()
            } else {
                self.held += bytes;
                functions
            };
            if let Some(entry) = self.files.get_mut(&id) {
                *entry = SiteFile::Read(Arc::new(functions));
            }
        }
        true
    }
}

/// Whether a symbol named `name` is an MPI or NCCL routine (C, Fortran or profiling
/// name): a file that names one calls them (or is the library).
fn names_mpi_or_nccl(name: &str) -> bool {
    ["MPI_", "PMPI_", "mpi_", "pmpi_", "nccl", "pnccl"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// The function symbols of `file` (its static table and its dynamic one), sorted; none
/// where it is not the `program` and names no MPI or NCCL routine among its dynamic
/// symbols (it makes no call a site is counted for: libc, libm ...).
fn read_functions(file: &LibraryFile, program: bool) -> Result<Functions, super::SymbolError> {
    let data = file.data().map_err(|source| super::SymbolError::Io {
        path: file.shown.clone(),
        source,
    })?;
    let elf: Elf = object::File::parse(&data).map_err(|source| super::SymbolError::Elf {
        path: file.shown.clone(),
        source,
    })?;
    if !program
        && !elf
            .dynamic_symbols()
            .any(|sym| sym.name().is_ok_and(names_mpi_or_nccl))
    {
        return Ok(Functions::default());
    }
    let base = elf
        .segments()
        .find(|s| s.file_range().0 == 0)
        .map_or(0, |s| s.address());
    let mut by_address = Vec::new();
    let mut name_bytes = 0;
    for sym in elf.symbols().chain(elf.dynamic_symbols()) {
        if by_address.len() >= MAX_FUNCTIONS || name_bytes >= MAX_NAME_BYTES {
            break;
        }
        if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let name = match name.char_indices().nth(MAX_NAME) {
            Some((cut, _)) => &name[..cut],
            None => name,
        };
        name_bytes += name.len();
        by_address.push((sym.address(), sym.size(), name.into()));
    }
    // The static table's name first where both tables name an address (the dynamic one
    // may hold a versioned alias).
    by_address.sort_by_key(|(a, ..)| *a);
    by_address.dedup_by_key(|(a, ..)| *a);
    Ok(Functions { by_address, base })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(42)
    }

    /// This test's own process: an address in one of its functions is named by that
    /// function, through its mappings and its executable's symbols, whether naming waits
    /// for the read or takes it from a later look.
    #[test]
    fn an_address_in_this_process_is_named_by_its_function() {
        let pid = std::process::id();
        let objects = crate::discover::mapped_objects(pid).expect("own mappings");
        let address = a_function_to_find as *const () as u64 + 3;
        for wait in [true, false] {
            let mut files = SiteFiles::default();
            files.wait_for_reads(wait);
            files.open_new(&objects, |o| {
                crate::session::follow::open_object(pid, o).ok()
            });
            let mut named = files.name(&objects, address);
            while !wait && named.function.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(10));
                named = files.name(&objects, address);
            }
            let function = named.function.expect("named");
            assert!(function.contains("a_function_to_find"), "{function}");
            assert_eq!(named.offset, 3);
            let exe = std::fs::read_link("/proc/self/exe").expect("exe");
            assert_eq!(named.object, Some(exe.display().to_string()));
            assert!(files.held > 0);
            // Closed with the last process mapping it: what its table held is given back.
            files.keep_only(&Default::default());
            assert_eq!(files.held, 0);
        }
    }

    #[test]
    fn an_address_is_named_by_the_function_holding_it() {
        let f = Functions {
            by_address: vec![
                (0x1000, 0x20, "negotiate".into()),
                (0x1040, 0, "asm_stub".into()),
                (0x1100, 0x10, "reduce".into()),
            ],
            base: 0,
        };
        assert_eq!(f.holding(0x1000), Some(("negotiate", 0)));
        assert_eq!(f.holding(0x101f), Some(("negotiate", 0x1f)));
        // Between two functions: no function holds it.
        assert_eq!(f.holding(0x1020), None);
        // A symbol without a size holds up to the next one.
        assert_eq!(f.holding(0x10ff), Some(("asm_stub", 0xbf)));
        assert_eq!(f.holding(0x1105), Some(("reduce", 5)));
        assert_eq!(f.holding(0x0fff), None);
        assert_eq!(f.holding(0x1110), None);
    }
}
