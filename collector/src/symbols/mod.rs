//! Reading a mapped object once: whether it is an MPI library or holds NCCL (libnccl,
//! librccl, or NCCL linked into another library or the executable), which ABI it has, where
//! each probed routine lives (as a file offset), and which instruction each probe lands on.
//!
//! Probes are placed by (file, offset), never by name: `MPI_X`, `PMPI_X` and the Fortran
//! names share one address, as do `ncclX` and `pncclX`, and attaching twice would count
//! twice.

pub mod fabric;
pub mod file;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use collector_common::{routines::Family, Abi, Layout, ROUTINES};
use object::{Object, ObjectSection, ObjectSymbol, ReadRef};

pub use file::{Elf, LibraryFile};

/// How the parsers reach a library's bytes.
pub type Data<'a> = &'a file::LibraryData;
use serde::Serialize;

/// Errors reading a library.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// The file could not be read.
    #[error("reading {path}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not an ELF object we can parse.
    #[error("parsing ELF {path}")]
    Elf {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: object::Error,
    },
}

/// Where a probe sits relative to the function's first instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// At the first instruction, which the kernel emulates (push, jmp, call, nop).
    Entry,
    /// After a first instruction the kernel would single-step (a RIP-relative load into a
    /// scratch register), on the next one, which it emulates; arguments are still intact.
    MovedPastSingleStep,
    /// At a first instruction the kernel must single-step out of line (about ten times
    /// dearer per call); no safe emulated instruction follows it.
    SingleStepped,
}

/// One probe point in a library.
#[derive(Clone, Debug, Serialize)]
pub struct ProbePoint {
    /// Routine id (index into `ROUTINES`).
    pub routine: u16,
    /// Routine name.
    pub name: &'static str,
    /// File offset the uprobe is attached at.
    pub offset: u64,
    /// Where it sits.
    pub placement: Placement,
    /// libfabric: the function's index among its library's probes.
    #[serde(skip)]
    pub function: u16,
    /// Bytes between the function's start and `offset`.
    #[serde(skip)]
    pub skip: u8,
    /// The function's virtual address in the file.
    #[serde(skip)]
    pub vaddr: u64,
}

/// A library (MPI, or one holding NCCL) as commtap probes it.
#[derive(Clone, Debug, Serialize)]
pub struct Library {
    /// Path it was read from.
    pub path: String,
    /// Implementation family, for handle decoding.
    #[serde(serialize_with = "ser_abi")]
    pub abi: Abi,
    /// Human name of the implementation and version line, e.g. "Open MPI 4.x", "NCCL 2.32.3".
    pub flavor: String,
    /// Object layout offsets for handle decoding.
    #[serde(skip)]
    pub layout: Layout,
    /// Probe points, one per distinct code address.
    pub probes: Vec<ProbePoint>,
    /// Routines not present in this library.
    pub missing: Vec<&'static str>,
    /// Which family of routines it is probed for.
    #[serde(skip)]
    pub family: Family,
    /// Virtual addresses of its `.text` (start, end).
    #[serde(skip)]
    pub text: (u64, u64),
    /// libfabric: the providers' `struct fi_provider`s it holds.
    #[serde(skip)]
    pub fabric_providers: Vec<fabric::ProviderStruct>,
}

fn ser_abi<S: serde::Serializer>(abi: &Abi, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match abi {
        Abi::OpenMpi => "open_mpi",
        Abi::Mpich => "mpich",
        Abi::Nccl => "nccl",
        Abi::Fabric => "libfabric",
    })
}

/// What reading a mapped object found.
#[derive(Debug)]
pub enum LibraryKind {
    /// A library commtap can probe.
    Probed(Library),
    /// An MPI library whose ABI commtap does not decode, or an object that holds NCCL
    /// without its symbols (reason given).
    Unsupported(String),
    /// Neither MPI nor NCCL.
    Other,
}

