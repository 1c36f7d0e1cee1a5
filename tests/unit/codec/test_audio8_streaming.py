"""Stateful streaming of the Audio8 codec equals the offline decode (fp32, 1e-5); overlap+crop does not.

150 frames exceed the 128-frame attention window, so each layer's K/V history wraps; chunks of 1, 4, 7 and 25
frames are smaller than, equal to and larger than every conv history. The overlap+crop baseline (vllm-omni's
schedule: chunk 25, left context 25, initial 4) is measured against offline and its number printed.
"""

from __future__ import annotations

import pytest
import torch

from services.codec.models.audio8_tts.codec import Audio8Codec
from services.codec.models.audio8_tts.config import Audio8CodecConfig
from services.codec.models.audio8_tts.loader import random_init
from services.codec.models.audio8_tts.stateless import overlap_crop_schedule, stream_overlap_crop
from services.codec.models.audio8_tts.streaming import Audio8StreamingDecoder, state_bytes_per_stream
from tests.unit.codec.codec_kit import audio8_codes, offline_reference

TOL = 1e-5
SPF = 2048
FRAMES = 150


@pytest.fixture(scope="module")
def model() -> Audio8Codec:
    return random_init(Audio8CodecConfig.tiny(), seed=0)


_codes = audio8_codes


@pytest.fixture(scope="module")
def long_case(model: Audio8Codec) -> tuple[torch.Tensor, torch.Tensor]:
    codes = _codes(0, FRAMES)
    return codes, offline_reference(model, codes, SPF, limit=0.99)  # tanh output


def _stream(dec: Audio8StreamingDecoder, codes: torch.Tensor, size: int, slot: int) -> torch.Tensor:
    out = [
        dec.decode(codes[..., s : s + size], torch.tensor([slot])) for s in range(0, codes.shape[-1], size)
    ]
    return torch.cat(out, dim=-1)


@pytest.mark.parametrize("chunk", [1, 4, 7, 25])
def test_chunked_stream_equals_offline(
    model: Audio8Codec, long_case: tuple[torch.Tensor, torch.Tensor], chunk: int
) -> None:
    codes, offline = long_case
    dec = Audio8StreamingDecoder(model, max_streams=3)
    streamed = _stream(dec, codes, chunk, slot=2)
    err = (streamed - offline).abs().max().item()
    print(f"\naudio8 streaming chunk={chunk}: max |stream - offline| = {err:.2e}")
    assert streamed.shape == offline.shape
    assert err <= TOL, f"chunk={chunk}: max abs error {err:.3e}"
    assert dec.position(2) == FRAMES and dec.position(0) == 0


def test_streams_of_different_lengths_share_buckets(model: Audio8Codec) -> None:
    """Three streams starting at different ticks with different chunk sizes, right-padded into one (B, T)
    bucket per tick (``lengths``), plus a scratch row with length 0, as the engine batches them."""
    lengths = {0: 140, 1: 61, 2: 33}
    chunk = {0: 9, 1: 4, 2: 7}
    first_tick = {0: 0, 1: 2, 2: 5}
    codes = {s: _codes(10 + s, n) for s, n in lengths.items()}
    with torch.inference_mode():
        offline = {s: model(c) for s, c in codes.items()}
    dec = Audio8StreamingDecoder(model, max_streams=6)
    done = dict.fromkeys(lengths, 0)
    out: dict[int, list[torch.Tensor]] = {s: [] for s in lengths}
    tick = 0
    while any(done[s] < lengths[s] for s in lengths):
        rows = [s for s in lengths if tick >= first_tick[s] and done[s] < lengths[s]]
        if rows:
            t = max(chunk.values())
            batch = torch.zeros(len(rows) + 1, 10, t, dtype=torch.int64)
            lens = torch.zeros(len(rows) + 1, dtype=torch.int64)
            for i, s in enumerate(rows):
                n = min(chunk[s], lengths[s] - done[s])
                batch[i, :, :n] = codes[s][0, :, done[s] : done[s] + n]
                batch[i, :, n:] = 4095  # padding frames hold garbage; they must not matter
                lens[i] = n
            slots = torch.tensor([*rows, 5])  # the last row is a scratch slot with no real frames
            wav = dec.decode(batch, slots, lens)
            for i, s in enumerate(rows):
                out[s].append(wav[i, : int(lens[i]) * SPF])
                done[s] += int(lens[i])
        tick += 1
    for s in lengths:
        err = (torch.cat(out[s])[None] - offline[s]).abs().max().item()
        assert err <= TOL, f"stream {s}: max abs error {err:.3e}"
        assert dec.position(s) == lengths[s]
    assert dec.position(5) == 0 and torch.count_nonzero(dec.pool[5]) == 0  # the scratch row


def test_prefix_decode_is_prefix_of_full_decode(
    model: Audio8Codec, long_case: tuple[torch.Tensor, torch.Tensor]
) -> None:
    codes, offline = long_case
    with torch.inference_mode():
        for n in (1, 37, 130):
            prefix = model(codes[..., :n])
            assert (prefix - offline[:, : n * SPF]).abs().max().item() <= TOL


