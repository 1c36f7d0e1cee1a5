"""Stacks kept for the whole session, shared by the modules that use them (tests/integration/servekit.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.deploykit import ComposeStack, start_compose_stack
from tests.integration.servekit import AUDIO8_FRAMES, BASE_FRAMES, DUPLEX_SEND_TIMEOUT_S, Served, serve_stack
from tests.integration.stagekit import ROOT, SEED_DEPLOY


@pytest.fixture(scope="session")
def audio8_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serve_stack(
        tmp_path_factory, "audio8", ROOT / "deploy" / "audio8_tts.yaml", "audio8-tts-tiny",
        [f"stages.0.default_sampling_params.max_tokens={AUDIO8_FRAMES}"],
    )  # fmt: skip


@pytest.fixture(scope="session")
def personaplex_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serve_stack(
        tmp_path_factory, "duplex", ROOT / "deploy" / "personaplex.yaml", "personaplex-tiny",
        ["duplex_session.max_sessions=4", "gateway.duplex_idle_timeout_s=2",
         f"gateway.duplex_send_timeout_s={DUPLEX_SEND_TIMEOUT_S}"],
    )  # fmt: skip


@pytest.fixture(scope="session")
def qwen_base_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Qwen3-TTS voice clone (base): the family whose talker crashed on text under the limit (issue 26)."""
    yield from serve_stack(
        tmp_path_factory, "qwen-base", SEED_DEPLOY, "qwen3-tts-tiny-base",
        [f"stages.0.default_sampling_params.max_tokens={BASE_FRAMES}"],
    )  # fmt: skip


@pytest.fixture(scope="session")
def compose_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    """The three services as docker-compose.yml runs them (tests/integration/deploykit.py)."""
    deployed = start_compose_stack(tmp_path_factory.mktemp("compose"))
    try:
        yield deployed
    finally:
        codes = deployed.stop()
        assert codes == {"gateway": 0, "codec": 0, "talker": 0}, codes
