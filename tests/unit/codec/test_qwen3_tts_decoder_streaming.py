"""Stateful streaming decode of the Qwen3-TTS 12 Hz codec equals the single-pass decode (fp32, 1e-5).

400 frames is 5.5x the attention window, so every layer's K/V history wraps many times; chunk sizes 1, 5, 25
and a seeded random schedule cover chunks smaller than, equal to and larger than every conv history.
"""

from __future__ import annotations

import random

import pytest
import torch

from services.codec.models.qwen3_tts.decoder import Qwen3TokenizerDecoder
from services.codec.models.qwen3_tts.loader import random_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder, state_bytes_per_stream
from tests.unit.codec.codec_kit import offline_reference, random_codes

TOL = 1e-5
FRAMES = 400
SPF = 1920


@pytest.fixture(scope="module")
def model() -> Qwen3TokenizerDecoder:
    return random_init(decoder_preset("qwen3-tts-tiny"), seed=0)


_codes = random_codes


@pytest.fixture(scope="module")
def long_case(model: Qwen3TokenizerDecoder) -> tuple[torch.Tensor, torch.Tensor]:
    codes = _codes(1, FRAMES)
    return codes, offline_reference(model, codes, SPF, limit=1.0)  # clamp(-1, 1) output


def _stream(dec: StreamingDecoder, codes: torch.Tensor, sizes: list[int], slot: int = 0) -> torch.Tensor:
    out, start = [], 0
    for size in sizes:
        out.append(dec.decode(codes[..., start : start + size], torch.tensor([slot])))
        start += size
    assert start == codes.shape[-1]
    return torch.cat(out, dim=-1)


def _random_sizes(seed: int, total: int, low: int = 1, high: int = 40) -> list[int]:
    rng = random.Random(seed)
    sizes: list[int] = []
    while sum(sizes) < total:
        sizes.append(min(rng.randint(low, high), total - sum(sizes)))
    return sizes


