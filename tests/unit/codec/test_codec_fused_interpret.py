"""The text-to-speech codecs' fused transformer paths (residual add + RMSNorm and SwiGLU's SiLU-product as
Triton kernels, what CUDA runs) equal their module paths on CPU through the Triton interpreter, streaming
(and, for Qwen3-TTS, offline).

Runs only where Triton imports (``TRITON_INTERPRET=1 PYTHONPATH=<triton site>``); CI without Triton skips
(the GPU's own check is ``tests/gpu/test_codec_fused.py``). The kernels are made to apply to CPU tensors by
swapping ``fused._kernels_for``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from voxstage.nn import fused

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU launches need the Triton interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

from services.codec.models.audio8_tts.config import Audio8CodecConfig  # noqa: E402
from services.codec.models.audio8_tts.loader import random_init as random_audio8  # noqa: E402
from services.codec.models.audio8_tts.streaming import Audio8StreamingDecoder  # noqa: E402
from services.codec.models.qwen3_tts.loader import random_init  # noqa: E402
from services.codec.models.qwen3_tts.presets import decoder_preset  # noqa: E402
from services.codec.models.qwen3_tts.streaming import StreamingDecoder  # noqa: E402
from tests.unit.codec.codec_kit import random_codes  # noqa: E402
from voxstage.nn import triton_kernels  # noqa: E402  (needs Triton)


@pytest.fixture(autouse=True)
def _kernels_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(fused, "_kernels_for", lambda t: triton_kernels if fused.enabled() else None)
    yield
    fused.set_triton(True)


def _both(fn: object) -> tuple[torch.Tensor, torch.Tensor]:
    outs = []
    for enabled in (True, False):
        fused.set_triton(enabled)
        with torch.inference_mode():
            outs.append(fn())  # type: ignore[operator]
    fused.set_triton(True)
    return outs[0], outs[1]


def test_the_fused_stack_equals_the_module_path_streaming_and_offline() -> None:
    decoder = random_init(decoder_preset("qwen3-tts-tiny"), 0)
    layer = decoder.pre_transformer.layers[0]
    assert layer.mlp.gate_up_weight() is not None  # placed: the fused path's one gate/up GEMM
    codes = random_codes(3, 24, batch=2)
    pool = StreamingDecoder(decoder, max_streams=4)
    slots = torch.tensor([1, 3])

    def streamed() -> torch.Tensor:
        pool.reset(slots)
        return torch.cat([pool.decode(codes[..., i : i + 6], slots) for i in range(0, 24, 6)], -1)

    on, off = _both(lambda: decoder(codes))
    assert not torch.equal(on, off)  # the kernels really ran (they round differently)
    torch.testing.assert_close(on, off, rtol=0, atol=1e-4)
    on, off = _both(streamed)
    torch.testing.assert_close(on, off, rtol=0, atol=1e-4)


def test_the_audio8_codecs_fused_stack_equals_the_module_path() -> None:
    codec = random_audio8(Audio8CodecConfig.tiny(), 0)
    pool = Audio8StreamingDecoder(codec, max_streams=4)
    codes = torch.randint(0, 1024, (2, 10, 12), generator=torch.Generator().manual_seed(2))
    slots = torch.tensor([0, 2])

    def streamed() -> torch.Tensor:
        pool.reset(slots)
        return torch.cat([pool.decode(codes[..., i : i + 4], slots) for i in range(0, 12, 4)], -1)

    on, off = _both(streamed)
    assert not torch.equal(on, off)  # the kernels really ran
    torch.testing.assert_close(on, off, rtol=0, atol=1e-4)
