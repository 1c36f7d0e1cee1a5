"""docs/api.md states the duplex formats, limits and events that the code enforces (one source of truth:
``voxstage.duplex_audio`` and ``gateway/realtime/events.py``)."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.duplex.settings import UNSUPPORTED
from voxstage import metrics
from voxstage.duplex_audio import FORMATS, INPUT_BUFFER_SECONDS, MAX_APPEND_BYTES, MAX_EVENT_BYTES

API = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()
SECTION = API[API.index("## Full-duplex sessions") : API.index("## Errors")]


def test_every_format_has_its_row() -> None:
    rows = [line for line in SECTION.splitlines() if line.startswith('| `{"type": "audio/')]
    assert len(rows) == len(FORMATS)
    for fmt, row in zip(FORMATS, rows, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert f'"{fmt.realtime_type}"' in cells[0] and cells[2] == f"`{fmt.name}`"
        assert cells[3] == f"{fmt.sample_rate} Hz" and cells[4].startswith(str(fmt.bytes_per_sample))


def test_limits_and_events_match_the_code() -> None:
    assert f"{MAX_APPEND_BYTES} bytes" in SECTION and f"{MAX_EVENT_BYTES} bytes" in SECTION
    assert f"buffer of {INPUT_BUFFER_SECONDS:g} s" in SECTION
    for event in UNSUPPORTED:
        assert f"`{event}`" in SECTION, event


def test_named_metrics_exist() -> None:
    names = set(re.findall(r"`(voxstage_duplex_\w+?)(?:\{|`)", API))
    exported = {m.name + ("_total" if m.type == "counter" else "") for m in metrics.REGISTRY.collect()}
    assert names and names <= exported, names - exported
