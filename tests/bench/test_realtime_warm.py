"""The realtime load client's warm-up takes the ``openai`` package's lazy first uses off the level's clock.

Each was a block of a client process's loop while all of its sessions joined (bench/realtime_loadgen.py).
Run in a fresh interpreter: the test process may have loaded these modules already.
"""

from __future__ import annotations

import subprocess
import sys

LAZY = ("openai.lib._websocket", "anyio._backends._asyncio")

SCRIPT = f"""
import asyncio, sys
import bench.realtime_loadgen as rt
lazy = {LAZY!r}
before = [m for m in lazy if m in sys.modules]
assert not before, f"already loaded on import: {{before}}"
asyncio.run(rt.warm_client("127.0.0.1:9"))  # builds the client, connects nowhere
missing = [m for m in lazy if m not in sys.modules]
assert not missing, f"not loaded by warm_client: {{missing}}"
print("warm")
"""


def test_warm_client_loads_what_the_first_connect_and_send_would() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "warm"
