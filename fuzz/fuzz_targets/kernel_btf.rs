//! The kernel's BTF (`/sys/kernel/btf/vmlinux`): trusted in practice, but read by a parser
//! of its own, so it must refuse anything malformed rather than panic or loop.
//!
//! The running kernel's whole BTF is a seed (megabytes): parsed whenever a run starts, but
//! inputs over [`KEEP_MAX`] are never kept in the corpus, or libFuzzer's copies of its
//! mutations would fill memory (it keeps the corpus there) and the disk at a few runs a
//! second. The small seeds (the running kernel's own `task_struct` and `mm_struct` among
//! them) are the ones mutated.

#![no_main]

use collector::attach::btf::Btf;
use libfuzzer_sys::{fuzz_target, Corpus};

/// Largest input kept in the corpus.
const KEEP_MAX: usize = 1 << 20;

/// The lookups commtap makes, and a few that find nothing.
const LOOKUPS: &[(&str, &str)] = &[
    ("task_struct", "mm"),
    ("task_struct", "start_boottime"),
    ("mm_struct", "arg_start"),
    ("mm_struct", "env_start"),
    ("mm_struct", "arg_end"),
    ("mm_struct", "no_such_member"),
    ("no_such_struct", "mm"),
];

fuzz_target!(|data: &[u8]| -> Corpus {
    if let Ok(btf) = Btf::parse(data) {
        for (name, member) in LOOKUPS {
            let _ = std::hint::black_box(btf.offset(name, member));
        }
    }
    if data.len() > KEEP_MAX {
        Corpus::Reject
    } else {
        Corpus::Keep
    }
});