/// Open MPI 4.x object offsets (from libopenmpi-dev 4.1.4's headers, verified at runtime).
const OMPI4: Layout = Layout {
    dt_size_off: 24,
    comm_rank_off: 228,
    comm_group_off: 248,
    group_size_off: 16,
    comm_cid_off: 224,
    _pad: 0,
};
/// Open MPI 5.0 object offsets (found by scanning a live process; see TARGETS.md §3).
const OMPI5: Layout = Layout {
    dt_size_off: 24,
    comm_rank_off: 220,
    comm_group_off: 264,
    group_size_off: 16,
    // 5.0's context id is a 128-bit extended id whose layout is not verified here.
    comm_cid_off: 0,
    _pad: 0,
};

/// Reads `file` (opened once, see [`file`]) and decides whether and how to probe it.
pub fn read_library(file: &LibraryFile) -> Result<LibraryKind, SymbolError> {
    let display = file.shown.clone();
    let data = file.data().map_err(|source| SymbolError::Io {
        path: display.clone(),
        source,
    })?;
    let map = &data;
    let elf: Elf = object::File::parse(map).map_err(|source| SymbolError::Elf {
        path: display.clone(),
        source,
    })?;

    // name -> address; dynamic symbols first, the static table where a library keeps one.
    let mut syms: BTreeMap<&str, u64> = BTreeMap::new();
    // The same, global symbols only: a CUDA runtime linked in privately (as in libnccl)
    // serves its library, not the application.
    let mut globals: BTreeMap<&str, u64> = BTreeMap::new();
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        if sym.is_definition() && sym.address() != 0 {
            if let Ok(name) = sym.name() {
                syms.entry(name).or_insert(sym.address());
                if !sym.is_local() {
                    globals.entry(name).or_insert(sym.address());
                }
            }
        }
    }
    let has = |name: &str| syms.contains_key(name);
    let has_cuda = |name: &str| globals.contains_key(name);
    let (runtime, driver) = (
        has_cuda("cudaStreamSynchronize"),
        has_cuda("cuStreamSynchronize"),
    );
    if let Some(plugin) = nccl_net_plugin(&elf, map, &globals, &display) {
        return Ok(plugin);
    }
    if has("ncclAllReduce") || has("pncclAllReduce") {
        let flavor = nccl_version(&elf, file);
        let mut lib = probe_points(
            &elf,
            map,
            &syms,
            display.clone(),
            (Abi::Nccl, flavor, Layout::default()),
            Family::Nccl,
        );
        // An executable that links NCCL and the CUDA runtime in: its waits for the GPU too.
        if runtime || driver {
            let cuda = probe_points(
                &elf,
                map,
                &globals,
                display,
                (Abi::Nccl, String::new(), Layout::default()),
                Family::Cuda,
            );
            lib.probes.extend(cuda.probes);
            lib.missing.extend(cuda.missing);
        }
        return Ok(LibraryKind::Probed(lib));
    }
    if !has("MPI_Send") && !has("PMPI_Send") {
        if has_cuda("fi_getinfo") && has_cuda("fi_fabric") {
            let open = globals.get("fi_fabric").copied();
            return Ok(fabric_library(
                &elf,
                map,
                display,
                "libfabric".to_string(),
                open,
            ));
        }
        // A provider built as its own DSO (`prov/libtcp-fi.so`, as Intel MPI ships
        // libfabric), loaded by libfabric through its `fi_prov_ini`: its ops tables are the
        // data path of the endpoints it serves.
        if has_cuda("fi_prov_ini") {
            let name = Path::new(&display)
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("lib"))
                .and_then(|n| n.split("-fi").next())
                .unwrap_or("?")
                .to_string();
            let flavor = format!("libfabric provider {name}");
            return Ok(fabric_library(&elf, map, display, flavor, None));
        }
        if !runtime && !driver {
            // NCCL linked in with hidden symbols, or a stripped libnccl: say so rather than
            // report a training process as communication-free. A library that imports NCCL
            // (PyTorch's libtorch_cuda carries a banner too) calls the libnccl probed beside it.
            let imports_nccl = elf
                .dynamic_symbols()
                .any(|s| s.is_undefined() && s.name().is_ok_and(|n| n.starts_with("nccl")));
            return Ok(match nccl_banner_version(&elf, file) {
                Some(v) if !imports_nccl => LibraryKind::Unsupported(format!(
                    "{display}: holds NCCL {v} but none of its symbols (stripped, or linked \
                     in with hidden visibility): not probed"
                )),
                _ => LibraryKind::Other,
            });
        }
        let flavor = if runtime {
            "CUDA runtime"
        } else {
            "CUDA driver"
        };
        // Decoded by NCCL's return program, which keeps the device-time windows.
        return Ok(LibraryKind::Probed(probe_points(
            &elf,
            map,
            &globals,
            display,
            (Abi::Nccl, flavor.to_string(), Layout::default()),
            Family::Cuda,
        )));
    }
    let needed = needed_libs(&elf);
    let (abi, flavor, layout) = if syms.contains_key("ompi_mpi_comm_world") {
        if needed.iter().any(|n| n.starts_with("libopen-pal.so.40")) {
            (Abi::OpenMpi, "Open MPI 4.x", OMPI4)
        } else if syms.contains_key("ompi_mpi_instance_default")
            || needed.iter().any(|n| n.starts_with("libopen-pal.so.80"))
        {
            (Abi::OpenMpi, "Open MPI 5.x", OMPI5)
        } else {
            return Ok(LibraryKind::Unsupported(format!(
                "{display}: Open MPI of an unknown version"
            )));
        }
    } else if syms.contains_key("MPI_Abi_get_version") || display.contains("libmpi_abi") {
        return Ok(LibraryKind::Unsupported(format!(
            "{display}: the MPI-5 standard ABI (libmpi_abi) is not decoded yet"
        )));
    } else if syms
        .keys()
        .any(|k| k.starts_with("MPIR_") || k.starts_with("MPID_"))
        || display.contains("mpich")
    {
        (Abi::Mpich, "MPICH ABI", Layout::default())
    } else {
        return Ok(LibraryKind::Unsupported(format!(
            "{display}: exports MPI_Send but its ABI is unknown"
        )));
    };

    Ok(LibraryKind::Probed(probe_points(
        &elf,
        map,
        &syms,
        display,
        (abi, flavor.to_string(), layout),
        Family::Mpi,
    )))
}

