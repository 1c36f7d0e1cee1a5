"""Numeric ranges have one source of truth (``voxstage.limits``): every out-of-range number is refused at the
gateway naming its field, on HTTP (400, never 500) and gRPC (INVALID_ARGUMENT), in the words the talker uses;
docs/api.md lists the same bounds (issue 15: ``top_k: 1099511627776`` answered 500; the gateway took seeds
up to 2**64 while the talker refused 2**63 and up)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest
from gateway_kit import REPO, MakeStack

from voxstage import limits
from voxstage.internal.v1 import stage_pb2
from voxstage.stage.errors import StageFailure
from voxstage.v1 import speech_pb2

L = limits
# (HTTP field, value, limit): each value is out of its limit's range.
HTTP_CASES: list[tuple[str, Any, limits.IntRange | limits.FloatRange]] = [
    ("top_k", 1099511627776, L.TOP_K),  # the operator's probe: a protobuf setattr raised, 500
    ("top_k", -(2**40), L.TOP_K),
    ("top_k", 0, L.TOP_K),
    ("top_k", -2, L.TOP_K),
    ("temperature", -1.0, L.TEMPERATURE),
    ("temperature", 1e39, L.TEMPERATURE),  # beyond float32: would be stored as inf
    ("top_p", 0.0, L.TOP_P),
    ("top_p", 1e-50, L.TOP_P),  # > 0 as a double, 0 as the float32 the talker gets
    ("top_p", 1.5, L.TOP_P),
    ("repetition_penalty", 0.0, L.REPETITION_PENALTY),
    ("repetition_penalty", 1e6, L.REPETITION_PENALTY),
    ("max_frames", 0, L.MAX_FRAMES),
    ("max_frames", 2**32, L.MAX_FRAMES),
    ("max_frames", 2**70, L.MAX_FRAMES),
    ("seed", -1, L.SEED),
    ("seed", 2**63, L.SEED),
    ("seed", 2**64 + 1, L.SEED),
    ("sample_rate", 7999, L.SAMPLE_RATE),
    ("sample_rate", 48_001, L.SAMPLE_RATE),
    ("sample_rate", 2**80, L.SAMPLE_RATE),
]


def _config(path: str, value: Any) -> speech_pb2.SynthesisConfig:
    config = speech_pb2.SynthesisConfig(encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE)
    *parents, leaf = path.removeprefix("config.").split(".")
    target: Any = config
    for name in parents:
        target = getattr(target, name)
    setattr(target, leaf, value)
    return config


# (gRPC field, value, limit): values the wire types can carry but the range refuses.
GRPC_CASES: list[tuple[str, Any, limits.IntRange | limits.FloatRange]] = [
    ("config.seed", 2**63, L.SEED),
    ("config.seed", 2**64 - 1, L.SEED),
    ("config.sampling.top_k", 0, L.TOP_K),
    ("config.sampling.top_k", -(2**31), L.TOP_K),
    ("config.sampling.temperature", float("inf"), L.TEMPERATURE),
    ("config.sampling.temperature", float("nan"), L.TEMPERATURE),
    ("config.sampling.temperature", 101.0, L.TEMPERATURE),
    ("config.sampling.top_p", 1.01, L.TOP_P),
    ("config.sampling.repetition_penalty", -1.0, L.REPETITION_PENALTY),
    ("config.sampling.max_frames", 0, L.MAX_FRAMES),
    ("config.subtalker_sampling.top_k", 0, L.TOP_K),
    ("config.subtalker_sampling.top_p", 0.0, L.TOP_P),
    ("config.subtalker_sampling.temperature", -0.5, L.TEMPERATURE),
    ("config.sample_rate_hz", 96_000, L.SAMPLE_RATE),
    ("config.chunk_schedule.steady_chunk_frames", 1001, L.CHUNK_FRAMES),
]


def _expected(field: str, value: Any, limit: limits.IntRange | limits.FloatRange) -> str:
    problem = limit.problem(value)
    assert problem is not None, (field, value)
    return f"{field}: {problem}"


async def test_every_out_of_range_number_is_refused_naming_its_field(make_stack: MakeStack) -> None:
    stack = await make_stack()
    failures: list[str] = []
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        for field, value, limit in HTTP_CASES:
            r = await http.post(
                "/v1/audio/speech", json={"input": "hi", "response_format": "pcm", field: value}
            )
            err = r.json().get("error", {}) if r.status_code != 200 else {}
            want = _expected(field, value, limit)
            if (r.status_code, err.get("param"), err.get("message")) != (400, field, want):
                failures.append(f"http {field}={value!r}: {r.status_code} {r.text[:200]}")
    for field, value, limit in GRPC_CASES:
        config = _config(field, value)
        try:
            await stack.stub.Synthesize(speech_pb2.SynthesizeRequest(config=config, text="hi"))
            failures.append(f"grpc {field}={value!r}: accepted")
        except grpc.aio.AioRpcError as exc:
            want = _expected(field, getattr(_leaf(config, field), field.rsplit(".", 1)[1]), limit)
            if (exc.code(), exc.details()) != (grpc.StatusCode.INVALID_ARGUMENT, want):
                failures.append(f"grpc {field}={value!r}: {exc.code().name} {exc.details()!r} != {want!r}")
    assert not failures, "\n".join(failures)
    assert stack.codec.opens == []  # all judged at the gateway: no stage work started


def _leaf(config: speech_pb2.SynthesisConfig, path: str) -> Any:
    target: Any = config
    for name in path.removeprefix("config.").split(".")[:-1]:
        target = getattr(target, name)
    return target


def _talker_refusal(**params: Any) -> str:
    """What the talker answers for these request params (its seed check needs no model)."""
    from services.talker.worker import RequestParams, TalkerWorker

    fake = SimpleNamespace(defaults=SimpleNamespace(seed=None))
    with pytest.raises(StageFailure) as err:
        TalkerWorker.build_request(fake, "k", RequestParams(**params), "text", True)  # type: ignore[arg-type]
    return str(err.value.message)


async def test_a_2_63_seed_is_refused_at_the_gateway_in_the_talkers_words(make_stack: MakeStack) -> None:
    stack = await make_stack()
    talker_says = _talker_refusal(seed=2**63)
    assert talker_says == f"seed: must be in [0, 2**63), got {2**63}"
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post("/v1/audio/speech", json={"input": "hi", "seed": 2**63})
    assert r.status_code == 400 and r.json()["error"]["message"] == talker_says
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.stub.Synthesize(
            speech_pb2.SynthesizeRequest(config=_config("config.seed", 2**63), text="hi")
        )
    assert err.value.details() == f"config.{talker_says}"
    assert stack.codec.opens == []  # refused at the gateway, not relayed from the talker
    # The largest accepted seed goes through.
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        r = await http.post(
            "/v1/audio/speech", json={"input": "hi", "response_format": "pcm", "seed": 2**63 - 1}
        )
    assert r.status_code == 200


def test_the_talker_refuses_what_the_gateway_refuses_in_the_same_words() -> None:
    from services.talker.request_params import request_params

    cases = [
        ("sampling", "temperature", 1000.0, L.TEMPERATURE),
        ("sampling", "top_k", -5, L.TOP_K),
        ("sampling", "top_p", 0.0, L.TOP_P),
        ("sampling", "repetition_penalty", 0.0, L.REPETITION_PENALTY),
        ("sampling", "max_frames", 0, L.MAX_FRAMES),
        ("subtalker_sampling", "temperature", float("inf"), L.TEMPERATURE),
        ("subtalker_sampling", "top_k", -2, L.TOP_K),
    ]
    for group, name, value, limit in cases:
        op = stage_pb2.StreamOpen()
        setattr(getattr(op, group), name, value)
        with pytest.raises(StageFailure) as err:
            request_params(op)
        want = _expected(f"{group}.{name}", value, limit)
        assert (err.value.code, err.value.message) == ("INVALID_ARGUMENT", want)
    ok = stage_pb2.StreamOpen()
    ok.sampling.top_k = 0  # the sampler's own "off" stays accepted from stage callers
    ok.sampling.temperature = 0.0
    assert request_params(ok).sampling == {"temperature": 0.0, "top_k": 0}


def _docs_table() -> dict[str, str]:
    text = (REPO / "docs" / "api.md").read_text()
    section = text.split("### Numeric limits", 1)[1].split("\n#", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (m := re.fullmatch(r"`(\w+)`", cells[0])):
            rows[m.group(1)] = cells[3].strip("`")
    return rows


def test_the_docs_table_states_the_limits_of_the_code() -> None:
    assert _docs_table() == {limit.name: limit.describe() for limit in limits.ALL}
    assert Path(REPO / "src" / "voxstage" / "limits.py").exists()
