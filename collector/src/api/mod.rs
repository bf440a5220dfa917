//! The gRPC API (`proto/commtap/v1`) that the node daemon, the aggregator and their
//! clients share: the generated types, their conversion from and to the domain types,
//! process snapshots, the error mapping, message limits, and how a server is reached.

pub mod convert;
pub mod limit;
pub mod server;
pub mod snapshot;
pub mod status;
pub mod transport;

/// Largest reply a commtap client accepts (a node's or a job's whole profile: 10,000 ranks
/// take about 10 MiB; gRPC's default of 4 MiB would refuse them).
pub const MAX_REPLY_BYTES: usize = 64 << 20;
/// Largest push message an aggregator accepts. Pushers split their snapshots into messages
/// of about [`PUSH_MESSAGE_BYTES`]; one process's snapshot alone stays far below this.
pub const MAX_PUSH_BYTES: usize = 16 << 20;
/// What a pusher puts in one message of its stream, at most (unless one snapshot is larger).
pub const PUSH_MESSAGE_BYTES: usize = 1 << 20;

/// A Node client with commtap's message limits.
pub fn node_client(
    channel: tonic::transport::Channel,
) -> pb::node_client::NodeClient<tonic::transport::Channel> {
    pb::node_client::NodeClient::new(channel).max_decoding_message_size(MAX_REPLY_BYTES)
}

/// An Aggregator client with commtap's message limits.
pub fn aggregator_client(
    channel: tonic::transport::Channel,
) -> pb::aggregator_client::AggregatorClient<tonic::transport::Channel> {
    pb::aggregator_client::AggregatorClient::new(channel)
        .max_decoding_message_size(MAX_REPLY_BYTES)
        .max_encoding_message_size(MAX_PUSH_BYTES)
}

/// Code generated from `proto/commtap/v1/*.proto`.
pub mod pb {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("commtap.v1");

    /// Encoded descriptors of the API, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/commtap_descriptor.bin"));
}