/// "NCCL 2.32.3" or "RCCL 2.x" from the version banner in the library's read-only data.
fn nccl_version(elf: &Elf, file: &LibraryFile) -> String {
    let name = if file.shown.contains("rccl") {
        "RCCL"
    } else {
        "NCCL"
    };
    match nccl_banner_version(elf, file) {
        Some(v) => format!("{name} {v}"),
        None => name.to_string(),
    }
}

/// The version in NCCL's "NCCL version 2.x.y" banner, if the object's read-only data has
/// one (the first followed by a digit: "NCCL version information" comes first). Searched
/// in the file piece by piece: a framework's read-only data can be hundreds of megabytes.
fn nccl_banner_version(elf: &Elf, file: &LibraryFile) -> Option<String> {
    let banner = b"NCCL version ";
    let (start, size) = elf.section_by_name(".rodata")?.file_range()?;
    let end = start.checked_add(size)?;
    let mut from = start;
    while let Some(at) = file.find(from..end, banner) {
        let rest = file.read_at(at + banner.len() as u64, 64);
        let len = rest.iter().position(|b| !b.is_ascii_graphic())?;
        if let Ok(v) = std::str::from_utf8(&rest[..len]) {
            if v.starts_with(|c: char| c.is_ascii_digit()) {
                return Some(v.to_string());
            }
        }
        from = at + 1;
    }
    None
}

/// Versions of NCCL's net plugin table whose isend/irecv commtap decodes: slots 10 and 11,
/// with `size_t` sizes and a `phandle` before the request (as NCCL's built-in transports).
const NET_PLUGIN_TABLES: &[&str] = &[
    "ncclNetPlugin_v12",
    "ncclNetPlugin_v11",
    "ncclNetPlugin_v10",
];
/// Slot of `isend` in those tables (`irecv` follows).
const NET_PLUGIN_ISEND_SLOT: u64 = 10;

