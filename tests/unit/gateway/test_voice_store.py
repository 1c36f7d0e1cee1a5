"""The voice library's files (gateway/voices/store.py): validated names never become paths, writes are whole
or absent, names are claimed once across processes, and a broken voice is an error naming it."""

from __future__ import annotations

import concurrent.futures
import io
import multiprocessing
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import soundfile as sf
from safetensors import safe_open

from gateway.catalog import ModelInfo
from gateway.errors import GatewayError
from gateway.voices.library import VoiceLibrary, VoiceUpload
from gateway.voices.store import NewVoice, VoiceStore, check_name, encoded_reference
from voxstage import wire
from voxstage.config import GatewayConfig
from voxstage.internal.v1 import stage_pb2


def new(name: str = "narrator", model: str = "m-base", family: str = "qwen3_tts") -> NewVoice:
    rng = np.random.default_rng(0)
    return NewVoice(
        name=name, model=model, family=family, ref_text="Hello there.", language="english", description="d",
        audio=rng.standard_normal(16000).astype(np.float32) * 0.1, sample_rate=16000,
        codes=rng.integers(0, 2048, (25, 16)).astype(np.int16),
        x_vector=rng.standard_normal(8).astype(np.float32), consent=None,
    )  # fmt: skip


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "name",
    [
        "../etc/passwd",
        "a/b",
        "a\\b",
        "nul\x00",
        "tab\tname",
        "x" * 65,
        "",
        "   ",
        "..",
        ".",
        "voice_" + "a" * 24,
    ],
)
def test_names_with_path_or_control_characters_are_refused(name: str) -> None:
    with pytest.raises(GatewayError) as err:
        check_name(name)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.field == "name"


@pytest.mark.parametrize("name", ["narrator", "Ana María", "v1.2-final_take", "語り手", "x" * 64])
def test_ordinary_names_pass(name: str) -> None:
    assert check_name(f" {name} ") == name


def test_a_voice_is_one_safetensors_file_with_its_metadata_and_survives_a_new_store(tmp_path: Path) -> None:
    meta = VoiceStore(tmp_path, max_count=10).create(new())
    assert files(tmp_path) == [f"names/{p.name}" for p in (tmp_path / "names").iterdir()] + [
        f"voices/{meta.id}.safetensors"
    ]
    with safe_open(str(tmp_path / "voices" / f"{meta.id}.safetensors"), "np") as f:
        assert f.metadata()["name"] == "narrator" and f.metadata()["ref_text"] == "Hello there."
        assert sorted(f.keys()) == ["audio", "codes", "x_vector"]
    again = VoiceStore(tmp_path, max_count=10)  # a restarted gateway: nothing but the files
    assert again.find("NARRATOR") == meta and again.find(meta.id) == meta
    voice = again.load(meta.id, "narrator")
    ref = encoded_reference(voice)
    assert ref.voice_key == meta.key and ref.codes.frame_count == 25 and ref.x_vector_dim == 8
    assert [m.id for m in again.list()] == [meta.id]
    again.delete("narrator")
    assert again.find("narrator") is None and files(tmp_path) == []


def test_a_name_is_taken_once_and_the_library_is_bounded(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path, max_count=2)
    store.create(new("a"))
    with pytest.raises(GatewayError) as err:
        store.create(new("A"))  # names match without regard to case
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS and err.value.field == "name"
    store.create(new("b"))
    with pytest.raises(GatewayError) as err:
        store.create(new("c"))
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(list((tmp_path / "voices").iterdir())) == 2 and not list((tmp_path / "tmp").iterdir())


def _race(root: str, barrier: multiprocessing.synchronize.Barrier) -> str:  # type: ignore[name-defined]
    store = VoiceStore(root, max_count=10)
    barrier.wait()
    try:
        return store.create(new("contested")).id
    except GatewayError as exc:
        return exc.code.name