def test_zero_length_rows_leave_state_untouched(model: Audio8Codec) -> None:
    """What the engine's CUDA-graph warm-up/capture relies on: lengths 0 changes no slot at all."""
    dec = Audio8StreamingDecoder(model, max_streams=4)
    codes = _codes(3, 20, batch=2)
    dec.decode(codes[..., :11], torch.tensor([0, 1]))
    pool, positions = dec.pool.clone(), dec.positions.clone()
    dec.decode(codes[..., 11:], torch.tensor([1, 0]), torch.tensor([0, 0]))
    assert torch.equal(dec.pool, pool) and torch.equal(dec.positions, positions)
    # Mixed: row 0 (slot 1) advances, row 1 (slot 0) stays bit-identical.
    dec.decode(codes[:, :, 11:], torch.tensor([1, 0]), torch.tensor([9, 0]))
    assert torch.equal(dec.pool[0], pool[0]) and dec.position(0) == 11
    assert not torch.equal(dec.pool[1], pool[1]) and dec.position(1) == 20


def test_reset_starts_a_fresh_stream(model: Audio8Codec) -> None:
    codes = _codes(4, 30)
    with torch.inference_mode():
        offline = model(codes)
    dec = Audio8StreamingDecoder(model, max_streams=2)
    _stream(dec, _codes(5, 17), 5, slot=1)  # leaves history behind
    dec.reset(torch.tensor([1]))
    assert dec.position(1) == 0 and torch.count_nonzero(dec.pool[1]) == 0
    assert (_stream(dec, codes, 6, slot=1) - offline).abs().max().item() <= TOL


def test_residual_codes_above_1024_are_clamped(model: Audio8Codec) -> None:
    codes = _codes(6, 8)
    codes[:, 1:] = codes[:, 1:].clamp(min=1024)  # every residual code out of its codebook
    dec = Audio8StreamingDecoder(model, max_streams=2)
    streamed = dec.decode(codes, torch.tensor([0]))
    clamped = codes.clone()
    clamped[:, 1:] = 1023
    with torch.inference_mode():
        assert (streamed - model(clamped)).abs().max().item() <= TOL


def test_state_size_matches_pool(model: Audio8Codec) -> None:
    dec = Audio8StreamingDecoder(model, max_streams=3)
    per_row = dec.pool.shape[1] * dec.pool.element_size()
    assert dec.state_bytes_per_stream() == per_row + 8 == state_bytes_per_stream(model)
    # The window-127 K/V of each post-module layer (kv heads 2, head_dim 16) is part of it.
    assert dec.shapes["quantizer.post_module.layers.1.attention.k"] == (2, 127, 16)
    assert dec.max_streams == 3 and dec.samples_per_frame == SPF and dec.dtype == torch.float32


@pytest.mark.parametrize(
    "codes,slots,lengths,match",
    [
        (torch.zeros(1, 9, 4, dtype=torch.int64), [0], None, "codes must be"),
        (torch.zeros(1, 10, 4), [0], None, "int64 or int32"),
        (torch.full((1, 10, 4), 4096), [0], None, "must lie in"),
        (torch.full((1, 10, 4), -1), [0], None, "must lie in"),
        (torch.zeros(1, 10, 0, dtype=torch.int64), [0], None, "at least one frame"),
        (torch.zeros(2, 10, 4, dtype=torch.int64), [1, 1], None, "distinct"),
        (torch.zeros(1, 10, 4, dtype=torch.int64), [3], None, "slots must lie"),
        (torch.zeros(1, 10, 4, dtype=torch.int64), [0], [5], "lengths must lie"),
        (torch.zeros(1, 10, 4, dtype=torch.int64), [0], [1, 2], "lengths must be"),
    ],
)
def test_bad_inputs_raise(
    model: Audio8Codec, codes: torch.Tensor, slots: list[int], lengths: list[int] | None, match: str
) -> None:
    dec = Audio8StreamingDecoder(model, max_streams=3)
    lens = None if lengths is None else torch.tensor(lengths)
    with pytest.raises(ValueError, match=match):
        dec.decode(codes, torch.tensor(slots), lens)
    assert torch.count_nonzero(dec.positions) == 0


def test_overlap_crop_is_only_approximate(
    model: Audio8Codec, long_case: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """vllm-omni's stateless schedule (chunk 25, left context 25, initial 4). Windows that start at frame 0
    (the first 49 frames) are exact; later ones miss attention context up to 127 frames back in each of
    the post-module layers, so they drift. A left context covering the ~1025-frame receptive field would
    be exact but means re-decoding ~48 s per chunk: impractical, hence the stateful decoder."""
    codes, offline = long_case
    assert overlap_crop_schedule(60, 25, 25, 4)[:8] == [
        (0, 0, 4), (0, 4, 8), (0, 8, 12), (0, 12, 16), (0, 16, 20), (0, 20, 24), (0, 24, 49), (24, 49, 60)
    ]  # fmt: skip
    wav = stream_overlap_crop(model, codes, chunk_frames=25, left_context=25, initial_frames=4)
    assert wav.shape == offline.shape
    diff = (wav - offline).abs()
    exact_part = diff[:, : 49 * SPF].max().item()
    err = diff.max().item()
    rel_rms = ((wav - offline).pow(2).mean() / offline.pow(2).mean()).sqrt().item()
    print(f"\naudio8 overlap+crop (25/25/4): max abs error {err:.3e}, relative RMS error {rel_rms:.3e}")
    assert exact_part <= TOL
    assert err > 1e-4, "overlap+crop with 25 frames of context should not be exact"
    assert rel_rms < 0.5, "overlap+crop should still approximate the offline decode"
    # Re-decoding everything from frame 0 (context >= stream length) is exact: the crop is right.
    short = codes[..., :40]
    with torch.inference_mode():
        full = model(short)
    assert (stream_overlap_crop(model, short, 8, 40, 8) - full).abs().max().item() <= TOL