/// An external NCCL net plugin (`libnccl-net*.so`, e.g. aws-ofi-nccl: what NCCL logs as
/// `NET/AWS Libfabric`): the isend/irecv of every table version it exports that commtap
/// decodes, found through the table's relocated pointers. `None` if `globals` has no such
/// table.
fn nccl_net_plugin(
    elf: &Elf,
    map: Data<'_>,
    globals: &BTreeMap<&str, u64>,
    path: &str,
) -> Option<LibraryKind> {
    let tables: Vec<u64> = NET_PLUGIN_TABLES
        .iter()
        .filter_map(|t| globals.get(t).copied())
        .collect();
    if tables.is_empty() {
        return None;
    }
    let pointers = fabric::relocated_pointers(elf);
    let isend = collector_common::routines::routine_index("ncclNetPluginIsend");
    let mut probes = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut name = None;
    for table in &tables {
        name = name.or_else(|| pointers.get(table).and_then(|p| c_string(elf, map, *p)));
        for (i, routine) in [(0, isend), (1, isend + 1)] {
            let slot = table.wrapping_add(8 * (NET_PLUGIN_ISEND_SLOT + i));
            let Some(&addr) = pointers.get(&slot) else {
                continue;
            };
            let Some(offset) = code_offset(elf, addr) else {
                continue;
            };
            if seen.insert(offset) {
                probes.push(probe_at(map, routine, addr, offset, 0));
            }
        }
    }
    if probes.is_empty() {
        return Some(LibraryKind::Unsupported(format!(
            "{path}: an NCCL net plugin whose isend/irecv could not be found in its table"
        )));
    }
    let name = name.unwrap_or_else(|| "?".to_string());
    Some(LibraryKind::Probed(Library {
        path: path.to_string(),
        abi: Abi::Nccl,
        flavor: format!("NCCL net plugin \"{name}\""),
        layout: Layout::default(),
        probes,
        missing: Vec::new(),
        family: Family::Nccl,
        text: text_range(elf),
        fabric_providers: Vec::new(),
    }))
}

/// The NUL-terminated string (at most 256 bytes) at virtual address `addr` of the file.
pub(crate) fn c_string(elf: &Elf, map: Data<'_>, addr: u64) -> Option<String> {
    let off = file_offset(elf, addr)?;
    // The delimiter is not part of what is returned: a 257th byte means no NUL in 256.
    let s = map
        .read_bytes_at_until(off..off.checked_add(257)?, 0)
        .ok()?;
    (s.len() <= 256).then(|| String::from_utf8_lossy(s).into_owned())
}

/// A libfabric library: every slot of every ops-table candidate, probed once per address
/// (stubs such as `fi_no_msg_recv` serve many tables; the kind of table a call went
/// through is found at the call, see collector-ebpf's `fabric`).
/// A libfabric library or provider DSO: every slot of its candidate ops tables, and its
/// `fi_fabric` (at `open`) where it exports one.
fn fabric_library(
    elf: &Elf,
    map: Data<'_>,
    path: String,
    flavor: String,
    open: Option<u64>,
) -> LibraryKind {
    let candidates = fabric::candidate_tables(elf, map);
    if candidates.is_empty() {
        return LibraryKind::Unsupported(format!(
            "{path}: libfabric without recognisable ops tables (80-byte tables of relocated \
             code pointers): its data path is not probed"
        ));
    }
    let mut probes = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for c in &candidates {
        for (slot, &addr) in c.slots.iter().enumerate() {
            let Some(offset) = code_offset(elf, addr) else {
                continue;
            };
            if !seen.insert(offset) || probes.len() >= usize::from(u16::MAX) {
                continue;
            }
            let routine = collector_common::routines::FABRIC_FIRST + slot as u16;
            probes.push(probe_at(map, routine, addr, offset, probes.len() as u16));
        }
    }
    if let Some((addr, offset)) = open.and_then(|a| Some((a, code_offset(elf, a)?))) {
        let routine = collector_common::routines::FABRIC_OPEN;
        probes.push(probe_at(map, routine, addr, offset, probes.len() as u16));
    }
    LibraryKind::Probed(Library {
        path,
        abi: Abi::Fabric,
        flavor,
        layout: Layout::default(),
        probes,
        missing: Vec::new(),
        family: Family::Fabric,
        text: text_range(elf),
        fabric_providers: fabric::provider_structs(elf, map),
    })
}

