"""``voxstage validate-config`` run as a real subprocess: exit codes, stdout summaries, stderr messages."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from voxstage.launch.cli import Subparsers, build_parser, main

REPO = Path(__file__).resolve().parents[3]
SEEDS = [f"deploy/{name}.yaml" for name in ("qwen3_tts", "audio8_tts", "personaplex")]


def run_cli(*args: str, executable: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = executable or [sys.executable, "-m", "voxstage"]
    return subprocess.run(
        [*command, *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def test_valid_seeds_exit_zero_with_one_line_each() -> None:
    result = run_cli("validate-config", *SEEDS, "--platform", "cuda")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(": OK: ")[0] for line in lines] == SEEDS
    assert "timeouts 30 s first chunk / 3 s stall" in lines[0]
    # Warnings go to stderr and do not fail the run; the seeds have one (Audio8's single codec stream).
    (warning,) = result.stderr.splitlines()
    assert warning.startswith(f"{SEEDS[1]}: stages[1].max_num_seqs: warning: is 1, fewer codec streams")


def test_invalid_file_exits_two_and_still_checks_the_others(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / SEEDS[1]).read_text().replace("    max_num_seqs: 4\n", "    max_num_seqs: ten\n"))
    result = run_cli("validate-config", str(bad), SEEDS[0], "--platform", "cpu")
    assert result.returncode == 2
    assert result.stdout.startswith(f"{SEEDS[0]}: OK: ")
    assert (
        f"{bad}: stages[0].max_num_seqs: Input should be a valid integer, got 'ten' (line " in result.stderr
    )
    assert "Traceback" not in result.stderr and "pydantic" not in result.stderr


def test_overrides_and_describe() -> None:
    result = run_cli(
        "validate-config", SEEDS[2], "--platform", "npu", "--set", "stages.0.max_num_seqs=3", "--describe"
    )
    assert result.returncode == 0, result.stderr
    assert "talker stage 0: 3 slots" in result.stdout
    assert "# --set stages.0.max_num_seqs=3" in result.stdout and "platforms.npu applied" in result.stdout

    bad = run_cli("validate-config", SEEDS[0], "--set", "stages.0.max_num_seqs=many")
    assert bad.returncode == 2
    assert "stages[0].max_num_seqs: Input should be a valid integer, got 'many' (from --set" in bad.stderr


def test_console_script_matches_module_entry() -> None:
    script = Path(sys.executable).with_name("voxstage")
    if not script.exists():
        pytest.skip("the voxstage console script is not installed next to this interpreter")
    result = run_cli("validate-config", SEEDS[0], executable=[str(script)])
    assert result.returncode == 0 and result.stdout.startswith(f"{SEEDS[0]}: OK: ")


def test_usage_errors_exit_two_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate-config"]) == 2
    assert "FILE" in capsys.readouterr().err
    assert main(["validate-config", SEEDS[0], "--platform", "tpu"]) == 2
    assert main(["--version"]) == 0


def test_subcommands_register_through_small_functions() -> None:
    calls: list[str] = []

    def _demo(args: argparse.Namespace) -> int:
        calls.append(args.command)
        return 0

    def _add_demo(subparsers: Subparsers) -> None:
        subparsers.add_parser("demo").set_defaults(handler=_demo)

    args = build_parser([_add_demo]).parse_args(["demo"])
    assert args.handler(args) == 0 and calls == ["demo"]


def test_every_option_of_every_subcommand_says_what_it_does() -> None:
    # Issue 29: --talker-metrics-port and --codec-metrics-port showed in `serve --help` with no word on them.
    parser = build_parser()
    (subs,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, sub in subs.choices.items()
        for action in sub._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert silent == []
