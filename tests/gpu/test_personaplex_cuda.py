"""PersonaPlex on CUDA: the graphed frame equals the eager one, and fp32 CUDA keeps golden parity with moshi.
Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.golden_personaplex import fixture_model, load_case
from tests.unit.talker.test_personaplex_adapter import Session, _sessions, drive
from tests.unit.talker.test_personaplex_golden import _prompt, run_session
from voxstage.talker.models.personaplex.adapter import PersonaPlexAdapter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_fp32_cuda_stream_equals_moshi() -> None:
    case = load_case("prompt_voice")
    model = fixture_model(case, device="cuda")
    adapter = PersonaPlexAdapter(model)
    adapter.allocate(1, model.config.context)
    m = case["prompt_frames"]
    _, made, _, _ = run_session(adapter, _prompt(case, model), case["user"], m - 1)
    np.testing.assert_array_equal(made, case["made"][m - 1 :])


@pytest.mark.parametrize("capture_all", [False, True])
def test_graphed_sessions_equal_eager(capture_all: bool) -> None:
    """Sampled sessions joining and leaving: every session's tokens equal under graphs and eager."""
    model = fixture_model(load_case("prompt_voice"), device="cuda")
    results = []
    for graphs in (False, True):
        adapter = PersonaPlexAdapter(model)
        adapter.allocate(4, model.config.context)
        if graphs:
            adapter.enable_cuda_graphs()
            if capture_all:
                assert adapter.capture_all_graphs() == len(adapter.graph_keys())
        sessions: list[Session] = _sessions(model)
        results.append(drive(adapter, sessions, ticks=20))
    for name in results[0]:
        np.testing.assert_array_equal(np.stack(results[0][name]), np.stack(results[1][name]), err_msg=name)