def test_processes_racing_for_one_name_leave_one_winner(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with concurrent.futures.ProcessPoolExecutor(4, mp_context=ctx) as pool:
            results = list(pool.map(_race, [str(tmp_path)] * 4, [barrier] * 4))
    winners = [r for r in results if r.startswith("voice_")]
    assert len(winners) == 1 and sorted(set(results) - set(winners)) == ["ALREADY_EXISTS"], results
    assert [p.stem for p in (tmp_path / "voices").iterdir()] == winners  # the losers' files are gone
    assert VoiceStore(tmp_path, max_count=10).find("contested").id == winners[0]  # type: ignore[union-attr]


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage"])
def test_a_broken_voice_is_an_error_naming_it_never_a_fallback(tmp_path: Path, damage: str) -> None:
    store = VoiceStore(tmp_path, max_count=10)
    meta = store.create(new("narrator"))
    path = tmp_path / "voices" / f"{meta.id}.safetensors"
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.write_bytes(b"\xff" * 64)
    fresh = VoiceStore(tmp_path, max_count=10)
    with pytest.raises(GatewayError) as err:
        fresh.find("narrator")
    assert err.value.code == grpc.StatusCode.DATA_LOSS and "narrator" in str(err.value)
    fresh.delete("narrator")  # a broken voice can still be removed
    assert fresh.find("narrator") is None


def _model(name: str = "m-base", family: str = "qwen3_tts", voices: tuple = ()) -> ModelInfo:
    return ModelInfo(name=name, family=family, sample_rate_hz=24000, voices=voices, languages=("english",))


def test_a_voice_made_for_another_model_is_refused_naming_both(tmp_path: Path) -> None:
    library = VoiceLibrary(GatewayConfig(voice_store_dir=str(tmp_path)), codecs=None, aliases=None)  # type: ignore[arg-type]
    assert library.store is not None
    library.store.create(new("narrator", model="m-base", family="qwen3_tts"))
    assert library.lookup("narrator", _model(), "voice") is not None
    for other in (_model("other-base"), _model("a8", "audio8_tts")):
        with pytest.raises(GatewayError) as err:
            library.lookup("narrator", other, "voice")
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "m-base" in str(err.value) and other.name in str(err.value) and other.family in str(err.value)
    assert library.lookup("nobody", _model(), "voice") is None


class _Stub:
    """A codec's EncodeVoice as the library calls it (the real one runs in test_voice_library.py)."""

    def __init__(self) -> None:
        self.requests: list[stage_pb2.EncodeVoiceRequest] = []

    async def EncodeVoice(self, request: stage_pb2.EncodeVoiceRequest, timeout: float) -> Any:  # noqa: N802, ASYNC109
        self.requests.append(request)
        codes = np.zeros((5, 16), np.int16)
        return stage_pb2.EncodeVoiceResponse(
            reference=wire.voice_reference(request.reference.text, codes, np.ones(8, np.float32))
        )


class _Pool:
    def __init__(self) -> None:
        self.codec_stub = _Stub()

    def pick(self) -> _Pool:
        return self


def _wav(seconds: float = 1.0) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(16000 * seconds), np.float32), 16000, format="WAV")
    return buf.getvalue()


async def test_consent_required_means_a_consent_recording_stored_beside_the_sample(tmp_path: Path) -> None:
    config = GatewayConfig(voice_store_dir=str(tmp_path), voice_consent="required")
    pool = _Pool()
    library = VoiceLibrary(config, pool, None)  # type: ignore[arg-type]
    model = ModelInfo(name="m-base", family="qwen3_tts", sample_rate_hz=24000, voices=(), languages=())
    with pytest.raises(GatewayError) as err:
        await library.create(VoiceUpload(name="n", audio=_wav(), ref_text="hi"), model)
    assert err.value.field == "consent_audio" and not pool.codec_stub.requests
    meta = await library.create(
        VoiceUpload(name="n", audio=_wav(), ref_text="hi", consent_audio=_wav(0.5)), model
    )
    assert meta.consent and library.get("n").consent
    assert library.store is not None
    assert library.store.audio(meta)["consent_audio"].size == 8000
    [request] = pool.codec_stub.requests
    assert request.reference.text == "hi" and request.reference.audio_sample_rate_hz == 16000
