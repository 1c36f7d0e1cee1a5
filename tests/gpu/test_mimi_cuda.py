"""Mimi's packed duplex tick on CUDA: encode + decode of B sessions captured in one CUDA graph replays the
eager step, frame after frame. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from services.codec.models.mimi.loader import random_init
from services.codec.models.mimi.presets import full_config, tiny_config
from services.codec.models.mimi.streaming import MimiStreamingCodec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SPF = 1920
SESSIONS = 4
FRAMES = 12
LEAVE_AT = 6  # the session on slot 1 leaves; the last one moves into its hole


class _GraphedTick:
    """One packed tick of B rows (encode a user frame, decode an agent frame) as a CUDA graph with static
    inputs and outputs."""

    def __init__(self, codec: MimiStreamingCodec, batch: int) -> None:
        self.pcm = torch.zeros(batch, SPF, device="cuda")
        self.codes = torch.zeros(batch, 8, 1, dtype=torch.int64, device="cuda")
        self.out: dict[str, torch.Tensor] = {}

        def tick() -> None:
            self.out["codes"], self.out["latent"] = codec.encode_packed_with_latent(self.pcm)
            self.out["pcm"] = codec.decode_packed(self.codes)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the capture (library handles, workspaces)
                tick()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            tick()

    def __call__(self, pcm: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.pcm.copy_(pcm)
        self.codes.copy_(codes)
        self.graph.replay()
        return tuple(self.out[k].clone() for k in ("codes", "latent", "pcm"))


def _stagger(codec: MimiStreamingCodec, gen: torch.Generator) -> None:
    """Eager packed calls in which row r takes r + 1 real frames: sessions at positions 1..SESSIONS."""
    rows = torch.arange(SESSIONS, device="cuda")
    for j in range(SESSIONS):
        lengths = (rows >= j).long()
        codec.decode_packed(torch.randint(0, 2048, (SESSIONS, 8, 1), generator=gen).cuda(), lengths)
        codec.encode_packed((torch.randn(SESSIONS, SPF, generator=gen) * 0.1).cuda(), lengths)


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_packed_tick_graph_replay_equals_eager(size: str) -> None:
    config = tiny_config() if size == "tiny" else full_config()
    mimi = random_init(config, seed=3, device="cuda")
    gen = torch.Generator().manual_seed(0)
    pcm = (torch.randn(FRAMES, SESSIONS, SPF, generator=gen) * 0.1).cuda()
    codes = torch.randint(0, 2048, (FRAMES, SESSIONS, 8, 1), generator=gen).cuda()

    eager = MimiStreamingCodec(mimi, SESSIONS + 1)
    graphed = MimiStreamingCodec(mimi, SESSIONS + 1)
    ticks: dict[int, _GraphedTick] = {
        b: _GraphedTick(graphed, b) for b in (SESSIONS, SESSIONS - 1)
    }
    graphed.reset(torch.arange(SESSIONS + 1, device="cuda"))  # warm-ups advanced the pool: start afresh
    for codec in (eager, graphed):
        _stagger(codec, torch.Generator().manual_seed(1))

    batch = SESSIONS
    for t in range(FRAMES):
        if t == LEAVE_AT:
            for codec in (eager, graphed):
                codec.move_slot(batch - 1, 1)
            batch -= 1
        e_codes, e_latent = eager.encode_packed_with_latent(pcm[t, :batch])
        e_pcm = eager.decode_packed(codes[t, :batch])
        g_codes, g_latent, g_pcm = ticks[batch](pcm[t, :batch], codes[t, :batch])
        torch.testing.assert_close(g_codes, e_codes, rtol=0, atol=0, msg=f"codes, frame {t}")
        torch.testing.assert_close(g_latent, e_latent, rtol=0, atol=1e-5, msg=f"latent, frame {t}")
        torch.testing.assert_close(g_pcm, e_pcm, rtol=0, atol=1e-6, msg=f"pcm, frame {t}")
    for direction in ("encode", "decode"):
        positions = [graphed.position(s, direction) for s in range(batch)]
        assert positions == [eager.position(s, direction) for s in range(batch)]  # type: ignore[arg-type]
    # Row r started at position r + 1; slot 1 now carries the session that started on the last slot.
    assert [eager.position(s, "decode") for s in range(batch)] == [1 + FRAMES, SESSIONS + FRAMES, 3 + FRAMES]


def test_codebook_search_is_cdist_on_cuda() -> None:
    """On the device too, the precomputed search tables pick exactly torch.cdist's codes."""
    from tests.unit.codec.test_mimi_packed import _cdist_encode

    mimi = random_init(full_config(), seed=5, device="cuda")
    q = mimi.quantizer
    gen = torch.Generator().manual_seed(2)
    for frames in (1, 3, 40):
        latent = (torch.randn(4, 512, frames, generator=gen) * 2).cuda()
        latent[0, :, 0] = 0  # a silent frame
        with torch.inference_mode():
            assert torch.equal(q.encode(latent), _cdist_encode(q, latent)), f"{frames} frames"
