//! A JSON profile (`commtap.profile.v1`) given to `commtap report` / `commtap compare`:
//! parsed, rendered as mpitrace text, and turned into a bandwidth curve.

#![no_main]

use collector::{compare::profile_curve, profile::JobProfile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(profile) = serde_json::from_slice::<JobProfile>(data) else {
        return;
    };
    std::hint::black_box(collector::report::render_text(&profile));
    for op in ["allreduce", "ncclAllReduce"] {
        std::hint::black_box(profile_curve(&profile, op));
    }
    std::hint::black_box(profile.comm_summary().map(|s| s.median.rank));
});
