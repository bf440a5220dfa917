//! The gRPC API (`proto/commtap/v1`): generated types, the conversion between them and
//! the domain types, the node service, and how it is served and reached.

pub mod convert;
pub mod metrics;
pub mod node;
pub mod push;
pub mod socket;

/// Code generated from `proto/commtap/v1/*.proto`.
pub mod pb {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("commtap.v1");

    /// Encoded descriptors of the API, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/commtap_descriptor.bin"));
}
