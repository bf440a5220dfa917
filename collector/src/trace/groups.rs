//! NCCL groups on a timeline: one slice around the operations enqueued in each.

use crate::api::pb;

/// An NCCL group open on a thread: from its outermost `ncclGroupStart`.
#[derive(Debug)]
struct OpenGroup {
    start_ns: u64,
    depth: u32,
    bytes: u64,
}

/// NCCL groups as they open and close on each thread (a thread's calls arrive in order).
/// A group is shown as one `ncclGroup` slice from its outermost `ncclGroupStart` to its
/// `ncclGroupEnd`, holding the operations enqueued in it, with their bytes: as the
/// profile's `ncclGroup` counts completed groups.
#[derive(Debug, Default)]
pub struct NcclGroups {
    open: std::collections::HashMap<(u32, u32), OpenGroup>,
}

impl NcclGroups {
    /// Follows `ev`; the group it closes, if it closes one.
    pub fn track(&mut self, ev: &pb::CallEvent) -> Option<pb::CallEvent> {
        if ev.device_window.is_some() {
            return None;
        }
        let thread = (ev.pid, ev.tid);
        match ev.routine.as_str() {
            "ncclGroupStart" => {
                self.open
                    .entry(thread)
                    .and_modify(|g| g.depth += 1)
                    .or_insert(OpenGroup {
                        start_ns: ev.start_ns,
                        depth: 1,
                        bytes: 0,
                    });
                None
            }
            "ncclGroupEnd" => {
                let g = self.open.get_mut(&thread)?;
                g.depth -= 1;
                if g.depth > 0 {
                    return None;
                }
                let g = self.open.remove(&thread)?;
                // 1 ns past ncclGroupEnd's return: viewers that compare times as floats
                // (DevTools) then nest ncclGroupEnd inside, as they do the other calls.
                let end = ev.start_ns + ev.duration_ns + 1;
                Some(pb::CallEvent {
                    pid: ev.pid,
                    tid: ev.tid,
                    routine: "ncclGroup".into(),
                    start_ns: g.start_ns,
                    duration_ns: end.saturating_sub(g.start_ns),
                    bytes: Some(g.bytes),
                    ..Default::default()
                })
            }
            r if r.starts_with("nccl") => {
                if let Some(g) = self.open.get_mut(&thread) {
                    g.bytes += ev.bytes.unwrap_or(0);
                }
                None
            }
            _ => None,
        }
    }
}
