//! A symbol's name from a file a user controls, as a call site shows it: demangled (C++,
//! Rust) and shortened. Nothing may panic or run long (a back-reference can make a short
//! name's text grow exponentially), and the text is at most the length asked.

#![no_main]

use collector::symbols::demangle::readable;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let name = String::from_utf8_lossy(data);
    let max = 1 + usize::from(data.first().copied().unwrap_or(0));
    let shown = readable(&name, max);
    assert!(shown.chars().count() <= max.max(2), "{shown:?} longer than {max}");
});
