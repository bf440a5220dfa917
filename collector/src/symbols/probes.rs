//! Where each probe goes in a library file: the routines it defines (or, for libfabric,
//! its ops tables' functions), each at an instruction the kernel can probe cheaply, and
//! what the file asks of the dynamic linker.

use std::path::{Path, PathBuf};

use super::{
    fabric, nccl::mangled_name, Abi, BTreeMap, Data, Elf, Family, Layout, Library, LibraryFile,
    LibraryKind, Object, ObjectSection, Placement, ProbePoint, ROUTINES,
};

/// A libfabric library: every slot of every ops-table candidate, probed once per address
/// (stubs such as `fi_no_msg_recv` serve many tables; the kind of table a call went
/// through is found at the call, see collector-ebpf's `fabric`).
/// A libfabric library or provider DSO: every slot of its candidate ops tables, and its
/// `fi_fabric` (at `open`) where it exports one.
pub(crate) fn fabric_library(
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
        mpi_transport: super::MpiTransport::Unknown,
        fortran_bindings: false,
    })
}

/// UCX's `libucp`: its exported data-path functions (`ucp_tag_send_nbx` ...), each probed
/// by its symbol and counted as a transport operation (collector-ebpf's `fabric`), the
/// function's index among them for telling UCX's own calls from the application's.
pub(crate) fn ucx_library(
    elf: &Elf,
    map: Data<'_>,
    syms: &BTreeMap<&str, u64>,
    path: String,
) -> LibraryKind {
    use collector_common::routines::{UCX_END, UCX_FIRST};
    let mut probes = Vec::new();
    let mut missing = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for id in UCX_FIRST..UCX_END {
        let name = ROUTINES[usize::from(id)].name;
        let Some((addr, offset)) = syms
            .get(name)
            .and_then(|&a| Some((a, code_offset(elf, a)?)))
        else {
            missing.push(name);
            continue;
        };
        if seen.insert(offset) {
            probes.push(probe_at(map, id, addr, offset, probes.len() as u16));
        }
    }
    if probes.is_empty() {
        return LibraryKind::Unsupported(format!(
            "{path}: UCX without its data-path functions (ucp_tag_send_nbx ...): not probed"
        ));
    }
    LibraryKind::Probed(Library {
        path,
        abi: Abi::Fabric,
        flavor: "UCX".to_string(),
        layout: Layout::default(),
        probes,
        missing,
        family: Family::Fabric,
        text: text_range(elf),
        fabric_providers: Vec::new(),
        mpi_transport: super::MpiTransport::Unknown,
        fortran_bindings: false,
    })
}

/// The probe of `routine` on the function at file `offset` (virtual address `addr`), past
/// a first instruction the kernel would single-step where it can be.
pub(crate) fn probe_at(
    map: Data<'_>,
    routine: u16,
    addr: u64,
    offset: u64,
    function: u16,
) -> ProbePoint {
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
        binding_cookie: 0,
    }
}

/// The probe points of `family`'s routines in a library whose symbols are `syms`.
pub(crate) fn probe_points(
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
        mpi_transport: super::MpiTransport::Unknown,
        fortran_bindings: false,
    }
}

pub(crate) fn needed_libs(elf: &Elf) -> Vec<String> {
    dynamic_strings(elf, object::elf::DT_NEEDED)
}

/// What an executable or library asks of the dynamic linker: the libraries it needs by
/// name and the directories to search first for them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DynamicNeeds {
    /// `DT_NEEDED`: a program built with Open MPI's `mpicc` needs `libmpi.so.40`.
    pub names: Vec<String>,
    /// `DT_RPATH` and `DT_RUNPATH`, with `$ORIGIN` expanded: where a program built with
    /// `-Wl,-rpath` (Spack, Intel MPI, vendor stacks) finds its MPI.
    pub search_path: Vec<PathBuf>,
}

/// The [`DynamicNeeds`] of the file at `file`, read in one pass. Empty for anything that is
/// not a readable 64-bit ELF file (a job's input file on the command line is mapped, not
/// read).
pub fn dynamic_needs(file: &Path) -> DynamicNeeds {
    // Opened once and verified, read with bounded reads.
    let Ok(opened) = LibraryFile::open_path(file) else {
        return DynamicNeeds::default();
    };
    let Ok(data) = opened.data() else {
        return DynamicNeeds::default();
    };
    let Ok(elf) = Elf::parse(&data) else {
        return DynamicNeeds::default();
    };
    DynamicNeeds {
        names: needed_libs(&elf),
        search_path: search_path(file, &elf),
    }
}

/// [`DynamicNeeds::search_path`] of the parsed `elf` at `file`.
fn search_path(file: &Path, elf: &Elf) -> Vec<PathBuf> {
    let origin = std::fs::canonicalize(file)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let origin = origin.display().to_string();
    [object::elf::DT_RPATH, object::elf::DT_RUNPATH]
        .into_iter()
        .flat_map(|tag| dynamic_strings(elf, tag))
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
pub(crate) const MAX_DYNAMIC_STRINGS: usize = 256;

/// The strings of the dynamic section's entries with `tag` (`DT_NEEDED`, `DT_RUNPATH`), at
/// most [`MAX_DYNAMIC_STRINGS`], each as long as `file::LibraryData` reads a string.
pub(crate) fn dynamic_strings(elf: &Elf, tag: u32) -> Vec<String> {
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
pub(crate) fn text_range(elf: &Elf) -> (u64, u64) {
    elf.section_by_name(".text").map_or((0, 0), |s| {
        (s.address(), s.address().saturating_add(s.size()))
    })
}

/// File offset of virtual address `addr`, through the section that contains it.
pub(crate) fn file_offset(elf: &Elf, addr: u64) -> Option<u64> {
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
pub(crate) fn code_offset(elf: &Elf, addr: u64) -> Option<u64> {
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
pub(crate) fn emulated(code: &[u8]) -> bool {
    match code {
        // push %reg, push %r8..%r15
        [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] => true,
        // call rel32, jmp rel32, jmp rel8, nop, jcc rel8, jcc rel32
        [0xe8 | 0xe9 | 0xeb | 0x90 | 0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..] => true,
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
