//! What a process's memory shows of libfabric (`/proc/PID/mem`): the endpoints and the ops
//! tables they point at (`commtap scan-fabric --pid`, a diagnostic: how the method of
//! `symbols::fabric` was first verified), and the fabrics a process opened before commtap
//! attached (their `fi_fabric` calls were not seen); and the components an Open MPI
//! process selected at its `MPI_Init` where commtap did not see it return.

use std::collections::{BTreeMap, BTreeSet};

use collector_common::{ompi_component as oc, routines::FID_EP_TABLES_OFF, ComponentAddrs};

use super::{process_dir::ProcessDir, process_memory::ProcessMemory};
use crate::symbols::fabric::{Candidate, TableKind};

/// `FI_CLASS_EP`.
const FI_CLASS_EP: u64 = 3;
/// `FI_CLASS_FABRIC`.
const FI_CLASS_FABRIC: u64 = 1;
/// Most bytes of a process's memory read while looking for endpoints.
const SCAN_LIMIT: u64 = 512 << 20;

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
    pub fn of(o: &super::MappedObject) -> Option<Mapping> {
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

/// Calls `visit(base, bytes)` for each of `process`'s writable anonymous mappings (the
/// heap, malloc's arenas: where libfabric's objects live), up to `SCAN_LIMIT` bytes in
/// all; returns the bytes read.
fn for_each_anonymous_region(process: &ProcessDir, mut visit: impl FnMut(u64, &[u8])) -> u64 {
    let (Ok(maps), Some(mem)) = (process.maps(), ProcessMemory::open(process)) else {
        return 0;
    };
    let mut scanned = 0;
    for m in super::maps_lines(&maps) {
        if !m.perms.starts_with("rw") || m.inode != 0 || !(m.path.is_empty() || m.path == "[heap]")
        {
            continue;
        }
        let (lo, hi) = (m.lo, m.hi);
        let len = hi - lo;
        if scanned + len > SCAN_LIMIT {
            continue;
        }
        // Listed as anonymous: a file mapped over it since is the reader's to wait on.
        let Some(buf) = usize::try_from(len).ok().and_then(|n| mem.read(lo, n)) else {
            continue;
        };
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
    let Ok(process) = ProcessDir::open(pid, None) else {
        return scan;
    };
    scan.scanned = for_each_anonymous_region(&process, |_, buf| {
        for at in (0..buf.len()).step_by(8) {
            if word(buf, at) != Some(FI_CLASS_EP) {
                continue;
            }
            let mut any = false;
            for (i, kind) in TableKind::ALL.iter().enumerate() {
                if let Some(vaddr) =
                    word(buf, at + FID_EP_TABLES_OFF as usize + 8 * i).and_then(|p| runtime.get(&p))
                {
                    scan.tables.insert((*kind, *vaddr));
                    any = true;
                }
            }
            scan.endpoints += usize::from(any);
        }
    });
    scan
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
    // Its list, its memory and the names, of one process.
    let Ok(process) = ProcessDir::open(pid, None) else {
        return BTreeSet::new();
    };
    for_each_anonymous_region(&process, |_, buf| {
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
                name.and_then(|p| read_c_string(&process, p))
                    .unwrap_or_default(),
            )
        })
        .collect()
}

/// A short NUL-terminated string at `addr` in `process`'s memory.
fn read_c_string(process: &ProcessDir, addr: u64) -> Option<String> {
    let mut buf = [0u8; 64];
    // Wherever a pointer in the process's memory leads: the reader's to wait on.
    if !ProcessMemory::open(process)?.read_exact_at(&mut buf, addr) {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0)?;
    let s = std::str::from_utf8(&buf[..end]).ok()?;
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())).then(|| s.to_string())
}

/// What an Open MPI process's selected components say of its transport: `pml ob1`, `pml
/// ucx`, `pml cm, mtl ofi` (the names as NUL-terminated bytes, `mtl` empty where none was
/// selected); `None` before a pml was selected, or for a name that is not a short word.
pub fn component_names(pml: &[u8], mtl: &[u8]) -> Option<String> {
    let word = |raw: &[u8]| {
        let end = raw.iter().position(|b| *b == 0)?;
        let s = std::str::from_utf8(&raw[..end]).ok()?;
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
            .then(|| s.to_string())
    };
    let pml = word(pml)?;
    Some(match word(mtl) {
        Some(mtl) => format!("pml {pml}, mtl {mtl}"),
        None => format!("pml {pml}"),
    })
}

