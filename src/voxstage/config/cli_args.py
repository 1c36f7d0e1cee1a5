"""The ``--platform`` / ``--set`` options every deploy-file subcommand shares (validate-config, "
"serve, ...)."""

from __future__ import annotations

import argparse
from pathlib import Path

from voxstage.config.deploy import PLATFORMS, DeployConfig
from voxstage.config.loader import load_deploy_config


def add_deploy_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--platform",
        choices=PLATFORMS,
        default=None,
        help="apply platforms.<name> from the file (default: cuda when a GPU is visible, else cpu)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key after the platform overlay, e.g. --set stages.0.max_num_seqs=4 "
        "(stages are addressed by stage_id; VALUE is parsed as YAML; repeatable)",
    )


def load_from_args(path: str | Path, args: argparse.Namespace) -> DeployConfig:
    """``load_deploy_config`` with the options ``add_deploy_options`` registered."""
    return load_deploy_config(path, platform=args.platform, overrides=args.overrides)
