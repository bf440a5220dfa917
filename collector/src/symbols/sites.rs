//! Naming call sites: the address an MPI or NCCL call returned to, placed in the object its
//! process mapped there and named by the function of that object's symbol table that
//! holds it (mpitrace's profile by call site).
//!
//! A rank has often exited by the time its profile is written, its mappings gone with it:
//! so each process's executable mappings are kept as discovery read them (at its exec, at
//! each library load), and each file it maps is opened at once, once (`LibraryFile`:
//! verified to be the very file mapped), and its symbols read. Both by a thread of their
//! own, never under the session's lock (a file on a hung file system blocks that thread
//! alone). Files are the node's: every rank of a job maps the same ones.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc,
    },
    time::Duration,
};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use super::{file::FileKey, Elf, LibraryFile};
use crate::discover::MappedObject;

/// Most files open (or asked to be) for naming call sites; past it a new file's sites are
/// left unnamed (a daemon on a node of many jobs, each with its own executables).
pub const MAX_FILES: usize = 1024;
/// Most function symbols read from one file (libtorch_cpu has about 600,000).
const MAX_FUNCTIONS: usize = 2 << 20;
/// Longest symbol kept (C++ templates can run to many kilobytes): a longer one is cut, and
/// so shown mangled.
const MAX_SYMBOL: usize = 1024;
/// Longest function name shown (demangled).
const MAX_NAME: usize = 256;
/// Most bytes of names read from one file.
const MAX_NAME_BYTES: usize = 64 << 20;
/// Most bytes the function tables of all files may hold (names and entries), read and not
/// yet taken included; a file read past it is left unread, its sites named by file and
/// address.
pub const MAX_HELD_BYTES: u64 = 256 << 20;
/// Most files waiting to be opened by the reader.
const MAX_ASKED: usize = 4096;
/// Longest a last profile waits for one file's symbols (a file on a hung file system).
const READ_WAIT: Duration = Duration::from_secs(20);

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
    /// The source file and line of the call, where the file has line tables (`-g`).
    pub source: Option<(String, u32)>,
}

/// A file's functions, sorted by address (file-relative, as its symbols say).
#[derive(Debug, Default)]
struct Functions {
    /// Address, size (0: unknown), name.
    by_address: Vec<(u64, u64, Box<str>)>,
    /// What its loadable segments' addresses are less their file offsets (the address its
    /// first byte would have): 0 for libraries and position-independent executables.
    base: u64,
    /// Its source lines, where it has line tables.
    lines: Option<super::lines::Lines>,
}

impl Functions {
    /// The memory it holds, about.
    fn bytes(&self) -> u64 {
        let names: usize = self.by_address.iter().map(|(_, _, n)| n.len()).sum();
        (self.by_address.len() * size_of::<(u64, u64, Box<str>)>() + names) as u64
            + self.lines.as_ref().map_or(0, super::lines::Lines::bytes)
    }

    /// The function holding file-relative address `at`, and the distance from its start.
    fn holding(&self, at: u64) -> Option<(&str, u64)> {
        let i = self.by_address.partition_point(|(a, ..)| *a <= at);
        let (start, size, name) = self.by_address.get(i.checked_sub(1)?)?;
        // A symbol without a size (hand-written assembly) holds what follows it up to the
        // next one.
        (*size == 0 || at < start.saturating_add(*size)).then(|| (&**name, at - start))
    }
}

/// A file asked for.
#[derive(Debug)]
enum SiteFile {
    /// Being opened and read by the reader thread.
    Reading,
    /// Read (or found unreadable, not calling MPI or NCCL, or past the memory cap: no
    /// functions).
    Read(Arc<Functions>),
}

/// What the reader is asked: open the file `object` (as `pid` maps it) and read it, whole
/// where it is the `program`.
#[derive(Debug)]
struct Asked {
    pid: u32,
    object: MappedObject,
    program: bool,
}

/// What the reader answers of a file (by its contents: a file rewritten in place, or given
/// a deleted file's inode number, has other functions at the same identity, and the sites
/// of processes that mapped the earlier contents are still named by those): its functions,
/// or `None` where it could not be opened (its process gone: another process mapping it may
/// be asked again).
type Answer = (FileKey, Option<Functions>);

