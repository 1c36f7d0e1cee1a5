"""``bench/families/qwen3_tts/codec_precision.py`` runs on the golden decoder and reports a real, non-zero
bf16 error."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.families.qwen3_tts import codec_precision
from tests.golden import fixture_dir


def test_codec_precision_reports_bf16_error_on_the_golden_decoder(tmp_path: Path) -> None:
    if not (fixture_dir() / "cases.json").is_file():
        pytest.skip("golden fixtures not generated")
    out = tmp_path / "p.json"
    assert (
        codec_precision.main(["--out", str(out), "--sources", "golden", "--frames", "30", "--streams", "1"])
        == 0
    )
    (rec,) = json.loads(out.read_text())["records"]
    assert rec["source"] == "golden" and rec["frames"] == 30
    # bf16 is not fp32: a zero error would mean both runs took the same precision.
    assert 0 < rec["rel_rms"] < 1 and math.isfinite(rec["snr_db"]) and 0.5 < rec["cosine"] < 1
