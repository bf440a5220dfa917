//! libfabric's data path in a library file: provider ops tables and provider structs.
//!
//! `fi_send`, `fi_tinject`, `fi_write` ... are `static inline` calls through tables of
//! function pointers (`ep->msg->send(...)`), so there is no symbol to probe, and Debian's
//! library is stripped.
//!
//! - **The library file** ([`candidate_tables`]): an ops table is a `size_t size` equal to
//!   its own size (80 bytes for `fi_ops_msg`, `fi_ops_tagged`, `fi_ops_rma`) followed by
//!   nine pointers, each a relative relocation to code. Every slot of every candidate is
//!   probed (collector-ebpf's `fabric`), once per function.
//! - **At the call**, the kernel tells the candidates apart: the endpoint in the first
//!   argument (`struct fid_ep`, msg/rma/tagged table pointers at +40/+48/+56) says which of
//!   its tables holds the called function in that slot; a function of another table of the
//!   same shape (connection management, say) matches none and is counted as unresolved.
//!   Endpoints created after attach need nothing more.
//! - **In a process's memory** (`discover::memory`): the endpoints and the tables they
//!   point at, as the method was first verified here, and the fabrics a process opened
//!   before commtap attached.

use std::collections::BTreeMap;

use collector_common::routines::{FABRIC_SLOTS, FI_OPS_TABLE_SIZE};
use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationFlags};

use super::{Data, Elf, LibraryFile};

/// Function slots after the size word.
pub const SLOTS: usize = FABRIC_SLOTS as usize;

/// `R_X86_64_RELATIVE`.
const R_X86_64_RELATIVE: u32 = 8;
/// `R_X86_64_64`.
const R_X86_64_64: u32 = 1;

/// Which of an endpoint's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TableKind {
    /// `fi_ops_msg` (`ep->msg`, +40).
    Msg,
    /// `fi_ops_rma` (`ep->rma`, +48).
    Rma,
    /// `fi_ops_tagged` (`ep->tagged`, +56).
    Tagged,
}

impl TableKind {
    /// The kinds in the order of their `fid_ep` fields (+40, +48, +56).
    pub const ALL: [TableKind; 3] = [TableKind::Msg, TableKind::Rma, TableKind::Tagged];
}

/// An ops-table candidate in a library file: where it is and where its slots point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Virtual address of the table (its size word).
    pub vaddr: u64,
    /// Virtual addresses of the nine functions.
    pub slots: [u64; SLOTS],
}

/// Where the loader points each relocated pointer of a library: slot address -> target
/// (`R_X86_64_RELATIVE`, and `R_X86_64_64` against a symbol the library defines).
pub fn relocated_pointers(elf: &Elf) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    let Some(relocs) = elf.dynamic_relocations() else {
        return out;
    };
    for (at, r) in relocs {
        let RelocationFlags::Elf { r_type } = r.flags() else {
            continue;
        };
        let target = match (r_type, r.target()) {
            (R_X86_64_RELATIVE, _) => Some(r.addend() as u64),
            (R_X86_64_64, object::RelocationTarget::Symbol(i)) => elf
                .dynamic_symbol_table()
                .and_then(|t| t.symbol_by_index(i).ok())
                .filter(object::ObjectSymbol::is_definition)
                .map(|s| s.address().wrapping_add(r.addend() as u64)),
            _ => None,
        };
        if let Some(t) = target {
            out.insert(at, t);
        }
    }
    out
}

/// The ops-table candidates of a library (see the module documentation).
pub fn candidate_tables(elf: &Elf, data: Data<'_>) -> Vec<Candidate> {
    let text = elf
        .section_by_name(".text")
        .map(|s| (s.address(), s.address().saturating_add(s.size())));
    let Some((text_lo, text_hi)) = text else {
        return Vec::new();
    };
    let relative = relocated_pointers(elf);
    let in_text = |a: u64| a >= text_lo && a < text_hi;
    let mut out = Vec::new();
    for s in elf.sections() {
        let (Some((off, size)), Ok(name)) = (s.file_range(), s.name()) else {
            continue;
        };
        if !matches!(name, ".data" | ".data.rel.ro") {
            continue;
        }
        let bytes = data.bytes(off, size).unwrap_or(&[]);
        let base = s.address();
        for at in (0..bytes.len().saturating_sub(8)).step_by(8) {
            let word = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
            if word != FI_OPS_TABLE_SIZE {
                continue;
            }
            let vaddr = base.wrapping_add(at as u64);
            let mut slots = [0u64; SLOTS];
            let ok = (0..SLOTS).all(|i| {
                let target = relative
                    .get(&(vaddr.wrapping_add(8 + 8 * i as u64)))
                    .copied();
                slots[i] = target.unwrap_or(0);
                target.is_some_and(in_text)
            });
            if ok {
                out.push(Candidate { vaddr, slots });
            }
        }
    }
    out
}

/// A provider's `struct fi_provider` in a libfabric library or provider DSO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderStruct {
    /// `name` (`tcp`, `ofi_rxm`, ...).
    pub name: String,
    /// Virtual address of the struct.
    pub vaddr: u64,
}

/// The `struct fi_provider`s of a library: `name` (+40) relocated to a short string and
/// `getinfo`, `fabric`, `cleanup` (+48, +56, +64) relocated into .text.
pub fn provider_structs(elf: &Elf, data: Data<'_>) -> Vec<ProviderStruct> {
    let Some(text) = elf.section_by_name(".text") else {
        return Vec::new();
    };
    let in_text = |a: u64| a >= text.address() && a < text.address().saturating_add(text.size());
    let pointers = relocated_pointers(elf);
    // A provider name: short and printable.
    let string = |addr: u64| {
        super::c_string(elf, data, addr)
            .filter(|n| !n.is_empty() && n.len() < 32 && n.bytes().all(|b| b.is_ascii_graphic()))
    };
    pointers
        .iter()
        .filter(|(at, _)| {
            (1..=3).all(|i| {
                pointers
                    .get(&(at.wrapping_add(8 * i)))
                    .is_some_and(|t| in_text(*t))
            })
        })
        .filter_map(|(at, target)| {
            Some(ProviderStruct {
                name: string(*target)?,
                vaddr: at.checked_sub(40)?,
            })
        })
        .collect()
}

/// Reads and parses `file`, then lists its candidates (for the library cache).
pub fn read_candidates(file: &LibraryFile) -> std::io::Result<Vec<Candidate>> {
    let data = file.data()?;
    let elf =
        Elf::parse(&data).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok(candidate_tables(&elf, &data))
}
