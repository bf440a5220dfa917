//! Reading a mapped object once: whether it is an MPI library or holds NCCL (libnccl,
//! librccl, or NCCL linked into another library or the executable), which ABI it has, where
//! each probed routine lives (as a file offset), and which instruction each probe lands on.
//!
//! Probes are placed by (file, offset), never by name: `MPI_X`, `PMPI_X` and the Fortran
//! names share one address, as do `ncclX` and `pncclX`, and attaching twice would count
//! twice.

mod bindings;
pub mod demangle;
pub mod fabric;
pub mod file;
mod lines;
mod nccl;
mod probes;
pub mod sites;
pub mod unwind;

use nccl::{nccl_banner_version, nccl_net_plugin, nccl_version, older_net_plugin};
pub use probes::{choose_probe_point, dynamic_needs, DynamicNeeds};
use probes::{fabric_library, file_offset, needed_libs, probe_points, ucx_library};

use std::{collections::BTreeMap, path::Path};

use collector_common::{routines::Family, Abi, Layout, ROUTINES};
use object::{Object, ObjectSection, ObjectSymbol, ReadRef};

pub use file::{Elf, LibraryFile};

/// Longest file path kept of a call site (its object's, its source file's).
pub const MAX_PATH: usize = 512;

/// `s` made printable (a report is read on a terminal) and cut at `max` characters.
pub fn shown(s: &str, max: usize) -> String {
    crate::client::printable(s).chars().take(max).collect()
}

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
    /// A Fortran binding: its attach cookie (a `BindingCookie`; 0 elsewhere).
    #[serde(skip)]
    pub binding_cookie: u64,
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
    /// An MPI: where it says which of its own transports a process uses.
    #[serde(skip)]
    pub mpi_transport: MpiTransport,
    /// An MPI's Fortran bindings, probed at their entries only while call sites are
    /// counted (`bindings`).
    pub fortran_bindings: bool,
}

impl Library {
    /// Whether its calls are counted as a process's MPI or NCCL calls (not the CUDA
    /// waits', nor Fortran bindings', which serve call sites).
    pub fn counts_calls(&self) -> bool {
        self.family != Family::Cuda && !self.fortran_bindings
    }
}

/// Where an MPI library says which of its own transports a process uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MpiTransport {
    /// It does not say (not an MPI, or one whose library names no transport).
    #[default]
    Unknown,
    /// Open MPI selects its point-to-point layer at `MPI_Init`: the file's virtual
    /// addresses of `mca_pml_base_selected_component` (a copy of the selected pml's
    /// component struct) and of `ompi_mtl_base_selected_component` (a pointer to the
    /// selected mtl's), read in each process's memory.
    OpenMpi {
        /// `mca_pml_base_selected_component`.
        pml: u64,
        /// `ompi_mtl_base_selected_component`, where it exports one.
        mtl: Option<u64>,
    },
    /// MPICH (and Intel MPI) name the device they were built with (`MPII_Version_device`:
    /// `ch4:ofi`, `ch4:ucx`), the same in every process.
    Device(String),
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's serialize_with passes the field by reference"
)]
fn ser_abi<S: serde::Serializer>(abi: &Abi, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match abi {
        Abi::OpenMpi => "open_mpi",
        Abi::Mpich => "mpich",
        Abi::MpiAbi => "mpi_abi",
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
    /// A dynamic linker (`_dl_debug_state` and `_r_debug` defined): probed where it says
    /// its list of objects changed (a program's own, beside the system's).
    Linker(LinkerHook),
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
    let elf: Elf = object::File::parse(&data).map_err(|source| SymbolError::Elf {
        path: display.clone(),
        source,
    })?;
    let r = Reading::new(file, &elf, &data);
    if let Some(plugin) = nccl_net_plugin(&elf, &data, &r.globals, &display) {
        return Ok(plugin);
    }
    Ok(if r.has("ncclAllReduce") || r.has("pncclAllReduce") {
        r.nccl()
    } else if r.has("MPI_Send") || r.has("PMPI_Send") {
        r.mpi()
    } else if let Some(older) = older_net_plugin(&elf, &data, &r.globals, &display) {
        older
    } else {
        r.not_mpi()
    })
}

/// A library file being read: its ELF and the symbols it defines.
struct Reading<'a> {
    file: &'a LibraryFile,
    elf: &'a Elf<'a>,
    map: Data<'a>,
    /// name -> address; dynamic symbols first, the static table where a library keeps one.
    syms: BTreeMap<&'a str, u64>,
    /// The same, global symbols only: a CUDA runtime linked in privately (as in libnccl)
    /// serves its library, not the application.
    globals: BTreeMap<&'a str, u64>,
}

