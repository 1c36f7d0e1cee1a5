"""How the faces show voices: one ``speech_pb2.Voice`` for built-in and uploaded ones alike (gRPC), and its
JSON form (HTTP); a listing is the served model's built-in voices, then its uploaded ones, oldest first."""

from __future__ import annotations

from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from gateway.catalog import ModelInfo, voices_of
from gateway.voices.library import VoiceLibrary
from gateway.voices.store import VoiceMeta
from voxstage.v1 import speech_pb2


def uploaded_voice(meta: VoiceMeta, model: ModelInfo | None) -> speech_pb2.Voice:
    seconds = meta.sample_seconds
    created = timestamp_pb2.Timestamp()
    created.FromMilliseconds(meta.created_ms)
    return speech_pb2.Voice(
        name=meta.name,
        model=meta.model,
        languages=[meta.language] if meta.language else [],
        description=meta.description,
        native_sample_rate_hz=model.sample_rate_hz if model is not None and model.name == meta.model else 0,
        uploaded=True,
        id=meta.id,
        family=meta.family,
        ref_text=meta.ref_text,
        sample_duration=duration_pb2.Duration(seconds=int(seconds), nanos=int(round(seconds % 1 * 1e9))),
        created=created,
        consent=meta.consent,
    )


def listing(model: ModelInfo, language: str, library: VoiceLibrary) -> list[speech_pb2.Voice]:
    out = voices_of(model, language)
    wanted = model.resolve_language(language) if language else None
    for meta in library.list():
        if meta.model != model.name:
            continue  # made for another model: not usable here (GetVoice still shows it)
        if wanted is not None and meta.language and meta.language != wanted:
            continue
        out.append(uploaded_voice(meta, model))
    return out


def voice_json(v: speech_pb2.Voice) -> dict[str, Any]:
    body: dict[str, Any] = {
        "object": "voice",
        "name": v.name,
        "model": v.model,
        "languages": list(v.languages),
        "description": v.description,
        "native_sample_rate_hz": v.native_sample_rate_hz,
        "uploaded": v.uploaded,
    }
    if v.uploaded:
        body |= {
            "id": v.id,
            "family": v.family,
            "ref_text": v.ref_text,
            "sample_seconds": v.sample_duration.seconds + v.sample_duration.nanos / 1e9,
            "created_at": v.created.seconds,
            "consent": v.consent,
        }
    return body
