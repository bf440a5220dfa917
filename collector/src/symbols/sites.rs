//! Naming call sites: the address an MPI or NCCL call returned to, placed in the object its
//! process mapped there and named by the function of that object's symbol table that
//! holds it (mpitrace's profile by call site).
//!
//! A rank has often exited by the time its profile is written, its mappings gone with it:
//! so each process's executable mappings are kept as discovery read them (at its exec, at
//! each library load), and each file it maps is opened then, once (`LibraryFile`: verified
//! to be the very file mapped), and read only when one of its addresses is named. Files
//! are the node's: every rank of a job maps the same ones.

use std::{collections::BTreeMap, sync::Arc};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use super::{Elf, LibraryFile};
use crate::discover::MappedObject;

/// Most files kept open for naming call sites; past it a new file's sites are left
/// unnamed (a daemon on a node of many jobs, each with its own executables).
pub const MAX_FILES: usize = 1024;
/// Most function symbols read from one file (libtorch_cpu has about 600,000).
const MAX_FUNCTIONS: usize = 4 << 20;
/// Longest function name kept (C++ templates can run to many kilobytes).
const MAX_NAME: usize = 512;

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
}

/// A file's functions, sorted by address (file-relative, as its symbols say).
#[derive(Debug, Default)]
struct Functions {
    /// Address, size (0: unknown), name.
    by_address: Vec<(u64, u64, Box<str>)>,
    /// The virtual address the file's first byte is loaded at (its first segment's: 0 for
    /// libraries and position-independent executables).
    base: u64,
}

impl Functions {
    /// The function holding file-relative address `at`, and the distance from its start.
    fn holding(&self, at: u64) -> Option<(&str, u64)> {
        let i = self.by_address.partition_point(|(a, ..)| *a <= at);
        let (start, size, name) = self.by_address.get(i.checked_sub(1)?)?;
        // A symbol without a size (hand-written assembly) holds what follows it up to the
        // next one.
        (*size == 0 || at < start + size).then(|| (&**name, at - start))
    }
}

/// A file opened for naming, read on first use.
#[derive(Debug)]
enum SiteFile {
    /// Opened, not read yet.
    Open(LibraryFile),
    /// Read (or found unreadable: no functions).
    Read(Arc<Functions>),
}

/// The files of the processes whose call sites are counted, by identity.
#[derive(Debug, Default)]
pub struct SiteFiles {
    files: BTreeMap<(u64, u64), SiteFile>,
}

impl SiteFiles {
    /// Opens, through `open`, the files among `objects` not already open (up to
    /// [`MAX_FILES`]).
    pub fn open_new(
        &mut self,
        objects: &[MappedObject],
        open: impl Fn(&MappedObject) -> Option<LibraryFile>,
    ) {
        for o in objects {
            if self.files.len() >= MAX_FILES {
                return;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = self.files.entry(o.dev_inode) {
                if let Some(file) = open(o) {
                    e.insert(SiteFile::Open(file));
                }
            }
        }
    }

    /// Closes the files none of `mapped` is.
    pub fn keep_only(&mut self, mapped: &std::collections::BTreeSet<(u64, u64)>) {
        self.files.retain(|id, _| mapped.contains(id));
    }

    /// Names `address` of a process that mapped `objects`.
    pub fn name(&mut self, objects: &[MappedObject], address: u64) -> Named {
        let Some(o) = objects
            .iter()
            .find(|o| o.code.iter().any(|(lo, hi)| (*lo..*hi).contains(&address)))
        else {
            return Named::default();
        };
        let object = Some(o.path.display().to_string());
        let (Some(bias), Some(functions)) = (o.bias, self.functions(o.dev_inode)) else {
            return Named {
                object,
                ..Named::default()
            };
        };
        let at = address - bias + functions.base;
        let (function, offset) = functions
            .holding(at)
            .map_or((None, 0), |(name, offset)| (Some(name.to_string()), offset));
        Named {
            object,
            function,
            offset,
            file_address: Some(at),
        }
    }

    /// The functions of the file `id`, read once.
    fn functions(&mut self, id: (u64, u64)) -> Option<Arc<Functions>> {
        let entry = self.files.get_mut(&id)?;
        if let SiteFile::Open(file) = entry {
            let read = read_functions(file).unwrap_or_else(|e| {
                tracing::debug!(file = %file.shown, error = %e, "call sites not named");
                Functions::default()
            });
            *entry = SiteFile::Read(Arc::new(read));
        }
        match entry {
            SiteFile::Read(f) => Some(Arc::clone(f)),
            SiteFile::Open(_) => None,
        }
    }
}

/// The function symbols of `file` (its static table and its dynamic one), sorted.
fn read_functions(file: &LibraryFile) -> Result<Functions, super::SymbolError> {
    let data = file.data().map_err(|source| super::SymbolError::Io {
        path: file.shown.clone(),
        source,
    })?;
    let elf: Elf = object::File::parse(&data).map_err(|source| super::SymbolError::Elf {
        path: file.shown.clone(),
        source,
    })?;
    let base = elf
        .segments()
        .find(|s| s.file_range().0 == 0)
        .map_or(0, |s| s.address());
    let mut by_address = Vec::new();
    for sym in elf.symbols().chain(elf.dynamic_symbols()) {
        if by_address.len() >= MAX_FUNCTIONS {
            break;
        }
        if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let name = match name.char_indices().nth(MAX_NAME) {
            Some((cut, _)) => &name[..cut],
            None => name,
        };
        by_address.push((sym.address(), sym.size(), name.into()));
    }
    // The static table's name first where both tables name an address (the dynamic one
    // may hold a versioned alias).
    by_address.sort_by_key(|(a, ..)| *a);
    by_address.dedup_by_key(|(a, ..)| *a);
    Ok(Functions { by_address, base })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_named_by_the_function_holding_it() {
        let f = Functions {
            by_address: vec![
                (0x1000, 0x20, "negotiate".into()),
                (0x1040, 0, "asm_stub".into()),
                (0x1100, 0x10, "reduce".into()),
            ],
            base: 0,
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