/// The probe of `routine` on the function at file `offset` (virtual address `addr`), past
/// a first instruction the kernel would single-step where it can be.
fn probe_at(map: Data<'_>, routine: u16, addr: u64, offset: u64, function: u16) -> ProbePoint {
    let code = (1..=16)
        .rev()
        .find_map(|len| map.bytes(offset, len))
        .unwrap_or(&[]);
    let (skip, placement) = choose_probe_point(code);
    ProbePoint {
        routine,
        name: ROUTINES[routine as usize].name,
        offset: offset + skip,
        placement,
        function,
        skip: skip as u8,
        vaddr: addr,
    }
}

/// NCCL's network transport functions are local C++ functions: found by their mangled
/// names, which also pin the signature the kernel decodes (NCCL 2.19 on: `size_t` sizes and
/// a `phandle` before the request). Another signature leaves the routine unprobed.
const NCCL_NET_SIGNATURES: &[(&str, &str)] = &[
    ("ncclNetSocketIsend", "_Z18ncclNetSocketIsendPvS_miS_S_PS_"),
    (
        "ncclNetSocketIrecv",
        "_Z18ncclNetSocketIrecvPviPS_PmPiS0_S0_S0_",
    ),
    ("ncclIbIsend", "_Z11ncclIbIsendPvS_miS_S_PS_"),
    ("ncclIbIrecv", "_Z11ncclIbIrecvPviPS_PmPiS0_S0_S0_"),
];

/// The symbol a routine is found by when it has no C name (`NCCL_NET_SIGNATURES`).
fn mangled_name(routine: &str) -> Option<&'static str> {
    NCCL_NET_SIGNATURES
        .iter()
        .find(|(name, _)| *name == routine)
        .map(|(_, mangled)| *mangled)
}

/// The probe points of `family`'s routines in a library whose symbols are `syms`.
fn probe_points(
    elf: &Elf,
    map: Data<'_>,
    syms: &BTreeMap<&str, u64>,
    path: String,
    (abi, flavor, layout): (Abi, String, Layout),
    family: Family,
) -> Library {
    let mut probes = Vec::new();
    let mut missing = Vec::new();
    let mut seen = BTreeMap::new();
    for (id, routine) in ROUTINES.iter().enumerate() {
        if routine.family() != family || !routine.is_probed() {
            continue;
        }
        // The profiling alias: PMPI_X, pncclX.
        let alias = match family {
            Family::Mpi => format!("P{}", routine.name),
            Family::Nccl => format!("p{}", routine.name),
            Family::Cuda | Family::Fabric => routine.name.to_string(),
        };
        let Some(&addr) = syms
            .get(routine.name)
            .or_else(|| syms.get(alias.as_str()))
            .or_else(|| mangled_name(routine.name).and_then(|m| syms.get(m)))
        else {
            missing.push(routine.name);
            continue;
        };
        let Some(offset) = code_offset(elf, addr) else {
            missing.push(routine.name);
            continue;
        };
        // Two names at one address (an alias) are one function: probe it once.
        if seen.insert(offset, routine.name).is_some() {
            continue;
        }
        probes.push(probe_at(map, id as u16, addr, offset, 0));
    }
    Library {
        path,
        abi,
        flavor,
        layout,
        probes,
        missing,
        family,
        text: text_range(elf),
        fabric_providers: Vec::new(),
    }
}

fn needed_libs(elf: &Elf) -> Vec<String> {
    dynamic_strings(elf, object::elf::DT_NEEDED)
}

