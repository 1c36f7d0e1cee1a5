"""``voxstage.lifetime``: a launched stage arms its own parent-death signal (checked in child processes,
since arming it changes the process that runs it; the launcher-killed case end to end is in
``tests/integration/test_serve_supervision.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from voxstage.lifetime import PARENT_ENV, child_env, die_with_launcher

ARM = "from voxstage.lifetime import die_with_launcher; print(die_with_launcher(), flush=True)"


def _run(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV} | env_extra
    return subprocess.run([sys.executable, "-c", ARM], env=env, capture_output=True, text=True, timeout=60)


def test_the_launcher_names_itself_in_its_childrens_environment() -> None:
    env = child_env({"A": "1"})
    assert env == {"A": "1", PARENT_ENV: str(os.getpid())}


def test_nothing_is_armed_without_a_launcher() -> None:
    assert die_with_launcher({}) is False
    assert _run({}).stdout.strip() == "False"


def test_a_child_of_its_launcher_arms_the_signal() -> None:
    done = _run({PARENT_ENV: str(os.getpid())})  # this test process is the child's parent
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


def test_a_child_whose_launcher_is_already_gone_stops_at_once() -> None:
    done = _run({PARENT_ENV: "1"})  # not our parent: as if the launcher died before the child armed it
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr)