/// The files of the processes whose call sites are counted, by identity.
///
/// Opened and read by a thread of their own as soon as discovery sees them mapped (a
/// framework's library holds hundreds of thousands of symbols: a second's read), so that
/// a daemon's loop never waits for a file: a site is named once its file is read, by the
/// next profile. `record` waits for them ([`SiteFiles::wait_for_reads`]): its profile is
/// the last. Only the files that can hold a call site are read whole: the program, and
/// the files that name MPI or NCCL routines among their dynamic symbols.
#[derive(Debug, Default)]
pub struct SiteFiles {
    files: BTreeMap<FileKey, SiteFile>,
    reader: Option<Reader>,
    wait: bool,
    /// Bytes the function tables read hold, the reader's answers not yet taken included
    /// (the reader adds, the owner takes away what it drops).
    held: Arc<AtomicU64>,
}

/// The thread that opens and reads files, and the way to it and back.
#[derive(Debug)]
struct Reader {
    ask: mpsc::SyncSender<Asked>,
    answers: mpsc::Receiver<Answer>,
}

impl Reader {
    fn start(held: Arc<AtomicU64>) -> Option<Reader> {
        let (ask, asked) = mpsc::sync_channel::<Asked>(MAX_ASKED);
        let (answer, answers) = mpsc::channel();
        std::thread::Builder::new()
            .name("commtap-symbols".into())
            .spawn(move || read_asked(&asked, &answer, &held))
            .map_err(
                |e| tracing::warn!(error = %e, "no thread to read symbols: call sites not named"),
            )
            .ok()?;
        Some(Reader { ask, answers })
    }
}

/// The reader thread: opens every file asked as soon as it is asked (before the process
/// mapping it may exit), and reads them one after the other. Ends when its owner is
/// dropped.
fn read_asked(asked: &mpsc::Receiver<Asked>, answer: &mpsc::Sender<Answer>, held: &AtomicU64) {
    let mut opened: VecDeque<(FileKey, LibraryFile, bool)> = VecDeque::new();
    let open = |a: Asked, opened: &mut VecDeque<_>| {
        let shown = a.object.path.display().to_string();
        let key = a.object.contents();
        match LibraryFile::open_mapped(a.pid, a.object.range, a.object.dev_inode, &shown) {
            // Written since its process's mappings were read: asked again as it is now.
            Ok(file) if file.stamp == a.object.stamp => opened.push_back((key, file, a.program)),
            Ok(_) => {
                let _ = answer.send((key, None));
            }
            Err(e) => {
                tracing::debug!(file = %shown, error = %e, "not opened to name call sites");
                let _ = answer.send((key, None));
            }
        }
    };
    loop {
        if opened.is_empty() {
            let Ok(a) = asked.recv() else { return };
            open(a, &mut opened);
        }
        while let Ok(a) = asked.try_recv() {
            open(a, &mut opened);
        }
        let Some((id, file, program)) = opened.pop_front() else {
            continue;
        };
        let functions = if held.load(Ordering::Relaxed) >= MAX_HELD_BYTES {
            tracing::warn!(file = %file.shown, "symbol tables past their memory cap: its call sites named by address");
            Functions::default()
        } else {
            read_functions(&file, program).unwrap_or_else(|e| {
                tracing::debug!(file = %file.shown, error = %e, "call sites not named");
                Functions::default()
            })
        };
        held.fetch_add(functions.bytes(), Ordering::Relaxed);
        if answer.send((id, Some(functions))).is_err() {
            return;
        }
    }
}

impl SiteFiles {
    /// Makes naming wait for the files' reads (a last profile), instead of naming sites
    /// by file and address until they are read.
    pub fn wait_for_reads(&mut self, wait: bool) {
        self.wait = wait;
    }

    /// Whether naming waits for the files' reads.
    pub fn waits(&self) -> bool {
        self.wait
    }