/// The directories an executable or library asks the dynamic linker to search first
/// (`DT_RPATH` and `DT_RUNPATH`, with `$ORIGIN` expanded): where a program built with
/// `-Wl,-rpath` (Spack, Intel MPI, vendor stacks) finds its MPI. Empty for anything that
/// is not a readable 64-bit ELF file (a job's input file on the command line is mapped, not
/// read).
pub fn library_search_path(file: &Path) -> Vec<PathBuf> {
    let Ok(opened) = LibraryFile::open_path(file) else {
        return Vec::new();
    };
    let Ok(data) = opened.data() else {
        return Vec::new();
    };
    let Ok(elf) = Elf::parse(&data) else {
        return Vec::new();
    };
    let origin = std::fs::canonicalize(file)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let origin = origin.display().to_string();
    [object::elf::DT_RPATH, object::elf::DT_RUNPATH]
        .into_iter()
        .flat_map(|tag| dynamic_strings(&elf, tag))
        .flat_map(|list| {
            list.split(':')
                .filter(|d| !d.is_empty())
                .map(|d| d.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin))
                .map(PathBuf::from)
                .collect::<Vec<_>>()
        })
        .take(MAX_DYNAMIC_STRINGS)
        .collect()
}

/// Most entries of one tag read from a dynamic section (a real library has tens of
/// `DT_NEEDED`; a crafted one could repeat one long string a million times).
const MAX_DYNAMIC_STRINGS: usize = 256;