/// The components `pid`'s Open MPI selected (see [`component_names`]), read from its
/// memory where `at` says they are: for a process commtap attached to after its
/// `MPI_Init` (else the kernel reports them at `MPI_Init`'s return).
pub fn mpi_components(pid: u32, at: ComponentAddrs) -> Option<String> {
    // Addresses in the library's data, and one read there: the process may have mapped
    // anything over either (the reader's to wait on).
    let mem = ProcessMemory::open(&ProcessDir::open(pid, None).ok()?)?;
    let read = |addr: u64, buf: &mut [u8]| addr != 0 && mem.read_exact_at(buf, addr);
    let mut ptr = [0u8; 8];
    let mtl = if read(at.mtl, &mut ptr) {
        u64::from_le_bytes(ptr)
    } else {
        0
    };
    let mut names = [[0u8; collector_common::COMPONENT_NAME_LEN]; 2];
    for ((component, kind), name) in [(at.pml, oc::PML), (mtl, oc::MTL)]
        .into_iter()
        .zip(&mut names)
    {
        // Only a component of the framework it should be, as the kernel checks.
        let mut ty = [0u8; 4];
        if !(read(component.wrapping_add(oc::TYPE_OFF), &mut ty)
            && u32::from_le_bytes(ty) == kind
            && read(component.wrapping_add(oc::NAME_OFF), name))
        {
            *name = [0; collector_common::COMPONENT_NAME_LEN];
        }
    }
    component_names(&names[0], &names[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_names_say_the_pml_and_the_mtl_beneath_it() {
        assert_eq!(component_names(b"ob1\0", b"\0").as_deref(), Some("pml ob1"));
        assert_eq!(
            component_names(b"cm\0xx", b"ofi\0").as_deref(),
            Some("pml cm, mtl ofi")
        );
        // Not selected yet (zeroed memory), no NUL in the buffer, or not a word.
        assert_eq!(component_names(&[0; 32], b"ofi\0"), None);
        assert_eq!(component_names(b"ob1", b"\0"), None);
        assert_eq!(component_names(b"o b1\0", b"\0"), None);
        assert_eq!(
            component_names(b"ob1\0", b"\x01\0").as_deref(),
            Some("pml ob1")
        );
    }

    /// A process's own memory read as Open MPI's: a struct laid out as
    /// `mca_base_component_t` is found by its framework's name, a pointer to one followed.
    #[test]
    fn mpi_components_are_read_where_the_library_keeps_them() {
        fn component(kind: &[u8], name: &[u8]) -> Box<[u8; 160]> {
            let mut c = Box::new([0u8; 160]);
            c[oc::TYPE_OFF as usize..][..kind.len()].copy_from_slice(kind);
            c[oc::NAME_OFF as usize..][..name.len()].copy_from_slice(name);
            c
        }
        let pml = component(b"pml", b"cm");
        let mtl = component(b"mtl", b"ofi");
        let mtl_ptr = Box::new(mtl.as_ptr() as u64);
        let me = std::process::id();
        let at = |pml: &[u8; 160], mtl: u64| ComponentAddrs {
            pml: pml.as_ptr() as u64,
            mtl,
        };
        let ptr = std::ptr::from_ref::<u64>(&mtl_ptr) as u64;
        assert_eq!(
            mpi_components(me, at(&pml, ptr)).as_deref(),
            Some("pml cm, mtl ofi")
        );
        assert_eq!(mpi_components(me, at(&pml, 0)).as_deref(), Some("pml cm"));
        // A struct of another framework is not taken for the pml.
        assert_eq!(mpi_components(me, at(&mtl, 0)), None);
        assert_eq!(
            mpi_components(me, ComponentAddrs { pml: 0, mtl: ptr }),
            None
        );
    }
}
