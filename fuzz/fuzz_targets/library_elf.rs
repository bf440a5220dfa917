//! A library file a user controls, as the daemon reads it: any file a process maps, or
//! one named on commtap's command line; and as a program whose call sites are named (its
//! symbols demangled, its DWARF line tables). Nothing may panic, and what is read stays within
//! `collector::symbols::file`'s budget (run with `-rss_limit_mb=1024`).
//!
//! The input is written to a file (one per process and name, reused) because commtap only
//! ever parses a file it opened. Some decisions depend on the file's name (`mpich`,
//! `rccl`, `libmpi_abi`, a provider's `lib<name>-fi.so`): byte 15 of the input, the last
//! byte of the ELF identification's padding, which no parser reads, picks the name.
//!
//! Real libraries are seeds (megabytes): parsed whenever a run starts, but inputs over
//! [`KEEP_MAX`] are never kept in the corpus, or libFuzzer's copies of their mutations
//! (it keeps the corpus in memory) would pass the RSS limit within minutes. The small ELF
//! files built from `tests/programs` are the ones mutated.

#![no_main]

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use collector::symbols::{dynamic_needs, read_library, sites::name_functions_of, LibraryFile};
use libfuzzer_sys::{fuzz_target, Corpus};

/// Largest input kept in the corpus.
const KEEP_MAX: usize = 1 << 20;

/// Names that steer `read_library`'s heuristics.
const NAMES: &[&str] = &[
    "libfuzz.so",
    "libmpich.so.12",
    "librccl.so.1",
    "libmpi_abi.so.1",
    "libtcp-fi.so",
];

/// This process's directory for the input files, removed at exit.
fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("commtap-fuzz-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the fuzz input directory");
        extern "C" fn remove_dir() {
            if let Some(dir) = DIR.get() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        // SAFETY: registers a function taking and returning nothing, run once at exit.
        unsafe { libc::atexit(remove_dir) };
        dir
    })
}

fuzz_target!(|data: &[u8]| -> Corpus {
    let name = NAMES[usize::from(data.get(15).copied().unwrap_or(0)) % NAMES.len()];
    let path = dir().join(name);
    std::fs::write(&path, data).expect("writing the fuzz input");
    if let Ok(file) = LibraryFile::open_path(&path) {
        let _ = std::hint::black_box(read_library(&file));
        // As a program whose call sites are named: its symbols, demangled, and its lines.
        std::hint::black_box(name_functions_of(&file));
    }
    std::hint::black_box(dynamic_needs(&path));
    if data.len() > KEEP_MAX {
        Corpus::Reject
    } else {
        Corpus::Keep
    }
});
