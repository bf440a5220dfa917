//! `/proc/PID/maps` of a process its owner controls (file names are arbitrary bytes).

#![no_main]

use collector::discover::maps_lines;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut n = 0usize;
    for line in maps_lines(&text) {
        let line = std::hint::black_box(line);
        n += usize::from(line.hi > line.lo) + line.perms.len() + line.path.len();
        std::hint::black_box((line.offset, line.dev, line.inode));
    }
    std::hint::black_box(n);
    std::hint::black_box(maps_lines(&text).count());
});
