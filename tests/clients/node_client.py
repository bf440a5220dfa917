"""A gRPC client of commtap's Node service that nobody on the project wrote: stubs are
generated from proto/commtap/v1 with grpcio-tools at run time, and the standard health and
reflection clients are used as any operator's tooling would.

Usage: node_client.py PROTO_DIR SOCKET_PATH OUT_JSON
Checks health and reflection, fetches a snapshot, checks that malformed and oversized
requests are refused with INVALID_ARGUMENT / RESOURCE_EXHAUSTED, and writes what it saw
to OUT_JSON for the Rust test to compare with the ground truth.
"""
import json
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import commtap_stubs


def main():
    proto_dir, socket_path, out_path = sys.argv[1:4]
    node_pb2, node_grpc, _ = commtap_stubs.generate(proto_dir, "node")

    # gRPC's C core sends the socket path as :authority on Unix sockets, which is not a
    # valid HTTP/2 authority; name one (grpcurl: -authority localhost).
    channel = grpc.insecure_channel(f"unix://{socket_path}", options=[("grpc.default_authority", "localhost")])
    seen = {}

    health = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service="commtap.v1.Node"), timeout=10)
    seen["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)

    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
    seen["services"] = sorted(s.name for r in responses for s in r.list_services_response.service)

    stub = node_grpc.NodeStub(channel)
    job = os.environ.get("COMMTAP_JOB", "")
    snap = stub.GetSnapshot(node_pb2.GetSnapshotRequest(filter=node_pb2.ProcessFilter(job=job)), timeout=10)
    seen["node"] = snap.node
    seen["ranks"] = [
        {
            "rank": r.rank,
            "pid": r.pid,
            "job": r.job,
            "routines": {x.name: {"calls": x.totals.calls, "bytes": x.totals.bytes} for x in r.routines},
        }
        for r in snap.profile.ranks
    ]

    def code_of(call):
        try:
            call()
        except grpc.RpcError as e:
            return e.code().name
        return "OK"

    # Malformed: an interval below the minimum.
    seen["watch_10ms"] = code_of(lambda: next(iter(stub.WatchSnapshots(
        node_pb2.WatchSnapshotsRequest(interval_ms=10), timeout=10))))
    # Oversized: a filter of 5 MiB of routine names (the server accepts 4 MiB).
    huge = node_pb2.ProcessFilter(routines=["MPI_" + "x" * 1000] * 5300)
    seen["huge_request"] = code_of(lambda: stub.GetSnapshot(node_pb2.GetSnapshotRequest(filter=huge), timeout=10))
    # A stream works: two snapshots 100 ms apart.
    stream = stub.WatchSnapshots(node_pb2.WatchSnapshotsRequest(interval_ms=100), timeout=10)
    seen["watched"] = sum(1 for _, _ in zip(range(2), stream))
    stream.cancel()

    with open(out_path, "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
