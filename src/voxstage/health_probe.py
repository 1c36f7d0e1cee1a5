"""Container healthcheck: ``python -m voxstage.health_probe --addr host:port``; exit 0 only when SERVING.

A compose/k8s healthcheck needs a probe inside the image; this avoids downloading grpc_health_probe. It
probes the gateway's public port (``--tls-root`` when that serves TLS) and the stages' ports (the
``--link-*`` files when the stage links run mutual TLS: a stage then refuses a probe without a certificate).
"""

from __future__ import annotations

import argparse
import ssl
import sys
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from voxstage.stage.tls import LinkTls, LinkTlsError, add_link_options, link_from_args, sync_channel


def check(
    addr: str,
    service: str = "",
    timeout: float = 3.0,
    *,
    root_certificates: bytes | None = None,
    tls: LinkTls | None = None,
) -> bool:
    """SERVING or not; ``root_certificates`` (PEM) probes a TLS port (the gateway with ``tls_cert_file``),
    ``tls`` a stage whose links run mutual TLS."""
    if root_certificates is not None:
        channel = grpc.secure_channel(addr, grpc.ssl_channel_credentials(root_certificates))
    else:
        channel = sync_channel(addr, (), tls)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def check_https(url: str, timeout: float = 3.0) -> bool:
    """HTTP 200 from ``url`` over TLS, without checking the certificate: ``voxstage serve`` probing the
    gateway it started, whose certificate names the public host (or is signed by a CA the launcher does not
    hold), not 127.0.0.1. Only readiness is read; nothing is sent but the GET."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as reply:  # noqa: S310 - https only
            return bool(reply.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--addr", required=True, help="host:port of a voxstage gRPC server")
    parser.add_argument("--service", default="", help="fully-qualified service name ('' = whole server)")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument(
        "--tls-root", default=None, metavar="PEM", help="probe over TLS, trusting this certificate file"
    )
    add_link_options(parser, client=True, what="the probed stage")
    args = parser.parse_args(argv)
    try:
        link = link_from_args(args)
    except LinkTlsError as exc:
        parser.error(str(exc))  # exits 2: a broken probe must not read as an unhealthy stage
    if link is not None and args.tls_root:
        parser.error("--tls-root probes the gateway's public port, --link-* a stage's: give one of them")
    roots = None
    if args.tls_root:
        with open(args.tls_root, "rb") as f:
            roots = f.read()
    ok = check(args.addr, args.service, args.timeout, root_certificates=roots, tls=link)
    print("SERVING" if ok else "NOT_SERVING")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