impl<'a> Reading<'a> {
    fn new(file: &'a LibraryFile, elf: &'a Elf<'a>, map: Data<'a>) -> Reading<'a> {
        let mut syms = BTreeMap::new();
        let mut globals = BTreeMap::new();
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
        Reading {
            file,
            elf,
            map,
            syms,
            globals,
        }
    }

    fn has(&self, name: &str) -> bool {
        self.syms.contains_key(name)
    }

    fn has_global(&self, name: &str) -> bool {
        self.globals.contains_key(name)
    }

    /// Whether it holds the CUDA runtime's or driver's wait for the GPU (globally).
    fn cuda(&self) -> (bool, bool) {
        (
            self.has_global("cudaStreamSynchronize"),
            self.has_global("cuStreamSynchronize"),
        )
    }

    fn display(&self) -> String {
        self.file.shown.clone()
    }

    /// NCCL (or RCCL), and the CUDA waits of an executable that links NCCL in.
    fn nccl(&self) -> LibraryKind {
        let flavor = nccl_version(self.elf, self.file);
        let mut lib = probe_points(
            self.elf,
            self.map,
            &self.syms,
            self.display(),
            (Abi::Nccl, flavor, Layout::default()),
            Family::Nccl,
        );
        let (runtime, driver) = self.cuda();
        // An executable that links NCCL and the CUDA runtime in: its waits for the GPU too.
        if runtime || driver {
            let cuda = probe_points(
                self.elf,
                self.map,
                &self.globals,
                self.display(),
                (Abi::Nccl, String::new(), Layout::default()),
                Family::Cuda,
            );
            lib.probes.extend(cuda.probes);
            lib.missing.extend(cuda.missing);
        }
        LibraryKind::Probed(lib)
    }

    /// A library that is neither MPI nor NCCL by its symbols: libfabric or one of its
    /// providers, the CUDA runtime or driver, NCCL without symbols, or nothing to probe.
    fn not_mpi(&self) -> LibraryKind {
        if let Some(hook) = hook_of(self.elf) {
            return LibraryKind::Linker(hook);
        }
        let display = self.display();
        if self.has_global("fi_getinfo") && self.has_global("fi_fabric") {
            let open = self.globals.get("fi_fabric").copied();
            return fabric_library(self.elf, self.map, display, "libfabric".to_string(), open);
        }
        if self.has_global("ucp_tag_send_nbx") || self.has_global("ucp_tag_send_nb") {
            return ucx_library(self.elf, self.map, &self.globals, display);
        }
        // A provider built as its own DSO (`prov/libtcp-fi.so`, as Intel MPI ships
        // libfabric), loaded by libfabric through its `fi_prov_ini`: its ops tables are the
        // data path of the endpoints it serves.
        if self.has_global("fi_prov_ini") {
            let name = Path::new(&display)
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("lib"))
                .and_then(|n| n.split("-fi").next())
                .unwrap_or("?")
                .to_string();
            let flavor = format!("libfabric provider {name}");
            return fabric_library(self.elf, self.map, display, flavor, None);
        }
        let defines = |name: &str| self.has_global(name);
        if let Some(bindings) = bindings::fortran_bindings(self.elf, self.map, &display, defines) {
            return bindings;
        }
        let (runtime, driver) = self.cuda();
        if !runtime && !driver {
            // NCCL linked in with hidden symbols, or a stripped libnccl: say so rather than
            // report a training process as communication-free. A library that imports NCCL
            // (PyTorch's libtorch_cuda carries a banner too) calls the libnccl probed beside it.
            let imports_nccl = self
                .elf
                .dynamic_symbols()
                .any(|s| s.is_undefined() && s.name().is_ok_and(|n| n.starts_with("nccl")));
            return match nccl_banner_version(self.elf, self.file) {
                Some(v) if !imports_nccl => LibraryKind::Unsupported(format!(
                    "{display}: holds NCCL {v} but none of its symbols (stripped, or linked \
                     in with hidden visibility): not probed"
                )),
                _ => LibraryKind::Other,
            };
        }
        let flavor = if runtime {
            "CUDA runtime"
        } else {
            "CUDA driver"
        };
        // Decoded by NCCL's return program, which keeps the device-time windows.
        LibraryKind::Probed(probe_points(
            self.elf,
            self.map,
            &self.globals,
            display,
            (Abi::Nccl, flavor.to_string(), Layout::default()),
            Family::Cuda,
        ))
    }

    /// An MPI library: which ABI and version, and so which decoding layout.
    fn mpi(&self) -> LibraryKind {
        let display = self.display();
        let needed = needed_libs(self.elf);
        let (abi, flavor, layout) = if self.has("ompi_mpi_comm_world") {
            if needed.iter().any(|n| n.starts_with("libopen-pal.so.40")) {
                (Abi::OpenMpi, "Open MPI 4.x", OMPI4)
            } else if self.has("ompi_mpi_instance_default")
                || needed.iter().any(|n| n.starts_with("libopen-pal.so.80"))
            {
                (Abi::OpenMpi, "Open MPI 5.x", OMPI5)
            } else {
                return LibraryKind::Unsupported(format!(
                    "{display}: Open MPI of an unknown version"
                ));
            }
        } else if display.contains("libmpi_abi") {
            if !self.syms.keys().any(|k| k.starts_with("MPIR_")) {
                // commtap reads an MPI-5 ABI handle's object as MPICH's: another
                // implementation's objects begin otherwise.
                return LibraryKind::Unsupported(format!(
                    "{display}: an MPI-5 standard ABI library, but not MPICH's (only MPICH's \
                     libmpi_abi is decoded)"
                ));
            }
            (Abi::MpiAbi, "MPI-5 standard ABI (MPICH)", Layout::default())
        } else if self
            .syms
            .keys()
            .any(|k| k.starts_with("MPIR_") || k.starts_with("MPID_"))
            || display.contains("mpich")
        {
            // MPICH 5's libmpi.so.12 has the MPI-5 routines (`MPI_Abi_get_version`) too,
            // with MPICH's own ABI: only libmpi_abi speaks the standard one.
            (Abi::Mpich, "MPICH ABI", Layout::default())
        } else if self.has("MPI_Abi_get_version") {
            return LibraryKind::Unsupported(format!(
                "{display}: an MPI-5 standard ABI library other than MPICH's (not decoded: \
                 commtap reads that ABI's handles through MPICH's objects)"
            ));
        } else {
            return LibraryKind::Unsupported(format!(
                "{display}: exports MPI_Send but its ABI is unknown"
            ));
        };
        let mut lib = probe_points(
            self.elf,
            self.map,
            &self.syms,
            display,
            (abi, flavor.to_string(), layout),
            Family::Mpi,
        );
        lib.mpi_transport = self.mpi_transport(abi);
        LibraryKind::Probed(lib)
    }

    /// Where an MPI of `abi` says which of its transports a process uses.
    fn mpi_transport(&self, abi: Abi) -> MpiTransport {
        let sym = |name: &str| self.globals.get(name).copied();
        match abi {
            Abi::OpenMpi => match sym("mca_pml_base_selected_component") {
                Some(pml) => MpiTransport::OpenMpi {
                    pml,
                    mtl: sym("ompi_mtl_base_selected_component"),
                },
                None => MpiTransport::Unknown,
            },
            _ => match sym("MPII_Version_device") {
                Some(a) => {
                    c_string(self.elf, self.map, a).filter(|d| is_mpich_device(d.as_bytes()))
                }
                // A stripped MPICH (the PyPI wheel's) keeps the string, not its name.
                None => mpich_device_in_rodata(self.elf, self.file),
            }
            .map_or(MpiTransport::Unknown, MpiTransport::Device),
        }
    }
}

