//! A process's command line, environment (both written by its owner) and cgroup text, as
//! `/proc/PID/{cmdline,environ,cgroup}` give them. The input is the three parts separated
//! by the first two 0xFF bytes (which UTF-8 never holds).

#![no_main]

use collector::discover::ProcessInfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == 0xff);
    let cmdline = parts.next().unwrap_or_default();
    let environ = parts.next().unwrap_or_default();
    let cgroup = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let info = ProcessInfo::from_parts(1, Some(0), 0, cmdline, environ, Some(&cgroup));
    assert!(info.cmdline.len() <= collector::discover::MAX_CMDLINE + '…'.len_utf8());
    std::hint::black_box(info);
});
