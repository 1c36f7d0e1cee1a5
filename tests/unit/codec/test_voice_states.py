"""Decoder states of voice-library voices (services/codec/voice_states.py) on the real tiny decoders of both
text-to-speech families: a stream that opens from a kept state gives the same PCM, bit for bit, as one that
decodes its reference prefix; the state is only used for the same key and the same codes; the cache is
bounded; and the stage builds it from the deploy file's keys only where the family's pool can snapshot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from services.codec.engine import ChunkSchedule, CodecEngine
from services.codec.main import build_engine
from services.codec.models import load_codec
from services.codec.models.audio8_tts.config import Audio8CodecConfig
from services.codec.models.audio8_tts.loader import random_init as audio8_init
from services.codec.models.audio8_tts.streaming import Audio8StreamingDecoder
from services.codec.models.qwen3_tts.loader import random_init as qwen3_init
from services.codec.models.qwen3_tts.presets import decoder_preset
from services.codec.models.qwen3_tts.streaming import StreamingDecoder
from services.codec.slot_pool import DecoderState, SlotPoolDecoder
from services.codec.voice_states import VoiceStateCache
from voxstage import metrics
from voxstage.config import ConfigError, load_deploy_config
from voxstage.presets import resolve_model

REPO = Path(__file__).resolve().parents[3]
# A prefix longer than one decode call (max_frames_per_decode 100): the kept state is the one after both.
PREFIX_FRAMES = 130
SCHEDULE = ChunkSchedule(initial_frames=1, steady_frames=25)


@dataclass(frozen=True)
class Family:
    pool: Callable[[int], SlotPoolDecoder]  # slots -> a fresh pool over one shared model
    groups: int
    codebook: int


@pytest.fixture(scope="module", params=["qwen3_tts", "audio8_tts"])
def family(request: pytest.FixtureRequest) -> Family:
    if request.param == "qwen3_tts":
        qwen = qwen3_init(decoder_preset("qwen3-tts-tiny"), seed=0)
        return Family(lambda n: StreamingDecoder(qwen, n), 16, 2048)
    audio8 = audio8_init(Audio8CodecConfig.tiny(), seed=0)
    return Family(lambda n: Audio8StreamingDecoder(audio8, n), 10, 1024)


def codes(fam: Family, seed: int, frames: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, fam.codebook, (frames, fam.groups), dtype=np.int64)


def engine_for(fam: Family, states: VoiceStateCache | None, *, streams: int = 2, asynch: bool = False):
    decoded: list[int] = []  # real frames of every decode call: what the prefix's skip saves
    pool = fam.pool(2 * streams)

    def counted(c: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        decoded.append(int(lengths.sum()))
        return pool.decode(c, slots, lengths)

    engine = CodecEngine(
        pool, max_streams=streams, schedule=SCHEDULE, num_groups=fam.groups, codebook_size=fam.codebook,
        decode_fn=counted, async_scheduling=asynch, voice_states=states,
    )  # fmt: skip
    return engine, decoded


def speak(
    engine: CodecEngine, sid: str, prefix: np.ndarray, gen: np.ndarray, key: str, early: bool
) -> np.ndarray:
    """One stream, fed as the PCM is the same for: ``early`` pushes all its frames before the first tick
    (the talker ahead of the prefix's decode); otherwise three frames whenever the engine has caught up (a
    codec that keeps up with its talker). Chunk sizes decide the last float bits of a decode, so both ways
    fix them whether the prefix is decoded or not."""
    engine.open(sid, prefix=prefix, prefix_key=key)
    fed = 0
    if early:
        engine.push(sid, gen)
        engine.finish(sid)
        fed = gen.shape[0]
    pcm: list[np.ndarray] = []
    for _ in range(500):
        if fed < gen.shape[0] and not engine.has_work():
            engine.push(sid, gen[fed : fed + 3])
            fed = min(fed + 3, gen.shape[0])
            if fed == gen.shape[0]:
                engine.finish(sid)
        outs = engine.step()
        pcm += [o.pcm for o in outs]
        if any(o.final for o in outs):
            return np.concatenate(pcm)
    raise AssertionError("stream did not finish")


@pytest.mark.parametrize("asynch", [False, True], ids=["sync", "async"])
def test_a_stream_from_a_kept_state_is_bit_identical_to_one_that_decodes_the_prefix(
    family: Family, asynch: bool
) -> None:
    prefix, gen = codes(family, 1, PREFIX_FRAMES), codes(family, 2, 40)
    plain, plain_frames = engine_for(family, None, asynch=asynch)
    want = {early: speak(plain, f"p{early}", prefix, gen, "voice_x@1", early) for early in (True, False)}
    assert sum(plain_frames) == 2 * (PREFIX_FRAMES + 40) and want[True].size == 40 * plain.spf

    states = VoiceStateCache(1 << 30, 8)
    cached, frames = engine_for(family, states, asynch=asynch)
    hits = (
        metrics.REGISTRY.get_sample_value("voxstage_codec_voice_state_lookups_total", {"result": "hit"}) or 0
    )
    first = speak(cached, "b", prefix, gen, "voice_x@1", early=True)  # decodes the prefix, keeps the state
    assert len(states) == 1 and sum(frames) == PREFIX_FRAMES + 40
    again = speak(cached, "c", prefix, gen, "voice_x@1", early=True)  # opens from it: no prefix decode
    assert sum(frames) == PREFIX_FRAMES + 80
    paced = speak(cached, "d", prefix, gen, "voice_x@1", early=False)
    assert sum(frames) == PREFIX_FRAMES + 120
    after = metrics.REGISTRY.get_sample_value("voxstage_codec_voice_state_lookups_total", {"result": "hit"})
    assert after == hits + 2
    for got, early in ((first, True), (again, True), (paced, False)):
        assert got.dtype == want[early].dtype and np.array_equal(got, want[early])


def test_a_state_is_used_only_for_its_key_and_its_codes(family: Family) -> None:
    prefix, other, gen = codes(family, 3, 30), codes(family, 4, 30), codes(family, 5, 20)
    plain, _ = engine_for(family, None)
    want_other = speak(plain, "p", other, gen, "", early=True)
    want_new = speak(plain, "q", prefix, gen, "", early=True)

    states = VoiceStateCache(1 << 30, 8)
    cached, frames = engine_for(family, states)
    speak(cached, "a", prefix, gen, "voice_x@1", early=True)
    # The same key with other codes (never sent by the gateway) decodes its own prefix: no foreign state.
    assert np.array_equal(speak(cached, "b", other, gen, "voice_x@1", early=True), want_other)
    # A re-upload is a new version: a new key, which decodes its prefix and keeps its own state.
    assert np.array_equal(speak(cached, "c", prefix, gen, "voice_x@2", early=True), want_new)
    assert sum(frames) == 3 * (30 + 20) and len(states) == 2
    # No key (inline ref_audio): the prefix is decoded and nothing is kept.
    assert np.array_equal(speak(cached, "d", prefix, gen, "", early=True), want_new)
    assert len(states) == 2


def test_the_cache_is_bounded_by_entries_and_bytes_least_recently_used_first(family: Family) -> None:
    pool = family.pool(2)
    state = pool.snapshot(0)
    prefix = codes(family, 6, 10)
    one = prefix.nbytes + state.nbytes
    cache = VoiceStateCache(3 * one, 2)
    for key in ("a", "b"):
        cache.put(key, prefix, state)
    assert cache.get("a", prefix) is state  # "a" is now the most recent
    cache.put("c", prefix, state)
    assert cache.get("b", prefix) is None and cache.get("a", prefix) is state and len(cache) == 2
    small = VoiceStateCache(one + one // 2, 10)
    for key in ("a", "b", "c"):
        small.put(key, prefix, state)
    assert len(small) == 1 and small.bytes == one and small.get("c", prefix) is state
    too_big = VoiceStateCache(one - 1, 10)
    too_big.put("a", prefix, state)
    assert len(too_big) == 0
    off = VoiceStateCache(1 << 30, 0)
    off.put("a", prefix, state)
    assert len(off) == 0


def test_restore_refuses_a_state_of_another_pool(family: Family) -> None:
    pool = family.pool(2)
    bad = DecoderState(
        torch.zeros(pool.layout.width + 1, dtype=pool.dtype), torch.zeros((), dtype=torch.int64)
    )
    with pytest.raises(ValueError, match="does not fit"):
        pool.restore(0, bad)


def test_overlap_crop_engines_take_no_voice_states(family: Family) -> None:
    with pytest.raises(ValueError, match="voice_states"):
        CodecEngine(
            family.pool(2), max_streams=1, schedule=SCHEDULE, num_groups=family.groups, left_context=8,
            voice_states=VoiceStateCache(1 << 20, 4),
        )  # fmt: skip


def test_the_stage_builds_the_cache_from_its_keys(tmp_path_factory: pytest.TempPathFactory) -> None:
    deploy = REPO / "deploy" / "qwen3_tts.yaml"
    config = load_deploy_config(deploy, platform="cpu")
    source = resolve_model("qwen3-tts-tiny-base", cache=tmp_path_factory.mktemp("presets"))
    runtime = load_codec(source, device="cpu", dtype=torch.float32, max_streams=config.codec.max_num_seqs)
    assert runtime.decoder_snapshots
    states = build_engine(config, runtime, "cpu").voice_states
    assert states is not None and (states.max_bytes, states.max_entries) == (128 << 20, 64)
    sets = ["stages.1.codec_voice_state_bytes=1000", "stages.1.codec_voice_state_entries=3"]
    states = build_engine(
        load_deploy_config(deploy, platform="cpu", overrides=sets), runtime, "cpu"
    ).voice_states
    assert states is not None and (states.max_bytes, states.max_entries) == (1000, 3)
    off = load_deploy_config(deploy, platform="cpu", overrides=["stages.1.codec_voice_state_entries=0"])
    assert build_engine(off, runtime, "cpu").voice_states is None
    runtime.decoder_snapshots = False  # a family whose pool cannot snapshot keeps decoding the prefix
    assert build_engine(config, runtime, "cpu").voice_states is None


def test_the_keys_belong_to_the_codec_stage() -> None:
    deploy = REPO / "deploy" / "qwen3_tts.yaml"
    with pytest.raises(ConfigError) as info:
        load_deploy_config(deploy, platform="cpu", overrides=["stages.0.codec_voice_state_bytes=1"])
    assert any(
        "stages[0].codec_voice_state_bytes: belongs to the codec stage" in str(i) for i in info.value.issues
    )
    with pytest.raises(ConfigError, match="codec_voice_state_entries"):
        load_deploy_config(deploy, platform="cpu", overrides=["stages.1.codec_voice_state_entries=-1"])
    duplex = load_deploy_config(
        REPO / "deploy" / "personaplex.yaml", platform="cpu", overrides=["stages.1.codec_voice_state_bytes=1"]
    )
    assert any("codec_voice_state_bytes: warning: has no effect on duplex" in str(w) for w in duplex.warnings)
