"""A gRPC client of commtap's Aggregator service that nobody on the project wrote (stubs
generated from proto/commtap/v1 with grpcio-tools at run time), for the attack tests: it
speaks as whatever certificate it is given, or none.

Usage: aggregator_client.py PROTO_DIR HOST:PORT CA CERT|- KEY|- ACTION [ARGS]
  ACTION list                          ListJobs
  ACTION push NODE PID START TAKEN     push one snapshot of process (NODE, PID, START)
                                       taken at TAKEN (the node's monotonic ns): an empty
                                       profile in job "stolen"
Prints one JSON object: {"code": "OK" | a gRPC status name, ...the response}.
"""
import importlib
import json
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc


def stubs(proto_dir):
    out_dir = tempfile.mkdtemp()
    os.makedirs(os.path.join(out_dir, "commtap", "v1"))
    for d in ("commtap", os.path.join("commtap", "v1")):
        open(os.path.join(out_dir, d, "__init__.py"), "w").close()
    for name in ("profile", "aggregator"):
        rc = protoc.main([
            "protoc", f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
            os.path.join(proto_dir, "commtap", "v1", f"{name}.proto"),
        ])
        if rc != 0:
            sys.exit(f"protoc failed on {name}.proto")
    sys.path.insert(0, out_dir)
    return (importlib.import_module("commtap.v1.aggregator_pb2"),
            importlib.import_module("commtap.v1.aggregator_pb2_grpc"),
            importlib.import_module("commtap.v1.profile_pb2"))


def main():
    proto_dir, addr, ca, cert, key, action, *args = sys.argv[1:]
    pb, grpc_pb, profile_pb = stubs(proto_dir)
    read = lambda p: None if p == "-" else open(p, "rb").read()
    creds = grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key),
                                         certificate_chain=read(cert))
    stub = grpc_pb.AggregatorStub(grpc.secure_channel(addr, creds))
    out = {}
    try:
        if action == "list":
            resp = stub.ListJobs(pb.ListJobsRequest(), timeout=20)
            out["jobs"] = [j.job for j in resp.jobs]
        elif action == "push":
            node, pid, start, taken = args
            # An empty profile in another job: what would replace the real one.
            rank = profile_pb.RankProfile(pid=int(pid), job="stolen")
            snap = pb.ProcessSnapshot(node=node, pid=int(pid), start_ticks=int(start),
                                      taken_ns=int(taken), rank=rank)
            resp = stub.PushSnapshots(iter([pb.PushSnapshotsRequest(processes=[snap])]), timeout=20)
            out.update(accepted=resp.accepted, stale=resp.stale, refused=resp.refused)
        else:
            sys.exit(f"unknown action {action}")
        out["code"] = "OK"
    except grpc.RpcError as e:
        out["code"] = e.code().name
        out["details"] = e.details()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
