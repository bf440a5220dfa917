//! The kernel's identity event of a process: its environment and arguments are copied
//! from memory the process owns. The input is padded with zeros (or cut) to the event's
//! size, as the ring buffer only hands over whole records.

#![no_main]

use collector_common::IdentityEvent;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut bytes = vec![0u8; size_of::<IdentityEvent>()];
    let n = data.len().min(bytes.len());
    bytes[..n].copy_from_slice(&data[..n]);
    std::hint::black_box(collector::ingest::identity_event(&bytes));
});