    /// Has the files among `objects` (mapped by `pid`) not asked for yet opened and read
    /// (up to [`MAX_FILES`]); the first is the program.
    pub fn ask(&mut self, pid: u32, objects: &[MappedObject]) {
        if self.reader.is_none() && !objects.is_empty() {
            self.reader = Reader::start(Arc::clone(&self.held));
        }
        let Some(reader) = &self.reader else { return };
        for (i, o) in objects.iter().enumerate() {
            if self.files.len() >= MAX_FILES {
                return;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = self.files.entry(o.contents()) {
                let asked = Asked {
                    pid,
                    object: o.clone(),
                    program: i == 0,
                };
                // Full (the reader stuck on a file): asked again at the next look.
                if reader.ask.try_send(asked).is_ok() {
                    e.insert(SiteFile::Reading);
                }
            }
        }
    }

    /// Closes the files none of `mapped` is.
    pub fn keep_only(&mut self, mapped: &std::collections::BTreeSet<FileKey>) {
        let mut freed = 0;
        self.files.retain(|id, f| {
            let keep = mapped.contains(id);
            if let (false, SiteFile::Read(functions)) = (keep, f) {
                freed += functions.bytes();
            }
            keep
        });
        self.held.fetch_sub(freed, Ordering::Relaxed);
    }

    /// Names `address` of a process that mapped `objects`.
    pub fn name(&mut self, objects: &[MappedObject], address: u64) -> Named {
        let Some(o) = objects
            .iter()
            .find(|o| o.code.iter().any(|(lo, hi)| (*lo..*hi).contains(&address)))
        else {
            return Named::default();
        };
        let object = Some(super::shown(&o.path.display().to_string(), super::MAX_PATH));
        let functions = self.functions(o.contents());
        // The file's own address; none where a mapping a user arranged makes no sense of it.
        let at = o
            .bias
            .zip(functions.as_ref())
            .and_then(|(bias, f)| address.checked_sub(bias)?.checked_add(f.base));
        let (Some(at), Some(functions)) = (at, functions) else {
            return Named {
                object,
                ..Named::default()
            };
        };
        // The call itself is the instruction before the address it returns to (a call to a
        // routine that never returns may end its function).
        let call = at.saturating_sub(1);
        let source = functions
            .lines
            .as_ref()
            .and_then(|l| l.at(call))
            .map(|(file, line)| (file.to_string(), line));
        let (function, offset) = functions
            .holding(call)
            .map_or((None, 0), |(symbol, offset)| {
                (Some(function_name(symbol)), offset + 1)
            });
        Named {
            object,
            function,
            offset,
            file_address: Some(at),
            source,
        }
    }

    /// The functions of the file `id`, once read (waited for, where naming waits).
    fn functions(&mut self, id: FileKey) -> Option<Arc<Functions>> {
        self.take_answers(None);
        while self.wait && matches!(self.files.get(&id), Some(SiteFile::Reading)) {
            if !self.take_answers(Some(READ_WAIT)) {
                tracing::warn!("symbols not read in time: call sites named by address");
                self.wait = false;
            }
        }
        match self.files.get(&id)? {
            SiteFile::Read(f) => Some(Arc::clone(f)),
            SiteFile::Reading => None,
        }
    }

    /// Takes the reader's answers (waiting up to `wait` for one); whether one came or
    /// none was waited for.
    fn take_answers(&mut self, wait: Option<Duration>) -> bool {
        let Some(reader) = &self.reader else {
            return false;
        };
        let mut got = Vec::new();
        if let Some(wait) = wait {
            match reader.answers.recv_timeout(wait) {
                Ok(a) => got.push(a),
                Err(_) => return false,
            }
        }
        got.extend(reader.answers.try_iter());
        for (id, answer) in got {
            match (self.files.get_mut(&id), answer) {
                // Asked, now read.
                (Some(entry @ SiteFile::Reading), Some(functions)) => {
                    *entry = SiteFile::Read(Arc::new(functions));
                }
                // Not opened: asked again by the next process that maps it.
                (Some(SiteFile::Reading), None) => {
                    self.files.remove(&id);
                }
                // Closed meanwhile (or read twice): what it holds is given back.
                (_, Some(functions)) => {
                    self.held.fetch_sub(functions.bytes(), Ordering::Relaxed);
                }
                (_, None) => {}
            }
        }
        true
    }
}

/// What naming does with a file a user controls, for the fuzz target of hostile files
/// (`fuzz/fuzz_targets/library_elf.rs`): its functions and lines read as a program's, and
/// its first functions named as sites are (demangled, with their lines); their text's
/// length.
#[doc(hidden)]
pub fn name_functions_of(file: &LibraryFile) -> usize {
    let Ok(f) = read_functions(file, true) else {
        return 0;
    };
    f.by_address
        .iter()
        .take(64)
        .map(|(address, _, symbol)| {
            let line = f.lines.as_ref().and_then(|l| l.at(*address));
            function_name(symbol).len() + line.map_or(0, |(p, _)| p.len())
        })
        .sum()
}

/// A function's symbol (as read: printable, cut at [`MAX_SYMBOL`]) as a site shows it:
/// demangled and shortened to [`MAX_NAME`]; one cut when read is shown as it is (it may
/// still demangle, to another signature).
fn function_name(symbol: &str) -> String {
    if symbol.chars().count() >= MAX_SYMBOL {
        symbol.chars().take(MAX_NAME).collect()
    } else {
        crate::client::printable(&super::demangle::readable(symbol, MAX_NAME))
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
/// symbols (it makes no call a site is counted for: libc, libm ...). Names are made
/// printable (a report is read on a terminal).
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
        .filter_map(|s| s.address().checked_sub(s.file_range().0))
        .min()
        .unwrap_or(0);
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
        let name = super::shown(name, MAX_SYMBOL);
        name_bytes += name.len();
        by_address.push((sym.address(), sym.size(), name.into_boxed_str()));
    }
    // Of the names of one address, the one a reader knows best (`alias_rank`), and the
    // static table's first among equals (the dynamic one may hold a versioned alias).
    by_address
        .sort_by(|(a, _, x), (b, _, y)| a.cmp(b).then_with(|| alias_rank(x).cmp(&alias_rank(y))));
    by_address.dedup_by_key(|(a, ..)| *a);
    Ok(Functions {
        by_address,
        base,
        lines: super::lines::Lines::read(&elf),
    })
}

/// How well a reader knows a function by `name` among the aliases of its address (lowest
/// first): an MPI's Fortran bindings give one routine ten names (`MPI_BARRIER`,
/// `mpi_barrier_`, `pmpi_barrier__`, `MPI_Barrier_f08`, `ompi_barrier_f` ...), of which a
/// `use mpi` program calls the gfortran one (`mpi_barrier_`): first; the profiling
/// (`PMPI`) and `mpi_f08` names last.
fn alias_rank(name: &str) -> u8 {
    // Compared in place: a table's symbols are sorted by it (millions of comparisons).
    let (b, ci) = (name.as_bytes(), <[u8]>::eq_ignore_ascii_case);
    let starts = |p: &str| b.get(..p.len()).is_some_and(|h| ci(h, p.as_bytes()));
    let ends = |p: &str| {
        b.len()
            .checked_sub(p.len())
            .is_some_and(|at| ci(&b[at..], p.as_bytes()))
    };
    let gfortran = name.starts_with("mpi_")
        && !b.iter().any(u8::is_ascii_uppercase)
        && name.ends_with('_')
        && !name.ends_with("__");
    if starts("pmpi") || starts("pnccl") {
        3
    } else if ends("_f08") {
        2
    } else {
        u8::from(!gfortran)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_a_fortran_bindings_aliases_the_gfortran_name_is_shown() {
        let mut names = [
            "PMPI_Barrier_f08",
            "MPI_Barrier_f08",
            "pmpi_barrier_",
            "MPI_BARRIER",
            "mpi_barrier__",
            "mpi_barrier_",
            "mpi_barrier",
            "ompi_barrier_f",
        ];
        names.sort_by_key(|n| alias_rank(n));
        assert_eq!(names[0], "mpi_barrier_");
        assert!(alias_rank("mpi_finalize_") < alias_rank("ompi_finalize_f"));
        assert_eq!(alias_rank("negotiate"), alias_rank("MPI_BARRIER"));
        assert!(alias_rank("MPI_Barrier_f08") < alias_rank("PMPI_Barrier"));
    }

    /// Its own line.
    #[inline(never)]
    fn a_function_to_find() -> u32 {
        std::hint::black_box(line!())
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
            files.ask(pid, &objects);
            let deadline = std::time::Instant::now() + Duration::from_mins(1);
            let mut named = files.name(&objects, address);
            while !wait && named.function.is_none() {
                assert!(std::time::Instant::now() < deadline, "never named");
                std::thread::sleep(Duration::from_millis(10));
                named = files.name(&objects, address);
            }
            let function = named.function.expect("named");
            assert_eq!(
                function,
                "collector::symbols::sites::tests::a_function_to_find"
            );
            assert_eq!(named.offset, 3);
            // Its first instructions are the `fn` line's or the body's (the tests are built
            // with line tables).
            let (file, line) = named.source.expect("a line");
            assert!(file.ends_with("src/symbols/sites.rs"), "{file}");
            let body = a_function_to_find();
            assert!((body - 2..=body).contains(&line), "{line} for {body}");
            let exe = std::fs::read_link("/proc/self/exe").expect("exe");
            assert_eq!(named.object, Some(exe.display().to_string()));
            assert!(files.held.load(Ordering::Relaxed) > 0);
            // Closed with the last process mapping it: what its table held is given back.
            files.keep_only(&Default::default());
            assert_eq!(files.held.load(Ordering::Relaxed), 0);
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
            lines: None,
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
