"""What the bench smoke tests share: one of a family's bench scripts run as its own process, as a user runs
it, and the JSON it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_family_bench(family: str, script: str, out: Path, *args: str, timeout: float) -> Any:
    cmd = [sys.executable, str(ROOT / "bench" / "families" / family / script), "--out", str(out), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=timeout, env=env)
    return json.loads(out.read_text())
