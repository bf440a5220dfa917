"""Python stubs of commtap's API, generated at run time from proto/commtap/v1 with
grpcio-tools (what any client nobody on the project wrote would do), shared by the test
clients beside this file."""
import importlib
import os
import sys
import tempfile

from grpc_tools import protoc


def generate(proto_dir, service):
    """Generates profile.proto, node.proto (the aggregator's imports it) and SERVICE.proto
    (node, aggregator) into a temporary package; returns (SERVICE_pb2, SERVICE_pb2_grpc,
    profile_pb2)."""
    out_dir = tempfile.mkdtemp()
    # Make commtap/ and commtap/v1/ importable packages.
    os.makedirs(os.path.join(out_dir, "commtap", "v1"))
    for d in ("commtap", os.path.join("commtap", "v1")):
        open(os.path.join(out_dir, d, "__init__.py"), "w").close()
    for name in dict.fromkeys(("profile", "node", service)):
        rc = protoc.main([
            "protoc", f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
            os.path.join(proto_dir, "commtap", "v1", f"{name}.proto"),
        ])
        if rc != 0:
            sys.exit(f"protoc failed on {name}.proto")
    sys.path.insert(0, out_dir)
    return (importlib.import_module(f"commtap.v1.{service}_pb2"),
            importlib.import_module(f"commtap.v1.{service}_pb2_grpc"),
            importlib.import_module("commtap.v1.profile_pb2"))