/// Whether `s` reads as an MPICH device: `ch4:ofi`, or `ch4:ucx ofi` for one built with
/// several netmods (one chosen at `MPI_Init`).
fn is_mpich_device(s: &[u8]) -> bool {
    (s.starts_with(b"ch4:") || s.starts_with(b"ch3:"))
        && s.len() > 4
        && s.len() <= 64
        && s.iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b":_ ,".contains(&b))
}

/// MPICH's device where no symbol names it: the one NUL-delimited string of its read-only
/// data that reads as a device (checked on Debian's MPICH, Intel MPI and the PyPI wheel's
/// two libraries: each holds exactly one); none where several do.
fn mpich_device_in_rodata(elf: &Elf, file: &LibraryFile) -> Option<String> {
    let (start, size) = elf.section_by_name(".rodata")?.file_range()?;
    let end = start.checked_add(size)?;
    let mut found = std::collections::BTreeSet::new();
    for needle in [b"\0ch4:", b"\0ch3:"] {
        let mut from = start;
        while let Some(at) = file.find(from..end, needle) {
            let rest = file.read_at(at + 1, 65);
            if let Some(s) = rest.iter().position(|b| *b == 0).map(|n| &rest[..n]) {
                if is_mpich_device(s) {
                    found.insert(String::from_utf8_lossy(s).into_owned());
                }
            }
            if found.len() > 1 {
                return None;
            }
            from = at + 1;
        }
    }
    found.pop_first()
}

