//! Who is late's report <-> its wire form.

use super::{bucket, invalid, mirror, pb, InvalidMessage};
use crate::{
    skew::{
        late_sender::{LateSenderPair, LateSenderReport},
        summary::{LateRank, Quantiles, RankRoutineSkew, RankSkew, RoutineSkew, WorstInstance},
        SkewReport,
    },
    trace::flows::Unlinked,
};

mirror!(Quantiles, pb::Quantiles; copy [p50, p90, p99, max] clone [] each [] cast []);
mirror!(LateRank, pb::LateRank;
    copy [rank, last, caused_ns, median_ns] clone [host] each [] cast []);
mirror!(RankRoutineSkew, pb::RankRoutineSkew;
    copy [last, caused_ns, waited_ns] clone [routine] each [] cast []);
mirror!(RankSkew, pb::RankSkew;
    copy [rank, instances, last, caused_ns, waited_ns, seq] clone [host] each [routines] cast []);
mirror!(WorstInstance, pb::WorstInstance;
    copy [seq, late_rank, skew_ns] clone [routine, comm, host] each [] cast []);
mirror!(LateSenderPair, pb::LateSenderPair;
    copy [receiver, sender, messages, late, wait_ns] clone [receiver_host, sender_host]
    each [] cast []);
mirror!(Unlinked, pb::MessagesNotNumbered;
    copy [not_from_init, after_unresolved_wildcard, communicator_unknown, too_many_channels,
        persistent_channel]
    clone [] each [] cast []);

impl From<&LateSenderReport> for pb::LateSenderReport {
    fn from(r: &LateSenderReport) -> Self {
        pb::LateSenderReport {
            pairs: r.pairs.iter().map(Into::into).collect(),
            late_receivers: r.late_receivers.iter().map(Into::into).collect(),
            not_numbered: Some((&r.not_numbered).into()),
            unpaired: r.unpaired,
        }
    }
}

impl From<&pb::LateSenderReport> for LateSenderReport {
    fn from(r: &pb::LateSenderReport) -> Self {
        LateSenderReport {
            pairs: r.pairs.iter().map(Into::into).collect(),
            late_receivers: r.late_receivers.iter().map(Into::into).collect(),
            not_numbered: r.not_numbered.as_ref().map(Into::into).unwrap_or_default(),
            unpaired: r.unpaired,
        }
    }
}

impl From<&RoutineSkew> for pb::RoutineSkew {
    fn from(r: &RoutineSkew) -> Self {
        pb::RoutineSkew {
            routine: r.routine.clone(),
            bucket: r.bucket.map(u32::from),
            min_bytes: r.min_bytes,
            max_bytes: r.max_bytes,
            instances: r.instances,
            skew_ns: Some((&r.skew_ns).into()),
            transfer_ns: Some((&r.transfer_ns).into()),
            most_last: r.most_last.as_ref().map(Into::into),
        }
    }
}

impl TryFrom<&pb::RoutineSkew> for RoutineSkew {
    type Error = InvalidMessage;

    fn try_from(r: &pb::RoutineSkew) -> Result<Self, Self::Error> {
        let quantiles = |q: &Option<pb::Quantiles>| q.as_ref().map(Into::into).unwrap_or_default();
        let bucket = bucket(r.bucket, "RoutineSkew")?;
        if let Some(b) = bucket.filter(|b| *b >= collector_common::BUCKETS) {
            return Err(invalid("RoutineSkew", format!("bucket {b} out of range")));
        }
        Ok(RoutineSkew {
            routine: r.routine.clone(),
            bucket,
            min_bytes: r.min_bytes,
            max_bytes: r.max_bytes,
            instances: r.instances,
            skew_ns: quantiles(&r.skew_ns),
            transfer_ns: quantiles(&r.transfer_ns),
            most_last: r.most_last.as_ref().map(Into::into),
        })
    }
}

impl From<&SkewReport> for pb::SkewReport {
    fn from(s: &SkewReport) -> Self {
        pb::SkewReport {
            instances: s.instances,
            incomplete: s.incomplete,
            remote: s.remote,
            within_clock_error: s.within_clock_error,
            sampled: s.sampled,
            unidentified: s.unidentified,
            unaligned: s.unaligned,
            lost: s.lost,
            ranks: s.ranks.iter().map(Into::into).collect(),
            routines: s.routines.iter().map(Into::into).collect(),
            worst: s.worst.iter().map(Into::into).collect(),
            findings: s.findings.clone(),
            late_sender: s.late_sender.as_ref().map(Into::into),
        }
    }
}

impl TryFrom<&pb::SkewReport> for SkewReport {
    type Error = InvalidMessage;

    fn try_from(s: &pb::SkewReport) -> Result<Self, Self::Error> {
        Ok(SkewReport {
            instances: s.instances,
            incomplete: s.incomplete,
            remote: s.remote,
            within_clock_error: s.within_clock_error,
            sampled: s.sampled,
            unidentified: s.unidentified,
            unaligned: s.unaligned,
            lost: s.lost,
            ranks: s.ranks.iter().map(Into::into).collect(),
            routines: s
                .routines
                .iter()
                .map(RoutineSkew::try_from)
                .collect::<Result<_, _>>()?,
            worst: s.worst.iter().map(Into::into).collect(),
            findings: s.findings.clone(),
            late_sender: s.late_sender.as_ref().map(Into::into),
        })
    }
}
