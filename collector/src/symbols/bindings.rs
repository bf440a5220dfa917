//! An MPI's Fortran bindings (`libmpi_mpifh`, `libmpi_usempif08`, `libmpichfort`,
//! Intel MPI's `libmpifort`): each binding (`mpi_allreduce_`) converts its arguments and
//! calls the C routine commtap probes, so a Fortran program's MPI calls all return into the
//! bindings. While call sites are counted, each binding of a probed routine is probed at
//! its entry too (collector-ebpf's `sites::binding_entry`): the program's call into it is
//! the site of the MPI call it makes (and an MPI call returning anywhere in the bindings'
//! code, through the MPI's own helpers there).

use std::collections::HashMap;

use collector_common::BindingCookie;
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::{
    probes::{code_offset, probe_at, text_range},
    Abi, Data, Elf, Family, Layout, Library, LibraryKind, MpiTransport, ROUTINES,
};

/// Prefixes of a binding's name after its MPI's conventions, as the C name's: the
/// profiling ones (`pmpi_`), MPICH's inner f08 ones (`pmpir_`).
const PREFIXES: [(&str, &str); 3] = [("pmpix_", "mpix_"), ("pmpir_", "mpi_"), ("pmpi_", "mpi_")];

/// Suffixes a binding's name may carry past the routine's (after its trailing
/// underscores): `use mpi_f08`'s (`_f08`, MPICH's `_f08ts` and their `_large` count
/// variants), MPICH's `_cdesc`.
const SUFFIXES: [&str; 4] = ["_large", "_f08ts", "_f08", "_cdesc"];

/// The most functions probed as one routine's bindings: an MPI's have up to five
/// (`mpi_allreduce_`, `mpi_allreduce_f08ts_` and its `_large` form, MPICH's inner `pmpir_`
/// ones), where a crafted file could name any number of functions `mpi_allreduce__...`.
const MAX_PER_ROUTINE: u8 = 8;

/// The most functions probed in one bindings library (MPICH's have 1,434).
const MAX_PROBES: usize = 4096;

/// The names of `MPI_Init`'s binding, one of which a library of Fortran bindings defines.
const INIT_BINDINGS: [&str; 4] = ["mpi_init_", "mpi_init__", "MPI_INIT", "mpi_init_f08_"];

/// The lower-case C name (`mpi_allreduce`) of the routine a Fortran binding named `symbol`
/// binds: a name as Fortran compilers make them, all lower case with a trailing
/// underscore (`mpi_allreduce_`, `mpi_allreduce__`, `pmpi_allreduce_f08_`,
/// `mpi_allreduce_f08ts_large_`) or all upper case (`MPI_ALLREDUCE`). `None` for any other
/// name, the C ones (`MPI_Allreduce`, which a PMPI tool's library defines) among them.
pub(crate) fn bound_routine(symbol: &str) -> Option<String> {
    let bytes = symbol.as_bytes();
    let lower = !bytes.iter().any(u8::is_ascii_uppercase) && symbol.ends_with('_');
    let upper = !bytes.iter().any(u8::is_ascii_lowercase);
    // Cheapest first: most symbols of a library read here are nothing of MPI's.
    let mpi_like = bytes.len() > 4
        && (bytes[..4].eq_ignore_ascii_case(b"mpi_")
            || bytes[..4].eq_ignore_ascii_case(b"mpix")
            || bytes[..4].eq_ignore_ascii_case(b"pmpi"));
    if !mpi_like || !(lower || upper) {
        return None;
    }
    let mut name = symbol.to_ascii_lowercase();
    let prefixed = PREFIXES
        .iter()
        .find_map(|(p, to)| Some(format!("{to}{}", name.strip_prefix(p)?)));
    if let Some(p) = prefixed {
        name = p;
    }
    if !name.starts_with("mpi_") && !name.starts_with("mpix_") {
        return None;
    }
    // Each suffix once, in the order they are added (`_f08ts` then `_large`).
    let mut rest = name.trim_end_matches('_');
    for suffix in SUFFIXES {
        if let Some(shorter) = rest.strip_suffix(suffix) {
            rest = shorter.trim_end_matches('_');
        }
    }
    Some(rest.to_string())
}

