//! What real trace consumers find in commtap's traces: Chrome DevTools' trace engine and
//! Perfetto's trace processor, run by Node (`tests/consumers/`, installed by `cargo xtask
//! setup`).

use std::{path::Path, process::Command};

use serde_json::Value;

use crate::repo_root;

/// The slice an arrow ends on, at the end of the receive that took the message
/// (`commtap::trace::ARRIVAL`).
pub const ARRIVAL: &str = "message received";

/// What Chrome DevTools' trace engine finds in a Chrome JSON trace
/// (`tests/consumers/devtools.mjs`): per process (by pid) its `name`, `threads`,
/// `routines` ({slices, bytes}) and `nested` pairs; `flows`; the file's `metadata`.
#[track_caller]
pub fn devtools_summary(trace: &Path) -> Value {
    consumer("devtools.mjs", "DevTools' trace engine", trace, &[])
}

/// What consumer `script` (in `tests/consumers/`) prints of `trace`, asked `args`.
#[track_caller]
fn consumer(script: &str, who: &str, trace: &Path, args: &[&str]) -> Value {
    let out = Command::new("node")
        .arg(repo_root().join("tests/consumers").join(script))
        .arg(trace)
        .args(args)
        .output()
        .expect("running node (cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "{who} could not load {}: {}",
        trace.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the consumer's JSON")
}

/// (slices, bytes) per routine of process `pid` in a [`devtools_summary`] or a
/// [`perfetto_summary`] (empty if the trace holds none of its calls; the slices arrows end
/// on are not calls).
pub fn traced_routines(
    summary: &Value,
    pid: u64,
) -> std::collections::BTreeMap<String, (u64, u64)> {
    summary["processes"][pid.to_string()]["routines"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| k.as_str() != ARRIVAL)
                .map(|(k, v)| {
                    let n = |f: &str| v[f].as_u64().unwrap_or(0);
                    (k.clone(), (n("slices"), n("bytes")))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The rows of each SQL query, as Perfetto's trace processor answers them on `trace`
/// (`tests/consumers/perfetto.mjs`; Chrome JSON and Perfetto protobuf alike).
#[track_caller]
pub fn perfetto_query(trace: &Path, queries: &[&str]) -> Vec<Vec<Value>> {
    let doc = consumer("perfetto.mjs", "Perfetto's trace processor", trace, queries);
    doc["queries"]
        .as_array()
        .expect("queries")
        .iter()
        .map(|rows| rows.as_array().cloned().unwrap_or_default())
        .collect()
}

/// What Perfetto's trace processor finds in a trace: per process (by pid) its `name` and
/// `routines` ({slices, bytes}); `arrows`, each {from_pid, from, to_pid, to, forward}
/// (the slice it starts on, the call whose end it points at, whether it goes forward in
/// time); `errors`: the processor's error and data-loss counts that are not 0.
#[track_caller]
pub fn perfetto_summary(trace: &Path) -> Value {
    // Every slice with its process: a thread's track, or a track of the process (the GPU
    // window track of a .pftrace). Arguments are `args.*` from JSON, `debug.*` from a
    // .pftrace.
    const SLICES: &str = "create perfetto view commtap_slice as \
        select s.id, s.ts, s.dur, s.name, s.parent_id, p.pid, p.name as process, \
        coalesce(extract_arg(s.arg_set_id, 'args.bytes'), \
                 extract_arg(s.arg_set_id, 'debug.bytes')) as bytes \
        from slice s left join thread_track tt on s.track_id = tt.id \
        left join thread t on t.utid = tt.utid \
        left join process_track pt on s.track_id = pt.id \
        join process p on p.upid = coalesce(t.upid, pt.upid)";
    let rows = perfetto_query(
        trace,
        &[
            SLICES,
            "select pid, process as name, name as routine, count(*) as slices, \
             sum(coalesce(bytes, 0)) as bytes from commtap_slice group by 1, 2, 3",
            "select o.pid as from_pid, o.name as \"from\", i.pid as to_pid, \
             coalesce(r.name, i.name) as \"to\", i.ts >= o.ts as forward \
             from flow f join commtap_slice o on o.id = f.slice_out \
             join commtap_slice i on i.id = f.slice_in \
             left join slice r on r.id = i.parent_id and i.name = 'message received' \
             order by 1, 3, 2, 4",
            "select name, value from stats where value > 0 \
             and severity in ('error', 'data_loss') order by name",
        ],
    );
    let mut processes = serde_json::Map::new();
    for r in &rows[1] {
        let pid = r["pid"].as_u64().expect("pid").to_string();
        let p = processes
            .entry(pid)
            .or_insert_with(|| serde_json::json!({"name": r["name"], "routines": {}}));
        p["routines"][r["routine"].as_str().expect("routine")] =
            serde_json::json!({"slices": r["slices"], "bytes": r["bytes"]});
    }
    serde_json::json!({"processes": processes, "arrows": rows[2], "errors": rows[3]})
}
