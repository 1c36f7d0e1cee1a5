"""Container healthcheck: ``python -m voxstage.health_probe --addr host:port``; exit 0 only when SERVING.

A compose/k8s healthcheck needs a probe inside the image; this avoids downloading grpc_health_probe.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(
    addr: str, service: str = "", timeout: float = 3.0, *, root_certificates: bytes | None = None
) -> bool:
    """SERVING or not; ``root_certificates`` (PEM) probes a TLS port (the gateway with ``tls_cert_file``)."""
    channel = (
        grpc.insecure_channel(addr)
        if root_certificates is None
        else grpc.secure_channel(addr, grpc.ssl_channel_credentials(root_certificates))
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--addr", required=True, help="host:port of a voxstage gRPC server")
    parser.add_argument("--service", default="", help="fully-qualified service name ('' = whole server)")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument(
        "--tls-root", default=None, metavar="PEM", help="probe over TLS, trusting this certificate file"
    )
    args = parser.parse_args(argv)
    roots = None
    if args.tls_root:
        with open(args.tls_root, "rb") as f:
            roots = f.read()
    ok = check(args.addr, args.service, args.timeout, root_certificates=roots)
    print("SERVING" if ok else "NOT_SERVING")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
