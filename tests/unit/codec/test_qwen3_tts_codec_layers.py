"""Qwen3-TTS codec layers: SnakeBeta's cached scales give exactly the formula's output and follow the
weights when they change."""

from __future__ import annotations

import torch

from services.codec.models.qwen3_tts.layers import SnakeBeta


def formula(act: SnakeBeta, x: torch.Tensor) -> torch.Tensor:
    """The reference expression, evaluated afresh (what every call computed before the cache)."""
    wide = torch.promote_types(x.dtype, torch.float32)
    alpha = act.alpha.to(wide).exp()[None, :, None]
    beta = act.beta.to(wide).exp()[None, :, None]
    xw = x.to(wide)
    return (xw + (1.0 / (beta + 1e-9)) * torch.sin(xw * alpha).pow(2)).to(x.dtype)


@torch.inference_mode()
def test_cached_scales_equal_the_formula_and_follow_new_weights() -> None:
    gen = torch.Generator().manual_seed(0)
    act = SnakeBeta(8).requires_grad_(False)
    x = torch.randn(3, 8, 50, generator=gen) * 4
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        assert torch.equal(act(x.to(dtype)), formula(act, x.to(dtype)))
    before = act(x)
    # In place, as load_state_dict writes weights: the cache must notice.
    act.load_state_dict({"alpha": torch.randn(8, generator=gen), "beta": torch.randn(8, generator=gen)})
    after = act(x)
    assert not torch.equal(after, before)
    assert torch.equal(after, formula(act, x))
    act.to(torch.float64)  # new parameter tensors
    assert torch.equal(act(x.double()), formula(act, x.double()))


def test_training_keeps_gradients_to_the_parameters() -> None:
    act = SnakeBeta(4)
    act(torch.randn(2, 4, 10)).sum().backward()
    assert act.alpha.grad is not None and act.beta.grad is not None
    assert act.beta.grad.abs().sum() > 0
