//! NCCL as a library file shows it: its version banner, and its network plugins (whose
//! send/receive functions are reached through a table, not a symbol).

use std::collections::BTreeMap;

use super::{
    c_string, fabric,
    probes::{code_offset, probe_at, text_range},
    Abi, Data, Elf, Family, Layout, Library, LibraryFile, LibraryKind, Object, ObjectSection,
};

/// "NCCL 2.32.3" or "RCCL 2.x" from the version banner in the library's read-only data.
pub(crate) fn nccl_version(elf: &Elf, file: &LibraryFile) -> String {
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
pub(crate) fn nccl_banner_version(elf: &Elf, file: &LibraryFile) -> Option<String> {
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
pub(crate) const NET_PLUGIN_TABLES: &[&str] = &[
    "ncclNetPlugin_v12",
    "ncclNetPlugin_v11",
    "ncclNetPlugin_v10",
];
/// Slot of `isend` in those tables (`irecv` follows).
pub(crate) const NET_PLUGIN_ISEND_SLOT: u64 = 10;

/// An external NCCL net plugin that exports only tables older than those commtap decodes
/// (aws-ofi-rccl's `ncclNet_v5`, say): said, with its name and tables, so that a report
/// whose network traffic is missing says why. `None` where `globals` has no such table.
pub(crate) fn older_net_plugin(
    elf: &Elf,
    map: Data<'_>,
    globals: &BTreeMap<&str, u64>,
    path: &str,
) -> Option<LibraryKind> {
    let older: Vec<(&str, u64)> = globals
        .iter()
        .filter(|(name, _)| is_net_plugin_table(name) && !NET_PLUGIN_TABLES.contains(name))
        .map(|(name, at)| (*name, *at))
        .collect();
    if older.is_empty() {
        return None;
    }
    let pointers = fabric::relocated_pointers(elf);
    let name = plugin_name(elf, map, &pointers, older.iter().map(|(_, at)| *at));
    let tables: Vec<&str> = older.iter().map(|(t, _)| *t).collect();
    Some(LibraryKind::Unsupported(format!(
        "{path}: NCCL net plugin \"{name}\" exports {} only (its sends and receives are \
         decoded through {} to {}): its network traffic is not counted",
        tables.join(", "),
        NET_PLUGIN_TABLES[NET_PLUGIN_TABLES.len() - 1],
        NET_PLUGIN_TABLES[0]
    )))
}

/// A net plugin's name: the string its first table's first slot points to ("?" where none
/// does).
fn plugin_name(
    elf: &Elf,
    map: Data<'_>,
    pointers: &BTreeMap<u64, u64>,
    mut tables: impl Iterator<Item = u64>,
) -> String {
    tables
        .find_map(|at| pointers.get(&at).and_then(|p| c_string(elf, map, *p)))
        .unwrap_or_else(|| "?".to_string())
}

/// Whether `name` is a net plugin table's symbol, of any version: `ncclNetPlugin_vN`
/// (NCCL's name) or `ncclNet_vN` (older plugins', RCCL's).
fn is_net_plugin_table(name: &str) -> bool {
    name.strip_prefix("ncclNetPlugin_v")
        .or_else(|| name.strip_prefix("ncclNet_v"))
        .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
}

/// An external NCCL net plugin (`libnccl-net*.so`, e.g. aws-ofi-nccl: what NCCL logs as
/// `NET/AWS Libfabric`): the isend/irecv of every table version it exports that commtap
/// decodes, found through the table's relocated pointers. `None` if `globals` has no such
/// table.
pub(crate) fn nccl_net_plugin(
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
    for table in &tables {
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
    let name = plugin_name(elf, map, &pointers, tables.iter().copied());
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
        mpi_transport: super::MpiTransport::Unknown,
        fortran_bindings: false,
    }))
}

/// NCCL's network transport functions are local C++ functions: found by their mangled
/// names, which also pin the signature the kernel decodes (NCCL 2.19 on: `size_t` sizes and
/// a `phandle` before the request). Another signature leaves the routine unprobed.
pub(crate) const NCCL_NET_SIGNATURES: &[(&str, &str)] = &[
    ("ncclNetSocketIsend", "_Z18ncclNetSocketIsendPvS_miS_S_PS_"),
    (
        "ncclNetSocketIrecv",
        "_Z18ncclNetSocketIrecvPviPS_PmPiS0_S0_S0_",
    ),
    ("ncclIbIsend", "_Z11ncclIbIsendPvS_miS_S_PS_"),
    ("ncclIbIrecv", "_Z11ncclIbIrecvPviPS_PmPiS0_S0_S0_"),
];

/// The symbol a routine is found by when it has no C name (`NCCL_NET_SIGNATURES`).
pub(crate) fn mangled_name(routine: &str) -> Option<&'static str> {
    NCCL_NET_SIGNATURES
        .iter()
        .find(|(name, _)| *name == routine)
        .map(|(_, mangled)| *mangled)
}
