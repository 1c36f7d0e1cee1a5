"""``voxstage gateway``: run the public gRPC + HTTP face in front of codec and talker replicas.

Only argparse at import time: every ``voxstage`` subcommand builds this parser, and the server modules
(FastAPI, uvicorn) are imported when the command actually runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from voxstage.config import ConfigError
from voxstage.config.cli_args import add_deploy_options, load_from_args

EXIT_INVALID = 2


def _run(args: argparse.Namespace) -> int:
    from gateway.app import GatewayServer
    from gateway.routing import parse_addresses

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_from_args(args.config, args)
        gw = config.gateway
        for flag, given, key in (("--codec", args.codec, "codec"), ("--talker", args.talker, "talker")):
            if not given and not getattr(gw, f"{key}_addresses"):
                raise ValueError(f"{flag}: required unless the deploy file sets gateway.{key}_addresses")
        # The flags win over the file's gateway.codec_addresses / talker_addresses (serve passes them).
        codecs = parse_addresses(args.codec or gw.codec_addresses or "", flag="--codec")
        talkers = parse_addresses(args.talker or gw.talker_addresses or "", flag="--talker")
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return EXIT_INVALID
    except ValueError as exc:
        print(f"voxstage gateway: {exc}", file=sys.stderr)
        return EXIT_INVALID

    async def main() -> None:
        # Built inside the loop: grpc.aio channels bind to the loop that exists when they are created.
        server = GatewayServer(
            config,
            codecs,
            talkers,
            host=args.host,
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            grace_s=args.grace,
        )
        await server.serve_forever()

    try:
        asyncio.run(main())
    except OSError as exc:  # a port already taken is the usual cause
        print(f"voxstage gateway: {exc}", file=sys.stderr)
        return 1
    return 0


def add_gateway(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "gateway",
        help="run the public gRPC/HTTP gateway",
        description="Serve voxstage.v1.Speech (gRPC) and the OpenAI-compatible HTTP API in front of codec "
        "and talker replicas. Admission limits come from the deploy file's gateway section.",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="deploy YAML file")
    parser.add_argument(
        "--codec",
        default=None,
        metavar="HOST:PORT[,..]",
        help="codec replica addresses; a name stands for every address it resolves to "
        "(default: gateway.codec_addresses)",
    )
    parser.add_argument(
        "--talker", default=None, metavar="HOST:PORT[,..]",
        help="talker replica addresses, names as for --codec (default: gateway.talker_addresses)",
    )  # fmt: skip
    parser.add_argument("--host", default=None, help="listen address (default: gateway.host)")
    parser.add_argument(
        "--grpc-port", type=int, default=None, help="public gRPC port (default: gateway.grpc_port)"
    )
    parser.add_argument("--http-port", type=int, default=None, help="HTTP port (default: gateway.http_port)")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds admitted requests get on SIGTERM")
    levels = ["debug", "info", "warning", "error"]
    parser.add_argument("--log-level", default="info", choices=levels, help="logging level (info)")
    add_deploy_options(parser)
    parser.set_defaults(handler=_run)
