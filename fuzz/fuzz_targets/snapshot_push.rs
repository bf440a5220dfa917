//! A PushSnapshots message from any peer that reaches an aggregator: decoded, checked as
//! the store checks a batch, then (if accepted) converted and rendered as a job's report
//! is (`Store::job`, then `render_text`).

#![no_main]

use collector::{
    aggregator::store::prepare,
    api::pb::PushSnapshotsRequest,
    profile::{JobProfile, RankProfile},
};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = PushSnapshotsRequest::decode(data) else {
        return;
    };
    let ranks: Vec<RankProfile> = req
        .processes
        .iter()
        .filter_map(|w| w.rank.as_ref().and_then(|r| RankProfile::try_from(r).ok()))
        .collect();
    if prepare(req.processes).is_err() || ranks.is_empty() {
        return;
    }
    let profile = JobProfile::of_ranks(ranks);
    std::hint::black_box(collector::report::render_text(&profile));
    std::hint::black_box(collector::compare::profile_curve(&profile, "ncclAllReduce"));
});
