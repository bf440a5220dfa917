"""An OpenTelemetry collector's OTLP/gRPC metrics endpoint, as little of one as a test needs,
built from the official protos (`opentelemetry-proto` on PyPI) and grpcio: nothing of
commtap's own.

Usage: python3 otlp_receiver.py PORT_FILE OUT_DIR [CERT KEY CLIENT_CA]

Listens on 127.0.0.1 at a port the system picks and writes it into PORT_FILE (whole, once
listening). Each ExportMetricsServiceRequest received is written to OUT_DIR/NNNNNN.json as
protobuf's JSON mapping (`MessageToDict`), whole (written aside, then renamed). With CERT,
KEY and CLIENT_CA (PEM files): TLS with that certificate, and only clients whose
certificate CLIENT_CA signed are served.
"""

import itertools
import json
import os
import sys
import threading
from concurrent import futures

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)


def write_whole(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


class Receiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.numbers = itertools.count()
        self.lock = threading.Lock()

    def Export(self, request, context):
        with self.lock:
            n = next(self.numbers)
        write_whole(
            os.path.join(self.out_dir, f"{n:06d}.json"), json.dumps(MessageToDict(request))
        )
        return metrics_service_pb2.ExportMetricsServiceResponse()


def main():
    port_file, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Receiver(out_dir), server)
    if len(sys.argv) == 6:
        cert, key, client_ca = (open(p, "rb").read() for p in sys.argv[3:6])
        creds = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=True
        )
        port = server.add_secure_port("127.0.0.1:0", creds)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    write_whole(port_file, str(port))
    server.wait_for_termination()


if __name__ == "__main__":
    main()
