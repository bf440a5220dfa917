//! libfabric's data path, found through provider ops tables.
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
//! - **In a process's memory** ([`endpoint_tables`], `commtap scan-fabric --pid`, a
//!   diagnostic): the endpoints and the tables they point at, as the method was first
//!   verified here.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    io::{Read, Seek, SeekFrom},
};

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationFlags};

use crate::symbols::{Data, Elf, LibraryFile};

/// `sizeof(struct fi_ops_msg)` (and `fi_ops_tagged`, `fi_ops_rma`).
const OPS_TABLE_SIZE: u64 = 80;
/// Function slots after the size word.
pub const SLOTS: usize = 9;
/// `FI_CLASS_EP`.
const FI_CLASS_EP: u64 = 3;
/// `FI_CLASS_FABRIC`.
const FI_CLASS_FABRIC: u64 = 1;
/// `R_X86_64_RELATIVE`.
const R_X86_64_RELATIVE: u32 = 8;
/// `R_X86_64_64`.
const R_X86_64_64: u32 = 1;
/// Most bytes of a process's memory read while looking for endpoints.
const SCAN_LIMIT: u64 = 512 << 20;

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
                .filter(|s| s.is_definition())
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
            if word != OPS_TABLE_SIZE {
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

/// A library mapping of a process: its load bias (runtime address − file virtual address)
/// and the end of its last segment.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    /// Runtime address of virtual address 0.
    pub bias: u64,
    /// One past the last byte the object has mapped.
    pub end: u64,
}

impl Mapping {
    /// Whether `addr` is inside the object's mappings.
    pub fn holds(&self, addr: u64) -> bool {
        addr >= self.bias && addr < self.end
    }
}

impl Mapping {
    /// Where `o` is mapped (`None` without a mapping at file offset 0).
    pub fn of(o: &crate::discover::MappedObject) -> Option<Mapping> {
        Some(Mapping {
            bias: o.bias?,
            end: o.end,
        })
    }
}

/// What a process's memory shows of its endpoints.
#[derive(Debug, Default)]
pub struct EndpointScan {
    /// Candidate tables (by file virtual address) seen as each kind.
    pub tables: BTreeSet<(TableKind, u64)>,
    /// Endpoints found.
    pub endpoints: usize,
    /// Bytes of memory read.
    pub scanned: u64,
}

/// Calls `visit(base, bytes)` for each of `pid`'s writable anonymous mappings (the heap,
/// malloc's arenas: where libfabric's objects live), up to `SCAN_LIMIT` bytes in all;
/// returns the bytes read.
fn for_each_anonymous_region(pid: u32, mut visit: impl FnMut(u64, &[u8])) -> u64 {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return 0;
    };
    let Ok(mut mem) = File::open(format!("/proc/{pid}/mem")) else {
        return 0;
    };
    let mut scanned = 0;
    let mut buf = Vec::new();
    for m in crate::discover::maps_lines(&maps) {
        if !m.perms.starts_with("rw") || m.inode != 0 || !(m.path.is_empty() || m.path == "[heap]")
        {
            continue;
        }
        let (lo, hi) = (m.lo, m.hi);
        let len = hi - lo;
        if scanned + len > SCAN_LIMIT {
            continue;
        }
        buf.resize(len as usize, 0);
        if mem.seek(SeekFrom::Start(lo)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        scanned += len;
        visit(lo, &buf);
    }
    scanned
}

/// The little-endian word at byte `at` of `buf`.
fn word(buf: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

/// Finds `pid`'s endpoints in its writable anonymous memory and which candidates their
/// msg/rma/tagged fields point at.
pub fn endpoint_tables(pid: u32, map: Mapping, candidates: &[Candidate]) -> EndpointScan {
    let runtime: BTreeMap<u64, u64> = candidates
        .iter()
        .map(|c| (c.vaddr.wrapping_add(map.bias), c.vaddr))
        .collect();
    let mut scan = EndpointScan::default();
    scan.scanned = for_each_anonymous_region(pid, |_, buf| {
        for at in (0..buf.len()).step_by(8) {
            if word(buf, at) != Some(FI_CLASS_EP) {
                continue;
            }
            let mut any = false;
            for (i, kind) in TableKind::ALL.iter().enumerate() {
                if let Some(vaddr) = word(buf, at + 40 + 8 * i).and_then(|p| runtime.get(&p)) {
                    scan.tables.insert((*kind, *vaddr));
                    any = true;
                }
            }
            scan.endpoints += usize::from(any);
        }
    });
    scan
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
        crate::symbols::c_string(elf, data, addr)
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

/// The fabrics `pid` has open, found in its memory, as (provider, fabric name): libfabric's
/// common fabric object (`struct util_fabric`) starts with a `fid` of class FI_CLASS_FABRIC
/// whose two ops pointers point into a libfabric object, and a few words on holds the
/// fabric's name and a pointer to its provider's `struct fi_provider` (one of `providers`,
/// by runtime address). For processes commtap attaches to after they opened their fabric.
pub fn open_fabrics(
    pid: u32,
    objects: &[Mapping],
    providers: &BTreeMap<u64, String>,
) -> BTreeSet<(String, String)> {
    let in_libfabric = |p: Option<u64>| p.is_some_and(|p| objects.iter().any(|m| m.holds(p)));
    let mut found = Vec::new();
    for_each_anonymous_region(pid, |_, buf| {
        for at in (0..buf.len()).step_by(8) {
            if word(buf, at) != Some(FI_CLASS_FABRIC)
                || !in_libfabric(word(buf, at + 16))
                || !in_libfabric(word(buf, at + 24))
            {
                continue;
            }
            if let Some(k) =
                (4..24).find(|k| word(buf, at + 8 * k).is_some_and(|p| providers.contains_key(&p)))
            {
                let prov = word(buf, at + 8 * k).unwrap_or(0);
                found.push((providers[&prov].clone(), word(buf, at + 8 * (k - 1))));
            }
        }
    });
    found
        .into_iter()
        .map(|(prov, name)| {
            (
                prov,
                name.and_then(|p| read_c_string(pid, p)).unwrap_or_default(),
            )
        })
        .collect()
}

/// A short NUL-terminated string at `addr` in `pid`'s memory.
fn read_c_string(pid: u32, addr: u64) -> Option<String> {
    let mut mem = File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = [0u8; 64];
    mem.seek(SeekFrom::Start(addr)).ok()?;
    mem.read_exact(&mut buf).ok()?;
    let end = buf.iter().position(|b| *b == 0)?;
    let s = std::str::from_utf8(&buf[..end]).ok()?;
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())).then(|| s.to_string())
}

/// Reads and parses `file`, then lists its candidates (for the library cache).
pub fn read_candidates(file: &LibraryFile) -> std::io::Result<Vec<Candidate>> {
    let data = file.data()?;
    let elf =
        Elf::parse(&data).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok(candidate_tables(&elf, &data))
}
