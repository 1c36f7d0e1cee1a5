"""The talker's cache of voice-library prompts (services/talker/voice_cache.py): bounded by bytes and entries,
keyed by voice id and version, and the decoded reference of a keyed request is taken from it."""

from __future__ import annotations

import numpy as np

from services.talker.request_params import request_params
from services.talker.voice_cache import VoiceCache, VoicePrompt
from voxstage import wire
from voxstage.internal.v1 import stage_pb2


def prompt(n: int) -> VoicePrompt:
    return VoicePrompt(np.zeros(n, np.float32), None, "hi")


def test_the_cache_is_bounded_by_bytes_and_by_entries() -> None:
    cache = VoiceCache(max_bytes=1000, max_entries=3)
    for k in range(5):
        cache.put(f"voice_{k}@1", prompt(10))
    assert len(cache) == 3 and cache.get("voice_0@1") is None and cache.get("voice_4@1") is not None
    cache.put("big@1", prompt(300))  # 1200 bytes: more than the whole cache
    assert cache.get("big@1") is None
    cache.put("half@1", prompt(200))  # 802 bytes: the others make room
    assert cache.bytes <= 1000 and cache.get("half@1") is not None
    off = VoiceCache(max_bytes=1 << 20, max_entries=0)
    off.put("a@1", prompt(1))
    assert len(off) == 0


def _open(key: str, xvec: np.ndarray, codes: np.ndarray) -> stage_pb2.StreamOpen:
    op = stage_pb2.StreamOpen()
    op.reference.CopyFrom(wire.voice_reference("Hello.", codes, xvec))
    op.reference.voice_key = key
    return op


def test_a_keyed_reference_is_decoded_once_and_a_new_version_is_a_new_entry() -> None:
    cache = VoiceCache(1 << 20, 8)
    xvec, codes = np.arange(4, dtype=np.float32), np.ones((3, 2), np.int64)
    first = request_params(_open("voice_a@1", xvec, codes), cache)
    assert len(cache) == 1 and np.array_equal(first.speaker_embedding, xvec)
    again = request_params(_open("voice_a@1", xvec, codes), cache)
    assert again.speaker_embedding is first.speaker_embedding and again.ref_codes is first.ref_codes
    newer = request_params(_open("voice_a@2", xvec * 2, codes), cache)  # a re-upload: never the old entry
    assert len(cache) == 2 and np.array_equal(newer.speaker_embedding, xvec * 2)
    plain = request_params(_open("", xvec, codes), cache)  # an inline reference is never cached
    assert len(cache) == 2 and plain.ref_text == "Hello."


def test_a_voices_reference_rows_are_built_once_and_leave_with_its_arrays() -> None:
    """A clone prompt of a voice-library voice (the same host arrays on every hit) reuses the device rows of
    its reference (the x-vector, the ICL codec side) and equals, bit for bit, the prompt built from fresh
    copies of the same reference; the rows go once the voice cache lets its arrays go."""
    import gc

    import torch

    from services.talker.models import load_talker
    from services.talker.spec import SpeechSpec
    from voxstage.presets import resolve_model

    adapter, _ = load_talker(resolve_model("qwen3-tts-tiny-base"), device="cpu", dtype=torch.float32)
    model = adapter.model
    rng = np.random.default_rng(0)
    xvec = rng.standard_normal(model.hidden_size).astype(np.float32)
    codes = rng.integers(0, 64, (12, model.num_code_groups), dtype=np.int64)
    calls = []
    real = model.embed_frame
    model.embed_frame = lambda c: calls.append(c.shape) or real(c)  # type: ignore[method-assign]

    def spec(x: np.ndarray, c: np.ndarray) -> SpeechSpec:
        text = "Hello there, friend."
        return SpeechSpec(text=text, speaker_embedding=x, ref_text="A reference.", ref_codes=c)

    first = adapter.prepare(spec(xvec, codes)).prompt
    again = adapter.prepare(spec(xvec, codes)).prompt
    fresh = adapter.prepare(spec(xvec.copy(), codes.copy())).prompt  # an inline reference: built anew
    assert first is not None and again is not None and fresh is not None
    assert len(calls) == 2  # the first and the inline prompt embedded the reference; the second did not
    assert torch.equal(first.prefill_embeds, again.prefill_embeds)
    assert torch.equal(first.prefill_embeds, fresh.prefill_embeds)
    assert again.voice is first.voice
    assert first.voice is not None and list(first.voice.prefixes) == [None]  # auto: one prefix, kept
    del first, again, fresh, xvec, codes
    gc.collect()
    assert len(adapter.voice_rows) == 0