/// The strings of the dynamic section's entries with `tag` (`DT_NEEDED`, `DT_RUNPATH`), at
/// most [`MAX_DYNAMIC_STRINGS`], each as long as `file::LibraryData` reads a string.
fn dynamic_strings(elf: &Elf, tag: u32) -> Vec<String> {
    let object::File::Elf64(e) = elf else {
        return Vec::new();
    };
    use object::read::elf::{Dyn, FileHeader};
    let endian = e.endian();
    let data = e.data();
    let Ok(sections) = e.elf_header().sections(endian, data) else {
        return Vec::new();
    };
    let Ok(Some((dynamic, index))) = sections.dynamic(endian, data) else {
        return Vec::new();
    };
    let Ok(strings) = sections.strings(endian, data, index) else {
        return Vec::new();
    };
    dynamic
        .iter()
        .filter(|d| d.tag32(endian) == Some(tag))
        .take(MAX_DYNAMIC_STRINGS)
        .filter_map(|d| strings.get(u32::try_from(d.d_val(endian)).ok()?).ok())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// Virtual addresses of `.text` (start, end); (0, 0) without one.
fn text_range(elf: &Elf) -> (u64, u64) {
    elf.section_by_name(".text").map_or((0, 0), |s| {
        (s.address(), s.address().saturating_add(s.size()))
    })
}

/// File offset of virtual address `addr`, through the section that contains it.
fn file_offset(elf: &Elf, addr: u64) -> Option<u64> {
    elf.sections().find_map(|s| {
        let (start, size) = (s.address(), s.size());
        let (off, _) = s.file_range()?;
        if addr < start || addr >= start.checked_add(size)? {
            return None;
        }
        // The offset is what the section header says: the sum may not fit.
        (addr - start).checked_add(off)
    })
}

/// File offset of the function at virtual address `addr`, only if an executable section
/// of the file holds it: a probe is never put into data, whatever a symbol claims.
fn code_offset(elf: &Elf, addr: u64) -> Option<u64> {
    elf.sections().find_map(|s| {
        let executable = matches!(
            s.flags(),
            object::SectionFlags::Elf { sh_flags } if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0
        );
        let (start, size) = (s.address(), s.size());
        let (off, _) = s.file_range()?;
        if !executable || addr < start || addr >= start.checked_add(size)? {
            return None;
        }
        (addr - start).checked_add(off)
    })
}

/// Classifies the instruction at the start of `code` for the kernel's uprobe handling.
fn emulated(code: &[u8]) -> bool {
    match code {
        // push %reg, push %r8..%r15
        [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] => true,
        // call rel32, jmp rel32, jmp rel8, nop, jcc rel8, jcc rel32
        [0xe8 | 0xe9 | 0xeb | 0x90, ..] | [0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..] => true,
        _ => false,
    }
}

/// Picks the probe offset within a function starting with `code`.
///
/// A RIP-relative `mov`/`lea` into %rax, %r10 or %r11 (Open MPI's `MPI_Test` starts
/// `mov ompi_mpi_param_check(%rip),%rax`), or a `movabs` of a constant into %rax (NCCL's
/// `ncclCommInitAll` starts with one), writes no argument register and leaves %rsp alone,
/// so probing the next instruction sees the same arguments and the same return address.
pub fn choose_probe_point(code: &[u8]) -> (u64, Placement) {
    if emulated(code) {
        return (0, Placement::Entry);
    }
    // endbr64 (CET builds, libfabric's among them) only marks a branch target: the next
    // instruction sees the same arguments and return address.
    if let [0xf3, 0x0f, 0x1e, 0xfa, rest @ ..] = code {
        let (skip, placement) = choose_probe_point(rest);
        if placement != Placement::SingleStepped {
            return (4 + skip, Placement::MovedPastSingleStep);
        }
    }
    if let [0x48, 0xb8, _, _, _, _, _, _, _, _, rest @ ..] = code {
        if emulated(rest) {
            return (10, Placement::MovedPastSingleStep);
        }
    }
    if let [rex @ (0x48 | 0x4c), 0x8b | 0x8d, modrm, _, _, _, _, rest @ ..] = code {
        let rip_relative = modrm & 0xc7 == 0x05;
        let dest = ((modrm >> 3) & 7) + if *rex == 0x4c { 8 } else { 0 };
        if rip_relative && matches!(dest, 0 | 10 | 11) && emulated(rest) {
            return (7, Placement::MovedPastSingleStep);
        }
    }
    (0, Placement::SingleStepped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_is_entry() {
        assert_eq!(
            choose_probe_point(&[0x41, 0x57, 0x41, 0x56]),
            (0, Placement::Entry)
        );
        assert_eq!(
            choose_probe_point(&[0x55, 0x48, 0x89, 0xe5]),
            (0, Placement::Entry)
        );
    }

    #[test]
    fn ompi_test_prologue_is_skipped() {
        // mov 0x8a001(%rip),%rax; push %r12   (Open MPI 4.1.4 MPI_Test)
        let code = [0x48, 0x8b, 0x05, 0x01, 0xa0, 0x08, 0x00, 0x41, 0x54];
        assert_eq!(
            choose_probe_point(&code),
            (7, Placement::MovedPastSingleStep)
        );
    }

    #[test]
    fn nccl_movabs_prologue_is_skipped() {
        // movabs $0x5aa3cafebeef,%rax; push %rbp   (NCCL 2.32 ncclCommInitAll)
        let code = [0x48, 0xb8, 0xef, 0xbe, 0xfe, 0xca, 0xa3, 0x5a, 0, 0, 0x55];
        assert_eq!(
            choose_probe_point(&code),
            (10, Placement::MovedPastSingleStep)
        );
        // sub $0x10,%rsp (ncclBcast) moves the return address: never skipped.
        let code = [0x48, 0x83, 0xec, 0x10, 0x41, 0x51];
        assert_eq!(choose_probe_point(&code), (0, Placement::SingleStepped));
    }

    #[test]
    fn endbr64_is_skipped() {
        // endbr64; push %r15   (libfabric 1.17's ops-table functions)
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57];
        assert_eq!(
            choose_probe_point(&code),
            (4, Placement::MovedPastSingleStep)
        );
    }

    #[test]
    fn mov_into_argument_register_is_not_skipped() {
        // mov 0x...(%rip),%rdi would clobber the first argument before the probe.
        let code = [0x48, 0x8b, 0x3d, 0x01, 0x00, 0x00, 0x00, 0x41, 0x54];
        assert_eq!(choose_probe_point(&code), (0, Placement::SingleStepped));
    }

    /// A minimal ELF file whose `.text` (at 0x1000, 0x100 bytes) claims file offset
    /// `text_offset` and holds the function `ncclAllReduce` at 0x1010.
    fn elf_with_text_at(text_offset: u64) -> Vec<u8> {
        let shstrtab = b"\0.text\0.symtab\0.strtab\0.shstrtab\0";
        let strtab = b"\0ncclAllReduce\0";
        let (symtab_at, strtab_at) = (64u64, 64 + 48);
        let shstrtab_at = strtab_at + strtab.len() as u64;
        let sections_at = (shstrtab_at + shstrtab.len() as u64).next_multiple_of(8);
        let mut f = Vec::new();
        f.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
        f.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
        f.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&[0; 16]); // entry, program headers
        f.extend_from_slice(&sections_at.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        for half in [64u16, 56, 0, 64, 5, 4] {
            f.extend_from_slice(&half.to_le_bytes());
        }
        // .symtab: the null symbol, then ncclAllReduce (global function in section 1).
        f.extend_from_slice(&[0; 24]);
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&[0x12, 0]);
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&0x1010u64.to_le_bytes());
        f.extend_from_slice(&16u64.to_le_bytes());
        f.extend_from_slice(strtab);
        f.extend_from_slice(shstrtab);
        f.resize(sections_at as usize, 0);
        // name, type, flags, address, offset, size, link, info, entry size
        let sections: [[u64; 9]; 5] = [
            [0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 6, 0x1000, text_offset, 0x100, 0, 0, 0],
            [7, 2, 0, 0, symtab_at, 48, 3, 1, 24],
            [15, 3, 0, 0, strtab_at, strtab.len() as u64, 0, 0, 0],
            [23, 3, 0, 0, shstrtab_at, shstrtab.len() as u64, 0, 0, 0],
        ];
        for [name, kind, flags, addr, offset, size, link, info, entsize] in sections {
            for w in [name, kind] {
                f.extend_from_slice(&(w as u32).to_le_bytes());
            }
            for w in [flags, addr, offset, size] {
                f.extend_from_slice(&w.to_le_bytes());
            }
            for w in [link, info] {
                f.extend_from_slice(&(w as u32).to_le_bytes());
            }
            for w in [1, entsize] {
                f.extend_from_slice(&w.to_le_bytes());
            }
        }
        f
    }

    fn read(name: &str, bytes: &[u8]) -> Library {
        let dir = std::env::temp_dir().join(format!("commtap-symbols-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        let file = LibraryFile::open_path(&path).expect("open");
        let kind = read_library(&file).expect("an ELF file");
        let _ = std::fs::remove_dir_all(dir);
        match kind {
            LibraryKind::Probed(lib) => lib,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_section_offset_near_u64_max_places_no_probe() {
        // Found by fuzz/fuzz_targets/library_elf.rs (an overflow in code_offset, from an
        // 18 KiB input): the same defect in the smallest ELF file that has it, where
        // 0x10 bytes into .text is one past u64::MAX.
        let lib = read("libnccl_sane.so", &elf_with_text_at(0x40));
        assert_eq!(lib.probes.len(), 1);
        assert_eq!(lib.probes[0].offset, 0x50);
        let lib = read("libnccl_far.so", &elf_with_text_at(u64::MAX - 0xf));
        assert!(lib.probes.is_empty(), "{:?}", lib.probes);
        assert!(lib.missing.contains(&"ncclAllReduce"));
    }

    #[test]
    fn skip_needs_an_emulated_successor() {
        // mov 0x...(%rip),%rax; cmpb $0,(%rax)  (Open MPI MPI_Finalize)
        let code = [0x48, 0x8b, 0x05, 0x81, 0xfd, 0x09, 0x00, 0x80, 0x38, 0x00];
        assert_eq!(choose_probe_point(&code), (0, Placement::SingleStepped));
    }
}