@pytest.mark.parametrize("chunk", [1, 5, 25, "random"])
def test_chunked_stream_equals_single_pass(
    model: Qwen3TokenizerDecoder, long_case: tuple[torch.Tensor, torch.Tensor], chunk: int | str
) -> None:
    codes, offline = long_case
    sizes = _random_sizes(7, FRAMES) if chunk == "random" else [int(chunk)] * (FRAMES // int(chunk))
    dec = StreamingDecoder(model, max_streams=3)
    streamed = _stream(dec, codes, sizes, slot=2)
    assert streamed.shape == offline.shape
    err = (streamed - offline).abs().max().item()
    assert err <= TOL, f"chunk={chunk}: max abs error {err:.3e}"
    assert dec.position(2) == FRAMES and dec.position(0) == 0


def test_streams_at_different_positions_share_a_batch(model: Qwen3TokenizerDecoder) -> None:
    """Streams that started at different ticks, with different chunk sizes padded into one (B, T) bucket."""
    lengths = {0: 110, 1: 80, 2: 60}
    first_tick = {0: 0, 1: 3, 2: 9}
    codes = {s: _codes(10 + s, n) for s, n in lengths.items()}
    with torch.inference_mode():
        offline = {s: model(c) for s, c in codes.items()}
    slots = {0: 4, 1: 0, 2: 2}  # stream -> pool slot, deliberately not in order
    dec = StreamingDecoder(model, max_streams=5)
    rng = random.Random(3)
    done = dict.fromkeys(lengths, 0)
    pieces: dict[int, list[torch.Tensor]] = {s: [] for s in lengths}
    tick = 0
    while any(done[s] < lengths[s] for s in lengths):
        active = [s for s in lengths if first_tick[s] <= tick and done[s] < lengths[s]]
        tick += 1
        if not active:
            continue
        take = {s: min(rng.randint(1, 12), lengths[s] - done[s]) for s in active}
        t = max(take.values())
        batch = torch.zeros(len(active), 16, t, dtype=torch.int64)
        for row, s in enumerate(active):
            batch[row, :, : take[s]] = codes[s][0, :, done[s] : done[s] + take[s]]
            # Padding codes are arbitrary valid ids: they must not leak into the stream's state.
            batch[row, :, take[s] :] = 7
        wav = dec.decode(
            batch,
            torch.tensor([slots[s] for s in active]),
            torch.tensor([take[s] for s in active]),
        )
        assert wav.shape == (len(active), t * SPF)
        for row, s in enumerate(active):
            pieces[s].append(wav[row, : take[s] * SPF])
            done[s] += take[s]
    for s in lengths:
        streamed = torch.cat(pieces[s])
        err = (streamed - offline[s][0]).abs().max().item()
        assert err <= TOL, f"stream {s}: max abs error {err:.3e}"
        assert dec.position(slots[s]) == lengths[s]


def test_reset_slot_reproduces_fresh_stream(model: Qwen3TokenizerDecoder) -> None:
    first, second = _codes(20, 80), _codes(21, 60)
    with torch.inference_mode():
        offline = model(second)
    dec = StreamingDecoder(model, max_streams=2)
    _stream(dec, first, [16] * 5, slot=1)
    neighbour = _stream(dec, first[..., :40], [20, 20], slot=0)
    dec.reset(torch.tensor([1]))
    assert dec.position(1) == 0 and dec.position(0) == 40
    reused = _stream(dec, second, [7] * 8 + [4], slot=1)
    assert (reused - offline).abs().max().item() <= TOL
    # Resetting slot 1 must not disturb slot 0: continuing it still matches its own offline decode.
    rest = _stream(dec, first[..., 40:], [40], slot=0)
    with torch.inference_mode():
        first_offline = model(first)
    assert (torch.cat([neighbour, rest], -1) - first_offline).abs().max().item() <= TOL


def test_without_state_a_chunk_boundary_is_audible(model: Qwen3TokenizerDecoder) -> None:
    """Guards the test itself: resetting between chunks (no history) must break equality badly."""
    codes = _codes(30, 60)
    with torch.inference_mode():
        offline = model(codes)
    dec = StreamingDecoder(model, max_streams=1)
    head = dec.decode(codes[..., :30], torch.tensor([0]))
    dec.reset(torch.tensor([0]))
    tail = dec.decode(codes[..., 30:], torch.tensor([0]))
    assert (torch.cat([head, tail], -1) - offline).abs().max().item() > 100 * TOL


def test_state_size_and_pool_layout(model: Qwen3TokenizerDecoder) -> None:
    dec = StreamingDecoder(model, max_streams=3)
    per_stream = sum(t[0].numel() * t.element_size() for t in dec.state.values()) + 8
    assert dec.state_bytes_per_stream() == per_stream == state_bytes_per_stream(model)
    assert all(t.shape[0] == 3 for t in dec.state.values())
    window = model.config.sliding_window
    attn = dec.state["pre_transformer.layers.0.self_attn.k"]
    assert attn.shape == (3, model.config.num_key_value_heads, window - 1, model.config.head_dim)
    # Causal conv k3 keeps 2 inputs; the dilation-9 k7 residual conv keeps 54; (k=2s, s) transposed conv 1.
    assert dec.state["pre_conv"].shape[-1] == 2
    assert dec.state["decoder.1.block.4.conv1"].shape[-1] == 54
    assert dec.state["decoder.1.block.1"].shape[-1] == 1
    assert "upsample.0.0" not in dec.state  # k == s: no overlap, no state
    assert state_bytes_per_stream(model, torch.bfloat16) < per_stream


def test_decode_rejects_bad_requests(model: Qwen3TokenizerDecoder) -> None:
    dec = StreamingDecoder(model, max_streams=2)
    codes = _codes(40, 3, batch=2)
    with pytest.raises(ValueError, match="distinct"):
        dec.decode(codes, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"slots must lie in \[0, 2\)"):
        dec.decode(codes, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="slots must be an int64 tensor of shape"):
        dec.decode(codes, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 3\]"):
        dec.decode(codes, torch.tensor([0, 1]), torch.tensor([4, 1]))
    with pytest.raises(ValueError, match=r"codes must be \[batch, 16, frames\]"):
        dec.decode(codes[:, :15], torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 2048\)"):
        dec.decode(codes + 2048, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="max_streams"):
        StreamingDecoder(model, max_streams=0)
    # Nothing above may have touched the pool.
    assert dec.position(0) == dec.position(1) == 0