/// The library as Fortran bindings to probe (their functions that bind a probed MPI
/// routine, each once, at most [`MAX_PER_ROUTINE`] a routine and [`MAX_PROBES`] in all), if
/// it is one: it defines a binding of `MPI_Init` ([`INIT_BINDINGS`]) and is no MPI (an
/// MPI's C library is probed as such, and never read here).
pub(crate) fn fortran_bindings(
    elf: &Elf,
    map: Data<'_>,
    path: &str,
    defines: impl Fn(&str) -> bool,
) -> Option<LibraryKind> {
    if !INIT_BINDINGS.iter().any(|n| defines(n)) {
        return None;
    }
    let routines: HashMap<String, u16> = ROUTINES
        .iter()
        .enumerate()
        .filter(|(_, r)| r.family() == Family::Mpi && r.is_probed())
        .map(|(id, r)| (r.name.to_ascii_lowercase(), id as u16))
        .collect();
    // The kernel takes an MPI call returning anywhere in this code, while a binding is in
    // progress, for the binding's.
    let (code_lo, code_hi) = code_range(elf)?;
    let code_len = u32::try_from(code_hi - code_lo).ok()?;
    let mut probes = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut per_routine: HashMap<u16, u8> = HashMap::new();
    let mut open_mpi = false;
    for sym in elf.dynamic_symbols() {
        if probes.len() >= MAX_PROBES {
            break;
        }
        if !sym.is_definition() || sym.kind() != SymbolKind::Text || sym.size() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        open_mpi |= name.starts_with("ompi_");
        let Some(&routine) = bound_routine(name).and_then(|r| routines.get(&r)) else {
            continue;
        };
        let addr = sym.address();
        let Some(offset) = code_offset(elf, addr) else {
            continue;
        };
        let held = per_routine.entry(routine).or_default();
        if *held >= MAX_PER_ROUTINE || !seen.insert(offset) {
            continue;
        }
        *held += 1;
        let mut probe = probe_at(map, routine, addr, offset, 0);
        let Some(from_start) = addr
            .checked_add(u64::from(probe.skip))
            .and_then(|at| at.checked_sub(code_lo))
            .and_then(|d| u32::try_from(d).ok())
        else {
            continue;
        };
        probe.binding_cookie = BindingCookie {
            from_start,
            len: code_len,
        }
        .pack();
        probes.push(probe);
    }
    if probes.is_empty() {
        return None;
    }
    let whose = if open_mpi {
        "Open MPI's Fortran bindings"
    } else {
        "Fortran bindings (MPICH ABI)"
    };
    Some(LibraryKind::Probed(Library {
        path: path.to_string(),
        abi: if open_mpi { Abi::OpenMpi } else { Abi::Mpich },
        flavor: format!("{whose}, at their entries for call sites"),
        layout: Layout::default(),
        probes,
        missing: Vec::new(),
        family: Family::Mpi,
        text: text_range(elf),
        fabric_providers: Vec::new(),
        mpi_transport: MpiTransport::Unknown,
        fortran_bindings: true,
    }))
}

/// Virtual addresses of the file's code, from its first executable section's start to
/// its last one's end; `None` without any.
fn code_range(elf: &Elf) -> Option<(u64, u64)> {
    elf.sections()
        .filter(|s| {
            matches!(
                s.flags(),
                object::SectionFlags::Elf { sh_flags }
                    if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0
            ) && s.size() != 0
        })
        .filter_map(|s| Some((s.address(), s.address().checked_add(s.size())?)))
        .reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
}

#[cfg(test)]
mod tests {
    use super::bound_routine;

    #[test]
    fn each_bindings_name_gives_its_routine() {
        for name in [
            "MPI_ALLREDUCE",
            "mpi_allreduce_",
            "mpi_allreduce__",
            "pmpi_allreduce_",
            "PMPI_ALLREDUCE",
            "mpi_allreduce_f08_",
            "pmpi_allreduce_f08_",
            "mpi_allreduce_f08ts_",
            "mpi_allreduce_f08ts_large_",
            "pmpir_allreduce_f08ts_",
        ] {
            assert_eq!(
                bound_routine(name).as_deref(),
                Some("mpi_allreduce"),
                "{name}"
            );
        }
        assert_eq!(
            bound_routine("MPIX_ALLREDUCE_INIT").as_deref(),
            Some("mpix_allreduce_init")
        );
        assert_eq!(
            bound_routine("pmpix_allreduce_init__").as_deref(),
            Some("mpix_allreduce_init")
        );
        assert_eq!(
            bound_routine("mpi_allreduce_c_f08ts_").as_deref(),
            Some("mpi_allreduce_c")
        );
    }

    #[test]
    fn c_names_and_others_bind_nothing() {
        // The C names (a PMPI tool's library defines them), their aliases without a
        // trailing underscore, and anything not MPI's.
        for other in [
            "MPI_Allreduce",
            "PMPI_Init",
            "MPI_File_write_all",
            "MPI_Allreduce_f08",
            "ompi_allreduce_f",
            "mpi_allreduce",
            "ompi_mpi_comm_world",
            "fi_getinfo",
            "main",
            "mpi",
            "MPIR_Err_return_comm",
        ] {
            assert_eq!(bound_routine(other), None, "{other}");
        }
        // A suffix is taken once: no name of many gives a routine's.
        assert_eq!(
            bound_routine("mpi_allreduce_f08_f08_").as_deref(),
            Some("mpi_allreduce_f08")
        );
    }
}
