"""The ``voxstage`` command line.

Each subcommand lives behind one ``_add_<name>(subparsers)`` function that builds its parser and sets
``handler`` (a function ``Namespace -> int``); ``SUBCOMMANDS`` lists them. A new subcommand in its own module
only needs its registrar appended there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gateway.cli import add_gateway
from services.codec.main import register as add_codec
from services.talker.main import register as add_talker
from voxstage import __version__
from voxstage.client.cli import add_say
from voxstage.client.talk import add_talk
from voxstage.client.voices_cli import add_voices
from voxstage.config import ConfigError
from voxstage.config.cli_args import add_deploy_options, load_from_args
from voxstage.config.describe import describe, summary
from voxstage.launch.demo import register as add_demo
from voxstage.launch.serve import register as add_serve

# Invalid input (bad config, bad usage); argparse uses the same code for usage errors.
EXIT_INVALID = 2

Subparsers = argparse._SubParsersAction  # argparse exposes no public name for the add_subparsers() result
Registrar = Callable[[Subparsers], None]


def _validate_config(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            config = load_from_args(path, args)
        except ConfigError as exc:
            failed = True
            for issue in exc.issues:
                print(issue, file=sys.stderr)
            continue
        print(f"{config.source}: OK: {summary(config)}")
        for warning in config.warnings:
            print(warning, file=sys.stderr)
        if args.describe:
            print(describe(config))
    return EXIT_INVALID if failed else 0


def _add_validate_config(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "validate-config",
        help="check deploy files without starting anything",
        description="Validate deploy YAML files: schema, stage graph, device budgets and platform overlays. "
        "Prints one summary line per valid file; exits 2 and lists every problem otherwise.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="deploy YAML file(s)")
    add_deploy_options(parser)
    parser.add_argument(
        "--describe", action="store_true", help="also print the effective config of each valid file"
    )
    parser.set_defaults(handler=_validate_config)


SUBCOMMANDS: tuple[Registrar, ...] = (
    _add_validate_config, add_talker, add_codec, add_serve, add_gateway, add_say, add_talk, add_voices,
    add_demo,
)  # fmt: skip


def build_parser(registrars: Sequence[Registrar] = SUBCOMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voxstage", description="Serve streaming speech models as gRPC stages."
    )
    parser.add_argument("--version", action="version", version=f"voxstage {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in registrars:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        # --help/--version exit 0 and usage errors 2; returning the code keeps SystemExit away from callers.
        return exc.code if isinstance(exc.code, int) else EXIT_INVALID
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


def console_main() -> None:
    """The ``voxstage`` console script: ``main`` ended as a process ends (voxstage.lifetime.exit_process)."""
    from voxstage.lifetime import exit_process

    exit_process(main())


if __name__ == "__main__":
    console_main()