/// Where a dynamic linker tells debuggers that its list of loaded objects changed: the file
/// offset of `_dl_debug_state` (called after each change) and the distance from it to
/// `_r_debug` (whose `r_state` says which change), both as glibc's `ld.so` exports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkerHook {
    /// File offset of `_dl_debug_state`, in code.
    pub offset: u64,
    /// `_r_debug`'s address minus `_dl_debug_state`'s (the same load bias moves both).
    pub to_r_debug: i64,
}

/// The dynamic linker's hook in `file` (`None`: not a glibc dynamic linker).
pub fn linker_hook(file: &LibraryFile) -> Result<Option<LinkerHook>, SymbolError> {
    let data = file.data().map_err(|source| SymbolError::Io {
        path: file.shown.clone(),
        source,
    })?;
    let elf: Elf = object::File::parse(&data).map_err(|source| SymbolError::Elf {
        path: file.shown.clone(),
        source,
    })?;
    Ok(hook_of(&elf))
}

/// Where the dynamic linker `elf` announces changes to its list of objects, if it is one
/// of this machine's ABI (the kernel side reads `struct r_debug` as x86-64 lays it out).
fn hook_of(elf: &Elf) -> Option<LinkerHook> {
    use object::Object as _;
    if elf.architecture() != object::Architecture::X86_64 || !elf.is_64() {
        return None;
    }
    let find = |name: &str| {
        elf.dynamic_symbols()
            .find(|s| s.is_definition() && s.name() == Ok(name))
            .map(|s| s.address())
    };
    let (Some(hook), Some(r_debug)) = (find("_dl_debug_state"), find("_r_debug")) else {
        return None;
    };
    probes::code_offset(elf, hook).map(|offset| LinkerHook {
        offset,
        to_r_debug: r_debug.wrapping_sub(hook) as i64,
    })
}

/// The NUL-terminated string (at most 256 bytes) at virtual address `addr` of the file.
pub fn c_string(elf: &Elf, map: Data<'_>, addr: u64) -> Option<String> {
    let off = file_offset(elf, addr)?;
    // The delimiter is not part of what is returned: a 257th byte means no NUL in 256.
    let s = map
        .read_bytes_at_until(off..off.checked_add(257)?, 0)
        .ok()?;
    // A file's bytes, shown in logs and reports: control characters escaped.
    (s.len() <= 256).then(|| crate::client::printable(&String::from_utf8_lossy(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpich_devices_are_short_words_after_a_channel() {
        for ok in ["ch4:ofi", "ch4:ucx ofi", "ch3:nemesis", "ch4:ucx,ofi"] {
            assert!(is_mpich_device(ok.as_bytes()), "{ok}");
        }
        for not in [
            "ch4:",
            "ch4:Error in netmod",
            "--with-device=ch4:ucx",
            "ch5:x",
            "ch4:\t",
        ] {
            assert!(!is_mpich_device(not.as_bytes()), "{not}");
        }
    }

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
