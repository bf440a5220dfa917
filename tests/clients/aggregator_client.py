"""A gRPC client of commtap's Aggregator service that nobody on the project wrote (stubs
generated from proto/commtap/v1 with grpcio-tools at run time), for the attack tests: it
speaks as whatever certificate it is given, or none.

Usage: aggregator_client.py PROTO_DIR HOST:PORT CA CERT|- KEY|- ACTION [ARGS]
  ACTION list                          ListJobs
  ACTION push NODE PID START TAKEN     push one snapshot of process (NODE, PID, START)
                                       taken at TAKEN (the node's monotonic ns): an empty
                                       profile in job "stolen"
  ACTION push-many NODE N JOB          push N ranks of job JOB on NODE (pids 1..N), rank
                                       i with i+1 MPI_Allreduce calls of 8 bytes each and a
                                       600-byte command line, in messages of 1,000 snapshots
CA "-" speaks plaintext.
Prints one JSON object: {"code": "OK" | a gRPC status name, ...the response}.
"""
import json
import sys

import grpc

import commtap_stubs


def main():
    proto_dir, addr, ca, cert, key, action, *args = sys.argv[1:]
    pb, grpc_pb, profile_pb = commtap_stubs.generate(proto_dir, "aggregator")
    read = lambda p: None if p == "-" else open(p, "rb").read()
    if ca == "-":
        channel = grpc.insecure_channel(addr)
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key),
                                             certificate_chain=read(cert))
        channel = grpc.secure_channel(addr, creds)
    stub = grpc_pb.AggregatorStub(channel)
    out = {}
    try:
        if action == "list":
            resp = stub.ListJobs(pb.ListJobsRequest(), timeout=20)
            out["jobs"] = [j.job for j in resp.jobs]
        elif action == "push":
            node, pid, start, taken = args
            # An empty profile in another job: what would replace the real one.
            rank = profile_pb.RankProfile(pid=int(pid), job="stolen")
            # This machine's boot id: the daemon's processes are keyed by it too.
            boot_id = open("/proc/sys/kernel/random/boot_id").read().strip()
            snap = pb.ProcessSnapshot(node=node, pid=int(pid), start_ticks=int(start),
                                      taken_ns=int(taken), rank=rank, boot_id=boot_id)
            resp = stub.PushSnapshots(iter([pb.PushSnapshotsRequest(processes=[snap])]), timeout=20)
            out.update(accepted=resp.accepted, stale=resp.stale, refused=resp.refused)
        elif action == "push-many":
            node, n, job = args[0], int(args[1]), args[2]

            def snapshot(i):
                calls = i + 1
                totals = profile_pb.Totals(calls=calls, bytes=8 * calls, time_ns=1000 * calls)
                routine = profile_pb.RoutineStats(name="MPI_Allreduce", totals=totals,
                                                  sizes=[profile_pb.SizeBucket(bucket=2, totals=totals)])
                rank = profile_pb.RankProfile(rank=i, rank_source=profile_pb.RANK_SOURCE_LAUNCHER, pid=i + 1, host=node, job=job,
                                              cmdline=f"./app --rank {i} " + "x" * 600, routines=[routine],
                                              exited=True)
                return pb.ProcessSnapshot(node=node, pid=i + 1, start_ticks=1000 + i, taken_ns=1_000_000,
                                          rank=rank)

            batches = [pb.PushSnapshotsRequest(processes=[snapshot(i) for i in range(at, min(at + 1000, n))])
                       for at in range(0, n, 1000)]
            resp = stub.PushSnapshots(iter(batches), timeout=120)
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
