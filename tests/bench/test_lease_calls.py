"""bench/results/next_lease/calls.sh, the next device lease's calls: the shell parses, and every deploy
override it passes is a key some seed deploy file takes, so a renamed or dropped key fails here rather than
on the lease."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from voxstage.config import ConfigError, load_deploy_config

REPO = Path(__file__).resolve().parents[2]
CALLS = REPO / "bench" / "results" / "next_lease" / "calls.sh"
SEEDS = [REPO / "deploy" / f"{name}.yaml" for name in ("qwen3_tts", "audio8_tts", "personaplex")]


def overrides() -> list[str]:
    text = CALLS.read_text()
    values = re.findall(r"--set\s+(\"[^\"]*\"|'[^']*'|[^\s)]+)", text)
    named = dict(re.findall(r"^(\w+)='([^']*)'$", text, flags=re.MULTILINE))  # S='...' and the like
    out = []
    for value in values:
        word = shlex.split(value)[0]
        out.append(named.get(word.removeprefix("$"), word))
    return out


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(CALLS)], check=True)


@pytest.mark.parametrize("override", sorted(set(overrides())))
def test_every_override_is_taken_by_a_seed(override: str) -> None:
    errors = []
    for seed in SEEDS:
        try:
            load_deploy_config(seed, platform="cuda", overrides=[override])
            return
        except ConfigError as exc:
            errors.append(f"{seed.name}: {exc}")
    pytest.fail(f"{override}: no seed takes it:\n" + "\n".join(errors))
