"""bench/results/next_lease/calls.sh, the next device lease's calls: the shell parses, and every deploy
override it passes is a key some seed deploy file takes, so a renamed or dropped key fails here rather than
on the lease."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
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


def test_the_pageable_hook_replaces_the_codec_launchs_copy() -> None:
    """Call ``g``'s A/B arm: with ``bench/pageable_hook`` first on the path, the codec engine's ``to_device``
    is the pageable copy (the hook's, not ``voxstage.host_copy``'s)."""
    code = "import services.codec.engine as e; print(e.to_device.__module__, e.to_device.__name__)"
    env = {"PYTHONPATH": f"{REPO / 'bench' / 'pageable_hook'}:{REPO}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sitecustomize", "pageable_to_device"]
    assert "copies from pageable memory" in out.stderr
