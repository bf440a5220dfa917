//! Reading an MPI library once: which ABI it has, where each probed routine lives (as a file
//! offset), and which instruction each probe lands on.
//!
//! Probes are placed by (file, offset), never by name: `MPI_X`, `PMPI_X` and the Fortran
//! names share one address, and attaching twice would count twice.

use std::{collections::BTreeMap, fs::File, path::Path};

use collector_common::{Abi, Layout, ROUTINES};
use object::{Object, ObjectSection, ObjectSymbol};
use serde::Serialize;

/// Errors reading a library.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// The file could not be opened or mapped.
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
}

/// An MPI library as commtap probes it.
#[derive(Clone, Debug, Serialize)]
pub struct MpiLibrary {
    /// Path it was read from.
    pub path: String,
    /// Implementation family, for handle decoding.
    #[serde(serialize_with = "ser_abi")]
    pub abi: Abi,
    /// Human name of the implementation and version line, e.g. "Open MPI 4.x".
    pub flavor: String,
    /// Object layout offsets for handle decoding.
    #[serde(skip)]
    pub layout: Layout,
    /// Probe points, one per distinct code address.
    pub probes: Vec<ProbePoint>,
    /// Routines not present in this library.
    pub missing: Vec<&'static str>,
}

fn ser_abi<S: serde::Serializer>(abi: &Abi, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match abi {
        Abi::OpenMpi => "open_mpi",
        Abi::Mpich => "mpich",
    })
}

/// What reading a mapped object found.
#[derive(Debug)]
pub enum LibraryKind {
    /// An MPI library commtap can probe.
    Mpi(MpiLibrary),
    /// An MPI library whose ABI commtap does not decode (reason given).
    UnsupportedMpi(String),
    /// Not an MPI library.
    Other,
}

/// Open MPI 4.x object offsets (from libopenmpi-dev 4.1.4's headers, verified at runtime).
const OMPI4: Layout = Layout {
    dt_size_off: 24,
    comm_rank_off: 228,
    comm_group_off: 248,
    group_size_off: 16,
};
/// Open MPI 5.0 object offsets (found by scanning a live process; see TARGETS.md §3).
const OMPI5: Layout = Layout {
    dt_size_off: 24,
    comm_rank_off: 220,
    comm_group_off: 264,
    group_size_off: 16,
};

/// Reads `path` and decides whether and how to probe it.
pub fn read_library(path: &Path) -> Result<LibraryKind, SymbolError> {
    let display = path.display().to_string();
    let file = File::open(path).map_err(|source| SymbolError::Io {
        path: display.clone(),
        source,
    })?;
    // SAFETY: read-only mapping of a library file; a concurrent truncation would only make
    // parsing fail.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| SymbolError::Io {
        path: display.clone(),
        source,
    })?;
    let elf = object::File::parse(&*map).map_err(|source| SymbolError::Elf {
        path: display.clone(),
        source,
    })?;

    // name -> address; dynamic symbols first, the static table where a library keeps one.
    let mut syms: BTreeMap<&str, u64> = BTreeMap::new();
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        if sym.is_definition() && sym.address() != 0 {
            if let Ok(name) = sym.name() {
                syms.entry(name).or_insert(sym.address());
            }
        }
    }
    if !syms.contains_key("MPI_Send") && !syms.contains_key("PMPI_Send") {
        return Ok(LibraryKind::Other);
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
            return Ok(LibraryKind::UnsupportedMpi(format!(
                "{display}: Open MPI of an unknown version"
            )));
        }
    } else if syms.contains_key("MPI_Abi_get_version") || display.contains("libmpi_abi") {
        return Ok(LibraryKind::UnsupportedMpi(format!(
            "{display}: the MPI-5 standard ABI (libmpi_abi) is not decoded yet"
        )));
    } else if syms
        .keys()
        .any(|k| k.starts_with("MPIR_") || k.starts_with("MPID_"))
        || display.contains("mpich")
    {
        (Abi::Mpich, "MPICH ABI", Layout::default())
    } else {
        return Ok(LibraryKind::UnsupportedMpi(format!(
            "{display}: exports MPI_Send but its ABI is unknown"
        )));
    };

    let mut probes = Vec::new();
    let mut missing = Vec::new();
    let mut seen = BTreeMap::new();
    for (id, routine) in ROUTINES.iter().enumerate() {
        let pname = format!("P{}", routine.name);
        let Some(&addr) = syms.get(routine.name).or_else(|| syms.get(pname.as_str())) else {
            missing.push(routine.name);
            continue;
        };
        let Some(offset) = file_offset(&elf, addr) else {
            missing.push(routine.name);
            continue;
        };
        // Two names at one address (an alias) are one function: probe it once.
        if seen.insert(offset, routine.name).is_some() {
            continue;
        }
        let code = map
            .get(offset as usize..offset as usize + 16)
            .unwrap_or(&[]);
        let (skip, placement) = choose_probe_point(code);
        probes.push(ProbePoint {
            routine: id as u16,
            name: routine.name,
            offset: offset + skip,
            placement,
        });
    }
    Ok(LibraryKind::Mpi(MpiLibrary {
        path: display,
        abi,
        flavor: flavor.to_string(),
        layout,
        probes,
        missing,
    }))
}

fn needed_libs(elf: &object::File) -> Vec<String> {
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
        .filter(|d| d.tag32(endian) == Some(object::elf::DT_NEEDED))
        .filter_map(|d| d.string(endian, strings).ok())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// File offset of virtual address `addr`, through the section that contains it.
fn file_offset(elf: &object::File, addr: u64) -> Option<u64> {
    elf.sections().find_map(|s| {
        let (start, size) = (s.address(), s.size());
        let (off, _) = s.file_range()?;
        (addr >= start && addr < start + size).then(|| addr - start + off)
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
/// `mov ompi_mpi_param_check(%rip),%rax`) writes no argument register and leaves %rsp alone,
/// so probing the next instruction sees the same arguments and the same return address.
pub fn choose_probe_point(code: &[u8]) -> (u64, Placement) {
    if emulated(code) {
        return (0, Placement::Entry);
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
    fn mov_into_argument_register_is_not_skipped() {
        // mov 0x...(%rip),%rdi would clobber the first argument before the probe.
        let code = [0x48, 0x8b, 0x3d, 0x01, 0x00, 0x00, 0x00, 0x41, 0x54];
        assert_eq!(choose_probe_point(&code), (0, Placement::SingleStepped));
    }

    #[test]
    fn skip_needs_an_emulated_successor() {
        // mov 0x...(%rip),%rax; cmpb $0,(%rax)  (Open MPI MPI_Finalize)
        let code = [0x48, 0x8b, 0x05, 0x81, 0xfd, 0x09, 0x00, 0x80, 0x38, 0x00];
        assert_eq!(choose_probe_point(&code), (0, Placement::SingleStepped));
    }
}
