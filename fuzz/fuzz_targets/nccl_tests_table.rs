//! An nccl-tests output given to `commtap compare`, then compared with itself.

#![no_main]

use collector::compare::{compare, parse_tables, render, resolve_op, table_curve, Placement};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for table in parse_tables(&text) {
        let op = resolve_op(None, &table).unwrap_or_else(|_| "ncclAllReduce".to_string());
        for placement in [Placement::OutOfPlace, Placement::InPlace] {
            if let Ok(curve) = table_curve(&table, placement) {
                let c = compare(&op, &curve, &curve, 0.8);
                std::hint::black_box(render(&c));
            }
        }
    }
    let _ = std::hint::black_box(collector::compare::pick_table(&text, "fuzz", Some(1)));
});
