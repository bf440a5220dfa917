//! The node daemon's servers: the `Node` gRPC service and the Prometheus endpoint.

pub mod metrics;
pub mod node;
